// pickle_reader.h: a data-only reader for PyTorch memory snapshot pickles.
//
// It implements exactly the pickle subset that snapshot writers emit (protocols 2-5: containers,
// strings, ints, floats, bools, None, tuples, memo), and refuses every opcode that could import a
// module or call anything (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX,
// PERSID, BINPERSID, EXT1/2/4) with an error naming the opcode and its byte offset. Nothing in an
// input can make this reader execute code: there is no import, no call, no attribute access.
//
// The reader does not build a generic object tree. It reduces the shapes a snapshot is made of as
// soon as they are filled: a {filename, line, name} dict becomes an interned frame, a list of frames
// becomes an interned stack, and a dict with an `action` key becomes a compact trace event. The memo
// keeps references to those reduced nodes, so the sharing Python's pickler put into the file (the
// same frames list referenced by thousands of events) is kept, and memory stays a fraction of the
// file size.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "common/status.h"
#include "format/snapshot.h"

namespace memforensics::format {

// Called now and then with the number of input bytes consumed so far; lets the caller draw a
// progress bar and release pages of a mapped file that were already read.
using ProgressFn = std::function<void(uint64_t consumed, uint64_t total)>;

struct PickleReadOptions {
  ProgressFn progress;              // optional
  uint64_t progress_interval = 8u << 20;
  uint32_t max_memo_gap = 1u << 16; // BINPUT may not leave a larger hole in the memo
};

// Reads a snapshot pickle from `data`. Trailing bytes after STOP are ignored (memory_viz HTML pads
// with zeros). Errors carry the byte offset of the offending opcode.
Expected<Snapshot> readSnapshotPickle(std::span<const uint8_t> data,
                                      const PickleReadOptions& options = {});

// Name of a pickle opcode byte for messages ("LONG_BINGET"), or "unknown".
const char* pickleOpcodeName(uint8_t op);

}  // namespace memforensics::format
