// detect_growth.cc: memory kept across training steps: the leak (live bytes grow step over step,
// whatever the category) and activation retention (one step's activations alive into the next
// step, bounded) (docs/findings.md).
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include "analysis/findings/findings_ctx.h"
#include "analysis/frames/stack_groups.h"
#include "analysis/session/blocks.h"
#include "common/format_bytes.h"

namespace memforensics::analysis::detail {

using format::Action;
using format::Event;
using format::StackId;

// Activation retention fires when freeing the retained activations where their backward ends
// lowers the requested peak by at least this share of it and at least kRetentionMinBytes; a
// warning from warningFloor when the replay's peak reserved drops by that much too.
inline constexpr double kRetentionMinShare = 0.05;
inline constexpr uint64_t kRetentionMinBytes = 16 * kMiB;

StepEnds::StepEnds(const Ctx& c) : c_(c) {
  for (const Phase& p : c.facts.phases) {
    if (p.kind == PhaseKind::Optimizer && p.iteration >= 0 && p.last_event >= p.first_event)
      optimizer_.emplace_back(p.first_event, p.last_event);
  }
  std::sort(optimizer_.begin(), optimizer_.end());
}

int64_t StepEnds::of(const AllocFact& a) const {
  if (a.iteration < 0 || static_cast<size_t>(a.iteration) >= c_.iters.size()) return -1;
  const int64_t iter_end = c_.iters[static_cast<size_t>(a.iteration)].last_event;
  if (optimizer_.empty()) return iter_end;
  auto it =
      std::upper_bound(optimizer_.begin(), optimizer_.end(), std::make_pair(a.event, INT64_MAX));
  // No optimizer phase after it (the last step's optimizer came before, or the run stopped): the
  // end of its iteration.
  return it == optimizer_.end() ? iter_end : it->second;
}

// Detected (not annotated) iterations are trusted to be training steps only when most of them run
// a backward pass or an optimizer: the same allocation pattern also repeats per layer inside one
// forward pass, or per tensor while a model loads, and growth across those is no leak.
bool iterationsAreTrainingSteps(Ctx& c) {
  if (c.iters.empty() || c.iters.front().source == PhaseSource::Annotation) return true;
  std::vector<bool> training(c.iters.size(), false);
  for (const AllocFact& a : c.allocs) {
    if (a.iteration >= 0 && (c.flagsOf(a.stack) & (kAutograd | kOptimizer)))
      training[static_cast<size_t>(a.iteration)] = true;
  }
  return std::count(training.begin(), training.end(), true) * 2 >=
         static_cast<long>(c.iters.size());
}

namespace {

// Survivors: allocations made in iteration k (k >= 1: the first step creates state lazily) that
// are still alive at the end of the last iteration, grouped by stack and by category.
struct Survivors {
  std::map<StackId, std::pair<uint64_t, std::vector<int>>> by_stack;  // bytes, iterations seen
  uint64_t bytes = 0;
  uint64_t forward_bytes = 0;  // made by a model's forward (category activation)
  int iterations_with_survivors = 0;
};

Survivors survivors(Ctx& c) {
  Survivors s;
  if (c.iters.size() < 3) return s;
  int64_t end = c.iters.back().last_event;
  std::vector<bool> seen(c.iters.size(), false);
  for (const AllocFact& a : c.allocs) {
    // The last iteration's allocations are still in use at its end by design; skip them too.
    if (a.iteration < 1 || a.iteration + 1 >= static_cast<int>(c.iters.size())) continue;
    if (a.freed >= 0 && a.freed <= end) continue;
    auto& e = s.by_stack[a.stack];
    e.first += a.requested;
    if (e.second.empty() || e.second.back() != a.iteration) e.second.push_back(a.iteration);
    s.bytes += a.requested;
    if (a.category == Category::Activation) s.forward_bytes += a.requested;
    seen[static_cast<size_t>(a.iteration)] = true;
  }
  s.iterations_with_survivors = static_cast<int>(std::count(seen.begin(), seen.end(), true));
  return s;
}

void detectLeak(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  if (c.iters.size() < 3) return;
  const std::vector<uint64_t>& live = c.facts.requested_at_iteration_end;
  if (live.size() != c.iters.size()) return;
  Survivors sv = survivors(c);
  // Growth from the end of iteration 1 to the end of the last: iteration 0 builds optimizer state
  // and gradients once, which is not a leak.
  uint64_t first = live[1], last = live.back();
  if (last <= first || sv.bytes == 0) return;
  uint64_t growth = last - first;
  size_t steps = live.size() - 2;
  bool monotonic = true;
  for (size_t k = 2; k < live.size(); ++k) monotonic = monotonic && live[k] >= live[k - 1];
  // Survivors must come from most of the middle iterations: a one-off cache is not a leak.
  int middle = static_cast<int>(c.iters.size()) - 2;
  if (!monotonic || sv.iterations_with_survivors * 2 < middle || growth < kMiB) return;
  uint64_t per_iter = growth / std::max<size_t>(1, steps);

  StackGrouper grouper(c.s, {6});
  for (const auto& [st, e] : sv.by_stack) {
    if (static_cast<int>(e.second.size()) * 2 >= middle) grouper.add(st, e.first);
  }
  const std::vector<LiveGroup> stacks = grouper.take();
  if (stacks.empty()) return;

  // Whatever the category: bytes made by the forward and kept every step (outputs stored without
  // detach, a loss accumulated as a tensor, which keeps its whole graph) grow without bound too.
  const bool forward = sv.forward_bytes * 2 > sv.bytes;
  Finding f;
  f.kind = FindingKind::Leak;
  f.device = c.device;
  f.bytes = growth;
  f.basis = c.basis;
  uint64_t peak = std::max<uint64_t>(1, c.summary.peak_requested.bytes);
  // High when the growth is a real share of the peak: it will run out of memory if the run is
  // longer.
  f.severity = growth * 20 >= peak ? FindingSeverity::High : FindingSeverity::Warning;
  f.title = "Leak: live memory grows " + formatBytes(per_iter) + " per iteration (" +
            formatBytes(growth) + " over " + std::to_string(steps) + " iterations), " +
            (forward ? "forward activations and outputs of every step are kept"
                     : "allocated from the stacks below and never freed");
  if (forward) {
    f.fix =
        "each step's forward results stay referenced after its backward and optimizer step, "
        "with their autograd graph: typically `history.append(out)` or `total_loss += loss`; "
        "keep `out.detach()` / `loss.item()` instead, or clear the container";
    // The model call that made most of the kept bytes (train.py:53 `logits = model(x)`).
    struct Site {
      uint64_t bytes = 0, largest = 0;
      StackId stack = format::kNoStack;  // its largest stack
    };
    std::map<std::string, Site> by_site;
    for (const auto& [st, e] : sv.by_stack) {
      if (static_cast<int>(e.second.size()) * 2 < middle) continue;
      const std::vector<FrameText> w = keptForwardWhere(c, st);
      if (w.empty()) continue;
      Site& site = by_site[w.front().display()];
      site.bytes += e.first;
      if (e.first > site.largest) site.largest = e.first, site.stack = st;
    }
    StackId best = stacks.front().representative;
    uint64_t best_bytes = 0;
    for (const auto& [text, site] : by_site) {
      if (site.bytes > best_bytes) best_bytes = site.bytes, best = site.stack;
    }
    f.where = keptForwardWhere(c, best);
  } else {
    f.fix =
        "tensors created every step are kept (e.g. appended to a list or a dict of metrics); keep "
        "`.item()` / `.detach().cpu()` copies instead, or clear the container";
    f.where = c.frames(stacks.front().representative);
  }
  for (size_t k = 0; k < live.size(); ++k) {
    f.evidence.push_back(
        {"live after " + c.iters[k].name, c.iters[k].last_event, c.iters[k].end_us, live[k], {}});
  }
  if (sv.forward_bytes > 0) {
    f.evidence.push_back({"of the surviving bytes, made by the forward (activations, inferred)",
                          -1,
                          -1,
                          sv.forward_bytes,
                          {}});
  }
  for (size_t k = 0; k < stacks.size() && k < opt.evidence_stacks; ++k) {
    f.evidence.push_back({"survives its iteration, allocated from", -1, -1,
                          stacks[k].requested_bytes, stacks[k].frames});
  }
  out.push_back(std::move(f));
}

// Where an activation's backward is over, as the event before which it could be freed: after the
// last event of the first backward phase of its iteration that ends after it was made, else at the
// first event of its iteration's first optimizer phase that begins after it, else (steps without
// sub-phases) after its iteration's last allocation by the autograd engine, when that comes after
// it; -1 when its iteration runs no backward after it (nothing says when it was last needed).
class BackwardEnds {
 public:
  explicit BackwardEnds(Ctx& c) : last_autograd_(c.iters.size(), -1) {
    // A phase's iteration as AllocFact::iteration counts it: the position in c.iters of the step
    // that holds its first event (Phase::iteration is the ProfilerStep number, which starts where
    // the recording or the profiler's schedule did, not at 0).
    auto stepOf = [&](int64_t event) -> int {
      auto it = std::upper_bound(c.iters.begin(), c.iters.end(), event,
                                 [](int64_t e, const Phase& p) { return e < p.first_event; });
      if (it == c.iters.begin()) return -1;
      --it;
      return event <= it->last_event ? static_cast<int>(it - c.iters.begin()) : -1;
    };
    for (const Phase& p : c.facts.phases) {
      if (p.last_event < p.first_event) continue;
      if (p.kind != PhaseKind::Backward && p.kind != PhaseKind::Optimizer) continue;
      const int step = stepOf(p.first_event);
      if (step < 0) continue;
      if (p.kind == PhaseKind::Backward) backward_.emplace_back(step, p.last_event);
      if (p.kind == PhaseKind::Optimizer) optimizer_.emplace_back(step, p.first_event);
    }
    std::sort(backward_.begin(), backward_.end());
    std::sort(optimizer_.begin(), optimizer_.end());
    for (const AllocFact& a : c.allocs) {
      if (a.iteration >= 0 && static_cast<size_t>(a.iteration) < last_autograd_.size() &&
          (c.flagsOf(a.stack) & kAutograd))
        last_autograd_[static_cast<size_t>(a.iteration)] = a.event;
    }
  }
  int64_t of(const AllocFact& a) const {
    if (a.iteration < 0) return -1;
    const auto b =
        std::lower_bound(backward_.begin(), backward_.end(), std::make_pair(a.iteration, a.event));
    if (b != backward_.end() && b->first == a.iteration) return b->second + 1;
    const auto o = std::upper_bound(optimizer_.begin(), optimizer_.end(),
                                    std::make_pair(a.iteration, a.event));
    if (o != optimizer_.end() && o->first == a.iteration) return o->second;
    if (static_cast<size_t>(a.iteration) >= last_autograd_.size()) return -1;
    const int64_t g = last_autograd_[static_cast<size_t>(a.iteration)];
    return g > a.event ? g + 1 : -1;
  }

 private:
  std::vector<std::pair<int, int64_t>> backward_;   // (iteration, last event), sorted
  std::vector<std::pair<int, int64_t>> optimizer_;  // (iteration, first event), sorted
  std::vector<int64_t> last_autograd_;              // per iteration, -1: none
};

// Activation retention: activations still alive after their step's backward is over (through the
// optimizer step, into the next step) that raise a later peak. The rule is the fix itself: free
// each such activation where its backward ends and recompute the requested bytes event by event;
// the finding fires only when their maximum drops, by that drop (so never for the peak step's own
// activations, which its backward still needs). A replay of the requests with those early frees
// through the caching allocator checks the peak reserved too. Activations released only by an
// OOM's unwind are not retention; those never released are the leak rule's, unless their stack
// was released late in an earlier step (the trace ended before the step that would free them).
void detectRetention(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  const replay::Peak& pk = c.summary.peak_requested;
  if (c.iters.size() < 2 || pk.event < 0 || pk.bytes == 0 || c.ev.empty()) return;
  const auto n = static_cast<int64_t>(c.ev.size());
  const BackwardEnds ends(c);
  const Ooms ooms = oomsOf(c.s, c.device);
  auto endOf = [&](const AllocFact& a) -> int64_t {
    if (a.category != Category::Activation || aliveAtAnOom(c, a, ooms)) return -1;
    const int64_t end = ends.of(a);
    return end > a.event && end < n ? end : -1;
  };
  std::vector<StackId> late;  // stacks released after their backward at least once
  for (const AllocFact& a : c.allocs) {
    const int64_t end = endOf(a);
    if (end >= 0 && a.freed > end) late.push_back(a.stack);
  }
  if (late.empty()) return;
  std::sort(late.begin(), late.end());
  late.erase(std::unique(late.begin(), late.end()), late.end());
  // The fix: each retained activation freed just before event `end` instead of at its free.
  struct Early {
    size_t k;     // index into c.allocs
    int64_t end;  // freed before this event
  };
  std::vector<Early> early;
  std::vector<double> delta(static_cast<size_t>(n) + 1, 0.0);
  for (size_t k = 0; k < c.allocs.size(); ++k) {
    const AllocFact& a = c.allocs[k];
    const int64_t end = endOf(a);
    if (end < 0) continue;
    if (a.freed >= 0 ? a.freed <= end : !std::binary_search(late.begin(), late.end(), a.stack))
      continue;
    early.push_back({k, end});
    const auto r = static_cast<double>(a.requested);
    delta[static_cast<size_t>(end)] -= r;
    delta[static_cast<size_t>(a.freed < 0 ? n : a.freed)] += r;
  }
  // Requested bytes after each event, as recorded and with the fix, in double (hostile sizes near
  // 2^64 must not overflow a sum): the saving is the drop of their maximum.
  const std::vector<double> level = requestedLevels(c, 0, n - 1);
  double max_now = 0, max_fixed = 0, shift = 0;
  int64_t fixed_at = 0;
  for (size_t i = 0; i < level.size(); ++i) {
    shift += delta[i];
    max_now = std::max(max_now, level[i]);
    if (level[i] + shift > max_fixed)
      max_fixed = level[i] + shift, fixed_at = static_cast<int64_t>(i);
  }
  const double drop_d = std::max(0.0, max_now - max_fixed);
  const uint64_t drop =
      drop_d >= static_cast<double>(pk.bytes) ? pk.bytes : static_cast<uint64_t>(drop_d);
  if (drop < kRetentionMinBytes ||
      static_cast<double>(drop) < kRetentionMinShare * static_cast<double>(pk.bytes))
    return;
  // What is retained at the recorded peak, by the line that allocated it.
  StackGrouper lines(c.s, {1});
  StackGrouper stacks(c.s, {6});
  uint64_t at_peak = 0;
  int64_t example_end = -1;
  for (const Early& e : early) {
    const AllocFact& a = c.allocs[e.k];
    if (e.end > pk.event || (a.freed >= 0 && a.freed <= pk.event) || a.event > pk.event) continue;
    at_peak += a.requested;
    lines.add(a.stack, a.requested, 0, 1, a.event);
    stacks.add(a.stack, a.requested, 0, 1, a.event);
    if (example_end < 0) example_end = e.end;
  }
  const std::vector<LiveGroup> by_line = lines.take();
  const std::vector<LiveGroup> v = stacks.take();
  if (v.empty() || by_line.empty()) return;
  // The check through the caching allocator: the peak reserved with the same early frees.
  std::string untested, checked;
  bool reserved_drops = true;
  if (std::optional<FixBaseline> base = fixBaseline(c, opt, &untested)) {
    SimChange change;
    change.max_segment_visits = kReplayCheckVisits;
    for (const Early& e : early) change.early_frees.emplace_back(e.end, c.allocs[e.k].event);
    std::sort(change.early_frees.begin(), change.early_frees.end());
    const SimResult r = simulateRequests(c.trace(), base->conf, base->capacity, change);
    const SimResult& b = base->facts.baseline;
    if (!r.aborted && r.oom_count <= b.oom_count) {
      const uint64_t saved =
          b.peak_reserved > r.peak_reserved ? b.peak_reserved - r.peak_reserved : 0;
      reserved_drops = saved >= warningFloor(pk.bytes);
      checked = "checked by replay: peak reserved " + formatBytes(b.peak_reserved) + " -> " +
                formatBytes(r.peak_reserved) + ", peak allocated " + formatBytes(b.peak_allocated) +
                " -> " + formatBytes(r.peak_allocated) + " (" +
                exactLabel(whatIfEstimateReason(base->facts, base->conf)) + ")";
    } else {
      untested = r.aborted ? "the replay ran out of its work budget"
                           : "the replay with the early frees fails a request";
    }
  }
  Finding f;
  f.kind = FindingKind::ActivationRetention;
  f.device = c.device;
  f.severity = drop >= warningFloor(pk.bytes) && reserved_drops ? FindingSeverity::Warning
                                                                : FindingSeverity::Info;
  f.bytes = drop;
  f.title = "Activation retention: " + formatBytes(at_peak) +
            " of forward activations alive at the peak outlived their step's backward; freed "
            "where their backward ends, the peak would drop by " +
            formatBytes(drop) + " (" + pct(drop, pk.bytes) + " of the " + formatBytes(pk.bytes) +
            ")";
  f.fix =
      "a variable, a hook or a container keeps a step's forward outputs after its backward (the "
      "logits or loss returned to the loop, `acts[name] = out`): drop them once the backward has "
      "run (`del`, clear the dict, keep `.item()` / `.detach().cpu()` copies), before "
      "optimizer.step() and the next forward";
  f.basis =
      std::string(c.basis.empty() ? "" : c.basis + "; ") +
      "requested bytes recomputed with each retained activation freed where its step's "
      "backward ends" +
      (checked.empty() ? (untested.empty() ? "" : "; not replayed: " + untested) : "; " + checked);
  // The line to change: the hook or user code that made it, or the model's call site when the
  // innermost user frame is a layer's forward.
  std::vector<FrameText> where = c.frames(by_line.front().representative);
  if (!where.empty() && where.front().name == "forward")
    where = keptForwardWhere(c, by_line.front().representative);
  f.where = where;
  f.evidence.push_back({"requested-bytes peak", pk.event, pk.time_us, pk.bytes, {}});
  f.evidence.push_back(
      {"with the retained activations freed where their backward ends, the "
       "highest point (requested bytes)",
       fixed_at,
       c.ev[static_cast<size_t>(fixed_at)].time_us,
       pk.bytes - drop,
       {}});
  if (example_end >= 0) {
    f.evidence.push_back({"a retained activation's backward ended here",
                          example_end,
                          c.ev[static_cast<size_t>(example_end)].time_us,
                          0,
                          {}});
  }
  for (size_t k = 0; k < v.size() && k < opt.evidence_stacks; ++k) {
    f.evidence.push_back({"alive at the peak after its backward, allocated from", -1, -1,
                          v[k].requested_bytes, v[k].frames});
  }
  out.push_back(std::move(f));
}

// The user frame that called the model for a forward-made stack: the innermost User frame outside
// every `forward` function, outer to one (`logits = model(x)` at train.py:53), or nullopt.
std::optional<size_t> forwardCallSite(const format::Snapshot& s, StackId id) {
  if (id == format::kNoStack || id == format::kEmptyStack) return std::nullopt;
  auto frames = s.stacks.stack(id);
  bool in_forward = false;
  for (size_t i = 0; i < frames.size(); ++i) {
    const format::Frame& f = s.stacks.frame(frames[i]);
    const bool fwd = s.strings.get(f.name) == "forward" && isPythonFile(s.strings.get(f.filename));
    if (fwd) {
      in_forward = true;
    } else if (in_forward && classifyFrame(s, f) == FrameKind::User) {
      return i;
    }
  }
  return std::nullopt;
}

}  // namespace

// The line to change for bytes made by a forward and kept: the model's call site and its callers
// (train.py:53 <- train.py:86); otherwise the innermost user frames.
std::vector<FrameText> keptForwardWhere(Ctx& c, StackId id) {
  std::optional<size_t> site = forwardCallSite(c.s, id);
  if (!site) return c.frames(id);
  std::vector<FrameText> out;
  auto frames = c.s.stacks.stack(id);
  for (size_t i = *site; i < frames.size() && out.size() < 3; ++i) {
    const format::Frame& f = c.s.stacks.frame(frames[i]);
    if (classifyFrame(c.s, f) == FrameKind::User) out.push_back(frameText(c.s, frames[i]));
  }
  return out;
}

void detectGrowth(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  if (c.iters.empty() || !iterationsAreTrainingSteps(c)) return;
  detectLeak(c, out, opt);
  detectRetention(c, out, opt);
}

}  // namespace memforensics::analysis::detail
