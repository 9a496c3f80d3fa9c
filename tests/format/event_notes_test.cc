// event_notes_test.cc: the trace entries' seldom-used strings, interned apart from Event
// (format/model/snapshot.h), and what the readers put there.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "format/load/load.h"
#include "format/load/snapshot_trace.h"
#include "format/model/snapshot.h"

namespace memforensics::format {
namespace {

TEST(EventNotesTable, RowZeroIsTheEmptyOne) {
  EventNotesTable t;
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0], EventNotes{});
  EXPECT_EQ(t.intern(EventNotes{}), 0u);
  EXPECT_EQ(t.intern(EventNotes{3, 0, 0}), 1u);
  EXPECT_EQ(t.intern(EventNotes{}), 0u);  // after another row: still 0, no new row
  EXPECT_EQ(t.size(), 2u);
}

TEST(EventNotesTable, EqualRowsShareAnIdWhereverTheyRecur) {
  EventNotesTable t;
  const EventNotes a{1, 2, 0}, b{1, 0, 2}, c{0, 1, 2}, d{2, 1, 0};
  const uint32_t ia = t.intern(a), ib = t.intern(b), ic = t.intern(c), id = t.intern(d);
  EXPECT_EQ(std::set<uint32_t>({ia, ib, ic, id}).size(), 4u);  // each field counts
  // Not only the last row: a row seen earlier is found again.
  EXPECT_EQ(t.intern(b), ib);
  EXPECT_EQ(t.intern(a), ia);
  EXPECT_EQ(t.intern(a), ia);
  EXPECT_EQ(t.intern(d), id);
  EXPECT_EQ(t.size(), 5u);
  EXPECT_EQ(t[ia], a);
  EXPECT_EQ(t[ib], b);
  EXPECT_EQ(t[ic], c);
  EXPECT_EQ(t[id], d);
}

TEST(EventNotesTable, ManyDistinctRowsStayDistinctAndFindable) {
  EventNotesTable t;
  constexpr uint32_t kRows = 20000;
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < kRows; ++i)
    ids.push_back(t.intern(EventNotes{i % 97 + 1, i / 97, i % 3 == 0 ? i : 0}));
  EXPECT_EQ(t.size(), kRows + 1);
  EXPECT_EQ(std::set<uint32_t>(ids.begin(), ids.end()).size(), kRows);
  for (uint32_t i = kRows; i-- > 0;) {  // in reverse: no help from the last row
    const EventNotes n{i % 97 + 1, i / 97, i % 3 == 0 ? i : 0};
    ASSERT_EQ(t.intern(n), ids[i]) << i;
    ASSERT_EQ(t[ids[i]], n) << i;
  }
  EXPECT_EQ(t.size(), kRows + 1);
}

// A 2.9.1 file writes compile_context "N/A" on every entry: one row for all of them, every entry
// pointing at it, and no action name kept for known actions; the same after a round trip through
// the native trace, read on threads and serially.
TEST(EventNotes, ARealFileKeepsOneRowForItsRepeatedCompileContext) {
  const std::filesystem::path file =
      std::filesystem::path(MEMF_REAL_SNAPSHOTS) / "zidongliu__decomfl__memory.pickle";
  if (!std::filesystem::exists(file)) GTEST_SKIP() << file << " is not there";
  auto snap = loadSnapshotFile(file.string());
  ASSERT_TRUE(snap.ok()) << snap.error().describe();
  ASSERT_GT(snap->events.size(), 1000u);
  ASSERT_TRUE(snap->traits.has_compile_context);
  auto check = [](const Snapshot& s, const char* what) {
    std::set<uint32_t> rows;
    for (const Event& e : s.events) {
      rows.insert(e.notes);
      const EventNotes& n = s.notesOf(e);
      ASSERT_EQ(s.strings.get(n.compile_context), "N/A") << what;
      ASSERT_EQ(n.user_metadata, kEmptyStr) << what;
      if (e.action != Action::Unknown) {
        ASSERT_EQ(n.action_name, kEmptyStr) << what;
      }
    }
    EXPECT_EQ(rows.size(), 1u) << what;
    EXPECT_LE(s.event_notes.size(), 2u) << what;
  };
  check(*snap, "pickle");
  trace::VectorSink sink;
  TraceWriteOptions w;
  w.chunk_bytes = 4096;  // many Events chunks, each with its own notes on the threads
  Status st = writeSnapshotTrace(*snap, sink, w);
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto serial = readSnapshotTraceSerial(sink.data);
  ASSERT_TRUE(serial.ok()) << serial.error().describe();
  ASSERT_EQ(serial->events.size(), snap->events.size());
  check(*serial, "native, serial");
  LoadOptions o;
  o.threads = 2;
  auto parallel = readSnapshotTraceParallelOnly(sink.data, o);
  ASSERT_TRUE(parallel.has_value());
  ASSERT_TRUE(parallel->ok()) << parallel->error().describe();
  ASSERT_EQ((*parallel)->events.size(), snap->events.size());
  check(**parallel, "native, 2 threads");
}

}  // namespace
}  // namespace memforensics::format
