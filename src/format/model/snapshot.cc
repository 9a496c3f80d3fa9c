// snapshot.cc: interning tables and small helpers of the snapshot model.
#include "format/model/snapshot.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>

namespace memforensics::format {

namespace {
// 64-bit FNV-1a variant mixing 8 bytes at a time; good enough for interning, and fast.
inline uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}
uint64_t hashBytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = mix(h ^ w) * 0x100000001b3ULL;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  if (n != 0) std::memcpy(&w, p, n);  // p may be null for an empty view
  return mix(h ^ w);
}
constexpr size_t kChunk = 1 << 20;
}  // namespace

size_t StringTable::Hash::operator()(std::string_view s) const noexcept {
  return hashBytes(s.data(), s.size());
}

StringTable::StringTable() {
  intern("");
}
StringTable::StringTable(StringTable&& o) noexcept
    : chunks_(std::move(o.chunks_)),
      chunk_used_(o.chunk_used_),
      chunk_cap_(o.chunk_cap_),
      bytes_(o.bytes_),
      views_(std::move(o.views_)),
      index_(std::move(o.index_)) {
  o.chunks_.clear();
  o.chunk_used_ = o.chunk_cap_ = o.bytes_ = 0;
}
StringTable& StringTable::operator=(StringTable&& o) noexcept {
  if (this != &o) {
    for (char* c : chunks_) std::free(c);
    chunks_ = std::move(o.chunks_);
    chunk_used_ = o.chunk_used_;
    chunk_cap_ = o.chunk_cap_;
    bytes_ = o.bytes_;
    views_ = std::move(o.views_);
    index_ = std::move(o.index_);
    o.chunks_.clear();
    o.chunk_used_ = o.chunk_cap_ = o.bytes_ = 0;
  }
  return *this;
}
StringTable::~StringTable() {
  for (char* c : chunks_) std::free(c);
}

StrId StringTable::intern(std::string_view s) {
  auto it = index_.find(s);
  if (it != index_.end()) return it->second;
  if (chunk_cap_ - chunk_used_ < s.size() || chunks_.empty()) {
    size_t cap = std::max(kChunk, s.size());
    char* c = static_cast<char*>(std::malloc(cap == 0 ? 1 : cap));
    if (c == nullptr) std::abort();
    chunks_.push_back(c);
    chunk_used_ = 0;
    chunk_cap_ = cap;
  }
  char* dst = chunks_.back() + chunk_used_;
  if (!s.empty()) std::memcpy(dst, s.data(), s.size());
  chunk_used_ += s.size();
  bytes_ += s.size();
  std::string_view stored(dst, s.size());
  auto id = static_cast<StrId>(views_.size());
  views_.push_back(stored);
  index_.emplace(stored, id);
  return id;
}

size_t StackTable::FrameHash::operator()(const Frame& f) const noexcept {
  return mix((uint64_t{f.filename} << 32 | f.name) ^ mix(f.line + 0x51ed27));
}

StackTable::StackTable() {
  stacks_.emplace_back(0, 0);  // kNoStack
  stacks_.emplace_back(0, 0);  // kEmptyStack
  stack_next_.assign(2, 0);
}

FrameId StackTable::internFrame(const Frame& f) {
  auto [it, inserted] = frame_index_.try_emplace(f, static_cast<FrameId>(frames_.size()));
  if (inserted) frames_.push_back(f);
  return it->second;
}

StackId StackTable::internStack(std::span<const FrameId> frames) {
  if (frames.empty()) return kEmptyStack;
  uint64_t h = hashBytes(reinterpret_cast<const char*>(frames.data()), frames.size_bytes());
  StackId* head = stack_head_.find(h);
  for (StackId c = head ? *head : 0; c != 0; c = stack_next_[c]) {
    auto existing = stack(c);
    if (existing.size() == frames.size() &&
        std::equal(existing.begin(), existing.end(), frames.begin())) {
      return c;
    }
  }
  auto id = static_cast<StackId>(stacks_.size());
  stacks_.emplace_back(static_cast<uint32_t>(frame_ids_.size()),
                       static_cast<uint32_t>(frames.size()));
  frame_ids_.insert(frame_ids_.end(), frames.begin(), frames.end());
  stack_next_.push_back(head ? *head : 0);
  stack_head_.insert(h, id);
  return id;
}

EventNotesTable::EventNotesTable() : rows_(1), next_(1, 0) {}

uint32_t EventNotesTable::internNew(const EventNotes& n) {
  const uint64_t h =
      mix((uint64_t{n.compile_context} << 32 | n.user_metadata) ^ mix(n.action_name + 0x9e37));
  uint32_t* head = head_.find(h);
  for (uint32_t c = head ? *head : 0; c != 0; c = next_[c]) {
    if (rows_[c] == n) return last_ = c;
  }
  if (n == EventNotes{}) return last_ = 0;
  const auto id = static_cast<uint32_t>(rows_.size());
  rows_.push_back(n);
  next_.push_back(head ? *head : 0);
  head_.insert(h, id);
  return last_ = id;
}

uint32_t EventNotesTable::find(const EventNotes& n) const {
  if (rows_[last_] == n) return last_;
  if (n == EventNotes{}) return 0;
  const uint64_t h =
      mix((uint64_t{n.compile_context} << 32 | n.user_metadata) ^ mix(n.action_name + 0x9e37));
  const uint32_t* head = head_.find(h);
  for (uint32_t c = head ? *head : 0; c != 0; c = next_[c]) {
    if (rows_[c] == n) return c;
  }
  return kNone;
}

std::string_view actionName(Action a) {
  switch (a) {
    case Action::Alloc:
      return "alloc";
    case Action::FreeRequested:
      return "free_requested";
    case Action::FreeCompleted:
      return "free_completed";
    case Action::SegmentAlloc:
      return "segment_alloc";
    case Action::SegmentFree:
      return "segment_free";
    case Action::SegmentMap:
      return "segment_map";
    case Action::SegmentUnmap:
      return "segment_unmap";
    case Action::Snapshot:
      return "snapshot";
    case Action::Oom:
      return "oom";
    case Action::Annotate:
      return "annotate";
    case Action::Unknown:
      return "unknown";
  }
  return "unknown";
}

std::optional<Action> parseAction(std::string_view s) {
  for (int i = 0; i < kActionCount - 1; ++i) {
    if (actionName(static_cast<Action>(i)) == s) return static_cast<Action>(i);
  }
  return std::nullopt;
}

std::string_view blockStateName(BlockState s) {
  switch (s) {
    case BlockState::ActiveAllocated:
      return "active_allocated";
    case BlockState::ActivePendingFree:
      return "active_pending_free";
    case BlockState::Inactive:
      return "inactive";
    case BlockState::Unknown:
      return "unknown";
  }
  return "unknown";
}

std::string_view sourceFormatName(SourceFormat f) {
  switch (f) {
    case SourceFormat::Pickle:
      return "pickle";
    case SourceFormat::MemoryVizHtml:
      return "memory_viz_html";
    case SourceFormat::Json:
      return "json";
    case SourceFormat::NativeTrace:
      return "native_trace";
    case SourceFormat::ProfilerTrace:
      return "profiler_trace";
    case SourceFormat::MemoryTimeline:
      return "profiler_memory_timeline";
  }
  return "pickle";
}

namespace {
// "'a', 'b', ..." of the first NotKept::kNamedNotKept names; ", ..." when `total` says more exist.
std::string quotedNames(const std::vector<std::string>& names, size_t total) {
  std::string n;
  for (size_t i = 0; i < names.size() && i < NotKept::kNamedNotKept; ++i)
    n += (i ? ", '" : "'") + names[i] + "'";
  if (total > std::min(names.size(), NotKept::kNamedNotKept)) n += ", ...";
  return n;
}
}  // namespace

std::vector<std::string> notKeptNotes(const Snapshot& s) {
  std::vector<std::string> out;
  const NotKept& nk = s.not_kept;
  if (nk.legacy_history_entries > 0 || nk.legacy_history_firsts > 0) {
    std::string n = "legacy block history (PyTorch 1.13-2.0): ";
    if (nk.legacy_history_entries > 0)
      n += std::to_string(nk.legacy_history_entries) + " entries after each block's first";
    if (nk.legacy_history_firsts > 0) {
      if (nk.legacy_history_entries > 0) n += ", and ";
      n += std::to_string(nk.legacy_history_firsts) +
           " first entries' addr or real_size that differ from the block's address or "
           "requested_size (written as the block's)";
    }
    out.push_back(n + "; each block's first entry's frames are kept");
  }
  if (nk.settings_values > 0) {
    out.push_back(std::to_string(nk.settings_values) +
                  " allocator_settings values that are lists or dicts (" +
                  quotedNames(nk.settings_keys, nk.settings_values) + ")");
  }
  if (!s.ignored_keys.empty()) {
    out.push_back("the contents of top-level keys the reader does not understand (" +
                  quotedNames(s.ignored_keys, s.ignored_keys.size()) + ")");
  }
  if (s.traits.has_host_traces) {
    out.push_back("pinned host memory (2.14 host_segments, host_traces: " +
                  std::to_string(s.host_trace_events) + " events counted, not kept)");
  }
  return out;
}

std::string FormatTraits::era() const {
  // Newest evidence wins; each clue is a field that first appeared in that release.
  if (has_host_traces || has_annotate_action) return "2.14+";
  if (has_pool_id) return "2.12+";
  if (has_user_metadata) return "2.10+";
  if (has_graph_capture_key) return "2.9";
  if (has_compile_context) return "2.8";
  if (has_annotations_key) return "2.5-2.7";
  if (has_allocator_settings) return "2.3-2.4";
  if (has_time_us) return "2.2";
  if (has_block_address || has_segment_pool_id) return "2.1";
  if (has_device_traces) return "2.0";
  if (top_level_list) return has_block_history ? "1.13 (segment list)" : "segment list";
  return "unknown";
}

std::vector<int64_t> Snapshot::devices() const {
  std::set<int64_t> ds;
  for (const auto& s : segments) ds.insert(s.device);
  for (size_t d = 0; d < traceCount(); ++d) {
    if (traceSize(d) > 0) ds.insert(static_cast<int64_t>(d));
  }
  return {ds.begin(), ds.end()};
}

void Snapshot::refuseDeferredTrace() {
  throw std::logic_error(
      "Snapshot::trace() on a snapshot whose events are deferred: read them through DeviceEvents");
}

std::span<const Segment> Snapshot::segmentsOf(int64_t device) const {
  auto lo = std::lower_bound(segments.begin(), segments.end(), device,
                             [](const Segment& s, int64_t d) { return s.device < d; });
  auto hi = std::upper_bound(lo, segments.end(), device,
                             [](int64_t d, const Segment& s) { return d < s.device; });
  return {segments.data() + (lo - segments.begin()), static_cast<size_t>(hi - lo)};
}

void indexSnapshot(Snapshot& snap) {
  if (!std::is_sorted(snap.segments.begin(), snap.segments.end(),
                      [](const Segment& a, const Segment& b) { return a.device < b.device; })) {
    std::stable_sort(snap.segments.begin(), snap.segments.end(),
                     [](const Segment& a, const Segment& b) { return a.device < b.device; });
  }
  if (snap.deferred) return;  // its reader filled the OOMs as it read the records
  snap.ooms.clear();
  for (size_t d = 0; d < snap.traceCount(); ++d) {
    const std::span<const Event> ev = snap.trace(d);
    for (size_t i = 0; i < ev.size(); ++i) {
      if (ev[i].action == Action::Oom)
        snap.ooms.push_back({static_cast<int64_t>(d), static_cast<int64_t>(i), ev[i].time_us});
    }
  }
}

DeviceEvents::DeviceEvents(const Snapshot& snap, size_t d) {
  if (!snap.deferred) {
    view_ = snap.trace(d);
    return;
  }
  auto decoded = std::make_shared<std::vector<Event>>(snap.traceSize(d));
  if (!decoded->empty()) snap.deferred->decode(d, *decoded);
  view_ = *decoded;
  owned_ = std::move(decoded);
}

}  // namespace memforensics::format
