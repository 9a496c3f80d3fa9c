// categories_test.cc: the category rules (docs/findings.md "Categories") and the frames shown for
// a stack (userFrames, the call graph's hot path, groups) on the shapes of real jobs, fabricated
// with the direct builder: a DataParallel job whose worker threads run the forward, whose replicas
// are broadcast onto cuda:1, and whose OOM on cuda:1 is followed by the exception's unwind; then
// the must-not cases (a real temporary, optimizer state), and the real snapshots' shown frames.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/frames/callgraph.h"
#include "analysis/frames/frame_class.h"
#include "analysis/frames/frames.h"
#include "analysis/frames/stack_groups.h"
#include "analysis/session/session.h"
#include "fixtures/model_builder.h"
#include "fixtures/real_snapshots.h"
#include "format/load/load.h"

namespace memforensics::analysis {
namespace {

using memforensics::testing::Frames;
using memforensics::testing::ModelBuilder;
using memforensics::testing::TFrame;

constexpr uint64_t kBase = 0x7f0000000000ULL;
constexpr uint64_t kMiB = 1048576;

const std::string kTorch = "/usr/lib/python3.10/site-packages/torch/";
const TFrame kMalloc{"??", 0,
                     "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc("
                     "signed char, unsigned long, CUstream_st*)"};
const TFrame kEmptyGeneric{"", 0,
                           "at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, "
                           "c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, "
                           "std::optional<c10::MemoryFormat>)"};
const TFrame kEmptyStrided{"??", 0,
                           "at::native::empty_strided_cuda(c10::ArrayRef<long>, "
                           "c10::ArrayRef<long>, std::optional<c10::ScalarType>, "
                           "std::optional<c10::Layout>, std::optional<c10::Device>, "
                           "std::optional<bool>)"};
const TFrame kResizeOutput{"??", 0,
                           "bool at::native::resize_output<long>(at::Tensor const&, "
                           "c10::ArrayRef<long>)"};
const TFrame kAddmm{"??", 0,
                    "at::native::addmm_out_cuda_impl(at::Tensor&, at::Tensor const&, at::Tensor "
                    "const&, at::Tensor const&, c10::Scalar const&, c10::Scalar const&, bool)"};
const TFrame kMmCall{"", 0, "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"};
const TFrame kUnsymbolized{"??", 0, "??"};
const TFrame kStartThread{"./nptl/pthread_create.c", 477, "start_thread"};
const TFrame kClone3{"../sysdeps/unix/sysv/linux/x86_64/clone3.S", 81, "__clone3"};
const TFrame kLinear{kTorch + "nn/modules/linear.py", 125, "forward"};
const TFrame kCallImpl{kTorch + "nn/modules/module.py", 1750, "_call_impl"};
const TFrame kWrappedCall{kTorch + "nn/modules/module.py", 1739, "_wrapped_call_impl"};
const TFrame kModels{"/home/u/job/models.py", 174, "forward"};
const TFrame kModelsOuter{"/home/u/job/models.py", 310, "forward"};
const TFrame kWorker{kTorch + "nn/parallel/parallel_apply.py", 83, "_worker"};
const TFrame kRun{"/usr/lib/python3.10/threading.py", 953, "run"};
const TFrame kBootstrapInner{"/usr/lib/python3.10/threading.py", 1016, "_bootstrap_inner"};
const TFrame kBootstrap{"/usr/lib/python3.10/threading.py", 973, "_bootstrap"};
const TFrame kTrainMain{"/home/u/job/train.py", 50, "main"};

// A DataParallel worker thread running the model's forward on its replica (innermost first).
Frames workerForward(const TFrame& innermost_user) {
  return {kMalloc,      kEmptyGeneric,   kEmptyStrided, kAddmm,        kLinear,      kCallImpl,
          kWrappedCall, innermost_user,  kModelsOuter,  kCallImpl,     kWrappedCall, kWorker,
          kRun,         kBootstrapInner, kBootstrap,    kUnsymbolized, kStartThread, kClone3};
}

// DataParallel.forward replicating the module onto the other devices (main thread).
Frames replicaStack() {
  return {kMalloc,
          {"??", 0,
           "torch::cuda::broadcast_coalesced(c10::ArrayRef<at::Tensor>, c10::ArrayRef<long>, "
           "unsigned long)"},
          {kTorch + "nn/parallel/comm.py", 67, "broadcast_coalesced"},
          {kTorch + "nn/parallel/_functions.py", 23, "forward"},
          {kTorch + "autograd/function.py", 575, "apply"},
          {kTorch + "nn/parallel/replicate.py", 12, "_broadcast_coalesced_reshape"},
          {kTorch + "nn/parallel/replicate.py", 125, "replicate"},
          {kTorch + "nn/parallel/data_parallel.py", 200, "replicate"},
          {kTorch + "nn/parallel/data_parallel.py", 185, "forward"},
          kCallImpl,
          kWrappedCall,
          kTrainMain};
}

// A C++-only stack (the autograd or a worker thread without Python frames): mm through the
// dispatcher into its output's allocation.
Frames cppOnly(bool with_resize) {
  Frames f = {kMalloc, kEmptyGeneric, kEmptyStrided};
  if (with_resize) f.push_back(kResizeOutput);
  for (const TFrame& x : {kAddmm, kMmCall, kUnsymbolized, kStartThread, kClone3}) f.push_back(x);
  return f;
}

const Frames kAdamState = {kMalloc,
                           {kTorch + "optim/adam.py", 412, "_single_tensor_adam"},
                           {kTorch + "optim/adam.py", 230, "step"},
                           {"/home/u/job/train.py", 80, "main"}};
const Frames kScratch = {kMalloc, {"/home/u/job/train.py", 60, "main"}};

// Device 0: no OOM; a real temporary (made and freed within two events), optimizer state alive
// at the end, a forward output kept. Device 1: 4 replicas (16 MiB each) broadcast onto it, 6
// forward intermediates (32 MiB each) from two worker-thread lines, a short-lived forward
// temporary, an OOM of 2 GiB, then the unwind frees everything.
struct Job {
  format::Snapshot snap;
  int64_t oom_event = -1;  // on device 1
};

Job dataParallelJob() {
  ModelBuilder b;
  b.device(0).segmentAlloc(kBase, 256 * kMiB, {.time_us = 1});
  b.alloc(kBase, 8 * kMiB, {.time_us = 2, .frames = kAdamState});
  b.alloc(kBase + 8 * kMiB, 4 * kMiB, {.time_us = 3, .frames = kScratch});
  b.free(kBase + 8 * kMiB, 4 * kMiB, {.time_us = 4});
  b.alloc(kBase + 16 * kMiB, 2 * kMiB, {.time_us = 5, .frames = workerForward(kModels)});
  for (int i = 0; i < 8; ++i)
    b.alloc(kBase + (32 + 2 * i) * kMiB, kMiB, {.time_us = 6 + i, .frames = kAdamState});

  const uint64_t base1 = kBase + (1ull << 32);
  int64_t t = 100;
  b.device(1).segmentAlloc(base1, 1024 * kMiB, {.time_us = t++});
  uint64_t at = base1;
  std::vector<std::pair<uint64_t, uint64_t>> held;
  for (int i = 0; i < 4; ++i) {
    b.alloc(at, 16 * kMiB, {.time_us = t++, .frames = replicaStack()});
    held.push_back({at, 16 * kMiB});
    at += 16 * kMiB;
  }
  for (int i = 0; i < 6; ++i) {
    b.alloc(at, 32 * kMiB,
            {.time_us = t++, .frames = workerForward(i % 3 != 0 ? kModels : kModelsOuter)});
    held.push_back({at, 32 * kMiB});
    at += 32 * kMiB;
    if (i == 2) {  // a short-lived intermediate of the forward: made and freed at once
      b.alloc(at, 8 * kMiB, {.time_us = t++, .frames = workerForward(kModels)});
      b.free(at, 8 * kMiB, {.time_us = t++});
    }
  }
  b.oom(2048 * kMiB, /*device_free=*/91 * kMiB, {.time_us = t++, .frames = workerForward(kModels)});
  for (auto [addr, size] : held) b.free(addr, size, {.time_us = t++});
  Job j;
  j.snap = b.build();
  const auto ev = j.snap.trace(1);
  for (size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].action == format::Action::Oom) j.oom_event = static_cast<int64_t>(i);
  }
  return j;
}

std::map<Category, uint64_t> liveByCategory(const format::Snapshot& snap, const DeviceFacts& f,
                                            const MomentFacts& m) {
  std::map<Category, uint64_t> out;
  m.live.forEach([&](uint64_t, const replay::LiveBlock& b) {
    if (!b.pending) out[f.categoryOf(snap, b)] += b.requested;
  });
  return out;
}

const AllocFact* allocOfSize(const DeviceFacts& f, uint64_t requested) {
  for (const AllocFact& a : f.allocs) {
    if (a.requested == requested) return &a;
  }
  return nullptr;
}

TEST(Categories, AtADataParallelOomForwardIntermediatesAreActivationsAndReplicasParameters) {
  Job j = dataParallelJob();
  ASSERT_GE(j.oom_event, 0);
  auto facts = buildFacts(j.snap, {.device = 1});
  ASSERT_EQ(facts.size(), 1u);
  const DeviceFacts& f = facts[0];
  EXPECT_TRUE(f.iterations.empty()) << "one forward pass: no iterations";
  const MomentFacts* m = f.at(j.oom_event);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->has_live);
  const auto by = liveByCategory(j.snap, f, *m);
  // Before: 192 MiB "temporary" (freed soon after, by the unwind) and 64 MiB "gradient" (the
  // replicas' stacks run through autograd's Function.apply).
  EXPECT_EQ(by.count(Category::Temporary), 0u);
  EXPECT_EQ(by.count(Category::Gradient), 0u);
  EXPECT_EQ(by.count(Category::Unknown), 0u);
  ASSERT_EQ(by.count(Category::Activation), 1u);
  EXPECT_EQ(by.at(Category::Activation), 6 * 32 * kMiB);
  ASSERT_EQ(by.count(Category::Parameter), 1u);
  EXPECT_EQ(by.at(Category::Parameter), 4 * 16 * kMiB);
  // The forward's short-lived intermediate, freed long before the OOM, stays a temporary.
  const AllocFact* tmp = allocOfSize(f, 8 * kMiB);
  ASSERT_NE(tmp, nullptr);
  EXPECT_EQ(tmp->category, Category::Temporary);
}

TEST(Categories, ReplicateIsAStackFactOfTheOneClassifier) {
  format::Snapshot s = ModelBuilder()
                           .alloc(kBase, 1, {.frames = replicaStack()})
                           .alloc(kBase + 512, 1, {.frames = workerForward(kModels)})
                           .build();
  const auto ev = s.trace(0);
  const StackFacts rep = stackFacts(s, ev[0].stack);
  EXPECT_TRUE(rep.replicate);
  EXPECT_TRUE(rep.backward) << "Broadcast is an autograd.Function: the frame is still autograd's";
  EXPECT_FALSE(stackFacts(s, ev[1].stack).replicate);
  // A block alive before the trace with a replica's stack is a parameter, not a gradient.
  EXPECT_EQ(preTraceCategory(s, ev[0].stack), Category::Parameter);
  EXPECT_EQ(preTraceCategory(s, ev[1].stack), Category::Activation);
}

TEST(Categories, MustNotRealTemporaryOptimizerStateAndThinEvidence) {
  Job j = dataParallelJob();
  auto facts = buildFacts(j.snap, {.device = 0});
  ASSERT_EQ(facts.size(), 1u);
  const DeviceFacts& f = facts[0];
  ASSERT_EQ(f.allocs.size(), 11u);
  EXPECT_EQ(f.allocs[0].category, Category::OptimizerState);  // alive at the end
  EXPECT_EQ(f.allocs[1].category, Category::Temporary);       // made and freed at once, no OOM
  EXPECT_EQ(f.allocs[2].category, Category::Activation);      // forward output, kept (was unknown)
  for (size_t k = 3; k < f.allocs.size(); ++k)
    EXPECT_EQ(f.allocs[k].category, Category::OptimizerState);

  // Thin evidence: long-lived, no stack, no phases.
  format::Snapshot s = ModelBuilder()
                           .segmentAlloc(kBase, 20 * kMiB)
                           .alloc(kBase, kMiB)
                           .alloc(kBase + kMiB, kMiB)
                           .free(kBase + kMiB, kMiB)
                           .build();
  auto g = buildFacts(s, {.device = 0});
  ASSERT_EQ(g[0].allocs.size(), 2u);
  EXPECT_EQ(g[0].allocs[0].category, Category::Unknown);
}

// Alive at an OOM, freed by the unwind right after, no forward frame: its short life says nothing
// (a temporary by lifetime alone, before), so unknown. The scratch buffers after it are real
// temporaries.
TEST(Categories, AllocationAliveAtAnOomWithoutForwardEvidenceIsUnknownNotTemporary) {
  ModelBuilder b;
  b.segmentAlloc(kBase, 64 * kMiB);
  b.alloc(kBase, 8 * kMiB, {.frames = kScratch});
  b.oom(128 * kMiB, 0);
  b.free(kBase, 8 * kMiB);
  for (int i = 0; i < 10; ++i) {
    b.alloc(kBase + 16 * kMiB, kMiB, {.frames = kScratch});
    b.free(kBase + 16 * kMiB, kMiB);
  }
  format::Snapshot s = b.build();
  auto f = buildFacts(s, {.device = 0});
  ASSERT_EQ(f[0].allocs.size(), 11u);
  EXPECT_EQ(f[0].allocs[0].category, Category::Unknown);
  for (size_t k = 1; k < f[0].allocs.size(); ++k)
    EXPECT_EQ(f[0].allocs[k].category, Category::Temporary);
}

TEST(Categories, AnOomOnAnotherDeviceOfTheJobUnwindsThisOneToo) {
  ModelBuilder b;
  b.device(1).segmentAlloc(kBase + (1ull << 32), 64 * kMiB, {.time_us = 40});
  b.oom(128 * kMiB, 0, {.time_us = 50, .frames = workerForward(kModels)});
  b.device(0).segmentAlloc(kBase, 64 * kMiB, {.time_us = 1});
  b.alloc(kBase, 4 * kMiB, {.time_us = 10, .frames = workerForward(kModels)});  // freed at 20
  b.free(kBase, 4 * kMiB, {.time_us = 20});
  b.alloc(kBase + 4 * kMiB, 8 * kMiB, {.time_us = 45, .frames = workerForward(kModels)});
  b.free(kBase + 4 * kMiB, 8 * kMiB, {.time_us = 60});  // by the unwind
  for (int i = 0; i < 10; ++i) {
    b.alloc(kBase + 16 * kMiB, kMiB, {.time_us = 70 + 2 * i, .frames = kScratch});
    b.free(kBase + 16 * kMiB, kMiB, {.time_us = 71 + 2 * i});
  }
  format::Snapshot s = b.build();
  auto f = buildFacts(s, {.device = 0});
  ASSERT_EQ(f.size(), 1u);
  const AllocFact* early = allocOfSize(f[0], 4 * kMiB);
  const AllocFact* unwound = allocOfSize(f[0], 8 * kMiB);
  ASSERT_NE(early, nullptr);
  ASSERT_NE(unwound, nullptr);
  EXPECT_EQ(early->category, Category::Temporary);
  EXPECT_EQ(unwound->category, Category::Activation);
}

// With annotated steps: in step 1 the forward's two intermediates live through the step
// (activations) among 60 scratch buffers freed at once (temporaries); in step 2 the forward's
// intermediates are made just before the OOM and freed by the unwind right after: they look as
// short-lived as the scratch buffers, and are activations all the same.
TEST(Categories, ForwardIntermediatesAliveAtAnOomInsideAStepAreActivations) {
  ModelBuilder b;
  b.segmentAlloc(kBase, 256 * kMiB, {.time_us = 1});
  int64_t t = 10;
  auto scratch = [&](uint64_t at) {
    for (int i = 0; i < 60; ++i) {
      b.alloc(at, kMiB, {.time_us = t++, .frames = kScratch});
      b.free(at, kMiB, {.time_us = t++});
    }
  };
  auto forward = [&](uint64_t at) {
    for (int i = 0; i < 2; ++i)
      b.alloc(at + i * 16 * kMiB, 16 * kMiB, {.time_us = t++, .frames = workerForward(kModels)});
  };
  auto release = [&](uint64_t at) {
    for (int i = 1; i >= 0; --i) b.free(at + i * 16 * kMiB, 16 * kMiB, {.time_us = t++});
  };
  b.annotation(0, t++, "ProfilerStep#0", "START");
  forward(kBase);
  scratch(kBase + 64 * kMiB);
  release(kBase);
  b.annotation(0, t++, "ProfilerStep#0", "END");
  b.annotation(0, t++, "ProfilerStep#1", "START");
  scratch(kBase + 64 * kMiB);
  forward(kBase);
  b.oom(512 * kMiB, 0, {.time_us = t++, .frames = workerForward(kModels)});
  release(kBase);
  b.annotation(0, t++, "ProfilerStep#1", "END");
  format::Snapshot s = b.build();
  auto f = buildFacts(s, {.device = 0});
  ASSERT_EQ(f.size(), 1u);
  ASSERT_EQ(f[0].iterations.size(), 2u) << "the annotations are the steps";
  size_t activations = 0, temporaries = 0;
  for (const AllocFact& a : f[0].allocs) {
    const Category want = a.requested == 16 * kMiB ? Category::Activation : Category::Temporary;
    EXPECT_EQ(a.category, want) << "event " << a.event << ", iteration " << a.iteration;
    activations += a.category == Category::Activation;
    temporaries += a.category == Category::Temporary;
  }
  EXPECT_EQ(activations, 4u);
  EXPECT_EQ(temporaries, 120u);
}

TEST(UserFramesOnRealShapes, WorkerThreadStackShowsModelsPyNotThreadStartUp) {
  format::Snapshot s = ModelBuilder().alloc(kBase, 1, {.frames = workerForward(kModels)}).build();
  const auto shown = userFrames(s, s.trace(0)[0].stack, 3);
  ASSERT_EQ(shown.size(), 2u);
  EXPECT_EQ(shown[0].display(), "/home/u/job/models.py:174 forward");
  EXPECT_EQ(shown[1].display(), "/home/u/job/models.py:310 forward");
}

TEST(UserFramesOnRealShapes, CppOnlyStackNamesTheOpNotAnAllocationHelper) {
  format::Snapshot s = ModelBuilder().alloc(kBase, 1, {.frames = cppOnly(true)}).build();
  const auto shown = userFrames(s, s.trace(0)[0].stack, 3);
  ASSERT_FALSE(shown.empty());
  EXPECT_EQ(shown[0].name, kAddmm.name) << shown[0].display();
  for (const FrameText& t : shown) {
    EXPECT_EQ(t.name.find("resize_output"), std::string::npos) << t.display();
    EXPECT_NE(t.name, "??") << "an unsymbolized frame says nothing";
    EXPECT_EQ(t.name.find("start_thread"), std::string::npos);
  }
}

TEST(UserFramesOnRealShapes, GroupsWhoseFramesDifferOnlyInPlumbingMerge) {
  format::Snapshot s =
      ModelBuilder()
          .segmentAlloc(kBase, 20 * kMiB)
          .alloc(kBase, kMiB, {.frames = cppOnly(true)})
          .alloc(kBase + kMiB, 2 * kMiB, {.frames = cppOnly(false)})
          .alloc(kBase + 3 * kMiB, kMiB, {.frames = workerForward(kModels)})
          .alloc(kBase + 4 * kMiB, kMiB,
                 {.frames = Frames{kMalloc, kLinear, kCallImpl, kModels, kModelsOuter, kTrainMain}})
          .build();
  StackGrouper g(s, {.frames = 2});
  const auto ev = s.trace(0);
  for (size_t i = 1; i < ev.size(); ++i) g.add(ev[i].stack, ev[i].size);
  const auto groups = g.take();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].requested_bytes, 3 * kMiB);
  EXPECT_EQ(groups[0].stacks.size(), 2u);
  EXPECT_EQ(groups[1].requested_bytes, 2 * kMiB);
  EXPECT_EQ(groups[1].frames[0].display(), "/home/u/job/models.py:174 forward");
}

TEST(UserFramesOnRealShapes, HotPathAtTheOomRunsFromTheOutermostToTheInnermostUserFrame) {
  Job j = dataParallelJob();
  auto facts = buildFacts(j.snap, {.device = 1});
  const MomentFacts* m = facts[0].at(j.oom_event);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->has_live);
  const CallGraphSummary g = buildCallGraph(j.snap, m->live, 5);
  ASSERT_FALSE(g.hot_path.empty());
  EXPECT_EQ(g.hot_path.front().frame.display(), "/home/u/job/models.py:310 forward");
  EXPECT_EQ(g.hot_path.back().frame.display(), "/home/u/job/models.py:174 forward");
  for (const FrameBytes& fb : g.hot_path) {
    EXPECT_NE(classifyFrame(fb.frame.filename, fb.frame.name), FrameKind::Plumbing)
        << fb.frame.display();
  }
  EXPECT_EQ(g.hot_path.size(), 2u);
}

// What every real snapshot shows as "the line": never plumbing (thread start-up, libc, the
// allocator, the dispatcher, Python's bootstrap, the module call wrappers, unsymbolized frames),
// checked against the names themselves rather than the classifier.
bool looksLikePlumbing(const FrameText& t) {
  static const std::vector<std::string> kPrefixes = {
      "c10::", "at::detail::", "at::_ops::", "pthread_", "std::"};
  static const std::vector<std::string> kExact = {
      "start_thread",       "clone",      "clone3",           "__clone", "__clone3", "_call_impl",
      "_wrapped_call_impl", "_bootstrap", "_bootstrap_inner", "??"};
  static const std::vector<std::string> kParts = {
      "empty_strided",     "resize_output", "::set_output", "unwind::",
      "CapturedTraceback", "PyEval_",       "wrapper_",     "_empty_generic"};
  static const std::vector<std::string> kFiles = {"pthread_create.c", "threading.py", "runpy",
                                                  "<frozen", "clone3.S"};
  if (t.name.empty()) return true;
  const std::string q(qualifiedFunctionName(t.name));
  for (const std::string& p : kPrefixes) {
    if (q.rfind(p, 0) == 0) return true;
  }
  for (const std::string& n : kExact) {
    if (q == n) return true;
  }
  for (const std::string& n : kParts) {
    if (q.find(n) != std::string::npos) return true;
  }
  for (const std::string& f : kFiles) {
    if (t.filename.find(f) != std::string::npos) return true;
  }
  return false;
}

TEST(UserFramesOnRealShapes, RealSnapshotsNeverShowPlumbingAsTheLine) {
  const auto paths = memforensics::testing::realSnapshotPathsAndSample();
  size_t checked = 0;
  for (const auto& p : paths) {
    auto snap = format::loadSnapshotFile(p.string());
    ASSERT_TRUE(snap.ok()) << p << ": " << snap.error().describe();
    const size_t n = snap->stacks.stackCount();
    for (size_t id = 0; id < n; ++id) {
      const auto st = static_cast<format::StackId>(id);
      if (st == format::kNoStack || st == format::kEmptyStack) continue;
      for (const FrameText& t : userFrames(*snap, st, 3)) {
        EXPECT_FALSE(looksLikePlumbing(t)) << p.filename() << ": " << t.display();
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0u);
}

}  // namespace
}  // namespace memforensics::analysis
