// fuzz_profiler.cc: the torch.profiler reader (Kineto chrome traces, export_memory_timeline files,
// plain or gzip) on arbitrary bytes, then what the command line does with a loaded trace:
// `analyze` rendered as JSON and text, and `dump`.
//
// The input goes in twice: as it is (the sniffer decides: a Kineto trace, a memory timeline, or
// neither), and forced through the Kineto reader when it does not start like one (prefixed with
// `{"traceEvents":`), so mutations of event bodies are not all lost to the sniffer. Seeds:
// fuzz/corpus/fuzz_profiler/ (tools/make_profiler_traces.py --seeds writes them); dictionary:
// fuzz/profiler.dict.
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <span>
#include <string_view>
#include <vector>

#include "analysis/analyze.h"
#include "format/load/load.h"
#include "format/model/dump.h"
#include "format/profiler/profiler_reader.h"
#include "null_stream.h"
#include "report/render.h"

namespace {

void pipeline(std::span<const uint8_t> in) {
  using namespace memforensics;
  format::ProfilerReadOptions po;
  po.max_decoded_bytes = 8u << 20;  // keeps a bomb from costing the fuzzer seconds
  (void)format::sniffProfiler(in);
  auto snap = format::readProfilerInput(in, po);
  if (!snap) return;
  fuzz::NullBuf nb;
  std::ostream out(&nb);
  auto result = analysis::analyzeSnapshot(*snap);
  report::renderJson(result, out);
  report::renderText(result, out);
  format::dumpSnapshot(*snap, out, format::DumpOptions{.stacks = true});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  pipeline(in);
  if (memforensics::format::sniffProfiler(in) != memforensics::format::ProfilerKind::KinetoTrace) {
    constexpr std::string_view kPrefix = "{\"traceEvents\":";
    std::vector<uint8_t> buf(kPrefix.begin(), kPrefix.end());
    buf.insert(buf.end(), data, data + size);
    pipeline(buf);
  }
  // Through the content sniffing of every input kind, as `analyze FILE` does.
  if (auto snap = memforensics::format::loadSnapshotBytes(in)) (void)snap->devices();
  return 0;
}
