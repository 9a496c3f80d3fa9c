// memory.h: page-level hints for the few very large arrays a snapshot load builds.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/prefault.h"

namespace memforensics {

// Asks the kernel to back [p, p + bytes) with transparent huge pages (Linux, THP in "madvise"
// mode, the common default). Filling a freshly reserved 100 MB array then takes ~50 page faults
// instead of ~25,000; on the project machine first-touch faults were a third of a large load.
// A hint: harmless where unsupported.
void adviseHugePages(void* p, size_t bytes);

// The process-wide malloc settings `configureAllocator` applies (glibc's mallopt).
struct AllocatorSettings {
  size_t mmap_threshold = 0;  // blocks at least this large are mapped on their own
  size_t trim_threshold = 0;  // free memory at an arena's top past this is given back
  size_t top_pad = 0;         // what an arena grows by beyond a request, and keeps when trimmed
  bool applied = false;       // false where the allocator is not glibc's (then nothing was set)
};

// What `configureAllocator` sets: blocks under 8 MiB come from the arenas (not mapped on their
// own), so that what one device's analysis frees is what the next device's reuses instead of
// memory unmapped and faulted in again (a first touch of a 4 KB page costs ~13 us on the project
// machine, reused memory runs at memory speed); an arena keeps 64 MiB at its top when it gives
// memory back and gives back once more than 128 MiB is free there, so a long run holds at most
// about that per arena of what it freed. Blocks of 8 MiB and more (the loaders' large arrays, which
// get the huge-page hint from that size) are still mapped on their own and unmapped when freed:
// with 32 MiB the copies of growing arrays stayed in the arenas and the 498 MB pickle's peak RSS
// was 506-514 MB instead of 437-447 MB.
AllocatorSettings defaultAllocatorSettings();

// Applies `settings` to the process's allocator (call once at startup, before the threads
// start); returns them with `applied` set where the allocator took them. Settings of 0 are left
// at the allocator's defaults.
AllocatorSettings configureAllocator(
    const AllocatorSettings& settings = defaultAllocatorSettings());

// Transparent huge pages for the allocator's arenas (what glibc's GLIBC_TUNABLES
// glibc.malloc.hugetlb=1 does, which users do not set): a first touch of fresh heap memory then
// costs one fault per 2 MB instead of one per 4 KB. Off until the process handles a large input:
// the first adviseHugePages of at least 8 MiB (a loader reserving a large array) turns it on, so a
// small file's heap stays in 4 KB pages (its RSS would grow by a few partly used huge pages).
// Once on: the main arena's heap is advised as far as it has grown, and again at each large
// array; each pool thread advises its own arena's heap when it starts
// (adviseThreadHeapHugePages, called by common/parallel.cc). Hints: nothing changes where they
// are unsupported; nothing is advised unless configureAllocator's settings were applied (glibc's
// own arenas: not under a sanitizer's or a preloaded allocator), and a thread's heap only when it
// is the aligned mapping glibc makes for one.

// Whether the arenas' huge-page mode is on (see above).
bool heapHugePagesOn();

// Turns the mode on (once; later calls re-advise the main heap as it has grown since) and
// returns the bytes of the main arena's heap advised, 0 where nothing could be (the mode stays
// off where configureAllocator was not applied).
size_t enableHeapHugePages();

// With the mode on, advises the heap of the calling thread's arena (a glibc arena other than the
// main one is one 64 MiB reservation, aligned to its size); returns the bytes advised (0 when the
// mode is off, the thread uses the main arena, or nothing could be).
size_t adviseThreadHeapHugePages();

template <typename T>
void reserveHuge(std::vector<T>& v, size_t n) {
  v.reserve(n);
  if (v.capacity() * sizeof(T) >= (size_t{8} << 20))
    adviseHugePages(v.data(), v.capacity() * sizeof(T));
}

// Growth of the few very large arrays a load fills without knowing their final size (the pickle
// reader's events, memo, nodes and trace lists; the native reader's events): when full, an array
// grows at least twofold, and up to `predicted` (what the part of the input read so far predicts
// for the whole input) when that is more, but never past kMaxGrowthFactor times its capacity nor
// past `most` elements in one step. An array that fills the input thus reaches its final size in
// three or four steps and its last copy is small (the copy of a doubling array at the end is what
// set a large load's peak memory: 676 -> 556 MB on a 4.8 M-event pickle, docs/performance.md); a
// forged or padded input gets at most 16 times what it filled, as address space that is never
// touched. The new buffer gets the huge-page hint before the old elements are copied in. With a
// Prefaulter, the new buffer is tracked in `slot` (its pages populated on the prefaulter's thread
// ahead of the writer, prefault.h) before the old one is freed.
inline constexpr size_t kMaxGrowthFactor = 16;

template <typename T>
void growFor(std::vector<T>& v, size_t need, size_t predicted, size_t most,
             Prefaulter* prefaulter = nullptr, size_t slot = 0) {
  if (v.capacity() - v.size() >= need) return;
  size_t cap = std::max(v.capacity() * 2, std::max<size_t>(v.size() + need, 4096));
  if (predicted > cap) {
    cap = std::max(cap, std::min({predicted, v.capacity() * kMaxGrowthFactor, most}));
  }
  std::vector<T> bigger;
  bigger.reserve(cap);
  if (bigger.capacity() * sizeof(T) >= (size_t{8} << 20)) {
    adviseHugePages(bigger.data(), bigger.capacity() * sizeof(T));
  }
  if (prefaulter != nullptr) {
    // The copy's second half is populated on the prefaulter's thread while this one copies (and
    // faults in) the first.
    size_t half = v.size() / 2;
    prefaulter->track(slot, bigger.data(), bigger.capacity() * sizeof(T), half * sizeof(T),
                      v.size() * sizeof(T));
    bigger.insert(bigger.end(), v.begin(), v.begin() + static_cast<ptrdiff_t>(half));
    bigger.insert(bigger.end(), v.begin() + static_cast<ptrdiff_t>(half), v.end());
  } else {
    bigger.insert(bigger.end(), v.begin(), v.end());
  }
  v.swap(bigger);
}

// have * total / done, plus 1/8: what an array of `have` elements after `done` of `total` input
// bytes is heading for (0 when nothing was read yet).
inline size_t predictedSize(size_t have, uint64_t done, uint64_t total) {
  if (done == 0) return 0;
  double x = static_cast<double>(have) * (static_cast<double>(total) / static_cast<double>(done));
  x *= 1.125;
  return x >= 1e18 ? static_cast<size_t>(1e18) : static_cast<size_t>(x);
}

}  // namespace memforensics
