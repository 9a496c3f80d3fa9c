// render_json.cc: the `--json` report (schema documented in docs/cli.md).
#include <nlohmann/json.hpp>
#include <sstream>

#include "analysis/findings/headline.h"
#include "report/json_analysis.h"
#include "report/render.h"

namespace memforensics::report {

using nlohmann::json;

json frameJson(const analysis::FrameText& f) {
  json j = {{"filename", f.filename}, {"name", f.name}};
  j["line"] = f.line == format::kUnknownLine ? json(nullptr) : json(f.line);
  return j;
}
json framesJson(const std::vector<analysis::FrameText>& fs) {
  json a = json::array();
  for (const auto& f : fs) a.push_back(frameJson(f));
  return a;
}

json optJson(int64_t v) {
  return v < 0 ? json(nullptr) : json(v);
}
void addPeakJson(json& j, const char* name, const replay::Peak& p) {
  std::string base = std::string("peak_") + name;
  j[base + "_bytes"] = p.bytes;
  j[base + "_event"] = optJson(p.event);
  j[base + "_time_us"] = optJson(p.time_us);
}

void addTrustJson(json& j, bool consistent, uint8_t untrusted, std::string_view cause) {
  j["consistent"] = consistent;
  json names = json::array();
  for (auto n : replay::untrustedNames(untrusted)) names.push_back(std::string(n));
  j["untrusted"] = std::move(names);
  if (!consistent) j["untrusted_cause"] = std::string(cause);
}

namespace {
// One finding as `analyze --json` writes it (the per-device `findings` and `job_findings`).
json findingJson(const analysis::Finding& f) {
  json ev = json::array();
  for (const auto& e : f.evidence) {
    ev.push_back({{"text", e.text},
                  {"event", optJson(e.event)},
                  {"time_us", optJson(e.time_us)},
                  {"bytes", e.bytes},
                  {"frames", framesJson(e.frames)}});
  }
  json j{{"kind", analysis::findingKindId(f.kind)},
         {"severity", analysis::findingSeverityName(f.severity)},
         {"title", f.title},
         {"bytes", f.bytes},
         {"where", framesJson(f.where)},
         {"fix", f.fix},
         {"basis", f.basis},
         {"evidence", ev}};
  // The OOM verdict's figures (analysis::OomNumbers; keys documented in docs/findings.md).
  if (f.oom) {
    const analysis::OomNumbers& o = *f.oom;
    j["oom"] = {{"request_bytes", o.request_bytes},
                {"short_by_bytes", o.short_by_bytes},
                {"fragmentation", o.fragmentation},
                {"live_bytes", o.live_bytes},
                {"capacity_bytes", o.capacity_bytes},
                {"reserved_bytes", o.reserved_bytes},
                {"device_free_bytes", o.device_free_bytes},
                {"cache_free_bytes", o.cache_free_bytes},
                {"flushed_bytes", o.flushed_bytes},
                {"exact", o.exact},
                {"fills_card", o.fills_card},
                {"smallest_capacity_bytes", o.smallest_capacity_bytes},
                {"smallest_changes", o.smallest_changes}};
  }
  return j;
}
}  // namespace

nlohmann::json countersJson(const replay::Counters& c) {
  return {{"reserved_bytes", c.reserved},
          {"requested_bytes", c.requested},
          {"allocated_bytes", c.allocated},
          {"pending_free_bytes", c.pending},
          {"active_bytes", c.active()}};
}

nlohmann::json oomVerdictJson(const analysis::OomVerdict& v) {
  return {{"event", v.event},
          {"request_bytes", v.request_bytes},
          {"device_free", v.device_free},
          {"stream", v.stream},
          {"pool", v.pool},
          {"pool_free_bytes", v.pool_free},
          {"pool_largest_free_bytes", v.pool_largest},
          {"fits_total", v.fits_total},
          {"fits_block", v.fits_block},
          {"fragmentation", v.fragmentation},
          {"short_by_bytes", v.short_by},
          {"needed_bytes", v.need.needed_bytes}};
}

namespace {

// One device of `analyze --json`.
json deviceJson(const analysis::DeviceAnalysis& d) {
  const auto& s = d.summary;
  json j;
  j["device"] = s.device;
  j["events"] = s.events;
  json by = json::object();
  for (size_t a = 0; a < s.by_action.size(); ++a) {
    if (s.by_action[a] > 0)
      by[std::string(format::actionName(static_cast<format::Action>(a)))] = s.by_action[a];
  }
  j["events_by_action"] = by;
  j["first_time_us"] = optJson(s.first_time_us);
  j["last_time_us"] = optJson(s.last_time_us);
  j["segments"] = d.segments;
  addPeakJson(j, "reserved", s.peak_reserved);
  addPeakJson(j, "requested", s.peak_requested);
  addPeakJson(j, "allocated", s.peak_allocated);
  addPeakJson(j, "active", s.peak_active);
  j["allocated_exact"] = s.allocated_exact;
  addTrustJson(j, s.consistent, s.untrusted, s.untrusted_cause);
  j["start_reserved_bytes"] = s.start.reserved;
  j["start_requested_bytes"] = s.start.requested;
  j["final_reserved_bytes"] = s.final_replayed.reserved;
  j["final_requested_bytes"] = s.final_replayed.requested;
  j["final_allocated_bytes"] = s.final_replayed.allocated;
  j["final_active_bytes"] = s.final_replayed.active();
  j["start"] = countersJson(s.start);
  j["final"] = countersJson(s.final_replayed);
  j["final_in_file"] = countersJson(s.final_file);
  j["live_blocks_at_start"] = s.live_at_start;
  j["blocks_freed_before_trace_start"] = s.freed_before_start;
  j["oom_count"] = s.ooms.size();
  j["ooms_omitted"] = s.ooms.size() - d.ooms.size();  // past analysis::kOomsListed
  json ooms = json::array();
  for (const auto& o : d.ooms) {
    ooms.push_back({{"event", o.oom.event},
                    {"time_us", optJson(o.oom.time_us)},
                    {"request_bytes", o.oom.request_bytes},
                    {"device_free_bytes", o.oom.device_free},
                    {"stream", o.oom.stream},
                    {"state", countersJson(o.oom.at)},
                    {"frames", framesJson(o.frames)}});
  }
  j["ooms"] = ooms;
  j["live_blocks_at_requested_peak"] = d.live_at_peak;
  json top = json::array();
  for (const auto& g : d.top_at_peak) {
    top.push_back({{"requested_bytes", g.requested_bytes},
                   {"block_bytes", g.block_bytes},
                   {"count", g.count},
                   {"has_stack", g.has_stack},
                   {"frames", framesJson(g.frames)}});
  }
  j["top_allocations_at_requested_peak"] = top;
  json an = json::array();
  for (const auto& a : d.anomalies) {
    an.push_back({{"id", a.id},
                  {"severity", std::string(replay::severityName(a.severity))},
                  {"count", a.count},
                  {"first_event", optJson(a.first_event)},
                  {"description", a.description}});
  }
  j["anomalies"] = an;
  json fs = json::array();
  for (const auto& f : d.findings) fs.push_back(findingJson(f));
  j["findings"] = fs;
  if (d.has_frames) {
    auto rows = [](const std::vector<analysis::FrameBytes>& v) {
      json a = json::array();
      for (const auto& r : v) {
        a.push_back({{"frame", frameJson(r.frame)},
                     {"self_bytes", r.self_bytes},
                     {"inclusive_bytes", r.inclusive_bytes},
                     {"blocks", r.blocks}});
      }
      return a;
    };
    const auto& g = d.frames_at_peak;
    j["top_frames_at_requested_peak"] = {{"total_bytes", g.total_bytes},
                                         {"unattributed_bytes", g.unattributed_bytes},
                                         {"frames", g.vertices},
                                         {"calls", g.edges},
                                         {"by_inclusive_bytes", rows(g.top_inclusive)},
                                         {"by_self_bytes", rows(g.top_self)},
                                         {"hot_path", rows(g.hot_path)}};
  }
  return j;
}

json inputJson(const analysis::AnalysisResult& r) {
  return {{"format", r.source_format},
          {"pickle_protocol", r.pickle_protocol == 0 ? json(nullptr) : json(r.pickle_protocol)},
          {"bytes", r.input_bytes},
          {"pytorch_era", r.era},
          {"strings", r.strings},
          {"frames", r.frames},
          {"stacks", r.stacks},
          {"annotations", r.annotations},
          {"host_trace_events", r.host_trace_events},
          {"ignored_keys", r.ignored_keys},
          {"origin", r.origin.empty() ? json(nullptr) : json(r.origin)},
          {"warnings", r.warnings}};
}

json jobFindingsJson(const analysis::AnalysisResult& r) {
  json jobs = json::array();
  for (const auto& f : r.job_findings) {
    json jf = findingJson(f);
    jf["device"] = optJson(f.device);
    jobs.push_back(std::move(jf));
  }
  return jobs;
}

json headlineJson(const analysis::AnalysisResult& r) {
  // The first screen (analysis/findings/headline.h): the focus device and one item per OOM, high
  // finding or history that cannot explain the file.
  const analysis::Headline h = analysis::buildHeadline(r);
  json items = json::array();
  for (const auto& it : h.items) {
    items.push_back({{"device", optJson(it.device)},
                     {"kind", analysis::findingKindId(it.kind)},
                     {"severity", analysis::findingSeverityName(it.severity)},
                     {"title", it.title},
                     {"bytes", it.bytes},
                     {"where", framesJson(it.where)}});
  }
  return {{"focus_device", optJson(h.focus_device)},
          {"focus_reason", h.focus_reason},
          {"items", std::move(items)},
          {"other_warnings", h.other_warnings}};
}

}  // namespace

namespace {

// Everything of the document but its devices.
json analysisJsonWithoutDevices(const analysis::AnalysisResult& r) {
  json doc;
  doc["schema_version"] = kJsonSchemaVersion;
  doc["tool"] = "memforensics";
  doc["path"] = r.path;
  doc["input"] = inputJson(r);
  doc["empty_devices"] = r.empty_devices;
  doc["job_findings"] = jobFindingsJson(r);
  doc["headline"] = headlineJson(r);
  return doc;
}

std::string dumpJson(const json& j) {
  // Snapshot strings are not guaranteed to be UTF-8: replace bad bytes rather than fail.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

nlohmann::json analysisJson(const analysis::AnalysisResult& r) {
  json doc = analysisJsonWithoutDevices(r);
  json devices = json::array();
  for (const auto& d : r.devices) devices.push_back(deviceJson(d));
  doc["devices"] = std::move(devices);
  return doc;
}

nlohmann::json analysisJson(const analysis::AnalysisResult& r, std::span<const size_t> devices_in) {
  json doc = analysisJsonWithoutDevices(r);
  json devices = json::array();
  for (size_t i : devices_in) devices.push_back(deviceJson(r.devices.at(i)));
  doc["devices"] = std::move(devices);
  return doc;
}

std::string renderJsonString(const analysis::AnalysisResult& r) {
  std::ostringstream out;
  renderJson(r, out);
  std::string s = out.str();
  s.pop_back();  // the newline
  return s;
}

void renderJson(const analysis::AnalysisResult& r, std::ostream& out) {
  // The same bytes as analysisJson(r).dump(), one device at a time: a document of many devices
  // (65,536 devices: 85 MB of JSON) is never held as a tree (8-10x its text). The tree's keys are
  // sorted and "devices" is the first of them.
  const std::string rest = dumpJson(analysisJsonWithoutDevices(r));
  out << "{\"devices\":[";
  for (size_t i = 0; i < r.devices.size(); ++i) {
    if (i > 0) out << ',';
    out << dumpJson(deviceJson(r.devices[i]));
  }
  out << "]," << std::string_view(rest).substr(1) << "\n";
}

}  // namespace memforensics::report
