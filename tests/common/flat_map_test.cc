// flat_map_test.cc: U64Map against std::unordered_map under random insert/erase churn.
#include "common/flat_map.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

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

TEST(U64Map, TryEmplaceFindsOrInsertsAValueInitializedEntry) {
  U64Map<int> m;
  auto [v, fresh] = m.tryEmplace(7);
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(fresh);
  EXPECT_EQ(*v, 0);
  *v = 3;
  auto [w, again] = m.tryEmplace(7);
  EXPECT_FALSE(again);
  EXPECT_EQ(*w, 3);
  EXPECT_EQ(m.size(), 1u);
  const uint64_t k = ~uint64_t{0};  // the out-of-band key
  auto [s, sfresh] = m.tryEmplace(k);
  EXPECT_TRUE(sfresh);
  *s = 9;
  EXPECT_FALSE(m.tryEmplace(k).second);
  EXPECT_EQ(*m.find(k), 9);
  EXPECT_EQ(m.size(), 2u);
}

TEST(U64Map, TakeCopiesTheValueOutAndErases) {
  U64Map<int> m;
  m.insert(7, 4);
  m.insert(~uint64_t{0}, 5);
  int out = -1;
  EXPECT_FALSE(m.take(8, &out));
  EXPECT_EQ(out, -1);  // untouched when absent
  EXPECT_TRUE(m.take(7, &out));
  EXPECT_EQ(out, 4);
  EXPECT_EQ(m.find(7), nullptr);
  EXPECT_FALSE(m.take(7, &out));
  EXPECT_TRUE(m.take(~uint64_t{0}, &out));
  EXPECT_EQ(out, 5);
  EXPECT_TRUE(m.empty());
}

// tryEmplace and take leave the table exactly as find+insert and find+erase do: same entries in
// the same forEach order after the same churn (replay's output order depends on it).
TEST(U64Map, TryEmplaceAndTakeLeaveTheSameTableAsFindInsertErase) {
  std::mt19937_64 rng(7);
  U64Map<uint64_t> a, b;
  for (int i = 0; i < 200000; ++i) {
    uint64_t key = 0x7f0000000000ULL + (rng() % 4096) * 512;
    if (rng() % 64 == 0) key = ~uint64_t{0};
    if (rng() % 2 == 0) {
      if (a.find(key) == nullptr) a.insert(key, static_cast<uint64_t>(i));
      auto [v, fresh] = b.tryEmplace(key);
      if (fresh) *v = static_cast<uint64_t>(i);
    } else {
      const uint64_t* av = a.find(key);
      const bool had = av != nullptr;
      const uint64_t want = had ? *av : 0;
      a.erase(key);
      uint64_t got = 0;
      ASSERT_EQ(b.take(key, &got), had);
      if (had) {
        EXPECT_EQ(got, want);
      }
    }
  }
  std::vector<std::pair<uint64_t, uint64_t>> ea, eb;
  a.forEach([&](uint64_t k, uint64_t v) { ea.push_back({k, v}); });
  b.forEach([&](uint64_t k, uint64_t v) { eb.push_back({k, v}); });
  EXPECT_EQ(ea, eb);
  EXPECT_EQ(a.size(), b.size());
}

}  // namespace
}  // namespace memforensics
