// json_analysis.h: the `analyze --json` document as an nlohmann::json value, for renderers inside
// report/ that embed it (the HTML report shows exactly the numbers `analyze --json` prints).
#pragma once
#include <nlohmann/json.hpp>

#include "analysis/analyze.h"

namespace memforensics::report {

nlohmann::json analysisJson(const analysis::AnalysisResult& r);

}  // namespace memforensics::report
