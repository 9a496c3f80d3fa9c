// cmd_whatif.h: the `whatif FILE` subcommand, the allocator what-if (docs/cli.md "whatif",
// docs/whatif.md).
#pragma once

#include <CLI/CLI.hpp>

namespace memforensics::cli {

CLI::App* addWhatIfCommand(CLI::App& app);
// 0 done, 1 bad usage (--set without '=', a size that does not parse), 2 an input cannot be read
// or a setting is refused (unknown, or one that does not change device memory, e.g. pinned_*).
int runWhatIfCommand();

}  // namespace memforensics::cli
