// torch_entry.h: the fields of c10's allocator TraceEntry that the capture uses, as a plain struct,
// and their conversion into a CaptureRecord and a trace event. Plain C++ so that the conversion is
// tested on machines without LibTorch; torch_hook.cc fills a TorchEntry from the real TraceEntry
// (a handful of field copies) and calls toRecord().
//
// c10::cuda::CUDACachingAllocator::TraceEntry (2.2+; c10::CachingDeviceAllocator in recent
// versions) has: action_ (enum, order ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC,
// SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, OOM, ANNOTATE (2.14)), device_, addr_ (free
// bytes for OOM; int64_t before 2.6, size_t after), context_ (shared_ptr<GatheredContext>, non-null
// only when history recording keeps alloc stacks), stream_ (cudaStream_t), size_, time_ (a union:
// in a tracker callback it holds the raw approximate clock, approx_t_), mempool_ (2.8+),
// compile_context_ (2.8+), user_metadata_ (2.10+). The format's Action values use the same order,
// so the action converts by value. See ../shared/docs/pytorch-snapshot-format.md section 7.
#pragma once

#include <cstdint>

#include "capture/record.h"
#include "format/trace/trace_format.h"

namespace memforensics::capture {

struct TorchEntry {
  int action = 0;           // c10 TraceEntry::Action ordinal
  int device = 0;           // c10::DeviceIndex
  uint64_t addr = 0;        // addr_ as unsigned (OOM: free device bytes)
  uint64_t size = 0;        // size_
  int64_t stream = 0;       // stream_ as an integer
  uint64_t time_ticks = 0;  // time_.approx_t_ (raw clock in the tracker)
  bool has_time = true;
  uint64_t pool_a = 0, pool_b = 0;  // mempool_ where the version has it
};

// c10 action ordinals that the format knows (0-9); anything else becomes `unknown` (10).
inline constexpr int kTorchActionCount = 10;
inline constexpr int kTorchOom = 8;

// The ring record for an entry: action mapped by value (unknown ones to 10), negative devices
// (never produced by c10 for CUDA, but a DeviceIndex is signed) to an out-of-range ordinal that
// the recorder counts as dropped.
CaptureRecord toRecord(const TorchEntry& e) noexcept;

// The trace event a record becomes once its time is converted (what the writer thread does, minus
// stack interning). `time_us` -1: no time.
format::trace::TraceEvent toTraceEvent(const CaptureRecord& r, int64_t time_us);

}  // namespace memforensics::capture
