// blocks_test.cc: layout metrics at an event and the OOM fragmentation verdict, with exact numbers
// on fabricated complete histories.
#include "analysis/session/blocks.h"

#include <gtest/gtest.h>

#include <sstream>

#include "cli/at_option.h"  // --at is parsed by the CLI (header-only)
#include "common/format_bytes.h"
#include "fixtures/snapshot_builder.h"
#include "format/load/load.h"
#include "report/render_blocks.h"

namespace memforensics::analysis {
namespace {

using memforensics::testing::buildSnapshot;
using memforensics::testing::TBlock;
using memforensics::testing::TEvent;
using memforensics::testing::TSegment;
using memforensics::testing::TSnapshot;

constexpr uint64_t kB = 0x7f0000000000ULL;
constexpr uint64_t kMiB = 1048576;

// One 20 MiB segment: 6 MiB free | 2 MiB live | 6 MiB free | 2 MiB live | 4 MiB free, then an OOM.
format::Snapshot fragmented(uint64_t oom_request) {
  TSnapshot t;
  t.traces.push_back({
      {"segment_alloc", kB, 20 * kMiB, 0, 10},
      {"alloc", kB, 6 * kMiB, 0, 11},
      {"alloc", kB + 6 * kMiB, 2 * kMiB - 100, 0, 12},
      {"alloc", kB + 8 * kMiB, 6 * kMiB, 0, 13},
      {"alloc", kB + 14 * kMiB, 2 * kMiB - 100, 0, 14},
      {"free_requested", kB, 6 * kMiB, 0, 15},
      {"free_completed", kB, 6 * kMiB, 0, 15},
      {"free_requested", kB + 8 * kMiB, 6 * kMiB, 0, 16},
      {"free_completed", kB + 8 * kMiB, 6 * kMiB, 0, 16},
      {"oom", 123 * kMiB, oom_request, 0, 17},
  });
  return buildSnapshot(t);
}

TEST(BlocksAt, Parses) {
  EXPECT_EQ(cli::parseAtOption("peak")->kind, BlocksAt::Kind::Peak);
  EXPECT_EQ(cli::parseAtOption("oom")->kind, BlocksAt::Kind::Oom);
  auto e = cli::parseAtOption("42");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->kind, BlocksAt::Kind::Event);
  EXPECT_EQ(e->value, 42);
  auto t = cli::parseAtOption("t1700000000");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->kind, BlocksAt::Kind::Time);
  EXPECT_EQ(t->value, 1700000000);
  EXPECT_FALSE(cli::parseAtOption("t").ok());
  EXPECT_FALSE(cli::parseAtOption("12x").ok());
  EXPECT_FALSE(cli::parseAtOption("").ok());
}

// The relative times analyze prints (formatDurationUs after "t+") name the end of the interval
// their rounding stands for, in whole microseconds.
TEST(BlocksAt, ParsesThePrintedRelativeTimes) {
  auto us = [](std::string_view s) -> int64_t {
    auto a = cli::parseAtOption(s);
    EXPECT_TRUE(a.ok()) << s;
    if (!a.ok()) return -1;
    EXPECT_EQ(a->kind, BlocksAt::Kind::Elapsed) << s;
    return a->value;
  };
  EXPECT_EQ(us("t+1.442 s"), 1'442'500);
  EXPECT_EQ(us("t+1.442s"), 1'442'500);
  EXPECT_EQ(us("t+105.1ms"), 105'150);
  EXPECT_EQ(us("t+105.1 ms"), 105'150);
  EXPECT_EQ(us("t+250us"), 250);
  EXPECT_EQ(us("t+250 us"), 250);
  EXPECT_EQ(us("t+0.000001 s"), 1);  // 1.5 us, floored
  EXPECT_EQ(us("t+2s"), 2'000'000);  // a whole number is exact
  EXPECT_EQ(us("t+2.s"), 2'000'000);
  EXPECT_EQ(us("t+00000000000000000001s"), 1'000'000);  // leading zeros are not digits
  EXPECT_EQ(us("t+0.000000000000000001s"), 0);
  EXPECT_EQ(us("t+999999999999.999 s"), 999'999'999'999'999'500);
  for (const int64_t t : {0LL, 1LL, 999LL, 1000LL, 105'149LL, 999'999LL, 1'000'000LL, 1'442'499LL,
                          86'400'000'000LL}) {
    // What analyze prints for a moment t after the first event reads back at or after t, and
    // less than one printed unit after it.
    const std::string printed = "t+" + formatDurationUs(t);
    const int64_t back = us(printed);
    EXPECT_GE(back, t) << printed;
    const int64_t unit = t < 1000 ? 1 : t < 1'000'000 ? 100 : 1000;
    EXPECT_LT(back - t, unit) << printed;
  }
  for (const char* bad : {"t+", "t+s", "t+1.5h", "t+1.5 h", "t+-1s", "t+1..5s", "t+1.5  s",
                          "t+1234567890123456789 us", "t+999999999999999999 s", "t+.s", "t+.",
                          "t+1.0000000000000000000 s"}) {
    EXPECT_FALSE(cli::parseAtOption(bad).ok()) << bad;
  }
}

TEST(Blocks, OomThatFitsTheFreeBytesButNoBlockIsFragmentation) {
  auto snap = fragmented(8 * kMiB);
  auto r = computeBlocks(snap, std::nullopt, {BlocksAt::Kind::Oom, 0});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->event, 9);
  EXPECT_EQ(r->time_us, 17);
  EXPECT_TRUE(r->layout_exact);
  ASSERT_EQ(r->segments.size(), 1u);
  const auto& s = r->segments[0];
  ASSERT_EQ(s.segment.blocks.size(), 5u);
  EXPECT_EQ(s.free_bytes, 16 * kMiB);
  EXPECT_EQ(s.largest_free, 6 * kMiB);
  EXPECT_EQ(s.free_blocks, 3u);
  EXPECT_EQ(s.allocated_bytes, 4 * kMiB);
  EXPECT_EQ(s.internal_waste, 200u);
  EXPECT_EQ(r->reserved_bytes, 20 * kMiB);
  EXPECT_EQ(r->requested_bytes, 4 * kMiB - 200);
  EXPECT_DOUBLE_EQ(r->external_fragmentation, 1.0 - 6.0 / 16.0);
  ASSERT_EQ(r->by_pool.size(), 1u);
  EXPECT_EQ(r->by_pool[0].pool, "large");
  EXPECT_EQ(r->by_pool[0].largest_free, 6 * kMiB);
  ASSERT_EQ(r->by_stream.size(), 1u);
  EXPECT_EQ(r->by_stream[0].free_bytes, 16 * kMiB);
  ASSERT_TRUE(r->oom.has_value());
  EXPECT_EQ(r->oom->request_bytes, 8 * kMiB);
  EXPECT_EQ(r->oom->device_free, 123 * kMiB);
  EXPECT_EQ(r->oom->pool_free, 16 * kMiB);
  EXPECT_EQ(r->oom->pool_largest, 6 * kMiB);
  EXPECT_TRUE(r->oom->fits_total);
  EXPECT_FALSE(r->oom->fits_block);
  EXPECT_TRUE(r->oom->fragmentation);
}

TEST(Blocks, OomThatFitsABlockOrExceedsTheFreeBytesIsNotFragmentation) {
  auto fits = computeBlocks(fragmented(5 * kMiB), std::nullopt, {BlocksAt::Kind::Oom, 0});
  ASSERT_TRUE(fits.ok());
  ASSERT_TRUE(fits->oom.has_value());
  EXPECT_TRUE(fits->oom->fits_block);
  EXPECT_FALSE(fits->oom->fragmentation);
  auto big = computeBlocks(fragmented(40 * kMiB), std::nullopt, {BlocksAt::Kind::Oom, 0});
  ASSERT_TRUE(big.ok());
  EXPECT_FALSE(big->oom->fits_total);
  EXPECT_FALSE(big->oom->fragmentation);
}

TEST(Blocks, PeakEventAndTimeSelectTheRightState) {
  auto snap = fragmented(8 * kMiB);
  auto peak = computeBlocks(snap, 0, {BlocksAt::Kind::Peak, 0});
  ASSERT_TRUE(peak.ok());
  EXPECT_EQ(peak->event, 4);  // all four allocations alive
  EXPECT_EQ(peak->free_bytes, 4 * kMiB);
  EXPECT_DOUBLE_EQ(peak->external_fragmentation, 0.0);
  EXPECT_FALSE(peak->oom.has_value());
  auto start = computeBlocks(snap, 0, {BlocksAt::Kind::Event, -1});
  ASSERT_TRUE(start.ok());
  EXPECT_TRUE(start->segments.empty());
  auto t = computeBlocks(snap, 0, {BlocksAt::Kind::Time, 12});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->event, 2);
  EXPECT_EQ(t->allocated_bytes, 8 * kMiB);
  // The first event is at 10 us: t+2us is the same moment as t12.
  auto since = computeBlocks(snap, 0, {BlocksAt::Kind::Elapsed, 2});
  ASSERT_TRUE(since.ok());
  EXPECT_EQ(since->event, 2);
  auto far = computeBlocks(snap, 0, {BlocksAt::Kind::Elapsed, INT64_MAX});
  ASSERT_TRUE(far.ok());
  EXPECT_EQ(far->event, 9);  // no overflow past the last event
  EXPECT_FALSE(computeBlocks(snap, 0, {BlocksAt::Kind::Event, 10}).ok());
  EXPECT_FALSE(computeBlocks(snap, 3, {BlocksAt::Kind::Peak, 0}).ok());
}

TEST(Blocks, OomIsAnErrorWithoutOne) {
  TSnapshot t;
  t.traces.push_back({{"segment_alloc", kB, 2 * kMiB, 0, 1}, {"alloc", kB, 512, 0, 2}});
  auto r = computeBlocks(buildSnapshot(t), std::nullopt, {BlocksAt::Kind::Oom, 0});
  EXPECT_FALSE(r.ok());
}

// Renders `blocks` (text and JSON) at the start state and after every event; the sums of every
// segment must be its size. Returns the results for further checks.
std::vector<BlocksResult> blocksEverywhere(const format::Snapshot& snap) {
  std::vector<BlocksResult> out;
  const auto n = static_cast<int64_t>(snap.trace(0).size());
  for (int64_t i = -1; i < n; ++i) {
    auto r = computeBlocks(snap, 0, {BlocksAt::Kind::Event, i});
    EXPECT_TRUE(r.ok());
    if (!r.ok()) continue;
    std::ostringstream text, json;
    report::renderBlocksText(*r, text);
    report::renderBlocksJson(*r, json);
    EXPECT_NE(text.str().find("legend:"), std::string::npos);
    for (const auto& sb : r->segments) {
      EXPECT_EQ(sb.allocated_bytes + sb.pending_bytes + sb.free_bytes, sb.segment.size)
          << "event " << i;
    }
    out.push_back(std::move(*r));
  }
  return out;
}

// issue 11 class 1: each of these made `blocks` segfault in report::blocksMap (an index outside
// the segment, from a block the model had laid out outside it).
TEST(BlocksHostile, EmptyAndWrappingUnmapsDoNotCrash) {
  TSnapshot t;
  t.traces.push_back({{"segment_unmap", 0, 0}, {"segment_unmap", kB, 1}});
  auto rs = blocksEverywhere(buildSnapshot(t));
  ASSERT_EQ(rs.size(), 3u);
  ASSERT_FALSE(rs[0].errors.empty());
  EXPECT_EQ(rs[0].errors[0].id, "invalid_segment_range");
  EXPECT_EQ(rs[0].errors[0].first_event, 0);

  TSnapshot e;
  e.segments.push_back(TSegment{0, kB, 0, "small", {TBlock{2 * kMiB, 0, "inactive", {}}}});
  e.traces.push_back({{"segment_unmap", 0, 0}});
  auto snap = buildSnapshot(e);
  snap.segments[0].is_expandable = true;
  for (const auto& r : blocksEverywhere(snap)) {
    ASSERT_EQ(r.segments.size(), 1u);
    EXPECT_EQ(r.reserved_bytes, 2 * kMiB);
  }
  snap.events[snap.trace_begin[0]].addr = kB;
  snap.events[snap.trace_begin[0]].size = ~uint64_t{0} - kB + 4097;  // addr + size wraps 2^64
  for (const auto& r : blocksEverywhere(snap)) EXPECT_EQ(r.reserved_bytes, 2 * kMiB);
}

TEST(BlocksHostile, BlocksMapClampsBlocksOutsideTheSegment) {
  replay::ModelSegment s;
  s.address = kB;
  s.size = 2 * kMiB;
  s.blocks.push_back({kB, kMiB, 512, format::kNoStack, -1, format::BlockState::ActiveAllocated});
  s.blocks.push_back({kB + kMiB, kMiB, 0, format::kNoStack, -1, format::BlockState::Inactive});
  s.blocks.push_back(
      {0, 4096, 4096, format::kNoStack, -1, format::BlockState::ActiveAllocated});  // before it
  s.blocks.push_back(
      {kB + 2 * kMiB, 4096, 4096, format::kNoStack, -1, format::BlockState::ActiveAllocated});
  s.blocks.push_back(
      {kB + kMiB, ~uint64_t{0}, 1, format::kNoStack, -1, format::BlockState::ActivePendingFree});
  EXPECT_EQ(report::blocksMap(s, 8), "####....");
  EXPECT_EQ(report::blocksMap(s, 0), "");
}

TEST(BlocksHostile, OverlappingSegmentsAreCountedOnce) {
  TSnapshot t;
  t.segments.push_back(
      TSegment{0, kB, 0, "small", {TBlock{2 * kMiB, 2 * kMiB, "active_allocated", {}}}});
  t.segments.push_back(
      TSegment{0, kB + kMiB, 0, "small", {TBlock{2 * kMiB, 2 * kMiB, "active_allocated", {}}}});
  auto r = computeBlocks(buildSnapshot(t), 0, {BlocksAt::Kind::Event, -1});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->segments.size(), 1u);
  EXPECT_EQ(r->reserved_bytes, 2 * kMiB);
  EXPECT_EQ(r->allocated_bytes, 2 * kMiB);
  ASSERT_EQ(r->errors.size(), 1u);
  EXPECT_EQ(r->errors[0].id, "overlapping_segments");
}

TEST(BlocksHostile, ATraceThatCannotReachTheFinalStateMarksTheLayoutUntrusted) {
  TSnapshot t;
  t.segments.push_back(TSegment{0, kB, 0, "small", {TBlock{2 * kMiB, 0, "inactive", {}}}});
  t.traces.push_back({{"segment_alloc", kB, 2 * kMiB}, {"alloc", kB, 4096}});
  auto r = computeBlocks(buildSnapshot(t), 0, {BlocksAt::Kind::Event, 1});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->consistent);
  EXPECT_FALSE(r->layout_exact);
  EXPECT_TRUE(r->untrusted & replay::kUntrustedBlockLayout);
  std::ostringstream text, json;
  report::renderBlocksText(*r, text);
  report::renderBlocksJson(*r, json);
  EXPECT_NE(text.str().find("UNTRUSTED"), std::string::npos) << text.str();
  EXPECT_NE(json.str().find("\"consistent\":false"), std::string::npos);
  EXPECT_NE(json.str().find("\"block_layout\""), std::string::npos);
}

// A ring buffer of one entry: the layout is the file's own, but the history cannot explain it, and
// blocks says so next to it (the same rule as analyze's incomplete_history); a complete history
// says nothing more.
TEST(Blocks, AHistoryThatCannotExplainTheStateIsSaidNextToTheLayout) {
  const std::string dir = std::string(MEMF_SOURCE_DIR) + "/snapshots/scenarios/";
  auto ring = format::loadSnapshotFile(dir + "ring_of_1.pickle");
  ASSERT_TRUE(ring.ok());
  const auto at = cli::parseAtOption("peak");
  ASSERT_TRUE(at.ok());
  auto r = computeBlocks(*ring, std::nullopt, at.value());
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->history_gap.find("cannot explain"), std::string::npos) << r->history_gap;
  std::ostringstream text;
  report::renderBlocksText(*r, text);
  EXPECT_NE(text.str().find("\nhistory: the history cannot explain"), std::string::npos)
      << text.str();
  auto clean = format::loadSnapshotFile(dir + "clean_adam.pickle");
  ASSERT_TRUE(clean.ok());
  auto c = computeBlocks(*clean, std::nullopt, at.value());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->history_gap, "");
  std::ostringstream ctext;
  report::renderBlocksText(*c, ctext);
  EXPECT_EQ(ctext.str().find("\nhistory:"), std::string::npos);
}

}  // namespace
}  // namespace memforensics::analysis
