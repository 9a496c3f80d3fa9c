#!/usr/bin/env python3
"""End-to-end tests of the memforensics executable.

Usage: cli_test.py MEMFORENSICS_BINARY REPO_ROOT REAL_SNAPSHOTS_DIR

* `analyze` runs on every sample in snapshots/ (their goldens: tests/golden/golden_test.py);
* the sample pickle is what tools/snapshot_fixture.py makes from its .fixture (no stale sample);
* exit codes: 0 ok, 1 bad usage, 2 unreadable or hostile input, with a message naming the problem;
* output safety: standard output write errors are exit 2, `-o` never replaces a device or FIFO
  nor overwrites an input; text output escapes control characters and invalid UTF-8 and JSON
  stays valid; numbers out of range are usage errors; out of memory is exit 2 with a message;
* `analyze --json` peaks equal tools/ref_replay.py's independent replay on every real snapshot.
* `convert`: pickle -> native trace -> pickle gives identical `analyze --json` figures on every
  real snapshot; Perfetto and collapsed exports agree with `analyze`; cut and damaged native
  traces give a warning or exit 2 (and `--salvage` reads the intact part).
Prints "N passed, N failed" and exits non-zero on any failure.
"""
import json
import os
import pickle
import re
import resource
import stat
import subprocess
import sys
import tempfile
import threading
import time

BIN, ROOT, REAL = sys.argv[1], sys.argv[2], sys.argv[3]
# The text report wraps to COLUMNS when it is set: the expected outputs are at the default 100.
os.environ.pop("COLUMNS", None)
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


samples = sorted(f for f in os.listdir(os.path.join(ROOT, "snapshots")) if f.endswith(".pickle"))
check("samples exist", len(samples) > 0, "no .pickle in snapshots/")
for sample in samples:
    stem = sample[: -len(".pickle")]
    # Run from the repository root with a relative path so the output is machine independent.
    r = run("analyze", os.path.join("snapshots", sample), cwd=ROOT)
    check(f"analyze {sample} exit", r.returncode == 0, r.stderr)
    check(f"analyze {sample} names its input", "snapshots/" + sample in r.stdout, r.stdout[:200])
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
# A reader that closes the pipe early (`dump big.pickle | head -c 10`): exit 2 with the reason, not
# death by SIGPIPE (141). subprocess resets SIGPIPE to its default in the child, as a shell does.
# (520 KB of output: far more than a pipe holds, so the write after the close must fail.)
big = os.path.join(ROOT, "snapshots", "scenarios", "checkpointing_opportunity.pickle")
p = subprocess.Popen([BIN, "dump", "--stacks", big], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
p.stdout.read(10)
p.stdout.close()
err = p.stderr.read().decode(errors="replace")
p.wait(timeout=60)
check("dump | head -c 10 exits 2 with the reason", p.returncode == 2 and "Broken pipe" in err,
      f"rc={p.returncode} {err}")

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
        # Both replays judge whether the trace can lead to the file's final state (ref_replay: no
        # total below zero on the way back). Where it cannot (drisspg's mini_snapshot: the trace
        # stops before the segments were taken), both say so and name the start and peaks as
        # untrusted; only the file's own final figures are compared (ours: final_in_file).
        check(f"{name} device {dev} consistent", o.get("consistent") == t["consistent"],
              f"{o.get('consistent')} != {t['consistent']}")
        if t["consistent"]:
            for key in ("peak_reserved_bytes", "peak_requested_bytes", "final_reserved_bytes",
                        "final_requested_bytes", "start_reserved_bytes", "start_requested_bytes"):
                check(f"{name} device {dev} {key}", o.get(key) == t[key], f"{o.get(key)} != {t[key]}")
        else:
            check(f"{name} device {dev} untrusted figures", set(t["untrusted"]) <= set(o.get("untrusted", [])),
                  f"{o.get('untrusted')} lacks {t['untrusted']}")
            fin = o.get("final_in_file", {})
            for key, theirs in (("reserved_bytes", "final_reserved_bytes"), ("requested_bytes", "final_requested_bytes")):
                check(f"{name} device {dev} final_in_file {key}", fin.get(key) == t[theirs],
                      f"{fin.get(key)} != {t[theirs]}")
            check(f"{name} device {dev} counters never negative",
                  all(v >= 0 for c in (o.get("start", {}), o.get("final", {})) for v in c.values()), str(o.get("start")))
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

# `blocks --at` takes the moments analyze prints ("at event N (t+1.442 s)") as they are: the moment
# it resolves is event N or a later one within the printed figure's rounding (issue 29 item 7).
UNIT_US = {"us": 1, "ms": 1000, "s": 1000000}
for path in inputs:
    name = os.path.basename(path)
    doc = run("analyze", "--json", path)
    text = run("analyze", path)
    if doc.returncode != 0 or text.returncode != 0 or len(json.loads(doc.stdout)["devices"]) != 1:
        continue
    first_us = json.loads(doc.stdout)["devices"][0]["first_time_us"]
    moments = re.findall(r"at event (\d+) \(t\+([0-9.]+) ?(us|ms|s)\)", text.stdout)
    for event, num, unit in sorted(set(moments)):
        frac = len(num.split(".")[1]) if "." in num else 0
        bound = int((2 * int(num.replace(".", "")) + 1) * UNIT_US[unit] // (2 * 10 ** frac))
        for arg in (f"t+{num} {unit}", f"t+{num}{unit}"):
            r = run("blocks", path, "--at", arg, "--json")
            ok = r.returncode == 0
            got = json.loads(r.stdout) if ok else {}
            ok = ok and got["event"] >= int(event) and got["time_us"] - first_us <= bound
            check(f"blocks --at {arg!r} on {name} is event {event}'s moment", ok,
                  r.stderr or f"event {got.get('event')} at {got.get('time_us')}, "
                  f"first {first_us}, bound {bound}")

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
    check("report --device absent exits 1 (as blocks) and writes nothing",
          r.returncode == 1 and "no device 7" in r.stderr and not os.path.exists(os.path.join(td, "x.html")), r.stderr)
    for cmd in (["analyze"], ["analyze", "--json"], ["timeline"]):
        r = run(*cmd, sample, "--device", "7")
        check("%s --device absent exits 1 (as blocks, report, whatif)" % " ".join(cmd),
              r.returncode == 1 and "no device 7" in r.stderr and r.stdout == "", r.stderr)
    # ranks prints a row per file whatever happens; a file without the device is exit 1 (usage),
    # a file that cannot be read beside it still makes it 2.
    r = run("ranks", sample, "--device", "7")
    check("ranks --device absent exits 1 (as the other commands) with its row",
          r.returncode == 1 and "no device 7" in r.stderr and "no device 7" in r.stdout, (r.returncode, r.stderr))
    r = run("ranks", sample, os.path.join(ROOT, "no-such-file.pickle"), "--device", "7")
    check("ranks --device absent beside an unreadable file exits 2", r.returncode == 2, (r.returncode, r.stderr))
    r = run("report", os.path.join(ROOT, "no-such-file.pickle"), "-o", os.path.join(td, "y.html"))
    check("report missing file exits 2", r.returncode == 2 and not os.path.exists(os.path.join(td, "y.html")), r.stderr)
    r = run("report", sample, "-o", os.path.join(td, "no-such-dir", "z.html"))
    check("report to an unwritable place exits 2", r.returncode == 2 and "cannot create" in r.stderr, r.stderr)

# Output safety, checked standard output, escaping, out-of-range numbers, out of memory (issue 11).
def runb(*args, cwd=None, stdout=subprocess.PIPE, preexec_fn=None, timeout=60):
    return subprocess.run([BIN, *args], stdout=stdout, stderr=subprocess.PIPE, cwd=cwd, preexec_fn=preexec_fn,
                          timeout=timeout)


def terminal_safe(data):
    """Valid UTF-8 without C0 controls (newline aside), DEL or C1 controls."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8: {e}"
    bad = [hex(ord(c)) for c in text if c != "\n" and (ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f)]
    return f"control characters {bad[:5]}" if bad else ""


sample = os.path.join(ROOT, "snapshots", "sample_training.pickle")
if os.path.exists("/dev/full"):
    # Every write to standard output is checked: a full disk is exit 2 with the reason.
    for args in (["analyze", sample], ["analyze", "--json", sample], ["dump", "--stacks", sample],
                 ["timeline", sample], ["timeline", "--csv", sample], ["timeline", "--json", sample],
                 ["blocks", sample], ["blocks", "--json", sample], ["convert", sample, "-o", "-", "--to", "pickle"],
                 ["convert", sample, "-o", "-", "--to", "collapsed"], ["convert", sample, "-o", "/dev/stdout", "--to", "native"],
                 ["report", sample, "-o", "-"]):
        with open("/dev/full", "wb") as full:
            r = runb(*args, stdout=full)
        err = r.stderr.decode(errors="replace")
        check(f"{' '.join(args[:1] + [a for a in args[1:] if a.startswith('-')])} > /dev/full exits 2 with the reason",
              r.returncode == 2 and "memforensics: error: cannot write to standard output: No space left on device" in err,
              f"rc={r.returncode} {err}")

with tempfile.TemporaryDirectory() as tmp:
    with open(sample, "rb") as f:
        sample_bytes = f.read()
    ref = runb("convert", sample, "-o", "-", "--to", "pickle").stdout
    # A character device is written through, never replaced by a renamed temporary file.
    node = os.path.join(tmp, "null")
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        node = None
    if node:
        for args in (["convert", sample, "-o", node, "--to", "pickle"], ["report", sample, "-o", node]):
            r = runb(*args)
            check(f"{args[0]} -o a character device writes through it",
                  r.returncode == 0 and stat.S_ISCHR(os.lstat(node).st_mode), f"rc={r.returncode} {r.stderr}")
    else:
        print("note: mknod not permitted; the character-device check uses /dev/null itself")
    r = runb("convert", sample, "-o", "/dev/null", "--to", "pickle")
    check("convert -o /dev/null", r.returncode == 0 and stat.S_ISCHR(os.stat("/dev/null").st_mode), r.stderr)
    # A FIFO with a reader gets the output, one without a reader is refused (no hang).
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    time.sleep(0.2)
    r = runb("convert", sample, "-o", fifo, "--to", "pickle")
    reader.join(30)
    check("convert -o FIFO writes through it", r.returncode == 0 and got == [ref] and stat.S_ISFIFO(os.lstat(fifo).st_mode),
          f"rc={r.returncode} {r.stderr} {len(got[0]) if got else None} vs {len(ref)}")
    r = runb("convert", sample, "-o", fifo, "--to", "pickle", timeout=30)
    check("convert -o FIFO without a reader exits 2", r.returncode == 2 and b"no reader" in r.stderr, r.stderr)
    r = runb("convert", sample, "-o", tmp, "--to", "pickle")
    check("convert -o DIRECTORY exits 2", r.returncode == 2 and b"directory" in r.stderr, r.stderr)
    # `record` removed its output before the run to let the capture create it: a device node, a FIFO or
    # an empty directory given as -o was deleted.
    empty_dir = os.path.join(tmp, "empty-dir")
    os.mkdir(empty_dir)
    for what, path, kind in (("a character device", node, stat.S_ISCHR), ("a FIFO", fifo, stat.S_ISFIFO),
                             ("an empty directory", empty_dir, stat.S_ISDIR)):
        if path is None:
            continue
        r = runb("record", "-o", path, "--", "true")
        check(f"record -o {what} exits 2 and leaves it", r.returncode == 2 and os.path.lexists(path)
              and kind(os.lstat(path).st_mode), f"rc={r.returncode} {r.stderr}")
    # An output that is an input is refused (also through a hard link or a symlink) and the input survives.
    inp = os.path.join(tmp, "in.pickle")
    with open(inp, "wb") as f:
        f.write(sample_bytes)
    os.link(inp, os.path.join(tmp, "hard.pickle"))
    os.symlink("in.pickle", os.path.join(tmp, "sym.pickle"))
    snap_html = os.path.join(tmp, "snap.html")
    with open(snap_html, "wb") as f:
        f.write(sample_bytes)
    for args, cwd in ((["convert", inp, "-o", inp], None), (["convert", "hard.pickle", "-o", "sym.pickle"], tmp),
                      (["convert", inp, "-o", os.path.join(tmp, "sym.pickle"), "--to", "native"], None),
                      (["report", inp, "-o", inp], None), (["report", "snap.html"], tmp)):
        r = runb(*args, cwd=cwd)
        with open(inp, "rb") as a, open(snap_html, "rb") as b:
            intact = a.read() == sample_bytes and b.read() == sample_bytes
        check(f"{' '.join(args)}: the output is the input, refused (exit 2), input intact",
              r.returncode == 2 and b"is the input" in r.stderr and intact, f"rc={r.returncode} {r.stderr}")
    # Standard output opened on the input itself (`1<>in.pickle`): refused before anything is
    # written, whatever the command (issue 30: `report in.pickle -o -` overwrote the input).
    for args in (["report", inp, "-o", "-"], ["analyze", inp], ["convert", inp, "-o", "-", "--to",
                                                                "native"],
                 ["diff", os.path.join(ROOT, "snapshots", "sample_training.pickle"), inp]):
        fd = os.open(inp, os.O_RDWR)
        try:
            r = subprocess.run([BIN, *args], stdout=fd, stderr=subprocess.PIPE)
        finally:
            os.close(fd)
        with open(inp, "rb") as a:
            intact = a.read() == sample_bytes
        check(f"{' '.join(args[:1])} with standard output on the input: refused (exit 2), intact",
              r.returncode == 2 and b"standard output is the input" in r.stderr and intact,
              f"rc={r.returncode} {r.stderr}")
    # What must pass: an unrelated file as standard output, and record, whose words are a command
    # line, not inputs (the recorded command may append to a file it names).
    other = os.path.join(tmp, "other.txt")
    with open(other, "w") as f:
        r = subprocess.run([BIN, "analyze", inp], stdout=f, stderr=subprocess.PIPE)
    check("analyze with standard output on an unrelated file", r.returncode == 0, r.stderr[-200:])
    with open(other, "a") as f:
        # In the temporary folder: record without -o writes memforensics-PID.bin where it runs.
        r = subprocess.run([BIN, "record", "--", "true", other], stdout=f, stderr=subprocess.PIPE,
                           cwd=tmp)
    check("record whose command names its standard output's file is not refused",
          b"standard output is the input" not in r.stderr, r.stderr[-200:])
    # A symlink as output: the file it points at is replaced (permissions kept), the link stays.
    target = os.path.join(tmp, "target.pickle")
    with open(target, "wb") as f:
        f.write(b"old")
    os.chmod(target, 0o640)
    os.symlink("target.pickle", os.path.join(tmp, "link.pickle"))
    r = runb("convert", sample, "-o", os.path.join(tmp, "link.pickle"))
    with open(target, "rb") as f:
        written = f.read()
    check("convert -o SYMLINK replaces its target and keeps the link and the mode",
          r.returncode == 0 and os.path.islink(os.path.join(tmp, "link.pickle")) and written == ref
          and stat.S_IMODE(os.stat(target).st_mode) == 0o640, f"rc={r.returncode} {r.stderr}")
    check("no temporary files left behind (output safety)", not [f for f in os.listdir(tmp) if ".tmp-" in f],
          str(os.listdir(tmp)))

    # Terminal injection: strings from the file (frame names and file names, annotations, settings,
    # keys, compile context) with ESC ]0; BEL, ESC [2J, CR, NUL, a C1 CSI and invalid UTF-8.
    EVIL = "E\x1b]0;pwned\x07\x1b[2J\rX\x00Y\x9bZ" + "QQINVALIDQQ"
    A = 0x7f0000000000
    T0 = 1767225600000000

    def fr(n):
        return [{"name": EVIL + n, "filename": EVIL + "file.py", "line": 7}]
    hostile = {
        "segments": [{"device": 0, "address": A, "total_size": 2097152, "allocated_size": 0, "active_size": 0,
                      "requested_size": 0, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
                      "is_expandable": False, "frames": fr("s"),
                      "blocks": [{"address": A, "size": 2097152, "requested_size": 0, "state": "inactive",
                                  "frames": []}]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": A, "size": 2097152, "stream": 0, "time_us": T0, "frames": fr("a")},
            {"action": "alloc", "addr": A, "size": 1048576, "stream": 0, "time_us": T0 + 10, "frames": fr("b"),
             "compile_context": EVIL, "user_metadata": EVIL},
            {"action": "free_requested", "addr": A, "size": 1048576, "stream": 0, "time_us": T0 + 20, "frames": fr("b")},
            {"action": "free_completed", "addr": A, "size": 1048576, "stream": 0, "time_us": T0 + 20, "frames": fr("b")},
            {"action": "oom", "addr": 0, "size": 1 << 40, "stream": 0, "time_us": T0 + 30, "frames": fr("c")}]],
        "external_annotations": [{"stage": "START", "name": "ProfilerStep#1" + EVIL, "device": 0, "time_us": T0 + 5},
                                 {"stage": "END", "name": "ProfilerStep#1" + EVIL, "device": 0, "time_us": T0 + 25}],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": EVIL, "max_split_size": -1,
                               "garbage_collection_threshold": 0.0, "expandable_segments": False},
        EVIL + "key": 1,
    }
    # Python cannot hold invalid UTF-8 in a str: patch the bytes in (same length, so the pickle's
    # string lengths stay right). Malformed: 0xff 0xfe, 0xc3 '(', truncated 0xe2 0x82, overlong, surrogate.
    blob = pickle.dumps(hostile, protocol=4).replace(b"QQINVALIDQQ", b"\xff\xfe\xc3(\xe2\x82\xc0\xaf\xed\xa0\x80")
    # The file name itself is hostile too.
    evil_path = os.path.join(tmp.encode(), b"e\xff\x1b]0;x\x07\x1b[2J.pickle")
    with open(evil_path, "wb") as f:
        f.write(blob)
    for args in (["analyze"], ["timeline"], ["timeline", "--csv"], ["blocks"], ["blocks", "--at", "oom"], ["dump", "--stacks"]):
        r = runb(*args, evil_path)
        problem = terminal_safe(r.stdout) or terminal_safe(r.stderr)
        check(f"{' '.join(args)}: hostile strings escaped", r.returncode == 0 and not problem,
              f"rc={r.returncode} {problem} {r.stderr[:200]}")
        if args[0] != "blocks" and args[-1] != "--csv":
            # (timeline's phase table cuts names at 36 characters)
            shown = b"E\\x1b]0;pwned\\x07" if args[0] == "timeline" else b"E\\x1b]0;pwned\\x07\\x1b[2J\\x0dX\\x00Y\\xc2\\x9bZ\\xff\\xfe"
            check(f"{' '.join(args)}: escapes shown as \\xNN", shown in r.stdout, r.stdout[:300])
    for args in (["analyze", "--json"], ["timeline", "--json"], ["blocks", "--json"]):
        r = runb(*args, evil_path)
        try:
            doc = json.loads(r.stdout.decode("utf-8"))
            ok = r.returncode == 0 and doc["path"].startswith(tmp)
        except (ValueError, KeyError) as e:
            ok, doc = False, e
        check(f"{' '.join(args)}: valid JSON despite invalid UTF-8 in the file and its name", ok,
              f"rc={r.returncode} {doc} {r.stderr[:200]}")
    r = runb("analyze", os.path.join(tmp.encode(), b"missing\x1b[2J\xff.pickle"))
    check("error messages escape the file name", r.returncode == 2 and not terminal_safe(r.stderr)
          and b"missing\\x1b[2J\\xff" in r.stderr, r.stderr)
    r = runb("report", evil_path, "-o", os.path.join(tmp, "evil.html"))
    check("report on hostile strings: stderr escaped", r.returncode == 0 and not terminal_safe(r.stderr), r.stderr[:300])

    # Out of memory anywhere is exit 2 with a message, never an abort: an ordinary 200,000-event
    # file read under a 48 MiB address-space limit (it needs about 100 MB).
    limit = 48 << 20

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    probe = runb("--version", preexec_fn=cap)
    if probe.returncode != 0:
        print("note: the executable does not start under a 48 MiB address-space limit (sanitizer build?): "
              "out-of-memory check skipped")
    else:
        big = os.path.join(tmp, "big.pickle")
        frames = [{"name": "f", "filename": "x.py", "line": 1}]
        trace = [{"action": "segment_alloc", "addr": A, "size": 1 << 30, "stream": 0, "frames": frames}]
        for i in range(200000):
            trace.append({"action": "alloc", "addr": A + 512 * (i % 1000), "size": 512, "stream": 0,
                          "frames": [{"name": "f%d" % i, "filename": "x.py", "line": i}]})
            trace.append({"action": "free_completed", "addr": A + 512 * (i % 1000), "size": 512, "stream": 0,
                          "frames": frames})
        with open(big, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [trace]}, f, protocol=4)
        del trace
        for args in (["analyze"], ["convert", "-o", os.path.join(tmp, "big.bin"), "--in"]):
            argv = [args[0], big] + [a for a in args[1:] if a != "--in"]
            r = runb(*argv, preexec_fn=cap)
            err = r.stderr.decode(errors="replace")
            check(f"{args[0]} out of memory: exit 2 with a message", r.returncode == 2 and "out of memory while" in err,
                  f"rc={r.returncode} {err[-300:]}")

# OOM first (issue 13): on a two-device file whose OOM is on cuda:1, every command opens on cuda:1
# and says why; analyze's first lines are the headline. A file whose history cannot explain its
# state (a ring buffer of one entry) does not say "OOMs: none".
with tempfile.TemporaryDirectory() as tmp:
    A0, A1, MiB, T0 = 0x7f0000000000, 0x7e0000000000, 1 << 20, 1767225600000000
    layer = [{"name": "forward", "filename": "/home/u/models.py", "line": 174}]

    def seg(dev, addr):
        return {"device": dev, "address": addr, "total_size": 64 * MiB, "allocated_size": 0, "active_size": 0,
                "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                "is_expandable": False, "frames": [],
                "blocks": [{"address": addr, "size": 64 * MiB, "requested_size": 0, "state": "inactive",
                            "frames": []}]}

    def trace(addr, t, oom):
        ev = [{"action": "segment_alloc", "addr": addr, "size": 64 * MiB, "stream": 0, "time_us": t, "frames": layer},
              {"action": "alloc", "addr": addr, "size": 48 * MiB, "stream": 0, "time_us": t + 1, "frames": layer}]
        if oom:
            ev.append({"action": "oom", "addr": MiB, "size": 256 * MiB, "stream": 0, "time_us": t + 2, "frames": layer})
        ev += [{"action": "free_requested", "addr": addr, "size": 48 * MiB, "stream": 0, "time_us": t + 3, "frames": layer},
               {"action": "free_completed", "addr": addr, "size": 48 * MiB, "stream": 0, "time_us": t + 3, "frames": layer}]
        return ev
    two = os.path.join(tmp, "two_devices_oom_on_1.pickle")
    with open(two, "wb") as f:
        pickle.dump({"segments": [seg(0, A0), seg(1, A1)],
                     "device_traces": [trace(A0, T0, False), trace(A1, T0 + 10, True)]}, f, protocol=4)
    r = run("blocks", two, "--at", "oom")
    check("blocks --at oom without --device on a multi-device file: exit 0 on the OOM device",
          r.returncode == 0 and "device 1 at oom" in r.stdout
          and "showing cuda:1 (the OOM is on cuda:1; --device N for another)" in r.stdout,
          f"rc={r.returncode} {r.stderr} {r.stdout[:300]}")
    r = run("blocks", two, "--at", "oom", "--json")
    check("blocks --at oom --json defaults to the OOM device",
          r.returncode == 0 and json.loads(r.stdout)["device"] == 1, f"rc={r.returncode} {r.stderr}")
    r = run("blocks", two, "--device", "0")
    check("blocks --device 0 still shows cuda:0, without the focus note",
          r.returncode == 0 and "device 0 at peak" in r.stdout and "showing" not in r.stdout, r.stdout[:300])
    r = run("analyze", two, "--width", "0")  # one line per item: the structure, not the layout
    lines = r.stdout.split("\n")
    check("analyze opens with the headline (focus device, then the OOM line)",
          r.returncode == 0 and len(lines) > 3
          and lines[1] == "  headline: cuda:1 first (the OOM is on cuda:1)"
          and lines[2].startswith("    cuda:1 [high]") and "models.py:174 forward" in lines[2],
          "\n".join(lines[:4]))
    check("analyze lists the focus device first",
          r.stdout.find("\ndevice 1:") < r.stdout.find("\ndevice 0:"), r.stdout[:200])
    r = run("analyze", "--json", two)
    doc = json.loads(r.stdout)
    h = doc.get("headline", {})
    check("analyze --json headline and job_findings",
          h.get("focus_device") == 1 and h.get("focus_reason") == "the OOM is on cuda:1"
          and h["items"][0]["kind"] == "oom_verdict" and h["items"][0]["device"] == 1
          and doc.get("job_findings") == [], str(h)[:300])
    r = run("timeline", two)
    check("timeline text shows the OOM device first and says so",
          r.returncode == 0 and "showing cuda:1 first (the OOM is on cuda:1" in r.stdout
          and r.stdout.find("\ndevice 1:") < r.stdout.find("\ndevice 0:"), r.stdout[:300])
    dp = os.path.join(ROOT, "snapshots", "scenarios", "dp_imbalance_oom.pickle")
    if os.path.exists(dp):
        r = run("blocks", dp, "--at", "oom")
        check("blocks --at oom on the 4-GPU DataParallel OOM (corpus): exit 0 on cuda:1",
              r.returncode == 0 and "device 1 at oom" in r.stdout, f"rc={r.returncode} {r.stderr}")
        lines = run("analyze", dp, "--width", "0").stdout.split("\n")
        check("analyze on the 4-GPU OOM: headline on cuda:1, the OOM verdict first, then the imbalance",
              lines[1] == "  headline: cuda:1 first (the OOM is on cuda:1)"
              and lines[2].startswith("    cuda:1 [high]") and "device imbalance" in lines[3],
              "\n".join(lines[:4]))
        # Issue 28 item 9: 100 columns when the terminal's width is unknown (a pipe here), lines
        # broken only at spaces (a word longer than the room stays whole), the project's
        # directory said once.
        wide = run("analyze", dp)
        env = dict(os.environ, COLUMNS="60")
        narrow = subprocess.run([BIN, "analyze", dp], capture_output=True, text=True, env=env)
        unwrapped = run("analyze", dp, "--width", "0")
        def fits(text, width):
            return all(len(l) <= width or " " not in l.strip() or
                       len(max(l.split(), key=len)) > width // 2 for l in text.split("\n"))
        check("analyze wraps to 100 columns on a pipe, to COLUMNS when set, not with --width 0",
              wide.returncode == 0 and fits(wide.stdout, 100) and narrow.returncode == 0
              and fits(narrow.stdout, 60) and max(map(len, unwrapped.stdout.split("\n"))) > 100
              and " ".join(wide.stdout.split()) == " ".join(unwrapped.stdout.split()),
              "\n".join(l for l in wide.stdout.split("\n") if len(l) > 100)[:600])
        check("analyze names the project's directory once and shows its files without it",
              "paths: frames' files under /home/user/graphqa/ are shown without it" in wide.stdout
              and wide.stdout.count("/home/user/graphqa/") == 1, wide.stdout[:400])
    ring = os.path.join(REAL, "yiyi-philosophy__llm-inference__1.3b_snapshot.pickle")
    if os.path.exists(ring):
        r = run("analyze", ring)
        check("a ring buffer of one entry does not claim 'OOMs: none'",
              r.returncode == 0 and "OOMs: none" not in r.stdout
              and "the history cannot explain an OOM" in r.stdout
              and "incomplete" not in r.stdout.split("\n")[1], r.stdout[:400])

# Numbers out of range are usage errors (CLI11 saturated --device 2^64 to INT64_MAX silently).
for args in (["analyze", sample, "--device", "18446744073709551616"], ["analyze", sample, "--device", "9223372036854775808"],
             ["analyze", sample, "--device", "-9223372036854775809"], ["timeline", sample, "--device", "18446744073709551616"],
             ["blocks", sample, "--device", "18446744073709551616"], ["report", sample, "--device", "18446744073709551616", "-o", "-"],
             ["convert", sample, "-o", "-", "--to", "collapsed", "--device", "18446744073709551616"],
             ["blocks", sample, "--at", "9223372036854775808"], ["blocks", sample, "--at", "t99999999999999999999"],
             ["analyze", sample, "--top", "18446744073709551616"], ["convert", sample, "-o", "-", "--zstd-level", "4294967299"],
             ["convert", sample, "-o", "-", "--checkpoint-every", "18446744073709551617"],
             ["timeline", sample, "--max-points", "18446744073709551617"]):
    r = runb(*args)
    check(f"{args[0]} {' '.join(args[2:])}: out of range, exit 1", r.returncode == 1 and not r.stdout, f"rc={r.returncode}")

# A file-size limit (ulimit -f) is a write error (exit 2, the reason), not SIGXFSZ, and leaves no
# temporary file behind (issue 30).
def small_fsize():
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))


with tempfile.TemporaryDirectory() as tmp:
    for args in (["convert", sample, "-o", os.path.join(tmp, "out.pickle")],
                 ["convert", sample, "-o", os.path.join(tmp, "out.bin")],
                 ["report", sample, "-o", os.path.join(tmp, "out.html")]):
        r = runb(*args, preexec_fn=small_fsize)
        left = sorted(os.listdir(tmp))
        check(f"{args[0]} {os.path.basename(args[-1])} past ulimit -f: exit 2, nothing left",
              r.returncode == 2 and b"error" in r.stderr and not left,
              f"rc={r.returncode} left={left} {r.stderr[-200:]}")

# convert --device to a format that keeps every device is refused, not ignored (issue 30).
for to in ("native", "pickle"):
    r = runb("convert", sample, "-o", "-", "--to", to, "--device", "0")
    check(f"convert --to {to} --device: usage error", r.returncode == 1 and not r.stdout
          and b"--device applies to perfetto and collapsed" in r.stderr, f"rc={r.returncode}")
# A device the file lacks is bad usage (exit 1), as every other command says it (it was exit 2).
for to in ("collapsed", "perfetto"):
    r = runb("convert", sample, "-o", "-", "--to", to, "--device", "7")
    check(f"convert --to {to} --device 7: usage error", r.returncode == 1 and not r.stdout
          and b"has no device 7" in r.stderr, f"rc={r.returncode} {r.stderr[-200:]}")

# An option of one output kind given for another is refused, not ignored (it was accepted and
# ignored: `--zstd-level 19 --to pickle` wrote the same pickle as without it).
for to, opt in (("pickle", ["--zstd-level", "19"]), ("perfetto", ["--checkpoint-every", "0"]),
                ("native", ["--value", "allocated"]), ("perfetto", ["--user-frames"])):
    r = runb("convert", sample, "-o", "-", "--to", to, *opt)
    check(f"convert --to {to} {opt[0]}: usage error", r.returncode == 1 and not r.stdout
          and (opt[0] + " applies to").encode() in r.stderr, f"rc={r.returncode} {r.stderr[-200:]}")
for to, opt in (("native", ["--zstd-level", "0"]), ("collapsed", ["--value", "allocated", "--user-frames"])):
    r = runb("convert", sample, "-o", "-", "--to", to, *opt)
    check(f"convert --to {to} {opt[0]}: accepted", r.returncode == 0 and r.stdout, f"rc={r.returncode} {r.stderr[-200:]}")

# Every command that analyses devices on threads (--threads / MEMF_THREADS) prints the same bytes
# on 1, 2, 3 and 4 threads: a dropped or reordered device, or a figure of another device, differs.
def threads_env(n):
    env = dict(os.environ)
    env["MEMF_THREADS"] = str(n)
    return env


def same_on_threads(name, args):
    outs = []
    for n in (1, 2, 3, 4):
        r = subprocess.run([BIN, *args], capture_output=True, env=threads_env(n))
        err = r.stderr.decode(errors="replace")
        # report's own line says how long it took
        err = "\n".join(l for l in err.split("\n") if not l.startswith("memforensics: wrote "))
        # the page's script nonce is random on every run
        out = re.sub(rb'nonce(-|=")[0-9a-f]+', rb"nonce\1X", r.stdout)
        outs.append((r.returncode, out, err))
    check(f"{name}: the same output on 1-4 threads", all(o == outs[0] for o in outs) and outs[0][1],
          f"rc={[o[0] for o in outs]} sizes={[len(o[1]) for o in outs]}")
    return outs[0]


scen_dir = os.path.join(ROOT, "snapshots", "scenarios")
dp4 = os.path.join(scen_dir, "dp_imbalance_oom.pickle")
frag = os.path.join(scen_dir, "fragmentation_oom.pickle")
if os.path.exists(dp4) and os.path.exists(frag):
    for cmd in (["timeline", dp4], ["timeline", "--json", dp4], ["timeline", "--csv", dp4],
                ["analyze", "--json", dp4], ["diff", frag, dp4], ["diff", "--json", dp4, frag],
                ["check", "--fail-on", "warning", "--baseline", frag, "--max-increase", "1", dp4, frag],
                ["report", dp4, "-o", "-"], ["report", dp4, "--baseline", frag, "-o", "-"],
                ["report", dp4, "--device", "1", "--baseline", dp4, "-o", "-"]):
        rc, out, _ = same_on_threads(" ".join(a if a not in (dp4, frag) else os.path.basename(a)
                                             for a in cmd), cmd)
    # ranks of one file: its devices on the --jobs threads; the rows are the same for any count.
    rows = [subprocess.run([BIN, "ranks", "--json", "-j", str(j), dp4], capture_output=True).stdout
            for j in (1, 2, 3, 4)]
    check("ranks --json of one 4-device file: the same rows on 1-4 jobs",
          all(r == rows[0] for r in rows) and rows[0], str([len(r) for r in rows]))
    # The 4-device JSON lists every device once, in order, on any thread count.
    for n in (1, 3):
        doc = json.loads(subprocess.run([BIN, "timeline", "--json", dp4], capture_output=True,
                                        env=threads_env(n)).stdout)
        check(f"timeline --json on {n} threads: devices 0-3 in order",
              [d["device"] for d in doc["devices"]] == [0, 1, 2, 3], str(doc.get("devices", "")[:1]))

print(f"cli_test: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
