// detect_optimizer.cc: optimizer-state bloat (docs/findings.md "Optimizer-state bloat").
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

void detectOptimizerBloat(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  // Parameter bytes: what is live just before the first iteration (or at the start state) and
  // classified as a parameter; optimizer state: live at the end, classified as optimizer state.
  int64_t before = c.iters.empty() ? -1 : c.iters.front().first_event - 1;
  // Parameters are mostly allocated before the trace: where the start state is not trusted (a
  // final state rebuilt from a trace that starts mid-run has none of them) their bytes are not
  // known, and a ratio over them would be an alarm about nothing.
  if ((c.summary.untrusted & replay::kUntrustedStart) != 0) return;
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

}  // namespace memforensics::analysis::detail
