// whatif_data.cc: see whatif_data.h.
#include "report/html/whatif_data.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/format_bytes.h"

namespace memforensics::report {

namespace {

using analysis::kWhatIfUnlimited;
using format::Action;
using nlohmann::json;
constexpr uint64_t kMiB = 1048576;

std::string capText(uint64_t c) {
  return c == kWhatIfUnlimited ? std::string("no limit") : formatBytesShort(c);
}

struct Spec {
  std::string label, why, cli;
  std::vector<std::pair<std::string, std::string>> sets;
  uint64_t capacity = kWhatIfUnlimited;
  bool baseline = false;
};

std::string plural(uint64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// One sentence for a row (the rows' figures say the rest).
std::string answerOf(const WhatIfRow& r, const analysis::DeviceWhatIf& f) {
  const auto& s = r.sim;
  if (r.baseline) {
    std::string a = f.recorded_segment_allocs == 0 && f.recorded_peak_reserved == 0
                        ? "the file records no segment events: peak reserved " +
                              formatBytes(s.peak_reserved) + " is the simulation's own"
                    : s.peak_reserved == f.recorded_peak_reserved
                        ? "reproduces the file's peak reserved"
                        : "peak reserved " + formatBytes(s.peak_reserved) + " where the file has " +
                              formatBytes(f.recorded_peak_reserved);
    if (f.recorded_ooms > 0)
      a += s.oom_count == f.recorded_ooms ? " and its " + plural(f.recorded_ooms, "OOM", "OOMs")
                                          : "; " + plural(s.oom_count, "OOM", "OOMs") +
                                                " where the "
                                                "file has " +
                                                std::to_string(f.recorded_ooms);
    return a;
  }
  std::string first_why;
  for (const auto& o : s.ooms) {
    if (o.recorded && !o.avoided) {
      first_why = o.why;
      break;
    }
  }
  if (first_why.empty()) {
    for (const auto& o : s.ooms) {
      if (!o.recorded) {
        first_why = o.why;
        break;
      }
    }
  }
  std::string a;
  if (f.recorded_ooms > 0) {
    if (r.recorded_not_avoided == 0) {
      a = f.recorded_ooms == 1 ? "avoids the OOM"
                               : "avoids all " + std::to_string(f.recorded_ooms) + " OOMs";
    } else if (r.recorded_avoided == 0) {
      a = "does not avoid the OOM";
    } else {
      a = "avoids " + std::to_string(r.recorded_avoided) + " of " +
          std::to_string(r.recorded_avoided + r.recorded_not_avoided) + " OOMs";
    }
  } else {
    a = s.oom_count == 0 ? "fits: no OOM" : "runs out of memory";
  }
  if (r.new_ooms > 0)
    a += (f.recorded_ooms > 0 ? "; " : ": ") + plural(r.new_ooms, "new OOM", "new OOMs");
  if (!first_why.empty()) a += " (" + first_why + ")";
  return a;
}

}  // namespace

std::optional<int64_t> whatIfFocusDevice(const format::Snapshot& snap,
                                         std::optional<int64_t> only) {
  std::optional<int64_t> first;
  for (size_t d = 0; d < snap.traceCount(); ++d) {
    const auto dev = static_cast<int64_t>(d);
    if (only && *only != dev) continue;
    auto ev = snap.trace(d);
    if (ev.empty()) continue;
    if (!first) first = dev;
    if (std::any_of(ev.begin(), ev.end(), [](const auto& e) { return e.action == Action::Oom; }))
      return dev;
  }
  return first;
}

WhatIfPanel buildWhatIfPanel(const format::Snapshot& snap, std::optional<int64_t> device,
                             const std::string& file, const std::string& focus_reason,
                             std::span<const analysis::DeviceAnalysis> analysed) {
  WhatIfPanel p;
  p.file = file;
  p.limits =
      "a what-if replays the program's own requests (sizes, order, lifetimes); it cannot change "
      "what the program asked for (no smaller batch), and after an OOM it replays what the program "
      "did next as recorded";
  if (!snap.has_segment_info) {
    p.absent_reason = "a what-if needs an allocator trace; a profiler trace has none";
    return p;
  }
  auto focus = device ? device : whatIfFocusDevice(snap, std::nullopt);
  if (!focus || *focus < 0 || static_cast<size_t>(*focus) >= snap.traceCount() ||
      snap.trace(static_cast<size_t>(*focus)).empty()) {
    p.absent_reason = (focus ? "device " + std::to_string(*focus) : std::string("no device")) +
                      " has no trace: a what-if replays the recorded requests";
    return p;
  }
  const analysis::TraceInput trace = analysis::traceInput(snap, static_cast<size_t>(*focus));
  p.present = true;
  p.device = *focus;
  const replay::DeviceSummary* known = nullptr;
  for (const analysis::DeviceAnalysis& d : analysed) {
    if (d.summary.device == *focus) known = &d.summary;
  }
  p.facts =
      known != nullptr ? analysis::recordedFacts(trace, *known) : analysis::recordedFacts(trace);
  p.focus_rule = !focus_reason.empty()       ? focus_reason
                 : p.facts.recorded_ooms > 0 ? "the first device with a recorded OOM"
                                             : "the first device with a trace (no OOM recorded)";
  p.implied_capacity = analysis::impliedCapacity(trace);
  const replay::AllocConf base = replay::allocConfOf(snap);
  const uint64_t cap = p.implied_capacity;

  std::vector<Spec> specs;
  specs.push_back({"the file's own settings",
                   cap == kWhatIfUnlimited
                       ? "the baseline: no OOM recorded, so no card size is implied"
                       : "the baseline, on the card the OOM implies (reserved + device free)",
                   "",
                   {},
                   cap,
                   true});
  const bool exp = base.expandable_segments;
  specs.push_back({std::string("expandable_segments:") + (exp ? "False" : "True"),
                   exp ? "the file has expandable segments: without them"
                       : "segments grow in pages instead of one cudaMalloc per segment",
                   std::string("--set expandable_segments=") + (exp ? "False" : "True"),
                   {{"expandable_segments", exp ? "False" : "True"}},
                   cap});
  const auto splits = analysis::whatIfSplitSizesMb(trace, base);
  for (uint64_t v : splits) {
    specs.push_back({"max_split_size_mb:" + std::to_string(v),
                     "cached blocks of " + std::to_string(v) +
                         " MiB or more are not split for smaller requests (" +
                         (v == splits.front() ? "the largest power of two of MiB not above the "
                                                "file's largest request"
                                              : "a quarter of that") +
                         ")",
                     "--set max_split_size_mb=" + std::to_string(v),
                     {{"max_split_size_mb", std::to_string(v)}},
                     cap});
  }
  if (splits.empty())
    p.notes.push_back(
        "max_split_size_mb not tried: no request of 32 MiB or more (every block is below what it "
        "could keep unsplit)");
  if (cap == kWhatIfUnlimited) {
    p.notes.push_back(
        "garbage_collection_threshold not tried: it acts against a card size (CCA: the "
        "per-process memory fraction), and without an OOM the file implies none");
  } else if (base.gc_threshold > 0.0) {
    p.notes.push_back("garbage_collection_threshold not tried: the file already sets it");
  } else {
    char v[16];
    std::snprintf(v, sizeof v, "%g", kReportGcThreshold);
    specs.push_back({std::string("garbage_collection_threshold:") + v,
                     "cached segments unused the longest go back above this share of the card",
                     std::string("--set garbage_collection_threshold=") + v,
                     {{"garbage_collection_threshold", v}},
                     cap});
  }
  // Another card, from the baseline's own figures.
  const analysis::SimResult base_sim = analysis::simulateRequests(trace, base, cap);
  if (base_sim.oom_count > 0) {
    specs.push_back({"a card without a limit",
                     "its peak reserved is the card this run needs under the file's settings",
                     "--capacity 1PiB",
                     {},
                     kWhatIfUnlimited});
  } else if (base_sim.peak_reserved > 0) {
    uint64_t c = base_sim.peak_allocated + (base_sim.peak_reserved - base_sim.peak_allocated) / 2;
    c = (c + kMiB - 1) / kMiB * kMiB;
    if (c >= base_sim.peak_reserved) c = base_sim.peak_reserved / 10 * 9 / kMiB * kMiB;
    if (c > 0) {
      specs.push_back({"a smaller card: " + formatBytesShort(c),
                       "between the baseline's peak allocated and peak reserved: is releasing "
                       "the cache enough?",
                       "--capacity " + std::to_string(c) + "B",
                       {},
                       c});
    }
  }
  if (specs.size() > kReportWhatIfRuns) specs.resize(kReportWhatIfRuns);

  for (const Spec& sp : specs) {
    WhatIfRow row;
    row.label = sp.label;
    row.why = sp.why;
    row.cli = sp.cli;
    row.baseline = sp.baseline;
    replay::AllocConf s = base;
    for (const auto& [k, v] : sp.sets) replay::applyAllocSetting(s, k, v);  // known-good values
    row.settings = replay::describeAllocConf(s);
    row.sim = sp.baseline && sp.capacity == cap ? base_sim
                                                : analysis::simulateRequests(trace, s, sp.capacity);
    row.recorded_avoided = row.sim.recorded_avoided;
    row.recorded_not_avoided = row.sim.recorded_failed;
    row.new_ooms = row.sim.oom_count - row.sim.recorded_failed;
    analysis::DeviceWhatIf with = p.facts;
    with.baseline = base_sim;
    row.estimate_reason = analysis::whatIfEstimateReason(with, s);
    row.answer = answerOf(row, p.facts);
    if (row.sim.ooms.size() > kReportWhatIfOoms) row.sim.ooms.resize(kReportWhatIfOoms);
    p.rows.push_back(std::move(row));
  }
  return p;
}

json whatIfPanelJson(const WhatIfPanel& p) {
  json j;
  j["present"] = p.present;
  if (!p.present) {
    j["absent_reason"] = p.absent_reason;
    return j;
  }
  auto capJson = [](uint64_t c) { return c == kWhatIfUnlimited ? json(nullptr) : json(c); };
  j["device"] = p.device;
  j["focus_rule"] = p.focus_rule;
  j["file"] = p.file;
  j["recorded_peak_reserved_bytes"] = p.facts.recorded_peak_reserved;
  j["recorded_oom_count"] = p.facts.recorded_ooms;
  j["complete_history"] = p.facts.complete_history;
  j["start_blocks"] = p.facts.start_blocks;
  j["implied_capacity_bytes"] = capJson(p.implied_capacity);
  j["max_runs"] = kReportWhatIfRuns;
  j["limits"] = p.limits;
  j["notes"] = p.notes;
  json rows = json::array();
  for (const auto& r : p.rows) {
    const auto& s = r.sim;
    json ooms = json::array();
    for (const auto& o : s.ooms) {
      ooms.push_back({{"event", o.event},
                      {"recorded", o.recorded},
                      {"avoided", o.avoided},
                      {"requested_bytes", o.requested},
                      {"stream", o.stream},
                      {"line", o.line},
                      {"why", o.why}});
    }
    rows.push_back({{"label", r.label},
                    {"why", r.why},
                    {"cli", r.cli},
                    {"settings", r.settings},
                    {"baseline", r.baseline},
                    {"capacity_bytes", capJson(s.capacity)},
                    {"capacity_text", capText(s.capacity)},
                    {"peak_reserved_bytes", s.peak_reserved},
                    {"peak_allocated_bytes", s.peak_allocated},
                    {"allocated_at_peak_reserved_bytes", s.allocated_at_peak_reserved},
                    {"oom_count", s.oom_count},
                    {"recorded_avoided", r.recorded_avoided},
                    {"recorded_not_avoided", r.recorded_not_avoided},
                    {"new_ooms", r.new_ooms},
                    {"answer", r.answer},
                    {"exact", r.estimate_reason.empty()},
                    {"estimate_reason", r.estimate_reason},
                    {"ooms", ooms}});
  }
  j["rows"] = rows;
  return j;
}

}  // namespace memforensics::report
