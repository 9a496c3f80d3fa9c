// main.cc: the memforensics command line. Exit codes: 0 ok, 1 bad usage, 2 unreadable input.
#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>

#include "analysis/analyze.h"
#include "cli/progress.h"
#include "format/dump.h"
#include "format/load.h"
#include "report/render.h"

namespace mf = memforensics;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitUsage = 1;
constexpr int kExitInput = 2;

mf::Expected<mf::format::Snapshot> load(const std::string& path) {
  mf::cli::ProgressBar bar("reading " + path);
  mf::format::LoadOptions opt;
  opt.progress = [&](uint64_t done, uint64_t total) { bar.update(done, total); };
  auto snap = mf::format::loadSnapshotFile(path, opt);
  bar.finish();
  return snap;
}

int analyze(const std::vector<std::string>& files, std::optional<int64_t> device, bool json, size_t top) {
  int rc = kExitOk;
  bool first = true;
  for (const auto& path : files) {
    auto snap = load(path);
    if (!snap) {
      std::cerr << "memforensics: error: " << snap.error().describe() << "\n";
      rc = kExitInput;
      continue;
    }
    mf::analysis::AnalyzeOptions opt;
    opt.device = device;
    opt.top = top;
    auto result = mf::analysis::analyzeSnapshot(*snap, opt);
    result.path = path;
    if (device && result.devices.empty()) {
      std::cerr << "memforensics: warning: " << path << " has no device " << *device << "\n";
    }
    if (json) {
      mf::report::renderJson(result, std::cout);
    } else {
      if (!first) std::cout << "\n";
      mf::report::renderText(result, std::cout);
    }
    first = false;
  }
  return rc;
}

int dump(const std::string& path, bool stacks) {
  auto snap = load(path);
  if (!snap) {
    std::cerr << "memforensics: error: " << snap.error().describe() << "\n";
    return kExitInput;
  }
  mf::format::DumpOptions opt;
  opt.stacks = stacks;
  mf::format::dumpSnapshot(*snap, std::cout, opt);
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  CLI::App app{"memforensics: GPU memory forensics for PyTorch CUDA memory snapshots"};
  app.set_version_flag("--version", "memforensics 0.1.0");
  app.require_subcommand(1);

  auto* an = app.add_subcommand("analyze", "Replay a snapshot and report peaks, OOMs, top allocations and anomalies");
  std::vector<std::string> files;
  an->add_option("FILE", files, "snapshot files (pickle, memory_viz HTML or JSON; detected by content)")
      ->required();
  std::optional<int64_t> device;
  an->add_option("--device", device, "only this CUDA device ordinal");
  bool json = false;
  an->add_flag("--json", json, "machine-readable output: one JSON document per file, one per line");
  size_t top = 10;
  an->add_option("--top", top, "how many stack groups to list at the peak")->check(CLI::Range(1, 10000));

  auto* du = app.add_subcommand("dump", "Print every segment, block and event in a stable one-line text form");
  std::string dump_file;
  du->add_option("FILE", dump_file, "snapshot file")->required();
  bool stacks = false;
  du->add_flag("--stacks", stacks, "also print the frames of every stack referenced");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    (void)app.exit(e);
    return kExitUsage;
  }
  if (an->parsed()) return analyze(files, device, json, top);
  if (du->parsed()) return dump(dump_file, stacks);
  return kExitUsage;
}
