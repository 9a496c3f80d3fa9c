// snapshot_trace.cc: the trace -> Snapshot half of snapshot_trace.h (the writer and the
// FormatTraits bits are in snapshot_trace_write.cc).
#include "format/load/snapshot_trace.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <thread>

#include "common/memory.h"
#include "common/parallel.h"
#include "format/trace/trace_events.h"
#include "format/trace/trace_reader.h"
#include "format/trace/trace_state.h"

namespace memforensics::format {

// OtherSetting's kinds travel as TraceOtherSetting's (the Settings chunk's tag 7).
static_assert(static_cast<uint8_t>(OtherSetting::Kind::Str) == trace::TraceOtherSetting::kStr &&
              static_cast<uint8_t>(OtherSetting::Kind::Float) == trace::TraceOtherSetting::kFloat &&
              static_cast<uint8_t>(OtherSetting::Kind::UInt) == trace::TraceOtherSetting::kUInt &&
              static_cast<uint8_t>(OtherSetting::Kind::Int) == trace::TraceOtherSetting::kInt &&
              static_cast<uint8_t>(OtherSetting::Kind::Bool) == trace::TraceOtherSetting::kBool &&
              static_cast<uint8_t>(OtherSetting::Kind::None) == trace::TraceOtherSetting::kNone);
static_assert(kMaxOtherSettings == trace::kMaxTraceOtherSettings &&
              kMaxOtherSettingBytes == trace::kMaxTraceOtherSettingBytes);

namespace {

constexpr uint32_t kUnmapped = std::numeric_limits<uint32_t>::max();

// Lines of a Meta chunk's `\n`-joined list (ignored keys, the source's warnings) a reader keeps:
// the field is bounded only by the chunk's size (64 MiB of empty lines is 64 M of them).
constexpr size_t kMaxMetaLines = 256;

// Calls fn on the first kMaxMetaLines lines of `all` (empty lines too when keep_empty: a key may be
// ""), and returns how many more it held.
template <class F>
size_t forEachMetaLine(std::string_view all, bool keep_empty, const F& fn) {
  if (all.empty()) return 0;
  size_t kept = 0, more = 0;
  size_t from = 0;
  while (from <= all.size()) {
    size_t nl = all.find('\n', from);
    if (nl == std::string_view::npos) nl = all.size();
    if (nl > from || keep_empty) {
      if (kept < kMaxMetaLines) {
        fn(all.substr(from, nl - from));
        ++kept;
      } else {
        ++more;
      }
    }
    from = nl + 1;
  }
  return more;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// trace -> Snapshot

namespace {

// A decoded record as the model's event, with its stack and notes already in the model's ids (the
// serial reader, the threaded one and the deferred decode each map them their own way).
inline Event eventOf(const trace::TraceEvent& t, StackId stack, uint32_t notes) {
  Event e;
  e.addr = t.addr;
  e.size = t.size;
  e.stream = t.stream;
  e.time_us = t.time_us;
  e.stack = stack;
  e.action = static_cast<Action>(t.action);
  e.notes = notes;
  e.pool = t.pool;
  return e;
}

// A record's notes in the file's string ids (the decoder leaves action_name 0 unless the action
// is one it does not know, which alone keeps its name).
inline EventNotes fileNotesOf(const trace::TraceEvent& t) {
  return EventNotes{t.compile_context, t.user_metadata, t.action_name};
}

// Every record of an Events payload: no table size to check them against here.
constexpr uint64_t kAllIds = ~uint64_t{0};

// Rebuilds a final segment state from the events alone, for a trace whose writer never wrote one
// (killed capture). Block sizes are requests rounded up to 512 bytes: an estimate, and said so.
size_t synthesizeFinalState(Snapshot& snap) {
  size_t orphans = 0;
  for (size_t d = 0; d < snap.traceCount(); ++d) {
    trace::DeviceTraceState st;
    const DeviceEvents events(snap, d);  // a deferred snapshot: one device at a time
    for (const Event& e : events.span()) {
      trace::TraceEvent t;
      t.action = static_cast<uint8_t>(e.action);
      t.addr = e.addr;
      t.size = e.size;
      t.stream = e.stream;
      t.stack = e.stack;
      st.apply(t);
    }
    // The one home of the rule (trace_state.h): the capture's recorder rebuilds the same state.
    std::vector<trace::TraceBlock> blocks;
    trace::SynthesizedState syn = trace::synthesizeFinalState(st, static_cast<uint32_t>(d), blocks);
    orphans += syn.orphans;
    for (const trace::TraceSegment& t : syn.segments) {
      Segment g;
      g.device = static_cast<int64_t>(d);
      g.address = t.address;
      g.total_size = t.total_size;
      g.allocated_size = t.allocated_size;
      g.active_size = t.active_size;
      g.requested_size = t.requested_size;
      g.is_large = t.is_large;
      g.first_block = static_cast<uint32_t>(snap.blocks.size());
      for (uint32_t k = t.first_block; k < t.first_block + t.block_count; ++k) {
        const trace::TraceBlock& b = blocks[k];
        snap.blocks.push_back(Block{b.address, b.size, b.requested_size, b.stack,
                                    static_cast<BlockState>(b.state), b.has_requested_size});
      }
      g.block_count = static_cast<uint32_t>(snap.blocks.size() - g.first_block);
      snap.segments.push_back(g);
    }
  }
  return orphans;
}

}  // namespace

namespace {

// One bit per id, for the ids an Events chunk refers to. Backed by calloc, so that a large table
// costs address space, not memory, where few of its ids are used.
class IdBits {
 public:
  explicit IdBits(uint64_t n) : n_(n), w_(static_cast<uint64_t*>(std::calloc(n / 64 + 1, 8))) {
    if (w_ == nullptr) throw std::bad_alloc();
  }
  ~IdBits() { std::free(w_); }
  IdBits(const IdBits&) = delete;
  IdBits& operator=(const IdBits&) = delete;
  uint64_t size() const { return n_; }
  // Sets the bit; true when it was clear.
  bool add(uint64_t id) {
    uint64_t& w = w_[id >> 6];
    const uint64_t m = uint64_t{1} << (id & 63);
    if (w & m) return false;
    w |= m;
    return true;
  }

 private:
  uint64_t n_;
  uint64_t* w_;
};

// What the first decoding of an Events chunk found besides PreparedChunk's counts: the ids its
// events refer to in the order a serial reader meets them for the first time in the chunk
// (kRefStack << 32 | id, kRefString << 32 | id), and whether its devices never decrease.
struct ChunkRefs {
  std::vector<uint64_t> refs;
  EventNotesTable notes;  // the chunk's notes in the file's string ids (Event::notes until step 6)
  uint32_t first_device = 0, last_device = 0;
  bool ordered = true;
  // Deferred events (LoadOptions::defer_events): where each run of PreparedChunk::device_events
  // starts, and the chunk's OOM events (run, index in the run, time).
  std::vector<trace::detail::RecordState> run_from;
  struct Oom {
    size_t run;
    uint64_t index;
    int64_t time_us;
  };
  std::vector<Oom> ooms;
};
constexpr uint64_t kRefStack = 0, kRefString = 1;

// The events of a native trace read for `analyze` (LoadOptions::defer_events), left in the
// chunks' decoded payloads: each device's runs of records are decoded again, from the state
// before each run's first record, when a reader asks for that device (DeviceEvents). The model's
// ids are the loader's (the same tables it maps a decoded array with).
class TraceDeferredEvents final : public DeferredEvents {
 public:
  struct Run {
    std::span<const uint8_t> payload;
    trace::detail::EventRun run;
    uint32_t chunk;  // index into notes / notes_of
  };
  std::unique_ptr<uint8_t[]> payloads;       // the zstd chunks' payloads, as the loader made them
  std::vector<std::vector<uint8_t>> copies;  // Events payloads that were in the file's mapping
  std::vector<size_t> run_begin;             // device d: runs[run_begin[d], run_begin[d + 1])
  std::vector<Run> runs;
  std::vector<StackId> stack_of;                // the file's stack id -> the model's
  std::vector<EventNotesTable> notes;           // per accepted chunk, in the file's string ids
  std::vector<std::vector<uint32_t>> notes_of;  // per accepted chunk: its row -> the model's
  std::vector<OomRef> oom_refs;                 // Snapshot::ooms, found while the records were read

  void decode(size_t d, std::span<Event> out) const override {
    if (d + 1 >= run_begin.size()) return;
    struct Sink {
      const TraceDeferredEvents& self;
      const EventNotesTable& local;
      const std::vector<uint32_t>& notes_of;
      Event* out;
      EventNotes last{};
      uint32_t last_id = 0;
      void begin(uint64_t) {}
      void event(uint64_t i, const trace::TraceEvent& t) {
        const EventNotes n = fileNotesOf(t);
        if (!(n == last)) {
          const uint32_t row = local.find(n);
          last = n;
          last_id = row < notes_of.size() ? notes_of[row] : 0;
        }
        out[i] =
            eventOf(t, t.stack < self.stack_of.size() ? self.stack_of[t.stack] : kNoStack, last_id);
      }
    };
    size_t at = 0;
    for (size_t k = run_begin[d]; k < run_begin[d + 1]; ++k) {
      const Run& r = runs[k];
      if (r.run.count > out.size() - at) break;  // never: the runs sum to the trace's size
      Sink sink{*this, notes[r.chunk], notes_of[r.chunk], out.data() + at};
      sink.last_id = notes_of[r.chunk].empty() ? 0 : notes_of[r.chunk][0];
      (void)trace::detail::decodeEventRecords(r.payload, kAllIds, kAllIds, kAllIds, sink, nullptr,
                                              &r.run);
      at += r.run.count;
    }
  }
};

// The largest id count a table can reach: what the headers of its chunks declare, each capped by
// the chunk's bytes (an entry takes at least one byte), so a forged header costs nothing.
uint64_t tableBound(const std::vector<trace::PreparedChunk>& prepared,
                    const std::vector<trace::ChunkRef>& chunks, trace::ChunkType type,
                    uint64_t fixed) {
  uint64_t bound = fixed;
  for (size_t i = 0; i < prepared.size(); ++i) {
    if (chunks[i].type != static_cast<uint8_t>(type) || !prepared[i].verified) continue;
    trace::detail::Cursor c(prepared[i].payload);
    c.var();  // first id
    uint64_t count = c.var();
    bound += std::min<uint64_t>(count, prepared[i].payload.size());
  }
  return bound;
}

}  // namespace

static_assert(static_cast<uint8_t>(Action::Unknown) == trace::kActionUnknown,
              "the native trace's unknown action is the model's");

unsigned traceLoadThreads(int threads, size_t chunks) {
  unsigned n = threads > 0 ? static_cast<unsigned>(threads) : std::thread::hardware_concurrency();
  n = std::min<unsigned>(std::max(n, 1u), kMaxTraceLoadThreads);
  return static_cast<unsigned>(std::min<size_t>(n, std::max<size_t>(chunks, 1)));
}

namespace {

// A chunk's notes rows (ChunkRefs::notes, in the file's string ids) as the model's rows, interned
// in file order as the serial reader interns them (the file's string 0 is always "", the model's
// kEmptyStr).
std::vector<uint32_t> internChunkNotes(Snapshot& snap, const EventNotesTable& local,
                                       const std::vector<StrId>& str_of) {
  std::vector<uint32_t> rows(local.size());
  for (uint32_t j = 0; j < local.size(); ++j) {
    const EventNotes& n = local[j];
    rows[j] = snap.event_notes.intern(
        EventNotes{str_of[n.compile_context], str_of[n.user_metadata], str_of[n.action_name]});
  }
  return rows;
}

// The deferred form of readTrace's steps 6 and 7: each accepted Events chunk's runs of one device
// become that device's runs (in file order, so interleaved devices need no regrouping), its notes
// table and rows stay for decoding, and trace_begin and the OOM index come from the counts.
// `payloads` holds the zstd chunks' payloads; an uncompressed chunk's payload is in the file's
// mapping, which does not outlive the load, and is copied.
std::unique_ptr<TraceDeferredEvents> deferTraceEvents(
    Snapshot& snap, const std::vector<trace::ChunkRef>& chunks,
    const std::vector<trace::PreparedChunk>& prepared, std::vector<ChunkRefs>& refs,
    const std::vector<size_t>& accepted, std::unique_ptr<uint8_t[]> payloads,
    std::vector<StackId> stack_of, const std::vector<StrId>& str_of, uint32_t max_device,
    uint64_t total, size_t counted_traces) {
  auto out = std::make_unique<TraceDeferredEvents>();
  out->payloads = std::move(payloads);
  out->stack_of = std::move(stack_of);
  const size_t traces = std::max<size_t>(total > 0 ? size_t{max_device} + 1 : 0, counted_traces);
  std::vector<uint64_t> count(traces, 0);
  std::vector<size_t> runs_of(traces + 1, 0);
  for (size_t i : accepted) {
    for (const auto& [d, cnt] : prepared[i].device_events) {
      count[d] += cnt;
      ++runs_of[d + 1];
    }
  }
  snap.trace_begin.clear();
  if (traces > 0) {
    snap.trace_begin.assign(1, 0);
    for (size_t d = 0; d < traces; ++d)
      snap.trace_begin.push_back(snap.trace_begin.back() + count[d]);
  }
  for (size_t d = 0; d < traces; ++d) runs_of[d + 1] += runs_of[d];
  out->run_begin = runs_of;
  out->runs.resize(runs_of.back());
  std::vector<uint64_t> seen(traces, 0);  // events of each device placed so far
  out->notes.reserve(accepted.size());
  out->notes_of.reserve(accepted.size());
  for (size_t k = 0; k < accepted.size(); ++k) {
    const size_t i = accepted[k];
    const trace::PreparedChunk& p = prepared[i];
    ChunkRefs& cr = refs[i];
    std::span<const uint8_t> payload = p.payload;
    if (chunks[i].codec != static_cast<uint8_t>(trace::Codec::Zstd) && !p.device_events.empty()) {
      out->copies.emplace_back(payload.begin(), payload.end());
      payload = out->copies.back();
    }
    out->notes_of.push_back(internChunkNotes(snap, cr.notes, str_of));
    out->notes.push_back(std::move(cr.notes));
    std::vector<uint64_t> run_base(p.device_events.size());
    for (size_t j = 0; j < p.device_events.size(); ++j) {
      const auto& [d, cnt] = p.device_events[j];
      run_base[j] = seen[d];
      out->runs[runs_of[d]++] = {payload, {cr.run_from[j], cnt}, static_cast<uint32_t>(k)};
      seen[d] += cnt;
    }
    for (const ChunkRefs::Oom& m : cr.ooms) {
      const uint32_t d = p.device_events[m.run].first;
      out->oom_refs.push_back(
          {static_cast<int64_t>(d), static_cast<int64_t>(run_base[m.run] + m.index), m.time_us});
    }
  }
  // By device, then event, as indexSnapshot lists them (each device's in order already).
  std::stable_sort(out->oom_refs.begin(), out->oom_refs.end(),
                   [](const OomRef& a, const OomRef& b) { return a.device < b.device; });
  return out;
}

// The reader of readSnapshotTrace. `threads` 0: the serial reader (each chunk checked, decoded
// and converted in file order). Otherwise the chunks are checked, decompressed and decoded on
// that many threads straight into the events array, sized once; the result is the same Snapshot,
// id for id. That path takes files whose chunks all pass their checks, read completely or cut
// short, their events device by device (every conversion, a one-device capture) or interleaved (a
// capture of several devices: grouped per device afterwards); for anything else (a damaged chunk,
// the stack budget) it returns nullopt and the caller reads the file with the serial reader, whose
// errors, warnings and salvage are the reference.
std::optional<Expected<Snapshot>> readTrace(std::span<const uint8_t> bytes,
                                            const LoadOptions& options, unsigned threads) {
  auto opened = trace::TraceReader::open(bytes);
  if (!opened) return opened.error();
  trace::TraceReader& r = **opened;
  Snapshot snap;
  snap.source = SourceFormat::NativeTrace;
  snap.input_bytes = bytes.size();

  std::vector<uint32_t> str_map;
  auto str = [&](uint32_t id) -> StrId {
    if (id >= str_map.size()) str_map.resize(r.stringCount(), kUnmapped);
    if (str_map[id] == kUnmapped) str_map[id] = snap.strings.intern(r.string(id));
    return str_map[id];
  };
  std::vector<uint32_t> frame_map;
  std::vector<uint32_t> stack_map;
  std::vector<FrameId> frames_tmp;
  // A stack trie node becomes a frame list only when something refers to it, once; the frames of
  // all of them are bounded by the stack frame budget (trace_format.h), checked before expanding.
  std::vector<uint32_t> depth{0, 0};  // of each trie node, computed as the table grows
  const uint64_t frame_budget = trace::stackFrameBudget(bytes.size());
  uint64_t expanded = 0;
  std::string stack_error;
  auto stack = [&](uint32_t id) -> StackId {
    if (id == trace::kTraceNoStack) return kNoStack;
    if (id == trace::kTraceRootStack) return snap.stacks.internStack({});
    if (id >= stack_map.size()) stack_map.resize(r.stacks().size(), kUnmapped);
    if (stack_map[id] != kUnmapped) return stack_map[id];
    for (size_t n = depth.size(); n < r.stacks().size(); ++n)
      depth.push_back(depth[r.stacks()[n].parent] + 1);
    if (depth[id] > frame_budget - expanded) {
      if (stack_error.empty()) {
        stack_error = "native trace: its stacks expand to more than " +
                      std::to_string(frame_budget) + " frames, the budget for a file of " +
                      std::to_string(bytes.size()) + " bytes (stack " + std::to_string(id) +
                      " is " + std::to_string(depth[id]) + " frames deep; a hostile stack trie?)";
      }
      return kNoStack;
    }
    expanded += depth[id];
    frames_tmp.clear();
    if (frame_map.size() < r.frames().size()) frame_map.resize(r.frames().size(), kUnmapped);
    for (uint32_t n = id; n != trace::kTraceRootStack; n = r.stacks()[n].parent) {
      uint32_t f = r.stacks()[n].frame;
      if (frame_map[f] == kUnmapped) {
        const trace::FrameRec& fr = r.frames()[f];
        frame_map[f] = snap.stacks.internFrame(Frame{str(fr.filename), str(fr.name), fr.line});
      }
      frames_tmp.push_back(frame_map[f]);
    }
    return stack_map[id] = snap.stacks.internStack(frames_tmp);
  };

  // Events arrive in file order. Files written device by device (every conversion, and a capture
  // of one device) go straight into the model's flat array; a file that interleaves devices
  // switches to one array per device, concatenated at the end.
  std::vector<std::vector<Event>> per_device;
  std::vector<size_t> begin_of{0};  // fast path: trace_begin so far
  int64_t cur_device = 0;
  bool interleaved = false;
  // No reservation from the trailer's event count: it is not checked until the end, and a forged
  // count must not allocate. The array grows as events are actually decoded.
  auto toEvent = [&](const trace::TraceEvent& t) {
    // The stack first: its frames' strings are interned before the notes' (the order the model's
    // string ids follow).
    const StackId st = stack(t.stack);
    return eventOf(
        t, st,
        snap.event_notes.intern(EventNotes{str(t.compile_context), str(t.user_metadata),
                                           str(trace::keptActionName(t.action, t.action_name))}));
  };
  uint64_t next_progress = 0;
  // Events left encoded (LoadOptions::defer_events): the parallel path only.
  const bool defer = options.defer_events && threads > 0;
  std::unique_ptr<TraceDeferredEvents> deferred;
  // Parallel path: prepared chunks (outliving the reader's walk) and the events decoded into place.
  std::vector<trace::ChunkRef> chunks;
  std::vector<trace::PreparedChunk> prepared;
  std::vector<ChunkRefs> refs;
  std::vector<size_t> slice_at;         // where each prepared Events chunk's events go in the array
  std::unique_ptr<uint8_t[]> payloads;  // the prepared zstd chunks' payloads
  if (threads > 0) {
    // 1. Chunk headers only (the serial walk's checks of sizes), to the trailer.
    {
      auto walker = trace::TraceReader::open(bytes);
      if (!walker) return std::nullopt;
      (*walker)->setHeadersOnly(true);
      while ((*walker)->next()) {
        chunks.push_back((*walker)->chunk());
        if (chunks.back().type == static_cast<uint8_t>(trace::ChunkType::Trailer)) break;
      }
    }
    // Only the chunks before the first that would pass the decoded-bytes budget (counted in file
    // order as next() counts it) or declare no valid size are prepared: nothing past the budget
    // is decompressed. next() refuses that chunk itself.
    const uint64_t budget = trace::decodedBudget(bytes.size());
    uint64_t decoded = 0;
    size_t n = 0;
    for (; n < chunks.size(); ++n) {
      const trace::ChunkRef& c = chunks[n];
      if (c.codec == static_cast<uint8_t>(trace::Codec::None)) continue;
      if (c.codec != static_cast<uint8_t>(trace::Codec::Zstd)) break;
      uint64_t raw = trace::ChunkPreparer::declaredSize(
          bytes.subspan(c.offset + trace::kChunkHeaderSize, c.stored_size));
      if (raw == 0 || raw > budget - std::min(budget, decoded)) break;
      decoded += raw;
    }
    chunks.resize(n);
    prepared.resize(n);
    threads = traceLoadThreads(static_cast<int>(threads), n);
    // 2. Checksums and decompression, every chunk on its own, the payloads side by side in one
    // buffer of the sizes their frames declare (the `decoded` bytes within the budget, counted
    // above): fresh memory in huge pages where the kernel gives them, not one array per chunk.
    std::vector<uint64_t> payload_at(n, 0);
    uint64_t payload_bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      const trace::ChunkRef& c = chunks[i];
      if (c.codec != static_cast<uint8_t>(trace::Codec::Zstd)) continue;
      payload_at[i] = payload_bytes;
      payload_bytes += trace::ChunkPreparer::declaredSize(
          bytes.subspan(c.offset + trace::kChunkHeaderSize, c.stored_size));
    }
    // A large buffer starts at a 2 MiB boundary inside its allocation and ends before the
    // allocation's last one, so that huge pages back all of it (a transparent huge page covers
    // only a whole aligned 2 MiB range: an unaligned start and end were ~600 page faults of 4 KiB
    // on a 43 MB buffer).
    constexpr uint64_t kHuge = uint64_t{2} << 20;
    const bool huge = payload_bytes >= kLargeArrayBytes;
    const uint64_t payload_alloc = huge ? (payload_bytes + kHuge - 1) / kHuge * kHuge + kHuge
                                        : std::max<uint64_t>(payload_bytes, 1);
    payloads.reset(new uint8_t[payload_alloc]);
    uint8_t* payload_base = payloads.get();
    if (huge) {
      const uintptr_t at = reinterpret_cast<uintptr_t>(payload_base);
      payload_base += ((at + kHuge - 1) & ~uintptr_t{kHuge - 1}) - at;
      adviseHugePages(payload_base, payload_bytes);
    }
    parallelFor(n, threads, [&](size_t i) {
      // One decompression context per thread, not per chunk: each new one's buffers are fresh
      // memory (page faults).
      thread_local trace::ChunkPreparer preparer;
      preparer.prepare(bytes, chunks[i], prepared[i], payload_base + payload_at[i]);
    });
    // 3. The Events chunks, each decoded once straight into its own slice of the events array
    // with the file's ids (the model's ids are known only once every chunk's first references
    // are, step 5). The array is sized once from the record counts the chunks' payloads declare,
    // each checked against the bytes present as decodeEventRecords checks it (a record takes at
    // least 4 bytes), never from the trailer's claim; a chunk whose count does not fit gets no
    // slice (its decoding fails, and the reader then refuses it).
    const uint64_t string_bound = tableBound(prepared, chunks, trace::ChunkType::Strings, 1);
    const uint64_t stack_bound = tableBound(prepared, chunks, trace::ChunkType::Stacks, 2);
    std::vector<uint64_t> slice_count(n, 0);
    slice_at.assign(n, 0);
    uint64_t slots = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!prepared[i].verified || chunks[i].type != static_cast<uint8_t>(trace::ChunkType::Events))
        continue;
      uint64_t count = 0;
      if (!trace::detail::eventRecordCount(prepared[i].payload, count)) continue;
      slice_at[i] = static_cast<size_t>(slots);
      slice_count[i] = count;
      slots += count;
    }
    if (!defer) {
      reserveHuge(snap.events, static_cast<size_t>(slots));
      snap.events.resize(static_cast<size_t>(slots));
    }
    refs.resize(n);
    // The first Segments chunk (a second one is refused by the reader) is decoded ahead with the
    // Checkpoint chunks, and the model's blocks sized for it, on the threads (step 4 takes them).
    // That chunk goes first (it is the largest piece of work and the last in the file: taken in
    // file order it would run alone at the end), then the others in file order.
    size_t first_segments = n;
    for (size_t i = 0; i < n && first_segments == n; ++i)
      if (chunks[i].type == static_cast<uint8_t>(trace::ChunkType::Segments)) first_segments = i;
    std::vector<size_t> order;
    order.reserve(n);
    if (first_segments < n) order.push_back(first_segments);
    for (size_t i = 0; i < n; ++i)
      if (i != first_segments) order.push_back(i);
    parallelFor(n, threads, [&](size_t k) {
      const size_t i = order[k];
      trace::PreparedChunk& p = prepared[i];
      if (chunks[i].type == static_cast<uint8_t>(trace::ChunkType::Checkpoint) ||
          i == first_segments) {
        trace::precheckChunk(chunks[i].type, p);
        if (i == first_segments && p.prechecked) snap.blocks.resize(p.blocks.size());
        return;
      }
      if (!p.verified || chunks[i].type != static_cast<uint8_t>(trace::ChunkType::Events)) return;
      // The file's ids go into the events as they are (step 6 maps them); the notes into the
      // chunk's own table, in the file's string ids.
      struct Scan {
        ChunkRefs& out;
        trace::PreparedChunk& p;
        IdBits stacks, strings;
        Event* slice;  // null: events deferred (only the references and runs are kept)
        uint64_t slice_count;
        bool fits = true;
        bool any = false;
        uint32_t stack = 0, compile = 0, user = 0, action_name = 0;
        void begin(uint64_t count) {
          p.event_count = count;
          if (slice != nullptr && count != slice_count) {
            fits = false;
            slice_count = 0;
          }
        }
        void ref(IdBits& bits, uint64_t kind, uint32_t id) {
          if (id >= bits.size()) {
            fits = false;
          } else if (bits.add(id)) {
            out.refs.push_back(kind << 32 | id);
          }
        }
        [[gnu::always_inline]] void event(uint64_t i, const trace::TraceEvent& t) {
          if (!any || t.device != out.last_device) {
            if (any && t.device < out.last_device) out.ordered = false;
            if (!any) out.first_device = t.device;
            out.last_device = t.device;
            p.device_events.emplace_back(t.device, 0);
            if (slice == nullptr) out.run_from.push_back(from);
          }
          ++p.device_events.back().second;
          // In toEvent's order: stack, compile context, user metadata, action name.
          if (!any || t.stack != stack) ref(stacks, kRefStack, stack = t.stack);
          if (!any || t.compile_context != compile)
            ref(strings, kRefString, compile = t.compile_context);
          if (!any || t.user_metadata != user) ref(strings, kRefString, user = t.user_metadata);
          if (trace::keepsActionName(t.action) && (!any || t.action_name != action_name))
            ref(strings, kRefString, action_name = t.action_name);
          any = true;
          const uint32_t notes = out.notes.intern(fileNotesOf(t));
          if (slice == nullptr) {
            if (t.action == static_cast<uint8_t>(Action::Oom)) {
              out.ooms.push_back(
                  {p.device_events.size() - 1, p.device_events.back().second - 1, t.time_us});
            }
            return;
          }
          if (i >= slice_count) return;
          slice[i] = eventOf(t, t.stack, notes);
        }
        trace::detail::RecordState from;  // deferred: the state before the current record
      };
      // Deferred: the state before each record is kept, for the run a device change starts.
      struct DeferScan : Scan {
        void before(uint64_t, const trace::detail::RecordState& st) { from = st; }
      };
      Status st;
      bool fits = false;
      if (defer) {
        DeferScan scan{{refs[i], p, IdBits(stack_bound), IdBits(string_bound), nullptr, 0}};
        st = trace::detail::decodeEventRecords(p.payload, kAllIds, kAllIds, kAllIds, scan, &p.ids);
        fits = scan.fits;
      } else {
        Scan scan{refs[i],
                  p,
                  IdBits(stack_bound),
                  IdBits(string_bound),
                  snap.events.data() + slice_at[i],
                  slice_count[i]};
        st = trace::detail::decodeEventRecords(p.payload, kAllIds, kAllIds, kAllIds, scan, &p.ids);
        fits = scan.fits;
      }
      p.events_decoded = st.ok() && fits;
    });
    r.setPrepared(prepared);
    r.setCheckpointsCheckedOnly(true);  // this reader has no use for them
  }
  // 4. The reader's walk in file order, each Events chunk's ids checked against the tables defined
  // before it.
  std::vector<size_t> accepted;  // Events chunks (indices in `chunks`) whose events are deferred
  size_t chunk_index = 0;
  while (threads > 0 && r.next()) {
    const auto& c = r.chunk();
    if (options.progress && c.offset >= next_progress) {
      options.progress(c.offset, bytes.size());
      next_progress = c.offset + (16u << 20);
    }
    if (c.type != static_cast<uint8_t>(trace::ChunkType::Events)) continue;
    if (!r.eventsDeferred()) return std::nullopt;  // decoded here: not the prepared chunks
    while (chunk_index < chunks.size() && chunks[chunk_index].offset < c.offset) ++chunk_index;
    if (chunk_index == chunks.size() || chunks[chunk_index].offset != c.offset) return std::nullopt;
    accepted.push_back(chunk_index);
  }
  if (threads > 0) {
    if (r.end().damaged) return std::nullopt;  // the serial reader's error or salvage
    // Every chunk is decoded (the reader keeps copies of what its tables refer to): the payloads
    // are needed no more, unless the events are deferred.
    if (!defer) payloads.reset();
    // Whether devices in file order never decrease (else: per-device arrays, step 7).
    bool any = false, in_order = true;
    uint32_t last = 0, max_device = 0;
    uint64_t total = 0;
    for (size_t i : accepted) {
      const ChunkRefs& cr = refs[i];
      if (prepared[i].event_count == 0) continue;
      if (!cr.ordered || (any && cr.first_device < last)) in_order = false;
      any = true;
      last = cr.last_device;
      for (const auto& run : prepared[i].device_events)
        max_device = std::max(max_device, run.first);
      total += prepared[i].event_count;
    }
    // 5. The model's ids, in the order the serial reader creates them: each chunk's first
    // references in file order.
    for (size_t i : accepted) {
      for (uint64_t ref : refs[i].refs) {
        if (ref >> 32 == kRefStack)
          stack(static_cast<uint32_t>(ref));
        else
          str(static_cast<uint32_t>(ref));
      }
      if (!stack_error.empty()) return std::nullopt;
    }
    std::vector<StackId> stack_of(std::max<uint64_t>(r.stacks().size(), 2), kNoStack);
    std::vector<StrId> str_of(r.stringCount(), kEmptyStr);
    for (size_t i : accepted) {
      for (uint64_t ref : refs[i].refs) {
        const uint32_t id = static_cast<uint32_t>(ref);
        if (ref >> 32 == kRefStack)
          stack_of[id] = stack(id);
        else
          str_of[id] = str(id);
      }
    }
    // 6. The file's ids in each accepted chunk's slice become the model's. The accepted chunks
    // are the first Events chunks of the file, their slices one run from the array's start (else
    // the serial reader reads the file); what the reader did not accept is cut off.
    size_t seen = 0;
    for (size_t k = 0; k < accepted.size(); ++k) {
      if (slice_at[accepted[k]] != seen && prepared[accepted[k]].event_count != 0)
        return std::nullopt;
      // Where each device starts: as the serial reader's begin_of, one entry per device up to the
      // last one with events.
      for (const auto& [d, cnt] : prepared[accepted[k]].device_events) {
        while (in_order && static_cast<uint64_t>(cur_device) < d) {
          begin_of.push_back(seen);
          ++cur_device;
        }
        seen += cnt;
      }
    }
    if (seen != total) return std::nullopt;
    if (defer) {
      deferred = deferTraceEvents(snap, chunks, prepared, refs, accepted, std::move(payloads),
                                  std::move(stack_of), str_of, max_device, total,
                                  r.trailer().present && r.trailer().has_device_traces
                                      ? static_cast<size_t>(r.trailer().device_traces)
                                      : 0);
    } else {
      snap.events.resize(static_cast<size_t>(total));
      // Each chunk's notes rows become the model's, in file order.
      std::vector<std::vector<uint32_t>> notes_of(accepted.size());
      for (size_t k = 0; k < accepted.size(); ++k)
        notes_of[k] = internChunkNotes(snap, refs[accepted[k]].notes, str_of);
      parallelFor(accepted.size(), threads, [&](size_t k) {
        const size_t i = accepted[k];
        Event* e = snap.events.data() + slice_at[i];
        Event* const end = e + prepared[i].event_count;
        const std::vector<uint32_t>& notes = notes_of[k];
        for (; e != end; ++e) {
          e->stack = stack_of[e->stack];
          e->notes = notes[e->notes];
        }
      });
      // 7. Devices interleaved (a capture of several devices): each device's events, in file
      // order, into its own array, as the serial reader groups them (one per device up to the
      // largest; concatenated below).
      if (!in_order) {
        interleaved = true;
        per_device.resize(static_cast<size_t>(max_device) + 1);
        std::vector<size_t> per(per_device.size(), 0);
        for (size_t i : accepted)
          for (const auto& [d, cnt] : prepared[i].device_events) per[d] += cnt;
        for (size_t d = 0; d < per.size(); ++d) per_device[d].reserve(per[d]);
        for (size_t i : accepted) {
          const Event* from = snap.events.data() + slice_at[i];
          for (const auto& [d, cnt] : prepared[i].device_events) {
            per_device[d].insert(per_device[d].end(), from, from + cnt);
            from += cnt;
          }
        }
        std::vector<Event>().swap(snap.events);
      }
    }  // !defer
    prepared.clear();
  }
  while (threads == 0 && stack_error.empty() && r.next()) {
    const auto& c = r.chunk();
    if (options.progress && c.offset >= next_progress) {
      options.progress(c.offset, bytes.size());
      next_progress = c.offset + (16u << 20);
    }
    if (c.type != static_cast<uint8_t>(trace::ChunkType::Events)) continue;
    for (const trace::TraceEvent& t : r.events()) {
      if (!interleaved && t.device != cur_device) {
        if (t.device > cur_device) {
          while (cur_device < t.device) {
            begin_of.push_back(snap.events.size());
            ++cur_device;
          }
        } else {
          // Out of device order: move what is there into per-device arrays.
          interleaved = true;
          per_device.resize(begin_of.size());
          begin_of.push_back(snap.events.size());
          for (size_t d = 0; d + 1 < begin_of.size(); ++d) {
            per_device[d].assign(snap.events.begin() + static_cast<ptrdiff_t>(begin_of[d]),
                                 snap.events.begin() + static_cast<ptrdiff_t>(begin_of[d + 1]));
          }
          std::vector<Event>().swap(snap.events);
        }
      }
      if (!interleaved) {
        // Grown to what the bytes read so far predict, within the decoded-bytes budget
        // (common/memory.h): no doubling copy of a large trace at its end.
        if (snap.events.size() == snap.events.capacity()) {
          growFor(snap.events, 1, predictedSize(snap.events.size(), c.offset, bytes.size()),
                  static_cast<size_t>(trace::decodedBudget(bytes.size())));
        }
        snap.events.push_back(toEvent(t));
      } else {
        if (t.device >= per_device.size()) per_device.resize(t.device + 1);
        per_device[t.device].push_back(toEvent(t));
      }
    }
  }
  if (!stack_error.empty()) return Error{stack_error, static_cast<int64_t>(r.chunk().offset)};
  const trace::TraceEnd& end = r.end();
  if (end.damaged && !options.salvage) {
    return Error{"native trace damaged: " + end.reason + "; " + std::to_string(r.eventsRead()) +
                     " events before it are intact (use --salvage to read them)",
                 static_cast<int64_t>(end.good_bytes)};
  }
  if (r.eventsRead() == 0 && end.chunks == 0 && !end.complete) {
    // Not even the Meta chunk survived: there is nothing to analyze, and saying "0 events" would
    // present a loss as a fact.
    return Error{"native trace holds no complete chunk: " + end.reason,
                 static_cast<int64_t>(end.good_bytes)};
  }
  if (!end.complete) {
    snap.load_warnings.push_back(
        std::string(end.damaged ? "damaged" : "incomplete") + " native trace: " + end.reason +
        "; read " + std::to_string(r.eventsRead()) + " events in " + std::to_string(end.chunks) +
        " chunks, " + std::to_string(end.lost_bytes) + " bytes after byte " +
        std::to_string(end.good_bytes) + " not read");
    snap.incomplete = snap.load_warnings.back();
  }
  for (const auto& n : end.notes) snap.load_warnings.push_back(n);
  if (r.trailer().dropped > 0) {
    snap.load_warnings.push_back(std::to_string(r.trailer().dropped) +
                                 " events were dropped by the capture before reaching the file "
                                 "(ring buffer full): totals after that point may be wrong");
    if (snap.incomplete.empty()) snap.incomplete = snap.load_warnings.back();
  }

  const trace::TraceMeta& m = r.meta();
  snap.traits = traitsFromBits(m.traits);
  snap.host_trace_events = m.host_trace_events;
  const size_t more_keys = forEachMetaLine(
      m.ignored_keys, true, [&](std::string_view k) { snap.ignored_keys.emplace_back(k); });
  if (more_keys > 0)
    snap.load_warnings.push_back(std::to_string(more_keys) +
                                 " more ignored keys not listed (at most " +
                                 std::to_string(kMaxMetaLines) + ")");
  const std::string source = "source " + std::string(m.source_format) + ": ";
  const size_t more_warnings = forEachMetaLine(m.source_warnings, false, [&](std::string_view w) {
    snap.load_warnings.push_back(source + std::string(w));
  });
  if (more_warnings > 0)
    snap.load_warnings.push_back(source + std::to_string(more_warnings) +
                                 " more warnings not listed (at most " +
                                 std::to_string(kMaxMetaLines) + ")");
  if (m.source_format == "capture") {
    snap.live_capture = true;
    snap.origin = "live capture";
    if (!m.producer.empty()) snap.origin += " (" + std::string(m.producer) + ")";
  } else if (!m.source_format.empty() && m.source_format != "native_trace") {
    snap.origin = std::string(m.source_format);
    if (m.pickle_protocol) snap.origin += ", protocol " + std::to_string(m.pickle_protocol);
    if (m.source_bytes) snap.origin += ", " + std::to_string(m.source_bytes) + " bytes";
  }
  // torch.profiler inputs: their segments are synthesized and their block addresses renumbered in
  // the trace too, so there is still no block layout.
  if (m.source_format == "profiler_trace" || m.source_format == "profiler_memory_timeline")
    snap.has_segment_info = false;
  // The profiler reader's note that reserved was synthesized came along in the warnings.
  if (m.source_format == "profiler_memory_timeline") snap.reserved_recorded = false;
  for (const std::string& w : snap.load_warnings)
    if (!snap.has_segment_info && w.find(format::kReservedAbsentNote) != std::string::npos)
      snap.reserved_recorded = false;

  // Events, device by device (trace index = device ordinal, as device_traces is).
  // The trailer of a 1.1 file counts the device traces, empty ones included (device_traces [[]]);
  // the reader has checked that it covers every event's device.
  const bool counted = r.trailer().present && r.trailer().has_device_traces;
  const size_t counted_traces = counted ? static_cast<size_t>(r.trailer().device_traces) : 0;
  if (deferred) {
    snap.ooms = std::move(deferred->oom_refs);
    snap.deferred = std::move(deferred);  // trace_begin: deferTraceEvents
  } else if (!interleaved) {
    snap.trace_begin = std::move(begin_of);  // one entry per device trace the events imply
    size_t traces =
        !snap.events.empty() || snap.trace_begin.size() > 1 ? snap.trace_begin.size() : 0;
    if (counted) traces = counted_traces;  // never fewer than the events imply
    if (traces == 0) {
      snap.trace_begin.clear();
    } else {
      while (snap.trace_begin.size() < traces) snap.trace_begin.push_back(snap.events.size());
      snap.trace_begin.push_back(snap.events.size());
    }
  } else {
    if (counted && per_device.size() < counted_traces) per_device.resize(counted_traces);
    size_t total = 0;
    for (const auto& v : per_device) total += v.size();
    snap.trace_begin.assign(1, 0);
    snap.events.reserve(total);
    for (auto& v : per_device) {
      snap.events.insert(snap.events.end(), v.begin(), v.end());
      snap.trace_begin.push_back(snap.events.size());
      std::vector<Event>().swap(v);
    }
  }
  if (m.traits == 0) snap.traits.has_device_traces = true;  // a capture: no PyTorch file behind it

  snap.pools = r.pools();
  if (r.hasSettings()) {
    const trace::TraceSettings& t = r.settings();
    auto& st = snap.settings;
    st.present = true;
    st.conf = std::string(t.conf);
    st.max_split_size = t.max_split_size;
    st.garbage_collection_threshold = t.garbage_collection_threshold;
    st.expandable_segments = t.expandable_segments;
    st.has_roundup = t.has_roundup;
    std::copy(std::begin(t.roundup_power2_divisions), std::end(t.roundup_power2_divisions),
              st.roundup_power2_divisions);
    for (const trace::TraceOtherSetting& x : t.other) {
      OtherSetting o;
      o.key = x.key;
      o.kind = static_cast<OtherSetting::Kind>(x.kind);  // the reader checked the range
      if (o.kind == OtherSetting::Kind::Float)
        std::memcpy(&o.f, &x.bits, 8);
      else
        o.i = static_cast<int64_t>(x.bits);
      o.s = x.text;
      st.other.push_back(std::move(o));
    }
  }
  for (const auto& a : r.annotations())
    snap.annotations.push_back(Annotation{a.device, a.time_us, str(a.name), str(a.stage)});

  if (r.hasFinalState()) {
    snap.segments.reserve(r.segments().size());
    // Sized on a loading thread when the reader took the Segments chunk decoded there (the
    // blocks are then written in place, not appended).
    const bool blocks_sized = snap.blocks.size() == r.blocks().size();
    if (!blocks_sized) {
      snap.blocks.clear();
      snap.blocks.reserve(r.blocks().size());
    }
    size_t placed = 0;  // blocks of the segments so far
    for (const trace::TraceSegment& t : r.segments()) {
      Segment g;
      g.device = t.device;
      g.address = t.address;
      g.total_size = t.total_size;
      g.allocated_size = t.allocated_size;
      g.active_size = t.active_size;
      g.requested_size = t.requested_size;
      g.stream = t.stream;
      g.pool_a = t.pool_a;
      g.pool_b = t.pool_b;
      g.stack = stack(t.stack);
      g.segment_type =
          t.usual_type ? snap.strings.intern(t.is_large ? "large" : "small") : str(t.segment_type);
      g.is_large = t.is_large;
      g.is_expandable = t.is_expandable;
      g.first_block = static_cast<uint32_t>(placed);
      g.block_count = t.block_count;
      placed += t.block_count;
      uint64_t covered = 0;
      for (uint32_t i = 0; i < t.block_count; ++i) {
        const trace::TraceBlock& b = r.blocks()[t.first_block + i];
        const Block block{b.address,
                          b.size,
                          b.requested_size,
                          stack(b.stack),
                          static_cast<BlockState>(b.state),
                          b.has_requested_size};
        if (blocks_sized)
          snap.blocks[t.first_block + i] = block;
        else
          snap.blocks.push_back(block);
        covered += b.size;
      }
      if (t.block_count > 0 && covered != t.total_size) {
        return Error{"native trace: segment " + std::to_string(snap.segments.size()) +
                         " has blocks covering " + std::to_string(covered) +
                         " bytes but total_size " + std::to_string(t.total_size),
                     -1};
      }
      snap.segments.push_back(g);
    }
  } else {
    size_t orphans = synthesizeFinalState(snap);
    snap.final_state_rebuilt = true;
    std::string w =
        "the file has no final segment state (its writer did not finish): the end state was "
        "rebuilt from the " +
        std::to_string(r.eventsRead()) +
        " events read; block sizes are requests rounded up to 512 bytes, so allocated "
        "bytes are estimates";
    if (orphans > 0)
      w += "; " + std::to_string(orphans) + " live allocations lie outside every recorded segment";
    if (snap.incomplete.empty()) snap.incomplete = w;
    snap.load_warnings.push_back(w);
  }
  indexSnapshot(snap);
  if (options.progress) options.progress(bytes.size(), bytes.size());
  return Expected<Snapshot>(std::move(snap));
}

}  // namespace

Expected<Snapshot> readSnapshotTrace(std::span<const uint8_t> bytes, const LoadOptions& options) {
  std::optional<Expected<Snapshot>> fast;
  try {
    fast = readTrace(bytes, options, traceLoadThreads(options.threads, kMaxTraceLoadThreads));
  } catch (const std::bad_alloc&) {
    // The parallel path holds every decompressed payload and a stack and arena per thread at
    // once; under an address-space limit the serial reader, which needs less, may still fit.
    fast.reset();
  }
  if (fast) return std::move(*fast);
  return *readTrace(bytes, options, 0);
}

Expected<Snapshot> readSnapshotTraceSerial(std::span<const uint8_t> bytes,
                                           const LoadOptions& options) {
  return *readTrace(bytes, options, 0);
}

std::optional<Expected<Snapshot>> readSnapshotTraceParallelOnly(std::span<const uint8_t> bytes,
                                                                const LoadOptions& options) {
  return readTrace(bytes, options, traceLoadThreads(options.threads, kMaxTraceLoadThreads));
}

}  // namespace memforensics::format
