// allocation_view.cc: see allocation_view.h.
#include "report/html/allocation_view.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <utility>

#include "common/saturating.h"
#include "report/html/json_len.h"

namespace memforensics::analysis {

namespace {

using format::StackId;

// What one drawn allocation costs in the page's JSON (render_html.cc allocationsJson: seven
// numbers and their commas; times only when the file has them).
size_t drawnCost(const DrawnAllocation& a, bool times) {
  size_t n =
      jsonLen(a.alloc_event) + jsonLen(a.free_event) + jsonLenU(a.bytes) + jsonLen(a.stack) + 1 + 5;
  if (times) n += jsonLen(a.alloc_time_us) + jsonLen(a.free_time_us) + 2;
  return n;
}
size_t bucketCost(const AllocationBucket& b, bool times) {
  return jsonLen(b.first_event) + jsonLen(b.at_event) + jsonLenU(b.total_bytes) +
         jsonLenU(b.rest_bytes) + 4 + (times ? jsonLen(b.first_time_us) + 1 : 0);
}

// The one sweep both band fills use: change(i, true) at item i's alloc event and change(i, false)
// at its free event (free_of < 0: never freed), in event order, and visit(bucket) for each bucket
// once every event up to its at_event is applied, buckets taken in at_event order.
template <class AllocOf, class FreeOf, class Change, class Visit>
void sweepBuckets(std::vector<AllocationBucket>& buckets, size_t n, const AllocOf& alloc_of,
                  const FreeOf& free_of, const Change& change, const Visit& visit) {
  std::vector<std::pair<int64_t, uint32_t>> adds, subs;
  adds.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    adds.push_back({alloc_of(i), i});
    if (free_of(i) >= 0) subs.push_back({free_of(i), i});
  }
  std::sort(adds.begin(), adds.end());
  std::sort(subs.begin(), subs.end());
  std::vector<size_t> order(buckets.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return buckets[x].at_event < buckets[y].at_event; });
  size_t ia = 0, is = 0;
  for (size_t k : order) {
    AllocationBucket& b = buckets[k];
    while (ia < adds.size() && adds[ia].first <= b.at_event) change(adds[ia++].second, true);
    while (is < subs.size() && subs[is].first <= b.at_event) change(subs[is++].second, false);
    visit(b);
  }
}

// The rest band: per bucket, the series' requested bytes at the bucket's maximum minus the drawn
// allocations live then (saturating: the replayer caps a request at its block's size).
void fillRest(AllocationView& v) {
  uint64_t live = 0;
  sweepBuckets(
      v.buckets, v.drawn.size(), [&](uint32_t i) { return v.drawn[i].alloc_event; },
      [&](uint32_t i) { return v.drawn[i].free_event; },
      [&](uint32_t i, bool add) {
        const uint64_t bytes = v.drawn[i].bytes;
        live = add ? live + bytes : live - std::min(live, bytes);
      },
      [&](AllocationBucket& b) { b.rest_bytes = b.total_bytes - std::min(b.total_bytes, live); });
}

// What the rest band's split of one bucket costs in the page's JSON at most (render_html.cc
// allocationsJson: kCategoryCount + 1 parts, kRestStacks entries of four numbers, the flag), for
// a device whose requested bytes never pass `peak`, with `allocs` allocations and stack indices
// below `stacks`.
size_t splitCostBound(uint64_t peak, uint64_t allocs, size_t stacks) {
  const size_t b = jsonLenU(peak) + 1;
  return (kCategoryCount + 1) * b + 2 +
         kRestStacks * (jsonLenU(stacks) + 1 + b + jsonLenU(allocs) + 1 + 2) + 2 + 2;
}

// One allocation the rest band holds: when it is live and what it is.
struct RestMember {
  int64_t alloc_event = -1;  // -1: alive before the trace began
  int64_t free_event = -1;   // -1: alive at the end
  uint64_t bytes = 0;
  uint8_t part = 0;  // its category, or kCategoryCount: alive before the trace began
  StackId stack = format::kNoStack;
};

// Completes a bucket's split after its parts of the trace's allocations are set: what they leave
// of rest_bytes is the blocks alive before the trace. Parts that hold more than the band are cut
// (from the last category back) and the bucket marked `cut`; a listed stack holding more than
// the parts left is cut to them and said inexact.
void completeSplit(AllocationBucket& b) {
  uint64_t traced = 0;
  for (size_t c = 0; c < kCategoryCount; ++c) traced = addSat(traced, b.split[c]);
  if (traced > b.rest_bytes) {
    b.cut = true;
    uint64_t over = traced - b.rest_bytes;
    for (size_t c = kCategoryCount; c-- > 0 && over > 0;) {
      const uint64_t cut = std::min(over, b.split[c]);
      b.split[c] -= cut;
      over -= cut;
    }
    traced = b.rest_bytes;
  }
  b.split[kCategoryCount] = b.rest_bytes - traced;
  for (RestStack& r : b.stacks) {
    if (r.bytes > traced) {
      r.bytes = traced;
      r.exact = false;
    }
  }
}

// Sums of hostile sizes (each below 2^64) neither wrap nor cap.
__extension__ typedef unsigned __int128 Wide;
uint64_t narrow(Wide w) {
  return w > Wide{~uint64_t{0}} ? ~uint64_t{0} : static_cast<uint64_t>(w);
}

// The rest band's split per bucket (AllocationBucket::split and stacks) from its members, by one
// sweep over their alloc and free events in at_event order: the parts' live bytes, and the live
// bytes per stack kept ranked so each bucket's largest are read in O(kRestStacks). Ties go to the
// stack whose first member comes first (by event, as every format of the file orders them), and
// members without a stack count in the parts only.
void fillRestSplit(AllocationView& v, const std::vector<RestMember>& members,
                   const std::function<int32_t(StackId)>& stack) {
  // Each stack's ordinal: the order its first member is added in, by event (ties by member index,
  // as the sweep applies them); a later member's add or free never comes before its stack's first.
  std::unordered_map<StackId, uint32_t> ordinal;
  std::array<Wide, kCategoryCount + 1> parts{};
  struct Held {
    Wide bytes = 0;
    uint64_t count = 0;
    StackId stack = format::kNoStack;
  };
  std::vector<Held> held;
  struct Rank {
    Wide bytes;
    uint32_t ordinal;
    bool operator<(const Rank& o) const {
      return bytes != o.bytes ? bytes > o.bytes : ordinal < o.ordinal;
    }
  };
  std::set<Rank> ranked;  // largest first
  auto change = [&](uint32_t i, bool add) {
    const RestMember& m = members[i];
    if (add)
      parts[m.part] += m.bytes;
    else
      parts[m.part] -= m.bytes;  // never below 0: it was added before
    if (m.part == kCategoryCount || m.stack == format::kNoStack || m.stack == format::kEmptyStack)
      return;
    auto [o, fresh] = ordinal.try_emplace(m.stack, static_cast<uint32_t>(held.size()));
    if (fresh) held.push_back(Held{0, 0, m.stack});
    Held& h = held[o->second];
    if (h.count > 0) ranked.erase(Rank{h.bytes, o->second});
    h.bytes = add ? h.bytes + m.bytes : h.bytes - m.bytes;
    h.count = add ? h.count + 1 : h.count - 1;
    if (h.count > 0) ranked.insert(Rank{h.bytes, o->second});
  };
  auto visit = [&](AllocationBucket& b) {
    for (size_t c = 0; c < kCategoryCount; ++c) b.split[c] = narrow(parts[c]);
    b.stacks.clear();
    for (auto it = ranked.begin(); it != ranked.end() && b.stacks.size() < kRestStacks; ++it) {
      if (it->bytes == 0) break;
      const Held& h = held[it->ordinal];
      b.stacks.push_back(
          RestStack{stack(h.stack), narrow(h.bytes), h.count, it->bytes <= Wide{~uint64_t{0}}});
    }
    b.stacks_all = ranked.size() <= kRestStacks;
    completeSplit(b);
  };
  sweepBuckets(
      v.buckets, members.size(), [&](uint32_t i) { return members[i].alloc_event; },
      [&](uint32_t i) { return members[i].free_event; }, change, visit);
}

// Drawn allocations that halving moved into the rest band join each bucket's split: their parts
// exactly; their stacks merged into the list, a stack the list did not hold exact only where the
// list held every stack (else its bytes there are a lower bound). -1 names no one stack: a merge
// into it is exact only where the list was complete too.
void moveIntoSplit(AllocationView& v, const std::vector<DrawnAllocation>& moved) {
  std::unordered_map<int32_t, size_t> at;  // stack -> index in the bucket's list
  for (AllocationBucket& b : v.buckets) {
    const bool all = b.stacks_all;
    at.clear();
    for (size_t i = 0; i < b.stacks.size(); ++i) at.try_emplace(b.stacks[i].stack, i);
    for (const DrawnAllocation& a : moved) {
      if (a.alloc_event > b.at_event || (a.free_event >= 0 && a.free_event <= b.at_event)) continue;
      if (a.alloc_event < 0) continue;  // before the trace: completeSplit's remainder
      b.split[static_cast<size_t>(a.category)] =
          addSat(b.split[static_cast<size_t>(a.category)], a.bytes);
      auto [it, fresh] = at.try_emplace(a.stack, b.stacks.size());
      if (fresh) {
        b.stacks.push_back(RestStack{a.stack, 0, 0, all});
      } else if (a.stack < 0 && !all) {
        b.stacks[it->second].exact = false;
      }
      RestStack& r = b.stacks[it->second];
      r.bytes = addSat(r.bytes, a.bytes);
      r.allocations += 1;
    }
    b.split[kCategoryCount] = 0;
    std::stable_sort(b.stacks.begin(), b.stacks.end(),
                     [](const RestStack& x, const RestStack& y) { return x.bytes > y.bytes; });
    if (b.stacks.size() > kRestStacks) {
      b.stacks.resize(kRestStacks);
      b.stacks_all = false;
    }
    completeSplit(b);
  }
}

void countCuts(AllocationView& v) {
  v.split_cut = 0;
  for (const auto& b : v.buckets) v.split_cut += b.cut ? 1 : 0;
}

}  // namespace

AllocationView allocationViewOf(const DeviceFacts& f, size_t budget, size_t max_drawn, bool times,
                                const std::function<int32_t(format::StackId)>& stack,
                                size_t max_stacks) {
  AllocationView v;
  v.budget_bytes = budget;
  v.allocations = f.allocs.size();
  const size_t n = f.events.size();
  if (n == 0 || f.series.size() < n + 1) return v;
  // At most a quarter of the budget for the rest band (a bucket is at most about 64 characters,
  // its split at most splitCostBound).
  const size_t split_bound =
      splitCostBound(f.summary.peak_requested.bytes, f.allocs.size(), max_stacks);
  const size_t buckets =
      std::clamp<size_t>(budget / 4 / (64 + split_bound), 16, kAllocationBuckets);
  const size_t bucket = std::max<size_t>(1, (n + buckets - 1) / buckets);
  size_t spent = 0;
  for (size_t first = 0; first < n; first += bucket) {
    const size_t last = std::min(n, first + bucket);
    AllocationBucket b;
    b.first_event = static_cast<int64_t>(first);
    b.first_time_us = f.events[first].time_us;
    // The first bucket holds the start state too (series[0]): a peak before the trace stays.
    size_t best = first == 0 ? 0 : first + 1;  // index into series: event + 1
    for (size_t e = first; e < last; ++e) {
      if (f.series[e + 1].requested > f.series[best].requested) best = e + 1;
    }
    b.at_event = static_cast<int64_t>(best) - 1;
    b.total_bytes = f.series[best].requested;
    b.rest_bytes = b.total_bytes;
    spent += bucketCost(b, times) + split_bound;
    v.buckets.push_back(b);
  }
  // The candidates: every allocation of the trace, and every block alive before the trace that
  // the trace frees (memory_viz draws those from the start, named by the stack that freed them):
  // a free_requested, or a free_completed without one, of an address no alloc of the trace holds.
  std::vector<AllocFact> cands;
  cands.reserve(f.allocs.size());
  for (const AllocFact& a : f.allocs) {
    if (a.requested > 0) cands.push_back(a);
  }
  {
    std::unordered_map<uint64_t, uint8_t> st;  // 1 allocated, 2 free requested, 3 before the trace
    for (size_t i = 0; i < n; ++i) {
      const format::Event& e = f.events[i];
      if (e.action == format::Action::Alloc) {
        st[e.addr] = 1;
      } else if (e.action == format::Action::FreeRequested ||
                 e.action == format::Action::FreeCompleted) {
        auto it = st.find(e.addr);
        const bool requested = e.action == format::Action::FreeRequested;
        if (it != st.end()) {
          if (requested && it->second == 1) {
            it->second = 2;
          } else if (!requested) {
            st.erase(it);
          }
          continue;
        }
        if (requested) st[e.addr] = 3;
        if (e.size == 0) continue;
        AllocFact a;
        a.event = -1;
        a.freed = static_cast<int64_t>(i);
        a.requested = e.size;
        a.stack = e.stack;  // the stack that freed it
        ++v.before_trace;
        cands.push_back(a);
      }
    }
  }
  std::vector<size_t> order(cands.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return cands[x].requested > cands[y].requested; });
  // One allocation as drawn (its stack is added once it is chosen).
  auto drawnOf = [&](const AllocFact& a) {
    DrawnAllocation d;
    d.alloc_event = a.event;
    d.free_event = a.freed;
    d.bytes = a.requested;
    d.category = a.category;
    if (times) {
      d.alloc_time_us = a.event >= 0 ? f.events[static_cast<size_t>(a.event)].time_us : -1;
      d.free_time_us = a.freed >= 0 && static_cast<size_t>(a.freed) < n
                           ? f.events[static_cast<size_t>(a.freed)].time_us
                           : -1;
    }
    return d;
  };
  std::vector<size_t> chosen;
  for (size_t i : order) {
    const DrawnAllocation d = drawnOf(cands[i]);
    const size_t cost = drawnCost(d, times) + 3;  // the stack index may grow to a few digits
    if (chosen.size() >= max_drawn || spent + cost > budget) {
      v.capped = true;
      break;
    }
    spent += cost;
    chosen.push_back(i);
  }
  std::stable_sort(chosen.begin(), chosen.end(), [&](size_t x, size_t y) {
    return std::pair{cands[x].event, x} < std::pair{cands[y].event, y};
  });
  std::vector<uint8_t> is_drawn(cands.size(), 0);
  for (size_t i : chosen) {
    const AllocFact& a = cands[i];
    DrawnAllocation d = drawnOf(a);
    d.stack = stack(a.stack);
    v.smallest_drawn = v.smallest_drawn == 0 ? d.bytes : std::min(v.smallest_drawn, d.bytes);
    v.drawn.push_back(d);
    is_drawn[i] = 1;
  }
  fillRest(v);
  std::vector<RestMember> members;
  for (size_t i = 0; i < cands.size(); ++i) {
    if (is_drawn[i]) continue;
    const AllocFact& a = cands[i];
    members.push_back(RestMember{
        a.event, a.freed, a.requested,
        a.event < 0 ? static_cast<uint8_t>(kCategoryCount) : static_cast<uint8_t>(a.category),
        a.stack});
  }
  fillRestSplit(v, members, stack);
  countCuts(v);
  return v;
}

size_t halveAllocationView(AllocationView& v, size_t keep) {
  if (v.drawn.size() <= keep) return 0;
  std::vector<size_t> order(v.drawn.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return v.drawn[x].bytes > v.drawn[y].bytes; });
  order.resize(keep);
  std::sort(order.begin(), order.end());
  std::vector<DrawnAllocation> kept, moved;
  for (size_t i = 0, k = 0; i < v.drawn.size(); ++i) {
    if (k < order.size() && order[k] == i) {
      kept.push_back(v.drawn[i]);
      ++k;
    } else {
      moved.push_back(v.drawn[i]);
    }
  }
  const size_t went = moved.size();
  v.drawn = std::move(kept);
  v.capped = true;
  v.smallest_drawn = 0;
  for (const auto& a : v.drawn)
    v.smallest_drawn = v.smallest_drawn == 0 ? a.bytes : std::min(v.smallest_drawn, a.bytes);
  fillRest(v);
  moveIntoSplit(v, moved);
  countCuts(v);
  return went;
}

}  // namespace memforensics::analysis
