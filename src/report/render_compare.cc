// render_compare.cc: see render_compare.h.
#include "report/render_compare.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/format_bytes.h"
#include "common/text_escape.h"
#include "format/trace/trace_format.h"
#include "report/json_analysis.h"
#include "report/render.h"

namespace memforensics::report {

namespace {

using analysis::kCategoryCount;
using analysis::kPeakKinds;
using analysis::PeakKind;
using nlohmann::json;

// `s` then spaces to `w` columns, and at least one space: a value wider than its column (a
// hostile shard's 2^64 - 1 OOMs) does not run into the next.
std::string pad(std::string s, size_t w) {
  s.append(s.size() < w ? w - s.size() : 1, ' ');
  return s;
}

std::string percent(uint64_t base, uint64_t neu) {
  if (base == 0) return neu == 0 ? "" : " (new)";
  char buf[48];
  std::snprintf(
      buf, sizeof buf, " (%+.1f %%)",
      100.0 * (static_cast<double>(neu) - static_cast<double>(base)) / static_cast<double>(base));
  return buf;
}

std::string deltaText(uint64_t base, uint64_t neu) {
  const int64_t d = analysis::signedDelta(base, neu);
  return (d == 0 ? std::string("0 B") : formatBytesSigned(d)) + percent(base, neu);
}

void figureRow(std::ostream& out, const std::string& label, uint64_t base, uint64_t neu) {
  out << "  " << pad(label, 18) << pad(formatBytesShort(base), 14) << pad(formatBytesShort(neu), 14)
      << deltaText(base, neu) << "\n";
}

std::string esc(const std::string& s) {
  return escapeText(s);
}

std::string stackText(const analysis::StackDelta& s) {
  const auto& frames = s.new_frames.empty() ? s.base_frames : s.new_frames;
  std::string t = esc(analysis::framesLine(frames, s.has_stack));
  if (s.match == analysis::StackMatch::FunctionOnly) {
    t += "  [matched by file and function only, lines moved; base: " +
         esc(analysis::framesLine(s.base_frames, s.has_stack)) + "]";
  } else if (s.match == analysis::StackMatch::FileNameOnly) {
    t += "  [matched by file name and function only, directories differ; base: " +
         esc(analysis::framesLine(s.base_frames, s.has_stack)) + "]";
  }
  return t;
}

void stackList(std::ostream& out, const char* title, const std::vector<analysis::StackDelta>& v,
               size_t total) {
  if (v.empty()) return;
  out << "    " << title;
  if (total > v.size()) out << " (" << v.size() << " of " << total << ")";
  out << ":\n";
  for (const auto& s : v) {
    out << "      " << pad(s.delta == 0 ? "0 B" : formatBytesSigned(s.delta), 14)
        << pad(formatBytesShort(s.base_bytes) + " -> " + formatBytesShort(s.new_bytes), 26)
        << stackText(s) << "\n";
  }
}

void findingList(std::ostream& out, const char* title, const std::vector<analysis::FindingRef>& v) {
  out << "  findings " << title << ": " << (v.empty() ? "none" : std::to_string(v.size())) << "\n";
  for (const auto& f : v) {
    out << "    " << analysis::findingKindId(f.kind) << " ("
        << analysis::findingSeverityName(f.severity) << ") " << esc(f.title);
    if (!f.where.empty()) out << "  at " << esc(f.where);
    out << "\n";
  }
}

void segmentList(std::ostream& out, const char* title, size_t count, uint64_t bytes,
                 const std::vector<analysis::SegmentRef>& v) {
  out << "    only in " << title << ": " << count << " (" << formatBytesShort(bytes) << ")\n";
  for (const auto& s : v) {
    char addr[32];
    std::snprintf(addr, sizeof addr, "0x%llx", static_cast<unsigned long long>(s.address));
    out << "      " << pad(addr, 18) << pad(formatBytesShort(s.size), 12) << "stream " << s.stream
        << ", " << (s.is_large ? "large" : "small") << (s.is_expandable ? ", expandable" : "")
        << "\n";
  }
  if (count > v.size()) out << "      ... " << (count - v.size()) << " more\n";
}

std::string peakWhen(const replay::Peak& p) {
  return p.event < 0 ? "start" : "event " + std::to_string(p.event);
}

json stackJson(const analysis::StackDelta& s) {
  json j = {{"match", analysis::stackMatchName(s.match)},
            {"has_stack", s.has_stack},
            {"frames", framesJson(s.new_frames.empty() ? s.base_frames : s.new_frames)},
            {"base_bytes", s.base_bytes},
            {"new_bytes", s.new_bytes},
            {"delta_bytes", s.delta}};
  if (s.match == analysis::StackMatch::FunctionOnly ||
      s.match == analysis::StackMatch::FileNameOnly) {
    j["base_frames"] = framesJson(s.base_frames);
  }
  return j;
}
json stacksJson(const std::vector<analysis::StackDelta>& v) {
  json a = json::array();
  for (const auto& s : v) a.push_back(stackJson(s));
  return a;
}
json findingJson(const analysis::FindingRef& f) {
  return {{"kind", analysis::findingKindId(f.kind)},
          {"severity", analysis::findingSeverityName(f.severity)},
          {"location", f.location},
          {"where", f.where},
          {"title", f.title},
          {"bytes", f.bytes}};
}
json segmentsJson(const std::vector<analysis::SegmentRef>& v) {
  json a = json::array();
  for (const auto& s : v) {
    a.push_back({{"address", s.address},
                 {"size", s.size},
                 {"stream", s.stream},
                 {"is_large", s.is_large},
                 {"is_expandable", s.is_expandable}});
  }
  return a;
}

json header(const char* command) {
  json doc;
  doc["schema_version"] = kJsonSchemaVersion;
  doc["tool"] = "memforensics";
  doc["command"] = command;
  return doc;
}

void writeDoc(const json& doc, std::ostream& out) {
  out << doc.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
}

}  // namespace

// ---- diff ----

void renderDiffText(const analysis::DiffResult& r, std::ostream& out) {
  out << "memforensics diff\n  base: " << esc(r.base_path) << "\n  new:  " << esc(r.new_path)
      << "\n";
  if (r.devices.empty()) out << "\nno device in either file\n";
  for (const auto& d : r.devices) {
    out << "\ndevice " << d.device;
    if (!d.in_base) out << " (only in new)";
    if (!d.in_new) out << " (only in base)";
    out << "\n  " << pad("", 18) << pad("base", 14) << pad("new", 14) << "delta (new - base)\n";
    for (size_t k = 0; k < kPeakKinds; ++k) {
      figureRow(out, "peak " + std::string(analysis::peakKindName(static_cast<PeakKind>(k))),
                d.peaks[k].base.bytes, d.peaks[k].neu.bytes);
    }
    figureRow(out, "final reserved", d.base_final.reserved, d.new_final.reserved);
    figureRow(out, "final requested", d.base_final.requested, d.new_final.requested);
    figureRow(out, "final allocated", d.base_final.allocated, d.new_final.allocated);
    out << "  " << pad("OOMs", 18) << pad(std::to_string(d.base_ooms), 14)
        << pad(std::to_string(d.new_ooms), 14)
        << (d.new_ooms >= d.base_ooms ? "+" + std::to_string(d.new_ooms - d.base_ooms)
                                      : "-" + std::to_string(d.base_ooms - d.new_ooms))
        << "\n";
    out << "  " << pad("events", 18) << pad(std::to_string(d.base_events), 14)
        << std::to_string(d.new_events) << "\n";
    for (size_t k = 0; k < kPeakKinds; ++k) {
      const auto& p = d.peaks[k];
      out << "\n  live at the " << analysis::peakKindName(p.kind) << " peak (base "
          << peakWhen(p.base) << ", new " << peakWhen(p.neu) << ")";
      size_t same = k;
      for (size_t j = 0; j < k; ++j) {
        if (d.peaks[j].base.event == p.base.event && d.peaks[j].neu.event == p.neu.event) {
          same = j;
          break;
        }
      }
      if (same != k) {
        out << ": the same moments as the " << analysis::peakKindName(d.peaks[same].kind)
            << " peak\n";
        continue;
      }
      if (!p.has_live) {
        out << ": live set not known in both runs\n";
        continue;
      }
      out << ", requested bytes of live blocks:\n";
      for (size_t c = 0; c < kCategoryCount; ++c) {
        if (p.base_category[c] == 0 && p.new_category[c] == 0) continue;
        out << "    "
            << pad(std::string(analysis::categoryName(static_cast<analysis::Category>(c))), 16)
            << pad(formatBytesShort(p.base_category[c]), 14)
            << pad(formatBytesShort(p.new_category[c]), 14)
            << deltaText(p.base_category[c], p.new_category[c]) << "\n";
      }
      out << "    stacks: "
          << (p.matched_exact + p.matched_function_only + p.matched_file_name_only) << " matched ("
          << p.matched_exact << " exactly, " << p.matched_function_only
          << " by file and function only: lines moved, " << p.matched_file_name_only
          << " by file name and function only: directories differ), " << p.added << " new, "
          << p.gone << " gone\n";
      stackList(out, "grew most", p.grew, p.grew.size());
      stackList(out, "new", p.added_stacks, p.added);
      stackList(out, "gone", p.gone_stacks, p.gone);
      stackList(out, "shrank most", p.shrank, p.shrank.size());
    }
    out << "\n";
    findingList(out, "appeared", d.appeared);
    findingList(out, "disappeared", d.disappeared);
    out << "  final segments (" << d.base_segments << " base, " << d.new_segments
        << " new; matched by address and size, as torch.cuda._memory_viz compare does):\n";
    segmentList(out, "base", d.only_base_count, d.only_base_bytes, d.only_base);
    segmentList(out, "new", d.only_new_count, d.only_new_bytes, d.only_new);
    out << "    by size alone: " << d.only_base_by_size_count << " only in base ("
        << formatBytesShort(d.only_base_by_size_bytes) << "), " << d.only_new_by_size_count
        << " only in new (" << formatBytesShort(d.only_new_by_size_bytes) << ")\n";
  }
}

json diffJson(const analysis::DiffResult& r) {
  json doc = header("diff");
  doc["base"] = r.base_path;
  doc["new"] = r.new_path;
  json devs = json::array();
  for (const auto& d : r.devices) {
    json j;
    j["device"] = d.device;
    j["in_base"] = d.in_base;
    j["in_new"] = d.in_new;
    auto side = [&](bool base) {
      json s;
      for (size_t k = 0; k < kPeakKinds; ++k) {
        const auto& p = base ? d.peaks[k].base : d.peaks[k].neu;
        const std::string name =
            "peak_" + std::string(analysis::peakKindName(static_cast<PeakKind>(k)));
        s[name + "_bytes"] = p.bytes;
        s[name + "_event"] = optJson(p.event);
      }
      s["final"] = countersJson(base ? d.base_final : d.new_final);
      s["ooms"] = base ? d.base_ooms : d.new_ooms;
      s["events"] = base ? d.base_events : d.new_events;
      s["segments"] = base ? d.base_segments : d.new_segments;
      return s;
    };
    j["base"] = side(true);
    j["new"] = side(false);
    json delta;
    for (size_t k = 0; k < kPeakKinds; ++k) {
      delta["peak_" + std::string(analysis::peakKindName(static_cast<PeakKind>(k))) + "_bytes"] =
          d.peaks[k].delta;
    }
    delta["final_reserved_bytes"] =
        analysis::signedDelta(d.base_final.reserved, d.new_final.reserved);
    delta["final_requested_bytes"] =
        analysis::signedDelta(d.base_final.requested, d.new_final.requested);
    delta["final_allocated_bytes"] =
        analysis::signedDelta(d.base_final.allocated, d.new_final.allocated);
    delta["ooms"] = static_cast<int64_t>(d.new_ooms) - static_cast<int64_t>(d.base_ooms);
    j["delta"] = delta;
    json peaks = json::array();
    for (size_t k = 0; k < kPeakKinds; ++k) {
      const auto& p = d.peaks[k];
      json pj = {{"kind", analysis::peakKindName(p.kind)},
                 {"base_bytes", p.base.bytes},
                 {"new_bytes", p.neu.bytes},
                 {"delta_bytes", p.delta},
                 {"base_event", optJson(p.base.event)},
                 {"new_event", optJson(p.neu.event)},
                 {"has_live", p.has_live}};
      if (p.has_live) {
        json cats = json::array();
        for (size_t c = 0; c < kCategoryCount; ++c) {
          cats.push_back(
              {{"category", analysis::categoryName(static_cast<analysis::Category>(c))},
               {"base_bytes", p.base_category[c]},
               {"new_bytes", p.new_category[c]},
               {"delta_bytes", analysis::signedDelta(p.base_category[c], p.new_category[c])}});
        }
        pj["categories"] = cats;
        pj["stacks"] = {{"matched_exact", p.matched_exact},
                        {"matched_function_only", p.matched_function_only},
                        {"matched_file_name_only", p.matched_file_name_only},
                        {"new", p.added},
                        {"gone", p.gone},
                        {"grew", stacksJson(p.grew)},
                        {"shrank", stacksJson(p.shrank)},
                        {"new_stacks", stacksJson(p.added_stacks)},
                        {"gone_stacks", stacksJson(p.gone_stacks)}};
      }
      peaks.push_back(pj);
    }
    j["peaks"] = peaks;
    json app = json::array(), dis = json::array();
    for (const auto& f : d.appeared) app.push_back(findingJson(f));
    for (const auto& f : d.disappeared) dis.push_back(findingJson(f));
    j["findings"] = {{"appeared", app}, {"disappeared", dis}};
    j["segments"] = {{"matched_by", "address and size"},
                     {"only_base_count", d.only_base_count},
                     {"only_base_bytes", d.only_base_bytes},
                     {"only_base", segmentsJson(d.only_base)},
                     {"only_new_count", d.only_new_count},
                     {"only_new_bytes", d.only_new_bytes},
                     {"only_new", segmentsJson(d.only_new)},
                     {"only_base_by_size_count", d.only_base_by_size_count},
                     {"only_base_by_size_bytes", d.only_base_by_size_bytes},
                     {"only_new_by_size_count", d.only_new_by_size_count},
                     {"only_new_by_size_bytes", d.only_new_by_size_bytes}};
    devs.push_back(j);
  }
  doc["devices"] = devs;
  return doc;
}

void renderDiffJson(const analysis::DiffResult& r, std::ostream& out) {
  writeDoc(diffJson(r), out);
}

// ---- ranks ----

void renderRanksText(const std::vector<analysis::RankRow>& rows, const analysis::RanksSummary& s,
                     std::ostream& out) {
  out << "memforensics ranks: " << s.rows << " row(s), " << s.failed << " failed, " << s.outliers
      << " outlier(s) (peak more than " << static_cast<int>(analysis::kOutlierFraction * 100)
      << " % above the median)\n";
  out << "  median peak reserved " << formatBytesShort(s.median_peak_reserved)
      << ", median peak requested " << formatBytesShort(s.median_peak_requested) << "\n\n";
  out << "  " << pad("device", 8) << pad("peak reserved", 15) << pad("peak requested", 16)
      << pad("peak allocated", 16) << pad("OOMs", 6) << pad("high", 6) << "file\n";
  for (const auto& r : rows) {
    if (!r.error.empty()) {
      out << "  " << pad("-", 8) << "error: " << esc(r.error) << "  " << esc(r.path) << "\n";
      continue;
    }
    out << "  " << pad(std::to_string(r.device), 8) << pad(formatBytesShort(r.peak_reserved), 15)
        << pad(formatBytesShort(r.peak_requested), 16)
        << pad(formatBytesShort(r.peak_allocated), 16) << pad(std::to_string(r.ooms), 6)
        << pad(std::to_string(r.high_findings), 6) << esc(r.path) << "\n";
    if (!r.largest_holder.empty()) {
      out << "  " << pad("", 8) << "largest holder: " << formatBytesShort(r.largest_holder_bytes)
          << " " << esc(r.largest_holder) << "\n";
    }
    if (r.outlier) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "%+.1f %%", r.above_median * 100);
      out << "  " << pad("", 8) << "OUTLIER: " << r.outlier_figure << " " << buf
          << " against the median";
      if (!r.outlier_line.empty()) {
        out << "; the line that differs most: " << esc(r.outlier_line) << " holds "
            << formatBytesShort(r.outlier_line_bytes) << " against a median of "
            << formatBytesShort(r.outlier_line_median) << " on the other ranks";
      }
      out << "\n";
    }
  }
}

void renderRanksJson(const std::vector<analysis::RankRow>& rows, const analysis::RanksSummary& s,
                     std::ostream& out) {
  json doc = header("ranks");
  doc["summary"] = {{"rows", s.rows},
                    {"failed", s.failed},
                    {"outliers", s.outliers},
                    {"outlier_fraction", analysis::kOutlierFraction},
                    {"median_peak_reserved_bytes", s.median_peak_reserved},
                    {"median_peak_requested_bytes", s.median_peak_requested}};
  json ranks = json::array();
  for (const auto& r : rows) {
    json j;
    j["path"] = r.path;
    j["device"] = r.device < 0 && !r.error.empty() ? json(nullptr) : json(r.device);
    j["error"] = r.error.empty() ? json(nullptr) : json(r.error);
    j["peak_reserved_bytes"] = r.peak_reserved;
    j["peak_requested_bytes"] = r.peak_requested;
    j["peak_allocated_bytes"] = r.peak_allocated;
    j["ooms"] = r.ooms;
    j["high_findings"] = r.high_findings;
    j["largest_holder"] = r.largest_holder.empty()
                              ? json(nullptr)
                              : json{{"line", r.largest_holder}, {"bytes", r.largest_holder_bytes}};
    j["outlier"] = r.outlier;
    j["outlier_figure"] = r.outlier ? json(r.outlier_figure) : json(nullptr);
    j["above_median"] = r.outlier ? json(r.above_median) : json(nullptr);
    j["outlier_line"] = r.outlier && !r.outlier_line.empty()
                            ? json{{"line", r.outlier_line},
                                   {"bytes", r.outlier_line_bytes},
                                   {"median_bytes", r.outlier_line_median}}
                            : json(nullptr);
    json lines = json::array();
    for (const auto& l : r.lines) lines.push_back({{"line", l.line}, {"bytes", l.bytes}});
    j["lines"] = lines;
    ranks.push_back(j);
  }
  doc["ranks"] = ranks;
  writeDoc(doc, out);
}

namespace {
Expected<std::vector<analysis::RankRow>> parseRanksDoc(std::string_view text,
                                                       const std::string& where) {
  auto fail = [&](const std::string& why) -> Error {
    return Error{where + ": not a `memforensics ranks --json` document: " + why, -1};
  };
  json doc = json::parse(text.begin(), text.end(), nullptr, false);
  if (doc.is_discarded()) return fail("not valid JSON");
  if (!doc.is_object() || doc.value("command", std::string()) != "ranks" ||
      !doc.contains("ranks") || !doc["ranks"].is_array()) {
    return fail("no \"command\": \"ranks\" with a \"ranks\" array");
  }
  std::vector<analysis::RankRow> rows;
  size_t i = 0;
  for (const auto& j : doc["ranks"]) {
    const std::string at = "ranks[" + std::to_string(i++) + "]";
    if (!j.is_object() || !j.contains("path") || !j["path"].is_string()) {
      return fail(at + " has no \"path\"");
    }
    analysis::RankRow r;
    r.path = j["path"].get<std::string>();
    if (j.contains("error") && j["error"].is_string()) {
      r.error = j["error"].get<std::string>();
      rows.push_back(std::move(r));
      continue;
    }
    auto u64 = [&](const char* key, uint64_t& v) -> bool {
      if (!j.contains(key) || !j[key].is_number_unsigned()) return false;
      v = j[key].get<uint64_t>();
      return true;
    };
    uint64_t ooms = 0, high = 0;
    if (!j.contains("device") || !j["device"].is_number_integer() ||
        !u64("peak_reserved_bytes", r.peak_reserved) ||
        !u64("peak_requested_bytes", r.peak_requested) ||
        !u64("peak_allocated_bytes", r.peak_allocated) || !u64("ooms", ooms) ||
        !u64("high_findings", high)) {
      return fail(at + " lacks device or a figure (non-negative integers)");
    }
    r.device = j["device"].get<int64_t>();
    // A CUDA ordinal, as the readers bound it; -2^63 is no device.
    if (r.device < 0 || r.device >= static_cast<int64_t>(format::trace::kMaxDevice))
      return fail(at + " has device " + std::to_string(r.device) + ", not a CUDA ordinal (0 to " +
                  std::to_string(format::trace::kMaxDevice - 1) + ")");
    r.ooms = static_cast<size_t>(ooms);
    r.high_findings = static_cast<size_t>(high);
    if (j.contains("largest_holder") && j["largest_holder"].is_object()) {
      const auto& h = j["largest_holder"];
      if (h.contains("line") && h["line"].is_string()) r.largest_holder = h["line"];
      if (h.contains("bytes") && h["bytes"].is_number_unsigned())
        r.largest_holder_bytes = h["bytes"];
    }
    if (j.contains("lines") && j["lines"].is_array()) {
      if (j["lines"].size() > analysis::kRankLines)
        return fail(at + " has more lines than kRankLines");
      for (const auto& l : j["lines"]) {
        if (!l.is_object() || !l.contains("line") || !l["line"].is_string() ||
            !l.contains("bytes") || !l["bytes"].is_number_unsigned()) {
          return fail(at + " has a malformed line entry");
        }
        r.lines.push_back({l["line"].get<std::string>(), l["bytes"].get<uint64_t>()});
      }
      std::sort(
          r.lines.begin(), r.lines.end(),
          [](const analysis::RankLine& a, const analysis::RankLine& b) { return a.line < b.line; });
    }
    rows.push_back(std::move(r));
  }
  return rows;
}
}  // namespace

// One document (compact or laid out), or JSON Lines: one `ranks --json` document per non-empty
// line (a shard written by several invocations, e.g. xargs splitting a long file list).
Expected<std::vector<analysis::RankRow>> parseRanksJson(std::string_view text,
                                                        const std::string& where) {
  if (json::accept(text.begin(), text.end())) return parseRanksDoc(text, where);
  std::vector<analysis::RankRow> rows;
  size_t docs = 0, line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto part = parseRanksDoc(line, where + " line " + std::to_string(line_no));
    if (!part) return part.error();
    ++docs;
    for (auto& r : *part) rows.push_back(std::move(r));
  }
  if (docs == 0) return parseRanksDoc(text, where);
  return rows;
}

// ---- check ----

namespace {
bool isFindingFigure(const analysis::Violation& v) {
  return v.figure.rfind("finding ", 0) == 0;
}
}  // namespace

void renderCheckText(const std::vector<CheckFile>& files, const analysis::CheckReport& r,
                     std::ostream& out) {
  size_t failed = 0;
  for (const auto& f : files) failed += !f.error.empty();
  const bool pass = failed == 0 && r.violations.empty();
  out << "memforensics check: " << (pass ? "PASS" : "FAIL") << ", " << files.size() << " file(s), "
      << r.violations.size() << " violation(s)";
  if (failed > 0) out << ", " << failed << " unreadable";
  out << "\n";
  for (const auto& f : files) {
    if (!f.error.empty()) out << "  " << esc(f.path) << ": error: " << esc(f.error) << "\n";
  }
  for (const auto& v : r.violations) {
    out << "  " << esc(v.path) << " device " << v.device << ": " << v.figure;
    if (isFindingFigure(v)) {
      out << ": " << esc(v.detail);
    } else {
      out << " " << formatBytesShort(v.value) << " > limit " << formatBytesShort(v.limit) << " ("
          << v.value << " B > " << v.limit << " B); " << esc(v.detail);
    }
    out << "\n    line: " << (v.line.empty() ? "(none stands out)" : esc(v.line)) << "\n";
  }
  for (const auto& n : r.notes) out << "  note: " << esc(n) << "\n";
}

void renderCheckJson(const std::vector<CheckFile>& files, const analysis::CheckReport& r,
                     std::ostream& out) {
  json doc = header("check");
  size_t failed = 0;
  json fj = json::array();
  for (const auto& f : files) {
    failed += !f.error.empty();
    fj.push_back({{"path", f.path}, {"error", f.error.empty() ? json(nullptr) : json(f.error)}});
  }
  doc["passed"] = failed == 0 && r.violations.empty();
  doc["files"] = fj;
  json vj = json::array();
  for (const auto& v : r.violations) {
    vj.push_back({{"path", v.path},
                  {"device", v.device},
                  {"figure", v.figure},
                  {"value_bytes", v.value},
                  {"limit_bytes", isFindingFigure(v) ? json(nullptr) : json(v.limit)},
                  {"line", v.line.empty() ? json(nullptr) : json(v.line)},
                  {"detail", v.detail}});
  }
  doc["violations"] = vj;
  doc["notes"] = r.notes;
  writeDoc(doc, out);
}

}  // namespace memforensics::report
