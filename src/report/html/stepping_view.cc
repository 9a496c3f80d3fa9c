// stepping_view.cc: see stepping_view.h.
#include "report/html/stepping_view.h"

#include <algorithm>
#include <map>

#include "common/allocator_constants.h"
#include "report/html/json_len.h"
#include "report/html/map_state.h"

namespace memforensics::analysis {

namespace {

// A stack index as the cost counts it before the stacks are named (a report names at most
// 20,000 stacks: five digits).
constexpr int32_t kCostStack = 10000;

// The records of render_html.cc's stepRecords: [lo, hi - lo, records...] with a gap [64, bytes]
// before a block that does not start where the previous one ended, a free block [code, size,
// segment], any other [code, size, segment, requested, stack, alloc_event]; [] for none.
size_t recordsCost(uint64_t lo, uint64_t hi, const std::vector<StepMapBlock>& blocks) {
  if (lo >= hi) return 2;
  size_t n = 2 + jsonLenU(lo) + 1 + jsonLenU(hi - lo);
  uint64_t at = lo;
  for (const auto& b : blocks) {
    if (b.address > at) n += 4 + jsonLenU(b.address - at);
    n += 3 + jsonLenU(uint64_t{b.code}) + jsonLenU(b.size) + jsonLenU(uint64_t{b.segment});
    if ((b.code & 3) != 0)
      n += 3 + jsonLenU(b.requested) + jsonLen(int64_t{b.stack}) + jsonLen(b.alloc_event);
    at = b.address + b.size;
  }
  return n;
}

size_t patchCost(const StepMapPatch& p) {
  return recordsCost(p.lo, p.hi, p.blocks) + 1;
}

size_t baseCost(const std::vector<StepMapBlock>& base) {
  if (base.empty()) return 2;
  return recordsCost(base.front().address, base.back().address + base.back().size, base);
}

// An event's list record [action, addr, size, stack] and its time.
size_t eventCost(const StepMapEvent& e) {
  return jsonLenU(uint64_t{static_cast<uint8_t>(e.action)}) + jsonLenU(e.addr) + jsonLenU(e.size) +
         jsonLen(int64_t{e.stack}) + jsonLen(e.time_us) + 5;
}

// Narrows once, counting the base as it is now; see trimSteppingView.
size_t trimOnce(SteppingView& v, size_t max_bytes);

}  // namespace

std::optional<SteppingWindow> steppingWindow(const DeviceFacts& f, size_t bytes) {
  const auto n = static_cast<int64_t>(f.events.size());
  if (n == 0 || bytes == 0) return std::nullopt;
  SteppingWindow w;
  w.focus = f.summary.ooms.empty() ? f.summary.peak_requested.event : f.summary.ooms.front().event;
  w.focus = std::clamp<int64_t>(w.focus, 0, n - 1);
  const int64_t len =
      std::min<int64_t>(n, std::max(static_cast<int64_t>(bytes / kSteppingBytesPerEvent),
                                    static_cast<int64_t>(kSteppingMinEvents)));
  w.first = std::max<int64_t>(0, w.focus - len * 3 / 4);
  w.last = std::min<int64_t>(n - 1, w.first + len - 1);
  w.first = std::max<int64_t>(0, w.last - len + 1);
  return w;
}

SteppingView steppingViewOf(const format::Snapshot& snap, const DeviceFacts& f, int64_t focus,
                            size_t max_bytes,
                            const std::function<int32_t(format::StackId)>& stack_index) {
  SteppingView v;
  if (!f.stepping) return v;
  const SteppingFacts& st = *f.stepping;
  if (!st.checked) {
    v.unavailable = st.failed.empty() ? "the window was not recorded" : st.failed;
    return v;
  }
  v.first_event = st.first_event;
  v.last_event = st.last_event;
  v.focus_event = std::clamp(focus, st.first_event, st.last_event);
  for (const StepSegment& s : st.segments) {
    v.segments.push_back({s.address, s.stream,
                          alloc::poolName(s.is_large, s.pool.first, s.pool.second), s.expandable});
  }
  auto convert = [&](const StepBlock& b) {
    StepMapBlock m;
    m.address = b.address;
    m.size = b.size;
    m.segment = b.segment;
    const MapState state = mapStateOf(b.state);
    if (state != MapState::Free) {
      m.requested = b.requested;
      m.alloc_event = b.alloc_event;
      m.raw_stack = b.stack;
      m.stack = kCostStack;  // until trimmed (its digits are what the cost counts)
      m.code =
          static_cast<uint8_t>(static_cast<int>(state) |
                               static_cast<int>(f.categoryOf(snap, b.alloc_event, b.stack)) << 2);
    }
    return m;
  };
  v.base.reserve(st.base.size());
  for (const auto& b : st.base) v.base.push_back(convert(b));
  v.patches.reserve(st.patches.size());
  for (const auto& p : st.patches) {
    StepMapPatch mp{p.lo, p.hi, {}};
    for (const auto& b : p.blocks) mp.blocks.push_back(convert(b));
    v.patches.push_back(std::move(mp));
  }
  for (int64_t e = st.first_event; e <= st.last_event; ++e) {
    const format::Event& ev = f.events[static_cast<size_t>(e)];
    v.events.push_back({ev.action, ev.addr, ev.size, kCostStack, ev.time_us, ev.stack});
  }
  trimSteppingView(v, max_bytes);
  if (steppingCost(v) > max_bytes) {
    dropSteppingView(v, max_bytes);
    return v;
  }
  auto name = [&](int32_t& stack, format::StackId raw) {
    stack = raw == format::kNoStack ? -1 : stack_index(raw);
  };
  for (auto& b : v.base) name(b.stack, b.raw_stack);
  for (auto& p : v.patches) {
    for (auto& b : p.blocks) name(b.stack, b.raw_stack);
  }
  for (auto& e : v.events) name(e.stack, e.raw_stack);
  return v;
}

void dropSteppingView(SteppingView& v, size_t max_bytes) {
  const size_t blocks = v.base.size();
  const size_t base = baseCost(v.base);
  v = SteppingView{};
  v.unavailable = (base > max_bytes ? "the layout's " + std::to_string(blocks) + " blocks are"
                                    : std::to_string(kSteppingMinEvents) + " events are") +
                  " more than the page's bound on event stepping (" + std::to_string(max_bytes) +
                  " bytes for this device); `memforensics blocks FILE --at EVENT` gives any event";
}

size_t steppingCost(const SteppingView& v) {
  size_t n = 120 + baseCost(v.base);
  for (const auto& s : v.segments) n += jsonLenU(s.address) + jsonLen(s.stream) + 8;
  for (const auto& p : v.patches) n += patchCost(p);
  for (const auto& e : v.events) n += eventCost(e);
  return n;
}

size_t trimSteppingView(SteppingView& v, size_t max_bytes) {
  // The base moves with the window's start, and its cost with it: narrow again while the moved
  // base pushes the whole over the bound (each pass keeps a prefix-free sub-window).
  size_t dropped = 0;
  for (int pass = 0; pass < 8; ++pass) {
    const size_t d = trimOnce(v, max_bytes);
    dropped += d;
    if (d == 0 || steppingCost(v) <= max_bytes) break;
  }
  return dropped;
}

namespace {

size_t trimOnce(SteppingView& v, size_t max_bytes) {
  if (v.empty()) return 0;
  const size_t n = v.patches.size();
  const size_t total = steppingCost(v);
  if (total <= max_bytes || n <= kSteppingMinEvents) return 0;
  std::vector<size_t> cost(n);
  for (size_t i = 0; i < n; ++i) cost[i] = patchCost(v.patches[i]) + eventCost(v.events[i]);
  size_t fixed = total;
  for (size_t c : cost) fixed -= c;
  const size_t room = max_bytes > fixed ? max_bytes - fixed : 0;
  // Grow [a, b] from the focus: three events before it for every one after, while they fit.
  const auto focus = static_cast<size_t>(v.focus_event - v.first_event);
  size_t a = focus, b = focus, spent = cost[focus];
  auto fitsLeft = [&] {
    return a > 0 && (spent + cost[a - 1] <= room || b - a + 1 < kSteppingMinEvents);
  };
  auto fitsRight = [&] {
    return b + 1 < n && (spent + cost[b + 1] <= room || b - a + 1 < kSteppingMinEvents);
  };
  for (size_t step = 0;; ++step) {
    const bool back = step % 4 != 3;
    if (back ? fitsLeft() : fitsRight()) {
      spent += back ? cost[--a] : cost[++b];
      continue;
    }
    // The preferred side cannot grow. More before the moment is always welcome; more after it
    // only where the window reached the trace's start or keeps the three-to-one share.
    if (back && fitsRight() && (a == 0 || (b + 1 - focus) * 3 <= focus - a)) {
      spent += cost[++b];
      continue;
    }
    if (!back && fitsLeft()) {
      spent += cost[--a];
      continue;
    }
    break;
  }
  if (a == 0 && b == n - 1) return 0;
  // The base after event first + a - 1: the patches before a applied to it (the page's rule).
  if (a > 0) {
    std::map<uint64_t, StepMapBlock> m;
    for (const auto& blk : v.base) m.emplace_hint(m.end(), blk.address, blk);
    for (size_t i = 0; i < a; ++i) {
      const StepMapPatch& p = v.patches[i];
      if (p.lo >= p.hi) continue;
      m.erase(m.lower_bound(p.lo), m.lower_bound(p.hi));
      for (const auto& blk : p.blocks) m.insert_or_assign(blk.address, blk);
    }
    v.base.clear();
    for (auto& [addr, blk] : m) v.base.push_back(blk);
  }
  v.patches = std::vector<StepMapPatch>(v.patches.begin() + static_cast<ptrdiff_t>(a),
                                        v.patches.begin() + static_cast<ptrdiff_t>(b + 1));
  v.events = std::vector<StepMapEvent>(v.events.begin() + static_cast<ptrdiff_t>(a),
                                       v.events.begin() + static_cast<ptrdiff_t>(b + 1));
  v.first_event += static_cast<int64_t>(a);
  v.last_event = v.first_event + static_cast<int64_t>(b - a);
  return n - (b - a + 1);
}

}  // namespace

}  // namespace memforensics::analysis
