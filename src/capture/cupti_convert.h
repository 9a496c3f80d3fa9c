// cupti_convert.h: turns CUPTI memory activity records into native trace events (pure, no I/O).
//
// The CUPTI injection library (cupti_inject.cc) hands every CUpti_ActivityMemory4
// (CUPTI_ACTIVITY_KIND_MEMORY2) and CUpti_ActivityMemoryPool3 (MEMORY_POOL) record it receives
// to a Converter, plus the virtual-memory mappings (cuMemMap / cuMemUnmap) it sees through the
// driver-API callbacks, and writes the events the Converter returns. Only the CUPTI *headers* are
// needed here (record layouts and enum values): nothing links libcupti or libcuda, so the tests
// can feed fabricated records on a machine without a GPU or driver.
//
// What a CUDA allocation becomes. CUPTI sees what the CUDA driver hands out, not what a
// framework does with it, so each device allocation is both a *segment* (reserved) and one
// *allocation* filling it (requested / allocated), which is what `analyze` needs to report the
// peak and the largest live allocations by stack:
//
//   ALLOCATION of `bytes` at A   ->  segment_alloc(A, round512(bytes)) ; alloc(A, bytes)
//   RELEASE at A                 ->  free_requested(A, bytes) ; free_completed(A, bytes) ;
//                                    segment_free(A, round512(bytes))
//   cuMemMap(A, n)               ->  segment_map(A, n) ; alloc(A, n)
//   cuMemUnmap(A, n)             ->  free_requested ; free_completed ; segment_unmap, per mapping
//                                    inside [A, A+n)
//
// round512 (at least 512, multiple of 512) is the block size the trace reader assumes for a
// request, so reserved == allocated and the rebuilt final state is exact. Stream-ordered
// allocations (cudaMallocAsync, isAsync = 1) carry their stream and memory pool; the bytes a pool
// keeps cached after a free are not in `reserved` (CUPTI reports them only as the pool's size,
// which the Converter tracks in PoolStats). Memory kinds other than DEVICE (pinned and pageable
// host memory, managed memory, arrays, static device variables) are counted, not traced.
//
// Times: CUPTI timestamps are nanoseconds of CUPTI's clock; time_us = (ns + offset) / 1000 where
// the offset (CUPTI clock -> Unix epoch ns) is measured once by the injection library.
//
// Not thread-safe: one Converter per process, used under the injection library's lock.
#pragma once

#include <cupti_activity.h>

#include <array>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/allocator_constants.h"
#include "format/trace/trace_format.h"

namespace memforensics::capture::cupti {

// What the Converter asks of the side that writes the trace (ids are the TraceWriter's).
class Interner {
 public:
  virtual ~Interner() = default;
  // The stack of the API call with this correlation id (kTraceNoStack when none was captured).
  // Called once per converted allocation or release; may forget the stack afterwards.
  virtual uint32_t stackFor(uint32_t correlation_id) = 0;
  // A pool id for a CUDA memory pool: (pool base address, CUpti_ActivityMemoryPoolType).
  virtual uint32_t pool(uint64_t a, uint64_t b) = 0;
};

// One event to write, with the CUPTI timestamp it sorts by (events of a batch are written in
// (timestamp_ns, seq) order: activity records and callback-derived mappings arrive separately).
struct TimedEvent {
  uint64_t timestamp_ns = 0;
  uint64_t seq = 0;
  format::trace::TraceEvent event;
};

struct PoolStats {
  uint32_t device = 0;
  uint32_t type = 0;  // CUpti_ActivityMemoryPoolType
  uint64_t size = 0;  // last size CUPTI reported
  uint64_t peak_size = 0;
  uint64_t release_threshold = 0;
  bool destroyed = false;
};

// Counters: what was converted, what was skipped and why. Printed by the injection library at
// exit; tests check them.
struct ConvertStats {
  uint64_t memory_records = 0;   // MEMORY2 records seen (all kinds)
  uint64_t device_allocs = 0;    // converted into segment_alloc + alloc
  uint64_t device_releases = 0;  // converted into frees
  uint64_t async_allocs = 0;     // of device_allocs: stream-ordered (cudaMallocAsync & co)
  std::array<uint64_t, 8>
      other_kind{};                 // records of non-device memory kinds, by memoryKind (7 = 7+)
  uint64_t unmatched_releases = 0;  // release of an address with no live allocation (still written)
  uint64_t double_allocs = 0;       // allocation of an address already live (the old one is freed)
  uint64_t release_size_mismatch = 0;  // release bytes differ from the allocation's
  uint64_t invalid_operations = 0;     // memoryOperationType neither ALLOCATION nor RELEASE
  uint64_t vmm_records_ignored =
      0;  // MEMORY2 records of cuMemCreate/Map/... calls (traced from callbacks)
  uint64_t vmm_maps = 0;
  uint64_t vmm_unmaps = 0;
  uint64_t vmm_unmatched_unmaps = 0;  // cuMemUnmap covering no recorded mapping
  uint64_t vmm_partial_unmaps = 0;    // cuMemUnmap cutting a mapping in two (not traced)
  uint64_t pool_created = 0, pool_destroyed = 0, pool_trimmed = 0;
  uint64_t other_records = 0;  // activity kinds the Converter does not handle
  uint64_t live_bytes = 0;     // segment bytes live now, all devices
  uint64_t peak_live_bytes = 0;
  uint32_t devices_seen_mask = 0;  // bit d for device d < 32 that had an event
};

struct ConvertOptions {
  int64_t time_offset_ns = 0;  // added to CUPTI timestamps to get Unix epoch nanoseconds
};

class Converter {
 public:
  Converter(Interner& interner, const ConvertOptions& options = {})
      : interner_(interner), options_(options) {}

  // Any activity record: MEMORY2 and MEMORY_POOL are converted, others counted. Events are appended
  // to `out` (not sorted).
  void addRecord(const CUpti_Activity& record, std::vector<TimedEvent>& out);
  void addMemory(const CUpti_ActivityMemory4& r, std::vector<TimedEvent>& out);
  void addMemoryPool(const CUpti_ActivityMemoryPool3& r);

  // Virtual memory management, from driver-API callbacks (EXIT of a successful call).
  void addMap(uint32_t device, uint64_t ptr, uint64_t size, uint64_t timestamp_ns,
              uint32_t correlation_id, std::vector<TimedEvent>& out);
  void addUnmap(uint64_t ptr, uint64_t size, uint64_t timestamp_ns, uint32_t correlation_id,
                std::vector<TimedEvent>& out);
  // MEMORY2 records with this correlation id come from a VMM call already traced from its callback.
  // Bounded: CUPTI may produce no record at all for these calls, so the set is cleared when it
  // reaches 65536 ids (a record arrives within about a second of its call).
  void ignoreCorrelation(uint32_t correlation_id) {
    if (ignored_correlations_.size() >= (1u << 16)) ignored_correlations_.clear();
    ignored_correlations_.insert(correlation_id);
  }

  const ConvertStats& stats() const { return stats_; }
  // Pools by (device, pool address), as last reported.
  const std::map<std::pair<uint32_t, uint64_t>, PoolStats>& pools() const { return pools_; }

  // The allocations and mappings live now, as a trace's final state (Segments chunk): one segment
  // holding one allocated block each, in (device, address) order. Written at a clean exit so that
  // the reader need not rebuild the end state (and does not warn that the writer did not finish).
  void finalState(std::vector<format::trace::TraceSegment>& segments,
                  std::vector<format::trace::TraceBlock>& blocks) const;

  // Sorts a batch by (timestamp, seq) before it is written.
  static void sortBatch(std::vector<TimedEvent>& events);
  static uint64_t segmentBytes(uint64_t bytes) { return alloc::estimatedBlockSize(bytes); }

 private:
  struct Live {
    uint64_t bytes = 0;    // requested
    uint64_t segment = 0;  // reserved
    int64_t stream = 0;
    uint32_t pool = 0;  // the Interner's pool id
    uint32_t stack = 0;
    uint64_t pool_a = 0, pool_b = 0;
  };
  int64_t timeUs(uint64_t ns) const;
  void push(std::vector<TimedEvent>& out, uint64_t ts, format::trace::TraceEvent e);
  // The fields an allocation's and a free's events share.
  format::trace::TraceEvent eventFor(uint64_t ts, uint32_t device, uint64_t addr, const Live& l,
                                     uint32_t stack) const;
  void emitAlloc(std::vector<TimedEvent>& out, uint64_t ts, uint32_t device, uint64_t addr,
                 const Live& l, uint32_t stack, uint8_t segment_action);
  void emitFree(std::vector<TimedEvent>& out, uint64_t ts, uint32_t device, uint64_t addr,
                const Live& l, uint32_t stack, uint8_t segment_action);
  void noteDevice(uint32_t device);

  Interner& interner_;
  ConvertOptions options_;
  ConvertStats stats_;
  uint64_t seq_ = 0;
  // Live device allocations by (device, address); VMM mappings by address (unified address space).
  std::map<std::pair<uint32_t, uint64_t>, Live> live_;
  struct Mapping {
    uint32_t device = 0;
    uint64_t size = 0;
    uint32_t stack = 0;
  };
  std::map<uint64_t, Mapping> mappings_;
  std::unordered_set<uint32_t> ignored_correlations_;
  std::map<std::pair<uint32_t, uint64_t>, PoolStats> pools_;
};

}  // namespace memforensics::capture::cupti
