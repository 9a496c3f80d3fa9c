// whatif_data.h: the report's what-if panel (issue 14 part 5, docs/whatif.md "In the report").
//
// A pure function of the snapshot and the what-if API (analysis/whatif/whatif.h): on the focus
// device (analysis/findings/headline.h: the device with the OOM, else ...), the answers for the
// common settings, each one simulation: the file's own settings (the baseline), expandable_segments
// flipped, max_split_size_mb at one or two values derived from the file's largest request,
// garbage_collection_threshold:0.8 where a card size is known, and another card: without a limit
// when the baseline runs out of memory (the peak reserved it reaches is the card it needs), a
// smaller one (between the baseline's peak allocated and peak reserved) when it does not. At most
// kReportWhatIfRuns simulations, whatever the file. The page draws it with viz/whatif.js.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/whatif/whatif.h"
#include "format/model/snapshot.h"

namespace memforensics::report {

// Simulations the report runs for its what-if panel (the baseline included): each replays the
// focus device's whole trace once.
inline constexpr size_t kReportWhatIfRuns = 8;
// OOMs listed per row (the count is always complete).
inline constexpr size_t kReportWhatIfOoms = 3;
// The garbage_collection_threshold the panel tries (PyTorch's documentation's example value).
inline constexpr double kReportGcThreshold = 0.8;

struct WhatIfRow {
  std::string label;     // "expandable_segments:True", "card without a limit", ...
  std::string why;       // why this row (how the value was derived)
  std::string cli;       // the whatif options that give it ("--set max_split_size_mb=64")
  std::string settings;  // describeSettings
  bool baseline = false;
  analysis::SimResult sim;  // ooms cut to kReportWhatIfOoms
  uint64_t recorded_avoided = 0, recorded_not_avoided = 0, new_ooms = 0;
  std::string answer;           // one sentence
  std::string estimate_reason;  // "" = exact (analysis::whatIfEstimateReason)
};

struct WhatIfPanel {
  bool present = false;
  std::string absent_reason;  // when not present
  int64_t device = -1;
  std::string focus_rule;        // why this device
  std::string file;              // for the command line the page shows
  analysis::DeviceWhatIf facts;  // recorded figures (baseline / whatif left empty)
  uint64_t implied_capacity = analysis::kWhatIfUnlimited;
  std::vector<WhatIfRow> rows;     // at most kReportWhatIfRuns, the baseline first
  std::vector<std::string> notes;  // settings not tried, and why
  std::string limits;              // what a what-if cannot change
};

// Without an analysis (tests): among the devices with a trace (only `only` when given), the first
// with a recorded OOM, else the first; nullopt when none has a trace. `report` takes the focus
// device of analysis/findings/headline.h instead (the one "OOM first" rule).
std::optional<int64_t> whatIfFocusDevice(const format::Snapshot& snap, std::optional<int64_t> only);
// The max_split_size_mb values the panel tries: analysis::whatIfSplitSizesMb (shared with the OOM
// verdict's tested fix).
using analysis::whatIfSplitSizesMb;

// The panel of `device` (the focus device of analysis/findings/headline.h buildHeadline, said by
// `focus_reason`); without one, of whatIfFocusDevice(snap, nullopt). A device without a trace (or
// a file without allocator trace) gives an absent panel with its reason. `analysed`: the devices
// report analysed (AnalysisResult::devices); the focus device's summary, when among them, says
// what its replay can vouch for without replaying it once more.
WhatIfPanel buildWhatIfPanel(const format::Snapshot& snap, std::optional<int64_t> device,
                             const std::string& file, const std::string& focus_reason = "",
                             std::span<const analysis::DeviceAnalysis> analysed = {});

// The panel as the page reads it ("whatif" in the report's data, docs/report.md).
nlohmann::json whatIfPanelJson(const WhatIfPanel& p);

}  // namespace memforensics::report
