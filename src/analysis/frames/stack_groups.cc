// stack_groups.cc: see stack_groups.h.
#include "analysis/frames/stack_groups.h"

#include <algorithm>
#include <map>
#include <span>
#include <string>

#include "common/saturating.h"

namespace memforensics::analysis {

namespace {

// Frame by frame, by display text; a shorter list that is a prefix of the other first.
int compareFrames(const std::vector<FrameText>& a, const std::vector<FrameText>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const int c = a[i].display().compare(b[i].display());
    if (c != 0) return c;
  }
  return a.size() < b.size() ? -1 : a.size() > b.size() ? 1 : 0;
}

std::string keyOf(bool has_stack, const std::vector<FrameText>& frames) {
  std::string k(1, has_stack ? 's' : '-');
  for (const FrameText& f : frames) {
    k += '\0';
    k += f.filename;
    k += '\0';
    k += std::to_string(f.line);
    k += '\0';
    k += f.name;
  }
  return k;
}

}  // namespace

bool groupBefore(const LiveGroup& a, const LiveGroup& b) {
  if (a.requested_bytes != b.requested_bytes) return a.requested_bytes > b.requested_bytes;
  if (a.has_stack != b.has_stack) return a.has_stack;
  return compareFrames(a.frames, b.frames) < 0;
}

void StackGrouper::add(format::StackId stack, uint64_t requested, uint64_t block_bytes,
                       uint64_t count, int64_t alloc_event) {
  PerStack& p = by_stack_[stack];
  p.requested = addSat(p.requested, requested);
  p.block = addSat(p.block, block_bytes);
  p.count = addSat(p.count, count);
  p.first_event = std::min(p.first_event, alloc_event);
}

std::vector<LiveGroup> StackGrouper::take() {
  struct Member {
    format::StackId stack;
    PerStack p;
  };
  std::map<std::string, std::pair<LiveGroup, std::vector<Member>>> merged;
  for (const auto& [stack, p] : by_stack_) {
    const bool has_stack = stack != format::kNoStack && stack != format::kEmptyStack;
    std::vector<FrameText> frames =
        has_stack ? userFrames(snap_, stack, opt_.frames) : std::vector<FrameText>{};
    auto& [g, members] = merged[keyOf(has_stack, frames)];
    if (members.empty()) {
      g.frames = std::move(frames);
      g.has_stack = has_stack;
    }
    g.requested_bytes = addSat(g.requested_bytes, p.requested);
    g.block_bytes = addSat(g.block_bytes, p.block);
    g.count = addSat(g.count, p.count);
    members.push_back(Member{stack, p});
  }
  by_stack_.clear();
  // Members of one group are ordered by every frame as recorded, compared by display text. The
  // stacks are walked in place and each distinct frame's text is made once: a group of deep stacks
  // (a trace's stacks may hold millions of frames in all) costs no copy of its frames.
  std::unordered_map<format::FrameId, std::string> shown;
  auto textOf = [&](format::FrameId f) -> const std::string& {
    auto it = shown.find(f);
    if (it == shown.end()) it = shown.emplace(f, frameText(snap_, f).display()).first;
    return it->second;
  };
  auto compareStacks = [&](format::StackId a, format::StackId b) {
    const auto fa =
        a == format::kNoStack ? std::span<const format::FrameId>{} : snap_.stacks.stack(a);
    const auto fb =
        b == format::kNoStack ? std::span<const format::FrameId>{} : snap_.stacks.stack(b);
    for (size_t i = 0; i < fa.size() && i < fb.size(); ++i) {
      if (fa[i] == fb[i]) continue;
      const int c = textOf(fa[i]).compare(textOf(fb[i]));
      if (c != 0) return c;
    }
    return fa.size() < fb.size() ? -1 : fa.size() > fb.size() ? 1 : 0;
  };
  std::vector<LiveGroup> out;
  out.reserve(merged.size());
  for (auto& [key, gm] : merged) {
    auto& [g, members] = gm;
    if (members.size() > 1) {
      std::sort(members.begin(), members.end(), [&](const Member& a, const Member& b) {
        if (a.p.requested != b.p.requested) return a.p.requested > b.p.requested;
        const int c = compareStacks(a.stack, b.stack);
        if (c != 0) return c < 0;
        return a.stack == format::kEmptyStack && b.stack == format::kNoStack;
      });
    }
    int64_t first = std::numeric_limits<int64_t>::max();
    for (const Member& m : members) {
      g.stacks.push_back(m.stack);
      first = std::min(first, m.p.first_event);
    }
    g.first_event = first == std::numeric_limits<int64_t>::max() ? -1 : first;
    g.representative = members.front().stack;
    out.push_back(std::move(g));
  }
  std::sort(out.begin(), out.end(), groupBefore);
  if (out.size() > opt_.top) out.resize(opt_.top);
  return out;
}

std::vector<LiveGroup> groupLiveByStack(const format::Snapshot& snap,
                                        const U64Map<replay::LiveBlock>& live,
                                        PendingBlocks pending, GroupOptions opt) {
  StackGrouper g(snap, opt);
  live.forEach([&](uint64_t, const replay::LiveBlock& b) {
    if (pending == PendingBlocks::Exclude && b.pending) return;
    if (pending == PendingBlocks::Only && !b.pending) return;
    g.add(b.stack, b.requested, b.size, 1, b.alloc_event);
  });
  return g.take();
}

}  // namespace memforensics::analysis
