// export_test.cc: the Perfetto and collapsed-stack exports, on fabricated and real snapshots.
#include "report/export.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "analysis/analyze.h"
#include "fixtures/real_snapshots.h"
#include "fixtures/snapshot_builder.h"
#include "format/load/load.h"
#include "replay/replay.h"
#include "report/render.h"

namespace memforensics::report {
namespace {

using memforensics::testing::buildSnapshot;
using memforensics::testing::TEvent;
using memforensics::testing::TFrame;
using memforensics::testing::TSnapshot;
using nlohmann::json;

constexpr int64_t kT0 = 1700000000000000;  // absolute time_us of the first timed event
constexpr uint64_t kSeg = 2097152;

// Innermost first, as PyTorch records them.
const std::vector<TFrame> kOomFrames = {
    {"/usr/lib/python3.10/site-packages/torch/nn/modules/module.py", 1500, "_call_impl"},
    {"model.py", 54, "forward"},
    {"train.py", 12, "main"}};

// One device with times: a segment, two allocs, a free, an OOM (counters worked out by hand in
// the tests below).
TSnapshot timedSnapshot() {
  TSnapshot t;
  t.segments.push_back({0,
                        0x1000000,
                        0,
                        "large",
                        {{1024, 0, "inactive", {}},
                         {2048, 2000, "active_allocated", kOomFrames},
                         {kSeg - 3072, 0, "inactive", {}}}});
  t.traces.push_back({{"segment_alloc", 0x1000000, kSeg, 0, kT0},
                      {"alloc", 0x1000000, 1000, 0, kT0 + 10, kOomFrames, true},
                      {"alloc", 0x1000400, 2000, 0, kT0 + 20, kOomFrames, true},
                      {"free_requested", 0x1000000, 1000, 0, kT0 + 30},
                      {"free_completed", 0x1000000, 1000, 0, kT0 + 40},
                      {"oom", 100, uint64_t{1} << 30, 7, kT0 + 50, kOomFrames, true}});
  return t;
}

void annotate(format::Snapshot& s, int64_t device, int64_t time, std::string_view name,
              std::string_view stage) {
  s.annotations.push_back({device, time, s.strings.intern(name), s.strings.intern(stage)});
}

std::string perfetto(const format::Snapshot& s, const PerfettoOptions& o = {}) {
  std::ostringstream out;
  Status st = exportPerfetto(s, out, o);
  EXPECT_TRUE(st.ok()) << st.error().describe();
  return out.str();
}

std::string collapsed(const format::Snapshot& s, const CollapsedOptions& o = {}) {
  std::ostringstream out;
  Status st = exportCollapsed(s, out, o);
  EXPECT_TRUE(st.ok()) << st.error().describe();
  return out.str();
}

using Samples = std::vector<std::pair<int64_t, uint64_t>>;  // (ts, bytes)
using Series = std::map<std::pair<int64_t, std::string>, Samples>;
// Counter series by (pid, name), in file order.
Series counters(const json& doc) {
  Series out;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "C") continue;
    out[{e["pid"].get<int64_t>(), e["name"].get<std::string>()}].push_back(
        {e["ts"].get<int64_t>(), e["args"]["bytes"].get<uint64_t>()});
  }
  return out;
}
std::vector<json> eventsWhere(const json& doc, const std::string& ph, int64_t pid) {
  std::vector<json> out;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == ph && e["pid"] == pid) out.push_back(e);
  }
  return out;
}
const Samples& series(const Series& c, int64_t pid, const std::string& name) {
  static const Samples none;
  auto it = c.find({pid, name});
  return it == c.end() ? none : it->second;
}
uint64_t maxOf(const Samples& s) {
  uint64_t m = 0;
  for (const auto& [ts, v] : s) m = std::max(m, v);
  return m;
}

// Structural rules every output must follow, whatever the input.
void checkTraceText(const std::string& text) {
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '}') << "no trailing data after the top-level object";
  for (unsigned char c : text) ASSERT_LT(c, 0x80) << "output is ASCII (non-ASCII is \\u-escaped)";
  // Every event starts with "ts", which Perfetto's tokenizer extracts by scanning keys in order.
  size_t start = text.find("\"traceEvents\":[");
  ASSERT_NE(start, std::string::npos);
  std::istringstream lines(text.substr(start));
  std::string line;
  std::getline(lines, line);
  while (std::getline(lines, line)) {
    if (line == "]}") break;
    EXPECT_EQ(line.rfind("{\"ts\":", 0), 0u) << line;
  }
}

// B/E events of each thread, in file order, form a stack with non-decreasing ts (so that a stable
// sort by ts, as trace importers do, keeps them nested).
void checkSlicesNest(const json& doc) {
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> open;  // (pid, tid) -> B ts
  std::map<std::pair<int64_t, int64_t>, int64_t> last;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "B" && e["ph"] != "E") continue;
    std::pair<int64_t, int64_t> key{e["pid"].get<int64_t>(), e["tid"].get<int64_t>()};
    int64_t ts = e["ts"].get<int64_t>();
    EXPECT_GE(ts, last[key]);
    last[key] = ts;
    if (e["ph"] == "B") {
      open[key].push_back(ts);
    } else {
      ASSERT_FALSE(open[key].empty()) << "E without B on tid " << key.second;
      open[key].pop_back();
    }
  }
  for (const auto& [key, stack] : open)
    EXPECT_TRUE(stack.empty()) << "unclosed B on tid " << key.second;
}

TEST(ExportPerfetto, TimedCountersOomPeaksAndTimeOrigin) {
  auto snap = buildSnapshot(timedSnapshot());
  std::string text = perfetto(snap);
  checkTraceText(text);
  json doc = json::parse(text);

  EXPECT_EQ(doc["otherData"]["time_axis"], "time_us");
  EXPECT_EQ(doc["otherData"]["time_origin_us"], std::to_string(kT0 - 1));
  EXPECT_EQ(doc["otherData"]["devices"], "0");

  // Start state at ts 0, then only the series that change, at time_us - origin.
  auto c = counters(doc);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(series(c, 1, "reserved"), (Samples{{0, 0}, {1, kSeg}}));
  EXPECT_EQ(series(c, 1, "allocated"), (Samples{{0, 0}, {11, 1024}, {21, 3072}, {31, 2048}}));
  EXPECT_EQ(series(c, 1, "requested"), (Samples{{0, 0}, {11, 1000}, {21, 3000}, {41, 2000}}));
  EXPECT_EQ(series(c, 1, "pending_free"), (Samples{{0, 0}, {31, 1024}, {41, 0}}));

  replay::DeviceReplayer r(snap, 0);
  auto s = replay::summarizeDevice(r);
  EXPECT_EQ(maxOf(series(c, 1, "reserved")), s.peak_reserved.bytes);
  EXPECT_EQ(maxOf(series(c, 1, "requested")), s.peak_requested.bytes);
  EXPECT_EQ(maxOf(series(c, 1, "allocated")), s.peak_allocated.bytes);

  // Process and thread names.
  std::map<std::string, std::string> meta;
  for (const auto& e : eventsWhere(doc, "M", 1)) {
    if (e["name"] == "process_name" || e["name"] == "thread_name") {
      meta[e["name"].get<std::string>() + "/" + std::to_string(e["tid"].get<int64_t>())] =
          e["args"]["name"].get<std::string>();
    }
  }
  EXPECT_EQ(meta["process_name/1000"], "GPU 0");
  EXPECT_EQ(meta["thread_name/1000"], "memory");

  // The OOM and the three peaks are process-scoped instants.
  std::map<std::string, json> instants;
  for (const auto& e : eventsWhere(doc, "i", 1)) instants[e["name"].get<std::string>()] = e;
  ASSERT_TRUE(instants.count("OOM"));
  const json& oom = instants["OOM"];
  EXPECT_EQ(oom["s"], "p");
  EXPECT_EQ(oom["ts"], 51);
  EXPECT_EQ(oom["args"]["request_bytes"], uint64_t{1} << 30);
  EXPECT_EQ(oom["args"]["device_free_bytes"], 100);
  EXPECT_EQ(oom["args"]["stream"], 7);
  EXPECT_EQ(oom["args"]["event"], 5);
  EXPECT_EQ(oom["args"]["time_us"], kT0 + 50);
  EXPECT_EQ(oom["args"]["requested_bytes"], 2000);
  EXPECT_EQ(oom["args"]["frames"], json({"forward (model.py:54)", "main (train.py:12)"}));
  EXPECT_EQ(instants["peak requested"]["ts"], 21);
  EXPECT_EQ(instants["peak requested"]["args"]["bytes"], 3000);
  EXPECT_EQ(instants["peak allocated"]["args"]["bytes"], 3072);
  EXPECT_EQ(instants["peak reserved"]["ts"], 1);
  EXPECT_EQ(instants["peak reserved"]["args"]["event"], 0);

  PerfettoOptions no_peaks;
  no_peaks.peak_instants = false;
  json doc2 = json::parse(perfetto(snap, no_peaks));
  EXPECT_EQ(eventsWhere(doc2, "i", 1).size(), 1u);  // the OOM only
}

// The OOM instant carries the counters under the names and with the values that analyze --json
// gives the same OOM ("state"): one spelling of the counters in every output (countersJson).
TEST(ExportPerfetto, OomCountersAreSpelledAsAnalyzeJsonSpellsThem) {
  auto snap = buildSnapshot(timedSnapshot());
  json doc = json::parse(perfetto(snap));
  json analyzed = json::parse(renderJsonString(analysis::analyzeSnapshot(snap)));
  const json& state = analyzed["devices"][0]["ooms"][0]["state"];
  ASSERT_TRUE(state.is_object());
  ASSERT_EQ(state.size(), 5u);  // reserved, requested, allocated, pending_free, active
  json oom;
  for (const auto& e : eventsWhere(doc, "i", 1)) {
    if (e["name"] == "OOM") oom = e;
  }
  ASSERT_TRUE(oom.is_object());
  for (auto it = state.begin(); it != state.end(); ++it) {
    ASSERT_TRUE(oom["args"].contains(it.key())) << it.key();
    EXPECT_EQ(oom["args"][it.key()], it.value()) << it.key();
  }
}

TEST(ExportPerfetto, AnnotationsBecomeNestedSlicesOnLanes) {
  auto snap = buildSnapshot(timedSnapshot());
  const std::string hostile = "fwd \"x\";</script>\n\xff";
  annotate(snap, 0, kT0 + 2, "outer", "START");
  annotate(snap, 0, kT0 + 5, hostile, "START");
  annotate(snap, 0, kT0 + 15, "bwd", "START");
  annotate(snap, 0, kT0 + 25, hostile, "END");  // overlaps bwd without nesting: second lane
  annotate(snap, 0, kT0 + 35, "bwd", "END");
  annotate(snap, -1, kT0 + 45, "outer", "END");  // no device: every device
  annotate(snap, 0, kT0 + 44, "lonely", "END");  // unmatched: an instant
  annotate(snap, 0, -1, "untimed", "START");     // no time: skipped
  std::string text = perfetto(snap);
  checkTraceText(text);
  json doc = json::parse(text);
  checkSlicesNest(doc);
  EXPECT_EQ(doc["otherData"]["annotations_skipped"], "1");

  const std::string fwd = "fwd \"x\";</script>\n\xEF\xBF\xBD";  // invalid byte replaced
  std::map<int64_t, std::vector<std::string>> lanes;  // tid -> "B name@ts" / "E@ts", file order
  for (const auto& e : doc["traceEvents"]) {
    const auto tid = e["tid"].get<int64_t>();
    std::string at = std::to_string(e["ts"].get<int64_t>());
    at.insert(at.begin(), '@');
    if (e["ph"] == "B") lanes[tid].push_back("B " + e["name"].get<std::string>() + at);
    if (e["ph"] == "E") lanes[tid].push_back("E" + at);
  }
  ASSERT_EQ(lanes.size(), 2u);
  EXPECT_EQ(lanes[1001],
            (std::vector<std::string>{"B outer@3", "B " + fwd + "@6", "E@26", "E@46"}));
  EXPECT_EQ(lanes[1002], (std::vector<std::string>{"B bwd@16", "E@36"}));

  std::map<int64_t, std::string> threads;
  for (const auto& e : eventsWhere(doc, "M", 1)) {
    if (e["name"] == "thread_name")
      threads[e["tid"].get<int64_t>()] = e["args"]["name"].get<std::string>();
  }
  EXPECT_EQ(threads[1001], "annotations");
  EXPECT_EQ(threads[1002], "annotations 2");

  std::vector<json> lonely;
  for (const auto& e : eventsWhere(doc, "i", 1)) {
    if (e["name"] == "lonely") lonely.push_back(e);
  }
  ASSERT_EQ(lonely.size(), 1u);
  EXPECT_EQ(lonely[0]["ts"], 45);
  EXPECT_EQ(lonely[0]["tid"], 1001);
  EXPECT_EQ(lonely[0]["s"], "t");
  EXPECT_EQ(lonely[0]["args"]["stage"], "END");
}

// Two devices, no times: blocks without stacks, with empty stacks, pending frees, ';' in names.
const std::vector<TFrame> kSemis = {{"a;b.py", 3, "fn;with;\"quotes\"</script>"}};
const std::vector<TFrame> kDeep = {{"alloc.cpp", format::kUnknownLine, "c10::alloc"},
                                   {"model.py", 7, "layer\nname"},
                                   {"train.py", 1, "main"}};

TSnapshot untimedTwoDevices() {
  TSnapshot t;
  t.segments.push_back({0,
                        0x2000000,
                        0,
                        "large",
                        {{512, 500, "active_allocated", kSemis},
                         {512, 300, "active_allocated", {}},
                         {1024, 700, "active_pending_free", {}},
                         {kSeg - 2048, 0, "inactive", {}}}});
  t.segments.push_back(
      {1,
       0x9000000,
       0,
       "large",
       {{4096, 4096, "active_allocated", kSemis}, {kSeg - 4096, 0, "inactive", {}}}});
  TEvent no_stack{"alloc", 0x2000400, 700};
  TEvent empty_stack{"alloc", 0x2000200, 300};
  empty_stack.with_frames = true;
  t.traces.push_back({{"segment_alloc", 0x2000000, kSeg},
                      {"alloc", 0x2000000, 500, 0, -1, kSemis, true},
                      empty_stack,
                      no_stack,
                      {"free_requested", 0x2000400, 700},
                      {"alloc", 0x2000800, 200, 0, -1, kDeep, true},  // the requested peak
                      {"free_requested", 0x2000800, 200},
                      {"free_completed", 0x2000800, 200}});
  t.traces.push_back({{"segment_alloc", 0x9000000, kSeg},
                      {"alloc", 0x9000000, 4096, 0, -1, kSemis, true},
                      {"oom", 5, 8192}});
  return t;
}

TEST(ExportPerfetto, UntimedFilesUseTheEventIndex) {
  auto snap = buildSnapshot(untimedTwoDevices());
  annotate(snap, 0, kT0, "step", "START");  // no time axis to put it on
  std::string text = perfetto(snap);
  checkTraceText(text);
  json doc = json::parse(text);
  EXPECT_EQ(doc["otherData"]["time_axis"], "event_index");
  EXPECT_FALSE(doc["otherData"].contains("time_origin_us"));
  EXPECT_EQ(doc["otherData"]["annotations_skipped"], "1");
  EXPECT_EQ(doc["otherData"]["devices"], "0,1");
  for (const auto& [k, v] : doc["otherData"].items()) EXPECT_TRUE(v.is_string()) << k;

  auto c = counters(doc);
  EXPECT_EQ(series(c, 1, "requested"),
            (Samples{{0, 0}, {2, 500}, {3, 800}, {4, 1500}, {6, 1700}, {8, 1500}}));
  EXPECT_EQ(series(c, 1, "allocated"),
            (Samples{{0, 0}, {2, 512}, {3, 1024}, {4, 2048}, {5, 1024}, {6, 1536}, {7, 1024}}));
  EXPECT_EQ(series(c, 1, "pending_free"), (Samples{{0, 0}, {5, 1024}, {7, 1536}, {8, 1024}}));
  EXPECT_EQ(series(c, 2, "requested"), (Samples{{0, 0}, {2, 4096}}));
  for (int64_t d : {0, 1}) {
    replay::DeviceReplayer r(snap, d);
    auto s = replay::summarizeDevice(r);
    EXPECT_EQ(maxOf(series(c, d + 1, "reserved")), s.peak_reserved.bytes);
    EXPECT_EQ(maxOf(series(c, d + 1, "requested")), s.peak_requested.bytes);
    EXPECT_EQ(maxOf(series(c, d + 1, "allocated")), s.peak_allocated.bytes);
  }
  std::vector<json> ooms = eventsWhere(doc, "i", 2);
  auto oom =
      std::find_if(ooms.begin(), ooms.end(), [](const json& e) { return e["name"] == "OOM"; });
  ASSERT_NE(oom, ooms.end());
  EXPECT_EQ((*oom)["ts"], 3);
  EXPECT_EQ((*oom)["args"]["time_us"], nullptr);
  EXPECT_EQ((*oom)["args"]["frames"], json::array());
}

TEST(ExportPerfetto, DeviceFilterAndErrors) {
  auto t = timedSnapshot();
  t.segments.push_back({1, 0x9000000, 0, "large", {{kSeg, 0, "inactive", {}}}});
  t.traces.push_back({{"segment_alloc", 0x9000000, kSeg, 0, kT0 + 100}});
  auto snap = buildSnapshot(t);
  annotate(snap, -1, kT0 + 60, "everywhere", "START");
  annotate(snap, 1, kT0 + 61, "one", "START");
  annotate(snap, 5, kT0 + 62, "nowhere", "START");  // no such device: skipped

  json all = json::parse(perfetto(snap));
  EXPECT_EQ(all["otherData"]["annotations_skipped"], "1");
  std::map<std::string, std::vector<int64_t>> pids;
  for (const auto& e : all["traceEvents"]) {
    if (e["ph"] == "i" && e.contains("args") && e["args"].contains("unmatched")) {
      pids[e["name"].get<std::string>()].push_back(e["pid"].get<int64_t>());
    }
  }
  EXPECT_EQ(pids["everywhere"], (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(pids["one"], (std::vector<int64_t>{2}));
  EXPECT_EQ(pids.count("nowhere"), 0u);

  PerfettoOptions only1;
  only1.device = 1;
  json one = json::parse(perfetto(snap, only1));
  for (const auto& e : one["traceEvents"]) EXPECT_EQ(e["pid"], 2);
  EXPECT_EQ(one["otherData"]["devices"], "1");
  EXPECT_EQ(one["otherData"]["annotations_skipped"], "1");
  EXPECT_EQ(series(counters(one), 2, "reserved"),
            (Samples{{0, 0}, {101, kSeg}}));  // same origin as the whole file would have

  std::ostringstream out;
  PerfettoOptions bad;
  bad.device = 3;
  Status st = exportPerfetto(snap, out, bad);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("device 3"), std::string::npos);

  std::ostringstream broken;
  broken.setstate(std::ios::badbit);
  EXPECT_FALSE(exportPerfetto(snap, broken, {}).ok());
  EXPECT_FALSE(exportCollapsed(snap, broken, {}).ok());
}

TEST(ExportPerfetto, HostileDeviceNumbersStillGiveValidJson) {
  TSnapshot t;
  t.segments.push_back({0, 0x1000000, 0, "large", {{512, 10, "active_allocated", kOomFrames}}});
  auto snap = buildSnapshot(t);
  // The pickle reader rejects such ordinals; other producers of the model may not.
  snap.segments[0].device = std::numeric_limits<int64_t>::max();
  std::string text = perfetto(snap);
  checkTraceText(text);
  json doc = json::parse(text);
  EXPECT_EQ(doc["otherData"]["devices"], std::to_string(std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(collapsed(snap),
            "cuda:9223372036854775807;main (train.py:12);forward (model.py:54);"
            "_call_impl (/usr/lib/python3.10/site-packages/torch/nn/modules/"
            "module.py:1500) 10\n");
}

TEST(ExportCollapsed, RequestedAtThePeakAllFrames) {
  auto snap = buildSnapshot(untimedTwoDevices());
  EXPECT_EQ(collapsed(snap),
            "cuda:0;[empty stack] 300\n"
            "cuda:0;[no stack recorded];[pending free] 700\n"
            "cuda:0;fn,with,\"quotes\"</script> (a,b.py:3) 500\n"
            "cuda:0;main (train.py:1);layer name (model.py:7);c10::alloc (alloc.cpp) 200\n"
            "cuda:1;fn,with,\"quotes\"</script> (a,b.py:3) 4096\n");
}

TEST(ExportCollapsed, AllocatedPeakUserFramesAndDeviceFilter) {
  auto snap = buildSnapshot(untimedTwoDevices());
  CollapsedOptions o;
  o.which = CollapsedValue::Allocated;
  o.device = 0;
  // The allocated peak is after the third alloc (2048 bytes): the 700-byte block is not pending
  // yet.
  EXPECT_EQ(collapsed(snap, o),
            "cuda:0;[empty stack] 512\n"
            "cuda:0;[no stack recorded] 1024\n"
            "cuda:0;fn,with,\"quotes\"</script> (a,b.py:3) 512\n");

  CollapsedOptions user;
  user.user_frames_only = true;
  user.device = 0;
  std::string text = collapsed(snap, user);
  EXPECT_NE(text.find("cuda:0;main (train.py:1);layer name (model.py:7) 200\n"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("c10::alloc"), std::string::npos);

  std::ostringstream out;
  CollapsedOptions bad;
  bad.device = 2;
  EXPECT_FALSE(exportCollapsed(snap, out, bad).ok());
  EXPECT_TRUE(out.str().empty());
}

// A line's text is built once, depth first: one stack of 200,000 frames gives one line of its own
// length (building every node's full path, as a first frame-tree version did, needs the sum of
// every prefix: about 4 * 10^11 bytes here).
TEST(ExportCollapsed, OneDeepStackCostsItsOwnLength) {
  std::vector<TFrame> deep;
  for (int i = 0; i < 200000; ++i) deep.push_back({"m.py", static_cast<uint64_t>(i + 1), "f"});
  TSnapshot t;
  t.segments.push_back({0, 0x1000000, 0, "large", {{512, 10, "active_allocated", deep}}});
  const std::string text = collapsed(buildSnapshot(t));
  ASSERT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
  EXPECT_EQ(std::count(text.begin(), text.end(), ';'), 200000);
  const std::string innermost = ";f (m.py:1) 10\n";
  EXPECT_EQ(text.rfind(innermost), text.size() - innermost.size());  // innermost last
  EXPECT_EQ(text.rfind("cuda:0;f (m.py:200000);", 0), 0u);           // outermost first
}

TEST(ExportCollapsed, SanitizesSeparatorsAndInvalidUtf8) {
  EXPECT_EQ(exportFrameText("f", "x.py", 3), "f (x.py:3)");
  EXPECT_EQ(exportFrameText("f", "x.cpp", format::kUnknownLine), "f (x.cpp)");
  EXPECT_EQ(exportFrameText("", "", 0), "[unknown]");
  TSnapshot t;
  std::vector<TFrame> odd = {{"bad\xff\xc3(.py", 1, "tab\there;\r\xe2\x82\xac ok"}};
  t.segments.push_back({0, 0x1000000, 0, "large", {{512, 10, "active_allocated", odd}}});
  auto snap = buildSnapshot(t);
  // No trace: the block is live from the start, with the stack of the final state.
  EXPECT_EQ(collapsed(snap),
            "cuda:0;tab here, \xe2\x82\xac ok (bad\xEF\xBF\xBD\xEF\xBF\xBD(.py:1) 10\n");
}

// ---- Real snapshots: the exports agree with the replayer on every file ----

namespace fs = std::filesystem;

std::vector<fs::path> realFiles() {
  return testing::realSnapshotPaths();
}

class RealExport : public ::testing::TestWithParam<fs::path> {};

TEST_P(RealExport, PerfettoCountersPeakWhereSummarizeDeviceSays) {
  auto snap = format::loadSnapshotFile(GetParam().string());
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  std::string text = perfetto(*snap);
  checkTraceText(text);
  json doc = json::parse(text);
  checkSlicesNest(doc);
  auto c = counters(doc);
  for (int64_t d : snap->devices()) {
    SCOPED_TRACE("device " + std::to_string(d));
    replay::DeviceReplayer r(*snap, d);
    auto s = replay::summarizeDevice(r);
    const int64_t pid = d + 1;
    EXPECT_EQ(maxOf(series(c, pid, "reserved")), s.peak_reserved.bytes);
    EXPECT_EQ(maxOf(series(c, pid, "requested")), s.peak_requested.bytes);
    EXPECT_EQ(maxOf(series(c, pid, "allocated")), s.peak_allocated.bytes);
    EXPECT_EQ(series(c, pid, "reserved").back().second, s.final_replayed.reserved);
    EXPECT_EQ(series(c, pid, "pending_free").back().second, s.final_replayed.pending);
    for (const auto& [key, samples] : c) {
      if (key.first != pid) continue;
      EXPECT_TRUE(std::is_sorted(samples.begin(), samples.end(), [](const auto& a, const auto& b) {
        return a.first < b.first;
      })) << key.second;
    }
    size_t ooms = 0;
    for (const auto& e : eventsWhere(doc, "i", pid)) ooms += e["name"] == "OOM";
    EXPECT_EQ(ooms, s.ooms.size());
  }
}

// One folded line "cuda:<d>;frame;...;frame <bytes>": device and bytes, nullopt when malformed.
// Parsed by hand: std::regex recurses once per character and overflows the stack on the
// 27,000-character lines of a deep real stack (volcengine__verl__mem segfaulted here).
std::optional<std::pair<int64_t, uint64_t>> parseFoldedLine(const std::string& line) {
  const size_t space = line.rfind(' ');
  if (space == std::string::npos || line.rfind("cuda:", 0) != 0) return std::nullopt;
  const std::string bytes = line.substr(space + 1);
  if (bytes.empty() || bytes.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  const std::string stack = line.substr(0, space);
  const size_t semi = stack.find(';');
  if (semi == std::string::npos) return std::nullopt;
  const std::string dev = stack.substr(5, semi - 5);
  if (dev.empty() || dev.find_first_not_of("-0123456789") != std::string::npos) {
    return std::nullopt;
  }
  // Every frame after the device is non-empty and holds no newline.
  for (size_t at = semi; at < stack.size();) {
    const size_t next = std::min(stack.find(';', at + 1), stack.size());
    if (next == at + 1) return std::nullopt;
    at = next;
  }
  if (stack.back() == ';' || stack.find('\n') != std::string::npos) return std::nullopt;
  return std::make_pair(std::stoll(dev), std::stoull(bytes));
}

TEST(CollapsedLine, ParsesLongLinesWithoutRecursion) {
  std::string line = "cuda:3";
  for (int i = 0; i < 20000; ++i) line += ";frame" + std::to_string(i);
  line += " 4096";
  auto p = parseFoldedLine(line);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->first, 3);
  EXPECT_EQ(p->second, 4096u);
  EXPECT_FALSE(parseFoldedLine("cuda:0 12").has_value());
  EXPECT_FALSE(parseFoldedLine("cuda:0;a;;b 12").has_value());
  EXPECT_FALSE(parseFoldedLine("cuda:0;a 1x").has_value());
  EXPECT_FALSE(parseFoldedLine("gpu:0;a 1").has_value());
}

TEST_P(RealExport, CollapsedSumsToThePeak) {
  auto snap = format::loadSnapshotFile(GetParam().string());
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  for (CollapsedValue which : {CollapsedValue::Requested, CollapsedValue::Allocated}) {
    CollapsedOptions o;
    o.which = which;
    std::istringstream in(collapsed(*snap, o));
    std::map<int64_t, uint64_t> sums;
    std::string line, prev;
    while (std::getline(in, line)) {
      auto parsed = parseFoldedLine(line);
      ASSERT_TRUE(parsed.has_value()) << line.substr(0, 200);
      sums[parsed->first] += parsed->second;
    }
    for (int64_t d : snap->devices()) {
      replay::DeviceReplayer r(*snap, d);
      auto s = replay::summarizeDevice(r);
      uint64_t peak =
          which == CollapsedValue::Requested ? s.peak_requested.bytes : s.peak_allocated.bytes;
      EXPECT_EQ(sums[d], peak) << "device " << d;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Files, RealExport, ::testing::ValuesIn(realFiles()),
                         [](const auto& info) { return testing::testNameOf(info.param); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(RealExport);

}  // namespace
}  // namespace memforensics::report
