// capture_api_test.cc: memforensics::start/stop (src/capture/memforensics_capture.h), and what a
// file looks like after the process writing it gets SIGTERM, SIGINT or SIGKILL (forked children;
// the parent reads what they left).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "capture/memforensics_capture.h"
#include "capture/recorder.h"
#include "capture_test_util.h"
#include "format/load/load.h"

namespace mc = memforensics::capture;
namespace mt = memforensics::format::trace;
using mc::testing::readBytes;
using mc::testing::readTrace;
using mc::testing::tempPath;

namespace {

// The i-th record of a deterministic stream: alloc, free_requested, free_completed of one block.
mc::CaptureRecord nth(uint64_t i) {
  mc::CaptureRecord r;
  r.action = static_cast<uint8_t>(i % 3);
  r.addr = 0x10000000 + ((i / 3) % 4096) * 512;
  r.size = 100 + (i / 3) % 1000;
  r.stream = 3;
  return r;
}

bool matchesNth(const mt::TraceEvent& e, uint64_t i) {
  mc::CaptureRecord r = nth(i);
  return e.action == r.action && e.addr == r.addr && e.size == r.size && e.stream == r.stream &&
         e.device == 0;
}

memforensics::CaptureOptions quietOptions() {
  memforensics::CaptureOptions o;
  o.devices = 2;
  o.handle_signals = false;
  o.stop_at_exit = false;
  return o;
}

TEST(CaptureApi, StartSubmitStop) {
  const std::string path = tempPath("api.bin");
  EXPECT_FALSE(memforensics::isRecording());
  EXPECT_FALSE(mc::submit(nth(0)));  // nothing recording: refused, harmless
  ASSERT_TRUE(memforensics::start(path, quietOptions()).ok());
  EXPECT_TRUE(memforensics::isRecording());
  EXPECT_FALSE(memforensics::start(tempPath("second.bin"), quietOptions()).ok());  // one at a time
  for (uint64_t i = 0; i < 3000; ++i) {
    while (!mc::submit(nth(i))) std::this_thread::yield();
  }
  EXPECT_TRUE(memforensics::flush());
  EXPECT_EQ(memforensics::captureStats().written, 3000u);
  ASSERT_TRUE(memforensics::stop().ok());
  EXPECT_FALSE(memforensics::isRecording());
  EXPECT_TRUE(memforensics::stop().ok());  // idempotent
  EXPECT_FALSE(mc::submit(nth(0)));
  auto back = readTrace(readBytes(path));
  ASSERT_TRUE(back.end.complete);
  ASSERT_EQ(back.events.size(), 3000u);
  for (uint64_t i = 0; i < 3000; ++i) EXPECT_TRUE(matchesNth(back.events[i], i)) << i;
}

TEST(CaptureApi, StartAgainAfterStop) {
  for (int round = 0; round < 3; ++round) {
    const std::string path = tempPath("again.bin");
    ASSERT_TRUE(memforensics::start(path, quietOptions()).ok());
    ASSERT_TRUE(mc::submit(nth(0)));
    ASSERT_TRUE(memforensics::stop().ok());
    EXPECT_EQ(readTrace(readBytes(path)).events.size(), 1u);
  }
}

TEST(CaptureApi, ManyProducerThreadsOnDifferentDevices) {
  const std::string path = tempPath("threads.bin");
  auto o = quietOptions();
  o.devices = 4;
  ASSERT_TRUE(memforensics::start(path, o).ok());
  std::vector<std::thread> ts;
  for (uint32_t d = 0; d < 4; ++d) {
    ts.emplace_back([d] {
      for (uint64_t i = 0; i < 20000; ++i) {
        mc::CaptureRecord r = nth(i);
        r.device = d;
        while (!mc::submit(r)) std::this_thread::yield();
      }
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_TRUE(memforensics::stop().ok());
  auto back = readTrace(readBytes(path));
  ASSERT_EQ(back.events.size(), 80000u);
  std::vector<uint64_t> next(4, 0);
  for (const auto& e : back.events) {
    mt::TraceEvent x = e;
    x.device = 0;
    ASSERT_TRUE(matchesNth(x, next[e.device]++));
  }
}

// Runs `child` in a forked process and returns its wait status.
template <typename F>
int inChild(F&& child) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    child();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(CaptureSignals, SigtermFinishesTheFileThenTerminates) {
  const std::string path = tempPath("sigterm.bin");
  int status = inChild([&] {
    memforensics::CaptureOptions o;
    o.flush_interval_ms = 3600000;  // nothing reaches the file but through the signal
    o.stop_at_exit = false;
    if (!memforensics::start(path, o).ok()) _exit(3);
    for (uint64_t i = 0; i < 5000; ++i) {
      while (!mc::submit(nth(i))) std::this_thread::yield();
    }
    raise(SIGTERM);
    _exit(4);  // not reached: the default action of SIGTERM ends the process
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exit code " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  auto back = readTrace(readBytes(path));
  EXPECT_TRUE(back.end.complete) << back.end.reason;
  EXPECT_TRUE(back.final_state);
  ASSERT_EQ(back.events.size(), 5000u);
  for (uint64_t i = 0; i < 5000; ++i) ASSERT_TRUE(matchesNth(back.events[i], i)) << i;
  auto snap = memforensics::format::loadSnapshotFile(path);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  EXPECT_TRUE(snap->load_warnings.empty());
}

volatile sig_atomic_t g_previous_handler_ran = 0;
void previousHandler(int) {
  g_previous_handler_ran = 1;
}

TEST(CaptureSignals, SigintFlushesAndChainsToThePreviousHandler) {
  const std::string path = tempPath("sigint.bin");
  int status = inChild([&] {
    signal(SIGINT, &previousHandler);  // e.g. Python's KeyboardInterrupt handler
    memforensics::CaptureOptions o;
    o.flush_interval_ms = 3600000;
    o.stop_at_exit = false;
    if (!memforensics::start(path, o).ok()) _exit(3);
    for (uint64_t i = 0; i < 2000; ++i) {
      while (!mc::submit(nth(i))) std::this_thread::yield();
    }
    raise(SIGINT);
    if (!g_previous_handler_ran) _exit(5);
    // Flushed, still recording: the file holds every event but no trailer yet.
    auto mid = readTrace(readBytes(path));
    if (mid.events.size() != 2000 || mid.end.complete) _exit(6);
    if (!mc::submit(nth(2000))) _exit(7);
    if (!memforensics::stop().ok()) _exit(8);
    _exit(0);
  });
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  auto back = readTrace(readBytes(path));
  EXPECT_TRUE(back.end.complete);
  EXPECT_EQ(back.events.size(), 2001u);
}

TEST(CaptureSignals, ExitFinishesTheFile) {
  const std::string path = tempPath("atexit.bin");
  int status = inChild([&] {
    memforensics::CaptureOptions o;
    o.flush_interval_ms = 3600000;
    o.handle_signals = false;
    if (!memforensics::start(path, o).ok()) _exit(3);
    for (uint64_t i = 0; i < 100; ++i) mc::submit(nth(i));
    exit(0);  // atexit: stop()
  });
  ASSERT_TRUE(WIFEXITED(status));
  auto back = readTrace(readBytes(path));
  EXPECT_TRUE(back.end.complete);
  EXPECT_EQ(back.events.size(), 100u);
}

// kill -9 a child that is streaming: the file reads back up to its last complete chunk, and what
// it holds is exactly the start of what the child recorded.
TEST(CaptureSignals, SigkilledWriterLeavesAReadablePrefix) {
  const std::string path = tempPath("sigkill.bin");
  pid_t pid = fork();
  if (pid == 0) {
    mc::RecorderOptions o;
    o.flush_interval_ms = 5;
    o.chunk_bytes = 4096;
    o.zstd_level = 0;
    auto r = mc::Recorder::create(path, o);
    if (!r.ok()) _exit(3);
    for (uint64_t i = 0;; ++i) {
      while (!(*r)->record(nth(i))) std::this_thread::yield();
    }
  }
  // Wait until several chunks have been written, then kill without warning.
  for (;;) {
    struct stat st {};
    if (stat(path.c_str(), &st) == 0 && st.st_size > (256 << 10)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_EQ(WTERMSIG(status), SIGKILL);

  auto back = readTrace(readBytes(path));
  EXPECT_FALSE(back.end.complete);
  EXPECT_FALSE(back.end.damaged) << back.end.reason;
  ASSERT_GT(back.events.size(), 0u);
  for (uint64_t i = 0; i < back.events.size(); ++i) ASSERT_TRUE(matchesNth(back.events[i], i)) << i;

  // The loader takes the killed-writer path: the prefix, a warning, the end state rebuilt.
  auto snap = memforensics::format::loadSnapshotFile(path);
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  EXPECT_EQ(snap->events.size(), back.events.size());
  bool incomplete = false;
  for (const auto& w : snap->load_warnings)
    incomplete |= w.find("incomplete native trace") != std::string::npos;
  EXPECT_TRUE(incomplete);
}

}  // namespace
