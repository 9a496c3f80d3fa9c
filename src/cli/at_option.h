// at_option.h: the `--at` argument of `blocks` (peak | oom | EVENT_INDEX | tTIME_US |
// t+DURATION, the relative times the text output prints).
//
// Parsing is the CLI's business; analysis/session/blocks.h receives the parsed BlocksAt and
// resolves it on a device (resolveBlocksAt). Header-only, so the fuzz targets parse the same way.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "analysis/session/blocks.h"
#include "common/status.h"

namespace memforensics::cli {

// "t+1.442 s", "t+1.442s", "t+105.1ms", "t+250us" as `analyze` prints a moment (the time since the
// device's first event): the printed figure is rounded, so the moment is the end of the interval
// it stands for (1.442 s: up to 1.4425 s), in whole microseconds. A whole number (250us, 2s) is
// exact: analyze prints microseconds that way, and a bare "2s" is not a rounded figure. Leading
// zeros do not count towards the 18 digits. A duration that does not fit in int64 microseconds is
// refused.
inline Expected<int64_t> parseElapsedUs(std::string_view s) {
  size_t i = 0;
  uint64_t mant = 0;
  int frac = -1;  // digits after the point; -1: no point
  int digits = 0;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '.' && frac < 0) {
      frac = 0;
      continue;
    }
    if (c < '0' || c > '9') break;
    if (mant != 0 || c != '0') ++digits;  // leading zeros are not digits
    if (digits > 18) return Error{"too many digits"};
    mant = mant * 10 + static_cast<uint64_t>(c - '0');
    if (frac >= 0 && ++frac > 18) return Error{"too many digits after the point"};
  }
  if (i == 0 || (i == 1 && frac == 0)) return Error{"no number"};
  std::string_view unit = s.substr(i);
  if (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  int per = 0;  // the unit is 10^per microseconds
  if (unit == "us") {
    per = 0;
  } else if (unit == "ms") {
    per = 3;
  } else if (unit == "s") {
    per = 6;
  } else {
    return Error{"the unit must be us, ms or s"};
  }
  // floor((mant + 1/2) * 10^(per - frac)): the end of the printed figure's rounding interval; a
  // whole number is mant * 10^per.
  const uint64_t twice = 2 * mant + (frac > 0 ? 1 : 0);  // < 2 * 10^18 + 1: no overflow
  const int shift = per - std::max(frac, 0);
  uint64_t pow10 = 1;
  for (int k = 0; k < (shift < 0 ? -shift : shift); ++k) pow10 *= 10;  // at most 10^18
  uint64_t us = 0;
  if (shift >= 0) {
    if (twice > UINT64_MAX / pow10) return Error{"too large"};
    us = twice * pow10 / 2;
  } else {
    us = twice / (2 * pow10);
  }
  if (us > static_cast<uint64_t>(INT64_MAX)) return Error{"too large"};
  return static_cast<int64_t>(us);
}

// "peak" | "oom" | EVENT_INDEX (a decimal int64, -1 = the start state) | tTIME_US | t+DURATION.
inline Expected<analysis::BlocksAt> parseAtOption(std::string_view s) {
  using analysis::BlocksAt;
  BlocksAt a;
  if (s.size() > 2 && s.substr(0, 2) == "t+") {
    auto us = parseElapsedUs(s.substr(2));
    if (!us) {
      return Error{
          "--at t+DURATION expects a time since the first event as analyze prints it "
          "(t+1.442s, t+105.1ms, t+250us), got '" +
          std::string(s) + "': " + us.error().message};
    }
    a.kind = BlocksAt::Kind::Elapsed;
    a.value = *us;
    return a;
  }
  if (s == "peak") return a;
  if (s == "oom") {
    a.kind = BlocksAt::Kind::Oom;
    return a;
  }
  std::string_view num = s;
  if (!s.empty() && s[0] == 't') {
    a.kind = BlocksAt::Kind::Time;
    num = s.substr(1);
  } else {
    a.kind = BlocksAt::Kind::Event;
  }
  auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), a.value);
  if (num.empty() || ec != std::errc() || p != num.data() + num.size()) {
    return Error{"--at expects peak, oom, an event index, tTIME_US or t+DURATION, got '" +
                 std::string(s) + "'"};
  }
  return a;
}

}  // namespace memforensics::cli
