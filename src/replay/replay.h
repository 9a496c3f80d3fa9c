// replay.h: offline replay of a device's allocation history, from the snapshot file alone.
//
// The file holds the allocator's FINAL state (segments and blocks) and the trace of events that led
// there (possibly truncated at the front by PyTorch's ring buffer). Replay therefore works in two
// passes, as the format doc's section 6 describes:
//
//   1. Backward: start from the final live blocks and segment ranges and undo every event from the
//      last to the first. What remains is the state at the start of the trace. Blocks that the trace
//      frees but never allocates were alive before it began (history truncated or started late), and
//      the undo puts them into the start state, as memory_viz does. The backward pass also learns the
//      real block size of every alloc whose block is still alive at the end.
//   2. Forward: walk the events from that start state, maintaining per device
//        reserved   (+ segment_alloc/segment_map,  - segment_free/segment_unmap)   = memory_reserved
//        requested  (+ alloc request,              - free_completed)                = memory_viz's
//                                                                                    Active Memory Timeline
//        allocated  (+ block size at alloc,        - block size at free_requested)  = memory_allocated
//        pending    (blocks between free_requested and free_completed, block sizes)
//      and checking every event against the state (double alloc, free of an unknown block, `snapshot`
//      events whose size differs from the replayed active bytes...). Problems are counted as
//      anomalies with a severity; replay never throws and never stops early.
//
// Block sizes: the trace records only the requested size. A block that is still alive at the end has
// its real size in the final state; every other block's size is PyTorch's round_size() of the request
// (format doc 8.2). Large-pool blocks can carry up to 1 MiB of unsplit slack that rounding cannot
// see, so `allocated` is exact only when `allocated_exact` says so; the allocator model (a later
// module) removes that estimate.
#pragma once

#include <array>
#include <span>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/flat_map.h"
#include "format/snapshot.h"

namespace memforensics::replay {

using format::Action;
using format::Event;
using format::Snapshot;
using format::StackId;

// PyTorch's CUDACachingAllocator round_size(): 512-byte granularity, or the power-of-two divisions
// of `roundup_power2_divisions` (index k covers requests in [2^k MiB, 2^(k+1) MiB)).
uint64_t roundSize(uint64_t requested, const uint32_t divisions[16]);

enum class Severity : uint8_t { Info, DataLoss, Error };
std::string_view severityName(Severity s);

// Every anomaly replay can count: id, severity, one-line description. Perfetto-style stats table.
#define MEMF_ANOMALIES(X)                                                                          \
  X(FreesBeforeTraceStart, DataLoss,                                                               \
    "blocks freed in the trace but allocated before it began (ring buffer wrapped or recording "   \
    "started late); counted as live from the start")                                               \
  X(LiveWithoutAlloc, Info,                                                                        \
    "blocks alive at the end with no alloc in the trace; counted as live from the start")          \
  X(DoubleAlloc, Error, "alloc of an address that already holds a live block")                     \
  X(FreeOfUnknownBlock, Error, "free of an address that holds no live block")                      \
  X(FreeSizeMismatch, Error, "free event size differs from the size its alloc requested")          \
  X(FreeCompletedWithoutRequest, Info,                                                             \
    "free_completed without a preceding free_requested (action skipped or overwritten)")          \
  X(FreeRequestedTwice, Error, "free_requested of a block already waiting for free_completed")     \
  X(SegmentNotMapped, Error, "segment_free/segment_unmap of a range that is not reserved")         \
  X(SegmentOverlap, Error, "segment_alloc/segment_map of a range that is already reserved")        \
  X(AllocOutsideSegments, Error, "alloc at an address outside every reserved segment")             \
  X(SnapshotMismatch, Error, "`snapshot` event size differs from the replayed active bytes")        \
  X(FinalStateMismatch, Error,                                                                     \
    "forward replay does not end at the file's final segment state")                               \
  X(TimeRegression, Info, "time_us decreases between consecutive events")                          \
  X(UnknownAction, Info, "trace entries with an action this version does not know (ignored)")

enum class AnomalyKind : uint8_t {
#define MEMF_X(id, sev, desc) id,
  MEMF_ANOMALIES(MEMF_X)
#undef MEMF_X
      Count
};
inline constexpr size_t kAnomalyKinds = static_cast<size_t>(AnomalyKind::Count);
std::string_view anomalyId(AnomalyKind k);  // snake_case id, e.g. "double_alloc"
Severity anomalySeverity(AnomalyKind k);
std::string_view anomalyDescription(AnomalyKind k);

struct AnomalyStat {
  uint64_t count = 0;
  int64_t first_event = -1;  // index of the first event it was seen at, -1 when not tied to one
};

struct Counters {
  uint64_t reserved = 0;
  uint64_t requested = 0;
  uint64_t allocated = 0;
  uint64_t pending = 0;  // pending-free block bytes
  uint64_t active() const { return allocated + pending; }
};

// A running maximum and the first event after which it was reached (-1 = the start state).
struct Peak {
  uint64_t bytes = 0;
  int64_t event = -1;
  int64_t time_us = -1;
};

struct OomEvent {
  int64_t event = -1;
  int64_t time_us = -1;
  uint64_t request_bytes = 0;  // rounded request that failed
  uint64_t device_free = 0;    // cudaMemGetInfo free bytes at the failure
  int64_t stream = 0;
  StackId stack = format::kNoStack;
  Counters at;  // replayed state at the OOM
};

struct LiveBlock {
  uint64_t requested = 0;
  uint64_t size = 0;  // block size (exact when known from the final state, else rounded)
  int64_t alloc_event = -1;  // -1: alive before the trace started
  int64_t stream = 0;
  StackId stack = format::kNoStack;
  bool pending = false;       // between free_requested and free_completed
  bool size_exact = false;
};

// Replays one device. Construct (runs the backward pass), then step() forward.
class DeviceReplayer {
 public:
  DeviceReplayer(const Snapshot& snap, int64_t device);
  DeviceReplayer(const DeviceReplayer&) = delete;
  DeviceReplayer& operator=(const DeviceReplayer&) = delete;

  int64_t device() const { return device_; }
  std::span<const Event> events() const { return events_; }
  size_t eventCount() const { return events_.size(); }

  // Rewinds to the start state.
  void reset();
  // Applies event `next()`; returns false at the end.
  bool step();
  size_t next() const { return next_; }
  // Replays until `event_index` has been applied (-1: the start state).
  void advanceTo(int64_t event_index);

  const Counters& counters() const { return cur_; }
  const Counters& startCounters() const { return start_; }
  const U64Map<LiveBlock>& live() const { return live_; }
  const std::array<AnomalyStat, kAnomalyKinds>& anomalies() const { return anomalies_; }
  // Final state as the file states it (sum over this device's segments and active blocks).
  const Counters& fileFinal() const { return file_final_; }
  bool allocatedExact() const { return allocated_exact_; }
  size_t liveAtStartCount() const { return live_at_start_; }
  size_t freedBeforeStartCount() const { return freed_before_start_; }

  // Compares the current live set and counters with the file's final state; only meaningful after
  // the last step. Counts FinalStateMismatch when they differ.
  void checkFinalState();

 private:
  void note(AnomalyKind k, int64_t event);
  void backward();
  void apply(size_t i, const Event& e);

  const Snapshot& snap_;
  int64_t device_;
  std::span<const Event> events_;
  uint32_t divisions_[16] = {};
  bool complete_on_request_ = false;  // trace has free_requested but no free_completed at all
  bool request_on_complete_ = false;  // trace has free_completed but no free_requested at all

  // Start state (from the backward pass).
  U64Map<LiveBlock> start_live_;
  Counters start_;
  std::vector<std::pair<uint64_t, uint64_t>> start_ranges_;  // reserved [begin, end)
  std::vector<uint64_t> alloc_block_size_;  // per event: block size for allocs (0 for others)
  std::vector<uint8_t> alloc_size_exact_;

  // Current state.
  U64Map<LiveBlock> live_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;  // sorted, disjoint, merged
  Counters cur_;
  size_t next_ = 0;
  int64_t last_time_ = -1;
  bool checking_ = true;  // count anomalies only during the first forward pass
  std::vector<std::pair<uint64_t, uint64_t>> final_ranges_;

  Counters file_final_;
  U64Map<LiveBlock> final_live_;
  std::array<AnomalyStat, kAnomalyKinds> anomalies_{};
  bool allocated_exact_ = true;
  size_t live_at_start_ = 0;
  size_t freed_before_start_ = 0;
};

// Everything `analyze` reports for one device, computed in one backward + one forward pass.
struct DeviceSummary {
  int64_t device = 0;
  size_t events = 0;
  std::array<uint64_t, format::kActionCount> by_action{};
  int64_t first_time_us = -1;
  int64_t last_time_us = -1;
  Counters start;
  Counters final_replayed;
  Counters final_file;
  Peak peak_reserved, peak_requested, peak_allocated, peak_active;
  bool allocated_exact = true;
  std::vector<OomEvent> ooms;
  size_t segments = 0;
  size_t live_blocks_final = 0;
  size_t live_at_start = 0;
  size_t freed_before_start = 0;
  std::array<AnomalyStat, kAnomalyKinds> anomalies{};
};

// Runs a full forward pass on `r` (from its start state) and collects the summary. Anomalies are
// counted during the first full pass of a replayer only.
DeviceSummary summarizeDevice(DeviceReplayer& r);

}  // namespace memforensics::replay
