// render_compare.cc: see render_compare.h.
#include "report/render_compare.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

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

// A percentage, except against a base under 1 % of the new value, where it would say nothing a
// reader can use ("+20620800.0 %"): that grew from almost nothing, as new.
std::string percent(uint64_t base, uint64_t neu) {
  if (base == 0) return neu == 0 ? "" : " (new)";
  if (base < neu / 100) return " (new: was " + formatBytesShort(base) + ")";
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

void groupList(std::ostream& out, const char* title, size_t count, uint64_t bytes,
               const std::vector<analysis::SegmentGroup>& v) {
  if (count == 0) return;
  out << "    " << count << " more in " << title << " (" << formatBytesShort(bytes) << "):\n";
  size_t shown = 0;
  for (const auto& g : v) {
    shown += g.count;
    out << "      " << pad(std::to_string(g.count) + " x " + formatBytesShort(g.size), 22)
        << "stream " << g.stream << ", " << (g.is_large ? "large" : "small")
        << (g.is_expandable ? ", expandable" : "") << "\n";
  }
  if (count > shown) out << "      ... " << (count - shown) << " more\n";
}

// The innermost frame of a stack ("model.py:54 forward"), or what stands for a missing one.
std::string innermost(const analysis::StackDelta& s) {
  const auto& frames = s.new_frames.empty() ? s.base_frames : s.new_frames;
  return frames.empty() ? analysis::framesLine(frames, s.has_stack) : frames.front().display();
}

// One line that answers "what changed": the peak reserved delta (and the OOMs), then at the
// requested peak the category that moved most and the stack that moved most in the same
// direction, with its innermost frame.
std::string verdictText(const analysis::DeviceDiff& d) {
  if (!d.in_base) return "only in the new run";
  if (!d.in_new) return "only in the base run";
  const auto& res = d.peaks[static_cast<size_t>(PeakKind::Reserved)];
  std::string v = res.delta == 0
                      ? "peak reserved unchanged (" + formatBytesShort(res.neu.bytes) + ")"
                      : "peak reserved " + deltaText(res.base.bytes, res.neu.bytes);
  if (d.base_ooms != d.new_ooms) {
    v += "; OOMs " + std::to_string(d.base_ooms) + " -> " + std::to_string(d.new_ooms);
  }
  const auto& req = d.peaks[static_cast<size_t>(PeakKind::Requested)];
  if (!req.has_live) return v;
  // The category that moved most in the direction the requested peak moved (the largest change
  // either way when none did), so that it and the stack below tell one story.
  const bool up = req.delta >= 0;
  size_t top_c = kCategoryCount;
  uint64_t top_abs = 0;
  for (const bool same_way_only : {true, false}) {
    for (size_t c = 0; c < kCategoryCount; ++c) {
      const int64_t delta = analysis::signedDelta(req.base_category[c], req.new_category[c]);
      if (same_way_only && (delta != 0 && (delta > 0) != up)) continue;
      const uint64_t a =
          delta < 0 ? 0 - static_cast<uint64_t>(delta) : static_cast<uint64_t>(delta);
      if (a > top_abs) top_abs = a, top_c = c;
    }
    if (top_c != kCategoryCount) break;
  }
  if (top_c == kCategoryCount) return v + "; the same live bytes by category at the requested peak";
  const auto cat = static_cast<analysis::Category>(top_c);
  v += "; at the requested peak " +
       (cat == analysis::Category::Unknown ? std::string("uncategorized")
                                           : std::string(analysis::categoryName(cat))) +
       " memory " + deltaText(req.base_category[top_c], req.new_category[top_c]);
  // The stack that moved most in the direction of the requested peak's change.
  const analysis::StackDelta* top = nullptr;
  for (const auto* list :
       up ? std::array{&req.grew, &req.added_stacks} : std::array{&req.shrank, &req.gone_stacks}) {
    for (const auto& s : *list) {
      if (s.delta != 0 && (top == nullptr || (up ? s.delta > top->delta : s.delta < top->delta))) {
        top = &s;
      }
    }
  }
  if (top != nullptr) {
    const int64_t delta = top->delta;
    v += std::string("; most ") + (up ? "from " : "freed at ") + innermost(*top) + " (" +
         formatBytesSigned(delta) +
         (top->match == analysis::StackMatch::New ? ", a new stack"
          : top->match == analysis::StackMatch::Gone
              ? ", gone"
              : ": " + formatBytesShort(top->base_bytes) + " -> " +
                    formatBytesShort(top->new_bytes)) +
         ")";
  }
  return v;
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
json segmentGroupsJson(const std::vector<analysis::SegmentGroup>& v) {
  json a = json::array();
  for (const auto& g : v) {
    a.push_back({{"size", g.size},
                 {"stream", g.stream},
                 {"is_large", g.is_large},
                 {"is_expandable", g.is_expandable},
                 {"count", g.count}});
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
    out << "\n  verdict: " << esc(verdictText(d)) << "\n";
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
    out << "  final segments: " << d.base_segments << " in base ("
        << formatBytesShort(d.base_segment_bytes) << "), " << d.new_segments << " in new ("
        << formatBytesShort(d.new_segment_bytes) << ")\n";
    out << "  by pool (large or small), stream and size:";
    if (d.more_in_base_count == 0 && d.more_in_new_count == 0) {
      out << " the same segments\n";
    } else {
      out << "\n";
      groupList(out, "base", d.more_in_base_count, d.more_in_base_bytes, d.more_in_base);
      groupList(out, "new", d.more_in_new_count, d.more_in_new_bytes, d.more_in_new);
    }
    out << "  by address and size (as torch.cuda._memory_viz compare matches them): ";
    if (d.matched_by_address == 0 && d.base_segments > 0 && d.new_segments > 0) {
      // Two processes: every address differs, and listing them says nothing (--json has them).
      out << "none in common (the runs' memory is at other addresses; --json lists them)\n";
    } else {
      out << d.matched_by_address << " in common\n";
      segmentList(out, "base", d.only_base_count, d.only_base_bytes, d.only_base);
      segmentList(out, "new", d.only_new_count, d.only_new_bytes, d.only_new);
    }
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
    j["verdict"] = verdictText(d);
    j["segments"] = {{"matched_by", "address and size"},
                     {"matched_by_address", d.matched_by_address},
                     {"only_base_count", d.only_base_count},
                     {"only_base_bytes", d.only_base_bytes},
                     {"only_base", segmentsJson(d.only_base)},
                     {"only_new_count", d.only_new_count},
                     {"only_new_bytes", d.only_new_bytes},
                     {"only_new", segmentsJson(d.only_new)},
                     {"by_role",
                      {{"more_in_base_count", d.more_in_base_count},
                       {"more_in_base_bytes", d.more_in_base_bytes},
                       {"more_in_base", segmentGroupsJson(d.more_in_base)},
                       {"more_in_new_count", d.more_in_new_count},
                       {"more_in_new_bytes", d.more_in_new_bytes},
                       {"more_in_new", segmentGroupsJson(d.more_in_new)}}}};
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
      } else {
        out << "; no line holds more than on the other ranks (none stands out)";
      }
      out << "\n";
    }
  }
}

namespace {
json rankRowJson(const analysis::RankRow& r) {
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
  j["lines"] = std::move(lines);
  return j;
}
}  // namespace

// Written one row at a time around the document's other keys (a merge of 10,000 rows of 64 lines
// built a 630 MB tree): the same bytes as the whole document's dump, whose keys come in order.
void renderRanksJson(const std::vector<analysis::RankRow>& rows, const analysis::RanksSummary& s,
                     std::ostream& out) {
  json doc = header("ranks");
  doc["summary"] = {{"rows", s.rows},
                    {"failed", s.failed},
                    {"outliers", s.outliers},
                    {"outlier_fraction", analysis::kOutlierFraction},
                    {"median_peak_reserved_bytes", s.median_peak_reserved},
                    {"median_peak_requested_bytes", s.median_peak_requested}};
  doc["ranks"] = json::array();
  const std::string frame = doc.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr std::string_view kRanks = "\"ranks\":[";
  const size_t at = frame.find(kRanks) + kRanks.size();  // "command":"ranks" has no '['
  out << std::string_view(frame).substr(0, at);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i) out << ',';
    out << rankRowJson(rows[i]).dump(-1, ' ', false, json::error_handler_t::replace);
  }
  out << std::string_view(frame).substr(at) << "\n";
}

namespace {
// `ranks --json` documents are read with a SAX handler straight into rows, never as a tree: a
// shard of 20 MB holding 10 M numbers in a key the reader ignores built a tree of 460 MB, and one
// of 40 MB holding a 20 M-deep array a tree of 1.5 GB. Memory is the rows themselves (at most
// kRankLines lines each); nesting past kMaxRanksJsonDepth (a document is 5 deep) is refused. The
// checks and their messages are those of the document's fields in order; where a key repeats, the
// last one counts (as in a JSON tree).
constexpr size_t kMaxRanksJsonDepth = 16;

class RanksSax : public nlohmann::json_sax<json> {
 public:
  enum class Outcome { kRows, kInvalidJson, kTooDeep, kNotRanks, kBadRow };

  bool null() override { return scalar(Value{}); }
  bool boolean(bool) override { return scalar(Value{}); }
  bool number_integer(number_integer_t v) override {
    Value x;
    x.is_int = true;
    x.i = v;
    return scalar(x);
  }
  bool number_unsigned(number_unsigned_t v) override {
    Value x;
    x.is_int = x.is_unsigned = true;
    x.u = v;
    x.i = static_cast<int64_t>(v);  // as json::get<int64_t> reads it
    return scalar(x);
  }
  bool number_float(number_float_t, const string_t&) override { return scalar(Value{}); }
  bool string(string_t& s) override {
    Value x;
    x.str = &s;
    return scalar(x);
  }
  bool binary(binary_t&) override { return scalar(Value{}); }
  bool start_object(std::size_t) override { return open(/*object=*/true); }
  bool start_array(std::size_t) override { return open(/*object=*/false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (skip_ > 0) return true;
    field_ = Field::kNone;
    switch (ctx_.back()) {
      case Ctx::kTop:
        if (k == "command") {
          field_ = Field::kCommand;
          command_.clear();
        } else if (k == "ranks") {  // the last "ranks" counts: start over
          field_ = Field::kRanks;
          ranks_array_ = false;
          rows_.clear();
          row_index_ = 0;
          failure_.clear();
        }
        break;
      case Ctx::kRow:
        rowKey(k);
        break;
      case Ctx::kHolder:
        if (k == "line") field_ = Field::kLine, row_.holder_line.reset();
        if (k == "bytes") field_ = Field::kBytes, row_.holder_bytes.reset();
        break;
      case Ctx::kLineEntry:
        if (k == "line") field_ = Field::kLine, entry_line_.reset();
        if (k == "bytes") field_ = Field::kBytes, entry_bytes_.reset();
        break;
      default:
        break;
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    invalid_ = true;
    return false;
  }

  Outcome outcome() const {
    if (too_deep_) return Outcome::kTooDeep;
    if (invalid_) return Outcome::kInvalidJson;
    if (!top_object_ || command_ != "ranks" || !ranks_array_) return Outcome::kNotRanks;
    return failure_.empty() ? Outcome::kRows : Outcome::kBadRow;
  }
  const std::string& failure() const { return failure_; }
  std::vector<analysis::RankRow>& rows() { return rows_; }

 private:
  enum class Ctx { kTop, kRanks, kRow, kHolder, kLines, kLineEntry };
  enum class Field {
    kNone,
    kCommand,
    kRanks,
    kPath,
    kDevice,
    kError,
    kFigure,
    kHolder,
    kLines,
    kLine,
    kBytes
  };
  struct Value {
    bool is_int = false, is_unsigned = false;
    int64_t i = 0;
    uint64_t u = 0;
    const std::string* str = nullptr;
  };
  // One row's fields as read (each reset when its key comes again).
  struct RowIn {
    bool is_object = false;
    std::optional<std::string> path, error;
    std::optional<int64_t> device;
    std::optional<uint64_t> figures[5];
    std::optional<std::string> holder_line;
    std::optional<uint64_t> holder_bytes;
    bool lines_array = false, line_malformed = false;
    size_t line_count = 0;
    std::vector<analysis::RankLine> lines;
  };
  static constexpr const char* kFigureKeys[5] = {"peak_reserved_bytes", "peak_requested_bytes",
                                                 "peak_allocated_bytes", "ooms", "high_findings"};

  void rowKey(const std::string& k) {
    if (k == "path") field_ = Field::kPath, row_.path.reset();
    if (k == "device") field_ = Field::kDevice, row_.device.reset();
    if (k == "error") field_ = Field::kError, row_.error.reset();
    if (k == "largest_holder") {
      field_ = Field::kHolder;
      row_.holder_line.reset();
      row_.holder_bytes.reset();
    }
    if (k == "lines") {
      field_ = Field::kLines;
      row_.lines_array = row_.line_malformed = false;
      row_.line_count = 0;
      row_.lines.clear();
    }
    for (size_t f = 0; f < 5; ++f) {
      if (k == kFigureKeys[f]) {
        field_ = Field::kFigure;
        figure_ = f;
        row_.figures[f].reset();
      }
    }
  }

  bool scalar(const Value& v) {
    if (skip_ > 0) return true;
    if (ctx_.empty()) return true;  // a document that is one scalar: not an object
    switch (ctx_.back()) {
      case Ctx::kTop:
        if (field_ == Field::kCommand && v.str) command_ = *v.str;
        break;
      case Ctx::kRanks:
        startRow(/*is_object=*/false);
        endRow();
        break;
      case Ctx::kRow:
        if (field_ == Field::kPath && v.str) row_.path = *v.str;
        if (field_ == Field::kError && v.str) row_.error = *v.str;
        if (field_ == Field::kDevice && v.is_int) row_.device = v.i;
        if (field_ == Field::kFigure && v.is_unsigned) row_.figures[figure_] = v.u;
        break;
      case Ctx::kHolder:
        if (field_ == Field::kLine && v.str) row_.holder_line = *v.str;
        if (field_ == Field::kBytes && v.is_unsigned) row_.holder_bytes = v.u;
        break;
      case Ctx::kLines:
        lineEntry(false);
        break;
      case Ctx::kLineEntry:
        if (field_ == Field::kLine && v.str) entry_line_ = *v.str;
        if (field_ == Field::kBytes && v.is_unsigned) entry_bytes_ = v.u;
        break;
    }
    return true;
  }

  bool open(bool object) {
    if (++depth_ > kMaxRanksJsonDepth) {
      too_deep_ = true;
      return false;
    }
    if (skip_ > 0) {
      ++skip_;
      return true;
    }
    if (ctx_.empty()) {
      top_object_ = object;
      if (!object) return skipValue();
      ctx_.push_back(Ctx::kTop);
      return true;
    }
    const Field f = std::exchange(field_, Field::kNone);
    switch (ctx_.back()) {
      case Ctx::kTop:
        if (f == Field::kRanks && !object) {
          ranks_array_ = true;
          ctx_.push_back(Ctx::kRanks);
          return true;
        }
        break;
      case Ctx::kRanks:
        startRow(object);
        if (object) {
          ctx_.push_back(Ctx::kRow);
          return true;
        }
        endRow();
        break;
      case Ctx::kRow:
        if (f == Field::kHolder && object) {
          ctx_.push_back(Ctx::kHolder);
          return true;
        }
        if (f == Field::kLines && !object) {
          row_.lines_array = true;
          ctx_.push_back(Ctx::kLines);
          return true;
        }
        break;
      case Ctx::kLines:
        if (object) {
          entry_line_.reset();
          entry_bytes_.reset();
          ctx_.push_back(Ctx::kLineEntry);
          return true;
        }
        lineEntry(false);
        break;
      default:
        break;
    }
    return skipValue();
  }

  bool skipValue() {
    skip_ = 1;
    return true;
  }

  bool close() {
    --depth_;
    if (skip_ > 0) {
      --skip_;
      return true;
    }
    const Ctx c = ctx_.back();
    ctx_.pop_back();
    field_ = Field::kNone;
    if (c == Ctx::kRow) endRow();
    if (c == Ctx::kLineEntry) lineEntry(true);
    return true;
  }

  void startRow(bool is_object) {
    row_ = RowIn{};
    row_.is_object = is_object;
  }

  void lineEntry(bool is_object) {
    ++row_.line_count;
    if (!is_object || !entry_line_ || !entry_bytes_) {
      row_.line_malformed = true;
      return;
    }
    if (row_.lines.size() < analysis::kRankLines)
      row_.lines.push_back({std::move(*entry_line_), *entry_bytes_});
  }

  void endRow() {
    const std::string at = "ranks[" + std::to_string(row_index_++) + "]";
    if (!failure_.empty()) return;  // only the first bad row is reported; no more rows kept
    auto fail = [&](std::string why) {
      failure_ = at + why;
      rows_.clear();
    };
    RowIn& r = row_;
    if (!r.is_object || !r.path) return fail(" has no \"path\"");
    analysis::RankRow out;
    out.path = std::move(*r.path);
    if (r.error && !r.error->empty()) {
      // A row with an error has a message: an empty one is no error (what renderRanksJson writes
      // of such a row, null, reads back the same way).
      out.error = std::move(*r.error);
      rows_.push_back(std::move(out));
      return;
    }
    bool figures = r.device.has_value();
    for (const auto& f : r.figures) figures &= f.has_value();
    if (!figures) return fail(" lacks device or a figure (non-negative integers)");
    out.device = *r.device;
    // A CUDA ordinal, as the readers bound it; -2^63 is no device.
    if (out.device < 0 || out.device >= static_cast<int64_t>(format::trace::kMaxDevice))
      return fail(" has device " + std::to_string(out.device) + ", not a CUDA ordinal (0 to " +
                  std::to_string(format::trace::kMaxDevice - 1) + ")");
    out.peak_reserved = *r.figures[0];
    out.peak_requested = *r.figures[1];
    out.peak_allocated = *r.figures[2];
    out.ooms = static_cast<size_t>(*r.figures[3]);
    out.high_findings = static_cast<size_t>(*r.figures[4]);
    if (r.holder_line) out.largest_holder = std::move(*r.holder_line);
    if (r.holder_bytes) out.largest_holder_bytes = *r.holder_bytes;
    if (r.lines_array) {
      if (r.line_count > analysis::kRankLines) return fail(" has more lines than kRankLines");
      if (r.line_malformed) return fail(" has a malformed line entry");
      out.lines = std::move(r.lines);
      // By text, then bytes: a shard naming one line twice reads the same in any order.
      std::sort(out.lines.begin(), out.lines.end(),
                [](const analysis::RankLine& a, const analysis::RankLine& b) {
                  return std::tie(a.line, a.bytes) < std::tie(b.line, b.bytes);
                });
    }
    rows_.push_back(std::move(out));
  }

  std::vector<Ctx> ctx_;
  Field field_ = Field::kNone;
  size_t figure_ = 0, depth_ = 0, skip_ = 0, row_index_ = 0;
  bool invalid_ = false, too_deep_ = false, top_object_ = false, ranks_array_ = false;
  std::string command_, failure_;
  RowIn row_;
  std::optional<std::string> entry_line_;
  std::optional<uint64_t> entry_bytes_;
  std::vector<analysis::RankRow> rows_;
};

// One document; `invalid` (may be null) is set when the text is not JSON (JSON Lines are tried).
Expected<std::vector<analysis::RankRow>> parseRanksDoc(std::string_view text,
                                                       const std::string& where,
                                                       bool* invalid = nullptr) {
  auto fail = [&](const std::string& why) -> Error {
    return Error{where + ": not a `memforensics ranks --json` document: " + why, -1};
  };
  RanksSax sax;
  (void)json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::json,
                        /*strict=*/true);
  if (invalid) *invalid = sax.outcome() == RanksSax::Outcome::kInvalidJson;
  switch (sax.outcome()) {
    case RanksSax::Outcome::kInvalidJson:
      return fail("not valid JSON");
    case RanksSax::Outcome::kTooDeep:
      return fail("nested deeper than " + std::to_string(kMaxRanksJsonDepth) + " levels");
    case RanksSax::Outcome::kNotRanks:
      return fail("no \"command\": \"ranks\" with a \"ranks\" array");
    case RanksSax::Outcome::kBadRow:
      return fail(sax.failure());
    case RanksSax::Outcome::kRows:
      break;
  }
  return std::move(sax.rows());
}
}  // namespace

// One document (compact or laid out), or JSON Lines: one `ranks --json` document per non-empty
// line (a shard written by several invocations, e.g. xargs splitting a long file list).
Expected<std::vector<analysis::RankRow>> parseRanksJson(std::string_view text,
                                                        const std::string& where) {
  bool invalid = false;
  auto whole = parseRanksDoc(text, where, &invalid);
  if (!invalid) return whole;
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
  if (docs == 0) return whole;
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
  if (failed > 0) out << ", " << failed << " not checked";
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
