// timeline.h: the `timeline` result: watermark series per device, downsampled, with phases.
//
// A pure function of a device's session facts (analysis/session/session.h): the replayed counters
// after every event (reserved, allocated, requested, pending-free bytes), the same per stream and
// per memory pool when a device has more than one, the exact peaks and OOMs (as `analyze` reports
// them), and the phases of detectPhases() with the peaks inside each. Long traces are downsampled
// into at most `max_points` buckets of consecutive points; per bucket the points where requested
// bytes reach their bucket minimum and maximum and where reserved, allocated and pending-free bytes
// reach their maximum are kept, with the start state, every OOM event and every peak event, so
// every exact peak survives.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/session/phases.h"
#include "analysis/session/session.h"
#include "format/model/snapshot.h"
#include "replay/replay.h"

namespace memforensics::analysis {

struct TimelinePoint {
  int64_t event = -1;    // state after this event; -1 = the start state, before the first event
  int64_t time_us = -1;  // the event's time; -1 when the file has none (and for the start state)
  replay::Counters at;
};

// One stream's or one pool's share of the device: the same four counters, sampled at the same
// events as the device series, and its own exact peaks over every event.
struct TimelineBreakdown {
  int64_t stream = 0;                        // streams: the cudaStream_t as int
  std::pair<uint64_t, uint64_t> pool{0, 0};  // pools: the pool_id tuple
  std::vector<TimelinePoint> points;
  replay::Peak peak_reserved, peak_requested, peak_allocated, peak_pending;
};

struct PhaseStats {
  Phase phase;
  replay::Peak peak_requested;  // highest value after an event inside the phase (event -1 = empty)
  replay::Peak peak_reserved;
};

struct DeviceTimeline {
  int64_t device = 0;
  size_t events = 0;
  bool has_times = false;
  size_t total_points = 0;  // events + 1 (the start state)
  size_t bucket_size = 1;   // consecutive points per bucket; 1 = nothing dropped
  bool downsampled = false;
  std::vector<TimelinePoint> points;  // the kept points, in event order
  replay::Peak peak_reserved, peak_requested, peak_allocated, peak_active;
  uint64_t peak_pending_bytes = 0;
  std::vector<replay::OomEvent> ooms;
  std::vector<TimelineBreakdown> streams;  // empty unless the trace uses more than one stream
  std::vector<TimelineBreakdown> pools;    // empty unless it uses more than one pool
  size_t streams_omitted = 0;  // streams beyond TimelineOptions::max_breakdowns, not broken down
  size_t pools_omitted = 0;    // pools beyond it
  std::vector<PhaseStats> phases;
  std::vector<uint64_t> requested_columns;  // max requested bytes per equal slice of the trace
};

struct TimelineResult {
  std::string path;
  std::vector<DeviceTimeline> devices;
};

// Streams (and, separately, pools) with their own series per device: those with the highest peak
// reserved bytes. Each costs one sampled series, so a file naming 100,000 streams stays linear.
constexpr size_t kMaxBreakdowns = 64;

struct TimelineOptions {
  std::optional<int64_t> device;           // only this device
  size_t max_points = 2000;                // buckets at most (>= 1)
  size_t columns = 64;                     // width of requested_columns (the sparkline)
  size_t max_breakdowns = kMaxBreakdowns;  // streams and pools broken down per device
};

// The timeline of one device: a pure function of its facts (which must hold the series:
// SessionOptions::series or DeviceSession::requestSeries).
DeviceTimeline timelineOf(const format::Snapshot& snap, const DeviceFacts& facts,
                          const TimelineOptions& options = {});
// Convenience: one session per device (a backward pass and one forward pass each).
TimelineResult computeTimeline(const format::Snapshot& snap, const TimelineOptions& options = {});

}  // namespace memforensics::analysis
