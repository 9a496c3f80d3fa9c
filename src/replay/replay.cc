// replay.cc: backward reconstruction of the start state and the forward walk (see replay.h).
#include "replay/replay.h"

#include <algorithm>
#include <optional>

#include "common/allocator_constants.h"
#include "common/saturating.h"
#include "replay/alloc_conf.h"
#include "replay/pass_stats.h"

namespace memforensics::replay {

namespace {

using alloc::kMinBlockSize;  // common/allocator_constants.h

constexpr uint64_t kMaxBytes = ~uint64_t{0};

// Rounding saturates at 2^64-1: a block is never smaller than its request.
uint64_t roundUpPower2Division(uint64_t size, uint64_t divisions) {
  if ((size & (size - 1)) == 0) return size;  // already a power of two
  uint64_t floor2 = uint64_t{1} << (63 - __builtin_clzll(size));
  uint64_t step = floor2 / divisions;
  if (step == 0) return floor2 == uint64_t{1} << 63 ? kMaxBytes : floor2 << 1;
  uint64_t down = size & ~(step - 1);
  uint64_t up;
  if (down == size) return size;
  return __builtin_add_overflow(down, step, &up) ? kMaxBytes : up;
}

// Reserved address ranges: common/address_range.h's RangeSet (sorted, disjoint, touching ranges
// merged, so equal bytes compare equal). Every caller checked validRange first.
AddressRange rangeOf(uint64_t addr, uint64_t size) {
  return *AddressRange::make(addr, size);
}

}  // namespace

uint64_t roundSize(uint64_t size, const uint32_t divisions[16]) {
  if (size < kMinBlockSize) return kMinBlockSize;
  int log2 = 63 - __builtin_clzll(size);
  int idx = std::clamp(log2 - 20, 0, 15);
  uint64_t div = divisions[idx];
  if (div > 1 && size > kMinBlockSize * div && (div & (div - 1)) == 0) {
    return roundUpPower2Division(size, div);
  }
  if (size > kMaxBytes - (kMinBlockSize - 1)) return kMaxBytes;
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

std::string_view severityName(Severity s) {
  switch (s) {
    case Severity::Info:
      return "info";
    case Severity::DataLoss:
      return "data_loss";
    case Severity::Error:
      return "error";
  }
  return "info";
}

namespace {
struct AnomalyInfo {
  const char* id;
  Severity severity;
  const char* description;
};
// snake_case ids derived by hand from the X-macro names (kept next to them for review).
constexpr AnomalyInfo kAnomalyInfo[] = {
#define MEMF_X(id, sev, desc) {#id, Severity::sev, desc},
    MEMF_ANOMALIES(MEMF_X)
#undef MEMF_X
};
std::string snakeCase(const char* camel) {
  std::string out;
  for (const char* p = camel; *p; ++p) {
    if (*p >= 'A' && *p <= 'Z') {
      if (!out.empty()) out.push_back('_');
      out.push_back(static_cast<char>(*p - 'A' + 'a'));
    } else {
      out.push_back(*p);
    }
  }
  return out;
}
const std::vector<std::string>& snakeIds() {
  static const std::vector<std::string> ids = [] {
    std::vector<std::string> v;
    for (const auto& a : kAnomalyInfo) v.push_back(snakeCase(a.id));
    return v;
  }();
  return ids;
}
}  // namespace

std::string_view anomalyId(AnomalyKind k) {
  return snakeIds()[static_cast<size_t>(k)];
}
Severity anomalySeverity(AnomalyKind k) {
  return kAnomalyInfo[static_cast<size_t>(k)].severity;
}
std::string_view anomalyDescription(AnomalyKind k) {
  return kAnomalyInfo[static_cast<size_t>(k)].description;
}

std::vector<std::string_view> untrustedNames(uint8_t mask) {
  std::vector<std::string_view> out;
  if (mask & kUntrustedStart) out.push_back("start");
  if (mask & kUntrustedPeaks) out.push_back("peaks");
  if (mask & kUntrustedFinalReplayed) out.push_back("final_replayed");
  if (mask & kUntrustedBlockLayout) out.push_back("block_layout");
  return out;
}

std::string describeUntrusted(std::string_view cause, uint8_t mask, std::string_view separator) {
  std::string out(cause);
  out += "; not exact:";
  bool first = true;
  for (auto n : untrustedNames(mask)) {
    out += first ? std::string_view(" ") : separator;
    out += n;
    first = false;
  }
  return out;
}

FinalState validateFinalState(const Snapshot& snap, int64_t device) {
  FinalState f;
  std::vector<uint32_t> order;
  const std::span<const format::Segment> mine = snap.segmentsOf(device);
  const auto first = static_cast<size_t>(mine.data() - snap.segments.data());
  for (size_t i = first; i < first + mine.size(); ++i) {
    const auto& seg = snap.segments[i];
    if (!validRange(seg.address, seg.total_size)) {
      ++f.invalid_segments;
      continue;
    }
    order.push_back(static_cast<uint32_t>(i));
  }
  std::stable_sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) {
    return snap.segments[x].address < snap.segments[y].address;
  });
  uint64_t prev_end = 0;
  bool any = false;
  for (uint32_t i : order) {
    const auto& seg = snap.segments[i];
    if (any && seg.address < prev_end) {
      ++f.overlapping_segments;
      continue;
    }
    any = true;
    const uint64_t end = seg.address + seg.total_size;  // validRange: no wrap
    prev_end = end;
    FinalSegment fs;
    fs.index = i;
    uint64_t cursor = seg.address;
    const auto blocks = snap.blocksOf(seg);
    for (size_t j = 0; j < blocks.size(); ++j) {
      const auto& b = blocks[j];
      if (!validRange(b.address, b.size) || b.address < cursor || b.address + b.size > end) {
        ++f.bad_blocks;
        continue;
      }
      cursor = b.address + b.size;
      if (b.isActive() && b.requested_size > b.size) ++f.requested_over_size;
      fs.blocks.push_back(seg.first_block + static_cast<uint32_t>(j));
    }
    f.segments.push_back(std::move(fs));
  }
  return f;
}

DeviceReplayer::DeviceReplayer(const Snapshot& snap, int64_t device)
    : DeviceReplayer(
          snap, device,
          device >= 0 ? snap.trace(static_cast<size_t>(device)) : std::span<const Event>()) {}

DeviceReplayer::DeviceReplayer(const Snapshot& snap, int64_t device, std::span<const Event> events)
    : snap_(snap), device_(device), events_(events) {
  // The file's divisions as every replay reads them (impossible ones ignored: alloc_conf.h).
  const AllocConf conf = allocConfOf(snap);
  std::copy(std::begin(conf.divisions), std::end(conf.divisions), divisions_);
  uint64_t n_req = 0, n_comp = 0;
  for (const Event& e : events_) {
    n_req += e.action == Action::FreeRequested;
    n_comp += e.action == Action::FreeCompleted;
  }
  request_on_complete_ = alloc::freesRequestOnComplete(n_req, n_comp);

  // The file's final state for this device, validated (sizes, wraps, overlaps, blocks outside).
  bool any_final_pending = false;
  has_final_state_ = !snap.segmentsOf(device).empty();
  final_state_rebuilt_ = snap.final_state_rebuilt;
  const FinalState fin = validateFinalState(snap, device);
  auto count = [&](AnomalyKind k, uint64_t n) {
    if (n > 0) anomalies_[static_cast<size_t>(k)].count += n;
  };
  count(AnomalyKind::InvalidSegmentRange, fin.invalid_segments);
  count(AnomalyKind::OverlappingSegments, fin.overlapping_segments);
  count(AnomalyKind::BlockOutsideSegment, fin.bad_blocks);
  count(AnomalyKind::RequestedExceedsBlock, fin.requested_over_size);
  for (const auto& fs : fin.segments) {
    const auto& seg = snap.segments[fs.index];
    (void)final_ranges_.insert(rangeOf(seg.address, seg.total_size));
    add(file_final_.reserved, seg.total_size, -1);
    for (uint32_t bi : fs.blocks) {
      const auto& b = snap.blocks[bi];
      if (!b.isActive()) continue;
      LiveBlock lb;
      lb.requested = std::min(b.requested_size, b.size);
      lb.size = b.size;
      lb.stream = seg.stream;
      lb.stack = b.stack;
      lb.pending = b.state == format::BlockState::ActivePendingFree;
      lb.size_exact = true;
      final_live_.insert(b.address, lb);
      any_final_pending = any_final_pending || lb.pending;
      add(file_final_.requested, lb.requested, -1);
      add(lb.pending ? file_final_.pending : file_final_.allocated, lb.size, -1);
    }
  }
  // skip_actions=["free_completed"] leaves free_requested as the only free. A trace with no
  // free_completed at all could also just be short, with its frees still pending: the final state
  // tells them apart (pending blocks there mean frees really were pending).
  complete_on_request_ = alloc::freesCompleteOnRequest(n_req, n_comp, any_final_pending);
  backward();
  reset();
}

void DeviceReplayer::note(AnomalyKind k, int64_t event) {
  if (event >= 0 && static_cast<size_t>(event) < checked_) return;  // counted on its first visit
  auto& a = anomalies_[static_cast<size_t>(k)];
  if (a.count++ == 0) a.first_event = event;
}

void DeviceReplayer::contradiction(size_t event) {
  if (!has_final_state_) return;
  auto& a = anomalies_[static_cast<size_t>(AnomalyKind::HistoryContradictsFinalState)];
  ++a.count;
  a.first_event = static_cast<int64_t>(event);  // walked backward: the last one set is the earliest
}

void DeviceReplayer::add(uint64_t& c, uint64_t v, int64_t event) {
  bool overflow = false;
  c = addSat(c, v, &overflow);
  if (overflow) note(AnomalyKind::CounterOverflow, event);
}

bool DeviceReplayer::contradictsFinalState() const {
  auto n = [&](AnomalyKind k) { return anomalies_[static_cast<size_t>(k)].count > 0; };
  return n(AnomalyKind::HistoryContradictsFinalState) ||
         (has_final_state_ && n(AnomalyKind::FinalStateMismatch));
}

bool DeviceReplayer::rebuiltMidRun() const {
  return final_state_rebuilt_ && (live_at_start_ > 0 || start_.reserved > 0);
}

uint8_t DeviceReplayer::untrusted() const {
  auto n = [&](AnomalyKind k) { return anomalies_[static_cast<size_t>(k)].count > 0; };
  uint8_t m = 0;
  if (contradictsFinalState() || rebuiltMidRun()) {
    m |= kUntrustedStart | kUntrustedPeaks | kUntrustedFinalReplayed | kUntrustedBlockLayout;
  }
  if (n(AnomalyKind::CounterOverflow))
    m |= kUntrustedStart | kUntrustedPeaks | kUntrustedFinalReplayed;
  return m;
}

std::string_view DeviceReplayer::untrustedCause() const {
  if (contradictsFinalState())
    return "the trace cannot lead to the file's final state (see the anomalies)";
  if (rebuiltMidRun())
    return "the file has no final state (it was rebuilt from the trace's events) and the trace "
           "starts mid-run: what was alive through all of it is in no record";
  if (untrusted() != 0) return "a byte counter saturated (see the anomalies)";
  return "";
}

void DeviceReplayer::backward() {
  ++passStats()[device_].backward;
  const auto& ev = events_;
  // Written below for every alloc event, the only events apply() reads them for: not zeroed.
  alloc_block_size_ = std::make_unique_for_overwrite<uint64_t[]>(ev.size());
  alloc_size_exact_ = std::make_unique_for_overwrite<uint8_t[]>(ev.size());
  U64Map<LiveBlock> w = final_live_;
  RangeSet ranges = final_ranges_;
  // Blocks re-inserted by undoing a free are marked by alloc_event == kFromFree while the pass
  // runs (no block of w has an alloc event yet: all are -1), instead of a second table keyed by
  // address that every undone free and alloc would probe too; the mark is reset to -1 below.
  constexpr int64_t kFromFree = -2;
  // Undoing an event must find the state it produced; where it cannot (an alloc whose block is
  // neither freed later nor alive at the end, a free of a block that is alive afterwards without a
  // later alloc, a segment event the later reserved ranges contradict), the trace cannot lead to
  // the final state: HistoryContradictsFinalState.
  for (size_t k = ev.size(); k-- > 0;) {
    const Event& e = ev[k];
    switch (e.action) {
      case Action::Alloc: {
        LiveBlock b;
        if (w.take(e.addr, &b)) {
          alloc_block_size_[k] = b.size;
          alloc_size_exact_[k] = b.size_exact;
        } else {
          alloc_block_size_[k] = roundSize(e.size, divisions_);
          alloc_size_exact_[k] = 0;
          contradiction(k);
        }
        break;
      }
      case Action::FreeRequested: {
        // One probe: the block the free leaves behind, or a new one when there is none.
        auto [b, fresh] = w.tryEmplace(e.addr);
        if (fresh) {
          b->requested = e.size;
          b->size = roundSize(e.size, divisions_);
          b->stream = e.stream;
          b->stack = e.stack;
          b->alloc_event = kFromFree;
        } else {
          if (complete_on_request_ || !b->pending) contradiction(k);
          if (!complete_on_request_) b->pending = false;
        }
        break;
      }
      case Action::FreeCompleted: {
        auto [b, fresh] = w.tryEmplace(e.addr);
        if (!fresh) {
          contradiction(k);
        } else {
          b->requested = e.size;
          b->size = roundSize(e.size, divisions_);
          b->stream = e.stream;
          b->stack = e.stack;
          b->pending = !request_on_complete_;
          b->alloc_event = kFromFree;
        }
        break;
      }
      case Action::SegmentAlloc:
      case Action::SegmentMap:
        if (!validRange(e.addr, e.size)) break;  // counted and ignored forward
        if (!ranges.erase(rangeOf(e.addr, e.size))) contradiction(k);
        break;
      case Action::SegmentFree:
      case Action::SegmentUnmap:
        if (!validRange(e.addr, e.size)) break;
        if (!ranges.insert(rangeOf(e.addr, e.size))) contradiction(k);
        break;
      default:
        break;
    }
  }
  start_live_ = std::move(w);
  start_ranges_ = std::move(ranges);
  start_ = Counters{};
  start_.reserved = start_ranges_.bytes();
  start_live_.forEach([&](uint64_t addr, const LiveBlock& b) {
    add(start_.requested, b.requested, -1);
    add(b.pending ? start_.pending : start_.allocated, b.size, -1);
    if (!b.size_exact) allocated_exact_ = false;
    if (b.alloc_event == kFromFree) {
      ++freed_before_start_;
      start_live_.find(addr)->alloc_event = -1;  // alive before the trace, as every start block
    }
  });
  live_at_start_ = start_live_.size();
  if (freed_before_start_ > 0) {
    auto& a = anomalies_[static_cast<size_t>(AnomalyKind::FreesBeforeTraceStart)];
    a.count = freed_before_start_;
  }
  if (live_at_start_ > freed_before_start_ && !events_.empty()) {
    auto& a = anomalies_[static_cast<size_t>(AnomalyKind::LiveWithoutAlloc)];
    a.count = live_at_start_ - freed_before_start_;
  }
}

void DeviceReplayer::reset() {
  live_ = start_live_;
  ranges_ = start_ranges_;
  reserved_hit_ = AddressRange{};
  cur_ = start_;
  next_ = 0;
  last_time_ = -1;
}

bool DeviceReplayer::step() {
  return stepOne();
}

inline bool DeviceReplayer::stepOne() {
  const size_t i = next_;
  if (i >= events_.size()) return false;
  if (stats_ == nullptr) stats_ = &passStats()[device_];
  PassStats& st = *stats_;
  if (i == 0) ++st.forward;
  ++st.events_stepped;
  apply(i, events_[i]);
  next_ = i + 1;
  if (checked_ < next_) checked_ = next_;
  return true;
}

size_t DeviceReplayer::stepMany(size_t max, Counters* after) {
  size_t n = 0;
  while (n < max && stepOne()) after[n++] = cur_;
  if (checkpoint_every_ != 0) maybeCheckpoint();
  return n;
}

void DeviceReplayer::keepCheckpoints(size_t every) {
  checkpoint_every_ = every;
  if (every == 0) {
    checkpoints_.clear();
    checkpoints_.shrink_to_fit();
    checkpoint_slots_ = 0;
  }
}

void DeviceReplayer::maybeCheckpoint() {
  const size_t last = checkpoints_.empty() ? 0 : checkpoints_.back().next;
  if (next_ >= events_.size() || next_ < last + checkpoint_every_ ||
      checkpoints_.size() >= kMaxCheckpoints ||
      checkpoint_slots_ + live_.capacity() > kMaxCheckpointSlots)
    return;
  checkpoints_.push_back(Checkpoint{next_, live_, ranges_, cur_, last_time_});
  checkpoint_slots_ += live_.capacity();
}

void DeviceReplayer::advanceTo(int64_t event_index) {
  if (event_index < static_cast<int64_t>(next_) - 1) reset();
  // The latest checkpoint at or before the target that is ahead of here. Every event before it
  // was applied (and checked) on the walk that made it: only the state is taken from it.
  const Checkpoint* from = nullptr;
  for (const Checkpoint& c : checkpoints_) {
    if (c.next > next_ && static_cast<int64_t>(c.next) <= event_index + 1) from = &c;
  }
  if (from != nullptr) {
    live_ = from->live;
    ranges_ = from->ranges;
    reserved_hit_ = AddressRange{};
    cur_ = from->cur;
    next_ = from->next;
    last_time_ = from->last_time;
  }
  while (static_cast<int64_t>(next_) <= event_index && stepOne()) {
  }
}

// Inlined into stepOne(), its one caller (one call per event saved).
[[gnu::always_inline]] inline void DeviceReplayer::apply(size_t i, const Event& e) {
  const auto idx = static_cast<int64_t>(i);
  if (e.time_us >= 0) {
    if (last_time_ >= 0 && e.time_us < last_time_) note(AnomalyKind::TimeRegression, idx);
    last_time_ = e.time_us;
  }
  switch (e.action) {
    case Action::Alloc: {
      // One probe: the slot the new block goes into, or the live block already there.
      auto [slot, fresh] = live_.tryEmplace(e.addr);
      if (!fresh) {
        note(AnomalyKind::DoubleAlloc, idx);
        break;
      }
      if (!reservedContains(e.addr)) note(AnomalyKind::AllocOutsideSegments, idx);
      LiveBlock& b = *slot;
      b.requested = e.size;
      b.size = alloc_block_size_[i];
      b.size_exact = alloc_size_exact_[i] != 0;
      b.alloc_event = idx;
      b.stream = e.stream;
      b.stack = e.stack;
      if (b.requested > b.size) {
        note(AnomalyKind::RequestedExceedsBlock, idx);
        b.requested = b.size;
      }
      if (!b.size_exact) allocated_exact_ = false;
      add(cur_.requested, b.requested, idx);
      add(cur_.allocated, b.size, idx);
      break;
    }
    case Action::FreeRequested: {
      LiveBlock* b = live_.find(e.addr);
      if (b == nullptr) {
        note(AnomalyKind::FreeOfUnknownBlock, idx);
        break;
      }
      if (b->requested != e.size) note(AnomalyKind::FreeSizeMismatch, idx);
      if (complete_on_request_) {
        cur_.requested = subSat(cur_.requested, b->requested);
        if (b->pending)
          cur_.pending = subSat(cur_.pending, b->size);
        else
          cur_.allocated = subSat(cur_.allocated, b->size);
        live_.erase(e.addr);
      } else if (b->pending) {
        note(AnomalyKind::FreeRequestedTwice, idx);
      } else {
        b->pending = true;
        cur_.allocated = subSat(cur_.allocated, b->size);
        add(cur_.pending, b->size, idx);
      }
      break;
    }
    case Action::FreeCompleted: {
      LiveBlock b;
      if (!live_.take(e.addr, &b)) {  // one probe: found and erased
        note(AnomalyKind::FreeOfUnknownBlock, idx);
        break;
      }
      if (b.requested != e.size) note(AnomalyKind::FreeSizeMismatch, idx);
      if (b.pending) {
        cur_.pending = subSat(cur_.pending, b.size);
      } else {
        if (!request_on_complete_) note(AnomalyKind::FreeCompletedWithoutRequest, idx);
        cur_.allocated = subSat(cur_.allocated, b.size);
      }
      cur_.requested = subSat(cur_.requested, b.requested);
      break;
    }
    case Action::SegmentAlloc:
    case Action::SegmentMap:
      if (!validRange(e.addr, e.size)) {
        note(AnomalyKind::InvalidSegmentRange, idx);
        break;
      }
      if (!ranges_.insert(rangeOf(e.addr, e.size))) {
        note(AnomalyKind::SegmentOverlap, idx);  // ignored, as the model does: bytes counted once
        break;
      }
      add(cur_.reserved, e.size, idx);
      break;
    case Action::SegmentFree:
    case Action::SegmentUnmap:
      if (!validRange(e.addr, e.size)) {
        note(AnomalyKind::InvalidSegmentRange, idx);
        break;
      }
      reserved_hit_ = AddressRange{};  // bytes leave the set: the cached range may be gone
      if (!ranges_.erase(rangeOf(e.addr, e.size))) note(AnomalyKind::SegmentNotMapped, idx);
      cur_.reserved = subSat(cur_.reserved, e.size);
      break;
    case Action::Snapshot:
      if (e.size != cur_.active()) note(AnomalyKind::SnapshotMismatch, idx);
      break;
    case Action::Unknown:
      note(AnomalyKind::UnknownAction, idx);
      break;
    default:
      break;
  }
}

bool DeviceReplayer::reservedContains(uint64_t addr) {
  if (reserved_hit_.contains(addr)) return true;
  const std::optional<AddressRange> r = ranges_.find(addr);
  if (!r) return false;
  reserved_hit_ = *r;
  return true;
}

void DeviceReplayer::checkFinalState() {
  if (next_ != events_.size()) return;  // only after the last event
  bool same = live_.size() == final_live_.size() && ranges_ == final_ranges_ &&
              cur_.reserved == file_final_.reserved && cur_.requested == file_final_.requested &&
              cur_.allocated == file_final_.allocated && cur_.pending == file_final_.pending;
  if (same) {
    final_live_.forEach([&](uint64_t addr, const LiveBlock& fb) {
      const LiveBlock* b = live_.find(addr);
      if (b == nullptr || b->requested != fb.requested || b->pending != fb.pending) same = false;
    });
  }
  if (!same && !final_checked_) note(AnomalyKind::FinalStateMismatch, -1);
  final_checked_ = true;
}

DeviceSummary summarizeDevice(DeviceReplayer& r) {
  return summarizeDevice(r, {});
}

DeviceSummary summarizeDevice(DeviceReplayer& r,
                              const std::function<void(size_t, const Counters&)>& after_event) {
  if (!after_event) return summarizeDeviceWith(r, [](size_t, const Counters&) {});
  return summarizeDeviceWith(r, after_event);
}

namespace detail {

DeviceSummary beginSummary(DeviceReplayer& r) {
  DeviceSummary s;
  r.reset();
  s.device = r.device();
  s.events = r.eventCount();
  s.start = r.startCounters();
  s.final_file = r.fileFinal();
  s.live_at_start = r.liveAtStartCount();
  s.freed_before_start = r.freedBeforeStartCount();
  auto init = [](Peak& p, uint64_t v) {
    p.bytes = v;
    p.event = -1;
    p.time_us = -1;
  };
  init(s.peak_reserved, s.start.reserved);
  init(s.peak_requested, s.start.requested);
  init(s.peak_allocated, s.start.allocated);
  init(s.peak_active, s.start.active());
  return s;
}

void finishSummary(DeviceReplayer& r, DeviceSummary& s) {
  r.checkFinalState();
  s.final_replayed = r.counters();
  s.allocated_exact = r.allocatedExact();
  s.untrusted = r.untrusted();
  s.consistent = s.untrusted == 0;
  s.untrusted_cause = r.untrustedCause();
  s.anomalies = r.anomalies();
  s.live_blocks_final = r.live().size();
}

}  // namespace detail

}  // namespace memforensics::replay
