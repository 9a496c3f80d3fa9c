// detect_spike.cc: a short-lived temporary at the peak (docs/findings.md "Temporary spike").
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <vector>

#include "analysis/findings/findings_ctx.h"
#include "analysis/frames/stack_groups.h"
#include "analysis/session/blocks.h"
#include "common/format_bytes.h"

namespace memforensics::analysis::detail {

using format::Action;
using format::Event;
using format::StackId;

namespace {

// The share of the events within kSpikeNeighbourhood of the trace around `peak_event` after which
// the requested bytes were at least `level` (`peak_bytes` after `peak_event`). From the allocation
// table: blocks alive before the trace shift the level by what they free in the neighbourhood,
// which a complete history does not have.
double heldShare(const Ctx& c, int64_t peak_event, uint64_t peak_bytes, uint64_t level) {
  const auto n = static_cast<int64_t>(c.ev.size());
  const int64_t half =
      std::max<int64_t>(64, static_cast<int64_t>(static_cast<double>(n) * kSpikeNeighbourhood));
  const int64_t lo = std::max<int64_t>(0, peak_event - half);
  const int64_t hi = std::min<int64_t>(n - 1, peak_event + half);
  if (hi <= lo) return 0.0;
  // Levels relative to the one after the peak.
  const std::vector<double> delta = requestedLevels(c, lo, hi);
  const double at_peak = delta[static_cast<size_t>(peak_event - lo)];
  const double need = static_cast<double>(peak_bytes - level);
  size_t held = 0;
  for (double v : delta) held += v - at_peak >= -need;
  return static_cast<double>(held) / static_cast<double>(delta.size());
}

struct PeakDrop {
  uint64_t drop = 0;            // how much lower the requested peak is without the allocations
  int64_t new_peak_event = -1;  // where the lower peak is set (-1: the start state)
  bool exact = true;            // false when blocks from before the trace are freed in it
};

// The requested peak over the whole trace with `without` never made, against the peak with them,
// from the allocation table (requestedLevels). Blocks alive before the trace that it frees are
// not in that table, so with a late start the levels drift and the drop is an estimate.
PeakDrop peakWithout(const Ctx& c, const std::vector<const AllocFact*>& without) {
  const size_t n = c.ev.size();
  std::vector<double> removed(n + 1, 0.0);
  for (const AllocFact* a : without) {
    removed[static_cast<size_t>(a->event)] += static_cast<double>(a->requested);
    removed[a->freed < 0 ? n : static_cast<size_t>(a->freed)] -= static_cast<double>(a->requested);
  }
  const std::vector<double> level = requestedLevels(c, 0, static_cast<int64_t>(n) - 1);
  double now = 0, after = 0, gone = 0;  // the start state (level 0) is a candidate for both
  PeakDrop d;
  for (size_t i = 0; i < level.size(); ++i) {
    gone += removed[i];
    now = std::max(now, level[i]);
    if (level[i] - gone > after) {
      after = level[i] - gone;
      d.new_peak_event = static_cast<int64_t>(i);
    }
  }
  d.drop = now > after ? static_cast<uint64_t>(now - after) : 0;
  d.exact = c.summary.freed_before_start == 0;
  return d;
}

}  // namespace

void detectTemporarySpike(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  const replay::Peak& pk = c.summary.peak_requested;
  if (pk.event < 0 || c.ev.empty()) return;
  const MomentFacts* m = c.live(pk.event);
  if (m == nullptr) return;
  // Short-lived: freed within 1% of the trace (at least 8 events) after the peak.
  int64_t window = std::max<int64_t>(8, static_cast<int64_t>(c.ev.size()) / 100);
  // Blocks freed by an OOM's unwind (an OOM between the peak and the free) were not short-lived:
  // the exception freed them. The first OOM at or after the peak.
  int64_t oom_after = -1;
  for (const replay::OomEvent& o : c.summary.ooms) {
    if (o.event >= pk.event) {
      oom_after = o.event;
      break;
    }
  }
  // An OOM on another device of the job unwinds this device's step too (by time).
  int64_t other_oom_time = -1;
  if (pk.time_us >= 0) {
    const std::vector<int64_t> others = otherDeviceOomTimes(c.s, c.device);
    auto it = std::lower_bound(others.begin(), others.end(), pk.time_us);
    if (it != others.end()) other_oom_time = *it;
  }
  uint64_t spike = 0;
  std::vector<const AllocFact*> counted;  // the short-lived allocations, for the drop below
  StackGrouper stacks(c.s, {6});
  m->live.forEach([&](uint64_t, const replay::LiveBlock& b) {
    if (b.pending || b.alloc_event < 0) return;
    int32_t k = c.alloc_at[static_cast<size_t>(b.alloc_event)];
    if (k < 0) return;
    const AllocFact& a = c.allocs[static_cast<size_t>(k)];
    if (a.freed < 0 || a.freed - pk.event > window || pk.event - a.event > window) return;
    if (oom_after >= 0 && a.freed > oom_after) return;
    if (other_oom_time >= 0 && c.ev[static_cast<size_t>(a.freed)].time_us >= other_oom_time) return;
    spike += b.requested;
    counted.push_back(&a);
    stacks.add(b.stack, b.requested, b.size, 1, b.alloc_event);
  });
  // A spike matters when it is a large share of the peak: removing it lowers the peak that much.
  // Training steps normally hold a quarter of their peak in temporaries (backward, optimizer),
  // so only 40% and more counts.
  if (spike * 10 < pk.bytes * 4 || spike < 64 * kMiB) return;
  // A spike is short against the level it rises from: a level held for a good part of the run
  // around the peak (two state buffers swapped in a loop, new = f(old)) is a plateau, which no
  // chunking lowers.
  if (heldShare(c, pk.event, pk.bytes, pk.bytes - spike / 2) > kSpikeMaxHeldShare) return;
  // What the fix can give: the requested peak over the whole trace once the lines that made the
  // spike make no temporaries: without the counted allocations and every other short-lived one
  // (alive at most 2 x window events, at no OOM) from the same stacks, as chunking those lines
  // would do in every step. A second peak made by other lines keeps part of it: the drop, not
  // the spike, is what is promised, and it must reach the warning floor.
  std::vector<format::StackId> lines;  // the counted allocations' stacks, sorted
  std::vector<bool> is_counted(c.allocs.size(), false);
  for (const AllocFact* a : counted) {
    is_counted[static_cast<size_t>(a - c.allocs.data())] = true;
    if (a->stack != format::kNoStack) lines.push_back(a->stack);
  }
  std::sort(lines.begin(), lines.end());
  const Ooms ooms = oomsOf(c.s, c.device);
  std::vector<const AllocFact*> removed = counted;
  for (size_t k = 0; k < c.allocs.size(); ++k) {
    const AllocFact& a = c.allocs[k];
    if (is_counted[k] || a.freed < 0 || a.freed - a.event > 2 * window) continue;
    if (!std::binary_search(lines.begin(), lines.end(), a.stack)) continue;
    if (aliveAtAnOom(c, a, ooms)) continue;
    removed.push_back(&a);
  }
  PeakDrop d = peakWithout(c, removed);
  d.drop = std::min(d.drop, spike);
  if (d.drop < warningFloor(pk.bytes)) return;
  const std::vector<LiveGroup> v = stacks.take();
  Finding f;
  f.kind = FindingKind::TemporarySpike;
  f.device = c.device;
  f.severity = FindingSeverity::Warning;
  f.bytes = d.drop;
  const std::string estimate = d.exact ? "" : " (an estimate: the history began late)";
  f.title = "Temporary spike: " + formatBytes(spike) + " of short-lived allocations (" +
            pct(spike, pk.bytes) + " of the " + formatBytes(pk.bytes) +
            " peak) are alive only around the peak; without them the peak would be " +
            formatBytes(d.drop) + " lower" + estimate;
  f.fix =
      "compute this in chunks, in place, or under a smaller dtype: the requested peak drops by "
      "up to " +
      formatBytes(d.drop) + estimate + ", to " + formatBytes(pk.bytes - d.drop) +
      (d.new_peak_event >= 0 ? " (then set after event " + std::to_string(d.new_peak_event) + ")"
                             : " (then the state at the trace's start)");
  f.basis =
      "lifetimes around the requested-bytes peak; the drop from the requested bytes after every "
      "event without these allocations";
  f.where = c.frames(v.front().representative);
  f.evidence.push_back({"requested-bytes peak", pk.event, pk.time_us, pk.bytes, {}});
  f.evidence.push_back(
      {"requested-bytes peak without the short-lived allocations",
       d.new_peak_event,
       d.new_peak_event >= 0 ? c.ev[static_cast<size_t>(d.new_peak_event)].time_us : -1,
       pk.bytes - d.drop,
       {}});
  for (size_t k = 0; k < v.size() && k < opt.evidence_stacks; ++k) {
    f.evidence.push_back(
        {"short-lived at the peak, allocated from", -1, -1, v[k].requested_bytes, v[k].frames});
  }
  out.push_back(std::move(f));
}

}  // namespace memforensics::analysis::detail
