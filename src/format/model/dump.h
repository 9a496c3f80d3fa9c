// dump.h: the stable, line-oriented text form of a snapshot (`memforensics dump`).
//
// One line per segment, block and event, fields in a fixed order, numbers in decimal except
// addresses (hex), so two dumps can be diffed and golden tests can compare them byte for byte.
#pragma once

#include <ostream>

#include "format/model/snapshot.h"

namespace memforensics::format {

struct DumpOptions {
  bool stacks = false;  // also print every referenced stack, frame by frame
};

void dumpSnapshot(const Snapshot& s, std::ostream& out, const DumpOptions& options = {});

}  // namespace memforensics::format
