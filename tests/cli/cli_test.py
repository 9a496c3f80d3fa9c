#!/usr/bin/env python3
"""End-to-end tests of the memforensics executable.

Usage: cli_test.py MEMFORENSICS_BINARY REPO_ROOT REAL_SNAPSHOTS_DIR

* golden output: `analyze` (text and JSON) and `dump` on every sample in snapshots/ compared byte
  for byte with tests/golden/expected/ (MEMF_UPDATE_GOLDEN=1 rewrites them);
* the sample pickle is what tools/snapshot_fixture.py makes from its .fixture (no stale sample);
* exit codes: 0 ok, 1 bad usage, 2 unreadable or hostile input, with a message naming the problem;
* `analyze --json` peaks equal tools/ref_replay.py's independent replay on every real snapshot.
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

print(f"cli_test: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
