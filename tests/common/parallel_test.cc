// parallel_test.cc: common/parallel.h: every index once, results in index order whatever the
// thread count, the lowest failing index's exception on the caller, one worker = no thread.
#include "common/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace memforensics {
namespace {

TEST(Parallel, WorkerCountIsCappedByTheWorkAndTheConstant) {
  EXPECT_EQ(workerCount(4, 0), 1u);
  EXPECT_EQ(workerCount(4, 1), 1u);
  EXPECT_EQ(workerCount(4, 3), 3u);
  EXPECT_EQ(workerCount(4, 100), 4u);
  EXPECT_EQ(workerCount(1, 100), 1u);
  EXPECT_EQ(workerCount(kMaxThreads + 10, kMaxThreads * 2), kMaxThreads);
  const size_t hw = std::max<unsigned>(1, std::thread::hardware_concurrency());
  EXPECT_EQ(workerCount(0, 100000), std::min(hw, kMaxThreads));
}

TEST(Parallel, ZeroItemsRunNothing) {
  std::atomic<int> calls{0};
  for (size_t threads : {0, 1, 4}) parallelFor(0, threads, [&](size_t) { ++calls; });
  EXPECT_EQ(calls.load(), 0);
  EXPECT_TRUE(parallelMap<int>(0, 4, [](size_t i) { return static_cast<int>(i); }).empty());
}

TEST(Parallel, EveryIndexRunsOnceAndResultsAreInIndexOrder) {
  for (size_t threads : {1, 2, 4, 8}) {
    constexpr size_t kN = 1000;
    std::vector<std::atomic<int>> runs(kN);
    auto out = parallelMap<std::string>(kN, threads, [&](size_t i) {
      ++runs[i];
      // Uneven work, so that later indices finish before earlier ones on several threads.
      volatile uint64_t x = 0;
      for (size_t k = 0; k < (kN - i) * 50; ++k) x = x + k;
      return std::to_string(i * 3);
    });
    ASSERT_EQ(out.size(), kN);
    for (size_t i = 0; i < kN; ++i) {
      EXPECT_EQ(runs[i].load(), 1) << "index " << i << " threads " << threads;
      EXPECT_EQ(out[i], std::to_string(i * 3));
    }
  }
}

TEST(Parallel, OneThreadRunsOnTheCallerInOrder) {
  const auto caller = std::this_thread::get_id();
  std::vector<size_t> order;
  parallelFor(50, 1, [&](size_t i) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(i);
  });
  ASSERT_EQ(order.size(), 50u);
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], i);
}

TEST(Parallel, SeveralThreadsAreUsedWhenAsked) {
  // Each task waits until two distinct threads have entered: passes only with real concurrency
  // (bounded wait, so a serial implementation fails instead of hanging).
  std::mutex mu;
  std::set<std::thread::id> seen;
  std::atomic<bool> two{false};
  parallelFor(2, 2, [&](size_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      seen.insert(std::this_thread::get_id());
      if (seen.size() >= 2) two = true;
    }
    for (int k = 0; k < 2000 && !two; ++k)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT_TRUE(two.load());
}

TEST(Parallel, MoreWorkersThanItems) {
  std::vector<std::atomic<int>> runs(3);
  parallelFor(3, 64, [&](size_t i) { ++runs[i]; });
  for (auto& r : runs) EXPECT_EQ(r.load(), 1);
}

TEST(Parallel, TheLowestFailingIndexIsRethrownOnTheCaller) {
  for (size_t threads : {1, 2, 4}) {
    std::vector<std::atomic<int>> runs(200);
    try {
      parallelFor(200, threads, [&](size_t i) {
        ++runs[i];
        if (i == 37 || i == 120 || i == 121) throw std::runtime_error("task " + std::to_string(i));
      });
      ADD_FAILURE() << "no exception with " << threads << " threads";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "task 37") << threads << " threads";
    }
    // As a serial loop: every index before the failure ran, once.
    for (size_t i = 0; i <= 37; ++i) EXPECT_EQ(runs[i].load(), 1) << i;
    for (size_t i = 38; i < 200; ++i) EXPECT_LE(runs[i].load(), 1) << i;
  }
}

TEST(Parallel, AnExceptionFromTheFirstTaskStopsTheRest) {
  std::atomic<int> calls{0};
  EXPECT_THROW(parallelFor(10000, 4,
                           [&](size_t i) {
                             ++calls;
                             if (i == 0) throw std::logic_error("first");
                             std::this_thread::sleep_for(std::chrono::microseconds(50));
                           }),
               std::logic_error);
  EXPECT_LT(calls.load(), 10000);
}

// parallelForTwoRounds: every index once per round, between() once after the whole first round
// and before any second(i), and second(i) on the thread that ran first(i), for 1 to 8 threads.
TEST(Parallel, TwoRoundsRunEachIndexOnceAndTheSecondOnTheFirstsThread) {
  constexpr size_t kCount = 97;
  for (size_t threads : {1, 2, 3, 4, 8}) {
    std::vector<std::thread::id> first_on(kCount), second_on(kCount);
    std::vector<int> firsts(kCount, 0), seconds(kCount, 0);
    std::atomic<size_t> first_done{0};
    size_t between_calls = 0, first_done_at_between = 0;
    bool second_before_between = false;
    parallelForTwoRounds(
        kCount, threads,
        [&](size_t i) {
          first_on[i] = std::this_thread::get_id();
          ++firsts[i];
          first_done.fetch_add(1);
        },
        [&] {
          ++between_calls;
          first_done_at_between = first_done.load();
        },
        [&](size_t i) {
          if (between_calls == 0) second_before_between = true;
          second_on[i] = std::this_thread::get_id();
          ++seconds[i];
        });
    EXPECT_EQ(between_calls, 1u) << threads;
    EXPECT_EQ(first_done_at_between, kCount) << threads;
    EXPECT_FALSE(second_before_between) << threads;
    for (size_t i = 0; i < kCount; ++i) {
      EXPECT_EQ(firsts[i], 1) << threads << " threads, index " << i;
      EXPECT_EQ(seconds[i], 1) << threads << " threads, index " << i;
      EXPECT_EQ(first_on[i], second_on[i]) << threads << " threads, index " << i;
    }
  }
}

TEST(Parallel, TwoRoundsOnOneThreadRunInOrderOnTheCaller) {
  std::vector<std::string> log;
  const auto caller = std::this_thread::get_id();
  bool elsewhere = false;
  parallelForTwoRounds(
      3, 1,
      [&](size_t i) {
        elsewhere |= std::this_thread::get_id() != caller;
        log.push_back("a" + std::to_string(i));
      },
      [&] { log.push_back("between"); },
      [&](size_t i) {
        elsewhere |= std::this_thread::get_id() != caller;
        log.push_back("b" + std::to_string(i));
      });
  EXPECT_FALSE(elsewhere);
  EXPECT_EQ(log, (std::vector<std::string>{"a0", "a1", "a2", "between", "b0", "b1", "b2"}));
}

// A failure in the first round: the lowest failing index is re-thrown, nothing of the second round
// (nor between) runs. A failure in between: no second round. In the second round: its lowest.
TEST(Parallel, TwoRoundsRethrowTheLowestFailureOfTheRoundThatFailed) {
  for (size_t threads : {1, 2, 4}) {
    std::atomic<int> seconds{0};
    bool between_ran = false;
    try {
      parallelForTwoRounds(
          50, threads,
          [&](size_t i) {
            if (i == 7 || i == 30) throw std::runtime_error("first " + std::to_string(i));
          },
          [&] { between_ran = true; }, [&](size_t) { seconds.fetch_add(1); });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "first 7") << threads;
    }
    EXPECT_FALSE(between_ran) << threads;
    EXPECT_EQ(seconds.load(), 0) << threads;

    try {
      parallelForTwoRounds(
          50, threads, [](size_t) {}, [] { throw std::runtime_error("between"); },
          [&](size_t) { seconds.fetch_add(1); });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "between") << threads;
    }
    EXPECT_EQ(seconds.load(), 0) << threads;

    try {
      parallelForTwoRounds(
          50, threads, [](size_t) {}, [] {},
          [&](size_t i) {
            if (i == 11 || i == 40) throw std::runtime_error("second " + std::to_string(i));
          });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "second 11") << threads;
    }
  }
}

}  // namespace
}  // namespace memforensics
