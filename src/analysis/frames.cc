// frames.cc: frame filtering for display.
#include "analysis/frames.h"

#include <array>
#include <string_view>

namespace memforensics::analysis {

namespace {
bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// From the format doc 2.6: frames memory_viz hides.
constexpr std::array<std::string_view, 8> kNoiseNames = {
    "unwind::unwind",    "CapturedTraceback::gather",
    "gather_with_cpp",   "_start",
    "__libc_start_main", "PyEval_",
    "PyObject_",         "PyFunction_"};
constexpr std::array<std::string_view, 10> kNoiseFiles = {"core/boxing",
                                                          "/Register",
                                                          "/Redispatch",
                                                          "pythonrun.c",
                                                          "Modules/main.c",
                                                          "Objects/call.c",
                                                          "Objects/methodobject.c",
                                                          "pycore_ceval.h",
                                                          "ceval.c",
                                                          "cpython/abstract.h"};
}  // namespace

std::string FrameText::display() const {
  std::string out = filename;
  if (line != format::kUnknownLine) out += ":" + std::to_string(line);
  if (!name.empty()) out += " " + name;
  return out;
}

bool isNoiseFrame(const format::Snapshot& s, const format::Frame& f) {
  std::string_view name = s.strings.get(f.name);
  std::string_view file = s.strings.get(f.filename);
  for (auto n : kNoiseNames) {
    if (contains(name, n)) return true;
  }
  for (auto n : kNoiseFiles) {
    if (contains(file, n)) return true;
  }
  return false;
}

bool isLibraryFrame(const format::Snapshot& s, const format::Frame& f) {
  std::string_view file = s.strings.get(f.filename);
  if (!endsWith(file, ".py")) return true;
  // PyTorch itself (site-packages/torch/..., or a source checkout's torch/) and Python's runtime.
  for (std::string_view marker : {"/torch/", "\\torch\\", "<frozen", "/lib/python3", "\\Lib\\",
                                  "/site-packages/torch", "\\site-packages\\torch"}) {
    if (contains(file, marker)) return true;
  }
  return file.rfind("torch/", 0) == 0;
}

bool isPlumbingFrame(const format::Snapshot& s, const format::Frame& f) {
  std::string_view name = s.strings.get(f.name);
  for (std::string_view p : {"c10::", "at::detail::", "at::_ops::", "c10::impl::", "wrapper_",
                             "at::(anonymous namespace)::", "at::TensorIteratorBase::",
                             "torch::autograd::VariableType::", "at::empty", "at::meta::"}) {
    if (name.rfind(p, 0) == 0 || (p == "wrapper_" && contains(name, p))) return true;
  }
  return false;
}

FrameText frameText(const format::Snapshot& s, format::FrameId id) {
  const format::Frame& f = s.stacks.frame(id);
  return FrameText{std::string(s.strings.get(f.filename)), std::string(s.strings.get(f.name)),
                   f.line};
}

std::vector<format::FrameId> userFrameIds(const format::Snapshot& s, format::StackId stack,
                                          size_t max) {
  std::vector<format::FrameId> out;
  if (stack == format::kNoStack) return out;
  auto frames = s.stacks.stack(stack);
  auto take = [&](auto pred) {
    for (format::FrameId id : frames) {
      if (out.size() >= max) return;
      const format::Frame& f = s.stacks.frame(id);
      if (pred(f)) out.push_back(id);
    }
  };
  take([&](const format::Frame& f) { return !isLibraryFrame(s, f); });
  if (out.empty()) {
    take([&](const format::Frame& f) { return endsWith(s.strings.get(f.filename), ".py"); });
  }
  if (out.empty()) {
    // C++-only stacks (e.g. allocations made by the autograd engine's thread): skip the
    // allocator, tensor factory and dispatcher frames so the first frame shown is the operator.
    take([&](const format::Frame& f) { return !isNoiseFrame(s, f) && !isPlumbingFrame(s, f); });
  }
  if (out.empty()) take([&](const format::Frame& f) { return !isNoiseFrame(s, f); });
  return out;
}

std::vector<FrameText> userFrames(const format::Snapshot& s, format::StackId stack, size_t max) {
  std::vector<FrameText> out;
  for (format::FrameId id : userFrameIds(s, stack, max)) out.push_back(frameText(s, id));
  return out;
}

}  // namespace memforensics::analysis
