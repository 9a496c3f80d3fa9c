// gpu_check_calls.cu: the CUDA program that scripts/gpu-check.sh runs under `memforensics record`
// on a GPU machine. It makes the device-memory calls whose records libmemforensics_cupti.so turns
// into trace events (docs/capture.md, "What a CUDA allocation becomes in the trace") and logs each
// one, as a JSON line, to the file named by its argument; `gpu_check.py cupti` then checks the
// trace against that log.
//
//   nvcc -O1 -o gpu_check_calls scripts/gpu_check_calls.cu -lcuda && ./gpu_check_calls calls.jsonl
//
// Calls, all on device 0: cudaMalloc of 1 MiB + 1000 bytes (not a multiple of 512) and of 64 MiB;
// cudaFree of the first; a pinned host allocation (counted, not traced); an explicit memory pool
// with cudaMallocFromPoolAsync (3000 bytes) and cudaMallocAsync from the default pool (8 MiB) on a
// created stream, both freed with cudaFreeAsync; cuMemCreate + cuMemMap of two granules at the
// start of a reserved range and one more granule after them, one cuMemUnmap of the whole range
// (it must free both mappings), cuMemRelease; cudaFree of the 64 MiB allocation. Exits 0 when
// every call succeeded, 1 with the failing call on stderr otherwise.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace {

FILE* g_log = nullptr;

void fail(const char* what, int code) {
  std::fprintf(stderr, "gpu_check_calls: %s failed with %d\n", what, code);
  std::exit(1);
}
#define RT(call)                            \
  do {                                      \
    cudaError_t e_ = (call);                \
    if (e_ != cudaSuccess) fail(#call, e_); \
  } while (0)
#define DRV(call)                            \
  do {                                       \
    CUresult e_ = (call);                    \
    if (e_ != CUDA_SUCCESS) fail(#call, e_); \
  } while (0)

// op: the API; addr/size: what it handed out or released; async/pool: stream-ordered details.
void logCall(const char* op, unsigned long long addr, unsigned long long size, int async = 0,
             int pool = 0) {
  std::fprintf(g_log,
               "{\"op\": \"%s\", \"device\": 0, \"addr\": %llu, \"size\": %llu, \"async\": %d, "
               "\"pool\": %d}\n",
               op, addr, size, async, pool);
  std::fflush(g_log);
}

unsigned long long u(const void* p) {
  return reinterpret_cast<unsigned long long>(p);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gpu_check_calls LOG.jsonl\n");
    return 2;
  }
  g_log = std::fopen(argv[1], "w");
  if (!g_log) fail("fopen", 0);
  RT(cudaSetDevice(0));
  RT(cudaFree(nullptr));  // context creation

  // Plain allocations.
  const size_t n1 = (1u << 20) + 1000, n2 = 64u << 20;
  void *p1 = nullptr, *p2 = nullptr;
  RT(cudaMalloc(&p1, n1));
  logCall("cudaMalloc", u(p1), n1);
  RT(cudaMalloc(&p2, n2));
  logCall("cudaMalloc", u(p2), n2);
  RT(cudaFree(p1));
  logCall("cudaFree", u(p1), n1);
  void* host = nullptr;
  RT(cudaMallocHost(&host, 1 << 20));  // pinned host memory: counted, not traced
  RT(cudaFreeHost(host));

  // Stream-ordered allocations: an explicit pool and the device's default pool.
  cudaStream_t stream;
  RT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool;
  RT(cudaMemPoolCreate(&pool, &props));
  void *a1 = nullptr, *a2 = nullptr;
  const size_t na1 = 3000, na2 = 8u << 20;
  RT(cudaMallocFromPoolAsync(&a1, na1, pool, stream));
  logCall("cudaMallocFromPoolAsync", u(a1), na1, 1, 1);
  RT(cudaMallocAsync(&a2, na2, stream));
  logCall("cudaMallocAsync", u(a2), na2, 1, 0);
  RT(cudaFreeAsync(a1, stream));
  logCall("cudaFreeAsync", u(a1), na1, 1, 1);
  RT(cudaFreeAsync(a2, stream));
  logCall("cudaFreeAsync", u(a2), na2, 1, 0);
  RT(cudaStreamSynchronize(stream));
  RT(cudaMemPoolDestroy(pool));
  RT(cudaStreamDestroy(stream));

  // Virtual memory management (PyTorch's expandable segments).
  CUmemAllocationProp vp = {};
  vp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  vp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  vp.location.id = 0;
  size_t gran = 0;
  DRV(cuMemGetAllocationGranularity(&gran, &vp, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUdeviceptr va = 0;
  DRV(cuMemAddressReserve(&va, 4 * gran, 0, 0, 0));
  CUmemGenericAllocationHandle h1, h2;
  DRV(cuMemCreate(&h1, 2 * gran, &vp, 0));
  DRV(cuMemCreate(&h2, gran, &vp, 0));
  DRV(cuMemMap(va, 2 * gran, 0, h1, 0));
  logCall("cuMemMap", va, 2 * gran);
  DRV(cuMemMap(va + 2 * gran, gran, 0, h2, 0));
  logCall("cuMemMap", va + 2 * gran, gran);
  CUmemAccessDesc access = {};
  access.location = vp.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DRV(cuMemSetAccess(va, 3 * gran, &access, 1));
  DRV(cuMemUnmap(va, 3 * gran));
  logCall("cuMemUnmap", va, 3 * gran);
  DRV(cuMemRelease(h1));
  DRV(cuMemRelease(h2));
  DRV(cuMemAddressFree(va, 4 * gran));

  RT(cudaFree(p2));
  logCall("cudaFree", u(p2), n2);
  RT(cudaDeviceSynchronize());
  std::fclose(g_log);
  return 0;
}
