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
  const std::map<uint64_t, uint64_t>& segments() const { return segments_; }  // address -> bytes
  uint64_t reservedBytes() const { return reserved_; }
  uint64_t requestedBytes() const { return requested_; }

  // For checkpoint decoding.
  void restore(uint64_t events, U64Map<LiveAlloc> live, std::map<uint64_t, uint64_t> segments);

 private:
  void unmap(uint64_t addr, uint64_t size);
  U64Map<LiveAlloc> live_;
  std::map<uint64_t, uint64_t> segments_;
  uint64_t events_ = 0;
  uint64_t reserved_ = 0;
  uint64_t requested_ = 0;  // live allocations, pending ones included (they still hold the block)
};

class TraceState {
 public:
  void apply(const TraceEvent& e) { device(e.device).apply(e); }
  DeviceTraceState& device(uint32_t d) {
    if (d >= devices_.size()) devices_.resize(d + 1);
    return devices_[d];
  }
  const std::vector<DeviceTraceState>& devices() const { return devices_; }

 private:
  std::vector<DeviceTraceState> devices_;
};

}  // namespace memforensics::format::trace
