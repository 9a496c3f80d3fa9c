// allocator_constants.h: the rules of PyTorch's CUDA caching allocator that more than one part of
// memforensics needs, each in one place: its size constants, the block size a request implies
// when nothing better is known, the name of a pool, when frees complete on request, and how a
// final state's blocks add up to a segment's sums.
//
// Here (in common/) because the capture side and the native trace, which see no Snapshot model,
// need them as much as the replay and the analysis do. Sources: c10/cuda/CUDACachingAllocator.cpp
// (kMinBlockSize, kSmallSize, kSmallBuffer, kLargeBuffer, kMinLargeAlloc, kRoundLarge and
// snapshot()'s segment sums) and the format doc
// (/work/shared/docs/pytorch-snapshot-format.md, 8.1).
#pragma once

#include <cstdint>
#include <string>

namespace memforensics::alloc {

inline constexpr uint64_t kMinBlockSize = 512;        // every block is a multiple of this
inline constexpr uint64_t kSmallSize = 1048576;       // 1 MiB: requests up to it use the small pool
inline constexpr uint64_t kSmallBuffer = 2097152;     // 2 MiB: the small pool's segment size
inline constexpr uint64_t kLargeBuffer = 20971520;    // 20 MiB: large segments of smaller requests
inline constexpr uint64_t kMinLargeAlloc = 10485760;  // 10 MiB: from here on, segment = rounded
inline constexpr uint64_t kRoundLarge = 2097152;      // 2 MiB: large segments round up to this
inline constexpr uint64_t kSmallExpandablePage = kSmallBuffer;  // expandable segments map pages
inline constexpr uint64_t kLargeExpandablePage = kLargeBuffer;  // of these sizes

// The block size of a request when only the request is known (a trace without a final state, a
// CUPTI allocation): rounded up to kMinBlockSize, at least kMinBlockSize, saturating at the largest
// multiple of kMinBlockSize. An estimate for large-pool blocks the allocator did not split.
constexpr uint64_t estimatedBlockSize(uint64_t requested) {
  if (requested <= kMinBlockSize) return kMinBlockSize;
  constexpr uint64_t kTop = ~uint64_t{0} - (kMinBlockSize - 1);  // largest multiple of 512
  if (requested > kTop) return kTop;
  return (requested + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

// A segment's pool kind from its size alone (a final state rebuilt from events, where the file
// says nothing): the small pool's segments are exactly kSmallBuffer, every other size is large.
constexpr bool isLargeSegmentSize(uint64_t segment_bytes) {
  return segment_bytes != kSmallBuffer;
}

// The one spelling of a pool: "small" / "large" for the default pools, "small (A,B)" /
// "large (A,B)" for a private pool (a CUDA graph's or a MemPool's), A and B its id.
inline std::string poolName(bool is_large, uint64_t pool_a, uint64_t pool_b) {
  std::string s = is_large ? "large" : "small";
  if (pool_a != 0 || pool_b != 0) {
    s += " (" + std::to_string(pool_a) + "," + std::to_string(pool_b) + ")";
  }
  return s;
}

// "Frees complete on request": a trace recorded with skip_actions=["free_completed"] has
// free_requested as its only free, so a block is free at its free_requested. A trace with no
// free_completed could also just be short, its frees still pending: the final state tells them
// apart (pending blocks there mean frees really were pending).
constexpr bool freesCompleteOnRequest(uint64_t free_requested, uint64_t free_completed,
                                      bool final_state_has_pending) {
  return free_requested > 0 && free_completed == 0 && !final_state_has_pending;
}
// The other way round (free_requested skipped): free_completed is the only free, and it also
// ends the block's use by the program.
constexpr bool freesRequestOnComplete(uint64_t free_requested, uint64_t free_completed) {
  return free_completed > 0 && free_requested == 0;
}

// The sums of a final state as PyTorch's snapshot() writes them per segment: total_size the
// segment bytes; allocated_size the blocks still allocated; active_size and requested_size the
// active blocks (allocated, or freed but pending on another stream). `pending` is active minus
// allocated. Sums saturate at 2^64-1 and say so in `overflow` (hostile input).
struct StateSums {
  uint64_t total = 0;
  uint64_t allocated = 0;
  uint64_t active = 0;
  uint64_t requested = 0;
  uint64_t pending = 0;
  bool overflow = false;

  void addSegment(uint64_t total_bytes) { add(total, total_bytes); }
  // One block: `allocated` = ActiveAllocated, `pending` = ActivePendingFree; neither = inactive.
  void addBlock(bool is_allocated, bool is_pending, uint64_t size, uint64_t requested_bytes) {
    if (!is_allocated && !is_pending) return;
    add(active, size);
    add(requested, requested_bytes);
    add(is_allocated ? allocated : pending, size);
  }

 private:
  void add(uint64_t& to, uint64_t v) {
    if (__builtin_add_overflow(to, v, &to)) {
      to = ~uint64_t{0};
      overflow = true;
    }
  }
};

}  // namespace memforensics::alloc
