// snapshot.h: the in-memory model of one allocator snapshot, whatever file it came from.
//
// Every reader (PyTorch pickle, memory_viz HTML, JSON, and later the native trace) produces this
// model; replay and analysis only ever see it. It is deliberately compact and flat:
//   * strings are interned once (StringTable) and referred to by StrId;
//   * frames are interned (file, line, name) triples referred to by FrameId;
//   * stacks are interned sequences of frames, innermost frame first, referred to by StackId;
//   * events are one flat vector per device, in allocator order (oldest first).
// Invariant: every id stored anywhere in the model is valid in the tables of the same Snapshot.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/flat_map.h"

namespace memforensics::format {

using StrId = uint32_t;
using FrameId = uint32_t;
using StackId = uint32_t;
inline constexpr StrId kEmptyStr = 0;      // the empty string always has id 0
inline constexpr StackId kNoStack = 0;     // "no stack recorded" (key absent)
inline constexpr StackId kEmptyStack = 1;  // an empty frames list (recorded, but empty)

// Append-only interning table. Views returned by get() stay valid for the table's lifetime.
class StringTable {
 public:
  StringTable();
  StringTable(const StringTable&) = delete;
  StringTable& operator=(const StringTable&) = delete;
  StringTable(StringTable&&) noexcept;
  StringTable& operator=(StringTable&&) noexcept;
  ~StringTable();

  StrId intern(std::string_view s);
  std::string_view get(StrId id) const { return views_[id]; }
  size_t size() const { return views_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept;
  };
  std::vector<char*> chunks_;
  size_t chunk_used_ = 0;
  size_t chunk_cap_ = 0;
  size_t bytes_ = 0;
  std::vector<std::string_view> views_;
  std::unordered_map<std::string_view, StrId, Hash, std::equal_to<>> index_;
};

struct Frame {
  StrId filename = kEmptyStr;
  StrId name = kEmptyStr;
  uint64_t line = 0;  // uint64 as in the file: 2^64-1 means "unknown line" (seen in real files)
  bool operator==(const Frame&) const = default;
};
inline constexpr uint64_t kUnknownLine = ~uint64_t{0};

// Frames and stacks, interned. Stack 0 = none recorded, stack 1 = recorded but empty.
class StackTable {
 public:
  StackTable();
  FrameId internFrame(const Frame& f);
  StackId internStack(std::span<const FrameId> frames);
  const Frame& frame(FrameId id) const { return frames_[id]; }
  std::span<const FrameId> stack(StackId id) const {
    const auto& r = stacks_[id];
    return {frame_ids_.data() + r.first, r.second};
  }
  size_t frameCount() const { return frames_.size(); }
  size_t stackCount() const { return stacks_.size(); }

 private:
  struct FrameHash {
    size_t operator()(const Frame& f) const noexcept;
  };
  std::vector<Frame> frames_;
  std::unordered_map<Frame, FrameId, FrameHash> frame_index_;
  std::vector<FrameId> frame_ids_;
  std::vector<std::pair<uint32_t, uint32_t>> stacks_;  // (offset into frame_ids_, length)
  U64Map<StackId> stack_head_;       // content hash -> newest stack with that hash
  std::vector<StackId> stack_next_;  // older stack with the same hash (0 = none)
};

// TraceEntry::Action order in c10 (ALLOC=0 ... ANNOTATE=9), plus Unknown for strings we do not
// know.
enum class Action : uint8_t {
  Alloc = 0,
  FreeRequested,
  FreeCompleted,
  SegmentAlloc,
  SegmentFree,
  SegmentMap,
  SegmentUnmap,
  Snapshot,
  Oom,
  Annotate,
  Unknown,
};
inline constexpr int kActionCount = 11;
std::string_view actionName(Action a);
// The one rule for an event's action name (EventNotes::action_name): the string as written is kept
// only for an Unknown action. The native trace states it for its codes (trace::keptActionName).
inline StrId keptActionName(Action a, StrId written) {
  return a == Action::Unknown ? written : kEmptyStr;
}
std::optional<Action> parseAction(std::string_view s);

// The strings a trace entry seldom carries, interned together as one row of
// Snapshot::event_notes so that Event stays small: most entries have none of them, and the rest
// share a few rows (2.8+ files write compile_context "N/A" on every entry).
struct EventNotes {
  StrId compile_context = kEmptyStr;
  StrId user_metadata = kEmptyStr;
  StrId action_name = kEmptyStr;  // the action string as written, kept only for Unknown actions
  bool operator==(const EventNotes&) const = default;
};

// Append-only interning table of EventNotes; row 0 is the empty one (no notes).
class EventNotesTable {
 public:
  EventNotesTable();
  // Inline for the common case, a repeat of the last row (once per trace entry while reading).
  uint32_t intern(const EventNotes& n) { return rows_[last_] == n ? last_ : internNew(n); }
  // The row equal to n, or kNone when the table has none.
  static constexpr uint32_t kNone = ~uint32_t{0};
  uint32_t find(const EventNotes& n) const;
  const EventNotes& operator[](uint32_t id) const { return rows_[id]; }
  size_t size() const { return rows_.size(); }

 private:
  uint32_t internNew(const EventNotes& n);
  std::vector<EventNotes> rows_;
  U64Map<uint32_t> head_;       // hash of a row -> newest row with that hash
  std::vector<uint32_t> next_;  // older row with the same hash (0 = none)
  uint32_t last_ = 0;           // the row interned last: consecutive entries mostly repeat it
};

struct Event {
  uint64_t addr = 0;         // block/segment address; for Oom: device_free bytes (as in the file)
  uint64_t size = 0;         // requested bytes (alloc/free_*), segment bytes, rounded OOM request
  int64_t stream = 0;        // cudaStream_t as int
  int64_t time_us = -1;      // wall clock microseconds since epoch; -1 when the file has none
  StackId stack = kNoStack;  // frames of the event; kNoStack when the key was absent
  uint32_t pool = 0;         // index into Snapshot::pools; 0 = no pool_id in the file (pre-2.12)
  uint32_t notes = 0;        // index into Snapshot::event_notes; 0 = none
  Action action = Action::Unknown;
  // A category the input itself assigned (torch.profiler's export_memory_timeline: 1 + PyTorch's
  // _CATEGORY_TO_INDEX, names in format/profiler/profiler_reader.h); 0 = none (every other input).
  uint8_t category = 0;
};
static_assert(sizeof(Event) == 48, "Event is stored once per trace entry: keep it compact");

enum class BlockState : uint8_t { ActiveAllocated, ActivePendingFree, Inactive, Unknown };
std::string_view blockStateName(BlockState s);

struct Block {
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t requested_size = 0;  // only meaningful for active blocks
  StackId stack = kNoStack;
  BlockState state = BlockState::Unknown;
  bool has_requested_size = false;
  bool isActive() const {
    return state == BlockState::ActiveAllocated || state == BlockState::ActivePendingFree;
  }
};

struct Segment {
  int64_t device = 0;
  uint64_t address = 0;
  uint64_t total_size = 0;
  uint64_t allocated_size = 0;
  uint64_t active_size = 0;
  uint64_t requested_size = 0;
  int64_t stream = 0;
  uint64_t pool_a = 0, pool_b = 0;
  StackId stack = kNoStack;
  StrId segment_type = kEmptyStr;  // "small" / "large" as written
  bool is_large = true;
  bool is_expandable = false;
  uint32_t first_block = 0;  // blocks [first_block, first_block + block_count) in Snapshot::blocks
  uint32_t block_count = 0;
};

struct Annotation {
  int64_t device = -1;
  int64_t time_us = -1;
  StrId name = kEmptyStr;
  StrId stage = kEmptyStr;  // "START" / "END"
};

// An allocator_settings key the model does not read (release_lock_on_cudamalloc,
// pinned_use_cuda_host_register, graph_capture_record_stream_reuse, ...), with its value when it
// is a scalar, carried as it was so that conversions keep it (docs/file-format.md).
// Bounds on what a file may carry there (real files hold about 10 short keys): entries past
// kMaxOtherSettings, and those whose key and value pass kMaxOtherSettingBytes, are dropped and
// counted (a 17 MB pickle of 4,096 keys naming one memoized 16 MiB string would copy 64 GiB).
inline constexpr size_t kMaxOtherSettings = 64;
inline constexpr size_t kMaxOtherSettingBytes = 4096;
// The allocator_settings keys the model reads into AllocatorSettings' own fields: never carried
// as an OtherSetting (the readers skip them, the pickle writer writes them from the fields).
inline constexpr std::string_view kModelSettingsKeys[] = {
    "PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold",
    "expandable_segments", "roundup_power2_divisions"};
inline bool isModelSettingsKey(std::string_view key) {
  for (std::string_view k : kModelSettingsKeys)
    if (k == key) return true;
  return false;
}
struct OtherSetting {
  enum class Kind : uint8_t { None, Bool, Int, UInt, Float, Str };
  std::string key;
  Kind kind = Kind::None;
  int64_t i = 0;  // Bool (0 or 1), Int, UInt (as its bits)
  double f = 0;   // Float
  std::string s;  // Str
};

// allocator_settings (2.3+); fields absent in the file keep their defaults and has_* = false.
struct AllocatorSettings {
  bool present = false;
  std::string conf;             // PYTORCH_CUDA_ALLOC_CONF
  int64_t max_split_size = -1;  // -1 = unlimited
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  bool has_roundup = false;
  uint32_t roundup_power2_divisions[16] = {};  // index k covers [2^k MiB, 2^(k+1) MiB)
  std::vector<OtherSetting> other;             // in the file's order; scalar values only
};

enum class SourceFormat : uint8_t {
  Pickle,
  MemoryVizHtml,
  Json,
  NativeTrace,
  ProfilerTrace,   // torch.profiler (Kineto) chrome trace JSON, plain or gzip
  MemoryTimeline,  // torch.profiler export_memory_timeline (.raw.json.gz, .json, .json.gz)
};
std::string_view sourceFormatName(SourceFormat f);

// Which generation of PyTorch wrote the file, from the fields present (see the format doc's
// version matrix). It is an inference, and reported as such.
struct FormatTraits {
  bool top_level_list = false;          // 1.13 / memory_snapshot(): bare list of segments
  bool has_device_traces = false;       // 2.0+
  bool has_block_history = false;       // 1.13-2.0 legacy `history`
  bool has_block_address = false;       // 2.1+
  bool has_segment_pool_id = false;     // 2.1+
  bool has_time_us = false;             // 2.2+
  bool has_allocator_settings = false;  // 2.3+
  bool has_annotations_key = false;     // 2.5+
  bool has_compile_context = false;     // 2.8+
  bool has_graph_capture_key = false;   // 2.9+
  bool has_user_metadata = false;       // 2.10+
  bool has_pool_id = false;             // ~2.12+
  bool has_host_traces = false;         // 2.14
  bool has_annotate_action = false;     // 2.14
  std::string era() const;              // e.g. "2.10-2.11"
};

// One OOM event of a device trace (Snapshot::ooms).
struct OomRef {
  int64_t device = 0;
  int64_t event = 0;     // index in the device's trace
  int64_t time_us = -1;  // -1 when the file has no time
};

// The events of a snapshot whose loader left them encoded (LoadOptions::defer_events; the native
// trace reader does, for `analyze`): DeviceEvents decodes one device's trace when a reader asks
// for it, so that the whole file's events are never in memory at once. Immutable once made;
// copies of the snapshot share it.
class DeferredEvents {
 public:
  virtual ~DeferredEvents() = default;
  // Writes device trace d into `out` (out.size() == Snapshot::traceSize(d)), exactly as the
  // loader would have stored it. The loader checked every record when it read the file.
  virtual void decode(size_t d, std::span<Event> out) const = 0;
};

// The words of a reader's warning that the file's reserved bytes were synthesized (see
// Snapshot::reserved_recorded).
inline constexpr std::string_view kReservedAbsentNote = "reserved is absent";

// What a reader saw in the file but the model does not hold (the analysis needs none of it), so
// that `convert` can say what its output leaves out.
struct NotKept {
  // 1.13-2.0 block `history`: the entries after each block's first (the first names the block's
  // allocation: its frames and real_size are the block's stack and requested size), and first
  // entries whose addr or real_size is not the block's address or requested_size (a merged free
  // block's older allocations).
  uint64_t legacy_history_entries = 0;
  uint64_t legacy_history_firsts = 0;
  // allocator_settings values that are neither None, bool, number nor string (lists, dicts), by
  // key (the first few named).
  uint64_t settings_values = 0;
  std::vector<std::string> settings_keys;  // at most kNamedNotKept
  static constexpr size_t kNamedNotKept = 8;
};

struct Snapshot;
// One line per kind of thing the model does not hold (NotKept, top-level keys not understood,
// 2.14 pinned host memory), for `convert` to say what a native trace or pickle written from `s`
// leaves out. Empty when the model holds the whole input.
std::vector<std::string> notKeptNotes(const Snapshot& s);

struct Snapshot {
  SourceFormat source = SourceFormat::Pickle;
  int pickle_protocol = 0;
  uint64_t input_bytes = 0;
  FormatTraits traits;
  StringTable strings;
  StackTable stacks;
  // Device by device (readers order them so: indexSnapshot), each device's in the file's order
  // (PyTorch's: by address).
  std::vector<Segment> segments;
  std::vector<Block> blocks;
  // All trace events, device by device; trace(d) = events of device d, oldest first. A device
  // with segments but no trace has an empty trace. Empty when `deferred` is set: a reader takes
  // a device's events through DeviceEvents then (trace(d) refuses).
  std::vector<Event> events;
  std::vector<size_t> trace_begin;  // trace d = events[trace_begin[d], trace_begin[d + 1])
  std::shared_ptr<const DeferredEvents> deferred;
  // Every OOM event of every device trace, by device then event, filled with the events by the
  // reader that made them (indexSnapshot): an OOM on one device of a job unwinds the step on every
  // device, so each device's analysis reads the others' OOMs, and a file of many devices is
  // scanned for them once.
  std::vector<OomRef> ooms;
  // pool_id tuples of trace entries; index 0 is a placeholder for "none".
  std::vector<std::pair<uint64_t, uint64_t>> pools{{0, 0}};
  EventNotesTable event_notes;  // Event::notes
  std::vector<Annotation> annotations;
  AllocatorSettings settings;
  std::vector<std::string> ignored_keys;  // top-level keys we do not understand, for the report
  NotKept not_kept;
  // Native traces: what the trace was converted from (e.g. "pickle, protocol 4, 3145433 bytes"),
  // or "live capture (PRODUCER)"; and what the reader had to say (a cut-off file, dropped
  // events...).
  std::string origin;
  bool live_capture = false;  // a native trace recorded by memforensics' capture (no PyTorch era)
  std::vector<std::string> load_warnings;
  // Why the input is not the whole record ("" when it is): a native trace cut short or damaged
  // (read with --salvage), without its final state, or with events the capture dropped. The
  // figures are still computed from what was read (and load_warnings say so); a CI gate on them
  // cannot hold (`check` exits 2).
  std::string incomplete;
  // The final segment state is not the file's: a native trace whose writer never wrote one had
  // it rebuilt from the events read. It lacks every block and segment that was alive through the
  // whole trace, so where the trace did not start from an empty device the start state derived
  // from it, and every peak, is short by them (replay.h: such a replay is not trusted).
  bool final_state_rebuilt = false;
  size_t host_trace_events = 0;  // 2.14 pinned host traces: counted, not replayed
  // false for torch.profiler inputs: their segments are synthesized from the reserved total (or
  // the allocated high-water mark) and block addresses are renumbered, so there is no block
  // layout; commands that need one refuse ("not available for profiler traces").
  bool has_segment_info = true;
  // false where the reserved bytes are not the allocator's: a torch.profiler trace with no
  // "Total Reserved" on some device, or a memory timeline, whose synthesized segments follow the
  // allocated high-water mark (also after a conversion to a native trace: the reader's note,
  // kReservedAbsentNote, travels in its warnings). Rules about the cache need the real bytes.
  bool reserved_recorded = true;
  // Per device index: the card's memory in bytes (profiler traces' deviceProperties), 0 = unknown.
  std::vector<uint64_t> device_total_memory;
  int64_t rank = -1;  // distributed rank (profiler traces' distributedInfo), -1 = unknown

  // The final segments of `device` (a binary search: the segments are ordered by device).
  std::span<const Segment> segmentsOf(int64_t device) const;
  std::span<const Block> blocksOf(const Segment& s) const {
    return {blocks.data() + s.first_block, s.block_count};
  }
  const EventNotes& notesOf(const Event& e) const { return event_notes[e.notes]; }
  size_t traceCount() const { return trace_begin.empty() ? 0 : trace_begin.size() - 1; }
  // Events in device trace d, without decoding them.
  size_t traceSize(size_t d) const {
    return d < traceCount() ? trace_begin[d + 1] - trace_begin[d] : 0;
  }
  size_t eventCount() const { return trace_begin.empty() ? 0 : trace_begin.back(); }
  // Device trace d, oldest first. The events must be in memory: a deferred snapshot's trace is
  // read through DeviceEvents, which decodes that one device (this throws std::logic_error
  // rather than decode anything behind the caller's back).
  std::span<const Event> trace(size_t d) const {
    if (d >= traceCount()) return {};
    if (deferred) refuseDeferredTrace();
    return {events.data() + trace_begin[d], trace_begin[d + 1] - trace_begin[d]};
  }
  // Devices that appear anywhere (segments or traces), ascending.
  std::vector<int64_t> devices() const;

 private:
  [[noreturn]] static void refuseDeferredTrace();
};

// A reader's last step: orders the segments by device (stable: each device's keep the file's
// order), so that segmentsOf finds a device's without a scan of every device's, and fills
// snap.ooms from the events in memory (a deferred snapshot's reader fills it while it reads the
// records). Whoever builds a Snapshot by hand calls it too.
void indexSnapshot(Snapshot& snap);

// One device's events for as long as a reader holds them: a view of the snapshot's events, or,
// for a deferred snapshot, that device's trace decoded into a buffer this object shares among its
// copies. The view of an in-memory snapshot's events lives as long as the snapshot; a decoded
// device's, as long as some copy of this object. (Lending a worker's
// previous buffer to the next device's decode was measured: no gain, docs/performance.md.)
class DeviceEvents {
 public:
  DeviceEvents() = default;
  DeviceEvents(const Snapshot& snap, size_t d);
  std::span<const Event> span() const { return view_; }
  bool decoded() const { return owned_ != nullptr; }

 private:
  std::shared_ptr<const std::vector<Event>> owned_;
  std::span<const Event> view_;
};

}  // namespace memforensics::format
