// trace_writer.h: appends events to a native trace file (format: trace_format.h,
// docs/trace-format.md), one thread, one event at a time.
//
// Strings, frames, stacks and pools are interned as they come; new table entries are written in
// their own chunks just before the first Events chunk that uses them. Events are buffered into a
// chunk of about `chunk_bytes` and written with one write(2); call flush() to bound what a crash
// can lose (the capture's writer thread does so periodically). close() writes the optional final
// state, the trailer and the end mark. A writer that is destroyed without close() leaves a file
// that reads back to its last complete chunk.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/flat_map.h"
#include "common/status.h"
#include "format/trace/trace_format.h"
#include "format/trace/trace_state.h"

namespace memforensics::format::trace {

// Where the bytes go. write() gets whole chunks.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual Status write(std::span<const uint8_t> bytes) = 0;
};

class VectorSink : public ByteSink {
 public:
  Status write(std::span<const uint8_t> bytes) override {
    data.insert(data.end(), bytes.begin(), bytes.end());
    return Status::Ok();
  }
  std::vector<uint8_t> data;
};

// A file opened with O_CREAT|O_TRUNC; writes retry on EINTR and short writes.
class FileSink : public ByteSink {
 public:
  static Expected<std::unique_ptr<FileSink>> create(const std::string& path);
  ~FileSink() override;
  Status write(std::span<const uint8_t> bytes) override;
  Status sync();  // fdatasync
  Status closeFile();

 private:
  explicit FileSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

struct WriterOptions {
  int zstd_level = 0;                    // 0: chunks stored as they are; 1-19: zstd per chunk
  uint32_t chunk_bytes = 1u << 20;       // an Events chunk is written when its payload reaches this
  uint64_t checkpoint_every = 1u << 18;  // events between checkpoints (0: no checkpoints)
};

struct WriterStats {
  uint64_t events = 0;
  uint64_t chunks = 0;
  uint64_t checkpoints = 0;
  uint64_t bytes_written = 0;
  uint64_t raw_payload_bytes = 0;  // before compression
};

class TraceWriter {
 public:
  TraceWriter(ByteSink& sink, const WriterOptions& options = {});
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // The header and, when given, the Meta chunk. Must be the first call.
  Status begin(const TraceMeta& meta);

  uint32_t string(std::string_view s);  // 0 for ""
  uint32_t frame(uint32_t filename, uint32_t name, uint64_t line);
  uint32_t stack(uint32_t parent, uint32_t frame);  // parent: kTraceRootStack for the outermost
  uint32_t pool(uint64_t a, uint64_t b);            // 0 for (0, 0)

  Status event(const TraceEvent& e) {
    if (e.device >= kMaxDevice) {
      return Error{"device " + std::to_string(e.device) +
                       " is not a device ordinal (a native trace holds traces of devices 0 to " +
                       std::to_string(kMaxDevice - 1) + ")",
                   -1};
    }
    if (buf_.size() - used_ < kMaxRecord) {
      Status s = makeRoom();
      if (!s.ok()) return s;
    }
    encode(e);
    if (options_.checkpoint_every != 0) state_.apply(e);
    ++stats_.events;
    ++chunk_events_;
    if (used_ >= options_.chunk_bytes) return flush();
    return Status::Ok();
  }
  // Records that `n` events were lost before reaching the writer (ring overflow); kept in the
  // trailer.
  void noteDropped(uint64_t n) { dropped_ += n; }

  // Writes pending tables and buffered events as complete chunks.
  Status flush();

  // Optional final sections, written by close(). Ids must have been interned by this writer.
  void setSettings(const TraceSettings& s, std::string conf_storage);
  void addAnnotation(const TraceAnnotation& a) { annotations_.push_back(a); }
  void setFinalState(std::vector<TraceSegment> segments, std::vector<TraceBlock> blocks);
  // The number of per-device traces, empty ones included (PyTorch's `device_traces` may end with
  // devices that recorded nothing). Written to the trailer; at least the highest event device + 1
  // and at most kMaxDevice. Without it a reader infers the count from the events' devices.
  void setDeviceTraceCount(uint64_t n) {
    has_device_traces_ = true;
    device_traces_ = n;
  }

  // Flushes, writes the final sections and the trailer. The writer is unusable afterwards.
  Status close();
  const WriterStats& stats() const { return stats_; }

 private:
  static constexpr size_t kMaxRecord = 1 + 10 * 9;
  void encode(const TraceEvent& e);
  Status makeRoom();
  Status writeChunk(ChunkType type, std::span<const uint8_t> payload);
  Status writeTables();
  Status writeCheckpoint();
  void tablesGrew(
      size_t pending_bytes);  // writes the tables when their pending bytes reach kTableChunkBytes
  void referStack(uint32_t id);  // counts the frames a reader expands for stack `id`

  ByteSink& sink_;
  WriterOptions options_;
  WriterStats stats_;
  bool begun_ = false;
  bool closed_ = false;
  Status failed_;  // sticky: after a failed write every call reports it

  // Tables: everything interned so far; pending_* is what is not yet written.
  std::unordered_map<std::string, uint32_t> strings_;
  uint32_t string_count_ = 1;
  std::vector<uint8_t> pending_strings_;
  uint32_t pending_string_count_ = 0;
  struct FrameKey {
    uint32_t filename, name;
    uint64_t line;
    bool operator==(const FrameKey&) const = default;
  };
  struct FrameHash {
    size_t operator()(const FrameKey& k) const noexcept {
      uint64_t h = (uint64_t{k.filename} << 32 | k.name) * 0x9E3779B97F4A7C15ull;
      return static_cast<size_t>(h ^ (k.line * 0xC2B2AE3D27D4EB4Full) ^ (h >> 29));
    }
  };
  std::unordered_map<FrameKey, uint32_t, FrameHash> frames_;
  uint32_t frame_count_ = 0;
  std::vector<uint8_t> pending_frames_;
  uint32_t pending_frame_count_ = 0;
  uint32_t prev_frame_file_ = 0, prev_frame_name_ = 0;
  U64Map<uint32_t> stacks_;  // (parent << 32 | frame) -> id
  uint32_t stack_count_ = 2;
  std::vector<uint8_t> pending_stacks_;
  uint32_t pending_stack_count_ = 0;
  uint32_t prev_stack_frame_ = 0;
  // For the stack frame budget (trace_format.h): each node's depth, whether something refers to
  // it, and the frames of all referred nodes (what a reader expands).
  std::vector<uint32_t> stack_depth_{0, 0};
  std::vector<bool> stack_referred_{true, true};
  uint64_t expanded_frames_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> pools_{{0, 0}};
  std::map<std::pair<uint64_t, uint64_t>, uint32_t> pool_index_;
  uint32_t pending_pool_from_ = 1;

  // Events chunk being filled: buf_[0, used_), with room reserved for the count prefix.
  std::vector<uint8_t> buf_;
  size_t used_ = 0;
  uint64_t chunk_events_ = 0;
  // Delta state of the chunk being filled.
  uint32_t prev_device_ = 0, prev_stack_ = 0;
  int64_t prev_stream_ = 0;
  uint64_t prev_addr_ = 0, prev_time_ = 0;
  uint32_t ctx_compile_ = 0, ctx_user_ = 0, ctx_pool_ = 0, ctx_action_ = 0;

  TraceState state_;
  uint64_t events_at_checkpoint_ = 0;
  uint64_t dropped_ = 0;
  std::vector<uint64_t> device_events_;

  bool has_settings_ = false;
  TraceSettings settings_;
  std::string settings_conf_;
  std::vector<TraceAnnotation> annotations_;
  bool has_device_traces_ = false;
  uint64_t device_traces_ = 0;
  bool has_final_state_ = false;
  std::vector<TraceSegment> segments_;
  std::vector<TraceBlock> blocks_;

  std::vector<uint8_t> scratch_;  // chunk header + (compressed) payload
  struct ZstdContext;
  std::unique_ptr<ZstdContext> zstd_;
  uint64_t offset_ = 0;        // bytes written so far
  uint64_t zstd_decoded_ = 0;  // decoded size of the zstd chunks written (against decodedBudget)
};

}  // namespace memforensics::format::trace
