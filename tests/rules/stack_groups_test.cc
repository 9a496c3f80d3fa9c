// stack_groups_test.cc: the one group-by-stack rule and the one frame tree.
#include "analysis/frames/stack_groups.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "analysis/frames/callgraph.h"
#include "analysis/frames/frame_tree.h"

namespace memforensics::analysis {
namespace {

format::StackId stackOf(format::Snapshot& s,
                        const std::vector<std::tuple<std::string, uint64_t, std::string>>& fs) {
  std::vector<format::FrameId> ids;
  for (const auto& [file, line, name] : fs) {
    format::Frame fr;
    fr.filename = s.strings.intern(file);
    fr.name = s.strings.intern(name);
    fr.line = line;
    ids.push_back(s.stacks.internFrame(fr));
  }
  return s.stacks.internStack(ids);
}

replay::LiveBlock block(format::StackId st, uint64_t requested, bool pending = false,
                        int64_t ev = 0) {
  replay::LiveBlock b;
  b.requested = requested;
  b.size = (requested + 511) / 512 * 512;
  b.stack = st;
  b.pending = pending;
  b.alloc_event = ev;
  return b;
}

const std::tuple<std::string, uint64_t, std::string> kAlloc{"??", 0, "c10::cuda::malloc"};
const std::tuple<std::string, uint64_t, std::string> kCallImpl{"/x/torch/nn/modules/module.py",
                                                               1747, "_call_impl"};

// Two stacks that differ only in plumbing look the same to a person: one group.
TEST(StackGroups, IdenticalLookingStacksMerge) {
  format::Snapshot s;
  auto a = stackOf(s, {kAlloc, {"/u/m.py", 5, "f"}, {"/u/t.py", 1, "main"}});
  auto b = stackOf(s, {kAlloc, kCallImpl, {"/u/m.py", 5, "f"}, {"/u/t.py", 1, "main"}});
  ASSERT_NE(a, b);
  U64Map<replay::LiveBlock> live;
  live.insert(0x1000, block(a, 100));
  live.insert(0x2000, block(b, 300));
  live.insert(0x3000, block(b, 50, /*pending=*/true));
  auto g = groupLiveByStack(s, live);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].requested_bytes, 400u);
  EXPECT_EQ(g[0].count, 2u);
  EXPECT_EQ(g[0].representative, b);  // the member with the most bytes
  EXPECT_EQ(g[0].stacks, (std::vector<format::StackId>{b, a}));
  auto pend = groupLiveByStack(s, live, PendingBlocks::Only);
  ASSERT_EQ(pend.size(), 1u);
  EXPECT_EQ(pend[0].requested_bytes, 50u);
}

// Equal bytes rank by the frames' text, whatever order the stacks were interned in.
TEST(StackGroups, TiesBreakByFrameTextNotStackId) {
  for (bool z_first : {true, false}) {
    format::Snapshot s;
    format::StackId z = 0, a = 0;
    if (z_first) {
      z = stackOf(s, {{"/u/z.py", 1, "z"}});
      a = stackOf(s, {{"/u/a.py", 1, "a"}});
    } else {
      a = stackOf(s, {{"/u/a.py", 1, "a"}});
      z = stackOf(s, {{"/u/z.py", 1, "z"}});
    }
    U64Map<replay::LiveBlock> live;
    live.insert(0x1000, block(z, 100));
    live.insert(0x2000, block(a, 100));
    live.insert(0x3000, block(format::kNoStack, 100));
    live.insert(0x4000, block(z, 1));
    auto g = groupLiveByStack(s, live);
    ASSERT_EQ(g.size(), 3u);
    EXPECT_EQ(g[0].frames.at(0).filename, "/u/z.py");  // 101 bytes
    EXPECT_EQ(g[1].frames.at(0).filename, "/u/a.py");  // 100 bytes: a with a stack first
    EXPECT_FALSE(g[2].has_stack);
  }
}

TEST(StackGroups, GrouperTopAndSaturation) {
  format::Snapshot s;
  auto a = stackOf(s, {{"/u/a.py", 1, "a"}});
  StackGrouper g(s, GroupOptions{3, 1});
  g.add(a, ~uint64_t{0});
  g.add(a, 10);
  g.add(format::kNoStack, 5);
  auto out = g.take();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].requested_bytes, ~uint64_t{0});
}

// The one frame tree: the call graph is a view of it, so both attribute the same bytes to the
// same frames; plumbing (the allocator, the call wrapper) is in neither.
TEST(FrameTree, CallGraphIsAViewOfTheTree) {
  format::Snapshot s;
  auto a = stackOf(s, {kAlloc, {"/u/m.py", 5, "f"}, kCallImpl, {"/u/t.py", 1, "main"}});
  auto b = stackOf(s, {kAlloc, {"/u/m.py", 9, "g"}, {"/u/t.py", 1, "main"}});
  auto rec = stackOf(s, {{"/u/r.py", 2, "r"}, {"/u/r.py", 2, "r"}, {"/u/t.py", 1, "main"}});
  U64Map<replay::LiveBlock> live;
  live.insert(0x1000, block(a, 300));
  live.insert(0x2000, block(b, 200));
  live.insert(0x3000, block(rec, 50));
  live.insert(0x4000, block(format::kNoStack, 7));
  live.insert(0x5000, block(b, 1000, /*pending=*/true));
  FrameTree t = buildFrameTree(s, live);
  EXPECT_EQ(t.nodes[0].bytes, 557u);
  EXPECT_EQ(t.unattributed, 7u);
  // root -> main (550) -> {f 300, g 200, r 50 -> r 50}, and root -> (no stack) 7.
  ASSERT_EQ(t.nodes[0].children.size(), 2u);
  const FrameTreeNode& main = t.nodes[static_cast<size_t>(t.nodes[0].children[0])];
  EXPECT_EQ(main.bytes, 550u);
  ASSERT_EQ(main.children.size(), 3u);
  EXPECT_EQ(t.nodes[static_cast<size_t>(main.children[0])].bytes, 300u);  // largest first
  for (const FrameTreeNode& n : t.nodes) {
    if (n.kind == TreeNodeKind::Frame)
      EXPECT_NE(s.strings.get(s.stacks.frame(n.frame).name), "_call_impl");
  }
  CallGraphSummary g = buildCallGraph(s, live, 10);
  EXPECT_EQ(g.total_bytes, 557u);
  EXPECT_EQ(g.unattributed_bytes, 7u);
  ASSERT_FALSE(g.top_inclusive.empty());
  EXPECT_EQ(g.top_inclusive[0].frame.name, "main");
  EXPECT_EQ(g.top_inclusive[0].inclusive_bytes, 550u);
  for (const FrameBytes& fb : g.top_inclusive) {
    if (fb.frame.name == "r") {
      EXPECT_EQ(fb.inclusive_bytes, 50u);  // recursion counts once
      EXPECT_EQ(fb.self_bytes, 50u);
    }
  }
  ASSERT_EQ(g.hot_path.size(), 2u);
  EXPECT_EQ(g.hot_path[1].frame.name, "f");

  FrameTreeOptions all;
  all.frames = TreeFrames::All;
  all.pending = TreePending::LeafMark;
  FrameTree t2 = buildFrameTree(s, live, all);
  EXPECT_EQ(t2.nodes[0].bytes, 1557u);
  bool pending_leaf = false;
  for (const FrameTreeNode& n : t2.nodes) {
    if (n.kind == TreeNodeKind::Pending) {
      pending_leaf = true;
      EXPECT_EQ(n.self, 1000u);
    }
  }
  EXPECT_TRUE(pending_leaf);
}

// C++-only stacks hang under one node per group (the icicle's "gradient ... C++ stack"), keyed by
// what native_group says of the block; a stack with a Python frame, or with only plumbing, never
// does; without native_group the tree is as before.
TEST(FrameTree, NativeOnlyStacksGroupedWhenAsked) {
  format::Snapshot s;
  const std::tuple<std::string, uint64_t, std::string> engine{
      "??", 0, "torch::autograd::Engine::evaluate_function(std::shared_ptr<GraphTask>&)"};
  const std::tuple<std::string, uint64_t, std::string> mm{"??", 0, "at::native::mm(at::Tensor)"};
  const std::tuple<std::string, uint64_t, std::string> thread{"??", 0, "start_thread"};
  auto grad = stackOf(s, {kAlloc, mm, engine, thread});
  auto tmp = stackOf(s, {kAlloc, engine, thread});
  auto py = stackOf(s, {kAlloc, mm, {"/u/train.py", 7, "step"}});
  auto plumbing = stackOf(s, {kAlloc, thread});
  U64Map<replay::LiveBlock> live;
  live.insert(0x1000, block(grad, 400, false, /*ev=*/1));
  live.insert(0x2000, block(grad, 100, false, /*ev=*/2));  // same stack, another group
  live.insert(0x3000, block(tmp, 50, false, /*ev=*/3));
  live.insert(0x4000, block(py, 30, false, /*ev=*/4));
  live.insert(0x5000, block(plumbing, 20, false, /*ev=*/5));
  FrameTreeOptions o;
  std::vector<int64_t> asked;
  o.native_group = [&](const replay::LiveBlock& b) {
    asked.push_back(b.alloc_event);
    return static_cast<uint8_t>(b.alloc_event == 2 ? 9 : 3);
  };
  FrameTree t = buildFrameTree(s, live, o);
  std::sort(asked.begin(), asked.end());
  EXPECT_EQ(asked, (std::vector<int64_t>{1, 2, 3}));  // only the C++-only stacks' blocks
  EXPECT_EQ(t.nodes[0].bytes, 600u);
  std::map<uint8_t, uint64_t> groups;
  for (const FrameTreeNode& n : t.nodes) {
    if (n.kind != TreeNodeKind::NativeGroup) continue;
    EXPECT_EQ(n.parent, 0);  // right under the root
    groups[n.group] += n.bytes;
    for (int32_t c : n.children) {  // the outermost shown frame: the engine, not start_thread
      const auto& fr = s.stacks.frame(t.nodes[static_cast<size_t>(c)].frame);
      EXPECT_NE(s.strings.get(fr.name).find("Engine::evaluate_function"), std::string::npos);
    }
  }
  EXPECT_EQ(groups, (std::map<uint8_t, uint64_t>{{3, 450}, {9, 100}}));
  // The Python stack's path starts at its Python frame; the plumbing-only one is NoFrames.
  bool py_top = false, no_frames = false;
  for (int32_t c : t.nodes[0].children) {
    const FrameTreeNode& n = t.nodes[static_cast<size_t>(c)];
    if (n.kind == TreeNodeKind::Frame)
      py_top = py_top || s.strings.get(s.stacks.frame(n.frame).name) == "step";
    if (n.kind == TreeNodeKind::NoFrames) no_frames = n.bytes == 20;
  }
  EXPECT_TRUE(py_top);
  EXPECT_TRUE(no_frames);
  FrameTree plain = buildFrameTree(s, live);
  for (const FrameTreeNode& n : plain.nodes) EXPECT_NE(n.kind, TreeNodeKind::NativeGroup);
  EXPECT_EQ(plain.nodes[0].bytes, 600u);
}

}  // namespace
}  // namespace memforensics::analysis
