// prefault.cc: see prefault.h.
#include "common/prefault.h"

#include <algorithm>
#include <cerrno>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace memforensics {

namespace {

constexpr uintptr_t kPage = 4096;
// One madvise call at most this much (one transparent huge page): track() waits for at most one.
constexpr uintptr_t kChunk = uintptr_t{2} << 20;

#if defined(__linux__)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
// 0, or the errno of the populate.
int populate(uintptr_t from, uintptr_t to) {
  if (::madvise(reinterpret_cast<void*>(from), to - from, MADV_POPULATE_WRITE) == 0) return 0;
  return errno == 0 ? EINVAL : errno;
}
#else
int populate(uintptr_t, uintptr_t) {
  return EINVAL;
}
#endif

}  // namespace

Prefaulter::~Prefaulter() {
  stop();
}

void Prefaulter::track(size_t slot, void* base, size_t bytes, size_t used, size_t upto) {
  if (slot >= kSlots) return;
  std::unique_lock lk(mu_);
  settled_.wait(lk, [&] { return in_flight_ != slot; });
  Slot& s = slots_[slot];
  if (base == nullptr || bytes < kPrefaultMinBytes || unsupported_ || quit_) {
    s = Slot{};
    return;
  }
  auto b = reinterpret_cast<uintptr_t>(base);
  s.begin = b & ~(kPage - 1);  // the page holding the buffer's first byte is part of its mapping
  s.end = b + bytes;
  s.used = b + std::min(used, bytes);
  s.done = s.used & ~(kPage - 1);
  s.upto = b + std::min(upto, bytes);
  idle_ = false;  // until the thread has looked at the new buffer
  if (!thread_.joinable()) {
    // The thread is only a speed-up: when it cannot start (a process or address-space limit),
    // the pages fault in on the writer as they would without it, and nothing else changes.
    try {
      thread_ = std::thread([this] { loop(); });
    } catch (...) {
      unsupported_ = true;
      s = Slot{};
      idle_ = true;
      return;
    }
  }
  wake_.notify_one();
}

void Prefaulter::advance(size_t slot, size_t used) {
  if (slot >= kSlots) return;
  std::lock_guard lk(mu_);
  Slot& s = slots_[slot];
  if (s.begin == 0) return;
  s.used = std::min(s.end, std::max(s.used, s.begin + used));
  if (s.done < s.used + kPrefaultWindowBytes && s.done < s.end) {
    idle_ = false;
    wake_.notify_one();
  }
}

void Prefaulter::waitIdle() {
  std::unique_lock lk(mu_);
  if (!thread_.joinable()) return;
  wake_.notify_one();
  settled_.wait(lk, [&] { return quit_ || (idle_ && in_flight_ == kSlots); });
}

void Prefaulter::stop() {
  {
    std::lock_guard lk(mu_);
    quit_ = true;
    for (Slot& s : slots_) s = Slot{};
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Prefaulter::loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    if (quit_) return;
    size_t pick = kSlots;
    uintptr_t from = 0;
    uintptr_t to = 0;
    for (size_t k = 0; k < kSlots && pick == kSlots; ++k) {
      Slot& s = slots_[k];
      if (s.begin == 0) continue;
      s.done = std::max(s.done, s.used & ~(kPage - 1));  // the writer touched what it wrote
      uintptr_t target = std::min(s.end, std::max(s.upto, s.used + kPrefaultWindowBytes));
      if (s.done >= target) continue;
      pick = k;
      from = s.done & ~(kPage - 1);
      to = std::min(target, (from & ~(kChunk - 1)) + kChunk);
      to = (to + kPage - 1) & ~(kPage - 1);  // the page holding the last byte is in the mapping
    }
    if (pick == kSlots) {
      idle_ = true;
      settled_.notify_all();
      wake_.wait(lk);
      continue;
    }
    idle_ = false;
    in_flight_ = pick;
    lk.unlock();
    int rc = populate(from, to);
    lk.lock();
    in_flight_ = kSlots;
    if (rc == EINVAL) {  // no MADV_POPULATE_WRITE here (before Linux 5.14): never again
      unsupported_ = true;
      for (Slot& s : slots_) s = Slot{};
    } else {
      // Anything else (ENOMEM, EFAULT, a signal) ends the work on this buffer: the writer's own
      // faults do it.
      slots_[pick].done = rc == 0 ? to : slots_[pick].end;
    }
    settled_.notify_all();
  }
}

}  // namespace memforensics
