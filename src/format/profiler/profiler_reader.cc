// profiler_reader.cc: see profiler_reader.h and docs/profiler-traces.md.
#include "format/profiler/profiler_reader.h"

#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/allocator_constants.h"
#include "common/flat_map.h"

namespace memforensics::format {

uint64_t gzipDecodedBudget(uint64_t compressed_bytes) {
  uint64_t b;
  if (__builtin_mul_overflow(compressed_bytes, kGzipExpansionPerInputByte, &b)) b = ~uint64_t{0};
  return std::max(b, kGzipDecodedFloor);
}

uint64_t gzipSnapshotJsonBudget(uint64_t compressed_bytes) {
  uint64_t b;
  if (__builtin_mul_overflow(compressed_bytes, kGzipSnapshotJsonExpansion, &b)) b = ~uint64_t{0};
  return std::max(b, kGzipDecodedFloor);
}

bool looksLikeGzip(std::span<const uint8_t> b) {
  return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b;
}

std::string_view profilerCategoryName(uint8_t c) {
  static constexpr std::string_view kNames[kProfilerCategoryCount] = {
      "PARAMETER",  "OPTIMIZER_STATE", "INPUT",           "TEMPORARY",
      "ACTIVATION", "GRADIENT",        "AUTOGRAD_DETAIL", "unknown"};
  if (c == 0 || c > kProfilerCategoryCount) return "";
  return kNames[c - 1];
}

namespace {

// ---------------------------------------------------------------------------------------------
// Byte sources: plain text, or gzip inflated in 256 KiB pieces. next() returns a byte or -1.

class ByteSource {
 public:
  ByteSource(std::span<const uint8_t> in, bool gzip, uint64_t budget, ProgressFn progress)
      : in_(in), gzip_(gzip), budget_(budget), progress_(std::move(progress)) {
    if (gzip_) {
      std::memset(&zs_, 0, sizeof zs_);
      if (inflateInit2(&zs_, 15 + 32) != Z_OK) {  // 32: gzip or zlib header, detected
        error_ = "cannot initialize zlib";
        done_ = true;
      }
      zs_.next_in = const_cast<Bytef*>(in_.data());
      zs_.avail_in = static_cast<uInt>(std::min<size_t>(in_.size(), kInChunk));
      fed_ = zs_.avail_in;
      buf_.resize(kOutChunk);
    }
  }
  ~ByteSource() {
    if (gzip_) inflateEnd(&zs_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  int next() {
    if (pos_ < len_) return buf_ptr_[pos_++];
    if (!fill()) return -1;
    return buf_ptr_[pos_++];
  }
  uint64_t decoded() const { return decoded_; }
  const std::string& error() const { return error_; }
  bool gzip() const { return gzip_; }

 private:
  static constexpr size_t kInChunk = 1u << 20;
  static constexpr size_t kOutChunk = 256u << 10;

  bool fill() {
    pos_ = len_ = 0;
    if (done_) return false;
    if (!gzip_) {
      if (plain_off_ >= in_.size()) {
        done_ = true;
        return false;
      }
      size_t n = std::min<size_t>(in_.size() - plain_off_, kOutChunk);
      buf_ptr_ = in_.data() + plain_off_;
      plain_off_ += n;
      len_ = n;
      decoded_ += n;
      report(plain_off_);
      return true;
    }
    buf_ptr_ = buf_.data();
    while (len_ == 0) {
      if (zs_.avail_in == 0 && fed_ < in_.size()) {
        size_t n = std::min<size_t>(in_.size() - fed_, kInChunk);
        zs_.next_in = const_cast<Bytef*>(in_.data() + fed_);
        zs_.avail_in = static_cast<uInt>(n);
        fed_ += n;
        report(fed_ - n);
      }
      zs_.next_out = buf_.data();
      zs_.avail_out = static_cast<uInt>(buf_.size());
      int r = inflate(&zs_, Z_NO_FLUSH);
      len_ = buf_.size() - zs_.avail_out;
      if (r == Z_STREAM_END) {
        // Concatenated gzip members (gzip a b > c) continue; anything else after the end is
        // ignored with a note.
        size_t consumed = fed_ - zs_.avail_in;
        if (consumed + 2 <= in_.size() && in_[consumed] == 0x1f && in_[consumed + 1] == 0x8b) {
          inflateReset(&zs_);
        } else {
          if (consumed < in_.size()) trailing_ = in_.size() - consumed;
          done_ = true;
        }
      } else if (r == Z_BUF_ERROR && zs_.avail_in == 0 && fed_ >= in_.size()) {
        error_ = "gzip stream truncated: the compressed data ends after " +
                 std::to_string(in_.size()) + " bytes (" + std::to_string(decoded_ + len_) +
                 " bytes decompressed); the file was cut short";
        done_ = true;
      } else if (r != Z_OK && r != Z_BUF_ERROR) {
        error_ = std::string("corrupt gzip data at compressed byte ") +
                 std::to_string(fed_ - zs_.avail_in) + ": " + (zs_.msg ? zs_.msg : "zlib error");
        done_ = true;
        len_ = 0;
      }
      if (len_ > budget_ - std::min(budget_, decoded_)) {
        error_ = "gzip input decompresses to more than " + std::to_string(budget_) +
                 " bytes, the budget for a " + std::to_string(in_.size()) + "-byte file (max(" +
                 std::to_string(kGzipDecodedFloor >> 20) + " MiB, " +
                 std::to_string(kGzipExpansionPerInputByte) +
                 " x its size)): refused as a decompression bomb";
        done_ = true;
        len_ = 0;
        return false;
      }
      decoded_ += len_;
      if (done_ && len_ == 0) return false;
    }
    return true;
  }
  void report(uint64_t consumed) {
    if (progress_ && consumed - last_report_ >= (8u << 20)) {
      last_report_ = consumed;
      progress_(consumed, in_.size());
    }
  }

 public:
  size_t trailing_ = 0;

 private:
  std::span<const uint8_t> in_;
  bool gzip_;
  uint64_t budget_;
  ProgressFn progress_;
  z_stream zs_{};
  std::vector<uint8_t> buf_;
  const uint8_t* buf_ptr_ = nullptr;
  size_t pos_ = 0, len_ = 0;
  size_t fed_ = 0;
  size_t plain_off_ = 0;
  uint64_t decoded_ = 0;
  uint64_t last_report_ = 0;
  bool done_ = false;
  std::string error_;
};

// An input iterator over a ByteSource, for nlohmann's sax_parse(first, last).
class SourceIter {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = char;
  SourceIter() = default;
  explicit SourceIter(ByteSource* s) : s_(s), cur_(s->next()) {}
  char operator*() const { return static_cast<char>(cur_); }
  SourceIter& operator++() {
    cur_ = s_->next();
    return *this;
  }
  SourceIter operator++(int) {
    SourceIter t = *this;
    ++*this;
    return t;
  }
  bool operator==(const SourceIter& o) const { return (cur_ < 0) == (o.cur_ < 0); }
  bool operator!=(const SourceIter& o) const { return !(*this == o); }

 private:
  ByteSource* s_ = nullptr;
  int cur_ = -1;
};

// ---------------------------------------------------------------------------------------------
// Scalars as the SAX parser hands them over.

struct Num {
  enum Kind : uint8_t { None, Int, UInt, Float } kind = None;
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0;
  // As an int64, when it is one exactly (a float with no fraction counts).
  bool toI64(int64_t* out) const {
    switch (kind) {
      case Int:
        *out = i;
        return true;
      case UInt:
        if (u > static_cast<uint64_t>(INT64_MAX)) return false;
        *out = static_cast<int64_t>(u);
        return true;
      case Float:
        if (!std::isfinite(d) || d != std::floor(d) || d < -9.2e18 || d > 9.2e18) return false;
        *out = static_cast<int64_t>(d);
        return true;
      default:
        return false;
    }
  }
  bool toU64(uint64_t* out) const {
    if (kind == UInt) {
      *out = u;
      return true;
    }
    int64_t v;
    if (!toI64(&v) || v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  // Microseconds (integer or fractional) as nanoseconds; false for NaN, negative or past 2^62.
  bool usToNs(int64_t* out) const {
    constexpr double kMax = 4.6e15;  // us; x 1000 stays below 2^62
    double v = kind == Float ? d : kind == Int ? static_cast<double>(i) : static_cast<double>(u);
    if (kind == None || !std::isfinite(v) || v < 0 || v > kMax) return false;
    if (kind == Float) {
      *out = static_cast<int64_t>(std::llround(v * 1000.0));
    } else {
      *out = static_cast<int64_t>(kind == Int ? i : static_cast<int64_t>(u)) * 1000;
    }
    return true;
  }
};

// ---------------------------------------------------------------------------------------------
// Records kept from a Kineto trace.

struct MemRec {
  int64_t ts_ns = 0;
  int64_t ev_idx = -1;
  uint64_t addr = 0;
  uint64_t size = 0;  // |Bytes|
  int64_t total_alloc = -1;
  int64_t total_reserved = -1;
  uint32_t thread = 0;
  uint32_t seq = 0;
  int32_t device = 0;
  bool free = false;
  bool has_addr = false;
  StackId stack = kNoStack;
};

struct OpRec {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint32_t thread = 0;
  uint32_t seq = 0;
  FrameId frame = 0;
};

struct StepRec {
  int64_t start_ns = 0, end_ns = 0;
  StrId name = kEmptyStr;
};

struct Counts {
  uint64_t cpu_events = 0, other_device_type = 0, bad_device = 0, bad_bytes = 0, zero_bytes = 0,
           bad_ts = 0, bad_ops = 0, bad_totals = 0, truncated_stacks = 0, bad_rows = 0;
};

// One device's memory history before it becomes events: what the builder matches and emits.
struct Op {
  int64_t time_us = -1;
  uint64_t size = 0;
  uint64_t key = 0;  // what frees are matched on: the address, or the size (and category)
  int64_t total_alloc = -1, total_reserved = -1;
  StackId stack = kNoStack;
  uint8_t category = 0;
  bool free = false;
};

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

struct FinalBlock {
  uint64_t addr = 0, size = 0, requested = 0;
  StackId stack = kNoStack;
};

struct BuildResult {
  std::vector<Event> events;
  std::vector<std::string> notes;
  uint64_t final_reserved = 0;
  std::vector<FinalBlock> final_blocks;  // address order, from kSlotBase, contiguous
  // What the curve reached: for the caller's category summary.
  uint64_t peak_requested = 0;
  int64_t peak_time_us = -1;
  uint64_t peak_by_category[kProfilerCategoryCount + 1] = {};
};

// Turns one device's ops (time order) into model events. Frees are matched to the newest live
// allocation with the same key; a free that matches none is a block allocated before the history
// began (it gets a slot of its own from the start, and replay counts it as live from the start).
// `baseline_alloc` >= 0: the bytes allocated before the first op (from Total Allocated); what of
// it the pre-history frees do not explain becomes one block "allocated before the profile".
// Reserved follows the ops' total_reserved when `have_reserved`, else the allocated (512-rounded)
// high-water mark. `history` names what the ops are in the notes ("the profile", "the plot").
BuildResult buildDevice(std::vector<Op>& ops, int64_t baseline_alloc, bool have_reserved,
                        bool key_is_address, const std::string& dev, StackId before_stack,
                        const std::string& history = "the profile") {
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

// The final state: one segment [kSlotBase, + reserved at the end) holding the blocks still live,
// packed from its start, and an inactive block for the rest.
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

// "path/to/file.py(123): name" -> frame; anything else is kept whole as the name.
Frame pythonFrame(Snapshot& snap, std::string_view s, StrId fallback_file) {
  size_t close = s.find("): ");
  if (close != std::string_view::npos) {
    size_t open = s.rfind('(', close);
    if (open != std::string_view::npos && open + 1 < close) {
      uint64_t line = 0;
      bool digits = true;
      for (size_t k = open + 1; k < close; ++k) {
        char c = s[k];
        if (c < '0' || c > '9' || line > (uint64_t{1} << 40)) {
          digits = false;
          break;
        }
        line = line * 10 + static_cast<uint64_t>(c - '0');
      }
      if (digits) {
        return Frame{snap.strings.intern(s.substr(0, open)),
                     snap.strings.intern(s.substr(close + 3)), line};
      }
    }
  }
  return Frame{fallback_file, snap.strings.intern(s), kUnknownLine};
}

// ---------------------------------------------------------------------------------------------
// The Kineto trace SAX handler.

enum class Field : uint8_t {
  None,
  Ph,
  Cat,
  Name,
  Ts,
  Dur,
  Pid,
  Tid,
  Args,
  DevType,
  DevId,
  Addr,
  Bytes,
  TotalAlloc,
  TotalReserved,
  EvIdx,
  Id,
  TotalMem,
  Rank,
  WorldSize,
  Backend
};
enum class Top : uint8_t {
  None,
  Events,
  DeviceProps,
  DistInfo,
  SchemaVersion,
  BaseTime,
  Snapshot  // a memory snapshot key: the sniffer was wrong (should not happen)
};

struct PidTid {
  uint64_t pid = 0, tid = 0;
  bool operator==(const PidTid&) const = default;
};
struct PidTidHash {
  size_t operator()(const PidTid& p) const noexcept {
    return std::hash<uint64_t>()(p.pid * 0x9E3779B97F4A7C15ull ^ p.tid);
  }
};

class KinetoSax {
 public:
  KinetoSax(Snapshot& snap, uint64_t record_slack) : snap_(snap), slack_(record_slack) {
    file_cpu_op_ = snap.strings.intern("[cpu_op]");
    file_annotation_ = snap.strings.intern("[user_annotation]");
    file_python_ = snap.strings.intern("[python]");
  }

  // Scalars.
  bool null() { return scalar(Num{}, nullptr); }
  bool boolean(bool) { return scalar(Num{}, nullptr); }
  bool number_integer(int64_t v) {
    Num n;
    n.kind = Num::Int;
    n.i = v;
    return scalar(n, nullptr);
  }
  bool number_unsigned(uint64_t v) {
    Num n;
    n.kind = Num::UInt;
    n.u = v;
    return scalar(n, nullptr);
  }
  bool number_float(double v, const std::string&) {
    Num n;
    n.kind = Num::Float;
    n.d = v;
    return scalar(n, nullptr);
  }
  bool string(std::string& s) { return scalar(Num{}, &s); }
  bool binary(nlohmann::json::binary_t&) { return scalar(Num{}, nullptr); }

  bool start_object(std::size_t) {
    if (!open()) return false;
    if (depth_ == 1) root_object_ = true;
    if (depth_ == 3 && top_ == Top::Events) beginEvent();
    if (depth_ == 4 && top_ == Top::Events && field_ == Field::Args) in_args_ = true;
    if (depth_ == 3 && top_ == Top::DeviceProps) {
      prop_id_ = -1;
      prop_mem_ = 0;
      prop_name_.clear();  // an entry without a name has none, not the previous entry's
    }
    return true;
  }
  bool end_object() {
    if (depth_ == 3 && top_ == Top::Events) endEvent();
    if (depth_ == 4) in_args_ = false;
    if (depth_ == 3 && top_ == Top::DeviceProps && prop_id_ >= 0 && prop_id_ < kMaxProfilerDevice) {
      auto id = static_cast<size_t>(prop_id_);
      if (snap_.device_total_memory.size() <= id) snap_.device_total_memory.resize(id + 1, 0);
      snap_.device_total_memory[id] = prop_mem_;
      if (!prop_name_.empty()) device_names_.emplace_back(prop_id_, prop_name_);
    }
    --depth_;
    return true;
  }
  bool start_array(std::size_t) {
    if (!open()) return false;
    if (depth_ == 1) root_array_ = true;
    return true;
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool key(std::string& k) {
    if (depth_ == 1) {
      top_ = k == "traceEvents"                          ? Top::Events
             : k == "deviceProperties"                   ? Top::DeviceProps
             : k == "distributedInfo"                    ? Top::DistInfo
             : k == "schemaVersion"                      ? Top::SchemaVersion
             : k == "baseTimeNanoseconds"                ? Top::BaseTime
             : (k == "segments" || k == "device_traces") ? Top::Snapshot
                                                         : Top::None;
      if (top_ == Top::Events) saw_events_ = true;
      if (top_ == Top::Snapshot) saw_snapshot_key_ = true;
      return true;
    }
    if (depth_ == 3 && top_ == Top::Events) {
      field_ = k == "ph"     ? Field::Ph
               : k == "cat"  ? Field::Cat
               : k == "name" ? Field::Name
               : k == "ts"   ? Field::Ts
               : k == "dur"  ? Field::Dur
               : k == "pid"  ? Field::Pid
               : k == "tid"  ? Field::Tid
               : k == "args" ? Field::Args
                             : Field::None;
      return true;
    }
    if (depth_ == 4 && in_args_) {
      arg_ = k == "Device Type"       ? Field::DevType
             : k == "Device Id"       ? Field::DevId
             : k == "Addr"            ? Field::Addr
             : k == "Bytes"           ? Field::Bytes
             : k == "Total Allocated" ? Field::TotalAlloc
             : k == "Total Reserved"  ? Field::TotalReserved
             : k == "Ev Idx"          ? Field::EvIdx
                                      : Field::None;
      return true;
    }
    if (depth_ == 3 && top_ == Top::DeviceProps) {
      arg_ = k == "id"               ? Field::Id
             : k == "totalGlobalMem" ? Field::TotalMem
             : k == "name"           ? Field::Name
                                     : Field::None;
      return true;
    }
    if (depth_ == 2 && top_ == Top::DistInfo) {
      arg_ = k == "rank"         ? Field::Rank
             : k == "world_size" ? Field::WorldSize
             : k == "backend"    ? Field::Backend
                                 : Field::None;
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&ex);
    error_offset_ = pe ? static_cast<int64_t>(pe->byte) : -1;
    error_ = std::string("invalid JSON") +
             (error_offset_ >= 0 ? " at text byte " + std::to_string(error_offset_) : "") + ": " +
             ex.what();
    return false;
  }

  bool tooDeep() const { return too_deep_; }
  bool overBudget() const { return over_budget_; }
  const std::string& error() const { return error_; }
  bool rootObject() const { return root_object_; }
  bool rootArray() const { return root_array_; }
  bool sawEvents() const { return saw_events_; }
  bool sawSnapshotKey() const { return saw_snapshot_key_; }
  void setDecoded(const ByteSource* s) { source_ = s; }

  // Results.
  std::vector<MemRec> mems;
  std::vector<OpRec> ops;
  std::vector<StepRec> steps;
  std::vector<StepRec> phases;  // Optimizer.* user annotations
  Counts counts;
  int64_t schema_version = -1;
  int64_t base_time_ns = 0;
  int64_t world_size = -1;
  std::string backend;
  std::vector<std::pair<int64_t, std::string>> device_names_;
  uint64_t events_seen = 0;

 private:
  bool open() {
    if (depth_ >= kMaxProfilerJsonDepth) {
      too_deep_ = true;
      return false;
    }
    ++depth_;
    return true;
  }
  bool scalar(const Num& n, std::string* s) {
    if (depth_ == 1 && top_ == Top::SchemaVersion) n.toI64(&schema_version);
    if (depth_ == 1 && top_ == Top::BaseTime) {
      int64_t v;
      if (n.toI64(&v) && v >= 0 && v < (int64_t{1} << 62)) base_time_ns = v;
    }
    if (depth_ == 2 && top_ == Top::DistInfo) {
      if (arg_ == Field::Rank) n.toI64(&snap_.rank);
      if (arg_ == Field::WorldSize) n.toI64(&world_size);
      if (arg_ == Field::Backend && s) backend = s->substr(0, 64);
    }
    if (depth_ == 3 && top_ == Top::DeviceProps) {
      if (arg_ == Field::Id) n.toI64(&prop_id_);
      if (arg_ == Field::TotalMem) n.toU64(&prop_mem_);
      if (arg_ == Field::Name && s) prop_name_ = s->substr(0, 256);
    }
    if (depth_ == 3 && top_ == Top::Events) {
      switch (field_) {
        case Field::Ph:
          if (s) ph_ = s->size() == 1 ? (*s)[0] : '?';
          break;
        case Field::Cat:
          if (s) cat_.swap(*s);
          break;
        case Field::Name:
          if (s) name_.swap(*s);
          break;
        case Field::Ts:
          ts_ = n;
          break;
        case Field::Dur:
          dur_ = n;
          break;
        case Field::Pid:
          pid_ = idOf(n, s);
          break;
        case Field::Tid:
          tid_ = idOf(n, s);
          break;
        default:
          break;
      }
    }
    if (depth_ == 4 && in_args_) {
      switch (arg_) {
        case Field::DevType:
          dev_type_ = n;
          break;
        case Field::DevId:
          dev_id_ = n;
          break;
        case Field::Addr:
          addr_ = n;
          break;
        case Field::Bytes:
          bytes_ = n;
          break;
        case Field::TotalAlloc:
          total_alloc_ = n;
          break;
        case Field::TotalReserved:
          total_reserved_ = n;
          break;
        case Field::EvIdx:
          ev_idx_ = n;
          break;
        default:
          break;
      }
    }
    return true;
  }
  // A pid or tid as a value whatever its JSON type: 2021 Kineto traces write an op's thread as the
  // string "25738" and a memory event's as the number 25738 (the same thread). Other strings
  // ("stream 7", "PyTorch Profiler (0)") are names, kept apart from every number by the top bit.
  static uint64_t idOf(const Num& n, const std::string* s) {
    constexpr uint64_t kName = uint64_t{1} << 63;
    int64_t v = 0;
    if (s) {
      const char* end = s->data() + s->size();
      auto [p, ec] = std::from_chars(s->data(), end, v);
      if (s->empty() || ec != std::errc() || p != end) return std::hash<std::string>()(*s) | kName;
    } else if (!n.toI64(&v)) {
      return 0;
    }
    return static_cast<uint64_t>(v) & ~kName;
  }
  void beginEvent() {
    field_ = Field::None;
    arg_ = Field::None;
    ph_ = 0;
    cat_.clear();
    name_.clear();
    ts_ = dur_ = dev_type_ = dev_id_ = addr_ = bytes_ = total_alloc_ = total_reserved_ = ev_idx_ =
        Num{};
    pid_ = tid_ = 0;
  }
  uint32_t thread() {
    auto [it, inserted] =
        threads_.emplace(PidTid{pid_, tid_}, static_cast<uint32_t>(threads_.size()));
    return it->second;
  }
  bool budget() {
    uint64_t text = source_ ? source_->decoded() : 0;
    uint64_t allowed = text / kProfilerTextBytesPerRecord + slack_;
    if (mems.size() + ops.size() >= allowed) {
      over_budget_ = true;
      return false;
    }
    return true;
  }
  void endEvent() {
    ++events_seen;
    if ((ph_ == 'i' || ph_ == 'I') && name_ == "[memory]") {
      if (!budget()) return;
      int64_t type = -1;
      dev_type_.toI64(&type);
      if (type == 0) {
        ++counts.cpu_events;
        return;
      }
      if (type != 1) {
        ++counts.other_device_type;
        return;
      }
      MemRec m;
      int64_t dev = -1;
      if (!dev_id_.toI64(&dev) || dev < 0 || dev >= kMaxProfilerDevice) {
        ++counts.bad_device;
        return;
      }
      m.device = static_cast<int32_t>(dev);
      if (!ts_.usToNs(&m.ts_ns)) {
        ++counts.bad_ts;
        return;
      }
      int64_t b = 0;
      if (!bytes_.toI64(&b) || b == INT64_MIN) {
        ++counts.bad_bytes;
        return;
      }
      if (b == 0) {
        ++counts.zero_bytes;
        return;
      }
      m.free = b < 0;
      m.size = static_cast<uint64_t>(b < 0 ? -b : b);
      m.has_addr = addr_.toU64(&m.addr);
      int64_t v;
      if (total_alloc_.kind != Num::None) {
        if (total_alloc_.toI64(&v) && v >= 0)
          m.total_alloc = v;
        else
          ++counts.bad_totals;
      }
      if (total_reserved_.kind != Num::None) {
        if (total_reserved_.toI64(&v) && v >= 0)
          m.total_reserved = v;
        else
          ++counts.bad_totals;
      }
      if (ev_idx_.toI64(&v)) m.ev_idx = v;
      m.thread = thread();
      m.seq = static_cast<uint32_t>(mems.size());
      mems.push_back(m);
      return;
    }
    if (ph_ != 'X') return;
    const bool cpu_op = cat_ == "cpu_op";
    const bool annotation = cat_ == "user_annotation";
    const bool python = cat_ == "python_function";
    if (!cpu_op && !annotation && !python) return;
    if (!budget()) return;
    OpRec o;
    int64_t dur = 0;
    if (!ts_.usToNs(&o.start_ns) || !dur_.usToNs(&dur)) {
      ++counts.bad_ops;
      return;
    }
    o.end_ns = o.start_ns + dur;  // both below 2^62
    if (name_.rfind("ProfilerStep#", 0) == 0) {
      steps.push_back(StepRec{o.start_ns, o.end_ns, snap_.strings.intern(name_)});
    } else if (annotation && name_.rfind("Optimizer.", 0) == 0) {
      phases.push_back(StepRec{o.start_ns, o.end_ns, snap_.strings.intern(name_)});
    }
    Frame f;
    if (python) {
      f = pythonFrame(snap_, name_, file_python_);
    } else {
      f = Frame{cpu_op ? file_cpu_op_ : file_annotation_, snap_.strings.intern(name_),
                kUnknownLine};
    }
    o.frame = snap_.stacks.internFrame(f);
    o.thread = thread();
    o.seq = static_cast<uint32_t>(ops.size());
    ops.push_back(o);
  }

  Snapshot& snap_;
  uint64_t slack_;
  const ByteSource* source_ = nullptr;
  int depth_ = 0;
  bool too_deep_ = false, over_budget_ = false, root_object_ = false, root_array_ = false;
  bool saw_events_ = false, saw_snapshot_key_ = false, in_args_ = false;
  Top top_ = Top::None;
  Field field_ = Field::None, arg_ = Field::None;
  char ph_ = 0;
  std::string cat_, name_;
  Num ts_, dur_, dev_type_, dev_id_, addr_, bytes_, total_alloc_, total_reserved_, ev_idx_;
  uint64_t pid_ = 0, tid_ = 0;
  int64_t prop_id_ = -1;
  uint64_t prop_mem_ = 0;
  std::string prop_name_;
  std::unordered_map<PidTid, uint32_t, PidTidHash> threads_;
  std::string error_;
  int64_t error_offset_ = -1;
  StrId file_cpu_op_, file_annotation_, file_python_;
};

// Gives every memory event its stack: the ops that enclose it on its thread by time (inclusive
// ends), innermost first. One sort of each list, then one sweep per thread with a stack of open
// ops: O(n log n); a stack is interned only when the open ops changed (at most
// kMaxProfilerStackFrames frames each).
void assignStacks(Snapshot& snap, std::vector<MemRec>& mems, std::vector<OpRec>& ops,
                  Counts& counts) {
  std::sort(ops.begin(), ops.end(), [](const OpRec& a, const OpRec& b) {
    if (a.thread != b.thread) return a.thread < b.thread;
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    if (a.end_ns != b.end_ns) return a.end_ns > b.end_ns;  // the enclosing one first
    return a.seq < b.seq;
  });
  std::vector<uint32_t> order(mems.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const MemRec& x = mems[a];
    const MemRec& y = mems[b];
    if (x.thread != y.thread) return x.thread < y.thread;
    if (x.ts_ns != y.ts_ns) return x.ts_ns < y.ts_ns;
    return x.seq < y.seq;
  });
  std::vector<uint32_t> open;  // indices into ops, outermost first
  std::vector<FrameId> frames;
  size_t oi = 0;
  uint32_t cur_thread = ~0u;
  bool dirty = true;
  StackId cached = kNoStack;
  for (uint32_t mi : order) {
    MemRec& m = mems[mi];
    if (m.thread != cur_thread) {
      cur_thread = m.thread;
      open.clear();
      dirty = true;
      while (oi < ops.size() && ops[oi].thread < cur_thread) ++oi;
    }
    while (oi < ops.size() && ops[oi].thread == cur_thread && ops[oi].start_ns <= m.ts_ns) {
      while (!open.empty() && ops[open.back()].end_ns < ops[oi].start_ns) open.pop_back();
      open.push_back(static_cast<uint32_t>(oi));
      ++oi;
      dirty = true;
    }
    while (!open.empty() && ops[open.back()].end_ns < m.ts_ns) {
      open.pop_back();
      dirty = true;
    }
    if (dirty) {
      frames.clear();
      for (size_t k = open.size(); k-- > 0 && frames.size() < kMaxProfilerStackFrames;) {
        const OpRec& o = ops[open[k]];
        if (o.end_ns >= m.ts_ns) frames.push_back(o.frame);  // skips ops that overlap oddly
      }
      if (open.size() > kMaxProfilerStackFrames) ++counts.truncated_stacks;
      cached = snap.stacks.internStack(frames);
      dirty = false;
    }
    m.stack = cached;
  }
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
}

std::string sizeText(const ByteSource& src, size_t input) {
  if (!src.gzip()) return std::to_string(input) + " bytes";
  return "gzip, " + std::to_string(input) + " bytes -> " + std::to_string(src.decoded()) +
         " decompressed";
}

const char* kNoLayoutNote =
    "no segment information in a profiler trace: block addresses are renumbered and segments "
    "synthesized, so there is no block layout (blocks and what needs one are not available)";

Expected<Snapshot> readKineto(std::span<const uint8_t> bytes, const ProfilerReadOptions& options,
                              bool gzip) {
  Snapshot snap;
  snap.source = SourceFormat::ProfilerTrace;
  snap.input_bytes = bytes.size();
  snap.has_segment_info = false;
  uint64_t budget =
      options.max_decoded_bytes ? options.max_decoded_bytes : gzipDecodedBudget(bytes.size());
  ByteSource src(bytes, gzip, budget, options.progress);
  KinetoSax sax(snap, kBudgetSlack);
  sax.setDecoded(&src);
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(SourceIter(&src), SourceIter(), &sax);
  } catch (const nlohmann::json::exception& e) {
    if (src.error().empty()) return Error{std::string("torch.profiler trace: ") + e.what(), -1};
  }
  if (!src.error().empty()) return Error{"torch.profiler trace: " + src.error(), -1};
  if (sax.tooDeep()) {
    return Error{"torch.profiler trace: JSON nested more than " +
                     std::to_string(kMaxProfilerJsonDepth) + " levels deep",
                 -1};
  }
  if (sax.overBudget()) {
    return Error{"torch.profiler trace: more records than its " + std::to_string(src.decoded()) +
                     " bytes of text can hold (1 per " +
                     std::to_string(kProfilerTextBytesPerRecord) + " bytes)",
                 -1};
  }
  if (!ok) {
    return Error{"torch.profiler trace: " +
                     (sax.error().empty() ? std::string("invalid JSON") : sax.error()),
                 -1};
  }
  if (!sax.rootObject() || !sax.sawEvents()) {
    return Error{
        "JSON object with no \"traceEvents\": neither a memory snapshot (no \"segments\" "
        "first) nor a torch.profiler trace",
        -1};
  }
  Counts& c = sax.counts;
  assignStacks(snap, sax.mems, sax.ops, c);
  std::vector<OpRec>().swap(sax.ops);

  // Time order per device: ts, then Ev Idx where both have one, then file order.
  auto& mems = sax.mems;
  std::sort(mems.begin(), mems.end(), [](const MemRec& a, const MemRec& b) {
    if (a.device != b.device) return a.device < b.device;
    if (a.ts_ns != b.ts_ns) return a.ts_ns < b.ts_ns;
    if (a.ev_idx >= 0 && b.ev_idx >= 0 && a.ev_idx != b.ev_idx) return a.ev_idx < b.ev_idx;
    return a.seq < b.seq;
  });
  const int64_t base = sax.base_time_ns;
  auto to_us = [base](int64_t ns) { return (base + ns) / 1000; };  // both below 2^62

  std::vector<std::vector<Event>> per_device;
  int64_t max_dev = -1;
  for (const MemRec& m : mems) max_dev = std::max<int64_t>(max_dev, m.device);
  per_device.resize(static_cast<size_t>(max_dev + 1));
  StackId before = snap.stacks.internStack(std::vector<FrameId>{snap.stacks.internFrame(
      Frame{snap.strings.intern("[before the profile]"),
            snap.strings.intern("allocated before the profile started"), kUnknownLine})});
  std::vector<std::string> notes;
  bool any_reserved = false, all_reserved = true;
  for (size_t i = 0; i < mems.size();) {
    size_t j = i;
    while (j < mems.size() && mems[j].device == mems[i].device) ++j;
    const int32_t d = mems[i].device;
    const std::string dev = "device " + std::to_string(d);
    bool addressed = true, with_ta = true, with_tr = true;
    for (size_t k = i; k < j; ++k) {
      addressed &= mems[k].has_addr;
      with_ta &= mems[k].total_alloc >= 0;
      with_tr &= mems[k].total_reserved >= 0;
    }
    std::vector<Op> ops;
    ops.reserve(j - i);
    for (size_t k = i; k < j; ++k) {
      const MemRec& m = mems[k];
      Op o;
      o.time_us = to_us(m.ts_ns);
      o.size = m.size;
      o.key = addressed ? m.addr : m.size;
      o.free = m.free;
      o.stack = m.stack;
      o.total_alloc = with_ta ? m.total_alloc : -1;
      o.total_reserved = with_tr ? m.total_reserved : -1;
      ops.push_back(o);
    }
    int64_t baseline = -1;
    if (with_ta) {
      const MemRec& f = mems[i];
      int64_t delta = f.free ? -static_cast<int64_t>(f.size) : static_cast<int64_t>(f.size);
      if (__builtin_sub_overflow(f.total_alloc, delta, &baseline))
        baseline = -1;
      else if (baseline < 0)
        baseline = 0;
    }
    BuildResult r = buildDevice(ops, baseline, with_tr, addressed, dev, before);
    per_device[static_cast<size_t>(d)] = std::move(r.events);
    addFinalState(snap, d, r);
    if (!addressed) {
      notes.push_back(dev +
                      ": no Addr in its [memory] events (the 2021 trace format): matching by "
                      "address skipped; frees are paired with a live allocation of the same size, "
                      "so the allocated curve is the running sum of Bytes");
    }
    if (with_tr) {
      any_reserved = true;
    } else {
      all_reserved = false;
      notes.push_back(dev +
                      ": reserved is absent from this trace (no Total Reserved): the synthesized "
                      "segments follow the allocated high-water mark, so 'reserved' is that mark");
    }
    if (!with_ta) notes.push_back(dev + ": no Total Allocated: the allocated curve starts at 0");
    for (auto& s : r.notes) notes.push_back(std::move(s));
    i = j;
  }
  finishTraces(snap, per_device);

  // Iterations and optimizer phases as annotations (device -1: every device).
  StrId start = snap.strings.intern("START"), end = snap.strings.intern("END");
  std::sort(sax.steps.begin(), sax.steps.end(),
            [](const StepRec& a, const StepRec& b) { return a.start_ns < b.start_ns; });
  for (auto* list : {&sax.steps, &sax.phases}) {
    for (const StepRec& s : *list) {
      snap.annotations.push_back(Annotation{-1, to_us(s.start_ns), s.name, start});
      snap.annotations.push_back(Annotation{-1, to_us(s.end_ns), s.name, end});
    }
  }
  std::stable_sort(snap.annotations.begin(), snap.annotations.end(),
                   [](const Annotation& a, const Annotation& b) { return a.time_us < b.time_us; });
  snap.traits.has_time_us = true;
  snap.traits.has_device_traces = true;
  snap.traits.has_annotations_key = !snap.annotations.empty();

  snap.origin = "torch.profiler trace (Kineto" +
                (sax.schema_version >= 0 ? ", schemaVersion " + std::to_string(sax.schema_version)
                                         : std::string()) +
                "; " + sizeText(src, bytes.size()) + "; " + std::to_string(sax.events_seen) +
                " events, " + std::to_string(mems.size()) + " CUDA [memory] events";
  if (snap.rank >= 0) {
    snap.origin += "; rank " + std::to_string(snap.rank);
    if (sax.world_size > 0) snap.origin += " of " + std::to_string(sax.world_size);
    if (!sax.backend.empty()) snap.origin += " (" + sax.backend + ")";
  }
  for (const auto& [id, name] : sax.device_names_) {
    auto d = static_cast<size_t>(id);
    if (d < snap.traceCount() && !snap.trace(d).empty())
      snap.origin += "; device " + std::to_string(id) + ": " + name + ", " +
                     std::to_string(snap.device_total_memory[d]) + " B";
  }
  if (!sax.steps.empty())
    snap.origin += "; " + std::to_string(sax.steps.size()) + " ProfilerStep iterations";
  if (!mems.empty() && any_reserved && all_reserved)
    snap.origin += "; reserved from Total Reserved";
  snap.reserved_recorded = all_reserved;
  snap.origin += ")";
  auto& w = snap.load_warnings;
  if (mems.empty() && c.cpu_events > 0) {
    // A CPU-only profile: say what is there, not a question about profile_memory.
    w.push_back("no CUDA [memory] events: the trace holds " + std::to_string(c.cpu_events) +
                " [memory] events, all on the CPU (Device Type 0), which this tool does not "
                "analyse; profile a run on a CUDA device (ProfilerActivity.CUDA, "
                "profile_memory=True) for its GPU memory");
  } else if (mems.empty()) {
    w.push_back("no CUDA [memory] events: was the profile taken with profile_memory=True?");
  } else if (c.cpu_events > 0)
    w.push_back(std::to_string(c.cpu_events) +
                " [memory] events on the CPU (Device Type 0) ignored");
  if (c.other_device_type > 0)
    w.push_back(std::to_string(c.other_device_type) +
                " [memory] events of another device type (not CUDA) ignored");
  if (c.bad_device > 0)
    w.push_back(std::to_string(c.bad_device) + " [memory] events with a Device Id outside [0, " +
                std::to_string(kMaxProfilerDevice) + ") dropped");
  if (c.bad_ts > 0)
    w.push_back(std::to_string(c.bad_ts) +
                " [memory] events with a missing, negative or non-finite ts dropped");
  if (c.bad_bytes > 0)
    w.push_back(std::to_string(c.bad_bytes) +
                " [memory] events with a missing or non-integer Bytes dropped");
  if (c.zero_bytes > 0)
    w.push_back(std::to_string(c.zero_bytes) + " [memory] events of 0 bytes skipped");
  if (c.bad_totals > 0)
    w.push_back(std::to_string(c.bad_totals) +
                " negative or non-integer Total Allocated / Total Reserved values ignored");
  if (c.bad_ops > 0)
    w.push_back(std::to_string(c.bad_ops) +
                " cpu_op / user_annotation / python_function events with an unusable ts or dur "
                "left out of the stacks");
  if (c.truncated_stacks > 0)
    w.push_back(std::to_string(c.truncated_stacks) + " stacks nested deeper than " +
                std::to_string(kMaxProfilerStackFrames) + " ops: the innermost kept");
  for (auto& n : notes) w.push_back(std::move(n));
  if (src.trailing_ > 0)
    w.push_back(std::to_string(src.trailing_) + " bytes after the end of the gzip stream ignored");
  w.push_back(kNoLayoutNote);
  return snap;
}

// ---------------------------------------------------------------------------------------------
// export_memory_timeline files. Every number of the top-level array's items is kept (as int64)
// with the item it belongs to; the form is decided at the end.

class TimelineSax {
 public:
  explicit TimelineSax(uint64_t slack) : slack_(slack) {}
  bool null() { return bad(); }
  bool boolean(bool) { return bad(); }
  bool number_integer(int64_t v) { return num(v); }
  bool number_unsigned(uint64_t v) {
    if (v > static_cast<uint64_t>(INT64_MAX)) return bad();
    return num(static_cast<int64_t>(v));
  }
  bool number_float(double v, const std::string&) {
    if (!std::isfinite(v) || v < -9.2e18 || v > 9.2e18) return bad();
    return num(static_cast<int64_t>(v));
  }
  bool string(std::string&) { return bad(); }
  bool binary(nlohmann::json::binary_t&) { return bad(); }
  bool start_object(std::size_t) { return bad(); }
  bool end_object() { return true; }
  bool key(std::string&) { return true; }
  bool start_array(std::size_t) {
    if (depth_ >= 3) return bad();
    ++depth_;
    if (depth_ == 2) {
      items.push_back(Item{values.size(), rows.size(), false});
    } else if (depth_ == 3) {
      items.back().nested = true;
      rows.push_back(values.size());
    }
    return true;
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    error_ = std::string("invalid JSON: ") + ex.what();
    return false;
  }
  void setDecoded(const ByteSource* s) { source_ = s; }
  const std::string& error() const { return error_; }

  struct Item {
    size_t first_value = 0;  // its numbers: values[first_value, next item's first_value)
    size_t first_row = 0;    // its nested rows: rows[first_row, next item's first_row)
    bool nested = false;     // it holds arrays (the sizes of the JSON form)
  };
  std::vector<Item> items;
  std::vector<int64_t> values;
  std::vector<size_t> rows;  // start of each nested row in values

 private:
  bool bad() {
    if (error_.empty()) error_ = "memory timeline: a value that is not an integer or a list";
    return false;
  }
  bool num(int64_t v) {
    if (depth_ < 2) return bad();
    uint64_t text = source_ ? source_->decoded() : 0;
    if (values.size() >= text / 2 + slack_) {
      error_ = "memory timeline: more numbers than its text can hold";
      return false;
    }
    values.push_back(v);
    return true;
  }
  uint64_t slack_;
  const ByteSource* source_ = nullptr;
  int depth_ = 0;
  std::string error_;
};

Expected<Snapshot> readTimeline(std::span<const uint8_t> bytes, const ProfilerReadOptions& options,
                                bool gzip) {
  Snapshot snap;
  snap.source = SourceFormat::MemoryTimeline;
  snap.input_bytes = bytes.size();
  snap.has_segment_info = false;
  snap.reserved_recorded = false;  // synthesized from the allocated high-water mark
  uint64_t budget =
      options.max_decoded_bytes ? options.max_decoded_bytes : gzipDecodedBudget(bytes.size());
  ByteSource src(bytes, gzip, budget, options.progress);
  TimelineSax sax(kBudgetSlack);
  sax.setDecoded(&src);
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(SourceIter(&src), SourceIter(), &sax);
  } catch (const nlohmann::json::exception& e) {
    if (src.error().empty()) return Error{std::string("memory timeline: ") + e.what(), -1};
  }
  if (!src.error().empty()) return Error{"memory timeline: " + src.error(), -1};
  if (!ok) return Error{sax.error().empty() ? "memory timeline: invalid JSON" : sax.error(), -1};

  StrId cat_file = snap.strings.intern("category: PyTorch profiler");
  StackId cat_stack[kProfilerCategoryCount + 1] = {};
  for (uint8_t k = 1; k <= kProfilerCategoryCount; ++k) {
    FrameId f = snap.stacks.internFrame(
        Frame{cat_file, snap.strings.intern(profilerCategoryName(k)), kUnknownLine});
    cat_stack[k] = snap.stacks.internStack(std::vector<FrameId>{f});
  }
  std::vector<Op> ops;
  Counts c;
  const auto& items = sax.items;
  const auto& vals = sax.values;
  bool json_form = items.size() == 2 && !items[0].nested && items[1].nested;
  std::string form;
  if (json_form) {
    // [times_us, [[0, cat0, ..., cat7], ...]]: per-category levels; each rise is an allocation of
    // that category, each fall frees the newest ones (split where it falls inside one).
    form = "export_memory_timeline JSON ([times, sizes by category])";
    const size_t nt = items[1].first_value - items[0].first_value;
    const size_t nrows = sax.rows.size() - items[1].first_row;
    if (nt != nrows) {
      return Error{"memory timeline: " + std::to_string(nt) + " timestamps but " +
                       std::to_string(nrows) + " size rows",
                   -1};
    }
    std::vector<std::vector<uint64_t>> chunks(kProfilerCategoryCount + 1);
    std::vector<uint64_t> level(kProfilerCategoryCount + 1, 0);
    for (size_t r = 0; r < nrows; ++r) {
      size_t b = sax.rows[items[1].first_row + r];
      size_t e = r + 1 < nrows ? sax.rows[items[1].first_row + r + 1] : vals.size();
      int64_t t = vals[items[0].first_value + r];
      if (t < 0 || t > (int64_t{1} << 52)) {
        ++c.bad_rows;
        continue;
      }
      for (size_t k = 1; k < e - b && k <= kProfilerCategoryCount; ++k) {
        int64_t v = vals[b + k];
        if (v < 0) {
          ++c.bad_rows;
          continue;
        }
        auto cat = static_cast<uint8_t>(k);  // sizes[i] holds category index i - 1
        uint64_t target = static_cast<uint64_t>(v);
        while (level[k] > target) {
          uint64_t top = chunks[k].back();
          chunks[k].pop_back();
          ops.push_back(Op{t, top, (uint64_t{cat} << 56) ^ top, -1, -1, cat_stack[cat], cat, true});
          level[k] -= top;
        }
        if (level[k] < target) {
          uint64_t d = target - level[k];
          chunks[k].push_back(d);
          ops.push_back(Op{t, d, (uint64_t{cat} << 56) ^ d, -1, -1, cat_stack[cat], cat, false});
          level[k] = target;
        }
      }
    }
  } else {
    // [[time_ns, action, bytes, category], ...]: action 1 PREEXISTING, 2 CREATE, 3
    // INCREMENT_VERSION (a -bytes row for the old version's category, a +bytes row for the new
    // one's), 4 DESTROY; time -1 = before the profile (shown at the first time).
    form = "export_memory_timeline raw rows ([time, action, bytes, category])";
    int64_t first_t = -1;
    for (const auto& it : items) {
      if (it.nested || (it.first_value + 4 > vals.size())) continue;
      int64_t t = vals[it.first_value];
      if (t >= 0 && (first_t < 0 || t < first_t)) first_t = t;
    }
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& it = items[i];
      size_t e = i + 1 < items.size() ? items[i + 1].first_value : vals.size();
      if (it.nested || e - it.first_value != 4) {
        ++c.bad_rows;
        continue;
      }
      int64_t t = vals[it.first_value], action = vals[it.first_value + 1];
      int64_t bytes_v = vals[it.first_value + 2], cat_i = vals[it.first_value + 3];
      if (t < -1 || action < 1 || action > 4 || cat_i < 0 || cat_i >= kProfilerCategoryCount ||
          bytes_v == INT64_MIN || bytes_v == 0) {
        ++c.bad_rows;
        continue;
      }
      if (t == -1) t = first_t;
      auto cat = static_cast<uint8_t>(cat_i + 1);
      bool free = bytes_v < 0;
      auto size = static_cast<uint64_t>(free ? -bytes_v : bytes_v);
      int64_t t_us = t < 0 ? -1 : t / 1000;
      ops.push_back(
          Op{t_us, size, (uint64_t{cat} << 56) ^ size, -1, -1, cat_stack[cat], cat, free});
    }
    std::stable_sort(ops.begin(), ops.end(),
                     [](const Op& a, const Op& b) { return a.time_us < b.time_us; });
  }
  std::vector<std::vector<Event>> per_device(1);
  BuildResult r = buildDevice(ops, -1, false, false, "device 0", kNoStack);
  per_device[0] = std::move(r.events);
  addFinalState(snap, 0, r);
  finishTraces(snap, per_device);
  snap.traits.has_time_us = true;
  snap.traits.has_device_traces = true;
  snap.origin = "torch.profiler memory timeline: " + form + "; " + sizeText(src, bytes.size()) +
                "; " + std::to_string(ops.size()) + " events";
  auto& w = snap.load_warnings;
  w.push_back(
      "categories: PyTorch profiler's own (its dataflow analysis), carried on every event and "
      "shown as the stack '[category: PyTorch profiler] NAME'");
  w.push_back(
      "the file names no device: shown as device 0; reserved is absent (the synthesized segments "
      "follow the allocated high-water mark)");
  if (r.peak_time_us >= 0 || r.peak_requested > 0) {
    std::string at = "category: PyTorch profiler, at the peak (" +
                     std::to_string(r.peak_requested) + " B, t=" + std::to_string(r.peak_time_us) +
                     " us):";
    for (uint8_t k = 1; k <= kProfilerCategoryCount; ++k) {
      if (r.peak_by_category[k] > 0)
        at += " " + std::string(profilerCategoryName(k)) + " " +
              std::to_string(r.peak_by_category[k]) + " B;";
    }
    w.push_back(at);
  }
  if (c.bad_rows > 0)
    w.push_back(std::to_string(c.bad_rows) + " rows or values not of PyTorch's form skipped");
  for (auto& n : r.notes) {
    if (n.find("allocations not freed") == std::string::npos) w.push_back(std::move(n));
  }
  w.push_back(kNoLayoutNote);
  return snap;
}

// One string of a memory_viz plot's stack: "FILE:LINE:NAME" (_frame_fmt with full file names), or
// anything else as a frame of that name (profile_plot writes Python function names).
Frame plotFrame(Snapshot& snap, std::string_view text) {
  const size_t c2 = text.rfind(':');
  if (c2 != std::string_view::npos && c2 > 0) {
    const size_t c1 = text.rfind(':', c2 - 1);
    if (c1 != std::string_view::npos) {
      uint64_t line = 0;
      const char* b = text.data() + c1 + 1;
      const char* e = text.data() + c2;
      auto [p, ec] = std::from_chars(b, e, line);
      if (ec == std::errc() && p == e && e > b) {
        return Frame{snap.strings.intern(text.substr(0, c1)),
                     snap.strings.intern(text.substr(c2 + 1)), line};
      }
    }
  }
  return Frame{snap.strings.intern(""), snap.strings.intern(text), kUnknownLine};
}

}  // namespace

Expected<Snapshot> readMemoryVizPlotData(std::string_view text) {
  using nlohmann::json;
  if (text.size() > kMaxPlotDataBytes) {
    return Error{"memory_viz plot data of " + std::to_string(text.size()) +
                     " bytes: above the reader's budget of " + std::to_string(kMaxPlotDataBytes),
                 -1};
  }
  // Its JSON tree is held: nesting deeper than the plot's own (3) is refused before it is built
  // (64 MiB of '[' would otherwise become 64 Mi nested arrays).
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char ch : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (ch == '\\')
        escaped = true;
      else if (ch == '"')
        in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > kMaxPlotDataDepth)
        return Error{"memory_viz plot data: nested deeper than " +
                         std::to_string(kMaxPlotDataDepth) + " levels",
                     -1};
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Error{"memory_viz plot data: invalid JSON", -1};
  auto array = [&](const char* key) -> const json* {
    auto it = j.find(key);
    return it != j.end() && it->is_array() ? &*it : nullptr;
  };
  const json* actions = array("actions");
  const json* strings = array("string_table");
  const json* suffix = array("suffix_table");
  const json* initially = array("initially_allocated");
  if (actions == nullptr || strings == nullptr || suffix == nullptr) {
    return Error{"memory_viz plot data: no actions, string_table or suffix_table array", -1};
  }
  // Elements: [{size, info}] (2.0), or the same as elements_size / elements_info (later 2.0.x).
  std::vector<uint64_t> sizes;
  std::vector<int64_t> infos;
  auto element = [&](const json& size, const json& info) {
    if (!size.is_number_unsigned() || !(info.is_null() || info.is_number_unsigned())) return false;
    sizes.push_back(size.get<uint64_t>());
    infos.push_back(info.is_null() ? -1
                                   : static_cast<int64_t>(std::min<uint64_t>(info.get<uint64_t>(),
                                                                             uint64_t{1} << 62)));
    return true;
  };
  if (const json* el = array("elements")) {
    for (const json& e : *el) {
      if (!e.is_object() || !e.contains("size") || !e.contains("info") ||
          !element(e["size"], e["info"]))
        return Error{"memory_viz plot data: an element without a size and an info", -1};
    }
  } else if (const json* es = array("elements_size"), *ei = array("elements_info");
             es != nullptr && ei != nullptr && es->size() == ei->size()) {
    for (size_t k = 0; k < es->size(); ++k) {
      if (!element((*es)[k], (*ei)[k]))
        return Error{"memory_viz plot data: an element without a size and an info", -1};
    }
  } else {
    return Error{"memory_viz plot data: no elements", -1};
  }
  Snapshot snap;
  snap.source = SourceFormat::MemoryVizHtml;
  snap.has_segment_info = false;
  snap.reserved_recorded = false;
  snap.traits.has_device_traces = true;
  // A stack per info id (the suffix table shares tails: a chain's rest is always an earlier id, so
  // every walk ends), cached; the size line and the "alloc not recorded" line are not frames.
  std::vector<StackId> stack_of(suffix->size(), kNoStack);
  std::vector<uint8_t> done(suffix->size(), 0);
  auto stackOf = [&](int64_t info) -> Expected<StackId> {
    if (info < 0) return kNoStack;
    if (static_cast<uint64_t>(info) >= suffix->size())
      return Error{"memory_viz plot data: an element's info is outside the suffix table", -1};
    const auto id0 = static_cast<size_t>(info);
    if (done[id0]) return stack_of[id0];
    std::vector<FrameId> frames;
    int64_t id = info;
    while (id >= 0) {
      const json& entry = (*suffix)[static_cast<size_t>(id)];
      if (!entry.is_array() || entry.size() != 2 || !entry[0].is_number_unsigned() ||
          !(entry[1].is_null() || entry[1].is_number_unsigned()))
        return Error{"memory_viz plot data: a suffix table entry is not [string, rest]", -1};
      const uint64_t sid = entry[0].get<uint64_t>();
      if (sid >= strings->size() || !(*strings)[sid].is_string())
        return Error{"memory_viz plot data: a suffix names no string", -1};
      const int64_t rest =
          entry[1].is_null()
              ? -1
              : static_cast<int64_t>(std::min<uint64_t>(entry[1].get<uint64_t>(), INT64_MAX));
      if (rest >= id) return Error{"memory_viz plot data: a suffix chain does not end", -1};
      const std::string& line = (*strings)[sid].get_ref<const std::string&>();
      const bool label =
          line.find(" allocation") != std::string::npos && frames.empty() && id == info;
      if (!label && line != "alloc not recorded, stack trace for free:" &&
          frames.size() < kMaxProfilerStackFrames)
        frames.push_back(snap.stacks.internFrame(plotFrame(snap, line)));
      id = rest;
    }
    done[id0] = 1;
    return stack_of[id0] = frames.empty() ? kEmptyStack : snap.stacks.internStack(frames);
  };
  // An element's first action allocates it, the next frees it (as the page's own script reads
  // them); those alive at the start are freed by their first action.
  std::vector<uint8_t> live(sizes.size(), 0);
  if (initially != nullptr) {
    for (const json& v : *initially) {
      if (!v.is_number_unsigned() || v.get<uint64_t>() >= sizes.size())
        return Error{"memory_viz plot data: initially_allocated names no element", -1};
      live[v.get<uint64_t>()] = 1;
    }
  }
  std::vector<Op> ops;
  ops.reserve(actions->size());
  for (const json& v : *actions) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() >= sizes.size())
      return Error{"memory_viz plot data: an action names no element", -1};
    const auto k = static_cast<size_t>(v.get<uint64_t>());
    auto st = stackOf(infos[k]);
    if (!st) return st.error();
    ops.push_back(Op{-1, sizes[k], k + 1, -1, -1, *st, 0, live[k] != 0});
    live[k] ^= 1;
  }
  std::vector<std::vector<Event>> per_device(1);
  BuildResult r = buildDevice(ops, -1, false, true, "device 0", kNoStack, "the plot");
  per_device[0] = std::move(r.events);
  addFinalState(snap, 0, r);
  finishTraces(snap, per_device);
  snap.origin = "memory_viz plot data (torch.cuda._memory_viz.trace_plot of PyTorch 2.0): " +
                std::to_string(sizes.size()) + " allocations, " + std::to_string(actions->size()) +
                " actions";
  auto& w = snap.load_warnings;
  w.push_back(
      "a PyTorch 2.0 memory_viz page holds the plot of one device's allocations (which device is "
      "not recorded: shown as device 0), in order without times, and no segments; reserved "
      "bytes are absent");
  for (auto& n : r.notes) w.push_back(std::move(n));
  w.push_back(
      "no segment information in a memory_viz plot: block addresses are synthesized, so there is "
      "no block layout (blocks and what needs one are not available)");
  return snap;
}

namespace {

// First bytes of the text (decompressed when gzip), for sniffing.
std::string prefixText(std::span<const uint8_t> bytes, size_t want) {
  std::string out;
  if (!looksLikeGzip(bytes)) {
    out.assign(reinterpret_cast<const char*>(bytes.data()), std::min(bytes.size(), want));
    return out;
  }
  ByteSource src(bytes, true, want + (1u << 20), nullptr);
  while (out.size() < want) {
    int ch = src.next();
    if (ch < 0) break;
    out.push_back(static_cast<char>(ch));
  }
  return out;
}

}  // namespace

ProfilerKind sniffProfiler(std::span<const uint8_t> bytes) {
  const bool gz = looksLikeGzip(bytes);
  std::string t = prefixText(bytes, 4096);
  size_t i = 0;
  if (t.size() >= 3 && static_cast<uint8_t>(t[0]) == 0xEF && static_cast<uint8_t>(t[1]) == 0xBB &&
      static_cast<uint8_t>(t[2]) == 0xBF)
    i = 3;
  auto ws = [&] {
    while (i < t.size() && (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t')) ++i;
  };
  ws();
  if (i < t.size() && t[i] == '[') {
    ++i;
    ws();
    // A timeline's first item is a row or the times: [[-1, ...  [[10, ...  or empty [[]
    if (i < t.size() && t[i] == '[') {
      ++i;
      ws();
      if (i < t.size() && (t[i] == '-' || t[i] == ']' || (t[i] >= '0' && t[i] <= '9')))
        return ProfilerKind::MemoryTimeline;
    }
    return gz ? ProfilerKind::MemoryTimeline : ProfilerKind::NotProfiler;
  }
  if (i < t.size() && t[i] == '{') {
    ++i;
    ws();
    if (i < t.size() && t[i] == '"') {
      size_t e = t.find('"', i + 1);
      std::string_view k = e == std::string::npos ? std::string_view()
                                                  : std::string_view(t).substr(i + 1, e - i - 1);
      // A snapshot's JSON, gzip or not (gzipped, it was refused as a trace without traceEvents).
      for (std::string_view snapshot_key :
           {"segments", "device_traces", "allocator_settings", "external_annotations"}) {
        if (k == snapshot_key) return ProfilerKind::NotProfiler;
      }
      return ProfilerKind::KinetoTrace;
    }
    return gz ? ProfilerKind::KinetoTrace : ProfilerKind::NotProfiler;
  }
  return gz ? ProfilerKind::KinetoTrace : ProfilerKind::NotProfiler;
}

Expected<std::vector<uint8_t>> gunzipBounded(std::span<const uint8_t> bytes, uint64_t budget) {
  ByteSource src(bytes, true, budget, nullptr);
  std::vector<uint8_t> out;
  for (int ch; (ch = src.next()) >= 0;) out.push_back(static_cast<uint8_t>(ch));
  if (!src.error().empty()) return Error{src.error(), -1};
  return out;
}

Expected<Snapshot> readProfilerInput(std::span<const uint8_t> bytes,
                                     const ProfilerReadOptions& options) {
  const bool gz = looksLikeGzip(bytes);
  try {
    switch (sniffProfiler(bytes)) {
      case ProfilerKind::MemoryTimeline:
        return readTimeline(bytes, options, gz);
      case ProfilerKind::KinetoTrace:
        return readKineto(bytes, options, gz);
      case ProfilerKind::NotProfiler:
        break;
    }
  } catch (const std::bad_alloc&) {
    return Error{"out of memory while reading a torch.profiler input", -1};
  }
  return Error{"not a torch.profiler trace or memory timeline", 0};
}

}  // namespace memforensics::format
