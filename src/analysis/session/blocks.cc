// blocks.cc: layout at an event and its fragmentation metrics (see blocks.h).
#include "analysis/session/blocks.h"

#include <algorithm>
#include <map>

#include "analysis/findings/findings.h"
#include "common/allocator_constants.h"
#include "common/saturating.h"

namespace memforensics::analysis {

namespace {

using format::Action;
using format::BlockState;

std::string poolLabel(bool is_large, const replay::PoolId& pool) {
  return alloc::poolName(is_large, pool.first, pool.second);
}

void addFree(FreeSpace& f, uint64_t size) {
  f.free_bytes += size;
  f.largest_free = std::max(f.largest_free, size);
  ++f.free_blocks;
}

}  // namespace

OomFlush oomFlushBefore(std::span<const format::Event> events, int64_t oom_event) {
  OomFlush f;
  if (oom_event <= 0 || static_cast<uint64_t>(oom_event) > events.size()) return f;
  bool all_large_pages = true;
  uint64_t unmapped = 0;
  // Past the successful retry of the request before: its maps and its one alloc.
  int64_t last = oom_event - 1;
  bool alloc_seen = false;
  for (; last >= 0; --last) {
    const Action a = events[static_cast<size_t>(last)].action;
    if (a == Action::SegmentMap || a == Action::SegmentAlloc) continue;
    if (a == Action::Alloc && !alloc_seen) {
      alloc_seen = true;
      continue;
    }
    break;
  }
  const Action at_last = last >= 0 ? events[static_cast<size_t>(last)].action : Action::Alloc;
  if (at_last != Action::SegmentFree && at_last != Action::SegmentUnmap) return f;
  f.immediate = last == oom_event - 1;
  for (int64_t i = last; i >= 0; --i) {
    const format::Event& e = events[static_cast<size_t>(i)];
    if (e.action == Action::SegmentFree) {
      ++f.segments_freed;
    } else if (e.action == Action::SegmentUnmap) {
      ++f.ranges_unmapped;
      unmapped = addSat(unmapped, e.size);
      all_large_pages &= e.size % alloc::kLargeExpandablePage == 0;
    } else {
      break;
    }
    f.bytes = addSat(f.bytes, e.size);
    f.first_event = i;
  }
  if (f.ranges_unmapped > 0 && all_large_pages)
    f.pages_unmapped = unmapped / alloc::kLargeExpandablePage;
  return f;
}

Expected<int64_t> blocksDevice(const format::Snapshot& snap, std::optional<int64_t> device) {
  auto devs = snap.devices();
  if (device) {
    if (std::find(devs.begin(), devs.end(), *device) == devs.end()) {
      return Error{"the snapshot has no device " + std::to_string(*device)};
    }
    return *device;
  }
  for (int64_t x : devs) {
    if (snap.traceSize(static_cast<size_t>(x)) > 0) return x;
  }
  if (!devs.empty()) return devs.front();
  return Error{"the snapshot has no device"};
}

Expected<int64_t> resolveBlocksAt(const DeviceFacts& facts, const BlocksAt& at) {
  const auto events = facts.events;
  const int64_t d = facts.device;
  int64_t event = -1;
  switch (at.kind) {
    case BlocksAt::Kind::Peak:
      return facts.summary.peak_requested.event;
    case BlocksAt::Kind::Oom:
      for (size_t i = 0; i < events.size(); ++i) {
        if (events[i].action == Action::Oom) return static_cast<int64_t>(i);
      }
      return Error{"device " + std::to_string(d) + " has no OOM event"};
    case BlocksAt::Kind::Event:
      if (at.value < -1 || at.value >= static_cast<int64_t>(events.size())) {
        return Error{"event " + std::to_string(at.value) + " is out of range: device " +
                     std::to_string(d) + " has " + std::to_string(events.size()) +
                     " events (-1 = the start state)"};
      }
      return at.value;
    case BlocksAt::Kind::Time:
    case BlocksAt::Kind::Elapsed: {
      int64_t until = at.value;
      if (at.kind == BlocksAt::Kind::Elapsed) {
        const int64_t t0 = facts.summary.first_time_us;
        if (t0 < 0) return Error{"device " + std::to_string(d) + " has no time_us in its trace"};
        until = t0 > INT64_MAX - at.value ? INT64_MAX : t0 + at.value;
      }
      bool any_time = false;
      for (size_t i = 0; i < events.size(); ++i) {
        if (events[i].time_us < 0) continue;
        any_time = true;
        if (events[i].time_us <= until) event = static_cast<int64_t>(i);
      }
      if (!any_time) return Error{"device " + std::to_string(d) + " has no time_us in its trace"};
      return event;
    }
  }
  return event;
}

BlocksResult blocksAt(const DeviceFacts& facts, const MomentFacts& m, std::string_view at,
                      const format::Snapshot& snap) {
  const auto events = facts.events;
  const replay::DeviceSummary& summary = facts.summary;
  BlocksResult r;
  r.device = facts.device;
  r.events = events.size();
  r.at = std::string(at);
  r.event = m.event;
  r.consistent = summary.consistent;
  r.untrusted = summary.untrusted;
  r.untrusted_cause = summary.untrusted_cause;
  for (size_t k = 0; k < replay::kAnomalyKinds; ++k) {
    const auto kind = static_cast<replay::AnomalyKind>(k);
    const auto& a = summary.anomalies[k];
    if (a.count == 0 || replay::anomalySeverity(kind) != replay::Severity::Error) continue;
    r.errors.push_back({std::string(replay::anomalyId(kind)), a.count, a.first_event});
  }
  if (r.event >= 0) r.time_us = events[static_cast<size_t>(r.event)].time_us;
  r.model = m.model_prefix;
  r.verdict = facts.model.verdict;
  r.layout_exact = facts.model.layout_exact;
  r.estimate_reason = facts.model.ran ? facts.model.estimate_reason : "the model did not run";
  r.history_gap = historyGap(snap, facts);

  std::map<std::string, FreeSpace> pools;
  std::map<int64_t, FreeSpace> streams;
  for (const auto& seg : m.layout) {
    SegmentBlocks sb;
    const std::string pl = poolLabel(seg.is_large, seg.pool);
    FreeSpace& pf = pools[pl];
    pf.pool = pl;
    FreeSpace& sf = streams[seg.stream];
    sf.stream = seg.stream;
    sf.is_stream = true;
    for (const auto& b : seg.blocks) {
      switch (b.state) {
        case BlockState::ActiveAllocated:
          sb.allocated_bytes += b.size;
          break;
        case BlockState::ActivePendingFree:
          sb.pending_bytes += b.size;
          break;
        default:
          sb.free_bytes += b.size;
          sb.largest_free = std::max(sb.largest_free, b.size);
          ++sb.free_blocks;
          addFree(pf, b.size);
          addFree(sf, b.size);
          break;
      }
      if (!b.isFree()) {
        sb.requested_bytes += b.requested;
        sb.internal_waste += b.size > b.requested ? b.size - b.requested : 0;
      }
    }
    r.reserved_bytes += seg.size;
    r.allocated_bytes += sb.allocated_bytes;
    r.pending_bytes += sb.pending_bytes;
    r.requested_bytes += sb.requested_bytes;
    r.free_bytes += sb.free_bytes;
    r.free_blocks += sb.free_blocks;
    r.largest_free = std::max(r.largest_free, sb.largest_free);
    r.internal_waste += sb.internal_waste;
    sb.segment = seg;
    r.segments.push_back(std::move(sb));
  }
  if (r.free_bytes > 0) {
    r.external_fragmentation =
        1.0 - static_cast<double>(r.largest_free) / static_cast<double>(r.free_bytes);
  }
  for (auto& [k, v] : pools) r.by_pool.push_back(v);
  for (auto& [k, v] : streams) r.by_stream.push_back(v);

  if (r.event >= 0 && events[static_cast<size_t>(r.event)].action == Action::Oom) {
    const auto& e = events[static_cast<size_t>(r.event)];
    OomVerdict v;
    v.event = r.event;
    v.time_us = e.time_us;
    v.request_bytes = e.size;
    v.device_free = e.addr;
    v.stream = e.stream;
    const bool large = e.size > replay::kModelSmallSize;
    replay::PoolId pool{0, 0};
    if (e.pool != 0 && e.pool < snap.pools.size()) pool = snap.pools[e.pool];
    v.pool = poolLabel(large, pool);
    // What the allocator could have used: free blocks of the same pool and stream only.
    for (const auto& sb : r.segments) {
      const auto& s = sb.segment;
      if (s.is_large != large || s.pool != pool || s.stream != e.stream) continue;
      v.pool_free += sb.free_bytes;
      v.pool_largest = std::max(v.pool_largest, sb.largest_free);
    }
    v.fits_total = v.request_bytes <= v.pool_free;
    v.fits_block = v.request_bytes <= v.pool_largest;
    v.fragmentation = v.fits_total && !v.fits_block;
    // What the device would have had to give instead (oomNeed): the segment cudaMalloc would get,
    // or the pages the expandable segment of this pool and stream would map.
    std::vector<const replay::ModelSegment*> group;
    bool expandable = pool == replay::PoolId{0, 0} && replay::allocConfOf(snap).expandable_segments;
    for (const auto& sb : r.segments) {
      const auto& s = sb.segment;
      if (s.is_large != large || s.pool != pool || s.stream != e.stream) continue;
      group.push_back(&s);
      expandable |= s.is_expandable;
    }
    v.need = replay::requestNeed(v.request_bytes, large, expandable, group);
    v.short_by = replay::shortBy(v.need, v.device_free, v.fragmentation);
    r.oom = v;
  }
  return r;
}

std::optional<OomVerdict> oomVerdictAt(const format::Snapshot& snap, const DeviceFacts& facts,
                                       const MomentFacts& m) {
  return blocksAt(facts, m, "oom", snap).oom;
}

Expected<BlocksResult> computeBlocks(const format::Snapshot& snap, std::optional<int64_t> device,
                                     const BlocksAt& at) {
  auto d = blocksDevice(snap, device);
  if (!d) return d.error();
  DeviceSession session(snap, *d);
  auto event = resolveBlocksAt(session.facts(), at);
  if (!event) return event.error();
  session.requestLayout(*event, kMomentAt);
  const DeviceFacts facts = session.take();
  static constexpr std::string_view kAtNames[] = {"peak", "oom", "event", "time", "elapsed"};
  static_assert(std::size(kAtNames) == static_cast<size_t>(BlocksAt::Kind::Elapsed) + 1,
                "a BlocksAt kind has no name");
  return blocksAt(facts, *facts.at(*event), kAtNames[static_cast<size_t>(at.kind)], snap);
}

}  // namespace memforensics::analysis
