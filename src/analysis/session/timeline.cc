// timeline.cc: the replayed watermark series, downsampled, with per-stream/pool shares and phases.
#include "analysis/session/timeline.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include "common/allocator_constants.h"

namespace memforensics::analysis {

namespace {

using replay::Counters;
using replay::Peak;

// A stream's or pool's share is a running sum of signed changes of uint64 counters, which a hostile
// file can put anywhere up to 2^64-1: in int64 the sums overflowed (undefined behaviour, seen with
// sizes near 2^63). 128 bits hold any sum of fewer than 2^63 such changes exactly.
__extension__ typedef __int128 Wide;

// Signed running sums: a stream's or pool's share follows the device counters' changes at the
// events of that stream or pool (PyTorch records a free with the block's own stream and pool).
struct Signed {
  Wide reserved = 0, requested = 0, allocated = 0, pending = 0;
  void add(const Counters& after, const Counters& before) {
    reserved += Wide{after.reserved} - Wide{before.reserved};
    requested += Wide{after.requested} - Wide{before.requested};
    allocated += Wide{after.allocated} - Wide{before.allocated};
    pending += Wide{after.pending} - Wide{before.pending};
  }
};

// A share as a counter: below 0 (a trace that does not lead to the file's state) is 0, above what
// a counter holds is 2^64-1.
uint64_t clamp0(Wide v) {
  if (v < 0) return 0;
  return v > Wide{UINT64_MAX} ? UINT64_MAX : static_cast<uint64_t>(v);
}

// Kept point indices (into the full series, 0 = start state): per bucket of `bucket` consecutive
// points, the first point where requested bytes take their bucket minimum and their maximum, and
// where reserved, allocated and pending-free bytes take their maximum (at most 5 per bucket, often
// fewer as they coincide); plus every point in `always`.
std::vector<size_t> keptPoints(const std::vector<Counters>& all, size_t bucket,
                               const std::vector<size_t>& always) {
  std::vector<size_t> keep;
  for (size_t b0 = 0; b0 < all.size(); b0 += bucket) {
    const size_t b1 = std::min(all.size(), b0 + bucket);
    size_t req_lo = b0, req_hi = b0, res_hi = b0, alloc_hi = b0, pend_hi = b0;
    for (size_t i = b0 + 1; i < b1; ++i) {
      const Counters& c = all[i];
      if (c.requested < all[req_lo].requested) req_lo = i;
      if (c.requested > all[req_hi].requested) req_hi = i;
      if (c.reserved > all[res_hi].reserved) res_hi = i;
      if (c.allocated > all[alloc_hi].allocated) alloc_hi = i;
      if (c.pending > all[pend_hi].pending) pend_hi = i;
    }
    keep.insert(keep.end(), {req_lo, req_hi, res_hi, alloc_hi, pend_hi});
  }
  keep.insert(keep.end(), always.begin(), always.end());
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  return keep;
}

// First index of the maximum of v over [lo, hi] (inclusive), in O(kBlock) per query after an
// O(n) build: a sparse table over the maxima of blocks of kBlock values, scans inside the two end
// blocks. Memory: n / kBlock * log2(n / kBlock) indices, so a phase's peak costs no scan of its
// range (100,000 nested annotation ranges over 100,000 events took minutes that way).
class RangeMax {
 public:
  static constexpr size_t kBlock = 64;

  explicit RangeMax(std::vector<uint64_t> v) : v_(std::move(v)) {
    const size_t blocks = (v_.size() + kBlock - 1) / kBlock;
    if (blocks == 0) return;
    std::vector<size_t> best(blocks);
    for (size_t b = 0; b < blocks; ++b)
      best[b] = scan(b * kBlock, std::min(v_.size(), (b + 1) * kBlock) - 1);
    table_.push_back(std::move(best));
    for (size_t width = 2; width <= blocks; width *= 2) {
      const std::vector<size_t>& prev = table_.back();
      std::vector<size_t> next(blocks - width + 1);
      for (size_t b = 0; b + width <= blocks; ++b) next[b] = better(prev[b], prev[b + width / 2]);
      table_.push_back(std::move(next));
    }
  }

  // Requires lo <= hi < size().
  size_t query(size_t lo, size_t hi) const {
    const size_t bl = lo / kBlock, bh = hi / kBlock;
    if (bh - bl <= 1) return scan(lo, hi);
    size_t i = better(scan(lo, (bl + 1) * kBlock - 1), scan(bh * kBlock, hi));
    const size_t first = bl + 1, count = bh - first;  // whole blocks in between, count >= 1
    size_t k = 0;
    while ((size_t{2} << k) <= count) ++k;
    i = better(i, table_[k][first]);
    i = better(i, table_[k][bh - (size_t{1} << k)]);
    return i;
  }
  uint64_t value(size_t i) const { return v_[i]; }
  size_t size() const { return v_.size(); }

 private:
  size_t better(size_t a, size_t b) const {
    if (v_[a] != v_[b]) return v_[a] > v_[b] ? a : b;
    return std::min(a, b);  // ties: the first event reaching the value, as a forward scan finds it
  }
  size_t scan(size_t lo, size_t hi) const {
    size_t best = lo;
    for (size_t i = lo + 1; i <= hi; ++i) {
      if (v_[i] > v_[best]) best = i;
    }
    return best;
  }

  std::vector<uint64_t> v_;
  std::vector<std::vector<size_t>> table_;  // table_[k][b]: best over blocks [b, b + 2^k)
};

void updPeak(Peak& p, uint64_t v, int64_t event, int64_t time) {
  if (v > p.bytes) {
    p.bytes = v;
    p.event = event;
    p.time_us = time;
  }
}

}  // namespace

DeviceTimeline timelineOf(const format::Snapshot& snap, const DeviceFacts& facts,
                          const TimelineOptions& opt) {
  const size_t max_points = std::max<size_t>(1, opt.max_points);
  const int64_t d = facts.device;
  DeviceTimeline dt;
  dt.device = d;
  // The peaks and OOMs exactly as `analyze` reports them.
  const replay::DeviceSummary& sum = facts.summary;
  dt.peak_reserved = sum.peak_reserved;
  dt.peak_requested = sum.peak_requested;
  dt.peak_allocated = sum.peak_allocated;
  dt.peak_active = sum.peak_active;
  dt.ooms = sum.ooms;

  const auto ev = facts.events;
  dt.events = ev.size();
  dt.total_points = ev.size() + 1;
  // The counters after every event, from the session's forward pass 1 (SessionOptions::series) or
  // pass 2 (DeviceSession::requestSeries).
  const std::vector<Counters>& all = facts.series;
  if (!facts.has_series || all.size() != dt.total_points) return dt;
  {
    // Shares per stream and per pool: running sums of the device's changes at their events.
    std::map<int64_t, Signed> by_stream;
    std::map<std::pair<uint64_t, uint64_t>, Signed> by_pool;
    std::vector<std::pair<int64_t, std::pair<uint64_t, uint64_t>>> keys(ev.size());
    std::vector<size_t> always = {0};  // the start state
    for (size_t i = 0; i < ev.size(); ++i) {
      const Counters& before = all[i];
      const Counters& after = all[i + 1];
      const auto& e = ev[i];
      if (e.time_us >= 0) dt.has_times = true;
      auto pool =
          e.pool < snap.pools.size() ? snap.pools[e.pool] : std::pair<uint64_t, uint64_t>{0, 0};
      keys[i] = {e.stream, pool};
      // Only events that move a counter or name a stream/pool; snapshot/oom events still name one.
      if (e.action != format::Action::Oom && e.action != format::Action::Snapshot &&
          e.action != format::Action::Unknown) {
        by_stream[e.stream].add(after, before);
        by_pool[pool].add(after, before);
      }
      if (e.action == format::Action::Oom) always.push_back(i + 1);
    }
    for (size_t i = 0; i < all.size(); ++i)
      dt.peak_pending_bytes = std::max(dt.peak_pending_bytes, all[i].pending);
    // Per-peak points are kept by construction; the peak events are added anyway, to be explicit.
    for (const Peak* p :
         {&dt.peak_reserved, &dt.peak_requested, &dt.peak_allocated, &dt.peak_active}) {
      always.push_back(static_cast<size_t>(p->event + 1));
    }
    size_t bucket = 1;
    if (all.size() > max_points) {
      bucket = (all.size() + max_points - 1) / max_points;
      dt.downsampled = true;
    }
    dt.bucket_size = bucket;
    std::vector<size_t> keep;
    if (bucket == 1) {
      keep.resize(all.size());
      for (size_t i = 0; i < all.size(); ++i) keep[i] = i;
    } else {
      keep = keptPoints(all, bucket, always);
    }
    auto timeOf = [&](size_t point) { return point == 0 ? int64_t{-1} : ev[point - 1].time_us; };
    for (size_t k : keep) dt.points.push_back({static_cast<int64_t>(k) - 1, timeOf(k), all[k]});

    // Breakdowns, when there is more than one stream / pool. The start share is what the file's
    // final state holds for that stream/pool minus the trace's changes (exact whenever replay
    // ends at the file's final state; clamped at 0 otherwise).
    // One pass over the events serves every stream / pool at once (a pass per key was quadratic
    // in streams x events): first the exact peaks of every key (a key's counters only change at
    // its own events), then the sampled series of the opt.max_breakdowns keys with the highest
    // peak reserved (then requested), in key order; the others are counted in *_omitted.
    auto counts = [&](size_t i) {
      return ev[i].action != format::Action::Oom && ev[i].action != format::Action::Snapshot &&
             ev[i].action != format::Action::Unknown;
    };
    auto snapshotOf = [](const Signed& s) {
      Counters c;
      c.reserved = clamp0(s.reserved);
      c.requested = clamp0(s.requested);
      c.allocated = clamp0(s.allocated);
      c.pending = clamp0(s.pending);
      return c;
    };
    auto breakdown = [&](auto& sums, auto segKey, auto eventKey, auto setKey,
                         std::vector<TimelineBreakdown>& out, size_t& omitted) {
      if (sums.size() < 2) return;
      using Key = typename std::decay_t<decltype(sums)>::key_type;
      std::map<Key, Signed> final_share;
      for (const auto& seg : snap.segmentsOf(d)) {
        alloc::StateSums seg_sums;  // the one final-state sum rule
        seg_sums.addSegment(seg.total_size);
        for (const auto& b : snap.blocksOf(seg)) {
          seg_sums.addBlock(b.state == format::BlockState::ActiveAllocated,
                            b.state == format::BlockState::ActivePendingFree, b.size,
                            b.requested_size);
        }
        Signed& f = final_share[segKey(seg)];
        f.reserved += Wide{seg_sums.total};
        f.requested += Wide{seg_sums.requested};
        f.allocated += Wide{seg_sums.allocated};
        f.pending += Wide{seg_sums.pending};
      }
      std::map<Key, size_t> index;
      std::vector<TimelineBreakdown> all_keys;
      std::vector<Signed> start, cur;
      for (const auto& [key, delta] : sums) {
        index.emplace(key, all_keys.size());
        TimelineBreakdown tb;
        setKey(tb, key);
        const Signed& fin = final_share[key];
        Signed s0;
        s0.reserved = fin.reserved - delta.reserved;
        s0.requested = fin.requested - delta.requested;
        s0.allocated = fin.allocated - delta.allocated;
        s0.pending = fin.pending - delta.pending;
        // The start state is the first candidate for a peak, as for the device peaks.
        const Counters c0 = snapshotOf(s0);
        tb.peak_reserved = {c0.reserved, -1, -1};
        tb.peak_requested = {c0.requested, -1, -1};
        tb.peak_allocated = {c0.allocated, -1, -1};
        tb.peak_pending = {c0.pending, -1, -1};
        all_keys.push_back(std::move(tb));
        start.push_back(s0);
      }
      cur = start;
      for (size_t i = 0; i < ev.size(); ++i) {
        if (!counts(i)) continue;
        const size_t k = index.at(eventKey(i));
        cur[k].add(all[i + 1], all[i]);
        const Counters c = snapshotOf(cur[k]);
        const auto event = static_cast<int64_t>(i);
        TimelineBreakdown& tb = all_keys[k];
        updPeak(tb.peak_reserved, c.reserved, event, timeOf(i + 1));
        updPeak(tb.peak_requested, c.requested, event, timeOf(i + 1));
        updPeak(tb.peak_allocated, c.allocated, event, timeOf(i + 1));
        updPeak(tb.peak_pending, c.pending, event, timeOf(i + 1));
      }
      std::vector<size_t> chosen(all_keys.size());
      for (size_t k = 0; k < chosen.size(); ++k) chosen[k] = k;
      if (chosen.size() > opt.max_breakdowns) {
        std::stable_sort(chosen.begin(), chosen.end(), [&](size_t a, size_t b) {
          const auto& x = all_keys[a];
          const auto& y = all_keys[b];
          if (x.peak_reserved.bytes != y.peak_reserved.bytes)
            return x.peak_reserved.bytes > y.peak_reserved.bytes;
          return x.peak_requested.bytes > y.peak_requested.bytes;
        });
        omitted = chosen.size() - opt.max_breakdowns;
        chosen.resize(opt.max_breakdowns);
        std::sort(chosen.begin(), chosen.end());
      }
      std::vector<int64_t> slot(all_keys.size(), -1);
      for (size_t j = 0; j < chosen.size(); ++j) slot[chosen[j]] = static_cast<int64_t>(j);
      cur = start;
      size_t next_keep = 0;
      auto visit = [&](size_t point) {
        if (next_keep >= keep.size() || keep[next_keep] != point) return;
        ++next_keep;
        for (size_t k : chosen) {
          all_keys[k].points.push_back(
              {static_cast<int64_t>(point) - 1, timeOf(point), snapshotOf(cur[k])});
        }
      };
      visit(0);
      for (size_t i = 0; i < ev.size(); ++i) {
        if (counts(i)) {
          const size_t k = index.at(eventKey(i));
          if (slot[k] >= 0) cur[k].add(all[i + 1], all[i]);
        }
        visit(i + 1);
      }
      for (size_t k : chosen) out.push_back(std::move(all_keys[k]));
    };
    breakdown(
        by_stream, [](const format::Segment& s) { return s.stream; },
        [&](size_t i) { return keys[i].first; },
        [](TimelineBreakdown& tb, int64_t k) { tb.stream = k; }, dt.streams, dt.streams_omitted);
    breakdown(
        by_pool,
        [](const format::Segment& s) {
          return std::pair<uint64_t, uint64_t>{s.pool_a, s.pool_b};
        },
        [&](size_t i) { return keys[i].second; },
        [](TimelineBreakdown& tb, const std::pair<uint64_t, uint64_t>& k) { tb.pool = k; },
        dt.pools, dt.pools_omitted);

    // Phases with the peaks inside them (the state after each event of the range).
    // Range-maximum queries over the state after each event: O(1) blocks per phase, however many
    // phases nest over however many events.
    std::vector<Phase> phases = facts.phases;
    if (!phases.empty()) {
      std::vector<uint64_t> req(ev.size()), res(ev.size());
      for (size_t i = 0; i < ev.size(); ++i) {
        req[i] = all[i + 1].requested;
        res[i] = all[i + 1].reserved;
      }
      const RangeMax req_max(std::move(req)), res_max(std::move(res));
      const auto n = static_cast<int64_t>(ev.size());
      for (auto& p : phases) {
        PhaseStats ps;
        ps.phase = std::move(p);
        const int64_t lo = std::max<int64_t>(0, ps.phase.first_event);
        const int64_t hi = std::min<int64_t>(ps.phase.last_event, n - 1);
        if (lo <= hi) {
          const size_t iq = req_max.query(static_cast<size_t>(lo), static_cast<size_t>(hi));
          const size_t is = res_max.query(static_cast<size_t>(lo), static_cast<size_t>(hi));
          ps.peak_requested = {req_max.value(iq), static_cast<int64_t>(iq), ev[iq].time_us};
          ps.peak_reserved = {res_max.value(is), static_cast<int64_t>(is), ev[is].time_us};
        }
        dt.phases.push_back(std::move(ps));
      }
    }

    // Sparkline columns: the maximum requested bytes over each equal slice of the full series.
    const size_t cols = std::min(opt.columns, all.size());
    dt.requested_columns.assign(cols, 0);
    for (size_t i = 0; i < all.size() && cols > 0; ++i) {
      size_t c = i * cols / all.size();
      dt.requested_columns[c] = std::max(dt.requested_columns[c], all[i].requested);
    }
  }
  return dt;
}

TimelineResult computeTimeline(const format::Snapshot& snap, const TimelineOptions& opt) {
  TimelineResult res;
  SessionOptions so;
  so.series = true;
  for (int64_t d : snap.devices()) {
    if (opt.device && *opt.device != d) continue;
    DeviceSession session(snap, d, so);  // the backward pass and forward pass 1; no moments
    res.devices.push_back(timelineOf(snap, session.take(), opt));
  }
  return res;
}

}  // namespace memforensics::analysis
