// render_compare.h: text and JSON renderings of `diff`, `ranks` and `check`
// (analysis/compare/compare.h; the JSON fields are documented in docs/cli.md), and the reader of
// `ranks --json` documents for `ranks --merge`.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/compare/compare.h"
#include "common/status.h"

namespace memforensics::report {

void renderDiffText(const analysis::DiffResult& r, std::ostream& out);
// One compact JSON document, newline-terminated.
void renderDiffJson(const analysis::DiffResult& r, std::ostream& out);
// The same document as a value (the report's baseline panel embeds it).
nlohmann::json diffJson(const analysis::DiffResult& r);

void renderRanksText(const std::vector<analysis::RankRow>& rows, const analysis::RanksSummary& s,
                     std::ostream& out);
void renderRanksJson(const std::vector<analysis::RankRow>& rows, const analysis::RanksSummary& s,
                     std::ostream& out);
// The rows of one `ranks --json` document (its figures and per-line bytes, as written; the
// outlier marks are recomputed by markOutliers after merging). `where` names the input in errors.
Expected<std::vector<analysis::RankRow>> parseRanksJson(std::string_view text,
                                                        const std::string& where);

struct CheckFile {
  std::string path;
  std::string error;  // non-empty: the file could not be read (the gate cannot hold)
};

void renderCheckText(const std::vector<CheckFile>& files, const analysis::CheckReport& r,
                     std::ostream& out);
void renderCheckJson(const std::vector<CheckFile>& files, const analysis::CheckReport& r,
                     std::ostream& out);

}  // namespace memforensics::report
