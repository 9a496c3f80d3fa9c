// render.h: text and JSON renderings of analysis results. No analysis happens here.
#pragma once

#include <ostream>
#include <string>

#include "analysis/analyze.h"
#include "report/text_layout.h"

namespace memforensics::report {

inline constexpr int kJsonSchemaVersion = 1;

// The terminal report's layout: wrapped to `width` columns (0: not wrapped); a file of more than
// kDetailedDevices devices gets one line per device and the detail of the devices that matter
// (an OOM, a high-severity finding, the headline's device) unless `all_devices`.
inline constexpr size_t kDetailedDevices = 4;
struct TextOptions {
  size_t width = kDefaultTextWidth;
  bool all_devices = false;
};
void renderText(const analysis::AnalysisResult& r, std::ostream& out, const TextOptions& opt = {});
// One JSON document, compact, newline-terminated (so several files form JSON Lines).
void renderJson(const analysis::AnalysisResult& r, std::ostream& out);
std::string renderJsonString(const analysis::AnalysisResult& r);

}  // namespace memforensics::report
