// kineto_reader.cc: Kineto chrome traces (`[memory]` events, ops as stacks, ProfilerStep
// iterations, device properties and rank) into the Snapshot model (docs/profiler-traces.md).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/flat_map.h"
#include "format/profiler/profiler_internal.h"
#include "format/profiler/sax_parse.h"

namespace memforensics::format::profiler_detail {

namespace {

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
  const uint64_t frame_budget = profilerStackFrameBudget(counts.text_bytes);
  uint64_t frames_held = 0;  // by the distinct stacks interned here
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
      // From the innermost open op outwards until the frames are full. An op that ended before
      // this event (it overlapped the next one oddly, or ended exactly when the next began, so
      // nothing popped it) can hold no later event of the thread either: it is dropped from the
      // list here, so each op is walked past at most once and chains of touching ops stay linear.
      frames.clear();
      size_t k = open.size();
      size_t kept = open.size();  // open[kept, size) holds the ops walked and kept, in order
      while (k > 0 && frames.size() < kMaxProfilerStackFrames) {
        const uint32_t op = open[--k];
        if (ops[op].end_ns < m.ts_ns) continue;
        frames.push_back(ops[op].frame);
        open[--kept] = op;
      }
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(k),
                 open.begin() + static_cast<std::ptrdiff_t>(kept));
      if (frames.size() == kMaxProfilerStackFrames && k > 0) ++counts.truncated_stacks;
      // Past the frame budget every stack keeps its innermost frames only (whether or not it was
      // seen whole before: the table has no lookup without interning), and is counted.
      const bool cut = frames_held + frames.size() > frame_budget &&
                       frames.size() > kProfilerStackFramesPastBudget;
      if (cut) frames.resize(kProfilerStackFramesPastBudget);
      const size_t stacks_before = snap.stacks.stackCount();
      cached = snap.stacks.internStack(frames);
      if (snap.stacks.stackCount() != stacks_before) {
        frames_held += frames.size();
        counts.stacks_over_budget += cut;
      }
      dirty = false;
    }
    m.stack = cached;
  }
}

}  // namespace

Expected<Snapshot> readKineto(std::span<const uint8_t> bytes, const ProfilerReadOptions& options,
                              bool gzip) {
  Snapshot snap;
  snap.source = SourceFormat::ProfilerTrace;
  snap.input_bytes = bytes.size();
  snap.has_segment_info = false;
  ByteSource src(bytes, gzip, decodedBudget(options, bytes.size()), options.progress);
  KinetoSax sax(snap, kProfilerRecordSlack);
  sax.setDecoded(&src);
  auto parsed = saxParse(src, sax, "torch.profiler trace");
  if (!parsed) return parsed.error();
  const bool ok = *parsed;
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
  c.text_bytes = src.decoded();
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
  if (c.stacks_over_budget > 0)
    w.push_back(std::to_string(c.stacks_over_budget) + " op stacks cut to their " +
                std::to_string(kProfilerStackFramesPastBudget) +
                " innermost ops: the trace's distinct stacks passed their budget of " +
                std::to_string(profilerStackFrameBudget(c.text_bytes)) + " frames");
  if (c.truncated_stacks > 0)
    w.push_back(std::to_string(c.truncated_stacks) + " stacks nested deeper than " +
                std::to_string(kMaxProfilerStackFrames) + " ops: the innermost kept");
  for (auto& n : notes) w.push_back(std::move(n));
  if (src.trailing_ > 0)
    w.push_back(std::to_string(src.trailing_) + " bytes after the end of the gzip stream ignored");
  w.push_back(kNoLayoutNote);
  return snap;
}

}  // namespace memforensics::format::profiler_detail
