// callgraph.cc: see callgraph.h. The only module that uses Boost.Graph.
#include "analysis/callgraph.h"

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <unordered_map>
#include <unordered_set>

namespace memforensics::analysis {

namespace {

struct VertexData {
  format::FrameId frame = 0;
  uint64_t self = 0;
  uint64_t inclusive = 0;
  uint64_t blocks = 0;
};
struct EdgeData {
  uint64_t bytes = 0;  // live bytes that flowed through this call
};
using Graph =
    boost::adjacency_list<boost::setS, boost::vecS, boost::bidirectionalS, VertexData, EdgeData>;
using Vertex = boost::graph_traits<Graph>::vertex_descriptor;

// Frames that carry no attribution: the allocator, the dispatcher, interpreter glue (the same
// frames userFrames() skips).
bool plumbing(const format::Snapshot& s, const format::Frame& f) {
  return isNoiseFrame(s, f) || isPlumbingFrame(s, f);
}

FrameText textOf(const format::Snapshot& s, format::FrameId id) {
  const format::Frame& f = s.stacks.frame(id);
  return FrameText{std::string(s.strings.get(f.filename)), std::string(s.strings.get(f.name)),
                   f.line};
}

}  // namespace

CallGraphSummary buildCallGraph(const format::Snapshot& snap, const U64Map<replay::LiveBlock>& live,
                                size_t top) {
  CallGraphSummary out;
  // Group blocks by stack first: the graph work is then per distinct stack, not per block.
  std::unordered_map<format::StackId, std::pair<uint64_t, uint64_t>> by_stack;  // bytes, blocks
  live.forEach([&](uint64_t, const replay::LiveBlock& b) {
    if (b.pending) return;
    out.total_bytes += b.requested;
    if (b.stack == format::kNoStack || b.stack == format::kEmptyStack) {
      out.unattributed_bytes += b.requested;
      return;
    }
    auto& e = by_stack[b.stack];
    e.first += b.requested;
    e.second += 1;
  });

  Graph g;
  std::unordered_map<format::FrameId, Vertex> vertex_of;
  auto vertex = [&](format::FrameId f) {
    auto [it, fresh] = vertex_of.try_emplace(f, 0);
    if (fresh) {
      it->second = boost::add_vertex(g);
      g[it->second].frame = f;
    }
    return it->second;
  };
  std::vector<Vertex> path;
  std::unordered_set<Vertex> seen;
  for (const auto& [stack, bb] : by_stack) {
    auto [bytes, blocks] = bb;
    path.clear();
    auto frames = snap.stacks.stack(stack);
    for (size_t i = frames.size(); i-- > 0;) {  // outermost first
      const format::Frame& f = snap.stacks.frame(frames[i]);
      if (!plumbing(snap, f)) path.push_back(vertex(frames[i]));
    }
    if (path.empty()) {
      out.unattributed_bytes += bytes;
      continue;
    }
    seen.clear();
    for (size_t i = 0; i < path.size(); ++i) {
      if (seen.insert(path[i]).second) {  // recursion counts a frame once per stack
        g[path[i]].inclusive += bytes;
        g[path[i]].blocks += blocks;
      }
      if (i > 0 && path[i - 1] != path[i]) {
        auto [e, added] = boost::add_edge(path[i - 1], path[i], g);
        (void)added;
        g[e].bytes += bytes;
      }
    }
    g[path.back()].self += bytes;
  }
  out.vertices = boost::num_vertices(g);
  out.edges = boost::num_edges(g);

  // The tie-break between equal byte counts is the frame's display text, built at most once per
  // vertex and only for vertices that meet a tie: one deep stack makes every frame a tie (a
  // 1,000,000-frame stack rebuilt two strings per comparison: most of `report`'s 30 s there).
  std::vector<std::string> display(boost::num_vertices(g));
  std::vector<bool> has_display(boost::num_vertices(g), false);
  auto displayOf = [&](Vertex v) -> const std::string& {
    if (!has_display[v]) {
      display[v] = textOf(snap, g[v].frame).display();
      has_display[v] = true;
    }
    return display[v];
  };
  auto rows = [&](auto key) {
    std::vector<Vertex> vs;
    for (auto [it, end] = boost::vertices(g); it != end; ++it) {
      if (key(*it) != 0) vs.push_back(*it);
    }
    const size_t n = std::min(top, vs.size());
    std::partial_sort(vs.begin(), vs.begin() + static_cast<std::ptrdiff_t>(n), vs.end(),
                      [&](Vertex a, Vertex b) {
                        if (key(a) != key(b)) return key(a) > key(b);
                        return displayOf(a) < displayOf(b);
                      });
    std::vector<FrameBytes> r;
    r.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      Vertex v = vs[i];
      r.push_back(FrameBytes{textOf(snap, g[v].frame), g[v].self, g[v].inclusive, g[v].blocks});
    }
    return r;
  };
  out.top_inclusive = rows([&](Vertex v) { return g[v].inclusive; });
  out.top_self = rows([&](Vertex v) { return g[v].self; });

  // Hot path: the heaviest root (no caller), then always the heaviest outgoing call.
  Vertex best = boost::graph_traits<Graph>::null_vertex();
  for (auto [it, end] = boost::vertices(g); it != end; ++it) {
    if (boost::in_degree(*it, g) != 0) continue;
    if (best == boost::graph_traits<Graph>::null_vertex() || g[*it].inclusive > g[best].inclusive)
      best = *it;
  }
  std::unordered_set<Vertex> on_path;
  for (Vertex v = best;
       v != boost::graph_traits<Graph>::null_vertex() && on_path.insert(v).second;) {
    out.hot_path.push_back(
        FrameBytes{textOf(snap, g[v].frame), g[v].self, g[v].inclusive, g[v].blocks});
    Vertex next = boost::graph_traits<Graph>::null_vertex();
    uint64_t next_bytes = 0;
    for (auto [e, eend] = boost::out_edges(v, g); e != eend; ++e) {
      if (g[*e].bytes > next_bytes) {
        next_bytes = g[*e].bytes;
        next = boost::target(*e, g);
      }
    }
    v = next;
  }
  return out;
}

}  // namespace memforensics::analysis
