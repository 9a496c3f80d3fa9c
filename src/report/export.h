// export.h: exports of a snapshot to other tools' formats (`memforensics convert --to ...`).
//
// Pure functions of each device's session facts (analysis/session/session.h: the counters after
// every event for Perfetto, the live set at the peak for the collapsed stacks); nothing here
// replays. The overloads without facts build one session per device, one device at a time, and
// stream their output, since a counter timeline has one sample per event.
//
//   * exportPerfetto: Chrome trace-event JSON, opened by ui.perfetto.dev and chrome://tracing.
//   * exportCollapsed: Brendan Gregg's folded stacks ("a;b;c 123" lines) of the memory live at a
//     device's peak, for flamegraph.pl, speedscope and inferno.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>

#include "analysis/session/session.h"
#include "common/status.h"
#include "format/model/snapshot.h"

namespace memforensics::report {

// A frame as both exports write it: "name (file:line)", ":line" omitted for format::kUnknownLine,
// " (file...)" omitted for an empty file name, "[unknown]" for an empty name. Not escaped.
std::string exportFrameText(std::string_view name, std::string_view file, uint64_t line);

struct PerfettoOptions {
  std::optional<int64_t> device;  // only this device (an error when the snapshot lacks it)
  size_t frames_per_oom = 16;     // user frames listed in each OOM instant (analysis::userFrames)
  bool peak_instants = true;      // an instant at each device's reserved/requested/allocated peak
};

// Writes one JSON object {"otherData": {...}, "traceEvents": [...]}, one event per line.
//   * Device d is process pid d + 1 named "GPU d" (pid 0 is special to some importers). Its
//     counters are "C" events named reserved / allocated / requested / pending_free with one arg
//     "bytes" (Perfetto tracks "reserved bytes", ...): all four at ts 0 (the replayed start state),
//     then after every event only the series whose value changed. Values are exactly the
//     session's counters after each event (DeviceFacts::series), so each series' maximum is the
//     session summary's peak.
//   * ts is in microseconds: time_us - time_origin_us, where time_origin_us (in otherData) is one
//     microsecond before the earliest time in the file, so the start state has ts 0 to itself.
//     Events without time_us take the previous event's ts, and ts never decreases within a device
//     (time_regression anomalies are clamped). A file without any time_us gets
//     otherData.time_axis = "event_index" and ts = event index + 1.
//   * OOMs are process instants named "OOM" (args: request_bytes, device_free_bytes, stream, event,
//     time_us, the counters as countersJson (json_analysis.h) spells them, frames = user frames
//     as "name (file:line)" text); peaks are instants "peak reserved" / "peak requested" /
//     "peak allocated".
//   * external_annotations START/END pairs (matched by name, innermost first) are "B"/"E" slices
//     on thread "annotations" of their device; pairs that would not nest there go to
//     "annotations 2", ... Unmatched stages are thread instants. Annotations without a device go to
//     every device; annotations without time_us (or in an event_index file) are skipped and counted
//     in otherData.annotations_skipped.
// Strings from the snapshot are JSON-escaped, invalid UTF-8 replaced by U+FFFD; "ts" is the first
// key of every event, as old Perfetto importers need. Fails only on an unknown device or when `out`
// fails.
Status exportPerfetto(const format::Snapshot& snap, std::ostream& out,
                      const PerfettoOptions& options = {});
// The same for the devices of `facts` (in that order; each with SessionOptions::series);
// options.device is not consulted.
Status exportPerfetto(const format::Snapshot& snap, std::span<const analysis::DeviceFacts> facts,
                      std::ostream& out, const PerfettoOptions& options = {});

enum class CollapsedValue : uint8_t {
  Requested,  // at the requested peak: requested bytes of every live block, pending-free included
  Allocated,  // at the allocated peak: block sizes of live blocks not pending free
};

struct CollapsedOptions {
  std::optional<int64_t> device;  // only this device (an error when the snapshot lacks it)
  CollapsedValue which = CollapsedValue::Requested;
  bool user_frames_only = false;  // only the frames analysis::userFrames() keeps (default: all)
};

// For each device (ascending), at its peak of `which` (the session summary's peak event), writes
// one line per distinct stack of the blocks live there:
//   cuda:<d>;<outermost frame>;...;<innermost frame> <bytes>
// sorted by stack text, so the values of a device sum to its peak exactly (lines summing to 0 are
// left out). Frames read "name (file:line)" (":line" omitted when unknown). Since ';' separates
// frames and the line ends at a newline, ';' in frame text becomes ',' and control characters
// become ' '; invalid UTF-8 becomes U+FFFD. Blocks without a recorded stack are under
// "cuda:<d>;[no stack recorded]", an empty frames list under "cuda:<d>;[empty stack]", and a stack
// with no frame left by user_frames_only under "cuda:<d>;[no user frames]". Blocks pending free
// (freed, waiting for their stream; Requested only) get an innermost frame "[pending free]".
// Fails only on an unknown device or when `out` fails.
Status exportCollapsed(const format::Snapshot& snap, std::ostream& out,
                       const CollapsedOptions& options = {});
// The same for the devices of `facts` (in that order), each holding the live set at its peak of
// options.which (collapsedMoment); options.device is not consulted. The lines are the frame tree's
// (analysis/frames/frame_tree.h) leaves, so they attribute bytes as the call graph and the icicle
// do.
Status exportCollapsed(const format::Snapshot& snap, std::span<const analysis::DeviceFacts> facts,
                       std::ostream& out, const CollapsedOptions& options = {});
// The event whose live set exportCollapsed reads for a device (its requested or allocated peak).
int64_t collapsedMoment(const analysis::DeviceFacts& facts, CollapsedValue which);

}  // namespace memforensics::report
