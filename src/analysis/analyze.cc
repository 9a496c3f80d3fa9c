// analyze.cc: runs the replay per device and gathers what `analyze` prints.
#include "analysis/analyze.h"

#include <algorithm>
#include <cstdint>

#include "analysis/stack_groups.h"

namespace memforensics::analysis {

namespace {

// The largest groups of live (non-pending) blocks by stack, with the one group-by-stack rule
// (stack_groups.h: identical-looking stacks merge; ranked by bytes, then has-stack, then frame
// text, never by stack ids, so the same snapshot in any format ranks the same).
std::vector<StackGroup> topGroups(const format::Snapshot& snap,
                                  const U64Map<replay::LiveBlock>& live,
                                  const AnalyzeOptions& opt) {
  std::vector<StackGroup> out;
  for (LiveGroup& lg :
       groupLiveByStack(snap, live, PendingBlocks::Exclude, {opt.frames_per_group, opt.top})) {
    StackGroup g;
    g.requested_bytes = lg.requested_bytes;
    g.block_bytes = lg.block_bytes;
    g.count = lg.count;
    g.has_stack = lg.has_stack;
    g.frames = std::move(lg.frames);
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
