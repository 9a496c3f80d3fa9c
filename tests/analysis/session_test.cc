// session_test.cc: one session per device (issue 12, part 2): the pass bound of every command
// whatever the number of OOMs and detectors, the facts being complete, and the honesty of
// layout figures (exact only where the allocator model reproduced the device).
#include "analysis/session/session.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>

#include "analysis/analyze.h"
#include "analysis/findings/findings.h"
#include "analysis/session/blocks.h"
#include "analysis/session/timeline.h"
#include "fixtures/model_builder.h"
#include "replay/pass_stats.h"

namespace memforensics::analysis {
namespace {

using testing::ModelBuilder;
using testing::TFrame;

constexpr uint64_t kB = 0x7f0000000000ULL;
constexpr uint64_t kMiB = 1048576;

// One 20 MiB segment and `ooms` rounds of: two allocations, a free, a 32 MiB request that fails,
// the other free. With `mispredict`, the first allocation of every round lands 10 MiB into the
// segment, where the allocator (best fit from the segment's start) would not put it.
format::Snapshot manyOoms(int ooms, bool mispredict = false) {
  const std::vector<TFrame> a{{"train.py", 10, "step"}};
  const std::vector<TFrame> b{{"model.py", 20, "forward"}, {"train.py", 11, "step"}};
  ModelBuilder m;
  m.device(0).segmentAlloc(kB, 20 * kMiB, {.time_us = 1});
  int64_t t = 2;
  const uint64_t first = mispredict ? kB + 10 * kMiB : kB;
  const uint64_t second = mispredict ? kB : kB + 2 * kMiB;
  for (int k = 0; k < ooms; ++k) {
    m.alloc(first, 2 * kMiB, {.time_us = t++, .frames = a});
    m.alloc(second, 4 * kMiB, {.time_us = t++, .frames = b});
    m.free(first, 2 * kMiB, {.time_us = t++});
    m.oom(32 * kMiB, kMiB, {.time_us = t++, .frames = b});
    m.free(second, 4 * kMiB, {.time_us = t++});
  }
  return m.build();
}

void expectBound(const replay::PassStats& p, const char* what) {
  SCOPED_TRACE(what);
  EXPECT_LE(p.backward, 1u);
  EXPECT_LE(p.forward, 2u);
  EXPECT_LE(p.model_seeds, 1u);
  EXPECT_LE(p.model_forward, 1u);
}

TEST(Session, AnalyzeWalksEachDeviceAtMostOnceBackwardAndTwiceForwardWhateverTheOoms) {
  const auto snap = manyOoms(12);
  replay::resetPassStats();
  const AnalysisResult r = analyzeSnapshot(snap);
  ASSERT_EQ(r.devices.size(), 1u);
  const auto& d = r.devices[0];
  EXPECT_EQ(d.summary.ooms.size(), 12u);
  size_t oom_findings = 0;
  for (const auto& f : d.findings) oom_findings += f.kind == FindingKind::OomVerdict;
  EXPECT_EQ(oom_findings, 12u);
  const replay::PassStats& p = replay::passStats()[0];
  expectBound(p, "analyze");
  EXPECT_EQ(p.backward, 1u);
  EXPECT_EQ(p.model_seeds, 1u);  // the OOM verdicts read the layout: the model ran, once
  // Events stepped: at most two walks of the 61 events (one for the model).
  EXPECT_LE(p.events_stepped, 2 * snap.trace(0).size());
  EXPECT_LE(p.model_events_stepped, snap.trace(0).size());
  // The facts carry the same counts.
  EXPECT_EQ(d.passes.backward, 1u);
  EXPECT_EQ(d.passes.forward, p.forward);
}

TEST(Session, TimelineAndBlocksStayWithinTheBound) {
  const auto snap = manyOoms(12);
  replay::resetPassStats();
  const TimelineResult tl = computeTimeline(snap);
  ASSERT_EQ(tl.devices.size(), 1u);
  EXPECT_EQ(tl.devices[0].ooms.size(), 12u);
  expectBound(replay::passStats()[0], "timeline");
  EXPECT_EQ(replay::passStats()[0].forward, 1u);  // the series comes from pass 1
  EXPECT_EQ(replay::passStats()[0].model_seeds, 0u);

  for (const BlocksAt& at : {BlocksAt{BlocksAt::Kind::Oom, 0}, BlocksAt{BlocksAt::Kind::Peak, 0},
                             BlocksAt{BlocksAt::Kind::Event, 30}}) {
    replay::resetPassStats();
    auto b = computeBlocks(snap, 0, at);
    ASSERT_TRUE(b.ok()) << b.error().describe();
    expectBound(replay::passStats()[0], "blocks");
  }
}

TEST(Session, FindingsAreAPureFunctionOfTheFacts) {
  const auto snap = manyOoms(12);
  DeviceSession s(snap, 0);
  s.requestFindingMoments(kLayoutOoms);
  const DeviceFacts facts = s.take();
  replay::resetPassStats();
  const auto first = findFindings(snap, facts);
  const auto again = findFindings(snap, facts);
  // No replay inside a detector: nothing was walked.
  EXPECT_EQ(replay::passStats()[0].backward, 0u);
  EXPECT_EQ(replay::passStats()[0].forward, 0u);
  EXPECT_EQ(replay::passStats()[0].model_forward, 0u);
  ASSERT_EQ(first.size(), again.size());
  for (size_t k = 0; k < first.size(); ++k) EXPECT_EQ(first[k].title, again[k].title);
}

// The first `layout_ooms` OOMs (not the first findings of any kind) read the layout.
TEST(Session, LayoutOomsCountsOomsOnly) {
  const auto snap = manyOoms(3);
  FindingsOptions opt;
  opt.layout_ooms = 2;
  DeviceSession s(snap, 0);
  s.requestFindingMoments(opt.layout_ooms);
  const DeviceFacts facts = s.take();
  std::vector<const Finding*> ooms;
  const auto fs = findFindings(snap, facts, opt);
  for (const auto& f : fs)
    if (f.kind == FindingKind::OomVerdict) ooms.push_back(&f);
  ASSERT_EQ(ooms.size(), 3u);
  auto has_layout = [](const Finding& f) {
    for (const auto& e : f.evidence)
      if (e.text.find("free in the request's pool and stream") != std::string::npos) return true;
    return false;
  };
  int with = 0;
  for (const Finding* f : ooms) with += has_layout(*f);
  EXPECT_EQ(with, 2);
}

TEST(Session, ExactLayoutOnlyWhereTheModelReproducedTheDevice) {
  {
    const auto snap = manyOoms(2);
    DeviceSession s(snap, 0);
    s.requestFindingMoments(kLayoutOoms);
    const DeviceFacts f = s.take();
    ASSERT_TRUE(f.model.ran);
    EXPECT_TRUE(f.model.layout_exact) << f.model.estimate_reason;
    EXPECT_EQ(f.model.verdict.alloc_matches, f.model.verdict.allocs);
    const auto fs = findFindings(snap, f);
    ASSERT_FALSE(fs.empty());
    bool exact = false;
    for (const auto& e : fs.front().evidence)
      exact |= e.text == "free in the request's pool and stream (exact block layout)";
    EXPECT_TRUE(exact);
  }
  {
    const auto snap = manyOoms(2, /*mispredict=*/true);
    DeviceSession s(snap, 0);
    s.requestFindingMoments(kLayoutOoms);
    const DeviceFacts f = s.take();
    ASSERT_TRUE(f.model.ran);
    EXPECT_FALSE(f.model.layout_exact);
    EXPECT_LT(f.model.verdict.alloc_matches, f.model.verdict.allocs);
    // "the allocator model predicted X of 4 allocs"
    EXPECT_NE(f.model.estimate_reason.find("predicted"), std::string::npos)
        << f.model.estimate_reason;
    EXPECT_NE(f.model.estimate_reason.find("of 4 allocs"), std::string::npos)
        << f.model.estimate_reason;
    const auto fs = findFindings(snap, f);
    for (const auto& finding : fs) {
      for (const auto& e : finding.evidence)
        EXPECT_EQ(e.text.find("exact"), std::string::npos) << e.text;
      if (finding.kind != FindingKind::OomVerdict) continue;
      bool estimate = false;
      for (const auto& e : finding.evidence)
        estimate |= e.text.find("(estimate: the allocator model predicted") != std::string::npos;
      EXPECT_TRUE(estimate);
    }
    auto b = computeBlocks(snap, 0, {BlocksAt::Kind::Oom, 0});
    ASSERT_TRUE(b.ok());
    // Every prediction up to the first OOM may match; the device as a whole does not.
    EXPECT_FALSE(b->layout_exact);
    EXPECT_FALSE(b->estimate_reason.empty());
  }
}

// A history that cannot lead to the file's final state (the trace frees a block the file says is
// alive at the end): peaks and layout are untrusted, so no finding calls its figures exact.
TEST(Session, UntrustedReplayMakesEveryFindingAnEstimate) {
  const std::vector<TFrame> a{{"train.py", 10, "step"}};
  const auto snap = ModelBuilder()
                        .device(0)
                        .segment(kB, {.size = 20 * kMiB})
                        .live(2 * kMiB, {.frames = a})
                        .alloc(kB, 2 * kMiB, {.time_us = 1, .frames = a})
                        .free(kB, 2 * kMiB, {.time_us = 2})
                        .oom(64 * kMiB, kMiB, {.time_us = 3, .frames = a})
                        .build();
  DeviceSession s(snap, 0);
  s.requestFindingMoments(kLayoutOoms);
  const DeviceFacts f = s.take();
  ASSERT_NE(f.summary.untrusted, 0);
  EXPECT_FALSE(f.model.layout_exact);
  const auto fs = findFindings(snap, f);
  ASSERT_FALSE(fs.empty());
  for (const auto& finding : fs) {
    EXPECT_NE(finding.basis.find("estimate: the trace cannot lead to the file's final state"),
              std::string::npos)
        << finding.basis;
    for (const auto& e : finding.evidence)
      EXPECT_EQ(e.text.find("(exact"), std::string::npos) << e.text;
  }
}

// More OOMs than a session keeps live sets for: the peaks keep theirs, every OOM still has its
// finding, and those past the bound say what they do not show.
// More OOMs than the live-set bound: the verdicts are the first kOomVerdicts - 1 and the last, and
// the session copies the live sets and layouts of those OOMs only, so each has its evidence (the
// last one too: before, it had neither its live set nor its layout past the first 256 OOMs).
TEST(Session, MoreOomsThanTheLiveSetBoundStillReportPeaksAndTheirVerdicts) {
  const int n = static_cast<int>(kMaxLiveMoments) + 20;
  const auto snap = manyOoms(n);
  replay::resetPassStats();
  const AnalysisResult r = analyzeSnapshot(snap);
  ASSERT_EQ(r.devices.size(), 1u);
  const auto& d = r.devices[0];
  expectBound(replay::passStats()[0], "analyze, many OOMs");
  EXPECT_FALSE(d.top_at_peak.empty());
  size_t ooms = 0, not_kept = 0, estimates = 0;
  bool last = false;
  for (const auto& f : d.findings) {
    if (f.kind != FindingKind::OomVerdict) continue;
    ++ooms;
    for (const auto& e : f.evidence)
      not_kept += e.text.rfind("live set at this OOM not kept", 0) == 0;
    estimates += f.basis.find("no block layout") != std::string::npos;
    last |=
        f.title.find("OOM " + std::to_string(n) + " of " + std::to_string(n)) != std::string::npos;
  }
  EXPECT_EQ(ooms, kOomVerdicts);
  EXPECT_TRUE(last);
  EXPECT_EQ(not_kept, 0u);
  EXPECT_EQ(estimates, 0u);
}

TEST(Session, MomentsOutsideTheTraceAreRefusedAndPass2IsSkippedWithoutRequests) {
  const auto snap = manyOoms(1);
  replay::resetPassStats();
  DeviceSession s(snap, 0);
  EXPECT_FALSE(s.requestLive(-2, kMomentAt));
  EXPECT_FALSE(s.requestLayout(static_cast<int64_t>(snap.trace(0).size()), kMomentAt));
  s.visit();
  EXPECT_TRUE(s.facts().moments.empty());
  EXPECT_EQ(replay::passStats()[0].forward, 1u);
  EXPECT_EQ(s.facts().passes.forward, 1u);
}

// The end state is where forward pass 1 left the replayer: pass 2 steps only to the last other
// moment, and the end's live set equals the one a full second walk would copy.
TEST(Session, TheEndMomentComesFromPass1AndPass2StopsAtTheMomentBeforeIt) {
  const auto snap = manyOoms(4);
  const auto n = static_cast<int64_t>(snap.trace(0).size());
  const int64_t mid = n / 2;
  replay::resetPassStats();
  DeviceSession s(snap, 0);
  ASSERT_TRUE(s.requestLive(mid, kMomentAt));
  ASSERT_TRUE(s.requestLive(n - 1, kMomentEnd));
  s.visit();
  // Pass 1: n events; pass 2: events [0, mid] only.
  EXPECT_EQ(s.facts().passes.events_stepped, static_cast<uint64_t>(n + mid + 1));
  const MomentFacts* end = s.facts().at(n - 1);
  ASSERT_NE(end, nullptr);
  ASSERT_TRUE(end->has_live);
  EXPECT_EQ(end->reasons, kMomentEnd);
  // The same moment from a full walk (a second session, the end reached by pass 2 as a layout
  // moment, which pass 2 always steps to).
  DeviceSession full(snap, 0);
  ASSERT_TRUE(full.requestLive(n - 1, kMomentEnd));
  ASSERT_TRUE(full.requestLayout(n - 1, kMomentEnd));
  full.visit();
  const MomentFacts* want = full.facts().at(n - 1);
  ASSERT_NE(want, nullptr);
  ASSERT_TRUE(want->has_live);
  EXPECT_EQ(end->at.requested, want->at.requested);
  EXPECT_EQ(end->at.allocated, want->at.allocated);
  EXPECT_EQ(end->at.reserved, want->at.reserved);
  EXPECT_EQ(end->time_us, want->time_us);
  std::vector<std::pair<uint64_t, uint64_t>> a, b;
  end->live.forEach(
      [&](uint64_t addr, const replay::LiveBlock& x) { a.emplace_back(addr, x.size); });
  want->live.forEach(
      [&](uint64_t addr, const replay::LiveBlock& x) { b.emplace_back(addr, x.size); });
  EXPECT_EQ(a, b);
}

// The allocation table that phase detection and the session share: each alloc's `freed` is the
// first free_requested or free_completed of its address before that address is allocated again,
// as a naive scan (the one phase detection used to run on its own) finds it.
TEST(Session, AllocationTableFreesAreTheFirstFreeBeforeTheAddressIsAllocatedAgain) {
  const std::vector<TFrame> a{{"train.py", 10, "step"}};
  const uint64_t A = kB, B = kB + 4 * kMiB, C = kB + 8 * kMiB;
  ModelBuilder m;
  m.device(0).segmentAlloc(kB, 20 * kMiB, {.time_us = 1});  // 0
  m.alloc(A, kMiB, {.frames = a});                          // 1: freed at 2
  m.freeRequested(A, kMiB);                                 // 2
  m.freeCompleted(A, kMiB);                                 // 3
  m.alloc(A, 2 * kMiB, {.frames = a});                      // 4: freed at 5 (no request)
  m.freeCompleted(A, 2 * kMiB);                             // 5
  m.alloc(B, kMiB, {.frames = a});                          // 6: address reused at once: never
  m.alloc(B, kMiB, {.frames = a});                          // 7: freed at 9
  m.freeRequested(C, kMiB);                                 // 8: unknown block
  m.freeRequested(B, kMiB);                                 // 9
  m.freeRequested(B, kMiB);                                 // 10: twice
  m.freeCompleted(B, kMiB);                                 // 11
  m.freeCompleted(B, kMiB);                                 // 12: nothing left
  m.alloc(A, kMiB, {.frames = a});                          // 13: alive at the end
  m.freeCompleted(C, kMiB);                                 // 14
  const auto snap = m.build();
  const auto ev = snap.trace(0);
  // The naive scan: an alloc is open until the first free of either kind or the next alloc of its
  // address.
  std::vector<int64_t> want;
  std::map<uint64_t, size_t> open;
  for (size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].action == format::Action::Alloc) {
      open[ev[i].addr] = want.size();
      want.push_back(-1);
    } else if (ev[i].action == format::Action::FreeRequested ||
               ev[i].action == format::Action::FreeCompleted) {
      auto it = open.find(ev[i].addr);
      if (it != open.end()) {
        want[it->second] = static_cast<int64_t>(i);
        open.erase(it);
      }
    }
  }
  EXPECT_EQ(want, (std::vector<int64_t>{2, 5, -1, 9, -1}));
  std::vector<int32_t> alloc_at;
  const std::vector<AllocFact> table = allocationTable(ev, &alloc_at);
  const DeviceFacts f = eventFacts(snap, 0);
  ASSERT_EQ(table.size(), want.size());
  ASSERT_EQ(f.allocs.size(), want.size());
  ASSERT_EQ(alloc_at.size(), ev.size());
  EXPECT_EQ(alloc_at, f.alloc_at);
  size_t k = 0;
  for (size_t i = 0; i < ev.size(); ++i) {
    if (ev[i].action != format::Action::Alloc) {
      EXPECT_EQ(alloc_at[i], -1) << i;
      continue;
    }
    EXPECT_EQ(alloc_at[i], static_cast<int32_t>(k)) << i;
    EXPECT_EQ(table[k].event, static_cast<int64_t>(i));
    EXPECT_EQ(table[k].freed, want[k]) << k;
    EXPECT_EQ(f.allocs[k].freed, want[k]) << k;
    EXPECT_EQ(table[k].requested, ev[i].size);
    EXPECT_EQ(table[k].stack, ev[i].stack);
    ++k;
  }
  // Phase detection from the session's table and from its own give the same phases.
  const auto own = detectPhases(snap, 0);
  ASSERT_EQ(own.size(), f.phases.size());
  for (size_t j = 0; j < own.size(); ++j) {
    EXPECT_EQ(own[j].name, f.phases[j].name);
    EXPECT_EQ(own[j].first_event, f.phases[j].first_event);
    EXPECT_EQ(own[j].last_event, f.phases[j].last_event);
  }
}

// Pass 2 starts each moment from pass 1's latest checkpoint before it
// (SessionOptions::checkpoints): the moments' counters and live sets (every block, in table order)
// are those of the walk from the start, on a trace long enough for several checkpoints; fewer
// events are stepped.
TEST(Session, MomentsFromCheckpointsEqualTheWalkFromTheStart) {
  const std::vector<TFrame> a{{"train.py", 10, "step"}};
  ModelBuilder m;
  m.device(0).segmentAlloc(kB, 64 * kMiB, {.time_us = 1});
  int64_t t = 2;
  for (int k = 0; k < 3000; ++k) {
    const uint64_t addr = kB + static_cast<uint64_t>((k * 7) % 53) * kMiB;
    m.alloc(addr, kMiB / 2 + static_cast<uint64_t>(k % 9) * 4096, {.time_us = t++, .frames = a});
    if (k % 5 != 0) m.free(addr, kMiB / 2 + static_cast<uint64_t>(k % 9) * 4096, {.time_us = t++});
  }
  const auto snap = m.build();
  const auto n = static_cast<int64_t>(snap.trace(0).size());
  auto run = [&](bool checkpoints, replay::PassStats* passes) {
    SessionOptions o;
    o.checkpoints = checkpoints;
    DeviceSession s(snap, 0, o);
    s.requestFindingMoments(kLayoutOoms);
    for (int64_t e : {int64_t{-1}, int64_t{5}, n / 3, n / 3 + 1, n / 2, 2 * n / 3, n - 2})
      EXPECT_TRUE(s.requestLive(e, kMomentAt));
    s.visit();
    *passes = s.facts().passes;
    return s.take();
  };
  replay::PassStats with{}, without{};
  const DeviceFacts f = run(true, &with);
  const DeviceFacts g = run(false, &without);
  EXPECT_LT(with.events_stepped, without.events_stepped);
  ASSERT_EQ(f.moments.size(), g.moments.size());
  for (size_t k = 0; k < f.moments.size(); ++k) {
    const MomentFacts& x = f.moments[k];
    const MomentFacts& y = g.moments[k];
    SCOPED_TRACE(y.event);
    EXPECT_EQ(x.event, y.event);
    EXPECT_EQ(x.reasons, y.reasons);
    EXPECT_EQ(x.at.requested, y.at.requested);
    EXPECT_EQ(x.at.allocated, y.at.allocated);
    EXPECT_EQ(x.at.reserved, y.at.reserved);
    EXPECT_EQ(x.at.pending, y.at.pending);
    ASSERT_EQ(x.has_live, y.has_live);
    std::vector<std::tuple<uint64_t, uint64_t, uint64_t, int64_t>> xl, yl;
    x.live.forEach([&](uint64_t ad, const replay::LiveBlock& b) {
      xl.emplace_back(ad, b.requested, b.size, b.alloc_event);
    });
    y.live.forEach([&](uint64_t ad, const replay::LiveBlock& b) {
      yl.emplace_back(ad, b.requested, b.size, b.alloc_event);
    });
    EXPECT_EQ(xl, yl);
  }
  EXPECT_EQ(f.summary.peak_requested.event, g.summary.peak_requested.event);
}

// The series taken in pass 2 (requestSeries: what the report asks for its drawn devices only)
// equals the one pass 1 keeps, counter for counter, whatever else pass 2 does: nothing else
// asked, live sets only (the replayer alone), a layout (the model too), the end moment (taken from
// pass 1), and with or without checkpoints; the moments are the same as without the series; a
// session that kept it in pass 1 ignores the request. Still two forward passes at most.
TEST(Session, TheSeriesTakenInPass2EqualsPass1s) {
  const format::Snapshot snap = manyOoms(40, true);
  const auto n = static_cast<int64_t>(snap.trace(0).size());
  SessionOptions with_series;
  with_series.series = true;
  DeviceSession ref_session(snap, 0, with_series);
  ref_session.requestSeries();  // a no-op: pass 1 has it
  const DeviceFacts ref = ref_session.take();
  ASSERT_TRUE(ref.has_series);
  ASSERT_EQ(ref.series.size(), static_cast<size_t>(n) + 1);
  auto same = [](const replay::Counters& a, const replay::Counters& b) {
    return a.requested == b.requested && a.allocated == b.allocated && a.reserved == b.reserved &&
           a.pending == b.pending;
  };
  enum Ask { kNothing, kLive, kLayout, kEnd };
  for (bool checkpoints : {true, false}) {
    for (Ask ask : {kNothing, kLive, kLayout, kEnd}) {
      SCOPED_TRACE(std::to_string(checkpoints) + " " + std::to_string(ask));
      SessionOptions o;
      o.checkpoints = checkpoints;
      auto visit = [&](bool series) {
        DeviceSession s(snap, 0, o);
        EXPECT_FALSE(s.facts().has_series);
        if (ask == kLive) s.requestLive(n / 3, kMomentAt);
        if (ask == kLayout) s.requestLayout(n / 2, kMomentAt);
        if (ask == kEnd) s.requestLive(n - 1, kMomentEnd);
        if (series) s.requestSeries();
        s.visit();
        expectBound(s.facts().passes, "pass 2 with the series");
        return s.take();
      };
      const DeviceFacts f = visit(true);
      ASSERT_TRUE(f.has_series);
      ASSERT_EQ(f.series.size(), ref.series.size());
      for (size_t i = 0; i < f.series.size(); ++i)
        ASSERT_TRUE(same(f.series[i], ref.series[i])) << "after event " << i;
      const DeviceFacts g = visit(false);
      EXPECT_FALSE(g.has_series);
      EXPECT_TRUE(g.series.empty());
      ASSERT_EQ(f.moments.size(), g.moments.size());
      for (size_t k = 0; k < f.moments.size(); ++k) {
        EXPECT_EQ(f.moments[k].event, g.moments[k].event);
        EXPECT_TRUE(same(f.moments[k].at, g.moments[k].at));
        EXPECT_EQ(f.moments[k].live.size(), g.moments[k].live.size());
        EXPECT_EQ(f.moments[k].layout.size(), g.moments[k].layout.size());
      }
      EXPECT_EQ(f.model.ran, ask == kLayout);
      EXPECT_EQ(f.model.verdict.allocs, g.model.verdict.allocs);
    }
  }
}

// visitSessions keeps every device's session from pass 1 to its visit, so its sessions keep no
// checkpoints (SessionOptions::checkpoints): pass 2 steps what the walk from the start steps, where
// a session with checkpoints steps fewer events. Fails if the copies are kept there (their memory
// would add up over every device of a report).
TEST(Session, SessionsAliveTogetherKeepNoCheckpoints) {
  const std::vector<TFrame> a{{"train.py", 10, "step"}};
  ModelBuilder m;
  for (int64_t d = 0; d < 2; ++d) {
    m.device(d).segmentAlloc(kB, 64 * kMiB, {.time_us = 1});
    int64_t t = 2;
    for (int k = 0; k < 3000; ++k) {
      const uint64_t addr = kB + static_cast<uint64_t>((k * 7) % 53) * kMiB;
      m.alloc(addr, kMiB / 2, {.time_us = t++, .frames = a});
      if (k % 5 != 0) m.free(addr, kMiB / 2, {.time_us = t++});
    }
  }
  const auto snap = m.build();
  const auto n = static_cast<int64_t>(snap.trace(0).size());
  auto ask = [&](DeviceSession& s) {
    for (int64_t e : {n / 3, n / 2, n - 2}) EXPECT_TRUE(s.requestLive(e, kMomentAt));
  };
  auto stepped = [&](bool checkpoints) {
    SessionOptions o;
    o.checkpoints = checkpoints;
    DeviceSession s(snap, 0, o);
    ask(s);
    s.visit();
    return s.facts().passes.events_stepped;
  };
  const std::vector<DeviceFacts> together = visitSessions(
      snap, {0, 1}, SessionOptions{}, 1, [](const std::vector<const DeviceFacts*>&) {},
      [&](size_t, DeviceSession& s) { ask(s); }, [](size_t, DeviceFacts&) {});
  ASSERT_EQ(together.size(), 2u);
  EXPECT_LT(stepped(true), stepped(false));
  EXPECT_EQ(together[0].passes.events_stepped, stepped(false));
}

}  // namespace
}  // namespace memforensics::analysis
