// validation_test.cc: hostile sizes, addresses and counters in replay and the allocator model
// (issue 11, classes 1 and 6): checked arithmetic, ranges that are empty or wrap 2^64, blocks
// outside their segment, overlapping segments, and a trace that cannot lead to the final state.
// Every anomaly here has severity error; the model never lays out a block outside its segment.
#include <gtest/gtest.h>

#include "fixtures/snapshot_builder.h"
#include "replay/allocator_model.h"
#include "replay/replay.h"

namespace memforensics::replay {
namespace {

using memforensics::testing::buildSnapshot;
using memforensics::testing::TBlock;
using memforensics::testing::TEvent;
using memforensics::testing::TSegment;
using memforensics::testing::TSnapshot;

constexpr uint64_t kB = 0x7f0000000000ULL;
constexpr uint64_t kMiB = 1048576;
constexpr uint64_t kMax = ~uint64_t{0};

uint64_t count(const DeviceSummary& s, AnomalyKind k) {
  return s.anomalies[static_cast<size_t>(k)].count;
}

DeviceSummary summarize(const format::Snapshot& snap, int64_t device = 0) {
  DeviceReplayer r(snap, device);
  return summarizeDevice(r);
}

// Every segment of a layout is a valid range, tiled by its blocks without gap, overlap or wrap.
void expectSaneLayout(const std::vector<ModelSegment>& layout, const std::string& where) {
  for (const auto& s : layout) {
    EXPECT_TRUE(validRange(s.address, s.size))
        << where << ": segment 0x" << std::hex << s.address << "+" << s.size;
    uint64_t pos = s.address;
    for (const auto& b : s.blocks) {
      EXPECT_EQ(b.address, pos) << where;
      EXPECT_TRUE(validRange(b.address, b.size))
          << where << ": block 0x" << std::hex << b.address << "+" << b.size;
      pos = b.address + b.size;
    }
    EXPECT_EQ(pos - s.address, s.size) << where << ": blocks do not add up to the segment";
  }
}

// Runs the model to every event (and the start state) and checks every layout on the way.
void expectSaneLayoutsEverywhere(const format::Snapshot& snap, int64_t device = 0) {
  DeviceAllocatorModel m(snap, device);
  expectSaneLayout(m.layoutAt(-1), "start");
  for (int64_t i = 0; i < static_cast<int64_t>(m.eventCount()); ++i) {
    expectSaneLayout(m.layoutAt(i), "after event " + std::to_string(i));
  }
}

TEST(ReplayValidation, EmptyAndWrappingUnmapsAreIgnoredWithAnError) {
  // issue 11 class 1: `blocks` segfaulted on this 2-event trace.
  TSnapshot t;
  t.traces.push_back({{"segment_unmap", 0, 0}, {"segment_unmap", kB, 1}});
  auto snap = buildSnapshot(t);
  auto s = summarize(snap);
  EXPECT_EQ(count(s, AnomalyKind::InvalidSegmentRange), 1u);
  EXPECT_EQ(s.anomalies[static_cast<size_t>(AnomalyKind::InvalidSegmentRange)].first_event, 0);
  EXPECT_EQ(anomalySeverity(AnomalyKind::InvalidSegmentRange), Severity::Error);
  EXPECT_EQ(s.start.reserved, 1u);  // the valid unmap: that byte was mapped before the trace
  EXPECT_EQ(s.final_replayed.reserved, 0u);
  expectSaneLayoutsEverywhere(snap);
  DeviceAllocatorModel m(snap, 0);
  for (const auto& seg : m.layoutAt(-1))
    EXPECT_NE(seg.address, 0u) << "the empty unmap at 0 made a segment";
}

TEST(ReplayValidation, UnmapAtZeroOnAnExpandableSegment) {
  TSnapshot t;
  t.segments.push_back(TSegment{0, kB, 0, "small", {TBlock{2 * kMiB, 0, "inactive", {}}}});
  t.traces.push_back({{"segment_unmap", 0, 0}});
  auto snap = buildSnapshot(t);
  snap.segments[0].is_expandable = true;
  auto s = summarize(snap);
  EXPECT_EQ(count(s, AnomalyKind::InvalidSegmentRange), 1u);
  EXPECT_EQ(s.start.reserved, 2 * kMiB);
  EXPECT_EQ(s.final_replayed.reserved, 2 * kMiB);
  EXPECT_TRUE(s.consistent);
  expectSaneLayoutsEverywhere(snap);
  DeviceAllocatorModel m(snap, 0);
  auto l = m.layoutAt(0);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].address, kB);
  EXPECT_EQ(l[0].size, 2 * kMiB);
  EXPECT_EQ(m.compareWithFinal(), "");
}

TEST(ReplayValidation, UnmapWhoseEndWrapsIsIgnored) {
  TSnapshot t;
  t.segments.push_back(TSegment{0, kB, 0, "small", {TBlock{2 * kMiB, 0, "inactive", {}}}});
  t.traces.push_back(
      {{"segment_unmap", kB, kMax - kB + 4097}, {"segment_unmap", kMax - 4095, 8192}});
  auto snap = buildSnapshot(t);
  snap.segments[0].is_expandable = true;
  auto s = summarize(snap);
  EXPECT_EQ(count(s, AnomalyKind::InvalidSegmentRange), 2u);
  EXPECT_EQ(s.start.reserved, 2 * kMiB);
  EXPECT_EQ(s.final_replayed.reserved, 2 * kMiB);
  expectSaneLayoutsEverywhere(snap);
  DeviceAllocatorModel m(snap, 0);
  const auto& c = m.runCheck();
  EXPECT_EQ(c.segment_events, 2u);
  EXPECT_EQ(c.segment_matches, 0u);  // ignored events are not predictions that matched
  EXPECT_EQ(m.compareWithFinal(), "");
}

TEST(ReplayValidation, CountersSaturateInsteadOfWrapping) {
  // Two allocs of 2^63: the requested and allocated counters would wrap to 0.
  TSnapshot t;
  t.traces.push_back({{"alloc", kB, uint64_t{1} << 63}, {"alloc", kB + 4096, uint64_t{1} << 63}});
  auto snap = buildSnapshot(t);
  auto s = summarize(snap);
  EXPECT_EQ(count(s, AnomalyKind::CounterOverflow), 2u);  // requested and allocated, at event 1
  EXPECT_EQ(s.anomalies[static_cast<size_t>(AnomalyKind::CounterOverflow)].first_event, 1);
  EXPECT_EQ(s.final_replayed.requested, kMax);
  EXPECT_EQ(s.final_replayed.allocated, kMax);
  EXPECT_EQ(s.peak_requested.bytes, kMax);
  EXPECT_EQ(s.final_replayed.active(), kMax);
  EXPECT_FALSE(s.consistent);
  EXPECT_TRUE(s.untrusted & kUntrustedPeaks);
  // The same segment of 2^63 bytes allocated twice (SegmentOverlap): reserved would wrap to 0;
  // the overlapping event is ignored, so the bytes are counted once.
  TSnapshot u;
  u.traces.push_back(
      {{"segment_alloc", 0, uint64_t{1} << 63}, {"segment_alloc", 0, uint64_t{1} << 63}});
  auto s2 = summarize(buildSnapshot(u));
  EXPECT_EQ(count(s2, AnomalyKind::SegmentOverlap), 1u);
  EXPECT_EQ(s2.final_replayed.reserved, uint64_t{1} << 63);
  EXPECT_EQ(s2.peak_reserved.bytes, uint64_t{1} << 63);
}

TEST(ReplayValidation, RoundSizeNeverWrapsBelowTheRequest) {
  uint32_t div[16] = {};
  EXPECT_EQ(roundSize(kMax, div), kMax);
  EXPECT_EQ(roundSize(kMax - 100, div), kMax);
  uint32_t four[16];
  for (auto& d : four) d = 4;
  EXPECT_GE(roundSize((uint64_t{1} << 63) + 1, four), (uint64_t{1} << 63) + 1);
  EXPECT_GE(roundSize(kMax - 5, four), kMax - 5);
}

TEST(ReplayValidation, RequestedAboveTheBlockSizeIsAnError) {
  // 10^12 requested bytes in a 512-byte block, in the final state and in the trace.
  TSnapshot t;
  t.segments.push_back(TSegment{0,
                                kB,
                                0,
                                "small",
                                {TBlock{512, 1000000000000ULL, "active_allocated", {}},
                                 TBlock{2 * kMiB - 512, 0, "inactive", {}}}});
  t.traces.push_back({{"alloc", kB, 1000000000000ULL}});
  auto snap = buildSnapshot(t);
  auto s = summarize(snap);
  EXPECT_EQ(count(s, AnomalyKind::RequestedExceedsBlock), 2u);  // the final block and the alloc
  EXPECT_EQ(s.final_file.requested, 512u);
  EXPECT_EQ(s.final_replayed.requested, 512u);
  EXPECT_EQ(s.peak_requested.bytes, 512u);
  EXPECT_EQ(anomalySeverity(AnomalyKind::RequestedExceedsBlock), Severity::Error);
}

TEST(ReplayValidation, BlocksThatWrapPastTheirSegmentAreDropped) {
  // Block sizes 2^64-1 and 1025 sum to 1024 modulo 2^64: the reader's cover check passes.
  TSnapshot t;
  t.segments.push_back(TSegment{
      0,
      kB,
      0,
      "small",
      {TBlock{kMax, 512, "active_allocated", {}}, TBlock{1025, 1025, "active_allocated", {}}}});
  auto snap = buildSnapshot(t);
  ASSERT_EQ(snap.segments[0].total_size, 1024u);
  auto s = summarize(snap);
  EXPECT_EQ(count(s, AnomalyKind::BlockOutsideSegment), 2u);
  EXPECT_EQ(s.final_file.reserved, 1024u);
  EXPECT_EQ(s.final_file.allocated, 0u);  // not 2^64-1 + 1025
  EXPECT_EQ(s.final_file.requested, 0u);
  expectSaneLayoutsEverywhere(snap);
  FinalState f = validateFinalState(snap, 0);
  ASSERT_EQ(f.segments.size(), 1u);
  EXPECT_TRUE(f.segments[0].blocks.empty());
}

TEST(ReplayValidation, OverlappingSegmentsAreCountedOnce) {
  TSnapshot t;
  t.segments.push_back(
      TSegment{0, kB, 0, "small", {TBlock{2 * kMiB, 2 * kMiB, "active_allocated", {}}}});
  t.segments.push_back(
      TSegment{0, kB + kMiB, 0, "small", {TBlock{2 * kMiB, 2 * kMiB, "active_allocated", {}}}});
  auto snap = buildSnapshot(t);
  auto s = summarize(snap);
  EXPECT_EQ(count(s, AnomalyKind::OverlappingSegments), 1u);
  EXPECT_EQ(s.final_file.reserved, 2 * kMiB);
  EXPECT_EQ(s.final_file.allocated, 2 * kMiB);
  DeviceAllocatorModel m(snap, 0);
  auto l = m.layoutAt(-1);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].address, kB);
  expectSaneLayout(l, "start");
}

TEST(ReplayValidation, SegmentWhoseEndWrapsIsIgnored) {
  TSnapshot t;
  t.segments.push_back(
      TSegment{0, kMax - kMiB + 1, 0, "small", {TBlock{2 * kMiB, 512, "active_allocated", {}}}});
  t.traces.push_back({{"segment_alloc", kMax - 4095, 2 * kMiB}});
  auto snap = buildSnapshot(t);
  auto s = summarize(snap);
  EXPECT_EQ(count(s, AnomalyKind::InvalidSegmentRange), 2u);  // the final segment and the event
  EXPECT_EQ(s.final_file.reserved, 0u);
  EXPECT_EQ(s.final_file.allocated, 0u);
  EXPECT_EQ(s.final_replayed.reserved, 0u);
  DeviceAllocatorModel m(snap, 0);
  EXPECT_TRUE(m.layoutAt(-1).empty());
  EXPECT_TRUE(m.layoutAt(0).empty());
}

TEST(ReplayValidation, TraceThatCannotReachTheFinalStateIsFlagged) {
  // Like drisspg's mini_snapshot: the trace stops before the state was taken, where all is free.
  TSnapshot t;
  t.segments.push_back(TSegment{0, kB, 0, "small", {TBlock{2 * kMiB, 0, "inactive", {}}}});
  t.traces.push_back(
      {{"segment_alloc", kB, 2 * kMiB}, {"alloc", kB, 4096}, {"alloc", kB + 4096, 512}});
  auto snap = buildSnapshot(t);
  auto s = summarize(snap);
  EXPECT_EQ(count(s, AnomalyKind::HistoryContradictsFinalState), 2u);
  EXPECT_EQ(s.anomalies[static_cast<size_t>(AnomalyKind::HistoryContradictsFinalState)].first_event,
            1);
  EXPECT_EQ(count(s, AnomalyKind::FinalStateMismatch), 1u);
  EXPECT_FALSE(s.consistent);
  EXPECT_EQ(untrustedNames(s.untrusted),
            (std::vector<std::string_view>{"start", "peaks", "final_replayed", "block_layout"}));
  EXPECT_EQ(s.final_file.requested, 0u);
  EXPECT_EQ(s.final_replayed.requested, 4608u);
  DeviceAllocatorModel m(snap, 0);
  m.runCheck();
  EXPECT_NE(m.compareWithFinal(), "");

  // A free of a block that is alive at the end, with no alloc after it, contradicts it too.
  TSnapshot u;
  u.segments.push_back(TSegment{
      0,
      kB,
      0,
      "small",
      {TBlock{512, 512, "active_allocated", {}}, TBlock{2 * kMiB - 512, 0, "inactive", {}}}});
  u.traces.push_back({{"free_requested", kB, 512}, {"free_completed", kB, 512}});
  auto s2 = summarize(buildSnapshot(u));
  EXPECT_GT(count(s2, AnomalyKind::HistoryContradictsFinalState), 0u);
  EXPECT_FALSE(s2.consistent);

  // The same events with a final state they lead to: consistent, nothing untrusted.
  TSnapshot v;
  v.segments.push_back(TSegment{
      0,
      kB,
      0,
      "small",
      {TBlock{4096, 4096, "active_allocated", {}}, TBlock{512, 512, "active_allocated", {}},
       TBlock{2 * kMiB - 4608, 0, "inactive", {}}}});
  v.traces = t.traces;
  auto s3 = summarize(buildSnapshot(v));
  EXPECT_EQ(count(s3, AnomalyKind::HistoryContradictsFinalState), 0u);
  EXPECT_EQ(count(s3, AnomalyKind::FinalStateMismatch), 0u);
  EXPECT_TRUE(s3.consistent);
  EXPECT_EQ(s3.untrusted, 0);
}

}  // namespace
}  // namespace memforensics::replay
