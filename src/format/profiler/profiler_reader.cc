// profiler_reader.cc: see profiler_reader.h and docs/profiler-traces.md. What a profiler input
// is (sniffing) and which reader reads it; the readers are in the files profiler_internal.h lists.
#include "format/profiler/profiler_reader.h"

#include <new>
#include <string>

#include "format/profiler/profiler_internal.h"

namespace memforensics::format {

using namespace profiler_detail;

std::string_view profilerCategoryName(uint8_t c) {
  static constexpr std::string_view kNames[kProfilerCategoryCount] = {
      "PARAMETER",  "OPTIMIZER_STATE", "INPUT",           "TEMPORARY",
      "ACTIVATION", "GRADIENT",        "AUTOGRAD_DETAIL", "unknown"};
  if (c == 0 || c > kProfilerCategoryCount) return "";
  return kNames[c - 1];
}

ProfilerKind sniffProfiler(std::span<const uint8_t> bytes) {
  const bool gz = looksLikeGzip(bytes);
  std::string t = prefixText(bytes, 4096);
  size_t i = 0;
  if (t.size() >= 3 && static_cast<uint8_t>(t[0]) == 0xEF && static_cast<uint8_t>(t[1]) == 0xBB &&
      static_cast<uint8_t>(t[2]) == 0xBF)
    i = 3;
  auto ws = [&] {
    while (i < t.size() && (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t')) ++i;
  };
  ws();
  if (i < t.size() && t[i] == '[') {
    ++i;
    ws();
    // A timeline's first item is a row or the times: [[-1, ...  [[10, ...  or empty [[]
    if (i < t.size() && t[i] == '[') {
      ++i;
      ws();
      if (i < t.size() && (t[i] == '-' || t[i] == ']' || (t[i] >= '0' && t[i] <= '9')))
        return ProfilerKind::MemoryTimeline;
    }
    return gz ? ProfilerKind::MemoryTimeline : ProfilerKind::NotProfiler;
  }
  if (i < t.size() && t[i] == '{') {
    ++i;
    ws();
    if (i < t.size() && t[i] == '"') {
      size_t e = t.find('"', i + 1);
      std::string_view k = e == std::string::npos ? std::string_view()
                                                  : std::string_view(t).substr(i + 1, e - i - 1);
      // A snapshot's JSON, gzip or not (gzipped, it was refused as a trace without traceEvents).
      for (std::string_view snapshot_key :
           {"segments", "device_traces", "allocator_settings", "external_annotations"}) {
        if (k == snapshot_key) return ProfilerKind::NotProfiler;
      }
      return ProfilerKind::KinetoTrace;
    }
    return gz ? ProfilerKind::KinetoTrace : ProfilerKind::NotProfiler;
  }
  return gz ? ProfilerKind::KinetoTrace : ProfilerKind::NotProfiler;
}

Expected<Snapshot> readProfilerInput(std::span<const uint8_t> bytes,
                                     const ProfilerReadOptions& options) {
  const bool gz = looksLikeGzip(bytes);
  try {
    switch (sniffProfiler(bytes)) {
      case ProfilerKind::MemoryTimeline:
        return readTimeline(bytes, options, gz);
      case ProfilerKind::KinetoTrace:
        return readKineto(bytes, options, gz);
      case ProfilerKind::NotProfiler:
        break;
    }
  } catch (const std::bad_alloc&) {
    return Error{"out of memory while reading a torch.profiler input", -1};
  }
  return Error{"not a torch.profiler trace or memory timeline", 0};
}

}  // namespace memforensics::format
