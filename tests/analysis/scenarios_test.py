#!/usr/bin/env python3
"""The findings detectors against the scenario corpus (snapshots/scenarios/, docs/findings.md).

Usage: scenarios_test.py MEMFORENSICS_BINARY REPO_ROOT

For every NAME.expected.json: `analyze --json NAME.pickle` must report each expected finding (kind,
severity at least as given, a where/evidence frame containing `stack_contains`, bytes in range)
and no finding of a `must_not_fire` kind at warning or high severity. The corpus' `oom_fragmentation`
is the `oom_verdict` finding whose title gives the fragmentation verdict.
Prints one line per scenario and "N passed, N failed"; exits non-zero on any failure.
"""
import glob
import json
import os
import subprocess
import sys

BIN, ROOT = sys.argv[1], sys.argv[2]
RANK = {"info": 0, "warning": 1, "high": 2}
passed = failed = 0


def frames_of(f):
    out = [w for w in f["where"]]
    for e in f["evidence"]:
        out += e["frames"]
    return ["%s:%s" % (fr["filename"], fr["line"]) for fr in out]


def matches(f, kind):
    if kind == "oom_fragmentation":
        return f["kind"] == "oom_verdict" and "fragmentation" in f["title"]
    return f["kind"] == kind


for path in sorted(glob.glob(os.path.join(ROOT, "snapshots", "scenarios", "*.expected.json"))):
    exp = json.load(open(path))
    name = exp["scenario"]
    r = subprocess.run([BIN, "analyze", "--json", path.replace(".expected.json", ".pickle")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL {name}: exit {r.returncode}: {r.stderr}")
        failed += 1
        continue
    found = [f for d in json.loads(r.stdout)["devices"] for f in d["findings"]]
    problems = []
    for want in exp["findings"]:
        cands = [f for f in found if matches(f, want["kind"])]
        ok = [f for f in cands
              if RANK[f["severity"]] >= RANK[want["severity_at_least"]]
              and any(want["stack_contains"] in fr for fr in frames_of(f))
              and want["bytes_at_least"] <= f["bytes"] <= want["bytes_at_most"]]
        if not ok:
            problems.append("missed %s (got: %s)" % (want["kind"], [
                (f["kind"], f["severity"], f["bytes"], frames_of(f)[:2]) for f in cands] or "nothing"))
    for kind in exp["must_not_fire"]:
        bad = [f for f in found if matches(f, kind) and RANK[f["severity"]] >= RANK["warning"]]
        if bad:
            problems.append("false alarm %s: %s" % (kind, bad[0]["title"]))
    if problems:
        failed += 1
        print(f"FAIL {name}: " + "; ".join(problems))
    else:
        passed += 1
        print(f"ok   {name}: " + (", ".join(sorted({f['kind'] for f in found})) or "no findings"))

print(f"scenarios_test: {passed} passed, {failed} failed")
sys.exit(1 if failed or passed == 0 else 0)
