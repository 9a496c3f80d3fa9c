// pickle_reader_test.cc: every supported opcode, memo sharing, integer edge cases, model shapes.
#include "format/pickle/pickle_reader.h"

#include <gtest/gtest.h>

#include "fixtures/snapshot_builder.h"
#include "format/pickle/pickle_writer.h"

namespace memforensics::format {
namespace {

using memforensics::testing::buildPickle;
using memforensics::testing::TSnapshot;

Expected<Snapshot> read(const std::vector<uint8_t>& b) {
  return readSnapshotPickle(b);
}

// A minimal valid snapshot whose one trace event's fields are written by `body`.
template <typename F>
std::vector<uint8_t> oneEvent(F body, int protocol = 4) {
  PickleWriter w(protocol);
  w.beginDict();
  w.str("segments");
  w.beginList();
  w.endList();
  w.str("device_traces");
  w.beginList();
  w.beginList();
  w.beginDict();
  body(w);
  w.endDict();
  w.endList();
  w.endList();
  w.endDict();
  return w.finish();
}

TEST(PickleReader, ReadsEventFieldsWithEveryIntegerEncoding) {
  auto bytes = oneEvent([](PickleWriter& w) {
    w.str("action");
    w.str("alloc");
    w.str("addr");
    w.uinteger(0x7f12345600ULL);  // LONG1, 5 bytes
    w.str("size");
    w.integer(70000);  // BININT
    w.str("stream");
    w.integer(-1);  // negative BININT
    w.str("time_us");
    w.integer(1783874495854988LL);  // LONG1, 7 bytes
    w.str("compile_context");
    w.str("N/A");
    w.str("user_metadata");
    w.str("step=3");
  });
  auto s = read(bytes);
  ASSERT_TRUE(s.ok()) << s.error().describe();
  ASSERT_EQ(s->traceCount(), 1u);
  auto tr = s->trace(0);
  ASSERT_EQ(tr.size(), 1u);
  const Event& e = tr[0];
  EXPECT_EQ(e.action, Action::Alloc);
  EXPECT_EQ(e.addr, 0x7f12345600ULL);
  EXPECT_EQ(e.size, 70000u);
  EXPECT_EQ(e.stream, -1);
  EXPECT_EQ(e.time_us, 1783874495854988LL);
  EXPECT_EQ(s->strings.get(s->notesOf(e).compile_context), "N/A");
  EXPECT_EQ(s->strings.get(s->notesOf(e).user_metadata), "step=3");
  EXPECT_EQ(s->notesOf(e).action_name, kEmptyStr);  // a known action keeps no name
  EXPECT_EQ(e.stack, kNoStack);                     // key absent
  EXPECT_TRUE(s->traits.has_time_us);
  EXPECT_TRUE(s->traits.has_user_metadata);
}

TEST(PickleReader, NineByteLong1LineIsUnknownLine) {
  // A real 2.6 file stores an unknown frame line as 2^64-1: LONG1 with 9 bytes.
  auto bytes = oneEvent([](PickleWriter& w) {
    w.str("action");
    w.str("alloc");
    w.str("addr");
    w.integer(4096);
    w.str("size");
    w.integer(512);
    w.str("stream");
    w.integer(0);
    w.str("frames");
    w.beginList();
    w.beginDict();
    w.str("filename");
    w.str("??");
    w.str("line");
    w.uinteger(~uint64_t{0});
    w.str("name");
    w.str("f");
    w.endDict();
    w.endList();
  });
  auto s = read(bytes);
  ASSERT_TRUE(s.ok()) << s.error().describe();
  auto frames = s->stacks.stack(s->trace(0)[0].stack);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(s->stacks.frame(frames[0]).line, kUnknownLine);
}

TEST(PickleReader, MemoSharedFramesListsBecomeOneStack) {
  // Python memoizes a frames list once and refers to it with BINGET for later events.
  PickleWriter w(4);
  w.beginDict();
  w.str("segments");
  w.beginList();
  w.endList();
  w.str("device_traces");
  w.beginList();
  w.beginList();
  for (int i = 0; i < 3; ++i) {
    w.beginDict();
    w.str("action");
    w.str("alloc");
    w.str("addr");
    w.integer(512 * (i + 1));
    w.str("size");
    w.integer(100);
    w.str("stream");
    w.integer(0);
    w.str("frames");
    if (i == 0) {
      w.raw({']'});  // EMPTY_LIST
      w.memoize();   // memo 0 = the frames list
      w.raw({'('});
      w.beginDict();
      w.str("filename");
      w.str("a.py");
      w.str("line");
      w.integer(1);
      w.str("name");
      w.str("f");
      w.endDict();
      w.beginDict();
      w.str("filename");
      w.str("b.py");
      w.str("line");
      w.integer(2);
      w.str("name");
      w.str("g");
      w.endDict();
      w.endList();
    } else {
      w.get(0);
    }
    w.endDict();
  }
  w.endList();
  w.endList();
  w.endDict();
  auto s = read(w.finish());
  ASSERT_TRUE(s.ok()) << s.error().describe();
  auto tr = s->trace(0);
  ASSERT_EQ(tr.size(), 3u);
  EXPECT_EQ(tr[0].stack, tr[1].stack);
  EXPECT_EQ(tr[1].stack, tr[2].stack);
  EXPECT_EQ(s->stacks.stack(tr[0].stack).size(), 2u);
  EXPECT_EQ(s->strings.get(s->stacks.frame(s->stacks.stack(tr[0].stack)[0]).filename), "a.py");
}

TEST(PickleReader, ProtocolTwoWithBinputAndEmptyListsParses) {
  TSnapshot t;
  t.protocol = 2;
  t.segments.push_back(
      {0,
       0x10000,
       0,
       "small",
       {{512, 100, "active_allocated", {{"x.py", 3, "h"}}}, {2096640, 0, "inactive", {}}}});
  t.traces.push_back({{"alloc", 0x10000, 100, 0, 5, {{"x.py", 3, "h"}}, true}});
  auto s = read(buildPickle(t));
  ASSERT_TRUE(s.ok()) << s.error().describe();
  EXPECT_EQ(s->pickle_protocol, 2);
  ASSERT_EQ(s->segments.size(), 1u);
  EXPECT_FALSE(s->segments[0].is_large);
  ASSERT_EQ(s->blocks.size(), 2u);
  EXPECT_EQ(s->blocks[1].address, 0x10000u + 512);
  EXPECT_EQ(s->blocks[0].state, BlockState::ActiveAllocated);
  EXPECT_EQ(s->blocks[1].stack, kEmptyStack);
}

TEST(PickleReader, TopLevelListIsASegmentList) {
  PickleWriter w(4);
  w.beginList();
  w.beginDict();
  w.str("device");
  w.integer(1);
  w.str("address");
  w.integer(1 << 20);
  w.str("total_size");
  w.integer(2097152);
  w.str("stream");
  w.integer(0);
  w.str("segment_type");
  w.str("small");
  w.str("blocks");
  w.beginList();
  // 1.13 legacy block: no address, history[0] carries the requested size and frames.
  w.beginDict();
  w.str("size");
  w.integer(2097152);
  w.str("state");
  w.str("active_allocated");
  w.str("history");
  w.beginList();
  w.beginDict();
  w.str("addr");
  w.integer(1 << 20);
  w.str("real_size");
  w.integer(2000000);
  w.str("frames");
  w.beginList();
  w.endList();
  w.endDict();
  w.endList();
  w.endDict();
  w.endList();
  w.endDict();
  w.endList();
  auto s = read(w.finish());
  ASSERT_TRUE(s.ok()) << s.error().describe();
  EXPECT_TRUE(s->traits.top_level_list);
  EXPECT_TRUE(s->traits.has_block_history);
  ASSERT_EQ(s->blocks.size(), 1u);
  EXPECT_EQ(s->blocks[0].address, 1u << 20);
  EXPECT_EQ(s->blocks[0].requested_size, 2000000u);
  EXPECT_EQ(s->devices(), std::vector<int64_t>{1});
}

TEST(PickleReader, OtherPlainOpcodesAreAccepted) {
  // NONE, DICT/LIST/TUPLE built from marks, TUPLE1/3, SETITEM, POP, POP_MARK, DUP, BINFLOAT,
  // BINUNICODE8, LONG4, NEWTRUE/NEWFALSE, FRAME: all legal, none executes anything.
  PickleWriter w(4);
  w.raw({0x95, 2, 0, 0, 0, 0, 0, 0, 0});            // FRAME of 2 bytes (just skipped)
  w.raw({'N', '0'});                                // NONE, POP
  w.raw({'(', 'N', '1'});                           // MARK NONE POP_MARK
  w.raw({'(', 'l', '0'});                           // MARK LIST POP
  w.raw({'(', 'd', '0'});                           // MARK DICT POP
  w.raw({'K', 1, 0x85, '0'});                       // BININT1 TUPLE1 POP
  w.raw({'K', 1, 'K', 2, 'K', 3, 0x87, '0'});       // TUPLE3
  w.raw({'(', 'K', 1, 't', '0'});                   // MARK ... TUPLE
  w.raw({0x8b, 2, 0, 0, 0, 1, 2, '0'});             // LONG4
  w.raw({0x88, '2', '0', '0'});                     // NEWTRUE DUP POP POP
  w.raw({0x8d, 1, 0, 0, 0, 0, 0, 0, 0, 'x', '0'});  // BINUNICODE8
  w.raw({0x89, '0'});
  w.beginDict();
  w.str("segments");
  w.raw({']'});
  w.str("allocator_settings");
  w.raw({'}'});
  w.str("garbage_collection_threshold");
  w.floating(0.5);
  w.raw({'s'});  // SETITEM on the settings dict
  w.endDict();
  auto s = read(w.finish());
  ASSERT_TRUE(s.ok()) << s.error().describe();
  EXPECT_TRUE(s->settings.present);
  EXPECT_DOUBLE_EQ(s->settings.garbage_collection_threshold, 0.5);
}

// allocator_settings keys the model does not read are kept with their values, within bounds: a
// memoized 1 MiB string named by 4,096 keys is not copied 4,096 times (it was, 4 GiB), and past
// kMaxOtherSettings keys the rest are counted in a warning. A second allocator_settings dict
// replaces the first, as in Python.
TEST(PickleReader, OtherAllocatorSettingsAreKeptWithinBounds) {
  PickleWriter w(4);
  w.beginDict();
  w.str("segments");
  w.beginList();
  w.endList();
  w.str("allocator_settings");
  w.beginDict();
  w.str("release_lock_on_cudamalloc");
  w.boolean(true);
  w.endDict();
  w.str("allocator_settings");
  w.beginDict();
  w.str("pinned_use_cuda_host_register");
  w.boolean(false);
  w.str("big");
  w.str(std::string(size_t{1} << 20, 'x'));
  const uint32_t big = w.memoCount();
  w.memoize();
  for (int i = 0; i < 4096; ++i) {
    w.str("k" + std::to_string(i));
    if (i % 2)
      w.get(big);
    else
      w.integer(i);
  }
  w.endDict();
  w.endDict();
  auto s = read(w.finish());
  ASSERT_TRUE(s.ok()) << s.error().describe();
  const auto& other = s->settings.other;
  ASSERT_EQ(other.size(), kMaxOtherSettings);
  EXPECT_EQ(other[0].key, "pinned_use_cuda_host_register");  // the first dict is gone
  EXPECT_EQ(other[0].kind, OtherSetting::Kind::Bool);
  EXPECT_EQ(other[0].i, 0);
  EXPECT_EQ(other[1].key, "k0");  // "big" is over kMaxOtherSettingBytes
  EXPECT_EQ(other[1].kind, OtherSetting::Kind::Int);
  size_t bytes = 0;
  for (const auto& o : other) bytes += o.key.size() + o.s.size();
  EXPECT_LT(bytes, kMaxOtherSettings * kMaxOtherSettingBytes);
  bool warned = false;
  for (const auto& wn : s->load_warnings)
    warned |= wn.find("allocator_settings entries not kept") != std::string::npos;
  EXPECT_TRUE(warned);
}

TEST(PickleReader, AllocatorSettingsRoundupDivisions) {
  PickleWriter w(4);
  w.beginDict();
  w.str("segments");
  w.beginList();
  w.endList();
  w.str("allocator_settings");
  w.beginDict();
  w.str("PYTORCH_CUDA_ALLOC_CONF");
  w.str("roundup_power2_divisions:4");
  w.str("max_split_size");
  w.integer(-1);
  w.str("expandable_segments");
  w.boolean(true);
  w.str("roundup_power2_divisions");
  w.beginDict();
  w.str("1");
  w.integer(4);
  w.str("64");
  w.integer(8);
  w.str("3");
  w.integer(2);  // not a power of two: ignored
  w.str("128");
  w.integer(int64_t{1} << 40);  // a division the model cannot hold: ignored, and said
  w.endDict();
  w.endDict();
  w.endDict();
  auto s = read(w.finish());
  ASSERT_TRUE(s.ok()) << s.error().describe();
  EXPECT_EQ(s->settings.conf, "roundup_power2_divisions:4");
  EXPECT_EQ(s->settings.max_split_size, -1);
  EXPECT_TRUE(s->settings.expandable_segments);
  EXPECT_EQ(s->settings.roundup_power2_divisions[0], 4u);
  EXPECT_EQ(s->settings.roundup_power2_divisions[6], 8u);
  EXPECT_EQ(s->settings.roundup_power2_divisions[1], 0u);
  EXPECT_EQ(s->settings.roundup_power2_divisions[7], 0u);
  size_t warned = 0;
  for (const auto& wn : s->load_warnings)
    warned += wn.find("2 roundup_power2_divisions entries not kept") != std::string::npos;
  EXPECT_EQ(warned, 1u) << "the entries the model cannot hold are said, not dropped in silence";
  EXPECT_EQ(s->traits.era(), "2.3-2.4");
}

TEST(PickleReader, MissingRequiredKeyNamesThePath) {
  PickleWriter w(4);
  w.beginDict();
  w.str("segments");
  w.beginList();
  w.beginDict();
  w.str("address");
  w.integer(0);
  w.str("total_size");
  w.integer(512);
  w.str("blocks");
  w.beginList();
  w.beginDict();
  w.str("state");
  w.str("inactive");
  w.endDict();
  w.endList();
  w.endDict();
  w.endList();
  w.endDict();
  auto s = read(w.finish());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message, "segments[0].blocks[0]: missing key 'size'");
}

TEST(PickleReader, BlocksMustCoverTheSegment) {
  TSnapshot t;
  t.segments.push_back({0, 0x10000, 0, "large", {{1024, 1000, "active_allocated", {}}}});
  auto bytes = buildPickle(t);
  // Corrupt total_size: 1024 is written as BININT2 0x0400; find it after "total_size".
  std::string needle = "total_size";
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  ASSERT_NE(it, bytes.end());
  auto pos = static_cast<size_t>(it - bytes.begin()) + needle.size();
  while (bytes[pos] != 'M') ++pos;
  bytes[pos + 2] = 0x08;  // 1024 -> 2048
  auto s = read(bytes);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("blocks cover 1024 bytes but total_size is 2048"),
            std::string::npos)
      << s.error().message;
}

}  // namespace
}  // namespace memforensics::format
