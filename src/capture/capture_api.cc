// capture_api.cc: the process-wide recorder behind memforensics::start/stop, its signal handlers
// and its exit hook. See memforensics_capture.h.
//
// Lifetime: the hot path (capture::submit) may run on any thread while another calls stop().
// Each device slot has an in-flight counter that a producer raises before it reads the active
// recorder and lowers after its push; stop() clears the pointer, then waits for every counter to
// drop to zero before it destroys the recorder. The counter is per device, so producers of
// different devices do not share a cache line, and a device's producers are already serialized
// by PyTorch's allocator mutex (uncontended atomic: a few ns).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "capture/memforensics_capture.h"
#include "capture/recorder.h"

namespace memforensics {
namespace capture {
namespace {

constexpr int kSlots = 64;
struct alignas(64) Inflight {
  std::atomic<uint32_t> n{0};
};

// Plain globals without destructors: they must outlive every exit hook and late callback.
Inflight g_inflight[kSlots + 1];  // [kSlots]: signal handlers
std::atomic<Recorder*> g_recorder{nullptr};
std::atomic<bool> g_native{false};
Backend* g_backend = nullptr;
bool g_atexit_registered = false;
bool g_signals_installed = false;
struct sigaction g_prev_term, g_prev_int;

constexpr int kSignalWaitMs = 3000;

// start/stop. Created on first use: start() may run from another translation unit's static
// initializer (MEMFORENSICS_OUT in torch_hook.cc), before this file's dynamic initialization.
std::mutex& controlMutex() {
  static std::mutex* m = new std::mutex;
  return *m;
}

void waitQuiet() {
  for (auto& f : g_inflight) {
    while (f.n.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  }
}

struct Guard {
  explicit Guard(uint32_t slot) : f(g_inflight[slot]) {
    f.n.fetch_add(1, std::memory_order_seq_cst);
  }
  ~Guard() { f.n.fetch_sub(1, std::memory_order_release); }
  Inflight& f;
};

void onSignal(int sig, siginfo_t* info, void* uctx) {
  const int saved_errno = errno;
  struct sigaction& prev = sig == SIGTERM ? g_prev_term : g_prev_int;
  const bool has_fn = (prev.sa_flags & SA_SIGINFO)
                          ? prev.sa_sigaction != nullptr
                          : prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN;
  const bool terminates = !(prev.sa_flags & SA_SIGINFO) && prev.sa_handler == SIG_DFL;
  {
    Guard g(kSlots);
    if (Recorder* r = g_recorder.load(std::memory_order_seq_cst)) {
      if (terminates) {
        r->finishFromSignal(kSignalWaitMs);
      } else {
        r->flushFromSignal(kSignalWaitMs);
      }
    }
  }
  errno = saved_errno;
  if (terminates) {
    // Default disposition back, then the signal again: it is blocked while this handler runs and
    // is delivered (terminating the process) as soon as the handler returns.
    sigaction(sig, &prev, nullptr);
    raise(sig);
    return;
  }
  if (!has_fn) return;  // ignored
  if (prev.sa_flags & SA_SIGINFO) {
    prev.sa_sigaction(sig, info, uctx);
  } else {
    prev.sa_handler(sig);
  }
}

void installSignals() {
  if (g_signals_installed) return;
  struct sigaction sa {};
  sa.sa_sigaction = &onSignal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGTERM);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaction(SIGTERM, &sa, &g_prev_term);
  sigaction(SIGINT, &sa, &g_prev_int);
  g_signals_installed = true;
}

Status stopWith(FinishMode mode) {
  std::lock_guard<std::mutex> lock(controlMutex());
  Recorder* r = g_recorder.exchange(nullptr, std::memory_order_seq_cst);
  if (!r) return Status::Ok();
  waitQuiet();  // no producer or signal handler still uses r
  Status s = r->stop(mode);
  delete r;
  g_native.store(false, std::memory_order_relaxed);
  return s;
}

void stopAtExit() {
  Status s = stopWith(FinishMode::AtExit);
  if (!s.ok()) std::fprintf(stderr, "memforensics: capture: %s\n", s.error().describe().c_str());
}

}  // namespace

void setBackend(Backend* b) {
  g_backend = b;
}
Backend* backend() {
  return g_backend;
}

bool submit(const CaptureRecord& r) noexcept {
  Guard g(r.device % kSlots);
  Recorder* rec = g_recorder.load(std::memory_order_seq_cst);
  return rec && rec->record(r);
}

bool submit(const CaptureRecord& r, std::shared_ptr<void>&& context) noexcept {
  Guard g(r.device % kSlots);
  Recorder* rec = g_recorder.load(std::memory_order_seq_cst);
  return rec && rec->record(r, std::move(context));
}

bool submit(const CaptureRecord& r, std::shared_ptr<void>&& context,
            std::shared_ptr<const RecordText>&& text) noexcept {
  Guard g(r.device % kSlots);
  Recorder* rec = g_recorder.load(std::memory_order_seq_cst);
  return rec && rec->record(r, std::move(context), std::move(text));
}

bool submitNative(const CaptureRecord& r, std::shared_ptr<const RecordText>&& text) noexcept {
  Guard g(r.device % kSlots);
  Recorder* rec = g_recorder.load(std::memory_order_seq_cst);
  return rec && rec->recordNative(r, 1, std::move(text));
}

bool recording() noexcept {
  return g_recorder.load(std::memory_order_relaxed) != nullptr;
}

bool nativeStacksOn() noexcept {
  return g_native.load(std::memory_order_relaxed);
}

void handleSignalForTest(int sig) {
  onSignal(sig, nullptr, nullptr);
}

}  // namespace capture

Status start(const std::string& path, const CaptureOptions& options) {
  using namespace capture;
  std::lock_guard<std::mutex> lock(controlMutex());
  if (g_recorder.load()) return Error{"memforensics capture is already recording", -1};
  RecorderOptions ro;
  RecorderHooks hooks;
  ro.ring_capacity = options.ring_capacity;
  ro.flush_interval_ms = options.flush_interval_ms;
  ro.zstd_level = options.zstd_level;
  ro.native_depth = options.native_stacks ? options.native_depth : 0;
  if (g_backend) g_backend->configure(options, ro, hooks);
  if (options.devices != 0) ro.devices = options.devices;
  auto r = Recorder::create(path, ro, std::move(hooks));
  if (!r) return r.error();
  g_native.store(ro.native_depth > 0, std::memory_order_relaxed);
  if (options.handle_signals) installSignals();
  if (options.stop_at_exit && !g_atexit_registered) {
    std::atexit(&stopAtExit);
    g_atexit_registered = true;
  }
  g_recorder.store(r->release(), std::memory_order_seq_cst);
  if (g_backend) g_backend->started(options);
  return Status::Ok();
}

Status stop() {
  return capture::stopWith(capture::FinishMode::Stop);
}

bool isRecording() {
  return capture::g_recorder.load() != nullptr;
}

bool flush(int timeout_ms) {
  using namespace capture;
  Guard g(kSlots);
  Recorder* r = g_recorder.load(std::memory_order_seq_cst);
  return r ? r->flush(timeout_ms) : true;
}

CaptureStats captureStats() {
  using namespace capture;
  Guard g(kSlots);
  CaptureStats out;
  if (Recorder* r = g_recorder.load(std::memory_order_seq_cst)) {
    RecorderStats s = r->stats();
    out = {s.recorded, s.dropped, s.written, s.bytes};
  }
  return out;
}

}  // namespace memforensics
