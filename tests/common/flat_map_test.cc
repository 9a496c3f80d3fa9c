// flat_map_test.cc: U64Map against std::unordered_map under random insert/erase churn.
#include "common/flat_map.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace memforensics {
namespace {

TEST(U64Map, InsertFindEraseBasics) {
  U64Map<int> m;
  EXPECT_TRUE(m.insert(7, 1));
  EXPECT_FALSE(m.insert(7, 2));  // overwrite
  ASSERT_NE(m.find(7), nullptr);
  EXPECT_EQ(*m.find(7), 2);
  EXPECT_EQ(m.find(8), nullptr);
  EXPECT_TRUE(m.erase(7));
  EXPECT_FALSE(m.erase(7));
  EXPECT_TRUE(m.empty());
}

TEST(U64Map, AllOnesKeyIsAValidKey) {
  U64Map<int> m;
  const uint64_t k = ~uint64_t{0};
  EXPECT_EQ(m.find(k), nullptr);
  EXPECT_TRUE(m.insert(k, 5));
  EXPECT_EQ(*m.find(k), 5);
  EXPECT_EQ(m.size(), 1u);
  EXPECT_TRUE(m.erase(k));
  EXPECT_EQ(m.find(k), nullptr);
}

TEST(U64Map, MatchesUnorderedMapUnderChurn) {
  std::mt19937_64 rng(42);
  U64Map<uint64_t> m;
  std::unordered_map<uint64_t, uint64_t> ref;
  for (int i = 0; i < 200000; ++i) {
    // Addresses like a GPU's: 512-aligned, clustered, often reused.
    uint64_t key = 0x7f0000000000ULL + (rng() % 4096) * 512;
    int op = static_cast<int>(rng() % 3);
    if (op < 2) {
      m.insert(key, static_cast<uint64_t>(i));
      ref[key] = static_cast<uint64_t>(i);
    } else {
      EXPECT_EQ(m.erase(key), ref.erase(key) == 1);
    }
  }
  EXPECT_EQ(m.size(), ref.size());
  for (auto [k, v] : ref) {
    ASSERT_NE(m.find(k), nullptr) << k;
    EXPECT_EQ(*m.find(k), v);
  }
  size_t seen = 0;
  m.forEach([&](uint64_t k, uint64_t v) {
    ++seen;
    EXPECT_EQ(ref.at(k), v);
  });
  EXPECT_EQ(seen, ref.size());
}

}  // namespace
}  // namespace memforensics
