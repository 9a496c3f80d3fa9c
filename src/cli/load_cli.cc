// load_cli.cc: see load_cli.h.
#include "cli/load_cli.h"

#include "cli/diagnostics.h"
#include "cli/progress.h"
#include "cli/threads.h"
#include "format/load/load.h"

namespace memforensics::cli {

Expected<format::Snapshot> loadWithProgress(const std::string& path, bool salvage,
                                            bool defer_events) {
  setActivity("reading " + path);
  ProgressBar bar("reading " + path);
  format::LoadOptions opt;
  opt.progress = [&](uint64_t done, uint64_t total) { bar.update(done, total); };
  opt.salvage = salvage;
  opt.defer_events = defer_events;
  // The --threads / MEMF_THREADS setting also decodes a native trace's chunks
  // (LoadOptions::threads, 0 = the cores; the same Snapshot for every value).
  opt.threads = static_cast<int>(analysisThreads());
  auto snap = format::loadSnapshotFile(path, opt);
  bar.finish();
  if (snap) {
    for (const auto& w : snap->load_warnings) printWarning(path + ": " + w);
  }
  return snap;
}

}  // namespace memforensics::cli
