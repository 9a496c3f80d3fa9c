// stack_groups.h: the one "group bytes by stack" rule.
//
// Bytes (live blocks at a moment, surviving allocations, optimizer state, ...) are grouped by the
// stack that allocated them, and groups that look the same to a person (the same frames as
// userFrames(stack, frames) shows them, and both with or both without a recorded stack) are one
// group. Groups are ranked by requested bytes, largest first; on equal bytes a group with a
// recorded stack before one without, then by the frames' text (FrameText::display(), innermost
// frame first, compared frame by frame). Never by stack id or hash order: the same snapshot in any
// format ranks the same.
#pragma once

#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

#include "analysis/frames/frames.h"
#include "common/flat_map.h"
#include "format/model/snapshot.h"
#include "replay/replay.h"

namespace memforensics::analysis {

struct LiveGroup {
  std::vector<FrameText> frames;  // userFrames(representative, frames): the group's key
  bool has_stack = false;         // false: no stack recorded (kNoStack / kEmptyStack)
  uint64_t requested_bytes = 0;
  uint64_t block_bytes = 0;
  uint64_t count = 0;        // blocks (or allocations) in the group
  int64_t first_event = -1;  // earliest alloc event given (-1: none / pre-trace)
  format::StackId representative = format::kNoStack;  // the member stack with the most bytes
  std::vector<format::StackId> stacks;  // every member stack, by bytes then frame text
};

struct GroupOptions {
  size_t frames = 3;                                // frames per group key (userFrames)
  size_t top = std::numeric_limits<size_t>::max();  // groups returned, after ranking
};

// Accumulates bytes per stack, then merges and ranks (see the file comment).
class StackGrouper {
 public:
  StackGrouper(const format::Snapshot& snap, GroupOptions opt = {}) : snap_(snap), opt_(opt) {}
  // alloc_event: the allocation's event, -1 when unknown or before the trace.
  void add(format::StackId stack, uint64_t requested, uint64_t block_bytes = 0, uint64_t count = 1,
           int64_t alloc_event = -1);
  std::vector<LiveGroup> take();

 private:
  struct PerStack {
    uint64_t requested = 0, block = 0, count = 0;
    int64_t first_event = std::numeric_limits<int64_t>::max();
  };
  const format::Snapshot& snap_;
  GroupOptions opt_;
  std::unordered_map<format::StackId, PerStack> by_stack_;
};

// Which live blocks count: pending ones are freed by the program and kept only by a stream.
enum class PendingBlocks : uint8_t { Exclude, Only, Include };

// The live blocks of `live` grouped by stack.
std::vector<LiveGroup> groupLiveByStack(const format::Snapshot& snap,
                                        const U64Map<replay::LiveBlock>& live,
                                        PendingBlocks pending = PendingBlocks::Exclude,
                                        GroupOptions opt = {});

// The ranking of two groups (true: a before b), for consumers that re-rank merged groups.
bool groupBefore(const LiveGroup& a, const LiveGroup& b);

}  // namespace memforensics::analysis
