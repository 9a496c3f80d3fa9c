// format_bytes.h: the one place that turns byte counts into text for people.
#pragma once

#include <cstdint>
#include <string>

namespace memforensics {

// "1.50 GiB (1610612736 B)"-style rendering: binary units, 2 decimals, exact count kept.
std::string formatBytes(uint64_t bytes);
// Signed variant for deltas: "+12.00 MiB".
std::string formatBytesSigned(int64_t bytes);
// Short form without the exact count: "1.50 GiB".
std::string formatBytesShort(uint64_t bytes);
// Microseconds since the epoch as "2026-11-30 04:26:17.123456 UTC".
std::string formatTimeUs(int64_t time_us);
// A duration in microseconds as "1.234 s" / "12.3 ms" / "45 us".
std::string formatDurationUs(int64_t us);

}  // namespace memforensics
