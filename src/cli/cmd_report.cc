// cmd_report.cc: `memforensics report FILE [-o report.html] [--device N] [--keyframes N] ...`.
#include "cli/cmd_report.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "analysis/analyze.h"
#include "analysis/headline.h"
#include "analysis/session.h"
#include "cli/cmd_diff.h"
#include "cli/diagnostics.h"
#include "cli/load_cli.h"
#include "cli/options.h"
#include "cli/output.h"
#include "cli/threads.h"
#include "common/format_bytes.h"
#include "common/text_escape.h"
#include "replay/pass_stats.h"
#include "report/html/report_data.h"
#include "report/html/whatif_data.h"
#include "report/render_html.h"

namespace memforensics::cli {

namespace {

struct ReportArgs {
  std::string file;
  std::string out;
  std::optional<int64_t> device;
  analysis::ReportDataOptions data;
  bool salvage = false;
  std::string baseline;  // --baseline: the diff against that run (issue 14 part 5)
};
ReportArgs g_args;

std::string defaultOutput(const std::string& in) {
  std::string base = in;
  size_t slash = base.find_last_of('/');
  if (slash != std::string::npos) base = base.substr(slash + 1);
  size_t dot = base.find_last_of('.');
  if (dot != std::string::npos && dot > 0) base = base.substr(0, dot);
  return base + ".html";
}

}  // namespace

CLI::App* addReportCommand(CLI::App& app) {
  auto* r = app.add_subcommand(
      "report", "Self-contained HTML report: summary and findings, timeline, block map, call tree");
  r->add_option("FILE", g_args.file, "snapshot file (any supported kind, detected by content)")
      ->required();
  r->add_option(
      "-o,--output", g_args.out,
      "the .html file to write (default: FILE's name with .html, in this directory; - = stdout)");
  r->add_option("--device", g_args.device, "only this CUDA device ordinal")->check(kInt64Option);
  r->add_option("--max-points", g_args.data.max_points,
                "timeline buckets per device (min/max kept per bucket)")
      ->check(CLI::Range(size_t{16}, size_t{20000}));
  r->add_option("--keyframes", g_args.data.even_keyframes,
                "evenly spaced block-map keyframes per device, besides the peaks and OOMs")
      ->check(CLI::Range(size_t{0}, size_t{400}));
  r->add_option(
       "--max-blocks", g_args.data.max_blocks,
       "blocks drawn in the whole report; beyond it small neighbouring blocks are merged into runs")
      ->check(CLI::Range(size_t{1000}, size_t{400000}));
  r->add_option("--baseline", g_args.baseline,
                "a baseline run: the page shows the diff against it (as `memforensics diff "
                "BASELINE FILE`)");
  r->add_flag("--salvage", g_args.salvage,
              "read the intact part of a native trace that is damaged in the middle");
  addThreadsOption(r);
  return r;
}

int runReportCommand() {
  auto t0 = std::chrono::steady_clock::now();
  // Checked before reading: the default name (FILE's base name with .html, in this directory) can
  // be the input itself (`report snap.html`).
  const std::string out = g_args.out.empty() ? defaultOutput(g_args.file) : g_args.out;
  if (auto same = checkNotAnInput(out, {g_args.file, g_args.baseline}); !same.ok()) {
    printError(same.error().describe());
    return kExitError;
  }
  auto snap = loadWithProgress(g_args.file, g_args.salvage);
  if (!snap) {
    printError(snap.error().describe());
    return kExitError;
  }
  if (g_args.device) {
    bool found = false;
    for (int64_t d : snap->devices()) found |= d == *g_args.device;
    if (!found) {
      printError(g_args.file + " has no device " + std::to_string(*g_args.device));
      return kExitUsage;
    }
  }
  setActivity("building the report of " + g_args.file);
  std::cerr << "memforensics: analysing " << escapeText(g_args.file) << "...\n";
  replay::resetPassStats();
  g_args.data.device = g_args.device;
  analysis::AnalyzeOptions aopt;
  aopt.device = g_args.device;
  aopt.top_frames = 10;
  aopt.threads = analysisThreads();
  // One session per device serves the analysis and the drawings: the backward pass and forward
  // pass 1 (with the counters after every event, for the timeline) for every device, so that the
  // plan can rank them; then one visit each, over the moments both ask for.
  analysis::SessionOptions so;
  so.series = true;
  std::vector<std::unique_ptr<analysis::DeviceSession>> sessions;
  std::vector<const analysis::DeviceFacts*> pass1;
  for (int64_t d : snap->devices()) {
    if (g_args.device && *g_args.device != d) continue;
    sessions.push_back(std::make_unique<analysis::DeviceSession>(*snap, d, so));
    pass1.push_back(&sessions.back()->facts());
  }
  const analysis::ReportPlan plan = analysis::planReport(pass1, g_args.data);
  std::vector<analysis::DeviceFacts> facts;
  for (auto& session : sessions) {
    session->requestLive(session->facts().summary.peak_requested.event,
                         analysis::kMomentPeakRequested);
    session->requestFindingMoments(analysis::kLayoutOoms);
    analysis::requestReportMoments(*snap, *session, plan, g_args.data);
    session->visit();
    facts.push_back(session->take());
    session.reset();
  }
  std::cerr << "memforensics: computing the timeline, block-map keyframes and call tree...\n";
  analysis::ReportData data = analysis::reportDataOf(*snap, facts, g_args.data);
  if (!g_args.baseline.empty()) {
    // The same figures as `diff BASELINE FILE`: both runs profiled as diff does it (this file
    // once more: its sessions above served the drawings).
    auto base = loadProfile(g_args.baseline, g_args.device, g_args.salvage);
    if (!base) {
      printError("--baseline: " + base.error().describe());
      return kExitError;
    }
    setActivity("comparing " + g_args.file + " with " + g_args.baseline);
    analysis::ProfileOptions popt;
    popt.device = g_args.device;
    analysis::RunProfile neu = analysis::profileSnapshot(*snap, popt);
    neu.path = g_args.file;
    data.baseline_diff = analysis::diffProfiles(*base, neu);
  }
  analysis::AnalysisResult result = analysis::analysisHeader(*snap);
  result.path = g_args.file;
  result.devices = analysis::analyzeDevices(*snap, std::move(facts), aopt);
  facts.clear();
  // Findings about the job as a whole (device imbalance), as analyze has them: the headline and
  // the cross-device table show them.
  analysis::finishAnalysis(*snap, result, aopt);
  {
    setActivity("what-if simulations of " + g_args.file);
    const analysis::Headline h = analysis::buildHeadline(result);  // the focus device
    data.whatif = report::buildWhatIfPanel(
        *snap, h.focus_device >= 0 ? std::optional<int64_t>(h.focus_device) : g_args.device,
        g_args.file, h.focus_reason);
  }
  if (replay::passStatsRequested())
    std::cerr << "memforensics: passes (" << escapeText(g_args.file)
              << "): " << replay::describePassStats() << "\n";
  // The page must stay under report::kReportPageBytes whatever the input: the data's own bounds
  // keep it there in practice; should a file still overflow them (say, tens of thousands of
  // segments with long frame names), renderHtmlWithin halves the bounds on the data already
  // built, then drops sections, and the page says so.
  std::vector<std::string> page_notes;  // what the page's own bounds cut
  std::string page = report::renderHtmlWithin(result, data, report::kReportPageBytes, &page_notes);
  data.caps.insert(data.caps.end(), page_notes.begin(), page_notes.end());

  setActivity("writing " + out);
  const uint64_t bytes = page.size();
  Status s = writeOutput(out, [&](std::ostream& o) -> Status {
    o << page;
    return Status::Ok();
  });
  if (!s.ok()) {
    printError(s.error().describe());
    return kExitError;
  }
  size_t keyframes = 0;
  for (const auto& d : data.devices) keyframes += d.keyframes.size();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (out != "-") {
    char secs_text[32];
    std::snprintf(secs_text, sizeof secs_text, "%.2f", secs);
    std::cerr << "memforensics: wrote " << escapeText(out) << " (" << formatBytes(bytes) << ") for "
              << data.devices.size() << " device(s), " << keyframes << " block-map keyframes, in "
              << secs_text << " s\n";
    for (const auto& c : data.caps) std::cerr << "memforensics: note: " << escapeText(c) << "\n";
  }
  return kExitOk;
}

}  // namespace memforensics::cli
