// snapshot_pickle.h: writes a Snapshot back as a PyTorch snapshot pickle (the inverse of the
// reader).
//
// The output is a plain-data protocol-4 pickle with the structure torch.cuda.memory._dump_snapshot
// writes, so Python's pickle.load and PyTorch's memory_viz open it. Which keys appear follows
// Snapshot::traits, so the file looks like what that PyTorch generation wrote and reading it back
// gives the same traits and era: a bare segment list for 1.13, legacy block `history` for 1.13-2.0,
// `time_us`, `allocator_settings`, `external_annotations`, `compile_context`, `user_metadata` and
// `pool_id` only where the source had them.
//
// Sharing is written as Python writes it: each distinct string, frame dict and frames list is
// stored once in the pickle memo and referenced after that, so files stay about as small as
// PyTorch's.
//
// Not written (the model does not keep them): unknown top-level keys (Snapshot::ignored_keys),
// host_segments/host_traces (2.14; only their count is kept), allocator_settings keys whose value
// is not a scalar (other keys are written back with their values: AllocatorSettings::other),
// legacy history entries after the first and that entry's own `addr` (the block address is
// written), and trace entry keys outside
// action/addr/device_free/size/stream/time_us/frames/compile_context/ user_metadata/pool_id (e.g.
// forward_frames, category), and frame keys other than filename/line/name.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/status.h"
#include "format/model/snapshot.h"

namespace memforensics::format {

// Receives the pickle in pieces, in order; an error stops the writer, which returns it.
using ByteSinkFn = std::function<Status(std::span<const uint8_t>)>;

// Streams the pickle to `sink` in pieces of about 1 MiB, so a 600 MB pickle is never held whole in
// memory.
Status writeSnapshotPickle(const Snapshot& s, const ByteSinkFn& sink);

// The whole pickle in memory (tests, small snapshots).
std::vector<uint8_t> snapshotToPickle(const Snapshot& s);

}  // namespace memforensics::format
