// parallel_analysis_test.cc: analyzeSnapshot gives the same result on any number of threads
// (AnalyzeOptions::threads, common/parallel.h): the rendered JSON and text compared as strings,
// and the pass counters (replay/pass_stats.h) of the calling thread, on a real 4-device scenario
// and a synthetic 64-device job.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "fixtures/model_builder.h"
#include "format/load/load.h"
#include "replay/pass_stats.h"
#include "report/render.h"

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
// the other devices' OOM times, read through Snapshot::ooms(), matter), some leave blocks alive.
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

}  // namespace
}  // namespace memforensics::analysis
