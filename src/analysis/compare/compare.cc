// compare.cc: see compare.h.
#include "analysis/compare/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <tuple>
#include <unordered_map>

#include "analysis/frames/stack_groups.h"
#include "common/saturating.h"

namespace memforensics::analysis {

const replay::Peak& summaryPeak(const replay::DeviceSummary& s, PeakKind k) {
  switch (k) {
    case PeakKind::Reserved:
      return s.peak_reserved;
    case PeakKind::Requested:
      return s.peak_requested;
    case PeakKind::Allocated:
      return s.peak_allocated;
  }
  return s.peak_reserved;
}

namespace {

// Exact key: file, function and line of every frame; Loose: file and function; BaseName: the
// file's last path component and the function (another checkout of the same code).
enum class KeyMode { Exact, Loose, BaseName };

std::string_view baseName(std::string_view path) {
  const size_t cut = path.find_last_of("/\\");
  return cut == std::string_view::npos ? path : path.substr(cut + 1);
}

std::string frameKey(const std::vector<FrameText>& frames, bool has_stack, KeyMode mode) {
  std::string k = has_stack ? "S" : "N";
  for (const auto& f : frames) {
    k += '\x1e';
    k += mode == KeyMode::BaseName ? baseName(f.filename) : std::string_view(f.filename);
    k += '\x1f';
    k += f.name;
    if (mode == KeyMode::Exact) {
      k += '\x1f';
      k += std::to_string(f.line);
    }
  }
  return k;
}

std::string frameOrderText(const std::vector<FrameText>& frames) {
  std::string t;
  for (const auto& f : frames) t += f.display() + "\n";
  return t;
}

}  // namespace

FindingRef findingRef(const Finding& f) {
  FindingRef r;
  r.kind = f.kind;
  r.severity = f.severity;
  r.title = f.title;
  r.bytes = f.bytes;
  if (!f.where.empty()) {
    r.location = f.where[0].filename + " " + f.where[0].name;
    r.where = framesLine(f.where);
  }
  return r;
}

namespace {

uint64_t medianOf(std::vector<uint64_t> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const uint64_t upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const uint64_t lower = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return lower + (upper - lower) / 2;
}

// base * (1 + pct / 100), rounded down, saturated.
uint64_t increasedLimit(uint64_t base, double pct) {
  const long double v =
      static_cast<long double>(base) * (1.0L + static_cast<long double>(pct) / 100);
  if (!(v < 18446744073709551615.0L)) return UINT64_MAX;
  return v <= 0 ? 0 : static_cast<uint64_t>(v);
}

}  // namespace

std::string_view peakKindName(PeakKind k) {
  switch (k) {
    case PeakKind::Reserved:
      return "reserved";
    case PeakKind::Requested:
      return "requested";
    case PeakKind::Allocated:
      return "allocated";
  }
  return "reserved";
}

std::string_view stackMatchName(StackMatch m) {
  switch (m) {
    case StackMatch::Exact:
      return "exact";
    case StackMatch::FunctionOnly:
      return "function_only";
    case StackMatch::FileNameOnly:
      return "file_name_only";
    case StackMatch::New:
      return "new";
    case StackMatch::Gone:
      return "gone";
  }
  return "exact";
}

std::string framesLine(const std::vector<FrameText>& frames, bool has_stack) {
  if (!has_stack) return "(no stack recorded)";
  if (frames.empty()) return "(no frames)";
  std::string out;
  for (const auto& f : frames) {
    if (!out.empty()) out += " < ";
    out += f.display();
  }
  return out;
}

int64_t signedDelta(uint64_t base, uint64_t neu) {
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (neu >= base) {
    const uint64_t d = neu - base;
    return d > kMax ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(d);
  }
  const uint64_t d = base - neu;
  return d > kMax ? std::numeric_limits<int64_t>::min() : -static_cast<int64_t>(d);
}

// ---- profiles ----

RunProfile profileSnapshot(const format::Snapshot& snap, const ProfileOptions& options) {
  RunProfile out;
  AnalysisResult job;  // the devices' analyses, for the cross-device findings
  for (int64_t d : snap.devices()) {
    if (options.device && *options.device != d) continue;
    DeviceSession session(snap, d);
    requestProfilePeaks(session);
    session.requestFindingMoments(kLayoutOoms);
    job.devices.emplace_back();
    out.devices.push_back(profileDevice(snap, session.take(), &job.devices.back()));
  }
  // As analyze does (analyzeSnapshot): the job's findings from every device's analysis; with
  // --device only that device is analysed, so there is nothing to compare across.
  finishAnalysis(snap, job);
  for (const Finding& f : job.job_findings) out.job_findings.push_back({f.device, findingRef(f)});
  return out;
}

DeviceProfile profileDevice(const format::Snapshot& snap, DeviceFacts facts,
                            DeviceAnalysis* analysis) {
  DeviceProfile p;
  const auto& s = facts.summary;
  p.device = facts.device;
  p.events = s.events;
  p.ooms = s.ooms.size();
  p.consistent = s.consistent;
  p.final_state = facts.segments > 0 ? s.final_file : s.final_replayed;
  for (size_t k = 0; k < kPeakKinds; ++k) {
    PeakProfile& pp = p.peaks[k];
    pp.peak = summaryPeak(s, static_cast<PeakKind>(k));
    const MomentFacts* m = facts.at(pp.peak.event);
    if (m == nullptr || !m->has_live) continue;
    pp.at = m->at;
    pp.has_live = true;
    m->live.forEach([&](uint64_t, const replay::LiveBlock& b) {
      if (b.pending) return;
      uint64_t& slot = pp.by_category[static_cast<size_t>(facts.categoryOf(snap, b))];
      slot = addSat(slot, b.requested);
    });
    GroupOptions go;
    go.frames = kCompareFrames;
    auto groups = groupLiveByStack(snap, m->live, PendingBlocks::Exclude, go);
    for (size_t i = 0; i < groups.size(); ++i) {
      if (i >= kMaxProfileGroups) {
        pp.other_requested = addSat(pp.other_requested, groups[i].requested_bytes);
        ++pp.other_groups;
        continue;
      }
      ProfileGroup g;
      g.frames = std::move(groups[i].frames);
      g.has_stack = groups[i].has_stack;
      g.requested_bytes = groups[i].requested_bytes;
      g.block_bytes = groups[i].block_bytes;
      g.count = groups[i].count;
      pp.groups.push_back(std::move(g));
    }
  }
  for (const auto& seg : snap.segmentsOf(facts.device)) {
    p.segments.push_back(
        {seg.address, seg.total_size, seg.stream, seg.is_large, seg.is_expandable});
  }
  // Growth per step: requested bytes at each iteration's end against the previous one's.
  p.iterations = facts.iterations.size();
  p.iteration_basis = facts.iteration_basis;
  const auto& ends = facts.requested_at_iteration_end;
  for (size_t i = 1; i < ends.size() && i < facts.iterations.size(); ++i) {
    const int64_t g = signedDelta(ends[i - 1], ends[i]);
    if (!p.growth.known || g > p.growth.bytes) {
      p.growth.known = true;
      p.growth.iteration = static_cast<int>(i);
      p.growth.bytes = g;
    }
  }
  if (p.growth.known) {
    const Phase& it = facts.iterations[static_cast<size_t>(p.growth.iteration)];
    p.growth.name = it.name;
    StackGrouper grouper(snap, GroupOptions{kCompareFrames, 1});
    for (const auto& a : facts.allocs) {
      if (a.event < it.first_event || a.event > it.last_event) continue;
      if (a.freed != -1 && a.freed <= it.last_event) continue;
      grouper.add(a.stack, a.requested, 0, 1, a.event);
    }
    auto top = grouper.take();
    if (!top.empty()) {
      p.growth.top_frames = std::move(top[0].frames);
      p.growth.top_has_stack = top[0].has_stack;
      p.growth.top_bytes = top[0].requested_bytes;
    }
  }
  AnalyzeOptions ao;
  ao.top = 1;
  DeviceAnalysis da = analyzeDevice(snap, std::move(facts), ao);
  for (const auto& f : da.findings) p.findings.push_back(findingRef(f));
  if (analysis != nullptr) *analysis = std::move(da);
  return p;
}

// ---- diff ----

PeakDiff diffPeak(PeakKind kind, const PeakProfile& base, const PeakProfile& neu, size_t top) {
  PeakDiff d;
  d.kind = kind;
  d.base = base.peak;
  d.neu = neu.peak;
  d.delta = signedDelta(base.peak.bytes, neu.peak.bytes);
  d.has_live = base.has_live && neu.has_live;
  if (!d.has_live) return d;
  d.base_category = base.by_category;
  d.new_category = neu.by_category;

  std::vector<StackDelta> matched;
  std::vector<bool> base_used(base.groups.size(), false), new_used(neu.groups.size(), false);
  std::unordered_map<std::string, size_t> base_exact;
  for (size_t i = 0; i < base.groups.size(); ++i) {
    base_exact.emplace(frameKey(base.groups[i].frames, base.groups[i].has_stack, KeyMode::Exact),
                       i);
  }
  auto pair = [&](size_t bi, size_t ni, StackMatch how) {
    base_used[bi] = new_used[ni] = true;
    StackDelta sd;
    sd.match = how;
    sd.base_frames = base.groups[bi].frames;
    sd.new_frames = neu.groups[ni].frames;
    sd.has_stack = neu.groups[ni].has_stack;
    sd.base_bytes = base.groups[bi].requested_bytes;
    sd.new_bytes = neu.groups[ni].requested_bytes;
    sd.delta = signedDelta(sd.base_bytes, sd.new_bytes);
    matched.push_back(std::move(sd));
  };
  for (size_t i = 0; i < neu.groups.size(); ++i) {
    auto it =
        base_exact.find(frameKey(neu.groups[i].frames, neu.groups[i].has_stack, KeyMode::Exact));
    if (it != base_exact.end()) {
      pair(it->second, i, StackMatch::Exact);
      ++d.matched_exact;
    }
  }
  // Lines shifted: the rest, by file and function, the largest of one run with the largest of the
  // other (groups are in rank order already); then by file name and function (the same code in
  // another directory).
  auto loosely = [&](KeyMode mode, StackMatch how, size_t& counter) {
    std::map<std::string, std::vector<size_t>> base_loose;
    for (size_t i = 0; i < base.groups.size(); ++i) {
      if (!base_used[i]) {
        base_loose[frameKey(base.groups[i].frames, base.groups[i].has_stack, mode)].push_back(i);
      }
    }
    std::map<std::string, size_t> taken;
    for (size_t i = 0; i < neu.groups.size(); ++i) {
      if (new_used[i]) continue;
      const std::string k = frameKey(neu.groups[i].frames, neu.groups[i].has_stack, mode);
      auto it = base_loose.find(k);
      if (it == base_loose.end()) continue;
      size_t& next = taken[k];
      if (next >= it->second.size()) continue;
      pair(it->second[next++], i, how);
      ++counter;
    }
  };
  loosely(KeyMode::Loose, StackMatch::FunctionOnly, d.matched_function_only);
  loosely(KeyMode::BaseName, StackMatch::FileNameOnly, d.matched_file_name_only);
  for (const auto& sd : matched) {
    if (sd.delta > 0) d.grew.push_back(sd);
    if (sd.delta < 0) d.shrank.push_back(sd);
  }
  for (size_t i = 0; i < neu.groups.size(); ++i) {
    if (new_used[i]) continue;
    StackDelta sd;
    sd.match = StackMatch::New;
    sd.new_frames = neu.groups[i].frames;
    sd.has_stack = neu.groups[i].has_stack;
    sd.new_bytes = neu.groups[i].requested_bytes;
    sd.delta = signedDelta(0, sd.new_bytes);
    d.added_stacks.push_back(std::move(sd));
  }
  for (size_t i = 0; i < base.groups.size(); ++i) {
    if (base_used[i]) continue;
    StackDelta sd;
    sd.match = StackMatch::Gone;
    sd.base_frames = base.groups[i].frames;
    sd.has_stack = base.groups[i].has_stack;
    sd.base_bytes = base.groups[i].requested_bytes;
    sd.delta = signedDelta(sd.base_bytes, 0);
    d.gone_stacks.push_back(std::move(sd));
  }
  d.added = d.added_stacks.size();
  d.gone = d.gone_stacks.size();
  auto frames_of = [](const StackDelta& s) {
    return frameOrderText(s.new_frames.empty() ? s.base_frames : s.new_frames);
  };
  auto by = [&](auto key) {
    return [key, &frames_of](const StackDelta& a, const StackDelta& b) {
      const auto ka = key(a), kb = key(b);
      if (ka != kb) return ka > kb;
      return frames_of(a) < frames_of(b);
    };
  };
  auto finish = [&](std::vector<StackDelta>& v, auto key) {
    std::sort(v.begin(), v.end(), by(key));
    if (v.size() > top) v.resize(top);
  };
  finish(d.grew, [](const StackDelta& s) { return s.delta; });
  // Largest drop first: compare the negated delta as an unsigned magnitude (no overflow at min).
  finish(d.shrank, [](const StackDelta& s) { return s.base_bytes - s.new_bytes; });
  finish(d.added_stacks, [](const StackDelta& s) { return s.new_bytes; });
  finish(d.gone_stacks, [](const StackDelta& s) { return s.base_bytes; });
  return d;
}

DiffResult diffProfiles(const RunProfile& base, const RunProfile& neu, const DiffOptions& options) {
  DiffResult r;
  r.base_path = base.path;
  r.new_path = neu.path;
  std::map<int64_t, std::pair<const DeviceProfile*, const DeviceProfile*>> devices;
  for (const auto& d : base.devices) devices[d.device].first = &d;
  for (const auto& d : neu.devices) devices[d.device].second = &d;
  static const DeviceProfile kEmpty;
  for (const auto& [dev, pr] : devices) {
    DeviceDiff dd;
    dd.device = dev;
    dd.in_base = pr.first != nullptr;
    dd.in_new = pr.second != nullptr;
    const DeviceProfile& b = pr.first ? *pr.first : kEmpty;
    const DeviceProfile& n = pr.second ? *pr.second : kEmpty;
    for (size_t k = 0; k < kPeakKinds; ++k) {
      dd.peaks[k] = diffPeak(static_cast<PeakKind>(k), b.peaks[k], n.peaks[k], options.top);
    }
    dd.base_final = b.final_state;
    dd.new_final = n.final_state;
    dd.base_ooms = b.ooms;
    dd.new_ooms = n.ooms;
    dd.base_events = b.events;
    dd.new_events = n.events;
    // Findings by kind and location (titles carry numbers that change with every run).
    auto key = [](const FindingRef& f) {
      return std::string(findingKindId(f.kind)) + "|" + f.location;
    };
    std::map<std::string, size_t> base_count, new_count;
    for (const auto& f : b.findings) ++base_count[key(f)];
    for (const auto& f : n.findings) ++new_count[key(f)];
    std::map<std::string, size_t> seen;
    for (const auto& f : n.findings) {
      if (++seen[key(f)] > base_count[key(f)]) dd.appeared.push_back(f);
    }
    seen.clear();
    for (const auto& f : b.findings) {
      if (++seen[key(f)] > new_count[key(f)]) dd.disappeared.push_back(f);
    }
    // Segments by (address, size), as torch.cuda._memory_viz compare matches them.
    dd.base_segments = b.segments.size();
    dd.new_segments = n.segments.size();
    std::map<std::pair<uint64_t, uint64_t>, size_t> bseg, nseg;
    for (const auto& s : b.segments) ++bseg[{s.address, s.size}];
    for (const auto& s : n.segments) ++nseg[{s.address, s.size}];
    auto only = [](const std::vector<SegmentRef>& mine,
                   std::map<std::pair<uint64_t, uint64_t>, size_t> other,
                   std::vector<SegmentRef>& listed, size_t& count, uint64_t& bytes) {
      for (const auto& s : mine) {
        auto it = other.find({s.address, s.size});
        if (it != other.end() && it->second > 0) {
          --it->second;
          continue;
        }
        ++count;
        if (__builtin_add_overflow(bytes, s.size, &bytes)) bytes = UINT64_MAX;
        if (listed.size() < kDiffSegmentsListed) listed.push_back(s);
      }
    };
    only(b.segments, nseg, dd.only_base, dd.only_base_count, dd.only_base_bytes);
    only(n.segments, bseg, dd.only_new, dd.only_new_count, dd.only_new_bytes);
    dd.matched_by_address = dd.base_segments - dd.only_base_count;
    for (const auto& s : b.segments) dd.base_segment_bytes = addSat(dd.base_segment_bytes, s.size);
    for (const auto& s : n.segments) dd.new_segment_bytes = addSat(dd.new_segment_bytes, s.size);
    // By role: base count - new count per (pool, expandable, stream, size).
    using Role = std::tuple<bool, bool, int64_t, uint64_t>;
    std::map<Role, int64_t> by_role;
    for (const auto& s : b.segments) ++by_role[{s.is_large, s.is_expandable, s.stream, s.size}];
    for (const auto& s : n.segments) --by_role[{s.is_large, s.is_expandable, s.stream, s.size}];
    for (const auto& [role, diff] : by_role) {
      if (diff == 0) continue;
      const auto& [large, expandable, stream, size] = role;
      const size_t c = static_cast<size_t>(diff < 0 ? -diff : diff);
      const uint64_t bytes = mulSat(c, size);
      auto& list = diff > 0 ? dd.more_in_base : dd.more_in_new;
      (diff > 0 ? dd.more_in_base_count : dd.more_in_new_count) += c;
      uint64_t& sum = diff > 0 ? dd.more_in_base_bytes : dd.more_in_new_bytes;
      sum = addSat(sum, bytes);
      list.push_back({size, stream, large, expandable, c});
    }
    for (auto* list : {&dd.more_in_base, &dd.more_in_new}) {
      std::stable_sort(list->begin(), list->end(),
                       [](const SegmentGroup& x, const SegmentGroup& y) {
                         return mulSat(x.count, x.size) > mulSat(y.count, y.size);
                       });
      if (list->size() > kDiffSegmentsListed) list->resize(kDiffSegmentsListed);
    }
    r.devices.push_back(std::move(dd));
  }
  return r;
}

// ---- ranks ----

std::vector<RankRow> rankRowsOf(const RunProfile& profile) {
  std::vector<RankRow> rows;
  if (profile.devices.empty()) {
    rows.push_back(failedRankRow(profile.path, "no device in the file"));
    return rows;
  }
  for (const auto& d : profile.devices) {
    RankRow r;
    r.path = profile.path;
    r.device = d.device;
    r.peak_reserved = d.peaks[static_cast<size_t>(PeakKind::Reserved)].peak.bytes;
    r.peak_requested = d.peaks[static_cast<size_t>(PeakKind::Requested)].peak.bytes;
    r.peak_allocated = d.peaks[static_cast<size_t>(PeakKind::Allocated)].peak.bytes;
    r.ooms = d.ooms;
    for (const auto& f : d.findings) r.high_findings += f.severity == FindingSeverity::High;
    for (const auto& j : profile.job_findings)
      r.high_findings += j.device == d.device && j.finding.severity == FindingSeverity::High;
    const PeakProfile& rq = d.peaks[static_cast<size_t>(PeakKind::Requested)];
    if (!rq.groups.empty()) {
      r.largest_holder = framesLine(rq.groups[0].frames, rq.groups[0].has_stack);
      r.largest_holder_bytes = rq.groups[0].requested_bytes;
    }
    std::map<std::string, uint64_t> lines;
    for (const auto& g : rq.groups) {
      std::string line = !g.has_stack       ? "(no stack recorded)"
                         : g.frames.empty() ? "(no frames)"
                                            : g.frames[0].display();
      uint64_t& slot = lines[line];
      if (__builtin_add_overflow(slot, g.requested_bytes, &slot)) slot = UINT64_MAX;
    }
    for (auto& [line, bytes] : lines) r.lines.push_back({line, bytes});
    // Keep the largest kRankLines, then order by text for lookups.
    std::sort(r.lines.begin(), r.lines.end(), [](const RankLine& a, const RankLine& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.line < b.line;
    });
    if (r.lines.size() > kRankLines) r.lines.resize(kRankLines);
    std::sort(r.lines.begin(), r.lines.end(),
              [](const RankLine& a, const RankLine& b) { return a.line < b.line; });
    rows.push_back(std::move(r));
  }
  return rows;
}

RankRow failedRankRow(std::string path, std::string error) {
  RankRow r;
  r.path = std::move(path);
  r.error = error.empty() ? "failed" : std::move(error);
  return r;
}

RanksSummary markOutliers(std::vector<RankRow>& rows) {
  RanksSummary s;
  s.rows = rows.size();
  std::vector<uint64_t> reserved, requested;
  std::vector<size_t> ok;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].error.empty()) {
      ++s.failed;
      continue;
    }
    ok.push_back(i);
    reserved.push_back(rows[i].peak_reserved);
    requested.push_back(rows[i].peak_requested);
  }
  s.median_peak_reserved = medianOf(reserved);
  s.median_peak_requested = medianOf(requested);
  auto above = [](uint64_t v, uint64_t med) {
    return static_cast<long double>(v) >
           static_cast<long double>(med) * (1.0L + static_cast<long double>(kOutlierFraction));
  };
  auto fraction = [](uint64_t v, uint64_t med) {
    return med == 0 ? 0.0
                    : static_cast<double>((static_cast<long double>(v) - med) /
                                          static_cast<long double>(med));
  };
  // Per line, the sorted bytes of the rows that have it (the others hold 0 there): the median of
  // the other ranks on a line is then found by index, O(log n) per line of an outlier.
  std::unordered_map<std::string, std::vector<uint64_t>> by_line;
  for (size_t i : ok) {
    for (const auto& l : rows[i].lines) by_line[l.line].push_back(l.bytes);
  }
  for (auto& [line, v] : by_line) std::sort(v.begin(), v.end());
  const size_t n = ok.size();
  for (size_t i : ok) {
    RankRow& r = rows[i];
    r.outlier = false;
    if (above(r.peak_reserved, s.median_peak_reserved)) {
      r.outlier = true;
      r.outlier_figure = "peak_reserved";
      r.above_median = fraction(r.peak_reserved, s.median_peak_reserved);
    } else if (above(r.peak_requested, s.median_peak_requested)) {
      r.outlier = true;
      r.outlier_figure = "peak_requested";
      r.above_median = fraction(r.peak_requested, s.median_peak_requested);
    }
    if (!r.outlier || n < 2) continue;
    ++s.outliers;
    // The line whose bytes stand furthest above the median of the other ranks' bytes there.
    int64_t best = std::numeric_limits<int64_t>::min();
    for (const auto& l : r.lines) {
      const std::vector<uint64_t>& vals = by_line[l.line];
      const size_t zeros = n - vals.size();
      auto full = [&](size_t k) { return k < zeros ? uint64_t{0} : vals[k - zeros]; };
      // The sorted values of every row but this one: `full` without one copy of l.bytes.
      const size_t pos =
          zeros +
          static_cast<size_t>(std::lower_bound(vals.begin(), vals.end(), l.bytes) - vals.begin());
      auto other = [&](size_t k) { return k < pos ? full(k) : full(k + 1); };
      const size_t m = n - 1;
      const uint64_t upper = other(m / 2);
      const uint64_t med = m % 2 == 1 ? upper : other(m / 2 - 1) + (upper - other(m / 2 - 1)) / 2;
      const int64_t diff = signedDelta(med, l.bytes);
      // Only a line that holds more than the others' median is named: a rank above the median by
      // its idle cache has no such line, and naming one that holds the same would blame it.
      if (diff > 0 && diff > best) {
        best = diff;
        r.outlier_line = l.line;
        r.outlier_line_bytes = l.bytes;
        r.outlier_line_median = med;
      }
    }
  }
  return s;
}

// ---- check ----

CheckReport checkProfile(const RunProfile& run, const CheckLimits& limits,
                         const RunProfile* baseline) {
  CheckReport rep;
  auto top_line = [](const PeakProfile& p) {
    return p.groups.empty() ? std::string() : framesLine(p.groups[0].frames, p.groups[0].has_stack);
  };
  auto at_text = [](const PeakProfile& p) {
    return p.peak.event < 0 ? std::string("peak in the start state (before the first event)")
                            : "peak after event " + std::to_string(p.peak.event);
  };
  for (const auto& d : run.devices) {
    auto peak_limit = [&](PeakKind k, const std::optional<uint64_t>& limit) {
      if (!limit) return;
      const PeakProfile& p = d.peaks[static_cast<size_t>(k)];
      if (p.peak.bytes <= *limit) return;
      rep.violations.push_back({run.path, d.device, "peak_" + std::string(peakKindName(k)),
                                p.peak.bytes, *limit, top_line(p), at_text(p)});
    };
    peak_limit(PeakKind::Reserved, limits.max_peak_reserved);
    peak_limit(PeakKind::Requested, limits.max_peak_requested);
    if (limits.max_growth_per_step) {
      if (!d.growth.known) {
        rep.notes.push_back("device " + std::to_string(d.device) + ": " +
                            std::to_string(d.iterations) +
                            " iteration(s) found, growth per step not checked (needs two)");
      } else if (d.growth.bytes > 0 &&
                 static_cast<uint64_t>(d.growth.bytes) > *limits.max_growth_per_step) {
        rep.violations.push_back(
            {run.path, d.device, "growth_per_step", static_cast<uint64_t>(d.growth.bytes),
             *limits.max_growth_per_step,
             d.growth.top_bytes == 0 ? std::string()
                                     : framesLine(d.growth.top_frames, d.growth.top_has_stack),
             "requested bytes at the end of " + d.growth.name +
                 " minus at the end of the iteration before (" + d.iteration_basis + ")"});
      }
    }
    if (limits.fail_on) {
      auto fail = [&](const FindingRef& f) {
        if (f.severity < *limits.fail_on) return;
        rep.violations.push_back({run.path, d.device,
                                  "finding " + std::string(findingKindId(f.kind)) + " (" +
                                      std::string(findingSeverityName(f.severity)) + ")",
                                  f.bytes, 0, f.where, f.title});
      };
      for (const auto& f : d.findings) fail(f);
      // The job's findings count on the device they point at (device imbalance: the heaviest).
      for (const auto& j : run.job_findings)
        if (j.device == d.device) fail(j.finding);
    }
    if (limits.max_increase_pct && baseline != nullptr) {
      const DeviceProfile* b = nullptr;
      for (const auto& bd : baseline->devices) {
        if (bd.device == d.device) b = &bd;
      }
      if (b == nullptr) {
        rep.notes.push_back("device " + std::to_string(d.device) + ": not in the baseline " +
                            baseline->path + ", not compared");
        continue;
      }
      for (size_t k = 0; k < kPeakKinds; ++k) {
        const PeakProfile& np = d.peaks[k];
        const PeakProfile& bp = b->peaks[k];
        const uint64_t limit = increasedLimit(bp.peak.bytes, *limits.max_increase_pct);
        if (np.peak.bytes <= limit) continue;
        PeakDiff pd = diffPeak(static_cast<PeakKind>(k), bp, np, 1);
        std::string line;
        const StackDelta* best = nullptr;
        if (!pd.grew.empty()) best = &pd.grew[0];
        if (!pd.added_stacks.empty() && (best == nullptr || pd.added_stacks[0].delta > best->delta))
          best = &pd.added_stacks[0];
        if (best != nullptr) {
          line = framesLine(best->new_frames, best->has_stack) +
                 (best->match == StackMatch::New            ? " (new stack)"
                  : best->match == StackMatch::FunctionOnly ? " (matched by function, lines moved)"
                  : best->match == StackMatch::FileNameOnly
                      ? " (matched by file name and function, directories differ)"
                      : "");
        }
        const double pct =
            bp.peak.bytes == 0
                ? 0.0
                : 100.0 *
                      (static_cast<double>(np.peak.bytes) - static_cast<double>(bp.peak.bytes)) /
                      static_cast<double>(bp.peak.bytes);
        char buf[96];
        std::snprintf(buf, sizeof buf, "%+.1f %%, at most +%g %%", pct, *limits.max_increase_pct);
        rep.violations.push_back(
            {run.path, d.device,
             "peak_" + std::string(peakKindName(static_cast<PeakKind>(k))) + " increase",
             np.peak.bytes, limit, line,
             "baseline " + std::to_string(bp.peak.bytes) + " B in " + baseline->path + " (" + buf +
                 ")"});
      }
    }
  }
  return rep;
}

}  // namespace memforensics::analysis
