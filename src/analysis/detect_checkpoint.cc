// detect_checkpoint.cc: the activation-checkpointing opportunity (docs/findings.md): activations
// held for backward dominate the peak. Being written by issue 13's work: no finding yet.
#include "analysis/findings_ctx.h"

namespace memforensics::analysis::detail {

void detectCheckpointing(Ctx&, std::vector<Finding>&, const FindingsOptions&) {}

}  // namespace memforensics::analysis::detail
