// fuzz_corpus_test.cc: every committed fuzzer input (fuzz/corpus/<target>/) goes through the same
// pipeline as the fuzzers (load, analyze, render, dump) in the ordinary test build, so an input
// that once crashed stays fixed even where nobody runs scripts/fuzz.sh. Errors are fine; crashes
// (and, in the sanitizer build, sanitizer reports) are not.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/analyze.h"
#include "format/load/load.h"
#include "format/model/dump.h"
#include "report/render.h"

namespace memforensics::format {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> corpusFiles() {
  std::vector<fs::path> files;
  fs::path root = fs::path(MEMF_SOURCE_DIR) / "fuzz" / "corpus";
  if (!fs::is_directory(root)) return files;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(FuzzCorpus, EveryCommittedInputLoadsOrFailsCleanly) {
  auto files = corpusFiles();
  ASSERT_FALSE(files.empty()) << "no file under " << MEMF_SOURCE_DIR << "/fuzz/corpus";
  size_t loaded = 0;
  for (const auto& path : files) {
    SCOPED_TRACE(path.string());
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(in) << "cannot read " << path;
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    auto snap = loadSnapshotBytes(bytes);
    if (!snap) {
      EXPECT_FALSE(snap.error().describe().empty());
      continue;
    }
    ++loaded;
    auto result = analysis::analyzeSnapshot(*snap);
    std::ostringstream out;
    report::renderJson(result, out);
    report::renderText(result, out);
    dumpSnapshot(*snap, out, DumpOptions{.stacks = true});
    EXPECT_FALSE(out.str().empty());
  }
  // The committed corpus holds valid snapshots too, so the pipeline past loading is exercised.
  EXPECT_GT(loaded, 0u);
}

// Found by fuzz_pickle (fuzz/corpus/fuzz_pickle/json-*): the JSON form was converted recursively
// (nesting deep enough overflowed the stack) and a number beyond a double escaped as an exception.
// The corpus file is small enough for the fuzzer's -max_len, so it only overflows instrumented
// builds; this depth overflows any build without the limit.
TEST(FuzzCorpus, DeeplyNestedJsonIsAnErrorNotAStackOverflow) {
  const size_t depth = 200000;
  std::string text = "{\"segments\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
  auto snap =
      loadSnapshotBytes(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  ASSERT_FALSE(snap.ok());
  EXPECT_NE(snap.error().message.find("levels deep"), std::string::npos) << snap.error().message;
}

TEST(FuzzCorpus, JsonNumberBeyondADoubleIsAnError) {
  std::string text = R"({"segments": [], "device_traces": [[{"action": "alloc", "size": 1e400}]]})";
  auto snap =
      loadSnapshotBytes(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  ASSERT_FALSE(snap.ok());
  EXPECT_NE(snap.error().message.find("invalid JSON"), std::string::npos) << snap.error().message;
}

}  // namespace
}  // namespace memforensics::format
