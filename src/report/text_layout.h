// text_layout.h: terminal text for people (issue 28 item 9): lines wrapped to the terminal's
// width, and the one directory most frame paths share said once instead of on every line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace memforensics::report {

// The width a terminal report wraps to when the terminal's is not known (output to a file or a
// pipe, no COLUMNS).
inline constexpr size_t kDefaultTextWidth = 100;

// OOMs a text output lists per device (analyze with their frames, timeline one line each); the
// rest are counted in one line. --json lists them (analyze up to analysis::kOomsListed).
inline constexpr size_t kTextOoms = 16;

// Every line of `text` longer than `width` columns broken at spaces; continuation lines are
// indented 4 past the line's own indent (2 past it for a "- " list item), at most width / 2.
// A word longer than the room left (a long path) is kept whole on its own line: a path a user
// copies is never split. width 0: `text` unchanged.
std::string wrapLines(std::string_view text, size_t width);

// The directory (with its trailing '/') that, left out of `text`, saves the most characters
// among the directories of `paths` (absolute frame file names): shared by at least
// kCommonPrefixMinUses occurrences and at least kCommonPrefixMinLength long, else "".
inline constexpr size_t kCommonPrefixMinUses = 4;
inline constexpr size_t kCommonPrefixMinLength = 8;
inline constexpr size_t kCommonPrefixCandidates = 64;
inline constexpr size_t kCommonPrefixMaxDepth = 32;   // directories of a path considered
inline constexpr size_t kCommonPrefixMaxPath = 4096;  // longer paths are not considered
std::string commonPathPrefix(std::string_view text, const std::vector<std::string>& paths);

// `text` with every occurrence of `prefix` that starts a path removed (not one inside a longer
// path: /mnt/mirror/workspace/ keeps its /workspace/); "" leaves it unchanged.
std::string stripPrefix(std::string_view text, std::string_view prefix);

}  // namespace memforensics::report
