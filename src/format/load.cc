// load.cc: content sniffing, file mapping with page release behind the reader, HTML and JSON forms.
#include "format/load.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/pickle_writer.h"
#include "format/snapshot_trace.h"
#include "format/trace_reader.h"

namespace memforensics::format {

namespace {

enum class Kind { Pickle, Html, Json, Trace, Unknown };

Kind sniff(std::span<const uint8_t> b) {
  if (!b.empty() && b[0] == 0x80) return Kind::Pickle;
  if (trace::looksLikeTrace(b)) return Kind::Trace;
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

// JSON value -> pickle opcodes, so the JSON form shares every check of the pickle path. False when
// nested deeper than a snapshot ever is, before the recursion can exhaust the stack.
constexpr int kMaxJsonDepth = 256;
bool emitJson(const nlohmann::json& j, PickleWriter& w, int depth = 0) {
  if (depth > kMaxJsonDepth) return false;
  switch (j.type()) {
    case nlohmann::json::value_t::object:
      w.beginDict();
      for (auto it = j.begin(); it != j.end(); ++it) {
        w.str(it.key());
        if (!emitJson(it.value(), w, depth + 1)) return false;
      }
      w.endDict();
      break;
    case nlohmann::json::value_t::array:
      w.beginList();
      for (const auto& x : j) {
        if (!emitJson(x, w, depth + 1)) return false;
      }
      w.endList();
      break;
    case nlohmann::json::value_t::string: w.str(j.get_ref<const std::string&>()); break;
    case nlohmann::json::value_t::boolean: w.boolean(j.get<bool>()); break;
    case nlohmann::json::value_t::number_integer: w.integer(j.get<int64_t>()); break;
    case nlohmann::json::value_t::number_unsigned: w.uinteger(j.get<uint64_t>()); break;
    case nlohmann::json::value_t::number_float: w.floating(j.get<double>()); break;
    default: w.none(); break;
  }
  return true;
}

}  // namespace

Expected<std::vector<uint8_t>> extractHtmlPickle(std::span<const uint8_t> b) {
  std::string_view text(reinterpret_cast<const char*>(b.data()), b.size());
  size_t key = text.find("\"base64\"");
  if (key == std::string_view::npos) {
    return Error{"HTML file without an embedded snapshot (no \"base64\" field; only pages written "
                 "by torch.cuda._memory_viz are supported)",
                 -1};
  }
  size_t q = text.find('"', key + 8);
  size_t colon = text.find(':', key + 8);
  if (q == std::string_view::npos || colon == std::string_view::npos || colon > q) {
    return Error{"HTML file: malformed \"base64\" field", static_cast<int64_t>(key)};
  }
  std::vector<uint8_t> out;
  out.reserve((text.size() - q) / 4 * 3);
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
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::parse_error& e) {
    return Error{std::string("invalid JSON: ") + e.what(), static_cast<int64_t>(e.byte)};
  } catch (const nlohmann::json::exception& e) {  // out_of_range: a number beyond a double (1e400)
    return Error{std::string("invalid JSON: ") + e.what(), -1};
  }
  PickleWriter w(4);
  if (!emitJson(j, w)) {
    return Error{"JSON nested more than " + std::to_string(kMaxJsonDepth) +
                     " levels deep: not a memory snapshot",
                 -1};
  }
  j = nullptr;
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
    case Kind::Json: return readSnapshotJson(bytes, options);
    case Kind::Trace: return readSnapshotTrace(bytes, options);
    case Kind::Unknown: break;
  }
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%02x", bytes[0]);
  return Error{std::string("unrecognized file content (first byte ") + hex +
                   "): expected a PyTorch memory snapshot pickle, a memory_viz HTML page, JSON or a memforensics trace",
               0};
}

Expected<Snapshot> loadSnapshotFile(const std::string& path, const LoadOptions& options) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
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
    // Pipes and special files: read everything into memory.
    std::vector<uint8_t> buf;
    uint8_t tmp[1 << 16];
    ssize_t n;
    while ((n = ::read(fd, tmp, sizeof tmp)) > 0) buf.insert(buf.end(), tmp, tmp + n);
    ::close(fd);
    if (buf.empty()) return Error{"'" + path + "' is empty", -1};
    return loadSnapshotBytes(buf, options);
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return Error{"cannot map '" + path + "': " + std::strerror(errno), -1};
  ::madvise(base, size, MADV_SEQUENTIAL);
  // Drop pages the reader has passed, so resident memory stays near what the model needs
  // rather than model + whole file. The reader never looks back at consumed bytes.
  const long page = ::sysconf(_SC_PAGESIZE);
  uint64_t released = 0;
  LoadOptions wrapped = options;
  wrapped.progress = [&](uint64_t consumed, uint64_t total) {
    uint64_t upto = consumed > (1u << 20) ? (consumed - (1u << 20)) / page * page : 0;
    if (upto > released) {
      ::madvise(static_cast<char*>(base) + released, upto - released, MADV_DONTNEED);
      released = upto;
    }
    if (options.progress) options.progress(consumed, total);
  };
  auto bytes = std::span<const uint8_t>(static_cast<const uint8_t*>(base), size);
  auto result = loadSnapshotBytes(bytes, wrapped);
  ::munmap(base, size);
  if (!result) {
    Error e = result.error();
    e.message = path + ": " + e.message;
    return e;
  }
  return result;
}

}  // namespace memforensics::format
