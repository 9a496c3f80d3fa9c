// html_test.cc: the self-contained page: every placeholder filled, no network location, the data
// document equal to analyze --json's, and hostile snapshot strings unable to leave their JSON string.
#include "report/render_html.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "analysis/analyze.h"
#include "analysis/report_data.h"
#include "fixtures/snapshot_builder.h"
#include "report/render.h"

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
  if (a != std::string::npos && b != std::string::npos) p.data = p.html.substr(a + open.size(), b - a - open.size());
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
  // Exactly the page's own three script elements (error hook, data, script) close; nothing from the data.
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
  for (const auto& f : doc["frames"]) frame_found |= f[1] == "forward" + kEvil && f[0] == kEvil + ".py";
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
  EXPECT_NE(p.html.find(".stats {"), std::string::npos);            // the style is in
}

TEST(Html, TheEmbeddedAnalysisIsAnalyzeJson) {
  auto snap = hostile();
  Page p = render(snap, "x.pickle");
  auto doc = nlohmann::json::parse(p.data);
  auto expected = nlohmann::json::parse(renderJsonString(p.analysis));
  EXPECT_EQ(doc["analysis"], expected);
  ASSERT_EQ(doc["devices"].size(), 1u);
  EXPECT_EQ(doc["devices"][0]["peaks"]["requested"]["bytes"], expected["devices"][0]["peak_requested_bytes"]);
}

}  // namespace
}  // namespace memforensics::report
