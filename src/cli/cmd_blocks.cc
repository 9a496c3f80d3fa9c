// cmd_blocks.cc: `memforensics blocks FILE --at peak|oom|EVENT_INDEX|tTIME_US [--device N]
// [--json]`.
#include "cli/cmd_blocks.h"

#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "analysis/findings/headline.h"
#include "analysis/session/blocks.h"
#include "cli/at_option.h"
#include "cli/diagnostics.h"
#include "cli/load_cli.h"
#include "cli/options.h"
#include "format/load/load.h"
#include "replay/pass_stats.h"
#include "report/render_blocks.h"

namespace memforensics::cli {

namespace {

struct BlocksArgs {
  std::string file;
  std::string at = "peak";
  std::optional<int64_t> device;
  bool json = false;
  bool salvage = false;
};
BlocksArgs g_args;

}  // namespace

CLI::App* addBlocksCommand(CLI::App& app) {
  auto* bl = app.add_subcommand(
      "blocks",
      "Block layout of every segment at one moment, with fragmentation metrics (exact where the "
      "allocator model reproduced the device's history, an estimate otherwise)");
  bl->add_option("FILE", g_args.file, "snapshot file (any supported kind, detected by content)")
      ->required();
  bl->add_option("--at", g_args.at,
                 "peak (requested-bytes peak, default), oom (the first OOM), an event index (-1 = "
                 "start state), tTIME_US (the last event at or before that time), or t+DURATION as "
                 "analyze prints moments (t+1.442s, t+105.1ms, t+250us: since the first event)");
  bl->add_option("--device", g_args.device,
                 "CUDA device ordinal (default: the device with the OOM, else the first with a "
                 "trace)")
      ->check(kInt64Option);
  bl->add_flag("--json", g_args.json, "one JSON document (schema in docs/cli.md)");
  bl->add_flag("--salvage", g_args.salvage,
               "read the intact part of a native trace that is damaged in the middle");
  return bl;
}

int runBlocksCommand() {
  auto at = parseAtOption(g_args.at);
  if (!at) {
    printError(at.error().describe());
    return kExitUsage;
  }
  auto snap = loadWithProgress(g_args.file, g_args.salvage);
  if (!snap) {
    printError(snap.error().describe());
    return kExitError;
  }
  if (!snap->has_segment_info) {  // torch.profiler inputs: no allocator segments to lay out
    printError(g_args.file + ": blocks: not available for profiler traces: no segment information");
    return kExitUsage;
  }
  setActivity("computing the block layout of " + g_args.file);
  replay::resetPassStats();
  // OOM first (analysis/findings/headline.h): without --device, the device whose trace holds the
  // earliest OOM, else blocksDevice's default. Said in the text output when the file has several
  // devices.
  std::optional<int64_t> device = g_args.device;
  std::string focus_note;
  if (!device) {
    if (auto oom = analysis::oomFocusDevice(*snap)) {
      device = *oom;
      focus_note = analysis::focusNote(*oom, "the OOM is on cuda:" + std::to_string(*oom));
    } else if (snap->devices().size() > 1) {
      if (auto first = analysis::blocksDevice(*snap, std::nullopt)) {
        focus_note =
            analysis::focusNote(*first, "no OOM in the file: the first device with a trace");
      }
    }
    if (snap->devices().size() < 2) focus_note.clear();
  }
  // Its errors are about the arguments: no such device, no OOM for --at oom, an event index or
  // time outside the trace.
  auto r = analysis::computeBlocks(*snap, device, *at);
  if (replay::passStatsRequested())
    std::cerr << "memforensics: passes (" << g_args.file << "): " << replay::describePassStats()
              << "\n";
  if (!r) {
    printError(g_args.file + ": " + r.error().describe());
    return kExitUsage;
  }
  r->path = g_args.file;
  if (g_args.json) {
    report::renderBlocksJson(*r, std::cout);
  } else if (focus_note.empty()) {
    report::renderBlocksText(*r, std::cout);
  } else {
    // The note goes under the first line (the file's path), above the device's layout.
    std::ostringstream text;
    report::renderBlocksText(*r, text);
    std::string t = text.str();
    size_t nl = r->path.empty() ? std::string::npos : t.find('\n');
    std::string note = "showing " + focus_note + "\n";
    if (nl == std::string::npos)
      t.insert(0, note);
    else
      t.insert(nl + 1, note);
    std::cout << t;
  }
  return kExitOk;
}

}  // namespace memforensics::cli
