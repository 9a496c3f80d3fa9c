// fuzz_pipeline.cc: every command's code path on well-typed random snapshots (structure-aware).
//
// The parser fuzzers (fuzz_pickle, fuzz_trace) spend nearly all their time on inputs the readers
// refuse; what loads is mostly a copy of a seed. This target skips the parsers: it reads the input
// bytes as a program (FuzzedDataProvider) that builds a format::Snapshot directly in memory, with
// everything a reader can hand to the rest of the tool:
//   * a few devices, some with empty traces, ordinals up to 65536 (what the pickle reader accepts);
//   * segments that are small or large, expandable or not, in private pools, on several streams,
//     overlapping or apart, at addresses near 0 and near 2^64, with blocks that tile them (or not);
//   * per device a trace simulated against those segments, so that most frees match an earlier
//     allocation and most allocations lie inside a segment, with wild events mixed in: every
//     action, sizes 0, huge and near 2^63, random addresses, streams, pools, stacks and times;
//   * a small interned stack table whose frame names hold control characters and invalid UTF-8;
//   * a final segment state either derived from the simulation (what a real file looks like) or
//     random (what a hostile file looks like).
// Then it runs what each command runs, as src/cli does it, into a null stream:
//   analyze (text, JSON, call-graph frames), dump --stacks, blocks at the peak, the first OOM, a
//   random event index and a random time (text and JSON), timeline (text, CSV, JSON), report (the
//   report data and the HTML page), convert to Perfetto and to folded stacks, and convert to native
//   and to pickle in memory and read back. The conversions check that what was written reads back
//   with the same events, devices and segments; a mismatch is a finding (__builtin_trap), like a
//   crash or a sanitizer report.
// One input in eight instead writes text that a reader reads (generate_text.h), then runs the same
// commands on what `load` makes of it: a torch.profiler Kineto trace or a memory timeline (op
// chains that touch, op stacks hundreds deep, runs of identical rows, hostile numbers). One in
// eight writes `ranks --json` shards and merges them as `ranks --merge` does; what the merge writes
// must read back as the same rows.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/session/blocks.h"
#include "analysis/session/timeline.h"
#include "cli/at_option.h"
#include "format/load/load.h"
#include "format/load/snapshot_trace.h"
#include "format/model/dump.h"
#include "format/model/snapshot.h"
#include "format/pickle/snapshot_pickle.h"
#include "format/trace/trace_writer.h"
#include "generate_text.h"
#include "null_stream.h"
#include "report/export.h"
#include "report/html/report_data.h"
#include "report/render.h"
#include "report/render_blocks.h"
#include "report/render_compare.h"
#include "report/render_html.h"
#include "report/render_timeline.h"

namespace {

using namespace memforensics;
using format::Action;
using format::Block;
using format::BlockState;
using format::Event;
using format::EventNotes;
using format::Segment;
using format::Snapshot;
using format::StackId;
using format::StrId;

// Bounds of one generated snapshot: small enough for about a thousand runs a second through every
// command, large enough for downsampling (timeline buckets), several keyframes and block merging.
constexpr size_t kMaxFrames = 12;
constexpr size_t kMaxStacks = 10;
constexpr size_t kMaxSegments = 10;
constexpr size_t kMaxBlocksPerSegment = 8;
constexpr size_t kMaxEventsPerDevice = 160;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kTop = std::numeric_limits<uint64_t>::max();

// Frame names and strings that have broken renderers before or that the tool treats specially.
constexpr std::string_view kNames[] = {
    "",
    "forward",
    "\x1b]0;pwned\x07",
    "\x1b[2J\r",
    std::string_view("nul\0inside", 10),
    "\xff\xfe invalid",
    "\xc3",  // a truncated two-byte sequence
    "c10::cuda::CUDACachingAllocator::malloc",
    "at::native::empty_cuda",
    "torch/nn/modules/module.py",
    "a;b;c",
    "<script>&amp;</script>",
    "\"quote\\",
    "\xed\xa0\x80",  // an encoded surrogate
};

struct Gen {
  explicit Gen(FuzzedDataProvider& p) : p(p) {}
  FuzzedDataProvider& p;

  uint32_t upTo(uint32_t n) { return p.ConsumeIntegralInRange<uint32_t>(0, n); }
  bool chance(uint32_t in) { return upTo(in - 1) == 0; }  // 1 in `in`

  std::string text() {
    if (p.ConsumeBool()) return std::string(kNames[upTo(std::size(kNames) - 1)]);
    return p.ConsumeRandomLengthString(24);
  }

  uint64_t size() {
    switch (upTo(15)) {
      case 0:
        return 0;
      case 1:
        return p.ConsumeIntegralInRange<uint64_t>(1, 4096);
      case 2:
        return 2 * kMiB * p.ConsumeIntegralInRange<uint64_t>(1, 16);
      case 3:
        return 20 * kMiB;
      case 4:
        return p.ConsumeIntegral<uint64_t>();
      case 5:
        return (uint64_t{1} << 63) - upTo(4096);
      case 6:
        return (uint64_t{1} << 63) + upTo(4096);
      case 7:
        return kTop - upTo(4096);
      case 8:
        return uint64_t{1} << upTo(63);
      case 9:
        return kMiB + upTo(4096);
      default:
        return 512 * p.ConsumeIntegralInRange<uint64_t>(1, 4096);
    }
  }

  uint64_t addr() {
    switch (upTo(5)) {
      case 0:
        return upTo(4096);
      case 1:
        return kTop - upTo(1 << 22);
      case 2:
        return p.ConsumeIntegral<uint64_t>();
      default:  // what CUDA hands out: 2 MiB-aligned, in one region
        return 0x7f0000000000ull + 2 * kMiB * upTo(64) + 512 * upTo(8);
    }
  }

  int64_t stream() {
    switch (upTo(7)) {
      case 0:
        return 7;
      case 1:
        return 0x5555aaaa;
      case 2:
        return -1;
      case 3:
        return std::numeric_limits<int64_t>::min();
      case 4:
        return p.ConsumeIntegral<int64_t>();
      default:
        return 0;
    }
  }
};

uint64_t roundUp512(uint64_t n) {
  return n > kTop - 511 ? n : (n + 511) / 512 * 512;
}

struct LiveBlock {
  uint64_t addr, size, block;
  int64_t stream;
  uint32_t pool;
  StackId stack;
};
struct SimSegment {
  uint64_t addr, size;
  uint64_t cursor = 0;  // bump allocation inside the segment
  int64_t stream = 0;
  bool expandable = false, is_large = true;
  uint64_t pool_a = 0, pool_b = 0;
  StackId stack = format::kNoStack;
};

// One device's trace, simulated against its segments; the state left at the end (segments still
// mapped, blocks still live or pending) is what a consistent final segment state holds.
struct DeviceSim {
  std::vector<SimSegment> segs;
  std::vector<LiveBlock> live, pending;
};

class Builder {
 public:
  Builder(FuzzedDataProvider& p, Snapshot& s) : g_(p), p_(p), s_(s) {}

  void build() {
    traits();
    stacks();
    const uint32_t pools = g_.upTo(3);
    for (uint32_t i = 0; i < pools; ++i)
      s_.pools.emplace_back(g_.upTo(3), p_.ConsumeIntegral<uint64_t>());
    size_t traces = 0;
    switch (g_.upTo(7)) {
      case 0:
        traces = 0;
        break;
      case 1:
        traces = 17;
        break;
      case 2:
        traces = g_.chance(32) ? 65537 : 70;
        break;  // 65537: device 65536 has a trace
      default:
        traces = 1 + g_.upTo(3);
        break;
    }
    sims_.resize(std::min<size_t>(traces, 8));
    const bool consistent = p_.ConsumeBool();
    // Segments present before the trace starts, per simulated device.
    const uint32_t nseg = g_.upTo(kMaxSegments);
    std::vector<SimSegment> wild;
    std::vector<int64_t> wild_device;
    for (uint32_t i = 0; i < nseg; ++i) {
      SimSegment sg = segment();
      int64_t dev = device(traces);
      if (dev >= 0 && static_cast<size_t>(dev) < sims_.size()) {
        sims_[dev].segs.push_back(sg);
      } else {
        wild.push_back(sg);
        wild_device.push_back(dev < 0 ? 0 : dev);
      }
    }
    // Segments the final state never had (consistent mode), to be re-added from the simulation.
    s_.trace_begin.assign(1, 0);
    for (size_t d = 0; d < traces; ++d) {
      if (d < sims_.size() && p_.remaining_bytes() > 0) trace(d);
      s_.trace_begin.push_back(s_.events.size());
    }
    for (size_t d = 0; d < sims_.size(); ++d) {
      for (const SimSegment& sg : sims_[d].segs) {
        if (consistent)
          finalSegment(static_cast<int64_t>(d), sg, &sims_[d]);
        else
          finalSegment(static_cast<int64_t>(d), sg, nullptr);
      }
    }
    for (size_t i = 0; i < wild.size(); ++i) finalSegment(wild_device[i], wild[i], nullptr);
    if (p_.ConsumeBool()) {
      std::stable_sort(s_.segments.begin(), s_.segments.end(),
                       [](const Segment& a, const Segment& b) {
                         return a.device != b.device ? a.device < b.device : a.address < b.address;
                       });
    }
    annotations(traces);
    if (s_.traits.has_allocator_settings) {
      s_.settings.present = true;
      s_.settings.expandable_segments = p_.ConsumeBool();
      s_.settings.max_split_size = p_.ConsumeBool() ? -1 : static_cast<int64_t>(g_.size() >> 1);
      s_.settings.conf = g_.text();
    }
    s_.input_bytes = p_.ConsumeIntegral<uint32_t>();
    format::indexSnapshot(s_);  // as every reader does: segments by device, the OOM index
  }

 private:
  void traits() {
    auto& t = s_.traits;
    t.has_device_traces = true;
    t.has_block_address = true;
    t.has_segment_pool_id = p_.ConsumeBool();
    t.has_time_us = p_.ConsumeBool() || p_.ConsumeBool();
    t.has_allocator_settings = p_.ConsumeBool();
    t.has_annotations_key = p_.ConsumeBool();
    t.has_compile_context = p_.ConsumeBool();
    t.has_user_metadata = p_.ConsumeBool();
    t.has_pool_id = p_.ConsumeBool();
    t.has_block_history = g_.chance(8);
    s_.source = static_cast<format::SourceFormat>(g_.upTo(3));
    s_.pickle_protocol = static_cast<int>(g_.upTo(5));
  }

  StrId str() { return s_.strings.intern(g_.text()); }

  void stacks() {
    std::vector<format::FrameId> frames;
    const uint32_t nframes = g_.upTo(kMaxFrames);
    for (uint32_t i = 0; i < nframes; ++i) {
      format::Frame f;
      f.filename = g_.chance(3) ? s_.strings.intern("train.py") : str();
      f.name = str();
      f.line = g_.chance(4) ? format::kUnknownLine : g_.upTo(1000);
      frames.push_back(s_.stacks.internFrame(f));
    }
    stack_ids_ = {format::kNoStack, format::kEmptyStack};
    const uint32_t nstacks = frames.empty() ? 0 : g_.upTo(kMaxStacks);
    for (uint32_t i = 0; i < nstacks; ++i) {
      std::vector<format::FrameId> st;
      const uint32_t depth = 1 + g_.upTo(6);
      for (uint32_t k = 0; k < depth; ++k) st.push_back(frames[g_.upTo(frames.size() - 1)]);
      stack_ids_.push_back(s_.stacks.internStack(st));
    }
    strings_ = {format::kEmptyStr};
    for (uint32_t i = g_.upTo(3); i > 0; --i) strings_.push_back(str());
  }

  StackId stack() { return stack_ids_[g_.upTo(stack_ids_.size() - 1)]; }
  StrId someString() { return strings_[g_.upTo(strings_.size() - 1)]; }
  uint32_t pool() { return g_.upTo(s_.pools.size() - 1); }

  int64_t device(size_t traces) {
    switch (g_.upTo(7)) {
      case 0:
        return 65536;
      case 1:
        return 65535;
      case 2:
        return traces > 0 ? static_cast<int64_t>(traces - 1) : 0;
      default:
        return g_.upTo(3);
    }
  }

  SimSegment segment() {
    SimSegment sg;
    if (!prev_seg_.empty() && g_.chance(4)) {  // overlapping a previous one, or right behind it
      const SimSegment& o = prev_seg_[g_.upTo(prev_seg_.size() - 1)];
      sg.addr = p_.ConsumeBool() ? o.addr + o.size : o.addr + 512 * g_.upTo(8);
    } else {
      sg.addr = g_.addr();
    }
    switch (g_.upTo(5)) {
      case 0:
        sg.size = g_.size();
        break;
      case 1:
        sg.size = 20 * kMiB;
        break;
      case 2:
        sg.size = 2 * kMiB * (1 + g_.upTo(15));
        break;
      default:
        sg.size = 2 * kMiB;
        break;
    }
    sg.is_large = sg.size > 2 * kMiB || p_.ConsumeBool();
    sg.expandable = g_.chance(3);
    sg.stream = g_.stream();
    if (g_.chance(4)) {
      sg.pool_a = g_.upTo(3);
      sg.pool_b = p_.ConsumeIntegral<uint64_t>();
    }
    sg.stack = stack();
    prev_seg_.push_back(sg);
    return sg;
  }

  // -- the trace of device d, simulated against sims_[d]
  Event base(Action a, DeviceSim& sim) {
    Event e;
    e.action = a;
    e.stream = sim.segs.empty() || g_.chance(4) ? g_.stream()
                                                : sim.segs[g_.upTo(sim.segs.size() - 1)].stream;
    e.stack = stack();
    e.pool = s_.traits.has_pool_id ? pool() : 0;
    EventNotes notes;
    if (s_.traits.has_compile_context) notes.compile_context = someString();
    if (s_.traits.has_user_metadata) notes.user_metadata = someString();
    e.notes = s_.event_notes.intern(notes);
    if (s_.traits.has_time_us) {
      switch (g_.upTo(15)) {
        case 0:
          e.time_us = -1;
          break;
        case 1:
          e.time_us = clock_ - static_cast<int64_t>(g_.upTo(1000000));
          break;  // regression
        case 2:
          e.time_us = p_.ConsumeIntegral<int64_t>();
          break;
        case 3:
          e.time_us = std::numeric_limits<int64_t>::max();
          break;
        default:
          e.time_us = clock_ += g_.upTo(5000);
          break;
      }
    }
    return e;
  }

  void trace(size_t d) {
    DeviceSim& sim = sims_[d];
    clock_ = g_.chance(4) ? 0 : 1700000000000000 + g_.upTo(1000000);
    const uint32_t n = g_.upTo(kMaxEventsPerDevice);
    const size_t first = s_.events.size();
    for (uint32_t i = 0;
         i < n && p_.remaining_bytes() > 0 && s_.events.size() - first < kMaxEventsPerDevice; ++i) {
      const uint32_t op = g_.upTo(32);
      if (op < 10)
        alloc(sim);
      else if (op < 15)
        freeRequested(sim);
      else if (op < 20)
        freeCompleted(sim);
      else if (op < 22)
        segmentAlloc(sim);
      else if (op < 24)
        segmentFree(sim);
      else if (op < 26)
        mapOrUnmap(sim, Action::SegmentMap);
      else if (op < 28)
        mapOrUnmap(sim, Action::SegmentUnmap);
      else if (op < 29)
        oom(sim);
      else if (op < 30)
        push(base(Action::Snapshot, sim));
      else if (op < 32)
        other(sim);
      else
        iterations(sim, first);
    }
  }

  void push(const Event& e) { s_.events.push_back(e); }

  void alloc(DeviceSim& sim, std::optional<uint64_t> size = {}, std::optional<StackId> stack = {}) {
    Event e = base(Action::Alloc, sim);
    e.size = size ? *size : g_.chance(3) ? g_.size() : 512 * (1 + g_.upTo(4096));
    if (stack) e.stack = *stack;
    const uint64_t block = roundUp512(e.size);
    bool placed = false;
    if (!sim.segs.empty() && !g_.chance(6)) {
      SimSegment& sg = sim.segs[g_.upTo(sim.segs.size() - 1)];
      if (sg.cursor <= sg.size && block <= sg.size - sg.cursor) {
        e.addr = sg.addr + sg.cursor;  // may wrap past 2^64 for a segment near the top
        sg.cursor += block;
        e.stream = sg.stream;
        placed = true;
      }
    }
    if (!placed)
      e.addr = g_.chance(3) && !freed_.empty() ? freed_[g_.upTo(freed_.size() - 1)] : g_.addr();
    sim.live.push_back(LiveBlock{e.addr, e.size, block, e.stream, e.pool, e.stack});
    push(e);
  }

  // A training loop: the same allocations (sizes and stacks) made and freed `reps` times, with one
  // of them kept every iteration when `leak`: the shapes the step and leak detectors look for.
  // Frees at the top of a segment give the space back, so iterations reuse addresses as the
  // caching allocator does.
  void iterations(DeviceSim& sim, size_t first) {
    const uint32_t k = 1 + g_.upTo(4), reps = 2 + g_.upTo(6);
    const bool leak = g_.chance(3);
    std::vector<std::pair<uint64_t, StackId>> shape;
    for (uint32_t i = 0; i < k; ++i) shape.emplace_back(512 * (1 + g_.upTo(4096)), stack());
    for (uint32_t r = 0; r < reps && s_.events.size() - first < kMaxEventsPerDevice; ++r) {
      const size_t before = sim.live.size();
      for (const auto& [size, st] : shape) alloc(sim, size, st);
      for (size_t i = sim.live.size(); i-- > before + (leak ? 1 : 0);) {
        LiveBlock b = take(sim.live, i);
        for (Action a : {Action::FreeRequested, Action::FreeCompleted}) {
          Event e = base(a, sim);
          e.addr = b.addr;
          e.size = b.size;
          e.stream = b.stream;
          e.pool = b.pool;
          e.stack = b.stack;
          push(e);
        }
        for (SimSegment& sg : sim.segs) {
          if (sg.cursor >= b.block && b.addr == sg.addr + (sg.cursor - b.block))
            sg.cursor -= b.block;
        }
        freed_.push_back(b.addr);
      }
    }
  }

  // Takes a random element of v (the caller checks it is not empty).
  static LiveBlock take(std::vector<LiveBlock>& v, size_t i) {
    LiveBlock b = v[i];
    v.erase(v.begin() + static_cast<ptrdiff_t>(i));
    return b;
  }

  void freeRequested(DeviceSim& sim) {
    Event e = base(Action::FreeRequested, sim);
    if (!sim.live.empty() && !g_.chance(8)) {
      LiveBlock b = take(sim.live, g_.upTo(sim.live.size() - 1));
      e.addr = b.addr;
      e.size = g_.chance(10) ? g_.size() : b.size;
      e.stream = b.stream;
      e.pool = b.pool;
      sim.pending.push_back(b);
    } else {
      e.addr = g_.addr();
      e.size = g_.size();
    }
    push(e);
  }

  void freeCompleted(DeviceSim& sim) {
    Event e = base(Action::FreeCompleted, sim);
    std::vector<LiveBlock>& from = !sim.pending.empty() && !g_.chance(5) ? sim.pending : sim.live;
    if (!from.empty() && !g_.chance(8)) {
      LiveBlock b = take(from, g_.upTo(from.size() - 1));
      e.addr = b.addr;
      e.size = g_.chance(10) ? g_.size() : b.size;
      e.stream = b.stream;
      e.pool = b.pool;
      freed_.push_back(b.addr);
    } else {
      e.addr = g_.addr();
      e.size = g_.size();
    }
    push(e);
  }

  void segmentAlloc(DeviceSim& sim) {
    Event e = base(Action::SegmentAlloc, sim);
    SimSegment sg = segment();
    e.addr = sg.addr;
    e.size = sg.size;
    e.stream = sg.stream;
    if (sim.segs.size() < kMaxSegments) sim.segs.push_back(sg);
    push(e);
  }

  void segmentFree(DeviceSim& sim) {
    Event e = base(Action::SegmentFree, sim);
    if (!sim.segs.empty() && !g_.chance(6)) {
      const size_t i = g_.upTo(sim.segs.size() - 1);
      e.addr = sim.segs[i].addr;
      e.size = sim.segs[i].size;
      e.stream = sim.segs[i].stream;
      sim.segs.erase(sim.segs.begin() + static_cast<ptrdiff_t>(i));
    } else {
      e.addr = g_.addr();
      e.size = g_.size();
    }
    push(e);
  }

  void mapOrUnmap(DeviceSim& sim, Action a) {
    Event e = base(a, sim);
    switch (g_.upTo(5)) {
      case 0:  // the shapes that broke `blocks` before: nothing, and an unmap that wraps
        e.addr = g_.chance(2) ? 0 : kTop - g_.upTo(4096);
        e.size = g_.upTo(2) * g_.size();
        break;
      case 1:
        e.addr = g_.addr();
        e.size = g_.size();
        break;
      default:
        if (sim.segs.empty()) {
          e.addr = g_.addr();
          e.size = 2 * kMiB;
        } else {  // a 2 MiB page range of an (expandable) segment, or just past its end
          const SimSegment& sg = sim.segs[g_.upTo(sim.segs.size() - 1)];
          e.addr = sg.addr + 2 * kMiB * g_.upTo(10);
          e.size = 2 * kMiB * (1 + g_.upTo(4));
          e.stream = sg.stream;
        }
        break;
    }
    push(e);
  }

  void oom(DeviceSim& sim) {
    Event e = base(Action::Oom, sim);
    e.addr = g_.size();  // device_free
    e.size = g_.size();
    push(e);
  }

  void other(DeviceSim& sim) {
    Event e = base(g_.chance(2) ? Action::Annotate : Action::Unknown, sim);
    if (e.action == Action::Unknown) {
      EventNotes notes = s_.notesOf(e);
      notes.action_name = s_.strings.intern(g_.chance(2) ? "" : g_.text());
      e.notes = s_.event_notes.intern(notes);
    }
    e.addr = g_.addr();
    e.size = g_.size();
    push(e);
  }

  // -- the final segment state
  void finalSegment(int64_t device, const SimSegment& sg, const DeviceSim* sim) {
    Segment seg;
    seg.device = device;
    seg.address = sg.addr;
    seg.total_size = sg.size;
    seg.stream = sg.stream;
    seg.pool_a = sg.pool_a;
    seg.pool_b = sg.pool_b;
    seg.stack = sg.stack;
    seg.is_large = sg.is_large;
    seg.is_expandable = sg.expandable;
    switch (g_.upTo(7)) {
      case 0:
        seg.segment_type = s_.strings.intern(sg.is_large ? "large" : "small");
        break;
      case 1:
        seg.segment_type = str();
        break;
      default:
        break;
    }
    seg.first_block = static_cast<uint32_t>(s_.blocks.size());
    if (sim != nullptr) {
      consistentBlocks(sg, *sim);
    } else if (!g_.chance(6)) {
      randomBlocks(sg);
    }
    seg.block_count = static_cast<uint32_t>(s_.blocks.size() - seg.first_block);
    for (const Block& b : s_.blocksOf(seg)) {
      if (b.isActive()) {
        seg.allocated_size += b.size;
        seg.requested_size += b.requested_size;
      }
      if (b.state == BlockState::ActiveAllocated) seg.active_size += b.size;
    }
    if (g_.chance(8)) seg.allocated_size = g_.size();
    s_.segments.push_back(seg);
  }

  // The blocks the simulation left in sg, in address order, with the gaps between them free.
  void consistentBlocks(const SimSegment& sg, const DeviceSim& sim) {
    std::vector<std::pair<LiveBlock, BlockState>> in;
    auto inside = [&](const LiveBlock& b) {
      return b.addr - sg.addr < sg.size && b.block <= sg.size - (b.addr - sg.addr);
    };
    for (const auto& b : sim.live)
      if (inside(b)) in.emplace_back(b, BlockState::ActiveAllocated);
    for (const auto& b : sim.pending)
      if (inside(b)) in.emplace_back(b, BlockState::ActivePendingFree);
    std::sort(in.begin(), in.end(), [&](const auto& a, const auto& b) {
      return a.first.addr - sg.addr < b.first.addr - sg.addr;
    });
    uint64_t cursor = 0;
    auto gap = [&](uint64_t to) {
      if (to > cursor) {
        s_.blocks.push_back(
            Block{sg.addr + cursor, to - cursor, 0, format::kNoStack, BlockState::Inactive, false});
      }
    };
    for (const auto& [b, state] : in) {
      const uint64_t off = b.addr - sg.addr;
      if (off < cursor) continue;  // overlapping wild allocation: not in this segment's blocks
      gap(off);
      s_.blocks.push_back(Block{b.addr, b.block, b.size, b.stack, state, true});
      cursor = off + b.block;
    }
    gap(sg.size);
  }

  // Blocks that tile sg at random cut points (most of the time), or sizes that do not add up.
  void randomBlocks(const SimSegment& sg) {
    const uint32_t n = 1 + g_.upTo(kMaxBlocksPerSegment - 1);
    const bool tile = !g_.chance(5);
    uint64_t cursor = 0;
    for (uint32_t i = 0; i < n; ++i) {
      Block b;
      const uint64_t left = sg.size - cursor;
      if (tile) {
        const uint64_t r = p_.ConsumeIntegral<uint64_t>();
        b.size = i + 1 == n ? left : left == kTop ? r : (r % (left + 1)) / 512 * 512;
      } else {
        b.size = g_.size();
      }
      b.address = tile || p_.ConsumeBool() ? sg.addr + cursor : g_.addr();
      b.state = static_cast<BlockState>(g_.upTo(3));
      b.has_requested_size = b.isActive() || p_.ConsumeBool();
      if (b.has_requested_size)
        b.requested_size = g_.chance(6) ? g_.size() : b.size - b.size / (2 + g_.upTo(5));
      b.stack = b.isActive() ? stack() : format::kNoStack;
      cursor += b.size;
      s_.blocks.push_back(b);
      if (tile && cursor == sg.size) break;
    }
  }

  void annotations(size_t traces) {
    if (!s_.traits.has_annotations_key) return;
    const uint32_t n = g_.upTo(6);
    std::vector<StrId> names = {s_.strings.intern("step"), s_.strings.intern("forward")};
    names.push_back(str());
    const StrId start = s_.strings.intern("START"), end = s_.strings.intern("END");
    int64_t t = 1700000000000000;
    for (uint32_t i = 0; i < n; ++i) {
      format::Annotation a;
      a.device = g_.chance(3)
                     ? -1
                     : static_cast<int64_t>(g_.upTo(traces > 0 ? std::min<size_t>(traces, 4) : 1));
      a.time_us = g_.chance(6) ? -1 : (t += g_.upTo(100000));
      a.name = names[g_.upTo(names.size() - 1)];
      a.stage = g_.chance(8) ? str() : (p_.ConsumeBool() ? start : end);
      s_.annotations.push_back(a);
    }
  }

  Gen g_;
  FuzzedDataProvider& p_;
  Snapshot& s_;
  std::vector<DeviceSim> sims_;
  std::vector<SimSegment> prev_seg_;
  std::vector<StackId> stack_ids_;
  std::vector<StrId> strings_;
  std::vector<uint64_t> freed_;
  int64_t clock_ = 0;
};

// -- round-trip checks. Each failure has its own function so that the trap's stack names it.
[[noreturn]] __attribute__((noinline)) void writtenButRefused() {
  __builtin_trap();
}
[[noreturn]] __attribute__((noinline)) void eventsDiffer() {
  __builtin_trap();
}
[[noreturn]] __attribute__((noinline)) void emptyTraceDropped() {
  __builtin_trap();
}
[[noreturn]] __attribute__((noinline)) void segmentsDiffer() {
  __builtin_trap();
}

bool validUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
    if (n == 3 && c == 0xed && static_cast<unsigned char>(s[i + 1]) >= 0xa0)
      return false;  // surrogate
    i += n;
  }
  return true;
}

// Strings must survive byte for byte where the writer has no reason to change them (valid UTF-8:
// the pickle writer may escape or replace invalid sequences).
bool sameText(std::string_view a, std::string_view b) {
  return a == b || !validUtf8(a);
}

bool sameStack(const Snapshot& a, StackId sa, const Snapshot& b, StackId sb) {
  if ((sa == format::kNoStack) != (sb == format::kNoStack)) return false;
  auto fa = a.stacks.stack(sa), fb = b.stacks.stack(sb);
  if (fa.size() != fb.size()) return false;
  for (size_t i = 0; i < fa.size(); ++i) {
    const format::Frame &x = a.stacks.frame(fa[i]), &y = b.stacks.frame(fb[i]);
    if (x.line != y.line || !sameText(a.strings.get(x.name), b.strings.get(y.name)) ||
        !sameText(a.strings.get(x.filename), b.strings.get(y.filename))) {
      return false;
    }
  }
  return true;
}

// What the pickle form keeps of a snapshot depends on its traits (snapshot_pickle.h); the native
// form keeps everything.
void checkSame(const Snapshot& a, const Snapshot& b, bool native) {
  if (a.traceCount() != b.traceCount()) emptyTraceDropped();
  for (size_t d = 0; d < a.traceCount(); ++d) {
    auto ta = a.trace(d), tb = b.trace(d);
    if (ta.size() != tb.size()) eventsDiffer();
    for (size_t i = 0; i < ta.size(); ++i) {
      const Event &x = ta[i], &y = tb[i];
      if (x.action != y.action || x.addr != y.addr || x.size != y.size || x.stream != y.stream)
        eventsDiffer();
      if ((native || a.traits.has_time_us) && x.time_us >= -1 && x.time_us != y.time_us)
        eventsDiffer();
      if (!sameStack(a, x.stack, b, y.stack)) eventsDiffer();
      if ((native || a.traits.has_pool_id) && x.pool != 0 && a.pools[x.pool] != b.pools[y.pool])
        eventsDiffer();
      if ((native || a.traits.has_compile_context) &&
          !sameText(a.strings.get(a.notesOf(x).compile_context),
                    b.strings.get(b.notesOf(y).compile_context))) {
        eventsDiffer();
      }
    }
  }
  if (a.segments.size() != b.segments.size()) segmentsDiffer();
  for (size_t i = 0; i < a.segments.size(); ++i) {
    const Segment &x = a.segments[i], &y = b.segments[i];
    if (x.device != y.device || x.address != y.address || x.total_size != y.total_size ||
        x.stream != y.stream || x.block_count != y.block_count ||
        x.is_expandable != y.is_expandable) {
      segmentsDiffer();
    }
    auto bx = a.blocksOf(x), by = b.blocksOf(y);
    for (size_t k = 0; k < bx.size(); ++k) {
      if (bx[k].address != by[k].address || bx[k].size != by[k].size || bx[k].state != by[k].state)
        segmentsDiffer();
    }
  }
}

// convert to native in memory, read back, compare; then the same through a pickle.
void roundTrips(const Snapshot& gen, FuzzedDataProvider& p) {
  // The generated snapshot need not be one a reader would produce (a reader may refuse what it
  // holds), so the checks start from what the pickle reader makes of it: a snapshot that came out
  // of a reader, as every conversion's input does.
  std::vector<uint8_t> pickle = format::snapshotToPickle(gen);
  auto s1 = format::loadSnapshotBytes(pickle);
  if (!s1) return;
  checkSame(gen, *s1, /*native=*/false);

  format::TraceWriteOptions wo;
  wo.zstd_level = static_cast<int>(p.ConsumeIntegralInRange<uint32_t>(0, 3));
  const uint64_t every[] = {0, 1, 16, 1u << 18};
  wo.checkpoint_every = every[p.ConsumeIntegralInRange<size_t>(0, 3)];
  wo.chunk_bytes = 4096;  // the smallest the writer takes: several chunks per trace
  format::trace::VectorSink sink;
  if (format::writeSnapshotTrace(*s1, sink, wo).ok()) {
    auto s2 = format::loadSnapshotBytes(sink.data);
    if (!s2) writtenButRefused();
    checkSame(*s1, *s2, /*native=*/true);
    std::vector<uint8_t> again = format::snapshotToPickle(*s2);
    auto s3 = format::loadSnapshotBytes(again);
    if (!s3) writtenButRefused();
    checkSame(*s2, *s3, /*native=*/false);
  }
  std::vector<uint8_t> twice;  // streamed, as convert --to pickle writes it
  auto sinkTo = [&](std::span<const uint8_t> b) -> Status {
    twice.insert(twice.end(), b.begin(), b.end());
    return Status::Ok();
  };
  if (!format::writeSnapshotPickle(*s1, sinkTo).ok()) writtenButRefused();
  auto s4 = format::loadSnapshotBytes(twice);
  if (!s4) writtenButRefused();
  checkSame(*s1, *s4, /*native=*/false);
}

std::optional<int64_t> pickDevice(FuzzedDataProvider& p, const Snapshot& s) {
  if (p.ConsumeBool()) return std::nullopt;
  auto devs = s.devices();
  if (devs.empty() || p.ConsumeBool()) return p.ConsumeIntegralInRange<int64_t>(-1, 65537);
  return devs[p.ConsumeIntegralInRange<size_t>(0, devs.size() - 1)];
}

// FUZZ_PIPELINE_PICKLE=FILE: write the generated input to FILE (a snapshot as a pickle, a profiler
// trace or a shard as its text, shard k of several to FILE.k), to replay a finding with the
// command line (memforensics blocks FILE ..., ranks --merge FILE.0 FILE.1) or keep it where the
// unit tests load it.
void keepInput(std::span<const uint8_t> bytes, const std::string& suffix = "") {
  const char* path = std::getenv("FUZZ_PIPELINE_PICKLE");
  if (!path) return;
  if (FILE* f = std::fopen((path + suffix).c_str(), "wb")) {
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
}

std::span<const uint8_t> bytesOf(const std::string& text) {
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

[[noreturn]] __attribute__((noinline)) void shardWrittenButRefused() {
  __builtin_trap();
}
[[noreturn]] __attribute__((noinline)) void shardRowsDiffer() {
  __builtin_trap();
}

// ranks --merge SHARD...: each shard read as mergeShards (src/cli/cmd_ranks.cc) reads it, the rows
// merged, outliers marked and both renderings written. What `ranks --json` writes of the merged
// rows must read back as the same rows (the next level of a merge tree reads it).
void mergeRankShards(FuzzedDataProvider& p) {
  std::vector<std::string> shards = fuzz::generateRankShards(p);
  std::vector<analysis::RankRow> rows;
  for (size_t i = 0; i < shards.size(); ++i) {
    keepInput(bytesOf(shards[i]), "." + std::to_string(i));
    const std::string path = "shard" + std::to_string(i) + ".json";
    auto got = report::parseRanksJson(shards[i], path);
    if (!got) {
      rows.push_back(analysis::failedRankRow(path, got.error().describe()));
      continue;
    }
    for (auto& r : *got) rows.push_back(std::move(r));
  }
  analysis::RanksSummary summary = analysis::markOutliers(rows);
  fuzz::NullBuf nb;
  std::ostream out(&nb);
  report::renderRanksText(rows, summary, out);
  std::ostringstream js;
  report::renderRanksJson(rows, summary, js);
  auto back = report::parseRanksJson(js.str(), "merged.json");
  if (!back) shardWrittenButRefused();
  if (back->size() != rows.size()) shardRowsDiffer();
  for (size_t i = 0; i < rows.size(); ++i) {
    const analysis::RankRow &a = rows[i], &b = (*back)[i];
    if (a.path != b.path || a.error != b.error) shardRowsDiffer();
    if (!a.error.empty()) continue;
    if (a.device != b.device || a.peak_reserved != b.peak_reserved ||
        a.peak_requested != b.peak_requested || a.peak_allocated != b.peak_allocated ||
        a.ooms != b.ooms || a.high_findings != b.high_findings || a.lines.size() != b.lines.size())
      shardRowsDiffer();
    for (size_t k = 0; k < a.lines.size(); ++k) {
      if (a.lines[k].line != b.lines[k].line || a.lines[k].bytes != b.lines[k].bytes)
        shardRowsDiffer();
    }
  }
}

void commands(const Snapshot& s, FuzzedDataProvider& p);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  // What the bytes build: mostly a snapshot in memory; else the text of a torch.profiler trace or
  // memory timeline, read as `load` reads any input, or `ranks --json` shards to merge.
  switch (p.ConsumeIntegralInRange<uint32_t>(0, 7)) {
    case 5:
    case 6: {
      const std::string text =
          p.ConsumeBool() ? fuzz::generateKinetoTrace(p) : fuzz::generateMemoryTimeline(p);
      keepInput(bytesOf(text));
      auto snap = format::loadSnapshotBytes(bytesOf(text));
      if (snap) commands(*snap, p);
      return 0;
    }
    case 7:
      mergeRankShards(p);
      return 0;
    default:
      break;
  }
  Snapshot s;
  Builder(p, s).build();
  if (std::getenv("FUZZ_PIPELINE_PICKLE") != nullptr) {  // a pickle per run only when kept
    keepInput(format::snapshotToPickle(s));
  }
  commands(s, p);
  return 0;
}

namespace {

// What each command runs on a loaded snapshot, as src/cli runs it, into a null stream.
void commands(const Snapshot& s, FuzzedDataProvider& p) {
  fuzz::NullBuf nb;
  std::ostream out(&nb);

  // analyze [--json] [--device N] [--top N] [--top-frames N]
  analysis::AnalyzeOptions aopt;
  aopt.device = pickDevice(p, s);
  aopt.top = p.ConsumeIntegralInRange<size_t>(1, 20);
  aopt.top_frames = p.ConsumeIntegralInRange<size_t>(0, 10);
  analysis::AnalysisResult result = analysis::analyzeSnapshot(s, aopt);
  report::renderText(result, out);
  report::renderJson(result, out);

  // dump --stacks
  format::dumpSnapshot(s, out, format::DumpOptions{.stacks = true});

  // blocks --at peak|oom|EVENT|tTIME [--device N] [--json], the --at text parsed as the command
  // does
  {
    const int64_t n = static_cast<int64_t>(s.events.size());
    const std::string ats[] = {
        "peak",
        "oom",
        std::to_string(p.ConsumeIntegralInRange<int64_t>(-2, n + 1)),
        "t" + std::to_string(p.ConsumeBool() ? p.ConsumeIntegral<int64_t>()
                                             : 1700000000000000 + p.ConsumeIntegral<uint16_t>()),
        p.ConsumeRandomLengthString(12),
    };
    for (const auto& text : ats) {
      if (!s.has_segment_info) break;  // cmd_blocks.cc refuses profiler inputs before this
      auto at = cli::parseAtOption(text);
      if (!at) continue;
      auto r = analysis::computeBlocks(s, pickDevice(p, s), *at);
      if (!r) continue;
      report::renderBlocksText(*r, out);
      report::renderBlocksJson(*r, out);
    }
  }

  // timeline [--device N] [--csv|--json] [--max-points N]
  {
    analysis::TimelineOptions topt;
    topt.device = pickDevice(p, s);
    topt.max_points = p.ConsumeIntegralInRange<size_t>(1, 3000);
    topt.columns = p.ConsumeIntegralInRange<size_t>(1, 100);
    auto tl = analysis::computeTimeline(s, topt);
    report::renderTimelineText(tl, out);
    report::renderTimelineCsv(tl, out);
    report::renderTimelineJson(tl, out);
  }

  // report [--device N] [--max-points N] [--keyframes N] [--max-blocks N], as cmd_report.cc does
  {
    analysis::AnalyzeOptions ropt;
    ropt.device = pickDevice(p, s);
    ropt.top_frames = 10;
    analysis::AnalysisResult rr = analysis::analyzeSnapshot(s, ropt);
    analysis::ReportDataOptions dopt;
    dopt.device = ropt.device;
    dopt.max_points = p.ConsumeIntegralInRange<size_t>(16, 2000);
    dopt.even_keyframes = p.ConsumeIntegralInRange<size_t>(0, 12);
    dopt.max_blocks = p.ConsumeIntegralInRange<size_t>(1000, 400000);
    if (p.ConsumeBool()) {  // what the halving loop of cmd_report.cc ends at
      dopt.max_icicle_nodes = 100;
      dopt.max_stacks = 100;
      dopt.max_frames_per_stack = 8;
    }
    analysis::ReportData data = analysis::buildReportData(s, dopt);
    // Unbounded as cmd_report.cc's first attempts, or within a budget as its last one (which
    // drops sections until the page fits).
    std::vector<std::string> notes;
    const size_t budget = p.ConsumeBool() ? SIZE_MAX : p.ConsumeIntegralInRange<size_t>(0, 200000);
    out << report::renderHtmlWithin(rr, data, budget, &notes);
  }

  // convert --to perfetto / collapsed [--device N] [--value allocated] [--user-frames]
  {
    report::PerfettoOptions po;
    po.device = pickDevice(p, s);
    po.frames_per_oom = p.ConsumeIntegralInRange<size_t>(0, 16);
    po.peak_instants = p.ConsumeBool();
    (void)report::exportPerfetto(s, out, po);
    report::CollapsedOptions co;
    co.device = pickDevice(p, s);
    co.which =
        p.ConsumeBool() ? report::CollapsedValue::Allocated : report::CollapsedValue::Requested;
    co.user_frames_only = p.ConsumeBool();
    (void)report::exportCollapsed(s, out, co);
  }

  // convert --to native / pickle, read back
  roundTrips(s, p);
}

}  // namespace
