// ring.h: a bounded single-producer/single-consumer ring of fixed-size POD records, the only thing
// the capture hot path touches.
//
// Why one producer per ring is enough: PyTorch calls an allocator trace tracker while it holds the
// per-device allocator mutex (c10/cuda/CUDACachingAllocator.h, attachAllocatorTraceTracker), so at
// most one thread at a time produces records for a given device, and the mutex orders successive
// producers (thread A's push happens-before thread B's next push on the same device). The
// recorder keeps one ring per device, so the producer side needs no lock and no read-modify-write
// atomic: it writes the slot and publishes it with one release store of `head_`. The consumer is
// the recorder's writer thread alone. (Any other caller of Recorder::record must give the same
// guarantee: one producer per device at a time.)
//
// A full ring never blocks the producer: the record is dropped and `dropped_` counts it; the writer
// thread reports the count in the trace (TraceWriter::noteDropped), so a loss is never silent.
//
// Layout: head_ (written by the producer) and tail_ (written by the consumer) sit on separate
// cache lines; the producer keeps a private copy of the tail and rereads the shared one only when
// its copy says the ring is full, so the common push touches one shared line.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

namespace memforensics::capture {

template <typename T>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<T>, "ring records are copied as bytes");

 public:
  // `capacity` is rounded up to a power of two (at least 2).
  explicit SpscRing(size_t capacity) {
    size_t c = 2;
    while (c < capacity) c <<= 1;
    mask_ = c - 1;
    // Not value-initialized: pages are touched only when records reach them.
    slots_ = std::make_unique_for_overwrite<T[]>(c);
  }
  SpscRing(const SpscRing&) = delete;
  SpscRing& operator=(const SpscRing&) = delete;

  size_t capacity() const { return mask_ + 1; }

  // Producer. `fill(T& slot, size_t index)` writes the record in place; `index` (< capacity())
  // lets a caller keep side data in a parallel array of the same capacity, which is then owned by
  // the producer until the record is published and by the consumer until it is consumed.
  // Returns false (and counts a drop) when the ring is full.
  template <typename Fill>
  bool tryPush(Fill&& fill) noexcept {
    const uint64_t h = head_.load(std::memory_order_relaxed);
    if (h - cached_tail_ > mask_) {
      cached_tail_ = tail_.load(std::memory_order_acquire);
      if (h - cached_tail_ > mask_) {
        // Only the producer writes the counter: a plain load + store, no locked instruction.
        dropped_.store(dropped_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        return false;
      }
    }
    const size_t i = static_cast<size_t>(h & mask_);
    fill(slots_[i], i);
    head_.store(h + 1, std::memory_order_release);
    return true;
  }
  bool push(const T& v) noexcept {
    return tryPush([&](T& slot, size_t) { slot = v; });
  }

  // Consumer. Calls `consume(const T&, size_t index)` for up to `max` records, oldest first, then
  // frees their slots. Returns how many were consumed.
  template <typename Consume>
  size_t drain(Consume&& consume, size_t max = SIZE_MAX) {
    const uint64_t t = tail_.load(std::memory_order_relaxed);
    const uint64_t h = head_.load(std::memory_order_acquire);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(h - t, max));
    for (size_t k = 0; k < n; ++k) {
      const size_t i = static_cast<size_t>((t + k) & mask_);
      consume(static_cast<const T&>(slots_[i]), i);
    }
    tail_.store(t + n, std::memory_order_release);
    return n;
  }

  // Records waiting (exact for the consumer, a snapshot for anyone else).
  size_t size() const {
    return static_cast<size_t>(head_.load(std::memory_order_acquire) -
                               tail_.load(std::memory_order_acquire));
  }
  // Records refused because the ring was full, since construction.
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  uint64_t pushed() const { return head_.load(std::memory_order_acquire); }

 private:
  alignas(64) std::atomic<uint64_t> head_{0};  // next slot to fill (producer)
  uint64_t cached_tail_ = 0;                   // producer's copy of tail_
  std::atomic<uint64_t> dropped_{0};           // producer-written
  alignas(64) std::atomic<uint64_t> tail_{0};  // next slot to read (consumer)
  alignas(64) size_t mask_ = 0;
  std::unique_ptr<T[]> slots_;
};

}  // namespace memforensics::capture
