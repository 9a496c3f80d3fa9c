// capture_bench.cc: the capture's hot path (what an allocator callback costs), the writer thread's
// throughput and the bytes per event on disk. Reported in docs/performance.md ("Capture").
//
//   capture_bench [google-benchmark flags]
//
// BM_HotPath*: the time of one record as the LibTorch tracker spends it (capture::submit: the
// in-flight guard, the active-recorder load, the 64-byte copy into the device's ring, the release
// store). Timed in batches of 4096 with the writer draining between batches (not timed), so the
// ring never overflows and the numbers are those of accepted records.
// BM_Writer*: records pushed as fast as the ring takes them until the file is closed: end-to-end
// events per second through the writer thread and the bytes each costs in the file.
#include <benchmark/benchmark.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "capture/memforensics_capture.h"
#include "capture/recorder.h"
#include "capture/ring.h"

namespace mc = memforensics::capture;

namespace {

std::string benchPath(const char* name) {
  return "/tmp/memf_capture_bench_" + std::to_string(::getpid()) + "_" + name + ".bin";
}

// A training-loop-like record stream: alloc / free_requested / free_completed of a few thousand
// blocks, one stream, a monotonic clock.
mc::CaptureRecord nth(uint64_t i) {
  mc::CaptureRecord r;
  r.action = static_cast<uint8_t>(i % 3);
  r.addr = 0x7f0000000000 + ((i / 3) % 4096) * 65536;
  r.size = 4096 + ((i / 3) % 251) * 512;
  r.stream = 0x55aa00;
  r.ticks = 1000000000 + i * 700;
  r.flags = mc::kHasTime;
  return r;
}

void BM_RingPush(benchmark::State& state) {
  mc::SpscRing<mc::CaptureRecord> ring(1 << 13);
  mc::CaptureRecord r = nth(0);
  uint64_t n = 0;
  for (auto _ : state) {
    for (int k = 0; k < 4096; ++k) {
      r.addr += 512;
      benchmark::DoNotOptimize(ring.push(r));
    }
    n += 4096;
    state.PauseTiming();
    ring.drain([](const mc::CaptureRecord& x, size_t) { benchmark::DoNotOptimize(x.addr); });
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(n));
  state.counters["ns_per_record"] = benchmark::Counter(
      static_cast<double>(n), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_RingPush);

void hotPath(benchmark::State& state, bool with_context) {
  memforensics::CaptureOptions o;
  o.devices = 1;
  o.handle_signals = false;
  o.stop_at_exit = false;
  o.ring_capacity = 1 << 13;
  const std::string path = benchPath("hot");
  if (!memforensics::start(path, o).ok()) {
    state.SkipWithError("cannot start");
    return;
  }
  auto ctx = std::make_shared<int>(1);
  uint64_t n = 0, refused = 0;
  uint64_t i = 0;
  for (auto _ : state) {
    for (int k = 0; k < 4096; ++k) {
      mc::CaptureRecord r = nth(i++);
      bool ok = with_context ? mc::submit(r, std::shared_ptr<void>(ctx)) : mc::submit(r);
      refused += !ok;
    }
    n += 4096;
    state.PauseTiming();
    memforensics::flush(10000);  // the writer empties the ring (not timed)
    state.ResumeTiming();
  }
  (void)memforensics::stop();
  ::unlink(path.c_str());
  state.SetItemsProcessed(static_cast<int64_t>(n));
  state.counters["refused"] = static_cast<double>(refused);
  state.counters["ns_per_record"] = benchmark::Counter(
      static_cast<double>(n), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
void BM_HotPathNoStacks(benchmark::State& state) {
  hotPath(state, false);
}
void BM_HotPathWithContext(benchmark::State& state) {
  hotPath(state, true);
}
BENCHMARK(BM_HotPathNoStacks);
BENCHMARK(BM_HotPathWithContext);

// Contexts resolved to one of 300 stacks of 8 frames (a model's allocation sites); like
// torch::symbolize, the resolver returns each distinct frame of the batch once.
struct Ctx {
  uint32_t site;
};
class SiteResolver : public mc::StackResolver {
 public:
  void resolve(std::span<const std::shared_ptr<void>> contexts, mc::FinishMode,
               std::vector<mc::ResolvedFrame>& frames,
               std::vector<std::vector<uint32_t>>& stacks) override {
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> seen;  // (depth, name) -> index
    for (const auto& c : contexts) {
      uint32_t site = static_cast<Ctx*>(c.get())->site;
      std::vector<uint32_t> ids;
      for (uint32_t d = 0; d < 8; ++d) {
        uint32_t name = (site + d) % 40;
        auto [it, fresh] =
            seen.try_emplace({d, name * 100 + site % 13}, static_cast<uint32_t>(frames.size()));
        if (fresh) {
          frames.push_back({"model/layer" + std::to_string(d) + ".py",
                            "forward" + std::to_string(name), 10 + d * 7 + site % 13});
        }
        ids.push_back(it->second);
      }
      stacks.push_back(std::move(ids));
    }
  }
};

void writer(benchmark::State& state, int zstd, bool stacks) {
  const uint64_t kEvents = 1u << 20;
  std::vector<std::shared_ptr<void>> sites;
  for (uint32_t s = 0; s < 300; ++s) sites.push_back(std::make_shared<Ctx>(Ctx{s}));
  uint64_t bytes = 0;
  for (auto _ : state) {
    const std::string path = benchPath("writer");
    mc::RecorderOptions o;
    o.devices = 1;
    o.zstd_level = zstd;
    mc::RecorderHooks h;
    if (stacks) h.resolver = std::make_shared<SiteResolver>();
    auto r = mc::Recorder::create(path, o, h);
    if (!r.ok()) {
      state.SkipWithError("cannot create");
      return;
    }
    for (uint64_t i = 0; i < kEvents; ++i) {
      mc::CaptureRecord rec = nth(i);
      if (stacks && rec.action == 0) {
        while (!(*r)->record(rec, std::shared_ptr<void>(sites[(i / 3) % 300])))
          std::this_thread::yield();
      } else {
        while (!(*r)->record(rec)) std::this_thread::yield();
      }
    }
    (void)(*r)->stop();
    struct stat st {};
    stat(path.c_str(), &st);
    bytes = static_cast<uint64_t>(st.st_size);
    ::unlink(path.c_str());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kEvents));
  state.counters["bytes_per_event"] = static_cast<double>(bytes) / static_cast<double>(kEvents);
}
void BM_WriterStored(benchmark::State& state) {
  writer(state, 0, false);
}
void BM_WriterZstd1(benchmark::State& state) {
  writer(state, 1, false);
}
void BM_WriterZstd1Stacks(benchmark::State& state) {
  writer(state, 1, true);
}
BENCHMARK(BM_WriterStored)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(BM_WriterZstd1)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(BM_WriterZstd1Stacks)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
