// cmd_diff.h: the `diff BASE NEW` subcommand (two runs side by side; docs/cli.md "diff").
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "analysis/compare/compare.h"
#include "common/status.h"

namespace memforensics::cli {

CLI::App* addDiffCommand(CLI::App& app);
// 0 (diff is informational, whatever it finds), 2 when an input cannot be read.
int runDiffCommand();

// Loads `path` (progress bar and load warnings as every command) and profiles it
// (analysis::profileSnapshot); the Snapshot is dropped before returning. Shared with `check`.
Expected<analysis::RunProfile> loadProfile(const std::string& path, std::optional<int64_t> device,
                                           bool salvage);
// A --device the profile of `path` lacks: printed as an error, and the command exits 1 (bad usage,
// as `analyze --device`), never a comparison or a gate over nothing. True when it is missing.
bool missingDevice(const analysis::RunProfile& p, std::optional<int64_t> device);

}  // namespace memforensics::cli
