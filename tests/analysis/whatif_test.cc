// whatif_test.cc: the allocator what-if (analysis/whatif/whatif.h, docs/whatif.md). Under the
// file's own settings the simulation reproduces the recorded peak reserved on complete histories;
// on fabricated request streams with a known answer each setting gives that answer.
#include "analysis/whatif/whatif.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "fixtures/model_builder.h"
#include "fixtures/real_snapshots.h"
#include "format/load/load.h"
#include "report/html/whatif_data.h"

namespace memforensics::analysis {
namespace {

using testing::ModelBuilder;
constexpr uint64_t kMiB = 1048576;
constexpr uint64_t kBase = uint64_t{0x7f0000000000};

replay::AllocConf with(const std::string& key, const std::string& value,
                       replay::AllocConf s = replay::AllocConf{}) {
  std::string why = replay::applyAllocSetting(s, key, value);
  EXPECT_EQ(why, "") << key << "=" << value;
  return s;
}

// --- the file's own settings reproduce the recorded peak reserved ---------------------------

struct RealCase {
  std::string path;
  uint64_t peak_reserved;
  uint64_t ooms;
};

class WhatIfBaseline : public ::testing::TestWithParam<RealCase> {};

TEST_P(WhatIfBaseline, ReproducesTheRecordedPeakReserved) {
  const RealCase& c = GetParam();
  if (!std::filesystem::exists(c.path)) GTEST_SKIP() << c.path << " absent";
  auto snap = format::loadSnapshotFile(c.path);
  ASSERT_TRUE(snap.ok()) << c.path;
  std::string error;
  WhatIfResult r = runWhatIf(*snap, {}, &error);
  ASSERT_EQ(error, "");
  ASSERT_EQ(r.devices.size(), 1u);
  const DeviceWhatIf& d = r.devices[0];
  EXPECT_TRUE(d.complete_history);
  EXPECT_EQ(d.recorded_peak_reserved, c.peak_reserved);
  EXPECT_EQ(d.baseline.peak_reserved, c.peak_reserved);
  EXPECT_EQ(d.baseline.oom_count, c.ooms);
  EXPECT_EQ(d.recorded_ooms, c.ooms);
  // No --set, no --capacity: the what-if is the baseline.
  EXPECT_EQ(d.whatif.peak_reserved, d.baseline.peak_reserved);
  EXPECT_EQ(d.whatif.oom_count, d.baseline.oom_count);
}

const std::string kReal = MEMF_REAL_SNAPSHOTS;
const std::string kSrc = MEMF_SOURCE_DIR;
INSTANTIATE_TEST_SUITE_P(
    Files, WhatIfBaseline,
    ::testing::Values(
        RealCase{kReal + "/silmont2000__assignment2-systems__mem_snapshot.pickle", 3781165056u, 0},
        RealCase{kReal + "/zidongliu__decomfl__memory.pickle", 1897922560u, 0},
        RealCase{kSrc + "/snapshots/sample_training.pickle", 639631360u, 1},
        RealCase{kSrc + "/snapshots/scenarios/fragmentation_oom.pickle", 452984832u, 1}),
    [](const auto& info) { return "File" + std::to_string(info.index); });

// Every complete history among the real files, the sample and the scenarios, with or without
// expandable segments: the baseline's peak reserved, OOM count and segment calls are the recorded
// ones, and it serves every alloc at the address the file recorded (the what-if and the
// address-checking model are one allocator, replay/caching_allocator.h).
TEST(WhatIfBaselineAll, EveryCompleteHistoryReproducesItsPeakReservedAndEveryAddress) {
  auto paths = testing::realSnapshotPathsAndSample();
  for (const auto& e : std::filesystem::directory_iterator(kSrc + "/snapshots/scenarios")) {
    if (e.path().extension() == ".pickle") paths.push_back(e.path());
  }
  size_t complete = 0, expandable = 0;
  uint64_t allocs = 0;
  for (const auto& p : paths) {
    auto snap = format::loadSnapshotFile(p.string());
    if (!snap.ok()) continue;
    std::string error;
    WhatIfResult r = runWhatIf(*snap, {}, &error);
    for (const DeviceWhatIf& d : r.devices) {
      if (!d.complete_history) continue;
      ++complete;
      expandable += r.base_settings.expandable_segments;
      allocs += d.baseline.address_total;
      EXPECT_EQ(d.baseline.peak_reserved, d.recorded_peak_reserved) << p << " cuda:" << d.device;
      EXPECT_EQ(d.baseline.oom_count, d.recorded_ooms) << p;
      // The same cudaMallocs / maps and cudaFrees / unmaps, in number.
      EXPECT_EQ(d.baseline.segment_allocs, d.recorded_segment_allocs) << p << " cuda:" << d.device;
      EXPECT_EQ(d.baseline.segment_frees, d.recorded_segment_frees) << p << " cuda:" << d.device;
      EXPECT_GT(d.baseline.address_total, 0u) << p;
      EXPECT_EQ(d.baseline.address_predicted, d.baseline.address_total)
          << p << " cuda:" << d.device;
    }
  }
  EXPECT_GE(complete, 15u);   // the sample and the scenarios at least
  EXPECT_GE(expandable, 4u);  // dp_imbalance_oom's four devices
  EXPECT_GE(allocs, 10000u);
}

// The independent simulator's expandable-segment recordings (tools/make_expandable.py, written
// from PyTorch's source): the baseline reproduces their peaks, OOMs and addresses, a reservation
// made by a malloc that failed included (exp_oom_flush: its address is the map after the OOM;
// one more map than recorded there, so it is labelled an estimate).
// Where a reservation ends (1.125 x the card's total memory) is not in a file: exp_random fills
// reservations to their end, and the allocs after that are served elsewhere, counted as misses and
// labelled an estimate.
TEST(WhatIfBaselineAll, ExpandableRecordingsOfTheIndependentSimulator) {
  const std::string data = kSrc + "/tests/replay/data/";
  for (const char* name : {"exp_grow", "exp_oom_flush", "exp_pools_streams", "exp_random"}) {
    auto snap = format::loadSnapshotFile(data + name + ".pickle");
    ASSERT_TRUE(snap.ok()) << name;
    std::string error;
    WhatIfResult r = runWhatIf(*snap, {}, &error);
    ASSERT_TRUE(r.base_settings.expandable_segments) << name;
    for (const DeviceWhatIf& d : r.devices) {
      ASSERT_TRUE(d.complete_history) << name;
      EXPECT_EQ(d.baseline.peak_reserved, d.recorded_peak_reserved) << name << " " << d.device;
      if (std::string(name) == "exp_random") {
        EXPECT_LT(d.baseline.address_predicted, d.baseline.address_total) << d.device;
        EXPECT_NE(whatIfEstimateReason(d, r.base_settings), "") << d.device;
        continue;
      }
      EXPECT_EQ(d.baseline.oom_count, d.recorded_ooms) << name;
      EXPECT_EQ(d.baseline.address_predicted, d.baseline.address_total) << name;
      EXPECT_EQ(d.baseline.segment_frees, d.recorded_segment_frees) << name;
      // exp_oom_flush: one map more than recorded, before a recorded OOM (a reservation's extent
      // differs from the simulator's 1.125 x the card), so it is labelled an estimate.
      EXPECT_EQ(whatIfEstimateReason(d, r.base_settings).empty(),
                d.baseline.segment_allocs == d.recorded_segment_allocs)
          << name;
    }
  }
}

// A new segment goes where the recording's driver put it only when the allocator would make one
// and that range is free. A recording that contradicts the allocator (a new segment although a
// cached block fits; a segment over one still in use) is served elsewhere, and each such alloc is
// counted as a miss, never placed over live memory.
TEST(WhatIf, AddressAgreementCountsAllocsAwayFromTheRecordedAddress) {
  const uint64_t seg = 30 * kMiB;
  ModelBuilder b;
  b.segmentAlloc(kBase, seg).alloc(kBase, seg);  // served at kBase: agrees
  b.free(kBase, seg);
  // The cached 30 MiB block fits, yet the recording made a new segment: the allocator reuses it.
  b.segmentAlloc(kBase + 2 * seg, seg).alloc(kBase + 2 * seg, seg);
  // A segment recorded over the block just allocated (live in the simulation): placed elsewhere.
  b.segmentAlloc(kBase, 40 * kMiB).alloc(kBase, 40 * kMiB);
  auto snap = b.build();
  SimResult r = simulateRequests(traceInput(snap, 0), replay::AllocConf{}, kWhatIfUnlimited);
  EXPECT_EQ(r.address_total, 3u);
  EXPECT_EQ(r.address_predicted, 1u);
  EXPECT_EQ(r.peak_allocated, 70 * kMiB);
  EXPECT_EQ(r.peak_reserved, 70 * kMiB);  // 30 MiB reused, one 40 MiB segment
  EXPECT_EQ(r.segment_allocs, 2u);
}

// A trace that cannot lead to the file's final state (its block is free at the end, the trace
// never frees it: events are missing) replays as the recording did, every address where the file
// put it, yet the baseline is no exact account of the program: the what-if says why (drisspg's
// mini snapshot was called exact so). The same trace with the block live at the end is exact.
TEST(WhatIf, ABaselineOfATraceThatContradictsItsFinalStateIsAnEstimate) {
  for (bool consistent : {true, false}) {
    ModelBuilder b;
    b.segment(kBase, {.size = 20 * kMiB});
    if (consistent) b.live(20 * kMiB);
    b.segmentAlloc(kBase, 20 * kMiB).alloc(kBase, 20 * kMiB);
    auto snap = b.build();
    std::string error;
    WhatIfResult r = runWhatIf(snap, {}, &error);
    ASSERT_EQ(error, "");
    ASSERT_EQ(r.devices.size(), 1u);
    const DeviceWhatIf& d = r.devices[0];
    EXPECT_EQ(d.baseline.address_predicted, 1u) << consistent;
    EXPECT_EQ(d.baseline.peak_reserved, d.recorded_peak_reserved) << consistent;
    EXPECT_EQ(d.replay_untrusted != 0, !consistent);
    const std::string why = whatIfEstimateReason(d, r.base_settings);
    if (consistent) {
      EXPECT_EQ(why, "");
    } else {
      EXPECT_NE(why.find("cannot lead to the file's final state"), std::string::npos) << why;
    }
  }
}

// --- fabricated request streams with a known answer -----------------------------------------

// 20 live requests of 10.5 MiB: each cudaMalloc'd segment is rounded to 12 MiB, and the 1.5 MiB
// left in each stays cached but is too small for the next request: 240 MiB reserved; expandable
// segments split to 512 bytes and map 20 MiB pages as needed: 210 MiB of requests in 11 pages, 220
// MiB.
TEST(WhatIf, ExpandableSegmentsRemoveRoundingWaste) {
  ModelBuilder b;
  const uint64_t req = 10 * kMiB + kMiB / 2;
  for (uint64_t i = 0; i < 20; ++i) b.alloc(kBase + i * 12 * kMiB, req);
  auto snap = b.build();
  SimResult base = simulateRequests(traceInput(snap, 0), replay::AllocConf{}, kWhatIfUnlimited);
  EXPECT_EQ(base.peak_reserved, 240 * kMiB);
  EXPECT_EQ(base.peak_allocated, 20 * req);  // the 1.5 MiB remainders are split off, free
  SimResult exp =
      simulateRequests(traceInput(snap, 0), with("expandable_segments", "True"), kWhatIfUnlimited);
  EXPECT_EQ(exp.peak_reserved, 220 * kMiB);
  EXPECT_EQ(exp.peak_allocated, 20 * req);
  EXPECT_EQ(exp.oom_count, 0u);
}

// A freed 100 MiB block is split for a live 30 MiB request; the next 100 MiB request needs a new
// segment, and a 150 MiB card has only 50 MiB left: OOM, though live bytes (130 MiB) fit. With
// max_split_size_mb=64 the 30 MiB request may not split the 100 MiB block (it gets its own 30 MiB
// segment) and the 100 MiB one reuses it: 130 MiB reserved. Expandable segments grow the
// reservation by two pages instead: 140 MiB.
format::Snapshot fragmentation() {
  return ModelBuilder()
      .alloc(kBase, 100 * kMiB)
      .free(kBase, 100 * kMiB)
      .alloc(kBase, 30 * kMiB)
      .alloc(kBase + 200 * kMiB, 100 * kMiB, {.frames = testing::Frames{{"train.py", 42, "step"}}})
      .build();
}

TEST(WhatIf, FragmentationOomThatMaxSplitSizeAvoids) {
  auto snap = fragmentation();
  const uint64_t cap = 150 * kMiB;
  SimResult base = simulateRequests(traceInput(snap, 0), replay::AllocConf{}, cap);
  ASSERT_EQ(base.oom_count, 1u);
  ASSERT_EQ(base.ooms.size(), 1u);
  EXPECT_FALSE(base.ooms[0].recorded);
  EXPECT_EQ(base.ooms[0].event, 4);  // free() is free_requested + free_completed
  EXPECT_EQ(base.ooms[0].requested, 100 * kMiB);
  EXPECT_EQ(base.ooms[0].line, "train.py:42 step");
  EXPECT_NE(base.ooms[0].why.find("fragmentation"), std::string::npos) << base.ooms[0].why;
  EXPECT_EQ(base.peak_reserved, 100 * kMiB);

  SimResult split = simulateRequests(traceInput(snap, 0), with("max_split_size_mb", "64"), cap);
  EXPECT_EQ(split.oom_count, 0u);
  EXPECT_EQ(split.peak_reserved, 130 * kMiB);
  EXPECT_EQ(split.peak_allocated, 130 * kMiB);

  SimResult exp = simulateRequests(traceInput(snap, 0), with("expandable_segments", "True"), cap);
  EXPECT_EQ(exp.oom_count, 0u);
  EXPECT_EQ(exp.peak_reserved, 140 * kMiB);

  // On an unlimited card nothing fails: 200 MiB reserved.
  EXPECT_EQ(
      simulateRequests(traceInput(snap, 0), replay::AllocConf{}, kWhatIfUnlimited).peak_reserved,
      200 * kMiB);
}

// The smallest card of the fragmentation history: below 200 MiB the 100 MiB request finds no room
// (the first segment's free tail is pinned by a live block): 200 MiB exactly, in 2 MiB units.
// With a work budget the replays run out of, the search says it has no answer. A cache release
// visits only what it can give back: the history gains a spare segment, freed and cached first,
// which a replay on a card below 220 MiB releases at the 100 MiB request (one visit).
TEST(WhatIf, SmallestCardIsExactAndBoundedByItsBudget) {
  const auto plain = fragmentation();
  const SmallestCard card = smallestCard(traceInput(plain, 0), replay::AllocConf{});
  EXPECT_EQ(card.capacity, 200 * kMiB);
  EXPECT_EQ(card.slack, 0u);
  EXPECT_FALSE(card.budget_ran_out);
  // On the plain history no release has anything to look at.
  EXPECT_EQ(simulateRequests(traceInput(plain, 0), replay::AllocConf{}, 150 * kMiB).segment_visits,
            0u);

  auto snap = ModelBuilder()
                  .alloc(kBase + 400 * kMiB, 2 * kMiB)  // a 20 MiB segment, cached once freed
                  .free(kBase + 400 * kMiB, 2 * kMiB)
                  .alloc(kBase, 100 * kMiB)
                  .free(kBase, 100 * kMiB)
                  .alloc(kBase, 30 * kMiB)
                  .alloc(kBase + 200 * kMiB, 100 * kMiB)
                  .build();
  EXPECT_EQ(smallestCard(traceInput(snap, 0), replay::AllocConf{}).capacity, 200 * kMiB);
  SimChange none;
  none.max_segment_visits = 0;
  const SimResult r = simulateRequests(traceInput(snap, 0), replay::AllocConf{}, 150 * kMiB, none);
  EXPECT_TRUE(r.aborted);
  EXPECT_EQ(r.segment_visits, 1u);
  EXPECT_EQ(r.segment_frees, 1u);
  EXPECT_FALSE(simulateRequests(traceInput(snap, 0), replay::AllocConf{}, 150 * kMiB).aborted);
  // The bisection's first replay (below 220 MiB) releases the spare: a budget of one visit lets
  // it finish and aborts the next, so the search keeps a card it verified, with its slack.
  SimChange tight;
  tight.max_segment_visits = 1;
  const SmallestCard partial = smallestCard(traceInput(snap, 0), replay::AllocConf{}, tight);
  EXPECT_GE(partial.capacity, 200 * kMiB);
  EXPECT_LE(partial.capacity, 220 * kMiB);
  EXPECT_GT(partial.slack, 0u);
  EXPECT_TRUE(partial.budget_ran_out);
}

// Every recorded OOM makes the simulation release its cache. PyTorch's allocator walks every
// segment there; the core looks only at what it can release, so many OOMs over many live
// segments cost what is released (here one wholly free segment, once), not segments x OOMs
// (2 x 201 x 300 visits before).
TEST(WhatIf, ACacheReleaseVisitsOnlyWhatItCanRelease) {
  constexpr int kLive = 200, kOoms = 300;
  ModelBuilder b;
  for (int k = 0; k < kLive; ++k) {
    const uint64_t at = kBase + static_cast<uint64_t>(k) * 32 * kMiB;
    b.segmentAlloc(at, 20 * kMiB).alloc(at, 20 * kMiB);
  }
  const uint64_t spare = kBase + uint64_t{kLive} * 32 * kMiB;
  b.segmentAlloc(spare, 20 * kMiB).alloc(spare, 20 * kMiB).free(spare, 20 * kMiB);
  for (int k = 0; k < kOoms; ++k) b.oom(40 * kMiB, 0);
  auto snap = b.build();
  const uint64_t card = (kLive + 1) * 20 * kMiB;
  const SimResult r = simulateRequests(traceInput(snap, 0), replay::AllocConf{}, card);
  EXPECT_EQ(r.oom_count, static_cast<uint64_t>(kOoms));
  EXPECT_EQ(r.segment_frees, 1u);  // the spare, at the first OOM
  EXPECT_EQ(r.segment_visits, 1u);
  EXPECT_EQ(r.peak_reserved, card);
  // The same with expandable segments: the one reservation is full, nothing to unmap.
  const SimResult x =
      simulateRequests(traceInput(snap, 0), with("expandable_segments", "True"), card);
  EXPECT_EQ(x.oom_count, static_cast<uint64_t>(kOoms));
  EXPECT_LE(x.segment_visits, 1u);
  // With max_split_size, its release of oversize segments looks at the wholly free ones alone.
  const SimResult m = simulateRequests(traceInput(snap, 0), with("max_split_size_mb", "32"), card);
  EXPECT_EQ(m.oom_count, static_cast<uint64_t>(kOoms));
  EXPECT_LE(m.segment_visits, 2u);
}

// 100 MiB live, then a recorded OOM of 100 MiB with 50 MiB free: the card holds 150 MiB and live
// bytes plus the request are 200 MiB. No setting avoids it; a 250 MiB card does.
TEST(WhatIf, NoSettingHelpsWhenLiveBytesPlusTheRequestExceedTheCard) {
  auto snap = ModelBuilder()
                  .segmentAlloc(kBase, 100 * kMiB)
                  .alloc(kBase, 100 * kMiB)
                  .oom(100 * kMiB, 50 * kMiB, {.frames = testing::Frames{{"train.py", 7, "fwd"}}})
                  .build();
  EXPECT_EQ(impliedCapacity(traceInput(snap, 0)), 150 * kMiB);
  const std::vector<std::pair<std::string, std::string>> sets = {
      {"expandable_segments", "True"},
      {"max_split_size_mb", "64"},
      {"roundup_power2_divisions", "4"},
      {"garbage_collection_threshold", "0.5"}};
  for (const auto& kv : sets) {
    WhatIfOptions opt;
    opt.sets = {kv};
    std::string error;
    WhatIfResult r = runWhatIf(snap, opt, &error);
    ASSERT_EQ(error, "");
    ASSERT_EQ(r.devices.size(), 1u);
    const auto& w = r.devices[0].whatif;
    EXPECT_EQ(w.capacity, 150 * kMiB);
    ASSERT_EQ(w.ooms.size(), 1u) << kv.first;
    EXPECT_TRUE(w.ooms[0].recorded);
    EXPECT_FALSE(w.ooms[0].avoided) << kv.first;
    EXPECT_NE(w.ooms[0].why.find("no allocator setting"), std::string::npos) << w.ooms[0].why;
    EXPECT_EQ(w.ooms[0].line, "train.py:7 fwd");
    EXPECT_EQ(r.devices[0].baseline.oom_count, 1u);
  }
  WhatIfOptions bigger;
  bigger.capacity = 250 * kMiB;
  std::string error;
  WhatIfResult r = runWhatIf(snap, bigger, &error);
  ASSERT_EQ(r.devices.size(), 1u);
  ASSERT_EQ(r.devices[0].whatif.ooms.size(), 1u);
  EXPECT_TRUE(r.devices[0].whatif.ooms[0].avoided);
  EXPECT_EQ(r.devices[0].whatif.oom_count, 0u);
  EXPECT_EQ(r.devices[0].whatif.peak_reserved, 200 * kMiB);
}

// Hostile sizes: no wrapped arithmetic, no abort; what no card holds is an OOM.
TEST(WhatIf, HostileSizesAreOutOfMemoryNotAWrappedSum) {
  auto snap = ModelBuilder()
                  .alloc(kBase, ~uint64_t{0})
                  .alloc(kBase + 1, uint64_t{1} << 63)
                  .alloc(kBase + 2, 0)
                  .alloc(kBase + 3, kWhatIfMaxRequest)
                  .free(kBase + 2, 0)
                  .free(kBase + 99, 5)  // never allocated: a start block
                  .build();
  for (const char* exp : {"False", "True"}) {
    SimResult r =
        simulateRequests(traceInput(snap, 0), with("expandable_segments", exp), kWhatIfUnlimited);
    EXPECT_EQ(r.oom_count, 2u) << exp;
    EXPECT_GE(r.peak_reserved, kWhatIfMaxRequest) << exp;
    EXPECT_LT(r.peak_reserved, kWhatIfMaxRequest + 64 * kMiB) << exp;
  }
}

TEST(WhatIf, SettingsThatDoNotChangeDeviceMemoryAreRefused) {
  replay::AllocConf s;
  EXPECT_NE(replay::applyAllocSetting(s, "pinned_use_cuda_host_register", "True").find("pinned"),
            std::string::npos);
  EXPECT_NE(replay::applyAllocSetting(s, "no_such_key", "1").find("unknown"), std::string::npos);
  EXPECT_NE(replay::applyAllocSetting(s, "max_split_size_mb", "10"), "");  // CCA wants > 20
  EXPECT_NE(replay::applyAllocSetting(s, "garbage_collection_threshold", "1.5"), "");
  EXPECT_NE(replay::applyAllocSetting(s, "roundup_power2_divisions", "3"), "");
  EXPECT_NE(replay::applyAllocSetting(s, "expandable_segments", "maybe"), "");
  auto snap = fragmentation();
  WhatIfOptions opt;
  opt.sets = {{"pinned_num_register_threads", "8"}};
  std::string error;
  runWhatIf(snap, opt, &error);
  EXPECT_NE(error, "");
}

// garbage_collection_threshold (CCA garbage_collect_cached_blocks): a 24 MiB segment Y is made
// first, a 26 MiB segment X second; then Y is reused ten times, so X has been free for 11 of the
// pool's get_free_block calls and Y for 1 (average 6). A 40 MiB request on a 100 MiB card with
// threshold 0.4 (limit 40 MiB, reserved 50 MiB): the age rule frees X (age >= average), not Y,
// though Y is the older segment: reserved 24 + 40 = 64 MiB, and the next 24 MiB request reuses Y.
// Freeing by creation order would have freed Y (66 MiB); without the threshold nothing is freed
// (90 MiB); without a card size (CCA: no memory fraction set) there is no collection either.
TEST(WhatIf, GarbageCollectionFreesTheBlocksOlderThanTheAverageAge) {
  ModelBuilder b;
  b.alloc(kBase, 24 * kMiB).free(kBase, 24 * kMiB);
  b.alloc(kBase + 100 * kMiB, 26 * kMiB).free(kBase + 100 * kMiB, 26 * kMiB);
  for (int i = 0; i < 10; ++i) b.alloc(kBase, 24 * kMiB).free(kBase, 24 * kMiB);
  b.alloc(kBase + 200 * kMiB, 40 * kMiB).alloc(kBase, 24 * kMiB);
  auto snap = b.build();
  const uint64_t cap = 100 * kMiB;
  SimResult gc =
      simulateRequests(traceInput(snap, 0), with("garbage_collection_threshold", "0.4"), cap);
  EXPECT_EQ(gc.oom_count, 0u);
  EXPECT_EQ(gc.peak_reserved, 64 * kMiB);
  EXPECT_EQ(gc.segment_frees, 1u);
  EXPECT_EQ(gc.segment_allocs, 3u);  // Y, X, the 40 MiB one; the last request reuses Y
  SimResult off = simulateRequests(traceInput(snap, 0), replay::AllocConf{}, cap);
  EXPECT_EQ(off.peak_reserved, 90 * kMiB);
  EXPECT_EQ(off.segment_frees, 0u);
  SimResult unlimited = simulateRequests(
      traceInput(snap, 0), with("garbage_collection_threshold", "0.4"), kWhatIfUnlimited);
  EXPECT_EQ(unlimited.peak_reserved, 90 * kMiB);
  // Below the threshold nothing is collected: 0.95 x 100 MiB is above the 50 MiB reserved.
  EXPECT_EQ(simulateRequests(traceInput(snap, 0), with("garbage_collection_threshold", "0.95"), cap)
                .peak_reserved,
            90 * kMiB);
}

// CCA's allocated_bytes drop at free() (free_requested); the block is reused only after
// free_block (free_completed). A 10 MiB block freed on request and completed after the next
// 10 MiB request: two segments (20 MiB reserved), but never more than 10 MiB allocated.
TEST(WhatIf, PeakAllocatedDropsAtTheFreeRequestTheBlockAtItsCompletion) {
  auto snap = ModelBuilder()
                  .alloc(kBase, 10 * kMiB)
                  .freeRequested(kBase, 10 * kMiB)
                  .alloc(kBase + 100 * kMiB, 10 * kMiB)
                  .freeCompleted(kBase, 10 * kMiB)
                  .build();
  SimResult r = simulateRequests(traceInput(snap, 0), replay::AllocConf{}, kWhatIfUnlimited);
  EXPECT_EQ(r.peak_reserved, 20 * kMiB);
  EXPECT_EQ(r.peak_allocated, 10 * kMiB);
  EXPECT_EQ(r.allocated_at_peak_reserved, 20 * kMiB);  // both in use: nothing cached free
}

// roundup_power2_divisions list form (CCA parseRoundUpPower2Divisions): MB:N sets the interval
// [MB, 2 MB) MiB, the first entry also every interval below, ">:N" every interval after the last
// entry's.
TEST(WhatIf, RoundupPower2DivisionsListForm) {
  replay::AllocConf s = with("roundup_power2_divisions", "[256:1, 512:2, >:4]");
  for (size_t k = 0; k <= 8; ++k) EXPECT_EQ(s.divisions[k], 1u) << k;
  EXPECT_EQ(s.divisions[9], 2u);
  for (size_t k = 10; k < 16; ++k) EXPECT_EQ(s.divisions[k], 4u) << k;
  EXPECT_EQ(replay::describeDivisions(s.divisions), "[<512MiB:1,512-1023MiB:2,>=1024MiB:4]");
  replay::AllocConf lone = with("roundup_power2_divisions", "[>:4]");
  EXPECT_EQ(lone.divisions[0], 0u);  // CCA fills from last_index + 1 = 1
  EXPECT_EQ(lone.divisions[1], 4u);
  EXPECT_EQ(replay::describeDivisions(with("roundup_power2_divisions", "8").divisions), "8");
  for (const char* bad : {"[3:1]", "[256:3]", "[256:1", "[]", "[256]", "[256:1,,>:2]", "[x:2]"}) {
    replay::AllocConf t;
    EXPECT_NE(replay::applyAllocSetting(t, "roundup_power2_divisions", bad), "") << bad;
  }
  // A 300 MiB request falls in [256, 512) MiB: 4 divisions round it to 320 MiB; a 100 MiB one
  // ([64, 128), 0 divisions) keeps its size.
  auto snap = ModelBuilder().alloc(kBase, 300 * kMiB).alloc(kBase + kMiB * 400, 100 * kMiB).build();
  EXPECT_EQ(
      simulateRequests(traceInput(snap, 0), replay::AllocConf{}, kWhatIfUnlimited).peak_allocated,
      400 * kMiB);
  EXPECT_EQ(simulateRequests(traceInput(snap, 0), with("roundup_power2_divisions", "[128:0,256:4]"),
                             kWhatIfUnlimited)
                .peak_allocated,
            420 * kMiB);
}

// --- the report's what-if panel (report/html/whatif_data.h) ---------------------------------

format::Snapshot liveTooLarge() {
  return ModelBuilder()
      .segmentAlloc(kBase, 100 * kMiB)
      .alloc(kBase, 100 * kMiB)
      .oom(100 * kMiB, 50 * kMiB, {.frames = testing::Frames{{"train.py", 7, "fwd"}}})
      .build();
}

TEST(WhatIfPanel, AnOomNoSettingAvoidsAndTheCardItNeeds) {
  auto snap = liveTooLarge();
  report::WhatIfPanel p = report::buildWhatIfPanel(snap, std::nullopt, "x.pickle");
  ASSERT_TRUE(p.present);
  EXPECT_EQ(p.device, 0);
  EXPECT_EQ(p.implied_capacity, 150 * kMiB);
  std::vector<std::string> labels;
  for (const auto& r : p.rows) labels.push_back(r.label);
  // The OOM's 100 MiB request: max_split_size_mb 64 (a quarter, 16, is below CCA's minimum).
  EXPECT_EQ(labels,
            (std::vector<std::string>{"the file's own settings", "expandable_segments:True",
                                      "max_split_size_mb:64", "garbage_collection_threshold:0.8",
                                      "a card without a limit"}));
  ASSERT_LE(p.rows.size(), report::kReportWhatIfRuns);
  EXPECT_TRUE(p.rows[0].baseline);
  EXPECT_EQ(p.rows[0].answer, "reproduces the file's peak reserved and its 1 OOM");
  EXPECT_EQ(p.rows[0].estimate_reason, "");
  for (size_t i = 1; i + 1 < p.rows.size(); ++i) {
    EXPECT_EQ(p.rows[i].recorded_not_avoided, 1u) << labels[i];
    EXPECT_EQ(p.rows[i].answer.rfind("does not avoid the OOM", 0), 0u) << p.rows[i].answer;
    EXPECT_NE(p.rows[i].answer.find("no allocator setting"), std::string::npos);
  }
  EXPECT_EQ(p.rows[1].estimate_reason.empty(), false);  // expandable: an estimate
  EXPECT_EQ(p.rows[2].estimate_reason, "");
  const auto& card = p.rows.back();
  EXPECT_EQ(card.answer, "avoids the OOM");
  EXPECT_EQ(card.sim.peak_reserved, 200 * kMiB);
  EXPECT_EQ(card.sim.capacity, kWhatIfUnlimited);
  auto j = report::whatIfPanelJson(p);
  EXPECT_EQ(j["rows"].size(), p.rows.size());
  EXPECT_EQ(j["rows"][4]["peak_reserved_bytes"], 200 * kMiB);
  EXPECT_TRUE(j["rows"][4]["capacity_bytes"].is_null());
  EXPECT_EQ(j["rows"][1]["cli"], "--set expandable_segments=True");
  EXPECT_EQ(j["rows"][0]["ooms"][0]["line"], "train.py:7 fwd");
}

TEST(WhatIfPanel, WithoutAnOomASmallerCardAndNoGarbageCollection) {
  auto snap = fragmentation();  // no OOM: unlimited; 200 MiB reserved, 130 MiB allocated
  report::WhatIfPanel p = report::buildWhatIfPanel(snap, std::nullopt, "x.pickle");
  ASSERT_TRUE(p.present);
  ASSERT_EQ(p.rows.size(), 4u);
  EXPECT_EQ(p.rows[0].answer.rfind("the file records no segment events", 0), 0u)
      << p.rows[0].answer;
  EXPECT_EQ(p.rows[2].label, "max_split_size_mb:64");
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_NE(p.notes[0].find("garbage_collection_threshold not tried"), std::string::npos);
  // Halfway between 130 and 200 MiB: the 100 MiB request finds no room and nothing to release.
  EXPECT_EQ(p.rows[3].sim.capacity, 165 * kMiB);
  EXPECT_EQ(p.rows[3].new_ooms, 1u);
  EXPECT_EQ(p.rows[3].answer.rfind("runs out of memory: 1 new OOM", 0), 0u) << p.rows[3].answer;
}

TEST(WhatIfPanel, FocusDeviceAndAbsentPanels) {
  auto two = ModelBuilder()
                 .device(0)
                 .alloc(kBase, kMiB)
                 .device(1)
                 .segmentAlloc(kBase, 100 * kMiB)
                 .oom(200 * kMiB, 0)
                 .build();
  EXPECT_EQ(report::whatIfFocusDevice(two, std::nullopt), 1);
  EXPECT_EQ(report::whatIfFocusDevice(two, 0), 0);
  EXPECT_EQ(report::whatIfFocusDevice(two, 5), std::nullopt);
  EXPECT_FALSE(report::buildWhatIfPanel(two, 5, "x").present);
  EXPECT_EQ(report::buildWhatIfPanel(two, std::nullopt, "x").device, 1);
  EXPECT_EQ(
      report::buildWhatIfPanel(two, 0, "x", "the most severe finding is on cuda:0").focus_rule,
      "the most severe finding is on cuda:0");
  two.has_segment_info = false;  // as a profiler trace
  report::WhatIfPanel p = report::buildWhatIfPanel(two, std::nullopt, "x");
  two.has_segment_info = true;
  EXPECT_FALSE(p.present);
  EXPECT_NE(p.absent_reason.find("allocator trace"), std::string::npos);
  EXPECT_FALSE(report::whatIfPanelJson(p)["present"]);
  // Small requests only: no max_split_size_mb row, and a note says why.
  report::WhatIfPanel small = report::buildWhatIfPanel(two, 0, "x");
  ASSERT_TRUE(small.present);
  EXPECT_TRUE(
      report::whatIfSplitSizesMb(analysis::traceInput(two, 0), replay::AllocConf{}).empty());
  EXPECT_NE(small.notes[0].find("max_split_size_mb not tried"), std::string::npos);
}

}  // namespace
}  // namespace memforensics::analysis
