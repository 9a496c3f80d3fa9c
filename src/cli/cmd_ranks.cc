// cmd_ranks.cc: `memforensics ranks FILE... [--jobs N] [--device N] [--json]` and
// `memforensics ranks --merge SHARD.json...`.
//
// Streaming: each worker takes the next file, loads it, profiles it (analysis::profileSnapshot),
// keeps only its rows (figures and at most kRankLines per-line byte counts) and drops the
// Snapshot before taking another, so memory is about `jobs` snapshots at a time plus the rows,
// however many files. Rows land in input order, so the output does not depend on scheduling.
#include "cli/cmd_ranks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/compare/compare.h"
#include "cli/diagnostics.h"
#include "cli/options.h"
#include "common/parallel.h"
#include "format/load/load.h"
#include "report/render_compare.h"

namespace memforensics::cli {

namespace {

// The largest `ranks --json` shard read by --merge.
constexpr uint64_t kMaxMergeShardBytes = uint64_t{1} << 30;

struct RanksArgs {
  std::vector<std::string> files;
  size_t jobs = 0;  // 0 = the number of cores (common/parallel.h workerCount, at most kMaxThreads)
  std::optional<int64_t> device;
  bool merge = false;
  bool json = false;
  bool salvage = false;
};
RanksArgs g_args;
// LoadOptions::threads of each file: 1 when several files load at once (their workers already
// use the cores), else 0 (the cores decode one native trace's chunks). Set before the pool starts.
size_t g_load_threads = 0;

struct FileResult {
  std::vector<analysis::RankRow> rows;
  std::vector<std::string> warnings;
  bool no_device = false;  // read, but without the --device asked for: a usage error (exit 1)
};

FileResult rankFile(const std::string& path) {
  FileResult out;
  try {
    format::LoadOptions lo;
    lo.salvage = g_args.salvage;
    lo.threads = static_cast<int>(g_load_threads);
    auto snap = format::loadSnapshotFile(path, lo);
    if (!snap) {
      out.rows.push_back(analysis::failedRankRow(path, snap.error().describe()));
      return out;
    }
    for (const auto& w : snap->load_warnings) out.warnings.push_back(path + ": " + w);
    analysis::ProfileOptions po;
    po.device = g_args.device;
    // One file at a time (a single worker): its devices on the --jobs threads instead; several
    // files at once: each on its worker's thread. The rows are the same either way.
    analysis::RunProfile p =
        analysis::profileSnapshotOn(*snap, po, g_load_threads == 1 ? 1 : g_args.jobs);
    p.path = path;
    if (g_args.device && p.devices.empty()) {
      out.rows.push_back(
          analysis::failedRankRow(path, "no device " + std::to_string(*g_args.device)));
      out.no_device = true;
      return out;
    }
    out.rows = analysis::rankRowsOf(p);
  } catch (const std::bad_alloc&) {
    out.rows.assign(1, analysis::failedRankRow(path, "out of memory while analysing " + path));
  } catch (const std::exception& e) {
    out.rows.assign(1, analysis::failedRankRow(path, std::string(e.what()) + " (" + path + ")"));
  } catch (...) {
    out.rows.assign(1, analysis::failedRankRow(path, "unexpected failure while analysing " + path));
  }
  return out;
}

std::vector<FileResult> rankFiles(const std::vector<std::string>& files) {
  g_load_threads = workerCount(g_args.jobs, files.size()) > 1 ? 1 : 0;
  // rankFile catches every failure into its row, so no task throws.
  return parallelMap<FileResult>(files.size(), g_args.jobs,
                                 [&](size_t i) { return rankFile(files[i]); });
}

// A shard's text: a regular file of at most kMaxMergeShardBytes, read to its end (which may come
// sooner or later than its size said), or why not. A shard is a saved `ranks --json`: anything
// that is not a regular file (a directory, /dev/zero, a FIFO that may never be written) is refused
// before a byte is read, never read without bound or waited on.
Expected<std::string> readShard(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return Error{"cannot open " + path + ": " + std::strerror(errno), -1};
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Error{"cannot read " + path + ": " + std::strerror(errno), -1};
  if (S_ISDIR(st.st_mode)) return Error{path + " is a directory, not a ranks --json shard", -1};
  if (!S_ISREG(st.st_mode))
    return Error{path + " is not a regular file: a shard is a saved `ranks --json` document", -1};
  if (static_cast<uint64_t>(st.st_size) > kMaxMergeShardBytes)
    return Error{path + ": shard larger than " + std::to_string(kMaxMergeShardBytes) + " bytes",
                 -1};
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  for (;;) {
    if (got == text.size()) {
      if (text.size() > kMaxMergeShardBytes)
        return Error{path + ": shard larger than " + std::to_string(kMaxMergeShardBytes) +
                         " bytes (it grew while read)",
                     -1};
      text.resize(text.size() + 65536);  // it may have grown since fstat
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error{"cannot read " + path + ": " + std::strerror(errno), -1};
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

std::vector<FileResult> mergeShards(const std::vector<std::string>& shards) {
  std::vector<FileResult> results;
  for (const auto& path : shards) {
    FileResult fr;
    auto text = readShard(path);
    if (!text) {
      fr.rows.push_back(analysis::failedRankRow(path, text.error().describe()));
    } else {
      auto rows = report::parseRanksJson(*text, path);
      if (!rows) {
        fr.rows.push_back(analysis::failedRankRow(path, rows.error().describe()));
      } else {
        fr.rows = std::move(*rows);
      }
    }
    results.push_back(std::move(fr));
  }
  return results;
}

}  // namespace

CLI::App* addRanksCommand(CLI::App& app) {
  auto* c = app.add_subcommand(
      "ranks",
      "One row per file (rank) and device: peaks, OOMs, high findings, largest holder; outliers "
      "(peak > 10 % above the median) marked with the line that differs most");
  c->add_option("FILE", g_args.files,
                "snapshot files, one per rank (or, with --merge, `ranks --json` outputs)")
      ->required();
  c->add_option("--jobs,-j", g_args.jobs,
                "files analysed at once (default: the number of cores; each holds one snapshot)")
      ->check(CLI::Range(size_t{1}, kMaxThreads));
  c->add_option("--device", g_args.device, "only this CUDA device ordinal")->check(kInt64Option);
  c->add_flag("--merge", g_args.merge,
              "the FILEs are `ranks --json` outputs (e.g. one per Slurm array task): merge their "
              "rows and mark the outliers over all of them");
  c->add_flag("--json", g_args.json, "one JSON document (fields in docs/cli.md)");
  c->add_flag("--salvage", g_args.salvage,
              "read the intact part of a native trace that is damaged in the middle");
  return c;
}

int runRanksCommand() {
  setActivity(g_args.merge ? "merging rank shards" : "analysing ranks");
  std::vector<FileResult> results =
      g_args.merge ? mergeShards(g_args.files) : rankFiles(g_args.files);
  std::vector<analysis::RankRow> rows;
  size_t no_device = 0;
  for (auto& r : results) {
    for (const auto& w : r.warnings) printWarning(w);
    for (auto& row : r.rows) rows.push_back(std::move(row));
    no_device += r.no_device ? 1 : 0;
  }
  analysis::RanksSummary s = analysis::markOutliers(rows);
  for (const auto& r : rows) {
    if (!r.error.empty()) printError(r.error);
  }
  setActivity("writing the ranks");
  if (g_args.json) {
    report::renderRanksJson(rows, s, std::cout);
  } else {
    report::renderRanksText(rows, s, std::cout);
  }
  // A file that could not be read is exit 2; one read without the --device asked for is the
  // argument not matching the file, exit 1 as for every command (docs/cli.md, Exit codes).
  if (s.failed > no_device) return kExitError;
  return no_device > 0 ? kExitUsage : kExitOk;
}

}  // namespace memforensics::cli
