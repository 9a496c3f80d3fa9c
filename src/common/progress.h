// progress.h: how a reader reports how far it has read.
#pragma once

#include <cstdint>
#include <functional>

namespace memforensics {

// Called now and then with the number of input bytes consumed so far; lets the caller draw a
// progress bar and release pages of a mapped file that were already read.
using ProgressFn = std::function<void(uint64_t consumed, uint64_t total)>;

}  // namespace memforensics
