// cross_device.h: findings about a job as a whole, from every device's analysis (device
// imbalance: the same line of code allocates very different sizes on the devices of one job, as
// when DataParallel or the ranks' samplers split the batch unevenly). Rules and thresholds:
// docs/findings.md "Device imbalance".
#pragma once

#include <cstdint>
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

// The job findings of `r` (AnalysisResult::job_findings), most severe first: at most one device
// imbalance finding, which needs two devices that share a line (devices that do different work,
// with no line in common, are not compared). Reads only r.devices (line_sizes, summaries, OOMs).
std::vector<Finding> crossDeviceFindings(const format::Snapshot& snap, const AnalysisResult& r);

}  // namespace memforensics::analysis
