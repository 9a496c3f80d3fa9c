// threads.h: the --threads option of the commands that analyse (issue 16).
//
// How many devices (or files) are analysed at once: --threads N when given, else the environment
// variable MEMF_THREADS, else 0 = the machine's cores (common/parallel.h caps it at kMaxThreads).
// The output is the same for every value; only the time and the memory (one replay session per
// thread) change.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>

namespace memforensics::cli {

// Adds --threads to `sub` (every command that takes it shares one setting).
void addThreadsOption(CLI::App* sub);
// The setting: --threads, else MEMF_THREADS (a whole number from 0 to kMaxThreads; anything else
// is warned about once and ignored), else 0.
size_t analysisThreads();

}  // namespace memforensics::cli
