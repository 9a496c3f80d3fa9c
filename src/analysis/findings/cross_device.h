// cross_device.h: findings about a job as a whole, from every device's analysis (device
// imbalance: the same line of code allocates very different sizes on the devices of one job, as
// when DataParallel or the ranks' samplers split the batch unevenly). Rules and thresholds:
// docs/findings.md "Device imbalance".
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "analysis/analyze.h"
#include "format/model/snapshot.h"

namespace memforensics::analysis {

// A line's per-tensor size (LineSizes::max_bytes) on its largest device must be at least this many
// times the size on its smallest device, among the devices where the line allocates...
inline constexpr uint64_t kImbalanceRatio = 2;
// ... and at least this large on the largest device (smaller lines do not move a device's peak).
inline constexpr uint64_t kImbalanceMinBytes = uint64_t{64} << 20;
// Replicas made of small tensors: devices that share a line are uneven when the heaviest one's
// requested peak is at least 3/2 (kImbalancePeakRatio) of the lightest one's and at least
// kImbalancePeakMinBytes above it; the finding names the shared line that differs most.
inline constexpr double kImbalancePeakRatio = 1.5;
inline constexpr uint64_t kImbalancePeakMinBytes = uint64_t{1} << 30;
// Lines named in one imbalance finding's evidence besides the one that differs most.
inline constexpr size_t kImbalanceOtherLines = 3;

// An even split of the batch is offered only when each replica would need at most this share of
// the OOM device's capacity: the figure is an estimate (the mean of what the replicas needed, the
// OOM device's only up to its OOM), so it must fit with room to spare.
inline constexpr double kEvenSplitHeadroom = 0.9;

// An uneven job with an OOM among its replicas: what each of them would need with the batch split
// evenly (the mean of what they needed: a device without an OOM its peak reserved, one with an OOM
// the smallest capacity a replay runs it in, else its capacity plus the short-by), when that fits
// every OOM device among them within kEvenSplitHeadroom.
struct EvenSplit {
  std::vector<int64_t> replicas;     // the devices that share the line the finding names
  std::vector<int64_t> oom_devices;  // those of them whose OOM verdict it answers
  uint64_t each_bytes = 0;           // the estimate per replica
  uint64_t capacity_bytes = 0;       // the smallest capacity among the OOM devices
};

struct JobFindings {
  std::vector<Finding> findings;  // AnalysisResult::job_findings
  std::optional<EvenSplit> even_split;
};

// The job findings of `r`, most severe first: at most one device imbalance finding, which needs
// two devices that share a line (devices that do different work, with no line in common, are not
// compared), and the even split it proposes. Reads only r.devices (line_sizes, summaries, OOMs and
// their verdicts' OomNumbers).
JobFindings crossDeviceFindings(const format::Snapshot& snap, const AnalysisResult& r);

// The OOM verdicts of split.oom_devices whose live tensors fill the card name the even split among
// their smallest changes (first: it removes the cause), and their fix says so.
void addEvenSplit(const EvenSplit& split, AnalysisResult& r);

}  // namespace memforensics::analysis
