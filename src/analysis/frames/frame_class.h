// frame_class.h: the one frame classifier. What kind of code a frame is, and what a whole stack
// says about the code that allocated (backward, optimizer step, parameter creation, forward), for
// every consumer: the displayed frames (frames.h userFrames), phases (phases.cc), categories and
// findings (findings.cc), the frame tree (frame_tree.h) and the call graph.
//
// The rule per frame, first match wins (docs/findings.md, "Frames"):
//   Python frames (file ends in .py):
//     * Python's own runtime (a standard-library file: /lib/python3.X/, \Lib\, <frozen ...>, e.g.
//       threading.py _bootstrap, runpy.py)                                   -> Plumbing
//     * PyTorch (a file under torch/ or site-packages/torch):
//         torch/optim/                                                       -> Optimizer
//         torch/autograd/, torch/_tensor.py backward                         -> Autograd
//         nn/modules/module.py _call_impl / _wrapped_call_impl (the call wrappers)
//                                                                            -> Plumbing
//         anything else                                                      -> Framework
//     * every other .py file                                                 -> User
//   other frames (C++, or files that are not .py):
//     * interpreter glue, unwinder and dispatcher boilerplate that PyTorch's viewers hide
//       (format doc 2.6: PyEval_*, ceval.c, core/boxing, ...)                -> Plumbing
//     * CPython's C API, interpreter and start-up (Py*, _Py*, pymain_*, method_vectorcall*, a
//       function in CPython's own Objects/ Python/ Modules/ sources, compiler clone suffixes
//       such as ".llvm.123" ignored), thread start-up (thread_run, t_bootstrap), pybind11::,
//       Cython's __Pyx_*, torch.compile's dynamo_* frame hook, torch's Python binding glue
//       (handle_torch_function, PythonArgParser), the C runtime (__libc_*, main) -> Plumbing
//     * libc / pthread / thread start-up (start_thread, clone, pthread_create.c,
//       execute_native_thread_routine, __libc_start_main, _start)           -> Plumbing
//     * the allocator, tensor factories and the dispatcher (c10::, at::detail::, at::_ops::,
//       wrapper_*, at::empty*, at::native::empty*, at::meta::, VariableType, the output resize
//       helpers at::native::resize_* and *::set_output*, ...) and the C and C++
//       runtimes' own functions (std::, pthread_*), matched on the
//       function's qualified name with any return type stripped ("at::TensorBase
//       at::detail::_empty_generic<long>(...)" is at::detail::)              -> Plumbing
//     * the autograd engine and backward functions (autograd::Engine, autograd::generated,
//       autograd::Node, AccumulateGrad, evaluate_function, PythonEngine)     -> Autograd
//     * an unsymbolized frame (no name, or "??")                            -> Plumbing
//     * anything else                                                        -> CppOp
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "format/model/snapshot.h"

namespace memforensics::analysis {

enum class FrameKind : uint8_t {
  User,       // the program's own Python code
  Framework,  // PyTorch's Python code (torch/nn, torch/functional, ...)
  Autograd,   // the autograd engine and backward functions (Python or C++)
  Optimizer,  // torch/optim
  Plumbing,   // interpreter, threads, libc, call wrappers, allocator/dispatcher: says nothing
  CppOp,      // a C++ frame that is none of the above: an operator's implementation
};
std::string_view frameKindName(FrameKind k);

FrameKind classifyFrame(std::string_view filename, std::string_view name);
FrameKind classifyFrame(const format::Snapshot& s, const format::Frame& f);

// The function's qualified name without return type or arguments: "at::TensorBase
// at::detail::_empty_generic<long>(c10::ArrayRef<long>, ...)" ->
// "at::detail::_empty_generic<long>".
std::string_view qualifiedFunctionName(std::string_view name);

bool isPythonFile(std::string_view filename);

// What a stack says about the code that allocated. Frame indices are into s.stacks.stack(id),
// innermost first; -1 = none.
struct StackFacts {
  bool backward = false;     // an Autograd frame: made by the autograd engine / a backward pass
  bool optimizer = false;    // an Optimizer frame: made by an optimizer (step, state init)
  bool module_init = false;  // parameter creation: an __init__ outside torch/optim, or
                             // nn.Module._apply / to / cuda / convert
  bool forward = false;      // a model's forward: a `forward` frame, the module call wrappers,
                             // or torch/nn/functional.py
  // DataParallel's copies of the module onto the other devices (replicas of parameters and
  // buffers): torch/nn/parallel/comm.py broadcast / broadcast_coalesced, replicate.py,
  // data_parallel.py replicate, the C++ torch::cuda::broadcast*. Broadcast is an
  // autograd.Function, so these stacks also hold torch/autograd/function.py: replicate wins over
  // backward for whoever reads both (categories).
  bool replicate = false;
  bool python = false;          // any Python frame
  int32_t innermost_user = -1;  // the innermost User frame
  int32_t op = -1;  // the innermost CppOp or Autograd C++ frame (the operator, for C++-only stacks)
};
StackFacts stackFacts(const format::Snapshot& s, format::StackId id);

// What one frame contributes to a stack's facts: its kind and the name / file tests of
// stackFacts(). The stack's facts are a fold of its frames' (innermost first), so a frame shared by
// many stacks is classified once per cache, not once per stack.
struct FrameFacts {
  FrameKind kind = FrameKind::CppOp;
  bool python = false;       // a Python file
  bool module_init = false;  // nn.Module._apply / to / cuda / convert, or an __init__ outside
                             // torch/optim
  bool replicate = false;    // DataParallel's replicate / broadcast (StackFacts::replicate)
  bool forward = false;      // forward, the module call wrappers, torch/nn/functional.py
};
FrameFacts frameFacts(std::string_view filename, std::string_view name);

// frameFacts() memoized per frame id and stackFacts() per stack id (frames repeat across
// thousands of stacks, stacks across millions of events). Filled on first use, so it is not
// thread-safe: one per device's analysis (a DeviceSession, a call's locals), never shared between
// threads. It caches only what frameFacts() / stackFacts() say: the rule stays there.
// Every frame's and every stack's facts of one snapshot (what a StackFactsCache fills on use),
// computed once by freezeStackFacts and then only read: the caches of all devices, on any number
// of threads, read it instead of classifying the same frames again per device.
struct FrozenStackFacts {
  std::vector<FrameFacts> frames;  // by FrameId
  std::vector<StackFacts> stacks;  // by StackId
};
FrozenStackFacts freezeStackFacts(const format::Snapshot& s);

class StackFactsCache {
 public:
  // With `frozen` (freezeStackFacts of the same snapshot, outliving the cache), ids it holds are
  // read from it; the others are computed and kept here as without it.
  explicit StackFactsCache(const format::Snapshot& s, const FrozenStackFacts* frozen = nullptr)
      : s_(s), frozen_(frozen) {}
  const StackFacts& of(format::StackId id);
  const FrameFacts& frame(format::FrameId id);
  const format::Snapshot& snapshot() const { return s_; }

 private:
  friend FrozenStackFacts freezeStackFacts(const format::Snapshot& s);
  const format::Snapshot& s_;
  const FrozenStackFacts* frozen_ = nullptr;
  std::vector<StackFacts> facts_;
  std::vector<uint8_t> known_;
  std::vector<FrameFacts> frames_;
  std::vector<uint8_t> frame_known_;
};

}  // namespace memforensics::analysis
