// progress.cc: draws "label [#####     ] 45% 1.2 GiB/2.7 GiB" after the first second.
#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

#include "common/format_bytes.h"
#include "common/text_escape.h"

namespace memforensics::cli {

ProgressBar::ProgressBar(std::string label)
    : label_(escapeText(label)),
      start_(std::chrono::steady_clock::now()),
      enabled_(isatty(2) == 1) {}

ProgressBar::~ProgressBar() {
  finish();
}

void ProgressBar::update(uint64_t done, uint64_t total) {
  if (!enabled_ || total == 0) return;
  if (!shown_ && std::chrono::steady_clock::now() - start_ < std::chrono::seconds(1)) return;
  int permille = static_cast<int>(done * 1000 / total);
  if (permille == last_permille_) return;
  last_permille_ = permille;
  shown_ = true;
  constexpr int kWidth = 30;
  int filled = permille * kWidth / 1000;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), ' ');
  std::fprintf(stderr, "\r%s [%s] %3d%% %s / %s", label_.c_str(), bar.c_str(), permille / 10,
               formatBytesShort(done).c_str(), formatBytesShort(total).c_str());
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (shown_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }
}

}  // namespace memforensics::cli
