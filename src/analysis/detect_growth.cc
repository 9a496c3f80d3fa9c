// detect_growth.cc: memory kept across training steps: the leak (live bytes grow step over step,
// whatever the category) and activation retention (one step's activations alive into the next
// step, bounded) (docs/findings.md).
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include "analysis/blocks.h"
#include "analysis/findings_ctx.h"
#include "analysis/stack_groups.h"
#include "common/format_bytes.h"

namespace memforensics::analysis::detail {

using format::Action;
using format::Event;
using format::StackId;

// Activation retention fires when the retained bytes alive at the requested peak are at least
// this share of the peak and at least kRetentionMinBytes: below that the peak is set by something
// else. High from kRetentionHighShare of the peak.
inline constexpr double kRetentionMinShare = 0.05;
inline constexpr uint64_t kRetentionMinBytes = 16 * kMiB;
inline constexpr double kRetentionHighShare = 0.25;

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

// Activation retention: at the requested peak, activations made in a step that are still alive
// when the next step's forward has begun (its first activation is made) and are released in a
// later step: bounded, but they raise every step's peak by their size.
void detectRetention(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  const replay::Peak& pk = c.summary.peak_requested;
  if (c.iters.size() < 2 || pk.event < 0 || pk.bytes == 0) return;
  // The first activation of each iteration: its forward has begun.
  std::vector<int64_t> forward_begins(c.iters.size(), -1);
  for (const AllocFact& a : c.allocs) {
    if (a.category == Category::Activation && a.iteration >= 0 &&
        forward_begins[static_cast<size_t>(a.iteration)] < 0)
      forward_begins[static_cast<size_t>(a.iteration)] = a.event;
  }
  const int64_t last_iter_event = c.iters.back().last_event;
  const int last_iter = static_cast<int>(c.iters.size()) - 1;
  // Alive into the next step's forward and released within the iterations.
  auto releasedLate = [&](const AllocFact& a) {
    if (a.category != Category::Activation || a.iteration < 0 || a.iteration >= last_iter)
      return false;
    const int64_t next = forward_begins[static_cast<size_t>(a.iteration) + 1];
    return next >= 0 && a.freed > next && a.freed <= last_iter_event;
  };
  // Stacks released late at least once: an allocation of the last step with such a stack, alive
  // at the end, is retained the same way (the trace ends before the step that would free it).
  std::vector<StackId> late;
  for (const AllocFact& a : c.allocs) {
    if (releasedLate(a)) late.push_back(a.stack);
  }
  if (late.empty()) return;
  std::sort(late.begin(), late.end());
  late.erase(std::unique(late.begin(), late.end()), late.end());
  uint64_t retained = 0;
  StackGrouper lines(c.s, {1});  // the line that allocated them
  StackGrouper stacks(c.s, {6});
  int64_t example_free = -1;
  for (const AllocFact& a : c.allocs) {
    if (a.event > pk.event) break;
    if (a.freed >= 0 && a.freed <= pk.event) continue;  // not alive at the peak
    const bool last_step = a.category == Category::Activation && a.iteration == last_iter &&
                           a.freed < 0 && std::binary_search(late.begin(), late.end(), a.stack);
    if (!last_step && !releasedLate(a)) continue;
    retained += a.requested;
    lines.add(a.stack, a.requested, 0, 1, a.event);
    stacks.add(a.stack, a.requested, 0, 1, a.event);
    if (example_free < 0 && a.freed >= 0) example_free = a.freed;
  }
  const double share = static_cast<double>(retained) / static_cast<double>(pk.bytes);
  if (retained < kRetentionMinBytes || share < kRetentionMinShare) return;
  const std::vector<LiveGroup> by_line = lines.take();
  const std::vector<LiveGroup> v = stacks.take();
  if (v.empty() || by_line.empty()) return;
  Finding f;
  f.kind = FindingKind::ActivationRetention;
  f.device = c.device;
  f.severity = share >= kRetentionHighShare ? FindingSeverity::High : FindingSeverity::Warning;
  f.bytes = retained;
  f.title = "Activation retention: " + formatBytes(retained) +
            " of forward activations alive at the peak stay alive into the next step's forward (" +
            pct(retained, pk.bytes) + " of the " + formatBytes(pk.bytes) + " peak)";
  f.fix =
      "a hook or a variable keeps a step's outputs until the next step overwrites them: release "
      "them at the end of the step (del, clear the dict, keep `.detach().cpu()` copies); the peak "
      "drops by up to this amount";
  f.basis = c.basis;
  f.where = c.frames(by_line.front().representative);
  f.evidence.push_back({"requested-bytes peak", pk.event, pk.time_us, pk.bytes, {}});
  if (example_free >= 0) {
    f.evidence.push_back({"a retained block is released in the next step's forward",
                          example_free,
                          c.ev[static_cast<size_t>(example_free)].time_us,
                          0,
                          {}});
  }
  for (size_t k = 0; k < v.size() && k < opt.evidence_stacks; ++k) {
    f.evidence.push_back({"alive into the next step at the peak, allocated from", -1, -1,
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
