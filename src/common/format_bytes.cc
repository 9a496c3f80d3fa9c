// format_bytes.cc: byte counts, times and durations as text.
#include "common/format_bytes.h"

#include <cinttypes>
#include <cstdio>
#include <ctime>

namespace memforensics {

std::string formatBytesShort(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

std::string formatBytes(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  return formatBytesShort(bytes) + " (" + std::to_string(bytes) + " B)";
}

std::string formatBytesSigned(int64_t bytes) {
  if (bytes < 0) return "-" + formatBytesShort(static_cast<uint64_t>(-(bytes + 1)) + 1);
  return "+" + formatBytesShort(static_cast<uint64_t>(bytes));
}

std::string formatTimeUs(int64_t time_us) {
  int64_t secs = time_us / 1000000;
  int64_t frac = time_us % 1000000;
  if (frac < 0) {
    frac += 1000000;
    secs -= 1;
  }
  std::time_t t = static_cast<std::time_t>(secs);
  std::tm tm{};
  if (gmtime_r(&t, &tm) == nullptr) return std::to_string(time_us) + " us";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02d %02d:%02d:%02d.%06" PRId64 " UTC",
                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                frac);
  return buf;
}

std::string formatDurationUs(int64_t us) {
  char buf[48];
  if (us < 0) return "-" + formatDurationUs(-us);
  if (us < 1000) {
    std::snprintf(buf, sizeof buf, "%" PRId64 " us", us);
  } else if (us < 1000000) {
    std::snprintf(buf, sizeof buf, "%.1f ms", us / 1000.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.3f s", us / 1e6);
  }
  return buf;
}

}  // namespace memforensics
