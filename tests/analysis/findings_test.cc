// findings_test.cc: every detector on a fabricated history where it must fire and one where it
// must not; call-graph attribution with exact numbers.
#include "analysis/findings/findings.h"

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "analysis/frames/callgraph.h"
#include "analysis/session/session.h"
#include "fixtures/snapshot_builder.h"
#include "format/load/load.h"
#include "format/load/snapshot_trace.h"
#include "format/trace/trace_writer.h"

namespace memforensics {
namespace {

using namespace analysis;
using testing::TEvent;
using testing::TFrame;

// GitHub's anchor of a Markdown heading: lower case, punctuation but '-' and '_' dropped, spaces
// as '-'.
std::string headingAnchor(const std::string& heading) {
  std::string out;
  for (char ch : heading) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || ch == '-' || ch == '_')
      out.push_back(static_cast<char>(std::tolower(c)));
    else if (ch == ' ')
      out.push_back('-');
  }
  return out;
}

// The catalogue of finding kinds and docs/findings.md agree: every kind's section exists, and its
// heading names exactly the severities from the kind's lowest to its highest; every detector file
// named exists; ids are unique and in enum order.
TEST(FindingKinds, TheCatalogueMatchesTheDocsAndTheSources) {
  const std::string root = MEMF_SOURCE_DIR;
  std::ifstream in(root + "/docs/findings.md");
  ASSERT_TRUE(in) << "docs/findings.md not found under " << root;
  std::map<std::string, std::string> headings;  // anchor -> heading text
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("### ", 0) == 0) headings[headingAnchor(line.substr(4))] = line.substr(4);
  }
  std::set<std::string_view> ids;
  ASSERT_EQ(findingKinds().size(), static_cast<size_t>(FindingKind::InferenceWithGrad) + 1);
  for (size_t k = 0; k < findingKinds().size(); ++k) {
    const FindingKindInfo& info = findingKinds()[k];
    EXPECT_EQ(&findingKindInfo(static_cast<FindingKind>(k)), &info);
    EXPECT_TRUE(ids.insert(info.id).second) << info.id;
    EXPECT_LE(info.lowest, info.highest) << info.id;
    EXPECT_TRUE(
        std::filesystem::exists(root + "/src/analysis/findings/" + std::string(info.detector)))
        << info.detector;
    auto h = headings.find(std::string(info.docs_anchor));
    ASSERT_NE(h, headings.end()) << info.id << ": no heading with anchor " << info.docs_anchor;
    const std::string& text = h->second;
    const size_t open = text.find('(');
    ASSERT_NE(open, std::string::npos) << text;
    const std::string said = text.substr(open);
    for (auto sev : {FindingSeverity::Info, FindingSeverity::Warning, FindingSeverity::High}) {
      const bool in_range = sev >= info.lowest && sev <= info.highest;
      const bool named = said.find(std::string(findingSeverityName(sev))) != std::string::npos;
      EXPECT_EQ(named, in_range) << info.id << ": '" << text << "' and "
                                 << findingSeverityName(sev);
    }
  }
}

constexpr uint64_t MiB = 1ull << 20;

// A one-segment history built event by event, with a final state that matches it (live blocks
// and pending frees in place, free gaps as inactive blocks) and ProfilerStep annotations.
class Sim {
 public:
  explicit Sim(uint64_t capacity) : capacity_(capacity) {
    events_.push_back({"segment_alloc", kBase, capacity, 0, time_++});
  }
  // First fit: the lowest gap between live blocks that holds the request.
  uint64_t alloc(uint64_t size, std::vector<TFrame> frames) {
    const uint64_t rounded = (size + 511) / 512 * 512;
    uint64_t addr = kBase;
    for (const auto& [a, l] : live_) {
      if (a - addr >= rounded) break;
      addr = a + (l.size + 511) / 512 * 512;
    }
    EXPECT_LE(addr + rounded, kBase + capacity_) << "test segment too small";
    events_.push_back({"alloc", addr, size, 0, time_++, frames, true});
    live_[addr] = {size, std::move(frames), false};
    return addr;
  }
  void free(uint64_t addr) {
    freeRequest(addr);
    events_.push_back({"free_completed", addr, live_[addr].size, 0, time_++});
    live_.erase(addr);
  }
  void freeRequest(uint64_t addr) {
    events_.push_back({"free_requested", addr, live_[addr].size, 0, time_++});
    live_[addr].pending = true;
  }
  void oom(uint64_t size, uint64_t device_free) {
    events_.push_back({"oom", device_free, size, 0, time_++});
  }
  void step(int k, const std::function<void()>& body) {
    steps_.push_back({k, time_++, 0});
    body();
    steps_.back().end = time_++;
  }
  // An `Optimizer.step#Adam.step` range around `body` (as PyTorch's optimizer hooks annotate).
  void optimizer(const std::function<void()>& body) {
    const int64_t start = time_++;
    body();
    optimizer_.emplace_back(start, time_++);
  }

  // `skip`: the first events are left out of the trace (a late start: what they made is alive
  // in the final state, with no record of its allocation).
  format::Snapshot build(size_t skip = 0) {
    testing::TSegment seg;
    seg.address = kBase;
    uint64_t cursor = kBase;
    for (const auto& [addr, l] : live_) {
      if (addr > cursor) seg.blocks.push_back({addr - cursor, 0, "inactive", {}});
      uint64_t size = (l.size + 511) / 512 * 512;
      seg.blocks.push_back(
          {size, l.size, l.pending ? "active_pending_free" : "active_allocated", l.frames});
      cursor = addr + size;
    }
    if (cursor < kBase + capacity_)
      seg.blocks.push_back({kBase + capacity_ - cursor, 0, "inactive", {}});
    const std::vector<TEvent> kept(
        events_.begin() + static_cast<std::ptrdiff_t>(std::min(skip, events_.size())),
        events_.end());
    format::Snapshot s = testing::buildSnapshot(testing::TSnapshot{{seg}, {kept}});
    for (const auto& st : steps_) {
      std::string name = "ProfilerStep#" + std::to_string(st.k);
      s.annotations.push_back({0, st.start, s.strings.intern(name), s.strings.intern("START")});
      s.annotations.push_back({0, st.end, s.strings.intern(name), s.strings.intern("END")});
    }
    for (const auto& [start, end] : optimizer_) {
      const auto name = s.strings.intern("Optimizer.step#Adam.step");
      s.annotations.push_back({0, start, name, s.strings.intern("START")});
      s.annotations.push_back({0, end, name, s.strings.intern("END")});
    }
    std::stable_sort(s.annotations.begin(), s.annotations.end(),
                     [](const auto& a, const auto& b) { return a.time_us < b.time_us; });
    s.traits.has_annotations_key = true;
    return s;
  }

 private:
  static constexpr uint64_t kBase = 0x7f0000000000;
  struct Live {
    uint64_t size;
    std::vector<TFrame> frames;
    bool pending;
  };
  struct Step {
    int k;
    int64_t start, end;
  };
  uint64_t capacity_;
  int64_t time_ = 1000;
  std::vector<TEvent> events_;
  std::map<uint64_t, Live> live_;
  std::vector<Step> steps_;
  std::vector<std::pair<int64_t, int64_t>> optimizer_;
};

const std::vector<TFrame> kParams = {{"/lib/torch/nn/modules/module.py", 1160, "_apply"},
                                     {"model.py", 12, "__init__"},
                                     {"train.py", 20, "main"}};
const std::vector<TFrame> kAct = {{"model.py", 30, "forward"}, {"train.py", 41, "train_step"}};
const std::vector<TFrame> kLeak = {{"train.py", 42, "train_step"}};
const std::vector<TFrame> kAdam = {{"/lib/torch/optim/adam.py", 98, "_init_group"},
                                   {"train.py", 44, "train_step"}};
const std::vector<TFrame> kGrad = {{"/lib/torch/autograd/__init__.py", 266, "backward"},
                                   {"train.py", 43, "train_step"}};

const Finding* find(const std::vector<Finding>& fs, FindingKind k) {
  for (const auto& f : fs) {
    if (f.kind == k) return &f;
  }
  return nullptr;
}

// A training loop: parameters, then per step activations (freed), gradients and Adam state
// (made once), plus `leak` bytes per step kept forever and `state_copies` optimizer tensors per
// parameter tensor.
format::Snapshot trainingLoop(uint64_t leak, int state_copies, bool keep_activations = false,
                              size_t skip_events = 0) {
  Sim s(1024 * MiB);
  std::vector<uint64_t> params;
  for (int i = 0; i < 4; ++i) params.push_back(s.alloc(8 * MiB, kParams));
  for (int k = 0; k < 6; ++k) {
    s.step(k, [&] {
      std::vector<uint64_t> acts;
      for (int l = 0; l < 4; ++l) acts.push_back(s.alloc(4 * MiB, kAct));
      if (leak) s.alloc(leak, kLeak);
      if (k == 0) {
        for (int i = 0; i < 4; ++i) s.alloc(8 * MiB, kGrad);
      }
      if (!keep_activations) {
        for (uint64_t a : acts) s.free(a);
      }
      if (k == 0) {
        for (int i = 0; i < 4 * state_copies; ++i) s.alloc(8 * MiB, kAdam);
      }
    });
  }
  return s.build(skip_events);
}

// `snap` written as a native trace cut just before its final state (a capture killed before its
// writer finished, or a file cut short), read back: its final state is rebuilt from the events.
format::Snapshot nativeCutBeforeFinalState(const format::Snapshot& snap) {
  format::trace::VectorSink sink;
  EXPECT_TRUE(format::writeSnapshotTrace(snap, sink).ok());
  for (size_t n = sink.data.size(); n > 0; --n) {
    auto cut = format::loadSnapshotBytes(std::span<const uint8_t>(sink.data.data(), n));
    if (cut.ok() && cut->final_state_rebuilt && cut->events.size() == snap.events.size())
      return std::move(*cut);
  }
  ADD_FAILURE() << "no cut keeps every event and loses the final state";
  return {};
}

TEST(Findings, CleanLoopHasNoHighFinding) {
  auto snap = trainingLoop(0, 2);
  auto fs = findFindings(snap, 0);
  for (const auto& f : fs) EXPECT_NE(f.severity, FindingSeverity::High) << f.title;
  EXPECT_EQ(find(fs, FindingKind::Leak), nullptr);
  EXPECT_EQ(find(fs, FindingKind::ActivationRetention), nullptr);
  EXPECT_EQ(find(fs, FindingKind::OptimizerStateBloat), nullptr) << "Adam's 2x is expected";
}

TEST(Findings, LeakIsFoundWithItsLine) {
  auto snap = trainingLoop(2 * MiB, 2);
  auto fs = findFindings(snap, 0);
  const Finding* f = find(fs, FindingKind::Leak);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->bytes, 8 * MiB) << "4 iterations after the first step, 2 MiB each";
  ASSERT_FALSE(f->where.empty());
  EXPECT_EQ(f->where[0].display(), "train.py:42 train_step");
  EXPECT_NE(f->basis.find("external_annotations"), std::string::npos);
  EXPECT_EQ(find(fs, FindingKind::ActivationRetention), nullptr);
}

// Activations kept across steps (`history.append(out)` without detach, `total_loss += loss`) grow
// without bound: a leak, whatever the category, with the line that called the model. Before issue
// 13 this growth was reported as activation retention.
TEST(Findings, ActivationsKeptEveryStepAreALeak) {
  auto snap = trainingLoop(0, 2, /*keep_activations=*/true);
  auto fs = findFindings(snap, 0);
  const Finding* f = find(fs, FindingKind::Leak);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, FindingSeverity::High);
  EXPECT_EQ(f->bytes, 4 * 16 * MiB) << "4 iterations after the first step, 16 MiB each";
  ASSERT_FALSE(f->where.empty());
  EXPECT_EQ(f->where[0].display(), "train.py:41 train_step") << "the model's call site";
  EXPECT_NE(f->title.find("forward"), std::string::npos) << f->title;
  EXPECT_EQ(find(fs, FindingKind::ActivationRetention), nullptr);
}

// A training step's output kept by the loop: 4 x 8 MiB parameters; per step 4 x 4 MiB activations
// and a 32 MiB output (logits), a backward of 4 x 8 MiB gradients (freed at the step's end, as
// zero_grad(set_to_none=True) does), Adam's 8 x 8 MiB state at the first step and one 8 MiB
// temporary per step. `keep` says when each step's logits are freed: at the end of their own step,
// at the end of the next one (`logits = train_step(batch)` in the loop: the old value goes when
// the new one is returned), in the next forward once its logits are made (a hook's dict entry
// overwritten), or never.
// `annotated`: the optimizer step is annotated, the steps are numbered from 5 (a recording that
// began late) and the gradients carry no stack (the autograd thread's often do not): the
// backward's end is then known only from the optimizer's annotation.
enum class Keep { OwnStep, NextStep, NextForward, Never };
format::Snapshot keptOutputLoop(Keep keep, bool annotated = false) {
  Sim s(1024 * MiB);
  for (int i = 0; i < 4; ++i) s.alloc(8 * MiB, kParams);
  uint64_t prev = 0;
  for (int k = 0; k < 6; ++k) {
    s.step(annotated ? k + 5 : k, [&] {
      std::vector<uint64_t> acts, grads;
      for (int l = 0; l < 4; ++l) acts.push_back(s.alloc(4 * MiB, kAct));
      const uint64_t logits = s.alloc(32 * MiB, kAct);
      if (keep == Keep::NextForward && prev != 0) s.free(prev);
      for (int l = 0; l < 4; ++l) {
        grads.push_back(s.alloc(8 * MiB, annotated ? std::vector<TFrame>{} : kGrad));
        s.free(acts[static_cast<size_t>(3 - l)]);
      }
      auto step = [&] {
        if (k == 0) {
          for (int i = 0; i < 8; ++i) s.alloc(8 * MiB, kAdam);
        }
        s.free(s.alloc(8 * MiB, kAdam));
      };
      if (annotated) {
        s.optimizer(step);
      } else {
        step();
      }
      for (uint64_t g : grads) s.free(g);
      if (keep == Keep::OwnStep) s.free(logits);
      if (keep == Keep::NextStep && prev != 0) s.free(prev);
      prev = logits;
    });
  }
  return s.build();
}

// One step's logits kept through the next step: the peak (step 1's optimizer, 200 MiB: 32 of
// parameters, 64 of Adam state, 32 of gradients, 8 temporary, both steps' logits) drops to the
// backward's 164 MiB (its last gradient made while one activation and its own logits are alive)
// when each step's logits are freed where its backward ends: exactly 36 MiB, checked by replay.
// Info: below the warning floor of 256 MiB.
TEST(Findings, ActivationRetentionIsTheDropOfThePeakWhenFreedAfterBackward) {
  auto fs = findFindings(keptOutputLoop(Keep::NextStep), 0);
  const Finding* f = find(fs, FindingKind::ActivationRetention);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->bytes, 36 * MiB);
  EXPECT_EQ(f->severity, FindingSeverity::Info) << "36 MiB: under the 256 MiB floor";
  ASSERT_FALSE(f->where.empty());
  EXPECT_EQ(f->where[0].display(), "train.py:41 train_step") << "the model's call site";
  EXPECT_NE(f->basis.find("checked by replay: peak reserved"), std::string::npos) << f->basis;
  EXPECT_EQ(find(fs, FindingKind::Leak), nullptr) << "bounded: live bytes do not grow";
  // The same from the optimizer's annotation alone, in steps numbered from 5: the same 36 MiB.
  auto late = findFindings(keptOutputLoop(Keep::NextStep, /*annotated=*/true), 0);
  const Finding* g = find(late, FindingKind::ActivationRetention);
  ASSERT_NE(g, nullptr) << "the optimizer phase of ProfilerStep#5 is the first step's";
  EXPECT_EQ(g->bytes, 36 * MiB);
  // Freed at the end of their own step: alive through its optimizer step, but freeing them after
  // the backward lowers the optimizer's 168 MiB only to the backward's own 164 MiB: 4 MiB, under
  // the 16 MiB minimum. The peak step's own output is not retention.
  auto own = findFindings(keptOutputLoop(Keep::OwnStep), 0);
  EXPECT_EQ(find(own, FindingKind::ActivationRetention), nullptr);
  EXPECT_EQ(find(own, FindingKind::Leak), nullptr);
  // Released in the next forward: the two outputs meet at 176 MiB there, but without the old one
  // the peak is the backward's 164 MiB: 12 MiB, under the minimum.
  auto next_fwd = findFindings(keptOutputLoop(Keep::NextForward), 0);
  EXPECT_EQ(find(next_fwd, FindingKind::ActivationRetention), nullptr);
  // Never released: a leak, not retention.
  auto never = findFindings(keptOutputLoop(Keep::Never), 0);
  EXPECT_EQ(find(never, FindingKind::ActivationRetention), nullptr);
  EXPECT_NE(find(never, FindingKind::Leak), nullptr);
  // A clean loop: none.
  EXPECT_EQ(find(findFindings(trainingLoop(0, 2), 0), FindingKind::ActivationRetention), nullptr);
}

// A training step of `blocks` blocks called from model.py:92 forward, each saving 3 x 32 MiB
// (its hidden-state size) and one 64 MiB tensor for backward, freed by backward in reverse order;
// parameters `param_mib` (a multiple of 8).
// `backward`: each step's backward allocates a gradient before it frees the activations (else the
// step is a forward with autograd on that never runs a backward).
// `oom`: each step's forward ends in an OOM whose unwind frees the activations.
format::Snapshot blockLoop(int blocks, uint64_t param_mib, bool backward = true, bool oom = false) {
  Sim s(8192 * MiB);  // Sim never reuses an address
  for (uint64_t i = 0; i < param_mib / 8; ++i) s.alloc(8 * MiB, kParams);
  auto at = [](uint64_t line) {
    return std::vector<TFrame>{{"model.py", line, "forward"},
                               {"/lib/torch/nn/modules/module.py", 1762, "_call_impl"},
                               {"model.py", 92, "forward"},
                               {"train.py", 41, "train_step"}};
  };
  for (int k = 0; k < 3; ++k) {
    s.step(k, [&] {
      std::vector<uint64_t> saved;
      for (int b = 0; b < blocks; ++b) {
        saved.push_back(s.alloc(32 * MiB, at(40)));
        saved.push_back(s.alloc(64 * MiB, at(41)));
        saved.push_back(s.alloc(32 * MiB, at(42)));
        saved.push_back(s.alloc(32 * MiB, at(43)));
      }
      // The loss and its small temporaries: the last block's activations live long enough to be
      // activations (a tenth of the step), not temporaries.
      for (int i = 0; i < 24; ++i) s.free(s.alloc(4096, kLeak));
      if (oom) s.oom(4096 * MiB, 1 * MiB);
      if (backward) s.free(s.alloc(4096, kGrad));
      for (auto it = saved.rbegin(); it != saved.rend(); ++it) s.free(*it);
    });
  }
  return s.build();
}

// Activations held for backward dominate the peak: checkpointing the 8 blocks keeps 8 inputs
// (32 MiB each) and recomputes one block (160 MiB) at a time: 1280 - 256 - 160 = 864 MiB less.
TEST(Findings, ActivationCheckpointingEstimate) {
  auto fs = findFindings(blockLoop(8, 64), 0);
  const Finding* f = find(fs, FindingKind::ActivationCheckpointing);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, FindingSeverity::Warning);
  EXPECT_EQ(f->bytes, 864 * MiB);
  ASSERT_EQ(f->where.size(), 1u);
  EXPECT_EQ(f->where[0].display(), "model.py:92 forward");
  EXPECT_NE(f->title.find("8 modules"), std::string::npos) << f->title;
  EXPECT_NE(f->basis.find("estimate"), std::string::npos);
  // The evidence adds up to the title's figure: the site gives back 1024 MiB, less one block
  // recomputed (160 MiB).
  ASSERT_GE(f->evidence.size(), 2u);
  const Evidence& site = f->evidence[f->evidence.size() - 2];
  const Evidence& again = f->evidence.back();
  EXPECT_EQ(site.bytes, 1024 * MiB) << site.text;
  EXPECT_EQ(again.bytes, 864 * MiB) << again.text;
  EXPECT_NE(again.text.find("one call at a time"), std::string::npos) << again.text;
  EXPECT_NE(again.text.find("160.00 MiB"), std::string::npos) << again.text;
  // Parameters dominate (activations 1280 of 3328 MiB: 38%, below kCheckpointMinShare): none.
  EXPECT_EQ(find(findFindings(blockLoop(8, 2048), 0), FindingKind::ActivationCheckpointing),
            nullptr);
  // One block: nothing repeats, nothing to checkpoint one call at a time.
  EXPECT_EQ(find(findFindings(blockLoop(1, 8), 0), FindingKind::ActivationCheckpointing), nullptr);
  EXPECT_EQ(find(findFindings(trainingLoop(0, 2), 0), FindingKind::ActivationCheckpointing),
            nullptr);
  EXPECT_EQ(find(fs, FindingKind::InferenceWithGrad), nullptr) << "a backward frees them";
}

// What the training loop (the caller, outside every forward) allocates between the layers of
// layerStack: nothing; each layer's own 8 MiB input, kept until backward (micro-batches); or one
// 512 B temporary after the first layer, freed at once (a prefetch thread's).
enum class Between { Nothing, CallerInput, CallerTemporary };

// 160 MiB of parameters, then 3 steps of 24 layers that each keep a 32 MiB output (model.py:60,
// `for layer in self.layers: x = layer(x)`), a backward, and everything freed in reverse order.
format::Snapshot layerStack(Between between) {
  Sim s(4096 * MiB);
  for (int i = 0; i < 20; ++i) s.alloc(8 * MiB, kParams);
  const std::vector<TFrame> layer = {{"model.py", 30, "forward"},
                                     {"/lib/torch/nn/modules/module.py", 1762, "_call_impl"},
                                     {"model.py", 60, "forward"},
                                     {"train.py", 41, "train_step"}};
  const std::vector<TFrame> input = {{"train.py", 40, "train_step"}};
  const std::vector<TFrame> prefetch = {{"data.py", 12, "_prefetch"}};
  for (int k = 0; k < 3; ++k) {
    s.step(k, [&] {
      std::vector<uint64_t> kept;
      for (int l = 0; l < 24; ++l) {
        if (between == Between::CallerInput) kept.push_back(s.alloc(8 * MiB, input));
        kept.push_back(s.alloc(32 * MiB, layer));
        if (between == Between::CallerTemporary && l == 0) s.free(s.alloc(512, prefetch));
      }
      for (int i = 0; i < 24; ++i) s.free(s.alloc(4096, kLeak));
      s.free(s.alloc(4096, kGrad));
      for (auto it = kept.rbegin(); it != kept.rend(); ++it) s.free(*it);
    });
  }
  return s.build();
}

// A stack of 24 layers that each keep only their 32 MiB output (the next layer's input), with a
// backward (issue 28 item 3: per-layer checkpointing keeps every input, which is all they hold, so
// this got no advice). In segments of k layers: ceil(24 / k) inputs kept plus one segment
// recomputed, least at k = 4 (6 + 4 outputs of 32 MiB): 768 - 192 - 128 = 448 MiB less, above the
// 256 MiB floor of a 928 MiB peak.
TEST(Findings, ALayerStackIsCheckpointedInSegments) {
  auto fs = findFindings(layerStack(Between::Nothing), 0);
  const Finding* f = find(fs, FindingKind::ActivationCheckpointing);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->bytes, 448 * MiB);
  ASSERT_EQ(f->where.size(), 1u);
  EXPECT_EQ(f->where[0].display(), "model.py:60 forward");
  EXPECT_NE(f->title.find("24 modules called at model.py:60 forward in 6 segments of 4"),
            std::string::npos)
      << f->title;
  EXPECT_NE(f->fix.find("checkpoint_sequential(modules, 6"), std::string::npos) << f->fix;
  EXPECT_EQ(find(fs, FindingKind::InferenceWithGrad), nullptr);
}

// The same 24 calls, each fed by the loop (micro-batches: the caller makes each call's 8 MiB input
// outside every forward): the calls are no chain, each keeps only the input its caller made and
// keeps anyway, so each is checkpointed on its own: 768 MiB held less one call recomputed (32 MiB)
// = 736 MiB, not the chain's segments (before, `checkpoint_sequential` over independent calls).
TEST(Findings, CallsFedByTheirCallerAreCheckpointedOneByOne) {
  auto fs = findFindings(layerStack(Between::CallerInput), 0);
  const Finding* f = find(fs, FindingKind::ActivationCheckpointing);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->bytes, 736 * MiB);
  EXPECT_NE(f->title.find("24 modules called at model.py:60 forward would lower"),
            std::string::npos)
      << f->title;
  EXPECT_EQ(f->fix.find("checkpoint_sequential"), std::string::npos) << f->fix;
  EXPECT_NE(f->basis.find("made by its caller"), std::string::npos) << f->basis;
}

// A chain stays a chain when the caller's allocations between its calls are gone by the peak (a
// loop's or another thread's temporaries): the layer stack keeps its segments of 4, 448 MiB.
TEST(Findings, ACallersTemporaryBetweenCallsDoesNotBreakAChain) {
  auto fs = findFindings(layerStack(Between::CallerTemporary), 0);
  const Finding* f = find(fs, FindingKind::ActivationCheckpointing);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->bytes, 448 * MiB);
  EXPECT_NE(f->fix.find("checkpoint_sequential(modules, 6"), std::string::npos) << f->fix;
}

// The same blocks with no backward (issue 28 item 3: a forward run with autograd on was told to
// checkpoint 32 modules where no_grad saves everything). Under no_grad each activation lives
// until the next allocation: at most two of them at once (64 + 32 MiB) beside the 64 MiB of
// parameters, so the peak drops from 1344 MiB + 4 KiB (the loss's temporary) to 160 MiB.
TEST(Findings, AForwardWithoutBackwardIsToldNoGradNotCheckpointing) {
  auto fs = findFindings(blockLoop(8, 64, /*backward=*/false), 0);
  EXPECT_EQ(find(fs, FindingKind::ActivationCheckpointing), nullptr);
  const Finding* f = find(fs, FindingKind::InferenceWithGrad);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, FindingSeverity::Warning);
  EXPECT_EQ(f->bytes, 1184 * MiB + 4096);
  ASSERT_FALSE(f->where.empty());
  EXPECT_EQ(f->where[0].display(), "train.py:41 train_step") << "the model's call site";
  EXPECT_NE(f->title.find("1.25 GiB"), std::string::npos) << f->title;
  EXPECT_NE(f->basis.find("estimate"), std::string::npos);
  // Freed by an OOM's unwind, not by the end of a forward-only step: nothing is said.
  EXPECT_EQ(
      find(findFindings(blockLoop(8, 64, false, /*oom=*/true), 0), FindingKind::InferenceWithGrad),
      nullptr);
  // One block (160 MiB of activations) does not reach the 256 MiB floor.
  EXPECT_EQ(find(findFindings(blockLoop(1, 8, false), 0), FindingKind::InferenceWithGrad), nullptr);
  EXPECT_EQ(find(findFindings(trainingLoop(0, 2), 0), FindingKind::InferenceWithGrad), nullptr);
}

// Cache bloat fires on a transient's cache the rest of the run never uses again, with the bytes
// a replay of empty_cache() gives back; never on a working set cached as the run ends, never on
// reserved bytes a reader synthesized. (Before issue 28 it fired on the end state alone.)
TEST(Findings, CacheBloatIsATransientsCacheTheRestOfTheRunNeverUses) {
  auto run = [](bool transient_every_step) {
    Sim s(2048 * MiB);
    s.alloc(100 * MiB, kParams);
    const std::vector<TFrame> val = {{"train.py", 61, "validate"}, {"train.py", 80, "main"}};
    if (!transient_every_step) s.free(s.alloc(1500 * MiB, val));
    for (int k = 0; k < 30; ++k) {
      s.step(k, [&] {
        if (transient_every_step) s.free(s.alloc(1500 * MiB, val));
        for (int i = 0; i < 3; ++i) s.free(s.alloc(20 * MiB, kAct));
      });
    }
    return s.build();
  };
  auto fs = findFindings(run(false), 0);
  const Finding* f = find(fs, FindingKind::CacheBloat);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, FindingSeverity::Warning);
  // Checked by replay: the allocator gives the transient its own 1500 MiB segment, which
  // empty_cache() releases once it is free; the rest of the run then reserves the parameters'
  // 100 MiB segment and one 20 MiB segment at most, against the 2048 MiB the recording kept (the
  // same as the profile's figure here: 2048 MiB reserved, at most 120 MiB in use after).
  EXPECT_EQ(f->bytes, 2048 * MiB - 120 * MiB);
  EXPECT_NE(f->basis.find("checked by replay"), std::string::npos) << f->basis;
  EXPECT_NE(f->fix.find("torch.cuda.empty_cache()"), std::string::npos) << f->fix;
  ASSERT_FALSE(f->where.empty());
  EXPECT_EQ(f->where[0].display(), "train.py:61 validate");
  // The same transient in every step is the working set: cached at the end, needed again.
  EXPECT_EQ(find(findFindings(run(true), 0), FindingKind::CacheBloat), nullptr);
  // Reserved bytes a profiler reader synthesized (the allocated high-water mark) say nothing.
  format::Snapshot synthesized = run(false);
  synthesized.reserved_recorded = false;
  EXPECT_EQ(find(findFindings(synthesized, 0), FindingKind::CacheBloat), nullptr);
  // Without the replays the profile's figure is an estimate, and says so.
  FindingsOptions off;
  off.fix_replays = 0;
  const auto unchecked = findFindings(run(false), 0, off);
  f = find(unchecked, FindingKind::CacheBloat);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->bytes, 2048 * MiB - 120 * MiB) << "the least reserved minus the most in use after";
  EXPECT_NE(f->basis.find("untested"), std::string::npos) << f->basis;
}

// A plateau is no spike: two state buffers swapped in a loop (new = f(old), then the old one
// freed) hold the peak level half of the time, while one short temporary per step does not.
TEST(Findings, APlateauOfSwappedBuffersIsNoTemporarySpike) {
  auto run = [](bool swap) {
    Sim s(2048 * MiB);
    s.alloc(16 * MiB, kParams);
    const std::vector<TFrame> at = {{"simulate.py", 36, "advance"}, {"simulate.py", 44, "run"}};
    uint64_t state = s.alloc(400 * MiB, at);
    for (int k = 0; k < 40; ++k) {
      if (swap) {
        uint64_t next = s.alloc(400 * MiB, at);
        s.free(state);
        state = next;
      } else {
        for (int i = 0; i < 8; ++i) s.free(s.alloc(1 * MiB, kAct));
        s.free(s.alloc(600 * MiB, at));
      }
    }
    return s.build();
  };
  EXPECT_EQ(find(findFindings(run(true), 0), FindingKind::TemporarySpike), nullptr);
  const auto fs = findFindings(run(false), 0);
  const Finding* f = find(fs, FindingKind::TemporarySpike);
  ASSERT_NE(f, nullptr);
  // Without the 600 MiB temporaries (all 40 from the same line) the peak is a 1 MiB one's.
  EXPECT_EQ(f->bytes, 599 * MiB);
}

// The allocator-setting finding: a replay with expandable_segments:True lowers the peak reserved
// of requests that grow every step (no freed block fits the next one); never when the file has the
// setting, never when the reserved bytes are what is in use.
TEST(Findings, ExpandableSegmentsSavingIsCheckedByReplay) {
  auto run = [](bool grow) {
    Sim s(8192 * MiB);
    s.alloc(64 * MiB, kParams);
    const std::vector<TFrame> at = {{"train.py", 64, "collate"}, {"train.py", 71, "step"}};
    for (int k = 0; k < 12; ++k) {
      std::vector<uint64_t> bufs;
      for (int j = 0; j < 4; ++j) bufs.push_back(s.alloc((grow ? 24 + 8 * k : 24) * MiB, at));
      for (uint64_t b : bufs) s.free(b);
    }
    return s.build();
  };
  // The recording's own segments do not matter to the replay: the requests do. Under the file's
  // settings every step needs four new segments (each larger than the last step's); with
  // expandable segments the freed pages are mapped again.
  format::Snapshot snap = run(true);
  const auto fs = findFindings(snap, 0);
  const Finding* f = find(fs, FindingKind::AllocatorSetting);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, FindingSeverity::Warning);
  EXPECT_NE(f->fix.find("expandable_segments:True"), std::string::npos) << f->fix;
  EXPECT_NE(f->basis.find("checked by replay"), std::string::npos) << f->basis;

  // A replay under the file's settings: 64 + 4 x (24 + 32 + ... + 112) MiB = 64 + 4 x 816 MiB.
  bool baseline_listed = false;
  for (const Evidence& e : f->evidence)
    baseline_listed |=
        e.text.rfind("peak reserved in a replay under the file's settings", 0) == 0 &&
        e.bytes == (64 + 4 * 816) * MiB;
  EXPECT_TRUE(baseline_listed);
  EXPECT_GE(f->bytes, 2560 * MiB);
  // Requests of one size reuse their blocks: nothing to save.
  EXPECT_EQ(find(findFindings(run(false), 0), FindingKind::AllocatorSetting), nullptr);
  // A setting the file has is never advised.
  snap.settings.present = true;
  snap.settings.expandable_segments = true;
  snap.settings.conf = "expandable_segments:True";
  EXPECT_EQ(find(findFindings(snap, 0), FindingKind::AllocatorSetting), nullptr);
}

// After an OOM the exception's unwind frees the forward's tensors: the cache left behind and the
// tensors freed right after the peak are the OOM's story, not a cache-bloat warning or a
// temporary spike with a byte badge over the OOM's. Both fired before issue 13.
TEST(Findings, TheUnwindAfterAnOomIsNotASeparateWarning) {
  auto unwind = [](bool oom) {
    Sim s(1024 * MiB);
    s.alloc(100 * MiB, kParams);
    std::vector<uint64_t> acts;
    for (int i = 0; i < 4; ++i) acts.push_back(s.alloc(200 * MiB, kAct));
    if (oom) s.oom(200 * MiB, 1 * MiB);
    for (uint64_t a : acts) s.free(a);
    for (int i = 0; i < 40; ++i) s.free(s.alloc(1 * MiB, kAct));  // the run goes on
    return s.build();
  };
  auto fs = findFindings(unwind(true), 0);
  const Finding* v = find(fs, FindingKind::OomVerdict);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(find(fs, FindingKind::CacheBloat), nullptr);
  EXPECT_EQ(find(fs, FindingKind::TemporarySpike), nullptr);
  for (const auto& f : fs) {
    if (f.kind != FindingKind::OomVerdict) EXPECT_LE(f.bytes, v->bytes) << f.title;
  }
  // Without the OOM the same frees are a transient peak and the cache it left.
  auto no_oom = findFindings(unwind(false), 0);
  EXPECT_NE(find(no_oom, FindingKind::CacheBloat), nullptr);
  EXPECT_NE(find(no_oom, FindingKind::TemporarySpike), nullptr);
  // An OOM on another device of the job (DataParallel: its exception unwinds every replica's
  // step): after this device's peak it is that unwind too; before it, it is not.
  auto with_other_oom = [&](int64_t time_us) {
    format::Snapshot snap = unwind(false);
    format::Event e;
    e.action = format::Action::Oom;
    e.size = 200 * MiB;
    e.addr = 1 * MiB;
    e.time_us = time_us;
    snap.events.push_back(e);
    snap.trace_begin.push_back(snap.events.size());
    format::indexSnapshot(snap);
    return findFindings(snap, 0);
  };
  // Sim's times: the segment at 1000, the parameters 1001, the four tensors 1002-1005 (the peak),
  // their frees from 1006 on.
  auto after = with_other_oom(1005);
  EXPECT_EQ(find(after, FindingKind::CacheBloat), nullptr);
  EXPECT_EQ(find(after, FindingKind::TemporarySpike), nullptr);
  auto before = with_other_oom(10);  // before the peak and the cache: another story
  EXPECT_NE(find(before, FindingKind::CacheBloat), nullptr);
  EXPECT_NE(find(before, FindingKind::TemporarySpike), nullptr);
}

TEST(Findings, OptimizerStateBloatAboveTwiceTheParameters) {
  auto fs = findFindings(trainingLoop(0, 4), 0);
  const Finding* f = find(fs, FindingKind::OptimizerStateBloat);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, FindingSeverity::High);
  EXPECT_EQ(f->bytes, 64 * MiB) << "128 MiB of state for 32 MiB of parameters: 64 MiB above 2x";
  ASSERT_FALSE(f->where.empty());
  EXPECT_NE(f->where[0].display().find("train.py:44"), std::string::npos) << f->where[0].display();
}

// The parameters are allocated before the trace begins (a late start). With the file's final
// state they are known (alive at the end, never allocated in the trace) and the 4x state is
// found. With the final state lost and rebuilt from the events, they are in no record: the start
// state is untrusted and the ratio over the parameters the trace shows would be an alarm about
// nothing (a cut sidsoc12 trace was told its optimizer state was 1330.8x its 19.53 MiB of
// parameters, at high). A trace from the device's start is trusted with a rebuilt final state.
TEST(Findings, OptimizerStateBloatNeedsTheParametersKnown) {
  const format::Snapshot late = trainingLoop(0, 4, false, /*skip_events=*/5);
  ASSERT_NE(find(findFindings(late, 0), FindingKind::OptimizerStateBloat), nullptr);
  const format::Snapshot late_cut = nativeCutBeforeFinalState(late);
  {
    DeviceSession session(late_cut, 0);
    const replay::DeviceSummary& s = session.facts().summary;
    EXPECT_FALSE(s.consistent);
    EXPECT_EQ(s.untrusted, replay::kUntrustedStart | replay::kUntrustedPeaks |
                               replay::kUntrustedFinalReplayed | replay::kUntrustedBlockLayout);
    EXPECT_NE(s.untrusted_cause.find("rebuilt"), std::string_view::npos) << s.untrusted_cause;
  }
  const auto cut_findings = findFindings(late_cut, 0);
  EXPECT_EQ(find(cut_findings, FindingKind::OptimizerStateBloat), nullptr);
  for (const Finding& f : cut_findings)
    EXPECT_NE(f.basis.find("estimate: the file has no final state"), std::string::npos) << f.basis;

  const format::Snapshot whole_cut = nativeCutBeforeFinalState(trainingLoop(0, 4));
  {
    DeviceSession session(whole_cut, 0);
    EXPECT_TRUE(session.facts().summary.consistent) << session.facts().summary.untrusted_cause;
  }
  const auto whole_findings = findFindings(whole_cut, 0);
  const Finding* f = find(whole_findings, FindingKind::OptimizerStateBloat);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->bytes, 64 * MiB);
}

// What we write, we read: a file whose final state was rebuilt, converted to a native trace again,
// is written without one (not the rebuild as if recorded), so the copy's replay is as untrusted
// as the original's and no finding trusts its start.
TEST(Findings, ARebuiltFinalStateIsNotWrittenAsRecorded) {
  const format::Snapshot late_cut = nativeCutBeforeFinalState(trainingLoop(0, 4, false, 5));
  format::trace::VectorSink sink;
  ASSERT_TRUE(format::writeSnapshotTrace(late_cut, sink).ok());
  auto again = format::loadSnapshotBytes(sink.data);
  ASSERT_TRUE(again.ok()) << again.error().describe();
  EXPECT_TRUE(again->final_state_rebuilt);
  EXPECT_FALSE(again->incomplete.empty());
  EXPECT_EQ(again->events.size(), late_cut.events.size());
  EXPECT_EQ(again->segments.size(), late_cut.segments.size()) << "the same rebuild";
  DeviceSession session(*again, 0);
  EXPECT_FALSE(session.facts().summary.consistent);
  EXPECT_EQ(find(findFindings(*again, 0), FindingKind::OptimizerStateBloat), nullptr);
}

TEST(Findings, OomVerdictSaysFragmentationOnlyWhenTheCacheHadRoom) {
  {
    Sim s(64 * MiB);
    std::vector<uint64_t> blocks;
    for (int i = 0; i < 16; ++i) blocks.push_back(s.alloc(4 * MiB, kAct));
    for (int i = 0; i < 16; i += 2) s.free(blocks[i]);  // 32 MiB free in 4 MiB holes
    s.oom(8 * MiB, 1 * MiB);
    auto fs = findFindings(s.build(), 0);
    const Finding* f = find(fs, FindingKind::OomVerdict);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->severity, FindingSeverity::High);
    EXPECT_EQ(f->bytes, 8 * MiB);
    EXPECT_NE(f->title.find("fragmentation"), std::string::npos) << f->title;
  }
  {
    Sim s(64 * MiB);
    for (int i = 0; i < 15; ++i) s.alloc(4 * MiB, kAct);
    s.oom(8 * MiB, 1 * MiB);
    auto fs = findFindings(s.build(), 0);
    const Finding* f = find(fs, FindingKind::OomVerdict);
    ASSERT_NE(f, nullptr);
    ASSERT_TRUE(f->oom.has_value());
    EXPECT_FALSE(f->oom->fragmentation) << f->title;
    bool activations_listed = false, hot_path = false;
    for (const auto& e : f->evidence) {
      activations_listed |= e.text.find("live") == 0 && e.bytes == 60 * MiB;
      // The call graph at the OOM: all 60 MiB flow through train.py:41 into model.py:30.
      hot_path |= e.text == "heaviest call path at the OOM" && e.bytes == 60 * MiB &&
                  e.frames.size() == 2 && e.frames[0].display() == "model.py:30 forward";
    }
    EXPECT_TRUE(activations_listed);
    EXPECT_TRUE(hot_path);
  }
  EXPECT_EQ(find(findFindings(trainingLoop(0, 2), 0), FindingKind::OomVerdict), nullptr);
}

// The spike's promise is the drop of the whole trace's peak, not the bytes of the spike: a
// temporary made before the window and another peak after it keep part of them (the backward of
// a hand-written softmax in a real file: 1.50 GiB of temporaries, a 1.00 GiB drop).
TEST(Findings, ATemporarySpikePromisesTheDropOfTheWholePeak) {
  auto run = [](uint64_t later) {
    Sim s(4096 * MiB);
    s.alloc(100 * MiB, kParams);
    const std::vector<TFrame> at = {{"model.py", 9, "custom_softmax"}, {"train.py", 41, "step"}};
    const uint64_t early = s.alloc(500 * MiB, at);  // alive at the peak, made before the window
    for (int i = 0; i < 200; ++i) s.free(s.alloc(1 * MiB, kAct));
    std::vector<uint64_t> spike;
    for (int i = 0; i < 3; ++i) spike.push_back(s.alloc(500 * MiB, at));  // the peak: 2100 MiB
    for (uint64_t b : spike) s.free(b);
    for (int i = 0; i < 200; ++i) s.free(s.alloc(1 * MiB, kAct));
    // Later, still beside `early`, from another line: 100 + 500 + later MiB.
    const uint64_t second = s.alloc(later, {{"model.py", 30, "mlp"}, {"train.py", 41, "step"}});
    s.free(second);
    s.free(early);
    return s.build();
  };
  const auto fs = findFindings(run(1000 * MiB), 0);
  const Finding* f = find(fs, FindingKind::TemporarySpike);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->bytes, 500 * MiB);  // 2100 -> 1600 MiB, not the 1500 MiB of the three
  EXPECT_NE(f->title.find("1.46 GiB"), std::string::npos) << f->title;
  EXPECT_NE(f->fix.find("500.00 MiB"), std::string::npos) << f->fix;
  // A second peak of 2000 MiB leaves 100 MiB to win, under the warning floor: not said.
  EXPECT_EQ(find(findFindings(run(1400 * MiB), 0), FindingKind::TemporarySpike), nullptr);
}

TEST(Findings, CacheBloatAndTemporarySpike) {
  Sim s(2048 * MiB);
  s.alloc(100 * MiB, kParams);
  for (int i = 0; i < 20; ++i) s.free(s.alloc(1 * MiB, kAct));
  uint64_t big =
      s.alloc(1500 * MiB, {{"model.py", 77, "attention"}, {"train.py", 41, "train_step"}});
  s.free(big);
  for (int i = 0; i < 20; ++i) s.free(s.alloc(1 * MiB, kAct));
  auto fs = findFindings(s.build(), 0);
  const Finding* cache = find(fs, FindingKind::CacheBloat);
  ASSERT_NE(cache, nullptr);
  // The replay gives the 1500 MiB request its own segment, released by empty_cache() after its
  // free; the rest reserves the parameters' 100 MiB and the small pool's 2 MiB.
  EXPECT_EQ(cache->bytes, 2048 * MiB - 102 * MiB);
  const Finding* spike = find(fs, FindingKind::TemporarySpike);
  ASSERT_NE(spike, nullptr);
  EXPECT_EQ(spike->bytes, 1499 * MiB);  // the peak drops to the parameters and a 1 MiB transient
  ASSERT_FALSE(spike->where.empty());
  EXPECT_EQ(spike->where[0].display(), "model.py:77 attention");
  // A long-lived peak is not a spike, and a full cache is not bloat.
  Sim q(256 * MiB);
  for (int i = 0; i < 60; ++i) q.alloc(4 * MiB, kParams);
  auto none = findFindings(q.build(), 0);
  EXPECT_EQ(find(none, FindingKind::CacheBloat), nullptr);
  EXPECT_EQ(find(none, FindingKind::TemporarySpike), nullptr);
}

TEST(Findings, PendingFreesHeldAtThePeak) {
  Sim s(1024 * MiB);
  s.alloc(100 * MiB, kParams);
  uint64_t a = s.alloc(200 * MiB, kAct);
  s.freeRequest(a);  // never completed: another stream still uses it
  s.alloc(300 * MiB, kAct);
  auto fs = findFindings(s.build(), 0);
  const Finding* f = find(fs, FindingKind::PendingFreeRetention);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->bytes, 200 * MiB);
  Sim q(1024 * MiB);
  q.alloc(100 * MiB, kParams);
  q.free(q.alloc(200 * MiB, kAct));
  q.alloc(300 * MiB, kAct);
  EXPECT_EQ(find(findFindings(q.build(), 0), FindingKind::PendingFreeRetention), nullptr);
}

TEST(CallGraph, InclusiveSelfAndHotPath) {
  Sim s(64 * MiB);
  s.alloc(3 * MiB,
          {{"model.py", 30, "forward"}, {"train.py", 41, "step"}, {"train.py", 10, "main"}});
  s.alloc(2 * MiB,
          {{"model.py", 31, "forward"}, {"train.py", 41, "step"}, {"train.py", 10, "main"}});
  s.alloc(1 * MiB, {{"opt.py", 5, "update"}, {"train.py", 44, "step"}, {"train.py", 10, "main"}});
  s.alloc(7 * MiB, {});  // recorded but empty: not attributable
  auto snap = s.build();
  replay::DeviceReplayer r(snap, 0);
  r.advanceTo(static_cast<int64_t>(snap.trace(0).size()) - 1);
  CallGraphSummary g = buildCallGraph(snap, r.live(), 10);
  EXPECT_EQ(g.total_bytes, 13 * MiB);
  EXPECT_EQ(g.unattributed_bytes, 7 * MiB);
  ASSERT_FALSE(g.top_inclusive.empty());
  EXPECT_EQ(g.top_inclusive[0].frame.display(), "train.py:10 main");
  EXPECT_EQ(g.top_inclusive[0].inclusive_bytes, 6 * MiB);
  EXPECT_EQ(g.top_inclusive[0].self_bytes, 0u);
  EXPECT_EQ(g.top_inclusive[1].frame.display(), "train.py:41 step");
  EXPECT_EQ(g.top_inclusive[1].inclusive_bytes, 5 * MiB);
  EXPECT_EQ(g.top_self[0].frame.display(), "model.py:30 forward");
  EXPECT_EQ(g.top_self[0].self_bytes, 3 * MiB);
  ASSERT_EQ(g.hot_path.size(), 3u);
  EXPECT_EQ(g.hot_path[2].frame.display(), "model.py:30 forward");
  EXPECT_EQ(g.vertices, 6u);
  EXPECT_EQ(g.edges, 5u);
}

}  // namespace
}  // namespace memforensics
