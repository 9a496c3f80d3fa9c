// snapshot_trace.h: converts between the Snapshot model and the native trace format.
//
// Snapshot -> trace keeps everything the model holds: events with their stacks and context,
// the final segment state, settings, annotations, and where the content came from (source format,
// PyTorch generation traits) so that a trace converted back to a pickle looks like the original.
// Trace -> Snapshot is what `analyze` and every other command use to read a `.bin` file.
#pragma once

#include <optional>
#include <span>
#include <string>

#include "common/status.h"
#include "format/load/load.h"
#include "format/model/snapshot.h"
#include "format/trace/trace_writer.h"

namespace memforensics::format {

struct TraceWriteOptions {
  int zstd_level = 3;  // 0 = uncompressed chunks
  uint64_t checkpoint_every = 1u << 18;
  uint32_t chunk_bytes = 1u << 20;
  std::string producer = "memforensics convert";
};

Status writeSnapshotTrace(const Snapshot& s, trace::ByteSink& sink,
                          const TraceWriteOptions& options = {});
// Writes to `path` through a temporary file in the same folder, renamed when complete, so a failed
// conversion never leaves a half-written file under the requested name.
Status writeSnapshotTraceFile(const Snapshot& s, const std::string& path,
                              const TraceWriteOptions& options = {});

// Reads a native trace. A file cut short is read up to its last complete chunk and the loss is
// stated in Snapshot::load_warnings; a file damaged in the middle is an error unless
// options.salvage, which keeps the good prefix (with a warning).
//
// The chunks are checked, decompressed and decoded on options.threads threads (0: the machine's
// hardware_concurrency; at most kMaxTraceLoadThreads, at most one per chunk), each writing its own
// slice of the events array, sized once from the counts the chunks' own bytes hold (never from the
// trailer's claim). The model's ids are created in the serial reader's order, so the Snapshot is
// the same whatever the number of threads; a file that does not take that path (a damaged chunk,
// a stack budget exceeded) is read by the serial reader, whose errors,
// warnings and salvage are the reference. options.threads = 1 decodes on the calling thread only.
Expected<Snapshot> readSnapshotTrace(std::span<const uint8_t> bytes,
                                     const LoadOptions& options = {});
// The serial reader alone (every chunk checked, decoded and converted in file order): the
// reference the parallel path is tested against.
Expected<Snapshot> readSnapshotTraceSerial(std::span<const uint8_t> bytes,
                                           const LoadOptions& options = {});
// The parallel path alone, for tests: nullopt where readSnapshotTrace hands the file to the
// serial reader (a damaged chunk, the stack budget; running out of memory throws here).
std::optional<Expected<Snapshot>> readSnapshotTraceParallelOnly(std::span<const uint8_t> bytes,
                                                                const LoadOptions& options = {});

// The most threads one native trace load uses, whatever LoadOptions::threads or the machine says.
inline constexpr unsigned kMaxTraceLoadThreads = 16;
// Threads for a load of `chunks` chunks with the setting `threads` (0 = hardware_concurrency):
// between 1 and min(kMaxTraceLoadThreads, chunks).
unsigned traceLoadThreads(int threads, size_t chunks);

// FormatTraits as the bit set stored in the Meta chunk, and back.
uint64_t traitsToBits(const FormatTraits& t);
FormatTraits traitsFromBits(uint64_t bits);

}  // namespace memforensics::format
