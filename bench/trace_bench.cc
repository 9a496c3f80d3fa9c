// trace_bench.cc: native trace writer throughput, decoding speed, and loading a snapshot from a
// native trace against loading the same content from its pickle.
//
//   trace_bench [google-benchmark flags] [SNAPSHOT.pickle ...]
//
// Each snapshot given is converted to a native trace in memory once; BM_Load/pickle/NAME and
// BM_Load/native/NAME then read the same content from memory into the model (no disk I/O in
// either), and the bytes of each form are reported as counters. bench/trace_bench.sh runs it on
// the real snapshots and formats docs/performance.md's tables.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "format/load/load.h"
#include "format/load/snapshot_trace.h"
#include "format/trace/trace_reader.h"
#include "format/trace/trace_writer.h"

namespace mf = memforensics;
using namespace mf::format::trace;

namespace {

// Counts bytes and drops them: measures the writer, not the disk.
class NullSink : public ByteSink {
 public:
  mf::Status write(std::span<const uint8_t> b) override {
    bytes += b.size();
    benchmark::DoNotOptimize(b.data());
    return mf::Status::Ok();
  }
  uint64_t bytes = 0;
};

// 300 stacks of 8 frames, interned in `w`; the same ids in every writer (interning is ordered).
std::vector<uint32_t> internStacks(TraceWriter& w) {
  std::vector<uint32_t> stacks;
  for (int i = 0; i < 300; ++i) {
    uint32_t parent = kTraceRootStack;
    for (int d = 0; d < 8; ++d) {
      uint32_t f = w.frame(w.string("model/layer" + std::to_string(d) + ".py"),
                           w.string("forward" + std::to_string((i + d) % 40)), 10 + d * 7 + i % 13);
      parent = w.stack(parent, f);
    }
    stacks.push_back(parent);
  }
  return stacks;
}

// A training-loop-like stream: allocs from a few hundred stacks, frees in LIFO-ish order, a
// monotonic clock, one stream.
std::vector<TraceEvent> syntheticEvents(size_t n, const std::vector<uint32_t>& stacks) {
  std::mt19937_64 rng(1);
  std::vector<TraceEvent> out;
  out.reserve(n);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  int64_t t = 1700000000000000;
  uint64_t next_addr = 0x7f0000000000;
  while (out.size() < n) {
    TraceEvent e;
    t += 1 + rng() % 20;
    e.time_us = t;
    if (live.size() < 64 || (live.size() < 4096 && rng() % 2 == 0)) {
      e.action = 0;
      e.size = (rng() % 3 == 0) ? 512 * (1 + rng() % 64) : 4096 * (1 + rng() % 1024);
      e.addr = next_addr;
      next_addr += (e.size + 511) / 512 * 512;
      e.stack = stacks[rng() % stacks.size()];
      live.emplace_back(e.addr, e.size);
    } else {
      size_t k = live.size() - 1 - rng() % std::min<size_t>(live.size(), 8);
      e.addr = live[k].first;
      e.size = live[k].second;
      e.stack = kTraceNoStack;
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      e.action = 1;
      out.push_back(e);
      if (out.size() == n) break;
      e.action = 2;
    }
    out.push_back(e);
  }
  return out;
}

// The writer's own cost per event. The capture feeds it from a ring buffer that is hot in cache,
// so the input is a 64 Ki-event stream (3 MiB) written 16 times over, with times and addresses
// shifted per pass: a 48 MiB input array would measure this machine's memory instead.
void BM_TraceWriter(benchmark::State& state) {
  WriterOptions wo;
  wo.zstd_level = static_cast<int>(state.range(0));
  const size_t pattern = 1 << 16, passes = 16;
  std::vector<TraceEvent> events;
  uint64_t bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    NullSink sink;
    auto w = std::make_unique<TraceWriter>(sink, wo);
    (void)w->begin(TraceMeta{});
    auto stacks = internStacks(*w);
    if (events.empty()) events = syntheticEvents(pattern, stacks);
    state.ResumeTiming();
    for (size_t p = 0; p < passes; ++p) {
      const int64_t dt = static_cast<int64_t>(p) * 10000000;
      const uint64_t da = p << 32;
      for (TraceEvent e : events) {
        e.time_us += dt;
        e.addr += da;
        if (!w->event(e).ok()) state.SkipWithError("write failed");
      }
    }
    if (!w->close().ok()) state.SkipWithError("close failed");
    bytes = sink.bytes;
  }
  const double n = static_cast<double>(pattern * passes);
  state.SetItemsProcessed(static_cast<int64_t>(static_cast<double>(state.iterations()) * n));
  state.counters["bytes_per_event"] = static_cast<double>(bytes) / n;
}
BENCHMARK(BM_TraceWriter)->Arg(0)->Arg(1)->Arg(3)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_TraceDecode(benchmark::State& state) {
  WriterOptions wo;
  wo.zstd_level = static_cast<int>(state.range(0));
  VectorSink sink;
  TraceWriter w(sink, wo);
  (void)w.begin(TraceMeta{});
  auto events = syntheticEvents(1 << 20, internStacks(w));
  for (const auto& e : events) (void)w.event(e);
  (void)w.close();
  for (auto _ : state) {
    auto r = TraceReader::open(sink.data);
    uint64_t n = 0;
    while ((*r)->next()) n += (*r)->events().size();
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * events.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * sink.data.size()));
}
BENCHMARK(BM_TraceDecode)->Arg(0)->Arg(3)->Unit(benchmark::kMillisecond)->UseRealTime();

struct LoadCase {
  std::vector<uint8_t> bytes;
  uint64_t events = 0;
};

void BM_Load(benchmark::State& state, const LoadCase* c) {
  for (auto _ : state) {
    auto s = mf::format::loadSnapshotBytes(c->bytes);
    if (!s) {
      state.SkipWithError(s.error().message.c_str());
      break;
    }
    benchmark::DoNotOptimize(s->events.data());
  }
  state.counters["file_bytes"] = static_cast<double>(c->bytes.size());
  state.counters["events"] = static_cast<double>(c->events);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * c->bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::vector<std::unique_ptr<LoadCase>> cases;
  for (int i = 1; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    auto pk = std::make_unique<LoadCase>();
    pk->bytes.assign(std::istreambuf_iterator<char>(f), {});
    auto snap = mf::format::loadSnapshotBytes(pk->bytes);
    if (!snap) {
      fprintf(stderr, "%s: %s\n", argv[i], snap.error().message.c_str());
      return 1;
    }
    pk->events = snap->events.size();
    auto nat = std::make_unique<LoadCase>();
    VectorSink sink;
    if (!mf::format::writeSnapshotTrace(*snap, sink).ok()) return 1;
    nat->bytes = std::move(sink.data);
    nat->events = pk->events;
    std::string name = std::filesystem::path(argv[i]).stem().string();
    benchmark::RegisterBenchmark(("BM_Load/pickle/" + name).c_str(), BM_Load, pk.get())
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_Load/native/" + name).c_str(), BM_Load, nat.get())
        ->Unit(benchmark::kMillisecond);
    cases.push_back(std::move(pk));
    cases.push_back(std::move(nat));
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
