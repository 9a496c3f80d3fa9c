// render_test.cc: the JSON report carries the documented fields and survives hostile strings.
#include "report/render.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "analysis/findings/findings.h"
#include "fixtures/snapshot_builder.h"
#include "report/json_analysis.h"
#include "report/render_timeline.h"

namespace memforensics::report {
namespace {

using memforensics::testing::buildSnapshot;
using memforensics::testing::TSnapshot;

TEST(RenderJson, HasSchemaAndRequiredDeviceFields) {
  TSnapshot t;
  std::vector<memforensics::testing::TFrame> bad = {
      {"</script><img src=x onerror=alert(1)>\xff.py", 1, "\"quoted\"\n"}};
  t.segments.push_back({0, 0x1000000, 0, "large", {{20971520, 5, "active_allocated", bad}}});
  t.traces.push_back({{"alloc", 0x1000000, 5, 0, 1, bad, true}, {"oom", 100, 1 << 30, 0, 2}});
  auto snap = buildSnapshot(t);
  auto r = analysis::analyzeSnapshot(snap);
  r.path = "x.pickle";
  auto j = nlohmann::json::parse(renderJsonString(r));
  EXPECT_EQ(j["schema_version"], kJsonSchemaVersion);
  ASSERT_EQ(j["devices"].size(), 1u);
  const auto& d = j["devices"][0];
  for (const char* key :
       {"device", "events", "peak_reserved_bytes", "peak_requested_bytes", "peak_allocated_bytes",
        "final_reserved_bytes", "final_requested_bytes", "oom_count", "anomalies"}) {
    EXPECT_TRUE(d.contains(key)) << key;
  }
  EXPECT_EQ(d["oom_count"], 1);
  EXPECT_EQ(d["ooms"][0]["request_bytes"], 1 << 30);
  EXPECT_EQ(d["ooms"][0]["device_free_bytes"], 100);
  // Invalid UTF-8 is replaced, markup is kept as data (escaping for HTML is the page's job).
  std::string fname = d["top_allocations_at_requested_peak"][0]["frames"][0]["filename"];
  EXPECT_EQ(fname.find("</script>"), 0u);
  EXPECT_NE(fname.find("\xEF\xBF\xBD"), std::string::npos);
}

// `--json` is written one device at a time, never as one tree: the bytes must be the tree's dump,
// with bad UTF-8 replaced the same way, for no device, one and several.
TEST(RenderJson, TheStreamedDocumentIsTheTreesDump) {
  auto dumpOf = [](const analysis::AnalysisResult& r) {
    return analysisJson(r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  analysis::AnalysisResult none;
  none.path = "none\xff.pickle";
  EXPECT_EQ(renderJsonString(none), dumpOf(none));
  TSnapshot t;
  std::vector<memforensics::testing::TFrame> bad = {{"m\xff.py", 1, "f\xc3"}};
  for (int64_t d = 0; d < 3; ++d) {
    t.segments.push_back({d, 0x1000000, 0, "large", {{20971520, 5, "active_allocated", bad}}});
    t.traces.push_back({{"alloc", 0x1000000, 5, 0, 1, bad, true}, {"oom", 100, 1 << 30, 0, 2}});
  }
  auto snap = buildSnapshot(t);
  auto r = analysis::analyzeSnapshot(snap);
  r.path = "x.pickle";
  const std::string streamed = renderJsonString(r);
  EXPECT_EQ(streamed, dumpOf(r));
  EXPECT_EQ(nlohmann::json::parse(streamed)["devices"].size(), 3u);
  std::ostringstream out;
  renderJson(r, out);
  EXPECT_EQ(out.str(), streamed + "\n");
}

// A job that catches OOMs and retries records any number of them: every one is counted, the first
// kOomsListed are listed, and the verdicts are the first kOomVerdicts - 1 and the last (60,000
// OOMs were 60,000 findings, a 159 MB document and 1.7 GB).
TEST(RenderJson, ManyOomsAreAllCountedAndListedUpToTheBound) {
  const size_t n = analysis::kOomsListed + 205;
  TSnapshot t;
  t.segments.push_back({0, 0x1000000, 0, "large", {{2097152, 0, "inactive", {}}}});
  std::vector<memforensics::testing::TEvent> tr;
  tr.push_back({"segment_alloc", 0x1000000, 2097152, 0, 1});
  for (size_t i = 0; i < n; ++i)
    tr.push_back({"oom", 100, 1 << 30, 0, static_cast<int64_t>(2 + i)});
  t.traces.push_back(tr);
  auto snap = buildSnapshot(t);
  auto r = analysis::analyzeSnapshot(snap);
  ASSERT_EQ(r.devices.size(), 1u);
  size_t verdicts = 0;
  std::string last_title;
  for (const auto& f : r.devices[0].findings) {
    if (f.kind != analysis::FindingKind::OomVerdict) continue;
    ++verdicts;
    if (f.title.find("OOM " + std::to_string(n) + " of " + std::to_string(n)) != std::string::npos)
      last_title = f.title;
  }
  EXPECT_EQ(verdicts, analysis::kOomVerdicts);
  EXPECT_FALSE(last_title.empty()) << "the last OOM has its verdict";
  auto j = nlohmann::json::parse(renderJsonString(r));
  const auto& d = j["devices"][0];
  EXPECT_EQ(d["oom_count"], n);
  EXPECT_EQ(d["ooms"].size(), analysis::kOomsListed);
  EXPECT_EQ(d["ooms_omitted"], 205);
  EXPECT_EQ(d["ooms"][0]["event"], 1);
  std::ostringstream out;
  renderText(r, out, {.width = 0});
  const std::string s = out.str();
  EXPECT_NE(s.find("OOMs: " + std::to_string(n) + "\n"), std::string::npos) << s.substr(0, 2000);
  EXPECT_NE(s.find("... and " + std::to_string(n - 16) + " more (analyze --json lists the first " +
                   std::to_string(analysis::kOomsListed) + ")"),
            std::string::npos);
}

// The timeline's text lists the first kTextOoms OOMs, one line each, and counts the rest (a file
// of 40,000 OOMs printed 40,000 lines); --json keeps every one.
TEST(RenderTimeline, TextListsTheFirstOomsAndCountsTheRest) {
  analysis::TimelineResult r;
  r.path = "x.pickle";
  analysis::DeviceTimeline d;
  for (int64_t i = 0; i < 100; ++i) {
    replay::OomEvent o;
    o.event = i;
    o.request_bytes = 1024;
    d.ooms.push_back(o);
  }
  r.devices.push_back(d);
  std::ostringstream js, text;
  renderTimelineText(r, text);
  const std::string s = text.str();
  size_t lines = 0;
  for (size_t at = s.find("OOM at event #"); at != std::string::npos;
       at = s.find("OOM at event #", at + 1))
    ++lines;
  EXPECT_EQ(lines, kTextOoms);
  EXPECT_NE(s.find("... and " + std::to_string(100 - kTextOoms) + " more OOMs"), std::string::npos)
      << s;
  renderTimelineJson(r, js);
  EXPECT_EQ(nlohmann::json::parse(js.str())["devices"][0]["ooms"].size(), 100u);
}

// Streams and pools beyond the breakdown bound are counted in both outputs, not dropped silently.
TEST(RenderTimeline, SaysHowManyStreamsAndPoolsWereNotBrokenDown) {
  analysis::TimelineResult r;
  r.path = "x.pickle";
  analysis::DeviceTimeline d;
  d.streams_omitted = 3;
  d.pools_omitted = 1;
  r.devices.push_back(d);
  std::ostringstream js, text;
  renderTimelineJson(r, js);
  auto j = nlohmann::json::parse(js.str());
  EXPECT_EQ(j["devices"][0]["streams_omitted"], 3);
  EXPECT_EQ(j["devices"][0]["pools_omitted"], 1);
  renderTimelineText(r, text);
  EXPECT_NE(text.str().find("not broken down: 3 stream(s) and 1 pool(s)"), std::string::npos)
      << text.str();
}

// torch.profiler's outputs record no PyTorch version: the input line says who wrote the file
// instead of "written by PyTorch none" (issue 28 item 10).
TEST(RenderText, AProfilerTraceIsWrittenByTorchProfiler) {
  TSnapshot t;
  t.traces.push_back({{"alloc", 0x1000000, 512, 0, 1}});
  auto snap = buildSnapshot(t);
  snap.source = format::SourceFormat::ProfilerTrace;
  auto r = analysis::analyzeSnapshot(snap);
  std::ostringstream out;
  renderText(r, out, {.width = 0});  // the words, not the layout
  EXPECT_NE(out.str().find("B, written by torch.profiler (the file records no PyTorch version)"),
            std::string::npos)
      << out.str();
  EXPECT_EQ(out.str().find("PyTorch none"), std::string::npos);
}

// export_memory_timeline names no device, and may be the CPU's: the text never calls it a GPU
// (issue 28 item 10).
TEST(RenderText, AMemoryTimelineIsNotCalledAGpu) {
  TSnapshot t;
  t.traces.push_back({{"alloc", 0x1000000, 512, 0, 1}});
  auto snap = buildSnapshot(t);
  snap.source = format::SourceFormat::MemoryTimeline;
  auto r = analysis::analyzeSnapshot(snap);
  std::ostringstream out;
  renderText(r, out, {.width = 0});
  const std::string s = out.str();
  EXPECT_NE(s.find("headline: the timeline's device (the file does not say which: the CPU or a "
                   "GPU)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("device 0 (not named by the file: the CPU or a GPU):"), std::string::npos) << s;
  EXPECT_EQ(s.find("cuda:"), std::string::npos) << s;
}

TEST(RenderText, MentionsPeaksOomsAndAnomalies) {
  TSnapshot t;
  t.segments.push_back({0, 0x1000000, 0, "large", {{20971520, 0, "inactive", {}}}});
  t.traces.push_back(
      {{"free_requested", 0x1000000, 7, 0, 1}, {"free_completed", 0x1000000, 7, 0, 1}});
  auto snap = buildSnapshot(t);
  auto r = analysis::analyzeSnapshot(snap);
  r.path = "y.pickle";
  std::ostringstream out;
  renderText(r, out, {.width = 0});  // the words, not the layout
  std::string s = out.str();
  EXPECT_NE(s.find("device 0: 2 events"), std::string::npos) << s;
  // The peak is before the trace's first entry and the trace frees a block allocated before it:
  // the history cannot explain an OOM (incomplete_history), so the absence is not claimed.
  EXPECT_NE(s.find("OOMs: unknown: the history cannot explain an OOM"), std::string::npos) << s;
  EXPECT_EQ(s.find("OOMs: none"), std::string::npos);
  EXPECT_NE(s.find("[data_loss] frees_before_trace_start x1"), std::string::npos);
  EXPECT_NE(s.find("history is truncated"), std::string::npos);
}

// Wrapping (issue 28 item 9): no line over the width unless one word is, a continuation indented
// past its line, a path never split, a number never parted from its unit.
TEST(TextLayout, WrapKeepsTheWidthWholePathsAndNumbersWithTheirUnits) {
  const std::string path = "/very/long/path/to/a/module/that/is/longer/than/the/width/model.py:54";
  const std::string text = "  - the peak holds 68.58 GiB of activations made by " + path +
                           " forward, and the rest is cached\nshort line\n";
  const std::string w = wrapLines(text, 40);
  std::istringstream in(w);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  ASSERT_GE(lines.size(), 4u) << w;
  for (const auto& l : lines) {
    if (l.find(path) == std::string::npos) EXPECT_LE(l.size(), 40u) << l;
  }
  EXPECT_NE(w.find(path), std::string::npos) << "the path is kept whole:\n" << w;
  EXPECT_NE(w.find("68.58 GiB"), std::string::npos) << w;
  EXPECT_EQ(lines[1].rfind("    ", 0), 0u) << "a '- ' item continues 2 past its indent: " << w;
  EXPECT_EQ(lines.back(), "short line");
  EXPECT_EQ(wrapLines(text, 0), text);
  EXPECT_EQ(wrapLines("exactly ten", 11), "exactly ten");
}

// The directory said once is the one that saves the most characters, and only when it is used
// often enough.
TEST(TextLayout, TheCommonPrefixIsTheDirectoryThatSavesTheMost) {
  const std::vector<std::string> paths = {"/home/u/proj/train.py", "/home/u/proj/model.py",
                                          "/usr/lib/python3/torch/nn/module.py"};
  std::string text;
  for (int i = 0; i < 5; ++i) text += "at /home/u/proj/train.py:1 and /home/u/proj/model.py:2\n";
  text += "at /usr/lib/python3/torch/nn/module.py:3\n";
  EXPECT_EQ(commonPathPrefix(text, paths), "/home/u/proj/");
  EXPECT_EQ(stripPrefix(text, "/home/u/proj/").find("/home/u/proj/"), std::string::npos);
  // Only where a path starts: the same directory inside a longer path stays.
  EXPECT_EQ(stripPrefix("at /mnt/mirror/home/u/proj/a.py and (/home/u/proj/b.py)", "/home/u/proj/"),
            "at /mnt/mirror/home/u/proj/a.py and (b.py)");
  // A hostile path of 20,000 directories: only its first kCommonPrefixMaxDepth count, and a path
  // over kCommonPrefixMaxPath bytes none (the search stays linear; nothing wrong is left out).
  std::string deep;
  for (int i = 0; i < 20000; ++i) deep += "/d";
  deep += "/x.py";
  EXPECT_EQ(commonPathPrefix(deep + " " + deep + " " + deep + " " + deep, {deep}), "");
  // Three uses: below kCommonPrefixMinUses, nothing is left out.
  EXPECT_EQ(commonPathPrefix("/home/u/proj/a.py /home/u/proj/b.py /home/u/proj/c.py", paths), "");
}

// A file of many devices: one line each, then the detail of the one that ran out of memory; the
// rest with --all-devices (issue 28 item 9: a 207-device file printed 10,148 lines).
TEST(RenderText, ManyDevicesGetALineEachAndDetailWhereItMatters) {
  TSnapshot t;
  for (int64_t d = 0; d < 6; ++d) {
    t.segments.push_back({d, 0x1000000, 0, "large", {{20971520, 0, "inactive", {}}}});
    std::vector<memforensics::testing::TEvent> ev = {{"segment_alloc", 0x1000000, 20971520, 0, 1},
                                                     {"alloc", 0x1000000, 4096, 0, 2},
                                                     {"free_requested", 0x1000000, 4096, 0, 3},
                                                     {"free_completed", 0x1000000, 4096, 0, 4}};
    if (d == 3) ev.push_back({"oom", 100, 1 << 30, 0, 5});
    t.traces.push_back(ev);
  }
  auto snap = buildSnapshot(t);
  auto r = analysis::analyzeSnapshot(snap);
  r.path = "many.pickle";
  std::ostringstream out;
  renderText(r, out);
  const std::string s = out.str();
  EXPECT_NE(s.find("devices: 6"), std::string::npos) << s;
  for (int d = 0; d < 6; ++d)
    EXPECT_NE(s.find("    cuda:" + std::to_string(d) + " "), std::string::npos) << d << "\n" << s;
  EXPECT_NE(s.find("\ndevice 3:"), std::string::npos) << "the OOM device's detail\n" << s;
  EXPECT_EQ(s.find("\ndevice 1:"), std::string::npos) << s;
  EXPECT_NE(s.find("5 more devices without an OOM"), std::string::npos) << s;
  for (const auto& dev : r.devices) {
    for (const auto& f : dev.findings)
      ASSERT_NE(f.severity, analysis::FindingSeverity::Warning) << "a warning would be counted";
  }
  TextOptions all;
  all.all_devices = true;
  std::ostringstream every;
  renderText(r, every, all);
  for (int d = 0; d < 6; ++d)
    EXPECT_NE(every.str().find("\ndevice " + std::to_string(d) + ":"), std::string::npos) << d;
  EXPECT_EQ(every.str().find("more devices without"), std::string::npos);
}

}  // namespace
}  // namespace memforensics::report
