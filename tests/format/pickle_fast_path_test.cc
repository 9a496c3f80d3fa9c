// pickle_fast_path_test.cc: the trace-entry fast path of the pickle reader (pickle_reader.cc,
// section 2b) gives the same Snapshot, id for id, and the same errors as the generic machine, on
// every real snapshot, the scenarios, the sample, the committed fuzz corpus, truncations and byte
// flips; and shapes it does not read fall back to the generic machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fixtures/real_snapshots.h"
#include "fixtures/snapshot_builder.h"
#include "fixtures/snapshot_compare.h"
#include "format/pickle/pickle_reader.h"
#include "format/pickle/pickle_writer.h"
#include "format/pickle/snapshot_pickle.h"

namespace memforensics::format {
namespace {

namespace fs = std::filesystem;
using memforensics::testing::buildPickle;
using memforensics::testing::TSnapshot;

std::vector<uint8_t> readFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Expected<Snapshot> readWith(std::span<const uint8_t> bytes, bool fast,
                            PickleReadStats* stats = nullptr) {
  PickleReadOptions o;
  o.fast_path = fast;
  o.stats = stats;
  return readSnapshotPickle(bytes, o);
}

// "" when a and b are the same model with the same ids: every table entry and every event field
// (snapshotDiff compares content, not ids; the fast path promises ids too).
std::string sameIds(const Snapshot& a, const Snapshot& b) {
  if (a.strings.size() != b.strings.size()) return "string table sizes differ";
  for (size_t i = 0; i < a.strings.size(); ++i) {
    if (a.strings.get(static_cast<StrId>(i)) != b.strings.get(static_cast<StrId>(i)))
      return "string " + std::to_string(i) + " differs";
  }
  if (a.stacks.frameCount() != b.stacks.frameCount()) return "frame counts differ";
  for (size_t i = 0; i < a.stacks.frameCount(); ++i) {
    if (!(a.stacks.frame(static_cast<FrameId>(i)) == b.stacks.frame(static_cast<FrameId>(i))))
      return "frame " + std::to_string(i) + " differs";
  }
  if (a.stacks.stackCount() != b.stacks.stackCount()) return "stack counts differ";
  for (size_t i = 0; i < a.stacks.stackCount(); ++i) {
    auto x = a.stacks.stack(static_cast<StackId>(i));
    auto y = b.stacks.stack(static_cast<StackId>(i));
    if (!std::equal(x.begin(), x.end(), y.begin(), y.end()))
      return "stack " + std::to_string(i) + " differs";
  }
  if (a.events.size() != b.events.size()) return "event counts differ";
  if (a.trace_begin != b.trace_begin) return "trace_begin differs";
  for (size_t i = 0; i < a.events.size(); ++i) {
    const Event& x = a.events[i];
    const Event& y = b.events[i];
    if (x.addr != y.addr || x.size != y.size || x.stream != y.stream || x.time_us != y.time_us ||
        x.stack != y.stack || x.compile_context != y.compile_context ||
        x.user_metadata != y.user_metadata || x.action_name != y.action_name || x.pool != y.pool ||
        x.action != y.action || x.category != y.category) {
      return "event " + std::to_string(i) + " differs";
    }
  }
  if (a.pools != b.pools) return "pools differ";
  if (a.load_warnings != b.load_warnings) return "load warnings differ";
  if (a.ignored_keys != b.ignored_keys) return "ignored keys differ";
  if (a.pickle_protocol != b.pickle_protocol) return "protocol differs";
  return "";
}

// Both paths on `bytes`: the same error (message and offset), or equal Snapshots.
void expectSame(std::span<const uint8_t> bytes, const std::string& what,
                PickleReadStats* stats = nullptr) {
  auto fast = readWith(bytes, true, stats);
  auto slow = readWith(bytes, false);
  ASSERT_EQ(fast.ok(), slow.ok()) << what << ": "
                                  << (fast.ok() ? slow.error() : fast.error()).describe();
  if (!fast.ok()) {
    EXPECT_EQ(fast.error().message, slow.error().message) << what;
    EXPECT_EQ(fast.error().offset, slow.error().offset) << what;
    return;
  }
  EXPECT_EQ(testing::snapshotDiff(*slow, *fast), "") << what;
  EXPECT_EQ(sameIds(*slow, *fast), "") << what;
}

std::vector<fs::path> pickleInputs() {
  auto files = testing::realSnapshotPathsAndSample();
  fs::path scen = fs::path(MEMF_SOURCE_DIR) / "snapshots" / "scenarios";
  if (fs::is_directory(scen)) {
    for (const auto& e : fs::directory_iterator(scen)) {
      if (e.path().extension() == ".pickle") files.push_back(e.path());
    }
  }
  return files;
}

TEST(PickleFastPath, SameSnapshotOnEveryRealScenarioAndSampleFile) {
  size_t files = 0;
  uint64_t fast_entries = 0;
  for (const auto& path : pickleInputs()) {
    auto bytes = readFile(path);
    PickleReadStats st;
    expectSame(bytes, path.filename().string(), &st);
    auto snap = readWith(bytes, false);
    ASSERT_TRUE(snap.ok()) << path << ": " << snap.error().describe();
    // PyTorch's entries (and the scenario tools', written the same way) all take the fast path
    // except those whose frames list holds a frame dict seen for the first time.
    EXPECT_EQ(st.fast_entries + st.fast_fallbacks, snap->events.size()) << path;
    if (snap->events.size() > 1000) {
      EXPECT_GT(st.fast_entries, snap->events.size() / 2) << path;
    }
    fast_entries += st.fast_entries;
    ++files;
  }
  EXPECT_GT(files, 10u);
  EXPECT_GT(fast_entries, 100000u);
}

TEST(PickleFastPath, SameResultOnTheCommittedFuzzCorpus) {
  fs::path root = fs::path(MEMF_SOURCE_DIR) / "fuzz" / "corpus" / "fuzz_pickle";
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(root)) {
    auto bytes = readFile(e.path());
    if (bytes.empty() || bytes[0] != 0x80) continue;  // JSON / HTML seeds go through the loader
    expectSame(bytes, e.path().filename().string());
    ++n;
  }
  EXPECT_GT(n, 10u);
}

// The hostile corpus of tools/make_hostile.py, when MEMF_HOSTILE_DIR names a folder it wrote.
TEST(PickleFastPath, SameResultOnTheHostileCorpusWhenGiven) {
  const char* dir = std::getenv("MEMF_HOSTILE_DIR");
  if (dir == nullptr || !fs::is_directory(dir)) GTEST_SKIP() << "MEMF_HOSTILE_DIR not set";
  size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.file_size() > (size_t{64} << 20)) continue;
    auto bytes = readFile(e.path());
    if (bytes.empty() || bytes[0] != 0x80) continue;
    expectSame(bytes, e.path().filename().string());
    ++n;
  }
  EXPECT_GT(n, 0u);
}

// Every truncation and a few thousand byte flips of a real-shaped file: a cut or a flipped byte
// inside a trace entry is where the fast path must give up and leave the error to the generic
// machine.
TEST(PickleFastPath, SameResultOnTruncationsAndByteFlips) {
  fs::path sample = fs::path(MEMF_SOURCE_DIR) / "snapshots" / "sample_training.pickle";
  auto full = readFile(sample);
  ASSERT_GT(full.size(), 10000u);
  // A window around the start of the traces holds entries with new and memoized frames.
  std::vector<uint8_t> bytes = full;
  std::mt19937 rng(16);
  for (int k = 0; k < 3000; ++k) {
    size_t at = rng() % full.size();
    bytes = full;
    bytes[at] = static_cast<uint8_t>(rng());
    expectSame(bytes, "flip at " + std::to_string(at));
    if (HasFatalFailure()) return;
  }
  for (size_t cut = 0; cut < full.size(); cut += 1 + cut / 64) {
    expectSame(std::span<const uint8_t>(full.data(), cut), "cut at " + std::to_string(cut));
    if (HasFatalFailure()) return;
  }
}

TSnapshot twoEntries() {
  TSnapshot t;
  t.traces.push_back({{"alloc", 0x1000, 512, 0, 7, {{"a.py", 1, "f"}, {"b.py", 2, "g"}}, true},
                      {"alloc", 0x2000, 512, 0, 8, {{"a.py", 1, "f"}, {"b.py", 2, "g"}}, true},
                      {"free_requested", 0x1000, 512, 0, 9, {{"a.py", 1, "f"}}, true}});
  return t;
}

TEST(PickleFastPath, PyTorchShapedEntriesTakeTheFastPath) {
  // The model written back as PyTorch writes it (snapshot_pickle.h): frame dicts memoized and
  // fetched by later entries.
  auto bytes = snapshotToPickle(testing::buildSnapshot(twoEntries()));
  PickleReadStats st;
  expectSame(bytes, "three entries", &st);
  // The first entry's frames list holds new frame dicts: generic. The others fetch them.
  EXPECT_EQ(st.fast_entries, 2u);
  EXPECT_EQ(st.fast_fallbacks, 1u);
  // The fixture's own writer makes a new frame dict per use: every entry is generic.
  PickleReadStats fixture;
  expectSame(buildPickle(twoEntries()), "fixture", &fixture);
  EXPECT_EQ(fixture.fast_entries, 0u);
  EXPECT_EQ(fixture.fast_fallbacks, 3u);
}

// An entry with a pool_id tuple (a shape the fast path does not read) and one whose frames list
// has two APPENDS batches: both fall back, and read the same as with the fast path off.
TEST(PickleFastPath, UnreadShapesFallBackToTheGenericMachine) {
  PickleWriter w(4);
  w.beginDict();
  w.str("segments");
  w.beginList();
  w.endList();
  w.str("device_traces");
  w.beginList();
  w.beginList();
  // 0: defines the frame dicts (generic: they are new)
  w.beginDict();
  w.str("action");
  w.str("alloc");
  w.str("frames");
  w.beginList(/*memoize=*/true);
  for (int f = 0; f < 3; ++f) {
    w.beginDict(/*memoize=*/true);
    w.str("filename");
    w.str("x.py");
    w.str("line");
    w.integer(f);
    w.str("name");
    w.str("fn");
    w.endDict();
  }
  w.endList();
  w.endDict();
  // 1: pool_id is a tuple
  w.beginDict();
  w.str("action");
  w.str("alloc");
  w.str("addr");
  w.integer(4096);
  w.str("pool_id");
  w.integer(1);
  w.integer(2);
  w.tuple2();
  w.endDict();
  w.endList();
  w.endList();
  w.endDict();
  auto bytes = w.finish();
  PickleReadStats st;
  expectSame(bytes, "pool_id", &st);
  EXPECT_EQ(st.fast_entries, 0u);
  EXPECT_EQ(st.fast_fallbacks, 2u);
  auto snap = readWith(bytes, true);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  ASSERT_EQ(snap->events.size(), 2u);
  EXPECT_EQ(snap->events[1].pool, 1u);
  EXPECT_EQ(snap->pools[1], (std::pair<uint64_t, uint64_t>{1, 2}));
}

// Writes a snapshot whose entry 0 defines three memoized frame dicts (memo indices in `frame`)
// and whose entry 1 is written by `second`.
template <typename F>
std::vector<uint8_t> definedFramesThen(F second) {
  PickleWriter w(4);
  w.beginDict();
  w.str("segments");
  w.beginList();
  w.endList();
  w.str("device_traces");
  w.beginList();
  w.beginList();
  w.beginDict();
  w.str("action");
  w.str("alloc");
  w.str("frames");
  w.beginList(/*memoize=*/true);
  uint32_t frame[3];
  for (int f = 0; f < 3; ++f) {
    frame[f] = w.memoCount();
    w.beginDict(/*memoize=*/true);
    w.str("filename");
    w.str("x.py");
    w.str("line");
    w.integer(f);
    w.str("name");
    w.str("fn");
    w.endDict();
  }
  w.endList();
  w.endDict();
  w.beginDict();
  w.str("action");
  w.str("alloc");
  second(w, frame);
  w.endDict();
  w.endList();
  w.endList();
  w.endDict();
  return w.finish();
}

// Hostile shapes inside an entry that starts like PyTorch's: a frames list in two APPENDS batches
// (an OpenStack for the generic machine), a memo overwrite, an int followed by a memo store, a
// nested dict. Each falls back and reads (or fails) exactly as with the fast path off.
TEST(PickleFastPath, HostileShapesInsideAnEntryFallBack) {
  struct Case {
    const char* name;
    std::function<void(PickleWriter&, const uint32_t*)> body;
  };
  std::vector<Case> cases = {
      {"two batches",
       [](PickleWriter& w, const uint32_t* f) {
         w.str("frames");
         w.beginList(true);
         w.get(f[0]);
         w.listBatch();
         w.get(f[1]);
         w.endList();
       }},
      {"memo overwrite",
       [](PickleWriter& w, const uint32_t* f) {
         w.str("size");
         w.str("big");
         w.raw({'q', 0});  // BINPUT 0: overwrites the first memo entry
         w.str("frames");
         w.beginList(true);
         w.get(f[2]);
         w.endList();
       }},
      {"memoized int",
       [](PickleWriter& w, const uint32_t*) {
         w.str("size");
         w.integer(77);
         w.memoize();
       }},
      {"nested dict",
       [](PickleWriter& w, const uint32_t*) {
         w.str("extra");
         w.beginDict();
         w.str("k");
         w.integer(1);
         w.endDict();
       }},
      {"frames list holding a string",
       [](PickleWriter& w, const uint32_t* f) {
         w.str("frames");
         w.beginList(true);
         w.get(f[0]);
         w.str("not a frame");
         w.endList();
       }},
      {"negative size",
       [](PickleWriter& w, const uint32_t*) {
         w.str("size");
         w.integer(-5);
       }},
  };
  for (const auto& c : cases) {
    auto bytes = definedFramesThen(c.body);
    PickleReadStats st;
    expectSame(bytes, c.name, &st);
    auto slow = readWith(bytes, false);
    // Entry 0 holds new frame dicts, entry 1 the hostile shape: both generic, except where the
    // shape is one the fast path reads and makeEvent refuses (then the generic machine refuses it
    // too, and the error is the same).
    EXPECT_EQ(st.fast_entries, 0u) << c.name;
    EXPECT_EQ(st.fast_fallbacks, slow.ok() ? 2u : st.fast_fallbacks) << c.name;
  }
}

// The control: entry 1 fetching the defined frames in one batch takes the fast path, with the
// same stack as the generic machine's.
TEST(PickleFastPath, MemoizedFramesTakeTheFastPath) {
  auto bytes = definedFramesThen([](PickleWriter& w, const uint32_t* f) {
    w.str("addr");
    w.uinteger(0x7f0000000000ULL);
    w.str("size");
    w.integer(512);
    w.str("frames");
    w.beginList(true);
    w.get(f[2]);
    w.get(f[0]);
    w.endList();
  });
  PickleReadStats st;
  expectSame(bytes, "memoized frames", &st);
  EXPECT_EQ(st.fast_entries, 1u);
  EXPECT_EQ(st.fast_fallbacks, 1u);
  auto snap = readWith(bytes, true);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  auto stack = snap->stacks.stack(snap->events[1].stack);
  ASSERT_EQ(stack.size(), 2u);
  EXPECT_EQ(snap->stacks.frame(stack[0]).line, 2u);
  EXPECT_EQ(snap->stacks.frame(stack[1]).line, 0u);
  EXPECT_EQ(snap->events[1].addr, 0x7f0000000000ULL);
}

// The fast path caches a frames list's bytes (a run of memo fetches) with the stack they made; a
// memo slot rebound between two identical runs must not give the old stack (BINPUT over a frame's
// slot), and identical runs with the memo untouched give the cached one.
TEST(PickleFastPath, CachedFramesRunsAreDroppedWhenAMemoSlotIsRebound) {
  for (bool rebind : {false, true}) {
    auto bytes = definedFramesThen([&](PickleWriter& w, const uint32_t* f) {
      w.str("frames");
      w.beginList(true);
      w.get(f[0]);
      w.get(f[2]);
      w.endList();
      w.endDict();  // entry 1 ends; entry 2 fetches the same slots
      if (rebind) {
        w.get(f[1]);
        w.raw({'r', static_cast<uint8_t>(f[0]), static_cast<uint8_t>(f[0] >> 8),
               static_cast<uint8_t>(f[0] >> 16), static_cast<uint8_t>(f[0] >> 24)});
        w.raw({'0'});  // POP
      }
      w.beginDict();
      w.str("action");
      w.str("alloc");
      w.str("frames");
      w.beginList(true);
      w.get(f[0]);
      w.get(f[2]);
      w.endList();
    });
    PickleReadStats st;
    expectSame(bytes, rebind ? "rebound" : "same", &st);
    auto snap = readWith(bytes, true);
    ASSERT_TRUE(snap.ok()) << snap.error().describe();
    ASSERT_EQ(snap->events.size(), 3u);
    auto stack = snap->stacks.stack(snap->events[2].stack);
    ASSERT_EQ(stack.size(), 2u);
    EXPECT_EQ(snap->stacks.frame(stack[0]).line, rebind ? 1u : 0u);
    EXPECT_EQ(snap->stacks.frame(stack[1]).line, 2u);
    EXPECT_EQ(st.fast_entries, 2u);
    EXPECT_EQ(st.fast_frames_runs, rebind ? 0u : 1u);
  }
}

// Keys are read directly when they are memo fetches (BINGET, LONG_BINGET) of strings, as PyTorch
// writes them; a key fetched from the memo that is not a string (a frame dict) falls back to the
// generic machine, which reads or refuses it exactly as with the fast path off.
TEST(PickleFastPath, MemoFetchedKeysAreReadDirectlyAndOtherKeysFallBack) {
  for (bool frame_key : {false, true}) {
    auto bytes = definedFramesThen([&](PickleWriter& w, const uint32_t* f) {
      const uint32_t size_key = w.memoCount();
      w.str("size");
      w.memoize();
      w.integer(512);
      const uint32_t stream_key = w.memoCount();
      w.str("stream");
      w.memoize();
      w.integer(3);
      w.endDict();
      w.beginDict();  // entry 2: both keys fetched, one by BINGET, one by LONG_BINGET
      w.str("action");
      w.str("alloc");
      w.get(size_key);
      w.integer(64);
      w.raw({'j', static_cast<uint8_t>(stream_key), static_cast<uint8_t>(stream_key >> 8),
             static_cast<uint8_t>(stream_key >> 16), static_cast<uint8_t>(stream_key >> 24)});
      w.integer(5);
      if (frame_key) {
        w.get(f[0]);  // a frame dict as a key
        w.integer(1);
      }
    });
    PickleReadStats st;
    expectSame(bytes, frame_key ? "frame key" : "string keys", &st);
    EXPECT_EQ(st.fast_entries, frame_key ? 1u : 2u);
    if (frame_key) continue;
    auto snap = readWith(bytes, true);
    ASSERT_TRUE(snap.ok()) << snap.error().describe();
    ASSERT_EQ(snap->events.size(), 3u);
    EXPECT_EQ(snap->events[1].size, 512u);
    EXPECT_EQ(snap->events[2].size, 64u);
    EXPECT_EQ(snap->events[2].stream, 5u);
  }
}

// Device trace lists are kept as runs of events (NK::EventList) until something else is appended
// or they are read as a generic list: the results and errors are those of a list of items.
std::vector<uint8_t> tracesWith(const std::function<void(PickleWriter&)>& body) {
  PickleWriter w(4);
  w.beginDict();
  w.str("segments");
  w.beginList();
  w.endList();
  w.str("device_traces");
  body(w);
  w.endDict();
  return w.finish();
}
void entry(PickleWriter& w, uint64_t addr) {
  w.beginDict();
  w.str("action");
  w.str("alloc");
  w.str("addr");
  w.uinteger(addr);
  w.str("size");
  w.integer(512);
  w.endDict();
}

TEST(PickleEventLists, ANonEntryAfterEntriesIsNamedByItsIndex) {
  auto bytes = tracesWith([](PickleWriter& w) {
    w.beginList();
    w.beginList();
    entry(w, 4096);
    entry(w, 8192);
    w.listBatch();
    w.integer(5);
    w.endList();
    w.endList();
  });
  auto s = readWith(bytes, true);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message,
            "device_traces[0][2] is an int, expected a trace entry dict with an 'action'");
  expectSame(bytes, "non-entry");
}

TEST(PickleEventLists, ATraceListSharedByTwoDevicesIsCopied) {
  auto bytes = tracesWith([](PickleWriter& w) {
    w.beginList();
    uint32_t shared = w.memoCount();
    w.beginList(/*memoize=*/true);
    entry(w, 4096);
    entry(w, 8192);
    w.endList();
    w.get(shared);
    w.endList();
  });
  auto s = readWith(bytes, true);
  ASSERT_TRUE(s.ok()) << s.error().describe();
  ASSERT_EQ(s->traceCount(), 2u);
  ASSERT_EQ(s->trace(1).size(), 2u);
  EXPECT_EQ(s->trace(1)[1].addr, 8192u);
  EXPECT_EQ(s->trace(0)[0].addr, 4096u);
  expectSame(bytes, "shared");
}

TEST(PickleEventLists, BatchesThatFollowOnStayOneRunAndOthersDoNot) {
  // Two lists filled alternately by batches: neither is a run of its own events in file order
  // once the second starts, so both read as generic lists, in their own order.
  auto bytes = tracesWith([](PickleWriter& w) {
    w.beginList();
    for (int d = 0; d < 2; ++d) {
      w.beginList();
      for (int k = 0; k < 3; ++k) {
        entry(w, 4096 * (10 * d + k + 1));
        if (k == 0) w.listBatch();
      }
      w.endList();
    }
    w.endList();
  });
  auto s = readWith(bytes, true);
  ASSERT_TRUE(s.ok()) << s.error().describe();
  ASSERT_EQ(s->traceCount(), 2u);
  ASSERT_EQ(s->trace(0).size(), 3u);
  EXPECT_EQ(s->trace(1)[2].addr, 4096u * 13);
  expectSame(bytes, "batches");
}

TEST(PickleEventLists, AnEntryListReadAsSegmentsIsRefusedAsAList) {
  PickleWriter w(4);
  w.beginDict();
  w.str("segments");
  w.beginList();
  entry(w, 4096);
  w.endList();
  w.endDict();
  auto s = readWith(w.finish(), true);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message, "segments[0] is a trace entry dict, expected a dict");
}

// An entry list met as another top-level key's value is materialized during the conversion, while
// the conversion holds the top-level dict's items (found by fuzz_pickle under ASan:
// fuzz/corpus/fuzz_pickle/crash-eventlist-materialized-in-conversion.pickle).
TEST(PickleEventLists, AnEntryListMaterializedDuringTheConversion) {
  PickleWriter w(4);
  w.beginDict();
  w.str("host_traces");
  w.beginList();
  entry(w, 4096);
  entry(w, 8192);
  w.endList();
  w.str("segments");
  w.beginList();
  w.endList();
  w.str("device_traces");
  w.beginList();
  w.beginList();
  entry(w, 12288);
  w.endList();
  w.endList();
  w.endDict();
  auto bytes = w.finish();
  auto s = readWith(bytes, true);
  ASSERT_TRUE(s.ok()) << s.error().describe();
  EXPECT_EQ(s->host_trace_events, 2u);
  ASSERT_EQ(s->traceCount(), 1u);
  ASSERT_EQ(s->trace(0).size(), 1u);
  EXPECT_EQ(s->trace(0)[0].addr, 12288u);
  expectSame(bytes, "host_traces");
}

}  // namespace
}  // namespace memforensics::format
