// prefault.h: first-touch page faults of a few big, growing arrays taken on a background thread.
//
// A large load fills a few arrays of hundreds of MB (the pickle reader's events, memo and nodes).
// The kernel zeroes every fresh page at its first touch, on the thread that touches it; on the
// project machine that zeroing ran at 1-1.5 GB/s and was a third of a 4.8 M-event load
// (docs/performance.md, "Issue 16"). A Prefaulter asks the kernel to populate those pages
// (madvise MADV_POPULATE_WRITE, Linux 5.14 and later) on its own thread, a bounded distance ahead
// of the writer, so the zeroing runs on another core while the writer parses.
//
// It never changes the arrays' contents: populating a page that is already present does nothing,
// and populating one that is not present installs the zeroed page the writer's own fault would
// have installed. Where the kernel does not support it (EINVAL) it stops trying and costs
// nothing. It never populates more than kPrefaultWindowBytes past what the writer reported
// (advance), so an array's unused capacity stays untouched address space.
//
// Not shared between threads other than its own: one writer calls track/advance/untrack/stop.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>

namespace memforensics {

// How far past the writer's reported position a tracked array is populated.
inline constexpr size_t kPrefaultWindowBytes = size_t{8} << 20;
// Arrays smaller than this are not worth a thread.
inline constexpr size_t kPrefaultMinBytes = size_t{8} << 20;

class Prefaulter {
 public:
  static constexpr size_t kSlots = 4;

  Prefaulter() = default;
  ~Prefaulter();
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;

  // Slot `slot` now covers the buffer [base, base + bytes), whose first `used` bytes are written;
  // populated from there up to the window or `upto` bytes, whichever is more. Returns once the
  // thread no longer touches the slot's previous buffer (which may then be freed). A buffer under
  // kPrefaultMinBytes just untracks the slot.
  void track(size_t slot, void* base, size_t bytes, size_t used, size_t upto = 0);
  // The writer has written the first `used` bytes of the slot's buffer.
  void advance(size_t slot, size_t used);
  // Forget the slot's buffer (before it is freed).
  void untrack(size_t slot) { track(slot, nullptr, 0, 0); }
  // Forget every buffer and end the thread.
  void stop();
  // Returns once the thread has nothing left to populate (tests).
  void waitIdle();

 private:
  struct Slot {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    uintptr_t used = 0;  // writer's position (absolute address)
    uintptr_t done = 0;  // populated up to here (absolute address)
    uintptr_t upto = 0;  // populated at least up to here, whatever the window
  };
  void loop();

  std::mutex mu_;
  std::condition_variable wake_;     // the thread waits on it for work
  std::condition_variable settled_;  // track() waits on it for a chunk in flight
  Slot slots_[kSlots];
  size_t in_flight_ = kSlots;  // the slot of the chunk being populated; kSlots = none
  bool quit_ = false;
  bool idle_ = true;  // the thread waits for work
  bool unsupported_ = false;
  std::thread thread_;
};

}  // namespace memforensics
