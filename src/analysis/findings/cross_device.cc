// cross_device.cc: see cross_device.h.
#include "analysis/findings/cross_device.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "common/format_bytes.h"
#include "common/saturating.h"

namespace memforensics::analysis {

namespace {

std::string deviceName(int64_t d) {
  return "cuda:" + std::to_string(d);
}

// One line's sizes on every device where it allocates, in device order.
struct SharedLine {
  std::string key;  // the line's display text
  std::vector<std::pair<const DeviceAnalysis*, const LineSizes*>> on;
  const DeviceAnalysis* heaviest = nullptr;
  const LineSizes* heaviest_line = nullptr;
  uint64_t max = 0, min = 0;
};

std::vector<const DeviceAnalysis*> replicasOf(const SharedLine& sl) {
  std::vector<const DeviceAnalysis*> out;
  for (const auto& [d, ls] : sl.on) out.push_back(d);
  return out;
}

std::string ratioText(uint64_t max, uint64_t min) {
  if (min == 0) return "";
  const uint64_t whole = max / min;
  if (whole >= 10) return std::to_string(whole) + "x";
  const uint64_t tenths = (max % min) * 10 / min;
  return std::to_string(whole) + "." + std::to_string(tenths) + "x";
}

std::string peaksText(const AnalysisResult& r) {
  std::string peaks;
  for (const DeviceAnalysis& d : r.devices) {
    peaks += (peaks.empty() ? "" : ", ") + deviceName(d.summary.device) + " " +
             formatBytesShort(d.summary.peak_requested.bytes);
    if (!d.summary.ooms.empty()) peaks += " (OOM)";
  }
  return "requested peaks: " + peaks;
}

// An OOM verdict whose conclusion is that live tensors fill the card (detect_oom.cc decides it;
// a known capacity is needed to compare the split with).
bool fillsTheCard(const Finding& f) {
  return f.kind == FindingKind::OomVerdict && f.oom && f.oom->fills_card &&
         f.oom->capacity_bytes > 0;
}

// The first verdict of `d` whose live tensors fill the card, or nullptr.
const Finding* fillVerdict(const DeviceAnalysis& d) {
  for (const Finding& f : d.findings)
    if (fillsTheCard(f)) return &f;
  return nullptr;
}

// See cross_device.h EvenSplit: nullopt when no replica ran out with live tensors filling the card,
// when one that ran out has no figure for what it needed, or when the split would not fit.
std::optional<EvenSplit> evenSplitOf(const std::vector<const DeviceAnalysis*>& replicas) {
  EvenSplit split;
  uint64_t total = 0;
  for (const DeviceAnalysis* d : replicas) {
    split.replicas.push_back(d->summary.device);
    uint64_t need = d->summary.peak_reserved.bytes;
    if (!d->summary.ooms.empty()) {
      const Finding* v = fillVerdict(*d);
      if (v == nullptr) return std::nullopt;
      const OomNumbers& o = *v->oom;
      need = std::max(need, o.smallest_capacity_bytes > 0
                                ? o.smallest_capacity_bytes
                                : addSat(o.capacity_bytes, o.short_by_bytes));
      split.oom_devices.push_back(d->summary.device);
      split.capacity_bytes = split.capacity_bytes == 0
                                 ? o.capacity_bytes
                                 : std::min(split.capacity_bytes, o.capacity_bytes);
    }
    total = addSat(total, need);
  }
  if (split.oom_devices.empty() || replicas.size() < 2) return std::nullopt;
  split.each_bytes = total / replicas.size() + (total % replicas.size() != 0 ? 1 : 0);
  if (static_cast<double>(split.each_bytes) >
      kEvenSplitHeadroom * static_cast<double>(split.capacity_bytes))
    return std::nullopt;
  return split;
}

std::string evenSplitText(const EvenSplit& split) {
  const bool one = split.oom_devices.size() == 1;
  return "an even split of the batch across the " + std::to_string(split.replicas.size()) +
         " replicas: about " + formatBytesShort(split.each_bytes) +
         " each (an estimate: the mean of what they needed, " +
         (one ? deviceName(split.oom_devices.front()) + "'s up to its OOM"
              : std::string("the OOM devices' up to their OOMs")) +
         "), within the " + formatBytesShort(split.capacity_bytes) + " " +
         (one ? deviceName(split.oom_devices.front()) + " had"
              : std::string("the smallest OOM device had"));
}

// The imbalance finding `f` over `replicas` proposes the even split when one fits (after its fix).
std::optional<EvenSplit> proposeEvenSplit(Finding& f,
                                          const std::vector<const DeviceAnalysis*>& replicas) {
  std::optional<EvenSplit> split = evenSplitOf(replicas);
  if (!split) return split;
  f.evidence.push_back({evenSplitText(*split), -1, -1, split->each_bytes, {}});
  f.fix += "; with " + evenSplitText(*split);
  return split;
}

constexpr const char* kImbalanceFix =
    "give every replica the same share of the batch: a batch size divisible by the number of "
    "GPUs and inputs of the same shape on each (pad or bucket variable-length inputs before "
    "the split); with DistributedDataParallel, a DistributedSampler and the same per-rank batch";

// Replicas whose tensors are all small but whose peaks differ: the devices that share a line with
// another are compared by requested peak, and the shared line whose bytes live at the two devices'
// peaks differ most is named.
std::optional<Finding> peakImbalance(const std::map<std::string, SharedLine>& lines,
                                     const AnalysisResult& r, std::optional<EvenSplit>& split) {
  const DeviceAnalysis* hi = nullptr;
  const DeviceAnalysis* lo = nullptr;
  for (const auto& [key, sl] : lines) {
    if (sl.on.size() < 2) continue;
    for (const auto& [d, ls] : sl.on) {
      const uint64_t p = d->summary.peak_requested.bytes;
      if (hi == nullptr || p > hi->summary.peak_requested.bytes) hi = d;
      if (lo == nullptr || p < lo->summary.peak_requested.bytes) lo = d;
    }
  }
  if (hi == nullptr || hi == lo) return std::nullopt;
  const uint64_t ph = hi->summary.peak_requested.bytes, pl = lo->summary.peak_requested.bytes;
  if (ph - pl < kImbalancePeakMinBytes ||
      static_cast<double>(ph) < kImbalancePeakRatio * static_cast<double>(pl))
    return std::nullopt;
  const SharedLine* top = nullptr;
  const LineSizes* top_hi = nullptr;
  const LineSizes* top_lo = nullptr;
  uint64_t top_delta = 0;
  for (const auto& [key, sl] : lines) {
    const LineSizes* on_hi = nullptr;
    const LineSizes* on_lo = nullptr;
    for (const auto& [d, ls] : sl.on) {
      if (d == hi) on_hi = ls;
      if (d == lo) on_lo = ls;
    }
    if (on_hi == nullptr || on_lo == nullptr) continue;
    if (on_hi->live_at_peak_bytes <= on_lo->live_at_peak_bytes) continue;
    const uint64_t delta = on_hi->live_at_peak_bytes - on_lo->live_at_peak_bytes;
    if (delta > top_delta) {
      top_delta = delta;
      top = &sl;
      top_hi = on_hi;
      top_lo = on_lo;
    }
  }
  if (top == nullptr) return std::nullopt;
  Finding f;
  f.kind = FindingKind::DeviceImbalance;
  f.device = hi->summary.device;
  f.severity = hi->summary.ooms.empty() ? FindingSeverity::Warning : FindingSeverity::High;
  f.bytes = top_delta;
  f.title = "device imbalance: " + deviceName(hi->summary.device) + " peaks at " +
            formatBytesShort(ph) + ", " + deviceName(lo->summary.device) + " at " +
            formatBytesShort(pl) + " (" + ratioText(ph, pl) + ") for the same code; " + top->key +
            " holds " + formatBytesShort(top_hi->live_at_peak_bytes) + " at the first's peak, " +
            formatBytesShort(top_lo->live_at_peak_bytes) +
            " at the second's: the batch is likely split unevenly across the DataParallel "
            "replicas or ranks";
  f.where = top_hi->frames;
  for (const auto& [d, ls] : top->on) {
    std::string t = deviceName(d->summary.device);
    if (!d->summary.ooms.empty()) t += " (ran out of memory)";
    t += ": " + std::to_string(ls->allocs) + " allocations from this line, the largest " +
         formatBytesShort(ls->max_bytes) + "; live at the device's peak";
    f.evidence.push_back({std::move(t), -1, -1, ls->live_at_peak_bytes, {}});
  }
  f.evidence.push_back({peaksText(r), -1, -1, 0, {}});
  f.fix = kImbalanceFix;
  split = proposeEvenSplit(f, replicasOf(*top));
  f.basis =
      "cross-device: the requested peaks of the devices that share lines, and each line's bytes "
      "live at its device's peak (the " +
      std::to_string(kLineSizesPerDevice) + " heaviest lines per device)";
  return f;
}

}  // namespace

JobFindings crossDeviceFindings(const format::Snapshot&, const AnalysisResult& r) {
  JobFindings job;
  std::vector<Finding>& out = job.findings;
  if (r.devices.size() < 2) return job;
  std::map<std::string, SharedLine> lines;
  for (const DeviceAnalysis& d : r.devices) {
    for (const LineSizes& ls : d.line_sizes) {
      if (ls.frames.empty() || ls.max_bytes == 0) continue;
      std::string key = ls.frames.front().display();
      SharedLine& sl = lines[key];
      sl.key = key;
      // A line appears once per device (line_sizes is keyed by line); keep the first if not.
      if (!sl.on.empty() && sl.on.back().first == &d) continue;
      sl.on.emplace_back(&d, &ls);
    }
  }
  std::vector<SharedLine> uneven;
  for (auto& [key, sl] : lines) {
    if (sl.on.size() < 2) continue;  // not shared: devices doing different work are not compared
    sl.min = UINT64_MAX;
    for (const auto& [d, ls] : sl.on) {
      if (ls->max_bytes > sl.max) {
        sl.max = ls->max_bytes;
        sl.heaviest = d;
        sl.heaviest_line = ls;
      }
      sl.min = std::min(sl.min, ls->max_bytes);
    }
    if (sl.max < kImbalanceMinBytes) continue;
    if (sl.max / kImbalanceRatio < sl.min) continue;  // sl.max < kImbalanceRatio * sl.min
    uneven.push_back(sl);
  }
  if (uneven.empty()) {
    if (auto f = peakImbalance(lines, r, job.even_split)) out.push_back(std::move(*f));
    return job;
  }
  std::stable_sort(uneven.begin(), uneven.end(), [](const SharedLine& a, const SharedLine& b) {
    return a.max - a.min > b.max - b.min;
  });
  const SharedLine& top = uneven.front();
  Finding f;
  f.kind = FindingKind::DeviceImbalance;
  f.device = top.heaviest->summary.device;
  f.severity =
      top.heaviest->summary.ooms.empty() ? FindingSeverity::Warning : FindingSeverity::High;
  uint64_t live_max = 0, live_min = UINT64_MAX;
  int64_t lightest = -1;
  std::string others;
  for (const auto& [d, ls] : top.on) {
    live_max = std::max(live_max, ls->live_at_peak_bytes);
    if (ls->live_at_peak_bytes < live_min) {
      live_min = ls->live_at_peak_bytes;
      lightest = d->summary.device;
    }
    if (d == top.heaviest) continue;
    others += (others.empty() ? "" : ", ") + formatBytesShort(ls->max_bytes) + " on " +
              deviceName(d->summary.device);
  }
  f.bytes = live_max > live_min ? live_max - live_min : top.max - top.min;
  f.title = "device imbalance: " + top.key + " allocates " + formatBytesShort(top.max) +
            " per tensor on " + deviceName(f.device) + ", " + others + " (" +
            ratioText(top.max, top.min) + ")";
  if (live_max > live_min) {
    f.title += "; " + deviceName(f.device) + " holds " + formatBytesShort(f.bytes) +
               " more from it at its peak than " + deviceName(lightest);
  }
  f.title += ": the batch is likely split unevenly across the DataParallel replicas or ranks";
  f.where = top.heaviest_line->frames;
  for (const auto& [d, ls] : top.on) {
    std::string t = deviceName(d->summary.device);
    if (!d->summary.ooms.empty()) t += " (ran out of memory)";
    t += ": " + std::to_string(ls->allocs) + " allocations from this line, " +
         formatBytesShort(ls->live_at_peak_bytes) +
         " of them live at the device's peak; the largest";
    f.evidence.push_back({std::move(t), -1, -1, ls->max_bytes, {}});
  }
  f.evidence.push_back({peaksText(r), -1, -1, 0, {}});
  for (size_t k = 1; k < uneven.size() && k <= kImbalanceOtherLines; ++k) {
    const SharedLine& o = uneven[k];
    f.evidence.push_back({"also uneven (" + formatBytesShort(o.min) +
                              " per tensor at the least): the largest per tensor, on " +
                              deviceName(o.heaviest->summary.device),
                          -1, -1, o.max, o.heaviest_line->frames});
  }
  f.fix = kImbalanceFix;
  job.even_split = proposeEvenSplit(f, replicasOf(top));
  f.basis =
      "cross-device: the largest single allocation of each line on each device of this "
      "file (the " +
      std::to_string(kLineSizesPerDevice) + " heaviest lines per device)";
  out.push_back(std::move(f));
  return job;
}

void addEvenSplit(const EvenSplit& split, AnalysisResult& r) {
  for (DeviceAnalysis& d : r.devices) {
    if (std::find(split.oom_devices.begin(), split.oom_devices.end(), d.summary.device) ==
        split.oom_devices.end())
      continue;
    for (Finding& f : d.findings) {
      if (!fillsTheCard(f)) continue;
      f.oom->smallest_changes.insert(f.oom->smallest_changes.begin(),
                                     evenSplitText(split) + " (see the device imbalance finding)");
      f.fix = oomChangesFix(f.oom->smallest_changes);
      f.evidence.push_back({"each replica's need with the batch split evenly (estimate)",
                            -1,
                            -1,
                            split.each_bytes,
                            {}});
    }
  }
}

}  // namespace memforensics::analysis
