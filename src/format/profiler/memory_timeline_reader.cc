// memory_timeline_reader.cc: export_memory_timeline files (the `.raw.json.gz` rows and the
// `.json(.gz)` form) into the Snapshot model, PyTorch's categories kept (docs/profiler-traces.md).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/profiler/profiler_internal.h"
#include "format/profiler/sax_parse.h"

namespace memforensics::format::profiler_detail {

namespace {

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
    if (values.size() >= text / kTimelineTextBytesPerValue + slack_) {
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

}  // namespace

Expected<Snapshot> readTimeline(std::span<const uint8_t> bytes, const ProfilerReadOptions& options,
                                bool gzip) {
  Snapshot snap;
  snap.source = SourceFormat::MemoryTimeline;
  snap.input_bytes = bytes.size();
  snap.has_segment_info = false;
  snap.reserved_recorded = false;  // synthesized from the allocated high-water mark
  ByteSource src(bytes, gzip, decodedBudget(options, bytes.size()), options.progress);
  TimelineSax sax(kProfilerRecordSlack);
  sax.setDecoded(&src);
  auto parsed = saxParse(src, sax, "memory timeline");
  if (!parsed) return parsed.error();
  if (!*parsed)
    return Error{sax.error().empty() ? "memory timeline: invalid JSON" : sax.error(), -1};

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

}  // namespace memforensics::format::profiler_detail
