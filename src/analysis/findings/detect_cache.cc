// detect_cache.cc: what the caching allocator keeps that the run does not need: cache bloat (a
// transient left the cache large and the rest of the run never uses it again) and the allocator
// setting a replay of the requests shows would lower the peak reserved (docs/findings.md). Both
// check their fix by replaying the device's requests (whatif.h simulateRequests) before saying it.
#include <algorithm>
#include <map>
#include <string>

#include "analysis/findings/findings_ctx.h"
#include "analysis/whatif/whatif.h"
#include "common/format_bytes.h"
#include "common/saturating.h"
#include "replay/alloc_conf.h"

namespace memforensics::analysis::detail {

using format::Action;

namespace {

// The share of the run from event `from` to its end, by time when the events have times (the
// stretch the memory is held), else by events; in [0, 1] (a hostile file's times may run
// backwards, and the share is printed as a percentage through an int).
double tailShare(const Ctx& c, int64_t from, int64_t from_time) {
  const replay::DeviceSummary& s = c.summary;
  double share = 0.0;
  if (from_time >= 0 && s.first_time_us >= 0 && s.last_time_us > s.first_time_us) {
    share = static_cast<double>(s.last_time_us - from_time) /
            static_cast<double>(s.last_time_us - s.first_time_us);
  } else if (!c.ev.empty()) {
    const auto n = static_cast<double>(c.ev.size());
    share = (n - static_cast<double>(from)) / n;
  }
  return std::clamp(share, 0.0, 1.0);
}

// The event after which the requested bytes were lowest in [lo, hi] (the first such event): where
// a transient is over and the cache it left holds the least. From the allocation table (blocks
// alive before the trace do not move within a complete history).
int64_t lowestBetween(const Ctx& c, int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  const std::vector<double> level = requestedLevels(c, lo, hi);
  double best = 0;
  int64_t at = lo;
  for (size_t k = 0; k < level.size(); ++k) {
    if (level[k] < best) {
      best = level[k];
      at = lo + static_cast<int64_t>(k);
    }
  }
  return at;
}

std::string percentOf(double share) {
  return std::to_string(static_cast<int>(share * 100.0 + 0.5)) + "%";
}

}  // namespace

void detectCacheBloat(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  const replay::Peak& pr = c.summary.peak_reserved;
  if (pr.bytes == 0 || c.facts.profile.empty()) return;
  // The reserved bytes must be the allocator's: a profiler trace without "Total Reserved" has
  // synthesized ones (the allocated high-water mark), which say nothing of a cache.
  if (!c.s.reserved_recorded) return;
  // After an OOM the exception's unwind frees the tensors and leaves the cache full: when the
  // cache reached its size at or before the last OOM, the end state is that unwind, which the OOM
  // verdict explains; it is not a separate warning.
  if (!c.summary.ooms.empty() && pr.event <= c.summary.ooms.back().event) return;
  // The same when another device of the job ran out of memory after this one's cache peaked.
  const std::vector<int64_t> others = otherDeviceOomTimes(c.s, c.device);
  if (!others.empty() && pr.time_us >= 0 && pr.time_us <= others.back()) return;

  // From each stretch of the profile to the end: the most the rest of the run had in use (active)
  // and the least the cache kept reserved; the cached bytes the rest never needs are hold - need.
  // The tail: walking back from the end, first to a quarter of the run (kCacheTailShare: a working
  // set cached in the last moments of a run is the allocator doing its job), then on while the
  // rest of the run needs no more than it does there (within a quarter of the floor): it begins
  // where the transient is over.
  const std::vector<ProfileBucket>& p = c.facts.profile;
  // What the call gives back helps other processes, not this run's peak: worth a warning from a
  // quarter of the peak reserved (kCacheBloatMinShare), and the policy's floor.
  const uint64_t floor =
      std::max(warningFloor(pr.bytes),
               static_cast<uint64_t>(static_cast<double>(pr.bytes) * kCacheBloatMinShare));
  uint64_t need = c.summary.final_replayed.active(), hold = c.summary.final_replayed.reserved;
  size_t from = p.size();
  uint64_t need_from = 0, hold_from = 0, rest = 0;
  bool long_enough = false;
  for (size_t b = p.size(); b-- > 0;) {
    need = std::max(need, p[b].max_active);
    hold = std::min(hold, p[b].min_reserved);
    if (hold < need || hold - need < floor) break;
    if (long_enough && need - rest > floor / 4) break;
    from = b;
    need_from = need;
    hold_from = hold;
    if (!long_enough && tailShare(c, p[b].first_event, p[b].first_time_us) >= kCacheTailShare) {
      long_enough = true;
      rest = need;
    }
  }
  if (from == p.size() || !long_enough) return;
  const int64_t from_event = p[from].first_event;
  // A transient made the cache that large inside the trace: the reserved peak comes before the
  // tail, and before the tail the run had at least the floor more in use than it ever has after.
  // Otherwise the bytes were never used in the trace (a cache reserved before it began, or
  // rounding and splitting the whole run pays for): no call at a moment gives them back.
  if (pr.event < 0 || pr.event >= from_event) return;
  uint64_t before = c.summary.start.active();
  size_t transient_bucket = 0;  // the last stretch before the tail that reached it
  for (size_t b = 0; b < from; ++b) {
    if (p[b].max_active >= before) transient_bucket = b;
    before = std::max(before, p[b].max_active);
  }
  const int64_t transient = p[transient_bucket].first_event;
  if (before < need_from || before - need_from < floor) return;
  const double share = tailShare(c, from_event, p[from].first_time_us);

  // The fix, checked: torch.cuda.empty_cache() once the transient is over (where the requested
  // bytes are lowest between the transient's stretch and the tail's first one), then the rest of
  // the run replayed; what it gives back is what the recording kept minus what the replay reserves
  // again. Called later, the next steps may already have split the transient's segments and pinned
  // them.
  int64_t call = lowestBetween(c, transient, p[from].last_event) + 1;
  // After the free_completed events that finish those frees (a block is cached only then).
  while (call < static_cast<int64_t>(c.ev.size()) &&
         c.ev[static_cast<size_t>(call)].action == Action::FreeCompleted)
    ++call;
  uint64_t bytes = hold_from - need_from;
  std::string checked, untested;
  std::optional<FixBaseline> base = fixBaseline(c, opt, &untested);
  if (base) {
    SimChange change;
    change.empty_cache_before = call;
    const SimResult r = simulateRequests(c.trace(), base->conf, base->capacity, change);
    // Never more than the profile allows: what stays in use after the call stays reserved.
    const uint64_t kept = std::min(
        hold_from - need_from,
        hold_from > r.peak_reserved_after_change ? hold_from - r.peak_reserved_after_change : 0);
    if (r.oom_count > base->facts.baseline.oom_count) return;  // the call would cost an OOM
    if (kept < floor) return;  // the replay re-reserves what the call would give back
    bytes = kept;
    checked = "checked by replay: with torch.cuda.empty_cache() before event " +
              std::to_string(call) + " the rest of the run reserves at most " +
              formatBytes(r.peak_reserved_after_change) + " (the recording kept at least " +
              formatBytes(hold_from) + "; " +
              exactLabel(whatIfEstimateReason(base->facts, base->conf)) + ")";
  }

  Finding f;
  f.kind = FindingKind::CacheBloat;
  f.device = c.device;
  f.severity = FindingSeverity::Warning;
  f.bytes = bytes;
  f.title = "Cache bloat: " + formatBytes(bytes) + " of the " + formatBytes(hold_from) +
            " reserved is never used again in the last " + percentOf(share) + " of the run";
  f.fix =
      "a transient left the cache large and the rest of the run never uses it: "
      "torch.cuda.empty_cache() once the transient is over (before event " +
      std::to_string(call) +
      ", before the next allocations split its segments) gives it back to the device for "
      "other processes";
  f.basis =
      "replayed reserved and active bytes; " +
      (checked.empty() ? "the call's effect is an estimate (untested: " + untested + ")" : checked);
  f.evidence.push_back({"peak reserved", pr.event, pr.time_us, pr.bytes, {}});
  f.evidence.push_back({"the most in use (active) from here to the end",
                        from_event,
                        p[from].first_time_us,
                        need_from,
                        {}});
  f.evidence.push_back({"the least reserved from here to the end",
                        from_event,
                        p[from].first_time_us,
                        hold_from,
                        {}});
  // The line to look at: the transient's largest allocation (alive in the stretch where the run
  // had the most in use, freed before the call).
  const AllocFact* largest = nullptr;
  const int64_t transient_last = p[transient_bucket].last_event;
  for (const AllocFact& a : c.allocs) {
    if (a.event > transient_last) break;  // in event order
    if (a.freed < transient || a.freed >= call) continue;
    if (largest == nullptr || a.requested > largest->requested) largest = &a;
  }
  if (largest != nullptr) {
    f.where = c.frames(largest->stack);
    f.evidence.push_back({"the transient's largest allocation", largest->event,
                          c.ev[static_cast<size_t>(largest->event)].time_us, largest->requested,
                          f.where});
  }
  out.push_back(std::move(f));
}

void detectAllocatorSetting(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  const replay::DeviceSummary& s = c.summary;
  // A device that ran out of memory has its tested settings in the OOM verdict's fix.
  if (!s.ooms.empty() || !c.s.reserved_recorded) return;
  const uint64_t floor = warningFloor(s.peak_reserved.bytes);
  // No setting lowers the peak reserved below the most the device had in use at once.
  if (s.peak_reserved.bytes < s.peak_active.bytes ||
      s.peak_reserved.bytes - s.peak_active.bytes < floor)
    return;
  std::string untested;
  std::optional<FixBaseline> base = fixBaseline(c, opt, &untested);
  if (!base || base->conf.expandable_segments) return;  // a setting the run has is never advised
  replay::AllocConf conf = base->conf;
  if (!replay::applyAllocSetting(conf, "expandable_segments", "True").empty()) return;
  const SimResult r = simulateRequests(c.trace(), conf, base->capacity);
  const SimResult& b = base->facts.baseline;
  if (r.oom_count > b.oom_count) return;
  // Against the recording and against the baseline replay: the smaller saving.
  const uint64_t from = std::min(base->facts.recorded_peak_reserved, b.peak_reserved);
  if (from < r.peak_reserved || from - r.peak_reserved < floor) return;
  const uint64_t saving = from - r.peak_reserved;
  const std::string reason = whatIfEstimateReason(base->facts, conf);

  Finding f;
  f.kind = FindingKind::AllocatorSetting;
  f.device = c.device;
  f.severity = FindingSeverity::Warning;
  f.bytes = saving;
  f.title =
      "Allocator setting: with expandable_segments:True a replay of this run's requests "
      "peaks at " +
      formatBytes(r.peak_reserved) + " reserved instead of " + formatBytes(from) + " (" +
      formatBytes(saving) + " less, " + pct(saving, from) + ")";
  f.fix =
      "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments then grow in place, so "
      "freed pieces are reused by larger requests instead of new segments being reserved";
  f.basis = "checked by replay of the device's requests (" + exactLabel(reason) + ")";
  // The line to look at: the allocations the recording reserved the most segment bytes for (a
  // segment event carries the stack of the request that made it).
  std::map<format::StackId, uint64_t> by_stack;
  for (const format::Event& e : c.ev)
    if (e.action == Action::SegmentAlloc || e.action == Action::SegmentMap)
      by_stack[e.stack] = addSat(by_stack[e.stack], e.size);
  auto top = std::max_element(by_stack.begin(), by_stack.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second < b.second : a.first > b.first;
  });
  if (top != by_stack.end() && top->first != format::kNoStack) {
    f.where = c.frames(top->first);
    f.evidence.push_back(
        {"segments reserved in the recording for allocations from", -1, -1, top->second, f.where});
  }
  f.evidence.push_back({"peak reserved in the recording",
                        s.peak_reserved.event,
                        s.peak_reserved.time_us,
                        base->facts.recorded_peak_reserved,
                        {}});
  f.evidence.push_back({"peak in use (active) in the recording",
                        s.peak_active.event,
                        s.peak_active.time_us,
                        s.peak_active.bytes,
                        {}});
  f.evidence.push_back({"peak reserved in a replay under the file's settings (" +
                            describeAllocConf(base->conf) + ")",
                        -1,
                        -1,
                        b.peak_reserved,
                        {}});
  f.evidence.push_back({std::string("peak reserved in a replay with expandable_segments:True (") +
                            (reason.empty() ? "exact" : "estimate") + ")",
                        -1,
                        -1,
                        r.peak_reserved,
                        {}});
  out.push_back(std::move(f));
}

}  // namespace memforensics::analysis::detail
