// memory.h: page-level hints for the few very large arrays a snapshot load builds.
#pragma once

#include <cstddef>
#include <vector>

namespace memforensics {

// Asks the kernel to back [p, p + bytes) with transparent huge pages (Linux, THP in "madvise"
// mode, the common default). Filling a freshly reserved 100 MB array then takes ~50 page faults
// instead of ~25,000; on the project machine first-touch faults were a third of a large load.
// A hint: harmless where unsupported.
void adviseHugePages(void* p, size_t bytes);

template <typename T>
void reserveHuge(std::vector<T>& v, size_t n) {
  v.reserve(n);
  if (v.capacity() * sizeof(T) >= (size_t{8} << 20))
    adviseHugePages(v.data(), v.capacity() * sizeof(T));
}

}  // namespace memforensics
