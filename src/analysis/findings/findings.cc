// findings.cc: see findings.h; the rules are explained in docs/findings.md. The detectors live in
// detect_*.cc (findings_ctx.h), the category rules in categories.cc.
#include "analysis/findings/findings.h"

#include <algorithm>

#include "analysis/findings/findings_ctx.h"

namespace memforensics::analysis {

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

namespace {

constexpr FindingKindInfo kFindingKinds[] = {
#define MEMF_X(name, id, lo, hi, anchor, file) \
  {id, FindingSeverity::lo, FindingSeverity::hi, anchor, file},
    MEMF_FINDING_KINDS(MEMF_X)
#undef MEMF_X
};

}  // namespace

std::span<const FindingKindInfo> findingKinds() {
  return kFindingKinds;
}

const FindingKindInfo& findingKindInfo(FindingKind k) {
  return kFindingKinds[static_cast<size_t>(k)];
}

std::string_view findingKindId(FindingKind k) {
  return findingKindInfo(k).id;
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

std::vector<int64_t> detail::otherDeviceOomTimes(const format::Snapshot& s, int64_t device) {
  std::vector<int64_t> out;
  for (const format::OomRef& o : s.ooms) {
    if (o.device != device && o.time_us >= 0) out.push_back(o.time_us);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<double> detail::requestedLevels(const Ctx& c, int64_t lo, int64_t hi) {
  lo = std::max<int64_t>(lo, 0);
  hi = std::min<int64_t>(hi, static_cast<int64_t>(c.ev.size()) - 1);
  if (hi < lo) return {};
  std::vector<double> level(static_cast<size_t>(hi - lo + 1), 0.0);
  for (const AllocFact& a : c.allocs) {
    const auto r = static_cast<double>(a.requested);
    if (a.event >= lo && a.event <= hi) level[static_cast<size_t>(a.event - lo)] += r;
    if (a.freed >= lo && a.freed <= hi) level[static_cast<size_t>(a.freed - lo)] -= r;
  }
  double run = 0;
  for (double& v : level) v = run += v;
  return level;
}

namespace {

using namespace detail;

std::vector<Finding> runDetectors(Ctx& c, const FindingsOptions& options) {
  // Each detector appends only its own findings and reads nothing another wrote.
  std::vector<Finding> out;
  detectOom(c, out, options);
  detectGrowth(c, out, options);
  detectOptimizerBloat(c, out, options);
  detectCacheBloat(c, out, options);
  detectAllocatorSetting(c, out, options);
  detectTemporarySpike(c, out, options);
  detectPendingFree(c, out, options);
  detectActivationAdvice(c, out, options);
  detectIncompleteHistory(c, out);
  // A replay that cannot lead to the file's final state spoils the start state, the peaks and
  // the layout every detector reads: no finding presents its figures as exact then.
  if (c.summary.untrusted != 0) {
    const std::string why =
        replay::describeUntrusted(c.summary.untrusted_cause, c.summary.untrusted, ", ");
    for (Finding& f : out)
      f.basis += (f.basis.empty() ? "" : "; ") + std::string("estimate: ") + why;
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

}  // namespace memforensics::analysis
