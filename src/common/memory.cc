// memory.cc: see memory.h.
#include "common/memory.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <mutex>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__unix__)
#include <signal.h>
#include <unistd.h>
#endif

#include "common/sanitizers.h"

namespace memforensics {

namespace {

std::atomic<bool> g_heap_huge{false};
// Whether configureAllocator's settings were taken: the arenas are glibc's (not a sanitizer's or
// a preloaded allocator's, which ignore mallopt or keep their memory elsewhere).
std::atomic<bool> g_glibc_arenas{false};
// The heap's end when configureAllocator ran: where the advised range begins.
std::atomic<uintptr_t> g_heap_begin{0};
std::mutex g_heap_mu;

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
  // The heap as far as it has grown (with configureAllocator's 64 MiB top pad, it grows in steps
  // of at least that). It is not grown ahead: blocks that grew it by 30 MiB before advising
  // (malloc'd and freed at once) raised the 498 MB pickle's peak RSS from 430-450 MB to 515-532
  // MB and its page faults from about 13,000 to 24,000, with no gain in time.
  void* top = ::sbrk(0);
  if (top == reinterpret_cast<void*>(-1)) return 0;
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  uintptr_t b = (g_heap_begin.load(std::memory_order_relaxed) + kHuge - 1) & ~(kHuge - 1);
  uintptr_t e = reinterpret_cast<uintptr_t>(top) & ~(kHuge - 1);
  if (b == 0 || e <= b) return 0;
  if (::madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE) != 0) return 0;
  return e - b;
#else
  return 0;
#endif
}

void adviseHugePages(void* p, size_t bytes) {
  // A large array: the input is large, so the heap gets huge pages too (and is advised again as
  // far as it has grown since the last large array).
  if (bytes >= kLargeArrayBytes) enableHeapHugePages();
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
  if (ok && g_heap_begin.load(std::memory_order_relaxed) == 0) {
    void* at = ::sbrk(0);
    if (at != reinterpret_cast<void*>(-1))
      g_heap_begin.store(reinterpret_cast<uintptr_t>(at), std::memory_order_relaxed);
  }
#endif
  return out;
}

namespace {

// The inputs MappedInput registered: [begin, end) per slot, end 0 = free. Read by the signal
// handler (lock-free atomics, async-signal-safe).
std::atomic<uintptr_t> g_input_begin[MappedInput::kMaxMappedInputs];
std::atomic<uintptr_t> g_input_end[MappedInput::kMaxMappedInputs];

#if defined(__unix__)
void onBusError(int sig, siginfo_t* info, void*) {
  bool input = false;
  if (info != nullptr && info->si_code == BUS_ADRERR) {
    const auto at = reinterpret_cast<uintptr_t>(info->si_addr);
    for (size_t k = 0; k < MappedInput::kMaxMappedInputs; ++k) {
      const uintptr_t end = g_input_end[k].load(std::memory_order_acquire);
      if (end != 0 && at >= g_input_begin[k].load(std::memory_order_relaxed) && at < end)
        input = true;
    }
  }
  if (!input) {
    // Not ours: the default action, as if no handler were installed (the signal, blocked while
    // the handler runs, is delivered again when it returns).
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  const char* msg = kMappedInputFaultMessage;
  size_t n = 0;
  while (msg[n] != '\0') ++n;
  if (::write(2, msg, n) < 0) {
  }
  ::_exit(2);
}
#endif

}  // namespace

void installMappedInputFaultHandler() {
#if defined(__unix__)
  if (kAddressSanitizer) return;
  struct sigaction sa {};
  sa.sa_sigaction = onBusError;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, nullptr);
#endif
}

MappedInput::MappedInput(const void* p, size_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  if (bytes == 0) return;
  for (size_t k = 0; k < kMaxMappedInputs; ++k) {
    uintptr_t free_end = 0;
    // Claims the slot with the end 1 (which matches no address), then sets the range.
    if (g_input_end[k].compare_exchange_strong(free_end, 1, std::memory_order_acq_rel)) {
      g_input_begin[k].store(begin, std::memory_order_relaxed);
      g_input_end[k].store(begin + bytes, std::memory_order_release);
      slot_ = k;
      return;
    }
  }
}

MappedInput::~MappedInput() {
  if (slot_ < kMaxMappedInputs) g_input_end[slot_].store(0, std::memory_order_release);
}

void releaseMappedPages(const void* p, size_t bytes) {
#if defined(__linux__)
  if (bytes != 0) ::madvise(const_cast<void*>(p), bytes, MADV_DONTNEED);
#else
  (void)p;
  (void)bytes;
#endif
}

InputPrefetcher::InputPrefetcher(const uint8_t* begin, const uint8_t* end)
    : begin_(reinterpret_cast<uintptr_t>(begin)), end_(reinterpret_cast<uintptr_t>(end)) {
#if defined(__linux__)
  if (end_ - begin_ < kMinBytes) return;
  pos_.store(begin_, std::memory_order_relaxed);
  // The thread is only a speed-up: when it cannot start, the reader faults the pages in.
  try {
    thread_ = std::thread([this] { loop(); });
  } catch (...) {
  }
#endif
}

InputPrefetcher::~InputPrefetcher() {
  stop();
}

void InputPrefetcher::advance(const uint8_t* p) {
  if (!thread_.joinable()) return;
  const auto at = reinterpret_cast<uintptr_t>(p);
  pos_.store(at, std::memory_order_relaxed);
  if (waiting_.load(std::memory_order_relaxed) &&
      at + kWindow / 2 >= done_seen_.load(std::memory_order_relaxed)) {
    std::lock_guard lk(mu_);
    wake_.notify_one();
  }
}

void InputPrefetcher::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lk(mu_);
    quit_.store(true, std::memory_order_relaxed);
  }
  wake_.notify_one();
  thread_.join();
}

void InputPrefetcher::loop() {
#if defined(__linux__)
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
  constexpr uintptr_t kChunk = uintptr_t{512} << 10;
  constexpr uintptr_t kPage = 4096;
  uintptr_t done = begin_ & ~(kPage - 1);
  for (;;) {
    const uintptr_t pos = pos_.load(std::memory_order_relaxed);
    done = std::max(done, pos & ~(kPage - 1));  // never behind the reader
    const uintptr_t target = std::min(end_, pos + kWindow);
    if (done >= end_) return;
    if (done >= target) {
      std::unique_lock lk(mu_);
      if (quit_.load(std::memory_order_relaxed)) return;
      done_seen_.store(done, std::memory_order_relaxed);
      waiting_.store(true, std::memory_order_relaxed);
      wake_.wait_for(lk, std::chrono::milliseconds(2));
      waiting_.store(false, std::memory_order_relaxed);
      continue;
    }
    if (quit_.load(std::memory_order_relaxed)) return;
    uintptr_t to = std::min(target, done + kChunk);
    to = (to + kPage - 1) & ~(kPage - 1);  // the page holding the last byte is in the mapping
    if (::madvise(reinterpret_cast<void*>(done), to - done, MADV_POPULATE_READ) != 0) return;
    populated_.fetch_add(to - done, std::memory_order_relaxed);
    done = to;
  }
#endif
}

}  // namespace memforensics
