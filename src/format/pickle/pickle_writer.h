// pickle_writer.h: emits plain-data pickles (protocol 2-4 opcodes only, no code objects).
//
// Used to turn the JSON form of a snapshot into the pickle the reader understands, by tests to
// build hostile and edge-case inputs, and later by `convert` to write snapshots PyTorch's tools can
// open.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace memforensics::format {

class PickleWriter {
 public:
  // Receives the output in pieces, in order. An error stops all further output (see status()).
  using ChunkSink = std::function<Status(std::span<const uint8_t>)>;

  // Buffer mode: everything stays in memory until finish().
  explicit PickleWriter(int protocol = 4);
  // Streaming mode: whenever the buffer holds flush_bytes or more it goes to `sink` and is reused,
  // so a snapshot of any size is written with a bounded buffer. End with finishStream().
  PickleWriter(int protocol, ChunkSink sink, size_t flush_bytes = size_t{1} << 20);
  // Containers: begin*() pushes an empty container and a MARK; end*() emits APPENDS/SETITEMS.
  // With memoize, the container is stored in the memo (at index memoCount() before the call)
  // between the two, where Python puts it, so that it can be referenced again with get().
  void beginList(bool memoize = false);
  void endList();
  void beginDict(bool memoize = false);
  void endDict();
  void tuple2();  // wraps the two values written last into a TUPLE2
  // Inside a list: APPENDS for the items so far and a new MARK. Python batches every 1000 items;
  // memory_viz's reader spreads an APPENDS batch into a JavaScript call, so huge batches break it.
  void listBatch();
  // SHORT_BINUNICODE / BINUNICODE / BINUNICODE8. Python decodes these as strict UTF-8 and fails
  // the whole load on one bad byte, so text that is not well-formed UTF-8 (RFC 3629: overlong
  // forms, UTF-16 surrogates, code points above U+10FFFF and stray bytes are not) is written with
  // each maximal ill-formed part replaced by U+FFFD, as Python's "replace" error handler does.
  // Valid text is written byte for byte.
  void str(std::string_view s);
  void integer(int64_t v);
  void uinteger(uint64_t v);
  void floating(double v);
  void boolean(bool b);
  void none();
  void memoize();                 // MEMOIZE (protocol 4) or BINPUT/LONG_BINPUT of the next index
  void get(uint32_t memo_index);  // BINGET / LONG_BINGET
  void raw(std::initializer_list<uint8_t> bytes);  // for tests: arbitrary opcodes
  std::vector<uint8_t> finish();                   // buffer mode: STOP and the bytes
  Status finishStream();  // streaming mode: STOP, the last piece, and the first sink error
  const Status& status() const { return status_; }  // streaming mode: the first sink error, if any
  uint32_t memoCount() const { return memo_count_; }

 private:
  // Called after every opcode; one compare in buffer mode, where flush_at_ is SIZE_MAX.
  void maybeFlush() {
    if (out_.size() >= flush_at_) flush();
  }
  void flush();

  std::vector<uint8_t> out_;
  int protocol_;
  uint32_t memo_count_ = 0;
  ChunkSink sink_;
  size_t flush_at_ = SIZE_MAX;
  Status status_;
};

}  // namespace memforensics::format
