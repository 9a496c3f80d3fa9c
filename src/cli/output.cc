// output.cc: see output.h.
#include "cli/output.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>

namespace memforensics::cli {

Status writeOutput(const std::string& path, const std::function<Status(std::ostream&)>& body) {
  if (path == "-") {
    Status s = body(std::cout);
    std::cout.flush();
    if (s.ok() && !std::cout) return Error{"cannot write to standard output", -1};
    return s;
  }
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  if (!f) return Error{"cannot create " + tmp, -1};
  Status s = body(f);
  f.close();
  if (s.ok() && !f) s = Error{"cannot write " + tmp + " (disk full?)", -1};
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) s = Error{"cannot rename " + tmp + " to " + path, -1};
  if (!s.ok()) std::remove(tmp.c_str());
  return s;
}

}  // namespace memforensics::cli
