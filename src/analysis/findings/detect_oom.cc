// detect_oom.cc: the OOM verdict (docs/findings.md "OOM verdict").
//
// One finding per `oom` event whose title states the conclusion in one sentence, each number once:
// the request, how much was missing (OomNumbers::short_by_bytes, from the block layout and the
// allocator's rules: replay::requestNeed), what the device and the cache had, and whether it was
// fragmentation (the bytes were in the request's pool and stream, in no block large enough) or
// live tensors filling the card. The evidence leads with the largest holders (the lines to
// change), then the failed request as the last straw, then the cache flush of the allocator's
// retry, then the category totals and the layout's figures.
#include <algorithm>
#include <optional>
#include <string>

#include "analysis/findings/findings_ctx.h"
#include "analysis/frames/stack_groups.h"
#include "analysis/session/blocks.h"
#include "analysis/whatif/whatif.h"
#include "common/format_bytes.h"
#include "common/saturating.h"

namespace memforensics::analysis::detail {

using format::Action;
using format::Event;
using format::StackId;

namespace {

std::string B(uint64_t bytes) {
  return formatBytesShort(bytes);
}

std::string plural(uint64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// "released 3 cached segments and unmapped 189 pages"
std::string flushText(const OomFlush& fl) {
  std::string s;
  if (fl.segments_freed > 0)
    s += "released " + plural(fl.segments_freed, "cached segment", "cached segments");
  if (fl.ranges_unmapped > 0) {
    if (!s.empty()) s += " and ";
    s += "unmapped " + (fl.pages_unmapped > 0 ? plural(fl.pages_unmapped, "page", "pages")
                                              : plural(fl.ranges_unmapped, "range", "ranges"));
  }
  return s;
}

// The fragmentation fix, tested before it is given: replays of the device's request stream
// (whatif.h simulateRequests, on the card the file implies) under the file's settings and under
// each setting the fix would name, at most FindingsOptions::fix_replays simulations per device.
struct FixTrial {
  std::string label;  // "expandable_segments:True", "max_split_size_mb:64" (the conf's spelling)
  SimResult sim;
  std::string estimate_reason;  // whatIfEstimateReason: "" = exact
};
struct FixReplays {
  std::string untested;  // why the fix could not be tested ("" when the replays ran)
  SimResult baseline;
  std::vector<FixTrial> trials;  // in the order tried
};

// The device's recorded facts (whatif.h recordedFacts: a pass over its events and its start
// blocks), made at most once per device for the fix replays and the smallest card.
class RecordedOnce {
 public:
  explicit RecordedOnce(const Ctx& c) : c_(c) {}
  const DeviceWhatIf& get() {
    if (!facts_) facts_ = recordedFacts(c_.trace(), c_.summary);
    return *facts_;
  }

 private:
  const Ctx& c_;
  std::optional<DeviceWhatIf> facts_;
};

FixReplays replayFixes(const Ctx& c, size_t budget, RecordedOnce& recorded) {
  const format::Snapshot& snap = c.s;
  const int64_t device = c.device;
  FixReplays r;
  if (budget < 2) {  // the baseline alone tests nothing
    r.untested = "the verdict's replays are off";
    return r;
  }
  if (device < 0 || static_cast<size_t>(device) >= snap.traceCount()) {
    r.untested = "no request stream for this device";
    return r;
  }
  const TraceInput trace = c.trace();
  DeviceWhatIf facts = recorded.get();
  const replay::AllocConf base = replay::allocConfOf(snap);
  if (!facts.complete_history) {
    r.untested = whatIfEstimateReason(facts, base);  // "history incomplete: N blocks were alive..."
    return r;
  }
  const uint64_t cap = impliedCapacity(trace);
  r.baseline = simulateRequests(trace, base, cap);
  facts.baseline = r.baseline;
  std::vector<std::pair<std::string, std::string>> sets;
  if (!base.expandable_segments) sets.push_back({"expandable_segments", "True"});
  for (uint64_t v : whatIfSplitSizesMb(trace, base))
    sets.push_back({"max_split_size_mb", std::to_string(v)});
  for (const auto& [key, value] : sets) {
    if (r.trials.size() + 1 >= budget) break;  // the baseline counts
    replay::AllocConf s = base;
    if (!replay::applyAllocSetting(s, key, value).empty()) continue;
    FixTrial t;
    t.label = key + ":" + value;
    t.sim = simulateRequests(trace, s, cap);
    t.estimate_reason = whatIfEstimateReason(facts, s);
    r.trials.push_back(std::move(t));
  }
  return r;
}

// The smallest changes that let the request of an OOM whose live tensors fill the card through
// (into `num`): `short_by` less from the largest holder (when it holds that much), and the smallest
// capacity a replay of the device's requests runs in without an OOM (whatif.h smallestCard; only
// on a complete history, as the fragmentation fix's replays; searched once per device, in `card`).
// The search's figure goes into `evidence` too.
void smallestChanges(Ctx& c, const FindingsOptions& opt, OomNumbers& num,
                     const std::vector<LiveGroup>& groups, std::optional<SmallestCard>& card,
                     std::vector<Evidence>& evidence, RecordedOnce& recorded) {
  const uint64_t short_by = num.short_by_bytes;
  if (!groups.empty() && short_by > 0 && groups.front().requested_bytes >= short_by) {
    const LiveGroup& g = groups.front();
    const std::string line = g.frames.empty() ? "one stack" : g.frames.front().display();
    num.smallest_changes.push_back(line + " holds " + B(g.requested_bytes) +
                                   " at the OOM and the device was " + B(short_by) + " short, " +
                                   pct(short_by, g.requested_bytes) +
                                   " of that: a smaller batch or chunked computation there");
  }
  const auto d = static_cast<size_t>(c.device);
  if (!card) {
    card = SmallestCard{};  // kWhatIfUnlimited: not searched or not found
    SimChange budget;
    budget.max_segment_visits = kReplayCheckVisits;
    if (opt.fix_replays >= 2 && d < c.s.traceCount() && recorded.get().complete_history)
      card = smallestCard(c.trace(), replay::allocConfOf(c.s), budget);
  }
  if (card->capacity != kWhatIfUnlimited) {
    num.smallest_capacity_bytes = card->capacity;
    num.smallest_changes.push_back(
        "an allocator capacity of " + B(card->capacity) + " (checked by replay" +
        (card->slack > 0 ? ", within " + B(card->slack) : std::string()) + "; this card gave it " +
        (num.capacity_bytes > 0 ? B(num.capacity_bytes) : std::string("an unknown amount")) +
        ", and a card also holds the CUDA context)");
    evidence.push_back(
        {"the smallest capacity a replay of this device's requests runs in "
         "without an OOM (whatif --capacity)",
         -1,
         -1,
         card->capacity,
         {}});
  }
}

// The recorded OOM `event` in a replay's list, or nullptr (past kWhatIfMaxOoms).
const SimOom* recordedOomOf(const SimResult& r, int64_t event) {
  for (const SimOom& o : r.ooms)
    if (o.recorded && o.event == event) return &o;
  return nullptr;
}

// The replay's label, as whatif gives it (whatIfEstimateReason): in full for the evidence, one word
// in the fix (the evidence line of the same replay says why).
std::string exactText(const std::string& estimate_reason) {
  return estimate_reason.empty() ? std::string("exact") : "an estimate: " + estimate_reason;
}
std::string exactWord(const std::string& estimate_reason) {
  return estimate_reason.empty() ? "exact" : "estimate";
}

// "a, b nor c" for the none-avoids sentence.
std::string joinLabels(const std::vector<std::string>& ls) {
  if (ls.size() == 1) return ls[0] + " does not avoid it";
  std::string s = ls.size() == 2 ? "neither " : "none of ";
  for (size_t i = 0; i < ls.size(); ++i) {
    if (i > 0) s += i + 1 == ls.size() ? (ls.size() == 2 ? " nor " : " and ") : ", ";
    s += ls[i];
  }
  return s + " avoids it";
}

}  // namespace

void detectOom(Ctx& c, std::vector<Finding>& out, const FindingsOptions& opt) {
  const ModelFacts& model = c.facts.model;
  const bool settings_expandable = replay::allocConfOf(c.s).expandable_segments;
  const size_t n_ooms = c.summary.ooms.size();
  std::optional<FixReplays> replays;  // run at the first fragmentation OOM, once per device
  std::optional<SmallestCard> card;   // searched at the first OOM that needs it, once per device
  RecordedOnce recorded(c);
  size_t verdicts = 0;  // made so far: the first opt.layout_ooms of them read the layout
  for (size_t k = 0; k < n_ooms; ++k) {
    if (!oomHasVerdict(k, n_ooms)) continue;
    const bool with_layout = verdicts++ < opt.layout_ooms;
    const replay::OomEvent& oom = c.summary.ooms[k];
    const MomentFacts* m = c.facts.at(oom.event);
    const replay::Counters& at = m != nullptr ? m->at : oom.at;
    const bool have_live = m != nullptr && m->has_live;

    // The figures (findings.h OomNumbers).
    OomNumbers num;
    num.request_bytes = oom.request_bytes;
    num.live_bytes = at.allocated;
    num.reserved_bytes = at.reserved;
    num.device_free_bytes = oom.device_free;
    num.cache_free_bytes = subSat(at.reserved, at.allocated);
    // A start state the trace cannot explain spoils the reserved counter: capacity unknown then.
    num.capacity_bytes = (c.summary.untrusted & replay::kUntrustedStart) != 0
                             ? 0
                             : addSat(at.reserved, oom.device_free);
    const OomFlush flush = oomFlushBefore(c.ev, oom.event);
    num.flushed_bytes = flush.bytes;

    // The block layout (allocator model) says whether the request's pool and stream had the bytes
    // but not in one block, and what the device would have had to give. Exact only when the model
    // reproduced the whole device (ModelFacts::layout_exact); else an estimate with the reason.
    // Without a layout (past opt.layout_ooms) the cached free bytes of the whole device are the
    // guide, and an expandable request is taken to map all of its pages.
    std::optional<OomVerdict> layout;
    if (with_layout && m != nullptr && m->has_layout) layout = oomVerdictAt(c.s, c.facts, *m);
    num.exact = layout.has_value() && model.layout_exact;
    std::string reason;
    if (!num.exact) {
      if (!layout) {
        reason = !with_layout ? "no block layout read for this OOM (only the first " +
                                    std::to_string(opt.layout_ooms) + " verdicts of a device)"
                              : "no block layout kept at this OOM";
      } else {
        reason = model.ran && !model.estimate_reason.empty() ? model.estimate_reason
                                                             : "the allocator model did not run";
      }
    }
    replay::OomNeed need;
    const uint64_t cached_free = subSat(at.reserved, at.active());  // no pending-free blocks
    if (layout) {
      num.fragmentation = layout->fragmentation;
      num.short_by_bytes = layout->short_by;
      need = layout->need;
    } else {
      num.fragmentation = oom.request_bytes <= cached_free;
      const bool large = oom.request_bytes > replay::kModelSmallSize;
      need = replay::requestNeed(oom.request_bytes, large, settings_expandable, {});
      num.short_by_bytes = replay::shortBy(need, oom.device_free, num.fragmentation);
    }

    Finding f;
    f.kind = FindingKind::OomVerdict;
    f.severity = FindingSeverity::High;
    f.device = c.device;
    f.bytes = oom.request_bytes;
    f.basis = (c.basis.empty() ? std::string("replayed allocator state at the OOM") : c.basis) +
              "; " + (num.exact ? std::string("exact block layout") : "estimate: " + reason);

    std::vector<Evidence> replay_evidence;  // the fix's replays, after the layout's figures
    // The largest holders at the OOM, by stack (the evidence, and the "not fragmentation" fix).
    const std::vector<LiveGroup> groups =
        have_live ? groupLiveByStack(c.s, m->live, PendingBlocks::Exclude, {3, opt.evidence_stacks})
                  : std::vector<LiveGroup>{};

    // The title: one sentence, each number once.
    std::string title = "cuda:" + std::to_string(c.device);
    if (n_ooms > 1) title += ", OOM " + std::to_string(k + 1) + " of " + std::to_string(n_ooms);
    title += ": a " + B(oom.request_bytes) + " request failed";
    const bool alone =
        num.capacity_bytes > 0 && need.needed_bytes > num.capacity_bytes && !num.fragmentation;
    if (num.fragmentation) {
      if (layout) {
        title += " though the " + layout->pool + " pool of its stream had " + B(layout->pool_free) +
                 " free" + (num.exact ? "" : " (by the allocator model's estimate)") +
                 ": fragmentation, its largest free block was " + B(layout->pool_largest) +
                 " (the device had " + B(oom.device_free) + " free)";
      } else {
        title += " though the cache held " + B(cached_free) +
                 " free (an estimate, from the counters): fragmentation, no cached block was "
                 "large enough (the device had " +
                 B(oom.device_free) + " free)";
      }
      // No advice the file's settings contradict, and none a replay of the requests refutes.
      const std::string untested_fix =
          settings_expandable
              ? "expandable segments are already on (allocator_settings): the free space lies "
                "between live tensors; allocate the largest long-lived tensors first, free the "
                "short-lived ones between them sooner, or set max_split_size_mb"
              : "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb) so "
                "that freed space can be reused for large requests; allocate the largest "
                "long-lived tensors first";
      if (!replays) replays = replayFixes(c, opt.fix_replays, recorded);
      const SimOom* base_oom =
          replays->untested.empty() ? recordedOomOf(replays->baseline, oom.event) : nullptr;
      std::string untested = replays->untested;
      if (untested.empty() && base_oom == nullptr)
        untested = "past the first " + std::to_string(kWhatIfMaxOoms) + " OOMs a replay lists";
      else if (untested.empty() && base_oom->avoided)
        untested = "a replay under the file's own settings does not reproduce this OOM";
      if (!untested.empty()) {
        f.fix = untested_fix + " (untested: " + untested + ")";
      } else if (replays->trials.empty()) {
        f.fix =
            "expandable segments are already on (allocator_settings) and no max_split_size_mb "
            "applies (no request of 32 MiB or more): the free space lies between live tensors; "
            "reduce what is live at this point, or allocate the largest long-lived tensors "
            "first and free the short-lived ones between them sooner";
      } else {
        std::vector<const FixTrial*> avoid;
        std::vector<std::string> tried;
        for (const FixTrial& t : replays->trials) {
          const SimOom* o = recordedOomOf(t.sim, oom.event);
          const bool served = o != nullptr && o->avoided;
          if (served) avoid.push_back(&t);
          tried.push_back(t.label + " (" + exactWord(t.estimate_reason) + ")");
          const uint64_t new_ooms = t.sim.oom_count - t.sim.recorded_failed;
          replay_evidence.push_back(
              {"a replay of the requests with " + t.label + ": " +
                   (served ? "serves this request" : "fails this request too") +
                   (new_ooms > 0 ? ", " + plural(new_ooms, "new OOM", "new OOMs") : "") +
                   "; its peak reserved (" + exactText(t.estimate_reason) + ")",
               -1,
               -1,
               t.sim.peak_reserved,
               {}});
        }
        if (!avoid.empty()) {
          std::string s;
          for (const FixTrial* t : avoid) {
            const uint64_t new_ooms = t->sim.oom_count - t->sim.recorded_failed;
            const std::string figs =
                "peak reserved " + B(t->sim.peak_reserved) +
                (new_ooms > 0
                     ? ", though " + plural(new_ooms, "other request fails", "other requests fail")
                     : std::string()) +
                "; " + exactWord(t->estimate_reason);
            s += s.empty() ? "a replay of this run's requests with " + t->label +
                                 " avoids this OOM (" + figs + ")"
                           : "; so does " + t->label + " (" + figs + ")";
          }
          f.fix = s + ": set PYTORCH_CUDA_ALLOC_CONF=" + avoid.front()->label +
                  "; allocate the largest long-lived tensors first";
        } else {
          f.fix = joinLabels(tried) +
                  " in a replay of the requests: reduce what is live at this point (batch size, "
                  "activation checkpointing, "
                  "freeing tensors that are no longer needed) or the size of this request; "
                  "allocate the largest long-lived tensors first";
        }
      }
    } else if (num.short_by_bytes > 0) {
      title += std::string(", ") + (num.exact ? "" : "an estimated ") + B(num.short_by_bytes) +
               " short (the device had " + B(oom.device_free) + " free and the cache " +
               (num.cache_free_bytes > 0 ? B(num.cache_free_bytes) + " in pieces, none large enough"
                                         : std::string("nothing free")) +
               "); not fragmentation: ";
      title += alone ? "the request alone needs more than the card's " + B(num.capacity_bytes) +
                           " (reserved + free)"
                     : "live tensors (" + B(num.live_bytes) + ") fill the card";
      if (alone) {
        f.fix =
            "this one request is larger than the card: split it (a smaller batch, chunked "
            "computation) or move it to a larger device";
      } else {
        num.fills_card = true;
        smallestChanges(c, opt, num, groups, card, replay_evidence, recorded);
        f.fix = oomChangesFix(num.smallest_changes);
      }
    } else {
      title += std::string(" though the device reported ") + B(oom.device_free) +
               " free, enough for the " + B(need.needed_bytes) + " it needed" +
               (num.exact ? "" : " (estimate)") +
               "; not fragmentation: the limit was elsewhere (a memory fraction, another process "
               "or the driver)";
      f.fix =
          "check torch.cuda.set_per_process_memory_fraction, other processes on the device "
          "(nvidia-smi) and the driver's own use; then reduce what is live at this point";
    }
    f.title = std::move(title);

    // The evidence: the largest holders first (the lines to change), the last straw, the flush.
    const std::vector<FrameText> request_frames = c.frames(oom.stack);
    f.where = request_frames;
    if (have_live) {
      for (const LiveGroup& g : groups) {
        f.evidence.push_back(
            {"live at the OOM from this stack" +
                 (g.count > 1 ? " (" + plural(g.count, "block", "blocks") + ")" : std::string()),
             -1, -1, g.requested_bytes, g.frames});
      }
      // The line named is the failing request's (the line in the user's traceback, the last
      // straw); the largest holders are the evidence above it. A request without frames names
      // the largest holder instead.
      if (request_frames.empty() && !groups.empty()) f.where = groups.front().frames;
    }
    f.evidence.push_back({"the last straw: the request that failed", oom.event, oom.time_us,
                          oom.request_bytes, request_frames});
    if (flush.first_event >= 0) {
      const Event& e = c.ev[static_cast<size_t>(flush.first_event)];
      f.evidence.push_back({(flush.immediate ? "before failing, the allocator "
                                             : "just before, for the previous request, the "
                                               "allocator ") +
                                flushText(flush) + " and retried" +
                                (flush.immediate ? "" : ": the cache was already flushed"),
                            flush.first_event,
                            e.time_us,
                            flush.bytes,
                            {}});
    }
    if (have_live) {
      CategoryBytes cat;
      m->live.forEach([&](uint64_t, const replay::LiveBlock& b) {
        if (!b.pending) cat.bytes[static_cast<size_t>(categoryOfLive(c, b))] += b.requested;
      });
      for (size_t j = 0; j < kCategoryCount; ++j) {
        if (cat.bytes[j] == 0) continue;
        f.evidence.push_back(
            {"live " + std::string(categoryName(static_cast<Category>(j))) + " (inferred)",
             -1,
             -1,
             cat.bytes[j],
             {}});
      }
    }
    const std::string label = num.exact ? " (exact block layout)" : " (estimate: " + reason + ")";
    if (layout) {
      f.evidence.push_back(
          {"free in the request's pool and stream" + label, -1, -1, layout->pool_free, {}});
      f.evidence.push_back(
          {num.exact ? "largest free block there" : "largest free block there (estimate)",
           -1,
           -1,
           layout->pool_largest,
           {}});
    }
    if (need.expandable) {
      f.evidence.push_back({"pages the expandable segment would have had to map: " +
                                std::to_string(need.pages) + " x " + B(need.page_bytes) +
                                " beyond " + B(need.usable_free) + " free at its end" + label,
                            -1,
                            -1,
                            need.needed_bytes,
                            {}});
    } else {
      f.evidence.push_back({"the segment the allocator would have asked cudaMalloc for" + label,
                            -1,
                            -1,
                            need.segment_bytes,
                            {}});
    }
    if (num.cache_free_bytes > 0) {
      f.evidence.push_back(
          {"cached but free in reserved segments", -1, -1, num.cache_free_bytes, {}});
    }
    if (at.pending > 0)
      f.evidence.push_back({"freed but pending on another stream", -1, -1, at.pending, {}});
    for (Evidence& e : replay_evidence) f.evidence.push_back(std::move(e));
    f.oom = num;
    if (!have_live) {
      f.evidence.push_back({"live set at this OOM not kept (a session copies at most " +
                                std::to_string(kMaxLiveMoments) + " live sets and " +
                                std::to_string(kMaxCopiedBlocks) +
                                " blocks per device): stacks not listed",
                            oom.event,
                            oom.time_us,
                            0,
                            {}});
      out.push_back(std::move(f));
      continue;
    }
    // The call graph at the OOM: the call path that holds the most, innermost frame first.
    CallGraphSummary g = buildCallGraph(c.s, m->live, 1);
    if (!g.hot_path.empty()) {
      std::vector<FrameText> path;
      for (auto it = g.hot_path.rbegin(); it != g.hot_path.rend() && path.size() < 8; ++it)
        path.push_back(it->frame);
      f.evidence.push_back(
          {"heaviest call path at the OOM", -1, -1, g.hot_path.back().inclusive_bytes, path});
    }
    out.push_back(std::move(f));
  }
}

}  // namespace memforensics::analysis::detail

namespace memforensics::analysis {

std::string oomChangesFix(const std::vector<std::string>& changes) {
  if (changes.empty()) {
    return "reduce what is live at this point (batch size, activation checkpointing, freeing "
           "tensors that are no longer needed) or the size of this request";
  }
  std::string fix = "the smallest changes: ";
  for (size_t i = 0; i < changes.size(); ++i) fix += (i == 0 ? "" : "; or ") + changes[i];
  return fix +
         ". Otherwise reduce what is live at this point (batch size, activation checkpointing, "
         "freeing tensors that are no longer needed)";
}

}  // namespace memforensics::analysis
