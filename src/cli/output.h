// output.h: how commands write their output, safely.
//
// * Standard output goes through a checked buffer: the first failed write (a full disk,
//   /dev/full, a closed pipe) is remembered with its errno, and finishStdout() turns it into exit 2
//   with "cannot write to standard output: <strerror>".
// * A file output (-o) that is a regular file or does not exist is written to a temporary file in
//   the same folder and renamed over it at the end (a failed command leaves nothing under the
//   output name; the file keeps its permissions; a symlink keeps pointing at it). A character
//   device or a FIFO (/dev/null, a named pipe, /dev/fd/N) is written through, never replaced; a
//   FIFO without a reader is refused instead of waited on. Anything else (a directory, a block
//   device, a socket) is refused.
// * An output that is one of the command's inputs (the same file, also through a hard link or a
//   symlink) is refused before anything is read.
#pragma once
#include <cstddef>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "common/status.h"

namespace memforensics::cli {

// Makes std::cout write through the checked buffer. Call once at the start of main.
void installStdout();

// Flushes std::cout; an error when a write to it failed, now or before.
Status flushStdout();

// Flushes std::cout and returns `rc`, or kExitError after printing the error when a write to
// standard output failed (unless writeOutput already reported that failure).
int finishStdout(int rc);

// Refuses `out` when it is the same file (device and inode) as one of `inputs`; "-" stands for
// the file standard output was opened on, whatever path or descriptor led there. Paths that do not
// exist, and outputs that are not regular files (a terminal, a pipe), pass.
Status checkNotAnInput(const std::string& out, const std::vector<std::string>& inputs);

// Writes `body` to `path` as above ("-" = standard output). The error names the path.
Status writeOutput(const std::string& path, const std::function<Status(std::ostream&)>& body);

// The width a text report on standard output wraps to: the terminal's when standard output is
// one, else COLUMNS when it holds a width, else report::kDefaultTextWidth. At least
// kMinTextWidth (narrower terminals get that: lines of a few words help nobody).
inline constexpr size_t kMinTextWidth = 40;
size_t stdoutTextWidth();

}  // namespace memforensics::cli
