// caching_allocator.h: the one home of PyTorch's CUDA caching-allocator rules in memforensics
// (c10/cuda/CUDACachingAllocator.cpp, "CCA"; format doc section 8). Every replay that lays out
// blocks uses it:
//   - DeviceAllocatorModel (allocator_model.h) drives it with the recorded events, taking every
//     address and segment from the trace, and checks each of its predictions against the file;
//   - the what-if (analysis/whatif/whatif.h) drives it with the recorded requests alone, under
//     other settings or a smaller card, and lets it decide where and when segments come and go;
//   - the OOM verdict asks it what a failed request needed (requestNeed, shortBy).
//
// The state is a set of segments (cudaMalloc'd ones, and expandable reservations with mapped and
// unmapped ranges), each covered by its blocks without gaps, and the free lists CCA keeps: mapped
// free blocks ordered by (pool, stream, size, address), unmapped ranges by (pool, stream, address).
// The rules are CCA's functions of the same name: round_size (replay.h roundSize),
// get_allocation_size, should_split, get_free_block, alloc_found_block, free_block /
// try_merge_blocks, find_expandable_block, try_allocate_expandable_block / map_block,
// unmap_block, release_cached_blocks, release_available_cached_blocks and
// garbage_collect_cached_blocks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "common/allocator_constants.h"
#include "format/model/snapshot.h"
#include "replay/alloc_conf.h"

namespace memforensics::replay {

using PoolId = std::pair<uint64_t, uint64_t>;  // (0, 0) = the default pools

// CCA get_allocation_size(): bytes of the segment a cudaMalloc for a rounded request would create.
uint64_t allocationSize(uint64_t rounded);

struct ModelBlock {
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t requested = 0;  // requested bytes of the current (or, for free blocks, 0) allocation
  format::StackId stack = format::kNoStack;
  int64_t alloc_event = -1;  // -1: alive before the trace started, or free
  format::BlockState state =
      format::BlockState::Inactive;  // ActiveAllocated/ActivePendingFree/Inactive
  bool mapped = true;    // expandable segments: false for reserved but unmapped address space
  uint64_t gc_base = 0;  // get_free_block calls of its pool when it became free (CCA gc_count_base)
  bool isFree() const { return state == format::BlockState::Inactive; }
};

// A cudaMalloc'd segment, or a whole expandable reservation (mapped and unmapped blocks).
struct CachedSegment {
  uint64_t address = 0, size = 0;
  int64_t stream = 0;
  PoolId pool{0, 0};
  bool is_large = true, expandable = false;
  uint64_t serial = 0;                    // creation order
  std::map<uint64_t, ModelBlock> blocks;  // address order, covering the segment without gaps
  // One block, and it is free: the segment a cache release gives back whole (CCA release_blocks:
  // a block with neither prev nor next).
  bool whollyFree() const { return blocks.size() == 1 && blocks.begin()->second.isFree(); }
};

// What a malloc asks for: CCA AllocParams (pool, stream, rounded size).
struct AllocRequest {
  PoolId pool{0, 0};
  bool large = true;  // CCA get_pool(): size > kSmallSize -> large_blocks
  int64_t stream = 0;
  uint64_t size = 0;  // rounded
};

// Bytes and segment releases (cudaFree / unmap calls) of one release, and the segments it
// looked at to find them (the work a caller may budget).
struct Released {
  uint64_t bytes = 0;
  uint64_t calls = 0;
  uint64_t visited = 0;
  Released& operator+=(const Released& o) {
    bytes += o.bytes;
    calls += o.calls;
    visited += o.visited;
    return *this;
  }
};

class CachingAllocator {
 public:
  // CCA BlockComparatorSize: pools are separate sets; within one, (stream, size, address).
  // Unmapped ranges use size 0: (stream, address), CCA BlockComparatorAddress.
  struct Key {
    PoolId pool;
    bool large;
    int64_t stream;
    uint64_t size;
    uint64_t addr;
    auto operator<=>(const Key&) const = default;
  };

  explicit CachingAllocator(const AllocConf& conf = {}) : conf_(conf) {}
  const AllocConf& conf() const { return conf_; }

  // --- state -------------------------------------------------------------------------------
  std::map<uint64_t, CachedSegment> segs;
  std::set<Key> free;      // mapped free blocks
  std::set<Key> unmapped;  // unmapped ranges of expandable reservations
  // get_free_block calls per (pool, is_large), counted by countGetFreeBlock (only while garbage
  // collection is on, as CCA does); a block indexed as free starts its age there.
  std::map<std::pair<PoolId, bool>, uint64_t> gfb_calls;

  // Replaces the whole state (the free lists are rebuilt).
  void assign(const std::map<uint64_t, CachedSegment>& segments);
  CachedSegment& addSegment(CachedSegment s);
  void eraseSegment(uint64_t address);

  CachedSegment* segAt(uint64_t addr);
  const CachedSegment* segAt(uint64_t addr) const;
  static ModelBlock* blockAt(CachedSegment& s, uint64_t addr);
  static ModelBlock* prevOf(CachedSegment& s, const ModelBlock& b);
  static ModelBlock* nextOf(CachedSegment& s, const ModelBlock& b);

  // An expandable reservation whose last block is the free, unmapped rest of its address space
  // ends at `at` (>= that block's start): the range from `at` on is given up, the reservation
  // erased when nothing is left. False (nothing changed) when `at` is not in such a block.
  // Where a reservation ends (CCA: 1.125 x the card) is not in a file; another segment that
  // begins inside the tail shows it.
  bool cutReservationTail(CachedSegment& s, uint64_t at);

  // Free-list bookkeeping for a block whose state, size or mapping is about to change.
  void index(const CachedSegment& s, ModelBlock& b);
  void unindex(const CachedSegment& s, const ModelBlock& b);
  // Splits the block containing `at` so that a block starts there; both halves keep the original's
  // state (free or unmapped blocks only). Returns the block at `at`.
  ModelBlock* splitAt(CachedSegment& s, uint64_t at);
  // CCA try_merge_blocks(): free neighbours with the same mapped state merge; returns the result.
  ModelBlock* merge(CachedSegment& s, ModelBlock* b);

  // --- rules ------------------------------------------------------------------------------
  // CCA shouldSplit(): the small pool, and every pool once expandable segments are on, split down
  // to kMinBlockSize; the large pool keeps a remainder of up to kSmallSize and never splits a
  // block for a request >= max_split_size.
  bool shouldSplit(const CachedSegment& s, uint64_t block_size, uint64_t size) const;
  // CCA get_free_block(): the smallest free block of the request's pool and stream that fits
  // (lowest address among equals), with the expandable-segment rules and the oversize rules;
  // nullptr when none may be used.
  const Key* getFreeBlock(const AllocRequest& r) const;
  void countGetFreeBlock(const AllocRequest& r) { ++gfb_calls[{r.pool, r.large}]; }
  // Largest free block of the request's pool and stream; of the whole device.
  uint64_t largestFree(const AllocRequest& r) const;
  uint64_t largestFree() const;
  // CCA alloc_found_block(): the request takes the front of the free block, the remainder stays
  // free when shouldSplit says so. Returns the allocated block.
  ModelBlock* allocFoundBlock(CachedSegment& s, ModelBlock* b, uint64_t size);
  // CCA free_block(): the block becomes free and merges with its free neighbours.
  ModelBlock* freeBlock(CachedSegment& s, ModelBlock* b);
  // CCA find_expandable_block(): the first unmapped range of the request's pool and stream
  // (address order) whose free predecessor, itself and the free blocks after hold `size` bytes;
  // the address where the grown block will start, nullopt when a new reservation is needed.
  std::optional<uint64_t> findExpandableBlock(const AllocRequest& r) const;
  // CCA ExpandableSegment page size of a reservation.
  static uint64_t pageOf(const CachedSegment& s) {
    return s.is_large ? alloc::kLargeExpandablePage : alloc::kSmallExpandablePage;
  }
  // Maps or unmaps [addr, addr + size) of a reservation: the range must lie in one block of the
  // other mapping state (split off, flipped, merged as map_block / unmap_block do). Returns the
  // merged block, nullptr when the range is not such.
  ModelBlock* setMapped(CachedSegment& s, uint64_t addr, uint64_t size, bool mapped);
  // CCA unmap_block() -> ExpandableSegment::unmap(): the completely free pages of a free mapped
  // block, pages counted from the reservation's base; {0, 0} when it holds none.
  static std::pair<uint64_t, uint64_t> unmappablePages(const CachedSegment& s, const ModelBlock& b);
  // CCA try_allocate_expandable_block() after find_expandable_block(): maps the unmapped blocks
  // from `candidate` on, each map_block of whole pages, until the free block at `candidate` holds
  // `size`. `may_map(bytes)` is asked before each map (false: the device is full; the caller
  // counts the bytes when it says true). Returns false when a map failed (what was mapped before
  // stays mapped, as in CCA).
  bool growExpandable(uint64_t candidate, uint64_t size,
                      const std::function<bool(uint64_t)>& may_map);

  // CCA release_cached_blocks() (also torch.cuda.empty_cache()): every wholly free segment is
  // given back, and with expandable segments every completely free page is unmapped. CCA looks
  // at every segment; this looks only at the wholly free ones and the reservations holding a free
  // mapped block (kept by index/unindex), so a replay of many OOMs over many live segments costs
  // what it releases, not segments x OOMs.
  Released releaseCached();
  // CCA release_available_cached_blocks(): with a max_split_size, free cached oversize segments
  // of the request's pool and stream, the smallest one of at least max(size, max_split_size),
  // else largest first until that much is freed. Returns whether it succeeded. Looks at the
  // wholly free segments alone.
  bool releaseOversize(const AllocRequest& r, Released* out);
  // CCA garbage_collect_cached_blocks(): free wholly free segments of the default large pool
  // whose age is at least the average, in passes, until `target` bytes are reclaimed or a pass
  // frees nothing.
  Released garbageCollect(uint64_t target);

 private:
  Released releaseSegment(uint64_t address);
  Released unmapFree(CachedSegment& s);
  // The segments a release may give something back from, noted by index() as blocks become free
  // (a cudaMalloc'd segment whose one block is free, a reservation holding a free mapped block):
  // appended, and sorted, deduplicated and checked against the state only when a release reads
  // them or they outnumber the segments twice (an unindex costs nothing).
  std::vector<uint64_t> releasable_;
  void noteReleasable(uint64_t segment);
  void pruneReleasable();
  AllocConf conf_;
};

// A segment as the snapshot file shows it (DeviceAllocatorModel::layout()): an expandable
// reservation appears as one segment per contiguous mapped range.
struct ModelSegment {
  uint64_t address = 0;
  uint64_t size = 0;
  int64_t stream = 0;
  PoolId pool{0, 0};
  bool is_large = true;
  bool is_expandable = false;
  std::vector<ModelBlock> blocks;  // address order, covering the segment without gaps
};

// What the device would have had to give for a failed request, by the allocator's rules
// (CCA alloc_block): without expandable segments a new segment of get_allocation_size() bytes
// (allocationSize: 2 MiB for the small pool, 20 MiB below 10 MiB, else rounded up to 2 MiB); with
// expandable segments (default pools only: CCA keeps private pools off them) the pages
// try_allocate_expandable_block() would map: find_expandable_block() takes the lowest-address
// unmapped range of the pool and stream that, with the free mapped block right before it (and free
// blocks and unmapped ranges after it), holds the request, and maps what is missing in whole pages
// (alloc::kLargeExpandablePage / kSmallExpandablePage).
struct OomNeed {
  bool expandable = false;
  uint64_t segment_bytes = 0;  // non-expandable: the segment cudaMalloc would have been asked for
  uint64_t page_bytes = 0;     // expandable: the page size of the request's pool
  uint64_t usable_free = 0;    // expandable: free mapped bytes the mapping would extend
  uint64_t pages = 0;          // expandable: pages that mapping would need
  uint64_t needed_bytes = 0;   // segment_bytes, or pages x page_bytes (saturating)
};
// `group`: the layout's segments of the request's pool kind, pool and stream (address order not
// required); empty when no layout is known (then an expandable request maps all of its pages).
// The layout shows mapped ranges only, so an unmapped range before the first one is not seen.
OomNeed requestNeed(uint64_t request_bytes, bool large, bool expandable,
                    const std::vector<const ModelSegment*>& group);
// What would have had to be free on the device for the request to succeed: need.needed_bytes
// minus device_free when positive; 0 under fragmentation (the cache held the bytes).
uint64_t shortBy(const OomNeed& need, uint64_t device_free, bool fragmentation);

}  // namespace memforensics::replay
