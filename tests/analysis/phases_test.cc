// phases_test.cc: phases from annotations, iterations detected from the allocation stream, and
// what the real snapshots give.
#include "analysis/session/phases.h"

#include <gtest/gtest.h>

#include <iostream>

#include "fixtures/model_builder.h"
#include "fixtures/real_snapshots.h"
#include "fixtures/snapshot_builder.h"
#include "format/load/load.h"

namespace memforensics::analysis {
namespace {

using memforensics::testing::buildSnapshot;
using memforensics::testing::TEvent;
using memforensics::testing::TFrame;
using memforensics::testing::TSnapshot;

constexpr uint64_t kBase = 0x7f0000000000ULL;
constexpr uint64_t kSeg = 1ULL << 34;

void annotate(format::Snapshot& s, int64_t device, int64_t t, std::string_view name,
              std::string_view stage) {
  format::Annotation a;
  a.device = device;
  a.time_us = t;
  a.name = s.strings.intern(name);
  a.stage = s.strings.intern(stage);
  s.annotations.push_back(a);
}

std::vector<TFrame> stackAt(const std::string& file, uint64_t line, const std::string& fn) {
  return {{file, line, fn}, {"/home/u/train.py", 200, "main"}};
}

// Appends alloc/free pairs; addresses never repeat, so every event is unambiguous.
struct TraceBuilder {
  std::vector<TEvent> ev;
  uint64_t next = kBase;
  int64_t time = -1;  // -1: no times; otherwise advanced by 10 per event
  TEvent make(std::string action, uint64_t addr, uint64_t size, const std::vector<TFrame>* frames) {
    TEvent e;
    e.action = std::move(action);
    e.addr = addr;
    e.size = size;
    if (time >= 0) e.time_us = time += 10;
    if (frames != nullptr) {
      e.frames = *frames;
      e.with_frames = true;
    }
    return e;
  }
  uint64_t alloc(uint64_t size, const std::vector<TFrame>& frames) {
    uint64_t a = next;
    next += (size + 511) / 512 * 512;
    ev.push_back(make("alloc", a, size, &frames));
    return a;
  }
  void free(uint64_t addr, uint64_t size) {
    ev.push_back(make("free_requested", addr, size, nullptr));
    ev.push_back(make("free_completed", addr, size, nullptr));
  }
};

std::vector<Phase> ofKind(const std::vector<Phase>& ps, PhaseKind k) {
  std::vector<Phase> out;
  for (const auto& p : ps) {
    if (p.kind == k) out.push_back(p);
  }
  return out;
}

TEST(Phases, FromAnnotationsNestedAndOpen) {
  TraceBuilder b;
  b.time = 1000;
  auto st = stackAt("/home/u/model.py", 10, "forward");
  b.ev.push_back(b.make("segment_alloc", kBase, kSeg, nullptr));  // t=1010, event 0
  for (int i = 0; i < 10; ++i) b.alloc(1024, st);                 // t=1020..1110, events 1..10
  TSnapshot t;
  t.traces.push_back(b.ev);
  auto snap = buildSnapshot(t);
  annotate(snap, 0, 1015, "ProfilerStep#7", "START");
  annotate(snap, -1, 1030, "## forward ##", "START");  // device -1: every device
  annotate(snap, -1, 1050, "## forward ##", "END");
  annotate(snap, 0, 1061, "Optimizer.step#AdamW.step", "START");
  annotate(snap, 0, 1062, "Optimizer.step#AdamW.step", "END");  // no event inside: empty range
  annotate(snap, 1, 1070, "other device", "START");
  annotate(snap, 1, 1080, "other device", "END");
  annotate(snap, 0, 1075, "ProfilerStep#7", "END");
  annotate(snap, 0, 1090, "ProfilerStep#8", "START");  // never ends: open to the trace end
  annotate(snap, 0, 1100, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "START");
  annotate(snap, 0, 1100, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "END");
  auto ps = detectPhases(snap, 0);
  ASSERT_EQ(ps.size(), 5u);
  // Sorted by first event, the enclosing range first.
  EXPECT_EQ(ps[0].name, "ProfilerStep#7");
  EXPECT_EQ(ps[0].kind, PhaseKind::Iteration);
  EXPECT_EQ(ps[0].source, PhaseSource::Annotation);
  EXPECT_EQ(ps[0].iteration, 7);
  EXPECT_EQ(ps[0].first_event, 1);  // t=1020 is the first event at or after 1015
  EXPECT_EQ(ps[0].last_event, 6);   // t=1070 is the last event at or before 1075
  EXPECT_EQ(ps[0].start_us, 1015);
  EXPECT_EQ(ps[0].end_us, 1075);
  EXPECT_FALSE(ps[0].open);
  EXPECT_EQ(ps[1].kind, PhaseKind::Forward);
  EXPECT_EQ(ps[1].first_event, 2);  // both ends inclusive: t=1030 .. t=1050
  EXPECT_EQ(ps[1].last_event, 4);
  EXPECT_EQ(ps[1].iteration, 7);
  EXPECT_EQ(ps[2].kind, PhaseKind::Optimizer);
  EXPECT_EQ(ps[2].first_event, 6);
  EXPECT_EQ(ps[2].last_event, 5);  // empty
  EXPECT_EQ(ps[2].iteration, 7);
  EXPECT_EQ(ps[3].name, "ProfilerStep#8");
  EXPECT_TRUE(ps[3].open);
  EXPECT_EQ(ps[3].first_event, 8);
  EXPECT_EQ(ps[3].last_event, 10);
  EXPECT_EQ(ps[4].kind, PhaseKind::Other);
  EXPECT_EQ(ps[4].first_event, 9);
  EXPECT_EQ(ps[4].last_event, 9);
  EXPECT_EQ(ps[4].iteration, 8);
  EXPECT_EQ(phaseKindName(ps[4].kind), "other");
}

// The annotation ranges are placed on the events' times made non-decreasing (-1 before the first
// time). A trace whose times all exist and never decrease is searched in place; any other goes
// through the copy. Both must place every range where a naive scan of the monotone times does.
TEST(Phases, AnnotationRangesInPlaceAndOnTheMonotoneCopyAgreeWithANaiveScan) {
  auto st = stackAt("/home/u/model.py", 10, "forward");
  // times: 0 = all present and increasing (in place), 1 = one missing at the start and one
  // regression, 2 = equal times (still in place).
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    TraceBuilder b;
    b.time = 1000;
    for (int i = 0; i < 12; ++i) b.alloc(1024, st);  // t = 1010 .. 1120
    if (variant == 1) {
      b.ev[0].time_us = -1;
      b.ev[5].time_us = 1020;  // a regression: the monotone times stay at 1050 there
    }
    if (variant == 2) {
      for (size_t i = 0; i < b.ev.size(); ++i) b.ev[i].time_us = 1000 + 20 * int64_t(i / 2);
    }
    TSnapshot t;
    t.traces.push_back(b.ev);
    auto snap = buildSnapshot(t);
    const std::vector<std::pair<int64_t, int64_t>> ranges = {
        {1005, 1200}, {1020, 1050}, {1040, 1041}, {1060, 1060}, {1100, 1119}, {900, 1000}};
    for (size_t k = 0; k < ranges.size(); ++k) {
      const std::string name = "range " + std::to_string(k);
      annotate(snap, 0, ranges[k].first, name, "START");
      annotate(snap, 0, ranges[k].second, name, "END");
    }
    // The naive scan: the monotone times, the first event at or after START, the last at or
    // before END.
    std::vector<int64_t> mono;
    int64_t cur = -1;
    for (const auto& e : snap.trace(0)) {
      if (e.time_us >= 0) cur = std::max(cur, e.time_us);
      mono.push_back(cur);
    }
    const auto ps = detectPhases(snap, 0);
    for (size_t k = 0; k < ranges.size(); ++k) {
      const std::string name = "range " + std::to_string(k);
      int64_t first = static_cast<int64_t>(mono.size()), last = -1;
      for (size_t i = 0; i < mono.size(); ++i) {
        if (mono[i] >= ranges[k].first && first == static_cast<int64_t>(mono.size()))
          first = static_cast<int64_t>(i);
        if (mono[i] <= ranges[k].second) last = static_cast<int64_t>(i);
      }
      size_t found = 0;
      for (const auto& p : ps) {
        if (p.name != name) continue;
        ++found;
        EXPECT_EQ(p.first_event, first) << name;
        EXPECT_EQ(p.last_event, last) << name;
      }
      EXPECT_EQ(found, 1u) << name;
    }
    // Annotations of another device only: nothing for device 0.
    auto other = buildSnapshot(t);
    annotate(other, 3, 1020, "elsewhere", "START");
    annotate(other, 3, 1050, "elsewhere", "END");
    for (const auto& p : detectPhases(other, 0)) EXPECT_NE(p.name, "elsewhere");
  }
}

TEST(Phases, AnnotationsNeedTimes) {
  // No time_us: annotations cannot be placed, and a single alloc is no period either.
  TraceBuilder b;
  b.alloc(1024, stackAt("/home/u/model.py", 10, "forward"));
  TSnapshot t;
  t.traces.push_back(b.ev);
  auto snap = buildSnapshot(t);
  annotate(snap, 0, 10, "ProfilerStep#0", "START");
  annotate(snap, 0, 20, "ProfilerStep#0", "END");
  EXPECT_TRUE(detectPhases(snap, 0).empty());
}

// One training step: input copy, forward activations, loss, backward (autograd frames),
// optimizer (torch/optim frames); the first step also creates optimizer state.
struct Steps {
  std::vector<int64_t> starts;  // event index where each step begins
};
const std::vector<TFrame> kEngineBackward = {
    {"??", 0, "torch::autograd::Engine::evaluate_function"}, {"??", 0, "at::native::mm"}};
Steps buildTraining(TraceBuilder& b, int steps, bool with_time,
                    const std::vector<TFrame>& bwd = kEngineBackward) {
  auto in = stackAt("/home/u/train.py", 20, "train_step");
  auto act1 = stackAt("/home/u/model.py", 30, "forward");
  auto act2 = stackAt("/home/u/model.py", 31, "forward");
  auto loss = stackAt("/home/u/train.py", 22, "train_step");
  auto opt =
      stackAt("/usr/lib/python3/site-packages/torch/optim/adam.py", 400, "_multi_tensor_adam");
  auto param = stackAt("/home/u/model.py", 5, "__init__");
  if (with_time) b.time = 1'000'000;
  Steps s;
  b.ev.push_back(b.make("segment_alloc", kBase, kSeg, nullptr));
  for (int i = 0; i < 4; ++i) b.alloc(1 << 20, param);  // model parameters, live forever
  for (int k = 0; k < steps; ++k) {
    s.starts.push_back(static_cast<int64_t>(b.ev.size()));
    uint64_t x = b.alloc(65536, in);
    uint64_t a1 = b.alloc(131072, act1);
    uint64_t a2 = b.alloc(131072, act2);
    uint64_t a3 = b.alloc(262144, act1);  // same stack as a1, another size
    uint64_t l = b.alloc(4, loss);
    uint64_t g1 = b.alloc(131072, bwd);
    b.free(a3, 262144);
    uint64_t g2 = b.alloc(131072, bwd);
    b.free(a2, 131072);
    b.free(a1, 131072);
    if (k == 0) {
      for (int i = 0; i < 4; ++i) b.alloc(1 << 20, opt);  // exp_avg / exp_avg_sq: live forever
    }
    uint64_t o = b.alloc(1 << 20, opt);
    b.free(o, 1 << 20);
    b.free(g1, 131072);
    b.free(g2, 131072);
    b.free(l, 4);
    b.free(x, 65536);
  }
  return s;
}

TEST(Phases, DetectsIterationsOfAPeriodicStream) {
  for (bool with_time : {false, true}) {
    TraceBuilder b;
    Steps s = buildTraining(b, 5, with_time);
    TSnapshot t;
    t.traces.push_back(b.ev);
    auto snap = buildSnapshot(t);
    auto ps = detectPhases(snap, 0);
    auto its = ofKind(ps, PhaseKind::Iteration);
    ASSERT_EQ(its.size(), 5u) << "with_time=" << with_time;
    for (size_t k = 0; k < its.size(); ++k) {
      EXPECT_EQ(its[k].source, PhaseSource::Detected);
      EXPECT_EQ(its[k].iteration, static_cast<int>(k));
      EXPECT_EQ(its[k].name, "iteration " + std::to_string(k));
      EXPECT_EQ(its[k].first_event, s.starts[k]) << k;
      int64_t end =
          k + 1 < s.starts.size() ? s.starts[k + 1] - 1 : static_cast<int64_t>(b.ev.size()) - 1;
      EXPECT_EQ(its[k].last_event, end) << k;
      if (with_time) {
        EXPECT_EQ(its[k].start_us, b.ev[s.starts[k]].time_us);
      } else {
        EXPECT_EQ(its[k].start_us, -1);
      }
    }
    // Sub-phases from frames, one of each per step, inside the step.
    auto fwd = ofKind(ps, PhaseKind::Forward);
    auto bwd = ofKind(ps, PhaseKind::Backward);
    auto opt = ofKind(ps, PhaseKind::Optimizer);
    ASSERT_EQ(fwd.size(), 5u);
    ASSERT_EQ(bwd.size(), 5u);
    ASSERT_EQ(opt.size(), 5u);
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_EQ(fwd[k].first_event, its[k].first_event);
      EXPECT_EQ(fwd[k].last_event + 1, bwd[k].first_event);
      EXPECT_EQ(b.ev[bwd[k].first_event].action, "alloc");
      EXPECT_LT(bwd[k].last_event, opt[k].first_event);
      EXPECT_LE(opt[k].last_event, its[k].last_event);
      EXPECT_EQ(opt[k].iteration, static_cast<int>(k));
    }
  }
}

// Backward allocations whose stack holds only a backward function (a cut-short C++ stack of the
// autograd thread, real frame names): the one classifier (frame_class.h) calls it backward for
// the phases as for the categories. marksOf() knew autograd::Engine and autograd::generated but
// not AccumulateGrad, while the categories' stackFlags() knew AccumulateGrad but not
// autograd::generated: the two disagreed on these stacks.
TEST(Phases, BackwardSubPhaseFromEveryAutogradFrame) {
  const std::vector<std::vector<TFrame>> stacks = {
      {{"", 0, "torch::autograd::utils::clone_obey_contract(at::Tensor const&, at::Tensor const&)"},
       {"??", 0,
        "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor, "
        "std::allocator<at::Tensor> >&&)"}},
      {{"??", 0, "at::native::zeros_symint(c10::ArrayRef<c10::SymInt>)"},
       {"??", 0,
        "torch::autograd::generated::IndexBackward0::apply(std::vector<at::Tensor, "
        "std::allocator<at::Tensor> >&&)"}}};
  for (const auto& bwd_stack : stacks) {
    TraceBuilder b;
    buildTraining(b, 5, false, bwd_stack);
    TSnapshot t;
    t.traces.push_back(b.ev);
    auto snap = buildSnapshot(t);
    auto ps = detectPhases(snap, 0);
    ASSERT_EQ(ofKind(ps, PhaseKind::Iteration).size(), 5u);
    EXPECT_EQ(ofKind(ps, PhaseKind::Backward).size(), 5u) << bwd_stack[1].name;
    EXPECT_EQ(ofKind(ps, PhaseKind::Forward).size(), 5u);
  }
}

TEST(Phases, AStepCutShortByAnOomIsAPartialIteration) {
  TraceBuilder b;
  Steps s = buildTraining(b, 4, false);
  const auto last = static_cast<int64_t>(b.ev.size());
  b.alloc(65536, stackAt("/home/u/train.py", 20, "train_step"));
  b.alloc(131072, stackAt("/home/u/model.py", 30, "forward"));
  b.ev.push_back(b.make("oom", 0, 1 << 30, nullptr));
  TSnapshot t;
  t.traces.push_back(b.ev);
  auto snap = buildSnapshot(t);
  auto its = ofKind(detectPhases(snap, 0), PhaseKind::Iteration);
  ASSERT_EQ(its.size(), 5u);
  EXPECT_EQ(its[3].first_event, s.starts[3]);
  EXPECT_EQ(its[3].last_event, last - 1);
  EXPECT_EQ(its[4].name, "iteration 4 (partial)");
  EXPECT_EQ(its[4].first_event, last);
  EXPECT_EQ(its[4].last_event, static_cast<int64_t>(b.ev.size()) - 1);
}

TEST(Phases, TwoRepetitionsAreNotEnough) {
  TraceBuilder b;
  buildTraining(b, 2, false);
  TSnapshot t;
  t.traces.push_back(b.ev);
  auto snap = buildSnapshot(t);
  EXPECT_TRUE(detectPhases(snap, 0).empty());
}

TEST(Phases, AperiodicStreamGivesNothing) {
  TraceBuilder b;
  b.ev.push_back(b.make("segment_alloc", kBase, kSeg, nullptr));
  std::vector<std::vector<TFrame>> stacks;
  for (int i = 0; i < 6; ++i) stacks.push_back(stackAt("/home/u/work.py", 10 + i, "work"));
  uint64_t state = 12345;
  auto rnd = [&]() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  std::vector<std::pair<uint64_t, uint64_t>> live;
  for (int i = 0; i < 600; ++i) {
    uint64_t size = 512 * (1 + rnd() % 4);
    live.emplace_back(b.alloc(size, stacks[rnd() % stacks.size()]), size);
    if (live.size() > 8 || rnd() % 2 == 0) {
      size_t k = rnd() % live.size();
      b.free(live[k].first, live[k].second);
      live.erase(live.begin() + static_cast<ptrdiff_t>(k));
    }
  }
  TSnapshot t;
  t.traces.push_back(b.ev);
  auto snap = buildSnapshot(t);
  EXPECT_TRUE(ofKind(detectPhases(snap, 0), PhaseKind::Iteration).empty());
}

TEST(Phases, LayersOfOneForwardAreNotIterations) {
  // Twelve identical blocks of one forward pass repeat as regularly as steps would, but every
  // allocation passes through the model's forward at the line that calls the block.
  TraceBuilder b;
  b.ev.push_back(b.make("segment_alloc", kBase, kSeg, nullptr));
  auto framesAt = [](uint64_t line) {
    return std::vector<TFrame>{{"/home/u/model.py", line, "forward"},
                               {"/home/u/model.py", 80, "forward"},
                               {"/home/u/infer.py", 12, "main"}};
  };
  for (int layer = 0; layer < 12; ++layer) {
    uint64_t q = b.alloc(4096, framesAt(40));
    uint64_t k = b.alloc(4096, framesAt(41));
    uint64_t a = b.alloc(8192, framesAt(42));
    b.free(q, 4096);
    b.free(k, 4096);
    (void)a;  // activations kept for backward
  }
  TSnapshot t;
  t.traces.push_back(b.ev);
  auto snap = buildSnapshot(t);
  EXPECT_TRUE(ofKind(detectPhases(snap, 0), PhaseKind::Iteration).empty());
}

// The shapes of a real 4-GPU DataParallel job (issue 13) where one forward pass was split into
// "iterations": built directly (fixtures/model_builder.h), events only.
namespace dp {

using memforensics::testing::Frames;
using memforensics::testing::ModelBuilder;

const char* const kTorch = "/usr/local/lib/python3.10/site-packages/torch/";
const char* const kQwen =
    "/usr/local/lib/python3.10/site-packages/transformers/models/qwen3/modeling_qwen3.py";

// A DataParallel worker thread's frames, outermost part of the stack.
Frames workerThread() {
  return {{std::string(kTorch) + "nn/modules/module.py", 1762, "_call_impl"},
          {std::string(kTorch) + "nn/parallel/parallel_apply.py", 84, "_worker"},
          {"/usr/lib/python3.10/threading.py", 953, "run"},
          {"/usr/lib/python3.10/threading.py", 1016, "_bootstrap_inner"},
          {"/usr/lib/python3.10/threading.py", 973, "_bootstrap"}};
}

// One decoder layer's allocation at `line` of modeling_qwen3.py, under the model's layer loop
// (modeling_qwen3.py:405 forward), in an installed package: no User frame at all.
Frames qwenLayer(uint64_t line) {
  Frames f = {{std::string(kTorch) + "nn/modules/linear.py", 125, "forward"},
              {std::string(kTorch) + "nn/modules/module.py", 1762, "_call_impl"},
              {kQwen, line, "forward"},
              {std::string(kTorch) + "nn/modules/module.py", 1762, "_call_impl"},
              {kQwen, 405, "forward"}};
  for (auto& w : workerThread()) f.push_back(w);
  return f;
}

// cuda:0's shape: 27 decoder layers of one forward pass, no backward. Each layer makes q, k, v,
// the attention output and the MLP's hidden states, frees its intermediates and the previous
// layer's hidden state (the next layer's input), so live bytes stay flat.
format::Snapshot qwenForward() {
  ModelBuilder b;
  b.device(0);
  uint64_t addr = kBase, prev_hidden = 0;
  auto alloc = [&](uint64_t size, const Frames& f) {
    const uint64_t a = addr;
    addr += size;
    b.alloc(a, size, {.frames = f});
    return a;
  };
  alloc(1 << 20, {{kQwen, 390, "forward"}});  // the embedding
  for (int layer = 0; layer < 27; ++layer) {
    const uint64_t q = alloc(4 << 20, qwenLayer(260));
    const uint64_t k = alloc(1 << 20, qwenLayer(261));
    const uint64_t v = alloc(1 << 20, qwenLayer(262));
    const uint64_t o = alloc(4 << 20, qwenLayer(280));
    const uint64_t up = alloc(12 << 20, qwenLayer(301));
    const uint64_t hidden = alloc(4 << 20, qwenLayer(303));
    for (auto [x, size] :
         {std::pair{q, 4u << 20}, {k, 1u << 20}, {v, 1u << 20}, {o, 4u << 20}, {up, 12u << 20}})
      b.free(x, size);
    if (prev_hidden != 0) b.free(prev_hidden, 4 << 20);
    prev_hidden = hidden;
  }
  return b.build();
}

// cuda:2's shape: 3 GNN layers of one forward pass with grad, on a worker thread whose stacks show
// only the native unwind and Python's thread plumbing (no forward frame): each layer keeps its
// message MLP's hidden tensors for backward and frees one temporary; then the trace ends (the
// step died on another device).
format::Snapshot gnnForward() {
  ModelBuilder b;
  b.device(2);
  Frames native = {{"??", 0, "at::native::addmm_out_cuda_impl"},
                   {"??", 0, "at::native::structured_addmm_out_cuda::impl"},
                   {"pthread_create.c", 477, "start_thread"}};
  for (auto& w : workerThread()) native.push_back(w);
  Frames silu = native;
  silu[0].name = "at::native::silu_kernel";
  Frames cat = native;
  cat[0].name = "at::native::cat_out_cuda";
  Frames replica = {{std::string(kTorch) + "nn/parallel/comm.py", 67, "broadcast_coalesced"},
                    {std::string(kTorch) + "nn/parallel/replicate.py", 110, "replicate"}};
  uint64_t addr = kBase;
  auto alloc = [&](uint64_t size, const Frames& f) {
    const uint64_t a = addr;
    addr += size;
    b.alloc(a, size, {.frames = f});
    return a;
  };
  for (int i = 0; i < 3; ++i) alloc(16 << 20, replica);  // the GNN's parameters, replicated
  for (int layer = 0; layer < 3; ++layer) {
    const uint64_t edges = alloc(8 << 20, cat);
    alloc(64 << 20, native);  // the message MLP's first Linear
    alloc(64 << 20, silu);
    alloc(64 << 20, native);
    b.free(edges, 8 << 20);
  }
  return b.build();
}

}  // namespace dp

// 27 decoder layers under one modeling_qwen3.py:405 forward (a package's model: no User frame),
// no backward: layers of one forward pass, not 27 steps (the guard knew only User frames, and
// split this into 27 iterations).
TEST(Phases, DecoderLayersOfOneForwardInAPackageAreNotIterations) {
  auto snap = dp::qwenForward();
  EXPECT_TRUE(ofKind(detectPhases(snap, 0), PhaseKind::Iteration).empty());
}

// 3 GNN layers of one forward pass with grad, stacks without any forward frame: the layers keep
// their activations (live bytes only grow) and run no backward: not 3 steps.
TEST(Phases, GnnLayersKeepingActivationsAreNotIterations) {
  auto snap = dp::gnnForward();
  EXPECT_TRUE(ofKind(detectPhases(snap, 2), PhaseKind::Iteration).empty());
}

// The guards cost a real inference loop nothing: steps without backward that free what they
// make, whose forward is one of several lines, are still split.
TEST(Phases, InferenceLoopIsStillSplit) {
  TraceBuilder b;
  b.ev.push_back(b.make("segment_alloc", kBase, kSeg, nullptr));
  const auto in = stackAt("/home/u/infer.py", 20, "main");
  const auto out = stackAt("/home/u/infer.py", 22, "main");
  auto layer = [](uint64_t line) {
    return std::vector<TFrame>{{"/home/u/model.py", line, "forward"},
                               {"/home/u/model.py", 80, "forward"},
                               {"/home/u/infer.py", 21, "main"}};
  };
  for (int step = 0; step < 5; ++step) {
    const uint64_t x = b.alloc(65536, in);
    const uint64_t h1 = b.alloc(131072, layer(40));
    const uint64_t h2 = b.alloc(131072, layer(41));
    b.free(h1, 131072);
    const uint64_t y = b.alloc(4096, out);
    b.free(h2, 131072);
    const uint64_t z = b.alloc(4096, out);
    b.free(x, 65536);
    b.free(y, 4096);
    b.free(z, 4096);
  }
  TSnapshot t;
  t.traces.push_back(b.ev);
  auto snap = buildSnapshot(t);
  EXPECT_EQ(ofKind(detectPhases(snap, 0), PhaseKind::Iteration).size(), 5u);
}

// Every real snapshot: what is found is printed (for the record), and the known file checked.
TEST(Phases, RealSnapshots) {
  auto paths = memforensics::testing::realSnapshotPaths();
  if (paths.empty()) GTEST_SKIP() << "no real snapshots at " << MEMF_REAL_SNAPSHOTS;
  for (const auto& p : paths) {
    auto snap = format::loadSnapshotFile(p.string());
    ASSERT_TRUE(snap.ok()) << p;
    for (int64_t d : snap->devices()) {
      auto ps = detectPhases(*snap, d);
      std::cout << "[phases] " << p.filename().string() << " device " << d << ": "
                << snap->annotations.size() << " annotations, "
                << snap->trace(static_cast<size_t>(d)).size() << " events, " << ps.size()
                << " phases\n";
      for (const auto& ph : ps) {
        std::cout << "[phases]   " << phaseKindName(ph.kind) << " "
                  << (ph.source == PhaseSource::Annotation ? "annotation" : "detected") << " \""
                  << ph.name << "\" events " << ph.first_event << ".." << ph.last_event
                  << " it=" << ph.iteration << (ph.open ? " open" : "") << "\n";
        EXPECT_GE(ph.first_event, 0);
        EXPECT_LT(ph.last_event, static_cast<int64_t>(snap->trace(static_cast<size_t>(d)).size()));
      }
      if (p.filename() == "zidongliu__decomfl__memory.pickle") {
        size_t annotated = 0, optimizer = 0;
        for (const auto& ph : ps) {
          annotated += ph.source == PhaseSource::Annotation;
          optimizer += ph.source == PhaseSource::Annotation && ph.kind == PhaseKind::Optimizer;
        }
        EXPECT_EQ(snap->annotations.size(), 8u);
        EXPECT_EQ(annotated, 4u);  // 8 markers = 4 START/END pairs
        EXPECT_EQ(optimizer, 2u);  // Optimizer.zero_grad#SGD.zero_grad twice
      }
    }
  }
}

// Random overlapping steps and ranges: each range's step is the innermost enclosing one (the
// enclosing step that starts last), as a scan of every step finds it.
TEST(Phases, EnclosingStepEqualsANaiveScan) {
  TraceBuilder b;
  b.time = 0;
  auto st = stackAt("/home/u/model.py", 10, "forward");
  for (int i = 0; i < 400; ++i) b.alloc(1024, st);  // t = 10 .. 4000
  TSnapshot t;
  t.traces.push_back(b.ev);
  auto snap = buildSnapshot(t);
  uint64_t seed = 99;
  auto next = [&](int64_t mod) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int64_t>((seed >> 33) % static_cast<uint64_t>(mod));
  };
  for (int k = 0; k < 300; ++k) {
    const bool step = k % 3 == 0;
    const int64_t a = 2 * k + 1;  // distinct START times
    const int64_t e = a + 1 + next(step ? 2000 : 400);
    const std::string name = step ? "ProfilerStep#" + std::to_string(k) : "r" + std::to_string(k);
    annotate(snap, 0, a, name, "START");
    annotate(snap, 0, e, name, "END");
  }
  std::stable_sort(snap.annotations.begin(), snap.annotations.end(),
                   [](const auto& x, const auto& y) { return x.time_us < y.time_us; });
  auto ps = detectPhases(snap, 0);
  auto steps = ofKind(ps, PhaseKind::Iteration);
  ASSERT_EQ(steps.size(), 100u);
  size_t inside = 0;
  for (const auto& p : ps) {
    if (p.kind == PhaseKind::Iteration) continue;
    int want = -1;
    int64_t best_start = -1;
    for (const auto& s : steps) {
      if (s.start_us <= p.start_us && p.end_us <= s.end_us && s.start_us > best_start) {
        best_start = s.start_us;
        want = s.iteration;
      }
    }
    inside += want >= 0;
    EXPECT_EQ(p.iteration, want) << p.name;
  }
  EXPECT_GT(inside, 50u);  // the test covers ranges inside steps, not only outside them
}

}  // namespace
}  // namespace memforensics::analysis
