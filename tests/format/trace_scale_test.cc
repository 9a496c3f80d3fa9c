// trace_scale_test.cc: "what we write, we read" for the native trace and the pickle writer.
//
// The limits shared by writer and reader (trace_format.h) tested at and past their edges: highly
// repetitive event loops, a 100,000-frame stack, device 65536, empty device traces, zstd bombs,
// a hostile stack trie, a forged trailer count, an over-long varint; invalid UTF-8 through the
// pickle writer checked by Python's own unpickler; and a round trip of >= 5 M events.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/sanitizers.h"
#include "format/load/snapshot_trace.h"
#include "format/pickle/pickle_reader.h"
#include "format/pickle/pickle_writer.h"
#include "format/pickle/snapshot_pickle.h"
#include "format/trace/trace_reader.h"
#include "format/trace/trace_writer.h"

namespace memforensics {
namespace {

namespace fs = std::filesystem;
using namespace format;
using namespace format::trace;

// ---------------------------------------------------------------------------------------------
// Building snapshots in memory, comparing them fast (ids differ between readers: compare content).

struct Gen {
  Snapshot s;
  std::vector<std::vector<Event>> traces;

  Gen() {
    s.traits.has_device_traces = true;
    s.traits.has_block_address = true;
    s.traits.has_segment_pool_id = true;
    s.traits.has_time_us = true;
    s.traits.has_annotations_key = true;
  }
  // A stack `depth` frames deep; `variant` changes the innermost frames so that stacks share
  // their outer part (as real stacks do).
  StackId stack(int variant, int depth) {
    std::vector<FrameId> frames;
    frames.reserve(depth);
    for (int k = 0; k < depth; ++k) {
      const bool inner = k < 3;
      // Outer frames: few distinct strings (as real stacks), distinct by their line.
      std::string file = inner ? "model/layer" + std::to_string(variant) + ".py"
                               : "torch/nn/module" + std::to_string((depth - k) % 40) + ".py";
      std::string name =
          inner ? "forward_" + std::to_string(variant) + "_" + std::to_string(k) : "_call_impl";
      const uint64_t line = inner ? static_cast<uint64_t>(k + 1) : static_cast<uint64_t>(depth - k);
      frames.push_back(
          s.stacks.internFrame(Frame{s.strings.intern(file), s.strings.intern(name), line}));
    }
    return s.stacks.internStack(frames);
  }
  void event(size_t device, Action a, uint64_t addr, uint64_t size, int64_t stream, int64_t t,
             StackId st) {
    if (traces.size() <= device) traces.resize(device + 1);
    Event e;
    e.action = a;
    e.addr = addr;
    e.size = size;
    e.stream = stream;
    e.time_us = t;
    e.stack = st;
    traces[device].push_back(e);
  }
  // A repetitive alloc / free_requested / free_completed loop over 16 slots of a 1 GiB segment
  // that ends with everything freed, plus the segment in the final state.
  // varied = false: one slot, one stream (every cycle identical but for its time).
  void loop(size_t device, uint64_t base, size_t events, const std::vector<StackId>& stacks,
            int64_t t0, bool varied = true) {
    if (traces.size() <= device) traces.resize(device + 1);
    traces[device].reserve(traces[device].size() + events + 2);
    const uint64_t seg = 1ull << 30;
    int64_t t = t0;
    event(device, Action::SegmentAlloc, base, seg, 0, t++, stacks[0]);
    size_t n = 1;
    for (size_t i = 0; n + 3 <= events; ++i) {
      const size_t slot = varied ? i % 16 : 0;
      const uint64_t addr = base + slot * (32u << 20);
      const uint64_t size = (slot + 1) * 512;
      const int64_t stream = (varied && i % 7 == 0) ? 7 : 0;
      const StackId st = stacks[i % stacks.size()];
      event(device, Action::Alloc, addr, size, stream, t++, st);
      event(device, Action::FreeRequested, addr, size, stream, t++, st);
      event(device, Action::FreeCompleted, addr, size, stream, t++, st);
      n += 3;
    }
    Segment g;
    g.device = static_cast<int64_t>(device);
    g.address = base;
    g.total_size = seg;
    g.segment_type = s.strings.intern("large");
    g.first_block = static_cast<uint32_t>(s.blocks.size());
    g.block_count = 1;
    s.blocks.push_back(Block{base, seg, 0, kNoStack, BlockState::Inactive, false});
    s.segments.push_back(g);
  }
  // Moves the per-device traces into the model (count = number of device traces, >= used).
  Snapshot finish(size_t count) {
    if (traces.size() < count) traces.resize(count);
    s.trace_begin.assign(1, 0);
    size_t total = 0;
    for (const auto& v : traces) total += v.size();
    s.events.reserve(total);
    for (auto& v : traces) {
      s.events.insert(s.events.end(), v.begin(), v.end());
      s.trace_begin.push_back(s.events.size());
      std::vector<Event>().swap(v);
    }
    if (traces.empty()) s.trace_begin.clear();
    return std::move(s);
  }
};

// Content comparison of two snapshots: every event of every device and every stack (frame by
// frame), segments and blocks. Stack and string ids are mapped once per id.
class Same {
 public:
  Same(const Snapshot& a, const Snapshot& b) : a_(a), b_(b) {}
  std::string diff() {
    if (a_.traceCount() != b_.traceCount()) {
      return std::to_string(a_.traceCount()) + " vs " + std::to_string(b_.traceCount()) +
             " device traces";
    }
    if (a_.traits.era() != b_.traits.era())
      return "era " + a_.traits.era() + " vs " + b_.traits.era();
    for (size_t d = 0; d < a_.traceCount(); ++d) {
      auto ta = a_.trace(d), tb = b_.trace(d);
      if (ta.size() != tb.size()) {
        return "device " + std::to_string(d) + ": " + std::to_string(ta.size()) + " vs " +
               std::to_string(tb.size()) + " events";
      }
      for (size_t i = 0; i < ta.size(); ++i) {
        const Event& x = ta[i];
        const Event& y = tb[i];
        if (x.action != y.action || x.addr != y.addr || x.size != y.size || x.stream != y.stream ||
            x.time_us != y.time_us ||
            !str(a_.notesOf(x).compile_context, b_.notesOf(y).compile_context) ||
            !str(a_.notesOf(x).user_metadata, b_.notesOf(y).user_metadata) ||
            !str(a_.notesOf(x).action_name, b_.notesOf(y).action_name) ||
            a_.pools.at(x.pool) != b_.pools.at(y.pool) || !stack(x.stack, y.stack)) {
          return "device " + std::to_string(d) + " event " + std::to_string(i) + " differs";
        }
      }
    }
    if (a_.segments.size() != b_.segments.size()) return "segment counts differ";
    for (size_t i = 0; i < a_.segments.size(); ++i) {
      const Segment& x = a_.segments[i];
      const Segment& y = b_.segments[i];
      if (x.device != y.device || x.address != y.address || x.total_size != y.total_size ||
          x.allocated_size != y.allocated_size || x.block_count != y.block_count ||
          !stack(x.stack, y.stack) || !str(x.segment_type, y.segment_type)) {
        return "segment " + std::to_string(i) + " differs";
      }
      for (uint32_t k = 0; k < x.block_count; ++k) {
        const Block& p = a_.blocks[x.first_block + k];
        const Block& q = b_.blocks[y.first_block + k];
        if (p.address != q.address || p.size != q.size || p.state != q.state ||
            !stack(p.stack, q.stack)) {
          return "segment " + std::to_string(i) + " block " + std::to_string(k) + " differs";
        }
      }
    }
    if (a_.annotations.size() != b_.annotations.size()) return "annotation counts differ";
    for (size_t i = 0; i < a_.annotations.size(); ++i) {
      const auto& x = a_.annotations[i];
      const auto& y = b_.annotations[i];
      if (x.device != y.device || x.time_us != y.time_us || !str(x.name, y.name) ||
          !str(x.stage, y.stage)) {
        return "annotation " + std::to_string(i) + " differs";
      }
    }
    return "";
  }

 private:
  bool str(StrId x, StrId y) {
    auto [it, fresh] = strs_.try_emplace(x, y);
    if (fresh) return a_.strings.get(x) == b_.strings.get(y);
    return it->second == y;
  }
  bool stack(StackId x, StackId y) {
    auto [it, fresh] = stacks_.try_emplace(x, y);
    if (!fresh) return it->second == y;
    if ((x == kNoStack) != (y == kNoStack)) return false;
    if (x == kNoStack) return true;
    auto fa = a_.stacks.stack(x), fb = b_.stacks.stack(y);
    if (fa.size() != fb.size()) return false;
    for (size_t k = 0; k < fa.size(); ++k) {
      const Frame& p = a_.stacks.frame(fa[k]);
      const Frame& q = b_.stacks.frame(fb[k]);
      if (p.line != q.line || a_.strings.get(p.filename) != b_.strings.get(q.filename) ||
          a_.strings.get(p.name) != b_.strings.get(q.name)) {
        return false;
      }
    }
    return true;
  }
  const Snapshot& a_;
  const Snapshot& b_;
  std::unordered_map<StrId, StrId> strs_;
  std::unordered_map<StackId, StackId> stacks_;
};

std::vector<uint8_t> toTrace(const Snapshot& s, int level, uint32_t chunk_bytes = 1u << 20) {
  VectorSink sink;
  TraceWriteOptions o;
  o.zstd_level = level;
  o.chunk_bytes = chunk_bytes;
  Status st = writeSnapshotTrace(s, sink, o);
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
  return std::move(sink.data);
}

Snapshot fromTrace(std::span<const uint8_t> b) {
  auto r = readSnapshotTrace(b);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  if (!r.ok()) return Snapshot{};
  EXPECT_TRUE(r->load_warnings.empty()) << r->load_warnings.front();
  return std::move(*r);
}

// Reads every chunk and checks the file against the shared limits: each chunk within
// kMaxChunkBytes decoded, the zstd chunks within decodedBudget(file size). Returns the number of
// chunks stored uncompressed because of the budget's sake or otherwise.
struct ChunkFigures {
  uint64_t chunks = 0, zstd_chunks = 0, stored_chunks = 0, zstd_decoded = 0;
  std::map<uint8_t, uint64_t> per_type;
};
ChunkFigures checkLimits(std::span<const uint8_t> b) {
  ChunkFigures f;
  auto r = TraceReader::open(b);
  EXPECT_TRUE(r.ok());
  if (!r.ok()) return f;
  while ((*r)->next()) {
    const ChunkRef& c = (*r)->chunk();
    ++f.chunks;
    ++f.per_type[c.type];
    EXPECT_LE(c.raw_size, kMaxChunkBytes);
    if (c.codec == static_cast<uint8_t>(Codec::Zstd)) {
      ++f.zstd_chunks;
      f.zstd_decoded += c.raw_size;
    } else {
      ++f.stored_chunks;
    }
  }
  EXPECT_TRUE((*r)->end().complete) << (*r)->end().reason;
  EXPECT_LE(f.zstd_decoded, decodedBudget(b.size()));
  return f;
}

// ---------------------------------------------------------------------------------------------
// Class 4: what convert writes, the reader reads.

TEST(TraceLimits, RepetitiveAllocFreeLoopIsReadBack) {
  // 6,000 events of one alloc/free loop: zstd compresses a chunk of it several hundred times; the
  // reader used to refuse it as "an implausible ratio".
  Gen g;
  StackId st = g.stack(0, 20);
  g.loop(0, 1ull << 40, 6000, {st}, 1000, /*varied=*/false);
  Snapshot s = g.finish(1);
  for (int level : {1, 3, 19}) {
    SCOPED_TRACE(level);
    auto bin = toTrace(s, level);
    checkLimits(bin);
    Snapshot back = fromTrace(bin);
    EXPECT_EQ(Same(s, back).diff(), "");
  }
}

TEST(TraceLimits, HundredThousandFrameStackIsReadBack) {
  Gen g;
  StackId deep = g.stack(0, 100000);
  g.loop(0, 1ull << 40, 300, {deep}, 5);
  Snapshot s = g.finish(1);
  for (int level : {0, 3}) {
    SCOPED_TRACE(level);
    auto bin = toTrace(s, level);
    checkLimits(bin);
    Snapshot back = fromTrace(bin);
    EXPECT_EQ(Same(s, back).diff(), "");
    ASSERT_EQ(back.traceCount(), 1u);
    EXPECT_EQ(back.stacks.stack(back.trace(0)[1].stack).size(), 100000u);
  }
}

TEST(TraceLimits, WriterStaysWithinTheDecodedBudgetAtItsLimits) {
  // The most compressible content there is (one record repeated), in the largest chunks the writer
  // makes, at the strongest level: the writer must store chunks rather than exceed the budget.
  VectorSink sink;
  WriterOptions wo;
  wo.zstd_level = 19;
  wo.chunk_bytes = kMaxChunkBytes;  // clamped by the writer to its own maximum
  wo.checkpoint_every = 0;
  TraceWriter w(sink, wo);
  ASSERT_TRUE(w.begin(TraceMeta{}).ok());
  TraceEvent e;
  e.action = 0;
  e.size = 512;
  e.stack = kTraceRootStack;
  for (int i = 0; i < 12'000'000; ++i) ASSERT_TRUE(w.event(e).ok());
  ASSERT_TRUE(w.close().ok());
  ChunkFigures f = checkLimits(sink.data);
  EXPECT_GT(f.stored_chunks, 0u);  // the budget made the writer store some
  EXPECT_GT(f.zstd_decoded, kDecodedBudgetFloor / 2);
  auto r = TraceReader::open(sink.data);
  ASSERT_TRUE(r.ok());
  uint64_t n = 0;
  while ((*r)->next()) n += (*r)->events().size();
  EXPECT_TRUE((*r)->end().complete) << (*r)->end().reason;
  EXPECT_EQ(n, 12'000'000u);
}

TEST(TraceLimits, TablesAreSplitIntoChunksBelowTheLimit) {
  // An 800,000-frame stack whose frames have 10-byte line numbers: one Frames chunk would be
  // about 9 MB; the writer writes tables in pieces of about kTableChunkBytes (4 MiB).
  Gen g;
  std::vector<FrameId> frames;
  const StrId file = g.s.strings.intern("deep.py"), name = g.s.strings.intern("recurse");
  for (uint64_t k = 0; k < 800'000; ++k)
    frames.push_back(g.s.stacks.internFrame(Frame{file, name, (1ull << 62) + k}));
  StackId deep = g.s.stacks.internStack(frames);
  g.loop(0, 1ull << 40, 10, {deep}, 5);
  Snapshot s = g.finish(1);
  auto bin = toTrace(s, 0);
  ChunkFigures f = checkLimits(bin);
  EXPECT_GE(f.per_type[static_cast<uint8_t>(ChunkType::Frames)], 2u);
  Snapshot back = fromTrace(bin);
  EXPECT_EQ(Same(s, back).diff(), "");
}

TEST(TraceLimits, DeviceOrdinal65536AndEmptyDeviceTracesSurvive) {
  Gen g;
  StackId st = g.stack(2, 5);
  g.loop(0, 1ull << 40, 30, {st}, 1);
  g.loop(65536, 1ull << 41, 30, {st}, 100);
  g.s.annotations.push_back(
      Annotation{65536, 150, g.s.strings.intern("ProfilerStep#1"), g.s.strings.intern("START")});
  Snapshot s = g.finish(65537);
  ASSERT_EQ(s.traceCount(), 65537u);
  for (int level : {0, 3}) {
    SCOPED_TRACE(level);
    auto bin = toTrace(s, level);
    Snapshot back = fromTrace(bin);
    EXPECT_EQ(Same(s, back).diff(), "");
    EXPECT_EQ(back.segments.back().device, 65536);
  }
  // Past the format's device limit, the writer refuses before writing anything.
  Gen big;
  big.loop(0, 1ull << 40, 4, {big.stack(0, 1)}, 1);
  Snapshot b = big.finish(kMaxDevice + 1);
  VectorSink sink;
  Status refused = writeSnapshotTrace(b, sink);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("device traces"), std::string::npos)
      << refused.error().message;
  EXPECT_TRUE(sink.data.empty());
}

TEST(TraceLimits, SegmentDevicesKeepTheirInt64Value) {
  Gen g;
  g.loop(0, 1ull << 40, 4, {g.stack(0, 1)}, 1);
  Snapshot s = g.finish(1);
  s.segments[0].device = (int64_t{1} << 40) + 3;
  Snapshot back = fromTrace(toTrace(s, 0));
  ASSERT_EQ(back.segments.size(), 1u);
  EXPECT_EQ(back.segments[0].device, (int64_t{1} << 40) + 3);
}

TEST(TraceLimits, ExtremeTimesSurvive) {
  // time_us is stored as time_us + 1 (0 = none): INT64_MAX is stored as 2^63, and reading it back
  // once overflowed int64 (UBSan, found by fuzz_pipeline).
  Gen g;
  g.loop(0, 1ull << 40, 4, {g.stack(0, 1)}, 1);
  Snapshot s = g.finish(1);
  ASSERT_GE(s.events.size(), 3u);
  s.events[0].time_us = std::numeric_limits<int64_t>::max();
  s.events[1].time_us = -1;
  s.events[2].time_us = 0;
  Snapshot back = fromTrace(toTrace(s, 0));
  ASSERT_EQ(back.events.size(), s.events.size());
  EXPECT_EQ(back.events[0].time_us, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(back.events[1].time_us, -1);
  EXPECT_EQ(back.events[2].time_us, 0);
}

TEST(TraceLimits, EmptyDeviceTracesSurvivePickleToNativeToPickle) {
  // device_traces [[]] (one device, nothing recorded) and [[], [], [events]] must keep their count:
  // memory_viz indexes device_traces by device.
  for (size_t empty_tail : {1u, 3u}) {
    SCOPED_TRACE(empty_tail);
    Gen g;
    if (empty_tail == 3) g.loop(2, 1ull << 40, 7, {g.stack(0, 2)}, 1);
    Snapshot s = g.finish(empty_tail);
    auto a = readSnapshotPickle(snapshotToPickle(s));
    ASSERT_TRUE(a.ok()) << a.error().message;
    ASSERT_EQ(a->traceCount(), empty_tail);
    Snapshot b = fromTrace(toTrace(*a, 3));
    EXPECT_EQ(b.traceCount(), empty_tail);
    auto c = readSnapshotPickle(snapshotToPickle(b));
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(Same(*a, *c).diff(), "");
  }
}

// ---------------------------------------------------------------------------------------------
// Class 2: bounded reading of hostile traces.

std::vector<uint8_t> header() {
  VectorSink sink;
  TraceWriter w(sink);
  EXPECT_TRUE(w.begin(TraceMeta{}).ok());
  return sink.data;  // header + Meta chunk
}
void appendChunk(std::vector<uint8_t>& out, ChunkType type, Codec codec,
                 std::span<const uint8_t> stored) {
  uint8_t h[kChunkHeaderSize] = {};
  h[0] = static_cast<uint8_t>(type);
  h[1] = static_cast<uint8_t>(codec);
  putU32(h + 4, static_cast<uint32_t>(stored.size()));
  uint32_t crc = crc32c(0, h, 8);
  putU32(h + 8, crc32c(crc, stored.data(), stored.size()));
  out.insert(out.end(), h, h + kChunkHeaderSize);
  out.insert(out.end(), stored.begin(), stored.end());
}
// An Events chunk of `count` 4-byte records (alloc, same stack, all deltas 0), zstd-compressed and
// padded with a skippable frame to `padded` stored bytes.
std::vector<uint8_t> bombChunk(uint64_t count, size_t padded) {
  std::vector<uint8_t> raw(10 + count * 4);
  uint8_t* p = putVarint(raw.data(), count);
  raw.resize(static_cast<size_t>(p - raw.data()));
  for (uint64_t i = 0; i < count; ++i) raw.insert(raw.end(), {kHeadSameStack, 0, 0, 0});
  std::vector<uint8_t> z(ZSTD_compressBound(raw.size()));
  size_t n = ZSTD_compress(z.data(), z.size(), raw.data(), raw.size(), 19);
  EXPECT_FALSE(ZSTD_isError(n));
  z.resize(n);
  if (padded > n + 8) {
    const size_t pad = padded - n - 8;
    uint8_t sk[8];
    putU32(sk, 0x184D2A50u);  // a zstd skippable frame
    putU32(sk + 4, static_cast<uint32_t>(pad));
    z.insert(z.end(), sk, sk + 8);
    z.resize(z.size() + pad, 0);
  }
  return z;
}

TEST(TraceHostile, ZstdBombPaddedWithASkippableFrameIsRefusedBeforeDecoding) {
  // 20 MiB of records in one chunk padded to 100 KB: within the old 256x ratio, past the budget
  // of a 100 KB file (16 MiB).
  auto b = header();
  auto chunk = bombChunk(5u << 20, 100 << 10);
  appendChunk(b, ChunkType::Events, Codec::Zstd, chunk);
  auto r = TraceReader::open(b);
  ASSERT_TRUE(r.ok());
  uint64_t events = 0;
  while ((*r)->next()) events += (*r)->events().size();
  EXPECT_EQ(events, 0u);
  EXPECT_TRUE((*r)->end().damaged);
  EXPECT_NE((*r)->end().reason.find("budget"), std::string::npos) << (*r)->end().reason;
  auto snap = readSnapshotTrace(b);
  ASSERT_FALSE(snap.ok());
}

TEST(TraceHostile, ManyBombChunksStopAtTheFileBudget) {
  // 1.25 MiB of chunks that each decode to 8 MiB: what is decoded stays within decodedBudget.
  auto b = header();
  for (int i = 0; i < 12; ++i)
    appendChunk(b, ChunkType::Events, Codec::Zstd, bombChunk(2u << 20, 100 << 10));
  auto r = TraceReader::open(b);
  ASSERT_TRUE(r.ok());
  uint64_t decoded = 0;
  while ((*r)->next()) decoded += (*r)->chunk().raw_size;
  EXPECT_TRUE((*r)->end().damaged);
  EXPECT_LE(decoded, decodedBudget(b.size()));
  EXPECT_NE((*r)->end().reason.find("budget"), std::string::npos) << (*r)->end().reason;
}

// A 8,000-node chain in the stack trie, every node referred to by an event: 56 KB that expand to
// 32 million frames (the stack frame budget of such a file is 16 million).
void writeChain(TraceWriter& w, int nodes) {
  ASSERT_TRUE(w.begin(TraceMeta{}).ok());
  uint32_t f = w.frame(w.string("f.py"), w.string("f"), 1);
  uint32_t node = kTraceRootStack;
  for (int i = 0; i < nodes; ++i) {
    node = w.stack(node, f);
    TraceEvent e;
    e.action = 0;
    e.addr = static_cast<uint64_t>(i) * 512;
    e.size = 512;
    e.stack = node;
    ASSERT_TRUE(w.event(e).ok());
  }
}

TEST(TraceHostile, StackTrieChainIsRefusedByTheWriterAndTheReader) {
  {
    VectorSink sink;
    TraceWriter w(sink);
    writeChain(w, 8000);
    Status st = w.close();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find("expand"), std::string::npos) << st.error().message;
  }
  VectorSink sink;
  TraceWriter w(sink);
  writeChain(w, 8000);
  ASSERT_TRUE(w.flush().ok());  // a file as a killed writer leaves it: the events, no trailer
  auto snap = readSnapshotTrace(sink.data);
  ASSERT_FALSE(snap.ok());
  EXPECT_NE(snap.error().message.find("budget"), std::string::npos) << snap.error().message;
  // Below the budget the same shape reads back (2,000 nodes: 2 million frames).
  VectorSink small;
  TraceWriter w2(small);
  writeChain(w2, 2000);
  ASSERT_TRUE(w2.close().ok());
  auto ok = readSnapshotTrace(small.data);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->stacks.stack(ok->events.back().stack).size(), 2000u);
}

TEST(TraceHostile, ForgedTrailerEventCountReservesNothing) {
  if (kAddressSanitizer) {
    GTEST_SKIP() << "RLIMIT_AS does not work with ASan's shadow memory";
  }
  // A 2 MB trace whose trailer (valid CRC, reachable through the end mark) claims 2^40 events:
  // reading must decode what is there and report the mismatch, in a process limited to 1 GiB
  // more address space than it has (the old reader reserved min(count, 64 x size) events first).
  Gen g;
  g.loop(0, 1ull << 40, 400'000, {g.stack(0, 3)}, 1);
  Snapshot s = g.finish(1);
  auto bin = toTrace(s, 0);
  ASSERT_GT(bin.size(), 2'000'000u);
  const uint64_t trailer = getU64(bin.data() + bin.size() - kEndMarkSize);
  bin.resize(trailer);
  std::vector<uint8_t> tlv;
  uint8_t tmp[10];
  tlv.push_back(1 << 1);  // tag 1: events
  tlv.insert(tlv.end(), tmp, putVarint(tmp, uint64_t{1} << 40));
  appendChunk(bin, ChunkType::Trailer, Codec::None, tlv);
  uint8_t end[kEndMarkSize];
  putU64(end, trailer);
  std::memcpy(end + 8, kEndMagic, 8);
  bin.insert(bin.end(), end, end + kEndMarkSize);
  ASSERT_TRUE(peekTrailer(bin).has_value());
  EXPECT_EQ(peekTrailer(bin)->events, uint64_t{1} << 40);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    rlimit lim{};
    lim.rlim_cur = lim.rlim_max = static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (1ull << 30);
    setrlimit(RLIMIT_AS, &lim);
    try {
      auto r = readSnapshotTrace(bin);
      bool named = !r.ok() && r.error().message.find("trailer counts") != std::string::npos;
      std::_Exit(named ? 0 : 1);
    } catch (const std::bad_alloc&) {
      std::_Exit(3);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the reader crashed";
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "3: bad_alloc (a reservation from the forged count); 1: no clear error";
}

TEST(TraceHostile, HugeZeroTailIsACutCheckedOnlyInPart) {
  // A trace without trailer followed by 64 MiB of zeros (a 1 GiB sparse tail in the hostile
  // corpus paged in the whole GiB): the reader checks kZeroTailScanBytes of it and says so.
  VectorSink sink;
  TraceWriter w(sink);
  ASSERT_TRUE(w.begin(TraceMeta{}).ok());
  TraceEvent e;
  e.action = 0;
  e.size = 512;
  ASSERT_TRUE(w.event(e).ok());
  ASSERT_TRUE(w.flush().ok());
  const size_t good = sink.data.size();
  std::vector<uint8_t> b = sink.data;
  b.resize(good + (64u << 20), 0);
  auto r = TraceReader::open(b);
  ASSERT_TRUE(r.ok());
  while ((*r)->next()) {
  }
  EXPECT_TRUE((*r)->end().truncated);
  EXPECT_EQ((*r)->end().good_bytes, good);
  EXPECT_NE((*r)->end().reason.find("the first 16777216 of the 67108864 bytes left were checked"),
            std::string::npos)
      << (*r)->end().reason;
  // A short zero tail is still checked to its end.
  b.resize(good + 4096);
  auto r2 = TraceReader::open(b);
  ASSERT_TRUE(r2.ok());
  while ((*r2)->next()) {
  }
  EXPECT_NE((*r2)->end().reason.find("to the end"), std::string::npos) << (*r2)->end().reason;
}

TEST(TraceLimits, SourceWarningsSurviveConversion) {
  // A pickle whose time_us values are out of range is read with a warning; the converted trace
  // keeps saying it (the hostile corpus's c6_time_negative_and_max.converted.bin was silent).
  Gen g;
  g.loop(0, 1ull << 40, 4, {g.stack(0, 1)}, 1);
  Snapshot s = g.finish(1);
  s.load_warnings.push_back("3 time_us value(s) negative or beyond 2^63-1: read as no time");
  auto r = readSnapshotTrace(toTrace(s, 3));
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->load_warnings.size(), 1u);
  EXPECT_NE(r->load_warnings[0].find("3 time_us value(s) negative"), std::string::npos)
      << r->load_warnings[0];
}

// ---------------------------------------------------------------------------------------------
// Class 9: an over-long varint is named as such, with its offset.

TEST(TraceHostile, OverlongVarintIsNamedWithItsOffset) {
  auto b = header();
  std::vector<uint8_t> payload(10, 0xff);
  payload.push_back(0x01);  // 11 bytes
  appendChunk(b, ChunkType::Events, Codec::None, payload);
  auto r = TraceReader::open(b);
  ASSERT_TRUE(r.ok());
  while ((*r)->next()) {
  }
  const std::string& why = (*r)->end().reason;
  EXPECT_NE(why.find("longer than 10 bytes"), std::string::npos) << why;
  EXPECT_NE(why.find("payload byte 0"), std::string::npos) << why;
  EXPECT_NE(why.find("events chunk at byte"), std::string::npos) << why;
  EXPECT_EQ(why.find("event count 0"), std::string::npos) << why;
}

// ---------------------------------------------------------------------------------------------
// Class 7: the pickle writer writes what Python loads.

TEST(PickleWriterUtf8, InvalidSequencesAreReplacedAndValidOnesKept) {
  struct Case {
    std::string in, out;
  } cases[] = {
      {"plain", "plain"},
      {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
      {"a\xff"
       "b",
       "a\xEF\xBF\xBD"
       "b"},
      {"\xc0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"},                  // overlong NUL
      {"\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},  // a UTF-16 surrogate
      {"x\xe2\x82", "x\xEF\xBF\xBD"},                            // cut short: one maximal subpart
      {"\xf4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},  // above U+10FFFF
      {std::string("nul\0in", 6), std::string("nul\0in", 6)},
  };
  for (const auto& c : cases) {
    PickleWriter w;
    w.str(c.in);
    auto b = w.finish();
    // PROTO 4, SHORT_BINUNICODE len bytes, STOP
    ASSERT_EQ(b[2], 0x8c);
    std::string got(reinterpret_cast<const char*>(b.data() + 4), b[3]);
    EXPECT_EQ(got, c.out);
  }
}

TEST(PickleWriterUtf8, PythonLoadsAConvertedSnapshotWithHostileNames) {
  if (std::system("python3 -c 'import pickle' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  Gen g;
  std::vector<FrameId> frames;
  for (std::string name :
       {std::string("bad\xff\xfe"), std::string("\xed\xa0\x80surrogate"),
        std::string("cut\xe2\x82"), std::string("\x1b]0;title\x07 ok \xc3\xa9")}) {
    frames.push_back(g.s.stacks.internFrame(
        Frame{g.s.strings.intern("f\xc0\xaf.py"), g.s.strings.intern(name), 3}));
  }
  StackId st = g.s.stacks.internStack(frames);
  g.loop(0, 1ull << 40, 10, {st}, 1);
  Snapshot s = g.finish(1);
  // Through the native trace and back, as `convert --to pickle` of a .bin does.
  Snapshot back = fromTrace(toTrace(s, 3));
  std::vector<uint8_t> pk = snapshotToPickle(back);
  fs::path path =
      fs::temp_directory_path() / ("memf_utf8_" + std::to_string(::getpid()) + ".pickle");
  {
    std::ofstream o(path, std::ios::binary);
    o.write(reinterpret_cast<const char*>(pk.data()), static_cast<std::streamsize>(pk.size()));
  }
  std::string cmd =
      "python3 -c \"import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); "
      "f=d['device_traces'][0][1]['frames']; "
      "assert f[0]['name']=='bad\\ufffd\\ufffd', f[0]['name']; "
      "assert f[1]['name']=='\\ufffd\\ufffd\\ufffdsurrogate', f[1]['name']; "
      "assert f[2]['name']=='cut\\ufffd', f[2]['name']; "
      "assert f[3]['name']=='\\x1b]0;title\\x07 ok \\xe9'; "
      "assert f[0]['filename']=='f\\ufffd\\ufffd.py'\" " +
      path.string();
  int rc = std::system(cmd.c_str());
  fs::remove(path);
  EXPECT_EQ(rc, 0) << cmd;
}

// ---------------------------------------------------------------------------------------------
// The round trip at scale: >= 5 M events (repetitive loops, 1,000-frame stacks, several devices,
// an empty device trace and device 65536), native with zstd level 1 and stored; then
// pickle -> native -> pickle on the same content at 200 k events.

// Under ASan a tenth, to stay within CI's time.
constexpr size_t kScaleEvents = kAddressSanitizer ? 600'000 : 5'100'000;

Snapshot scaleSnapshot(size_t events) {
  Gen g;
  std::vector<StackId> stacks;
  for (int v = 0; v < 8; ++v) stacks.push_back(g.stack(v, 1000));
  stacks.push_back(g.stack(99, 3));
  // Device 0: most events; 1: empty; 2: a smaller loop; 65536: a few; 3..65535 empty.
  g.loop(0, 1ull << 40, events * 8 / 10, stacks, 1'700'000'000'000'000);
  g.loop(2, 2ull << 40, events * 2 / 10 - 3000, stacks, 1'700'000'000'000'000);
  g.loop(65536, 3ull << 40, 3000, stacks, 1'700'000'100'000'000);
  g.s.annotations.push_back(Annotation{
      0, 1'700'000'000'000'010, g.s.strings.intern("ProfilerStep#1"), g.s.strings.intern("START")});
  g.s.annotations.push_back(Annotation{65536, 1'700'000'100'000'010,
                                       g.s.strings.intern("ProfilerStep#1"),
                                       g.s.strings.intern("END")});
  return g.finish(65537);
}

TEST(TraceScale, FiveMillionEventsRoundTripNative) {
  const auto t0 = std::chrono::steady_clock::now();
  Snapshot s = scaleSnapshot(kScaleEvents);
  ASSERT_GE(s.events.size(), kScaleEvents - 10);
  ASSERT_EQ(s.traceCount(), 65537u);
  ASSERT_TRUE(s.trace(1).empty());
  for (int level : {1, 0}) {
    SCOPED_TRACE(level);
    auto bin = toTrace(s, level);
    ChunkFigures f = checkLimits(bin);
    Snapshot back = fromTrace(bin);
    EXPECT_EQ(Same(s, back).diff(), "");
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "level %d: %zu events, %zu bytes, %llu chunks (%llu stored), %llu zstd-decoded bytes, %.1f "
        "s so far\n",
        level, s.events.size(), bin.size(), static_cast<unsigned long long>(f.chunks),
        static_cast<unsigned long long>(f.stored_chunks),
        static_cast<unsigned long long>(f.zstd_decoded), secs);
  }
}

TEST(TraceScale, PickleToNativeToPickleKeepsEverything) {
  Snapshot s = scaleSnapshot(200'000);
  auto a = readSnapshotPickle(snapshotToPickle(s));
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(Same(s, *a).diff(), "");
  Snapshot b = fromTrace(toTrace(*a, 1));
  EXPECT_EQ(Same(*a, b).diff(), "");
  std::vector<uint8_t> again = snapshotToPickle(b);
  auto c = readSnapshotPickle(again);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(Same(*a, *c).diff(), "");
  EXPECT_EQ(c->traceCount(), 65537u);
}

}  // namespace
}  // namespace memforensics
