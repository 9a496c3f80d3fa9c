// plot_data_reader.cc: the plot data of a PyTorch 2.0 memory_viz page (profiler_reader.h).
#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/profiler/profiler_internal.h"

namespace memforensics::format {

using namespace profiler_detail;

namespace {

// One string of a memory_viz plot's stack: "FILE:LINE:NAME" (_frame_fmt with full file names), or
// anything else as a frame of that name (profile_plot writes Python function names).
Frame plotFrame(Snapshot& snap, std::string_view text) {
  const size_t c2 = text.rfind(':');
  if (c2 != std::string_view::npos && c2 > 0) {
    const size_t c1 = text.rfind(':', c2 - 1);
    if (c1 != std::string_view::npos) {
      uint64_t line = 0;
      const char* b = text.data() + c1 + 1;
      const char* e = text.data() + c2;
      auto [p, ec] = std::from_chars(b, e, line);
      if (ec == std::errc() && p == e && e > b) {
        return Frame{snap.strings.intern(text.substr(0, c1)),
                     snap.strings.intern(text.substr(c2 + 1)), line};
      }
    }
  }
  return Frame{snap.strings.intern(""), snap.strings.intern(text), kUnknownLine};
}

}  // namespace

Expected<Snapshot> readMemoryVizPlotData(std::string_view text) {
  using nlohmann::json;
  if (text.size() > kMaxPlotDataBytes) {
    return Error{"memory_viz plot data of " + std::to_string(text.size()) +
                     " bytes: above the reader's budget of " + std::to_string(kMaxPlotDataBytes),
                 -1};
  }
  // Its JSON tree is held: nesting deeper than the plot's own (3) is refused before it is built
  // (64 MiB of '[' would otherwise become 64 Mi nested arrays).
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char ch : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (ch == '\\')
        escaped = true;
      else if (ch == '"')
        in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > kMaxPlotDataDepth)
        return Error{"memory_viz plot data: nested deeper than " +
                         std::to_string(kMaxPlotDataDepth) + " levels",
                     -1};
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Error{"memory_viz plot data: invalid JSON", -1};
  auto array = [&](const char* key) -> const json* {
    auto it = j.find(key);
    return it != j.end() && it->is_array() ? &*it : nullptr;
  };
  const json* actions = array("actions");
  const json* strings = array("string_table");
  const json* suffix = array("suffix_table");
  const json* initially = array("initially_allocated");
  if (actions == nullptr || strings == nullptr || suffix == nullptr) {
    return Error{"memory_viz plot data: no actions, string_table or suffix_table array", -1};
  }
  // Elements: [{size, info}] (2.0), or the same as elements_size / elements_info (later 2.0.x).
  std::vector<uint64_t> sizes;
  std::vector<int64_t> infos;
  auto element = [&](const json& size, const json& info) {
    if (!size.is_number_unsigned() || !(info.is_null() || info.is_number_unsigned())) return false;
    sizes.push_back(size.get<uint64_t>());
    infos.push_back(info.is_null() ? -1
                                   : static_cast<int64_t>(std::min<uint64_t>(info.get<uint64_t>(),
                                                                             uint64_t{1} << 62)));
    return true;
  };
  if (const json* el = array("elements")) {
    for (const json& e : *el) {
      if (!e.is_object() || !e.contains("size") || !e.contains("info") ||
          !element(e["size"], e["info"]))
        return Error{"memory_viz plot data: an element without a size and an info", -1};
    }
  } else if (const json* es = array("elements_size"), *ei = array("elements_info");
             es != nullptr && ei != nullptr && es->size() == ei->size()) {
    for (size_t k = 0; k < es->size(); ++k) {
      if (!element((*es)[k], (*ei)[k]))
        return Error{"memory_viz plot data: an element without a size and an info", -1};
    }
  } else {
    return Error{"memory_viz plot data: no elements", -1};
  }
  Snapshot snap;
  snap.source = SourceFormat::MemoryVizHtml;
  snap.has_segment_info = false;
  snap.reserved_recorded = false;
  snap.traits.has_device_traces = true;
  // A stack per info id (the suffix table shares tails: a chain's rest is always an earlier id, so
  // every walk ends), cached; the size line and the "alloc not recorded" line are not frames.
  std::vector<StackId> stack_of(suffix->size(), kNoStack);
  std::vector<uint8_t> done(suffix->size(), 0);
  auto stackOf = [&](int64_t info) -> Expected<StackId> {
    if (info < 0) return kNoStack;
    if (static_cast<uint64_t>(info) >= suffix->size())
      return Error{"memory_viz plot data: an element's info is outside the suffix table", -1};
    const auto id0 = static_cast<size_t>(info);
    if (done[id0]) return stack_of[id0];
    std::vector<FrameId> frames;
    int64_t id = info;
    while (id >= 0) {
      const json& entry = (*suffix)[static_cast<size_t>(id)];
      if (!entry.is_array() || entry.size() != 2 || !entry[0].is_number_unsigned() ||
          !(entry[1].is_null() || entry[1].is_number_unsigned()))
        return Error{"memory_viz plot data: a suffix table entry is not [string, rest]", -1};
      const uint64_t sid = entry[0].get<uint64_t>();
      if (sid >= strings->size() || !(*strings)[sid].is_string())
        return Error{"memory_viz plot data: a suffix names no string", -1};
      const int64_t rest =
          entry[1].is_null()
              ? -1
              : static_cast<int64_t>(std::min<uint64_t>(entry[1].get<uint64_t>(), INT64_MAX));
      if (rest >= id) return Error{"memory_viz plot data: a suffix chain does not end", -1};
      const std::string& line = (*strings)[sid].get_ref<const std::string&>();
      const bool label =
          line.find(" allocation") != std::string::npos && frames.empty() && id == info;
      if (!label && line != "alloc not recorded, stack trace for free:" &&
          frames.size() < kMaxProfilerStackFrames)
        frames.push_back(snap.stacks.internFrame(plotFrame(snap, line)));
      id = rest;
    }
    done[id0] = 1;
    return stack_of[id0] = frames.empty() ? kEmptyStack : snap.stacks.internStack(frames);
  };
  // An element's first action allocates it, the next frees it (as the page's own script reads
  // them); those alive at the start are freed by their first action.
  std::vector<uint8_t> live(sizes.size(), 0);
  if (initially != nullptr) {
    for (const json& v : *initially) {
      if (!v.is_number_unsigned() || v.get<uint64_t>() >= sizes.size())
        return Error{"memory_viz plot data: initially_allocated names no element", -1};
      live[v.get<uint64_t>()] = 1;
    }
  }
  std::vector<Op> ops;
  ops.reserve(actions->size());
  for (const json& v : *actions) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() >= sizes.size())
      return Error{"memory_viz plot data: an action names no element", -1};
    const auto k = static_cast<size_t>(v.get<uint64_t>());
    auto st = stackOf(infos[k]);
    if (!st) return st.error();
    ops.push_back(Op{-1, sizes[k], k + 1, -1, -1, *st, 0, live[k] != 0});
    live[k] ^= 1;
  }
  std::vector<std::vector<Event>> per_device(1);
  BuildResult r = buildDevice(ops, -1, false, true, "device 0", kNoStack, "the plot");
  per_device[0] = std::move(r.events);
  addFinalState(snap, 0, r);
  finishTraces(snap, per_device);
  snap.origin = "memory_viz plot data (torch.cuda._memory_viz.trace_plot of PyTorch 2.0): " +
                std::to_string(sizes.size()) + " allocations, " + std::to_string(actions->size()) +
                " actions";
  auto& w = snap.load_warnings;
  w.push_back(
      "a PyTorch 2.0 memory_viz page holds the plot of one device's allocations (which device is "
      "not recorded: shown as device 0), in order without times, and no segments; reserved "
      "bytes are absent");
  for (auto& n : r.notes) w.push_back(std::move(n));
  w.push_back(
      "no segment information in a memory_viz plot: block addresses are synthesized, so there is "
      "no block layout (blocks and what needs one are not available)");
  return snap;
}

}  // namespace memforensics::format
