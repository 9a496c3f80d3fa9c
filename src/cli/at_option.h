// at_option.h: the `--at` argument of `blocks` (peak | oom | EVENT_INDEX | tTIME_US).
//
// Parsing is the CLI's business; analysis/session/blocks.h receives the parsed BlocksAt and
// resolves it on a device (resolveBlocksAt). Header-only, so the fuzz targets parse the same way.
#pragma once

#include <charconv>
#include <string>
#include <string_view>

#include "analysis/session/blocks.h"
#include "common/status.h"

namespace memforensics::cli {

// "peak" | "oom" | EVENT_INDEX (a decimal int64, -1 = the start state) | tTIME_US.
inline Expected<analysis::BlocksAt> parseAtOption(std::string_view s) {
  using analysis::BlocksAt;
  BlocksAt a;
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
    return Error{"--at expects peak, oom, an event index or tTIME_US, got '" + std::string(s) +
                 "'"};
  }
  return a;
}

}  // namespace memforensics::cli
