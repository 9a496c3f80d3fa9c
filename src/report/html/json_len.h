// json_len.h: decimal characters of an integer as JSON writes it, for the page's byte budgets
// (the allocation view's and event stepping's are counted in them).
#pragma once
#include <cstddef>
#include <cstdint>

namespace memforensics::analysis {

inline size_t jsonLenU(uint64_t u) {
  size_t n = 1;
  while (u >= 10) {
    u /= 10;
    ++n;
  }
  return n;
}

inline size_t jsonLen(int64_t v) {
  return v < 0 ? 1 + jsonLenU(static_cast<uint64_t>(-(v + 1)) + 1)
               : jsonLenU(static_cast<uint64_t>(v));
}

}  // namespace memforensics::analysis
