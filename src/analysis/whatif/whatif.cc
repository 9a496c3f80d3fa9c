// whatif.cc: the request-driven allocator simulation (see whatif.h and docs/whatif.md). Comments
// cite c10/cuda/CUDACachingAllocator.cpp (CCA) by function name.
#include "analysis/whatif/whatif.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "analysis/frames/frames.h"
#include "common/allocator_constants.h"
#include "common/format_bytes.h"
#include "common/saturating.h"
#include "replay/replay.h"

namespace memforensics::analysis {

namespace {

using format::Action;
using format::Event;
using replay::AllocConf;
using replay::PoolId;

// Base of the simulated address space and the virtual size of an expandable reservation (CCA
// reserves 1.125 x the device memory; any size larger than a card works).
constexpr uint64_t kSimBase = uint64_t{1} << 50;
constexpr uint64_t kSimReservation = uint64_t{1} << 49;  // above kWhatIfMaxRequest

// The request-driven simulation: the caching-allocator core (replay/caching_allocator.h) with the
// card's capacity, the simulated address space and CCA malloc()'s order of attempts.
struct Sim {
  const AllocConf& st;
  uint64_t capacity;
  replay::CachingAllocator core;
  uint64_t next_addr = kSimBase;
  uint64_t reserved = 0, allocated = 0;
  uint64_t segment_allocs = 0, segment_frees = 0;

  Sim(const AllocConf& s, uint64_t cap) : st(s), capacity(cap), core(s) {}

  // The block allocated at `addr`, or nullptr.
  replay::ModelBlock* liveAt(uint64_t addr, replay::CachedSegment** seg) {
    replay::CachedSegment* s = core.segAt(addr);
    if (s == nullptr) return nullptr;
    auto it = s->blocks.find(addr);
    if (it == s->blocks.end() || it->second.isFree()) return nullptr;
    *seg = s;
    return &it->second;
  }
  uint64_t sizeOf(uint64_t addr) {
    replay::CachedSegment* s = nullptr;
    const replay::ModelBlock* b = liveAt(addr, &s);
    return b == nullptr ? 0 : b->size;
  }
  void freeBlock(uint64_t addr) {
    replay::CachedSegment* s = nullptr;
    replay::ModelBlock* b = liveAt(addr, &s);
    if (b == nullptr) return;
    allocated -= b->size;
    core.freeBlock(*s, b);
  }
  uint64_t take(uint64_t addr, uint64_t size) {
    replay::CachedSegment* s = core.segAt(addr);
    replay::ModelBlock* b =
        core.allocFoundBlock(*s, replay::CachingAllocator::blockAt(*s, addr), size);
    allocated += b->size;
    return addr;
  }

  // The simulated address space (from kSimBase up) has room for `bytes` more (a hostile file
  // with very many huge segments or streams runs out: out of memory, never a wrapped address).
  bool roomFor(uint64_t bytes) const {
    return next_addr <= ~uint64_t{0} - kSimBase && bytes <= ~uint64_t{0} - kSimBase - next_addr;
  }
  bool fits(uint64_t bytes) const {
    return capacity == kWhatIfUnlimited || addSat(reserved, bytes) <= capacity;
  }
  // Where the recording's driver put the segments of the request being served: its segment_alloc
  // and segment_map events since the previous request (set by simulateRequests, consumed here). A
  // new segment or reservation goes there when that range is free in the simulation, so a baseline
  // replay can be checked address by address (SimResult::address_agreement); otherwise (another
  // setting made another segment, a hostile address) it goes to the simulated address space.
  std::vector<const Event*> hints;

  // [addr, addr + bytes) is free: no segment overlaps it, except the unmapped tail of an
  // expandable reservation, which is cut there (the recording shows that it ended before; CCA
  // reserves 1.125 x the card, the simulation kSimReservation).
  bool claim(uint64_t addr, uint64_t bytes) {
    if (!replay::validRange(addr, bytes)) return false;
    auto nx = core.segs.upper_bound(addr);
    if (nx != core.segs.end() && nx->first - addr < bytes) return false;
    replay::CachedSegment* s = core.segAt(addr);
    return s == nullptr || core.cutReservationTail(*s, addr);
  }
  // The first hint of `action` at which `bytes` (0: the hint's own size) can be claimed and whose
  // size satisfies `ok`; consumed.
  template <class Ok>
  std::optional<uint64_t> takeHint(Action action, uint64_t bytes, Ok ok) {
    for (const Event*& h : hints) {
      if (h == nullptr || h->action != action || !ok(h->size)) continue;
      if (!claim(h->addr, bytes != 0 ? bytes : h->size)) continue;
      const uint64_t at = h->addr;
      h = nullptr;
      return at;
    }
    return std::nullopt;
  }
  // A synthetic address for `bytes`: the next free range of the simulated address space.
  std::optional<uint64_t> synthetic(uint64_t bytes) {
    for (;;) {
      if (!roomFor(bytes)) return std::nullopt;
      const uint64_t at = next_addr;
      auto nx = core.segs.upper_bound(at);
      const replay::CachedSegment* in = core.segAt(at);
      const replay::CachedSegment* block = in != nullptr ? in
                                           : nx != core.segs.end() && nx->first - at < bytes
                                               ? &nx->second
                                               : nullptr;
      if (block == nullptr) {
        next_addr = addSat(at, addSat(bytes, alloc::kLargeBuffer));
        return at;
      }
      next_addr = addSat(block->address, addSat(block->size, alloc::kLargeBuffer));
    }
  }
  replay::CachedSegment& place(replay::CachedSegment s, uint64_t at, bool mapped) {
    s.address = at;
    replay::ModelBlock b;
    b.address = s.address;
    b.size = s.size;
    b.mapped = mapped;
    s.blocks.emplace(b.address, b);
    return core.addSegment(std::move(s));
  }

  // cudaMalloc of a segment (CCA alloc_block); nullopt when the card is full.
  std::optional<uint64_t> newSegment(const replay::AllocRequest& r) {
    const uint64_t bytes = replay::allocationSize(r.size);
    if (!fits(bytes)) return std::nullopt;
    std::optional<uint64_t> at =
        takeHint(Action::SegmentAlloc, bytes, [&](uint64_t size) { return size == bytes; });
    if (!at) at = synthetic(bytes);
    if (!at) return std::nullopt;
    replay::CachedSegment s;
    s.size = bytes;
    s.stream = r.stream;
    s.pool = r.pool;
    s.is_large = r.large;
    place(std::move(s), *at, true);
    reserved += bytes;
    ++segment_allocs;
    return at;
  }

  // find_expandable_block()'s new reservation (an ExpandableSegment) where the recording mapped
  // the first page of one, sized up to the next segment; nullopt when no hint can be claimed.
  std::optional<uint64_t> hintedReservation(const replay::AllocRequest& r) {
    const uint64_t page = r.large ? alloc::kLargeExpandablePage : alloc::kSmallExpandablePage;
    const std::optional<uint64_t> at = takeHint(Action::SegmentMap, page, [&](uint64_t size) {
      return size % page == 0 && (r.large || size == page);
    });
    if (!at) return std::nullopt;
    uint64_t size = std::min(kSimReservation, ~uint64_t{0} - *at);
    if (auto nx = core.segs.upper_bound(*at); nx != core.segs.end())
      size = std::min(size, nx->first - *at);
    size -= size % page;
    if (size == 0) return std::nullopt;
    return reservation(r, *at, size);
  }
  // The same, else in the simulated address space.
  std::optional<uint64_t> newReservation(const replay::AllocRequest& r) {
    if (auto at = hintedReservation(r)) return at;
    const std::optional<uint64_t> at = synthetic(kSimReservation);
    if (!at) return std::nullopt;
    return reservation(r, *at, kSimReservation);
  }
  uint64_t reservation(const replay::AllocRequest& r, uint64_t at, uint64_t size) {
    replay::CachedSegment s;
    s.size = size;
    s.stream = r.stream;
    s.pool = r.pool;
    s.is_large = r.large;
    s.expandable = true;
    return place(std::move(s), at, false).address;
  }

  // CCA try_allocate_expandable_block(): find_expandable_block() (a new reservation when no
  // unmapped range of the pool and stream has room), then map_block() page range by page range.
  std::optional<uint64_t> expand(const replay::AllocRequest& r) {
    std::optional<uint64_t> c = core.findExpandableBlock(r);
    // A reservation made by a malloc that then failed (find_expandable_block reserves before
    // map_block fails) had no recorded address: its first map, after the OOM, shows it.
    if (c && *c >= kSimBase && !hints.empty()) {
      const replay::CachedSegment* u = core.segAt(*c);
      if (u != nullptr && u->address == *c && u->expandable && u->blocks.size() == 1 &&
          !u->blocks.begin()->second.mapped) {
        const replay::CachedSegment moved = *u;
        core.eraseSegment(moved.address);
        c = hintedReservation(r);
        if (!c) c = core.addSegment(moved).address;  // no recorded place: it stays where it was
      }
    }
    if (!c) c = newReservation(r);
    if (!c) return std::nullopt;
    const bool ok = core.growExpandable(*c, r.size, [&](uint64_t bytes) {
      if (!fits(bytes)) return false;
      reserved += bytes;
      ++segment_allocs;
      return true;
    });
    if (!ok) return std::nullopt;
    return c;
  }

  std::optional<uint64_t> allocBlock(const replay::AllocRequest& r) {
    if (st.expandable_segments) return expand(r);
    return newSegment(r);
  }

  // Segment visits of the cache releases (each visits the segments it can release from): the
  // simulation's work beyond one step per event, against SimChange::max_segment_visits.
  uint64_t visits = 0;
  void account(const replay::Released& rel) {
    reserved -= rel.bytes;
    segment_frees += rel.calls;
    visits += rel.visited;
  }
  void releaseCached() { account(core.releaseCached()); }
  bool gcOn() const { return st.gc_threshold > 0.0 && capacity != kWhatIfUnlimited; }
  // CCA garbage_collect_cached_blocks(): only when reserved is above threshold x capacity (CCA:
  // allowed_memory_maximum, the per-process memory fraction of the card); it reclaims at least
  // reserved - threshold x capacity bytes if it can.
  void garbageCollect() {
    if (!gcOn()) return;
    const auto limit = static_cast<uint64_t>(st.gc_threshold * static_cast<double>(capacity));
    if (reserved <= limit) return;
    account(core.garbageCollect(reserved - limit));
  }

  // CCA malloc(): nullopt = out of memory.
  std::optional<uint64_t> malloc(PoolId pool, uint64_t size, int64_t stream) {
    if (size > kWhatIfMaxRequest) return std::nullopt;
    if (size == 0) size = alloc::kMinBlockSize;  // round_size(0) in a hostile file
    const replay::AllocRequest r{pool, size > alloc::kSmallSize, stream, size};
    if (gcOn()) core.countGetFreeBlock(r);  // CCA get_free_block()
    if (const auto* k = core.getFreeBlock(r)) return take(k->addr, size);
    garbageCollect();  // CCA: before alloc_block, with no second search
    std::optional<uint64_t> a = allocBlock(r);
    if (!a) {
      replay::Released rel;
      const bool released = core.releaseOversize(r, &rel);
      account(rel);
      if (released) a = allocBlock(r);
    }
    if (!a) {
      releaseCached();
      a = allocBlock(r);
    }
    if (!a) return std::nullopt;
    return take(*a, size);
  }

  uint64_t largestFree() const { return core.largestFree(); }
};

PoolId poolOf(const format::Snapshot& snap, const Event& e) {
  if (e.pool != 0 && e.pool < snap.pools.size()) return snap.pools[e.pool];
  return {0, 0};
}

std::string lineOf(const format::Snapshot& snap, format::StackId stack) {
  std::string out;
  for (const FrameText& f : userFrames(snap, stack, kWhatIfOomFrames)) {
    if (!out.empty()) out += " < ";
    out += f.display();
  }
  return out;
}

// Segment bytes of the device in the file's final state.
uint64_t finalReserved(const format::Snapshot& snap, int64_t device) {
  uint64_t r = 0;
  for (const auto& s : snap.segmentsOf(device)) r = addSat(r, s.total_size);
  return r;
}

// Reserved bytes before each event of the recorded trace, from its segment events and the final
// state (the start reserved = final - net change, clamped at 0).
// Sizes are capped at 2^62 and every sum saturates at [-2^62, 2^62]: a hostile trace of many
// huge segments overflowed int64 here (fuzz_pipeline: fuzz/corpus/fuzz_pipeline/whatif-overflow).
std::vector<uint64_t> recordedReserved(const TraceInput& t, uint64_t* peak) {
  auto sat = [](int64_t a, int64_t b) {
    constexpr int64_t cap = int64_t{1} << 62;
    int64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) r = b > 0 ? cap : -cap;
    return std::clamp<int64_t>(r, -cap, cap);
  };
  const std::span<const Event> ev = t.events;
  int64_t net = 0;
  for (const Event& e : ev) {
    const auto sz = static_cast<int64_t>(std::min<uint64_t>(e.size, uint64_t{1} << 62));
    if (e.action == Action::SegmentAlloc || e.action == Action::SegmentMap) net = sat(net, sz);
    if (e.action == Action::SegmentFree || e.action == Action::SegmentUnmap) net = sat(net, -sz);
  }
  const auto fin = static_cast<int64_t>(
      std::min<uint64_t>(finalReserved(t.snap, static_cast<int64_t>(t.d)), uint64_t{1} << 62));
  int64_t cur = std::max<int64_t>(0, sat(fin, -net));
  std::vector<uint64_t> before(ev.size());
  int64_t pk = cur;
  for (size_t i = 0; i < ev.size(); ++i) {
    before[i] = static_cast<uint64_t>(cur);
    const Event& e = ev[i];
    const auto sz = static_cast<int64_t>(std::min<uint64_t>(e.size, uint64_t{1} << 62));
    if (e.action == Action::SegmentAlloc || e.action == Action::SegmentMap) cur = sat(cur, sz);
    if (e.action == Action::SegmentFree || e.action == Action::SegmentUnmap) cur = sat(cur, -sz);
    if (cur < 0) cur = 0;
    pk = std::max(pk, cur);
  }
  if (peak != nullptr) *peak = static_cast<uint64_t>(pk);
  return before;
}

// Frees return memory at free_completed, or at free_requested when the trace has no
// free_completed (skip_actions, or frees that complete on request).
bool freesAtRequest(std::span<const Event> ev) {
  for (const Event& e : ev) {
    if (e.action == Action::FreeCompleted) return false;
  }
  return true;
}

}  // namespace

std::vector<StartBlock> startBlocks(const TraceInput& t) {
  const format::Snapshot& snap = t.snap;
  const std::span<const Event> ev = t.events;
  std::map<uint64_t, StartBlock> out;
  std::unordered_set<uint64_t> seen;  // addresses whose first event was an alloc
  for (const Event& e : ev) {
    if (e.action == Action::Alloc) {
      seen.insert(e.addr);
    } else if ((e.action == Action::FreeRequested || e.action == Action::FreeCompleted) &&
               !seen.count(e.addr) && !out.count(e.addr)) {
      out[e.addr] = {e.addr, e.size, e.stream, poolOf(snap, e)};
    }
  }
  for (const auto& sg : snap.segmentsOf(static_cast<int64_t>(t.d))) {
    for (const auto& b : snap.blocksOf(sg)) {
      if (!b.isActive() || seen.count(b.address) || out.count(b.address)) continue;
      out[b.address] = {b.address,
                        b.has_requested_size ? b.requested_size : b.size,
                        sg.stream,
                        {sg.pool_a, sg.pool_b}};
    }
  }
  std::vector<StartBlock> v;
  for (auto& [a, b] : out) v.push_back(b);
  return v;
}

uint64_t impliedCapacity(const TraceInput& t) {
  const std::span<const Event> ev = t.events;
  auto before = recordedReserved(t, nullptr);
  uint64_t cap = kWhatIfUnlimited;
  uint64_t reached = 0;  // the card held this much before: it is at least that large
  for (size_t i = 0; i < ev.size(); ++i) {
    reached = std::max(reached, before[i]);
    if (ev[i].action == Action::Oom)
      cap = std::min(cap, std::max(reached, addSat(before[i], ev[i].addr)));
  }
  return cap;
}

SimResult simulateRequests(const TraceInput& t, const replay::AllocConf& st, uint64_t capacity,
                           const SimChange& change) {
  const format::Snapshot& snap = t.snap;
  SimResult r;
  r.capacity = capacity;
  Sim sim(st, capacity);
  const std::span<const Event> ev = t.events;
  const bool at_request = freesAtRequest(ev);
  std::vector<uint64_t> rec_before = recordedReserved(t, nullptr);
  const uint64_t rec_cap = impliedCapacity(t);
  std::unordered_map<uint64_t, uint64_t> live;  // recorded address -> simulated address
  // Blocks alive when the trace began, allocated first in address order (their order and the
  // cache around them are not in the file).
  for (const StartBlock& b : startBlocks(t)) {
    const uint64_t rounded = replay::roundSize(b.requested, st.divisions);
    if (auto a = sim.malloc(b.pool, rounded, b.stream)) {
      live[b.address] = *a;
    } else {
      ++r.start_blocks_refused;
    }
  }
  // CCA's allocated_bytes drop at free() (free_requested); the block stays in use (active) until
  // free_block (free_completed): `pending` holds the bytes between the two.
  std::unordered_map<uint64_t, uint64_t> pending_blocks;  // recorded address -> block bytes
  uint64_t pending = 0;
  bool changed = false;
  size_t next_request = 0;  // the segment-release runs' look-ahead cursor (below)
  size_t next_early = 0;    // the next of change.early_frees
  auto isRequest = [](Action a) {
    return a == Action::SegmentAlloc || a == Action::SegmentMap || a == Action::Oom ||
           a == Action::Alloc;
  };
  auto note = [&]() {
    if (changed)
      r.peak_reserved_after_change = std::max(r.peak_reserved_after_change, sim.reserved);
    if (sim.reserved > r.peak_reserved) {
      r.peak_reserved = sim.reserved;
      r.allocated_at_peak_reserved = sim.allocated;
    }
    r.peak_allocated = std::max(r.peak_allocated, sim.allocated - pending);
  };
  auto addOom = [&](SimOom o) {
    if (r.ooms.size() < kWhatIfMaxOoms) r.ooms.push_back(std::move(o));
  };
  auto failWhy = [&](uint64_t rounded) {
    if (capacity != kWhatIfUnlimited && addSat(sim.allocated, rounded) > capacity) {
      return "live bytes " + formatBytes(sim.allocated) + " plus the request " +
             formatBytes(rounded) + " exceed the capacity " + formatBytes(capacity) +
             ": no allocator setting can serve it";
    }
    return "reserved " + formatBytes(sim.reserved) + " of " + formatBytes(capacity) +
           " after releasing the cache; " + formatBytes(sim.reserved - sim.allocated) +
           " free in cached blocks, the largest " + formatBytes(sim.largestFree()) +
           " (fragmentation)";
  };
  for (size_t i = 0; i < ev.size(); ++i) {
    if (sim.visits > change.max_segment_visits) {
      r.aborted = true;  // a budget the caller set: its figures stop here
      break;
    }
    const Event& e = ev[i];
    for (; next_early < change.early_frees.size() &&
           change.early_frees[next_early].first <= static_cast<int64_t>(i);
         ++next_early) {
      const int64_t made = change.early_frees[next_early].second;
      if (made < 0 || static_cast<size_t>(made) >= i || ev[made].action != Action::Alloc) continue;
      // The recorded address stays taken until its recorded free, so it still names this block
      // (absent when the simulation refused the request, or when it was freed already).
      auto it = live.find(ev[static_cast<size_t>(made)].addr);
      if (it == live.end()) continue;
      if (auto p = pending_blocks.find(it->first); p != pending_blocks.end()) {
        pending -= p->second;
        pending_blocks.erase(p);
      }
      sim.freeBlock(it->second);
      live.erase(it);  // its recorded free finds nothing and is skipped
    }
    if (!changed && change.empty_cache_before >= 0 &&
        static_cast<int64_t>(i) >= change.empty_cache_before) {
      sim.releaseCached();
      changed = true;
      note();
    }
    switch (e.action) {
      case Action::SegmentAlloc:
      case Action::SegmentMap:
        sim.hints.push_back(&e);  // for the next request (Sim::hints)
        break;
      case Action::Alloc: {
        const uint64_t rounded = replay::roundSize(e.size, st.divisions);
        auto a = sim.malloc(poolOf(snap, e), rounded, e.stream);
        sim.hints.clear();
        ++r.address_total;
        if (a) {
          r.address_predicted += *a == e.addr;
          live[e.addr] = *a;
        } else {
          ++r.oom_count;
          addOom({static_cast<int64_t>(i), e.size, rounded, e.stream, e.stack,
                  lineOf(snap, e.stack), sim.reserved, sim.allocated, false, false,
                  failWhy(rounded)});
        }
        break;
      }
      case Action::FreeRequested:
      case Action::FreeCompleted: {
        auto it = live.find(e.addr);
        if (it == live.end()) break;  // before the trace, or a request the what-if refused
        if (e.action == Action::FreeRequested && !at_request) {
          if (pending_blocks.emplace(e.addr, sim.sizeOf(it->second)).second)
            pending += pending_blocks[e.addr];
          break;
        }
        if ((e.action == Action::FreeRequested) != at_request) break;
        if (auto p = pending_blocks.find(e.addr); p != pending_blocks.end()) {
          pending -= p->second;
          pending_blocks.erase(p);
        }
        sim.freeBlock(it->second);
        live.erase(it);
        break;
      }
      case Action::Oom: {
        // The recorded OOM's request (e.size is already rounded, CCA params.size()).
        auto a = sim.malloc(poolOf(snap, e), e.size, e.stream);
        sim.hints.clear();
        SimOom o{static_cast<int64_t>(i),
                 e.size,
                 e.size,
                 e.stream,
                 e.stack,
                 lineOf(snap, e.stack),
                 sim.reserved,
                 sim.allocated,
                 true,
                 a.has_value(),
                 ""};
        if (a) {
          note();
          ++r.recorded_avoided;
          o.why = "served: reserved " + formatBytes(sim.reserved) + " of " +
                  (capacity == kWhatIfUnlimited ? std::string("an unlimited card")
                                                : formatBytes(capacity));
          sim.freeBlock(*a);  // what the program did next is the recording's (the exception)
        } else {
          ++r.oom_count;
          ++r.recorded_failed;
          o.why = failWhy(e.size);
        }
        addOom(std::move(o));
        break;
      }
      case Action::SegmentFree:
      case Action::SegmentUnmap: {
        // A run of releases. When the recording could not have needed it (the next request fit
        // the card), the program called torch.cuda.empty_cache(): replay that call. Otherwise it
        // was the allocator's own reaction to a full card, which the simulation makes itself.
        size_t j = i;
        while (j + 1 < ev.size() && (ev[j + 1].action == Action::SegmentFree ||
                                     ev[j + 1].action == Action::SegmentUnmap))
          ++j;
        bool own = st.gc_threshold > 0.0;
        // The first request after the run (found by a cursor that only moves forward: a trace of
        // many release runs and no request after them costs one scan, not one per run).
        if (next_request <= j) {
          next_request = j + 1;
          while (next_request < ev.size() && !isRequest(ev[next_request].action)) ++next_request;
        }
        if (!own && next_request < ev.size()) {
          const Event& k = ev[next_request];
          if (k.action == Action::SegmentAlloc || k.action == Action::SegmentMap)
            own = rec_cap != kWhatIfUnlimited && addSat(rec_before[i], k.size) > rec_cap;
          else if (k.action == Action::Oom)
            own = true;
        }
        if (!own) {
          ++r.empty_cache_calls;
          sim.releaseCached();
        }
        i = j;
        break;
      }
      default:
        break;
    }
    note();
  }
  if (!changed && change.empty_cache_before >= 0) {  // at or past the end: after the last event
    sim.releaseCached();
    changed = true;
    note();
  }
  r.segment_allocs = sim.segment_allocs;
  r.segment_frees = sim.segment_frees;
  r.segment_visits = sim.visits;
  if (sim.visits > change.max_segment_visits) r.aborted = true;  // over it at the last event
  return r;
}

TraceInput traceInput(const format::Snapshot& snap, size_t d) {
  return {snap, d, snap.trace(d)};
}

WhatIfResult runWhatIf(const format::Snapshot& snap, const WhatIfOptions& opt, std::string* error) {
  WhatIfResult res;
  res.base_settings = replay::allocConfOf(snap);
  res.what_settings = res.base_settings;
  for (const auto& [k, v] : opt.sets) {
    std::string why = replay::applyAllocSetting(res.what_settings, k, v);
    if (!why.empty()) {
      if (error != nullptr) *error = why;
      return res;
    }
  }
  res.capacity_given = opt.capacity.has_value();
  for (size_t d = 0; d < snap.traceCount(); ++d) {
    const auto dev = static_cast<int64_t>(d);
    if (opt.device && *opt.device != dev) continue;
    const TraceInput t = traceInput(snap, d);
    if (t.events.empty()) continue;
    DeviceWhatIf w = recordedFacts(t);
    const uint64_t implied = impliedCapacity(t);
    w.baseline = simulateRequests(t, res.base_settings, implied);
    const uint64_t what_cap = opt.capacity.value_or(implied);
    w.whatif_is_baseline = opt.sets.empty() && what_cap == implied;
    w.whatif = w.whatif_is_baseline ? w.baseline : simulateRequests(t, res.what_settings, what_cap);
    if (w.whatif.oom_count > 0) {
      SimChange budget;  // the search's work, bounded as the OOM verdict's (x4: asked for)
      budget.max_segment_visits = 4 * kReplayCheckVisits;
      const SmallestCard card = smallestCard(t, res.what_settings, budget);
      w.smallest_capacity = card.capacity;
      w.smallest_capacity_slack = card.slack;
      w.smallest_capacity_budget_ran_out = card.budget_ran_out;
    }
    res.devices.push_back(std::move(w));
  }
  return res;
}

SmallestCard smallestCard(const TraceInput& t, const replay::AllocConf& s,
                          const SimChange& change) {
  SmallestCard out;
  SimChange budget = change;  // what is left of the search's budget
  const SimResult free_run = simulateRequests(t, s, kWhatIfUnlimited, budget);
  out.budget_ran_out = free_run.aborted;
  if (free_run.oom_count > 0 || free_run.aborted) return out;  // no card, or no answer
  budget.max_segment_visits = subSat(budget.max_segment_visits, free_run.segment_visits);
  // Without a limit the allocator never gives its cache back: its peak reserved is a capacity that
  // serves every request; none below the peak allocated can. Segments and pages are whole 2 MiB
  // units, so the least capacity is one too: the bisection runs over units and ends exact.
  const uint64_t unit = kSmallestCardUnit;
  uint64_t ok = mulSat((free_run.peak_reserved + unit - 1) / unit, unit);
  uint64_t lo = (free_run.peak_allocated + unit - 1) / unit * unit;  // the least candidate
  lo = lo >= unit ? lo - unit : 0;  // the largest capacity known (or assumed) to fail
  for (int step = 0; step < kSmallestCardSteps && ok - lo > unit; ++step) {
    const uint64_t mid = lo + (ok - lo) / unit / 2 * unit;
    const SimResult r = simulateRequests(t, s, mid, budget);
    budget.max_segment_visits = subSat(budget.max_segment_visits, r.segment_visits);
    if (r.aborted) {  // out of budget: the card found so far, and how far it may be off
      out.budget_ran_out = true;
      break;
    }
    if (r.oom_count == 0) {
      ok = mid;
    } else {
      lo = mid;
    }
  }
  out.capacity = ok;
  out.slack = ok - lo - unit;
  return out;
}

DeviceWhatIf recordedFacts(const TraceInput& t) {
  replay::DeviceReplayer r(t.snap, static_cast<int64_t>(t.d), t.events);
  return recordedFacts(t, replay::summarizeDevice(r));
}

DeviceWhatIf recordedFacts(const TraceInput& t, const replay::DeviceSummary& summary) {
  DeviceWhatIf w;
  w.replay_untrusted = summary.untrusted;
  w.replay_untrusted_cause = summary.untrusted_cause;
  w.device = static_cast<int64_t>(t.d);
  const std::span<const Event> ev = t.events;
  recordedReserved(t, &w.recorded_peak_reserved);
  const bool at_request = freesAtRequest(ev);
  std::unordered_set<uint64_t> alive;
  for (const Event& e : ev) {
    if (e.action == Action::Alloc) alive.insert(e.addr);
    if (e.action == Action::Oom) ++w.recorded_ooms;
    if (e.action == Action::SegmentAlloc || e.action == Action::SegmentMap)
      ++w.recorded_segment_allocs;
    if (e.action == Action::SegmentFree || e.action == Action::SegmentUnmap)
      ++w.recorded_segment_frees;
    if ((e.action == Action::FreeRequested && at_request) ||
        (e.action == Action::FreeCompleted && !at_request)) {
      if (alive.erase(e.addr) == 0) ++w.unknown_frees;
    }
  }
  w.start_blocks = startBlocks(t).size();
  w.complete_history = w.start_blocks == 0;
  w.recorded_expandable = replay::allocConfOf(t.snap).expandable_segments;
  return w;
}

std::vector<uint64_t> whatIfSplitSizesMb(const TraceInput& t, const replay::AllocConf& base) {
  constexpr uint64_t kMiB = 1048576;
  uint64_t oom_max = 0, alloc_max = 0;
  for (const Event& e : t.events) {
    if (e.action == Action::Oom) oom_max = std::max(oom_max, e.size);
    if (e.action == Action::Alloc) alloc_max = std::max(alloc_max, e.size);
  }
  const uint64_t r = std::min(oom_max > 0 ? oom_max : alloc_max, kWhatIfMaxRequest);
  std::vector<uint64_t> out;
  const uint64_t mb = r / kMiB;
  if (mb < 32) return out;
  const uint64_t v1 = uint64_t{1} << (63 - __builtin_clzll(mb));
  for (uint64_t v : {v1, v1 / 4}) {
    if (v > 20 && (v << 20) != base.max_split_size) out.push_back(v);
  }
  return out;
}

std::string whatIfEstimateReason(const DeviceWhatIf& d, const replay::AllocConf& s) {
  if (!d.complete_history)
    return "history incomplete: " + std::to_string(d.start_blocks) +
           " blocks were alive when the trace began (their order and the cache around them are "
           "not in the file)";
  if (d.replay_untrusted != 0)
    return std::string(d.replay_untrusted_cause) +
           ": the requests it replays are not the whole program's";
  if (d.baseline.peak_reserved != d.recorded_peak_reserved)
    return "the baseline's peak reserved (" + formatBytes(d.baseline.peak_reserved) +
           ") is not the recorded one (" + formatBytes(d.recorded_peak_reserved) + ")";
  if (d.baseline.segment_allocs != d.recorded_segment_allocs ||
      d.baseline.segment_frees != d.recorded_segment_frees)
    return "the baseline made " + std::to_string(d.baseline.segment_allocs) +
           " cudaMalloc/map and " + std::to_string(d.baseline.segment_frees) +
           " cudaFree/unmap calls where the file has " + std::to_string(d.recorded_segment_allocs) +
           " and " + std::to_string(d.recorded_segment_frees);
  if (d.baseline.address_predicted != d.baseline.address_total)
    return "the baseline served " + std::to_string(d.baseline.address_predicted) + " of " +
           std::to_string(d.baseline.address_total) + " allocs at the address the file recorded";
  if (s.expandable_segments && !d.recorded_expandable)
    return "this file was recorded without expandable segments, so its baseline does not check "
           "the simulation's page mapping (on recordings with them it reproduces every address: "
           "docs/whatif.md)";
  if (s.gc_threshold > 0.0)
    return "garbage collection takes the card as the process's memory fraction (CCA collects only "
           "under torch.cuda.set_per_process_memory_fraction)";
  return "";
}

}  // namespace memforensics::analysis
