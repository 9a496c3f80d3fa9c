#!/usr/bin/env python3
"""Every command on torch.profiler inputs, through the built executable (ctest profiler_cli).

    profiler_cli_test.py MEMFORENSICS SOURCE_DIR [REAL_TRACES_DIR]

On the fabricated traces of tools/make_profiler_traces.py and the real ones (when present):
analyze / timeline / report work and give the expected peaks; blocks exits 1 with "not available
for profiler traces: no segment information"; convert writes a native trace that reads back the
same and a pickle that Python's unpickler loads with the shape memory_viz reads; hostile inputs
(cut gzip, bomb, NaN, deep JSON) exit 2 with a clear message.
"""
import json
import os
import pickle
import subprocess
import sys
import tempfile

exe, src = sys.argv[1], sys.argv[2]
real = sys.argv[3] if len(sys.argv) > 3 else os.path.join(src, "..", "shared", "traces-real")
failures = []


def run(*args):
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def analyze(path):
    rc, out, err = run("analyze", "--json", path)
    assert rc == 0, (path, rc, err[-500:])
    return json.loads(out.splitlines()[0])


with tempfile.TemporaryDirectory() as tmp:
    fab = os.path.join(tmp, "fab")
    subprocess.run([sys.executable, os.path.join(src, "tools", "make_profiler_traces.py"), fab],
                   check=True)
    f = lambda n: os.path.join(fab, n)

    # Peaks of the fabricated traces (the numbers tools/make_profiler_traces.py builds in).
    expected = {
        "step.json": {0: (6 << 20, 6 << 20)},
        "step.json.gz": {0: (6 << 20, 6 << 20)},
        "devices.json": {0: (1536, 2 << 20), 2: (12288, 2 << 20)},
        "frees_without_allocs.json": {0: (4 << 20, 8 << 20)},
        "old_format_2021.json": {0: (6000, 6144)},
        "timeline.raw.json.gz": {0: (16896, 16896)},
        "timeline.json": {0: (1000, 1536)},
    }
    for name, devs in expected.items():
        d = analyze(f(name))
        got = {v["device"]: (v["peak_requested_bytes"], v["peak_reserved_bytes"]) for v in d["devices"]}
        check(got == devs, "%s peaks %s (expected %s)" % (name, got, devs))
    d = analyze(f("old_format_2021.json"))
    check(any("running sum of Bytes" in w for w in d["input"]["warnings"]),
          "old format: the output says the matching is skipped")
    d = analyze(f("step.json"))
    top = d["devices"][0]["top_allocations_at_requested_peak"]
    first = [fr["name"] for fr in top[0]["frames"]]
    second = [(fr["filename"], fr["line"]) for fr in top[1]["frames"]]
    # The largest block at the peak was allocated by aten::mm on the autograd thread (ops only);
    # the next two by the forward, where the Python frames of the same thread name the lines.
    check(first == ["aten::mm", "autograd::engine::evaluate_function: AddmmBackward0"],
          "step.json: the largest group at the peak is named by its ops (%s)" % first)
    check(second == [("model.py", 8), ("train.py", 20)],
          "step.json: the next group is named by its Python frames (%s)" % second)

    # From a pipe (not a regular file: read into memory, sniffed as gzip).
    with open(f("step.json.gz"), "rb") as fh:
        p = subprocess.run([exe, "analyze", "--json", "/dev/stdin"], stdin=fh, capture_output=True,
                           text=True, timeout=60)
    check(p.returncode == 0 and
          json.loads(p.stdout.splitlines()[0])["devices"][0]["peak_requested_bytes"] == 6 << 20,
          "step.json.gz from a pipe: same peak (exit %d)" % p.returncode)

    # Hostile inputs: exit 2 with the reason.
    for name, part in [("hostile_cut.json.gz", "gzip stream truncated"),
                       ("hostile_bomb.json.gz", "decompression bomb"),
                       ("hostile_nan_ts.json", "invalid JSON"),
                       ("hostile_deep_json.json", "nested more than")]:
        rc, out, err = run("analyze", f(name))
        check(rc == 2 and part in err, "%s: exit %d, %r in the message" % (name, rc, part))
    for name in ["hostile_values.json", "hostile_deep_ops.json"]:
        rc, out, err = run("analyze", f(name))
        check(rc == 0, "%s: analyzed (exit %d)" % (name, rc))

    inputs = [f("step.json.gz"), f("timeline.raw.json.gz")]
    for n in ["hta__df_index_resolver.pt.trace.json.gz", "hta__memory_timeline.raw.json.gz"]:
        if os.path.exists(os.path.join(real, n)):
            inputs.append(os.path.join(real, n))
    for path in inputs:
        base = os.path.basename(path)
        rc, out, err = run("blocks", path)
        check(rc == 1 and "not available for profiler traces: no segment information" in err,
              "%s: blocks exits 1 with the reason (exit %d)" % (base, rc))
        rc, out, err = run("timeline", "--json", path)
        check(rc == 0 and json.loads(out.splitlines()[0])["devices"], "%s: timeline --json" % base)
        html = os.path.join(tmp, base + ".html")
        rc, out, err = run("report", path, "-o", html)
        check(rc == 0 and os.path.getsize(html) > 10000, "%s: report (exit %d)" % (base, rc))
        # convert: native trace (reads back with the same peaks and still refuses blocks) and a
        # pickle for memory_viz.
        a = analyze(path)
        binp = os.path.join(tmp, base + ".bin")
        rc, out, err = run("convert", path, "-o", binp)
        check(rc == 0, "%s: convert to native (exit %d)" % (base, rc))
        b = analyze(binp)
        peaks = lambda r: [(v["device"], v["peak_requested_bytes"], v["peak_reserved_bytes"])
                           for v in r["devices"]]
        check(peaks(a) == peaks(b), "%s: native trace has the same peaks %s" % (base, peaks(b)))
        rc, out, err = run("blocks", binp)
        check(rc == 1, "%s: blocks on the converted native trace exits 1" % base)
        pk = os.path.join(tmp, base + ".pickle")
        rc, out, err = run("convert", path, "-o", pk)
        check(rc == 0, "%s: convert to pickle (exit %d)" % (base, rc))
        with open(pk, "rb") as fh:
            snap = pickle.load(fh)
        dev = a["devices"][0]["device"]
        trace = snap["device_traces"][dev]
        ok = (isinstance(snap["segments"], list) and len(trace) == a["devices"][0]["events"] and
              all({"action", "addr", "size", "stream", "time_us", "frames"} <= set(e) for e in trace) and
              {e["action"] for e in trace} <= {"alloc", "free_completed", "segment_alloc", "segment_free"})
        check(ok, "%s: the pickle loads in Python with %d trace entries of memory_viz's shape" %
              (base, len(trace)))
        c = analyze(pk)
        check(peaks(c) == peaks(a), "%s: the pickle reads back with the same peaks" % base)

if failures:
    print("%d failed" % len(failures))
    sys.exit(1)
print("all passed")
