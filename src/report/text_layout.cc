// text_layout.cc: wrapping and the common path prefix of the terminal report (text_layout.h).
#include "report/text_layout.h"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <map>

namespace memforensics::report {

namespace {

// A unit that stays on the line of its number ("68.58 GiB", "5.6 ms").
bool isUnit(std::string_view word) {
  for (std::string_view u : {"B", "B)", "B,", "B;", "KiB", "MiB", "GiB", "TiB", "ms", "us", "s"}) {
    if (word.substr(0, u.size()) == u &&
        (word.size() == u.size() || !std::isalpha(static_cast<unsigned char>(word[u.size()]))))
      return true;
  }
  return false;
}

// Whether a line may break at the space at `i` of `s`: not between a number and its unit.
bool breakable(std::string_view s, size_t i) {
  if (i == 0 || i + 1 >= s.size()) return true;
  if (!std::isdigit(static_cast<unsigned char>(s[i - 1]))) return true;
  const size_t end = s.find(' ', i + 1);
  return !isUnit(s.substr(i + 1, end == std::string_view::npos ? end : end - i - 1));
}

void wrapOne(std::string_view line, size_t width, std::string& out) {
  size_t indent = 0;
  while (indent < line.size() && line[indent] == ' ') ++indent;
  const bool item = line.substr(indent, 2) == "- ";
  const size_t hang = std::min(indent + (item ? 2 : 4), width / 2);
  const std::string pad(hang, ' ');
  std::string_view rest = line;
  bool first = true;
  while (true) {
    const size_t lead = first ? 0 : hang;
    if (lead + rest.size() <= width) {
      if (!first) out += pad;
      out += rest;
      return;
    }
    // The last space that keeps the line within the width, past the indent; else the first
    // space after it (the word is longer than the room: kept whole).
    const size_t room = width - lead;
    const size_t min_cut = first ? indent + 1 : 1;
    size_t cut = rest.rfind(' ', room);
    while (cut != std::string_view::npos && cut >= min_cut && !breakable(rest, cut))
      cut = cut == 0 ? std::string_view::npos : rest.rfind(' ', cut - 1);
    if (cut == std::string_view::npos || cut < min_cut) {
      cut = rest.find(' ', std::max(room, min_cut));
      while (cut != std::string_view::npos && !breakable(rest, cut)) cut = rest.find(' ', cut + 1);
      if (cut == std::string_view::npos) {
        if (!first) out += pad;
        out += rest;
        return;
      }
    }
    if (!first) out += pad;
    std::string_view piece = rest.substr(0, cut);
    while (!piece.empty() && piece.back() == ' ') piece.remove_suffix(1);
    out += piece;
    out += '\n';
    rest.remove_prefix(cut);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    if (rest.empty()) {
      out.pop_back();  // the line ended in spaces: no empty continuation
      return;
    }
    first = false;
  }
}

// Whether `what` found at `at` of `text` starts a path: not the tail of a longer one
// (/mnt/mirror/workspace/x.py holds /workspace/, which must stay).
bool startsPath(std::string_view text, size_t at) {
  if (at == 0) return true;
  const auto c = static_cast<unsigned char>(text[at - 1]);
  return !(std::isalnum(c) || c == '/' || c == '.' || c == '_' || c == '-' || c == '~' ||
           c == '+' || c == '@' || c >= 0x80);
}

size_t countOf(std::string_view text, std::string_view what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string_view::npos; at = text.find(what, at + 1))
    n += startsPath(text, at);
  return n;
}

}  // namespace

std::string wrapLines(std::string_view text, size_t width) {
  if (width == 0) return std::string(text);
  std::string out;
  out.reserve(text.size() + text.size() / 16);
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    if (line.size() <= width) {
      out += line;
    } else {
      wrapOne(line, width, out);
    }
    if (nl == std::string_view::npos) break;
    out += '\n';
    text.remove_prefix(nl + 1);
  }
  return out;
}

std::string commonPathPrefix(std::string_view text, const std::vector<std::string>& paths) {
  // Candidate directories: every ancestor of every absolute path, with how many paths lie below.
  // A hostile file's 40 KB path of 20,000 directories would make this quadratic: only the first
  // kCommonPrefixMaxDepth directories of paths up to kCommonPrefixMaxPath bytes count.
  std::map<std::string, size_t> below;
  for (const std::string& p : paths) {
    if (p.empty() || p.front() != '/' || p.size() > kCommonPrefixMaxPath) continue;
    size_t depth = 0;
    for (size_t slash = p.find('/', 1);
         slash != std::string::npos && ++depth <= kCommonPrefixMaxDepth;
         slash = p.find('/', slash + 1))
      ++below[p.substr(0, slash + 1)];
  }
  // Each candidate is counted in the whole text: only the kCommonPrefixCandidates that would
  // save the most by the paths alone are (a hostile file's thousands of directories would make
  // this quadratic).
  std::vector<std::pair<size_t, std::string>> cands;
  for (const auto& [dir, n] : below) {
    if (dir.size() >= kCommonPrefixMinLength) cands.emplace_back(n * dir.size(), dir);
  }
  const size_t keep = std::min(cands.size(), kCommonPrefixCandidates);
  std::partial_sort(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(keep), cands.end(),
                    [](const auto& a, const auto& b) {
                      return a.first != b.first ? a.first > b.first : a.second < b.second;
                    });
  cands.resize(keep);
  std::string best;
  size_t best_saved = 0;
  for (const auto& [score, dir] : cands) {
    const size_t n = countOf(text, dir);
    if (n < kCommonPrefixMinUses) continue;
    const size_t saved = n * dir.size();
    if (saved > best_saved) best_saved = saved, best = dir;
  }
  return best;
}

std::string stripPrefix(std::string_view text, std::string_view prefix) {
  if (prefix.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t from = 0;
  for (size_t at = text.find(prefix); at != std::string_view::npos;
       at = text.find(prefix, at + 1)) {
    if (at < from || !startsPath(text, at)) continue;
    out.append(text.substr(from, at - from));
    from = at + prefix.size();
  }
  out.append(text.substr(from));
  return out;
}

}  // namespace memforensics::report
