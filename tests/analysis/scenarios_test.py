#!/usr/bin/env python3
"""The findings detectors against the scenario corpus (snapshots/scenarios/, docs/findings.md).

Usage: scenarios_test.py MEMFORENSICS_BINARY REPO_ROOT

For every NAME.expected.json (schema: snapshots/scenarios/README.md), `analyze --json
NAME.pickle` must
  * report each expected finding: kind, severity at least as given, and where given: a
    where/evidence frame containing `stack_contains`, bytes in [bytes_at_least, bytes_at_most],
    the `device` it is on (an int: that device's findings or a job finding of that device; null
    or absent: any device or the job), the OOM figures of `oom` (the finding's "oom" object:
    a [lo, hi] range per number, an exact value for a bool) and the live bytes per category of
    `categories` (its "live CATEGORY (inferred)" evidence lines, [lo, hi] each) and the cache
    flush of `flushed` (oom.flushed_bytes or an evidence line about the flush, [lo, hi]) and
    the text `fix_contains` in its fix;
  * report no finding of a `must_not_fire` kind at warning or high severity on any device or for
    the job, nor of a `must_not_fire_on[DEVICE]` kind on that device;
  * match the `headline` (focus device, first item's kind and device) and the per-device
    `device_facts` (events, OOM count, peaks and final bytes; iterations = the phases of kind
    "iteration" in `timeline --json`) exactly, and for single-device scenarios the `facts`
    events, peaks and iterations (unless the facts carry a "note" that they describe the
    recorded run rather than the file).
The corpus' `oom_fragmentation` is the `oom_verdict` finding whose verdict is fragmentation (its
"oom".fragmentation, or without that object a title saying fragmentation and not "not
fragmentation").
Prints one line per scenario and "N passed, N failed"; exits non-zero on any failure.
"""
import glob
import json
import re
import os
import subprocess
import sys

BIN, ROOT = sys.argv[1], sys.argv[2]
RANK = {"info": 0, "warning": 1, "high": 2}
DEVICE_FACTS = {  # expected.json device_facts key -> analyze --json device key
    "events": "events", "oom_count": "oom_count",
    "peak_requested_bytes": "peak_requested_bytes", "peak_reserved_bytes": "peak_reserved_bytes",
    "final_requested_bytes": "final_requested_bytes", "final_reserved_bytes": "final_reserved_bytes",
}
passed = failed = 0


def frames_of(f):
    out = [w for w in f.get("where", [])]
    for e in f.get("evidence", []):
        out += e.get("frames", [])
    return ["%s:%s" % (fr["filename"], fr["line"]) for fr in out]


def is_fragmentation(f):
    if isinstance(f.get("oom"), dict) and "fragmentation" in f["oom"]:
        return bool(f["oom"]["fragmentation"])
    return "fragmentation" in f["title"] and "not fragmentation" not in f["title"]


def matches(f, kind):
    if kind == "oom_fragmentation":
        return f["kind"] == "oom_verdict" and is_fragmentation(f)
    return f["kind"] == kind


def oom_problems(f, want):
    o = f.get("oom")
    if not isinstance(o, dict):
        return ["no oom figures"]
    bad = []
    for key, exp in want.items():
        got = o.get(key)
        if isinstance(exp, list):
            if not isinstance(got, int) or not exp[0] <= got <= exp[1]:
                bad.append("oom.%s %s not in [%d, %d]" % (key, got, exp[0], exp[1]))
        elif got != exp:
            bad.append("oom.%s %s != %s" % (key, got, exp))
    return bad


CATEGORY_EVIDENCE = re.compile(r"^live ([a-z][a-z ]*?) \(inferred\)")


def category_problems(f, want):
    """want: category -> [lo, hi] live bytes, read from the finding's "live CATEGORY
    (inferred)" evidence lines (a category without a line holds 0 bytes)."""
    got = {}
    for e in f.get("evidence", []):
        m = CATEGORY_EVIDENCE.match(e.get("text", ""))
        if m:
            got[m.group(1)] = got.get(m.group(1), 0) + e.get("bytes", 0)
    if not got:
        return ["no 'live CATEGORY (inferred)' evidence"]
    return ["%s %d not in [%d, %d]" % (c, got.get(c, 0), lo, hi)
            for c, (lo, hi) in want.items() if not lo <= got.get(c, 0) <= hi]


def flush_problems(f, rng):
    """The allocator's cache flush before an OOM, as oom.flushed_bytes or as an evidence line
    about it (text mentioning a flush, unmap or release), bytes in rng."""
    lo, hi = rng
    o = f.get("oom") if isinstance(f.get("oom"), dict) else {}
    if lo <= o.get("flushed_bytes", -1) <= hi:
        return []
    for e in f.get("evidence", []):
        text = e.get("text", "").lower()
        if (("flush" in text or "unmap" in text or "releas" in text)
                and lo <= e.get("bytes", -1) <= hi):
            return []
    return ["cache flush of [%d, %d] bytes not reported (oom.flushed_bytes %s)"
            % (lo, hi, o.get("flushed_bytes"))]


def check(exp, doc, iterations):
    problems = []
    # (device or None for a job finding without one, finding)
    found = [(d["device"], f) for d in doc["devices"] for f in d["findings"]]
    found += [(f.get("device"), f) for f in doc.get("job_findings", [])]
    for want in exp["findings"]:
        dev = want.get("device")
        cands = [f for d, f in found if matches(f, want["kind"]) and (dev is None or d == dev)]
        ok, why = [], []
        for f in cands:
            p = []
            if RANK[f["severity"]] < RANK[want["severity_at_least"]]:
                p.append("severity %s" % f["severity"])
            if "stack_contains" in want and not any(want["stack_contains"] in fr
                                                    for fr in frames_of(f)):
                p.append("no frame %s in %s" % (want["stack_contains"], frames_of(f)[:2]))
            if "bytes_at_least" in want and not (
                    want["bytes_at_least"] <= f["bytes"] <= want["bytes_at_most"]):
                p.append("bytes %d not in [%d, %d]" % (f["bytes"], want["bytes_at_least"],
                                                       want["bytes_at_most"]))
            if "fix_contains" in want and want["fix_contains"] not in f.get("fix", ""):
                p.append("fix without %r: %s" % (want["fix_contains"], f.get("fix", "")[:120]))
            if "oom" in want:
                p += oom_problems(f, want["oom"])
            if "categories" in want:
                p += category_problems(f, want["categories"])
            if "flushed" in want:
                p += flush_problems(f, want["flushed"])
            (why if p else ok).append(p)
        if not ok:
            where = "" if dev is None else " on cuda:%d" % dev
            problems.append("missed %s%s (%s)" % (want["kind"], where,
                                                  "; ".join(", ".join(p) for p in why)
                                                  or "nothing of that kind"))
    for kind in exp["must_not_fire"]:
        bad = [f for _, f in found if matches(f, kind) and RANK[f["severity"]] >= RANK["warning"]]
        if bad:
            problems.append("false alarm %s: %s" % (kind, bad[0]["title"]))
    for dev, kinds in exp.get("must_not_fire_on", {}).items():
        for kind in kinds:
            bad = [f for d, f in found if d == int(dev) and matches(f, kind)
                   and RANK[f["severity"]] >= RANK["warning"]]
            if bad:
                problems.append("false alarm %s on cuda:%s: %s" % (kind, dev, bad[0]["title"]))
    if "headline" in exp:
        h, want = doc.get("headline") or {}, exp["headline"]
        if h.get("focus_device") != want["focus_device"]:
            problems.append("headline focus_device %s, expected %s"
                            % (h.get("focus_device"), want["focus_device"]))
        items = h.get("items") or []
        first = items[0] if items else {}
        if (first.get("kind"), first.get("device")) != (want["first_kind"], want["first_device"]):
            problems.append("headline first item %s on %s, expected %s on %s"
                            % (first.get("kind"), first.get("device"), want["first_kind"],
                               want["first_device"]))
    by_dev = {d["device"]: d for d in doc["devices"]}
    facts = dict(exp.get("device_facts", {}))
    if not facts and "note" not in exp["facts"] and len(doc["devices"]) == 1:
        facts = {str(doc["devices"][0]["device"]): {
            k: exp["facts"][k] for k in ("events", "peak_requested_bytes", "peak_reserved_bytes",
                                         "iterations")}}
    for dev, want in facts.items():
        got = by_dev.get(int(dev))
        if got is None:
            problems.append("no cuda:%s in the output" % dev)
            continue
        for key, jkey in DEVICE_FACTS.items():
            if key in want and got.get(jkey) != want[key]:
                problems.append("cuda:%s %s %s, expected %s" % (dev, jkey, got.get(jkey),
                                                                 want[key]))
        if "iterations" in want:
            its = iterations.get(int(dev))
            if its != want["iterations"]:
                problems.append("cuda:%s: %s iterations in timeline --json, expected %d (%s)"
                                % (dev, its, want["iterations"],
                                   "layers of one forward pass are not steps"
                                   if want["iterations"] == 0 else "one per training step"))
    return problems


def timeline_iterations(pickle_path):
    """device -> number of phases of kind "iteration" in `timeline --json`."""
    r = subprocess.run([BIN, "timeline", "--json", pickle_path], capture_output=True, text=True)
    if r.returncode != 0:
        return {}
    return {d["device"]: sum(1 for p in d.get("phases", []) if p.get("kind") == "iteration")
            for d in json.loads(r.stdout)["devices"]}


for path in sorted(glob.glob(os.path.join(ROOT, "snapshots", "scenarios", "*.expected.json"))):
    exp = json.load(open(path))
    name = exp["scenario"]
    r = subprocess.run([BIN, "analyze", "--json", path.replace(".expected.json", ".pickle")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL {name}: exit {r.returncode}: {r.stderr}")
        failed += 1
        continue
    doc = json.loads(r.stdout)
    problems = check(exp, doc, timeline_iterations(path.replace(".expected.json", ".pickle")))
    if problems:
        failed += 1
        print(f"FAIL {name}: " + "; ".join(problems))
    else:
        passed += 1
        kinds = sorted({f["kind"] for d in doc["devices"] for f in d["findings"]}
                       | {f["kind"] for f in doc.get("job_findings", [])})
        print(f"ok   {name}: " + (", ".join(kinds) or "no findings"))

print(f"scenarios_test: {passed} passed, {failed} failed")
sys.exit(1 if failed or passed == 0 else 0)
