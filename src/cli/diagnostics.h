// diagnostics.h: the exit codes of every command, and how commands report errors and warnings.
#pragma once

#include <string>
#include <string_view>

namespace memforensics::cli {

// The one exit-code table (docs/cli.md "Exit codes"). `record` has its own codes besides these:
// the recorded command's status (see cmd_record.h).
inline constexpr int kExitOk = 0;  // success
inline constexpr int kExitUsage =
    1;  // bad usage: unknown option, missing or out-of-range argument, --at oom without OOM
inline constexpr int kExitError =
    2;  // an input could not be read or is invalid, an output could not be written,
        // out of memory, or any other failure while running
inline constexpr int kExitCheckFailed =
    3;  // `check` only: the inputs were read and a limit does not hold (cli/cmd_check.h)

// "memforensics: error: MESSAGE" / "memforensics: warning: MESSAGE" on stderr. The message is
// escaped (common/text_escape.h): it may quote the input (a file name, a key, a string).
void printError(std::string_view message);
void printWarning(std::string_view message);

// What the command is doing now ("reading FILE", "writing OUT"), for the message when memory runs
// out or an unexpected exception reaches main: "out of memory while reading FILE".
void setActivity(std::string what);
const std::string& activity();

}  // namespace memforensics::cli
