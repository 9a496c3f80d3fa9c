// recorder.h: per-device rings, the writer thread that drains them into a native trace file, stack
// interning, periodic and forced flushes, and the final segment state.
//
//   hot path (allocator callback, under the device's allocator mutex)
//     record()  -> copy a 64-byte CaptureRecord (+ a context handle or raw PCs in a side slot)
//                  into the device's SpscRing; full ring: count a drop, return
//   writer thread (one per recorder, async signals blocked)
//     every poll_us:      drain every ring into a pending batch
//     every flush interval, on request, on an OOM record, or when the batch is large:
//                         sample the clock, resolve the batch's stack contexts in one call,
//                         intern frames and stacks, convert ticks to microseconds, append the
//                         events to the TraceWriter, write complete chunks (write(2))
//     at finish:          the last batch, dropped counts, the final segment state, the trailer
//
// What a crash loses: a SIGKILLed process leaves every chunk written so far, i.e. all events up to
// the last flush (at most one flush interval, 100 ms by default). SIGTERM/SIGINT (see
// memforensics_capture.h), an OOM record, stop() and exit flush everything.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "capture/record.h"
#include "capture/ring.h"
#include "common/status.h"
#include "format/trace/trace_state.h"
#include "format/trace/trace_writer.h"

namespace memforensics::capture {

// Why the recorder is finishing: decides what the hooks may still do.
enum class FinishMode : uint8_t {
  Stop,    // stop() from a normal thread: everything allowed
  Signal,  // SIGTERM/SIGINT: another thread sits in a signal handler, perhaps holding the GIL or
           // an allocator lock: no hook that could wait on either
  AtExit,  // process exit: Python may be finalized, CUDA may be torn down
};

struct ResolvedFrame {
  std::string filename;
  std::string name;
  uint64_t line = 0;
};

// Turns opaque stack contexts (what the hot path stored beside a record, e.g. PyTorch's
// CapturedTraceback) into frames, a batch at a time, on the writer thread.
class StackResolver {
 public:
  virtual ~StackResolver() = default;
  // For each context i, stacks[i] = indices into `frames`, innermost first; an empty list means
  // "recorded but empty". `mode` is Stop while recording runs normally.
  virtual void resolve(std::span<const std::shared_ptr<void>> contexts, FinishMode mode,
                       std::vector<ResolvedFrame>& frames,
                       std::vector<std::vector<uint32_t>>& stacks) = 0;
};

// Final segment state as the allocator reports it (PyTorch: CUDACachingAllocator::snapshot()).
struct FinalBlock {
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t requested_size = 0;
  uint8_t state = 2;  // format::BlockState: 0 active_allocated, 1 active_pending_free, 2 inactive
};
struct FinalSegment {
  uint32_t device = 0;
  uint64_t address = 0;
  uint64_t total_size = 0;
  int64_t stream = 0;
  uint64_t pool_a = 0, pool_b = 0;
  bool is_large = true;
  bool is_expandable = false;
  std::vector<FinalBlock> blocks;  // address order, covering the segment
};
// Returns false when it cannot report (then the state is derived from the events).
using FinalStateFn = std::function<bool(FinishMode, std::vector<FinalSegment>&)>;

struct RecorderOptions {
  uint32_t devices = 8;              // rings for device ordinals [0, devices); others are dropped
  size_t ring_capacity = 1u << 16;   // records per device (rounded up to a power of two)
  uint32_t poll_us = 1000;           // how often the writer drains the rings
  uint32_t flush_interval_ms = 100;  // how often complete chunks reach the file
  uint32_t chunk_bytes = 1u << 18;   // an Events chunk is written when it reaches this
  int zstd_level = 1;                // 0: stored chunks
  uint64_t checkpoint_every = 1u << 18;
  uint16_t native_depth = 0;  // > 0: recordNative() keeps up to this many return addresses
  bool text = false;          // record(r, context, text) keeps RecordText (a side slot per record)
  // FormatTraits bits of what the events carry beyond a 2.2 snapshot's keys
  // (format::trace::traits::, e.g. kCompileContext): a capture converted to a pickle writes those
  // keys, as the PyTorch it ran on does.
  uint64_t traits = 0;
  std::string producer = "memforensics capture";
  // Raw clock of CaptureRecord::ticks; default: CLOCK_MONOTONIC nanoseconds.
  uint64_t (*now_ticks)() = nullptr;
  double ns_per_tick_guess = 1.0;
};

struct RecorderHooks {
  std::shared_ptr<StackResolver> resolver;  // for records with kHasContext
  FinalStateFn final_state;                 // exact end state; absent: derived from the events
  std::function<void()> on_tick;            // called by the writer thread after each drain
};

struct RecorderStats {
  uint64_t recorded = 0;  // records accepted by the rings
  uint64_t dropped = 0;   // refused: ring full or device out of range
  uint64_t written = 0;   // events appended to the trace
  uint64_t bytes = 0;     // file bytes written
  uint64_t flushes = 0;
  uint64_t chunks = 0;
};

// Default clock: CLOCK_MONOTONIC in nanoseconds.
uint64_t monotonicTicks();

class Recorder {
 public:
  static Expected<std::unique_ptr<Recorder>> create(const std::string& path,
                                                    const RecorderOptions& options = {},
                                                    RecorderHooks hooks = {});
  ~Recorder();  // stop()
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // ---- hot path: one producer per device at a time (see ring.h). Never blocks, never allocates.
  bool record(const CaptureRecord& r) noexcept;
  // `context` is moved into the ring's side slot (no allocation) and released by the writer.
  bool record(const CaptureRecord& r, std::shared_ptr<void>&& context) noexcept;
  // The same with the event's strings (options.text; otherwise they are not kept). `context` and
  // `text` may each be null.
  bool record(const CaptureRecord& r, std::shared_ptr<void>&& context,
              std::shared_ptr<const RecordText>&& text) noexcept;
  // Stores up to native_depth return addresses of the caller (backtrace(3)), skipping `skip`
  // innermost frames. Needs options.native_depth > 0.
  bool recordNative(const CaptureRecord& r, int skip = 1,
                    std::shared_ptr<const RecordText>&& text = {}) noexcept;

  // ---- control
  // Wakes the writer and waits (at most timeout_ms) until everything recorded so far is in the
  // file. Async-signal-safe (atomics, write(2), nanosleep).
  bool flush(int timeout_ms = 2000) noexcept;
  // The same from a signal handler (async-signal-safe): while it waits, the writer resolves stacks
  // in FinishMode::Signal, since the interrupted thread may hold the GIL the resolver would need.
  bool flushFromSignal(int timeout_ms) noexcept;
  // Asks the writer to finish the file (final state, trailer) and waits at most timeout_ms.
  // Async-signal-safe; used by the SIGTERM/SIGINT handler.
  bool finishFromSignal(int timeout_ms) noexcept;
  // Drains, finishes the file and joins the writer. Idempotent; the first error is returned.
  Status stop(FinishMode mode = FinishMode::Stop);

  RecorderStats stats() const;
  uint32_t devices() const { return static_cast<uint32_t>(channels_.size()); }
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  const std::string& path() const { return path_; }

 private:
  Recorder(std::string path, const RecorderOptions& options, RecorderHooks hooks);
  struct Channel;
  struct Pending {
    CaptureRecord r;
    uint32_t ctx = 0;   // index into pending_ctx_ (kHasContext)
    uint32_t pcs = 0;   // offset into pending_pcs_ (kHasPcs)
    uint32_t text = 0;  // index into pending_text_ (kHasText)
  };
  // Hot path: moves `text` into slot i's side slot and flags the record (options.text only).
  static void putText(Channel& ch, CaptureRecord& slot, size_t i,
                      std::shared_ptr<const RecordText>&& text) noexcept;
  void writerLoop();
  void drainRings();
  void processPending(FinishMode mode);
  void finishFile(FinishMode mode);
  uint32_t internFrames(std::span<const ResolvedFrame> frames, std::span<const uint32_t> order);
  uint32_t internNative(std::span<const uintptr_t> pcs);
  uint32_t nativeFrame(uintptr_t pc);
  void buildFinalState(FinishMode mode);
  int64_t realtimeNs() const;

  std::string path_;
  RecorderOptions options_;
  RecorderHooks hooks_;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::atomic<uint64_t> out_of_range_{0};

  // Writer-thread state.
  std::unique_ptr<format::trace::FileSink> sink_;
  std::unique_ptr<format::trace::TraceWriter> writer_;
  format::trace::TraceState state_;
  TickConverter clock_;
  std::vector<int64_t> last_time_us_;  // per device, to keep times non-decreasing
  std::vector<Pending> pending_;
  std::vector<std::shared_ptr<void>> pending_ctx_;
  std::vector<uintptr_t> pending_pcs_;
  std::vector<std::shared_ptr<const RecordText>> pending_text_;
  uint32_t na_string_ = 0;  // the writer's id of "N/A" (kCompileNA), 0 until first needed
  std::shared_ptr<const RecordText> last_text_;  // the last RecordText interned, and its ids
  uint32_t last_compile_ = 0, last_user_ = 0;
  std::vector<ResolvedFrame> resolved_frames_;
  std::vector<std::vector<uint32_t>> resolved_stacks_;
  std::vector<uint32_t> batch_frame_ids_;  // resolved frame index -> trace frame id (this batch)
  std::unordered_map<std::string, uint32_t> native_stacks_;  // PCs as bytes -> stack id
  std::unordered_map<uintptr_t, uint32_t> native_frames_;    // pc -> frame id
  uint64_t reported_dropped_ = 0;
  bool saw_oom_ = false;
  Status
      error_;  // first write error (sticky); the recorder keeps draining so producers never block

  // Control (any thread, signal handlers included).
  int wake_[2] = {-1, -1};  // pipe: [0] read by the writer, [1] written by anyone
  std::atomic<uint64_t> flush_req_{0};
  std::atomic<uint64_t> flush_done_{0};
  std::atomic<uint32_t> signal_flushes_{0};  // flushFromSignal calls waiting now
  std::atomic<uint8_t> finish_req_{0};       // 0 none, else FinishMode + 1
  std::atomic<bool> finished_{false};
  std::atomic<uint64_t> written_{0}, bytes_{0}, flushes_{0}, chunks_{0};
  std::thread thread_;
  bool stopped_ = false;
  Status stop_status_;
};

}  // namespace memforensics::capture
