// render_timeline.cc: the `timeline` command's output (schema in docs/cli.md).
#include "report/render_timeline.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/format_bytes.h"
#include "common/text_escape.h"
#include "report/json_analysis.h"
#include "report/render.h"
#include "report/text_layout.h"

namespace memforensics::report {

namespace {
using nlohmann::json;

json pointsJson(const std::vector<analysis::TimelinePoint>& pts) {
  json a = json::array();
  for (const auto& p : pts) {
    a.push_back(json::array({p.event, optJson(p.time_us), p.at.reserved, p.at.allocated,
                             p.at.requested, p.at.pending}));
  }
  return a;
}

json breakdownJson(const analysis::TimelineBreakdown& b, bool stream) {
  json j;
  if (stream) {
    j["stream"] = b.stream;
  } else {
    j["pool"] = json::array({b.pool.first, b.pool.second});
  }
  addPeakJson(j, "reserved", b.peak_reserved);
  addPeakJson(j, "requested", b.peak_requested);
  addPeakJson(j, "allocated", b.peak_allocated);
  addPeakJson(j, "pending_free", b.peak_pending);
  j["points"] = pointsJson(b.points);
  return j;
}

// Ten levels, lowest first; the scale is 0 .. the device's peak requested bytes.
std::string sparkline(const std::vector<uint64_t>& cols, uint64_t top) {
  static constexpr char kLevels[] = " .:-=+*#%@";
  std::string s;
  for (uint64_t v : cols) {
    size_t k =
        top == 0 ? 0 : static_cast<size_t>((static_cast<long double>(v) * 9 + top - 1) / top);
    s += kLevels[std::min<size_t>(k, 9)];
  }
  return s;
}

std::string eventText(int64_t e) {
  return e < 0 ? std::string("start") : "#" + std::to_string(e);
}
}  // namespace

void renderTimelineText(const analysis::TimelineResult& r, std::ostream& out) {
  out << "memforensics timeline: " << escapeText(r.path) << "\n";
  for (const auto& d : r.devices) {
    out << "\ndevice " << d.device << ": " << d.events << " events";
    if (!d.has_times) out << " (no times in the file: event index only)";
    out << "\n";
    auto peakLine = [&](const char* name, const replay::Peak& p) {
      out << "  peak " << name << ": " << formatBytes(p.bytes)
          << (p.event < 0 ? std::string(" at the start of the trace")
                          : " after event " + eventText(p.event));
      if (p.time_us >= 0) out << " at " << formatTimeUs(p.time_us);
      out << "\n";
    };
    peakLine("reserved ", d.peak_reserved);
    peakLine("allocated", d.peak_allocated);
    peakLine("requested", d.peak_requested);
    out << "  peak pending-free: " << formatBytes(d.peak_pending_bytes) << "\n";
    for (size_t k = 0; k < d.ooms.size() && k < kTextOoms; ++k) {
      out << "  OOM at event #" << d.ooms[k].event << ": request "
          << formatBytes(d.ooms[k].request_bytes) << "\n";
    }
    if (d.ooms.size() > kTextOoms)
      out << "  ... and " << d.ooms.size() - kTextOoms
          << " more OOMs (timeline --json lists them)\n";
    if (d.downsampled) {
      out << "  series downsampled: " << d.points.size() << " of " << d.total_points
          << " points kept (buckets of " << d.bucket_size
          << ": min/max requested and max reserved/allocated/pending-free per bucket; peaks and "
             "OOMs exact)\n";
    }
    if (!d.streams.empty())
      out << "  streams: " << d.streams.size() << " (see --json / --csv for their series)\n";
    if (!d.pools.empty()) out << "  pools: " << d.pools.size() << "\n";
    if (d.streams_omitted > 0 || d.pools_omitted > 0) {
      out << "  not broken down: " << d.streams_omitted << " stream(s) and " << d.pools_omitted
          << " pool(s) beyond the " << analysis::kMaxBreakdowns
          << " with the highest reserved peaks\n";
    }
    if (!d.requested_columns.empty()) {
      out << "  requested |" << sparkline(d.requested_columns, d.peak_requested.bytes) << "| 0 .. "
          << formatBytesShort(d.peak_requested.bytes) << "\n";
    }
    if (d.phases.empty()) {
      out << "  phases: none (no annotations, and no repeating allocation pattern found)\n";
      continue;
    }
    out << "  phases:\n";
    char line[512];
    std::snprintf(line, sizeof line, "    %-10s %-10s %-36s %17s %14s %14s\n", "kind", "source",
                  "name", "events", "peak requested", "peak reserved");
    out << line;
    for (const auto& p : d.phases) {
      // Annotation names come from the file: escaped, then cut without splitting an escape or a
      // UTF-8 character.
      std::string name = escapeText(p.phase.name);
      if (name.size() > 36) name = name.substr(0, escapedPrefixLength(name, 33)) + "...";
      std::string range =
          p.phase.last_event < p.phase.first_event
              ? std::string("(empty)")
              : std::to_string(p.phase.first_event) + ".." + std::to_string(p.phase.last_event);
      if (p.phase.open) range += "*";
      bool empty = p.peak_requested.event < 0;
      std::snprintf(line, sizeof line, "    %-10s %-10s %-36s %17s %14s %14s\n",
                    std::string(analysis::phaseKindName(p.phase.kind)).c_str(),
                    p.phase.source == analysis::PhaseSource::Annotation ? "annotation" : "detected",
                    name.c_str(), range.c_str(),
                    empty ? "-" : formatBytesShort(p.peak_requested.bytes).c_str(),
                    empty ? "-" : formatBytesShort(p.peak_reserved.bytes).c_str());
      out << line;
    }
    if (std::any_of(d.phases.begin(), d.phases.end(), [](const auto& p) { return p.phase.open; })) {
      out << "    * START or END not in the file: the range runs to the edge of the trace\n";
    }
  }
}

// Every column is a number (or empty): nothing from the file needs CSV quoting.
void renderTimelineCsv(const analysis::TimelineResult& r, std::ostream& out, bool header) {
  if (header) out << "device,event,time_us,reserved,allocated,requested,pending_free\n";
  for (const auto& d : r.devices) {
    for (const auto& p : d.points) {
      out << d.device << ',' << p.event << ',';
      if (p.time_us >= 0) out << p.time_us;
      out << ',' << p.at.reserved << ',' << p.at.allocated << ',' << p.at.requested << ','
          << p.at.pending << '\n';
    }
  }
}

void renderTimelineJson(const analysis::TimelineResult& r, std::ostream& out) {
  json doc;
  doc["schema_version"] = kJsonSchemaVersion;
  doc["tool"] = "memforensics";
  doc["command"] = "timeline";
  doc["path"] = r.path;
  doc["point_columns"] = {"event", "time_us", "reserved", "allocated", "requested", "pending_free"};
  // The document is written with its devices as an empty array, each device's object dumped on
  // its own into that place: the same bytes as one dump of the whole document (compact dumps
  // concatenate), without holding every device's points as JSON nodes at once.
  doc["devices"] = json::array();
  const std::string head = doc.dump(-1, ' ', false, json::error_handler_t::replace);
  // The keys are sorted: "devices" follows "command" (a fixed string), before the path, so its
  // first occurrence is the key (a quote inside the path would be escaped anyway).
  const std::string_view kEmptyDevices = "\"devices\":[]";
  const size_t at = head.find(kEmptyDevices);
  const size_t split = at == std::string::npos ? head.size() : at + kEmptyDevices.size() - 1;
  out << std::string_view(head).substr(0, split);
  bool first = true;
  for (const auto& d : r.devices) {
    json j;
    j["device"] = d.device;
    j["events"] = d.events;
    j["has_times"] = d.has_times;
    j["total_points"] = d.total_points;
    j["downsampled"] = d.downsampled;
    j["bucket_size"] = d.bucket_size;
    j["kept_points"] = d.points.size();
    addPeakJson(j, "reserved", d.peak_reserved);
    addPeakJson(j, "requested", d.peak_requested);
    addPeakJson(j, "allocated", d.peak_allocated);
    addPeakJson(j, "active", d.peak_active);
    j["peak_pending_free_bytes"] = d.peak_pending_bytes;
    json ooms = json::array();
    for (const auto& o : d.ooms) {
      ooms.push_back({{"event", o.event},
                      {"time_us", optJson(o.time_us)},
                      {"request_bytes", o.request_bytes},
                      {"device_free_bytes", o.device_free}});
    }
    j["ooms"] = ooms;
    j["points"] = pointsJson(d.points);
    json streams = json::array(), pools = json::array();
    for (const auto& b : d.streams) streams.push_back(breakdownJson(b, true));
    for (const auto& b : d.pools) pools.push_back(breakdownJson(b, false));
    j["streams"] = streams;
    j["pools"] = pools;
    j["streams_omitted"] = d.streams_omitted;  // beyond max_breakdowns: no series of their own
    j["pools_omitted"] = d.pools_omitted;
    json phases = json::array();
    for (const auto& p : d.phases) {
      json ph = {{"kind", std::string(analysis::phaseKindName(p.phase.kind))},
                 {"source",
                  p.phase.source == analysis::PhaseSource::Annotation ? "annotation" : "detected"},
                 {"name", p.phase.name},
                 {"iteration", optJson(p.phase.iteration)},
                 {"first_event", p.phase.first_event},
                 {"last_event", p.phase.last_event},
                 {"start_us", optJson(p.phase.start_us)},
                 {"end_us", optJson(p.phase.end_us)},
                 {"open", p.phase.open}};
      bool empty = p.peak_requested.event < 0;
      ph["peak_requested_bytes"] = empty ? json(nullptr) : json(p.peak_requested.bytes);
      ph["peak_requested_event"] = optJson(p.peak_requested.event);
      ph["peak_reserved_bytes"] = empty ? json(nullptr) : json(p.peak_reserved.bytes);
      ph["peak_reserved_event"] = optJson(p.peak_reserved.event);
      phases.push_back(std::move(ph));
    }
    j["phases"] = phases;
    j["requested_sparkline_bytes"] = d.requested_columns;
    if (!first) out << ',';
    first = false;
    out << j.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  out << std::string_view(head).substr(split) << "\n";
}

}  // namespace memforensics::report
