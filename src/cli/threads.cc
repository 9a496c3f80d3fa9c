// threads.cc: see threads.h.
#include "cli/threads.h"

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "cli/diagnostics.h"
#include "common/parallel.h"

namespace memforensics::cli {

namespace {
std::optional<size_t> g_threads;  // --threads, when given
}  // namespace

void addThreadsOption(CLI::App* sub) {
  sub->add_option("--threads", g_threads,
                  "devices analysed at once (default: MEMF_THREADS, else the number of cores; "
                  "each holds one device's replay)")
      ->check(CLI::Range(size_t{0}, kMaxThreads));
}

size_t analysisThreads() {
  if (g_threads) return *g_threads;
  const char* v = std::getenv("MEMF_THREADS");
  if (v == nullptr || *v == '\0') return 0;
  const std::string_view s(v);
  size_t n = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || p != s.data() + s.size() || n > kMaxThreads) {
    static bool warned = false;  // main thread only: read while the options are applied
    if (!warned) {
      printWarning("MEMF_THREADS='" + std::string(s) + "' is not a whole number from 0 to " +
                   std::to_string(kMaxThreads) + "; using the number of cores");
      warned = true;
    }
    return 0;
  }
  return n;
}

}  // namespace memforensics::cli
