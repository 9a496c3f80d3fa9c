// blocks.h: the block layout of a device at one moment, and its fragmentation metrics.
//
// A pure function of a session's facts (analysis/session/session.h): the layout
// DeviceAllocatorModel (replay/allocator_model.h) had after the chosen event, as the session copied
// it, is measured segment by segment (allocated, pending-free, free blocks): free bytes inside
// segments, the largest free block per pool and per stream, external fragmentation (1 - largest
// free / total free), internal waste (block size - requested), and at an OOM whether the failed
// request would have fit into the free bytes of its pool and stream but into no single free block
// there (the fragmentation verdict). The layout is exact only when the model reproduced the whole
// device (ModelFacts::layout_exact); otherwise every figure here is an estimate and
// `estimate_reason` says why.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/session/session.h"
#include "common/status.h"
#include "format/model/snapshot.h"
#include "replay/allocator_model.h"

namespace memforensics::analysis {

// Where to look: the requested-bytes peak, the first OOM, an event index (-1 = the start state),
// or the last event at or before a time_us. (The CLI parses `--at` into this: cli/cmd_blocks.cc.)
struct BlocksAt {
  // Time: the last event at or before `value` (time_us); Elapsed: the same at the device's first
  // event time + `value` microseconds (the t+... moments the text output prints).
  enum class Kind : uint8_t { Peak, Oom, Event, Time, Elapsed };
  Kind kind = Kind::Peak;
  int64_t value = 0;
};

struct SegmentBlocks {
  replay::ModelSegment segment;
  uint64_t allocated_bytes = 0;
  uint64_t pending_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t largest_free = 0;
  uint64_t free_blocks = 0;
  uint64_t requested_bytes = 0;
  uint64_t internal_waste = 0;  // sum over active blocks of size - requested
};

// Free space of one pool kind ("small"/"large", private pools named by their id) or one stream.
struct FreeSpace {
  std::string pool;    // "small" / "large" / "" (per-stream rows)
  int64_t stream = 0;  // per-pool rows: 0
  bool is_stream = false;
  uint64_t free_bytes = 0;
  uint64_t largest_free = 0;
  uint64_t free_blocks = 0;
};

// The cache flush of the allocator's retry right before an OOM (CCA malloc: release_cached_blocks
// then one more attempt): the consecutive segment_free / segment_unmap events immediately
// preceding the `oom` event on its device. A failed map or cudaMalloc leaves no event, so the
// failed request's own flush is right before its `oom`. When that request found nothing left to
// release, the flush is the one of the request just before it, whose retry succeeded: the
// releases, then its segment_map / segment_alloc events and its one alloc, then the `oom`
// (`immediate` false). Anything else in between (a free, a second alloc) ends the search.
struct OomFlush {
  uint64_t segments_freed = 0;   // segment_free events
  uint64_t ranges_unmapped = 0;  // segment_unmap events
  uint64_t pages_unmapped = 0;   // their bytes in large-pool pages when every unmap is a multiple
                                 // of alloc::kLargeExpandablePage, else 0 (not told apart)
  uint64_t bytes = 0;            // released in all (saturating)
  int64_t first_event = -1;      // the first release, -1 when there was none
  bool immediate = false;        // the releases are right before the `oom` event
};
OomFlush oomFlushBefore(std::span<const format::Event> events, int64_t oom_event);

struct OomVerdict {
  int64_t event = -1;
  int64_t time_us = -1;
  uint64_t request_bytes = 0;  // rounded request that failed
  uint64_t device_free = 0;    // cudaMemGetInfo free bytes at the failure
  int64_t stream = 0;
  std::string pool;           // pool the request would use
  uint64_t pool_free = 0;     // free bytes of that pool and stream
  uint64_t pool_largest = 0;  // largest free block of that pool and stream
  bool fits_total = false;    // request <= pool_free
  bool fits_block = false;    // request <= pool_largest
  bool fragmentation =
      false;             // fits_total && !fits_block: enough free bytes, no block to hold them
  replay::OomNeed need;  // what the device would have had to give (replay::requestNeed)
  // What would have had to be free on the device for the request to succeed: need.needed_bytes
  // minus device_free when positive; 0 under fragmentation (the cache held the bytes).
  uint64_t short_by = 0;
};

// An error-severity replay anomaly of the device (replay/replay.h MEMF_ANOMALIES).
struct BlocksError {
  std::string id;
  uint64_t count = 0;
  int64_t first_event = -1;
};

struct BlocksResult {
  std::string path;
  int64_t device = 0;
  std::string at;      // "peak", "oom", "event", "time", "elapsed"
  int64_t event = -1;  // state after this event (-1: the start state)
  int64_t time_us = -1;
  size_t events = 0;
  replay::ModelCheck model;  // predictions checked on events [0, event]
  // The model reproduced the whole device (every alloc address and segment event of the trace,
  // and the file's final layout) and the history is consistent: ModelFacts::layout_exact.
  bool layout_exact = false;
  std::string estimate_reason;  // "" when layout_exact, else why the layout is an estimate
  // findings.h historyGap: why the history cannot explain this state (a ring buffer of one entry,
  // no trace), "" when it can. The layout is then the file's own, but not explained.
  std::string history_gap;
  replay::ModelVerdict verdict;  // the model's whole-device verdict
  // false when the trace cannot lead to the file's final state: `untrusted`
  // (replay::UntrustedFigure bits) then includes the block layout.
  bool consistent = true;
  uint8_t untrusted = 0;
  std::string_view untrusted_cause;  // why, in words (replay::DeviceSummary::untrusted_cause)
  std::vector<BlocksError> errors;   // the device's error-severity replay anomalies
  std::vector<SegmentBlocks> segments;
  uint64_t reserved_bytes = 0, allocated_bytes = 0, pending_bytes = 0, requested_bytes = 0;
  uint64_t free_bytes = 0, largest_free = 0, free_blocks = 0, internal_waste = 0;
  double external_fragmentation = 0.0;  // 1 - largest_free / free_bytes (0 when nothing is free)
  std::vector<FreeSpace> by_pool;       // one row per pool kind present
  std::vector<FreeSpace> by_stream;     // one row per stream present
  std::optional<OomVerdict> oom;        // when the chosen event is an OOM
};

// The device `blocks` looks at: `device` (an error when the snapshot has none such), else the
// first with a trace, else the first.
Expected<int64_t> blocksDevice(const format::Snapshot& snap, std::optional<int64_t> device);
// The event `at` names on a device, from pass-1 facts. Errors: `oom` without an OOM, an event index
// out of range, no time_us.
Expected<int64_t> resolveBlocksAt(const DeviceFacts& facts, const BlocksAt& at);
// The metrics of the layout at moment `m` (which must hold one: MomentFacts::has_layout). `at`
// names how the moment was chosen ("peak", "oom", "event", "time", "elapsed"). Pure.
BlocksResult blocksAt(const DeviceFacts& facts, const MomentFacts& m, std::string_view at,
                      const format::Snapshot& snap);
// The fragmentation verdict at an OOM moment with a layout, or nullopt when `m` is no OOM.
std::optional<OomVerdict> oomVerdictAt(const format::Snapshot& snap, const DeviceFacts& facts,
                                       const MomentFacts& m);

// Convenience for the command: one session of the device, the layout at `at`. Errors: those of
// blocksDevice and resolveBlocksAt.
Expected<BlocksResult> computeBlocks(const format::Snapshot& snap, std::optional<int64_t> device,
                                     const BlocksAt& at);

}  // namespace memforensics::analysis
