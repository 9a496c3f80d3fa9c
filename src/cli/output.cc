// output.cc: see output.h.
#include "cli/output.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <streambuf>

#include "cli/diagnostics.h"
#include "report/text_layout.h"

namespace memforensics::cli {

namespace {

std::string errnoText(int err) {
  return err == 0 ? std::string("write failed") : std::string(std::strerror(err));
}

// A buffered std::streambuf over a file descriptor that remembers the errno of its first failed
// write; once a write failed every later one fails too (the stream's badbit is set).
class FdOutBuf : public std::streambuf {
 public:
  explicit FdOutBuf(int fd) : fd_(fd) { setp(buf_, buf_ + sizeof buf_); }
  FdOutBuf(const FdOutBuf&) = delete;
  FdOutBuf& operator=(const FdOutBuf&) = delete;
  int error() const { return err_; }

 protected:
  int_type overflow(int_type c) override {
    if (flushBuffer() != 0) return traits_type::eof();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  int sync() override { return flushBuffer(); }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n < static_cast<std::streamsize>(sizeof buf_)) return std::streambuf::xsputn(s, n);
    if (flushBuffer() != 0 || !writeAll(s, static_cast<size_t>(n))) return 0;
    return n;
  }

 private:
  int flushBuffer() {
    if (err_ != 0) return -1;
    auto n = static_cast<size_t>(pptr() - pbase());
    if (n > 0 && !writeAll(pbase(), n)) return -1;
    setp(buf_, buf_ + sizeof buf_);
    return 0;
  }
  bool writeAll(const char* p, size_t n) {
    if (err_ != 0) return false;
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        err_ = w < 0 && errno != 0 ? errno : EIO;
        return false;
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }

  int fd_;
  int err_ = 0;
  char buf_[1 << 16];
};

// Never destroyed: std::cout is flushed at exit, after static objects may be gone.
FdOutBuf* g_stdout = nullptr;
bool g_stdout_reported = false;  // writeOutput("-") returned the failure: finishStdout stays quiet

Error stdoutError() {
  return Error{"cannot write to standard output: " + errnoText(g_stdout ? g_stdout->error() : 0),
               -1};
}

// /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N: the descriptor N of this process, or -1.
int descriptorPath(const std::string& path) {
  if (path == "/dev/stdout") return 1;
  if (path == "/dev/stderr") return 2;
  std::string_view num;
  for (std::string_view prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    if (path.size() > prefix.size() && path.compare(0, prefix.size(), prefix) == 0)
      num = std::string_view(path).substr(prefix.size());
  }
  int fd = -1;
  auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), fd);
  if (num.empty() || ec != std::errc() || p != num.data() + num.size() || fd < 0) return -1;
  return fd;
}

// Runs `body` on a stream over `fd` (not closed here) and checks every write.
Status writeThrough(int fd, const std::string& path,
                    const std::function<Status(std::ostream&)>& body) {
  FdOutBuf buf(fd);
  std::ostream os(&buf);
  Status s = body(os);
  os.flush();
  if (buf.error() != 0) return Error{"cannot write " + path + ": " + errnoText(buf.error()), -1};
  if (!s.ok()) return Error{path + ": " + s.error().describe(), -1};
  return s;
}

Status writeToStdout(const std::function<Status(std::ostream&)>& body) {
  Status s = body(std::cout);
  Status f = flushStdout();
  if (!f.ok()) {
    g_stdout_reported = true;  // the caller prints it
    return f;
  }
  return s;
}

Status writeReplacing(const std::string& target, mode_t mode,
                      const std::function<Status(std::ostream&)>& body) {
  std::string tmp = target + ".tmp-XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) return Error{"cannot create " + tmp + ": " + std::strerror(errno), -1};
  Status s = Status::Ok();
  if (::fchmod(fd, mode) != 0)
    s = Error{"cannot set the permissions of " + tmp + ": " + std::strerror(errno), -1};
  if (s.ok()) s = writeThrough(fd, target, body);
  if (::close(fd) != 0 && s.ok())
    s = Error{"cannot write " + target + ": " + std::strerror(errno), -1};
  if (s.ok() && std::rename(tmp.c_str(), target.c_str()) != 0) {
    s = Error{"cannot rename " + tmp + " to " + target + ": " + std::strerror(errno), -1};
  }
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

mode_t defaultMode() {
  mode_t mask = ::umask(0);
  ::umask(mask);
  return 0666 & ~mask;
}

}  // namespace

void installStdout() {
  if (g_stdout != nullptr) return;
  g_stdout = new FdOutBuf(1);  // NOLINT: deliberately never deleted (see above)
  std::cout.rdbuf(g_stdout);
}

Status flushStdout() {
  std::cout.flush();
  if (g_stdout != nullptr ? g_stdout->error() != 0 : !std::cout) return stdoutError();
  return Status::Ok();
}

int finishStdout(int rc) {
  bool reported = g_stdout_reported;
  Status s = flushStdout();
  if (s.ok()) return rc;
  if (!reported) printError(s.error().describe());
  return kExitError;
}

Status checkNotAnInput(const std::string& out, const std::vector<std::string>& inputs) {
  struct stat o {};
  // "-": whatever standard output was opened on (`1<>in.pickle` opens the input itself).
  const bool is_stdout = out == "-";
  if ((is_stdout ? ::fstat(1, &o) : ::stat(out.c_str(), &o)) != 0 || !S_ISREG(o.st_mode))
    return Status::Ok();
  for (const auto& in : inputs) {
    struct stat i {};
    if (in.empty() || in == "-") continue;
    if (::stat(in.c_str(), &i) == 0 && i.st_dev == o.st_dev && i.st_ino == o.st_ino) {
      return Error{is_stdout ? "standard output is the input " + in +
                                   ": refusing to overwrite it (send standard output elsewhere)"
                             : "the output " + out + " is the input " + in +
                                   ": refusing to overwrite it (choose another output name)",
                   -1};
    }
  }
  return Status::Ok();
}

Status writeOutput(const std::string& path, const std::function<Status(std::ostream&)>& body) {
  if (path == "-") return writeToStdout(body);
  int fd_path = descriptorPath(path);
  if (fd_path == 1) return writeToStdout(body);
  if (fd_path >= 0) {
    if (::fcntl(fd_path, F_GETFD) == -1)
      return Error{"cannot write " + path + ": " + std::strerror(errno), -1};
    return writeThrough(fd_path, path, body);
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return Error{"cannot write " + path + ": " + std::strerror(errno), -1};
    return writeReplacing(path, defaultMode(), body);
  }
  if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
    // O_NONBLOCK: a FIFO without a reader fails with ENXIO instead of blocking; cleared after.
    int fd = ::open(path.c_str(),
                    O_WRONLY | O_NOCTTY | O_CLOEXEC | (S_ISFIFO(st.st_mode) ? O_NONBLOCK : 0));
    if (fd < 0) {
      if (errno == ENXIO && S_ISFIFO(st.st_mode))
        return Error{"cannot write " + path + ": a FIFO with no reader", -1};
      return Error{"cannot open " + path + ": " + std::strerror(errno), -1};
    }
    int flags = ::fcntl(fd, F_GETFL);
    if (flags != -1) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    Status s = writeThrough(fd, path, body);
    if (::close(fd) != 0 && s.ok())
      s = Error{"cannot write " + path + ": " + std::strerror(errno), -1};
    return s;
  }
  if (S_ISDIR(st.st_mode)) return Error{"cannot write " + path + ": it is a directory", -1};
  if (!S_ISREG(st.st_mode)) {
    return Error{"cannot write " + path +
                     ": not a regular file, a character device or a FIFO (refusing to replace it)",
                 -1};
  }
  // A regular file, maybe behind symlinks: replace the file the links point to, not the links.
  std::string target = path;
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
    char* real = ::realpath(path.c_str(), nullptr);
    if (real == nullptr) return Error{"cannot resolve " + path + ": " + std::strerror(errno), -1};
    target = real;
    std::free(real);  // NOLINT: realpath's allocation
  }
  return writeReplacing(target, st.st_mode & 07777, body);
}

size_t stdoutTextWidth() {
  size_t width = 0;
  struct winsize ws {};
  if (isatty(STDOUT_FILENO) == 1 && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) width = ws.ws_col;
  if (width == 0) {
    if (const char* env = std::getenv("COLUMNS")) {
      const char* end = env + std::strlen(env);
      size_t v = 0;
      auto [p, ec] = std::from_chars(env, end, v);
      if (ec == std::errc() && p == end) width = v;
    }
  }
  if (width == 0) width = report::kDefaultTextWidth;
  return std::max(width, kMinTextWidth);
}

}  // namespace memforensics::cli
