// export_collapsed.cc: folded stacks ("a;b;c 123") of the memory live at each device's peak.
#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "analysis/frames.h"
#include "replay/replay.h"
#include "report/export.h"

namespace memforensics::report {

namespace {

// Length of the valid UTF-8 sequence starting at s[i], 0 when it is not one (overlong forms,
// surrogates and code points above U+10FFFF included).
size_t utf8Length(std::string_view s, size_t i) {
  auto byte = [&](size_t k) -> int {
    return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : -1;
  };
  auto cont = [&](size_t k, int lo = 0x80, int hi = 0xBF) {
    int b = byte(k);
    return b >= lo && b <= hi;
  };
  int c = byte(0);
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    bool second = c == 0xE0 ? cont(1, 0xA0) : c == 0xED ? cont(1, 0x80, 0x9F) : cont(1);
    return second && cont(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    bool second = c == 0xF0 ? cont(1, 0x90) : c == 0xF4 ? cont(1, 0x80, 0x8F) : cont(1);
    return second && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

// Appends frame text with the folded format's separators neutralized: ';' splits frames and a
// newline ends the record, so ';' becomes ',' and control characters become ' '. Invalid UTF-8
// becomes U+FFFD, as in the JSON outputs, so that viewers decoding UTF-8 see the same text.
void appendSanitized(std::string& out, std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += c == ';' ? ',' : (c < 0x20 || c == 0x7F) ? ' ' : static_cast<char>(c);
      ++i;
    } else if (size_t n = utf8Length(s, i); n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
}

// "cuda:<d>;outermost;...;innermost" for one stack.
std::string stackText(const format::Snapshot& snap, int64_t device, format::StackId stack,
                      bool user_frames_only) {
  std::string out = "cuda:" + std::to_string(device);
  if (stack == format::kNoStack) return out + ";[no stack recorded]";
  auto ids = snap.stacks.stack(stack);
  if (ids.empty()) return out + ";[empty stack]";
  std::vector<std::string> frames;  // innermost first, as stored
  if (user_frames_only) {
    for (const auto& f : analysis::userFrames(snap, stack, ids.size())) {
      frames.push_back(exportFrameText(f.name, f.filename, f.line));
    }
    if (frames.empty()) return out + ";[no user frames]";
  } else {
    for (format::FrameId id : ids) {
      const format::Frame& f = snap.stacks.frame(id);
      frames.push_back(
          exportFrameText(snap.strings.get(f.name), snap.strings.get(f.filename), f.line));
    }
  }
  for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
    out += ';';
    appendSanitized(out, *it);
  }
  return out;
}

}  // namespace

std::string exportFrameText(std::string_view name, std::string_view file, uint64_t line) {
  std::string out = name.empty() ? "[unknown]" : std::string(name);
  if (!file.empty()) {
    out += " (";
    out += file;
    if (line != format::kUnknownLine) {
      out += ':';
      out += std::to_string(line);
    }
    out += ")";
  }
  return out;
}

Status exportCollapsed(const format::Snapshot& snap, std::ostream& out,
                       const CollapsedOptions& opt) {
  std::vector<int64_t> devices = snap.devices();
  if (opt.device) {
    if (std::find(devices.begin(), devices.end(), *opt.device) == devices.end()) {
      return Error{"device " + std::to_string(*opt.device) + " is not in the snapshot"};
    }
    devices = {*opt.device};
  }
  const bool requested = opt.which == CollapsedValue::Requested;
  for (int64_t d : devices) {
    replay::DeviceReplayer r(snap, d);
    replay::DeviceSummary s = replay::summarizeDevice(r);
    r.advanceTo(requested ? s.peak_requested.event : s.peak_allocated.event);
    // Blocks share stacks heavily: render each stack once, then aggregate by text (distinct
    // stacks can render alike, e.g. with user_frames_only).
    std::unordered_map<format::StackId, std::string> texts;
    std::map<std::string, uint64_t> lines;  // sorted by stack text
    r.live().forEach([&](uint64_t, const replay::LiveBlock& b) {
      // allocated excludes pending-free blocks (memory_allocated drops at free_requested);
      // requested keeps them until free_completed, and says so with a leaf frame.
      if (!requested && b.pending) return;
      auto it = texts.find(b.stack);
      if (it == texts.end())
        it = texts.emplace(b.stack, stackText(snap, d, b.stack, opt.user_frames_only)).first;
      uint64_t v = requested ? b.requested : b.size;
      lines[b.pending ? it->second + ";[pending free]" : it->second] += v;
    });
    std::string buf;
    for (const auto& [stack, bytes] : lines) {
      if (bytes == 0) continue;  // a zero-width frame shows nothing and some tools reject it
      buf.clear();
      buf += stack;
      buf += ' ';
      buf += std::to_string(bytes);
      buf += '\n';
      out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    }
    if (!out) break;
  }
  out.flush();
  if (!out) return Error{"writing the collapsed stacks failed"};
  return Status::Ok();
}

}  // namespace memforensics::report
