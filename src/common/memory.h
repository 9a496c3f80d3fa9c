// memory.h: page-level hints for the few very large arrays a snapshot load builds, and for its
// mapped input. Every platform-specific call the loaders make for speed (madvise, mallopt) lives
// in memory.cc; each stayed because a same-run A/B showed it pays (docs/performance.md, issue 27
// part 2), and each is a hint that changes nothing where it is unsupported.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace memforensics {

// Arrays of at least this many bytes get the huge-page hint (and turn on the heap's mode below).
inline constexpr size_t kLargeArrayBytes = size_t{8} << 20;

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

// Transparent huge pages for the main arena's heap (what glibc's GLIBC_TUNABLES
// glibc.malloc.hugetlb=1 does, which users do not set): a first touch of fresh heap memory then
// costs one fault per 2 MB instead of one per 4 KB. Off until the process handles a large input:
// the first adviseHugePages of at least 8 MiB (a loader reserving a large array) turns it on, so a
// small file's heap stays in 4 KB pages. Once on, the heap is advised from where it was when
// configureAllocator ran to where it has grown, at each large array. Nothing is advised unless
// configureAllocator's settings were applied (glibc's own arenas: not under a sanitizer's or a
// preloaded allocator). Measured (docs/performance.md, issue 27 part 2): the native trace's
// analysis 17% faster; the other arenas' heaps (pool threads) gained nothing and are left alone.

// Whether the heap's huge-page mode is on (see above).
bool heapHugePagesOn();

// Turns the mode on (once; later calls re-advise the heap as it has grown since) and returns the
// bytes of the heap advised, 0 where nothing could be (the mode stays off where
// configureAllocator was not applied).
size_t enableHeapHugePages();

// Gives the pages of [p, p + bytes) of a read-only file mapping back (they are read again from
// the page cache if touched): a loader drops the input it has passed.
void releaseMappedPages(const void* p, size_t bytes);

// A mapped input that shrinks while it is read (another process truncated it, its disk went
// away) raises SIGBUS at the first page past the new end, which would kill the process with no
// word. With this handler installed (once, at start-up), a SIGBUS for an address inside an input
// registered with MappedInput ends the process with one line on stderr saying what happened and
// exit status 2, like any other unreadable input. Any other SIGBUS (another cause, another
// address, a signal sent by kill) keeps its default action. Not installed in a build with
// AddressSanitizer, whose runtime reports SIGBUS itself.
void installMappedInputFaultHandler();
// The message that handler prints (tests match it).
inline constexpr const char* kMappedInputFaultMessage =
    "memforensics: error: an input file changed while it was being read (truncated by another "
    "process?)\n";

// Registers [p, p + bytes), a mapping of an input file, with the handler above while it lives (at
// most kMaxMappedInputs at once; more are not registered, and a fault in them stays a SIGBUS).
class MappedInput {
 public:
  static constexpr size_t kMaxMappedInputs = 8;
  MappedInput(const void* p, size_t bytes);
  ~MappedInput();
  MappedInput(const MappedInput&) = delete;
  MappedInput& operator=(const MappedInput&) = delete;

 private:
  size_t slot_ = kMaxMappedInputs;  // kMaxMappedInputs: not registered
};

// The pages of a read-only file mapping [begin, end), mapped on a thread of its own a bounded
// distance ahead of a reader that reads it front to back. Each page a parse reads first costs a
// fault that maps it (16 pages per fault with the kernel's fault-around); madvise
// MADV_POPULATE_READ (Linux 5.14 and later) maps them without the faults, off the parse thread.
// It never changes a byte. It stays at most kWindow bytes ahead of the position the reader
// reported (advance) and never behind it, so pages the reader releases behind itself
// (releaseMappedPages) stay released and resident memory grows by at most the window. Where the
// kernel refuses, or the input is under kMinBytes, it does nothing and the reader faults the pages
// in itself. Measured on the 323 MB pickle: 5% of the load (docs/performance.md, issue 27 part 2).
class InputPrefetcher {
 public:
  static constexpr size_t kMinBytes = size_t{16} << 20;
  static constexpr uintptr_t kWindow = uintptr_t{8} << 20;

  InputPrefetcher(const uint8_t* begin, const uint8_t* end);
  ~InputPrefetcher();
  InputPrefetcher(const InputPrefetcher&) = delete;
  InputPrefetcher& operator=(const InputPrefetcher&) = delete;

  // The reader has read up to p.
  void advance(const uint8_t* p);
  // Returns once the thread has ended: before the input may be unmapped.
  void stop();
  // Bytes mapped ahead so far.
  uint64_t populatedBytes() const { return populated_.load(std::memory_order_relaxed); }

 private:
  void loop();

  const uintptr_t begin_;
  const uintptr_t end_;
  std::atomic<uintptr_t> pos_{0};
  std::atomic<bool> waiting_{false};
  std::atomic<uint64_t> populated_{0};
  std::atomic<uintptr_t> done_seen_{0};  // where the thread stopped to wait (a hint)
  std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<bool> quit_{false};
  std::thread thread_;
};

template <typename T>
void reserveHuge(std::vector<T>& v, size_t n) {
  v.reserve(n);
  if (v.capacity() * sizeof(T) >= kLargeArrayBytes)
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
// touched. The new buffer gets the huge-page hint before the old elements are copied in.
inline constexpr size_t kMaxGrowthFactor = 16;

template <typename T>
void growFor(std::vector<T>& v, size_t need, size_t predicted, size_t most) {
  if (v.capacity() - v.size() >= need) return;
  size_t cap = std::max(v.capacity() * 2, std::max<size_t>(v.size() + need, 4096));
  if (predicted > cap) {
    cap = std::max(cap, std::min({predicted, v.capacity() * kMaxGrowthFactor, most}));
  }
  std::vector<T> bigger;
  bigger.reserve(cap);
  if (bigger.capacity() * sizeof(T) >= kLargeArrayBytes) {
    adviseHugePages(bigger.data(), bigger.capacity() * sizeof(T));
  }
  bigger.insert(bigger.end(), v.begin(), v.end());
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
