// pass_stats.cc: see pass_stats.h.
#include "replay/pass_stats.h"

#include <cstdlib>
#include <string_view>

namespace memforensics::replay {

std::map<int64_t, PassStats>& passStats() {
  // Per thread: `ranks` analyses files on several threads at once, each with its own counters.
  static thread_local std::map<int64_t, PassStats> stats;
  return stats;
}

// Entries are zeroed, never erased: replayers and models keep a pointer to their device's entry.
void resetPassStats() {
  for (auto& [d, s] : passStats()) s = PassStats{};
}

std::string describePassStats() {
  std::string out;
  for (const auto& [d, s] : passStats()) {
    if (s.backward == 0 && s.forward == 0 && s.model_seeds == 0 && s.model_forward == 0) continue;
    if (!out.empty()) out += "; ";
    out += "device " + std::to_string(d) + ": " + std::to_string(s.backward) + " backward, " +
           std::to_string(s.forward) + " forward (" + std::to_string(s.events_stepped) +
           " events), model: " + std::to_string(s.model_seeds) + " seed, " +
           std::to_string(s.model_forward) + " forward (" + std::to_string(s.model_events_stepped) +
           " events)";
  }
  return out.empty() ? "no device replayed" : out;
}

bool passStatsRequested() {
  const char* v = std::getenv("MEMF_PASS_STATS");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

}  // namespace memforensics::replay
