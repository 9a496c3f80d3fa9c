// allocation_view.h: the allocation view of the HTML report (memory_viz's "Active Memory
// Timeline"), a pure function of one device's session facts: which allocations are drawn one by
// one, and the rest band per bucket of events with its split (docs/report.md, "Allocations over
// time").
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "analysis/session/session.h"
#include "format/model/snapshot.h"

namespace memforensics::analysis {

// The allocation view (memory_viz's "Active Memory Timeline"): every allocation a band over its
// lifetime, stacked. Bounded: the largest allocations of the trace (by requested bytes) are drawn
// one by one, at most kMaxDrawnAllocations and kAllocationViewBytes of page JSON per device (the
// budget shrinks as more devices are drawn, as the other per-device bounds do). A block alive
// before the trace began that the trace frees is a candidate too, drawn from the start and named
// by the stack that freed it (as memory_viz does). The rest (smaller ones, and blocks alive from
// before the trace to its end) is one band whose height per bucket of
// consecutive events is what the drawn ones leave of the requested bytes at the bucket's
// requested maximum, so drawn + rest = the timeline's requested line there, and at the requested
// peak exactly the peak.
inline constexpr size_t kAllocationViewBytes = 400'000;  // page JSON per device, full share
inline constexpr size_t kMaxDrawnAllocations = 4000;     // per device (the page's stacking is
                                                         // O(drawn^2) in the worst case)
inline constexpr size_t kAllocationBuckets = 600;        // buckets of the rest band per device, at
                                                   // most (a quarter of the budget, 16 at least)
struct DrawnAllocation {
  int64_t alloc_event = 0;  // -1: alive before the trace began (freed in it; `stack` freed it)
  int64_t free_event = -1;  // free requested; -1: alive at the end of the trace
  int64_t alloc_time_us = -1, free_time_us = -1;
  uint64_t bytes = 0;  // requested
  int32_t stack = -1;  // index into ReportData::stacks, -1 = none or capped
  Category category = Category::Unknown;
};

// One stack of the rest band at a bucket's moment: the trace's allocations from it that are live
// then and not drawn one by one.
struct RestStack {
  int32_t stack = -1;  // index into ReportData::stacks, -1 = none recorded or the table is full
  uint64_t bytes = 0;  // requested
  uint64_t allocations = 0;
  // false: a lower bound (halving moved allocations of a stack the list did not hold into the
  // band, and the list was full: what the stack already had there is unknown)
  bool exact = true;
};
inline constexpr size_t kRestStacks = 3;  // the rest band's stacks listed per bucket

struct AllocationBucket {
  int64_t first_event = 0;  // the bucket covers [first_event, next bucket's first_event)
  int64_t first_time_us = -1;
  int64_t at_event = 0;      // the bucket's requested maximum (the first event reaching it;
                             // -1: the start state, in the first bucket)
  uint64_t total_bytes = 0;  // requested bytes after at_event (the timeline's series)
  uint64_t rest_bytes = 0;   // total_bytes minus the drawn allocations live then
  // The rest band split on demand (the page's click): [c] the requested bytes of the trace's
  // allocations of inferred category c live at at_event and not drawn; [kCategoryCount] blocks
  // alive before the trace began (the ones it frees, not drawn, and the ones it never frees).
  // They sum to rest_bytes.
  std::array<uint64_t, kCategoryCount + 1> split{};
  std::vector<RestStack> stacks;  // the largest stacks of split[0..kCategoryCount), at most
                                  // kRestStacks, largest first
  bool stacks_all = false;        // `stacks` holds every stack of those parts
  bool cut = false;  // the parts held more than the band and were cut to it (an estimate)
};

struct AllocationView {
  std::vector<DrawnAllocation> drawn;  // by alloc event
  std::vector<AllocationBucket> buckets;
  uint64_t allocations = 0;     // allocations in the trace (alloc events)
  uint64_t before_trace = 0;    // blocks alive before the trace that it frees (candidates too)
  uint64_t smallest_drawn = 0;  // bytes of the smallest drawn allocation (0: none drawn)
  size_t budget_bytes = 0;      // the JSON budget this device had
  bool capped = false;          // some allocation with bytes > 0 was not drawn
  // Buckets whose split was cut to fit rest_bytes (the trace's not-drawn allocations held more
  // than the band: the replayer caps a request at its block; AllocationBucket::cut): the page
  // calls the split an estimate where this is not 0.
  uint64_t split_cut = 0;
};

// The allocation view of one device: the largest allocations within `budget` bytes of page JSON
// and `max_drawn`, in alloc-event order, and the rest band per bucket with its split. `stack`
// names a snapshot stack in the report's table (-1: none or the table is full); `max_stacks`
// bounds the indices it returns (for the budget's reservation).
AllocationView allocationViewOf(const DeviceFacts& f, size_t budget, size_t max_drawn, bool times,
                                const std::function<int32_t(format::StackId)>& stack,
                                size_t max_stacks);

// Halving (report_data.h halveReportData): the `keep` largest drawn allocations stay, the others
// join the rest band and its split. Returns how many went.
size_t halveAllocationView(AllocationView& v, size_t keep);

}  // namespace memforensics::analysis
