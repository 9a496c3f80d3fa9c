// text_escape.cc: see text_escape.h.
#include "common/text_escape.h"

#include <cstdint>

namespace memforensics {

namespace {

void appendHex(std::string& out, unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  out.push_back(kHex[c >> 4]);
  out.push_back(kHex[c & 0xf]);
}

bool isContinuation(unsigned char c) {
  return (c & 0xc0) == 0x80;
}

// The length of the well-formed UTF-8 sequence starting at s[i] (a byte >= 0x80), or 0 when the
// bytes there do not form one (Unicode 15, table 3-7).
size_t sequenceLength(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;  // overlong
    if (c == 0xed) hi = 0x9f;  // surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;  // overlong
    if (c == 0xf4) hi = 0x8f;  // above U+10FFFF
  } else {
    return 0;  // a continuation byte, an overlong lead (0xc0, 0xc1) or 0xf5..0xff
  }
  if (s.size() - i < n) return 0;
  const auto second = static_cast<unsigned char>(s[i + 1]);
  if (second < lo || second > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (!isContinuation(static_cast<unsigned char>(s[i + k]))) return 0;
  }
  return n;
}

}  // namespace

void appendEscaped(std::string& out, std::string_view s, bool quote) {
  out.reserve(out.size() + s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) {
        appendHex(out, c);
      } else if (c == '\\' || (quote && c == '"')) {
        out.push_back('\\');
        out.push_back(static_cast<char>(c));
      } else {
        out.push_back(static_cast<char>(c));
      }
      ++i;
      continue;
    }
    const size_t n = sequenceLength(s, i);
    if (n == 0) {
      appendHex(out, c);  // one byte; the scan resumes at the next one
      ++i;
      continue;
    }
    if (c == 0xc2 && static_cast<unsigned char>(s[i + 1]) <= 0x9f) {  // C1 control U+0080..U+009F
      appendHex(out, c);
      appendHex(out, static_cast<unsigned char>(s[i + 1]));
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
}

std::string escapeText(std::string_view s) {
  std::string out;
  appendEscaped(out, s);
  return out;
}

std::string quoteText(std::string_view s) {
  std::string out = "\"";
  appendEscaped(out, s, true);
  out.push_back('"');
  return out;
}

size_t escapedPrefixLength(std::string_view escaped, size_t max_bytes) {
  size_t i = 0;
  while (i < escaped.size()) {
    size_t n = 1;
    const auto c = static_cast<unsigned char>(escaped[i]);
    if (c == '\\') {
      n = i + 1 < escaped.size() && escaped[i + 1] == 'x' ? 4 : 2;
    } else if (c >= 0x80) {
      n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    }
    if (n > escaped.size() - i) n = escaped.size() - i;
    if (i + n > max_bytes) break;
    i += n;
  }
  return i;
}

}  // namespace memforensics
