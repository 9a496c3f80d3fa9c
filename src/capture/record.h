// record.h: the fixed-size record the capture hot path copies into a ring, and the conversion of
// raw clock ticks into the trace's microseconds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace memforensics::capture {

// One allocator event as the hot path copies it: 64 bytes, one cache line, no pointers to owned
// memory. Stacks travel beside it (a context handle or raw PCs in the ring's side arrays), never
// as strings: the writer thread turns them into the trace's interned frames and stacks.
struct CaptureRecord {
  uint64_t addr = 0;    // block or segment address; for oom: free device bytes
  uint64_t size = 0;    // requested bytes; segment bytes; rounded oom request
  int64_t stream = 0;   // cudaStream_t as an integer
  uint64_t ticks = 0;   // raw clock value (kHasTime): see TickConverter
  uint64_t pool_a = 0;  // memory pool (PyTorch's MempoolId_t), (0, 0) = none
  uint64_t pool_b = 0;
  uint32_t device = 0;
  uint8_t action = 10;  // format::Action value (c10 TraceEntry::Action order), 10 = unknown
  uint8_t flags = 0;    // kHas* below
  uint16_t npcs = 0;    // native return addresses stored in the side array (kHasPcs)
  uint64_t reserved = 0;
};
static_assert(sizeof(CaptureRecord) == 64, "one cache line per record");

inline constexpr uint8_t kHasTime = 1;     // `ticks` is valid
inline constexpr uint8_t kHasContext = 2;  // a stack context sits in the side slot
inline constexpr uint8_t kHasPcs = 4;      // `npcs` native PCs sit in the side slot
inline constexpr uint8_t kCompileNA = 8;   // compile_context is "N/A" (no RecordText needed)
inline constexpr uint8_t kHasText = 16;    // a RecordText sits in the side slot
// Flags a producer may set itself; the recorder sets the side-slot ones.
inline constexpr uint8_t kProducerFlags = kHasTime | kCompileNA;

// The strings an allocator event may carry (PyTorch: compile_context_ 2.8+, user_metadata_ 2.10+,
// which is also the payload of an ANNOTATE entry, 2.14+). Most events carry none, and 2.8+ sets
// compile_context to "N/A" on every entry unless compile contexts are recorded: that case is the
// kCompileNA flag, so that the hot path allocates only for events that really have text.
struct RecordText {
  std::string compile_context;
  std::string user_metadata;
};
// Longer strings are cut to this many bytes: they are copied under the allocator's lock.
inline constexpr size_t kMaxRecordTextBytes = 64 * 1024;

// Raw clock ticks -> microseconds since the Unix epoch.
//
// PyTorch hands trackers the value of c10::getApproximateTime(): the TSC (x86 rdtsc, aarch64
// cntvct_el0) or, on other targets, nanoseconds of the real-time clock. Reading it costs a few
// nanoseconds where the system clock costs 20+, which is why it is used on the hot path, and it is
// meaningless until mapped to wall time. PyTorch maps it at dump time with one linear fit between
// a (ticks, unix ns) pair taken when recording started and one taken at the dump.
//
// We stream, so we cannot wait for the end: the writer thread takes a (ticks, unix ns) sample when
// recording starts (the anchor) and another before each batch it converts (at least every flush
// interval), and converts by the line through the anchor and the latest sample: every event of the
// batch is older than that sample, so this is interpolation, as accurate as the tick rate is
// constant (invariant TSC). Until the two samples are `min_span_ns` apart the slope is the
// `ns_per_tick` guess (1.0: the fallback clock counts nanoseconds). A slope that changes between
// batches can move a time back by a few microseconds; the recorder keeps each device's times
// non-decreasing, as PyTorch's are.
class TickConverter {
 public:
  explicit TickConverter(double ns_per_tick_guess = 1.0, int64_t min_span_ns = 10'000'000)
      : guess_(ns_per_tick_guess), min_span_ns_(min_span_ns) {}

  void addSample(uint64_t ticks, int64_t unix_ns) {
    if (!have_anchor_) {
      anchor_ticks_ = ticks;
      anchor_ns_ = unix_ns;
      have_anchor_ = true;
      slope_ = guess_;
      return;
    }
    const int64_t span_ns = unix_ns - anchor_ns_;
    if (span_ns >= min_span_ns_ && ticks > anchor_ticks_) {
      slope_ = static_cast<double>(span_ns) / static_cast<double>(ticks - anchor_ticks_);
    }
  }
  bool calibrated() const { return have_anchor_; }
  double nsPerTick() const { return slope_; }

  int64_t toUnixUs(uint64_t ticks) const {
    if (!have_anchor_) return -1;
    // Signed tick distance: an event read just before the anchor gives a small negative delta.
    const double dt = static_cast<double>(static_cast<int64_t>(ticks - anchor_ticks_)) * slope_;
    const int64_t ns = anchor_ns_ + static_cast<int64_t>(dt);
    return ns >= 0 ? ns / 1000 : -1;
  }

 private:
  double guess_;
  int64_t min_span_ns_;
  bool have_anchor_ = false;
  uint64_t anchor_ticks_ = 0;
  int64_t anchor_ns_ = 0;
  double slope_ = 1.0;
};

}  // namespace memforensics::capture
