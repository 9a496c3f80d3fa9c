// cupti_convert.cc: CUPTI memory activity records -> native trace events (see cupti_convert.h).
#include "capture/cupti_convert.h"

#include <algorithm>

namespace memforensics::capture::cupti {

namespace {

namespace ft = format::trace;

// format::Action values (the trace stores c10's TraceEntry::Action order).
constexpr uint8_t kAlloc = 0, kFreeRequested = 1, kFreeCompleted = 2, kSegmentAlloc = 3,
                  kSegmentFree = 4, kSegmentMap = 5, kSegmentUnmap = 6;

// CUPTI reports synchronous operations with CUPTI_INVALID_STREAM_ID; the trace calls the default
// stream 0, as PyTorch does.
int64_t streamOf(uint32_t stream_id) {
  return stream_id == CUPTI_INVALID_STREAM_ID ? 0 : int64_t{stream_id};
}

}  // namespace

int64_t Converter::timeUs(uint64_t ns) const {
  if (ns == 0) return -1;
  int64_t t = static_cast<int64_t>(ns) + options_.time_offset_ns;
  return t < 0 ? -1 : t / 1000;
}

void Converter::push(std::vector<TimedEvent>& out, uint64_t ts, ft::TraceEvent e) {
  out.push_back(TimedEvent{ts, seq_++, e});
}

void Converter::noteDevice(uint32_t device) {
  if (device < 32) stats_.devices_seen_mask |= 1u << device;
}

ft::TraceEvent Converter::eventFor(uint64_t ts, uint32_t device, uint64_t addr, const Live& l,
                                   uint32_t stack) const {
  ft::TraceEvent e;
  e.device = device;
  e.addr = addr;
  e.stream = l.stream;
  e.time_us = timeUs(ts);
  e.stack = stack;
  e.pool = l.pool;
  return e;
}

void Converter::emitAlloc(std::vector<TimedEvent>& out, uint64_t ts, uint32_t device, uint64_t addr,
                          const Live& l, uint32_t stack, uint8_t segment_action) {
  ft::TraceEvent e = eventFor(ts, device, addr, l, stack);
  e.action = segment_action;
  e.size = l.segment;
  push(out, ts, e);
  e.action = kAlloc;
  e.size = l.bytes;
  push(out, ts, e);
  stats_.live_bytes += l.segment;
  stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, stats_.live_bytes);
  noteDevice(device);
}

void Converter::emitFree(std::vector<TimedEvent>& out, uint64_t ts, uint32_t device, uint64_t addr,
                         const Live& l, uint32_t stack, uint8_t segment_action) {
  ft::TraceEvent e = eventFor(ts, device, addr, l, stack);
  e.size = l.bytes;
  e.action = kFreeRequested;
  push(out, ts, e);
  e.action = kFreeCompleted;
  push(out, ts, e);
  e.action = segment_action;
  e.size = l.segment;
  push(out, ts, e);
  stats_.live_bytes -= std::min(stats_.live_bytes, l.segment);
  noteDevice(device);
}

void Converter::addRecord(const CUpti_Activity& record, std::vector<TimedEvent>& out) {
  switch (record.kind) {
    case CUPTI_ACTIVITY_KIND_MEMORY2:
      addMemory(reinterpret_cast<const CUpti_ActivityMemory4&>(record), out);
      break;
    case CUPTI_ACTIVITY_KIND_MEMORY_POOL:
      addMemoryPool(reinterpret_cast<const CUpti_ActivityMemoryPool3&>(record));
      break;
    default:
      ++stats_.other_records;
      break;
  }
}

void Converter::addMemory(const CUpti_ActivityMemory4& r, std::vector<TimedEvent>& out) {
  ++stats_.memory_records;
  if (r.memoryKind != CUPTI_ACTIVITY_MEMORY_KIND_DEVICE) {
    size_t k = static_cast<uint32_t>(r.memoryKind) < stats_.other_kind.size()
                   ? static_cast<size_t>(r.memoryKind)
                   : stats_.other_kind.size() - 1;
    ++stats_.other_kind[k];
    return;
  }
  if (ignored_correlations_.count(r.correlationId) != 0) {
    ++stats_.vmm_records_ignored;
    return;
  }
  if (r.deviceId >= ft::kMaxDevice) {
    ++stats_.invalid_operations;
    return;
  }
  const auto key = std::pair{r.deviceId, r.address};
  if (r.memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION) {
    Live l;
    l.bytes = r.bytes;
    l.segment = segmentBytes(r.bytes);
    l.stream = streamOf(r.streamId);
    if (r.isAsync) {
      ++stats_.async_allocs;
      if (r.memoryPoolConfig.memoryPoolType != CUPTI_ACTIVITY_MEMORY_POOL_TYPE_INVALID) {
        l.pool_a = r.memoryPoolConfig.address;
        l.pool_b = r.memoryPoolConfig.memoryPoolType;
        l.pool = interner_.pool(l.pool_a, l.pool_b);
        if (r.memoryPoolConfig.memoryPoolType == CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL) {
          PoolStats& p = pools_[{r.deviceId, r.memoryPoolConfig.address}];
          p.device = r.deviceId;
          p.type = r.memoryPoolConfig.memoryPoolType;
          p.size = r.memoryPoolConfig.pool.size;
          p.peak_size = std::max(p.peak_size, p.size);
          p.release_threshold = r.memoryPoolConfig.releaseThreshold;
        }
      }
    }
    const uint32_t stack = interner_.stackFor(r.correlationId);
    l.stack = stack;
    if (auto it = live_.find(key); it != live_.end()) {
      // The release was lost (dropped records): close the old allocation first so that the
      // trace stays consistent, and count it.
      ++stats_.double_allocs;
      emitFree(out, r.timestamp, r.deviceId, r.address, it->second, ft::kTraceNoStack,
               kSegmentFree);
      live_.erase(it);
    }
    live_.emplace(key, l);
    ++stats_.device_allocs;
    emitAlloc(out, r.timestamp, r.deviceId, r.address, l, stack, kSegmentAlloc);
  } else if (r.memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE) {
    const uint32_t stack = interner_.stackFor(r.correlationId);
    Live l;
    if (auto it = live_.find(key); it != live_.end()) {
      l = it->second;
      live_.erase(it);
      if (r.bytes != 0 && r.bytes != l.bytes) ++stats_.release_size_mismatch;
    } else {
      // Allocated before recording began or its record was dropped: written anyway (with the
      // release's own size) so that replay treats it as live from the start, as it does for a
      // PyTorch history cut by its ring buffer.
      ++stats_.unmatched_releases;
      if (r.bytes == 0) return;  // nothing to say about it
      l.bytes = r.bytes;
      l.segment = segmentBytes(r.bytes);
      l.stream = streamOf(r.streamId);
    }
    ++stats_.device_releases;
    emitFree(out, r.timestamp, r.deviceId, r.address, l, stack, kSegmentFree);
  } else {
    ++stats_.invalid_operations;
  }
}

void Converter::addMemoryPool(const CUpti_ActivityMemoryPool3& r) {
  PoolStats& p = pools_[{r.deviceId, r.address}];
  p.device = r.deviceId;
  p.type = r.memoryPoolType;
  if (r.memoryPoolType == CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL) {
    p.size = r.size;
    p.peak_size = std::max(p.peak_size, r.size);
    p.release_threshold = r.releaseThreshold;
  }
  switch (r.memoryPoolOperationType) {
    case CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED:
      ++stats_.pool_created;
      p.destroyed = false;
      break;
    case CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_DESTROYED:
      ++stats_.pool_destroyed;
      p.destroyed = true;
      break;
    case CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_TRIMMED:
      ++stats_.pool_trimmed;
      break;
    default:
      ++stats_.invalid_operations;
      break;
  }
}

void Converter::addMap(uint32_t device, uint64_t ptr, uint64_t size, uint64_t timestamp_ns,
                       uint32_t correlation_id, std::vector<TimedEvent>& out) {
  if (device >= ft::kMaxDevice || size == 0) return;
  ++stats_.vmm_maps;
  Live l;
  l.bytes = size;
  l.segment = size;
  const uint32_t stack = interner_.stackFor(correlation_id);
  if (auto it = mappings_.find(ptr); it != mappings_.end()) {
    ++stats_.double_allocs;
    Live old;
    old.bytes = old.segment = it->second.size;
    emitFree(out, timestamp_ns, it->second.device, ptr, old, ft::kTraceNoStack, kSegmentUnmap);
    mappings_.erase(it);
  }
  mappings_.emplace(ptr, Mapping{device, size, stack});
  emitAlloc(out, timestamp_ns, device, ptr, l, stack, kSegmentMap);
}

void Converter::addUnmap(uint64_t ptr, uint64_t size, uint64_t timestamp_ns,
                         uint32_t correlation_id, std::vector<TimedEvent>& out) {
  ++stats_.vmm_unmaps;
  const uint32_t stack = interner_.stackFor(correlation_id);
  const uint64_t end = ptr + size;
  bool any = false;
  auto it = mappings_.upper_bound(ptr);
  if (it != mappings_.begin() && std::prev(it)->first + std::prev(it)->second.size > ptr) --it;
  while (it != mappings_.end() && it->first < end) {
    const uint64_t m_end = it->first + it->second.size;
    if (it->first < ptr || m_end > end) {
      ++stats_.vmm_partial_unmaps;  // part of a mapping: CUDA refuses this, so it should not happen
      ++it;
      continue;
    }
    Live l;
    l.bytes = l.segment = it->second.size;
    emitFree(out, timestamp_ns, it->second.device, it->first, l, stack, kSegmentUnmap);
    it = mappings_.erase(it);
    any = true;
  }
  if (!any) ++stats_.vmm_unmatched_unmaps;
}

void Converter::finalState(std::vector<ft::TraceSegment>& segments,
                           std::vector<ft::TraceBlock>& blocks) const {
  struct Item {
    uint32_t device;
    uint64_t addr;
    Live l;
  };
  std::vector<Item> items;
  for (const auto& [key, l] : live_) items.push_back({key.first, key.second, l});
  for (const auto& [addr, m] : mappings_) {
    Live l;
    l.bytes = l.segment = m.size;
    l.stack = m.stack;
    items.push_back({m.device, addr, l});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.device != b.device ? a.device < b.device : a.addr < b.addr;
  });
  for (const Item& it : items) {
    ft::TraceSegment g;
    g.device = it.device;
    g.address = it.addr;
    g.total_size = g.allocated_size = g.active_size = it.l.segment;
    g.requested_size = it.l.bytes;
    g.stream = it.l.stream;
    g.pool_a = it.l.pool_a;
    g.pool_b = it.l.pool_b;
    g.stack = it.l.stack;
    g.is_large = it.l.segment > (1u << 20);
    g.usual_type = true;
    g.first_block = static_cast<uint32_t>(blocks.size());
    g.block_count = 1;
    segments.push_back(g);
    ft::TraceBlock b;
    b.address = it.addr;
    b.size = it.l.segment;
    b.requested_size = it.l.bytes;
    b.stack = it.l.stack;
    b.state = 0;  // active_allocated
    b.has_requested_size = true;
    blocks.push_back(b);
  }
}

void Converter::sortBatch(std::vector<TimedEvent>& events) {
  std::sort(events.begin(), events.end(), [](const TimedEvent& a, const TimedEvent& b) {
    return a.timestamp_ns != b.timestamp_ns ? a.timestamp_ns < b.timestamp_ns : a.seq < b.seq;
  });
}

}  // namespace memforensics::capture::cupti
