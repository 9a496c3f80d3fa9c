// alloc_conf.h: the caching allocator's settings (PYTORCH_CUDA_ALLOC_CONF) as the replay uses them,
// and the one parser of their spelling. The address-checking model, the what-if and the findings'
// tested fixes all read a file's settings through allocConfOf() and a user's KEY=VALUE through
// applyAllocSetting(). Sources: c10/cuda/CUDAAllocatorConfig.cpp (parseArgs and its key parsers),
// c10/cuda/CUDACachingAllocator.cpp (CCA).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/allocator_constants.h"
#include "format/model/snapshot.h"

namespace memforensics::replay {

// The largest roundup_power2_divisions value accepted (CCA takes any power of two; above 64 the
// steps are below 16 KiB even at 1 MiB and nothing measurable changes).
inline constexpr uint64_t kMaxRoundupDivisions = 64;

struct AllocConf {
  uint64_t max_split_size = ~uint64_t{0};                 // SIZE_MAX = unlimited
  uint64_t max_non_split_rounding = alloc::kLargeBuffer;  // max_non_split_rounding_mb
  bool expandable_segments = false;
  uint32_t divisions[16] = {};  // roundup_power2_divisions; index k covers [2^k, 2^(k+1)) MiB
  double gc_threshold = 0.0;    // garbage_collection_threshold; 0 = off
};

// The settings a file was recorded under: its allocator_settings, and for the keys no version
// records there (max_non_split_rounding_mb; expandable_segments before 2.3) its
// PYTORCH_CUDA_ALLOC_CONF string, read with parseAllocConf(). Values no PyTorch accepts
// (refusedFileSettings) are ignored: the default stands in for them.
AllocConf allocConfOf(const format::Snapshot& snap);

// The allocator_settings values of a file that PyTorch's own parser would refuse, each as "KEY:
// what it is, what PyTorch takes" (max_split_size below 20 MiB or not whole MiB; a
// garbage_collection_threshold outside (0, 1), NaN and infinities included; a roundup division
// that is not a power of two). A hostile or damaged file; analyze names them.
std::vector<std::string> refusedFileSettings(const format::AllocatorSettings& a);

// Applies one KEY=VALUE in PYTORCH_CUDA_ALLOC_CONF spelling; "" when accepted, else why not.
std::string applyAllocSetting(AllocConf& s, const std::string& key, const std::string& value);

// One entry of a PYTORCH_CUDA_ALLOC_CONF string.
struct AllocConfEntry {
  std::string key, value;
};
// Splits "key:value,key:value" as CCA's lexer does (spaces dropped; a [..] list is one value).
std::vector<AllocConfEntry> splitAllocConf(std::string_view conf);

// "expandable_segments=False max_split_size_mb=unlimited ..." for the output.
std::string describeAllocConf(const AllocConf& s);
// roundup_power2_divisions for the output: "4", or runs of intervals
// "[<256MiB:1,256-511MiB:2,>=512MiB:4]".
std::string describeDivisions(const uint32_t divisions[16]);

}  // namespace memforensics::replay
