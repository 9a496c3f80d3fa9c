// cmd_check.h: the `check FILE...` subcommand, a CI gate on memory (docs/cli.md "check",
// docs/ci-gate.md).
#pragma once

#include <CLI/CLI.hpp>

namespace memforensics::cli {

CLI::App* addCheckCommand(CLI::App& app);
// 0 every threshold holds, 3 (kExitCheckFailed) one does not, 1 bad usage (no threshold, a size
// that does not parse, --max-increase without --baseline), 2 an input cannot be read.
int runCheckCommand();

}  // namespace memforensics::cli
