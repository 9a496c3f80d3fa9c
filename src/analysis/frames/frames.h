// frames.h: which frames of a stack a person wants to see.
//
// Stacks from PyTorch start inside the allocator (innermost first) and may mix C++ frames, Python
// frames and interpreter glue. For "where was this allocated" the useful frames are the innermost
// Python frames of the user's own code; see userFrames() for the exact rule (docs/findings.md) and
// frame_class.h for what each frame is.
#pragma once

#include <string>
#include <vector>

#include "format/model/snapshot.h"

namespace memforensics::analysis {

class StackFactsCache;

struct FrameText {
  std::string filename;
  std::string name;
  uint64_t line = 0;            // format::kUnknownLine when unknown
  std::string display() const;  // "model.py:54 forward"
};

// Up to `max` innermost frames worth showing for `stack`, by the one classifier (frame_class.h):
//   1. User frames (the program's own Python code);
//   2. if there are none, PyTorch's (or another package's) Python frames: Framework, Autograd,
//      Optimizer;
//   3. if there are none, the C++ operator frames (CppOp, Autograd) past the allocator and the
//      dispatcher: the first one shown is the operator;
//   4. if there are none, nothing: Plumbing (interpreter glue, thread start-up, libc, call
//      wrappers, the allocator and dispatcher) is never shown as where memory was allocated.
std::vector<FrameText> userFrames(const format::Snapshot& s, format::StackId stack, size_t max);
// The same frames as ids, innermost first.
std::vector<format::FrameId> userFrameIds(const format::Snapshot& s, format::StackId stack,
                                          size_t max);
// The same, with the frames' kinds from `cache` (one per device's analysis, frame_class.h).
std::vector<format::FrameId> userFrameIds(StackFactsCache& cache, format::StackId stack,
                                          size_t max);

// The text of one frame of the snapshot.
FrameText frameText(const format::Snapshot& s, format::FrameId id);

}  // namespace memforensics::analysis
