// findings.h: answers, not pictures. Each detector is a pure function of one device's facts
// (analysis/session/session.h: summary, phases, allocations, the live sets and layouts at the
// moments requestFindingMoments() asks for) that returns findings with a severity, the bytes
// involved, the evidence (events, stacks, phases) and the fix to try. No detector replays anything
// or reads another's output, so they run in any order with the same result. The rules, thresholds
// and their reasons are in docs/findings.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/frames/callgraph.h"
#include "analysis/frames/frames.h"
#include "analysis/session/phases.h"
#include "analysis/session/session.h"
#include "format/model/snapshot.h"
#include "replay/replay.h"

namespace memforensics::analysis {

enum class FindingSeverity : uint8_t { Info, Warning, High };
std::string_view findingSeverityName(FindingSeverity s);

// The catalogue of finding kinds, one row each: the enum name, the id (as in the JSON), the
// lowest and highest severity its detector gives, the section of docs/findings.md that states its
// rule (the heading's anchor; a test checks the heading exists and names those severities), and
// the file of its detector.
#define MEMF_FINDING_KINDS(X)                                                                   \
  X(OomVerdict, "oom_verdict", High, High, "oom-verdict-high", "detect_oom.cc")                 \
  X(Leak, "leak", Warning, High, "leak-high--warning", "detect_growth.cc")                      \
  X(ActivationRetention, "activation_retention", Info, Warning,                                 \
    "activation-retention-warning--info-checked-by-replay", "detect_growth.cc")                 \
  X(OptimizerStateBloat, "optimizer_state_bloat", Warning, High,                                \
    "optimizer-state-bloat-high--warning", "detect_optimizer.cc")                               \
  X(CacheBloat, "cache_bloat", Warning, Warning, "cache-bloat-warning-checked-by-replay",       \
    "detect_cache.cc")                                                                          \
  X(TemporarySpike, "temporary_spike", Warning, Warning, "temporary-spike-warning",             \
    "detect_spike.cc")                                                                          \
  X(PendingFreeRetention, "pending_free_retention", Warning, Warning,                           \
    "pending-free-retention-warning", "detect_pending_free.cc")                                 \
  /* activations held for backward dominate the peak (an estimate) */                           \
  X(ActivationCheckpointing, "activation_checkpointing", Warning, Warning,                      \
    "activation-checkpointing-opportunity-warning-an-estimate", "detect_checkpoint.cc")         \
  /* cross-device: peaks or per-line sizes differ across devices of a job */                    \
  X(DeviceImbalance, "device_imbalance", Warning, High,                                         \
    "device-imbalance-high--warning-a-job-finding", "cross_device.cc")                          \
  /* the history cannot explain the file's state (ring of 1, no trace) */                       \
  X(IncompleteHistory, "incomplete_history", Info, Warning, "incomplete-history-warning--info", \
    "detect_history.cc")                                                                        \
  /* a replay shows another allocator setting lowers the peak reserved */                       \
  X(AllocatorSetting, "allocator_setting", Warning, Warning,                                    \
    "allocator-setting-warning-checked-by-replay", "detect_cache.cc")                           \
  /* activations kept for a backward that never runs (an estimate) */                           \
  X(InferenceWithGrad, "inference_with_grad", Warning, Warning,                                 \
    "forward-with-autograd-on-and-no-backward-warning-an-estimate", "detect_checkpoint.cc")

enum class FindingKind : uint8_t {
#define MEMF_X(name, id, lo, hi, anchor, file) name,
  MEMF_FINDING_KINDS(MEMF_X)
#undef MEMF_X
};

struct FindingKindInfo {
  std::string_view id;  // snake_case, as in the JSON
  FindingSeverity lowest;
  FindingSeverity highest;
  std::string_view docs_anchor;  // docs/findings.md#<anchor>
  std::string_view detector;     // the file under src/analysis/findings/
};
// Every kind, in enum order.
std::span<const FindingKindInfo> findingKinds();
const FindingKindInfo& findingKindInfo(FindingKind k);
std::string_view findingKindId(FindingKind k);  // findingKindInfo(k).id

struct Evidence {
  std::string text;    // one line a person reads
  int64_t event = -1;  // event index on the device, -1 when not tied to one
  int64_t time_us = -1;
  uint64_t bytes = 0;
  std::vector<FrameText> frames;  // innermost user frames of the stack involved, if any
};

// The OOM verdict's figures (FindingKind::OomVerdict only), in bytes at the failed request.
struct OomNumbers {
  uint64_t request_bytes = 0;   // the failed request (rounded as the allocator asked)
  uint64_t short_by_bytes = 0;  // what would have had to be free for the request to succeed
  bool fragmentation = false;   // the bytes were free in the cache but not in one usable block
  uint64_t live_bytes = 0;      // allocated (live tensors) at the OOM
  uint64_t capacity_bytes = 0;  // reserved + device free at the OOM (0 when the file lacks it)
  uint64_t reserved_bytes = 0;
  uint64_t device_free_bytes = 0;
  uint64_t cache_free_bytes = 0;  // reserved but not allocated
  uint64_t flushed_bytes = 0;     // released by the allocator's retry just before the OOM
  bool exact = false;             // figures from an exact layout; else an estimate (basis says why)
  // The verdict's conclusion is "live tensors fill the card" (not fragmentation, not a request
  // larger than the card alone, not a limit elsewhere): the fix is its smallest changes.
  bool fills_card = false;
  // Then: the smallest capacity a replay of the device's requests runs in without an OOM (0: not
  // searched or not found), and the smallest changes the fix names, in order (oomChangesFix); the
  // job's findings may add one (cross_device.cc: an even split).
  uint64_t smallest_capacity_bytes = 0;
  std::vector<std::string> smallest_changes;
};

// The OOM verdict's fix when live tensors fill the card: its smallest changes, then the general
// advice (or that advice alone when there is no change to name).
std::string oomChangesFix(const std::vector<std::string>& changes);

struct Finding {
  FindingKind kind = FindingKind::OomVerdict;
  FindingSeverity severity = FindingSeverity::Info;
  int64_t device = 0;
  std::string title;             // one line: what is wrong, with the number
  uint64_t bytes = 0;            // the bytes involved (leaked, retained, extra state, spike...)
  std::vector<FrameText> where;  // the line to change (innermost user frames), when one stands out
  std::vector<Evidence> evidence;
  std::string fix;    // what to try
  std::string basis;  // how sure: e.g. "phases from external_annotations" / "iterations detected"
  std::optional<OomNumbers> oom;  // OomVerdict only
};

struct CategoryBytes {
  uint64_t bytes[kCategoryCount] = {};
};

// Simulations (analysis/whatif/whatif.h simulateRequests, each one replay of the device's request
// stream) the OOM verdict runs per device to test the settings its fix would name for a
// fragmentation OOM: the file's own settings (the baseline the exact/estimate label needs),
// expandable_segments:True unless the file has it, then the max_split_size_mb values
// whatIfSplitSizesMb picks, in order, while the budget lasts. Only on a device with a fragmentation
// OOM; 0 = never (the fix untested).
inline constexpr size_t kOomFixReplays = 3;

struct FindingsOptions {
  size_t evidence_stacks = 3;           // stacks listed per finding
  size_t fix_replays = kOomFixReplays;  // OOM verdict: simulations per device to test its fix
  // OOMs (the first ones of the device) whose verdict reads the allocator model's block layout;
  // the facts must hold a layout at each (DeviceSession::requestFindingMoments(layout_ooms)).
  size_t layout_ooms = kLayoutOoms;
};

// Every detector on one device, ordered by severity (high first), then bytes. A pure function of
// the facts; moments the facts lack (not requested, or over a session bound) leave out the
// evidence that needs them.
std::vector<Finding> findFindings(const format::Snapshot& snap, const DeviceFacts& facts,
                                  const FindingsOptions& options = {});
// Convenience: a session for the device with the finding moments, then the detectors.
std::vector<Finding> findFindings(const format::Snapshot& snap, int64_t device,
                                  const FindingsOptions& options = {});

// The incomplete_history rule (detect_history.cc) at warning: the history cannot explain the
// device's state (no trace while blocks are live; the peak before the first entry of a ring of 1
// or a wrapped trace). Its title, or "" when the history can explain the state (complete, or only
// its beginning missing). `blocks` says it next to a layout that is otherwise exact.
std::string historyGap(const format::Snapshot& snap, const DeviceFacts& facts);

// The category rules (docs/findings.md), used by the session to fill AllocFact::category and by
// DeviceFacts::categoryOf for blocks alive before the trace (judged by their stack alone).
void categorizeAllocations(const format::Snapshot& snap, DeviceFacts& facts);
// The same, with the stacks' facts from `cache` (the session's: its phases filled it already).
void categorizeAllocations(DeviceFacts& facts, StackFactsCache& cache);
Category preTraceCategory(const format::Snapshot& snap, format::StackId stack);

// The category of every allocation of one device (the same inference as the detectors'), for
// colouring blocks: `of(alloc_event, stack)` for a live block; blocks alive before the trace
// (alloc_event -1) are judged by their stack alone. Built from eventFacts() (no replay); a caller
// with a session's DeviceFacts uses DeviceFacts::categoryOf instead.
class AllocationCategories {
 public:
  AllocationCategories(const format::Snapshot& snap, int64_t device);
  ~AllocationCategories();
  AllocationCategories(const AllocationCategories&) = delete;
  AllocationCategories& operator=(const AllocationCategories&) = delete;
  Category of(int64_t alloc_event, format::StackId stack);

 private:
  struct Impl;
  const format::Snapshot& snap_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memforensics::analysis
