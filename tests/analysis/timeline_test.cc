// timeline_test.cc: exact watermark series, downsampling that keeps peaks and OOMs, breakdowns.
#include "analysis/timeline.h"

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
  struct Row { int64_t event, time; uint64_t reserved, allocated, requested, pending; };
  const Row want[] = {{-1, -1, 0, 0, 0, 0},          {0, 100, k20M, 0, 0, 0},
                      {1, 110, k20M, 1024, 1000, 0}, {2, 120, k20M, 4096, 4000, 0},
                      {3, 130, k20M, 3072, 4000, 1024}, {4, 140, k20M, 3072, 4000, 1024},
                      {5, 150, k20M, 3072, 3000, 0}, {6, 160, k20M, 0, 3000, 3072},
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
    return std::find_if(d.points.begin(), d.points.end(), [&](const auto& p) { return p.event == e; });
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

}  // namespace
}  // namespace memforensics::analysis
