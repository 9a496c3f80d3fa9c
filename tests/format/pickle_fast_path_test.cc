// pickle_fast_path_test.cc: the trace-entry fast path of the pickle reader (pickle_entry.cc,
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
                            PickleReadStats* stats = nullptr, bool shaped = true) {
  PickleReadOptions o;
  o.fast_path = fast;
  o.shaped_path = shaped;
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
        x.stack != y.stack || !(a.notesOf(x) == b.notesOf(y)) || x.pool != y.pool ||
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

// The generic machine and the fast path, with and without its shaped path (section 2c), on
// `bytes`: the same error (message and offset), or equal Snapshots.
void expectSame(std::span<const uint8_t> bytes, const std::string& what,
                PickleReadStats* stats = nullptr) {
  auto slow = readWith(bytes, false);
  for (bool shaped : {true, false}) {
    const std::string how = what + (shaped ? " (shaped path)" : " (no shaped path)");
    auto fast = readWith(bytes, true, shaped ? stats : nullptr, shaped);
    ASSERT_EQ(fast.ok(), slow.ok())
        << how << ": " << (fast.ok() ? slow.error() : fast.error()).describe();
    if (!fast.ok()) {
      EXPECT_EQ(fast.error().message, slow.error().message) << how;
      EXPECT_EQ(fast.error().offset, slow.error().offset) << how;
      continue;
    }
    EXPECT_EQ(testing::snapshotDiff(*slow, *fast), "") << how;
    EXPECT_EQ(sameIds(*slow, *fast), "") << how;
    EXPECT_EQ(slow->traits.has_time_us, fast->traits.has_time_us) << how;
    EXPECT_EQ(slow->traits.has_compile_context, fast->traits.has_compile_context) << how;
    EXPECT_EQ(slow->traits.has_user_metadata, fast->traits.has_user_metadata) << how;
    EXPECT_EQ(slow->traits.has_annotate_action, fast->traits.has_annotate_action) << how;
  }
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
  // The real snapshots hold most entries; without ../shared only the sample and the scenarios.
  EXPECT_GT(fast_entries, testing::realSnapshotPaths().empty() ? 10000u : 100000u);
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

// The shaped path (pickle_entry.cc, section 2c) reads an entry whose keys are the previous
// entry's, fetched from the same memo slots. shapedTrace writes a trace whose first entry
// memoizes the keys {action, addr, size, stream, time_us, compile_context, frames} and whose
// entries 1..n fetch them; `entry(w, i, s)` writes entry i's body (s: the memo slots of the keys
// and values the first entry memoized) and `between(w, i)` anything before entry i, at the trace
// list's level.
enum ShapeKey { kAction, kAddr, kSize, kStream, kTime, kContext, kFrames, kShapeKeys };
// The memo slots of what the first entry memoized.
struct Slots {
  uint32_t key[kShapeKeys] = {};
  uint32_t alloc = 0, ctx = 0, list = 0, frame[2] = {};
};
using EntryFn = std::function<void(PickleWriter&, size_t, const Slots&)>;
std::vector<uint8_t> shapedTrace(size_t n, const EntryFn& entry,
                                 const std::function<void(PickleWriter&, size_t)>& between = {}) {
  static const char* const names[kShapeKeys] = {
      "action", "addr", "size", "stream", "time_us", "compile_context", "frames"};
  PickleWriter w(4);
  w.beginDict();
  w.str("segments");
  w.beginList();
  w.endList();
  w.str("device_traces");
  w.beginList();
  w.beginList();
  Slots s;
  w.beginDict(true);
  for (int k = 0; k < kShapeKeys; ++k) {
    s.key[k] = w.memoCount();
    w.str(names[k]);
    w.memoize();
    if (k == kAction) {
      s.alloc = w.memoCount();
      w.str("alloc");
      w.memoize();
    } else if (k == kContext) {
      s.ctx = w.memoCount();
      w.str("ctx");
      w.memoize();
    } else if (k == kFrames) {
      s.list = w.memoCount();
      w.beginList(true);
      for (int f = 0; f < 2; ++f) {
        s.frame[f] = w.memoCount();
        w.beginDict(true);
        w.str("filename");
        w.str("x.py");
        w.str("line");
        w.integer(f);
        w.str("name");
        w.str("fn");
        w.endDict();
      }
      w.endList();
    } else {
      w.integer(100 + k);
    }
  }
  w.endDict();
  for (size_t i = 1; i <= n; ++i) {
    if (between) between(w, i);
    w.beginDict(true);
    entry(w, i, s);
    w.endDict();
  }
  w.endList();
  w.endList();
  w.endDict();
  return w.finish();
}

// PyTorch's entry: every key fetched in the first entry's order, the action and context fetched
// from the memo, ints, and a frames list of memo fetches of the two frame dicts.
void pyTorchEntry(PickleWriter& w, size_t i, const Slots& s) {
  w.get(s.key[kAction]);
  w.get(s.alloc);
  w.get(s.key[kAddr]);
  w.uinteger(0x7f0000000000ULL + 512 * i);
  w.get(s.key[kSize]);
  w.integer(512);
  w.get(s.key[kStream]);
  w.integer(static_cast<int64_t>(i));
  w.get(s.key[kTime]);
  w.uinteger(1763324227581137ULL + i);
  w.get(s.key[kContext]);
  w.get(s.ctx);
  w.get(s.key[kFrames]);
  w.beginList(true);
  w.get(s.frame[0]);
  w.get(s.frame[i % 2]);
  w.endList();
}

TEST(PickleFastPath, EntriesWithThePreviousKeysTakeTheShapedPath) {
  auto bytes = shapedTrace(6, pyTorchEntry);
  PickleReadStats st;
  expectSame(bytes, "pytorch entries", &st);
  auto snap = readWith(bytes, true);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  ASSERT_EQ(snap->events.size(), 7u);
  EXPECT_EQ(st.fast_entries, 6u);
  EXPECT_EQ(st.fast_shaped, 5u);  // entry 1 records the shape, entries 2..6 take it
  EXPECT_EQ(snap->events[6].addr, 0x7f0000000000ULL + 512 * 6);
  EXPECT_EQ(snap->events[6].stream, 6);
  EXPECT_EQ(snap->events[6].time_us, static_cast<int64_t>(1763324227581137ULL + 6));
  EXPECT_EQ(snap->strings.get(snap->notesOf(snap->events[6]).compile_context), "ctx");
  EXPECT_EQ(snap->stacks.stack(snap->events[6].stack).size(), 2u);
}

// A key's memo slot rebound between two entries of the same bytes: entry 3 fetches another string
// from the slot that held "size". "user_metadata" (a field, but a non-string value, which makeEvent
// ignores): entry 3's size stays 0, and without the shaped path's check of each key's memo entry it
// would get 512; entry 3 records that shape, which entry 4 does not take (its user_metadata is an
// int, which the shaped path leaves to fastEntry). "size" again: the same StrId, the
// shape still holds. "requested" (a key makeEvent ignores): no shape is recorded for it.
TEST(PickleFastPath, ShapedPathChecksEachKeysMemoSlot) {
  struct Case {
    const char* key;
    uint64_t size;
    uint64_t shaped;
  };
  for (const Case& c :
       {Case{"user_metadata", 0, 1}, Case{"size", 512, 3}, Case{"requested", 0, 1}}) {
    auto bytes = shapedTrace(4, pyTorchEntry, [&](PickleWriter& w, size_t i) {
      if (i != 3) return;
      w.str(c.key);
      w.raw({'q', 4});  // BINPUT over the slot of "size" (shapedTrace: slot 4)
      w.raw({'0'});     // POP
    });
    PickleReadStats st;
    expectSame(bytes, c.key, &st);
    auto snap = readWith(bytes, true);
    ASSERT_TRUE(snap.ok()) << snap.error().describe();
    ASSERT_EQ(snap->events.size(), 5u);
    EXPECT_EQ(snap->events[3].size, c.size) << c.key;
    EXPECT_EQ(snap->events[4].size, c.size) << c.key;
    EXPECT_EQ(snap->traits.has_user_metadata, std::string(c.key) == "user_metadata") << c.key;
    EXPECT_EQ(st.fast_entries, 4u) << c.key;
    EXPECT_EQ(st.fast_shaped, c.shaped) << c.key;
  }
}

// Entries whose keys differ from the shape in order, number or identity, a duplicate key, and
// values the shaped path does not read (another type, out of range, a memo store after a value,
// a FRAME opcode, a shared or empty frames list, None) leave it for fastEntry or the generic
// machine: the same Snapshot or the same error as with the shaped path off.
TEST(PickleFastPath, ShapedPathFallsBackOnAnyOtherEntry) {
  struct Case {
    const char* name;
    EntryFn odd;  // entry 3's body
    bool loads;
  };
  const auto with = [](ShapeKey which, std::function<void(PickleWriter&, const Slots&)> value) {
    return [which, value](PickleWriter& w, size_t i, const Slots& s) {
      for (int k = 0; k < kShapeKeys; ++k) {
        w.get(s.key[k]);
        if (k == which) {
          value(w, s);
          continue;
        }
        switch (k) {
          case kAction:
            w.get(s.alloc);
            break;
          case kContext:
            w.get(s.ctx);
            break;
          case kFrames:
            w.beginList(true);
            w.get(s.frame[0]);
            w.get(s.frame[1]);
            w.endList();
            break;
          default:
            w.integer(static_cast<int64_t>(i * 10 + k));
        }
      }
    };
  };
  const std::vector<Case> cases = {
      {"keys in another order",
       [](PickleWriter& w, size_t i, const Slots& s) {
         w.get(s.key[kAction]);
         w.get(s.alloc);
         w.get(s.key[kSize]);
         w.integer(7);
         w.get(s.key[kAddr]);
         w.integer(static_cast<int64_t>(i));
       },
       true},
      {"one key fewer",
       [](PickleWriter& w, size_t, const Slots& s) {
         w.get(s.key[kAction]);
         w.get(s.alloc);
         w.get(s.key[kAddr]);
         w.integer(9);
       },
       true},
      {"one key more",
       [](PickleWriter& w, size_t i, const Slots& s) {
         pyTorchEntry(w, i, s);
         w.str("user_metadata");
         w.str("meta");
       },
       true},
      {"a duplicate key",
       [](PickleWriter& w, size_t i, const Slots& s) {
         pyTorchEntry(w, i, s);
         w.get(s.key[kSize]);
         w.integer(4096);
       },
       true},
      {"a negative size", with(kSize, [](PickleWriter& w, const Slots&) { w.integer(-5); }), false},
      {"a string addr", with(kAddr, [](PickleWriter& w, const Slots&) { w.str("0x10"); }), false},
      {"a negative time", with(kTime, [](PickleWriter& w, const Slots&) { w.integer(-3); }), true},
      {"a time past 2^63",
       with(kTime, [](PickleWriter& w, const Slots&) { w.uinteger(1ULL << 63); }), true},
      {"an addr past 2^63",
       with(kAddr, [](PickleWriter& w, const Slots&) { w.uinteger(0xffff000000000000ULL); }), true},
      {"a negative stream", with(kStream, [](PickleWriter& w, const Slots&) { w.integer(-2); }),
       true},
      {"a stream past 2^63",
       with(kStream, [](PickleWriter& w, const Slots&) { w.uinteger(1ULL << 63); }), false},
      {"a float size", with(kSize, [](PickleWriter& w, const Slots&) { w.floating(1.5); }), false},
      {"a memoized int",
       with(kSize,
            [](PickleWriter& w, const Slots&) {
              w.integer(64);
              w.memoize();
            }),
       true},
      {"a FRAME opcode before a value",
       with(kSize,
            [](PickleWriter& w, const Slots&) {
              w.raw({0x95, 3, 0, 0, 0, 0, 0, 0, 0});
              w.integer(64);
            }),
       true},
      {"an action that is an int",
       with(kAction, [](PickleWriter& w, const Slots&) { w.integer(1); }), false},
      {"a new action string", with(kAction, [](PickleWriter& w, const Slots&) { w.str("free"); }),
       true},
      {"None as the context", with(kContext, [](PickleWriter& w, const Slots&) { w.none(); }),
       true},
      {"an int as the context", with(kContext, [](PickleWriter& w, const Slots&) { w.integer(4); }),
       true},
      {"None as the frames", with(kFrames, [](PickleWriter& w, const Slots&) { w.none(); }), true},
      {"an empty frames list",
       with(kFrames,
            [](PickleWriter& w, const Slots&) {
              w.beginList(true);
              w.endList();
            }),
       true},
      {"a shared frames list",
       with(kFrames, [](PickleWriter& w, const Slots& s) { w.get(s.list); }), true},
      {"a frame dict as the frames",
       with(kFrames, [](PickleWriter& w, const Slots& s) { w.get(s.frame[0]); }), false},
      {"frames in two batches",
       with(kFrames,
            [](PickleWriter& w, const Slots& s) {
              w.beginList(true);
              w.get(s.frame[0]);
              w.endList();
              w.raw({'('});
              w.get(s.frame[1]);
              w.raw({'e'});
            }),
       true},
  };
  for (const auto& c : cases) {
    auto bytes = shapedTrace(5, [&](PickleWriter& w, size_t i, const Slots& s) {
      if (i == 3)
        c.odd(w, i, s);
      else
        pyTorchEntry(w, i, s);
    });
    PickleReadStats st;
    expectSame(bytes, c.name, &st);
    auto snap = readWith(bytes, true);
    EXPECT_EQ(snap.ok(), c.loads) << c.name << ": "
                                  << (snap.ok() ? "loaded" : snap.error().describe());
    if (!snap.ok()) continue;  // no stats from a failed load
    // Entries 2, 4 and 5 take the shape (5 after 4 recorded it again); entry 3 only where the
    // shaped path reads its odd value itself. Entry 3 with other keys records their shape, which
    // entry 4 misses: only entries 2 and 5. An addr past 2^63 fits its field as makeEvent reads it
    // (applyField, shared by both paths), so the shaped path takes it too.
    const bool shaped3 = c.name == std::string("a negative stream") ||
                         c.name == std::string("an addr past 2^63") ||
                         c.name == std::string("None as the context") ||
                         c.name == std::string("None as the frames") ||
                         c.name == std::string("a shared frames list");
    const bool new_shape = c.name == std::string("keys in another order") ||
                           c.name == std::string("one key fewer") ||
                           c.name == std::string("one key more");
    EXPECT_EQ(st.fast_shaped, shaped3 ? 4u : new_shape ? 2u : 3u) << c.name;
  }
}

// A large input has its pages mapped by a thread ahead of the parse (InputPrefetcher): the same
// snapshot as the bytes without the padding, and never more than the prefetcher's window
// (8 MiB) plus one chunk past where the parse reported being (here: 200,000 entries, about 8 MB,
// then 40 MB of zeros after STOP, which the parse never reaches).
TEST(PickleFastPath, InputPrefetchStaysWithinItsWindowAndChangesNothing) {
  auto bytes = shapedTrace(200000, pyTorchEntry);
  const size_t pickle_bytes = bytes.size();
  auto plain = readWith(bytes, true);
  ASSERT_TRUE(plain.ok()) << plain.error().describe();
  bytes.resize(pickle_bytes + (size_t{40} << 20), 0);
  for (bool fast : {true, false}) {
    PickleReadStats st;
    auto padded = readWith(bytes, fast, &st);
    ASSERT_TRUE(padded.ok()) << padded.error().describe();
    EXPECT_EQ(sameIds(*plain, *padded), "");
    EXPECT_EQ(padded->events.size(), plain->events.size());
    EXPECT_LE(st.input_prefetched_bytes, pickle_bytes + (size_t{8} << 20) + (size_t{1} << 20));
  }
}

// The generic containers' items come from the reader's arena (ItemArena): 40,000 segments of 3
// blocks (160,000 small dicts and lists, past the arena's first chunks and into the 8 MiB ones) and
// one segment of 150,000 blocks (a list appended to in batches of 1,000, whose vector grows in the
// arena and then outgrows it), in protocols 2 and 4: the snapshot the builder describes.
TEST(PickleFastPath, ManyGenericContainersReadFromTheArena) {
  for (int protocol : {2, 4}) {
    TSnapshot t;
    t.protocol = protocol;
    for (uint64_t i = 0; i < 40000; ++i) {
      t.segments.push_back({static_cast<int64_t>(i % 3),
                            0x100000000ULL + i * 0x10000,
                            0,
                            "small",
                            {{512, 500, "active_allocated", {{"x.py", i % 7, "f"}}},
                             {1024, 0, "inactive", {}},
                             {0x10000 - 1536, 0, "inactive", {}}}});
    }
    testing::TSegment big{0, 0x900000000000ULL, 0, "large", {}};
    for (uint64_t i = 0; i < 150000; ++i) big.blocks.push_back({512, 512, "active_allocated", {}});
    t.segments.push_back(big);
    t.traces.push_back({{"alloc", 0x100000000ULL, 512, 0, 5, {{"x.py", 3, "h"}}, true}});
    const auto bytes = buildPickle(t);
    for (bool fast : {true, false}) {
      auto s = readWith(bytes, fast);
      ASSERT_TRUE(s.ok()) << s.error().describe();
      EXPECT_EQ(testing::snapshotDiff(testing::buildSnapshot(t), *s), "")
          << "protocol " << protocol << (fast ? " fast" : " generic");
      EXPECT_EQ(s->blocks.size(), 40000u * 3 + 150000u);
    }
  }
}

// Frames runs found by their first 8 bytes (FramesGuess): runs that share those bytes but differ
// after them (one a prefix of another, or the same length with another last frame) must each get
// their own stack, with the guesses on and off: the same snapshot, with the same ids, as the
// generic machine.
TEST(PickleFastPath, FramesRunsSharingTheirFirstBytesGetTheirOwnStacks) {
  static const std::vector<std::vector<int>> kRuns = {
      {0, 1, 0, 1}, {0, 1, 0, 1, 0}, {0, 1, 0, 1, 1}, {0, 1, 0, 1, 0, 0}, {1, 1, 1, 1}};
  static const int kOrder[] = {0, 1, 0, 2, 1, 2, 0, 0, 3, 1, 3, 4, 0, 4, 2, 2};
  constexpr size_t kEntries = std::size(kOrder);
  auto bytes = shapedTrace(kEntries, [](PickleWriter& w, size_t i, const Slots& s) {
    w.get(s.key[kAction]);
    w.get(s.alloc);
    w.get(s.key[kAddr]);
    w.uinteger(0x7f0000000000ULL + 512 * i);
    w.get(s.key[kSize]);
    w.integer(512);
    w.get(s.key[kStream]);
    w.integer(0);
    w.get(s.key[kTime]);
    w.uinteger(1763324227581137ULL + i);
    w.get(s.key[kContext]);
    w.get(s.ctx);
    w.get(s.key[kFrames]);
    w.beginList(true);
    for (int f : kRuns[kOrder[i - 1]]) w.get(s.frame[f]);
    w.endList();
  });
  PickleReadStats st;
  expectSame(bytes, "runs sharing their first bytes", &st);
  EXPECT_GT(st.fast_frames_guessed, 0u);
  PickleReadOptions off;
  off.frames_guess = false;
  PickleReadStats st_off;
  off.stats = &st_off;
  auto unguessed = readSnapshotPickle(bytes, off);
  auto guessed = readWith(bytes, true);
  ASSERT_TRUE(guessed.ok()) << guessed.error().describe();
  ASSERT_TRUE(unguessed.ok()) << unguessed.error().describe();
  EXPECT_EQ(sameIds(*guessed, *unguessed), "");
  EXPECT_EQ(st_off.fast_frames_guessed, 0u);
  EXPECT_EQ(st_off.fast_frames_runs, st.fast_frames_runs);
  ASSERT_EQ(guessed->events.size(), kEntries + 1);
  for (size_t i = 1; i <= kEntries; ++i) {
    const auto& run = kRuns[kOrder[i - 1]];
    auto stack = guessed->stacks.stack(guessed->events[i].stack);
    ASSERT_EQ(stack.size(), run.size()) << "entry " << i;
    for (size_t k = 0; k < run.size(); ++k) {
      EXPECT_EQ(guessed->stacks.frame(stack[k]).line, static_cast<uint64_t>(run[k]))
          << "entry " << i << " frame " << k;
    }
  }
}

}  // namespace
}  // namespace memforensics::format
