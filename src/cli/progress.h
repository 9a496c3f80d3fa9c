// progress.h: a progress bar on stderr, shown only on a terminal and only for slow inputs.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace memforensics::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  void update(uint64_t done, uint64_t total);
  void finish();

 private:
  std::string label_;
  std::chrono::steady_clock::time_point start_;
  bool enabled_;
  bool shown_ = false;
  int last_permille_ = -1;
};

}  // namespace memforensics::cli
