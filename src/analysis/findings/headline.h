// headline.h: what the first screen says, across devices: which device every command opens on
// (the focus device) and one line per OOM or high finding. The one home of the "OOM first" rule:
// analyze, blocks, timeline and the report all take the focus device from here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/findings/findings.h"
#include "format/model/snapshot.h"

namespace memforensics::analysis {

struct HeadlineItem {
  int64_t device = -1;
  FindingKind kind = FindingKind::OomVerdict;
  FindingSeverity severity = FindingSeverity::High;
  std::string title;
  uint64_t bytes = 0;
  std::vector<FrameText> where;  // the line to change
};

struct Headline {
  int64_t focus_device = -1;  // -1: the result has no device
  std::string focus_reason;   // e.g. "the OOM is on cuda:1"
  std::vector<HeadlineItem> items;
  size_t other_warnings = 0;  // warning findings not among the items (listed per device)
};

// The focus device: the device with an OOM (several: the earliest OOM), else the device of the
// most severe finding (severity, then bytes; job findings included), else the first device.
// Items: every OOM verdict, every high finding (job findings included) and every incomplete-history
// warning (a file that cannot explain an OOM says so first); OOM verdicts first, then by
// severity, then bytes; ties keep device order. `warnings`: the other warnings, counted.
Headline buildHeadline(const AnalysisResult& result);

// Whether `f` is a headline item: an OOM verdict, a high finding, an incomplete-history warning.
bool isHeadlineItem(const Finding& f);

// The devices of `result` in the order a report lists them: the focus device first, the others
// in their order (indices into result.devices).
std::vector<size_t> deviceOrder(const AnalysisResult& result, const Headline& headline);

// "cuda:1 (the OOM is on cuda:1; --device N for another)": the line a command that defaulted to
// the focus device prints. `reason` as in Headline::focus_reason.
std::string focusNote(int64_t device, const std::string& reason);

// The same rule for commands that do not run the detectors (blocks, timeline): the device whose
// trace holds the earliest OOM, else std::nullopt (the caller keeps its own default).
std::optional<int64_t> oomFocusDevice(const format::Snapshot& snap);

}  // namespace memforensics::analysis
