// categories.cc: the category rules (docs/findings.md "Categories"): what each allocation is
// (parameter, gradient, activation, optimizer state, temporary, unknown) from its stack and
// lifetime.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <span>

#include "analysis/findings/findings_ctx.h"

namespace memforensics::analysis {

namespace detail {

using format::StackId;

// DataParallel's replicate / broadcast of the module (StackFacts::replicate): a stack flag beside
// findings_ctx.h's StackFlag bits (only the category rules read it).
constexpr uint8_t kReplicate = 16;

uint8_t stackFlags(const format::Snapshot& s, StackId id) {
  if (id == format::kNoStack || id == format::kEmptyStack) return 0;
  return stackFlags(stackFacts(s, id));
}

uint8_t stackFlags(const StackFacts& f) {
  return static_cast<uint8_t>((f.optimizer ? kOptimizer : 0) | (f.backward ? kAutograd : 0) |
                              (f.module_init ? kModuleInit : 0) | (f.forward ? kForward : 0) |
                              (f.replicate ? kReplicate : 0));
}

// Category of a pre-trace block (alive when the history begins): only its stack is known.
Category preTraceCategoryOfFlags(uint8_t f) {
  if (f & kReplicate) return Category::Parameter;
  if (f & kOptimizer) return Category::OptimizerState;
  if (f & kAutograd) return Category::Gradient;
  if ((f & kForward) && !(f & kModuleInit)) return Category::Activation;
  return Category::Parameter;
}

Ooms oomsOf(const format::Snapshot& snap, int64_t device) {
  Ooms out;
  for (const format::OomRef& o : snap.ooms) {
    if (o.device == device) out.events.push_back(o.event);
  }
  out.other_times = otherDeviceOomTimes(snap, device);
  return out;
}

bool aliveAtAnOom(const Ctx& c, const AllocFact& a, const Ooms& ooms) {
  auto it = std::upper_bound(ooms.events.begin(), ooms.events.end(), a.event);
  if (it != ooms.events.end() && (a.freed < 0 || a.freed > *it)) return true;
  if (ooms.other_times.empty()) return false;
  const int64_t made = c.ev[static_cast<size_t>(a.event)].time_us;
  if (made < 0) return false;
  auto t = std::upper_bound(ooms.other_times.begin(), ooms.other_times.end(), made);
  if (t == ooms.other_times.end()) return false;
  if (a.freed < 0) return true;
  const int64_t freed = c.ev[static_cast<size_t>(a.freed)].time_us;
  return freed > *t;
}

namespace {

// The rules of docs/findings.md "Categories", first match wins.
Category categorizeWith(Ctx& c, const AllocFact& a, const Ooms& ooms) {
  const uint8_t f = c.flagsOf(a.stack);
  const bool have_iters = !c.iters.empty();
  const int64_t iter_end = a.iteration >= 0 ? c.iters[a.iteration].last_event : -1;
  // Long-lived: alive at the end, or (with iterations) outliving the iteration it was made in.
  const bool long_lived = a.freed < 0 || (a.iteration >= 0 && a.freed > iter_end);
  // DataParallel's replicas of the module: copies of parameters and buffers (their stacks run
  // through autograd's Function.apply, which is not a backward pass).
  if (f & kReplicate) return Category::Parameter;
  if (f & kOptimizer) return long_lived ? Category::OptimizerState : Category::Temporary;
  if (f & kAutograd) return long_lived ? Category::Gradient : Category::Temporary;
  if (have_iters && a.event < c.iters.front().first_event) {
    return a.freed < 0 || a.freed > c.iters.front().first_event ? Category::Parameter
                                                                : Category::Temporary;
  }
  if (!have_iters && (f & kModuleInit)) return Category::Parameter;
  // Forward code's intermediates alive when an OOM struck are activations, however soon the
  // exception's unwind freed them; anything else alive there is not explained by its lifetime.
  if (aliveAtAnOom(c, a, ooms)) return (f & kForward) ? Category::Activation : Category::Unknown;
  const int64_t life = (a.freed < 0 ? static_cast<int64_t>(c.ev.size()) : a.freed) - a.event;
  if (!have_iters) {
    // One window, the whole trace (a single forward pass, inference, an unrecognised loop): dying
    // within a tenth of it is a temporary; forward code's longer-lived allocations (kept for a
    // backward or as outputs) are activations; the rest is not something the stack explains.
    const int64_t window = std::max<int64_t>(1, static_cast<int64_t>(c.ev.size()));
    if (a.freed >= 0 && life * 10 < window) return Category::Temporary;
    return (f & kForward) ? Category::Activation : Category::Unknown;
  }
  if (a.iteration < 0) return Category::Unknown;
  // Made inside an iteration: a temporary if it dies soon after it was made; made by a model's
  // forward and living for a good part of the step (kept for backward), an activation; anything
  // else long-lived is not something the stack explains.
  const Phase& it = c.iters[a.iteration];
  const int64_t len = std::max<int64_t>(1, it.last_event - it.first_event + 1);
  if (life * 10 < len) return Category::Temporary;
  return (f & kForward) ? Category::Activation : Category::Unknown;
}

}  // namespace

Category categoryOfLive(Ctx& c, const replay::LiveBlock& b) {
  if (b.alloc_event < 0 || static_cast<size_t>(b.alloc_event) >= c.alloc_at.size())
    return preTraceCategoryOfFlags(c.flagsOf(b.stack));
  int32_t k = c.alloc_at[static_cast<size_t>(b.alloc_event)];
  return k < 0 ? Category::Unknown : c.allocs[static_cast<size_t>(k)].category;
}

std::string pct(uint64_t part, uint64_t whole) {
  if (whole == 0) return "0%";
  char b[16];
  std::snprintf(b, sizeof b, "%.0f%%",
                100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return b;
}

}  // namespace detail

using detail::Ctx;
using detail::preTraceCategoryOfFlags;
using detail::stackFlags;

void categorizeAllocations(const format::Snapshot& snap, DeviceFacts& facts) {
  StackFactsCache cache(snap);
  categorizeAllocations(facts, cache);
}

void categorizeAllocations(DeviceFacts& facts, StackFactsCache& cache) {
  const format::Snapshot& snap = cache.snapshot();
  std::vector<Category> cats;
  {
    Ctx c(snap, facts, &cache);
    const detail::Ooms ooms = detail::oomsOf(snap, facts.device);
    cats.reserve(facts.allocs.size());
    for (const AllocFact& a : facts.allocs) cats.push_back(detail::categorizeWith(c, a, ooms));
  }
  for (size_t k = 0; k < cats.size(); ++k) facts.allocs[k].category = cats[k];
}

Category preTraceCategory(const format::Snapshot& snap, format::StackId stack) {
  return preTraceCategoryOfFlags(stackFlags(snap, stack));
}

struct AllocationCategories::Impl {
  DeviceFacts facts;
  std::vector<uint8_t> flags;  // per stack id, 0xff = not computed
};

AllocationCategories::AllocationCategories(const format::Snapshot& snap, int64_t device)
    : snap_(snap), impl_(std::make_unique<Impl>(Impl{eventFacts(snap, device), {}})) {}

AllocationCategories::~AllocationCategories() = default;

Category AllocationCategories::of(int64_t alloc_event, format::StackId stack) {
  const DeviceFacts& f = impl_->facts;
  if (alloc_event < 0 || static_cast<size_t>(alloc_event) >= f.alloc_at.size()) {
    std::vector<uint8_t>& flags = impl_->flags;
    if (stack >= flags.size())
      flags.resize(std::max<size_t>(snap_.stacks.stackCount(), stack + 1), 0xff);
    if (flags[stack] == 0xff) flags[stack] = stackFlags(snap_, stack);
    return preTraceCategoryOfFlags(flags[stack]);
  }
  int32_t k = f.alloc_at[static_cast<size_t>(alloc_event)];
  return k < 0 ? Category::Unknown : f.allocs[static_cast<size_t>(k)].category;
}

}  // namespace memforensics::analysis
