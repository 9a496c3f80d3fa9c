// phases.h: the phases of a training run on one device, from the file alone.
//
// First choice: external_annotations (2.5+: record_function START/END markers such as
// "ProfilerStep#12", "Optimizer.step#AdamW.step", "## forward ##"), mapped onto event indices by
// time. Without annotations (or without times): iterations detected from the periodic pattern of
// the allocation stream (the same sequence of (stack, size) allocations repeating every step).
// Every phase says which of the two it came from, so a finding can say how sure it is.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "format/model/snapshot.h"

namespace memforensics::analysis {

enum class PhaseKind : uint8_t {
  Iteration,  // one training step (ProfilerStep#N, or one detected period)
  Forward,    // forward pass within a step, where known
  Backward,   // backward pass within a step, where known
  Optimizer,  // optimizer step within a step, where known
  Other,      // any other annotated range
};

enum class PhaseSource : uint8_t { Annotation, Detected };

struct Phase {
  PhaseKind kind = PhaseKind::Other;
  PhaseSource source = PhaseSource::Annotation;
  std::string name;         // e.g. "ProfilerStep#3", "iteration 3", "Optimizer.step#Adam.step"
  int64_t first_event = 0;  // index into the device's trace (inclusive)
  int64_t last_event = -1;  // inclusive; last_event < first_event = an empty range
  int64_t start_us = -1;    // -1 when the file has no times
  int64_t end_us = -1;
  int iteration = -1;  // 0-based step number for Iteration phases and phases inside one
  // Annotations only: the START or the END is not in the file (the annotation buffer wrapped, or
  // the dump happened inside the range), so the range was extended to the edge of the trace.
  bool open = false;
};

// Phases of `device`, sorted by first_event; nested ranges (forward inside a step) both appear.
std::vector<Phase> detectPhases(const format::Snapshot& snap, int64_t device);
// The same, with the stacks' facts from `cache` (one per device's analysis, frame_class.h).
class StackFactsCache;
std::vector<Phase> detectPhases(const format::Snapshot& snap, int64_t device,
                                StackFactsCache& cache);
// The same, reading the device's trace from `events` (as its holder has it: format::DeviceEvents)
// and its allocations from `allocs`, which must be allocationTable(events) (session.h): a session
// builds that table once for the phases and its own facts.
struct AllocFact;
std::vector<Phase> detectPhases(const format::Snapshot& snap, int64_t device,
                                std::span<const format::Event> events, StackFactsCache& cache,
                                const std::vector<AllocFact>& allocs);

std::string_view phaseKindName(PhaseKind k);

}  // namespace memforensics::analysis
