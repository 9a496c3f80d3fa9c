// pass_stats.h: how many times a command walks each device's history (issue 12, part 2).
//
// Every DeviceReplayer backward reconstruction, every forward pass (a walk that applies event 0:
// from the start state, so a rewind followed by stepping is a new pass) and every event stepped is
// counted per device, for the replayer and for the allocator model separately; the model's seed
// (its own undo of the segment events, and the replayer it needs for the start live set when none
// is given) is counted too. Counters of the calling thread (`ranks` analyses files on several
// threads; each thread counts its own); tests reset them, run a command's analysis and assert the
// bound (<= 1 backward and
// <= 2 forward passes per device). MEMF_PASS_STATS=1 makes analyze, timeline and blocks print them
// to standard error.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace memforensics::replay {

struct PassStats {
  uint64_t backward = 0;        // DeviceReplayer backward passes (start-state reconstruction)
  uint64_t forward = 0;         // DeviceReplayer forward passes (walks that applied event 0)
  uint64_t events_stepped = 0;  // DeviceReplayer events applied, all passes together
  uint64_t model_seeds = 0;     // DeviceAllocatorModel constructions (start layout built)
  uint64_t model_forward = 0;   // DeviceAllocatorModel forward passes
  uint64_t model_events_stepped = 0;
};

// The counters of every device seen since the last reset, by device (entries are never erased:
// resetPassStats() zeroes them, so a pointer to one stays valid).
std::map<int64_t, PassStats>& passStats();
void resetPassStats();
// "device 0: 1 backward, 2 forward (900 events), model: 1 seed, 1 forward (450 events); ..."
std::string describePassStats();
// True when MEMF_PASS_STATS is set to a non-empty value other than "0".
bool passStatsRequested();

}  // namespace memforensics::replay
