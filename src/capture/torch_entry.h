// torch_entry.h: the fields of c10's allocator TraceEntry that the capture uses, as a plain struct,
// and their conversion into a CaptureRecord and a trace event. Plain C++ so that the conversion is
// tested on machines without LibTorch; torch_hook.cc fills a TorchEntry from the real TraceEntry
// (a handful of field copies) and calls toRecord().
//
// c10::cuda::CUDACachingAllocator::TraceEntry (2.2+; c10::CachingDeviceAllocator in recent
// versions) has: action_ (enum, order ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC,
// SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, OOM, ANNOTATE (2.14)), device_, addr_ (free
// bytes for OOM; int64_t before 2.6, size_t after), context_ (shared_ptr<GatheredContext>, non-null
// only when history recording keeps alloc stacks), stream_ (cudaStream_t; void* in 2.14), size_,
// time_ (a union: in a tracker callback it holds the raw approximate clock, approx_t_), mempool_
// (2.8+), compile_context_ (2.8+), user_metadata_ (2.10+; ANNOTATE's payload in 2.14). The format's
// Action values use the same order, so the action converts by value. See
// ../shared/docs/pytorch-snapshot-format.md section 7.
//
// The templates below read whichever of those fields the TraceEntry type has (checked at compile
// time), so one torch_hook.cc builds against every PyTorch from 2.2 on. They need no LibTorch:
// tests instantiate them with stand-ins shaped like the 2.6 and 2.14 types, and
// scripts/torch-headers-check.sh checks what they detect in real headers
// (tests/capture/torch_headers_probe.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "capture/record.h"
#include "format/trace/trace_format.h"

namespace memforensics::capture {

// What a c10 TraceEntry type has (E = c10's TraceEntry, or a stand-in in tests).
template <typename E>
inline constexpr bool kEntryHasMempool = requires(const E& e) {
  e.mempool_.first;
  e.mempool_.second;
};
template <typename E>
inline constexpr bool kEntryHasCompileContext = requires(const E& e) {
  std::string_view(e.compile_context_);
};
template <typename E>
inline constexpr bool kEntryHasUserMetadata = requires(const E& e) {
  std::string_view(e.user_metadata_);
};
template <typename E>
inline constexpr bool kEntryHasAnnotate = requires {
  E::ANNOTATE;
};
// snapshot(MempoolId_t, bool include_traces) (PyTorch 2026, PR #172672): A = the allocator class.
template <typename A>
inline constexpr bool kSnapshotTakesIncludeTraces = requires(A& a) {
  a.snapshot({0, 0}, false);
};

struct TorchEntry {
  int action = 0;           // c10 TraceEntry::Action ordinal
  int device = 0;           // c10::DeviceIndex
  uint64_t addr = 0;        // addr_ as unsigned (OOM: free device bytes)
  uint64_t size = 0;        // size_
  int64_t stream = 0;       // stream_ as an integer
  uint64_t time_ticks = 0;  // time_.approx_t_ (raw clock in the tracker)
  bool has_time = true;
  uint64_t pool_a = 0, pool_b = 0;  // mempool_ where the version has it
  bool compile_na = false;          // compile_context_ is "N/A" (2.8+ when contexts are off)
};

// c10 action ordinals that the format knows (0-9); anything else becomes `unknown` (10).
inline constexpr int kTorchActionCount = 10;
inline constexpr int kTorchOom = 8;

// The ring record for an entry: action mapped by value (unknown ones to 10), negative devices
// (never produced by c10 for CUDA, but a DeviceIndex is signed) to an out-of-range ordinal that
// the recorder counts as dropped.
CaptureRecord toRecord(const TorchEntry& e) noexcept;

// The trace event a record becomes once its time is converted (what the writer thread does, minus
// stack and string interning). `time_us` -1: no time.
format::trace::TraceEvent toTraceEvent(const CaptureRecord& r, int64_t time_us);

// The fields of a TraceEntry, whatever its version: fields that appeared later are read only when
// the type has them.
template <typename E>
TorchEntry fromC10(const E& te) noexcept {
  TorchEntry t;
  t.action = static_cast<int>(te.action_);
  t.device = static_cast<int>(te.device_);
  t.addr = static_cast<uint64_t>(te.addr_);
  t.size = static_cast<uint64_t>(te.size_);
  t.stream = static_cast<int64_t>(reinterpret_cast<intptr_t>(te.stream_));
  t.time_ticks = static_cast<uint64_t>(te.time_.approx_t_);  // raw clock inside a tracker
  if constexpr (kEntryHasMempool<E>) {
    t.pool_a = static_cast<uint64_t>(te.mempool_.first);
    t.pool_b = static_cast<uint64_t>(te.mempool_.second);
  }
  if constexpr (kEntryHasCompileContext<E>) t.compile_na = te.compile_context_ == "N/A";
  return t;
}

// `s` cut to at most kMaxRecordTextBytes, at a UTF-8 character boundary.
// (Text that is not UTF-8 is cut at the limit: at most 3 bytes are stepped back.)
inline std::string_view cutRecordText(std::string_view s) noexcept {
  if (s.size() <= kMaxRecordTextBytes) return s;
  size_t n = kMaxRecordTextBytes;
  while (n > kMaxRecordTextBytes - 3 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  if ((static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) n = kMaxRecordTextBytes;
  return s.substr(0, n);
}

// The entry's strings when it has any beyond compile_context "N/A" (that one is a flag, see
// fromC10); null otherwise, and when the copy cannot be allocated (the event keeps no text then).
// `last` is the previous entry's text on the same device (PyTorch stamps a thread's user metadata
// on every entry while it is set): when the strings are the same it is shared, not copied.
template <typename E>
std::shared_ptr<const RecordText> textOf(
    const E& te, const std::shared_ptr<const RecordText>& last = {}) noexcept {
  std::string_view compile, user;
  if constexpr (kEntryHasCompileContext<E>) {
    compile = te.compile_context_;
    if (compile == "N/A") compile = {};
  }
  if constexpr (kEntryHasUserMetadata<E>) user = te.user_metadata_;
  if (compile.empty() && user.empty()) return nullptr;
  compile = cutRecordText(compile);
  user = cutRecordText(user);
  if (last && last->compile_context == compile && last->user_metadata == user) return last;
  try {
    auto t = std::make_shared<RecordText>();
    t->compile_context = compile;
    t->user_metadata = user;
    return t;
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

// The allocator's state for the final segments. Where the version lets it, without the trace
// history: otherwise snapshot() copies PyTorch's whole history ring (up to max_entries entries),
// which the trace already holds.
template <typename A>
auto snapshotWithoutTraces(A& allocator) {
  if constexpr (kSnapshotTakesIncludeTraces<A>) {
    return allocator.snapshot({0, 0}, false);
  } else {
    return allocator.snapshot();
  }
}

}  // namespace memforensics::capture
