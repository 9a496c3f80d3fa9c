// trace_state.h: the allocator state that a run of trace events implies on its own: live
// allocations (with their pending-free flag) and reserved address ranges, per device.
//
// The writer keeps one to write Checkpoint chunks; the reader restores one from a checkpoint and
// applies the events after it to answer "what was live after event N" without decoding the whole
// file. It deliberately knows nothing of what happened before the first event: an allocation made
// before recording began is simply absent (replay/ reconstructs those from the final state).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "common/address_range.h"
#include "common/flat_map.h"
#include "format/trace/trace_format.h"

namespace memforensics::format::trace {

struct LiveAlloc {
  uint64_t requested = 0;
  uint32_t stack = kTraceNoStack;
  bool pending = false;  // free_requested seen, free_completed not yet
  int64_t stream = 0;
};

class DeviceTraceState {
 public:
  void apply(const TraceEvent& e);
  uint64_t events() const { return events_; }
  const U64Map<LiveAlloc>& live() const { return live_; }
  // Reserved address ranges, one per segment_alloc / segment_map as recorded (touching segments
  // stay apart; a range mapped twice counts once; an unmap cuts what it covers out of the ranges
  // it meets). A segment event whose range is empty or wraps the address space changes nothing.
  const RangeSet& reserved() const { return reserved_; }
  uint64_t reservedBytes() const { return reserved_.bytes(); }
  uint64_t requestedBytes() const { return requested_; }

  // For checkpoint decoding: `segments` is address -> bytes as a checkpoint stores it. Returns
  // false (and keeps only the valid ones) when a segment is empty, wraps, or overlaps another.
  bool restore(uint64_t events, U64Map<LiveAlloc> live,
               const std::map<uint64_t, uint64_t>& segments);

 private:
  U64Map<LiveAlloc> live_;
  RangeSet reserved_{RangeSet::Touching::Keep};
  uint64_t events_ = 0;
  uint64_t requested_ = 0;  // live allocations, pending ones included (they still hold the block)
};

// The final segment and block state that the events alone imply, for a trace whose end state was
// not recorded (a killed capture, a capture without the allocator's own snapshot): one segment per
// reserved range, plus one per live allocation outside every reserved range (its segment predates
// the trace; `orphans` counts them), sized estimatedBlockSize(requested) and cut short where the
// next range begins. Blocks are the live allocations, estimatedBlockSize(requested) bytes each
// (cut at the next allocation or the segment end), with inactive blocks filling the gaps: exact for
// segments and requests, an estimate for the block sizes of large-pool blocks the allocator did
// not split. Segment sums follow PyTorch's snapshot() (alloc::StateSums): requested and active
// count pending-free blocks too. Blocks are appended to `blocks`; each segment's first_block
// indexes it.
struct SynthesizedState {
  std::vector<TraceSegment> segments;
  size_t orphans = 0;
};
SynthesizedState synthesizeFinalState(const DeviceTraceState& state, uint32_t device,
                                      std::vector<TraceBlock>& blocks);

// Every device's state, by device: only the devices that have events (one event on device 2^20-1
// made a million empty states, 710 MB).
class TraceState {
 public:
  void apply(const TraceEvent& e) { device(e.device).apply(e); }
  DeviceTraceState& device(uint32_t d) { return devices_[d]; }
  const std::map<uint32_t, DeviceTraceState>& devices() const { return devices_; }

 private:
  std::map<uint32_t, DeviceTraceState> devices_;
};

}  // namespace memforensics::format::trace
