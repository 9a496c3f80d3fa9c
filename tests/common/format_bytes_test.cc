// format_bytes_test.cc: the text people read must be exact.
#include "common/format_bytes.h"

#include <gtest/gtest.h>

namespace memforensics {
namespace {

TEST(FormatBytes, UnitsAndExactCount) {
  EXPECT_EQ(formatBytes(0), "0 B");
  EXPECT_EQ(formatBytes(1023), "1023 B");
  EXPECT_EQ(formatBytes(1024), "1.00 KiB (1024 B)");
  EXPECT_EQ(formatBytes(20971520), "20.00 MiB (20971520 B)");
  EXPECT_EQ(formatBytesShort(1610612736), "1.50 GiB");
  EXPECT_EQ(formatBytesSigned(-1048576), "-1.00 MiB");
  EXPECT_EQ(formatBytesSigned(512), "+512 B");
}

TEST(FormatBytes, TimesAndDurations) {
  EXPECT_EQ(formatTimeUs(0), "1970-01-01 00:00:00.000000 UTC");
  EXPECT_EQ(formatTimeUs(1783874495854988), "2026-07-12 16:41:35.854988 UTC");
  EXPECT_EQ(formatDurationUs(999), "999 us");
  EXPECT_EQ(formatDurationUs(1500), "1.5 ms");
  EXPECT_EQ(formatDurationUs(2500000), "2.500 s");
}

}  // namespace
}  // namespace memforensics
