// report_data.cc: the bounded data set behind the HTML report (see report_data.h).
#include "report/html/report_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <unordered_map>
#include <utility>

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
  if (s.pool.first == 0 && s.pool.second == 0) return s.is_large ? "large" : "small";
  return "private (" + std::to_string(s.pool.first) + ", " + std::to_string(s.pool.second) + ")";
}

MapState stateOf(const replay::ModelBlock& b) {
  switch (b.state) {
    case format::BlockState::ActiveAllocated:
      return MapState::Allocated;
    case format::BlockState::ActivePendingFree:
      return MapState::PendingFree;
    default:
      return MapState::Free;
  }
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
  KeyframeBuilder(const format::Snapshot& snap, int64_t device, Tables& tables)
      : cats_(snap, device), tables_(tables) {}

  Keyframe build(int64_t event, const std::vector<replay::ModelSegment>& layout, size_t cap) {
    Keyframe k;
    k.event = event;
    k.blocks_before_merge = blockCount(layout);
    uint64_t reserved = 0;
    for (const auto& s : layout) reserved += s.size;
    // The smallest threshold (doubling) that brings the block count under the cap.
    const uint64_t threshold = mergeThreshold(layout, k.blocks_before_merge, reserved, cap);
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
      for (const auto& b : s.blocks) {
        if (b.state == format::BlockState::ActiveAllocated) {
          k.at.allocated += b.size;
          k.at.requested += b.requested;
        } else if (b.state == format::BlockState::ActivePendingFree) {
          k.at.pending += b.size;
          k.at.requested += b.requested;
        }
      }
      k.at.reserved += s.size;
      k.segments.push_back(std::move(ms));
    }
    return k;
  }

 private:
  MapBlock convert(const replay::ModelBlock& b) {
    MapBlock mb;
    mb.size = b.size;
    mb.state = stateOf(b);
    if (mb.state != MapState::Free) {
      mb.requested = b.requested;
      mb.category = cats_.of(b.alloc_event, b.stack);
      mb.stack = tables_.stack(b.stack);
      mb.alloc_event = b.alloc_event;
    }
    return mb;
  }

  AllocationCategories cats_;
  Tables& tables_;
};

// Keeps the max_nodes heaviest nodes of a tree whose parents come before their children; a parent
// weighs at least as much as its child, and on ties the parent (created first) wins, so every kept
// node's parent is kept. Returns how many nodes went; their bytes stay in their parents.
uint64_t pruneIcicle(std::vector<IcicleNode>& nodes, size_t max_nodes) {
  if (nodes.size() <= max_nodes) return 0;
  std::vector<int32_t> order(nodes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return nodes[a].bytes > nodes[b].bytes; });
  std::vector<int32_t> remap(nodes.size(), -1);
  std::vector<uint8_t> keep(nodes.size(), 0);
  for (size_t i = 0; i < max_nodes; ++i) keep[order[i]] = 1;
  std::vector<IcicleNode> out;
  uint64_t cut = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!keep[i] || (nodes[i].parent >= 0 && remap[nodes[i].parent] < 0 && i != 0)) {
      ++cut;
      continue;
    }
    remap[i] = static_cast<int32_t>(out.size());
    IcicleNode n = std::move(nodes[i]);
    if (n.parent >= 0) n.parent = remap[n.parent];
    out.push_back(std::move(n));
  }
  nodes = std::move(out);
  return cut;
}

std::vector<IcicleNode> buildIcicle(const format::Snapshot& snap, int64_t device, int64_t event,
                                    Tables& tables, size_t max_nodes, uint64_t& nodes_cut) {
  replay::DeviceReplayer r(snap, device);
  r.advanceTo(event);
  std::unordered_map<StackId, std::pair<uint64_t, uint64_t>> by_stack;  // bytes, blocks
  r.live().forEach([&](uint64_t, const replay::LiveBlock& b) {
    if (b.pending) return;
    auto& e = by_stack[b.stack];
    e.first += b.requested;
    e.second += 1;
  });
  std::vector<IcicleNode> nodes;
  IcicleNode root;
  root.label = "all live memory";
  nodes.push_back(root);
  std::map<std::pair<int32_t, int32_t>, int32_t>
      child;  // (parent, frame) -> node; frame -1 = no stack
  std::vector<std::pair<StackId, std::pair<uint64_t, uint64_t>>> stacks(by_stack.begin(),
                                                                        by_stack.end());
  // Insertion order decides node order among equals: make it independent of stack ids.
  std::sort(stacks.begin(), stacks.end(), [&](const auto& a, const auto& b) {
    if (a.second.first != b.second.first) return a.second.first > b.second.first;
    return tables.framesOf(a.first) < tables.framesOf(b.first);
  });
  for (const auto& entry : stacks) {
    const auto& v =
        entry.second;  // not a structured binding: clang 14 cannot capture those in a lambda
    const std::vector<int32_t>& fr = tables.framesOf(entry.first);
    nodes[0].bytes += v.first;
    nodes[0].blocks += v.second;
    int32_t cur = 0;
    auto descend = [&](int32_t frame, const char* label) {
      auto [it, fresh] = child.try_emplace({cur, frame}, static_cast<int32_t>(nodes.size()));
      if (fresh) {
        IcicleNode n;
        n.frame = frame;
        n.parent = cur;
        if (label) n.label = label;
        nodes.push_back(std::move(n));
      }
      cur = it->second;
      nodes[cur].bytes += v.first;
      nodes[cur].blocks += v.second;
    };
    if (fr.empty()) {
      descend(-1, "(no stack recorded)");
    } else {
      for (auto f = fr.rbegin(); f != fr.rend(); ++f) descend(*f, nullptr);
    }
    nodes[cur].self += v.first;
  }
  nodes_cut += pruneIcicle(nodes, max_nodes);
  return nodes;
}

std::string fmtCount(uint64_t n) {
  return std::to_string(n);
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

ReportData buildReportData(const format::Snapshot& snap, const ReportDataOptions& opt) {
  ReportData out;
  Tables tables(snap, out, opt);
  std::vector<int64_t> devices;
  for (int64_t d : snap.devices()) {
    if (!opt.device || *opt.device == d) devices.push_back(d);
  }
  if (devices.size() > opt.max_detail_devices) {
    // The devices most worth drawing: with OOMs first, then the highest reserved peak.
    std::vector<std::pair<std::pair<uint64_t, uint64_t>, int64_t>> rank;
    for (int64_t d : devices) {
      replay::DeviceReplayer r(snap, d);
      replay::DeviceSummary sum = replay::summarizeDevice(r);
      rank.push_back({{sum.ooms.size(), sum.peak_reserved.bytes}, d});
    }
    std::stable_sort(rank.begin(), rank.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    devices.clear();
    for (size_t i = 0; i < rank.size(); ++i) {
      if (i < opt.max_detail_devices)
        devices.push_back(rank[i].second);
      else
        out.summary_only.push_back(rank[i].second);
    }
    std::sort(devices.begin(), devices.end());
    std::sort(out.summary_only.begin(), out.summary_only.end());
    out.caps.push_back("devices: " + std::to_string(out.summary_only.size()) + " of " +
                       std::to_string(rank.size()) +
                       " devices have their summary and findings only (drawings for " +
                       std::to_string(opt.max_detail_devices) +
                       " at most: those with OOMs, then the highest reserved peaks; `report "
                       "--device N` draws any one)");
  }
  // Bounds per device: the block budget is shared; series points, keyframes and tree nodes shrink
  // with the number of devices drawn (one or two devices get the full amount).
  const size_t nd = std::max<size_t>(1, devices.size());
  const double share = nd <= 2 ? 1.0 : 2.0 / static_cast<double>(nd);
  const size_t block_budget = std::max<size_t>(1, opt.max_blocks / nd);
  const size_t max_points =
      std::max<size_t>(64, static_cast<size_t>(static_cast<double>(opt.max_points) * share));
  const size_t even_keyframes =
      static_cast<size_t>(static_cast<double>(opt.even_keyframes) * std::sqrt(share));
  const size_t max_icicle_nodes =
      std::max<size_t>(100, static_cast<size_t>(static_cast<double>(opt.max_icicle_nodes) * share));
  uint64_t merged_keyframes = 0, merged_blocks = 0, ooms_without_keyframe = 0, icicle_cut = 0,
           keyframes_dropped = 0, phases_cut = 0;
  for (int64_t d : devices) {
    DeviceReportData dr;
    dr.device = d;
    TimelineOptions topt;
    topt.device = d;
    topt.max_points = max_points;
    TimelineResult tl = computeTimeline(snap, topt);
    if (!tl.devices.empty()) dr.timeline = std::move(tl.devices.front());
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
    const DeviceTimeline& t = dr.timeline;
    const int64_t n = static_cast<int64_t>(t.events);

    // Keyframes: the moments that matter first, then evenly spaced ones.
    std::map<int64_t, std::vector<std::string>> important;
    important[t.peak_requested.event].push_back("requested peak");
    important[t.peak_reserved.event].push_back("reserved peak");
    important[t.peak_allocated.event].push_back("allocated peak");
    for (size_t i = 0; i < t.ooms.size(); ++i) {
      if (i >= opt.max_oom_keyframes) {
        ++ooms_without_keyframe;
        continue;
      }
      important[t.ooms[i].event].push_back("OOM " + std::to_string(i + 1));
    }
    std::map<int64_t, std::vector<std::string>> all = important;
    if (n > 0) {
      all[n - 1].push_back("end");
      size_t k = std::min<size_t>(even_keyframes, static_cast<size_t>(n));
      for (size_t i = 0; i < k; ++i) {
        int64_t e = static_cast<int64_t>((static_cast<double>(i) + 0.5) * static_cast<double>(n) /
                                         static_cast<double>(k));
        all[std::min(e, n - 1)];
      }
    }
    // The budget counts a drawn block as 1 and a segment as 2 (its own record). Half of it goes to
    // the important moments; the rest to evenly spaced ones, thinned out as they turn out to cost
    // more (the layout is only known once the model gets there, in one forward pass).
    size_t n_imp = important.size(), n_rest = all.size() - std::min(all.size(), n_imp);
    size_t cap_imp = std::max<size_t>(
        64, (n_rest ? block_budget / 2 : block_budget) / std::max<size_t>(1, n_imp));
    size_t rest_budget = block_budget - std::min(block_budget, cap_imp * n_imp);
    // Rather a dozen exact moments than forty blurred ones: the thinning below drops the surplus.
    size_t cap_rest = n_rest ? std::max<size_t>(64, rest_budget / std::min<size_t>(n_rest, 12)) : 0;
    size_t rest_spent = 0, rest_left = n_rest, rest_skip = 0;
    double rest_cost = 0;  // mean cost of the evenly spaced keyframes built so far

    KeyframeBuilder kb(snap, d, tables);
    replay::DeviceAllocatorModel model(snap, d);
    for (auto& [ev, labels] : all) {
      const bool is_important = important.count(ev) > 0;
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
      model.advanceTo(ev);
      Keyframe k = kb.build(ev, model.layout(), is_important ? cap_imp : cap_rest);
      k.labels = labels;
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
      if (ev >= 0 && ev < n)
        k.time_us = snap.trace(static_cast<size_t>(d))[static_cast<size_t>(ev)].time_us;
      size_t kept = 0;
      for (const auto& s : k.segments) kept += s.blocks.size();
      if (kept < k.blocks_before_merge) {
        ++merged_keyframes;
        merged_blocks += k.blocks_before_merge - kept;
      }
      dr.keyframes.push_back(std::move(k));
    }
    dr.model = model.check();
    dr.layout_exact = dr.model.complete();

    dr.icicle_event = t.peak_requested.event;
    dr.icicle = buildIcicle(snap, d, dr.icicle_event, tables, max_icicle_nodes, icicle_cut);
    out.devices.push_back(std::move(dr));
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
                       " OOM(s) after the first " + fmtCount(opt.max_oom_keyframes) +
                       " per device have no keyframe of their own");
  }
  if (icicle_cut > 0) {
    out.caps.push_back("call tree: " + fmtCount(icicle_cut) + " small nodes left out (at most " +
                       fmtCount(max_icicle_nodes) +
                       " per device); their bytes stay in their parents");
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
  size_t downsampled = 0, total_points = 0, kept_points = 0;
  for (const auto& d : out.devices) {
    if (!d.timeline.downsampled) continue;
    ++downsampled;
    total_points += d.timeline.total_points;
    kept_points += d.timeline.points.size();
  }
  if (downsampled > 0) {
    out.caps.push_back(
        "timeline: " + fmtCount(downsampled) + " device(s) with " + fmtCount(total_points) +
        " points in all are drawn from " + fmtCount(kept_points) +
        " kept ones (per bucket the minimum and maximum of each series; every peak and OOM exact)");
  }
  return out;
}

}  // namespace memforensics::analysis
