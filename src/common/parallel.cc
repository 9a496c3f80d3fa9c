// parallel.cc: see parallel.h.
#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

namespace memforensics {

size_t workerCount(size_t threads, size_t count) {
  size_t n = threads;
  if (n == 0) n = std::max<unsigned>(1, std::thread::hardware_concurrency());
  return std::max<size_t>(1, std::min({n, count, kMaxThreads}));
}

void parallelFor(size_t count, size_t threads, const std::function<void(size_t)>& task) {
  const size_t workers = workerCount(threads, count);
  if (workers <= 1) {
    for (size_t i = 0; i < count; ++i) task(i);
    return;
  }
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  std::atomic<size_t> next{0};
  // The lowest index whose task threw so far; no index above it is started after it is set.
  std::atomic<size_t> first_failed{kNone};
  std::mutex mu;
  std::exception_ptr error;  // the exception of first_failed (under mu)
  auto work = [&] {
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= count || i > first_failed.load()) return;
      try {
        task(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < first_failed.load()) {
          first_failed.store(i);
          error = std::current_exception();
        }
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (size_t t = 1; t < workers; ++t) {
    try {
      pool.emplace_back(std::ref(work));
    } catch (...) {
      // No more threads (system_error, or bad_alloc for the thread's state): the ones started
      // and the caller do the rest; letting it escape would destroy joinable threads (abort).
      break;
    }
  }
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

void parallelForTwoRounds(size_t count, size_t threads, const std::function<void(size_t)>& first,
                          const std::function<void()>& between,
                          const std::function<void(size_t)>& second) {
  const size_t workers = workerCount(threads, count);
  if (workers <= 1) {
    for (size_t i = 0; i < count; ++i) first(i);
    between();
    for (size_t i = 0; i < count; ++i) second(i);
    return;
  }
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  std::atomic<size_t> next{0};
  // The lowest failing index of the current round; no index above it is started after it is set.
  std::atomic<size_t> first_failed{kNone};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;   // the exception of first_failed, or of between() (under mu)
  size_t arrived = 0;         // helper threads done with the first round (under mu)
  bool released = false;      // between() has run or failed (under mu)
  bool second_round = false;  // the second round runs (set before released)
  auto run = [&](const std::function<void(size_t)>& fn, size_t i) {
    try {
      fn(i);
      return true;
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (i < first_failed.load()) {
        first_failed.store(i);
        error = std::current_exception();
      }
      return false;
    }
  };
  // Each worker's first-round indices, in the order it took them (increasing).
  auto firstRound = [&](std::vector<size_t>& mine) {
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= count || i > first_failed.load() || !run(first, i)) return;
      mine.push_back(i);
    }
  };
  auto secondRound = [&](const std::vector<size_t>& mine) {
    for (size_t i : mine) {
      if (i > first_failed.load() || !run(second, i)) return;
    }
  };
  auto helper = [&] {
    std::vector<size_t> mine;
    firstRound(mine);
    bool go = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      ++arrived;
      cv.notify_all();
      cv.wait(lock, [&] { return released; });
      go = second_round;
    }
    if (go) secondRound(mine);
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (size_t t = 1; t < workers; ++t) {
    try {
      pool.emplace_back(std::ref(helper));
    } catch (...) {
      break;  // as in parallelFor: the threads started and the caller do the rest
    }
  }
  std::vector<size_t> mine;
  firstRound(mine);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return arrived == pool.size(); });
  }
  bool go = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    go = !error;
  }
  if (go) {
    try {
      between();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      error = std::current_exception();
      go = false;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    second_round = go;
    released = true;
    first_failed.store(kNone);  // the second round's failures are counted afresh
  }
  cv.notify_all();
  if (go) secondRound(mine);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace memforensics
