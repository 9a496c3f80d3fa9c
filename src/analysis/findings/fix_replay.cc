// fix_replay.cc: the replay a finding checks its fix against (findings_ctx.h FixBaseline): the
// device's requests under the file's own settings, on the card the file implies, once per check.
#include <string>

#include "analysis/findings/findings_ctx.h"
#include "common/saturating.h"

namespace memforensics::analysis::detail {

using format::Action;

std::optional<FixBaseline> fixBaseline(const Ctx& c, const FindingsOptions& opt, std::string* why) {
  if (!c.s.has_segment_info) {
    *why = "a profiler trace has no allocator segments to replay";
    return std::nullopt;
  }
  if (opt.fix_replays == 0) {
    *why = "the findings' replays are off";
    return std::nullopt;
  }
  if (c.device < 0 || static_cast<size_t>(c.device) >= c.s.traceCount() || c.ev.empty()) {
    *why = "no request stream for this device";
    return std::nullopt;
  }
  // The replay releases cached segments at each run of recorded segment frees, visiting every
  // segment: a hostile trace of many segments and many such runs would make it quadratic. Past
  // kReplayCheckVisits segment visits the check is not run (the finding says untested).
  uint64_t segments = 0, runs = 0;
  for (size_t i = 0; i < c.ev.size(); ++i) {
    const Action a = c.ev[i].action;
    if (a == Action::SegmentAlloc || a == Action::SegmentMap) ++segments;
    const bool release = a == Action::SegmentFree || a == Action::SegmentUnmap;
    const bool prev = i > 0 && (c.ev[i - 1].action == Action::SegmentFree ||
                                c.ev[i - 1].action == Action::SegmentUnmap);
    runs += release && !prev;
  }
  if (mulSat(segments, runs) > kReplayCheckVisits) {
    *why = "the replay would visit more than " + std::to_string(kReplayCheckVisits) +
           " segments (" + std::to_string(runs) + " release runs over " + std::to_string(segments) +
           " segments)";
    return std::nullopt;
  }
  FixBaseline b;
  b.facts = recordedFacts(c.trace(), c.summary);
  b.conf = replay::allocConfOf(c.s);
  if (!b.facts.complete_history) {
    *why = whatIfEstimateReason(b.facts, b.conf);
    return std::nullopt;
  }
  b.capacity = impliedCapacity(c.trace());
  b.facts.baseline = simulateRequests(c.trace(), b.conf, b.capacity);
  // A replay that fails requests the recording served has left the recording behind: its figures
  // check nothing (a hostile size, a request above kWhatIfMaxRequest).
  if (b.facts.baseline.oom_count > b.facts.recorded_ooms) {
    *why = "a replay under the file's own settings fails requests the recording served";
    return std::nullopt;
  }
  return b;
}

std::string exactLabel(const std::string& reason) {
  return reason.empty() ? std::string("exact") : "an estimate: " + reason;
}

}  // namespace memforensics::analysis::detail
