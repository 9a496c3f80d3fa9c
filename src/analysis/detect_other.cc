// detect_other.cc: optimizer-state bloat, temporary spike, pending frees
// (docs/findings.md).
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "analysis/blocks.h"
#include "analysis/findings_ctx.h"
#include "analysis/stack_groups.h"
#include "common/format_bytes.h"

namespace memforensics::analysis::detail {

using format::Action;
using format::Event;
using format::StackId;

void detectOptimizerBloat(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  // Parameter bytes: what is live just before the first iteration (or at the start state) and
  // classified as a parameter; optimizer state: live at the end, classified as optimizer state.
  int64_t before = c.iters.empty() ? -1 : c.iters.front().first_event - 1;
  const MomentFacts* start = c.live(before);
  const MomentFacts* end = c.live(static_cast<int64_t>(c.ev.size()) - 1);
  if (start == nullptr || end == nullptr) return;
  uint64_t params = 0;
  start->live.forEach([&](uint64_t, const replay::LiveBlock& b) {
    if (!b.pending && categoryOfLive(c, b) == Category::Parameter) params += b.requested;
  });
  uint64_t state = 0;
  StackGrouper state_stacks(c.s, {6});
  end->live.forEach([&](uint64_t, const replay::LiveBlock& b) {
    if (!b.pending && categoryOfLive(c, b) == Category::OptimizerState) {
      state += b.requested;
      state_stacks.add(b.stack, b.requested, b.size, 1, b.alloc_event);
    }
  });
  if (params < kMiB || state == 0) return;
  double ratio = static_cast<double>(state) / static_cast<double>(params);
  // Adam/AdamW keep exp_avg and exp_avg_sq: 2x the parameters. Up to 2.5x is within rounding and
  // small extra buffers (step counters); above 3x there are extra copies.
  if (ratio <= 2.5) return;
  Finding f;
  f.kind = FindingKind::OptimizerStateBloat;
  f.device = c.device;
  f.severity = ratio > 3.0 ? FindingSeverity::High : FindingSeverity::Warning;
  uint64_t expected = 2 * params;
  f.bytes = state > expected ? state - expected : 0;
  char rb[32];
  std::snprintf(rb, sizeof rb, "%.1fx", ratio);
  f.title = "Optimizer state is " + std::string(rb) + " the parameter bytes (" +
            formatBytes(state) + " for " + formatBytes(params) +
            " of parameters; Adam needs 2x): " + formatBytes(f.bytes) + " more than expected";
  f.fix =
      "look for a second optimizer over the same parameters, fp32 master copies kept alongside an "
      "optimizer "
      "that keeps its own, or state not freed when an optimizer is replaced";
  f.basis = c.basis.empty() ? "categories from stacks" : c.basis;
  const std::vector<LiveGroup> v = state_stacks.take();
  if (!v.empty()) f.where = c.frames(v.front().representative);
  f.evidence.push_back(
      {"parameters live before the first step (inferred)", before, -1, params, {}});
  f.evidence.push_back({"optimizer state live at the end (inferred)", -1, -1, state, {}});
  for (size_t k = 0; k < v.size() && k < opt.evidence_stacks; ++k) {
    f.evidence.push_back(
        {"optimizer state allocated from", -1, -1, v[k].requested_bytes, v[k].frames});
  }
  out.push_back(std::move(f));
}

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

void detectPendingFree(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  const replay::Peak& pk = c.summary.peak_active;
  if (pk.event < 0) return;
  const MomentFacts* m = c.live(pk.event);
  if (m == nullptr) return;
  uint64_t pending = m->at.pending;
  // Blocks the user freed but another stream still uses: worth saying when they are a tenth of
  // the active bytes at the active peak and at least 64 MiB.
  if (pending * 10 < pk.bytes || pending < 64 * kMiB) return;
  Finding f;
  f.kind = FindingKind::PendingFreeRetention;
  f.device = c.device;
  f.severity = FindingSeverity::Warning;
  f.bytes = pending;
  f.title = "Pending frees: " + formatBytes(pending) + " (" + pct(pending, pk.bytes) +
            " of the active peak) were freed by the program but still wait for another stream";
  f.fix =
      "tensors used on a side stream (record_stream) are only reused after that stream's work "
      "completes; "
      "synchronize the streams earlier or allocate on the stream that uses the tensor";
  f.basis = "free_requested without free_completed at the active-bytes peak";
  const auto v = groupLiveByStack(c.s, m->live, PendingBlocks::Only, {6, opt.evidence_stacks});
  if (!v.empty()) f.where = c.frames(v.front().representative);
  f.evidence.push_back({"active-bytes peak", pk.event, pk.time_us, pk.bytes, {}});
  for (const LiveGroup& g : v)
    f.evidence.push_back({"pending free, allocated from", -1, -1, g.requested_bytes, g.frames});
  out.push_back(std::move(f));
}

}  // namespace memforensics::analysis::detail
