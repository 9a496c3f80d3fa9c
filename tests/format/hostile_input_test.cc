// hostile_input_test.cc: inputs that must be refused cleanly: code-executing opcodes, truncation at
// every byte, corrupted bytes, malformed structure. Never a crash, never code execution.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "fixtures/snapshot_builder.h"
#include "format/pickle/pickle_reader.h"
#include "format/pickle/pickle_writer.h"

namespace memforensics::format {
namespace {

using memforensics::testing::buildPickle;
using memforensics::testing::TSnapshot;

TSnapshot smallSnapshot() {
  TSnapshot t;
  t.segments.push_back({0,
                        0x7f0000000000,
                        0,
                        "large",
                        {{1048576, 1000000, "active_allocated", {{"train.py", 10, "main"}}},
                         {19922944, 0, "inactive", {}}}});
  t.traces.push_back({{"segment_alloc", 0x7f0000000000, 20971520, 0, 1, {}, false},
                      {"alloc", 0x7f0000000000, 1000000, 0, 2, {{"train.py", 10, "main"}}, true},
                      {"alloc", 0x7f0000100000, 5000, 0, 3, {{"train.py", 11, "main"}}, true},
                      {"free_requested", 0x7f0000100000, 5000, 0, 4, {}, false},
                      {"free_completed", 0x7f0000100000, 5000, 0, 4, {}, false}});
  return t;
}

struct Refused {
  const char* name;
  std::vector<uint8_t> bytes;
};

TEST(HostileInput, CodeExecutingOpcodesAreRefusedWithNameAndOffset) {
  // Classic payloads: os.system via GLOBAL+REDUCE, STACK_GLOBAL, INST, OBJ, NEWOBJ, BUILD, PERSID.
  std::vector<Refused> cases = {
      {"GLOBAL", {0x80, 2,   'c', 'o', 's', '\n', 's', 'y', 's',  't', 'e', 'm',
                  '\n', 'X', 2,   0,   0,   0,    'i', 'd', 0x85, 'R', '.'}},
      {"STACK_GLOBAL",
       {0x80, 4, 0x8c, 2, 'o', 's', 0x8c, 6, 's', 'y', 's', 't', 'e', 'm', 0x93, '.'}},
      {"REDUCE", {0x80, 4, 'N', ')', 'R', '.'}},
      {"BUILD", {0x80, 4, '}', '}', 'b', '.'}},
      {"INST", {0x80, 2, '(', 'i', 'o', 's', '\n', 's', 'y', 's', 't', 'e', 'm', '\n', '.'}},
      {"OBJ", {0x80, 2, '(', 'N', 'o', '.'}},
      {"NEWOBJ", {0x80, 2, 'N', ')', 0x81, '.'}},
      {"NEWOBJ_EX", {0x80, 4, 'N', ')', '}', 0x92, '.'}},
      {"PERSID", {0x80, 2, 'P', 'x', '\n', '.'}},
      {"BINPERSID", {0x80, 2, 'N', 'Q', '.'}},
      {"EXT1", {0x80, 2, 0x82, 1, '.'}},
      {"EXT2", {0x80, 2, 0x83, 1, 0, '.'}},
      {"EXT4", {0x80, 2, 0x84, 1, 0, 0, 0, '.'}},
  };
  for (const auto& c : cases) {
    auto r = readSnapshotPickle(c.bytes);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_NE(r.error().message.find(std::string("refused opcode ") + c.name + " "),
              std::string::npos)
        << c.name << ": " << r.error().message;
    EXPECT_GE(r.error().offset, 2) << c.name;
  }
}

TEST(HostileInput, RefusalOffsetPointsAtTheOpcode) {
  std::vector<uint8_t> b = {0x80, 4, 'N', 'N', ')', 'R', '.'};
  auto r = readSnapshotPickle(b);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().offset, 5);
  EXPECT_EQ(r.error().describe().find("(at byte offset 5)") != std::string::npos, true);
}

TEST(HostileInput, PayloadAfterAValidPrefixIsStillRefused) {
  // A snapshot-looking dict whose value is built by REDUCE must not load.
  PickleWriter w(4);
  w.beginDict();
  w.str("segments");
  w.raw({0x8c, 8, 'b', 'u', 'i', 'l', 't', 'i', 'n', 's', 0x8c, 4, 'e', 'v', 'a', 'l', 0x93});
  w.raw({0x8c, 4, '1', '+', '1', '1', 0x85, 'R'});
  w.endDict();
  auto r = readSnapshotPickle(w.finish());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("STACK_GLOBAL"), std::string::npos);
}

TEST(HostileInput, UnsupportedButHarmlessOpcodesGetAClearError) {
  for (auto [op, name] : std::vector<std::pair<uint8_t, const char*>>{{'I', "INT"},
                                                                      {'S', "STRING"},
                                                                      {'B', "BINBYTES"},
                                                                      {0x8f, "EMPTY_SET"},
                                                                      {0x97, "NEXT_BUFFER"}}) {
    std::vector<uint8_t> b = {0x80, 4, op, '.'};
    auto r = readSnapshotPickle(b);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find(std::string("unsupported opcode ") + name), std::string::npos)
        << r.error().message;
  }
}

TEST(HostileInput, TruncationAtEveryByteIsACleanError) {
  auto full = buildPickle(smallSnapshot());
  ASSERT_TRUE(readSnapshotPickle(full).ok());
  for (size_t cut = 0; cut < full.size(); ++cut) {
    std::vector<uint8_t> part(full.begin(), full.begin() + static_cast<ptrdiff_t>(cut));
    auto r = readSnapshotPickle(part);
    ASSERT_FALSE(r.ok()) << "cut at " << cut << " parsed";
    EXPECT_FALSE(r.error().message.empty());
  }
}

TEST(HostileInput, BadMemoAndStackReferencesAreErrors) {
  std::vector<std::pair<std::vector<uint8_t>, std::string>> cases = {
      {{0x80, 4, 'h', 5, '.'}, "read before it was stored"},
      {{0x80, 4, 'r', 0xff, 0xff, 0xff, 0x7f, '.'}, "memo store with an empty stack"},
      {{0x80, 4, 'N', 'r', 0xff, 0xff, 0xff, 0x7f, '.'}, "far beyond"},
      {{0x80, 4, 'e', '.'}, "without a MARK"},
      {{0x80, 4, 'N', 'N', 'a', '.'}, "expected a list"},
      {{0x80, 4, '(', 'u', '.'}, "no container"},
      {{0x80, 4, '.'}, "STOP with 0 objects"},
      {{0x80, 9, '.'}, "protocol 9"},
      {{0x80, 4, 'N', 'N', '.'}, "STOP with 2 objects"},
      {{0x80, 4, 'K', 1, '.'}, "the pickle holds an int"},
      {{0x80, 4, '}', '(', ']', 'K', 1, 'u', '.'}, "dict key is a list"},
  };
  for (const auto& [bytes, expect] : cases) {
    auto r = readSnapshotPickle(bytes);
    ASSERT_FALSE(r.ok()) << expect;
    EXPECT_NE(r.error().message.find(expect), std::string::npos) << r.error().message;
  }
}

TEST(HostileInput, RandomByteFlipsNeverCrash) {
  auto full = buildPickle(smallSnapshot());
  std::mt19937 rng(1234);
  int parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    auto b = full;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    auto r = readSnapshotPickle(b);
    parsed += r.ok();
    if (!r.ok()) {
      EXPECT_FALSE(r.error().message.empty());
    }
  }
  // Most flips hit strings or integers and still parse; the rest are clean errors.
  EXPECT_GT(parsed, 0);
}

TEST(HostileInput, TruncatedRealSnapshotIsACleanErrorAtManyCutPoints) {
  namespace fs = std::filesystem;
  fs::path p =
      fs::path(MEMF_REAL_SNAPSHOTS) / "silmont2000__assignment2-systems__mem_snapshot.pickle";
  if (!fs::exists(p)) GTEST_SKIP() << "real snapshots not found at " << MEMF_REAL_SNAPSHOTS;
  std::ifstream in(p, std::ios::binary);
  std::vector<uint8_t> full((std::istreambuf_iterator<char>(in)), {});
  ASSERT_TRUE(readSnapshotPickle(full).ok());
  for (size_t cut = 0; cut < full.size(); cut += 1 + full.size() / 997) {
    std::vector<uint8_t> part(full.begin(), full.begin() + static_cast<ptrdiff_t>(cut));
    auto r = readSnapshotPickle(part);
    ASSERT_FALSE(r.ok()) << "cut at " << cut;
    EXPECT_LE(r.error().offset, static_cast<int64_t>(cut));
  }
}

}  // namespace
}  // namespace memforensics::format
