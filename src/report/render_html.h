// render_html.h: the self-contained HTML report (`memforensics report`).
//
// One file, no request to any network location: the page (viz/report.html, .css, .js, compiled
// into the binary) plus one JSON document with the analysis (the same document `analyze --json`
// prints) and the bounded drawing data of report/html/report_data.h. Every string from the snapshot
// travels inside that JSON, with <, > and & written as \u escapes so that nothing in it can close
// the script element; the page puts strings into the DOM as text only.
#pragma once
#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "report/html/report_data.h"

namespace memforensics::report {

// Bounds of the page itself, whatever the input (docs/report.md, "Computed in C++, bounded"):
// - every string of the embedded JSON (frame and file names, annotation names, settings, the
//   path; in the drawing data and in the analysis document alike) is cut to kPageStringBytes
//   bytes, at a UTF-8 boundary, and ends with a visible "… [+N bytes]" marker;
// - every list of frames in the analysis document ("frames", "where", "hot_path") keeps its
//   kPageFramesPerList / 2 innermost and outermost entries around one "… N frames omitted" entry;
// - byte counts of the analysis document above 2^53 (JavaScript numbers lose precision there)
//   travel as exact decimal strings, which the page formats as text.
// Each cut is named in the page's notes ("Shown in part"). `analyze --json` is not affected.
constexpr size_t kPageStringBytes = 1024;
constexpr size_t kPageFramesPerList = 48;
// Devices whose analysis the page carries (each is 1-2 KB of JSON at least): the drawn ones, the
// headline's, then the first in file order; the page's notes say how many were left out.
constexpr size_t kPageAnalysisDevices = 1000;
// The page `report` writes stays under this many bytes (the budget is 5 MB; a margin).
constexpr size_t kReportPageBytes = 4'750'000;
// How many times renderHtmlWithin halves the data's bounds (analysis::halveReportData) before it
// drops whole sections.
constexpr size_t kPageHalvings = 4;

void renderHtml(const analysis::AnalysisResult& analysis, const analysis::ReportData& data,
                std::ostream& out);

// The page, at most max_bytes long for any input: rendered as it is when it fits; otherwise the
// data's bounds are halved (analysis::halveReportData, on the data already built: nothing is
// replayed) up to kPageHalvings times until it does, with one note saying what went; then
// sections are dropped in this order until it does, each with a note on the page: evenly spaced
// keyframes, phases beyond 100, call-tree nodes beyond 500 (level 1); every list of the analysis
// document cut to 100 entries and strings to 128 bytes (level 2); the drawings of every device
// (summary and findings stay), lists cut to 10 entries (level 3); lists cut to 1 entry and
// strings to 32 bytes (level 4). Level 4 of a file with a thousand-entry analysis is tens of KB.
// `notes`, when given, receives what the page's own bounds and levels cut (besides data.caps).
std::string renderHtmlWithin(const analysis::AnalysisResult& analysis,
                             const analysis::ReportData& data, size_t max_bytes,
                             std::vector<std::string>* notes = nullptr);

// The JSON document the page reads, escaped for a <script> element (exposed for tests).
std::string htmlDataJson(const analysis::AnalysisResult& analysis,
                         const analysis::ReportData& data);

}  // namespace memforensics::report
