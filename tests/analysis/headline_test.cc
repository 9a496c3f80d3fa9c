// headline_test.cc: OOM first (analysis/findings/headline.h: the focus device, the headline's items
// and their order), device imbalance (cross_device.h) and incomplete history (detect_history.cc),
// each where it must fire and where it must not, on fabricated jobs (fixtures/model_builder.h) and
// the real ring-of-1 snapshot.
#include "analysis/findings/headline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>

#include "analysis/analyze.h"
#include "analysis/findings/cross_device.h"
#include "fixtures/model_builder.h"
#include "format/load/load.h"
#include "report/render.h"

namespace memforensics::analysis {
namespace {

using memforensics::testing::Frames;
using memforensics::testing::ModelBuilder;

constexpr uint64_t kMiB = 1048576;
constexpr uint64_t kBase = 0x7f0000000000ULL;

const Frames kLayer = {{"/home/u/graphqa/models.py", 174, "forward"},
                       {"/home/u/graphqa/train.py", 40, "main"}};
const Frames kOther = {{"/home/u/aux/embed.py", 12, "encode"}};

// One device of a job: a segment holding two tensors of `tensor` bytes from `frames`, both freed
// again, an OOM before the frees when `oom`: a request of `oom_request` bytes, by default twice the
// segment (more than the card).
void addDevice(ModelBuilder& b, int64_t device, uint64_t tensor, const Frames& frames,
               bool oom = false, uint64_t oom_request = 0) {
  const uint64_t base = kBase + static_cast<uint64_t>(device) * (uint64_t{1} << 40);
  const uint64_t seg = 2 * tensor + 2 * kMiB;
  const int64_t t = 100 * device;
  b.device(device)
      .segment(base, {.size = seg})
      .segmentAlloc(base, seg, {.time_us = t + 1})
      .alloc(base, tensor, {.time_us = t + 2, .frames = frames})
      .alloc(base + tensor, tensor, {.time_us = t + 3, .frames = frames});
  if (oom)
    b.oom(oom_request != 0 ? oom_request : 2 * seg, /*device_free=*/kMiB,
          {.time_us = t + 4, .frames = frames});
  b.free(base, tensor, {.time_us = t + 5}).free(base + tensor, tensor, {.time_us = t + 6});
}

const Finding* findKind(const std::vector<Finding>& fs, FindingKind k) {
  auto it = std::find_if(fs.begin(), fs.end(), [&](const Finding& f) { return f.kind == k; });
  return it == fs.end() ? nullptr : &*it;
}

std::string text(const AnalysisResult& r) {
  std::ostringstream out;
  report::renderText(r, out, {.width = 0});  // the words, not the layout
  return out.str();
}

// A 4-device job whose OOM is on cuda:1: every command opens there.
TEST(Headline, FocusIsTheOomDeviceOfAFourDeviceJob) {
  ModelBuilder b;
  addDevice(b, 0, 160 * kMiB, kLayer);
  addDevice(b, 1, 160 * kMiB, kLayer, /*oom=*/true);
  addDevice(b, 2, 160 * kMiB, kLayer);
  addDevice(b, 3, 160 * kMiB, kLayer);
  auto snap = b.build();
  auto r = analyzeSnapshot(snap);
  ASSERT_EQ(r.devices.size(), 4u);
  const Headline h = buildHeadline(r);
  EXPECT_EQ(h.focus_device, 1);
  EXPECT_EQ(h.focus_reason, "the OOM is on cuda:1");
  ASSERT_FALSE(h.items.empty());
  EXPECT_EQ(h.items[0].kind, FindingKind::OomVerdict);
  EXPECT_EQ(h.items[0].device, 1);
  const auto order = deviceOrder(r, h);
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(r.devices[order[0]].summary.device, 1);
  EXPECT_EQ(r.devices[order[1]].summary.device, 0);
  EXPECT_EQ(oomFocusDevice(snap), std::optional<int64_t>(1));

  // The text opens with the headline, and lists cuda:1 before cuda:0.
  const std::string t = text(r);
  EXPECT_EQ(t.find("  headline: cuda:1 first (the OOM is on cuda:1)\n    cuda:1 [high]"),
            t.find('\n') + 1)
      << t.substr(0, 400);
  EXPECT_LT(t.find("\ndevice 1:"), t.find("\ndevice 0:"));
}

// Without an OOM, the device of the most severe finding; the items: OOMs first, then high
// findings by bytes; warnings are counted, not listed.
TEST(Headline, NoOomMostSevereFindingAndItemOrder) {
  AnalysisResult r;
  r.devices.resize(3);
  for (int64_t d = 0; d < 3; ++d) r.devices[d].summary.device = d;
  auto finding = [](int64_t d, FindingKind k, FindingSeverity s, uint64_t bytes) {
    Finding f;
    f.kind = k;
    f.severity = s;
    f.device = d;
    f.bytes = bytes;
    f.title = "t" + std::to_string(d);
    return f;
  };
  r.devices[0].findings.push_back(
      finding(0, FindingKind::CacheBloat, FindingSeverity::Warning, 900 * kMiB));
  r.devices[2].findings.push_back(finding(2, FindingKind::Leak, FindingSeverity::High, 10 * kMiB));
  r.devices[1].findings.push_back(finding(1, FindingKind::Leak, FindingSeverity::High, 50 * kMiB));
  Headline h = buildHeadline(r);
  EXPECT_EQ(h.focus_device, 1);
  EXPECT_EQ(h.focus_reason, "the most severe finding is on cuda:1");
  ASSERT_EQ(h.items.size(), 2u);
  EXPECT_EQ(h.items[0].device, 1);
  EXPECT_EQ(h.items[1].device, 2);
  EXPECT_EQ(h.other_warnings, 1u);

  // An OOM verdict leads the items whatever its bytes, and its device is the focus.
  OomReport oom;
  oom.oom.time_us = 5;
  r.devices[2].summary.ooms.push_back(oom.oom);
  r.devices[2].findings.push_back(
      finding(2, FindingKind::OomVerdict, FindingSeverity::High, 1 * kMiB));
  h = buildHeadline(r);
  EXPECT_EQ(h.focus_device, 2);
  ASSERT_EQ(h.items.size(), 3u);
  EXPECT_EQ(h.items[0].kind, FindingKind::OomVerdict);
  EXPECT_EQ(h.items[1].device, 1);

  // Nothing at all: the first device.
  AnalysisResult quiet;
  quiet.devices.resize(2);
  quiet.devices[0].summary.device = 0;
  quiet.devices[1].summary.device = 1;
  EXPECT_EQ(buildHeadline(quiet).focus_device, 0);
  EXPECT_TRUE(buildHeadline(quiet).items.empty());
}

// The same line allocates 162 MB on cuda:0, 5.3 GB on cuda:1 (which runs out), 561 MB on cuda:2:
// a device-imbalance finding names the line and the uneven split.
TEST(DeviceImbalance, FiresOnTheLineWhoseSizesDiffer) {
  ModelBuilder b;
  addDevice(b, 0, 162 * kMiB, kLayer);
  addDevice(b, 1, 5300 * kMiB, kLayer, /*oom=*/true);
  addDevice(b, 2, 561 * kMiB, kLayer);
  auto snap = b.build();
  auto r = analyzeSnapshot(snap);
  ASSERT_EQ(r.devices.size(), 3u);
  ASSERT_FALSE(r.devices[1].line_sizes.empty());
  EXPECT_EQ(r.devices[1].line_sizes[0].max_bytes, 5300 * kMiB);
  EXPECT_EQ(r.devices[1].line_sizes[0].allocs, 2u);
  const Finding* f = findKind(r.job_findings, FindingKind::DeviceImbalance);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->device, 1);
  EXPECT_EQ(f->severity, FindingSeverity::High);  // the largest device ran out
  ASSERT_FALSE(f->where.empty());
  EXPECT_EQ(f->where[0].display(), "/home/u/graphqa/models.py:174 forward");
  EXPECT_NE(f->title.find("5.18 GiB per tensor on cuda:1"), std::string::npos) << f->title;
  EXPECT_NE(f->title.find("162.00 MiB on cuda:0"), std::string::npos) << f->title;
  EXPECT_NE(f->title.find("split unevenly"), std::string::npos) << f->title;
  // In the headline (high), and in the text as a job finding.
  const Headline h = buildHeadline(r);
  EXPECT_TRUE(std::any_of(h.items.begin(), h.items.end(), [](const HeadlineItem& it) {
    return it.kind == FindingKind::DeviceImbalance;
  }));
  EXPECT_NE(text(r).find("job findings (across devices):"), std::string::npos);
}

// Replicas made of small tensors (32 MiB each, no line 2x larger per tensor anywhere) whose
// requested peaks differ 4x: uneven by their peaks, naming the line that differs most. Within
// kImbalancePeakRatio (or kImbalancePeakMinBytes) they are balanced. Missed before issue 28.
TEST(DeviceImbalance, ReplicasOfSmallTensorsWhosePeaksDiffer) {
  auto job = [](int heavy, int light) {
    ModelBuilder b;
    for (int64_t d = 0; d < 2; ++d) {
      const int n = d == 1 ? heavy : light;
      const uint64_t base = kBase + static_cast<uint64_t>(d) * (uint64_t{1} << 40);
      const uint64_t t = 32 * kMiB;
      b.device(d).segment(base, {.size = n * t}).segmentAlloc(base, n * t, {.time_us = 1});
      for (int i = 0; i < n; ++i) b.alloc(base + i * t, t, {.time_us = 2 + i, .frames = kLayer});
      for (int i = 0; i < n; ++i) b.free(base + i * t, t, {.time_us = 200 + i});
    }
    return analyzeSnapshot(b.build());
  };
  auto r = job(128, 32);  // 4 GiB against 1 GiB
  const Finding* f = findKind(r.job_findings, FindingKind::DeviceImbalance);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->device, 1);
  EXPECT_EQ(f->severity, FindingSeverity::Warning);
  EXPECT_EQ(f->bytes, 96 * 32 * kMiB);
  EXPECT_NE(f->title.find("cuda:1 peaks at 4.00 GiB, cuda:0 at 1.00 GiB (4.0x)"), std::string::npos)
      << f->title;
  ASSERT_FALSE(f->where.empty());
  EXPECT_EQ(f->where[0].display(), "/home/u/graphqa/models.py:174 forward");
  // 1.25x: a remainder batch, not worth a finding.
  EXPECT_EQ(findKind(job(40, 32).job_findings, FindingKind::DeviceImbalance), nullptr);
  // 1.5x but only 512 MiB apart: below kImbalancePeakMinBytes.
  EXPECT_EQ(findKind(job(48, 32).job_findings, FindingKind::DeviceImbalance), nullptr);
}

// A job whose cuda:1 got most of the batch and ran out with live tensors filling its card: the
// imbalance proposes an even split with what each replica would need (the mean of their needs:
// cuda:1's the smallest capacity a replay runs it in), and cuda:1's verdict names it first among
// its smallest changes. Where the mean would not fit the card, neither says it.
TEST(DeviceImbalance, AnEvenSplitIsProposedWhereItFitsTheOomDevice) {
  // cuda:1 holds two tensors of `heavy` and asks for one more; the others hold two of `light`.
  auto job = [](uint64_t heavy, uint64_t light, int64_t devices) {
    ModelBuilder b;
    for (int64_t d = 0; d < devices; ++d)
      addDevice(b, d, d == 1 ? heavy : light, kLayer, /*oom=*/d == 1, /*oom_request=*/heavy);
    return analyzeSnapshot(b.build());
  };
  const auto r = job(4096 * kMiB, 512 * kMiB, 3);
  const Finding* imb = findKind(r.job_findings, FindingKind::DeviceImbalance);
  ASSERT_NE(imb, nullptr);
  ASSERT_EQ(r.devices.size(), 3u);
  const Finding* verdict = findKind(r.devices[1].findings, FindingKind::OomVerdict);
  ASSERT_NE(verdict, nullptr);
  ASSERT_TRUE(verdict->oom.has_value());
  EXPECT_TRUE(verdict->oom->fills_card);
  // The replay serves each 4 GiB request from a segment of its own: three of them.
  EXPECT_EQ(verdict->oom->smallest_capacity_bytes, 3 * 4096 * kMiB);
  // cuda:0 and cuda:2 reserved their 1026 MiB segment; the mean is rounded up.
  const uint64_t each = (2 * 1026 * kMiB + 3 * 4096 * kMiB + 2) / 3;
  const auto split = std::find_if(imb->evidence.begin(), imb->evidence.end(), [](const auto& e) {
    return e.text.find("an even split of the batch across the 3 replicas") != std::string::npos;
  });
  ASSERT_NE(split, imb->evidence.end());
  EXPECT_EQ(split->bytes, each);
  EXPECT_NE(imb->fix.find("within the 8.00 GiB cuda:1 had"), std::string::npos) << imb->fix;
  ASSERT_FALSE(verdict->oom->smallest_changes.empty());
  EXPECT_EQ(verdict->oom->smallest_changes.front().rfind("an even split of the batch", 0), 0u);
  EXPECT_EQ(verdict->fix.rfind("the smallest changes: an even split of the batch across the 3 "
                               "replicas: about 4.67 GiB each",
                               0),
            0u)
      << verdict->fix;
  // Two devices, 4 GiB tensors against 2 GiB: uneven, but the mean (4.00 + 12.00 GiB) / 2 is
  // over 90% of cuda:1's 8.00 GiB: no split is proposed, and the verdict keeps its own changes.
  const auto tight = job(4096 * kMiB, 2048 * kMiB, 2);
  const Finding* imb2 = findKind(tight.job_findings, FindingKind::DeviceImbalance);
  ASSERT_NE(imb2, nullptr);
  EXPECT_EQ(imb2->fix.find("even split"), std::string::npos) << imb2->fix;
  const Finding* verdict2 = findKind(tight.devices[1].findings, FindingKind::OomVerdict);
  ASSERT_NE(verdict2, nullptr);
  EXPECT_EQ(verdict2->fix.find("even split"), std::string::npos) << verdict2->fix;
  EXPECT_NE(verdict2->fix.find("the smallest changes: "), std::string::npos) << verdict2->fix;
  // cuda:1's request alone is larger than its card (twice its segment): its verdict says to split
  // that request, and no even split stands in for it (the mean would come from a guess).
  ModelBuilder b;
  for (int64_t d = 0; d < 3; ++d)
    addDevice(b, d, d == 1 ? 4096 * kMiB : 512 * kMiB, kLayer, /*oom=*/d == 1);
  const auto alone = analyzeSnapshot(b.build());
  const Finding* v3 = findKind(alone.devices[1].findings, FindingKind::OomVerdict);
  ASSERT_NE(v3, nullptr);
  ASSERT_TRUE(v3->oom.has_value());
  EXPECT_FALSE(v3->oom->fills_card);
  EXPECT_EQ(v3->fix.find("even split"), std::string::npos) << v3->fix;
  const Finding* imb3 = findKind(alone.job_findings, FindingKind::DeviceImbalance);
  ASSERT_NE(imb3, nullptr);
  EXPECT_EQ(imb3->fix.find("even split"), std::string::npos) << imb3->fix;
}

// A device of the file with nothing recorded (an empty trace between two others, no segments)
// is listed as such in the text and the JSON, not left out without a word.
TEST(Devices, AnEmptyDeviceIsListedAsNothingRecorded) {
  ModelBuilder b;
  addDevice(b, 0, 64 * kMiB, kLayer);
  addDevice(b, 2, 64 * kMiB, kLayer);
  const format::Snapshot snap = b.build();
  ASSERT_EQ(snap.traceCount(), 3u);
  auto r = analyzeSnapshot(snap);
  EXPECT_EQ(r.devices.size(), 2u);
  EXPECT_EQ(r.empty_devices, std::vector<int64_t>{1});
  EXPECT_NE(text(r).find("device 1: nothing recorded"), std::string::npos) << text(r);
  std::ostringstream js;
  report::renderJson(r, js);
  EXPECT_NE(js.str().find("\"empty_devices\":[1]"), std::string::npos);
  // Only the device asked for.
  AnalyzeOptions one;
  one.device = 1;
  auto only = analyzeSnapshot(snap, one);
  EXPECT_TRUE(only.devices.empty());
  EXPECT_EQ(only.empty_devices, std::vector<int64_t>{1});
  one.device = 0;
  EXPECT_TRUE(analyzeSnapshot(snap, one).empty_devices.empty());
}

// Equal replicas (the same sizes on every device) and devices that do different work (no line in
// common) are no imbalance, even when their peaks differ widely.
TEST(DeviceImbalance, SilentOnBalancedJobsAndOnDifferentWork) {
  {
    ModelBuilder b;
    for (int64_t d = 0; d < 4; ++d) addDevice(b, d, 512 * kMiB, kLayer);
    auto r = analyzeSnapshot(b.build());
    EXPECT_EQ(findKind(r.job_findings, FindingKind::DeviceImbalance), nullptr);
  }
  {
    // Within kImbalanceRatio: a remainder batch (9 vs 8 samples).
    ModelBuilder b;
    addDevice(b, 0, 576 * kMiB, kLayer);
    addDevice(b, 1, 512 * kMiB, kLayer);
    auto r = analyzeSnapshot(b.build());
    EXPECT_EQ(findKind(r.job_findings, FindingKind::DeviceImbalance), nullptr);
  }
  {
    ModelBuilder b;
    addDevice(b, 0, 4096 * kMiB, kLayer);
    addDevice(b, 1, 100 * kMiB, kOther);
    auto r = analyzeSnapshot(b.build());
    EXPECT_TRUE(r.job_findings.empty());
  }
  {
    // Below kImbalanceMinBytes: small lines do not move a peak.
    ModelBuilder b;
    addDevice(b, 0, 2 * kMiB, kLayer);
    addDevice(b, 1, 40 * kMiB, kLayer);
    auto r = analyzeSnapshot(b.build());
    EXPECT_TRUE(r.job_findings.empty());
  }
}

// A ring buffer of one entry: the segments hold ten live blocks, the trace only the free of an
// eleventh that was allocated before it.
format::Snapshot ringOfOne() {
  ModelBuilder b;
  b.segment(kBase, {.size = 64 * kMiB});
  for (int i = 0; i < 10; ++i) b.live(4 * kMiB, {.frames = kLayer});
  b.freeCompleted(kBase + 40 * kMiB, 4 * kMiB, {.time_us = 7});
  return b.build();
}

TEST(IncompleteHistory, RingOfOneCannotExplainTheState) {
  auto r = analyzeSnapshot(ringOfOne());
  ASSERT_EQ(r.devices.size(), 1u);
  const auto& d = r.devices[0];
  EXPECT_EQ(d.summary.events, 1u);
  const Finding* f = findKind(d.findings, FindingKind::IncompleteHistory);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, FindingSeverity::Warning);
  EXPECT_NE(f->title.find("cannot explain"), std::string::npos) << f->title;
  EXPECT_NE(f->fix.find("_record_memory_history(max_entries="), std::string::npos);
  EXPECT_NE(f->fix.find("_dump_snapshot"), std::string::npos);
  EXPECT_NE(f->fix.find("_cuda_attach_out_of_memory_observer"), std::string::npos);
  // The text does not present the absence of an OOM as known.
  const std::string t = text(r);
  EXPECT_EQ(t.find("OOMs: none"), std::string::npos) << t;
  EXPECT_NE(t.find("OOMs: unknown: the history cannot explain an OOM"), std::string::npos);
  EXPECT_EQ(t.find("findings: none"), std::string::npos);
  // And it is in the headline.
  const Headline h = buildHeadline(r);
  ASSERT_EQ(h.items.size(), 1u);
  EXPECT_EQ(h.items[0].kind, FindingKind::IncompleteHistory);
}

// A file PyTorch 2.0 wrote is told the call 2.0 takes: the boolean form with
// trace_alloc_max_entries (the keyword form is 2.1+ and raises a TypeError there), and a dump
// with _snapshot() and pickle (no _dump_snapshot, no OOM observer in 2.0).
TEST(IncompleteHistory, APyTorch20FileIsToldThe20Call) {
  format::Snapshot s = ringOfOne();
  s.traits = {};
  s.traits.has_device_traces = true;  // and nothing newer: era 2.0
  ASSERT_EQ(s.traits.era(), "2.0");
  auto r = analyzeSnapshot(s);
  const Finding* f = findKind(r.devices.at(0).findings, FindingKind::IncompleteHistory);
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->fix.find("_record_memory_history(True, trace_alloc_max_entries=100000, "
                        "trace_alloc_record_context=True)"),
            std::string::npos)
      << f->fix;
  EXPECT_NE(f->fix.find("trace_alloc_max_entries must hold every entry"), std::string::npos);
  EXPECT_NE(f->fix.find("pickle.dump(torch.cuda.memory._snapshot()"), std::string::npos);
  EXPECT_EQ(f->fix.find("max_entries=100000)"), std::string::npos) << f->fix;
  EXPECT_EQ(f->fix.find("_dump_snapshot"), std::string::npos) << f->fix;
  EXPECT_EQ(f->fix.find("_cuda_attach_out_of_memory_observer"), std::string::npos) << f->fix;
}

TEST(IncompleteHistory, NoTraceWithLiveBlocks) {
  ModelBuilder b;
  b.segment(kBase, {.size = 8 * kMiB}).live(2 * kMiB, {.frames = kLayer});
  auto r = analyzeSnapshot(b.build());
  const Finding* f = findKind(r.devices.at(0).findings, FindingKind::IncompleteHistory);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, FindingSeverity::Warning);
  EXPECT_NE(f->title.find("no allocation history"), std::string::npos) << f->title;
}

// The ring wrapped (a block freed in the trace was allocated before it) but the peak is inside the
// trace: only the beginning is missing, info.
TEST(IncompleteHistory, OnlyTheBeginningMissingIsInfo) {
  ModelBuilder b;
  b.segment(kBase, {.size = 64 * kMiB})
      .freeCompleted(kBase, 4 * kMiB, {.time_us = 1})
      .alloc(kBase + 8 * kMiB, 32 * kMiB, {.time_us = 2, .frames = kLayer})
      .free(kBase + 8 * kMiB, 32 * kMiB, {.time_us = 3});
  auto r = analyzeSnapshot(b.build());
  const auto& d = r.devices.at(0);
  EXPECT_GE(d.summary.peak_requested.event, 0);
  const Finding* f = findKind(d.findings, FindingKind::IncompleteHistory);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, FindingSeverity::Info);
  EXPECT_TRUE(buildHeadline(r).items.empty());  // info is not headline material
}

// The two ways a history loses its beginning: a ring buffer (the trace holds exactly
// max_entries entries: a round number) against a recording that began late (any other count;
// the assignment snapshots of ../shared start after warm-up steps with 5,117 to 27,358 entries).
// Each is told its own fix: raise max_entries, or start recording before the model is built.
TEST(IncompleteHistory, ARingBufferIsToldToGrowALateStartToStartEarlier) {
  auto history = [](int allocs) {
    ModelBuilder b;
    b.segment(kBase, {.size = 64 * kMiB}).freeCompleted(kBase, 4 * kMiB, {.time_us = 1});
    int64_t t = 2;
    for (int i = 0; i < allocs; ++i) {
      b.alloc(kBase + 8 * kMiB, 8 * kMiB, {.time_us = t++, .frames = kLayer});
      b.free(kBase + 8 * kMiB, 8 * kMiB, {.time_us = t++});
    }
    return analyzeSnapshot(b.build());
  };
  // The peak (8 MiB) is inside the trace, above the 4 MiB block freed at its start: info.
  // 1 + 3 x 333 = 1000 entries: a ring buffer's size. (free = free_requested + free_completed.)
  auto ring = history(333);
  ASSERT_EQ(ring.devices.at(0).summary.events, 1000u);
  const Finding* f = findKind(ring.devices.at(0).findings, FindingKind::IncompleteHistory);
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->title.find("a ring buffer of 1000 entries dropped"), std::string::npos) << f->title;
  EXPECT_NE(f->fix.find("raise max_entries"), std::string::npos) << f->fix;
  // 1 + 3 x 334 = 1003 entries: the recording began late.
  auto late = history(334);
  ASSERT_EQ(late.devices.at(0).summary.events, 1003u);
  f = findKind(late.devices.at(0).findings, FindingKind::IncompleteHistory);
  ASSERT_NE(f, nullptr);
  EXPECT_NE(f->title.find("the recording began late"), std::string::npos) << f->title;
  EXPECT_EQ(f->fix.find("max_entries so"), std::string::npos) << f->fix;
  EXPECT_NE(f->fix.find("before the model is built"), std::string::npos) << f->fix;
}

TEST(IncompleteHistory, SilentOnACompleteHistory) {
  ModelBuilder b;
  addDevice(b, 0, 64 * kMiB, kLayer);
  auto r = analyzeSnapshot(b.build());
  EXPECT_EQ(findKind(r.devices.at(0).findings, FindingKind::IncompleteHistory), nullptr);
  EXPECT_NE(text(r).find("OOMs: none\n"), std::string::npos);
}

TEST(IncompleteHistory, RealRingOfOneSnapshot) {
  const std::filesystem::path p = std::filesystem::path(MEMF_REAL_SNAPSHOTS) /
                                  "yiyi-philosophy__llm-inference__1.3b_snapshot.pickle";
  if (!std::filesystem::exists(p)) GTEST_SKIP() << p << " absent";
  auto snap = format::loadSnapshotFile(p.string());
  ASSERT_TRUE(snap) << snap.error().describe();
  auto r = analyzeSnapshot(*snap);
  ASSERT_EQ(r.devices.size(), 1u);
  const Finding* f = findKind(r.devices[0].findings, FindingKind::IncompleteHistory);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->severity, FindingSeverity::Warning);
  EXPECT_NE(f->title.find("the trace holds 1 entry while 786 blocks"), std::string::npos)
      << f->title;
  EXPECT_EQ(text(r).find("OOMs: none"), std::string::npos);
}

// The corpus' 4-GPU DataParallel job that runs out of memory on cuda:1 (snapshots/scenarios,
// made by tools/make_scenarios.py): the headline opens on cuda:1 with the OOM, and the imbalance
// names models.py:174 (5305778176 bytes per tensor on cuda:1, 161996800 on cuda:0).
TEST(DeviceImbalance, CorpusDataParallelOom) {
  const std::filesystem::path p =
      std::filesystem::path(MEMF_SOURCE_DIR) / "snapshots/scenarios/dp_imbalance_oom.pickle";
  if (!std::filesystem::exists(p)) GTEST_SKIP() << p << " absent";
  auto snap = format::loadSnapshotFile(p.string());
  ASSERT_TRUE(snap) << snap.error().describe();
  auto r = analyzeSnapshot(*snap);
  ASSERT_EQ(r.devices.size(), 4u);
  const Headline h = buildHeadline(r);
  EXPECT_EQ(h.focus_device, 1);
  ASSERT_FALSE(h.items.empty());
  EXPECT_EQ(h.items[0].kind, FindingKind::OomVerdict);
  EXPECT_EQ(h.items[0].device, 1);
  const Finding* f = findKind(r.job_findings, FindingKind::DeviceImbalance);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->device, 1);
  ASSERT_FALSE(f->where.empty());
  EXPECT_EQ(f->where[0].line, 174u);
  EXPECT_NE(f->where[0].filename.find("models.py"), std::string::npos);
  ASSERT_GE(f->evidence.size(), 4u);
  EXPECT_EQ(f->evidence[0].bytes, 161996800u);   // cuda:0
  EXPECT_EQ(f->evidence[1].bytes, 5305778176u);  // cuda:1
  EXPECT_EQ(f->evidence[2].bytes, 560996352u);   // cuda:2
  EXPECT_EQ(oomFocusDevice(*snap), std::optional<int64_t>(1));
}

}  // namespace
}  // namespace memforensics::analysis
