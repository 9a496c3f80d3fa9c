#!/usr/bin/env python3
"""End-to-end tests of the memforensics executable.

Usage: cli_test.py MEMFORENSICS_BINARY REPO_ROOT REAL_SNAPSHOTS_DIR

* golden output: `analyze` (text and JSON) and `dump` on every sample in snapshots/ compared byte
  for byte with tests/golden/expected/ (MEMF_UPDATE_GOLDEN=1 rewrites them);
* the sample pickle is what tools/snapshot_fixture.py makes from its .fixture (no stale sample);
* exit codes: 0 ok, 1 bad usage, 2 unreadable or hostile input, with a message naming the problem;
* `analyze --json` peaks equal tools/ref_replay.py's independent replay on every real snapshot.
* `convert`: pickle -> native trace -> pickle gives identical `analyze --json` figures on every
  real snapshot; Perfetto and collapsed exports agree with `analyze`; cut and damaged native
  traces give a warning or exit 2 (and `--salvage` reads the intact part).
Prints "N passed, N failed" and exits non-zero on any failure.
"""
import json
import os
import subprocess
import sys
import tempfile

BIN, ROOT, REAL = sys.argv[1], sys.argv[2], sys.argv[3]
UPDATE = os.environ.get("MEMF_UPDATE_GOLDEN") == "1"
EXPECTED = os.path.join(ROOT, "tests", "golden", "expected")
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}: {detail}")


def run(*args, cwd=None):
    return subprocess.run([BIN, *args], capture_output=True, text=True, cwd=cwd)


def golden(name, text):
    path = os.path.join(EXPECTED, name)
    if UPDATE or not os.path.exists(path):
        if not UPDATE:
            check(f"golden {name}", False, f"missing {path} (run with MEMF_UPDATE_GOLDEN=1)")
            return
        os.makedirs(EXPECTED, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return
    with open(path) as f:
        want = f.read()
    if want != text:
        import difflib
        diff = "".join(list(difflib.unified_diff(want.splitlines(True), text.splitlines(True),
                                                 "expected", "actual"))[:40])
        check(f"golden {name}", False, "\n" + diff)
    else:
        check(f"golden {name}", True)


samples = sorted(f for f in os.listdir(os.path.join(ROOT, "snapshots")) if f.endswith(".pickle"))
check("samples exist", len(samples) > 0, "no .pickle in snapshots/")
for sample in samples:
    stem = sample[: -len(".pickle")]
    # Run from the repository root with a relative path so the output is machine independent.
    r = run("analyze", os.path.join("snapshots", sample), cwd=ROOT)
    check(f"analyze {sample} exit", r.returncode == 0, r.stderr)
    golden(f"{stem}.analyze.txt", r.stdout)
    r = run("analyze", "--json", os.path.join("snapshots", sample), cwd=ROOT)
    check(f"analyze --json {sample} exit", r.returncode == 0, r.stderr)
    golden(f"{stem}.analyze.json", r.stdout)
    r = run("dump", "--stacks", os.path.join("snapshots", sample), cwd=ROOT)
    check(f"dump {sample} exit", r.returncode == 0, r.stderr)
    golden(f"{stem}.dump.txt", r.stdout)
    fixture = os.path.join(ROOT, "snapshots", stem + ".fixture")
    if os.path.exists(fixture):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "x.pickle")
            c = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "snapshot_fixture.py"),
                                fixture, "-o", out], capture_output=True, text=True)
            check(f"fixture {stem} compiles", c.returncode == 0, c.stderr)
            if c.returncode == 0:
                with open(out, "rb") as a, open(os.path.join(ROOT, "snapshots", sample), "rb") as b:
                    check(f"{sample} is up to date with its fixture", a.read() == b.read(),
                          "regenerate with tools/snapshot_fixture.py")

# Exit codes and messages.
r = run()
check("no subcommand is a usage error", r.returncode == 1, f"rc={r.returncode}")
r = run("analyze")
check("missing FILE is a usage error", r.returncode == 1, f"rc={r.returncode}")
r = run("analyze", "--frobnicate", "x")
check("unknown option is a usage error", r.returncode == 1, f"rc={r.returncode}")
r = run("analyze", "/nonexistent.pickle")
check("missing file exits 2", r.returncode == 2 and "cannot open" in r.stderr, r.stderr)
with tempfile.TemporaryDirectory() as tmp:
    evil = os.path.join(tmp, "evil.pickle")
    # pickle.dumps of an object whose __reduce__ calls os.system: GLOBAL/STACK_GLOBAL + REDUCE.
    with open(evil, "wb") as f:
        f.write(b"\x80\x04\x95\x1e\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94"
                b"\x93\x94\x8c\x06touch \x94\x85\x94R\x94.")
    r = run("analyze", evil)
    check("hostile pickle exits 2", r.returncode == 2, f"rc={r.returncode}")
    check("hostile pickle names the opcode and offset",
          "refused opcode STACK_GLOBAL" in r.stderr and "byte offset" in r.stderr, r.stderr)
    trunc = os.path.join(tmp, "trunc.pickle")
    with open(os.path.join(ROOT, "snapshots", samples[0]), "rb") as f:
        data = f.read()
    with open(trunc, "wb") as f:
        f.write(data[: len(data) // 2])
    r = run("analyze", trunc)
    check("truncated file exits 2 with a reason", r.returncode == 2 and "truncated" in r.stderr, r.stderr)
    # One bad file among good ones: the good ones are still analyzed.
    r = run("analyze", "--json", trunc, os.path.join(ROOT, "snapshots", samples[0]))
    docs = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    check("other files still analyzed after a bad one", r.returncode == 2 and len(docs) == 1,
          f"rc={r.returncode} docs={len(docs)}")

# Independent replay on every real snapshot (and the samples).
inputs = [os.path.join(ROOT, "snapshots", s) for s in samples]
if os.path.isdir(REAL):
    inputs += [os.path.join(REAL, f) for f in sorted(os.listdir(REAL)) if f.endswith(".pickle")]
else:
    print(f"note: {REAL} not found; real snapshots skipped")
for path in inputs:
    name = os.path.basename(path)
    r = run("analyze", "--json", path)
    ref = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "ref_replay.py"), path],
                         capture_output=True, text=True)
    if r.returncode != 0 or ref.returncode != 0:
        check(f"independent replay {name}", False, r.stderr + ref.stderr)
        continue
    ours = {d["device"]: d for d in json.loads(r.stdout)["devices"]}
    theirs = {d["device"]: d for d in json.loads(ref.stdout)["devices"]}
    check(f"same devices {name}", sorted(ours) == sorted(theirs), f"{sorted(ours)} vs {sorted(theirs)}")
    for dev, t in theirs.items():
        o = ours.get(dev, {})
        for key in ("peak_reserved_bytes", "peak_requested_bytes", "final_reserved_bytes",
                    "final_requested_bytes", "start_reserved_bytes", "start_requested_bytes"):
            check(f"{name} device {dev} {key}", o.get(key) == t[key], f"{o.get(key)} != {t[key]}")
        check(f"{name} device {dev} events", o.get("events") == t["events"], "")
    # Findings: no high-severity finding on a real snapshot other than an OOM verdict (each was
    # read by hand: none of these files shows a leak or bloat a person would accept).
    if path.startswith(REAL):
        for d in json.loads(r.stdout)["devices"]:
            for f in d["findings"]:
                check(f"{name}: no high-severity false alarm",
                      f["severity"] != "high" or f["kind"] == "oom_verdict", f["title"])

# `convert`: pickle -> native -> pickle keeps every figure of `analyze --json`; exports; errors.
def figures(doc):
    return json.dumps([doc["devices"], doc["input"]["pytorch_era"]], sort_keys=True)


with tempfile.TemporaryDirectory() as tmp:
    for path in inputs:
        name = os.path.basename(path)
        stem = os.path.join(tmp, name.replace(".pickle", ""))
        r1 = run("convert", path, "-o", stem + ".bin")
        r2 = run("convert", stem + ".bin", "-o", stem + ".rt.pickle")
        if r1.returncode != 0 or r2.returncode != 0:
            check(f"convert round trip {name}", False, r1.stderr + r2.stderr)
            continue
        docs = [json.loads(run("analyze", "--json", p).stdout) for p in (path, stem + ".bin", stem + ".rt.pickle")]
        check(f"convert {name}: same figures from pickle, native and pickle again",
              figures(docs[0]) == figures(docs[1]) == figures(docs[2]))
        check(f"convert {name}: native detected by content", docs[1]["input"]["format"] == "native_trace")
        # The written pickle is plain data that Python's own pickle reads.
        py = subprocess.run([sys.executable, "-c", "import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); "
                             "print(type(d).__name__)", stem + ".rt.pickle"], capture_output=True, text=True)
        check(f"convert {name}: Python unpickles the written pickle", py.returncode == 0, py.stderr)
    sample = os.path.join(ROOT, "snapshots", samples[0])
    perf = os.path.join(tmp, "s.perfetto.json")
    r = run("convert", sample, "-o", perf)
    ok = r.returncode == 0
    if ok:
        with open(perf) as f:
            trace = json.load(f)
        counters = [e for e in trace["traceEvents"] if e.get("ph") == "C" and e.get("name") == "requested"]
        peak = json.loads(run("analyze", "--json", sample).stdout)["devices"][0]["peak_requested_bytes"]
        check("perfetto: requested counter peaks at analyze's figure",
              max(e["args"]["bytes"] for e in counters) == peak)
        check("perfetto: one OOM instant per OOM",
              sum(1 for e in trace["traceEvents"] if e.get("name") == "OOM") ==
              json.loads(run("analyze", "--json", sample).stdout)["devices"][0]["oom_count"])
    check("convert --to perfetto exit", ok, r.stderr)
    r = run("convert", sample, "-o", "-", "--to", "collapsed")
    total = sum(int(line.rsplit(" ", 1)[1]) for line in r.stdout.splitlines() if line.strip())
    peak = json.loads(run("analyze", "--json", sample).stdout)["devices"][0]["peak_requested_bytes"]
    check("collapsed to stdout sums to the requested peak", r.returncode == 0 and total == peak, f"{total} vs {peak}")
    r = run("convert", sample, "-o", os.path.join(tmp, "x.unknown"))
    check("convert without a known extension or --to exits 1", r.returncode == 1 and "--to" in r.stderr, r.stderr)
    r = run("convert", sample, "-o", os.path.join(tmp, "x.out"), "--to", "nonsense")
    check("convert --to nonsense exits 1", r.returncode == 1, r.stderr)
    # A native trace cut in the middle: read with a warning (exit 0); damaged: exit 2 unless --salvage.
    native = os.path.join(tmp, "s.bin")
    run("convert", sample, "-o", native, "--zstd-level", "0")
    with open(native, "rb") as f:
        data = f.read()
    cut = os.path.join(tmp, "cut.bin")
    with open(cut, "wb") as f:
        f.write(data[: len(data) * 2 // 3])
    r = run("analyze", "--json", cut)
    ok = r.returncode == 0 and "incomplete native trace" in r.stderr
    check("cut native trace: analyzed with a warning", ok, r.stderr)
    if ok:
        check("cut native trace: the warning is in the JSON too",
              any("incomplete" in w for w in json.loads(r.stdout)["input"]["warnings"]))
    bad = bytearray(data)
    bad[len(bad) // 3] ^= 0x40
    damaged = os.path.join(tmp, "damaged.bin")
    with open(damaged, "wb") as f:
        f.write(bad)
    r = run("analyze", damaged)
    check("damaged native trace exits 2 naming --salvage", r.returncode == 2 and "--salvage" in r.stderr, r.stderr)
    r = run("analyze", "--salvage", damaged)
    check("--salvage reads the intact prefix", r.returncode == 0 and "damaged native trace" in r.stderr, r.stderr)
    r = run("convert", sample, "-o", os.path.join(tmp, "missing-dir", "x.bin"))
    check("unwritable output exits 2", r.returncode == 2 and not os.path.exists(os.path.join(tmp, "missing-dir")),
          r.stderr)
    leftovers = [f for f in os.listdir(tmp) if ".tmp-" in f]
    check("no temporary files left behind", not leftovers, str(leftovers))

# `blocks`: on every real snapshot at the peak, each segment's blocks tile it exactly and have
# valid states; --at oom without an OOM and a malformed --at are usage errors (exit 1).
VALID_STATES = {"active_allocated", "active_pending_free", "inactive"}
if os.path.isdir(REAL):
    for f in sorted(os.listdir(REAL)):
        if not f.endswith(".pickle"):
            continue
        r = run("blocks", os.path.join(REAL, f), "--at", "peak", "--json")
        if r.returncode != 0:
            check(f"blocks {f}", False, f"rc={r.returncode} {r.stderr}")
            continue
        doc = json.loads(r.stdout)
        bad = []
        for seg in doc["segments"]:
            pos = seg["address"]
            for b in seg["blocks"]:
                if b["address"] != pos or b["state"] not in VALID_STATES:
                    bad.append(f"{seg['address']:#x}: block {b['address']:#x} {b['state']}")
                pos += b["size"]
            if sum(b["size"] for b in seg["blocks"]) != seg["size"] or pos != seg["address"] + seg["size"]:
                bad.append(f"{seg['address']:#x}: blocks do not add up to the segment size")
        check(f"blocks {f} block sizes add up per segment", not bad, "; ".join(bad[:3]))
    silmont = os.path.join(REAL, "silmont2000__assignment2-systems__mem_snapshot.pickle")
    if os.path.exists(silmont):
        r = run("blocks", silmont, "--at", "oom")
        check("blocks --at oom without an OOM exits 1", r.returncode == 1 and "no OOM" in r.stderr, r.stderr)
        r = run("blocks", silmont, "--at", "x12")
        check("blocks --at malformed exits 1", r.returncode == 1, r.stderr)
        r = run("blocks", silmont, "--at", "52")
        check("blocks text map", r.returncode == 0 and "legend:" in r.stdout and "layout: exact" in r.stdout,
              r.stdout[:300])

# `timeline`: its peaks are `analyze`'s on every real snapshot and the sample; --csv has the
# documented columns; downsampling keeps the exact peaks and every OOM.
TIMELINE_CSV = ["device", "event", "time_us", "reserved", "allocated", "requested", "pending_free"]
tl_inputs = [os.path.join(ROOT, "snapshots", "sample_training.pickle")]
if os.path.isdir(REAL):
    tl_inputs += [os.path.join(REAL, f) for f in sorted(os.listdir(REAL)) if f.endswith(".pickle")]
for path in tl_inputs:
    name = os.path.basename(path)
    an = run("analyze", "--json", path)
    tl = run("timeline", "--json", "--max-points", "100", path)
    if an.returncode != 0 or tl.returncode != 0:
        check(f"timeline {name}", False, f"rc={an.returncode}/{tl.returncode} {tl.stderr}")
        continue
    adoc, tdoc = json.loads(an.stdout), json.loads(tl.stdout)
    diffs = []
    for ad, td in zip(adoc["devices"], tdoc["devices"]):
        for k in ("reserved", "requested", "allocated", "active"):
            for f in ("bytes", "event", "time_us"):
                key = f"peak_{k}_{f}"
                if ad[key] != td[key]:
                    diffs.append(f"device {ad['device']} {key}: analyze {ad[key]} timeline {td[key]}")
        kept = {p[0]: p for p in td["points"]}
        if td["kept_points"] != len(td["points"]) or (td["downsampled"] and td["bucket_size"] < 2):
            diffs.append(f"device {td['device']}: kept_points/bucket_size inconsistent")
        if ad["peak_requested_event"] is not None:
            pt = kept.get(ad["peak_requested_event"])
            if pt is None or pt[4] != ad["peak_requested_bytes"]:
                diffs.append(f"device {td['device']}: requested peak point not kept exactly")
        if max((p[4] for p in td["points"]), default=0) != ad["peak_requested_bytes"]:
            diffs.append(f"device {td['device']}: max kept requested != peak")
        for o in ad["ooms"]:
            if o["event"] not in kept:
                diffs.append(f"device {td['device']}: OOM event {o['event']} not kept")
    if len(adoc["devices"]) != len(tdoc["devices"]):
        diffs.append("device count differs")
    check(f"timeline --json peaks == analyze --json peaks: {name}", not diffs, "; ".join(diffs[:3]))
    r = run("timeline", "--csv", path)
    lines = r.stdout.splitlines()
    ok = r.returncode == 0 and bool(lines) and lines[0].split(",") == TIMELINE_CSV
    bad = [ln for ln in lines[1:] if len(ln.split(",")) != len(TIMELINE_CSV)
           or not all(c.lstrip("-").isdigit() for i, c in enumerate(ln.split(",")) if not (i == 2 and c == ""))]
    check(f"timeline --csv columns: {name}", ok and not bad, (bad[:2], lines[:1], r.stderr))
    r = run("timeline", path)
    check(f"timeline text: {name}", r.returncode == 0 and "requested |" in r.stdout or "0 events" in r.stdout,
          r.stdout[:300] + r.stderr)
r = run("timeline", "--csv", "--json", tl_inputs[0])
check("timeline --csv --json exits 1", r.returncode == 1, r.stderr)
r = run("timeline", os.path.join(ROOT, "no-such-file.pickle"))
check("timeline missing file exits 2", r.returncode == 2, r.stderr)

# `report`: the default output name, stdout, a missing device, unreadable input; the page's numbers
# against a browser are in tests/report/browser_test.py.
with tempfile.TemporaryDirectory() as td:
    sample = os.path.join(ROOT, "snapshots", "sample_training.pickle")
    r = run("report", sample, cwd=td)
    out = os.path.join(td, "sample_training.html")
    check("report writes FILE's name with .html by default", r.returncode == 0 and os.path.exists(out), r.stderr)
    check("report says what it wrote", "wrote" in r.stderr and "keyframes" in r.stderr, r.stderr)
    if os.path.exists(out):
        page = open(out, encoding="utf-8").read()
        check("report page is one self-contained file", page.startswith("<!doctype html>") and "MEMF_" not in page
              and "https://" not in page and "http://" not in page, page[:200])
        check("report leaves no temporary file", sorted(os.listdir(td)) == ["sample_training.html"], os.listdir(td))
    r = run("report", sample, "-o", "-")
    check("report -o - writes the page to stdout", r.returncode == 0 and r.stdout.startswith("<!doctype html>"), r.stderr)
    r = run("report", sample, "--device", "7", "-o", os.path.join(td, "x.html"))
    check("report --device absent exits 2 and writes nothing",
          r.returncode == 2 and "no device 7" in r.stderr and not os.path.exists(os.path.join(td, "x.html")), r.stderr)
    r = run("report", os.path.join(ROOT, "no-such-file.pickle"), "-o", os.path.join(td, "y.html"))
    check("report missing file exits 2", r.returncode == 2 and not os.path.exists(os.path.join(td, "y.html")), r.stderr)
    r = run("report", sample, "-o", os.path.join(td, "no-such-dir", "z.html"))
    check("report to an unwritable place exits 1", r.returncode == 1 and "cannot create" in r.stderr, r.stderr)

print(f"cli_test: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
