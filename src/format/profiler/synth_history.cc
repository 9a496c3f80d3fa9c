// synth_history.cc: one device's memory history (allocs and frees, with or without addresses)
// as model events at synthesized addresses, and the final state they leave (profiler_internal.h).
#include <algorithm>
#include <functional>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/allocator_constants.h"
#include "format/profiler/profiler_internal.h"

namespace memforensics::format::profiler_detail {

namespace {

// A synthesized block's size: the one rounding rule (common/allocator_constants.h).
uint64_t round512(uint64_t n) {
  return alloc::estimatedBlockSize(n);
}

// The synthetic address space. Blocks still live at the end of the history (and the one "before
// the profile") are packed from kSlotBase in allocation order, 512-byte rounded, so the final
// state they form tiles one segment [kSlotBase, kSlotBase + reserved at the end); every other
// block gets a slot of a min-heap at kSlotBase + 512 * slot + 256, an address no packed block
// starts at. Replay keys blocks on their start address only, and checks that an alloc starts
// inside a reserved range: packed block k starts below the bytes allocated when it is allocated,
// and a slot below the number of live blocks, so both lie inside the reserved total.
constexpr uint64_t kSlotBase = uint64_t{1} << 40;
constexpr uint64_t kMaxSlots = (uint64_t{1} << 52) / 512;  // addresses stay below 2^53
constexpr uint64_t kMaxSynthBytes = uint64_t{1} << 52;     // reserved and packed bytes

}  // namespace

BuildResult buildDevice(std::vector<Op>& ops, int64_t baseline_alloc, bool have_reserved,
                        bool key_is_address, const std::string& dev, StackId before_stack,
                        const std::string& history) {
  BuildResult out;
  const size_t n = ops.size();
  // Pass 1: match. block_of[i] = the block an op allocates or frees.
  std::vector<int64_t> block_of(n, -1);
  std::unordered_map<uint64_t, std::vector<uint32_t>> live;  // key -> live blocks, newest last
  std::vector<uint8_t> block_pre;                            // per block: allocated before ops
  std::vector<uint64_t> block_size;
  uint64_t pre_bytes = 0, pre_count = 0, double_key = 0;
  bool overflow = false;
  for (size_t i = 0; i < n; ++i) {
    Op& o = ops[i];
    if (!o.free) {
      auto& v = live[o.key];
      if (!v.empty() && key_is_address) ++double_key;
      v.push_back(static_cast<uint32_t>(block_pre.size()));
      block_of[i] = static_cast<int64_t>(block_pre.size());
      block_pre.push_back(0);
      block_size.push_back(o.size);
    } else {
      auto it = live.find(o.key);
      if (it != live.end() && !it->second.empty()) {
        block_of[i] = it->second.back();
        it->second.pop_back();
      } else {
        block_of[i] = static_cast<int64_t>(block_pre.size());
        block_pre.push_back(1);
        block_size.push_back(o.size);
        ++pre_count;
        if (__builtin_add_overflow(pre_bytes, o.size, &pre_bytes)) overflow = true;
      }
    }
  }
  const size_t nblocks = block_pre.size();
  std::vector<uint8_t> packed(nblocks, 0);
  std::vector<uint32_t> packed_ids;
  for (auto& [k, v] : live) {
    for (uint32_t b : v) {
      packed[b] = 1;
      packed_ids.push_back(b);
    }
  }
  live.clear();
  std::sort(packed_ids.begin(), packed_ids.end());  // block ids are in allocation order
  const uint64_t never_freed = packed_ids.size();

  int64_t filler = -1;
  if (baseline_alloc >= 0) {
    int64_t rest = baseline_alloc - static_cast<int64_t>(std::min<uint64_t>(pre_bytes, INT64_MAX));
    if (rest > 0) {
      filler = rest;
    } else if (rest < 0) {
      out.notes.push_back(dev + ": Total Allocated at the first event (" +
                          std::to_string(baseline_alloc) +
                          " B before it) is below the bytes the profile frees without having "
                          "allocated them (" +
                          std::to_string(pre_bytes) + " B): the totals and the events disagree");
    }
  }
  // Addresses: packed blocks (the filler first), then slots for the rest.
  std::vector<uint64_t> addr(nblocks, 0);
  uint64_t cursor = 0;  // packed bytes so far
  uint64_t filler_addr = 0;
  auto pack = [&](uint64_t size) {
    uint64_t a = kSlotBase + std::min(cursor, kMaxSynthBytes);
    cursor = std::min(kMaxSynthBytes, cursor + std::min(round512(size), kMaxSynthBytes));
    return a;
  };
  if (filler > 0) filler_addr = pack(static_cast<uint64_t>(filler));
  for (uint32_t b : packed_ids) addr[b] = pack(block_size[b]);
  auto slot_addr = [](uint64_t s) { return kSlotBase + s * 512 + 256; };
  uint64_t next_slot = 0;
  for (size_t b = 0; b < nblocks; ++b) {
    if (block_pre[b]) addr[b] = slot_addr(next_slot++);  // live from the start until its free
  }
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<>> free_slots;
  auto take = [&]() -> uint64_t {
    if (!free_slots.empty()) {
      uint64_t s = free_slots.top();
      free_slots.pop();
      return s;
    }
    return next_slot < kMaxSlots ? next_slot++ : kMaxSlots - 1;
  };

  // Pass 2: emit.
  const int64_t t0 = n > 0 ? ops[0].time_us : -1;
  uint64_t reserved = 0;
  uint64_t requested = pre_bytes;
  uint64_t alloc_rounded = 0;  // for the high-water mark when there is no reserved total
  for (size_t b = 0; b < nblocks; ++b) {
    if (block_pre[b])
      alloc_rounded = std::min(kMaxSynthBytes, alloc_rounded + round512(block_size[b]));
  }
  uint64_t by_cat[kProfilerCategoryCount + 1] = {};
  auto reserve_to = [&](uint64_t target, int64_t t, StackId st) {
    target = std::min(target, kMaxSynthBytes);
    if (target == reserved) return;
    Event e;
    const bool grow = target > reserved;
    e.action = grow ? Action::SegmentAlloc : Action::SegmentFree;
    e.addr = kSlotBase + std::min(reserved, target);
    e.size = grow ? target - reserved : reserved - target;
    e.time_us = t;
    e.stack = st;
    out.events.push_back(e);
    reserved = target;
  };
  if (have_reserved && n > 0 && ops[0].total_reserved >= 0) {
    reserve_to(static_cast<uint64_t>(ops[0].total_reserved), t0, kEmptyStack);
  }
  if (!have_reserved) {
    uint64_t start = alloc_rounded + (filler > 0 ? round512(static_cast<uint64_t>(filler)) : 0);
    reserve_to(start, t0, kEmptyStack);
  }
  if (filler > 0) {
    Event e;
    e.action = Action::Alloc;
    e.addr = filler_addr;
    e.size = static_cast<uint64_t>(filler);
    e.time_us = t0;
    e.stack = before_stack;
    out.events.push_back(e);
    requested += e.size;
    alloc_rounded = std::min(kMaxSynthBytes, alloc_rounded + round512(e.size));
    out.final_blocks.push_back(FinalBlock{filler_addr, round512(e.size), e.size, before_stack});
  }
  uint64_t mismatches = 0;
  int64_t first_mismatch_us = -1;
  for (size_t i = 0; i < n; ++i) {
    const Op& o = ops[i];
    const auto b = static_cast<size_t>(block_of[i]);
    if (have_reserved && o.total_reserved >= 0)
      reserve_to(static_cast<uint64_t>(o.total_reserved), o.time_us, o.stack);
    Event e;
    e.time_us = o.time_us;
    e.stack = o.stack;
    e.size = o.size;
    e.category = o.category;
    if (!o.free) {
      if (!packed[b]) addr[b] = slot_addr(take());
      e.action = Action::Alloc;
      if (__builtin_add_overflow(requested, o.size, &requested)) overflow = true;
      alloc_rounded = std::min(kMaxSynthBytes, alloc_rounded + round512(o.size));
      if (!have_reserved && alloc_rounded > reserved) reserve_to(alloc_rounded, o.time_us, o.stack);
      if (o.category <= kProfilerCategoryCount) by_cat[o.category] += o.size;
      if (packed[b])
        out.final_blocks.push_back(FinalBlock{addr[b], round512(o.size), o.size, o.stack});
    } else {
      e.action = Action::FreeCompleted;
      uint64_t freed = block_size[b];  // the alloc's request: replay subtracts that
      requested -= std::min(requested, freed);
      alloc_rounded -= std::min(alloc_rounded, round512(freed));
      if (o.category <= kProfilerCategoryCount)
        by_cat[o.category] -= std::min(by_cat[o.category], freed);
    }
    e.addr = addr[b];
    out.events.push_back(e);
    if (o.free && !block_pre[b]) free_slots.push((addr[b] - kSlotBase - 256) / 512);
    if (o.total_alloc >= 0 && static_cast<uint64_t>(o.total_alloc) != requested) {
      if (mismatches++ == 0) first_mismatch_us = o.time_us;
    }
    if (requested > out.peak_requested) {
      out.peak_requested = requested;
      out.peak_time_us = o.time_us;
      std::copy(std::begin(by_cat), std::end(by_cat), std::begin(out.peak_by_category));
    }
  }
  out.final_reserved = reserved;
  if (cursor > reserved) {
    out.notes.push_back(dev + ": the blocks live at the end (" + std::to_string(cursor) +
                        " B, 512-rounded) exceed the reserved bytes at the end (" +
                        std::to_string(reserved) + " B): the totals and the events disagree");
  }
  if (pre_count > 0) {
    out.notes.push_back(dev + ": " + std::to_string(pre_count) +
                        " frees of blocks allocated before " + history + " started (" +
                        std::to_string(pre_bytes) +
                        " B; no alloc to match them): counted as live from the start");
  }
  if (filler > 0) {
    out.notes.push_back(dev + ": " + std::to_string(filler) + " B allocated before " + history +
                        " started and not freed in it (from Total "
                        "Allocated at the first event): one block '[before the profile]'");
  }
  if (never_freed > 0) {
    out.notes.push_back(dev + ": " + std::to_string(never_freed) +
                        " allocations not freed within " + history);
  }
  if (double_key > 0) {
    out.notes.push_back(dev + ": " + std::to_string(double_key) +
                        " allocations at an address that already held a live block (its free "
                        "was not recorded?)");
  }
  if (mismatches > 0) {
    out.notes.push_back(dev +
                        ": the replayed allocated bytes differ from the trace's Total "
                        "Allocated at " +
                        std::to_string(mismatches) +
                        " events (first at t=" + std::to_string(first_mismatch_us) + " us)");
  }
  if (overflow) out.notes.push_back(dev + ": byte totals passed 2^64 (hostile sizes?)");
  return out;
}

void addFinalState(Snapshot& snap, int64_t device, const BuildResult& r) {
  if (r.final_reserved == 0) return;
  Segment g;
  g.device = device;
  g.address = kSlotBase;
  g.total_size = r.final_reserved;
  g.segment_type = snap.strings.intern("large");
  g.is_large = true;
  g.first_block = static_cast<uint32_t>(snap.blocks.size());
  uint64_t cursor = kSlotBase;
  const uint64_t end = kSlotBase + r.final_reserved;
  for (const FinalBlock& f : r.final_blocks) {
    if (f.addr != cursor || f.size > end - std::min(end, cursor)) break;  // inconsistent: noted
    Block b;
    b.address = f.addr;
    b.size = f.size;
    b.requested_size = f.requested;
    b.stack = f.stack;
    b.state = BlockState::ActiveAllocated;
    b.has_requested_size = true;
    snap.blocks.push_back(b);
    g.allocated_size += f.size;
    g.active_size += f.size;
    g.requested_size += f.requested;
    cursor += f.size;
  }
  if (cursor < end) {
    Block b;
    b.address = cursor;
    b.size = end - cursor;
    b.state = BlockState::Inactive;
    snap.blocks.push_back(b);
  }
  g.block_count = static_cast<uint32_t>(snap.blocks.size() - g.first_block);
  snap.segments.push_back(g);
}

void finishTraces(Snapshot& snap, std::vector<std::vector<Event>>& per_device) {
  snap.trace_begin.assign(1, 0);
  size_t total = 0;
  for (auto& v : per_device) total += v.size();
  snap.events.reserve(total);
  for (auto& v : per_device) {
    snap.events.insert(snap.events.end(), v.begin(), v.end());
    snap.trace_begin.push_back(snap.events.size());
    std::vector<Event>().swap(v);
  }
  indexSnapshot(snap);
}

const char* const kNoLayoutNote =
    "no segment information in a profiler trace: block addresses are renumbered and segments "
    "synthesized, so there is no block layout (blocks and what needs one are not available)";

}  // namespace memforensics::format::profiler_detail
