// profiler_internal.h: what the profiler-input readers share (not part of the format API).
//
//   gzip_source.cc             ByteSource: plain or gzip text, inflated piecewise within a budget
//   synth_history.cc           one device's alloc / free history -> events at synthesized addresses
//   kineto_reader.cc           Kineto chrome traces
//   memory_timeline_reader.cc  export_memory_timeline files
//   plot_data_reader.cc        PyTorch 2.0 memory_viz plot data
//   profiler_reader.cc         sniffing and dispatch
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "format/model/snapshot.h"
#include "format/profiler/profiler_reader.h"

namespace memforensics::format::profiler_detail {

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

// What a reader dropped or cut, counted for its load warnings.
struct Counts {
  uint64_t cpu_events = 0, other_device_type = 0, bad_device = 0, bad_bytes = 0, zero_bytes = 0,
           bad_ts = 0, bad_ops = 0, bad_totals = 0, truncated_stacks = 0, bad_rows = 0,
           stacks_over_budget = 0, text_bytes = 0;
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
                        const std::string& history = "the profile");

// The final state: one segment at the synthesized addresses' base holding the blocks still live,
// packed from its start, and an inactive block for the rest.
void addFinalState(Snapshot& snap, int64_t device, const BuildResult& r);

// Concatenates the devices' events into snap.events (trace_begin set), freeing each device's.
void finishTraces(Snapshot& snap, std::vector<std::vector<Event>>& per_device);

// "N bytes", or "gzip, N bytes -> M decompressed".
std::string sizeText(const ByteSource& src, size_t input);

// The first `want` bytes of the text (decompressed when gzip), for sniffing.
std::string prefixText(std::span<const uint8_t> bytes, size_t want);

// The load warning every profiler trace and timeline carries.
extern const char* const kNoLayoutNote;

Expected<Snapshot> readKineto(std::span<const uint8_t> bytes, const ProfilerReadOptions& options,
                              bool gzip);
Expected<Snapshot> readTimeline(std::span<const uint8_t> bytes, const ProfilerReadOptions& options,
                                bool gzip);

}  // namespace memforensics::format::profiler_detail
