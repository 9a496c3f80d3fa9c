// trace_state.cc: see trace_state.h.
#include "format/trace/trace_state.h"

#include <algorithm>

#include "common/allocator_constants.h"
#include "format/model/snapshot.h"  // format::Action, the action numbers of TraceEvent::action

namespace memforensics::format::trace {

void DeviceTraceState::apply(const TraceEvent& e) {
  ++events_;
  switch (static_cast<Action>(e.action)) {
    case Action::Alloc: {
      LiveAlloc a{e.size, e.stack, false, e.stream};
      if (LiveAlloc* old = live_.find(e.addr)) requested_ -= old->requested;
      live_.insert(e.addr, a);
      requested_ += e.size;
      break;
    }
    case Action::FreeRequested:
      if (LiveAlloc* a = live_.find(e.addr)) a->pending = true;
      break;
    case Action::FreeCompleted:
      if (LiveAlloc* a = live_.find(e.addr)) {
        requested_ -= a->requested;
        live_.erase(e.addr);
      }
      break;
    case Action::SegmentAlloc:
    case Action::SegmentMap:
      if (auto r = AddressRange::make(e.addr, e.size)) reserved_.assign(*r);
      break;
    case Action::SegmentFree:
    case Action::SegmentUnmap:
      // Expandable segments unmap parts of what they mapped: the ranges it meets are split.
      if (auto r = AddressRange::make(e.addr, e.size)) reserved_.clip(*r);
      break;
    case Action::Snapshot:
    case Action::Oom:
    case Action::Annotate:
    case Action::Unknown:
      break;
  }
}

bool DeviceTraceState::restore(uint64_t events, U64Map<LiveAlloc> live,
                               const std::map<uint64_t, uint64_t>& segments) {
  events_ = events;
  live_ = std::move(live);
  reserved_.clear();
  bool ok = true;
  for (const auto& [a, n] : segments) {
    auto r = AddressRange::make(a, n);
    ok = r && reserved_.insert(*r) && ok;
  }
  requested_ = 0;
  live_.forEach([&](uint64_t, const LiveAlloc& l) { requested_ += l.requested; });
  return ok;
}

SynthesizedState synthesizeFinalState(const DeviceTraceState& st, uint32_t device,
                                      std::vector<TraceBlock>& blocks) {
  SynthesizedState out;
  std::vector<std::pair<uint64_t, LiveAlloc>> live;
  st.live().forEach([&](uint64_t a, const LiveAlloc& l) { live.emplace_back(a, l); });
  std::sort(live.begin(), live.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  RangeSet ranges = st.reserved();
  for (const auto& [a, l] : live) {
    if (ranges.contains(a)) continue;
    uint64_t size = alloc::estimatedBlockSize(l.requested);
    if (auto next = ranges.firstFrom(a)) size = std::min(size, next->begin - a);
    uint64_t top = ~uint64_t{0} - a;  // the range may not wrap
    if (auto r = AddressRange::make(a, std::min(size, top))) {
      ranges.insert(*r);
      ++out.orphans;
    }
  }
  size_t li = 0;
  for (const AddressRange seg : ranges) {
    TraceSegment g;
    g.device = device;
    g.address = seg.begin;
    g.total_size = seg.size();
    g.is_large = alloc::isLargeSegmentSize(seg.size());
    g.usual_type = true;
    g.first_block = static_cast<uint32_t>(blocks.size());
    alloc::StateSums sums;
    sums.addSegment(seg.size());
    uint64_t cursor = seg.begin;
    while (li < live.size() && live[li].first < seg.begin) ++li;
    for (; li < live.size() && live[li].first < seg.end; ++li) {
      const auto& [a, l] = live[li];
      const uint64_t next = li + 1 < live.size() ? std::min(live[li + 1].first, seg.end) : seg.end;
      if (a > cursor) blocks.push_back(TraceBlock{cursor, a - cursor, 0, kTraceNoStack, 2, false});
      const uint64_t bsize = std::min(next - a, alloc::estimatedBlockSize(l.requested));
      blocks.push_back(TraceBlock{a, bsize, l.requested, l.stack,
                                  static_cast<uint8_t>(l.pending ? 1 : 0), true});
      sums.addBlock(!l.pending, l.pending, bsize, l.requested);
      cursor = a + bsize;
    }
    if (cursor < seg.end)
      blocks.push_back(TraceBlock{cursor, seg.end - cursor, 0, kTraceNoStack, 2, false});
    g.allocated_size = sums.allocated;
    g.active_size = sums.active;
    g.requested_size = sums.requested;
    g.block_count = static_cast<uint32_t>(blocks.size() - g.first_block);
    out.segments.push_back(g);
  }
  return out;
}

}  // namespace memforensics::format::trace
