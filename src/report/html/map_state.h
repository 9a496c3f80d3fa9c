// map_state.h: a block's state as the block map draws it, one rule for the keyframes
// (report_data.h MapBlock) and event stepping (stepping_view.h StepMapBlock::code).
#pragma once

#include <cstdint>

#include "format/model/snapshot.h"

namespace memforensics::analysis {

enum class MapState : uint8_t { Free = 0, Allocated = 1, PendingFree = 2 };

// Allocated and pending-free blocks as such; every other state (inactive, unknown) is free space.
inline MapState mapStateOf(format::BlockState s) {
  switch (s) {
    case format::BlockState::ActiveAllocated:
      return MapState::Allocated;
    case format::BlockState::ActivePendingFree:
      return MapState::PendingFree;
    default:
      return MapState::Free;
  }
}

}  // namespace memforensics::analysis
