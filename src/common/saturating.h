// saturating.h: byte arithmetic that stops at the ends of uint64_t instead of wrapping (hostile
// sizes in a file must never turn a sum into a small number).
#pragma once

#include <cstdint>

namespace memforensics {

// a + b, or 2^64-1 when that overflows.
inline uint64_t addSat(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? ~uint64_t{0} : r;
}
// a + b, or 2^64-1 when that overflows (*overflowed set, never cleared).
inline uint64_t addSat(uint64_t a, uint64_t b, bool* overflowed) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) {
    *overflowed = true;
    return ~uint64_t{0};
  }
  return r;
}
// a - b, or 0 when b > a.
inline uint64_t subSat(uint64_t a, uint64_t b) {
  return a > b ? a - b : 0;
}
// a * b, or 2^64-1 when that overflows.
inline uint64_t mulSat(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? ~uint64_t{0} : r;
}

}  // namespace memforensics
