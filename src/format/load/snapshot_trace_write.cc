// snapshot_trace_write.cc: the Snapshot -> trace half of snapshot_trace.h, and the FormatTraits
// bits both halves use (the reader is snapshot_trace.cc).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "format/load/snapshot_trace.h"
#include "format/trace/trace_events.h"

namespace memforensics::format {

namespace {

constexpr uint32_t kUnmapped = std::numeric_limits<uint32_t>::max();

// Each FormatTraits flag and its bit in the Meta chunk (format/trace/trace_format.h, traits::).
struct TraitBit {
  uint64_t bit;
  bool FormatTraits::*flag;
};
constexpr TraitBit kTraitBits[] = {
    {trace::traits::kTopLevelList, &FormatTraits::top_level_list},
    {trace::traits::kDeviceTraces, &FormatTraits::has_device_traces},
    {trace::traits::kBlockHistory, &FormatTraits::has_block_history},
    {trace::traits::kBlockAddress, &FormatTraits::has_block_address},
    {trace::traits::kSegmentPoolId, &FormatTraits::has_segment_pool_id},
    {trace::traits::kTimeUs, &FormatTraits::has_time_us},
    {trace::traits::kAllocatorSettings, &FormatTraits::has_allocator_settings},
    {trace::traits::kAnnotationsKey, &FormatTraits::has_annotations_key},
    {trace::traits::kCompileContext, &FormatTraits::has_compile_context},
    {trace::traits::kGraphCaptureKey, &FormatTraits::has_graph_capture_key},
    {trace::traits::kUserMetadata, &FormatTraits::has_user_metadata},
    {trace::traits::kPoolId, &FormatTraits::has_pool_id},
    {trace::traits::kHostTraces, &FormatTraits::has_host_traces},
    {trace::traits::kAnnotateAction, &FormatTraits::has_annotate_action},
};
static_assert(std::size(kTraitBits) == trace::traits::kCount, "a FormatTraits flag has no bit");
constexpr bool traitBitsDistinct() {
  uint64_t seen = 0;
  for (const TraitBit& t : kTraitBits) {
    if ((t.bit & (t.bit - 1)) != 0 || (seen & t.bit) != 0) return false;
    seen |= t.bit;
  }
  return true;
}
static_assert(traitBitsDistinct(), "two FormatTraits flags share a bit");

std::string joinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) {
    if (!out.empty()) out.push_back('\n');
    out += k;
  }
  return out;
}

}  // namespace

uint64_t traitsToBits(const FormatTraits& t) {
  uint64_t bits = 0;
  for (const TraitBit& b : kTraitBits) {
    if (t.*b.flag) bits |= b.bit;
  }
  return bits;
}

FormatTraits traitsFromBits(uint64_t bits) {
  FormatTraits t;
  for (const TraitBit& b : kTraitBits) t.*b.flag = (bits & b.bit) != 0;
  return t;
}

// ---------------------------------------------------------------------------------------------
// Snapshot -> trace

Status writeSnapshotTrace(const Snapshot& s, trace::ByteSink& sink,
                          const TraceWriteOptions& options) {
  trace::WriterOptions wo;
  wo.zstd_level = options.zstd_level;
  wo.checkpoint_every = options.checkpoint_every;
  wo.chunk_bytes = options.chunk_bytes;
  if (s.traceCount() > trace::kMaxDevice) {
    return Error{"the snapshot has " + std::to_string(s.traceCount()) +
                     " device traces; a native trace holds at most " +
                     std::to_string(trace::kMaxDevice),
                 -1};
  }
  trace::TraceWriter w(sink, wo);

  std::string source_format(sourceFormatName(s.source));
  std::string ignored = joinKeys(s.ignored_keys);
  trace::TraceMeta meta;
  meta.producer = options.producer;
  meta.source_format = source_format;
  meta.source_bytes = s.input_bytes;
  meta.pickle_protocol = static_cast<uint32_t>(s.pickle_protocol);
  meta.traits = traitsToBits(s.traits);
  meta.host_trace_events = s.host_trace_events;
  meta.ignored_keys = ignored;
  std::string warnings = joinKeys(s.load_warnings);
  meta.source_warnings = warnings;
  Status st = w.begin(meta);
  if (!st.ok()) return st;

  std::vector<uint32_t> str_map(s.strings.size(), kUnmapped);
  auto str = [&](StrId id) -> uint32_t {
    if (str_map[id] == kUnmapped) str_map[id] = w.string(s.strings.get(id));
    return str_map[id];
  };
  std::vector<uint32_t> frame_map(s.stacks.frameCount(), kUnmapped);
  std::vector<uint32_t> stack_map(s.stacks.stackCount(), kUnmapped);
  stack_map[kNoStack] = trace::kTraceNoStack;
  if (stack_map.size() > kEmptyStack) stack_map[kEmptyStack] = trace::kTraceRootStack;
  auto stack = [&](StackId id) -> uint32_t {
    if (stack_map[id] != kUnmapped) return stack_map[id];
    auto frames = s.stacks.stack(id);
    uint32_t node = trace::kTraceRootStack;
    for (size_t i = frames.size(); i-- > 0;) {  // outermost first: the trie grows from the root
      FrameId f = frames[i];
      if (frame_map[f] == kUnmapped) {
        const Frame& fr = s.stacks.frame(f);
        frame_map[f] = w.frame(str(fr.filename), str(fr.name), fr.line);
      }
      node = w.stack(node, frame_map[f]);
    }
    return stack_map[id] = node;
  };

  std::vector<uint32_t> pool_map(s.pools.size());
  for (size_t i = 1; i < s.pools.size(); ++i)
    pool_map[i] = w.pool(s.pools[i].first, s.pools[i].second);

  for (size_t d = 0; d < s.traceCount(); ++d) {
    const DeviceEvents events(s, d);  // a deferred snapshot: one device at a time
    for (const Event& e : events.span()) {
      trace::TraceEvent t;
      t.addr = e.addr;
      t.size = e.size;
      t.stream = e.stream;
      t.time_us = e.time_us;
      t.device = static_cast<uint32_t>(d);
      t.stack = stack(e.stack);
      const EventNotes& notes = s.notesOf(e);
      t.compile_context = str(notes.compile_context);
      t.user_metadata = str(notes.user_metadata);
      t.action = static_cast<uint8_t>(e.action);
      t.action_name = trace::keptActionName(t.action, str(notes.action_name));
      t.pool = e.pool < pool_map.size() ? pool_map[e.pool] : 0;
      st = w.event(t);
      if (!st.ok()) return st;
    }
  }

  if (s.settings.present) {
    trace::TraceSettings ts;
    ts.max_split_size = s.settings.max_split_size;
    ts.garbage_collection_threshold = s.settings.garbage_collection_threshold;
    ts.expandable_segments = s.settings.expandable_segments;
    ts.has_roundup = s.settings.has_roundup;
    ts.has_graph_capture_key = s.traits.has_graph_capture_key;
    std::copy(std::begin(s.settings.roundup_power2_divisions),
              std::end(s.settings.roundup_power2_divisions), ts.roundup_power2_divisions);
    for (const OtherSetting& o : s.settings.other) {
      trace::TraceOtherSetting t;
      t.key = o.key;
      t.kind = static_cast<uint8_t>(o.kind);
      t.bits = static_cast<uint64_t>(o.i);
      if (o.kind == OtherSetting::Kind::Float) std::memcpy(&t.bits, &o.f, 8);
      t.text = o.s;
      ts.other.push_back(std::move(t));
    }
    w.setSettings(ts, s.settings.conf);
  }
  for (const Annotation& a : s.annotations) {
    w.addAnnotation(trace::TraceAnnotation{a.device, a.time_us, str(a.name), str(a.stage)});
  }
  // A final state the reader rebuilt from the events (the input had none) is not written as if it
  // were recorded: the output has none either, and its reader rebuilds the same one and says so
  // (Snapshot::final_state_rebuilt, incomplete), as for the input. Nor is it converted for nothing.
  if (!s.final_state_rebuilt) {
    std::vector<trace::TraceSegment> segs;
    std::vector<trace::TraceBlock> blocks;
    segs.reserve(s.segments.size());
    blocks.reserve(s.blocks.size());
    for (const Segment& g : s.segments) {
      trace::TraceSegment t;
      t.device = g.device;
      t.address = g.address;
      t.total_size = g.total_size;
      t.allocated_size = g.allocated_size;
      t.active_size = g.active_size;
      t.requested_size = g.requested_size;
      t.stream = g.stream;
      t.pool_a = g.pool_a;
      t.pool_b = g.pool_b;
      t.stack = stack(g.stack);
      std::string_view type = s.strings.get(g.segment_type);
      t.usual_type = type == (g.is_large ? "large" : "small");
      t.segment_type = t.usual_type ? 0 : str(g.segment_type);
      t.is_large = g.is_large;
      t.is_expandable = g.is_expandable;
      t.first_block = static_cast<uint32_t>(blocks.size());
      t.block_count = g.block_count;
      for (const Block& b : s.blocksOf(g)) {
        blocks.push_back(trace::TraceBlock{b.address, b.size, b.requested_size, stack(b.stack),
                                           static_cast<uint8_t>(b.state), b.has_requested_size});
      }
      segs.push_back(t);
    }
    w.setFinalState(std::move(segs), std::move(blocks));
  }
  // Empty device traces (PyTorch's device_traces [[]]) have no events to imply them.
  w.setDeviceTraceCount(s.traceCount());
  return w.close();
}

Status writeSnapshotTraceFile(const Snapshot& s, const std::string& path,
                              const TraceWriteOptions& options) {
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  auto sink = trace::FileSink::create(tmp);
  if (!sink) return sink.error();
  Status st = writeSnapshotTrace(s, **sink, options);
  if (st.ok()) st = (*sink)->closeFile();
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    st = Error{"cannot rename " + tmp + " to " + path, -1};
  }
  if (!st.ok()) std::remove(tmp.c_str());
  return st;
}

}  // namespace memforensics::format
