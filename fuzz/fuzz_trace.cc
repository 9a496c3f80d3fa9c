// fuzz_trace.cc: the native trace reader on arbitrary bytes.
//
// Four ways in: the chunk reader on its own (every accessor of every chunk), the state-at-event
// lookup through checkpoints, the whole load (strict and --salvage) followed by `analyze` and
// `dump`, as the command line does, and the load that `analyze` makes (events left encoded, one
// device decoded at a time), which must give the whole load's analysis byte for byte. The input is
// prefixed with a valid file header when it does not start with one, so the fuzzer spends its time
// on chunks rather than on the magic.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <span>
#include <streambuf>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "format/load/load.h"
#include "format/model/dump.h"
#include "format/trace/trace_reader.h"
#include "null_stream.h"
#include "report/render.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memforensics;
  using namespace memforensics::format::trace;
  std::vector<uint8_t> buf;
  std::span<const uint8_t> in(data, size);
  if (size < 8 || std::memcmp(data, kMagic, 8) != 0) {
    buf.resize(kHeaderSize);
    std::memcpy(buf.data(), kMagic, 8);
    putU16(buf.data() + 8, kVersionMajor);
    putU16(buf.data() + 10, kVersionMinor);
    putU32(buf.data() + 12, kHeaderSize);
    putU32(buf.data() + 28, crc32c(0, buf.data(), 28));
    buf.insert(buf.end(), data, data + size);
    in = buf;
  }

  if (auto r = TraceReader::open(in)) {
    uint64_t sum = 0;
    while ((*r)->next()) {
      for (const auto& e : (*r)->events()) sum += e.addr + e.stack;
      for (const auto& [d, st] : (*r)->checkpoint())
        sum += d + st.live().size() + st.reserved().size();
    }
    for (const auto& s : (*r)->stacks()) sum += s.parent;
    for (const auto& b : (*r)->blocks()) sum += b.size;
    sum += (*r)->end().lost_bytes;
    (void)sum;
  }
  (void)peekTrailer(in);
  for (uint64_t n : {uint64_t{0}, uint64_t{3}, uint64_t{1000}}) (void)traceStateAt(in, 0, n);

  fuzz::NullBuf nb;
  std::ostream out(&nb);
  for (bool salvage : {false, true}) {
    format::LoadOptions opt;
    opt.salvage = salvage;
    auto snap = format::loadSnapshotBytes(in, opt);
    if (!snap) continue;
    auto result = analysis::analyzeSnapshot(*snap);
    report::renderJson(result, out);
    format::dumpSnapshot(*snap, out, format::DumpOptions{.stacks = true});
  }
  // `analyze` leaves a native trace's events encoded and decodes one device at a time
  // (LoadOptions::defer_events): the file must load, and analyze, exactly as the whole-file load.
  {
    format::LoadOptions opt;
    opt.threads = 2;
    auto whole = format::loadSnapshotBytes(in, opt);
    opt.defer_events = true;
    auto deferred = format::loadSnapshotBytes(in, opt);
    if (whole.ok() != deferred.ok()) __builtin_trap();
    if (whole.ok()) {
      const std::string a = report::renderJsonString(analysis::analyzeSnapshot(*whole));
      const std::string b = report::renderJsonString(analysis::analyzeSnapshot(*deferred));
      if (a != b) __builtin_trap();
    }
  }
  return 0;
}
