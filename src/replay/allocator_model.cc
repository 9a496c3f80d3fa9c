// allocator_model.cc: the caching allocator's block layout, seeded from the start state and driven
// by the trace (see allocator_model.h). Comments cite c10/cuda/CUDACachingAllocator.cpp (CCA) by
// function name; the policy is the one of format doc section 8 where it agrees with the source.
#include "replay/allocator_model.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <tuple>

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

// Parses "key:value" out of a PYTORCH_CUDA_ALLOC_CONF string; -1 when absent.
int64_t confValue(const std::string& conf, std::string_view key) {
  size_t pos = conf.find(key);
  if (pos == std::string::npos) return -1;
  pos += key.size();
  while (pos < conf.size() && (conf[pos] == ':' || conf[pos] == ' ')) ++pos;
  int64_t v = 0;
  bool any = false;
  while (pos < conf.size() && conf[pos] >= '0' && conf[pos] <= '9') {
    v = v * 10 + (conf[pos++] - '0');
    any = true;
  }
  return any ? v : -1;
}

}  // namespace

uint64_t allocationSize(uint64_t size) {
  // CCA get_allocation_size(): 2 MiB for the small pool, 20 MiB below kMinLargeAlloc, else
  // rounded up to kRoundLarge.
  if (size <= kModelSmallSize) return kModelSmallBuffer;
  if (size < kModelMinLargeAlloc) return kModelLargeBuffer;
  return kModelRoundLarge * ((size + kModelRoundLarge - 1) / kModelRoundLarge);
}

ModelSettings modelSettingsOf(const format::Snapshot& snap) {
  ModelSettings s;
  const auto& a = snap.settings;
  if (a.max_split_size > 0) s.max_split_size = static_cast<uint64_t>(a.max_split_size);
  s.expandable_segments = a.expandable_segments;
  if (a.has_roundup)
    std::copy(std::begin(a.roundup_power2_divisions), std::end(a.roundup_power2_divisions),
              s.divisions);
  // Not recorded in allocator_settings in any version; only the config string can tell.
  int64_t nsr = confValue(a.conf, "max_non_split_rounding_mb");
  if (nsr > 0) s.max_non_split_rounding = static_cast<uint64_t>(nsr) << 20;
  if (!a.present || a.conf.find("expandable_segments") != std::string::npos) {
    if (a.conf.find("expandable_segments:True") != std::string::npos ||
        a.conf.find("expandable_segments:true") != std::string::npos) {
      s.expandable_segments = true;
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Internal state.

struct DeviceAllocatorModel::Impl {
  // A segment, or a whole expandable reservation (mapped and unmapped blocks).
  struct Seg {
    uint64_t address = 0, size = 0;
    int64_t stream = 0;
    PoolId pool{0, 0};
    bool is_large = true, expandable = false;
    std::map<uint64_t, ModelBlock> blocks;
  };
  // CCA BlockComparatorSize: pools are separate sets; within one, (stream, size, address).
  struct Key {
    PoolId pool;
    bool large;
    int64_t stream;
    uint64_t size;
    uint64_t addr;
    auto operator<=>(const Key&) const = default;
  };

  std::map<uint64_t, Seg> segs;
  std::set<Key> free;      // mapped free blocks
  std::set<Key> unmapped;  // unmapped ranges of expandable reservations (size field = 0)
  std::optional<uint64_t> pending_new;  // where the next alloc goes after a segment_alloc/map
  bool group_open = false;              // a segment_alloc/map since the last alloc

  // Fixed after construction.
  const format::Snapshot* snap = nullptr;
  std::span<const format::Event> events;
  ModelSettings settings;
  std::map<uint64_t, Seg> start;    // seeded start state
  std::vector<int64_t> next_alloc;  // per event: the next alloc's index (-1: none, or an oom first)
  bool complete_on_request = false;  // skip_actions dropped free_completed: free_requested frees
  std::map<uint64_t, std::pair<PoolId, bool>> final_kind;  // final segments: (pool, is_large)

  Key keyOf(const Seg& s, const ModelBlock& b, bool for_unmapped = false) const {
    return {s.pool, s.is_large, s.stream, for_unmapped ? 0 : b.size, b.address};
  }
  void index(const Seg& s, const ModelBlock& b) {
    if (!b.isFree()) return;
    if (b.mapped)
      free.insert(keyOf(s, b));
    else
      unmapped.insert(keyOf(s, b, true));
  }
  void unindex(const Seg& s, const ModelBlock& b) {
    if (!b.isFree()) return;
    if (b.mapped)
      free.erase(keyOf(s, b));
    else
      unmapped.erase(keyOf(s, b, true));
  }
  void rebuildIndex() {
    free.clear();
    unmapped.clear();
    for (auto& [a, s] : segs) {
      for (auto& [ba, b] : s.blocks) index(s, b);
    }
  }

  Seg* segAt(uint64_t addr) {
    auto it = segs.upper_bound(addr);
    if (it == segs.begin()) return nullptr;
    --it;
    return addr < it->second.address + it->second.size ? &it->second : nullptr;
  }
  const Seg* segAt(uint64_t addr) const { return const_cast<Impl*>(this)->segAt(addr); }
  static ModelBlock* blockAt(Seg& s, uint64_t addr) {
    auto it = s.blocks.upper_bound(addr);
    if (it == s.blocks.begin()) return nullptr;
    --it;
    return addr < it->second.address + it->second.size ? &it->second : nullptr;
  }
  static ModelBlock* prevOf(Seg& s, const ModelBlock& b) {
    auto it = s.blocks.find(b.address);
    if (it == s.blocks.begin()) return nullptr;
    return &std::prev(it)->second;
  }
  static ModelBlock* nextOf(Seg& s, const ModelBlock& b) {
    auto it = s.blocks.find(b.address);
    if (it == s.blocks.end() || ++it == s.blocks.end()) return nullptr;
    return &it->second;
  }

  // Splits the block containing `at` so that a block starts at `at`; returns it. Both halves keep
  // the original's state (only used on free or unmapped blocks).
  ModelBlock* splitAt(Seg& s, uint64_t at) {
    ModelBlock* b = blockAt(s, at);
    if (b == nullptr || b->address == at) return b;
    unindex(s, *b);
    ModelBlock tail = *b;
    tail.address = at;
    tail.size = b->address + b->size - at;
    b->size = at - b->address;
    index(s, *b);
    auto [it, ok] = s.blocks.emplace(at, tail);
    index(s, it->second);
    return &it->second;
  }

  // CCA try_merge_blocks(): free neighbours with the same mapped state merge; returns the result.
  ModelBlock* mergeNeighbours(Seg& s, ModelBlock* b) {
    unindex(s, *b);
    if (ModelBlock* n = nextOf(s, *b); n && n->isFree() && n->mapped == b->mapped) {
      unindex(s, *n);
      b->size += n->size;
      s.blocks.erase(n->address);
    }
    if (ModelBlock* p = prevOf(s, *b); p && p->isFree() && p->mapped == b->mapped) {
      unindex(s, *p);
      p->size += b->size;
      s.blocks.erase(b->address);
      b = p;
    }
    index(s, *b);
    return b;
  }
};

namespace {

using Impl = DeviceAllocatorModel::Impl;
using Seg = Impl::Seg;
using Key = Impl::Key;
using format::Event;

struct Request {
  PoolId pool{0, 0};
  bool large = true;
  int64_t stream = 0;
  uint64_t size = 0;  // rounded
};

void addMismatch(ModelCheck* c, size_t i, Action a, uint64_t recorded, uint64_t predicted,
                 std::string why) {
  if (c == nullptr || c->first_mismatches.size() >= ModelCheck::kMaxMismatches) return;
  c->first_mismatches.push_back({static_cast<int64_t>(i), a, recorded, predicted, std::move(why)});
}

// CCA shouldSplit(): the small pool, and every pool once expandable segments are on, split down to
// kMinBlockSize; the large pool keeps a remainder of up to kSmallSize and never splits a block for
// a request >= max_split_size.
bool shouldSplit(const Impl& m, const Seg& s, uint64_t block_size, uint64_t size) {
  uint64_t remaining = block_size - size;
  if (!s.is_large || m.settings.expandable_segments) return remaining >= kModelMinBlockSize;
  return size < m.settings.max_split_size && remaining > kModelSmallSize;
}

// Pool routing (CUDA graph capture, MemPool) is not in pre-2.12 traces: use the event's pool_id
// when it has one, else the pool of the segment that holds the recorded address, else the default.
Request requestOf(const Impl& m, const Event& e, bool segment_known = true) {
  Request r;
  r.size = roundSize(e.size, m.settings.divisions);
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

bool samePool(const Key& k, const Request& r) {
  return k.pool == r.pool && k.large == r.large && k.stream == r.stream;
}

uint64_t expandableSize(const Impl& m, const Key& k) {
  const Seg* s = m.segAt(k.addr);
  if (s == nullptr || !s->expandable) return k.size;
  auto it = s->blocks.find(k.addr);
  if (it == s->blocks.end()) return k.size;
  auto nx = std::next(it);
  return k.size + (nx != s->blocks.end() && !nx->second.mapped ? nx->second.size : 0);
}

// CCA get_free_block(): lower_bound on (stream, size, address) in the request's pool, i.e. the
// smallest block that fits, lowest address among equals, never another stream. With expandable
// segments a block followed by unmapped space counts as the size it could grow to. Oversize rules:
// a request < max_split_size never takes a block >= max_split_size, and a request >= it never
// takes a block >= request + max_non_split_rounding_size.
const Key* bestFit(const Impl& m, const Request& r) {
  auto it = m.free.lower_bound(Key{r.pool, r.large, r.stream, r.size, 0});
  if (it == m.free.end() || !samePool(*it, r)) return nullptr;
  if (m.settings.expandable_segments) {
    auto isExp = [&](const Key& k) {
      const Seg* s = m.segAt(k.addr);
      return s != nullptr && s->expandable;
    };
    auto next = std::next(it);
    while (isExp(*it) && next != m.free.end() && samePool(*next, r) &&
           expandableSize(m, *next) < expandableSize(m, *it)) {
      it = next++;
    }
  }
  const uint64_t msz = m.settings.max_split_size;
  if (r.size < msz && it->size >= msz) return nullptr;
  if (r.size >= msz && it->size >= r.size + m.settings.max_non_split_rounding) return nullptr;
  return &*it;
}

// Largest free block of the request's pool and stream (for the mismatch reasons).
uint64_t largestFree(const Impl& m, const Request& r) {
  auto it = m.free.lower_bound(Key{r.pool, r.large, r.stream, ~uint64_t{0}, 0});
  if (it == m.free.begin()) return 0;
  --it;
  return samePool(*it, r) ? it->size : 0;
}

std::string poolName(const Request& r) {
  std::string s = r.large ? "large" : "small";
  if (r.pool != PoolId{0, 0}) {
    s += " (private " + std::to_string(r.pool.first) + "," + std::to_string(r.pool.second) + ")";
  }
  return s + " pool, stream " + std::to_string(r.stream);
}

// CCA find_expandable_block(): the first unmapped range of this pool and stream (address order)
// whose free predecessor plus itself and what follows hold `size` bytes; returns the address where
// the grown block will start, nullopt when a new reservation is needed.
std::optional<uint64_t> findExpandable(Impl& m, const Request& r) {
  for (auto it = m.unmapped.lower_bound(Key{r.pool, r.large, r.stream, 0, 0});
       it != m.unmapped.end() && samePool(*it, r); ++it) {
    Seg* s = m.segAt(it->addr);
    if (s == nullptr) continue;
    ModelBlock* c = Impl::blockAt(*s, it->addr);
    if (ModelBlock* p = Impl::prevOf(*s, *c); p != nullptr && p->isFree()) c = p;
    uint64_t bytes = 0;
    for (ModelBlock* b = c; b != nullptr && b->isFree() && bytes < r.size;
         b = Impl::nextOf(*s, *b)) {
      bytes += b->size;
    }
    if (bytes >= r.size) return c->address;
  }
  return std::nullopt;
}

void freeBlock(Impl& m, Seg& s, ModelBlock* b) {
  b->state = BlockState::Inactive;
  b->requested = 0;
  b->stack = format::kNoStack;
  b->alloc_event = -1;
  // CCA free_block(): merge with prev and next (try_merge_blocks), then back into the pool.
  m.mergeNeighbours(s, b);
}

void applyAlloc(Impl& m, size_t i, const Event& e, ModelCheck* c) {
  const Request r = requestOf(m, e);
  uint64_t predicted = 0;
  std::string why;
  if (m.pending_new) {
    // CCA malloc(): a block from alloc_block() (new segment / mapped pages) is used directly.
    predicted = *m.pending_new;
    why = "the preceding segment event prepared " + hex(predicted);
  } else if (const Key* k = bestFit(m, r)) {
    predicted = k->addr;
    why = "best fit in the " + poolName(r) + " is " + hex(k->addr) + " (" +
          std::to_string(k->size) + " bytes)";
  } else {
    why = "no free block of the " + poolName(r) + " holds " + std::to_string(r.size) +
          " bytes (largest " + std::to_string(largestFree(m, r)) +
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
  ModelBlock* b = Impl::blockAt(*s, e.addr);
  if (b == nullptr || !b->isFree() || !b->mapped) return;  // the model lost sync; keep going
  b = m.splitAt(*s, e.addr);  // only when the model drifted: the address is inside a free block
  m.unindex(*s, *b);
  const uint64_t size = std::min(r.size, b->size);
  // CCA alloc_found_block(): the allocation is the front of the block, the remainder stays free.
  if (b->size > size && shouldSplit(m, *s, b->size, size)) {
    ModelBlock rest = *b;
    rest.address += size;
    rest.size -= size;
    b->size = size;
    auto [it, ok] = s->blocks.emplace(rest.address, rest);
    m.index(*s, it->second);
  }
  b->state = BlockState::ActiveAllocated;
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
  if (a.pool == 0) {
    if (auto it = m.final_kind.find(m.events[i].addr); it != m.final_kind.end())
      r.pool = it->second.first;
    else if (const Seg* s = m.segAt(a.addr))
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
  auto nx = m.segs.upper_bound(addr);
  return nx != m.segs.end() && nx->first - addr < size;
}

void applySegmentAlloc(Impl& m, size_t i, const Event& e, ModelCheck* c) {
  if (rejectInvalidRange(i, e, c)) return;
  auto r = nextRequest(m, i);
  if (c != nullptr) {
    ++c->segment_events;
    std::string why;
    if (!r) {
      why = "no alloc follows the segment_alloc";
    } else if (const Key* k = bestFit(m, *r)) {
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
    s.is_large = e.size != kModelSmallBuffer;
  }
  ModelBlock b;
  b.address = e.addr;
  b.size = e.size;
  s.blocks.emplace(b.address, b);
  auto [it, ok] = m.segs.emplace(s.address, std::move(s));
  m.index(it->second, it->second.blocks.begin()->second);
  m.pending_new = e.addr;
  m.group_open = true;
}

void applySegmentFree(Impl& m, size_t i, const Event& e, ModelCheck* c) {
  if (rejectInvalidRange(i, e, c)) return;
  auto it = m.segs.find(e.addr);
  if (c != nullptr) {
    ++c->segment_events;
    std::string why;
    if (it == m.segs.end() || it->second.expandable) {
      why = "the model has no segment at " + hex(e.addr);
    } else if (it->second.size != e.size) {
      why = "the model's segment has " + std::to_string(it->second.size) + " bytes";
    } else if (it->second.blocks.size() != 1 || !it->second.blocks.begin()->second.isFree()) {
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
  if (it == m.segs.end() || it->second.expandable) return;
  for (auto& [a, b] : it->second.blocks) m.unindex(it->second, b);
  m.segs.erase(it);
}

void applySegmentMap(Impl& m, size_t i, const Event& e, ModelCheck* c) {
  if (rejectInvalidRange(i, e, c)) return;
  auto r = nextRequest(m, i);
  std::string why;
  uint64_t expect = 0;
  if (!m.group_open) {
    // The first map of a malloc: CCA malloc() maps only after get_free_block() failed, at
    // try_allocate_expandable_block() -> find_expandable_block()'s candidate.
    if (!r) {
      why = "no alloc follows the segment_map";
    } else if (const Key* k = bestFit(m, *r)) {
      why = "the free block " + hex(k->addr) + " of the " + poolName(*r) + " fits the next alloc";
    } else if (auto cand = findExpandable(m, *r)) {
      m.pending_new = *cand;
      Seg* s = m.segAt(*cand);
      ModelBlock* b = Impl::blockAt(*s, *cand);
      expect = b->mapped ? b->address + b->size : b->address;
      if (expect != e.addr)
        why = "find_expandable_block picks " + hex(*cand) + ", mapping at " + hex(expect);
    } else {
      m.pending_new = e.addr;  // a new reservation: its address is the driver's choice
      if (const Seg* s = m.segAt(e.addr); s != nullptr) why = "a new reservation was expected";
    }
  } else {
    // A further map of the same malloc continues right after the grown free block.
    Seg* s = m.segAt(e.addr);
    ModelBlock* b = s ? Impl::blockAt(*s, e.addr) : nullptr;
    ModelBlock* p = b ? Impl::prevOf(*s, *b) : nullptr;
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
  if (s == nullptr) {
    // A new reservation (CCA find_expandable_block: one ExpandableSegment per pool and stream).
    Seg ns;
    ns.address = e.addr;
    ns.size = reservationAt(e.addr);
    if (auto nx = m.segs.upper_bound(e.addr); nx != m.segs.end())
      ns.size = std::min(ns.size, nx->first - e.addr);
    ns.stream = e.stream;
    ns.expandable = true;
    if (r) {
      ns.pool = r->pool;
      ns.is_large = r->large;
    } else {
      ns.pool = eventPoolOf(m, e);
      ns.is_large = e.size % kModelLargeBuffer == 0;
    }
    ModelBlock b;
    b.address = e.addr;
    b.size = ns.size;
    b.mapped = false;
    ns.blocks.emplace(b.address, b);
    auto [it, ok] = m.segs.emplace(ns.address, std::move(ns));
    s = &it->second;
    m.index(*s, s->blocks.begin()->second);
  }
  if (!s->expandable) return;
  ModelBlock* b = Impl::blockAt(*s, e.addr);
  if (b == nullptr || b->mapped || !b->isFree()) return;  // drifted
  b = m.splitAt(*s, e.addr);
  if (b->size > e.size) m.splitAt(*s, e.addr + e.size);
  m.unindex(*s, *b);
  b->mapped = true;
  m.index(*s, *b);
  // CCA map_block(): try_merge_blocks with prev and next.
  m.mergeNeighbours(*s, b);
}

void applySegmentUnmap(Impl& m, size_t i, const Event& e, ModelCheck* c) {
  if (rejectInvalidRange(i, e, c)) return;
  Seg* s = m.segAt(e.addr);
  ModelBlock* b = s && s->expandable ? Impl::blockAt(*s, e.addr) : nullptr;
  const bool ok =
      b && b->isFree() && b->mapped && e.addr + e.size <= b->address + b->size;  // no wrap: valid
  if (c != nullptr) {
    ++c->segment_events;
    if (ok) {
      ++c->segment_matches;
    } else {
      // CCA unmap_block(): only fully free pages of a free block are unmapped.
      addMismatch(c, i, Action::SegmentUnmap, e.addr, 0,
                  "the range is not inside one free mapped block of the model");
    }
  }
  if (!ok) return;
  b = m.splitAt(*s, e.addr);
  if (b->size > e.size) m.splitAt(*s, e.addr + e.size);
  m.unindex(*s, *b);
  b->mapped = false;
  m.index(*s, *b);
  m.mergeNeighbours(*s, b);
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
        freeBlock(m, *s, b);
      else
        b->state = BlockState::ActivePendingFree;
      break;
    }
    case Action::FreeCompleted: {
      Seg* s = nullptr;
      if (ModelBlock* b = liveBlockAt(m, e.addr, &s)) freeBlock(m, *s, b);
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

// Mapped ranges of expandable segments during the backward pass: begin -> (end, template seg).
struct ExpRange {
  uint64_t end;
  int64_t stream;
  PoolId pool;
  bool is_large;
};

void removeExpRange(std::map<uint64_t, ExpRange>& r, uint64_t b, uint64_t e) {
  auto it = r.upper_bound(b);
  if (it == r.begin()) return;
  --it;
  if (it->second.end < e) return;
  ExpRange x = it->second;
  uint64_t rb = it->first;
  r.erase(it);
  if (rb < b) r.emplace(rb, ExpRange{b, x.stream, x.pool, x.is_large});
  if (e < x.end) r.emplace(e, ExpRange{x.end, x.stream, x.pool, x.is_large});
}

}  // namespace

DeviceAllocatorModel::DeviceAllocatorModel(const format::Snapshot& snap, int64_t device)
    : snap_(snap),
      device_(device),
      settings_(modelSettingsOf(snap)),
      impl_(std::make_unique<Impl>()) {
  if (device >= 0) events_ = snap.trace(static_cast<size_t>(device));
  Impl& m = *impl_;
  m.snap = &snap;
  m.events = events_;
  m.settings = settings_;

  // Final segments, then segment events undone backward (format doc 6.2).
  std::map<uint64_t, Seg> fixed;  // non-expandable, blocks filled later
  std::map<uint64_t, ExpRange> exp;
  bool any_final_pending = false;
  const FinalState fin = validateFinalState(snap, device);  // the segments replay accepts
  for (const auto& fseg : fin.segments) {
    const auto& fs = snap.segments[fseg.index];
    PoolId pool{fs.pool_a, fs.pool_b};
    m.final_kind[fs.address] = {pool, fs.is_large};
    for (const auto& b : snap.blocksOf(fs))
      any_final_pending |= b.state == BlockState::ActivePendingFree;
    if (fs.is_expandable) {
      exp.emplace(fs.address, ExpRange{fs.address + fs.total_size, fs.stream, pool, fs.is_large});
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
        s.is_large = e.size != kModelSmallBuffer;  // small segments are exactly kSmallBuffer
        fixed[e.addr] = std::move(s);
        break;
      }
      case Action::SegmentMap:
        removeExpRange(exp, e.addr, e.addr + e.size);
        break;
      case Action::SegmentUnmap: {
        ExpRange x{e.addr + e.size, e.stream, eventPoolOf(m, e), e.size % kModelLargeBuffer == 0};
        for (const auto& [b, y] : exp) {  // inherit the kind of a range of the same stream
          if (y.stream == e.stream) {
            x.pool = y.pool;
            x.is_large = y.is_large;
            if (y.end == e.addr || b == e.addr + e.size) break;
          }
        }
        exp.emplace(e.addr, x);
        break;
      }
      default:
        break;
    }
  }
  m.complete_on_request = n_req > 0 && n_comp == 0 && !any_final_pending;
  m.next_alloc.assign(events_.size(), -1);
  for (int64_t k = static_cast<int64_t>(events_.size()) - 1, nxt = -1; k >= 0; --k) {
    m.next_alloc[static_cast<size_t>(k)] = nxt;
    const auto a = events_[static_cast<size_t>(k)].action;
    if (a == Action::Alloc) nxt = k;
    if (a == Action::Oom) nxt = -1;
  }

  // Start segments: fixed ones as they are; expandable ranges grouped into one reservation per
  // (pool, stream, kind) (CCA: a new ExpandableSegment only when the old one is full).
  m.start = std::move(fixed);
  std::map<std::tuple<PoolId, int64_t, bool>, std::vector<std::pair<uint64_t, uint64_t>>> groups;
  for (const auto& [b, x] : exp) groups[{x.pool, x.stream, x.is_large}].push_back({b, x.end});
  for (auto& [key, ranges] : groups) {
    Seg s;
    s.address = ranges.front().first;
    s.size = reservationAt(s.address);
    if (auto nx = m.start.upper_bound(s.address); nx != m.start.end())
      s.size = std::min(s.size, nx->first - s.address);
    s.size = std::max(s.size, ranges.back().second - s.address);
    std::tie(s.pool, s.stream, s.is_large) = key;
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
  DeviceReplayer rep(snap, device);
  rep.reset();
  std::vector<std::pair<uint64_t, LiveBlock>> live;
  rep.live().forEach([&](uint64_t addr, const LiveBlock& lb) { live.push_back({addr, lb}); });
  std::sort(live.begin(), live.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  m.segs = std::move(m.start);
  for (const auto& [addr, lb] : live) {
    Seg* s = m.segAt(addr);
    if (s == nullptr) continue;
    ModelBlock* f = Impl::blockAt(*s, addr);
    if (f == nullptr || !f->isFree() || !f->mapped) continue;  // overlaps: sizes were estimated
    f = m.splitAt(*s, addr);
    uint64_t size = std::min(std::max<uint64_t>(lb.size, 1), f->size);
    if (f->size > size) m.splitAt(*s, addr + size);
    f->state = lb.pending ? BlockState::ActivePendingFree : BlockState::ActiveAllocated;
    f->requested = lb.requested;
    f->stack = lb.stack;
    f->alloc_event = -1;
  }
  m.start = m.segs;
  reset();
}

DeviceAllocatorModel::~DeviceAllocatorModel() = default;

void DeviceAllocatorModel::reset() {
  impl_->segs = impl_->start;
  impl_->rebuildIndex();
  impl_->pending_new.reset();
  impl_->group_open = false;
  next_ = 0;
}

bool DeviceAllocatorModel::step() {
  if (next_ >= events_.size()) return false;
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
  for (const auto& [a, s] : impl_->segs) {
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

std::string DeviceAllocatorModel::compareWithFinal() const {
  auto mine = layout();
  std::vector<const format::Segment*> file;
  for (const auto& s : snap_.segments) {
    if (s.device == device_) file.push_back(&s);
  }
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

}  // namespace memforensics::replay
