// caching_allocator.cc: PyTorch's caching-allocator rules (see caching_allocator.h). Comments cite
// c10/cuda/CUDACachingAllocator.cpp (CCA) by function name.
#include "replay/caching_allocator.h"

#include <algorithm>

#include "common/saturating.h"

namespace memforensics::replay {

using format::BlockState;

namespace {

// Whole pages of `page` bytes covering `bytes`, without overflow.
uint64_t pagesFor(uint64_t bytes, uint64_t page) {
  return bytes / page + (bytes % page != 0 ? 1 : 0);
}

bool samePool(const CachingAllocator::Key& k, const AllocRequest& r) {
  return k.pool == r.pool && k.large == r.large && k.stream == r.stream;
}

}  // namespace

uint64_t allocationSize(uint64_t size) {
  // CCA get_allocation_size(): 2 MiB for the small pool, 20 MiB below kMinLargeAlloc, else
  // rounded up to kRoundLarge.
  if (size <= alloc::kSmallSize) return alloc::kSmallBuffer;
  if (size < alloc::kMinLargeAlloc) return alloc::kLargeBuffer;
  return alloc::kRoundLarge * ((size + alloc::kRoundLarge - 1) / alloc::kRoundLarge);
}

// --- state -------------------------------------------------------------------------------------

void CachingAllocator::assign(const std::map<uint64_t, CachedSegment>& segments) {
  segs = segments;
  free.clear();
  unmapped.clear();
  releasable_.clear();
  gfb_calls.clear();
  for (auto& [a, s] : segs) {
    for (auto& [ba, b] : s.blocks) index(s, b);
  }
}

CachedSegment& CachingAllocator::addSegment(CachedSegment s) {
  auto [it, ok] = segs.emplace(s.address, std::move(s));
  for (auto& [ba, b] : it->second.blocks) index(it->second, b);
  return it->second;
}

void CachingAllocator::eraseSegment(uint64_t address) {
  auto it = segs.find(address);
  if (it == segs.end()) return;
  for (auto& [a, b] : it->second.blocks) unindex(it->second, b);
  segs.erase(it);
}

bool CachingAllocator::cutReservationTail(CachedSegment& s, uint64_t at) {
  if (!s.expandable || s.blocks.empty()) return false;
  auto last = std::prev(s.blocks.end());
  ModelBlock& u = last->second;
  if (u.mapped || !u.isFree() || at < u.address) return false;
  unindex(s, u);
  if (at == u.address) {
    s.blocks.erase(last);
  } else {
    u.size = at - u.address;
    index(s, u);
  }
  s.size = at - s.address;
  if (s.blocks.empty()) segs.erase(s.address);
  return true;
}

CachedSegment* CachingAllocator::segAt(uint64_t addr) {
  auto it = segs.upper_bound(addr);
  if (it == segs.begin()) return nullptr;
  --it;
  return addr - it->second.address < it->second.size ? &it->second : nullptr;
}

const CachedSegment* CachingAllocator::segAt(uint64_t addr) const {
  return const_cast<CachingAllocator*>(this)->segAt(addr);
}

ModelBlock* CachingAllocator::blockAt(CachedSegment& s, uint64_t addr) {
  auto it = s.blocks.upper_bound(addr);
  if (it == s.blocks.begin()) return nullptr;
  --it;
  return addr - it->second.address < it->second.size ? &it->second : nullptr;
}

ModelBlock* CachingAllocator::prevOf(CachedSegment& s, const ModelBlock& b) {
  auto it = s.blocks.find(b.address);
  if (it == s.blocks.begin()) return nullptr;
  return &std::prev(it)->second;
}

ModelBlock* CachingAllocator::nextOf(CachedSegment& s, const ModelBlock& b) {
  auto it = s.blocks.find(b.address);
  if (it == s.blocks.end() || ++it == s.blocks.end()) return nullptr;
  return &it->second;
}

void CachingAllocator::index(const CachedSegment& s, ModelBlock& b) {
  if (!b.isFree()) return;
  if (b.mapped) {
    // CCA insert_into_blocks(): a block becoming free starts its garbage-collection age at 0.
    if (!gfb_calls.empty()) {
      auto c = gfb_calls.find({s.pool, s.is_large});
      b.gc_base = c == gfb_calls.end() ? 0 : c->second;
    }
    free.insert(Key{s.pool, s.is_large, s.stream, b.size, b.address});
    if (s.expandable || (b.address == s.address && b.size == s.size)) noteReleasable(s.address);
  } else {
    unmapped.insert(Key{s.pool, s.is_large, s.stream, 0, b.address});
  }
}

void CachingAllocator::unindex(const CachedSegment& s, const ModelBlock& b) {
  if (!b.isFree()) return;
  if (b.mapped)
    free.erase(Key{s.pool, s.is_large, s.stream, b.size, b.address});
  else
    unmapped.erase(Key{s.pool, s.is_large, s.stream, 0, b.address});
}

void CachingAllocator::noteReleasable(uint64_t segment) {
  releasable_.push_back(segment);
  if (releasable_.size() > 2 * segs.size() + 64) pruneReleasable();
}

void CachingAllocator::pruneReleasable() {
  std::sort(releasable_.begin(), releasable_.end());
  releasable_.erase(std::unique(releasable_.begin(), releasable_.end()), releasable_.end());
  std::erase_if(releasable_, [&](uint64_t a) {
    auto it = segs.find(a);
    if (it == segs.end()) return true;
    const CachedSegment& s = it->second;
    return !s.expandable && !s.whollyFree();
  });
}

ModelBlock* CachingAllocator::splitAt(CachedSegment& s, uint64_t at) {
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

ModelBlock* CachingAllocator::merge(CachedSegment& s, ModelBlock* b) {
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

// --- rules -------------------------------------------------------------------------------------

bool CachingAllocator::shouldSplit(const CachedSegment& s, uint64_t block_size,
                                   uint64_t size) const {
  const uint64_t remaining = block_size - size;
  if (!s.is_large || conf_.expandable_segments) return remaining >= alloc::kMinBlockSize;
  return size < conf_.max_split_size && remaining > alloc::kSmallSize;
}

const CachingAllocator::Key* CachingAllocator::getFreeBlock(const AllocRequest& r) const {
  auto it = free.lower_bound(Key{r.pool, r.large, r.stream, r.size, 0});
  if (it == free.end() || !samePool(*it, r)) return nullptr;
  auto isExp = [&](const Key& k) {
    const CachedSegment* s = segAt(k.addr);
    return s != nullptr && s->expandable;
  };
  // With expandable segments a block followed by unmapped space counts as the size it could grow
  // to: a smaller such size further on is preferred.
  auto expandableSize = [&](const Key& k) {
    const CachedSegment* s = segAt(k.addr);
    if (s == nullptr || !s->expandable) return k.size;
    auto b = s->blocks.find(k.addr);
    if (b == s->blocks.end()) return k.size;
    auto nx = std::next(b);
    return k.size + (nx != s->blocks.end() && !nx->second.mapped ? nx->second.size : 0);
  };
  if (isExp(*it) && conf_.expandable_segments) {
    auto next = std::next(it);
    while (isExp(*it) && next != free.end() && samePool(*next, r) &&
           expandableSize(*next) < expandableSize(*it)) {
      it = next++;
    }
  } else if (isExp(*it)) {
    // Expandable segments turned off after some were made (e.g. for IPC): only blocks of
    // ordinary segments are handed out.
    do {
      ++it;
    } while (it != free.end() && isExp(*it) && samePool(*it, r));
    if (it == free.end() || !samePool(*it, r)) return nullptr;
  }
  // Oversize rules: a request < max_split_size never takes a block >= max_split_size, and a
  // request >= it never takes a block >= request + max_non_split_rounding_size.
  const uint64_t msz = conf_.max_split_size;
  if (r.size < msz && it->size >= msz) return nullptr;
  if (r.size >= msz && it->size >= addSat(r.size, conf_.max_non_split_rounding)) return nullptr;
  return &*it;
}

uint64_t CachingAllocator::largestFree(const AllocRequest& r) const {
  auto it = free.lower_bound(Key{r.pool, r.large, r.stream, ~uint64_t{0}, 0});
  if (it == free.begin()) return 0;
  --it;
  return samePool(*it, r) ? it->size : 0;
}

uint64_t CachingAllocator::largestFree() const {
  uint64_t m = 0;
  for (const Key& k : free) m = std::max(m, k.size);
  return m;
}

ModelBlock* CachingAllocator::allocFoundBlock(CachedSegment& s, ModelBlock* b, uint64_t size) {
  unindex(s, *b);
  size = std::min(size, b->size);
  if (b->size > size && shouldSplit(s, b->size, size)) {
    ModelBlock rest = *b;
    rest.address += size;
    rest.size -= size;
    b->size = size;
    auto [it, ok] = s.blocks.emplace(rest.address, rest);
    index(s, it->second);
  }
  b->state = BlockState::ActiveAllocated;
  return b;
}

ModelBlock* CachingAllocator::freeBlock(CachedSegment& s, ModelBlock* b) {
  b->state = BlockState::Inactive;
  b->requested = 0;
  b->stack = format::kNoStack;
  b->alloc_event = -1;
  return merge(s, b);
}

std::optional<uint64_t> CachingAllocator::findExpandableBlock(const AllocRequest& r) const {
  auto& self = const_cast<CachingAllocator&>(*this);
  for (auto it = unmapped.lower_bound(Key{r.pool, r.large, r.stream, 0, 0});
       it != unmapped.end() && samePool(*it, r); ++it) {
    CachedSegment* s = self.segAt(it->addr);
    if (s == nullptr) continue;
    ModelBlock* c = blockAt(*s, it->addr);
    if (ModelBlock* p = prevOf(*s, *c); p != nullptr && p->isFree()) c = p;
    uint64_t bytes = 0;
    for (ModelBlock* b = c; b != nullptr && b->isFree() && bytes < r.size; b = nextOf(*s, *b)) {
      bytes += b->size;
    }
    if (bytes >= r.size) return c->address;
  }
  return std::nullopt;
}

ModelBlock* CachingAllocator::setMapped(CachedSegment& s, uint64_t addr, uint64_t size,
                                        bool mapped) {
  ModelBlock* b = blockAt(s, addr);
  if (b == nullptr || !b->isFree() || b->mapped == mapped) return nullptr;
  if (size > b->address + b->size - addr) return nullptr;
  b = splitAt(s, addr);
  if (b->size > size) splitAt(s, addr + size);
  unindex(s, *b);
  b->mapped = mapped;
  index(s, *b);
  return merge(s, b);
}

std::pair<uint64_t, uint64_t> CachingAllocator::unmappablePages(const CachedSegment& s,
                                                                const ModelBlock& b) {
  const uint64_t page = pageOf(s);
  // Offsets inside the reservation: the block lies inside it, whose end does not wrap, so no sum
  // here passes 2^64 (first * page < last * page <= hi when there is a page to unmap).
  const uint64_t lo = b.address - s.address, hi = lo + b.size;
  const uint64_t first = lo / page + (lo % page != 0), last = hi / page;
  if (last <= first) return {0, 0};
  return {s.address + first * page, (last - first) * page};
}

bool CachingAllocator::growExpandable(uint64_t candidate, uint64_t size,
                                      const std::function<bool(uint64_t)>& may_map) {
  CachedSegment* s = segAt(candidate);
  if (s == nullptr || !s->expandable) return false;
  const uint64_t page = pageOf(*s);
  // map_block(to_map, n): ExpandableSegment::map maps the pages covering [ptr, ptr + n), never
  // past the unmapped block; then try_merge_blocks with both neighbours.
  auto mapBlock = [&](ModelBlock* to_map, uint64_t n) -> ModelBlock* {
    const uint64_t bytes = std::min(to_map->size, mulSat(pagesFor(n, page), page));
    if (!may_map(bytes)) return nullptr;
    return setMapped(*s, to_map->address, bytes, true);
  };
  ModelBlock* c = blockAt(*s, candidate);
  if (c == nullptr || !c->isFree()) return false;
  if (!c->mapped) {
    c = mapBlock(c, std::min(c->size, size));
    if (c == nullptr) return false;
  }
  while (c->size < size) {
    ModelBlock* n = nextOf(*s, *c);
    if (n == nullptr || !n->isFree()) return false;  // find_expandable_block said it fits
    if (n->mapped) {
      c = merge(*s, c);
      if (c->size >= size) break;
      n = nextOf(*s, *c);
      if (n == nullptr || !n->isFree() || n->mapped) return false;
    }
    c = mapBlock(n, std::min(size - c->size, n->size));
    if (c == nullptr) return false;
  }
  return true;
}

Released CachingAllocator::releaseSegment(uint64_t address) {
  auto it = segs.find(address);
  if (it == segs.end()) return {};
  const Released r{it->second.size, 1};
  eraseSegment(address);
  return r;
}

Released CachingAllocator::unmapFree(CachedSegment& s) {
  Released out;
  std::vector<uint64_t> addrs;
  for (auto& [a, b] : s.blocks) {
    if (b.isFree() && b.mapped) addrs.push_back(a);
  }
  for (uint64_t a : addrs) {
    auto it = s.blocks.find(a);
    if (it == s.blocks.end()) continue;
    auto [at, bytes] = unmappablePages(s, it->second);
    if (bytes == 0) continue;
    setMapped(s, at, bytes, false);
    out += Released{bytes, 1};
  }
  // CCA release_blocks(): a reservation left as one unmapped block is released (no trace entry);
  // the next map of its pool and stream reserves a new one.
  if (s.blocks.size() == 1 && !s.blocks.begin()->second.mapped) eraseSegment(s.address);
  return out;
}

Released CachingAllocator::releaseCached() {
  Released out;
  // Every candidate is looked at once; what it keeps is not released by the next call either
  // unless its blocks change, which notes it again. Releasing notes some: take the list first.
  pruneReleasable();
  std::vector<uint64_t> go;
  go.swap(releasable_);
  for (uint64_t a : go) {
    auto it = segs.find(a);
    if (it == segs.end()) continue;
    CachedSegment& s = it->second;
    ++out.visited;
    if (s.expandable) {
      out += unmapFree(s);
    } else if (s.whollyFree()) {
      out += releaseSegment(a);
    }
  }
  return out;
}

bool CachingAllocator::releaseOversize(const AllocRequest& r, Released* out) {
  const uint64_t msz = conf_.max_split_size;
  if (msz == ~uint64_t{0}) return false;
  std::vector<std::pair<uint64_t, uint64_t>> cand;  // (size, address)
  pruneReleasable();
  out->visited += releasable_.size();
  for (uint64_t a : releasable_) {
    auto it = segs.find(a);
    if (it == segs.end()) continue;
    const CachedSegment& s = it->second;
    if (s.expandable || s.pool != r.pool || s.is_large != r.large || s.stream != r.stream) continue;
    if (s.whollyFree() && s.size >= msz) cand.emplace_back(s.size, a);
  }
  if (cand.empty()) return false;
  std::sort(cand.begin(), cand.end());
  // CCA's search key: the request, raised to max_split_size.
  const uint64_t need = std::max(r.size, msz);
  auto it = std::lower_bound(cand.begin(), cand.end(), std::make_pair(need, uint64_t{0}));
  if (it != cand.end()) {
    *out += releaseSegment(it->second);
    return true;
  }
  uint64_t freed = 0;
  for (auto c = cand.rbegin(); c != cand.rend() && freed < need; ++c) {
    freed += c->first;
    *out += releaseSegment(c->second);
  }
  return freed >= need;
}

Released CachingAllocator::garbageCollect(uint64_t target) {
  Released out;
  const PoolId def{0, 0};
  const uint64_t now = gfb_calls[{def, true}];
  auto freeable = [&](const Key& k, uint64_t* age) {
    if (k.pool != def || !k.large) return false;
    const CachedSegment* s = segAt(k.addr);
    if (s == nullptr || s->expandable || !s->whollyFree()) return false;
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
      const Released r = releaseSegment(a);
      reclaimed += r.bytes;
      out += r;
      total_age -= static_cast<double>(age);
      --count;
    }
  }
  return out;
}

// --- what a request needs ----------------------------------------------------------------------

OomNeed requestNeed(uint64_t request_bytes, bool large, bool expandable,
                    const std::vector<const ModelSegment*>& group) {
  OomNeed n;
  n.expandable = expandable;
  if (!expandable) {
    n.segment_bytes = allocationSize(request_bytes);
    n.needed_bytes = n.segment_bytes;
    return n;
  }
  const uint64_t page = large ? alloc::kLargeExpandablePage : alloc::kSmallExpandablePage;
  n.page_bytes = page;
  std::vector<const ModelSegment*> segs;
  for (const ModelSegment* s : group)
    if (s != nullptr && s->is_expandable) segs.push_back(s);
  std::sort(segs.begin(), segs.end(),
            [](const auto* a, const auto* b) { return a->address < b->address; });
  // The unmapped range after segs[i]: up to the next mapped range, or (after the last one) the
  // rest of the reservation, which never runs out (it spans 1.125 x the device's memory).
  auto gapAfter = [&](size_t i) -> uint64_t {
    uint64_t end;
    if (__builtin_add_overflow(segs[i]->address, segs[i]->size, &end)) return 0;
    if (i + 1 == segs.size()) return ~uint64_t{0} - end;
    return segs[i + 1]->address > end ? segs[i + 1]->address - end : 0;
  };
  // find_expandable_block(): unmapped ranges in address order; each starts a chain at the free
  // mapped block right before it, then free blocks and unmapped ranges until the request fits.
  for (size_t i = 0; i < segs.size(); ++i) {
    uint64_t gap = gapAfter(i);
    if (gap == 0) continue;
    const auto& blocks = segs[i]->blocks;
    uint64_t have = !blocks.empty() && blocks.back().isFree() ? blocks.back().size : 0;
    uint64_t free_used = have, pages = 0;
    size_t j = i;
    while (have < request_bytes) {
      const uint64_t take = std::min(request_bytes - have, gap);
      pages = addSat(pages, pagesFor(take, page));
      have += take;
      if (have >= request_bytes || j + 1 >= segs.size()) break;
      bool all_free = true;  // the chain runs on through the next range's free blocks
      for (const auto& b : segs[j + 1]->blocks) {
        if (!b.isFree()) {
          all_free = false;
          break;
        }
        have = addSat(have, b.size);
        free_used = addSat(free_used, b.size);
        if (have >= request_bytes) break;
      }
      if (have >= request_bytes || !all_free) break;
      gap = gapAfter(++j);
      if (gap == 0) break;
    }
    if (have >= request_bytes) {
      n.usable_free = free_used;
      n.pages = pages;
      n.needed_bytes = mulSat(pages, page);
      return n;
    }
    // The chains from the gaps up to segs[j] are suffixes of this one and fail the same way:
    // each range is walked once (linear in the layout, whatever its shape).
    i = std::max(i, j);
  }
  // No range of this pool and stream holds it: a new reservation, every page mapped.
  n.pages = pagesFor(request_bytes, page);
  n.needed_bytes = mulSat(n.pages, page);
  return n;
}

uint64_t shortBy(const OomNeed& need, uint64_t device_free, bool fragmentation) {
  return !fragmentation && need.needed_bytes > device_free ? need.needed_bytes - device_free : 0;
}

}  // namespace memforensics::replay
