// pickle_entry.cc: a trace entry as an Event (pickle_machine.h, sections 2b and 2c).
#include "format/pickle/pickle_machine.h"

namespace memforensics::format::pickle_detail {

Machine::Field Machine::fieldOf(StrId id) const {
  if (id == keys_.action) return Field::Action;
  if (id == keys_.addr) return Field::Addr;
  if (id == keys_.device_free) return Field::DeviceFree;
  if (id == keys_.size) return Field::Size;
  if (id == keys_.stream) return Field::Stream;
  if (id == keys_.time_us) return Field::TimeUs;
  if (id == keys_.frames) return Field::Frames;
  if (id == keys_.compile_context) return Field::CompileContext;
  if (id == keys_.user_metadata) return Field::UserMetadata;
  if (id == keys_.pool_id) return Field::PoolId;
  return Field::Other;
}

// Integers must fit their field: a negative size or address is refused, never wrapped to 2^64-n.
inline __attribute__((always_inline)) Machine::Fit Machine::applyField(Field f, const Value& v,
                                                                       Event& e,
                                                                       EventNotes& notes) {
  const bool u64 = v.kind == VK::UInt || (v.kind == VK::Int && v.i >= 0);
  switch (f) {
    case Field::Action:
      if (v.kind != VK::Str) return Fit::Refused;
      e.action = actionOf(v.id);
      notes.action_name = keptActionName(e.action, v.id);
      if (e.action == Action::Annotate) snap_.traits.has_annotate_action = true;
      return Fit::Ok;
    case Field::Addr:
    case Field::DeviceFree:
      if (!u64) return Fit::Refused;
      e.addr = static_cast<uint64_t>(v.i);
      return Fit::Ok;
    case Field::Size:
      if (!u64) return Fit::Refused;
      e.size = static_cast<uint64_t>(v.i);
      return Fit::Ok;
    case Field::Stream:
      if (v.kind != VK::Int) return Fit::Refused;  // a signed 64-bit cudaStream_t
      e.stream = v.i;
      return Fit::Ok;
    case Field::TimeUs:
      snap_.traits.has_time_us = true;
      if (v.kind == VK::UInt || (v.kind == VK::Int && v.i < 0)) return Fit::BadTime;
      if (v.kind != VK::Int) return Fit::Refused;
      e.time_us = v.i;
      return Fit::Ok;
    case Field::CompileContext:
      snap_.traits.has_compile_context = true;
      if (v.kind == VK::Str) notes.compile_context = v.id;
      return Fit::Ok;
    case Field::UserMetadata:
      snap_.traits.has_user_metadata = true;
      if (v.kind == VK::Str) notes.user_metadata = v.id;
      return Fit::Ok;
    case Field::Frames:
    case Field::PoolId:
    case Field::Other:
      break;
  }
  return Fit::Refused;
}

const char* Machine::numericFieldKey(Field f) {
  switch (f) {
    case Field::Addr:
      return "addr";
    case Field::DeviceFree:
      return "device_free";
    case Field::Size:
      return "size";
    case Field::Stream:
      return "stream";
    default:
      return "time_us";
  }
}

Status Machine::refusedField(Field f, const Value& v) const {
  if (f == Field::Action) return err("trace entry `action` is not a string");
  const char* key = numericFieldKey(f);
  if (f == Field::Stream) {
    return err(std::string("trace entry `stream` is ") + aKind(v, nodes_) +
               (v.kind == VK::UInt ? " beyond the signed 64-bit range" : ", expected an int"));
  }
  if (v.kind == VK::Int) {
    return err(std::string("trace entry `") + key + "` is negative (" + std::to_string(v.i) + ")");
  }
  return err(std::string("trace entry `") + key + "` is " + aKind(v, nodes_) +
             ", expected a non-negative int");
}

Status Machine::makeEvent(uint32_t n, const Value* kv, size_t count) {
  Event e;
  EventNotes notes;
  bool have_action = false;
  for (size_t k = 0; k + 1 < count; k += 2) {
    const Value& key = kv[k];
    const Value& v = kv[k + 1];
    if (key.kind != VK::Str) continue;
    const Field f = fieldOf(key.id);
    if (f == Field::Frames) {
      auto st = stackOf(v, Where{"trace entry"});
      if (!st) return st.error();
      e.stack = *st;
    } else if (f == Field::PoolId) {
      snap_.traits.has_pool_id = true;
      if (v.kind == VK::Node && (nodes_[v.id].kind == NK::Tuple || nodes_[v.id].kind == NK::List) &&
          itemsOf(v.id).size() == 2) {
        const auto& t = itemsOf(v.id);
        if ((t[0].kind == VK::Int || t[0].kind == VK::UInt) &&
            (t[1].kind == VK::Int || t[1].kind == VK::UInt)) {
          std::pair<uint64_t, uint64_t> pool{static_cast<uint64_t>(t[0].i),
                                             static_cast<uint64_t>(t[1].i)};
          auto [it, fresh] =
              pool_index_.try_emplace(pool, static_cast<uint32_t>(snap_.pools.size()));
          if (fresh) snap_.pools.push_back(pool);
          e.pool = it->second;
        }
      }
    } else if (f != Field::Other) {
      switch (applyField(f, v, e, notes)) {
        case Fit::Ok:
          break;
        case Fit::BadTime:
          ++bad_time_us_;  // kept as "no time" (-1), and counted in a load warning
          break;
        case Fit::Refused:
          return refusedField(f, v);
      }
      have_action |= f == Field::Action;
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

namespace {

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

}  // namespace

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

// fastMemo's other cases (pickle_machine.h): BINPUT / LONG_BINPUT of the next free index, a
// MEMOIZE that grows or widens the memo; false for a store this path does not undo (an
// overwrite, a gap) or past the memo budget.
bool Machine::fastMemoSlow(const uint8_t*& p, uint64_t enc) {
  if (p >= end_) return true;  // the next read gives up
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

namespace {

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

}  // namespace

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
    field[k] = fieldOf(id);
    if (field[k] == Field::PoolId || field[k] == Field::Other)
      return;                         // pool_id or a key makeEvent ignores: left to fastEntry
    if (id > kNarrowPayload) return;  // fastShaped compares narrow memo entries
    key[k] = id;
  }
  std::copy(key, key + keys, shape_key_);
  std::copy(field, field + keys, shape_field_);
  shape_keys_ = static_cast<uint32_t>(keys);
}

bool Machine::fastShaped() {
  // A wide memo (a payload past 30 bits, never seen in a real file) is left to fastEntry.
  if (shape_keys_ == 0 || memo_wide_) return false;
  const uint8_t* p = p_;  // just after EMPTY_DICT
  const uint8_t* const end = end_;
  const size_t memo0 = memoSize();
  const size_t nodes0 = nodes_.size();
  const uint64_t frames0 = frames_budget_;
  // applyField records the traits of the keys it reads; a fallback puts them back, leaving them
  // to the path that reads the entry (which may find it is no entry at all).
  const FormatTraits traits0 = snap_.traits;
  const uint32_t n = newNode(NK::Dict);
  Event e;
  EventNotes notes;
  bool ok = fastMemo(p, uint64_t{2} << 32 | n) && p < end && *p == MARK;
  // The narrow memo read in place (memoAt's encoding, kind << 30 | payload; 0 for a slot not
  // stored): only a frames list's store (fastFrames) changes it while the entry is read.
  const uint32_t* memo = memo32_.data();
  size_t memo_n = memo32_.size();
  auto fetch = [&](const uint8_t*& q, uint32_t& x) __attribute__((always_inline)) {
    const auto left = end - q;
    uint32_t idx;
    if (left >= 5 && *q == LONG_BINGET) {
      std::memcpy(&idx, q + 1, 4);
      q += 5;
    } else if (left >= 2 && *q == BINGET) {
      idx = q[1];
      q += 2;
    } else {
      return false;
    }
    x = idx < memo_n ? memo[idx] : 0;
    return true;
  };
  constexpr uint32_t kStr = 1u << 30;   // a string's memo entry: kStr | StrId
  constexpr uint32_t kNode = 2u << 30;  // a node's: kNode | node
  constexpr uint32_t kKind = 3u << 30;
  const auto payload = [](uint32_t x) { return static_cast<uint32_t>(x & kNarrowPayload); };
  if (ok) {
    ++p;
    uint32_t x = 0;
    Value v;
    for (uint32_t k = 0; k < shape_keys_ && ok; ++k) {
      if (!fetch(p, x) || x != (kStr | shape_key_[k])) {
        ok = false;
        break;
      }
      // The value in one of its common forms, applied as makeEvent applies it (the field is a
      // constant in each case, so applyField's own switch folds away).
      switch (shape_field_[k]) {
        case Field::Action:
          ok = fetch(p, x) && (x & kKind) == kStr &&
               applyField(Field::Action, Value::str(payload(x)), e, notes) == Fit::Ok;
          break;
        case Field::Addr:
          ok = shapedInt(p, end, v) && applyField(Field::Addr, v, e, notes) == Fit::Ok;
          break;
        case Field::DeviceFree:
          ok = shapedInt(p, end, v) && applyField(Field::DeviceFree, v, e, notes) == Fit::Ok;
          break;
        case Field::Size:
          ok = shapedInt(p, end, v) && applyField(Field::Size, v, e, notes) == Fit::Ok;
          break;
        case Field::Stream:
          ok = shapedInt(p, end, v) && applyField(Field::Stream, v, e, notes) == Fit::Ok;
          break;
        case Field::TimeUs:
          ok = shapedInt(p, end, v) && applyField(Field::TimeUs, v, e, notes) == Fit::Ok;
          break;
        case Field::Frames:
          if (p < end && *p == EMPTY_LIST) {
            ++p;
            Value list;
            ok = fastFrames(p, list) && !memo_wide_;
            if (!ok) break;
            memo = memo32_.data();  // the list's store may have grown the memo
            memo_n = memo32_.size();
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
            ok = fetch(p, x) && (x & kKind) == kNode && nodes_[payload(x)].kind == NK::Stack;
            if (ok) e.stack = nodes_[payload(x)].ref;
          }
          break;
        case Field::CompileContext:
        case Field::UserMetadata:
          if (p < end && *p == NONE) {
            ++p;
            v = Value::none();
          } else {
            ok = fetch(p, x) && (x & kKind) == kStr;
            v = Value::str(payload(x));
          }
          ok = ok && applyField(shape_field_[k], v, e, notes) == Fit::Ok;
          break;
        case Field::PoolId:
        case Field::Other:
          ok = false;  // recordShape keeps neither
          break;
      }
    }
    ok = ok && p < end && *p == SETITEMS;
  }
  if (!ok) {
    memoTruncate(memo0);
    nodes_.resize(nodes0);
    frames_budget_ = frames0;
    snap_.traits = traits0;
    return false;
  }
  ++p;
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

}  // namespace memforensics::format::pickle_detail
