// frame_class.cc: see frame_class.h for the rule.
#include "analysis/frames/frame_class.h"

#include <algorithm>
#include <array>

namespace memforensics::analysis {

namespace {

bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool startsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}
bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}
// Either path separator: "torch/optim/" also matches "torch\optim\".
bool containsPath(std::string_view s, std::string_view unix_part) {
  if (contains(s, unix_part)) return true;
  std::array<char, 64> buf{};
  if (unix_part.size() > buf.size()) return false;
  for (size_t i = 0; i < unix_part.size(); ++i) buf[i] = unix_part[i] == '/' ? '\\' : unix_part[i];
  return contains(s, std::string_view(buf.data(), unix_part.size()));
}

// Format doc 2.6: frames memory_viz hides (unwinder, interpreter glue, dispatcher boilerplate).
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
// Thread start-up and libc: the outermost frames of every thread's stack.
constexpr std::array<std::string_view, 10> kSystemNames = {"start_thread",
                                                           "clone",
                                                           "clone3",
                                                           "__clone",
                                                           "__clone3",
                                                           "execute_native_thread_routine",
                                                           "__libc_start_call_main",
                                                           "__libc_start_main_impl",
                                                           "_start",
                                                           "__libc_start_main"};
constexpr std::array<std::string_view, 7> kSystemFiles = {
    "pthread_create.c",       "/nptl/",       "clone.S",   "clone3.S",
    "libc_start_call_main.h", "libc-start.c", "crtstuff.c"};
// The allocator, tensor factories and the dispatcher: between the operator that allocated and
// the allocator, they say nothing about who allocated (prefixes of the qualified name).
constexpr std::array<std::string_view, 14> kPlumbingPrefixes = {"c10::",
                                                                "at::detail::",
                                                                "at::_ops::",
                                                                "at::(anonymous namespace)::",
                                                                "at::TensorIteratorBase::",
                                                                "torch::autograd::VariableType::",
                                                                "at::empty",
                                                                "at::_empty",
                                                                "at::meta::",
                                                                "at::native::empty",
                                                                "at::native::_empty",
                                                                "at::native::new_empty",
                                                                "std::",
                                                                "pthread_"};
constexpr std::array<std::string_view, 8> kAutogradNames = {
    "autograd::Engine",  "autograd::generated", "autograd::Node::",        "AccumulateGrad",
    "evaluate_function", "PythonEngine",        "autograd::CopyBackwards", "autograd::CopySlices"};

// Helpers that allocate an operator's output for it (structured kernels' set_output_*, the
// resize helpers): the operator is the frame that called them (parts of the qualified name).
constexpr std::array<std::string_view, 3> kOutputHelpers = {"::set_output", "at::native::resize_",
                                                            "at::native::_resize_output"};

// CPython's own C functions (the C API and the interpreter: Py_RunMain, _PyObject_MakeTpCall,
// PyVectorcall_Call, ...), its thread start-up (thread_run, t_bootstrap, pythread_wrapper) and
// call glue, and pybind11's: they run the Python code, they are not an operator.
// torch's Python binding glue (__torch_function__ dispatch, argument parsing, the NotImplemented
// wrapper) runs the binding, it is not the operator (THPVariable_mm is, and stays CppOp).
constexpr std::array<std::string_view, 6> kInterpreterPrefixes = {
    "Py",
    "_Py",
    "pybind11::",
    "torch::handle_torch_function",
    "torch::PythonArgParser",
    "torch::autograd::TypeError_to_NotImplemented_"};
// C functions of CPython's interpreter and start-up, of the C runtime and of the frame-evaluation
// hook torch.compile installs, named with any compiler clone suffix removed. Prefixes are the
// families whose names say what they are (pymain_main, pyrun_file, method_vectorcall_O,
// slot_tp_call, __Pyx_PyObject_Call, __libc_init_first, dynamo__custom_eval_frame: also lambdas
// inside them); the generic-sounding ones match whole (run_mod, binary_op1, main), so that a
// program's own run_model or binary_op_kernel stays an operator.
constexpr std::array<std::string_view, 11> kInterpreterFamilies = {
    "pymain_",  "pyrun_",   "cfunction_", "method_vectorcall", "slot_tp_", "slot_nb_",
    "slot_sq_", "slot_mp_", "__Pyx_",     "__libc_",           "dynamo__"};
constexpr std::array<std::string_view, 16> kInterpreterNames = {"vectorcall_maybe",
                                                                "thread_run",
                                                                "t_bootstrap",
                                                                "pythread_wrapper",
                                                                "run_mod",
                                                                "run_eval_code_obj",
                                                                "binary_op",
                                                                "binary_op1",
                                                                "ternary_op",
                                                                "vectorcall_method",
                                                                "vectorcall_unbound",
                                                                "object_vacall",
                                                                "dynamo_eval_custom_code",
                                                                "dynamo_eval_frame_default",
                                                                "dynamo_call_callback",
                                                                "main"};

// A C function's name without the suffix a compiler gives its clones ("method_vectorcall.llvm.
// 1295...", "foo.constprop.0", "foo.isra.0", "foo.part.0", "foo.cold"): the name before the first
// '.' when everything before it is an identifier.
std::string_view withoutCloneSuffix(std::string_view name) {
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0) return name;
  for (size_t i = 0; i < dot; ++i) {
    const char c = name[i];
    const bool ident =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ident) return name;
  }
  return name.substr(0, dot);
}

// A C source or header of CPython itself: its Objects/, Python/, Modules/, Include/ or Parser/
// folder in a path that names Python ("/usr/local/src/conda/python-3.12.3/Objects/call.c",
// ".../python-split_.../work/build-static/Python/bytecodes.c"): the interpreter, never an
// operator. An extension's own "my_ext/Modules/attn.c" is not.
bool isCPythonSource(std::string_view file) {
  if (!endsWith(file, ".c") && !endsWith(file, ".h")) return false;
  bool names_python = false;
  for (size_t i = 0; i + 6 <= file.size() && !names_python; ++i) {
    static constexpr std::string_view kPython = "python";
    size_t k = 0;
    while (k < kPython.size() && (file[i + k] | 0x20) == kPython[k]) ++k;
    names_python = k == kPython.size();
  }
  if (!names_python) return false;
  for (std::string_view dir : {"/Objects/", "/Python/", "/Modules/", "/Include/", "/Parser/"}) {
    if (containsPath(file, dir)) return true;
  }
  return false;
}

bool isPlumbingCpp(std::string_view name) {
  const std::string_view q = qualifiedFunctionName(name);
  for (std::string_view p : kInterpreterPrefixes) {
    if (startsWith(q, p)) return true;
  }
  // The interpreter's C functions: a family by the name's first component (lambdas inside them:
  // "dynamo__custom_eval_frame::{lambda()#1}::operator()() const"), the others by the whole name.
  {
    const std::string_view first = withoutCloneSuffix(q.substr(0, q.find("::")));
    for (std::string_view p : kInterpreterFamilies) {
      if (startsWith(first, p)) return true;
    }
    const std::string_view whole = withoutCloneSuffix(q);
    for (std::string_view n : kInterpreterNames) {
      if (whole == n) return true;
    }
  }
  for (std::string_view p : kPlumbingPrefixes) {
    if (startsWith(q, p)) return true;
  }
  for (std::string_view p : kOutputHelpers) {
    if (contains(q, p)) return true;
  }
  return contains(q, "wrapper_");
}

// A standard-library file of Python itself (not a package installed into it).
bool isPythonRuntime(std::string_view file) {
  if (startsWith(file, "<frozen")) return true;
  const bool in_lib = contains(file, "/lib/python3") || containsPath(file, "/Lib/");
  return in_lib && !contains(file, "site-packages") && !contains(file, "dist-packages");
}

bool isTorchFile(std::string_view file) {
  return containsPath(file, "/torch/") || startsWith(file, "torch/") ||
         startsWith(file, "torch\\") || containsPath(file, "/site-packages/torch");
}

bool isOtherPackage(std::string_view file) {
  return contains(file, "site-packages") || contains(file, "dist-packages");
}

// DataParallel's replicate / broadcast of the module (StackFacts::replicate).
bool isReplicateFrame(std::string_view file, std::string_view name) {
  if (isPythonFile(file)) {
    if (!isTorchFile(file)) return false;
    if (containsPath(file, "nn/parallel/comm.py"))
      return name == "broadcast" || name == "broadcast_coalesced";
    if (containsPath(file, "nn/parallel/replicate.py")) return true;
    if (containsPath(file, "nn/parallel/data_parallel.py")) return name == "replicate";
    return false;
  }
  return startsWith(qualifiedFunctionName(name), "torch::cuda::broadcast");
}

}  // namespace

std::string_view frameKindName(FrameKind k) {
  switch (k) {
    case FrameKind::User:
      return "user";
    case FrameKind::Framework:
      return "framework";
    case FrameKind::Autograd:
      return "autograd";
    case FrameKind::Optimizer:
      return "optimizer";
    case FrameKind::Plumbing:
      return "plumbing";
    case FrameKind::CppOp:
      return "cpp_op";
  }
  return "cpp_op";
}

bool isPythonFile(std::string_view filename) {
  return endsWith(filename, ".py");
}

std::string_view qualifiedFunctionName(std::string_view name) {
  constexpr std::string_view kAnon = "(anonymous namespace)";
  // The argument list: the first '(' outside template brackets that is not "(anonymous
  // namespace)" and not the "()" of "operator()".
  int depth = 0;
  size_t args = name.size();
  size_t last_space = std::string_view::npos;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c == '<') {
      if (!endsWith(name.substr(0, i), "operator")) ++depth;
    } else if (c == '>') {
      if (depth > 0) --depth;
    } else if (c == '(' && depth == 0) {
      if (name.substr(i, kAnon.size()) == kAnon) {
        i += kAnon.size() - 1;
        continue;
      }
      if (endsWith(name.substr(0, i), "operator") && name.substr(i, 2) == "()") {
        ++i;
        continue;
      }
      args = i;
      break;
    } else if (c == ' ' && depth == 0) {
      last_space = i;
    }
  }
  std::string_view head = name.substr(0, args);
  // The return type, when there is one, ends at the last space outside template brackets (an
  // "(anonymous namespace)" space is skipped above).
  if (last_space != std::string_view::npos && last_space < args) head = head.substr(last_space + 1);
  return head;
}

FrameKind classifyFrame(std::string_view file, std::string_view name) {
  if (isPythonFile(file) || startsWith(file, "<frozen")) {
    if (isPythonRuntime(file)) return FrameKind::Plumbing;
    if (isTorchFile(file)) {
      if (containsPath(file, "torch/optim/")) return FrameKind::Optimizer;
      if (containsPath(file, "torch/autograd/") ||
          (endsWith(file, "_tensor.py") && name == "backward"))
        return FrameKind::Autograd;
      if (containsPath(file, "nn/modules/module.py") &&
          (name == "_call_impl" || name == "_wrapped_call_impl"))
        return FrameKind::Plumbing;
      return FrameKind::Framework;
    }
    if (isOtherPackage(file)) return FrameKind::Framework;
    return FrameKind::User;
  }
  if (name.empty() || name == "??") return FrameKind::Plumbing;  // unsymbolized: says nothing
  for (auto n : kNoiseNames) {
    if (contains(name, n)) return FrameKind::Plumbing;
  }
  for (auto n : kNoiseFiles) {
    if (contains(file, n)) return FrameKind::Plumbing;
  }
  for (auto n : kSystemNames) {
    if (name == n) return FrameKind::Plumbing;
  }
  for (auto n : kSystemFiles) {
    if (contains(file, n)) return FrameKind::Plumbing;
  }
  if (isCPythonSource(file)) return FrameKind::Plumbing;
  if (isPlumbingCpp(name)) return FrameKind::Plumbing;
  for (auto n : kAutogradNames) {
    if (contains(name, n)) return FrameKind::Autograd;
  }
  return FrameKind::CppOp;
}

FrameKind classifyFrame(const format::Snapshot& s, const format::Frame& f) {
  return classifyFrame(s.strings.get(f.filename), s.strings.get(f.name));
}

FrameFacts frameFacts(std::string_view file, std::string_view name) {
  FrameFacts f;
  f.kind = classifyFrame(file, name);
  f.python = isPythonFile(file);
  f.module_init = (containsPath(file, "nn/modules/module.py") &&
                   (name == "_apply" || name == "to" || name == "cuda" || name == "convert")) ||
                  (name == "__init__" && f.kind != FrameKind::Optimizer);
  f.replicate = isReplicateFrame(file, name);
  f.forward = name == "forward" || name == "_call_impl" || name == "_wrapped_call_impl" ||
              containsPath(file, "nn/functional.py");
  return f;
}

namespace {

// Frame `i` (innermost first) of a stack into its facts.
void addFrame(StackFacts& out, const FrameFacts& f, size_t i) {
  const FrameKind k = f.kind;
  out.python = out.python || f.python;
  if (k == FrameKind::Optimizer) out.optimizer = true;
  if (k == FrameKind::Autograd) out.backward = true;
  if (k == FrameKind::User && out.innermost_user < 0) out.innermost_user = static_cast<int32_t>(i);
  if (!f.python && (k == FrameKind::CppOp || k == FrameKind::Autograd) && out.op < 0)
    out.op = static_cast<int32_t>(i);
  if (f.module_init) out.module_init = true;
  if (f.replicate) out.replicate = true;
  if (f.forward) out.forward = true;
}

}  // namespace

StackFacts stackFacts(const format::Snapshot& s, format::StackId id) {
  StackFacts out;
  if (id == format::kNoStack || id == format::kEmptyStack) return out;
  auto frames = s.stacks.stack(id);
  for (size_t i = 0; i < frames.size(); ++i) {
    const format::Frame& fr = s.stacks.frame(frames[i]);
    addFrame(out, frameFacts(s.strings.get(fr.filename), s.strings.get(fr.name)), i);
  }
  return out;
}

const FrameFacts& StackFactsCache::frame(format::FrameId id) {
  if (frozen_ != nullptr && id < frozen_->frames.size()) return frozen_->frames[id];
  if (id >= frames_.size()) {
    const size_t n = std::max<size_t>(size_t{id} + 1, s_.stacks.frameCount());
    frames_.resize(n);
    frame_known_.resize(n, 0);
  }
  if (!frame_known_[id]) {
    const format::Frame& fr = s_.stacks.frame(id);
    frames_[id] = frameFacts(s_.strings.get(fr.filename), s_.strings.get(fr.name));
    frame_known_[id] = 1;
  }
  return frames_[id];
}

const StackFacts& StackFactsCache::of(format::StackId id) {
  if (frozen_ != nullptr && id < frozen_->stacks.size()) return frozen_->stacks[id];
  if (id >= facts_.size()) {
    const size_t n = std::max<size_t>(size_t{id} + 1, s_.stacks.stackCount());
    facts_.resize(n);
    known_.resize(n, 0);
  }
  if (!known_[id]) {
    StackFacts out;
    if (id != format::kNoStack && id != format::kEmptyStack) {
      auto frames = s_.stacks.stack(id);
      for (size_t i = 0; i < frames.size(); ++i) addFrame(out, frame(frames[i]), i);
    }
    facts_[id] = out;
    known_[id] = 1;
  }
  return facts_[id];
}

FrozenStackFacts freezeStackFacts(const format::Snapshot& s) {
  StackFactsCache c(s);
  const size_t frames = s.stacks.frameCount();
  const size_t stacks = s.stacks.stackCount();
  for (size_t i = 0; i < frames; ++i) (void)c.frame(static_cast<format::FrameId>(i));
  for (size_t i = 0; i < stacks; ++i) (void)c.of(static_cast<format::StackId>(i));
  FrozenStackFacts out;
  out.frames = std::move(c.frames_);
  out.stacks = std::move(c.facts_);
  out.frames.resize(frames);
  out.stacks.resize(stacks);
  return out;
}

}  // namespace memforensics::analysis
