// load.h: opens a snapshot file of any supported kind, recognized by its content, not its name.
//
//   * a pickle (PROTO opcode first): what _dump_snapshot / pickle.dump write;
//   * the HTML page PyTorch's `_memory_viz.py trace_plot` writes (base64 pickle inside);
//   * the JSON form memory_viz also accepts (same structure as the pickle);
//   * memforensics' own native trace (docs/trace-format.md).
#pragma once

#include <span>
#include <string>

#include "common/status.h"
#include "format/pickle_reader.h"
#include "format/snapshot.h"

namespace memforensics::format {

struct LoadOptions {
  ProgressFn progress;  // optional: consumed/total input bytes
  bool salvage = false;  // native traces: read the intact prefix of a file damaged in the middle
};

Expected<Snapshot> loadSnapshotFile(const std::string& path, const LoadOptions& options = {});
Expected<Snapshot> loadSnapshotBytes(std::span<const uint8_t> bytes, const LoadOptions& options = {});

// Exposed for tests: the JSON form, converted through the same code path as pickles.
Expected<Snapshot> readSnapshotJson(std::span<const uint8_t> bytes, const LoadOptions& options = {});
// Exposed for tests: extracts and decodes the base64 pickle of a memory_viz HTML page.
Expected<std::vector<uint8_t>> extractHtmlPickle(std::span<const uint8_t> bytes);

}  // namespace memforensics::format
