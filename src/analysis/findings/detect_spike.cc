// detect_spike.cc: a short-lived temporary at the peak (docs/findings.md "Temporary spike").
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

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
  const std::vector<LiveGroup> v = stacks.take();
  Finding f;
  f.kind = FindingKind::TemporarySpike;
  f.device = c.device;
  f.severity = FindingSeverity::Warning;
  f.bytes = spike;
  f.title = "Temporary spike: " + formatBytes(spike) + " of short-lived allocations (" +
            pct(spike, pk.bytes) + " of the " + formatBytes(pk.bytes) +
            " peak) are alive only around the peak";
  f.fix =
      "compute this in chunks, in place, or under a smaller dtype; the peak drops by up to this "
      "amount";
  f.basis = "lifetimes around the requested-bytes peak";
  f.where = c.frames(v.front().representative);
  f.evidence.push_back({"requested-bytes peak", pk.event, pk.time_us, pk.bytes, {}});
  for (size_t k = 0; k < v.size() && k < opt.evidence_stacks; ++k) {
    f.evidence.push_back(
        {"short-lived at the peak, allocated from", -1, -1, v[k].requested_bytes, v[k].frames});
  }
  out.push_back(std::move(f));
}

}  // namespace memforensics::analysis::detail
