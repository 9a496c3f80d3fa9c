// findings_ctx.h: what the detectors share (internal to src/analysis): one device's facts as the
// detectors read them (Ctx), the stack flags from the one frame classifier, and each detector's
// entry point. Each detector lives in its own file (detect_*.cc) and appends only its own findings;
// findings.cc runs them in a fixed order and sorts. Categories: categories.cc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "analysis/findings/findings.h"
#include "analysis/frames/frame_class.h"
#include "analysis/whatif/whatif.h"
#include "replay/alloc_conf.h"

namespace memforensics::analysis::detail {

inline constexpr uint64_t kMiB = 1ull << 20;

// The severity policy (docs/findings.md): high = causes or will cause an OOM; warning = acting on
// the finding saves at least 5% of the peak it is measured against and at least 256 MiB; info
// otherwise. The floor of a warning for a peak of `peak` bytes:
inline constexpr uint64_t kWarningMinBytes = 256 * kMiB;
inline uint64_t warningFloor(uint64_t peak) {
  return std::max(kWarningMinBytes, peak / 20);
}

// Temporary spike: the level above the spike's midpoint may be held for at most this share of the
// events within kSpikeNeighbourhood (a share of the trace, at least 64 events) on each side of the
// peak; held longer, it is a plateau, not a spike.
inline constexpr double kSpikeMaxHeldShare = 0.25;
inline constexpr double kSpikeNeighbourhood = 0.10;

// Cache bloat: the unused cache must sit for at least this share of the run (by time, else by
// events); shorter is a working set cached as the run ends.
inline constexpr double kCacheTailShare = 0.25;
// Cache bloat: the bytes given back must be at least this share of the peak reserved.
inline constexpr double kCacheBloatMinShare = 0.25;

// What a stack says about the code that allocated, as bits, from the one frame classifier
// (frame_class.h stackFacts: phases and categories agree on what is backward or optimizer code).
enum StackFlag : uint8_t {
  kOptimizer = 1,   // an optimizer frame (torch/optim)
  kAutograd = 2,    // the autograd engine / a backward function
  kModuleInit = 4,  // parameter creation: nn.Module construction or .to()/.cuda()
  kForward = 8,     // a model's forward: a `forward` frame, the module call, torch.nn.functional
};

uint8_t stackFlags(const format::Snapshot& s, format::StackId id);
uint8_t stackFlags(const StackFacts& f);

// One device's facts as the detectors read them, with a per-call cache of stack flags (no state
// survives a call: the detectors are pure functions of the facts).
struct Ctx {
  const format::Snapshot& s;
  const DeviceFacts& facts;
  int64_t device;
  std::span<const format::Event> ev;
  const std::vector<Phase>& iters;  // Iteration phases, in order
  const std::string& basis;
  const std::vector<AllocFact>& allocs;
  const std::vector<int32_t>& alloc_at;  // per event: index into allocs for alloc events, else -1
  const replay::DeviceSummary& summary;
  std::vector<uint8_t> flags;              // per stack id, 0xff = not computed
  StackFactsCache own_stack_facts;         // frame and stack facts, when no cache is given
  StackFactsCache* stack_facts = nullptr;  // a caller's cache (the session's), else own's

  Ctx(const format::Snapshot& snap, const DeviceFacts& f, StackFactsCache* cache = nullptr)
      : s(snap),
        facts(f),
        device(f.device),
        ev(f.events),
        iters(f.iterations),
        basis(f.iteration_basis),
        allocs(f.allocs),
        alloc_at(f.alloc_at),
        summary(f.summary),
        own_stack_facts(snap),
        stack_facts(cache) {}

  // This device's trace as the what-if's replays read it: the events the facts hold. Only for a
  // device with a trace (0 <= device < s.traceCount()).
  TraceInput trace() const { return {s, static_cast<size_t>(device), ev}; }

  // The moment after `event` with its live set, or nullptr when the facts do not hold one.
  const MomentFacts* live(int64_t event) const {
    const MomentFacts* m = facts.at(event);
    return m != nullptr && m->has_live ? m : nullptr;
  }
  uint8_t flagsOf(format::StackId id) {
    if (id >= flags.size()) flags.resize(std::max<size_t>(s.stacks.stackCount(), id + 1), 0xff);
    if (flags[id] == 0xff)
      flags[id] = stackFlags((stack_facts ? *stack_facts : own_stack_facts).of(id));
    return flags[id];
  }
  std::vector<FrameText> frames(format::StackId id, size_t n = 3) const {
    return userFrames(s, id, n);
  }
};

// The category of a live block: its allocation's category, or for a block alive before the trace,
// the category its stack implies (categories.cc).
Category categoryOfLive(Ctx& c, const replay::LiveBlock& b);
Category preTraceCategoryOfFlags(uint8_t flags);

std::string pct(uint64_t part, uint64_t whole);

// The times of the OOMs on the file's other devices, sorted; OOMs without a time are left out.
// One job: an OOM there unwinds this device's step too (categories, cache bloat, the spike).
// From Snapshot::ooms, so a file of many devices is scanned once, not once per device.
std::vector<int64_t> otherDeviceOomTimes(const format::Snapshot& s, int64_t device);  // "42%"

// The requested bytes after each event of [lo, hi] (clamped to the trace), relative to the level
// before `lo`, from the allocation table (blocks alive before the trace shift it by what they free
// there, which a complete history does not have); in double: hostile sizes near 2^64 must not
// overflow a sum, and levels only need comparing (findings.cc).
std::vector<double> requestedLevels(const Ctx& c, int64_t lo, int64_t hi);

// The OOMs an allocation can be alive at: this device's, by event index, and the other devices'
// of the same file, by time (one job: an OOM in one DataParallel replica's forward unwinds the
// step on every device) (categories.cc).
struct Ooms {
  std::vector<int64_t> events;       // this device's oom events, in order
  std::vector<int64_t> other_times;  // time_us of the other devices' oom events, sorted
};
Ooms oomsOf(const format::Snapshot& snap, int64_t device);
// Alive at an OOM: made before an OOM event of this device and not freed before it, or (with
// times) made before another device's OOM and freed after it. Its free, if any, came from the
// exception's unwind (or later): its lifetime says nothing about what it was.
bool aliveAtAnOom(const Ctx& c, const AllocFact& a, const Ooms& ooms);

// Training steps (detect_growth.cc). Detected (not annotated) iterations count as steps only when
// most of them run a backward pass or an optimizer.
bool iterationsAreTrainingSteps(Ctx& c);
// When an allocation has outlived its step: the last event of the first optimizer phase that
// begins after it was made (its step's backward and optimizer have run), or without optimizer
// phases the last event of its iteration; -1 when it was made outside every iteration.
class StepEnds {
 public:
  explicit StepEnds(const Ctx& c);
  int64_t of(const AllocFact& a) const;

 private:
  const Ctx& c_;
  std::vector<std::pair<int64_t, int64_t>> optimizer_;  // (first, last) event, by first
};

// The line to change for bytes made by a forward: the model's call site (the innermost user
// frame outside the `forward` functions, `logits = model(x)`) and its callers, else the innermost
// user frames (detect_growth.cc).
std::vector<FrameText> keptForwardWhere(Ctx& c, format::StackId id);

// The replay of a device's requests under the file's own settings on the card the file implies,
// which a finding runs again with its fix (whatif.h SimChange) before it says it; every checked
// fix on the device carries its label (exact or estimate) (fix_replay.cc).
struct FixBaseline {
  DeviceWhatIf facts;  // facts.baseline: the replay without the fix
  replay::AllocConf conf;
  uint64_t capacity = kWhatIfUnlimited;
};
// nullopt, with why in `why`, when the device cannot be replayed: a profiler trace, no request
// stream, the replays switched off, a history that began late, a replay past kReplayCheckVisits,
// or one that fails requests the recording served (its figures would check nothing).
std::optional<FixBaseline> fixBaseline(const Ctx& c, const FindingsOptions& opt, std::string* why);
// "exact", or "an estimate: <reason>" (whatIfEstimateReason's).
std::string exactLabel(const std::string& reason);

// The detectors (one file each; docs/findings.md gives their rules).
void detectOom(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt);  // detect_oom.cc
void detectGrowth(Ctx& c, std::vector<Finding>& out,
                  const FindingsOptions& opt);  // detect_growth.cc
void detectOptimizerBloat(Ctx& c, std::vector<Finding>& out,
                          const FindingsOptions& opt);  // detect_optimizer.cc
void detectCacheBloat(Ctx& c, std::vector<Finding>& out,
                      const FindingsOptions& opt);  // detect_cache.cc
void detectAllocatorSetting(Ctx& c, std::vector<Finding>& out,
                            const FindingsOptions& opt);  // detect_cache.cc
void detectTemporarySpike(Ctx& c, std::vector<Finding>& out,
                          const FindingsOptions& opt);  // detect_spike.cc
void detectPendingFree(Ctx& c, std::vector<Finding>& out,
                       const FindingsOptions& opt);  // detect_pending_free.cc
// Activation checkpointing, then inference with grad (detect_checkpoint.cc).
void detectActivationAdvice(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt);
void detectIncompleteHistory(Ctx& c, std::vector<Finding>& out);  // detect_history.cc

}  // namespace memforensics::analysis::detail
