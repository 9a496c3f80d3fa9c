// cupti_stacks_test.cc: backtraces -> interned trace stacks (no CUDA needed).
#include "capture/cupti_stacks.h"

#include <execinfo.h>
#include <gtest/gtest.h>

#include <string>

#include "format/load/snapshot_trace.h"

namespace memforensics::capture::cupti {

// External linkage, exported (ENABLE_EXPORTS) and not inlined, so that dladdr names it.
__attribute__((noinline, visibility("default"))) int stacksTestCaptureHere(void** pcs, int n) {
  int got = backtrace(pcs, n);
  asm volatile("" ::: "memory");
  return got;
}

namespace {

namespace ft = format::trace;

// Writes one alloc with `stack` and reads the trace back.
format::Snapshot roundTrip(ft::VectorSink& sink, ft::TraceWriter& w, uint32_t stack) {
  ft::TraceEvent e;
  e.action = 3;  // segment_alloc
  e.addr = 0x1000;
  e.size = 512;
  e.stack = stack;
  EXPECT_TRUE(w.event(e).ok());
  e.action = 0;
  EXPECT_TRUE(w.event(e).ok());
  EXPECT_TRUE(w.close().ok());
  auto snap = format::readSnapshotTrace(sink.data);
  EXPECT_TRUE(snap.ok());
  return snap.ok() ? std::move(snap).value() : format::Snapshot{};
}

TEST(CuptiStacks, SymbolizesInnermostFirst) {
  void* pcs[32];
  int n = stacksTestCaptureHere(pcs, 32);
  ASSERT_GT(n, 2);
  ft::VectorSink sink;
  ft::TraceWriter w(sink);
  ASSERT_TRUE(w.begin(ft::TraceMeta{}).ok());
  StackSymbolizer sym(w,
                      StackSymbolizer::defaultSkipModules());  // (under ASan: libasan's frame goes)
  uint32_t id = sym.intern({pcs, static_cast<size_t>(n)});
  EXPECT_GT(id, ft::kTraceRootStack);
  // The same PCs give the same stack id (frames and nodes are interned).
  EXPECT_EQ(sym.intern({pcs, static_cast<size_t>(n)}), id);
  format::Snapshot snap = roundTrip(sink, w, id);
  ASSERT_EQ(snap.events.size(), 2u);
  auto frames = snap.stacks.stack(snap.events[1].stack);
  ASSERT_LE(frames.size(), static_cast<size_t>(n));
  ASSERT_GE(frames.size(), 2u);
  const auto& inner = snap.stacks.frame(frames[0]);
  EXPECT_NE(std::string(snap.strings.get(inner.name))
                .find("memforensics::capture::cupti::stacksTestCaptureHere(void**, int)"),
            std::string::npos)
      << snap.strings.get(inner.name);
  EXPECT_NE(std::string(snap.strings.get(inner.filename)).find("cupti_stacks_test"),
            std::string::npos);
  EXPECT_EQ(inner.line, format::kUnknownLine);
  // A function dladdr cannot name (internal linkage: the test body) is its offset in the object.
  const auto& caller = snap.stacks.frame(frames[1]);
  EXPECT_EQ(std::string(snap.strings.get(caller.name)).rfind("0x", 0), 0u)
      << snap.strings.get(caller.name);
}

TEST(CuptiStacks, DropsCaptureFramesAtTheInnermostEnd) {
  void* pcs[32];
  int n = stacksTestCaptureHere(pcs, 32);
  ft::VectorSink sink;
  ft::TraceWriter w(sink);
  ASSERT_TRUE(w.begin(ft::TraceMeta{}).ok());
  // Treat the test binary as "capture machinery": its frames at the innermost end go, the first
  // frame kept is in another object (gtest's or libc's).
  auto skip = StackSymbolizer::defaultSkipModules();
  skip.push_back("cupti_stacks_test");
  StackSymbolizer sym(w, skip);
  uint32_t id = sym.intern({pcs, static_cast<size_t>(n)});
  format::Snapshot snap = roundTrip(sink, w, id);
  auto frames = snap.stacks.stack(snap.events[1].stack);
  ASSERT_FALSE(frames.empty());
  ASSERT_LT(frames.size(), static_cast<size_t>(n));
  EXPECT_EQ(std::string(snap.strings.get(snap.stacks.frame(frames[0]).filename))
                .find("cupti_stacks_test"),
            std::string::npos);
}

TEST(CuptiStacks, EmptyAndUnknownAddresses) {
  ft::VectorSink sink;
  ft::TraceWriter w(sink);
  ASSERT_TRUE(w.begin(ft::TraceMeta{}).ok());
  StackSymbolizer sym(w, StackSymbolizer::defaultSkipModules());
  EXPECT_EQ(sym.intern({}), ft::kTraceRootStack);
  void* bogus[1] = {reinterpret_cast<void*>(uintptr_t{0x10})};
  uint32_t id = sym.intern({bogus, 1});
  format::Snapshot snap = roundTrip(sink, w, id);
  auto frames = snap.stacks.stack(snap.events[1].stack);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(snap.strings.get(snap.stacks.frame(frames[0]).filename), "??");
  EXPECT_EQ(snap.strings.get(snap.stacks.frame(frames[0]).name), "0x10");
}

}  // namespace
}  // namespace memforensics::capture::cupti
