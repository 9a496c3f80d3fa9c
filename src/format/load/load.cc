// load.cc: content sniffing, file mapping with page release behind the reader, HTML and JSON forms.
#include "format/load/load.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/memory.h"
#include "format/load/snapshot_trace.h"
#include "format/pickle/pickle_writer.h"
#include "format/profiler/profiler_reader.h"
#include "format/trace/trace_reader.h"

namespace memforensics::format {

namespace {

enum class Kind { Pickle, Html, Json, Trace, Gzip, Unknown };

Kind sniff(std::span<const uint8_t> b) {
  if (!b.empty() && b[0] == 0x80) return Kind::Pickle;
  if (trace::looksLikeTrace(b)) return Kind::Trace;
  if (looksLikeGzip(b)) return Kind::Gzip;  // torch.profiler's .json.gz outputs
  size_t i = 0;
  if (b.size() >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF) i = 3;  // UTF-8 BOM
  while (i < b.size() && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t')) ++i;
  if (i < b.size() && b[i] == '<') return Kind::Html;
  if (i < b.size() && (b[i] == '{' || b[i] == '[')) return Kind::Json;
  return Kind::Unknown;
}

int b64value(uint8_t c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;
  if (c == '/' || c == '_') return 63;
  return -1;
}

// JSON -> pickle opcodes, so the JSON form shares every check and budget of the pickle path.
// Streamed from the parser's events (no JSON document in memory: a 40 MB input took 1.5 GB as a
// nlohmann::json tree); keys stay in file order. Nesting deeper than a snapshot ever is stops the
// parse at once.
constexpr int kMaxJsonDepth = 256;
class JsonToPickle {
 public:
  explicit JsonToPickle(PickleWriter& w) : w_(w) {}
  bool null() { return scalar() && (w_.none(), true); }
  bool boolean(bool b) { return scalar() && (w_.boolean(b), true); }
  bool number_integer(int64_t v) { return scalar() && (w_.integer(v), true); }
  bool number_unsigned(uint64_t v) { return scalar() && (w_.uinteger(v), true); }
  bool number_float(double v, const std::string&) { return scalar() && (w_.floating(v), true); }
  bool string(std::string& v) { return scalar() && (w_.str(v), true); }
  bool binary(nlohmann::json::binary_t&) { return scalar() && (w_.none(), true); }
  bool start_object(std::size_t) { return open() && (w_.beginDict(), true); }
  bool key(std::string& k) { return (w_.str(k), true); }
  bool end_object() { return close() && (w_.endDict(), true); }
  bool start_array(std::size_t) { return open() && (w_.beginList(), true); }
  bool end_array() { return close() && (w_.endList(), true); }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) {
    error_ = std::string("invalid JSON: ") + ex.what();
    // a syntax error has its byte; out_of_range (a number beyond a double, 1e400) has none
    const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&ex);
    error_offset_ = pe ? static_cast<int64_t>(pe->byte) : -1;
    (void)position;
    return false;
  }
  bool tooDeep() const { return too_deep_; }
  const std::string& error() const { return error_; }
  int64_t errorOffset() const { return error_offset_; }

 private:
  // A value at depth d has d containers around it; deeper than kMaxJsonDepth is refused.
  bool scalar() {
    if (depth_ > kMaxJsonDepth) too_deep_ = true;
    return !too_deep_;
  }
  bool open() {
    if (!scalar()) return false;
    ++depth_;
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }
  PickleWriter& w_;
  int depth_ = 0;
  bool too_deep_ = false;
  std::string error_;
  int64_t error_offset_ = -1;
};

// Walks pickle opcodes without building anything, to know where a pickle read from a stream ends
// (a pickle followed by zeros forever, `cat snap.pickle /dev/zero`, stops at its STOP). Only the
// opcodes the reader accepts are walked; any other byte ends the walk, and the reader then reports
// it with its offset. Incremental: feed() continues from where the last call stopped.
class PickleExtent {
 public:
  enum class State { NeedMore, Stop, Invalid };
  State feed(std::span<const uint8_t> b) {
    while (pos_ < b.size()) {
      uint8_t op = b[pos_];
      uint64_t fixed = 0;  // operand bytes after the opcode
      int len_bytes = 0;   // or: a little-endian length of this many bytes, then that many bytes
      switch (op) {
        case '.':
          pos_ += 1;
          return State::Stop;
        case '(':
        case '0':
        case '1':
        case '2':
        case 'N':
        case 'a':
        case 'd':
        case '}':
        case 'e':
        case 'l':
        case ']':
        case 's':
        case 't':
        case ')':
        case 'u':
        case 0x85:
        case 0x86:
        case 0x87:
        case 0x88:
        case 0x89:
        case 0x94:
          fixed = 0;
          break;
        case 'K':
        case 'h':
        case 'q':
        case 0x80:
          fixed = 1;
          break;
        case 'M':
          fixed = 2;
          break;
        case 'J':
        case 'j':
        case 'r':
          fixed = 4;
          break;
        case 'G':
        case 0x95:
          fixed = 8;
          break;  // BINFLOAT; FRAME's length (its content is opcodes)
        case 0x8c:
        case 0x8a:
          len_bytes = 1;
          break;  // SHORT_BINUNICODE, LONG1
        case 'X':
        case 0x8b:
          len_bytes = 4;
          break;  // BINUNICODE, LONG4
        case 0x8d:
          len_bytes = 8;
          break;  // BINUNICODE8
        default:
          return State::Invalid;
      }
      uint64_t need = 1 + fixed;
      if (len_bytes > 0) {
        if (b.size() - pos_ < 1 + static_cast<uint64_t>(len_bytes)) return State::NeedMore;
        uint64_t n = 0;
        std::memcpy(&n, b.data() + pos_ + 1, static_cast<size_t>(len_bytes));  // little-endian host
        if (op == 0x8b && (n >> 31) != 0) return State::Invalid;               // negative LONG4
        if (n > kMaxStreamInputBytes) return State::Invalid;  // the reader reports the truncation
        need = 1 + static_cast<uint64_t>(len_bytes) + n;
      }
      if (b.size() - pos_ < need) return State::NeedMore;
      pos_ += need;
    }
    return State::NeedMore;
  }

 private:
  uint64_t pos_ = 0;
};

constexpr long kPipefsMagic = 0x50495045;  // statfs f_type of anonymous pipes ("PIPE")

// Reads a pipe, FIFO or character device into memory, bounded: sniffed first, at most
// kMaxStreamInputBytes, a pickle only up to its STOP, and a named FIFO or terminal that has nothing
// to read within options.stream_wait_ms is an error rather than a wait forever.
Expected<std::vector<uint8_t>> readStream(int fd, const struct stat& st, const std::string& path,
                                          const LoadOptions& options) {
  struct statfs fs {};
  bool anonymous_pipe =
      S_ISFIFO(st.st_mode) && ::fstatfs(fd, &fs) == 0 && fs.f_type == kPipefsMagic;
  bool may_never_write = (S_ISFIFO(st.st_mode) && !anonymous_pipe) || ::isatty(fd) == 1;
  if (may_never_write) {
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, options.stream_wait_ms);
    if (r == 0) {
      return Error{"nothing to read from '" + path + "' within " +
                       std::to_string(options.stream_wait_ms / 1000.0).substr(0, 4) +
                       " s (a FIFO with no writer, or a terminal?)",
                   -1};
    }
  }
  // Blocking reads from here on: data is there, or a writer is (a pipe's writer may be slow).
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  std::vector<uint8_t> buf;
  bool sniffed = false;
  Kind kind = Kind::Unknown;
  PickleExtent extent;
  for (;;) {
    if (buf.size() >= kMaxStreamInputBytes) {
      return Error{"'" + path + "' is a stream (not a regular file) longer than " +
                       std::to_string(kMaxStreamInputBytes >> 30) +
                       " GiB, the most read into memory; save it to a file and open that",
                   -1};
    }
    size_t want =
        std::min<uint64_t>(sniffed ? std::max<size_t>(buf.size(), 1 << 20) : kStreamSniffBytes,
                           kMaxStreamInputBytes - buf.size());
    size_t old = buf.size();
    buf.resize(old + want);
    ssize_t n = ::read(fd, buf.data() + old, want);
    if (n < 0 && errno == EINTR) {
      buf.resize(old);
      continue;
    }
    if (n < 0) {
      int e = errno;
      return Error{"cannot read '" + path + "': " + std::strerror(e), static_cast<int64_t>(old)};
    }
    buf.resize(old + static_cast<size_t>(n));
    bool eof = n == 0;
    if (!sniffed && (buf.size() >= kStreamSniffBytes || eof)) {
      sniffed = true;
      if (buf.empty()) break;
      kind = sniff(buf);
      if (kind == Kind::Unknown) {
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%02x", buf[0]);
        return Error{"'" + path + "' is not a snapshot: unrecognized content (first byte " + hex +
                         ") in a stream that is not a regular file; stopped reading after " +
                         std::to_string(buf.size()) + " bytes",
                     0};
      }
      if ((kind == Kind::Json || kind == Kind::Html) &&
          std::memchr(buf.data(), 0, buf.size()) != nullptr) {
        return Error{"'" + path + "' is not a snapshot: it starts like " +
                         std::string(kind == Kind::Json ? "JSON" : "HTML") +
                         " but has binary (NUL) bytes in its first " + std::to_string(buf.size()) +
                         " bytes; stopped reading",
                     0};
      }
    }
    if (sniffed && kind == Kind::Pickle && !buf.empty()) {
      auto state = extent.feed(buf);
      if (state != PickleExtent::State::NeedMore) break;  // STOP, or a byte the reader will report
    }
    if (eof) break;
  }
  buf.shrink_to_fit();
  return buf;
}

}  // namespace

Expected<std::vector<uint8_t>> extractHtmlPickle(std::span<const uint8_t> b) {
  std::string_view text(reinterpret_cast<const char*>(b.data()), b.size());
  size_t key = text.find("\"base64\"");
  if (key == std::string_view::npos) {
    return Error{
        "HTML file without an embedded snapshot (no \"base64\" field; only pages written "
        "by torch.cuda._memory_viz are supported)",
        -1};
  }
  size_t q = text.find('"', key + 8);
  size_t colon = text.find(':', key + 8);
  if (q == std::string_view::npos || colon == std::string_view::npos || colon > q) {
    return Error{"HTML file: malformed \"base64\" field", static_cast<int64_t>(key)};
  }
  std::vector<uint8_t> out;
  // Grows with what is decoded: the string may end long before the file does (a page padded
  // with 1 GB of zeros reserved 750 MB here).
  uint32_t acc = 0;
  int bits = 0;
  size_t i = q + 1;
  for (; i < text.size() && text[i] != '"'; ++i) {
    uint8_t c = static_cast<uint8_t>(text[i]);
    if (c == '=') continue;
    if (c == '\\') {  // JSON escapes inside the string: "\/" keeps the slash, "\n" is layout
      if (i + 1 < text.size() && text[i + 1] != '/') ++i;
      continue;
    }
    int v = b64value(c);
    if (v < 0) {
      if (c == ' ' || c == '\n' || c == '\r') continue;
      return Error{"HTML file: invalid base64 character in the embedded snapshot",
                   static_cast<int64_t>(i)};
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  if (i >= text.size()) {
    return Error{"HTML file: the embedded base64 snapshot is not terminated (file truncated?)",
                 static_cast<int64_t>(q)};
  }
  return out;
}

Expected<Snapshot> readSnapshotJson(std::span<const uint8_t> bytes, const LoadOptions& options) {
  PickleWriter w(4);
  JsonToPickle sax(w);
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(bytes.begin(), bytes.end(), &sax);
  } catch (const nlohmann::json::exception& e) {
    return Error{std::string("invalid JSON: ") + e.what(), -1};
  }
  if (sax.tooDeep()) {
    return Error{"JSON nested more than " + std::to_string(kMaxJsonDepth) +
                     " levels deep: not a memory snapshot",
                 -1};
  }
  if (!parsed) {
    return Error{sax.error().empty() ? std::string("invalid JSON") : sax.error(),
                 sax.errorOffset()};
  }
  std::vector<uint8_t> pk = w.finish();
  PickleReadOptions po;
  auto snap = readSnapshotPickle(pk, po);
  if (!snap) return Error{"JSON snapshot: " + snap.error().message, -1};
  snap->source = SourceFormat::Json;
  snap->pickle_protocol = 0;
  snap->input_bytes = bytes.size();
  (void)options;
  return snap;
}

Expected<Snapshot> loadSnapshotBytes(std::span<const uint8_t> bytes, const LoadOptions& options) {
  if (bytes.empty()) return Error{"empty file", 0};
  switch (sniff(bytes)) {
    case Kind::Pickle: {
      PickleReadOptions po;
      po.progress = options.progress;
      return readSnapshotPickle(bytes, po);
    }
    case Kind::Html: {
      // PyTorch 2.0's trace_plot page embeds its processed plot, not the snapshot.
      const std::string_view page(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      constexpr std::string_view kPlotData = "let alloc_data = ";
      if (const size_t at = page.find(kPlotData);
          at != std::string_view::npos && page.find("\"base64\"") == std::string_view::npos) {
        const size_t begin = at + kPlotData.size();
        const size_t end = page.find('\n', begin);  // json.dumps writes it on one line
        auto snap = readMemoryVizPlotData(
            page.substr(begin, end == std::string_view::npos ? end : end - begin));
        if (!snap) return Error{"memory_viz page: " + snap.error().message, -1};
        snap->input_bytes = bytes.size();
        return snap;
      }
      auto pk = extractHtmlPickle(bytes);
      if (!pk) return pk.error();
      // memory_viz pads the pickle with zero bytes to a multiple of 3; the reader stops at STOP.
      PickleReadOptions po;
      auto snap = readSnapshotPickle(*pk, po);
      if (!snap) {
        return Error{"snapshot embedded in HTML: " + snap.error().describe(), -1};
      }
      snap->source = SourceFormat::MemoryVizHtml;
      snap->input_bytes = bytes.size();
      return snap;
    }
    case Kind::Json:
      // A Kineto trace or an export_memory_timeline file, or else memory_viz's JSON form.
      if (sniffProfiler(bytes) == ProfilerKind::NotProfiler)
        return readSnapshotJson(bytes, options);
      [[fallthrough]];
    case Kind::Gzip: {
      if (looksLikeGzip(bytes) && sniffProfiler(bytes) == ProfilerKind::NotProfiler) {
        // A snapshot's JSON, gzipped: decompressed within its budget, then read as JSON.
        auto text = gunzipBounded(bytes, gzipSnapshotJsonBudget(bytes.size()));
        if (!text) return Error{"gzip input: " + text.error().message, -1};
        auto snap = readSnapshotJson(*text, options);
        if (snap) snap->input_bytes = bytes.size();
        return snap;
      }
      ProfilerReadOptions po;
      po.progress = options.progress;
      return readProfilerInput(bytes, po);
    }
    case Kind::Trace:
      return readSnapshotTrace(bytes, options);
    case Kind::Unknown:
      break;
  }
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%02x", bytes[0]);
  return Error{std::string("unrecognized file content (first byte ") + hex +
                   "): expected a PyTorch memory snapshot pickle, a memory_viz HTML page, JSON, "
                   "a torch.profiler trace (plain or gzip) or a memforensics trace",
               0};
}

Expected<Snapshot> loadSnapshotFile(const std::string& path, const LoadOptions& options) {
  // O_NONBLOCK: opening a FIFO that has no writer would otherwise block forever (readStream waits
  // a bounded time for data instead). It changes nothing for regular files.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Error{"cannot open '" + path + "': " + std::strerror(errno), -1};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Error{"cannot stat '" + path + "': " + std::strerror(e), -1};
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Error{"'" + path + "' is a directory", -1};
  }
  if (!S_ISREG(st.st_mode) || st.st_size == 0) {
    // Pipes, FIFOs, character devices (and /proc files, whose size reads 0): into memory, bounded.
    auto buf = readStream(fd, st, path, options);
    ::close(fd);
    if (!buf) return buf.error();
    if (buf->empty()) return Error{"'" + path + "' is empty", -1};
    auto result = loadSnapshotBytes(*buf, options);
    if (!result) {
      Error e = result.error();
      e.message = path + ": " + e.message;
      return e;
    }
    return result;
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return Error{"cannot map '" + path + "': " + std::strerror(errno), -1};
  // Drop pages the reader has passed, so resident memory stays near what the model needs
  // rather than model + whole file. The reader never looks back at consumed bytes.
  const long page = ::sysconf(_SC_PAGESIZE);
  uint64_t released = 0;
  LoadOptions wrapped = options;
  wrapped.progress = [&](uint64_t consumed, uint64_t total) {
    uint64_t upto = consumed > (1u << 20) ? (consumed - (1u << 20)) / page * page : 0;
    if (upto > released) {
      releaseMappedPages(static_cast<char*>(base) + released, upto - released);
      released = upto;
    }
    if (options.progress) options.progress(consumed, total);
  };
  auto bytes = std::span<const uint8_t>(static_cast<const uint8_t*>(base), size);
  Expected<Snapshot> result = [&] {
    // A truncation of the file while it is read: exit 2 with a message (common/memory.h).
    const MappedInput registered(base, size);
    return loadSnapshotBytes(bytes, wrapped);
  }();
  ::munmap(base, size);
  if (!result) {
    Error e = result.error();
    e.message = path + ": " + e.message;
    return e;
  }
  return result;
}

}  // namespace memforensics::format
