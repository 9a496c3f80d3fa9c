// trace_reader.h: reads a native trace (trace_format.h) chunk by chunk, treating it as hostile.
//
// The reader walks the file front to back and never needs more of it in memory than one chunk
// (callers map the file and release pages behind it). Every chunk is checked (magic, sizes,
// CRC-32C, then every id and count inside it) before its content is handed out. Reading stops at
// the first chunk that fails; end() then says whether the file was merely cut short (a killed
// writer: everything before is good) or damaged in the middle, and how many bytes were not read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "format/trace/trace_events.h"
#include "format/trace/trace_format.h"
#include "format/trace/trace_state.h"

namespace memforensics::format::trace {

struct ChunkRef {
  uint64_t offset = 0;  // of the chunk header
  uint8_t type = 0;
  uint8_t codec = 0;
  uint32_t stored_size = 0;
  uint32_t raw_size = 0;
};

// How reading ended.
struct TraceEnd {
  bool complete = false;    // the trailer was read: nothing is missing
  bool truncated = false;   // the file ends inside a chunk or before the trailer (writer killed)
  bool damaged = false;     // a chunk failed its checks with more data after it
  uint64_t good_bytes = 0;  // bytes up to the end of the last good chunk
  uint64_t lost_bytes = 0;  // bytes after that (not read)
  uint64_t chunks = 0;      // good chunks read
  std::string reason;       // what stopped the reading, with its byte offset
  std::vector<std::string>
      notes;  // harmless oddities (skipped unknown chunks, bytes after the end)
};

struct TrailerInfo {
  bool present = false;
  uint64_t events = 0, chunks = 0, strings = 0, frames = 0, stacks = 0, pools = 0;
  uint64_t dropped = 0, checkpoints = 0;
  bool has_final_state = false;
  std::map<uint32_t, uint64_t> device_events;
  // Number of per-device traces, empty ones included (format 1.1; absent in 1.0 files and in
  // captures, where the events' devices imply it).
  bool has_device_traces = false;
  uint64_t device_traces = 0;
};

struct FrameRec {
  uint32_t filename = 0;
  uint32_t name = 0;
  uint64_t line = 0;
};
struct StackNode {
  uint32_t parent = 0;
  uint32_t frame = 0;
};

// A chunk checked and decoded ahead of the reader, on another thread (the parallel loader of
// format/load): TraceReader::setPrepared uses it instead of checking and decompressing again.
struct PreparedChunk {
  uint64_t offset = 0;               // of the chunk header
  bool verified = false;             // its CRC-32C matched and a zstd payload decoded in full
  std::vector<uint8_t> raw;          // the decompressed payload of a zstd chunk
  std::span<const uint8_t> payload;  // the payload (in `raw` or in the file) when verified
  // Events chunks whose records the caller decoded (for well-formedness; not against the tables):
  bool events_decoded = false;
  uint64_t event_count = 0;
  IdExtent ids;
  std::vector<std::pair<uint32_t, uint64_t>> device_events;  // events per device (any order)
  // Checkpoint and Segments chunks checked by the caller against no tables (precheckChunk):
  // true when well-formed, with the stack and string ids they refer to summed up in `ids`; a
  // Segments chunk's content is then in segments and blocks (the reader takes it from there).
  bool prechecked = false;
  std::vector<TraceSegment> segments;
  std::vector<TraceBlock> blocks;
};

// Checks a verified Checkpoint or Segments chunk (`type`) of `p` ahead of the reader, as next()
// would check it but against no tables (ids of any size pass; the reader compares p.ids with the
// tables it has read when it reaches the chunk, and decodes the chunk itself where they do not
// fit or the check failed, so that its messages stay the reference). Sets p.prechecked; keeps a
// Segments chunk's segments and blocks (bounded by its payload, as next() bounds them). Any other
// type: nothing is done. Safe to run for different chunks on different threads.
void precheckChunk(uint8_t type, PreparedChunk& p);

// Checks and decompresses chunks apart from a reader, one per thread.
class ChunkPreparer {
 public:
  ChunkPreparer();
  ~ChunkPreparer();
  ChunkPreparer(const ChunkPreparer&) = delete;
  ChunkPreparer& operator=(const ChunkPreparer&) = delete;
  // The decoded size a zstd chunk's frame header declares, 0 when it declares none or one past
  // kMaxChunkBytes (next() then refuses the chunk).
  static uint64_t declaredSize(std::span<const uint8_t> stored);
  // Fills p.verified, p.raw and p.payload for the chunk `c` of `file` (found by a headers-only
  // pass): true when next() would find its checksum right and its payload decoding in full.
  // With `into`, a zstd payload is decoded there instead of into p.raw (p.payload then points
  // into it): the caller's buffer of at least declaredSize(the chunk's stored bytes) bytes.
  bool prepare(std::span<const uint8_t> file, const ChunkRef& c, PreparedChunk& p,
               uint8_t* into = nullptr);

 private:
  struct Zstd;
  std::unique_ptr<Zstd> zstd_;
};

class TraceReader {
 public:
  // Checks the file header. `bytes` must outlive the reader.
  static Expected<std::unique_ptr<TraceReader>> open(std::span<const uint8_t> bytes);
  ~TraceReader();

  uint16_t versionMajor() const { return major_; }
  uint16_t versionMinor() const { return minor_; }
  int64_t createdUnixUs() const { return created_; }

  // Reads and decodes the next chunk. Returns true when one was read (see chunk() and the
  // accessors of its type), false when reading ended (see end()).
  bool next();
  const ChunkRef& chunk() const { return chunk_; }
  const TraceEnd& end() const { return end_; }

  // Content of the current chunk.
  std::span<const TraceEvent> events() const { return events_; }  // Events
  const TraceMeta& meta() const { return meta_; }                 // Meta (also kept afterwards)
  const std::vector<std::pair<uint32_t, DeviceTraceState>>& checkpoint() const {
    return checkpoint_;
  }

  // Accumulated over the chunks read so far.
  uint32_t stringCount() const { return static_cast<uint32_t>(string_views_.size()); }
  std::string_view string(uint32_t id) const { return string_views_[id]; }
  const std::vector<FrameRec>& frames() const { return frames_; }
  const std::vector<StackNode>& stacks() const { return stacks_; }  // [0] and [1] are placeholders
  const std::vector<std::pair<uint64_t, uint64_t>>& pools() const { return pools_; }
  bool hasSettings() const { return has_settings_; }
  const TraceSettings& settings() const { return settings_; }
  const std::vector<TraceAnnotation>& annotations() const { return annotations_; }
  bool hasFinalState() const { return has_final_state_; }
  const std::vector<TraceSegment>& segments() const { return segments_; }
  const std::vector<TraceBlock>& blocks() const { return blocks_; }
  const TrailerInfo& trailer() const { return trailer_; }
  uint64_t eventsRead() const { return events_read_; }
  uint64_t checkpointsRead() const { return checkpoints_read_; }

  // When set, Events chunks are checked only for well-formedness, not against the tables (for
  // callers that skip table chunks, like traceStateAt).
  void setSkipTables(bool skip) { skip_tables_ = skip; }
  // When set, next() only walks chunk headers (no checksum, no decoding): a fast index pass.
  void setHeadersOnly(bool only) { headers_only_ = only; }
  // Chunks prepared ahead (sorted by offset, outliving the reader's use of them): next() takes a
  // verified one's payload instead of checking and decompressing the chunk again (the budget of
  // decoded bytes is still counted here, in file order). An Events chunk whose records the caller
  // decoded is accepted without decoding when its ids fit the tables read so far: events() is
  // then empty and eventsDeferred() true; otherwise it is decoded here (and refused as before).
  // A prechecked Checkpoint chunk (with setCheckpointsCheckedOnly) or Segments chunk whose ids fit
  // the tables is accepted the same way without decoding (a Segments chunk's content is moved out
  // of its PreparedChunk).
  void setPrepared(std::span<PreparedChunk> prepared) {
    prepared_ = prepared;
    prepared_next_ = 0;
  }
  bool eventsDeferred() const { return events_deferred_; }
  // When set, Checkpoint chunks are checked as before but not kept (checkpoint() stays empty):
  // for callers that read the whole file and have no use for them.
  void setCheckpointsCheckedOnly(bool only) { checkpoints_checked_only_ = only; }
  // Positions the reader at a chunk boundary found by an earlier pass (offsets from chunk()).
  void seek(uint64_t offset) {
    pos_ = offset;
    finished_ = false;
    end_ = TraceEnd{};
    end_.good_bytes = offset;
  }

 private:
  explicit TraceReader(std::span<const uint8_t> bytes);
  bool stop(bool truncated, std::string reason);
  Status decode(ChunkType type, std::span<const uint8_t> payload);
  Status decodeEvents(std::span<const uint8_t> p);
  Status decodeStrings(std::span<const uint8_t> p);
  Status decodeFrames(std::span<const uint8_t> p);
  Status decodeStacks(std::span<const uint8_t> p);
  Status decodePools(std::span<const uint8_t> p);
  Status decodeMeta(std::span<const uint8_t> p);
  Status decodeSettings(std::span<const uint8_t> p);
  Status decodeAnnotations(std::span<const uint8_t> p);
  Status decodeSegments(std::span<const uint8_t> p);
  Status decodeCheckpoint(std::span<const uint8_t> p);
  Status decodeTrailer(std::span<const uint8_t> p);

  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
  uint16_t major_ = 0, minor_ = 0;
  int64_t created_ = 0;
  bool finished_ = false;
  bool skip_tables_ = false;
  bool headers_only_ = false;
  ChunkRef chunk_;
  TraceEnd end_;
  std::vector<uint8_t> raw_;  // decompressed payload
  struct ZstdContext;
  std::unique_ptr<ZstdContext> zstd_;
  uint64_t zstd_decoded_ = 0;  // bytes decoded from zstd chunks so far (against decodedBudget)

  std::span<PreparedChunk> prepared_;
  size_t prepared_next_ = 0;
  bool events_deferred_ = false;
  bool checkpoints_checked_only_ = false;

  std::vector<TraceEvent> events_;
  uint64_t events_read_ = 0;
  std::map<uint32_t, uint64_t> device_events_read_;
  uint64_t checkpoints_read_ = 0;
  std::vector<std::pair<uint32_t, DeviceTraceState>> checkpoint_;
  std::string meta_storage_[4];
  TraceMeta meta_;
  std::vector<std::unique_ptr<char[]>> string_blocks_;
  std::vector<std::string_view> string_views_{std::string_view{}};
  std::vector<FrameRec> frames_;
  std::vector<StackNode> stacks_{StackNode{}, StackNode{}};
  std::vector<std::pair<uint64_t, uint64_t>> pools_{{0, 0}};
  bool has_settings_ = false;
  std::string settings_conf_;
  TraceSettings settings_;
  std::vector<TraceAnnotation> annotations_;
  bool has_final_state_ = false;
  std::vector<TraceSegment> segments_;
  std::vector<TraceBlock> blocks_;
  TrailerInfo trailer_;
};

// The trailer of a complete file, found through its end mark without reading the chunks before
// it: a hint (e.g. for reserving memory), checked for integrity but not against the content.
std::optional<TrailerInfo> peekTrailer(std::span<const uint8_t> bytes);

// True when the bytes start with the trace magic (or a prefix of it, for a tiny cut file).
bool looksLikeTrace(std::span<const uint8_t> bytes);

// The trace-derived state of `device` after its first `events` events, using the nearest
// checkpoint before it and decoding only the chunks after that checkpoint.
Expected<DeviceTraceState> traceStateAt(std::span<const uint8_t> bytes, uint32_t device,
                                        uint64_t events);

}  // namespace memforensics::format::trace
