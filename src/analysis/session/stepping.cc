// stepping.cc: see stepping.h.
#include "analysis/session/stepping.h"

#include <algorithm>
#include <iterator>

namespace memforensics::analysis {

using replay::CachedSegment;
using replay::CachingAllocator;

void StepMirror::assign(const std::vector<StepBlock>& blocks) {
  blocks_.clear();
  for (const StepBlock& b : blocks) blocks_.emplace_hint(blocks_.end(), b.address, b);
}

void StepMirror::apply(const StepPatch& p) {
  if (p.lo >= p.hi) return;
  blocks_.erase(blocks_.lower_bound(p.lo), blocks_.lower_bound(p.hi));
  for (const StepBlock& b : p.blocks) blocks_.insert_or_assign(b.address, b);
}

std::vector<StepBlock> StepMirror::blocks() const {
  std::vector<StepBlock> out;
  out.reserve(blocks_.size());
  for (const auto& [a, b] : blocks_) out.push_back(b);
  return out;
}

uint64_t StepMirror::startOf(uint64_t x) const {
  auto it = blocks_.upper_bound(x);
  if (it == blocks_.begin()) return x;
  --it;
  return x - it->second.address < it->second.size ? it->second.address : x;
}

uint64_t StepMirror::endOf(uint64_t x) const {
  auto it = blocks_.upper_bound(x);
  if (it == blocks_.begin()) return x + 1;
  --it;
  return x - it->second.address < it->second.size ? it->second.address + it->second.size : x + 1;
}

namespace {

// The model's block holding x (mapped or not), or nullptr.
const replay::ModelBlock* modelBlockAt(const CachingAllocator& core, uint64_t x) {
  const CachedSegment* s = core.segAt(x);
  if (s == nullptr) return nullptr;
  auto it = s->blocks.upper_bound(x);
  if (it == s->blocks.begin()) return nullptr;
  --it;
  return x - it->second.address < it->second.size ? &it->second : nullptr;
}

// [start of the block before the one holding addr, end of the block after it), within the
// reservation holding addr; {0, 0} when none holds it.
std::pair<uint64_t, uint64_t> around(const CachingAllocator& core, uint64_t addr) {
  const CachedSegment* s = core.segAt(addr);
  if (s == nullptr) return {0, 0};
  auto it = s->blocks.upper_bound(addr);
  if (it == s->blocks.begin()) return {0, 0};
  --it;
  auto lo = it == s->blocks.begin() ? it : std::prev(it);
  auto hi = std::next(it) == s->blocks.end() ? it : std::next(it);
  return {lo->second.address, hi->second.address + hi->second.size};
}

void widen(std::pair<uint64_t, uint64_t>& r, std::pair<uint64_t, uint64_t> o) {
  if (o.first >= o.second) return;
  if (r.first >= r.second) {
    r = o;
    return;
  }
  r.first = std::min(r.first, o.first);
  r.second = std::max(r.second, o.second);
}

bool changes(format::Action a) {
  switch (a) {
    case format::Action::Alloc:
    case format::Action::FreeRequested:
    case format::Action::FreeCompleted:
    case format::Action::SegmentAlloc:
    case format::Action::SegmentFree:
    case format::Action::SegmentMap:
    case format::Action::SegmentUnmap:
      return true;
    default:
      return false;
  }
}

// The event's own range, [addr, addr + max(size, 1)) without overflow; {0, 0} for none.
std::pair<uint64_t, uint64_t> ownRange(const format::Event& e) {
  if (!changes(e.action)) return {0, 0};
  const uint64_t n = std::max<uint64_t>(e.size, 1);
  return {e.addr, e.addr > ~uint64_t{0} - n ? ~uint64_t{0} : e.addr + n};
}

}  // namespace

SteppingRecorder::SteppingRecorder(int64_t first, int64_t last) {
  facts_.first_event = first;
  facts_.last_event = last;
}

void SteppingRecorder::fail(std::string why) {
  if (!on_) return;
  on_ = false;
  facts_.failed = std::move(why);
  facts_.base.clear();
  facts_.patches.clear();
  facts_.segments.clear();
}

uint32_t SteppingRecorder::segmentOf(const CachedSegment& s) {
  StepSegment k{s.address, s.stream, s.pool, s.is_large, s.expandable};
  auto [it, fresh] = segment_index_.try_emplace(k, static_cast<uint32_t>(facts_.segments.size()));
  if (fresh) facts_.segments.push_back(k);
  return it->second;
}

std::vector<StepBlock> SteppingRecorder::blocksIn(const CachingAllocator& core, uint64_t lo,
                                                  uint64_t hi, bool stored) {
  std::vector<StepBlock> out;
  auto it = core.segs.upper_bound(lo);
  if (it != core.segs.begin()) --it;
  for (; it != core.segs.end() && it->second.address < hi; ++it) {
    const CachedSegment& s = it->second;
    for (auto b = s.blocks.lower_bound(lo); b != s.blocks.end() && b->first < hi; ++b) {
      const replay::ModelBlock& m = b->second;
      if (!m.mapped) continue;
      StepBlock sb;
      sb.address = m.address;
      sb.size = m.size;
      sb.state = m.state;
      if (!m.isFree()) {
        sb.requested = m.requested;
        sb.stack = m.stack;
        sb.alloc_event = m.alloc_event;
      }
      sb.segment = segmentOf(s);
      out.push_back(sb);
    }
  }
  if (!stored) return out;
  blocks_ += out.size();
  if (blocks_ > kMaxSteppingBlocks) {
    fail("more than " + std::to_string(kMaxSteppingBlocks) + " blocks in the window");
  }
  return out;
}

void SteppingRecorder::start(const CachingAllocator& core) {
  if (!on_) return;
  facts_.base = blocksIn(core, 0, ~uint64_t{0});
  mirror_.assign(facts_.base);
}

void SteppingRecorder::before(const CachingAllocator& core, const format::Event& e) {
  if (!on_) return;
  std::pair<uint64_t, uint64_t> r = ownRange(e);
  if (r.first < r.second) widen(r, around(core, e.addr));
  lo_ = r.first;
  hi_ = r.second;
}

void SteppingRecorder::after(const CachingAllocator& core, const format::Event& e) {
  if (!on_) return;
  std::pair<uint64_t, uint64_t> r{lo_, hi_};
  if (changes(e.action)) widen(r, around(core, e.addr));
  StepPatch p;
  if (r.first < r.second) {
    // Widen until no block of the state before (the mirror) or after (the model) crosses an end.
    for (int round = 0; round < 64; ++round) {
      uint64_t lo = std::min(mirror_.startOf(r.first), r.first);
      if (const auto* b = modelBlockAt(core, r.first)) lo = std::min(lo, b->address);
      uint64_t hi = std::max(mirror_.endOf(r.second - 1), r.second);
      if (const auto* b = modelBlockAt(core, r.second - 1)) hi = std::max(hi, b->address + b->size);
      if (lo == r.first && hi == r.second) break;
      r = {lo, hi};
    }
    p.lo = r.first;
    p.hi = r.second;
    p.blocks = blocksIn(core, p.lo, p.hi);
    if (!on_) return;
    mirror_.apply(p);
  }
  facts_.patches.push_back(std::move(p));
}

void SteppingRecorder::finish(const CachingAllocator& core) {
  if (!on_) return;
  // The model's layout for the check only: not stored, so not counted against the bound.
  std::vector<StepBlock> model = blocksIn(core, 0, ~uint64_t{0}, /*stored=*/false);
  std::vector<StepBlock> mine = mirror_.blocks();
  if (mine != model) {
    size_t i = 0;
    while (i < mine.size() && i < model.size() && mine[i] == model[i]) ++i;
    fail("the patches did not lead to the model's layout after event " +
         std::to_string(facts_.last_event) + " (first difference at block " + std::to_string(i) +
         ")");
    return;
  }
  facts_.checked = true;
}

}  // namespace memforensics::analysis
