// render_html.h: the self-contained HTML report (`memforensics report`).
//
// One file, no request to any network location: the page (viz/report.html, .css, .js, compiled
// into the binary) plus one JSON document with the analysis (the same document `analyze --json`
// prints) and the bounded drawing data of analysis/report_data.h. Every string from the snapshot
// travels inside that JSON, with <, > and & written as \u escapes so that nothing in it can close
// the script element; the page puts strings into the DOM as text only.
#pragma once
#include <ostream>
#include <string>

#include "analysis/analyze.h"
#include "analysis/report_data.h"

namespace memforensics::report {

void renderHtml(const analysis::AnalysisResult& analysis, const analysis::ReportData& data, std::ostream& out);

// The JSON document the page reads, escaped for a <script> element (exposed for tests).
std::string htmlDataJson(const analysis::AnalysisResult& analysis, const analysis::ReportData& data);

}  // namespace memforensics::report
