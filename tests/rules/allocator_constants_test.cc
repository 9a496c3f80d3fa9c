// allocator_constants_test.cc: the allocator rules of common/allocator_constants.h.
#include "common/allocator_constants.h"

#include <gtest/gtest.h>

namespace memforensics::alloc {
namespace {

TEST(AllocatorConstants, ValuesOfCudaCachingAllocator) {
  EXPECT_EQ(kMinBlockSize, 512u);
  EXPECT_EQ(kSmallSize, 1u << 20);
  EXPECT_EQ(kSmallBuffer, 2u << 20);
  EXPECT_EQ(kLargeBuffer, 20u << 20);
  EXPECT_EQ(kMinLargeAlloc, 10u << 20);
  EXPECT_EQ(kRoundLarge, 2u << 20);
}

TEST(AllocatorConstants, EstimatedBlockSizeRoundsAndSaturates) {
  EXPECT_EQ(estimatedBlockSize(0), 512u);
  EXPECT_EQ(estimatedBlockSize(1), 512u);
  EXPECT_EQ(estimatedBlockSize(512), 512u);
  EXPECT_EQ(estimatedBlockSize(513), 1024u);
  EXPECT_EQ(estimatedBlockSize(~uint64_t{0}), ~uint64_t{0} - 511);  // no wrap to 0
  EXPECT_EQ(estimatedBlockSize(~uint64_t{0} - 511), ~uint64_t{0} - 511);
}

TEST(AllocatorConstants, PoolNameHasOneSpelling) {
  EXPECT_EQ(poolName(true, 0, 0), "large");
  EXPECT_EQ(poolName(false, 0, 0), "small");
  EXPECT_EQ(poolName(true, 0, 1), "large (0,1)");
  EXPECT_EQ(poolName(false, 3, 0), "small (3,0)");
}

TEST(AllocatorConstants, FreeRules) {
  EXPECT_TRUE(freesCompleteOnRequest(5, 0, false));
  EXPECT_FALSE(freesCompleteOnRequest(5, 0, true));  // final state has pending: really pending
  EXPECT_FALSE(freesCompleteOnRequest(5, 1, false));
  EXPECT_FALSE(freesCompleteOnRequest(0, 0, false));
  EXPECT_TRUE(freesRequestOnComplete(0, 3));
  EXPECT_FALSE(freesRequestOnComplete(1, 3));
}

// PyTorch's snapshot(): requested_size and active_size count active blocks, pending ones too.
TEST(AllocatorConstants, StateSumsCountPendingAsActiveAndRequested) {
  StateSums s;
  s.addSegment(4096);
  s.addBlock(true, false, 1024, 1000);  // allocated
  s.addBlock(false, true, 512, 500);    // freed, pending on another stream
  s.addBlock(false, false, 2560, 0);    // inactive
  EXPECT_EQ(s.total, 4096u);
  EXPECT_EQ(s.allocated, 1024u);
  EXPECT_EQ(s.active, 1536u);
  EXPECT_EQ(s.requested, 1500u);
  EXPECT_EQ(s.pending, 512u);
  EXPECT_FALSE(s.overflow);
  s.addBlock(true, false, ~uint64_t{0}, 1);
  EXPECT_TRUE(s.overflow);
  EXPECT_EQ(s.active, ~uint64_t{0});
}

}  // namespace
}  // namespace memforensics::alloc
