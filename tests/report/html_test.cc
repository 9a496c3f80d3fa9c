// html_test.cc: the self-contained page: every placeholder filled, no network location, the data
// document equal to analyze --json's, and hostile snapshot strings unable to leave their JSON
// string.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "analysis/analyze.h"
#include "analysis/session/phases.h"
#include "fixtures/snapshot_builder.h"
#include "report/html/report_data.h"
#include "report/render.h"
#include "report/render_html.h"

namespace memforensics::report {
namespace {

using memforensics::testing::buildSnapshot;
using memforensics::testing::TEvent;
using memforensics::testing::TSnapshot;

const std::string kEvil = "</script><img src=x onerror=alert(1)><!-- \xe2\x80\xa8 & \"q\" '";

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

struct Page {
  std::string html;
  std::string data;  // the text of the data element
  analysis::AnalysisResult analysis;
};

Page render(const format::Snapshot& snap, const std::string& path) {
  Page p;
  p.analysis = analysis::analyzeSnapshot(snap);
  p.analysis.path = path;
  analysis::ReportData data = analysis::buildReportData(snap);
  std::ostringstream out;
  renderHtml(p.analysis, data, out);
  p.html = out.str();
  const std::string open = "<script id=\"memf-data\" type=\"application/json\">";
  size_t a = p.html.find(open);
  size_t b = a == std::string::npos ? a : p.html.find("</script>", a);
  if (a != std::string::npos && b != std::string::npos)
    p.data = p.html.substr(a + open.size(), b - a - open.size());
  return p;
}

format::Snapshot hostile() {
  TSnapshot t;
  TEvent seg{"segment_alloc", 0x7f0000000000ULL, 2097152, 0, 1};
  TEvent al{"alloc", 0x7f0000000000ULL, 4096, 0, 2};
  al.frames = {{kEvil + ".py", 5, "forward" + kEvil}, {"train.py", 1, "<module>"}};
  al.with_frames = true;
  t.traces.push_back({seg, al});
  return buildSnapshot(t);
}

TEST(Html, HostileStringsStayInsideTheirJsonString) {
  Page p = render(hostile(), "/tmp/" + kEvil + ".pickle");
  // Exactly the page's own three script elements (error hook, data, script) close; nothing from the
  // data.
  EXPECT_EQ(count(p.html, "</script>"), 3u);
  EXPECT_EQ(count(p.html, "<img"), 0u);
  EXPECT_EQ(p.data.find('<'), std::string::npos);
  EXPECT_EQ(p.data.find('>'), std::string::npos);
  EXPECT_EQ(p.data.find('&'), std::string::npos);
  EXPECT_EQ(p.data.find("\xe2\x80\xa8"), std::string::npos);
  // The escapes decode back to the original strings.
  auto doc = nlohmann::json::parse(p.data);
  EXPECT_EQ(doc["analysis"]["path"], "/tmp/" + kEvil + ".pickle");
  bool frame_found = false;
  for (const auto& f : doc["frames"])
    frame_found |= f[1] == "forward" + kEvil && f[0] == kEvil + ".py";
  EXPECT_TRUE(frame_found);
}

TEST(Html, EveryPlaceholderIsFilledAndNothingLeavesThePage) {
  Page p = render(hostile(), "x.pickle");
  EXPECT_EQ(p.html.find("MEMF_"), std::string::npos);
  EXPECT_EQ(p.html.find("http://"), std::string::npos);
  EXPECT_EQ(p.html.find("https://"), std::string::npos);
  std::string outside_data = p.html;
  outside_data.erase(outside_data.find(p.data), p.data.size());
  EXPECT_EQ(outside_data.find(" src="), std::string::npos);  // no external script, image or frame
  EXPECT_NE(p.html.find("Content-Security-Policy"), std::string::npos);
  // The nonce in the policy is the one the page's scripts carry.
  size_t at = p.html.find("'nonce-");
  ASSERT_NE(at, std::string::npos);
  std::string nonce = p.html.substr(at + 7, 32);
  EXPECT_EQ(count(p.html, "<script nonce=\"" + nonce + "\">"), 2u);
  EXPECT_NE(p.html.find("function fmtBytes"), std::string::npos);  // the script is in
  EXPECT_NE(p.html.find(".stats {"), std::string::npos);           // the style is in
}

TEST(Html, TheEmbeddedAnalysisIsAnalyzeJson) {
  auto snap = hostile();
  Page p = render(snap, "x.pickle");
  auto doc = nlohmann::json::parse(p.data);
  auto expected = nlohmann::json::parse(renderJsonString(p.analysis));
  EXPECT_EQ(doc["analysis"], expected);
  ASSERT_EQ(doc["devices"].size(), 1u);
  EXPECT_EQ(doc["devices"][0]["peaks"]["requested"]["bytes"],
            expected["devices"][0]["peak_requested_bytes"]);
}

// A keyframe's counters are spelled as analyze --json spells the device's "start" and "final"
// (countersJson), and the start keyframe's values are the start state's.
TEST(Html, KeyframeCountersAreSpelledAsAnalyzeJsonSpellsThem) {
  TSnapshot t;
  TEvent seg{"segment_alloc", 0x7f0000000000ULL, 2097152, 0, 1};
  TEvent al{"alloc", 0x7f0000000000ULL, 4096, 0, 2};
  TEvent fr{"free_requested", 0x7f0000000000ULL, 4096, 0, 3};
  t.traces.push_back({seg, al, fr});
  auto snap = buildSnapshot(t);
  Page p = render(snap, "x.pickle");
  auto doc = nlohmann::json::parse(p.data);
  const auto& final_state = doc["analysis"]["devices"][0]["final"];
  ASSERT_EQ(final_state.size(), 5u);
  const auto& kfs = doc["devices"][0]["keyframes"];
  ASSERT_FALSE(kfs.empty());
  const auto& last = kfs.back();
  ASSERT_EQ(last["event"], 2);
  EXPECT_EQ(last["at"], final_state);  // same keys, same values (4096 B pending free)
}

// ---- The page bound holds for any input, and its notes are true ------------------------------

constexpr size_t kCliBound = kReportPageBytes;  // what `report` asks renderHtmlWithin for
const std::string kEllipsis = "\xE2\x80\xA6";

struct Bounded {
  std::string html;
  nlohmann::json doc;
  std::vector<std::string> caps;
};

std::string dataOf(const std::string& html) {
  const std::string open = "<script id=\"memf-data\" type=\"application/json\">";
  size_t a = html.find(open);
  size_t b = a == std::string::npos ? a : html.find("</script>", a);
  if (a == std::string::npos || b == std::string::npos) return "";
  return html.substr(a + open.size(), b - a - open.size());
}

Bounded renderBounded(const format::Snapshot& snap, size_t max_bytes,
                      const analysis::ReportDataOptions& o = {}) {
  Bounded b;
  analysis::AnalyzeOptions ao;
  ao.top_frames =
      10;  // as `report` asks (cmd_report.cc): the call graph at the peak is in the page
  auto a = analysis::analyzeSnapshot(snap, ao);
  a.path = "hostile.pickle";
  auto data = analysis::buildReportData(snap, o);
  b.html = renderHtmlWithin(a, data, max_bytes);
  b.doc = nlohmann::json::parse(dataOf(b.html));
  for (const auto& c : b.doc["caps"]) b.caps.push_back(c.get<std::string>());
  return b;
}

// The number N in the first note containing `what` ("... N <what> ..."), -1 when there is none.
int64_t noteCount(const std::vector<std::string>& caps, const std::string& what,
                  const std::string& prefix) {
  for (const auto& c : caps) {
    size_t at = c.find(what);
    if (at == std::string::npos || c.rfind(prefix, 0) != 0) continue;
    return std::stoll(c.substr(prefix.size()));
  }
  return -1;
}

void forEachString(const nlohmann::json& j, const std::function<void(const std::string&)>& f) {
  if (j.is_string()) f(j.get<std::string>());
  if (j.is_array() || j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (j.is_object()) f(it.key());
      forEachString(it.value(), f);
    }
  }
}

TEST(HtmlBound, LongFrameNamesAreTruncatedAndCounted) {
  TSnapshot t;
  std::vector<TEvent> tr = {{"segment_alloc", 0x7f0000000000ULL, 1ULL << 30, 0, 1}};
  for (int i = 0; i < 21; ++i) {  // 21 frame names of 1 MiB, each live at the peak
    TEvent al{"alloc", 0x7f0000000000ULL + static_cast<uint64_t>(i) * 4096, 4096, 0, 2 + i};
    al.frames = {
        {"f" + std::to_string(i) + ".py", 1, std::string(1 << 20, static_cast<char>('A' + i))},
        {"train.py", 1, "<module>"}};
    al.with_frames = true;
    tr.push_back(al);
  }
  t.traces.push_back(tr);
  Bounded b = renderBounded(buildSnapshot(t), kCliBound);
  EXPECT_LT(b.html.size(), 5'000'000u);
  size_t marked = 0, longest = 0;
  nlohmann::json data = b.doc;
  data.erase("caps");  // the notes themselves name the marker
  forEachString(data, [&](const std::string& s) {
    if (s.find(kEllipsis + " [+") != std::string::npos) ++marked;
    longest = std::max(longest, s.size());
  });
  EXPECT_GT(marked, 20u);
  EXPECT_LE(longest, kPageStringBytes + 32);  // the limit and its marker
  EXPECT_EQ(noteCount(b.caps, "strings truncated to 1024 bytes", "page: "),
            static_cast<int64_t>(marked));
}

TEST(HtmlBound, DeepStacksKeepTheirEndsAndCountWhatIsLeftOut) {
  std::vector<memforensics::testing::TFrame> deep;
  for (int i = 0; i < 100000; ++i)
    deep.push_back({"m.py", static_cast<uint64_t>(i + 1), "f" + std::to_string(i)});
  TSnapshot t;
  t.segments.push_back(
      {0,
       0x7f0000000000ULL,
       0,
       "large",
       {{4096, 4096, "active_allocated", deep}, {2097152 - 4096, 0, "inactive", {}}}});
  TEvent seg{"segment_alloc", 0x7f0000000000ULL, 2097152, 0, 1};
  TEvent al{"alloc", 0x7f0000000000ULL, 4096, 0, 2};
  al.frames = deep;
  al.with_frames = true;
  t.traces.push_back({seg, al});
  auto snap = buildSnapshot(t);
  Bounded b = renderBounded(snap, kCliBound);
  EXPECT_LT(b.html.size(), 5'000'000u);
  // Every list of frames in the analysis holds the 24 innermost, one marker, the 24 outermost.
  uint64_t omitted = 0;
  size_t lists = 0;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& j) {
    if (j.is_object()) {
      for (auto it = j.begin(); it != j.end(); ++it) {
        if ((it.key() == "frames" || it.key() == "where" || it.key() == "hot_path") &&
            it.value().is_array()) {
          EXPECT_LE(it.value().size(), kPageFramesPerList + 1) << it.key();
          for (const auto& f : it.value()) {
            const auto& fr = f.contains("frame") ? f["frame"] : f;
            std::string name = fr.is_object() ? fr.value("name", "") : "";
            if (name.rfind(kEllipsis + " ", 0) == 0) {
              omitted += std::stoull(name.substr(kEllipsis.size() + 1));
              ++lists;
            }
          }
        }
        walk(it.value());
      }
    } else if (j.is_array()) {
      for (const auto& v : j) walk(v);
    }
  };
  walk(b.doc["analysis"]);
  EXPECT_GT(lists, 0u);
  const std::string prefix = "page: " + std::to_string(lists) +
                             " stacks show their 24 innermost and 24 outermost frames (";
  bool noted = false;
  for (const auto& c : b.caps) {
    if (c.rfind(prefix, 0) == 0) {
      noted = true;
      EXPECT_EQ(std::stoull(c.substr(prefix.size())), omitted) << c;
    }
  }
  EXPECT_TRUE(noted) << prefix << " / " << nlohmann::json(b.caps).dump();
  // The innermost frame survives.
  EXPECT_NE(dataOf(b.html).find("\"f0\""), std::string::npos);
  EXPECT_NE(dataOf(b.html).find("\"f99999\""), std::string::npos);
}

format::Snapshot manyRanges(size_t ranges) {
  TSnapshot t;
  std::vector<TEvent> tr = {{"segment_alloc", 0x7f0000000000ULL, 1ULL << 30, 0, 0}};
  for (size_t i = 0; i < ranges; ++i) {
    const auto t1 = static_cast<int64_t>(2 * i + 1);
    tr.push_back({"alloc", 0x7f0000000000ULL, 512 * (1 + i % 7), 0, t1});
    tr.push_back({"free_requested", 0x7f0000000000ULL, 512 * (1 + i % 7), 0, t1 + 1});
    tr.push_back({"free_completed", 0x7f0000000000ULL, 512 * (1 + i % 7), 0, t1 + 1});
  }
  t.traces.push_back(tr);
  auto snap = buildSnapshot(t);
  for (size_t k = 0; k < ranges; ++k) {
    const std::string name = "range " + std::to_string(k);
    snap.annotations.push_back(
        {0, static_cast<int64_t>(k), snap.strings.intern(name), snap.strings.intern("START")});
    snap.annotations.push_back({0, static_cast<int64_t>(2 * ranges + 1 - k),
                                snap.strings.intern(name), snap.strings.intern("END")});
  }
  snap.traits.has_annotations_key = true;
  return snap;
}

TEST(HtmlBound, HundredThousandRangesDrawAThousandAndSaySo) {
  auto snap = manyRanges(100000);
  Bounded b = renderBounded(snap, kCliBound);
  EXPECT_LT(b.html.size(), 5'000'000u);
  ASSERT_EQ(b.doc["devices"].size(), 1u);
  const size_t drawn = b.doc["devices"][0]["phases"].size();
  EXPECT_EQ(drawn, 1000u);
  const size_t all = analysis::detectPhases(snap, 0).size();
  EXPECT_EQ(noteCount(b.caps, "phases not drawn", "timeline: "), static_cast<int64_t>(all - drawn));
}

// Below what the data's bounds reach, sections are dropped until the page fits, and each note
// says what went: a note about the bound is never false.
TEST(HtmlBound, SectionsAreDroppedUntilThePageFitsAndTheNotesSayWhich) {
  auto snap = manyRanges(3000);
  Bounded full = renderBounded(snap, SIZE_MAX);
  ASSERT_GT(full.html.size(), 300'000u);
  // The smallest page (level 4: the page's code and styles, the summary) plus a little: the
  // levels that drop every drawing (a fixed budget would track the size of viz/report.js).
  const size_t smallest = renderBounded(snap, 1).html.size() + 8'000;
  ASSERT_LT(smallest, 250'000u);
  for (size_t budget : {full.html.size() - 1, size_t{250'000}, smallest}) {
    SCOPED_TRACE(budget);
    Bounded b = renderBounded(snap, budget);
    EXPECT_LE(b.html.size(), budget);
    bool no_device = false, lists10 = false;
    for (const auto& c : b.caps) {
      no_device |= c.find("no device is drawn") != std::string::npos;
      lists10 |= c.find("analysis lists cut to 10 entries") != std::string::npos;
    }
    EXPECT_EQ(no_device, b.doc["devices"].empty());
    if (lists10) {
      std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& j) {
        if (j.is_array()) EXPECT_LE(j.size(), 49u);  // frame lists: 48 and a marker; others 10
        if (j.is_array() || j.is_object()) {
          for (const auto& v : j) walk(v);
        }
      };
      walk(b.doc["analysis"]);
    }
    if (b.html.size() < full.html.size()) EXPECT_FALSE(b.caps.empty());
    // Before any section goes, event stepping narrows where that alone fits the page, else the
    // data's bounds are halved on the data already built.
    bool halved = false, stepped = false;
    for (const auto& c : b.caps) {
      halved |= c.find("bounds were halved") != std::string::npos;
      stepped |= c.find("events of the event-stepping windows left out") != std::string::npos;
    }
    EXPECT_TRUE(halved || stepped);
    // The counts of what is drawn are the page's own, also once its data was halved: the
    // timeline's kept points and the allocations drawn one by one (drawnCaps; 5 numbers each).
    size_t points = 0, drawn = 0;
    for (const auto& d : b.doc["devices"]) {
      if (d["downsampled"].get<bool>()) points += d["points"]["event"].size();
      if (d["allocations"]["capped"].get<bool>()) drawn += d["allocations"]["drawn"].size() / 5;
    }
    for (const auto& c : b.caps) {
      const auto number_after = [&](const std::string& what) {
        const size_t at = c.find(what);
        return at == std::string::npos ? int64_t{-1} : std::stoll(c.substr(at + what.size()));
      };
      if (c.rfind("timeline: ", 0) == 0 && c.find("kept ones") != std::string::npos) {
        EXPECT_EQ(number_after(" drawn from "), static_cast<int64_t>(points)) << c;
      }
      if (c.rfind("allocations: on ", 0) == 0) {
        EXPECT_EQ(number_after(" device(s) the "), static_cast<int64_t>(drawn)) << c;
      }
    }
    if (budget == full.html.size() - 1) {
      EXPECT_TRUE(stepped);
      EXPECT_FALSE(halved);
    }
  }
}

// Byte counts above 2^53 are not exact as JavaScript numbers: the page carries them as decimal
// strings (the page formats them as text), equal to analyze --json's numbers.
TEST(HtmlBound, ByteCountsAbove2To53TravelAsExactStrings) {
  const uint64_t big = (uint64_t{1} << 54) + 1;  // not a double
  TSnapshot t;
  TEvent seg{"segment_alloc", 0x100000000000ULL, uint64_t{1} << 55, 0, 1};
  TEvent al{"alloc", 0x100000000000ULL, big, 0, 2};
  t.traces.push_back({seg, al});
  auto snap = buildSnapshot(t);
  Bounded b = renderBounded(snap, kCliBound);
  auto expected = nlohmann::json::parse(renderJsonString(analysis::analyzeSnapshot(snap)));
  ASSERT_EQ(expected["devices"][0]["peak_requested_bytes"].get<uint64_t>(), big);
  const auto& dev = b.doc["analysis"]["devices"][0];
  ASSERT_TRUE(dev["peak_requested_bytes"].is_string());
  EXPECT_EQ(dev["peak_requested_bytes"].get<std::string>(), std::to_string(big));
  EXPECT_TRUE(dev["events"].is_number());  // counts that are not bytes stay numbers
  EXPECT_GT(noteCount(b.caps, "byte counts above 2^53", "page: "), 0);
  // Small values stay numbers: the page of an ordinary snapshot is analyze --json's document.
  Bounded small = renderBounded(hostile(), kCliBound);
  EXPECT_TRUE(small.doc["analysis"]["devices"][0]["peak_requested_bytes"].is_number());
}

// A file of many devices: the page carries the analysis of at most kPageAnalysisDevices, the drawn
// ones and the headline's among them (300,000 devices built a 4 GB tree per render and never
// finished), and says how many it left out.
TEST(HtmlReport, ManyDevicesCarryTheAnalysisOfABoundedFewTheDrawnOnesFirst) {
  const int64_t n = static_cast<int64_t>(kPageAnalysisDevices) + 200;
  const int64_t oom_device = n - 3;  // past the bound in file order: the headline's device
  TSnapshot t;
  for (int64_t d = 0; d < n; ++d) {
    t.segments.push_back({d, 0x1000000, 0, "large", {{2097152, 0, "inactive", {}}}});
    std::vector<TEvent> tr{{"segment_alloc", 0x1000000, 2097152, 0, 1}};
    if (d == oom_device) tr.push_back({"oom", 100, 1 << 30, 0, 2});
    t.traces.push_back(tr);
  }
  const Bounded b = renderBounded(buildSnapshot(t), kCliBound);
  const auto& devices = b.doc["analysis"]["devices"];
  ASSERT_EQ(devices.size(), kPageAnalysisDevices);
  bool has_oom_device = false;
  int64_t prev = -1;
  for (const auto& d : devices) {
    const int64_t id = d["device"].get<int64_t>();
    EXPECT_GT(id, prev) << "file order";
    prev = id;
    has_oom_device |= id == oom_device;
  }
  EXPECT_TRUE(has_oom_device);
  EXPECT_EQ(b.doc["headline"]["focus_device"], oom_device);
  EXPECT_EQ(noteCount(b.caps, "devices left out", "page: the analysis of"), 200)
      << nlohmann::json(b.caps).dump();
}

// More headline devices than the bound (an OOM on each of 1,100 devices): the page still carries
// kPageAnalysisDevices analyses, the focus and the drawn devices among them, the headline's before
// the file's first devices (which have nothing to say).
TEST(HtmlReport, MoreHeadlineDevicesThanTheBoundStillCarryABoundedFew) {
  const int64_t n = 1200, first_oom = 100;
  TSnapshot t;
  for (int64_t d = 0; d < n; ++d) {
    t.segments.push_back({d, 0x1000000, 0, "large", {{2097152, 0, "inactive", {}}}});
    std::vector<TEvent> tr{{"segment_alloc", 0x1000000, 2097152, 0, 1}};
    if (d >= first_oom) tr.push_back({"oom", 100, 1 << 30, 0, 2});
    t.traces.push_back(tr);
  }
  const Bounded b = renderBounded(buildSnapshot(t), kCliBound);
  const auto& devices = b.doc["analysis"]["devices"];
  ASSERT_EQ(devices.size(), kPageAnalysisDevices);
  std::set<int64_t> carried;
  for (const auto& d : devices) carried.insert(d["device"].get<int64_t>());
  EXPECT_EQ(carried.count(0), 0u) << "a device with nothing to say before a headline one";
  EXPECT_EQ(carried.count(b.doc["headline"]["focus_device"].get<int64_t>()), 1u);
  for (const auto& d : b.doc["devices"]) EXPECT_EQ(carried.count(d["device"].get<int64_t>()), 1u);
  EXPECT_EQ(noteCount(b.caps, "devices left out", "page: the analysis of"), 200);
}

}  // namespace
}  // namespace memforensics::report
