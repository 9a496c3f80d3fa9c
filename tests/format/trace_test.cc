// trace_test.cc: the native trace format: encoding round trips, conversions of every real
// snapshot, cut-off and damaged files, versions, checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "analysis/analyze.h"
#include "fixtures/interleaved_capture.h"
#include "fixtures/real_snapshots.h"
#include "fixtures/snapshot_builder.h"
#include "fixtures/snapshot_compare.h"
#include "format/load/load.h"
#include "format/load/snapshot_trace.h"
#include "format/trace/trace_reader.h"
#include "format/trace/trace_writer.h"
#include "report/render.h"

namespace memforensics {
namespace {

namespace fs = std::filesystem;
using namespace format;
using namespace format::trace;
using testing::snapshotDiff;

std::vector<fs::path> realSnapshots() {
  return testing::realSnapshotPaths();
}

std::vector<uint8_t> toTrace(const Snapshot& s, const TraceWriteOptions& opt = {}) {
  VectorSink sink;
  Status st = writeSnapshotTrace(s, sink, opt);
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
  return std::move(sink.data);
}

// Device figures of `analyze --json`: what must not change with the file format.
std::string deviceFigures(const Snapshot& s) {
  auto r = analysis::analyzeSnapshot(s);
  std::ostringstream o;
  report::renderJson(r, o);
  auto j = o.str();
  // Keys are sorted: "devices" comes just before "input".
  auto k = j.find("\"devices\"");
  auto e = j.find("\"input\"");
  EXPECT_TRUE(k != std::string::npos && e > k);
  return j.substr(k, e - k);
}

// Offsets of every chunk boundary (after the header, after each chunk).
std::vector<size_t> chunkBoundaries(std::span<const uint8_t> b) {
  std::vector<size_t> out{kHeaderSize};
  size_t pos = kHeaderSize;
  while (pos + kChunkHeaderSize <= b.size()) {
    uint8_t type = b[pos];
    pos += kChunkHeaderSize + getU32(b.data() + pos + 4);
    out.push_back(pos);
    if (type == static_cast<uint8_t>(ChunkType::Trailer)) break;
  }
  return out;
}

TEST(TraceFormat, Crc32cKnownValue) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c({reinterpret_cast<const uint8_t*>(s.data()), s.size()}), 0xE3069283u);
  EXPECT_EQ(crc32c(std::span<const uint8_t>{}), 0u);
}

TEST(TraceFormat, VarintEdges) {
  for (uint64_t v : {uint64_t{0}, uint64_t{127}, uint64_t{128}, uint64_t{1} << 35, ~uint64_t{0}}) {
    uint8_t buf[10];
    uint8_t* e = putVarint(buf, v);
    uint64_t out = 1;
    EXPECT_EQ(getVarint(buf, e, out), e);
    EXPECT_EQ(out, v);
    EXPECT_EQ(getVarint(buf, e - 1, out), nullptr) << "a cut varint is refused";
  }
  for (int64_t v : {int64_t{0}, int64_t{-1}, int64_t{1}, INT64_MIN, INT64_MAX})
    EXPECT_EQ(unzigzag(zigzag(v)), v);
  uint8_t eleven[11] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  uint64_t out;
  EXPECT_EQ(getVarint(eleven, eleven + 11, out), nullptr) << "more than 10 bytes";
  uint8_t big[10] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02};
  EXPECT_EQ(getVarint(big, big + 10, out), nullptr) << "more than 64 bits";
}

// Events with every field exercised go through writer and reader unchanged.
class EventRoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(EventRoundTrip, EveryFieldSurvives) {
  VectorSink sink;
  WriterOptions wo;
  wo.zstd_level = GetParam();
  wo.chunk_bytes = 4096;  // many chunks: deltas restart at each
  wo.checkpoint_every = 1000;
  TraceWriter w(sink, wo);
  ASSERT_TRUE(w.begin(TraceMeta{}).ok());
  uint32_t f1 = w.frame(w.string("a.py"), w.string("f"), 10);
  uint32_t f2 = w.frame(w.string("b.py"), w.string("g"), kUnknownLine);
  uint32_t s1 = w.stack(kTraceRootStack, f1);
  uint32_t s2 = w.stack(s1, f2);
  uint32_t ctx = w.string("Torch-Compiled Region");
  uint32_t odd = w.string("future_action");
  uint32_t pool = w.pool(7, 9);
  std::vector<TraceEvent> in;
  std::mt19937_64 rng(42);
  for (int i = 0; i < 20000; ++i) {
    TraceEvent e;
    e.action = static_cast<uint8_t>(rng() % 11);
    e.addr = (i % 7 == 0) ? rng() : 0x7f0000000000ull + (rng() % 4096) * 512;
    e.size = rng() % 3 == 0 ? rng() : rng() % 100000;
    e.stream = i % 13 == 0 ? static_cast<int64_t>(rng()) : 0;
    e.time_us = i % 17 == 0 ? -1 : 1700000000000000ll + i * 3 - (i % 5 == 0 ? 100 : 0);
    e.device = i % 101 == 0 ? static_cast<uint32_t>(rng() % 8) : 0;
    e.stack = std::array<uint32_t, 4>{kTraceNoStack, kTraceRootStack, s1, s2}[rng() % 4];
    e.compile_context = i % 50 < 3 ? ctx : 0;
    e.user_metadata = i % 70 < 2 ? ctx : 0;
    e.pool = i % 90 < 5 ? pool : 0;
    e.action_name = e.action == 10 ? odd : 0;
    ASSERT_TRUE(w.event(e).ok());
    in.push_back(e);
  }
  w.noteDropped(5);
  ASSERT_TRUE(w.close().ok());
  EXPECT_GT(w.stats().checkpoints, 10u);

  auto r = TraceReader::open(sink.data);
  ASSERT_TRUE(r.ok()) << r.error().message;
  std::vector<TraceEvent> out;
  while ((*r)->next()) {
    for (const auto& e : (*r)->events()) out.push_back(e);
  }
  const TraceEnd& end = (*r)->end();
  EXPECT_TRUE(end.complete) << end.reason;
  EXPECT_EQ(end.lost_bytes, 0u);
  EXPECT_TRUE(end.notes.empty());
  EXPECT_EQ((*r)->trailer().dropped, 5u);
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const auto &a = in[i], &b = out[i];
    ASSERT_TRUE(a.addr == b.addr && a.size == b.size && a.stream == b.stream &&
                a.time_us == b.time_us && a.device == b.device && a.stack == b.stack &&
                a.compile_context == b.compile_context && a.user_metadata == b.user_metadata &&
                a.pool == b.pool && a.action == b.action && a.action_name == b.action_name)
        << "event " << i;
  }
  EXPECT_EQ((*r)->string((*r)->frames()[(*r)->stacks()[s2].frame].name), "g");
  EXPECT_EQ((*r)->frames()[(*r)->stacks()[s2].frame].line, kUnknownLine);
  EXPECT_EQ((*r)->stacks()[s2].parent, s1);
  EXPECT_EQ((*r)->pools()[pool], (std::pair<uint64_t, uint64_t>{7, 9}));

  // State at any event, through checkpoints, equals replaying the events from the start.
  for (uint32_t dev : {0u, 3u}) {
    for (uint64_t at : {uint64_t{0}, uint64_t{1}, uint64_t{999}, uint64_t{5000}, uint64_t{12345}}) {
      DeviceTraceState naive;
      uint64_t seen = 0;
      for (const auto& e : in) {
        if (e.device != dev) continue;
        if (seen++ == at) break;
        naive.apply(e);
      }
      if (naive.events() < at) continue;  // device 3 has few events
      auto st = traceStateAt(sink.data, dev, at);
      ASSERT_TRUE(st.ok()) << st.error().message;
      EXPECT_EQ(st->events(), at);
      EXPECT_EQ(st->reservedBytes(), naive.reservedBytes()) << "device " << dev << " at " << at;
      EXPECT_EQ(st->requestedBytes(), naive.requestedBytes());
      EXPECT_EQ(st->live().size(), naive.live().size());
      EXPECT_TRUE(st->reserved() == naive.reserved());
      naive.live().forEach([&](uint64_t a, const LiveAlloc& l) {
        const LiveAlloc* m = st->live().find(a);
        ASSERT_NE(m, nullptr);
        EXPECT_TRUE(m->requested == l.requested && m->stack == l.stack && m->pending == l.pending &&
                    m->stream == l.stream);
      });
    }
  }
  EXPECT_FALSE(traceStateAt(sink.data, 0, in.size() + 1).ok()) << "past the end is an error";
}

INSTANTIATE_TEST_SUITE_P(Codecs, EventRoundTrip, ::testing::Values(0, 3));

TEST(TraceState, UnmapSplitsRanges) {
  DeviceTraceState s;
  TraceEvent map{0x1000, 0x4000, 0, -1, 0, 0, 0, 0, 0, 0, 5};
  s.apply(map);
  TraceEvent unmap{0x2000, 0x1000, 0, -1, 0, 0, 0, 0, 0, 0, 6};
  s.apply(unmap);
  EXPECT_EQ(s.reservedBytes(), 0x3000u);
  EXPECT_EQ(s.reserved().ranges(), (std::vector<AddressRange>{{0x1000, 0x2000}, {0x3000, 0x5000}}));
}

TEST(TraceFormat, EmptyTraceIsComplete) {
  VectorSink sink;
  TraceWriter w(sink);
  ASSERT_TRUE(w.begin(TraceMeta{}).ok());
  ASSERT_TRUE(w.close().ok());
  auto snap = loadSnapshotBytes(sink.data);
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  EXPECT_EQ(snap->events.size(), 0u);
  EXPECT_EQ(snap->source, SourceFormat::NativeTrace);
  // No final state was written: it is rebuilt (empty) and the reader says so.
  ASSERT_EQ(snap->load_warnings.size(), 1u);
  EXPECT_NE(snap->load_warnings[0].find("no final segment state"), std::string::npos);
}

// A Meta chunk's lists are bounded only by the chunk: 16 M empty lines of source warnings were
// 16 M warnings (1.8 GB). A reader keeps kMaxMetaLines (256) non-empty lines of each and counts
// the rest; empty warning lines are dropped, an empty ignored key is a key.
TEST(TraceFormat, MetaListsKeepTheirFirstLinesAndCountTheRest) {
  std::string warnings(100000, '\n');
  for (int i = 0; i < 300; ++i) warnings += "w" + std::to_string(i) + "\n\n";
  std::string keys;
  for (int i = 0; i < 300; ++i) keys += (i ? "\n" : "") + std::string(i == 1 ? "" : "k");
  VectorSink sink;
  TraceWriter w(sink);
  TraceMeta meta;
  meta.source_format = "json";
  meta.source_warnings = warnings;
  meta.ignored_keys = keys;
  ASSERT_TRUE(w.begin(meta).ok());
  ASSERT_TRUE(w.close().ok());
  auto snap = loadSnapshotBytes(sink.data);
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  std::vector<std::string> source;
  for (const auto& l : snap->load_warnings)
    if (l.rfind("source json: ", 0) == 0) source.push_back(l);
  ASSERT_EQ(source.size(), 257u);
  EXPECT_EQ(source[0], "source json: w0");
  EXPECT_EQ(source[255], "source json: w255");
  EXPECT_EQ(source[256], "source json: 44 more warnings not listed (at most 256)");
  ASSERT_EQ(snap->ignored_keys.size(), 256u);
  EXPECT_EQ(snap->ignored_keys[1], "");
  bool counted = false;
  for (const auto& l : snap->load_warnings)
    counted |= l == "44 more ignored keys not listed (at most 256)";
  EXPECT_TRUE(counted);
}

TEST(TraceFormat, NewerMajorVersionIsRefusedNamingBoth) {
  VectorSink sink;
  TraceWriter w(sink);
  ASSERT_TRUE(w.begin(TraceMeta{}).ok());
  ASSERT_TRUE(w.close().ok());
  auto b = sink.data;
  putU16(b.data() + 8, 2);
  putU16(b.data() + 10, 3);
  putU32(b.data() + 28, crc32c(0, b.data(), 28));
  auto snap = loadSnapshotBytes(b);
  ASSERT_FALSE(snap.ok());
  EXPECT_NE(snap.error().message.find("2.3"), std::string::npos) << snap.error().message;
  EXPECT_NE(snap.error().message.find("1.1"), std::string::npos) << snap.error().message;
}

TEST(TraceFormat, UnknownChunkOfANewerMinorIsSkipped) {
  VectorSink sink;
  TraceWriter w(sink);
  ASSERT_TRUE(w.begin(TraceMeta{}).ok());
  ASSERT_TRUE(w.close().ok());
  // Insert a chunk of type 42 right after the header.
  std::vector<uint8_t> chunk(kChunkHeaderSize + 3, 0);
  chunk[0] = 42;
  putU32(chunk.data() + 4, 3);
  chunk[12] = 1, chunk[13] = 2, chunk[14] = 3;
  uint32_t crc = crc32c(0, chunk.data(), 8);
  putU32(chunk.data() + 8, crc32c(crc, chunk.data() + 12, 3));
  auto b = sink.data;
  b.insert(b.begin() + kHeaderSize, chunk.begin(), chunk.end());
  putU16(b.data() + 10, 7);
  putU32(b.data() + 28, crc32c(0, b.data(), 28));
  auto r = TraceReader::open(b);
  ASSERT_TRUE(r.ok());
  while ((*r)->next()) {
  }
  // The trailer counts chunks, so the extra one shows as a mismatch: a reader must not pretend.
  EXPECT_FALSE((*r)->end().complete);
  EXPECT_NE((*r)->end().reason.find("chunks"), std::string::npos) << (*r)->end().reason;
  bool noted = false;
  for (const auto& n : (*r)->end().notes)
    noted = noted || n.find("unknown type 42") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(TraceFormat, FailedSinkErrorIsSticky) {
  struct Failing : ByteSink {
    int writes = 0;
    Status write(std::span<const uint8_t>) override {
      if (++writes > 2) return Error{"disk full", -1};
      return Status::Ok();
    }
  } sink;
  WriterOptions wo;
  wo.chunk_bytes = 4096;
  TraceWriter w(sink, wo);
  ASSERT_TRUE(w.begin(TraceMeta{}).ok());
  Status last;
  for (int i = 0; i < 10000 && last.ok(); ++i)
    last = w.event(TraceEvent{static_cast<uint64_t>(i) * 512, 512, 0, i, 0, 1, 0, 0, 0, 0, 0});
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(last.error().message, "disk full");
  EXPECT_FALSE(w.close().ok());
}

TEST(TraceFormat, DeviceOrdinalOutOfRangeIsRefused) {
  VectorSink sink;
  TraceWriter w(sink);
  ASSERT_TRUE(w.begin(TraceMeta{}).ok());
  TraceEvent e;
  e.device = kMaxDevice;
  EXPECT_FALSE(w.event(e).ok());
}

// ---------------------------------------------------------------------------------------------
// Conversions of the real snapshots and the sample.

std::vector<fs::path> allInputs() {
  return testing::realSnapshotPathsAndSample();
}

TEST(TraceConversion, RealSnapshotsRoundTripWithIdenticalFigures) {
  auto inputs = allInputs();
  for (const auto& p : inputs) {
    SCOPED_TRACE(p.filename().string());
    auto orig = loadSnapshotFile(p.string());
    ASSERT_TRUE(orig.ok()) << orig.error().message;
    for (int level : {0, 3}) {
      TraceWriteOptions opt;
      opt.zstd_level = level;
      auto bytes = toTrace(*orig, opt);
      auto back = loadSnapshotBytes(bytes);
      ASSERT_TRUE(back.ok()) << back.error().message;
      EXPECT_EQ(snapshotDiff(*orig, *back), "");
      EXPECT_TRUE(back->load_warnings.empty());
      EXPECT_EQ(back->traits.era(), orig->traits.era());
      EXPECT_EQ(deviceFigures(*back), deviceFigures(*orig));
      EXPECT_FALSE(back->origin.empty());
      if (level == 3 && p.parent_path() != fs::path(MEMF_SOURCE_DIR) / "snapshots") {
        // Size target: at most a tenth of the protocol-4 pickle, plus 512 bytes for the parts of
        // fixed size (header, Meta, the settings keys carried as they were, trailer): a 3.3 KB
        // pickle becomes 412 bytes, 82 of them its seven allocator_settings keys.
        EXPECT_LE(bytes.size(), fs::file_size(p) / 10 + 512) << bytes.size() << " bytes";
      }
    }
  }
  if (realSnapshots().empty())
    GTEST_SKIP() << "real snapshots not available; only the sample was checked";
}

// A native trace of a real snapshot with small chunks (many cut points) and checkpoints.
struct Cut {
  Snapshot orig;
  std::vector<uint8_t> bytes;
};
Cut smallChunkTrace(const std::string& name) {
  fs::path p = fs::path(MEMF_REAL_SNAPSHOTS) / name;
  if (!fs::exists(p)) p = fs::path(MEMF_SOURCE_DIR) / "snapshots" / "sample_training.pickle";
  auto orig = loadSnapshotFile(p.string());
  EXPECT_TRUE(orig.ok());
  VectorSink sink;
  TraceWriteOptions opt;
  opt.zstd_level = 1;
  opt.checkpoint_every = 300;
  opt.chunk_bytes = 4096;  // many chunks, hence many cut points
  EXPECT_TRUE(writeSnapshotTrace(*orig, sink, opt).ok());
  return Cut{std::move(*orig), std::move(sink.data)};
}

// What a cut-off or damaged file may read as: an error, or a prefix of the original whose loss
// is stated. Never a silent difference.
void expectErrorOrHonestPrefix(const Snapshot& orig, std::span<const uint8_t> b, size_t cut,
                               bool salvage) {
  LoadOptions lo;
  lo.salvage = salvage;
  auto got = loadSnapshotBytes(b, lo);
  if (!got.ok()) {
    EXPECT_FALSE(got.error().message.empty());
    return;
  }
  testing::CompareOptions co;
  co.prefix = true;
  co.final_state = false;
  EXPECT_EQ(snapshotDiff(orig, *got, co), "") << "cut at " << cut;
  if (got->load_warnings.empty()) {
    // Claimed complete: then it must be the whole thing.
    co.prefix = false;
    co.final_state = true;
    EXPECT_EQ(snapshotDiff(orig, *got, co), "")
        << "cut at " << cut << " read as complete but differs";
  }
}

TEST(TraceTruncation, EveryChunkBoundaryAndRandomBytes) {
  Cut c = smallChunkTrace("zidongliu__decomfl__memory.pickle");
  auto bounds = chunkBoundaries(c.bytes);
  ASSERT_GT(bounds.size(), 5u);
  size_t prev_events = 0;
  for (size_t cut : bounds) {
    if (cut > c.bytes.size()) break;
    std::span<const uint8_t> b(c.bytes.data(), cut);
    auto got = loadSnapshotBytes(b);
    if (cut == kHeaderSize) {
      EXPECT_FALSE(got.ok()) << "nothing but a header is an error, not an empty snapshot";
      continue;
    }
    ASSERT_TRUE(got.ok()) << "cut at chunk boundary " << cut << ": " << got.error().message;
    EXPECT_GE(got->events.size(), prev_events) << "a longer prefix never reads fewer events";
    prev_events = got->events.size();
    expectErrorOrHonestPrefix(c.orig, b, cut, false);
    if (cut + kEndMarkSize < c.bytes.size()) {
      ASSERT_FALSE(got->load_warnings.empty())
          << "cut at " << cut << " must say the file is incomplete";
    }
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    size_t cut = rng() % c.bytes.size();
    expectErrorOrHonestPrefix(c.orig, std::span<const uint8_t>(c.bytes.data(), cut), cut, false);
  }
}

TEST(TraceTruncation, EveryByteOfASmallTrace) {
  auto s = testing::buildSnapshot(testing::TSnapshot{
      {{0,
        0x1000,
        0,
        "large",
        {{2048, 1500, "active_allocated", {{"m.py", 3, "f"}}}, {2048, 0, "inactive", {}}}}},
      {{{"segment_alloc", 0x1000, 4096, 0, 10},
        {"alloc", 0x1000, 1500, 0, 11, {{"m.py", 3, "f"}}, true},
        {"alloc", 0x1800, 100, 0, 12, {{"m.py", 4, "g"}}, true},
        {"free_requested", 0x1800, 100, 0, 13},
        {"free_completed", 0x1800, 100, 0, 14}}}});
  auto bytes = toTrace(s);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    expectErrorOrHonestPrefix(s, std::span<const uint8_t>(bytes.data(), cut), cut, false);
  }
  auto whole = loadSnapshotBytes(bytes);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(snapshotDiff(s, *whole), "");
}

TEST(TraceCorruption, FlippedBytesAreCaught) {
  Cut c = smallChunkTrace("silmont2000__assignment2-systems__mem_snapshot.pickle");
  std::mt19937_64 rng(11);
  size_t errors = 0;
  for (int i = 0; i < 1500; ++i) {
    auto b = c.bytes;
    size_t at = rng() % b.size();
    b[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
    auto got = loadSnapshotBytes(b);
    if (!got.ok()) {
      ++errors;
      continue;
    }
    // Read: only a flip in the end mark (the content is complete and checked) may get here, and
    // the reader still says so.
    EXPECT_GE(at + kEndMarkSize, b.size()) << "flip at " << at << " read without error";
    EXPECT_FALSE(got->load_warnings.empty()) << "flip at " << at;
    EXPECT_EQ(snapshotDiff(c.orig, *got), "") << "flip at " << at;
    // Salvage mode reads a prefix or errors, never garbage.
    expectErrorOrHonestPrefix(c.orig, b, at, true);
  }
  EXPECT_GT(errors, 1450u);
}

TEST(TraceCorruption, SalvageReadsThePrefixBeforeADamagedChunk) {
  Cut c = smallChunkTrace("zidongliu__decomfl__memory.pickle");
  auto bounds = chunkBoundaries(c.bytes);
  ASSERT_GT(bounds.size(), 4u);
  auto b = c.bytes;
  size_t mid = bounds[bounds.size() / 2];
  b[mid + kChunkHeaderSize] ^= 0x55;  // first payload byte of a chunk in the middle
  auto strict = loadSnapshotBytes(b);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.error().message.find("--salvage"), std::string::npos) << strict.error().message;
  EXPECT_EQ(strict.error().offset, static_cast<int64_t>(mid));
  LoadOptions lo;
  lo.salvage = true;
  auto salvaged = loadSnapshotBytes(b, lo);
  ASSERT_TRUE(salvaged.ok()) << salvaged.error().message;
  ASSERT_FALSE(salvaged->load_warnings.empty());
  EXPECT_NE(salvaged->load_warnings[0].find("damaged"), std::string::npos);
  expectErrorOrHonestPrefix(c.orig, b, mid, true);
}

TEST(TraceTruncation, KilledWriterWithoutFinalStateIsRebuiltFromEvents) {
  // A writer that never reaches close(): flushed chunks are all there is.
  VectorSink sink;
  WriterOptions wo;
  TraceWriter w(sink, wo);
  ASSERT_TRUE(w.begin(TraceMeta{}).ok());
  uint32_t f = w.frame(w.string("train.py"), w.string("step"), 42);
  uint32_t st = w.stack(kTraceRootStack, f);
  auto ev = [&](uint8_t action, uint64_t addr, uint64_t size, int64_t t) {
    TraceEvent e;
    e.action = action;
    e.addr = addr;
    e.size = size;
    e.time_us = t;
    e.stack = st;
    ASSERT_TRUE(w.event(e).ok());
  };
  ev(3, 0x10000, 1 << 21, 1);  // segment_alloc 2 MiB
  ev(0, 0x10000, 1000, 2);     // alloc
  ev(0, 0x10400, 3000, 3);     // alloc
  ev(1, 0x10000, 1000, 4);     // free_requested
  ev(0, 0x900000, 512, 5);     // alloc outside every recorded segment
  ASSERT_TRUE(w.flush().ok());
  auto snap = loadSnapshotBytes(sink.data);
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  ASSERT_EQ(snap->events.size(), 5u);
  ASSERT_EQ(snap->load_warnings.size(), 2u);
  EXPECT_NE(snap->load_warnings[0].find("without a trailer"), std::string::npos)
      << snap->load_warnings[0];
  EXPECT_NE(snap->load_warnings[1].find("rebuilt"), std::string::npos);
  EXPECT_NE(snap->load_warnings[1].find("1 live allocations lie outside"), std::string::npos);
  ASSERT_EQ(snap->segments.size(), 2u);
  EXPECT_EQ(snap->segments[0].total_size, 1u << 21);
  auto blocks = snap->blocksOf(snap->segments[0]);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].state, BlockState::ActivePendingFree);
  EXPECT_EQ(blocks[0].size, 1024u);
  EXPECT_EQ(blocks[1].state, BlockState::ActiveAllocated);
  EXPECT_EQ(blocks[1].requested_size, 3000u);
  EXPECT_EQ(blocks[2].state, BlockState::Inactive);
  EXPECT_EQ(snapshotDiff(*snap, *snap), "");
  // Replay of the rebuilt state is consistent: no error anomaly.
  auto r = analysis::analyzeSnapshot(*snap);
  ASSERT_EQ(r.devices.size(), 1u);
  for (const auto& a : r.devices[0].anomalies)
    EXPECT_NE(a.severity, replay::Severity::Error) << a.id;
  // free_requested does not lower requested bytes (free_completed does): 1000 + 3000 + 512.
  EXPECT_EQ(r.devices[0].summary.peak_requested.bytes, 4512u);
}

TEST(TraceConversion, FileWriteIsAtomic) {
  auto s = testing::buildSnapshot(testing::TSnapshot{{}, {{{"alloc", 0x1000, 10, 0, 1}}}});
  fs::path dir = fs::temp_directory_path() / ("memf_trace_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string out = (dir / "x.bin").string();
  ASSERT_TRUE(writeSnapshotTraceFile(s, out).ok());
  auto back = loadSnapshotFile(out);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->events.size(), 1u);
  EXPECT_FALSE(writeSnapshotTraceFile(s, (dir / "missing" / "x.bin").string()).ok());
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u) << "no temporary file left behind";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memforensics

namespace memforensics {
namespace {

using namespace format;
using namespace format::trace;

TEST(TraceConversion, InterleavedDevicesAreGroupedPerDevice) {
  VectorSink sink;
  TraceWriter w(sink);
  ASSERT_TRUE(w.begin(TraceMeta{}).ok());
  // device order 0, 2, 0, 1, 2: the reader must group them and keep each device's order.
  const uint32_t order[] = {0, 2, 0, 1, 2, 2, 0};
  for (size_t i = 0; i < std::size(order); ++i) {
    TraceEvent e;
    e.action = 0;
    e.device = order[i];
    e.addr = 0x1000 * (i + 1);
    e.size = 100 + i;
    e.time_us = static_cast<int64_t>(i);
    ASSERT_TRUE(w.event(e).ok());
  }
  ASSERT_TRUE(w.close().ok());
  auto s = loadSnapshotBytes(sink.data);
  ASSERT_TRUE(s.ok()) << s.error().message;
  ASSERT_EQ(s->traceCount(), 3u);
  auto sizes = [&](size_t d) {
    std::vector<uint64_t> v;
    for (const Event& e : s->trace(d)) v.push_back(e.size);
    return v;
  };
  EXPECT_EQ(sizes(0), (std::vector<uint64_t>{100, 102, 106}));
  EXPECT_EQ(sizes(1), (std::vector<uint64_t>{103}));
  EXPECT_EQ(sizes(2), (std::vector<uint64_t>{101, 104, 105}));
}

TEST(TraceConversion, DeviceGapsKeepTraceIndexEqualToOrdinal) {
  VectorSink sink;
  TraceWriter w(sink);
  ASSERT_TRUE(w.begin(TraceMeta{}).ok());
  for (uint32_t d : {1u, 3u}) {
    TraceEvent e;
    e.action = 0;
    e.device = d;
    e.addr = 0x1000 * d;
    e.size = d;
    ASSERT_TRUE(w.event(e).ok());
  }
  ASSERT_TRUE(w.close().ok());
  auto s = loadSnapshotBytes(sink.data);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->traceCount(), 4u);
  EXPECT_EQ(s->trace(0).size(), 0u);
  ASSERT_EQ(s->trace(1).size(), 1u);
  EXPECT_EQ(s->trace(1)[0].size, 1u);
  EXPECT_EQ(s->trace(2).size(), 0u);
  ASSERT_EQ(s->trace(3).size(), 1u);
  EXPECT_EQ(s->trace(3)[0].size, 3u);
}

// ---------------------------------------------------------------------------------------------
// The parallel load (LoadOptions::threads) against the serial reader: the same Snapshot, id for
// id, on the real snapshots converted, on a many-device multi-chunk trace, and on cut and damaged
// files (the same error, offset and warnings, with and without salvage).

// "" when equal in every field, ids included (not only by content); else the first difference.
std::string exactDiff(const Snapshot& a, const Snapshot& b) {
  std::ostringstream o;
  if (a.strings.size() != b.strings.size()) return "string count";
  for (size_t i = 0; i < a.strings.size(); ++i)
    if (a.strings.get(static_cast<StrId>(i)) != b.strings.get(static_cast<StrId>(i)))
      return "string " + std::to_string(i);
  if (a.stacks.frameCount() != b.stacks.frameCount()) return "frame count";
  for (size_t i = 0; i < a.stacks.frameCount(); ++i)
    if (!(a.stacks.frame(static_cast<FrameId>(i)) == b.stacks.frame(static_cast<FrameId>(i))))
      return "frame " + std::to_string(i);
  if (a.stacks.stackCount() != b.stacks.stackCount()) return "stack count";
  for (size_t i = 0; i < a.stacks.stackCount(); ++i) {
    auto x = a.stacks.stack(static_cast<StackId>(i)), y = b.stacks.stack(static_cast<StackId>(i));
    if (!std::equal(x.begin(), x.end(), y.begin(), y.end())) return "stack " + std::to_string(i);
  }
  if (a.events.size() != b.events.size())
    return "event count " + std::to_string(a.events.size()) + " vs " +
           std::to_string(b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    const Event &x = a.events[i], &y = b.events[i];
    if (x.addr != y.addr || x.size != y.size || x.stream != y.stream || x.time_us != y.time_us ||
        x.stack != y.stack || !(a.notesOf(x) == b.notesOf(y)) || x.pool != y.pool ||
        x.action != y.action || x.category != y.category)
      return "event " + std::to_string(i);
  }
  if (a.trace_begin != b.trace_begin) return "trace_begin";
  if (a.pools != b.pools) return "pools";
  if (a.segments.size() != b.segments.size() || a.blocks.size() != b.blocks.size())
    return "segment or block count";
  for (size_t i = 0; i < a.segments.size(); ++i) {
    const Segment &x = a.segments[i], &y = b.segments[i];
    if (x.device != y.device || x.address != y.address || x.total_size != y.total_size ||
        x.allocated_size != y.allocated_size || x.active_size != y.active_size ||
        x.requested_size != y.requested_size || x.stream != y.stream || x.pool_a != y.pool_a ||
        x.pool_b != y.pool_b || x.stack != y.stack || x.segment_type != y.segment_type ||
        x.is_large != y.is_large || x.is_expandable != y.is_expandable ||
        x.first_block != y.first_block || x.block_count != y.block_count)
      return "segment " + std::to_string(i);
  }
  for (size_t i = 0; i < a.blocks.size(); ++i) {
    const Block &x = a.blocks[i], &y = b.blocks[i];
    if (x.address != y.address || x.size != y.size || x.requested_size != y.requested_size ||
        x.stack != y.stack || x.state != y.state || x.has_requested_size != y.has_requested_size)
      return "block " + std::to_string(i);
  }
  if (a.annotations.size() != b.annotations.size()) return "annotation count";
  for (size_t i = 0; i < a.annotations.size(); ++i) {
    const Annotation &x = a.annotations[i], &y = b.annotations[i];
    if (x.device != y.device || x.time_us != y.time_us || x.name != y.name || x.stage != y.stage)
      return "annotation " + std::to_string(i);
  }
  if (traitsToBits(a.traits) != traitsToBits(b.traits)) return "traits";
  if (a.load_warnings != b.load_warnings) return "load_warnings";
  if (a.ignored_keys != b.ignored_keys) return "ignored_keys";
  if (a.origin != b.origin || a.live_capture != b.live_capture) return "origin";
  if (a.host_trace_events != b.host_trace_events || a.has_segment_info != b.has_segment_info ||
      a.input_bytes != b.input_bytes || a.source != b.source)
    return "header fields";
  if (a.settings.present != b.settings.present || a.settings.conf != b.settings.conf ||
      a.settings.max_split_size != b.settings.max_split_size)
    return "settings";
  return "";
}

// Serial and parallel (1, 2, 3 and 8 threads) reads of `b` agree: the same Snapshot, or the same
// error at the same offset.
void expectSameAsSerial(std::span<const uint8_t> b, bool salvage, const std::string& what) {
  LoadOptions lo;
  lo.salvage = salvage;
  auto ref = readSnapshotTraceSerial(b, lo);
  for (int threads : {1, 2, 3, 8}) {
    lo.threads = threads;
    auto got = readSnapshotTrace(b, lo);
    ASSERT_EQ(ref.ok(), got.ok()) << what << ", " << threads << " threads: "
                                  << (ref.ok() ? got.error().message : ref.error().message);
    if (!ref.ok()) {
      EXPECT_EQ(ref.error().message, got.error().message) << what << ", " << threads;
      EXPECT_EQ(ref.error().offset, got.error().offset) << what << ", " << threads;
    } else {
      EXPECT_EQ(exactDiff(*ref, *got), "") << what << ", " << threads << " threads";
    }
  }
}

// A many-device trace of many chunks: `devices` devices, stacks shared across devices and new
// ones on later devices (so that ids are created across chunks), unknown actions with their
// names, compile contexts and pools.
Snapshot manyDevices(size_t devices, size_t per_device) {
  Snapshot s;
  s.traits.has_device_traces = true;
  s.traits.has_time_us = true;
  s.traits.has_compile_context = true;
  s.pools.push_back({7, 1});
  s.trace_begin.push_back(0);
  std::mt19937_64 rng(42);
  for (size_t d = 0; d < devices; ++d) {
    for (size_t i = 0; i < per_device; ++i) {
      const size_t variant = (d * 7 + i / 5) % (8 + d);
      std::vector<FrameId> frames;
      for (size_t k = 0; k < 1 + variant % 6; ++k) {
        frames.push_back(s.stacks.internFrame(
            Frame{s.strings.intern("f" + std::to_string(variant) + "_" + std::to_string(k) + ".py"),
                  s.strings.intern("fn" + std::to_string(k)), 10 + k}));
      }
      Event e;
      const int kind = static_cast<int>(rng() % 10);
      e.action = kind == 9 ? Action::Unknown : (kind % 2 ? Action::FreeCompleted : Action::Alloc);
      e.addr = (d << 40) + (i % 64) * 4096;
      e.size = 512 * (1 + i % 17);
      e.stream = static_cast<int64_t>(i % 3);
      e.time_us = static_cast<int64_t>(1000 + d * per_device + i);
      e.stack = i % 11 == 0 ? kNoStack : s.stacks.internStack(frames);
      e.notes = s.event_notes.intern(EventNotes{
          s.strings.intern(i % 13 == 0 ? "ctx" + std::to_string(d % 4) : "N/A"), kEmptyStr,
          e.action == Action::Unknown ? s.strings.intern("custom_" + std::to_string(i % 3))
                                      : kEmptyStr});
      e.pool = i % 17 == 0 ? 1 : 0;
      s.events.push_back(e);
    }
    s.trace_begin.push_back(s.events.size());
  }
  return s;
}

TEST(TraceParallel, RealSnapshotsConvertedReadTheSameWithAnyThreadCount) {
  size_t n = 0;
  // The sample too: a clone without ../shared still checks one real-shaped file.
  for (const auto& p : testing::realSnapshotPathsAndSample()) {
    auto orig = loadSnapshotFile(p.string());
    ASSERT_TRUE(orig.ok()) << p;
    for (uint32_t chunk_bytes : {1u << 20, 4096u}) {
      TraceWriteOptions opt;
      opt.chunk_bytes = chunk_bytes;
      opt.checkpoint_every = chunk_bytes == 4096 ? 300 : 1u << 18;
      auto bin = toTrace(*orig, opt);
      expectSameAsSerial(bin, false, p.filename().string());
    }
    ++n;
  }
  EXPECT_GT(n, 0u);
}

TEST(TraceParallel, ManyDevicesManyChunks) {
  Snapshot s = manyDevices(40, 3000);
  for (int level : {0, 3}) {
    TraceWriteOptions opt;
    opt.zstd_level = level;
    opt.chunk_bytes = 8192;  // hundreds of Events chunks
    opt.checkpoint_every = 5000;
    auto bin = toTrace(s, opt);
    expectSameAsSerial(bin, false, "level " + std::to_string(level));
    LoadOptions lo;
    lo.threads = 4;
    auto got = readSnapshotTrace(bin, lo);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->events.size(), s.events.size());
    EXPECT_EQ(got->traceCount(), 40u);
  }
}

TEST(TraceParallel, CutAndDamagedFilesGiveTheSerialResult) {
  Snapshot s = manyDevices(6, 2000);
  TraceWriteOptions opt;
  opt.zstd_level = 1;
  opt.chunk_bytes = 4096;
  opt.checkpoint_every = 700;
  auto bin = toTrace(s, opt);
  // Every chunk boundary and a few bytes either side of it.
  std::vector<size_t> cuts;
  size_t pos = kHeaderSize;
  while (pos + kChunkHeaderSize <= bin.size()) {
    uint8_t type = bin[pos];
    for (size_t d : {0, 1, 7, 13}) cuts.push_back(pos + d);
    pos += kChunkHeaderSize + getU32(bin.data() + pos + 4);
    if (type == static_cast<uint8_t>(ChunkType::Trailer)) break;
  }
  ASSERT_GT(cuts.size(), 40u);
  for (size_t cut : cuts) {
    if (cut >= bin.size()) continue;
    std::span<const uint8_t> part(bin.data(), cut);
    expectSameAsSerial(part, false, "cut at " + std::to_string(cut));
  }
  // Flipped bytes: a checksum failure, or a decoding failure in fuzz builds; with and without
  // salvage.
  std::mt19937 rng(7);
  for (int k = 0; k < 60; ++k) {
    auto bad = bin;
    const size_t at = kHeaderSize + rng() % (bad.size() - kHeaderSize);
    bad[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
    expectSameAsSerial(bad, false, "flip at " + std::to_string(at));
    expectSameAsSerial(bad, true, "flip at " + std::to_string(at) + ", salvage");
  }
}

TEST(TraceParallel, DamagedEventsChunkWithAValidChecksumIsTheSerialError) {
  // An Events chunk that passes its checksum but refers to an undefined stack (rewritten with a
  // fresh CRC): the parallel path must report the serial reader's message and offset.
  Snapshot s = manyDevices(3, 3000);
  TraceWriteOptions opt;
  opt.zstd_level = 0;
  opt.chunk_bytes = 4096;
  auto bin = toTrace(s, opt);
  size_t pos = kHeaderSize, events_seen = 0, target = 0;
  while (pos + kChunkHeaderSize <= bin.size()) {
    if (bin[pos] == static_cast<uint8_t>(ChunkType::Events) && ++events_seen == 5) {
      target = pos;
      break;
    }
    pos += kChunkHeaderSize + getU32(bin.data() + pos + 4);
  }
  ASSERT_NE(target, 0u);
  // Find the first record with a stack delta (head bit 7 clear) and make its delta huge.
  const uint32_t stored = getU32(bin.data() + target + 4);
  std::vector<uint8_t> payload(bin.begin() + target + kChunkHeaderSize,
                               bin.begin() + target + kChunkHeaderSize + stored);
  // Rewrite the chunk: same records, plus the trailing garbage the serial reader refuses.
  payload.push_back(0x42);
  std::vector<uint8_t> out(bin.begin(), bin.begin() + target);
  uint8_t h[kChunkHeaderSize] = {static_cast<uint8_t>(ChunkType::Events), 0, 0, 0};
  putU32(h + 4, static_cast<uint32_t>(payload.size()));
  uint32_t crc = crc32c(0, h, 8);
  crc = crc32c(crc, payload.data(), payload.size());
  putU32(h + 8, crc);
  out.insert(out.end(), h, h + kChunkHeaderSize);
  out.insert(out.end(), payload.begin(), payload.end());
  out.insert(out.end(), bin.begin() + target + kChunkHeaderSize + stored, bin.end());
  LoadOptions lo;
  auto ref = readSnapshotTraceSerial(out, lo);
  ASSERT_FALSE(ref.ok());
  EXPECT_NE(ref.error().message.find("bytes after the last of"), std::string::npos)
      << ref.error().message;
  expectSameAsSerial(out, false, "extra byte in an Events chunk");
  expectSameAsSerial(out, true, "extra byte in an Events chunk, salvage");
}

TEST(TraceParallel, InterleavedDevicesAreReadOnThreadsAsTheSerialReaderGroupsThem) {
  for (int level : {0, 3}) {
    const auto bin = testing::interleavedCapture({.zstd_level = level});
    const std::string what = "interleaved, level " + std::to_string(level);
    auto ref = readSnapshotTraceSerial(bin);
    ASSERT_TRUE(ref.ok()) << ref.error().message;
    ASSERT_EQ(ref->traceCount(), 5u);
    EXPECT_EQ(ref->trace(3).size(), 0u);
    EXPECT_EQ(ref->events.size(), 12000u);
    // The parallel path itself takes the file (no hand-over to the serial reader).
    for (int threads : {1, 2, 3, 8}) {
      LoadOptions lo;
      lo.threads = threads;
      auto got = readSnapshotTraceParallelOnly(bin, lo);
      ASSERT_TRUE(got.has_value()) << what << ", " << threads << " threads";
      ASSERT_TRUE(got->ok()) << got->error().message;
      EXPECT_EQ(exactDiff(*ref, **got), "") << what << ", " << threads << " threads";
    }
    expectSameAsSerial(bin, false, what);
    for (size_t k = 1; k < 24; ++k) {
      const size_t cut = kHeaderSize + (bin.size() - kHeaderSize) * k / 24;
      expectSameAsSerial(std::span<const uint8_t>(bin.data(), cut), false,
                         what + ", cut at " + std::to_string(cut));
    }
  }
}

// The chunks of `bin` (offsets of their headers), up to and with the trailer.
std::vector<size_t> chunkOffsets(const std::vector<uint8_t>& bin) {
  std::vector<size_t> at;
  size_t pos = kHeaderSize;
  while (pos + kChunkHeaderSize <= bin.size()) {
    at.push_back(pos);
    const uint8_t type = bin[pos];
    pos += kChunkHeaderSize + getU32(bin.data() + pos + 4);
    if (type == static_cast<uint8_t>(ChunkType::Trailer)) break;
  }
  return at;
}

// `bin` with the `remove` bytes at `at` replaced by an uncompressed chunk of `type` holding
// `payload`, with a valid checksum.
std::vector<uint8_t> withChunk(const std::vector<uint8_t>& bin, size_t at, size_t remove,
                               ChunkType type, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out(bin.begin(), bin.begin() + static_cast<ptrdiff_t>(at));
  uint8_t h[kChunkHeaderSize] = {static_cast<uint8_t>(type), 0, 0, 0};
  putU32(h + 4, static_cast<uint32_t>(payload.size()));
  uint32_t crc = crc32c(0, h, 8);
  crc = crc32c(crc, payload.data(), payload.size());
  putU32(h + 8, crc);
  out.insert(out.end(), h, h + kChunkHeaderSize);
  out.insert(out.end(), payload.begin(), payload.end());
  out.insert(out.end(), bin.begin() + static_cast<ptrdiff_t>(at + remove), bin.end());
  return out;
}

void putVar(std::vector<uint8_t>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

TEST(TraceParallel, CheckpointAndSegmentsChunksCheckedOnThreadsGiveTheSerialResult) {
  // Checkpoint chunks are checked and the Segments chunk decoded on the loading threads against
  // no tables; the reader accepts them only when the stacks and strings they refer to are
  // defined when it reaches them. Forged chunks (valid checksums) that refer to stacks not
  // defined there must give the serial reader's error, those that do not its Snapshot.
  Snapshot s = manyDevices(5, 3000);
  for (size_t d = 0; d < 3; ++d) {
    Segment g;
    g.device = static_cast<int64_t>(d);
    g.address = (uint64_t{d} << 40) + (1u << 20);
    g.total_size = 3 * 4096;
    g.allocated_size = g.active_size = g.requested_size = 4096;
    g.segment_type = s.strings.intern("large");
    g.is_large = true;
    g.first_block = static_cast<uint32_t>(s.blocks.size());
    g.block_count = 3;
    for (int k = 0; k < 3; ++k) {
      s.blocks.push_back(
          Block{g.address + 4096u * k, 4096, k == 0 ? 4000u : 0u, s.events[d * 3000 + 1 + k].stack,
                k == 0 ? BlockState::ActiveAllocated : BlockState::Inactive, k == 0});
    }
    s.segments.push_back(g);
  }
  TraceWriteOptions opt;
  opt.zstd_level = 0;
  opt.chunk_bytes = 8192;
  opt.checkpoint_every = 2000;
  const auto bin = toTrace(s, opt);
  size_t checkpoints = 0, first_checkpoint = 0, segments_at = 0, meta_end = 0;
  for (size_t at : chunkOffsets(bin)) {
    if (bin[at] == static_cast<uint8_t>(ChunkType::Checkpoint) && checkpoints++ == 0)
      first_checkpoint = at;
    if (bin[at] == static_cast<uint8_t>(ChunkType::Segments)) segments_at = at;
    if (bin[at] == static_cast<uint8_t>(ChunkType::Meta))
      meta_end = at + kChunkHeaderSize + getU32(bin.data() + at + 4);
  }
  ASSERT_GE(checkpoints, 3u);
  ASSERT_NE(segments_at, 0u);
  ASSERT_NE(meta_end, 0u);
  expectSameAsSerial(bin, false, "checkpoints and segments");
  {
    LoadOptions lo;
    lo.threads = 2;
    auto got = readSnapshotTraceParallelOnly(bin, lo);
    ASSERT_TRUE(got.has_value());  // read on the threads, not handed to the serial reader
    ASSERT_TRUE(got->ok());
    auto ref = readSnapshotTraceSerial(bin);
    ASSERT_TRUE(ref.ok());
    EXPECT_EQ(exactDiff(*ref, **got), "");
    EXPECT_EQ((*got)->blocks.size(), 9u);
  }
  const uint64_t undefined = 1u << 20;  // no stack of the file has this id
  // The first checkpoint moved to right after the Meta chunk, before any Stacks chunk (the chunk
  // count stays), with one live block on device 0 of stack `stack`.
  auto checkpoint = [&](uint64_t stack) {
    std::vector<uint8_t> p;
    putVar(p, 1);          // devices
    putVar(p, 0);          // device 0
    putVar(p, 0);          // events
    putVar(p, 1);          // live blocks
    putVar(p, 4096);       // address
    putVar(p, 512);        // requested
    putVar(p, stack * 2);  // zigzag stack delta
    putVar(p, 0);          // stream
    p.push_back(0);        // not pending
    putVar(p, 0);          // segments
    std::vector<uint8_t> moved(bin);
    moved.erase(moved.begin() + static_cast<ptrdiff_t>(first_checkpoint),
                moved.begin() + static_cast<ptrdiff_t>(first_checkpoint + kChunkHeaderSize +
                                                       getU32(bin.data() + first_checkpoint + 4)));
    return withChunk(moved, meta_end, 0, ChunkType::Checkpoint, p);
  };
  for (uint64_t stack : {uint64_t{kTraceRootStack}, uint64_t{2}, undefined}) {
    const auto forged = checkpoint(stack);
    const std::string what = "checkpoint with stack " + std::to_string(stack);
    auto ref = readSnapshotTraceSerial(forged);
    EXPECT_EQ(ref.ok(), stack == kTraceRootStack)
        << what << ": " << (ref.ok() ? "" : ref.error().message);
    expectSameAsSerial(forged, false, what);
    expectSameAsSerial(forged, true, what + ", salvage");
  }
  // The Segments chunk replaced by one segment of one block whose stack is `stack`.
  auto segments = [&](uint64_t stack) {
    std::vector<uint8_t> p;
    putVar(p, 1);                                                // segments
    putVar(p, 1);                                                // blocks
    putVar(p, 0);                                                // device
    for (uint64_t v : {4096, 512, 512, 512, 512}) putVar(p, v);  // address, sizes
    putVar(p, 0);                                                // stream
    putVar(p, 0);                                                // pool_a
    putVar(p, 0);                                                // pool_b
    putVar(p, kTraceRootStack);                                  // the segment's stack
    p.push_back(1 | 4);                                          // large, usual type
    putVar(p, 1);                                                // its blocks
    putVar(p, 0);                                                // address delta
    p.push_back(0);                                              // flags: state 0
    putVar(p, 512);                                              // size
    putVar(p, stack);                                            // the block's stack
    const size_t stored = getU32(bin.data() + segments_at + 4);
    return withChunk(bin, segments_at, kChunkHeaderSize + stored, ChunkType::Segments, p);
  };
  for (uint64_t stack : {uint64_t{kTraceRootStack}, undefined}) {
    const auto forged = segments(stack);
    const std::string what = "segments with a block of stack " + std::to_string(stack);
    auto ref = readSnapshotTraceSerial(forged);
    ASSERT_EQ(ref.ok(), stack == kTraceRootStack) << what << ": " << ref.error().message;
    if (ref.ok()) EXPECT_EQ(ref->blocks.size(), 1u);
    expectSameAsSerial(forged, false, what);
    expectSameAsSerial(forged, true, what + ", salvage");
  }
  // Two Segments chunks: the second is refused as before.
  {
    const size_t stored = getU32(bin.data() + segments_at + 4);
    std::vector<uint8_t> copy(
        bin.begin() + static_cast<ptrdiff_t>(segments_at + kChunkHeaderSize),
        bin.begin() + static_cast<ptrdiff_t>(segments_at + kChunkHeaderSize + stored));
    const auto twice = withChunk(bin, segments_at, 0, ChunkType::Segments, copy);
    ASSERT_FALSE(readSnapshotTraceSerial(twice).ok());
    expectSameAsSerial(twice, false, "two segments chunks");
    expectSameAsSerial(twice, true, "two segments chunks, salvage");
  }
}

TEST(TraceParallel, ThreadCountIsCapped) {
  EXPECT_EQ(traceLoadThreads(1, 100), 1u);
  EXPECT_EQ(traceLoadThreads(4, 2), 2u);
  EXPECT_EQ(traceLoadThreads(1000, 1000), kMaxTraceLoadThreads);
  EXPECT_GE(traceLoadThreads(0, 1000), 1u);
  EXPECT_EQ(traceLoadThreads(0, 0), 1u);
}

}  // namespace
}  // namespace memforensics
