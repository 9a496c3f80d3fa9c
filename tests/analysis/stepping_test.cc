// stepping_test.cc: event stepping (stepping.h, issue 29 item 2): the base with the first k
// patches applied is the allocator model's layout after event first + k - 1, block by block, at
// every event of fabricated traces (splits, merges, pending frees, segments, expandable mapping)
// and of every real snapshot; the recorder's own check refuses patches that do not add up.
#include "analysis/session/stepping.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "analysis/session/session.h"
#include "fixtures/model_builder.h"
#include "fixtures/real_snapshots.h"
#include "format/load/load.h"
#include "replay/allocator_model.h"

namespace memforensics::analysis {
namespace {

using testing::ModelBuilder;
using testing::TFrame;

constexpr uint64_t kB = 0x7f0000000000ULL;
constexpr uint64_t kMiB = 1048576;

// The model's mapped blocks after its current event, as stepping carries them (segment ignored).
std::vector<StepBlock> modelBlocks(const replay::DeviceAllocatorModel& m) {
  std::vector<StepBlock> out;
  for (const auto& s : m.layout()) {
    for (const auto& b : s.blocks) {
      StepBlock sb;
      sb.address = b.address;
      sb.size = b.size;
      sb.state = b.state;
      if (!b.isFree()) {
        sb.requested = b.requested;
        sb.stack = b.stack;
        sb.alloc_event = b.alloc_event;
      }
      out.push_back(sb);
    }
  }
  return out;
}

std::vector<StepBlock> withoutSegments(std::vector<StepBlock> v) {
  for (auto& b : v) b.segment = 0;
  return v;
}

// Steps [first, last] of the device and compares the patched base with an independent model
// after every event; also that each block's segment is a reservation with the model's stream and
// pool. Returns the events compared.
size_t expectPatchesFollowTheModel(const format::Snapshot& snap, int64_t device, int64_t first,
                                   int64_t last) {
  DeviceSession session(snap, device);
  EXPECT_TRUE(session.requestStepping(first, last));
  DeviceFacts f = session.take();
  if (!f.stepping) {
    ADD_FAILURE() << "no stepping facts";
    return 0;
  }
  const SteppingFacts& st = *f.stepping;
  EXPECT_TRUE(st.checked) << st.failed;
  if (!st.checked) return 0;
  EXPECT_EQ(st.patches.size(), static_cast<size_t>(last - first + 1));
  replay::DeviceAllocatorModel model(snap, device);
  model.advanceTo(first - 1);
  StepMirror mirror;
  mirror.assign(st.base);
  EXPECT_EQ(withoutSegments(mirror.blocks()), modelBlocks(model)) << "base";
  size_t compared = 0;
  for (size_t k = 0; k < st.patches.size(); ++k) {
    const StepPatch& p = st.patches[k];
    EXPECT_LE(p.lo, p.hi);
    for (const StepBlock& b : p.blocks) {
      EXPECT_GE(b.address, p.lo);
      EXPECT_LE(b.address + b.size, p.hi);
      EXPECT_LT(b.segment, st.segments.size());
    }
    mirror.apply(p);
    model.step();
    const auto want = modelBlocks(model);
    const auto got = mirror.blocks();
    if (withoutSegments(got) != want) {
      ADD_FAILURE() << "after event " << first + static_cast<int64_t>(k) << ": " << got.size()
                    << " blocks stepped, " << want.size() << " in the model";
      return compared;
    }
    size_t i = 0;
    for (const auto& s : model.layout()) {
      for (size_t j = 0; j < s.blocks.size(); ++j, ++i) {
        const StepSegment& seg = st.segments[got[i].segment];
        EXPECT_EQ(seg.stream, s.stream);
        EXPECT_EQ(seg.pool, s.pool);
        EXPECT_EQ(seg.expandable, s.is_expandable);
        EXPECT_LE(seg.address, s.address);
      }
    }
    ++compared;
  }
  return compared;
}

TEST(Stepping, PatchesFollowSplitsMergesPendingFreesAndSegments) {
  const std::vector<TFrame> a{{"train.py", 10, "step"}};
  ModelBuilder m;
  m.device(0).segmentAlloc(kB, 20 * kMiB, {.time_us = 1});
  m.alloc(kB, 2 * kMiB, {.time_us = 2, .frames = a});
  m.alloc(kB + 2 * kMiB, 4 * kMiB, {.time_us = 3, .frames = a});
  m.alloc(kB + 6 * kMiB, 4 * kMiB, {.time_us = 4, .frames = a});
  m.freeRequested(kB + 2 * kMiB, 4 * kMiB, {.time_us = 5});
  m.freeCompleted(kB + 2 * kMiB, 4 * kMiB, {.time_us = 6});
  m.free(kB, 2 * kMiB, {.time_us = 7});                 // merges with the free block after it
  m.oom(64 * kMiB, kMiB, {.time_us = 8, .frames = a});  // changes nothing
  m.free(kB + 6 * kMiB, 4 * kMiB, {.time_us = 9});      // the whole segment is free again
  m.segmentFree(kB, 20 * kMiB, {.time_us = 10});
  m.segmentAlloc(kB + 40 * kMiB, 2 * kMiB, {.time_us = 11});
  m.alloc(kB + 40 * kMiB, 512, {.time_us = 12, .frames = a});
  const auto snap = m.build();
  EXPECT_EQ(expectPatchesFollowTheModel(snap, 0, 0, 12), 13u);
  // A window that starts inside the trace: the base is the layout after its first event - 1.
  EXPECT_EQ(expectPatchesFollowTheModel(snap, 0, 4, 9), 6u);
  // An event that changes nothing has an empty patch.
  DeviceSession s(snap, 0);
  ASSERT_TRUE(s.requestStepping(0, 12));
  const DeviceFacts f = s.take();
  ASSERT_TRUE(f.stepping && f.stepping->checked);
  EXPECT_EQ(f.stepping->patches[8].lo, f.stepping->patches[8].hi);
  EXPECT_NE(f.stepping->patches[7].lo, f.stepping->patches[7].hi);
}

TEST(Stepping, PatchesFollowExpandableMappingAndUnmapping) {
  const std::vector<TFrame> a{{"train.py", 10, "step"}};
  ModelBuilder m;
  m.settings({.conf = "expandable_segments:True", .expandable_segments = true});
  m.device(0);
  m.segmentMap(kB, 20 * kMiB, {.time_us = 1});
  m.alloc(kB, 12 * kMiB, {.time_us = 2, .frames = a});
  m.segmentMap(kB + 20 * kMiB, 20 * kMiB, {.time_us = 3});
  m.alloc(kB + 12 * kMiB, 16 * kMiB, {.time_us = 4, .frames = a});
  m.free(kB, 12 * kMiB, {.time_us = 5});
  m.free(kB + 12 * kMiB, 16 * kMiB, {.time_us = 6});
  m.segmentUnmap(kB + 20 * kMiB, 20 * kMiB, {.time_us = 7});
  const auto snap = m.build();
  EXPECT_EQ(expectPatchesFollowTheModel(snap, 0, 0, 6), 7u);
}

TEST(Stepping, RefusesAWindowOutsideTheTrace) {
  ModelBuilder m;
  m.device(0).segmentAlloc(kB, 2 * kMiB, {.time_us = 1});
  const auto snap = m.build();
  DeviceSession s(snap, 0);
  EXPECT_FALSE(s.requestStepping(-1, 0));
  EXPECT_FALSE(s.requestStepping(0, 1));
  EXPECT_FALSE(s.requestStepping(1, 0));
  EXPECT_TRUE(s.requestStepping(0, 0));
  s.visit();
  EXPECT_FALSE(s.requestStepping(0, 0));
}

// The check is real: a change the patches do not carry (made here far from the event's address,
// which no allocator rule does) leaves stepping off, with the reason.
TEST(Stepping, TheRecorderRefusesPatchesThatDoNotAddUp) {
  replay::CachingAllocator core;
  replay::CachedSegment s;
  s.address = kB;
  s.size = 20 * kMiB;
  replay::ModelBlock b;
  b.address = kB;
  b.size = 20 * kMiB;
  s.blocks.emplace(b.address, b);
  core.addSegment(s);
  replay::CachedSegment far = s;
  far.address = kB + 100 * kMiB;
  far.blocks.clear();
  b.address = far.address;
  far.blocks.emplace(b.address, b);

  SteppingRecorder ok(0, 0);
  ok.start(core);
  format::Event e;
  e.action = format::Action::SegmentAlloc;
  e.addr = far.address;
  e.size = far.size;
  ok.before(core, e);
  core.addSegment(far);
  ok.after(core, e);
  ok.finish(core);
  EXPECT_TRUE(ok.take().checked);

  SteppingRecorder bad(0, 0);
  bad.start(core);
  e.addr = kB + 4096;  // says it touched the first segment ...
  e.action = format::Action::FreeRequested;
  bad.before(core, e);
  core.eraseSegment(far.address);  // ... while the far one went
  bad.after(core, e);
  bad.finish(core);
  const SteppingFacts f = bad.take();
  EXPECT_FALSE(f.checked);
  EXPECT_NE(f.failed.find("did not lead to the model's layout"), std::string::npos) << f.failed;
  EXPECT_TRUE(f.patches.empty());
  EXPECT_TRUE(f.base.empty());
}

// Every device of every real snapshot and the scenarios: the first 3,000 events (the report's
// windows are smaller), compared after every event.
TEST(Stepping, PatchesFollowTheModelOnEveryRealFile) {
  std::vector<std::filesystem::path> files = memforensics::testing::realSnapshotPaths();
  const std::filesystem::path scen = std::filesystem::path(MEMF_SOURCE_DIR) / "snapshots";
  for (const auto& e : std::filesystem::recursive_directory_iterator(scen)) {
    if (e.path().extension() == ".pickle") files.push_back(e.path());
  }
  size_t events = 0;
  for (const auto& p : files) {
    SCOPED_TRACE(p.filename().string());
    auto snap = format::loadSnapshotFile(p.string());
    if (!snap.ok()) continue;  // other tests own the readers' verdicts
    if (!snap->has_segment_info) continue;
    for (int64_t d : snap->devices()) {
      SCOPED_TRACE("device " + std::to_string(d));
      const auto n = static_cast<int64_t>(snap->trace(d).size());
      if (n == 0) continue;
      events += expectPatchesFollowTheModel(*snap, d, 0, std::min<int64_t>(n, 3000) - 1);
    }
  }
  EXPECT_GT(events, 1000u);
  if (memforensics::testing::realSnapshotPaths().empty()) {
    std::cout << "[ SKIPPED  ] ../shared/snapshots-real absent: scenarios only\n";
  }
}

}  // namespace
}  // namespace memforensics::analysis
