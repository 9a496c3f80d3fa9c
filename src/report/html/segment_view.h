// segment_view.h: the segment timeline of the HTML report (issue 29 item 6; memory_viz's "Active
// Cached Segment Timeline"): every cudaMalloc'd segment, and every mapped range of an expandable
// reservation, as a band over its lifetime, from the trace's segment events (segment_alloc and
// segment_free, segment_map and segment_unmap). A range freed or unmapped in the trace that no
// event created was there before the trace began (first_event -1); a segment of the file's final
// state that no event created was there all along (first_event and last_event -1). An unmap of
// part of a mapped range ends that part only: the rest stays a band of its own from the same
// start.
//
// The bands are checked against the replay: after every event the live bands' bytes must equal
// the replayed reserved bytes (DeviceFacts::series); `agrees` says whether they did, and the page
// calls the view an estimate otherwise. Bounded by `max_lives` bands per device (the largest stay;
// `left_out` counts the others).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "analysis/session/session.h"
#include "format/model/snapshot.h"

namespace memforensics::analysis {

inline constexpr size_t kMaxSegmentLives = 4000;  // bands per device, full share

struct SegmentLife {
  int64_t first_event = -1;  // segment_alloc / segment_map; -1: before the trace began
  int64_t last_event = -1;   // segment_free / segment_unmap; -1: alive at the end
  int64_t first_time_us = -1, last_time_us = -1;
  uint64_t address = 0;
  uint64_t bytes = 0;
  int64_t stream = 0;
  int32_t stack = -1;  // the creating event's stack (ReportData::stacks), -1 = none
  bool expandable = false;
};

struct SegmentTimeline {
  std::vector<SegmentLife> lives;  // by first event, then address
  bool agrees = false;  // the bands' bytes equal the replayed reserved bytes after every event
  int64_t first_disagreement = -2;  // the first event where they did not (-1: the start, -2: none)
  size_t left_out = 0;              // bands over max_lives, the smallest
};

SegmentTimeline segmentTimelineOf(const format::Snapshot& snap, const DeviceFacts& facts,
                                  size_t max_lives,
                                  const std::function<int32_t(format::StackId)>& stack_index);

}  // namespace memforensics::analysis
