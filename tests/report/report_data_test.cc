// report_data_test.cc: the HTML report's data set: keyframes at the right moments with the replayed
// numbers, blocks covering their segments exactly (merged runs included), the icicle adding up to
// the live bytes, and the bounds holding on inputs built to exceed them.
#include "report/html/report_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "analysis/analyze.h"
#include "analysis/whatif/whatif.h"
#include "common/saturating.h"
#include "fixtures/model_builder.h"
#include "fixtures/snapshot_builder.h"
#include "format/load/load.h"
#include "report/render_html.h"

namespace memforensics::analysis {
namespace {

using memforensics::testing::buildSnapshot;
using memforensics::testing::TEvent;
using memforensics::testing::TFrame;
using memforensics::testing::TSnapshot;

constexpr uint64_t kB = 0x7f0000000000ULL;
constexpr uint64_t kMiB = 1048576;

const Keyframe* labelled(const DeviceReportData& d, const std::string& label) {
  for (const auto& k : d.keyframes) {
    if (std::find(k.labels.begin(), k.labels.end(), label) != k.labels.end()) return &k;
  }
  return nullptr;
}

size_t cost(const DeviceReportData& d) {
  size_t n = 0;
  for (const auto& k : d.keyframes) {
    for (const auto& s : k.segments) n += 2 + s.blocks.size();
  }
  return n;
}

void expectBlocksCoverSegments(const DeviceReportData& d) {
  for (const auto& k : d.keyframes) {
    uint64_t reserved = 0;
    for (const auto& s : k.segments) {
      uint64_t sum = 0;
      for (const auto& b : s.blocks) {
        sum += b.size;
        if (b.count > 1) {
          EXPECT_LE(b.free_bytes + b.pending_bytes, b.size);
        }
      }
      EXPECT_EQ(sum, s.size) << "segment 0x" << std::hex << s.address << " at event " << std::dec
                             << k.event;
      reserved += s.size;
    }
    EXPECT_EQ(reserved, k.at.reserved) << "event " << k.event;
  }
}

TEST(ReportData, SampleKeyframesCarryTheReplayedPeaksAndTheOom) {
  auto snap = format::loadSnapshotFile(MEMF_SOURCE_DIR "/snapshots/sample_training.pickle");
  ASSERT_TRUE(snap) << snap.error().describe();
  AnalysisResult a = analyzeSnapshot(*snap);
  ReportData r = buildReportData(*snap);
  ASSERT_EQ(r.devices.size(), 1u);
  const DeviceReportData& d = r.devices[0];
  const auto& sum = a.devices[0].summary;
  ASSERT_TRUE(d.layout_exact);  // the sample is a complete history
  const Keyframe* peak = labelled(d, "requested peak");
  ASSERT_NE(peak, nullptr);
  EXPECT_EQ(peak->event, sum.peak_requested.event);
  EXPECT_EQ(peak->at.requested, sum.peak_requested.bytes);
  const Keyframe* res = labelled(d, "reserved peak");
  ASSERT_NE(res, nullptr);
  EXPECT_EQ(res->at.reserved, sum.peak_reserved.bytes);
  ASSERT_EQ(sum.ooms.size(), 1u);
  const Keyframe* oom = labelled(d, "OOM 1");
  ASSERT_NE(oom, nullptr);
  EXPECT_EQ(oom->event, sum.ooms[0].event);
  EXPECT_EQ(oom->at.allocated, sum.ooms[0].at.allocated);
  EXPECT_TRUE(
      std::is_sorted(d.keyframes.begin(), d.keyframes.end(),
                     [](const Keyframe& x, const Keyframe& y) { return x.event < y.event; }));
  EXPECT_GT(d.keyframes.size(), 10u);  // evenly spaced ones besides the peaks
  expectBlocksCoverSegments(d);
  // Nothing was merged or dropped on a file this small: no caps but the timeline's, if any.
  for (const auto& c : r.caps) EXPECT_EQ(c.rfind("timeline", 0), 0u) << c;
  // Every allocated block names a stack with frames; the sample records them all. Its category is
  // its allocation's, from the one classifier (the session's allocation table).
  const DeviceFacts facts = eventFacts(*snap, 0);
  for (const auto& s : peak->segments) {
    for (const auto& b : s.blocks) {
      if (b.state == MapState::Allocated) {
        ASSERT_GE(b.stack, 0);
        EXPECT_FALSE(r.stacks[static_cast<size_t>(b.stack)].empty());
        ASSERT_GE(b.alloc_event, 0);
        const int32_t a = facts.alloc_at[static_cast<size_t>(b.alloc_event)];
        ASSERT_GE(a, 0);
        EXPECT_EQ(b.category, facts.allocs[static_cast<size_t>(a)].category);
      }
    }
  }
}

TEST(ReportData, IcicleAddsUpToTheLiveBytesAtThePeak) {
  auto snap = format::loadSnapshotFile(MEMF_SOURCE_DIR "/snapshots/sample_training.pickle");
  ASSERT_TRUE(snap);
  ReportData r = buildReportData(*snap);
  const auto& ic = r.devices[0].icicle;
  ASSERT_GT(ic.size(), 3u);
  replay::DeviceReplayer rep(*snap, 0);
  rep.advanceTo(r.devices[0].icicle_event);
  uint64_t live = 0;
  rep.live().forEach([&](uint64_t, const replay::LiveBlock& b) {
    if (!b.pending) live += b.requested;
  });
  EXPECT_EQ(ic[0].bytes, live);
  EXPECT_EQ(ic[0].parent, -1);
  std::vector<uint64_t> children(ic.size(), 0);
  for (size_t i = 1; i < ic.size(); ++i) {
    ASSERT_GE(ic[i].parent, 0);
    ASSERT_LT(static_cast<size_t>(ic[i].parent), i);  // parents first
    children[static_cast<size_t>(ic[i].parent)] += ic[i].bytes;
  }
  for (size_t i = 0; i < ic.size(); ++i)
    EXPECT_EQ(children[i] + ic[i].self, ic[i].bytes) << "node " << i;
}

// The icicle is a view of the one frame tree (frame_tree.h) with the call graph's frame
// selection: each frame holds the bytes `analyze --top-frames` gives it.
TEST(ReportData, IcicleGivesEachFrameTheBytesTopFramesGivesIt) {
  std::vector<std::string> files = {MEMF_SOURCE_DIR "/snapshots/sample_training.pickle",
                                    MEMF_REAL_SNAPSHOTS
                                    "/sidsoc12__spring2024-assignment2-systems__mem_snapshot_"
                                    "ctx128_fp32_train.pickle"};
  for (const auto& file : files) {
    SCOPED_TRACE(file);
    auto snap = format::loadSnapshotFile(file);
    if (!snap) continue;  // the real snapshots may be absent
    AnalyzeOptions ao;
    ao.top_frames = 1000;
    AnalysisResult a = analyzeSnapshot(*snap, ao);
    ReportData r = buildReportData(*snap);
    ASSERT_EQ(r.devices.size(), a.devices.size());
    std::map<std::string, uint64_t> self;
    for (const auto& n : r.devices[0].icicle) {
      if (n.frame >= 0) self[r.frames[static_cast<size_t>(n.frame)].display()] += n.self;
    }
    const auto& cg = a.devices[0].frames_at_peak;
    ASSERT_FALSE(cg.top_self.empty());
    for (const auto& fb : cg.top_self) {
      EXPECT_EQ(self[fb.frame.display()], fb.self_bytes) << fb.frame.display();
    }
  }
}

// A layout is called exact only when the model reproduced the whole device: here every alloc is
// predicted, but the file's final state cannot follow from the trace (the block it says is free
// was never freed), so the page must say estimate, and why.
TEST(ReportData, LayoutIsExactOnlyWhenTheWholeDeviceCheckPassed) {
  TSnapshot t;
  t.segments.push_back({0, kB, 0, "small", {{2 * kMiB, 0, "inactive", {}}}});
  t.traces.push_back({{"segment_alloc", kB, 2 * kMiB, 0, 1}, {"alloc", kB, 4096, 0, 2}});
  ReportData bad = buildReportData(buildSnapshot(t));
  ASSERT_EQ(bad.devices.size(), 1u);
  EXPECT_EQ(bad.devices[0].model.alloc_matches, bad.devices[0].model.allocs);
  EXPECT_FALSE(bad.devices[0].layout_exact);
  EXPECT_FALSE(bad.devices[0].estimate_reason.empty());
  // The same history with a final state that follows from it: exact.
  TSnapshot ok = t;
  ok.segments[0].blocks = {{4096, 4096, "active_allocated", {}},
                           {2 * kMiB - 4096, 0, "inactive", {}}};
  ReportData good = buildReportData(buildSnapshot(ok));
  EXPECT_TRUE(good.devices[0].layout_exact) << good.devices[0].estimate_reason;
  EXPECT_TRUE(good.devices[0].estimate_reason.empty()) << good.devices[0].estimate_reason;
}

// Many small live blocks in many segments: more than a small budget allows.
format::Snapshot crowded(size_t segments, size_t blocks_per_segment) {
  TSnapshot t;
  std::vector<TEvent> ev;
  int64_t time = 1;
  for (size_t s = 0; s < segments; ++s) {
    uint64_t base = kB + s * 2 * kMiB;
    ev.push_back({"segment_alloc", base, 2 * kMiB, 0, time++});
    for (size_t i = 0; i < blocks_per_segment; ++i) {
      TEvent e{"alloc", base + i * 4096, 4096, 0, time++};
      e.frames = {{"model.py", 10 + i % 7, "forward"}, {"train.py", 3, "main"}};
      e.with_frames = true;
      ev.push_back(e);
    }
    // every other block freed: the layout alternates allocated and free
    for (size_t i = 0; i < blocks_per_segment; i += 2) {
      ev.push_back({"free_requested", base + i * 4096, 4096, 0, time});
      ev.push_back({"free_completed", base + i * 4096, 4096, 0, time++});
    }
  }
  t.traces.push_back(std::move(ev));
  return buildSnapshot(t);
}

TEST(ReportData, BlockBudgetMergesSmallBlocksIntoRunsThatKeepTheirBytes) {
  format::Snapshot snap = crowded(8, 400);
  ReportDataOptions opt;
  opt.max_blocks = 1000;
  opt.even_keyframes = 4;
  ReportData r = buildReportData(snap, opt);
  ASSERT_EQ(r.devices.size(), 1u);
  const auto& d = r.devices[0];
  expectBlocksCoverSegments(d);
  bool any_run = false;
  for (const auto& k : d.keyframes) {
    for (const auto& s : k.segments) {
      for (const auto& b : s.blocks) any_run |= b.count > 1;
    }
  }
  EXPECT_TRUE(any_run);
  EXPECT_LE(cost(d),
            2 * opt.max_blocks);  // each keyframe may overshoot its share by a segment's runs
  ASSERT_FALSE(r.caps.empty());
  EXPECT_NE(r.caps[0].find("merged into runs"), std::string::npos) << r.caps[0];
  // The same input with room for everything: no runs.
  ReportData full = buildReportData(snap, ReportDataOptions{});
  for (const auto& k : full.devices[0].keyframes) {
    for (const auto& s : k.segments) {
      for (const auto& b : s.blocks) EXPECT_EQ(b.count, 1u);
    }
  }
}

TEST(ReportData, ManySegmentsThinOutTheEvenlySpacedKeyframesButKeepThePeaks) {
  format::Snapshot snap = crowded(300, 4);
  ReportDataOptions opt;
  opt.max_blocks = 6000;
  ReportData r = buildReportData(snap, opt);
  const auto& d = r.devices[0];
  EXPECT_NE(labelled(d, "requested peak"), nullptr);
  EXPECT_NE(labelled(d, "reserved peak"), nullptr);
  EXPECT_LT(d.keyframes.size(), opt.even_keyframes);
  EXPECT_LE(cost(d), opt.max_blocks + opt.max_blocks / 4);
  bool said = false;
  for (const auto& c : r.caps)
    said |= c.find("evenly spaced keyframes were left out") != std::string::npos;
  EXPECT_TRUE(said);
}

// The over-budget path cuts the data already built (nothing replayed): the timeline keeps the
// points computeTimeline keeps at the coarser bucket, the labelled keyframes all stay, blocks
// still cover their segments, the call tree still adds up, and every index stays valid.
TEST(ReportData, HalvingCutsTheBuiltDataAsCoarserBoundsWould) {
  format::Snapshot snap = crowded(40, 60);
  ReportDataOptions opt;
  opt.max_points = 300;
  ReportData full = buildReportData(snap, opt);
  ReportData r = full;
  ASSERT_EQ(r.devices.size(), 1u);
  const size_t points0 = r.devices[0].timeline.points.size();
  const size_t bucket0 = r.devices[0].timeline.bucket_size;
  ASSERT_TRUE(r.devices[0].timeline.downsampled);
  size_t even0 = 0, labelled0 = 0, pieces0 = 0;
  for (const auto& k : r.devices[0].keyframes) {
    (k.labels.empty() ? even0 : labelled0) += 1;
    for (const auto& s : k.segments) pieces0 += s.blocks.size();
  }
  ASSERT_GE(even0, 4u);

  HalvingCuts c = halveReportData(r);
  const auto& d = r.devices[0];
  // Timeline: the points computeTimeline keeps with the new bucket size.
  EXPECT_EQ(d.timeline.bucket_size % bucket0, 0u);
  EXPECT_GT(d.timeline.bucket_size, bucket0);
  EXPECT_EQ(c.points, points0 - d.timeline.points.size());
  TimelineOptions topt;
  topt.max_points = (d.timeline.total_points + d.timeline.bucket_size - 1) / d.timeline.bucket_size;
  TimelineResult coarse = computeTimeline(snap, topt);
  ASSERT_EQ(coarse.devices[0].bucket_size, d.timeline.bucket_size);
  ASSERT_EQ(coarse.devices[0].points.size(), d.timeline.points.size());
  for (size_t i = 0; i < d.timeline.points.size(); ++i) {
    EXPECT_EQ(coarse.devices[0].points[i].event, d.timeline.points[i].event) << i;
  }
  // Keyframes: every other evenly spaced one; the peaks, OOMs and the end all stay.
  size_t even = 0, labelled_n = 0, pieces = 0;
  for (const auto& k : d.keyframes) {
    (k.labels.empty() ? even : labelled_n) += 1;
    for (const auto& s : k.segments) pieces += s.blocks.size();
  }
  EXPECT_EQ(labelled_n, labelled0);
  EXPECT_EQ(even, (even0 + 1) / 2);
  EXPECT_EQ(c.keyframes, even0 - even);
  EXPECT_LT(pieces, pieces0);
  EXPECT_GT(c.blocks_merged, 0u);
  expectBlocksCoverSegments(d);
  for (const auto& k : d.keyframes) {
    for (const auto& s : k.segments) {
      for (const auto& b : s.blocks) EXPECT_LT(b.stack, static_cast<int32_t>(r.stacks.size()));
    }
  }
  for (const auto& st : r.stacks) {
    for (int32_t f : st) EXPECT_LT(static_cast<size_t>(f), r.frames.size());
  }
  // The call tree: the same live bytes at its root.
  EXPECT_EQ(d.icicle[0].bytes, full.devices[0].icicle[0].bytes);
  // Deterministic, and the note names what went.
  ReportData again = full;
  halveReportData(again);
  EXPECT_EQ(again.devices[0].timeline.points.size(), d.timeline.points.size());
  EXPECT_EQ(again.devices[0].keyframes.size(), d.keyframes.size());
  const std::string note = halvingNote(c, 1, 1000);
  EXPECT_NE(note.find("halved 1 time(s)"), std::string::npos) << note;
  EXPECT_NE(note.find("evenly spaced keyframes"), std::string::npos) << note;
}

TEST(ReportData, DevicesBeyondTheDetailLimitKeepTheirSummaryOnly) {
  TSnapshot t;
  for (int dev = 0; dev < 3; ++dev) {
    uint64_t base = kB + static_cast<uint64_t>(dev) * 1024 * kMiB;
    std::vector<TEvent> ev = {
        {"segment_alloc", base, (4u + static_cast<uint64_t>(dev)) * 2 * kMiB, 0, 1},
        {"alloc", base, 2 * kMiB, 0, 2}};
    if (dev == 0) ev.push_back({"oom", 64 * kMiB, 512 * kMiB, 0, 3});
    t.traces.push_back(ev);
  }
  format::Snapshot snap = buildSnapshot(t);
  ReportDataOptions opt;
  opt.max_detail_devices = 2;
  ReportData r = buildReportData(snap, opt);
  ASSERT_EQ(r.devices.size(), 2u);
  // device 0 has the OOM, device 2 the highest reserved peak; device 1 is left out
  EXPECT_EQ(r.devices[0].device, 0);
  EXPECT_EQ(r.devices[1].device, 2);
  ASSERT_EQ(r.summary_only.size(), 1u);
  EXPECT_EQ(r.summary_only[0], 1);
}

// ---- The allocation view (memory_viz's Active Memory Timeline) ---------------------------------

// Requested bytes of the drawn allocations live right after `event` (-1: the start state).
uint64_t drawnLiveAt(const AllocationView& v, int64_t event) {
  uint64_t n = 0;
  for (const auto& a : v.drawn) {
    if (a.alloc_event <= event && (a.free_event < 0 || a.free_event > event)) n += a.bytes;
  }
  return n;
}

// Per bucket: drawn + rest = the replayed requested bytes at the bucket's moment; the highest is
// the requested peak; the drawn ones are the largest allocations of the trace.
void expectAllocationViewAddsUp(const format::Snapshot& snap, const DeviceReportData& d,
                                const std::string& what, bool halved = false) {
  const AllocationView& v = d.allocations;
  ASSERT_FALSE(v.buckets.empty()) << what;
  replay::DeviceReplayer rep(snap, d.device);
  uint64_t highest = 0;
  for (const auto& b : v.buckets) {
    rep.advanceTo(b.at_event);
    EXPECT_EQ(b.total_bytes, rep.counters().requested) << what << " event " << b.at_event;
    EXPECT_EQ(drawnLiveAt(v, b.at_event) + b.rest_bytes, b.total_bytes)
        << what << " event " << b.at_event;
    highest = std::max(highest, b.total_bytes);
    rep.reset();
  }
  EXPECT_EQ(highest, d.timeline.peak_requested.bytes) << what;
  EXPECT_TRUE(std::is_sorted(v.drawn.begin(), v.drawn.end(),
                             [](const DrawnAllocation& x, const DrawnAllocation& y) {
                               return x.alloc_event < y.alloc_event;
                             }))
      << what;
  // The N largest: no allocation left out is larger than the smallest drawn one.
  // The candidates: the trace's allocs, and the blocks alive before it that it frees (a free of an
  // address no alloc of the trace holds; a free_completed after its free_requested counts once).
  std::vector<uint64_t> all;
  const auto& ev = snap.trace(static_cast<size_t>(d.device));
  std::map<uint64_t, int> held;  // 1 allocated in the trace, 2 its free requested, 3 before
  uint64_t before = 0;
  for (const auto& e : ev) {
    if (e.action == format::Action::Alloc) {
      if (e.size > 0) all.push_back(e.size);
      held[e.addr] = 1;
    } else if (e.action == format::Action::FreeRequested) {
      if (!held.count(e.addr)) {
        held[e.addr] = 3;
        if (e.size > 0) {
          all.push_back(e.size);
          ++before;
        }
      } else if (held[e.addr] == 1) {
        held[e.addr] = 2;
      }
    } else if (e.action == format::Action::FreeCompleted) {
      if (held.count(e.addr)) {
        held.erase(e.addr);
      } else if (e.size > 0) {
        all.push_back(e.size);
        ++before;
      }
    }
  }
  EXPECT_EQ(v.before_trace, before) << what;
  // The rest band's split: its parts add up to the band; the trace's allocations not drawn, live at
  // the bucket's moment, are its parts but the last (their free: free_requested, or
  // free_completed without one); their largest stacks are the ones listed.
  struct Alloc {
    int64_t at = 0, freed = -1;
    uint64_t bytes = 0;
    format::StackId stack = 0;
  };
  std::vector<Alloc> allocs;
  {
    std::map<uint64_t, size_t> open;
    for (size_t i = 0; i < ev.size(); ++i) {
      const auto& e = ev[i];
      if (e.action == format::Action::Alloc) {
        open[e.addr] = allocs.size();
        allocs.push_back({static_cast<int64_t>(i), -1, e.size, e.stack});
      } else if (e.action == format::Action::FreeRequested ||
                 e.action == format::Action::FreeCompleted) {
        auto it = open.find(e.addr);
        if (it == open.end()) continue;
        if (allocs[it->second].freed < 0) allocs[it->second].freed = static_cast<int64_t>(i);
        if (e.action == format::Action::FreeCompleted) open.erase(it);
      }
    }
  }
  std::set<int64_t> drawn_at;
  for (const auto& a : v.drawn) drawn_at.insert(a.alloc_event);
  for (const auto& b : v.buckets) {
    uint64_t parts = 0, traced = 0;
    for (uint64_t x : b.split) parts += x;
    for (size_t c = 0; c < kCategoryCount; ++c) traced += b.split[c];
    EXPECT_EQ(parts, b.rest_bytes) << what << " event " << b.at_event;
    std::map<format::StackId, uint64_t> by_stack;
    uint64_t live = 0;
    for (const auto& a : allocs) {
      if (a.bytes == 0 || drawn_at.count(a.at) || a.at > b.at_event ||
          (a.freed >= 0 && a.freed <= b.at_event))
        continue;
      live += a.bytes;
      by_stack[a.stack] += a.bytes;
    }
    if (v.split_cut == 0) {
      EXPECT_EQ(traced, live) << what << " event " << b.at_event;
    }
    if (!halved) {
      std::vector<uint64_t> top;
      for (const auto& [st, bytes] : by_stack) top.push_back(bytes);
      std::sort(top.rbegin(), top.rend());
      EXPECT_EQ(b.stacks_all, top.size() <= kRestStacks) << what;
      top.resize(std::min(top.size(), kRestStacks));
      std::vector<uint64_t> listed;
      for (const auto& r : b.stacks) {
        listed.push_back(r.bytes);
        EXPECT_TRUE(r.exact) << what;
      }
      EXPECT_EQ(listed, top) << what << " event " << b.at_event;
    }
  }
  std::sort(all.rbegin(), all.rend());
  ASSERT_LE(v.drawn.size(), all.size()) << what;
  EXPECT_EQ(v.capped, v.drawn.size() < all.size()) << what;
  if (!v.drawn.empty()) {
    EXPECT_EQ(v.smallest_drawn, all[v.drawn.size() - 1]) << what;
    uint64_t drawn_sum = 0, top_sum = 0;
    for (const auto& a : v.drawn) drawn_sum += a.bytes;
    for (size_t i = 0; i < v.drawn.size(); ++i) top_sum += all[i];
    EXPECT_EQ(drawn_sum, top_sum) << what;
  }
}

TEST(ReportAllocations, TheLargestAreDrawnAndTheRestBandKeepsEveryByte) {
  auto snap = format::loadSnapshotFile(MEMF_SOURCE_DIR "/snapshots/sample_training.pickle");
  ASSERT_TRUE(snap) << snap.error().describe();
  ReportData full = buildReportData(*snap);
  ASSERT_EQ(full.devices.size(), 1u);
  EXPECT_FALSE(full.devices[0].allocations.capped);  // 155 allocations fit
  EXPECT_EQ(full.devices[0].allocations.drawn.size(), 155u);
  expectAllocationViewAddsUp(*snap, full.devices[0], "sample, all drawn");
  for (size_t n : {size_t{1}, size_t{10}, size_t{40}}) {
    ReportDataOptions opt;
    opt.max_drawn_allocations = n;
    ReportData r = buildReportData(*snap, opt);
    EXPECT_EQ(r.devices[0].allocations.drawn.size(), n);
    EXPECT_TRUE(r.devices[0].allocations.capped);
    expectAllocationViewAddsUp(*snap, r.devices[0], "sample, " + std::to_string(n) + " drawn");
    bool noted = false;
    for (const auto& c : drawnCaps(r)) noted |= c.rfind("allocations:", 0) == 0;
    EXPECT_TRUE(noted);
  }
}

TEST(ReportAllocations, RealFilesAddUpAndStayWithinTheirByteBudget) {
  if (!std::filesystem::is_directory(MEMF_REAL_SNAPSHOTS))
    GTEST_SKIP() << "the real snapshots are not at " << MEMF_REAL_SNAPSHOTS
                 << " (../shared beside the clone)";
  for (const char* name : {"/zidongliu__decomfl__memory.pickle",
                           "/yiyi-philosophy__llm-inference__1.3b_snapshot.pickle",
                           "/sidsoc12__spring2024-assignment2-systems__mem_snapshot_ctx128_fp32_"
                           "train.pickle"}) {
    auto snap = format::loadSnapshotFile(std::string(MEMF_REAL_SNAPSHOTS) + name);
    ASSERT_TRUE(snap) << name;
    for (size_t budget : {kAllocationViewBytes, size_t{20000}}) {
      ReportDataOptions opt;
      opt.allocation_bytes = budget;
      ReportData r = buildReportData(*snap, opt);
      ASSERT_EQ(r.devices.size(), 1u);
      expectAllocationViewAddsUp(*snap, r.devices[0], name);
      // The page's JSON of the view (its numbers; the key names are fixed) stays in the budget.
      AnalysisResult a = analyzeSnapshot(*snap);
      auto doc = nlohmann::json::parse(report::htmlDataJson(a, r));
      const auto& av = doc["devices"][0]["allocations"];
      const size_t numbers =
          av["drawn"].dump().size() + av["times"].dump().size() + av["buckets"].dump().size();
      EXPECT_LE(numbers, budget + 200) << name;
    }
  }
}

// memory_viz draws a block alive before the trace from its start, named by the stack that freed
// it; so does the view, and drawn + rest still add up to the requested bytes.
TEST(ReportAllocations, ABlockFromBeforeTheTraceIsDrawnWithTheStackThatFreedIt) {
  const std::vector<TFrame> freer{{"optim.py", 77, "zero_grad"}, {"train.py", 12, "step"}};
  const std::vector<TFrame> a{{"train.py", 10, "step"}};
  memforensics::testing::ModelBuilder m;
  m.device(0).segment(kB, {.size = 20 * kMiB});
  m.live(2 * kMiB, {.requested = 2 * kMiB, .frames = a});  // alive before and after the trace
  m.freeRequested(kB + 8 * kMiB, 4 * kMiB, {.time_us = 1, .frames = freer});
  m.freeCompleted(kB + 8 * kMiB, 4 * kMiB, {.time_us = 2});
  m.alloc(kB + 8 * kMiB, 1 * kMiB, {.time_us = 3, .frames = a});
  m.free(kB + 8 * kMiB, 1 * kMiB, {.time_us = 4});
  const auto snap = m.build();
  ReportData r = buildReportData(snap);
  ASSERT_EQ(r.devices.size(), 1u);
  const AllocationView& v = r.devices[0].allocations;
  EXPECT_EQ(v.before_trace, 1u);
  ASSERT_EQ(v.drawn.size(), 2u);
  EXPECT_EQ(v.drawn[0].alloc_event, -1);
  EXPECT_EQ(v.drawn[0].free_event, 0);
  EXPECT_EQ(v.drawn[0].bytes, 4 * kMiB);
  ASSERT_GE(v.drawn[0].stack, 0);
  const auto& frames = r.stacks[static_cast<size_t>(v.drawn[0].stack)];
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(r.frames[static_cast<size_t>(frames[0])].name, "zero_grad");
  EXPECT_EQ(v.drawn[1].alloc_event, 2);
  expectAllocationViewAddsUp(snap, r.devices[0], "a block from before the trace");
}

// Hostile sizes in the band: sums of allocations near 2^63 neither wrap nor overflow; the split
// still adds up to the band, and a stack's bytes never exceed the parts it is part of.
TEST(ReportAllocations, TheSplitOfHugeAllocationsStaysWithinTheBand) {
  const std::vector<TFrame> a{{"train.py", 10, "step"}};
  const std::vector<TFrame> b{{"train.py", 20, "other"}};
  memforensics::testing::ModelBuilder m;
  const uint64_t huge = uint64_t{1} << 62;
  m.device(0).segment(kB, {.size = 64 * kMiB});
  for (int i = 0; i < 4; ++i) {
    m.alloc(kB + static_cast<uint64_t>(i) * 2 * kMiB, huge + static_cast<uint64_t>(i),
            {.time_us = 1 + i, .frames = i % 2 ? a : b});
  }
  const auto snap = m.build();
  ReportDataOptions opt;
  opt.max_drawn_allocations = 1;
  ReportData r = buildReportData(snap, opt);
  ASSERT_EQ(r.devices.size(), 1u);
  const AllocationView& v = r.devices[0].allocations;
  ASSERT_FALSE(v.buckets.empty());
  for (const auto& bk : v.buckets) {
    uint64_t parts = 0, traced = 0;
    for (uint64_t x : bk.split) parts = addSat(parts, x);
    for (size_t c = 0; c < kCategoryCount; ++c) traced = addSat(traced, bk.split[c]);
    EXPECT_EQ(parts, bk.rest_bytes);
    for (const auto& st : bk.stacks) {
      EXPECT_LE(st.bytes, traced);
      if (st.exact) EXPECT_LT(st.bytes, ~uint64_t{0});
    }
  }
  auto doc = nlohmann::json::parse(report::htmlDataJson(analyzeSnapshot(snap), r));
  EXPECT_TRUE(doc["devices"][0]["allocations"]["buckets"]["split"].is_array());
}

TEST(ReportAllocations, HalvingMovesTheSmallerHalfIntoTheRestBand) {
  auto snap = format::loadSnapshotFile(MEMF_SOURCE_DIR "/snapshots/sample_training.pickle");
  ASSERT_TRUE(snap);
  ReportData r = buildReportData(*snap);
  const size_t before = r.devices[0].allocations.drawn.size();
  HalvingCuts c = halveReportData(r);
  EXPECT_EQ(r.devices[0].allocations.drawn.size(), std::max(kHalvingMinAllocations, before / 2));
  EXPECT_EQ(c.allocations, before - r.devices[0].allocations.drawn.size());
  expectAllocationViewAddsUp(*snap, r.devices[0], "sample, halved", /*halved=*/true);
  // The halved ones joined the split: each bucket's listed stacks hold at least their bytes.
  for (const auto& b : r.devices[0].allocations.buckets) {
    uint64_t listed = 0;
    for (const auto& s : b.stacks) listed += s.bytes;
    uint64_t traced = 0;
    for (size_t c = 0; c < kCategoryCount; ++c) traced += b.split[c];
    EXPECT_LE(listed, traced);
    EXPECT_LE(b.stacks.size(), kRestStacks);
  }
}

// ---- OOM first, the card's capacity, files without segments ------------------------------------

using memforensics::testing::ModelBuilder;

// Three devices of one job: cuda:0 the largest peak, cuda:1 the OOM, cuda:2 in between.
format::Snapshot threeDevicesOneOom() {
  const uint64_t base = 0x7f0000000000ULL;
  ModelBuilder b;
  b.device(0)
      .segmentAlloc(base, 200 * kMiB, {.time_us = 1})
      .alloc(base, 150 * kMiB, {.time_us = 2})
      .free(base, 150 * kMiB, {.time_us = 3});
  b.device(1)
      .segmentAlloc(base, 40 * kMiB, {.time_us = 1})
      .alloc(base, 30 * kMiB, {.time_us = 2})
      .oom(64 * kMiB, /*device_free=*/10 * kMiB, {.time_us = 3});
  b.device(2).segmentAlloc(base, 80 * kMiB, {.time_us = 1}).alloc(base, 60 * kMiB, {.time_us = 2});
  return b.build();
}

TEST(ReportFocus, ThePageOpensOnTheDeviceWithTheOom) {
  format::Snapshot snap = threeDevicesOneOom();
  AnalysisResult a = analyzeSnapshot(snap);
  ReportData r = buildReportData(snap);
  ASSERT_EQ(r.devices.size(), 3u);
  auto doc = nlohmann::json::parse(report::htmlDataJson(a, r));
  EXPECT_EQ(doc["headline"]["focus_device"], 1);
  // The card's memory: reserved + device free at the OOM (the file names no total).
  EXPECT_EQ(r.devices[1].capacity_bytes, 40 * kMiB + 10 * kMiB);
  EXPECT_EQ(r.devices[1].capacity_basis,
            "implied by the OOMs: reserved + device free at the tightest one, at least the "
            "reserved bytes reached before it");
  EXPECT_EQ(r.devices[0].capacity_bytes, 0u);
  // A total the file names wins.
  snap.device_total_memory = {0, 80 * kMiB, 0};
  ReportData named = buildReportData(snap);
  EXPECT_EQ(named.devices[1].capacity_bytes, 80 * kMiB);
}

// At an OOM PyTorch has already given its cache back: reserved + device free there (30 + 10 MiB)
// is below the 60 MiB the process held before, which the card must have had. The page's card is
// the what-if's implied one, never below a reserved peak it is drawn against.
TEST(ReportFocus, TheCardIsNeverBelowTheReservedReachedBeforeTheOom) {
  const uint64_t base = 0x7f0000000000ULL;
  ModelBuilder b;
  b.segmentAlloc(base, 30 * kMiB, {.time_us = 1})
      .segmentAlloc(base + 32 * kMiB, 30 * kMiB, {.time_us = 2})
      .alloc(base, 20 * kMiB, {.time_us = 3})
      .segmentFree(base + 32 * kMiB, 30 * kMiB, {.time_us = 4})
      .oom(64 * kMiB, /*device_free=*/10 * kMiB, {.time_us = 5});
  format::Snapshot snap = b.build();
  ReportData r = buildReportData(snap);
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_EQ(r.devices[0].capacity_bytes, 60 * kMiB);
  EXPECT_EQ(r.devices[0].capacity_bytes, analysis::impliedCapacity(analysis::traceInput(snap, 0)));
}

// A job that caught 20 OOMs: the first 15 and the last have a keyframe (the OOMs that get a
// verdict), the 4 between have none and the caps say so.
TEST(ReportFocus, TheLastOomKeepsItsKeyframePastTheCap) {
  ModelBuilder b;
  b.device(0).segmentAlloc(kB, 40 * kMiB, {.time_us = 1}).alloc(kB, 30 * kMiB, {.time_us = 2});
  constexpr size_t kOoms = 20;
  for (size_t i = 0; i < kOoms; ++i)
    b.device(0).oom(64 * kMiB, 10 * kMiB, {.time_us = 3 + static_cast<int64_t>(i)});
  format::Snapshot snap = b.build();
  ReportDataOptions opt;
  ASSERT_EQ(opt.max_oom_keyframes, 16u);
  ReportData r = buildReportData(snap, opt);
  ASSERT_EQ(r.devices.size(), 1u);
  for (size_t i = 1; i <= kOoms; ++i) {
    const bool kept = i < 16 || i == kOoms;
    EXPECT_EQ(labelled(r.devices[0], "OOM " + std::to_string(i)) != nullptr, kept) << i;
  }
  bool said = false;
  for (const auto& c : r.caps)
    said |= c.find("4 OOM(s) between the first 15 and the last") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(ReportNoSegments, ADeviceWithoutSegmentInfoHasNoBlockMapButItsCallTrees) {
  format::Snapshot snap = threeDevicesOneOom();
  snap.has_segment_info = false;  // as the profiler reader sets it
  ReportData r = buildReportData(snap);
  ASSERT_EQ(r.devices.size(), 3u);
  for (const auto& d : r.devices) {
    EXPECT_FALSE(d.has_segment_info);
    ASSERT_FALSE(d.keyframes.empty());
    for (const auto& k : d.keyframes) {
      EXPECT_TRUE(k.segments.empty()) << "device " << d.device << " event " << k.event;
      EXPECT_EQ(k.blocks_before_merge, 0u);
      // the requested peak's tree is the device's own (icicle); the others come from live sets
      EXPECT_EQ(k.icicle_source,
                k.event == d.icicle_event ? IcicleSource::None : IcicleSource::Live);
    }
  }
  AnalysisResult a = analyzeSnapshot(snap);
  auto doc = nlohmann::json::parse(report::htmlDataJson(a, r));
  for (const auto& d : doc["devices"]) {
    EXPECT_EQ(d["has_segment_info"], false);
    for (const auto& k : d["keyframes"]) EXPECT_TRUE(k["segments"].empty());
  }
  // With segment info the same file draws its layouts.
  format::Snapshot with = threeDevicesOneOom();
  ReportData w = buildReportData(with);
  size_t segments = 0;
  for (const auto& k : w.devices[1].keyframes) segments += k.segments.size();
  EXPECT_GT(segments, 0u);
}

// Each keyframe's call tree adds up to the live (not pending) requested bytes at its moment, so
// the tree can follow a clicked moment.
TEST(ReportMoments, EveryKeyframeCallTreeAddsUpToItsLiveBytes) {
  auto snap = format::loadSnapshotFile(MEMF_SOURCE_DIR "/snapshots/sample_training.pickle");
  ASSERT_TRUE(snap);
  ReportData r = buildReportData(*snap);
  const auto& d = r.devices[0];
  size_t trees = 0;
  for (const auto& k : d.keyframes) {
    if (k.icicle.empty()) continue;
    ++trees;
    replay::DeviceReplayer rep(*snap, 0);
    rep.advanceTo(k.event);
    uint64_t live = 0;
    rep.live().forEach([&](uint64_t, const replay::LiveBlock& b) {
      if (!b.pending) live += b.requested;
    });
    EXPECT_EQ(k.icicle[0].bytes, live) << "event " << k.event;
  }
  // kMomentIcicles of them (the requested peak has the device's full tree), labelled ones first
  ASSERT_GT(d.keyframes.size(), kMomentIcicles + 1);
  EXPECT_EQ(trees, kMomentIcicles);
  for (const auto& k : d.keyframes) {
    if (!k.labels.empty() && k.event != d.icicle_event) EXPECT_FALSE(k.icicle.empty()) << k.event;
  }
}

TEST(ReportFrames, AnUnknownLineTravelsAsNull) {
  TSnapshot t;
  TEvent seg{"segment_alloc", kB, 2 * kMiB, 0, 1};
  TEvent al{"alloc", kB, 4096, 0, 2};
  al.frames = {{"train.py", format::kUnknownLine, "main"}};
  al.with_frames = true;
  t.traces = {{seg, al}};
  format::Snapshot snap = buildSnapshot(t);
  AnalysisResult a = analyzeSnapshot(snap);
  ReportData r = buildReportData(snap);
  const std::string json = report::htmlDataJson(a, r);
  EXPECT_EQ(json.find("18446744073709551615"), std::string::npos);
  auto doc = nlohmann::json::parse(json);
  bool found = false;
  for (const auto& f : doc["frames"]) {
    if (f[0] == "train.py") {
      found = true;
      EXPECT_TRUE(f[2].is_null());
    }
  }
  EXPECT_TRUE(found);
}

namespace stepping {

// The page's rule (viz/report.js applyPatch) on the report's blocks: the blocks after `upto`
// patches of the view.
std::map<uint64_t, StepMapBlock> stepped(const SteppingView& v, size_t upto) {
  std::map<uint64_t, StepMapBlock> m;
  for (const auto& b : v.base) m.emplace(b.address, b);
  for (size_t i = 0; i < upto && i < v.patches.size(); ++i) {
    const StepMapPatch& p = v.patches[i];
    if (p.lo >= p.hi) continue;
    m.erase(m.lower_bound(p.lo), m.lower_bound(p.hi));
    for (const auto& b : p.blocks) m.insert_or_assign(b.address, b);
  }
  return m;
}

replay::Counters sums(const std::map<uint64_t, StepMapBlock>& m) {
  replay::Counters c;
  for (const auto& [a, b] : m) {
    c.reserved += b.size;
    if ((b.code & 3) == 1) c.allocated += b.size;
    if ((b.code & 3) == 2) c.pending += b.size;
    if ((b.code & 3) != 0) c.requested += b.requested;
  }
  return c;
}

bool sameBlocks(const std::map<uint64_t, StepMapBlock>& x, const std::vector<StepMapBlock>& y) {
  if (x.size() != y.size()) return false;
  size_t i = 0;
  for (const auto& [a, b] : x) {
    const StepMapBlock& o = y[i++];
    if (b.address != o.address || b.size != o.size || b.code != o.code ||
        b.requested != o.requested || b.stack != o.stack || b.alloc_event != o.alloc_event ||
        b.segment != o.segment)
      return false;
  }
  return true;
}

// Every keyframe inside the window: the stepped layout has the keyframe's counters.
void expectKeyframesAgree(const DeviceReportData& d, const std::string& what) {
  const SteppingView& v = d.stepping;
  size_t checked = 0;
  for (const auto& k : d.keyframes) {
    if (k.event < v.first_event || k.event > v.last_event) continue;
    const replay::Counters c = sums(stepped(v, static_cast<size_t>(k.event - v.first_event + 1)));
    EXPECT_EQ(c.reserved, k.at.reserved) << what << " event " << k.event;
    EXPECT_EQ(c.allocated, k.at.allocated) << what << " event " << k.event;
    EXPECT_EQ(c.pending, k.at.pending) << what << " event " << k.event;
    EXPECT_EQ(c.requested, k.at.requested) << what << " event " << k.event;
    ++checked;
  }
  EXPECT_GT(checked, 0u) << what;
}

TEST(ReportStepping, TheWholeSampleIsSteppedAndAgreesWithEveryKeyframe) {
  auto snap = format::loadSnapshotFile(MEMF_SOURCE_DIR "/snapshots/sample_training.pickle");
  ASSERT_TRUE(snap) << snap.error().describe();
  ReportData r = buildReportData(*snap);
  ASSERT_EQ(r.devices.size(), 1u);
  const DeviceReportData& d = r.devices[0];
  const auto n = static_cast<int64_t>(snap->trace(0).size());
  ASSERT_FALSE(d.stepping.empty()) << d.stepping.unavailable;
  EXPECT_EQ(d.stepping.first_event, 0);
  EXPECT_EQ(d.stepping.last_event, n - 1);
  EXPECT_EQ(d.stepping.events.size(), static_cast<size_t>(n));
  EXPECT_EQ(d.stepping.patches.size(), static_cast<size_t>(n));
  expectKeyframesAgree(d, "sample");
  // The events are the trace's, their stacks the report's table.
  for (size_t i = 0; i < d.stepping.events.size(); ++i) {
    const auto& e = d.stepping.events[i];
    EXPECT_EQ(e.action, snap->trace(0)[i].action);
    EXPECT_EQ(e.addr, snap->trace(0)[i].addr);
    EXPECT_LT(e.stack, static_cast<int32_t>(r.stacks.size()));
  }
  // The page's JSON of it: the estimate the bound uses is within 10 % of what is written.
  AnalysisResult a = analyzeSnapshot(*snap);
  auto doc = nlohmann::json::parse(report::htmlDataJson(a, r));
  const double written = static_cast<double>(doc["devices"][0]["stepping"].dump().size());
  const double estimate = static_cast<double>(steppingCost(d.stepping));
  EXPECT_NEAR(estimate / written, 1.0, 0.1) << written << " bytes written, " << estimate;
}

TEST(ReportStepping, ABoundNarrowsTheWindowAroundTheOomAndMovesTheBase) {
  auto snap =
      format::loadSnapshotFile(MEMF_SOURCE_DIR "/snapshots/scenarios/dp_imbalance_oom.pickle");
  ASSERT_TRUE(snap) << snap.error().describe();
  ReportDataOptions wide;
  wide.device = 1;  // the device with the OOM
  ReportData full = buildReportData(*snap, wide);
  ASSERT_EQ(full.devices.size(), 1u);
  const SteppingView& fv = full.devices[0].stepping;
  ASSERT_FALSE(fv.empty());
  ASSERT_EQ(fv.first_event, 0);
  for (size_t bound : {size_t{30000}, size_t{15000}}) {
    ReportDataOptions narrow = wide;
    narrow.stepping_bytes = bound;
    ReportData r = buildReportData(*snap, narrow);
    const DeviceReportData& d = r.devices[0];
    const SteppingView& v = d.stepping;
    ASSERT_FALSE(v.empty()) << v.unavailable;
    EXPECT_LE(steppingCost(v), bound);
    EXPECT_GE(v.events.size(), kSteppingMinEvents);
    // Around the first OOM, about three events before it for one after.
    ASSERT_FALSE(d.timeline.ooms.empty());
    EXPECT_EQ(v.focus_event, d.timeline.ooms.front().event);
    EXPECT_GE(v.focus_event, v.first_event);
    EXPECT_LE(v.focus_event, v.last_event);
    const double before = static_cast<double>(v.focus_event - v.first_event);
    const double after = static_cast<double>(v.last_event - v.focus_event);
    if (bound == 15000) {  // small enough to end on neither side of the trace
      EXPECT_GT(v.first_event, 0);
      EXPECT_LT(v.last_event, fv.last_event);
      EXPECT_NEAR(before / (before + after), 0.75, 0.05);
    }
    // The moved base is the whole trace's layout after first - 1, and the patches are the same.
    EXPECT_TRUE(sameBlocks(stepped(fv, static_cast<size_t>(v.first_event)), v.base));
    expectKeyframesAgree(d, "bound " + std::to_string(bound));
  }
  // Halving: half the window, around the same moment.
  ReportData h = full;
  const size_t events = h.devices[0].stepping.events.size();
  const HalvingCuts cut = halveReportData(h);
  const SteppingView& hv = h.devices[0].stepping;
  EXPECT_LE(steppingCost(hv), steppingCost(fv) / 2);
  EXPECT_EQ(cut.stepped_events, events - hv.events.size());
  EXPECT_EQ(hv.focus_event, fv.focus_event);
  EXPECT_TRUE(sameBlocks(stepped(fv, static_cast<size_t>(hv.first_event)), hv.base));
  EXPECT_NE(halvingNote(cut, 1, 1000).find("events of the stepping window"), std::string::npos);
}

TEST(ReportStepping, ALayoutOverTheBoundHasNoSteppingAndSaysWhy) {
  auto snap =
      format::loadSnapshotFile(MEMF_SOURCE_DIR "/snapshots/scenarios/dp_imbalance_oom.pickle");
  ASSERT_TRUE(snap) << snap.error().describe();
  ReportDataOptions opt;
  opt.device = 1;
  opt.stepping_bytes = 300;  // less than the window's starting blocks
  ReportData r = buildReportData(*snap, opt);
  const SteppingView& v = r.devices[0].stepping;
  EXPECT_TRUE(v.empty());
  EXPECT_TRUE(v.patches.empty() && v.base.empty() && v.events.empty());
  EXPECT_NE(
      v.unavailable.find("blocks are more than the page's bound on event stepping (300 bytes"),
      std::string::npos)
      << v.unavailable;
}

}  // namespace stepping

namespace segments {

using memforensics::testing::ModelBuilder;

struct Want {
  int64_t first, last;
  uint64_t address, bytes;
};

void expectLives(const SegmentTimeline& t, const std::vector<Want>& want) {
  ASSERT_EQ(t.lives.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("band " + std::to_string(i));
    EXPECT_EQ(t.lives[i].first_event, want[i].first);
    EXPECT_EQ(t.lives[i].last_event, want[i].last);
    EXPECT_EQ(t.lives[i].address, want[i].address);
    EXPECT_EQ(t.lives[i].bytes, want[i].bytes);
  }
}

TEST(ReportSegments, BandsFromSegmentEventsThoseBeforeTheTraceAndThoseAllAlong) {
  const std::vector<TFrame> a{{"train.py", 10, "step"}};
  ModelBuilder m;
  m.device(0).segment(kB, {.size = 20 * kMiB});  // there all along
  m.segmentAlloc(kB + 100 * kMiB, 20 * kMiB, {.time_us = 1, .frames = a});
  m.alloc(kB + 100 * kMiB, 4 * kMiB, {.time_us = 2, .frames = a});
  m.free(kB + 100 * kMiB, 4 * kMiB, {.time_us = 3});
  m.segmentFree(kB + 100 * kMiB, 20 * kMiB, {.time_us = 4});
  m.segmentFree(kB + 200 * kMiB, 2 * kMiB, {.time_us = 5});  // made before the trace began
  const auto snap = m.build();
  ReportData r = buildReportData(snap);
  ASSERT_EQ(r.devices.size(), 1u);
  const SegmentTimeline& t = r.devices[0].segment_timeline;
  expectLives(t,
              {{-1, -1, kB, 20 * kMiB},
               {-1, 5, kB + 200 * kMiB, 2 * kMiB},
               {0, 4, kB + 100 * kMiB, 20 * kMiB}});  // free() is free_requested + free_completed
  EXPECT_TRUE(t.agrees);
  EXPECT_EQ(t.first_disagreement, -2);
  EXPECT_GE(t.lives[2].stack, 0);  // the creating event's stack
  EXPECT_EQ(t.lives[1].stack, -1);
}

TEST(ReportSegments, UnmappingPartOfARangeEndsThatPartOnly) {
  ModelBuilder m;
  m.settings({.conf = "expandable_segments:True", .expandable_segments = true});
  m.device(0);  // the file's final state: the two mapped ranges left
  m.segment(kB, {.expandable = true, .size = 20 * kMiB});
  m.segment(kB + 40 * kMiB, {.expandable = true, .size = 20 * kMiB});
  m.segmentMap(kB, 60 * kMiB, {.time_us = 1});
  m.segmentUnmap(kB + 20 * kMiB, 20 * kMiB, {.time_us = 2});
  const auto snap = m.build();
  ReportData r = buildReportData(snap);
  const SegmentTimeline& t = r.devices[0].segment_timeline;
  expectLives(t, {{0, -1, kB, 20 * kMiB},
                  {0, 1, kB + 20 * kMiB, 20 * kMiB},
                  {0, -1, kB + 40 * kMiB, 20 * kMiB}});
  EXPECT_TRUE(t.lives[0].expandable);
  EXPECT_TRUE(t.agrees);
}

// The check is real: bands whose bytes differ from the replayed reserved bytes are not called
// checked, and the first event where they differ is named.
TEST(ReportSegments, BandsThatDifferFromTheReplayAreNotCalledChecked) {
  ModelBuilder m;
  m.device(0);
  const auto snap = m.build();
  std::vector<format::Event> ev(2);
  ev[0].action = format::Action::SegmentAlloc;
  ev[0].addr = kB;
  ev[0].size = 2 * kMiB;
  ev[1] = ev[0];
  ev[1].action = format::Action::SegmentFree;
  DeviceFacts f;
  f.device = 0;
  f.events = ev;
  f.has_series = true;
  f.series.resize(3);
  f.series[1].reserved = 2 * kMiB;
  auto none = [](format::StackId) { return int32_t{-1}; };
  SegmentTimeline t = segmentTimelineOf(snap, f, 100, none);
  EXPECT_TRUE(t.agrees);
  ASSERT_EQ(t.lives.size(), 1u);
  f.series[2].reserved = 2 * kMiB;  // a replay that kept the segment after its free
  t = segmentTimelineOf(snap, f, 100, none);
  EXPECT_FALSE(t.agrees);
  EXPECT_EQ(t.first_disagreement, 1);
  f.series[2].reserved = 0;
  f.series[0].reserved = kMiB;  // ... or saw memory before the first event
  t = segmentTimelineOf(snap, f, 100, none);
  EXPECT_FALSE(t.agrees);
  EXPECT_EQ(t.first_disagreement, -1);
  // Sizes near 2^64 wrap in the sum without undefined behaviour (sanitizer builds).
  ev[0].size = ev[1].size = (uint64_t{1} << 63);
  ev[0].addr = ev[1].addr = 0x1000;
  f.series.assign(3, {});
  t = segmentTimelineOf(snap, f, 100, none);
  EXPECT_FALSE(t.agrees);
}

TEST(ReportSegments, TheScenariosAgreeWithTheReplayedReservedBytes) {
  size_t devices = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(MEMF_SOURCE_DIR "/snapshots/scenarios")) {
    if (e.path().extension() != ".pickle") continue;
    auto snap = format::loadSnapshotFile(e.path().string());
    ASSERT_TRUE(snap) << e.path();
    ReportData r = buildReportData(*snap);
    for (const auto& d : r.devices) {
      if (d.timeline.points.empty()) continue;
      EXPECT_TRUE(d.segment_timeline.agrees)
          << e.path().filename() << " cuda:" << d.device << " from event "
          << d.segment_timeline.first_disagreement;
      ++devices;
    }
  }
  EXPECT_GT(devices, 10u);
}

}  // namespace segments

}  // namespace
}  // namespace memforensics::analysis
