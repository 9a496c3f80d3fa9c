// cmd_timeline.h: the `timeline` subcommand (watermark series, peaks and phases; docs/cli.md).
#pragma once

#include <CLI/CLI.hpp>

namespace memforensics::cli {

// Registers `timeline` and its options on `app`; the options live in this module.
CLI::App* addTimelineCommand(CLI::App& app);
// Runs it after a successful parse: 0 ok, 2 unreadable input (as every command).
int runTimelineCommand();

}  // namespace memforensics::cli
