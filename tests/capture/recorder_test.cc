// recorder_test.cc: the recorder (src/capture/recorder.h) end to end on the CPU: records in, a
// native trace file out, read back with the format library: the same events, stacks interned once,
// drops counted in the trailer, OOM records flushed at once, the final segment state.
#include "capture/recorder.h"

#include <gtest/gtest.h>

#include <thread>

#include "capture_test_util.h"
#include "format/load/load.h"
#include "format/model/snapshot.h"

namespace mc = memforensics::capture;
namespace mt = memforensics::format::trace;
using mc::testing::readBytes;
using mc::testing::readTrace;
using mc::testing::tempPath;

// Outside the anonymous namespace: an exported symbol that dladdr can name.
__attribute__((noinline)) bool memfCaptureTestRecordFromHere(memforensics::capture::Recorder& r,
                                                             uint64_t addr);

namespace {

// A fake clock for the recorder: ticks advance 3 per nanosecond of CLOCK_MONOTONIC.
uint64_t fakeTicks() {
  return mc::monotonicTicks() * 3;
}

mc::CaptureRecord rec(uint8_t action, uint64_t addr, uint64_t size, uint32_t device = 0,
                      int64_t stream = 7) {
  mc::CaptureRecord r;
  r.action = action;
  r.addr = addr;
  r.size = size;
  r.device = device;
  r.stream = stream;
  r.ticks = fakeTicks();
  r.flags = mc::kHasTime;
  return r;
}

// A training-loop-like sequence on two devices: segments, allocs and frees.
std::vector<mc::CaptureRecord> sequence(size_t steps) {
  std::vector<mc::CaptureRecord> out;
  for (uint32_t d = 0; d < 2; ++d)
    out.push_back(rec(3, 0x7f0000000000 + (uint64_t{d} << 32), 20u << 20, d));
  for (size_t i = 0; i < steps; ++i) {
    uint32_t d = i % 2;
    uint64_t base = 0x7f0000000000 + (uint64_t{d} << 32);
    uint64_t a = base + (i % 64) * 65536;
    uint64_t size = 1000 + i;
    out.push_back(rec(0, a, size, d));
    out.push_back(rec(1, a, size, d));
    out.push_back(rec(2, a, size, d));
  }
  return out;
}

TEST(Recorder, EventsReachTheFileUnchanged) {
  std::string path = tempPath("events.bin");
  mc::RecorderOptions o;
  o.devices = 2;
  o.now_ticks = &fakeTicks;
  o.ns_per_tick_guess = 1.0 / 3;
  auto r = mc::Recorder::create(path, o);
  ASSERT_TRUE(r.ok()) << r.error().describe();
  auto in = sequence(5000);
  for (const auto& x : in) {
    while (!(*r)->record(x)) std::this_thread::yield();
  }
  ASSERT_TRUE((*r)->stop().ok());
  mc::RecorderStats st = (*r)->stats();
  EXPECT_EQ(st.written, in.size());

  auto back = readTrace(readBytes(path));
  ASSERT_TRUE(back.end.complete) << back.end.reason;
  ASSERT_EQ(back.events.size(), in.size());
  // Per device, the order is kept; across devices the file interleaves them as drained.
  std::vector<std::vector<mt::TraceEvent>> per(2);
  for (const auto& e : back.events) per[e.device].push_back(e);
  std::vector<size_t> next(2, 0);
  int64_t last_t[2] = {-1, -1};
  for (const auto& x : in) {
    ASSERT_LT(next[x.device], per[x.device].size());
    const mt::TraceEvent& e = per[x.device][next[x.device]++];
    EXPECT_EQ(e.action, x.action);
    EXPECT_EQ(e.addr, x.addr);
    EXPECT_EQ(e.size, x.size);
    EXPECT_EQ(e.stream, x.stream);
    EXPECT_EQ(e.stack, mt::kTraceNoStack);
    EXPECT_GE(e.time_us, last_t[x.device]);  // non-decreasing per device
    last_t[x.device] = e.time_us;
  }
  EXPECT_EQ(back.trailer.dropped, 0u);
  EXPECT_EQ(back.trailer.events, in.size());

  // The loader reads it as a complete capture: its final state holds the two segments, free.
  auto snap = memforensics::format::loadSnapshotFile(path);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  EXPECT_EQ(snap->events.size(), in.size());
  EXPECT_EQ(snap->segments.size(), 2u);
  for (const auto& w : snap->load_warnings) ADD_FAILURE() << "unexpected warning: " << w;
}

TEST(Recorder, TimesAreMicrosecondsNearNow) {
  std::string path = tempPath("time.bin");
  mc::RecorderOptions o;
  o.now_ticks = &fakeTicks;
  o.ns_per_tick_guess = 1.0 / 3;
  auto r = mc::Recorder::create(path, o);
  ASSERT_TRUE(r.ok());
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  const int64_t before_us = ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
  ASSERT_TRUE((*r)->record(rec(0, 0x1000, 1)));
  ASSERT_TRUE((*r)->stop().ok());
  clock_gettime(CLOCK_REALTIME, &ts);
  const int64_t after_us = ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
  auto back = readTrace(readBytes(path));
  ASSERT_EQ(back.events.size(), 1u);
  // Within a millisecond of the interval in which it was recorded (clock slopes are estimates).
  EXPECT_GE(back.events[0].time_us, before_us - 1000);
  EXPECT_LE(back.events[0].time_us, after_us + 1000);
}

TEST(Recorder, FullRingDropsAreCountedInTheTrailer) {
  std::string path = tempPath("drops.bin");
  mc::RecorderOptions o;
  o.devices = 1;
  o.ring_capacity = 16;
  o.poll_us = 1000000;            // the writer sleeps a long while between drains...
  o.flush_interval_ms = 3600000;  // ...and never flushes on its own
  auto r = mc::Recorder::create(path, o);
  ASSERT_TRUE(r.ok());
  size_t accepted = 0;
  for (int i = 0; i < 100; ++i) accepted += (*r)->record(rec(0, 0x1000 + 512 * i, 100));
  // A device without a ring is dropped too.
  EXPECT_FALSE((*r)->record(rec(0, 0x5000, 1, /*device=*/3)));
  ASSERT_TRUE((*r)->stop().ok());
  auto st = (*r)->stats();
  EXPECT_EQ(st.recorded, accepted);
  EXPECT_EQ(st.dropped, 100 - accepted + 1);
  EXPECT_GT(st.dropped, 1u);
  auto back = readTrace(readBytes(path));
  ASSERT_TRUE(back.end.complete);
  EXPECT_EQ(back.events.size(), accepted);
  EXPECT_EQ(back.trailer.dropped, st.dropped);
  auto snap = memforensics::format::loadSnapshotFile(path);
  ASSERT_TRUE(snap.ok());
  bool warned = false;
  for (const auto& w : snap->load_warnings)
    warned |= w.find("dropped by the capture") != std::string::npos;
  EXPECT_TRUE(warned);
}

// Contexts stand for PyTorch's gathered tracebacks: here a list of frames, resolved in batches.
struct FakeContext {
  std::vector<mc::ResolvedFrame> frames;  // innermost first
};

class FakeResolver : public mc::StackResolver {
 public:
  void resolve(std::span<const std::shared_ptr<void>> contexts, mc::FinishMode mode,
               std::vector<mc::ResolvedFrame>& frames,
               std::vector<std::vector<uint32_t>>& stacks) override {
    ++batches;
    if (mode == mc::FinishMode::Signal) ++signal_batches;
    for (const auto& c : contexts) {
      auto* f = static_cast<FakeContext*>(c.get());
      std::vector<uint32_t> ids;
      for (const auto& fr : f->frames) {
        ids.push_back(static_cast<uint32_t>(frames.size()));
        frames.push_back(fr);
      }
      stacks.push_back(std::move(ids));
    }
  }
  std::atomic<int> batches{0};
  std::atomic<int> signal_batches{0};
};

// A flush asked for from a signal handler resolves its batch without what the interrupted thread
// may hold (FinishMode::Signal: the torch resolver then skips the GIL); ordinary flushes do not.
TEST(Recorder, FlushFromASignalResolvesInSignalMode) {
  std::string path = tempPath("signal-flush.bin");
  auto resolver = std::make_shared<FakeResolver>();
  mc::RecorderHooks hooks;
  hooks.resolver = resolver;
  mc::RecorderOptions o;
  o.flush_interval_ms = 600000;  // only the flushes below
  auto r = mc::Recorder::create(path, o, hooks);
  ASSERT_TRUE(r.ok());
  auto ctx = [] { return std::make_shared<FakeContext>(FakeContext{{{"train.py", "main", 3}}}); };
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*r)->record(rec(0, 0x20000 + 512 * i, 64), ctx()));
  ASSERT_TRUE((*r)->flushFromSignal(5000));
  EXPECT_EQ(resolver->signal_batches.load(), 1);
  for (int i = 10; i < 20; ++i) ASSERT_TRUE((*r)->record(rec(0, 0x20000 + 512 * i, 64), ctx()));
  ASSERT_TRUE((*r)->flush(5000));
  EXPECT_EQ(resolver->signal_batches.load(), 1);
  EXPECT_EQ(resolver->batches.load(), 2);
  ASSERT_TRUE((*r)->stop().ok());
  auto back = readTrace(readBytes(path));
  ASSERT_EQ(back.events.size(), 20u);
  EXPECT_EQ(back.event_frames[0], (std::vector<std::string>{"train.py:main:3"}));
}

TEST(Recorder, StacksAreInternedOnce) {
  std::string path = tempPath("stacks.bin");
  auto resolver = std::make_shared<FakeResolver>();
  mc::RecorderHooks hooks;
  hooks.resolver = resolver;
  auto r = mc::Recorder::create(path, {}, hooks);
  ASSERT_TRUE(r.ok());
  auto stackA = std::make_shared<FakeContext>(
      FakeContext{{{"model.py", "forward", 12}, {"train.py", "main", 40}}});
  auto stackB = std::make_shared<FakeContext>(
      FakeContext{{{"optim.py", "step", 7}, {"train.py", "main", 41}}});
  auto stackEmpty = std::make_shared<FakeContext>();
  for (int i = 0; i < 300; ++i) {
    std::shared_ptr<void> ctx;
    if (i % 3 == 0) ctx = stackA;
    if (i % 3 == 1) ctx = stackB;
    if (i % 3 == 2) ctx = stackEmpty;
    // A fresh context per event with equal content, as PyTorch gathers one per allocation.
    auto copy = std::make_shared<FakeContext>(*static_cast<FakeContext*>(ctx.get()));
    ASSERT_TRUE((*r)->record(rec(0, 0x10000 + 512 * i, 64), std::move(copy)));
    if (i == 150) {
      ASSERT_TRUE((*r)->flush());  // two batches: interning spans them
    }
  }
  ASSERT_TRUE((*r)->record(rec(1, 0x10000, 64)));  // no context: no stack
  ASSERT_TRUE((*r)->stop().ok());
  EXPECT_GE(resolver->batches.load(), 2);

  auto back = readTrace(readBytes(path));
  ASSERT_TRUE(back.end.complete);
  ASSERT_EQ(back.events.size(), 301u);
  const uint32_t a = back.events[0].stack, b = back.events[1].stack, empty = back.events[2].stack;
  EXPECT_GT(a, mt::kTraceRootStack);
  EXPECT_GT(b, mt::kTraceRootStack);
  EXPECT_NE(a, b);
  EXPECT_EQ(empty, mt::kTraceRootStack);  // recorded, but empty
  for (size_t i = 0; i < 300; ++i)
    EXPECT_EQ(back.events[i].stack, i % 3 == 0 ? a : i % 3 == 1 ? b : empty) << i;
  EXPECT_EQ(back.events[300].stack, mt::kTraceNoStack);
  EXPECT_EQ(back.event_frames[0],
            (std::vector<std::string>{"model.py:forward:12", "train.py:main:40"}));
  EXPECT_EQ(back.event_frames[1],
            (std::vector<std::string>{"optim.py:step:7", "train.py:main:41"}));
}

TEST(Recorder, NativeStacksNameTheCaller) {
  std::string path = tempPath("native.bin");
  mc::RecorderOptions o;
  o.native_depth = 16;
  auto r = mc::Recorder::create(path, o);
  ASSERT_TRUE(r.ok());
  for (uint64_t a : {0x1000, 0x2000})
    ASSERT_TRUE(memfCaptureTestRecordFromHere(**r, a));  // one call site
  ASSERT_TRUE((*r)->stop().ok());
  auto back = readTrace(readBytes(path));
  ASSERT_EQ(back.events.size(), 2u);
  EXPECT_EQ(back.events[0].stack, back.events[1].stack);  // same call site, same interned stack
  ASSERT_FALSE(back.event_frames[0].empty());
  bool named = false;
  for (const auto& f : back.event_frames[0])
    named |= f.find("memfCaptureTestRecordFromHere") != std::string::npos;
  EXPECT_TRUE(named) << back.event_frames[0][0];
}

TEST(Recorder, OomRecordIsFlushedAtOnce) {
  std::string path = tempPath("oom.bin");
  mc::RecorderOptions o;
  o.flush_interval_ms = 3600000;  // only the OOM can cause a flush
  auto r = mc::Recorder::create(path, o);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*r)->record(rec(3, 0x100000, 2u << 20)));
  ASSERT_TRUE((*r)->record(rec(0, 0x100000, 1000)));
  ASSERT_TRUE((*r)->record(rec(8, 123456, 4u << 30)));  // oom: addr = free device bytes
  // No flush(), no stop(): the file must show the three events by itself.
  for (;;) {
    auto back = readTrace(readBytes(path));
    if (back.events.size() == 3) {
      EXPECT_EQ(back.events[2].action, 8);
      EXPECT_EQ(back.events[2].addr, 123456u);
      EXPECT_FALSE(back.end.complete);  // still recording
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE((*r)->stop().ok());
}

TEST(Recorder, DerivedFinalStateMatchesTheEvents) {
  std::string path = tempPath("final.bin");
  auto r = mc::Recorder::create(path, {});
  ASSERT_TRUE(r.ok());
  const uint64_t seg = 0x200000;
  ASSERT_TRUE((*r)->record(rec(3, seg, 2u << 20)));
  ASSERT_TRUE((*r)->record(rec(0, seg, 1000)));         // live: 1024-byte block
  ASSERT_TRUE((*r)->record(rec(0, seg + 1024, 5000)));  // freed below
  ASSERT_TRUE((*r)->record(rec(0, seg + 6144, 512)));   // pending free at the end
  ASSERT_TRUE((*r)->record(rec(1, seg + 1024, 5000)));
  ASSERT_TRUE((*r)->record(rec(2, seg + 1024, 5000)));
  ASSERT_TRUE((*r)->record(rec(1, seg + 6144, 512)));
  ASSERT_TRUE((*r)->stop().ok());
  auto back = readTrace(readBytes(path));
  ASSERT_TRUE(back.final_state);
  ASSERT_EQ(back.segments.size(), 1u);
  const auto& g = back.segments[0];
  EXPECT_EQ(g.address, seg);
  EXPECT_EQ(g.total_size, 2u << 20);
  EXPECT_EQ(g.allocated_size, 1024u);
  EXPECT_EQ(g.active_size, 1024u + 512u);
  // As PyTorch's snapshot() sums a segment: requested_size counts every active block, the one
  // freed but pending on another stream too (alloc::StateSums; it was 1000, the allocated block
  // only, while the loader's synthesis of the same state said 1512).
  EXPECT_EQ(g.requested_size, 1000u + 512u);
  uint64_t covered = 0;
  for (uint32_t i = 0; i < g.block_count; ++i) covered += back.blocks[g.first_block + i].size;
  EXPECT_EQ(covered, g.total_size);
  auto snap = memforensics::format::loadSnapshotFile(path);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  EXPECT_EQ(snap->segments.size(), 1u);
}

TEST(Recorder, ReportedFinalStateIsWrittenWithTheAllocStacks) {
  std::string path = tempPath("final_exact.bin");
  auto resolver = std::make_shared<FakeResolver>();
  mc::RecorderHooks hooks;
  hooks.resolver = resolver;
  hooks.final_state = [](mc::FinishMode mode, std::vector<mc::FinalSegment>& out) {
    if (mode != mc::FinishMode::Stop) return false;
    mc::FinalSegment s;
    s.address = 0x400000;
    s.total_size = 2u << 20;
    s.is_large = false;
    s.blocks = {{0x400000, 2048, 1100, 0}, {0x400000 + 2048, (2u << 20) - 2048, 0, 2}};
    out.push_back(s);
    return true;
  };
  auto r = mc::Recorder::create(path, {}, hooks);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*r)->record(rec(3, 0x400000, 2u << 20)));
  auto ctx = std::make_shared<FakeContext>(FakeContext{{{"a.py", "f", 1}}});
  ASSERT_TRUE((*r)->record(rec(0, 0x400000, 1100), ctx));
  ASSERT_TRUE((*r)->stop().ok());
  auto back = readTrace(readBytes(path));
  ASSERT_TRUE(back.final_state);
  ASSERT_EQ(back.segments.size(), 1u);
  EXPECT_EQ(back.segments[0].allocated_size,
            2048u);  // the allocator's block size (rounding would say 1536)
  EXPECT_FALSE(back.segments[0].is_large);
  ASSERT_EQ(back.blocks.size(), 2u);
  EXPECT_EQ(back.blocks[0].stack, back.events[1].stack);
  EXPECT_GT(back.blocks[0].stack, mt::kTraceRootStack);
}

TEST(Recorder, CannotCreateInAMissingFolder) {
  auto r = mc::Recorder::create("/nonexistent-folder-memf/x.bin", {});
  EXPECT_FALSE(r.ok());
}

}  // namespace

bool memfCaptureTestRecordFromHere(memforensics::capture::Recorder& r, uint64_t addr) {
  return r.recordNative(rec(0, addr, 32), 0);
}
