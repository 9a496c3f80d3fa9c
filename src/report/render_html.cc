// render_html.cc: fills viz/report.html with its style, script and data (see render_html.h).
#include "report/render_html.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "analysis/findings/headline.h"
#include "analysis/frames/frame_class.h"
#include "report/json_analysis.h"
#include "report/render_compare.h"

namespace memforensics::report {

namespace viz {
extern const char kTemplate[];
extern const char kStyle[];
extern const char kAllocationsScript[];
extern const char kBlockMapScript[];
extern const char kIcicleScript[];
extern const char kScript[];
extern const char kWhatIfScript[];
}  // namespace viz

namespace {

using analysis::MapState;
using nlohmann::json;

json pointsJson(const analysis::DeviceTimeline& t) {
  json ev = json::array(), tm = json::array(), res = json::array(), al = json::array(),
       rq = json::array(), pe = json::array();
  for (const auto& p : t.points) {
    ev.push_back(p.event);
    tm.push_back(p.time_us);
    res.push_back(p.at.reserved);
    al.push_back(p.at.allocated);
    rq.push_back(p.at.requested);
    pe.push_back(p.at.pending);
  }
  return {{"event", ev},     {"time_us", t.has_times ? tm : json(nullptr)},
          {"reserved", res}, {"allocated", al},
          {"requested", rq}, {"pending", pe}};
}

json peakJson(const replay::Peak& p) {
  return {{"bytes", p.bytes}, {"event", p.event}, {"time_us", p.time_us}};
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

// A call tree as parallel arrays: frame, parent, bytes, self, blocks; labels of synthetic nodes.
json icicleJson(const std::vector<analysis::IcicleNode>& nodes) {
  json fr = json::array(), pa = json::array(), by = json::array(), se = json::array(),
       bl = json::array(), la = json::object();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    fr.push_back(n.frame);
    pa.push_back(n.parent);
    by.push_back(n.bytes);
    se.push_back(n.self);
    bl.push_back(n.blocks);
    if (!n.label.empty()) la[std::to_string(i)] = n.label;
  }
  return {{"frame", fr}, {"parent", pa}, {"bytes", by},
          {"self", se},  {"blocks", bl}, {"label", la}};
}

std::string_view icicleSourceName(analysis::IcicleSource s) {
  switch (s) {
    case analysis::IcicleSource::Live:
      return "live";
    case analysis::IcicleSource::Layout:
      return "layout";
    case analysis::IcicleSource::None:
      break;
  }
  return "none";
}

// The allocation view (report_data.h AllocationView): `drawn` as flat records [alloc_event,
// free_event, bytes, stack, category] (report_data.cc drawnCost counts these), `times` as
// [alloc_time_us, free_time_us] per record when the file has times; the rest band per bucket.
json allocationsJson(const analysis::AllocationView& v, bool times) {
  json rec = json::array(), tm = json::array();
  for (const auto& a : v.drawn) {
    rec.push_back(a.alloc_event);
    rec.push_back(a.free_event);
    rec.push_back(a.bytes);
    rec.push_back(a.stack);
    rec.push_back(static_cast<int>(a.category));
    if (times) {
      tm.push_back(a.alloc_time_us);
      tm.push_back(a.free_time_us);
    }
  }
  json first = json::array(), first_t = json::array(), at = json::array(), total = json::array(),
       rest = json::array(), split = json::array(), stacks = json::array(),
       stacks_all = json::array();
  for (const auto& b : v.buckets) {
    first.push_back(b.first_event);
    if (times) first_t.push_back(b.first_time_us);
    at.push_back(b.at_event);
    total.push_back(b.total_bytes);
    rest.push_back(b.rest_bytes);
    for (uint64_t x : b.split) split.push_back(x);
    json st = json::array();
    for (const auto& r : b.stacks) {
      st.push_back(r.stack);
      st.push_back(r.bytes);
      st.push_back(r.allocations);
      st.push_back(r.exact ? 1 : 0);
    }
    stacks.push_back(std::move(st));
    stacks_all.push_back(b.stacks_all ? 1 : 0);
  }
  return {{"drawn", rec},
          {"times", times ? tm : json(nullptr)},
          {"allocations", v.allocations},
          {"before_trace", v.before_trace},
          {"smallest_drawn", v.smallest_drawn},
          {"capped", v.capped},
          {"budget_bytes", v.budget_bytes},
          {"split_cut", v.split_cut},
          {"buckets",
           {{"first_event", first},
            {"first_time_us", times ? first_t : json(nullptr)},
            {"at_event", at},
            {"total", total},
            {"rest", rest},
            // kCategoryCount + 1 per bucket (report_data.h AllocationBucket::split)
            {"split", split},
            // per bucket [stack, bytes, allocations, exact, ...], largest first
            {"stacks", stacks},
            {"stacks_all", stacks_all}}}};
}

// Blocks of [lo, hi) as the page's stepping records (stepping_view.h): [lo, hi - lo, records...]
// with addresses implicit (each record starts where the previous one ended): a gap [64, bytes]
// where nothing is mapped, a free block [code, size, segment], any other [code, size, segment,
// requested, stack, alloc_event]. [] for an event that changed nothing.
json stepRecords(uint64_t lo, uint64_t hi, const std::vector<analysis::StepMapBlock>& blocks) {
  json a = json::array();
  if (lo >= hi) return a;
  a.push_back(lo);
  a.push_back(hi - lo);
  uint64_t at = lo;
  for (const auto& b : blocks) {
    if (b.address > at) {
      a.push_back(64);
      a.push_back(b.address - at);
    }
    a.push_back(b.code);
    a.push_back(b.size);
    a.push_back(b.segment);
    if ((b.code & 3) != 0) {
      a.push_back(b.requested);
      a.push_back(b.stack);
      a.push_back(b.alloc_event);
    }
    at = b.address + b.size;
  }
  return a;
}

json steppingJson(const analysis::SteppingView& v,
                  const std::function<size_t(const std::string&)>& pool, bool times) {
  if (v.empty()) return {{"unavailable", v.unavailable}};
  json segs = json::array();
  for (const auto& s : v.segments) {
    segs.push_back(s.address);
    segs.push_back(s.stream);
    segs.push_back(pool(s.pool));
    segs.push_back(s.expandable ? 1 : 0);
  }
  const uint64_t lo = v.base.empty() ? 0 : v.base.front().address;
  const uint64_t hi = v.base.empty() ? 0 : v.base.back().address + v.base.back().size;
  json patches = json::array(), events = json::array(), tm = json::array();
  for (const auto& p : v.patches) patches.push_back(stepRecords(p.lo, p.hi, p.blocks));
  for (const auto& e : v.events) {
    events.push_back(static_cast<int>(e.action));
    events.push_back(e.addr);
    events.push_back(e.size);
    events.push_back(e.stack);
    if (times) tm.push_back(e.time_us);
  }
  return {{"first", v.first_event},
          {"last", v.last_event},
          {"focus", v.focus_event},
          {"segments", segs},
          {"base", stepRecords(lo, hi, v.base)},
          {"patches", patches},
          {"events", events},
          {"times", times ? tm : json(nullptr)}};
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
    ooms.push_back(
        {{"event", o.event}, {"time_us", o.time_us}, {"request_bytes", o.request_bytes}});
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
    json kf = {{"event", k.event},
               {"time_us", k.time_us},
               {"labels", k.labels},
               {"at", countersJson(k.at)},
               {"blocks_before_merge", k.blocks_before_merge},
               {"segments", segs},
               {"blocks", blocks},
               {"icicle_source", icicleSourceName(k.icicle_source)},
               {"icicle", icicleJson(k.icicle)}};
    // The failed request against its pool: `blocks --json`'s oom object.
    if (k.oom) kf["oom"] = oomVerdictJson(*k.oom);
    kfs.push_back(std::move(kf));
  }
  j["keyframes"] = kfs;
  j["stepping"] = steppingJson(
      d.stepping,
      [&](const std::string& name) {
        auto [it, fresh] = pool_index.try_emplace(name, pool_index.size());
        if (fresh) pool_names.push_back(name);
        return it->second;
      },
      t.has_times);
  j["pool_names"] = pool_names;
  // Segments over time (segment_view.h): [first_event, last_event, address, bytes, stream, stack,
  // expandable] per band, [first_time_us, last_time_us] per band when the file has times.
  {
    const auto& st = d.segment_timeline;
    json lives = json::array(), tm = json::array();
    for (const auto& l : st.lives) {
      for (json v : {json(l.first_event), json(l.last_event), json(l.address), json(l.bytes),
                     json(l.stream), json(l.stack), json(l.expandable ? 1 : 0)})
        lives.push_back(std::move(v));
      if (t.has_times) {
        tm.push_back(l.first_time_us);
        tm.push_back(l.last_time_us);
      }
    }
    j["segment_timeline"] = {{"lives", lives},
                             {"times", t.has_times ? tm : json(nullptr)},
                             {"agrees", st.agrees},
                             {"first_disagreement", st.first_disagreement},
                             {"left_out", st.left_out}};
  }
  j["layout_exact"] = d.layout_exact;
  j["model"] = {{"allocs", d.model.allocs},
                {"alloc_matches", d.model.alloc_matches},
                {"segment_events", d.model.segment_events},
                {"segment_matches", d.model.segment_matches},
                {"final_compared", d.final_compared},
                {"final_equal", d.final_equal},
                {"estimate_reason", d.estimate_reason}};
  j["streams_omitted"] = d.streams_omitted;
  j["pools_omitted"] = d.pools_omitted;
  j["icicle_event"] = d.icicle_event;
  j["icicle"] = icicleJson(d.icicle);
  j["has_segment_info"] = d.has_segment_info;
  j["capacity_bytes"] = d.capacity_bytes;
  j["capacity_basis"] = d.capacity_basis;
  j["allocations"] = allocationsJson(d.allocations, t.has_times);
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
    } else if (c == '\xe2' && i + 2 < s.size() && s[i + 1] == '\x80' &&
               (s[i + 2] == '\xa8' || s[i + 2] == '\xa9')) {
      out += s[i + 2] == '\xa8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

// ---- Bounds of the page (render_html.h) --------------------------------------------------------

struct PageLimits {
  size_t string_bytes = kPageStringBytes;
  size_t frames_per_list = kPageFramesPerList;
  size_t max_list = SIZE_MAX;  // every list of the analysis document (levels 2 and up)
};

struct Cuts {
  size_t strings = 0;
  size_t frame_lists = 0;
  uint64_t frames_omitted = 0;
  size_t lists = 0;
  size_t big_numbers = 0;
  size_t devices_left_out = 0;  // analyses past kPageAnalysisDevices
};

// Indices of the devices of `a` whose analysis the page carries, in file order: every one when
// there are at most `cap`; else the focus device and the drawn ones (at most
// ReportDataOptions::max_detail_devices + 1, even past a smaller cap), then the headline's in its
// order, then the first others, until there are `cap`.
std::vector<size_t> pageDevices(const analysis::AnalysisResult& a, const analysis::ReportData& data,
                                size_t cap) {
  const size_t n = a.devices.size();
  std::vector<size_t> out;
  if (n <= cap) {
    out.resize(n);
    for (size_t i = 0; i < n; ++i) out[i] = i;
    return out;
  }
  std::unordered_map<int64_t, size_t> index;  // device -> index in a.devices
  index.reserve(n);
  for (size_t i = 0; i < n; ++i) index.emplace(a.devices[i].summary.device, i);
  std::vector<bool> keep(n, false);
  size_t kept = 0;
  auto take = [&](int64_t device) {
    auto it = index.find(device);
    if (it == index.end() || keep[it->second]) return;
    keep[it->second] = true;
    ++kept;
  };
  const analysis::Headline h = analysis::buildHeadline(a);
  take(h.focus_device);
  for (const auto& d : data.devices) take(d.device);
  for (const auto& it : h.items) {
    if (kept >= cap) break;
    take(it.device);
  }
  for (size_t i = 0; i < n && kept < cap; ++i) take(a.devices[i].summary.device);
  for (size_t i = 0; i < n; ++i)
    if (keep[i]) out.push_back(i);
  return out;
}

constexpr uint64_t kSafeInteger = uint64_t{1} << 53;  // JavaScript numbers are exact up to 2^53

void cutString(std::string& s, size_t max, Cuts& c) {
  if (s.size() <= max) return;
  size_t keep = max;
  while (keep > 0 && (static_cast<unsigned char>(s[keep]) & 0xC0) == 0x80)
    --keep;  // a UTF-8 boundary
  const size_t cut = s.size() - keep;
  s.resize(keep);
  s += "\xE2\x80\xA6 [+" + std::to_string(cut) + " bytes]";
  ++c.strings;
}

// Every string (values and object keys) cut to the limit.
void boundStrings(json& j, size_t max, Cuts& c) {
  if (j.is_string()) {
    cutString(j.get_ref<std::string&>(), max, c);
  } else if (j.is_array()) {
    for (auto& v : j) boundStrings(v, max, c);
  } else if (j.is_object()) {
    bool long_key = false;
    for (auto it = j.begin(); it != j.end(); ++it) {
      long_key |= it.key().size() > max;
      boundStrings(it.value(), max, c);
    }
    if (long_key) {
      json o = json::object();
      for (auto it = j.begin(); it != j.end(); ++it) {
        std::string k = it.key();
        cutString(k, max, c);
        o[k] = std::move(it.value());
      }
      j = std::move(o);
    }
  }
}

bool isFrameListKey(std::string_view k) {
  return k == "frames" || k == "where" || k == "hot_path";
}

// The entry standing for the frames left out of a list, shaped like the list's own entries.
json omittedEntry(const json& like, uint64_t n) {
  const std::string text = "\xE2\x80\xA6 " + std::to_string(n) + " frames omitted";
  json frame = {{"filename", ""}, {"name", text}, {"line", nullptr}};
  if (like.is_object() && like.contains("frame")) {
    json row = like;
    for (auto it = row.begin(); it != row.end(); ++it) {
      if (it.value().is_number()) it.value() = 0;
    }
    row["frame"] = frame;
    return row;
  }
  if (like.is_object()) return frame;
  return text;
}

// In the analysis document: lists of frames keep their innermost and outermost entries; byte
// counts above 2^53 become exact decimal strings; every list is cut to max_list entries.
void boundAnalysis(json& j, const PageLimits& lim, Cuts& c) {
  if (j.is_array()) {
    if (j.size() > lim.max_list) {
      j.erase(j.begin() + static_cast<std::ptrdiff_t>(lim.max_list), j.end());
      ++c.lists;
    }
    for (auto& v : j) boundAnalysis(v, lim, c);
    return;
  }
  if (!j.is_object()) return;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    json& v = it.value();
    // A list already cut (head, marker, tail) has frames_per_list + 1 entries.
    if (isFrameListKey(k) && v.is_array() && v.size() > lim.frames_per_list + 1 &&
        lim.frames_per_list >= 2) {
      const size_t head = lim.frames_per_list / 2, tail = lim.frames_per_list - head;
      const uint64_t omitted = v.size() - head - tail;
      json kept = json::array();
      for (size_t i = 0; i < head; ++i) kept.push_back(std::move(v[i]));
      kept.push_back(omittedEntry(kept.front(), omitted));
      for (size_t i = v.size() - tail; i < v.size(); ++i) kept.push_back(std::move(v[i]));
      v = std::move(kept);
      ++c.frame_lists;
      c.frames_omitted += omitted;
    }
    const bool bytes_key =
        k == "bytes" || (k.size() > 6 && k.compare(k.size() - 6, 6, "_bytes") == 0);
    if (bytes_key && v.is_number_integer()) {
      const bool big = v.is_number_unsigned()
                           ? v.get<uint64_t>() > kSafeInteger
                           : (v.get<int64_t>() > static_cast<int64_t>(kSafeInteger) ||
                              v.get<int64_t>() < -static_cast<int64_t>(kSafeInteger));
      if (big) {
        v = v.is_number_unsigned() ? std::to_string(v.get<uint64_t>())
                                   : std::to_string(v.get<int64_t>());
        ++c.big_numbers;
      }
      continue;
    }
    boundAnalysis(v, lim, c);
  }
}

std::vector<std::string> cutNotes(const Cuts& c, const PageLimits& lim) {
  std::vector<std::string> notes;
  if (c.strings > 0) {
    notes.push_back("page: " + std::to_string(c.strings) + " strings truncated to " +
                    std::to_string(lim.string_bytes) +
                    " bytes (marked \xE2\x80\xA6 [+N bytes]; `analyze --json` has them in full)");
  }
  if (c.frame_lists > 0) {
    notes.push_back("page: " + std::to_string(c.frame_lists) + " stacks show their " +
                    std::to_string(lim.frames_per_list / 2) + " innermost and " +
                    std::to_string(lim.frames_per_list - lim.frames_per_list / 2) +
                    " outermost frames (" + std::to_string(c.frames_omitted) +
                    " frames omitted in all)");
  }
  if (c.lists > 0) {
    notes.push_back("page: " + std::to_string(c.lists) +
                    " lists of the analysis cut to their first " + std::to_string(lim.max_list) +
                    " entries");
  }
  if (c.devices_left_out > 0) {
    notes.push_back("page: the analysis of " + std::to_string(c.devices_left_out) +
                    " devices left out (at most " + std::to_string(kPageAnalysisDevices) +
                    ": the drawn ones, the headline's, then the first; `analyze --json` has them "
                    "all)");
  }
  if (c.big_numbers > 0) {
    notes.push_back("page: " + std::to_string(c.big_numbers) +
                    " byte counts above 2^53 are carried as exact text (the drawings round them)");
  }
  return notes;
}

std::string dataJson(const analysis::AnalysisResult& analysis, const analysis::ReportData& data,
                     const PageLimits& lim, const std::vector<std::string>& level_notes,
                     std::vector<std::string>* notes_out = nullptr) {
  Cuts cuts;
  json doc;
  doc["format"] = "memforensics-report";
  doc["version"] = 1;
  // The call graph's hot path is as deep as the deepest stack: it is cut here, before it becomes
  // JSON (1,000,000 frames as JSON objects took 600 MB); the other frame lists are cut below.
  const analysis::AnalysisResult* src = &analysis;
  analysis::AnalysisResult trimmed;
  const size_t fpl = std::max<size_t>(2, lim.frames_per_list);
  if (std::any_of(analysis.devices.begin(), analysis.devices.end(),
                  [&](const auto& d) { return d.frames_at_peak.hot_path.size() > fpl; })) {
    trimmed = analysis;
    for (auto& d : trimmed.devices) {
      auto& hp = d.frames_at_peak.hot_path;
      if (hp.size() <= fpl) continue;
      const size_t head = fpl / 2, tail = fpl - head;
      const uint64_t omitted = hp.size() - head - tail;
      analysis::FrameBytes marker;
      marker.frame.name = "\xE2\x80\xA6 " + std::to_string(omitted) + " frames omitted";
      marker.frame.line = format::kUnknownLine;
      std::vector<analysis::FrameBytes> kept(
          std::make_move_iterator(hp.begin()),
          std::make_move_iterator(hp.begin() + static_cast<std::ptrdiff_t>(head)));
      kept.push_back(std::move(marker));
      kept.insert(kept.end(), std::make_move_iterator(hp.end() - static_cast<std::ptrdiff_t>(tail)),
                  std::make_move_iterator(hp.end()));
      hp = std::move(kept);
      ++cuts.frame_lists;
      cuts.frames_omitted += omitted;
    }
    src = &trimmed;
  }
  // The device the page opens on and the headline lines: the one "OOM first" rule
  // (analysis/findings/headline.h), not re-decided by the page.
  {
    const analysis::Headline h = analysis::buildHeadline(analysis);
    json items = json::array();
    for (const auto& it : h.items) {
      items.push_back({{"device", it.device},
                       {"kind", analysis::findingKindId(it.kind)},
                       {"severity", analysis::findingSeverityName(it.severity)},
                       {"title", it.title},
                       {"bytes", it.bytes},
                       {"where", framesJson(it.where)}});
    }
    doc["headline"] = {{"focus_device", h.focus_device},
                       {"focus_reason", h.focus_reason},
                       {"items", items},
                       {"other_warnings", h.other_warnings}};
  }
  // The devices whose analysis the page carries: at most kPageAnalysisDevices (or the list bound
  // of levels 2 and up), the focus and drawn ones and the headline's first, then the file's order
  // (300,000 devices are 520 MB of JSON, 4 GB as a tree). A list past the list bound is counted
  // as boundAnalysis counts the lists it cuts.
  {
    const std::vector<size_t> keep =
        pageDevices(*src, data, std::min(kPageAnalysisDevices, lim.max_list));
    if (src->devices.size() > lim.max_list)
      ++cuts.lists;
    else if (keep.size() < src->devices.size())
      cuts.devices_left_out = src->devices.size() - keep.size();
    doc["analysis"] = analysisJson(*src, keep);
  }
  if (src == &trimmed) trimmed = {};
  boundAnalysis(doc["analysis"], lim, cuts);
  boundAnalysis(doc["headline"], lim, cuts);
  json frames = json::array();
  // An unknown line travels as null (the page then shows the file alone). A C++ frame carries a
  // fourth element, the short name its call-tree bar shows (the qualified function name, without
  // return type and arguments; "backward: " first for the autograd engine's frames); the
  // read-out keeps the whole signature.
  for (const auto& f : data.frames) {
    json row = {f.filename, f.name, f.line == format::kUnknownLine ? json(nullptr) : json(f.line)};
    if (!analysis::isPythonFile(f.filename)) {
      const std::string_view q = analysis::qualifiedFunctionName(f.name);
      const bool backward =
          analysis::classifyFrame(f.filename, f.name) == analysis::FrameKind::Autograd;
      if (!q.empty() && (backward || q.size() != f.name.size()))
        row.push_back((backward ? "backward: " : "") + std::string(q));
    }
    frames.push_back(std::move(row));
  }
  doc["frames"] = frames;
  doc["stacks"] = data.stacks;
  doc["caps"] = data.caps;
  for (auto& c : analysis::drawnCaps(data)) doc["caps"].push_back(std::move(c));
  doc["categories"] = json::array();
  for (size_t c = 0; c < analysis::kCategoryCount; ++c) {
    doc["categories"].push_back(analysis::categoryName(static_cast<analysis::Category>(c)));
  }
  doc["actions"] = json::array();  // event stepping's action codes (format::Action)
  for (int a = 0; a < format::kActionCount; ++a) {
    doc["actions"].push_back(format::actionName(static_cast<format::Action>(a)));
  }
  json devs = json::array();
  for (const auto& d : data.devices) devs.push_back(deviceJson(d));
  doc["devices"] = devs;
  doc["whatif"] = whatIfPanelJson(data.whatif);  // viz/whatif.js
  if (data.baseline_diff) doc["baseline_diff"] = diffJson(*data.baseline_diff);
  boundStrings(doc, lim.string_bytes, cuts);
  std::vector<std::string> notes = cutNotes(cuts, lim);
  notes.insert(notes.end(), level_notes.begin(), level_notes.end());
  for (const auto& n : notes) doc["caps"].push_back(n);
  if (notes_out) *notes_out = std::move(notes);
  return escapeForScript(doc.dump(-1, ' ', false, json::error_handler_t::replace));
}

void renderPage(const analysis::AnalysisResult& analysis, const analysis::ReportData& data,
                const PageLimits& lim, const std::vector<std::string>& level_notes,
                std::ostream& out, std::vector<std::string>* notes_out = nullptr);

}  // namespace

std::string htmlDataJson(const analysis::AnalysisResult& analysis,
                         const analysis::ReportData& data) {
  return dataJson(analysis, data, PageLimits{}, {});
}

void renderHtml(const analysis::AnalysisResult& analysis, const analysis::ReportData& data,
                std::ostream& out) {
  renderPage(analysis, data, PageLimits{}, {}, out);
}

std::string renderHtmlWithin(const analysis::AnalysisResult& analysis,
                             const analysis::ReportData& data, size_t max_bytes,
                             std::vector<std::string>* notes_out) {
  std::vector<std::string> sink;
  std::vector<std::string>& out_notes = notes_out ? *notes_out : sink;
  auto render = [&](const analysis::ReportData& d, const PageLimits& lim,
                    const std::vector<std::string>& level) {
    std::ostringstream o;
    out_notes.clear();
    renderPage(analysis, d, lim, level, o, &out_notes);
    return std::move(o).str();
  };
  std::string page = render(data, PageLimits{}, {});
  if (page.size() <= max_bytes) return page;
  const std::string why = " to keep the page under " + std::to_string(max_bytes) + " bytes";
  analysis::ReportData cut = data;
  PageLimits lim;
  std::vector<std::string> notes;
  // Event stepping gives way first: its windows narrow (around their moments) by what the page is
  // over, before anything the page drew already is halved.
  std::string stepping_note;
  {
    size_t stepping = 0;
    for (const auto& d : cut.devices) {
      if (!d.stepping.empty()) stepping += analysis::steppingCost(d.stepping);
    }
    // Only where narrowing it alone can bring the page under the bound: otherwise the halving
    // below narrows it with everything else.
    const size_t excess = page.size() - max_bytes + max_bytes / 50;
    if (stepping > excess) {
      const double keep = 1.0 - static_cast<double>(excess) / static_cast<double>(stepping);
      size_t dropped = 0;
      for (auto& d : cut.devices) {
        if (d.stepping.empty()) continue;
        const auto target =
            static_cast<size_t>(static_cast<double>(analysis::steppingCost(d.stepping)) * keep);
        dropped += analysis::trimSteppingView(d.stepping, target);
        if (analysis::steppingCost(d.stepping) > target) {
          dropped += d.stepping.events.size();
          analysis::dropSteppingView(d.stepping, target);
        }
      }
      stepping_note =
          std::to_string(dropped) + " events of the event-stepping windows left out" + why;
      notes = {stepping_note};
      page = render(cut, lim, notes);
      if (page.size() <= max_bytes) return page;
    }
  }
  analysis::HalvingCuts halved;
  for (size_t times = 1; times <= kPageHalvings; ++times) {
    halved += analysis::halveReportData(cut);
    notes = {analysis::halvingNote(halved, times, max_bytes)};
    if (!stepping_note.empty()) notes.insert(notes.begin(), stepping_note);
    page = render(cut, lim, notes);
    if (page.size() <= max_bytes) return page;
  }
  for (int level = 1; level <= 4; ++level) {
    if (level == 1) {
      size_t keyframes = 0, phases = 0, nodes = 0, stepped = 0;
      for (auto& d : cut.devices) {
        if (!d.stepping.empty()) {
          stepped += d.stepping.events.size();
          d.stepping = analysis::SteppingView{};
          d.stepping.unavailable = "left out to keep the page under its size bound";
        }
        const size_t k0 = d.keyframes.size();
        std::erase_if(d.keyframes, [](const analysis::Keyframe& k) { return k.labels.empty(); });
        keyframes += k0 - d.keyframes.size();
        if (d.timeline.phases.size() > 100) {
          phases += d.timeline.phases.size() - 100;
          d.timeline.phases.resize(100);
        }
        if (d.icicle.size() > 500) {  // parents come before children: a prefix is a tree
          nodes += d.icicle.size() - 500;
          d.icicle.resize(500);
        }
      }
      notes.push_back("page still too large: " + std::to_string(keyframes) +
                      " evenly spaced keyframes, " + std::to_string(phases) +
                      " phases beyond the first 100 per device and " + std::to_string(nodes) +
                      " call-tree nodes beyond 500 per device dropped" +
                      (stepped ? ", and event stepping (" + std::to_string(stepped) + " events)"
                               : std::string()) +
                      why);
    } else if (level == 2) {
      lim.max_list = 100;
      lim.string_bytes = 128;
      notes.push_back(
          "page still too large: analysis lists cut to 100 entries and strings to 128 bytes" + why);
    } else if (level == 3) {
      for (const auto& d : cut.devices) cut.summary_only.push_back(d.device);
      cut.devices.clear();
      cut.frames.clear();
      cut.stacks.clear();
      lim.max_list = 10;
      notes.push_back(
          "page still too large: no device is drawn (summary and findings only), analysis lists "
          "cut to 10 entries" +
          why);
    } else {
      lim.max_list = 1;
      lim.string_bytes = 32;
      notes.push_back(
          "page still too large: analysis lists cut to 1 entry and strings to 32 bytes" + why);
    }
    page = render(cut, lim, notes);
    if (page.size() <= max_bytes) return page;
  }
  return page;  // not reached for any input the analysis can describe (see render_html.h)
}

namespace {

void renderPage(const analysis::AnalysisResult& analysis, const analysis::ReportData& data,
                const PageLimits& lim, const std::vector<std::string>& level_notes,
                std::ostream& out, std::vector<std::string>* notes_out) {
  // The template's three placeholders are filled in the order they appear; the data is never
  // searched for placeholders.
  // A fresh nonce per report: only the page's own two scripts may run (Content-Security-Policy), so
  // even markup that slipped into the DOM could not execute an inline handler.
  std::string templ = viz::kTemplate;
  std::random_device rd;
  char nonce[33];
  std::snprintf(nonce, sizeof nonce, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  for (size_t at = templ.find("MEMF_NONCE"); at != std::string::npos;
       at = templ.find("MEMF_NONCE", at)) {
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
  std::sort(std::begin(parts), std::end(parts),
            [](const Part& a, const Part& b) { return a.at < b.at; });
  size_t pos = 0;
  for (const Part& p : parts) {
    if (p.at == std::string_view::npos) continue;
    out << page.substr(pos, p.at - pos);
    if (p.mark == "/*MEMF_STYLE*/") out << viz::kStyle;
    // The views report.js makes (window.memfParts) come first; whatif.js reads what report.js
    // exports (window.memfViz), so it comes after.
    if (p.mark == "/*MEMF_SCRIPT*/") {
      out << viz::kAllocationsScript << "\n"
          << viz::kBlockMapScript << "\n"
          << viz::kIcicleScript << "\n"
          << viz::kScript << "\n"
          << viz::kWhatIfScript;
    }
    if (p.mark == "\"MEMF_DATA\"") out << dataJson(analysis, data, lim, level_notes, notes_out);
    pos = p.at + p.mark.size();
  }
  out << page.substr(pos);
}

}  // namespace

}  // namespace memforensics::report
