// render_timeline.h: text, CSV and JSON renderings of the `timeline` result (docs/cli.md).
#pragma once

#include <ostream>

#include "analysis/session/timeline.h"

namespace memforensics::report {

// Per device: peaks, the downsampling note, a table of phases with the peaks inside each, and an
// ASCII sparkline of requested bytes.
void renderTimelineText(const analysis::TimelineResult& r, std::ostream& out);
// One row per kept point: device,event,time_us,reserved,allocated,requested,pending_free (with a
// header line when `header`). event -1 is the start state; time_us is empty when unknown.
void renderTimelineCsv(const analysis::TimelineResult& r, std::ostream& out, bool header = true);
// One compact JSON document, newline-terminated.
void renderTimelineJson(const analysis::TimelineResult& r, std::ostream& out);

}  // namespace memforensics::report
