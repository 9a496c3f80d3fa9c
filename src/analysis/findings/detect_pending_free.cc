// detect_pending_free.cc: blocks freed but waiting for another stream at the active peak
// (docs/findings.md "Pending-free retention").
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
