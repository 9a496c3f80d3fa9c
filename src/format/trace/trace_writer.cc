// trace_writer.cc: see trace_writer.h; the byte layout is in trace_format.h.
#include "format/trace/trace_writer.h"

#include <fcntl.h>
#include <unistd.h>
#ifndef MEMF_HAVE_ZSTD  // cmake/MemfZstd.cmake sets 0 for capture-only builds without libzstd
#define MEMF_HAVE_ZSTD 1
#endif
#if MEMF_HAVE_ZSTD
#include <zstd.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace memforensics::format::trace {

// ---------------------------------------------------------------------------------------------
// Sinks

Expected<std::unique_ptr<FileSink>> FileSink::create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Error{"cannot create " + path + ": " + std::strerror(errno), -1};
  return std::unique_ptr<FileSink>(new FileSink(fd, path));
}

FileSink::~FileSink() {
  if (fd_ >= 0) ::close(fd_);
}

Status FileSink::write(std::span<const uint8_t> bytes) {
  const uint8_t* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{"cannot write " + path_ + ": " + std::strerror(errno), -1};
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status FileSink::sync() {
  if (::fdatasync(fd_) != 0) return Error{"cannot sync " + path_ + ": " + std::strerror(errno), -1};
  return Status::Ok();
}

Status FileSink::closeFile() {
  if (fd_ < 0) return Status::Ok();
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return Error{"cannot close " + path_ + ": " + std::strerror(errno), -1};
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Small encoders for table and section payloads.

namespace {

void putVar(std::vector<uint8_t>& out, uint64_t v) {
  uint8_t tmp[10];
  uint8_t* e = putVarint(tmp, v);
  out.insert(out.end(), tmp, e);
}
void putBytes(std::vector<uint8_t>& out, std::string_view s) {
  putVar(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}
// Tag-length-value fields of Meta, Settings and Trailer: key = tag << 1 | is_bytes.
void tlvVar(std::vector<uint8_t>& out, uint32_t tag, uint64_t v) {
  putVar(out, uint64_t{tag} << 1);
  putVar(out, v);
}
void tlvBytes(std::vector<uint8_t>& out, uint32_t tag, std::string_view s) {
  putVar(out, uint64_t{tag} << 1 | 1);
  putBytes(out, s);
}

constexpr size_t kCountRoom =
    10;  // the Events chunk's count varint is written in front of the records

}  // namespace

#if MEMF_HAVE_ZSTD
struct TraceWriter::ZstdContext {
  ZSTD_CCtx* ctx = ZSTD_createCCtx();
  ~ZstdContext() { ZSTD_freeCCtx(ctx); }
};
#else
struct TraceWriter::ZstdContext {};  // without zstd every chunk is stored (Codec::None)
#endif

TraceWriter::TraceWriter(ByteSink& sink, const WriterOptions& options)
    : sink_(sink), options_(options) {
  options_.chunk_bytes = std::clamp<uint32_t>(options_.chunk_bytes, 4096, kMaxChunkBytes / 2);
  buf_.resize(kCountRoom + options_.chunk_bytes + 2 * kMaxRecord);
  used_ = kCountRoom;
  strings_.emplace("", 0);
#if MEMF_HAVE_ZSTD
  if (options_.zstd_level > 0) zstd_ = std::make_unique<ZstdContext>();
#endif
}

TraceWriter::~TraceWriter() = default;

Status TraceWriter::begin(const TraceMeta& meta) {
  if (begun_) return Error{"TraceWriter::begin called twice", -1};
  begun_ = true;
  uint8_t h[kHeaderSize] = {};
  std::memcpy(h, kMagic, 8);
  putU16(h + 8, kVersionMajor);
  putU16(h + 10, kVersionMinor);
  putU32(h + 12, kHeaderSize);
  putU32(h + 16, 0);  // flags
  int64_t created = meta.created_unix_us;
  if (created == 0) {
    created = std::chrono::duration_cast<std::chrono::microseconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count();
  }
  putU64(h + 20, static_cast<uint64_t>(created));
  putU32(h + 28, crc32c(0, h, 28));
  Status s = sink_.write({h, kHeaderSize});
  if (!s.ok()) return failed_ = s;
  offset_ = kHeaderSize;
  stats_.bytes_written = offset_;

  std::vector<uint8_t> m;
  if (!meta.producer.empty()) tlvBytes(m, 1, meta.producer);
  if (!meta.source_format.empty()) tlvBytes(m, 2, meta.source_format);
  if (meta.source_bytes) tlvVar(m, 3, meta.source_bytes);
  if (meta.pickle_protocol) tlvVar(m, 4, meta.pickle_protocol);
  if (meta.traits) tlvVar(m, 5, meta.traits);
  if (meta.host_trace_events) tlvVar(m, 6, meta.host_trace_events);
  if (!meta.ignored_keys.empty()) tlvBytes(m, 7, meta.ignored_keys);
  if (!meta.source_warnings.empty()) tlvBytes(m, 8, meta.source_warnings);
  return writeChunk(ChunkType::Meta, m);
}

uint32_t TraceWriter::string(std::string_view s) {
  auto [it, fresh] = strings_.try_emplace(std::string(s), string_count_);
  if (fresh) {
    ++string_count_;
    ++pending_string_count_;
    putBytes(pending_strings_, s);
    tablesGrew(pending_strings_.size());
  }
  return it->second;
}

uint32_t TraceWriter::frame(uint32_t filename, uint32_t name, uint64_t line) {
  auto [it, fresh] = frames_.try_emplace(FrameKey{filename, name, line}, frame_count_);
  if (fresh) {
    ++frame_count_;
    ++pending_frame_count_;
    // Consecutive frames tend to use neighbouring string ids: deltas stay one byte.
    putVar(pending_frames_,
           zigzag(static_cast<int64_t>(filename) - static_cast<int64_t>(prev_frame_file_)));
    putVar(pending_frames_,
           zigzag(static_cast<int64_t>(name) - static_cast<int64_t>(prev_frame_name_)));
    putVar(pending_frames_, line + 1);  // the unknown line (2^64-1) becomes 0
    prev_frame_file_ = filename;
    prev_frame_name_ = name;
    tablesGrew(pending_frames_.size());
  }
  return it->second;
}

uint32_t TraceWriter::stack(uint32_t parent, uint32_t frame) {
  uint64_t key = uint64_t{parent} << 32 | frame;
  if (const uint32_t* id = stacks_.find(key)) return *id;
  uint32_t id = stack_count_++;
  stacks_.insert(key, id);
  ++pending_stack_count_;
  // A stack is usually built right after its parent, and from frames defined in a row.
  putVar(pending_stacks_, id - parent);
  putVar(pending_stacks_,
         zigzag(static_cast<int64_t>(frame) - static_cast<int64_t>(prev_stack_frame_)));
  prev_stack_frame_ = frame;
  stack_depth_.push_back(parent < stack_depth_.size() ? stack_depth_[parent] + 1 : 1);
  stack_referred_.push_back(false);
  tablesGrew(pending_stacks_.size());
  return id;
}

uint32_t TraceWriter::pool(uint64_t a, uint64_t b) {
  if (a == 0 && b == 0) return 0;
  auto [it, fresh] = pool_index_.try_emplace({a, b}, static_cast<uint32_t>(pools_.size()));
  if (fresh) {
    pools_.emplace_back(a, b);
    tablesGrew((pools_.size() - pending_pool_from_) * 20);
  }
  return it->second;
}

void TraceWriter::tablesGrew(size_t pending_bytes) {
  // Tables may be written at any time before the Events chunk that first uses them; writing them
  // in pieces keeps every table chunk far below kMaxChunkBytes however many entries come at once
  // (a 30-million-frame stack). The events buffered so far go in a later chunk, after their ids.
  if (pending_bytes >= kTableChunkBytes && begun_ && !closed_ && failed_.ok()) (void)writeTables();
}

void TraceWriter::referStack(uint32_t id) {
  if (id < stack_referred_.size() && !stack_referred_[id]) {
    stack_referred_[id] = true;
    expanded_frames_ += stack_depth_[id];
  }
}

void TraceWriter::encode(const TraceEvent& e) {
  referStack(e.stack);
  uint8_t* base = buf_.data();
  uint8_t* p = base + used_;
  uint8_t* head = p++;
  uint8_t action = e.action > 10 ? 10 : e.action;
  uint8_t h = action;
  if (e.device != prev_device_) {
    h |= kHeadDevice;
    p = putVarint(p, e.device);
    prev_device_ = e.device;
    if (e.device >= device_events_.size()) device_events_.resize(e.device + 1);
  }
  if (e.stream != prev_stream_) {
    h |= kHeadStream;
    p = putVarint(p, zigzag(static_cast<int64_t>(static_cast<uint64_t>(e.stream) -
                                                 static_cast<uint64_t>(prev_stream_))));
    prev_stream_ = e.stream;
  }
  uint32_t action_name = keptActionName(action, e.action_name);
  if (e.compile_context != ctx_compile_ || e.user_metadata != ctx_user_ || e.pool != ctx_pool_ ||
      action_name != ctx_action_) {
    h |= kHeadContext;
    uint8_t mask = (e.compile_context != ctx_compile_ ? kCtxCompile : 0) |
                   (e.user_metadata != ctx_user_ ? kCtxUser : 0) |
                   (e.pool != ctx_pool_ ? kCtxPool : 0) |
                   (action_name != ctx_action_ ? kCtxActionName : 0);
    *p++ = mask;
    if (mask & kCtxCompile) p = putVarint(p, ctx_compile_ = e.compile_context);
    if (mask & kCtxUser) p = putVarint(p, ctx_user_ = e.user_metadata);
    if (mask & kCtxPool) p = putVarint(p, ctx_pool_ = e.pool);
    if (mask & kCtxActionName) p = putVarint(p, ctx_action_ = action_name);
  }
  if (e.stack == prev_stack_) {
    h |= kHeadSameStack;
  } else {
    p = putVarint(p, zigzag(static_cast<int64_t>(e.stack) - static_cast<int64_t>(prev_stack_)));
    prev_stack_ = e.stack;
  }
  p = putVarint(p, zigzag(static_cast<int64_t>(e.addr - prev_addr_)));
  prev_addr_ = e.addr;
  p = putVarint(p, e.size);
  uint64_t t = static_cast<uint64_t>(e.time_us) + 1;  // -1 (no time) becomes 0
  p = putVarint(p, zigzag(static_cast<int64_t>(t - prev_time_)));
  prev_time_ = t;
  *head = h;
  used_ = static_cast<size_t>(p - base);
  if (device_events_.empty()) device_events_.resize(1);
  ++device_events_[e.device];
}

Status TraceWriter::makeRoom() {
  return flush();
}

Status TraceWriter::writeChunk(ChunkType type, std::span<const uint8_t> payload) {
  if (!failed_.ok()) return failed_;
  if (payload.size() > kMaxChunkBytes) {
    return failed_ =
               Error{"a native trace " + std::string(chunkTypeName(static_cast<uint8_t>(type))) +
                         " chunk of " + std::to_string(payload.size()) +
                         " bytes would exceed the format's limit of " +
                         std::to_string(kMaxChunkBytes) + " bytes per chunk",
                     -1};
  }
  uint8_t codec = 0;
  std::span<const uint8_t> stored = payload;
  scratch_.resize(kChunkHeaderSize);
  // Tables are written once and read on every load: they get a stronger level than events.
  int level = type == ChunkType::Events ? options_.zstd_level : std::max(options_.zstd_level, 19);
  // The trailer stays uncompressed: readers peek at it through the end mark (peekTrailer).
#if MEMF_HAVE_ZSTD
  if (zstd_ && payload.size() >= 64 && type != ChunkType::Trailer) {
    size_t bound = ZSTD_compressBound(payload.size());
    scratch_.resize(kChunkHeaderSize + bound);
    size_t n = ZSTD_compressCCtx(zstd_->ctx, scratch_.data() + kChunkHeaderSize, bound,
                                 payload.data(), payload.size(), level);
    // The reader allows the zstd chunks of a file decodedBudget(file size) decoded bytes in all:
    // a chunk that compresses so well that it would pass the budget for the file written so far
    // (which only grows) is stored as it is instead.
    const uint64_t file_after = offset_ + kChunkHeaderSize + n;
    const bool within_budget = zstd_decoded_ + payload.size() <= decodedBudget(file_after);
    if (!ZSTD_isError(n) && n < payload.size() && within_budget) {
      zstd_decoded_ += payload.size();
      codec = static_cast<uint8_t>(Codec::Zstd);
      scratch_.resize(kChunkHeaderSize + n);
      stored = {scratch_.data() + kChunkHeaderSize, n};
    } else {
      scratch_.resize(kChunkHeaderSize);
    }
  }
#else
  (void)level;
#endif
  uint8_t* h = scratch_.data();
  h[0] = static_cast<uint8_t>(type);
  h[1] = codec;
  putU16(h + 2, 0);
  putU32(h + 4, static_cast<uint32_t>(stored.size()));
  uint32_t crc = crc32c(0, h, 8);
  crc = crc32c(crc, stored.data(), stored.size());
  putU32(h + 8, crc);
  Status s;
  if (codec == 0) {
    // Header and payload in one write(2), so a killed process leaves whole chunks more often.
    scratch_.insert(scratch_.end(), payload.begin(), payload.end());
    s = sink_.write(scratch_);
  } else {
    s = sink_.write(scratch_);
  }
  if (!s.ok()) return failed_ = s;
  offset_ += kChunkHeaderSize + stored.size();
  stats_.bytes_written = offset_;
  stats_.raw_payload_bytes += payload.size();
  ++stats_.chunks;
  return Status::Ok();
}

Status TraceWriter::writeTables() {
  std::vector<uint8_t> p;
  if (pending_string_count_ > 0) {
    putVar(p, string_count_ - pending_string_count_);
    putVar(p, pending_string_count_);
    p.insert(p.end(), pending_strings_.begin(), pending_strings_.end());
    Status s = writeChunk(ChunkType::Strings, p);
    if (!s.ok()) return s;
    pending_strings_.clear();
    pending_string_count_ = 0;
    p.clear();
  }
  if (pending_frame_count_ > 0) {
    putVar(p, frame_count_ - pending_frame_count_);
    putVar(p, pending_frame_count_);
    p.insert(p.end(), pending_frames_.begin(), pending_frames_.end());
    Status s = writeChunk(ChunkType::Frames, p);
    if (!s.ok()) return s;
    pending_frames_.clear();
    pending_frame_count_ = 0;
    prev_frame_file_ = prev_frame_name_ = 0;
    p.clear();
  }
  if (pending_stack_count_ > 0) {
    putVar(p, stack_count_ - pending_stack_count_);
    putVar(p, pending_stack_count_);
    p.insert(p.end(), pending_stacks_.begin(), pending_stacks_.end());
    Status s = writeChunk(ChunkType::Stacks, p);
    if (!s.ok()) return s;
    pending_stacks_.clear();
    pending_stack_count_ = 0;
    prev_stack_frame_ = 0;
    p.clear();
  }
  if (pending_pool_from_ < pools_.size()) {
    putVar(p, pending_pool_from_);
    putVar(p, pools_.size() - pending_pool_from_);
    for (size_t i = pending_pool_from_; i < pools_.size(); ++i) {
      putVar(p, pools_[i].first);
      putVar(p, pools_[i].second);
    }
    Status s = writeChunk(ChunkType::Pools, p);
    if (!s.ok()) return s;
    pending_pool_from_ = static_cast<uint32_t>(pools_.size());
  }
  return Status::Ok();
}

Status TraceWriter::flush() {
  if (!failed_.ok()) return failed_;
  if (!begun_) return Error{"TraceWriter: begin() was not called", -1};
  if (closed_) return Error{"TraceWriter: already closed", -1};
  Status s = writeTables();
  if (!s.ok()) return s;
  if (chunk_events_ > 0) {
    uint8_t tmp[10];
    size_t n = static_cast<size_t>(putVarint(tmp, chunk_events_) - tmp);
    uint8_t* start = buf_.data() + kCountRoom - n;
    std::memcpy(start, tmp, n);
    s = writeChunk(ChunkType::Events, {start, used_ - (kCountRoom - n)});
    if (!s.ok()) return s;
    used_ = kCountRoom;
    chunk_events_ = 0;
    prev_device_ = prev_stack_ = 0;
    prev_stream_ = 0;
    prev_addr_ = prev_time_ = 0;
    ctx_compile_ = ctx_user_ = ctx_pool_ = ctx_action_ = 0;
  }
  if (options_.checkpoint_every != 0 &&
      stats_.events - events_at_checkpoint_ >= options_.checkpoint_every) {
    return writeCheckpoint();
  }
  return Status::Ok();
}

Status TraceWriter::writeCheckpoint() {
  events_at_checkpoint_ = stats_.events;
  std::vector<uint8_t> p;
  const auto& devs = state_.devices();
  uint64_t n = 0;
  for (const auto& [d, ds] : devs) n += ds.events() > 0;
  putVar(p, n);
  std::vector<std::pair<uint64_t, LiveAlloc>> live;
  for (const auto& [d, ds] : devs) {
    if (ds.events() == 0) continue;
    putVar(p, d);
    putVar(p, ds.events());
    live.clear();
    ds.live().forEach([&](uint64_t a, const LiveAlloc& l) { live.emplace_back(a, l); });
    std::sort(live.begin(), live.end(),
              [](const auto& x, const auto& y) { return x.first < y.first; });
    putVar(p, live.size());
    uint64_t prev_addr = 0;
    uint32_t prev_stack = 0;
    int64_t prev_stream = 0;
    for (const auto& [a, l] : live) {
      putVar(p, a - prev_addr);
      putVar(p, l.requested);
      putVar(p, zigzag(static_cast<int64_t>(l.stack) - static_cast<int64_t>(prev_stack)));
      putVar(p, zigzag(static_cast<int64_t>(static_cast<uint64_t>(l.stream) -
                                            static_cast<uint64_t>(prev_stream))));
      p.push_back(l.pending ? 1 : 0);
      prev_addr = a;
      prev_stack = l.stack;
      prev_stream = l.stream;
    }
    putVar(p, ds.reserved().size());
    prev_addr = 0;
    for (const AddressRange r : ds.reserved()) {
      putVar(p, r.begin - prev_addr);
      putVar(p, r.size());
      prev_addr = r.begin;
    }
  }
  // A checkpoint is an index, not content: one too large for a chunk (millions of live blocks) is
  // left out, and a reader finds the state from an earlier checkpoint or the start instead.
  if (p.size() > kMaxChunkBytes) return Status::Ok();
  Status s = writeChunk(ChunkType::Checkpoint, p);
  if (s.ok()) ++stats_.checkpoints;
  return s;
}

void TraceWriter::setSettings(const TraceSettings& s, std::string conf_storage) {
  has_settings_ = true;
  settings_ = s;
  settings_conf_ = std::move(conf_storage);
  settings_.conf = settings_conf_;
}

void TraceWriter::setFinalState(std::vector<TraceSegment> segments,
                                std::vector<TraceBlock> blocks) {
  has_final_state_ = true;
  for (const auto& g : segments) referStack(g.stack);
  for (const auto& b : blocks) referStack(b.stack);
  segments_ = std::move(segments);
  blocks_ = std::move(blocks);
}

Status TraceWriter::close() {
  if (closed_) return failed_;
  Status s = flush();
  if (!s.ok()) return s;
  closed_ = true;
  std::vector<uint8_t> p;
  if (has_settings_) {
    // Only what differs from PyTorch's defaults: the chunk's presence says "settings recorded".
    const TraceSettings& st = settings_;
    if (!st.conf.empty()) tlvBytes(p, 1, st.conf);
    if (st.max_split_size != -1) tlvVar(p, 2, zigzag(st.max_split_size));
    if (st.garbage_collection_threshold != 0.0) {
      uint64_t bits;
      std::memcpy(&bits, &st.garbage_collection_threshold, 8);
      tlvVar(p, 3, bits);
    }
    if (st.expandable_segments) tlvVar(p, 4, 1);
    if (st.has_roundup) {  // (index, divisions) pairs of the non-zero entries
      std::vector<uint8_t> r;
      for (uint32_t k = 0; k < 16; ++k) {
        if (st.roundup_power2_divisions[k] == 0) continue;
        putVar(r, k);
        putVar(r, st.roundup_power2_divisions[k]);
      }
      tlvBytes(p, 5, {reinterpret_cast<const char*>(r.data()), r.size()});
    }
    if (st.has_graph_capture_key) tlvVar(p, 6, 1);
    for (const TraceOtherSetting& o : st.other) {
      std::vector<uint8_t> e;
      putVar(e, o.key.size());
      e.insert(e.end(), o.key.begin(), o.key.end());
      e.push_back(o.kind);
      if (o.kind == TraceOtherSetting::kInt) {
        putVar(e, zigzag(static_cast<int64_t>(o.bits)));
      } else if (o.kind == TraceOtherSetting::kStr) {
        putVar(e, o.text.size());
        e.insert(e.end(), o.text.begin(), o.text.end());
      } else if (o.kind != TraceOtherSetting::kNone) {
        putVar(e, o.bits);
      }
      tlvBytes(p, 7, {reinterpret_cast<const char*>(e.data()), e.size()});
    }
    s = writeChunk(ChunkType::Settings, p);
    if (!s.ok()) return s;
    p.clear();
  }
  if (!annotations_.empty()) {
    // Annotation names may have been interned after the last flush.
    s = writeTables();
    if (!s.ok()) return s;
    // Readers append the annotations of every chunk: pieces of about kTableChunkBytes.
    std::vector<uint8_t> body;
    size_t in_body = 0;
    for (size_t i = 0; i < annotations_.size(); ++i) {
      const auto& a = annotations_[i];
      putVar(body, zigzag(a.device));
      putVar(body, zigzag(a.time_us));
      putVar(body, a.name);
      putVar(body, a.stage);
      ++in_body;
      if (body.size() >= kTableChunkBytes || i + 1 == annotations_.size()) {
        putVar(p, in_body);
        p.insert(p.end(), body.begin(), body.end());
        s = writeChunk(ChunkType::Annotations, p);
        if (!s.ok()) return s;
        p.clear();
        body.clear();
        in_body = 0;
      }
    }
  }
  if (has_final_state_) {
    s = writeTables();
    if (!s.ok()) return s;
    putVar(p, segments_.size());
    putVar(p, blocks_.size());
    for (const auto& g : segments_) {
      putVar(p, static_cast<uint64_t>(g.device));  // two's complement: any int64 device
      putVar(p, g.address);
      putVar(p, g.total_size);
      putVar(p, g.allocated_size);
      putVar(p, g.active_size);
      putVar(p, g.requested_size);
      putVar(p, zigzag(g.stream));
      putVar(p, g.pool_a);
      putVar(p, g.pool_b);
      putVar(p, g.stack);
      // Flag 4: segment_type is the usual "large"/"small" that is_large implies (no string needed).
      p.push_back(static_cast<uint8_t>((g.is_large ? 1 : 0) | (g.is_expandable ? 2 : 0) |
                                       (g.usual_type ? 4 : 0)));
      if (!g.usual_type) putVar(p, g.segment_type);
      putVar(p, g.block_count);
      uint64_t cursor = g.address;
      for (uint32_t i = 0; i < g.block_count; ++i) {
        const TraceBlock& b = blocks_[g.first_block + i];
        // Block sizes are multiples of 512 and requests a little below them: store the quotient
        // and the slack when that holds (flag bits 3 and 4), the plain values otherwise.
        bool units = b.size % 512 == 0;
        bool slack = b.has_requested_size && b.requested_size <= b.size;
        putVar(p, zigzag(static_cast<int64_t>(b.address - cursor)));
        p.push_back(static_cast<uint8_t>((b.state & 3) | (b.has_requested_size ? 4 : 0) |
                                         (units ? 8 : 0) | (slack ? 16 : 0)));
        putVar(p, units ? b.size / 512 : b.size);
        if (b.has_requested_size) putVar(p, slack ? b.size - b.requested_size : b.requested_size);
        putVar(p, b.stack);
        cursor = b.address + b.size;
      }
    }
    s = writeChunk(ChunkType::Segments, p);
    if (!s.ok()) return s;
    p.clear();
  }
  // What a reader will refuse is refused here, before the trailer makes the file complete.
  if (expanded_frames_ > stackFrameBudget(offset_)) {
    return failed_ =
               Error{"the stacks referred to expand to " + std::to_string(expanded_frames_) +
                         " frames, more than a native trace of " + std::to_string(offset_) +
                         " bytes may expand to (" + std::to_string(stackFrameBudget(offset_)) +
                         ": stack frame budget, trace_format.h)",
                     -1};
  }
  if (has_device_traces_) {
    uint64_t highest = 0;
    for (size_t d = 0; d < device_events_.size(); ++d) {
      if (device_events_[d] > 0) highest = d + 1;
    }
    if (device_traces_ > kMaxDevice || device_traces_ < highest) {
      return failed_ = Error{"device trace count " + std::to_string(device_traces_) +
                                 " is not between " + std::to_string(highest) +
                                 " (the events' devices) and " + std::to_string(kMaxDevice),
                             -1};
    }
  }
  uint64_t trailer_offset = offset_;
  tlvVar(p, 1, stats_.events);
  tlvVar(p, 2, stats_.chunks);
  // Table sizes and zero counts are implied by the chunks; only what is not is written.
  if (dropped_) tlvVar(p, 7, dropped_);
  if (stats_.checkpoints) tlvVar(p, 8, stats_.checkpoints);
  {
    std::vector<uint8_t> per;
    for (size_t d = 0; d < device_events_.size(); ++d) {
      if (device_events_[d] == 0) continue;
      putVar(per, d);
      putVar(per, device_events_[d]);
    }
    tlvBytes(p, 9, {reinterpret_cast<const char*>(per.data()), per.size()});
  }
  if (has_final_state_) tlvVar(p, 10, 1);
  if (has_device_traces_) tlvVar(p, 11, device_traces_);
  s = writeChunk(ChunkType::Trailer, p);
  if (!s.ok()) return s;
  uint8_t end[kEndMarkSize];
  putU64(end, trailer_offset);
  std::memcpy(end + 8, kEndMagic, 8);
  s = sink_.write({end, kEndMarkSize});
  if (!s.ok()) return failed_ = s;
  offset_ += kEndMarkSize;
  stats_.bytes_written = offset_;
  return Status::Ok();
}

}  // namespace memforensics::format::trace
