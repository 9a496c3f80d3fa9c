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
struct Range {
  uintptr_t begin = 0, end = 0;
  bool found = false;
};

// One walk of /proc/self/maps: the process's brk heap (the main arena: one mapping or, once
// advised in part, several adjacent ones) and the mapping that holds `addr` (0: none asked for).
bool readMaps(uintptr_t addr, Range& heap, Range& holder) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  char line[512];
  bool heap_done = false;
  while ((!heap_done || (addr != 0 && !holder.found)) &&
         std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long b = 0, e = 0;
    if (std::sscanf(line, "%llx-%llx", &b, &e) != 2 || e <= b) continue;
    if (addr != 0 && !holder.found && addr >= b && addr < e)
      holder = {static_cast<uintptr_t>(b), static_cast<uintptr_t>(e), true};
    if (heap_done) continue;
    if (std::strstr(line, "[heap]") == nullptr) {
      heap_done = heap.found;
      continue;
    }
    if (heap.found && static_cast<uintptr_t>(b) != heap.end) {
      heap_done = true;
      continue;
    }
    if (!heap.found) heap.begin = static_cast<uintptr_t>(b);
    heap.end = static_cast<uintptr_t>(e);
    heap.found = true;
  }
  std::fclose(f);
  return true;
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
  Range heap, unused;
  if (!readMaps(0, heap, unused) || !heap.found) return 0;
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  uintptr_t b = (heap.begin + kHuge - 1) & ~(kHuge - 1);
  uintptr_t e = heap.end & ~(kHuge - 1);
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
  Range heap, holder;
  {
    std::lock_guard<std::mutex> lock(g_heap_mu);
    if (!readMaps(at, heap, holder) || !heap.found) return 0;
  }
  if (at >= heap.begin && at < heap.end)
    return 0;  // the main arena: enableHeapHugePages advised it
  uintptr_t base = at & ~(kHeapMax - 1);
  // A glibc thread heap's writable part is one mapping from the aligned base, within the
  // reservation; anything else (a mapping the allocator fell back to) is left alone.
  if (!holder.found || holder.begin != base || holder.end - holder.begin > kHeapMax) return 0;
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
