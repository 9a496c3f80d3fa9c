// recorder.cc: see recorder.h.
#include "capture/recorder.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "capture/torch_entry.h"
#include "common/allocator_constants.h"

namespace memforensics::capture {

using namespace format::trace;

namespace {

// FormatTraits of what a capture holds: device traces, block addresses, segment pool ids and
// event times, as a PyTorch 2.2+ snapshot does. A capture converted to a pickle then carries the
// same keys as PyTorch's own file.
constexpr uint64_t kCaptureTraits =
    traits::kDeviceTraces | traits::kBlockAddress | traits::kSegmentPoolId | traits::kTimeUs;

// Batches larger than this are written without waiting for the flush interval.
constexpr size_t kMaxPending = 1u << 16;

int64_t clockNs(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void sleepMs(int ms) {
  timespec ts{ms / 1000, static_cast<long>(ms % 1000) * 1'000'000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

}  // namespace

uint64_t monotonicTicks() {
  return static_cast<uint64_t>(clockNs(CLOCK_MONOTONIC));
}

struct Recorder::Channel {
  Channel(size_t capacity, uint16_t depth, bool contexts, bool texts)
      : ring(capacity),
        ctx(contexts ? ring.capacity() : 0),
        pcs(depth ? ring.capacity() * depth : 0),
        text(texts ? ring.capacity() : 0) {}
  SpscRing<CaptureRecord> ring;
  std::vector<std::shared_ptr<void>>
      ctx;                 // side slot per ring slot: stack context (with a resolver)
  std::vector<void*> pcs;  // side slots per ring slot: native_depth return addresses
  std::vector<std::shared_ptr<const RecordText>> text;  // side slot per ring slot (options.text)
};

Recorder::Recorder(std::string path, const RecorderOptions& options, RecorderHooks hooks)
    : path_(std::move(path)),
      options_(options),
      hooks_(std::move(hooks)),
      clock_(options.ns_per_tick_guess) {
  if (!options_.now_ticks) options_.now_ticks = &monotonicTicks;
  options_.devices = std::clamp<uint32_t>(options_.devices, 1, 1024);
  options_.native_depth = std::min<uint16_t>(options_.native_depth, 128);
}

Expected<std::unique_ptr<Recorder>> Recorder::create(const std::string& path,
                                                     const RecorderOptions& options,
                                                     RecorderHooks hooks) {
  std::unique_ptr<Recorder> r(new Recorder(path, options, std::move(hooks)));
  auto sink = FileSink::create(path);
  if (!sink) return sink.error();
  r->sink_ = std::move(*sink);
  WriterOptions wo;
  wo.zstd_level = r->options_.zstd_level;
  wo.chunk_bytes = r->options_.chunk_bytes;
  wo.checkpoint_every = r->options_.checkpoint_every;
  r->writer_ = std::make_unique<TraceWriter>(*r->sink_, wo);
  TraceMeta meta;
  meta.producer = r->options_.producer;
  meta.source_format = "capture";
  meta.traits = kCaptureTraits | r->options_.traits;
  Status s = r->writer_->begin(meta);
  if (!s.ok()) return s.error();
  for (uint32_t d = 0; d < r->options_.devices; ++d) {
    r->channels_.push_back(
        std::make_unique<Channel>(r->options_.ring_capacity, r->options_.native_depth,
                                  r->hooks_.resolver != nullptr, r->options_.text));
  }
  r->last_time_us_.assign(r->options_.devices, -1);
  if (::pipe2(r->wake_, O_NONBLOCK | O_CLOEXEC) != 0) {
    return Error{std::string("cannot create the capture's wake pipe: ") + std::strerror(errno), -1};
  }
  if (r->options_.native_depth > 0) {
    // The first backtrace() loads libgcc's unwinder (dlopen, malloc): do it here, not on the hot
    // path.
    void* warm[4];
    (void)::backtrace(warm, 4);
  }
  // The anchor of the tick -> time line, taken before any event can be recorded.
  r->clock_.addSample(r->options_.now_ticks(), r->realtimeNs());
  // The writer thread never runs a signal handler: a handler waits for the writer, so it must
  // run on another thread.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  try {
    r->thread_ = std::thread([p = r.get()] { p->writerLoop(); });
  } catch (const std::exception& e) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return Error{std::string("cannot start the capture writer thread: ") + e.what(), -1};
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return r;
}

Recorder::~Recorder() {
  (void)stop();
  if (wake_[0] >= 0) ::close(wake_[0]);
  if (wake_[1] >= 0) ::close(wake_[1]);
}

int64_t Recorder::realtimeNs() const {
  return clockNs(CLOCK_REALTIME);
}

// ---------------------------------------------------------------------------------------------
// Hot path

bool Recorder::record(const CaptureRecord& r) noexcept {
  if (r.device >= channels_.size()) {
    out_of_range_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  return channels_[r.device]->ring.tryPush([&](CaptureRecord& slot, size_t) {
    slot = r;
    slot.flags &= kProducerFlags;
    slot.npcs = 0;
  });
}

bool Recorder::record(const CaptureRecord& r, std::shared_ptr<void>&& context) noexcept {
  return record(r, std::move(context), nullptr);
}

bool Recorder::record(const CaptureRecord& r, std::shared_ptr<void>&& context,
                      std::shared_ptr<const RecordText>&& text) noexcept {
  if (r.device >= channels_.size()) {
    out_of_range_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  Channel& ch = *channels_[r.device];
  return ch.ring.tryPush([&](CaptureRecord& slot, size_t i) {
    slot = r;
    slot.flags &= kProducerFlags;
    slot.npcs = 0;
    // The side slots are empty here: the writer moved their last values out.
    if (context && !ch.ctx.empty()) {  // without a resolver a context could not be used
      slot.flags |= kHasContext;
      ch.ctx[i] = std::move(context);
    }
    putText(ch, slot, i, std::move(text));
  });
}

void Recorder::putText(Channel& ch, CaptureRecord& slot, size_t i,
                       std::shared_ptr<const RecordText>&& text) noexcept {
  if (text && !ch.text.empty()) {  // without options.text there is no side slot
    slot.flags |= kHasText;
    ch.text[i] = std::move(text);
  }
}

bool Recorder::recordNative(const CaptureRecord& r, int skip,
                            std::shared_ptr<const RecordText>&& text) noexcept {
  if (r.device >= channels_.size()) {
    out_of_range_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  Channel& ch = *channels_[r.device];
  const int depth = options_.native_depth;
  void* tmp[160];
  int n = 0, from = 0;
  if (depth > 0) {
    // Frame 0 is this function (backtrace is called from here, and this function is not inlined
    // into its callers: it lives in its own translation unit).
    n = ::backtrace(tmp, std::min(depth + skip + 1, 160));
    from = std::min(n, skip + 1);
  }
  const int keep = std::min(n - from, depth);
  return ch.ring.tryPush([&](CaptureRecord& slot, size_t i) {
    slot = r;
    slot.flags &= kProducerFlags;
    slot.npcs = 0;
    putText(ch, slot, i, std::move(text));
    if (keep <= 0) return;
    std::memcpy(&ch.pcs[i * static_cast<size_t>(depth)], tmp + from,
                sizeof(void*) * static_cast<size_t>(keep));
    slot.npcs = static_cast<uint16_t>(keep);
    slot.flags |= kHasPcs;
  });
}

// ---------------------------------------------------------------------------------------------
// Control

bool Recorder::flush(int timeout_ms) noexcept {
  if (finished_.load(std::memory_order_acquire)) return true;
  const uint64_t ticket = flush_req_.fetch_add(1, std::memory_order_acq_rel) + 1;
  char c = 'f';
  (void)!::write(wake_[1], &c, 1);  // full pipe: the writer is awake anyway
  for (int waited = 0; waited < timeout_ms; ++waited) {
    if (flush_done_.load(std::memory_order_acquire) >= ticket ||
        finished_.load(std::memory_order_acquire)) {
      return true;
    }
    sleepMs(1);
  }
  return false;
}

bool Recorder::flushFromSignal(int timeout_ms) noexcept {
  signal_flushes_.fetch_add(1, std::memory_order_acq_rel);
  const bool ok = flush(timeout_ms);
  signal_flushes_.fetch_sub(1, std::memory_order_acq_rel);
  return ok;
}

bool Recorder::finishFromSignal(int timeout_ms) noexcept {
  uint8_t none = 0;
  finish_req_.compare_exchange_strong(none, static_cast<uint8_t>(FinishMode::Signal) + 1);
  char c = 's';
  (void)!::write(wake_[1], &c, 1);
  for (int waited = 0; waited < timeout_ms; ++waited) {
    if (finished_.load(std::memory_order_acquire)) return true;
    sleepMs(1);
  }
  return false;
}

Status Recorder::stop(FinishMode mode) {
  if (stopped_) return stop_status_;
  stopped_ = true;
  uint8_t none = 0;
  finish_req_.compare_exchange_strong(none, static_cast<uint8_t>(mode) + 1);
  char c = 'x';
  (void)!::write(wake_[1], &c, 1);
  if (thread_.joinable()) thread_.join();
  stop_status_ = error_;
  return stop_status_;
}

RecorderStats Recorder::stats() const {
  RecorderStats s;
  for (const auto& ch : channels_) {
    s.recorded += ch->ring.pushed();
    s.dropped += ch->ring.dropped();
  }
  s.dropped += out_of_range_.load(std::memory_order_relaxed);
  s.written = written_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.flushes = flushes_.load(std::memory_order_relaxed);
  s.chunks = chunks_.load(std::memory_order_relaxed);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Writer thread

void Recorder::writerLoop() {
  const int64_t interval_ns = int64_t{options_.flush_interval_ms} * 1'000'000;
  const int poll_ms = std::max<int>(1, static_cast<int>(options_.poll_us / 1000));
  int64_t last_flush = clockNs(CLOCK_MONOTONIC);
  for (;;) {
    pollfd p{wake_[0], POLLIN, 0};
    (void)::poll(&p, 1, poll_ms);
    char buf[64];
    while (::read(wake_[0], buf, sizeof buf) > 0) {
    }
    // The flush requests are read before the rings are drained: a request that arrives between
    // the two would otherwise be marked done by a flush that lacks the records its thread pushed
    // just before asking (seen under ASan in CI: the SIGINT test read a file short of events).
    const uint64_t req = flush_req_.load(std::memory_order_acquire);
    drainRings();
    const uint8_t finish = finish_req_.load(std::memory_order_acquire);
    const int64_t now = clockNs(CLOCK_MONOTONIC);
    if (finish != 0) {
      finishFile(static_cast<FinishMode>(finish - 1));
      flush_done_.store(req, std::memory_order_release);
      finished_.store(true, std::memory_order_release);
      return;
    }
    const bool due = now - last_flush >= interval_ns ||
                     req != flush_done_.load(std::memory_order_relaxed) || saw_oom_;
    // A thread waiting in a signal handler may hold the GIL: resolve without it meanwhile.
    const FinishMode mode =
        signal_flushes_.load(std::memory_order_acquire) > 0 ? FinishMode::Signal : FinishMode::Stop;
    if (due || pending_.size() >= kMaxPending) processPending(mode);
    if (due) {
      if (error_.ok()) {
        Status s = writer_->flush();
        if (!s.ok()) error_ = s;
      }
      flushes_.fetch_add(1, std::memory_order_relaxed);
      bytes_.store(writer_->stats().bytes_written, std::memory_order_relaxed);
      chunks_.store(writer_->stats().chunks, std::memory_order_relaxed);
      last_flush = now;
      saw_oom_ = false;
      flush_done_.store(req, std::memory_order_release);
    }
    if (hooks_.on_tick) {
      try {
        hooks_.on_tick();
      } catch (abi::__forced_unwind&) {
        throw;
      } catch (...) {  // an adapter's failure must not end the writer (std::terminate)
      }
    }
  }
}

void Recorder::drainRings() {
  for (auto& chp : channels_) {
    Channel& ch = *chp;
    ch.ring.drain([&](const CaptureRecord& r, size_t i) {
      Pending p{r};
      if (r.flags & kHasContext) {
        p.ctx = static_cast<uint32_t>(pending_ctx_.size());
        pending_ctx_.push_back(
            std::move(ch.ctx[i]));  // leaves the side slot empty for the producer
      }
      if ((r.flags & kHasPcs) && r.npcs > 0) {
        p.pcs = static_cast<uint32_t>(pending_pcs_.size());
        const void* const* src = &ch.pcs[i * options_.native_depth];
        for (uint16_t k = 0; k < r.npcs; ++k)
          pending_pcs_.push_back(reinterpret_cast<uintptr_t>(src[k]));
      }
      if (r.flags & kHasText) {
        p.text = static_cast<uint32_t>(pending_text_.size());
        pending_text_.push_back(std::move(ch.text[i]));
      }
      if (r.action == 8) saw_oom_ = true;  // oom: written at once
      pending_.push_back(p);
    });
  }
}

uint32_t Recorder::internFrames(std::span<const ResolvedFrame> frames,
                                std::span<const uint32_t> order) {
  // The trie goes from the outermost frame in: the last frame of an innermost-first list first.
  // Frame ids are looked up once per batch (resolvers return each distinct frame once, as
  // torch::symbolize does), so a stack costs one trie lookup per frame.
  uint32_t node = kTraceRootStack;
  for (size_t k = order.size(); k-- > 0;) {
    const uint32_t i = order[k];
    if (i >= frames.size()) continue;
    uint32_t& id = batch_frame_ids_[i];
    if (id == UINT32_MAX)
      id = writer_->frame(writer_->string(frames[i].filename), writer_->string(frames[i].name),
                          frames[i].line);
    node = writer_->stack(node, id);
  }
  return node;
}

uint32_t Recorder::nativeFrame(uintptr_t pc) {
  auto it = native_frames_.find(pc);
  if (it != native_frames_.end()) return it->second;
  std::string file = "??", name;
  Dl_info info{};
  // pc - 1: a return address points after the call; the call itself is what we name.
  if (::dladdr(reinterpret_cast<void*>(pc - 1), &info) != 0) {
    if (info.dli_fname) file = info.dli_fname;
    if (info.dli_sname) {
      int st = 0;
      char* dm = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &st);
      name = st == 0 && dm ? dm : info.dli_sname;
      std::free(dm);
    }
  }
  if (name.empty()) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%zx", static_cast<size_t>(pc));
    name = hex;
  }
  uint32_t id = writer_->frame(writer_->string(file), writer_->string(name), 0);
  native_frames_.emplace(pc, id);
  return id;
}

uint32_t Recorder::internNative(std::span<const uintptr_t> pcs) {
  std::string key(reinterpret_cast<const char*>(pcs.data()), pcs.size_bytes());
  auto it = native_stacks_.find(key);
  if (it != native_stacks_.end()) return it->second;
  uint32_t node = kTraceRootStack;
  for (size_t k = pcs.size(); k-- > 0;) node = writer_->stack(node, nativeFrame(pcs[k]));
  native_stacks_.emplace(std::move(key), node);
  return node;
}

void Recorder::processPending(FinishMode mode) {
  if (pending_.empty()) return;
  clock_.addSample(options_.now_ticks(), realtimeNs());
  // Stack contexts of the whole batch, resolved in one call (PyTorch symbolizes a batch at once,
  // sharing the work between tracebacks).
  resolved_stacks_.clear();
  resolved_frames_.clear();
  const bool resolve = hooks_.resolver && !pending_ctx_.empty();
  if (resolve) {
    try {
      hooks_.resolver->resolve(pending_ctx_, mode, resolved_frames_, resolved_stacks_);
    } catch (abi::__forced_unwind&) {
      throw;
    } catch (...) {
      resolved_stacks_.clear();
    }
  }
  std::vector<uint32_t> ctx_stack(pending_ctx_.size(), kTraceNoStack);
  if (resolved_stacks_.size() == pending_ctx_.size()) {
    batch_frame_ids_.assign(resolved_frames_.size(), UINT32_MAX);
    for (size_t i = 0; i < ctx_stack.size(); ++i)
      ctx_stack[i] = internFrames(resolved_frames_, resolved_stacks_[i]);
  }
  for (const Pending& p : pending_) {
    const CaptureRecord& r = p.r;
    TraceEvent e = toTraceEvent(r, -1);
    if (r.flags & kHasTime) {
      int64_t t = clock_.toUnixUs(r.ticks);
      int64_t& last = last_time_us_[r.device];
      if (t < last) t = last;  // a refined slope must not move time backwards
      last = t;
      e.time_us = t;
    }
    if (r.pool_a != 0 || r.pool_b != 0) e.pool = writer_->pool(r.pool_a, r.pool_b);
    if (r.flags & kCompileNA) {
      if (na_string_ == 0) na_string_ = writer_->string("N/A");
      e.compile_context = na_string_;
    }
    if ((r.flags & kHasText) && pending_text_[p.text]) {
      // Producers hand the same RecordText on while an entry's strings do not change (a thread's
      // user metadata stays set for many allocations): its ids are looked up once.
      if (pending_text_[p.text] != last_text_) {
        last_text_ = pending_text_[p.text];  // held: its address cannot be reused meanwhile
        const RecordText& t = *last_text_;
        last_compile_ = t.compile_context.empty() ? 0 : writer_->string(t.compile_context);
        last_user_ = t.user_metadata.empty() ? 0 : writer_->string(t.user_metadata);
      }
      if (last_compile_ != 0) e.compile_context = last_compile_;
      if (last_user_ != 0) e.user_metadata = last_user_;
    }
    if (r.flags & kHasContext) {
      e.stack = ctx_stack[p.ctx];
    } else if ((r.flags & kHasPcs) && r.npcs > 0) {
      e.stack = internNative({pending_pcs_.data() + p.pcs, r.npcs});
    }
    state_.apply(e);
    if (error_.ok()) {
      Status s = writer_->event(e);
      if (!s.ok()) error_ = s;
    }
  }
  written_.fetch_add(pending_.size(), std::memory_order_relaxed);
  pending_.clear();
  pending_ctx_.clear();  // releases the contexts (PyTorch's release needs no GIL)
  pending_pcs_.clear();
  pending_text_.clear();
}

void Recorder::buildFinalState(FinishMode mode) {
  std::vector<TraceSegment> segs;
  std::vector<TraceBlock> blocks;
  std::vector<FinalSegment> reported;
  bool exact = false;
  if (hooks_.final_state) {
    try {
      exact = hooks_.final_state(mode, reported);
    } catch (abi::__forced_unwind&) {
      throw;
    } catch (...) {
      exact = false;
    }
  }
  if (exact) {
    std::map<uint32_t, std::unordered_map<uint64_t, uint32_t>>
        live_stacks;  // device -> address -> alloc stack
    std::sort(reported.begin(), reported.end(), [](const FinalSegment& a, const FinalSegment& b) {
      return a.device != b.device ? a.device < b.device : a.address < b.address;
    });
    for (const FinalSegment& f : reported) {
      TraceSegment g;
      g.device = f.device;
      g.address = f.address;
      g.total_size = f.total_size;
      g.stream = f.stream;
      g.pool_a = f.pool_a;
      g.pool_b = f.pool_b;
      g.is_large = f.is_large;
      g.is_expandable = f.is_expandable;
      g.usual_type = true;
      g.first_block = static_cast<uint32_t>(blocks.size());
      auto [ls, fresh] = live_stacks.try_emplace(f.device);
      if (auto st = state_.devices().find(f.device); fresh && st != state_.devices().end()) {
        st->second.live().forEach(
            [&, &m = ls->second](uint64_t a, const LiveAlloc& l) { m.emplace(a, l.stack); });
      }
      const auto& live_stack = ls->second;
      alloc::StateSums sums;
      for (const FinalBlock& b : f.blocks) {
        TraceBlock t;
        t.address = b.address;
        t.size = b.size;
        t.state = b.state;
        t.requested_size = b.requested_size;
        t.has_requested_size = b.state != 2;
        if (b.state != 2) {
          auto it = live_stack.find(b.address);
          if (it != live_stack.end()) t.stack = it->second;
        }
        sums.addBlock(b.state == 0, b.state == 1, b.size, b.requested_size);
        blocks.push_back(t);
      }
      // As PyTorch's snapshot() sums a segment: requested and active count pending blocks too.
      g.allocated_size = sums.allocated;
      g.active_size = sums.active;
      g.requested_size = sums.requested;
      g.block_count = static_cast<uint32_t>(blocks.size() - g.first_block);
      segs.push_back(g);
    }
  } else {
    // Derived from the events alone, as the loader would rebuild it (trace_state.h,
    // synthesizeFinalState: the one home of that rule).
    for (const auto& [d, ds] : state_.devices()) {
      SynthesizedState st = synthesizeFinalState(ds, d, blocks);
      segs.insert(segs.end(), st.segments.begin(), st.segments.end());
    }
  }
  writer_->setFinalState(std::move(segs), std::move(blocks));
}

void Recorder::finishFile(FinishMode mode) {
  drainRings();
  processPending(mode);
  uint64_t dropped = out_of_range_.load(std::memory_order_relaxed);
  for (const auto& ch : channels_) dropped += ch->ring.dropped();
  if (dropped > reported_dropped_) writer_->noteDropped(dropped - reported_dropped_);
  reported_dropped_ = dropped;
  if (error_.ok()) {
    // Everything the events say is in the file before the end state is asked for (which may take
    // locks): a failure there still leaves a complete event stream.
    Status s = writer_->flush();
    if (!s.ok()) error_ = s;
  }
  if (error_.ok()) {
    buildFinalState(mode);
    Status s = writer_->close();
    if (!s.ok()) error_ = s;
  }
  Status s = sink_->closeFile();
  if (error_.ok() && !s.ok()) error_ = s;
  bytes_.store(writer_->stats().bytes_written, std::memory_order_relaxed);
  chunks_.store(writer_->stats().chunks, std::memory_order_relaxed);
  flushes_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace memforensics::capture
