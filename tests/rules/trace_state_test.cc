// trace_state_test.cc: the trace's own live-set on the range type, and the one final-state
// synthesis that the loader and the capture share.
#include "format/trace/trace_state.h"

#include <gtest/gtest.h>

namespace memforensics::format::trace {
namespace {

TraceEvent ev(uint8_t action, uint64_t addr, uint64_t size) {
  TraceEvent e;
  e.action = action;
  e.addr = addr;
  e.size = size;
  return e;
}

// A segment event whose range wraps the address space is no range: it changes nothing (it used
// to be stored with an end past 2^64, and an unmap then cut it at the top).
TEST(TraceStateRanges, WrappingSegmentIsIgnored) {
  DeviceTraceState s;
  s.apply(ev(3, ~uint64_t{0} - 0xff, 0x1000));
  EXPECT_EQ(s.reservedBytes(), 0u);
  EXPECT_TRUE(s.reserved().empty());
  s.apply(ev(3, 0x1000, 0x1000));
  s.apply(ev(3, 0x2000, 0x1000));  // touching: still two segments
  EXPECT_EQ(s.reserved().size(), 2u);
  s.apply(ev(5, 0x1800, 0x1000));  // mapped over both: counts once
  EXPECT_EQ(s.reservedBytes(), 0x2000u);
  s.apply(ev(6, 0x1000, 0x1400));  // unmap cuts the ranges it meets
  EXPECT_EQ(s.reserved().ranges(), (std::vector<AddressRange>{{0x2400, 0x2800}, {0x2800, 0x3000}}));
}

TEST(TraceStateRanges, RestoreRefusesOverlappingOrWrappingSegments) {
  DeviceTraceState s;
  EXPECT_TRUE(s.restore(4, {}, {{0x1000, 0x1000}, {0x2000, 0x1000}}));
  EXPECT_EQ(s.reservedBytes(), 0x2000u);
  EXPECT_FALSE(s.restore(4, {}, {{0x1000, 0x2000}, {0x2000, 0x1000}}));  // overlap
  EXPECT_EQ(s.reservedBytes(), 0x2000u);                                 // the valid one kept
  EXPECT_FALSE(s.restore(4, {}, {{~uint64_t{0} - 1, 16}}));              // wraps
  EXPECT_EQ(s.reservedBytes(), 0u);
}

// The synthesis: an allocation outside every range gets its own segment, cut where the next range
// begins; requested_size counts the pending block too, as PyTorch's snapshot() does.
TEST(TraceStateRanges, SynthesizedFinalState) {
  DeviceTraceState s;
  s.apply(ev(3, 0x200000, 2u << 20));  // a small-pool segment
  s.apply(ev(0, 0x200000, 1000));
  s.apply(ev(0, 0x200400, 500));
  s.apply(ev(1, 0x200400, 500));     // pending at the end
  s.apply(ev(0, 0x1ffe00, 100000));  // before the segment: orphan, cut at 0x200000
  std::vector<TraceBlock> blocks;
  SynthesizedState st = synthesizeFinalState(s, 2, blocks);
  ASSERT_EQ(st.segments.size(), 2u);
  EXPECT_EQ(st.orphans, 1u);
  EXPECT_EQ(st.segments[0].address, 0x1ffe00u);
  EXPECT_EQ(st.segments[0].total_size, 0x200u);
  EXPECT_TRUE(st.segments[0].is_large);
  const TraceSegment& g = st.segments[1];
  EXPECT_EQ(g.device, 2);
  EXPECT_FALSE(g.is_large);
  EXPECT_EQ(g.allocated_size, 1024u);
  EXPECT_EQ(g.active_size, 1024u + 512u);
  EXPECT_EQ(g.requested_size, 1500u);
  uint64_t covered = 0;
  for (uint32_t i = 0; i < g.block_count; ++i) covered += blocks[g.first_block + i].size;
  EXPECT_EQ(covered, g.total_size);
}

}  // namespace
}  // namespace memforensics::format::trace
