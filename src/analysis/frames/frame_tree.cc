// frame_tree.cc: see frame_tree.h.
#include "analysis/frames/frame_tree.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "analysis/frames/frame_class.h"
#include "common/saturating.h"

namespace memforensics::analysis {

std::vector<format::FrameId> selectedFrames(const format::Snapshot& snap, format::StackId stack,
                                            const FrameTreeOptions& opt) {
  std::vector<format::FrameId> out;
  if (stack == format::kNoStack || stack == format::kEmptyStack) return out;
  auto ids = snap.stacks.stack(stack);
  switch (opt.frames) {
    case TreeFrames::All:
      out.assign(ids.begin(), ids.end());
      break;
    case TreeFrames::Attributable:
      for (format::FrameId id : ids) {
        if (classifyFrame(snap, snap.stacks.frame(id)) != FrameKind::Plumbing) out.push_back(id);
      }
      break;
    case TreeFrames::User:
      out = userFrameIds(snap, stack, opt.max_user_frames);
      break;
  }
  return out;
}

FrameTree buildFrameTree(const format::Snapshot& snap, const U64Map<replay::LiveBlock>& live,
                         const FrameTreeOptions& opt) {
  // Per (stack, pending marker): bytes and blocks. The graph work is then per distinct stack.
  struct Entry {
    format::StackId stack = format::kNoStack;
    bool pending = false;  // under the Pending marker
    uint8_t group = 0;     // under the NativeGroup node of this group (0: none)
    uint64_t bytes = 0, blocks = 0;
    std::vector<format::FrameId> frames;  // selected, innermost first
    std::vector<std::string> text;        // display text of `frames`, for the ranking
  };
  std::unordered_map<uint64_t, size_t> index;  // (stack << 9 | group << 1 | pending) -> entries
  std::vector<Entry> entries;
  // Per stack: its selected frames, selected once (the native-only test and the entries read them).
  std::unordered_map<format::StackId, std::vector<format::FrameId>> selected;
  auto framesOf = [&](format::StackId id) -> const std::vector<format::FrameId>& {
    auto [it, fresh] = selected.try_emplace(id);
    if (fresh) it->second = selectedFrames(snap, id, opt);
    return it->second;
  };
  // Per stack: has it selected frames, none of them in a Python file (what the reader of the tree
  // sees; only asked with native_group).
  std::unordered_map<format::StackId, bool> native_only;
  auto nativeOnly = [&](format::StackId id) {
    if (id == format::kNoStack || id == format::kEmptyStack) return false;
    auto [it, fresh] = native_only.try_emplace(id, false);
    if (fresh) {
      const std::vector<format::FrameId>& shown = framesOf(id);
      it->second = !shown.empty() && std::none_of(shown.begin(), shown.end(), [&](auto f) {
        return isPythonFile(snap.strings.get(snap.stacks.frame(f).filename));
      });
    }
    return it->second;
  };
  live.forEach([&](uint64_t, const replay::LiveBlock& b) {
    if (b.pending && opt.pending == TreePending::Exclude) return;
    const bool mark = b.pending && opt.pending == TreePending::LeafMark;
    const uint8_t group = opt.native_group && nativeOnly(b.stack) ? opt.native_group(b) : 0;
    const uint64_t key = (uint64_t{b.stack} << 9) | (uint64_t{group} << 1) | (mark ? 1 : 0);
    auto [it, fresh] = index.try_emplace(key, entries.size());
    if (fresh) entries.push_back(Entry{b.stack, mark, group, 0, 0, {}, {}});
    Entry& e = entries[it->second];
    e.bytes = addSat(e.bytes, opt.value == TreeValue::Requested ? b.requested : b.size);
    e.blocks += 1;
  });
  for (Entry& e : entries) e.frames = framesOf(e.stack);
  selected.clear();
  // The frames' text is built only for entries that meet a tie on bytes, once each (one deep
  // stack would otherwise build a million strings that no comparison reads).
  auto textOf = [&](Entry& e) -> const std::vector<std::string>& {
    if (e.text.empty() && !e.frames.empty()) {
      for (format::FrameId f : e.frames) e.text.push_back(frameText(snap, f).display());
    }
    return e.text;
  };
  // Largest first; then by frames' text; then markers in a fixed order.
  std::sort(entries.begin(), entries.end(), [&](Entry& a, Entry& b) {
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    const auto& ta = textOf(a);
    const auto& tb = textOf(b);
    if (ta != tb) return ta < tb;
    const int ka = a.stack == format::kNoStack ? 2 : a.stack == format::kEmptyStack ? 1 : 0;
    const int kb = b.stack == format::kNoStack ? 2 : b.stack == format::kEmptyStack ? 1 : 0;
    if (ka != kb) return ka < kb;
    if (a.group != b.group) return a.group < b.group;
    return a.pending < b.pending;
  });

  FrameTree t;
  t.nodes.push_back(FrameTreeNode{});
  // (parent, child key) -> node; key: frame id, or ~kind for markers.
  std::map<std::pair<int32_t, int64_t>, int32_t> child;
  for (const Entry& e : entries) {
    int32_t cur = 0;
    t.nodes[0].bytes = addSat(t.nodes[0].bytes, e.bytes);
    t.nodes[0].blocks += e.blocks;
    auto descend = [&](TreeNodeKind kind, format::FrameId frame, uint8_t group = 0) {
      const int64_t key = kind == TreeNodeKind::Frame
                              ? int64_t{frame}
                              : ~(static_cast<int64_t>(kind) | (int64_t{group} << 8));
      auto [it, fresh] = child.try_emplace({cur, key}, static_cast<int32_t>(t.nodes.size()));
      if (fresh) {
        FrameTreeNode n;
        n.kind = kind;
        n.frame = kind == TreeNodeKind::Frame ? frame : 0;
        n.group = group;
        n.parent = cur;
        t.nodes[static_cast<size_t>(cur)].children.push_back(it->second);
        t.nodes.push_back(std::move(n));
      }
      cur = it->second;
      FrameTreeNode& n = t.nodes[static_cast<size_t>(cur)];
      n.bytes = addSat(n.bytes, e.bytes);
      n.blocks += e.blocks;
    };
    if (e.stack == format::kNoStack) {
      descend(TreeNodeKind::NoStack, 0);
      t.unattributed = addSat(t.unattributed, e.bytes);
    } else if (e.stack == format::kEmptyStack) {
      descend(TreeNodeKind::EmptyStack, 0);
      t.unattributed = addSat(t.unattributed, e.bytes);
    } else if (e.frames.empty()) {
      descend(TreeNodeKind::NoFrames, 0);
      t.unattributed = addSat(t.unattributed, e.bytes);
    } else {
      if (e.group != 0) descend(TreeNodeKind::NativeGroup, 0, e.group);
      for (auto f = e.frames.rbegin(); f != e.frames.rend(); ++f) descend(TreeNodeKind::Frame, *f);
    }
    if (e.pending) descend(TreeNodeKind::Pending, 0);
    FrameTreeNode& last = t.nodes[static_cast<size_t>(cur)];
    last.self = addSat(last.self, e.bytes);
  }
  return t;
}

}  // namespace memforensics::analysis
