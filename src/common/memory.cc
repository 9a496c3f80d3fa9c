// memory.cc: see memory.h.
#include "common/memory.h"

#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace memforensics {

void adviseHugePages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

AllocatorSettings defaultAllocatorSettings() {
  AllocatorSettings s;
  s.mmap_threshold = size_t{32} << 20;
  s.trim_threshold = size_t{128} << 20;
  s.top_pad = size_t{64} << 20;
  return s;
}

AllocatorSettings configureAllocator(const AllocatorSettings& settings) {
  AllocatorSettings out = settings;
  out.applied = false;
#if defined(__GLIBC__)
  auto set = [](int param, size_t value) {
    if (value == 0) return true;
    if (value > static_cast<size_t>(INT32_MAX)) return false;
    return ::mallopt(param, static_cast<int>(value)) == 1;
  };
  // M_MMAP_THRESHOLD first: setting it also turns off glibc's dynamic adjustment of both
  // thresholds, which would otherwise move them after the first large free.
  bool ok = set(M_MMAP_THRESHOLD, settings.mmap_threshold);
  ok = set(M_TRIM_THRESHOLD, settings.trim_threshold) && ok;
  ok = set(M_TOP_PAD, settings.top_pad) && ok;
  out.applied = ok;
#endif
  return out;
}

}  // namespace memforensics
