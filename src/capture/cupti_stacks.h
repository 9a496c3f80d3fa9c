// cupti_stacks.h: host backtraces (raw return addresses) -> interned trace stacks.
//
// The CUPTI injection library captures `backtrace()` at the entry of every CUDA memory API call
// (cheap: no symbols) and symbolizes only when the matching activity record is written, on
// CUPTI's buffer thread. A frame is (shared object path, demangled symbol, unknown line): dladdr
// sees exported/dynamic symbols only, so a frame of a stripped or static function is named by its
// offset in the object ("0x1a2b"), which `addr2line -e OBJECT 0x1a2b` resolves offline.
//
// Frames at the innermost end that belong to the capture machinery (this library, libcupti, the
// CUDA driver and runtime, a sanitizer runtime) are dropped, so a stack starts at the caller of
// cudaMalloc & co.
// No CUPTI dependency: tested on machines without CUDA.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/trace/trace_writer.h"

namespace memforensics::capture::cupti {

class StackSymbolizer {
 public:
  // `skip_modules`: substrings of object paths whose frames are dropped at the innermost end.
  StackSymbolizer(format::trace::TraceWriter& writer, std::vector<std::string> skip_modules);

  // `pcs`: return addresses innermost first, as backtrace() gives them. Returns the trace stack id
  // (kTraceRootStack when every frame was dropped).
  uint32_t intern(std::span<void* const> pcs);

  // The default skip list of the injection library.
  static std::vector<std::string> defaultSkipModules();

 private:
  static constexpr uint32_t kSkip = ~uint32_t{0};
  uint32_t frameOf(void* pc, bool innermost);

  format::trace::TraceWriter& writer_;
  std::vector<std::string> skip_;
  std::unordered_map<uintptr_t, uint32_t> frame_cache_;  // pc -> frame id, or kSkip
  std::vector<uint32_t> frames_tmp_;
};

}  // namespace memforensics::capture::cupti
