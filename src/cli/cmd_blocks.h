// cmd_blocks.h: the `blocks` subcommand (exact block layout and fragmentation at one moment).
#pragma once

#include <CLI/CLI.hpp>

namespace memforensics::cli {

// Registers `blocks` and its options on `app`; the options live in this module.
CLI::App* addBlocksCommand(CLI::App& app);
// Runs it after a successful parse: 0 ok, 1 bad --at / device / no OOM, 2 unreadable input.
int runBlocksCommand();

}  // namespace memforensics::cli
