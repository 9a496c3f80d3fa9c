// report_data.cc: the bounded data set behind the HTML report (see report_data.h).
#include "report/html/report_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>

#include "analysis/frames/frame_tree.h"
#include "analysis/whatif/whatif.h"
#include "common/allocator_constants.h"
#include "common/saturating.h"
#include "report/html/json_len.h"

namespace memforensics::analysis {

namespace {

using format::StackId;

// Frames and stacks shared by every device; bounded by max_stacks.
class Tables {
 public:
  Tables(const format::Snapshot& snap, ReportData& out, const ReportDataOptions& opt)
      : snap_(snap), out_(out), opt_(opt) {}

  int32_t frame(const FrameText& f) {
    std::string key = f.filename;
    key += '\0';
    key += f.name;
    key += '\0';
    key += std::to_string(f.line);
    auto [it, fresh] =
        frame_ids_.try_emplace(std::move(key), static_cast<int32_t>(out_.frames.size()));
    if (fresh) out_.frames.push_back(f);
    return it->second;
  }

  // Frames of a stack, innermost first; empty for no stack.
  const std::vector<int32_t>& framesOf(StackId id) {
    auto it = frames_of_.find(id);
    if (it != frames_of_.end()) return it->second;
    std::vector<int32_t> v;
    if (id != format::kNoStack && id != format::kEmptyStack) {
      for (const FrameText& f : userFrames(snap_, id, opt_.max_frames_per_stack))
        v.push_back(frame(f));
    }
    return frames_of_.emplace(id, std::move(v)).first->second;
  }

  // Index into out.stacks, -1 when the block has no stack or the table is full.
  int32_t stack(StackId id) {
    auto it = stack_ids_.find(id);
    if (it != stack_ids_.end()) return it->second;
    const std::vector<int32_t>& fr = framesOf(id);
    int32_t idx = -1;
    if (!fr.empty()) {
      if (out_.stacks.size() < opt_.max_stacks) {
        idx = static_cast<int32_t>(out_.stacks.size());
        out_.stacks.push_back(fr);
      } else {
        ++stacks_capped_;
      }
    }
    stack_ids_.emplace(id, idx);
    return idx;
  }

  uint64_t stacksCapped() const { return stacks_capped_; }
  size_t maxStacks() const { return opt_.max_stacks; }

 private:
  const format::Snapshot& snap_;
  ReportData& out_;
  const ReportDataOptions& opt_;
  std::unordered_map<std::string, int32_t> frame_ids_;
  std::unordered_map<StackId, std::vector<int32_t>> frames_of_;
  std::unordered_map<StackId, int32_t> stack_ids_;
  uint64_t stacks_capped_ = 0;
};

std::string poolName(const replay::ModelSegment& s) {
  return alloc::poolName(s.is_large, s.pool.first, s.pool.second);
}

size_t blockCount(const std::vector<replay::ModelSegment>& layout) {
  size_t n = 0;
  for (const auto& s : layout) n += s.blocks.size();
  return n;
}

// What is drawn of a segment: a block of at least `threshold` bytes alone, neighbouring smaller
// ones as one run that closes once it reaches the threshold (threshold 0: every block alone).
// Calls f(first, last) per piece, [first, last) indexing seg.blocks. Counting and building the
// pieces share this, so the cap is met by what is built.
template <typename Blocks, typename F>
void forEachPiece(const Blocks& bl, uint64_t threshold, F&& f) {
  size_t start = 0;
  uint64_t run = 0;
  bool in_run = false;
  for (size_t i = 0; i < bl.size(); ++i) {
    if (threshold == 0 || bl[i].size >= threshold) {
      if (in_run) f(start, i);
      in_run = false;
      f(i, i + 1);
      continue;
    }
    if (!in_run) {
      in_run = true;
      start = i;
      run = 0;
    }
    run += bl[i].size;
    if (run >= threshold) {
      f(start, i + 1);
      in_run = false;
    }
  }
  if (in_run) f(start, bl.size());
}

template <typename Blocks>
size_t pieceCount(const Blocks& bl, uint64_t threshold) {
  size_t n = 0;
  forEachPiece(bl, threshold, [&](size_t, size_t) { ++n; });
  return n;
}

// The bytes of a block by state: a run keeps its own split, a single block is all one state.
uint64_t freeBytes(const MapBlock& b) {
  return b.count > 1 ? b.free_bytes : b.state == MapState::Free ? b.size : 0;
}
uint64_t pendingBytes(const MapBlock& b) {
  return b.count > 1 ? b.pending_bytes : b.state == MapState::PendingFree ? b.size : 0;
}

// Blocks (or runs) [first, last) as one run: a run names no single allocation, it keeps its bytes
// by state and is drawn in the state holding most of them.
MapBlock mergeRun(const std::vector<MapBlock>& bl, size_t first, size_t last) {
  MapBlock run;
  run.count = 0;
  for (size_t i = first; i < last; ++i) {
    const MapBlock& mb = bl[i];
    run.size += mb.size;
    run.requested += mb.requested;
    run.free_bytes += freeBytes(mb);
    run.pending_bytes += pendingBytes(mb);
    run.count += mb.count;
  }
  uint64_t alloc = run.size - run.free_bytes - run.pending_bytes;
  run.state = run.free_bytes >= alloc && run.free_bytes >= run.pending_bytes ? MapState::Free
              : alloc >= run.pending_bytes                                   ? MapState::Allocated
                                           : MapState::PendingFree;
  return run;
}

// The smallest threshold (doubling from reserved / cap, at least 512) that brings the pieces of
// `segments` (each with a `blocks` vector) to at most `cap`; 0 when `blocks` already fit. A
// segment is drawn even when all of it is one run, so the cap may stay out of reach.
template <typename Segments>
uint64_t mergeThreshold(const Segments& segments, size_t blocks, uint64_t reserved, size_t cap) {
  if (blocks <= cap || cap == 0) return 0;
  uint64_t threshold = std::max<uint64_t>(512, reserved / cap);
  while (true) {
    size_t n = 0;
    for (const auto& s : segments) n += pieceCount(s.blocks, threshold);
    if (n <= cap || threshold > reserved) break;
    threshold *= 2;
  }
  return threshold;
}

class KeyframeBuilder {
 public:
  KeyframeBuilder(const format::Snapshot& snap, const DeviceFacts& facts, Tables& tables)
      : snap_(snap), facts_(facts), tables_(tables) {}

  Keyframe build(int64_t event, const std::vector<replay::ModelSegment>& layout, size_t cap) {
    Keyframe k;
    k.event = event;
    k.blocks_before_merge = blockCount(layout);
    uint64_t reserved = 0;
    for (const auto& s : layout) reserved += s.size;
    // The smallest threshold (doubling) that brings the block count under the cap.
    const uint64_t threshold = mergeThreshold(layout, k.blocks_before_merge, reserved, cap);
    alloc::StateSums sums;  // the keyframe's counters: the one final-state sum rule
    for (const auto& s : layout) {
      MapSegment ms;
      ms.address = s.address;
      ms.size = s.size;
      ms.stream = s.stream;
      ms.pool = poolName(s);
      ms.expandable = s.is_expandable;
      forEachPiece(s.blocks, threshold, [&](size_t first, size_t last) {
        if (last - first == 1) {
          ms.blocks.push_back(convert(s.blocks[first]));
          return;
        }
        std::vector<MapBlock> piece;
        piece.reserve(last - first);
        for (size_t i = first; i < last; ++i) piece.push_back(convert(s.blocks[i]));
        ms.blocks.push_back(mergeRun(piece, 0, piece.size()));
      });
      sums.addSegment(s.size);
      for (const auto& b : s.blocks) {
        sums.addBlock(b.state == format::BlockState::ActiveAllocated,
                      b.state == format::BlockState::ActivePendingFree, b.size, b.requested);
      }
      k.segments.push_back(std::move(ms));
    }
    k.at.reserved = sums.total;
    k.at.allocated = sums.allocated;
    k.at.pending = sums.pending;
    k.at.requested = sums.requested;
    return k;
  }

 private:
  MapBlock convert(const replay::ModelBlock& b) {
    MapBlock mb;
    mb.size = b.size;
    mb.state = mapStateOf(b.state);
    if (mb.state != MapState::Free) {
      mb.requested = b.requested;
      mb.category = facts_.categoryOf(snap_, b.alloc_event, b.stack);
      mb.stack = tables_.stack(b.stack);
      mb.alloc_event = b.alloc_event;
    }
    return mb;
  }

  const format::Snapshot& snap_;
  const DeviceFacts& facts_;
  Tables& tables_;
};

// Keeps the max_nodes heaviest nodes of a tree whose parents come before their children; a parent
// weighs at least as much as its child, and on ties the parent (created first) wins, so every kept
// node's parent is kept. Returns how many nodes went; their bytes stay in their parents.
template <typename Node>
uint64_t pruneIcicle(std::vector<Node>& nodes, size_t max_nodes) {
  if (nodes.size() <= max_nodes) return 0;
  std::vector<int32_t> order(nodes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return nodes[a].bytes > nodes[b].bytes; });
  std::vector<int32_t> remap(nodes.size(), -1);
  std::vector<uint8_t> keep(nodes.size(), 0);
  for (size_t i = 0; i < max_nodes; ++i) keep[order[i]] = 1;
  std::vector<Node> out;
  uint64_t cut = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!keep[i] || (nodes[i].parent >= 0 && remap[nodes[i].parent] < 0 && i != 0)) {
      ++cut;
      continue;
    }
    remap[i] = static_cast<int32_t>(out.size());
    Node n = std::move(nodes[i]);
    if (n.parent >= 0) n.parent = remap[n.parent];
    out.push_back(std::move(n));
  }
  nodes = std::move(out);
  return cut;
}

// The call tree at a moment: the one frame tree (frame_tree.h) with the call graph's frame
// selection (every frame that is not plumbing), requested bytes, pending-free blocks left out, so
// the icicle gives each frame the bytes `analyze --top-frames` gives it. A C++-only stack hangs
// under a node naming its block's category (FrameTreeOptions::native_group): "gradient" reads
// before the autograd engine's signatures, which stay one hover away.
std::vector<IcicleNode> buildIcicle(const format::Snapshot& snap, const DeviceFacts& f,
                                    const U64Map<replay::LiveBlock>& live, Tables& tables,
                                    size_t max_nodes, uint64_t& nodes_cut) {
  FrameTreeOptions fo;
  fo.frames = TreeFrames::Attributable;
  fo.value = TreeValue::Requested;
  fo.pending = TreePending::Exclude;
  fo.native_group = [&](const replay::LiveBlock& b) {
    return static_cast<uint8_t>(1 + static_cast<uint8_t>(f.categoryOf(snap, b)));
  };
  const FrameTree tree = buildFrameTree(snap, live, fo);
  // The snapshot's frame of each node travels through the pruning; only the kept nodes' frames
  // enter the report's frame table (a stack of a million frames keeps a few thousand).
  struct Raw : IcicleNode {
    bool is_frame = false;
    format::FrameId snapshot_frame = 0;
  };
  std::vector<Raw> raw;
  raw.reserve(tree.nodes.size());
  for (const FrameTreeNode& t : tree.nodes) {
    Raw n;
    n.parent = t.parent;
    n.bytes = t.bytes;
    n.self = t.self;
    n.blocks = t.blocks;
    switch (t.kind) {
      case TreeNodeKind::Root:
        n.label = "all live memory";
        break;
      case TreeNodeKind::Frame:
        n.is_frame = true;
        n.snapshot_frame = t.frame;
        break;
      case TreeNodeKind::NoStack:
        n.label = "(no stack recorded)";
        break;
      case TreeNodeKind::EmptyStack:
        n.label = "(empty stack recorded)";
        break;
      case TreeNodeKind::NoFrames:
        n.label = "(only allocator and interpreter frames)";
        break;
      case TreeNodeKind::Pending:
        n.label = "(pending free)";
        break;
      case TreeNodeKind::NativeGroup:
        n.label = std::string(categoryName(static_cast<Category>(t.group - 1))) +
                  " (inferred) · C++ stack, no Python frame";
        break;
    }
    raw.push_back(std::move(n));
  }
  nodes_cut += pruneIcicle(raw, max_nodes);
  std::vector<IcicleNode> nodes;
  nodes.reserve(raw.size());
  for (Raw& r : raw) {
    if (r.is_frame) r.frame = tables.frame(frameText(snap, r.snapshot_frame));
    nodes.push_back(std::move(static_cast<IcicleNode&>(r)));
  }
  return nodes;
}

std::string fmtCount(uint64_t n) {
  return std::to_string(n);
}

// The allocated blocks of a layout as a live set (the call tree of a keyframe that has a layout
// but no copied live set): pending-free blocks are marked so the tree leaves them out.
U64Map<replay::LiveBlock> liveOfLayout(const std::vector<replay::ModelSegment>& layout) {
  U64Map<replay::LiveBlock> live;
  for (const auto& s : layout) {
    for (const auto& b : s.blocks) {
      if (b.isFree()) continue;
      replay::LiveBlock lb;
      lb.requested = b.requested;
      lb.size = b.size;
      lb.alloc_event = b.alloc_event;
      lb.stream = s.stream;
      lb.stack = b.stack;
      lb.pending = b.state == format::BlockState::ActivePendingFree;
      live.insert(b.address, lb);
    }
  }
  return live;
}

// What a keyframe costs against ReportDataOptions::max_blocks.
size_t keyframeCost(const Keyframe& k) {
  size_t n = 0;
  for (const auto& s : k.segments) n += 2 + s.blocks.size();
  return n;
}

// The kept points of a timeline thinned to half as many buckets (at least kHalvingMinPoints), as
// computeTimeline would keep them with that bucket size: the new bucket is a multiple of the old
// one, so the first points where a bucket's series take their extremes are among the kept ones;
// the start state, every OOM and every peak stay. Returns how many points went.
size_t thinPoints(DeviceTimeline& t) {
  const size_t total = t.total_points, old_bucket = std::max<size_t>(1, t.bucket_size);
  const size_t buckets = (total + old_bucket - 1) / old_bucket;
  const size_t target = std::max(kHalvingMinPoints, buckets / 2);
  if (total <= target || t.points.size() <= kHalvingMinPoints) return 0;
  size_t bucket = (total + target - 1) / target;
  bucket = (bucket + old_bucket - 1) / old_bucket * old_bucket;
  if (bucket <= old_bucket) return 0;
  std::vector<int64_t> always = {-1, t.peak_reserved.event, t.peak_requested.event,
                                 t.peak_allocated.event, t.peak_active.event};
  for (const auto& o : t.ooms) always.push_back(o.event);
  std::sort(always.begin(), always.end());
  const auto& pts = t.points;
  std::vector<uint8_t> keep(pts.size(), 0);
  auto bucketOf = [&](size_t i) { return static_cast<uint64_t>(pts[i].event + 1) / bucket; };
  for (size_t b0 = 0; b0 < pts.size();) {
    size_t b1 = b0 + 1;
    while (b1 < pts.size() && bucketOf(b1) == bucketOf(b0)) ++b1;
    size_t req_lo = b0, req_hi = b0, res_hi = b0, alloc_hi = b0, pend_hi = b0;
    for (size_t i = b0 + 1; i < b1; ++i) {
      const replay::Counters& c = pts[i].at;
      if (c.requested < pts[req_lo].at.requested) req_lo = i;
      if (c.requested > pts[req_hi].at.requested) req_hi = i;
      if (c.reserved > pts[res_hi].at.reserved) res_hi = i;
      if (c.allocated > pts[alloc_hi].at.allocated) alloc_hi = i;
      if (c.pending > pts[pend_hi].at.pending) pend_hi = i;
    }
    for (size_t i : {req_lo, req_hi, res_hi, alloc_hi, pend_hi}) keep[i] = 1;
    b0 = b1;
  }
  std::vector<TimelinePoint> kept;
  for (size_t i = 0; i < pts.size(); ++i) {
    if (keep[i] || std::binary_search(always.begin(), always.end(), pts[i].event))
      kept.push_back(pts[i]);
  }
  const size_t cut = pts.size() - kept.size();
  t.points = std::move(kept);
  t.bucket_size = bucket;
  t.downsampled = true;
  return cut;
}

// A keyframe's blocks merged into runs until at most `cap` pieces are drawn (mergeThreshold).
// Returns how many drawn pieces went.
size_t remergeKeyframe(Keyframe& k, size_t cap) {
  size_t pieces = 0;
  uint64_t reserved = 0;
  for (const auto& s : k.segments) {
    pieces += s.blocks.size();
    reserved += s.size;
  }
  const uint64_t threshold = mergeThreshold(k.segments, pieces, reserved, cap);
  if (threshold == 0) return 0;
  size_t after = 0;
  for (auto& s : k.segments) {
    std::vector<MapBlock> merged;
    forEachPiece(s.blocks, threshold, [&](size_t first, size_t last) {
      merged.push_back(last - first == 1 ? s.blocks[first] : mergeRun(s.blocks, first, last));
    });
    s.blocks = std::move(merged);
    after += s.blocks.size();
  }
  return pieces - after;
}

std::string plural(uint64_t n, const char* one, const char* many) {
  return fmtCount(n) + " " + (n == 1 ? one : many);
}

}  // namespace

HalvingCuts halveReportData(ReportData& data) {
  HalvingCuts c;
  for (auto& d : data.devices) {
    c.points += thinPoints(d.timeline);
    // Every other evenly spaced keyframe; the labelled ones (peaks, OOMs, the end) all stay.
    size_t even = 0;
    const size_t before = d.keyframes.size();
    std::erase_if(d.keyframes, [&](const Keyframe& k) { return k.labels.empty() && even++ % 2; });
    c.keyframes += before - d.keyframes.size();
    for (auto& k : d.keyframes) {
      size_t pieces = 0;
      for (const auto& s : k.segments) pieces += s.blocks.size();
      c.blocks_merged += remergeKeyframe(k, std::max(kHalvingMinKeyframeBlocks, pieces / 2));
    }
    c.icicle_nodes += pruneIcicle(d.icicle, std::max(kHalvingMinIcicleNodes, d.icicle.size() / 2));
    for (auto& k : d.keyframes) {
      c.icicle_nodes +=
          pruneIcicle(k.icicle, std::max(kHalvingMinIcicleNodes, k.icicle.size() / 2));
    }
    // The allocation view: the larger half of the drawn allocations stays; the rest band takes
    // the others' bytes.
    if (d.allocations.drawn.size() > kHalvingMinAllocations) {
      c.allocations += halveAllocationView(
          d.allocations, std::max(kHalvingMinAllocations, d.allocations.drawn.size() / 2));
    }
    // The segment timeline: the larger half of its bands.
    auto& lives = d.segment_timeline.lives;
    if (lives.size() > kHalvingMinAllocations) {
      std::vector<size_t> order(lives.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t x, size_t y) { return lives[x].bytes > lives[y].bytes; });
      order.resize(std::max(kHalvingMinAllocations, lives.size() / 2));
      std::sort(order.begin(), order.end());
      std::vector<SegmentLife> kept;
      for (size_t i : order) kept.push_back(lives[i]);
      c.segment_lives += lives.size() - kept.size();
      d.segment_timeline.left_out += lives.size() - kept.size();
      lives = std::move(kept);
    }
    // Event stepping: half the window, around the same moment.
    if (!d.stepping.empty()) {
      const size_t cost = steppingCost(d.stepping);
      c.stepped_events += trimSteppingView(d.stepping, cost / 2);
      if (steppingCost(d.stepping) > cost * 3 / 4) {  // the base or the shortest window
        c.stepped_events += d.stepping.events.size();
        dropSteppingView(d.stepping, cost / 2);
      }
    }
  }
  // Stacks: the first half keep their names (those named first: the peaks' and OOMs' blocks).
  if (data.stacks.size() > kHalvingMinStacks) {
    const size_t keep = std::max(kHalvingMinStacks, data.stacks.size() / 2);
    c.stacks += data.stacks.size() - keep;
    data.stacks.resize(keep);
    for (auto& d : data.devices) {
      for (auto& k : d.keyframes) {
        for (auto& s : k.segments) {
          for (auto& b : s.blocks) {
            if (b.stack >= static_cast<int32_t>(keep)) b.stack = -1;
          }
        }
      }
      for (auto& a : d.allocations.drawn) {
        if (a.stack >= static_cast<int32_t>(keep)) a.stack = -1;
      }
      auto cut = [&](int32_t& st) {
        if (st >= static_cast<int32_t>(keep)) st = -1;
      };
      for (auto& b : d.stepping.base) cut(b.stack);
      for (auto& p : d.stepping.patches) {
        for (auto& b : p.blocks) cut(b.stack);
      }
      for (auto& e : d.stepping.events) cut(e.stack);
      for (auto& l : d.segment_timeline.lives) cut(l.stack);
      for (auto& b : d.allocations.buckets) {  // a row whose stack lost its name names none
        for (auto& r : b.stacks) {
          if (r.stack >= static_cast<int32_t>(keep)) {
            r.stack = -1;
            r.exact = false;
          }
        }
      }
    }
  }
  // Frames per stack: the innermost half of the longest (where the memory was allocated).
  size_t longest = 0;
  for (const auto& st : data.stacks) longest = std::max(longest, st.size());
  if (longest > kHalvingMinFramesPerStack) {
    const size_t keep = std::max(kHalvingMinFramesPerStack, longest / 2);
    for (auto& st : data.stacks) {
      if (st.size() <= keep) continue;
      c.stack_frames += st.size() - keep;
      st.resize(keep);
    }
  }
  // The frame table keeps the frames still named by a stack or a call-tree node.
  std::vector<int32_t> remap(data.frames.size(), -1);
  auto use = [&](int32_t f) {
    if (f >= 0 && static_cast<size_t>(f) < remap.size()) remap[static_cast<size_t>(f)] = 0;
  };
  for (const auto& st : data.stacks) {
    for (int32_t f : st) use(f);
  }
  for (const auto& d : data.devices) {
    for (const auto& n : d.icicle) use(n.frame);
    for (const auto& k : d.keyframes) {
      for (const auto& n : k.icicle) use(n.frame);
    }
  }
  std::vector<FrameText> frames;
  for (size_t i = 0; i < remap.size(); ++i) {
    if (remap[i] < 0) continue;
    remap[i] = static_cast<int32_t>(frames.size());
    frames.push_back(std::move(data.frames[i]));
  }
  if (frames.size() < data.frames.size()) {
    auto to = [&](int32_t f) { return f >= 0 ? remap[static_cast<size_t>(f)] : f; };
    for (auto& st : data.stacks) {
      for (int32_t& f : st) f = to(f);
    }
    for (auto& d : data.devices) {
      for (auto& n : d.icicle) n.frame = to(n.frame);
      for (auto& k : d.keyframes) {
        for (auto& n : k.icicle) n.frame = to(n.frame);
      }
    }
    data.frames = std::move(frames);
  }
  return c;
}

std::string halvingNote(const HalvingCuts& c, size_t times, size_t max_bytes) {
  std::vector<std::string> parts;
  if (c.points) parts.push_back(plural(c.points, "timeline point", "timeline points"));
  if (c.keyframes)
    parts.push_back(plural(c.keyframes, "evenly spaced keyframe", "evenly spaced keyframes"));
  if (c.blocks_merged)
    parts.push_back(plural(c.blocks_merged, "block-map piece merged into runs",
                           "block-map pieces merged into runs"));
  if (c.icicle_nodes) parts.push_back(plural(c.icicle_nodes, "call-tree node", "call-tree nodes"));
  if (c.stacks)
    parts.push_back(plural(c.stacks, "stack no longer named", "stacks no longer named"));
  if (c.stack_frames)
    parts.push_back(plural(c.stack_frames, "outer stack frame", "outer stack frames"));
  if (c.allocations)
    parts.push_back(plural(c.allocations, "allocation drawn one by one (now in the rest band)",
                           "allocations drawn one by one (now in the rest band)"));
  if (c.segment_lives)
    parts.push_back(
        plural(c.segment_lives, "band of the segment timeline", "bands of the segment timeline"));
  if (c.stepped_events)
    parts.push_back(
        plural(c.stepped_events, "event of the stepping window", "events of the stepping window"));
  std::string what;
  for (size_t i = 0; i < parts.size(); ++i) {
    what += i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ";
    what += parts[i];
  }
  return "the report's bounds were halved " + std::to_string(times) +
         " time(s) to keep the page under " + fmtCount(max_bytes) + " bytes" +
         (what.empty() ? std::string() : ": " + what + " left out");
}

std::string_view mapStateName(MapState s) {
  switch (s) {
    case MapState::Free:
      return "free";
    case MapState::Allocated:
      return "allocated";
    case MapState::PendingFree:
      return "pending_free";
  }
  return "free";
}

ReportPlan planReport(const std::vector<const DeviceFacts*>& devices,
                      const ReportDataOptions& opt) {
  ReportPlan plan;
  std::vector<const DeviceFacts*> chosen;
  for (const DeviceFacts* f : devices) {
    if (!opt.device || *opt.device == f->device) chosen.push_back(f);
  }
  plan.candidates = chosen.size();
  if (chosen.size() > opt.max_detail_devices) {
    // The devices most worth drawing: with OOMs first, then the highest reserved peak.
    std::vector<std::pair<std::pair<uint64_t, uint64_t>, int64_t>> rank;
    for (const DeviceFacts* f : chosen) {
      rank.push_back({{f->summary.ooms.size(), f->summary.peak_reserved.bytes}, f->device});
    }
    std::stable_sort(rank.begin(), rank.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t i = 0; i < rank.size(); ++i) {
      (i < opt.max_detail_devices ? plan.drawn : plan.summary_only).push_back(rank[i].second);
    }
  } else {
    for (const DeviceFacts* f : chosen) plan.drawn.push_back(f->device);
  }
  std::sort(plan.drawn.begin(), plan.drawn.end());
  std::sort(plan.summary_only.begin(), plan.summary_only.end());
  // Bounds per device: the block budget is shared; series points, keyframes and tree nodes shrink
  // with the number of devices drawn (one or two devices get the full amount).
  const size_t nd = std::max<size_t>(1, plan.drawn.size());
  const double share = nd <= 2 ? 1.0 : 2.0 / static_cast<double>(nd);
  plan.block_budget = std::max<size_t>(1, opt.max_blocks / nd);
  plan.max_points =
      std::max<size_t>(64, static_cast<size_t>(static_cast<double>(opt.max_points) * share));
  plan.even_keyframes =
      static_cast<size_t>(static_cast<double>(opt.even_keyframes) * std::sqrt(share));
  plan.max_icicle_nodes =
      std::max<size_t>(100, static_cast<size_t>(static_cast<double>(opt.max_icicle_nodes) * share));
  plan.allocation_bytes = static_cast<size_t>(static_cast<double>(opt.allocation_bytes) * share);
  // Event stepping: one budget for the whole report, split evenly between the kSteppingDevices
  // drawn devices ranked first (with OOMs first, then the highest reserved peak).
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, int64_t>> ranked;
  for (const DeviceFacts* f : chosen) {
    if (plan.draws(f->device))
      ranked.push_back({{f->summary.ooms.size(), f->summary.peak_reserved.bytes}, f->device});
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < ranked.size() && i < kSteppingDevices; ++i)
    plan.stepped.push_back(ranked[i].second);
  std::sort(plan.stepped.begin(), plan.stepped.end());
  plan.stepping_bytes = opt.stepping_bytes / std::max<size_t>(1, plan.stepped.size());
  plan.segment_lives =
      std::max<size_t>(200, static_cast<size_t>(static_cast<double>(kMaxSegmentLives) * share));
  plan.moment_icicle_nodes =
      std::max<size_t>(100, static_cast<size_t>(static_cast<double>(kMomentIcicleNodes) * share));
  return plan;
}

bool ReportPlan::draws(int64_t device) const {
  return std::binary_search(drawn.begin(), drawn.end(), device);
}

bool ReportPlan::steps(int64_t device) const {
  return std::binary_search(stepped.begin(), stepped.end(), device);
}

std::map<int64_t, KeyframeMoment> keyframeMoments(const DeviceFacts& f, const ReportPlan& plan,
                                                  const ReportDataOptions& opt) {
  const replay::DeviceSummary& t = f.summary;
  const int64_t n = static_cast<int64_t>(f.events.size());
  std::map<int64_t, KeyframeMoment> all;
  auto important = [&](int64_t ev, std::string label) {
    all[ev].labels.push_back(std::move(label));
    all[ev].important = true;
  };
  important(t.peak_requested.event, "requested peak");
  important(t.peak_reserved.event, "reserved peak");
  important(t.peak_allocated.event, "allocated peak");
  // The OOMs with a verdict when the caps agree (the first ones and the last, the one that ended
  // the job when it was not caught).
  for (size_t i = 0; i < t.ooms.size(); ++i) {
    if (!oomHasVerdict(i, t.ooms.size(), opt.max_oom_keyframes)) continue;
    important(t.ooms[i].event, "OOM " + std::to_string(i + 1));
  }
  if (n > 0) {
    all[n - 1].labels.push_back("end");
    size_t k = std::min<size_t>(plan.even_keyframes, static_cast<size_t>(n));
    for (size_t i = 0; i < k; ++i) {
      int64_t e = static_cast<int64_t>((static_cast<double>(i) + 0.5) * static_cast<double>(n) /
                                       static_cast<double>(k));
      all[std::min(e, n - 1)];
    }
  }
  return all;
}

void requestReportMoments(const format::Snapshot& snap, DeviceSession& session,
                          const ReportPlan& plan, const ReportDataOptions& opt) {
  const DeviceFacts& f = session.facts();
  if (!plan.draws(f.device)) return;
  session.requestSeries();  // the timeline and the rest band: drawn devices only
  for (const auto& [ev, m] : keyframeMoments(f, plan, opt)) {
    const uint32_t why = m.important ? kMomentPeakRequested : kMomentKeyframe;
    if (snap.has_segment_info) {
      session.requestLayout(ev, why);
    } else {
      session.requestLive(ev, why);  // no layout to draw: the moment's call tree only
    }
  }
  session.requestLive(f.summary.peak_requested.event, kMomentPeakRequested);
  if (snap.has_segment_info && plan.steps(f.device)) {
    if (auto w = steppingWindow(f, plan.stepping_bytes)) session.requestStepping(w->first, w->last);
  }
}

std::vector<int64_t> reportLiveEvents(const format::Snapshot& snap, const DeviceFacts& f,
                                      const ReportPlan& plan, const ReportDataOptions& opt) {
  std::vector<int64_t> out;
  if (!plan.draws(f.device)) return out;  // as requestReportMoments: nothing asked
  if (!snap.has_segment_info) {
    for (const auto& [ev, m] : keyframeMoments(f, plan, opt)) out.push_back(ev);
  }
  out.push_back(f.summary.peak_requested.event);
  return out;
}

ReportData reportDataOf(const format::Snapshot& snap, std::span<const DeviceFacts> facts,
                        const ReportDataOptions& opt) {
  ReportData out;
  Tables tables(snap, out, opt);
  std::vector<const DeviceFacts*> all;
  for (const DeviceFacts& f : facts) all.push_back(&f);
  const ReportPlan plan = planReport(all, opt);
  out.summary_only = plan.summary_only;
  if (!plan.summary_only.empty()) {
    out.caps.push_back("devices: " + std::to_string(out.summary_only.size()) + " of " +
                       std::to_string(plan.candidates) +
                       " devices have their summary and findings only (drawings for " +
                       std::to_string(opt.max_detail_devices) +
                       " at most: those with OOMs, then the highest reserved peaks; `report "
                       "--device N` draws any one)");
  }
  const size_t block_budget = plan.block_budget;
  const size_t max_icicle_nodes = plan.max_icicle_nodes;
  uint64_t merged_keyframes = 0, merged_blocks = 0, ooms_without_keyframe = 0, icicle_cut = 0,
           keyframes_dropped = 0, phases_cut = 0, moments_missing = 0, moment_icicle_cut = 0;
  for (const DeviceFacts& f : facts) {
    if (!plan.draws(f.device)) continue;
    const int64_t d = f.device;
    DeviceReportData dr;
    dr.device = d;
    TimelineOptions topt;
    topt.device = d;
    topt.max_points = plan.max_points;
    dr.timeline = timelineOf(snap, f, topt);
    if (dr.timeline.phases.size() > opt.max_phases) {
      // The longest ranges (steps before what they hold), back in their order.
      auto& ph = dr.timeline.phases;
      std::vector<size_t> idx(ph.size());
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
      auto len = [&](size_t i) { return ph[i].phase.last_event - ph[i].phase.first_event; };
      std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return len(a) > len(b); });
      idx.resize(opt.max_phases);
      std::sort(idx.begin(), idx.end());
      std::vector<PhaseStats> kept;
      kept.reserve(idx.size());
      for (size_t i : idx) kept.push_back(std::move(ph[i]));
      phases_cut += ph.size() - kept.size();
      ph = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(f.events.size());
    ooms_without_keyframe +=
        f.summary.ooms.size() - oomsWithVerdict(f.summary.ooms.size(), opt.max_oom_keyframes);

    // Keyframes: the moments that matter first, then evenly spaced ones.
    const std::map<int64_t, KeyframeMoment> all = keyframeMoments(f, plan, opt);
    size_t n_imp = 0;
    for (const auto& [ev, m] : all) n_imp += m.important;
    // The budget counts a drawn block as 1 and a segment as 2 (its own record). Half of it goes to
    // the important moments; the rest to evenly spaced ones, thinned out as they turn out to cost
    // more (in event order, as a forward pass would meet them).
    size_t n_rest = all.size() - std::min(all.size(), n_imp);
    size_t cap_imp = std::max<size_t>(
        64, (n_rest ? block_budget / 2 : block_budget) / std::max<size_t>(1, n_imp));
    size_t rest_budget = block_budget - std::min(block_budget, cap_imp * n_imp);
    // Rather a dozen exact moments than forty blurred ones: the thinning below drops the surplus.
    size_t cap_rest = n_rest ? std::max<size_t>(64, rest_budget / std::min<size_t>(n_rest, 12)) : 0;
    size_t rest_spent = 0, rest_left = n_rest, rest_skip = 0;
    double rest_cost = 0;  // mean cost of the evenly spaced keyframes built so far

    KeyframeBuilder kb(snap, f, tables);
    const size_t icicle_per_moment = std::max<size_t>(
        100, plan.moment_icicle_nodes /
                 std::min<size_t>(kMomentIcicles, std::max<size_t>(1, all.size())));
    for (const auto& [ev, moment] : all) {
      const bool is_important = moment.important;
      if (!is_important) {
        // Keep every (skip+1)-th of the remaining evenly spaced moments so their expected cost
        // fits.
        if (rest_skip > 0) {
          --rest_skip;
          --rest_left;
          ++keyframes_dropped;
          continue;
        }
      }
      const MomentFacts* m = f.at(ev);
      const bool usable = m != nullptr && (snap.has_segment_info ? m->has_layout : m->has_live);
      if (!usable) {  // not requested (requestReportMoments), or refused
        ++moments_missing;
        if (!is_important) --rest_left;
        continue;
      }
      Keyframe k;
      if (snap.has_segment_info) {
        k = kb.build(ev, m->layout, is_important ? cap_imp : cap_rest);
      } else {
        k.event = ev;
        k.at = m->at;
      }
      k.labels = moment.labels;
      if (snap.has_segment_info && ev >= 0 && ev < n &&
          f.events[static_cast<size_t>(ev)].action == format::Action::Oom)
        k.oom = oomVerdictAt(snap, f, *m);
      if (!is_important) {
        size_t cost = keyframeCost(k);
        rest_spent += cost;
        --rest_left;
        size_t built = n_rest - rest_left;
        rest_cost = static_cast<double>(rest_spent) / static_cast<double>(built);
        size_t room = rest_budget - std::min(rest_budget, rest_spent);
        size_t affordable =
            static_cast<size_t>(static_cast<double>(room) / std::max(1.0, rest_cost));
        rest_skip = affordable >= rest_left ? 0
                    : affordable == 0       ? rest_left
                                            : (rest_left - affordable) / affordable;
      }
      if (ev >= 0 && ev < n) k.time_us = f.events[static_cast<size_t>(ev)].time_us;
      size_t kept = 0;
      for (const auto& s : k.segments) kept += s.blocks.size();
      if (kept < k.blocks_before_merge) {
        ++merged_keyframes;
        merged_blocks += k.blocks_before_merge - kept;
      }
      dr.keyframes.push_back(std::move(k));
    }
    // What may be called exact: the model's whole-device verdict (session.h ModelFacts), not the
    // prefix up to the last keyframe.
    const replay::ModelVerdict& v = f.model.verdict;
    dr.model.allocs = v.allocs;
    dr.model.alloc_matches = v.alloc_matches;
    dr.model.segment_events = v.segment_events;
    dr.model.segment_matches = v.segment_matches;
    dr.layout_exact = f.model.ran && f.model.layout_exact;
    dr.estimate_reason = dr.layout_exact ? std::string()
                         : f.model.ran   ? f.model.estimate_reason
                                         : std::string("the allocator model did not run");
    dr.final_compared = v.final_compared;
    dr.final_equal = v.final_compared && v.final_diff.empty();
    dr.streams_omitted = dr.timeline.streams_omitted;
    dr.pools_omitted = dr.timeline.pools_omitted;

    dr.has_segment_info = snap.has_segment_info;
    // The card's memory: what the file says, else what the allocator saw at the first OOM.
    const size_t di = static_cast<size_t>(d);
    if (d >= 0 && di < snap.device_total_memory.size() && snap.device_total_memory[di] > 0) {
      dr.capacity_bytes = snap.device_total_memory[di];
      dr.capacity_basis = "the card's memory recorded in the file";
    } else if (!f.summary.ooms.empty() && d >= 0 && di < snap.traceCount()) {
      // The what-if's implied card (one home): reserved + device free at the tightest OOM, and at
      // least the reserved bytes reached before it (the card held them; at an OOM PyTorch has
      // already given its cache back, so reserved + free there can be below the peak).
      const uint64_t cap = analysis::impliedCapacity(analysis::TraceInput{snap, di, f.events});
      if (cap != analysis::kWhatIfUnlimited && cap > 0) {
        dr.capacity_bytes = cap;
        dr.capacity_basis =
            "implied by the OOMs: reserved + device free at the tightest one, at least the "
            "reserved bytes reached before it";
      }
    }
    dr.icicle_event = f.summary.peak_requested.event;
    if (const MomentFacts* m = f.at(dr.icicle_event); m && m->has_live) {
      dr.icicle = buildIcicle(snap, f, m->live, tables, max_icicle_nodes, icicle_cut);
    } else {
      ++moments_missing;
    }
    // What the drawings above name comes first in the frame and stack tables; the allocation
    // view's stacks and the keyframes' call trees after them.
    dr.allocations = allocationViewOf(
        f, plan.allocation_bytes, opt.max_drawn_allocations, dr.timeline.has_times,
        [&](StackId id) { return tables.stack(id); }, tables.maxStacks());
    // Event stepping: its stacks after the drawings' (the first ones keep their names when a
    // page over its bound is halved).
    if (snap.has_segment_info && !plan.steps(d)) {
      dr.stepping.unavailable = "event stepping goes to the " + std::to_string(kSteppingDevices) +
                                " devices with OOMs first, then the highest reserved peaks; "
                                "`memforensics report --device " +
                                std::to_string(d) + "` steps this one";
    }
    if (snap.has_segment_info) {
      if (auto w = plan.steps(d) ? steppingWindow(f, plan.stepping_bytes) : std::nullopt) {
        dr.stepping = steppingViewOf(snap, f, w->focus, plan.stepping_bytes,
                                     [&](StackId id) { return tables.stack(id); });
        if (dr.stepping.empty() && dr.stepping.unavailable.empty())
          dr.stepping.unavailable = "the session recorded no window";
      }
      dr.segment_timeline = segmentTimelineOf(snap, f, plan.segment_lives,
                                              [&](StackId id) { return tables.stack(id); });
    }
    // Each keyframe's call tree: from its live set where the session copied one, else from the
    // layout's allocated blocks.
    // At most kMomentIcicles trees: the labelled moments (peaks, OOMs, the end) first, then evenly
    // spaced ones picked evenly; the requested peak has its full tree already. The page shows the
    // nearest moment with a tree and says so.
    std::vector<size_t> labelled, even;
    for (size_t i = 0; i < dr.keyframes.size(); ++i) {
      if (dr.keyframes[i].event == dr.icicle_event && !dr.icicle.empty()) continue;
      (dr.keyframes[i].labels.empty() ? even : labelled).push_back(i);
    }
    std::vector<uint8_t> tree(dr.keyframes.size(), 0);
    size_t room = kMomentIcicles;
    for (size_t i : labelled) {
      if (room == 0) break;
      tree[i] = 1;
      --room;
    }
    for (size_t j = 0; j < room && j < even.size(); ++j) tree[even[j * even.size() / room]] = 1;
    for (size_t i = 0; i < dr.keyframes.size(); ++i) {
      Keyframe& k = dr.keyframes[i];
      const MomentFacts* m = f.at(k.event);
      if (m == nullptr || !tree[i]) continue;
      if (m->has_live) {
        k.icicle = buildIcicle(snap, f, m->live, tables, icicle_per_moment, moment_icicle_cut);
        k.icicle_source = IcicleSource::Live;
      } else if (m->has_layout) {
        k.icicle = buildIcicle(snap, f, liveOfLayout(m->layout), tables, icicle_per_moment,
                               moment_icicle_cut);
        k.icicle_source = IcicleSource::Layout;
      }
    }
    out.devices.push_back(std::move(dr));
  }
  if (moments_missing > 0) {
    out.caps.push_back("block map: " + fmtCount(moments_missing) +
                       " moment(s) have no layout or live set (the session's bound on copied "
                       "moments was reached)");
  }
  if (merged_keyframes > 0) {
    out.caps.push_back("block map: in " + fmtCount(merged_keyframes) + " keyframe(s), " +
                       fmtCount(merged_blocks) +
                       " small neighbouring blocks were drawn merged into runs (at most " +
                       fmtCount(opt.max_blocks) + " blocks and segments in the report)");
  }
  if (keyframes_dropped > 0) {
    out.caps.push_back("block map: " + fmtCount(keyframes_dropped) +
                       " evenly spaced keyframes were left out to keep the report small (the peaks "
                       "and OOMs all have theirs)");
  }
  if (ooms_without_keyframe > 0) {
    out.caps.push_back("block map: " + fmtCount(ooms_without_keyframe) +
                       " OOM(s) between the first " +
                       fmtCount(opt.max_oom_keyframes > 1 ? opt.max_oom_keyframes - 1 : 0) +
                       " and the last of a device have no keyframe of their own");
  }
  if (icicle_cut > 0) {
    out.caps.push_back("call tree: " + fmtCount(icicle_cut) + " small nodes left out (at most " +
                       fmtCount(max_icicle_nodes) +
                       " per device); their bytes stay in their parents");
  }
  if (moment_icicle_cut > 0) {
    out.caps.push_back("call tree: " + fmtCount(moment_icicle_cut) +
                       " small nodes left out of the keyframes' call trees (" +
                       fmtCount(kMomentIcicleNodes) +
                       " per device, shared by the keyframes); their bytes stay in their parents");
  }
  if (phases_cut > 0) {
    out.caps.push_back("timeline: " + fmtCount(phases_cut) + " phases not drawn (at most " +
                       fmtCount(opt.max_phases) +
                       " per device, the longest; `timeline` lists them all)");
  }
  if (tables.stacksCapped() > 0) {
    out.caps.push_back("stacks: " + fmtCount(tables.stacksCapped()) + " stacks beyond the first " +
                       fmtCount(opt.max_stacks) + " are not named by their blocks");
  }
  out.allocation_bound = opt.max_drawn_allocations;
  out.allocation_bound_bytes = opt.allocation_bytes;
  return out;
}

std::vector<std::string> drawnCaps(const ReportData& data) {
  std::vector<std::string> caps;
  size_t capped = 0, drawn = 0, total = 0;
  for (const auto& d : data.devices) {
    if (!d.allocations.capped) continue;
    ++capped;
    drawn += d.allocations.drawn.size();
    total += d.allocations.allocations;
  }
  if (capped > 0) {
    caps.push_back("allocations: on " + fmtCount(capped) + " device(s) the " + fmtCount(drawn) +
                   " largest of " + fmtCount(total) +
                   " allocations are drawn one by one (at most " + fmtCount(data.allocation_bound) +
                   " and " + fmtCount(data.allocation_bound_bytes) +
                   " bytes of data per device); the others form one band per bucket of events");
  }
  size_t downsampled = 0, total_points = 0, kept_points = 0;
  for (const auto& d : data.devices) {
    if (!d.timeline.downsampled) continue;
    ++downsampled;
    total_points += d.timeline.total_points;
    kept_points += d.timeline.points.size();
  }
  if (downsampled > 0) {
    caps.push_back(
        "timeline: " + fmtCount(downsampled) + " device(s) with " + fmtCount(total_points) +
        " points in all are drawn from " + fmtCount(kept_points) +
        " kept ones (per bucket the minimum and maximum of each series; every peak and OOM exact)");
  }
  return caps;
}

ReportData buildReportData(const format::Snapshot& snap, const ReportDataOptions& opt) {
  // One session per device: pass 1 for every device (the plan ranks them), then one visit each,
  // which takes the series of the drawn devices (requestReportMoments).
  std::vector<std::unique_ptr<DeviceSession>> sessions;
  std::vector<const DeviceFacts*> pass1;
  SessionOptions so;
  so.checkpoints = false;  // every device's session lives until its visit (SessionOptions)
  for (int64_t d : snap.devices()) {
    if (opt.device && *opt.device != d) continue;
    sessions.push_back(std::make_unique<DeviceSession>(snap, d, so));
    pass1.push_back(&sessions.back()->facts());
  }
  const ReportPlan plan = planReport(pass1, opt);
  std::vector<DeviceFacts> facts;
  for (auto& s : sessions) {
    requestReportMoments(snap, *s, plan, opt);
    s->visit();
    facts.push_back(s->take());
    s.reset();
  }
  return reportDataOf(snap, facts, opt);
}

}  // namespace memforensics::analysis
