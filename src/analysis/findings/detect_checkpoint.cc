// detect_checkpoint.cc: what a run's activations could give back (docs/findings.md). Activations
// held for a backward dominate the requested peak: an estimate of how much checkpointing the
// repeated modules (grouped by the forward frames that call them) would lower it. Activations
// freed with no backward pass between their allocation and their free (a forward run with
// autograd on): an estimate of how much torch.no_grad() / inference_mode() would lower it.
#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

#include "analysis/findings/findings_ctx.h"
#include "analysis/frames/stack_groups.h"
#include "common/format_bytes.h"
#include "common/saturating.h"

namespace memforensics::analysis::detail {

using format::FrameId;
using format::StackId;

// Fires when activations held for backward are at least this share of the requested peak, and
// the estimated saving reaches the severity policy's warning floor (warningFloor: 5% of the peak
// and 256 MiB): a clean training step of a small model holds about a third of its peak in
// activations (the scenario corpus: 32%), where checkpointing buys little for the recomputation
// it costs.
inline constexpr double kCheckpointMinShare = 0.5;
// Depth of forward frames searched for a repeated call site (a stack deeper than this in module
// calls is grouped at this depth).
inline constexpr size_t kCheckpointMaxDepth = 32;

namespace {

struct Held {
  StackId stack;
  uint64_t bytes;
  std::vector<FrameId> chain;  // the stack's `forward` frames, outermost first
  size_t alloc = 0;            // its index in Ctx::allocs
};

// A repeated module call site: the frame, how many calls (instances) its activations show, the
// bytes they hold, and checkpointing it in segments of `segment` consecutive calls: each segment
// keeps its input, and backward recomputes one segment's activations at a time.
struct Site {
  FrameId frame;
  size_t calls = 0;
  uint64_t held = 0;
  uint64_t input = 0;  // estimated input size of one instance
  size_t segment = 1;  // calls per checkpointed segment (1: each call on its own)
  uint64_t perCall() const { return calls == 0 ? 0 : held / calls; }
  size_t segments(size_t k) const { return (calls + k - 1) / k; }
  size_t segments() const { return segments(segment); }
  uint64_t kept(size_t k) const { return mulSat(segments(k), input); }
  uint64_t recompute(size_t k) const { return mulSat(k, perCall()); }
  // What the checkpointed site no longer holds, before backward recomputes a segment.
  uint64_t saving() const { return subSat(held, kept(segment)); }
  uint64_t recompute() const { return recompute(segment); }
  // The segment length that keeps least: each call alone when a call holds much more than its
  // input (a transformer block), about sqrt(calls) when it holds little more (a stack of layers
  // that each keep only their output, which per-call checkpointing cannot lower:
  // torch.utils.checkpoint.checkpoint_sequential).
  void chooseSegment() {
    uint64_t best = addSat(kept(1), recompute(1));
    for (size_t k = 2; k <= calls; ++k) {
      const uint64_t cost = addSat(kept(k), recompute(k));
      if (cost < best) {
        best = cost;
        segment = k;
      }
    }
  }
};

// Groups `items` (in allocation order) by their forward frame at `depth`. In a group, the calls
// are counted by its first activation (each call of a module makes it once: the same stack and
// size); a group whose first activation repeats is a site of that many calls. One call's input is
// the previous call's output, i.e. the last activation the first call made; unless the caller made
// an allocation between the first two calls that it still holds at the peak (a loop feeding each
// call its own input, as micro-batches): then checkpointing keeps nothing the caller does not keep
// already, and the calls are not a chain to cut in segments. A group that does not repeat is split
// at the next depth. `by_caller[k]`: how many of the device's first k allocations are such.
void findSites(const std::vector<const Held*>& items, size_t depth,
               const std::vector<uint32_t>& by_caller, std::vector<Site>& out) {
  std::map<FrameId, std::vector<const Held*>> groups;
  for (const Held* h : items) {
    if (depth < h->chain.size()) groups[h->chain[depth]].push_back(h);
  }
  for (auto& [frame, g] : groups) {
    size_t calls = 0, second = 0;
    uint64_t held = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      held += g[i]->bytes;
      if (g[i]->stack == g[0]->stack && g[i]->bytes == g[0]->bytes) {
        if (++calls == 2) second = i;
      }
    }
    if (calls >= 2) {
      const bool fed = by_caller[g[second]->alloc] > by_caller[g[0]->alloc + 1];
      out.push_back({frame, calls, held, fed ? 0 : g[second - 1]->bytes});
      out.back().chooseSegment();
    } else if (depth + 1 < kCheckpointMaxDepth) {
      findSites(g, depth + 1, by_caller, out);
    }
  }
}

// Which activations a backward pass released. A backward allocates (gradients, their
// temporaries) through the autograd engine, so an activation freed with no such allocation between
// its own and its free was released without one: autograd kept it for a backward that never ran
// (the graph went when its output did). Activations an OOM's unwind freed, on this device or
// (by time) on another device of the job, say nothing of the kind and are left out.
class Releases {
 public:
  explicit Releases(Ctx& c) : c_(c), backward_(c.ev.size() + 1, 0), ooms_(oomsOf(c.s, c.device)) {
    // backward_[i]: autograd allocations among the events before i.
    for (size_t i = 0; i < c.ev.size(); ++i) {
      const int32_t k = c.alloc_at[i];
      const bool bwd =
          k >= 0 && (c.flagsOf(c.allocs[static_cast<size_t>(k)].stack) & kAutograd) != 0;
      backward_[i + 1] = backward_[i] + (bwd ? 1 : 0);
    }
  }
  // Freed in the trace with no backward allocation between its allocation and its free, and not by
  // an OOM's unwind.
  bool withoutBackward(const AllocFact& a) const {
    if (a.freed < 0 || a.category != Category::Activation) return false;
    const auto made = static_cast<size_t>(a.event), freed = static_cast<size_t>(a.freed);
    return backward_[freed] == backward_[made + 1] && !aliveAtAnOom(c_, a, ooms_);
  }

 private:
  const Ctx& c_;
  std::vector<uint32_t> backward_;
  Ooms ooms_;
};

void checkpointing(Ctx& c, const Releases& releases, std::vector<Finding>& out,
                   const FindingsOptions& opt) {
  const replay::Peak& pk = c.summary.peak_requested;
  if (pk.event < 0 || pk.bytes == 0) return;
  // Held for backward: activations alive at the peak that are released within their step (not
  // retained past it, not kept for good: those are the retention and leak rules).
  const bool steps = !c.iters.empty() && iterationsAreTrainingSteps(c);
  const StepEnds ends(c);
  std::vector<Held> held;
  uint64_t held_bytes = 0;
  // Per stack: its `forward` frames (outermost first), and whether Python code outside every
  // module's forward made it (the caller: a training loop).
  std::unordered_map<StackId, std::pair<std::vector<FrameId>, bool>> chains;
  auto chainOf = [&](StackId stack) -> const std::pair<std::vector<FrameId>, bool>& {
    auto it = chains.find(stack);
    if (it != chains.end()) return it->second;
    std::vector<FrameId> chain;
    bool python = false;
    if (stack != format::kNoStack && stack != format::kEmptyStack) {
      for (FrameId id : c.s.stacks.stack(stack)) {
        const format::Frame& f = c.s.stacks.frame(id);
        const bool py = isPythonFile(c.s.strings.get(f.filename));
        python = python || py;
        if (py && c.s.strings.get(f.name) == "forward") chain.push_back(id);
      }
      std::reverse(chain.begin(), chain.end());
    }
    const bool by_caller = python && chain.empty();
    return chains.emplace(stack, std::make_pair(std::move(chain), by_caller)).first->second;
  };
  // by_caller[k]: how many of the first k allocations (to the peak) the caller made and still
  // holds at the peak (a call's input; a temporary of the loop or of another thread is none).
  std::vector<uint32_t> by_caller(1, 0);
  for (size_t k = 0; k < c.allocs.size(); ++k) {
    const AllocFact& a = c.allocs[k];
    if (a.event > pk.event) break;
    const bool alive = a.freed < 0 || a.freed > pk.event;
    by_caller.push_back(by_caller.back() + (alive && chainOf(a.stack).second ? 1 : 0));
    if (!alive) continue;
    if (a.category != Category::Activation) continue;
    // Released without a backward: no_grad's finding, not checkpointing's (nothing to recompute).
    if (releases.withoutBackward(a)) continue;
    if (steps && a.iteration >= 0) {
      const int64_t end = ends.of(a);
      if (a.freed < 0 || (end >= 0 && a.freed > end)) continue;
    }
    held.push_back({a.stack, a.requested, chainOf(a.stack).first, k});
    held_bytes += a.requested;
  }
  if (static_cast<double>(held_bytes) < kCheckpointMinShare * static_cast<double>(pk.bytes)) return;
  std::vector<const Held*> items;
  items.reserve(held.size());
  for (const Held& h : held) items.push_back(&h);
  std::vector<Site> sites;
  findSites(items, 0, by_caller, sites);
  // The estimate: checkpointing every repeated module (in its best segments) keeps only each
  // segment's input; backward recomputes one segment at a time, which holds its activations again.
  uint64_t keep_all = 0, recompute = 0;
  bool recompute_segment = false;  // the largest recompute is a segment of calls, not one call
  for (const Site& s : sites) {
    keep_all = addSat(keep_all, s.saving());
    if (s.recompute() > recompute) {
      recompute = s.recompute();
      recompute_segment = s.segment > 1;
    }
  }
  const uint64_t saving = keep_all > recompute ? keep_all - recompute : 0;
  if (saving < warningFloor(pk.bytes)) return;
  std::sort(sites.begin(), sites.end(), [](const Site& a, const Site& b) {
    if (a.saving() != b.saving()) return a.saving() > b.saving();
    return a.frame < b.frame;
  });
  Finding f;
  f.kind = FindingKind::ActivationCheckpointing;
  f.device = c.device;
  f.severity = FindingSeverity::Warning;
  f.bytes = saving;
  const Site& top = sites.front();
  const std::string in_segments =
      top.segment > 1
          ? " in " + std::to_string(top.segments()) + " segments of " + std::to_string(top.segment)
          : "";
  f.title = "Activation checkpointing: activations held for backward are " +
            pct(held_bytes, pk.bytes) + " of the " + formatBytes(pk.bytes) +
            " peak; checkpointing the " + std::to_string(top.calls) + " modules called at " +
            frameText(c.s, top.frame).display() + in_segments +
            (sites.size() > 1 ? " (and " + std::to_string(sites.size() - 1) +
                                    (sites.size() == 2 ? " more site)" : " more sites)")
                              : "") +
            " would lower it by about " + formatBytes(saving) + " (estimate)";
  if (top.segment > 1) {
    f.fix =
        "each of these modules keeps little more than its own input, so checkpointing them one by "
        "one saves nothing: checkpoint them in segments, torch.utils.checkpoint."
        "checkpoint_sequential(modules, " +
        std::to_string(top.segments()) +
        ", x, use_reentrant=False): each segment keeps only its input and backward recomputes "
        "one segment at a time, for about one more forward of compute";
  } else {
    f.fix =
        "wrap each repeated module in torch.utils.checkpoint.checkpoint(module, x, "
        "use_reentrant=False) (or the framework's gradient checkpointing): backward recomputes "
        "its activations instead of keeping them, for about one more forward of compute";
  }
  f.basis = std::string(c.basis.empty() ? "" : c.basis + "; ") +
            (top.segment > 1
                 ? "estimate: each checkpointed segment of calls keeps its input (the previous "
                   "call's last activation), backward recomputes one segment at a time"
             : top.input == 0
                 ? "estimate: each call's input is made by its caller, who keeps it anyway; "
                   "backward recomputes one call at a time"
                 : "estimate: each checkpointed call keeps its input (the previous call's last "
                   "activation), backward recomputes one call at a time");
  f.where = {frameText(c.s, top.frame)};
  f.evidence.push_back({"requested-bytes peak", pk.event, pk.time_us, pk.bytes, {}});
  f.evidence.push_back({"activations held for backward at the peak (inferred)",
                        pk.event,
                        pk.time_us,
                        held_bytes,
                        {}});
  for (size_t k = 0; k < sites.size() && k < opt.evidence_stacks; ++k) {
    const Site& s = sites[k];
    f.evidence.push_back(
        {std::to_string(s.calls) + " calls hold " + formatBytes(s.held) + "; checkpointed" +
             (s.segment > 1 ? " in segments of " + std::to_string(s.segment) : "") +
             (s.input == 0 ? std::string(" one by one (their inputs are the caller's, kept "
                                         "anyway), they would give back")
                           : ", they would keep " + std::to_string(s.segments()) + " x " +
                                 formatBytes(s.input) + " of inputs"),
         -1,
         -1,
         s.saving(),
         {frameText(c.s, s.frame)}});
  }
  // The sites' figures above less what backward holds again: the title's figure.
  if (recompute > 0) {
    const std::string what = recompute_segment ? "segment" : "call";
    f.evidence.push_back({"backward recomputes one " + what +
                              " at a time and holds its activations again meanwhile (" +
                              formatBytes(recompute) + " for the largest " + what +
                              "), so the saving is " + formatBytes(keep_all) + " less that",
                          -1,
                          -1,
                          saving,
                          {}});
  }
  out.push_back(std::move(f));
}

void inferenceWithGrad(Ctx& c, const Releases& releases, std::vector<Finding>& out,
                       const FindingsOptions& opt) {
  const replay::Peak& pk = c.summary.peak_requested;
  if (pk.event < 0 || pk.bytes == 0 || c.ev.empty()) return;
  const auto n = c.ev.size();
  // The activations released without a backward and held at the peak.
  uint64_t held = 0;
  StackGrouper stacks(c.s, {6});
  std::vector<bool> unneeded(c.allocs.size(), false);
  for (size_t k = 0; k < c.allocs.size(); ++k) {
    const AllocFact& a = c.allocs[k];
    if (!releases.withoutBackward(a)) continue;
    unneeded[k] = true;
    if (a.event <= pk.event && a.freed > pk.event) {
      held += a.requested;
      stacks.add(a.stack, a.requested, 0, 1, a.event);
    }
  }
  if (held < warningFloor(pk.bytes)) return;
  // The estimate. Under no_grad a forward frees each intermediate once the next operator has used
  // it: modelled as alive until the next allocation (that operator's output) is made. The requested
  // bytes of the trace's allocations with and without that change, event by event, in double
  // (hostile sizes near 2^64 must not overflow a sum); the saving is the drop of their maximum.
  // Blocks alive before the trace are the same in both and leave the difference alone.
  std::vector<int64_t> next_alloc(n, -1);
  for (size_t i = n; i-- > 0;) {
    if (i + 1 < n)
      next_alloc[i] = c.alloc_at[i + 1] >= 0 ? static_cast<int64_t>(i + 1) : next_alloc[i + 1];
  }
  std::vector<double> nograd(n + 1, 0.0);
  for (size_t k = 0; k < c.allocs.size(); ++k) {
    const AllocFact& a = c.allocs[k];
    const auto made = static_cast<size_t>(a.event);
    size_t end = a.freed < 0 ? n : static_cast<size_t>(a.freed);
    if (unneeded[k] && next_alloc[made] >= 0)
      end = std::min(end, static_cast<size_t>(next_alloc[made]) + 1);
    nograd[made] += static_cast<double>(a.requested);
    nograd[end] -= static_cast<double>(a.requested);
  }
  double level_ng = 0, max_now = 0, max_ng = 0;
  for (double v : requestedLevels(c, 0, static_cast<int64_t>(n) - 1))
    max_now = std::max(max_now, v);
  for (size_t i = 0; i < n; ++i) max_ng = std::max(max_ng, level_ng += nograd[i]);
  const double drop = std::max(0.0, max_now - max_ng);
  const uint64_t saving = drop >= static_cast<double>(held) ? held : static_cast<uint64_t>(drop);
  if (saving < warningFloor(pk.bytes)) return;
  const std::vector<LiveGroup> v = stacks.take();
  Finding f;
  f.kind = FindingKind::InferenceWithGrad;
  f.device = c.device;
  f.severity = FindingSeverity::Warning;
  f.bytes = saving;
  f.where = keptForwardWhere(c, v.front().representative);
  const std::string at = f.where.empty() ? "" : " at " + f.where.front().display();
  f.title = "Forward pass with autograd on and no backward: " + formatBytes(held) + " (" +
            pct(held, pk.bytes) + " of the " + formatBytes(pk.bytes) +
            " peak) are activations kept for a backward that never runs; under "
            "torch.inference_mode()" +
            at + " the peak would drop by about " + formatBytes(saving) + " (estimate)";
  f.fix =
      "run the forward-only code under `with torch.inference_mode():` (or torch.no_grad()): "
      "autograd then keeps nothing for backward and each layer's intermediates are freed as soon "
      "as the next layer has used them; if this run was meant to train, its backward never ran";
  f.basis = std::string(c.basis.empty() ? "" : c.basis + "; ") +
            "activations freed with no backward allocation between their allocation and their "
            "free; estimate: under no_grad each lives until the next allocation is made";
  f.evidence.push_back({"requested-bytes peak", pk.event, pk.time_us, pk.bytes, {}});
  f.evidence.push_back(
      {"activations held at the peak for no backward (inferred)", pk.event, pk.time_us, held, {}});
  for (size_t k = 0; k < v.size() && k < opt.evidence_stacks; ++k) {
    f.evidence.push_back(
        {"kept for no backward, allocated from", -1, -1, v[k].requested_bytes, v[k].frames});
  }
  out.push_back(std::move(f));
}

}  // namespace

void detectActivationAdvice(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  const Releases releases(c);  // which activations a backward released: both rules read it
  checkpointing(c, releases, out, opt);
  inferenceWithGrad(c, releases, out, opt);
}

}  // namespace memforensics::analysis::detail
