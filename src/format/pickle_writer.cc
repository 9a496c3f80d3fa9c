// pickle_writer.cc: the opcode emitter.
#include "format/pickle_writer.h"

#include <cstring>

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

void PickleWriter::str(std::string_view s) {
  if (s.size() < 256 && protocol_ >= 4) {
    out_.push_back(0x8c);
    out_.push_back(static_cast<uint8_t>(s.size()));
  } else {
    out_.push_back('X');
    putLE<uint32_t>(out_, static_cast<uint32_t>(s.size()));
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
