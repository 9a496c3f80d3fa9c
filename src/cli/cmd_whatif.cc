// cmd_whatif.cc: `memforensics whatif FILE [--device N] [--set KEY=VALUE]... [--capacity SIZE]
// [--json]`.
#include "cli/cmd_whatif.h"

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "analysis/whatif/whatif.h"
#include "cli/diagnostics.h"
#include "cli/load_cli.h"
#include "cli/options.h"
#include "common/format_bytes.h"
#include "common/parse_size.h"
#include "common/text_escape.h"

namespace memforensics::cli {

namespace {

struct WhatIfArgs {
  std::string file;
  std::optional<int64_t> device;
  std::vector<std::string> sets;
  std::optional<std::string> capacity;  // an empty --capacity is refused, not ignored
  bool json = false;
};
WhatIfArgs g_args;

constexpr const char* kCannotChange =
    "a what-if replays the program's own requests (sizes, order, lifetimes); it cannot change "
    "what the program asked for (no smaller batch), and after an OOM it replays what the program "
    "did next as recorded";

std::string cap(uint64_t c) {
  return c == analysis::kWhatIfUnlimited ? std::string("unlimited") : formatBytes(c);
}

nlohmann::json simJson(const analysis::SimResult& r, const std::string& estimate) {
  nlohmann::json j;
  j["exact"] = estimate.empty();
  j["estimate_reason"] = estimate;
  j["capacity_bytes"] = r.capacity == analysis::kWhatIfUnlimited ? nlohmann::json(nullptr)
                                                                 : nlohmann::json(r.capacity);
  j["peak_reserved_bytes"] = r.peak_reserved;
  j["peak_allocated_bytes"] = r.peak_allocated;
  j["allocated_at_peak_reserved_bytes"] = r.allocated_at_peak_reserved;
  j["oom_count"] = r.oom_count;
  j["recorded_oom_avoided"] = r.recorded_avoided;
  j["recorded_oom_not_avoided"] = r.recorded_failed;
  j["empty_cache_calls"] = r.empty_cache_calls;
  j["segment_allocs"] = r.segment_allocs;
  j["segment_frees"] = r.segment_frees;
  nlohmann::json ooms = nlohmann::json::array();
  for (const auto& o : r.ooms) {
    nlohmann::json x;
    x["event"] = o.event;
    x["recorded"] = o.recorded;
    if (o.recorded) x["avoided"] = o.avoided;
    x["requested_bytes"] = o.requested;
    x["rounded_bytes"] = o.rounded;
    x["stream"] = o.stream;
    x["reserved_bytes"] = o.reserved;
    x["allocated_bytes"] = o.allocated;
    x["line"] = o.line;
    x["why"] = o.why;
    ooms.push_back(std::move(x));
  }
  j["ooms"] = std::move(ooms);
  return j;
}

void printSim(const char* name, const analysis::SimResult& r, const std::string& estimate,
              std::ostream& os) {
  const double frag =
      r.peak_reserved == 0
          ? 0.0
          : 100.0 * static_cast<double>(r.peak_reserved - r.allocated_at_peak_reserved) /
                static_cast<double>(r.peak_reserved);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %%", frag);
  os << "  " << name << " (capacity " << cap(r.capacity) << "): peak reserved "
     << formatBytes(r.peak_reserved) << ", peak allocated " << formatBytes(r.peak_allocated)
     << ", cached but free at the peak " << buf << ", OOMs " << r.oom_count << "\n";
  os << "    " << (estimate.empty() ? "exact" : "estimate: " + estimate) << "\n";
  for (const auto& o : r.ooms) {
    os << "    "
       << (o.recorded ? (o.avoided ? "recorded OOM avoided" : "recorded OOM not avoided")
                      : "new OOM")
       << " at event " << o.event << ": " << formatBytes(o.requested) << " on stream " << o.stream;
    if (!o.line.empty()) os << " at " << escapeText(o.line);
    os << " - " << o.why << "\n";
  }
  if (r.oom_count > r.ooms.size()) {
    os << "    ... and " << r.oom_count - r.ooms.size() << " more (the first "
       << analysis::kWhatIfMaxOoms << " OOMs of a run are listed)\n";
  }
}

}  // namespace

CLI::App* addWhatIfCommand(CLI::App& app) {
  auto* c = app.add_subcommand(
      "whatif",
      "Replay the recorded requests through the caching allocator under other settings or "
      "another card size: peaks and OOMs, baseline against what-if");
  c->add_option("FILE", g_args.file, "a snapshot with a trace")->required();
  c->add_option("--device", g_args.device, "only this CUDA device ordinal")->check(kInt64Option);
  c->add_option("--set", g_args.sets,
                "KEY=VALUE in PYTORCH_CUDA_ALLOC_CONF spelling: expandable_segments, "
                "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, "
                "garbage_collection_threshold (repeatable)");
  c->add_option("--capacity", g_args.capacity,
                "card size for the what-if (20GiB, 40GB, bytes); default: reserved + device free "
                "at the file's OOM, else unlimited");
  c->add_flag("--json", g_args.json, "one JSON document (fields in docs/cli.md)");
  return c;
}

constexpr uint64_t kMaxCapacity = uint64_t{1} << 50;

int runWhatIfCommand() {
  analysis::WhatIfOptions opt;
  opt.device = g_args.device;
  for (const std::string& s : g_args.sets) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) {
      printError("--set takes KEY=VALUE, not '" + s + "'");
      return kExitUsage;
    }
    opt.sets.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }
  if (g_args.capacity) {
    SizeParse p = parseSize(*g_args.capacity);
    if (!p.ok) {
      printError("--capacity: " + p.error);
      return kExitUsage;
    }
    // No card holds nothing, and none holds a pebibyte (2^64 - 1 is the replay's "unlimited").
    if (p.bytes == 0 || p.bytes > kMaxCapacity) {
      printError("--capacity: " + *g_args.capacity + " is not the size of a card (1 B to 1 PiB)");
      return kExitUsage;
    }
    opt.capacity = p.bytes;
  }
  // Settings are checked before the file is read: a refused key costs nothing.
  {
    replay::AllocConf probe;
    for (const auto& [k, v] : opt.sets) {
      std::string why = replay::applyAllocSetting(probe, k, v);
      if (!why.empty()) {
        printError("--set " + k + "=" + v + ": " + why);
        return kExitUsage;  // bad usage, as a malformed --set or --capacity
      }
    }
  }
  auto snap = loadWithProgress(g_args.file, false);
  if (!snap) {
    printError(snap.error().describe());
    return kExitError;
  }
  if (!snap->has_segment_info) {
    printError(g_args.file +
               ": what-if needs an allocator trace; not available for profiler traces");
    return kExitError;
  }
  setActivity("simulating " + g_args.file);
  std::string error;
  analysis::WhatIfResult r = analysis::runWhatIf(*snap, opt, &error);
  if (!error.empty()) {
    printError(error);
    return kExitUsage;
  }
  if (r.devices.empty() && opt.device) {
    bool has = false;
    for (int64_t d : snap->devices()) has |= d == *opt.device;
    if (!has) {  // the argument does not match the file: bad usage, as blocks and report
      printError(g_args.file + " has no device " + std::to_string(*opt.device));
      return kExitUsage;
    }
  }
  if (r.devices.empty()) {
    printError(g_args.file + ": no device with a trace" +
               (opt.device ? " (device " + std::to_string(*opt.device) + ")" : std::string()) +
               ": a what-if replays the recorded requests");
    return kExitError;
  }
  if (g_args.json) {
    nlohmann::json j;
    j["file"] = g_args.file;
    j["baseline_settings"] = replay::describeAllocConf(r.base_settings);
    j["whatif_settings"] = replay::describeAllocConf(r.what_settings);
    j["limits"] = kCannotChange;
    nlohmann::json devs = nlohmann::json::array();
    for (const auto& d : r.devices) {
      nlohmann::json x;
      x["device"] = d.device;
      x["recorded_peak_reserved_bytes"] = d.recorded_peak_reserved;
      x["recorded_oom_count"] = d.recorded_ooms;
      x["complete_history"] = d.complete_history;
      x["frees_before_trace"] = d.unknown_frees;
      x["start_blocks"] = d.start_blocks;
      x["recorded_segment_allocs"] = d.recorded_segment_allocs;
      x["recorded_segment_frees"] = d.recorded_segment_frees;
      x["baseline"] = simJson(d.baseline, analysis::whatIfEstimateReason(d, r.base_settings));
      // The baseline's allocs at the address the file recorded (the allocator core's proof).
      x["baseline"]["address_agreement"] = {{"predicted", d.baseline.address_predicted},
                                            {"total", d.baseline.address_total}};
      x["whatif"] = simJson(d.whatif, analysis::whatIfEstimateReason(d, r.what_settings));
      x["whatif_is_baseline"] = d.whatif_is_baseline;
      x["smallest_capacity_bytes"] = d.smallest_capacity == analysis::kWhatIfUnlimited
                                         ? nlohmann::json(nullptr)
                                         : nlohmann::json(d.smallest_capacity);
      x["smallest_capacity_slack_bytes"] = d.smallest_capacity_slack;
      devs.push_back(std::move(x));
    }
    j["devices"] = std::move(devs);
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return kExitOk;
  }
  std::ostream& os = std::cout;
  os << "whatif " << escapeText(g_args.file) << "\n";
  const bool same = g_args.sets.empty() && !g_args.capacity;
  if (same) {
    os << "settings: " << replay::describeAllocConf(r.base_settings)
       << " (the file's own; no --set or --capacity: one replay)\n";
  } else {
    os << "baseline settings: " << replay::describeAllocConf(r.base_settings) << "\n";
    os << "what-if settings:  " << replay::describeAllocConf(r.what_settings) << "\n";
  }
  // The devices that ran out of memory first (in the replay or the file), then the others.
  std::vector<const analysis::DeviceWhatIf*> order;
  for (const auto& d : r.devices) order.push_back(&d);
  auto ooms = [](const analysis::DeviceWhatIf* d) {
    return d->recorded_ooms > 0 || d->baseline.oom_count > 0 || d->whatif.oom_count > 0;
  };
  std::stable_partition(order.begin(), order.end(), ooms);
  for (const analysis::DeviceWhatIf* dp : order) {
    const analysis::DeviceWhatIf& d = *dp;
    os << "device " << d.device << ": recorded peak reserved "
       << formatBytes(d.recorded_peak_reserved) << ", recorded OOMs " << d.recorded_ooms << "\n";
    if (!d.complete_history)
      os << "  history incomplete: " << d.start_blocks
         << " blocks were alive when the trace began; the simulation allocates them first, in "
            "address order (their order and the cache around them are not in the file): an "
            "estimate\n";
    printSim(d.whatif_is_baseline ? "replay" : "baseline", d.baseline,
             analysis::whatIfEstimateReason(d, r.base_settings), os);
    os << "    " << d.baseline.address_predicted << " of " << d.baseline.address_total
       << " allocs at the address the file recorded\n";
    if (!d.whatif_is_baseline)
      printSim("what-if ", d.whatif, analysis::whatIfEstimateReason(d, r.what_settings), os);
    if (d.whatif.oom_count > 0) {
      os << "  smallest capacity without an OOM (memory the allocator may reserve"
         << (same ? "" : ", under the what-if settings") << "): ";
      if (d.smallest_capacity == analysis::kWhatIfUnlimited) {
        os << (d.smallest_capacity_budget_ran_out
                   ? "not found (the search ran out of its work budget)\n"
                   : "none (a request is larger than any card)\n");
      } else {
        os << formatBytes(d.smallest_capacity) << ", checked by replay";
        if (d.smallest_capacity_slack > 0)
          os << " (the least lies at most " << formatBytes(d.smallest_capacity_slack) << " below)";
        os << "\n";
      }
    }
  }
  os << "note: " << kCannotChange << "\n";
  return kExitOk;
}

}  // namespace memforensics::cli
