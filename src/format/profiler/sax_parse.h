// sax_parse.h: a SAX handler run over a profiler input's text (profiler_internal.h), for the
// Kineto and memory-timeline readers.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "format/profiler/profiler_internal.h"

namespace memforensics::format::profiler_detail {

// The decompressed-text budget of one input: the caller's, else gzipDecodedBudget of its size.
inline uint64_t decodedBudget(const ProfilerReadOptions& options, size_t input_bytes) {
  return options.max_decoded_bytes ? options.max_decoded_bytes : gzipDecodedBudget(input_bytes);
}

// Runs `sax` over the source's text. The source's error (a budget, a corrupt gzip stream) comes
// first, then the parser's exception, each prefixed with `what` ("memory timeline: ..."); else
// whether the parser accepted the text (false: the handler stopped it or the JSON is invalid).
template <typename Sax>
Expected<bool> saxParse(ByteSource& src, Sax& sax, std::string_view what) {
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(SourceIter(&src), SourceIter(), &sax);
  } catch (const nlohmann::json::exception& e) {
    if (src.error().empty()) return Error{std::string(what) + ": " + e.what(), -1};
  }
  if (!src.error().empty()) return Error{std::string(what) + ": " + src.error(), -1};
  return ok;
}

}  // namespace memforensics::format::profiler_detail
