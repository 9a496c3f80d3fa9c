#!/usr/bin/env python3
"""End-to-end tests of `memforensics record` (no GPU needed).

Usage: record_test.py MEMFORENSICS_BINARY REPO_ROOT [--cupti-lib LIB] [--inject-sim SIM FAKE_LIBCUPTI]
                      [--no-cuda-deps BINARY...]

* `record -- /bin/true`: a valid empty native trace that `analyze`/`dump` read, and a note that no
  GPU activity was seen; the command's exit status and signals are passed on;
* a command that cannot be run: exit 127 and a clear error; an uncreatable output: exit 2;
* the environment the command gets (CUDA_INJECTION64_PATH, MEMFORENSICS_CUPTI_OUT absolute,
  MEMFORENSICS_CUPTI_STACKS=0 with --no-stacks), with MEMFORENSICS_CUPTI_LIB standing in for the library
  on machines where it is not built; a trace the command itself writes is summarized;
* --cupti-lib: the injection library exports InitializeInjection and does not link libcuda;
* --inject-sim SIM FAKE_LIBCUPTI: the injection library end to end with a stand-in libcupti
  (cupti_inject_sim.cc plays the driver): the trace holds the simulated allocations with their
  stacks, a killed process leaves a readable trace, a busy CUPTI leaves an empty one;
* --no-cuda-deps: these binaries (the tests) link neither libcuda nor libcupti.
Prints "N passed, N failed" and exits non-zero on any failure.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time


def child_running(ppid, comm):
    """Whether a child of process `ppid` named `comm` exists (Linux /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.find("(") + 1:stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == ppid and name == comm:
            return True
    return False


BIN, ROOT = os.path.abspath(sys.argv[1]), sys.argv[2]
rest = sys.argv[3:]
CUPTI_LIB = None
SIM = None
NO_CUDA_DEPS = []
while rest:
    if rest[0] == "--cupti-lib":
        CUPTI_LIB = os.path.abspath(rest[1])
        rest = rest[2:]
    elif rest[0] == "--inject-sim":
        SIM = (os.path.abspath(rest[1]), os.path.abspath(rest[2]))
        rest = rest[3:]
    elif rest[0] == "--no-cuda-deps":
        NO_CUDA_DEPS = rest[1:]
        rest = []
    else:
        sys.exit(f"unknown argument {rest[0]}")

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}: {detail}")


def run(*args, cwd=None, env=None, timeout=60):
    e = dict(os.environ)
    e.pop("CUDA_INJECTION64_PATH", None)
    if env:
        e.update(env)
    return subprocess.run([BIN, *args], capture_output=True, text=True, cwd=cwd, env=e, timeout=timeout)


with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "run.bin")

    # A command that never initialises CUDA: empty trace + note.
    r = run("record", "-o", out, "--", "/bin/true")
    check("record /bin/true exits 0", r.returncode == 0, r.stderr)
    check("record /bin/true says no GPU activity was seen or nothing was recorded",
          "no GPU activity was seen" in r.stderr or "nothing was recorded" in r.stderr, r.stderr)
    check("record /bin/true writes a file", os.path.exists(out) and os.path.getsize(out) > 0)
    a = run("analyze", "--json", out)
    check("analyze reads the empty trace", a.returncode == 0, a.stderr)
    if a.returncode == 0:
        doc = json.loads(a.stdout.splitlines()[0])
        check("empty trace has no devices", doc.get("devices") == [], a.stdout[:300])
    check("analyze text on the empty trace", run("analyze", out).returncode == 0)
    d = run("dump", out)
    check("dump reads the empty trace", d.returncode == 0, d.stderr)
    check("no warning about a cut-off file", "warning" not in a.stderr, a.stderr)

    # A stale file under the output name is replaced.
    with open(out, "wb") as f:
        f.write(b"garbage")
    r = run("record", "-o", out, "--", "/bin/true")
    check("stale output replaced", r.returncode == 0 and run("analyze", out).returncode == 0, r.stderr)

    # Exit status and arguments are passed through.
    r = run("record", "-o", out, "--", "/bin/sh", "-c", "echo hi \"$1\"; exit 3", "sh", "--no-stacks")
    check("exit status passed on", r.returncode == 3, f"rc={r.returncode} {r.stderr}")
    check("arguments after -- reach the command", r.stdout == "hi --no-stacks\n", r.stdout)
    r = run("record", "-o", out, "--", "/bin/sh", "-c", "kill -TERM $$")
    check("killed command: 128 + signal", r.returncode == 128 + signal.SIGTERM, f"rc={r.returncode} {r.stderr}")
    check("killed command is reported", "signal" in r.stderr, r.stderr)

    # Commands that cannot run.
    missing = os.path.join(tmp, "run-missing.bin")
    r = run("record", "-o", missing, "--", "/nonexistent/command", "x")
    check("missing command exits 127", r.returncode == 127, f"rc={r.returncode}")
    check("missing command: clear error", "cannot run '/nonexistent/command'" in r.stderr, r.stderr)
    check("missing command: no trace left", not os.path.exists(missing))
    r = run("record", "-o", missing, "--", "no-such-command-memforensics")
    check("command not on PATH exits 127", r.returncode == 127 and "not found" in r.stderr, r.stderr)
    noexec = os.path.join(tmp, "noexec.sh")
    with open(noexec, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(noexec, 0o644)
    r = run("record", "-o", missing, "--", noexec)
    check("non-executable command exits 126", r.returncode == 126, f"rc={r.returncode} {r.stderr}")
    r = run("record", "-o", os.path.join(tmp, "no", "such", "dir.bin"), "--", "/bin/true")
    check("uncreatable output exits 2 before running", r.returncode == 2 and "cannot create" in r.stderr, r.stderr)
    r = run("record", "-o", out)
    check("no command: usage error", r.returncode == 1, f"rc={r.returncode}")

    # Default output name: memforensics-<pid>.bin in the working directory.
    sub = os.path.join(tmp, "default")
    os.mkdir(sub)
    r = run("record", "--", "/bin/true", cwd=sub)
    names = os.listdir(sub)
    check("default output name", r.returncode == 0 and len(names) == 1 and names[0].startswith("memforensics-")
          and names[0].endswith(".bin"), f"{names} {r.stderr}")

    # The environment the command sees (a stand-in library where the real one is not built).
    env = {"MEMFORENSICS_CUPTI_LIB": "/bin/true"}
    show = "echo \"$CUDA_INJECTION64_PATH|$MEMFORENSICS_CUPTI_OUT|${MEMFORENSICS_CUPTI_STACKS-unset}\""
    r = run("record", "-o", "rel.bin", "--", "/bin/sh", "-c", show, cwd=tmp, env=env)
    parts = r.stdout.strip().split("|")
    check("CUDA_INJECTION64_PATH set", len(parts) == 3 and parts[0] == "/bin/true", r.stdout + r.stderr)
    check("MEMFORENSICS_CUPTI_OUT absolute", len(parts) == 3 and parts[1] == os.path.join(os.path.realpath(tmp), "rel.bin")
          or parts[1] == os.path.join(tmp, "rel.bin"), r.stdout)
    check("stacks on by default", len(parts) == 3 and parts[2] == "unset", r.stdout)
    check("stand-in library: note that no GPU activity was seen", "no GPU activity was seen" in r.stderr, r.stderr)
    r = run("record", "--no-stacks", "-o", "rel.bin", "--", "/bin/sh", "-c", show, cwd=tmp, env=env)
    check("--no-stacks sets MEMFORENSICS_CUPTI_STACKS=0", r.stdout.strip().endswith("|0"), r.stdout)
    r = run("record", "-o", out, "--", "/bin/sh", "-c", "echo $CUDA_INJECTION64_PATH", env={"CUDA_INJECTION64_PATH": "/x.so", **env})
    check("an existing CUDA_INJECTION64_PATH is replaced with a warning",
          r.stdout.strip() == "/bin/true" and "CUDA_INJECTION64_PATH was set" in r.stderr, r.stdout + r.stderr)

    # A trace written by the command (as the injection library would) is summarized.
    sample = os.path.join(ROOT, "snapshots", "sample_training.pickle")
    r = run("record", "-o", out, "--", BIN, "convert", sample, "-o", out, env={"MEMFORENSICS_CUPTI_LIB": "/bin/true"})
    check("recorded trace summarized", r.returncode == 0 and "events on 1 device(s), peak reserved" in r.stderr,
          r.stderr)
    # A second process of the run writes <stem>.<pid>.bin: listed and summarized.
    r = run("record", "-o", out, "--", "/bin/sh", "-c",
            f"'{BIN}' convert '{sample}' -o \"$MEMFORENSICS_CUPTI_OUT\" && "
            f"'{BIN}' convert '{sample}' -o \"{os.path.join(tmp, 'run.4242.bin')}\"", env=env)
    check("other processes' traces listed", r.returncode == 0 and "run.4242.bin" in r.stderr, r.stderr)

    # Signals sent to record reach the command.
    p = subprocess.Popen([BIN, "record", "-o", out, "--", "sleep", "30"], stderr=subprocess.PIPE, text=True)
    # record installs its forwarding handlers before it forks: once its child runs `sleep`, a
    # signal reaches the handler. A fixed pause raced record's start-up under sanitizers and load.
    deadline = time.time() + 60
    while time.time() < deadline and not child_running(p.pid, "sleep"):
        time.sleep(0.05)
    start = time.time()
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    check("SIGTERM forwarded to the command", p.returncode == 128 + signal.SIGTERM and time.time() - start < 5,
          f"rc={p.returncode}")
    check("trace still written after SIGTERM", run("analyze", out).returncode == 0)


def ldd(path):
    r = subprocess.run(["ldd", path], capture_output=True, text=True)
    return r.stdout


for b in NO_CUDA_DEPS:
    deps = ldd(b)
    check(f"{os.path.basename(b)} links no CUDA driver or CUPTI",
          "libcuda.so" not in deps and "libcupti" not in deps and deps != "", deps)

if CUPTI_LIB:
    r = subprocess.run(["nm", "-D", "--defined-only", CUPTI_LIB], capture_output=True, text=True)
    syms = [l.split()[-1] for l in r.stdout.splitlines() if l.strip()]
    check("injection library exports InitializeInjection", "InitializeInjection" in syms, r.stdout[-500:])
    check("injection library exports little else", len([s for s in syms if not s.startswith("_")]) <= 3,
          str(syms[:20]))
    deps = ldd(CUPTI_LIB)
    check("injection library links libcupti", "libcupti" in deps, deps)
    check("injection library does not link libcuda (the driver loads it)", "libcuda.so" not in deps, deps)

if SIM and CUPTI_LIB:
    sim, fake = SIM
    with tempfile.TemporaryDirectory() as tmp:
        def simulate(mode, out, extra_env=None):
            env = dict(os.environ, MEMFORENSICS_CUPTI_OUT=out)
            env.update(extra_env or {})
            return subprocess.run([sim, fake, CUPTI_LIB, mode], capture_output=True, text=True, env=env, timeout=60)

        def analyze(path):
            r = run("analyze", "--json", path)
            doc = json.loads(r.stdout.splitlines()[0]) if r.returncode == 0 and r.stdout else {}
            return r, doc

        def devices(doc):
            return {d["device"]: d for d in doc.get("devices", [])}

        out = os.path.join(tmp, "sim.bin")
        r = simulate("normal", out)
        check("simulated CUDA process: injection initialised", r.returncode == 0 and "InitializeInjection=1" in r.stdout,
              r.stdout + r.stderr)
        check("simulated: start and summary lines", "recording CUDA device memory of pid" in r.stderr
              and "3 device allocations and 1 frees on 2 device(s)" in r.stderr
              and "1 host/managed memory records not traced" in r.stderr, r.stderr)
        a, doc = analyze(out)
        check("simulated trace reads without warnings", a.returncode == 0 and "warning" not in a.stderr, a.stderr)
        devs = devices(doc)
        check("simulated: devices 0 and 1", sorted(devs) == [0, 1], str(sorted(devs)))
        d0, d1 = devs.get(0, {}), devs.get(1, {})
        check("simulated: device 0 peak reserved = 1 MiB + 3 KiB (3000 bytes rounded to 512)",
              d0.get("peak_reserved_bytes") == (1 << 20) + 3072 and d0.get("final_reserved_bytes") == 3072, str(d0)[:800])
        check("simulated: device 0 peak requested", d0.get("peak_requested_bytes") == (1 << 20) + 3000, str(d0)[:800])
        check("simulated: device 1 holds the 2 MiB mapping at the end", d1.get("final_reserved_bytes") == 2 << 20,
              str(d1)[:800])
        dump = run("dump", "--stacks", out)
        check("dump --stacks of the simulated trace", dump.returncode == 0, dump.stderr)
        text = dump.stdout
        check("cudaMalloc's record (nested driver correlation id) has the caller's stack",
              "simUserMalloc" in text, text[:2000])
        check("stream-ordered allocation's stack", "simUserMallocAsync" in text, text[:2000])
        check("cudaFree's stack", "simUserFree" in text, text[:2000])
        check("cuMemMap traced from its callback, with its stack", "simUserMap" in text, text[:2000])
        check("capture frames dropped (no libmemforensics_cupti frame)", "libmemforensics_cupti" not in text
              and "libcupti" not in text, text[:2000])
        lines = [l for l in text.splitlines() if "segment_map" in l or "segment_alloc" in l]
        check("one segment_alloc per device allocation, one segment_map (the duplicate record ignored)",
              sum("segment_alloc" in l for l in lines) == 2 and sum("segment_map" in l for l in lines) == 1,
              "\n".join(lines))
        check("the failed cuMemMap left nothing", "0x7d0000400000" not in text.lower() and "139637976989696" not in text)
        check("no error anomaly", all(a.get("severity") != "error" for d in devs.values()
                                      for a in d.get("anomalies", [])), json.dumps(doc)[:1500])
        t = run("analyze", out)
        check("analyze text of the simulated trace", t.returncode == 0 and "device 0" in t.stdout and "device 1" in t.stdout,
              t.stdout[:1500] + t.stderr)

        # Killed after the buffer was delivered: no trailer, but the events are in the file.
        out2 = os.path.join(tmp, "killed.bin")
        r = simulate("killed", out2)
        a, doc = analyze(out2)
        check("killed process: trace readable with a warning", a.returncode == 0 and "warning" in a.stderr, a.stderr)
        check("killed process: its events survived", sorted(devices(doc)) == [0, 1], a.stdout[:500])

        # The output exists already (a second process of the run): <stem>.<pid>.bin instead.
        r = simulate("normal", out)
        others = [n for n in os.listdir(tmp) if n.startswith("sim.") and n != "sim.bin"]
        check("second process writes <stem>.<pid>.bin", len(others) == 1 and others[0].endswith(".bin"), str(others))

        # Another CUPTI client holds the process: a clear message and a valid empty trace.
        out3 = os.path.join(tmp, "busy.bin")
        r = simulate("busy", out3, {"FAKE_CUPTI_BUSY": "1"})
        check("busy CUPTI: InitializeInjection fails cleanly", r.returncode == 0 and "InitializeInjection=0" in r.stdout,
              r.stdout + r.stderr)
        check("busy CUPTI: message names the other client", "another CUPTI client" in r.stderr, r.stderr)
        a, doc = analyze(out3)
        check("busy CUPTI: empty valid trace", a.returncode == 0 and doc.get("devices") == [] and "warning" not in a.stderr,
              a.stderr)

        # A different CUPTI major version: refused, nothing written.
        out4 = os.path.join(tmp, "old.bin")
        r = simulate("busy", out4, {"FAKE_CUPTI_VERSION": "120000"})
        check("other CUPTI major version refused", "InitializeInjection=0" in r.stdout and "CUPTI API version" in r.stderr
              and not os.path.exists(out4), r.stderr)

        # `record` around it: the library found, the environment set, the summary printed.
        out5 = os.path.join(tmp, "recorded.bin")
        r = run("record", "-o", out5, "--", sim, fake, "env", "normal", env={"MEMFORENSICS_CUPTI_LIB": CUPTI_LIB})
        check("record with the injection library: summary", r.returncode == 0
              and "recorded.bin: 9 events on 2 device(s), peak reserved device 0 1.00 MiB (1051648 B), device 1 2.00 MiB (2097152 B)" in r.stderr,
              r.stderr)
        r = run("record", "--no-stacks", "-o", out5, "--", sim, fake, "env", "normal",
                env={"MEMFORENSICS_CUPTI_LIB": CUPTI_LIB})
        d = run("dump", "--stacks", out5)
        check("record --no-stacks: no stacks captured", r.returncode == 0 and "simUser" not in d.stdout
              and "stack=" in d.stdout, d.stdout[:1000])

        # MEMFORENSICS_QUIET: nothing on stderr.
        r = simulate("normal", os.path.join(tmp, "quiet.bin"), {"MEMFORENSICS_QUIET": "1"})
        check("MEMFORENSICS_QUIET silences the library", r.returncode == 0 and "memforensics" not in r.stderr, r.stderr)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
