// profiler_reader_test.cc: torch.profiler traces and memory timelines (format/profiler), on the
// real files of ../shared/traces-real and on fabricated ones (plain, gzip, nested ops, several
// devices, frees without allocs, the 2021 format without addresses, hostile values).
#include "format/profiler/profiler_reader.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "format/load/load.h"
#include "format/load/snapshot_trace.h"
#include "format/trace/trace_writer.h"
#include "replay/replay.h"

namespace memforensics::format {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> bytesOf(const std::string& s) {
  return {s.begin(), s.end()};
}

std::vector<uint8_t> gzipOf(std::span<const uint8_t> in) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> out(deflateBound(&zs, in.size()) + 64);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// A Kineto trace: `events` are JSON objects, comma-joined into traceEvents.
std::string kineto(const std::vector<std::string>& events, const std::string& extra = "") {
  std::string s = "{\"schemaVersion\": 1, " + extra + "\"traceEvents\": [";
  for (size_t i = 0; i < events.size(); ++i) s += (i ? ",\n" : "\n") + events[i];
  return s + "]}";
}
std::string mem(int64_t ts, int64_t bytes, int64_t addr, int64_t dev = 0, int64_t total_alloc = -1,
                int64_t total_reserved = -1, int tid = 1, int dev_type = 1) {
  std::string a =
      "{\"ph\": \"i\", \"cat\": \"cpu_instant_event\", \"s\": \"t\", \"name\": "
      "\"[memory]\", \"pid\": 7, \"tid\": " +
      std::to_string(tid) + ", \"ts\": " + std::to_string(ts) +
      ", \"args\": {\"Device Type\": " + std::to_string(dev_type) +
      ", \"Device Id\": " + std::to_string(dev) + ", \"Bytes\": " + std::to_string(bytes);
  if (addr >= 0) a += ", \"Addr\": " + std::to_string(addr);
  if (total_alloc >= 0) a += ", \"Total Allocated\": " + std::to_string(total_alloc);
  if (total_reserved >= 0) a += ", \"Total Reserved\": " + std::to_string(total_reserved);
  return a + "}}";
}
std::string op(const std::string& cat, const std::string& name, int64_t ts, int64_t dur,
               int tid = 1) {
  return "{\"ph\": \"X\", \"cat\": \"" + cat + "\", \"name\": \"" + name +
         "\", \"pid\": 7, \"tid\": " + std::to_string(tid) + ", \"ts\": " + std::to_string(ts) +
         ", \"dur\": " + std::to_string(dur) + ", \"args\": {\"Input Dims\": [[1, 2], []]}}";
}

replay::DeviceSummary summary(const Snapshot& s, int64_t device) {
  replay::DeviceReplayer r(s, device);
  auto sum = replay::summarizeDevice(r);
  r.checkFinalState();
  return sum;
}
uint64_t anomalyCount(const replay::DeviceSummary& s) {
  uint64_t n = 0;
  for (const auto& a : s.anomalies) n += a.count;
  return n;
}
bool hasWarning(const Snapshot& s, const std::string& part) {
  return std::any_of(s.load_warnings.begin(), s.load_warnings.end(),
                     [&](const std::string& w) { return w.find(part) != std::string::npos; });
}
std::vector<std::string> frameNames(const Snapshot& s, StackId st) {
  std::vector<std::string> out;
  for (FrameId f : s.stacks.stack(st)) out.emplace_back(s.strings.get(s.stacks.frame(f).name));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Real traces.

std::string realTrace(const char* name) {
  return std::string(MEMF_REAL_TRACES) + "/" + name;
}

TEST(ProfilerReal, DfIndexResolverDevice1PeaksAreTheLargestTotals) {
  auto path = realTrace("hta__df_index_resolver.pt.trace.json.gz");
  if (!fs::exists(path)) GTEST_SKIP() << path << " not present";
  auto snap = loadSnapshotFile(path);
  ASSERT_TRUE(snap) << snap.error().describe();
  EXPECT_EQ(snap->source, SourceFormat::ProfilerTrace);
  EXPECT_FALSE(snap->has_segment_info);
  EXPECT_EQ(snap->rank, 1);
  ASSERT_GT(snap->device_total_memory.size(), 1u);
  EXPECT_EQ(snap->device_total_memory[1], 34089730048u);
  EXPECT_EQ(snap->devices(), std::vector<int64_t>{1});
  EXPECT_TRUE(hasWarning(*snap, "1240 [memory] events on the CPU"));
  auto s = summary(*snap, 1);
  EXPECT_EQ(s.peak_requested.bytes, 6629508096u);
  EXPECT_EQ(s.peak_allocated.bytes, 6629508096u);
  EXPECT_EQ(s.peak_reserved.bytes, 12782141440u);
  EXPECT_EQ(anomalyCount(s), 0u);
  // Five ProfilerStep iterations as START/END annotations.
  size_t steps = 0;
  for (const auto& a : snap->annotations)
    steps += snap->strings.get(a.name).rfind("ProfilerStep#", 0) == 0 &&
             snap->strings.get(a.stage) == "START";
  EXPECT_EQ(steps, 5u);

  // The op stacks at the peak are named: after the block allocated before the profile, the
  // largest group is aten::mm inside the compiled backward.
  auto res = analysis::analyzeSnapshot(*snap);
  ASSERT_EQ(res.devices.size(), 1u);
  const auto& top = res.devices[0].top_at_peak;
  ASSERT_GE(top.size(), 3u);
  EXPECT_EQ(top[0].frames.at(0).filename, "[before the profile]");
  EXPECT_EQ(top[0].requested_bytes, 4096614400u);
  EXPECT_EQ(top[1].frames.at(0).filename, "[cpu_op]");
  EXPECT_EQ(top[1].frames.at(0).name, "aten::mm");
  EXPECT_EQ(top[1].frames.at(1).name, "CompiledFunctionBackward");
}

TEST(ProfilerReal, OtherKinetoTracesGiveTheirTotals) {
  struct Case {
    const char* file;
    uint64_t allocated, reserved;
    const char* top_file;  // innermost frame file of the largest group at the peak (".py": any)
  } cases[] = {
      {"CodingPlatelets__SwitchTransformers__trace.json", 23111038976u, 23616028672u, ".py"},
      {"harryjmoss__particle_transformer__gpu_working_chrome_trace.json", 13155807744u,
       13356761088u, "[cpu_op]"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    auto path = realTrace(c.file);
    if (!fs::exists(path)) continue;
    auto snap = loadSnapshotFile(path);
    ASSERT_TRUE(snap) << snap.error().describe();
    auto s = summary(*snap, 0);
    EXPECT_EQ(s.peak_requested.bytes, c.allocated);
    EXPECT_EQ(s.peak_reserved.bytes, c.reserved);
    EXPECT_EQ(anomalyCount(s), 0u);
    auto res = analysis::analyzeSnapshot(*snap);
    ASSERT_FALSE(res.devices.at(0).top_at_peak.empty());
    // Named: by the user's Python frame when the trace has them (with_stack), else by the op.
    const std::string& file = res.devices[0].top_at_peak[0].frames.at(0).filename;
    if (std::string_view(c.top_file) == ".py")
      EXPECT_TRUE(file.size() > 3 && file.substr(file.size() - 3) == ".py") << file;
    else
      EXPECT_EQ(file, c.top_file);
  }
}

TEST(ProfilerReal, MemoryTimelineRawKeepsPyTorchCategories) {
  auto path = realTrace("hta__memory_timeline.raw.json.gz");
  if (!fs::exists(path)) GTEST_SKIP() << path << " not present";
  auto snap = loadSnapshotFile(path);
  ASSERT_TRUE(snap) << snap.error().describe();
  EXPECT_EQ(snap->source, SourceFormat::MemoryTimeline);
  uint64_t by_cat[kProfilerCategoryCount + 1] = {};
  size_t allocs = 0;
  for (const Event& e : snap->trace(0)) {
    if (e.action != Action::Alloc) continue;
    ++allocs;
    by_cat[e.category] += 1;
    ASSERT_GE(e.category, 1);
    // The stack names the category too.
    EXPECT_EQ(frameNames(*snap, e.stack).at(0), profilerCategoryName(e.category));
  }
  // 645 PREEXISTING + 3345 CREATE rows and one + row of each of the 9510 / 2 INCREMENT_VERSION
  // pairs.
  EXPECT_EQ(allocs, 645u + 3345u + 9510u / 2);
  EXPECT_GT(by_cat[1 + 4], 0u);  // ACTIVATION
  EXPECT_GT(by_cat[1 + 0], 0u);  // PARAMETER
  EXPECT_TRUE(hasWarning(*snap, "category: PyTorch profiler, at the peak"));
  auto s = summary(*snap, 0);
  EXPECT_EQ(anomalyCount(s), 0u);
  EXPECT_EQ(s.peak_requested.bytes, 3082832104u);
}

// ---------------------------------------------------------------------------------------------
// Fabricated traces.

TEST(ProfilerTrace, PlainAndGzipGiveTheSameModel) {
  std::string t = kineto({op("cpu_op", "aten::empty", 10, 5), mem(12, 1024, 4096, 0, 1024, 2048),
                          mem(20, -1024, 4096, 0, 0, 2048)});
  auto plain = loadSnapshotBytes(bytesOf(t));
  auto raw = bytesOf(t);
  auto gz = loadSnapshotBytes(gzipOf(raw));
  ASSERT_TRUE(plain) << plain.error().describe();
  ASSERT_TRUE(gz) << gz.error().describe();
  ASSERT_EQ(plain->events.size(), gz->events.size());
  for (size_t i = 0; i < plain->events.size(); ++i) {
    EXPECT_EQ(plain->events[i].addr, gz->events[i].addr);
    EXPECT_EQ(plain->events[i].size, gz->events[i].size);
    EXPECT_EQ(plain->events[i].action, gz->events[i].action);
  }
  auto s = summary(*gz, 0);
  EXPECT_EQ(s.peak_requested.bytes, 1024u);
  EXPECT_EQ(s.peak_reserved.bytes, 2048u);
  EXPECT_EQ(anomalyCount(s), 0u);
}

TEST(ProfilerTrace, ConcatenatedGzipMembersAreOneText) {
  // `gzip a; gzip b; cat a.gz b.gz`: one text split across two members; bytes after the last
  // member that are no gzip are ignored with a note.
  std::string t = kineto({mem(1, 512, 1, 0, 512), mem(2, 1024, 2, 0, 1536)});
  size_t half = t.size() / 2;
  auto a = bytesOf(t.substr(0, half)), b = bytesOf(t.substr(half));
  auto both = gzipOf(a);
  auto second = gzipOf(b);
  both.insert(both.end(), second.begin(), second.end());
  auto snap = loadSnapshotBytes(both);
  ASSERT_TRUE(snap) << snap.error().describe();
  EXPECT_EQ(summary(*snap, 0).peak_requested.bytes, 1536u);
  both.push_back('x');
  auto tail = loadSnapshotBytes(both);
  ASSERT_TRUE(tail) << tail.error().describe();
  EXPECT_TRUE(hasWarning(*tail, "1 bytes after the end of the gzip stream ignored"));
}

TEST(ProfilerTrace, NestedOpsOnTheSameThreadAreTheStackInnermostFirst) {
  std::string t = kineto({
      op("user_annotation", "ProfilerStep#3", 0, 100),
      op("python_function", "train.py(42): step", 1, 90), op("cpu_op", "aten::linear", 10, 30),
      op("cpu_op", "aten::addmm", 12, 10), op("cpu_op", "aten::other_thread", 0, 100, 2),
      mem(15, 512, 1000),    // inside addmm
      mem(35, 1024, 2000),   // in linear, after addmm
      mem(60, 2048, 3000),   // only in step and the annotation
      mem(200, 4096, 4000),  // outside everything
  });
  auto snap = loadSnapshotBytes(bytesOf(t));
  ASSERT_TRUE(snap) << snap.error().describe();
  std::vector<std::vector<std::string>> stacks;
  for (const Event& e : snap->trace(0)) {
    if (e.action == Action::Alloc) stacks.push_back(frameNames(*snap, e.stack));
  }
  ASSERT_EQ(stacks.size(), 4u);
  EXPECT_EQ(stacks[0],
            (std::vector<std::string>{"aten::addmm", "aten::linear", "step", "ProfilerStep#3"}));
  EXPECT_EQ(stacks[1], (std::vector<std::string>{"aten::linear", "step", "ProfilerStep#3"}));
  EXPECT_EQ(stacks[2], (std::vector<std::string>{"step", "ProfilerStep#3"}));
  EXPECT_TRUE(stacks[3].empty());
  // The Python frame is parsed into file and line.
  for (const Event& e : snap->trace(0)) {
    if (e.action != Action::Alloc) continue;
    const Frame& f = snap->stacks.frame(snap->stacks.stack(e.stack)[2]);
    EXPECT_EQ(snap->strings.get(f.filename), "train.py");
    EXPECT_EQ(f.line, 42u);
    break;
  }
  // The step is an annotation pair.
  ASSERT_EQ(snap->annotations.size(), 2u);
  EXPECT_EQ(snap->strings.get(snap->annotations[0].name), "ProfilerStep#3");
}

// 2021 Kineto traces write an op's thread id as a string and a memory event's as a number: the
// same thread, so the allocation still gets the op's stack (issue 28 item 10: every stack was
// lost).
TEST(ProfilerTrace, ThreadIdsAreComparedAsValuesWhateverTheirJsonType) {
  auto quoted = [](std::string e) {
    const std::string from = "\"tid\": 25738", to = "\"tid\": \"25738\"";
    e.replace(e.find(from), from.size(), to);
    return e;
  };
  std::string t = kineto({quoted(op("cpu_op", "aten::empty", 10, 30, 25738)),
                          mem(15, 512, 1000, 0, -1, -1, 25738),
                          quoted(op("cpu_op", "aten::named_thread", 100, 30, 25738)),
                          mem(110, 512, 2000, 0, -1, -1, 1)});
  auto snap = loadSnapshotBytes(bytesOf(t));
  ASSERT_TRUE(snap) << snap.error().describe();
  std::vector<std::vector<std::string>> stacks;
  for (const Event& e : snap->trace(0)) {
    if (e.action == Action::Alloc) stacks.push_back(frameNames(*snap, e.stack));
  }
  ASSERT_EQ(stacks.size(), 2u);
  EXPECT_EQ(stacks[0], (std::vector<std::string>{"aten::empty"}));
  EXPECT_TRUE(stacks[1].empty()) << "another thread's op is not this allocation's";
}

// A CPU-only profile says what it holds instead of asking about profile_memory.
TEST(ProfilerTrace, ACpuOnlyProfileSaysItsMemoryEventsAreOnTheCpu) {
  std::string t = kineto({mem(1, 64, 300, 0, -1, -1, 1, /*dev_type=*/0),
                          mem(2, -64, 300, 0, -1, -1, 1, /*dev_type=*/0)});
  auto snap = loadSnapshotBytes(bytesOf(t));
  ASSERT_TRUE(snap) << snap.error().describe();
  EXPECT_TRUE(hasWarning(*snap, "2 [memory] events, all on the CPU"));
  EXPECT_FALSE(hasWarning(*snap, "was the profile taken with profile_memory=True"));
  // No memory events at all: the question stays.
  auto none = loadSnapshotBytes(bytesOf(kineto({op("cpu_op", "aten::mm", 1, 2)})));
  ASSERT_TRUE(none) << none.error().describe();
  EXPECT_TRUE(hasWarning(*none, "was the profile taken with profile_memory=True"));
}

TEST(ProfilerTrace, SeveralDevicesAndCpuEvents) {
  std::string t = kineto({mem(1, 1024, 100, 0), mem(2, 4096, 100, 3), mem(3, 8192, 200, 3),
                          mem(4, 64, 300, -1, -1, -1, 1, /*dev_type=*/0), mem(5, -4096, 100, 3)});
  auto snap = loadSnapshotBytes(bytesOf(t));
  ASSERT_TRUE(snap) << snap.error().describe();
  EXPECT_EQ(snap->devices(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(summary(*snap, 0).peak_requested.bytes, 1024u);
  auto s3 = summary(*snap, 3);
  EXPECT_EQ(s3.peak_requested.bytes, 4096u + 8192u);
  EXPECT_EQ(anomalyCount(s3), 0u);
  EXPECT_TRUE(hasWarning(*snap, "1 [memory] events on the CPU"));
  // No Total Reserved: reserved is the allocated high-water mark, and said to be absent.
  EXPECT_EQ(s3.peak_reserved.bytes, 4096u + 8192u);
  EXPECT_TRUE(hasWarning(*snap, "reserved is absent"));
}

// A deviceProperties entry without a name is not given the previous entry's (issue 30).
TEST(ProfilerTrace, ADevicePropertyWithoutANameHasNone) {
  std::string t = kineto({mem(1, 1024, 100, 0), mem(2, 4096, 200, 1)},
                         "\"deviceProperties\": [{\"id\": 0, \"name\": \"NVIDIA H100\", "
                         "\"totalGlobalMem\": 1000}, {\"id\": 1, \"totalGlobalMem\": 2000}], ");
  auto snap = loadSnapshotBytes(bytesOf(t));
  ASSERT_TRUE(snap) << snap.error().describe();
  EXPECT_NE(snap->origin.find("device 0: NVIDIA H100, 1000 B"), std::string::npos) << snap->origin;
  EXPECT_EQ(snap->origin.find("device 1: NVIDIA H100"), std::string::npos) << snap->origin;
}

// Rules about the cache (cache bloat) read Snapshot::reserved_recorded: false when some device's
// reserved bytes were synthesized (no Total Reserved) or the file is a memory timeline, and it
// stays false in the native trace `convert` writes (the reader's note travels in its warnings).
TEST(ProfilerTrace, ReservedIsRecordedOnlyWithTotalReservedOnEveryDevice) {
  auto nativeOf = [](const Snapshot& s) {
    trace::VectorSink sink;
    Status st = writeSnapshotTrace(s, sink);
    EXPECT_TRUE(st.ok()) << st.error().message;
    auto back = readSnapshotTraceSerial(sink.data);
    EXPECT_TRUE(back.ok()) << back.error().describe();
    return back.ok() ? back->reserved_recorded : true;
  };
  auto with = loadSnapshotBytes(
      bytesOf(kineto({mem(1, 512, 10, 0, 512, 2097152), mem(2, 512, 20, 1, 512, 2097152)})));
  ASSERT_TRUE(with) << with.error().describe();
  EXPECT_TRUE(with->reserved_recorded);
  EXPECT_TRUE(nativeOf(*with));
  // Device 1 lacks Total Reserved: its reserved is the high-water mark, so none is trusted.
  auto partly = loadSnapshotBytes(
      bytesOf(kineto({mem(1, 512, 10, 0, 512, 2097152), mem(2, 512, 20, 1, 512)})));
  ASSERT_TRUE(partly) << partly.error().describe();
  EXPECT_FALSE(partly->reserved_recorded);
  EXPECT_TRUE(hasWarning(*partly, std::string(kReservedAbsentNote)));
  EXPECT_FALSE(nativeOf(*partly));
}

TEST(ProfilerTrace, FreesWithoutAllocsAreBlocksFromBeforeTheProfile) {
  // 3000 B were allocated before the profile: a 1024-byte block freed in it, and the rest.
  std::string t = kineto({mem(1, 512, 10, 0, 3512, 8192), mem(2, -1024, 99, 0, 2488, 8192),
                          mem(3, -512, 10, 0, 1976, 8192)});
  auto snap = loadSnapshotBytes(bytesOf(t));
  ASSERT_TRUE(snap) << snap.error().describe();
  EXPECT_TRUE(hasWarning(*snap, "1 frees of blocks allocated before the profile started"));
  EXPECT_TRUE(hasWarning(*snap, "1976 B allocated before the profile started"));
  auto s = summary(*snap, 0);
  EXPECT_EQ(s.peak_requested.bytes, 3512u);  // the largest Total Allocated
  EXPECT_EQ(s.final_replayed.requested, 1976u);
  EXPECT_EQ(s.anomalies[static_cast<size_t>(replay::AnomalyKind::FreesBeforeTraceStart)].count, 1u);
  EXPECT_EQ(s.anomalies[static_cast<size_t>(replay::AnomalyKind::FinalStateMismatch)].count, 0u);
}

TEST(ProfilerTrace, OldFormatWithoutAddressesGivesTheRunningSumPeak) {
  // The 2021 format: Bytes, Device Type, Device Id only. Running sum: 1000, 3000, 2000, 6000,
  // 4000, 0 -> peak 6000.
  std::string t = kineto({mem(1, 1000, -1), mem(2, 2000, -1), mem(3, -1000, -1), mem(4, 4000, -1),
                          mem(5, -2000, -1), mem(6, -4000, -1)});
  auto snap = loadSnapshotBytes(bytesOf(t));
  ASSERT_TRUE(snap) << snap.error().describe();
  EXPECT_TRUE(hasWarning(*snap, "no Addr"));
  EXPECT_TRUE(hasWarning(*snap, "running sum of Bytes"));
  auto s = summary(*snap, 0);
  EXPECT_EQ(s.peak_requested.bytes, 6000u);
  EXPECT_EQ(s.final_replayed.requested, 0u);
  EXPECT_EQ(anomalyCount(s), 0u);
  // A free of a size nothing live has: memory from before the profile, counted from the start
  // (the running sum alone would go below zero).
  auto more = loadSnapshotBytes(bytesOf(kineto({mem(1, 1000, -1), mem(2, -3000, -1)})));
  ASSERT_TRUE(more);
  auto m = summary(*more, 0);
  EXPECT_EQ(m.start.requested, 3000u);
  EXPECT_EQ(m.peak_requested.bytes, 4000u);
}

TEST(ProfilerTrace, TimesOrderEventsAndEvIdxBreaksTies) {
  // File order is not time order; equal ts are ordered by Ev Idx.
  std::string a = mem(5, -256, 1, 0);
  std::string b = mem(5, 256, 1, 0);
  b.insert(b.find("\"Bytes\""), "\"Ev Idx\": 1, ");
  a.insert(a.find("\"Bytes\""), "\"Ev Idx\": 2, ");
  auto snap = loadSnapshotBytes(bytesOf(kineto({a, b})));
  ASSERT_TRUE(snap) << snap.error().describe();
  auto s = summary(*snap, 0);
  EXPECT_EQ(s.peak_requested.bytes, 256u);
  EXPECT_EQ(anomalyCount(s), 0u);
}

TEST(ProfilerTrace, MemoryTimelineJsonFormFollowsTheCategoryLevels) {
  // [times, sizes]: sizes[k] holds category index k - 1 (0 PARAMETER ... 4 ACTIVATION, 7 unknown).
  std::string t =
      "[[10, 20, 30], [[0, 100, 0, 0, 0, 0, 0, 0, 0], [0, 100, 0, 0, 0, 900, 0, 0, 0], "
      "[0, 100, 0, 0, 0, 300, 0, 0, 0]]]";
  auto snap = loadSnapshotBytes(bytesOf(t));
  ASSERT_TRUE(snap) << snap.error().describe();
  EXPECT_EQ(snap->source, SourceFormat::MemoryTimeline);
  EXPECT_FALSE(snap->reserved_recorded);  // synthesized from the allocated high-water mark
  auto s = summary(*snap, 0);
  EXPECT_EQ(s.peak_requested.bytes, 1000u);
  EXPECT_EQ(s.final_replayed.requested, 400u);
  EXPECT_EQ(anomalyCount(s), 0u);
  bool activation = false;
  for (const Event& e : snap->trace(0))
    activation |= profilerCategoryName(e.category) == std::string_view("ACTIVATION");
  EXPECT_TRUE(activation);
}

// ---------------------------------------------------------------------------------------------
// Hostile inputs: a clear error or a counted drop, never a crash or an unbounded allocation.

TEST(ProfilerHostile, HugeAndNegativeValuesAreDroppedAndCounted) {
  std::string t = kineto({
      mem(1, 512, 1),
      "{\"ph\": \"i\", \"name\": \"[memory]\", \"ts\": 2, \"args\": {\"Device Type\": 1, "
      "\"Device Id\": 0, \"Bytes\": 18446744073709551615, \"Addr\": 5}}",
      "{\"ph\": \"i\", \"name\": \"[memory]\", \"ts\": 2, \"args\": {\"Device Type\": 1, "
      "\"Device Id\": 0, \"Bytes\": -9223372036854775808, \"Addr\": 5}}",
      "{\"ph\": \"i\", \"name\": \"[memory]\", \"ts\": -5, \"args\": {\"Device Type\": 1, "
      "\"Device Id\": 0, \"Bytes\": 512, \"Addr\": 6}}",
      "{\"ph\": \"i\", \"name\": \"[memory]\", \"ts\": 1e300, \"args\": {\"Device Type\": 1, "
      "\"Device Id\": 0, \"Bytes\": 512, \"Addr\": 6}}",
      "{\"ph\": \"i\", \"name\": \"[memory]\", \"ts\": 3, \"args\": {\"Device Type\": 1, "
      "\"Device Id\": 99999999999, \"Bytes\": 512, \"Addr\": 6}}",
      "{\"ph\": \"i\", \"name\": \"[memory]\", \"ts\": 3, \"args\": {\"Device Type\": 1, "
      "\"Device Id\": 0, \"Bytes\": 4611686018427387904, \"Addr\": 7, \"Total Allocated\": -3}}",
  });
  auto snap = loadSnapshotBytes(bytesOf(t));
  ASSERT_TRUE(snap) << snap.error().describe();
  EXPECT_TRUE(hasWarning(*snap, "2 [memory] events with a missing or non-integer Bytes"));
  EXPECT_TRUE(hasWarning(*snap, "2 [memory] events with a missing, negative or non-finite ts"));
  EXPECT_TRUE(hasWarning(*snap, "Device Id outside"));
  auto s = summary(*snap, 0);  // a 2^62-byte block: counters stay exact below 2^64
  EXPECT_EQ(s.peak_requested.bytes, 512u + (uint64_t{1} << 62));
}

TEST(ProfilerHostile, NanAndOutOfRangeNumbersAreClearErrors) {
  for (const char* ts : {"NaN", "1e400", "Infinity"}) {
    SCOPED_TRACE(ts);
    std::string t =
        "{\"traceEvents\": [{\"ph\": \"i\", \"name\": \"[memory]\", \"ts\": " + std::string(ts) +
        "}]}";
    auto snap = loadSnapshotBytes(bytesOf(t));
    ASSERT_FALSE(snap);
    EXPECT_NE(snap.error().message.find("torch.profiler trace"), std::string::npos)
        << snap.error().message;
  }
}

TEST(ProfilerHostile, DeepJsonIsRefusedAndDeepOpsAreCut) {
  std::string deep = "{\"traceEvents\": [" + std::string(1000, '[') + std::string(1000, ']') + "]}";
  auto a = loadSnapshotBytes(bytesOf(deep));
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().message.find("nested more than"), std::string::npos) << a.error().message;

  std::vector<std::string> ev;
  for (int i = 0; i < 2000; ++i) ev.push_back(op("cpu_op", "op" + std::to_string(i), i, 10000 - i));
  ev.push_back(mem(5000, 512, 1));
  auto b = loadSnapshotBytes(bytesOf(kineto(ev)));
  ASSERT_TRUE(b) << b.error().describe();
  EXPECT_TRUE(hasWarning(*b, "nested deeper than"));
  const Event* alloc = nullptr;
  for (const Event& e : b->trace(0))
    if (e.action == Action::Alloc) alloc = &e;
  ASSERT_NE(alloc, nullptr);
  auto names = frameNames(*b, alloc->stack);
  ASSERT_EQ(names.size(), kMaxProfilerStackFrames);
  EXPECT_EQ(names.front(), "op1999");  // the innermost kept
}

// The distinct op stacks of a trace hold at most max(4 M, text / 4) frames: past it a stack keeps
// its 8 innermost ops, counted (60,000 distinct 256-op stacks from 800 KB of gzip were 15 M frames
// and a 1.2 GB report).
TEST(ProfilerHostile, DistinctStacksPastTheFrameBudgetKeepTheirInnermostOps) {
  std::vector<std::string> ev;
  const int depth = 300, n = 20000;  // 20,000 x 256 frames = 5.1 M
  for (int k = 0; k < depth; ++k)
    ev.push_back(op("cpu_op", "outer" + std::to_string(k), k, 100 * n));
  for (int i = 0; i < n; ++i) {
    ev.push_back(op("cpu_op", "inner" + std::to_string(i), depth + 4 * i, 2));
    ev.push_back(mem(depth + 4 * i + 1, 512, 4096 * (i + 1)));
  }
  const std::string text = kineto(ev);
  ASSERT_LT(text.size() / kProfilerTextBytesPerStackFrame, kProfilerStackFramesFloor);
  auto snap = loadSnapshotBytes(bytesOf(text));
  ASSERT_TRUE(snap) << snap.error().describe();
  std::vector<size_t> depths;
  for (const Event& e : snap->trace(0))
    if (e.action == Action::Alloc) depths.push_back(snap->stacks.stack(e.stack).size());
  ASSERT_EQ(depths.size(), static_cast<size_t>(n));
  EXPECT_EQ(depths.front(), kMaxProfilerStackFrames);
  EXPECT_EQ(depths.back(), kProfilerStackFramesPastBudget);
  const size_t whole = kProfilerStackFramesFloor / kMaxProfilerStackFrames;  // 16,384 fit
  EXPECT_EQ(depths[whole - 1], kMaxProfilerStackFrames);
  EXPECT_EQ(depths[whole], kProfilerStackFramesPastBudget);
  EXPECT_TRUE(hasWarning(*snap, std::to_string(n - whole) + " op stacks cut to their 8 innermost"));
}

TEST(ProfilerHostile, TruncatedGzipIsAClearError) {
  std::string t = kineto({mem(1, 512, 1), mem(2, -512, 1)});
  auto gz = gzipOf(bytesOf(t));
  for (size_t cut : {gz.size() - 1, gz.size() / 2, size_t{12}}) {
    SCOPED_TRACE(cut);
    std::vector<uint8_t> part(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(cut));
    auto snap = loadSnapshotBytes(part);
    ASSERT_FALSE(snap);
    EXPECT_NE(snap.error().message.find("truncated"), std::string::npos) << snap.error().message;
  }
  auto bad = gz;
  bad[bad.size() / 2] ^= 0xff;
  bad[bad.size() / 2 + 1] ^= 0x5a;
  auto snap = loadSnapshotBytes(bad);
  EXPECT_FALSE(snap);
}

TEST(ProfilerHostile, GzipBombIsRefusedAtTheBudget) {
  // 48 MiB of JSON whitespace inside a valid trace: the text is valid, only its size is hostile.
  std::string t = "{\"traceEvents\": [" + std::string(48u << 20, ' ') + "]}";
  auto gz = gzipOf(bytesOf(t));
  ASSERT_LT(gz.size(), 200000u);  // > 300x
  EXPECT_EQ(gzipDecodedBudget(gz.size()), kGzipDecodedFloor);
  EXPECT_EQ(gzipDecodedBudget(uint64_t{1} << 30), (uint64_t{1} << 30) * kGzipExpansionPerInputByte);
  ProfilerReadOptions po;
  po.max_decoded_bytes = 16u << 20;  // the floor is 64 MiB; the rule is the same below it
  auto snap = readProfilerInput(gz, po);
  ASSERT_FALSE(snap);
  EXPECT_NE(snap.error().message.find("decompression bomb"), std::string::npos)
      << snap.error().message;
  po.max_decoded_bytes = 0;  // the default budget lets this one through: it is only 48 MiB
  EXPECT_TRUE(readProfilerInput(gz, po));
  // 2021-form allocations (no address) that compress 300x: past the 64 MiB floor the file is
  // refused, where the old 256 MiB floor let 2.5 M of them through (890 KB: 1.6 GB, 41 s).
  std::string unit =
      "{\"ph\":\"i\",\"name\":\"[memory]\",\"pid\":7,\"tid\":1,\"ts\":1,\"args\":{\"Device "
      "Type\":1,\"Device Id\":0,\"Bytes\":512}},";
  std::string many = "{\"traceEvents\":[";
  while (many.size() < (80u << 20)) many += unit;
  many += "{}]}";
  auto gz2 = gzipOf(bytesOf(many));
  ASSERT_LT(gz2.size() * kGzipExpansionPerInputByte, kGzipDecodedFloor);
  auto refused = readProfilerInput(gz2, ProfilerReadOptions{});
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("decompression bomb"), std::string::npos)
      << refused.error().message;
}

// Ops that end exactly when the next begins were never popped from the open list, which every
// memory event then walked (300,000 ops: 50 s). Each op is now walked past once; the stacks are
// those of before: an event at the boundary is in both ops (ends are inclusive).
TEST(ProfilerHostile, TouchingOpsKeepTheirStacks) {
  std::vector<std::string> ev;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ev.push_back(op("cpu_op", "op" + std::to_string(i), 10 * i, 10));
  ev.push_back(mem(5, 512, 1000));           // inside op0 only
  ev.push_back(mem(10, 512, 2000));          // op1 begins where op0 ends: both
  ev.push_back(mem(10 * n - 5, 512, 3000));  // inside the last op only
  auto snap = loadSnapshotBytes(bytesOf(kineto(ev)));
  ASSERT_TRUE(snap) << snap.error().describe();
  std::vector<std::vector<std::string>> stacks;
  for (const Event& e : snap->trace(0))
    if (e.action == Action::Alloc) stacks.push_back(frameNames(*snap, e.stack));
  ASSERT_EQ(stacks.size(), 3u);
  EXPECT_EQ(stacks[0], (std::vector<std::string>{"op0"}));
  EXPECT_EQ(stacks[1], (std::vector<std::string>{"op1", "op0"}));
  EXPECT_EQ(stacks[2], (std::vector<std::string>{"op" + std::to_string(n - 1)}));
  EXPECT_FALSE(hasWarning(*snap, "nested deeper than")) << "no stack was cut";
}

TEST(ProfilerHostile, SniffingKeepsSnapshotJsonAndRefusesNonTraces) {
  EXPECT_EQ(sniffProfiler(bytesOf("{\"segments\": []}")), ProfilerKind::NotProfiler);
  EXPECT_EQ(sniffProfiler(bytesOf("[{\"address\": 1}]")), ProfilerKind::NotProfiler);
  EXPECT_EQ(sniffProfiler(bytesOf("[[1, 2, 3, 4]]")), ProfilerKind::MemoryTimeline);
  EXPECT_EQ(sniffProfiler(bytesOf("[ [-1, 1, 512, 7]]")), ProfilerKind::MemoryTimeline);
  EXPECT_EQ(sniffProfiler(bytesOf("[[], []]")), ProfilerKind::MemoryTimeline);
  // Deeper lists are no timeline: the JSON snapshot path refuses their depth.
  EXPECT_EQ(sniffProfiler(bytesOf("[[[[[[")), ProfilerKind::NotProfiler);
  EXPECT_EQ(sniffProfiler(bytesOf("{\"schemaVersion\": 1}")), ProfilerKind::KinetoTrace);
  auto snap = loadSnapshotBytes(bytesOf("{\"schemaVersion\": 1}"));
  ASSERT_FALSE(snap);
  EXPECT_NE(snap.error().message.find("traceEvents"), std::string::npos);
  auto gz = gzipOf(bytesOf("hello, not json"));
  auto g = loadSnapshotBytes(gz);
  ASSERT_FALSE(g);
  EXPECT_NE(g.error().message.find("invalid JSON"), std::string::npos) << g.error().message;
}

// A snapshot's JSON gzipped ("segments" its first key) is read as the same snapshot, not refused
// as a trace without traceEvents (issue 30); past the gzip budget it is refused.
TEST(ProfilerHostile, AGzippedSnapshotJsonIsTheSnapshot) {
  const std::string json =
      "{\"segments\": [{\"device\": 0, \"address\": 1048576, \"total_size\": 2097152, "
      "\"stream\": 0, \"segment_type\": \"small\", \"allocated_size\": 512, "
      "\"active_size\": 512, \"requested_size\": 512, \"blocks\": [{\"size\": 512, "
      "\"requested_size\": 512, \"state\": \"active_allocated\", \"address\": 1048576}, "
      "{\"size\": 2096640, \"state\": \"inactive\", \"address\": 1049088}]}], "
      "\"device_traces\": [[]]}";
  auto plain = loadSnapshotBytes(bytesOf(json));
  ASSERT_TRUE(plain) << plain.error().describe();
  const auto gz = gzipOf(bytesOf(json));
  EXPECT_EQ(sniffProfiler(gz), ProfilerKind::NotProfiler);
  auto snap = loadSnapshotBytes(gz);
  ASSERT_TRUE(snap) << snap.error().describe();
  EXPECT_EQ(snap->input_bytes, gz.size());
  ASSERT_EQ(snap->segments.size(), plain->segments.size());
  EXPECT_EQ(snap->segments[0].total_size, 2097152u);
  auto small = gunzipBounded(gz, 64);
  ASSERT_FALSE(small);
  EXPECT_NE(small.error().message.find("decompresses to more than 64"), std::string::npos)
      << small.error().message;
}

}  // namespace
}  // namespace memforensics::format
