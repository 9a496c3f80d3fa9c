// options.h: checks shared by the commands' numeric options.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>

namespace memforensics::cli {

// CLI11 (2.1) saturates a signed 64-bit option given a number beyond its range: --device
// 18446744073709551616 became device 9223372036854775807 without a word. This validator accepts
// only a decimal integer (optional '-') that fits in int64_t, so anything else is a usage error.
inline const CLI::Validator kInt64Option(
    [](std::string& s) -> std::string {
      int64_t v = 0;
      const char* end = s.data() + s.size();
      auto [p, ec] = std::from_chars(s.data(), end, v);
      if (s.empty() || ec != std::errc() || p != end) {
        return "'" + s + "' is not a whole number from " + std::to_string(INT64_MIN) + " to " +
               std::to_string(INT64_MAX);
      }
      return {};
    },
    "INT64");

// A finite decimal number from 0 to `max` (CLI::Range lets NaN through: every comparison with it is
// false, so `check --max-increase nan` was a gate that never failed).
inline CLI::Validator percentOption(double max) {
  return CLI::Validator(
      [max](std::string& s) -> std::string {
        double v = 0;
        const char* end = s.data() + s.size();
        auto [p, ec] = std::from_chars(s.data(), end, v);
        if (s.empty() || ec != std::errc() || p != end || !std::isfinite(v) || v < 0 || v > max)
          return "'" + s + "' is not a number from 0 to " +
                 std::to_string(static_cast<int64_t>(max));
        return {};
      },
      "PCT");
}

}  // namespace memforensics::cli
