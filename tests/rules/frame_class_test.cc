// frame_class_test.cc: the one frame classifier on the real frame shapes of PyTorch snapshots
// (names and files copied from the real snapshots' stacks), and userFrames() built on it.
#include "analysis/frames/frame_class.h"

#include <gtest/gtest.h>

#include "analysis/frames/frames.h"

namespace memforensics::analysis {
namespace {

struct F {
  std::string file;
  uint64_t line;
  std::string name;
};

// Interns `frames` (innermost first) as one stack of `s`.
format::StackId stackOf(format::Snapshot& s, const std::vector<F>& frames) {
  std::vector<format::FrameId> ids;
  for (const F& f : frames) {
    format::Frame fr;
    fr.filename = s.strings.intern(f.file);
    fr.name = s.strings.intern(f.name);
    fr.line = f.line;
    ids.push_back(s.stacks.internFrame(fr));
  }
  return s.stacks.internStack(ids);
}

std::vector<std::string> shown(const format::Snapshot& s, format::StackId st, size_t max = 8) {
  std::vector<std::string> out;
  for (const FrameText& f : userFrames(s, st, max)) out.push_back(f.display());
  return out;
}

const F kUnwind{"??", 0, "torch::unwind::unwind()"};
const F kGather{"??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"};
const F kMalloc{"CUDACachingAllocator.cpp", 0,
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed "
                "char, unsigned long, CUstream_st*)"};
const F kEmptyGeneric{"", 0,
                      "at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, "
                      "c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, "
                      "std::optional<c10::MemoryFormat>)"};
const F kEmptyStridedCuda{"??", 0,
                          "at::native::empty_strided_cuda(c10::ArrayRef<long>, "
                          "c10::ArrayRef<long>, std::optional<c10::ScalarType>, "
                          "std::optional<c10::Layout>, std::optional<c10::Device>, "
                          "std::optional<bool>)"};
const F kWrapperCuda{"RegisterCUDA.cpp", 0,
                     "at::(anonymous namespace)::(anonymous "
                     "namespace)::wrapper_CUDA__empty_strided(c10::ArrayRef<c10::SymInt>, "
                     "c10::ArrayRef<c10::SymInt>)"};
const F kDivBackwardFormula{"", 0,
                            "torch::autograd::generated::details::div_tensor_other_backward(at::"
                            "Tensor const&, at::Tensor const&, at::Tensor const&)"};
const F kDivBackward{"??", 0,
                     "torch::autograd::generated::DivBackward0::apply(std::vector<at::Tensor, "
                     "std::allocator<at::Tensor> >&&)"};
const F kEvaluate{"??", 0,
                  "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::"
                  "GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, "
                  "std::shared_ptr<torch::autograd::ReadyQueue> const&)"};
const F kThreadMain{"??", 0,
                    "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::"
                    "GraphTask> const&)"};
const F kNativeThread{"thread48.o", 0, "execute_native_thread_routine"};
const F kStartThread{"./nptl/pthread_create.c", 442, "start_thread"};
const F kClone3{"./misc/../sysdeps/unix/sysv/linux/x86_64/clone3.S", 81, "__clone3"};
const F kBootstrapInner{"/usr/lib/python3.10/threading.py", 1016, "_bootstrap_inner"};
const F kBootstrap{"/usr/lib/python3.10/threading.py", 973, "_bootstrap"};
const F kCallImpl{"/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py", 1747,
                  "_call_impl"};
const F kLinear{"/usr/local/lib/python3.10/dist-packages/torch/nn/modules/linear.py", 125,
                "forward"};
const F kAdam{"/usr/local/lib/python3.10/dist-packages/torch/optim/adam.py", 160, "step"};
const F kTensorBackward{"/usr/local/lib/python3.10/dist-packages/torch/_tensor.py", 581,
                        "backward"};
const F kUserModel{"/home/u/model.py", 54, "forward"};
const F kUserTrain{"/home/u/train.py", 12, "main"};

TEST(FrameClass, KindsOfRealFrames) {
  auto kind = [](const F& f) { return classifyFrame(f.file, f.name); };
  EXPECT_EQ(kind(kUnwind), FrameKind::Plumbing);
  EXPECT_EQ(kind(kMalloc), FrameKind::Plumbing);
  EXPECT_EQ(kind(kEmptyGeneric), FrameKind::Plumbing);  // return type before at::detail::
  EXPECT_EQ(kind(kEmptyStridedCuda), FrameKind::Plumbing);
  EXPECT_EQ(kind(kWrapperCuda), FrameKind::Plumbing);
  EXPECT_EQ(kind(kStartThread), FrameKind::Plumbing);
  EXPECT_EQ(kind(kClone3), FrameKind::Plumbing);
  EXPECT_EQ(kind(kNativeThread), FrameKind::Plumbing);
  EXPECT_EQ(kind(kBootstrap), FrameKind::Plumbing);
  EXPECT_EQ(kind(kBootstrapInner), FrameKind::Plumbing);
  EXPECT_EQ(kind(kCallImpl), FrameKind::Plumbing);
  EXPECT_EQ(kind(kDivBackwardFormula), FrameKind::Autograd);
  EXPECT_EQ(kind(kDivBackward), FrameKind::Autograd);
  EXPECT_EQ(kind(kEvaluate), FrameKind::Autograd);
  EXPECT_EQ(kind(kTensorBackward), FrameKind::Autograd);
  EXPECT_EQ(kind(kAdam), FrameKind::Optimizer);
  EXPECT_EQ(kind(kLinear), FrameKind::Framework);
  EXPECT_EQ(kind(kUserModel), FrameKind::User);
  EXPECT_EQ(classifyFrame("", "at::native::addmm_out_cuda(at::Tensor const&)"), FrameKind::CppOp);
  // A package installed into Python's lib folder is not Python's runtime.
  EXPECT_EQ(classifyFrame("/usr/lib/python3.10/site-packages/ray/worker.py", "main_loop"),
            FrameKind::Framework);
  EXPECT_EQ(classifyFrame("<frozen runpy>", "_run_module_as_main"), FrameKind::Plumbing);
  // The runtimes' own functions, also when mis-symbolized thread start-up (real snapshots).
  EXPECT_EQ(classifyFrame("??", "pthread_condattr_setpshared"), FrameKind::Plumbing);
  EXPECT_EQ(classifyFrame("??", "std::error_code::default_error_condition() const"),
            FrameKind::Plumbing);
  // A return type that looks like plumbing does not make the function plumbing.
  EXPECT_EQ(classifyFrame("", "std::vector<at::Tensor> at::native::split(at::Tensor const&)"),
            FrameKind::CppOp);
}

TEST(FrameClass, QualifiedFunctionName) {
  EXPECT_EQ(qualifiedFunctionName(kEmptyGeneric.name), "at::detail::_empty_generic<long>");
  EXPECT_EQ(qualifiedFunctionName(kWrapperCuda.name),
            "at::(anonymous namespace)::(anonymous namespace)::wrapper_CUDA__empty_strided");
  EXPECT_EQ(qualifiedFunctionName("torch::autograd::Node::operator()(std::vector<at::Tensor>&&)"),
            "torch::autograd::Node::operator()");
  EXPECT_EQ(qualifiedFunctionName("c10::intrusive_ptr<c10::TensorImpl, c10::detail::x<c10::T> > "
                                  "c10::make_intrusive<c10::TensorImpl>(int)"),
            "c10::make_intrusive<c10::TensorImpl>");
  EXPECT_EQ(qualifiedFunctionName("start_thread"), "start_thread");
}

// The autograd thread's stack (C++ only, from the real snapshots): the shown frames are the
// backward op, never the allocator's factories, libc or the thread start-up.
TEST(FrameClass, CppOnlyBackwardStackShowsTheOp) {
  format::Snapshot s;
  auto st =
      stackOf(s, {kUnwind, kGather, kMalloc, kEmptyGeneric, kEmptyStridedCuda, kDivBackwardFormula,
                  kDivBackward, kEvaluate, kThreadMain, kNativeThread, kStartThread, kClone3});
  auto got = shown(s, st);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.front(), ":0 " + kDivBackwardFormula.name);
  for (const std::string& f : got) {
    for (const char* bad :
         {"_empty_generic", "empty_strided_cuda", "start_thread", "pthread_create", "clone3",
          "execute_native_thread_routine", "CUDACachingAllocator"}) {
      EXPECT_EQ(f.find(bad), std::string::npos) << f;
    }
  }
  StackFacts facts = stackFacts(s, st);
  EXPECT_TRUE(facts.backward);
  EXPECT_FALSE(facts.optimizer);
  EXPECT_EQ(facts.innermost_user, -1);
  EXPECT_EQ(facts.op, 5);  // div_tensor_other_backward
}

// A Python thread whose only Python frames are threading's bootstrap and torch: the bootstrap is
// never shown, torch's frames are.
TEST(FrameClass, PythonBootstrapIsNeverShown) {
  format::Snapshot s;
  auto st = stackOf(s, {kMalloc, kEmptyGeneric, kLinear, kCallImpl, kBootstrapInner, kBootstrap});
  EXPECT_EQ(shown(s, st), (std::vector<std::string>{kLinear.file + ":125 forward"}));
  auto user = stackOf(s, {kMalloc, kLinear, kCallImpl, kUserModel, kCallImpl, kUserTrain,
                          kBootstrapInner, kBootstrap});
  EXPECT_EQ(shown(s, user),
            (std::vector<std::string>{"/home/u/model.py:54 forward", "/home/u/train.py:12 main"}));
  StackFacts f = stackFacts(s, user);
  EXPECT_EQ(f.innermost_user, 3);
  EXPECT_TRUE(f.forward);
  EXPECT_FALSE(f.backward);
}

// The frames of real DataParallel worker stacks that are neither user code nor an operator: the
// interpreter's C functions and thread start-up (thread_run, Py_RunMain), unsymbolized frames,
// and the helpers that allocate an operator's output (resize_output, set_output_raw_strided).
TEST(FrameClass, InterpreterUnsymbolizedAndOutputHelpersArePlumbing) {
  for (const char* n : {"thread_run", "t_bootstrap", "Py_RunMain", "Py_BytesMain",
                        "_PyObject_MakeTpCall", "PyVectorcall_Call", "cfunction_call", "??", "",
                        "pybind11::cpp_function::dispatcher(_object*, _object*, _object*)",
                        "bool at::native::resize_output<long>(at::Tensor const&, "
                        "c10::ArrayRef<long>)",
                        "at::native::structured_mm_out_cuda::set_output_raw_strided(long, "
                        "c10::ArrayRef<long>)"}) {
    EXPECT_EQ(classifyFrame("??", n), FrameKind::Plumbing) << n;
  }
  // Seen in the real snapshots' icicles before: CPython's C functions with a compiler's clone
  // suffix, its start-up, its own source files, the C runtime, torch.compile's frame hook,
  // Cython's and torch's Python binding glue.
  for (const char* n :
       {"method_vectorcall.llvm.12953771611045685011", "pymain_main.llvm.14417152717030300093",
        "pymain_run_file", "run_mod.llvm.13998059308497196787", "pyrun_file", "main",
        "__libc_init_first", "dynamo__custom_eval_frame", "dynamo_eval_custom_code",
        "method_vectorcall_VARARGS_KEYWORDS.llvm.5455514332722937381",
        "__Pyx_PyObject_Call(_object*, _object*, _object*)", "slot_nb_add",
        "torch::handle_torch_function_no_python_arg_parser(c10::ArrayRef<_object*>)",
        "_object* torch::autograd::TypeError_to_NotImplemented_<&torch::autograd::"
        "THPVariable_add>(_object*, _object*, _object*)"}) {
    EXPECT_EQ(classifyFrame("??", n), FrameKind::Plumbing) << n;
  }
  EXPECT_EQ(classifyFrame("/usr/local/src/conda/python-3.12.3/Objects/abstract.c", "binary_op1"),
            FrameKind::Plumbing);
  EXPECT_EQ(classifyFrame("/build/python-3.12/Python/bytecodes.c", "some_new_helper"),
            FrameKind::Plumbing);
  EXPECT_EQ(classifyFrame("crtstuff.c", "frame_dummy"), FrameKind::Plumbing);
  // Not every C name or C file: an operator's C function, a dotted C++ name, a kernel's .c file,
  // a program's own names that begin like the interpreter's, an extension's Modules/ folder.
  for (const char* n : {"run_model(at::Tensor const&)", "run_module_forward", "vectorcall_dispatch",
                        "binary_op_kernel<float>::operator()(float, float) const",
                        "dynamo_utils::foo()", "main::{lambda()#1}::operator()() const",
                        "at::Tensor binary_operation(at::Tensor const&)"}) {
    EXPECT_EQ(classifyFrame("??", n), FrameKind::CppOp) << n;
  }
  EXPECT_EQ(classifyFrame("/src/my_ext/Modules/attn.c", "attn_forward"), FrameKind::CppOp);
  EXPECT_EQ(classifyFrame("??", "mainloop_kernel"), FrameKind::CppOp);
  EXPECT_EQ(classifyFrame("kernels/softmax.c", "softmax_forward"), FrameKind::CppOp);
  EXPECT_EQ(classifyFrame("??", "at::native::main_op(at::Tensor const&)"), FrameKind::CppOp);
  // Operators stay operators, torch's Python bindings included.
  EXPECT_EQ(classifyFrame("??", "at::native::linear(at::Tensor const&, at::Tensor const&)"),
            FrameKind::CppOp);
  EXPECT_EQ(classifyFrame("??", "torch::autograd::THPVariable_mm(_object*, _object*)"),
            FrameKind::CppOp);
  format::Snapshot s;
  const F resize{"??", 0, "at::native::resize_output(at::Tensor const&, c10::ArrayRef<long>)"};
  const F addmm{"??", 0, "at::native::addmm_out_cuda_impl(at::Tensor&, at::Tensor const&)"};
  const F thread_run{"??", 0, "thread_run"};
  auto st = stackOf(
      s,
      {kMalloc, kEmptyGeneric, resize, addmm, {"??", 0, "??"}, thread_run, kStartThread, kClone3});
  EXPECT_EQ(shown(s, st), (std::vector<std::string>{"??:0 " + addmm.name}));
}

// DataParallel's replicate is a stack fact of the one classifier: comm.py broadcast_coalesced,
// replicate.py, data_parallel.py replicate and torch::cuda::broadcast*; not its reduce-add
// (ReduceAddCoalesced: the gradients' way back) and not the rest of torch/nn/parallel.
TEST(FrameClass, ReplicateFact) {
  const std::string t = "/usr/lib/python3.10/site-packages/torch/nn/parallel/";
  format::Snapshot s;
  auto fact = [&](const std::vector<F>& fr) { return stackFacts(s, stackOf(s, fr)).replicate; };
  EXPECT_TRUE(fact({kMalloc, {t + "comm.py", 67, "broadcast_coalesced"}, kUserTrain}));
  EXPECT_TRUE(fact({kMalloc, {t + "replicate.py", 125, "replicate"}, kUserTrain}));
  EXPECT_TRUE(fact({kMalloc, {t + "data_parallel.py", 200, "replicate"}, kUserTrain}));
  EXPECT_TRUE(fact({kMalloc,
                    {"??", 0,
                     "torch::cuda::broadcast_coalesced(c10::ArrayRef<at::Tensor>, "
                     "c10::ArrayRef<long>, unsigned long)"}}));
  EXPECT_FALSE(fact({kMalloc, {t + "comm.py", 120, "reduce_add_coalesced"}, kUserTrain}));
  EXPECT_FALSE(fact({kMalloc, {t + "parallel_apply.py", 83, "_worker"}, kUserModel}));
  EXPECT_FALSE(fact({kMalloc, {"/home/u/replicate.py", 3, "replicate"}, kUserTrain}))
      << "only PyTorch's replicate";
}

// A stack of nothing but plumbing shows nothing (no frame of it says who allocated).
TEST(FrameClass, AllPlumbingShowsNothing) {
  format::Snapshot s;
  auto st = stackOf(s, {kUnwind, kMalloc, kEmptyGeneric, kStartThread, kClone3});
  EXPECT_TRUE(shown(s, st).empty());
}

// One classifier for phases and categories: the Python backward call, the C++ engine and a
// backward formula alone each mark a stack backward; torch/optim marks it optimizer.
TEST(FrameClass, StackFactsBackwardAndOptimizer) {
  format::Snapshot s;
  EXPECT_TRUE(stackFacts(s, stackOf(s, {kMalloc, kTensorBackward, kUserTrain})).backward);
  EXPECT_TRUE(stackFacts(s, stackOf(s, {kMalloc, kDivBackward})).backward);
  EXPECT_TRUE(stackFacts(s, stackOf(s, {kMalloc, kEvaluate})).backward);
  auto opt = stackFacts(s, stackOf(s, {kMalloc, kAdam, kUserTrain}));
  EXPECT_TRUE(opt.optimizer);
  EXPECT_FALSE(opt.backward);
  EXPECT_FALSE(stackFacts(s, format::kNoStack).backward);
  StackFactsCache cache(s);
  auto st = stackOf(s, {kMalloc, kAdam});
  EXPECT_TRUE(cache.of(st).optimizer);
  EXPECT_TRUE(cache.of(st).optimizer);
}

}  // namespace
}  // namespace memforensics::analysis
