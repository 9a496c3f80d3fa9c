// cmd_diff.cc: `memforensics diff BASE NEW [--device N] [--top N] [--json]`.
#include "cli/cmd_diff.h"

#include <iostream>

#include "analysis/analyze.h"
#include "cli/diagnostics.h"
#include "cli/load_cli.h"
#include "cli/options.h"
#include "cli/threads.h"
#include "report/render_compare.h"

namespace memforensics::cli {

namespace {

struct DiffArgs {
  std::string base, neu;
  std::optional<int64_t> device;
  size_t top = 10;
  bool json = false;
  bool salvage = false;
};
DiffArgs g_args;

}  // namespace

Expected<analysis::RunProfile> loadProfile(const std::string& path, std::optional<int64_t> device,
                                           bool salvage) {
  auto snap = loadWithProgress(path, salvage);
  if (!snap) return snap.error();
  setActivity("analyzing " + path);
  analysis::ProfileOptions opt;
  opt.device = device;
  analysis::RunProfile p = analysis::profileSnapshotOn(*snap, opt, analysisThreads());
  p.path = path;
  p.incomplete = snap->incomplete;
  return p;
}

bool missingDevice(const analysis::RunProfile& p, std::optional<int64_t> device) {
  if (!device || !p.devices.empty()) return false;
  printError(p.path + " has no device " + std::to_string(*device));
  return true;
}

CLI::App* addDiffCommand(CLI::App& app) {
  auto* c = app.add_subcommand(
      "diff",
      "Two runs side by side: peaks, final state, live bytes at each peak by category and by "
      "stack, findings and segments that appeared or disappeared");
  c->add_option("BASE", g_args.base, "the reference run (any supported snapshot kind)")->required();
  c->add_option("NEW", g_args.neu, "the run to compare with it")->required();
  c->add_option("--device", g_args.device, "only this CUDA device ordinal")->check(kInt64Option);
  c->add_option("--top", g_args.top, "stacks listed per list (grew, new, gone, shrank)")
      ->check(CLI::Range(size_t{1}, size_t{10000}));
  c->add_flag("--json", g_args.json, "one JSON document (fields in docs/cli.md)");
  c->add_flag("--salvage", g_args.salvage,
              "read the intact part of a native trace that is damaged in the middle");
  addThreadsOption(c);
  return c;
}

int runDiffCommand() {
  auto base = loadProfile(g_args.base, g_args.device, g_args.salvage);
  if (!base) {
    printError(base.error().describe());
    return kExitError;
  }
  auto neu = loadProfile(g_args.neu, g_args.device, g_args.salvage);
  if (!neu) {
    printError(neu.error().describe());
    return kExitError;
  }
  if (missingDevice(*base, g_args.device) | missingDevice(*neu, g_args.device)) return kExitUsage;
  analysis::DiffOptions opt;
  opt.top = g_args.top;
  setActivity("comparing " + g_args.base + " with " + g_args.neu);
  auto result = analysis::diffProfiles(*base, *neu, opt);
  setActivity("writing the diff");
  if (g_args.json) {
    report::renderDiffJson(result, std::cout);
  } else {
    report::renderDiffText(result, std::cout);
  }
  return kExitOk;
}

}  // namespace memforensics::cli
