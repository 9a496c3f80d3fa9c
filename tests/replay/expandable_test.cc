// expandable_test.cc: the allocator model on fabricated expandable-segment snapshots
// (tests/replay/data/exp_*.pickle, written by tools/make_expandable.py, an independent simulator
// of CUDACachingAllocator.cpp with expandable_segments:True). On each device the model must predict
// every alloc address and every segment event, and its layout after the last event must equal the
// file's final segments block by block; replay must find the history consistent.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <set>
#include <string>

#include "format/load/load.h"
#include "replay/allocator_model.h"
#include "replay/replay.h"

namespace memforensics::replay {
namespace {

namespace fs = std::filesystem;
using format::Action;

fs::path dataDir() {
  return fs::path(MEMF_SOURCE_DIR) / "tests" / "replay" / "data";
}

format::Snapshot load(const std::string& name) {
  auto snap = format::loadSnapshotFile((dataDir() / (name + ".pickle")).string());
  EXPECT_TRUE(snap.ok()) << name;
  return snap.ok() ? std::move(*snap) : format::Snapshot{};
}

// What a trace exercises, counted from its events.
struct Features {
  uint64_t maps = 0, unmaps = 0, ooms = 0, multi_maps = 0, maps_then_unmaps = 0;
  uint64_t small_segments = 0, large_segments = 0;
  bool starts_with_map = false;
};

Features featuresOf(const format::Snapshot& snap, int64_t d) {
  Features f;
  auto ev = snap.trace(static_cast<size_t>(d));
  f.starts_with_map = !ev.empty() && ev[0].action == Action::SegmentMap;
  int run = 0;  // segment_maps since the last alloc/oom/unmap
  bool mapped_before_unmap = false;
  for (const auto& e : ev) {
    switch (e.action) {
      case Action::SegmentMap:
        ++f.maps;
        if (++run == 2) ++f.multi_maps;
        mapped_before_unmap = true;
        break;
      case Action::SegmentUnmap:
        ++f.unmaps;
        if (mapped_before_unmap && run > 0) ++f.maps_then_unmaps;
        run = 0;
        mapped_before_unmap = false;
        break;
      case Action::Oom:
        ++f.ooms;
        run = 0;
        mapped_before_unmap = false;
        break;
      case Action::Alloc:
        run = 0;
        mapped_before_unmap = false;
        break;
      default:
        break;
    }
  }
  for (const auto& s : snap.segments) {
    if (s.device != d) continue;
    (s.is_large ? f.large_segments : f.small_segments) += 1;
  }
  return f;
}

// The model's check and its final layout against the file, with the first mismatches printed.
void expectExact(const format::Snapshot& snap, const std::string& name) {
  ASSERT_FALSE(snap.devices().empty()) << name;
  for (int64_t d : snap.devices()) {
    DeviceAllocatorModel m(snap, d);
    const ModelCheck& c = m.runCheck();
    std::cout << name << " device " << d << ": allocs " << c.alloc_matches << "/" << c.allocs
              << ", segment events " << c.segment_matches << "/" << c.segment_events << "\n";
    for (const auto& mm : c.first_mismatches) {
      std::cout << "  event " << mm.event << " " << format::actionName(mm.action) << " recorded 0x"
                << std::hex << mm.recorded << " predicted 0x" << mm.predicted << std::dec << ": "
                << mm.why << "\n";
    }
    EXPECT_GT(c.allocs, 0u) << name;
    EXPECT_EQ(c.alloc_matches, c.allocs) << name << " device " << d;
    EXPECT_EQ(c.segment_matches, c.segment_events) << name << " device " << d;
    EXPECT_EQ(m.compareWithFinal(), "") << name << " device " << d;
    const ModelVerdict v = modelVerdict(m);
    EXPECT_TRUE(v.exact) << name << " device " << d << ": " << v.why;

    DeviceReplayer rep(snap, d);
    const DeviceSummary sum = summarizeDevice(rep);
    EXPECT_TRUE(sum.consistent) << name << " device " << d;
  }
}

TEST(ExpandableSegments, GrowingOneReservationWithBlocksAcrossMapBoundaries) {
  const auto snap = load("exp_grow");
  const Features f = featuresOf(snap, 0);
  EXPECT_GE(f.maps, 10u);
  EXPECT_GE(f.multi_maps, 1u);  // one malloc mapping several times (free -> unmapped -> ...)
  expectExact(snap, "exp_grow");
}

TEST(ExpandableSegments, SmallAndLargePoolsOnTwoStreams) {
  const auto snap = load("exp_pools_streams");
  const Features f = featuresOf(snap, 0);
  EXPECT_GE(f.small_segments, 2u);  // a small-pool segment is never taken for a large one
  EXPECT_GE(f.large_segments, 2u);
  std::set<int64_t> streams;
  for (const auto& s : snap.segments) streams.insert(s.stream);
  EXPECT_EQ(streams.size(), 2u);
  expectExact(snap, "exp_pools_streams");
}

TEST(ExpandableSegments, FailedMapsCacheFlushesAndOoms) {
  const auto snap = load("exp_oom_flush");
  const Features f = featuresOf(snap, 0);
  EXPECT_GE(f.ooms, 5u);
  EXPECT_GE(f.unmaps, 20u);
  EXPECT_GE(f.maps_then_unmaps, 1u);  // a map of a malloc that failed later, then the flush
  expectExact(snap, "exp_oom_flush");
}

TEST(ExpandableSegments, RingBufferTracesThatStartWithAMap) {
  const auto snap = load("exp_ring");
  ASSERT_EQ(snap.devices().size(), 2u);
  for (int64_t d : snap.devices()) {
    const Features f = featuresOf(snap, d);
    EXPECT_TRUE(f.starts_with_map) << d;
    EXPECT_GE(f.unmaps, 5u) << d;
  }
  expectExact(snap, "exp_ring");
}

}  // namespace
}  // namespace memforensics::replay
