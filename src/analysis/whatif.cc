// whatif.cc: the request-driven allocator simulation (see whatif.h and docs/whatif.md). Comments
// cite c10/cuda/CUDACachingAllocator.cpp (CCA) by function name.
#include "analysis/whatif.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "analysis/frames.h"
#include "common/allocator_constants.h"
#include "common/format_bytes.h"
#include "replay/replay.h"

namespace memforensics::analysis {

namespace {

using format::Action;
using format::Event;
using replay::PoolId;

// Base of the simulated address space and the virtual size of an expandable reservation (CCA
// reserves 1.125 x the device memory; any size larger than a card works).
constexpr uint64_t kSimBase = uint64_t{1} << 50;
constexpr uint64_t kSimReservation = uint64_t{1} << 49;  // above kWhatIfMaxRequest

uint64_t addSat(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? ~uint64_t{0} : r;
}

struct Blk {
  uint64_t size = 0;
  bool allocated = false;
  bool mapped = true;
  uint64_t gc_base = 0;  // its pool's get_free_block calls when it became free (CCA gc_count_base)
};
struct Seg {
  uint64_t address = 0, size = 0;  // size: mapped bytes for a reservation's accounting see below
  int64_t stream = 0;
  PoolId pool{0, 0};
  bool large = true, expandable = false;
  uint64_t serial = 0;  // creation order (oldest first for garbage collection)
  std::map<uint64_t, Blk> blocks;
};
struct Key {
  PoolId pool;
  bool large;
  int64_t stream;
  uint64_t size;
  uint64_t addr;
  auto operator<=>(const Key&) const = default;
};

struct Sim {
  const WhatIfSettings& st;
  uint64_t capacity;
  std::map<uint64_t, Seg> segs;
  std::set<Key> free;  // mapped free blocks
  uint64_t next_addr = kSimBase;
  uint64_t serial = 0;
  uint64_t reserved = 0, allocated = 0;
  uint64_t segment_allocs = 0, segment_frees = 0;
  // get_free_block calls per pool (CCA BlockPool::get_free_blocks_call_count), counted only while
  // garbage collection is on, as CCA does.
  std::map<std::pair<PoolId, bool>, uint64_t> gfb_calls;

  Sim(const WhatIfSettings& s, uint64_t cap) : st(s), capacity(cap) {}

  Seg* segAt(uint64_t a) {
    auto it = segs.upper_bound(a);
    if (it == segs.begin()) return nullptr;
    --it;
    return a < it->second.address + it->second.size ? &it->second : nullptr;
  }
  Key keyOf(const Seg& s, uint64_t a, const Blk& b) const {
    return {s.pool, s.large, s.stream, b.size, a};
  }
  // CCA insert_into_blocks(): a block becoming free starts its garbage-collection age at 0.
  void index(const Seg& s, uint64_t a, Blk& b) {
    if (b.allocated || !b.mapped) return;
    auto c = gfb_calls.find({s.pool, s.large});
    b.gc_base = c == gfb_calls.end() ? 0 : c->second;
    free.insert(keyOf(s, a, b));
  }
  void unindex(const Seg& s, uint64_t a, const Blk& b) {
    if (!b.allocated && b.mapped) free.erase(keyOf(s, a, b));
  }
  // CCA try_merge_blocks(): free neighbours with the same mapped state merge.
  std::map<uint64_t, Blk>::iterator merge(Seg& s, std::map<uint64_t, Blk>::iterator it) {
    unindex(s, it->first, it->second);
    auto nx = std::next(it);
    if (nx != s.blocks.end() && !nx->second.allocated && nx->second.mapped == it->second.mapped) {
      unindex(s, nx->first, nx->second);
      it->second.size += nx->second.size;
      s.blocks.erase(nx);
    }
    if (it != s.blocks.begin()) {
      auto pv = std::prev(it);
      if (!pv->second.allocated && pv->second.mapped == it->second.mapped) {
        unindex(s, pv->first, pv->second);
        pv->second.size += it->second.size;
        s.blocks.erase(it);
        it = pv;
      }
    }
    index(s, it->first, it->second);
    return it;
  }

  // CCA shouldSplit().
  bool shouldSplit(const Seg& s, uint64_t block, uint64_t size) const {
    uint64_t rem = block - size;
    if (!s.large || st.model.expandable_segments) return rem >= alloc::kMinBlockSize;
    return size < st.model.max_split_size && rem > alloc::kSmallSize;
  }

  // CCA get_free_block(): best fit in the pool and stream, with the oversize rules.
  std::optional<uint64_t> bestFit(PoolId pool, bool large, int64_t stream, uint64_t size) {
    auto it = free.lower_bound(Key{pool, large, stream, size, 0});
    if (it == free.end() || it->pool != pool || it->large != large || it->stream != stream)
      return std::nullopt;
    const uint64_t msz = st.model.max_split_size;
    if (size < msz && it->size >= msz) return std::nullopt;
    if (size >= msz && it->size >= addSat(size, st.model.max_non_split_rounding))
      return std::nullopt;
    return it->addr;
  }

  // CCA alloc_found_block(): the front of the block, the remainder stays free.
  uint64_t take(uint64_t addr, uint64_t size) {
    Seg* s = segAt(addr);
    auto it = s->blocks.find(addr);
    unindex(*s, it->first, it->second);
    if (it->second.size > size && shouldSplit(*s, it->second.size, size)) {
      Blk rest{it->second.size - size, false, true};
      it->second.size = size;
      auto [r, ok] = s->blocks.emplace(addr + size, rest);
      index(*s, r->first, r->second);
    }
    it->second.allocated = true;
    allocated += it->second.size;
    return addr;
  }

  uint64_t sizeOf(uint64_t addr) {
    Seg* s = segAt(addr);
    if (s == nullptr) return 0;
    auto it = s->blocks.find(addr);
    return it == s->blocks.end() || !it->second.allocated ? 0 : it->second.size;
  }

  void freeBlock(uint64_t addr) {
    Seg* s = segAt(addr);
    if (s == nullptr) return;
    auto it = s->blocks.find(addr);
    if (it == s->blocks.end() || !it->second.allocated) return;
    allocated -= it->second.size;
    it->second.allocated = false;
    merge(*s, it);
  }

  // The simulated address space (from kSimBase up) has room for `bytes` more (a hostile file
  // with very many huge segments or streams runs out: out of memory, never a wrapped address).
  bool roomFor(uint64_t bytes) const {
    return next_addr <= ~uint64_t{0} - kSimBase && bytes <= ~uint64_t{0} - kSimBase - next_addr;
  }
  bool fits(uint64_t bytes) const {
    return capacity == kWhatIfUnlimited || addSat(reserved, bytes) <= capacity;
  }

  // cudaMalloc of a segment (CCA alloc_block); nullopt when the card is full.
  std::optional<uint64_t> newSegment(PoolId pool, bool large, int64_t stream, uint64_t size) {
    const uint64_t bytes = replay::allocationSize(size);
    if (!fits(bytes) || !roomFor(bytes)) return std::nullopt;
    Seg s;
    s.address = next_addr;
    s.size = bytes;
    s.stream = stream;
    s.pool = pool;
    s.large = large;
    s.serial = serial++;
    s.blocks.emplace(s.address, Blk{bytes, false, true});
    next_addr = addSat(next_addr, addSat(bytes, alloc::kLargeBuffer));
    auto [it, ok] = segs.emplace(s.address, std::move(s));
    index(it->second, it->first, it->second.blocks.begin()->second);
    reserved += bytes;
    ++segment_allocs;
    return it->first;
  }

  // CCA try_allocate_expandable_block(): grows the pool's reservation by whole pages.
  std::optional<uint64_t> expand(PoolId pool, bool large, int64_t stream, uint64_t size) {
    const uint64_t page = large ? alloc::kLargeExpandablePage : alloc::kSmallExpandablePage;
    Seg* res = nullptr;
    for (auto& [a, s] : segs) {
      if (s.expandable && s.pool == pool && s.large == large && s.stream == stream) res = &s;
    }
    if (res == nullptr) {
      if (!roomFor(kSimReservation)) return std::nullopt;
      Seg s;
      s.address = next_addr;
      s.size = kSimReservation;
      s.stream = stream;
      s.pool = pool;
      s.large = large;
      s.expandable = true;
      s.serial = serial++;
      s.blocks.emplace(s.address, Blk{kSimReservation, false, false});
      next_addr = addSat(next_addr, addSat(kSimReservation, alloc::kLargeBuffer));
      res = &segs.emplace(s.address, std::move(s)).first->second;
    }
    // CCA find_expandable_block(): the first unmapped range whose free predecessor plus the free
    // space from there holds `size`.
    for (auto it = res->blocks.begin(); it != res->blocks.end(); ++it) {
      if (it->second.mapped || it->second.allocated) continue;
      auto start = it;
      if (it != res->blocks.begin()) {
        auto pv = std::prev(it);
        if (!pv->second.allocated) start = pv;
      }
      uint64_t bytes = 0, to_map = 0;
      for (auto b = start; b != res->blocks.end() && !b->second.allocated && bytes < size; ++b) {
        const uint64_t want = size - bytes;
        if (b->second.mapped) {
          bytes += std::min(want, b->second.size);
        } else {
          uint64_t m = std::min(b->second.size, (want + page - 1) / page * page);
          to_map += m;
          bytes += std::min(want, m);
        }
      }
      if (bytes < size) continue;
      if (!fits(to_map)) return std::nullopt;
      // Map the pages (CCA map_block) and merge.
      uint64_t got = 0;
      auto b = start;
      const uint64_t first = start->first;
      while (got < size && b != res->blocks.end()) {
        const uint64_t want = size - got;
        if (b->second.mapped) {
          got += std::min(want, b->second.size);
          ++b;
          continue;
        }
        uint64_t m = std::min(b->second.size, (want + page - 1) / page * page);
        if (m < b->second.size) {
          res->blocks.emplace(b->first + m, Blk{b->second.size - m, false, false});
          b->second.size = m;
        }
        b->second.mapped = true;
        reserved += m;
        ++segment_allocs;
        got += std::min(want, m);
        b = std::next(merge(*res, b));
      }
      return first;  // merge() kept the grown free block at `first`
    }
    return std::nullopt;
  }

  std::optional<uint64_t> allocBlock(PoolId pool, bool large, int64_t stream, uint64_t size) {
    if (st.model.expandable_segments) return expand(pool, large, stream, size);
    return newSegment(pool, large, stream, size);
  }

  // CCA release_block / unmap_block on one free block.
  void releaseFreeSegment(std::map<uint64_t, Seg>::iterator it) {
    for (auto& [a, b] : it->second.blocks) unindex(it->second, a, b);
    reserved -= it->second.size;
    ++segment_frees;
    segs.erase(it);
  }
  void unmapFree(Seg& s) {
    const uint64_t page = s.large ? alloc::kLargeExpandablePage : alloc::kSmallExpandablePage;
    std::vector<uint64_t> addrs;
    for (auto& [a, b] : s.blocks) {
      if (!b.allocated && b.mapped) addrs.push_back(a);
    }
    for (uint64_t a : addrs) {
      auto it = s.blocks.find(a);
      const uint64_t end = a + it->second.size;
      const uint64_t lo = (a - s.address + page - 1) / page * page + s.address;
      const uint64_t hi = (end - s.address) / page * page + s.address;
      if (hi <= lo) continue;
      unindex(s, a, it->second);
      if (lo > a) {
        it->second.size = lo - a;
        index(s, a, it->second);
        it = s.blocks.emplace(lo, Blk{end - lo, false, true}).first;
      }
      if (hi < end) {
        s.blocks.emplace(hi, Blk{end - hi, false, true});
        index(s, hi, s.blocks.find(hi)->second);
      }
      it->second.size = hi - lo;
      it->second.mapped = false;
      reserved -= hi - lo;
      ++segment_frees;
      merge(s, it);
    }
  }
  // CCA release_cached_blocks() (also what torch.cuda.empty_cache() does): every free segment is
  // given back, and with expandable segments every fully free page is unmapped.
  void releaseCached() {
    for (auto it = segs.begin(); it != segs.end();) {
      auto nx = std::next(it);
      Seg& s = it->second;
      if (s.expandable) {
        unmapFree(s);
      } else if (s.blocks.size() == 1 && !s.blocks.begin()->second.allocated) {
        releaseFreeSegment(it);
      }
      it = nx;
    }
  }
  // CCA release_available_cached_blocks(): with a max_split_size, free oversize cached segments of
  // the pool (the smallest one that is large enough, else largest first until enough).
  bool releaseOversize(PoolId pool, bool large, int64_t stream, uint64_t size) {
    const uint64_t msz = st.model.max_split_size;
    if (msz == ~uint64_t{0}) return false;
    std::vector<std::pair<uint64_t, uint64_t>> cand;  // (size, address)
    for (auto& [a, s] : segs) {
      if (s.expandable || s.pool != pool || s.large != large || s.stream != stream) continue;
      if (s.blocks.size() == 1 && !s.blocks.begin()->second.allocated && s.size >= msz)
        cand.emplace_back(s.size, a);
    }
    if (cand.empty()) return false;
    std::sort(cand.begin(), cand.end());
    const uint64_t need = std::max(size, msz);
    auto it = std::lower_bound(cand.begin(), cand.end(), std::make_pair(need, uint64_t{0}));
    if (it != cand.end()) {
      releaseFreeSegment(segs.find(it->second));
      return true;
    }
    uint64_t freed = 0;
    for (auto r = cand.rbegin(); r != cand.rend() && freed < size; ++r) {
      freed += r->first;
      releaseFreeSegment(segs.find(r->second));
    }
    return freed >= size;
  }
  bool gcOn() const { return st.gc_threshold > 0.0 && capacity != kWhatIfUnlimited; }
  // CCA garbage_collect_cached_blocks(): when reserved is above threshold x capacity (CCA:
  // allowed_memory_maximum, the per-process memory fraction of the card), the wholly free,
  // non-expandable segments of the default large pool whose age (get_free_block calls on the pool
  // since the block became free) is at least the average age go back, in the pool's order
  // (stream, size, address); passes repeat with the new average until target = reserved -
  // threshold x capacity bytes are reclaimed or a pass frees nothing. A pass does not stop at the
  // target (CCA: "we don't want this GC to be triggered frequently").
  void garbageCollect() {
    if (!gcOn()) return;
    const auto limit = static_cast<uint64_t>(st.gc_threshold * static_cast<double>(capacity));
    if (reserved <= limit) return;
    const uint64_t target = reserved - limit;
    const PoolId def{0, 0};
    const uint64_t now = gfb_calls[{def, true}];
    auto freeable = [&](const Key& k, uint64_t* age) {
      if (k.pool != def || !k.large) return false;
      Seg* s = segAt(k.addr);
      if (s == nullptr || s->expandable || s->blocks.size() != 1) return false;
      *age = now - s->blocks.begin()->second.gc_base;
      return true;
    };
    double total_age = 0;
    uint64_t count = 0;
    for (const Key& k : free) {
      uint64_t age = 0;
      if (freeable(k, &age)) total_age += static_cast<double>(age), ++count;
    }
    uint64_t reclaimed = 0;
    bool freed = true;
    while (reclaimed < target && freed && count > 0) {
      const double age_threshold = total_age / static_cast<double>(count);
      freed = false;
      std::vector<std::pair<uint64_t, uint64_t>> go;  // (address, age), in the pool's order
      for (const Key& k : free) {
        uint64_t age = 0;
        if (freeable(k, &age) && static_cast<double>(age) >= age_threshold)
          go.emplace_back(k.addr, age);
      }
      for (auto [a, age] : go) {
        freed = true;
        reclaimed += segs.find(a)->second.size;
        total_age -= static_cast<double>(age);
        --count;
        releaseFreeSegment(segs.find(a));
      }
    }
  }

  // CCA malloc(): nullopt = out of memory.
  std::optional<uint64_t> malloc(PoolId pool, uint64_t size, int64_t stream) {
    if (size > kWhatIfMaxRequest) return std::nullopt;
    if (size == 0) size = alloc::kMinBlockSize;  // round_size(0) in a hostile file
    const bool large = size > alloc::kSmallSize;
    if (gcOn()) ++gfb_calls[{pool, large}];  // CCA get_free_block()
    if (auto a = bestFit(pool, large, stream, size)) return take(*a, size);
    garbageCollect();  // CCA: before alloc_block, with no second search
    std::optional<uint64_t> a = allocBlock(pool, large, stream, size);
    if (!a && releaseOversize(pool, large, stream, size)) a = allocBlock(pool, large, stream, size);
    if (!a) {
      releaseCached();
      a = allocBlock(pool, large, stream, size);
    }
    if (!a) return std::nullopt;
    return take(*a, size);
  }

  uint64_t largestFree() const {
    uint64_t m = 0;
    for (const Key& k : free) m = std::max(m, k.size);
    return m;
  }
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
  for (const auto& s : snap.segments) {
    if (s.device == device) r = addSat(r, s.total_size);
  }
  return r;
}

// Reserved bytes before each event of the recorded trace, from its segment events and the final
// state (the start reserved = final - net change, clamped at 0).
// Sizes are capped at 2^62 and every sum saturates at [-2^62, 2^62]: a hostile trace of many
// huge segments overflowed int64 here (fuzz_pipeline: fuzz/corpus/fuzz_pipeline/whatif-overflow).
std::vector<uint64_t> recordedReserved(const format::Snapshot& snap, size_t d, uint64_t* peak) {
  auto sat = [](int64_t a, int64_t b) {
    constexpr int64_t cap = int64_t{1} << 62;
    int64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) r = b > 0 ? cap : -cap;
    return std::clamp<int64_t>(r, -cap, cap);
  };
  auto ev = snap.trace(d);
  int64_t net = 0;
  for (const Event& e : ev) {
    const auto sz = static_cast<int64_t>(std::min<uint64_t>(e.size, uint64_t{1} << 62));
    if (e.action == Action::SegmentAlloc || e.action == Action::SegmentMap) net = sat(net, sz);
    if (e.action == Action::SegmentFree || e.action == Action::SegmentUnmap) net = sat(net, -sz);
  }
  const auto fin = static_cast<int64_t>(
      std::min<uint64_t>(finalReserved(snap, static_cast<int64_t>(d)), uint64_t{1} << 62));
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

bool parseBool(const std::string& v, bool* out) {
  if (v == "True" || v == "true" || v == "1") return *out = true, true;
  if (v == "False" || v == "false" || v == "0") return *out = false, true;
  return false;
}
bool parseUint(const std::string& v, uint64_t* out) {
  if (v.empty() || v.size() > 12) return false;
  uint64_t r = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return false;
    r = r * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = r;
  return true;
}

bool divisionOk(uint64_t n) {
  return n <= kWhatIfMaxDivisions && (n & (n - 1)) == 0;
}

// CCA parseRoundUpPower2Divisions, list form "[256:1,512:2,>:4]" (spaces ignored, as its lexer
// does): each MB:N entry, MB a power of two, sets the interval of sizes in [MB, 2 x MB) MiB
// (interval index log2(MB), clamped to the 16 intervals from 1 MiB); the first entry also fills
// every interval below it; ">:N" fills every interval after the last entry's. N is a power of two
// or 0 (off). Intervals no entry reaches stay 0. (PyTorch releases before the fix of ">" filled
// from the last entry's own interval, overwriting it; this follows the current source.)
std::string parseDivisionList(const std::string& raw, uint32_t out[16]) {
  std::string v;
  for (char c : raw) {
    if (c != ' ') v += c;
  }
  const std::string bad = "roundup_power2_divisions list '" + raw + "': ";
  if (v.size() < 2 || v.back() != ']') return bad + "expected [MB:N,...] ending in ]";
  const std::string body = v.substr(1, v.size() - 2);
  if (body.empty()) return bad + "no entries";
  uint32_t d[16] = {};
  bool first = true;
  size_t last_index = 0;
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    if (comma == std::string::npos) comma = body.size();
    const std::string entry = body.substr(pos, comma - pos);
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) return bad + "entry '" + entry + "' is not MB:N";
    const std::string lhs = entry.substr(0, colon), rhs = entry.substr(colon + 1);
    uint64_t n = 0;
    if (!parseUint(rhs, &n) || !divisionOk(n))
      return bad + "divisions '" + rhs + "' must be a power of two up to " +
             std::to_string(kWhatIfMaxDivisions) + " or 0";
    if (lhs == ">") {
      // CCA fills from last_index + 1, last_index starting at 0: a lone ">:N" leaves < 2 MiB.
      for (size_t k = last_index + 1; k < 16; ++k) d[k] = static_cast<uint32_t>(n);
    } else {
      uint64_t mb = 0;
      if (!parseUint(lhs, &mb) || mb == 0 || (mb & (mb - 1)) != 0)
        return bad + "interval '" + lhs + "' must be a power of two (MB) or >";
      const size_t index = std::min<size_t>(63 - static_cast<size_t>(__builtin_clzll(mb)), 15);
      if (first) {
        for (size_t k = 0; k < index; ++k) d[k] = static_cast<uint32_t>(n);
        first = false;
      }
      d[index] = static_cast<uint32_t>(n);
      last_index = index;
    }
    pos = comma + 1;
  }
  std::copy(std::begin(d), std::end(d), out);
  return "";
}

}  // namespace

std::vector<StartBlock> startBlocks(const format::Snapshot& snap, size_t d) {
  auto ev = snap.trace(d);
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
  for (const auto& sg : snap.segments) {
    if (sg.device != static_cast<int64_t>(d)) continue;
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

WhatIfSettings whatIfSettingsOf(const format::Snapshot& snap) {
  WhatIfSettings s;
  s.model = replay::modelSettingsOf(snap);
  s.gc_threshold = snap.settings.garbage_collection_threshold;
  return s;
}

std::string applyWhatIfSetting(WhatIfSettings& s, const std::string& key,
                               const std::string& value) {
  if (key == "expandable_segments") {
    if (!parseBool(value, &s.model.expandable_segments))
      return "expandable_segments takes True or False, not '" + value + "'";
    return "";
  }
  if (key == "max_split_size_mb") {
    if (value == "unlimited" || value == "none") {
      s.model.max_split_size = ~uint64_t{0};
      return "";
    }
    uint64_t mb = 0;
    // CCA parseArgs: max_split_size_mb must be > kLargeBuffer / 1 MiB (20).
    if (!parseUint(value, &mb) || mb <= alloc::kLargeBuffer / 1048576 || mb > (uint64_t{1} << 30))
      return "max_split_size_mb takes a number of MiB above 20 (or 'unlimited'), not '" + value +
             "'";
    s.model.max_split_size = mb << 20;
    return "";
  }
  if (key == "max_non_split_rounding_mb") {
    uint64_t mb = 0;
    if (!parseUint(value, &mb) || mb > (uint64_t{1} << 30))
      return "max_non_split_rounding_mb takes a number of MiB, not '" + value + "'";
    s.model.max_non_split_rounding = mb << 20;
    return "";
  }
  if (key == "roundup_power2_divisions") {
    if (!value.empty() && value.front() == '[') return parseDivisionList(value, s.model.divisions);
    uint64_t n = 0;
    // One value for every size interval.
    if (!parseUint(value, &n) || !divisionOk(n))
      return "roundup_power2_divisions takes a power of two up to " +
             std::to_string(kWhatIfMaxDivisions) + " (0 = off) or a [MB:N,...,>:N] list, not '" +
             value + "'";
    for (uint32_t& d : s.model.divisions) d = static_cast<uint32_t>(n);
    return "";
  }
  if (key == "garbage_collection_threshold") {
    char* end = nullptr;
    double v = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size() || !(v > 0.0 && v < 1.0))
      return "garbage_collection_threshold takes a number strictly between 0 and 1, not '" + value +
             "'";
    s.gc_threshold = v;
    return "";
  }
  if (key.rfind("pinned_", 0) == 0)
    return key + " is a pinned (host) memory setting: it does not change device memory";
  if (key == "backend" || key == "release_lock_on_cudamalloc")
    return key + " does not change where or how much device memory is cached";
  return "unknown allocator setting '" + key +
         "' (what-if knows expandable_segments, max_split_size_mb, max_non_split_rounding_mb, "
         "roundup_power2_divisions, garbage_collection_threshold)";
}

std::string describeDivisions(const uint32_t divisions[16]) {
  const bool same =
      std::all_of(divisions, divisions + 16, [&](uint32_t d) { return d == divisions[0]; });
  if (same) return std::to_string(divisions[0]);
  // Runs of equal intervals: "[<256MiB:1,256-511MiB:2,>=512MiB:4]".
  std::string out = "[";
  for (size_t a = 0; a < 16;) {
    size_t b = a;
    while (b + 1 < 16 && divisions[b + 1] == divisions[a]) ++b;
    if (out.size() > 1) out += ",";
    const uint64_t lo = uint64_t{1} << a, hi = (uint64_t{2} << b) - 1;  // MiB
    if (a == 0 && b == 15) {
      out += "all";
    } else if (a == 0) {
      out.append("<").append(std::to_string(hi + 1)).append("MiB");
    } else if (b == 15) {
      out.append(">=").append(std::to_string(lo)).append("MiB");
    } else {
      out.append(std::to_string(lo)).append("-").append(std::to_string(hi)).append("MiB");
    }
    out.append(":").append(std::to_string(divisions[a]));
    a = b + 1;
  }
  return out + "]";
}

std::string describeSettings(const WhatIfSettings& s) {
  std::string out = "expandable_segments=";
  out += s.model.expandable_segments ? "True" : "False";
  out += " max_split_size_mb=";
  out += s.model.max_split_size == ~uint64_t{0} ? std::string("unlimited")
                                                : std::to_string(s.model.max_split_size >> 20);
  out += " roundup_power2_divisions=";
  out += describeDivisions(s.model.divisions);
  out += " garbage_collection_threshold=";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s.gc_threshold);
  out += buf;
  return out;
}

uint64_t impliedCapacity(const format::Snapshot& snap, size_t d) {
  auto ev = snap.trace(d);
  auto before = recordedReserved(snap, d, nullptr);
  uint64_t cap = kWhatIfUnlimited;
  uint64_t reached = 0;  // the card held this much before: it is at least that large
  for (size_t i = 0; i < ev.size(); ++i) {
    reached = std::max(reached, before[i]);
    if (ev[i].action == Action::Oom)
      cap = std::min(cap, std::max(reached, addSat(before[i], ev[i].addr)));
  }
  return cap;
}

SimResult simulateRequests(const format::Snapshot& snap, size_t d, const WhatIfSettings& st,
                           uint64_t capacity) {
  SimResult r;
  r.capacity = capacity;
  Sim sim(st, capacity);
  auto ev = snap.trace(d);
  const bool at_request = freesAtRequest(ev);
  std::vector<uint64_t> rec_before = recordedReserved(snap, d, nullptr);
  const uint64_t rec_cap = impliedCapacity(snap, d);
  std::unordered_map<uint64_t, uint64_t> live;  // recorded address -> simulated address
  // Blocks alive when the trace began, allocated first in address order (their order and the
  // cache around them are not in the file).
  for (const StartBlock& b : startBlocks(snap, d)) {
    const uint64_t rounded = replay::roundSize(b.requested, st.model.divisions);
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
  auto note = [&]() {
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
    const Event& e = ev[i];
    switch (e.action) {
      case Action::Alloc: {
        const uint64_t rounded = replay::roundSize(e.size, st.model.divisions);
        auto a = sim.malloc(poolOf(snap, e), rounded, e.stream);
        if (a) {
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
        for (size_t k = j + 1; k < ev.size() && !own; ++k) {
          if (ev[k].action == Action::SegmentAlloc || ev[k].action == Action::SegmentMap) {
            own = rec_cap != kWhatIfUnlimited && addSat(rec_before[i], ev[k].size) > rec_cap;
            break;
          }
          if (ev[k].action == Action::Oom) own = true;
          if (ev[k].action == Action::Oom || ev[k].action == Action::Alloc) break;
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
  r.segment_allocs = sim.segment_allocs;
  r.segment_frees = sim.segment_frees;
  return r;
}

WhatIfResult runWhatIf(const format::Snapshot& snap, const WhatIfOptions& opt, std::string* error) {
  WhatIfResult res;
  res.base_settings = whatIfSettingsOf(snap);
  res.what_settings = res.base_settings;
  for (const auto& [k, v] : opt.sets) {
    std::string why = applyWhatIfSetting(res.what_settings, k, v);
    if (!why.empty()) {
      if (error != nullptr) *error = why;
      return res;
    }
  }
  res.capacity_given = opt.capacity.has_value();
  for (size_t d = 0; d < snap.traceCount(); ++d) {
    const auto dev = static_cast<int64_t>(d);
    if (opt.device && *opt.device != dev) continue;
    if (snap.trace(d).empty()) continue;
    DeviceWhatIf w = recordedFacts(snap, d);
    const uint64_t implied = impliedCapacity(snap, d);
    w.baseline = simulateRequests(snap, d, res.base_settings, implied);
    w.whatif = simulateRequests(snap, d, res.what_settings, opt.capacity.value_or(implied));
    res.devices.push_back(std::move(w));
  }
  return res;
}

DeviceWhatIf recordedFacts(const format::Snapshot& snap, size_t d) {
  DeviceWhatIf w;
  w.device = static_cast<int64_t>(d);
  auto ev = snap.trace(d);
  recordedReserved(snap, d, &w.recorded_peak_reserved);
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
  w.start_blocks = startBlocks(snap, d).size();
  w.complete_history = w.start_blocks == 0;
  return w;
}

std::vector<uint64_t> whatIfSplitSizesMb(const format::Snapshot& snap, size_t d,
                                         const WhatIfSettings& base) {
  constexpr uint64_t kMiB = 1048576;
  uint64_t oom_max = 0, alloc_max = 0;
  for (const Event& e : snap.trace(d)) {
    if (e.action == Action::Oom) oom_max = std::max(oom_max, e.size);
    if (e.action == Action::Alloc) alloc_max = std::max(alloc_max, e.size);
  }
  const uint64_t r = std::min(oom_max > 0 ? oom_max : alloc_max, kWhatIfMaxRequest);
  std::vector<uint64_t> out;
  const uint64_t mb = r / kMiB;
  if (mb < 32) return out;
  const uint64_t v1 = uint64_t{1} << (63 - __builtin_clzll(mb));
  for (uint64_t v : {v1, v1 / 4}) {
    if (v > 20 && (v << 20) != base.model.max_split_size) out.push_back(v);
  }
  return out;
}

std::string whatIfEstimateReason(const DeviceWhatIf& d, const WhatIfSettings& s) {
  if (!d.complete_history)
    return "history incomplete: " + std::to_string(d.start_blocks) +
           " blocks were alive when the trace began (their order and the cache around them are "
           "not in the file)";
  if (d.baseline.peak_reserved != d.recorded_peak_reserved)
    return "the baseline's peak reserved (" + formatBytes(d.baseline.peak_reserved) +
           ") is not the recorded one (" + formatBytes(d.recorded_peak_reserved) + ")";
  if (s.model.expandable_segments)
    return "expandable segments are simulated request by request (which reservation grows, how "
           "many pages a release unmaps): within a few % of the recorded peaks (docs/whatif.md)";
  if (s.gc_threshold > 0.0)
    return "garbage collection takes the card as the process's memory fraction (CCA collects only "
           "under torch.cuda.set_per_process_memory_fraction)";
  return "";
}

}  // namespace memforensics::analysis
