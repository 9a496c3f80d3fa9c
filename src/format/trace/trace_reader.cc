// trace_reader.cc: see trace_reader.h; the byte layout is in trace_format.h.
#include "format/trace/trace_reader.h"

#include "format/trace/trace_events.h"

#ifndef MEMF_HAVE_ZSTD  // cmake/MemfZstd.cmake sets 0 for capture-only builds without libzstd
#define MEMF_HAVE_ZSTD 1
#endif
#if MEMF_HAVE_ZSTD
#include <zstd.h>
#endif

#include <algorithm>
#include <cstring>

namespace memforensics::format::trace {

namespace {

using detail::bad;
using detail::Cursor;

std::string at(uint64_t offset) {
  return " at byte " + std::to_string(offset);
}

// A chunk header of zeros starts a zero-filled tail (a crash) when the bytes after it are zero:
// at most this many are checked, so that a huge sparse tail is not paged in to prove it.
constexpr uint64_t kZeroTailScanBytes = 16u << 20;

// Reads tag-length-value fields, calling f(tag, value, bytes) for each.
template <typename F>
Status readTlv(std::span<const uint8_t> p, F&& f) {
  Cursor c(p);
  while (!c.done()) {
    uint64_t key = c.var();
    if (!c.ok) return bad("malformed field key");
    uint64_t tag = key >> 1;
    if (key & 1) {
      uint64_t n = c.var();
      std::string_view b = c.bytes(n);
      if (!c.ok) return bad("field " + std::to_string(tag) + " is cut short");
      f(tag, 0, b);
    } else {
      uint64_t v = c.var();
      if (!c.ok) return bad("field " + std::to_string(tag) + " is cut short");
      f(tag, v, std::string_view{});
    }
  }
  return Status::Ok();
}

}  // namespace

#if MEMF_HAVE_ZSTD
struct TraceReader::ZstdContext {
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  ~ZstdContext() { ZSTD_freeDCtx(ctx); }
};
#else
struct TraceReader::ZstdContext {};
#endif

#if MEMF_HAVE_ZSTD
struct ChunkPreparer::Zstd {
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  ~Zstd() { ZSTD_freeDCtx(ctx); }
};
#else
struct ChunkPreparer::Zstd {};
#endif

ChunkPreparer::ChunkPreparer() = default;
ChunkPreparer::~ChunkPreparer() = default;

uint64_t ChunkPreparer::declaredSize(std::span<const uint8_t> stored) {
#if MEMF_HAVE_ZSTD
  unsigned long long raw = ZSTD_getFrameContentSize(stored.data(), stored.size());
  if (raw == ZSTD_CONTENTSIZE_UNKNOWN || raw == ZSTD_CONTENTSIZE_ERROR || raw > kMaxChunkBytes)
    return 0;
  return raw;
#else
  (void)stored;
  return 0;
#endif
}

bool ChunkPreparer::prepare(std::span<const uint8_t> file, const ChunkRef& c, PreparedChunk& p,
                            uint8_t* into) {
  p.offset = c.offset;
  p.verified = false;
  if (c.offset > file.size() || file.size() - c.offset < kChunkHeaderSize ||
      c.stored_size > file.size() - c.offset - kChunkHeaderSize) {
    return false;
  }
  const uint8_t* h = file.data() + c.offset;
  std::span<const uint8_t> stored{h + kChunkHeaderSize, c.stored_size};
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  uint32_t crc = crc32c(0, h, 8);
  crc = crc32c(crc, stored.data(), stored.size());
  if (crc != getU32(h + 8)) return false;
#endif
  if (h[1] == static_cast<uint8_t>(Codec::None)) {
    p.payload = stored;
  } else if (h[1] == static_cast<uint8_t>(Codec::Zstd)) {
#if MEMF_HAVE_ZSTD
    uint64_t raw = declaredSize(stored);
    if (raw == 0 && ZSTD_getFrameContentSize(stored.data(), stored.size()) != 0) return false;
    if (!zstd_) zstd_ = std::make_unique<Zstd>();
    uint8_t* out = into;
    if (out == nullptr) {
      p.raw.resize(raw);
      out = p.raw.data();
    }
    size_t n = ZSTD_decompressDCtx(zstd_->ctx, out, raw, stored.data(), stored.size());
    if (ZSTD_isError(n) || n != raw) return false;
    p.payload = std::span<const uint8_t>(out, raw);
#else
    return false;
#endif
  } else {
    return false;
  }
  p.verified = true;
  return true;
}

TraceReader::TraceReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
TraceReader::~TraceReader() = default;

bool looksLikeTrace(std::span<const uint8_t> bytes) {
  size_t n = std::min<size_t>(bytes.size(), 8);
  return n >= 2 && std::memcmp(bytes.data(), kMagic, n) == 0;
}

Expected<std::unique_ptr<TraceReader>> TraceReader::open(std::span<const uint8_t> bytes) {
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    if (looksLikeTrace(bytes)) {
      return Error{"native trace cut short inside its 32-byte header (" +
                       std::to_string(bytes.size()) + " bytes): nothing was recorded",
                   static_cast<int64_t>(bytes.size())};
    }
    return Error{"not a memforensics native trace (wrong magic)", 0};
  }
  if (bytes.size() < kHeaderSize) {
    return Error{"native trace cut short inside its 32-byte header (" +
                     std::to_string(bytes.size()) + " bytes): nothing was recorded",
                 static_cast<int64_t>(bytes.size())};
  }
  const uint8_t* h = bytes.data();
  uint16_t major = getU16(h + 8), minor = getU16(h + 10);
  // The version is checked before the CRC: a newer writer may lay out the rest differently.
  if (major > kVersionMajor) {
    return Error{"native trace format version " + std::to_string(major) + "." +
                     std::to_string(minor) + " is newer than this memforensics reads (" +
                     std::to_string(kVersionMajor) + "." + std::to_string(kVersionMinor) +
                     " and older); use a newer memforensics",
                 8};
  }
  if (major == 0) return Error{"native trace format version 0 does not exist (damaged header)", 8};
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  if (crc32c(0, h, 28) != getU32(h + 28))
    return Error{"native trace header fails its checksum (damaged file)", 28};
#endif
  uint32_t header_size = getU32(h + 12);
  if (header_size < kHeaderSize || header_size > bytes.size()) {
    return Error{"native trace header size " + std::to_string(header_size) + " is invalid", 12};
  }
  std::unique_ptr<TraceReader> r(new TraceReader(bytes));
  r->major_ = major;
  r->minor_ = minor;
  r->created_ = static_cast<int64_t>(getU64(h + 20));
  r->pos_ = header_size;
  r->end_.good_bytes = header_size;
  return r;
}

bool TraceReader::stop(bool truncated, std::string reason) {
  finished_ = true;
  end_.truncated = truncated;
  end_.damaged = !truncated;
  end_.reason = std::move(reason);
  end_.lost_bytes = bytes_.size() - end_.good_bytes;
  return false;
}

bool TraceReader::next() {
  if (finished_) return false;
  events_.clear();  // events() belongs to the current chunk only
  const uint64_t size = bytes_.size();
  const uint8_t* base = bytes_.data();
  if (trailer_.present) {
    finished_ = true;
    end_.complete = true;
    uint64_t left = size - pos_;
    if (left >= kEndMarkSize && std::memcmp(base + pos_ + 8, kEndMagic, 8) == 0 &&
        getU64(base + pos_) == chunk_.offset) {
      end_.good_bytes = pos_ + kEndMarkSize;
      if (left > kEndMarkSize) {
        end_.notes.push_back(std::to_string(left - kEndMarkSize) +
                             " unexpected bytes after the end mark" + at(pos_ + kEndMarkSize) +
                             " were ignored");
      }
    } else {
      end_.notes.push_back("the end mark after the trailer is missing or damaged" + at(pos_) +
                           " (the content is complete)");
    }
    end_.lost_bytes = size - end_.good_bytes;
    return false;
  }
  if (pos_ == size) {
    return stop(true, "the file ends after " + std::to_string(end_.chunks) +
                          " chunks without a trailer: the writer did not finish (process killed?)");
  }
  if (size - pos_ < kChunkHeaderSize)
    return stop(true, "the file ends inside a chunk header" + at(pos_));
  const uint8_t* h = base + pos_;
  if (std::all_of(h, h + kChunkHeaderSize, [](uint8_t b) { return b == 0; })) {
    // File systems can leave a zero-filled tail after a crash: that is a cut, not damage. The
    // scan is bounded (kZeroTailScanBytes): a 1 GiB sparse tail must not be paged in.
    const uint64_t left = size - pos_;
    const uint64_t scan = std::min<uint64_t>(left, kZeroTailScanBytes);
    if (std::all_of(h, h + scan, [](uint8_t b) { return b == 0; })) {
      if (scan == left)
        return stop(true, "zero bytes" + at(pos_) + " and after, to the end (an unfinished write)");
      return stop(true, "zero bytes" + at(pos_) + " and after (the first " + std::to_string(scan) +
                            " of the " + std::to_string(left) +
                            " bytes left were checked; an unfinished write?)");
    }
  }
  ChunkRef c;
  c.offset = pos_;
  c.type = h[0];
  c.codec = h[1];
  c.stored_size = getU32(h + 4);
  const std::string name = std::string(chunkTypeName(c.type)) + " chunk" + at(pos_);
  if (c.stored_size > kMaxChunkBytes) {
    return stop(false, name + " declares " + std::to_string(c.stored_size) +
                           " bytes, more than the format allows (damaged file)");
  }
  if (c.stored_size > size - pos_ - kChunkHeaderSize) {
    // A complete file (it ends with an end mark) cannot be cut: the size field itself is damaged.
    if (size >= kEndMarkSize && std::memcmp(base + size - 8, kEndMagic, 8) == 0) {
      return stop(false, name + " declares " + std::to_string(c.stored_size) +
                             " bytes, past the end mark of this complete file (damaged file)");
    }
    return stop(true, "the file ends inside the " + name + " (" +
                          std::to_string(size - pos_ - kChunkHeaderSize) + " of " +
                          std::to_string(c.stored_size) + " bytes present)");
  }
  std::span<const uint8_t> stored{h + kChunkHeaderSize, c.stored_size};
  if (headers_only_) {
    chunk_ = c;
    pos_ += kChunkHeaderSize + c.stored_size;
    return true;
  }
  // A chunk prepared ahead (setPrepared) was checked there; the others are checked here.
  while (prepared_next_ < prepared_.size() && prepared_[prepared_next_].offset < pos_)
    ++prepared_next_;
  const PreparedChunk* prep = prepared_next_ < prepared_.size() &&
                                      prepared_[prepared_next_].offset == pos_ &&
                                      prepared_[prepared_next_].verified
                                  ? &prepared_[prepared_next_]
                                  : nullptr;
  events_deferred_ = false;
  if (prep == nullptr) {
    uint32_t crc = crc32c(0, h, 8);
    crc = crc32c(crc, stored.data(), stored.size());
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
    // (Fuzz builds skip this check so that mutated inputs reach the decoders behind it.)
    if (crc != getU32(h + 8)) return stop(false, name + " fails its checksum (damaged file)");
#endif
  }
  std::span<const uint8_t> payload;
  if (c.codec == static_cast<uint8_t>(Codec::None)) {
    payload = stored;
    c.raw_size = c.stored_size;
  } else if (c.codec == static_cast<uint8_t>(Codec::Zstd)) {
#if !MEMF_HAVE_ZSTD
    return stop(
        false,
        name +
            " is zstd-compressed and this build has no zstd (capture-only build without libzstd)");
#else
    unsigned long long raw = ZSTD_getFrameContentSize(stored.data(), stored.size());
    if (raw == ZSTD_CONTENTSIZE_UNKNOWN || raw == ZSTD_CONTENTSIZE_ERROR || raw > kMaxChunkBytes) {
      return stop(false, name + ": zstd frame without a valid decoded size (damaged file)");
    }
    // The budget of decoded bytes for the whole file (trace_format.h), checked before decoding.
    const uint64_t budget = decodedBudget(bytes_.size());
    if (raw > budget - std::min(budget, zstd_decoded_)) {
      return stop(false, name + ": its " + std::to_string(c.stored_size) + " bytes decode to " +
                             std::to_string(raw) + ", past the budget of " +
                             std::to_string(budget) + " decoded bytes for a file of this size (" +
                             std::to_string(zstd_decoded_) +
                             " decoded so far; damaged or hostile file)");
    }
    zstd_decoded_ += raw;
    if (prep != nullptr && prep->payload.size() == raw) {
      payload = prep->payload;
    } else {
      if (!zstd_) zstd_ = std::make_unique<ZstdContext>();
      raw_.resize(raw);
      size_t n =
          ZSTD_decompressDCtx(zstd_->ctx, raw_.data(), raw_.size(), stored.data(), stored.size());
      if (ZSTD_isError(n) || n != raw) {
        return stop(false, name + ": zstd payload does not decompress to its declared " +
                               std::to_string(raw) + " bytes (damaged file)");
      }
      payload = raw_;
    }
    c.raw_size = static_cast<uint32_t>(raw);
#endif
  } else {
    return stop(false, name + " uses unknown compression codec " + std::to_string(c.codec));
  }
  chunk_ = c;
  Status s;
  if (prep != nullptr && prep->events_decoded &&
      c.type == static_cast<uint8_t>(ChunkType::Events) &&
      (skip_tables_ || (prep->ids.strings <= string_views_.size() &&
                        prep->ids.stacks <= stacks_.size() && prep->ids.pools <= pools_.size()))) {
    // Its records were decoded by the caller and refer only to table entries defined so far.
    for (const auto& [d, n] : prep->device_events) device_events_read_[d] += n;
    events_read_ += prep->event_count;
    events_deferred_ = true;
  } else if (prep != nullptr && prep->prechecked && checkpoints_checked_only_ &&
             c.type == static_cast<uint8_t>(ChunkType::Checkpoint) &&
             (skip_tables_ || prep->ids.stacks <= stacks_.size())) {
    // Checked by the caller, its live blocks' stacks all defined so far: as decodeCheckpoint.
    checkpoint_.clear();
    ++checkpoints_read_;
  } else if (prep != nullptr && prep->prechecked && !has_final_state_ &&
             c.type == static_cast<uint8_t>(ChunkType::Segments) &&
             prep->ids.stacks <= stacks_.size() && prep->ids.strings <= string_views_.size()) {
    // Decoded by the caller, its stacks and strings all defined so far: as decodeSegments.
    PreparedChunk& mine = prepared_[prepared_next_];
    segments_ = std::move(mine.segments);
    blocks_ = std::move(mine.blocks);
    has_final_state_ = true;
  } else {
    s = decode(static_cast<ChunkType>(c.type), payload);
  }
  if (!s.ok()) return stop(false, name + ": " + s.error().message + " (damaged file)");
  pos_ += kChunkHeaderSize + c.stored_size;
  end_.good_bytes = pos_;
  ++end_.chunks;
  return true;
}

Status TraceReader::decode(ChunkType type, std::span<const uint8_t> p) {
  // Table decoders validate everything before appending, so a failed chunk leaves no trace.
  switch (type) {
    case ChunkType::Meta:
      return decodeMeta(p);
    case ChunkType::Strings:
      return decodeStrings(p);
    case ChunkType::Frames:
      return decodeFrames(p);
    case ChunkType::Stacks:
      return decodeStacks(p);
    case ChunkType::Pools:
      return decodePools(p);
    case ChunkType::Events:
      return decodeEvents(p);
    case ChunkType::Checkpoint:
      return decodeCheckpoint(p);
    case ChunkType::Segments:
      return decodeSegments(p);
    case ChunkType::Settings:
      return decodeSettings(p);
    case ChunkType::Annotations:
      return decodeAnnotations(p);
    case ChunkType::Trailer:
      return decodeTrailer(p);
  }
  end_.notes.push_back("skipped a chunk of unknown type " + std::to_string(static_cast<int>(type)) +
                       at(pos_) + " (written by a newer minor version)");
  return Status::Ok();
}

Status TraceReader::decodeEvents(std::span<const uint8_t> payload) {
  struct Into {
    std::vector<TraceEvent>& out;
    void begin(uint64_t count) { out.resize(count); }
    void event(uint64_t i, const TraceEvent& e) { out[i] = e; }
  } into{events_};
  const uint64_t nstrings = skip_tables_ ? ~uint64_t{0} : string_views_.size();
  const uint64_t nstacks = skip_tables_ ? ~uint64_t{0} : stacks_.size();
  const uint64_t npools = skip_tables_ ? ~uint64_t{0} : pools_.size();
  Status s = detail::decodeEventRecords(payload, nstrings, nstacks, npools, into);
  if (!s.ok()) return s;
  for (const auto& e : events_) ++device_events_read_[e.device];
  events_read_ += events_.size();
  return Status::Ok();
}

Status TraceReader::decodeStrings(std::span<const uint8_t> p) {
  Cursor c(p);
  uint64_t first = c.var(), count = c.var();
  if (!c.ok) return bad("malformed header: " + c.failure());
  if (first != string_views_.size()) {
    return bad("strings start at id " + std::to_string(first) + ", expected " +
               std::to_string(string_views_.size()));
  }
  if (count > c.left())
    return bad("string count " + std::to_string(count) + " does not fit the chunk");
  std::vector<std::pair<size_t, size_t>> spans;  // offset into the block, length
  spans.reserve(count);
  auto block = std::make_unique<char[]>(c.left() + 1);
  size_t used = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t n = c.var();
    std::string_view s = c.bytes(n);
    if (!c.ok) return bad("string " + std::to_string(first + i) + ": " + c.failure());
    std::memcpy(block.get() + used, s.data(), s.size());
    spans.emplace_back(used, s.size());
    used += s.size();
  }
  if (!c.done()) return bad(std::to_string(c.left()) + " bytes after the last string");
  for (auto [off, n] : spans) string_views_.emplace_back(block.get() + off, n);
  string_blocks_.push_back(std::move(block));
  return Status::Ok();
}

Status TraceReader::decodeFrames(std::span<const uint8_t> p) {
  Cursor c(p);
  uint64_t first = c.var(), count = c.var();
  if (!c.ok) return bad("malformed header: " + c.failure());
  if (first != frames_.size()) {
    return bad("frames start at id " + std::to_string(first) + ", expected " +
               std::to_string(frames_.size()));
  }
  if (count > c.left() / 3)
    return bad("frame count " + std::to_string(count) + " does not fit the chunk");
  size_t old = frames_.size();
  int64_t file = 0, name = 0;
  for (uint64_t i = 0; i < count; ++i) {
    file += c.svar();
    name += c.svar();
    uint64_t line = c.var();
    if (!c.ok || file < 0 || name < 0 || static_cast<uint64_t>(file) >= string_views_.size() ||
        static_cast<uint64_t>(name) >= string_views_.size()) {
      frames_.resize(old);
      return bad("frame " + std::to_string(first + i) +
                 " is cut short or refers to an undefined string");
    }
    frames_.push_back(FrameRec{static_cast<uint32_t>(file), static_cast<uint32_t>(name), line - 1});
  }
  if (!c.done()) {
    frames_.resize(old);
    return bad(std::to_string(c.left()) + " bytes after the last frame");
  }
  return Status::Ok();
}

Status TraceReader::decodeStacks(std::span<const uint8_t> p) {
  Cursor c(p);
  uint64_t first = c.var(), count = c.var();
  if (!c.ok) return bad("malformed header: " + c.failure());
  if (first != stacks_.size()) {
    return bad("stacks start at id " + std::to_string(first) + ", expected " +
               std::to_string(stacks_.size()));
  }
  if (count > c.left() / 2)
    return bad("stack count " + std::to_string(count) + " does not fit the chunk");
  size_t old = stacks_.size();
  int64_t frame = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t back = c.var();
    frame += c.svar();
    uint64_t id = stacks_.size();
    // A parent is defined before its child (back >= 1), which also rules out cycles; id 0 means
    // "no stack" and cannot be a parent.
    uint64_t parent = back >= 1 && back < id ? id - back : 0;
    if (!c.ok || parent == kTraceNoStack || frame < 0 ||
        static_cast<uint64_t>(frame) >= frames_.size()) {
      stacks_.resize(old);
      return bad("stack " + std::to_string(first + i) +
                 " is cut short or refers to an undefined parent or frame");
    }
    stacks_.push_back(StackNode{static_cast<uint32_t>(parent), static_cast<uint32_t>(frame)});
  }
  if (!c.done()) {
    stacks_.resize(old);
    return bad(std::to_string(c.left()) + " bytes after the last stack");
  }
  return Status::Ok();
}

Status TraceReader::decodePools(std::span<const uint8_t> p) {
  Cursor c(p);
  uint64_t first = c.var(), count = c.var();
  if (!c.ok) return bad("malformed header: " + c.failure());
  if (first != pools_.size())
    return bad("pools start at id " + std::to_string(first) + ", expected " +
               std::to_string(pools_.size()));
  if (count > c.left() / 2) return bad("pool count does not fit the chunk");
  std::vector<std::pair<uint64_t, uint64_t>> add;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t a = c.var(), b = c.var();
    if (!c.ok) return bad("pool " + std::to_string(first + i) + ": " + c.failure());
    add.emplace_back(a, b);
  }
  if (!c.done()) return bad("bytes after the last pool");
  pools_.insert(pools_.end(), add.begin(), add.end());
  return Status::Ok();
}

Status TraceReader::decodeMeta(std::span<const uint8_t> p) {
  TraceMeta m;
  std::string storage[4];
  Status s = readTlv(p, [&](uint64_t tag, uint64_t v, std::string_view b) {
    switch (tag) {
      case 1:
        storage[0] = b;
        break;
      case 2:
        storage[1] = b;
        break;
      case 3:
        m.source_bytes = v;
        break;
      case 4:
        m.pickle_protocol = static_cast<uint32_t>(std::min<uint64_t>(v, 255));
        break;
      case 5:
        m.traits = v;
        break;
      case 6:
        m.host_trace_events = v;
        break;
      case 7:
        storage[2] = b;
        break;
      case 8:
        storage[3] = b;
        break;
      default:
        break;  // fields of newer minor versions
    }
  });
  if (!s.ok()) return s;
  for (int i = 0; i < 4; ++i) meta_storage_[i] = std::move(storage[i]);
  m.producer = meta_storage_[0];
  m.source_format = meta_storage_[1];
  m.ignored_keys = meta_storage_[2];
  m.source_warnings = meta_storage_[3];
  meta_ = m;
  return Status::Ok();
}

Status TraceReader::decodeSettings(std::span<const uint8_t> p) {
  TraceSettings st;
  std::string conf;
  bool ok = true;
  Status s = readTlv(p, [&](uint64_t tag, uint64_t v, std::string_view b) {
    switch (tag) {
      case 1:
        conf = b;
        break;
      case 2:
        st.max_split_size = unzigzag(v);
        break;
      case 3:
        std::memcpy(&st.garbage_collection_threshold, &v, 8);
        break;
      case 4:
        st.expandable_segments = v != 0;
        break;
      case 5: {  // (index, divisions) pairs
        Cursor c({reinterpret_cast<const uint8_t*>(b.data()), b.size()});
        while (c.ok && !c.done()) {
          uint64_t k = c.var(), x = c.var();
          if (k >= 16 || x >= (1u << 20))
            ok = false;
          else
            st.roundup_power2_divisions[k] = static_cast<uint32_t>(x);
        }
        ok = ok && c.ok;
        st.has_roundup = true;
        break;
      }
      case 6:
        st.has_graph_capture_key = v != 0;
        break;
      case 7: {  // a key the model does not read, with its value
        Cursor c({reinterpret_cast<const uint8_t*>(b.data()), b.size()});
        TraceOtherSetting o;
        o.key = std::string(c.bytes(c.var()));
        o.kind = c.byte();
        if (o.kind == TraceOtherSetting::kInt) {
          o.bits = static_cast<uint64_t>(c.svar());
        } else if (o.kind == TraceOtherSetting::kStr) {
          o.text = std::string(c.bytes(c.var()));
        } else if (o.kind != TraceOtherSetting::kNone) {
          o.bits = c.var();
        }
        // A kind of a newer minor version is skipped; past the model's bounds, entries are
        // skipped (as the pickle reader drops them).
        if (!c.ok)
          ok = false;
        else if (o.kind <= TraceOtherSetting::kStr && st.other.size() < kMaxTraceOtherSettings &&
                 o.key.size() + o.text.size() <= kMaxTraceOtherSettingBytes)
          st.other.push_back(std::move(o));
        break;
      }
      default:
        break;
    }
  });
  if (!s.ok()) return s;
  if (!ok) return bad("malformed roundup_power2_divisions or other setting");
  has_settings_ = true;
  settings_conf_ = std::move(conf);
  settings_ = std::move(st);
  settings_.conf = settings_conf_;
  return Status::Ok();
}

Status TraceReader::decodeAnnotations(std::span<const uint8_t> p) {
  Cursor c(p);
  uint64_t count = c.var();
  if (!c.ok || count > c.left() / 4) return bad("annotation count does not fit the chunk");
  std::vector<TraceAnnotation> add;
  for (uint64_t i = 0; i < count; ++i) {
    TraceAnnotation a;
    a.device = c.svar();
    a.time_us = c.svar();
    uint64_t name = c.var(), stage = c.var();
    if (!c.ok || name >= string_views_.size() || stage >= string_views_.size()) {
      return bad("annotation " + std::to_string(i) +
                 " is cut short or refers to an undefined string");
    }
    a.name = static_cast<uint32_t>(name);
    a.stage = static_cast<uint32_t>(stage);
    add.push_back(a);
  }
  if (!c.done()) return bad("bytes after the last annotation");
  annotations_.insert(annotations_.end(), add.begin(), add.end());
  return Status::Ok();
}

namespace {

// decodeSegments' checks with tables of `nstacks` stacks and `nstrings` strings, into segs and
// blocks; `ids` gets 1 + the largest stack and string id referred to.
Status parseSegments(std::span<const uint8_t> p, uint64_t nstacks, uint64_t nstrings,
                     std::vector<TraceSegment>& segs, std::vector<TraceBlock>& blocks,
                     IdExtent& ids) {
  Cursor c(p);
  uint64_t nseg = c.var(), nblk = c.var();
  if (!c.ok || nseg > c.left() / 12 || nblk > c.left() / 4)
    return bad("segment or block count does not fit the chunk");
  segs.clear();
  blocks.clear();
  ids = IdExtent{};
  segs.reserve(nseg);
  blocks.reserve(nblk);
  for (uint64_t i = 0; i < nseg; ++i) {
    const std::string which = "segment " + std::to_string(i);
    TraceSegment g;
    g.device = static_cast<int64_t>(c.var());  // any int64, as in the model
    g.address = c.var();
    g.total_size = c.var();
    g.allocated_size = c.var();
    g.active_size = c.var();
    g.requested_size = c.var();
    g.stream = c.svar();
    g.pool_a = c.var();
    g.pool_b = c.var();
    uint64_t stack = c.var();
    uint8_t flags = c.byte();
    uint64_t type = (flags & 4) ? 0 : c.var();
    uint64_t count = c.var();
    if (!c.ok) return bad(which + ": " + c.failure());
    if (stack >= nstacks || type >= nstrings)
      return bad(which + " refers to an undefined stack or string");
    ids.stacks = std::max(ids.stacks, stack + 1);
    ids.strings = std::max(ids.strings, type + 1);
    if (count > nblk - blocks.size())
      return bad(which + " has more blocks than the chunk declares");
    g.stack = static_cast<uint32_t>(stack);
    g.segment_type = static_cast<uint32_t>(type);
    if (flags & ~7) return bad(which + " has unknown flags");
    g.is_large = flags & 1;
    g.is_expandable = flags & 2;
    g.usual_type = flags & 4;
    g.first_block = static_cast<uint32_t>(blocks.size());
    g.block_count = static_cast<uint32_t>(count);
    uint64_t cursor = g.address;
    for (uint64_t k = 0; k < count; ++k) {
      TraceBlock b;
      b.address = cursor + static_cast<uint64_t>(c.svar());
      uint8_t f = c.byte();
      if (f & ~0x1f) return bad(which + " block " + std::to_string(k) + " has unknown flags");
      b.state = f & 3;
      b.has_requested_size = f & 4;
      uint64_t size = c.var();
      if ((f & 8) && size > (~uint64_t{0}) / 512)
        return bad(which + " block " + std::to_string(k) + " size overflows");
      b.size = (f & 8) ? size * 512 : size;
      if (b.has_requested_size) {
        uint64_t r = c.var();
        if ((f & 16) && r > b.size)
          return bad(which + " block " + std::to_string(k) + " has a negative request");
        b.requested_size = (f & 16) ? b.size - r : r;
      }
      uint64_t bstack = c.var();
      if (!c.ok) return bad(which + " block " + std::to_string(k) + ": " + c.failure());
      if (bstack >= nstacks)
        return bad(which + " block " + std::to_string(k) + " refers to an undefined stack");
      ids.stacks = std::max(ids.stacks, bstack + 1);
      b.stack = static_cast<uint32_t>(bstack);
      cursor = b.address + b.size;
      blocks.push_back(b);
    }
    segs.push_back(g);
  }
  if (blocks.size() != nblk)
    return bad("segments hold " + std::to_string(blocks.size()) + " blocks, the chunk declares " +
               std::to_string(nblk));
  if (!c.done()) return bad("bytes after the last segment");
  return Status::Ok();
}

// decodeCheckpoint's checks with a table of `nstacks` stacks; the devices' states go into `out`
// when given. `stacks` gets 1 + the largest stack id of a live block.
Status parseCheckpoint(std::span<const uint8_t> p, uint64_t nstacks,
                       std::vector<std::pair<uint32_t, DeviceTraceState>>* out, uint64_t& stacks) {
  Cursor c(p);
  stacks = 0;
  uint64_t ndev = c.var();
  if (!c.ok || ndev > c.left() / 3 + 1) return bad("device count does not fit the chunk");
  for (uint64_t i = 0; i < ndev; ++i) {
    uint64_t dev = c.var(), events = c.var(), nlive = c.var();
    if (!c.ok || dev >= kMaxDevice || nlive > c.left() / 5)
      return bad("device entry " + std::to_string(i) + " is malformed");
    U64Map<LiveAlloc> live;
    uint64_t addr = 0;
    int64_t stack = 0;
    uint64_t stream = 0;
    for (uint64_t k = 0; k < nlive; ++k) {
      addr += c.var();
      LiveAlloc l;
      l.requested = c.var();
      stack += c.svar();
      stream += static_cast<uint64_t>(c.svar());
      uint8_t pending = c.byte();
      if (!c.ok || stack < 0 || static_cast<uint64_t>(stack) >= nstacks || stack > 0xffffffffll ||
          pending > 1) {
        return bad("live block " + std::to_string(k) + " of device " + std::to_string(dev) +
                   " is malformed");
      }
      l.stack = static_cast<uint32_t>(stack);
      stacks = std::max(stacks, static_cast<uint64_t>(stack) + 1);
      l.stream = static_cast<int64_t>(stream);
      l.pending = pending != 0;
      if (out != nullptr) live.insert(addr, l);
    }
    uint64_t nseg = c.var();
    if (!c.ok || nseg > c.left() / 2)
      return bad("segment count of device " + std::to_string(dev) + " does not fit");
    std::map<uint64_t, uint64_t> segs;
    addr = 0;
    for (uint64_t k = 0; k < nseg; ++k) {
      addr += c.var();
      uint64_t size = c.var();
      if (!c.ok)
        return bad("segment " + std::to_string(k) + " of device " + std::to_string(dev) +
                   " is cut short");
      if (out != nullptr) segs[addr] = size;
    }
    if (out == nullptr) continue;
    DeviceTraceState st;
    st.restore(events, std::move(live), std::move(segs));
    out->emplace_back(static_cast<uint32_t>(dev), std::move(st));
  }
  if (!c.done()) return bad("bytes after the last device entry");
  return Status::Ok();
}

}  // namespace

Status TraceReader::decodeSegments(std::span<const uint8_t> p) {
  if (has_final_state_) return bad("a second segments chunk");
  std::vector<TraceSegment> segs;
  std::vector<TraceBlock> blocks;
  IdExtent ids;
  Status s = parseSegments(p, stacks_.size(), string_views_.size(), segs, blocks, ids);
  if (!s.ok()) return s;
  segments_ = std::move(segs);
  blocks_ = std::move(blocks);
  has_final_state_ = true;
  return Status::Ok();
}

Status TraceReader::decodeCheckpoint(std::span<const uint8_t> p) {
  std::vector<std::pair<uint32_t, DeviceTraceState>> out;
  uint64_t stacks = 0;
  Status s = parseCheckpoint(p, skip_tables_ ? ~uint64_t{0} : stacks_.size(),
                             checkpoints_checked_only_ ? nullptr : &out, stacks);
  if (!s.ok()) return s;
  checkpoint_ = std::move(out);
  ++checkpoints_read_;
  return Status::Ok();
}

void precheckChunk(uint8_t type, PreparedChunk& p) {
  p.prechecked = false;
  if (!p.verified) return;
  constexpr uint64_t kAny = ~uint64_t{0};
  if (type == static_cast<uint8_t>(ChunkType::Checkpoint)) {
    uint64_t stacks = 0;
    p.prechecked = parseCheckpoint(p.payload, kAny, nullptr, stacks).ok();
    p.ids = IdExtent{};
    p.ids.stacks = stacks;
  } else if (type == static_cast<uint8_t>(ChunkType::Segments)) {
    p.prechecked = parseSegments(p.payload, kAny, kAny, p.segments, p.blocks, p.ids).ok();
    if (!p.prechecked) {
      std::vector<TraceSegment>().swap(p.segments);
      std::vector<TraceBlock>().swap(p.blocks);
    }
  }
}

Status TraceReader::decodeTrailer(std::span<const uint8_t> p) {
  TrailerInfo t;
  t.present = true;
  bool per_ok = true;
  Status s = readTlv(p, [&](uint64_t tag, uint64_t v, std::string_view b) {
    switch (tag) {
      case 1:
        t.events = v;
        break;
      case 2:
        t.chunks = v;
        break;
      case 3:
        t.strings = v;
        break;
      case 4:
        t.frames = v;
        break;
      case 5:
        t.stacks = v;
        break;
      case 6:
        t.pools = v;
        break;
      case 7:
        t.dropped = v;
        break;
      case 8:
        t.checkpoints = v;
        break;
      case 9: {
        Cursor c({reinterpret_cast<const uint8_t*>(b.data()), b.size()});
        while (c.ok && !c.done()) {
          uint64_t d = c.var(), n = c.var();
          if (d >= kMaxDevice)
            per_ok = false;
          else
            t.device_events[static_cast<uint32_t>(d)] = n;
        }
        per_ok = per_ok && c.ok;
        break;
      }
      case 10:
        t.has_final_state = v != 0;
        break;
      case 11:
        t.has_device_traces = true;
        t.device_traces = v;
        break;
      default:
        break;
    }
  });
  if (!s.ok()) return s;
  if (!per_ok) return bad("malformed per-device event counts");
  if (t.has_device_traces) {
    if (t.device_traces > kMaxDevice) {
      return bad("the trailer counts " + std::to_string(t.device_traces) +
                 " device traces, more than the " + std::to_string(kMaxDevice) +
                 " the format allows");
    }
    if (!device_events_read_.empty() && device_events_read_.rbegin()->first >= t.device_traces) {
      return bad("the trailer counts " + std::to_string(t.device_traces) +
                 " device traces, but events name device " +
                 std::to_string(device_events_read_.rbegin()->first));
    }
  }
  // The trailer restates what was written: any difference means chunks went missing or changed.
  if (t.events != events_read_) {
    return bad("the trailer counts " + std::to_string(t.events) + " events, the file holds " +
               std::to_string(events_read_));
  }
  if (t.chunks != end_.chunks) {
    return bad("the trailer counts " + std::to_string(t.chunks) +
               " chunks before it, the file holds " + std::to_string(end_.chunks));
  }
  if (t.device_events != device_events_read_)
    return bad("the trailer's per-device event counts differ from the file's");
  if (t.has_final_state != has_final_state_)
    return bad("the trailer and the file disagree on the final state");
  trailer_ = std::move(t);
  return Status::Ok();
}

std::optional<TrailerInfo> peekTrailer(std::span<const uint8_t> bytes) {
  const size_t n = bytes.size();
  if (n < kHeaderSize + kChunkHeaderSize + kEndMarkSize) return std::nullopt;
  const uint8_t* end = bytes.data() + n - kEndMarkSize;
  if (std::memcmp(end + 8, kEndMagic, 8) != 0) return std::nullopt;
  uint64_t off = getU64(end);
  if (off < kHeaderSize || off > n - kEndMarkSize - kChunkHeaderSize) return std::nullopt;
  const uint8_t* h = bytes.data() + off;
  uint32_t stored = getU32(h + 4);
  if (h[0] != static_cast<uint8_t>(ChunkType::Trailer) || h[1] != 0 ||
      stored != n - kEndMarkSize - kChunkHeaderSize - off) {
    return std::nullopt;
  }
  uint32_t crc = crc32c(0, h, 8);
  if (crc32c(crc, h + kChunkHeaderSize, stored) != getU32(h + 8)) return std::nullopt;
  TrailerInfo t;
  bool ok = true;
  Status s =
      readTlv({h + kChunkHeaderSize, stored}, [&](uint64_t tag, uint64_t v, std::string_view b) {
        if (tag == 1) t.events = v;
        if (tag == 9) {
          Cursor c({reinterpret_cast<const uint8_t*>(b.data()), b.size()});
          while (c.ok && !c.done()) {
            uint64_t d = c.var(), k = c.var();
            if (d >= kMaxDevice)
              ok = false;
            else
              t.device_events[static_cast<uint32_t>(d)] = k;
          }
          ok = ok && c.ok;
        }
      });
  if (!s.ok() || !ok) return std::nullopt;
  t.present = true;
  return t;
}

Expected<DeviceTraceState> traceStateAt(std::span<const uint8_t> bytes, uint32_t device,
                                        uint64_t events) {
  auto opened = TraceReader::open(bytes);
  if (!opened) return opened.error();
  TraceReader& r = **opened;
  // Pass 1: chunk headers only (one page touched per chunk).
  std::vector<ChunkRef> chunks;
  r.setHeadersOnly(true);
  while (r.next()) chunks.push_back(r.chunk());
  r.setHeadersOnly(false);
  r.setSkipTables(true);
  // Pass 2: the last checkpoint at or before the wanted event, then the events after it.
  DeviceTraceState state;
  size_t from = 0;
  for (size_t i = chunks.size(); i-- > 0;) {
    if (chunks[i].type != static_cast<uint8_t>(ChunkType::Checkpoint)) continue;
    r.seek(chunks[i].offset);
    if (!r.next()) return Error{"checkpoint" + at(chunks[i].offset) + ": " + r.end().reason, -1};
    const DeviceTraceState* mine = nullptr;
    for (const auto& [d, st] : r.checkpoint()) {
      if (d == device) mine = &st;
    }
    if (mine != nullptr && mine->events() > events) continue;  // too late: try an earlier one
    // A device absent from a checkpoint had no events yet: its empty state is exact.
    state = mine != nullptr ? *mine : DeviceTraceState{};
    from = i + 1;
    break;
  }
  for (size_t i = from; i < chunks.size() && state.events() < events; ++i) {
    if (chunks[i].type != static_cast<uint8_t>(ChunkType::Events)) continue;
    r.seek(chunks[i].offset);
    if (!r.next()) return Error{"events" + at(chunks[i].offset) + ": " + r.end().reason, -1};
    for (const TraceEvent& e : r.events()) {
      if (e.device != device) continue;
      state.apply(e);
      if (state.events() == events) break;
    }
  }
  if (state.events() < events) {
    return Error{"device " + std::to_string(device) + " has only " +
                     std::to_string(state.events()) + " events in this file, not " +
                     std::to_string(events),
                 -1};
  }
  return state;
}

}  // namespace memforensics::format::trace
