// torch_headers_probe.cc: compiled, never linked, against each set of real PyTorch headers by
// scripts/torch-headers-check.sh. What torch_entry.h's templates detect in c10's real types must be
// what that PyTorch version has: MEMF_EXPECT_* (0 or 1) come from the script, per version; one that
// is not defined is not checked (a version whose change we have not seen in headers).
#include <c10/cuda/CUDACachingAllocator.h>

#include "capture/torch_entry.h"

namespace cca = c10::cuda::CUDACachingAllocator;
namespace mc = memforensics::capture;

// The script always passes these four (a misspelt define would otherwise skip its check).
#if !defined(MEMF_EXPECT_MEMPOOL) || !defined(MEMF_EXPECT_COMPILE_CONTEXT) || \
    !defined(MEMF_EXPECT_USER_METADATA) || !defined(MEMF_EXPECT_ANNOTATE)
#error \
    "scripts/torch-headers-check.sh passes MEMF_EXPECT_{MEMPOOL,COMPILE_CONTEXT,USER_METADATA,ANNOTATE}"
#endif

using Entry = cca::TraceEntry;
using Allocator = cca::CUDAAllocator;

#ifdef MEMF_EXPECT_MEMPOOL
static_assert(mc::kEntryHasMempool<Entry> == (MEMF_EXPECT_MEMPOOL != 0),
              "TraceEntry::mempool_ detected differently from what this version has");
#endif
#ifdef MEMF_EXPECT_COMPILE_CONTEXT
static_assert(mc::kEntryHasCompileContext<Entry> == (MEMF_EXPECT_COMPILE_CONTEXT != 0),
              "TraceEntry::compile_context_ detected differently from what this version has");
#endif
#ifdef MEMF_EXPECT_USER_METADATA
static_assert(mc::kEntryHasUserMetadata<Entry> == (MEMF_EXPECT_USER_METADATA != 0),
              "TraceEntry::user_metadata_ detected differently from what this version has");
#endif
#ifdef MEMF_EXPECT_ANNOTATE
static_assert(mc::kEntryHasAnnotate<Entry> == (MEMF_EXPECT_ANNOTATE != 0),
              "TraceEntry::ANNOTATE detected differently from what this version has");
#endif
#ifdef MEMF_EXPECT_INCLUDE_TRACES
static_assert(
    mc::kSnapshotTakesIncludeTraces<Allocator> == (MEMF_EXPECT_INCLUDE_TRACES != 0),
    "snapshot(mempool_id, include_traces) detected differently from what this version has");
#endif

// The templates instantiate with the real types (torch_hook.cc uses them the same way).
mc::TorchEntry probeEntry(const Entry& e) {
  return mc::fromC10(e);
}
std::shared_ptr<const mc::RecordText> probeText(const Entry& e) {
  return mc::textOf(e);
}
cca::SnapshotInfo probeSnapshot(Allocator& a) {
  return mc::snapshotWithoutTraces(a);
}
