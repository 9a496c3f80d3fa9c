// snapshot_pickle.cc: see snapshot_pickle.h. One pass over the model, no per-event allocation: the
// memo slots of strings, frames, stacks and pools are vectors sized from the model's tables up
// front.
#include "format/pickle/snapshot_pickle.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "format/pickle/pickle_writer.h"

namespace memforensics::format {

namespace {

// Every fixed string the writer emits (dict keys and enumerated values). Each is memoized on first
// use like any other string, which is what Python's pickler does with the shared key objects.
enum Key : uint8_t {
  kSegments,
  kDeviceTraces,
  kAllocatorSettings,
  kExternalAnnotations,
  kDevice,
  kAddress,
  kTotalSize,
  kAllocatedSize,
  kActiveSize,
  kRequestedSize,
  kStream,
  kSegmentType,
  kSegmentPoolId,
  kIsExpandable,
  kFrames,
  kBlocks,
  kSize,
  kState,
  kHistory,
  kAddr,
  kRealSize,
  kAction,
  kDeviceFree,
  kTimeUs,
  kCompileContext,
  kUserMetadata,
  kPoolId,
  kFilename,
  kLine,
  kName,
  kStage,
  kConf,
  kMaxSplitSize,
  kGcThreshold,
  kExpandableSegments,
  kGraphCapture,
  kRoundup,
  kLarge,
  kSmall,
  kActiveAllocated,
  kActivePendingFree,
  kInactive,
  kKeyCount,
};
constexpr std::string_view kKeyText[kKeyCount] = {
    "segments",
    "device_traces",
    "allocator_settings",
    "external_annotations",
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
    "segment_type",
    "segment_pool_id",
    "is_expandable",
    "frames",
    "blocks",
    "size",
    "state",
    "history",
    "addr",
    "real_size",
    "action",
    "device_free",
    "time_us",
    "compile_context",
    "user_metadata",
    "pool_id",
    "filename",
    "line",
    "name",
    "stage",
    "PYTORCH_CUDA_ALLOC_CONF",
    "max_split_size",
    "garbage_collection_threshold",
    "expandable_segments",
    "graph_capture_record_stream_reuse",
    "roundup_power2_divisions",
    "large",
    "small",
    "active_allocated",
    "active_pending_free",
    "inactive",
};

// The settings written from AllocatorSettings' own fields are the model's keys (one list:
// kModelSettingsKeys).
static_assert(kKeyText[kConf] == kModelSettingsKeys[0] &&
              kKeyText[kMaxSplitSize] == kModelSettingsKeys[1] &&
              kKeyText[kGcThreshold] == kModelSettingsKeys[2] &&
              kKeyText[kExpandableSegments] == kModelSettingsKeys[3] &&
              kKeyText[kRoundup] == kModelSettingsKeys[4]);

constexpr uint32_t kUnset = ~uint32_t{0};
// Python's pickler closes an APPENDS batch every 1000 items; so do we (see
// PickleWriter::listBatch).
constexpr uint32_t kBatch = 1000;

// Counts the items of one list and starts a new APPENDS batch before every 1000th.
class ListBatcher {
 public:
  explicit ListBatcher(PickleWriter& w) : w_(w) {}
  void item() {
    if (n_ == kBatch) {
      w_.listBatch();
      n_ = 0;
    }
    ++n_;
  }

 private:
  PickleWriter& w_;
  uint32_t n_ = 0;
};

class Pickler {
 public:
  Pickler(const Snapshot& s, PickleWriter& w)
      : s_(s),
        t_(s.traits),
        w_(w),
        str_memo_(s.strings.size(), kUnset),
        frame_memo_(s.stacks.frameCount(), kUnset),
        stack_memo_(s.stacks.stackCount(), kUnset),
        pool_memo_(s.pools.size(), kUnset) {
    for (auto& m : key_memo_) m = kUnset;
    for (auto& m : action_memo_) m = kUnset;
  }

  void run() {
    if (t_.top_level_list) {
      segments();  // 1.13 / memory_snapshot(): the segment list is the whole file
      return;
    }
    w_.beginDict();
    key(kSegments);
    segments();
    if (t_.has_device_traces && ok()) {
      key(kDeviceTraces);
      traces();
    }
    if (t_.has_allocator_settings && ok()) {
      key(kAllocatorSettings);
      settings();
    }
    if (t_.has_annotations_key && ok()) {
      key(kExternalAnnotations);
      annotations();
    }
    w_.endDict();
  }

 private:
  // A failed sink stops the walk at the next segment or every few thousand events; what is written
  // after the failure is discarded by the writer anyway.
  bool ok() const { return w_.status().ok(); }

  // -- memoized scalars
  void memoStr(uint32_t& slot, std::string_view text) {
    if (slot != kUnset) {
      w_.get(slot);
      return;
    }
    w_.str(text);
    slot = w_.memoCount();
    w_.memoize();
  }
  void key(Key k) { memoStr(key_memo_[k], kKeyText[k]); }
  void str(StrId id) { memoStr(str_memo_[id], s_.strings.get(id)); }

  // A frame dict, stored once and shared by every stack that holds the frame.
  void frame(FrameId id) {
    uint32_t& slot = frame_memo_[id];
    if (slot != kUnset) {
      w_.get(slot);
      return;
    }
    const Frame& f = s_.stacks.frame(id);
    slot = w_.memoCount();
    w_.beginDict(/*memoize=*/true);
    key(kFilename);
    str(f.filename);
    key(kLine);
    w_.uinteger(f.line);  // kUnknownLine stays 2^64-1 (a 9-byte LONG1), as PyTorch wrote it
    key(kName);
    str(f.name);
    w_.endDict();
  }

  // A frames list (innermost first), stored once per StackId and shared like Python shares one list
  // between all events of the same traceback. kEmptyStack is the empty list.
  void stack(StackId id) {
    uint32_t& slot = stack_memo_[id];
    if (slot != kUnset) {
      w_.get(slot);
      return;
    }
    slot = w_.memoCount();
    w_.beginList(/*memoize=*/true);
    ListBatcher batch(w_);
    for (FrameId f : s_.stacks.stack(id)) {
      batch.item();
      frame(f);
    }
    w_.endList();
  }

  void pool(uint32_t index) {
    uint32_t& slot = pool_memo_[index];
    if (slot != kUnset) {
      w_.get(slot);
      return;
    }
    w_.uinteger(s_.pools[index].first);
    w_.uinteger(s_.pools[index].second);
    w_.tuple2();
    slot = w_.memoCount();
    w_.memoize();
  }

  void action(const Event& e) {
    if (const StrId name = s_.notesOf(e).action_name; name != kEmptyStr) {
      str(name);  // as written in the source, so unknown actions survive
    } else {
      memoStr(action_memo_[static_cast<size_t>(e.action)], actionName(e.action));
    }
  }

  // -- sections
  void segments() {
    // Legacy `history` marks the 1.13-2.0 era. Blocks without a stack get no history key (as in
    // real 2.0 files), unless no block has one: then every block gets [] so the era survives.
    bool history_everywhere = false;
    if (t_.has_block_history) {
      history_everywhere = true;
      for (const Block& b : s_.blocks) {
        if (b.stack != kNoStack || (b.has_requested_size && !legacyRequestedKey())) {
          history_everywhere = false;
          break;
        }
      }
    }
    w_.beginList();
    ListBatcher batch(w_);
    for (const Segment& seg : s_.segments) {
      if (!ok()) break;
      batch.item();
      segment(seg, history_everywhere);
    }
    w_.endList();
  }

  // In history mode the block's requested size goes in a `requested_size` key from 2.0 on; 1.13
  // (a bare segment list) had only history[0].real_size.
  bool legacyRequestedKey() const { return !t_.top_level_list; }

  void segment(const Segment& seg, bool history_everywhere) {
    w_.beginDict();
    key(kDevice);
    w_.integer(seg.device);
    key(kAddress);
    w_.uinteger(seg.address);
    key(kTotalSize);
    w_.uinteger(seg.total_size);
    key(kAllocatedSize);
    w_.uinteger(seg.allocated_size);
    key(kActiveSize);
    w_.uinteger(seg.active_size);
    key(kRequestedSize);
    w_.uinteger(seg.requested_size);
    key(kStream);
    w_.integer(seg.stream);
    key(kSegmentType);
    if (seg.segment_type != kEmptyStr) {
      str(seg.segment_type);
    } else {
      key(seg.is_large ? kLarge : kSmall);
    }
    if (t_.has_segment_pool_id) {
      key(kSegmentPoolId);
      w_.uinteger(seg.pool_a);
      w_.uinteger(seg.pool_b);
      w_.tuple2();
    }
    if (t_.has_segment_pool_id || seg.is_expandable) {  // both arrived in 2.1
      key(kIsExpandable);
      w_.boolean(seg.is_expandable);
    }
    if (seg.stack != kNoStack) {
      key(kFrames);
      stack(seg.stack);
    }
    key(kBlocks);
    w_.beginList();
    ListBatcher batch(w_);
    for (const Block& b : s_.blocksOf(seg)) {
      batch.item();
      block(b, history_everywhere);
    }
    w_.endList();
    w_.endDict();
  }

  void block(const Block& b, bool history_everywhere) {
    w_.beginDict();
    if (t_.has_block_address) {
      key(kAddress);
      w_.uinteger(b.address);
    }
    key(kSize);
    w_.uinteger(b.size);
    bool requested_key = b.has_requested_size && (!t_.has_block_history || legacyRequestedKey());
    if (requested_key) {
      key(kRequestedSize);
      w_.uinteger(b.requested_size);
    }
    if (b.state != BlockState::Unknown) {
      key(kState);
      key(b.state == BlockState::ActiveAllocated     ? kActiveAllocated
          : b.state == BlockState::ActivePendingFree ? kActivePendingFree
                                                     : kInactive);
    }
    if (t_.has_block_history) {
      // history[0] is what the reader takes the stack (and, without the key, the requested size)
      // from; later entries are not in the model.
      bool carry_size = b.has_requested_size && !requested_key;
      if (b.stack != kNoStack || carry_size) {
        key(kHistory);
        w_.beginList();
        w_.beginDict();
        key(kAddr);
        w_.uinteger(b.address);
        key(kRealSize);
        w_.uinteger(b.requested_size);
        if (b.stack != kNoStack) {
          key(kFrames);
          stack(b.stack);
        }
        w_.endDict();
        w_.endList();
      } else if (history_everywhere) {
        key(kHistory);
        w_.beginList();
        w_.endList();
      }
    } else if (b.stack != kNoStack) {
      key(kFrames);
      stack(b.stack);
    }
    w_.endDict();
  }

  void traces() {
    w_.beginList();
    ListBatcher devices(w_);
    for (size_t d = 0; d < s_.traceCount(); ++d) {
      devices.item();
      w_.beginList();
      ListBatcher batch(w_);
      size_t n = 0;
      const DeviceEvents events(s_, d);  // a deferred snapshot: one device at a time
      for (const Event& e : events.span()) {
        if ((++n & 4095) == 0 && !ok()) break;
        batch.item();
        event(e);
      }
      w_.endList();
    }
    w_.endList();
  }

  // Key order as torch's Module.cpp writes it.
  void event(const Event& e) {
    w_.beginDict();
    key(kAction);
    action(e);
    key(e.action == Action::Oom ? kDeviceFree : kAddr);  // the model keeps device_free in addr
    w_.uinteger(e.addr);
    key(kSize);
    w_.uinteger(e.size);
    key(kStream);
    w_.integer(e.stream);
    if (t_.has_time_us && e.time_us != -1) {  // -1: this entry had none
      key(kTimeUs);
      w_.integer(e.time_us);
    }
    if (t_.has_compile_context) {
      key(kCompileContext);
      str(s_.notesOf(e).compile_context);
    }
    if (t_.has_user_metadata) {
      key(kUserMetadata);
      str(s_.notesOf(e).user_metadata);
    }
    if (t_.has_pool_id && e.pool != 0) {  // pool 0: this entry had no pool_id
      key(kPoolId);
      pool(e.pool);
    }
    if (e.stack != kNoStack) {  // absent key = no stack recorded; kEmptyStack = []
      key(kFrames);
      stack(e.stack);
    }
    w_.endDict();
  }

  void settings() {
    const AllocatorSettings& st = s_.settings;
    w_.beginDict();
    key(kConf);
    w_.str(st.conf);
    key(kMaxSplitSize);
    w_.integer(st.max_split_size);
    key(kGcThreshold);
    w_.floating(st.garbage_collection_threshold);
    key(kExpandableSegments);
    w_.boolean(st.expandable_segments);
    bool graph_capture_written = false;
    std::vector<std::string_view> written;
    for (const OtherSetting& o : st.other) {  // keys the model does not read, as they were
      // Each key once (a hostile native trace may name a key twice, or one written above).
      if (isModelSettingsKey(o.key) ||
          std::find(written.begin(), written.end(), o.key) != written.end()) {
        continue;
      }
      written.push_back(o.key);
      graph_capture_written |= o.key == kKeyText[kGraphCapture];
      w_.str(o.key);
      switch (o.kind) {
        case OtherSetting::Kind::None:
          w_.none();
          break;
        case OtherSetting::Kind::Bool:
          w_.boolean(o.i != 0);
          break;
        case OtherSetting::Kind::Int:
          w_.integer(o.i);
          break;
        case OtherSetting::Kind::UInt:
          w_.uinteger(static_cast<uint64_t>(o.i));
          break;
        case OtherSetting::Kind::Float:
          w_.floating(o.f);
          break;
        case OtherSetting::Kind::Str:
          w_.str(o.s);
          break;
      }
    }
    if (t_.has_graph_capture_key && !graph_capture_written) {
      key(kGraphCapture);
      w_.boolean(false);  // a trace written before values were kept: PyTorch's default
    }
    if (st.has_roundup) {
      // All 16 intervals, as PyTorch writes them (zeros included): keys are MiB, "1" to "32768".
      key(kRoundup);
      w_.beginDict();
      for (int k = 0; k < 16; ++k) {
        char mib[8];
        int n = std::snprintf(mib, sizeof mib, "%u", 1u << k);
        w_.str(std::string_view(mib, static_cast<size_t>(n)));
        w_.integer(st.roundup_power2_divisions[k]);
      }
      w_.endDict();
    }
    w_.endDict();
  }

  void annotations() {
    w_.beginList();
    ListBatcher batch(w_);
    for (const Annotation& a : s_.annotations) {
      batch.item();
      w_.beginDict();
      key(kStage);
      str(a.stage);
      key(kName);
      str(a.name);
      if (a.device != -1) {  // -1: absent in the source
        key(kDevice);
        w_.integer(a.device);
      }
      if (a.time_us != -1) {
        key(kTimeUs);
        w_.integer(a.time_us);
      }
      w_.endDict();
    }
    w_.endList();
  }

  const Snapshot& s_;
  const FormatTraits& t_;
  PickleWriter& w_;
  std::vector<uint32_t> str_memo_;    // StrId -> memo index
  std::vector<uint32_t> frame_memo_;  // FrameId -> memo index of the frame dict
  std::vector<uint32_t> stack_memo_;  // StackId -> memo index of the frames list
  std::vector<uint32_t> pool_memo_;   // index into Snapshot::pools -> memo index of the tuple
  uint32_t key_memo_[kKeyCount];
  uint32_t action_memo_[kActionCount];
};

}  // namespace

Status writeSnapshotPickle(const Snapshot& s, const ByteSinkFn& sink) {
  PickleWriter w(4, sink);
  Pickler p(s, w);
  p.run();
  return w.finishStream();
}

std::vector<uint8_t> snapshotToPickle(const Snapshot& s) {
  PickleWriter w(4);
  Pickler p(s, w);
  p.run();
  return w.finish();
}

}  // namespace memforensics::format
