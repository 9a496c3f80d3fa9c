// export_perfetto.cc: Chrome trace-event JSON of the replayed counters, OOMs, peaks and
// annotations, from each device's session facts (the counters after every event).
#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "analysis/frames/frames.h"
#include "analysis/session/session.h"
#include "report/export.h"
#include "report/json_analysis.h"

namespace memforensics::report {

namespace {

using nlohmann::json;

// Snapshot strings are not guaranteed to be UTF-8: replace bad bytes rather than fail. ASCII-only
// output (\u escapes) keeps old importers that scan raw bytes (Perfetto's JSON tokenizer) happy.
std::string jsonString(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', true, json::error_handler_t::replace);
}
std::string dumpArgs(const json& j) {
  return j.dump(-1, ' ', true, json::error_handler_t::replace);
}

void appendInt(std::string& s, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  s.append(buf, r.ptr);
}
void appendUint(std::string& s, uint64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  s.append(buf, r.ptr);
}

// Streams the traceEvents array one event per line. Every event starts with "ts": Perfetto's
// tokenizer extracts it by scanning the keys in order before parsing the event properly.
class EventWriter {
 public:
  explicit EventWriter(std::ostream& out) : out_(out) {}

  void begin(std::string_view ph, int64_t ts, int64_t pid, int64_t tid) {
    line_.clear();
    line_ += count_++ == 0 ? "\n" : ",\n";
    line_ += "{\"ts\":";
    appendInt(line_, ts);
    line_ += ",\"ph\":\"";
    line_ += ph;
    line_ += "\",\"pid\":";
    appendInt(line_, pid);
    line_ += ",\"tid\":";
    appendInt(line_, tid);
  }
  // Appends ,"key":<raw JSON value>.
  void raw(std::string_view key, std::string_view value) {
    line_ += ",\"";
    line_ += key;
    line_ += "\":";
    line_ += value;
  }
  void end() {
    line_ += '}';
    out_.write(line_.data(), static_cast<std::streamsize>(line_.size()));
  }
  std::string& line() { return line_; }

 private:
  std::ostream& out_;
  std::string line_;
  size_t count_ = 0;
};

// Thread ids are unique across processes (some importers key threads by tid alone). Computed
// modulo 2^64 so that a hostile device number cannot overflow; real ordinals are small.
int64_t pidOf(int64_t device) {
  return static_cast<int64_t>(static_cast<uint64_t>(device) + 1);
}
int64_t memoryTid(int64_t device) {
  return static_cast<int64_t>(static_cast<uint64_t>(pidOf(device)) * 1000);
}
int64_t annotationTid(int64_t device, size_t lane) {
  return static_cast<int64_t>(static_cast<uint64_t>(memoryTid(device)) + 1 + lane);
}

constexpr const char* kCounterNames[4] = {"reserved", "allocated", "requested", "pending_free"};
std::array<uint64_t, 4> values(const replay::Counters& c) {
  return {c.reserved, c.allocated, c.requested, c.pending};
}

struct TimeAxis {
  bool timed = false;
  int64_t origin = 0;  // absolute time_us of ts 0
  int64_t rel(int64_t t) const {
    // t >= 0 and origin >= -1: only t near INT64_MAX can overflow.
    if (origin < 0 && t > std::numeric_limits<int64_t>::max() + origin) {
      return std::numeric_limits<int64_t>::max();
    }
    return t - origin;
  }
};

// ts of every event of a device: never decreasing, events without time_us keep the previous ts.
std::vector<int64_t> eventTimestamps(std::span<const format::Event> events, const TimeAxis& axis) {
  std::vector<int64_t> ts(events.size());
  int64_t last = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    if (!axis.timed) {
      ts[i] = static_cast<int64_t>(i) + 1;
      continue;
    }
    if (events[i].time_us >= 0) last = std::max(last, axis.rel(events[i].time_us));
    ts[i] = last;
  }
  return ts;
}

// ts of the state after `event` (-1: the start state).
int64_t tsAt(const std::vector<int64_t>& ts, int64_t event) {
  if (event < 0 || ts.empty()) return 0;
  return ts[std::min(static_cast<size_t>(event), ts.size() - 1)];
}

void writeMetadata(EventWriter& w, int64_t pid, int64_t tid, std::string_view what,
                   const std::string& args) {
  w.begin("M", 0, pid, tid);
  w.raw("name", jsonString(what));
  w.raw("args", args);
  w.end();
}

// The counters after every event, from the session's series ([0] = the start state).
void writeCounters(EventWriter& w, const analysis::DeviceFacts& f, const std::vector<int64_t>& ts) {
  const int64_t pid = pidOf(f.device), tid = memoryTid(f.device);
  auto sample = [&](int64_t t, size_t k, uint64_t v) {
    w.begin("C", t, pid, tid);
    w.raw("name", std::string("\"") + kCounterNames[k] + "\"");
    w.line() += ",\"args\":{\"bytes\":";
    appendUint(w.line(), v);
    w.line() += '}';
    w.end();
  };
  if (f.series.empty()) return;
  auto prev = values(f.series[0]);
  for (size_t k = 0; k < prev.size(); ++k) sample(0, k, prev[k]);
  for (size_t i = 0; i + 1 < f.series.size() && i < ts.size(); ++i) {
    auto cur = values(f.series[i + 1]);
    for (size_t k = 0; k < cur.size(); ++k) {
      if (cur[k] != prev[k]) sample(ts[i], k, cur[k]);
    }
    prev = cur;
  }
}

void writeOoms(EventWriter& w, const format::Snapshot& snap, const replay::DeviceSummary& s,
               const std::vector<int64_t>& ts, const PerfettoOptions& opt) {
  for (const auto& o : s.ooms) {
    json args = countersJson(o.at);
    args["request_bytes"] = o.request_bytes;
    args["device_free_bytes"] = o.device_free;
    args["stream"] = o.stream;
    args["event"] = o.event;
    args["time_us"] = optJson(o.time_us);
    json frames = json::array();
    for (const auto& f : analysis::userFrames(snap, o.stack, opt.frames_per_oom)) {
      frames.push_back(exportFrameText(f.name, f.filename, f.line));
    }
    args["frames"] = std::move(frames);
    w.begin("i", tsAt(ts, o.event), pidOf(s.device), memoryTid(s.device));
    w.raw("s", "\"p\"");
    w.raw("name", "\"OOM\"");
    w.raw("args", dumpArgs(args));
    w.end();
  }
}

void writePeaks(EventWriter& w, const replay::DeviceSummary& s, const std::vector<int64_t>& ts) {
  const std::pair<const char*, const replay::Peak*> peaks[] = {
      {"peak reserved", &s.peak_reserved},
      {"peak requested", &s.peak_requested},
      {"peak allocated", &s.peak_allocated}};
  for (const auto& [name, p] : peaks) {
    json args = {{"bytes", p->bytes}, {"event", p->event}, {"time_us", optJson(p->time_us)}};
    w.begin("i", tsAt(ts, p->event), pidOf(s.device), memoryTid(s.device));
    w.raw("s", "\"p\"");
    w.raw("name", jsonString(name));
    w.raw("args", dumpArgs(args));
    w.end();
  }
}

struct AnnotationAt {
  int64_t ts;
  size_t order;  // position in the file, to keep equal times in file order
  format::StrId name;
  format::StrId stage;
};
struct Slice {
  int64_t begin, end;
  size_t order;
  format::StrId name;
};

// Pairs START/END by name (an END closes the latest open START of its name) and lays the slices
// out on lanes where they nest, since B/E events on one thread must form a stack.
void writeAnnotations(EventWriter& w, const format::Snapshot& snap, int64_t device,
                      std::vector<AnnotationAt> anns) {
  if (anns.empty()) return;
  std::stable_sort(anns.begin(), anns.end(),
                   [](const auto& a, const auto& b) { return a.ts < b.ts; });
  std::vector<Slice> slices;
  std::vector<AnnotationAt> unmatched;
  std::map<format::StrId, std::vector<const AnnotationAt*>> open;
  for (const auto& a : anns) {
    std::string_view stage = snap.strings.get(a.stage);
    if (stage == "START") {
      open[a.name].push_back(&a);
    } else if (stage == "END" && !open[a.name].empty()) {
      const AnnotationAt* s = open[a.name].back();
      open[a.name].pop_back();
      slices.push_back({s->ts, a.ts, s->order, a.name});
    } else {
      unmatched.push_back(a);
    }
  }
  for (const auto& [name, starts] : open) {
    for (const AnnotationAt* s : starts) unmatched.push_back(*s);
  }
  // Outer slices first: by begin, then longest, then file order.
  std::sort(slices.begin(), slices.end(), [](const Slice& a, const Slice& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end > b.end;
    return a.order < b.order;
  });
  std::vector<std::vector<int64_t>> open_ends;  // per lane: ends of the open slices, a stack
  std::vector<std::vector<const Slice*>> lanes;
  for (const Slice& s : slices) {
    size_t lane = 0;
    for (; lane < lanes.size(); ++lane) {
      auto& st = open_ends[lane];
      while (!st.empty() && st.back() <= s.begin) st.pop_back();
      if (st.empty() || st.back() >= s.end) break;
    }
    if (lane == lanes.size()) {
      lanes.emplace_back();
      open_ends.emplace_back();
    }
    open_ends[lane].push_back(s.end);
    lanes[lane].push_back(&s);
  }
  const int64_t pid = pidOf(device);
  size_t thread_count = std::max<size_t>(lanes.size(), 1);
  for (size_t lane = 0; lane < thread_count; ++lane) {
    std::string name = lane == 0 ? "annotations" : "annotations " + std::to_string(lane + 1);
    writeMetadata(w, pid, annotationTid(device, lane), "thread_name",
                  "{\"name\":" + jsonString(name) + "}");
    writeMetadata(w, pid, annotationTid(device, lane), "thread_sort_index",
                  "{\"sort_index\":" + std::to_string(lane + 1) + "}");
  }
  // Replays each lane's stack to write B/E in an order that nests even at equal timestamps.
  for (size_t lane = 0; lane < lanes.size(); ++lane) {
    const int64_t tid = annotationTid(device, lane);
    std::vector<int64_t> st;
    auto close = [&] {
      w.begin("E", st.back(), pid, tid);
      w.end();
      st.pop_back();
    };
    for (const Slice* s : lanes[lane]) {
      while (!st.empty() && st.back() <= s->begin) close();
      w.begin("B", s->begin, pid, tid);
      w.raw("name", jsonString(snap.strings.get(s->name)));
      w.end();
      st.push_back(s->end);
    }
    while (!st.empty()) close();
  }
  for (const auto& a : unmatched) {
    w.begin("i", a.ts, pid, annotationTid(device, 0));
    w.raw("s", "\"t\"");
    w.raw("name", jsonString(snap.strings.get(a.name)));
    w.raw("args",
          dumpArgs({{"stage", std::string(snap.strings.get(a.stage))}, {"unmatched", true}}));
    w.end();
  }
}

// Writes the document for `devices` (each device's facts handed to `device_facts` in turn, so a
// caller may build them one at a time).
template <typename FactsOf>
Status writePerfetto(const format::Snapshot& snap, const std::vector<int64_t>& devices,
                     FactsOf&& device_facts, std::ostream& out, const PerfettoOptions& opt) {
  // Both by binary search (asked once per annotation: a scan was annotations x devices).
  const std::vector<int64_t> all = snap.devices();  // sorted
  std::vector<int64_t> sorted_devices = devices;
  std::sort(sorted_devices.begin(), sorted_devices.end());
  auto exported = [&](int64_t d) {
    return std::binary_search(sorted_devices.begin(), sorted_devices.end(), d);
  };
  auto known = [&](int64_t d) { return std::binary_search(all.begin(), all.end(), d); };

  // The time origin: one microsecond before the earliest time in the whole file (so that a
  // one-device export lines up with the full one), leaving ts 0 to the start state. Only event
  // times make a time axis: annotations alone cannot place the counters.
  int64_t first = std::numeric_limits<int64_t>::max();
  for (const auto& e : snap.events) {
    if (e.time_us >= 0) first = std::min(first, e.time_us);
  }
  TimeAxis axis;
  axis.timed = first != std::numeric_limits<int64_t>::max();
  if (axis.timed) {
    for (const auto& a : snap.annotations) {
      if (a.time_us >= 0) first = std::min(first, a.time_us);
    }
    axis.origin = first - 1;
  }
  // Annotations per device; those without a place on the time axis are only counted.
  std::map<int64_t, std::vector<AnnotationAt>> anns;
  size_t skipped = 0;
  for (size_t i = 0; i < snap.annotations.size(); ++i) {
    const auto& a = snap.annotations[i];
    if (a.device >= 0 && !exported(a.device)) {
      skipped += !known(a.device);  // another device's annotation is filtered, not lost
      continue;
    }
    if (!axis.timed || a.time_us < 0) {
      ++skipped;
      continue;
    }
    for (int64_t d : devices) {
      if (a.device < 0 || a.device == d)
        anns[d].push_back({axis.rel(a.time_us), i, a.name, a.stage});
    }
  }

  json other = {
      {"tool", "memforensics"},
      {"source_format", std::string(format::sourceFormatName(snap.source))},
      {"pytorch_era", snap.traits.era()},
      {"time_axis", axis.timed ? "time_us" : "event_index"},
      {"ts_meaning", axis.timed ? "microseconds since time_origin_us; ts 0 is the replayed state "
                                  "before the first event"
                                : "event index + 1 (the file has no time_us); ts 0 is the "
                                  "replayed state before the first event"},
      {"counters",
       "bytes per device: reserved (memory_reserved), allocated (memory_allocated), "
       "requested (memory_viz active timeline), pending_free; sampled at ts 0 and "
       "whenever a value changes"},
      {"annotations_skipped", std::to_string(skipped)},
  };
  if (axis.timed) other["time_origin_us"] = std::to_string(axis.origin);
  std::string devs;
  for (int64_t d : devices) {
    if (!devs.empty()) devs += ',';
    devs += std::to_string(d);
  }
  other["devices"] = devs;

  out << "{\"otherData\":" << dumpArgs(other) << ",\n\"traceEvents\":[";
  EventWriter w(out);
  for (int64_t d : devices) {
    const int64_t pid = pidOf(d);
    writeMetadata(w, pid, memoryTid(d), "process_name",
                  "{\"name\":" + jsonString("GPU " + std::to_string(d)) + "}");
    writeMetadata(w, pid, memoryTid(d), "process_sort_index",
                  "{\"sort_index\":" + std::to_string(d) + "}");
    writeMetadata(w, pid, memoryTid(d), "thread_name", "{\"name\":\"memory\"}");
    writeMetadata(w, pid, memoryTid(d), "thread_sort_index", "{\"sort_index\":0}");

    const analysis::DeviceFacts& f = device_facts(d);
    std::vector<int64_t> ts = eventTimestamps(f.events, axis);
    writeCounters(w, f, ts);
    writeOoms(w, snap, f.summary, ts, opt);
    if (opt.peak_instants) writePeaks(w, f.summary, ts);
    writeAnnotations(w, snap, d, std::move(anns[d]));
    if (!out) break;
  }
  // No newline after the closing brace: Perfetto's tokenizer rejects data after the top-level
  // object when it arrives in a later read chunk.
  out << "\n]}";
  out.flush();
  if (!out) return Error{"writing the trace failed"};
  return Status::Ok();
}

}  // namespace

Status exportPerfetto(const format::Snapshot& snap, std::span<const analysis::DeviceFacts> facts,
                      std::ostream& out, const PerfettoOptions& opt) {
  std::vector<int64_t> devices;
  for (const auto& f : facts) devices.push_back(f.device);
  size_t next = 0;
  return writePerfetto(
      snap, devices, [&](int64_t) -> const analysis::DeviceFacts& { return facts[next++]; }, out,
      opt);
}

Status exportPerfetto(const format::Snapshot& snap, std::ostream& out, const PerfettoOptions& opt) {
  std::vector<int64_t> devices = snap.devices();
  if (opt.device) {
    if (std::find(devices.begin(), devices.end(), *opt.device) == devices.end()) {
      return Error{"device " + std::to_string(*opt.device) + " is not in the snapshot"};
    }
    devices = {*opt.device};
  }
  // One session per device, built when its turn comes: a backward pass and forward pass 1 with
  // the counters after every event; nothing else is visited.
  analysis::DeviceFacts current;
  analysis::SessionOptions so;
  so.series = true;
  return writePerfetto(
      snap, devices,
      [&](int64_t d) -> const analysis::DeviceFacts& {
        analysis::DeviceSession session(snap, d, so);
        current = session.take();
        return current;
      },
      out, opt);
}

}  // namespace memforensics::report
