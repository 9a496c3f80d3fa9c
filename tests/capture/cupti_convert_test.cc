// cupti_convert_test.cc: fabricated CUPTI memory records -> trace events -> a trace that loads and
// analyzes to the expected peaks. Needs the CUPTI headers only (no libcupti, no driver).
#include "capture/cupti_convert.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "analysis/analyze.h"
#include "format/load/snapshot_trace.h"
#include "format/trace/trace_writer.h"

namespace memforensics::capture::cupti {
namespace {

namespace ft = format::trace;
using format::Action;

constexpr uint64_t kMiB = 1u << 20;

// Stacks: one frame "train.py:<correlation id> step" per correlation id (0 = no stack).
class WriterInterner : public Interner {
 public:
  explicit WriterInterner(ft::TraceWriter& w) : w_(w) {}
  uint32_t stackFor(uint32_t corr) override {
    ++stack_calls;
    if (corr == 0) return ft::kTraceNoStack;
    uint32_t f = w_.frame(w_.string("train.py"), w_.string("step"), corr);
    return w_.stack(ft::kTraceRootStack, f);
  }
  uint32_t pool(uint64_t a, uint64_t b) override { return w_.pool(a, b); }
  int stack_calls = 0;

 private:
  ft::TraceWriter& w_;
};

CUpti_ActivityMemory4 mem(CUpti_ActivityMemoryOperationType op, uint32_t device, uint64_t addr,
                          uint64_t bytes, uint64_t ts, uint32_t corr = 0,
                          CUpti_ActivityMemoryKind kind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE) {
  CUpti_ActivityMemory4 r;
  std::memset(&r, 0, sizeof r);
  r.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
  r.memoryOperationType = op;
  r.memoryKind = kind;
  r.correlationId = corr;
  r.address = addr;
  r.bytes = bytes;
  r.timestamp = ts;
  r.deviceId = device;
  r.streamId = CUPTI_INVALID_STREAM_ID;
  return r;
}
CUpti_ActivityMemory4 alloc(uint32_t device, uint64_t addr, uint64_t bytes, uint64_t ts,
                            uint32_t corr = 0) {
  return mem(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION, device, addr, bytes, ts, corr);
}
CUpti_ActivityMemory4 release(uint32_t device, uint64_t addr, uint64_t bytes, uint64_t ts,
                              uint32_t corr = 0) {
  return mem(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE, device, addr, bytes, ts, corr);
}

CUpti_ActivityMemoryPool3 poolRecord(CUpti_ActivityMemoryPoolOperationType op, uint32_t device,
                                     uint64_t addr, uint64_t size, uint64_t ts) {
  CUpti_ActivityMemoryPool3 r;
  std::memset(&r, 0, sizeof r);
  r.kind = CUPTI_ACTIVITY_KIND_MEMORY_POOL;
  r.memoryPoolOperationType = op;
  r.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
  r.deviceId = device;
  r.address = addr;
  r.size = size;
  r.releaseThreshold = 64 * kMiB;
  r.timestamp = ts;
  return r;
}

// Converts through a real TraceWriter, then reads the trace back as `analyze` does.
struct Harness {
  ft::VectorSink sink;
  ft::TraceWriter writer{sink};
  WriterInterner interner{writer};
  Converter conv;
  std::vector<TimedEvent> batch;

  explicit Harness(int64_t offset_ns = 1'700'000'000'000'000'000)
      : conv(interner, ConvertOptions{offset_ns}) {
    ft::TraceMeta meta;
    meta.producer = "test";
    meta.source_format = "capture";
    EXPECT_TRUE(writer.begin(meta).ok());
  }
  void add(const CUpti_ActivityMemory4& r) {
    conv.addRecord(reinterpret_cast<const CUpti_Activity&>(r), batch);
  }
  void add(const CUpti_ActivityMemoryPool3& r) {
    conv.addRecord(reinterpret_cast<const CUpti_Activity&>(r), batch);
  }
  format::Snapshot finish() {
    Converter::sortBatch(batch);
    for (const auto& t : batch) EXPECT_TRUE(writer.event(t.event).ok());
    std::vector<ft::TraceSegment> segments;
    std::vector<ft::TraceBlock> blocks;
    conv.finalState(segments, blocks);
    writer.setFinalState(std::move(segments), std::move(blocks));
    EXPECT_TRUE(writer.close().ok());
    auto snap = format::readSnapshotTrace(sink.data);
    EXPECT_TRUE(snap.ok()) << (snap.ok() ? "" : snap.error().describe());
    if (snap.ok()) {
      for (const auto& w : snap->load_warnings) ADD_FAILURE() << "load warning: " << w;
    }
    return snap.ok() ? std::move(snap).value() : format::Snapshot{};
  }
};

const analysis::DeviceAnalysis* deviceOf(const analysis::AnalysisResult& r, int64_t d) {
  for (const auto& x : r.devices) {
    if (x.summary.device == d) return &x;
  }
  return nullptr;
}

void expectNoErrors(const analysis::DeviceAnalysis& d) {
  for (const auto& a : d.anomalies)
    EXPECT_NE(a.severity, replay::Severity::Error) << a.id << " x" << a.count;
}

TEST(CuptiConvert, AllocReleasePairsOnTwoDevices) {
  Harness h;
  h.add(alloc(0, 0x7f0000000000, 1000, 1'000, 11));
  h.add(alloc(1, 0x7f1000000000, kMiB, 1'500, 12));
  h.add(alloc(0, 0x7f0000200000, 4096, 2'000, 13));
  h.add(release(0, 0x7f0000000000, 1000, 3'000, 14));
  h.add(release(1, 0x7f1000000000, kMiB, 4'000, 15));
  const ConvertStats& st = h.conv.stats();
  EXPECT_EQ(st.memory_records, 5u);
  EXPECT_EQ(st.device_allocs, 3u);
  EXPECT_EQ(st.device_releases, 2u);
  EXPECT_EQ(st.devices_seen_mask, 3u);
  EXPECT_EQ(st.peak_live_bytes, 1024 + 4096 + kMiB);
  EXPECT_EQ(st.live_bytes, 4096u);
  EXPECT_EQ(h.batch.size(), 3 * 2 + 2 * 3u);
  EXPECT_EQ(h.interner.stack_calls, 5);

  format::Snapshot snap = h.finish();
  ASSERT_EQ(snap.traceCount(), 2u);
  auto t0 = snap.trace(0);
  ASSERT_EQ(t0.size(), 7u);
  EXPECT_EQ(t0[0].action, Action::SegmentAlloc);
  EXPECT_EQ(t0[0].size, 1024u);  // rounded to the 512-byte block the reader assumes
  EXPECT_EQ(t0[1].action, Action::Alloc);
  EXPECT_EQ(t0[1].size, 1000u);
  EXPECT_EQ(t0[1].addr, 0x7f0000000000u);
  EXPECT_EQ(t0[0].time_us, 1'700'000'000'000'000 + 1);  // (ns + offset) / 1000
  EXPECT_EQ(t0[4].action, Action::FreeRequested);
  EXPECT_EQ(t0[5].action, Action::FreeCompleted);
  EXPECT_EQ(t0[6].action, Action::SegmentFree);
  EXPECT_EQ(t0[6].size, 1024u);
  // The stack of correlation id 11 is the frame train.py:11.
  auto frames = snap.stacks.stack(t0[1].stack);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(snap.strings.get(snap.stacks.frame(frames[0]).filename), "train.py");
  EXPECT_EQ(snap.stacks.frame(frames[0]).line, 11u);

  auto result = analysis::analyzeSnapshot(snap);
  const auto* d0 = deviceOf(result, 0);
  const auto* d1 = deviceOf(result, 1);
  ASSERT_TRUE(d0 && d1);
  EXPECT_EQ(d0->summary.peak_reserved.bytes, 1024u + 4096u);
  EXPECT_EQ(d0->summary.peak_requested.bytes, 1000u + 4096u);
  EXPECT_EQ(d0->summary.peak_allocated.bytes, 1024u + 4096u);
  EXPECT_EQ(d0->summary.final_replayed.reserved, 4096u);
  EXPECT_EQ(d1->summary.peak_reserved.bytes, kMiB);
  EXPECT_EQ(d1->summary.final_replayed.reserved, 0u);
  // The final state written at exit: the one allocation still live, exact.
  ASSERT_EQ(snap.segments.size(), 1u);
  EXPECT_EQ(snap.segments[0].address, 0x7f0000200000u);
  EXPECT_EQ(snap.segments[0].total_size, 4096u);
  ASSERT_EQ(snap.segments[0].block_count, 1u);
  EXPECT_EQ(snap.blocks[snap.segments[0].first_block].stack, t0[3].stack);
  EXPECT_EQ(d0->summary.final_file.reserved, 4096u);
  // (allocated is labelled an estimate because freed blocks get the 512-byte rounding, which is
  // exactly how the converter sized their segments: the peak above is exact.)
  expectNoErrors(*d0);
  expectNoErrors(*d1);
  ASSERT_FALSE(d0->top_at_peak.empty());
  EXPECT_EQ(d0->top_at_peak[0].requested_bytes, 4096u);
}

TEST(CuptiConvert, StreamOrderedAllocationsCarryStreamAndPool) {
  Harness h;
  auto a = alloc(0, 0x7e0000000000, 3 * kMiB, 100, 21);
  a.isAsync = 1;
  a.streamId = 7;
  a.memoryPoolConfig.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
  a.memoryPoolConfig.address = 0x7e0000000000;
  a.memoryPoolConfig.pool.size = 32 * kMiB;
  a.memoryPoolConfig.releaseThreshold = 0;
  auto b = a;
  b.address += 3 * kMiB;
  b.correlationId = 22;
  b.timestamp = 200;
  auto fa = release(0, a.address, 3 * kMiB, 300, 23);
  fa.isAsync = 1;
  fa.streamId = 7;
  h.add(a);
  h.add(b);
  h.add(fa);
  EXPECT_EQ(h.conv.stats().async_allocs, 2u);
  ASSERT_EQ(h.conv.pools().size(), 1u);
  EXPECT_EQ(h.conv.pools().begin()->second.size, 32 * kMiB);

  format::Snapshot snap = h.finish();
  ASSERT_EQ(snap.traceCount(), 1u);
  auto t = snap.trace(0);
  ASSERT_EQ(t.size(), 7u);
  for (const auto& e : t) {
    EXPECT_EQ(e.stream, 7);
    ASSERT_NE(e.pool, 0u);
    ASSERT_LT(e.pool, snap.pools.size());
    EXPECT_EQ(snap.pools[e.pool].first, 0x7e0000000000u);
    EXPECT_EQ(snap.pools[e.pool].second, uint64_t{CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL});
  }
  auto result = analysis::analyzeSnapshot(snap);
  ASSERT_EQ(result.devices.size(), 1u);
  EXPECT_EQ(result.devices[0].summary.peak_requested.bytes, 6 * kMiB);
  EXPECT_EQ(result.devices[0].summary.final_replayed.requested, 3 * kMiB);
  expectNoErrors(result.devices[0]);
}

TEST(CuptiConvert, SynchronousRecordsUseTheDefaultStream) {
  Harness h;
  h.add(alloc(0, 0x1000000, 512, 10));
  ASSERT_EQ(h.batch.size(), 2u);
  EXPECT_EQ(h.batch[0].event.stream, 0);
  EXPECT_EQ(h.batch[0].event.pool, 0u);
}

TEST(CuptiConvert, MemoryPoolCreateTrimDestroy) {
  Harness h;
  h.add(poolRecord(CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED, 0, 0x7d0000000000, 0, 10));
  h.add(poolRecord(CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_TRIMMED, 0, 0x7d0000000000, 64 * kMiB,
                   20));
  h.add(poolRecord(CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_TRIMMED, 0, 0x7d0000000000, 16 * kMiB,
                   30));
  h.add(poolRecord(CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED, 1, 0x7c0000000000, 0, 15));
  h.add(poolRecord(CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_DESTROYED, 0, 0x7d0000000000, 0, 40));
  const ConvertStats& st = h.conv.stats();
  EXPECT_EQ(st.pool_created, 2u);
  EXPECT_EQ(st.pool_trimmed, 2u);
  EXPECT_EQ(st.pool_destroyed, 1u);
  EXPECT_EQ(st.memory_records, 0u);
  EXPECT_TRUE(h.batch.empty());  // pools change no counter of the trace
  const auto& pools = h.conv.pools();
  ASSERT_EQ(pools.size(), 2u);
  const PoolStats& p0 = pools.at({0, 0x7d0000000000});
  EXPECT_EQ(p0.peak_size, 64 * kMiB);
  EXPECT_EQ(p0.release_threshold, 64 * kMiB);
  EXPECT_TRUE(p0.destroyed);
  EXPECT_FALSE(pools.at({1, 0x7c0000000000}).destroyed);
  format::Snapshot snap = h.finish();
  EXPECT_EQ(snap.events.size(), 0u);
}

TEST(CuptiConvert, NonDeviceMemoryIsCountedNotTraced) {
  Harness h;
  h.add(mem(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION, 0, 0x1000, 4096, 1, 0,
            CUPTI_ACTIVITY_MEMORY_KIND_PINNED));
  h.add(mem(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE, 0, 0x1000, 4096, 2, 0,
            CUPTI_ACTIVITY_MEMORY_KIND_PINNED));
  h.add(mem(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION, 0, 0x2000, 4096, 3, 0,
            CUPTI_ACTIVITY_MEMORY_KIND_MANAGED));
  h.add(mem(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION, 0, 0x3000, 4096, 4, 0,
            CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE));
  h.add(mem(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION, 0, 0x4000, 64, 5, 0,
            CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC));
  h.add(mem(CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION, 0, 0x5000, 64, 6, 0,
            static_cast<CUpti_ActivityMemoryKind>(42)));
  h.add(alloc(0, 0x100000, 8192, 7));
  const ConvertStats& st = h.conv.stats();
  EXPECT_EQ(st.memory_records, 7u);
  EXPECT_EQ(st.other_kind[CUPTI_ACTIVITY_MEMORY_KIND_PINNED], 2u);
  EXPECT_EQ(st.other_kind[CUPTI_ACTIVITY_MEMORY_KIND_MANAGED], 1u);
  EXPECT_EQ(st.other_kind[CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE], 1u);
  EXPECT_EQ(st.other_kind[CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC], 1u);
  EXPECT_EQ(st.other_kind[7], 1u);  // unknown kinds land in the last slot
  EXPECT_EQ(st.device_allocs, 1u);
  format::Snapshot snap = h.finish();
  EXPECT_EQ(snap.events.size(), 2u);
}

TEST(CuptiConvert, UnmatchedReleaseIsWrittenAndCounted) {
  Harness h;
  h.add(release(0, 0x9000000, 2048, 50, 5));  // allocated before recording began
  h.add(release(0, 0xa000000, 0, 60));        // no size: nothing to write
  h.add(alloc(0, 0xb000000, 512, 70));
  const ConvertStats& st = h.conv.stats();
  EXPECT_EQ(st.unmatched_releases, 2u);
  EXPECT_EQ(st.device_releases, 1u);
  format::Snapshot snap = h.finish();
  ASSERT_EQ(snap.events.size(), 5u);
  auto result = analysis::analyzeSnapshot(snap);
  ASSERT_EQ(result.devices.size(), 1u);
  const auto& d = result.devices[0];
  expectNoErrors(d);
  // Replay counts it alive from the start, as for a PyTorch history cut by its ring buffer.
  EXPECT_EQ(d.summary.start.reserved, 2048u);
  EXPECT_EQ(d.summary.peak_reserved.bytes, 2048u);
  EXPECT_EQ(d.summary.final_replayed.reserved, 512u);
}

TEST(CuptiConvert, DoubleAllocationClosesTheOldOne) {
  Harness h;
  h.add(alloc(0, 0x9000000, 4096, 10));
  h.add(alloc(0, 0x9000000, 1024, 20));    // the release between was lost
  h.add(release(0, 0x9000000, 4096, 30));  // size differs from the live allocation's
  const ConvertStats& st = h.conv.stats();
  EXPECT_EQ(st.double_allocs, 1u);
  EXPECT_EQ(st.release_size_mismatch, 1u);
  format::Snapshot snap = h.finish();
  auto result = analysis::analyzeSnapshot(snap);
  ASSERT_EQ(result.devices.size(), 1u);
  expectNoErrors(result.devices[0]);
  EXPECT_EQ(result.devices[0].summary.peak_reserved.bytes, 4096u);
  EXPECT_EQ(result.devices[0].summary.final_replayed.reserved, 0u);
}

TEST(CuptiConvert, VirtualMemoryMappings) {
  Harness h;
  const uint64_t base = 0x7a0000000000;
  h.conv.ignoreCorrelation(99);
  h.conv.addMap(0, base, 2 * kMiB, 100, 31, h.batch);
  h.conv.addMap(0, base + 2 * kMiB, 2 * kMiB, 110, 32, h.batch);
  h.conv.addMap(1, base + 8 * kMiB, 2 * kMiB, 120, 33, h.batch);
  // An activity record of a VMM call (already traced from its callback) is not counted twice.
  h.add(alloc(0, base, 2 * kMiB, 100, 99));
  h.conv.addUnmap(base, 4 * kMiB, 200, 34, h.batch);          // both mappings of device 0
  h.conv.addUnmap(base + 16 * kMiB, kMiB, 210, 35, h.batch);  // nothing there
  h.conv.addUnmap(base + 9 * kMiB, kMiB, 220, 36, h.batch);   // half of a mapping: not traced
  const ConvertStats& st = h.conv.stats();
  EXPECT_EQ(st.vmm_maps, 3u);
  EXPECT_EQ(st.vmm_unmaps, 3u);
  EXPECT_EQ(st.vmm_records_ignored, 1u);
  EXPECT_EQ(st.vmm_unmatched_unmaps, 2u);
  EXPECT_EQ(st.vmm_partial_unmaps, 1u);
  EXPECT_EQ(st.device_allocs, 0u);
  format::Snapshot snap = h.finish();
  ASSERT_EQ(snap.traceCount(), 2u);
  auto t0 = snap.trace(0);
  ASSERT_EQ(t0.size(), 4u + 6u);
  EXPECT_EQ(t0[0].action, Action::SegmentMap);
  EXPECT_EQ(t0[9].action, Action::SegmentUnmap);
  auto result = analysis::analyzeSnapshot(snap);
  const auto* d0 = deviceOf(result, 0);
  ASSERT_TRUE(d0);
  EXPECT_EQ(d0->summary.peak_reserved.bytes, 4 * kMiB);
  EXPECT_EQ(d0->summary.final_replayed.reserved, 0u);
  expectNoErrors(*d0);
  const auto* d1 = deviceOf(result, 1);
  ASSERT_TRUE(d1);
  EXPECT_EQ(d1->summary.final_replayed.reserved, 2 * kMiB);
}

TEST(CuptiConvert, TimeConversion) {
  Harness h(-500'000);                      // CUPTI clock 0.5 ms ahead of the epoch clock
  h.add(alloc(0, 0x1000, 512, 2'500'000));  // 2.5 ms - 0.5 ms = 2000 us
  h.add(alloc(0, 0x2000, 512, 0));          // no timestamp
  h.add(alloc(0, 0x3000, 512, 100));        // before the epoch after the offset: no time
  ASSERT_EQ(h.batch.size(), 6u);
  EXPECT_EQ(h.batch[0].event.time_us, 2000);
  EXPECT_EQ(h.batch[2].event.time_us, -1);
  EXPECT_EQ(h.batch[4].event.time_us, -1);
}

TEST(CuptiConvert, BatchesAreWrittenInTimeOrder) {
  // Activity records and callback-derived mappings arrive separately; a batch is sorted by time,
  // events of the same time keep their emission order (segment before its alloc).
  Harness h;
  h.add(alloc(0, 0x1000, 512, 300));
  h.conv.addMap(0, 0x7a0000000000, 2 * kMiB, 100, 0, h.batch);
  h.add(alloc(0, 0x2000, 512, 200));
  Converter::sortBatch(h.batch);
  ASSERT_EQ(h.batch.size(), 6u);
  EXPECT_EQ(h.batch[0].timestamp_ns, 100u);
  EXPECT_EQ(h.batch[0].event.action, uint8_t(Action::SegmentMap));
  EXPECT_EQ(h.batch[1].event.action, uint8_t(Action::Alloc));
  EXPECT_EQ(h.batch[2].timestamp_ns, 200u);
  EXPECT_EQ(h.batch[2].event.action, uint8_t(Action::SegmentAlloc));
  EXPECT_EQ(h.batch[3].event.addr, 0x2000u);
  EXPECT_EQ(h.batch[5].timestamp_ns, 300u);
}

TEST(CuptiConvert, OtherActivityKindsAreCounted) {
  Harness h;
  CUpti_Activity other{};
  other.kind = CUPTI_ACTIVITY_KIND_KERNEL;
  h.conv.addRecord(other, h.batch);
  auto bad = alloc(0, 0x1000, 512, 1);
  bad.memoryOperationType = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_INVALID;
  h.add(bad);
  EXPECT_EQ(h.conv.stats().other_records, 1u);
  EXPECT_EQ(h.conv.stats().invalid_operations, 1u);
  EXPECT_TRUE(h.batch.empty());
}

}  // namespace
}  // namespace memforensics::capture::cupti
