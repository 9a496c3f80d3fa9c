// stack_groups_test.cc: the one group-by-stack rule and the one frame tree.
#include "analysis/frames/stack_groups.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace memforensics::analysis
