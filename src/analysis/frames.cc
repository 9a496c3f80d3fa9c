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
  // Kinds are found lazily: a stack of a million frames with user frames near the top costs a few
  // classifications, not a million.
  constexpr uint8_t kUnknown = 0xff;
  std::vector<uint8_t> kinds(frames.size(), kUnknown);
  std::vector<uint8_t> python(frames.size(), 0);
  auto kindOf = [&](size_t i) {
    if (kinds[i] == kUnknown) {
      const format::Frame& f = s.stacks.frame(frames[i]);
      kinds[i] = static_cast<uint8_t>(classifyFrame(s, f));
      python[i] = isPythonFile(s.strings.get(f.filename)) ? 1 : 0;
    }
    return static_cast<FrameKind>(kinds[i]);
  };
  auto take = [&](auto pred) {
    for (size_t i = 0; i < frames.size() && out.size() < max; ++i) {
      const FrameKind k = kindOf(i);
      if (pred(k, python[i] != 0)) out.push_back(frames[i]);
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
