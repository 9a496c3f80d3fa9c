// detect_history.cc: a history that cannot explain the file's state (no trace, a ring buffer of
// one entry, a trace whose first entries were dropped): says so and how to record one that can
// (docs/findings.md "Incomplete history"). Reads only the replayer's truncation facts
// (replay::DeviceSummary: events, live_at_start, freed_before_start, the requested peak and the
// frees_before_trace_start anomaly); derives nothing of its own.
#include <string>

#include "analysis/findings/findings_ctx.h"
#include "common/format_bytes.h"

namespace memforensics::analysis::detail {

namespace {

// The call that records a history, in the form the PyTorch that wrote the file takes: 2.0 has only
// the boolean form (trace_alloc_record_context gives the entries their stacks), which later
// releases still accept; 2.1 and later files get the keyword form (format doc 5). `entries` is the
// ring buffer's size as written ("100000", "...").
bool legacyRecordApi(const format::Snapshot& s) {
  return s.traits.era() == "2.0";
}
std::string recordCall(const format::Snapshot& s, const std::string& entries) {
  return legacyRecordApi(s)
             ? "torch.cuda.memory._record_memory_history(True, "
               "trace_alloc_max_entries=" +
                   entries + ", trace_alloc_record_context=True)"
             : "torch.cuda.memory._record_memory_history(max_entries=" + entries + ")";
}
// The ring buffer's knob in that form.
const char* ringKnob(const format::Snapshot& s) {
  return legacyRecordApi(s) ? "trace_alloc_max_entries" : "max_entries";
}

// How to write the snapshot at the end and at an OOM in that release (_dump_snapshot and the OOM
// observer came with 2.1).
std::string dumpCall(const format::Snapshot& s) {
  return legacyRecordApi(s)
             ? "pickle.dump(torch.cuda.memory._snapshot(), open(path, \"wb\")) at the end and in "
               "an `except torch.cuda.OutOfMemoryError` handler"
             : "torch.cuda.memory._dump_snapshot(path) at the end or, for an OOM, in an observer "
               "registered with torch._C._cuda_attach_out_of_memory_observer";
}

// How to record a history that can explain an OOM (README "Getting a snapshot worth analysing").
std::string recordFix(const format::Snapshot& s) {
  return "record the history from the start of the run: " + recordCall(s, "100000") +
         " before the model is built, " + dumpCall(s) +
         " (README: Getting a snapshot worth analysing)";
}

// A trace that was cut by PyTorch's ring buffer holds exactly max_entries entries per device:
// one (max_entries=1), or a round number (a multiple of 1000, or a power of two from 1024). Any
// other count is a recording that began late and kept everything after.
bool ringSize(size_t n) {
  return n == 1 || (n >= 1000 && (n % 1000 == 0 || (n & (n - 1)) == 0));
}

// How to record the part a late start missed, for a snapshot and for a profiler trace.
std::string startEarlier(const format::Snapshot& s) {
  return "call " + recordCall(s, "100000") +
         " before the model is built (it was called after the memory live at the trace's first "
         "entry was allocated), and " +
         dumpCall(s) + " (README: Getting a snapshot worth analysing)";
}
constexpr const char* kProfileEarlier =
    "a profiler trace covers only the profiled steps: start the profile before the model is "
    "built (or record the run with torch.cuda.memory._record_memory_history before it) to see "
    "where the memory live at its first event came from";

std::string blocks(size_t n) {
  return std::to_string(n) + (n == 1 ? " block" : " blocks");
}

std::string entries(size_t n) {
  return std::to_string(n) + (n == 1 ? " entry" : " entries");
}

}  // namespace

void detectIncompleteHistory(Ctx& c, std::vector<Finding>& out) {
  const replay::DeviceSummary& s = c.summary;
  const auto& wrapped_stat =
      s.anomalies[static_cast<size_t>(replay::AnomalyKind::FreesBeforeTraceStart)];
  const bool wrapped = s.freed_before_start > 0;  // entries before the first one are missing
  const bool profile = c.s.source == format::SourceFormat::ProfilerTrace ||
                       c.s.source == format::SourceFormat::MemoryTimeline;
  const bool ring = !profile && ringSize(s.events);  // a ring buffer cut it, else a late start
  Finding f;
  f.kind = FindingKind::IncompleteHistory;
  f.device = c.device;
  f.basis =
      "from the replay: blocks live before the trace's first entry (live_at_start), those "
      "of them freed in the trace (frees_before_trace_start)";
  if (s.events == 0) {
    // No trace: only the final state is known. An empty file has nothing to explain.
    if (s.live_blocks_final == 0 && c.facts.segments == 0) return;
    f.severity = FindingSeverity::Warning;
    f.bytes = s.final_replayed.requested;
    f.title = "no allocation history: the file holds only its final state (" +
              blocks(s.live_blocks_final) + ", " + formatBytesShort(s.final_replayed.requested) +
              " live in " + std::to_string(c.facts.segments) +
              " segments); it cannot explain an OOM, a peak or a leak";
    f.evidence.push_back(
        {"trace entries: none (history was not recorded, or not for this device)", -1, -1, 0, {}});
    f.evidence.push_back(
        {blocks(s.live_blocks_final) + " live at the end, allocated at an unknown time",
         -1,
         -1,
         s.final_replayed.requested,
         {}});
    f.fix = recordFix(c.s);
  } else if (s.live_at_start > 0 && s.peak_requested.event < 0 &&
             (wrapped || s.events < s.live_at_start)) {
    // The largest state is the one before the trace's first entry: nothing in the file says how
    // it was reached (a ring buffer of one entry, or recording started after the memory was
    // taken).
    f.severity = FindingSeverity::Warning;
    f.bytes = s.start.requested;
    f.title = "the history cannot explain the state: the trace holds " + entries(s.events) +
              " while " + blocks(s.live_at_start) + " (" + formatBytesShort(s.start.requested) +
              ") were live before its first entry, and the peak is there" +
              (ring      ? " (a ring buffer of " + entries(s.events) + " dropped the older ones)"
               : profile ? " (the profile began after they were allocated)"
                         : " (the recording began after they were allocated)") +
              "; it cannot explain an OOM, the peak or a leak";
    f.evidence.push_back({"trace entries: " + std::to_string(s.events), -1, -1, 0, {}});
    f.evidence.push_back({blocks(s.live_at_start) + " live before the first entry, history unknown",
                          -1,
                          -1,
                          s.start.requested,
                          {}});
    if (wrapped) {
      f.evidence.push_back(
          {"freed in the trace but allocated before it: " + blocks(s.freed_before_start),
           wrapped_stat.first_event,
           -1,
           0,
           {}});
    }
    f.fix = profile ? std::string(kProfileEarlier)
            : ring  ? recordFix(c.s) + "; " + ringKnob(c.s) +
                         " must hold every entry since the model was built (this trace kept " +
                         entries(s.events) + ")"
                   : startEarlier(c.s);
  } else if (wrapped) {
    // Only the beginning is missing: the peak is within the trace, but what was allocated before
    // its first entry (and any OOM there) is not in the file.
    f.severity = FindingSeverity::Info;
    f.bytes = s.start.requested;
    f.title = "the beginning of the history is missing: " + blocks(s.freed_before_start) +
              " freed in the trace " + (s.freed_before_start == 1 ? "was" : "were") +
              " allocated before its first entry (" +
              (ring      ? "a ring buffer of " + entries(s.events) + " dropped its oldest entries"
               : profile ? "the profile began after they were allocated"
                         : "the recording began late: " + entries(s.events) +
                               " is not a ring buffer's size") +
              "); what happened to the " + formatBytesShort(s.start.requested) +
              " live at its start is not in the file";
    f.evidence.push_back(
        {"freed in the trace but allocated before it: " + blocks(s.freed_before_start),
         wrapped_stat.first_event,
         -1,
         0,
         {}});
    f.evidence.push_back(
        {blocks(s.live_at_start) + " live before the first entry", -1, -1, s.start.requested, {}});
    f.fix = profile ? std::string(kProfileEarlier)
            : ring  ? std::string("raise ") + ringKnob(c.s) +
                         " so the ring buffer holds the whole run (this trace kept " +
                         entries(s.events) + "): " + recordCall(c.s, "...") + " before the run"
                   : startEarlier(c.s);
  } else {
    return;
  }
  out.push_back(std::move(f));
}

}  // namespace memforensics::analysis::detail

namespace memforensics::analysis {

std::string historyGap(const format::Snapshot& snap, const DeviceFacts& facts) {
  detail::Ctx c(snap, facts);
  std::vector<Finding> out;
  detail::detectIncompleteHistory(c, out);
  for (const Finding& f : out)
    if (f.severity >= FindingSeverity::Warning) return f.title;
  return {};
}

}  // namespace memforensics::analysis
