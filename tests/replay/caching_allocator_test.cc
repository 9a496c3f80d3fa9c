// caching_allocator_test.cc: the caching-allocator core (replay/caching_allocator.h) rule by rule
// on hand-built states, and the one PYTORCH_CUDA_ALLOC_CONF parser (replay/alloc_conf.h). The same
// core is checked end to end by allocator_model_test (every recorded address) and whatif_test
// (the request-driven baseline).
#include "replay/caching_allocator.h"

#include <gtest/gtest.h>

#include <limits>

#include "fixtures/snapshot_builder.h"
#include "replay/alloc_conf.h"

namespace memforensics::replay {
namespace {

using format::BlockState;
constexpr uint64_t kMiB = 1048576;
constexpr uint64_t kBase = 0x7f0000000000ULL;

// A segment of `blocks` (size, state, mapped) laid out from `address`.
struct B {
  uint64_t size;
  bool allocated;
  bool mapped = true;
};
CachedSegment segment(uint64_t address, std::vector<B> blocks, bool expandable, bool large = true) {
  CachedSegment s;
  s.address = address;
  s.expandable = expandable;
  s.is_large = large;
  uint64_t at = address;
  for (const B& b : blocks) {
    ModelBlock m;
    m.address = at;
    m.size = b.size;
    m.mapped = b.mapped;
    m.state = b.allocated ? BlockState::ActiveAllocated : BlockState::Inactive;
    s.blocks.emplace(at, m);
    at += b.size;
  }
  s.size = at - address;
  return s;
}

AllocRequest large(uint64_t size) {
  return AllocRequest{{0, 0}, true, 0, size};
}

// get_free_block with expandable segments: the smallest block that fits is the end of a mapped
// range followed by unmapped space, so it counts as the size it could grow to, and a larger block
// that cannot grow is taken instead. Without expandable segments on, the smallest one is taken.
TEST(CachingAllocator, GetFreeBlockCountsAnExpandableBlockAsTheSizeItCouldGrowTo) {
  AllocConf on;
  on.expandable_segments = true;
  const std::map<uint64_t, CachedSegment> state = {{kBase, segment(kBase,
                                                                   {{20 * kMiB, true},
                                                                    {40 * kMiB, false},
                                                                    {20 * kMiB, true},
                                                                    {30 * kMiB, false},
                                                                    {1024 * kMiB, false, false}},
                                                                   true)}};
  CachingAllocator a(on);
  a.assign(state);
  const auto* k = a.getFreeBlock(large(25 * kMiB));
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->addr, kBase + 20 * kMiB);  // the 40 MiB block, not the 30 MiB one before 1 GiB
  EXPECT_EQ(k->size, 40 * kMiB);

  // Expandable segments turned off after this reservation was made: none of its blocks is used.
  CachingAllocator off{AllocConf{}};
  off.assign(state);
  EXPECT_EQ(off.getFreeBlock(large(25 * kMiB)), nullptr);
  // An ordinary segment's block is.
  off.addSegment(segment(kBase + (uint64_t{1} << 32), {{64 * kMiB, false}}, false));
  ASSERT_NE(off.getFreeBlock(large(25 * kMiB)), nullptr);
  EXPECT_EQ(off.getFreeBlock(large(25 * kMiB))->addr, kBase + (uint64_t{1} << 32));
}

// The oversize rules of get_free_block and should_split with max_split_size.
TEST(CachingAllocator, OversizeBlocksAreNeitherSplitNorHandedToSmallerRequests) {
  AllocConf c;
  c.max_split_size = 64 * kMiB;
  CachingAllocator a(c);
  a.addSegment(segment(kBase, {{100 * kMiB, false}}, false));
  EXPECT_EQ(a.getFreeBlock(large(30 * kMiB)), nullptr);  // < max_split: no block >= it
  ASSERT_NE(a.getFreeBlock(large(90 * kMiB)), nullptr);  // >= max_split: up to +20 MiB
  EXPECT_EQ(a.getFreeBlock(large(70 * kMiB)), nullptr);  // 100 >= 70 + 20
  CachedSegment& s = a.segs.begin()->second;
  ModelBlock* b = a.allocFoundBlock(s, &s.blocks.begin()->second, 90 * kMiB);
  EXPECT_EQ(b->size, 100 * kMiB);  // not split for a request >= max_split_size
  EXPECT_EQ(s.blocks.size(), 1u);
}

// release_available_cached_blocks: the smallest oversize cached segment of at least
// max(request, max_split_size), else the largest ones until that much is freed.
TEST(CachingAllocator, ReleaseOversizeFreesTheSmallestSufficientSegmentElseTheLargest) {
  AllocConf c;
  c.max_split_size = 32 * kMiB;
  CachingAllocator a(c);
  a.addSegment(segment(kBase, {{40 * kMiB, false}}, false));
  a.addSegment(segment(kBase + 64 * kMiB, {{36 * kMiB, false}}, false));
  a.addSegment(segment(kBase + 128 * kMiB, {{80 * kMiB, false}}, false));
  a.addSegment(segment(kBase + 256 * kMiB, {{20 * kMiB, false}}, false));  // below max_split
  Released r;
  ASSERT_TRUE(a.releaseOversize(large(24 * kMiB), &r));  // key raised to 32 MiB: the 36 MiB one
  EXPECT_EQ(r.bytes, 36 * kMiB);
  EXPECT_EQ(a.segs.count(kBase + 64 * kMiB), 0u);
  r = {};
  ASSERT_TRUE(a.releaseOversize(large(100 * kMiB), &r));  // none holds 100: 80, then 40
  EXPECT_EQ(r.bytes, 120 * kMiB);
  EXPECT_EQ(r.calls, 2u);
  EXPECT_EQ(a.segs.size(), 1u);  // the 20 MiB one stays
  r = {};
  EXPECT_FALSE(a.releaseOversize(large(100 * kMiB), &r));
  EXPECT_EQ(r.bytes, 0u);
}

// find_expandable_block and try_allocate_expandable_block: the free block before an unmapped
// range starts the grown block; pages are mapped in whole 20 MiB steps; a map the device refuses
// fails the request, and what was mapped before stays mapped.
TEST(CachingAllocator, ExpandableBlocksGrowByWholePagesFromTheFreeBlockBefore) {
  AllocConf on;
  on.expandable_segments = true;
  CachingAllocator a(on);
  a.addSegment(segment(kBase,
                       {{20 * kMiB, true},
                        {8 * kMiB, false},
                        {12 * kMiB, true},
                        {10 * kMiB, false},
                        {1000 * kMiB, false, false}},
                       true));
  const auto c = a.findExpandableBlock(large(50 * kMiB));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, kBase + 40 * kMiB);  // the 10 MiB free block before the unmapped range
  std::vector<uint64_t> maps;
  ASSERT_TRUE(a.growExpandable(*c, 50 * kMiB, [&](uint64_t bytes) {
    maps.push_back(bytes);
    return true;
  }));
  EXPECT_EQ(maps, std::vector<uint64_t>{40 * kMiB});  // 40 MiB missing: two pages
  const CachedSegment& s = a.segs.begin()->second;
  const ModelBlock& grown = s.blocks.at(kBase + 40 * kMiB);
  EXPECT_EQ(grown.size, 50 * kMiB);
  EXPECT_TRUE(grown.isFree());
  EXPECT_FALSE(s.blocks.at(kBase + 90 * kMiB).mapped);

  // A request the device refuses: nothing new mapped.
  CachingAllocator full(on);
  full.addSegment(segment(kBase, {{20 * kMiB, true}, {1000 * kMiB, false, false}}, true));
  EXPECT_FALSE(full.growExpandable(kBase + 20 * kMiB, 30 * kMiB, [](uint64_t) { return false; }));
  EXPECT_FALSE(full.segs.begin()->second.blocks.at(kBase + 20 * kMiB).mapped);
}

// release_cached_blocks: wholly free segments go back, every completely free page of a
// reservation is unmapped (pages counted from its base), a reservation left unmapped is released.
TEST(CachingAllocator, ReleaseCachedUnmapsCompletelyFreePagesOnly) {
  AllocConf on;
  on.expandable_segments = true;
  CachingAllocator a(on);
  a.addSegment(
      segment(kBase, {{30 * kMiB, true}, {50 * kMiB, false}, {20 * kMiB, false, false}}, true));
  a.addSegment(
      segment(kBase + (uint64_t{1} << 32), {{40 * kMiB, false}, {20 * kMiB, false, false}}, true));
  a.addSegment(segment(kBase + (uint64_t{2} << 32), {{20 * kMiB, false}}, false));
  a.addSegment(
      segment(kBase + (uint64_t{3} << 32), {{10 * kMiB, true}, {10 * kMiB, false}}, false));
  const Released r = a.releaseCached();
  // [30, 80) MiB free in the first: pages [40, 60) and [60, 80) go; [30, 40) stays mapped.
  EXPECT_EQ(r.bytes, 40 * kMiB + 40 * kMiB + 20 * kMiB);
  const CachedSegment& s = a.segs.at(kBase);
  EXPECT_EQ(s.blocks.at(kBase + 30 * kMiB).size, 10 * kMiB);
  EXPECT_TRUE(s.blocks.at(kBase + 30 * kMiB).mapped);
  EXPECT_FALSE(s.blocks.at(kBase + 40 * kMiB).mapped);
  EXPECT_EQ(a.segs.count(kBase + (uint64_t{1} << 32)), 0u);  // reservation left unmapped
  EXPECT_EQ(a.segs.count(kBase + (uint64_t{2} << 32)), 0u);  // wholly free segment
  EXPECT_EQ(a.segs.count(kBase + (uint64_t{3} << 32)), 1u);  // split segment stays
  auto [at, bytes] = CachingAllocator::unmappablePages(s, s.blocks.at(kBase + 30 * kMiB));
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(at, 0u);
}

// garbage_collect_cached_blocks: wholly free default-pool segments at least as old as the average
// go back, in passes, until the target is reclaimed.
TEST(CachingAllocator, GarbageCollectionFreesTheOldestSegmentsFirst) {
  CachingAllocator a{AllocConf{}};
  const AllocRequest r = large(10 * kMiB);
  a.countGetFreeBlock(r);  // counting on: blocks indexed from now on record their age base
  a.addSegment(segment(kBase, {{40 * kMiB, false}}, false));  // age base 1
  for (int i = 0; i < 9; ++i) a.countGetFreeBlock(r);
  a.addSegment(segment(kBase + (uint64_t{1} << 32), {{40 * kMiB, false}}, false));  // base 10
  a.countGetFreeBlock(r);  // now 11: ages 10 and 1, average 5.5
  Released g = a.garbageCollect(20 * kMiB);
  EXPECT_EQ(g.bytes, 40 * kMiB);
  EXPECT_EQ(a.segs.count(kBase), 0u);  // the old one
  EXPECT_EQ(a.segs.size(), 1u);
}

TEST(AllocConf, SplitKeepsAListWholeAndDropsSpaces) {
  auto e = splitAllocConf(
      " expandable_segments:True, max_split_size_mb:128,roundup_power2_divisions:[256:1, 512:2,"
      ">:4],backend:native");
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].key, "expandable_segments");
  EXPECT_EQ(e[0].value, "True");
  EXPECT_EQ(e[2].key, "roundup_power2_divisions");
  EXPECT_EQ(e[2].value, "[256:1,512:2,>:4]");
  EXPECT_EQ(e[3].value, "native");
}

TEST(AllocConf, AFileSettingsComeFromAllocatorSettingsAndItsConfString) {
  testing::TSnapshot t;
  t.traces.push_back({{"alloc", kBase, 512, 0}});
  format::Snapshot snap = testing::buildSnapshot(t);
  snap.settings.present = false;
  snap.settings.conf = "max_non_split_rounding_mb:40,expandable_segments:True";
  AllocConf c = allocConfOf(snap);
  EXPECT_TRUE(c.expandable_segments);
  EXPECT_EQ(c.max_non_split_rounding, 40 * kMiB);
  // A key is a whole key: a longer name that contains it is not it (a substring search took it).
  snap.settings.conf = "xmax_non_split_rounding_mb:40,my_expandable_segments:True";
  c = allocConfOf(snap);
  EXPECT_FALSE(c.expandable_segments);
  EXPECT_EQ(c.max_non_split_rounding, alloc::kLargeBuffer);
  // Recorded settings win where recorded; 0 MiB of rounding is not a setting.
  snap.settings.present = true;
  snap.settings.max_split_size = 256 * kMiB;
  snap.settings.garbage_collection_threshold = 0.6;
  snap.settings.conf = "max_non_split_rounding_mb:0";
  c = allocConfOf(snap);
  EXPECT_EQ(c.max_split_size, 256 * kMiB);
  EXPECT_DOUBLE_EQ(c.gc_threshold, 0.6);
  EXPECT_EQ(c.max_non_split_rounding, alloc::kLargeBuffer);
  EXPECT_EQ(describeAllocConf(c),
            "expandable_segments=False max_split_size_mb=256 roundup_power2_divisions=0 "
            "garbage_collection_threshold=0.6");
}

TEST(AllocConf, RefusedValuesSayWhy) {
  AllocConf c;
  EXPECT_EQ(applyAllocSetting(c, "max_split_size_mb", "20"),
            "max_split_size_mb takes a number of MiB above 20 (or 'unlimited'), not '20'");
  EXPECT_EQ(applyAllocSetting(c, "max_split_size_mb", "21"), "");
  EXPECT_EQ(c.max_split_size, 21 * kMiB);
  EXPECT_NE(applyAllocSetting(c, "roundup_power2_divisions", "3").find("power of two"),
            std::string::npos);
  EXPECT_NE(applyAllocSetting(c, "garbage_collection_threshold", "1.0"), "");
  EXPECT_EQ(c.gc_threshold, 0.0);
}

// A file's impossible settings (issue 30: a gc threshold of inf or 1e18 went through an undefined
// float-to-integer conversion; max_split_size 1 B printed as max_split_size_mb=0) are named and
// ignored, as --set refuses them; the possible ones stay.
TEST(AllocConf, AFilesImpossibleSettingsAreNamedAndIgnored) {
  testing::TSnapshot t;
  t.traces.push_back({{"alloc", kBase, 512, 0}});
  format::Snapshot snap = testing::buildSnapshot(t);
  snap.settings.present = true;
  EXPECT_TRUE(refusedFileSettings(snap.settings).empty());
  for (double gc : {1e18, std::numeric_limits<double>::infinity(),
                    std::numeric_limits<double>::quiet_NaN(), 1.0, -0.5}) {
    snap.settings.garbage_collection_threshold = gc;
    const auto refused = refusedFileSettings(snap.settings);
    ASSERT_EQ(refused.size(), 1u) << gc;
    EXPECT_EQ(refused[0].rfind("garbage_collection_threshold: ", 0), 0u) << refused[0];
    EXPECT_EQ(allocConfOf(snap).gc_threshold, 0.0) << gc;
  }
  snap.settings.garbage_collection_threshold = 0.8;
  for (int64_t split : {int64_t{1}, int64_t{19} * 1048576, int64_t{64} * 1048576 + 1}) {
    snap.settings.max_split_size = split;
    ASSERT_EQ(refusedFileSettings(snap.settings).size(), 1u) << split;
    EXPECT_EQ(allocConfOf(snap).max_split_size, ~uint64_t{0}) << split;
    EXPECT_DOUBLE_EQ(allocConfOf(snap).gc_threshold, 0.8) << "the possible ones stay";
  }
  // 20 MiB: PyTorch 2.9+ takes it (>= 20).
  snap.settings.max_split_size = 20 * 1048576;
  EXPECT_TRUE(refusedFileSettings(snap.settings).empty());
  EXPECT_EQ(allocConfOf(snap).max_split_size, 20 * kMiB);
  snap.settings.has_roundup = true;
  snap.settings.roundup_power2_divisions[3] = 3;
  ASSERT_EQ(refusedFileSettings(snap.settings).size(), 1u);
  EXPECT_EQ(describeDivisions(allocConfOf(snap).divisions), "0");
  // Any power of two, beyond what --set offers (kMaxRoundupDivisions).
  snap.settings.roundup_power2_divisions[3] = 128;
  EXPECT_TRUE(refusedFileSettings(snap.settings).empty());
  EXPECT_EQ(allocConfOf(snap).divisions[3], 128u);
}

// What a failed request needed, and the short-by: one home for the OOM verdict and blocks.
TEST(CachingAllocator, ShortByIsTheNeedBeyondTheDeviceFreeBytesUnlessFragmentation) {
  const OomNeed n = requestNeed(15 * kMiB, true, false, {});
  EXPECT_EQ(n.needed_bytes, 16 * kMiB);  // get_allocation_size: rounded up to 2 MiB
  EXPECT_EQ(shortBy(n, 10 * kMiB, false), 6 * kMiB);
  EXPECT_EQ(shortBy(n, 20 * kMiB, false), 0u);
  EXPECT_EQ(shortBy(n, 10 * kMiB, true), 0u);
}

}  // namespace
}  // namespace memforensics::replay
