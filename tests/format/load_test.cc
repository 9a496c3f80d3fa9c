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
