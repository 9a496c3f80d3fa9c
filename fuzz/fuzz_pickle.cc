// fuzz_pickle.cc: the whole `analyze` pipeline on arbitrary bytes.
//
// loadSnapshotBytes sniffs the content, so one target covers the pickle reader, the memory_viz
// HTML extraction and the JSON form. Whatever loads is replayed and analyzed per device and
// rendered as JSON and text, as `memforensics analyze [--json]` does, and dumped with its stacks,
// as `memforensics dump --stacks` does. Errors are fine; crashes, sanitizer reports, leaks and
// hangs are not.
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <span>
#include <streambuf>

#include "analysis/analyze.h"
#include "format/load/load.h"
#include "format/model/dump.h"
#include "null_stream.h"
#include "report/render.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memforensics;
  auto snap = format::loadSnapshotBytes(std::span<const uint8_t>(data, size));
  if (!snap) {
    (void)snap.error().describe();
    return 0;
  }
  analysis::AnalysisResult result = analysis::analyzeSnapshot(*snap);
  fuzz::NullBuf buf;
  std::ostream out(&buf);
  report::renderJson(result, out);
  report::renderText(result, out);
  format::dumpSnapshot(*snap, out, format::DumpOptions{.stacks = true});
  return 0;
}
