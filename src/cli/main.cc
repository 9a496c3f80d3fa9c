// main.cc: the memforensics command line.
//
// Exit codes, the same for every command (docs/cli.md "Exit codes"; constants in
// cli/diagnostics.h):
//   0  success
//   1  bad usage: an unknown option, a missing argument, a number out of range, --at oom without
//   OOM 2  an input could not be read or is not a valid snapshot, an output could not be written
//   (also
//      standard output: "cannot write to standard output: ..."), an output that is an input, out of
//      memory, or any other failure
//   3  `check` only: every input was read and a limit does not hold (cli/cmd_check.h)
// `record` exits with the recorded command's status instead (cmd_record.h): 128 + N for signal N,
// 127 not found, 126 not executable, 2 when its output cannot be created.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <exception>
#include <iostream>
#include <new>
#include <optional>

#include "analysis/analyze.h"
#include "cli/cmd_blocks.h"
#include "cli/cmd_check.h"
#include "cli/cmd_diff.h"
#include "cli/cmd_ranks.h"
#include "cli/cmd_record.h"
#include "cli/cmd_report.h"
#include "cli/cmd_timeline.h"
#include "cli/cmd_whatif.h"
#include "cli/diagnostics.h"
#include "cli/load_cli.h"
#include "cli/options.h"
#include "cli/output.h"
#include "cli/threads.h"
#include "common/memory.h"
#include "format/load/load.h"
#include "format/load/snapshot_trace.h"
#include "format/model/dump.h"
#include "format/pickle/snapshot_pickle.h"
#include "replay/pass_stats.h"
#include "report/export.h"
#include "report/render.h"

namespace mf = memforensics;

namespace {

using mf::cli::kExitError;
using mf::cli::kExitOk;
using mf::cli::kExitUsage;
using mf::cli::printError;
using mf::cli::printWarning;

bool g_salvage = false;  // --salvage: read the intact prefix of a damaged native trace

mf::Expected<mf::format::Snapshot> load(const std::string& path, bool defer_events = false) {
  return mf::cli::loadWithProgress(path, g_salvage, defer_events);
}

int analyze(const std::vector<std::string>& files, std::optional<int64_t> device, bool json,
            size_t top, size_t top_frames, const mf::report::TextOptions& text) {
  int rc = kExitOk;
  bool first = true;
  for (const auto& path : files) {
    // analyzeSnapshot reads the events one device at a time: a native trace's stay encoded.
    auto snap = load(path, true);
    if (!snap) {
      printError(snap.error().describe());
      rc = kExitError;
      continue;
    }
    mf::cli::setActivity("analyzing " + path);
    mf::replay::resetPassStats();
    mf::analysis::AnalyzeOptions opt;
    opt.device = device;
    opt.top = top;
    opt.top_frames = top_frames;
    opt.threads = mf::cli::analysisThreads();
    auto result = mf::analysis::analyzeSnapshot(*snap, opt);
    result.path = path;
    if (mf::replay::passStatsRequested())
      std::cerr << "memforensics: passes (" << path << "): " << mf::replay::describePassStats()
                << "\n";
    if (device && result.devices.empty() && result.empty_devices.empty()) {
      // The argument does not match the file: bad usage, as blocks and report (the other files
      // are still analysed).
      printError(path + " has no device " + std::to_string(*device));
      if (rc == kExitOk) rc = kExitUsage;
      first = false;
      continue;
    }
    mf::cli::setActivity("writing the analysis of " + path);
    if (json) {
      mf::report::renderJson(result, std::cout);
    } else {
      if (!first) std::cout << "\n";
      mf::report::renderText(result, std::cout, text);
    }
    first = false;
    if (!mf::cli::flushStdout().ok()) break;  // reported by finishStdout
  }
  return rc;
}

int dump(const std::string& path, bool stacks) {
  auto snap = load(path);
  if (!snap) {
    printError(snap.error().describe());
    return kExitError;
  }
  mf::cli::setActivity("dumping " + path);
  mf::format::DumpOptions opt;
  opt.stacks = stacks;
  mf::format::dumpSnapshot(*snap, std::cout, opt);
  return kExitOk;
}

// The output kinds of `convert`, and what an output file name implies when --to is not given.
enum class Target { Native, Pickle, Perfetto, Collapsed };

std::optional<Target> targetFromName(const std::string& to) {
  if (to == "native" || to == "bin") return Target::Native;
  if (to == "pickle") return Target::Pickle;
  if (to == "perfetto") return Target::Perfetto;
  if (to == "collapsed") return Target::Collapsed;
  return std::nullopt;
}

std::optional<Target> targetFromPath(const std::string& path) {
  auto ends = [&](std::string_view suffix) {
    return path.size() >= suffix.size() &&
           path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends(".bin")) return Target::Native;
  if (ends(".pickle") || ends(".pkl")) return Target::Pickle;
  if (ends(".folded") || ends(".collapsed")) return Target::Collapsed;
  if (ends(".perfetto.json")) return Target::Perfetto;
  return std::nullopt;
}

using mf::cli::writeOutput;

class OstreamSink : public mf::format::trace::ByteSink {
 public:
  explicit OstreamSink(std::ostream& out) : out_(out) {}
  mf::Status write(std::span<const uint8_t> b) override {
    out_.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    if (!out_) return mf::Error{"write failed (disk full?)", -1};
    return mf::Status::Ok();
  }

 private:
  std::ostream& out_;
};

struct ConvertArgs {
  std::string in, out, to;
  int zstd_level = 3;
  uint64_t checkpoint_every = 1u << 18;
  std::optional<int64_t> device;
  std::string value = "requested";
  bool user_frames_only = false;
  // Options given on the command line that apply to one output kind only (--zstd-level,
  // --checkpoint-every: native; --value, --user-frames: collapsed), by name.
  std::vector<std::string> native_only, collapsed_only;
};

int convert(const ConvertArgs& a) {
  std::optional<Target> target = a.to.empty() ? targetFromPath(a.out) : targetFromName(a.to);
  if (!target) {
    printError(a.to.empty()
                   ? "cannot tell the output format from '" + a.out +
                         "': name it *.bin, *.pickle, *.perfetto.json or *.folded, or pass --to"
                   : "unknown --to '" + a.to + "' (native, pickle, perfetto, collapsed)");
    return kExitUsage;
  }
  // Not silently ignored either: an option for another output kind is a mistake the user should
  // hear of (a --zstd-level on a pickle, a --value on a Perfetto trace).
  auto refuse = [&](const std::vector<std::string>& given, Target only, const char* kind) {
    if (given.empty() || *target == only) return false;
    printError(given.front() + " applies to " + kind + " output only");
    return true;
  };
  if (refuse(a.native_only, Target::Native, "native trace") ||
      refuse(a.collapsed_only, Target::Collapsed, "collapsed"))
    return kExitUsage;
  if (a.device && (*target == Target::Native || *target == Target::Pickle)) {
    // Not silently ignored: the output would hold every device the command line excluded.
    printError(
        "--device applies to perfetto and collapsed output; a native trace or a pickle keeps "
        "every device of the input");
    return kExitUsage;
  }
  if (auto same = mf::cli::checkNotAnInput(a.out, {a.in}); !same.ok()) {
    printError(same.error().describe());
    return kExitError;
  }
  auto snap = load(a.in);
  if (!snap) {
    printError(snap.error().describe());
    return kExitError;
  }
  if (a.device) {
    const std::vector<int64_t> ds = snap->devices();
    if (std::find(ds.begin(), ds.end(), *a.device) == ds.end()) {
      // Bad usage, as analyze, blocks, timeline, report, whatif, diff and check say it.
      printError(a.in + " has no device " + std::to_string(*a.device));
      return kExitUsage;
    }
  }
  mf::cli::setActivity("converting " + a.in + " to " + a.out);
  mf::Status s;
  switch (*target) {
    case Target::Native: {
      mf::format::TraceWriteOptions opt;
      opt.zstd_level = a.zstd_level;
      opt.checkpoint_every = a.checkpoint_every;
      s = writeOutput(a.out, [&](std::ostream& o) {
        OstreamSink sink(o);
        return mf::format::writeSnapshotTrace(*snap, sink, opt);
      });
      break;
    }
    case Target::Pickle:
      s = writeOutput(a.out, [&](std::ostream& o) {
        return mf::format::writeSnapshotPickle(
            *snap, [&](std::span<const uint8_t> b) -> mf::Status {
              o.write(reinterpret_cast<const char*>(b.data()),
                      static_cast<std::streamsize>(b.size()));
              if (!o) return mf::Error{"write failed (disk full?)", -1};
              return mf::Status::Ok();
            });
      });
      break;
    case Target::Perfetto: {
      mf::report::PerfettoOptions opt;
      opt.device = a.device;
      s = writeOutput(a.out,
                      [&](std::ostream& o) { return mf::report::exportPerfetto(*snap, o, opt); });
      break;
    }
    case Target::Collapsed: {
      mf::report::CollapsedOptions opt;
      opt.device = a.device;
      opt.which = a.value == "allocated" ? mf::report::CollapsedValue::Allocated
                                         : mf::report::CollapsedValue::Requested;
      opt.user_frames_only = a.user_frames_only;
      s = writeOutput(a.out,
                      [&](std::ostream& o) { return mf::report::exportCollapsed(*snap, o, opt); });
      break;
    }
  }
  if (!s.ok()) {
    printError(s.error().describe());
    return kExitError;
  }
  if (*target == Target::Native || *target == Target::Pickle) {
    // Round trips keep every field the model holds (tools/compare_pickles.py --deep checks it on
    // the real files); what it does not hold is said, not dropped silently.
    const std::string out_name = a.out == "-" ? std::string("the output") : a.out;
    for (const std::string& n : mf::format::notKeptNotes(*snap))
      printWarning(out_name + " does not keep: " + n);
    // A pickle has no way to say that its segments were rebuilt from the events (a native trace
    // leaves them out, as its input did): a reader takes them as recorded.
    if (*target == Target::Pickle && snap->final_state_rebuilt)
      printWarning(out_name +
                   " does not keep: that its final segment state was rebuilt from the events (" +
                   a.in + " has none); readers of the pickle take it as recorded");
  }
  return kExitOk;
}

}  // namespace

namespace {

int run(int argc, char** argv) {
  CLI::App app{"memforensics: GPU memory forensics for PyTorch CUDA memory snapshots"};
  app.set_version_flag("--version", "memforensics 0.1.0");
  app.require_subcommand(1);

  auto* an = app.add_subcommand(
      "analyze", "Replay a snapshot and report peaks, OOMs, top allocations and anomalies");
  std::vector<std::string> files;
  an->add_option(
        "FILE", files,
        "snapshot files (pickle, memory_viz HTML, JSON or native trace; detected by content)")
      ->required();
  std::optional<int64_t> device;
  an->add_option("--device", device, "only this CUDA device ordinal")->check(mf::cli::kInt64Option);
  bool json = false;
  an->add_flag("--json", json, "machine-readable output: one JSON document per file, one per line");
  size_t top = 10;
  an->add_option("--top", top, "how many stack groups to list at the peak")
      ->check(CLI::Range(1, 10000));
  size_t top_frames = 0;
  an->add_option("--top-frames", top_frames,
                 "also attribute live bytes at the peak to frames (call graph): list this many")
      ->check(CLI::Range(1, 10000));
  std::optional<size_t> width;
  an->add_option("--width", width,
                 "wrap the text report to this many columns (0: do not wrap; default: the "
                 "terminal's width, else COLUMNS, else 100)")
      ->check(CLI::Range(size_t{0}, size_t{100000}));
  bool all_devices = false;
  an->add_flag("--all-devices", all_devices,
               "a file of more than 4 devices: print every device's detail, not only those with "
               "an OOM or a high-severity finding");
  mf::cli::addThreadsOption(an);

  auto* du = app.add_subcommand(
      "dump", "Print every segment, block and event in a stable one-line text form");
  std::string dump_file;
  du->add_option("FILE", dump_file, "snapshot file")->required();
  bool stacks = false;
  du->add_flag("--stacks", stacks, "also print the frames of every stack referenced");

  auto* cv = app.add_subcommand(
      "convert",
      "Convert between PyTorch pickle and native trace, or export to Perfetto / collapsed stacks");
  ConvertArgs conv;
  cv->add_option("IN", conv.in, "input file (any supported kind, detected by content)")->required();
  cv->add_option("-o,--output", conv.out, "output file ('-' for standard output)")->required();
  cv->add_option(
      "--to", conv.to,
      "native | pickle | perfetto | collapsed (default: from the output name: .bin, .pickle/.pkl, "
      ".perfetto.json, .folded/.collapsed)");
  cv->add_option("--zstd-level", conv.zstd_level, "native: zstd level per chunk, 0 = uncompressed")
      ->check(CLI::Range(0, 19));
  cv->add_option(
        "--checkpoint-every", conv.checkpoint_every,
        "native: events between checkpoints (random access to the state at an event); 0 = none")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40));
  cv->add_option("--device", conv.device, "perfetto/collapsed: only this device")
      ->check(mf::cli::kInt64Option);
  cv->add_option(
        "--value", conv.value,
        "collapsed: requested (at the requested peak) or allocated (at the allocated peak)")
      ->check(CLI::IsMember({"requested", "allocated"}));
  cv->add_flag("--user-frames", conv.user_frames_only,
               "collapsed: keep only user frames (drop framework plumbing)");

  for (auto* sub : {an, du, cv}) {
    sub->add_flag("--salvage", g_salvage,
                  "read the intact part of a native trace that is damaged in the middle");
  }

  auto* tl = mf::cli::addTimelineCommand(app);
  auto* bl = mf::cli::addBlocksCommand(app);
  auto* rp = mf::cli::addReportCommand(app);
  auto* rec = mf::cli::addRecordCommand(app);
  auto* df = mf::cli::addDiffCommand(app);
  auto* rk = mf::cli::addRanksCommand(app);
  auto* ck = mf::cli::addCheckCommand(app);
  auto* wi = mf::cli::addWhatIfCommand(app);
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
  // Standard output opened on an input (`analyze in.pickle 1<>in.pickle`) would overwrite it as
  // the command writes: refused before anything is read, for every command that reads files
  // (record's words are a command line to run, not inputs).
  for (const CLI::App* sub : app.get_subcommands()) {
    if (sub == rec) continue;
    std::vector<std::string> inputs;
    for (const CLI::Option* o : sub->get_options()) {
      if (o->get_positional() || o->check_lname("baseline"))
        for (const std::string& r : o->results()) inputs.push_back(r);
    }
    if (auto same = mf::cli::checkNotAnInput("-", inputs); !same.ok()) {
      printError(same.error().describe());
      return kExitError;
    }
  }
  if (an->parsed()) {
    mf::report::TextOptions text;
    text.width = width ? *width : mf::cli::stdoutTextWidth();
    if (text.width != 0) text.width = std::max(text.width, mf::cli::kMinTextWidth);
    text.all_devices = all_devices;
    return analyze(files, device, json, top, top_frames, text);
  }
  if (du->parsed()) return dump(dump_file, stacks);
  if (cv->parsed()) {
    for (const char* o : {"--zstd-level", "--checkpoint-every"})
      if (cv->count(o) > 0) conv.native_only.push_back(o);
    for (const char* o : {"--value", "--user-frames"})
      if (cv->count(o) > 0) conv.collapsed_only.push_back(o);
    return convert(conv);
  }
  if (tl->parsed()) return mf::cli::runTimelineCommand();
  if (bl->parsed()) return mf::cli::runBlocksCommand();
  if (rp->parsed()) return mf::cli::runReportCommand();
  if (rec->parsed()) return mf::cli::runRecordCommand();
  if (df->parsed()) return mf::cli::runDiffCommand();
  if (rk->parsed()) return mf::cli::runRanksCommand();
  if (ck->parsed()) return mf::cli::runCheckCommand();
  if (wi->parsed()) return mf::cli::runWhatIfCommand();
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  // A file-size limit (ulimit -f) must not kill the process mid-write with SIGXFSZ, leaving a
  // *.tmp-XXXXXX behind: ignored, the write fails with EFBIG, and the output code reports it
  // (exit 2) and removes its temporary file.
  std::signal(SIGXFSZ, SIG_IGN);
  // Nor a reader that closed the pipe (`dump big.pickle | head`) with SIGPIPE (exit 141): the
  // write fails with EPIPE and the output code reports it (exit 2), as docs/cli.md says.
  std::signal(SIGPIPE, SIG_IGN);
  // An input mapped while another process truncates it: exit 2 with a message, not SIGBUS.
  mf::installMappedInputFaultHandler();
  // Before anything allocates much: freed memory is reused, not unmapped (common/memory.h).
  mf::configureAllocator();
  mf::cli::installStdout();
  int rc = kExitError;
  // Memory running out anywhere (a hostile input the budgets did not stop, a real file larger than
  // the machine) and any other exception end here as exit 2 with a message, never as an abort.
  try {
    rc = run(argc, argv);
  } catch (const std::bad_alloc&) {
    printError("out of memory while " + mf::cli::activity());
  } catch (const std::exception& e) {
    printError(std::string(e.what()) + " (while " + mf::cli::activity() + ")");
  }
  return mf::cli::finishStdout(rc);
}
