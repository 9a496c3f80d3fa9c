// parallel.h: a small parallel-for over indices (issue 16: one device's analysis per thread).
//
// parallelFor(count, threads, task) runs task(0) ... task(count - 1), each index exactly once, on
// at most `threads` threads (workerCount: 0 = std::thread::hardware_concurrency(), capped by
// kMaxThreads and by count). The calling thread is one of the workers; with one worker nothing is
// spawned and the tasks run in index order on the caller. Indices are handed out in increasing
// order, so a task that writes only its own slot of a pre-sized vector gives the same output
// whatever the timing (parallelMap does exactly that).
//
// Exceptions: a task that throws stops the workers from taking indices past it; once every worker
// has stopped, the exception of the lowest failing index is re-thrown on the calling thread (the
// one a serial loop would have thrown; every index below it ran to the end). If a thread cannot be
// started, the work runs on the threads that did start (at least the caller).
//
// Thread safety is the task's business: tasks run concurrently and share whatever they capture.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

namespace memforensics {

// The most threads a parallelFor uses, whatever the setting or the machine says. Each worker of
// the analysis holds one device's replay session, so this also bounds the sessions alive at once.
inline constexpr size_t kMaxThreads = 256;

// The number of workers for `count` tasks with the setting `threads` (0 = the machine's
// hardware_concurrency(), 1 when unknown): between 1 and min(count, kMaxThreads); 1 for count 0.
size_t workerCount(size_t threads, size_t count);

void parallelFor(size_t count, size_t threads, const std::function<void(size_t)>& task);

// Two rounds over the same indices: first(i) for every index, then between() once on the calling
// thread after every first(i) has returned, then second(i) for every index, each on the thread
// that ran first(i) (the threads stay alive in between), so per-thread state that first(i) left
// (a replayer's pointer to its thread's pass counters, replay/pass_stats.h) is still its
// thread's. Serially (one worker): every first, between, every second, in index order.
// Exceptions as in parallelFor: the lowest failing index of the first round is re-thrown and
// neither between() nor any second(i) runs; then between()'s; then the lowest failing index of
// the second round.
void parallelForTwoRounds(size_t count, size_t threads, const std::function<void(size_t)>& first,
                          const std::function<void()>& between,
                          const std::function<void(size_t)>& second);

// results[i] = fn(i) for i in [0, count), computed by parallelFor; T must be default-constructible.
template <class T, class Fn>
std::vector<T> parallelMap(size_t count, size_t threads, Fn&& fn) {
  std::vector<T> results(count);
  parallelFor(count, threads, [&](size_t i) { results[i] = fn(i); });
  return results;
}

}  // namespace memforensics
