// frames.cc: frame filtering for display, on the one classifier (frame_class.h).
#include "analysis/frames/frames.h"

#include <span>
#include <utility>

#include "analysis/frames/frame_class.h"

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

namespace {

// The rule of userFrameIds(); kindOf(i) gives frame i's kind and whether it is a Python frame,
// asked lazily: a stack of a million frames with user frames near the top costs a few
// classifications, not a million.
template <class KindOf>
std::vector<format::FrameId> userFrameIdsWith(std::span<const format::FrameId> frames, size_t max,
                                              KindOf&& kindOf) {
  std::vector<format::FrameId> out;
  auto take = [&](auto pred) {
    for (size_t i = 0; i < frames.size() && out.size() < max; ++i) {
      const auto [k, py] = kindOf(i);
      if (pred(k, py)) out.push_back(frames[i]);
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

}  // namespace

std::vector<format::FrameId> userFrameIds(const format::Snapshot& s, format::StackId stack,
                                          size_t max) {
  if (stack == format::kNoStack || max == 0) return {};
  auto frames = s.stacks.stack(stack);
  constexpr uint8_t kUnknown = 0xff;
  std::vector<uint8_t> kinds(frames.size(), kUnknown);
  std::vector<uint8_t> python(frames.size(), 0);
  return userFrameIdsWith(frames, max, [&](size_t i) {
    if (kinds[i] == kUnknown) {
      const format::Frame& f = s.stacks.frame(frames[i]);
      kinds[i] = static_cast<uint8_t>(classifyFrame(s, f));
      python[i] = isPythonFile(s.strings.get(f.filename)) ? 1 : 0;
    }
    return std::pair<FrameKind, bool>(static_cast<FrameKind>(kinds[i]), python[i] != 0);
  });
}

std::vector<format::FrameId> userFrameIds(StackFactsCache& cache, format::StackId stack,
                                          size_t max) {
  if (stack == format::kNoStack || max == 0) return {};
  auto frames = cache.snapshot().stacks.stack(stack);
  return userFrameIdsWith(frames, max, [&](size_t i) {
    const FrameFacts& f = cache.frame(frames[i]);
    return std::pair<FrameKind, bool>(f.kind, f.python);
  });
}

std::vector<FrameText> userFrames(const format::Snapshot& s, format::StackId stack, size_t max) {
  std::vector<FrameText> out;
  for (format::FrameId id : userFrameIds(s, stack, max)) out.push_back(frameText(s, id));
  return out;
}

}  // namespace memforensics::analysis
