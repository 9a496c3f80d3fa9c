// stepping_view.h: event stepping as the HTML report carries it (issue 29 item 2): the block
// layout after every event of a window of one device, as a base and one patch per event
// (analysis/session/stepping.h, checked against the allocator model there), with the events
// themselves for the page's event list (action, address, size, stack), so that the page shows
// the block map at any event of the window exactly and steps through it with the arrow keys.
//
// Bounded: kSteppingBytes of page JSON for the whole report, split evenly between at most
// kSteppingDevices devices (the drawn ones with OOMs first, then the highest reserved peaks; the
// page says so on the others). Where the whole trace does not fit, a window around the moment the
// block map opens at (the first OOM, else the requested peak): three quarters of it before that
// moment, the page says which events it covers.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "analysis/session/session.h"
#include "format/model/snapshot.h"

namespace memforensics::analysis {

inline constexpr size_t kSteppingBytes = 600'000;  // page JSON of the whole report
inline constexpr size_t kSteppingDevices = 4;      // devices with a window, at most
inline constexpr size_t kSteppingMinEvents = 64;   // halving never goes below this window
// Bytes of page JSON an event costs on average (its list record and its patch), to size the
// window the session records before the exact cost is known (then trimSteppingView).
inline constexpr size_t kSteppingBytesPerEvent = 110;

struct StepMapBlock {
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t requested = 0;
  uint8_t code = 0;  // the block map's code: state (0 free, 1 allocated, 2 pending) | category << 2
  int32_t stack = -1;  // index into ReportData::stacks, -1 = none or capped
  int64_t alloc_event = -1;
  uint32_t segment = 0;                          // index into SteppingView::segments
  format::StackId raw_stack = format::kNoStack;  // the file's, until the window is final
};

struct StepMapPatch {
  uint64_t lo = 0, hi = 0;  // lo == hi: the event changed nothing
  std::vector<StepMapBlock> blocks;
};

struct StepMapSegment {
  uint64_t address = 0;  // of the reservation
  int64_t stream = 0;
  std::string pool;  // "small", "large", "private (a, b)"
  bool expandable = false;
};

struct StepMapEvent {
  format::Action action = format::Action::Unknown;
  uint64_t addr = 0;
  uint64_t size = 0;
  int32_t stack = -1;  // index into ReportData::stacks
  int64_t time_us = -1;
  format::StackId raw_stack = format::kNoStack;  // the file's, until the window is final
};

struct SteppingView {
  int64_t first_event = 0;  // the window [first_event, last_event]; none when last < first
  int64_t last_event = -1;
  int64_t focus_event = -1;           // the moment the window was placed around
  std::vector<StepMapBlock> base;     // after first_event - 1, address order
  std::vector<StepMapPatch> patches;  // patches[i]: after event first_event + i
  std::vector<StepMapEvent> events;   // event first_event + i
  std::vector<StepMapSegment> segments;
  std::string unavailable;  // why a device drawn with a layout has no stepping ("" otherwise)
  bool empty() const { return last_event < first_event; }
};

// The window a session records for a device (pass-1 facts): around the first OOM, else the
// requested peak, sized by `bytes` at kSteppingBytesPerEvent; nullopt for a device without
// events or a budget of 0.
struct SteppingWindow {
  int64_t first = 0, last = -1, focus = 0;
};
std::optional<SteppingWindow> steppingWindow(const DeviceFacts& facts, size_t bytes);

// The report form of a session's stepping facts, trimmed to `max_bytes`; categories as the block
// map gives them; then the stacks of what stays through `stack_index` (the report's stack table:
// nothing trimmed away names a stack there).
SteppingView steppingViewOf(const format::Snapshot& snap, const DeviceFacts& facts, int64_t focus,
                            size_t max_bytes,
                            const std::function<int32_t(format::StackId)>& stack_index);

// Page JSON bytes of a view (render_html.cc writes it; an estimate within a few per cent).
size_t steppingCost(const SteppingView& v);
// Narrows the window to at most `max_bytes` (never below kSteppingMinEvents events), keeping the
// focus event, three quarters of what stays before it; the base moves to the new first event by
// applying the patches before it. Returns the events dropped.
size_t trimSteppingView(SteppingView& v, size_t max_bytes);
// Leaves no window, saying why (the layout's blocks alone, or the shortest window, are over
// `max_bytes`).
void dropSteppingView(SteppingView& v, size_t max_bytes);

}  // namespace memforensics::analysis
