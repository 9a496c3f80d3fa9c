// render_text.cc: the terminal report of `memforensics analyze`.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <sstream>
#include <string_view>

#include "analysis/findings/headline.h"
#include "common/format_bytes.h"
#include "common/text_escape.h"
#include "report/render.h"
#include "report/text_layout.h"

namespace memforensics::report {

namespace {

std::string pad(std::string s, size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

std::string when(const replay::Peak& p, int64_t t0) {
  if (p.event < 0) return "at trace start";
  std::string s = "at event " + std::to_string(p.event);
  if (p.time_us >= 0 && t0 >= 0) s += " (t+" + formatDurationUs(p.time_us - t0) + ")";
  return s;
}

void counterRow(std::ostream& out, const char* label, uint64_t start, const replay::Peak& peak,
                uint64_t final, int64_t t0) {
  out << "  " << pad(label, 18) << pad(formatBytesShort(start), 12)
      << pad(formatBytesShort(peak.bytes) + " " + when(peak, t0), 44) << formatBytesShort(final)
      << "\n";
}

const analysis::Finding* historyFinding(const analysis::DeviceAnalysis& d) {
  for (const auto& f : d.findings)
    if (f.kind == analysis::FindingKind::IncompleteHistory) return &f;
  return nullptr;
}

// One finding: severity and title, the line to change, at most 6 evidence lines, fix, basis.
// A finding whose title the headline already printed names its headline line instead of
// repeating the title (each fact once).
void findingText(const analysis::Finding& f, const analysis::Headline& h, std::ostream& out) {
  out << "    [" << analysis::findingSeverityName(f.severity) << "] ";
  size_t item = 0;
  while (item < h.items.size() && !(h.items[item].device == f.device &&
                                    h.items[item].kind == f.kind && h.items[item].title == f.title))
    ++item;
  if (item < h.items.size()) {
    out << analysis::findingKindId(f.kind) << ": its title is the headline's above\n";
  } else {
    out << escapeText(f.title) << "\n";
  }
  if (!f.where.empty()) {
    out << "        at " << escapeText(f.where[0].display()) << "\n";
    for (size_t k = 1; k < f.where.size(); ++k)
      out << "        <- " << escapeText(f.where[k].display()) << "\n";
  }
  size_t shown = 0;
  for (const auto& e : f.evidence) {
    if (++shown > 6) {
      out << "        ... " << (f.evidence.size() - 6) << " more in --json\n";
      break;
    }
    out << "        - " << escapeText(e.text);
    if (e.bytes > 0) out << ": " << formatBytesShort(e.bytes);
    if (e.event >= 0) out << " (event " << e.event << ")";
    if (!e.frames.empty()) out << " at " << escapeText(e.frames[0].display());
    out << "\n";
  }
  out << "        fix: " << escapeText(f.fix) << "\n";
  if (!f.basis.empty()) out << "        basis: " << escapeText(f.basis) << "\n";
}

// The first screen: which device to look at and why, then one line per OOM, high finding or
// history that cannot explain the file (analysis/findings/headline.h), across devices.
// `hidden_warnings`: warnings on devices whose detail is not printed (the table's only).
void headlineText(const analysis::AnalysisResult& r, const analysis::Headline& h,
                  size_t hidden_warnings, std::ostream& out) {
  if (r.devices.empty()) return;
  // export_memory_timeline names no device (it may be the CPU's): never called a GPU.
  if (r.source_format == "profiler_memory_timeline")
    out << "  headline: the timeline's device (the file does not say which: the CPU or a GPU)";
  else
    out << "  headline: cuda:" << h.focus_device;
  if (r.devices.size() > 1) out << " first (" << escapeText(h.focus_reason) << ")";
  out << "\n";
  for (const auto& it : h.items) {
    out << "    ";
    // A title that starts with its device ("cuda:1: ...") is not given the device twice.
    std::string_view title = it.title;
    if (it.device >= 0) {
      const std::string dev = "cuda:" + std::to_string(it.device);
      out << dev << " ";
      if (title.substr(0, dev.size() + 2) == dev + ": ") title.remove_prefix(dev.size() + 2);
    }
    out << "[" << analysis::findingSeverityName(it.severity) << "] ";
    // Each number once: no badge when the title already gives these bytes.
    const std::string badge = it.bytes > 0 ? formatBytesShort(it.bytes) : std::string();
    if (!badge.empty() && title.find(badge) == std::string_view::npos) out << badge << ": ";
    out << escapeText(title);
    if (!it.where.empty()) out << " -- at " << escapeText(it.where.front().display());
    out << "\n";
  }
  const size_t hidden = std::min(hidden_warnings, h.other_warnings);
  const size_t below = h.other_warnings - hidden;
  std::string counts;
  if (below > 0)
    counts = std::to_string(below) + (below == 1 ? " warning" : " warnings") + " below";
  if (hidden > 0) {
    counts += (counts.empty() ? "" : ", ") + std::to_string(hidden) +
              (hidden == 1 ? " warning" : " warnings") +
              " on devices listed only in the table: --all-devices";
  }
  if (h.items.empty()) {
    out << "    no OOM and no high-severity finding";
    if (!counts.empty()) out << " (" << counts << ")";
    out << "\n";
  } else if (!counts.empty()) {
    out << "    and " << counts << "\n";
  }
}

// One line per device: its peaks, OOMs and findings by severity (files of several devices).
void deviceTable(const analysis::AnalysisResult& r, const std::vector<size_t>& order,
                 std::ostream& out) {
  out << "\n  devices: " << r.devices.size() << "\n";
  for (size_t di : order) {
    const auto& d = r.devices[di];
    const auto& s = d.summary;
    size_t by[3] = {0, 0, 0};
    for (const auto& f : d.findings) ++by[static_cast<size_t>(f.severity) % 3];
    out << "    " << pad("cuda:" + std::to_string(s.device), 9) << "peak reserved "
        << pad(formatBytesShort(s.peak_reserved.bytes) + ",", 12) << "requested "
        << pad(formatBytesShort(s.peak_requested.bytes) + ";", 12);
    const size_t n_ooms = s.ooms.size();
    out << (n_ooms == 0 ? std::string("no OOM")
                        : std::to_string(n_ooms) + (n_ooms == 1 ? " OOM" : " OOMs"));
    const analysis::FindingSeverity sev[3] = {analysis::FindingSeverity::High,
                                              analysis::FindingSeverity::Warning,
                                              analysis::FindingSeverity::Info};
    std::string fs;
    for (auto v : sev) {
      const size_t n = by[static_cast<size_t>(v) % 3];
      if (n > 0)
        fs += (fs.empty() ? "" : ", ") + std::to_string(n) + " " +
              std::string(analysis::findingSeverityName(v)) +
              (v == analysis::FindingSeverity::Warning && n > 1 ? "s" : "");
    }
    out << "; findings: " << (fs.empty() ? std::string("none") : fs) << "\n";
  }
}

// Whether a device of a many-device file gets its detail without --all-devices: an OOM, or a
// finding the headline lists (analysis::isHeadlineItem).
bool matters(const analysis::DeviceAnalysis& d) {
  return !d.ooms.empty() || std::any_of(d.findings.begin(), d.findings.end(),
                                        [](const auto& f) { return analysis::isHeadlineItem(f); });
}

void addFrames(const std::vector<analysis::FrameText>& frames, std::vector<std::string>& paths) {
  for (const auto& f : frames) paths.push_back(f.filename);
}

// Every frame file the report shows (for the common path prefix).
std::vector<std::string> shownPaths(const analysis::AnalysisResult& r) {
  std::vector<std::string> paths;
  auto findings = [&](const std::vector<analysis::Finding>& fs) {
    for (const auto& f : fs) {
      addFrames(f.where, paths);
      for (const auto& e : f.evidence) addFrames(e.frames, paths);
    }
  };
  findings(r.job_findings);
  for (const auto& d : r.devices) {
    findings(d.findings);
    for (const auto& g : d.top_at_peak) addFrames(g.frames, paths);
    for (size_t k = 0; k < d.ooms.size() && k < kTextOoms; ++k) addFrames(d.ooms[k].frames, paths);
    for (const auto& f : d.frames_at_peak.top_inclusive) paths.push_back(f.frame.filename);
    for (const auto& f : d.frames_at_peak.hot_path) paths.push_back(f.frame.filename);
  }
  return paths;
}

void deviceText(const analysis::DeviceAnalysis& d, const analysis::Headline& headline, bool unnamed,
                std::ostream& out);

}  // namespace

void renderText(const analysis::AnalysisResult& r, std::ostream& out_final,
                const TextOptions& opt) {
  // Written in two parts (before and after the "interned" line, where the path note goes), then
  // the common path prefix is left out and the lines are wrapped.
  std::ostringstream top, out;
  top << "memforensics analyze: " << escapeText(r.path) << "\n";
  const analysis::Headline headline = analysis::buildHeadline(r);
  // Which devices get their detail (a file of many devices: those that matter), decided first:
  // the headline counts the warnings that are below and those only in the table.
  const std::vector<size_t> order = analysis::deviceOrder(r, headline);
  const bool all = opt.all_devices || r.devices.size() <= kDetailedDevices;
  std::vector<bool> shown(order.size(), true);
  size_t hidden_warnings = 0;
  for (size_t k = 1; k < order.size() && !all; ++k) {
    const auto& d = r.devices[order[k]];
    if (matters(d)) continue;
    shown[k] = false;
    for (const auto& f : d.findings)
      hidden_warnings += f.severity == analysis::FindingSeverity::Warning;
  }
  headlineText(r, headline, hidden_warnings, out);
  out << "  input: " << escapeText(r.source_format);
  if (r.pickle_protocol > 0) out << " (pickle protocol " << r.pickle_protocol << ")";
  out << ", " << formatBytes(r.input_bytes);
  if (r.live_capture) {
    out << ", recorded live: " << escapeText(r.origin) << "\n";
  } else if (r.source_format == "profiler_trace" || r.source_format == "profiler_memory_timeline") {
    // torch.profiler's outputs carry no PyTorch version ("written by PyTorch none" before).
    out << ", written by torch.profiler (the file records no PyTorch version)\n";
  } else {
    out << ", written by PyTorch " << escapeText(r.era) << " (inferred from its fields)\n";
    if (!r.origin.empty()) out << "  converted from: " << escapeText(r.origin) << "\n";
  }
  for (const auto& w : r.warnings) out << "  WARNING: " << escapeText(w) << "\n";
  out << "  interned: " << r.strings << " strings, " << r.frames << " frames, " << r.stacks
      << " stacks; " << r.annotations << " annotations";
  if (r.host_trace_events > 0)
    out << "; " << r.host_trace_events << " host trace events (not replayed)";
  out << "\n";
  if (!r.ignored_keys.empty()) {
    out << "  ignored top-level keys:";
    for (const auto& k : r.ignored_keys) out << " " << escapeText(k);
    out << "\n";
  }
  const std::string part_a = out.str();
  out.str("");
  if (r.devices.empty() && r.empty_devices.empty())
    out << "\n  no device has segments or trace events\n";
  for (int64_t d : r.empty_devices)
    out << "\ndevice " << d << ": nothing recorded (an empty trace and no segments)\n";
  if (!r.job_findings.empty()) {
    out << "\njob findings (across devices):\n";
    for (const auto& f : r.job_findings) findingText(f, headline, out);
  }
  if (r.devices.size() > 1) deviceTable(r, order, out);
  size_t hidden = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    if (!shown[k]) {
      ++hidden;
      continue;
    }
    deviceText(r.devices[order[k]], headline, r.source_format == "profiler_memory_timeline", out);
  }
  if (hidden > 0) {
    out << "\n"
        << hidden << (hidden == 1 ? " more device" : " more devices")
        << " without an OOM or a high-severity finding (their peaks are in the table above): "
           "--all-devices prints their detail\n";
  }
  const std::string part_b = out.str();
  const std::vector<std::string> paths = shownPaths(r);
  const std::string prefix = commonPathPrefix(part_a + part_b, paths);
  std::string text = top.str() + stripPrefix(part_a, prefix);
  if (!prefix.empty())
    text += "  paths: frames' files under " + escapeText(prefix) + " are shown without it\n";
  text += stripPrefix(part_b, prefix);
  out_final << wrapLines(text, opt.width);
}

namespace {

void deviceText(const analysis::DeviceAnalysis& d, const analysis::Headline& headline, bool unnamed,
                std::ostream& out) {
  {
    const auto& s = d.summary;
    out << "\ndevice " << s.device << (unnamed ? " (not named by the file: the CPU or a GPU)" : "")
        << ": " << s.events << " events, " << d.segments << " segments at the end";
    if (s.first_time_us >= 0) {
      out << ", " << formatDurationUs(s.last_time_us - s.first_time_us) << " from "
          << formatTimeUs(s.first_time_us) << " to " << formatTimeUs(s.last_time_us);
    } else if (s.events > 0) {
      out << ", no timestamps in this file";
    }
    out << "\n";
    if (s.events > 0) {
      out << "  events by action:";
      for (size_t a = 0; a < s.by_action.size(); ++a) {
        if (s.by_action[a] == 0) continue;
        out << " " << format::actionName(static_cast<format::Action>(a)) << " " << s.by_action[a];
      }
      out << "\n";
    } else {
      out << "  no trace: only the final state is known (enable history with "
             "torch.cuda.memory._record_memory_history to see how it got there)\n";
    }
    out << "\n  " << pad("", 18) << pad("start", 12) << pad("peak", 44) << "final\n";
    counterRow(out, "reserved", s.start.reserved, s.peak_reserved, s.final_replayed.reserved,
               s.first_time_us);
    counterRow(out, "requested", s.start.requested, s.peak_requested, s.final_replayed.requested,
               s.first_time_us);
    counterRow(out, s.allocated_exact ? "allocated" : "allocated (est.)", s.start.allocated,
               s.peak_allocated, s.final_replayed.allocated, s.first_time_us);
    counterRow(out, "active", s.start.active(), s.peak_active, s.final_replayed.active(),
               s.first_time_us);
    if (!s.allocated_exact) {
      out << "  (est.) block sizes of allocations freed before the end are PyTorch's rounding of "
             "the\n"
             "  request; large-pool blocks may hold up to 1 MiB more that the file does not "
             "record.\n";
    }
    if (!s.consistent) {
      out << "  UNTRUSTED: " << replay::describeUntrusted(s.untrusted_cause, s.untrusted, " ")
          << "\n";
    }
    if (s.live_at_start > 0 && s.events > 0) {
      out << "  " << s.live_at_start << " blocks were already live when the trace starts";
      if (s.freed_before_start > 0) {
        out << " (" << s.freed_before_start
            << " of them are freed in the trace: history is truncated)";
      }
      out << "\n";
    }

    out << "\n  OOMs: ";
    const analysis::Finding* history = historyFinding(d);
    if (d.ooms.empty() && history != nullptr &&
        history->severity >= analysis::FindingSeverity::Warning)
      out << "unknown: the history cannot explain an OOM (see incomplete_history below)\n";
    else if (d.ooms.empty() && history != nullptr)
      out << "none in the trace (its first entries were dropped)\n";
    else if (d.ooms.empty())
      out << "none\n";
    else
      out << d.summary.ooms.size() << "\n";
    for (size_t k = 0; k < d.ooms.size() && k < kTextOoms; ++k) {
      const analysis::OomReport& o = d.ooms[k];
      out << "    event " << o.oom.event << ": request of " << formatBytes(o.oom.request_bytes)
          << " failed with " << formatBytes(o.oom.device_free) << " free on the device; reserved "
          << formatBytesShort(o.oom.at.reserved) << ", requested "
          << formatBytesShort(o.oom.at.requested) << "\n";
      for (const auto& f : o.frames) out << "        at " << escapeText(f.display()) << "\n";
    }
    if (d.summary.ooms.size() > kTextOoms) {
      out << "    ... and " << d.summary.ooms.size() - kTextOoms << " more (analyze --json lists ";
      if (d.summary.ooms.size() > analysis::kOomsListed)
        out << "the first " << analysis::kOomsListed << ")\n";
      else
        out << "them all)\n";
    }

    out << "\n  largest live allocations at the requested peak";
    if (s.peak_requested.event >= 0)
      out << " (event " << s.peak_requested.event << ")";
    else
      out << " (trace start)";
    out << ", by stack:\n";
    if (d.top_at_peak.empty()) out << "    none\n";
    int rank = 1;
    for (const auto& g : d.top_at_peak) {
      char head[96];
      std::snprintf(head, sizeof head, "  %3d. ", rank++);
      out << "  " << head << pad(formatBytesShort(g.requested_bytes), 11) << " in " << g.count
          << (g.count == 1 ? " block" : " blocks");
      if (!g.has_stack) {
        out << "   (no stack recorded)\n";
        continue;
      }
      if (g.frames.empty()) {
        out << "   (stack has no user frames)\n";
        continue;
      }
      out << "   " << escapeText(g.frames[0].display()) << "\n";
      for (size_t k = 1; k < g.frames.size(); ++k) {
        out << pad("", 31) << "<- " << escapeText(g.frames[k].display()) << "\n";
      }
    }

    if (d.has_frames) {
      const auto& g = d.frames_at_peak;
      out << "\n  live bytes at the requested peak by frame (" << formatBytesShort(g.total_bytes)
          << " live";
      if (g.unattributed_bytes > 0)
        out << ", " << formatBytesShort(g.unattributed_bytes) << " without a stack";
      out << "):\n    inclusive   self\n";
      for (const auto& f : g.top_inclusive) {
        out << "    " << pad(formatBytesShort(f.inclusive_bytes), 11) << " "
            << pad(formatBytesShort(f.self_bytes), 11) << " " << escapeText(f.frame.display())
            << "\n";
      }
      if (!g.hot_path.empty()) {
        out << "    hot path:\n";
        for (const auto& f : g.hot_path) {
          out << "      " << pad(formatBytesShort(f.inclusive_bytes), 11) << " "
              << escapeText(f.frame.display()) << "\n";
        }
      }
    }

    out << "\n  findings: ";
    if (d.findings.empty())
      out << "none\n";
    else
      out << "\n";
    for (const auto& f : d.findings) findingText(f, headline, out);

    out << "\n  anomalies: ";
    if (d.anomalies.empty())
      out << "none\n";
    else
      out << "\n";
    for (const auto& a : d.anomalies) {
      out << "    [" << replay::severityName(a.severity) << "] " << escapeText(a.id) << " x"
          << a.count;
      if (a.first_event >= 0) out << " (first at event " << a.first_event << ")";
      out << ": " << escapeText(a.description) << "\n";
    }
  }
}

}  // namespace

}  // namespace memforensics::report
