// allocator_model.h: a forward model of the CUDA caching allocator's exact block layout per device.
//
// DeviceReplayer knows which blocks are alive; it does not know where the free space is. This model
// keeps every segment with all of its blocks (allocated, pending-free, free) as the allocator does
// (format doc section 8, c10/cuda/CUDACachingAllocator.cpp). The blocks and the allocator's rules
// are the one core of replay/caching_allocator.h; this class drives it with the recorded events.
//
// It is seeded from the reconstructed START state: the segments that exist when the trace begins
// (the file's final segments with segment events undone backward) and the blocks alive then
// (DeviceReplayer's start live set); the gaps between live blocks are single free blocks, because
// free neighbours always coalesce. Then it is driven by the trace: for every alloc it first
// PREDICTS the address the allocator would pick, compares it with the recorded one, and then
// APPLIES the recorded event, so it stays in sync after a mismatch. Segment events are checked the
// same way. On a complete history every prediction should match; on a truncated one the start state
// is only approximate (sizes of blocks alive at the start come from rounding) and mismatches are
// expected.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/allocator_constants.h"
#include "replay/caching_allocator.h"
#include "replay/replay.h"

namespace memforensics::replay {

// Allocator constants: the one table, common/allocator_constants.h (names kept for callers).
inline constexpr uint64_t kModelMinBlockSize = alloc::kMinBlockSize;
inline constexpr uint64_t kModelSmallSize = alloc::kSmallSize;
inline constexpr uint64_t kModelSmallBuffer = alloc::kSmallBuffer;
inline constexpr uint64_t kModelLargeBuffer = alloc::kLargeBuffer;
inline constexpr uint64_t kModelMinLargeAlloc = alloc::kMinLargeAlloc;
inline constexpr uint64_t kModelRoundLarge = alloc::kRoundLarge;

struct Mismatch {
  int64_t event = -1;
  format::Action action = format::Action::Alloc;
  uint64_t recorded = 0;   // address in the trace
  uint64_t predicted = 0;  // address the model expected (0 = none / a new segment)
  std::string why;
};

struct ModelCheck {
  uint64_t allocs = 0, alloc_matches = 0;
  uint64_t segment_events = 0, segment_matches = 0;
  std::vector<Mismatch> first_mismatches;  // at most kMaxMismatches
  static constexpr size_t kMaxMismatches = 8;
  bool complete() const { return alloc_matches == allocs && segment_matches == segment_events; }
};

// Models one device. Construct (seeds the start state), then step() forward like DeviceReplayer.
class DeviceAllocatorModel {
 public:
  // Models snap.trace(device): the events must be in memory (Snapshot::trace refuses a deferred
  // snapshot; a session's model is seeded and reads its replayer's events).
  DeviceAllocatorModel(const format::Snapshot& snap, int64_t device);
  // The same, seeded with the start live set of `seed` (a DeviceReplayer of this device, already
  // constructed): no second backward pass (analysis/session/session.h steps both together). It
  // models the events the seed replays.
  DeviceAllocatorModel(const format::Snapshot& snap, int64_t device, const DeviceReplayer& seed);
  ~DeviceAllocatorModel();
  DeviceAllocatorModel(const DeviceAllocatorModel&) = delete;
  DeviceAllocatorModel& operator=(const DeviceAllocatorModel&) = delete;

  int64_t device() const { return device_; }
  size_t eventCount() const { return events_.size(); }
  const AllocConf& settings() const { return settings_; }

  // Rewinds to the start state (predictions are counted during the first pass over an event only).
  void reset();
  // Checks and applies event `next()`; returns false at the end.
  bool step();
  size_t next() const { return next_; }
  // Replays until `event_index` has been applied (-1: the start state); rewinds when needed.
  void advanceTo(int64_t event_index);
  // Exact layout now: mapped segments in address order (an expandable reservation is reported as
  // one segment per contiguous mapped range, as the snapshot file does).
  std::vector<ModelSegment> layout() const;
  std::vector<ModelSegment> layoutAt(int64_t event_index) {
    advanceTo(event_index);
    return layout();
  }
  // Predictions checked so far (all of them after one full pass).
  const ModelCheck& check() const { return check_; }
  // Steps to the end (from wherever it is) and returns the check of the whole trace.
  const ModelCheck& runCheck();
  // After the last event: "" when layout() equals the file's final segments block by block
  // (address, size, state), else a description of the first difference.
  std::string compareWithFinal() const;
  // The file has at least one segment of this device (a final state to compare with).
  bool hasFinalState() const;
  // The state itself, read-only: every reservation with all of its blocks, mapped or not (the
  // report's event stepping reads the blocks one event changed).
  const CachingAllocator& core() const;

  struct Impl;

 private:
  DeviceAllocatorModel(const format::Snapshot& snap, int64_t device, const DeviceReplayer* seed);

  const format::Snapshot& snap_;
  int64_t device_;
  std::span<const format::Event> events_;
  AllocConf settings_;
  std::unique_ptr<Impl> impl_;
  size_t next_ = 0;
  size_t checked_ = 0;  // events [0, checked_) have been checked once
  ModelCheck check_;
  PassStats* stats_ = nullptr;  // this device's pass counters (replay/pass_stats.h)
};

// Convenience: builds the model for a device and runs the full check (events in memory).
ModelCheck checkAllocatorModel(const format::Snapshot& snap, int64_t device);

// Whether figures derived from the model may be called exact for a device (issue 12, part 5).
// `exact` holds only when every alloc address and every segment event of the trace was predicted
// AND, where the file has a final state for the device, the layout after the last event equals it
// block by block. Anything else is an estimate; `why` says why in one line.
struct ModelVerdict {
  bool exact = false;
  uint64_t allocs = 0, alloc_matches = 0;            // allocs predicted / total
  uint64_t segment_events = 0, segment_matches = 0;  // segment events predicted / total
  bool final_compared = false;  // the file has segments of this device to compare with
  std::string final_diff;       // compareWithFinal(): "" when equal (or not compared)
  std::string why;              // "" when exact
};
// Steps the model to the end (if it is not there), compares with the file's final state, and
// returns the verdict; the model is left after its last event.
ModelVerdict modelVerdict(DeviceAllocatorModel& m);
// Builds a model for the device and returns its verdict (one backward and one forward pass).
ModelVerdict verifyAllocatorModel(const format::Snapshot& snap, int64_t device);

}  // namespace memforensics::replay
