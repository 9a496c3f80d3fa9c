// pickle_budget_test.cc: the reader's budgets (pickle_reader.h) against inputs that are small but
// expand: one frames list filled an APPEND at a time, memo strides, one memoized list referenced
// from many places, a valid pickle padded with zeros; the messages for out-of-range integers and
// unclosed MARKs; negative sizes and out-of-range times. Every input is built here, opcode by
// opcode.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/sanitizers.h"
#include "format/load/load.h"
#include "format/pickle/pickle_reader.h"

namespace memforensics::format {
namespace {

// Tests that run the reader under an address-space limit (RLIMIT_AS) skip themselves under a
// sanitizer, whose shadow memory needs terabytes of address space.
#define MEMF_SKIP_WITHOUT_ADDRESS_LIMITS()                                   \
  do {                                                                       \
    if (kSanitizerRuntime) {                                                 \
      GTEST_SKIP() << "address-space limits do not apply under a sanitizer"; \
    }                                                                        \
  } while (0)

// A tiny pickle assembler: opcodes as Python's pickletools names them.
struct P {
  std::vector<uint8_t> b{0x80, 4};
  P& op(uint8_t c) {
    b.push_back(c);
    return *this;
  }
  P& ops(const std::string& s) {
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  P& str(const std::string& s) {  // SHORT_BINUNICODE
    b.push_back(0x8c);
    b.push_back(static_cast<uint8_t>(s.size()));
    return ops(s);
  }
  P& int1(uint8_t v) { return op('K').op(v); }
  P& int4(int32_t v) {
    op('J');
    uint8_t x[4];
    std::memcpy(x, &v, 4);
    b.insert(b.end(), x, x + 4);
    return *this;
  }
  P& long1(const std::vector<uint8_t>& le) {
    op(0x8a).op(static_cast<uint8_t>(le.size()));
    b.insert(b.end(), le.begin(), le.end());
    return *this;
  }
  P& memoize() { return op(0x94); }
  P& get(uint32_t i) {
    if (i < 256) return op('h').op(static_cast<uint8_t>(i));
    op('j');
    uint8_t x[4];
    std::memcpy(x, &i, 4);
    b.insert(b.end(), x, x + 4);
    return *this;
  }
  P& longPut(uint32_t i) {
    op('r');
    uint8_t x[4];
    std::memcpy(x, &i, 4);
    b.insert(b.end(), x, x + 4);
    return *this;
  }
  P& frameDict() {  // {filename: "a.py", line: 1, name: "f"}
    return op('}')
        .op('(')
        .str("filename")
        .str("a.py")
        .str("line")
        .int1(1)
        .str("name")
        .str("f")
        .op('u');
  }
  // {action: "alloc", addr: 0, size: 1} and then `extra` key/value opcodes before SETITEMS.
  P& event(const std::function<void(P&)>& extra = nullptr) {
    op('}').op('(').str("action").str("alloc").str("addr").int1(0).str("size").int1(1);
    if (extra) extra(*this);
    return op('u');
  }
  std::vector<uint8_t> stop() {
    b.push_back('.');
    return b;
  }
};

// {"segments": [], "device_traces": [[EVENTS]]} where `events` writes the inner list's items
// (between a MARK and APPENDS).
std::vector<uint8_t> withTrace(const std::function<void(P&)>& events) {
  P p;
  p.op('}').op('(').str("segments").op(']').str("device_traces").op(']').op(']').op('(');
  events(p);
  return p.op('e').op('a').op('u').stop();
}

TEST(PickleBudget, FramesListFilledOneAppendAtATimeIsInternedOnce) {
  // memory_viz and hand-written pickles fill a list with APPEND; Python's pickler with APPENDS of
  // 1000. Before: every APPEND/APPENDS interned a new, one-longer copy of the stack (quadratic:
  // 30,000 APPENDs in a 90 KB file took 3 GB).
  for (int batch : {1, 1000}) {
    SCOPED_TRACE(batch);
    const int n = 5000;
    auto bytes = withTrace([&](P& p) {
      p.event([&](P& e) {
        e.str("frames").frameDict().memoize().op('0').op(']');  // the frame dict in memo 0
        for (int i = 0; i < n; i += batch) {
          if (batch == 1) {
            e.get(0).op('a');
          } else {
            e.op('(');
            for (int k = 0; k < batch && i + k < n; ++k) e.get(0);
            e.op('e');
          }
        }
      });
    });
    auto snap = readSnapshotPickle(bytes);
    ASSERT_TRUE(snap.ok()) << snap.error().describe();
    ASSERT_EQ(snap->events.size(), 1u);
    EXPECT_EQ(snap->stacks.stack(snap->events[0].stack).size(), static_cast<size_t>(n));
    // none, empty, the first batch (interned at once, as before) and the whole list
    EXPECT_LE(snap->stacks.stackCount(), 4u);
  }
}

TEST(PickleBudget, FramesListAppendedToAfterEveryUseIsBounded) {
  // A list referenced by an event after each APPEND is copied out again each time: the frames
  // budget stops that at a size proportional to the input.
  auto bytes = withTrace([&](P& p) {
    p.frameDict().memoize().op('0').op(']').memoize().op('0');  // memo 0: frame, memo 1: the list
    for (int i = 0; i < 8000; ++i) {
      p.get(1).get(0).op('a').op('0');  // list.append(frame)
      p.event([](P& e) { e.str("frames").get(1); });
    }
  });
  auto snap = readSnapshotPickle(bytes);
  ASSERT_FALSE(snap.ok());
  EXPECT_NE(snap.error().message.find("more stack frames than an input of"), std::string::npos)
      << snap.error().message;
}

TEST(PickleBudget, MemoStridesCannotGrowTheMemoPastTheInputSize) {
  // Each LONG_BINPUT leaves a gap of 65,536 (the per-step limit) and the next one starts from
  // there: 5 bytes grew the memo by 512 KB (328 KB of them asked for 4 G entries).
  P p;
  p.op('N');
  for (uint32_t i = 1; i <= 40; ++i) p.longPut(65536 * i);
  p.op('0').op(']');
  auto snap = readSnapshotPickle(p.stop());
  ASSERT_FALSE(snap.ok());
  EXPECT_NE(snap.error().message.find("far beyond"), std::string::npos) << snap.error().message;
  EXPECT_NE(snap.error().message.find("bytes can store"), std::string::npos)
      << snap.error().message;
  EXPECT_GT(snap.error().offset, 2);
}

TEST(PickleBudget, OneTraceListReferencedFromManyDevicesIsRefused) {
  // One memoized list of 1,000 entries as the trace of 1,000 devices: before, each reference was
  // copied (198 KB became 1.8 GB). Now the copy is bounded by the records budget.
  P p;
  p.op('}').op('(').str("segments").op(']').str("device_traces").op(']').op('(');
  p.op(']').op('(').event();
  for (int i = 1; i < 1000; ++i) p.op('2');  // DUP: the same entry 1,000 times
  p.op('e').memoize();                       // memo 0: the list
  for (int i = 1; i < 1000; ++i) p.get(0);
  p.op('e').op('u');
  auto snap = readSnapshotPickle(p.stop());
  ASSERT_FALSE(snap.ok());
  EXPECT_NE(snap.error().message.find("expands to more than"), std::string::npos)
      << snap.error().message;
  EXPECT_NE(snap.error().message.find("device_traces["), std::string::npos) << snap.error().message;
}

TEST(PickleBudget, AListReferencedTwiceWithinTheBudgetIsStillCopied) {
  P p;
  p.op('}').op('(').str("segments").op(']').str("device_traces").op(']').op('(');
  p.op(']').op('(').event().event().op('e').memoize().get(0);
  p.op('e').op('u');
  auto snap = readSnapshotPickle(p.stop());
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  EXPECT_EQ(snap->traceCount(), 2u);
  EXPECT_EQ(snap->trace(0).size(), 2u);
  EXPECT_EQ(snap->trace(1).size(), 2u);
}

TEST(PickleBudget, OneBlocksListReferencedFromManySegmentsIsRefused) {
  P p;
  p.op('}').op('(').str("segments").op(']').op('(');
  p.op('}').op('(').str("device").int1(0).str("address").int1(0).str("total_size").int4(2000);
  p.str("blocks")
      .op(']')
      .op('(')
      .op('}')
      .op('(')
      .str("size")
      .int1(1)
      .str("state")
      .str("inactive")
      .op('u');
  for (int i = 1; i < 2000; ++i) p.op('2');
  p.op('e').op('u').memoize();  // memo 0: the segment dict (its blocks list inside)
  for (int i = 1; i < 1000; ++i) p.get(0);
  p.op('e').op('u');
  auto snap = readSnapshotPickle(p.stop());
  ASSERT_FALSE(snap.ok());
  EXPECT_NE(snap.error().message.find("expands to more than"), std::string::npos)
      << snap.error().message;
}

TEST(PickleBudget, DupAcrossAStackGrowthKeepsTheValue) {
  // DUP when the value stack is full pushed a reference into the array it then reallocated (a
  // segfault on the 198 KB shared-trace input). 300,000 DUPs of one entry: one list, all valid.
  auto bytes = withTrace([](P& p) {
    p.event();
    for (int i = 1; i < 300000; ++i) p.op('2');
  });
  auto snap = readSnapshotPickle(bytes);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  ASSERT_EQ(snap->events.size(), 300000u);
  EXPECT_EQ(snap->events.back().action, Action::Alloc);
  EXPECT_EQ(snap->events.back().size, 1u);
}

TEST(PickleBudget, ARepeatedUnknownKeyIsListedOnce) {
  // The same 64 KiB key 20,000 times (3 bytes each): each was copied into ignored_keys (1.3 GB).
  P p;
  p.op('}').op('(').str("segments").op(']');
  std::string key(65536, 'k');
  p.op('X');
  uint32_t n = static_cast<uint32_t>(key.size());
  uint8_t x[4];
  std::memcpy(x, &n, 4);
  p.b.insert(p.b.end(), x, x + 4);
  p.ops(key).memoize().op('N');
  for (int i = 1; i < 20000; ++i) p.get(0).op('N');
  p.op('u');
  auto snap = readSnapshotPickle(p.stop());
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  EXPECT_EQ(snap->ignored_keys.size(), 1u);
}

// In a death-test child: limits the address space to what is mapped now plus `extra` bytes, loads
// `path`, and returns 0 when it loaded with one event.
int loadUnderAddressLimit(const std::string& path, uint64_t extra) {
  long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + extra;
  rlimit lim{limit, limit};
  ::setrlimit(RLIMIT_AS, &lim);
  auto snap = loadSnapshotFile(path);
  return snap.ok() && snap->events.size() == 1 ? 0 : 3;
}

// In a death-test child: like loadUnderAddressLimit, 0 when the load failed with `expect` in its
// message (rather than running out of memory).
int failsUnderAddressLimit(const std::string& path, uint64_t extra, const std::string& expect) {
  long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + extra;
  rlimit lim{limit, limit};
  ::setrlimit(RLIMIT_AS, &lim);
  auto snap = loadSnapshotFile(path);
  return !snap.ok() && snap.error().message.find(expect) != std::string::npos ? 0 : 3;
}

TEST(PickleBudget, ZeroPaddedPickleReservesNothingFromTheFileSize) {
  MEMF_SKIP_WITHOUT_ADDRESS_LIMITS();
  // A valid pickle followed by 1 GiB of zeros (a sparse file): the reader stops at STOP. Before,
  // it reserved nodes, memo and events from the file size (3.5 GB of address space) and failed
  // under a 768 MiB limit beyond the map of the file itself.
  namespace fs = std::filesystem;
  fs::path path =
      fs::temp_directory_path() / ("memf_padded_" + std::to_string(::getpid()) + ".pickle");
  {
    auto bytes = withTrace([](P& p) { p.event(); });
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  const uint64_t padded = uint64_t{1} << 30;
  fs::resize_file(path, padded);
  EXPECT_EXIT(std::_Exit(loadUnderAddressLimit(path.string(), padded + (uint64_t{768} << 20))),
              ::testing::ExitedWithCode(0), "");
  fs::remove(path);
}

// 100,000 nested lists (tools/make_hostile.py c9_deep_list has 1,000,000): each container grows
// as a vector does; before, every list reserved the big arrays' floor of 4096 items (64 KiB), 6.4
// GB of address space here (4 GB resident and 8 s on the hostile file, 85 MB and 0.13 s after).
TEST(PickleBudget, DeeplyNestedListsReserveNoBigArrayEach) {
  MEMF_SKIP_WITHOUT_ADDRESS_LIMITS();
  namespace fs = std::filesystem;
  fs::path path =
      fs::temp_directory_path() / ("memf_deep_" + std::to_string(::getpid()) + ".pickle");
  {
    const size_t depth = 100000;
    std::string bytes = "\x80\x04";
    bytes += std::string(depth, ']') + std::string(depth - 1, 'a') + ".";
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  EXPECT_EXIT(std::_Exit(failsUnderAddressLimit(path.string(), uint64_t{256} << 20,
                                                "is a list, expected a dict")),
              ::testing::ExitedWithCode(0), "");
  fs::remove(path);
}

TEST(PickleBudget, HtmlPagePaddedWithZerosReservesNothingFromTheFileSize) {
  MEMF_SKIP_WITHOUT_ADDRESS_LIMITS();
  // A memory_viz page whose base64 string ends early, in a 2 GiB (sparse) file: the decoder
  // reserved 3/4 of the file size before decoding.
  namespace fs = std::filesystem;
  fs::path path =
      fs::temp_directory_path() / ("memf_padded_" + std::to_string(::getpid()) + ".html");
  {
    std::ofstream out(path, std::ios::binary);
    out << "<html><script>const snapshot = {\"base64\": \"gASV\"};</script></html>";
  }
  const uint64_t padded = uint64_t{2} << 30;
  fs::resize_file(path, padded);
  EXPECT_EXIT(
      std::_Exit(failsUnderAddressLimit(path.string(), padded + (uint64_t{768} << 20), "HTML")),
      ::testing::ExitedWithCode(0), "");
  fs::remove(path);
}

TEST(PickleBudget, MessagesSayWhatIsWrong) {
  {  // an unclosed MARK: was "STOP with 1 objects on the stack (expected 1)"
    P p;
    p.op('(').op(']');
    auto snap = readSnapshotPickle(p.stop());
    ASSERT_FALSE(snap.ok());
    EXPECT_NE(snap.error().message.find("STOP with 1 unclosed MARK"), std::string::npos)
        << snap.error().message;
  }
  {  // a 2^100 device: was "is a int, expected an int"
    P p;
    std::vector<uint8_t> big(13, 0);
    big[12] = 0x10;
    p.op(']').op('(').op('}').op('(').str("device").long1(big).str("address").int1(0);
    p.str("total_size").int1(0).str("blocks").op(']').op('u').op('e');
    auto snap = readSnapshotPickle(p.stop());
    ASSERT_FALSE(snap.ok());
    EXPECT_NE(
        snap.error().message.find("segments[0].device is an int out of the signed 64-bit range"),
        std::string::npos)
        << snap.error().message;
    EXPECT_EQ(snap.error().message.find("a int"), std::string::npos) << snap.error().message;
  }
  {  // a 2^100 size
    auto bytes = withTrace([](P& p) {
      std::vector<uint8_t> big(13, 0);
      big[12] = 0x10;
      p.op('}').op('(').str("action").str("alloc").str("size").long1(big).op('u');
    });
    auto snap = readSnapshotPickle(bytes);
    ASSERT_FALSE(snap.ok());
    EXPECT_NE(snap.error().message.find("`size` is an int out of the 64-bit range"),
              std::string::npos)
        << snap.error().message;
  }
}

TEST(PickleBudget, NegativeSizesAndAddressesAreRefusedNotWrapped) {
  for (const char* key : {"size", "addr"}) {
    SCOPED_TRACE(key);
    auto bytes = withTrace(
        [&](P& p) { p.op('}').op('(').str("action").str("alloc").str(key).int4(-100).op('u'); });
    auto snap = readSnapshotPickle(bytes);
    ASSERT_FALSE(snap.ok()) << "a negative " << key << " was read as " << snap->events[0].size;
    EXPECT_NE(snap.error().message.find(std::string("`") + key + "` is negative (-100)"),
              std::string::npos)
        << snap.error().message;
    EXPECT_GT(snap.error().offset, 0);
  }
  {  // a stream beyond the signed 64-bit range would wrap to a negative handle
    auto bytes = withTrace([&](P& p) {
      p.event([](P& e) { e.str("stream").long1({0, 0, 0, 0, 0, 0, 0, 0x80, 0}); });
    });
    auto snap = readSnapshotPickle(bytes);
    ASSERT_FALSE(snap.ok());
    EXPECT_NE(snap.error().message.find("`stream`"), std::string::npos) << snap.error().message;
  }
}

TEST(PickleBudget, OutOfRangeTimesAreCountedInAWarning) {
  auto bytes = withTrace([](P& p) {
    p.event([](P& e) { e.str("time_us").int4(-5); });
    p.event([](P& e) {
      e.str("time_us").long1({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0});
    });
    p.event([](P& e) { e.str("time_us").int4(7); });
  });
  auto snap = readSnapshotPickle(bytes);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  ASSERT_EQ(snap->events.size(), 3u);
  EXPECT_EQ(snap->events[0].time_us, -1);
  EXPECT_EQ(snap->events[1].time_us, -1);
  EXPECT_EQ(snap->events[2].time_us, 7);
  ASSERT_EQ(snap->load_warnings.size(), 1u);
  EXPECT_NE(snap->load_warnings[0].find("2 time_us value(s)"), std::string::npos)
      << snap->load_warnings[0];
}

TEST(JsonInput, DeepNestingIsRefusedWithoutBuildingADocument) {
  MEMF_SKIP_WITHOUT_ADDRESS_LIMITS();
  // 8 M nested arrays (16 MB): the JSON was parsed into a document first (about 40 bytes of
  // memory per input byte) and only then checked for depth.
  namespace fs = std::filesystem;
  fs::path path = fs::temp_directory_path() / ("memf_deep_" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream out(path, std::ios::binary);
    std::string open(size_t{8} << 20, '['), close(size_t{8} << 20, ']');
    out << open << close;
  }
  EXPECT_EXIT(std::_Exit(failsUnderAddressLimit(path.string(), uint64_t{16 + 256} << 20,
                                                "nested more than 256")),
              ::testing::ExitedWithCode(0), "");
  fs::remove(path);
}

TEST(JsonInput, KeysKeepTheirFileOrder) {
  std::string json = R"({"segments": [], "zeta": 1, "alpha": 2, "device_traces": []})";
  auto snap = readSnapshotJson({reinterpret_cast<const uint8_t*>(json.data()), json.size()});
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  ASSERT_EQ(snap->ignored_keys.size(), 2u);
  EXPECT_EQ(snap->ignored_keys[0], "zeta");
  EXPECT_EQ(snap->ignored_keys[1], "alpha");
}

// Non-regular inputs: sniffed, bounded, never a wait forever.
TEST(StreamInput, DevZeroIsRefusedAfterTheSniff) {
  if (!std::filesystem::exists("/dev/zero")) GTEST_SKIP();
  auto snap = loadSnapshotFile("/dev/zero");
  ASSERT_FALSE(snap.ok());
  EXPECT_NE(snap.error().message.find("not a snapshot"), std::string::npos) << snap.error().message;
  EXPECT_NE(snap.error().message.find("first byte 0x00"), std::string::npos)
      << snap.error().message;
}

TEST(StreamInput, DevUrandomIsRefused) {
  if (!std::filesystem::exists("/dev/urandom")) GTEST_SKIP();
  for (int i = 0; i < 20; ++i) {  // whatever the first bytes happen to be
    auto snap = loadSnapshotFile("/dev/urandom");
    ASSERT_FALSE(snap.ok());
    EXPECT_FALSE(snap.error().message.empty());
  }
}

TEST(StreamInput, FifoWithNoWriterIsAnErrorNotAWaitForever) {
  namespace fs = std::filesystem;
  fs::path path = fs::temp_directory_path() / ("memf_fifo_" + std::to_string(::getpid()));
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  LoadOptions opt;
  opt.stream_wait_ms = 50;
  auto snap = loadSnapshotFile(path.string(), opt);
  fs::remove(path);
  ASSERT_FALSE(snap.ok());
  EXPECT_NE(snap.error().message.find("nothing to read"), std::string::npos)
      << snap.error().message;
}

TEST(StreamInput, PickleFollowedByEndlessZerosStopsAtStop) {
  // `cat snap.pickle /dev/zero | memforensics analyze /dev/stdin`: before, the zeros were read
  // until memory ran out. The writer thread stops when the reader closes the pipe.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  auto bytes = withTrace([](P& p) { p.event(); });
  std::thread writer([&] {
    std::signal(SIGPIPE, SIG_IGN);
    if (::write(fds[1], bytes.data(), bytes.size()) < 0) return;
    std::vector<uint8_t> zeros(1 << 16, 0);
    for (int i = 0; i < (1 << 16); ++i) {  // at most 4 GiB, but the reader closes long before
      if (::write(fds[1], zeros.data(), zeros.size()) < 0) break;
    }
    ::close(fds[1]);
  });
  auto snap = loadSnapshotFile("/proc/self/fd/" + std::to_string(fds[0]));
  ::close(fds[0]);
  writer.join();
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  EXPECT_EQ(snap->events.size(), 1u);
}

}  // namespace
}  // namespace memforensics::format
