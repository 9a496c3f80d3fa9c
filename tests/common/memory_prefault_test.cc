// memory_prefault_test.cc: common/prefault.h populates ahead of the writer, within its window, and
// never changes what the buffer holds.
#include <gtest/gtest.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/memory.h"
#include "common/prefault.h"

namespace memforensics {
namespace {

// Resident pages of [p + from, p + to), counted with mincore.
size_t residentPages(const uint8_t* p, size_t from, size_t to) {
  size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((to - from + page - 1) / page);
  if (::mincore(const_cast<uint8_t*>(p + from), to - from, vec.data()) != 0) return ~size_t{0};
  size_t n = 0;
  for (unsigned char c : vec) n += c & 1;
  return n;
}

struct Mapping {
  explicit Mapping(size_t n) : bytes(n) {
    void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p = m == MAP_FAILED ? nullptr : static_cast<uint8_t*>(m);
  }
  ~Mapping() {
    if (p) ::munmap(p, bytes);
  }
  uint8_t* p = nullptr;
  size_t bytes;
};

TEST(MemoryPrefault, PopulatesAWindowAheadOfTheWriterAndKeepsTheContents) {
  const size_t kBytes = size_t{64} << 20;
  const size_t kUsed = size_t{20} << 20;
  Mapping m(kBytes);
  ASSERT_NE(m.p, nullptr);
  for (size_t i = 0; i < kUsed; ++i) m.p[i] = static_cast<uint8_t>(i * 131 + 7);
  Prefaulter pf;
  pf.track(0, m.p, kBytes, kUsed);
  pf.waitIdle();
  size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  size_t ahead = residentPages(m.p, kUsed, kUsed + kPrefaultWindowBytes);
  // Populated unless this kernel lacks MADV_POPULATE_WRITE (then nothing is, and nothing breaks).
  if (ahead != 0) EXPECT_EQ(ahead, kPrefaultWindowBytes / page);
  // Nothing past the window (plus the huge page the window ends in).
  size_t past = kUsed + kPrefaultWindowBytes + (size_t{2} << 20);
  EXPECT_EQ(residentPages(m.p, past, kBytes), 0u);
  // The writer moves on: the window moves with it.
  pf.advance(0, size_t{40} << 20);
  pf.waitIdle();
  if (ahead != 0) {
    EXPECT_EQ(residentPages(m.p, size_t{40} << 20, (size_t{40} << 20) + kPrefaultWindowBytes),
              kPrefaultWindowBytes / page);
  }
  pf.stop();
  for (size_t i = 0; i < kUsed; ++i) {
    if (m.p[i] != static_cast<uint8_t>(i * 131 + 7)) FAIL() << "byte " << i << " changed";
  }
  for (size_t i = kUsed; i < kBytes; i += 4096) ASSERT_EQ(m.p[i], 0) << i;
}

TEST(MemoryPrefault, UntrackedBuffersMayBeFreedAndSmallOnesAreLeftAlone) {
  Prefaulter pf;
  {
    Mapping m(size_t{32} << 20);
    ASSERT_NE(m.p, nullptr);
    pf.track(1, m.p, m.bytes, 0);
    pf.untrack(1);  // returns once no populate of it is in flight: freeing it is safe
  }
  Mapping small(kPrefaultMinBytes / 2);
  ASSERT_NE(small.p, nullptr);
  pf.track(2, small.p, small.bytes, 0);
  pf.waitIdle();
  EXPECT_EQ(residentPages(small.p, 0, small.bytes), 0u);
  pf.stop();
  pf.track(0, small.p, small.bytes, 0);  // after stop: nothing
  pf.advance(0, 1);
  pf.stop();
}

TEST(MemoryPrefault, GrowForTracksTheNewBufferAndKeepsTheElements) {
  Prefaulter pf;
  std::vector<uint64_t> v;
  for (uint64_t i = 0; i < 3'000'000; ++i) {
    growFor(v, 1, 0, size_t{1} << 30, &pf, 0);
    v.push_back(i * 3);
    if (i % 65536 == 0) pf.advance(0, v.size() * sizeof(uint64_t));
  }
  pf.stop();
  for (uint64_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], i * 3);
}

// A sanitizer's allocator replaces glibc's malloc and ignores mallopt (ASan's returns 0), so
// neither the settings nor the arenas' huge-page mode apply there.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kGlibcMalloc = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || \
    __has_feature(thread_sanitizer)
constexpr bool kGlibcMalloc = false;
#else
constexpr bool kGlibcMalloc = true;
#endif
#elif defined(__SANITIZE_THREAD__)
constexpr bool kGlibcMalloc = false;
#else
constexpr bool kGlibcMalloc = true;
#endif

// configureAllocator: a block of a few MB is carved from the arena (glibc's default would map it
// on its own from 128 KiB up, and unmap it on free), and what is freed stays in the arena for the
// next block, so that the next device's analysis reuses the pages the last one touched.
TEST(MemoryAllocator, MediumBlocksComeFromTheArenaAndFreedMemoryIsKept) {
  AllocatorSettings want = defaultAllocatorSettings();
  EXPECT_EQ(want.mmap_threshold, size_t{8} << 20);
  EXPECT_EQ(want.trim_threshold, size_t{128} << 20);
  EXPECT_EQ(want.top_pad, size_t{64} << 20);
  AllocatorSettings got = configureAllocator();
  EXPECT_EQ(got.mmap_threshold, want.mmap_threshold);
  EXPECT_EQ(got.trim_threshold, want.trim_threshold);
  EXPECT_EQ(got.top_pad, want.top_pad);
#if defined(__GLIBC__)
  if (!kGlibcMalloc) {
    EXPECT_FALSE(got.applied);
    return;
  }
  ASSERT_TRUE(got.applied);
  size_t mapped_before = ::mallinfo2().hblks;
  constexpr size_t kBlock = size_t{4} << 20;
  auto* a = static_cast<uint8_t*>(std::malloc(kBlock));
  ASSERT_NE(a, nullptr);
  std::memset(a, 1, kBlock);
  EXPECT_EQ(::mallinfo2().hblks, mapped_before);  // not a mapping of its own
  std::free(a);
  EXPECT_GE(::mallinfo2().fordblks, kBlock);  // kept in the arena, not given back
  auto* b = static_cast<uint8_t*>(std::malloc(kBlock));
  ASSERT_NE(b, nullptr);
  std::memset(b, 2, 4096);
  EXPECT_EQ(::mallinfo2().hblks, mapped_before);
  std::free(b);
  // Blocks larger than the free memory at the arena's top and past the threshold are still
  // mapped on their own (and so unmapped when freed).
  auto* c = static_cast<uint8_t*>(std::malloc(size_t{256} << 20));
  ASSERT_NE(c, nullptr);
  std::memset(c, 1, 4096);
  EXPECT_EQ(::mallinfo2().hblks, mapped_before + 1);
  std::free(c);
  EXPECT_EQ(::mallinfo2().hblks, mapped_before);
  // A setting the allocator refuses is reported, not hidden.
  AllocatorSettings bad;
  bad.mmap_threshold = size_t{1} << 40;
  EXPECT_FALSE(configureAllocator(bad).applied);
  configureAllocator();
#else
  EXPECT_FALSE(got.applied);
#endif
}

// The VmFlags line of the mapping of /proc/self/smaps that holds `addr` ("" when none does).
std::string vmFlagsAt(uintptr_t addr) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    unsigned long long b = 0, e = 0;
    char dash = 0;
    std::istringstream head(line);
    if (line.find("VmFlags:") == 0) {
      if (inside) return line;
      continue;
    }
    if (head >> std::hex >> b >> dash >> e && dash == '-' && line.find(':') > line.find(' ')) {
      inside = addr >= b && addr < e;
    }
  }
  return "";
}

bool hugePageAdvised(uintptr_t addr) {
  std::string flags = vmFlagsAt(addr);
  return flags.find(" hg") != std::string::npos;
}

// A large array turns the arenas' huge-page mode on: the main arena's heap is advised (as far as
// it has grown), and a pool thread's arena heap is advised when the thread asks.
// Where the allocator is not glibc's (configureAllocator not applied), the mode stays off and
// nothing is advised.
TEST(MemoryAllocator, ALargeArrayTurnsOnHugePagesForTheArenas) {
  const bool glibc = configureAllocator().applied;
  std::vector<uint64_t> big;
  reserveHuge(big, (size_t{16} << 20) / sizeof(uint64_t));
  EXPECT_EQ(heapHugePagesOn(), glibc);
  if (!glibc) {
    // Only a build whose malloc is not glibc's gets here.
#if defined(__GLIBC__)
    EXPECT_FALSE(kGlibcMalloc);
#endif
    EXPECT_EQ(enableHeapHugePages(), 0u);
    EXPECT_EQ(adviseThreadHeapHugePages(), 0u);
    return;
  }
#if defined(__linux__) && defined(__GLIBC__)
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  if (mode.find("[never]") != std::string::npos || mode.empty()) GTEST_SKIP() << "THP off";
  // The main heap grown by blocks under the mmap threshold (as an analysis grows it), then
  // advised as far as it has grown: at least those blocks, less the unaligned ends.
  constexpr size_t kGrowBlock = size_t{4} << 20;
  constexpr size_t kGrowBlocks = 8;
  void* grown[kGrowBlocks] = {};
  for (auto& g : grown) {
    g = std::malloc(kGrowBlock);
    ASSERT_NE(g, nullptr);
    static_cast<uint8_t*>(g)[0] = 1;
  }
  for (size_t i = kGrowBlocks; i > 0; --i) std::free(grown[i - 1]);
  size_t advised = enableHeapHugePages();
  EXPECT_GE(advised, kGrowBlocks * kGrowBlock - (size_t{4} << 20));
  // A block from the arena's top, under the mmap threshold: its first bytes may lie in the heap's
  // first, partly used huge page, which is left alone (the top can start there once the blocks
  // that grew it are freed), so its last byte, 4 MiB on and past that page, is the one checked.
  constexpr size_t kTopBlock = size_t{4} << 20;
  auto* small = static_cast<uint8_t*>(std::malloc(kTopBlock));
  ASSERT_NE(small, nullptr);
  small[kTopBlock - 1] = 1;
  auto last = reinterpret_cast<uintptr_t>(small) + kTopBlock - 1;
  EXPECT_TRUE(hugePageAdvised(last)) << vmFlagsAt(last);
  std::free(small);
  size_t thread_advised = 0;
  bool thread_flag = false;
  std::thread t([&] {
    thread_advised = adviseThreadHeapHugePages();
    auto* q = static_cast<uint8_t*>(std::malloc(size_t{1} << 20));
    if (q != nullptr) {
      q[0] = 1;
      thread_flag = hugePageAdvised(reinterpret_cast<uintptr_t>(q));
    }
    std::free(q);
  });
  t.join();
  // A new thread gets an arena of its own (or the main one, advised above, where glibc capped
  // the arenas): either way its blocks lie in advised memory.
  EXPECT_TRUE(thread_advised == size_t{64} << 20 || thread_advised == 0);
  EXPECT_TRUE(thread_flag);
#endif
}

}  // namespace
}  // namespace memforensics
