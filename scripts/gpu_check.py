#!/usr/bin/env python3
"""GPU validation of the capture side (run by scripts/gpu-check.sh; docs/capture.md).

Modes that need a CUDA GPU and PyTorch >= 2.2 (torch is imported only by them):

  gpu_check.py compare  --lib LIB --memforensics BIN --out DIR [--steps N]
      A small training loop (MLP, forward, backward, Adam, temporaries) with PyTorch's own history
      (_record_memory_history, context "alloc", Python stacks) and the hook recording at once;
      PyTorch's snapshot and the native trace must agree event by event (action, address, size,
      stream, stacks of allocs; times within a tolerance) and in `memforensics analyze --json`
      (events by action, peaks, final state, segments). Then the same in a child process that
      ends in a deliberate, uncaught OOM: the OOM must be in its trace 300 ms after the exception,
      its snapshot (dumped in the except clause) must agree with the trace up to the OOM, and the
      trace must read complete after the child died of the exception. Writes DIR/compare.json.
  gpu_check.py env      --lib LIB --memforensics BIN --out DIR
      MEMFORENSICS_OUT starts the recording when the library is loaded. DIR/env.json.
  gpu_check.py overhead --lib LIB --config CONFIG --steps N
      Median step time of the loop under one configuration (one process each: the tracker cannot be
      detached): baseline, history (PyTorch's history with Python stacks, no hook), hook (no
      stacks), hook_stacks (hook + Python stacks through PyTorch's context capture), hook_native
      (hook + C++ return addresses). Prints one JSON line.

Modes without torch:

  gpu_check.py cupti    --memforensics BIN --calls-program PROG --out DIR [--cupti-lib LIB]
      `memforensics record` around PROG (scripts/gpu_check_calls.cu), which logs every call it
      makes; every call must be in the trace as docs/capture.md's table says. DIR/cupti.json.
  gpu_check.py report   --out DIR
      DIR/results.json and DIR/results.md from the sections' JSON files.
  gpu_check.py selftest --memforensics BIN --out DIR
      The comparison logic of compare and cupti on fabricated files (a PyTorch-format snapshot
      made by tools/snapshot_fixture.py, converted to a native trace by BIN, and a fabricated call
      log): agreeing pairs must pass, altered ones must fail. Part of `gpu-check.sh --dry-run`.
"""
import argparse
import glob
import json
import os
import pickle
import platform
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def torch_module():
    import torch  # noqa: PLC0415 (only the GPU modes need it)
    return torch


# ---- the training loop --------------------------------------------------------------------------

def model_and_data(device):
    torch = torch_module()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096), torch.nn.GELU(),
        torch.nn.Linear(4096, 1024)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=device)
    y = torch.randn(256, 1024, device=device)
    return model, opt, x, y


def step(model, opt, x, y):
    torch = torch_module()
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    # A few temporaries of varied sizes, so that the caching allocator splits and reuses blocks.
    for k in range(1, 6):
        t = torch.empty(k * 123457, device=x.device)
        del t


def record_history(max_entries):
    torch_module().cuda.memory._record_memory_history(
        enabled="all", context="alloc", stacks="python", max_entries=max_entries)


# ---- helpers ------------------------------------------------------------------------------------

def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def analyze(binary, path):
    out = run([binary, "analyze", path, "--json"])
    return json.loads(out.splitlines()[0])


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def print_errors(errors, what):
    for m in errors[:40]:
        print(f"MISMATCH ({what}): {m}", file=sys.stderr)
    if len(errors) > 40:
        print(f"... and {len(errors) - 40} more", file=sys.stderr)


def frames_key(frames):
    return [(f.get("filename"), f.get("line"), f.get("name")) for f in frames or []]


# ---- snapshot against native trace (pure: used by compare and by selftest) ----------------------

ANALYZE_KEYS = ("peak_reserved_bytes", "peak_requested_bytes", "peak_allocated_bytes", "peak_active_bytes",
                "final_reserved_bytes", "final_requested_bytes", "final_allocated_bytes", "segments",
                "oom_count")


def compare_pair(memforensics, theirs, native, workdir, time_tolerance_us=2000, prefix=False):
    """PyTorch's snapshot `theirs` against the hook's trace `native`. With prefix, the trace may
    go on after the snapshot's last event (a child that died after dumping) as long as it only
    frees; analyze's numbers are then not compared. Returns (errors, stats)."""
    ours_pickle = os.path.join(workdir, os.path.basename(native) + ".pickle")
    run([memforensics, "convert", native, "-o", ours_pickle, "--to", "pickle"])
    with open(theirs, "rb") as f:
        a = pickle.load(f)
    with open(ours_pickle, "rb") as f:
        b = pickle.load(f)
    errors = []
    stats = {"events_compared": 0, "max_time_difference_us": 0, "events_after_snapshot": 0,
             "alloc_stacks_compared": 0}
    ndev = max(len(a["device_traces"]), len(b["device_traces"]))
    for d in range(ndev):
        ta = [e for e in (a["device_traces"][d] if d < len(a["device_traces"]) else []) if e["action"] != "snapshot"]
        tb = [e for e in (b["device_traces"][d] if d < len(b["device_traces"]) else []) if e["action"] != "snapshot"]
        if prefix and len(tb) > len(ta):
            extra = tb[len(ta):]
            stats["events_after_snapshot"] += len(extra)
            bad = [e["action"] for e in extra if e["action"] not in ("free_requested", "free_completed", "segment_free")]
            if bad:
                errors.append(f"device {d}: after the snapshot's last event the trace has {bad[:5]} (only frees expected)")
            tb = tb[:len(ta)]
        if len(ta) != len(tb):
            errors.append(f"device {d}: PyTorch has {len(ta)} events, the hook {len(tb)}")
        for i, (ea, eb) in enumerate(zip(ta, tb)):
            stats["events_compared"] += 1
            for k in ("action", "addr", "size", "stream"):
                if ea.get(k) != eb.get(k):
                    errors.append(f"device {d} event {i}: {k} {ea.get(k)!r} (PyTorch) != {eb.get(k)!r} (hook)")
            if "time_us" in ea and "time_us" in eb:
                dt = abs(ea["time_us"] - eb["time_us"])
                stats["max_time_difference_us"] = max(stats["max_time_difference_us"], dt)
                if dt > time_tolerance_us:
                    errors.append(f"device {d} event {i}: time_us differs by {dt} us")
            if "frames" in ea and ea["action"] == "alloc":
                stats["alloc_stacks_compared"] += 1
                if frames_key(ea["frames"]) != frames_key(eb.get("frames")):
                    errors.append(f"device {d} event {i}: stacks differ: {frames_key(ea['frames'])[:3]} (PyTorch) vs "
                                  f"{frames_key(eb.get('frames'))[:3]} (hook)")
    ja, jb = analyze(memforensics, theirs), analyze(memforensics, native)
    da = {x["device"]: x for x in ja["devices"]}
    db = {x["device"]: x for x in jb["devices"]}
    if set(da) != set(db):
        errors.append(f"devices differ: {sorted(da)} (PyTorch) vs {sorted(db)} (hook)")
    stats["devices"] = len(da)
    stats["peaks"] = {}
    for dev in sorted(set(da) & set(db)):
        x, y = da[dev], db[dev]
        stats["peaks"][str(dev)] = {k: y.get(k) for k in ("peak_reserved_bytes", "peak_allocated_bytes", "oom_count")}
        if prefix:
            continue
        ca = {k: v for k, v in x["events_by_action"].items() if k != "snapshot"}
        cb = {k: v for k, v in y["events_by_action"].items() if k != "snapshot"}
        if ca != cb:
            errors.append(f"device {dev}: events by action {ca} (PyTorch) != {cb} (hook)")
        for k in ANALYZE_KEYS:
            if x.get(k) != y.get(k):
                errors.append(f"device {dev}: {k} {x.get(k)} (PyTorch) != {y.get(k)} (hook)")
    warn = jb["input"].get("warnings") or []
    if any("dropped" in w for w in warn):
        errors.append(f"the hook dropped events: {warn}")
    stats["native_bytes"] = os.path.getsize(native)
    stats["pickle_bytes"] = os.path.getsize(theirs)
    return errors, stats


# ---- CUPTI: the program's call log against the trace (pure: used by cupti and by selftest) --------

DUMP_EVENT = re.compile(r"^(\d+):(\d+) t=(-?\d+) (\w+) addr=0x([0-9a-f]+) size=(\d+) stream=(-?\d+)(.*)$")


def parse_dump(text):
    """Events of `memforensics dump` output: dicts with device, action, addr, size, stream, pool."""
    out = []
    for line in text.splitlines():
        m = DUMP_EVENT.match(line)
        if m:
            rest = m.group(8)
            pool = re.search(r"pool=(\S+)", rest)
            out.append({"device": int(m.group(1)), "action": m.group(4), "addr": int(m.group(5), 16),
                        "size": int(m.group(6)), "stream": int(m.group(7)), "pool": pool.group(1) if pool else None})
    return out


def round512(n):
    return max(512, (n + 511) // 512 * 512)


def expected_cupti_events(calls):
    """The events docs/capture.md's table gives for each logged call: (action, addr, sizes
    accepted, async). Frees may carry the requested or the rounded size."""
    exp = []
    live_maps = []  # (addr, size) of cuMemMap mappings
    sizes = {}
    for c in calls:
        op, addr, n, asy = c["op"], c["addr"], c["size"], bool(c.get("async"))
        if op in ("cudaMalloc", "cudaMallocAsync", "cudaMallocFromPoolAsync"):
            sizes[addr] = n
            exp.append(("segment_alloc", addr, {round512(n)}, asy))
            exp.append(("alloc", addr, {n}, asy))
        elif op in ("cudaFree", "cudaFreeAsync"):
            n = sizes.pop(addr, n)
            for action in ("free_requested", "free_completed", "segment_free"):
                exp.append((action, addr, {n, round512(n)}, asy))
        elif op == "cuMemMap":
            live_maps.append((addr, n))
            exp.append(("segment_map", addr, {n}, False))
            exp.append(("alloc", addr, {n}, False))
        elif op == "cuMemUnmap":
            inside = [(a, s) for a, s in live_maps if addr <= a and a + s <= addr + n]
            live_maps = [m for m in live_maps if m not in inside]
            for a, s in inside:
                exp.append(("free_requested", a, {s}, False))
                exp.append(("free_completed", a, {s}, False))
                exp.append(("segment_unmap", a, {s}, False))
    return exp


def compare_cupti(calls, events):
    """Every expected event must be in the trace (device 0), in the order of the calls for each
    address; stream-ordered allocations must carry a stream and a pool. Returns (errors, stats);
    events of the trace at no logged address are listed in stats["extra"] (the CUDA runtime's own
    allocations, if any), not errors."""
    errors = []
    exp = expected_cupti_events(calls)
    dev0 = [e for e in events if e["device"] == 0]
    used = [False] * len(dev0)
    cursor = {}  # per address: index in dev0 after the last matched event
    matched = 0
    for action, addr, sizes, asy in exp:
        start = cursor.get(addr, 0)
        hit = None
        for i in range(start, len(dev0)):
            e = dev0[i]
            if not used[i] and e["action"] == action and e["addr"] == addr:
                hit = i
                break
        if hit is None:
            errors.append(f"missing {action} at {addr:#x} (sizes {sorted(sizes)}) in the trace")
            continue
        e = dev0[hit]
        used[hit] = True
        cursor[addr] = hit + 1
        matched += 1
        if e["size"] not in sizes:
            errors.append(f"{action} at {addr:#x}: size {e['size']}, expected one of {sorted(sizes)}")
        if asy and action in ("segment_alloc", "alloc") and (e["stream"] == 0 or e["pool"] is None):
            errors.append(f"{action} at {addr:#x} (stream-ordered): stream {e['stream']}, pool {e['pool']}; "
                          "expected a stream and a pool")
    logged = {c["addr"] for c in calls}
    extra = [e for i, e in enumerate(dev0) if not used[i]]
    for e in extra:
        if e["addr"] in logged:
            errors.append(f"unexpected {e['action']} at logged address {e['addr']:#x} (size {e['size']})")
    other_devices = sorted({e["device"] for e in events if e["device"] != 0})
    if other_devices:
        errors.append(f"events on devices {other_devices}: the program used device 0 only")
    stats = {"calls": len(calls), "expected_events": len(exp), "matched_events": matched,
             "trace_events": len(events),
             "extra": [f"{e['action']} {e['addr']:#x} {e['size']}" for e in extra if e["addr"] not in logged][:20]}
    return errors, stats


# ---- GPU modes ----------------------------------------------------------------------------------

def compare(args):
    torch = torch_module()
    os.makedirs(args.out, exist_ok=True)
    native = os.path.join(args.out, "hook.bin")
    theirs = os.path.join(args.out, "pytorch.pickle")
    torch.cuda.init()
    warm = torch.empty(1, device="cuda")  # the allocator exists: the hook attaches at once  # noqa: F841
    record_history(1_000_000)
    torch.ops.load_library(args.lib)
    assert torch.ops.memforensics.start(native, True, False), "start() failed"
    model, opt, x, y = model_and_data("cuda")
    for _ in range(args.steps):
        step(model, opt, x, y)
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(theirs)
    assert torch.ops.memforensics.stop(), "stop() failed"
    torch.cuda.memory._record_memory_history(enabled=None)
    errors, stats = compare_pair(args.memforensics, theirs, native, args.out, args.time_tolerance_us)
    result = {"ok": not errors, "loop": stats, "errors": errors[:40]}
    if errors:
        print_errors(errors, "training loop")
    else:
        print(f"compare: {stats['events_compared']} events agree ({stats['alloc_stacks_compared']} alloc stacks, "
              f"max time difference {stats['max_time_difference_us']} us); analyze agrees on {stats['devices']} "
              f"device(s); native {stats['native_bytes']} bytes vs pickle {stats['pickle_bytes']} bytes")

    # The OOM child: dies of the exception; its trace must hold the OOM and read complete.
    child_native = os.path.join(args.out, "oom_child.bin")
    child_pickle = os.path.join(args.out, "oom_child.pickle")
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "oom-child", "--lib", args.lib, "--memforensics",
                        args.memforensics, "--out", args.out, "--steps", str(max(2, args.steps // 5))],
                       capture_output=True, text=True)
    child = {"exit_code": p.returncode, "stderr_tail": p.stderr[-600:]}
    cerrors = []
    if "OutOfMemoryError" not in p.stderr or p.returncode == 0:
        cerrors.append(f"the child did not die of an OutOfMemoryError (exit {p.returncode})")
    marker = os.path.join(args.out, "oom_child.mid.json")
    if os.path.exists(marker):
        with open(marker) as f:
            child["oom_in_file_after_300ms"] = json.load(f)["oom_count"] >= 1
        if not child["oom_in_file_after_300ms"]:
            cerrors.append("the OOM was not in the child's trace 300 ms after OutOfMemoryError")
    else:
        cerrors.append("the child wrote no mid-run check (it failed before its OOM)")
    if os.path.exists(child_native) and os.path.exists(child_pickle):
        j = analyze(args.memforensics, child_native)
        child["trace_warnings"] = j["input"].get("warnings") or []
        child["oom_count"] = sum(d.get("oom_count", 0) for d in j["devices"])
        if child["trace_warnings"]:
            cerrors.append(f"the child's trace does not read complete: {child['trace_warnings']}")
        if child["oom_count"] < 1:
            cerrors.append("no OOM in the child's trace")
        e2, s2 = compare_pair(args.memforensics, child_pickle, child_native, args.out, args.time_tolerance_us,
                              prefix=True)
        cerrors += e2
        child.update(s2)
    else:
        cerrors.append("the child left no trace or no snapshot")
    if cerrors:
        print_errors(cerrors, "OOM child")
    else:
        print(f"compare: OOM child: {child['events_compared']} events agree up to the OOM, "
              f"{child['events_after_snapshot']} frees after it, trace complete after the uncaught OOM")
    result["oom_child"] = child
    result["oom_child"]["errors"] = cerrors[:40]
    result["ok"] = result["ok"] and not cerrors
    write_json(os.path.join(args.out, "compare.json"), result)
    sys.exit(0 if result["ok"] else 1)


def oom_child(args):
    """Child of compare: history + hook, a few steps, then an OOM that is not caught."""
    import atexit
    torch = torch_module()
    native = os.path.join(args.out, "oom_child.bin")
    theirs = os.path.join(args.out, "oom_child.pickle")
    torch.cuda.init()
    warm = torch.empty(1, device="cuda")  # the allocator exists: the hook attaches at once  # noqa: F841
    record_history(1_000_000)
    torch.ops.load_library(args.lib)
    assert torch.ops.memforensics.start(native, True, False), "start() failed"
    atexit.register(torch.ops.memforensics.stop)  # while Python is alive (docs/capture.md)
    model, opt, x, y = model_and_data("cuda")
    for _ in range(args.steps):
        step(model, opt, x, y)
    torch.cuda.synchronize()
    total = torch.cuda.mem_get_info()[1]
    try:
        torch.empty(total // 4 + (1 << 28), dtype=torch.float32, device="cuda")  # > total bytes
    except torch.cuda.OutOfMemoryError:
        time.sleep(0.3)  # the writer may need the GIL for this batch's stacks (docs/capture.md)
        mid = analyze(args.memforensics, native)
        write_json(os.path.join(args.out, "oom_child.mid.json"),
                   {"oom_count": sum(d.get("oom_count", 0) for d in mid["devices"])})
        torch.cuda.memory._dump_snapshot(theirs)
        raise
    print("the oversized allocation succeeded", file=sys.stderr)
    sys.exit(3)


def env_start(args):
    os.makedirs(args.out, exist_ok=True)
    native = os.path.join(args.out, "env.bin")
    code = (
        "import torch\n"
        "torch.cuda.init()\n"
        f"torch.ops.load_library({args.lib!r})\n"
        "x = torch.empty(1 << 20, device='cuda'); del x\n"
    )
    env = dict(os.environ, MEMFORENSICS_OUT=native)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    j = analyze(args.memforensics, native)
    allocs = sum(d["events_by_action"].get("alloc", 0) for d in j["devices"])
    warnings = j["input"].get("warnings") or []
    ok = allocs >= 1 and not warnings
    write_json(os.path.join(args.out, "env.json"), {"ok": ok, "allocs": allocs, "warnings": warnings})
    if not ok:
        print_errors([f"MEMFORENSICS_OUT: {allocs} allocs, warnings {warnings}"], "env")
        sys.exit(1)
    print(f"env: MEMFORENSICS_OUT recorded {allocs} allocation(s), file complete")


def overhead(args):
    torch = torch_module()
    cfg = args.config
    torch.cuda.init()
    path = f"/tmp/memf_gpu_overhead_{os.getpid()}.bin"
    if cfg == "history":
        record_history(100_000)
    if cfg.startswith("hook"):
        if cfg == "hook_stacks":
            record_history(1)  # PyTorch gathers a Python stack per alloc; the hook keeps it
        torch.ops.load_library(args.lib)
        assert torch.ops.memforensics.start(path, cfg == "hook_stacks", cfg == "hook_native")
    model, opt, x, y = model_and_data("cuda")
    for _ in range(5):
        step(model, opt, x, y)
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step(model, opt, x, y)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    size = 0
    if cfg.startswith("hook"):
        torch.ops.memforensics.stop()
        size = os.path.getsize(path)
        os.unlink(path)
    print(json.dumps({"config": cfg, "steps": args.steps, "median_step_ms": statistics.median(times),
                      "min_step_ms": min(times), "file_bytes": size}))


def cupti(args):
    os.makedirs(args.out, exist_ok=True)
    calls_path = os.path.join(args.out, "cupti_calls.jsonl")
    trace = os.path.join(args.out, "cupti.bin")
    env = dict(os.environ)
    if args.cupti_lib:
        env["MEMFORENSICS_CUPTI_LIB"] = args.cupti_lib
    p = subprocess.run([args.memforensics, "record", "-o", trace, "--", args.calls_program, calls_path],
                       capture_output=True, text=True, env=env)
    result = {"record_exit": p.returncode, "record_stderr": p.stderr[-1500:]}
    errors = []
    if p.returncode != 0:
        errors.append(f"memforensics record exited {p.returncode}: {p.stderr[-400:]}")
    calls = []
    if os.path.exists(calls_path):
        with open(calls_path) as f:
            calls = [json.loads(line) for line in f if line.strip()]
    if os.path.exists(trace):
        events = parse_dump(run([args.memforensics, "dump", trace]))
        e2, stats = compare_cupti(calls, events)
        errors += e2
        result.update(stats)
        j = analyze(args.memforensics, trace)
        result["analyze"] = {str(d["device"]): {"events_by_action": d["events_by_action"],
                                                "peak_reserved_bytes": d["peak_reserved_bytes"]} for d in j["devices"]}
        result["trace_warnings"] = j["input"].get("warnings") or []
    else:
        errors.append("no trace written")
    result["ok"] = not errors
    result["errors"] = errors[:40]
    write_json(os.path.join(args.out, "cupti.json"), result)
    if errors:
        print_errors(errors, "cupti")
        sys.exit(1)
    print(f"cupti: {len(calls)} calls, all {result['matched_events']} expected events in the trace "
          f"({len(result['extra'])} events of the CUDA runtime's own besides)")


# ---- report -------------------------------------------------------------------------------------

def load_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def report(args):
    out = args.out
    res = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node()}
    res["machine"] = load_json(os.path.join(out, "machine.json"), {})
    res["build"] = load_json(os.path.join(out, "build.json"), {})
    res["compare"] = load_json(os.path.join(out, "compare.json"))
    res["env"] = load_json(os.path.join(out, "env.json"))
    res["cupti"] = load_json(os.path.join(out, "cupti.json"))
    rows = []
    if os.path.exists(os.path.join(out, "overhead.jsonl")):
        with open(os.path.join(out, "overhead.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip().startswith("{")]
    res["overhead"] = rows
    res["sections"] = load_json(os.path.join(out, "sections.json"), {})
    write_json(os.path.join(out, "results.json"), res)

    def status(name):
        s = res["sections"].get(name)
        return s if s else "not run"

    m = res["machine"]
    lines = ["# memforensics GPU check", "",
             f"{res['date_utc']}; {m.get('gpu', '?')}; driver {m.get('driver', '?')}; torch {m.get('torch', '?')} "
             f"(CUDA {m.get('torch_cuda', '?')}); nvcc {m.get('nvcc', '?')}; {m.get('glibc', '')}", "",
             "| check | result | details |", "|---|---|---|"]
    b = res["build"]
    lines.append(f"| build (capture-only, on this machine) | {status('build')} | torch route: {b.get('torch_route', '?')}; "
                 f"CUPTI: {b.get('cupti', '?')}; {b.get('seconds', '?')} s |")
    c = res["compare"] or {}
    loop = c.get("loop", {})
    lines.append(f"| hook vs `_record_memory_history` (training loop) | {status('compare')} | "
                 f"{loop.get('events_compared', '?')} events, {loop.get('alloc_stacks_compared', '?')} alloc stacks, "
                 f"max time difference {loop.get('max_time_difference_us', '?')} us, peaks {loop.get('peaks', '?')} |")
    oc = c.get("oom_child", {})
    lines.append(f"| OOM in a child process | {status('compare')} | exit {oc.get('exit_code', '?')}, OOM in the file after "
                 f"300 ms: {oc.get('oom_in_file_after_300ms', '?')}, {oc.get('events_compared', '?')} events agree, "
                 f"{oc.get('events_after_snapshot', '?')} frees after the dump, warnings {oc.get('trace_warnings', '?')} |")
    e = res["env"] or {}
    lines.append(f"| `MEMFORENSICS_OUT` | {status('env')} | {e.get('allocs', '?')} allocation(s), warnings {e.get('warnings', '?')} |")
    cu = res["cupti"] or {}
    lines.append(f"| CUPTI library under `memforensics record` | {status('cupti')} | {cu.get('calls', '?')} calls, "
                 f"{cu.get('matched_events', '?')}/{cu.get('expected_events', '?')} expected events, "
                 f"{len(cu.get('extra', []))} other events |")
    for name in ("compare", "env", "cupti"):
        errs = (res[name] or {}).get("errors") or []
        for err in errs[:5]:
            cell = " ".join(str(err).split()).replace("|", "/")[:300]
            lines.append(f"| {name}: mismatch | | {cell} |")
    if rows:
        base = next((r["median_step_ms"] for r in rows if r["config"] == "baseline"), None)
        lines += ["", f"Step time (median of {rows[0].get('steps', '?')} steps, one process per configuration):", "",
                  "| configuration | median step ms | overhead | trace bytes |", "|---|---|---|---|"]
        for r in rows:
            ov = f"{100 * (r['median_step_ms'] / base - 1):+.1f}%" if base else "?"
            lines.append(f"| {r['config']} | {r['median_step_ms']:.3f} | {ov} | {r['file_bytes']} |")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


# ---- selftest (no torch, no GPU) ----------------------------------------------------------------

SELFTEST_FIXTURE = """\
era 2.11
stack a = /w/train.py:10:step ; /w/train.py:20:main
stack b = /w/model.py:5:forward ; /w/train.py:10:step ; /w/train.py:20:main
t 1000 segment_alloc 0x7f0000000000 20MiB
t +1 alloc auto 1500000 stack=a name=x
t +1 alloc auto 4MiB stack=b name=y
t +1 free @x
t +1 alloc auto 3000000 stack=b name=z
t +1 oom 40GiB device_free=1GiB
t +1 free @y
t +1 free @z
"""


def selftest(args):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import snapshot_fixture  # noqa: PLC0415
    os.makedirs(args.out, exist_ok=True)
    failures = []
    snap = snapshot_fixture.compile_fixture("selftest.fixture", SELFTEST_FIXTURE)
    theirs = os.path.join(args.out, "self_pytorch.pickle")
    with open(theirs, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    native = os.path.join(args.out, "self_hook.bin")
    run([args.memforensics, "convert", theirs, "-o", native, "--to", "native"])
    errors, stats = compare_pair(args.memforensics, theirs, native, args.out)
    if errors or stats["events_compared"] < 8 or stats["alloc_stacks_compared"] < 3:
        failures.append(f"an agreeing pair does not compare equal: {errors[:3]} {stats}")

    def altered(name, change):
        s = pickle.loads(pickle.dumps(snap))
        change(s)
        path = os.path.join(args.out, f"self_{name}.pickle")
        with open(path, "wb") as f:
            pickle.dump(s, f, protocol=4)
        bad = os.path.join(args.out, f"self_{name}.bin")
        run([args.memforensics, "convert", path, "-o", bad, "--to", "native"])
        return path, bad

    tr = lambda s: s["device_traces"][0]  # noqa: E731
    first_alloc = next(i for i, e in enumerate(tr(snap)) if e["action"] == "alloc")
    cases = {
        "size": (lambda s: tr(s)[first_alloc].update(size=tr(s)[first_alloc]["size"] + 512), "size"),
        "stack": (lambda s: tr(s)[first_alloc].update(frames=tr(s)[first_alloc]["frames"][1:]), "stacks differ"),
        "missing": (lambda s: tr(s).pop(), "events"),
        "time": (lambda s: tr(s)[first_alloc].update(time_us=tr(s)[first_alloc]["time_us"] + 10_000), "time_us"),
    }
    for name, (change, needle) in cases.items():
        errors, _ = compare_pair(args.memforensics, theirs, altered(name, change)[1], args.out)
        if not any(needle in e for e in errors):
            failures.append(f"altered pair '{name}' not caught (errors: {errors[:3]})")
    # Prefix mode: the trace may go on with frees only.
    errors, st = compare_pair(args.memforensics, altered("prefix_theirs", lambda s: tr(s).pop())[0], native, args.out,
                              prefix=True)
    if errors or st["events_after_snapshot"] != 1:
        failures.append(f"prefix comparison: {errors[:3]} {st.get('events_after_snapshot')}")

    # CUPTI: a fabricated call log and the trace the docs' table gives for it.
    g = 2 << 20
    calls = [
        {"op": "cudaMalloc", "addr": 0x7f0000000000, "size": (1 << 20) + 1000},
        {"op": "cudaMalloc", "addr": 0x7f0010000000, "size": 64 << 20},
        {"op": "cudaFree", "addr": 0x7f0000000000, "size": (1 << 20) + 1000},
        {"op": "cudaMallocFromPoolAsync", "addr": 0x7e0000000000, "size": 3000, "async": 1},
        {"op": "cudaFreeAsync", "addr": 0x7e0000000000, "size": 3000, "async": 1},
        {"op": "cuMemMap", "addr": 0x7d0000000000, "size": 2 * g},
        {"op": "cuMemMap", "addr": 0x7d0000000000 + 2 * g, "size": g},
        {"op": "cuMemUnmap", "addr": 0x7d0000000000, "size": 3 * g},
        {"op": "cudaFree", "addr": 0x7f0010000000, "size": 64 << 20},
    ]

    def trace_of(exp, drop=None, extra=()):
        evs = []
        t = 1000
        for i, (action, addr, sizes, asy) in enumerate(exp):
            if i == drop:
                continue
            t += 1
            e = {"action": action, "addr": addr, "size": max(sizes), "stream": 7 if asy else 0, "time_us": t}
            if asy:
                e["pool_id"] = (0x5000, 1)
            evs.append(e)
        evs += list(extra)
        path = os.path.join(args.out, f"self_cupti_{drop}_{len(extra)}.pickle")
        with open(path, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [evs]}, f, protocol=4)
        bin_path = path[:-7] + ".bin"
        run([args.memforensics, "convert", path, "-o", bin_path, "--to", "native"])
        return parse_dump(run([args.memforensics, "dump", bin_path]))

    exp = expected_cupti_events(calls)
    errors, st = compare_cupti(calls, trace_of(exp, extra=[{"action": "segment_alloc", "addr": 0x7c0000000000,
                                                            "size": 4096, "stream": 0, "time_us": 5000}]))
    if errors or st["matched_events"] != len(exp) or len(st["extra"]) != 1:
        failures.append(f"CUPTI: an agreeing trace does not compare equal: {errors[:3]} {st}")
    unmap_idx = next(i for i, x in enumerate(exp) if x[0] == "segment_unmap")
    for drop, needle in ((0, "missing segment_alloc"), (unmap_idx, "missing segment_unmap")):
        errors, _ = compare_cupti(calls, trace_of(exp, drop=drop))
        if not any(needle in e for e in errors):
            failures.append(f"CUPTI: dropped event {drop} not caught ({errors[:3]})")
    bad_async = [(a, ad, s, False) if a == "alloc" and asy else (a, ad, s, asy) for a, ad, s, asy in exp]
    errors, _ = compare_cupti(calls, trace_of(bad_async))
    if not any("stream-ordered" in e for e in errors):
        failures.append(f"CUPTI: a stream-ordered allocation without stream/pool not caught ({errors[:3]})")

    # The report renders from fabricated sections.
    write_json(os.path.join(args.out, "sections.json"), {"build": "ok", "compare": "ok"})
    with open(os.path.join(args.out, "overhead.jsonl"), "w") as f:
        f.write(json.dumps({"config": "baseline", "steps": 3, "median_step_ms": 2.0, "min_step_ms": 1.9,
                            "file_bytes": 0}) + "\n")
        f.write(json.dumps({"config": "hook", "steps": 3, "median_step_ms": 2.1, "min_step_ms": 2.0,
                            "file_bytes": 1234}) + "\n")
    saved = sys.stdout
    sys.stdout = open(os.devnull, "w")
    try:
        report(args)
    finally:
        sys.stdout.close()
        sys.stdout = saved
    with open(os.path.join(args.out, "results.md")) as f:
        md = f.read()
    if "| hook | 2.100 | +5.0% | 1234 |" not in md:
        failures.append("report: the overhead table is not as expected")
    for p in glob.glob(os.path.join(args.out, "self_*")):
        os.unlink(p)
    if failures:
        for f_ in failures:
            print("SELFTEST FAILED:", f_, file=sys.stderr)
        sys.exit(1)
    print(f"selftest: snapshot/trace comparison ({stats['events_compared']} events; 4 alterations and the prefix "
          f"rule caught), CUPTI call-log comparison ({len(exp)} expected events; 3 alterations caught), report: OK")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["compare", "oom-child", "env", "overhead", "cupti", "report", "selftest"])
    p.add_argument("--lib")
    p.add_argument("--memforensics")
    p.add_argument("--out", default="/tmp/memf_gpu_check")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--config", default="baseline")
    p.add_argument("--time-tolerance-us", type=int, default=2000)
    p.add_argument("--calls-program")
    p.add_argument("--cupti-lib")
    args = p.parse_args()
    needs_gpu = args.mode in ("compare", "oom-child", "env", "overhead")
    if needs_gpu and not torch_module().cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        sys.exit(2)
    {"compare": compare, "oom-child": oom_child, "env": env_start, "overhead": overhead, "cupti": cupti,
     "report": report, "selftest": selftest}[args.mode](args)


if __name__ == "__main__":
    main()
