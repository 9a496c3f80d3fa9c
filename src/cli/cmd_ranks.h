// cmd_ranks.h: the `ranks FILE...` subcommand: one row per file (rank) and device, outliers marked
// (docs/cli.md "ranks").
#pragma once

#include <CLI/CLI.hpp>

namespace memforensics::cli {

CLI::App* addRanksCommand(CLI::App& app);
// 0 every file was read; 2 when at least one was not (its row says why; the others are printed).
int runRanksCommand();

}  // namespace memforensics::cli
