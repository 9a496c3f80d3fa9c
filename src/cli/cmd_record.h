// cmd_record.h: the `record` subcommand: runs a command with the CUPTI injection library
// (libmemforensics_cupti.so) injected and leaves a native trace of its device memory.
#pragma once

#include <CLI/CLI.hpp>

namespace memforensics::cli {

// Registers `record` and its options on `app`; the options live in this module.
CLI::App* addRecordCommand(CLI::App& app);
// Runs it after a successful parse. Returns the command's exit status (128 + signal when it was
// killed), 127 when it cannot be run, 1 for bad usage, 2 when the trace cannot be written or read.
int runRecordCommand();

}  // namespace memforensics::cli
