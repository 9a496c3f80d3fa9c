// pickle_writer.h: emits plain-data pickles (protocol 2-4 opcodes only, no code objects).
//
// Used to turn the JSON form of a snapshot into the pickle the reader understands, by tests to build
// hostile and edge-case inputs, and later by `convert` to write snapshots PyTorch's tools can open.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace memforensics::format {

class PickleWriter {
 public:
  explicit PickleWriter(int protocol = 4);
  // Containers: begin*() pushes an empty container and a MARK; end*() emits APPENDS/SETITEMS.
  void beginList();
  void endList();
  void beginDict();
  void endDict();
  void tuple2();  // wraps the two values written last into a TUPLE2
  void str(std::string_view s);
  void integer(int64_t v);
  void uinteger(uint64_t v);
  void floating(double v);
  void boolean(bool b);
  void none();
  void memoize();                 // MEMOIZE (protocol 4) or BINPUT/LONG_BINPUT of the next index
  void get(uint32_t memo_index);  // BINGET / LONG_BINGET
  void raw(std::initializer_list<uint8_t> bytes);  // for tests: arbitrary opcodes
  std::vector<uint8_t> finish();  // STOP and the bytes
  uint32_t memoCount() const { return memo_count_; }

 private:
  std::vector<uint8_t> out_;
  int protocol_;
  uint32_t memo_count_ = 0;
};

}  // namespace memforensics::format
