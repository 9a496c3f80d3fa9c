// generate_text.cc: see generate_text.h. The text is written by hand, not through a JSON library,
// so that names may carry raw control characters and invalid UTF-8 (which a reader must refuse
// cleanly) and numbers may be written as the readers meet them in the wild: fractional, with
// exponents, past 2^64, as strings.
#include "generate_text.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memforensics::fuzz {

namespace {

// Items one generated input holds at most (events, rows, lines): enough for the shapes that cost
// time (an op chain, a run of identical rows), small enough for many runs a second.
constexpr size_t kMaxItems = 1500;
// Repeats of one pattern at most (a run of identical rows, a chain of touching ops).
constexpr size_t kMaxRun = 600;

constexpr std::string_view kNames[] = {
    "aten::mm",
    "aten::empty_strided",
    "ProfilerStep#1",
    "Optimizer.step#SGD.step",
    "train.py(42): step",
    "torch/nn/modules/module.py(1501): _call_impl",
    "",
    "\x1b]0;pwned\x07",
    "\xff\xfe invalid",
    "\xc3",
    "<script>&amp;</script>",
    "a;b;c",
    "\"quote\\",
};
constexpr std::string_view kCats[] = {
    "cpu_op", "user_annotation", "python_function", "cpu_instant_event", "kernel", "gpu_memcpy",
    ""};

class Out {
 public:
  explicit Out(FuzzedDataProvider& p) : p_(p) {}

  uint32_t upTo(uint32_t n) { return p_.ConsumeIntegralInRange<uint32_t>(0, n); }
  // 1 in `in`; false once the bytes run out (the provider then gives 0s), so that an input's tail
  // is written plainly, not as a run of the rare forms.
  bool chance(uint32_t in) { return in <= 1 || upTo(in - 1) == in - 1; }
  bool more() { return p_.remaining_bytes() > 0 && room(); }
  // Whether a repeat may go on: repeats run to their count when the bytes run out (a few bytes
  // make a long chain, as in the hostile files), within kMaxItems.
  bool room() const { return items_ < kMaxItems; }
  void item() { ++items_; }

  std::string& s() { return s_; }
  Out& raw(std::string_view t) {
    s_.append(t);
    return *this;
  }
  Out& num(int64_t v) {
    s_.append(std::to_string(v));
    return *this;
  }
  Out& unum(uint64_t v) {
    s_.append(std::to_string(v));
    return *this;
  }
  // A JSON string; control characters escaped as \u00XX, other bytes as they are (invalid UTF-8
  // stays invalid: the reader refuses it).
  Out& str(std::string_view t) {
    s_.push_back('"');
    for (unsigned char c : t) {
      if (c == '"' || c == '\\') {
        s_.push_back('\\');
        s_.push_back(static_cast<char>(c));
      } else if (c < 0x20) {
        static const char kHex[] = "0123456789abcdef";
        s_.append("\\u00");
        s_.push_back(kHex[c >> 4]);
        s_.push_back(kHex[c & 15]);
      } else {
        s_.push_back(static_cast<char>(c));
      }
    }
    s_.push_back('"');
    return *this;
  }
  // A key and its colon, after a comma unless `first`.
  Out& key(std::string_view k, bool first = false) {
    if (!first) s_.push_back(',');
    str(k);
    s_.push_back(':');
    return *this;
  }
  // A name: mostly a known one, sometimes random bytes (which may be invalid UTF-8).
  std::string name() {
    if (chance(12)) return p_.ConsumeRandomLengthString(16);
    std::string n(kNames[upTo(std::size(kNames) - 1)]);
    // The invalid ones rarely: the reader refuses the whole text.
    if (static_cast<unsigned char>(n.empty() ? 'a' : n[0]) >= 0xc0 && !chance(8))
      return "aten::add";
    return n;
  }
  // A number where a reader expects an integer: usually `v`, sometimes a form readers meet in
  // hostile or unusual files.
  Out& number(int64_t v) {
    if (!chance(16)) return num(v);
    switch (upTo(9)) {
      case 0:
        return raw(std::to_string(v) + ".5");
      case 1:
        return raw("1e400");
      case 2:
        return raw("-0");
      case 3:
        return raw("18446744073709551616");
      case 4:
        return raw("null");
      case 5:
        return str(std::to_string(v));
      case 6:
        return num(std::numeric_limits<int64_t>::min());
      case 7:
        return unum(std::numeric_limits<uint64_t>::max());
      case 8:
        return raw(std::to_string(v) + "e0");
      default:
        return raw("true");
    }
  }
  // Sizes: mostly what the caching allocator hands out, sometimes not.
  int64_t size() {
    switch (upTo(7)) {  // 0 (the bytes ran out) is the plain case
      case 4:
        return 0;
      case 5:
        return upTo(4096) + 1;
      case 6:
        return int64_t{2} << 20;
      case 7:
        return p_.ConsumeIntegralInRange<int64_t>(1, int64_t{1} << 40);
      default:
        return 512 * static_cast<int64_t>(upTo(8192) + 1);
    }
  }
  FuzzedDataProvider& p() { return p_; }

 private:
  FuzzedDataProvider& p_;
  std::string s_;
  size_t items_ = 0;
};

// ---- Kineto traces ------------------------------------------------------------------------------

struct Live {
  uint64_t addr;
  int64_t bytes;
  int64_t device;
};

class Kineto {
 public:
  explicit Kineto(FuzzedDataProvider& p) : o_(p) {}

  std::string build() {
    o_.raw("{");
    bool first = true;
    const bool events_first = o_.chance(4);
    if (events_first) events(first);
    if (o_.p().ConsumeBool()) o_.key("schemaVersion", std::exchange(first, false)).number(1);
    if (o_.p().ConsumeBool()) deviceProperties(first);
    if (o_.chance(3)) {
      o_.key("distributedInfo", std::exchange(first, false))
          .raw("{")
          .key("backend", true)
          .str("nccl")
          .key("rank")
          .number(o_.upTo(8))
          .key("world_size")
          .number(o_.upTo(8))
          .raw("}");
    }
    if (o_.chance(3))
      o_.key("baseTimeNanoseconds", std::exchange(first, false)).number(1700000000000000000);
    if (o_.chance(8)) ignoredNesting(first);
    if (!events_first) events(first);
    o_.raw("}");
    return std::move(o_.s());
  }

 private:
  void deviceProperties(bool& first) {
    o_.key("deviceProperties", std::exchange(first, false)).raw("[");
    const uint32_t n = o_.upTo(3);
    for (uint32_t i = 0; i < n; ++i) {
      if (i) o_.raw(",");
      o_.raw("{").key("id", true).number(i);
      if (!o_.chance(4)) o_.key("name").str(o_.name());  // sometimes without a name
      o_.key("totalGlobalMem").number(o_.p().ConsumeBool() ? int64_t{80} << 30 : o_.size());
      o_.raw("}");
    }
    o_.raw("]");
  }

  // A key the reader ignores, holding arrays nested up to 100 deep (the reader bounds its depth).
  void ignoredNesting(bool& first) {
    const uint32_t depth = o_.upTo(100);
    o_.key("ignored", std::exchange(first, false))
        .raw(std::string(depth, '['))
        .raw(std::string(depth, ']'));
    if (depth == 0) o_.raw("0");
  }

  void sep() {
    if (!first_event_) o_.raw(",");
    first_event_ = false;
    o_.item();
  }

  void op(std::string_view cat, std::string_view name, int64_t ts, int64_t dur) {
    sep();
    o_.raw("{").key("ph", true).str("X").key("cat").str(cat).key("name").str(name);
    o_.key("pid").number(pid_).key("tid").number(tid_).key("ts").number(ts).key("dur").number(dur);
    o_.raw("}");
  }

  // A [memory] instant: an allocation (bytes > 0) or a free (bytes < 0); the 2021 form has no
  // Addr and no totals.
  void memory(int64_t ts, uint64_t addr, int64_t bytes, int64_t device) {
    sep();
    o_.raw("{").key("ph", true).str("i").key("cat").str("cpu_instant_event");
    o_.key("name").str("[memory]").key("pid").number(pid_).key("tid").number(tid_);
    o_.key("ts").number(ts).key("s").str("t").key("args").raw("{");
    allocated_ += bytes;
    reserved_ = std::max(reserved_, allocated_);
    if (!old_form_) {
      o_.key("Total Reserved", true).number(o_.chance(6) ? o_.size() : reserved_);
      o_.key("Total Allocated").number(o_.chance(6) ? o_.size() : allocated_);
      o_.key("Addr").number(static_cast<int64_t>(addr));
      o_.key("Bytes").number(bytes);
    } else {
      o_.key("Bytes", true).number(bytes);
    }
    o_.key("Device Id").number(device);
    o_.key("Device Type").number(o_.chance(10) ? o_.upTo(3) : 1);
    if (!old_form_ && o_.p().ConsumeBool()) o_.key("Ev Idx").number(ev_idx_++);
    o_.raw("}}");
  }

  void alloc(int64_t ts) {
    const int64_t bytes = o_.size();
    const int64_t device = o_.chance(8) ? o_.upTo(3) : 0;
    const uint64_t addr = o_.chance(8) ? o_.p().ConsumeIntegral<uint64_t>() >> 1
                                       : 0x7f0000000000ull + 512 * uint64_t{next_++};
    memory(ts, addr, bytes, device);
    if (live_.size() < kMaxItems) live_.push_back({addr, bytes, device});
  }

  void free(int64_t ts) {
    if (live_.empty() || o_.chance(10)) {  // a block allocated before the profile started
      memory(ts, 0x7e0000000000ull + 512 * o_.upTo(64), -o_.size(), 0);
      return;
    }
    const size_t k = o_.upTo(static_cast<uint32_t>(live_.size() - 1));
    const Live l = live_[k];
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(k));
    memory(ts, l.addr, -l.bytes, l.device);
  }

  void events(bool& first) {
    o_.key("traceEvents", std::exchange(first, false)).raw("[");
    old_form_ = o_.chance(6);
    t_ = o_.p().ConsumeBool() ? 1700000000000000 : o_.upTo(1000);
    while (o_.more()) {
      t_ += o_.upTo(100);
      if (o_.chance(12)) {  // another thread
        pid_ = o_.upTo(2);
        tid_ = o_.upTo(3);
      }
      switch (o_.upTo(10)) {
        case 0:
        case 1:
        case 2:
          alloc(t_);
          break;
        case 3:
        case 4:
          free(t_);
          break;
        case 5: {  // ops each ending exactly when the next begins, an allocation in some
          const size_t n = o_.chance(4) ? o_.upTo(kMaxRun) + 1 : o_.upTo(8) + 1;
          const int64_t dur = o_.upTo(20);
          const bool named_apart = o_.p().ConsumeBool();
          const std::string name = o_.name();
          for (size_t i = 0; i < n && o_.room(); ++i) {
            op("cpu_op", named_apart ? name + std::to_string(i) : name, t_, dur);
            if (i % 3 == 0) alloc(t_ + dur / 2);
            t_ += dur;
          }
          break;
        }
        case 6: {  // an op stack, deep at times, with an allocation at its innermost op
          const size_t depth = o_.chance(4) ? o_.upTo(300) + 1 : o_.upTo(6) + 1;
          const int64_t start = t_;
          for (size_t i = 0; i < depth && o_.room(); ++i) {
            const std::string_view cat = kCats[o_.upTo(3)];
            op(cat, o_.name(), start + static_cast<int64_t>(i),
               2 * static_cast<int64_t>(depth - i) + 10);
          }
          alloc(start + static_cast<int64_t>(depth));
          if (o_.p().ConsumeBool()) free(start + static_cast<int64_t>(depth) + 1);
          t_ = start + 2 * static_cast<int64_t>(depth) + 12;
          break;
        }
        case 7:  // an iteration
          op("user_annotation", "ProfilerStep#" + std::to_string(step_++), t_, o_.upTo(5000));
          break;
        case 8: {  // one allocation and its free, repeated: identical rows
          const size_t n = o_.upTo(kMaxRun) + 1;
          const int64_t bytes = o_.size();
          for (size_t i = 0; i < n && o_.room(); ++i) {
            memory(t_, 0x7f8000000000ull, bytes, 0);
            memory(t_, 0x7f8000000000ull, -bytes, 0);
            t_ += o_.p().ConsumeBool() ? 0 : 1;
          }
          break;
        }
        case 9:  // a hostile event: fields of the wrong type, missing, out of range
          hostile();
          break;
        default:
          op(kCats[o_.upTo(std::size(kCats) - 1)], o_.name(),
             t_ - (o_.chance(8) ? o_.upTo(100000) : 0), o_.chance(8) ? -1 : o_.upTo(50));
          break;
      }
    }
    o_.raw("]");
  }

  void hostile() {
    sep();
    o_.raw("{");
    bool first = true;
    const uint32_t fields = o_.upTo(6);
    static constexpr std::string_view kKeys[] = {"ph", "cat", "name", "ts", "dur", "pid", "tid"};
    for (uint32_t i = 0; i < fields; ++i) {
      o_.key(kKeys[o_.upTo(std::size(kKeys) - 1)], std::exchange(first, false));
      switch (o_.upTo(4)) {
        case 0:
          o_.str(o_.name());
          break;
        case 1:
          o_.number(o_.p().ConsumeIntegral<int64_t>());
          break;
        case 2:
          o_.raw("[1,2]");
          break;
        case 3:
          o_.raw("{}");
          break;
        default:
          o_.raw("-1.5e3");
          break;
      }
    }
    if (o_.p().ConsumeBool()) {
      o_.key("args", std::exchange(first, false)).raw("{");
      o_.key("Bytes", true).number(o_.p().ConsumeIntegral<int64_t>());
      o_.key("Device Id").number(o_.p().ConsumeIntegral<int64_t>());
      o_.key("Device Type").number(1).raw("}");
    }
    o_.raw("}");
  }

  Out o_;
  std::vector<Live> live_;
  bool first_event_ = true, old_form_ = false;
  int64_t t_ = 0, pid_ = 0, tid_ = 0, step_ = 1, ev_idx_ = 0;
  int64_t allocated_ = 0, reserved_ = 0;
  uint32_t next_ = 0;
};

// ---- memory timelines ---------------------------------------------------------------------------

std::string rawTimeline(Out& o) {
  o.raw("[");
  bool first = true;
  int64_t t = o.p().ConsumeBool() ? -1 : 0;
  struct Row {
    int64_t bytes, category;
  };
  std::vector<Row> live;
  auto row = [&](int64_t time, int64_t action, int64_t bytes, int64_t category) {
    if (!std::exchange(first, false)) o.raw(",");
    o.item();
    o.raw("[").number(time).raw(",").number(action).raw(",").number(bytes).raw(",");
    o.number(category).raw("]");
  };
  while (o.more()) {
    t += o.upTo(1000);
    switch (o.upTo(6)) {
      case 0:
      case 1: {  // CREATE (or PREEXISTING before the profile)
        const int64_t bytes = o.size(), cat = o.chance(10) ? o.upTo(12) : o.upTo(7);
        row(o.chance(10) ? -1 : t, o.chance(6) ? 1 : 2, bytes, cat);
        live.push_back({bytes, cat});
        break;
      }
      case 2:  // DESTROY a live one
        if (!live.empty()) {
          const size_t k = o.upTo(static_cast<uint32_t>(live.size() - 1));
          row(t, 4, live[k].bytes, live[k].category);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        } else {
          row(t, 4, o.size(), o.upTo(7));  // one that was never created
        }
        break;
      case 3:  // INCREMENT_VERSION: the bytes move between categories
        if (!live.empty()) {
          const Row r = live.back();
          const int64_t to = o.upTo(7);
          row(t, 3, -r.bytes, r.category);
          row(t, 3, r.bytes, to);
          live.back().category = to;
        }
        break;
      case 4: {  // identical rows
        const size_t n = o.upTo(kMaxRun) + 1;
        const int64_t bytes = o.size();
        for (size_t i = 0; i < n && o.room(); ++i) {
          row(t, 2, bytes, 4);
          row(t, 4, bytes, 4);
        }
        break;
      }
      case 5: {  // a row of another shape
        if (!std::exchange(first, false)) o.raw(",");
        o.item();
        const uint32_t n = o.upTo(7);
        o.raw("[");
        for (uint32_t i = 0; i < n; ++i) {
          if (i) o.raw(",");
          o.number(o.p().ConsumeIntegral<int64_t>());
        }
        o.raw("]");
        break;
      }
      default:
        row(t, o.upTo(6), o.size(), o.upTo(8));
        break;
    }
  }
  o.raw("]");
  return std::move(o.s());
}

// [times, sizes]: per time the bytes of each category (levels that rise and fall).
std::string levelsTimeline(Out& o) {
  const size_t n = o.upTo(o.chance(4) ? kMaxRun : 40);
  const uint32_t cats = o.chance(6) ? o.upTo(12) : 8;
  std::vector<int64_t> level(cats, 0);
  o.raw("[[");
  int64_t t = o.upTo(1000);
  for (size_t i = 0; i < n; ++i) {
    if (i) o.raw(",");
    o.number(t);
    t += o.chance(10) ? -static_cast<int64_t>(o.upTo(10)) : o.upTo(100);
  }
  o.raw("],[");
  for (size_t i = 0; i < n; ++i) {  // as many as the times (n is bounded)
    if (i) o.raw(",");
    o.item();
    o.raw("[");
    for (uint32_t c = 0; c < cats; ++c) {
      if (c) o.raw(",");
      if (o.p().ConsumeBool()) level[c] = std::max<int64_t>(0, level[c] + o.size() - o.size());
      o.number(level[c]);
    }
    o.raw("]");
  }
  o.raw("]]");
  return std::move(o.s());
}

// ---- ranks --json shards ------------------------------------------------------------------------

void rankRow(Out& o) {
  o.raw("{").key("path", true).str(o.name());
  if (o.chance(6)) {
    o.key("device").raw("null").key("error").str(o.chance(4) ? "" : o.name());
  } else {
    int64_t device = o.upTo(7);
    if (o.chance(10)) {
      static constexpr int64_t kOdd[] = {-1,
                                         -2,
                                         int64_t{1} << 20,
                                         (int64_t{1} << 20) - 1,
                                         std::numeric_limits<int64_t>::min(),
                                         std::numeric_limits<int64_t>::max()};
      device = kOdd[o.upTo(std::size(kOdd) - 1)];
    }
    o.key("device").number(device).key("error").raw("null");
  }
  static constexpr std::string_view kFigures[] = {"peak_reserved_bytes", "peak_requested_bytes",
                                                  "peak_allocated_bytes", "ooms", "high_findings"};
  for (std::string_view f : kFigures) {
    if (o.chance(20)) continue;  // missing
    o.key(f).number(f.find("bytes") != std::string_view::npos ? o.size() : o.upTo(40));
  }
  if (o.p().ConsumeBool()) {
    o.key("largest_holder").raw("{").key("line", true).str(o.name()).key("bytes");
    o.number(o.size()).raw("}");
  }
  o.key("outlier").raw(o.p().ConsumeBool() ? "true" : "false");
  if (o.p().ConsumeBool()) {
    o.key("lines").raw("[");
    const uint32_t n = o.upTo(o.chance(8) ? 70 : 6);
    for (uint32_t i = 0; i < n; ++i) {
      if (i) o.raw(",");
      o.raw("{").key("line", true).str(o.name()).key("bytes").number(o.size()).raw("}");
    }
    o.raw("]");
  }
  if (o.chance(10)) {  // a key the reader ignores, nested past what a document needs at times
    const uint32_t depth = o.upTo(40);
    o.key("ignored").raw(std::string(depth, '[')).raw(std::string(depth, ']'));
    if (depth == 0) o.raw("0");
  }
  o.raw("}");
}

std::string rankShard(Out& o) {
  const uint32_t docs = o.chance(4) ? o.upTo(3) + 1 : 1;  // several: JSON Lines
  for (uint32_t d = 0; d < docs; ++d) {
    if (d) o.raw(o.chance(4) ? "\n\n" : "\n");
    o.raw("{").key("command", true).str(o.chance(16) ? "diff" : "ranks");
    o.key("summary").raw("{").key("rows", true).number(o.upTo(9)).raw("}");
    if (o.chance(16)) {
      o.raw("}");
      continue;  // no ranks array
    }
    o.key("ranks").raw("[");
    const uint32_t rows = o.upTo(8);
    for (uint32_t i = 0; i < rows && o.room(); ++i) {
      if (i) o.raw(",");
      o.item();
      rankRow(o);
    }
    o.raw("]}");
  }
  if (o.chance(16)) o.raw(o.p().ConsumeRandomLengthString(8));  // trailing bytes
  return std::move(o.s());
}

}  // namespace

std::string generateKinetoTrace(FuzzedDataProvider& p) {
  return Kineto(p).build();
}

std::string generateMemoryTimeline(FuzzedDataProvider& p) {
  Out o(p);
  return p.ConsumeBool() ? rawTimeline(o) : levelsTimeline(o);
}

std::vector<std::string> generateRankShards(FuzzedDataProvider& p) {
  std::vector<std::string> shards;
  const uint32_t n = p.ConsumeIntegralInRange<uint32_t>(1, 4);
  for (uint32_t i = 0; i < n; ++i) {
    Out o(p);
    shards.push_back(rankShard(o));
  }
  return shards;
}

}  // namespace memforensics::fuzz
