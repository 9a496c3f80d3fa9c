// memforensics_capture.h: the public capture API. One call starts writing a native trace:
//
//   #include "capture/memforensics_capture.h"
//   memforensics::start("run.bin");   // after CUDA is initialized (see docs/capture.md)
//   ... train ...
//   memforensics::stop();             // also done at exit, on SIGTERM/SIGINT, flushed on OOM
//
// In libmemforensics_torch.so the LibTorch adapter (torch_hook.cc) plugs itself in as the backend:
// start() then attaches an allocator trace tracker and an OOM observer to PyTorch's CUDA caching
// allocator. Without a backend (the plain library, the tests) start() opens the file and records
// what is submitted through capture::submit().
//
// Signals: start() installs SIGTERM and SIGINT handlers that chain the ones in place. The handler
// does only async-signal-safe things: it wakes the writer thread through a pipe and waits (at most
// 3 s, with nanosleep) until the file is flushed; if the previous disposition was the default
// (terminate), it first has the writer finish the file (final state and trailer, so it reads back
// complete), then restores the default and re-raises. A previous handler function (Python's
// SIGINT -> KeyboardInterrupt) is called after the flush, and recording goes on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "capture/record.h"
#include "common/status.h"

namespace memforensics {

struct CaptureOptions {
  // Python/TorchScript stacks from PyTorch's own traceback capture: used when PyTorch's history
  // recording is on with context "alloc" or "all" (the tracker then receives a context per alloc).
  bool stacks = true;
  // C++ return addresses of every allocation (backtrace(3), ~1 us per event), symbolized with
  // dladdr in the writer thread.
  bool native_stacks = false;
  uint16_t native_depth = 32;
  uint32_t flush_interval_ms = 100;  // a SIGKILL loses at most this much
  size_t ring_capacity = 1u << 16;   // records per device
  uint32_t devices = 0;              // 0: the backend's device count (8 without a backend)
  int zstd_level = 1;
  bool handle_signals = true;  // SIGTERM/SIGINT: flush (and finish when they terminate)
  bool stop_at_exit = true;    // atexit: stop()
};

// Starts recording into `path` (created or truncated). Fails if recording is already on or the
// file cannot be created.
Status start(const std::string& path, const CaptureOptions& options = {});
// Finishes the file: remaining events, dropped counts, final segment state, trailer. Idempotent.
Status stop();
bool isRecording();
// Everything recorded so far reaches the file (waits at most timeout_ms).
bool flush(int timeout_ms = 2000);

struct CaptureStats {
  uint64_t recorded = 0, dropped = 0, written = 0, bytes = 0;
};
CaptureStats captureStats();

namespace capture {

class Recorder;
struct RecorderOptions;
struct RecorderHooks;

// What an allocator adapter provides (the LibTorch one: torch_hook.cc).
class Backend {
 public:
  virtual ~Backend() = default;
  // Before the recorder exists: device count, clock, stack resolver, final state.
  virtual void configure(const CaptureOptions& options, RecorderOptions& ro,
                         RecorderHooks& hooks) = 0;
  // The recorder is live: attach to the allocator (may be deferred, see torch_hook.cc).
  virtual void started(const CaptureOptions& options) = 0;
};
// Set once, by the adapter's static initializer.
void setBackend(Backend* backend);
Backend* backend();

// Hot path for adapters and tests: routes the record to the active recorder (false when none or
// the ring is full). One producer per device at a time (ring.h).
bool submit(const CaptureRecord& r) noexcept;
bool submit(const CaptureRecord& r, std::shared_ptr<void>&& context) noexcept;
// With the event's strings (kept when the backend set RecorderOptions::text); either may be null.
bool submit(const CaptureRecord& r, std::shared_ptr<void>&& context,
            std::shared_ptr<const RecordText>&& text) noexcept;
// Same, with the caller's native stack when native stacks are on.
bool submitNative(const CaptureRecord& r, std::shared_ptr<const RecordText>&& text = {}) noexcept;
bool nativeStacksOn() noexcept;
// Whether a recorder is active now: lets an adapter skip work (copying an entry's strings) that
// submit() would throw away. A hint only: submit() decides.
bool recording() noexcept;

// For the tests of signal handling: the handler, callable directly.
void handleSignalForTest(int sig);

}  // namespace capture
}  // namespace memforensics
