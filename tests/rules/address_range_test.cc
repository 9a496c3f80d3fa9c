// address_range_test.cc: AddressRange / RangeSet invariants, against a byte-map oracle.
#include "common/address_range.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

namespace memforensics {
namespace {

TEST(AddressRange, MakeRefusesEmptyAndWrapping) {
  EXPECT_FALSE(AddressRange::make(0x1000, 0));
  EXPECT_FALSE(AddressRange::make(~uint64_t{0}, 1));       // end would be 2^64
  EXPECT_FALSE(AddressRange::make(~uint64_t{0} - 9, 10));  // exactly 2^64: wraps to 0
  ASSERT_TRUE(AddressRange::make(~uint64_t{0} - 10, 10));  // ends at 2^64-1: fine
  EXPECT_EQ(AddressRange::make(0x1000, 0x100)->end, 0x1100u);
  EXPECT_FALSE(AddressRange::between(5, 5));
  EXPECT_TRUE(AddressRange::make(0, 1)->contains(0));
  EXPECT_FALSE(AddressRange::make(0, 1)->contains(1));
}

TEST(RangeSet, MergeModeMergesTouchingAndRefusesOverlap) {
  RangeSet s;
  EXPECT_TRUE(s.insert({0x1000, 0x2000}));
  EXPECT_TRUE(s.insert({0x3000, 0x4000}));
  EXPECT_TRUE(s.insert({0x2000, 0x3000}));  // touches both: one range
  EXPECT_EQ(s.ranges(), (std::vector<AddressRange>{{0x1000, 0x4000}}));
  EXPECT_FALSE(s.insert({0x3fff, 0x5000}));  // overlaps by one byte: refused, unchanged
  EXPECT_EQ(s.bytes(), 0x3000u);
  EXPECT_TRUE(s.erase({0x1800, 0x2000}));  // inside one range: splits it
  EXPECT_EQ(s.ranges(), (std::vector<AddressRange>{{0x1000, 0x1800}, {0x2000, 0x4000}}));
  EXPECT_FALSE(s.erase({0x1700, 0x2100}));  // spans a hole: refused
  EXPECT_EQ(s.bytes(), 0x2800u);
  EXPECT_EQ(s.find(0x2000), (AddressRange{0x2000, 0x4000}));
  EXPECT_FALSE(s.find(0x1800));
}

TEST(RangeSet, KeepModeKeepsTouchingSegmentsApart) {
  RangeSet s(RangeSet::Touching::Keep);
  EXPECT_TRUE(s.insert({0x1000, 0x2000}));
  EXPECT_TRUE(s.insert({0x2000, 0x3000}));
  EXPECT_EQ(s.size(), 2u);
  // assign: a range recorded twice counts once, and what it covers is replaced.
  EXPECT_EQ(s.assign({0x1800, 0x2800}), 0x1000u);
  EXPECT_EQ(s.ranges(),
            (std::vector<AddressRange>{{0x1000, 0x1800}, {0x1800, 0x2800}, {0x2800, 0x3000}}));
  EXPECT_EQ(s.bytes(), 0x2000u);
  // clip: removes every byte, across ranges, splitting at both ends.
  EXPECT_EQ(s.clip({0x1400, 0x2c00}), 0x1800u);
  EXPECT_EQ(s.ranges(), (std::vector<AddressRange>{{0x1000, 0x1400}, {0x2c00, 0x3000}}));
  EXPECT_EQ(s.clip({0x5000, 0x6000}), 0u);
}

TEST(RangeSet, TopOfTheAddressSpace) {
  RangeSet s;
  auto r = AddressRange::make(~uint64_t{0} - 0x1000, 0x1000);
  ASSERT_TRUE(r);
  EXPECT_TRUE(s.insert(*r));
  EXPECT_EQ(s.bytes(), 0x1000u);
  EXPECT_TRUE(s.contains(~uint64_t{0} - 1));
  EXPECT_FALSE(s.contains(~uint64_t{0}));
  EXPECT_EQ(s.clip({0, ~uint64_t{0}}), 0x1000u);
  EXPECT_TRUE(s.empty());
}

// Random operations on small addresses against a set-of-bytes oracle, in both modes: the bytes,
// the invariants (sorted, disjoint, merged when merging) and every answer agree.
TEST(RangeSet, RandomAgainstByteOracle) {
  for (auto mode : {RangeSet::Touching::Merge, RangeSet::Touching::Keep}) {
    std::mt19937_64 rng(7);
    RangeSet s(mode);
    std::set<uint64_t> bytes;
    for (int step = 0; step < 4000; ++step) {
      const uint64_t b = rng() % 200, n = 1 + rng() % 20;
      const AddressRange r{b, b + n};
      bool any = false, all = true;
      for (uint64_t a = r.begin; a < r.end; ++a) {
        any = any || bytes.count(a);
        all = all && bytes.count(a);
      }
      switch (rng() % 4) {
        case 0:
          EXPECT_EQ(s.insert(r), !any);
          if (!any)
            for (uint64_t a = r.begin; a < r.end; ++a) bytes.insert(a);
          break;
        case 1: {
          const bool inside_one = s.find(r.begin) && s.find(r.begin)->end >= r.end;
          EXPECT_EQ(s.erase(r), inside_one);
          if (inside_one)
            for (uint64_t a = r.begin; a < r.end; ++a) bytes.erase(a);
          break;
        }
        case 2: {
          uint64_t had = 0;
          for (uint64_t a = r.begin; a < r.end; ++a) had += bytes.erase(a);
          EXPECT_EQ(s.clip(r), had);
          break;
        }
        default: {
          uint64_t had = 0;
          for (uint64_t a = r.begin; a < r.end; ++a) had += bytes.count(a);
          EXPECT_EQ(s.assign(r), had);
          for (uint64_t a = r.begin; a < r.end; ++a) bytes.insert(a);
        }
      }
      (void)all;
      ASSERT_EQ(s.bytes(), bytes.size());
      uint64_t prev_end = 0, sum = 0;
      bool first = true;
      for (AddressRange x : s) {
        ASSERT_LT(x.begin, x.end);
        if (!first) {
          ASSERT_GE(x.begin, prev_end);
          if (mode == RangeSet::Touching::Merge) ASSERT_GT(x.begin, prev_end);
        }
        first = false;
        prev_end = x.end;
        sum += x.size();
      }
      ASSERT_EQ(sum, bytes.size());
      const uint64_t probe = rng() % 230;
      ASSERT_EQ(s.contains(probe), bytes.count(probe) == 1);
    }
  }
}

}  // namespace
}  // namespace memforensics
