// detect_history.cc: a history that cannot explain the file's state (a ring buffer of one entry, no
// trace): says so and how to record one that can (docs/findings.md). Being written by issue 13's
// work: no finding yet.
#include "analysis/findings_ctx.h"

namespace memforensics::analysis::detail {

void detectIncompleteHistory(Ctx&, std::vector<Finding>&) {}

}  // namespace memforensics::analysis::detail
