// detect_growth.cc: growth across training steps: leak and activation retention
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

// Live bytes at the end of each iteration, and which stacks the survivors come from.
struct IterationEnds {
  std::vector<uint64_t> live;  // requested bytes live after each iteration's last event
};

IterationEnds iterationEnds(Ctx& c) {
  return {c.facts.requested_at_iteration_end};
}

// Survivors: allocations made in iteration k (k >= 1: the first step creates state lazily) that
// are still alive at the end of the last iteration, grouped by stack and by category.
struct Survivors {
  std::map<StackId, std::pair<uint64_t, std::vector<int>>> by_stack;  // bytes, iterations seen
  uint64_t bytes = 0;
  uint64_t activation_bytes = 0;
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
    if (a.category == Category::Activation) s.activation_bytes += a.requested;
    seen[static_cast<size_t>(a.iteration)] = true;
  }
  s.iterations_with_survivors = static_cast<int>(std::count(seen.begin(), seen.end(), true));
  return s;
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

void detectGrowth(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  if (c.iters.size() < 3 || !iterationsAreTrainingSteps(c)) return;
  IterationEnds ends = iterationEnds(c);
  Survivors sv = survivors(c);
  // Growth from the end of iteration 1 to the end of the last: iteration 0 builds optimizer state
  // and gradients once, which is not a leak.
  uint64_t first = ends.live[1], last = ends.live.back();
  if (last <= first || sv.bytes == 0) return;
  uint64_t growth = last - first;
  size_t steps = ends.live.size() - 2;
  bool monotonic = true;
  for (size_t k = 2; k < ends.live.size(); ++k)
    monotonic = monotonic && ends.live[k] >= ends.live[k - 1];
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

  bool activations = sv.activation_bytes * 2 > sv.bytes;
  Finding f;
  f.device = c.device;
  f.bytes = growth;
  f.basis = c.basis;
  uint64_t peak = std::max<uint64_t>(1, c.summary.peak_requested.bytes);
  // High when the growth is a real share of the peak: it will run out of memory if the run is
  // longer.
  f.severity = growth * 20 >= peak ? FindingSeverity::High : FindingSeverity::Warning;
  if (activations) {
    f.kind = FindingKind::ActivationRetention;
    f.title =
        "Activation retention: forward activations of every step stay alive after its optimizer "
        "step (" +
        formatBytes(per_iter) + " per iteration, " + formatBytes(growth) + " over " +
        std::to_string(steps) + " iterations)";
    f.fix =
        "something keeps each step's autograd graph alive: typically accumulating a loss tensor "
        "(`total += loss`) instead of `loss.item()`, or storing outputs without `.detach()`";
  } else {
    f.kind = FindingKind::Leak;
    f.title = "Leak: live memory grows " + formatBytes(per_iter) + " per iteration (" +
              formatBytes(growth) + " over " + std::to_string(steps) +
              " iterations), allocated from the stacks below and never freed";
    f.fix =
        "tensors created every step are kept (e.g. appended to a list or a dict of metrics); keep "
        "`.item()` / `.detach().cpu()` copies instead, or clear the container";
  }
  // The line to fix: for retained activations the shared outer user frame (the training loop's
  // call), otherwise the innermost user frame of the largest surviving stack.
  f.where = c.frames(stacks.front().representative);
  for (size_t k = 0; k < ends.live.size(); ++k) {
    f.evidence.push_back({"live after " + c.iters[k].name,
                          c.iters[k].last_event,
                          c.iters[k].end_us,
                          ends.live[k],
                          {}});
  }
  for (size_t k = 0; k < stacks.size() && k < opt.evidence_stacks; ++k) {
    f.evidence.push_back({"survives its iteration, allocated from", -1, -1,
                          stacks[k].requested_bytes, stacks[k].frames});
  }
  out.push_back(std::move(f));
}

}  // namespace memforensics::analysis::detail
