// parallel_analysis_test.cc: analyzeSnapshot gives the same result on any number of threads
// (AnalyzeOptions::threads, common/parallel.h): the rendered JSON and text compared as strings,
// and the pass counters (replay/pass_stats.h) of the calling thread, on a real 4-device scenario
// and a synthetic 64-device job.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/compare/compare.h"
#include "analysis/session/timeline.h"
#include "fixtures/model_builder.h"
#include "format/load/load.h"
#include "replay/pass_stats.h"
#include "report/render.h"
#include "report/render_compare.h"
#include "report/render_timeline.h"

namespace memforensics::analysis {
namespace {

using memforensics::testing::Frames;
using memforensics::testing::ModelBuilder;

constexpr uint64_t kBase = 0x7f0000000000ULL;
constexpr uint64_t kMiB = 1048576;

struct Outcome {
  std::string json, text, passes;
  size_t devices = 0, job_findings = 0;
};

Outcome analyzeWith(const format::Snapshot& snap, size_t threads, size_t top_frames = 0) {
  replay::resetPassStats();
  AnalyzeOptions opt;
  opt.threads = threads;
  opt.top_frames = top_frames;
  AnalysisResult r = analyzeSnapshot(snap, opt);
  Outcome out;
  out.passes = replay::describePassStats();
  out.json = report::renderJsonString(r);
  std::ostringstream text;
  report::renderText(r, text);
  out.text = text.str();
  out.devices = r.devices.size();
  out.job_findings = r.job_findings.size();
  return out;
}

void expectSameOnEveryThreadCount(const format::Snapshot& snap, size_t devices) {
  for (size_t top_frames : {size_t{0}, size_t{5}}) {
    const Outcome serial = analyzeWith(snap, 1, top_frames);
    ASSERT_EQ(serial.devices, devices);
    EXPECT_NE(serial.passes, "no device replayed");
    for (size_t threads : {2, 3, 4, 0}) {
      const Outcome par = analyzeWith(snap, threads, top_frames);
      EXPECT_EQ(par.json, serial.json) << threads << " threads";
      EXPECT_EQ(par.text, serial.text) << threads << " threads";
      // Counted as a serial loop would count them, on the caller's counters.
      EXPECT_EQ(par.passes, serial.passes) << threads << " threads";
    }
  }
}

TEST(ParallelAnalysis, FourDeviceScenarioIsTheSameOnAnyThreadCount) {
  auto snap = format::loadSnapshotFile(std::string(MEMF_SOURCE_DIR) +
                                       "/snapshots/scenarios/dp_imbalance_oom.pickle");
  ASSERT_TRUE(snap.ok());
  // The job's findings read every device's analysis: they must see them all, in order.
  EXPECT_GT(analyzeWith(*snap, 4).job_findings, 0u);
  expectSameOnEveryThreadCount(*snap, 4);
}

// 64 devices of different shapes: sizes and stacks vary by device, one device in eight OOMs (so
// the other devices' OOM times, read through Snapshot::ooms, matter), some leave blocks alive.
format::Snapshot manyDevices(int64_t n) {
  ModelBuilder b;
  for (int64_t d = 0; d < n; ++d) {
    const Frames line = {{"/home/u/model.py", 10 + static_cast<uint64_t>(d % 7), "forward"},
                         {"/home/u/train.py", 100, "main"}};
    const Frames other = {{"/home/u/train.py", 200 + static_cast<uint64_t>(d % 3), "step"}};
    const uint64_t seg = 64 * kMiB;
    b.device(d).segment(kBase).freeBlock(seg);
    int64_t t = 1 + d * 1000;
    b.segmentAlloc(kBase, seg, {.time_us = t++});
    const uint64_t a = (1 + static_cast<uint64_t>(d % 5)) * kMiB + static_cast<uint64_t>(d) * 512;
    const uint64_t c = (2 + static_cast<uint64_t>(d % 3)) * kMiB;
    for (int it = 0; it < 3; ++it) {
      b.alloc(kBase, a, {.time_us = t++, .frames = line});
      b.alloc(kBase + 8 * kMiB, c, {.time_us = t++, .frames = other});
      b.free(kBase + 8 * kMiB, c, {.time_us = t++});
      b.free(kBase, a, {.time_us = t++});
    }
    if (d % 8 == 3) b.oom(128 * kMiB, 0, {.time_us = t++});
    if (d % 2 == 0) b.alloc(kBase + 16 * kMiB, 3 * kMiB, {.time_us = t++, .frames = line});
  }
  return b.build();
}

TEST(ParallelAnalysis, SixtyFourDeviceJobIsTheSameOnAnyThreadCount) {
  const format::Snapshot snap = manyDevices(64);
  expectSameOnEveryThreadCount(snap, 64);
}

// freezeStackFacts: every frame's and stack's facts are what a cache of its own computes, and a
// session and analyzeDevice reading them give the facts and the analysis they give without them
// (analyzeSnapshot of several devices shares one frozen table among all of them).
TEST(ParallelAnalysis, FrozenStackFactsAreWhatEachCacheComputes) {
  auto real = format::loadSnapshotFile(std::string(MEMF_SOURCE_DIR) +
                                       "/snapshots/scenarios/dp_imbalance_oom.pickle");
  ASSERT_TRUE(real.ok());
  for (const format::Snapshot* snap : {&*real}) {
    const FrozenStackFacts frozen = freezeStackFacts(*snap);
    ASSERT_EQ(frozen.frames.size(), snap->stacks.frameCount());
    ASSERT_EQ(frozen.stacks.size(), snap->stacks.stackCount());
    ASSERT_GT(frozen.stacks.size(), 2u);
    StackFactsCache own(*snap), shared(*snap, &frozen);
    for (size_t i = 0; i < frozen.frames.size(); ++i) {
      const auto id = static_cast<format::FrameId>(i);
      const FrameFacts &a = own.frame(id), &b = shared.frame(id);
      EXPECT_EQ(&b, &frozen.frames[i]);
      EXPECT_EQ(a.kind, b.kind);
      EXPECT_EQ(a.python, b.python);
      EXPECT_EQ(a.module_init, b.module_init);
      EXPECT_EQ(a.replicate, b.replicate);
      EXPECT_EQ(a.forward, b.forward);
    }
    for (size_t i = 0; i < frozen.stacks.size(); ++i) {
      const auto id = static_cast<format::StackId>(i);
      const StackFacts &a = own.of(id), &b = shared.of(id);
      EXPECT_EQ(&b, &frozen.stacks[i]);
      EXPECT_EQ(a.backward, b.backward) << i;
      EXPECT_EQ(a.optimizer, b.optimizer) << i;
      EXPECT_EQ(a.module_init, b.module_init) << i;
      EXPECT_EQ(a.forward, b.forward) << i;
      EXPECT_EQ(a.replicate, b.replicate) << i;
      EXPECT_EQ(a.python, b.python) << i;
      EXPECT_EQ(a.innermost_user, b.innermost_user) << i;
      EXPECT_EQ(a.op, b.op) << i;
    }
    // Whole analyses: each device's with its own classification against the shared table's.
    for (int64_t d : snap->devices()) {
      SessionOptions with;
      with.stack_facts = &frozen;
      DeviceSession s1(*snap, d), s2(*snap, d, with);
      ASSERT_EQ(s1.facts().allocs.size(), s2.facts().allocs.size());
      for (size_t k = 0; k < s1.facts().allocs.size(); ++k) {
        EXPECT_EQ(s1.facts().allocs[k].category, s2.facts().allocs[k].category);
        EXPECT_EQ(s1.facts().allocs[k].iteration, s2.facts().allocs[k].iteration);
      }
      ASSERT_EQ(s1.facts().phases.size(), s2.facts().phases.size());
      for (DeviceSession* s : {&s1, &s2}) {
        s->requestLive(s->facts().summary.peak_requested.event, kMomentPeakRequested);
        s->requestFindingMoments(kLayoutOoms);
      }
      AnalyzeOptions plain, fast;
      fast.stack_facts = &frozen;
      AnalysisResult r1 = analysisHeader(*snap), r2 = analysisHeader(*snap);
      r1.devices.push_back(analyzeDevice(*snap, s1.take(), plain));
      r2.devices.push_back(analyzeDevice(*snap, s2.take(), fast));
      EXPECT_EQ(report::renderJsonString(r1), report::renderJsonString(r2)) << "device " << d;
    }
  }
}

TEST(ParallelAnalysis, OneDeviceOfManyIsTheSameOnAnyThreadCount) {
  const format::Snapshot snap = manyDevices(16);
  AnalyzeOptions one;
  one.device = 11;
  one.threads = 1;
  AnalyzeOptions four = one;
  four.threads = 4;
  const AnalysisResult a = analyzeSnapshot(snap, one), b = analyzeSnapshot(snap, four);
  ASSERT_EQ(a.devices.size(), 1u);
  EXPECT_EQ(a.devices[0].summary.device, 11);
  EXPECT_EQ(report::renderJsonString(a), report::renderJsonString(b));
}

// analyzeDevices (report's path: the caller visits the sessions, the analysis of the facts runs on
// threads) gives what analyzeSnapshot gives, with the same pass counters.
TEST(ParallelAnalysis, AnalyzeDevicesOnThreadsIsAnalyzeSnapshot) {
  auto real = format::loadSnapshotFile(std::string(MEMF_SOURCE_DIR) +
                                       "/snapshots/scenarios/dp_imbalance_oom.pickle");
  ASSERT_TRUE(real.ok());
  const format::Snapshot synthetic = manyDevices(40);
  for (const format::Snapshot* snap : std::vector<const format::Snapshot*>{&*real, &synthetic}) {
    const Outcome serial = analyzeWith(*snap, 1);
    for (size_t threads : {1, 4}) {
      replay::resetPassStats();
      AnalyzeOptions opt;
      opt.threads = threads;
      std::vector<DeviceFacts> facts;
      for (int64_t d : snap->devices()) {
        DeviceSession session(*snap, d);
        session.requestLive(session.facts().summary.peak_requested.event, kMomentPeakRequested);
        session.requestFindingMoments(kLayoutOoms);
        facts.push_back(session.take());
      }
      AnalysisResult r = analysisHeader(*snap);
      r.devices = analyzeDevices(*snap, std::move(facts), opt);
      finishAnalysis(*snap, r, opt);
      EXPECT_EQ(replay::describePassStats(), serial.passes) << threads << " threads";
      EXPECT_EQ(report::renderJsonString(r), serial.json) << threads << " threads";
    }
  }
}

// The sessions in flight are bounded by the largest device's events (kMaxSessionEventsInFlight):
// a file of a few huge devices runs fewer threads than asked, down to one.
TEST(ParallelAnalysis, HugeDevicesRunOnFewerThreads) {
  EXPECT_EQ(sessionThreads(8, 207, 30000), 8u);  // zid_x207: ~23 k events a device
  EXPECT_EQ(sessionThreads(8, 3, 30000), 3u);    // no more threads than devices
  EXPECT_EQ(sessionThreads(8, 8, kMaxSessionEventsInFlight / 3), 3u);
  EXPECT_EQ(sessionThreads(8, 8, kMaxSessionEventsInFlight), 1u);
  EXPECT_EQ(sessionThreads(8, 8, kMaxSessionEventsInFlight * 4), 1u);
  EXPECT_EQ(sessionThreads(1, 8, 10), 1u);
  EXPECT_EQ(sessionThreads(8, 0, 0), 1u);
}

// The snapshots the other commands' loops are checked on: a real 4-device job with an OOM and a
// cross-device finding, and 24 synthetic devices of different shapes.
std::vector<format::Snapshot> commandInputs() {
  std::vector<format::Snapshot> out;
  auto real = format::loadSnapshotFile(std::string(MEMF_SOURCE_DIR) +
                                       "/snapshots/scenarios/dp_imbalance_oom.pickle");
  EXPECT_TRUE(real.ok());
  if (real.ok()) out.push_back(std::move(*real));
  out.push_back(manyDevices(24));
  return out;
}

std::vector<int64_t> timelineDevices(const TimelineResult& r) {
  std::vector<int64_t> d;
  for (const auto& t : r.devices) d.push_back(t.device);
  return d;
}

// timeline: computeTimelineOn on 1-4 threads is computeTimeline: every device, in order, the same
// JSON and pass counters.
TEST(ParallelAnalysis, TimelineIsTheSameOnAnyThreadCount) {
  for (const format::Snapshot& snap : commandInputs()) {
    replay::resetPassStats();
    TimelineOptions opt;
    opt.max_points = 50;
    const TimelineResult serial = computeTimeline(snap, opt);
    const std::string passes = replay::describePassStats();
    ASSERT_EQ(timelineDevices(serial), snap.devices());
    std::ostringstream want;
    report::renderTimelineJson(serial, want);
    for (size_t threads : {1, 2, 3, 4}) {
      replay::resetPassStats();
      const TimelineResult par = computeTimelineOn(snap, opt, threads);
      EXPECT_EQ(replay::describePassStats(), passes) << threads << " threads";
      EXPECT_EQ(timelineDevices(par), snap.devices()) << threads << " threads";
      std::ostringstream got;
      report::renderTimelineJson(par, got);
      EXPECT_EQ(got.str(), want.str()) << threads << " threads";
    }
  }
}

std::vector<int64_t> profileDevices(const RunProfile& p) {
  std::vector<int64_t> d;
  for (const auto& x : p.devices) d.push_back(x.device);
  return d;
}

// check, diff, report --baseline (and ranks' rows): profileSnapshotOn on 1-4 threads is
// profileSnapshot: every device in order, the job's findings, the same diff against a third run.
TEST(ParallelAnalysis, ProfileIsTheSameOnAnyThreadCount) {
  const std::vector<format::Snapshot> inputs = commandInputs();
  ASSERT_EQ(inputs.size(), 2u);
  for (const format::Snapshot& snap : inputs) {
    const format::Snapshot& other = &snap == &inputs[0] ? inputs[1] : inputs[0];
    const RunProfile against = profileSnapshot(other);
    replay::resetPassStats();
    const RunProfile serial = profileSnapshot(snap);
    const std::string passes = replay::describePassStats();
    ASSERT_EQ(profileDevices(serial), snap.devices());
    std::ostringstream want, want_self;
    report::renderDiffJson(diffProfiles(against, serial), want);
    report::renderDiffJson(diffProfiles(serial, serial), want_self);
    for (size_t threads : {1, 2, 3, 4}) {
      replay::resetPassStats();
      const RunProfile par = profileSnapshotOn(snap, {}, threads);
      EXPECT_EQ(replay::describePassStats(), passes) << threads << " threads";
      EXPECT_EQ(profileDevices(par), snap.devices()) << threads << " threads";
      ASSERT_EQ(par.job_findings.size(), serial.job_findings.size()) << threads << " threads";
      for (size_t k = 0; k < par.job_findings.size(); ++k) {
        EXPECT_EQ(par.job_findings[k].device, serial.job_findings[k].device);
        EXPECT_EQ(par.job_findings[k].finding.title, serial.job_findings[k].finding.title);
      }
      std::ostringstream got, got_self;
      report::renderDiffJson(diffProfiles(against, par), got);
      report::renderDiffJson(diffProfiles(par, par), got_self);
      EXPECT_EQ(got.str(), want.str()) << threads << " threads";
      EXPECT_EQ(got_self.str(), want_self.str()) << threads << " threads";
    }
  }
}

// report's sessions: visitSessions builds them in one round, calls `between` once with every
// device's pass 1 in order, and visits them in a second round; the facts equal a serial loop's
// (through analyzeDevices' JSON), with the same pass counters, on 1-4 threads.
TEST(ParallelAnalysis, VisitSessionsIsASerialLoopOnAnyThreadCount) {
  for (const format::Snapshot& snap : commandInputs()) {
    SessionOptions so;
    so.series = true;
    auto render = [&](std::vector<DeviceFacts> facts) {
      AnalysisResult r = analysisHeader(snap);
      AnalyzeOptions ao;
      ao.top_frames = 5;
      r.devices = analyzeDevices(snap, std::move(facts), ao);
      return report::renderJsonString(r);
    };
    replay::resetPassStats();
    std::vector<DeviceFacts> serial;
    SessionOptions serial_so = so;
    serial_so.checkpoints = false;  // as visitSessions' sessions (alive together) are
    for (int64_t d : snap.devices()) {
      DeviceSession session(snap, d, serial_so);
      session.requestLive(session.facts().summary.peak_requested.event, kMomentPeakRequested);
      session.requestFindingMoments(kLayoutOoms);
      serial.push_back(session.take());
    }
    const std::string passes = replay::describePassStats();
    const std::string want = render(std::move(serial));
    for (size_t threads : {1, 2, 3, 4}) {
      replay::resetPassStats();
      size_t betweens = 0;
      std::vector<int64_t> seen, after;
      std::vector<int64_t> devices = snap.devices();
      std::vector<DeviceFacts> facts = visitSessions(
          snap, devices, so, threads,
          [&](const std::vector<const DeviceFacts*>& pass1) {
            ++betweens;
            for (const DeviceFacts* f : pass1) seen.push_back(f->device);
          },
          [&](size_t, DeviceSession& session) {
            session.requestLive(session.facts().summary.peak_requested.event, kMomentPeakRequested);
            session.requestFindingMoments(kLayoutOoms);
          },
          [&](size_t i, DeviceFacts& f) { EXPECT_EQ(f.device, devices[i]); });
      EXPECT_EQ(betweens, 1u) << threads << " threads";
      EXPECT_EQ(seen, devices) << threads << " threads";
      EXPECT_EQ(replay::describePassStats(), passes) << threads << " threads";
      ASSERT_EQ(facts.size(), devices.size());
      for (size_t i = 0; i < facts.size(); ++i) EXPECT_EQ(facts[i].device, devices[i]);
      EXPECT_EQ(render(std::move(facts)), want) << threads << " threads";
    }
  }
}

// report --baseline takes the live sets only the profile asked for out again, which relies on
// findingLiveEvents naming exactly the live sets requestFindingMoments asks for; and dropLiveSets
// leaves the facts a session without those requests gives.
TEST(ParallelAnalysis, FindingLiveEventsAreThoseRequestFindingMomentsAsksFor) {
  for (const format::Snapshot& snap : commandInputs()) {
    for (int64_t d : snap.devices()) {
      DeviceSession session(snap, d);
      const std::vector<int64_t> named = findingLiveEvents(session.facts());
      session.requestFindingMoments(kLayoutOoms);
      const DeviceFacts f = session.take();
      std::set<int64_t> live;
      for (const MomentFacts& m : f.moments) {
        if (m.has_live) live.insert(m.event);
      }
      std::set<int64_t> want;
      for (int64_t e : named) {
        if (e >= -1 && e < static_cast<int64_t>(f.events.size())) want.insert(e);
      }
      EXPECT_EQ(live, want) << "device " << d;
    }
  }
}

TEST(ParallelAnalysis, DropLiveSetsLeavesTheFactsOfASessionWithoutThem) {
  for (const format::Snapshot& snap : commandInputs()) {
    for (int64_t d : snap.devices()) {
      DeviceSession plain(snap, d), extra(snap, d);
      plain.requestFindingMoments(kLayoutOoms);
      extra.requestFindingMoments(kLayoutOoms);
      const std::vector<int64_t> wanted = findingLiveEvents(extra.facts());
      std::vector<int64_t> added;
      const int64_t n = static_cast<int64_t>(extra.facts().events.size());
      for (int64_t e : {n / 3, n / 2, n - 2}) {
        if (e < 0 || std::find(wanted.begin(), wanted.end(), e) != wanted.end()) continue;
        if (extra.requestLive(e, kMomentKeyframe)) added.push_back(e);
      }
      DeviceFacts a = plain.take(), b = extra.take();
      dropLiveSets(b, added);
      ASSERT_EQ(a.moments.size(), b.moments.size()) << "device " << d;
      for (size_t k = 0; k < a.moments.size(); ++k) {
        EXPECT_EQ(a.moments[k].event, b.moments[k].event);
        EXPECT_EQ(a.moments[k].has_live, b.moments[k].has_live);
        EXPECT_EQ(a.moments[k].live.size(), b.moments[k].live.size());
        EXPECT_EQ(a.moments[k].has_layout, b.moments[k].has_layout);
      }
    }
  }
}

}  // namespace
}  // namespace memforensics::analysis
