// output.h: how commands write their output files.
#pragma once
#include <functional>
#include <ostream>
#include <string>

#include "common/status.h"

namespace memforensics::cli {

// Writes through a temporary file renamed into place at the end ("-" = standard output), so a
// failed command never leaves a partial file under the requested name.
Status writeOutput(const std::string& path, const std::function<Status(std::ostream&)>& body);

}  // namespace memforensics::cli
