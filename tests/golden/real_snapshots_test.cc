// real_snapshots_test.cc: invariants over every real snapshot in ../shared/snapshots-real.
//
// These are third-party files read in place (never copied). For each file and device:
//   * it loads;
//   * forward replay ends exactly at the file's final segment state;
//   * every `snapshot` event equals the replayed active bytes;
//   * each peak is reached at the event it names;
//   * reserved bytes never go negative and no replay detector of severity "error" fires.
// Except where the file contradicts itself (kContradictory): there replay must say so, with
// history_contradicts_final_state and final_state_mismatch and the figures it cannot vouch for
// (start, peaks, final_replayed, block_layout), and its counters must still be sane.
#include "fixtures/real_snapshots.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "analysis/analyze.h"
#include "format/load/load.h"
#include "replay/replay.h"

namespace memforensics {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> realFiles() {
  return testing::realSnapshotPaths();
}

// Real files whose trace cannot lead to their final state (see ../shared/snapshots-real/README.md):
// drisspg's holds the first 50 events while the segments are the state at the end, all free.
bool contradictory(const fs::path& p) {
  return p.filename().string().starts_with("drisspg__transformer_nuggets__mini_snapshot");
}

class RealSnapshot : public ::testing::TestWithParam<fs::path> {};

TEST_P(RealSnapshot, ReplayInvariantsHold) {
  auto snap = format::loadSnapshotFile(GetParam().string());
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  ASSERT_FALSE(snap->devices().empty());
  for (int64_t d : snap->devices()) {
    SCOPED_TRACE("device " + std::to_string(d));
    replay::DeviceReplayer r(*snap, d);
    auto s = replay::summarizeDevice(r);
    if (contradictory(GetParam())) {
      using replay::AnomalyKind;
      EXPECT_FALSE(s.consistent);
      EXPECT_EQ(
          replay::untrustedNames(s.untrusted),
          (std::vector<std::string_view>{"start", "peaks", "final_replayed", "block_layout"}));
      const auto& h = s.anomalies[static_cast<size_t>(AnomalyKind::HistoryContradictsFinalState)];
      EXPECT_EQ(h.count, 24u);  // the 24 allocs that are never freed in the trace
      EXPECT_EQ(h.first_event, 1);
      EXPECT_EQ(s.anomalies[static_cast<size_t>(AnomalyKind::FinalStateMismatch)].count, 1u);
      // What the file says, and what the trace says: both sane, neither negative nor wrapped.
      EXPECT_EQ(s.final_file.requested, 0u);
      EXPECT_EQ(s.final_file.reserved, 421527552u);
      EXPECT_EQ(s.start.requested, 0u);
      EXPECT_EQ(s.start.reserved, 0u);
      EXPECT_EQ(s.peak_requested.bytes, 402752512u);
      EXPECT_EQ(s.final_replayed.requested, 402719744u);
      EXPECT_LE(s.final_replayed.requested, s.peak_requested.bytes);
      continue;
    }
    EXPECT_TRUE(s.consistent);
    EXPECT_EQ(s.untrusted, 0);
    for (size_t k = 0; k < replay::kAnomalyKinds; ++k) {
      auto kind = static_cast<replay::AnomalyKind>(k);
      if (replay::anomalySeverity(kind) == replay::Severity::Error) {
        EXPECT_EQ(s.anomalies[k].count, 0u) << replay::anomalyId(kind);
      }
    }
    // Ends at the file's final state, exactly.
    EXPECT_EQ(s.final_replayed.reserved, s.final_file.reserved);
    EXPECT_EQ(s.final_replayed.requested, s.final_file.requested);
    EXPECT_EQ(s.final_replayed.allocated, s.final_file.allocated);
    EXPECT_EQ(s.final_replayed.pending, s.final_file.pending);
    // Peaks are reached where they say.
    for (const replay::Peak* p : {&s.peak_reserved, &s.peak_requested, &s.peak_allocated}) {
      r.advanceTo(p->event);
      const auto& c = r.counters();
      EXPECT_TRUE(c.reserved == p->bytes || c.requested == p->bytes || c.allocated == p->bytes);
    }
    r.advanceTo(s.peak_requested.event);
    EXPECT_EQ(r.counters().requested, s.peak_requested.bytes);
    r.advanceTo(s.peak_reserved.event);
    EXPECT_EQ(r.counters().reserved, s.peak_reserved.bytes);
    // Reserved never negative: recompute with signed arithmetic from the start.
    int64_t reserved = static_cast<int64_t>(s.start.reserved);
    for (const auto& e : r.events()) {
      if (e.action == format::Action::SegmentAlloc || e.action == format::Action::SegmentMap) {
        reserved += static_cast<int64_t>(e.size);
      } else if (e.action == format::Action::SegmentFree ||
                 e.action == format::Action::SegmentUnmap) {
        reserved -= static_cast<int64_t>(e.size);
      }
      ASSERT_GE(reserved, 0);
    }
    EXPECT_EQ(static_cast<uint64_t>(reserved), s.final_file.reserved);
    EXPECT_GE(s.peak_requested.bytes, s.final_file.requested);
    EXPECT_GE(s.peak_reserved.bytes, s.final_file.reserved);
  }
}

TEST_P(RealSnapshot, AnalyzeProducesTopGroupsThatFitThePeak) {
  auto snap = format::loadSnapshotFile(GetParam().string());
  ASSERT_TRUE(snap.ok());
  auto res = analysis::analyzeSnapshot(*snap);
  for (const auto& d : res.devices) {
    uint64_t sum = 0;
    for (const auto& g : d.top_at_peak) sum += g.requested_bytes;
    EXPECT_LE(sum, d.summary.peak_requested.bytes);
    if (d.summary.peak_requested.bytes > 0) {
      EXPECT_FALSE(d.top_at_peak.empty());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Files, RealSnapshot, ::testing::ValuesIn(realFiles()),
                         [](const auto& info) { return testing::testNameOf(info.param); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(RealSnapshot);

TEST(RealSnapshots, CompleteHistoriesStartFromAnEmptyAllocator) {
  for (const char* name : {"silmont2000__assignment2-systems__mem_snapshot.pickle",
                           "zidongliu__decomfl__memory.pickle"}) {
    fs::path p = fs::path(MEMF_REAL_SNAPSHOTS) / name;
    if (!fs::exists(p)) GTEST_SKIP() << "real snapshots not available";
    auto snap = format::loadSnapshotFile(p.string());
    ASSERT_TRUE(snap.ok());
    replay::DeviceReplayer r(*snap, 0);
    EXPECT_EQ(r.startCounters().reserved, 0u) << name;
    EXPECT_EQ(r.startCounters().requested, 0u) << name;
    EXPECT_EQ(r.liveAtStartCount(), 0u) << name;
  }
}

}  // namespace
}  // namespace memforensics
