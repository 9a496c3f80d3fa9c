// pickle_writer.cc: the opcode emitter.
#include "format/pickle/pickle_writer.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace memforensics::format {

namespace {
template <typename T>
void putLE(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}
}  // namespace

PickleWriter::PickleWriter(int protocol) : protocol_(protocol) {
  out_.push_back(0x80);
  out_.push_back(static_cast<uint8_t>(protocol));
}

PickleWriter::PickleWriter(int protocol, ChunkSink sink, size_t flush_bytes)
    : PickleWriter(protocol) {
  sink_ = std::move(sink);
  flush_at_ = flush_bytes == 0 ? 1 : flush_bytes;
  // One opcode past the threshold at most, except long strings: the buffer is allocated once.
  out_.reserve(flush_at_ + 64);
}

void PickleWriter::flush() {
  if (status_.ok() && !out_.empty() && sink_) status_ = sink_(std::span<const uint8_t>(out_));
  out_.clear();  // after an error the rest is dropped: the caller sees status() and stops
}

void PickleWriter::beginList(bool memo) {
  out_.push_back(']');
  if (memo) memoize();
  out_.push_back('(');
  maybeFlush();
}
void PickleWriter::endList() {
  out_.push_back('e');
  maybeFlush();
}
void PickleWriter::listBatch() {
  out_.push_back('e');
  out_.push_back('(');
  maybeFlush();
}
void PickleWriter::beginDict(bool memo) {
  out_.push_back('}');
  if (memo) memoize();
  out_.push_back('(');
  maybeFlush();
}
void PickleWriter::endDict() {
  out_.push_back('u');
  maybeFlush();
}
void PickleWriter::tuple2() {
  out_.push_back(0x86);
  maybeFlush();
}

namespace {

// The allowed range of the second byte after lead byte c (RFC 3629: no overlong forms, no UTF-16
// surrogates, nothing above U+10FFFF), and the sequence length; 0 for a byte that cannot lead.
size_t utf8Lead(uint8_t c, uint8_t& lo, uint8_t& hi) {
  lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) {
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    return 4;
  }
  return 0;
}

// The number of bytes of s[i...] that belong to the sequence started at i: all of it when it is
// well formed (valid = true), else its maximal ill-formed subpart (at least 1 byte).
size_t utf8Sequence(std::string_view s, size_t i, bool& valid) {
  const uint8_t c = static_cast<uint8_t>(s[i]);
  valid = c < 0x80;
  if (valid) return 1;
  uint8_t lo, hi;
  const size_t need = utf8Lead(c, lo, hi);
  size_t j = i + 1;
  while (need > 0 && j < s.size() && j - i < need) {
    const uint8_t b = static_cast<uint8_t>(s[j]);
    if (j == i + 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
    ++j;
  }
  valid = need > 0 && j - i == need;
  return j - i;
}

bool isValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    bool valid;
    i += utf8Sequence(s, i, valid);
    if (!valid) return false;
  }
  return true;
}

// One U+FFFD per maximal ill-formed subpart, the Unicode standard's recommended practice (and
// what Python's bytes.decode("utf-8", "replace") gives).
std::string replaceInvalidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    bool valid;
    size_t n = utf8Sequence(s, i, valid);
    if (valid)
      out.append(s.substr(i, n));
    else
      out.append("\xEF\xBF\xBD");
    i += n;
  }
  return out;
}

}  // namespace

void PickleWriter::str(std::string_view text) {
  // BINUNICODE holds UTF-8 that Python decodes strictly (a bad byte fails the whole load): text
  // that is not well-formed UTF-8 (a binary frame name, a cut multi-byte character) is written
  // with each ill-formed part replaced by U+FFFD. See pickle_writer.h.
  std::string replaced;
  std::string_view s = text;
  if (!isValidUtf8(text)) {
    replaced = replaceInvalidUtf8(text);
    s = replaced;
  }
  if (s.size() < 256 && protocol_ >= 4) {
    out_.push_back(0x8c);
    out_.push_back(static_cast<uint8_t>(s.size()));
  } else if (s.size() <= UINT32_MAX || protocol_ < 4) {
    out_.push_back('X');
    putLE<uint32_t>(out_, static_cast<uint32_t>(std::min<size_t>(s.size(), UINT32_MAX)));
    if (s.size() > UINT32_MAX) s = s.substr(0, UINT32_MAX);  // protocol < 4 has no longer string
  } else {
    out_.push_back(0x8d);  // BINUNICODE8
    putLE<uint64_t>(out_, s.size());
  }
  out_.insert(out_.end(), s.begin(), s.end());
  maybeFlush();
}

void PickleWriter::integer(int64_t v) {
  if (v >= 0 && v < 256) {
    out_.push_back('K');
    out_.push_back(static_cast<uint8_t>(v));
  } else if (v >= 0 && v < 65536) {
    out_.push_back('M');
    putLE<uint16_t>(out_, static_cast<uint16_t>(v));
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_.push_back('J');
    putLE<int32_t>(out_, static_cast<int32_t>(v));
  } else {
    // LONG1 with the minimal two's complement length, as Python writes it.
    uint8_t bytes[8];
    std::memcpy(bytes, &v, 8);
    int n = 8;
    while (n > 1 && ((bytes[n - 1] == 0 && !(bytes[n - 2] & 0x80)) ||
                     (bytes[n - 1] == 0xFF && (bytes[n - 2] & 0x80)))) {
      --n;
    }
    out_.push_back(0x8a);
    out_.push_back(static_cast<uint8_t>(n));
    out_.insert(out_.end(), bytes, bytes + n);
  }
  maybeFlush();
}

void PickleWriter::uinteger(uint64_t v) {
  if (v <= static_cast<uint64_t>(INT64_MAX)) {
    integer(static_cast<int64_t>(v));
    return;
  }
  out_.push_back(0x8a);
  out_.push_back(9);  // needs a ninth byte so the value stays positive
  putLE<uint64_t>(out_, v);
  out_.push_back(0);
  maybeFlush();
}

void PickleWriter::floating(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  out_.push_back('G');
  putLE<uint64_t>(out_, __builtin_bswap64(bits));
  maybeFlush();
}

void PickleWriter::boolean(bool b) {
  out_.push_back(b ? 0x88 : 0x89);
  maybeFlush();
}
void PickleWriter::none() {
  out_.push_back('N');
  maybeFlush();
}

void PickleWriter::memoize() {
  if (protocol_ >= 4) {
    out_.push_back(0x94);
  } else if (memo_count_ < 256) {
    out_.push_back('q');
    out_.push_back(static_cast<uint8_t>(memo_count_));
  } else {
    out_.push_back('r');
    putLE<uint32_t>(out_, memo_count_);
  }
  ++memo_count_;
  maybeFlush();
}

void PickleWriter::get(uint32_t i) {
  if (i < 256) {
    out_.push_back('h');
    out_.push_back(static_cast<uint8_t>(i));
  } else {
    out_.push_back('j');
    putLE<uint32_t>(out_, i);
  }
  maybeFlush();
}

void PickleWriter::raw(std::initializer_list<uint8_t> bytes) {
  out_.insert(out_.end(), bytes);
  maybeFlush();
}

std::vector<uint8_t> PickleWriter::finish() {
  out_.push_back('.');
  return std::move(out_);
}

Status PickleWriter::finishStream() {
  out_.push_back('.');
  flush();
  return status_;
}

}  // namespace memforensics::format
