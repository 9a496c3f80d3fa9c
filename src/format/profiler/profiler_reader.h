// profiler_reader.h: torch.profiler outputs read into the Snapshot model (docs/profiler-traces.md).
//
//   * Kineto chrome trace JSON (`prof.export_chrome_trace`, the tensorboard trace handler's
//     `.pt.trace.json(.gz)`): `[memory]` instant events become alloc / free events per CUDA device,
//     the enclosing `cpu_op`, `user_annotation` and `python_function` events on the same thread
//     their stack, `ProfilerStep#N` the iterations (annotations), `Total Reserved` the reserved
//     curve (segments synthesized from it), `deviceProperties` the card's memory,
//     `distributedInfo` the rank;
//   * `export_memory_timeline` output: the `.raw.json.gz` rows [time_ns, action, bytes, category]
//     and the `.json(.gz)` form [times_us, sizes by category], with PyTorch's own categories kept
//     on every event (Event::category).
//
// Plain or gzip (zlib, decompressed incrementally into a SAX parser: the decompressed text is
// never held, and its size is bounded by gzipDecodedBudget()). A profiler trace has no allocator
// segments: block addresses are renumbered into synthesized segments and
// Snapshot::has_segment_info is false, so commands that need a block layout refuse.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/progress.h"
#include "common/status.h"
#include "format/model/snapshot.h"

namespace memforensics::format {

// Budgets (docs/fuzzing.md lists them). Decompressed bytes of one gzip input: at most
// kGzipExpansionPerInputByte x its compressed size, and never refused below kGzipDecodedFloor.
// Real traces expand 10-20x (53.7 MB from 3.0 MB; the memory timeline 9.5x); a gzip bomb
// (zlib reaches ~1000x) is refused when it passes the budget, before its text goes further.
inline constexpr uint64_t kGzipExpansionPerInputByte = 64;
inline constexpr uint64_t kGzipDecodedFloor = uint64_t{64} << 20;
uint64_t gzipDecodedBudget(uint64_t compressed_bytes);
// A gzipped snapshot JSON compresses further than a trace (its history repeats the same frames:
// 52x and 92x on real files): up to kGzipSnapshotJsonExpansion x its size, from the same floor.
inline constexpr uint64_t kGzipSnapshotJsonExpansion = 256;
uint64_t gzipSnapshotJsonBudget(uint64_t compressed_bytes);
// JSON nesting of a profiler input (a Kineto trace is 6 deep: args' "Input Dims" lists of lists).
inline constexpr int kMaxProfilerJsonDepth = 64;
// Frames kept per stack (the innermost ones): an event nested deeper is cut, with a warning.
inline constexpr size_t kMaxProfilerStackFrames = 256;
// CUDA `Device Id`s accepted: [0, kMaxProfilerDevice); events on others are counted and dropped.
inline constexpr int64_t kMaxProfilerDevice = 1024;
// Records kept (memory events, ops, timeline rows): at most one per this many bytes of JSON text,
// + kProfilerRecordSlack. The smallest record a trace can hold is longer, so only a broken reader
// trips it.
inline constexpr uint64_t kProfilerTextBytesPerRecord = 8;
inline constexpr uint64_t kProfilerRecordSlack = 1u << 16;
// Numbers a memory timeline keeps (its raw rows are four numbers each): at most one per this many
// bytes of its text, + kProfilerRecordSlack. Python writes a row as `[t, action, bytes, category],
// ` (times in nanoseconds, 16 digits and more); its shortest row, `[-1, 1, 512, 0], `, is 17 bytes.
inline constexpr uint64_t kTimelineTextBytesPerValue = 4;
// Frames the distinct op stacks of a trace hold together (each is at most kMaxProfilerStackFrames):
// once they reach max(kProfilerStackFramesFloor, one per kProfilerTextBytesPerStackFrame bytes of
// its text), every later stack keeps only its kProfilerStackFramesPastBudget innermost frames (one
// seen whole before too: the table has no lookup without interning), and a warning counts the
// distinct stacks cut (60,000 distinct 256-op stacks from 800 KB of gzip: 15 M frames, a 1.2 GB
// report).
inline constexpr uint64_t kProfilerStackFramesFloor = uint64_t{4} << 20;
inline constexpr uint64_t kProfilerTextBytesPerStackFrame = 4;
inline constexpr size_t kProfilerStackFramesPastBudget = 8;
inline constexpr uint64_t profilerStackFrameBudget(uint64_t text_bytes) {
  return std::max(kProfilerStackFramesFloor, text_bytes / kProfilerTextBytesPerStackFrame);
}

// What a byte prefix holds, as far as this reader is concerned.
enum class ProfilerKind : uint8_t { NotProfiler, KinetoTrace, MemoryTimeline };
bool looksLikeGzip(std::span<const uint8_t> bytes);
// From the first bytes (a gzip input's first decompressed bytes): a JSON object whose first key
// is not a memory snapshot's is a Kineto trace; a JSON array of arrays is a memory timeline.
// A gzip input is one of the two (the reader then says what is wrong with it) unless its first
// key is a memory snapshot's: a gzipped snapshot JSON (gunzipBounded, then the JSON reader).
ProfilerKind sniffProfiler(std::span<const uint8_t> bytes);
// The whole decompressed text of a gzip input, refused past `budget` bytes (gzipDecodedBudget).
Expected<std::vector<uint8_t>> gunzipBounded(std::span<const uint8_t> bytes, uint64_t budget);

struct ProfilerReadOptions {
  ProgressFn progress;             // optional: compressed (input) bytes consumed / total
  uint64_t max_decoded_bytes = 0;  // 0: gzipDecodedBudget(input size) (tests lower it)
};

// The plot data of a PyTorch 2.0 memory_viz page: before 2.1, torch.cuda._memory_viz.trace_plot
// embedded its processed plot (`let alloc_data = {...}`: elements with a size and an interned
// stack, actions in which an element's first appearance allocates it and the next frees it, the
// elements alive at the start), not the snapshot. Read as one device's trace in order, with
// synthesized addresses and no segment information, like a profiler trace. `json` is the object's
// text, at most kMaxPlotDataBytes (its JSON tree is held: about 6x the text).
inline constexpr uint64_t kMaxPlotDataBytes = uint64_t{64} << 20;
inline constexpr int kMaxPlotDataDepth = 8;  // JSON nesting (the plot's own is 3)
Expected<Snapshot> readMemoryVizPlotData(std::string_view json);

Expected<Snapshot> readProfilerInput(std::span<const uint8_t> bytes,
                                     const ProfilerReadOptions& options = {});

// PyTorch's categories (torch/profiler/_memory_profiler.py _CATEGORY_TO_INDEX) as Event::category
// holds them: 0 = none, 1 + index otherwise ("PARAMETER", ..., "unknown" for PyTorch's None).
inline constexpr uint8_t kProfilerCategoryCount = 8;
std::string_view profilerCategoryName(uint8_t category);

}  // namespace memforensics::format
