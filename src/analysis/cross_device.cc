// cross_device.cc: see cross_device.h.
#include "analysis/cross_device.h"

namespace memforensics::analysis {

std::vector<Finding> crossDeviceFindings(const format::Snapshot&, const AnalysisResult&) {
  return {};
}

}  // namespace memforensics::analysis
