// trace_format.cc: CRC-32C and chunk names for the native trace format.
#include "format/trace/trace_format.h"

#include <array>

namespace memforensics::format::trace {

namespace {

// Slicing-by-8 tables for the reflected Castagnoli polynomial 0x82F63B78.
struct Crc32cTables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Crc32cTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

uint32_t crcSoftware(uint32_t crc, const uint8_t* p, size_t n) {
  static const Crc32cTables tables;
  const auto& t = tables.t;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= crc;
    crc = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
          t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crcHardware(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = __builtin_ia32_crc32di(c, w);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
#endif

}  // namespace

uint32_t crc32c(uint32_t crc, const uint8_t* data, size_t n) {
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hw = __builtin_cpu_supports("sse4.2");
  crc = hw ? crcHardware(crc, data, n) : crcSoftware(crc, data, n);
#else
  crc = crcSoftware(crc, data, n);
#endif
  return ~crc;
}

std::string_view chunkTypeName(uint8_t type) {
  switch (static_cast<ChunkType>(type)) {
    case ChunkType::Meta:
      return "meta";
    case ChunkType::Strings:
      return "strings";
    case ChunkType::Frames:
      return "frames";
    case ChunkType::Stacks:
      return "stacks";
    case ChunkType::Events:
      return "events";
    case ChunkType::Checkpoint:
      return "checkpoint";
    case ChunkType::Segments:
      return "segments";
    case ChunkType::Settings:
      return "settings";
    case ChunkType::Annotations:
      return "annotations";
    case ChunkType::Pools:
      return "pools";
    case ChunkType::Trailer:
      return "trailer";
  }
  return "unknown";
}

}  // namespace memforensics::format::trace
