// analyze.cc: runs the replay per device and gathers what `analyze` prints.
#include "analysis/analyze.h"

#include <algorithm>
#include <unordered_map>

namespace memforensics::analysis {

namespace {

std::vector<StackGroup> topGroups(const format::Snapshot& snap, const replay::DeviceReplayer& r,
                                  const AnalyzeOptions& opt) {
  std::unordered_map<format::StackId, StackGroup> groups;
  r.live().forEach([&](uint64_t, const replay::LiveBlock& b) {
    if (b.pending) return;  // freed by the user already; only the stream keeps it
    StackGroup& g = groups[b.stack];
    g.requested_bytes += b.requested;
    g.block_bytes += b.size;
    g.count += 1;
  });
  std::vector<std::pair<format::StackId, StackGroup>> v(groups.begin(), groups.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    if (a.second.requested_bytes != b.second.requested_bytes) {
      return a.second.requested_bytes > b.second.requested_bytes;
    }
    return a.first < b.first;  // deterministic output
  });
  std::vector<StackGroup> out;
  for (size_t i = 0; i < v.size() && i < opt.top; ++i) {
    StackGroup g = v[i].second;
    g.has_stack = v[i].first != format::kNoStack && v[i].first != format::kEmptyStack;
    g.frames = userFrames(snap, v[i].first, opt.frames_per_group);
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace

AnalysisResult analyzeSnapshot(const format::Snapshot& snap, const AnalyzeOptions& opt) {
  AnalysisResult res;
  res.source_format = std::string(format::sourceFormatName(snap.source));
  res.pickle_protocol = snap.pickle_protocol;
  res.era = snap.traits.era();
  res.input_bytes = snap.input_bytes;
  res.strings = snap.strings.size();
  res.frames = snap.stacks.frameCount();
  res.stacks = snap.stacks.stackCount() - 2;  // ids 0 and 1 are reserved
  res.annotations = snap.annotations.size();
  res.host_trace_events = snap.host_trace_events;
  res.ignored_keys = snap.ignored_keys;
  for (int64_t d : snap.devices()) {
    if (opt.device && *opt.device != d) continue;
    DeviceAnalysis da;
    replay::DeviceReplayer r(snap, d);
    da.summary = replay::summarizeDevice(r);
    for (const auto& seg : snap.segments) da.segments += seg.device == d;
    r.advanceTo(da.summary.peak_requested.event);
    da.live_at_peak = r.live().size();
    da.top_at_peak = topGroups(snap, r, opt);
    for (const auto& o : da.summary.ooms) {
      da.ooms.push_back({o, userFrames(snap, o.stack, opt.frames_per_group)});
    }
    for (size_t k = 0; k < replay::kAnomalyKinds; ++k) {
      const auto& a = da.summary.anomalies[k];
      if (a.count == 0) continue;
      auto kind = static_cast<replay::AnomalyKind>(k);
      da.anomalies.push_back({std::string(replay::anomalyId(kind)), replay::anomalySeverity(kind),
                              std::string(replay::anomalyDescription(kind)), a.count, a.first_event});
    }
    std::stable_sort(da.anomalies.begin(), da.anomalies.end(),
                     [](const auto& a, const auto& b) { return a.severity > b.severity; });
    res.devices.push_back(std::move(da));
  }
  return res;
}

}  // namespace memforensics::analysis
