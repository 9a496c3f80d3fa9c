// trace_state.cc: see trace_state.h.
#include "format/trace/trace_state.h"

namespace memforensics::format::trace {

void DeviceTraceState::apply(const TraceEvent& e) {
  ++events_;
  switch (e.action) {
    case 0: {  // alloc
      LiveAlloc a{e.size, e.stack, false, e.stream};
      if (LiveAlloc* old = live_.find(e.addr)) requested_ -= old->requested;
      live_.insert(e.addr, a);
      requested_ += e.size;
      break;
    }
    case 1:  // free_requested
      if (LiveAlloc* a = live_.find(e.addr)) a->pending = true;
      break;
    case 2:  // free_completed
      if (LiveAlloc* a = live_.find(e.addr)) {
        requested_ -= a->requested;
        live_.erase(e.addr);
      }
      break;
    case 3:    // segment_alloc
    case 5: {  // segment_map
      if (e.size == 0) break;
      unmap(e.addr, e.size);  // a range mapped twice counts once
      segments_[e.addr] = e.size;
      reserved_ += e.size;
      break;
    }
    case 4:  // segment_free
    case 6:  // segment_unmap
      unmap(e.addr, e.size);
      break;
    default:
      break;
  }
}

// Removes [addr, addr + size) from the reserved ranges, splitting ranges that straddle it
// (expandable segments unmap parts of what they mapped).
void DeviceTraceState::unmap(uint64_t addr, uint64_t size) {
  if (size == 0) return;
  uint64_t end = addr + size < addr ? ~uint64_t{0} : addr + size;
  auto it = segments_.upper_bound(addr);
  if (it != segments_.begin()) --it;
  while (it != segments_.end() && it->first < end) {
    uint64_t s = it->first, e = s + it->second;
    if (e <= addr) {
      ++it;
      continue;
    }
    reserved_ -= it->second;
    it = segments_.erase(it);
    if (s < addr) {
      segments_[s] = addr - s;
      reserved_ += addr - s;
    }
    if (e > end) {
      segments_[end] = e - end;
      reserved_ += e - end;
      break;
    }
  }
}

void DeviceTraceState::restore(uint64_t events, U64Map<LiveAlloc> live,
                               std::map<uint64_t, uint64_t> segments) {
  events_ = events;
  live_ = std::move(live);
  segments_ = std::move(segments);
  reserved_ = 0;
  requested_ = 0;
  for (const auto& [a, n] : segments_) reserved_ += n;
  live_.forEach([&](uint64_t, const LiveAlloc& l) { requested_ += l.requested; });
}

}  // namespace memforensics::format::trace
