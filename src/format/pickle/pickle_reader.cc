// pickle_reader.cc: the data-only pickle machine and the conversion of its result into a Snapshot.
//
// Layout of this file:
//   1. Values and nodes: the pickle machine's stack items. A Value is 16 bytes; containers are
//      Nodes in one vector, referred to by index, so memo entries share them.
//   2. The machine: one loop over opcodes. Containers are reduced to frames, stacks and events at
//      the moment they are filled (SETITEMS / APPENDS), see reduceDict / reduceList.
//   3. Conversion of the root object into the Snapshot model, with a path in every error
//      ("segments[3].blocks[7]: ...").
#include "format/pickle/pickle_reader.h"

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

namespace memforensics::format {

namespace {

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
const char* aKind(const Value& v, const std::vector<Node>& nodes) {
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

bool executesCode(uint8_t op) {
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
  bool fastMemo(const uint8_t*& p, uint64_t enc);
  bool fastFrames(const uint8_t*& p, Value& out);
  bool skipFrames(const uint8_t*& p) const;
  bool fastShaped();
  void recordShape(size_t count);
  // A memo fetch at p (BINGET / LONG_BINGET): its memo entry in m (0 for an unset slot).
  __attribute__((always_inline)) bool shapedFetch(const uint8_t*& p, uint64_t& m) const {
    const auto left = end_ - p;
    if (left >= 5 && *p == LONG_BINGET) {
      uint32_t idx;
      std::memcpy(&idx, p + 1, 4);
      m = memoAt(idx);
      p += 5;
      return true;
    }
    if (left >= 2 && *p == BINGET) {
      m = memoAt(p[1]);
      p += 2;
      return true;
    }
    return false;
  }

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
  // makeEvent's parsed action strings, by StrId (direct-mapped; a StrId's string never changes).
  struct ActionOf {
    StrId id = ~StrId{0};
    Action action = Action::Unknown;
  };
  static constexpr size_t kActionCache = 16;
  ActionOf action_of_[kActionCache];
  // The shaped path's entry shape (fastShaped): the key strings of the last trace entry the fast
  // path read whose keys were all distinct Event fields, in file order, and the field each names.
  // Nothing in it can go stale: every entry read by it fetches each key from the memo and compares
  // the StrId found there with the shape's, so a rebound memo slot, another key order, an extra or
  // a missing key is a mismatch that leaves the entry to fastEntry.
  enum class Field : uint8_t {
    Action,
    Addr,
    DeviceFree,
    Size,
    Stream,
    TimeUs,
    Frames,
    CompileContext,
    UserMetadata
  };
  static constexpr size_t kShapeKeys = 12;  // keys of one shape at most (PyTorch writes 7-9)
  uint32_t shape_keys_ = 0;                 // 0: no shape yet
  StrId shape_key_[kShapeKeys] = {};
  Field shape_field_[kShapeKeys] = {};
  bool shape_time_us_ = false, shape_compile_context_ = false, shape_user_metadata_ = false;
  // Last: destroyed first, so its thread has stopped before the input may be unmapped.
  InputPrefetcher input_prefetch_{begin_, end_};
};

const Value* Machine::field(const Items& dict, StrId key) const {
  const auto& it = dict;
  for (size_t i = 0; i + 1 < it.size(); i += 2) {
    if (it[i].kind == VK::Str && it[i].id == key) return &it[i + 1];
  }
  return nullptr;
}

Status Machine::pushString(uint64_t len) {
  if (static_cast<uint64_t>(end_ - p_) < len) return truncated("the string body");
  std::string_view s(reinterpret_cast<const char*>(p_), len);
  p_ += len;
  stack_.push_back(Value::str(snap_.strings.intern(s)));
  return Status::Ok();
}

Status Machine::pushLong(uint64_t n) {
  if (static_cast<uint64_t>(end_ - p_) < n) return truncated("the integer bytes");
  const uint8_t* b = p_;
  p_ += n;
  stack_.push_back(longValue(b, n));
  return Status::Ok();
}

// The value of a LONG1/LONG4 operand: n little-endian two's-complement bytes.
Value longValue(const uint8_t* b, uint64_t n) {
  if (n == 0) return Value::integer(0);
  bool negative = (b[n - 1] & 0x80) != 0;
  // Strip redundant sign-extension bytes, then decide what fits.
  uint64_t len = n;
  while (len > 1 && b[len - 1] == (negative ? 0xFF : 0x00) &&
         ((b[len - 2] & 0x80) != 0) == negative) {
    --len;
  }
  if (!negative && len == 9 && b[8] == 0) len = 8;  // fits as unsigned 64-bit
  if (len > 8) return Value::bigint();
  uint64_t u = 0;
  for (uint64_t k = 0; k < len; ++k) u |= uint64_t{b[k]} << (8 * k);
  if (negative) {
    if (len < 8) u |= ~uint64_t{0} << (8 * len);
    return Value::integer(static_cast<int64_t>(u));
  }
  return Value::uinteger(u);
}

Expected<uint32_t> Machine::targetContainer(size_t below, NK want) {
  if (below == 0 || below > stack_.size()) {
    return err(std::string(pickleOpcodeName(op_)) + " has no container to fill");
  }
  const Value& t = stack_[below - 1];
  if (t.kind != VK::Node) {
    return err(std::string(pickleOpcodeName(op_)) + " targets " + aKind(t, nodes_) +
               ", expected a " + (want == NK::Dict ? "dict" : "list"));
  }
  NK k = nodes_[t.id].kind;
  bool ok = k == want ||
            (want == NK::List && (k == NK::Stack || k == NK::OpenStack || k == NK::EventList)) ||
            (want == NK::Dict && (k == NK::Frame || k == NK::Event));
  if (!ok) {
    return err(std::string(pickleOpcodeName(op_)) + " targets " + aKind(t, nodes_) +
               ", expected a " + (want == NK::Dict ? "dict" : "list"));
  }
  return t.id;
}

Expected<StackId> Machine::stackOf(const Value& v, const Where& where) {
  if (v.kind == VK::Node) {
    Node& n = nodes_[v.id];
    if (n.kind == NK::Stack) return StackId{n.ref};
    if (n.kind == NK::OpenStack) {  // first reference: intern it now, once
      std::vector<FrameId>& frames = open_stacks_[n.ref];
      Status s = chargeFrames(frames.size());
      if (!s.ok()) return s.error();
      n.kind = NK::Stack;
      n.ref = snap_.stacks.internStack(frames);
      std::vector<FrameId>().swap(frames);
      return StackId{n.ref};
    }
    if (n.kind == NK::List && itemsEmpty(v.id)) return kEmptyStack;
  }
  if (v.kind == VK::None) return kNoStack;
  return err(where.str() + ": `frames` is " + aKind(v, nodes_) +
             ", expected a list of {filename, line, name} dicts");
}

// APPEND / APPENDS: move stack_[from..] into the list. A list that holds only frames is interned
// when its first batch arrives; a second batch turns it into an OpenStack that collects FrameIds
// (however many APPEND/APPENDS follow) and is interned once more, when first referenced or stored
// in a parent (stackOf, sealOpenStacks), never once per APPEND. Other lists stay generic.
Status Machine::appendItems(uint32_t list, size_t from) {
  size_t count = stack_.size() - from;
  Node& n = nodes_[list];
  bool all_frames = count > 0;
  bool fresh = n.kind == NK::List && itemsEmpty(list);
  for (size_t k = from; k < stack_.size() && all_frames; ++k) {
    const Value& v = stack_[k];
    all_frames = v.kind == VK::Node && nodes_[v.id].kind == NK::Frame;
  }
  if (n.kind == NK::Stack || n.kind == NK::OpenStack || (all_frames && fresh)) {
    if (!all_frames && count > 0) {
      return err("a frames list gets a non-frame element (" +
                 std::string(aKind(stack_[from], nodes_)) + ")");
    }
    if (fresh) {
      // The first batch is interned at once, as it always was: a list that one APPENDS fills (any
      // list under 1000 frames) keeps its stack id in file order. Later batches collect.
      scratch_.clear();
      for (size_t k = from; k < stack_.size(); ++k) scratch_.push_back(nodes_[stack_[k].id].ref);
      Status s = chargeFrames(scratch_.size());
      if (!s.ok()) return s;
      n.kind = NK::Stack;
      n.ref = snap_.stacks.internStack(scratch_);
      stack_.resize(from);
      return Status::Ok();
    }
    if (n.kind != NK::OpenStack) {
      uint32_t open = static_cast<uint32_t>(open_stacks_.size());
      open_stacks_.emplace_back();
      if (n.kind == NK::Stack) {  // a second batch, or appended to after a use: copy it out again
        auto old = snap_.stacks.stack(n.ref);
        Status s = chargeFrames(old.size());
        if (!s.ok()) return s;
        open_stacks_.back().assign(old.begin(), old.end());
      }
      n.kind = NK::OpenStack;
      n.ref = open;
    }
    std::vector<FrameId>& frames = open_stacks_[n.ref];
    for (size_t k = from; k < stack_.size(); ++k) frames.push_back(nodes_[stack_[k].id].ref);
  } else {
    if (appendEventRun(list, from)) {
      stack_.resize(from);
      return Status::Ok();
    }
    materialize(list);
    Status sealed = sealOpenStacks(from);
    if (!sealed.ok()) return sealed;
    Items& items = itemsOf(list);
    // A device's trace list holds millions of entries: it grows as the input predicts. Every
    // other container (a block, a segment, a 1,000,000-deep nest of lists) grows as a vector
    // does, or each would reserve growFor's floor of 4096 items (64 KiB): 4 GB on c9_deep_list.
    if (items.size() + count >= kPredictedGrowthItems) growItems(items, count);
    items.insert(items.end(), stack_.begin() + static_cast<ptrdiff_t>(from), stack_.end());
  }
  stack_.resize(from);
  return Status::Ok();
}

// SETITEM / SETITEMS: key/value pairs stack_[from..] go into the dict. A fresh dict with the shape
// of a frame or a trace entry is reduced at once and never stored as pairs.
Status Machine::setItems(uint32_t dict, size_t from) {
  size_t count = stack_.size() - from;
  if (count % 2 != 0) return err("SETITEMS with an odd number of stack items");
  Status sealed = sealOpenStacks(from);
  if (!sealed.ok()) return sealed;
  Node& n = nodes_[dict];
  if (n.kind != NK::Dict) return err("a frame or trace entry dict is filled twice (unsupported)");
  if (itemsEmpty(dict)) {
    Status s = reduceDict(dict, stack_.data() + from, count);
    if (!s.ok()) return s;
  }
  if (nodes_[dict].kind == NK::Dict) {
    for (size_t k = from; k < stack_.size(); k += 2) {
      if (stack_[k].kind == VK::Node) {
        return err(std::string("dict key is ") + aKind(stack_[k], nodes_) + " (unsupported)");
      }
    }
    Items& items = itemsOf(dict);
    items.insert(items.end(), stack_.begin() + static_cast<ptrdiff_t>(from), stack_.end());
  }
  stack_.resize(from);
  return Status::Ok();
}

Status Machine::reduceDict(uint32_t n, const Value* kv, size_t count) {
  const Value* filename = nullptr;
  const Value* line = nullptr;
  const Value* name = nullptr;
  bool has_action = false;
  for (size_t k = 0; k + 1 < count; k += 2) {
    if (kv[k].kind != VK::Str) continue;
    StrId key = kv[k].id;
    if (key == keys_.action)
      has_action = true;
    else if (key == keys_.filename)
      filename = &kv[k + 1];
    else if (key == keys_.line)
      line = &kv[k + 1];
    else if (key == keys_.name)
      name = &kv[k + 1];
  }
  if (has_action) return makeEvent(n, kv, count);
  if (filename && line && name && count <= 16) {
    if (filename->kind != VK::Str || name->kind != VK::Str ||
        (line->kind != VK::Int && line->kind != VK::UInt)) {
      return err("frame dict with filename/line/name of the wrong types");
    }
    Frame f{filename->id, name->id, static_cast<uint64_t>(line->i)};
    nodes_[n].kind = NK::Frame;
    nodes_[n].ref = snap_.stacks.internFrame(f);
  }
  return Status::Ok();
}

Status Machine::makeEvent(uint32_t n, const Value* kv, size_t count) {
  Event e;
  // Integers must fit their field: a negative size or address is refused, never wrapped to 2^64-n.
  // No Status per key (it holds a string): the error is built only when one is returned.
  auto asU64 = [](const Value& v, uint64_t& out) -> bool {
    if (v.kind == VK::UInt || (v.kind == VK::Int && v.i >= 0)) {
      out = static_cast<uint64_t>(v.i);
      return true;
    }
    return false;
  };
  auto notU64 = [&](const Value& v, const char* key) -> Status {
    if (v.kind == VK::Int) {
      return err(std::string("trace entry `") + key + "` is negative (" + std::to_string(v.i) +
                 ")");
    }
    return err(std::string("trace entry `") + key + "` is " + aKind(v, nodes_) +
               ", expected a non-negative int");
  };
  EventNotes notes;
  bool have_action = false;
  for (size_t k = 0; k + 1 < count; k += 2) {
    const Value& key = kv[k];
    const Value& v = kv[k + 1];
    if (key.kind != VK::Str) continue;
    StrId id = key.id;
    if (id == keys_.action) {
      if (v.kind != VK::Str) return err("trace entry `action` is not a string");
      ActionOf& cached = action_of_[v.id % kActionCache];
      if (cached.id != v.id) {
        auto a = parseAction(snap_.strings.get(v.id));
        cached = ActionOf{v.id, a ? *a : Action::Unknown};
      }
      e.action = cached.action;
      notes.action_name = e.action == Action::Unknown ? v.id : kEmptyStr;
      have_action = true;
      if (e.action == Action::Annotate) snap_.traits.has_annotate_action = true;
    } else if (id == keys_.addr) {
      if (!asU64(v, e.addr)) return notU64(v, "addr");
    } else if (id == keys_.device_free) {
      if (!asU64(v, e.addr)) return notU64(v, "device_free");
    } else if (id == keys_.size) {
      if (!asU64(v, e.size)) return notU64(v, "size");
    } else if (id == keys_.stream) {
      if (v.kind != VK::Int) {  // a signed 64-bit cudaStream_t
        return err(std::string("trace entry `stream` is ") + aKind(v, nodes_) +
                   (v.kind == VK::UInt ? " beyond the signed 64-bit range" : ", expected an int"));
      }
      e.stream = v.i;
    } else if (id == keys_.time_us) {
      snap_.traits.has_time_us = true;
      uint64_t u = 0;
      if (v.kind == VK::Int && v.i < 0) {
        ++bad_time_us_;  // kept as "no time" (-1), and counted in a load warning
      } else if (v.kind == VK::UInt) {
        ++bad_time_us_;
      } else {
        if (!asU64(v, u)) return notU64(v, "time_us");
        e.time_us = static_cast<int64_t>(u);
      }
    } else if (id == keys_.frames) {
      auto st = stackOf(v, Where{"trace entry"});
      if (!st) return st.error();
      e.stack = *st;
    } else if (id == keys_.compile_context) {
      if (v.kind == VK::Str) notes.compile_context = v.id;
      snap_.traits.has_compile_context = true;
    } else if (id == keys_.user_metadata) {
      if (v.kind == VK::Str) notes.user_metadata = v.id;
      snap_.traits.has_user_metadata = true;
    } else if (id == keys_.pool_id) {
      snap_.traits.has_pool_id = true;
      if (v.kind == VK::Node && (nodes_[v.id].kind == NK::Tuple || nodes_[v.id].kind == NK::List) &&
          itemsOf(v.id).size() == 2) {
        const auto& t = itemsOf(v.id);
        if ((t[0].kind == VK::Int || t[0].kind == VK::UInt) &&
            (t[1].kind == VK::Int || t[1].kind == VK::UInt)) {
          std::pair<uint64_t, uint64_t> key{static_cast<uint64_t>(t[0].i),
                                            static_cast<uint64_t>(t[1].i)};
          auto [it, fresh] =
              pool_index_.try_emplace(key, static_cast<uint32_t>(snap_.pools.size()));
          if (fresh) snap_.pools.push_back(key);
          e.pool = it->second;
        }
      }
    }
  }
  if (!have_action) return err("trace entry without an action");
  e.notes = snap_.event_notes.intern(notes);
  nodes_[n].kind = NK::Event;
  nodes_[n].ref = static_cast<uint32_t>(events_.size());
  grow(events_, 1);
  events_.push_back(e);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// 2b. The trace-entry fast path
//
// Most of a snapshot is trace entries: {action, addr, size, stream, time_us, compile_context,
// frames} with memoized key strings, and a fresh frames list whose items are memo fetches of frame
// dicts met before. The generic machine pushes every key and value on its stack, dispatches every
// opcode through the main switch, and moves the frames through appendItems. fastEntry() reads such
// a dict with one loop straight from the bytes into a small array and hands it to the same
// makeEvent, making the same nodes, memo entries, interned strings and stacks in the same order as
// the generic machine would. It is tried at every EMPTY_DICT whose first key is `action`; it
// gives up on anything it does not read itself (see PickleReadOptions::fast_path) and then undoes
// what it did: the memo and the nodes are cut back, the frames budget restored. What it cannot
// undo is harmless: strings and stacks it interned are interned again, at the same points and so
// under the same ids, by the generic machine reading the same bytes.

// A hash of a frames run's bytes (fastFrames).
uint64_t runHash(const uint8_t* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t x;
    std::memcpy(&x, p, 8);
    h = (h ^ x) * 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
  }
  if (n > 0) {
    uint64_t x = 0;
    std::memcpy(&x, p, n);
    h = (h ^ x) * 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 29;
  }
  return h;
}

// FRAME opcodes (protocol 4 framing) before an object: checked as the main loop checks them.
bool Machine::skipFrames(const uint8_t*& p) const {
  while (p < end_ && *p == FRAME) {
    uint64_t len;
    if (end_ - p < 9) return false;
    std::memcpy(&len, p + 1, 8);
    p += 9;
    if (len > static_cast<uint64_t>(end_ - p)) return false;
  }
  return true;
}

bool Machine::fastFetch(uint64_t idx, Value& out) const {
  uint64_t m = memoAt(idx);
  switch (m >> 32) {
    case 1:
      out = Value::str(static_cast<uint32_t>(m));
      return true;
    case 2:
      out = Value::node(static_cast<uint32_t>(m));
      return true;
    case 3:
      out = memo_other_[static_cast<uint32_t>(m)];
      return true;
    default:
      return false;  // unset: the generic machine reports it
  }
}

// An optional memo store of `enc` at p: MEMOIZE, or BINPUT / LONG_BINPUT of the next free index.
// false for a store this path does not undo (an overwrite, a gap) or past the memo budget.
bool Machine::fastMemo(const uint8_t*& p, uint64_t enc) {
  if (p >= end_) return true;  // the next read gives up
  // MEMOIZE into a narrow memo with room: what memoPush does, without its checks for growth.
  if (*p == MEMOIZE && !memo_wide_ && (enc & 0xffffffffu) <= kNarrowPayload &&
      memo32_.size() < memo32_.capacity() && memo32_.size() < memo_budget_) {
    memo32_.push_back(narrow(enc));
    p += 1;
    return true;
  }
  uint64_t idx;
  if (*p == MEMOIZE) {
    idx = memoSize();
    p += 1;
  } else if (*p == BINPUT) {
    if (end_ - p < 2) return false;
    idx = p[1];
    p += 2;
  } else if (*p == LONG_BINPUT) {
    if (end_ - p < 5) return false;
    uint32_t i;
    std::memcpy(&i, p + 1, 4);
    idx = i;
    p += 5;
  } else {
    return true;
  }
  if (idx != memoSize() || idx >= memo_budget_) return false;
  memoPush(enc);
  return true;
}

// After EMPTY_LIST: the list node, its memo store, and when a MARK follows, one batch of memo
// fetches of frame dicts closed by APPENDS, interned as appendItems interns a fresh list's first
// batch. A second batch or an APPEND is not a key, so the caller gives up on it.
bool Machine::fastFrames(const uint8_t*& p, Value& out) {
  uint32_t n = newNode(NK::List);
  out = Value::node(n);
  if (!fastMemo(p, uint64_t{2} << 32 | n)) return false;
  if (p >= end_ || *p != MARK) return true;  // an empty list
  ++p;
  // A run of plain fetches up to APPENDS, seen before: the same frame nodes, the same stack.
  const uint8_t* run = p;
  uint64_t head = 0;
  FramesGuess* guess = nullptr;
  if (opt_.frames_guess && end_ - run >= 8) {
    std::memcpy(&head, run, 8);
    guess = &guessFor(head);
    const FramesGuess& g = *guess;
    if (g.gen == runs_gen_ && g.head == head && static_cast<uint64_t>(end_ - run) > g.len &&
        run[g.len] == APPENDS && std::memcmp(begin_ + g.offset, run, g.len) == 0) {
      if (g.frames > frames_budget_) return false;  // chargeFrames refuses it
      frames_budget_ -= g.frames;
      nodes_[n].kind = NK::Stack;
      nodes_[n].ref = g.stack;
      guess->offset = static_cast<uint64_t>(run - begin_);
      p = run + g.len + 1;
      ++stats_.fast_frames_runs;
      ++stats_.fast_frames_guessed;
      return true;
    }
  }
  const uint8_t* q = p;
  uint32_t fetches = 0;
  for (;;) {
    const auto left = end_ - q;
    if (left >= 5 && *q == LONG_BINGET) {
      q += 5;
    } else if (left >= 2 && *q == BINGET) {
      q += 2;
    } else {
      break;
    }
    ++fetches;
  }
  const bool plain = fetches > 0 && q < end_ && *q == APPENDS;
  uint64_t hash = 0;
  if (plain) {
    const auto len = static_cast<size_t>(q - run);
    hash = runHash(run, len);
    if (const FramesRun* c = frames_runs_.find(hash);
        c != nullptr && c->len == len && std::memcmp(begin_ + c->offset, run, len) == 0) {
      if (c->frames > frames_budget_) return false;  // chargeFrames refuses it
      frames_budget_ -= c->frames;
      nodes_[n].kind = NK::Stack;
      nodes_[n].ref = c->stack;
      if (guess != nullptr) {
        *guess = FramesGuess{head,   runs_gen_, static_cast<uint64_t>(run - begin_),
                             c->len, c->frames, c->stack};
      }
      p = q + 1;
      ++stats_.fast_frames_runs;
      return true;
    }
  }
  scratch_.clear();
  for (;;) {
    if (!skipFrames(p) || p >= end_) return false;
    uint64_t idx;
    if (*p == BINGET) {
      if (end_ - p < 2) return false;
      idx = p[1];
      p += 2;
    } else if (*p == LONG_BINGET) {
      if (end_ - p < 5) return false;
      uint32_t i;
      std::memcpy(&i, p + 1, 4);
      idx = i;
      p += 5;
    } else if (*p == APPENDS) {
      ++p;
      break;
    } else {
      return false;  // a new frame dict, or anything else
    }
    uint64_t m = memoAt(idx);
    if ((m >> 32) != 2) return false;
    const Node& f = nodes_[static_cast<uint32_t>(m)];
    if (f.kind != NK::Frame) return false;
    scratch_.push_back(f.ref);
  }
  if (scratch_.empty() || !chargeFrames(scratch_.size()).ok()) return false;
  StackId id = snap_.stacks.internStack(scratch_);
  nodes_[n].kind = NK::Stack;
  nodes_[n].ref = id;
  if (plain && p == q + 1 && guess != nullptr && q - run <= INT32_MAX) {
    *guess = FramesGuess{
        head,    runs_gen_, static_cast<uint64_t>(run - begin_), static_cast<uint32_t>(q - run),
        fetches, id};
  }
  if (plain && p == q + 1 && frames_runs_.size() < kMaxFramesRuns && q - run <= INT32_MAX) {
    frames_runs_.insert(hash, FramesRun{static_cast<uint64_t>(run - begin_),
                                        static_cast<uint32_t>(q - run), fetches, id});
  }
  return true;
}

// One key or value: a memo fetch, a string, an int, None, a bool, a float, or a frames list.
bool Machine::fastValue(const uint8_t*& p, Value& out) {
  if (!skipFrames(p) || p >= end_) return false;
  const uint8_t op = *p++;
  const auto left = static_cast<uint64_t>(end_ - p);
  switch (op) {
    case BINGET:
      if (left < 1) return false;
      return fastFetch(*p++, out);
    case LONG_BINGET: {
      if (left < 4) return false;
      uint32_t i;
      std::memcpy(&i, p, 4);
      p += 4;
      return fastFetch(i, out);
    }
    case SHORT_BINUNICODE:
    case BINUNICODE: {
      uint64_t len;
      if (op == SHORT_BINUNICODE) {
        if (left < 1) return false;
        len = *p++;
      } else {
        if (left < 4) return false;
        uint32_t l;
        std::memcpy(&l, p, 4);
        len = l;
        p += 4;
      }
      if (static_cast<uint64_t>(end_ - p) < len) return false;
      StrId id = snap_.strings.intern(std::string_view(reinterpret_cast<const char*>(p), len));
      p += len;
      out = Value::str(id);
      return fastMemo(p, uint64_t{1} << 32 | id);
    }
    case EMPTY_LIST:
      return fastFrames(p, out);
    case BININT1:
      if (left < 1) return false;
      out = Value::integer(*p++);
      break;
    case BININT2: {
      if (left < 2) return false;
      uint16_t x;
      std::memcpy(&x, p, 2);
      p += 2;
      out = Value::integer(x);
      break;
    }
    case BININT: {
      if (left < 4) return false;
      int32_t x;
      std::memcpy(&x, p, 4);
      p += 4;
      out = Value::integer(x);
      break;
    }
    case LONG1: {
      if (left < 1) return false;
      uint64_t len = *p++;
      if (static_cast<uint64_t>(end_ - p) < len) return false;
      out = longValue(p, len);
      p += len;
      break;
    }
    case BINFLOAT: {
      if (left < 8) return false;
      uint64_t bits;
      std::memcpy(&bits, p, 8);
      p += 8;
      bits = __builtin_bswap64(bits);
      double d;
      std::memcpy(&d, &bits, 8);
      out = Value::flt(d);
      break;
    }
    case NONE:
      out = Value::none();
      break;
    case NEWTRUE:
      out = Value::boolean(true);
      break;
    case NEWFALSE:
      out = Value::boolean(false);
      break;
    default:
      return false;
  }
  // A scalar the generic machine would keep in memo_other_: not this path's business.
  return p >= end_ || (*p != MEMOIZE && *p != BINPUT && *p != LONG_BINPUT);
}

// A key at p (FRAME opcodes already skipped): almost always a memo fetch of an interned string,
// read here without fastValue's dispatch; anything else goes through fastValue. Either way the
// key must be a string.
bool Machine::fastKey(const uint8_t*& p, Value& out) {
  const auto left = static_cast<uint64_t>(end_ - p);
  uint64_t m = 0;
  if (left >= 2 && *p == BINGET) {
    m = memoAt(p[1]);
    if ((m >> 32) == 1) p += 2;
  } else if (left >= 5 && *p == LONG_BINGET) {
    uint32_t i;
    std::memcpy(&i, p + 1, 4);
    m = memoAt(i);
    if ((m >> 32) == 1) p += 5;
  }
  if ((m >> 32) == 1) {
    out = Value::str(static_cast<uint32_t>(m));
    return true;
  }
  return fastValue(p, out) && out.kind == VK::Str;
}

// ---------------------------------------------------------------------------------------------
// 2c. The shaped path
//
// Most trace entries have the keys of the entry before them, in the same order, each a memo fetch
// of the same interned string. fastShaped() reads such an entry with the keys of the last one
// fastEntry read (shape_key_): it checks each key's memo entry against the shape and decodes each
// value straight into its Event field, with no key/value array and no per-key dispatch. It takes
// only the common forms (memo-fetched strings, small ints, frames lists, None) and checks per field
// what makeEvent checks; on anything else (another key or one more, a FRAME opcode, a negative
// time, a value of another type, a memo store after a value, a truncated operand) it undoes what it
// did as fastEntry undoes itself and leaves the entry to fastEntry, so the events, nodes, memo,
// stacks and errors are the ones fastEntry (and the generic machine) make.

// A BININT1 / BININT2 / BININT / LONG1 at p, as the generic machine reads it.
inline __attribute__((always_inline)) bool shapedInt(const uint8_t*& p, const uint8_t* end,
                                                     Value& v) {
  if (p >= end) return false;
  const auto left = static_cast<uint64_t>(end - p - 1);
  switch (*p) {
    case BININT1:
      if (left < 1) return false;
      v = Value::integer(p[1]);
      p += 2;
      return true;
    case BININT2: {
      if (left < 2) return false;
      uint16_t x;
      std::memcpy(&x, p + 1, 2);
      v = Value::integer(x);
      p += 3;
      return true;
    }
    case BININT: {
      if (left < 4) return false;
      int32_t x;
      std::memcpy(&x, p + 1, 4);
      v = Value::integer(x);
      p += 5;
      return true;
    }
    case LONG1: {
      if (left < 1) return false;
      const uint64_t len = p[1];
      if (left - 1 < len) return false;
      const uint8_t* b = p + 2;
      if (len >= 1 && len <= 8 && (b[len - 1] & 0x80) == 0 && end - b >= 8) {
        uint64_t u;
        std::memcpy(&u, b, 8);  // little-endian, below 2^63: what longValue makes of it
        if (len < 8) u &= (uint64_t{1} << (8 * len)) - 1;
        v = Value::integer(static_cast<int64_t>(u));
      } else {
        v = longValue(b, len);
      }
      p = b + len;
      return true;
    }
    default:
      return false;
  }
}

void Machine::recordShape(size_t count) {
  const size_t keys = count / 2;
  if (keys == 0 || keys > kShapeKeys) return;
  StrId key[kShapeKeys];
  Field field[kShapeKeys];
  for (size_t k = 0; k < keys; ++k) {
    const StrId id = fast_kv_[2 * k].id;  // fastKey made every key a string
    for (size_t j = 0; j < k; ++j) {
      if (key[j] == id) return;  // a duplicate key: makeEvent's last-one-wins, not shaped
    }
    if (id == keys_.action)
      field[k] = Field::Action;
    else if (id == keys_.addr)
      field[k] = Field::Addr;
    else if (id == keys_.device_free)
      field[k] = Field::DeviceFree;
    else if (id == keys_.size)
      field[k] = Field::Size;
    else if (id == keys_.stream)
      field[k] = Field::Stream;
    else if (id == keys_.time_us)
      field[k] = Field::TimeUs;
    else if (id == keys_.frames)
      field[k] = Field::Frames;
    else if (id == keys_.compile_context)
      field[k] = Field::CompileContext;
    else if (id == keys_.user_metadata)
      field[k] = Field::UserMetadata;
    else
      return;  // pool_id or a key makeEvent ignores: left to fastEntry
    key[k] = id;
  }
  std::copy(key, key + keys, shape_key_);
  std::copy(field, field + keys, shape_field_);
  shape_keys_ = static_cast<uint32_t>(keys);
  shape_time_us_ = std::find(field, field + keys, Field::TimeUs) != field + keys;
  shape_compile_context_ = std::find(field, field + keys, Field::CompileContext) != field + keys;
  shape_user_metadata_ = std::find(field, field + keys, Field::UserMetadata) != field + keys;
}

bool Machine::fastShaped() {
  if (shape_keys_ == 0) return false;
  const uint8_t* p = p_;  // just after EMPTY_DICT
  const uint8_t* const end = end_;
  const size_t memo0 = memoSize();
  const size_t nodes0 = nodes_.size();
  const uint64_t frames0 = frames_budget_;
  const uint32_t n = newNode(NK::Dict);
  Event e;
  EventNotes notes;
  bool ok = fastMemo(p, uint64_t{2} << 32 | n) && p < end && *p == MARK;
  if (ok) {
    ++p;
    for (uint32_t k = 0; k < shape_keys_ && ok; ++k) {
      uint64_t m = 0;
      if (!shapedFetch(p, m) || m != (uint64_t{1} << 32 | shape_key_[k])) {
        ok = false;
        break;
      }
      Value v;
      switch (shape_field_[k]) {
        case Field::Action: {
          if (!shapedFetch(p, m) || (m >> 32) != 1) {
            ok = false;
            break;
          }
          const auto id = static_cast<StrId>(m);
          ActionOf& cached = action_of_[id % kActionCache];
          if (cached.id != id) {
            auto a = parseAction(snap_.strings.get(id));
            cached = ActionOf{id, a ? *a : Action::Unknown};
          }
          e.action = cached.action;
          notes.action_name = e.action == Action::Unknown ? id : kEmptyStr;
          break;
        }
        case Field::Addr:
        case Field::DeviceFree:
          ok = shapedInt(p, end, v) && v.kind == VK::Int && v.i >= 0;
          e.addr = static_cast<uint64_t>(v.i);
          break;
        case Field::Size:
          ok = shapedInt(p, end, v) && v.kind == VK::Int && v.i >= 0;
          e.size = static_cast<uint64_t>(v.i);
          break;
        case Field::Stream:
          ok = shapedInt(p, end, v) && v.kind == VK::Int;
          e.stream = v.i;
          break;
        case Field::TimeUs:
          ok = shapedInt(p, end, v) && v.kind == VK::Int && v.i >= 0;
          e.time_us = v.i;
          break;
        case Field::Frames: {
          if (p < end && *p == EMPTY_LIST) {
            ++p;
            Value list;
            ok = fastFrames(p, list);
            if (!ok) break;
            const Node& node = nodes_[list.id];
            if (node.kind == NK::Stack)
              e.stack = node.ref;
            else if (node.kind == NK::List && node.ref == kNoStore)
              e.stack = kEmptyStack;
            else
              ok = false;
          } else if (p < end && *p == NONE) {
            ++p;
            e.stack = kNoStack;
          } else {
            ok = shapedFetch(p, m) && (m >> 32) == 2 &&
                 nodes_[static_cast<uint32_t>(m)].kind == NK::Stack;
            if (ok) e.stack = nodes_[static_cast<uint32_t>(m)].ref;
          }
          break;
        }
        case Field::CompileContext:
        case Field::UserMetadata: {
          StrId s = kEmptyStr;
          if (p < end && *p == NONE) {
            ++p;
          } else {
            ok = shapedFetch(p, m) && (m >> 32) == 1;
            s = static_cast<StrId>(m);
          }
          if (shape_field_[k] == Field::CompileContext)
            notes.compile_context = s;
          else
            notes.user_metadata = s;
          break;
        }
      }
    }
    ok = ok && p < end && *p == SETITEMS;
  }
  if (!ok) {
    memoTruncate(memo0);
    nodes_.resize(nodes0);
    frames_budget_ = frames0;
    return false;
  }
  ++p;
  // What makeEvent records besides the event: the traits of the keys read, set only now that the
  // entry is read (a fallback leaves them to the path that reads it).
  if (shape_time_us_) snap_.traits.has_time_us = true;
  if (shape_compile_context_) snap_.traits.has_compile_context = true;
  if (shape_user_metadata_) snap_.traits.has_user_metadata = true;
  if (e.action == Action::Annotate) snap_.traits.has_annotate_action = true;
  e.notes = snap_.event_notes.intern(notes);
  nodes_[n].kind = NK::Event;
  nodes_[n].ref = static_cast<uint32_t>(events_.size());
  grow(events_, 1);
  events_.push_back(e);
  ++stats_.fast_entries;
  ++stats_.fast_shaped;
  stack_.push_back(Value::node(n));
  p_ = p;
  return true;
}

bool Machine::fastEntry() {
  const uint8_t* p = p_;  // just after EMPTY_DICT
  const size_t memo0 = memoSize();
  const size_t nodes0 = nodes_.size();
  const uint64_t frames0 = frames_budget_;
  const uint32_t n = newNode(NK::Dict);
  bool entry = false;  // the first key was `action`
  bool ok = fastMemo(p, uint64_t{2} << 32 | n) && p < end_ && *p == MARK;
  size_t count = 0;
  if (ok) {
    ++p;
    for (;;) {
      if (!skipFrames(p) || p >= end_) {
        ok = false;
        break;
      }
      if (*p == SETITEMS) {
        ++p;
        break;
      }
      if (count + 2 > kFastMaxItems || !fastKey(p, fast_kv_[count])) {
        ok = false;
        break;
      }
      if (count == 0) {
        entry = fast_kv_[0].id == keys_.action;
        if (!entry) {
          ok = false;
          break;
        }
      }
      const Value& v = fast_kv_[count + 1];
      // An open frames list as a value: the generic machine seals (interns) it at SETITEMS
      // whatever its key; left to it.
      if (!fastValue(p, fast_kv_[count + 1]) ||
          (v.kind == VK::Node && nodes_[v.id].kind == NK::OpenStack)) {
        ok = false;
        break;
      }
      count += 2;
    }
    ok = ok && count > 0 && makeEvent(n, fast_kv_, count).ok();
  }
  if (!ok) {
    memoTruncate(memo0);
    nodes_.resize(nodes0);
    frames_budget_ = frames0;
    if (entry) ++stats_.fast_fallbacks;
    return false;
  }
  ++stats_.fast_entries;
  recordShape(count);
  stack_.push_back(Value::node(n));
  p_ = p;
  return true;
}

Expected<Snapshot> Machine::run() {
  snap_.input_bytes = static_cast<uint64_t>(end_ - begin_);
  memo_budget_ = kMemoEntriesPerInputByte * snap_.input_bytes;
  frames_budget_ = inputBudget(kStackFramesPerInputByte);
  records_budget_ = inputBudget(kRecordsPerInputByte);
  uint64_t next_progress = opt_.progress_interval;
  // Nothing is reserved from the input's size (a valid pickle padded with 1 GB of zeros is 1 GB
  // long): the big arrays grow geometrically from what was parsed, with huge pages once large.
  bool stopped = false;
  while (!stopped) {
    if (p_ >= end_) {
      op_offset_ = end_ - begin_;
      return err("input ends before the pickle's STOP opcode (file truncated?)");
    }
    op_offset_ = p_ - begin_;
    if (opt_.progress && static_cast<uint64_t>(op_offset_) >= next_progress) {
      // The prefetcher learns the position first: the callback may release the pages behind it
      // (load.cc), which a prefetcher that last heard of the parse 1024 dicts ago (EMPTY_DICT)
      // could otherwise map again.
      input_prefetch_.advance(p_);
      opt_.progress(static_cast<uint64_t>(op_offset_), snap_.input_bytes);
      next_progress = static_cast<uint64_t>(op_offset_) + opt_.progress_interval;
    }
    op_ = *p_++;
    switch (op_) {
      case BINGET: {
        uint8_t i;
        if (!readLE(i)) return truncated("the memo index");
        Status s = memoGet(i);
        if (!s.ok()) return s.error();
        break;
      }
      case LONG_BINGET: {
        uint32_t i;
        if (!readLE(i)) return truncated("the memo index");
        Status s = memoGet(i);
        if (!s.ok()) return s.error();
        break;
      }
      case MEMOIZE: {
        if (stack_.size() <= markBase()) return err("MEMOIZE with an empty stack");
        if (memoSize() >= memo_budget_) {
          return err("MEMOIZE beyond the " + std::to_string(memo_budget_) +
                     " memo entries an input of " + std::to_string(snap_.input_bytes) +
                     " bytes can store");
        }
        memoPush(memoEncode(stack_.back()));
        break;
      }
      case BINPUT: {
        uint8_t i;
        if (!readLE(i)) return truncated("the memo index");
        Status s = memoPut(i);
        if (!s.ok()) return s.error();
        break;
      }
      case LONG_BINPUT: {
        uint32_t i;
        if (!readLE(i)) return truncated("the memo index");
        Status s = memoPut(i);
        if (!s.ok()) return s.error();
        break;
      }
      case SHORT_BINUNICODE: {
        uint8_t n;
        if (!readLE(n)) return truncated("the string length");
        Status s = pushString(n);
        if (!s.ok()) return s.error();
        break;
      }
      case BINUNICODE: {
        uint32_t n;
        if (!readLE(n)) return truncated("the string length");
        Status s = pushString(n);
        if (!s.ok()) return s.error();
        break;
      }
      case BINUNICODE8: {
        uint64_t n;
        if (!readLE(n)) return truncated("the string length");
        Status s = pushString(n);
        if (!s.ok()) return s.error();
        break;
      }
      case BININT1: {
        uint8_t x;
        if (!readLE(x)) return truncated("the integer");
        stack_.push_back(Value::integer(x));
        break;
      }
      case BININT2: {
        uint16_t x;
        if (!readLE(x)) return truncated("the integer");
        stack_.push_back(Value::integer(x));
        break;
      }
      case BININT: {
        int32_t x;
        if (!readLE(x)) return truncated("the integer");
        stack_.push_back(Value::integer(x));
        break;
      }
      case LONG1: {
        uint8_t n;
        if (!readLE(n)) return truncated("the integer length");
        Status s = pushLong(n);
        if (!s.ok()) return s.error();
        break;
      }
      case LONG4: {
        int32_t n;
        if (!readLE(n)) return truncated("the integer length");
        if (n < 0) return err("LONG4 with a negative length");
        Status s = pushLong(static_cast<uint64_t>(n));
        if (!s.ok()) return s.error();
        break;
      }
      case BINFLOAT: {
        uint64_t bits;
        if (!readLE(bits)) return truncated("the float");
        bits = __builtin_bswap64(bits);  // BINFLOAT is big-endian
        double d;
        std::memcpy(&d, &bits, 8);
        stack_.push_back(Value::flt(d));
        break;
      }
      case NEWTRUE:
        stack_.push_back(Value::boolean(true));
        break;
      case NEWFALSE:
        stack_.push_back(Value::boolean(false));
        break;
      case NONE:
        stack_.push_back(Value::none());
        break;
      case MARK:
        marks_.push_back(stack_.size());
        break;
      case EMPTY_DICT:
        if (--dicts_to_report_ == 0) {
          dicts_to_report_ = kPrefetchEveryDicts;
          input_prefetch_.advance(p_);
        }
        if (opt_.fast_path && ((opt_.shaped_path && fastShaped()) || fastEntry())) break;
        stack_.push_back(Value::node(newNode(NK::Dict)));
        break;
      case EMPTY_LIST:
        stack_.push_back(Value::node(newNode(NK::List)));
        break;
      case EMPTY_TUPLE:
        stack_.push_back(Value::node(newNode(NK::Tuple)));
        break;
      case DICT:
      case LIST: {
        auto m = popMark();
        if (!m) return m.error();
        uint32_t n = newNode(op_ == DICT ? NK::Dict : NK::List);
        Status s = op_ == DICT ? setItems(n, *m) : appendItems(n, *m);
        if (!s.ok()) return s.error();
        stack_.push_back(Value::node(n));
        break;
      }
      case TUPLE:
      case TUPLE1:
      case TUPLE2:
      case TUPLE3: {
        size_t from;
        if (op_ == TUPLE) {
          auto m = popMark();
          if (!m) return m.error();
          from = *m;
        } else {
          size_t k = op_ == TUPLE1 ? 1 : op_ == TUPLE2 ? 2 : 3;
          if (stack_.size() < markBase() + k)
            return err(std::string(pickleOpcodeName(op_)) + " with too few stack items");
          from = stack_.size() - k;
        }
        Status sealed = sealOpenStacks(from);
        if (!sealed.ok()) return sealed.error();
        uint32_t n = newNode(NK::Tuple);
        if (from < stack_.size())
          itemsOf(n).assign(stack_.begin() + static_cast<ptrdiff_t>(from), stack_.end());
        stack_.resize(from);
        stack_.push_back(Value::node(n));
        break;
      }
      case APPEND: {
        if (stack_.size() < markBase() + 2) return err("APPEND with too few stack items");
        auto t = targetContainer(stack_.size() - 1, NK::List);
        if (!t) return t.error();
        Status s = appendItems(*t, stack_.size() - 1);
        if (!s.ok()) return s.error();
        break;
      }
      case APPENDS: {
        auto m = popMark();
        if (!m) return m.error();
        auto t = targetContainer(*m, NK::List);
        if (!t) return t.error();
        Status s = appendItems(*t, *m);
        if (!s.ok()) return s.error();
        break;
      }
      case SETITEM: {
        if (stack_.size() < markBase() + 3) return err("SETITEM with too few stack items");
        auto t = targetContainer(stack_.size() - 2, NK::Dict);
        if (!t) return t.error();
        Status s = setItems(*t, stack_.size() - 2);
        if (!s.ok()) return s.error();
        break;
      }
      case SETITEMS: {
        auto m = popMark();
        if (!m) return m.error();
        auto t = targetContainer(*m, NK::Dict);
        if (!t) return t.error();
        Status s = setItems(*t, *m);
        if (!s.ok()) return s.error();
        break;
      }
      case POP: {
        if (stack_.size() > markBase()) {
          stack_.pop_back();
        } else if (!marks_.empty() && stack_.size() == markBase()) {
          marks_.pop_back();  // POP of a MARK (allowed by CPython)
        } else {
          return err("POP on an empty stack");
        }
        break;
      }
      case POP_MARK: {
        auto m = popMark();
        if (!m) return m.error();
        stack_.resize(*m);
        break;
      }
      case DUP: {
        if (stack_.size() <= markBase()) return err("DUP on an empty stack");
        stack_.push_back(stack_.back());
        break;
      }
      case PROTO: {
        uint8_t v;
        if (!readLE(v)) return truncated("the protocol number");
        if (v < 2 || v > 5)
          return err("pickle protocol " + std::to_string(v) + " (supported: 2 to 5)");
        snap_.pickle_protocol = v;
        break;
      }
      case FRAME: {
        uint64_t len;
        if (!readLE(len)) return truncated("the frame length");
        if (len > static_cast<uint64_t>(end_ - p_)) return truncated("a FRAME");
        break;
      }
      case STOP:
        stopped = true;
        break;
      default: {
        if (executesCode(op_)) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op_);
          return err(std::string("refused opcode ") + pickleOpcodeName(op_) + " (" + hex +
                     "): it imports or calls code, which a memory snapshot never contains; this "
                     "file is not a plain-data snapshot and was not loaded");
        }
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op_);
        return err(std::string("unsupported opcode ") + pickleOpcodeName(op_) + " (" + hex +
                   "): not part of the snapshot data subset (is this a PyTorch memory snapshot?)");
      }
    }
  }
  if (!marks_.empty()) {
    return err("STOP with " + std::to_string(marks_.size()) +
               (marks_.size() == 1 ? " unclosed MARK" : " unclosed MARKs") +
               " (a MARK that no APPENDS, SETITEMS, TUPLE, LIST, DICT or POP_MARK closed)");
  }
  if (stack_.size() != 1) {
    return err("STOP with " + std::to_string(stack_.size()) +
               (stack_.size() == 1 ? " object" : " objects") +
               " on the stack (expected exactly 1)");
  }
  input_prefetch_.stop();
  stats_.input_prefetched_bytes = input_prefetch_.populatedBytes();
  if (opt_.progress) opt_.progress(snap_.input_bytes, snap_.input_bytes);
  if (opt_.stats != nullptr) *opt_.stats = stats_;
  Value root = stack_.back();
  stack_.clear();
  std::vector<uint32_t>().swap(memo32_);
  std::vector<uint64_t>().swap(memo64_);
  Status s = convert(root);
  if (!s.ok()) return s.error();
  return std::move(snap_);
}

// ---------------------------------------------------------------------------------------------
// 3. Conversion of the root object

Expected<uint64_t> Machine::getU64(const Items& dict, StrId key, const Where& where, bool required,
                                   uint64_t dflt) const {
  const Value* v = field(dict, key);
  if (v == nullptr || v->kind == VK::None) {
    if (required) {
      return Error{where.str() + ": missing key '" + std::string(snap_.strings.get(key)) + "'", -1};
    }
    return dflt;
  }
  if (v->kind == VK::Int && v->i < 0) {
    return Error{where.str() + "." + std::string(snap_.strings.get(key)) + " is negative (" +
                     std::to_string(v->i) + ")",
                 -1};
  }
  if (v->kind == VK::BigInt) {
    return Error{where.str() + "." + std::string(snap_.strings.get(key)) +
                     " is an int out of the 64-bit range (at most 2^64-1)",
                 -1};
  }
  if (v->kind != VK::Int && v->kind != VK::UInt) {
    return Error{where.str() + "." + std::string(snap_.strings.get(key)) + " is " +
                     aKind(*v, nodes_) + ", expected a non-negative int",
                 -1};
  }
  return static_cast<uint64_t>(v->i);
}

Expected<int64_t> Machine::getI64(const Items& dict, StrId key, const Where& where, bool required,
                                  int64_t dflt) const {
  const Value* v = field(dict, key);
  if (v == nullptr || v->kind == VK::None) {
    if (required) {
      return Error{where.str() + ": missing key '" + std::string(snap_.strings.get(key)) + "'", -1};
    }
    return dflt;
  }
  if (v->kind == VK::UInt || v->kind == VK::BigInt) {
    return Error{where.str() + "." + std::string(snap_.strings.get(key)) +
                     " is an int out of the signed 64-bit range",
                 -1};
  }
  if (v->kind != VK::Int) {
    return Error{where.str() + "." + std::string(snap_.strings.get(key)) + " is " +
                     aKind(*v, nodes_) + ", expected an int",
                 -1};
  }
  return v->i;
}

Status Machine::convert(const Value& root) {
  if (asNode(root, NK::List) != nullptr) {
    snap_.traits.top_level_list = true;
    return convertSegments(root, "segments");
  }
  const Items* top = asNode(root, NK::Dict);
  if (top == nullptr) {
    return Error{std::string("the pickle holds ") + aKind(root, nodes_) +
                     ", expected a snapshot dict or a list of segments",
                 -1};
  }
  const Value* segs = nullptr;
  const Value* traces = nullptr;
  for (size_t i = 0; i + 1 < top->size(); i += 2) {
    const Value& k = (*top)[i];
    const Value& v = (*top)[i + 1];
    if (k.kind != VK::Str) continue;
    if (k.id == keys_.segments)
      segs = &v;
    else if (k.id == keys_.device_traces)
      traces = &v;
    else if (k.id == keys_.allocator_settings) {
      snap_.traits.has_allocator_settings = true;
      const Items* sd = asNode(v, NK::Dict);
      Status s = chargeRecords(1 + (sd ? sd->size() / 2 : 0), "allocator_settings");
      if (!s.ok()) return s;
      s = convertSettings(v);
      if (!s.ok()) return s;
    } else if (k.id == keys_.external_annotations) {
      snap_.traits.has_annotations_key = true;
      Status s = convertAnnotations(v);
      if (!s.ok()) return s;
    } else if (k.id == keys_.host_traces) {
      snap_.traits.has_host_traces = true;
      if (const Items* n = asNode(v, NK::List)) snap_.host_trace_events = n->size();
    } else if (k.id == keys_.host_segments) {
      snap_.traits.has_host_traces = true;
    } else if (ignored_seen_.insert(k.id).second) {  // a key repeated in the dict is kept once
      snap_.ignored_keys.emplace_back(snap_.strings.get(k.id));
    }
  }
  if (segs == nullptr) return Error{"snapshot dict has no 'segments' key", -1};
  Status s = convertSegments(*segs, "segments");
  if (!s.ok()) return s;
  if (traces != nullptr) {
    snap_.traits.has_device_traces = true;
    s = convertTraces(*traces);
    if (!s.ok()) return s;
  }
  events_.clear();
  events_.shrink_to_fit();
  if (bad_time_us_ > 0) {
    snap_.load_warnings.push_back(
        std::to_string(bad_time_us_) +
        " time_us value(s) negative or beyond 2^63-1 (trace entries and annotations): read as "
        "'no time recorded'");
  }
  return Status::Ok();
}

Status Machine::convertSegments(const Value& v, const char* name) {
  const Items* list = asNode(v, NK::List);
  if (list == nullptr) {
    return Error{std::string("'") + name + "' is " + aKind(v, nodes_) + ", expected a list", -1};
  }
  for (size_t si = 0; si < list->size(); ++si) {
    const Where path{name, static_cast<int64_t>(si)};
    const Items* d = asNode((*list)[si], NK::Dict);
    if (d == nullptr) {
      return Error{
          path.str() + " is " + std::string(aKind((*list)[si], nodes_)) + ", expected a dict", -1};
    }
    Status charged = chargeRecords(1 + d->size() / 2, path.str());
    if (!charged.ok()) return charged;
    Segment seg;
    auto dev = getI64(*d, keys_.device, path, false, 0);
    if (!dev) return dev.error();
    seg.device = *dev;
    if (seg.device < 0 || seg.device > 1 << 16) {
      return Error{
          path.str() + ".device is " + std::to_string(seg.device) + ", not a device ordinal", -1};
    }
    auto addr = getU64(*d, keys_.address, path, true);
    if (!addr) return addr.error();
    seg.address = *addr;
    auto total = getU64(*d, keys_.total_size, path, true);
    if (!total) return total.error();
    seg.total_size = *total;
    for (auto [key, dst] : {std::pair{keys_.allocated_size, &seg.allocated_size},
                            std::pair{keys_.active_size, &seg.active_size},
                            std::pair{keys_.requested_size, &seg.requested_size}}) {
      auto x = getU64(*d, key, path, false, 0);
      if (!x) return x.error();
      *dst = *x;
    }
    auto stream = getI64(*d, keys_.stream, path, false, 0);
    if (!stream) return stream.error();
    seg.stream = *stream;
    if (const Value* t = field(*d, keys_.segment_type); t && t->kind == VK::Str) {
      seg.segment_type = t->id;
      seg.is_large = t->id != keys_.small;
    }
    if (const Value* e = field(*d, keys_.is_expandable); e && e->kind == VK::Bool) {
      seg.is_expandable = e->i != 0;
    }
    if (const Value* pool = field(*d, keys_.segment_pool_id)) {
      snap_.traits.has_segment_pool_id = true;
      const Items* t = asNode(*pool, NK::Tuple);
      if (t == nullptr) t = asNode(*pool, NK::List);  // the JSON form has no tuples
      if (t && t->size() == 2 && (*t)[0].kind == VK::Int && (*t)[1].kind == VK::Int) {
        seg.pool_a = static_cast<uint64_t>((*t)[0].i);
        seg.pool_b = static_cast<uint64_t>((*t)[1].i);
      }
    }
    if (const Value* f = field(*d, keys_.frames)) {
      auto st = stackOf(*f, path);
      if (!st) return Error{st.error().message, -1};
      seg.stack = *st;
    }
    const Value* bv = field(*d, keys_.blocks);
    const Items* blocks = bv ? asNode(*bv, NK::List) : nullptr;
    if (blocks == nullptr) return Error{path.str() + ": missing or malformed 'blocks' list", -1};
    seg.first_block = static_cast<uint32_t>(snap_.blocks.size());
    uint64_t cursor = seg.address;
    uint64_t covered = 0;
    for (size_t bi = 0; bi < blocks->size(); ++bi) {
      const Where bpath{name, static_cast<int64_t>(si), static_cast<int64_t>(bi)};
      const Items* bd = asNode((*blocks)[bi], NK::Dict);
      if (bd == nullptr) return Error{bpath.str() + " is not a dict", -1};
      Status bcharged = chargeRecords(1 + bd->size() / 2, bpath.str());
      if (!bcharged.ok()) return bcharged;
      Block b;
      auto size = getU64(*bd, keys_.size, bpath, true);
      if (!size) return size.error();
      b.size = *size;
      if (field(*bd, keys_.address) != nullptr) {
        snap_.traits.has_block_address = true;
        auto a = getU64(*bd, keys_.address, bpath, true);
        if (!a) return a.error();
        b.address = *a;
      } else {
        b.address = cursor;  // 1.13/2.0: blocks are contiguous from the segment start
      }
      cursor = b.address + b.size;
      covered += b.size;
      if (const Value* st = field(*bd, keys_.state); st && st->kind == VK::Str) {
        if (st->id == keys_.active_allocated)
          b.state = BlockState::ActiveAllocated;
        else if (st->id == keys_.active_pending_free)
          b.state = BlockState::ActivePendingFree;
        else if (st->id == keys_.inactive)
          b.state = BlockState::Inactive;
      }
      if (field(*bd, keys_.requested_size) != nullptr) {
        auto r = getU64(*bd, keys_.requested_size, bpath, true);
        if (!r) return r.error();
        b.requested_size = *r;
        b.has_requested_size = true;
      }
      if (const Value* f = field(*bd, keys_.frames)) {
        auto st = stackOf(*f, bpath);
        if (!st) return Error{st.error().message, -1};
        b.stack = *st;
      }
      // Legacy 1.13-2.0 `history`: history[0] is the allocation that owns the block.
      if (const Value* h = field(*bd, keys_.history)) {
        snap_.traits.has_block_history = true;
        const Items* hl = asNode(*h, NK::List);
        const Items* h0 = hl && !hl->empty() ? asNode((*hl)[0], NK::Dict) : nullptr;
        if (h0 != nullptr) {
          Status hcharged = chargeRecords(h0->size() / 2, bpath.str() + ".history[0]");
          if (!hcharged.ok()) return hcharged;
          if (b.stack == kNoStack) {
            if (const Value* f = field(*h0, keys_.frames)) {
              auto st = stackOf(*f, Where{name, bpath.seg, bpath.block, ".history[0]"});
              if (!st) return Error{st.error().message, -1};
              b.stack = *st;
            }
          }
          if (!b.has_requested_size && field(*h0, keys_.real_size) != nullptr) {
            auto r = getU64(*h0, keys_.real_size,
                            Where{name, bpath.seg, bpath.block, ".history[0]"}, true);
            if (!r) return r.error();
            b.requested_size = *r;
            b.has_requested_size = true;
          }
        }
      }
      if (!b.has_requested_size && b.isActive()) b.requested_size = b.size;
      snap_.blocks.push_back(b);
    }
    seg.block_count = static_cast<uint32_t>(blocks->size());
    if (covered != seg.total_size && seg.block_count > 0) {
      return Error{path.str() + ": blocks cover " + std::to_string(covered) +
                       " bytes but total_size is " + std::to_string(seg.total_size),
                   -1};
    }
    snap_.segments.push_back(seg);
  }
  return Status::Ok();
}

Status Machine::convertTraces(const Value& v) {
  const Items* outer = asNode(v, NK::List);
  if (outer == nullptr) {
    return Error{std::string("'device_traces' is ") + aKind(v, nodes_) + ", expected a list", -1};
  }
  // Validate, and find out whether the lists reference events_ in file order with no sharing (what
  // every writer produces): then events_ moves into the snapshot without a copy.
  bool in_order = true;
  uint32_t expect = 0;
  for (size_t d = 0; d < outer->size(); ++d) {
    if (const EventRun* run = eventRunOf((*outer)[d])) {  // entries, in order by construction
      Status charged =
          chargeRecords(1 + uint64_t{run->count}, "device_traces[" + std::to_string(d) + "]");
      if (!charged.ok()) return charged;
      in_order = in_order && run->first == expect;
      expect += run->count;
      continue;
    }
    const Items* inner = asNode((*outer)[d], NK::List);
    if (inner == nullptr) {
      return Error{"device_traces[" + std::to_string(d) + "] is " + aKind((*outer)[d], nodes_) +
                       ", expected a list",
                   -1};
    }
    // Before the entries are looked at or copied: a list referenced from many devices counts each
    // time.
    Status charged = chargeRecords(1 + inner->size(), "device_traces[" + std::to_string(d) + "]");
    if (!charged.ok()) return charged;
    for (size_t i = 0; i < inner->size(); ++i) {
      const Value& ev = (*inner)[i];
      if (ev.kind != VK::Node || nodes_[ev.id].kind != NK::Event) {
        return Error{"device_traces[" + std::to_string(d) + "][" + std::to_string(i) + "] is " +
                         aKind(ev, nodes_) + ", expected a trace entry dict with an 'action'",
                     -1};
      }
      in_order = in_order && nodes_[ev.id].ref == expect++;
    }
  }
  in_order = in_order && expect == events_.size();
  snap_.trace_begin.assign(1, 0);
  if (in_order) {
    for (size_t d = 0; d < outer->size(); ++d) {
      const EventRun* run = eventRunOf((*outer)[d]);
      snap_.trace_begin.push_back(snap_.trace_begin.back() +
                                  (run ? run->count : asNode((*outer)[d], NK::List)->size()));
    }
    snap_.events = std::move(events_);
  } else {
    for (size_t d = 0; d < outer->size(); ++d) {
      if (const EventRun* run = eventRunOf((*outer)[d])) {
        snap_.events.insert(snap_.events.end(), events_.begin() + run->first,
                            events_.begin() + run->first + run->count);
      } else {
        for (const Value& ev : *asNode((*outer)[d], NK::List))
          snap_.events.push_back(events_[nodes_[ev.id].ref]);
      }
      snap_.trace_begin.push_back(snap_.events.size());
    }
  }
  return Status::Ok();
}

Status Machine::convertSettings(const Value& v) {
  const Items* d = asNode(v, NK::Dict);
  if (d == nullptr) return Status::Ok();  // tolerate odd settings: they are informational
  auto& s = snap_.settings;
  s.present = true;
  if (const Value* c = field(*d, keys_.conf); c && c->kind == VK::Str)
    s.conf = snap_.strings.get(c->id);
  if (const Value* m = field(*d, keys_.max_split_size);
      m && (m->kind == VK::Int || m->kind == VK::UInt)) {
    s.max_split_size = m->i;
  }
  if (const Value* g = field(*d, keys_.gc_threshold)) {
    if (g->kind == VK::Float)
      s.garbage_collection_threshold = g->f;
    else if (g->kind == VK::Int)
      s.garbage_collection_threshold = static_cast<double>(g->i);
  }
  if (const Value* e = field(*d, keys_.expandable_segments); e && e->kind == VK::Bool) {
    s.expandable_segments = e->i != 0;
  }
  if (field(*d, keys_.graph_capture) != nullptr) snap_.traits.has_graph_capture_key = true;
  if (const Value* r = field(*d, keys_.roundup)) {
    if (const Items* rd = asNode(*r, NK::Dict)) {
      for (size_t i = 0; i + 1 < rd->size(); i += 2) {
        const Value& k = (*rd)[i];
        const Value& val = (*rd)[i + 1];
        if (k.kind != VK::Str || val.kind != VK::Int) continue;
        std::string_view ks = snap_.strings.get(k.id);
        uint64_t mib = 0;
        bool digits = !ks.empty() && ks.size() < 8;
        for (char ch : ks) {
          if (ch < '0' || ch > '9')
            digits = false;
          else
            mib = mib * 10 + static_cast<uint64_t>(ch - '0');
        }
        if (!digits || mib == 0 || (mib & (mib - 1)) != 0) continue;
        int idx = 63 - __builtin_clzll(mib);
        if (idx < 16 && val.i >= 0 && val.i < (1 << 20)) {
          s.roundup_power2_divisions[idx] = static_cast<uint32_t>(val.i);
          s.has_roundup = true;
        }
      }
    }
  }
  return Status::Ok();
}

Status Machine::convertAnnotations(const Value& v) {
  const Items* list = asNode(v, NK::List);
  if (list == nullptr) return Status::Ok();
  Status charged = chargeRecords(list->size(), "external_annotations");
  if (!charged.ok()) return charged;
  for (const Value& item : *list) {
    const Items* d = asNode(item, NK::Dict);
    if (d == nullptr) continue;
    charged = chargeRecords(d->size() / 2, "external_annotations");
    if (!charged.ok()) return charged;
    Annotation a;
    if (const Value* x = field(*d, keys_.device); x && x->kind == VK::Int) a.device = x->i;
    if (const Value* x = field(*d, keys_.time_us);
        x && (x->kind == VK::Int || x->kind == VK::UInt)) {
      if (x->kind == VK::Int && x->i >= 0)
        a.time_us = x->i;
      else
        ++bad_time_us_;  // negative or beyond 2^63-1: no time, counted in a load warning
    }
    if (const Value* x = field(*d, keys_.name); x && x->kind == VK::Str) a.name = x->id;
    if (const Value* x = field(*d, keys_.stage); x && x->kind == VK::Str) a.stage = x->id;
    snap_.annotations.push_back(a);
  }
  return Status::Ok();
}

}  // namespace

const char* pickleOpcodeName(uint8_t op) {
  switch (op) {
    case MARK:
      return "MARK";
    case STOP:
      return "STOP";
    case POP:
      return "POP";
    case POP_MARK:
      return "POP_MARK";
    case DUP:
      return "DUP";
    case FLOAT:
      return "FLOAT";
    case INT:
      return "INT";
    case BININT:
      return "BININT";
    case BININT1:
      return "BININT1";
    case LONG:
      return "LONG";
    case BININT2:
      return "BININT2";
    case NONE:
      return "NONE";
    case PERSID:
      return "PERSID";
    case BINPERSID:
      return "BINPERSID";
    case REDUCE:
      return "REDUCE";
    case STRING:
      return "STRING";
    case BINSTRING:
      return "BINSTRING";
    case SHORT_BINSTRING:
      return "SHORT_BINSTRING";
    case UNICODE:
      return "UNICODE";
    case BINUNICODE:
      return "BINUNICODE";
    case APPEND:
      return "APPEND";
    case BUILD:
      return "BUILD";
    case GLOBAL:
      return "GLOBAL";
    case DICT:
      return "DICT";
    case EMPTY_DICT:
      return "EMPTY_DICT";
    case APPENDS:
      return "APPENDS";
    case GET:
      return "GET";
    case BINGET:
      return "BINGET";
    case INST:
      return "INST";
    case LONG_BINGET:
      return "LONG_BINGET";
    case LIST:
      return "LIST";
    case EMPTY_LIST:
      return "EMPTY_LIST";
    case OBJ:
      return "OBJ";
    case PUT:
      return "PUT";
    case BINPUT:
      return "BINPUT";
    case LONG_BINPUT:
      return "LONG_BINPUT";
    case SETITEM:
      return "SETITEM";
    case TUPLE:
      return "TUPLE";
    case EMPTY_TUPLE:
      return "EMPTY_TUPLE";
    case SETITEMS:
      return "SETITEMS";
    case BINFLOAT:
      return "BINFLOAT";
    case PROTO:
      return "PROTO";
    case NEWOBJ:
      return "NEWOBJ";
    case EXT1:
      return "EXT1";
    case EXT2:
      return "EXT2";
    case EXT4:
      return "EXT4";
    case TUPLE1:
      return "TUPLE1";
    case TUPLE2:
      return "TUPLE2";
    case TUPLE3:
      return "TUPLE3";
    case NEWTRUE:
      return "NEWTRUE";
    case NEWFALSE:
      return "NEWFALSE";
    case LONG1:
      return "LONG1";
    case LONG4:
      return "LONG4";
    case BINBYTES:
      return "BINBYTES";
    case SHORT_BINBYTES:
      return "SHORT_BINBYTES";
    case SHORT_BINUNICODE:
      return "SHORT_BINUNICODE";
    case BINUNICODE8:
      return "BINUNICODE8";
    case BINBYTES8:
      return "BINBYTES8";
    case EMPTY_SET:
      return "EMPTY_SET";
    case ADDITEMS:
      return "ADDITEMS";
    case FROZENSET:
      return "FROZENSET";
    case NEWOBJ_EX:
      return "NEWOBJ_EX";
    case STACK_GLOBAL:
      return "STACK_GLOBAL";
    case MEMOIZE:
      return "MEMOIZE";
    case FRAME:
      return "FRAME";
    case BYTEARRAY8:
      return "BYTEARRAY8";
    case NEXT_BUFFER:
      return "NEXT_BUFFER";
    case READONLY_BUFFER:
      return "READONLY_BUFFER";
    default:
      return "unknown";
  }
}

Expected<Snapshot> readSnapshotPickle(std::span<const uint8_t> data,
                                      const PickleReadOptions& options) {
  Machine m(data, options);
  return m.run();
}

}  // namespace memforensics::format
