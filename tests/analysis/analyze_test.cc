// analyze_test.cc: top allocations at the peak and the choice of user frames.
#include "analysis/analyze.h"

#include <gtest/gtest.h>

#include "fixtures/snapshot_builder.h"

namespace memforensics::analysis {
namespace {

using memforensics::testing::buildSnapshot;
using memforensics::testing::TFrame;
using memforensics::testing::TSnapshot;

constexpr uint64_t kBase = 0x7f0000000000ULL;
constexpr uint64_t k20M = 20971520;

// Stacks that differ only in frames a person is not shown (the allocator's C++ frames, the module
// call wrapper) are one group at the peak, and equal groups rank by their frames' text, not by
// the order a reader interned the stacks (the one group-by-stack rule, stack_groups.h).
TEST(Analyze, IdenticalLookingStacksAreOneGroupRankedByContent) {
  const std::vector<TFrame> a1 = {
      {"??", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"},
      {"/home/u/model.py", 54, "forward"},
      {"/home/u/train.py", 120, "main"}};
  const std::vector<TFrame> a2 = {
      {"/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1790, "_call_impl"},
      {"/home/u/model.py", 54, "forward"},
      {"/home/u/train.py", 120, "main"}};
  const std::vector<TFrame> z = {{"/home/u/zeta.py", 1, "f"}};
  const std::vector<TFrame> b = {{"/home/u/beta.py", 1, "f"}};
  TSnapshot t;
  t.traces.push_back({
      {"segment_alloc", kBase, k20M, 0, 1},
      {"alloc", kBase, 1000000, 0, 2, z, true},  // z interned before b, same bytes as b
      {"alloc", kBase + 1000448, 1000000, 0, 3, b, true},
      {"alloc", kBase + 2000896, 3000000, 0, 4, a1, true},
      {"alloc", kBase + 5001216, 3000000, 0, 5, a2, true},
  });
  auto r = analyzeSnapshot(buildSnapshot(t));
  ASSERT_EQ(r.devices.size(), 1u);
  const auto& top = r.devices[0].top_at_peak;
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].requested_bytes, 6000000u);
  EXPECT_EQ(top[0].count, 2u);
  ASSERT_FALSE(top[0].frames.empty());
  EXPECT_EQ(top[0].frames[0].display(), "/home/u/model.py:54 forward");
  // Equal bytes: beta.py before zeta.py by text, whatever came first in the file.
  ASSERT_FALSE(top[1].frames.empty());
  EXPECT_EQ(top[1].frames[0].filename, "/home/u/beta.py");
  EXPECT_EQ(top[2].frames[0].filename, "/home/u/zeta.py");
}

TEST(Analyze, TopGroupsAtThePeakByStackWithUserFrames) {
  std::vector<TFrame> act = {
      {"??", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"},
      {"/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1790, "_call_impl"},
      {"/home/u/model.py", 54, "forward"},
      {"/home/u/train.py", 120, "main"}};
  std::vector<TFrame> tmp = {{"/home/u/train.py", 130, "main"}};
  TSnapshot t;
  t.segments.push_back({0, kBase, 0, "large", {{k20M, 0, "inactive", {}}}});
  t.traces.push_back({
      {"segment_alloc", kBase, k20M, 0, 1},
      {"alloc", kBase, 3000000, 0, 2, act, true},
      {"alloc", kBase + 3000064, 3000000, 0, 3, act, true},
      {"alloc", kBase + 6000128, 5000000, 0, 4, tmp, true},
      {"free_requested", kBase + 6000128, 5000000, 0, 5},
      {"free_completed", kBase + 6000128, 5000000, 0, 5},
      {"free_requested", kBase, 3000000, 0, 6},
      {"free_completed", kBase, 3000000, 0, 6},
      {"free_requested", kBase + 3000064, 3000000, 0, 7},
      {"free_completed", kBase + 3000064, 3000000, 0, 7},
  });
  auto snap = buildSnapshot(t);
  auto r = analyzeSnapshot(snap);
  ASSERT_EQ(r.devices.size(), 1u);
  const auto& d = r.devices[0];
  EXPECT_EQ(d.summary.peak_requested.bytes, 11000000u);
  EXPECT_EQ(d.summary.peak_requested.event, 3);
  EXPECT_EQ(d.live_at_peak, 3u);
  ASSERT_EQ(d.top_at_peak.size(), 2u);
  EXPECT_EQ(d.top_at_peak[0].requested_bytes, 6000000u);
  EXPECT_EQ(d.top_at_peak[0].count, 2u);
  ASSERT_EQ(d.top_at_peak[0].frames.size(), 2u);
  EXPECT_EQ(d.top_at_peak[0].frames[0].display(),
            "/home/u/model.py:54 forward");  // torch frames skipped
  EXPECT_EQ(d.top_at_peak[0].frames[1].display(), "/home/u/train.py:120 main");
  EXPECT_EQ(d.top_at_peak[1].requested_bytes, 5000000u);
  EXPECT_TRUE(d.anomalies.empty());
}

TEST(Analyze, DeviceFilterAndEmptySnapshot) {
  TSnapshot t;
  t.segments.push_back({1, kBase, 0, "large", {{k20M, 0, "inactive", {}}}});
  auto snap = buildSnapshot(t);
  AnalyzeOptions opt;
  opt.device = 0;
  EXPECT_TRUE(analyzeSnapshot(snap, opt).devices.empty());
  opt.device = 1;
  auto r = analyzeSnapshot(snap, opt);
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_EQ(r.devices[0].summary.peak_reserved.bytes, k20M);
  EXPECT_EQ(r.devices[0].summary.events, 0u);
}

TEST(Frames, CppOnlyStacksFallBackToNonNoiseFrames) {
  TSnapshot t;
  std::vector<TFrame> cpp = {{"??", 0, "torch::unwind::unwind()"},
                             {"??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"},
                             {"Loss.cpp", 12, "at::native::mse_loss"}};
  t.segments.push_back({0, kBase, 0, "large", {{k20M, 1000, "active_allocated", cpp}}});
  auto snap = buildSnapshot(t);
  auto frames = userFrames(snap, snap.blocks[0].stack, 3);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].display(), "Loss.cpp:12 at::native::mse_loss");
}

}  // namespace
}  // namespace memforensics::analysis
