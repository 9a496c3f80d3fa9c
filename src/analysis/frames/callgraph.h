// callgraph.h: live bytes attributed to frames at one moment (the peak, an OOM), as a call graph.
//
// A view of the one frame tree (frame_tree.h, TreeFrames::Attributable: every frame that is not
// Plumbing by frame_class.h): vertices are frames (the tree's nodes of one frame merged), edges
// run caller -> callee, and each live block adds its bytes to every frame of its stack once
// (inclusive) and to its innermost kept frame (self). Built on Boost.Graph; the hot
// path (from the root with the most inclusive bytes, always into the heaviest callee) is what a
// person reads first; when it passes through the program's own code (FrameKind::User) it is cut
// to run from the outermost to the innermost user frame on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/frames/frames.h"
#include "format/model/snapshot.h"
#include "replay/replay.h"

namespace memforensics::analysis {

struct FrameBytes {
  FrameText frame;
  uint64_t self_bytes = 0;
  uint64_t inclusive_bytes = 0;
  uint64_t blocks = 0;  // live blocks whose stack contains the frame
};

struct CallGraphSummary {
  uint64_t total_bytes = 0;         // live requested bytes attributed
  uint64_t unattributed_bytes = 0;  // blocks without a recorded stack
  size_t vertices = 0, edges = 0;
  std::vector<FrameBytes> top_inclusive;  // largest first
  std::vector<FrameBytes> top_self;
  std::vector<FrameBytes> hot_path;  // outermost to innermost (user frames' span, when any)
};

// Attribution of the live (non-pending) blocks of `live` to the frames of their stacks.
CallGraphSummary buildCallGraph(const format::Snapshot& snap, const U64Map<replay::LiveBlock>& live,
                                size_t top = 10);

}  // namespace memforensics::analysis
