// gzip_source.cc: the gzip budgets and helpers of profiler_reader.h and profiler_internal.h.
#include <algorithm>

#include "common/saturating.h"
#include "format/profiler/profiler_internal.h"

namespace memforensics::format {

uint64_t gzipDecodedBudget(uint64_t compressed_bytes) {
  return std::max(mulSat(compressed_bytes, kGzipExpansionPerInputByte), kGzipDecodedFloor);
}

uint64_t gzipSnapshotJsonBudget(uint64_t compressed_bytes) {
  return std::max(mulSat(compressed_bytes, kGzipSnapshotJsonExpansion), kGzipDecodedFloor);
}

bool looksLikeGzip(std::span<const uint8_t> b) {
  return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b;
}

Expected<std::vector<uint8_t>> gunzipBounded(std::span<const uint8_t> bytes, uint64_t budget) {
  profiler_detail::ByteSource src(bytes, true, budget, nullptr);
  std::vector<uint8_t> out;
  for (int ch; (ch = src.next()) >= 0;) out.push_back(static_cast<uint8_t>(ch));
  if (!src.error().empty()) return Error{src.error(), -1};
  return out;
}

namespace profiler_detail {

std::string sizeText(const ByteSource& src, size_t input) {
  if (!src.gzip()) return std::to_string(input) + " bytes";
  return "gzip, " + std::to_string(input) + " bytes -> " + std::to_string(src.decoded()) +
         " decompressed";
}

std::string prefixText(std::span<const uint8_t> bytes, size_t want) {
  std::string out;
  if (!looksLikeGzip(bytes)) {
    out.assign(reinterpret_cast<const char*>(bytes.data()), std::min(bytes.size(), want));
    return out;
  }
  ByteSource src(bytes, true, want + (1u << 20), nullptr);
  while (out.size() < want) {
    int ch = src.next();
    if (ch < 0) break;
    out.push_back(static_cast<char>(ch));
  }
  return out;
}

}  // namespace profiler_detail

}  // namespace memforensics::format
