// render_html.cc: fills viz/report.html with its style, script and data (see render_html.h).
#include "report/render_html.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <string_view>

#include "report/json_analysis.h"

namespace memforensics::report {

namespace viz {
extern const char kTemplate[];
extern const char kStyle[];
extern const char kScript[];
}  // namespace viz

namespace {

using nlohmann::json;
using analysis::MapState;

json pointsJson(const analysis::DeviceTimeline& t) {
  json ev = json::array(), tm = json::array(), res = json::array(), al = json::array(), rq = json::array(),
       pe = json::array();
  for (const auto& p : t.points) {
    ev.push_back(p.event);
    tm.push_back(p.time_us);
    res.push_back(p.at.reserved);
    al.push_back(p.at.allocated);
    rq.push_back(p.at.requested);
    pe.push_back(p.at.pending);
  }
  return {{"event", ev}, {"time_us", t.has_times ? tm : json(nullptr)}, {"reserved", res},
          {"allocated", al}, {"requested", rq}, {"pending", pe}};
}

json peakJson(const replay::Peak& p) { return {{"bytes", p.bytes}, {"event", p.event}, {"time_us", p.time_us}}; }

json countersJson(const replay::Counters& c) {
  return {{"reserved", c.reserved}, {"allocated", c.allocated}, {"requested", c.requested}, {"pending", c.pending}};
}

// Blocks of one segment appended to a keyframe's flat array: [size, requested, code, stack,
// alloc_event] per block, and for a run (code & 32) [size, requested, code, count, free_bytes,
// pending_bytes]. code = state | category << 2. Returns the number of values appended.
size_t appendBlocks(const analysis::MapSegment& s, json& a) {
  size_t n = 0;
  for (const auto& b : s.blocks) {
    int code = static_cast<int>(b.state) | static_cast<int>(b.category) << 2;
    a.push_back(b.size);
    a.push_back(b.requested);
    if (b.count > 1) {
      a.push_back(code | 32);
      a.push_back(b.count);
      a.push_back(b.free_bytes);
      a.push_back(b.pending_bytes);
      n += 6;
    } else {
      a.push_back(code);
      a.push_back(b.stack);
      a.push_back(b.alloc_event);
      n += 5;
    }
  }
  return n;
}

json deviceJson(const analysis::DeviceReportData& d) {
  const auto& t = d.timeline;
  json j;
  j["device"] = d.device;
  j["events"] = t.events;
  j["has_times"] = t.has_times;
  j["total_points"] = t.total_points;
  j["bucket_size"] = t.bucket_size;
  j["downsampled"] = t.downsampled;
  j["points"] = pointsJson(t);
  j["peaks"] = {{"reserved", peakJson(t.peak_reserved)},
                {"requested", peakJson(t.peak_requested)},
                {"allocated", peakJson(t.peak_allocated)},
                {"active", peakJson(t.peak_active)}};
  json ooms = json::array();
  for (const auto& o : t.ooms) {
    ooms.push_back({{"event", o.event}, {"time_us", o.time_us}, {"request_bytes", o.request_bytes}});
  }
  j["ooms"] = ooms;
  json phases = json::array();
  for (const auto& p : t.phases) {
    phases.push_back({{"kind", analysis::phaseKindName(p.phase.kind)},
                      {"name", p.phase.name},
                      {"first_event", p.phase.first_event},
                      {"last_event", p.phase.last_event},
                      {"start_us", p.phase.start_us},
                      {"end_us", p.phase.end_us},
                      {"detected", p.phase.source == analysis::PhaseSource::Detected},
                      {"peak_requested", p.peak_requested.bytes}});
  }
  j["phases"] = phases;
  // Segments as flat records [address, size, stream, pool (index into pool_names), expandable,
  // values of its blocks in the keyframe's `blocks` array].
  json kfs = json::array();
  json pool_names = json::array();
  std::map<std::string, size_t> pool_index;
  for (const auto& k : d.keyframes) {
    json segs = json::array(), blocks = json::array();
    for (const auto& s : k.segments) {
      auto [it, fresh] = pool_index.try_emplace(s.pool, pool_index.size());
      if (fresh) pool_names.push_back(s.pool);
      size_t n = appendBlocks(s, blocks);
      segs.push_back(s.address);
      segs.push_back(s.size);
      segs.push_back(s.stream);
      segs.push_back(it->second);
      segs.push_back(s.expandable ? 1 : 0);
      segs.push_back(n);
    }
    kfs.push_back({{"event", k.event},
                   {"time_us", k.time_us},
                   {"labels", k.labels},
                   {"at", countersJson(k.at)},
                   {"blocks_before_merge", k.blocks_before_merge},
                   {"segments", segs},
                   {"blocks", blocks}});
  }
  j["pool_names"] = pool_names;
  j["keyframes"] = kfs;
  j["layout_exact"] = d.layout_exact;
  j["model"] = {{"allocs", d.model.allocs},
                {"alloc_matches", d.model.alloc_matches},
                {"segment_events", d.model.segment_events},
                {"segment_matches", d.model.segment_matches}};
  json fr = json::array(), pa = json::array(), by = json::array(), se = json::array(), bl = json::array(),
       la = json::object();
  for (size_t i = 0; i < d.icicle.size(); ++i) {
    const auto& n = d.icicle[i];
    fr.push_back(n.frame);
    pa.push_back(n.parent);
    by.push_back(n.bytes);
    se.push_back(n.self);
    bl.push_back(n.blocks);
    if (!n.label.empty()) la[std::to_string(i)] = n.label;
  }
  j["icicle_event"] = d.icicle_event;
  j["icicle"] = {{"frame", fr}, {"parent", pa}, {"bytes", by}, {"self", se}, {"blocks", bl}, {"label", la}};
  return j;
}

// JSON text that is safe inside <script>: '<', '>' and '&' only occur inside JSON strings, where
// \u escapes mean the same characters; U+2028/2029 are escaped for old JavaScript parsers.
std::string escapeForScript(const std::string& s) {
  std::string out;
  out.reserve(s.size() + s.size() / 16);
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '<') {
      out += "\\u003c";
    } else if (c == '>') {
      out += "\\u003e";
    } else if (c == '&') {
      out += "\\u0026";
    } else if (c == '\xe2' && i + 2 < s.size() && s[i + 1] == '\x80' && (s[i + 2] == '\xa8' || s[i + 2] == '\xa9')) {
      out += s[i + 2] == '\xa8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string htmlDataJson(const analysis::AnalysisResult& analysis, const analysis::ReportData& data) {
  json doc;
  doc["format"] = "memforensics-report";
  doc["version"] = 1;
  doc["analysis"] = analysisJson(analysis);
  json frames = json::array();
  for (const auto& f : data.frames) frames.push_back({f.filename, f.name, f.line});
  doc["frames"] = frames;
  doc["stacks"] = data.stacks;
  doc["caps"] = data.caps;
  doc["categories"] = json::array();
  for (size_t c = 0; c < analysis::kCategoryCount; ++c) {
    doc["categories"].push_back(analysis::categoryName(static_cast<analysis::Category>(c)));
  }
  json devs = json::array();
  for (const auto& d : data.devices) devs.push_back(deviceJson(d));
  doc["devices"] = devs;
  return escapeForScript(doc.dump(-1, ' ', false, json::error_handler_t::replace));
}

void renderHtml(const analysis::AnalysisResult& analysis, const analysis::ReportData& data, std::ostream& out) {
  // The template's three placeholders are filled in the order they appear; the data is never
  // searched for placeholders.
  // A fresh nonce per report: only the page's own two scripts may run (Content-Security-Policy), so
  // even markup that slipped into the DOM could not execute an inline handler.
  std::string templ = viz::kTemplate;
  std::random_device rd;
  char nonce[33];
  std::snprintf(nonce, sizeof nonce, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  for (size_t at = templ.find("MEMF_NONCE"); at != std::string::npos; at = templ.find("MEMF_NONCE", at)) {
    templ.replace(at, 10, nonce);
  }
  const std::string_view page = templ;
  struct Part {
    size_t at;
    std::string_view mark;
  };
  Part parts[] = {{page.find("/*MEMF_STYLE*/"), "/*MEMF_STYLE*/"},
                  {page.find("/*MEMF_SCRIPT*/"), "/*MEMF_SCRIPT*/"},
                  {page.find("\"MEMF_DATA\""), "\"MEMF_DATA\""}};
  std::sort(std::begin(parts), std::end(parts), [](const Part& a, const Part& b) { return a.at < b.at; });
  size_t pos = 0;
  for (const Part& p : parts) {
    if (p.at == std::string_view::npos) continue;
    out << page.substr(pos, p.at - pos);
    if (p.mark == "/*MEMF_STYLE*/") out << viz::kStyle;
    if (p.mark == "/*MEMF_SCRIPT*/") out << viz::kScript;
    if (p.mark == "\"MEMF_DATA\"") out << htmlDataJson(analysis, data);
    pos = p.at + p.mark.size();
  }
  out << page.substr(pos);
}

}  // namespace memforensics::report
