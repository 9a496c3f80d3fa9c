// dump.cc: see dump.h for the line format.
#include "format/model/dump.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <set>
#include <string>

#include "common/text_escape.h"

namespace memforensics::format {

namespace {
std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%" PRIx64, v);
  return b;
}
// Quotes a string so that the line stays one line and parseable (common/text_escape.h).
std::string quoted(std::string_view s) {
  return quoteText(s);
}
std::string stackRef(StackId s) {
  if (s == kNoStack) return "-";
  if (s == kEmptyStack) return "[]";
  return std::to_string(s);
}
}  // namespace

void dumpSnapshot(const Snapshot& s, std::ostream& out, const DumpOptions& opt) {
  std::set<StackId> used;
  auto use = [&](StackId id) {
    if (id != kNoStack && id != kEmptyStack) used.insert(id);
    return stackRef(id);
  };
  out << "# memforensics dump 1\n";
  out << "# source=" << sourceFormatName(s.source) << " protocol=" << s.pickle_protocol << " era="
      << (s.source == SourceFormat::ProfilerTrace || s.source == SourceFormat::MemoryTimeline
              ? std::string("none")
              : s.traits.era())
      << " segments=" << s.segments.size() << " devices_with_traces=" << s.traceCount() << "\n";
  if (s.settings.present) {
    out << "settings conf=" << quoted(s.settings.conf)
        << " max_split_size=" << s.settings.max_split_size
        << " gc_threshold=" << s.settings.garbage_collection_threshold
        << " expandable_segments=" << (s.settings.expandable_segments ? 1 : 0) << " roundup=";
    for (int k = 0; k < 16; ++k) out << (k ? "," : "") << s.settings.roundup_power2_divisions[k];
    out << "\n";
  }
  for (const auto& seg : s.segments) {
    out << "segment device=" << seg.device << " addr=" << hex(seg.address)
        << " size=" << seg.total_size << " allocated=" << seg.allocated_size
        << " active=" << seg.active_size << " requested=" << seg.requested_size
        << " stream=" << seg.stream << " type=" << (seg.is_large ? "large" : "small")
        << " pool=" << seg.pool_a << "," << seg.pool_b
        << " expandable=" << (seg.is_expandable ? 1 : 0) << " stack=" << use(seg.stack)
        << " blocks=" << seg.block_count << "\n";
    for (const auto& b : s.blocksOf(seg)) {
      out << "  block addr=" << hex(b.address) << " size=" << b.size
          << " requested=" << b.requested_size << " state=" << blockStateName(b.state)
          << " stack=" << use(b.stack) << "\n";
    }
  }
  for (size_t d = 0; d < s.traceCount(); ++d) {
    const DeviceEvents events(s, d);  // a deferred snapshot: one device at a time
    const std::span<const Event> tr = events.span();
    out << "trace device=" << d << " events=" << tr.size() << "\n";
    for (size_t i = 0; i < tr.size(); ++i) {
      const Event& e = tr[i];
      out << d << ":" << i << " ";
      if (e.time_us >= 0) out << "t=" << e.time_us << " ";
      if (e.action == Action::Unknown) {
        // An action name as written: bare when it is a plain word (ASCII letters, digits, `_`,
        // `-`, `.`), else quoted, so that no name reads back as a field, a time or two words.
        const std::string_view name = s.strings.get(s.notesOf(e).action_name);
        const bool plain = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-' || c == '.';
        });
        out << (plain ? std::string(name) : quoted(name));
      } else {
        out << actionName(e.action);
      }
      if (e.action == Action::Oom)
        out << " size=" << e.size << " device_free=" << e.addr;
      else
        out << " addr=" << hex(e.addr) << " size=" << e.size;
      out << " stream=" << e.stream << " stack=" << use(e.stack);
      const EventNotes& notes = s.notesOf(e);
      if (notes.compile_context != kEmptyStr)
        out << " compile_context=" << quoted(s.strings.get(notes.compile_context));
      if (notes.user_metadata != kEmptyStr)
        out << " user_metadata=" << quoted(s.strings.get(notes.user_metadata));
      if (e.pool != 0) out << " pool=" << s.pools[e.pool].first << "," << s.pools[e.pool].second;
      out << "\n";
    }
  }
  for (const auto& a : s.annotations) {
    out << "annotation device=" << a.device << " t=" << a.time_us
        << " stage=" << escapeText(s.strings.get(a.stage))
        << " name=" << quoted(s.strings.get(a.name)) << "\n";
  }
  if (opt.stacks) {
    for (StackId id : used) {
      out << "stack " << id << "\n";
      for (FrameId f : s.stacks.stack(id)) {
        const Frame& fr = s.stacks.frame(f);
        out << "  " << quoted(s.strings.get(fr.filename)) << ":"
            << (fr.line == kUnknownLine ? std::string("?") : std::to_string(fr.line)) << " "
            << quoted(s.strings.get(fr.name)) << "\n";
      }
    }
  }
}

}  // namespace memforensics::format
