// render_blocks.h: text and JSON renderings of a BlocksResult (`memforensics blocks`).
#pragma once

#include <ostream>
#include <string>

#include "analysis/session/blocks.h"

namespace memforensics::report {

inline constexpr int kBlocksMapWidth = 64;  // characters per segment map

// One map line per segment, drawn to scale: '#' allocated, '+' pending-free, '.' free.
std::string blocksMap(const replay::ModelSegment& s, int width = kBlocksMapWidth);
void renderBlocksText(const analysis::BlocksResult& r, std::ostream& out);
// One compact JSON document, newline-terminated.
void renderBlocksJson(const analysis::BlocksResult& r, std::ostream& out);

}  // namespace memforensics::report
