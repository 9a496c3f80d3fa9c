// json_analysis.h: the `analyze --json` document as an nlohmann::json value, for renderers inside
// report/ that embed it (the HTML report shows exactly the numbers `analyze --json` prints).
#pragma once
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>

#include "analysis/analyze.h"
#include "analysis/session/blocks.h"

namespace memforensics::report {

nlohmann::json analysisJson(const analysis::AnalysisResult& r);
// The same with only these of r.devices (indices, in this order) in "devices".
nlohmann::json analysisJson(const analysis::AnalysisResult& r, std::span<const size_t> devices);

// The four replayed counters and active = allocated + pending, as every JSON output of report/
// spells them (analyze --json's "start"/"final"/OOM "state", the HTML report's keyframes, the
// Perfetto export's OOM args): {"reserved_bytes", "requested_bytes", "allocated_bytes",
// "pending_free_bytes", "active_bytes"}. The one place these names are written.
nlohmann::json countersJson(const replay::Counters& c);

// The fragmentation verdict at an OOM as `blocks --json` and the HTML report's OOM keyframes write
// it: {"event", "request_bytes", "device_free", "stream", "pool", "pool_free_bytes",
// "pool_largest_free_bytes", "fits_total", "fits_block", "fragmentation", "short_by_bytes",
// "needed_bytes"}.
nlohmann::json oomVerdictJson(const analysis::OomVerdict& v);

// A frame as every JSON output of report/ writes it: {"filename", "line" (null when unknown),
// "name"}; a list of them innermost first.
nlohmann::json frameJson(const analysis::FrameText& f);
nlohmann::json framesJson(const std::vector<analysis::FrameText>& fs);

// An event index or a time that is -1 when unknown, as JSON: null then.
nlohmann::json optJson(int64_t v);
// A peak as `peak_NAME_bytes`, `peak_NAME_event` and `peak_NAME_time_us` (null when unknown) in
// `j` (analyze --json and timeline --json).
void addPeakJson(nlohmann::json& j, const char* name, const replay::Peak& p);
// A replay's trust as `consistent` (false: the trace cannot lead to the file's final state, or
// the replay cannot vouch for it), `untrusted` (replay::untrustedNames) and, when not consistent,
// `untrusted_cause` in `j` (analyze --json's devices, blocks --json).
void addTrustJson(nlohmann::json& j, bool consistent, uint8_t untrusted, std::string_view cause);

}  // namespace memforensics::report
