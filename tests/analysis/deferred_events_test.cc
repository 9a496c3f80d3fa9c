// deferred_events_test.cc: a native trace loaded for `analyze` keeps its events encoded
// (LoadOptions::defer_events, Snapshot::deferred) and a reader takes one device at a time through
// format::DeviceEvents. Each device must decode to exactly what the whole-file load stores, the
// OOM index must be the same, analyzeSnapshot must give the same result (its sessions hold their
// device's events), and Snapshot::trace() must refuse a deferred snapshot instead of decoding
// anything behind its caller's back.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "fixtures/interleaved_capture.h"
#include "fixtures/model_builder.h"
#include "format/load/load.h"
#include "format/load/snapshot_trace.h"
#include "format/pickle/snapshot_pickle.h"
#include "format/trace/trace_writer.h"
#include "report/render.h"

namespace memforensics::analysis {
namespace {

using format::Event;
using format::Snapshot;
using memforensics::testing::Frames;
using memforensics::testing::ModelBuilder;

constexpr uint64_t kBase = 0x7f0000000000ULL;
constexpr uint64_t kMiB = 1048576;

std::vector<uint8_t> toTrace(const Snapshot& s, uint32_t chunk_bytes, int zstd_level) {
  format::trace::VectorSink sink;
  format::TraceWriteOptions wo;
  wo.chunk_bytes = chunk_bytes;
  wo.zstd_level = zstd_level;
  EXPECT_TRUE(format::writeSnapshotTrace(s, sink, wo).ok());
  return sink.data;
}

Snapshot load(std::span<const uint8_t> bin, bool defer, int threads) {
  format::LoadOptions lo;
  lo.defer_events = defer;
  lo.threads = threads;
  auto s = format::loadSnapshotBytes(bin, lo);
  EXPECT_TRUE(s.ok()) << s.error().describe();
  return s.ok() ? std::move(*s) : Snapshot{};
}

// Each device of `def`, decoded in its scope, against `ref`'s stored events: every field and id.
void expectSameEvents(const Snapshot& ref, const Snapshot& def, const std::string& what) {
  ASSERT_EQ(def.trace_begin, ref.trace_begin) << what;
  ASSERT_EQ(def.eventCount(), ref.events.size()) << what;
  EXPECT_EQ(def.strings.size(), ref.strings.size()) << what;
  EXPECT_EQ(def.stacks.stackCount(), ref.stacks.stackCount()) << what;
  EXPECT_EQ(def.event_notes.size(), ref.event_notes.size()) << what;
  for (size_t d = 0; d < ref.traceCount(); ++d) {
    const format::DeviceEvents events(def, d);
    EXPECT_TRUE(events.decoded()) << what;
    const auto a = ref.trace(d), b = events.span();
    ASSERT_EQ(a.size(), b.size()) << what << ", device " << d;
    for (size_t i = 0; i < a.size(); ++i) {
      const Event &x = a[i], &y = b[i];
      ASSERT_TRUE(x.addr == y.addr && x.size == y.size && x.stream == y.stream &&
                  x.time_us == y.time_us && x.stack == y.stack && x.notes == y.notes &&
                  x.pool == y.pool && x.action == y.action && x.category == y.category)
          << what << ", device " << d << ", event " << i;
    }
    // A copy shares the decoded events (no second decode).
    const format::DeviceEvents copy = events;
    EXPECT_EQ(copy.span().data(), events.span().data()) << what;
  }
  const auto &ro = ref.ooms, &doo = def.ooms;
  ASSERT_EQ(ro.size(), doo.size()) << what;
  for (size_t k = 0; k < ro.size(); ++k) {
    EXPECT_EQ(ro[k].device, doo[k].device) << what << ", OOM " << k;
    EXPECT_EQ(ro[k].event, doo[k].event) << what << ", OOM " << k;
    EXPECT_EQ(ro[k].time_us, doo[k].time_us) << what << ", OOM " << k;
  }
}

std::string analyzeJson(const Snapshot& s, size_t threads, std::string* text = nullptr) {
  AnalyzeOptions opt;
  opt.threads = threads;
  AnalysisResult r = analyzeSnapshot(s, opt);
  if (text != nullptr) {
    std::ostringstream t;
    report::renderText(r, t);
    *text = t.str();
  }
  return report::renderJsonString(r);
}

// Converted, loaded both ways and compared: per device, then through the whole analysis; last,
// Snapshot::trace() refuses the deferred snapshot and nothing decoded the whole file.
void checkFile(const Snapshot& source, const std::string& name) {
  for (const auto& [chunk_bytes, level] :
       {std::pair<uint32_t, int>{4096, 0}, {4096, 3}, {1u << 20, 3}}) {
    const std::string what = name + ", chunks of " + std::to_string(chunk_bytes) + " bytes, zstd " +
                             std::to_string(level);
    const auto bin = toTrace(source, chunk_bytes, level);
    const Snapshot ref = load(bin, false, 2);
    ASSERT_FALSE(ref.deferred) << what;
    for (int threads : {1, 2}) {
      const Snapshot def = load(bin, true, threads);
      ASSERT_TRUE(def.deferred) << what;
      EXPECT_TRUE(def.events.empty()) << what;
      expectSameEvents(ref, def, what + ", " + std::to_string(threads) + " load threads");
      std::string ref_text, def_text;
      const std::string ref_json = analyzeJson(ref, 1, &ref_text);
      for (size_t at : {size_t{1}, size_t{2}}) {
        EXPECT_EQ(analyzeJson(def, at, &def_text), ref_json) << what << ", " << at << " threads";
        EXPECT_EQ(def_text, ref_text) << what << ", " << at << " threads";
      }
      // A reader that asks the snapshot itself is refused, loudly, for every device with events.
      for (size_t d = 0; d < def.traceCount(); ++d) {
        if (def.traceSize(d) > 0) {
          EXPECT_THROW(def.trace(d), std::logic_error) << what;
        }
      }
      EXPECT_TRUE(def.events.empty()) << what;
    }
  }
}

// 24 devices of different shapes, every third one OOMs; device 5 has no events (an empty trace
// between others).
Snapshot manyDevices() {
  ModelBuilder b;
  for (int64_t d = 0; d < 24; ++d) {
    const uint64_t seg = 64 * kMiB;
    b.device(d).segment(kBase).freeBlock(seg);
    if (d == 5) continue;
    const Frames line = {{"/home/u/model.py", 10 + static_cast<uint64_t>(d % 7), "forward"},
                         {"/home/u/train.py", 100, "main"}};
    int64_t t = 1 + d * 1000;
    b.segmentAlloc(kBase, seg, {.time_us = t++});
    const uint64_t a = (1 + static_cast<uint64_t>(d % 5)) * kMiB + static_cast<uint64_t>(d) * 512;
    for (int it = 0; it < 40; ++it) {
      b.alloc(kBase, a, {.time_us = t++, .frames = line});
      b.free(kBase, a, {.time_us = t++});
    }
    if (d % 3 == 1) b.oom(128 * kMiB, 0, {.time_us = t++});
    if (d % 2 == 0) b.alloc(kBase + 16 * kMiB, 3 * kMiB, {.time_us = t++, .frames = line});
  }
  return b.build();
}

TEST(DeferredEvents, ManyDevicesWithOomsDecodeAndAnalyzeAsTheWholeFile) {
  checkFile(manyDevices(), "24 devices");
}

// Snapshot::ooms is a fact of the file each reader fills with the events: the pickle reader, the
// native trace's serial, threaded and deferred readers all list every OOM, by device then event.
TEST(DeferredEvents, EveryReaderIndexesTheOomsByDeviceThenEvent) {
  const Snapshot source = manyDevices();
  // manyDevices: every third device from 1 OOMs once, after its segment_alloc and 40 allocs, each
  // freed by a free_requested and a free_completed: event 1 + 40 * 3.
  std::vector<std::pair<int64_t, int64_t>> expect;
  for (int64_t d = 1; d < 24; d += 3) expect.push_back({d, 121});
  auto listed = [](const Snapshot& s) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const format::OomRef& o : s.ooms) {
      out.push_back({o.device, o.event});
      // Each entry names an OOM of its device's trace, at its time.
      const format::DeviceEvents ev(s, static_cast<size_t>(o.device));
      EXPECT_EQ(ev.span()[static_cast<size_t>(o.event)].action, format::Action::Oom);
      EXPECT_EQ(ev.span()[static_cast<size_t>(o.event)].time_us, o.time_us);
    }
    return out;
  };
  EXPECT_EQ(listed(source), expect) << "the fixture";
  std::vector<uint8_t> pickle;
  ASSERT_TRUE(format::writeSnapshotPickle(source, [&](std::span<const uint8_t> piece) {
                pickle.insert(pickle.end(), piece.begin(), piece.end());
                return Status::Ok();
              }).ok());
  EXPECT_EQ(listed(load(pickle, false, 1)), expect) << "pickle";
  const auto bin = toTrace(source, 4096, 3);
  EXPECT_EQ(listed(load(bin, false, 1)), expect) << "native trace, serial";
  EXPECT_EQ(listed(load(bin, false, 2)), expect) << "native trace, threaded";
  const Snapshot def = load(bin, true, 2);
  ASSERT_TRUE(def.deferred);
  EXPECT_EQ(listed(def), expect) << "native trace, deferred";
}

TEST(DeferredEvents, FourDeviceScenarioDecodesAndAnalyzesAsTheWholeFile) {
  auto snap = format::loadSnapshotFile(std::string(MEMF_SOURCE_DIR) +
                                       "/snapshots/scenarios/dp_imbalance_oom.pickle");
  ASSERT_TRUE(snap.ok());
  checkFile(*snap, "dp_imbalance_oom");
}

TEST(DeferredEvents, RealSnapshotsDecodeAndAnalyzeAsTheWholeFile) {
  const std::filesystem::path dir(MEMF_REAL_SNAPSHOTS);
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is not there";
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".pickle") continue;
    auto snap = format::loadSnapshotFile(entry.path().string());
    if (!snap.ok() || snap->events.empty()) continue;
    checkFile(*snap, entry.path().filename().string());
    ++n;
  }
  EXPECT_GT(n, 3u);
}

// A capture of several devices, interleaved within chunks and across them, with OOMs, unknown
// actions, context strings, a device without events, and no final state
// (fixtures/interleaved_capture.h): the runs of each device are found in file order, and the end
// state is rebuilt from the events one device at a time.
TEST(DeferredEvents, InterleavedCaptureWithoutFinalStateDecodesPerDevice) {
  using format::trace::kHeaderSize;
  for (int level : {0, 3}) {
    const std::vector<uint8_t> data = memforensics::testing::interleavedCapture(
        {.zstd_level = level, .chunk_bytes = 2048, .checkpoint_every = 700, .oom_every = 50});
    const std::string what = "interleaved, zstd " + std::to_string(level);
    const Snapshot ref = load(data, false, 2);
    ASSERT_EQ(ref.traceCount(), 5u) << what;
    ASSERT_GT(ref.ooms.size(), 100u) << what;
    for (int threads : {1, 2, 3}) {
      const Snapshot def = load(data, true, threads);
      ASSERT_TRUE(def.deferred) << what;
      expectSameEvents(ref, def, what + ", " + std::to_string(threads) + " threads");
      // The end state rebuilt from the events, as the whole-file load rebuilds it.
      ASSERT_EQ(def.segments.size(), ref.segments.size()) << what;
      ASSERT_EQ(def.blocks.size(), ref.blocks.size()) << what;
      for (size_t b = 0; b < ref.blocks.size(); ++b) {
        EXPECT_EQ(def.blocks[b].address, ref.blocks[b].address) << what;
        EXPECT_EQ(def.blocks[b].size, ref.blocks[b].size) << what;
      }
      EXPECT_EQ(def.load_warnings, ref.load_warnings) << what;
      EXPECT_EQ(analyzeJson(def, 2), analyzeJson(ref, 1)) << what;
    }
    // Cut short anywhere: the complete chunks, deferred as the whole load reads them.
    for (size_t k = 1; k < 10; ++k) {
      const size_t cut = kHeaderSize + (data.size() - kHeaderSize) * k / 10;
      const std::span<const uint8_t> part(data.data(), cut);
      const std::string at = what + ", cut at " + std::to_string(cut);
      const Snapshot whole = load(part, false, 2);
      const Snapshot def = load(part, true, 2);
      ASSERT_TRUE(def.deferred) << at;
      expectSameEvents(whole, def, at);
      EXPECT_EQ(def.load_warnings, whole.load_warnings) << at;
      EXPECT_EQ(analyzeJson(def, 2), analyzeJson(whole, 1)) << at;
    }
  }
}

// Only a native trace read on threads defers; other inputs, and the serial reader, ignore it.
TEST(DeferredEvents, OtherInputsAndTheSerialReaderKeepTheirEvents) {
  const Snapshot source = manyDevices();
  const auto bin = toTrace(source, 4096, 3);
  format::LoadOptions lo;
  lo.defer_events = true;
  auto serial = format::readSnapshotTraceSerial(bin, lo);
  ASSERT_TRUE(serial.ok());
  EXPECT_FALSE(serial->deferred);
  EXPECT_EQ(serial->events.size(), serial->eventCount());
  auto pickle = format::loadSnapshotFile(
      std::string(MEMF_SOURCE_DIR) + "/snapshots/scenarios/dp_imbalance_oom.pickle", lo);
  ASSERT_TRUE(pickle.ok());
  EXPECT_FALSE(pickle->deferred);
  EXPECT_GT(pickle->events.size(), 0u);
  // A file damaged in the middle goes to the serial reader (its salvage is the reference).
  std::vector<uint8_t> damaged = bin;
  damaged[damaged.size() / 2] ^= 0x55;
  lo.salvage = true;
  auto salvaged = format::loadSnapshotBytes(damaged, lo);
  ASSERT_TRUE(salvaged.ok()) << salvaged.error().describe();
  EXPECT_FALSE(salvaged->deferred);
}

}  // namespace
}  // namespace memforensics::analysis
