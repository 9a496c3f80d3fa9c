// detect_checkpoint.cc: the activation-checkpointing opportunity (docs/findings.md): activations
// held for backward dominate the requested peak; an estimate of how much checkpointing the
// repeated modules (grouped by the forward frames that call them) would lower it.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "analysis/findings_ctx.h"
#include "common/format_bytes.h"

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
};

// A repeated module call site: the frame, how many calls (instances) its activations show, the
// bytes they hold and what checkpointing each instance would keep (its input).
struct Site {
  FrameId frame;
  size_t calls = 0;
  uint64_t held = 0;
  uint64_t input = 0;  // estimated input size of one instance
  uint64_t saving() const {
    const uint64_t keep = static_cast<uint64_t>(calls) * input;
    return held > keep ? held - keep : 0;
  }
  uint64_t perCall() const { return calls == 0 ? 0 : held / calls; }
};

// Groups `items` (in allocation order) by their forward frame at `depth`. In a group, the calls
// are counted by its first activation (each call of a module makes it once: the same stack and
// size); a group whose first activation repeats is a site of that many calls. One call's input is
// the previous call's output, i.e. the last activation the first call made. A group that does not
// repeat is split at the next depth.
void findSites(const std::vector<const Held*>& items, size_t depth, std::vector<Site>& out) {
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
      out.push_back({frame, calls, held, g[second - 1]->bytes});
    } else if (depth + 1 < kCheckpointMaxDepth) {
      findSites(g, depth + 1, out);
    }
  }
}

}  // namespace

void detectCheckpointing(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  const replay::Peak& pk = c.summary.peak_requested;
  if (pk.event < 0 || pk.bytes == 0) return;
  // Held for backward: activations alive at the peak that are released within their step (not
  // retained past it, not kept for good: those are the retention and leak rules).
  const bool steps = !c.iters.empty() && iterationsAreTrainingSteps(c);
  const StepEnds ends(c);
  std::vector<Held> held;
  uint64_t held_bytes = 0;
  std::unordered_map<StackId, std::vector<FrameId>> chains;
  for (const AllocFact& a : c.allocs) {
    if (a.event > pk.event) break;
    if (a.freed >= 0 && a.freed <= pk.event) continue;
    if (a.category != Category::Activation) continue;
    if (steps && a.iteration >= 0) {
      const int64_t end = ends.of(a);
      if (a.freed < 0 || (end >= 0 && a.freed > end)) continue;
    }
    auto it = chains.find(a.stack);
    if (it == chains.end()) {
      std::vector<FrameId> chain;
      if (a.stack != format::kNoStack && a.stack != format::kEmptyStack) {
        for (FrameId id : c.s.stacks.stack(a.stack)) {
          const format::Frame& f = c.s.stacks.frame(id);
          if (c.s.strings.get(f.name) == "forward" && isPythonFile(c.s.strings.get(f.filename)))
            chain.push_back(id);
        }
        std::reverse(chain.begin(), chain.end());
      }
      it = chains.emplace(a.stack, std::move(chain)).first;
    }
    held.push_back({a.stack, a.requested, it->second});
    held_bytes += a.requested;
  }
  if (static_cast<double>(held_bytes) < kCheckpointMinShare * static_cast<double>(pk.bytes)) return;
  std::vector<const Held*> items;
  items.reserve(held.size());
  for (const Held& h : held) items.push_back(&h);
  std::vector<Site> sites;
  findSites(items, 0, sites);
  // The estimate: checkpointing every repeated module keeps only each call's input; backward
  // recomputes one call at a time, which holds one call's activations again.
  uint64_t keep_all = 0, recompute = 0;
  for (const Site& s : sites) {
    keep_all += s.saving();
    recompute = std::max(recompute, s.perCall());
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
  f.title = "Activation checkpointing: activations held for backward are " +
            pct(held_bytes, pk.bytes) + " of the " + formatBytes(pk.bytes) +
            " peak; checkpointing the " + std::to_string(top.calls) + " modules called at " +
            frameText(c.s, top.frame).display() +
            (sites.size() > 1 ? " (and " + std::to_string(sites.size() - 1) +
                                    (sites.size() == 2 ? " more site)" : " more sites)")
                              : "") +
            " would lower it by about " + formatBytes(saving) + " (estimate)";
  f.fix =
      "wrap each repeated module in torch.utils.checkpoint.checkpoint(module, x, "
      "use_reentrant=False) (or the framework's gradient checkpointing): backward recomputes its "
      "activations instead of keeping them, for about one more forward of compute";
  f.basis = std::string(c.basis.empty() ? "" : c.basis + "; ") +
            "estimate: each checkpointed call keeps its input (the previous call's last "
            "activation), backward recomputes one call at a time";
  f.where = {frameText(c.s, top.frame)};
  f.evidence.push_back({"requested-bytes peak", pk.event, pk.time_us, pk.bytes, {}});
  f.evidence.push_back({"activations held for backward at the peak (inferred)",
                        pk.event,
                        pk.time_us,
                        held_bytes,
                        {}});
  for (size_t k = 0; k < sites.size() && k < opt.evidence_stacks; ++k) {
    const Site& s = sites[k];
    f.evidence.push_back({std::to_string(s.calls) + " calls hold " + formatBytes(s.held) +
                              "; checkpointed, they would keep " + std::to_string(s.calls) + " x " +
                              formatBytes(s.input) + " of inputs",
                          -1,
                          -1,
                          s.saving(),
                          {frameText(c.s, s.frame)}});
  }
  out.push_back(std::move(f));
}

}  // namespace memforensics::analysis::detail
