// memory.cc: see memory.h.
#include "common/memory.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__GLIBC__)
#include <malloc.h>
#include <unistd.h>
#endif

namespace memforensics {

namespace {

std::atomic<bool> g_heap_huge{false};
// Whether configureAllocator's settings were taken: the arenas are glibc's (not a sanitizer's or
// a preloaded allocator's, which ignore mallopt or keep their memory elsewhere).
std::atomic<bool> g_glibc_arenas{false};
std::mutex g_heap_mu;

#if defined(__linux__) && defined(__GLIBC__) && defined(MADV_HUGEPAGE)
// [begin, end) of the process's brk heap (the main arena), from /proc/self/maps.
bool mainHeapRange(uintptr_t& begin, uintptr_t& end) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  char line[512];
  bool found = false;
  // The heap is one mapping or, once advised in part, several adjacent ones.
  while (std::fgets(line, sizeof line, f) != nullptr) {
    bool heap = std::strstr(line, "[heap]") != nullptr;
    if (!heap) {
      if (found) break;
      continue;
    }
    unsigned long long b = 0, e = 0;
    if (std::sscanf(line, "%llx-%llx", &b, &e) != 2 || e <= b) break;
    if (!found)
      begin = static_cast<uintptr_t>(b);
    else if (static_cast<uintptr_t>(b) != end)
      break;
    end = static_cast<uintptr_t>(e);
    found = true;
  }
  std::fclose(f);
  return found;
}

// [begin, end) of the mapping of /proc/self/maps that holds `addr`.
bool mappingOf(uintptr_t addr, uintptr_t& begin, uintptr_t& end) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  char line[512];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long b = 0, e = 0;
    if (std::sscanf(line, "%llx-%llx", &b, &e) != 2) continue;
    if (addr >= b && addr < e) {
      begin = static_cast<uintptr_t>(b);
      end = static_cast<uintptr_t>(e);
      found = true;
    }
  }
  std::fclose(f);
  return found;
}

std::atomic<void*> g_sink{nullptr};  // keeps the compiler from eliding the probing malloc
#endif

}  // namespace

bool heapHugePagesOn() {
  return g_heap_huge.load(std::memory_order_relaxed);
}

size_t enableHeapHugePages() {
#if defined(__linux__) && defined(__GLIBC__) && defined(MADV_HUGEPAGE)
  // Only for glibc's own arenas as configureAllocator set them up: another allocator's memory
  // (ASan's, a preloaded jemalloc's) is not where these hints would land.
  if (!g_glibc_arenas.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lock(g_heap_mu);
  g_heap_huge.store(true, std::memory_order_relaxed);
  // The brk heap as far as it has grown (with configureAllocator's 64 MiB top pad, it grows in
  // steps of at least that). It is not grown ahead: blocks that grew it by 30 MiB before advising
  // (malloc'd and freed at once) raised the 498 MB pickle's peak RSS from 430-450 MB to 515-532
  // MB and its page faults from about 13,000 to 24,000, with no gain in time.
  uintptr_t begin = 0, end = 0;
  if (!mainHeapRange(begin, end)) return 0;
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  uintptr_t b = (begin + kHuge - 1) & ~(kHuge - 1);
  uintptr_t e = end & ~(kHuge - 1);
  if (e <= b) return 0;
  if (::madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE) != 0) return 0;
  return e - b;
#else
  return 0;
#endif
}

size_t adviseThreadHeapHugePages() {
#if defined(__linux__) && defined(__GLIBC__) && defined(MADV_HUGEPAGE)
  if (!heapHugePagesOn()) return 0;
  constexpr uintptr_t kHeapMax = uintptr_t{64} << 20;  // glibc's HEAP_MAX_SIZE on 64-bit
  void* probe = std::malloc(64);
  if (probe == nullptr) return 0;
  g_sink.store(probe, std::memory_order_relaxed);
  auto at = reinterpret_cast<uintptr_t>(probe);
  std::free(probe);
  uintptr_t begin = 0, end = 0;
  {
    std::lock_guard<std::mutex> lock(g_heap_mu);
    if (!mainHeapRange(begin, end)) return 0;
  }
  if (at >= begin && at < end) return 0;  // the main arena: enableHeapHugePages advised it
  uintptr_t base = at & ~(kHeapMax - 1);
  // A glibc thread heap's writable part is one mapping from the aligned base, within the
  // reservation; anything else (a mapping the allocator fell back to) is left alone.
  uintptr_t map_begin = 0, map_end = 0;
  if (!mappingOf(at, map_begin, map_end) || map_begin != base || map_end - map_begin > kHeapMax)
    return 0;
  // The whole reservation (its part not yet writable too: mprotect keeps the advice).
  if (::madvise(reinterpret_cast<void*>(base), kHeapMax, MADV_HUGEPAGE) != 0) return 0;
  return kHeapMax;
#else
  return 0;
#endif
}

void adviseHugePages(void* p, size_t bytes) {
  // A large array: the input is large, so the heap gets huge pages too (and is advised again as
  // far as it has grown since the last large array).
  if (bytes >= (size_t{8} << 20)) enableHeapHugePages();
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
  s.mmap_threshold = size_t{8} << 20;
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
  g_glibc_arenas.store(ok, std::memory_order_relaxed);
#endif
  return out;
}

}  // namespace memforensics
