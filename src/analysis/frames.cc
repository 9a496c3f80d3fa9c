// frames.cc: frame filtering for display, on the one classifier (frame_class.h).
#include "analysis/frames.h"

#include "analysis/frame_class.h"

namespace memforensics::analysis {

std::string FrameText::display() const {
  std::string out = filename;
  if (line != format::kUnknownLine) out += ":" + std::to_string(line);
  if (!name.empty()) out += " " + name;
  return out;
}

FrameText frameText(const format::Snapshot& s, format::FrameId id) {
  const format::Frame& f = s.stacks.frame(id);
  return FrameText{std::string(s.strings.get(f.filename)), std::string(s.strings.get(f.name)),
                   f.line};
}

std::vector<format::FrameId> userFrameIds(const format::Snapshot& s, format::StackId stack,
                                          size_t max) {
  std::vector<format::FrameId> out;
  if (stack == format::kNoStack || max == 0) return out;
  auto frames = s.stacks.stack(stack);
  std::vector<FrameKind> kinds;
  std::vector<uint8_t> python;
  kinds.reserve(frames.size());
  python.reserve(frames.size());
  for (format::FrameId id : frames) {
    const format::Frame& f = s.stacks.frame(id);
    kinds.push_back(classifyFrame(s, f));
    python.push_back(isPythonFile(s.strings.get(f.filename)) ? 1 : 0);
  }
  auto take = [&](auto pred) {
    for (size_t i = 0; i < frames.size() && out.size() < max; ++i) {
      if (pred(kinds[i], python[i] != 0)) out.push_back(frames[i]);
    }
  };
  take([](FrameKind k, bool) { return k == FrameKind::User; });
  if (out.empty()) {
    take([](FrameKind k, bool py) {
      return py &&
             (k == FrameKind::Framework || k == FrameKind::Autograd || k == FrameKind::Optimizer);
    });
  }
  if (out.empty()) {
    take([](FrameKind k, bool py) {
      return !py && (k == FrameKind::CppOp || k == FrameKind::Autograd);
    });
  }
  return out;
}

std::vector<FrameText> userFrames(const format::Snapshot& s, format::StackId stack, size_t max) {
  std::vector<FrameText> out;
  for (format::FrameId id : userFrameIds(s, stack, max)) out.push_back(frameText(s, id));
  return out;
}

}  // namespace memforensics::analysis
