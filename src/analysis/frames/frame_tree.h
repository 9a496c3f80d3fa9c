// frame_tree.h: the one call tree of bytes by frame. Built once from the live blocks at a moment;
// the call graph (--top-frames, callgraph.h), the HTML icicle and the collapsed export are views
// of it, so for the same frame selection they attribute the same bytes to the same frames.
//
// Node 0 is the root (all the bytes counted). Every other node is one frame reached by one call
// path from the root (outermost frame first), or one of the leaf markers below. A block adds its
// bytes to every node on its stack's path (`bytes`, inclusive) and to the last node (`self`).
// Nodes are created, and children listed, in the order of the stacks ranked by bytes (largest
// first), then by the frames' text: never by stack id or hash order, so the same snapshot in any
// format gives the same tree.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "analysis/frames/frames.h"
#include "common/flat_map.h"
#include "format/model/snapshot.h"
#include "replay/replay.h"

namespace memforensics::analysis {

enum class TreeFrames : uint8_t {
  All,           // every frame as recorded
  Attributable,  // every frame that is not Plumbing (frame_class.h): the call graph's view
  User,          // userFrames(stack, max_user_frames) only
};

enum class TreeValue : uint8_t { Requested, BlockSize };

enum class TreePending : uint8_t {
  Exclude,   // pending-free blocks are not counted (memory_allocated drops at free_requested)
  Include,   // counted on their stack's path
  LeafMark,  // counted, under a "pending free" marker leaf below their stack's path
};

struct FrameTreeOptions {
  TreeFrames frames = TreeFrames::Attributable;
  size_t max_user_frames = 64;  // TreeFrames::User only
  TreeValue value = TreeValue::Requested;
  TreePending pending = TreePending::Exclude;
  // C++-only stacks (selected frames, none of them in a Python file) say nothing a
  // reader of Python knows: with this set, such a block's path hangs under a NativeGroup node of
  // the group this returns for it (1-255; 0: no group). The HTML icicle groups them by the
  // block's category ("gradient", "optimizer state"), so a gradient made by the autograd engine
  // reads as one before its 300-character C++ frames.
  std::function<uint8_t(const replay::LiveBlock&)> native_group;
};

enum class TreeNodeKind : uint8_t {
  Root,
  Frame,        // `frame` is the snapshot's frame id
  NoStack,      // leaf: the blocks had no stack recorded (kNoStack)
  EmptyStack,   // leaf: a stack was recorded but empty (kEmptyStack)
  NoFrames,     // leaf: a stack was recorded, none of its frames is selected (e.g. all Plumbing)
  Pending,      // leaf: TreePending::LeafMark, the pending-free part of its parent's path
  NativeGroup,  // FrameTreeOptions::native_group: C++-only stacks of one group (`group`); their
                // frames below it
};

struct FrameTreeNode {
  TreeNodeKind kind = TreeNodeKind::Root;
  format::FrameId frame = 0;  // Frame nodes only
  uint8_t group = 0;          // NativeGroup nodes only
  int32_t parent = -1;
  uint64_t bytes = 0;             // inclusive
  uint64_t self = 0;              // of stacks (or markers) ending here
  uint64_t blocks = 0;            // blocks counted in `bytes`
  std::vector<int32_t> children;  // in creation order
};

struct FrameTree {
  std::vector<FrameTreeNode> nodes;  // nodes[0] = root
  // Bytes under the NoStack, EmptyStack and NoFrames leaves: counted in the root, attributed to
  // no frame.
  uint64_t unattributed = 0;
};

FrameTree buildFrameTree(const format::Snapshot& snap, const U64Map<replay::LiveBlock>& live,
                         const FrameTreeOptions& opt = {});

// The frames of `stack` that `opt.frames` selects, innermost first (as stored).
std::vector<format::FrameId> selectedFrames(const format::Snapshot& snap, format::StackId stack,
                                            const FrameTreeOptions& opt);

}  // namespace memforensics::analysis
