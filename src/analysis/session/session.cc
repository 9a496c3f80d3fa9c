// session.cc: see session.h.
#include "analysis/session/session.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>

#include "analysis/findings/findings.h"

namespace memforensics::analysis {

namespace {

using format::Action;
using format::Event;

replay::PassStats minus(const replay::PassStats& a, const replay::PassStats& b) {
  replay::PassStats d;
  d.backward = a.backward - b.backward;
  d.forward = a.forward - b.forward;
  d.events_stepped = a.events_stepped - b.events_stepped;
  d.model_seeds = a.model_seeds - b.model_seeds;
  d.model_forward = a.model_forward - b.model_forward;
  d.model_events_stepped = a.model_events_stepped - b.model_events_stepped;
  return d;
}

// One line saying why figures from the model are not exact ("" when they are).
std::string estimateReason(const replay::ModelVerdict& v, uint8_t untrusted) {
  std::string why;
  if (v.alloc_matches != v.allocs || v.segment_matches != v.segment_events) {
    why = "the allocator model predicted " + std::to_string(v.alloc_matches) + " of " +
          std::to_string(v.allocs) + " allocs";
    if (v.segment_matches != v.segment_events) {
      why += " and " + std::to_string(v.segment_matches) + " of " +
             std::to_string(v.segment_events) + " segment events";
    }
  } else if (!v.exact) {
    why = v.why;
  }
  if ((untrusted & replay::kUntrustedBlockLayout) != 0) {
    if (!why.empty()) why += "; ";
    why += "the trace cannot lead to the file's final state, so the start layout is unknown";
  }
  return why;
}

}  // namespace

const MomentFacts* DeviceFacts::at(int64_t event) const {
  auto it = std::lower_bound(moments.begin(), moments.end(), event,
                             [](const MomentFacts& m, int64_t e) { return m.event < e; });
  return it != moments.end() && it->event == event ? &*it : nullptr;
}

Category DeviceFacts::categoryOf(const format::Snapshot& snap, int64_t alloc_event,
                                 format::StackId stack) const {
  if (alloc_event < 0 || static_cast<size_t>(alloc_event) >= alloc_at.size())
    return preTraceCategory(snap, stack);
  const int32_t k = alloc_at[static_cast<size_t>(alloc_event)];
  return k < 0 ? Category::Unknown : allocs[static_cast<size_t>(k)].category;
}

std::vector<AllocFact> allocationTable(std::span<const Event> events,
                                       std::vector<int32_t>* alloc_at) {
  std::vector<AllocFact> allocs;
  if (alloc_at != nullptr) alloc_at->assign(events.size(), -1);
  U64Map<int32_t> open;  // address -> its latest alloc
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.action == Action::Alloc) {
      AllocFact a;
      a.event = static_cast<int64_t>(i);
      a.requested = e.size;
      a.stack = e.stack;
      a.stream = e.stream;
      if (alloc_at != nullptr) (*alloc_at)[i] = static_cast<int32_t>(allocs.size());
      open.insert(e.addr, static_cast<int32_t>(allocs.size()));
      allocs.push_back(a);
    } else if (e.action == Action::FreeRequested) {
      if (const int32_t* k = open.find(e.addr)) {
        if (allocs[static_cast<size_t>(*k)].freed < 0)
          allocs[static_cast<size_t>(*k)].freed = static_cast<int64_t>(i);
      }
    } else if (e.action == Action::FreeCompleted) {
      int32_t k = -1;
      if (open.take(e.addr, &k)) {  // one probe: found and erased
        if (allocs[static_cast<size_t>(k)].freed < 0)
          allocs[static_cast<size_t>(k)].freed = static_cast<int64_t>(i);
      }
    }
  }
  return allocs;
}

DeviceFacts eventFacts(const format::Snapshot& snap, int64_t device) {
  StackFactsCache cache(snap);
  return eventFacts(snap, device, cache);
}

DeviceFacts eventFacts(const format::Snapshot& snap, int64_t device, StackFactsCache& cache) {
  DeviceFacts f;
  f.device = device;
  if (device >= 0 && static_cast<size_t>(device) < snap.traceCount()) {
    f.held_events = format::DeviceEvents(snap, static_cast<size_t>(device));
    f.events = f.held_events.span();
  }
  f.segments = snap.segmentsOf(device).size();

  // The allocation table (one walk), phases once from it, then each alloc's iteration and
  // category (no replay).
  f.allocs = allocationTable(f.events, &f.alloc_at);
  f.phases = detectPhases(snap, device, f.events, cache, f.allocs);
  for (const Phase& p : f.phases) {
    if (p.kind == PhaseKind::Iteration && p.last_event >= p.first_event) f.iterations.push_back(p);
  }
  if (!f.iterations.empty()) {
    f.iteration_basis = f.iterations.front().source == PhaseSource::Annotation
                            ? "iterations from external_annotations"
                            : "iterations detected from the repeating allocation pattern";
  }
  // The iteration holding each alloc (-1 when none does), by a cursor (allocs come in event order,
  // iterations by first event): the last iteration that starts at or before the alloc, if the
  // alloc is not past its end.
  size_t next_iter = 0;
  for (AllocFact& a : f.allocs) {
    while (next_iter < f.iterations.size() && f.iterations[next_iter].first_event <= a.event)
      ++next_iter;
    a.iteration = next_iter > 0 && a.event <= f.iterations[next_iter - 1].last_event
                      ? static_cast<int>(next_iter - 1)
                      : -1;
  }
  categorizeAllocations(f, cache);

  return f;
}

struct DeviceSession::Pending {
  std::map<int64_t, uint32_t> live, layout;             // event -> MomentReason bits
  bool series = false;                                  // requestSeries
  std::optional<std::pair<int64_t, int64_t>> stepping;  // requestStepping
};

DeviceSession::DeviceSession(const format::Snapshot& snap, int64_t device,
                             const SessionOptions& options)
    : snap_(snap), stack_facts_(snap, options.stack_facts), pending_(std::make_unique<Pending>()) {
  before_ = replay::passStats()[device];
  facts_ = eventFacts(snap, device, stack_facts_);
  DeviceFacts& f = facts_;
  // The backward pass, then forward pass 1, over the events the facts hold.
  replayer_ = std::make_unique<replay::DeviceReplayer>(snap, device, f.events);
  const auto n = static_cast<int64_t>(f.events.size());
  // The requested bytes after each iteration's last event (past the trace: its end).
  std::vector<std::pair<int64_t, size_t>> ends;
  for (size_t k = 0; k < f.iterations.size(); ++k)
    ends.push_back({std::min(f.iterations[k].last_event, n - 1), k});
  std::sort(ends.begin(), ends.end());
  f.requested_at_iteration_end.assign(f.iterations.size(), 0);
  size_t next_end = 0;
  while (next_end < ends.size() && ends[next_end].first < 0) {
    f.requested_at_iteration_end[ends[next_end].second] = replayer_->startCounters().requested;
    ++next_end;
  }
  // Checkpoints of pass 1 for pass 2 (DeviceReplayer::keepCheckpoints): pass 2 starts each moment
  // from the latest one before it instead of from the start.
  if (options.checkpoints)
    replayer_->keepCheckpoints(
        std::max(kMinCheckpointSpacing, f.events.size() / replay::kMaxCheckpoints));
  f.has_series = options.series;
  if (f.has_series) {
    f.series.reserve(f.events.size() + 1);
    f.series.push_back(replayer_->startCounters());
  }
  const size_t width =
      std::max<size_t>(1, (f.events.size() + kProfileBuckets - 1) / kProfileBuckets);
  f.profile.resize((f.events.size() + width - 1) / width);
  f.summary = replay::summarizeDeviceWith(*replayer_, [&](size_t i, const replay::Counters& c) {
    if (f.has_series) f.series.push_back(c);
    ProfileBucket& b = f.profile[i / width];
    if (i % width == 0) b.first_event = static_cast<int64_t>(i);
    b.last_event = static_cast<int64_t>(i);
    if (b.first_time_us < 0) b.first_time_us = f.events[i].time_us;
    b.max_active = std::max(b.max_active, c.active());
    b.min_reserved = std::min(b.min_reserved, c.reserved);
    while (next_end < ends.size() && ends[next_end].first == static_cast<int64_t>(i)) {
      f.requested_at_iteration_end[ends[next_end].second] = c.requested;
      ++next_end;
    }
  });
  f.passes = minus(replay::passStats()[device], before_);
}

DeviceSession::~DeviceSession() = default;

namespace {

bool request(std::map<int64_t, uint32_t>& m, int64_t event, uint32_t reason, size_t bound,
             int64_t n) {
  if (event < -1 || event >= n) return false;
  auto it = m.find(event);
  if (it != m.end()) {
    it->second |= reason;
    return true;
  }
  if (m.size() >= bound) return false;
  m.emplace(event, reason);
  return true;
}

}  // namespace

bool DeviceSession::requestLive(int64_t event, uint32_t reason) {
  if (visited_) return false;
  return request(pending_->live, event, reason, kMaxLiveMoments,
                 static_cast<int64_t>(facts_.events.size()));
}

bool DeviceSession::requestLayout(int64_t event, uint32_t reason) {
  if (visited_) return false;
  return request(pending_->layout, event, reason, kMaxLayoutMoments,
                 static_cast<int64_t>(facts_.events.size()));
}

std::vector<FindingMoment> findingMoments(const DeviceFacts& f) {
  const replay::DeviceSummary& s = f.summary;
  const auto n = static_cast<int64_t>(f.events.size());
  std::vector<FindingMoment> out = {
      {s.peak_requested.event, kMomentPeakRequested},
      {s.peak_active.event, kMomentPeakActive},
      {f.iterations.empty() ? -1 : f.iterations.front().first_event - 1,
       kMomentBeforeFirstIteration},
      {n - 1, kMomentEnd}};
  for (size_t k = 0; k < s.ooms.size(); ++k) {
    if (oomHasVerdict(k, s.ooms.size())) out.push_back({s.ooms[k].event, kMomentOom});
  }
  return out;
}

void DeviceSession::requestFindingMoments(size_t layout_ooms) {
  size_t ooms = 0;
  for (const FindingMoment& m : findingMoments(facts_)) {
    requestLive(m.event, m.reason);
    if (m.reason == kMomentOom && ooms++ < layout_ooms) requestLayout(m.event, kMomentOom);
  }
}

bool DeviceSession::requestSeries() {
  if (visited_) return false;
  if (!facts_.has_series) pending_->series = true;
  return true;
}

bool DeviceSession::requestStepping(int64_t first, int64_t last) {
  const auto n = static_cast<int64_t>(facts_.events.size());
  if (visited_ || first < 0 || first > last || last >= n) return false;
  pending_->stepping = {first, last};
  return true;
}

void DeviceSession::visit() {
  if (visited_) return;
  visited_ = true;
  DeviceFacts& f = facts_;
  const Pending& p = *pending_;
  std::map<int64_t, uint32_t> all;
  for (const auto& [e, r] : p.live) all[e] |= r;
  for (const auto& [e, r] : p.layout) all[e] |= r;
  const bool series = p.series && !f.has_series;
  if (!all.empty() || series || p.stepping) {
    std::unique_ptr<replay::DeviceAllocatorModel> model;
    std::optional<SteppingRecorder> stepping;
    if (p.stepping) stepping.emplace(p.stepping->first, p.stepping->second);
    if (!p.layout.empty() || stepping)
      model = std::make_unique<replay::DeviceAllocatorModel>(snap_, f.device, *replayer_);
    replay::DeviceReplayer& r = *replayer_;
    const auto n = static_cast<int64_t>(f.events.size());
    // The live set after the last event (kMomentEnd) is where forward pass 1 left the replayer:
    // it is taken from there, so pass 2 stops at the moment before it instead of stepping the
    // whole trace again (the replay is deterministic: pass 2 would reach the same state). Not for
    // a moment that also needs the model's layout, which pass 2 steps to.
    std::optional<MomentFacts> end;
    if (n > 0 && !all.empty() && all.rbegin()->first == n - 1 && p.live.count(n - 1) != 0 &&
        p.layout.count(n - 1) == 0 && r.next() == f.events.size()) {
      MomentFacts m;
      m.event = n - 1;
      m.time_us = f.events.back().time_us;
      m.reasons = all.rbegin()->second;
      m.at = r.counters();
      m.has_live = true;
      m.live = r.live();
      end = std::move(m);
      all.erase(std::prev(all.end()));
    }
    r.reset();
    if (series) {
      f.series.reserve(f.events.size() + 1);
      f.series.push_back(r.counters());
    }
    int64_t last_live = -2;  // the last moment pass 2 copies a live set at
    for (auto l = p.live.rbegin(); l != p.live.rend(); ++l) {
      if (!end || l->first != n - 1) {
        last_live = l->first;
        break;
      }
    }
    size_t copied = 0;  // blocks copied into live sets and layouts (kMaxCopiedBlocks)
    auto capture = [&](int64_t event, uint32_t reasons) {
      MomentFacts m;
      m.event = event;
      m.time_us = event >= 0 ? f.events[static_cast<size_t>(event)].time_us : -1;
      m.reasons = reasons;
      m.at = r.counters();
      if (p.live.count(event) != 0) {
        if (copied + r.live().size() <= kMaxCopiedBlocks) {
          copied += r.live().size();
          m.has_live = true;
          m.live = r.live();
        } else {
          m.over_budget = true;
        }
      }
      if (model && p.layout.count(event) != 0) {
        std::vector<replay::ModelSegment> layout = model->layout();
        size_t blocks = 0;
        for (const auto& seg : layout) blocks += seg.blocks.size();
        m.model_prefix = model->check();
        if (copied + blocks <= kMaxCopiedBlocks) {
          copied += blocks;
          m.has_layout = true;
          m.layout = std::move(layout);
        } else {
          m.over_budget = true;
        }
      }
      f.moments.push_back(std::move(m));
    };
    auto it = all.begin();
    if (it != all.end() && it->first == -1) {
      capture(-1, it->second);
      ++it;
    }
    // One walk: the replayer up to the last live moment (to the end for the series), the model
    // (when a layout is needed) to the end of the trace, for its verdict. Without either the
    // replayer runs from moment to moment (advanceTo steps the same events without a call each).
    if (!model && !series) {
      for (; it != all.end(); ++it) {
        r.advanceTo(it->first);
        capture(it->first, it->second);
      }
    }
    for (size_t i = 0; (model || series) && i < f.events.size(); ++i) {
      const bool replayer_needed =
          series || static_cast<int64_t>(i) <= last_live || it != all.end();
      if (!replayer_needed && !model) break;
      if (replayer_needed) r.step();
      if (series) f.series.push_back(r.counters());
      const auto ii = static_cast<int64_t>(i);
      const bool window = stepping && ii >= stepping->first() && ii <= stepping->last();
      if (window) {
        if (ii == stepping->first()) stepping->start(model->core());
        stepping->before(model->core(), f.events[i]);
      }
      if (model) model->step();
      if (window) {
        stepping->after(model->core(), f.events[i]);
        if (ii == stepping->last()) stepping->finish(model->core());
      }
      if (it != all.end() && it->first == static_cast<int64_t>(i)) {
        capture(it->first, it->second);
        ++it;
      }
    }
    if (end) {  // last in event order, under the same block budget
      if (copied + end->live.size() <= kMaxCopiedBlocks) {
        copied += end->live.size();
      } else {
        end->has_live = false;
        end->live = U64Map<replay::LiveBlock>();
        end->over_budget = true;
      }
      f.moments.push_back(std::move(*end));
    }
    if (series) f.has_series = true;
    if (stepping) f.stepping = stepping->take();
    if (model) {
      f.model.ran = true;
      f.model.verdict = replay::modelVerdict(*model);
      f.model.estimate_reason = estimateReason(f.model.verdict, f.summary.untrusted);
      f.model.layout_exact = f.model.estimate_reason.empty();
    }
  }
  replayer_->keepCheckpoints(0);  // pass 2 is done: their memory goes
  f.passes = minus(replay::passStats()[f.device], before_);
}

DeviceFacts DeviceSession::take() {
  if (!visited_) visit();
  DeviceFacts out = std::move(facts_);
  facts_.events = {};  // held by `out` now: facts() must not view them after their holder died
  return out;
}

std::vector<DeviceFacts> buildFacts(const format::Snapshot& snap, const FactsRequest& request) {
  std::vector<DeviceFacts> out;
  SessionOptions so;
  so.series = request.series;
  for (int64_t d : snap.devices()) {
    if (request.device && *request.device != d) continue;
    DeviceSession s(snap, d, so);
    if (request.findings) s.requestFindingMoments(request.layout_ooms);
    out.push_back(s.take());
  }
  return out;
}

}  // namespace memforensics::analysis
