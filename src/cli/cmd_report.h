// cmd_report.h: the `report` subcommand (the self-contained HTML report; docs/report.md).
#pragma once
#include <CLI/CLI.hpp>

namespace memforensics::cli {

// Registers `report` and its options on `app`; the options live in this module.
CLI::App* addReportCommand(CLI::App& app);
// Runs it after a successful parse: 0 ok, 2 unreadable input, 1 the report could not be written.
int runReportCommand();

}  // namespace memforensics::cli
