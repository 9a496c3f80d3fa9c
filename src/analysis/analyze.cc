// analyze.cc: runs the replay per device and gathers what `analyze` prints.
#include "analysis/analyze.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>

namespace memforensics::analysis {

namespace {

std::vector<StackGroup> topGroups(const format::Snapshot& snap,
                                  const U64Map<replay::LiveBlock>& live,
                                  const AnalyzeOptions& opt) {
  struct Group {
    StackGroup g;
    int64_t first_event = INT64_MAX;   // earliest alloc among its blocks (-1: before the trace)
    uint64_t first_addr = UINT64_MAX;  // lowest block address
  };
  std::unordered_map<format::StackId, Group> groups;
  live.forEach([&](uint64_t addr, const replay::LiveBlock& b) {
    if (b.pending) return;  // freed by the user already; only the stream keeps it
    Group& gr = groups[b.stack];
    gr.g.requested_bytes += b.requested;
    gr.g.block_bytes += b.size;
    gr.g.count += 1;
    gr.first_event = std::min(gr.first_event, b.alloc_event);
    gr.first_addr = std::min(gr.first_addr, addr);
  });
  std::vector<std::pair<format::StackId, Group>> v(groups.begin(), groups.end());
  // Ties are broken by content (first allocation, then address), never by stack ids, which depend
  // on the order a reader interned stacks: the same snapshot in any format ranks the same.
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    if (a.second.g.requested_bytes != b.second.g.requested_bytes) {
      return a.second.g.requested_bytes > b.second.g.requested_bytes;
    }
    if (a.second.first_event != b.second.first_event)
      return a.second.first_event < b.second.first_event;
    return a.second.first_addr < b.second.first_addr;
  });
  std::vector<StackGroup> out;
  for (size_t i = 0; i < v.size() && i < opt.top; ++i) {
    StackGroup g = v[i].second.g;
    g.has_stack = v[i].first != format::kNoStack && v[i].first != format::kEmptyStack;
    g.frames = userFrames(snap, v[i].first, opt.frames_per_group);
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace

AnalysisResult analyzeSnapshot(const format::Snapshot& snap, const AnalyzeOptions& opt) {
  AnalysisResult res = analysisHeader(snap);
  for (int64_t d : snap.devices()) {
    if (opt.device && *opt.device != d) continue;
    // One session per device: the backward pass, forward pass 1 (summary), and one forward pass
    // over the moments the top groups, the call graph and the detectors read.
    DeviceSession session(snap, d);
    const int64_t peak = session.facts().summary.peak_requested.event;
    session.requestLive(peak, kMomentPeakRequested);
    if (opt.findings) session.requestFindingMoments(kLayoutOoms);
    res.devices.push_back(analyzeDevice(snap, session.take(), opt));
  }
  return res;
}

AnalysisResult analysisHeader(const format::Snapshot& snap) {
  AnalysisResult res;
  res.source_format = std::string(format::sourceFormatName(snap.source));
  res.pickle_protocol = snap.pickle_protocol;
  // A live capture was written by memforensics, not by some PyTorch: it has no era to infer.
  res.era = snap.live_capture ? "none (live capture)"
            : snap.source == format::SourceFormat::ProfilerTrace ||
                    snap.source == format::SourceFormat::MemoryTimeline
                ? "none (torch.profiler output)"
                : snap.traits.era();
  res.input_bytes = snap.input_bytes;
  res.strings = snap.strings.size();
  res.frames = snap.stacks.frameCount();
  res.stacks = snap.stacks.stackCount() - 2;  // ids 0 and 1 are reserved
  res.annotations = snap.annotations.size();
  res.host_trace_events = snap.host_trace_events;
  res.ignored_keys = snap.ignored_keys;
  res.origin = snap.origin;
  res.live_capture = snap.live_capture;
  res.warnings = snap.load_warnings;
  return res;
}

DeviceAnalysis analyzeDevice(const format::Snapshot& snap, DeviceFacts facts,
                             const AnalyzeOptions& opt) {
  DeviceAnalysis da;
  da.summary = facts.summary;
  da.segments = facts.segments;
  if (const MomentFacts* m = facts.at(da.summary.peak_requested.event); m && m->has_live) {
    da.live_at_peak = m->live.size();
    da.top_at_peak = topGroups(snap, m->live, opt);
    if (opt.top_frames > 0) {
      da.has_frames = true;
      da.frames_at_peak = buildCallGraph(snap, m->live, opt.top_frames);
    }
  }
  if (opt.findings) da.findings = findFindings(snap, facts);
  {
    for (const auto& o : da.summary.ooms) {
      da.ooms.push_back({o, userFrames(snap, o.stack, opt.frames_per_group)});
    }
    for (size_t k = 0; k < replay::kAnomalyKinds; ++k) {
      const auto& a = da.summary.anomalies[k];
      if (a.count == 0) continue;
      auto kind = static_cast<replay::AnomalyKind>(k);
      da.anomalies.push_back({std::string(replay::anomalyId(kind)), replay::anomalySeverity(kind),
                              std::string(replay::anomalyDescription(kind)), a.count,
                              a.first_event});
    }
    std::stable_sort(da.anomalies.begin(), da.anomalies.end(),
                     [](const auto& a, const auto& b) { return a.severity > b.severity; });
  }
  da.model = facts.model;
  da.passes = facts.passes;
  return da;
}

}  // namespace memforensics::analysis
