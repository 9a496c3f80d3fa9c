// torch_entry_test.cc: fabricated c10 TraceEntry fields -> ring records -> trace events, and the
// raw clock -> microseconds conversion (src/capture/torch_entry.h, record.h).
#include "capture/torch_entry.h"

#include <gtest/gtest.h>

#include "capture/recorder.h"
#include "capture_test_util.h"
#include "format/load/load.h"

namespace mc = memforensics::capture;
namespace mt = memforensics::format::trace;

namespace {

TEST(TorchEntry, ActionsKeepC10Order) {
  // c10 TraceEntry::Action: ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE,
  // SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, OOM, ANNOTATE -> format::Action of the same value.
  for (int a = 0; a < 10; ++a) {
    mc::TorchEntry e;
    e.action = a;
    EXPECT_EQ(mc::toRecord(e).action, a);
    EXPECT_EQ(static_cast<int>(memforensics::format::Action(a)), a);
  }
  mc::TorchEntry later;
  later.action = 11;  // an action added by a newer PyTorch
  EXPECT_EQ(mc::toRecord(later).action, 10);
  later.action = -1;
  EXPECT_EQ(mc::toRecord(later).action, 10);
}

TEST(TorchEntry, FieldsAreCopied) {
  mc::TorchEntry e;
  e.action = 0;
  e.device = 3;
  e.addr = 0x7f12'3456'7800;
  e.size = 12345;
  e.stream = 0x55aa'0000'1000;
  e.time_ticks = 987654321;
  e.pool_a = 1;
  e.pool_b = 2;
  mc::CaptureRecord r = mc::toRecord(e);
  EXPECT_EQ(r.device, 3u);
  EXPECT_EQ(r.addr, e.addr);
  EXPECT_EQ(r.size, 12345u);
  EXPECT_EQ(r.stream, e.stream);
  EXPECT_EQ(r.ticks, 987654321u);
  EXPECT_EQ(r.pool_a, 1u);
  EXPECT_EQ(r.pool_b, 2u);
  EXPECT_EQ(r.flags, mc::kHasTime);
  mt::TraceEvent t = mc::toTraceEvent(r, 1700000000123456);
  EXPECT_EQ(t.action, 0);
  EXPECT_EQ(t.device, 3u);
  EXPECT_EQ(t.addr, e.addr);
  EXPECT_EQ(t.size, 12345u);
  EXPECT_EQ(t.stream, e.stream);
  EXPECT_EQ(t.time_us, 1700000000123456);
}

TEST(TorchEntry, OomCarriesFreeBytesInAddr) {
  mc::TorchEntry e;
  e.action = mc::kTorchOom;
  e.addr = 1u << 20;  // device_free, as c10 stores it in addr_
  e.size = 8u << 30;  // the rounded request
  mt::TraceEvent t = mc::toTraceEvent(mc::toRecord(e), -1);
  EXPECT_EQ(t.action, 8);
  EXPECT_EQ(t.addr, 1u << 20);
  EXPECT_EQ(t.size, 8u << 30);
}

TEST(TorchEntry, NegativeDeviceIsOutOfRange) {
  mc::TorchEntry e;
  e.device = -1;
  EXPECT_EQ(mc::toRecord(e).device, UINT32_MAX);
  e.has_time = false;
  EXPECT_EQ(mc::toTraceEvent(mc::toRecord(e), 5).time_us, -1);
}

TEST(TickConverter, InterpolatesBetweenAnchorAndLatestSample) {
  // A 2.5 GHz TSC: 2.5 ticks per ns.
  mc::TickConverter c(1.0);
  EXPECT_EQ(c.toUnixUs(1000), -1);               // not calibrated
  const int64_t t0 = 1'700'000'000'000'000'000;  // ns
  c.addSample(1'000'000, t0);
  EXPECT_DOUBLE_EQ(c.nsPerTick(), 1.0);                // the guess until 10 ms have passed
  c.addSample(1'000'000 + 2'500'000, t0 + 1'000'000);  // 1 ms later: too short, still the guess
  EXPECT_DOUBLE_EQ(c.nsPerTick(), 1.0);
  c.addSample(1'000'000 + 250'000'000, t0 + 100'000'000);  // 100 ms later
  EXPECT_DOUBLE_EQ(c.nsPerTick(), 0.4);
  EXPECT_EQ(c.toUnixUs(1'000'000), t0 / 1000);
  EXPECT_EQ(c.toUnixUs(1'000'000 + 25'000'000), t0 / 1000 + 10'000);  // 10 ms after the anchor
  EXPECT_EQ(c.toUnixUs(1'000'000 - 2'500), t0 / 1000 - 1);            // just before the anchor
}

TEST(TickConverter, DefaultClockCountsNanoseconds) {
  mc::TickConverter c;
  c.addSample(5'000'000'000, 1'600'000'000'000'000'000);
  EXPECT_EQ(c.toUnixUs(5'000'000'000 + 3'000'000), 1'600'000'000'000'000 + 3'000);
}

// Fabricated tracker entries of a short training step through the recorder: what PyTorch's own
// snapshot of the same step would hold, event for event, after loading.
TEST(TorchEntry, FabricatedStepLoadsAsTheSnapshotWould) {
  const std::string path = mc::testing::tempPath("torch_step.bin");
  auto r = mc::Recorder::create(path, {});
  ASSERT_TRUE(r.ok());
  const uint64_t seg = 0x7f00'0000'0000;
  struct E {
    int action;
    uint64_t addr, size;
  } steps[] = {
      {3, seg, 20u << 20},
      {0, seg, 4u << 20},
      {0, seg + (4u << 20), 8u << 20},
      {1, seg, 4u << 20},
      {2, seg, 4u << 20},
      {0, seg, 1u << 20},
      {8, 512u << 20, 64ull << 30},
      {1, seg + (4u << 20), 8u << 20},
      {2, seg + (4u << 20), 8u << 20},
  };
  for (const E& s : steps) {
    mc::TorchEntry e;
    e.action = s.action;
    e.addr = s.addr;
    e.size = s.size;
    e.stream = 0x1234;
    e.time_ticks = mc::monotonicTicks();
    ASSERT_TRUE((*r)->record(mc::toRecord(e)));
  }
  ASSERT_TRUE((*r)->stop().ok());
  auto snap = memforensics::format::loadSnapshotFile(path);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  ASSERT_EQ(snap->traceCount(), 1u);
  auto tr = snap->trace(0);
  ASSERT_EQ(tr.size(), std::size(steps));
  for (size_t i = 0; i < tr.size(); ++i) {
    EXPECT_EQ(static_cast<int>(tr[i].action), steps[i].action) << i;
    EXPECT_EQ(tr[i].addr, steps[i].addr) << i;
    EXPECT_EQ(tr[i].size, steps[i].size) << i;
    EXPECT_EQ(tr[i].stream, 0x1234) << i;
    EXPECT_GT(tr[i].time_us, 1'600'000'000'000'000) << i;
  }
  // End state: one segment with the 1 MiB block live.
  ASSERT_EQ(snap->segments.size(), 1u);
  EXPECT_EQ(snap->segments[0].total_size, 20u << 20);
  EXPECT_EQ(snap->segments[0].requested_size, 1u << 20);
}

}  // namespace
