// pickle_machine.h: the data-only pickle machine that readSnapshotPickle runs (not part of the
// format API). Its parts, by concern:
//   pickle_machine.h   1. values and nodes (the machine's stack items: a Value is 16 bytes;
//                         containers are Nodes in one vector, referred to by index, so memo entries
//                         share them) and the Machine's state;
//   pickle_machine.cc  2. the opcode machine: one loop over opcodes; containers are reduced to
//                         frames, stacks and events the moment they are filled (SETITEMS /
//                         APPENDS);
//   pickle_entry.cc    2b/2c. a trace entry as an Event: applyField (the one place an entry's
//                         value lands in its Event, for makeEvent and the shaped path), the fast
//                         path over an entry's opcodes and the shaped path for entries with the
//                         previous entry's keys;
//   pickle_schema.cc   3. the snapshot schema: the root object converted into the Snapshot model,
//                         with a path in every error ("segments[3].blocks[7]: ...").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/flat_map.h"
#include "common/memory.h"
#include "format/pickle/pickle_reader.h"

namespace memforensics::format::pickle_detail {

// ---------------------------------------------------------------------------------------------
// 1. Values and nodes

enum class VK : uint8_t { None, Bool, Int, UInt, BigInt, Float, Str, Node };

struct Value {
  union {
    int64_t i;
    double f;
    uint32_t id;  // StrId or node index
  };
  VK kind = VK::None;
  Value() : i(0) {}
  static Value none() { return {}; }
  static Value boolean(bool b) {
    Value v;
    v.kind = VK::Bool;
    v.i = b;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = VK::Int;
    v.i = x;
    return v;
  }
  static Value uinteger(uint64_t x) {
    Value v;
    v.kind = x > static_cast<uint64_t>(INT64_MAX) ? VK::UInt : VK::Int;
    v.i = static_cast<int64_t>(x);
    return v;
  }
  static Value bigint() {
    Value v;
    v.kind = VK::BigInt;
    return v;
  }
  static Value flt(double x) {
    Value v;
    v.kind = VK::Float;
    v.f = x;
    return v;
  }
  static Value str(StrId s) {
    Value v;
    v.kind = VK::Str;
    v.id = s;
    return v;
  }
  static Value node(uint32_t n) {
    Value v;
    v.kind = VK::Node;
    v.id = n;
    return v;
  }
};
static_assert(sizeof(Value) == 16);

// OpenStack: a list holding only frames, still being filled (its FrameIds in open_stacks_[ref]);
// it becomes an interned Stack when something first references it as `frames`.
// EventList: a list holding only trace entries, events_[first, first + count) in order (what every
// device trace is); kept as that run (event_runs_[ref]) instead of 16 bytes per item, and turned
// into a generic List (materialize) the moment anything else is appended or it is read as one.
enum class NK : uint8_t { List, Dict, Tuple, Frame, Stack, OpenStack, Event, EventList };

// 8 bytes per container. Generic containers (List/Dict/Tuple) keep their items in store_[ref]
// (allocated on first fill; kNoStore while empty); reduced ones keep their id in ref.
struct Node {
  uint32_t ref = 0;  // List/Dict/Tuple: store index; Frame: FrameId; Stack: StackId;
                     // OpenStack: index into open_stacks_; Event: index
  NK kind = NK::List;
};
static_assert(sizeof(Node) == 8);
constexpr uint32_t kNoStore = ~uint32_t{0};
struct EventRun {
  uint32_t first = 0;  // index into the machine's events
  uint32_t count = 0;
};
// The generic containers' items (blocks, segments, settings: 100,000 small dicts in a 200-device
// snapshot) come from an ItemArena: bump-allocated from a few chunks instead of one malloc each,
// the chunks from 2 MiB on with the huge-page hint. The parse thread thus no longer faults in the
// malloc heap page by page (5,500 of its 8,600 page faults on zid_x207.pickle, ~13 us each on the
// project machine). Freed buffers (a vector that grew) are not reused unless they were the last one
// handed out, so the arena holds at most what the containers hold plus their vectors' earlier,
// smaller copies (at most as much again) and one chunk. Buffers of kLargeBytes and more are plain
// heap blocks.
class ItemArena {
 public:
  static constexpr size_t kLargeBytes = size_t{64} << 10;
  static constexpr size_t kFirstChunk = size_t{256} << 10;
  static constexpr size_t kMaxChunk = size_t{8} << 20;
  static constexpr size_t kHugeFrom = size_t{2} << 20;
  static constexpr size_t kAlign = alignof(std::max_align_t);

  ItemArena() = default;
  ItemArena(const ItemArena&) = delete;
  ItemArena& operator=(const ItemArena&) = delete;

  void* allocate(size_t bytes) {
    if (bytes >= kLargeBytes) return ::operator new(bytes);
    bytes = (bytes + kAlign - 1) & ~(kAlign - 1);
    if (static_cast<size_t>(end_ - top_) < bytes) newChunk();
    void* p = top_;
    top_ += bytes;
    return p;
  }
  void deallocate(void* p, size_t bytes) {
    if (bytes >= kLargeBytes) {
      ::operator delete(p);
      return;
    }
    bytes = (bytes + kAlign - 1) & ~(kAlign - 1);
    if (static_cast<uint8_t*>(p) + bytes == top_) top_ = static_cast<uint8_t*>(p);
  }

 private:
  struct FreeChunk {
    void operator()(uint8_t* p) const { ::operator delete (p, std::align_val_t{kHugeFrom}); }
  };
  void newChunk() {
    const size_t bytes = chunks_.empty() ? kFirstChunk : std::min(chunk_bytes_ * 2, kMaxChunk);
    auto* p = static_cast<uint8_t*>(::operator new (bytes, std::align_val_t{kHugeFrom}));
    chunks_.emplace_back(p);
    chunk_bytes_ = bytes;
    if (bytes >= kHugeFrom) adviseHugePages(p, bytes);
    base_ = top_ = p;
    end_ = p + bytes;
  }
  std::vector<std::unique_ptr<uint8_t, FreeChunk>> chunks_;
  size_t chunk_bytes_ = 0;
  uint8_t* base_ = nullptr;
  uint8_t* top_ = nullptr;
  uint8_t* end_ = nullptr;
};

// A vector's allocator over an ItemArena; without one (default-constructed), the heap.
template <typename T>
struct ArenaAllocator {
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  ItemArena* arena = nullptr;
  ArenaAllocator() = default;
  explicit ArenaAllocator(ItemArena* a) : arena(a) {}
  template <typename U>
  ArenaAllocator(const ArenaAllocator<U>& o) : arena(o.arena) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    if (n > std::allocator_traits<std::allocator<T>>::max_size(std::allocator<T>()))
      throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    return static_cast<T*>(arena ? arena->allocate(bytes) : ::operator new(bytes));
  }
  void deallocate(T* p, size_t n) {
    if (arena)
      arena->deallocate(p, n * sizeof(T));
    else
      ::operator delete(p);
  }
  template <typename U>
  bool operator==(const ArenaAllocator<U>& o) const {
    return arena == o.arena;
  }
};
using Items = std::vector<Value, ArenaAllocator<Value>>;

// Where a value sits in the snapshot, rendered only when an error needs it.
struct Where {
  const char* base;
  int64_t seg = -1;
  int64_t block = -1;
  const char* suffix = nullptr;
  std::string str() const {
    std::string out = base;
    if (seg >= 0) out += "[" + std::to_string(seg) + "]";
    if (block >= 0) out += ".blocks[" + std::to_string(block) + "]";
    if (suffix) out += suffix;
    return out;
  }
};

// What a value is, with its article, for messages: "an int", "a list", "None".
inline const char* aKind(const Value& v, const std::vector<Node>& nodes) {
  switch (v.kind) {
    case VK::None:
      return "None";
    case VK::Bool:
      return "a bool";
    case VK::Int:
    case VK::UInt:
      return "an int";
    case VK::BigInt:
      return "an int out of the 64-bit range";
    case VK::Float:
      return "a float";
    case VK::Str:
      return "a str";
    case VK::Node:
      switch (nodes[v.id].kind) {
        case NK::List:
        case NK::EventList:
          return "a list";
        case NK::Dict:
          return "a dict";
        case NK::Tuple:
          return "a tuple";
        case NK::Frame:
          return "a frame dict";
        case NK::Stack:
        case NK::OpenStack:
          return "a frames list";
        case NK::Event:
          return "a trace entry dict";
      }
  }
  return "?";
}

// The machine's value stack: a vector whose push is small enough to inline into the opcode loop
// (BINGET pushes are most of a snapshot's opcodes).
class ValueStack {
 public:
  ValueStack() { grow(4096); }
  ~ValueStack() { std::free(data_); }
  ValueStack(const ValueStack&) = delete;
  ValueStack& operator=(const ValueStack&) = delete;
  // By value: DUP pushes the stack's own last item, which a grow() would free under a reference.
  inline void push_back(Value v) {
    if (__builtin_expect(size_ == cap_, 0)) grow(cap_ * 2);
    data_[size_++] = v;
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Value& back() { return data_[size_ - 1]; }
  void pop_back() { --size_; }
  void resize(size_t n) { size_ = n; }  // only ever shrinks
  void clear() { size_ = 0; }
  void reserve(size_t n) {
    if (n > cap_) grow(n);
  }
  Value* begin() { return data_; }
  Value* end() { return data_ + size_; }
  Value* data() { return data_; }
  Value& operator[](size_t i) { return data_[i]; }

 private:
  void grow(size_t n) {
    auto* p = static_cast<Value*>(std::realloc(data_, n * sizeof(Value)));
    if (p == nullptr) std::abort();
    data_ = p;
    cap_ = n;
  }
  Value* data_ = nullptr;
  size_t size_ = 0;
  size_t cap_ = 0;
};

Value longValue(const uint8_t* b, uint64_t n);

// Opcode bytes (pickle protocol 0-5).
enum Op : uint8_t {
  MARK = '(',
  STOP = '.',
  POP = '0',
  POP_MARK = '1',
  DUP = '2',
  FLOAT = 'F',
  INT = 'I',
  BININT = 'J',
  BININT1 = 'K',
  LONG = 'L',
  BININT2 = 'M',
  NONE = 'N',
  PERSID = 'P',
  BINPERSID = 'Q',
  REDUCE = 'R',
  STRING = 'S',
  BINSTRING = 'T',
  SHORT_BINSTRING = 'U',
  UNICODE = 'V',
  BINUNICODE = 'X',
  APPEND = 'a',
  BUILD = 'b',
  GLOBAL = 'c',
  DICT = 'd',
  EMPTY_DICT = '}',
  APPENDS = 'e',
  GET = 'g',
  BINGET = 'h',
  INST = 'i',
  LONG_BINGET = 'j',
  LIST = 'l',
  EMPTY_LIST = ']',
  OBJ = 'o',
  PUT = 'p',
  BINPUT = 'q',
  LONG_BINPUT = 'r',
  SETITEM = 's',
  TUPLE = 't',
  EMPTY_TUPLE = ')',
  SETITEMS = 'u',
  BINFLOAT = 'G',
  PROTO = 0x80,
  NEWOBJ = 0x81,
  EXT1 = 0x82,
  EXT2 = 0x83,
  EXT4 = 0x84,
  TUPLE1 = 0x85,
  TUPLE2 = 0x86,
  TUPLE3 = 0x87,
  NEWTRUE = 0x88,
  NEWFALSE = 0x89,
  LONG1 = 0x8a,
  LONG4 = 0x8b,
  BINBYTES = 'B',
  SHORT_BINBYTES = 'C',
  SHORT_BINUNICODE = 0x8c,
  BINUNICODE8 = 0x8d,
  BINBYTES8 = 0x8e,
  EMPTY_SET = 0x8f,
  ADDITEMS = 0x90,
  FROZENSET = 0x91,
  NEWOBJ_EX = 0x92,
  STACK_GLOBAL = 0x93,
  MEMOIZE = 0x94,
  FRAME = 0x95,
  BYTEARRAY8 = 0x96,
  NEXT_BUFFER = 0x97,
  READONLY_BUFFER = 0x98,
};

inline bool executesCode(uint8_t op) {
  switch (op) {
    case GLOBAL:
    case STACK_GLOBAL:
    case REDUCE:
    case BUILD:
    case INST:
    case OBJ:
    case NEWOBJ:
    case NEWOBJ_EX:
    case PERSID:
    case BINPERSID:
    case EXT1:
    case EXT2:
    case EXT4:
      return true;
    default:
      return false;
  }
}

// Keys the reducer and converter look for, interned once so comparisons are integer compares.
struct Keys {
  StrId action, addr, size, stream, time_us, frames, device_free, compile_context, user_metadata,
      pool_id, filename, line, name, segments, device_traces, allocator_settings,
      external_annotations, host_segments, host_traces, device, address, total_size, allocated_size,
      active_size, requested_size, segment_type, segment_pool_id, is_expandable, blocks, state,
      history, real_size, stage, conf, max_split_size, gc_threshold, expandable_segments, roundup,
      graph_capture, small, active_allocated, active_pending_free, inactive;
  explicit Keys(StringTable& t)
      : action(t.intern("action")),
        addr(t.intern("addr")),
        size(t.intern("size")),
        stream(t.intern("stream")),
        time_us(t.intern("time_us")),
        frames(t.intern("frames")),
        device_free(t.intern("device_free")),
        compile_context(t.intern("compile_context")),
        user_metadata(t.intern("user_metadata")),
        pool_id(t.intern("pool_id")),
        filename(t.intern("filename")),
        line(t.intern("line")),
        name(t.intern("name")),
        segments(t.intern("segments")),
        device_traces(t.intern("device_traces")),
        allocator_settings(t.intern("allocator_settings")),
        external_annotations(t.intern("external_annotations")),
        host_segments(t.intern("host_segments")),
        host_traces(t.intern("host_traces")),
        device(t.intern("device")),
        address(t.intern("address")),
        total_size(t.intern("total_size")),
        allocated_size(t.intern("allocated_size")),
        active_size(t.intern("active_size")),
        requested_size(t.intern("requested_size")),
        segment_type(t.intern("segment_type")),
        segment_pool_id(t.intern("segment_pool_id")),
        is_expandable(t.intern("is_expandable")),
        blocks(t.intern("blocks")),
        state(t.intern("state")),
        history(t.intern("history")),
        real_size(t.intern("real_size")),
        stage(t.intern("stage")),
        conf(t.intern("PYTORCH_CUDA_ALLOC_CONF")),
        max_split_size(t.intern("max_split_size")),
        gc_threshold(t.intern("garbage_collection_threshold")),
        expandable_segments(t.intern("expandable_segments")),
        roundup(t.intern("roundup_power2_divisions")),
        graph_capture(t.intern("graph_capture_record_stream_reuse")),
        small(t.intern("small")),
        active_allocated(t.intern("active_allocated")),
        active_pending_free(t.intern("active_pending_free")),
        inactive(t.intern("inactive")) {}
};

// ---------------------------------------------------------------------------------------------
// 2. The machine

class Machine {
 public:
  Machine(std::span<const uint8_t> data, const PickleReadOptions& opt)
      : p_(data.data()),
        begin_(data.data()),
        end_(data.data() + data.size()),
        opt_(opt),
        keys_(snap_.strings) {}

  Expected<Snapshot> run();

 private:
  // -- errors
  Error err(std::string msg) const { return Error{std::move(msg), op_offset_}; }
  Error truncated(const char* what) const {
    return Error{std::string("input ends inside ") + what + " of opcode " + pickleOpcodeName(op_) +
                     " (file truncated?)",
                 op_offset_};
  }

  // -- stack helpers
  Expected<Value> pop() {
    if (stack_.size() <= markBase())
      return err(std::string("stack underflow at ") + pickleOpcodeName(op_));
    Value v = stack_.back();
    stack_.pop_back();
    return v;
  }
  size_t markBase() const { return marks_.empty() ? 0 : marks_.back(); }
  Expected<size_t> popMark() {
    if (marks_.empty()) return err(std::string(pickleOpcodeName(op_)) + " without a MARK");
    size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }
  uint32_t newNode(NK kind) {
    grow(nodes_, 1);
    nodes_.push_back(Node{kNoStore, kind});
    return static_cast<uint32_t>(nodes_.size() - 1);
  }
  Items& itemsOf(uint32_t n) {
    Node& node = nodes_[n];
    if (node.ref == kNoStore) {
      node.ref = static_cast<uint32_t>(store_.size());
      store_.emplace_back(ArenaAllocator<Value>(&arena_));
    }
    return store_[node.ref];
  }
  bool itemsEmpty(uint32_t n) const {
    return nodes_[n].ref == kNoStore || store_[nodes_[n].ref].empty();
  }
  static const Items& noItems() {
    static const Items empty;
    return empty;
  }
  const Items& itemsOf(uint32_t n) const {
    return nodes_[n].ref == kNoStore ? noItems() : store_[nodes_[n].ref];
  }
  // The memo holds 8-byte entries: 0 = unset, (1<<32 | StrId), (2<<32 | node), or (3<<32 | i)
  // for any other value kept in memo_other_[i] (Python never memoizes ints or floats, so that
  // side table stays empty for real files).
  uint64_t memoEncode(const Value& v) {
    if (v.kind == VK::Str) return uint64_t{1} << 32 | v.id;
    if (v.kind == VK::Node) return uint64_t{2} << 32 | v.id;
    memo_other_.push_back(v);
    return uint64_t{3} << 32 | (memo_other_.size() - 1);
  }
  // Memo entries are (kind << 32 | payload), kind 0 = unset. Stored in 32 bits as
  // (kind << 30 | payload) while every payload fits 30 bits (strings, nodes and other values
  // number at most about the input's bytes, so always below 1 GiB of input): 4 bytes per memo
  // index instead of 8 (13 M indices, 52 MB, on a 4.8 M-event file). A larger payload widens the
  // memo to 64-bit entries once.
  static constexpr uint64_t kNarrowPayload = (uint64_t{1} << 30) - 1;
  size_t memoSize() const { return memo_wide_ ? memo64_.size() : memo32_.size(); }
  __attribute__((always_inline)) uint64_t memoAt(uint64_t idx) const {
    if (memo_wide_) return idx < memo64_.size() ? memo64_[idx] : 0;
    if (idx >= memo32_.size()) return 0;
    uint32_t x = memo32_[idx];
    return uint64_t{x >> 30} << 32 | (x & kNarrowPayload);
  }
  static uint32_t narrow(uint64_t enc) {
    return static_cast<uint32_t>((enc >> 32) << 30 | (enc & kNarrowPayload));
  }
  void memoWiden(uint64_t enc) {
    if (memo_wide_ || (enc & 0xffffffffu) <= kNarrowPayload) return;
    memo64_.reserve(memo32_.capacity());
    for (size_t i = 0; i < memo32_.size(); ++i) memo64_.push_back(memoAt(i));
    std::vector<uint32_t>().swap(memo32_);
    memo_wide_ = true;
  }
  void memoPush(uint64_t enc) {
    memoWiden(enc);
    if (memo_wide_) {
      grow(memo64_, 1);
      memo64_.push_back(enc);
    } else {
      grow(memo32_, 1);
      memo32_.push_back(narrow(enc));
    }
  }
  void memoSet(size_t idx, uint64_t enc) {
    memoWiden(enc);
    if (memo_wide_)
      memo64_[idx] = enc;
    else
      memo32_[idx] = narrow(enc);
  }
  void memoExtend(size_t n) {  // unset entries up to n
    if (memo_wide_) {
      grow(memo64_, n - memo64_.size());
      memo64_.resize(n, 0);
    } else {
      grow(memo32_, n - memo32_.size());
      memo32_.resize(n, 0);
    }
  }
  void memoTruncate(size_t n) {
    if (memo_wide_)
      memo64_.resize(n);
    else
      memo32_.resize(n);
  }
  Status memoPut(uint64_t idx) {
    if (stack_.size() <= markBase()) return err("memo store with an empty stack");
    // A rebound slot makes the cached frames runs stale. The table is replaced, not cleared: a
    // clear walks the whole capacity, and a file of rebinds after many runs would pay that walk
    // on every 2-byte BINPUT; a fresh table costs what the runs cached since the last one did.
    if (idx < memoSize() && !frames_runs_.empty()) frames_runs_ = U64Map<FramesRun>();
    if (idx < memoSize()) ++runs_gen_;  // and every guess (frames_guess_) with it
    if (idx >= memoSize()) {
      if (idx > memoSize() + opt_.max_memo_gap) {
        return err("memo index " + std::to_string(idx) + " far beyond the " +
                   std::to_string(memoSize()) + " entries stored so far");
      }
      if (idx >= memo_budget_) {
        return err("memo index " + std::to_string(idx) + " far beyond the " +
                   std::to_string(memo_budget_) + " entries an input of " +
                   std::to_string(snap_.input_bytes) + " bytes can store");
      }
      memoExtend(idx + 1);
    }
    memoSet(idx, memoEncode(stack_.back()));
    return Status::Ok();
  }
  Status memoGet(uint64_t idx) {
    uint64_t m = memoAt(idx);
    switch (m >> 32) {
      case 1:
        stack_.push_back(Value::str(static_cast<uint32_t>(m)));
        return Status::Ok();
      case 2:
        stack_.push_back(Value::node(static_cast<uint32_t>(m)));
        return Status::Ok();
      case 3:
        stack_.push_back(memo_other_[static_cast<uint32_t>(m)]);
        return Status::Ok();
      default:
        return err("memo index " + std::to_string(idx) + " read before it was stored");
    }
  }

  // A generic container's items grow as the input predicts (grow()) only from this many on.
  static constexpr size_t kPredictedGrowthItems = 4096;

  // Room for `need` more elements in one of the big arrays (nodes, memo, events, a trace list's
  // items), grown to what the input read so far predicts (common/memory.h), at most to as many
  // elements as the input has bytes: never reserved from the input's size up front.
  template <typename T>
  void grow(std::vector<T>& v, size_t need = 1) {
    if (v.capacity() - v.size() < need) {
      auto done = static_cast<uint64_t>(p_ - begin_);
      auto total = static_cast<uint64_t>(end_ - begin_);
      growFor(v, need, predictedSize(v.size(), done, total),
              static_cast<size_t>(total) / sizeof(T));
    }
  }
  // grow() for a generic container's items: growFor's sizes (common/memory.h), in an Items.
  void growItems(Items& v, size_t need) {
    if (v.capacity() - v.size() >= need) return;
    auto done = static_cast<uint64_t>(p_ - begin_);
    auto total = static_cast<uint64_t>(end_ - begin_);
    const size_t predicted = predictedSize(v.size(), done, total);
    const size_t most = static_cast<size_t>(total) / sizeof(Value);
    size_t cap = std::max(v.capacity() * 2, std::max<size_t>(v.size() + need, 4096));
    if (predicted > cap) {
      cap = std::max(cap, std::min({predicted, v.capacity() * kMaxGrowthFactor, most}));
    }
    Items bigger(v.get_allocator());
    bigger.reserve(cap);
    if (bigger.capacity() * sizeof(Value) >= kLargeArrayBytes) {
      adviseHugePages(bigger.data(), bigger.capacity() * sizeof(Value));
    }
    bigger.insert(bigger.end(), v.begin(), v.end());
    v.swap(bigger);
  }
  // Tells input_prefetch_ how far the parse has read; every kPrefetchEveryDicts dicts.
  static constexpr uint32_t kPrefetchEveryDicts = 1024;

  // -- the trace-entry fast path (section 2b)
  bool fastEntry();
  bool fastValue(const uint8_t*& p, Value& out);
  bool fastKey(const uint8_t*& p, Value& out);
  bool fastFetch(uint64_t idx, Value& out) const;
  // An optional memo store of `enc` at p: MEMOIZE, or BINPUT / LONG_BINPUT of the next free
  // index. Inline: a MEMOIZE into a narrow memo with room (what memoPush does, without its checks
  // for growth), twice per trace entry; anything else in fastMemoSlow.
  __attribute__((always_inline)) bool fastMemo(const uint8_t*& p, uint64_t enc) {
    if (p < end_ && *p == MEMOIZE && !memo_wide_ && (enc & 0xffffffffu) <= kNarrowPayload &&
        memo32_.size() < memo32_.capacity() && memo32_.size() < memo_budget_) {
      memo32_.push_back(narrow(enc));
      p += 1;
      return true;
    }
    return fastMemoSlow(p, enc);
  }
  bool fastMemoSlow(const uint8_t*& p, uint64_t enc);
  bool fastFrames(const uint8_t*& p, Value& out);
  bool skipFrames(const uint8_t*& p) const;
  bool fastShaped();
  void recordShape(size_t count);

  // -- reading operands
  template <typename T>
  bool readLE(T& out) {
    if (static_cast<size_t>(end_ - p_) < sizeof(T)) return false;
    std::memcpy(&out, p_, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
    p_ += sizeof(T);
    return true;
  }
  Status pushString(uint64_t len);
  Status pushLong(uint64_t n);

  // -- containers
  Status appendItems(uint32_t list, size_t from);
  Status setItems(uint32_t dict, size_t from);
  Status reduceDict(uint32_t n, const Value* kv, size_t count);
  Status makeEvent(uint32_t n, const Value* kv, size_t count);
  Expected<StackId> stackOf(const Value& v, const Where& where);
  Expected<uint32_t> targetContainer(size_t below, NK want);
  // A frames list stored into a parent container is complete (the pickler writes a child before
  // its parent's SETITEMS/APPENDS): intern it now, so stacks are numbered in file order.
  Status sealOpenStacks(size_t from) {
    for (size_t k = from; k < stack_.size(); ++k) {
      const Value& v = stack_[k];
      if (v.kind == VK::Node && nodes_[v.id].kind == NK::OpenStack) {
        auto st = stackOf(v, Where{"frames list"});
        if (!st) return st.error();
      }
    }
    return Status::Ok();
  }
  // A budget of per_byte items for each input byte, plus kBudgetSlack (pickle_reader.h); the
  // figure the counters start from and that their refusals quote.
  uint64_t inputBudget(uint64_t per_byte) const {
    return per_byte * snap_.input_bytes + kBudgetSlack;
  }
  Status chargeFrames(uint64_t n) {
    if (n > frames_budget_) {
      return err("the frames lists expand to more stack frames than an input of " +
                 std::to_string(snap_.input_bytes) + " bytes can hold (a budget of " +
                 std::to_string(inputBudget(kStackFramesPerInputByte)) +
                 "; is one frames list appended to after each use?)");
    }
    frames_budget_ -= n;
    return Status::Ok();
  }
  // Conversion: n more records (segments, blocks, entries, dict items read); refused past the
  // budget.
  Status chargeRecords(uint64_t n, const std::string& where) {
    if (n > records_budget_) {
      return Error{
          where + ": the input expands to more than " +
              std::to_string(inputBudget(kRecordsPerInputByte)) +
              " records (segments, blocks, trace entries and their fields), more than an input "
              "of " +
              std::to_string(snap_.input_bytes) +
              " bytes holds unless one memoized list or dict is referenced many times; refused",
          -1};
    }
    records_budget_ -= n;
    return Status::Ok();
  }

  // A batch of trace entries whose events follow on from the list's run (or start one in an empty
  // list): recorded as the run. false: the list is left as it is.
  bool appendEventRun(uint32_t list, size_t from) {
    size_t count = stack_.size() - from;
    Node& n = nodes_[list];
    bool fresh = n.kind == NK::List && n.ref == kNoStore;
    if (count == 0 || (!fresh && n.kind != NK::EventList)) return false;
    const Value& first = stack_[from];
    if (first.kind != VK::Node || nodes_[first.id].kind != NK::Event) return false;
    uint32_t e0 = nodes_[first.id].ref;
    if (!fresh) {
      const EventRun& r = event_runs_[n.ref];
      if (static_cast<uint64_t>(r.first) + r.count != e0) return false;
    }
    for (size_t k = 1; k < count; ++k) {
      const Value& v = stack_[from + k];
      if (v.kind != VK::Node || nodes_[v.id].kind != NK::Event || nodes_[v.id].ref != e0 + k)
        return false;
    }
    if (fresh) {
      grow(event_runs_);
      event_runs_.push_back(EventRun{e0, 0});
      n.kind = NK::EventList;
      n.ref = static_cast<uint32_t>(event_runs_.size() - 1);
    }
    event_runs_[n.ref].count += static_cast<uint32_t>(count);
    return true;
  }
  // An EventList as the generic List it stands for. Its items are new Event nodes of the same
  // events: an entry node is never changed after makeEvent, so a copy stands for it everywhere
  // (kind, event index, the refusal of a second fill).
  void materialize(uint32_t list) {
    if (nodes_[list].kind != NK::EventList) return;
    EventRun r = event_runs_[nodes_[list].ref];
    nodes_[list].kind = NK::List;
    nodes_[list].ref = kNoStore;
    Items items{ArenaAllocator<Value>(&arena_)};
    items.reserve(r.count);
    for (uint32_t e = r.first; e < r.first + r.count; ++e) {
      uint32_t copy = newNode(NK::Event);
      nodes_[copy].ref = e;
      items.push_back(Value::node(copy));
    }
    itemsOf(list).swap(items);
  }

  // -- conversion (section 3)
  Status convert(const Value& root);
  Status convertSegments(const Value& list, const char* path);
  Status convertTraces(const Value& v);
  Status convertSettings(const Value& v);
  Status convertAnnotations(const Value& v);
  const Value* field(const Items& dict, StrId key) const;
  // The items of a generic container of the given kind, or nullptr.
  const Items* asNode(const Value& v, NK kind) {
    if (kind == NK::List && v.kind == VK::Node) materialize(v.id);
    if (v.kind != VK::Node || nodes_[v.id].kind != kind) return nullptr;
    return &itemsOf(v.id);
  }
  // A device trace list as a run of events, when it is one (else nullptr).
  const EventRun* eventRunOf(const Value& v) const {
    if (v.kind != VK::Node || nodes_[v.id].kind != NK::EventList) return nullptr;
    return &event_runs_[nodes_[v.id].ref];
  }
  Expected<uint64_t> getU64(const Items& dict, StrId key, const Where& path, bool required,
                            uint64_t dflt = 0) const;
  Expected<int64_t> getI64(const Items& dict, StrId key, const Where& path, bool required,
                           int64_t dflt = 0) const;

  const uint8_t* p_;
  const uint8_t* begin_;
  const uint8_t* end_;
  const PickleReadOptions& opt_;
  Snapshot snap_;
  Keys keys_;
  ValueStack stack_;
  std::vector<size_t> marks_;
  // The memo (see memoAt): 32-bit entries until a payload needs more than 30 bits, then 64-bit.
  std::vector<uint32_t> memo32_;
  std::vector<uint64_t> memo64_;
  bool memo_wide_ = false;
  std::vector<Value> memo_other_;
  std::vector<Node> nodes_;
  // Before store_: destroyed after it.
  ItemArena arena_;
  // A deque: materialize() adds stores during the conversion, while it holds pointers to others.
  std::deque<Items> store_;
  std::map<std::pair<uint64_t, uint64_t>, uint32_t> pool_index_;
  std::vector<Event> events_;
  std::vector<EventRun> event_runs_;               // runs of EventList nodes
  std::vector<std::vector<FrameId>> open_stacks_;  // frames of OpenStack nodes
  std::vector<FrameId> scratch_;
  uint64_t memo_budget_ = 0;     // kMemoEntriesPerInputByte
  uint64_t frames_budget_ = 0;   // kStackFramesPerInputByte: frames left to intern
  uint64_t records_budget_ = 0;  // kRecordsPerInputByte: records left to convert
  uint64_t bad_time_us_ = 0;     // trace entries / annotations whose time_us is out of range
  std::unordered_set<StrId> ignored_seen_;
  // The fast path's key/value pairs of one trace entry (PyTorch writes at most 10 keys).
  static constexpr size_t kFastMaxItems = 32;
  Value fast_kv_[kFastMaxItems];
  PickleReadStats stats_;
  int64_t op_offset_ = 0;
  uint8_t op_ = 0;
  uint32_t dicts_to_report_ = kPrefetchEveryDicts;
  // The fast path's frames runs (fastFrames): the bytes between a frames list's MARK and APPENDS,
  // when they are only memo fetches, by hash -> the stack they were interned as. Valid while no
  // memo slot is rebound (memoPut clears it): the slots hold frame nodes, which never change, and
  // a fallback's memo truncation only cuts slots pushed during that attempt, never a frame's.
  struct FramesRun {
    uint64_t offset = 0;  // of the run's first byte in the input
    uint32_t len = 0;
    uint32_t frames = 0;  // fetches in the run (the frames budget it charges)
    StackId stack = 0;
  };
  static constexpr size_t kMaxFramesRuns = size_t{1} << 16;  // cached runs at most
  U64Map<FramesRun> frames_runs_;
  // In front of frames_runs_: the last run met whose first 8 bytes were these, by those bytes
  // (direct-mapped, kFramesGuesses slots, allocated at the first run). A run with the same bytes
  // for the guess's length, followed by APPENDS, is the same plain run of fetches, so it is what
  // frames_runs_ holds for it: found without the scan and the hash of the whole run, and compared
  // with its latest occurrence (close behind, in the cache) instead of its first. A guess holds
  // while runs_gen_ is the one it was made under; every memo rebind (memoPut) ends them all.
  struct FramesGuess {
    uint64_t head = 0;  // the run's first 8 bytes
    uint64_t gen = 0;   // runs_gen_ when made; 0: empty
    uint64_t offset = 0;
    uint32_t len = 0;
    uint32_t frames = 0;
    StackId stack = 0;
  };
  static constexpr size_t kFramesGuessBits = 12;
  std::vector<FramesGuess> frames_guess_;
  uint64_t runs_gen_ = 1;
  FramesGuess& guessFor(uint64_t head) {
    if (frames_guess_.empty()) frames_guess_.resize(size_t{1} << kFramesGuessBits);
    return frames_guess_[(head * 0x9E3779B97F4A7C15ULL) >> (64 - kFramesGuessBits)];
  }
  // Parsed action strings, by StrId (direct-mapped; a StrId's string never changes).
  struct ActionOf {
    StrId id = ~StrId{0};
    Action action = Action::Unknown;
  };
  static constexpr size_t kActionCache = 16;
  ActionOf action_of_[kActionCache];
  Action actionOf(StrId id) {
    ActionOf& cached = action_of_[id % kActionCache];
    if (cached.id != id) {
      auto a = parseAction(snap_.strings.get(id));
      cached = ActionOf{id, a ? *a : Action::Unknown};
    }
    return cached.action;
  }
  // The Event field a trace entry's key names (fieldOf); Other: a key makeEvent ignores.
  enum class Field : uint8_t {
    Action,
    Addr,
    DeviceFree,
    Size,
    Stream,
    TimeUs,
    Frames,
    CompileContext,
    UserMetadata,
    PoolId,
    Other
  };
  Field fieldOf(StrId key) const;
  // How a value fits its field (applyField).
  enum class Fit : uint8_t {
    Ok,
    Refused,  // an error for makeEvent (refusedField says which), a fallback for the fast paths
    BadTime   // a time_us out of range: makeEvent keeps "no time" and counts it
  };
  // The one place a trace entry's value lands in its Event (and the snapshot's traits), for
  // makeEvent and the shaped path alike. Not for Frames (each path resolves its stack: stackOf)
  // nor PoolId (makeEvent only). Defined inline in pickle_entry.cc, where its callers are.
  Fit applyField(Field f, const Value& v, Event& e, EventNotes& notes);
  Status refusedField(Field f, const Value& v) const;
  static const char* numericFieldKey(Field f);  // the key of a field that holds a number
  // The shaped path's entry shape (fastShaped): the key strings of the last trace entry the fast
  // path read whose keys were all distinct Event fields, in file order, and the field each names.
  // Nothing in it can go stale: every entry read by it fetches each key from the memo and compares
  // the StrId found there with the shape's, so a rebound memo slot, another key order, an extra or
  // a missing key is a mismatch that leaves the entry to fastEntry.
  static constexpr size_t kShapeKeys = 12;  // keys of one shape at most (PyTorch writes 7-9)
  uint32_t shape_keys_ = 0;                 // 0: no shape yet
  StrId shape_key_[kShapeKeys] = {};
  Field shape_field_[kShapeKeys] = {};
  // Last: destroyed first, so its thread has stopped before the input may be unmapped.
  InputPrefetcher input_prefetch_{begin_, end_};
};

}  // namespace memforensics::format::pickle_detail
