// cmd_timeline.cc: `memforensics timeline FILE [--device N] [--csv|--json] [--max-points N]`.
#include "cli/cmd_timeline.h"

#include <algorithm>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "analysis/analyze.h"
#include "analysis/findings/headline.h"
#include "analysis/session/timeline.h"
#include "cli/diagnostics.h"
#include "cli/load_cli.h"
#include "cli/options.h"
#include "cli/threads.h"
#include "format/load/load.h"
#include "replay/pass_stats.h"
#include "report/render_timeline.h"

namespace memforensics::cli {

namespace {

struct TimelineArgs {
  std::string file;
  std::optional<int64_t> device;
  bool csv = false;
  bool json = false;
  size_t max_points = 2000;
  bool salvage = false;
};
TimelineArgs g_args;

}  // namespace

CLI::App* addTimelineCommand(CLI::App& app) {
  auto* tl = app.add_subcommand(
      "timeline",
      "Watermark series (reserved, allocated, requested, pending-free) with peaks and phases");
  tl->add_option("FILE", g_args.file, "snapshot file (any supported kind, detected by content)")
      ->required();
  tl->add_option("--device", g_args.device, "only this CUDA device ordinal")->check(kInt64Option);
  auto* csv = tl->add_flag(
      "--csv", g_args.csv,
      "one CSV row per kept point: device,event,time_us,reserved,allocated,requested,pending_free");
  auto* json = tl->add_flag("--json", g_args.json, "one JSON document (schema in docs/cli.md)");
  csv->excludes(json);
  tl->add_option("--max-points", g_args.max_points,
                 "downsample each device's series to this many buckets (min/max kept per bucket)")
      ->check(CLI::Range(size_t{1}, size_t{100000000}));
  tl->add_flag("--salvage", g_args.salvage,
               "read the intact part of a native trace that is damaged in the middle");
  addThreadsOption(tl);
  return tl;
}

int runTimelineCommand() {
  auto snap = loadWithProgress(g_args.file, g_args.salvage);
  if (!snap) {
    printError(snap.error().describe());
    return kExitError;
  }
  setActivity("computing the timeline of " + g_args.file);
  replay::resetPassStats();
  analysis::TimelineOptions opt;
  opt.device = g_args.device;
  opt.max_points = g_args.max_points;
  auto result = analysis::computeTimelineOn(*snap, opt, analysisThreads());
  if (replay::passStatsRequested())
    std::cerr << "memforensics: passes (" << g_args.file << "): " << replay::describePassStats()
              << "\n";
  result.path = g_args.file;
  if (g_args.device && result.devices.empty()) {
    // The argument does not match the file: bad usage, as blocks and report.
    printError(g_args.file + " has no device " + std::to_string(*g_args.device));
    return kExitUsage;
  }
  setActivity("writing the timeline of " + g_args.file);
  if (g_args.json) {
    report::renderTimelineJson(result, std::cout);
  } else if (g_args.csv) {
    report::renderTimelineCsv(result, std::cout);
  } else if (g_args.device || result.devices.size() < 2 || !analysis::oomFocusDevice(*snap)) {
    report::renderTimelineText(result, std::cout);
  } else {
    // OOM first (analysis/findings/headline.h): the device with the OOM leads the text, and says so
    // under the first line (the file's path). CSV and JSON keep device order.
    const int64_t focus = *analysis::oomFocusDevice(*snap);
    std::stable_partition(result.devices.begin(), result.devices.end(),
                          [&](const analysis::DeviceTimeline& d) { return d.device == focus; });
    std::ostringstream text;
    report::renderTimelineText(result, text);
    std::string t = text.str();
    const size_t nl = t.find('\n');
    const std::string note = "showing cuda:" + std::to_string(focus) +
                             " first (the OOM is on cuda:" + std::to_string(focus) +
                             "; --device N for one device)\n";
    t.insert(nl == std::string::npos ? 0 : nl + 1, note);
    std::cout << t;
  }
  return kExitOk;
}

}  // namespace memforensics::cli
