// pickle_reader.h: a data-only reader for PyTorch memory snapshot pickles.
//
// It implements exactly the pickle subset that snapshot writers emit (protocols 2-5: containers,
// strings, ints, floats, bools, None, tuples, memo), and refuses every opcode that could import a
// module or call anything (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX,
// PERSID, BINPERSID, EXT1/2/4) with an error naming the opcode and its byte offset. Nothing in an
// input can make this reader execute code: there is no import, no call, no attribute access.
//
// The reader does not build a generic object tree. It reduces the shapes a snapshot is made of as
// soon as they are filled: a {filename, line, name} dict becomes an interned frame, a list of
// frames becomes an interned stack, and a dict with an `action` key becomes a compact trace event.
// The memo keeps references to those reduced nodes, so the sharing Python's pickler put into the
// file (the same frames list referenced by thousands of events) is kept, and memory stays a
// fraction of the file size.
#pragma once

#include <cstdint>
#include <span>

#include "common/progress.h"
#include "common/status.h"
#include "format/model/snapshot.h"

namespace memforensics::format {

// Budgets: what one input can make the reader build, each bounded by the input's own size (checked
// before anything is allocated), so memory and time stay proportional to the file whatever it
// holds. A file pickle.dump wrote never comes near them: each unit they count costs at least one
// opcode byte of the file, unless the file references one memoized object many times (which
// PyTorch's writer never does). docs/fuzzing.md lists them.
//
// Memo entries: every memo store is an opcode of at least one byte, so a memo index is below the
// input's size; LONG_BINPUT strides cannot grow the memo past it.
inline constexpr uint64_t kMemoEntriesPerInputByte = 1;
// Frames copied into interned stacks (a frames list is interned once, when it is first referenced;
// appending to a list after that copies it again and counts again).
inline constexpr uint64_t kStackFramesPerInputByte = 1;
// Records the conversion materializes: segments, blocks, trace entries, annotations, and the dict
// entries read to build them, counted once per reference. A memoized list or dict referenced many
// times (1,000 references to one trace list) is refused with "expands to more than N records".
inline constexpr uint64_t kRecordsPerInputByte = 1;
// Added to the two per-byte budgets above so tiny hand-written inputs are never refused.
inline constexpr uint64_t kBudgetSlack = 1u << 16;

// What the reader did (tests and benchmarks; optional).
struct PickleReadStats {
  uint64_t fast_entries = 0;      // trace entries read by the trace-entry fast path
  uint64_t fast_fallbacks = 0;    // dicts that started like a trace entry, read by the generic path
  uint64_t fast_frames_runs = 0;  // frames lists the fast path found in its cache of runs
  uint64_t fast_frames_guessed = 0;  // of fast_frames_runs, those found by their first bytes
  uint64_t fast_shaped = 0;          // of fast_entries, those the shaped path read (section 2c)
  // Input bytes whose pages a thread mapped ahead of the parse (common/memory.h, InputPrefetcher;
  // 0 for small inputs or where the kernel has no MADV_POPULATE_READ).
  uint64_t input_prefetched_bytes = 0;
};

struct PickleReadOptions {
  ProgressFn progress;  // optional
  uint64_t progress_interval = 8u << 20;
  uint32_t max_memo_gap = 1u << 16;  // BINPUT may not leave a larger hole in the memo
  // The trace-entry fast path (pickle_entry.cc, section 2b): a dict whose first key is `action`
  // is read by a loop specialised for the shape PyTorch writes (scalars, memoized strings, frames
  // lists of memoized frame dicts). Anything else in it (a nested dict, a second APPENDS batch, an
  // overwritten memo slot, a value of an unexpected type, a truncated operand) undoes what the
  // attempt did and leaves the dict to the generic machine, so the Snapshot and every error are
  // the same with it on or off (tests/format/pickle_fast_path_test.cc).
  bool fast_path = true;
  // Within the fast path, the shaped path (pickle_entry.cc, section 2c): an entry with the keys
  // of the entry before it is decoded field by field. Off: every entry takes fastEntry. Same
  // Snapshot and errors either way (tests/format/pickle_fast_path_test.cc).
  bool shaped_path = true;
  // Within the fast path, frames runs found by their first 8 bytes before the cache of whole runs
  // is asked (pickle_entry.cc, FramesGuess). Same Snapshot and errors either way.
  bool frames_guess = true;
  PickleReadStats* stats = nullptr;  // filled when set
};

// Reads a snapshot pickle from `data`. Trailing bytes after STOP are ignored (memory_viz HTML pads
// with zeros). Errors carry the byte offset of the offending opcode.
Expected<Snapshot> readSnapshotPickle(std::span<const uint8_t> data,
                                      const PickleReadOptions& options = {});

// Name of a pickle opcode byte for messages ("LONG_BINGET"), or "unknown".
const char* pickleOpcodeName(uint8_t op);

}  // namespace memforensics::format
