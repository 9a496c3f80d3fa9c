// cupti_inject_sim.cc: plays a CUDA process for libmemforensics_cupti.so on a machine without a
// GPU.
//
// Usage: cupti_inject_sim FAKE_LIBCUPTI INJECTION_LIB|env MODE   (MEMFORENSICS_CUPTI_OUT names the
// trace) Loads the stand-in libcupti (cupti_fake_cupti.cc), then the injection library, calls
// InitializeInjection as the driver would, and makes the API callbacks and activity records of:
//   device 0: cudaMalloc(1 MiB) (record carrying the nested cuMemAlloc's correlation id), an async
//             allocation of 3000 bytes on stream 5 from a pool, cudaFree of the first;
//   device 1: cuMemCreate + cuMemMap of 2 MiB (traced from callbacks; its MEMORY2 record ignored),
//             a pinned host allocation (counted, not traced), a memory pool created.
// MODE normal: returns from main (atexit closes the trace); a forked child exits first and must
// not touch the file. MODE killed: _exit after the buffer was delivered (no atexit): the trace is
// cut but holds the events. MODE busy: another CUPTI client holds the process (subscribe fails).
// record_test.py checks the traces with `memforensics analyze --json` and `dump --stacks`.
#include <cupti.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

using CallFn = void (*)(CUpti_CallbackDomain, CUpti_CallbackId, CUpti_ApiCallbackSite, uint32_t,
                        const void*, const void*);
using RecordFn = bool (*)(const void*, size_t);
using DeliverFn = void (*)();
CallFn g_call;
RecordFn g_record;
DeliverFn g_deliver;

const int kCudaSuccess = 0;
const CUresult kCuSuccess = CUDA_SUCCESS;

CUpti_ActivityMemory4 memRecord(CUpti_ActivityMemoryOperationType op, uint32_t device,
                                uint64_t addr, uint64_t bytes, uint32_t corr) {
  CUpti_ActivityMemory4 r;
  std::memset(&r, 0, sizeof r);
  r.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
  r.memoryOperationType = op;
  r.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  r.correlationId = corr;
  r.address = addr;
  r.bytes = bytes;
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);  // the fake CUPTI clock
  r.timestamp = static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
  r.deviceId = device;
  r.streamId = CUPTI_INVALID_STREAM_ID;
  return r;
}

}  // namespace

// The "user code" frames the stacks must show (exported: ENABLE_EXPORTS).
extern "C" __attribute__((noinline, visibility("default"))) void simUserMalloc() {
  g_call(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, CUPTI_API_ENTER,
         10, nullptr, nullptr);
  g_call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, CUPTI_API_ENTER, 11,
         nullptr, nullptr);
  g_call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, CUPTI_API_EXIT, 11,
         nullptr, &kCuSuccess);
  g_call(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, CUPTI_API_EXIT, 10,
         nullptr, &kCudaSuccess);
  auto r =
      memRecord(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION, 0, 0x7f0000000000, 1 << 20, 11);
  g_record(&r, sizeof r);
}

extern "C" __attribute__((noinline, visibility("default"))) void simUserMallocAsync() {
  g_call(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020,
         CUPTI_API_ENTER, 20, nullptr, nullptr);
  g_call(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020,
         CUPTI_API_EXIT, 20, nullptr, &kCudaSuccess);
  auto r = memRecord(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION, 0, 0x7e0000000000, 3000, 20);
  r.isAsync = 1;
  r.streamId = 5;
  r.memoryPoolConfig.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
  r.memoryPoolConfig.address = 0x7e0000000000;
  r.memoryPoolConfig.pool.size = 32 << 20;
  g_record(&r, sizeof r);
}

extern "C" __attribute__((noinline, visibility("default"))) void simUserFree() {
  g_call(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, CUPTI_API_ENTER, 30,
         nullptr, nullptr);
  g_call(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, CUPTI_API_EXIT, 30,
         nullptr, &kCudaSuccess);
  auto r = memRecord(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE, 0, 0x7f0000000000, 1 << 20, 30);
  g_record(&r, sizeof r);
}

extern "C" __attribute__((noinline, visibility("default"))) void simUserMap() {
  CUmemGenericAllocationHandle handle = 0xabc;
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 1;
  cuMemCreate_params create{&handle, 2 << 20, &prop, 0};
  g_call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemCreate, CUPTI_API_ENTER, 40,
         &create, nullptr);
  g_call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemCreate, CUPTI_API_EXIT, 40,
         &create, &kCuSuccess);
  cuMemMap_params map{0x7d0000000000, 2 << 20, 0, handle, 0};
  g_call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemMap, CUPTI_API_ENTER, 41, &map,
         nullptr);
  g_call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemMap, CUPTI_API_EXIT, 41, &map,
         &kCuSuccess);
  // Should the driver report the mapping as a MEMORY2 record too, it must not count twice.
  auto r =
      memRecord(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION, 1, 0x7d0000000000, 2 << 20, 41);
  g_record(&r, sizeof r);
  // A failed call leaves nothing behind.
  const CUresult oom = CUDA_ERROR_OUT_OF_MEMORY;
  cuMemMap_params bad{0x7d0000400000, 2 << 20, 0, handle, 0};
  g_call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemMap, CUPTI_API_ENTER, 42, &bad,
         nullptr);
  g_call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuMemMap, CUPTI_API_EXIT, 42, &bad,
         &oom);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s FAKE_LIBCUPTI INJECTION_LIB normal|killed|busy\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[3];
  void* fake = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (fake == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 2;
  }
  g_call = reinterpret_cast<CallFn>(dlsym(fake, "fakeCuptiCall"));
  g_record = reinterpret_cast<RecordFn>(dlsym(fake, "fakeCuptiRecord"));
  g_deliver = reinterpret_cast<DeliverFn>(dlsym(fake, "fakeCuptiDeliver"));
  // "env": the library the driver would load, from CUDA_INJECTION64_PATH (as `record` sets it).
  const char* lib =
      std::strcmp(argv[2], "env") == 0 ? std::getenv("CUDA_INJECTION64_PATH") : argv[2];
  void* inj = lib != nullptr ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (inj == nullptr || g_call == nullptr || g_record == nullptr || g_deliver == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n",
                 lib != nullptr ? lib : "(CUDA_INJECTION64_PATH unset)", dlerror());
    return 2;
  }
  auto init = reinterpret_cast<int (*)()>(dlsym(inj, "InitializeInjection"));
  if (init == nullptr) {
    std::fprintf(stderr, "InitializeInjection not exported\n");
    return 2;
  }
  int rc = init();
  std::printf("InitializeInjection=%d\n", rc);
  std::fflush(stdout);
  if (mode == "busy") return rc == 0 ? 0 : 1;
  if (rc != 1) return 1;

  simUserMalloc();
  simUserMallocAsync();
  simUserFree();
  simUserMap();
  auto pinned = memRecord(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION, 0, 0x1000, 4096, 50);
  pinned.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_PINNED;
  g_record(&pinned, sizeof pinned);
  CUpti_ActivityMemoryPool3 pool;
  std::memset(&pool, 0, sizeof pool);
  pool.kind = CUPTI_ACTIVITY_KIND_MEMORY_POOL;
  pool.memoryPoolOperationType = CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED;
  pool.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
  pool.deviceId = 1;
  pool.address = 0x7c0000000000;
  g_record(&pool, sizeof pool);
  g_deliver();

  if (mode == "killed") _exit(0);  // as after SIGKILL: no atexit, no trailer
  // A child forked after CUDA initialisation exits normally: its atexit must leave the file alone.
  pid_t child = fork();
  if (child == 0) std::exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return 0;
}
