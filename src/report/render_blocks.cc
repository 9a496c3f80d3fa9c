// render_blocks.cc: `memforensics blocks` output, text maps and JSON (schema in docs/cli.md).
#include "report/render_blocks.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/allocator_constants.h"
#include "common/format_bytes.h"
#include "common/text_escape.h"
#include "report/json_analysis.h"

namespace memforensics::report {

namespace {

using format::BlockState;
using nlohmann::json;

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string percent(double f) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", f * 100.0);
  return buf;
}

std::string stateName(BlockState s) {
  switch (s) {
    case BlockState::ActiveAllocated:
      return "active_allocated";
    case BlockState::ActivePendingFree:
      return "active_pending_free";
    default:
      return "inactive";
  }
}

std::string poolOf(const replay::ModelSegment& s) {
  return alloc::poolName(s.is_large, s.pool.first, s.pool.second);
}

json freeSpaceJson(const analysis::FreeSpace& f) {
  json j;
  if (f.is_stream)
    j["stream"] = f.stream;
  else
    j["pool"] = f.pool;
  j["free_bytes"] = f.free_bytes;
  j["largest_free_bytes"] = f.largest_free;
  j["free_blocks"] = f.free_blocks;
  return j;
}

}  // namespace

std::string blocksMap(const replay::ModelSegment& s, int width) {
  // Each cell shows the state that covers most of its bytes, so the map is to scale; a segment
  // with any allocated block shows at least one '#'.
  if (width <= 0) return "";
  std::string out(static_cast<size_t>(width), '.');
  if (s.size == 0) return out;
  const double cell = static_cast<double>(s.size) / width;
  std::vector<double> cover[3];
  for (auto& c : cover) c.assign(static_cast<size_t>(width), 0.0);
  for (const auto& b : s.blocks) {
    // The model keeps every block inside its segment; one that is not (or is empty) is left out
    // rather than drawn at an index outside the map.
    if (b.size == 0 || b.address < s.address) continue;
    const uint64_t off = b.address - s.address;
    if (off >= s.size || b.size > s.size - off) continue;
    int k = b.state == BlockState::ActiveAllocated     ? 0
            : b.state == BlockState::ActivePendingFree ? 1
                                                       : 2;
    const double lo = std::clamp(static_cast<double>(off) / cell, 0.0, static_cast<double>(width));
    const double hi =
        std::clamp(static_cast<double>(off + b.size) / cell, lo, static_cast<double>(width));
    for (int i = static_cast<int>(lo); i < width && i < hi; ++i) {
      cover[k][static_cast<size_t>(i)] += std::min<double>(hi, i + 1) - std::max<double>(lo, i);
    }
  }
  bool any_alloc = false, shown_alloc = false;
  size_t best_alloc = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    double a = cover[0][i], p = cover[1][i], f = cover[2][i];
    out[i] = a >= p && a >= f ? '#' : p >= f ? '+' : '.';
    if (a > 0) {
      if (!any_alloc || a > cover[0][best_alloc]) best_alloc = i;
      any_alloc = true;
    }
    shown_alloc |= out[i] == '#';
  }
  if (any_alloc && !shown_alloc) out[best_alloc] = '#';
  return out;
}

void renderBlocksText(const analysis::BlocksResult& r, std::ostream& out) {
  if (!r.path.empty()) out << escapeText(r.path) << "\n";
  out << "device " << r.device << " at " << r.at << ": ";
  if (r.event < 0)
    out << "start state (before event 0)";
  else
    out << "after event " << r.event << " of " << r.events;
  if (r.time_us >= 0) out << " (" << formatTimeUs(r.time_us) << ")";
  out << "\n";
  out << "layout: " << (r.layout_exact ? "exact" : "approximate") << " (allocator model predicted "
      << r.model.alloc_matches << "/" << r.model.allocs << " alloc addresses, "
      << r.model.segment_matches << "/" << r.model.segment_events << " segment events)\n";
  if (!r.history_gap.empty()) {
    out << "history: " << escapeText(r.history_gap)
        << " (analyze's incomplete_history finding says how to record one that can)\n";
  }
  if (!r.consistent) {
    out << "UNTRUSTED: " << replay::describeUntrusted(r.untrusted_cause, r.untrusted, " ") << "\n";
  }
  for (const auto& a : r.errors) {
    out << "[error] " << a.id << " x" << a.count;
    if (a.first_event >= 0) out << " (first at event " << a.first_event << ")";
    out << "\n";
  }
  out << "legend: '#' allocated  '+' pending-free  '.' free   (" << kBlocksMapWidth
      << " characters = one segment)\n\n";
  for (const auto& sb : r.segments) {
    const auto& s = sb.segment;
    out << hex(s.address) << "  " << poolOf(s) << (s.is_expandable ? " expandable" : "") << "  "
        << formatBytes(s.size) << "  stream " << s.stream << "\n";
    out << "  [" << blocksMap(s) << "]\n";
    out << "  " << s.blocks.size() << " blocks: allocated " << formatBytes(sb.allocated_bytes);
    if (sb.pending_bytes > 0) out << ", pending-free " << formatBytes(sb.pending_bytes);
    out << ", free " << formatBytes(sb.free_bytes);
    if (sb.free_blocks > 0)
      out << " in " << sb.free_blocks << " (largest " << formatBytes(sb.largest_free) << ")";
    out << ", internal waste " << formatBytes(sb.internal_waste) << "\n";
  }
  out << "\nsegments " << r.segments.size() << ", reserved " << formatBytes(r.reserved_bytes)
      << ", allocated " << formatBytes(r.allocated_bytes) << ", pending-free "
      << formatBytes(r.pending_bytes) << ", requested " << formatBytes(r.requested_bytes) << "\n";
  out << "free inside segments " << formatBytes(r.free_bytes) << " in " << r.free_blocks
      << " blocks, largest " << formatBytes(r.largest_free) << ", external fragmentation "
      << percent(r.external_fragmentation) << " (1 - largest free / total free)\n";
  out << "internal waste " << formatBytes(r.internal_waste)
      << " (block size - requested, active blocks)\n";
  for (const auto& f : r.by_pool) {
    out << "  pool " << f.pool << ": free " << formatBytes(f.free_bytes) << ", largest "
        << formatBytes(f.largest_free) << "\n";
  }
  for (const auto& f : r.by_stream) {
    out << "  stream " << f.stream << ": free " << formatBytes(f.free_bytes) << ", largest "
        << formatBytes(f.largest_free) << "\n";
  }
  if (r.oom) {
    const auto& v = *r.oom;
    out << "\nOOM at event " << v.event << ": request " << formatBytes(v.request_bytes) << " ("
        << v.pool << " pool, stream " << v.stream << "), device free " << formatBytes(v.device_free)
        << "\n";
    out << "  free in that pool and stream " << formatBytes(v.pool_free) << ", largest block "
        << formatBytes(v.pool_largest) << "\n";
    if (v.fragmentation) {
      out << "  verdict: FRAGMENTATION - the request fits into the free bytes but into no single "
             "free block\n";
    } else if (v.fits_block) {
      out << "  verdict: a free block was large enough (the allocator state differs from the "
             "model)\n";
    } else {
      out << "  verdict: not fragmentation - the cached free bytes are less than the request\n";
    }
    // The figure the OOM verdict of `analyze` gives (the same OomVerdict: one home for it).
    const auto& n = v.need;
    if (!v.fragmentation) {
      out << "  short by " << formatBytes(v.short_by) << ": the allocator would have needed "
          << formatBytes(n.needed_bytes)
          << (n.expandable
                  ? " (" + std::to_string(n.pages) + " pages of " + formatBytes(n.page_bytes) +
                        " beyond " + formatBytes(n.usable_free) + " free at the segment's end)"
                  : std::string(" (a new segment)"))
          << " and the device had " << formatBytes(v.device_free) << " free"
          << (r.layout_exact ? "" : " (estimate: " + r.estimate_reason + ")") << "\n";
    } else {
      out << "  short by nothing: the cache held the bytes, in no block large enough\n";
    }
  }
}

void renderBlocksJson(const analysis::BlocksResult& r, std::ostream& out) {
  json doc;
  doc["tool"] = "memforensics";
  doc["command"] = "blocks";
  doc["path"] = r.path;
  doc["device"] = r.device;
  doc["at"] = r.at;
  doc["event"] = r.event;
  doc["events"] = r.events;
  doc["time_us"] = optJson(r.time_us);
  doc["layout_exact"] = r.layout_exact;
  if (!r.history_gap.empty()) doc["history_gap"] = r.history_gap;
  addTrustJson(doc, r.consistent, r.untrusted, r.untrusted_cause);
  json errors = json::array();
  for (const auto& a : r.errors) {
    errors.push_back({{"id", a.id}, {"count", a.count}, {"first_event", optJson(a.first_event)}});
  }
  doc["errors"] = std::move(errors);
  json mm = json::array();
  for (const auto& m : r.model.first_mismatches) {
    mm.push_back({{"event", m.event},
                  {"action", std::string(format::actionName(m.action))},
                  {"recorded", m.recorded},
                  {"predicted", m.predicted},
                  {"why", m.why}});
  }
  doc["model"] = {{"allocs", r.model.allocs},
                  {"alloc_matches", r.model.alloc_matches},
                  {"segment_events", r.model.segment_events},
                  {"segment_matches", r.model.segment_matches},
                  {"first_mismatches", mm}};
  json segs = json::array();
  for (const auto& sb : r.segments) {
    const auto& s = sb.segment;
    json blocks = json::array();
    for (const auto& b : s.blocks) {
      json jb = {{"address", b.address}, {"size", b.size}, {"state", stateName(b.state)}};
      if (!b.isFree()) {
        jb["requested_size"] = b.requested;
        jb["alloc_event"] = optJson(b.alloc_event);
      }
      blocks.push_back(std::move(jb));
    }
    segs.push_back({{"address", s.address},
                    {"size", s.size},
                    {"pool", poolOf(s)},
                    {"stream", s.stream},
                    {"is_expandable", s.is_expandable},
                    {"map", blocksMap(s)},
                    {"allocated_bytes", sb.allocated_bytes},
                    {"pending_free_bytes", sb.pending_bytes},
                    {"free_bytes", sb.free_bytes},
                    {"largest_free_bytes", sb.largest_free},
                    {"internal_waste_bytes", sb.internal_waste},
                    {"blocks", std::move(blocks)}});
  }
  doc["segments"] = std::move(segs);
  json tot = {{"reserved_bytes", r.reserved_bytes},
              {"allocated_bytes", r.allocated_bytes},
              {"pending_free_bytes", r.pending_bytes},
              {"requested_bytes", r.requested_bytes},
              {"free_bytes", r.free_bytes},
              {"free_blocks", r.free_blocks},
              {"largest_free_bytes", r.largest_free},
              {"external_fragmentation", r.external_fragmentation},
              {"internal_waste_bytes", r.internal_waste}};
  json bp = json::array(), bs = json::array();
  for (const auto& f : r.by_pool) bp.push_back(freeSpaceJson(f));
  for (const auto& f : r.by_stream) bs.push_back(freeSpaceJson(f));
  tot["by_pool"] = std::move(bp);
  tot["by_stream"] = std::move(bs);
  doc["totals"] = std::move(tot);
  if (r.oom) {
    doc["oom"] = oomVerdictJson(*r.oom);
  } else {
    doc["oom"] = nullptr;
  }
  out << doc.dump(-1, ' ', false, json::error_handler_t::replace)
      << "\n";  // a path need not be UTF-8
}

}  // namespace memforensics::report
