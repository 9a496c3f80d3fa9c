// torch_hook.cc: the LibTorch adapter of libmemforensics_torch.so. Everything else is plain C++
// (recorder.h, torch_entry.h); this file only reads c10's TraceEntry and plugs into the caching
// allocator. Built only against a CUDA LibTorch >= 2.2 (src/capture/CMakeLists.txt).
//
// c10 API used (checked against PyTorch 2.3's c10/cuda/CUDACachingAllocator.h and newer sources):
//   CUDACachingAllocator::get()->initialized()
//   CUDACachingAllocator::attachAllocatorTraceTracker(std::function<void(const TraceEntry&)>)  2.2+
//   CUDACachingAllocator::attachOutOfMemoryObserver(std::function<void(int64_t, size/int64 x3)>)
//   CUDACachingAllocator::snapshot() -> SnapshotInfo{segments: SegmentInfo{device, address,
//       total_size, stream, is_large, is_expandable, owner_private_pool_id, blocks: BlockInfo{size,
//       requested_size, allocated, active}}}
//   TraceEntry{action_, device_, addr_, context_, stream_, size_, time_.approx_t_, mempool_ (2.8+),
//       compile_context_ (2.8+), user_metadata_ (2.10+)}; snapshot(MempoolId_t, include_traces)
//   c10::getApproximateTime(), c10::cuda::device_count()
//   torch::CapturedTraceback, torch::symbolize -> SymbolizedTracebacks{all_frames, tracebacks}
//
// When the tracker is attached: the caching allocator registers trackers on the per-device
// allocators that exist at call time; before CUDA is initialized there are none and an attach
// silently registers nothing (NativeCachingAllocator::attachAllocatorTraceTracker loops over
// device_allocator). So start() attaches at once when the allocator is initialized and otherwise
// retries on every tick of the writer thread (1 ms) until it is: allocator events between CUDA
// initialization and that moment are missed and the trace then reads as one recorded late. Call
// torch.cuda.init() (or run any CUDA op) before start() to miss nothing. There is no detach: after
// stop() the tracker stays attached and returns at once. Allocators without trackers
// (backend:cudaMallocAsync, pluggable allocators) throw on attach: reported once, never retried.
//
// GIL: torch::symbolize takes the GIL itself for Python frames (PyTorch 2.1+), on the writer
// thread. Whoever waits for the writer must not hold it: torch.ops calls release it
// (invokeOperatorFromPython), ctypes.CDLL calls too; the OOM observer checks (see below).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/ApproximateClock.h>
#include <dlfcn.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "capture/memforensics_capture.h"
#include "capture/recorder.h"
#include "capture/torch_entry.h"

namespace cca = c10::cuda::CUDACachingAllocator;
using namespace memforensics::capture;
namespace trace_traits = memforensics::format::trace::traits;

namespace {

std::atomic<bool> g_attached{false};
std::atomic<bool> g_attach_failed{false};  // the allocator refused a tracker: no more retries
std::atomic<bool> g_multi_device{false};   // more than one CUDA device (set when attaching)
std::atomic<bool> g_stacks{true};

// Python's C API, looked up at run time: the library links no libpython and also serves LibTorch
// programs without Python (then every pointer is null). All three may be called without the GIL.
struct PyApi {
  int (*is_initialized)() = nullptr;  // Py_IsInitialized
  int (*is_finalizing)() = nullptr;   // Py_IsFinalizing (3.13+) or _Py_IsFinalizing (3.7-3.12)
  int (*gil_check)() = nullptr;       // PyGILState_Check
};
const PyApi& pyApi() {
  static const PyApi api = [] {
    PyApi a;
    a.is_initialized = reinterpret_cast<int (*)()>(::dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
    void* fin = ::dlsym(RTLD_DEFAULT, "Py_IsFinalizing");
    if (fin == nullptr) fin = ::dlsym(RTLD_DEFAULT, "_Py_IsFinalizing");
    a.is_finalizing = reinterpret_cast<int (*)()>(fin);
    a.gil_check = reinterpret_cast<int (*)()>(::dlsym(RTLD_DEFAULT, "PyGILState_Check"));
    return a;
  }();
  return api;
}
// Python is in the process but must not be entered: not initialized (any more), or finalizing. A
// thread that asks for the GIL then is ended inside the request (pthread_exit through our frames)
// or blocks for ever.
bool pythonClosed() {
  const PyApi& p = pyApi();
  if (p.is_initialized == nullptr) return false;  // no Python: only C++/TorchScript frames
  if (p.is_initialized() == 0) return true;
  return p.is_finalizing != nullptr && p.is_finalizing() != 0;
}
bool thisThreadHoldsGil() {
  const PyApi& p = pyApi();
  return p.gil_check != nullptr && p.is_initialized != nullptr && p.is_initialized() != 0 &&
         p.gil_check() != 0;
}

// c10's action ordinals are the format's (torch_entry.h converts by value): checked here, against
// whichever headers this is compiled with (CI: scripts/torch-headers-check.sh).
using TE = cca::TraceEntry;
static_assert(TE::ALLOC == 0 && TE::FREE_REQUESTED == 1 && TE::FREE_COMPLETED == 2 &&
                  TE::SEGMENT_ALLOC == 3 && TE::SEGMENT_FREE == 4 && TE::SEGMENT_MAP == 5 &&
                  TE::SEGMENT_UNMAP == 6 && TE::SNAPSHOT == 7 && TE::OOM == kTorchOom,
              "c10 TraceEntry::Action changed order: update torch_entry.h and format::Action");
template <typename E>
constexpr bool annotateIsNine() {
  if constexpr (kEntryHasAnnotate<E>) {
    return static_cast<int>(E::ANNOTATE) == 9;
  } else {
    return true;
  }
}
static_assert(annotateIsNine<TE>(), "c10 TraceEntry::ANNOTATE is not 9 (format::Action::Annotate)");

constexpr uint32_t kTextCacheDevices = 64;

// The tracker: runs under the device's allocator mutex. Copies 64 bytes (and a shared_ptr when
// PyTorch gathered a stack, and the entry's strings when it has any: user_metadata_, an ANNOTATE
// payload, a recorded compile context) and returns; never throws, never takes the GIL.
void onTrace(const cca::TraceEntry& te) noexcept {
  // snapshot() records its SNAPSHOT entries with device 0 whichever device's allocator (and lock)
  // records them: with several devices they would land in device 0's ring from a second producer
  // (the ring is single-producer) and be attributed to the wrong device. They only mark snapshot
  // calls: dropped there.
  if (te.action_ == cca::TraceEntry::SNAPSHOT && g_multi_device.load(std::memory_order_relaxed))
    return;
  const CaptureRecord r = toRecord(fromC10(te));
  std::shared_ptr<const RecordText> text;
  if constexpr (kEntryHasCompileContext<TE> || kEntryHasUserMetadata<TE>) {
    // Not while nothing records (the tracker stays attached after stop()). The previous entry's
    // text of this device (cache, never destroyed: a tracker may run during exit) is shared when
    // the strings are the same: only this device's producer, under its allocator lock, touches
    // its slot.
    static auto* const cache = new std::shared_ptr<const RecordText>[kTextCacheDevices];
    if (recording()) {
      if (r.device < kTextCacheDevices) {
        std::shared_ptr<const RecordText>& last = cache[r.device];
        text = textOf(te, last);
        if (text) last = text;
      } else {
        text = textOf(te);
      }
    }
  }
  if (te.context_ && g_stacks.load(std::memory_order_relaxed)) {
    submit(r, std::shared_ptr<void>(te.context_), std::move(text));
  } else if (r.action == 0 && nativeStacksOn()) {
    submitNative(r, std::move(text));
  } else if (text) {
    submit(r, nullptr, std::move(text));
  } else {
    submit(r);  // the common case: 64 bytes, nothing beside them
  }
}

uint64_t approxTicks() {
  return static_cast<uint64_t>(c10::getApproximateTime());
}

// Ticks per ns measured over ~2 ms: the slope used until the writer's own calibration spans 10 ms.
double measureNsPerTick() {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t k0 = approxTicks();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(2)) {
  }
  const uint64_t k1 = approxTicks();
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  return k1 > k0 ? ns / static_cast<double>(k1 - k0) : 1.0;
}

class TorchResolver : public StackResolver {
 public:
  void resolve(std::span<const std::shared_ptr<void>> contexts, FinishMode mode,
               std::vector<ResolvedFrame>& frames,
               std::vector<std::vector<uint32_t>>& stacks) override {
    // Symbolizing Python frames takes the GIL (torch::symbolize acquires it): not while another
    // thread waits in a signal handler (it may hold the GIL), not at exit or once Python is
    // finalizing (a periodic flush during interpreter teardown, e.g. with MEMFORENSICS_OUT and no
    // stop()). Those events keep no stack.
    if (mode != FinishMode::Stop || pythonClosed()) return;
    std::vector<torch::CapturedTraceback*> tbs;
    std::vector<int64_t> which(contexts.size(), -1);
    for (size_t i = 0; i < contexts.size(); ++i) {
      auto* g = static_cast<c10::GatheredContext*>(contexts[i].get());
      if (auto* tb = dynamic_cast<torch::CapturedTraceback*>(g)) {
        which[i] = static_cast<int64_t>(tbs.size());
        tbs.push_back(tb);
      }
    }
    torch::SymbolizedTracebacks st;
    if (!tbs.empty()) st = torch::symbolize(tbs);
    frames.reserve(st.all_frames.size());
    for (const auto& f : st.all_frames)
      frames.push_back(ResolvedFrame{f.filename, f.funcname, f.lineno});
    stacks.assign(contexts.size(), {});
    for (size_t i = 0; i < contexts.size(); ++i) {
      if (which[i] < 0) continue;
      for (uint64_t idx : st.tracebacks[static_cast<size_t>(which[i])])
        stacks[i].push_back(static_cast<uint32_t>(idx));
    }
  }
};

// The allocator's own end state (exact block sizes), when it is safe to ask for it.
bool finalState(FinishMode mode, std::vector<FinalSegment>& out) {
  if (mode != FinishMode::Stop || !g_attached.load()) return false;
  cca::CUDAAllocator* a = cca::get();
  if (a == nullptr) return false;
  cca::SnapshotInfo snap = snapshotWithoutTraces(*a);
  for (const auto& s : snap.segments) {
    FinalSegment f;
    f.device = static_cast<uint32_t>(s.device);
    f.address = static_cast<uint64_t>(s.address);
    f.total_size = static_cast<uint64_t>(s.total_size);
    f.stream = static_cast<int64_t>(reinterpret_cast<intptr_t>(s.stream));
    f.is_large = s.is_large;
    f.is_expandable = s.is_expandable;
    f.pool_a = static_cast<uint64_t>(s.owner_private_pool_id.first);
    f.pool_b = static_cast<uint64_t>(s.owner_private_pool_id.second);
    uint64_t a = f.address;  // blocks are contiguous, in address order
    for (const auto& b : s.blocks) {
      FinalBlock fb;
      fb.address = a;
      fb.size = static_cast<uint64_t>(b.size);
      fb.requested_size = static_cast<uint64_t>(b.requested_size);
      fb.state = b.allocated ? 0 : (b.active ? 1 : 2);
      a += fb.size;
      f.blocks.push_back(fb);
    }
    out.push_back(std::move(f));
  }
  return true;
}

bool tryAttachOnce() {
  if (g_attached.load(std::memory_order_acquire)) return true;
  static std::mutex m;  // start() and the writer thread's retries
  std::lock_guard<std::mutex> lock(m);
  if (g_attached.load(std::memory_order_acquire)) return true;
  cca::CUDAAllocator* a = cca::get();
  if (a == nullptr || !a->initialized()) return false;
  g_multi_device.store(c10::cuda::device_count() > 1, std::memory_order_relaxed);  // CUDA is up
  cca::attachAllocatorTraceTracker([](const cca::TraceEntry& te) { onTrace(te); });
  g_attached.store(true, std::memory_order_release);  // never twice, whatever happens below
  // Called after the oom trace entry, with the allocator lock released, before the exception is
  // thrown: the record already forced a flush; wait for it so that a process dying of the OOM
  // keeps it (at most 2 s). Not when this thread holds the GIL and stacks are kept: the writer
  // needs the GIL to symbolize that batch, so waiting would only stall for the whole timeout (the
  // record still reaches the file once the GIL is released, or at exit).
  cca::attachOutOfMemoryObserver([](auto, auto, auto, auto) {
    const bool blocked = g_stacks.load(std::memory_order_relaxed) && thisThreadHoldsGil();
    memforensics::flush(blocked ? 0 : 2000);
  });
  return true;
}

bool tryAttach() noexcept {
  if (g_attach_failed.load(std::memory_order_acquire)) return false;
  try {
    return tryAttachOnce();
  } catch (const std::exception& e) {
    // c10::Error from a TORCH_CHECK: an allocator without trace trackers (cudaMallocAsync, a
    // pluggable allocator). It would throw again on every writer tick: given up for good.
    if (!g_attach_failed.exchange(true)) {
      std::fprintf(stderr, "memforensics: cannot attach to the CUDA allocator: %s\n", e.what());
    }
    return false;
  } catch (...) {
    if (!g_attach_failed.exchange(true))
      std::fprintf(stderr, "memforensics: cannot attach to the CUDA allocator\n");
    return false;
  }
}

class TorchBackend : public Backend {
 public:
  void configure(const memforensics::CaptureOptions& options, RecorderOptions& ro,
                 RecorderHooks& hooks) override {
    cca::CUDAAllocator* a = cca::get();
    // device_count() initializes the driver: only asked once CUDA is up (16 rings otherwise).
    ro.devices =
        a != nullptr && a->initialized() ? std::max<int>(1, c10::cuda::device_count()) : 16;
    ro.now_ticks = &approxTicks;
    ro.ns_per_tick_guess = measureNsPerTick();
    ro.producer = "memforensics capture (libmemforensics_torch)";
    g_stacks.store(options.stacks);
    ro.text = kEntryHasCompileContext<TE> || kEntryHasUserMetadata<TE>;
    // What this PyTorch's own snapshot would carry, so that a capture converted to a pickle has
    // the same keys.
    if constexpr (kEntryHasCompileContext<TE>) ro.traits |= trace_traits::kCompileContext;
    if constexpr (kEntryHasUserMetadata<TE>) ro.traits |= trace_traits::kUserMetadata;
    if constexpr (kEntryHasMempool<TE>) ro.traits |= trace_traits::kPoolId;
    if constexpr (kEntryHasAnnotate<TE>) ro.traits |= trace_traits::kAnnotateAction;
    if (options.stacks) hooks.resolver = std::make_shared<TorchResolver>();
    hooks.final_state = &finalState;
    hooks.on_tick = [] { tryAttach(); };
  }
  void started(const memforensics::CaptureOptions&) override {
    if (!tryAttach() && !g_attach_failed.load()) {
      std::fprintf(
          stderr,
          "memforensics: CUDA is not initialized yet; the allocator hook attaches as soon as it is "
          "(allocations in between are missed: call torch.cuda.init() before starting)\n");
    }
  }
};

TorchBackend g_backend;

bool startOp(std::string path, bool stacks, bool native_stacks) {
  memforensics::CaptureOptions o;
  o.stacks = stacks;
  o.native_stacks = native_stacks;
  memforensics::Status s = memforensics::start(path, o);
  if (!s.ok()) std::fprintf(stderr, "memforensics: %s\n", s.error().describe().c_str());
  return s.ok();
}
bool stopOp() {
  memforensics::Status s = memforensics::stop();
  if (!s.ok()) std::fprintf(stderr, "memforensics: %s\n", s.error().describe().c_str());
  return s.ok();
}
bool flushOp() {
  return memforensics::flush(2000);
}

bool envFlag(const char* name, bool def) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return def;
  return !(v[0] == '0' || v[0] == 'n' || v[0] == 'N' || v[0] == 'f' || v[0] == 'F');
}

// On load: register the backend; with MEMFORENSICS_OUT set, start recording right away.
struct OnLoad {
  OnLoad() {
    setBackend(&g_backend);
    const char* out = std::getenv("MEMFORENSICS_OUT");
    if (out != nullptr && *out != 0) {
      startOp(out, envFlag("MEMFORENSICS_STACKS", true),
              envFlag("MEMFORENSICS_NATIVE_STACKS", false));
    }
  }
} g_on_load;

}  // namespace

// Python: torch.ops.load_library(path); torch.ops.memforensics.start("run.bin"); ...stop()
TORCH_LIBRARY(memforensics, m) {
  m.def("start(str path, bool stacks=True, bool native_stacks=False) -> bool", &startOp);
  m.def("stop() -> bool", &stopOp);
  m.def("flush() -> bool", &flushOp);
}

// C entry points (ctypes, dlsym).
extern "C" {
__attribute__((visibility("default"))) int memforensics_start(const char* path) {
  return path != nullptr && startOp(path, true, false) ? 0 : -1;
}
__attribute__((visibility("default"))) int memforensics_stop(void) {
  return stopOp() ? 0 : -1;
}
__attribute__((visibility("default"))) int memforensics_flush(void) {
  return flushOp() ? 0 : -1;
}
}
