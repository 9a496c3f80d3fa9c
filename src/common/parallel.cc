// parallel.cc: see parallel.h.
#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
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
      pool.emplace_back(work);
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

}  // namespace memforensics
