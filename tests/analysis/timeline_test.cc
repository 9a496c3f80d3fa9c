// timeline_test.cc: exact watermark series, downsampling that keeps peaks and OOMs, breakdowns.
#include "analysis/session/timeline.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "fixtures/snapshot_builder.h"

namespace memforensics::analysis {
namespace {

using memforensics::testing::buildSnapshot;
using memforensics::testing::TEvent;
using memforensics::testing::TSnapshot;

constexpr uint64_t kBase = 0x7f0000000000ULL;
constexpr uint64_t k20M = 20971520;

TEvent ev(const char* action, uint64_t addr, uint64_t size, int64_t stream = 0, int64_t t = -1) {
  TEvent e;
  e.action = action;
  e.addr = addr;
  e.size = size;
  e.stream = stream;
  e.time_us = t;
  return e;
}

TEST(Timeline, ExactSeries) {
  TSnapshot t;
  t.segments.push_back({0, kBase, 0, "large", {{k20M, 0, "inactive", {}}}});
  t.traces.push_back({
      ev("segment_alloc", kBase, k20M, 0, 100),   // 0
      ev("alloc", kBase, 1000, 0, 110),           // 1
      ev("alloc", kBase + 1024, 3000, 0, 120),    // 2
      ev("free_requested", kBase, 1000, 0, 130),  // 3
      ev("oom", 5000, 1 << 30, 0, 140),           // 4
      ev("free_completed", kBase, 1000, 0, 150),  // 5
      ev("free_requested", kBase + 1024, 3000, 0, 160),
      ev("free_completed", kBase + 1024, 3000, 0, 170),
  });
  auto snap = buildSnapshot(t);
  auto r = computeTimeline(snap);
  ASSERT_EQ(r.devices.size(), 1u);
  const auto& d = r.devices[0];
  EXPECT_FALSE(d.downsampled);
  EXPECT_TRUE(d.has_times);
  ASSERT_EQ(d.points.size(), 9u);  // start state + 8 events
  struct Row {
    int64_t event, time;
    uint64_t reserved, allocated, requested, pending;
  };
  const Row want[] = {{-1, -1, 0, 0, 0, 0},
                      {0, 100, k20M, 0, 0, 0},
                      {1, 110, k20M, 1024, 1000, 0},
                      {2, 120, k20M, 4096, 4000, 0},
                      {3, 130, k20M, 3072, 4000, 1024},
                      {4, 140, k20M, 3072, 4000, 1024},
                      {5, 150, k20M, 3072, 3000, 0},
                      {6, 160, k20M, 0, 3000, 3072},
                      {7, 170, k20M, 0, 0, 0}};
  for (size_t i = 0; i < 9; ++i) {
    const auto& p = d.points[i];
    EXPECT_EQ(p.event, want[i].event) << i;
    EXPECT_EQ(p.time_us, want[i].time) << i;
    EXPECT_EQ(p.at.reserved, want[i].reserved) << i;
    EXPECT_EQ(p.at.allocated, want[i].allocated) << i;
    EXPECT_EQ(p.at.requested, want[i].requested) << i;
    EXPECT_EQ(p.at.pending, want[i].pending) << i;
  }
  EXPECT_EQ(d.peak_requested.bytes, 4000u);
  EXPECT_EQ(d.peak_requested.event, 2);
  EXPECT_EQ(d.peak_requested.time_us, 120);
  EXPECT_EQ(d.peak_pending_bytes, 3072u);
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].event, 4);
  EXPECT_TRUE(d.streams.empty());
  EXPECT_TRUE(d.pools.empty());
  EXPECT_TRUE(d.phases.empty());
}

TEST(Timeline, DownsamplingKeepsPeaksAndEveryOom) {
  TSnapshot t;
  t.segments.push_back({0, kBase, 0, "large", {{k20M, 0, "inactive", {}}}});
  std::vector<TEvent> tr = {ev("segment_alloc", kBase, k20M)};
  // A saw-tooth of small allocations, one spike (the peak) and three OOMs in between.
  int64_t spike_event = -1;
  std::vector<int64_t> oom_events;
  for (int i = 0; i < 500; ++i) {
    uint64_t size = 512 * (1 + i % 7);
    if (i == 333) {
      size = 5 << 20;
      spike_event = static_cast<int64_t>(tr.size());
    }
    tr.push_back(ev("alloc", kBase, size));
    if (i % 150 == 77) {
      oom_events.push_back(static_cast<int64_t>(tr.size()));
      tr.push_back(ev("oom", 0, 1 << 30));
    }
    tr.push_back(ev("free_requested", kBase, size));
    tr.push_back(ev("free_completed", kBase, size));
  }
  t.traces.push_back(tr);
  auto snap = buildSnapshot(t);
  TimelineOptions opt;
  opt.max_points = 20;
  auto r = computeTimeline(snap, opt);
  ASSERT_EQ(r.devices.size(), 1u);
  const auto& d = r.devices[0];
  EXPECT_TRUE(d.downsampled);
  EXPECT_EQ(d.total_points, tr.size() + 1);
  EXPECT_EQ(d.bucket_size, (tr.size() + 1 + 19) / 20);
  EXPECT_LE(d.points.size(), 20u * 10 + oom_events.size());
  EXPECT_LT(d.points.size(), tr.size() / 4);
  EXPECT_TRUE(std::is_sorted(d.points.begin(), d.points.end(),
                             [](const auto& a, const auto& b) { return a.event < b.event; }));
  EXPECT_EQ(d.peak_requested.event, spike_event);
  EXPECT_EQ(d.peak_requested.bytes, 5u << 20);
  auto at = [&](int64_t e) {
    return std::find_if(d.points.begin(), d.points.end(),
                        [&](const auto& p) { return p.event == e; });
  };
  auto peak = at(spike_event);
  ASSERT_NE(peak, d.points.end());
  EXPECT_EQ(peak->at.requested, 5u << 20);
  uint64_t max_kept = 0;
  for (const auto& p : d.points) max_kept = std::max(max_kept, p.at.requested);
  EXPECT_EQ(max_kept, d.peak_requested.bytes);
  ASSERT_EQ(d.ooms.size(), oom_events.size());
  for (int64_t e : oom_events) EXPECT_NE(at(e), d.points.end()) << e;
  EXPECT_EQ(at(-1), d.points.begin());  // the start state is always the first point
}

TEST(Timeline, PerStreamBreakdownWhenSeveralStreams) {
  TSnapshot t;
  t.segments.push_back({0, kBase, 0, "large", {{k20M, 0, "inactive", {}}}});
  t.traces.push_back({
      ev("segment_alloc", kBase, k20M, 0),
      ev("alloc", kBase, 1000, 0),
      ev("alloc", kBase + 1024, 3000, 7),
      ev("free_requested", kBase + 1024, 3000, 7),
      ev("free_completed", kBase + 1024, 3000, 7),
      ev("free_requested", kBase, 1000, 0),
      ev("free_completed", kBase, 1000, 0),
  });
  auto snap = buildSnapshot(t);
  auto r = computeTimeline(snap);
  const auto& d = r.devices[0];
  ASSERT_EQ(d.streams.size(), 2u);
  EXPECT_EQ(d.streams[0].stream, 0);
  EXPECT_EQ(d.streams[1].stream, 7);
  EXPECT_EQ(d.streams[0].peak_reserved.bytes, k20M);
  EXPECT_EQ(d.streams[0].peak_requested.bytes, 1000u);
  EXPECT_EQ(d.streams[1].peak_requested.bytes, 3000u);
  EXPECT_EQ(d.streams[1].peak_requested.event, 2);
  EXPECT_EQ(d.streams[1].peak_reserved.bytes, 0u);
  ASSERT_EQ(d.streams[1].points.size(), d.points.size());
  EXPECT_EQ(d.streams[1].points[3].at.requested, 3000u);  // after event 2
  EXPECT_EQ(d.streams[1].points.back().at.requested, 0u);
  EXPECT_TRUE(d.pools.empty());
}

// Found by fuzz_pipeline: a stream's share of two segments of 2^63 - 4096 bytes each overflowed the
// int64 running sums (undefined behaviour; in practice it wrapped below 0 and showed 0 bytes).
TEST(Timeline, StreamSharesNearTwoToThe63DoNotOverflow) {
  const uint64_t huge = (uint64_t{1} << 63) - 4096;
  TSnapshot t;
  t.segments.push_back({0, 0x1000, 7, "large", {{huge, 0, "inactive", {}}}});
  t.segments.push_back({0, 0x1000 + huge, 7, "large", {{huge, 0, "inactive", {}}}});
  t.traces.push_back({
      ev("alloc", 0x1000, 512, 7),
      ev("free_requested", 0x1000, 512, 7),
      ev("free_completed", 0x1000, 512, 7),
      ev("alloc", 0x1000 + 512, 512, 0),
      ev("free_requested", 0x1000 + 512, 512, 0),
      ev("free_completed", 0x1000 + 512, 512, 0),
  });
  auto snap = buildSnapshot(t);
  auto r = computeTimeline(snap);
  ASSERT_EQ(r.devices.size(), 1u);
  const auto& d = r.devices[0];
  ASSERT_EQ(d.streams.size(), 2u);
  EXPECT_EQ(d.streams[1].stream, 7);
  EXPECT_EQ(d.streams[1].peak_reserved.bytes, 2 * huge);
  EXPECT_EQ(d.streams[1].peak_requested.bytes, 512u);
  EXPECT_EQ(d.streams[0].peak_reserved.bytes, 0u);
}

// Many streams: only max_breakdowns of them get a series (those with the highest peak reserved),
// the others are counted; the series that are kept equal those of an unbounded run.
TEST(Timeline, BreakdownsAreBoundedAndExact) {
  TSnapshot t;
  std::vector<TEvent> tr;
  for (int s = 0; s < 5; ++s) {
    const uint64_t base = kBase + static_cast<uint64_t>(s) * 0x10000000ULL;
    const uint64_t seg = k20M * static_cast<uint64_t>(s + 1);
    tr.push_back(ev("segment_alloc", base, seg, s));
    tr.push_back(ev("alloc", base, 1000u * static_cast<uint64_t>(s + 1), s));
    tr.push_back(ev("free_requested", base, 1000u * static_cast<uint64_t>(s + 1), s));
    tr.push_back(ev("free_completed", base, 1000u * static_cast<uint64_t>(s + 1), s));
    tr.push_back(ev("segment_free", base, seg, s));
  }
  t.traces.push_back(tr);
  auto snap = buildSnapshot(t);
  TimelineOptions all;
  auto full = computeTimeline(snap, all);
  TimelineOptions two;
  two.max_breakdowns = 2;
  auto cut = computeTimeline(snap, two);
  ASSERT_EQ(full.devices[0].streams.size(), 5u);
  EXPECT_EQ(full.devices[0].streams_omitted, 0u);
  const auto& d = cut.devices[0];
  ASSERT_EQ(d.streams.size(), 2u);
  EXPECT_EQ(d.streams_omitted, 3u);
  // The two largest (streams 3 and 4, by peak reserved), in stream order, as in the full run.
  EXPECT_EQ(d.streams[0].stream, 3);
  EXPECT_EQ(d.streams[1].stream, 4);
  for (size_t k = 0; k < 2; ++k) {
    const auto& a = d.streams[k];
    const auto& b = full.devices[0].streams[3 + k];
    EXPECT_EQ(a.peak_reserved.bytes, b.peak_reserved.bytes);
    EXPECT_EQ(a.peak_reserved.event, b.peak_reserved.event);
    EXPECT_EQ(a.peak_requested.bytes, b.peak_requested.bytes);
    EXPECT_EQ(a.peak_requested.event, b.peak_requested.event);
    ASSERT_EQ(a.points.size(), b.points.size());
    for (size_t i = 0; i < a.points.size(); ++i) {
      EXPECT_EQ(a.points[i].event, b.points[i].event);
      EXPECT_EQ(a.points[i].at.reserved, b.points[i].at.reserved);
      EXPECT_EQ(a.points[i].at.requested, b.points[i].at.requested);
    }
  }
}

// A saw-tooth of `n` alloc/free pairs with times 1..2n and `ranges` nested annotation ranges
// (range k: START at k, END at 2n + 1 - k, so each holds the next) plus a few disjoint ones.
format::Snapshot nestedRanges(size_t n, size_t ranges) {
  TSnapshot t;
  t.segments.push_back({0, kBase, 0, "large", {{k20M, 0, "inactive", {}}}});
  std::vector<TEvent> tr = {ev("segment_alloc", kBase, k20M, 0, 0)};
  uint64_t seed = 12345;
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    const uint64_t size = 512 * (1 + (seed >> 33) % 64);
    const auto t1 = static_cast<int64_t>(2 * i + 1);
    tr.push_back(ev("alloc", kBase, size, 0, t1));
    tr.push_back(ev("free_requested", kBase, size, 0, t1 + 1));
    tr.push_back(ev("free_completed", kBase, size, 0, t1 + 1));
  }
  t.traces.push_back(tr);
  auto snap = buildSnapshot(t);
  const auto end = static_cast<int64_t>(2 * n + 1);
  auto mark = [&](int64_t time, const std::string& name, const char* stage) {
    snap.annotations.push_back({0, time, snap.strings.intern(name), snap.strings.intern(stage)});
  };
  for (size_t k = 0; k < ranges; ++k)
    mark(static_cast<int64_t>(k * n / ranges), "r" + std::to_string(k), "START");
  for (size_t k = ranges; k-- > 0;)
    mark(end - static_cast<int64_t>(k * n / ranges), "r" + std::to_string(k), "END");
  for (int64_t k = 0; k < 20; ++k) {  // disjoint short ranges, some steps
    const int64_t a = 1 + k * end / 20;
    mark(a, k % 2 ? "ProfilerStep#" + std::to_string(k) : "d" + std::to_string(k), "START");
    mark(a + 7, k % 2 ? "ProfilerStep#" + std::to_string(k) : "d" + std::to_string(k), "END");
  }
  snap.traits.has_annotations_key = true;
  return snap;
}

TEST(Timeline, PhasePeaksEqualANaiveScan) {
  auto snap = nestedRanges(700, 150);
  TimelineOptions o;
  o.max_points = 100000;  // every point kept, so the naive scan below sees them all
  auto r = computeTimeline(snap, o);
  const auto& d = r.devices[0];
  ASSERT_FALSE(d.downsampled);
  ASSERT_EQ(d.phases.size(), 170u);
  for (const auto& ps : d.phases) {
    replay::Peak req, res;  // the first event reaching the maximum after an event of the range
    for (const auto& p : d.points) {
      if (p.event < ps.phase.first_event || p.event > ps.phase.last_event) continue;
      if (req.event < 0 || p.at.requested > req.bytes) req = {p.at.requested, p.event, p.time_us};
      if (res.event < 0 || p.at.reserved > res.bytes) res = {p.at.reserved, p.event, p.time_us};
    }
    SCOPED_TRACE(ps.phase.name);
    EXPECT_EQ(ps.peak_requested.bytes, req.bytes);
    EXPECT_EQ(ps.peak_requested.event, req.event);
    EXPECT_EQ(ps.peak_requested.time_us, req.time_us);
    EXPECT_EQ(ps.peak_reserved.bytes, res.bytes);
    EXPECT_EQ(ps.peak_reserved.event, res.event);
  }
}

// 100,000 nested ranges over 100,000 events: a scan per phase is 5 * 10^9 steps (minutes); range
// maximum queries finish at once. No clock here: ctest's timeout is the guard.
TEST(Timeline, HundredThousandNestedRangesFinish) {
  auto snap = nestedRanges(33334, 100000);
  auto r = computeTimeline(snap);
  const auto& d = r.devices[0];
  ASSERT_EQ(d.phases.size(), 100020u);
  EXPECT_EQ(d.phases.front().peak_requested.bytes, d.peak_requested.bytes);  // the outermost range
}

}  // namespace
}  // namespace memforensics::analysis
