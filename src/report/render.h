// render.h: text and JSON renderings of analysis results. No analysis happens here.
#pragma once

#include <ostream>
#include <string>

#include "analysis/analyze.h"

namespace memforensics::report {

inline constexpr int kJsonSchemaVersion = 1;

void renderText(const analysis::AnalysisResult& r, std::ostream& out);
// One JSON document, compact, newline-terminated (so several files form JSON Lines).
void renderJson(const analysis::AnalysisResult& r, std::ostream& out);
std::string renderJsonString(const analysis::AnalysisResult& r);

}  // namespace memforensics::report
