// alloc_conf.cc: the allocator's settings and their one parser (see alloc_conf.h).
#include "replay/alloc_conf.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace memforensics::replay {

namespace {

bool parseBool(const std::string& v, bool* out) {
  if (v == "True" || v == "true" || v == "1") return *out = true, true;
  if (v == "False" || v == "false" || v == "0") return *out = false, true;
  return false;
}

bool parseUint(const std::string& v, uint64_t* out) {
  if (v.empty() || v.size() > 12) return false;
  uint64_t r = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return false;
    r = r * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = r;
  return true;
}

bool divisionOk(uint64_t n) {
  return n <= kMaxRoundupDivisions && (n & (n - 1)) == 0;
}

// CCA parseRoundUpPower2Divisions, list form "[256:1,512:2,>:4]" (spaces ignored, as its lexer
// does): each MB:N entry, MB a power of two, sets the interval of sizes in [MB, 2 x MB) MiB
// (interval index log2(MB), clamped to the 16 intervals from 1 MiB); the first entry also fills
// every interval below it; ">:N" fills every interval after the last entry's. N is a power of two
// or 0 (off). Intervals no entry reaches stay 0. (PyTorch releases before the fix of ">" filled
// from the last entry's own interval, overwriting it; this follows the current source.)
std::string parseDivisionList(const std::string& raw, uint32_t out[16]) {
  std::string v;
  for (char c : raw) {
    if (c != ' ') v += c;
  }
  const std::string bad = "roundup_power2_divisions list '" + raw + "': ";
  if (v.size() < 2 || v.back() != ']') return bad + "expected [MB:N,...] ending in ]";
  const std::string body = v.substr(1, v.size() - 2);
  if (body.empty()) return bad + "no entries";
  uint32_t d[16] = {};
  bool first = true;
  size_t last_index = 0;
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    if (comma == std::string::npos) comma = body.size();
    const std::string entry = body.substr(pos, comma - pos);
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) return bad + "entry '" + entry + "' is not MB:N";
    const std::string lhs = entry.substr(0, colon), rhs = entry.substr(colon + 1);
    uint64_t n = 0;
    if (!parseUint(rhs, &n) || !divisionOk(n))
      return bad + "divisions '" + rhs + "' must be a power of two up to " +
             std::to_string(kMaxRoundupDivisions) + " or 0";
    if (lhs == ">") {
      // CCA fills from last_index + 1, last_index starting at 0: a lone ">:N" leaves < 2 MiB.
      for (size_t k = last_index + 1; k < 16; ++k) d[k] = static_cast<uint32_t>(n);
    } else {
      uint64_t mb = 0;
      if (!parseUint(lhs, &mb) || mb == 0 || (mb & (mb - 1)) != 0)
        return bad + "interval '" + lhs + "' must be a power of two (MB) or >";
      const size_t index = std::min<size_t>(63 - static_cast<size_t>(__builtin_clzll(mb)), 15);
      if (first) {
        for (size_t k = 0; k < index; ++k) d[k] = static_cast<uint32_t>(n);
        first = false;
      }
      d[index] = static_cast<uint32_t>(n);
      last_index = index;
    }
    pos = comma + 1;
  }
  std::copy(std::begin(d), std::end(d), out);
  return "";
}

}  // namespace

std::vector<AllocConfEntry> splitAllocConf(std::string_view conf) {
  std::vector<AllocConfEntry> out;
  std::string item;
  int depth = 0;
  auto flush = [&] {
    if (!item.empty()) {
      const size_t colon = item.find(':');
      if (colon == std::string::npos)
        out.push_back({item, ""});
      else
        out.push_back({item.substr(0, colon), item.substr(colon + 1)});
    }
    item.clear();
  };
  for (char c : conf) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    if (c == '[') ++depth;
    if (c == ']' && depth > 0) --depth;
    if (c == ',' && depth == 0) {
      flush();
      continue;
    }
    item += c;
  }
  flush();
  return out;
}

namespace {

// What PyTorch itself can have recorded: whole MiB from 20 (parseMaxSplitSize takes >= 20 since
// 2.9; older releases > 20), or unlimited.
bool splitSizeOk(int64_t v) {
  return v <= 0 || (v >= static_cast<int64_t>(alloc::kLargeBuffer) && v % 1048576 == 0);
}
bool gcThresholdOk(double v) {
  return v == 0.0 || (v > 0.0 && v < 1.0);  // NaN fails both
}
// CCA takes any power of two (kMaxRoundupDivisions bounds only what --set offers).
bool divisionsOk(const format::AllocatorSettings& a) {
  return !a.has_roundup ||
         std::all_of(std::begin(a.roundup_power2_divisions), std::end(a.roundup_power2_divisions),
                     [](uint32_t d) { return (d & (d - 1)) == 0; });
}

}  // namespace

std::vector<std::string> refusedFileSettings(const format::AllocatorSettings& a) {
  std::vector<std::string> out;
  if (!splitSizeOk(a.max_split_size))
    out.push_back("max_split_size: " + std::to_string(a.max_split_size) +
                  " B, where PyTorch takes whole MiB from 20 MiB (or unlimited)");
  if (!gcThresholdOk(a.garbage_collection_threshold)) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%g", a.garbage_collection_threshold);
    out.push_back(std::string("garbage_collection_threshold: ") + buf +
                  ", where PyTorch takes a number strictly between 0 and 1 (0: off)");
  }
  if (!divisionsOk(a))
    out.push_back("roundup_power2_divisions: a division that is not a power of two (0: off)");
  return out;
}

AllocConf allocConfOf(const format::Snapshot& snap) {
  AllocConf s;
  const auto& a = snap.settings;
  if (a.max_split_size > 0 && splitSizeOk(a.max_split_size))
    s.max_split_size = static_cast<uint64_t>(a.max_split_size);
  s.expandable_segments = a.expandable_segments;
  if (a.has_roundup && divisionsOk(a))
    std::copy(std::begin(a.roundup_power2_divisions), std::end(a.roundup_power2_divisions),
              s.divisions);
  if (gcThresholdOk(a.garbage_collection_threshold))
    s.gc_threshold = a.garbage_collection_threshold;
  for (const AllocConfEntry& e : splitAllocConf(a.conf)) {
    // Not recorded in allocator_settings in any version; only the config string can tell.
    uint64_t mb = 0;
    if (e.key == "max_non_split_rounding_mb" && parseUint(e.value, &mb) && mb > 0 &&
        mb <= (uint64_t{1} << 30))
      s.max_non_split_rounding = mb << 20;
    // Files before 2.3 record no allocator_settings; a string that turns them on is enough.
    bool on = false;
    if (e.key == "expandable_segments" && parseBool(e.value, &on) && on)
      s.expandable_segments = true;
  }
  return s;
}

std::string applyAllocSetting(AllocConf& s, const std::string& key, const std::string& value) {
  if (key == "expandable_segments") {
    if (!parseBool(value, &s.expandable_segments))
      return "expandable_segments takes True or False, not '" + value + "'";
    return "";
  }
  if (key == "max_split_size_mb") {
    if (value == "unlimited" || value == "none") {
      s.max_split_size = ~uint64_t{0};
      return "";
    }
    uint64_t mb = 0;
    // CCA parseArgs: max_split_size_mb must be > kLargeBuffer / 1 MiB (20).
    if (!parseUint(value, &mb) || mb <= alloc::kLargeBuffer / 1048576 || mb > (uint64_t{1} << 30))
      return "max_split_size_mb takes a number of MiB above 20 (or 'unlimited'), not '" + value +
             "'";
    s.max_split_size = mb << 20;
    return "";
  }
  if (key == "max_non_split_rounding_mb") {
    uint64_t mb = 0;
    if (!parseUint(value, &mb) || mb > (uint64_t{1} << 30))
      return "max_non_split_rounding_mb takes a number of MiB, not '" + value + "'";
    s.max_non_split_rounding = mb << 20;
    return "";
  }
  if (key == "roundup_power2_divisions") {
    if (!value.empty() && value.front() == '[') return parseDivisionList(value, s.divisions);
    uint64_t n = 0;
    // One value for every size interval.
    if (!parseUint(value, &n) || !divisionOk(n))
      return "roundup_power2_divisions takes a power of two up to " +
             std::to_string(kMaxRoundupDivisions) + " (0 = off) or a [MB:N,...,>:N] list, not '" +
             value + "'";
    for (uint32_t& d : s.divisions) d = static_cast<uint32_t>(n);
    return "";
  }
  if (key == "garbage_collection_threshold") {
    char* end = nullptr;
    double v = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size() || !(v > 0.0 && v < 1.0))
      return "garbage_collection_threshold takes a number strictly between 0 and 1, not '" + value +
             "'";
    s.gc_threshold = v;
    return "";
  }
  if (key.rfind("pinned_", 0) == 0)
    return key + " is a pinned (host) memory setting: it does not change device memory";
  if (key == "backend" || key == "release_lock_on_cudamalloc")
    return key + " does not change where or how much device memory is cached";
  return "unknown allocator setting '" + key +
         "' (what-if knows expandable_segments, max_split_size_mb, max_non_split_rounding_mb, "
         "roundup_power2_divisions, garbage_collection_threshold)";
}

std::string describeDivisions(const uint32_t divisions[16]) {
  const bool same =
      std::all_of(divisions, divisions + 16, [&](uint32_t d) { return d == divisions[0]; });
  if (same) return std::to_string(divisions[0]);
  // Runs of equal intervals: "[<256MiB:1,256-511MiB:2,>=512MiB:4]".
  std::string out = "[";
  for (size_t a = 0; a < 16;) {
    size_t b = a;
    while (b + 1 < 16 && divisions[b + 1] == divisions[a]) ++b;
    if (out.size() > 1) out += ",";
    const uint64_t lo = uint64_t{1} << a, hi = (uint64_t{2} << b) - 1;  // MiB
    if (a == 0 && b == 15) {
      out += "all";
    } else if (a == 0) {
      out.append("<").append(std::to_string(hi + 1)).append("MiB");
    } else if (b == 15) {
      out.append(">=").append(std::to_string(lo)).append("MiB");
    } else {
      out.append(std::to_string(lo)).append("-").append(std::to_string(hi)).append("MiB");
    }
    out.append(":").append(std::to_string(divisions[a]));
    a = b + 1;
  }
  return out + "]";
}

std::string describeAllocConf(const AllocConf& s) {
  std::string out = "expandable_segments=";
  out += s.expandable_segments ? "True" : "False";
  out += " max_split_size_mb=";
  out += s.max_split_size == ~uint64_t{0} ? std::string("unlimited")
                                          : std::to_string(s.max_split_size >> 20);
  out += " roundup_power2_divisions=";
  out += describeDivisions(s.divisions);
  out += " garbage_collection_threshold=";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s.gc_threshold);
  out += buf;
  return out;
}

}  // namespace memforensics::replay
