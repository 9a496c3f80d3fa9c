// findings.cc: see findings.h; the rules are explained in docs/findings.md.
#include "analysis/findings.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>

#include "analysis/blocks.h"
#include "analysis/frame_class.h"
#include "analysis/stack_groups.h"
#include "common/format_bytes.h"

namespace memforensics::analysis {

using format::Action;
using format::Event;
using format::StackId;

std::string_view categoryName(Category c) {
  switch (c) {
    case Category::Parameter:
      return "parameter";
    case Category::Gradient:
      return "gradient";
    case Category::Activation:
      return "activation";
    case Category::OptimizerState:
      return "optimizer_state";
    case Category::Temporary:
      return "temporary";
    case Category::Unknown:
      return "unknown";
  }
  return "unknown";
}

std::string_view findingKindId(FindingKind k) {
  switch (k) {
    case FindingKind::OomVerdict:
      return "oom_verdict";
    case FindingKind::Leak:
      return "leak";
    case FindingKind::ActivationRetention:
      return "activation_retention";
    case FindingKind::OptimizerStateBloat:
      return "optimizer_state_bloat";
    case FindingKind::CacheBloat:
      return "cache_bloat";
    case FindingKind::TemporarySpike:
      return "temporary_spike";
    case FindingKind::PendingFreeRetention:
      return "pending_free_retention";
  }
  return "unknown";
}

std::string_view findingSeverityName(FindingSeverity s) {
  switch (s) {
    case FindingSeverity::Info:
      return "info";
    case FindingSeverity::Warning:
      return "warning";
    case FindingSeverity::High:
      return "high";
  }
  return "info";
}

namespace {

constexpr uint64_t kMiB = 1ull << 20;

// What a stack says about the code that allocated, as bits, from the one frame classifier
// (frame_class.h stackFacts: phases and categories agree on what is backward or optimizer code).
enum StackFlag : uint8_t {
  kOptimizer = 1,   // an optimizer frame (torch/optim)
  kAutograd = 2,    // the autograd engine / a backward function
  kModuleInit = 4,  // parameter creation: nn.Module construction or .to()/.cuda()
  kForward = 8,     // a model's forward: a `forward` frame, the module call, torch.nn.functional
};

uint8_t stackFlags(const format::Snapshot& s, StackId id) {
  if (id == format::kNoStack || id == format::kEmptyStack) return 0;
  const StackFacts f = stackFacts(s, id);
  return static_cast<uint8_t>((f.optimizer ? kOptimizer : 0) | (f.backward ? kAutograd : 0) |
                              (f.module_init ? kModuleInit : 0) | (f.forward ? kForward : 0));
}

// One device's facts as the detectors read them, with a per-call cache of stack flags (no state
// survives a call: the detectors are pure functions of the facts).
struct Ctx {
  const format::Snapshot& s;
  const DeviceFacts& facts;
  int64_t device;
  std::span<const Event> ev;
  const std::vector<Phase>& iters;  // Iteration phases, in order
  const std::string& basis;
  const std::vector<AllocFact>& allocs;
  const std::vector<int32_t>& alloc_at;  // per event: index into allocs for alloc events, else -1
  const replay::DeviceSummary& summary;
  std::vector<uint8_t> flags;  // per stack id, 0xff = not computed

  Ctx(const format::Snapshot& snap, const DeviceFacts& f)
      : s(snap),
        facts(f),
        device(f.device),
        ev(f.events),
        iters(f.iterations),
        basis(f.iteration_basis),
        allocs(f.allocs),
        alloc_at(f.alloc_at),
        summary(f.summary) {}

  // The moment after `event` with its live set, or nullptr when the facts do not hold one.
  const MomentFacts* live(int64_t event) const {
    const MomentFacts* m = facts.at(event);
    return m != nullptr && m->has_live ? m : nullptr;
  }
  uint8_t flagsOf(StackId id) {
    if (id >= flags.size()) flags.resize(std::max<size_t>(s.stacks.stackCount(), id + 1), 0xff);
    if (flags[id] == 0xff) flags[id] = stackFlags(s, id);
    return flags[id];
  }
  std::vector<FrameText> frames(StackId id, size_t n = 3) const { return userFrames(s, id, n); }
};

// Category of a pre-trace block (alive when the history begins): only its stack is known.
Category preTraceCategoryOfFlags(uint8_t f) {
  if (f & kOptimizer) return Category::OptimizerState;
  if (f & kAutograd) return Category::Gradient;
  return Category::Parameter;
}

Category categorize(Ctx& c, const AllocFact& a) {
  uint8_t f = c.flagsOf(a.stack);
  const bool have_iters = !c.iters.empty();
  int64_t iter_end = a.iteration >= 0 ? c.iters[a.iteration].last_event : -1;
  // Long-lived: alive at the end, or (with iterations) outliving the iteration it was made in.
  bool long_lived = a.freed < 0 || (a.iteration >= 0 && a.freed > iter_end);
  if (f & kOptimizer) return long_lived ? Category::OptimizerState : Category::Temporary;
  if (f & kAutograd) return long_lived ? Category::Gradient : Category::Temporary;
  if (have_iters && a.event < c.iters.front().first_event) {
    return a.freed < 0 || a.freed > c.iters.front().first_event ? Category::Parameter
                                                                : Category::Temporary;
  }
  if (!have_iters) {
    if (f & kModuleInit) return Category::Parameter;
    return a.freed < 0 ? Category::Unknown : Category::Temporary;
  }
  if (a.iteration < 0) return Category::Unknown;
  // Made inside an iteration: a temporary if it dies soon after it was made; made by a model's
  // forward and living for a good part of the step (kept for backward), an activation; anything
  // else long-lived is not something the stack explains.
  const Phase& it = c.iters[a.iteration];
  int64_t len = std::max<int64_t>(1, it.last_event - it.first_event + 1);
  int64_t life = (a.freed < 0 ? static_cast<int64_t>(c.ev.size()) : a.freed) - a.event;
  if (life * 10 < len) return Category::Temporary;
  return (f & kForward) ? Category::Activation : Category::Unknown;
}

Category categoryOfLive(Ctx& c, const replay::LiveBlock& b) {
  if (b.alloc_event < 0 || static_cast<size_t>(b.alloc_event) >= c.alloc_at.size())
    return preTraceCategoryOfFlags(c.flagsOf(b.stack));
  int32_t k = c.alloc_at[static_cast<size_t>(b.alloc_event)];
  return k < 0 ? Category::Unknown : c.allocs[static_cast<size_t>(k)].category;
}

std::string pct(uint64_t part, uint64_t whole) {
  if (whole == 0) return "0%";
  char b[16];
  std::snprintf(b, sizeof b, "%.0f%%",
                100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return b;
}

// ---------------------------------------------------------------------------------------------
// Detectors

void detectOom(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  const ModelFacts& model = c.facts.model;
  for (size_t k = 0; k < c.summary.ooms.size(); ++k) {
    const replay::OomEvent& oom = c.summary.ooms[k];
    const MomentFacts* m = c.facts.at(oom.event);
    const replay::Counters& at = m != nullptr ? m->at : oom.at;
    const bool have_live = m != nullptr && m->has_live;
    uint64_t cached_free = at.reserved > at.active() ? at.reserved - at.active() : 0;
    CategoryBytes cat;
    if (have_live) {
      m->live.forEach([&](uint64_t, const replay::LiveBlock& b) {
        if (!b.pending) cat.bytes[static_cast<size_t>(categoryOfLive(c, b))] += b.requested;
      });
    }
    Finding f;
    f.kind = FindingKind::OomVerdict;
    f.severity = FindingSeverity::High;
    f.device = c.device;
    f.bytes = oom.request_bytes;
    f.basis = c.basis.empty() ? "replayed allocator state at the OOM" : c.basis;
    // The verdict: what the failed request ran into. The block layout (allocator model) says
    // whether the request's pool and stream had the bytes but not in one block; it is called exact
    // only when the model reproduced the whole device (ModelFacts::layout_exact), else an estimate
    // with the reason. Without a layout (past opt.layout_ooms) the cached free bytes of the whole
    // device are the guide.
    std::string verdict;
    std::optional<OomVerdict> layout;
    if (k < opt.layout_ooms && m != nullptr && m->has_layout)
      layout = oomVerdictAt(c.s, c.facts, *m);
    const bool exact = layout && model.layout_exact;
    bool fragmentation = layout ? layout->fragmentation : oom.request_bytes <= cached_free;
    if (fragmentation) {
      verdict = layout ? std::string(exact ? "" : "by the allocator model's estimate, ") + "the " +
                             layout->pool + " pool of this stream had " +
                             formatBytes(layout->pool_free) +
                             " free, but its largest free block was " +
                             formatBytes(layout->pool_largest) + ": fragmentation"
                       : "the request fits into the " + formatBytes(cached_free) +
                             " the allocator holds cached but free, yet no single cached block was "
                             "large enough: fragmentation";
      f.fix =
          "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb) so that "
          "freed space "
          "can be reused for large requests; allocate the largest long-lived tensors first";
    } else {
      verdict = "live allocations held " + formatBytes(at.allocated) + " of " +
                formatBytes(at.reserved) + " reserved, and the device had " +
                formatBytes(oom.device_free) + " free";
      f.fix =
          "reduce what is live at this point (batch size, activation checkpointing, freeing "
          "tensors that are "
          "no longer needed) or the size of this request";
    }
    if (layout) {
      f.evidence.push_back({exact ? "free in the request's pool and stream (exact block layout)"
                                  : "free in the request's pool and stream (estimate: " +
                                        model.estimate_reason + ")",
                            -1,
                            -1,
                            layout->pool_free,
                            {}});
      f.evidence.push_back(
          {exact ? "largest free block there" : "largest free block there (estimate)",
           -1,
           -1,
           layout->pool_largest,
           {}});
    }
    f.title = "OOM at event " + std::to_string(oom.event) + ": a request of " +
              formatBytes(oom.request_bytes) + " failed; " + verdict;
    f.where = c.frames(oom.stack);
    f.evidence.push_back(
        {"failed request", oom.event, oom.time_us, oom.request_bytes, c.frames(oom.stack)});
    for (size_t j = 0; j < kCategoryCount; ++j) {
      if (cat.bytes[j] == 0) continue;
      f.evidence.push_back(
          {"live " + std::string(categoryName(static_cast<Category>(j))) + " (inferred)",
           -1,
           -1,
           cat.bytes[j],
           {}});
    }
    if (cached_free > 0)
      f.evidence.push_back({"cached but free in reserved segments", -1, -1, cached_free, {}});
    if (at.pending > 0)
      f.evidence.push_back({"freed but pending on another stream", -1, -1, at.pending, {}});
    if (!have_live) {
      f.evidence.push_back({"live set at this OOM not kept (a session copies at most " +
                                std::to_string(kMaxLiveMoments) + " live sets and " +
                                std::to_string(kMaxCopiedBlocks) +
                                " blocks per device): stacks not listed",
                            oom.event,
                            oom.time_us,
                            0,
                            {}});
      out.push_back(std::move(f));
      continue;
    }
    for (const LiveGroup& g :
         groupLiveByStack(c.s, m->live, PendingBlocks::Exclude, {3, opt.evidence_stacks})) {
      f.evidence.push_back(
          {"live at the OOM from this stack", -1, -1, g.requested_bytes, g.frames});
    }
    // The call graph at the OOM: the call path that holds the most, innermost frame first.
    CallGraphSummary g = buildCallGraph(c.s, m->live, 1);
    if (!g.hot_path.empty()) {
      std::vector<FrameText> path;
      for (auto it = g.hot_path.rbegin(); it != g.hot_path.rend() && path.size() < 8; ++it)
        path.push_back(it->frame);
      f.evidence.push_back(
          {"heaviest call path at the OOM", -1, -1, g.hot_path.back().inclusive_bytes, path});
    }
    out.push_back(std::move(f));
  }
}

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

void detectCacheBloat(Ctx& c, std::vector<Finding>& out) {
  const replay::Peak& pr = c.summary.peak_reserved;
  if (pr.bytes == 0) return;
  // At the end of the run: how much of what the process holds is unused cache.
  const replay::Counters end = c.summary.final_replayed;
  uint64_t unused = end.reserved > end.active() ? end.reserved - end.active() : 0;
  // Worth saying when the cache holds at least half of what is reserved and 256 MiB or more.
  if (unused * 2 < end.reserved || unused < 256 * kMiB) return;
  Finding f;
  f.kind = FindingKind::CacheBloat;
  f.device = c.device;
  f.severity = FindingSeverity::Warning;
  f.bytes = unused;
  f.title = "Cache bloat: at the end " + formatBytes(end.reserved) + " is reserved but only " +
            formatBytes(end.active()) + " is in use (" + pct(unused, end.reserved) +
            " cached and free)";
  f.fix =
      "a transient peak left the cache large: other processes cannot use it. "
      "torch.cuda.empty_cache() after "
      "the peak, or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, returns it";
  f.basis = "replayed reserved and active bytes";
  f.evidence.push_back({"peak reserved", pr.event, pr.time_us, pr.bytes, {}});
  f.evidence.push_back(
      {"in use at the end", static_cast<int64_t>(c.ev.size()) - 1, -1, end.active(), {}});
  // What grew the cache: the allocation that the segment reaching the reserved peak was made for
  // (the first alloc after that segment event), named as the line to look at.
  for (size_t i = static_cast<size_t>(std::max<int64_t>(0, pr.event));
       i < c.ev.size() && i < static_cast<size_t>(pr.event) + 16; ++i) {
    if (c.ev[i].action != Action::Alloc) continue;
    f.where = c.frames(c.ev[i].stack);
    f.evidence.push_back({"the allocation that grew the cache to its peak", static_cast<int64_t>(i),
                          c.ev[i].time_us, c.ev[i].size, c.frames(c.ev[i].stack)});
    break;
  }
  out.push_back(std::move(f));
}

void detectTemporarySpike(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  const replay::Peak& pk = c.summary.peak_requested;
  if (pk.event < 0 || c.ev.empty()) return;
  const MomentFacts* m = c.live(pk.event);
  if (m == nullptr) return;
  // Short-lived: freed within 1% of the trace (at least 8 events) after the peak.
  int64_t window = std::max<int64_t>(8, static_cast<int64_t>(c.ev.size()) / 100);
  uint64_t spike = 0;
  StackGrouper stacks(c.s, {6});
  m->live.forEach([&](uint64_t, const replay::LiveBlock& b) {
    if (b.pending || b.alloc_event < 0) return;
    int32_t k = c.alloc_at[static_cast<size_t>(b.alloc_event)];
    if (k < 0) return;
    const AllocFact& a = c.allocs[static_cast<size_t>(k)];
    if (a.freed < 0 || a.freed - pk.event > window || pk.event - a.event > window) return;
    spike += b.requested;
    stacks.add(b.stack, b.requested, b.size, 1, b.alloc_event);
  });
  // A spike matters when it is a large share of the peak: removing it lowers the peak that much.
  // Training steps normally hold a quarter of their peak in temporaries (backward, optimizer),
  // so only 40% and more counts.
  if (spike * 10 < pk.bytes * 4 || spike < 64 * kMiB) return;
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

}  // namespace

namespace {

std::vector<Finding> runDetectors(Ctx& c, const FindingsOptions& options) {
  // Each detector appends only its own findings and reads nothing another wrote.
  std::vector<Finding> out;
  detectOom(c, out, options);
  detectGrowth(c, out, options);
  detectOptimizerBloat(c, out, options);
  detectCacheBloat(c, out);
  detectTemporarySpike(c, out, options);
  detectPendingFree(c, out, options);
  // A replay that cannot lead to the file's final state spoils the start state, the peaks and
  // the layout every detector reads: no finding presents its figures as exact then.
  if (c.summary.untrusted != 0) {
    std::string names;
    for (auto n : replay::untrustedNames(c.summary.untrusted))
      names += (names.empty() ? "" : ", ") + std::string(n);
    for (Finding& f : out) {
      f.basis += (f.basis.empty() ? "" : "; ") +
                 std::string(
                     "estimate: the trace cannot lead to the file's final state (not "
                     "exact: ") +
                 names + ")";
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Finding& a, const Finding& b) {
    if (a.severity != b.severity) return a.severity > b.severity;
    return a.bytes > b.bytes;
  });
  return out;
}

}  // namespace

std::vector<Finding> findFindings(const format::Snapshot& snap, const DeviceFacts& facts,
                                  const FindingsOptions& options) {
  Ctx c(snap, facts);
  return runDetectors(c, options);
}

std::vector<Finding> findFindings(const format::Snapshot& snap, int64_t device,
                                  const FindingsOptions& options) {
  DeviceSession session(snap, device);
  session.requestFindingMoments(options.layout_ooms);
  const DeviceFacts facts = session.take();
  return findFindings(snap, facts, options);
}

void categorizeAllocations(const format::Snapshot& snap, DeviceFacts& facts) {
  std::vector<Category> cats;
  {
    Ctx c(snap, facts);
    cats.reserve(facts.allocs.size());
    for (const AllocFact& a : facts.allocs) cats.push_back(categorize(c, a));
  }
  for (size_t k = 0; k < cats.size(); ++k) facts.allocs[k].category = cats[k];
}

Category preTraceCategory(const format::Snapshot& snap, format::StackId stack) {
  return preTraceCategoryOfFlags(stackFlags(snap, stack));
}

struct AllocationCategories::Impl {
  DeviceFacts facts;
  std::vector<uint8_t> flags;  // per stack id, 0xff = not computed
};

AllocationCategories::AllocationCategories(const format::Snapshot& snap, int64_t device)
    : snap_(snap), impl_(std::make_unique<Impl>(Impl{eventFacts(snap, device), {}})) {}

AllocationCategories::~AllocationCategories() = default;

Category AllocationCategories::of(int64_t alloc_event, format::StackId stack) {
  const DeviceFacts& f = impl_->facts;
  if (alloc_event < 0 || static_cast<size_t>(alloc_event) >= f.alloc_at.size()) {
    std::vector<uint8_t>& flags = impl_->flags;
    if (stack >= flags.size())
      flags.resize(std::max<size_t>(snap_.stacks.stackCount(), stack + 1), 0xff);
    if (flags[stack] == 0xff) flags[stack] = stackFlags(snap_, stack);
    return preTraceCategoryOfFlags(flags[stack]);
  }
  int32_t k = f.alloc_at[static_cast<size_t>(alloc_event)];
  return k < 0 ? Category::Unknown : f.allocs[static_cast<size_t>(k)].category;
}

}  // namespace memforensics::analysis
