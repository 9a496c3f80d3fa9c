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
#include "analysis/compare/compare.h"
#include "analysis/findings/headline.h"
#include "analysis/session/session.h"
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
  // pass 1 for every device, so that the plan can rank them; then one visit each, over the
  // moments both ask for, which also takes the counters after every event for the devices the
  // report draws (their timelines; requestReportMoments), so that the others never hold them.
  analysis::SessionOptions so;
  const std::vector<int64_t> devices = analysis::selectedDevices(*snap, g_args.device);
  const bool with_baseline = !g_args.baseline.empty();
  // With --baseline this file is profiled as `diff` profiles it (compare.h profileSnapshot), from
  // the same sessions: each is also asked for the live sets at the three peaks the profile reads,
  // after every request of the report (so those keep their places under the sessions' bounds); the
  // device's profile is made from its facts, and the live sets the report did not ask for are
  // taken out again before the report reads them.
  std::vector<analysis::DeviceProfile> profiles;
  std::vector<analysis::DeviceAnalysis> profile_analyses;
  // Sessions built and visited on aopt.threads threads, each visited on the thread that built it;
  // the plan between the two rounds, on this thread, from every device's pass 1.
  auto buildFacts = [&](bool profile_peaks) {
    analysis::ReportPlan plan;
    std::vector<std::vector<int64_t>> extra(devices.size());  // live sets only the profile asked
    std::vector<char> complete(devices.size(), 0);  // profileFactsComplete before the drop
    profiles.assign(profile_peaks ? devices.size() : 0, analysis::DeviceProfile{});
    profile_analyses.assign(profile_peaks ? devices.size() : 0, analysis::DeviceAnalysis{});
    std::vector<analysis::DeviceFacts> facts = analysis::visitSessions(
        *snap, devices, so, aopt.threads,
        [&](const std::vector<const analysis::DeviceFacts*>& pass1) {
          plan = analysis::planReport(pass1, g_args.data);
        },
        [&](size_t i, analysis::DeviceSession& session) {
          const analysis::DeviceFacts& f = session.facts();
          session.requestLive(f.summary.peak_requested.event, analysis::kMomentPeakRequested);
          session.requestFindingMoments(analysis::kLayoutOoms);
          analysis::requestReportMoments(*snap, session, plan, g_args.data);
          if (!profile_peaks) return;
          std::vector<int64_t> wanted = analysis::findingLiveEvents(f);
          for (int64_t e : analysis::reportLiveEvents(*snap, f, plan, g_args.data))
            wanted.push_back(e);
          for (int64_t e : {f.summary.peak_reserved.event, f.summary.peak_allocated.event}) {
            if (std::find(wanted.begin(), wanted.end(), e) == wanted.end()) {
              wanted.push_back(e);
              extra[i].push_back(e);
            }
          }
          analysis::requestProfilePeaks(session);
        },
        [&](size_t i, analysis::DeviceFacts& f) {
          if (!profile_peaks) return;
          complete[i] = analysis::profileFactsComplete(f);
          if (complete[i]) profiles[i] = analysis::profileDevice(*snap, f, &profile_analyses[i]);
          analysis::dropLiveSets(f, extra[i]);
        });
    return std::pair(std::move(facts), profile_peaks && std::find(complete.begin(), complete.end(),
                                                                  0) == complete.end());
  };
  auto [facts, profile_from_facts] = buildFacts(with_baseline);
  if (with_baseline && !profile_from_facts) {
    // A peak's live set was refused (a session's bound), or a moment went over the copy budget,
    // which the extra live sets may have caused: the report's sessions again without them, and
    // the profile from sessions of its own, as `diff` makes it.
    facts.clear();
    facts = buildFacts(false).first;
  }
  std::cerr << "memforensics: computing the timeline, block-map keyframes and call tree...\n";
  analysis::ReportData data = analysis::reportDataOf(*snap, facts, g_args.data);
  if (with_baseline) {
    // The same figures as `diff BASELINE FILE`: both runs profiled as diff does it.
    auto base = loadProfile(g_args.baseline, g_args.device, g_args.salvage);
    if (!base) {
      printError("--baseline: " + base.error().describe());
      return kExitError;
    }
    if (missingDevice(*base, g_args.device)) return kExitUsage;
    setActivity("comparing " + g_args.file + " with " + g_args.baseline);
    analysis::ProfileOptions popt;
    popt.device = g_args.device;
    analysis::RunProfile neu =
        profile_from_facts
            ? analysis::finishProfile(*snap, std::move(profiles), std::move(profile_analyses))
            : analysis::profileSnapshotOn(*snap, popt, aopt.threads);
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
        g_args.file, h.focus_reason, result.devices);
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
