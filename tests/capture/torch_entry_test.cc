// torch_entry_test.cc: fabricated c10 TraceEntry fields -> ring records -> trace events, and the
// raw clock -> microseconds conversion (src/capture/torch_entry.h, record.h).
#include "capture/torch_entry.h"

#include <gtest/gtest.h>

#include <ctime>
#include <memory>
#include <string>
#include <utility>

#include "capture/recorder.h"
#include "capture_test_util.h"
#include "format/load/load.h"
#include "format/pickle/snapshot_pickle.h"

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

// Stand-ins shaped like c10's TraceEntry in PyTorch 2.6 (no mempool_, no strings) and 2.14
// (mempool_, compile_context_, user_metadata_, ANNOTATE): the field names and kinds of the real
// headers (../shared/pytorch-headers), which scripts/torch-headers-check.sh compiles against.
union FakeTime {
  time_t t_;
  uint64_t approx_t_;
};
struct Entry26 {
  enum Action {
    ALLOC,
    FREE_REQUESTED,
    FREE_COMPLETED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    SNAPSHOT,
    OOM
  };
  Action action_ = ALLOC;
  int8_t device_ = 0;
  size_t addr_ = 0;
  std::shared_ptr<void> context_;
  void* stream_ = nullptr;
  size_t size_ = 0;
  FakeTime time_{};
};
struct Entry214 {
  enum Action {
    ALLOC,
    FREE_REQUESTED,
    FREE_COMPLETED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    SNAPSHOT,
    OOM,
    ANNOTATE
  };
  Action action_ = ALLOC;
  int8_t device_ = 0;
  size_t addr_ = 0;
  std::shared_ptr<void> context_;
  void* stream_ = nullptr;
  size_t size_ = 0;
  std::pair<uint64_t, uint64_t> mempool_{0, 0};
  FakeTime time_{};
  std::string compile_context_;
  std::string user_metadata_;
};

TEST(TorchEntry, FeaturesAreDetectedPerVersion) {
  static_assert(!mc::kEntryHasMempool<Entry26> && mc::kEntryHasMempool<Entry214>);
  static_assert(!mc::kEntryHasCompileContext<Entry26> && mc::kEntryHasCompileContext<Entry214>);
  static_assert(!mc::kEntryHasUserMetadata<Entry26> && mc::kEntryHasUserMetadata<Entry214>);
  static_assert(!mc::kEntryHasAnnotate<Entry26> && mc::kEntryHasAnnotate<Entry214>);

  Entry26 old;
  old.action_ = Entry26::OOM;
  old.device_ = 2;
  old.addr_ = 1u << 20;
  old.size_ = 3u << 30;
  old.stream_ = reinterpret_cast<void*>(0x5000);
  old.time_.approx_t_ = 123456789;
  mc::TorchEntry t = mc::fromC10(old);
  EXPECT_EQ(t.action, 8);
  EXPECT_EQ(t.device, 2);
  EXPECT_EQ(t.addr, 1u << 20);
  EXPECT_EQ(t.size, 3u << 30);
  EXPECT_EQ(t.stream, 0x5000);
  EXPECT_EQ(t.time_ticks, 123456789u);
  EXPECT_EQ(t.pool_a, 0u);
  EXPECT_FALSE(t.compile_na);
  EXPECT_EQ(mc::textOf(old), nullptr);

  Entry214 now;
  now.action_ = Entry214::ANNOTATE;
  now.addr_ = 0x7f00'0000'1000;
  now.mempool_ = {3, 7};
  now.compile_context_ = "N/A";
  now.user_metadata_ = R"({"layer": "attn.0"})";
  t = mc::fromC10(now);
  EXPECT_EQ(t.action, 9);
  EXPECT_EQ(t.pool_a, 3u);
  EXPECT_EQ(t.pool_b, 7u);
  EXPECT_TRUE(t.compile_na);  // a flag: no string copied for it
  EXPECT_EQ(mc::toRecord(t).flags & mc::kCompileNA, mc::kCompileNA);
  auto text = mc::textOf(now);
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(text->compile_context, "");
  EXPECT_EQ(text->user_metadata, R"({"layer": "attn.0"})");

  // The common 2.8+ entry: compile_context "N/A", no metadata: nothing to allocate.
  now.user_metadata_.clear();
  EXPECT_EQ(mc::textOf(now), nullptr);
  now.compile_context_ = "Torch-Compiled Region: 0/1";
  text = mc::textOf(now);
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(text->compile_context, "Torch-Compiled Region: 0/1");
  EXPECT_FALSE(mc::fromC10(now).compile_na);
}

TEST(TorchEntry, LongTextIsCutAtACharacterBoundary) {
  Entry214 e;
  // 3-byte characters: kMaxRecordTextBytes (65536) is not a multiple of 3, so the cut must step
  // back to the start of a character.
  std::string s;
  while (s.size() < mc::kMaxRecordTextBytes + 10) s += "\xe2\x82\xac";  // U+20AC
  e.user_metadata_ = s;
  auto text = mc::textOf(e);
  ASSERT_NE(text, nullptr);
  EXPECT_LE(text->user_metadata.size(), mc::kMaxRecordTextBytes);
  EXPECT_EQ(text->user_metadata.size() % 3, 0u);
  EXPECT_EQ(text->user_metadata, s.substr(0, text->user_metadata.size()));
  EXPECT_GT(text->user_metadata.size(), mc::kMaxRecordTextBytes - 3);
}

// Allocators with the two snapshot() signatures: with include_traces, the history is left out.
struct AllocatorBefore {
  int calls = 0;
  std::string snapshot() {
    ++calls;
    return "with traces";
  }
};
struct AllocatorAfter {
  std::string snapshot(std::pair<uint64_t, uint64_t> pool = {0, 0}, bool include_traces = true) {
    return std::to_string(pool.first) + "," + std::to_string(pool.second) +
           (include_traces ? " with traces" : " without traces");
  }
};

TEST(TorchEntry, FinalSnapshotLeavesTheHistoryOutWhereItCan) {
  static_assert(!mc::kSnapshotTakesIncludeTraces<AllocatorBefore>);
  static_assert(mc::kSnapshotTakesIncludeTraces<AllocatorAfter>);
  AllocatorBefore before;
  EXPECT_EQ(mc::snapshotWithoutTraces(before), "with traces");
  EXPECT_EQ(before.calls, 1);
  AllocatorAfter after;
  EXPECT_EQ(mc::snapshotWithoutTraces(after), "0,0 without traces");  // every pool, no history
}

// The strings through the recorder into the file, as the loader gives them to the analysis:
// compile_context "N/A" from the flag, user metadata and a compile context from RecordText, an
// ANNOTATE entry's payload; with native stacks too.
TEST(TorchEntry, EntryStringsReachTheLoadedSnapshot) {
  const std::string path = mc::testing::tempPath("torch_text.bin");
  mc::RecorderOptions o;
  o.text = true;
  o.native_depth = 8;
  o.traits = memforensics::format::trace::traits::kCompileContext |
             memforensics::format::trace::traits::kUserMetadata |
             memforensics::format::trace::traits::kAnnotateAction;
  auto r = mc::Recorder::create(path, o);
  ASSERT_TRUE(r.ok());
  const uint64_t seg = 0x7f00'0000'0000;
  struct Step {
    Entry214::Action action;
    uint64_t addr, size;
    const char* compile;
    const char* user;
    bool native;
  } steps[] = {
      {Entry214::SEGMENT_ALLOC, seg, 2u << 20, "N/A", "", false},
      {Entry214::ALLOC, seg, 4096, "N/A", "step=1", false},
      {Entry214::ANNOTATE, seg, 0, "N/A", R"({"tag": "kv-cache"})", false},
      {Entry214::ALLOC, seg + 4096, 512, "Torch-Compiled Region: 0/0", "", true},
      {Entry214::FREE_REQUESTED, seg, 4096, "", "", false},
  };
  for (const Step& s : steps) {
    Entry214 e;
    e.action_ = s.action;
    e.addr_ = s.addr;
    e.size_ = s.size;
    e.time_.approx_t_ = mc::monotonicTicks();
    e.compile_context_ = s.compile;
    e.user_metadata_ = s.user;
    const mc::CaptureRecord rec = mc::toRecord(mc::fromC10(e));
    if (s.native) {
      ASSERT_TRUE((*r)->recordNative(rec, 1, mc::textOf(e)));
    } else {
      ASSERT_TRUE((*r)->record(rec, nullptr, mc::textOf(e)));
    }
  }
  ASSERT_TRUE((*r)->stop().ok());
  auto snap = memforensics::format::loadSnapshotFile(path);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  auto tr = snap->trace(0);
  ASSERT_EQ(tr.size(), std::size(steps));
  for (size_t i = 0; i < tr.size(); ++i) {
    const auto& n = snap->notesOf(tr[i]);
    EXPECT_EQ(static_cast<int>(tr[i].action), static_cast<int>(steps[i].action)) << i;
    EXPECT_EQ(snap->strings.get(n.compile_context), steps[i].compile) << i;
    EXPECT_EQ(snap->strings.get(n.user_metadata), steps[i].user) << i;
  }
  EXPECT_NE(tr[3].stack, 0u);  // the native stack is kept beside the strings

  // Exported as PyTorch writes them: the pickle carries both keys on every entry.
  std::vector<uint8_t> pickle;
  ASSERT_TRUE(memforensics::format::writeSnapshotPickle(*snap, [&](std::span<const uint8_t> b) {
                pickle.insert(pickle.end(), b.begin(), b.end());
                return memforensics::Status::Ok();
              }).ok());
  auto back = memforensics::format::loadSnapshotBytes(pickle);
  ASSERT_TRUE(back.ok()) << back.error().describe();
  EXPECT_TRUE(back->traits.has_compile_context);
  EXPECT_TRUE(back->traits.has_user_metadata);
  auto tb = back->trace(0);
  ASSERT_EQ(tb.size(), std::size(steps));
  for (size_t i = 0; i < tb.size(); ++i) {
    const auto& n = back->notesOf(tb[i]);
    EXPECT_EQ(back->strings.get(n.compile_context), steps[i].compile) << i;
    EXPECT_EQ(back->strings.get(n.user_metadata), steps[i].user) << i;
  }
}

TEST(TorchEntry, UnchangedStringsAreSharedNotCopied) {
  Entry214 e;
  e.compile_context_ = "N/A";
  e.user_metadata_ = "epoch=3";
  auto first = mc::textOf(e);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(mc::textOf(e, first), first);  // the same strings: the same object
  e.user_metadata_ = "epoch=4";
  auto second = mc::textOf(e, first);
  ASSERT_NE(second, nullptr);
  EXPECT_NE(second, first);
  EXPECT_EQ(second->user_metadata, "epoch=4");
  e.user_metadata_.clear();
  EXPECT_EQ(mc::textOf(e, second), nullptr);  // nothing to carry: no object at all
}

TEST(TorchEntry, TextOfARefusedRecordStaysWithTheCaller) {
  const std::string path = mc::testing::tempPath("torch_full.bin");
  mc::RecorderOptions o;
  o.text = true;
  o.ring_capacity = 2;
  o.poll_us = 1'000'000;  // the writer does not drain while the ring fills
  auto r = mc::Recorder::create(path, o);
  ASSERT_TRUE(r.ok());
  auto text = std::make_shared<const mc::RecordText>(mc::RecordText{"", "payload"});
  std::weak_ptr<const mc::RecordText> watch = text;
  int accepted = 0, refused = 0;
  for (int i = 0; i < 8; ++i) {
    Entry214 e;
    e.size_ = 64;
    std::shared_ptr<const mc::RecordText> mine = text;
    if ((*r)->record(mc::toRecord(mc::fromC10(e)), nullptr, std::move(mine))) {
      ++accepted;
      EXPECT_EQ(mine, nullptr);  // moved into the side slot
    } else {
      ++refused;
      EXPECT_EQ(mine, text);  // not taken: the caller still holds it
    }
  }
  EXPECT_GE(refused, 1);
  text.reset();
  ASSERT_TRUE((*r)->stop().ok());
  r->reset();
  EXPECT_TRUE(watch.expired());  // every copy released once the recorder is gone
  auto snap = memforensics::format::loadSnapshotFile(path);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  ASSERT_EQ(snap->trace(0).size(), static_cast<size_t>(accepted));
  for (const auto& ev : snap->trace(0))
    EXPECT_EQ(snap->strings.get(snap->notesOf(ev).user_metadata), "payload");
}

TEST(TorchEntry, StringsAreDroppedWhenTheRecorderKeepsNone) {
  const std::string path = mc::testing::tempPath("torch_notext.bin");
  auto r = mc::Recorder::create(path, {});  // options.text false: no side slot
  ASSERT_TRUE(r.ok());
  Entry214 e;
  e.size_ = 64;
  e.compile_context_ = "N/A";
  e.user_metadata_ = "kept only with options.text";
  ASSERT_TRUE((*r)->record(mc::toRecord(mc::fromC10(e)), nullptr, mc::textOf(e)));
  ASSERT_TRUE((*r)->stop().ok());
  auto snap = memforensics::format::loadSnapshotFile(path);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  ASSERT_EQ(snap->trace(0).size(), 1u);
  const auto& n = snap->notesOf(snap->trace(0)[0]);
  EXPECT_EQ(snap->strings.get(n.compile_context), "N/A");  // the flag needs no side slot
  EXPECT_EQ(snap->strings.get(n.user_metadata), "");
}

}  // namespace
