// headline.cc: see headline.h.
#include "analysis/headline.h"

#include <algorithm>
#include <limits>

namespace memforensics::analysis {

namespace {

std::string deviceName(int64_t d) {
  return "cuda:" + std::to_string(d);
}

}  // namespace

Headline buildHeadline(const AnalysisResult& result) {
  Headline h;
  if (result.devices.empty()) return h;
  // OOM first: the earliest OOM (by time when both have one, else by event order per device).
  const DeviceAnalysis* oom_dev = nullptr;
  int64_t best_time = std::numeric_limits<int64_t>::max();
  for (const DeviceAnalysis& d : result.devices) {
    if (d.summary.ooms.empty()) continue;
    int64_t t = d.summary.ooms.front().time_us;
    if (t < 0) t = std::numeric_limits<int64_t>::max() - 1;
    if (oom_dev == nullptr || t < best_time) {
      oom_dev = &d;
      best_time = t;
    }
  }
  if (oom_dev != nullptr) {
    h.focus_device = oom_dev->summary.device;
    h.focus_reason = "the OOM is on " + deviceName(h.focus_device);
  } else {
    const DeviceAnalysis* worst = nullptr;
    const Finding* worst_f = nullptr;
    for (const DeviceAnalysis& d : result.devices) {
      for (const Finding& f : d.findings) {
        if (worst_f == nullptr || f.severity > worst_f->severity ||
            (f.severity == worst_f->severity && f.bytes > worst_f->bytes)) {
          worst = &d;
          worst_f = &f;
        }
      }
    }
    if (worst != nullptr) {
      h.focus_device = worst->summary.device;
      h.focus_reason = "the most severe finding is on " + deviceName(h.focus_device);
    } else {
      h.focus_device = result.devices.front().summary.device;
      h.focus_reason = "no OOM and no finding: the first device";
    }
  }
  auto add = [&](const Finding& f) {
    if (f.kind != FindingKind::OomVerdict && f.severity != FindingSeverity::High) return;
    h.items.push_back({f.device, f.kind, f.severity, f.title, f.bytes, f.where});
  };
  for (const DeviceAnalysis& d : result.devices)
    for (const Finding& f : d.findings) add(f);
  for (const Finding& f : result.job_findings) add(f);
  std::stable_sort(
      h.items.begin(), h.items.end(), [](const HeadlineItem& a, const HeadlineItem& b) {
        bool ao = a.kind == FindingKind::OomVerdict, bo = b.kind == FindingKind::OomVerdict;
        if (ao != bo) return ao;
        if (a.severity != b.severity) return a.severity > b.severity;
        return a.bytes > b.bytes;
      });
  return h;
}

std::optional<int64_t> oomFocusDevice(const format::Snapshot& snap) {
  std::optional<int64_t> best;
  int64_t best_time = std::numeric_limits<int64_t>::max();
  for (int64_t d : snap.devices()) {
    if (d < 0) continue;
    for (const format::Event& e : snap.trace(static_cast<size_t>(d))) {
      if (e.action != format::Action::Oom) continue;
      int64_t t = e.time_us < 0 ? std::numeric_limits<int64_t>::max() - 1 : e.time_us;
      if (!best || t < best_time) {
        best = d;
        best_time = t;
      }
      break;
    }
  }
  return best;
}

}  // namespace memforensics::analysis
