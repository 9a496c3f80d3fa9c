// cupti_stacks.cc: backtrace symbolization and interning (see cupti_stacks.h).
#include "capture/cupti_stacks.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace memforensics::capture::cupti {

StackSymbolizer::StackSymbolizer(format::trace::TraceWriter& writer,
                                 std::vector<std::string> skip_modules)
    : writer_(writer), skip_(std::move(skip_modules)) {}

std::vector<std::string> StackSymbolizer::defaultSkipModules() {
  // The capture machinery, and sanitizer runtimes (ASan intercepts backtrace()).
  return {"libmemforensics_cupti",
          "libcupti",
          "libcuda.so",
          "libcudart",
          "libcuda-",
          "libasan",
          "libubsan",
          "libtsan",
          "liblsan",
          "libclang_rt"};
}

uint32_t StackSymbolizer::frameOf(void* pc, bool innermost) {
  const auto key = reinterpret_cast<uintptr_t>(pc);
  if (auto it = frame_cache_.find(key); it != frame_cache_.end()) return it->second;
  // A return address points after the call; pc - 1 is inside the calling instruction (and inside
  // the right function when the call is the last instruction of a noreturn path).
  void* lookup = innermost ? pc : static_cast<char*>(pc) - 1;
  Dl_info info{};
  std::string file = "??", name;
  uint32_t id;
  if (dladdr(lookup, &info) != 0) {
    if (info.dli_fname != nullptr && info.dli_fname[0] != '\0') file = info.dli_fname;
    bool skip = false;
    for (const auto& s : skip_) {
      if (file.find(s) != std::string::npos) skip = true;
    }
    if (skip) {
      frame_cache_.emplace(key, kSkip);
      return kSkip;
    }
    if (info.dli_sname != nullptr) {
      int status = -1;
      char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
      name = status == 0 && d != nullptr ? d : info.dli_sname;
      std::free(d);
    }
  }
  if (name.empty()) {
    char buf[32];
    const uintptr_t base = reinterpret_cast<uintptr_t>(info.dli_fbase);
    std::snprintf(buf, sizeof buf, "0x%lx",
                  static_cast<unsigned long>(key - (key >= base ? base : 0)));
    name = buf;
  }
  id = writer_.frame(writer_.string(file), writer_.string(name), ~uint64_t{0});
  frame_cache_.emplace(key, id);
  return id;
}

uint32_t StackSymbolizer::intern(std::span<void* const> pcs) {
  frames_tmp_.clear();
  bool leading = true;
  for (size_t i = 0; i < pcs.size(); ++i) {
    uint32_t f = frameOf(pcs[i], i == 0);
    if (f == kSkip) {
      if (leading) continue;
      // A skipped module further out (e.g. a callback from the driver into user code): keep the
      // frame, named after its object, so the stack stays truthful.
      Dl_info info{};
      std::string file =
          dladdr(pcs[i], &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : "??";
      f = writer_.frame(writer_.string(file), writer_.string("??"), ~uint64_t{0});
    }
    leading = false;
    frames_tmp_.push_back(f);
  }
  uint32_t node = format::trace::kTraceRootStack;
  for (size_t i = frames_tmp_.size(); i-- > 0;) node = writer_.stack(node, frames_tmp_[i]);
  return node;
}

}  // namespace memforensics::capture::cupti
