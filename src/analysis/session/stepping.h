// stepping.h: the block layout after every event of a window, as small patches (issue 29 item 2:
// the report's block map at any event, stepped with the arrow keys as memory_viz's state history).
//
// While a session's allocator model steps a window of events (DeviceSession::requestStepping),
// SteppingRecorder keeps the mapped blocks at the window's start (the base) and, after each event,
// the blocks of the one address range the event changed. The range is found from the model's
// state before and after the event: the block holding the event's address with its neighbours
// each side, and the event's own range, widened until no block of either state crosses its ends.
// A page applies the patches in order (StepMirror is that algorithm): remove every block that
// starts in [lo, hi), insert the patch's blocks. At the window's end the recorder applies its own
// patches to the base and compares the result with the model block by block: stepping is kept
// only where they agree (SteppingFacts::checked); otherwise `failed` says why and the report
// drops it.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "format/model/snapshot.h"
#include "replay/caching_allocator.h"

namespace memforensics::analysis {

// A mapped block as stepping carries it; `segment` indexes SteppingFacts::segments (the
// reservation, or cudaMalloc'd segment, holding it).
struct StepBlock {
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t requested = 0;  // allocated and pending-free blocks
  format::StackId stack = format::kNoStack;
  int64_t alloc_event = -1;  // -1: free, or alive before the trace began
  format::BlockState state = format::BlockState::Inactive;
  uint32_t segment = 0;
  bool operator==(const StepBlock&) const = default;
};

// A reservation as the page groups blocks by it: a drawn segment is a run of contiguous blocks of
// one reservation (an expandable reservation shows one segment per mapped range, as layout() and
// the snapshot file do).
struct StepSegment {
  uint64_t address = 0;  // of the reservation
  int64_t stream = 0;
  replay::PoolId pool{0, 0};
  bool is_large = true;
  bool expandable = false;
  auto operator<=>(const StepSegment&) const = default;
};

// After one event: the mapped blocks of [lo, hi) are `blocks` (none: nothing mapped there now).
// lo == hi: the event changed nothing.
struct StepPatch {
  uint64_t lo = 0, hi = 0;
  std::vector<StepBlock> blocks;
};

// Blocks held by one device's stepping (base and patches), whatever the input.
inline constexpr size_t kMaxSteppingBlocks = size_t{1} << 20;

struct SteppingFacts {
  int64_t first_event = 0;  // the window [first_event, last_event]
  int64_t last_event = -1;
  std::vector<StepBlock> base;     // mapped blocks after first_event - 1, address order
  std::vector<StepPatch> patches;  // patches[i]: after event first_event + i
  std::vector<StepSegment> segments;
  bool checked = false;  // the base with every patch applied equals the model's last state
  std::string failed;    // why stepping is not kept ("" when checked)
};

// The page's algorithm (viz/report.js applyPatch), for the recorder's check and the tests.
class StepMirror {
 public:
  void assign(const std::vector<StepBlock>& blocks);
  void apply(const StepPatch& p);
  std::vector<StepBlock> blocks() const;
  // The start of the block holding x (x when none does); the end of the block holding x (x + 1).
  uint64_t startOf(uint64_t x) const;
  uint64_t endOf(uint64_t x) const;

 private:
  std::map<uint64_t, StepBlock> blocks_;
};

// Records one window while a session steps its model (session.cc): start() with the state after
// first - 1, then before() and after() around the model's step of each event of the window, and
// finish() after the last.
class SteppingRecorder {
 public:
  SteppingRecorder(int64_t first, int64_t last);
  int64_t first() const { return facts_.first_event; }
  int64_t last() const { return facts_.last_event; }
  void start(const replay::CachingAllocator& core);
  void before(const replay::CachingAllocator& core, const format::Event& e);
  void after(const replay::CachingAllocator& core, const format::Event& e);
  void finish(const replay::CachingAllocator& core);
  SteppingFacts take() { return std::move(facts_); }

 private:
  // The mapped blocks of [lo, hi); `stored` ones count against kMaxSteppingBlocks (over it,
  // stepping fails).
  std::vector<StepBlock> blocksIn(const replay::CachingAllocator& core, uint64_t lo, uint64_t hi,
                                  bool stored = true);
  uint32_t segmentOf(const replay::CachedSegment& s);
  void fail(std::string why);

  SteppingFacts facts_;
  StepMirror mirror_;
  std::map<StepSegment, uint32_t> segment_index_;
  uint64_t lo_ = 0, hi_ = 0;  // the range before() saw
  size_t blocks_ = 0;
  bool on_ = true;
};

}  // namespace memforensics::analysis
