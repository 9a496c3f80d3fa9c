// cupti_fake_cupti.cc: a stand-in libcupti.so.13 for testing libmemforensics_cupti.so without a
// GPU.
//
// It implements the CUPTI functions the injection library calls (subscribe, activity buffers,
// record iteration, timestamps) and adds a control API, fakeCupti*, with which a test program
// plays the driver: API callbacks (enter/exit) and activity records delivered in buffers. Test
// programs load it by path before the injection library, whose DT_NEEDED libcupti.so.13 then
// resolves to it. Same soname and symbol version as the real library (cupti_fake_cupti.map).
#include <cupti.h>
#include <time.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

CUpti_CallbackFunc g_callback = nullptr;
void* g_userdata = nullptr;
CUpti_BuffersCallbackRequestFunc g_request = nullptr;
CUpti_BuffersCallbackCompleteFunc g_complete = nullptr;
uint8_t* g_buffer = nullptr;
size_t g_buffer_size = 0;
size_t g_used = 0;
int g_subscribers = 0;

size_t recordSize(const CUpti_Activity* r) {
  switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_MEMORY2:
      return sizeof(CUpti_ActivityMemory4);
    case CUPTI_ACTIVITY_KIND_MEMORY_POOL:
      return sizeof(CUpti_ActivityMemoryPool3);
    default:
      return sizeof(CUpti_Activity);
  }
}

}  // namespace

extern "C" {

CUptiResult CUPTIAPI cuptiGetVersion(uint32_t* version) {
  const char* v = std::getenv("FAKE_CUPTI_VERSION");
  *version = v != nullptr ? static_cast<uint32_t>(std::atoi(v)) : CUPTI_API_VERSION;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
                                    void* userdata) {
  if (std::getenv("FAKE_CUPTI_BUSY") != nullptr || g_subscribers > 0) {
    return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  }
  ++g_subscribers;
  g_callback = callback;
  g_userdata = userdata;
  *subscriber = reinterpret_cast<CUpti_SubscriberHandle>(&g_callback);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiUnsubscribe(CUpti_SubscriberHandle) {
  g_callback = nullptr;
  --g_subscribers;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiEnableDomain(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain) {
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                    CUpti_BuffersCallbackCompleteFunc complete) {
  g_request = request;
  g_complete = complete;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind) {
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiActivityFlushPeriod(uint32_t) {
  return CUPTI_SUCCESS;
}

void fakeCuptiDeliver();

CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t) {
  fakeCuptiDeliver();
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid,
                                                CUpti_Activity** record) {
  uint8_t* next =
      *record == nullptr ? buffer : reinterpret_cast<uint8_t*>(*record) + recordSize(*record);
  if (next + sizeof(CUpti_Activity) > buffer + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<CUpti_Activity*>(next);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext, uint32_t, size_t* dropped) {
  *dropped = 0;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetDeviceId(CUcontext, uint32_t* device) {
  *device = 0;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char** str) {
  *str = result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
             ? "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
             : "CUPTI_ERROR_FAKE";
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetTimestamp(uint64_t* timestamp) {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  *timestamp = static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
  return CUPTI_SUCCESS;
}

// ---- control API for tests -------------------------------------------------------------------

// One API callback, as the driver makes it around every call.
void fakeCuptiCall(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, CUpti_ApiCallbackSite site,
                   uint32_t correlation_id, const void* params, const void* return_value) {
  if (g_callback == nullptr) return;
  CUpti_CallbackData data;
  std::memset(&data, 0, sizeof data);
  data.callbackSite = site;
  data.functionName = "fake";
  data.functionParams = params;
  data.functionReturnValue = const_cast<void*>(return_value);
  data.correlationId = correlation_id;
  g_callback(g_userdata, domain, cbid, &data);
}

// Appends an activity record to the current buffer (requesting one from the client first).
bool fakeCuptiRecord(const void* record, size_t size) {
  if (g_request == nullptr) return false;
  if (g_buffer == nullptr) {
    size_t max_records = 0;
    g_request(&g_buffer, &g_buffer_size, &max_records);
    g_used = 0;
    if (g_buffer == nullptr) return false;
  }
  if (g_used + size > g_buffer_size) return false;
  std::memcpy(g_buffer + g_used, record, size);
  g_used += size;
  return true;
}

// Hands the current buffer to the client's completion callback (which frees it).
void fakeCuptiDeliver() {
  if (g_buffer == nullptr || g_complete == nullptr) return;
  uint8_t* b = g_buffer;
  size_t size = g_buffer_size, used = g_used;
  g_buffer = nullptr;
  g_used = 0;
  g_complete(nullptr, 0, b, size, used);
}

}  // extern "C"
