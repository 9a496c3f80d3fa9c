// trace_format.h: the native trace format (`snapshot.bin`), version 1.1. docs/trace-format.md is
// the prose form of this header; the two must say the same thing and carry the same version.
//
// A file is a 32-byte header followed by self-delimiting chunks:
//
//   header   magic "\x89MFTRACE"(8) | major u16 | minor u16 | header_size u32 (=32)
//            | flags u32 | created_unix_us u64 | crc32c of the first 28 bytes u32
//   chunk    type u8 | codec u8 | reserved u16 (0) | stored_size u32 | crc32c u32 over bytes
//            [0, 8) of this chunk header and the stored payload | payload (stored_size bytes; for
//            zstd, one zstd frame whose header carries the decoded size)
//   end      a Trailer chunk, then an 16-byte end mark: trailer chunk offset u64 | "MFTREND\0"
//
// All fixed-width integers are little-endian. Inside payloads, integers are LEB128 varints
// (unsigned) or zigzag varints (signed). Every chunk decodes on its own: event deltas restart at
// zero at each Events chunk, and ids refer only to table entries in earlier chunks. A file cut at
// any byte therefore reads back to its last complete chunk; the reader says how much was lost.
//
// This header is standard-library only so that the capture side can use it without the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace memforensics::format::trace {

inline constexpr uint8_t kMagic[8] = {0x89, 'M', 'F', 'T', 'R', 'A', 'C', 'E'};
inline constexpr uint8_t kEndMagic[8] = {'M', 'F', 'T', 'R', 'E', 'N', 'D', 0};
inline constexpr uint16_t kVersionMajor = 1;  // readers refuse a larger major
inline constexpr uint16_t kVersionMinor =
    1;  // readers accept any minor: unknown chunks are skipped
inline constexpr uint32_t kHeaderSize = 32;
inline constexpr uint32_t kChunkHeaderSize = 12;
inline constexpr uint32_t kEndMarkSize = 16;
// ---------------------------------------------------------------------------------------------
// Limits. Writer and reader share these: the writer never produces a file that breaks one (it
// splits table chunks, stores a chunk uncompressed, or refuses with a clear error before a file
// exists), and the reader refuses a file that breaks one as damaged or hostile, before allocating.
// docs/trace-format.md ("Limits") lists them with their reasons.
//
// One chunk's stored size and decoded size are at most this: a hostile size field must not make a
// reader allocate gigabytes. Writers stay far below (about 1 MiB of events per chunk; tables are
// split into chunks of at most kTableChunkBytes).
inline constexpr uint32_t kMaxChunkBytes = 64u << 20;
// Tables (strings, frames, stacks, pools) are written in chunks of about this many payload bytes.
inline constexpr uint32_t kTableChunkBytes = 4u << 20;
// The zstd chunks of a file decode to at most decodedBudget(file size) bytes in total: 16 MiB, or
// 16 times the file's size when that is more. Real snapshots decode to 2-17 times their stored
// size per chunk and to at most 11 times the file's size overall. A "zip bomb" (a few bytes that
// expand into megabytes of 4-byte records, each becoming a 48-byte event) is refused before it is
// decoded: a file of F bytes yields at most about 16 * F / 4 events from zstd chunks. A writer
// whose data compress better than that (a repetitive alloc/free loop) stores some chunks
// uncompressed, which keeps its file within the budget it will be read with. Chunks stored
// uncompressed are bounded by the file itself and do not count.
// max(floor, per_byte * file_bytes), saturating at 2^64-1: the shape of every budget below.
inline constexpr uint64_t fileBudget(uint64_t file_bytes, uint64_t per_byte, uint64_t floor) {
  if (file_bytes > ~uint64_t{0} / per_byte) return ~uint64_t{0};
  return file_bytes > floor / per_byte ? file_bytes * per_byte : floor;
}
inline constexpr uint64_t kDecodedBudgetFloor = 16u << 20;
inline constexpr uint64_t kDecodedBytesPerFileByte = 16;
inline constexpr uint64_t decodedBudget(uint64_t file_bytes) {
  return fileBudget(file_bytes, kDecodedBytesPerFileByte, kDecodedBudgetFloor);
}
// Reading a trace turns each stack trie node that an event, segment or block refers to into a
// full frame list (the Snapshot model keeps a stack as its frames). The frames of all the distinct
// stacks referred to are at most stackFrameBudget(file size): 16 M frames (64 MiB of frame ids),
// or 64 per byte of the file when that is more. A trie is a compression of its stacks: a chain of
// 100,000 nodes, each referred to by an event, is 782 KB in a file and 5 * 10^9 frames expanded.
// The writer counts the same figure and refuses (before the trailer) a file that would exceed it;
// real snapshots come nowhere near (their model holds every referred stack expanded anyway).
inline constexpr uint64_t kStackFrameBudgetFloor = 16u << 20;
inline constexpr uint64_t kStackFramesPerFileByte = 64;
inline constexpr uint64_t stackFrameBudget(uint64_t file_bytes) {
  return fileBudget(file_bytes, kStackFramesPerFileByte, kStackFrameBudgetFloor);
}
// An event's device is the index of its per-device trace (PyTorch's `device_traces` list), so it
// sizes per-device tables: ordinals of events and the trailer's device trace count are below
// this (2^20; the Snapshot model then holds an 8 MiB index). Segments and annotations carry any
// int64 device, as the model does.
inline constexpr uint32_t kMaxDevice = 1u << 20;

enum class ChunkType : uint8_t {
  Meta = 1,         // where the content came from: source format, PyTorch traits, tool version
  Strings = 2,      // appends strings to the string table (id 0 is always "")
  Frames = 3,       // appends frames: zigzag deltas of filename and name ids, line + 1
  Stacks = 4,       // appends stack trie nodes: (own id - parent id), zigzag delta of the frame id
  Events = 5,       // a run of trace events, delta-encoded
  Checkpoint = 6,   // trace-derived allocator state after a given number of events per device
  Segments = 7,     // final segment and block state (optional: absent in a killed capture)
  Settings = 8,     // allocator settings (optional)
  Annotations = 9,  // external annotations (optional)
  Pools = 10,       // appends (pool_a, pool_b) pairs for events' pool ids (id 0 = none)
  Trailer = 15,     // counts; its presence marks a complete file
};
std::string_view chunkTypeName(uint8_t type);

enum class Codec : uint8_t { None = 0, Zstd = 1 };

// Stack trie: stack id 0 = no stack recorded, 1 = recorded but empty (the root); every other id is
// a node (parent, frame) defined by a Stacks chunk before its first use. A node's frames are its
// own frame followed by its parent's, i.e. innermost first, as in the Snapshot model.
inline constexpr uint32_t kTraceNoStack = 0;
inline constexpr uint32_t kTraceRootStack = 1;

// Events chunk record. Byte 0 ("head"):
//   bits 0-3  action (format::Action values 0-10)
//   bit 4     device follows (varint); otherwise the previous record's device
//   bit 5     stream follows (zigzag delta from the previous record's stream)
//   bit 6     context follows: varint mask, then for each set bit in order
//               1 compile_context StrId | 2 user_metadata StrId | 4 pool id | 8 action_name StrId
//             the values stay in force for later records of the chunk (they change rarely)
//   bit 7     stack is the previous record's stack; otherwise zigzag delta of the stack id follows
// then: zigzag delta of addr from the previous record's addr (for oom: device_free),
//       varint size, zigzag delta of (time_us + 1) from the previous record's (0 = no time).
// A chunk starts from device 0, stream 0, addr 0, time 0, stack 0, all context ids 0.
inline constexpr uint8_t kHeadActionMask = 0x0f;
inline constexpr uint8_t kHeadDevice = 0x10;
inline constexpr uint8_t kHeadStream = 0x20;
inline constexpr uint8_t kHeadContext = 0x40;
inline constexpr uint8_t kHeadSameStack = 0x80;
inline constexpr uint8_t kCtxCompile = 1, kCtxUser = 2, kCtxPool = 4, kCtxActionName = 8;

// Checkpoint payload: varint device count, then per device: varint device, varint events so far
// on that device, varint live block count, then per live block (address order): varint addr delta,
// varint requested size, zigzag stack delta, zigzag stream delta, u8 pending-free flag; then varint
// segment count and per segment: varint addr delta, varint size. The state is what the events so
// far imply on their own (an allocation made before recording began is not in it).

// ---------------------------------------------------------------------------------------------
// Encoding primitives shared by writer and reader.

inline uint64_t zigzag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
inline int64_t unzigzag(uint64_t v) {
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

// Appends a LEB128 varint at p (up to 10 bytes); returns the new end.
inline uint8_t* putVarint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

// Reads a varint from [p, end); returns nullptr on truncation or on more than 10 bytes.
inline const uint8_t* getVarint(const uint8_t* p, const uint8_t* end, uint64_t& out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (p >= end) return nullptr;
    uint8_t b = *p++;
    if (shift == 63 && b > 1) return nullptr;  // more than 64 bits
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (b < 0x80) {
      out = v;
      return p;
    }
  }
  return nullptr;
}

inline void putU16(uint8_t* p, uint16_t v) {
  std::memcpy(p, &v, 2);
}
inline void putU32(uint8_t* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}
inline void putU64(uint8_t* p, uint64_t v) {
  std::memcpy(p, &v, 8);
}
inline uint16_t getU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t getU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t getU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the trace format is little-endian");

// CRC-32C (Castagnoli), as iSCSI/ext4 use: hardware instruction when the CPU has SSE4.2.
uint32_t crc32c(uint32_t crc, const uint8_t* data, size_t n);
inline uint32_t crc32c(std::span<const uint8_t> b) {
  return crc32c(0, b.data(), b.size());
}

// ---------------------------------------------------------------------------------------------
// Records as the writer takes them and the reader returns them. Ids (strings, stacks, pools) are
// the file's own; the reader turns them into a Snapshot's ids.

// The action code of format::Action::Unknown (snapshot_trace.cc checks they agree).
inline constexpr uint8_t kActionUnknown = 10;
// The one rule for an event's action name: the string as written is kept only for an unknown
// action (a known one is its code); `name` otherwise becomes 0 ("").
inline constexpr bool keepsActionName(uint8_t action) {
  return action == kActionUnknown;
}
inline constexpr uint32_t keptActionName(uint8_t action, uint32_t name) {
  return keepsActionName(action) ? name : 0;
}

struct TraceEvent {
  uint64_t addr = 0;     // block or segment address; for oom: device_free bytes
  uint64_t size = 0;     // requested bytes; segment bytes; rounded oom request
  int64_t stream = 0;    // cudaStream_t as an integer
  int64_t time_us = -1;  // microseconds since the epoch, -1 = none
  uint32_t device = 0;
  uint32_t stack = kTraceNoStack;
  uint32_t compile_context = 0;     // StrId, 0 = ""
  uint32_t user_metadata = 0;       // StrId
  uint32_t action_name = 0;         // StrId of the action as written; only kept for unknown actions
  uint32_t pool = 0;                // pool id, 0 = none
  uint8_t action = kActionUnknown;  // format::Action value
};

struct TraceBlock {
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t requested_size = 0;
  uint32_t stack = kTraceNoStack;
  uint8_t state = 3;  // format::BlockState value
  bool has_requested_size = false;
};

struct TraceSegment {
  int64_t device =
      0;  // stored as the varint of its two's complement (non-negative: the plain value)
  uint64_t address = 0;
  uint64_t total_size = 0;
  uint64_t allocated_size = 0;
  uint64_t active_size = 0;
  uint64_t requested_size = 0;
  int64_t stream = 0;
  uint64_t pool_a = 0, pool_b = 0;
  uint32_t stack = kTraceNoStack;
  uint32_t segment_type = 0;  // StrId of the segment_type string as written
  bool usual_type =
      false;  // segment_type is "large" or "small" as is_large says (no string stored)
  bool is_large = true;
  bool is_expandable = false;
  uint32_t first_block = 0;  // blocks [first_block, first_block + block_count) of the section
  uint32_t block_count = 0;
};

struct TraceAnnotation {
  int64_t device = -1;
  int64_t time_us = -1;
  uint32_t name = 0;   // StrId
  uint32_t stage = 0;  // StrId
};

// A settings key the model does not read, with its scalar value (Settings TLV tag 7: varint key
// length, key, u8 kind, then for Bool/Int/UInt/Float a varint (Int zigzag, Float its bits), for Str
// a varint length and the bytes, for None nothing).
// At most this many tag-7 entries are read, each of at most this many key + value bytes (the
// model's kMaxOtherSettings and kMaxOtherSettingBytes); the rest are skipped.
inline constexpr size_t kMaxTraceOtherSettings = 64;
inline constexpr size_t kMaxTraceOtherSettingBytes = 4096;
struct TraceOtherSetting {
  enum Kind : uint8_t { kNone = 0, kBool = 1, kInt = 2, kUInt = 3, kFloat = 4, kStr = 5 };
  std::string key;
  uint8_t kind = kNone;
  uint64_t bits = 0;  // Bool, Int (two's complement), UInt, Float (IEEE bits)
  std::string text;   // Str
};

struct TraceSettings {
  std::string_view conf;  // PYTORCH_CUDA_ALLOC_CONF (owned by the writer's caller / the reader)
  int64_t max_split_size = -1;
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  bool has_roundup = false;
  bool has_graph_capture_key = false;
  uint32_t roundup_power2_divisions[16] = {};
  std::vector<TraceOtherSetting> other;
};

// TraceMeta::traits: which PyTorch snapshot keys the source had (format::FormatTraits), one bit
// per flag in this order. Append only: the bit positions are part of the format.
namespace traits {
inline constexpr uint64_t kTopLevelList = uint64_t{1} << 0;
inline constexpr uint64_t kDeviceTraces = uint64_t{1} << 1;
inline constexpr uint64_t kBlockHistory = uint64_t{1} << 2;
inline constexpr uint64_t kBlockAddress = uint64_t{1} << 3;
inline constexpr uint64_t kSegmentPoolId = uint64_t{1} << 4;
inline constexpr uint64_t kTimeUs = uint64_t{1} << 5;
inline constexpr uint64_t kAllocatorSettings = uint64_t{1} << 6;
inline constexpr uint64_t kAnnotationsKey = uint64_t{1} << 7;
inline constexpr uint64_t kCompileContext = uint64_t{1} << 8;
inline constexpr uint64_t kGraphCaptureKey = uint64_t{1} << 9;
inline constexpr uint64_t kUserMetadata = uint64_t{1} << 10;
inline constexpr uint64_t kPoolId = uint64_t{1} << 11;
inline constexpr uint64_t kHostTraces = uint64_t{1} << 12;
inline constexpr uint64_t kAnnotateAction = uint64_t{1} << 13;
inline constexpr int kCount = 14;
}  // namespace traits

// Where the content came from (Meta chunk). All fields optional in the file.
struct TraceMeta {
  std::string_view producer;       // e.g. "memforensics 0.1.0 convert", "memforensics capture"
  std::string_view source_format;  // "pickle", "memory_viz_html", "json", "capture"
  uint64_t source_bytes = 0;       // size of the file it was converted from
  uint32_t pickle_protocol = 0;
  uint64_t traits = 0;  // FormatTraits as a bit set (traits:: above)
  uint64_t host_trace_events = 0;
  std::string_view ignored_keys;  // top-level keys of the source that were not kept, '\n'-joined
  // What the reader of the source said about it (load warnings, e.g. out-of-range time_us values
  // read as "no time"), '\n'-joined, so that a converted file keeps saying it (format 1.1).
  std::string_view source_warnings;
  int64_t created_unix_us = 0;
};

}  // namespace memforensics::format::trace
