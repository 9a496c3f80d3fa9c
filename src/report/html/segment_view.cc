// segment_view.cc: see segment_view.h.
#include "report/html/segment_view.h"

#include <algorithm>
#include <iterator>
#include <map>

namespace memforensics::analysis {

namespace {

using format::Action;

struct Open {
  uint64_t end = 0;
  size_t life = 0;  // index into lives
};

}  // namespace

SegmentTimeline segmentTimelineOf(const format::Snapshot& snap, const DeviceFacts& f,
                                  size_t max_lives,
                                  const std::function<int32_t(format::StackId)>& stack_index) {
  SegmentTimeline out;
  std::vector<SegmentLife>& lives = out.lives;
  std::map<uint64_t, Open> open;        // live ranges by address, disjoint
  std::vector<format::StackId> stacks;  // per life, the file's stack id
  const size_t n = f.events.size();
  auto timeOf = [&](int64_t e) { return e >= 0 ? f.events[static_cast<size_t>(e)].time_us : -1; };
  auto start = [&](uint64_t a, uint64_t b, int64_t ev, int64_t stream, bool exp,
                   format::StackId st) {
    SegmentLife l;
    l.first_event = ev;
    l.first_time_us = timeOf(ev);
    l.address = a;
    l.bytes = b - a;
    l.stream = stream;
    l.expandable = exp;
    lives.push_back(l);
    stacks.push_back(st);
    return lives.size() - 1;
  };
  auto end = [&](size_t life, int64_t ev) {
    lives[life].last_event = ev;
    lives[life].last_time_us = timeOf(ev);
  };
  // Ends [a, b) at event ev: the parts of live ranges inside it end, the parts outside stay live
  // as bands of their own from the same start; what no live range covered was there before the
  // trace (when `before` is set).
  auto close = [&](uint64_t a, uint64_t b, int64_t ev, int64_t stream, bool exp, bool before) {
    uint64_t at = a;
    auto it = open.upper_bound(a);
    if (it != open.begin() && std::prev(it)->second.end > a) --it;
    while (it != open.end() && it->first < b) {
      const uint64_t s = it->first, e = it->second.end;
      const size_t life = it->second.life;
      it = open.erase(it);
      if (before && s > at) end(start(at, s, -1, stream, exp, format::kNoStack), ev);
      const SegmentLife old = lives[life];
      const format::StackId st = stacks[life];
      const uint64_t cs = std::max(s, a), ce = std::min(e, b);
      lives[life].address = cs;
      lives[life].bytes = ce - cs;
      end(life, ev);
      for (auto [ra, rb] : {std::pair{s, cs}, std::pair{ce, e}}) {
        if (ra >= rb) continue;
        const size_t keep = start(ra, rb, old.first_event, old.stream, old.expandable, st);
        lives[keep].first_time_us = old.first_time_us;
        open[ra] = {rb, keep};
      }
      at = std::max(at, ce);
    }
    if (before && at < b) end(start(at, b, -1, stream, exp, format::kNoStack), ev);
  };
  for (size_t i = 0; i < n; ++i) {
    const format::Event& e = f.events[i];
    if (e.size == 0 || e.addr > ~uint64_t{0} - e.size) continue;
    const auto ev = static_cast<int64_t>(i);
    const uint64_t a = e.addr, b = e.addr + e.size;
    const bool exp = e.action == Action::SegmentMap || e.action == Action::SegmentUnmap;
    if (e.action == Action::SegmentAlloc || e.action == Action::SegmentMap) {
      close(a, b, ev, e.stream, exp, false);  // a hostile file's overlap ends the old range
      open[a] = {b, start(a, b, ev, e.stream, exp, e.stack)};
    } else if (e.action == Action::SegmentFree || e.action == Action::SegmentUnmap) {
      close(a, b, ev, e.stream, exp, true);
    }
  }
  // The file's final segments that no event created were there all along.
  for (const format::Segment& s : snap.segmentsOf(f.device)) {
    if (s.total_size == 0 || s.address > ~uint64_t{0} - s.total_size) continue;
    uint64_t at = s.address;
    const uint64_t b = s.address + s.total_size;
    auto it = open.upper_bound(at);
    if (it != open.begin() && std::prev(it)->second.end > at) --it;
    for (; it != open.end() && it->first < b; ++it) {
      if (it->first > at) start(at, it->first, -1, s.stream, s.is_expandable, format::kNoStack);
      at = std::max(at, it->second.end);
    }
    if (at < b) start(at, b, -1, s.stream, s.is_expandable, format::kNoStack);
  }
  // The check: the live bands' bytes after every event against the replayed reserved bytes.
  if (f.has_series && f.series.size() == n + 1) {
    // In wrapping unsigned arithmetic: a hostile file's sizes may not fit a signed sum, and the
    // running total equals the replay's exactly when the true sums do.
    std::vector<uint64_t> add(n + 1, 0), sub(n + 1, 0);  // after event i at [i + 1]; [0]: start
    for (const auto& l : lives) {
      add[l.first_event < 0 ? 0 : static_cast<size_t>(l.first_event) + 1] += l.bytes;
      if (l.last_event >= 0) sub[static_cast<size_t>(l.last_event) + 1] += l.bytes;
    }
    uint64_t live = 0;
    out.agrees = true;
    for (size_t i = 0; i <= n; ++i) {
      live += add[i];
      live -= sub[i];
      if (live != f.series[i].reserved) {
        out.agrees = false;
        out.first_disagreement = static_cast<int64_t>(i) - 1;
        break;
      }
    }
  }
  // Bounded: the largest bands stay.
  std::vector<size_t> order(lives.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (order.size() > max_lives) {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return lives[x].bytes > lives[y].bytes; });
    out.left_out = order.size() - max_lives;
    order.resize(max_lives);
  }
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return std::pair{lives[x].first_event, lives[x].address} <
           std::pair{lives[y].first_event, lives[y].address};
  });
  std::vector<SegmentLife> kept;
  kept.reserve(order.size());
  for (size_t i : order) {
    kept.push_back(lives[i]);
    kept.back().stack = stacks[i] == format::kNoStack ? -1 : stack_index(stacks[i]);
  }
  out.lives = std::move(kept);
  return out;
}

}  // namespace memforensics::analysis
