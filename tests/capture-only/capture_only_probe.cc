// capture_only_probe.cc: the capture core of a MEMF_CAPTURE_ONLY build writes a trace that the
// full build's reader reads (scripts/capture-only-build.sh). No GoogleTest: capture-only builds
// have none.
//
// Usage: capture_only_probe OUT.bin
//
// Records a fixed stream through memforensics::start / capture::submit / stop (no backend, as in
// the capture tests): on each of two devices a 20 MiB segment, kRounds allocations and frees of
// varied sizes inside it (enough events that a zstd build compresses its chunks), one OOM on
// device 0, and a second segment on device 1 that is freed again. It then reads the file back with
// this build's reader, checks every event and the chunk codecs (all stored when the build has no
// zstd), and prints one JSON line with what `memforensics analyze --json` must say of the file:
// events by action and the reserved peak per device.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "capture/memforensics_capture.h"
#include "capture/record.h"
#include "format/trace/trace_reader.h"

#ifndef MEMF_HAVE_ZSTD
#define MEMF_HAVE_ZSTD 1
#endif

namespace {

namespace mc = memforensics::capture;
namespace mt = memforensics::format::trace;

constexpr int kRounds = 2000;               // alloc/free pairs per device
constexpr uint64_t kSegment = 20ull << 20;  // first segment of each device
constexpr uint64_t kSegment2 = 2ull << 20;  // device 1's second segment
constexpr uint64_t kBase[2] = {0x7f0000000000ull, 0x7e0000000000ull};

// Action ordinals of the format (c10 TraceEntry order).
enum : uint8_t { kAlloc = 0, kFreeReq = 1, kFreeDone = 2, kSegAlloc = 3, kSegFree = 4, kOom = 8 };
const char* const kActionName[] = {"alloc",         "free_requested", "free_completed",
                                   "segment_alloc", "segment_free",   "segment_map",
                                   "segment_unmap", "snapshot",       "oom"};

mc::CaptureRecord rec(uint32_t device, uint8_t action, uint64_t addr, uint64_t size) {
  mc::CaptureRecord r;
  r.device = device;
  r.action = action;
  r.addr = addr;
  r.size = size;
  r.stream = 0;
  return r;
}

std::vector<mc::CaptureRecord> stream() {
  std::vector<mc::CaptureRecord> out;
  for (uint32_t d = 0; d < 2; ++d) {
    out.push_back(rec(d, kSegAlloc, kBase[d], kSegment));
    for (int i = 0; i < kRounds; ++i) {
      uint64_t size = 512 * (1 + (i * 7919) % 200);  // whole blocks: requested == allocated
      uint64_t addr = kBase[d] + 512ull * ((i * 104729) % 8000);
      out.push_back(rec(d, kAlloc, addr, size));
      out.push_back(rec(d, kFreeReq, addr, size));
      out.push_back(rec(d, kFreeDone, addr, size));
    }
  }
  out.push_back(rec(0, kOom, 1ull << 30, 80ull << 30));  // addr: free device bytes
  out.push_back(rec(1, kSegAlloc, kBase[1] + kSegment, kSegment2));
  out.push_back(rec(1, kSegFree, kBase[1] + kSegment, kSegment2));
  return out;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "capture_only_probe: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return fail("usage: capture_only_probe OUT.bin");
  const std::string path = argv[1];
  memforensics::CaptureOptions o;
  o.devices = 2;
  o.stacks = false;
  o.handle_signals = false;
  o.stop_at_exit = false;
  o.zstd_level = 1;  // asked for: a build without zstd must store the chunks instead
  if (auto s = memforensics::start(path, o); !s.ok()) return fail("start: " + s.error().describe());
  const std::vector<mc::CaptureRecord> recs = stream();
  for (const mc::CaptureRecord& r : recs) {
    int spins = 0;
    while (!mc::submit(r)) {  // ring full: the writer drains it within a millisecond
      if (++spins > 1000000) return fail("submit refused for too long");
    }
  }
  if (auto s = memforensics::stop(); !s.ok()) return fail("stop: " + s.error().describe());

  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  auto opened = mt::TraceReader::open(bytes);
  if (!opened) return fail("reading back: " + opened.error().describe());
  mt::TraceReader& rd = **opened;
  // The writer drains the rings device by device: the order is kept within a device.
  std::map<uint32_t, std::vector<mc::CaptureRecord>> per_device;
  for (const mc::CaptureRecord& r : recs) per_device[r.device].push_back(r);
  std::map<uint32_t, size_t> next;
  size_t i = 0, chunks = 0, zstd_chunks = 0;
  while (rd.next()) {
    ++chunks;
    if (rd.chunk().codec == static_cast<uint8_t>(mt::Codec::Zstd)) ++zstd_chunks;
    if (rd.chunk().type != static_cast<uint8_t>(mt::ChunkType::Events)) continue;
    for (const mt::TraceEvent& e : rd.events()) {
      const std::vector<mc::CaptureRecord>& want = per_device[e.device];
      size_t& k = next[e.device];
      if (k >= want.size()) return fail("more events in the file than were submitted");
      const mc::CaptureRecord& r = want[k];
      if (e.action != r.action || e.addr != r.addr || e.size != r.size) {
        return fail("device " + std::to_string(e.device) + " event " + std::to_string(k) +
                    " differs from the record submitted");
      }
      ++k;
      ++i;
    }
  }
  if (!rd.end().complete) return fail("file not complete: " + rd.end().reason);
  if (i != recs.size()) {
    return fail(std::to_string(i) + " events read, " + std::to_string(recs.size()) + " submitted");
  }
  if (!MEMF_HAVE_ZSTD && zstd_chunks != 0) return fail("zstd chunks from a build without zstd");
  if (MEMF_HAVE_ZSTD && zstd_chunks == 0) return fail("a zstd build compressed no chunk");

  std::map<uint32_t, std::map<std::string, uint64_t>> counts;
  for (const mc::CaptureRecord& r : recs) ++counts[r.device][kActionName[r.action]];
  const uint64_t peak[2] = {kSegment, kSegment + kSegment2};
  std::string json = "{\"zstd\":" + std::string(MEMF_HAVE_ZSTD ? "true" : "false") +
                     ",\"chunks\":" + std::to_string(chunks) +
                     ",\"zstd_chunks\":" + std::to_string(zstd_chunks) + ",\"devices\":{";
  for (uint32_t d = 0; d < 2; ++d) {
    json += (d ? ",\"" : "\"") + std::to_string(d) +
            "\":{\"peak_reserved_bytes\":" + std::to_string(peak[d]) + ",\"events_by_action\":{";
    bool first = true;
    for (const auto& [name, n] : counts[d]) {
      json += (first ? "\"" : ",\"") + name + "\":" + std::to_string(n);
      first = false;
    }
    json += "}}";
  }
  json += "}}";
  std::printf("%s\n", json.c_str());
  return 0;
}
