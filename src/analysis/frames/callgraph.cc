// callgraph.cc: see callgraph.h. The only module that uses Boost.Graph.
#include "analysis/frames/callgraph.h"

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <unordered_map>
#include <unordered_set>

#include "analysis/frames/frame_class.h"
#include "analysis/frames/frame_tree.h"

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

FrameText textOf(const format::Snapshot& s, format::FrameId id) {
  return frameText(s, id);
}

}  // namespace

CallGraphSummary buildCallGraph(const format::Snapshot& snap, const U64Map<replay::LiveBlock>& live,
                                size_t top) {
  CallGraphSummary out;
  // The one frame tree (frame_tree.h) with the frames that carry attribution; the graph merges
  // the tree's nodes of one frame into one vertex.
  FrameTreeOptions topt;
  topt.frames = TreeFrames::Attributable;
  topt.value = TreeValue::Requested;
  topt.pending = TreePending::Exclude;
  const FrameTree tree = buildFrameTree(snap, live, topt);
  out.total_bytes = tree.nodes[0].bytes;
  out.unattributed_bytes = tree.unattributed;

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
  // Vertices in the tree's node order (deterministic), then a depth-first walk that counts a
  // frame's inclusive bytes once per path (recursion), with the frames on the current path
  // counted in `depth_of`.
  for (const FrameTreeNode& n : tree.nodes) {
    if (n.kind == TreeNodeKind::Frame) vertex(n.frame);
  }
  std::unordered_map<format::FrameId, uint32_t> depth_of;
  struct Visit {
    int32_t node;
    bool leaving;
  };
  std::vector<Visit> todo = {{0, false}};
  while (!todo.empty()) {
    const Visit v = todo.back();
    todo.pop_back();
    const FrameTreeNode& n = tree.nodes[static_cast<size_t>(v.node)];
    const bool is_frame = n.kind == TreeNodeKind::Frame;
    if (v.leaving) {
      if (is_frame && --depth_of[n.frame] == 0) depth_of.erase(n.frame);
      continue;
    }
    if (is_frame) {
      const Vertex x = vertex_of.at(n.frame);
      if (depth_of[n.frame]++ == 0) {
        g[x].inclusive += n.bytes;
        g[x].blocks += n.blocks;
      }
      g[x].self += n.self;
      const FrameTreeNode& p = tree.nodes[static_cast<size_t>(n.parent)];
      if (p.kind == TreeNodeKind::Frame && p.frame != n.frame) {
        auto [e, added] = boost::add_edge(vertex_of.at(p.frame), x, g);
        (void)added;
        g[e].bytes += n.bytes;
      }
      todo.push_back({v.node, true});
    }
    for (auto c = n.children.rbegin(); c != n.children.rend(); ++c) todo.push_back({*c, false});
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
  std::vector<format::FrameId> path_frames;  // parallel to out.hot_path
  for (Vertex v = best;
       v != boost::graph_traits<Graph>::null_vertex() && on_path.insert(v).second;) {
    out.hot_path.push_back(
        FrameBytes{textOf(snap, g[v].frame), g[v].self, g[v].inclusive, g[v].blocks});
    path_frames.push_back(g[v].frame);
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
  // The part a person acts on: from the outermost to the innermost frame of their own code, when
  // the path holds any (the framework's entry points above it, e.g. DataParallel's worker, and the
  // operators below it are what that code called).
  size_t first_user = out.hot_path.size(), last_user = 0;
  for (size_t i = 0; i < path_frames.size(); ++i) {
    if (classifyFrame(snap, snap.stacks.frame(path_frames[i])) != FrameKind::User) continue;
    first_user = std::min(first_user, i);
    last_user = i;
  }
  if (first_user < out.hot_path.size()) {
    out.hot_path.erase(out.hot_path.begin() + static_cast<std::ptrdiff_t>(last_user) + 1,
                       out.hot_path.end());
    out.hot_path.erase(out.hot_path.begin(),
                       out.hot_path.begin() + static_cast<std::ptrdiff_t>(first_user));
  }
  return out;
}

}  // namespace memforensics::analysis
