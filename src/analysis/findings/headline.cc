// headline.cc: see headline.h.
#include "analysis/findings/headline.h"

#include <algorithm>
#include <limits>
#include <tuple>

namespace memforensics::analysis {

namespace {

std::string deviceName(int64_t d) {
  return "cuda:" + std::to_string(d);
}

}  // namespace

bool isHeadlineItem(const Finding& f) {
  const bool history =
      f.kind == FindingKind::IncompleteHistory && f.severity >= FindingSeverity::Warning;
  return f.kind == FindingKind::OomVerdict || history || f.severity == FindingSeverity::High;
}

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
    size_t oom_devices = 0;
    for (const DeviceAnalysis& d : result.devices) oom_devices += d.summary.ooms.empty() ? 0 : 1;
    h.focus_reason = oom_devices > 1 ? "the first OOM is on " + deviceName(h.focus_device) + " (" +
                                           std::to_string(oom_devices) + " devices ran out)"
                                     : "the OOM is on " + deviceName(h.focus_device);
  } else {
    const Finding* worst_f = nullptr;
    // Severity, then a finding about memory before one about the file's history, then bytes.
    auto key = [](const Finding& f) {
      return std::make_tuple(f.severity, f.kind != FindingKind::IncompleteHistory, f.bytes);
    };
    auto consider = [&](const Finding& f) {
      if (worst_f == nullptr || key(f) > key(*worst_f)) worst_f = &f;
    };
    for (const DeviceAnalysis& d : result.devices)
      for (const Finding& f : d.findings) consider(f);
    for (const Finding& f : result.job_findings) {
      // A job finding points at one of the devices (else it cannot choose one).
      for (const DeviceAnalysis& d : result.devices)
        if (d.summary.device == f.device) consider(f);
    }
    if (worst_f != nullptr) {
      h.focus_device = worst_f->device;
      h.focus_reason = "the most severe finding is on " + deviceName(h.focus_device);
    } else {
      h.focus_device = result.devices.front().summary.device;
      h.focus_reason = "no OOM and no finding: the first device";
    }
  }
  auto add = [&](const Finding& f) {
    if (!isHeadlineItem(f)) {
      if (f.severity == FindingSeverity::Warning) ++h.other_warnings;
      return;
    }
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

std::vector<size_t> deviceOrder(const AnalysisResult& result, const Headline& headline) {
  std::vector<size_t> order;
  for (size_t i = 0; i < result.devices.size(); ++i)
    if (result.devices[i].summary.device == headline.focus_device) order.push_back(i);
  for (size_t i = 0; i < result.devices.size(); ++i)
    if (result.devices[i].summary.device != headline.focus_device) order.push_back(i);
  return order;
}

std::string focusNote(int64_t device, const std::string& reason) {
  return deviceName(device) + " (" + reason + "; --device N for another)";
}

std::optional<int64_t> oomFocusDevice(const format::Snapshot& snap) {
  std::optional<int64_t> best;
  int64_t best_time = std::numeric_limits<int64_t>::max();
  // Each device's first OOM (the index lists them by device, then event).
  const std::vector<format::OomRef>& ooms = snap.ooms;
  for (size_t k = 0; k < ooms.size(); ++k) {
    const format::OomRef& o = ooms[k];
    if (k > 0 && ooms[k - 1].device == o.device) continue;
    int64_t t = o.time_us < 0 ? std::numeric_limits<int64_t>::max() - 1 : o.time_us;
    if (!best || t < best_time) {
      best = o.device;
      best_time = t;
    }
  }
  return best;
}

}  // namespace memforensics::analysis
