// expandable_test.cc: the allocator model on fabricated expandable-segment snapshots
// (tests/replay/data/exp_*.pickle, written by tools/make_expandable.py, an independent simulator
// of CUDACachingAllocator.cpp with expandable_segments:True). On each device the model must predict
// every alloc address and every segment event, and its layout after the last event must equal the
// file's final segments block by block; replay must find the history consistent.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "fixtures/snapshot_builder.h"
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
  uint64_t retried_maps = 0;  // map, unmaps (the OOM retry's flush), map again, alloc
  uint64_t small_segments = 0, large_segments = 0;
  bool starts_with_map = false;
};

Features featuresOf(const format::Snapshot& snap, int64_t d) {
  Features f;
  auto ev = snap.trace(static_cast<size_t>(d));
  f.starts_with_map = !ev.empty() && ev[0].action == Action::SegmentMap;
  int run = 0;  // segment_maps since the last alloc/oom/unmap
  bool mapped_before_unmap = false;
  bool flushed_after_map = false, retry_pending = false;
  for (const auto& e : ev) {
    switch (e.action) {
      case Action::SegmentMap:
        ++f.maps;
        if (flushed_after_map) retry_pending = true;
        if (++run == 2) ++f.multi_maps;
        mapped_before_unmap = true;
        break;
      case Action::SegmentUnmap:
        ++f.unmaps;
        if (mapped_before_unmap && run > 0) {
          ++f.maps_then_unmaps;
          flushed_after_map = true;
        }
        run = 0;
        mapped_before_unmap = false;
        break;
      case Action::Oom:
        ++f.ooms;
        retry_pending = flushed_after_map = false;
        run = 0;
        mapped_before_unmap = false;
        break;
      case Action::Alloc:
        if (retry_pending) ++f.retried_maps;
        retry_pending = flushed_after_map = false;
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

    // No phantom start state: the mapped bytes when the trace begins, as the simulator knew them,
    // in replay's start state and in the model's start layout.
    std::ifstream in(dataDir() / (name + ".expected.json"));
    const auto expected = nlohmann::json::parse(in);
    const uint64_t start = expected.at("start_reserved").at(static_cast<size_t>(d)).get<uint64_t>();
    EXPECT_EQ(rep.startCounters().reserved, start) << name << " device " << d;
    uint64_t mapped = 0;
    for (const auto& seg : m.layoutAt(-1)) mapped += seg.size;
    EXPECT_EQ(mapped, start) << name << " device " << d;
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
  EXPECT_GE(f.retried_maps, 1u);      // ... and the retry mapping again and succeeding
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

// Random configurations (three streams, physical limits, ring-buffer starts) where a new
// reservation begins inside the unmapped tail the model guessed for an older one: a map never
// starts inside an unmapped block, so the older reservation ended there.
TEST(ExpandableSegments, ReservationsWhoseEndIsNotInTheFile) {
  const auto snap = load("exp_random");
  ASSERT_EQ(snap.devices().size(), 2u);
  expectExact(snap, "exp_random");
}

// CCA release_blocks -> unmap_block unmaps every completely free page of a free block, not part of
// them: an unmap of one of two free pages is flagged, the full range is predicted.
TEST(ExpandableSegments, UnmapMustBeEveryFullyFreePageOfTheBlock) {
  constexpr uint64_t e = 0x7f0000000000ULL, kMiB = 1048576;
  auto run = [&](uint64_t unmap_addr, uint64_t unmap_size) {
    memforensics::testing::TSnapshot t;
    t.traces.push_back({{"segment_map", e, 60 * kMiB, 0},
                        {"alloc", e, 5 * kMiB, 0},
                        {"segment_unmap", unmap_addr, unmap_size, 0}});
    auto snap = memforensics::testing::buildSnapshot(t);
    snap.settings.present = true;
    snap.settings.expandable_segments = true;
    DeviceAllocatorModel m(snap, 0);
    return m.runCheck();
  };
  const ModelCheck full = run(e + 20 * kMiB, 40 * kMiB);  // pages 1 and 2: [e+20, e+60) MiB
  EXPECT_EQ(full.segment_matches, 2u);
  const ModelCheck part = run(e + 20 * kMiB, 20 * kMiB);
  EXPECT_EQ(part.segment_events, 2u);
  EXPECT_EQ(part.segment_matches, 1u);
  ASSERT_FALSE(part.first_mismatches.empty());
  EXPECT_NE(part.first_mismatches[0].why.find("unmaps 41943040 bytes"), std::string::npos)
      << part.first_mismatches[0].why;
}

// CCA get_free_block with expandable segments turned off (after some were made): a free block of
// an expandable segment is never handed out, a new segment is allocated instead.
TEST(ExpandableSegments, TurnedOffTheirFreeBlocksAreNotReused) {
  constexpr uint64_t e = 0x7f0000000000ULL, seg = 0x7f4000000000ULL, kMiB = 1048576;
  memforensics::testing::TSnapshot t;
  t.traces.push_back({{"segment_map", e, 20 * kMiB, 0},
                      {"alloc", e, 5 * kMiB, 0},
                      {"free_requested", e, 5 * kMiB, 0},
                      {"free_completed", e, 5 * kMiB, 0},
                      {"segment_alloc", seg, 20 * kMiB, 0},
                      {"alloc", seg, 5 * kMiB, 0}});
  auto snap = memforensics::testing::buildSnapshot(t);
  snap.settings.present = true;
  snap.settings.expandable_segments = false;  // as the snapshot records it at the end
  DeviceAllocatorModel m(snap, 0);
  const ModelCheck& c = m.runCheck();
  for (const auto& mm : c.first_mismatches) ADD_FAILURE() << mm.event << ": " << mm.why;
  EXPECT_EQ(c.alloc_matches, 2u);
  EXPECT_EQ(c.segment_matches, c.segment_events);
}

// Hostile input: a reservation at the top of the address space, unmaps that are not pages of any
// free block, a map of another pool inside a reservation: counted as mismatches, never a wrap.
TEST(ExpandableSegments, HostileEventsAtTheTopOfTheAddressSpace) {
  constexpr uint64_t kMiB = 1048576, top = ~uint64_t{0} - 60 * kMiB + 1;
  memforensics::testing::TSnapshot t;
  t.traces.push_back({{"segment_map", top, 40 * kMiB, 0},
                      {"alloc", top, 512, 0},
                      {"free_requested", top, 512, 0},
                      {"free_completed", top, 512, 0},
                      {"segment_unmap", top + 512, 20 * kMiB, 0},     // not page aligned
                      {"segment_unmap", top, 40 * kMiB, 0},           // the whole free block
                      {"segment_map", top + 20 * kMiB, 2 * kMiB, 0},  // small pool, same place
                      {"alloc", top + 20 * kMiB, 4096, 0},
                      {"segment_unmap", top + 59 * kMiB, ~uint64_t{0}, 0}});  // wraps
  auto snap = memforensics::testing::buildSnapshot(t);
  snap.settings.present = true;
  snap.settings.expandable_segments = true;
  DeviceAllocatorModel m(snap, 0);
  const ModelCheck& c = m.runCheck();
  EXPECT_EQ(c.allocs, 2u);
  EXPECT_EQ(c.segment_events, 5u);
  EXPECT_LT(c.segment_matches, c.segment_events);
  for (const auto& seg : m.layout()) {
    EXPECT_GE(seg.address + seg.size, seg.address);  // no wrap
    uint64_t sum = 0;
    for (const auto& b : seg.blocks) sum += b.size;
    EXPECT_EQ(sum, seg.size);
  }
  EXPECT_FALSE(verifyAllocatorModel(snap, 0).exact);
}

}  // namespace
}  // namespace memforensics::replay
