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
#include "format/model/snapshot.h"
#include "format/pickle/pickle_reader.h"

namespace memforensics::format {

// Inputs that are not regular files (pipes, FIFOs, character devices such as /dev/zero) cannot be
// mapped: they are read into memory, at most this many bytes; a larger stream is refused ("save it
// to a file"). docs/fuzzing.md lists the budgets.
inline constexpr uint64_t kMaxStreamInputBytes = uint64_t{4} << 30;
// A stream's first bytes are sniffed before more is read: content that is no snapshot kind, or
// text-looking content (JSON, HTML) with a NUL byte in it, is refused after this many bytes.
inline constexpr size_t kStreamSniffBytes = size_t{64} << 10;
// A named FIFO or a terminal with nothing to read: how long to wait for the first byte before
// giving up ("nothing to read; a FIFO with no writer?"), so that it never blocks forever.
inline constexpr int kStreamFirstByteWaitMs = 10000;

struct LoadOptions {
  ProgressFn progress;   // optional: consumed/total input bytes
  bool salvage = false;  // native traces: read the intact prefix of a file damaged in the middle
  int stream_wait_ms = kStreamFirstByteWaitMs;  // see kStreamFirstByteWaitMs (tests shorten it)
  // Native traces: threads that decode the chunks (0 = hardware_concurrency, 1 = the calling
  // thread only; capped by kMaxTraceLoadThreads, snapshot_trace.h). Same Snapshot either way.
  int threads = 0;
  // Native traces: leave the events encoded (Snapshot::deferred) where the file allows it, for a
  // reader that takes one device at a time through DeviceEvents (`analyze`): the whole file's
  // events are then never in memory at once. Other inputs ignore it.
  bool defer_events = false;
};

Expected<Snapshot> loadSnapshotFile(const std::string& path, const LoadOptions& options = {});
Expected<Snapshot> loadSnapshotBytes(std::span<const uint8_t> bytes,
                                     const LoadOptions& options = {});

// Exposed for tests: the JSON form, converted through the same code path as pickles.
Expected<Snapshot> readSnapshotJson(std::span<const uint8_t> bytes,
                                    const LoadOptions& options = {});
// Exposed for tests: extracts and decodes the base64 pickle of a memory_viz HTML page.
Expected<std::vector<uint8_t>> extractHtmlPickle(std::span<const uint8_t> bytes);

}  // namespace memforensics::format
