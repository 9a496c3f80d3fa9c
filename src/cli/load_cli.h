// load_cli.h: how every command opens its input: a progress bar on a terminal, and what the
// reader had to say (e.g. a cut-off native trace) as warnings on stderr.
#pragma once

#include <string>

#include "common/status.h"
#include "format/model/snapshot.h"

namespace memforensics::cli {

// defer_events: for a command that reads the events one device at a time through
// format::DeviceEvents (LoadOptions::defer_events).
Expected<format::Snapshot> loadWithProgress(const std::string& path, bool salvage,
                                            bool defer_events = false);

}  // namespace memforensics::cli
