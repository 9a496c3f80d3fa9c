// load_test.cc: content sniffing and the HTML / JSON forms.
#include "format/load/load.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fixtures/snapshot_builder.h"

namespace memforensics::format {
namespace {

std::string base64(const std::vector<uint8_t>& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = in[i] << 16 | (i + 1 < in.size() ? in[i + 1] << 8 : 0) |
                 (i + 2 < in.size() ? in[i + 2] : 0);
    out += t[v >> 18 & 63];
    out += t[v >> 12 & 63];
    out += i + 1 < in.size() ? t[v >> 6 & 63] : '=';
    out += i + 2 < in.size() ? t[v & 63] : '=';
  }
  return out;
}

std::span<const uint8_t> bytesOf(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

memforensics::testing::TSnapshot sample() {
  memforensics::testing::TSnapshot t;
  t.segments.push_back(
      {0,
       0x200000,
       0,
       "small",
       {{512, 300, "active_allocated", {{"m.py", 4, "f"}}}, {2096640, 0, "inactive", {}}}});
  t.traces.push_back({{"alloc", 0x200000, 300, 0, 10, {{"m.py", 4, "f"}}, true}});
  return t;
}

TEST(Load, MemoryVizHtmlPageWithZeroPadding) {
  auto pk = memforensics::testing::buildPickle(sample());
  while (pk.size() % 3 != 0) pk.push_back(0);  // what _memory_viz does before base64
  std::string html =
      "<!DOCTYPE html><html><body><script>\nconst data = [{\"name\": \"snapshot.pickle\", "
      "\"base64\": \"" +
      base64(pk) + "\"}];\n</script></body></html>";
  auto s = loadSnapshotBytes(bytesOf(html));
  ASSERT_TRUE(s.ok()) << s.error().describe();
  EXPECT_EQ(s->source, SourceFormat::MemoryVizHtml);
  ASSERT_EQ(s->trace(0).size(), 1u);
  EXPECT_EQ(s->trace(0)[0].size, 300u);
}

// PyTorch 2.0's trace_plot page (before 2.1): the processed plot, not the snapshot (issue 28 item
// 10: such pages were refused as "not written by torch.cuda._memory_viz"). The stacks are the
// page's suffix-shared string chains; element 2 was alive before the trace (its free has the
// "alloc not recorded" stack). Built as 2.0's PlotWriter interns them.
std::string plotPage(const std::string& suffix_table, const std::string& actions) {
  return "<!DOCTYPE html>\n<html>\n<head></head>\n<body>\n<script type=\"module\">\nimport * as "
         "d3 from \"https://cdn.jsdelivr.net/npm/d3@7.7.0/+esm\";\n\nlet alloc_data = "
         "{\"actions\": " +
         actions +
         ", \"elements\": [{\"size\": 1048576, \"info\": 2}, {\"size\": 2097152, \"info\": 4}, "
         "{\"size\": 512, \"info\": 7}], \"suffix_table\": " +
         suffix_table +
         ", \"string_table\": [\"1.0MiB allocation\", \"/home/u/train.py:10:step\", "
         "\"/home/u/train.py:20:main\", \"2.0MiB allocation\", \"/home/u/model.py:5:forward\", "
         "\"512.0B allocation\", \"alloc not recorded, stack trace for free:\", "
         "\"/home/u/train.py:30:cleanup\"], \"initially_allocated\": [2]}\n\nfunction "
         "process_alloc_data(fraction_of_memory_reported=1) {\n}\n</script>\n</body>\n</html>\n";
}
const std::string kSuffixes =
    "[[2, null], [1, 0], [0, 1], [4, 0], [3, 3], [7, null], [6, 5], [5, 6]]";

TEST(Load, APyTorch20MemoryVizPlotPageIsRead) {
  const std::string html = plotPage(kSuffixes, "[0, 1, 2, 0, 1]");
  auto s = loadSnapshotBytes(bytesOf(html));
  ASSERT_TRUE(s.ok()) << s.error().describe();
  EXPECT_EQ(s->source, SourceFormat::MemoryVizHtml);
  EXPECT_FALSE(s->has_segment_info) << "the plot has no segments";
  std::vector<std::pair<Action, uint64_t>> seen;
  std::vector<std::string> top_frames;
  for (const Event& e : s->trace(0)) {
    if (e.action == Action::SegmentAlloc || e.action == Action::SegmentFree) continue;
    seen.emplace_back(e.action, e.size);
    if (e.action == Action::Alloc && e.stack != kNoStack && e.stack != kEmptyStack) {
      const Frame& f = s->stacks.frame(s->stacks.stack(e.stack)[0]);
      top_frames.push_back(std::string(s->strings.get(f.filename)) + ":" + std::to_string(f.line) +
                           " " + std::string(s->strings.get(f.name)));
    }
  }
  // alloc 0, alloc 1, the free of the block alive at the start, free 0, free 1 (a free is its
  // request and its completion).
  std::vector<std::pair<Action, uint64_t>> allocs;
  for (const auto& a : seen)
    if (a.first != Action::FreeRequested) allocs.push_back(a);
  ASSERT_EQ(allocs.size(), 5u);
  EXPECT_EQ(allocs[0], std::make_pair(Action::Alloc, uint64_t{1048576}));
  EXPECT_EQ(allocs[1], std::make_pair(Action::Alloc, uint64_t{2097152}));
  EXPECT_EQ(allocs[2], std::make_pair(Action::FreeCompleted, uint64_t{512}));
  EXPECT_EQ(allocs[3], std::make_pair(Action::FreeCompleted, uint64_t{1048576}));
  EXPECT_EQ(allocs[4], std::make_pair(Action::FreeCompleted, uint64_t{2097152}));
  ASSERT_EQ(top_frames.size(), 2u);
  EXPECT_EQ(top_frames[0], "/home/u/train.py:10 step") << "the size line is not a frame";
  EXPECT_EQ(top_frames[1], "/home/u/model.py:5 forward");
}

// Hostile plot data: a suffix chain that points forward (it would never end), an action naming no
// element: refused with a reason, not read.
TEST(Load, HostilePlotDataIsRefused) {
  auto loop = loadSnapshotBytes(bytesOf(plotPage(
      "[[2, 7], [1, 0], [0, 1], [4, 0], [3, 3], [7, null], [6, 5], [5, 6]]", "[0, 1, 2]")));
  ASSERT_FALSE(loop.ok());
  EXPECT_NE(loop.error().message.find("does not end"), std::string::npos) << loop.error().message;
  auto bad = loadSnapshotBytes(bytesOf(plotPage(kSuffixes, "[0, 9]")));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("names no element"), std::string::npos) << bad.error().message;
  auto deep = loadSnapshotBytes(bytesOf(plotPage(kSuffixes, std::string(100000, '[') + "0")));
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.error().message.find("nested deeper than 8"), std::string::npos)
      << deep.error().message;
  auto broken = loadSnapshotBytes(bytesOf(plotPage(kSuffixes, "[0, 1")));
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.error().message.find("invalid JSON"), std::string::npos);
}

TEST(Load, HtmlWithoutSnapshotIsRefused) {
  auto s = loadSnapshotBytes(bytesOf("<html><body>hello</body></html>"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("no \"base64\" field"), std::string::npos);
}

TEST(Load, JsonFormMatchesPickle) {
  std::string json = R"({"segments": [{"device": 0, "address": 2097152, "total_size": 2097152,
     "stream": 0, "segment_type": "small", "segment_pool_id": [0, 0],
     "blocks": [{"address": 2097152, "size": 512, "requested_size": 300, "state": "active_allocated",
                 "frames": [{"filename": "m.py", "line": 4, "name": "f"}]},
                {"address": 2097664, "size": 2096640, "requested_size": 0, "state": "inactive", "frames": []}]}],
     "device_traces": [[{"action": "alloc", "addr": 2097152, "size": 300, "stream": 0, "time_us": 10,
                         "frames": [{"filename": "m.py", "line": 4, "name": "f"}]}]]})";
  auto s = loadSnapshotBytes(bytesOf(json));
  ASSERT_TRUE(s.ok()) << s.error().describe();
  EXPECT_EQ(s->source, SourceFormat::Json);
  auto p = loadSnapshotBytes(memforensics::testing::buildPickle(sample()));
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(s->blocks.size(), p->blocks.size());
  EXPECT_EQ(s->blocks[0].requested_size, p->blocks[0].requested_size);
  EXPECT_EQ(s->trace(0)[0].addr, p->trace(0)[0].addr);
  EXPECT_EQ(s->strings.get(s->stacks.frame(s->stacks.stack(s->trace(0)[0].stack)[0]).filename),
            "m.py");
}

TEST(Load, InvalidJsonReportsPosition) {
  auto s = loadSnapshotBytes(bytesOf("{\"segments\": [1, 2,"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("invalid JSON"), std::string::npos);
  EXPECT_GT(s.error().offset, 0);
}

TEST(Load, UnknownContentAndMissingFiles) {
  auto s = loadSnapshotBytes(bytesOf("PK\x03\x04 zip file"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("unrecognized file content (first byte 0x50)"),
            std::string::npos);
  auto m = loadSnapshotFile("/nonexistent/file.pickle");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("cannot open '/nonexistent/file.pickle'"), std::string::npos);
  auto d = loadSnapshotFile("/");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("is a directory"), std::string::npos);
}

TEST(Load, FileIsDetectedByContentNotName) {
  auto path = std::filesystem::temp_directory_path() / "memf_load_test_snapshot.bin";
  auto pk = memforensics::testing::buildPickle(sample());
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(pk.data()), static_cast<std::streamsize>(pk.size()));
  }
  auto s = loadSnapshotFile(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(s.ok()) << s.error().describe();
  EXPECT_EQ(s->input_bytes, pk.size());
}

}  // namespace
}  // namespace memforensics::format
