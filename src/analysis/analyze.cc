// analyze.cc: runs the replay per device and gathers what `analyze` prints.
#include "analysis/analyze.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "analysis/compare/compare.h"
#include "analysis/findings/cross_device.h"
#include "analysis/frames/frame_class.h"
#include "analysis/frames/stack_groups.h"
#include "analysis/session/timeline.h"
#include "common/parallel.h"
#include "common/saturating.h"
#include "replay/alloc_conf.h"

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

// The allocations of the device by their innermost user line (see LineSizes): trace allocations
// from the allocation table, blocks alive before the trace from the live set at the requested
// peak (when the facts hold it). One userFrameIds call per distinct stack; the heaviest
// kLineSizesPerDevice lines are kept.
std::vector<LineSizes> lineSizes(const format::Snapshot& snap, const DeviceFacts& facts,
                                 const MomentFacts* peak, size_t frames_per_line,
                                 const FrozenStackFacts* frozen) {
  struct Acc {
    uint64_t allocs = 0, total = 0, max = 0, live = 0;
    format::StackId stack = format::kNoStack;  // the first stack seen for the line
  };
  U64Map<int64_t> line_of_stack;  // stack id -> frame id of its innermost user line, -1 = none
  StackFactsCache frame_kinds(snap, frozen);  // each frame classified once per device
  U64Map<Acc> by_line;                        // frame id -> sizes
  auto lineOf = [&](format::StackId st) -> int64_t {
    if (const int64_t* l = line_of_stack.find(st)) return *l;
    auto ids = userFrameIds(frame_kinds, st, 1);
    int64_t l = ids.empty() ? -1 : static_cast<int64_t>(ids.front());
    line_of_stack.insert(st, l);
    return l;
  };
  auto add = [&](format::StackId st, uint64_t bytes, bool alloc, bool live) {
    if (st == format::kNoStack || st == format::kEmptyStack) return;
    const int64_t l = lineOf(st);
    if (l < 0) return;
    Acc* a = by_line.find(static_cast<uint64_t>(l));
    if (a == nullptr) {
      by_line.insert(static_cast<uint64_t>(l), Acc{});
      a = by_line.find(static_cast<uint64_t>(l));
      a->stack = st;
    }
    if (alloc) {
      ++a->allocs;
      a->total = addSat(a->total, bytes);
      a->max = std::max(a->max, bytes);
    }
    if (live) a->live = addSat(a->live, bytes);
  };
  for (const AllocFact& a : facts.allocs) add(a.stack, a.requested, true, false);
  if (peak != nullptr && peak->has_live) {
    peak->live.forEach([&](uint64_t, const replay::LiveBlock& b) {
      if (!b.pending) add(b.stack, b.requested, b.alloc_event < 0, true);
    });
  }
  std::vector<std::pair<uint64_t, Acc>> rows;
  by_line.forEach([&](uint64_t line, const Acc& acc) { rows.emplace_back(line, acc); });
  auto heavier = [](const auto& x, const auto& y) {
    if (x.second.live != y.second.live) return x.second.live > y.second.live;
    if (x.second.total != y.second.total) return x.second.total > y.second.total;
    return x.first < y.first;
  };
  const size_t keep = std::min(rows.size(), kLineSizesPerDevice);
  std::partial_sort(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(keep), rows.end(),
                    heavier);
  rows.resize(keep);
  std::vector<LineSizes> out;
  out.reserve(rows.size());
  for (const auto& [line, acc] : rows) {
    LineSizes ls;
    ls.frames = userFrames(snap, acc.stack, std::max<size_t>(frames_per_line, 1));
    ls.allocs = acc.allocs;
    ls.total_bytes = acc.total;
    ls.max_bytes = acc.max;
    ls.live_at_peak_bytes = acc.live;
    out.push_back(std::move(ls));
  }
  return out;
}

// `b - a`, counter by counter (a is an earlier reading of the same counters).
replay::PassStats passesSince(const replay::PassStats& a, const replay::PassStats& b) {
  return {b.backward - a.backward,
          b.forward - a.forward,
          b.events_stepped - a.events_stepped,
          b.model_seeds - a.model_seeds,
          b.model_forward - a.model_forward,
          b.model_events_stepped - a.model_events_stepped};
}

void addPasses(replay::PassStats& to, const replay::PassStats& d) {
  to.backward += d.backward;
  to.forward += d.forward;
  to.events_stepped += d.events_stepped;
  to.model_seeds += d.model_seeds;
  to.model_forward += d.model_forward;
  to.model_events_stepped += d.model_events_stepped;
}

// Runs task(i) for every index on opt.threads threads (common/parallel.h) and moves each task's
// pass counters (replay/pass_stats.h counts per thread) from the thread it ran on to the calling
// thread's, per device (devices[i]), as a serial loop would have counted them. A task that ran on
// the caller gives its counts back first, so none is counted twice.
template <class Task>
void forEachDevice(const std::vector<int64_t>& devices, size_t threads, Task&& task) {
  std::vector<replay::PassStats> passes(devices.size());
  parallelFor(devices.size(), threads, [&](size_t i) {
    replay::PassStats& counters = replay::passStats()[devices[i]];
    const replay::PassStats before = counters;
    task(i);
    passes[i] = passesSince(before, counters);
    counters = before;
  });
  for (size_t i = 0; i < devices.size(); ++i) addPasses(replay::passStats()[devices[i]], passes[i]);
}

// forEachDevice for parallelForTwoRounds: first(i) and second(i) run on one thread, whose counters
// of devices[i] are read before first(i) and put back after second(i).
template <class First, class Between, class Second>
void forEachDeviceTwoRounds(const std::vector<int64_t>& devices, size_t threads, First&& first,
                            Between&& between, Second&& second) {
  std::vector<replay::PassStats> before(devices.size()), passes(devices.size());
  parallelForTwoRounds(
      devices.size(), threads,
      [&](size_t i) {
        before[i] = replay::passStats()[devices[i]];
        first(i);
      },
      [&] { between(); },
      [&](size_t i) {
        second(i);
        replay::PassStats& counters = replay::passStats()[devices[i]];
        passes[i] = passesSince(before[i], counters);
        counters = before[i];
      });
  for (size_t i = 0; i < devices.size(); ++i) addPasses(replay::passStats()[devices[i]], passes[i]);
}

}  // namespace

std::vector<int64_t> selectedDevices(const format::Snapshot& snap, std::optional<int64_t> device) {
  std::vector<int64_t> devices;
  for (int64_t d : snap.devices()) {
    if (!device || *device == d) devices.push_back(d);
  }
  return devices;
}

size_t sessionThreadsFor(const format::Snapshot& snap, const std::vector<int64_t>& devices,
                         size_t threads) {
  uint64_t largest = 1;
  for (int64_t d : devices) {
    if (d >= 0 && static_cast<uint64_t>(d) < snap.traceCount())
      largest = std::max<uint64_t>(largest, snap.traceSize(static_cast<size_t>(d)));
  }
  return sessionThreads(threads, devices.size(), largest);
}

std::vector<DeviceFacts> visitSessions(
    const format::Snapshot& snap, const std::vector<int64_t>& devices,
    const SessionOptions& session_options, size_t threads,
    const std::function<void(const std::vector<const DeviceFacts*>&)>& between,
    const std::function<void(size_t, DeviceSession&)>& request,
    const std::function<void(size_t, DeviceFacts&)>& after) {
  std::vector<std::unique_ptr<DeviceSession>> sessions(devices.size());
  std::vector<DeviceFacts> facts(devices.size());
  SessionOptions so = session_options;
  so.checkpoints = false;  // every device's session lives until its visit (SessionOptions)
  forEachDeviceTwoRounds(
      devices, sessionThreadsFor(snap, devices, threads),
      [&](size_t i) { sessions[i] = std::make_unique<DeviceSession>(snap, devices[i], so); },
      [&] {
        std::vector<const DeviceFacts*> pass1;
        pass1.reserve(sessions.size());
        for (const auto& s : sessions) pass1.push_back(&s->facts());
        between(pass1);
      },
      [&](size_t i) {
        request(i, *sessions[i]);
        sessions[i]->visit();
        facts[i] = sessions[i]->take();
        sessions[i].reset();
        after(i, facts[i]);
      });
  return facts;
}

TimelineResult computeTimelineOn(const format::Snapshot& snap, const TimelineOptions& opt,
                                 size_t threads) {
  const std::vector<int64_t> devices = selectedDevices(snap, opt.device);
  TimelineResult res;
  res.devices.resize(devices.size());
  SessionOptions so;
  so.series = true;
  forEachDevice(devices, sessionThreadsFor(snap, devices, threads), [&](size_t i) {
    DeviceSession session(snap, devices[i], so);  // the backward pass and forward pass 1
    res.devices[i] = timelineOf(snap, session.take(), opt);
  });
  return res;
}

void requestProfilePeaks(DeviceSession& session) {
  const auto& s = session.facts().summary;
  for (size_t k = 0; k < kPeakKinds; ++k)
    session.requestLive(summaryPeak(s, static_cast<PeakKind>(k)).event, kPeakReasons[k]);
}

bool profileFactsComplete(const DeviceFacts& facts) {
  for (const MomentFacts& m : facts.moments) {
    if (m.over_budget) return false;
  }
  for (size_t k = 0; k < kPeakKinds; ++k) {
    const MomentFacts* m = facts.at(summaryPeak(facts.summary, static_cast<PeakKind>(k)).event);
    if (m == nullptr || !m->has_live) return false;
  }
  return true;
}

RunProfile finishProfile(const format::Snapshot& snap, std::vector<DeviceProfile> devices,
                         std::vector<DeviceAnalysis> analyses) {
  RunProfile out;
  out.devices = std::move(devices);
  AnalysisResult job;
  job.devices = std::move(analyses);
  finishAnalysis(snap, job);
  for (const Finding& f : job.job_findings) out.job_findings.push_back({f.device, findingRef(f)});
  return out;
}

std::vector<int64_t> findingLiveEvents(const DeviceFacts& f) {
  std::vector<int64_t> out;
  for (const FindingMoment& m : findingMoments(f)) out.push_back(m.event);
  return out;
}

void dropLiveSets(DeviceFacts& facts, const std::vector<int64_t>& events) {
  for (int64_t e : events) {
    auto it = std::lower_bound(facts.moments.begin(), facts.moments.end(), e,
                               [](const MomentFacts& m, int64_t ev) { return m.event < ev; });
    if (it == facts.moments.end() || it->event != e) continue;
    if (!it->has_layout) {
      facts.moments.erase(it);
    } else {
      it->has_live = false;
      it->live = U64Map<replay::LiveBlock>();
    }
  }
}

RunProfile profileSnapshotOn(const format::Snapshot& snap, const ProfileOptions& opt,
                             size_t threads) {
  const std::vector<int64_t> devices = selectedDevices(snap, opt.device);
  std::vector<DeviceProfile> profiles(devices.size());
  std::vector<DeviceAnalysis> analyses(devices.size());
  forEachDevice(devices, sessionThreadsFor(snap, devices, threads), [&](size_t i) {
    DeviceSession session(snap, devices[i]);
    requestProfilePeaks(session);
    session.requestFindingMoments(kLayoutOoms);
    profiles[i] = profileDevice(snap, session.take(), &analyses[i]);
  });
  return finishProfile(snap, std::move(profiles), std::move(analyses));
}

AnalysisResult analyzeSnapshot(const format::Snapshot& snap, const AnalyzeOptions& opt) {
  AnalysisResult res = analysisHeader(snap);
  const std::vector<int64_t> devices = selectedDevices(snap, opt.device);
  // One device per task, each into its own slot, so the devices stay in snap.devices() order
  // whatever the timing; each task reads the const Snapshot only, and its session lives and dies
  // on the thread that runs the task.
  const size_t threads = sessionThreadsFor(snap, devices, opt.threads);
  std::vector<DeviceAnalysis> slots(devices.size());
  // Several devices: their frames and stacks are classified once, for all of them (devices of one
  // process share most of their stacks), instead of once per device and twice in each.
  FrozenStackFacts frozen;
  AnalyzeOptions device_opt = opt;
  SessionOptions session_opt;
  if (devices.size() > 1) {
    frozen = freezeStackFacts(snap);
    device_opt.stack_facts = &frozen;
    session_opt.stack_facts = &frozen;
  }
  forEachDevice(devices, threads, [&](size_t i) {
    // One session per device: the backward pass, forward pass 1 (summary), and one forward pass
    // over the moments the top groups, the call graph and the detectors read. A deferred
    // snapshot's device is decoded by the session, held by its facts for the task's life.
    DeviceSession session(snap, devices[i], session_opt);
    const int64_t peak = session.facts().summary.peak_requested.event;
    session.requestLive(peak, kMomentPeakRequested);
    if (opt.findings) session.requestFindingMoments(kLayoutOoms);
    slots[i] = analyzeDevice(snap, session.take(), device_opt);
  });
  res.devices = std::move(slots);
  const std::vector<int64_t> present = snap.devices();
  for (size_t d = 0; d < snap.traceCount(); ++d) {
    const auto dev = static_cast<int64_t>(d);
    if (snap.traceSize(d) != 0 || (opt.device && *opt.device != dev)) continue;
    if (!std::binary_search(present.begin(), present.end(), dev)) res.empty_devices.push_back(dev);
  }
  finishAnalysis(snap, res, opt);
  return res;
}

size_t sessionThreads(size_t threads, size_t devices, uint64_t largest_events) {
  const uint64_t cap = kMaxSessionEventsInFlight / std::max<uint64_t>(1, largest_events);
  return std::max<size_t>(1, std::min<uint64_t>(workerCount(threads, devices), cap));
}

std::vector<DeviceAnalysis> analyzeDevices(const format::Snapshot& snap,
                                           std::vector<DeviceFacts> facts,
                                           const AnalyzeOptions& opt) {
  std::vector<int64_t> devices;
  devices.reserve(facts.size());
  for (const DeviceFacts& f : facts) devices.push_back(f.device);
  std::vector<DeviceAnalysis> out(facts.size());
  forEachDevice(devices, opt.threads, [&](size_t i) {
    out[i] = analyzeDevice(snap, std::move(facts[i]), opt);
    facts[i] = DeviceFacts{};  // its live sets and layouts are no longer needed
  });
  return out;
}

void finishAnalysis(const format::Snapshot& snap, AnalysisResult& result,
                    const AnalyzeOptions& options) {
  if (!options.findings) return;
  JobFindings job = crossDeviceFindings(snap, result);
  result.job_findings = std::move(job.findings);
  if (job.even_split) addEvenSplit(*job.even_split, result);
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
  for (const std::string& m : replay::refusedFileSettings(snap.settings))
    res.warnings.push_back("allocator_settings " + m +
                           ": impossible, ignored (the default "
                           "stands in for it in every replay)");
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
    for (size_t k = 0; k < da.summary.ooms.size() && k < kOomsListed; ++k) {
      const replay::OomEvent& o = da.summary.ooms[k];
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
  da.line_sizes = lineSizes(snap, facts, facts.at(da.summary.peak_requested.event),
                            opt.frames_per_group, opt.stack_facts);
  da.model = facts.model;
  da.passes = facts.passes;
  return da;
}

}  // namespace memforensics::analysis
