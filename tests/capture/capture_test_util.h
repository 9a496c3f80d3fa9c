// capture_test_util.h: helpers shared by the capture tests: temporary paths and reading a native
// trace back with the format library's reader.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "format/trace/trace_reader.h"

namespace memforensics::capture::testing {

inline std::string tempPath(const std::string& name) {
  static std::atomic<int> counter{0};
  return ::testing::TempDir() + "memf_capture_" + std::to_string(::getpid()) + "_" +
         std::to_string(counter.fetch_add(1)) + "_" + name;
}

inline std::vector<uint8_t> readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

struct ReadBack {
  std::vector<format::trace::TraceEvent> events;
  std::vector<std::vector<std::string>>
      event_frames;  // per event: "file:name:line", innermost first
  format::trace::TraceEnd end;
  format::trace::TrailerInfo trailer;
  bool final_state = false;
  std::vector<format::trace::TraceSegment> segments;
  std::vector<format::trace::TraceBlock> blocks;
  bool opened = false;
};

// Every chunk up to where reading stops, with each event's stack spelled out.
inline ReadBack readTrace(const std::vector<uint8_t>& bytes) {
  using namespace format::trace;
  ReadBack out;
  auto r = TraceReader::open(bytes);
  if (!r) return out;
  out.opened = true;
  TraceReader& rd = **r;
  while (rd.next()) {
    if (rd.chunk().type != static_cast<uint8_t>(ChunkType::Events)) continue;
    for (const TraceEvent& e : rd.events()) {
      out.events.push_back(e);
      std::vector<std::string> frames;
      if (e.stack > kTraceRootStack) {
        for (uint32_t n = e.stack; n != kTraceRootStack; n = rd.stacks()[n].parent) {
          const FrameRec& f = rd.frames()[rd.stacks()[n].frame];
          frames.push_back(std::string(rd.string(f.filename)) + ":" +
                           std::string(rd.string(f.name)) + ":" + std::to_string(f.line));
        }
      }
      out.event_frames.push_back(std::move(frames));
    }
  }
  out.end = rd.end();
  out.trailer = rd.trailer();
  out.final_state = rd.hasFinalState();
  out.segments = rd.segments();
  out.blocks = rd.blocks();
  return out;
}

}  // namespace memforensics::capture::testing
