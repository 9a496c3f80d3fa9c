// phases.cc: training phases from external_annotations, or detected from the allocation stream.
#include "analysis/session/phases.h"

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>

#include "analysis/frames/frame_class.h"
#include "analysis/session/session.h"
#include "common/flat_map.h"

namespace memforensics::analysis {

namespace {

using format::Action;
using format::Event;

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

bool containsNoCase(std::string_view s, std::string_view part) {
  auto lower = [](char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c); };
  if (part.size() > s.size()) return false;
  for (size_t i = 0; i + part.size() <= s.size(); ++i) {
    size_t k = 0;
    while (k < part.size() && lower(s[i + k]) == lower(part[k])) ++k;
    if (k == part.size()) return true;
  }
  return false;
}

// record_function names as PyTorch writes them: "ProfilerStep#12" (torch.profiler's step marker),
// "Optimizer.step#AdamW.step" / "Optimizer.zero_grad#SGD.zero_grad" (optimizer hooks), and user
// scopes such as "## forward ##". The order of the tests matters: "ProfilerStep" contains "Step".
PhaseKind classify(std::string_view name, int* iteration) {
  constexpr std::string_view kStep = "ProfilerStep#";
  if (name.rfind(kStep, 0) == 0) {
    int n = -1;
    auto digits = name.substr(kStep.size());
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    *iteration = ec == std::errc() && p == digits.data() + digits.size() ? n : -1;
    return PhaseKind::Iteration;
  }
  if (containsNoCase(name, "optimizer") || contains(name, ".step")) return PhaseKind::Optimizer;
  if (containsNoCase(name, "backward") || containsNoCase(name, "autograd"))
    return PhaseKind::Backward;
  if (containsNoCase(name, "forward")) return PhaseKind::Forward;
  return PhaseKind::Other;
}

// Times made non-decreasing (a regression would break the binary search), -1 before the first time.
std::vector<int64_t> monotoneTimes(std::span<const Event> ev, bool* any) {
  std::vector<int64_t> t(ev.size(), -1);
  int64_t cur = -1;
  *any = false;
  for (size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].time_us >= 0) {
      cur = std::max(cur, ev[i].time_us);
      *any = true;
    }
    t[i] = cur;
  }
  return t;
}

std::vector<Phase> fromAnnotations(const format::Snapshot& snap, int64_t device,
                                   std::span<const Event> ev) {
  std::vector<Phase> out;
  // No annotation of this device (or of every device): no phases, and no times to look at.
  if (std::none_of(snap.annotations.begin(), snap.annotations.end(),
                   [&](const auto& a) { return a.device == device || a.device == -1; }))
    return out;
  const auto n = static_cast<int64_t>(ev.size());
  // The events' times made non-decreasing, -1 before the first time (monotoneTimes). When every
  // event has a time and they never decrease (the usual trace), that is the events' own times, and
  // the searches read them in place instead of a copy.
  bool in_place = n > 0 && ev[0].time_us >= 0;  // then none is negative if none decreases
  for (size_t i = 1; i < ev.size() && in_place; ++i) {
    if (ev[i].time_us < ev[i - 1].time_us) in_place = false;
  }
  bool any_time = in_place;
  std::vector<int64_t> t;
  if (!in_place) {
    t = monotoneTimes(ev, &any_time);
    if (!any_time) return out;
  }
  // An event belongs to a range when START <= time <= END (both ends inclusive: the clock has
  // microsecond resolution, and events in the same microsecond as the marker are inside it).
  auto lower = [&](int64_t ts) -> int64_t {
    if (in_place)
      return std::lower_bound(ev.begin(), ev.end(), ts,
                              [](const Event& e, int64_t x) { return e.time_us < x; }) -
             ev.begin();
    return std::lower_bound(t.begin(), t.end(), ts) - t.begin();
  };
  auto upper = [&](int64_t ts) -> int64_t {
    if (in_place)
      return std::upper_bound(ev.begin(), ev.end(), ts,
                              [](int64_t x, const Event& e) { return x < e.time_us; }) -
             ev.begin();
    return std::upper_bound(t.begin(), t.end(), ts) - t.begin();
  };
  int64_t first_time = -1;
  if (in_place) {
    first_time = ev.front().time_us;
  } else {
    for (int64_t x : t) {
      if (x >= 0) {
        first_time = x;
        break;
      }
    }
  }
  const int64_t last_time = n > 0 ? (in_place ? ev.back().time_us : t.back()) : -1;

  auto make = [&](std::string_view name) {
    Phase p;
    p.source = PhaseSource::Annotation;
    p.name = std::string(name);
    p.kind = classify(name, &p.iteration);
    return p;
  };
  // START/END matched by name, innermost first (a name can nest in itself, e.g. recursive scopes).
  std::unordered_map<format::StrId, std::vector<int64_t>> open;  // name -> START times
  for (const auto& a : snap.annotations) {
    if (a.device != device && a.device != -1) continue;
    std::string_view stage = snap.strings.get(a.stage);
    if (stage == "START") {
      open[a.name].push_back(a.time_us);
    } else if (stage == "END") {
      Phase p = make(snap.strings.get(a.name));
      auto it = open.find(a.name);
      if (it != open.end() && !it->second.empty()) {
        p.start_us = it->second.back();
        it->second.pop_back();
        p.first_event = lower(p.start_us);
      } else {  // START lost (annotation ring buffer wrapped): the range runs from the trace start
        p.open = true;
        p.start_us = first_time;
        p.first_event = 0;
      }
      p.end_us = a.time_us;
      p.last_event = upper(a.time_us) - 1;
      out.push_back(std::move(p));
    }
  }
  for (const auto& [name, starts] : open) {
    for (int64_t s : starts) {  // END not recorded yet when the file was dumped
      Phase p = make(snap.strings.get(name));
      p.open = true;
      p.start_us = s;
      p.first_event = lower(s);
      p.end_us = last_time;
      p.last_event = n - 1;
      out.push_back(std::move(p));
    }
  }
  // Phases inside a step take the step's number: by time, the innermost enclosing ProfilerStep.
  int order = 0;
  std::vector<Phase*> steps;
  for (auto& p : out) {
    if (p.kind == PhaseKind::Iteration) steps.push_back(&p);
  }
  std::stable_sort(steps.begin(), steps.end(),
                   [](const Phase* a, const Phase* b) { return a->start_us < b->start_us; });
  for (Phase* s : steps) {
    if (s->iteration < 0) s->iteration = order;
    ++order;
  }
  if (steps.empty()) return out;
  // The enclosing step of a phase: the last step (by start) with start <= the phase's start and
  // end >= its end. A max-tree over the steps' ends finds it in O(log steps) per phase (a scan of
  // every step per phase was quadratic: 50,000 steps and 50,000 other ranges took minutes).
  const size_t n_steps = steps.size();
  size_t width = 1;
  while (width < n_steps) width *= 2;
  std::vector<int64_t> max_end(2 * width, INT64_MIN);
  for (size_t i = 0; i < n_steps; ++i) max_end[width + i] = steps[i]->end_us;
  for (size_t i = width - 1; i >= 1; --i) max_end[i] = std::max(max_end[2 * i], max_end[2 * i + 1]);
  // Rightmost leaf index <= last whose end is >= end_us, or SIZE_MAX.
  auto rightmost = [&](size_t last, int64_t end_us) {
    // Walk down from the root, preferring the right child when it holds a candidate in range.
    struct Frame {
      size_t node, lo, hi;
    };
    std::vector<Frame> todo = {{1, 0, width - 1}};
    while (!todo.empty()) {
      Frame f = todo.back();
      todo.pop_back();
      if (f.lo > last || max_end[f.node] < end_us) continue;
      if (f.node >= width) return f.lo;
      const size_t mid = (f.lo + f.hi) / 2;
      todo.push_back({2 * f.node, f.lo, mid});  // visited after the right child
      todo.push_back({2 * f.node + 1, mid + 1, f.hi});
    }
    return SIZE_MAX;
  };
  for (auto& p : out) {
    if (p.kind == PhaseKind::Iteration) continue;
    auto after = std::upper_bound(steps.begin(), steps.end(), p.start_us,
                                  [](int64_t t, const Phase* s) { return t < s->start_us; });
    if (after == steps.begin()) continue;
    const size_t j = rightmost(static_cast<size_t>(after - steps.begin()) - 1, p.end_us);
    if (j != SIZE_MAX) p.iteration = steps[j]->iteration;
  }
  return out;
}

// ---- Detection from the allocation stream ----------------------------------------------------
//
// The rule (docs/cli.md, "timeline"): every alloc is a token (stack, requested size). A training or
// inference loop repeats the same tokens every step, so a token that occurs exactly once per step
// (the input batch's copy, the loss, an optimizer temporary) occurs k times for k steps, at roughly
// even spacing. Candidates are tokens that occur >= 3 times with even spacing (every gap within
// [median/2, 2*median]; the first may reach 4*median, as the first step also creates optimizer
// state); per occurrence count the earliest such token is tried, so a step starts at its first
// allocation when the trace holds the whole first step. A candidate splits the stream at its
// occurrences; the split is accepted only when
//   * consecutive full segments (but the first) have token multisets that overlap by >= 80%
//     (|A n B| / max(|A|, |B|)); the first segment may differ more (>= 50%, warm-up, lazy state)
//     when there are at least 2 other pairs, otherwise it must meet 80% too;
//   * the tail after the last occurrence is a whole step (>= 80%) or a step cut short (>= 80% of
//     its tokens belong to the previous step, e.g. the step that ran out of memory): it is kept,
//     else dropped;
//   * at least 3 steps remain, and they hold at least half of the allocations; and
//   * not nearly every (90%) allocation with a Python stack in the steps, or in every step but
//     one, passes through one `forward` frame: a user frame, or when the steps run no backward and
//     no optimizer any Python `forward` (then the repeating unit is a layer inside one forward
//     pass, not a step; repeatsInsideOneForward); and
//   * not, when the steps run no backward and no optimizer, every step but the last keeping a
//     quarter of what it allocated alive to the end of the last step (a forward pass holding its
//     activations, or a model loaded tensor by tensor).
// Among accepted splits the most regular wins (highest minimum overlap; then the one covering more
// allocations; then fewer, longer steps; then the earlier start). Anything else gives no Iteration
// phases: none is better than wrong ones.
constexpr double kSameStep = 0.8;
constexpr double kFirstStep = 0.5;

struct Stream {
  std::vector<size_t> event;    // event index of the k-th alloc
  std::vector<uint32_t> token;  // dense token id of the k-th alloc
  uint32_t tokens = 0;
};

// The allocs of the table (session.h allocationTable: in event order, each alloc's event, stack
// and requested size as the event holds them) as tokens.
Stream tokenize(const std::vector<AllocFact>& allocs) {
  Stream s;
  s.event.reserve(allocs.size());
  s.token.reserve(allocs.size());
  U64Map<uint32_t> ids;  // key -> token id (open addressing: one probe per alloc)
  for (const AllocFact& a : allocs) {
    // Exact key: the stack id in the high bits cannot collide with a size below 2^40; larger
    // sizes are mixed in, where a collision would only merge two tokens.
    uint64_t key =
        (uint64_t{a.stack} << 40) ^ a.requested ^ ((a.requested >> 40) * 0x9E3779B97F4A7C15ULL);
    uint32_t token = s.tokens;
    if (const uint32_t* t = ids.find(key))
      token = *t;
    else
      ids.insert(key, s.tokens++);
    s.event.push_back(static_cast<size_t>(a.event));
    s.token.push_back(token);
  }
  return s;
}

// Multiset overlap of two token ranges; `scratch` is all zero on entry and on exit.
struct Overlap {
  size_t common = 0, a = 0, b = 0;
  double sim() const { return std::max(a, b) == 0 ? 1.0 : double(common) / double(std::max(a, b)); }
  double containedInB() const { return a == 0 ? 0.0 : double(common) / double(a); }
};
Overlap overlap(const Stream& s, size_t a0, size_t a1, size_t b0, size_t b1,
                std::vector<int32_t>& scratch) {
  Overlap o{0, a1 - a0, b1 - b0};
  for (size_t i = b0; i < b1; ++i) scratch[s.token[i]]++;
  for (size_t i = a0; i < a1; ++i) {
    if (scratch[s.token[i]] > 0) {
      scratch[s.token[i]]--;
      o.common++;
    }
  }
  for (size_t i = b0; i < b1; ++i) scratch[s.token[i]] = 0;
  return o;
}

struct Split {
  std::vector<std::pair<size_t, size_t>> steps;  // [begin, end) in alloc positions
  bool last_partial = false;
  double min_sim = 0;
  size_t covered = 0;  // allocations inside the steps
  size_t first_pos = 0;
};

std::optional<Split> evaluate(const Stream& s, const std::vector<size_t>& pos,
                              std::vector<int32_t>& scratch) {
  const size_t c = pos.size();
  const size_t n = s.token.size();
  Split sp;
  sp.first_pos = pos[0];
  sp.min_sim = 1.0;
  size_t strict_pairs = c >= 3 ? c - 3 : 0;  // pairs (S_j, S_j+1), j = 1..c-3
  for (size_t j = 1; j + 2 < c; ++j) {
    double sim = overlap(s, pos[j], pos[j + 1], pos[j + 1], pos[j + 2], scratch).sim();
    if (sim < kSameStep) return std::nullopt;
    sp.min_sim = std::min(sp.min_sim, sim);
  }
  bool first_in = false;
  if (c >= 3) {
    double sim = overlap(s, pos[0], pos[1], pos[1], pos[2], scratch).sim();
    first_in = sim >= (strict_pairs >= 2 ? kFirstStep : kSameStep);
    if (first_in && strict_pairs < 2) sp.min_sim = std::min(sp.min_sim, sim);
  }
  if (first_in) sp.steps.emplace_back(pos[0], pos[1]);
  for (size_t j = 1; j + 1 < c; ++j) sp.steps.emplace_back(pos[j], pos[j + 1]);
  // The tail: a whole step, a step cut short, or something else (dropped).
  Overlap tail = overlap(s, pos[c - 1], n, pos[c - 2], pos[c - 1], scratch);
  if (tail.sim() >= kSameStep) {
    sp.steps.emplace_back(pos[c - 1], n);
  } else if (tail.containedInB() >= kSameStep && tail.a <= tail.b) {
    sp.steps.emplace_back(pos[c - 1], n);
    sp.last_partial = true;
  }
  if (sp.steps.size() < 3) return std::nullopt;
  // Steps make up most of a run: a pattern in a small part of it (a model's layers being created
  // at start-up, one loop inside a step) is not the run's period.
  for (const auto& [b, e] : sp.steps) sp.covered += e - b;
  if (2 * sp.covered < n) return std::nullopt;
  return sp;
}

// Does (nearly) every allocation with a Python stack in the steps pass through one `forward` frame
// (same file, line and function)? Then the repeating unit is a layer called from one line of a
// model's forward, not a step. kOneForward (90%), not all: the last layer's segment also holds the
// model's head, the first one its embedding; so the rule holds over all the steps together, or in
// every step but one. The forward frame is a User frame; when the steps run no backward and no
// optimizer (fewer than half of them allocate from autograd or torch/optim code), any Python
// `forward` frame counts, such as a model in an installed package (transformers'
// modeling_qwen3.py:405 forward calling 27 decoder layers): a forward pass alone, with no step
// around it, is no training loop to split.
constexpr double kOneForward = 0.9;

//
// Stacks can lack the frames (C++-only stacks, threads whose Python stack was not captured), so
// the shape is also told by what the steps keep: when they run no backward and no optimizer and
// every step but the last keeps at least kKeptShare of the bytes it allocated alive to the end of
// the last step, the steps are layers of a forward pass that holds its activations for a backward
// that has not come yet (or a model being loaded tensor by tensor), not a loop.
constexpr double kKeptShare = 0.25;

bool repeatsInsideOneForward(const format::Snapshot& snap, std::span<const Event> ev,
                             const Stream& s, const Split& sp, StackFactsCache& facts,
                             const std::vector<size_t>& freed_at) {
  // Per stack: its forward frames as (frame, user?); absent = not a Python stack.
  struct Fw {
    bool python = false;
    std::vector<std::pair<format::FrameId, bool>> frames;
  };
  std::unordered_map<format::StackId, Fw> forwards;
  auto of = [&](format::StackId st) -> const Fw& {
    auto it = forwards.find(st);
    if (it != forwards.end()) return it->second;
    Fw fw;
    for (format::FrameId f : snap.stacks.stack(st)) {
      const FrameFacts& ff = facts.frame(f);
      if (!ff.python) continue;
      fw.python = true;
      if (snap.strings.get(snap.stacks.frame(f).name) != "forward") continue;
      bool seen = false;
      for (const auto& [g, u] : fw.frames) seen = seen || g == f;
      if (!seen) fw.frames.emplace_back(f, ff.kind == FrameKind::User);
    }
    return forwards.emplace(st, std::move(fw)).first->second;
  };
  // Do the steps run a backward pass or an optimizer?
  size_t training = 0;
  for (const auto& [b, e] : sp.steps) {
    bool t = false;
    for (size_t i = b; i < e && !t; ++i) {
      const format::StackId st = ev[s.event[i]].stack;
      if (st == format::kNoStack || st == format::kEmptyStack) continue;
      const StackFacts& f = facts.of(st);
      t = f.backward || f.optimizer;
    }
    training += t ? 1 : 0;
  }
  const bool any_forward = 2 * training < sp.steps.size();
  if (any_forward) {
    const size_t end = s.event[sp.steps.back().second - 1];  // the last step's last allocation
    bool keeps = true;
    for (size_t j = 0; j + 1 < sp.steps.size() && keeps; ++j) {
      uint64_t made = 0, kept = 0;
      for (size_t i = sp.steps[j].first; i < sp.steps[j].second; ++i) {
        const uint64_t size = ev[s.event[i]].size;
        made += size;
        if (freed_at[i] > end) kept += size;
      }
      keeps = made > 0 && static_cast<double>(kept) >= kKeptShare * static_cast<double>(made);
    }
    if (keeps) return true;
  }
  // Hits per forward frame, over all steps and per step.
  std::unordered_map<format::FrameId, size_t> total;
  std::unordered_map<format::FrameId, size_t> steps_covered;
  size_t python = 0;
  std::unordered_map<format::FrameId, size_t> hits;
  for (const auto& [b, e] : sp.steps) {
    hits.clear();
    size_t step_python = 0;
    for (size_t i = b; i < e; ++i) {
      format::StackId st = ev[s.event[i]].stack;
      if (st == format::kNoStack || st == format::kEmptyStack) continue;
      const Fw& fw = of(st);
      if (!fw.python) continue;
      ++step_python;
      for (const auto& [f, user] : fw.frames) {
        if (user || any_forward) ++hits[f];
      }
    }
    python += step_python;
    for (const auto& [f, n] : hits) {
      total[f] += n;
      if (step_python > 0 &&
          static_cast<double>(n) >= kOneForward * static_cast<double>(step_python))
        ++steps_covered[f];
    }
  }
  if (python == 0) return false;
  for (const auto& [f, n] : total) {
    if (static_cast<double>(n) >= kOneForward * static_cast<double>(python)) return true;
  }
  for (const auto& [f, n] : steps_covered) {
    if (n + 1 >= sp.steps.size()) return true;
  }
  return false;
}

std::optional<Split> findSteps(const format::Snapshot& snap, std::span<const Event> ev,
                               const Stream& s, StackFactsCache& facts,
                               const std::vector<AllocFact>& allocs) {
  const size_t n = s.token.size();
  if (n < 6) return std::nullopt;
  // Occurrences of every token (CSR layout).
  std::vector<uint32_t> count(s.tokens, 0);
  for (uint32_t t : s.token) count[t]++;
  std::vector<size_t> begin(s.tokens + 1, 0);
  for (uint32_t t = 0; t < s.tokens; ++t) begin[t + 1] = begin[t] + count[t];
  std::vector<size_t> occ(n), fill(begin.begin(), begin.end() - 1);
  for (size_t i = 0; i < n; ++i) occ[fill[s.token[i]]++] = i;

  // Per occurrence count: how many evenly spaced tokens have it, and the earliest of them.
  struct Cand {
    size_t tokens = 0;
    uint32_t earliest = 0;
    size_t first_pos = SIZE_MAX;
  };
  std::unordered_map<uint32_t, Cand> by_count;
  std::vector<size_t> gaps;
  for (uint32_t t = 0; t < s.tokens; ++t) {
    const uint32_t c = count[t];
    if (c < 3 || c > n / 2) continue;
    gaps.clear();
    for (size_t k = begin[t] + 1; k < begin[t + 1]; ++k) gaps.push_back(occ[k] - occ[k - 1]);
    std::vector<size_t> sorted = gaps;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    const size_t med = sorted[sorted.size() / 2];
    bool even = med >= 2;
    for (size_t k = 0; k < gaps.size() && even; ++k) {
      even = 2 * gaps[k] >= med && gaps[k] <= (k == 0 ? 4 : 2) * med;
    }
    if (!even) continue;
    Cand& cd = by_count[c];
    cd.tokens++;
    if (occ[begin[t]] < cd.first_pos) {
      cd.first_pos = occ[begin[t]];
      cd.earliest = t;
    }
  }
  std::vector<std::pair<uint32_t, Cand>> cands(by_count.begin(), by_count.end());
  std::sort(cands.begin(), cands.end(), [](const auto& a, const auto& b) {
    return a.second.tokens != b.second.tokens ? a.second.tokens > b.second.tokens
                                              : a.first < b.first;
  });
  if (cands.size() > 24) cands.resize(24);

  std::vector<int32_t> scratch(s.tokens, 0);
  // Per allocation (position in the stream): the event that frees it, SIZE_MAX when none does:
  // the table's first free_requested / free_completed of its address before the next alloc there.
  std::vector<size_t> freed_at(n, SIZE_MAX);
  for (size_t pos = 0; pos < n; ++pos) {
    if (allocs[pos].freed >= 0) freed_at[pos] = static_cast<size_t>(allocs[pos].freed);
  }
  std::optional<Split> best;
  for (const auto& [c, cd] : cands) {
    std::vector<size_t> pos(occ.begin() + static_cast<ptrdiff_t>(begin[cd.earliest]),
                            occ.begin() + static_cast<ptrdiff_t>(begin[cd.earliest + 1]));
    auto sp = evaluate(s, pos, scratch);
    if (!sp || repeatsInsideOneForward(snap, ev, s, *sp, facts, freed_at)) continue;
    auto better = [](const Split& a, const Split& b) {
      if (a.min_sim != b.min_sim) return a.min_sim > b.min_sim;
      if (a.covered != b.covered) return a.covered > b.covered;
      if (a.steps.size() != b.steps.size()) return a.steps.size() < b.steps.size();
      return a.first_pos < b.first_pos;
    };
    if (!best || better(*sp, *best)) best = std::move(sp);
  }
  return best;
}

void addSubPhases(StackFactsCache& facts, std::span<const Event> ev, const Phase& step,
                  std::vector<Phase>& out) {
  int64_t bwd[2] = {-1, -1}, opt[2] = {-1, -1};
  for (int64_t i = step.first_event; i <= step.last_event; ++i) {
    if (ev[i].action != Action::Alloc) continue;
    // Sub-phases from the one classifier (frame_class.h), as the categories use it. The optimizer
    // wins: its own temporaries never come from the autograd engine.
    const StackFacts& f = facts.of(ev[i].stack);
    if (f.optimizer) {
      if (opt[0] < 0) opt[0] = i;
      opt[1] = i;
    } else if (f.backward) {
      if (bwd[0] < 0) bwd[0] = i;
      bwd[1] = i;
    }
  }
  auto add = [&](PhaseKind k, const char* what, int64_t first, int64_t last) {
    Phase p;
    p.kind = k;
    p.source = PhaseSource::Detected;
    p.name = std::string(what) + " " + std::to_string(step.iteration);
    p.first_event = first;
    p.last_event = last;
    p.start_us = ev[first].time_us;
    p.end_us = ev[last].time_us;
    p.iteration = step.iteration;
    out.push_back(std::move(p));
  };
  if (bwd[0] >= 0) {
    // Forward: from the step's start to the first backward allocation, when it allocated at all.
    bool fwd_alloc = false;
    for (int64_t i = step.first_event; i < bwd[0] && !fwd_alloc; ++i)
      fwd_alloc = ev[i].action == Action::Alloc;
    if (fwd_alloc) add(PhaseKind::Forward, "forward", step.first_event, bwd[0] - 1);
    add(PhaseKind::Backward, "backward", bwd[0], bwd[1]);
  }
  if (opt[0] >= 0) add(PhaseKind::Optimizer, "optimizer", opt[0], opt[1]);
}

std::vector<Phase> detectIterations(const format::Snapshot& snap, std::span<const Event> ev,
                                    StackFactsCache& facts, const std::vector<AllocFact>& allocs) {
  std::vector<Phase> out;
  Stream s = tokenize(allocs);
  auto sp = findSteps(snap, ev, s, facts, allocs);
  if (!sp) return out;
  // A step's events start at its first allocation, together with the segment_alloc/segment_map
  // that PyTorch records just before it for that allocation.
  auto startOf = [&](size_t pos) {
    size_t e = s.event[pos];
    size_t floor = pos > 0 ? s.event[pos - 1] + 1 : 0;
    while (e > floor &&
           (ev[e - 1].action == Action::SegmentAlloc || ev[e - 1].action == Action::SegmentMap))
      --e;
    return static_cast<int64_t>(e);
  };
  const size_t n_alloc = s.token.size();
  for (size_t j = 0; j < sp->steps.size(); ++j) {
    const auto [b, e] = sp->steps[j];
    Phase p;
    p.kind = PhaseKind::Iteration;
    p.source = PhaseSource::Detected;
    p.iteration = static_cast<int>(j);
    p.name = "iteration " + std::to_string(j);
    if (j + 1 == sp->steps.size() && sp->last_partial) p.name += " (partial)";
    p.first_event = startOf(b);
    p.last_event = e >= n_alloc ? static_cast<int64_t>(ev.size()) - 1 : startOf(e) - 1;
    p.start_us = ev[p.first_event].time_us;
    p.end_us = ev[p.last_event].time_us;
    out.push_back(p);
    addSubPhases(facts, ev, p, out);
  }
  return out;
}

}  // namespace

std::vector<Phase> detectPhases(const format::Snapshot& snap, int64_t device) {
  StackFactsCache cache(snap);
  return detectPhases(snap, device, cache);
}

std::vector<Phase> detectPhases(const format::Snapshot& snap, int64_t device,
                                StackFactsCache& cache) {
  if (device < 0) return {};
  const format::DeviceEvents events(snap, static_cast<size_t>(device));
  return detectPhases(snap, device, events.span(), cache, allocationTable(events.span()));
}

std::vector<Phase> detectPhases(const format::Snapshot& snap, int64_t device,
                                std::span<const format::Event> ev, StackFactsCache& cache,
                                const std::vector<AllocFact>& allocs) {
  if (device < 0) return {};
  std::vector<Phase> out = fromAnnotations(snap, device, ev);
  // Annotations without ProfilerStep markers (e.g. only optimizer scopes) leave the steps unknown:
  // then the stream is searched as well, and each phase says where it came from.
  bool has_steps = std::any_of(out.begin(), out.end(),
                               [](const Phase& p) { return p.kind == PhaseKind::Iteration; });
  if (!has_steps) {
    auto det = detectIterations(snap, ev, cache, allocs);
    out.insert(out.end(), det.begin(), det.end());
  }
  // By first event; the enclosing range first; then by time and name, so the order is stable.
  std::stable_sort(out.begin(), out.end(), [](const Phase& a, const Phase& b) {
    if (a.first_event != b.first_event) return a.first_event < b.first_event;
    if (a.last_event != b.last_event) return a.last_event > b.last_event;
    if (a.kind != b.kind) return a.kind < b.kind;
    return a.start_us < b.start_us;
  });
  return out;
}

std::string_view phaseKindName(PhaseKind k) {
  switch (k) {
    case PhaseKind::Iteration:
      return "iteration";
    case PhaseKind::Forward:
      return "forward";
    case PhaseKind::Backward:
      return "backward";
    case PhaseKind::Optimizer:
      return "optimizer";
    case PhaseKind::Other:
      return "other";
  }
  return "other";
}

}  // namespace memforensics::analysis
