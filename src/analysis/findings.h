// findings.h: answers, not pictures. Each detector is a pure function of one device's history
// that returns findings with a severity, the bytes involved, the evidence (events, stacks,
// phases) and the fix to try. The rules, thresholds and their reasons are in docs/findings.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/callgraph.h"
#include "analysis/frames.h"
#include "analysis/phases.h"
#include "format/model/snapshot.h"
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

enum class FindingKind : uint8_t {
  OomVerdict,
  Leak,
  ActivationRetention,
  OptimizerStateBloat,
  CacheBloat,
  TemporarySpike,
  PendingFreeRetention,
};
std::string_view findingKindId(FindingKind k);  // snake_case, as in the JSON

enum class FindingSeverity : uint8_t { Info, Warning, High };
std::string_view findingSeverityName(FindingSeverity s);

struct Evidence {
  std::string text;    // one line a person reads
  int64_t event = -1;  // event index on the device, -1 when not tied to one
  int64_t time_us = -1;
  uint64_t bytes = 0;
  std::vector<FrameText> frames;  // innermost user frames of the stack involved, if any
};

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
};

struct CategoryBytes {
  uint64_t bytes[kCategoryCount] = {};
};

struct FindingsOptions {
  size_t evidence_stacks = 3;  // stacks listed per finding
  size_t exact_ooms =
      16;  // OOMs whose verdict uses the exact block layout (each replays the model)
};

// Every detector on one device, ordered by severity (high first), then bytes.
std::vector<Finding> findFindings(const format::Snapshot& snap, int64_t device,
                                  const FindingsOptions& options = {});
// The same, reusing a caller's replayer of that device and its summary (analyze has both: the
// replayer's backward pass and the summary's forward pass are then not done again). The replayer
// is left at an unspecified event.
std::vector<Finding> findFindings(const format::Snapshot& snap, replay::DeviceReplayer& replayer,
                                  const replay::DeviceSummary& summary,
                                  const FindingsOptions& options = {});

// Live requested bytes by category at event `event` (-1 = the start state), for reports.
CategoryBytes liveBytesByCategory(const format::Snapshot& snap, int64_t device, int64_t event);

// The category of every allocation of one device (the same inference as the detectors'), for
// colouring blocks: `of(alloc_event, stack)` for a live block; blocks alive before the trace
// (alloc_event -1) are judged by their stack alone.
class AllocationCategories {
 public:
  AllocationCategories(const format::Snapshot& snap, int64_t device);
  ~AllocationCategories();
  AllocationCategories(const AllocationCategories&) = delete;
  AllocationCategories& operator=(const AllocationCategories&) = delete;
  Category of(int64_t alloc_event, format::StackId stack);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memforensics::analysis
