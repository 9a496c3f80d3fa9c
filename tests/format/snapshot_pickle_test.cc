// snapshot_pickle_test.cc: the snapshot pickle writer, checked by reading its output back.
//
//   * every real snapshot and snapshots/sample_training.pickle: read, write, read again, and the
//   two
//     models are equal field by field (stacks compared as resolved frames, not ids); writing the
//     read-back model again gives the same bytes; the file stays about as small as PyTorch's;
//   * fabricated edge cases: unknown actions, unknown line numbers, [] versus absent frames, OOM
//     device_free, non-ASCII and quote characters, a 1.13 bare segment list, legacy `history`
//     blocks, and the 2.12 fields (pool_id) no real file has yet;
//   * streaming: the pieces add up to the buffered bytes, and a sink error stops the writer.
// With MEMF_PICKLE_ROUNDTRIP_DIR set, the real-file test also leaves its output there for
// tools/compare_pickles.py, which checks it against the original with Python's own unpickler.
#include "format/pickle/snapshot_pickle.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "fixtures/real_snapshots.h"
#include "fixtures/snapshot_builder.h"
#include "format/load/load.h"
#include "format/load/snapshot_trace.h"
#include "format/model/dump.h"
#include "format/pickle/pickle_reader.h"
#include "format/pickle/pickle_writer.h"
#include "format/trace/trace_writer.h"

namespace memforensics::format {
namespace {

namespace fs = std::filesystem;
using memforensics::testing::buildSnapshot;
using memforensics::testing::TBlock;
using memforensics::testing::TEvent;
using memforensics::testing::TFrame;
using memforensics::testing::TSegment;
using memforensics::testing::TSnapshot;

// ---------------------------------------------------------------------------------------------
// Semantic comparison: the first difference between two models, as a path and both values, or "".

using ResolvedFrame = std::tuple<std::string, std::string, uint64_t>;  // filename, name, line
// nullopt = no stack recorded (kNoStack); an empty vector = recorded but empty.
std::optional<std::vector<ResolvedFrame>> resolve(const Snapshot& s, StackId id) {
  if (id == kNoStack) return std::nullopt;
  std::vector<ResolvedFrame> out;
  for (FrameId f : s.stacks.stack(id)) {
    const Frame& fr = s.stacks.frame(f);
    out.emplace_back(std::string(s.strings.get(fr.filename)), std::string(s.strings.get(fr.name)),
                     fr.line);
  }
  return out;
}

std::string describeStack(const std::optional<std::vector<ResolvedFrame>>& st) {
  if (!st) return "(none)";
  std::ostringstream o;
  o << "[" << st->size() << " frames";
  for (const auto& [file, name, line] : *st) o << " " << file << ":" << line << ":" << name;
  o << "]";
  return o.str();
}

class Differ {
 public:
  Differ(const Snapshot& a, const Snapshot& b) : a_(a), b_(b) {}

  std::string run() {
    traits();
    settings();
    annotations();
    segments();
    traces();
    return diff_;
  }

 private:
  template <typename T>
  void eq(const std::string& path, const T& x, const T& y) {
    if (!diff_.empty() || x == y) return;
    std::ostringstream o;
    o << path << ": " << x << " != " << y;
    diff_ = o.str();
  }
  void strEq(const std::string& path, StrId x, StrId y) {
    eq(path, std::string(a_.strings.get(x)), std::string(b_.strings.get(y)));
  }
  void stackEq(const std::string& path, StackId x, StackId y) {
    if (!diff_.empty() || same_stacks_.count({x, y})) return;
    auto rx = resolve(a_, x);
    auto ry = resolve(b_, y);
    if (rx != ry)
      diff_ = path + ": " + describeStack(rx) + " != " + describeStack(ry);
    else
      same_stacks_.insert({x, y});  // ids are interned: the same pair compares the same again
  }

  void traits() {
    const FormatTraits& x = a_.traits;
    const FormatTraits& y = b_.traits;
    eq("traits.top_level_list", x.top_level_list, y.top_level_list);
    eq("traits.has_device_traces", x.has_device_traces, y.has_device_traces);
    eq("traits.has_block_history", x.has_block_history, y.has_block_history);
    eq("traits.has_block_address", x.has_block_address, y.has_block_address);
    eq("traits.has_segment_pool_id", x.has_segment_pool_id, y.has_segment_pool_id);
    eq("traits.has_time_us", x.has_time_us, y.has_time_us);
    eq("traits.has_allocator_settings", x.has_allocator_settings, y.has_allocator_settings);
    eq("traits.has_annotations_key", x.has_annotations_key, y.has_annotations_key);
    eq("traits.has_compile_context", x.has_compile_context, y.has_compile_context);
    eq("traits.has_graph_capture_key", x.has_graph_capture_key, y.has_graph_capture_key);
    eq("traits.has_user_metadata", x.has_user_metadata, y.has_user_metadata);
    eq("traits.has_pool_id", x.has_pool_id, y.has_pool_id);
    // host_segments/host_traces are not written (only their count is in the model).
    eq("traits.has_annotate_action", x.has_annotate_action, y.has_annotate_action);
    eq("era", x.era(), y.era());
  }

  void settings() {
    const AllocatorSettings& x = a_.settings;
    const AllocatorSettings& y = b_.settings;
    eq("settings.present", x.present, y.present);
    eq("settings.conf", x.conf, y.conf);
    eq("settings.max_split_size", x.max_split_size, y.max_split_size);
    eq("settings.garbage_collection_threshold", x.garbage_collection_threshold,
       y.garbage_collection_threshold);
    eq("settings.expandable_segments", x.expandable_segments, y.expandable_segments);
    eq("settings.has_roundup", x.has_roundup, y.has_roundup);
    for (int k = 0; k < 16; ++k) {
      eq("settings.roundup_power2_divisions[" + std::to_string(k) + "]",
         x.roundup_power2_divisions[k], y.roundup_power2_divisions[k]);
    }
    eq("settings.other.size", x.other.size(), y.other.size());
    for (size_t k = 0; diff_.empty() && k < x.other.size(); ++k) {
      const OtherSetting &p = x.other[k], &q = y.other[k];
      const std::string at = "settings.other[" + std::to_string(k) + "].";
      eq(at + "key", p.key, q.key);
      eq(at + "kind", static_cast<int>(p.kind), static_cast<int>(q.kind));
      eq(at + "i", p.i, q.i);
      eq(at + "f", p.f, q.f);
      eq(at + "s", p.s, q.s);
    }
  }

  void annotations() {
    eq("annotations.size", a_.annotations.size(), b_.annotations.size());
    for (size_t i = 0; diff_.empty() && i < a_.annotations.size(); ++i) {
      const Annotation& x = a_.annotations[i];
      const Annotation& y = b_.annotations[i];
      std::string p = "annotations[" + std::to_string(i) + "]";
      eq(p + ".device", x.device, y.device);
      eq(p + ".time_us", x.time_us, y.time_us);
      strEq(p + ".name", x.name, y.name);
      strEq(p + ".stage", x.stage, y.stage);
    }
  }

  void segments() {
    eq("segments.size", a_.segments.size(), b_.segments.size());
    for (size_t i = 0; diff_.empty() && i < a_.segments.size(); ++i) {
      const Segment& x = a_.segments[i];
      const Segment& y = b_.segments[i];
      std::string p = "segments[" + std::to_string(i) + "]";
      eq(p + ".device", x.device, y.device);
      eq(p + ".address", x.address, y.address);
      eq(p + ".total_size", x.total_size, y.total_size);
      eq(p + ".allocated_size", x.allocated_size, y.allocated_size);
      eq(p + ".active_size", x.active_size, y.active_size);
      eq(p + ".requested_size", x.requested_size, y.requested_size);
      eq(p + ".stream", x.stream, y.stream);
      eq(p + ".pool_a", x.pool_a, y.pool_a);
      eq(p + ".pool_b", x.pool_b, y.pool_b);
      strEq(p + ".segment_type", x.segment_type, y.segment_type);
      eq(p + ".is_large", x.is_large, y.is_large);
      eq(p + ".is_expandable", x.is_expandable, y.is_expandable);
      stackEq(p + ".frames", x.stack, y.stack);
      eq(p + ".block_count", x.block_count, y.block_count);
      if (!diff_.empty()) return;
      auto bx = a_.blocksOf(x);
      auto by = b_.blocksOf(y);
      for (size_t k = 0; diff_.empty() && k < bx.size(); ++k) {
        std::string q = p + ".blocks[" + std::to_string(k) + "]";
        eq(q + ".address", bx[k].address, by[k].address);
        eq(q + ".size", bx[k].size, by[k].size);
        eq(q + ".requested_size", bx[k].requested_size, by[k].requested_size);
        eq(q + ".has_requested_size", bx[k].has_requested_size, by[k].has_requested_size);
        eq(q + ".state", blockStateName(bx[k].state), blockStateName(by[k].state));
        stackEq(q + ".frames", bx[k].stack, by[k].stack);
      }
    }
  }

  void traces() {
    eq("traceCount", a_.traceCount(), b_.traceCount());
    for (size_t d = 0; diff_.empty() && d < a_.traceCount(); ++d) {
      auto tx = a_.trace(d);
      auto ty = b_.trace(d);
      eq("device_traces[" + std::to_string(d) + "].size", tx.size(), ty.size());
      for (size_t i = 0; diff_.empty() && i < tx.size(); ++i) {
        const Event& x = tx[i];
        const Event& y = ty[i];
        std::string p = "device_traces[" + std::to_string(d) + "][" + std::to_string(i) + "]";
        eq(p + ".action", actionName(x.action), actionName(y.action));
        const EventNotes &nx = a_.notesOf(x), &ny = b_.notesOf(y);
        strEq(p + ".action_name", nx.action_name, ny.action_name);
        eq(p + ".addr", x.addr, y.addr);
        eq(p + ".size", x.size, y.size);
        eq(p + ".stream", x.stream, y.stream);
        eq(p + ".time_us", x.time_us, y.time_us);
        strEq(p + ".compile_context", nx.compile_context, ny.compile_context);
        strEq(p + ".user_metadata", nx.user_metadata, ny.user_metadata);
        eq(p + ".has_pool", x.pool != 0, y.pool != 0);
        eq(p + ".pool.first", a_.pools[x.pool].first, b_.pools[y.pool].first);
        eq(p + ".pool.second", a_.pools[x.pool].second, b_.pools[y.pool].second);
        stackEq(p + ".frames", x.stack, y.stack);
      }
    }
  }

  const Snapshot& a_;
  const Snapshot& b_;
  std::string diff_;
  std::set<std::pair<StackId, StackId>> same_stacks_;
};

std::string firstDifference(const Snapshot& a, const Snapshot& b) {
  return Differ(a, b).run();
}

Snapshot readBack(const std::vector<uint8_t>& bytes) {
  auto r = loadSnapshotBytes(bytes);
  EXPECT_TRUE(r.ok()) << r.error().describe();
  if (!r.ok()) return Snapshot{};
  return std::move(r).value();
}

// Writes `s`, reads it back, and checks the read-back model equals `s` and rewrites to the same
// bytes.
Snapshot roundTrip(const Snapshot& s) {
  std::vector<uint8_t> bytes = snapshotToPickle(s);
  Snapshot back = readBack(bytes);
  EXPECT_EQ(back.pickle_protocol, 4);
  EXPECT_EQ(firstDifference(s, back), "");
  EXPECT_TRUE(snapshotToPickle(back) == bytes) << "writing the read-back model changes the bytes";
  return back;
}

size_t countOccurrences(const std::vector<uint8_t>& hay, std::string_view needle) {
  size_t n = 0;
  auto it = hay.begin();
  while (true) {
    it = std::search(it, hay.end(), needle.begin(), needle.end(),
                     [](uint8_t x, char y) { return x == static_cast<uint8_t>(y); });
    if (it == hay.end()) return n;
    ++n;
    ++it;
  }
}

// ---------------------------------------------------------------------------------------------
// Real snapshots (read in place, never copied) and the project's sample.

std::vector<fs::path> roundTripFiles() {
  return testing::realSnapshotPathsAndSample();
}

// Streams `s` to `path` through a temporary name, so a concurrent reader never sees half a file.
Status writeFile(const Snapshot& s, const fs::path& path) {
  fs::path tmp = path;
  tmp += ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return Error{"cannot create " + tmp.string()};
  Status st = writeSnapshotPickle(s, [f](std::span<const uint8_t> piece) -> Status {
    if (std::fwrite(piece.data(), 1, piece.size(), f) != piece.size()) return Error{"write failed"};
    return Status::Ok();
  });
  if (std::fclose(f) != 0 && st.ok()) st = Error{"close failed"};
  if (!st.ok()) return st;
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Error{"cannot rename to " + path.string() + ": " + ec.message()};
  return Status::Ok();
}

class PickleRoundTrip : public ::testing::TestWithParam<fs::path> {};

TEST_P(PickleRoundTrip, ReadWriteReadGivesTheSameSnapshot) {
  auto orig = loadSnapshotFile(GetParam().string());
  ASSERT_TRUE(orig.ok()) << orig.error().describe();
  std::vector<uint8_t> bytes = snapshotToPickle(*orig);
  Snapshot back = readBack(bytes);
  EXPECT_EQ(firstDifference(*orig, back), "");
  EXPECT_EQ(back.traits.era(), orig->traits.era());
  EXPECT_EQ(back.events.size(), orig->events.size());
  EXPECT_TRUE(back.ignored_keys.empty());
  // Stable: writing the read-back model gives the same bytes.
  EXPECT_TRUE(snapshotToPickle(back) == bytes);
  // Sharing kept: no bigger than what Python wrote (it also memoizes every container, we do not).
  EXPECT_LE(bytes.size(), orig->input_bytes + orig->input_bytes / 20 + 1024)
      << "written " << bytes.size() << " bytes, original " << orig->input_bytes;

  if (const char* dir = std::getenv("MEMF_PICKLE_ROUNDTRIP_DIR")) {
    fs::create_directories(dir);
    Status st = writeFile(*orig, fs::path(dir) / GetParam().filename());
    ASSERT_TRUE(st.ok()) << st.error().describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Files, PickleRoundTrip, ::testing::ValuesIn(roundTripFiles()),
                         [](const auto& info) { return testing::testNameOf(info.param); });

// ---------------------------------------------------------------------------------------------
// Fabricated edge cases

// A file whose segments interleave devices is read with its segments ordered by device, each
// device's in the file's order (indexSnapshot), so that Snapshot::segmentsOf finds a device's by a
// binary search; each segment keeps its own blocks.
TEST(SnapshotPickle, SegmentsAreOrderedByDeviceKeepingEachDevicesFileOrder) {
  testing::TSnapshot t;
  const std::vector<std::pair<int64_t, uint64_t>> in = {
      {2, 0x30000}, {0, 0x20000}, {2, 0x10000}, {1, 0x50000}, {0, 0x10000}};
  for (const auto& [device, address] : in) {
    TSegment g;
    g.device = device;
    g.address = address;
    g.blocks = {TBlock{0x8000, 0, "inactive", {}},
                TBlock{0x8000, 100 + address / 0x10000, "active_allocated", {}}};
    t.segments.push_back(g);
  }
  const Snapshot s = buildSnapshot(t);
  std::vector<std::pair<int64_t, uint64_t>> got;
  for (const Segment& g : s.segments) {
    got.push_back({g.device, g.address});
    const auto blocks = s.blocksOf(g);
    ASSERT_EQ(blocks.size(), 2u);
    EXPECT_EQ(blocks[0].address, g.address);
    EXPECT_EQ(blocks[1].requested_size, 100 + g.address / 0x10000);
  }
  const std::vector<std::pair<int64_t, uint64_t>> want = {
      {0, 0x20000}, {0, 0x10000}, {1, 0x50000}, {2, 0x30000}, {2, 0x10000}};
  EXPECT_EQ(got, want);
  ASSERT_EQ(s.segmentsOf(0).size(), 2u);
  EXPECT_EQ(s.segmentsOf(0)[0].address, 0x20000u);
  ASSERT_EQ(s.segmentsOf(1).size(), 1u);
  EXPECT_EQ(s.segmentsOf(1)[0].address, 0x50000u);
  ASSERT_EQ(s.segmentsOf(2).size(), 2u);
  EXPECT_EQ(s.segmentsOf(2)[1].address, 0x10000u);
  EXPECT_TRUE(s.segmentsOf(3).empty());
  EXPECT_TRUE(s.segmentsOf(-1).empty());
}

TEST(SnapshotPickle, EdgeCasesOfEventsAndFramesSurvive) {
  const std::string odd_name =
      "forward \"q\" 'a' \\b \xe6\xa8\xa1\xe5\x9e\x8b \xc3\xb1 \xf0\x9f\x94\xa5";
  const std::string long_name(700, 'x');  // over 255 bytes: BINUNICODE, not SHORT_BINUNICODE
  TSnapshot t;
  TSegment seg;
  seg.address = 0x7f0000000000;
  seg.blocks = {TBlock{512, 500, "active_allocated", {{"model.py", 12, odd_name}}},
                TBlock{1536, 0, "inactive", {}}};
  t.segments = {seg};
  TEvent unknown{"mystery_action", 0x7f0000000000, 512, 0, 1700000000000000, {}, false};
  TEvent unknown_line{
      "alloc", 0x7f0000000000,   500,
      7,       1700000000000001, {{"??", kUnknownLine, long_name}, {"train.py", 3, "<module>"}},
      true};
  TEvent empty_frames{"free_requested", 0x7f0000000000, 500, 7, 1700000000000002, {}, true};
  TEvent no_frames{"free_completed", 0x7f0000000000, 500, 7, 1700000000000003, {}, false};
  TEvent oom{"oom", 123456789012, 4ull << 30, 7, 1700000000000004, {{"a.py", 1, odd_name}}, true};
  TEvent negative_stream{"alloc", 0x7f0000000000, 500, -1, 1700000000000005, {}, false};
  t.traces = {{unknown, unknown_line, empty_frames, no_frames, oom, negative_stream}};
  Snapshot s = buildSnapshot(t);
  ASSERT_EQ(s.trace(0).size(), 6u);

  Snapshot back = roundTrip(s);
  auto tr = back.trace(0);
  ASSERT_EQ(tr.size(), 6u);
  EXPECT_EQ(tr[0].action, Action::Unknown);
  EXPECT_EQ(back.strings.get(back.notesOf(tr[0]).action_name), "mystery_action");
  ASSERT_EQ(back.stacks.stack(tr[1].stack).size(), 2u);
  EXPECT_EQ(back.stacks.frame(back.stacks.stack(tr[1].stack)[0]).line, kUnknownLine);
  EXPECT_EQ(back.strings.get(back.stacks.frame(back.stacks.stack(tr[1].stack)[0]).name), long_name);
  EXPECT_EQ(tr[2].stack, kEmptyStack);
  EXPECT_EQ(tr[3].stack, kNoStack);
  EXPECT_EQ(tr[4].action, Action::Oom);
  EXPECT_EQ(tr[4].addr, 123456789012u);
  EXPECT_EQ(tr[5].stream, -1);
  EXPECT_EQ(back.strings.get(back.stacks.frame(back.stacks.stack(back.blocks[0].stack)[0]).name),
            odd_name);

  std::vector<uint8_t> bytes = snapshotToPickle(s);
  // 2^64-1 as Python writes it: LONG1 with 9 bytes, the last one 0 so the value stays positive.
  const std::string unknown_line_op =
      "\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff" + std::string(1, '\0');
  EXPECT_EQ(countOccurrences(bytes, unknown_line_op), 1u);
  EXPECT_EQ(countOccurrences(bytes, "device_free"), 1u);
  // Strings and frames are stored once and referenced after that.
  EXPECT_EQ(countOccurrences(bytes, odd_name), 1u);
  EXPECT_EQ(countOccurrences(bytes, "active_allocated"), 1u);
}

// A 1.13 file: the whole pickle is the segment list, and blocks carry `history`.
// An action PyTorch's releases do not name is dumped as written: a plain word as it is, anything
// else (a space of any kind, a quote, an `=`, nothing at all) quoted, so it reads back whole.
TEST(SnapshotPickle, DumpQuotesActionNamesThatAreNotOneWord) {
  TSnapshot t;
  t.traces = {{TEvent{"mystery_action", 0x1000, 512, 0, 10, {}, false},
               TEvent{"two \"words\"", 0x1000, 512, 0, 11, {}, false},
               TEvent{"", 0x1000, 512, 0, 12, {}, false},
               TEvent{"t=5", 0x1000, 512, 0, -1, {}, false},
               TEvent{"nbsp\xc2\xa0size=1", 0x1000, 512, 0, 13, {}, false}}};
  Snapshot s = buildSnapshot(t);
  std::ostringstream out;
  dumpSnapshot(s, out, DumpOptions{});
  const std::string text = out.str();
  EXPECT_NE(text.find("0:0 t=10 mystery_action addr=0x1000 size=512"), std::string::npos) << text;
  EXPECT_NE(text.find("0:1 t=11 \"two \\\"words\\\"\" addr=0x1000 size=512"), std::string::npos)
      << text;
  EXPECT_NE(text.find("0:2 t=12 \"\" addr=0x1000 size=512"), std::string::npos) << text;
  EXPECT_NE(text.find("0:3 \"t=5\" addr=0x1000 size=512"), std::string::npos) << text;  // no time
  EXPECT_NE(text.find("0:4 t=13 \"nbsp\xc2\xa0size=1\" addr=0x1000"), std::string::npos) << text;
}

TEST(SnapshotPickle, SegmentListWithLegacyHistoryStaysA113File) {
  PickleWriter w(4);
  w.beginList();
  w.beginDict();
  w.str("device");
  w.integer(0);
  w.str("address");
  w.uinteger(0x7f0000000000);
  w.str("total_size");
  w.uinteger(3 * 512);
  w.str("allocated_size");
  w.uinteger(512);
  w.str("active_size");
  w.uinteger(512);
  w.str("stream");
  w.integer(0);
  w.str("segment_type");
  w.str("small");
  w.str("blocks");
  w.beginList();
  // Active, with a history of two allocations (the first one owns the block).
  w.beginDict();
  w.str("size");
  w.uinteger(512);
  w.str("state");
  w.str("active_allocated");
  w.str("history");
  w.beginList();
  w.beginDict();
  w.str("addr");
  w.uinteger(0x7f0000000000);
  w.str("real_size");
  w.uinteger(300);
  w.str("frames");
  w.beginList();
  w.beginDict();
  w.str("filename");
  w.str("net.py");
  w.str("line");
  w.integer(9);
  w.str("name");
  w.str("forward");
  w.endDict();
  w.endList();
  w.endDict();
  w.beginDict();
  w.str("addr");
  w.uinteger(0x7f0000000000);
  w.str("real_size");
  w.uinteger(200);
  w.str("frames");
  w.beginList();
  w.endList();
  w.endDict();
  w.endList();
  w.endDict();
  // Inactive with a history entry (seen in real files), then inactive without one.
  w.beginDict();
  w.str("size");
  w.uinteger(512);
  w.str("state");
  w.str("inactive");
  w.str("history");
  w.beginList();
  w.beginDict();
  w.str("addr");
  w.uinteger(0x7f0000000200);
  w.str("real_size");
  w.uinteger(100);
  w.str("frames");
  w.beginList();
  w.endList();
  w.endDict();
  w.endList();
  w.endDict();
  w.beginDict();
  w.str("size");
  w.uinteger(512);
  w.str("state");
  w.str("inactive");
  w.endDict();
  w.endList();
  w.endDict();
  w.endList();
  auto orig = readSnapshotPickle(w.finish());
  ASSERT_TRUE(orig.ok()) << orig.error().describe();
  ASSERT_EQ(orig->traits.era(), "1.13 (segment list)");

  std::vector<uint8_t> bytes = snapshotToPickle(*orig);
  ASSERT_GE(bytes.size(), 3u);
  EXPECT_EQ(bytes[2], ']');  // the root is the list itself
  EXPECT_EQ(countOccurrences(bytes, "history"), 1u);
  EXPECT_EQ(countOccurrences(bytes, "requested_size"), 1u);  // the segment's; blocks use real_size
  Snapshot back = roundTrip(*orig);
  EXPECT_EQ(back.traits.era(), "1.13 (segment list)");
  ASSERT_EQ(back.blocks.size(), 3u);
  EXPECT_EQ(back.blocks[0].requested_size, 300u);
  EXPECT_EQ(back.blocks[1].requested_size, 100u);
  EXPECT_EQ(back.blocks[1].stack, kEmptyStack);
  EXPECT_EQ(back.blocks[2].stack, kNoStack);
  EXPECT_EQ(back.blocks[2].address, 0x7f0000000400u);
}

// A 2.0 file: dict with device_traces, blocks with requested_size and history, no addresses.
TEST(SnapshotPickle, LegacyHistoryBlocksOfA20File) {
  Snapshot s;
  s.traits.has_device_traces = true;
  s.traits.has_block_history = true;
  FrameId f =
      s.stacks.internFrame(Frame{s.strings.intern("gen.py"), s.strings.intern("generate"), 77});
  StackId st = s.stacks.internStack(std::span<const FrameId>(&f, 1));
  Segment seg;
  seg.address = 1 << 20;
  seg.total_size = 2 << 20;
  seg.allocated_size = 1 << 20;
  seg.active_size = 1 << 20;
  seg.requested_size = 1000000;
  seg.segment_type = s.strings.intern("large");
  seg.block_count = 2;
  s.segments.push_back(seg);
  s.blocks.push_back(Block{1 << 20, 1 << 20, 1000000, st, BlockState::ActiveAllocated, true});
  s.blocks.push_back(Block{2 << 20, 1 << 20, 4096, st, BlockState::Inactive, true});
  s.trace_begin = {0, 1};
  Event e;
  e.action = Action::Snapshot;
  s.events.push_back(e);

  std::vector<uint8_t> bytes = snapshotToPickle(s);
  EXPECT_EQ(countOccurrences(bytes, "history"), 1u);
  EXPECT_EQ(countOccurrences(bytes, "frames"), 1u);   // only inside history entries
  EXPECT_EQ(countOccurrences(bytes, "address"), 1u);  // the segment's; 2.0 blocks have none
  Snapshot back = roundTrip(s);
  EXPECT_EQ(back.traits.era(), "2.0");
  EXPECT_TRUE(back.traits.has_block_history);
}

// Everything a 2.12+ file can hold, built directly in the model: settings with roundup divisions,
// annotations, pool ids, expandable segments, and lists long enough for APPENDS batches and
// LONG_BINGET memo references.
TEST(SnapshotPickle, NewestFieldsAndLongListsRoundTrip) {
  Snapshot s;
  FormatTraits& t = s.traits;
  t.has_device_traces = t.has_block_address = t.has_segment_pool_id = t.has_time_us = true;
  t.has_allocator_settings = t.has_annotations_key = t.has_compile_context = true;
  t.has_graph_capture_key = t.has_user_metadata = t.has_pool_id = true;
  s.settings.present = true;
  s.settings.conf = "expandable_segments:True,roundup_power2_divisions:[256:4,>:1]";
  s.settings.max_split_size = 512ll << 20;
  s.settings.garbage_collection_threshold = 0.75;
  s.settings.expandable_segments = true;
  s.settings.has_roundup = true;
  for (int k = 0; k < 16; ++k) s.settings.roundup_power2_divisions[k] = k <= 8 ? 4 : 1;
  // Keys the model does not read, one of each kind of value, kept as they were (issue 30: 27 real
  // files lost release_lock_on_cudamalloc and the pinned_* keys in a round trip).
  using K = OtherSetting::Kind;
  s.settings.other = {{"release_lock_on_cudamalloc", K::Bool, 1, 0, ""},
                      {"pinned_num_register_threads", K::Int, -3, 0, ""},
                      {"pinned_max_bytes", K::UInt, static_cast<int64_t>(~uint64_t{0} - 1), 0, ""},
                      {"pinned_reserve_fraction", K::Float, 0, 0.125, ""},
                      {"backend", K::Str, 0, 0, "native"},
                      {"cuda_host_allocator", K::None, 0, 0, ""},
                      {"graph_capture_record_stream_reuse", K::Bool, 1, 0, ""}};

  // A 2500-frame stack (three APPENDS batches) and 600 distinct frames (memo indices past 255).
  std::vector<FrameId> deep;
  for (int i = 0; i < 2500; ++i) {
    std::string file = "f";
    file += std::to_string(i % 600);
    file += ".py";
    deep.push_back(s.stacks.internFrame(
        Frame{s.strings.intern(file), s.strings.intern("fn"), static_cast<uint64_t>(i)}));
  }
  StackId deep_stack = s.stacks.internStack(deep);
  s.pools.push_back({0, 0});
  s.pools.push_back({1, 7});

  Segment seg;
  seg.device = 1;
  seg.address = 0x7e0000000000;
  seg.stream = 0x55d5e1a0b0c0;
  seg.pool_a = 1;
  seg.pool_b = 7;
  seg.is_expandable = true;
  seg.segment_type = s.strings.intern("large");
  seg.stack = deep_stack;
  seg.first_block = 0;
  seg.block_count = 1200;  // two APPENDS batches
  for (uint32_t i = 0; i < seg.block_count; ++i) {
    bool active = i % 2 == 0;
    s.blocks.push_back(Block{seg.address + i * 4096ull, 4096, active ? 4000u : 0u,
                             active ? deep_stack : kEmptyStack,
                             active ? BlockState::ActiveAllocated : BlockState::Inactive, true});
    seg.total_size += 4096;
    if (active) {
      seg.allocated_size += 4096;
      seg.active_size += 4096;
      seg.requested_size += 4000;
    }
  }
  s.segments.push_back(seg);

  // Device 0 has an empty trace; device 1 has 2100 events.
  s.trace_begin = {0, 0};
  StrId cc = s.strings.intern("Torch-Compiled Region: 0/1");
  StrId na = s.strings.intern("N/A");
  StrId meta = s.strings.intern("{\"step\": 3}");
  for (int i = 0; i < 2100; ++i) {
    Event e;
    e.action = i % 3 == 0   ? Action::Alloc
               : i % 3 == 1 ? Action::FreeRequested
                            : Action::FreeCompleted;
    e.addr = seg.address + (i / 3) * 4096ull;
    e.size = 4000;
    e.stream = seg.stream;
    e.time_us = 1783874495854988ll + i;
    e.stack = i % 7 == 0 ? kNoStack : i % 7 == 1 ? kEmptyStack : deep_stack;
    e.notes = s.event_notes.intern(EventNotes{i % 2 ? cc : na, i % 5 ? kEmptyStr : meta});
    e.pool = static_cast<uint32_t>(i % 3);  // 0 = no pool_id key, 1 = (0, 0), 2 = (1, 7)
    s.events.push_back(e);
  }
  Event annotate;
  annotate.action = Action::Annotate;
  annotate.addr = seg.address;
  annotate.time_us = 1783874495999999ll;
  annotate.notes = s.event_notes.intern(EventNotes{.user_metadata = meta});
  s.events.push_back(annotate);
  t.has_annotate_action = true;
  s.trace_begin.push_back(s.events.size());
  s.annotations.push_back(Annotation{1, 1783874495854000ll, s.strings.intern("ProfilerStep#3"),
                                     s.strings.intern("START")});
  s.annotations.push_back(Annotation{1, 1783874495999000ll, s.strings.intern("ProfilerStep#3"),
                                     s.strings.intern("END")});

  Snapshot back = roundTrip(s);
  EXPECT_EQ(back.traits.era(), "2.14+");
  // Through a native trace (the Settings chunk's tag 7) and back to a pickle: the same bytes.
  trace::VectorSink sink;
  ASSERT_TRUE(writeSnapshotTrace(back, sink, {}).ok());
  Snapshot native = readBack(sink.data);
  ASSERT_EQ(native.settings.other.size(), s.settings.other.size());
  for (size_t k = 0; k < s.settings.other.size(); ++k) {
    const OtherSetting &p = s.settings.other[k], &q = native.settings.other[k];
    EXPECT_EQ(p.key, q.key);
    EXPECT_EQ(p.kind, q.kind) << p.key;
    EXPECT_EQ(p.i, q.i) << p.key;
    EXPECT_EQ(p.f, q.f) << p.key;
    EXPECT_EQ(p.s, q.s) << p.key;
  }
  ASSERT_EQ(back.traceCount(), 2u);
  EXPECT_TRUE(back.trace(0).empty());
  EXPECT_EQ(back.stacks.stack(back.segments[0].stack).size(), 2500u);

  // Each frame dict once: the deep stack's 2500 frames are 2500 distinct (file, line) pairs, the
  // frames list itself is written once although 1200 blocks, 1 segment and ~1500 events use it.
  std::vector<uint8_t> bytes = snapshotToPickle(s);
  EXPECT_EQ(countOccurrences(bytes, "f599.py"), 1u);
  EXPECT_LT(bytes.size(), 400000u);  // ~290 KB; without the shared frames list it would be ~100 MB
}

TEST(SnapshotPickle, EmptySnapshotsOfEachShape) {
  Snapshot list_form;
  list_form.traits.top_level_list = true;
  roundTrip(list_form);
  Snapshot dict_form;
  dict_form.traits.has_device_traces = true;
  dict_form.trace_begin = {0, 0};  // one device, empty trace
  Snapshot back = roundTrip(dict_form);
  EXPECT_EQ(back.traceCount(), 1u);
}

// ---------------------------------------------------------------------------------------------
// Streaming

TEST(SnapshotPickle, StreamedPiecesAddUpToTheBufferedBytes) {
  auto s = loadSnapshotFile(std::string(MEMF_SOURCE_DIR) + "/snapshots/sample_training.pickle");
  ASSERT_TRUE(s.ok()) << s.error().describe();
  std::vector<uint8_t> whole = snapshotToPickle(*s);
  std::vector<uint8_t> streamed;
  size_t pieces = 0;
  Status st = writeSnapshotPickle(*s, [&](std::span<const uint8_t> p) -> Status {
    streamed.insert(streamed.end(), p.begin(), p.end());
    ++pieces;
    return Status::Ok();
  });
  ASSERT_TRUE(st.ok()) << st.error().describe();
  EXPECT_TRUE(streamed == whole);
  EXPECT_GE(pieces, 1u);

  // The writer's own flushing, with a tiny threshold so that every opcode crosses it.
  PickleWriter buffered(4);
  std::vector<uint8_t> out;
  size_t calls = 0;
  PickleWriter streaming(
      4,
      [&](std::span<const uint8_t> p) -> Status {
        out.insert(out.end(), p.begin(), p.end());
        ++calls;
        return Status::Ok();
      },
      7);
  for (PickleWriter* w : {&buffered, &streaming}) {
    w->beginList(true);
    for (int i = 0; i < 50; ++i) {
      w->str("a fairly long string " + std::to_string(i));
      w->uinteger(kUnknownLine);
      w->get(0);
    }
    w->endList();
  }
  ASSERT_TRUE(streaming.finishStream().ok());
  EXPECT_TRUE(out == buffered.finish());
  EXPECT_GT(calls, 50u);
}

TEST(SnapshotPickle, SinkErrorStopsTheWriterAndIsReturned) {
  auto s = loadSnapshotFile(std::string(MEMF_SOURCE_DIR) + "/snapshots/sample_training.pickle");
  ASSERT_TRUE(s.ok()) << s.error().describe();
  size_t calls = 0;
  Status st = writeSnapshotPickle(*s, [&](std::span<const uint8_t>) -> Status {
    ++calls;
    return Error{"disk full"};
  });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message, "disk full");
  EXPECT_EQ(calls, 1u);

  PickleWriter w(
      4, [&](std::span<const uint8_t>) -> Status { return Error{"no space"}; }, 4);
  w.str("0123456789");
  EXPECT_FALSE(w.status().ok());
  w.str("more");
  Status end = w.finishStream();
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.error().message, "no space");
}

}  // namespace
}  // namespace memforensics::format
