// whatif.h: the allocator what-if (issue 14 part 1, docs/whatif.md).
//
// Replays a device's recorded REQUEST stream (alloc sizes, frees, streams, pools and their order;
// recorded OOMs as the requests that failed) through a simulation of PyTorch's CUDA caching
// allocator under other settings and/or another card capacity, with the allocator's reaction to a
// failed cudaMalloc (garbage collection when a threshold is set, release of oversize cached blocks,
// release of every cached segment / unmap of fully free pages, retry, then OOM). The blocks and
// every rule are the caching-allocator core of replay/caching_allocator.h, the one the
// event-driven DeviceAllocatorModel checks against every recorded address; settings are
// replay::AllocConf (replay/alloc_conf.h, the one parser of PYTORCH_CUDA_ALLOC_CONF).
//
// What it cannot change: what the program asked for (sizes, order, lifetimes). After an OOM the
// recording shows the program's reaction to the exception; a what-if that avoids the OOM still
// replays that reaction (the avoided request is freed at once).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/model/snapshot.h"
#include "replay/alloc_conf.h"
#include "replay/caching_allocator.h"
#include "replay/replay.h"

namespace memforensics::analysis {

// "Unlimited" capacity.
inline constexpr uint64_t kWhatIfUnlimited = ~uint64_t{0};
// A request above this (256 TiB) fails at once as out of memory: no card holds it, and the
// simulation's address and byte arithmetic stay far from 2^64 on hostile sizes.
inline constexpr uint64_t kWhatIfMaxRequest = uint64_t{1} << 48;
// User frames shown per OOM.
inline constexpr size_t kWhatIfOomFrames = 3;
// OOMs listed per run (the count is always complete).
inline constexpr size_t kWhatIfMaxOoms = 64;
struct SimOom {
  int64_t event = -1;      // index in the device's trace
  uint64_t requested = 0;  // bytes the program asked for
  uint64_t rounded = 0;    // after round_size
  int64_t stream = 0;
  format::StackId stack = format::kNoStack;
  std::string line;       // innermost user frames ("model.py:54 forward < ..."), or ""
  uint64_t reserved = 0;  // simulated reserved / allocated when it failed (or was served)
  uint64_t allocated = 0;
  bool recorded = false;  // an OOM of the file (else a new one of the what-if)
  bool avoided = false;   // recorded only: the what-if served the request
  std::string why;
};

struct SimResult {
  uint64_t capacity = kWhatIfUnlimited;
  uint64_t peak_reserved = 0;
  uint64_t peak_allocated = 0;
  uint64_t allocated_at_peak_reserved = 0;  // fragmentation at the peak = 1 - this / peak
  uint64_t oom_count = 0;                   // requests that failed
  uint64_t recorded_avoided = 0;            // recorded OOMs the simulation served
  uint64_t recorded_failed = 0;             // recorded OOMs it did not (oom_count - this: new ones)
  std::vector<SimOom> ooms;                 // the first kWhatIfMaxOoms, recorded ones included
  uint64_t empty_cache_calls = 0;           // recorded segment releases replayed as empty_cache()
  uint64_t start_blocks_refused = 0;        // start blocks that did not fit the capacity
  uint64_t segment_allocs = 0;  // cudaMallocs (segment_alloc) and page maps (segment_map)
  uint64_t segment_frees = 0;   // cudaFrees (segment_free) and page unmaps (segment_unmap)
  // Recorded allocs, and those the simulation served at the address the file recorded (a new
  // segment is placed where the recording's driver put it when that range is free). On a complete
  // history under the file's own settings every one should be: the proof that the simulation is
  // the allocator the address-checking model verified.
  uint64_t address_total = 0;
  uint64_t address_predicted = 0;
  // With SimChange::empty_cache_before: the peak reserved from that call on (its moment included).
  uint64_t peak_reserved_after_change = 0;
  // Stopped before the end: its cache releases visited more than SimChange::max_segment_visits
  // segments. Its figures cover only the events before; no answer may rest on them.
  bool aborted = false;
  uint64_t segment_visits = 0;  // the work counted against that budget
};

// What a simulation does that the recording did not (a fix a finding checks before it says it).
struct SimChange {
  // torch.cuda.empty_cache() just before event `empty_cache_before` of the trace (-1: never).
  int64_t empty_cache_before = -1;
  // Allocations freed earlier than the recording freed them: (before, alloc) frees the block the
  // trace's alloc event `alloc` made just before event `before` is replayed, and its recorded
  // free is then skipped. Sorted by `before`. (A retention finding checks its fix with it.)
  std::vector<std::pair<int64_t, int64_t>> early_frees;
  // A work budget: the replay stops (SimResult::aborted) once its cache releases have visited
  // more segments than this. A release visits only the segments it can take something from
  // (CachingAllocator::releaseCached), but a hostile trace of many cached segments that a release
  // keeps (another stream, below max_split_size, expandable blocks without a whole free page) and
  // many failed requests would otherwise still make a replay quadratic.
  uint64_t max_segment_visits = ~uint64_t{0};
};

// The budget a finding's check or a search gives each replay (segment visits).
inline constexpr uint64_t kReplayCheckVisits = uint64_t{1} << 26;

// One device trace as every replay here reads it: the snapshot (its settings, final segments and
// pools) and the device's events as the caller holds them (a session's DeviceFacts::events, which
// for a deferred snapshot is the device decoded once for all its replays). `events` must be
// snap's trace d and outlive the call.
struct TraceInput {
  const format::Snapshot& snap;
  size_t d = 0;
  std::span<const format::Event> events;
};
// Device trace d with the events the snapshot holds in memory (Snapshot::trace).
TraceInput traceInput(const format::Snapshot& snap, size_t d);

// A block alive when the trace began: freed in the trace before any alloc of its address, or
// active in the final state and never allocated in the trace.
struct StartBlock {
  uint64_t address = 0;
  uint64_t requested = 0;
  int64_t stream = 0;
  replay::PoolId pool{0, 0};
};
std::vector<StartBlock> startBlocks(const TraceInput& t);

struct DeviceWhatIf {
  int64_t device = 0;
  uint64_t recorded_peak_reserved = 0;  // from the file's segment events (and start state)
  uint64_t recorded_ooms = 0;
  bool complete_history = true;      // no block alive before the trace began
  bool recorded_expandable = false;  // the file's own settings have expandable segments
  uint64_t unknown_frees = 0;        // frees of blocks allocated before the trace
  uint64_t start_blocks = 0;         // blocks alive at the start (seeded into the simulation)
  uint64_t recorded_segment_allocs = 0, recorded_segment_frees = 0;  // incl. maps / unmaps
  // The replay's replay::UntrustedFigure bits for this device: non-zero when the trace cannot lead
  // to the file's final state (events missing from it), so the program it replays is not the
  // whole program and no simulation of it is exact.
  uint8_t replay_untrusted = 0;
  std::string_view replay_untrusted_cause;  // replay::DeviceSummary::untrusted_cause
  SimResult baseline, whatif;
  // When the what-if runs out of memory: the smallest card found on which the what-if's settings
  // serve every request (checked by replay), else kWhatIfUnlimited (none needed, or no card can:
  // a request above kWhatIfMaxRequest). smallest_capacity_slack: how far above the least such card
  // it may be (0 unless the search ran out of kSmallestCardSteps halvings).
  uint64_t smallest_capacity = kWhatIfUnlimited;
  uint64_t smallest_capacity_slack = 0;
  bool smallest_capacity_budget_ran_out = false;  // the search stopped on its work budget
  bool whatif_is_baseline = false;  // same settings and capacity: one simulation, said once
};

// The search for the smallest card: at most this many halvings (each one simulation of the
// device's trace), over whole units of 2 MiB (the allocator's segments and pages are multiples of
// it, so the least capacity is too): exact within 2^16 units (128 GiB between the bounds).
inline constexpr int kSmallestCardSteps = 16;
inline constexpr uint64_t kSmallestCardUnit = uint64_t{2} << 20;
struct SmallestCard {
  uint64_t capacity = kWhatIfUnlimited;  // kWhatIfUnlimited: no card serves every request
  uint64_t slack = 0;                    // the least such card lies in [capacity - slack, capacity]
  bool budget_ran_out = false;           // a replay ran out of the search's work budget
};
// The smallest card on which device trace `d` replays under `s` with no OOM: the replay without a
// limit gives the most a card needs (its peak reserved) and the least (its peak allocated); a
// bisection between them keeps the smallest card that served every request. Assumes more memory
// never adds an OOM (PyTorch's allocator only frees its cache when a cudaMalloc fails).
// `change`: its max_segment_visits bounds the whole search (every replay's visits count); a replay
// that runs out ends it (the smallest card found so far, with its slack; kWhatIfUnlimited when
// the first one ran out).
SmallestCard smallestCard(const TraceInput& t, const replay::AllocConf& s,
                          const SimChange& change = {});

struct WhatIfOptions {
  std::optional<int64_t> device;
  std::vector<std::pair<std::string, std::string>> sets;  // KEY=VALUE, in order
  std::optional<uint64_t> capacity;                       // else what the file implies
};

struct WhatIfResult {
  replay::AllocConf base_settings, what_settings;
  bool capacity_given = false;
  std::vector<DeviceWhatIf> devices;
};

// Simulates device trace `d` of `snap`. `capacity`: kWhatIfUnlimited for none.
SimResult simulateRequests(const TraceInput& t, const replay::AllocConf& s, uint64_t capacity,
                           const SimChange& change = {});
// The capacity the file implies for device trace `d`: reserved + device_free at its tightest OOM
// (at least the reserved bytes the recording reached before it: the card held them; device_free
// also moves with other processes), kWhatIfUnlimited when it has no OOM.
uint64_t impliedCapacity(const TraceInput& t);

// The whole command: "" in `error` on success (else a refused setting).
WhatIfResult runWhatIf(const format::Snapshot& snap, const WhatIfOptions& opt, std::string* error);

// What the file itself says of device trace `d` (recorded peak reserved, OOMs, segment events,
// start blocks, complete_history, the replay's untrusted figures); baseline and whatif left empty.
// runWhatIf's per-device facts. The first form replays the device to learn whether its trace
// leads to the file's final state; the second takes that answer from a caller that has it
// (the same device's replay summary).
DeviceWhatIf recordedFacts(const TraceInput& t);
DeviceWhatIf recordedFacts(const TraceInput& t, const replay::DeviceSummary& summary);

// The max_split_size_mb values worth trying on device trace `d` (the report's what-if panel and the
// OOM verdict's tested fix share this one choice): with R the largest recorded OOM request (else
// the largest alloc request), the largest power of two of MiB not above R and a quarter of it,
// those above 20 MiB (CCA's minimum) and unlike `base`'s own; empty below 32 MiB.
std::vector<uint64_t> whatIfSplitSizesMb(const TraceInput& t, const replay::AllocConf& base);

// "" when a simulation under `s` of the device `d` describes may be called exact (a complete
// history whose baseline reproduced the recorded peak reserved and served every alloc at its
// recorded address, under settings whose paths that baseline exercised or the simulation follows
// as CCA does), else why its figures are an estimate, in words. `d.baseline` must be set.
std::string whatIfEstimateReason(const DeviceWhatIf& d, const replay::AllocConf& s);

}  // namespace memforensics::analysis
