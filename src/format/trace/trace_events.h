// trace_events.h: the bounds-checked payload cursor and the one decoder of Events records
// (trace_format.h), shared by TraceReader::next() and the parallel loader of format/load, so that
// both accept and refuse exactly the same records with the same messages.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"
#include "format/trace/trace_format.h"

namespace memforensics::format::trace {

// 1 + the largest string, stack and pool id that the records of an Events chunk refer to (0: none),
// as detail::decodeEventRecords finds them; an Events chunk fits the tables when each is at most
// the table's size.
struct IdExtent {
  uint64_t strings = 0, stacks = 0, pools = 0;
};

namespace detail {

// Bounds-checked reading of a payload. Errors are sticky: check ok() after a group of reads.
struct Cursor {
  const uint8_t* begin;
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;
  // Where the first failure happened (payload offset) and what it was, for the error message.
  size_t fail_at = 0;
  bool overlong = false;  // a varint of more than 10 bytes or 64 bits (otherwise: cut short)

  explicit Cursor(std::span<const uint8_t> b)
      : begin(b.data()), p(b.data()), end(b.data() + b.size()) {}
  void fail(bool too_long) {
    if (ok) {
      fail_at = static_cast<size_t>(p - begin);
      overlong = too_long;
    }
    ok = false;
    p = end;
  }
  uint64_t var() {
    // Varints of up to 9 bytes at least 10 bytes before the end inline (no bounds check per
    // byte); the rest, the 10-byte ones and every failure in varSlow().
    if (end - p >= 10) {
      uint64_t v = 0;
      for (int i = 0; i < 9; ++i) {
        const uint64_t b = p[i];
        v |= (b & 0x7f) << (7 * i);
        if (b < 0x80) {
          p += i + 1;
          return v;
        }
      }
    } else if (p < end && *p < 0x80) {
      return *p++;
    }
    return varSlow();
  }
  [[gnu::noinline]] uint64_t varSlow() {
    uint64_t v = 0;
    const uint8_t* q = getVarint(p, end, v);
    if (q == nullptr) {
      // Cut short when every byte up to the end has its continuation bit set (and fewer than
      // 10 bytes were there); otherwise too long or more than 64 bits.
      size_t n = static_cast<size_t>(end - p);
      bool cut = n < 10 && std::all_of(p, end, [](uint8_t b) { return b & 0x80; });
      fail(!cut);
      return 0;
    }
    p = q;
    return v;
  }
  // What went wrong, for messages: "a varint at payload byte 17 is longer than 10 bytes ...".
  std::string failure() const {
    return overlong ? "the varint at payload byte " + std::to_string(fail_at) +
                          " is longer than 10 bytes or overflows 64 bits"
                    : "the payload is cut short at byte " + std::to_string(fail_at);
  }
  int64_t svar() { return unzigzag(var()); }
  uint8_t byte() {
    if (p >= end) {
      fail(false);
      return 0;
    }
    return *p++;
  }
  std::string_view bytes(uint64_t n) {
    if (n > static_cast<uint64_t>(end - p)) {
      fail(false);
      return {};
    }
    std::string_view s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
  size_t left() const { return static_cast<size_t>(end - p); }
  bool done() const { return p == end; }
};

inline Error bad(std::string what) {
  return Error{std::move(what), -1};
}

// The record count an Events payload declares, checked against its bytes as decodeEventRecords
// checks it (a record takes at least 4 bytes: head, addr, size, time). False when it does not fit.
inline bool eventRecordCount(std::span<const uint8_t> payload, uint64_t& count) {
  Cursor c(payload);
  count = c.var();
  return c.ok && count <= c.left() / 4;
}

// What a record's fields are relative to: the previous record's values (all zero at the start
// of a chunk), and where the record starts in the payload. A run of records can be decoded again
// from the middle of a chunk from the state before its first record (EventRun).
struct RecordState {
  size_t offset = 0;  // payload byte where the next record starts
  uint32_t device = 0, stack = 0;
  uint64_t stream = 0, addr = 0, t = 0;
  uint32_t compile = 0, user = 0, pool = 0, action_name = 0;
};

// `count` records of a payload from `from`: records a sink saw once (decodeEventRecords calls
// sink.before(i, state) ahead of the first record and of each record that names its device, where
// a run of one device can start, when the sink has that member).
struct EventRun {
  RecordState from;
  uint64_t count = 0;
};

template <typename Sink>
concept WantsRecordState = requires(Sink& s, const RecordState& st) {
  s.before(uint64_t{0}, st);
};

// Decodes the records of an Events payload: sink.begin(count) once the count is checked against
// the bytes present (before anything is allocated), then sink.event(i, e) per record in order.
// Ids are checked against the table sizes given (~0: not checked), and the ids read are summed up
// in `ids` when given. Returns the first problem. With `run`, only that run's records are decoded
// (i counts from 0 at its first record) and nothing after them is checked.
template <typename Sink>
Status decodeEventRecords(std::span<const uint8_t> payload, uint64_t nstrings, uint64_t nstacks,
                          uint64_t npools, Sink& sink, IdExtent* ids = nullptr,
                          const EventRun* run = nullptr) {
  Cursor c(payload);
  uint64_t count = 0;
  RecordState s;
  if (run != nullptr) {
    if (run->from.offset > payload.size() || run->count > (payload.size() - run->from.offset) / 4)
      return bad("a run of " + std::to_string(run->count) + " events past the chunk's end");
    s = run->from;
    c.p += s.offset;
    count = run->count;
  } else {
    count = c.var();
    if (!c.ok) return bad("event count: " + c.failure());
    if (count > c.left() / 4) {
      return bad("event count " + std::to_string(count) + " does not fit the chunk's " +
                 std::to_string(c.left()) + " bytes of records");
    }
  }
  sink.begin(count);
  uint32_t& device = s.device;
  uint32_t& stack = s.stack;
  uint64_t& stream = s.stream;
  uint64_t& addr = s.addr;
  uint64_t& t = s.t;
  uint32_t& compile = s.compile;
  uint32_t& user = s.user;
  uint32_t& pool = s.pool;
  uint32_t& action_name = s.action_name;
  TraceEvent e;
  IdExtent seen;
  auto see = [](uint64_t& extent, uint64_t v) {
    if (v >= extent) extent = v + 1;
  };
  for (uint64_t i = 0; i < count; ++i) {
    if constexpr (WantsRecordState<Sink>) {
      // Only where a run of one device can start: the first record, or one that names a device.
      if (i == 0 || (c.p < c.end && (*c.p & kHeadDevice))) {
        s.offset = static_cast<size_t>(c.p - c.begin);
        sink.before(i, s);
      }
    }
    uint8_t h = c.byte();
    uint8_t action = h & kHeadActionMask;
    if (action > 10)
      return bad("event " + std::to_string(i) + " has action code " + std::to_string(action));
    if (h & kHeadDevice) {
      uint64_t d = c.var();
      if (d >= kMaxDevice)
        return bad("event " + std::to_string(i) + " names device " + std::to_string(d));
      device = static_cast<uint32_t>(d);
    }
    if (h & kHeadStream) stream += static_cast<uint64_t>(c.svar());
    if (h & kHeadContext) {
      uint8_t mask = c.byte();
      if (mask & ~0x0f) return bad("event " + std::to_string(i) + " has an unknown context field");
      uint64_t v;
      if (mask & kCtxCompile) {
        if ((v = c.var()) >= nstrings)
          return bad("event " + std::to_string(i) + " refers to undefined string " +
                     std::to_string(v));
        see(seen.strings, v);
        compile = static_cast<uint32_t>(v);
      }
      if (mask & kCtxUser) {
        if ((v = c.var()) >= nstrings)
          return bad("event " + std::to_string(i) + " refers to undefined string " +
                     std::to_string(v));
        see(seen.strings, v);
        user = static_cast<uint32_t>(v);
      }
      if (mask & kCtxPool) {
        if ((v = c.var()) >= npools)
          return bad("event " + std::to_string(i) + " refers to undefined pool " +
                     std::to_string(v));
        see(seen.pools, v);
        pool = static_cast<uint32_t>(v);
      }
      if (mask & kCtxActionName) {
        if ((v = c.var()) >= nstrings)
          return bad("event " + std::to_string(i) + " refers to undefined string " +
                     std::to_string(v));
        see(seen.strings, v);
        action_name = static_cast<uint32_t>(v);
      }
    }
    if (!(h & kHeadSameStack)) {
      int64_t s = static_cast<int64_t>(stack) + c.svar();
      if (s < 0 || static_cast<uint64_t>(s) >= nstacks || s > 0xffffffffll) {
        return bad("event " + std::to_string(i) + " refers to undefined stack " +
                   std::to_string(s));
      }
      stack = static_cast<uint32_t>(s);
      see(seen.stacks, stack);
    }
    addr += static_cast<uint64_t>(c.svar());
    uint64_t size = c.var();
    t += static_cast<uint64_t>(c.svar());
    if (!c.ok)
      return bad("event " + std::to_string(i) + " of " + std::to_string(count) + ": " +
                 c.failure());
    e.addr = addr;
    e.size = size;
    e.stream = static_cast<int64_t>(stream);
    // Stored as time_us + 1 (0 = no time), so INT64_MAX is stored as 2^63: subtract in uint64
    // (t - 1 as int64 would overflow there). A value no writer produces (above 2^63) is no time.
    e.time_us = t == 0 || t > (uint64_t{1} << 63) ? -1 : static_cast<int64_t>(t - 1);
    e.device = device;
    e.stack = stack;
    e.compile_context = compile;
    e.user_metadata = user;
    e.action_name = keptActionName(action, action_name);
    e.pool = pool;
    e.action = action;
    sink.event(i, e);
  }
  if (run == nullptr && !c.done())
    return bad(std::to_string(c.left()) + " bytes after the last of " + std::to_string(count) +
               " events");
  if (ids != nullptr) *ids = seen;
  return Status::Ok();
}

}  // namespace detail
}  // namespace memforensics::format::trace
