// frames.h: which frames of a stack a person wants to see.
//
// Stacks from PyTorch start inside the allocator (innermost first) and may mix C++ frames, Python
// frames and interpreter glue. For "where was this allocated" the useful frames are the innermost
// Python frames of the user's own code; see userFrames() for the exact rule (docs/findings.md).
#pragma once

#include <string>
#include <vector>

#include "format/model/snapshot.h"

namespace memforensics::analysis {

struct FrameText {
  std::string filename;
  std::string name;
  uint64_t line = 0;            // format::kUnknownLine when unknown
  std::string display() const;  // "model.py:54 forward"
};

// Frames hidden by PyTorch's viewers (unwinder, interpreter glue, dispatcher boilerplate).
bool isNoiseFrame(const format::Snapshot& s, const format::Frame& f);
// True for frames of PyTorch itself or of Python's runtime (not the user's code).
bool isLibraryFrame(const format::Snapshot& s, const format::Frame& f);
// C++ frames of the allocator, tensor factories and the dispatcher: between the operator that
// allocated and the allocator, they say nothing about who allocated.
bool isPlumbingFrame(const format::Snapshot& s, const format::Frame& f);

// Up to `max` innermost frames worth showing for `stack`:
//   1. Python frames (file ends in .py) outside torch/ and the standard library: the user's code;
//   2. if there are none, any Python frames;
//   3. if there are none, non-noise C++ frames past the allocator and dispatcher plumbing;
//   4. if there are none, any non-noise frames.
std::vector<FrameText> userFrames(const format::Snapshot& s, format::StackId stack, size_t max);
// The same frames as ids, innermost first.
std::vector<format::FrameId> userFrameIds(const format::Snapshot& s, format::StackId stack,
                                          size_t max);

// The text of one frame of the snapshot.
FrameText frameText(const format::Snapshot& s, format::FrameId id);

}  // namespace memforensics::analysis
