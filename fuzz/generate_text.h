// generate_text.h: structure-aware generators of the text inputs that are not snapshots, for
// fuzz_pipeline: torch.profiler Kineto traces, export_memory_timeline files (both forms) and
// `ranks --json` shards. Each reads its choices from the fuzzer's bytes (FuzzedDataProvider) and
// writes text a reader takes, mostly well formed, with the shapes that once cost the readers time
// or memory (op chains that touch end to start, deep op stacks, long runs of identical rows, deep
// nesting in keys the reader ignores) and hostile values mixed in (negative, huge and fractional
// numbers, wrong types, control characters and invalid UTF-8 in names).
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

namespace memforensics::fuzz {

// A Kineto chrome trace (`traceEvents` of [memory] instants and cpu_op / user_annotation /
// python_function durations, deviceProperties, distributedInfo, baseTimeNanoseconds).
std::string generateKinetoTrace(FuzzedDataProvider& p);

// An export_memory_timeline file: the raw rows [time_ns, action, bytes, category] or the
// [times, sizes] form.
std::string generateMemoryTimeline(FuzzedDataProvider& p);

// One to four `ranks --json` shards (a document each, sometimes JSON Lines of several).
std::vector<std::string> generateRankShards(FuzzedDataProvider& p);

}  // namespace memforensics::fuzz
