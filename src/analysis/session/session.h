// session.h: one replay session per device; every analysis reads its facts (issue 12, part 2).
//
// A DeviceSession walks a device's history a bounded number of times, whatever the number of
// consumers, detectors or OOMs:
//
//   construction   phases detected once (annotations or the repeating pattern), the allocation
//                  table (alloc <-> free, iteration, category) from the events alone;
//                  1 backward pass: DeviceReplayer's start-state reconstruction;
//                  forward pass 1: the summary (counters, peaks, OOMs, anomalies), the requested
//                  bytes at the end of every iteration, and on request (SessionOptions::series)
//                  the counters after every event (the timeline's series);
//   request*()     consumers name the moments they need (after pass 1, so they can use peaks,
//                  OOMs and iterations to choose): the live set at a moment, the block layout at a
//                  moment, or both;
//   visit()        forward pass 2: the replayer and, when some moment needs a layout, the
//                  allocator model step together from the start state; at each requested moment
//                  the live set and/or the layout is copied into the facts. The model runs to the
//                  end of the trace, so its whole-device verdict (every alloc address and segment
//                  event predicted, final layout equal to the file's) is known before anything
//                  calls a figure exact. With requestSeries() (the series asked for after pass 1)
//                  the replayer steps the whole trace and keeps the counters after every event.
//
// After visit() the DeviceFacts are complete and immutable: findings, top groups, the call graph,
// blocks, the timeline, the report data and the exports are pure functions of them (and of the
// Snapshot, for frame text). Nothing downstream holds a replayer.
//
// Bounds: at most kMaxLiveMoments live-set copies and kMaxLayoutMoments layouts per device, and
// at most kMaxCopiedBlocks blocks copied in all (named below; requests beyond the moment bounds are
// refused by request*() returning false; a moment whose copy would pass the block budget is
// visited without it, in event order, and says so in MomentFacts::over_budget). Consumers say
// what they could not show.
// Passes per device, counted by replay/pass_stats.h: 1 backward, <= 2 forward (the second only
// when a moment or the series was requested), the model seeded at most once and stepped at most
// once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/frames/frame_class.h"
#include "analysis/session/phases.h"
#include "analysis/session/stepping.h"
#include "common/flat_map.h"
#include "format/model/snapshot.h"
#include "replay/allocator_model.h"
#include "replay/pass_stats.h"
#include "replay/replay.h"

namespace memforensics::analysis {

// What an allocation is for, inferred from its stack, its lifetime and the phases (rules in
// docs/findings.md). An inference: reported as such.
enum class Category : uint8_t {
  Parameter,
  Gradient,
  Activation,
  OptimizerState,
  Temporary,
  Unknown
};
inline constexpr size_t kCategoryCount = 6;
std::string_view categoryName(Category c);

// One allocation of the trace, from the events alone (no replay).
struct AllocFact {
  int64_t event = 0;
  int64_t freed = -1;  // event of free_requested (or free_completed without one); -1 = alive at end
  uint64_t requested = 0;
  format::StackId stack = format::kNoStack;
  int64_t stream = 0;
  int iteration = -1;  // index into DeviceFacts::iterations, -1 = outside every iteration
  Category category = Category::Unknown;
};

// Why a moment is visited (bits; a moment asked for by several consumers carries all of them).
enum MomentReason : uint32_t {
  kMomentPeakRequested = 1u << 0,
  kMomentPeakReserved = 1u << 1,
  kMomentPeakAllocated = 1u << 2,
  kMomentPeakActive = 1u << 3,
  kMomentOom = 1u << 4,
  kMomentBeforeFirstIteration = 1u << 5,
  kMomentEnd = 1u << 6,
  kMomentAt = 1u << 7,        // a user's --at
  kMomentKeyframe = 1u << 8,  // the report's evenly spaced keyframes
};

// The state after one event (-1: the start state), as pass 2 saw it.
struct MomentFacts {
  int64_t event = -1;
  int64_t time_us = -1;  // the event's time (-1 for the start state or when the file has none)
  uint32_t reasons = 0;  // MomentReason bits
  replay::Counters at;   // the replayer's counters
  bool has_live = false;
  U64Map<replay::LiveBlock> live;  // DeviceReplayer::live() at the moment (has_live)
  bool has_layout = false;
  std::vector<replay::ModelSegment> layout;  // DeviceAllocatorModel::layout() (has_layout)
  replay::ModelCheck model_prefix;           // the model's checks on events [0, event]
  // A live set or layout was requested here but not copied: it would pass kMaxCopiedBlocks.
  bool over_budget = false;
};

// The allocator model's whole-device verdict, and what may be called exact because of it.
struct ModelFacts {
  bool ran = false;              // some moment needed a layout, so the model stepped the trace
  replay::ModelVerdict verdict;  // complete when ran: allocs predicted / total, final compare
  // Figures from the model may be called exact: the verdict is exact AND the replay is consistent
  // with the file (no UntrustedFigure kUntrustedBlockLayout). Otherwise every such figure is an
  // estimate and `estimate_reason` says why in one line.
  bool layout_exact = false;
  std::string estimate_reason;  // "" when layout_exact; e.g. "model predicted 38 of 199 allocs"
};

// A stretch of consecutive events and the extremes of the replayer's counters after them (pass 1):
// the coarse profile rules read to ask how a run went on after a moment without keeping a
// per-event series. A device's events are cut into at most kProfileBuckets stretches of equal
// length (the last one shorter).
struct ProfileBucket {
  int64_t first_event = 0;
  int64_t last_event = 0;
  int64_t first_time_us = -1;  // of the first event with a time in the stretch, -1 when none
  uint64_t max_active = 0;
  uint64_t min_reserved = ~uint64_t{0};
};
inline constexpr size_t kProfileBuckets = 1024;

// Everything one session learned about one device. `events` views the device's trace as
// `held_events` holds it (the Snapshot's events, or a deferred snapshot's device decoded): the
// facts must not outlive the Snapshot they were built from.
struct DeviceFacts {
  int64_t device = 0;
  std::span<const format::Event> events;
  format::DeviceEvents held_events;
  size_t segments = 0;  // the file's final segments of this device

  // Pass 1.
  replay::DeviceSummary summary;
  // After each event, [0] = the start state: on request, from pass 1 (SessionOptions::series) or
  // from pass 2 (DeviceSession::requestSeries, once the consumer knows it needs them).
  std::vector<replay::Counters> series;
  bool has_series = false;

  // From the events and phases (no replay).
  std::vector<Phase> phases;      // detectPhases(), once
  std::vector<Phase> iterations;  // the Iteration phases with a non-empty range, in order
  std::string iteration_basis;    // "iterations from external_annotations" / "... detected ..."
  std::vector<uint64_t> requested_at_iteration_end;  // pass 1: after each iteration's last event
  std::vector<ProfileBucket> profile;                // pass 1: the counters' coarse profile
  std::vector<AllocFact> allocs;                     // in event order
  std::vector<int32_t> alloc_at;  // per event: index into allocs for alloc events, else -1

  // Pass 2.
  std::vector<MomentFacts> moments;  // by event, one per distinct event
  ModelFacts model;
  // The layout after every event of a window, as patches (requestStepping; stepping.h).
  std::optional<SteppingFacts> stepping;

  // Passes this device cost (replay/pass_stats.h), filled by visit().
  replay::PassStats passes;

  // The moment at `event`, or nullptr when it was not requested.
  const MomentFacts* at(int64_t event) const;
  // The category of a live block: its allocation's, or for a block alive before the trace (no
  // alloc event) the one its stack suggests.
  Category categoryOf(const format::Snapshot& snap, const replay::LiveBlock& b) const {
    return categoryOf(snap, b.alloc_event, b.stack);
  }
  // The same from what it reads of a block: its alloc event (-1: before the trace) and stack.
  Category categoryOf(const format::Snapshot& snap, int64_t alloc_event,
                      format::StackId stack) const;
};

// Bounds on what one session copies (see the header comment): moments with a live set, moments
// with a layout, and blocks copied into live sets and layouts together, per device. A live block
// costs about 64 bytes in a copy, a layout block about 64: 4 Mi blocks stay near 256 MiB however
// hostile the input, while a real training run (tens of thousands of live blocks) never reaches it.
inline constexpr size_t kMaxLiveMoments = 256;
inline constexpr size_t kMaxLayoutMoments = 256;
inline constexpr size_t kMaxCopiedBlocks = size_t{1} << 22;
// OOM verdicts per device (findings/detect_oom.cc): the first kOomVerdicts - 1 OOMs and the last
// (the one that ended the job, when it was not caught). A job that catches OOMs and retries may
// record thousands; each verdict's title says which OOM of how many it is. The session keeps the
// live sets and layouts of those OOMs only.
inline constexpr size_t kOomVerdicts = 16;
// Whether OOM k (0-based) of a device's n gets a verdict: of `cap` kept, the first cap - 1 and the
// last (the report's OOM keyframes follow the same rule with a cap of their own).
inline constexpr bool oomHasVerdict(size_t k, size_t n, size_t cap = kOomVerdicts) {
  return k + 1 < cap || k + 1 == n;
}
// How many of n OOMs oomHasVerdict(k, n, cap) keeps.
inline constexpr size_t oomsWithVerdict(size_t n, size_t cap = kOomVerdicts) {
  return n == 0 ? 0 : std::min(n, std::max<size_t>(cap, 1));
}
// OOM verdicts per device that read the block layout (the first ones), by default.
inline constexpr size_t kLayoutOoms = 16;

// The live sets findings.h's detectors read, from pass 1's facts, in the order they are asked for:
// the requested and active peaks, the state before the first iteration, the end, then every OOM
// that gets a verdict (oomHasVerdict; the fixed moments first).
// DeviceSession::requestFindingMoments asks for these; the report's baseline profile removes them
// again (analyze.h findingLiveEvents). The one list of them.
struct FindingMoment {
  int64_t event = -1;
  uint32_t reason = 0;  // MomentReason
};
std::vector<FindingMoment> findingMoments(const DeviceFacts& facts);

// The allocation table from the events alone: every alloc in event order with its request, stack,
// stream and the first free_requested / free_completed of its address before the address is
// allocated again (`freed`); iteration -1 and category Unknown (eventFacts fills both). With
// `alloc_at`, also the index of each event's alloc (-1 for the others). Phase detection and
// eventFacts read this one table (one walk of the events and one address table per device).
std::vector<AllocFact> allocationTable(std::span<const format::Event> events,
                                       std::vector<int32_t>* alloc_at = nullptr);

// The facts that need no replay: events, segment count, phases, iterations, the allocation table
// with categories (what a DeviceSession starts from). The device's events are taken through
// format::DeviceEvents (a deferred snapshot's device is decoded here) and held by the facts.
DeviceFacts eventFacts(const format::Snapshot& snap, int64_t device);
// The same, with the frames' and stacks' facts from `cache` (a DeviceSession's).
DeviceFacts eventFacts(const format::Snapshot& snap, int64_t device, StackFactsCache& cache);

// Pass 1 keeps the replayer's state every max(kMinCheckpointSpacing, events / kMaxCheckpoints)
// events (replay.h keepCheckpoints), so pass 2 steps from the latest copy before each moment: a
// copy closer than this to the last saves too little stepping to pay for itself.
inline constexpr size_t kMinCheckpointSpacing = 1024;

struct SessionOptions {
  bool series = false;  // keep the counters after every event (timeline, report, exports)
  // Checkpoints for pass 2 (kMinCheckpointSpacing); the facts are the same either way. Off where
  // the sessions of many devices are alive at once between pass 1 and pass 2 (visitSessions, the
  // report's buildReportData): each replayer's copies (up to kMaxCheckpointSlots) would then add
  // up over every device instead of over the threads.
  bool checkpoints = true;
  // The snapshot's frozen frame and stack facts (freezeStackFacts), shared by the sessions of all
  // devices; null: the session classifies what it reads itself. The facts are the same either way.
  const FrozenStackFacts* stack_facts = nullptr;
};

class DeviceSession {
 public:
  // Detects phases, builds the allocation table, runs the backward pass and forward pass 1.
  DeviceSession(const format::Snapshot& snap, int64_t device, const SessionOptions& options = {});
  ~DeviceSession();
  DeviceSession(const DeviceSession&) = delete;
  DeviceSession& operator=(const DeviceSession&) = delete;

  // Pass-1 facts are readable at once (summary, phases, allocations, the series when
  // SessionOptions::series); moments (and a series asked for by requestSeries) after visit.
  const DeviceFacts& facts() const { return facts_; }

  // Ask for the live set / the block layout after `event` (-1 = the start state; clamped to the
  // trace). Returns false when the bound (kMaxLiveMoments / kMaxLayoutMoments) is reached or the
  // event is outside [-1, events); the moment is then not visited for that purpose.
  bool requestLive(int64_t event, uint32_t reason);
  bool requestLayout(int64_t event, uint32_t reason);
  // Everything findings.h's detectors read: the requested and active peaks, every OOM (the first
  // `layout_ooms` with the layout), the state before the first iteration, the end.
  void requestFindingMoments(size_t layout_ooms);
  // The counters after every event (DeviceFacts::series), taken in pass 2, which then steps the
  // whole trace: for a consumer that learns from pass 1 whether it needs them (the report draws
  // at most a few devices of many), so that the others never hold them. A no-op when pass 1
  // kept them (SessionOptions::series); false after visit().
  bool requestSeries();
  // The block layout after every event of [first, last], as patches (stepping.h): the model steps
  // the trace in pass 2 as it does for a layout. False after visit() or for a range outside the
  // trace; one window per session (a second request replaces the first).
  bool requestStepping(int64_t first, int64_t last);

  // Forward pass 2 over the requested moments (a no-op without requests; once only). Afterwards
  // facts() is complete, including passes.
  void visit();
  // Moves the facts out (after visit()).
  DeviceFacts take();

 private:
  struct Pending;
  const format::Snapshot& snap_;
  StackFactsCache stack_facts_;  // this device's frame and stack facts (phases, categories)
  DeviceFacts facts_;
  std::unique_ptr<replay::DeviceReplayer> replayer_;
  std::unique_ptr<Pending> pending_;
  bool visited_ = false;
  replay::PassStats before_;  // pass counters of this device when the session began
};

// Convenience: a session for every device (or only `device`), each with the finding moments and
// the extra requests a command needs, visited and returned. Devices in ascending order.
struct FactsRequest {
  std::optional<int64_t> device;
  bool findings = true;              // requestFindingMoments
  size_t layout_ooms = kLayoutOoms;  // OOMs whose finding uses the block layout
  bool series = false;               // SessionOptions::series
};
std::vector<DeviceFacts> buildFacts(const format::Snapshot& snap, const FactsRequest& request);

}  // namespace memforensics::analysis
