// memory_test.cc: common/memory.h: the growth of the loaders' large arrays, glibc's settings, the
// heap's huge-page mode, the input prefetcher and pages released behind a reader.
#include <gtest/gtest.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/memory.h"
#include "common/sanitizers.h"

namespace memforensics {
namespace {

// The line starting with `key` in the /proc/self/smaps entry of the mapping that holds `addr`
// ("" when none does).
std::string smapsLineAt(uintptr_t addr, const std::string& key) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    unsigned long long b = 0, e = 0;
    char dash = 0;
    std::istringstream head(line);
    if (line.rfind(key, 0) == 0) {
      if (inside) return line;
      continue;
    }
    if (head >> std::hex >> b >> dash >> e && dash == '-' && line.find(':') > line.find(' ')) {
      inside = addr >= b && addr < e;
    }
  }
  return "";
}

// The resident kB of the mapping that holds `addr` (-1: none).
long rssKbAt(uintptr_t addr) {
  const std::string line = smapsLineAt(addr, "Rss:");
  return line.empty() ? -1 : std::stol(line.substr(4));
}

// A read-only mapping of a fresh file of `bytes` bytes (1 in each byte).
struct FileMapping {
  explicit FileMapping(size_t n) : bytes(n) {
    char name[] = "/tmp/memf_memory_test_XXXXXX";
    int fd = ::mkstemp(name);
    if (fd < 0) return;
    ::unlink(name);
    std::vector<uint8_t> ones(size_t{1} << 20, 1);
    bool ok = true;
    for (size_t done = 0; done < n && ok; done += ones.size())
      ok = ::write(fd, ones.data(), ones.size()) == static_cast<ssize_t>(ones.size());
    void* m = ok ? ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    ::close(fd);
    p = m == MAP_FAILED ? nullptr : static_cast<const uint8_t*>(m);
  }
  ~FileMapping() {
    if (p) ::munmap(const_cast<uint8_t*>(p), bytes);
  }
  const uint8_t* p = nullptr;
  size_t bytes;
};

// The prefetcher maps the window ahead of the reader's position and no more; released pages
// leave the mapping's resident set and read back unchanged. The prefetcher starts at 16 MiB into
// the file, so its thread's first window is known whenever the thread starts (starting at the
// file's head, it could map the head's window before the test's advance moved it on).
TEST(MemoryInput, PrefetchMapsOneWindowAheadAndReleasedPagesReadBackTheSame) {
  constexpr size_t kBytes = size_t{48} << 20;
  constexpr size_t kStart = size_t{16} << 20;
  constexpr size_t kWindow = InputPrefetcher::kWindow;
  FileMapping f(kBytes);
  ASSERT_NE(f.p, nullptr);
  const auto at = reinterpret_cast<uintptr_t>(f.p);
  // Waits (bounded) until the thread has mapped `bytes`; a kernel without MADV_POPULATE_READ
  // maps nothing.
  auto waitFor = [](const InputPrefetcher& pf, uint64_t bytes) {
    for (int i = 0; i < 5000 && pf.populatedBytes() < bytes; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  {
    InputPrefetcher pf(f.p + kStart, f.p + kBytes);
    waitFor(pf, kWindow);
    if (pf.populatedBytes() == 0) {
      pf.stop();
      GTEST_SKIP() << "no MADV_POPULATE_READ here";
    }
    // The reader moves a window and a half on: the thread maps the window ahead of the new
    // position, not the half window it skipped.
    pf.advance(f.p + kStart + kWindow + kWindow / 2);
    waitFor(pf, 2 * kWindow);
    pf.stop();
    EXPECT_EQ(pf.populatedBytes(), 2 * kWindow);
    long kb = rssKbAt(at);
    EXPECT_GE(kb, static_cast<long>((2 * kWindow) >> 10));
    EXPECT_LE(kb, static_cast<long>(((2 * kWindow) >> 10) + 1024));
  }
  releaseMappedPages(f.p + kStart, 3 * kWindow);
  EXPECT_LE(rssKbAt(at), 1024);
  size_t sum = 0;
  for (size_t i = 0; i < kBytes; i += 4096) sum += f.p[i];
  EXPECT_EQ(sum, kBytes / 4096);
  // A small input gets no thread.
  InputPrefetcher small(f.p, f.p + (size_t{1} << 20));
  small.advance(f.p);
  small.stop();
  EXPECT_EQ(small.populatedBytes(), 0u);
}

// growFor: the elements survive every step, and an array of 3 M elements reaches its size in a
// few steps when the prediction says so (at most kMaxGrowthFactor at a time).
TEST(MemoryGrowth, GrowForKeepsTheElementsAndFollowsThePrediction) {
  std::vector<uint64_t> v;
  size_t grows = 0;
  for (uint64_t i = 0; i < 3'000'000; ++i) {
    size_t cap = v.capacity();
    growFor(v, 1, v.size() < 4096 ? 0 : 3'000'000, size_t{1} << 30);
    if (v.capacity() != cap) {
      ++grows;
      if (cap != 0) {
        EXPECT_LE(v.capacity(), cap * kMaxGrowthFactor);
      }
    }
    v.push_back(i * 3);
  }
  for (uint64_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], i * 3);
  EXPECT_LE(grows, 5u);
  // Never past `most` in one step.
  std::vector<uint32_t> w(4096);
  growFor(w, 1, size_t{1} << 40, 10'000);
  EXPECT_EQ(w.capacity(), 10'000u);
}

// A sanitizer's allocator replaces glibc's malloc and ignores mallopt (ASan's returns 0), so
// neither the settings nor the arenas' huge-page mode apply there.
constexpr bool kGlibcMalloc = !kSanitizerRuntime;

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
  return smapsLineAt(addr, "VmFlags:");
}

bool hugePageAdvised(uintptr_t addr) {
  std::string flags = vmFlagsAt(addr);
  return flags.find(" hg") != std::string::npos;
}

// A large array turns the heap's huge-page mode on: the main arena's heap is advised (as far as
// it has grown). Where the allocator is not glibc's (configureAllocator not applied), the mode
// stays off and nothing is advised.
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
#endif
}

// Maps a fresh 64 KiB file, truncates it to 0 bytes and reads past the new end (SIGBUS), with the
// mapping registered as an input or not.
void readTruncatedMapping(bool registered) {
  installMappedInputFaultHandler();
  char name[] = "/tmp/memf_fault_in_XXXXXX";
  int fd = ::mkstemp(name);
  if (fd < 0) std::_Exit(3);
  ::unlink(name);
  std::vector<uint8_t> bytes(size_t{64} << 10, 7);
  if (::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) std::_Exit(3);
  void* m = ::mmap(nullptr, bytes.size(), PROT_READ, MAP_PRIVATE, fd, 0);
  if (m == MAP_FAILED || ::ftruncate(fd, 0) != 0) std::_Exit(3);
  std::optional<MappedInput> input;
  if (registered) input.emplace(m, bytes.size());
  volatile uint8_t past = static_cast<const uint8_t*>(m)[size_t{32} << 10];
  (void)past;
  std::_Exit(0);  // not reached: the read faults
}

// A registered input truncated under its reader: exit status 2 and the handler's message. The
// same fault in a mapping nobody registered (or a SIGBUS sent by kill) keeps its default action.
TEST(MemoryInputDeathTest, ATruncatedInputExitsTwoAndOtherBusErrorsStaySignals) {
  if (!kGlibcMalloc) GTEST_SKIP() << "a sanitizer's runtime handles SIGBUS itself";
  EXPECT_EXIT(readTruncatedMapping(true), ::testing::ExitedWithCode(2),
              "an input file changed while it was being read");
  EXPECT_EXIT(readTruncatedMapping(false), ::testing::KilledBySignal(SIGBUS), "");
  EXPECT_EXIT(
      {
        installMappedInputFaultHandler();
        ::raise(SIGBUS);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

}  // namespace
}  // namespace memforensics
