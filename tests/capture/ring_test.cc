// ring_test.cc: the capture ring (src/capture/ring.h): order, wraparound, overflow counting, the
// side index, and one producer against one consumer on two threads.
#include "capture/ring.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace mc = memforensics::capture;

namespace {

struct Rec {
  uint64_t seq;
  uint64_t payload[3];
};

TEST(CaptureRing, CapacityIsAPowerOfTwo) {
  EXPECT_EQ(mc::SpscRing<Rec>(1).capacity(), 2u);
  EXPECT_EQ(mc::SpscRing<Rec>(5).capacity(), 8u);
  EXPECT_EQ(mc::SpscRing<Rec>(64).capacity(), 64u);
}

TEST(CaptureRing, FifoAcrossManyWraparounds) {
  mc::SpscRing<Rec> ring(8);
  uint64_t next_in = 0, next_out = 0;
  for (int round = 0; round < 1000; ++round) {
    int n = 1 + round % 8;
    for (int k = 0; k < n; ++k) ASSERT_TRUE(ring.push(Rec{next_in++, {1, 2, 3}}));
    size_t got = ring.drain([&](const Rec& r, size_t) { EXPECT_EQ(r.seq, next_out++); });
    EXPECT_EQ(got, static_cast<size_t>(n));
  }
  EXPECT_EQ(ring.dropped(), 0u);
  EXPECT_EQ(ring.pushed(), next_in);
}

TEST(CaptureRing, FullRingCountsDropsAndNeverOverwrites) {
  mc::SpscRing<Rec> ring(4);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(ring.push(Rec{i, {}}));
  for (uint64_t i = 4; i < 10; ++i) EXPECT_FALSE(ring.push(Rec{i, {}}));
  EXPECT_EQ(ring.dropped(), 6u);
  EXPECT_EQ(ring.size(), 4u);
  std::vector<uint64_t> seen;
  ring.drain([&](const Rec& r, size_t) { seen.push_back(r.seq); });
  EXPECT_EQ(seen, (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_TRUE(ring.push(Rec{10, {}}));  // room again after the drain
  EXPECT_EQ(ring.dropped(), 6u);
}

TEST(CaptureRing, PartialDrainAndSideIndex) {
  mc::SpscRing<Rec> ring(4);
  std::vector<uint64_t> side(ring.capacity());
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(ring.tryPush([&](Rec& r, size_t idx) {
      r.seq = i;
      side[idx] = i * 100;
    }));
  }
  EXPECT_EQ(ring.drain([&](const Rec& r, size_t idx) { EXPECT_EQ(side[idx], r.seq * 100); }, 2),
            2u);
  EXPECT_EQ(ring.size(), 1u);
  for (uint64_t i = 3; i < 6; ++i) {
    ASSERT_TRUE(ring.tryPush([&](Rec& r, size_t idx) {
      r.seq = i;
      side[idx] = i * 100;
    }));
  }
  uint64_t expect = 2;
  ring.drain([&](const Rec& r, size_t idx) {
    EXPECT_EQ(r.seq, expect++);
    EXPECT_EQ(side[idx], r.seq * 100);
  });
  EXPECT_EQ(expect, 6u);
}

// A producer thread pushes a numbered sequence (retrying when full, counting the refusals) while
// the consumer drains: the consumer sees every accepted record exactly once, in order.
TEST(CaptureRing, ConcurrentProducerConsumer) {
  mc::SpscRing<Rec> ring(256);
  constexpr uint64_t kN = 100000;
  uint64_t refused = 0;
  std::thread producer([&] {
    for (uint64_t i = 0; i < kN; ++i) {
      while (!ring.push(Rec{i, {i, ~i, i * 3}})) {
        ++refused;
        std::this_thread::yield();
      }
    }
  });
  uint64_t next = 0;
  bool ok = true;
  while (next < kN) {
    ring.drain([&](const Rec& r, size_t) {
      ok = ok && r.seq == next && r.payload[0] == next && r.payload[1] == ~next &&
           r.payload[2] == next * 3;
      ++next;
    });
  }
  producer.join();
  EXPECT_TRUE(ok);
  EXPECT_EQ(next, kN);
  EXPECT_EQ(ring.dropped(), refused);
  EXPECT_EQ(ring.size(), 0u);
}

}  // namespace
