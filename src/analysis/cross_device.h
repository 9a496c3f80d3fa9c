// cross_device.h: findings about a job as a whole, from every device's analysis (e.g. device
// imbalance: peaks or per-line sizes that differ strongly across the devices of one job).
#pragma once

#include <vector>

#include "analysis/analyze.h"
#include "format/model/snapshot.h"

namespace memforensics::analysis {

// Being written by issue 13's work: returns no finding yet.
std::vector<Finding> crossDeviceFindings(const format::Snapshot& snap, const AnalysisResult& r);

}  // namespace memforensics::analysis
