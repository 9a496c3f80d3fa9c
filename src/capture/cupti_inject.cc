// cupti_inject.cc: libmemforensics_cupti.so, the CUPTI injection library.
//
// The CUDA driver loads it during cuInit when CUDA_INJECTION64_PATH names it, and calls
// InitializeInjection(). From then on it records every device memory allocation and free of the
// process (cudaMalloc/cudaFree, stream-ordered cudaMallocAsync & memory pools, cuMemAlloc,
// cuMemCreate/cuMemMap/cuMemUnmap) into a native trace (docs/trace-format.md), with the host
// backtrace of the API call. `memforensics record` sets the variables; docs/capture.md says how.
//
// Threads and data flow:
//   * app threads, CUPTI callback at the ENTER of a memory API: backtrace() into a table keyed by
//     correlation id (one short lock); at the EXIT of cuMemCreate/Map/Unmap/Release: the mapping
//     is converted right away (VMM calls have no reliable activity records);
//   * CUPTI's activity thread, buffer-completed callback: every record goes through the Converter
//     (cupti_convert.h); the batch is sorted by time, stacks are symbolized (cupti_stacks.h) and
//     the events written through TraceWriter to the file. The file is flushed about once a second
//     (cuptiActivityFlushPeriod), so a killed process loses at most the last second;
//   * exit (atexit): cuptiActivityFlushAll, last batch, trailer; a one-line summary on stderr.
//
// Environment: MEMFORENSICS_CUPTI_OUT (output path; default memforensics-<pid>.bin; when the file
// already exists, e.g. a second CUDA process of the same run, <stem>.<pid>.bin next to it),
// MEMFORENSICS_CUPTI_STACKS=0 (no backtraces), MEMFORENSICS_QUIET=1 (no stderr lines). Not
// MEMFORENSICS_OUT: that one starts the LibTorch hook, which may run in the same process and must
// not write the same file.
// Failures never reach the application: the library logs once and stops recording.
#include <cupti.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "capture/cupti_convert.h"
#include "capture/cupti_stacks.h"
#include "format/trace/trace_writer.h"

namespace ft = memforensics::format::trace;
namespace mc = memforensics::capture::cupti;

namespace {

constexpr size_t kBufferBytes = 8u << 20;
constexpr size_t kAlign = 8;
// Backtraces awaiting their activity record. Correlation ids grow with every API call; a stack no
// record claimed (a free of nullptr, or the record carried the id of the other one of a runtime
// call and its nested driver call) is dropped once the table is full and it is more than
// kStackWindow calls old. At ~30 frames a full table is about 100 MiB.
constexpr size_t kMaxPendingStacks = 1u << 18;
constexpr uint32_t kStackWindow = 1u << 17;
constexpr int kMaxFrames = 64;

bool quiet() {
  const char* q = std::getenv("MEMFORENSICS_QUIET");
  return q != nullptr && q[0] != '\0' && q[0] != '0';
}

void logLine(const std::string& s) {
  if (!quiet()) std::fprintf(stderr, "memforensics: %s\n", s.c_str());
}

// ---------------------------------------------------------------------------------------------
// Backtraces captured at API entry, by correlation id. Guarded by g_stack_mu (taken alone, or
// inside g_mu: lock order g_mu -> g_stack_mu). A driver call made by a runtime call (cudaMalloc ->
// cuMemAlloc) shares the runtime call's backtrace through g_alias: whichever correlation id the
// activity record carries finds it.

std::mutex g_stack_mu;
std::unordered_map<uint32_t, std::vector<void*>> g_stacks;
std::unordered_map<uint32_t, uint32_t> g_alias;  // driver correlation id -> runtime correlation id
uint64_t g_stacks_dropped = 0;
uint32_t g_max_corr = 0;
bool g_want_stacks = true;
// The runtime call (cudaMalloc...) this thread is inside: nested driver calls reuse its stack.
thread_local uint32_t t_runtime_corr = 0;

// Under g_stack_mu: room for one more entry?
bool makeRoom(uint32_t corr) {
  g_max_corr = std::max(g_max_corr, corr);
  if (g_stacks.size() + g_alias.size() < kMaxPendingStacks) return true;
  std::erase_if(g_stacks, [](const auto& kv) { return kv.first + kStackWindow < g_max_corr; });
  std::erase_if(g_alias, [](const auto& kv) { return kv.first + kStackWindow < g_max_corr; });
  if (g_stacks.size() + g_alias.size() < kMaxPendingStacks) return true;
  ++g_stacks_dropped;
  return false;
}

void captureStack(uint32_t corr) {
  void* pcs[kMaxFrames];
  int n = backtrace(pcs, kMaxFrames);
  std::lock_guard<std::mutex> lock(g_stack_mu);
  if (!makeRoom(corr)) return;
  g_stacks[corr].assign(pcs, pcs + (n > 0 ? n : 0));
}

void aliasStack(uint32_t runtime_corr, uint32_t driver_corr) {
  std::lock_guard<std::mutex> lock(g_stack_mu);
  if (makeRoom(driver_corr)) g_alias[driver_corr] = runtime_corr;
}

void forgetStack(uint32_t corr) {
  std::lock_guard<std::mutex> lock(g_stack_mu);
  g_stacks.erase(corr);
  g_alias.erase(corr);
}

// Takes the backtrace of a call (or of the runtime call around it); empty when none.
std::vector<void*> takeStack(uint32_t corr) {
  std::vector<void*> pcs;
  std::lock_guard<std::mutex> lock(g_stack_mu);
  auto it = g_stacks.find(corr);
  if (it == g_stacks.end()) {
    auto a = g_alias.find(corr);
    if (a == g_alias.end()) return pcs;
    it = g_stacks.find(a->second);
    g_alias.erase(a);
    if (it == g_stacks.end()) return pcs;
  }
  pcs.swap(it->second);
  g_stacks.erase(it);
  return pcs;
}

// ---------------------------------------------------------------------------------------------
// The recorder: writer, converter, symbolizer. Guarded by g_mu. Leaked on purpose: CUPTI may call
// back during static destruction.

class Recorder final : public mc::Interner {
 public:
  Recorder(std::unique_ptr<ft::FileSink> sink, std::string path, int64_t offset_ns)
      : sink_(std::move(sink)),
        path_(std::move(path)),
        writer_(*sink_, writerOptions()),
        converter_(*this, mc::ConvertOptions{offset_ns}),
        symbolizer_(writer_, mc::StackSymbolizer::defaultSkipModules()) {}

  static ft::WriterOptions writerOptions() {
    ft::WriterOptions o;
    o.zstd_level = 3;
    o.chunk_bytes = 256u << 10;
    return o;
  }

  memforensics::Status begin() {
    ft::TraceMeta meta;
    meta.producer = "memforensics 0.1.0 cupti";
    meta.source_format = "capture";
    meta.created_unix_us = std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    return writer_.begin(meta);
  }

  uint32_t stackFor(uint32_t corr) override {
    std::vector<void*> pcs = takeStack(corr);
    if (pcs.empty()) return ft::kTraceNoStack;
    return symbolizer_.intern(pcs);
  }
  uint32_t pool(uint64_t a, uint64_t b) override { return writer_.pool(a, b); }

  mc::Converter& converter() { return converter_; }
  std::vector<mc::TimedEvent>& batch() { return batch_; }

  // Writes the batch (sorted by time) and flushes it to the file as complete chunks. Called for
  // every activity buffer (CUPTI delivers them at least once a second, cuptiActivityFlushPeriod)
  // and by the flusher thread for mappings seen in callbacks, so a killed process loses at most
  // about a second of events.
  void writeBatch() {
    if (failed_ || batch_.empty()) return;
    mc::Converter::sortBatch(batch_);
    for (const auto& t : batch_) {
      memforensics::Status s = writer_.event(t.event);
      if (!s.ok()) return fail(s);
    }
    batch_.clear();
    memforensics::Status s = writer_.flush();
    if (!s.ok()) return fail(s);
  }

  void close(bool quiet_summary = false) {
    if (closed_) return;
    closed_ = true;
    writeBatch();
    if (!failed_) {
      std::vector<ft::TraceSegment> segments;
      std::vector<ft::TraceBlock> blocks;
      converter_.finalState(segments, blocks);
      writer_.setFinalState(std::move(segments), std::move(blocks));
      memforensics::Status s = writer_.close();
      if (s.ok()) s = sink_->closeFile();
      if (!s.ok()) fail(s);
    }
    if (quiet_summary) return;
    const mc::ConvertStats& st = converter_.stats();
    uint64_t other = 0;
    for (uint64_t k : st.other_kind) other += k;
    int devices = __builtin_popcount(st.devices_seen_mask);
    std::string line = std::to_string(st.device_allocs + st.vmm_maps) + " device allocations and " +
                       std::to_string(st.device_releases + st.vmm_unmaps) + " frees on " +
                       std::to_string(devices) + " device(s), " +
                       std::to_string(writer_.stats().events) + " events written to " + path_;
    if (other != 0)
      line += "; " + std::to_string(other) + " host/managed memory records not traced";
    if (st.unmatched_releases + st.double_allocs + st.vmm_unmatched_unmaps != 0) {
      line += "; " +
              std::to_string(st.unmatched_releases + st.double_allocs + st.vmm_unmatched_unmaps) +
              " unmatched operations";
    }
    if (dropped_ != 0) line += "; " + std::to_string(dropped_) + " CUPTI records dropped";
    {
      std::lock_guard<std::mutex> lock(g_stack_mu);
      if (g_stacks_dropped != 0)
        line += "; " + std::to_string(g_stacks_dropped) + " backtraces dropped";
    }
    if (failed_) line += " (write failed: " + error_ + ")";
    logLine(line);
  }

  void addDropped(uint64_t n) {
    dropped_ += n;
    writer_.noteDropped(n);
  }
  bool closed() const { return closed_; }

 private:
  void fail(const memforensics::Status& s) {
    if (!failed_) logLine("recording stopped: cannot write " + path_ + ": " + s.error().describe());
    failed_ = true;
    error_ = s.error().describe();
    batch_.clear();
  }

  std::unique_ptr<ft::FileSink> sink_;
  std::string path_;
  ft::TraceWriter writer_;
  mc::Converter converter_;
  mc::StackSymbolizer symbolizer_;
  std::vector<mc::TimedEvent> batch_;
  bool failed_ = false;
  bool closed_ = false;
  uint64_t dropped_ = 0;
  std::string error_;
};

std::mutex g_mu;
Recorder* g_rec = nullptr;  // set once by InitializeInjection
std::atomic<bool> g_active{false};
pid_t g_pid = 0;  // the process that owns the file (a forked child must not close it)
CUpti_SubscriberHandle g_subscriber = nullptr;

// The flusher thread has started (initialize() waits for it).
std::mutex g_flusher_mu;
std::condition_variable g_flusher_cv;
bool g_flusher_running = false;

// cuMemCreate handles: device (or -1 for host-located memory, which is not traced).
std::unordered_map<uint64_t, int64_t> g_handles;  // under g_mu

uint64_t cuptiNow() {
  uint64_t t = 0;
  if (cuptiGetTimestamp(&t) != CUPTI_SUCCESS) t = 0;
  return t;
}

// ---------------------------------------------------------------------------------------------
// CUPTI callbacks.

void CUPTIAPI bufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI bufferCompleted(CUcontext ctx, uint32_t stream_id, uint8_t* buffer, size_t /*size*/,
                              size_t valid) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_rec != nullptr && !g_rec->closed()) {
      CUpti_Activity* record = nullptr;
      while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        g_rec->converter().addRecord(*record, g_rec->batch());
      }
      size_t dropped = 0;
      if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) == CUPTI_SUCCESS &&
          dropped != 0) {
        g_rec->addDropped(dropped);
      }
      g_rec->writeBatch();
    }
  }
  std::free(buffer);
}

bool isRuntimeMemoryApi(CUpti_CallbackId id) {
  switch (id) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc3D_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_ptsz_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemPoolCreate_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemPoolDestroy_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemPoolTrimTo_v11020:
      return true;
    default:
      return false;
  }
}

bool isDriverVmmApi(CUpti_CallbackId id) {
  return id == CUPTI_DRIVER_TRACE_CBID_cuMemCreate || id == CUPTI_DRIVER_TRACE_CBID_cuMemRelease ||
         id == CUPTI_DRIVER_TRACE_CBID_cuMemMap || id == CUPTI_DRIVER_TRACE_CBID_cuMemUnmap;
}

bool isDriverMemoryApi(CUpti_CallbackId id) {
  switch (id) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuMemPoolCreate:
    case CUPTI_DRIVER_TRACE_CBID_cuMemPoolDestroy:
    case CUPTI_DRIVER_TRACE_CBID_cuMemPoolTrimTo:
      return true;
    default:
      return isDriverVmmApi(id);
  }
}

int64_t deviceOfContext(CUcontext ctx) {
  uint32_t dev = 0;
  if (ctx != nullptr && cuptiGetDeviceId(ctx, &dev) == CUPTI_SUCCESS) return dev;
  return 0;
}

// EXIT of a successful cuMemCreate/Release/Map/Unmap.
void onVmm(CUpti_CallbackId id, const CUpti_CallbackData* cb) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_rec == nullptr || g_rec->closed()) return;
  switch (id) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemCreate: {
      const auto* p = static_cast<const cuMemCreate_params*>(cb->functionParams);
      if (p->handle == nullptr) return;
      int64_t device = -1;
      if (p->prop != nullptr && p->prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        device = p->prop->location.id;
      g_handles[static_cast<uint64_t>(*p->handle)] = device;
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemRelease: {
      const auto* p = static_cast<const cuMemRelease_params*>(cb->functionParams);
      g_handles.erase(static_cast<uint64_t>(p->handle));
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemMap: {
      const auto* p = static_cast<const cuMemMap_params*>(cb->functionParams);
      int64_t device;
      auto it = g_handles.find(static_cast<uint64_t>(p->handle));
      if (it != g_handles.end()) {
        device = it->second;
      } else {
        device = deviceOfContext(cb->context);  // imported handle: the current device
      }
      if (device < 0) return;  // host memory
      g_rec->converter().addMap(static_cast<uint32_t>(device), p->ptr, p->size, cuptiNow(),
                                cb->correlationId, g_rec->batch());
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemUnmap: {
      const auto* p = static_cast<const cuMemUnmap_params*>(cb->functionParams);
      g_rec->converter().addUnmap(p->ptr, p->size, cuptiNow(), cb->correlationId, g_rec->batch());
      break;
    }
    default:
      break;
  }
}

void CUPTIAPI onCallback(void* /*userdata*/, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                         const void* data) {
  if (!g_active.load(std::memory_order_relaxed)) return;
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    if (!isRuntimeMemoryApi(id)) return;
    if (cb->callbackSite == CUPTI_API_ENTER) {
      if (g_want_stacks) captureStack(cb->correlationId);
      t_runtime_corr = cb->correlationId;
    } else {
      t_runtime_corr = 0;
      const auto* rc = static_cast<const int*>(cb->functionReturnValue);  // cudaError_t
      if (rc != nullptr && *rc != 0) forgetStack(cb->correlationId);
    }
    return;
  }
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API || !isDriverMemoryApi(id)) return;
  if (cb->callbackSite == CUPTI_API_ENTER) {
    if (isDriverVmmApi(id)) {
      // Traced from this callback: activity records of the same call must not count twice.
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_rec != nullptr) g_rec->converter().ignoreCorrelation(cb->correlationId);
    }
    if (!g_want_stacks) return;
    if (t_runtime_corr != 0) {
      aliasStack(t_runtime_corr, cb->correlationId);
    } else {
      captureStack(cb->correlationId);
    }
    return;
  }
  const auto* rc = static_cast<const CUresult*>(cb->functionReturnValue);
  bool ok = rc == nullptr || *rc == CUDA_SUCCESS;
  if (ok && isDriverVmmApi(id)) onVmm(id, cb);
  // Records of this call have been produced by now; a stack nobody claimed (a failed call, a
  // free of nullptr) would otherwise stay in the table. VMM stacks were consumed in onVmm.
  if (!ok || isDriverVmmApi(id)) forgetStack(cb->correlationId);
}

void atExit() {
  if (::getpid() != g_pid || !g_active.exchange(false)) return;
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_rec != nullptr) g_rec->close();
}

// ---------------------------------------------------------------------------------------------
// Output file: MEMFORENSICS_CUPTI_OUT, claimed with O_EXCL so that two CUDA processes of one run
// never write the same file; a process that finds it taken uses <stem>.<pid><ext>.

std::string withPid(const std::string& path) {
  std::string pid = std::to_string(::getpid());
  size_t slash = path.rfind('/');
  size_t dot = path.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1) {
    return path + "." + pid;
  }
  return path.substr(0, dot) + "." + pid + path.substr(dot);
}

bool claim(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

std::string outputPath() {
  const char* env = std::getenv("MEMFORENSICS_CUPTI_OUT");
  std::string path = env != nullptr && env[0] != '\0'
                         ? env
                         : "memforensics-" + std::to_string(::getpid()) + ".bin";
  if (claim(path)) return path;
  std::string alt = withPid(path);
  if (claim(alt)) return alt;
  return {};
}

bool check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::string line = std::string("not recording: ") + what +
                     " failed: " + (msg != nullptr ? msg : "unknown CUPTI error");
  if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    line +=
        " (another CUPTI client holds the process: Nsight Systems/Compute, torch.profiler/Kineto, "
        "DCGM?)";
  }
  logLine(line);
  return false;
}

int initialize() {
  uint32_t version = 0;
  if (cuptiGetVersion(&version) == CUPTI_SUCCESS && version / 10000 != CUPTI_API_VERSION / 10000) {
    logLine("not recording: CUPTI API version " + std::to_string(version) +
            " at run time, built for " + std::to_string(CUPTI_API_VERSION) +
            " (activity record layouts differ)");
    return 0;
  }
  const char* st = std::getenv("MEMFORENSICS_CUPTI_STACKS");
  g_want_stacks = !(st != nullptr && std::strcmp(st, "0") == 0);
  if (g_want_stacks) {
    void* warm[2];
    backtrace(warm, 2);  // loads the unwinder now, not inside the first cudaMalloc
  }

  std::string path = outputPath();
  if (path.empty()) {
    logLine("not recording: cannot create the output file (MEMFORENSICS_CUPTI_OUT)");
    return 0;
  }
  auto sink = ft::FileSink::create(path);
  if (!sink) {
    logLine("not recording: " + sink.error().describe());
    return 0;
  }
  // CUPTI's clock -> Unix epoch (on Linux CUPTI uses CLOCK_REALTIME, so this is ~0; WSL differs).
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t cupti_ns = cuptiNow();
  int64_t offset = cupti_ns == 0 ? 0
                                 : (int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec) -
                                       static_cast<int64_t>(cupti_ns);

  auto* rec = new Recorder(std::move(*sink), path, offset);
  if (memforensics::Status s = rec->begin(); !s.ok()) {
    logLine("not recording: cannot write " + path + ": " + s.error().describe());
    delete rec;
    return 0;
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_rec = rec;
  }
  if (!check(cuptiSubscribe(&g_subscriber, onCallback, nullptr), "cuptiSubscribe") ||
      !check(cuptiEnableDomain(1, g_subscriber, CUPTI_CB_DOMAIN_RUNTIME_API),
             "cuptiEnableDomain(runtime)") ||
      !check(cuptiEnableDomain(1, g_subscriber, CUPTI_CB_DOMAIN_DRIVER_API),
             "cuptiEnableDomain(driver)") ||
      !check(cuptiActivityRegisterCallbacks(bufferRequested, bufferCompleted),
             "cuptiActivityRegisterCallbacks") ||
      !check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMORY2), "cuptiActivityEnable(MEMORY2)") ||
      !check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMORY_POOL),
             "cuptiActivityEnable(MEMORY_POOL)")) {
    // The file stays a valid, empty trace; the subscriber slot is given back for another tool.
    if (g_subscriber != nullptr) cuptiUnsubscribe(g_subscriber);
    g_subscriber = nullptr;
    std::lock_guard<std::mutex> lock(g_mu);
    rec->close(/*quiet=*/true);
    return 0;
  }
  cuptiActivityFlushPeriod(1000);  // deliver buffers at least once a second
  g_pid = ::getpid();
  g_active = true;
  pthread_atfork(nullptr, nullptr, [] { g_active = false; });  // the file belongs to the parent
  // Mappings (cuMemMap/Unmap) come from callbacks, not activity buffers: written within a second.
  // InitializeInjection returns only once this thread runs its loop (or after 2 s): a process that
  // forks right after CUDA starts (DataLoader workers) must not fork while the thread is still
  // starting inside the thread library or the allocator, whose locks the child would inherit held.
  // Under ASan a child so forked hung in its exit-time leak check in 25 of 1,500 loaded runs.
  std::thread([] {
    {
      std::lock_guard<std::mutex> lock(g_flusher_mu);
      g_flusher_running = true;
    }
    g_flusher_cv.notify_all();
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_rec == nullptr || g_rec->closed()) return;
      g_rec->writeBatch();
    }
  }).detach();
  {
    std::unique_lock<std::mutex> lock(g_flusher_mu);
    g_flusher_cv.wait_for(lock, std::chrono::seconds(2), [] { return g_flusher_running; });
  }
  std::atexit(atExit);
  logLine("recording CUDA device memory of pid " + std::to_string(::getpid()) + " to " + path);
  return 1;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  // The driver calls it once per process; a second call answers as the first did.
  static std::once_flag once;
  static int result = 0;
  std::call_once(once, [] {
    try {
      result = initialize();
    } catch (...) {
      logLine("not recording: initialization failed");
      result = 0;
    }
  });
  return result;
}
