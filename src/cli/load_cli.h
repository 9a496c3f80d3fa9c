// load_cli.h: how every command opens its input: a progress bar on a terminal, and what the
// reader had to say (e.g. a cut-off native trace) as warnings on stderr.
#pragma once

#include <string>

#include "common/status.h"
#include "format/model/snapshot.h"

namespace memforensics::cli {

Expected<format::Snapshot> loadWithProgress(const std::string& path, bool salvage);

}  // namespace memforensics::cli
