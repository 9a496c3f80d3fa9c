// diagnostics.cc: see diagnostics.h.
#include "cli/diagnostics.h"

#include <iostream>

#include "common/text_escape.h"

namespace memforensics::cli {

namespace {
std::string& activityText() {
  static std::string s = "starting";
  return s;
}
}  // namespace

void printError(std::string_view message) {
  std::cerr << "memforensics: error: " << escapeText(message) << "\n";
}

void printWarning(std::string_view message) {
  std::cerr << "memforensics: warning: " << escapeText(message) << "\n";
}

void setActivity(std::string what) {
  activityText() = std::move(what);
}

const std::string& activity() {
  return activityText();
}

}  // namespace memforensics::cli
