// replay.h: offline replay of a device's allocation history, from the snapshot file alone.
//
// The file holds the allocator's FINAL state (segments and blocks) and the trace of events that led
// there (possibly truncated at the front by PyTorch's ring buffer). Replay therefore works in two
// passes, as the format doc's section 6 describes:
//
//   1. Backward: start from the final live blocks and segment ranges and undo every event from the
//      last to the first. What remains is the state at the start of the trace. Blocks that the
//      trace frees but never allocates were alive before it began (history truncated or started
//      late), and the undo puts them into the start state, as memory_viz does. The backward pass
//      also learns the real block size of every alloc whose block is still alive at the end.
//   2. Forward: walk the events from that start state, maintaining per device
//        reserved   (+ segment_alloc/segment_map,  - segment_free/segment_unmap)   =
//        memory_reserved requested  (+ alloc request,              - free_completed) = memory_viz's
//                                                                                    Active Memory
//                                                                                    Timeline
//        allocated  (+ block size at alloc,        - block size at free_requested)  =
//        memory_allocated pending    (blocks between free_requested and free_completed, block
//        sizes)
//      and checking every event against the state (double alloc, free of an unknown block,
//      `snapshot` events whose size differs from the replayed active bytes...). Problems are
//      counted as anomalies with a severity; replay never throws and never stops early.
//
// Block sizes: the trace records only the requested size. A block that is still alive at the end
// has its real size in the final state; every other block's size is PyTorch's round_size() of the
// request (format doc 8.2). Large-pool blocks can carry up to 1 MiB of unsplit slack that rounding
// cannot see, so `allocated` is exact only when `allocated_exact` says so; the allocator model (a
// later module) removes that estimate.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/address_range.h"
#include "common/flat_map.h"
#include "common/saturating.h"
#include "format/model/snapshot.h"

namespace memforensics::replay {

using format::Action;
using format::Event;
using format::Snapshot;
using format::StackId;

struct PassStats;  // replay/pass_stats.h

// PyTorch's CUDACachingAllocator round_size(): 512-byte granularity, or the power-of-two divisions
// of `roundup_power2_divisions` (index k covers requests in [2^k MiB, 2^(k+1) MiB)).
uint64_t roundSize(uint64_t requested, const uint32_t divisions[16]);

enum class Severity : uint8_t { Info, DataLoss, Error };
std::string_view severityName(Severity s);

// Every anomaly replay can count: id, severity, one-line description. Perfetto-style stats table.
#define MEMF_ANOMALIES(X)                                                                        \
  X(FreesBeforeTraceStart, DataLoss,                                                             \
    "blocks freed in the trace but allocated before it began (ring buffer wrapped or recording " \
    "started late); counted as live from the start")                                             \
  X(LiveWithoutAlloc, Info,                                                                      \
    "blocks alive at the end with no alloc in the trace; counted as live from the start")        \
  X(DoubleAlloc, Error, "alloc of an address that already holds a live block")                   \
  X(FreeOfUnknownBlock, Error, "free of an address that holds no live block")                    \
  X(FreeSizeMismatch, Error, "free event size differs from the size its alloc requested")        \
  X(FreeCompletedWithoutRequest, Info,                                                           \
    "free_completed without a preceding free_requested (action skipped or overwritten)")         \
  X(FreeRequestedTwice, Error, "free_requested of a block already waiting for free_completed")   \
  X(SegmentNotMapped, Error, "segment_free/segment_unmap of a range that is not reserved")       \
  X(SegmentOverlap, Error,                                                                       \
    "segment_alloc/segment_map of a range that is already reserved (ignored)")                   \
  X(AllocOutsideSegments, Error, "alloc at an address outside every reserved segment")           \
  X(SnapshotMismatch, Error, "`snapshot` event size differs from the replayed active bytes")     \
  X(FinalStateMismatch, Error, "forward replay does not end at the file's final segment state")  \
  X(HistoryContradictsFinalState, Error,                                                         \
    "the trace cannot lead to the file's final state (e.g. the trace stops before the segments " \
    "were taken): an alloc whose block is never freed and not alive at the end, a free of a "    \
    "block "                                                                                     \
    "alive at the end, a segment event the final segments contradict; start state, peaks, "      \
    "replayed final state and block layout cannot be trusted")                                   \
  X(CounterOverflow, Error,                                                                      \
    "a byte counter would pass 2^64-1 (it saturates there; the figures are not exact)")          \
  X(RequestedExceedsBlock, Error,                                                                \
    "an allocation requests more bytes than its block holds (counted as the block's size)")      \
  X(InvalidSegmentRange, Error,                                                                  \
    "a segment or segment event of size 0 or whose address + size passes 2^64 (ignored)")        \
  X(OverlappingSegments, Error,                                                                  \
    "a segment of the file's final state overlaps an earlier one (the later one is ignored)")    \
  X(BlockOutsideSegment, Error,                                                                  \
    "a block of the file's final state is empty, lies outside its segment, or does not start "   \
    "where the previous block ends (checked sums; the block is ignored)")                        \
  X(TimeRegression, Info, "time_us decreases between consecutive events")                        \
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

// Checked arithmetic for sizes, addresses and counters that the input controls.
// [address, address + size) is a usable range: not empty, and its end does not pass 2^64.
inline bool validRange(uint64_t address, uint64_t size) {
  uint64_t end;
  return size > 0 && !__builtin_add_overflow(address, size, &end);
}

// The file's final state of one device, validated. Segments of size 0, segments whose end passes
// 2^64 and segments that overlap one at a lower address are dropped (InvalidSegmentRange,
// OverlappingSegments); a block that is empty, lies (partly) outside its segment or overlaps the
// previous block is dropped (BlockOutsideSegment); an active block that requests more than its
// size counts as requesting its size (RequestedExceedsBlock). Replay and the allocator model both
// read the final state through this, so they see the same segments and blocks.
struct FinalSegment {
  uint32_t index = 0;            // into Snapshot::segments
  std::vector<uint32_t> blocks;  // kept blocks, indices into Snapshot::blocks, address order
};
struct FinalState {
  std::vector<FinalSegment> segments;  // address order, disjoint
  uint64_t invalid_segments = 0, overlapping_segments = 0, bad_blocks = 0, requested_over_size = 0;
};
FinalState validateFinalState(const Snapshot& snap, int64_t device);

// Figures a replay cannot vouch for (DeviceSummary::untrusted), as bits. When the trace cannot
// lead to the file's final state (HistoryContradictsFinalState, FinalStateMismatch) the start state
// derived backward from that final state is wrong, and so are the peaks and the replayed final
// state computed from it, and the block layout seeded from it; so are they when that final state
// was rebuilt from the events (Snapshot::final_state_rebuilt) and the trace did not start from an
// empty device (blocks or segments alive at its start: those alive throughout are in no record);
// a saturated counter (CounterOverflow) spoils the byte figures.
enum UntrustedFigure : uint8_t {
  kUntrustedStart = 1,
  kUntrustedPeaks = 2,
  kUntrustedFinalReplayed = 4,
  kUntrustedBlockLayout = 8,
};
// Names of the set bits, in this order: "start", "peaks", "final_replayed", "block_layout".
std::vector<std::string_view> untrustedNames(uint8_t mask);
// What every output says of an untrusted replay: "<cause>; not exact: <names>", the names joined
// by `separator` (text outputs " ", a finding's basis ", ").
std::string describeUntrusted(std::string_view cause, uint8_t mask, std::string_view separator);

struct AnomalyStat {
  uint64_t count = 0;
  int64_t first_event = -1;  // index of the first event it was seen at, -1 when not tied to one
};

struct Counters {
  uint64_t reserved = 0;
  uint64_t requested = 0;
  uint64_t allocated = 0;
  uint64_t pending = 0;  // pending-free block bytes
  // Saturates, as every counter does.
  uint64_t active() const { return addSat(allocated, pending); }
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
  uint64_t size = 0;         // block size (exact when known from the final state, else rounded)
  int64_t alloc_event = -1;  // -1: alive before the trace started
  int64_t stream = 0;
  StackId stack = format::kNoStack;
  bool pending = false;  // between free_requested and free_completed
  bool size_exact = false;
};

// Replays one device. Construct (runs the backward pass), then step() forward.
class DeviceReplayer {
 public:
  // Replays snap.trace(device): the snapshot's events must be in memory (Snapshot::trace).
  DeviceReplayer(const Snapshot& snap, int64_t device);
  // Replays `events`, the device's trace as the caller holds it (format::DeviceEvents: a
  // deferred snapshot's device decoded); they must outlive the replayer.
  DeviceReplayer(const Snapshot& snap, int64_t device, std::span<const Event> events);
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
  // Steps up to `max` events (fewer at the end), writing the counters after each into after[0..n):
  // what n step() calls followed each by counters() give, without a call per event. Returns n.
  size_t stepMany(size_t max, Counters* after);

  // Checkpoints of the forward state: from now on, the first walk past every `every` events (at
  // the end of a stepMany() batch) keeps a copy of the state there, at most kMaxCheckpoints of them
  // holding at most kMaxCheckpointSlots live-table slots together; advanceTo() then starts from the
  // latest copy at or before its target when that is ahead of where the replayer is, instead of
  // stepping every event in between again. The replay is deterministic, so the state reached is
  // the same (the same blocks in the same table slots): only fewer events are stepped, and a walk
  // that starts from a copy applies no event 0 (no new forward pass in PassStats). 0 drops them.
  void keepCheckpoints(size_t every);
  size_t checkpointCount() const { return checkpoints_.size(); }

  const Counters& counters() const { return cur_; }
  const Counters& startCounters() const { return start_; }
  const U64Map<LiveBlock>& live() const { return live_; }
  // The live set of the start state (the backward pass's result), e.g. to seed the allocator model.
  const U64Map<LiveBlock>& startLive() const { return start_live_; }
  const std::array<AnomalyStat, kAnomalyKinds>& anomalies() const { return anomalies_; }
  // Final state as the file states it (sum over this device's segments and active blocks).
  const Counters& fileFinal() const { return file_final_; }
  bool allocatedExact() const { return allocated_exact_; }
  size_t liveAtStartCount() const { return live_at_start_; }
  size_t freedBeforeStartCount() const { return freed_before_start_; }

  // Compares the current live set and counters with the file's final state; only meaningful after
  // the last step. Counts FinalStateMismatch when they differ.
  void checkFinalState();
  // The figures that cannot be trusted given the anomalies counted so far (UntrustedFigure bits;
  // complete after checkFinalState()). 0: the replay is consistent with the file.
  uint8_t untrusted() const;
  // Why untrusted() is not 0, in words for a reader ("" when it is 0): untrustedCause's text.
  std::string_view untrustedCause() const;

 private:
  bool contradictsFinalState() const;  // HistoryContradictsFinalState, or FinalStateMismatch
  bool rebuiltMidRun() const;          // a rebuilt final state, blocks or segments at the start
  void note(AnomalyKind k, int64_t event);
  // Counts HistoryContradictsFinalState during the backward pass (first_event = the earliest).
  void contradiction(size_t event);
  // c += v, saturating at 2^64-1 with a CounterOverflow anomaly.
  void add(uint64_t& c, uint64_t v, int64_t event);
  void backward();
  void apply(size_t i, const Event& e);
  void maybeCheckpoint();
  bool stepOne();  // step()'s body, inlined into the stepping loops
  // ranges_.contains(addr), through reserved_hit_.
  bool reservedContains(uint64_t addr);

  const Snapshot& snap_;
  int64_t device_;
  std::span<const Event> events_;
  uint32_t divisions_[16] = {};
  bool complete_on_request_ = false;  // trace has free_requested but no free_completed at all
  bool request_on_complete_ = false;  // trace has free_completed but no free_requested at all

  // Start state (from the backward pass).
  U64Map<LiveBlock> start_live_;
  Counters start_;
  RangeSet start_ranges_;  // reserved address ranges
  // Per event, set for allocs only (other events' entries are never read): the block size and
  // whether it is exact (known from the final state).
  std::unique_ptr<uint64_t[]> alloc_block_size_;
  std::unique_ptr<uint8_t[]> alloc_size_exact_;

  // Current state.
  U64Map<LiveBlock> live_;
  RangeSet ranges_;  // reserved now
  // A range of ranges_ the last alloc fell in (empty: none), so that the allocs into one segment
  // skip the map search. Adding ranges keeps it inside the set; it is cleared when bytes leave the
  // set (segment free/unmap) and on reset().
  AddressRange reserved_hit_;
  Counters cur_;
  size_t next_ = 0;
  int64_t last_time_ = -1;
  // Anomalies of event i are counted the first time it is applied (events [0, checked_) have
  // been), whatever resets and partial passes came before; FinalStateMismatch the first time
  // checkFinalState() runs after the last event.
  size_t checked_ = 0;
  bool final_checked_ = false;
  RangeSet final_ranges_;

  Counters file_final_;
  U64Map<LiveBlock> final_live_;
  std::array<AnomalyStat, kAnomalyKinds> anomalies_{};
  bool allocated_exact_ = true;
  // The file has at least one segment of this device. Without any, there is no final state to
  // contradict (trace-only files: fabricated tests, a cut native trace): nothing is marked
  // untrusted.
  bool has_final_state_ = false;
  bool final_state_rebuilt_ = false;  // Snapshot::final_state_rebuilt
  size_t live_at_start_ = 0;
  size_t freed_before_start_ = 0;
  PassStats* stats_ = nullptr;  // this device's pass counters (replay/pass_stats.h)

  // keepCheckpoints(): the forward state after event next - 1, by next.
  struct Checkpoint {
    size_t next = 0;
    U64Map<LiveBlock> live;
    RangeSet ranges;
    Counters cur;
    int64_t last_time = -1;
  };
  std::vector<Checkpoint> checkpoints_;
  size_t checkpoint_every_ = 0;
  size_t checkpoint_slots_ = 0;  // live-table slots in checkpoints_ (kMaxCheckpointSlots)
};

// Bounds of DeviceReplayer::keepCheckpoints() per replayer: copies kept, and live-table slots in
// them together (a copy copies the whole table, U64Map::capacity(), about 48 bytes a slot: 1 Mi
// slots stay near 48 MiB however hostile the trace, a table grown by a spike of blocks included;
// a real device's table holds a few thousand).
inline constexpr size_t kMaxCheckpoints = 8;
inline constexpr size_t kMaxCheckpointSlots = size_t{1} << 20;

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
  // false when the trace cannot lead to the file's final state (or a counter saturated): then
  // `untrusted` (UntrustedFigure bits) names the figures that are not exact.
  bool consistent = true;
  uint8_t untrusted = 0;
  std::string_view
      untrusted_cause;  // why, in words (DeviceReplayer::untrustedCause); "" if trusted
  std::vector<OomEvent> ooms;
  size_t segments = 0;
  size_t live_blocks_final = 0;
  size_t live_at_start = 0;
  size_t freed_before_start = 0;
  std::array<AnomalyStat, kAnomalyKinds> anomalies{};
};

// Runs a full forward pass on `r` (from its start state) and collects the summary. Each anomaly is
// counted once per event, however the replayer was moved before (a partial pass, then a reset).
DeviceSummary summarizeDevice(DeviceReplayer& r);
// The same pass, calling `after_event(i, counters)` after event i is applied: one pass feeds the
// summary and a caller's observers (analysis/session/session.h).
DeviceSummary summarizeDevice(DeviceReplayer& r,
                              const std::function<void(size_t, const Counters&)>& after_event);

namespace detail {
// summarizeDeviceWith's parts: before the walk, one event, after it (replay.cc has the first and
// the last).
DeviceSummary beginSummary(DeviceReplayer& r);
void finishSummary(DeviceReplayer& r, DeviceSummary& s);
inline void summarizeEvent(DeviceSummary& s, size_t i, const Event& e, const Counters& c) {
  s.by_action[static_cast<size_t>(e.action)]++;
  if (e.time_us >= 0) {
    if (s.first_time_us < 0) s.first_time_us = e.time_us;
    s.last_time_us = e.time_us;
  }
  auto upd = [&](Peak& p, uint64_t v) {
    if (v > p.bytes) {
      p.bytes = v;
      p.event = static_cast<int64_t>(i);
      p.time_us = e.time_us;
    }
  };
  upd(s.peak_reserved, c.reserved);
  upd(s.peak_requested, c.requested);
  upd(s.peak_allocated, c.allocated);
  upd(s.peak_active, c.active());
  if (e.action == Action::Oom) {
    OomEvent o;
    o.event = static_cast<int64_t>(i);
    o.time_us = e.time_us;
    o.request_bytes = e.size;
    o.device_free = e.addr;
    o.stream = e.stream;
    o.stack = e.stack;
    o.at = c;
    s.ooms.push_back(o);
  }
}
}  // namespace detail

// The same pass with the observer called directly (no std::function per event): for the session,
// which observes every event of every device.
// The replayer steps kSummaryBatch events at a time (DeviceReplayer::stepMany), the observer and
// the summary then read their counters: the same counters, in the same order, as one step() per
// event. 256 x 32 bytes of counters on the stack.
inline constexpr size_t kSummaryBatch = 256;
template <class AfterEvent>
DeviceSummary summarizeDeviceWith(DeviceReplayer& r, AfterEvent&& after_event) {
  DeviceSummary s = detail::beginSummary(r);
  auto ev = r.events();
  std::array<Counters, kSummaryBatch> after;
  size_t i = 0;
  while (i < ev.size()) {
    const size_t got = r.stepMany(after.size(), after.data());
    if (got == 0) break;
    for (size_t k = 0; k < got; ++k, ++i) {
      const Counters& c = after[k];
      after_event(i, c);
      detail::summarizeEvent(s, i, ev[i], c);
    }
  }
  detail::finishSummary(r, s);
  return s;
}

}  // namespace memforensics::replay
