// cmd_check.cc: `memforensics check FILE... [--max-peak-reserved SIZE] [--max-peak-requested SIZE]
// [--max-growth-per-step SIZE] [--fail-on high|warning] [--baseline FILE --max-increase PCT]
// [--device N] [--json]`.
#include "cli/cmd_check.h"

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "analysis/compare/compare.h"
#include "cli/cmd_diff.h"
#include "cli/diagnostics.h"
#include "cli/options.h"
#include "cli/threads.h"
#include "common/parse_size.h"
#include "report/render_compare.h"

namespace memforensics::cli {

namespace {

struct CheckArgs {
  std::vector<std::string> files;
  // An empty value is refused, not taken for "not given" (a gate must not drop a limit silently).
  std::optional<std::string> max_peak_reserved, max_peak_requested, max_growth;
  std::string fail_on;
  std::string baseline;
  std::optional<double> max_increase;
  std::optional<int64_t> device;
  bool json = false;
  bool salvage = false;
};
CheckArgs g_args;

// Not given, or the size; anything else (an empty value included) is a usage error.
bool sizeArg(const std::string& flag, const std::optional<std::string>& text,
             std::optional<uint64_t>& out) {
  if (!text) return true;
  SizeParse p = parseSize(*text);
  if (!p.ok) {
    printError(flag + ": " + p.error);
    return false;
  }
  out = p.bytes;
  return true;
}

}  // namespace

CLI::App* addCheckCommand(CLI::App& app) {
  auto* c = app.add_subcommand(
      "check",
      "A CI gate: exit 3 when a peak, the growth per step, a finding or the increase over a "
      "baseline passes its limit, 0 when every limit holds");
  c->add_option("FILE", g_args.files, "snapshot files to check (any supported kind)")->required();
  const char* kSize = "SIZE (20GiB, 512MiB, 1.5GB or bytes)";
  c->add_option("--max-peak-reserved", g_args.max_peak_reserved,
                std::string("fail when a device's peak reserved bytes exceed this ") + kSize);
  c->add_option("--max-peak-requested", g_args.max_peak_requested,
                std::string("fail when a device's peak requested bytes exceed this ") + kSize);
  c->add_option("--max-growth-per-step", g_args.max_growth,
                std::string("fail when requested bytes at an iteration's end exceed the previous "
                            "iteration's end by more than this ") +
                    kSize);
  c->add_option("--fail-on", g_args.fail_on,
                "fail on findings of this severity or above: high, or warning (warning and high)")
      ->check(CLI::IsMember({"high", "warning"}));
  auto* base = c->add_option("--baseline", g_args.baseline,
                             "a reference run: with --max-increase, fail when a peak grew more");
  auto* inc = c->add_option("--max-increase", g_args.max_increase,
                            "PCT: the most a peak (reserved, requested, allocated) may exceed the "
                            "baseline's, in percent")
                  ->check(percentOption(1e6));
  inc->needs(base);
  base->needs(inc);
  c->add_option("--device", g_args.device, "only this CUDA device ordinal")->check(kInt64Option);
  c->add_flag("--json", g_args.json, "one JSON document (fields in docs/cli.md)");
  c->add_flag("--salvage", g_args.salvage,
              "read the intact part of a native trace that is damaged in the middle");
  addThreadsOption(c);
  return c;
}

namespace {

// Why an input that was read cannot take part in the gate, with the exit it gives (rc kExitOk and
// no reason when it can): a --device it lacks (exit 1, as every command), or one a gate cannot
// hold on (exit 2): cut short (its peaks may lie past the cut) or holding no device at all
// (history not recorded, the wrong rank's dump). For the files and the baseline alike.
struct Unusable {
  std::string why;
  int rc = kExitOk;
};
Unusable unusable(const analysis::RunProfile& p, std::optional<int64_t> device) {
  if (device && p.devices.empty()) return {"has no device " + std::to_string(*device), kExitUsage};
  if (!p.incomplete.empty()) {
    return {"is incomplete, so no limit can be said to hold: " + p.incomplete, kExitError};
  }
  if (p.devices.empty()) {
    return {"holds nothing to check: no device has segments or trace entries", kExitError};
  }
  return {};
}

}  // namespace

int runCheckCommand() {
  analysis::CheckLimits limits;
  if (!sizeArg("--max-peak-reserved", g_args.max_peak_reserved, limits.max_peak_reserved) ||
      !sizeArg("--max-peak-requested", g_args.max_peak_requested, limits.max_peak_requested) ||
      !sizeArg("--max-growth-per-step", g_args.max_growth, limits.max_growth_per_step)) {
    return kExitUsage;
  }
  if (!g_args.fail_on.empty()) {
    limits.fail_on = g_args.fail_on == "high" ? analysis::FindingSeverity::High
                                              : analysis::FindingSeverity::Warning;
  }
  limits.max_increase_pct = g_args.max_increase;
  if (!limits.max_peak_reserved && !limits.max_peak_requested && !limits.max_growth_per_step &&
      !limits.fail_on && !limits.max_increase_pct) {
    printError(
        "check needs at least one limit: --max-peak-reserved, --max-peak-requested, "
        "--max-growth-per-step, --fail-on or --baseline with --max-increase");
    return kExitUsage;
  }
  std::vector<report::CheckFile> files;
  analysis::CheckReport all;
  // The document is written whatever stops the check (a --json consumer reads `passed`).
  auto finish = [&](int rc) {
    setActivity("writing the check");
    if (g_args.json) {
      report::renderCheckJson(files, all, std::cout);
    } else {
      report::renderCheckText(files, all, std::cout);
    }
    return rc;
  };
  std::optional<analysis::RunProfile> baseline;
  if (!g_args.baseline.empty()) {
    auto b = loadProfile(g_args.baseline, g_args.device, g_args.salvage);
    if (!b) {
      files.push_back({g_args.baseline, "baseline: " + b.error().describe()});
      printError(files.back().error);
      return finish(kExitError);
    }
    if (const Unusable u = unusable(*b, g_args.device); u.rc != kExitOk) {
      files.push_back({g_args.baseline, "the baseline " + g_args.baseline + " " + u.why});
      printError(files.back().error);
      return finish(u.rc);
    }
    baseline = std::move(*b);
  }
  bool missing = false;     // a file without the --device: no pass over nothing
  bool unreadable = false;  // a file that could not be read
  for (const auto& path : g_args.files) {
    report::CheckFile f{path, ""};
    auto p = loadProfile(path, g_args.device, g_args.salvage);
    if (!p) {
      f.error = p.error().describe();
      printError(f.error);
      unreadable = true;
    } else if (const Unusable u = unusable(*p, g_args.device); u.rc != kExitOk) {
      f.error = path + " " + u.why;
      printError(f.error);
      (u.rc == kExitUsage ? missing : unreadable) = true;
    } else {
      setActivity("checking " + path);
      auto r = analysis::checkProfile(*p, limits, baseline ? &*baseline : nullptr);
      for (auto& v : r.violations) all.violations.push_back(std::move(v));
      for (auto& n : r.notes) all.notes.push_back(path + ": " + n);
    }
    files.push_back(std::move(f));
  }
  // An unreadable input (exit 2) says more than a device it lacks (exit 1).
  if (unreadable) return finish(kExitError);
  if (missing) return finish(kExitUsage);
  return finish(all.violations.empty() ? kExitOk : kExitCheckFailed);
}

}  // namespace memforensics::cli
