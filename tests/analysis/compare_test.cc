// compare_test.cc: diff, ranks and check (analysis/compare/compare.h) on fabricated runs with a
// known answer (the direct builder), the scenario corpus and the real snapshots, each where the
// answer must be yes and where it must be no; the size parser (common/parse_size.h); the ranks JSON
// round trip used by `ranks --merge`.
#include "analysis/compare/compare.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/parse_size.h"
#include "fixtures/model_builder.h"
#include "format/load/load.h"
#include "report/render_compare.h"

namespace memforensics::analysis {
namespace {

using memforensics::testing::Frames;
using memforensics::testing::ModelBuilder;

constexpr uint64_t kBase = 0x7f0000000000ULL;
constexpr uint64_t kMiB = 1048576;

struct A {
  Frames frames;
  uint64_t size;
};

// One 64 MiB segment; the allocations in order, then freed newest first: the requested peak is
// after the last allocation, with every one of them live.
format::Snapshot run(const std::vector<A>& allocs) {
  ModelBuilder b;
  b.segment(kBase).freeBlock(64 * kMiB).segmentAlloc(kBase, 64 * kMiB, {.time_us = 1});
  uint64_t addr = kBase;
  int64_t t = 2;
  std::vector<std::pair<uint64_t, uint64_t>> done;
  for (const auto& a : allocs) {
    b.alloc(addr, a.size, {.time_us = t++, .frames = a.frames});
    done.push_back({addr, a.size});
    addr += a.size;
  }
  for (auto it = done.rbegin(); it != done.rend(); ++it) {
    b.free(it->first, it->second, {.time_us = t++});
  }
  return b.build();
}

RunProfile profileOf(const format::Snapshot& s, const std::string& path) {
  RunProfile p = profileSnapshot(s);
  p.path = path;
  return p;
}

const Frames kForward54 = {{"/home/u/model.py", 54, "forward"}, {"/home/u/train.py", 10, "main"}};
const Frames kForward57 = {{"/home/u/model.py", 57, "forward"}, {"/home/u/train.py", 10, "main"}};
const Frames kAttention = {{"/home/u/model.py", 80, "attention"}, {"/home/u/train.py", 10, "main"}};
const Frames kTemp = {{"/home/u/train.py", 12, "main"}};
const PeakKind kRq = PeakKind::Requested;

TEST(ParseSize, AcceptsBinaryDecimalFractionsAndBytes) {
  EXPECT_EQ(parseSize("20GiB").bytes, 20ull << 30);
  EXPECT_EQ(parseSize("512MiB").bytes, 512ull << 20);
  EXPECT_EQ(parseSize("1.5GB").bytes, 1500000000ull);
  EXPECT_EQ(parseSize("1073741824").bytes, 1073741824ull);
  EXPECT_EQ(parseSize("4096B").bytes, 4096ull);
  EXPECT_EQ(parseSize("2 kib").bytes, 2048ull);
  EXPECT_EQ(parseSize("0.1KiB").bytes, 102ull);  // rounded down
  EXPECT_EQ(parseSize("1.5GiB").bytes, 1610612736ull);
  EXPECT_TRUE(parseSize("0").ok);
}

TEST(ParseSize, RefusesAmbiguousMalformedAndOverflowing) {
  for (const char* bad : {"20G", "512M", "", "GiB", "abc", "1.5B", "-1", "1e9", "12XB", "1..5GB",
                          "18446744073709551616", "17179869184GiB", "1.0000000000000000001GB"}) {
    SizeParse p = parseSize(bad);
    EXPECT_FALSE(p.ok) << bad;
    EXPECT_FALSE(p.error.empty()) << bad;
  }
  EXPECT_NE(parseSize("20G").error.find("20GiB"), std::string::npos) << parseSize("20G").error;
  EXPECT_EQ(parseSize("18446744073709551615").bytes, UINT64_MAX);
}

TEST(Compare, SignedDeltaSaturates) {
  EXPECT_EQ(signedDelta(10, 3), -7);
  EXPECT_EQ(signedDelta(3, 10), 7);
  EXPECT_EQ(signedDelta(0, UINT64_MAX), INT64_MAX);
  EXPECT_EQ(signedDelta(UINT64_MAX, 0), INT64_MIN);
}

// Must say yes: a line moved (same file and function), a new stack, a gone one, each named.
TEST(Diff, MatchesStacksByFunctionWhenLinesMovedAndNamesNewAndGone) {
  auto base = run({{kForward54, 4 * kMiB}, {kTemp, 2 * kMiB}});
  auto neu = run({{kForward57, 6 * kMiB}, {kAttention, 3 * kMiB}});
  DiffResult d = diffProfiles(profileOf(base, "base"), profileOf(neu, "new"));
  ASSERT_EQ(d.devices.size(), 1u);
  const PeakDiff& p = d.devices[0].peaks[static_cast<size_t>(kRq)];
  EXPECT_EQ(p.base.bytes, 6 * kMiB);
  EXPECT_EQ(p.neu.bytes, 9 * kMiB);
  EXPECT_EQ(p.delta, static_cast<int64_t>(3 * kMiB));
  ASSERT_TRUE(p.has_live);
  EXPECT_EQ(p.matched_exact, 0u);
  EXPECT_EQ(p.matched_function_only, 1u);
  ASSERT_EQ(p.grew.size(), 1u);
  EXPECT_EQ(p.grew[0].match, StackMatch::FunctionOnly);
  EXPECT_EQ(p.grew[0].base_frames[0].line, 54u);
  EXPECT_EQ(p.grew[0].new_frames[0].line, 57u);
  EXPECT_EQ(p.grew[0].delta, static_cast<int64_t>(2 * kMiB));
  ASSERT_EQ(p.added_stacks.size(), 1u);
  EXPECT_EQ(p.added_stacks[0].new_frames[0].name, "attention");
  EXPECT_EQ(p.added_stacks[0].new_bytes, 3 * kMiB);
  ASSERT_EQ(p.gone_stacks.size(), 1u);
  EXPECT_EQ(p.gone_stacks[0].base_frames[0].line, 12u);
  EXPECT_EQ(p.gone_stacks[0].base_bytes, 2 * kMiB);
  // The text says the match was by function only.
  std::ostringstream text;
  report::renderDiffText(d, text);
  EXPECT_NE(text.str().find("matched by file and function only, lines moved; base: "
                            "/home/u/model.py:54 forward"),
            std::string::npos)
      << text.str();
}

// Another checkout of the same code (other directories): matched by file name and function, said;
// a different file name with the same function is not matched.
TEST(Diff, MatchesAnotherCheckoutByFileNameAndFunction) {
  const Frames here = {{"/home/a/FlexGen/flexgen/backend.py", 190, "allocate"}};
  const Frames there = {{"/home/a/origin_git_Flex/flexgen/backend.py", 195, "allocate"}};
  const Frames other = {{"/home/a/origin_git_Flex/flexgen/other.py", 195, "allocate"}};
  auto base = run({{here, 4 * kMiB}});
  auto neu = run({{there, 5 * kMiB}, {other, 1 * kMiB}});
  DiffResult d = diffProfiles(profileOf(base, "base"), profileOf(neu, "new"));
  const PeakDiff& p = d.devices[0].peaks[static_cast<size_t>(kRq)];
  EXPECT_EQ(p.matched_exact, 0u);
  EXPECT_EQ(p.matched_function_only, 0u);
  EXPECT_EQ(p.matched_file_name_only, 1u);
  ASSERT_EQ(p.grew.size(), 1u);
  EXPECT_EQ(p.grew[0].match, StackMatch::FileNameOnly);
  EXPECT_EQ(p.grew[0].delta, static_cast<int64_t>(kMiB));
  ASSERT_EQ(p.added_stacks.size(), 1u);
  EXPECT_EQ(p.added_stacks[0].new_frames[0].filename, "/home/a/origin_git_Flex/flexgen/other.py");
  std::ostringstream text;
  report::renderDiffText(d, text);
  EXPECT_NE(text.str().find("matched by file name and function only, directories differ"),
            std::string::npos);
}

// Must say no: the same run twice has no deltas, no new or gone stack, no finding change.
TEST(Diff, SameRunTwiceHasNoDifference) {
  auto a = run({{kForward54, 4 * kMiB}, {kTemp, 2 * kMiB}});
  auto b = run({{kForward54, 4 * kMiB}, {kTemp, 2 * kMiB}});
  DiffResult d = diffProfiles(profileOf(a, "a"), profileOf(b, "b"));
  ASSERT_EQ(d.devices.size(), 1u);
  const auto& dd = d.devices[0];
  for (const auto& p : dd.peaks) {
    EXPECT_EQ(p.delta, 0);
    EXPECT_TRUE(p.grew.empty());
    EXPECT_TRUE(p.shrank.empty());
    EXPECT_TRUE(p.added_stacks.empty());
    EXPECT_TRUE(p.gone_stacks.empty());
  }
  EXPECT_EQ(dd.peaks[static_cast<size_t>(kRq)].matched_exact, 2u);
  EXPECT_TRUE(dd.appeared.empty());
  EXPECT_TRUE(dd.disappeared.empty());
  EXPECT_EQ(dd.only_base_count, 0u);
  EXPECT_EQ(dd.only_new_count, 0u);
}

// A device in one run only is listed with the other side empty, not dropped.
TEST(Diff, DeviceOfOneRunOnly) {
  auto a = run({{kForward54, 4 * kMiB}});
  RunProfile empty;
  DiffResult d = diffProfiles(profileOf(a, "a"), empty);
  ASSERT_EQ(d.devices.size(), 1u);
  EXPECT_TRUE(d.devices[0].in_base);
  EXPECT_FALSE(d.devices[0].in_new);
  EXPECT_EQ(d.devices[0].peaks[static_cast<size_t>(kRq)].delta, -static_cast<int64_t>(4 * kMiB));
  EXPECT_FALSE(d.devices[0].peaks[static_cast<size_t>(kRq)].has_live);
}

std::string scenario(const std::string& name) {
  return std::string(MEMF_SOURCE_DIR) + "/snapshots/scenarios/" + name + ".pickle";
}

RunProfile loadProfile(const std::string& path) {
  auto snap = format::loadSnapshotFile(path);
  EXPECT_TRUE(snap.ok()) << path;
  if (!snap.ok()) return {};
  return profileOf(*snap, path);
}

TEST(Diff, LeakScenarioAgainstCleanRun) {
  RunProfile clean = loadProfile(scenario("clean_adam"));
  RunProfile leak = loadProfile(scenario("leak_list_append"));
  DiffResult d = diffProfiles(clean, leak);
  ASSERT_EQ(d.devices.size(), 1u);
  const auto& dd = d.devices[0];
  EXPECT_EQ(dd.peaks[0].delta, 288 * static_cast<int64_t>(kMiB));  // reserved
  EXPECT_EQ(dd.peaks[1].delta, 288 * static_cast<int64_t>(kMiB));  // requested
  ASSERT_EQ(dd.appeared.size(), 1u);
  EXPECT_EQ(dd.appeared[0].kind, FindingKind::Leak);
  EXPECT_EQ(dd.appeared[0].location, "/home/user/tinygpt/train.py train_step");
  EXPECT_TRUE(dd.disappeared.empty());
  const PeakDiff& p = dd.peaks[static_cast<size_t>(kRq)];
  ASSERT_EQ(p.added_stacks.size(), 1u);
  EXPECT_EQ(p.added_stacks[0].new_frames[0].display(), "/home/user/tinygpt/train.py:58 train_step");
  EXPECT_EQ(p.added_stacks[0].new_bytes, 288 * kMiB);
  EXPECT_EQ(dd.only_new_count, 9u);
  EXPECT_EQ(dd.only_new_bytes, 288 * kMiB);
  EXPECT_EQ(dd.only_base_count, 0u);
  // The other way round the leak disappears.
  DiffResult back = diffProfiles(leak, clean);
  ASSERT_EQ(back.devices.size(), 1u);
  EXPECT_TRUE(back.devices[0].appeared.empty());
  ASSERT_EQ(back.devices[0].disappeared.size(), 1u);
  EXPECT_EQ(back.devices[0].peaks[0].delta, -288 * static_cast<int64_t>(kMiB));
}

std::string real(const std::string& name) {
  return std::string(MEMF_REAL_SNAPSHOTS) + "/" + name;
}

TEST(Diff, RealForwardFp32AgainstBf16) {
  const std::string fp32 = real("silmont2000__assignment2-systems__memory_forward_fp32_128.pickle");
  const std::string bf16 = real("silmont2000__assignment2-systems__memory_forward_bf16_128.pickle");
  if (!std::filesystem::exists(fp32) || !std::filesystem::exists(bf16)) GTEST_SKIP();
  DiffResult d = diffProfiles(loadProfile(fp32), loadProfile(bf16));
  ASSERT_EQ(d.devices.size(), 1u);
  const auto& dd = d.devices[0];
  EXPECT_EQ(dd.peaks[0].delta, 240 * static_cast<int64_t>(kMiB));  // 582 -> 822 MiB reserved
  EXPECT_EQ(dd.peaks[1].delta, 222994432);                         // requested
  EXPECT_EQ(dd.peaks[2].delta, 222994432);                         // allocated
  const PeakDiff& p = dd.peaks[static_cast<size_t>(kRq)];
  EXPECT_EQ(p.matched_exact, 5u);
  EXPECT_EQ(p.matched_function_only, 1u);
  EXPECT_EQ(p.added, 6u);
  EXPECT_EQ(p.gone, 4u);
  // Parameters are the same bytes in both; the growth is in temporaries.
  const auto param = static_cast<size_t>(Category::Parameter);
  EXPECT_EQ(p.base_category[param], p.new_category[param]);
  EXPECT_EQ(dd.base_final.requested, dd.new_final.requested);
}

// Four ranks of one program; rank 2 holds 10 MiB more at model.py:80 attention.
std::vector<RankRow> fourRanks(bool with_outlier) {
  std::vector<RankRow> rows;
  for (int rank = 0; rank < 4; ++rank) {
    std::vector<A> allocs = {{kForward54, 8 * kMiB}, {kTemp, 2 * kMiB}};
    allocs.push_back({kAttention, (with_outlier && rank == 2 ? 14 : 4) * kMiB});
    auto snap = run(allocs);
    auto r = rankRowsOf(profileOf(snap, "rank" + std::to_string(rank)));
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}

TEST(Ranks, OutlierMarkedWithTheLineThatDiffers) {
  auto rows = fourRanks(true);
  rows.push_back(failedRankRow("broken.pickle", "unrecognized file content"));
  RanksSummary s = markOutliers(rows);
  EXPECT_EQ(s.rows, 5u);
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(s.outliers, 1u);
  EXPECT_EQ(s.median_peak_requested, 14 * kMiB);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(rows[i].outlier, i == 2) << i;
  EXPECT_EQ(rows[2].outlier_figure, "peak_requested");  // one 64 MiB segment: reserved is equal
  EXPECT_NEAR(rows[2].above_median, 10.0 / 14.0, 1e-9);
  EXPECT_EQ(rows[2].outlier_line, "/home/u/model.py:80 attention");
  EXPECT_EQ(rows[2].outlier_line_bytes, 14 * kMiB);
  EXPECT_EQ(rows[2].outlier_line_median, 4 * kMiB);
  EXPECT_EQ(rows[0].largest_holder, "/home/u/model.py:54 forward < /home/u/train.py:10 main");
  EXPECT_EQ(rows[0].largest_holder_bytes, 8 * kMiB);
  EXPECT_FALSE(rows[4].outlier);
}

// A rank above the median by its reserved bytes alone (an idle cached segment) with every line
// as on the others: an outlier, but no line is named (it would blame one holding the same bytes).
TEST(Ranks, AnOutlierByItsCacheNamesNoLine) {
  auto rows = fourRanks(false);
  rows[2].peak_reserved += 1024 * kMiB;
  RanksSummary s = markOutliers(rows);
  EXPECT_EQ(s.outliers, 1u);
  EXPECT_TRUE(rows[2].outlier);
  EXPECT_EQ(rows[2].outlier_figure, "peak_reserved");
  EXPECT_EQ(rows[2].outlier_line, "");
  std::ostringstream text;
  report::renderRanksText(rows, s, text);
  EXPECT_NE(text.str().find("none stands out"), std::string::npos) << text.str();
  EXPECT_EQ(text.str().find("the line that differs most"), std::string::npos) << text.str();
}

TEST(Ranks, EqualRanksHaveNoOutlier) {
  auto rows = fourRanks(false);
  RanksSummary s = markOutliers(rows);
  EXPECT_EQ(s.outliers, 0u);
  EXPECT_EQ(s.failed, 0u);
  for (const auto& r : rows) EXPECT_FALSE(r.outlier);
}

TEST(Ranks, JsonRoundTripForMerge) {
  auto rows = fourRanks(true);
  rows.push_back(failedRankRow("broken.pickle", "unrecognized"));
  RanksSummary s = markOutliers(rows);
  std::ostringstream js;
  report::renderRanksJson(rows, s, js);
  // Written one row at a time, it is the same text as the whole document's dump.
  EXPECT_EQ(nlohmann::json::parse(js.str()).dump() + "\n", js.str());
  auto back = report::parseRanksJson(js.str(), "shard.json");
  ASSERT_TRUE(back.ok()) << back.error().describe();
  ASSERT_EQ(back->size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ((*back)[i].path, rows[i].path);
    EXPECT_EQ((*back)[i].error, rows[i].error);
    EXPECT_EQ((*back)[i].peak_requested, rows[i].peak_requested);
    EXPECT_EQ((*back)[i].lines.size(), rows[i].lines.size());
  }
  RanksSummary s2 = markOutliers(*back);
  EXPECT_EQ(s2.outliers, 1u);
  EXPECT_EQ((*back)[2].outlier_line, "/home/u/model.py:80 attention");
  // Hostile shards: an error naming the shard, never an exception.
  for (const char* bad : {"", "{", "[]", "{\"command\":\"diff\"}",
                          "{\"command\":\"ranks\",\"ranks\":[{\"path\":\"x\",\"device\":0}]}",
                          "{\"command\":\"ranks\",\"ranks\":[{\"path\":\"x\",\"device\":0,"
                          "\"peak_reserved_bytes\":-1,\"peak_requested_bytes\":0,"
                          "\"peak_allocated_bytes\":0,\"ooms\":0,\"high_findings\":0}]}"}) {
    auto r = report::parseRanksJson(bad, "bad.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("bad.json"), std::string::npos);
  }
}

// A shard nesting deeper than a ranks document can is refused before a tree is built (a 40 MB
// shard holding a 20 M-deep array in an ignored key built a 1.5 GB tree); the depth a document
// has, and an ignored key 10 deep, still parse. JSON Lines shards go through the same check.
TEST(Ranks, ADeeplyNestedShardIsRefusedBeforeItsTreeIsBuilt) {
  auto shard = [](size_t depth) {
    return "{\"command\":\"ranks\",\"ranks\":[{\"path\":\"x\",\"device\":0,"
           "\"peak_reserved_bytes\":1,\"peak_requested_bytes\":1,\"peak_allocated_bytes\":1,"
           "\"ooms\":0,\"high_findings\":0,\"lines\":[{\"line\":\"a.py:1 f\",\"bytes\":1}],"
           "\"ignored\":" +
           std::string(depth, '[') + std::string(depth, ']') + "}]}";
  };
  auto ok = report::parseRanksJson(shard(10), "shallow.json");
  ASSERT_TRUE(ok.ok()) << ok.error().describe();
  ASSERT_EQ(ok->size(), 1u);
  EXPECT_EQ((*ok)[0].lines.size(), 1u);
  for (const std::string& text : {shard(100000), shard(12) + "\n" + shard(100000) + "\n"}) {
    auto deep = report::parseRanksJson(text, "deep.json");
    ASSERT_FALSE(deep.ok());
    EXPECT_NE(deep.error().message.find("deep.json"), std::string::npos);
    EXPECT_NE(deep.error().message.find("nested deeper than 16 levels"), std::string::npos)
        << deep.error().message;
  }
}

// A shard is read field by field (no tree): what the reader ignores may be any size, a key given
// twice counts as its last, a wrong type names the shard (a number as "command" escaped as a JSON
// library exception), and a row whose error is "" is read as a row without error.
TEST(Ranks, ShardsAreReadByTheirFieldsWhateverElseTheyHold) {
  const std::string figures =
      "\"peak_reserved_bytes\":5,\"peak_requested_bytes\":4,\"peak_allocated_bytes\":3,"
      "\"ooms\":2,\"high_findings\":1";
  std::string wide = "[";
  for (int i = 0; i < 100000; ++i) wide += "0,";
  wide += "{\"path\":\"not a row\"}]";
  const std::string text = "{\"command\":\"diff\",\"ignored\":" + wide +
                           ",\"ranks\":[{\"path\":\"x\"}],\"command\":\"ranks\",\"ranks\":[{"
                           "\"path\":\"first\",\"path\":\"a.pickle\",\"device\":1," +
                           figures + ",\"extra\":" + wide +
                           ",\"largest_holder\":{\"line\":\"m.py:3 f\",\"bytes\":9},"
                           "\"lines\":[{\"line\":\"z.py:1 g\",\"bytes\":2},{\"bytes\":1,"
                           "\"line\":\"a.py:1 f\",\"x\":[1]}]},"
                           "{\"path\":\"b.pickle\",\"error\":\"\",\"device\":0," +
                           figures + "},{\"path\":\"c.pickle\",\"error\":\"unreadable\"}]}";
  auto rows = report::parseRanksJson(text, "shard.json");
  ASSERT_TRUE(rows.ok()) << rows.error().describe();
  ASSERT_EQ(rows->size(), 3u);
  const RankRow& a = (*rows)[0];
  EXPECT_EQ(a.path, "a.pickle");
  EXPECT_EQ(a.device, 1);
  EXPECT_EQ(a.peak_reserved, 5u);
  EXPECT_EQ(a.peak_requested, 4u);
  EXPECT_EQ(a.peak_allocated, 3u);
  EXPECT_EQ(a.ooms, 2u);
  EXPECT_EQ(a.high_findings, 1u);
  EXPECT_EQ(a.largest_holder, "m.py:3 f");
  EXPECT_EQ(a.largest_holder_bytes, 9u);
  ASSERT_EQ(a.lines.size(), 2u);
  EXPECT_EQ(a.lines[0].line, "a.py:1 f");  // by line text
  EXPECT_EQ(a.lines[1].bytes, 2u);
  EXPECT_EQ((*rows)[1].path, "b.pickle");
  EXPECT_TRUE((*rows)[1].error.empty());
  EXPECT_EQ((*rows)[1].device, 0);
  EXPECT_EQ((*rows)[2].error, "unreadable");
  // Wrong types name the shard and the row.
  const std::pair<std::string, std::string> bad[] = {
      {"{\"command\":1,\"ranks\":[]}", "no \"command\": \"ranks\""},
      {"{\"command\":\"ranks\",\"ranks\":{}}", "no \"command\": \"ranks\""},
      {"{\"command\":\"ranks\",\"ranks\":[{\"path\":\"p\"," + figures + "},{}]}",
       "ranks[0] lacks device"},
      {"{\"command\":\"ranks\",\"ranks\":[7]}", "ranks[0] has no \"path\""},
      {"{\"command\":\"ranks\",\"ranks\":[{\"path\":\"p\",\"device\":0," + figures +
           ",\"lines\":[{\"line\":\"a\"}]}]}",
       "ranks[0] has a malformed line entry"},
      {"{\"command\":\"ranks\",\"ranks\":[{\"path\":\"p\",\"device\":0," + figures +
           ",\"device\":-3}]}",
       "ranks[0] has device -3"},
  };
  for (const auto& [doc, why] : bad) {
    auto r = report::parseRanksJson(doc, "bad.json");
    ASSERT_FALSE(r.ok()) << doc;
    EXPECT_NE(
        r.error().message.find("bad.json: not a `memforensics ranks --json` document: " + why),
        std::string::npos)
        << r.error().message;
  }
  // More than kRankLines lines is refused even when a malformed one comes first.
  std::string many = "{\"command\":\"ranks\",\"ranks\":[{\"path\":\"p\",\"device\":0," + figures +
                     ",\"lines\":[{}";
  for (size_t i = 0; i < kRankLines; ++i)
    many += ",{\"line\":\"l" + std::to_string(i) + "\",\"bytes\":1}";
  auto r = report::parseRanksJson(many + "]}]}", "many.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("more lines than kRankLines"), std::string::npos);
}

TEST(Check, LimitsHoldOnACleanRunAndFailOnTheLeak) {
  RunProfile clean = loadProfile(scenario("clean_adam"));
  RunProfile leak = loadProfile(scenario("leak_list_append"));
  CheckLimits lim;
  lim.max_peak_reserved = 500 * kMiB;
  lim.max_growth_per_step = 16 * kMiB;
  lim.fail_on = FindingSeverity::High;
  CheckReport ok = checkProfile(clean, lim);
  EXPECT_TRUE(ok.violations.empty());
  CheckReport bad = checkProfile(leak, lim);
  ASSERT_EQ(bad.violations.size(), 3u);
  EXPECT_EQ(bad.violations[0].figure, "peak_reserved");
  EXPECT_EQ(bad.violations[0].value, 660 * kMiB);
  EXPECT_EQ(bad.violations[0].limit, 500 * kMiB);
  EXPECT_EQ(bad.violations[1].figure, "growth_per_step");
  EXPECT_EQ(bad.violations[1].value, 32 * kMiB);
  EXPECT_EQ(bad.violations[1].line.rfind("/home/user/tinygpt/train.py:58 train_step", 0), 0u)
      << bad.violations[1].line;
  EXPECT_EQ(bad.violations[2].figure, "finding leak (high)");
  EXPECT_EQ(bad.violations[2].device, 0);
  // A limit equal to the figure holds.
  CheckLimits exact;
  exact.max_peak_reserved = 660 * kMiB;
  exact.max_growth_per_step = 32 * kMiB;
  EXPECT_TRUE(checkProfile(leak, exact).violations.empty());
}

TEST(Check, BaselineIncrease) {
  RunProfile clean = loadProfile(scenario("clean_adam"));
  RunProfile leak = loadProfile(scenario("leak_list_append"));
  CheckLimits lim;
  lim.max_increase_pct = 10;
  CheckReport same = checkProfile(clean, lim, &clean);
  EXPECT_TRUE(same.violations.empty());
  CheckReport grew = checkProfile(leak, lim, &clean);
  ASSERT_EQ(grew.violations.size(), 3u);  // reserved, requested, allocated
  EXPECT_EQ(grew.violations[0].figure, "peak_reserved increase");
  EXPECT_NE(grew.violations[0].line.find("train.py:58 train_step"), std::string::npos);
  EXPECT_NE(grew.violations[0].line.find("(new stack)"), std::string::npos);
  // +84.7 % on requested: a 100 % allowance holds.
  lim.max_increase_pct = 100;
  EXPECT_TRUE(checkProfile(leak, lim, &clean).violations.empty());
  // A device the baseline lacks is noted, not failed.
  RunProfile none;
  none.path = "empty";
  CheckReport n = checkProfile(leak, lim, &none);
  EXPECT_TRUE(n.violations.empty());
  ASSERT_EQ(n.notes.size(), 1u);
}

TEST(Check, GrowthNeedsTwoIterations) {
  auto one = run({{kForward54, 4 * kMiB}});
  CheckLimits lim;
  lim.max_growth_per_step = 1;
  CheckReport r = checkProfile(profileOf(one, "one"), lim);
  EXPECT_TRUE(r.violations.empty());
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("growth per step not checked"), std::string::npos);
}

// The job's findings (cross_device.h) count as analyze gives them: check --fail-on fails on the
// device imbalance of a DataParallel job, on the device it points at, and ranks counts it there.
TEST(Check, JobFindingsCountOnTheirDevice) {
  RunProfile dp = loadProfile(scenario("dp_imbalance_oom"));
  ASSERT_EQ(dp.job_findings.size(), 1u);
  EXPECT_EQ(dp.job_findings[0].finding.kind, FindingKind::DeviceImbalance);
  EXPECT_EQ(dp.job_findings[0].device, 1);
  CheckLimits lim;
  lim.fail_on = FindingSeverity::High;
  CheckReport r = checkProfile(dp, lim);
  size_t imbalance = 0;
  for (const auto& v : r.violations) {
    if (v.figure != "finding device_imbalance (high)") continue;
    ++imbalance;
    EXPECT_EQ(v.device, 1);
    EXPECT_NE(v.line.find("models.py:174"), std::string::npos) << v.line;
  }
  EXPECT_EQ(imbalance, 1u);
  size_t high_on_1 = 0, job_high = 0;
  for (const auto& d : dp.devices) {
    if (d.device != 1) continue;
    for (const auto& f : d.findings) high_on_1 += f.severity == FindingSeverity::High;
  }
  for (const auto& j : dp.job_findings) job_high += j.finding.severity == FindingSeverity::High;
  for (const RankRow& row : rankRowsOf(dp)) {
    if (row.device == 1) EXPECT_EQ(row.high_findings, high_on_1 + job_high);
  }
  // One device alone: nothing to compare across.
  auto snap = format::loadSnapshotFile(scenario("dp_imbalance_oom"));
  ASSERT_TRUE(snap.ok());
  ProfileOptions one;
  one.device = 1;
  EXPECT_TRUE(profileSnapshot(*snap, one).job_findings.empty());
}

}  // namespace
}  // namespace memforensics::analysis
