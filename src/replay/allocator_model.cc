// allocator_model.cc: the caching allocator's block layout, seeded from the start state and driven
// by the trace (see allocator_model.h). Comments cite c10/cuda/CUDACachingAllocator.cpp (CCA) by
// function name; the policy is the one of format doc section 8 where it agrees with the source.
#include "replay/allocator_model.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <tuple>

#include "common/allocator_constants.h"
#include "replay/pass_stats.h"

namespace memforensics::replay {

using format::BlockState;

namespace {

// Virtual size of an expandable reservation whose end the file does not tell (CCA
// find_expandable_block reserves 1.125 x the device memory): large enough never to run out.
constexpr uint64_t kReservationBytes = uint64_t{1} << 44;

// Bytes of a reservation at `address`: kReservationBytes, less where it would pass 2^64.
uint64_t reservationAt(uint64_t address) {
  return std::min(kReservationBytes, ~uint64_t{0} - address);
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Internal state.

struct DeviceAllocatorModel::Impl {
  using Seg = CachedSegment;
  CachingAllocator core;                // the blocks and CCA's rules
  std::optional<uint64_t> pending_new;  // where the next alloc goes after a segment_alloc/map
  // Upper bound of a reservation's bytes per pool kind (0 small, 1 large), learnt when a new
  // reservation of the kind begins inside an older one's unmapped tail.
  uint64_t reservation_bound[2] = {~uint64_t{0}, ~uint64_t{0}};
  bool group_open = false;  // a segment_alloc/map since the last alloc

  // Fixed after construction.
  const format::Snapshot* snap = nullptr;
  std::span<const format::Event> events;
  std::map<uint64_t, Seg> start;    // seeded start state
  std::vector<int64_t> next_alloc;  // per event: the next alloc's index (-1: none, or an oom first)
  bool complete_on_request = false;  // skip_actions dropped free_completed: free_requested frees
  std::map<uint64_t, std::pair<PoolId, bool>> final_kind;  // final segments: (pool, is_large)

  explicit Impl(const AllocConf& conf) : core(conf) {}
  Seg* segAt(uint64_t addr) { return core.segAt(addr); }
  const Seg* segAt(uint64_t addr) const { return core.segAt(addr); }
};

namespace {

using Impl = DeviceAllocatorModel::Impl;
using Seg = Impl::Seg;
using Key = CachingAllocator::Key;
using Request = AllocRequest;
using format::Event;

void addMismatch(ModelCheck* c, size_t i, Action a, uint64_t recorded, uint64_t predicted,
                 std::string why) {
  if (c == nullptr || c->first_mismatches.size() >= ModelCheck::kMaxMismatches) return;
  c->first_mismatches.push_back({static_cast<int64_t>(i), a, recorded, predicted, std::move(why)});
}

// Pool routing (CUDA graph capture, MemPool) is not in pre-2.12 traces: use the event's pool_id
// when it has one, else the pool of the segment that holds the recorded address, else the default.
Request requestOf(const Impl& m, const Event& e, bool segment_known = true) {
  Request r;
  r.size = roundSize(e.size, m.core.conf().divisions);
  r.large = r.size > kModelSmallSize;  // CCA get_pool(): size <= kSmallSize -> small_blocks
  r.stream = e.stream;
  if (e.pool != 0 && e.pool < m.snap->pools.size()) {
    r.pool = m.snap->pools[e.pool];
  } else if (const Seg* s = segment_known ? m.segAt(e.addr) : nullptr) {
    r.pool = s->pool;
  }
  return r;
}

PoolId eventPoolOf(const Impl& m, const Event& e) {
  if (e.pool != 0 && e.pool < m.snap->pools.size()) return m.snap->pools[e.pool];
  return {0, 0};
}

std::string poolName(const Request& r) {
  return alloc::poolName(r.large, r.pool.first, r.pool.second) + " pool, stream " +
         std::to_string(r.stream);
}

void applyAlloc(Impl& m, size_t i, const Event& e, ModelCheck* c) {
  const Request r = requestOf(m, e);
  uint64_t predicted = 0;
  std::string why;
  if (m.pending_new) {
    // CCA malloc(): a block from alloc_block() (new segment / mapped pages) is used directly.
    predicted = *m.pending_new;
    why = "the preceding segment event prepared " + hex(predicted);
  } else if (const Key* k = m.core.getFreeBlock(r)) {
    predicted = k->addr;
    why = "best fit in the " + poolName(r) + " is " + hex(k->addr) + " (" +
          std::to_string(k->size) + " bytes)";
  } else {
    why = "no free block of the " + poolName(r) + " holds " + std::to_string(r.size) +
          " bytes (largest " + std::to_string(m.core.largestFree(r)) +
          "), so a new segment was expected, but the trace reuses " + hex(e.addr);
  }
  if (c != nullptr) {
    ++c->allocs;
    if (predicted == e.addr) {
      ++c->alloc_matches;
    } else {
      addMismatch(c, i, Action::Alloc, e.addr, predicted, why);
    }
  }
  m.pending_new.reset();
  m.group_open = false;

  Seg* s = m.segAt(e.addr);
  if (s == nullptr) return;  // outside every segment: nothing to lay out
  ModelBlock* b = CachingAllocator::blockAt(*s, e.addr);
  if (b == nullptr || !b->isFree() || !b->mapped) return;  // the model lost sync; keep going
  b = m.core.splitAt(*s,
                     e.addr);  // only when the model drifted: the address is inside a free block
  b = m.core.allocFoundBlock(*s, b, r.size);
  b->requested = e.size;
  b->stack = e.stack;
  b->alloc_event = static_cast<int64_t>(i);
}

ModelBlock* liveBlockAt(Impl& m, uint64_t addr, Seg** seg) {
  Seg* s = m.segAt(addr);
  if (s == nullptr) return nullptr;
  auto it = s->blocks.find(addr);
  if (it == s->blocks.end() || it->second.isFree()) return nullptr;
  *seg = s;
  return &it->second;
}

// The request the next alloc will make (for segment events), or nullopt.
std::optional<Request> nextRequest(const Impl& m, size_t i) {
  int64_t j = m.next_alloc[i];
  if (j < 0) return std::nullopt;
  const Event& a = m.events[static_cast<size_t>(j)];
  Request r = requestOf(m, a, false);
  if (a.action == Action::Oom) {
    // CCA malloc() records the OOM with params.size(): the rounded request of the failed malloc.
    r.size = a.size;
    r.large = a.size > kModelSmallSize;
  }
  if (a.pool == 0) {
    if (auto it = m.final_kind.find(m.events[i].addr); it != m.final_kind.end())
      r.pool = it->second.first;
    else if (const Seg* s = a.action == Action::Alloc ? m.segAt(a.addr) : nullptr)
      r.pool = s->pool;
  }
  return r;
}

// A segment event the model ignores: size 0 or an end past 2^64 (replay counts
// InvalidSegmentRange).
bool rejectInvalidRange(size_t i, const Event& e, ModelCheck* c) {
  if (validRange(e.addr, e.size)) return false;
  if (c != nullptr) {
    ++c->segment_events;
    addMismatch(c, i, e.action, e.addr, 0, "the range is empty or passes 2^64 (ignored)");
  }
  return true;
}

// True when [addr, addr + size) overlaps a segment of the model.
bool overlapsModel(const Impl& m, uint64_t addr, uint64_t size) {
  if (m.segAt(addr) != nullptr) return true;
  auto nx = m.core.segs.upper_bound(addr);
  return nx != m.core.segs.end() && nx->first - addr < size;
}

// The group of an expandable reservation: CCA keeps one ExpandableSegment per BlockPool (private
// pool x small/large) and stream.
bool sameGroup(const Seg& s, PoolId pool, bool large, int64_t stream) {
  return s.pool == pool && s.is_large == large && s.stream == stream;
}

void applySegmentAlloc(Impl& m, size_t i, const Event& e, ModelCheck* c) {
  if (rejectInvalidRange(i, e, c)) return;
  auto r = nextRequest(m, i);
  if (c != nullptr) {
    ++c->segment_events;
    std::string why;
    if (!r) {
      why = "no alloc follows the segment_alloc";
    } else if (const Key* k = m.core.getFreeBlock(*r)) {
      why = "the free block " + hex(k->addr) + " (" + std::to_string(k->size) + " bytes) of the " +
            poolName(*r) + " fits the next alloc (" + std::to_string(r->size) + " bytes)";
    } else if (allocationSize(r->size) != e.size) {
      why = "segment of " + std::to_string(e.size) + " bytes, get_allocation_size(" +
            std::to_string(r->size) + ") = " + std::to_string(allocationSize(r->size));
    } else if (m.events[static_cast<size_t>(m.next_alloc[i])].addr != e.addr) {
      why = "the next alloc is not at the new segment's base";
    }
    if (why.empty()) {
      ++c->segment_matches;
    } else {
      addMismatch(c, i, Action::SegmentAlloc, e.addr, 0, why);
    }
  }
  // The end of a reservation is not in the file: a cudaMalloc'd segment inside its unmapped tail
  // shows where its address space ends.
  if (Seg* r = m.segAt(e.addr); r != nullptr && r->expandable)
    m.core.cutReservationTail(*r, e.addr);
  if (overlapsModel(m, e.addr, e.size)) return;  // overlaps the model: it drifted
  Seg s;
  s.address = e.addr;
  s.size = e.size;
  s.stream = e.stream;
  if (r && m.events[static_cast<size_t>(m.next_alloc[i])].addr - e.addr < e.size) {
    s.pool = r->pool;
    s.is_large = r->large;
  } else if (auto it = m.final_kind.find(e.addr); it != m.final_kind.end()) {
    std::tie(s.pool, s.is_large) = it->second;
  } else {
    s.pool = eventPoolOf(m, e);
    s.is_large = alloc::isLargeSegmentSize(e.size);
  }
  ModelBlock b;
  b.address = e.addr;
  b.size = e.size;
  s.blocks.emplace(b.address, b);
  m.core.addSegment(std::move(s));
  m.pending_new = e.addr;
  m.group_open = true;
}

void applySegmentFree(Impl& m, size_t i, const Event& e, ModelCheck* c) {
  if (rejectInvalidRange(i, e, c)) return;
  auto it = m.core.segs.find(e.addr);
  if (c != nullptr) {
    ++c->segment_events;
    std::string why;
    if (it == m.core.segs.end() || it->second.expandable) {
      why = "the model has no segment at " + hex(e.addr);
    } else if (it->second.size != e.size) {
      why = "the model's segment has " + std::to_string(it->second.size) + " bytes";
    } else if (!it->second.whollyFree()) {
      // CCA release_blocks(): only a segment that is one free block (!prev && !next) is freed.
      why = "the model's segment is split into " + std::to_string(it->second.blocks.size()) +
            " blocks";
    }
    if (why.empty()) {
      ++c->segment_matches;
    } else {
      addMismatch(c, i, Action::SegmentFree, e.addr, 0, why);
    }
  }
  if (it == m.core.segs.end() || it->second.expandable) return;
  m.core.eraseSegment(e.addr);
}

void applySegmentMap(Impl& m, size_t i, const Event& e, ModelCheck* c) {
  if (rejectInvalidRange(i, e, c)) return;
  auto r = nextRequest(m, i);
  // CCA map_block maps whole pages: 2 MiB in the small pool, 20 MiB in the large one, and a small
  // request (<= 1 MiB) never needs more than one page per map: the size tells the pool kind.
  const bool large = e.size != alloc::kSmallExpandablePage;
  const PoolId pool = r ? r->pool : eventPoolOf(m, e);
  std::string why;
  uint64_t expect = 0;
  if (!m.group_open) {
    // The first map of a malloc: CCA malloc() maps only after get_free_block() failed, at
    // try_allocate_expandable_block() -> find_expandable_block()'s candidate.
    if (!r) {
      why = "no alloc or oom follows the segment_map";
    } else if (const Key* k = m.core.getFreeBlock(*r)) {
      why = "the free block " + hex(k->addr) + " of the " + poolName(*r) + " fits the next alloc";
    } else if (r->large != large || r->stream != e.stream) {
      why = "the map is not of the next request's pool and stream (" + poolName(*r) + ")";
    } else if (auto cand = m.core.findExpandableBlock(*r)) {
      m.pending_new = *cand;
      Seg* s = m.segAt(*cand);
      ModelBlock* b = CachingAllocator::blockAt(*s, *cand);
      expect = b->mapped ? b->address + b->size : b->address;
      if (expect != e.addr)
        why = "find_expandable_block picks " + hex(*cand) + ", mapping at " + hex(expect);
    } else {
      m.pending_new = e.addr;  // a new reservation: its address is the driver's choice
      const Seg* s = m.segAt(e.addr);
      if (s != nullptr && (!s->expandable || sameGroup(*s, pool, large, e.stream)))
        why = "a new reservation was expected, but " + hex(e.addr) + " is inside one";
    }
  } else {
    // A further map of the same malloc continues right after the grown free block.
    Seg* s = m.segAt(e.addr);
    ModelBlock* b = s ? CachingAllocator::blockAt(*s, e.addr) : nullptr;
    ModelBlock* p = b ? CachingAllocator::prevOf(*s, *b) : nullptr;
    if (!(b && !b->mapped && p && p->isFree() && m.pending_new && p->address == *m.pending_new)) {
      why = "the map does not continue the block grown for this malloc";
    }
  }
  if (c != nullptr) {
    ++c->segment_events;
    if (why.empty()) {
      ++c->segment_matches;
    } else {
      addMismatch(c, i, Action::SegmentMap, e.addr, expect, why);
    }
  }
  m.group_open = true;
  if (!m.pending_new) m.pending_new = e.addr;

  Seg* s = m.segAt(e.addr);
  // A map starts at an unmapped block's first byte (map_block maps from to_map->ptr): one that
  // starts inside a reservation's unmapped tail begins a new reservation there, so the old one
  // ended before it (it was full: its size, 1.125 x the device's memory, is not in the file).
  bool inside_tail = false;
  if (s != nullptr && s->expandable) {
    const ModelBlock& last = std::prev(s->blocks.end())->second;
    inside_tail = !last.mapped && last.isFree() && last.address < e.addr;
  }
  if (s != nullptr && s->expandable && (!sameGroup(*s, pool, large, e.stream) || inside_tail)) {
    const uint64_t base = s->address;
    if (m.core.cutReservationTail(*s, e.addr)) {
      if (sameGroup(*s, pool, large, e.stream) || inside_tail) {
        // Every reservation of a pool kind has the same size: no bigger than this one was.
        uint64_t& bound = m.reservation_bound[large ? 1 : 0];
        bound = std::min(bound, e.addr - base);
      }
      s = nullptr;  // the address space of another reservation begins here
    }
  }
  if (s == nullptr) {
    // A new reservation (CCA find_expandable_block: one ExpandableSegment per pool and stream).
    Seg ns;
    ns.address = e.addr;
    ns.size = std::min(reservationAt(e.addr), m.reservation_bound[large ? 1 : 0]);
    if (auto nx = m.core.segs.upper_bound(e.addr); nx != m.core.segs.end())
      ns.size = std::min(ns.size, nx->first - e.addr);
    ns.stream = e.stream;
    ns.expandable = true;
    ns.pool = pool;
    ns.is_large = large;
    ModelBlock b;
    b.address = e.addr;
    b.size = ns.size;
    b.mapped = false;
    ns.blocks.emplace(b.address, b);
    auto [it, ok] = m.core.segs.emplace(ns.address, std::move(ns));
    s = &it->second;
    m.core.index(*s, s->blocks.begin()->second);
  }
  if (!s->expandable) return;
  ModelBlock* b = CachingAllocator::blockAt(*s, e.addr);
  if (b == nullptr || b->mapped || !b->isFree()) return;  // drifted
  // CCA map_block(): the range becomes mapped and merges with its free neighbours.
  m.core.setMapped(*s, e.addr, std::min(e.size, b->address + b->size - e.addr), true);
}

void applySegmentUnmap(Impl& m, size_t i, const Event& e, ModelCheck* c) {
  // release_cached_blocks() runs between a failed attempt and the retry: a later map belongs to
  // a fresh try_allocate_expandable_block().
  m.pending_new.reset();
  m.group_open = false;
  if (rejectInvalidRange(i, e, c)) return;
  Seg* s = m.segAt(e.addr);
  ModelBlock* b = s && s->expandable ? CachingAllocator::blockAt(*s, e.addr) : nullptr;
  const bool inside =
      b && b->isFree() && b->mapped && e.addr + e.size <= b->address + b->size;  // no wrap: valid
  std::string why;
  if (!inside) {
    why = "the range is not inside one free mapped block of the model";
  } else {
    // CCA unmap_block() -> ExpandableSegment::unmap(): every completely free page of the block,
    // pages counted from the reservation's base.
    const auto [want_addr, want_size] = CachingAllocator::unmappablePages(*s, *b);
    const bool any = want_size > 0;
    if (!any) {
      why = "the free block " + hex(b->address) + " (" + std::to_string(b->size) +
            " bytes) holds no completely free page: unmap_block unmaps nothing";
    } else if (e.addr != want_addr || e.size != want_size) {
      why = "unmap_block of the free block " + hex(b->address) + " (" + std::to_string(b->size) +
            " bytes) unmaps " + std::to_string(want_size) + " bytes at " + hex(want_addr);
    }
  }
  if (c != nullptr) {
    ++c->segment_events;
    if (why.empty()) {
      ++c->segment_matches;
    } else {
      addMismatch(c, i, Action::SegmentUnmap, e.addr, 0, why);
    }
  }
  if (!inside) return;
  b = m.core.setMapped(*s, e.addr, e.size, false);
  // CCA release_blocks(): a reservation left as one unmapped block is released (no trace entry);
  // the next map of its pool and stream reserves a new one.
  if (b != nullptr && s->blocks.size() == 1) m.core.eraseSegment(s->address);
}

void applyEvent(Impl& m, size_t i, const Event& e, ModelCheck* c) {
  switch (e.action) {
    case Action::Alloc:
      applyAlloc(m, i, e, c);
      break;
    case Action::FreeRequested: {
      Seg* s = nullptr;
      ModelBlock* b = liveBlockAt(m, e.addr, &s);
      if (b == nullptr) break;
      // CCA free(): without stream uses free_block() follows at once; a trace that skipped
      // free_completed (skip_actions) only has this event.
      if (m.complete_on_request)
        m.core.freeBlock(*s, b);
      else
        b->state = BlockState::ActivePendingFree;
      break;
    }
    case Action::FreeCompleted: {
      Seg* s = nullptr;
      if (ModelBlock* b = liveBlockAt(m, e.addr, &s)) m.core.freeBlock(*s, b);
      break;
    }
    case Action::SegmentAlloc:
      applySegmentAlloc(m, i, e, c);
      break;
    case Action::SegmentFree:
      applySegmentFree(m, i, e, c);
      break;
    case Action::SegmentMap:
      applySegmentMap(m, i, e, c);
      break;
    case Action::SegmentUnmap:
      applySegmentUnmap(m, i, e, c);
      break;
    case Action::Oom:
      m.pending_new.reset();  // the malloc failed: nothing was prepared for an alloc
      m.group_open = false;
      break;
    default:
      break;
  }
}

// Mapped ranges of expandable segments during the backward pass: begin -> (end, group). Touching
// ranges of one group are kept merged, so that undoing a map removes it whatever pieces it was
// unmapped in (a map undone across two unmaps left both pieces behind: a phantom start state).
struct ExpRange {
  uint64_t end;
  int64_t stream;
  PoolId pool;
  bool is_large;
  bool sameGroup(const ExpRange& o) const {
    return stream == o.stream && pool == o.pool && is_large == o.is_large;
  }
};
using ExpRanges = std::map<uint64_t, ExpRange>;

// Inserts [b, x.end), merging with touching ranges of the same group; an overlap is ignored (the
// replay counts the contradiction).
void addExpRange(ExpRanges& r, uint64_t b, ExpRange x) {
  auto nx = r.lower_bound(b);
  if (nx != r.end() && nx->first < x.end) return;
  if (nx != r.begin()) {
    auto pv = std::prev(nx);
    if (pv->second.end > b) return;
    if (pv->second.end == b && pv->second.sameGroup(x)) {
      b = pv->first;
      r.erase(pv);
    }
  }
  if (nx != r.end() && nx->first == x.end && nx->second.sameGroup(x)) {
    x.end = nx->second.end;
    r.erase(nx);
  }
  r.emplace(b, x);
}

// Removes whatever part of [b, e) is mapped.
void removeExpRange(ExpRanges& r, uint64_t b, uint64_t e) {
  auto it = r.upper_bound(b);
  if (it != r.begin()) --it;
  while (it != r.end() && it->first < e) {
    const uint64_t rb = it->first;
    const ExpRange x = it->second;
    if (x.end <= b) {
      ++it;
      continue;
    }
    it = r.erase(it);
    if (rb < b) r.emplace(rb, ExpRange{b, x.stream, x.pool, x.is_large});
    if (e < x.end) {
      r.emplace(e, x);
      break;
    }
  }
}

// The group of a range unmapped in the trace: small when its size is not a whole number of
// 20 MiB pages; else the group of a map of the trace over the same addresses, else of the mapped
// range of its stream it touches or lies nearest to.
ExpRange unmapGroup(const ExpRanges& mapped, const ExpRanges& map_events, const Event& e,
                    PoolId pool) {
  ExpRange x{e.addr + e.size, e.stream, pool, e.size % alloc::kLargeExpandablePage == 0};
  if (auto it = map_events.lower_bound(x.end); it != map_events.begin()) {
    --it;
    if (it->second.end > e.addr && it->second.stream == e.stream) {
      x.pool = it->second.pool;
      x.is_large = x.is_large && it->second.is_large;
      return x;
    }
  }
  if (!x.is_large) return x;
  const ExpRange* best = nullptr;
  uint64_t best_dist = ~uint64_t{0};
  auto consider = [&](uint64_t b, const ExpRange& y) {
    if (y.stream != e.stream) return;
    const uint64_t d = y.end <= e.addr ? e.addr - y.end : b >= x.end ? b - x.end : 0;
    if (d < best_dist) {
      best_dist = d;
      best = &y;
    }
  };
  auto it = mapped.lower_bound(e.addr);
  for (int k = 0; k < 4 && it != mapped.end(); ++k, ++it) consider(it->first, it->second);
  it = mapped.lower_bound(e.addr);
  for (int k = 0; k < 4 && it != mapped.begin(); ++k) {
    --it;
    consider(it->first, it->second);
  }
  if (best != nullptr) {
    x.pool = best->pool;
    x.is_large = best->is_large;
  }
  return x;
}

}  // namespace

DeviceAllocatorModel::DeviceAllocatorModel(const format::Snapshot& snap, int64_t device)
    : DeviceAllocatorModel(snap, device, nullptr) {}

DeviceAllocatorModel::DeviceAllocatorModel(const format::Snapshot& snap, int64_t device,
                                           const DeviceReplayer& seed)
    : DeviceAllocatorModel(snap, device, &seed) {}

DeviceAllocatorModel::DeviceAllocatorModel(const format::Snapshot& snap, int64_t device,
                                           const DeviceReplayer* seed)
    : snap_(snap),
      device_(device),
      settings_(allocConfOf(snap)),
      impl_(std::make_unique<Impl>(settings_)) {
  // A seed replays the events its owner handed it (maybe a deferred snapshot's device, decoded).
  if (seed != nullptr) {
    events_ = seed->events();
  } else if (device >= 0) {
    events_ = snap.trace(static_cast<size_t>(device));
  }
  ++passStats()[device].model_seeds;
  Impl& m = *impl_;
  m.snap = &snap;
  m.events = events_;

  // Final segments, then segment events undone backward (format doc 6.2).
  std::map<uint64_t, Seg> fixed;  // non-expandable, blocks filled later
  ExpRanges exp;
  // Every expandable range the history shows (final, mapped or unmapped in the trace), with its
  // group: they tell how far down each reservation reaches.
  std::vector<std::pair<uint64_t, ExpRange>> seen;
  bool any_final_pending = false;
  const FinalState fin = validateFinalState(snap, device);  // the segments replay accepts
  for (const auto& fseg : fin.segments) {
    const auto& fs = snap.segments[fseg.index];
    PoolId pool{fs.pool_a, fs.pool_b};
    m.final_kind[fs.address] = {pool, fs.is_large};
    for (const auto& b : snap.blocksOf(fs))
      any_final_pending |= b.state == BlockState::ActivePendingFree;
    if (fs.is_expandable) {
      // segment_type from the file: a small-pool reservation is never taken for a large one.
      const ExpRange x{fs.address + fs.total_size, fs.stream, pool, fs.is_large};
      addExpRange(exp, fs.address, x);
      seen.push_back({fs.address, x});
    } else {
      Seg s;
      s.address = fs.address;
      s.size = fs.total_size;
      s.stream = fs.stream;
      s.pool = pool;
      s.is_large = fs.is_large;
      fixed.emplace(s.address, std::move(s));
    }
  }
  m.next_alloc.assign(events_.size(), -1);
  for (int64_t k = static_cast<int64_t>(events_.size()) - 1, nxt = -1; k >= 0; --k) {
    m.next_alloc[static_cast<size_t>(k)] = nxt;
    const auto a = events_[static_cast<size_t>(k)].action;
    // The request a segment event serves: the next alloc, or the OOM of a malloc that failed.
    if (a == Action::Alloc || a == Action::Oom) nxt = k;
  }
  // The maps of the trace by address, with the group of the request each served.
  ExpRanges map_events;
  for (size_t k = 0; k < events_.size(); ++k) {
    const Event& e = events_[k];
    if (e.action != Action::SegmentMap || !validRange(e.addr, e.size)) continue;
    const PoolId pool = eventPoolOf(m, e);
    map_events[e.addr] =
        ExpRange{e.addr + e.size, e.stream, pool, e.size != alloc::kSmallExpandablePage};
  }
  uint64_t n_req = 0, n_comp = 0;
  for (size_t k = events_.size(); k-- > 0;) {
    const Event& e = events_[k];
    n_req += e.action == Action::FreeRequested;
    n_comp += e.action == Action::FreeCompleted;
    const bool segment_event = e.action == Action::SegmentAlloc ||
                               e.action == Action::SegmentFree || e.action == Action::SegmentMap ||
                               e.action == Action::SegmentUnmap;
    if (segment_event && !validRange(e.addr, e.size)) continue;  // ignored forward too
    switch (e.action) {
      case Action::SegmentAlloc:
        fixed.erase(e.addr);
        break;
      case Action::SegmentFree: {
        Seg s;
        s.address = e.addr;
        s.size = e.size;
        s.stream = e.stream;
        s.pool = eventPoolOf(m, e);
        s.is_large = alloc::isLargeSegmentSize(e.size);
        fixed[e.addr] = std::move(s);
        break;
      }
      case Action::SegmentMap: {
        removeExpRange(exp, e.addr, e.addr + e.size);
        seen.push_back({e.addr, map_events[e.addr]});
        break;
      }
      case Action::SegmentUnmap: {
        const ExpRange x = unmapGroup(exp, map_events, e, eventPoolOf(m, e));
        addExpRange(exp, e.addr, x);
        seen.push_back({e.addr, x});
        break;
      }
      default:
        break;
    }
  }
  m.complete_on_request = alloc::freesCompleteOnRequest(n_req, n_comp, any_final_pending);

  // Start segments: fixed ones as they are; expandable ones one reservation per run of ranges of
  // one group in address order (CCA: one ExpandableSegment per pool and stream, a new one only
  // when the old one is full or was released). A reservation starts at the lowest address the
  // history shows for it, mapped or not at the start, so that a later map of its low end extends
  // it instead of starting a second, touching segment.
  m.start = std::move(fixed);
  std::sort(seen.begin(), seen.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  struct Cluster {
    uint64_t begin, end;
    ExpRange group;
  };
  std::vector<Cluster> clusters;
  for (const auto& [b, x] : seen) {
    if (!clusters.empty()) {
      Cluster& cl = clusters.back();
      auto fx = m.start.lower_bound(cl.end);
      const bool barrier = fx != m.start.end() && fx->first < b;
      if (cl.group.sameGroup(x) && !barrier) {
        cl.end = std::max(cl.end, x.end);
        continue;
      }
      if (b < cl.end) continue;  // overlaps a reservation of another group: hostile, ignored
    }
    clusters.push_back({b, x.end, x});
  }
  for (size_t ci = 0; ci < clusters.size(); ++ci) {
    const Cluster& cl = clusters[ci];
    // The ranges mapped at the start inside this reservation.
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    const uint64_t limit = ci + 1 < clusters.size() ? clusters[ci + 1].begin : ~uint64_t{0};
    for (auto it = exp.lower_bound(cl.begin); it != exp.end() && it->first < limit; ++it) {
      if (it->second.sameGroup(cl.group)) ranges.push_back({it->first, it->second.end});
    }
    if (ranges.empty()) continue;  // not reserved when the trace starts (or released)
    Seg s;
    s.address = cl.begin;
    s.size = reservationAt(s.address);
    if (limit != ~uint64_t{0}) s.size = std::min(s.size, limit - s.address);
    if (auto nx = m.start.upper_bound(s.address); nx != m.start.end())
      s.size = std::min(s.size, nx->first - s.address);
    s.size = std::max(s.size, ranges.back().second - s.address);
    s.pool = cl.group.pool;
    s.stream = cl.group.stream;
    s.is_large = cl.group.is_large;
    s.expandable = true;
    uint64_t pos = s.address;
    for (auto [b, e] : ranges) {
      if (b > pos) {
        ModelBlock u;
        u.address = pos;
        u.size = b - pos;
        u.mapped = false;
        s.blocks.emplace(u.address, u);
      }
      ModelBlock f;  // mapped; live blocks are carved out below
      f.address = b;
      f.size = e - b;
      s.blocks.emplace(f.address, f);
      pos = e;
    }
    if (pos < s.address + s.size) {
      ModelBlock u;
      u.address = pos;
      u.size = s.address + s.size - pos;
      u.mapped = false;
      s.blocks.emplace(u.address, u);
    }
    m.start.emplace(s.address, std::move(s));
  }
  for (auto& [a, s] : m.start) {
    if (s.blocks.empty()) {
      ModelBlock f;
      f.address = s.address;
      f.size = s.size;
      s.blocks.emplace(f.address, f);
    }
  }
  // Start segments never overlap (hostile traces can make them: undone segment_free events over
  // final segments, interleaved expandable ranges): an expandable reservation's unmapped tail is
  // cut at the next segment; any other overlapping segment is dropped.
  for (auto it = m.start.begin(); it != m.start.end();) {
    auto nx = std::next(it);
    if (nx == m.start.end()) break;
    Seg& s = it->second;
    const uint64_t end = s.address + s.size;  // every start segment has a valid range
    if (nx->first >= end) {
      it = nx;
      continue;
    }
    auto last = std::prev(s.blocks.end());
    if (s.expandable && !last->second.mapped && last->first <= nx->first) {
      last->second.size = nx->first - last->first;
      if (last->second.size == 0) s.blocks.erase(last);
      s.size = nx->first - s.address;
      it = nx;
    } else {
      m.start.erase(nx);
    }
  }

  // Blocks alive at the start (DeviceReplayer's backward pass) carved out of the free ranges; what
  // is left between them stays one free block per gap, as coalescing guarantees.
  std::unique_ptr<DeviceReplayer> own;
  if (seed == nullptr) {
    own = std::make_unique<DeviceReplayer>(snap, device);
    seed = own.get();
  }
  std::vector<std::pair<uint64_t, LiveBlock>> live;
  seed->startLive().forEach([&](uint64_t addr, const LiveBlock& lb) {
    live.push_back({addr, lb});
  });
  std::sort(live.begin(), live.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  m.core.segs = std::move(m.start);
  for (const auto& [addr, lb] : live) {
    Seg* s = m.segAt(addr);
    if (s == nullptr) continue;
    ModelBlock* f = CachingAllocator::blockAt(*s, addr);
    if (f == nullptr || !f->isFree() || !f->mapped) continue;  // overlaps: sizes were estimated
    f = m.core.splitAt(*s, addr);
    uint64_t size = std::min(std::max<uint64_t>(lb.size, 1), f->size);
    if (f->size > size) m.core.splitAt(*s, addr + size);
    f->state = lb.pending ? BlockState::ActivePendingFree : BlockState::ActiveAllocated;
    f->requested = lb.requested;
    f->stack = lb.stack;
    f->alloc_event = -1;
  }
  m.start = m.core.segs;
  reset();
}

DeviceAllocatorModel::~DeviceAllocatorModel() = default;

void DeviceAllocatorModel::reset() {
  impl_->core.assign(impl_->start);
  impl_->pending_new.reset();
  impl_->group_open = false;
  impl_->reservation_bound[0] = impl_->reservation_bound[1] = ~uint64_t{0};  // same every pass
  next_ = 0;
}

bool DeviceAllocatorModel::step() {
  if (next_ >= events_.size()) return false;
  if (stats_ == nullptr) stats_ = &passStats()[device_];
  stats_->model_forward += next_ == 0;
  ++stats_->model_events_stepped;
  ModelCheck* c = next_ == checked_ ? &check_ : nullptr;
  applyEvent(*impl_, next_, events_[next_], c);
  if (c != nullptr) ++checked_;
  ++next_;
  return true;
}

void DeviceAllocatorModel::advanceTo(int64_t event_index) {
  if (event_index < static_cast<int64_t>(next_) - 1) reset();
  while (static_cast<int64_t>(next_) <= event_index && step()) {
  }
}

const ModelCheck& DeviceAllocatorModel::runCheck() {
  if (next_ > checked_) reset();
  while (step()) {
  }
  return check_;
}

std::vector<ModelSegment> DeviceAllocatorModel::layout() const {
  std::vector<ModelSegment> out;
  for (const auto& [a, s] : impl_->core.segs) {
    ModelSegment cur;
    bool open = false;
    auto flush = [&] {
      if (open && !cur.blocks.empty()) out.push_back(std::move(cur));
      cur = ModelSegment{};
      open = false;
    };
    for (const auto& [ba, b] : s.blocks) {
      if (!b.mapped) {
        flush();
        continue;
      }
      if (!open) {
        cur.address = b.address;
        cur.stream = s.stream;
        cur.pool = s.pool;
        cur.is_large = s.is_large;
        cur.is_expandable = s.expandable;
        open = true;
      }
      cur.size += b.size;
      cur.blocks.push_back(b);
    }
    flush();
  }
  return out;
}

const CachingAllocator& DeviceAllocatorModel::core() const {
  return impl_->core;
}

bool DeviceAllocatorModel::hasFinalState() const {
  return !snap_.segmentsOf(device_).empty();
}

std::string DeviceAllocatorModel::compareWithFinal() const {
  auto mine = layout();
  std::vector<const format::Segment*> file;
  for (const auto& s : snap_.segmentsOf(device_)) file.push_back(&s);
  std::sort(file.begin(), file.end(), [](auto* x, auto* y) { return x->address < y->address; });
  if (mine.size() != file.size()) {
    return "model has " + std::to_string(mine.size()) + " segments, the file " +
           std::to_string(file.size());
  }
  for (size_t k = 0; k < mine.size(); ++k) {
    const auto& ms = mine[k];
    const auto& fs = *file[k];
    if (ms.address != fs.address || ms.size != fs.total_size) {
      return "segment " + std::to_string(k) + ": model " + hex(ms.address) + "+" +
             std::to_string(ms.size) + ", file " + hex(fs.address) + "+" +
             std::to_string(fs.total_size);
    }
    auto fb = snap_.blocksOf(fs);
    if (fb.size() != ms.blocks.size()) {
      return "segment " + hex(ms.address) + ": model has " + std::to_string(ms.blocks.size()) +
             " blocks, the file " + std::to_string(fb.size());
    }
    for (size_t j = 0; j < fb.size(); ++j) {
      const auto& x = ms.blocks[j];
      const auto& y = fb[j];
      if (x.address != y.address || x.size != y.size || x.state != y.state) {
        return "block " + hex(y.address) + " in segment " + hex(ms.address) + ": model " +
               hex(x.address) + "+" + std::to_string(x.size) + " " +
               std::string(format::blockStateName(x.state)) + ", file " + hex(y.address) + "+" +
               std::to_string(y.size) + " " + std::string(format::blockStateName(y.state));
      }
    }
  }
  return "";
}

ModelCheck checkAllocatorModel(const format::Snapshot& snap, int64_t device) {
  DeviceAllocatorModel m(snap, device);
  return m.runCheck();
}

ModelVerdict modelVerdict(DeviceAllocatorModel& m) {
  const ModelCheck& c = m.runCheck();
  ModelVerdict v;
  v.allocs = c.allocs;
  v.alloc_matches = c.alloc_matches;
  v.segment_events = c.segment_events;
  v.segment_matches = c.segment_matches;
  v.final_compared = m.hasFinalState();
  if (v.final_compared) v.final_diff = m.compareWithFinal();
  if (c.alloc_matches != c.allocs) {
    v.why = std::to_string(c.allocs - c.alloc_matches) + " of " + std::to_string(c.allocs) +
            " alloc addresses not predicted";
  } else if (c.segment_matches != c.segment_events) {
    v.why = std::to_string(c.segment_events - c.segment_matches) + " of " +
            std::to_string(c.segment_events) + " segment events not predicted";
  } else if (!v.final_diff.empty()) {
    v.why = "final layout differs from the file: " + v.final_diff;
  }
  v.exact = v.why.empty();
  return v;
}

ModelVerdict verifyAllocatorModel(const format::Snapshot& snap, int64_t device) {
  DeviceAllocatorModel m(snap, device);
  return modelVerdict(m);
}

}  // namespace memforensics::replay
