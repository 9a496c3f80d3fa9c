// torch_entry.cc: see torch_entry.h.
#include "capture/torch_entry.h"

namespace memforensics::capture {

CaptureRecord toRecord(const TorchEntry& e) noexcept {
  CaptureRecord r;
  r.addr = e.addr;
  r.size = e.size;
  r.stream = e.stream;
  r.ticks = e.time_ticks;
  r.pool_a = e.pool_a;
  r.pool_b = e.pool_b;
  r.device = e.device < 0 ? UINT32_MAX : static_cast<uint32_t>(e.device);
  r.action =
      e.action >= 0 && e.action < kTorchActionCount ? static_cast<uint8_t>(e.action) : uint8_t{10};
  r.flags = static_cast<uint8_t>((e.has_time ? kHasTime : 0) | (e.compile_na ? kCompileNA : 0));
  return r;
}

format::trace::TraceEvent toTraceEvent(const CaptureRecord& r, int64_t time_us) {
  format::trace::TraceEvent e;
  e.addr = r.addr;
  e.size = r.size;
  e.stream = r.stream;
  e.device = r.device;
  e.action = r.action > 10 ? 10 : r.action;
  e.time_us = (r.flags & kHasTime) ? time_us : -1;
  return e;
}

}  // namespace memforensics::capture
