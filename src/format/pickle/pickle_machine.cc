// pickle_machine.cc: the opcode machine (pickle_machine.h, section 2) and readSnapshotPickle.
#include "format/pickle/pickle_machine.h"

namespace memforensics::format {

namespace pickle_detail {

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
  indexSnapshot(snap_);
  return std::move(snap_);
}

}  // namespace pickle_detail

using namespace pickle_detail;

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
