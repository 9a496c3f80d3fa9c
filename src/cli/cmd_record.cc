// cmd_record.cc: `memforensics record [-o FILE] [--no-stacks] -- COMMAND ARGS...`.
//
// Runs COMMAND with CUDA_INJECTION64_PATH naming libmemforensics_cupti.so and
// MEMFORENSICS_CUPTI_OUT naming the trace; the CUDA driver loads the library when the command
// initialises CUDA, and the library writes the trace (src/capture/cupti_inject.cc). Afterwards: a
// one-line summary of what was recorded, or, when nothing was (no CUDA initialisation, no driver,
// library not built), an empty but valid trace and a note saying so. The exit status is the
// command's.
#include "cli/cmd_record.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "cli/load_cli.h"
#include "common/format_bytes.h"
#include "format/trace/trace_writer.h"

namespace memforensics::cli {

namespace {

namespace fs = std::filesystem;

constexpr const char* kLibraryName = "libmemforensics_cupti.so";

struct RecordArgs {
  std::string out;
  bool no_stacks = false;
  std::vector<std::string> command;
};
RecordArgs g_args;

volatile sig_atomic_t g_child = 0;

// Forwards a signal another process sent us (kill, a job scheduler) to the command. A signal from
// the terminal (Ctrl-C) reached the command already, being in our process group: not sent twice.
void forwardSignal(int sig, siginfo_t* info, void*) {
  if (g_child > 0 && info != nullptr && info->si_code <= 0) ::kill(g_child, sig);
}

// The injection library: $MEMFORENSICS_CUPTI_LIB, next to the executable, ../lib (installed),
// ../capture (build tree), then the path the build baked in.
std::string findLibrary(std::vector<std::string>& looked) {
  auto usable = [&](const fs::path& p) {
    looked.push_back(p.string());
    std::error_code ec;
    return fs::is_regular_file(p, ec);
  };
  if (const char* env = std::getenv("MEMFORENSICS_CUPTI_LIB"); env != nullptr && env[0] != '\0') {
    fs::path p = fs::absolute(env);
    if (usable(p)) return p.string();
  }
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path dir = exe.parent_path();
    for (const fs::path& p : {dir / kLibraryName, dir / ".." / "lib" / kLibraryName,
                              dir / ".." / "capture" / kLibraryName}) {
      if (usable(p)) return fs::weakly_canonical(p, ec).string();
    }
  }
#ifdef MEMF_CUPTI_LIBRARY
  if (usable(MEMF_CUPTI_LIBRARY)) return MEMF_CUPTI_LIBRARY;
#endif
  return {};
}

// Writes a valid native trace with no events (the capture found nothing to record).
Status writeEmptyTrace(const std::string& path) {
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  auto sink = format::trace::FileSink::create(tmp);
  if (!sink) return sink.error();
  format::trace::TraceWriter w(**sink);
  format::trace::TraceMeta meta;
  meta.producer = "memforensics 0.1.0 record";
  meta.source_format = "capture";
  meta.created_unix_us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  Status s = w.begin(meta);
  w.setFinalState({}, {});  // nothing was live: a complete file, not one cut short
  if (s.ok()) s = w.close();
  if (s.ok()) s = (*sink)->closeFile();
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0)
    s = Error{"cannot rename " + tmp + " to " + path, -1};
  if (!s.ok()) std::remove(tmp.c_str());
  return s;
}

// Other processes of the run (a second CUDA process finds the file taken and writes
// <stem>.<pid><ext>): files of that form modified since the run began.
std::vector<std::string> siblingTraces(const fs::path& out, fs::file_time_type since) {
  std::vector<std::string> found;
  std::string stem = out.stem().string(), ext = out.extension().string();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(out.parent_path(), ec)) {
    std::string name = entry.path().filename().string();
    if (name.size() <= stem.size() + ext.size() + 1 ||
        name.compare(0, stem.size() + 1, stem + ".") != 0 ||
        name.compare(name.size() - ext.size(), ext.size(), ext) != 0) {
      continue;
    }
    std::string mid = name.substr(stem.size() + 1, name.size() - stem.size() - 1 - ext.size());
    if (mid.empty() || mid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (entry.last_write_time(ec) >= since) found.push_back(entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// One line per recorded trace: events, devices and the peak reserved bytes per device.
bool summarize(const std::string& path) {
  auto snap = loadWithProgress(path, false);
  if (!snap) {
    std::cerr << "memforensics: error: " << snap.error().describe() << "\n";
    return false;
  }
  analysis::AnalyzeOptions opt;
  opt.findings = false;
  opt.top = 1;
  auto result = analysis::analyzeSnapshot(*snap, opt);
  size_t events = 0;
  std::string peaks;
  for (const auto& d : result.devices) {
    events += d.summary.events;
    if (!peaks.empty()) peaks += ", ";
    peaks += "device " + std::to_string(d.summary.device) + " " +
             formatBytes(d.summary.peak_reserved.bytes);
  }
  if (events == 0) {
    std::cerr << "memforensics: " << path
              << ": CUDA was initialised but no device memory allocation was seen (empty trace)\n";
  } else {
    std::cerr << "memforensics: " << path << ": " << events << " events on "
              << result.devices.size() << " device(s), peak reserved " << peaks
              << " (memforensics analyze " << path << ")\n";
  }
  return true;
}

}  // namespace

CLI::App* addRecordCommand(CLI::App& app) {
  auto* rc = app.add_subcommand(
      "record",
      "Run a command with the CUPTI injection library and record its device memory "
      "(record [-o FILE] -- COMMAND ARGS...)");
  rc->add_option("-o,--output", g_args.out,
                 "trace to write (default: memforensics-<pid>.bin, pid of the command)");
  rc->add_flag("--no-stacks", g_args.no_stacks, "do not capture host backtraces (lower overhead)");
  rc->add_option("COMMAND", g_args.command,
                 "the command and its arguments, after -- (needed when they contain options)")
      ->required();
  return rc;
}

int runRecordCommand() {
  const std::vector<std::string>& cmd = g_args.command;
  std::vector<std::string> looked;
  std::string library = findLibrary(looked);
  if (library.empty()) {
#ifdef MEMF_CUPTI_LIBRARY
    std::cerr << "memforensics: warning: " << kLibraryName << " not found (looked at";
    for (const auto& l : looked) std::cerr << " " << l;
    std::cerr << "): the command runs without recording\n";
#else
    std::cerr
        << "memforensics: note: this memforensics was built without the CUPTI injection library ("
        << kLibraryName
        << ": the CUDA toolkit with CUPTI was not found at build time): the command runs "
        << "without recording\n";
#endif
  }
  if (const char* prev = std::getenv("CUDA_INJECTION64_PATH");
      prev != nullptr && prev[0] != '\0' && !library.empty()) {
    std::cerr << "memforensics: warning: CUDA_INJECTION64_PATH was set (" << prev
              << "); replaced for the command\n";
  }

  // The output must not exist when the command starts (the library claims it exclusively), and
  // it must be creatable: checked now rather than after a long run.
  // (A second early: file times come from a coarser clock.)
  auto start_time = fs::file_time_type::clock::now() - std::chrono::seconds(1);
  auto prepare = [&](const std::string& path) -> bool {
    // Only a regular file (or a link) is replaced: removing a device node, a FIFO or a directory
    // entry to make room for the trace would destroy it (`record -o /dev/null` as root).
    struct stat existing {};
    if (::lstat(path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode) &&
        !S_ISLNK(existing.st_mode)) {
      std::cerr << "memforensics: error: " << path
                << " is not a regular file: record writes a new native trace file there and does "
                   "not replace "
                   "devices, FIFOs or directories\n";
      return false;
    }
    std::error_code ec;
    fs::remove(path, ec);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::cerr << "memforensics: error: cannot create " << path << ": " << std::strerror(errno)
                << "\n";
      return false;
    }
    ::close(fd);
    ::unlink(path.c_str());
    return true;
  };
  if (!g_args.out.empty() && !prepare(g_args.out)) return 2;

  // Exec errors come back through a close-on-exec pipe: nothing read = exec succeeded.
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) {
    std::cerr << "memforensics: error: pipe: " << std::strerror(errno) << "\n";
    return 2;
  }
  std::vector<char*> argv;
  for (const auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);

  // Signals arriving before the child exists are held, then forwarded by the handler.
  struct sigaction sa {};
  sa.sa_sigaction = forwardSignal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::sigaction(sig, &sa, nullptr);

  pid_t pid = ::fork();
  if (pid < 0) {
    std::cerr << "memforensics: error: fork: " << std::strerror(errno) << "\n";
    return 2;
  }
  if (pid == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    // SIGXFSZ and SIGPIPE too: memforensics ignores them for itself (main.cc), the command gets
    // the default (an ignored disposition would survive the exec).
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGXFSZ, SIGPIPE})
      ::sigaction(sig, &dfl, nullptr);
    std::string out =
        g_args.out.empty() ? "memforensics-" + std::to_string(::getpid()) + ".bin" : g_args.out;
    if (!library.empty()) {
      ::setenv("CUDA_INJECTION64_PATH", library.c_str(), 1);
      // Absolute: the command may change directory before it initialises CUDA.
      ::setenv("MEMFORENSICS_CUPTI_OUT",
               (fs::path(out).is_absolute() ? fs::path(out) : cwd / out).c_str(), 1);
      if (g_args.no_stacks) ::setenv("MEMFORENSICS_CUPTI_STACKS", "0", 1);
    }
    ::execvp(argv[0], argv.data());
    int err = errno;
    ssize_t n = ::write(pipefd[1], &err, sizeof err);
    (void)n;
    ::_exit(127);
  }
  g_child = pid;
  ::close(pipefd[1]);
  int exec_errno = 0;
  ssize_t got;
  do {
    got = ::read(pipefd[0], &exec_errno, sizeof exec_errno);
  } while (got < 0 && errno == EINTR);
  ::close(pipefd[0]);

  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child = 0;
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    std::cerr << "memforensics: error: cannot run '" << cmd[0] << "': " << std::strerror(exec_errno)
              << (exec_errno == ENOENT ? " (not found on PATH)" : "") << "\n";
    return exec_errno == ENOENT ? 127 : 126;
  }
  int rc = 0;
  if (WIFEXITED(status)) {
    rc = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    rc = 128 + WTERMSIG(status);
    std::cerr << "memforensics: the command was killed by signal " << WTERMSIG(status) << " ("
              << strsignal(WTERMSIG(status)) << "); the trace holds what was flushed before\n";
  }

  const std::string out =
      g_args.out.empty() ? "memforensics-" + std::to_string(pid) + ".bin" : g_args.out;
  struct stat st {};
  bool written = ::stat(out.c_str(), &st) == 0 && st.st_size > 0;
  bool ok = true;
  if (written) {
    ok = summarize(out);
  } else {
    Status s = writeEmptyTrace(out);
    if (!s.ok()) {
      std::cerr << "memforensics: error: cannot write " << out << ": " << s.error().describe()
                << "\n";
      ok = false;
    } else if (!library.empty()) {
      std::cerr << "memforensics: note: no GPU activity was seen: the command did not initialise "
                   "CUDA, or no CUDA "
                   "driver is present. Wrote an empty trace to "
                << out << "\n";
    } else {
      std::cerr << "memforensics: note: nothing was recorded (no injection library). Wrote an "
                   "empty trace to "
                << out << "\n";
    }
  }
  fs::path outp = fs::absolute(out, ec);
  for (const auto& other : siblingTraces(outp, start_time)) {
    if (other != outp.string()) {
      std::cerr << "memforensics: another CUDA process of the run wrote " << other << "\n";
      ok = summarize(other) && ok;
    }
  }
  if (rc == 0 && !ok) rc = 2;
  return rc;
}

}  // namespace memforensics::cli
