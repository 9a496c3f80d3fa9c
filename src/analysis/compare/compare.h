// compare.h: runs side by side (issue 14 parts 2-4): `diff BASE NEW`, `ranks FILE...`,
// `check FILE...`.
//
// Each file is analysed once, as `analyze` does it (one DeviceSession per device, the findings of
// analyzeDevice), into a RunProfile: per device the three peaks with the live bytes at each by
// category and by stack group (stack_groups.h, the one group-by-stack rule), the final state, the
// findings, the file's final segments and the growth per iteration. The profile is small (bounded
// by the constants below) and holds no Snapshot, so `ranks` keeps only rows while it streams
// thousands of files. diffProfiles, rankRowsOf / markOutliers and checkProfile are pure functions
// of profiles. Rules and reasons: docs/cli.md ("diff", "ranks", "check") and docs/ci-gate.md.
//
// Matching stacks across runs (two versions of a program): a stack group's key is its user frames
// (frames.h userFrames, kCompareFrames of them). Groups whose frames agree on file, function and
// line match exactly; the rest are matched on file and function only (lines shifted by an edit),
// largest with largest, and the match says so (StackMatch::FunctionOnly); what is still left on the
// file's name (last path component) and function, for the same code checked out in another
// directory (StackMatch::FileNameOnly, said too).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/analyze.h"
#include "analysis/findings/findings.h"
#include "analysis/frames/frames.h"
#include "analysis/session/session.h"
#include "format/model/snapshot.h"
#include "replay/replay.h"

namespace memforensics::analysis {

// User frames per stack key (the same depth as analyze's top groups).
inline constexpr size_t kCompareFrames = 3;
// Stack groups kept per peak and device in a profile (largest first); the rest are summed in
// PeakProfile::other_*. A real training run has tens to hundreds of groups.
inline constexpr size_t kMaxProfileGroups = 2000;
// Per-line bytes kept per rank row (the largest lines at the requested peak): what bounds the
// memory of `ranks` over thousands of files, and what the outlier explanation compares.
inline constexpr size_t kRankLines = 64;
// A rank is an outlier when its peak is more than this fraction above the median of all ranks.
inline constexpr double kOutlierFraction = 0.10;
// Final segments listed per side in a diff (all are counted and summed).
inline constexpr size_t kDiffSegmentsListed = 20;

enum class PeakKind : uint8_t { Reserved, Requested, Allocated };
inline constexpr size_t kPeakKinds = 3;
std::string_view peakKindName(PeakKind k);  // "reserved" / "requested" / "allocated"
// The summary's peak of kind k, and the reason a session is asked for its live set with (by
// PeakKind): what a profile reads (analyze.h requestProfilePeaks).
const replay::Peak& summaryPeak(const replay::DeviceSummary& s, PeakKind k);
inline constexpr uint32_t kPeakReasons[kPeakKinds] = {kMomentPeakReserved, kMomentPeakRequested,
                                                      kMomentPeakAllocated};

struct ProfileGroup {
  std::vector<FrameText> frames;  // userFrames(stack, kCompareFrames): the key
  bool has_stack = false;
  uint64_t requested_bytes = 0;
  uint64_t block_bytes = 0;
  uint64_t count = 0;
};

// The live set at one peak.
struct PeakProfile {
  replay::Peak peak;      // the figure, its event and time
  replay::Counters at;    // every counter after that event
  bool has_live = false;  // false: the session could not copy the live set (over a bound)
  std::array<uint64_t, kCategoryCount>
      by_category{};                 // requested bytes of live, non-pending blocks
  std::vector<ProfileGroup> groups;  // ranked (stack_groups.h), at most kMaxProfileGroups
  uint64_t other_requested = 0;      // the groups past kMaxProfileGroups
  uint64_t other_groups = 0;
};

// The iteration whose end holds the most more requested bytes than the previous one's.
struct StepGrowth {
  bool known = false;  // at least two iterations
  int iteration = -1;  // index into the device's iterations: growth from iteration-1 to iteration
  std::string name;    // the iteration's name ("ProfilerStep#3", "iteration 3")
  int64_t bytes = 0;   // requested at its end minus at the previous end (may be negative)
  // The allocations of that iteration still alive at its end, grouped by stack: the largest.
  std::vector<FrameText> top_frames;
  bool top_has_stack = true;
  uint64_t top_bytes = 0;
};

struct FindingRef {
  FindingKind kind = FindingKind::OomVerdict;
  FindingSeverity severity = FindingSeverity::Info;
  std::string location;  // innermost user frame as "file function" (no line), "" when none
  std::string where;     // the same with its line, for people ("model.py:54 forward")
  std::string title;
  uint64_t bytes = 0;
};

// A finding as profiles keep it (DeviceProfile::findings, RunProfile::job_findings).
FindingRef findingRef(const Finding& f);

struct SegmentRef {
  uint64_t address = 0;
  uint64_t size = 0;
  int64_t stream = 0;
  bool is_large = true;
  bool is_expandable = false;
};

// Segments of one role (pool, expandable or not, stream and size) that one run has more of than
// the other: two processes place their memory at different addresses, so this, not the address,
// is what says how the runs' caches differ.
struct SegmentGroup {
  uint64_t size = 0;
  int64_t stream = 0;
  bool is_large = true;
  bool is_expandable = false;
  size_t count = 0;  // how many more
};

struct DeviceProfile {
  int64_t device = 0;
  size_t events = 0;
  std::array<PeakProfile, kPeakKinds> peaks;  // by PeakKind
  replay::Counters final_state;  // the file's final state (the replayed one when the file has none)
  size_t ooms = 0;
  bool consistent = true;  // the replay led to the file's final state (replay.h DeviceSummary)
  std::vector<FindingRef> findings;  // as findFindings orders them (high first)
  std::vector<SegmentRef> segments;  // the file's final segments, address order
  StepGrowth growth;
  size_t iterations = 0;
  std::string iteration_basis;
};

struct JobFindingRef {
  int64_t device = -1;  // the device the finding points at (cross_device.h), -1 for the job
  FindingRef finding;
};

struct RunProfile {
  std::string path;
  std::string incomplete;  // format::Snapshot::incomplete of the input ("" when it is whole)
  std::vector<DeviceProfile> devices;  // ascending device
  // Findings about the job as a whole (cross_device.h: device imbalance), as analyze gives them;
  // check --fail-on and ranks count them on their device.
  std::vector<JobFindingRef> job_findings;
};

struct ProfileOptions {
  std::optional<int64_t> device;  // only this device
};

// One session per device (the peaks' live sets and the finding moments), then analyzeDevice.
RunProfile profileSnapshot(const format::Snapshot& snap, const ProfileOptions& options = {});
// The profile of one device from its session facts (which must hold the live sets at the three
// peaks; the findings come from analyzeDevice over the same facts).
// With `analysis`, also that device's analyzeDevice result (for the job's cross-device findings).
DeviceProfile profileDevice(const format::Snapshot& snap, DeviceFacts facts,
                            DeviceAnalysis* analysis = nullptr);

// ---- diff ----

enum class StackMatch : uint8_t { Exact, FunctionOnly, FileNameOnly, New, Gone };
// "exact" / "function_only" / "file_name_only" / "new" / "gone"
std::string_view stackMatchName(StackMatch m);

struct StackDelta {
  StackMatch match = StackMatch::Exact;
  std::vector<FrameText> base_frames;  // empty for New
  std::vector<FrameText> new_frames;   // empty for Gone
  bool has_stack = true;
  uint64_t base_bytes = 0, new_bytes = 0;  // requested bytes at the peak
  int64_t delta = 0;                       // new - base, saturated
};

struct PeakDiff {
  PeakKind kind = PeakKind::Reserved;
  replay::Peak base, neu;
  int64_t delta = 0;
  bool has_live = false;  // both live sets known (else no categories or stacks)
  std::array<uint64_t, kCategoryCount> base_category{}, new_category{};
  size_t matched_exact = 0, matched_function_only = 0, matched_file_name_only = 0;
  size_t added = 0, gone = 0;
  std::vector<StackDelta> grew;          // matched, delta > 0, largest growth first (at most top)
  std::vector<StackDelta> shrank;        // matched, delta < 0, largest drop first (at most top)
  std::vector<StackDelta> added_stacks;  // New, largest first (at most top)
  std::vector<StackDelta> gone_stacks;   // Gone, largest first (at most top)
};

struct DeviceDiff {
  int64_t device = 0;
  bool in_base = false, in_new = false;  // a device of one run only has no deltas
  std::array<PeakDiff, kPeakKinds> peaks;
  replay::Counters base_final, new_final;
  size_t base_ooms = 0, new_ooms = 0;
  size_t base_events = 0, new_events = 0;
  std::vector<FindingRef> appeared, disappeared;  // by kind and location
  std::vector<SegmentRef> only_base, only_new;    // listed (at most kDiffSegmentsListed each)
  size_t only_base_count = 0, only_new_count = 0;
  uint64_t only_base_bytes = 0, only_new_bytes = 0;
  size_t base_segments = 0, new_segments = 0;
  uint64_t base_segment_bytes = 0, new_segment_bytes = 0;
  size_t matched_by_address = 0;  // segments at the same address and size in both runs
  // By role (SegmentGroup): the groups one run has more of, largest bytes first (at most
  // kDiffSegmentsListed each), and their counts and bytes in all.
  std::vector<SegmentGroup> more_in_base, more_in_new;
  size_t more_in_base_count = 0, more_in_new_count = 0;
  uint64_t more_in_base_bytes = 0, more_in_new_bytes = 0;
};

struct DiffResult {
  std::string base_path, new_path;
  std::vector<DeviceDiff> devices;  // ascending device, every device of either run
};

struct DiffOptions {
  size_t top = 10;  // stacks listed per list (grew, shrank, new, gone)
};

DiffResult diffProfiles(const RunProfile& base, const RunProfile& neu,
                        const DiffOptions& options = {});
// The matched stack deltas at one peak (every group, unsorted lists), exposed for check.
PeakDiff diffPeak(PeakKind kind, const PeakProfile& base, const PeakProfile& neu, size_t top);

// new - base as a signed figure, saturated at the int64 range (hostile inputs near 2^64).
int64_t signedDelta(uint64_t base, uint64_t neu);

// ---- ranks ----

struct RankLine {
  std::string line;  // innermost user frame, "file:line function", or "(no stack)"
  uint64_t bytes = 0;
};

struct RankRow {
  std::string path;
  int64_t device = -1;
  std::string error;  // non-empty: the file could not be read or analysed (no figures)
  uint64_t peak_reserved = 0, peak_requested = 0, peak_allocated = 0;
  size_t ooms = 0;
  size_t high_findings = 0;
  std::string largest_holder;  // the largest stack group at the requested peak (display)
  uint64_t largest_holder_bytes = 0;
  std::vector<RankLine> lines;  // bytes per line at the requested peak, by line text
  // Filled by markOutliers.
  bool outlier = false;
  std::string outlier_figure;  // "peak_reserved" / "peak_requested"
  double above_median = 0;     // fraction above the median of that figure (0.25 = 25 %)
  std::string outlier_line;    // the line whose bytes differ most from the other ranks' median
  uint64_t outlier_line_bytes = 0, outlier_line_median = 0;
};

struct RanksSummary {
  size_t rows = 0, failed = 0, outliers = 0;
  uint64_t median_peak_reserved = 0, median_peak_requested = 0;
};

// One row per device of a profile (a profile without devices gives one row with an error).
std::vector<RankRow> rankRowsOf(const RunProfile& profile);
RankRow failedRankRow(std::string path, std::string error);
// Medians over the rows without error, then the outliers and their lines.
RanksSummary markOutliers(std::vector<RankRow>& rows);

// ---- check ----

struct CheckLimits {
  std::optional<uint64_t> max_peak_reserved, max_peak_requested, max_growth_per_step;
  std::optional<FindingSeverity> fail_on;  // findings at this severity or above fail
  std::optional<double> max_increase_pct;  // against the baseline's peaks
};

struct Violation {
  std::string path;
  int64_t device = 0;
  std::string figure;  // "peak_reserved", "growth_per_step", "finding leak", ...
  uint64_t value = 0;
  uint64_t limit = 0;
  std::string line;    // the line to look at ("model.py:54 forward"), "" when none stands out
  std::string detail;  // one more sentence (the iteration, the baseline's figure, the title)
};

struct CheckReport {
  std::vector<Violation> violations;
  std::vector<std::string> notes;  // what could not be checked, and why ("device 0: 1 iteration")
};

// The violations of one run. `baseline` is needed for max_increase_pct (devices are matched by
// ordinal; a device the baseline lacks is not compared, and a note says so).
CheckReport checkProfile(const RunProfile& run, const CheckLimits& limits,
                         const RunProfile* baseline = nullptr);

// Frames for one line of text: "model.py:54 forward < train.py:10 step" (innermost first),
// "(no stack recorded)" without a stack, "(no frames)" for a stack with none worth showing.
std::string framesLine(const std::vector<FrameText>& frames, bool has_stack = true);

}  // namespace memforensics::analysis
