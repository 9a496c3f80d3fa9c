// report_data.h: everything the HTML report draws, computed here so the page never replays a trace.
//
// A pure function of each device's session facts (analysis/session/session.h), so that `report`
// replays every device once for the analysis and the drawings together: the downsampled watermark
// series (timeline.h, from the session's counters after every event), block-map keyframes (the
// layouts the allocator model had at a bounded set of moments: the peaks, each OOM and evenly
// spaced events, copied by the session's one forward pass), and an icicle of live bytes by frame at
// the requested peak (the one frame tree, frame_tree.h). Frames and stacks are shared tables so a
// block can name its stack.
//
// Everything is bounded by ReportDataOptions whatever the input: keyframes, blocks per report
// (small neighbouring blocks of one state are merged into runs, and the run says how many it
// holds), tree nodes and stacks. Every cap that cut something is listed in `caps`, so the page
// can say what it does not show.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "analysis/compare/compare.h"
#include "analysis/frames/frames.h"
#include "analysis/session/blocks.h"
#include "analysis/session/session.h"
#include "analysis/session/timeline.h"
#include "format/model/snapshot.h"
#include "replay/allocator_model.h"
#include "replay/replay.h"
#include "report/html/allocation_view.h"
#include "report/html/map_state.h"
#include "report/html/segment_view.h"
#include "report/html/stepping_view.h"
#include "report/html/whatif_data.h"

namespace memforensics::analysis {

struct MapBlock {
  uint64_t size = 0;       // bytes (a run: the sum of its blocks)
  uint64_t requested = 0;  // requested bytes of an allocated or pending-free block
  MapState state = MapState::Free;
  Category category = Category::Unknown;  // allocated and pending-free blocks only
  int32_t stack = -1;                     // index into ReportData::stacks, -1 = none or capped
  int64_t alloc_event = -1;               // -1: before the trace, free, or a run
  uint32_t count = 1;          // > 1: a run of this many neighbouring small blocks, drawn as one
  uint64_t free_bytes = 0;     // runs: how many of their bytes are free (state = the larger share)
  uint64_t pending_bytes = 0;  // runs: how many are pending-free
};

struct MapSegment {
  uint64_t address = 0;
  uint64_t size = 0;
  int64_t stream = 0;
  std::string pool;  // "small", "large", or "private (a, b)"
  bool expandable = false;
  std::vector<MapBlock> blocks;  // address order, covering the segment
};

struct IcicleNode {
  int32_t frame = -1;   // index into ReportData::frames; -1 for the root and "(no stack)"
  int32_t parent = -1;  // index into the node list; -1 for the root
  uint64_t bytes = 0;   // inclusive live requested bytes
  uint64_t self = 0;    // bytes of blocks whose stack ends here
  uint64_t blocks = 0;
  std::string
      label;  // set instead of a frame for synthetic nodes ("all live memory", "(no stack)")
};

// Where a moment's call tree comes from.
enum class IcicleSource : uint8_t {
  None,    // no call tree at this moment (not copied: a session bound)
  Live,    // the replayer's live set (exact, as the requested peak's)
  Layout,  // the allocator model's allocated blocks at the moment (exact when layout_exact)
};

struct Keyframe {
  int64_t event = -1;  // layout after this event (-1: the start state)
  int64_t time_us = -1;
  std::vector<std::string> labels;  // "requested peak", "OOM 1", ... (empty for evenly spaced ones)
  replay::Counters at;              // model totals at this moment (the replayer's without a layout)
  size_t blocks_before_merge = 0;
  std::vector<MapSegment> segments;  // empty when the file has no segment info
  // The call tree at this moment, so the icicle follows a clicked moment (bounded by
  // kMomentIcicleNodes per device, shared by the keyframes; the requested peak's full tree is
  // DeviceReportData::icicle).
  IcicleSource icicle_source = IcicleSource::None;
  std::vector<IcicleNode> icicle;
  // At an OOM with a layout: the request that failed against its pool's free bytes and largest
  // free block (oomVerdictAt: the figures `blocks --at oom` and the OOM finding give).
  std::optional<OomVerdict> oom;
};

// Call-tree nodes per device for the keyframes' trees, shared by them (at least 100 each), and how
// many keyframes get a tree of their own (each costs a frame tree over the moment's live set: on
// 10,000 distinct deep stacks a tree per keyframe took the report from 4 s to 21 s).
inline constexpr size_t kMomentIcicleNodes = 6000;
inline constexpr size_t kMomentIcicles = 12;

struct DeviceReportData {
  int64_t device = 0;
  DeviceTimeline timeline;
  std::vector<Keyframe> keyframes;  // by event
  // The allocator model's whole-device verdict (session.h ModelFacts): allocs and segment events
  // predicted of the whole trace (first_mismatches left empty).
  replay::ModelCheck model;
  // The block map may be called exact: the model reproduced the whole device and the replay is
  // consistent with the file (ModelFacts::layout_exact). Otherwise the page says "estimate" and
  // estimate_reason why.
  bool layout_exact = false;
  std::string estimate_reason;
  bool final_compared =
      false;                 // the file's final layout of the device was compared with the model's
  bool final_equal = false;  // ... and equal
  size_t streams_omitted = 0;  // streams / pools the timeline did not break down (kMaxBreakdowns)
  size_t pools_omitted = 0;
  int64_t icicle_event = -1;       // the requested peak
  std::vector<IcicleNode> icicle;  // parents before children; node 0 is the root
  // False for files without allocator segments (torch.profiler traces): no block map is drawn,
  // rather than a layout the file does not have; keyframes then carry no segments.
  bool has_segment_info = true;
  // The card's memory when known: the file's device_total_memory, else the card the OOMs imply
  // (analysis::impliedCapacity, the what-if's) (0 = unknown); capacity_basis says which.
  uint64_t capacity_bytes = 0;
  std::string capacity_basis;
  AllocationView allocations;
  SteppingView stepping;             // the block map at every event of a window (stepping_view.h)
  SegmentTimeline segment_timeline;  // segments over time (segment_view.h)
};

struct ReportData {
  std::vector<int64_t> summary_only;  // devices left without drawings (max_detail_devices)
  std::vector<FrameText> frames;
  std::vector<std::vector<int32_t>> stacks;  // frame indices, innermost first
  std::vector<DeviceReportData> devices;
  // What a bound cut, in words; those whose counts describe what is drawn (timeline points, the
  // allocations drawn one by one) are drawnCaps(), stated from the data when the page is written,
  // so a page whose data was halved afterwards never carries the counts of before.
  std::vector<std::string> caps;
  size_t allocation_bound = 0;          // ReportDataOptions::max_drawn_allocations
  uint64_t allocation_bound_bytes = 0;  // ReportDataOptions::allocation_bytes
  // Issue 14 part 5, filled by `report` (report/html/whatif_data.h, viz/whatif.js): the what-if
  // panel of the focus device, and with --baseline the diff against that run.
  report::WhatIfPanel whatif;
  std::optional<DiffResult> baseline_diff;
};

// Per-device bounds shrink as devices are added (see buildReportData), so that the whole report
// stays within one budget.
struct ReportDataOptions {
  std::optional<int64_t> device;
  size_t max_detail_devices = 16;  // devices drawn: those with OOMs first, then by peak reserved
  size_t max_points = 1500;        // timeline buckets per device
  size_t even_keyframes = 40;      // evenly spaced keyframes per device, besides peaks and OOMs
  size_t max_oom_keyframes = 16;   // OOMs with a keyframe per device
  size_t max_blocks = 120000;      // drawn blocks (a run counts 1) + 2 per segment, whole report
  size_t max_icicle_nodes = 3000;  // per device
  size_t max_stacks = 20000;       // stacks named by blocks, in the whole report
  size_t max_frames_per_stack = 48;
  size_t max_phases = 1000;  // phases drawn per device: the longest, in their order
  size_t allocation_bytes = kAllocationViewBytes;  // per device, full share
  size_t max_drawn_allocations = kMaxDrawnAllocations;
  size_t stepping_bytes = kSteppingBytes;  // the whole report, split evenly (stepping_view.h)
};

// What the report draws, decided from pass-1 facts (DeviceSession::facts() before visit(), or the
// visited facts: the same answer): the devices drawn (those with OOMs first, then by peak
// reserved, at most max_detail_devices) and the per-device bounds, which shrink as devices are
// added so that the whole report stays within one budget.
struct ReportPlan {
  std::vector<int64_t> drawn;         // ascending
  std::vector<int64_t> summary_only;  // ascending
  std::vector<int64_t> stepped;       // drawn devices with event stepping, ascending
  size_t candidates = 0;              // devices considered (options.device applied)
  size_t block_budget = 0, max_points = 0, even_keyframes = 0, max_icicle_nodes = 0;
  size_t allocation_bytes = 0, moment_icicle_nodes = 0, stepping_bytes = 0, segment_lives = 0;
  bool draws(int64_t device) const;
  bool steps(int64_t device) const;
};
ReportPlan planReport(const std::vector<const DeviceFacts*>& devices,
                      const ReportDataOptions& options);

// A keyframe moment of one device: the peaks and OOMs (important: half the block budget), the
// end and the evenly spaced ones (labels empty).
struct KeyframeMoment {
  std::vector<std::string> labels;
  bool important = false;
};
std::map<int64_t, KeyframeMoment> keyframeMoments(const DeviceFacts& facts, const ReportPlan& plan,
                                                  const ReportDataOptions& options);

// Asks a session (after construction, before visit()) for what the report reads of its device:
// the layout at every keyframe moment, the live set at the requested peak (the call tree) and the
// counters after every event (the timeline: DeviceSession::requestSeries). A device the plan does
// not draw is asked for nothing. Without segment info
// (Snapshot::has_segment_info false: profiler traces) the keyframe moments ask for the live set
// instead of a layout (their call trees): no block map is drawn for such a file.
void requestReportMoments(const format::Snapshot& snap, DeviceSession& session,
                          const ReportPlan& plan, const ReportDataOptions& options);
// The events requestReportMoments asks live sets for, given the same pass-1 facts, plan and
// options (report --baseline asks a session for more live sets and takes those out again).
std::vector<int64_t> reportLiveEvents(const format::Snapshot& snap, const DeviceFacts& facts,
                                      const ReportPlan& plan, const ReportDataOptions& options);

// The report data: a pure function of the visited facts of every device of the snapshot (or of
// options.device), ascending, built with requestReportMoments (or SessionOptions::series). Nothing
// is replayed here.
ReportData reportDataOf(const format::Snapshot& snap, std::span<const DeviceFacts> facts,
                        const ReportDataOptions& options = {});

// Convenience (tests, fuzzing): one session per device, then reportDataOf.
ReportData buildReportData(const format::Snapshot& snap, const ReportDataOptions& options = {});
// The caps whose counts describe what `data` draws now (see ReportData::caps).
std::vector<std::string> drawnCaps(const ReportData& data);

// The page's over-budget path (report::renderHtmlWithin): data already built, cut as if every
// bound of ReportDataOptions had been halved, without replaying anything. Deterministic; per
// device: the timeline thinned to half its buckets (the new bucket a multiple of the old, so the
// kept points are those computeTimeline would keep; every peak and OOM stays), every other evenly
// spaced keyframe (labelled ones stay), each keyframe's drawn pieces halved by merging runs, the
// lightest half of the call-tree nodes, half of the stepping window; for the whole report, the
// second half of the named stacks (their blocks name none) and the outer half of the longest
// stack's frames. Never below the floors below. Returns what went, for the note (halvingNote).
constexpr size_t kHalvingMinPoints = 64;          // timeline buckets per device
constexpr size_t kHalvingMinKeyframeBlocks = 64;  // drawn pieces per keyframe
constexpr size_t kHalvingMinIcicleNodes = 100;    // per device
constexpr size_t kHalvingMinStacks = 100;         // named stacks in the report
constexpr size_t kHalvingMinFramesPerStack = 8;
constexpr size_t kHalvingMinAllocations = 100;  // drawn allocations per device

struct HalvingCuts {
  uint64_t points = 0, keyframes = 0, blocks_merged = 0, icicle_nodes = 0, stacks = 0,
           stack_frames = 0, allocations = 0, stepped_events = 0, segment_lives = 0;
  HalvingCuts& operator+=(const HalvingCuts& o) {
    points += o.points;
    keyframes += o.keyframes;
    blocks_merged += o.blocks_merged;
    icicle_nodes += o.icicle_nodes;
    stacks += o.stacks;
    stack_frames += o.stack_frames;
    allocations += o.allocations;
    stepped_events += o.stepped_events;
    segment_lives += o.segment_lives;
    return *this;
  }
};
HalvingCuts halveReportData(ReportData& data);
// "the report's bounds were halved N time(s) to keep the page under M bytes: ... left out".
std::string halvingNote(const HalvingCuts& cuts, size_t times, size_t max_bytes);

std::string_view mapStateName(MapState s);

}  // namespace memforensics::analysis
