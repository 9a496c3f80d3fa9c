// export_collapsed.cc: folded stacks ("a;b;c 123") of the memory live at each device's peak.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "analysis/frames/frame_tree.h"
#include "analysis/frames/frames.h"
#include "analysis/session/session.h"
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

int64_t collapsedMoment(const analysis::DeviceFacts& facts, CollapsedValue which) {
  return which == CollapsedValue::Requested ? facts.summary.peak_requested.event
                                            : facts.summary.peak_allocated.event;
}

namespace {

// The lines of one device: the frame tree of its live set at the peak (all frames, or the user
// frames), one line per node that ends some stacks, the path from the root as its text. Distinct
// nodes can read alike (equal frame text under different ids), so lines are summed by text.
void writeDevice(const format::Snapshot& snap, const analysis::DeviceFacts& f, std::ostream& out,
                 const CollapsedOptions& opt) {
  const bool requested = opt.which == CollapsedValue::Requested;
  const analysis::MomentFacts* m = f.at(collapsedMoment(f, opt.which));
  if (m == nullptr || !m->has_live) return;
  analysis::FrameTreeOptions to;
  to.frames = opt.user_frames_only ? analysis::TreeFrames::User : analysis::TreeFrames::All;
  to.max_user_frames = SIZE_MAX;
  // allocated excludes pending-free blocks (memory_allocated drops at free_requested); requested
  // keeps them until free_completed, and says so with a leaf frame.
  to.value = requested ? analysis::TreeValue::Requested : analysis::TreeValue::BlockSize;
  to.pending = requested ? analysis::TreePending::LeafMark : analysis::TreePending::Exclude;
  const analysis::FrameTree tree = analysis::buildFrameTree(snap, m->live, to);
  // Depth first with one running path (a node's text is its parent's plus its own), so a stack of
  // a million frames costs its own length, not the sum of every prefix.
  auto own = [&](const analysis::FrameTreeNode& n) {
    std::string t;
    switch (n.kind) {
      case analysis::TreeNodeKind::Frame: {
        const format::Frame& fr = snap.stacks.frame(n.frame);
        appendSanitized(
            t, exportFrameText(snap.strings.get(fr.name), snap.strings.get(fr.filename), fr.line));
        break;
      }
      case analysis::TreeNodeKind::NoStack:
        t = "[no stack recorded]";
        break;
      case analysis::TreeNodeKind::EmptyStack:
        t = "[empty stack]";
        break;
      case analysis::TreeNodeKind::NoFrames:
        t = opt.user_frames_only ? "[no user frames]" : "[empty stack]";
        break;
      case analysis::TreeNodeKind::Pending:
        t = "[pending free]";
        break;
      case analysis::TreeNodeKind::NativeGroup:  // not asked for: frames as recorded
        t = "[C++ stack]";
        break;
      case analysis::TreeNodeKind::Root:
        break;
    }
    return t;
  };
  std::map<std::string, uint64_t> lines;  // sorted by stack text
  std::string path = "cuda:" + std::to_string(f.device);
  struct Visit {
    int32_t node;
    size_t child;      // next child to visit
    size_t path_size;  // path length before this node's text
  };
  std::vector<Visit> stack = {{0, 0, path.size()}};
  while (!stack.empty()) {
    Visit& v = stack.back();
    const analysis::FrameTreeNode& n = tree.nodes[static_cast<size_t>(v.node)];
    if (v.child == 0 && v.node != 0 && n.self > 0) lines[path] += n.self;
    if (v.child < n.children.size()) {
      const int32_t c = n.children[v.child++];
      const size_t before = path.size();
      path += ';';
      path += own(tree.nodes[static_cast<size_t>(c)]);
      stack.push_back({c, 0, before});
      continue;
    }
    path.resize(v.path_size);
    stack.pop_back();
  }
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
}

}  // namespace

Status exportCollapsed(const format::Snapshot& snap, std::span<const analysis::DeviceFacts> facts,
                       std::ostream& out, const CollapsedOptions& opt) {
  for (const auto& f : facts) {
    writeDevice(snap, f, out, opt);
    if (!out) break;
  }
  out.flush();
  if (!out) return Error{"writing the collapsed stacks failed"};
  return Status::Ok();
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
  // One session per device, one at a time: the live set at the peak, nothing else.
  for (int64_t d : devices) {
    analysis::DeviceSession session(snap, d);
    session.requestLive(collapsedMoment(session.facts(), opt.which), analysis::kMomentAt);
    const analysis::DeviceFacts f = session.take();
    writeDevice(snap, f, out, opt);
    if (!out) break;
  }
  out.flush();
  if (!out) return Error{"writing the collapsed stacks failed"};
  return Status::Ok();
}

}  // namespace memforensics::report
