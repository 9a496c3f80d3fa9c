// parse_size.h: the one parser of byte sizes people type (`check --max-peak-reserved 20GiB`,
// `whatif --capacity 40GB`).
//
// Accepted: a non-negative decimal number, optionally with a fraction, then optionally a unit:
//   B (or none): bytes; KiB MiB GiB TiB PiB: powers of 1024; KB MB GB TB PB: powers of 1000.
// Units are case-insensitive ("20gib"); one space between the number and the unit is allowed.
// A fraction is exact in decimal and the result is rounded down to a whole byte ("1.5GB" is
// 1500000000, "0.1KiB" is 102). Refused with a reason: a bare "K", "M", "G" (binary or decimal is
// ambiguous), fractional bytes ("1.5B"), more than 18 fraction digits, anything that does not fit
// in 64 bits.
#pragma once

#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>

namespace memforensics {

struct SizeParse {
  bool ok = false;
  uint64_t bytes = 0;
  std::string error;  // when !ok: why, e.g. "'20G' is ambiguous: write 20GiB or 20GB"
};

inline SizeParse parseSize(std::string_view text) {
  auto fail = [&](std::string why) {
    SizeParse r;
    r.error = "'" + std::string(text) + "' is not a size: " + why;
    return r;
  };
  size_t i = 0;
  uint64_t whole = 0;
  bool digits = false;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    if (__builtin_mul_overflow(whole, uint64_t{10}, &whole) ||
        __builtin_add_overflow(whole, static_cast<uint64_t>(text[i] - '0'), &whole)) {
      return fail("too large for 64 bits");
    }
    digits = true;
    ++i;
  }
  uint64_t frac = 0, frac_scale = 1;
  if (i < text.size() && text[i] == '.') {
    ++i;
    size_t n = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (++n > 18) return fail("more than 18 digits after the point");
      frac = frac * 10 + static_cast<uint64_t>(text[i] - '0');
      frac_scale *= 10;
      digits = true;
      ++i;
    }
  }
  if (!digits) return fail("expected a number such as 20GiB, 512MiB, 1.5GB or 1073741824");
  const std::string number(text.substr(0, i));
  if (i < text.size() && text[i] == ' ') ++i;
  std::string unit;
  for (; i < text.size(); ++i)
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  uint64_t mult = 1;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else {
    static constexpr std::string_view kPrefixes = "kmgtp";
    if (unit.size() < 2 || unit.size() > 3 || unit.back() != 'b' ||
        kPrefixes.find(unit[0]) == std::string_view::npos || (unit.size() == 3 && unit[1] != 'i')) {
      if (unit.size() == 1 && kPrefixes.find(unit[0]) != std::string_view::npos) {
        const char u = static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0])));
        return fail(std::string("ambiguous unit '") + u + "': write " + number + u +
                    "iB (powers of 1024) or " + number + u + "B (powers of 1000)");
      }
      return fail("unknown unit '" + unit + "' (B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB)");
    }
    const uint64_t base = unit.size() == 3 ? 1024 : 1000;
    for (size_t p = 0; p <= kPrefixes.find(unit[0]); ++p) mult *= base;
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(whole, mult, &bytes)) return fail("too large for 64 bits");
  if (frac != 0) {
    if (mult == 1) return fail("a byte count must be whole");
    // frac * mult / frac_scale in 128 bits: frac < 10^18 and mult <= 1024^5 (about 1.1e15).
    const unsigned __int128 part =
        static_cast<unsigned __int128>(frac) * mult / static_cast<unsigned __int128>(frac_scale);
    if (part > UINT64_MAX || __builtin_add_overflow(bytes, static_cast<uint64_t>(part), &bytes)) {
      return fail("too large for 64 bits");
    }
  }
  SizeParse r;
  r.ok = true;
  r.bytes = bytes;
  return r;
}

}  // namespace memforensics
