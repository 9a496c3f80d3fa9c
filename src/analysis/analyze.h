// analyze.h: the `analyze` result: per device summary, peaks, OOMs, top allocations at the peak.
//
// A pure function from a Snapshot to a self-contained result struct: everything a renderer needs,
// frames included as text, so report/ never looks at the snapshot or replays anything. Per device
// one DeviceSession (analysis/session/session.h) walks the history; everything here reads its
// facts.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "analysis/findings/findings.h"
#include "analysis/frames/callgraph.h"
#include "analysis/frames/frames.h"
#include "analysis/session/session.h"
#include "format/model/snapshot.h"
#include "replay/replay.h"

namespace memforensics::analysis {

struct StackGroup {
  uint64_t requested_bytes = 0;
  uint64_t block_bytes = 0;
  uint64_t count = 0;
  bool has_stack = false;
  std::vector<FrameText> frames;  // innermost user frames (see userFrames)
};

struct OomReport {
  replay::OomEvent oom;
  std::vector<FrameText> frames;
};
// OOMs listed per device in DeviceAnalysis::ooms (the first ones): a job that catches OOMs and
// retries may record any number of them; summary.ooms keeps them all and their count.
inline constexpr size_t kOomsListed = 1000;

struct AnomalyReport {
  std::string id;
  replay::Severity severity;
  std::string description;
  uint64_t count = 0;
  int64_t first_event = -1;
};

// One user line's allocations on a device: the allocations whose innermost user frame is this line
// (trace allocations, and blocks alive before the trace at the requested peak). Compared across
// the devices of one job by crossDeviceFindings (cross_device.h: device imbalance).
struct LineSizes {
  std::vector<FrameText> frames;    // the line first (innermost user frame), then its callers
  uint64_t allocs = 0;              // allocations from this line
  uint64_t total_bytes = 0;         // requested bytes over them (saturating)
  uint64_t max_bytes = 0;           // the largest single allocation: the per-tensor size
  uint64_t live_at_peak_bytes = 0;  // requested bytes from this line live at the requested peak
};
// Lines kept per device in DeviceAnalysis::line_sizes (the heaviest: live at the peak, then total
// bytes), so a job of many devices and many stacks stays small.
inline constexpr size_t kLineSizesPerDevice = 64;

struct DeviceAnalysis {
  replay::DeviceSummary summary;
  size_t segments = 0;
  size_t live_at_peak = 0;               // live blocks at the requested peak
  std::vector<StackGroup> top_at_peak;   // largest first, by requested bytes
  std::vector<OomReport> ooms;           // the first kOomsListed of summary.ooms, with their frames
  std::vector<AnomalyReport> anomalies;  // non-zero ones only, by severity then id
  std::vector<Finding> findings;         // see findings.h; high severity first
  bool has_frames = false;               // top_frames computed (AnalyzeOptions::top_frames > 0)
  CallGraphSummary frames_at_peak;       // live bytes by frame at the requested peak
  // The allocator model, when a finding needed a layout (an OOM): its whole-device verdict (allocs
  // predicted / total) and whether layout figures may be called exact (session.h ModelFacts).
  ModelFacts model;
  replay::PassStats passes;  // how often this device's history was walked (replay/pass_stats.h)
  // Per-line allocation sizes, at most kLineSizesPerDevice, heaviest first (see LineSizes).
  std::vector<LineSizes> line_sizes;
};

struct AnalysisResult {
  std::string path;
  std::string source_format;  // pickle / memory_viz_html / json
  int pickle_protocol = 0;
  std::string era;  // PyTorch generation inferred from the fields present
  uint64_t input_bytes = 0;
  size_t strings = 0, frames = 0, stacks = 0;
  size_t annotations = 0;
  size_t host_trace_events = 0;
  std::vector<std::string> ignored_keys;
  std::string origin;                 // native traces: what they were converted from
  bool live_capture = false;          // recorded by memforensics' capture (origin says by what)
  std::vector<std::string> warnings;  // from reading the file (e.g. a cut-off native trace)
  std::vector<DeviceAnalysis> devices;
  // Device traces of the file with no event and no segment (device_traces [..., [], ...]): nothing
  // was recorded there, and the outputs say so instead of leaving the device out without a word.
  std::vector<int64_t> empty_devices;
  // Findings about the job as a whole (cross_device.h: e.g. device imbalance), device -1 or the
  // device they point at; high severity first.
  std::vector<Finding> job_findings;
};

struct AnalyzeOptions {
  std::optional<int64_t> device;  // only this device
  size_t top = 10;
  size_t frames_per_group = 3;
  bool findings = true;   // run the detectors of findings.h
  size_t top_frames = 0;  // > 0: call-graph attribution at the requested peak, this many frames
  // Devices analysed at once (common/parallel.h: 0 = the machine's cores, at most kMaxThreads);
  // the result is the same for every value.
  size_t threads = 0;
  // The snapshot's frozen frame and stack facts (freezeStackFacts) for analyzeDevice to read;
  // null: it classifies the frames it reads itself. analyzeSnapshot of several devices sets it.
  const FrozenStackFacts* stack_facts = nullptr;
};

// analyzeSnapshot holds one DeviceSession per thread (the allocation table, the replayer's
// per-event state: tens of bytes per event). It runs at most kMaxSessionEventsInFlight /
// (the largest device's events) threads, at least one, so that a file of a few huge devices does
// not hold several of their sessions at once for a speed-up of a few cores.
inline constexpr uint64_t kMaxSessionEventsInFlight = uint64_t{16} << 20;
// The threads analyzeSnapshot uses for `devices` devices, the largest of `largest_events` events,
// with the setting `threads` (AnalyzeOptions::threads): common/parallel.h workerCount, capped as
// above.
size_t sessionThreads(size_t threads, size_t devices, uint64_t largest_events);

AnalysisResult analyzeSnapshot(const format::Snapshot& snap, const AnalyzeOptions& options = {});
// The input fields of the result (no device): analyzeSnapshot is this plus analyzeDevice per
// device; `report` adds the devices from the sessions it shares with its drawings.
AnalysisResult analysisHeader(const format::Snapshot& snap);
// One device's analysis: a pure function of its session facts (which should hold the live set at
// the requested peak and, with options.findings, the finding moments).
DeviceAnalysis analyzeDevice(const format::Snapshot& snap, DeviceFacts facts,
                             const AnalyzeOptions& options = {});
// analyzeDevice for each of `facts`, in that order, on options.threads threads (the sessions were
// visited by the caller; each facts is released once analysed). The pass counters of the work are
// the calling thread's, as with a serial loop.
std::vector<DeviceAnalysis> analyzeDevices(const format::Snapshot& snap,
                                           std::vector<DeviceFacts> facts,
                                           const AnalyzeOptions& options = {});
// The devices of `snap` a command with `--device` analyses: all of snap.devices() (ascending), or
// the one asked for when the file has it.
std::vector<int64_t> selectedDevices(const format::Snapshot& snap, std::optional<int64_t> device);
// sessionThreads for `devices` of `snap`: the cap from the largest of their traces.
size_t sessionThreadsFor(const format::Snapshot& snap, const std::vector<int64_t>& devices,
                         size_t threads);

// The sessions of `devices` (in that order) on sessionThreadsFor threads, in two rounds: each
// session built (phases, allocation table, backward pass and forward pass 1); then, on the calling
// thread, between(pass1) with every device's pass-1 facts in `devices` order (report's plan ranks
// them); then, on the thread that built it, request(i, session), visit(), take() and
// after(i, facts) (the session is gone by then). Returns the facts in `devices` order, the same for
// any thread count; the pass counters end up on the calling thread's, as with a serial loop. Every
// session is alive between the rounds, as serially.
std::vector<DeviceFacts> visitSessions(
    const format::Snapshot& snap, const std::vector<int64_t>& devices,
    const SessionOptions& session_options, size_t threads,
    const std::function<void(const std::vector<const DeviceFacts*>&)>& between,
    const std::function<void(size_t, DeviceSession&)>& request,
    const std::function<void(size_t, DeviceFacts&)>& after);

// What analyzeSnapshot does after the devices, for callers that add the devices themselves
// (report, compare): the job's findings across devices (cross_device.h), with options.findings.
void finishAnalysis(const format::Snapshot& snap, AnalysisResult& result,
                    const AnalyzeOptions& options = {});

// The per-device loops of the other commands, on `threads` threads (0 = the machine's cores; capped
// as analyzeSnapshot is, by sessionThreadsFor), each device into its own slot: the result is the
// one of the serial function named, for any thread count, pass counters included.
struct TimelineOptions;  // timeline.h
struct TimelineResult;
struct ProfileOptions;  // compare.h
struct RunProfile;
// computeTimeline (timeline.h).
TimelineResult computeTimelineOn(const format::Snapshot& snap, const TimelineOptions& options,
                                 size_t threads);
// profileSnapshot (compare.h).
RunProfile profileSnapshotOn(const format::Snapshot& snap, const ProfileOptions& options,
                             size_t threads);
// profileSnapshot's end, for callers that profile the devices themselves (report --baseline):
// the profiles (ascending device) with the job's findings from every device's analysis
// (profileDevice's `analysis`), as profileSnapshot makes them.
struct DeviceProfile;  // compare.h
RunProfile finishProfile(const format::Snapshot& snap, std::vector<DeviceProfile> devices,
                         std::vector<DeviceAnalysis> analyses);
// Asks `session` for the live sets at the three peaks that profileSnapshot reads (compare.h
// PeakKind), as profileSnapshot's sessions ask for them.
void requestProfilePeaks(DeviceSession& session);
// True when `facts` holds the live set at each of those peaks and no moment of it went over the
// session's copy budget (kMaxCopiedBlocks: a live set asked for by someone else would then change
// what the other moments hold).
bool profileFactsComplete(const DeviceFacts& facts);
// The events DeviceSession::requestFindingMoments asks live sets for (session.h findingMoments;
// the OOMs' too, every one: those past kMaxLiveMoments are refused to anyone).
std::vector<int64_t> findingLiveEvents(const DeviceFacts& facts);
// Takes the live sets at `events` out of visited facts again: a moment that holds no layout is
// removed, another keeps its layout without the live set.
void dropLiveSets(DeviceFacts& facts, const std::vector<int64_t>& events);

}  // namespace memforensics::analysis
