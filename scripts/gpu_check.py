#!/usr/bin/env python3
"""GPU validation of the capture side (run by scripts/gpu-check.sh; docs/capture.md).

Modes that need a CUDA GPU and PyTorch >= 2.2 (torch is imported only by them):

  gpu_check.py compare  --lib LIB --memforensics BIN --out DIR [--steps N] [--no-graph] [--no-oom-child]
      A small training loop (MLP, forward, backward, Adam, temporaries) with PyTorch's own history
      (_record_memory_history, context "alloc", Python stacks) and the hook recording at once,
      then the model's forward captured into a CUDA graph and replayed (a private memory pool;
      --no-graph leaves it out); PyTorch's snapshot and the native trace must agree event by event
      (action, address, size, stream, stacks of allocs; times within a tolerance) and in
      `memforensics analyze --json` (events by action, peaks, final state, segments). Then the
      same in a child process that ends in a deliberate, uncaught OOM (not with --no-oom-child):
      the OOM must be in its trace 300 ms after the exception, its snapshot (dumped in the except
      clause) must agree with the trace up to the OOM, and the trace must read complete after the
      child died of the exception. Writes DIR/compare.json. gpu-check.sh runs it twice: with the
      environment's allocator settings, and with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
      (segment_map / segment_unmap instead of segment_alloc / segment_free).
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
      DIR/results.json and DIR/results.md from the sections' JSON files (DIR/expandable/ holds
      the second compare run's).
  gpu_check.py hook-sources
      The sources of the CMake target memforensics_torch, one path a line, read from the
      CMakeLists.txt files: what gpu-check.sh's direct-compiler route compiles.
  gpu_check.py selftest --memforensics BIN --out DIR
      The comparison logic of compare and cupti on fabricated files (a PyTorch-format snapshot
      made by tools/snapshot_fixture.py, converted to a native trace by BIN; a trace of
      expandable segments; a fabricated call log): agreeing pairs must pass, altered ones must
      fail; the report of fabricated results; hook-sources. Part of `gpu-check.sh --dry-run`.
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
import tempfile
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


def graph_capture(model, x):
    """The model's forward (no grad) captured into a CUDA graph and replayed 3 times, then the
    graph and its output deleted. torch.cuda.graph synchronizes and empties the cache first, and
    the capture allocates from the graph's private memory pool: PyTorch's history and the hook
    must record all of it alike. Warm-up on a side stream first, as PyTorch's CUDA graph docs
    require. Returns a list of errors: a capture that fails is reported, and the caller goes on
    to compare what was recorded."""
    torch = torch_module()
    try:
        with torch.no_grad():
            static_x = x.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    model(static_x)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_out = model(static_x)
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
            del static_out, g, static_x
    except Exception as e:  # noqa: BLE001 (reported as a mismatch; the loop's events still compared)
        return [f"CUDA graph capture or replay failed: {e!r}"[:500]]
    return []


def pool_events(memforensics, native):
    """Events the hook's trace attributes to a memory pool other than the default one: with
    PyTorch >= 2.8 (TraceEntry::mempool_), those of the CUDA graph's private pool. Only counted
    for the report: None when the dump fails."""
    try:
        return sum(1 for e in parse_dump(run([memforensics, "dump", native])) if e["pool"])
    except (OSError, subprocess.CalledProcessError):
        return None


def record_history(max_entries):
    torch_module().cuda.memory._record_memory_history(
        enabled="all", context="alloc", stacks="python", max_entries=max_entries)


# ---- helpers ------------------------------------------------------------------------------------

def run(cmd, **kw):
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout
    except subprocess.CalledProcessError as e:  # say why before the caller reports the failure
        print(f"{' '.join(map(str, cmd))} exited {e.returncode}:\n{(e.stderr or '')[-2000:]}", file=sys.stderr)
        raise


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


# What a trace may hold after the snapshot's last event (a child that died after dumping): frees,
# and with expandable segments the unmapping that replaces segment_free.
AFTER_SNAPSHOT_ACTIONS = ("free_requested", "free_completed", "segment_free", "segment_unmap")


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
            bad = [e["action"] for e in extra if e["action"] not in AFTER_SNAPSHOT_ACTIONS]
            if bad:
                errors.append(f"device {d}: after the snapshot's last event the trace has {bad[:5]} "
                              "(only frees and unmaps expected)")
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


# ---- the hook's sources, for the build without CMake ---------------------------------------------

def cmake_call_args(text, command, first):
    """The arguments of the CMake call `command(first ...)` in text, split at whitespace; None when
    there is no such call. Enough for the plain source lists of these files (no quoting, no
    generator expressions)."""
    m = re.search(r"^\s*" + command + r"\(\s*" + re.escape(first) + r"\s+([^)]*)\)", text, re.MULTILINE)
    return m.group(1).split() if m else None


def hook_sources(root=ROOT):
    """The .cc files of the CMake target memforensics_torch (src/capture/CMakeLists.txt): its own
    sources, MEMF_CAPTURE_CORE_SOURCES, and the sources of memf_trace and memf_common, which it
    compiles again with LibTorch's flags. Raises ValueError when the files no longer read as
    expected, so that the direct-compiler route fails loudly rather than links an incomplete
    library."""
    def read(rel):
        with open(os.path.join(root, rel)) as f:
            return f.read()

    def listed(rel, command, first):
        a = cmake_call_args(read(rel), command, first)
        if a is None:
            raise ValueError(f"{rel}: no {command}({first} ...)")
        return a

    capture = read("src/capture/CMakeLists.txt")
    lists = {
        "MEMF_CAPTURE_CORE_SOURCES": ["src/capture/" + f for f in listed("src/capture/CMakeLists.txt", "set",
                                                                        "MEMF_CAPTURE_CORE_SOURCES")],
        "memf_trace_sources": ["src/format/" + f for f in listed("src/format/CMakeLists.txt", "add_library",
                                                                 "memf_trace")[1:]],
        "memf_common_sources": ["src/common/" + f for f in listed("src/common/CMakeLists.txt", "add_library",
                                                                  "memf_common")[1:]],
    }
    target = cmake_call_args(capture, "add_library", "memforensics_torch")
    if target is None or target[:1] != ["SHARED"]:
        raise ValueError("src/capture/CMakeLists.txt: no add_library(memforensics_torch SHARED ...)")
    out = []
    for tok in target[1:]:
        if tok.endswith((".h", ".hpp")):
            continue
        v = re.fullmatch(r"\$\{(\w+)\}", tok)
        if v:
            if v.group(1) not in lists:
                raise ValueError(f"src/capture/CMakeLists.txt: memforensics_torch lists ${{{v.group(1)}}}, "
                                 "which gpu_check.py does not know")
            out += lists[v.group(1)]
        else:
            out.append("src/capture/" + tok)
    for rel in out:
        if not os.path.isfile(os.path.join(root, rel)):
            raise ValueError(f"memforensics_torch source {rel}: not in the tree")
    return [os.path.join(root, rel) for rel in dict.fromkeys(out)]


def print_hook_sources(args):  # noqa: ARG001
    try:
        print("\n".join(hook_sources()))
    except (OSError, ValueError) as e:
        sys.exit(f"hook-sources: {e}")


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
    graph_errors = graph_capture(model, x) if args.graph else []
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(theirs)
    assert torch.ops.memforensics.stop(), "stop() failed"
    torch.cuda.memory._record_memory_history(enabled=None)
    try:
        errors, stats = compare_pair(args.memforensics, theirs, native, args.out, args.time_tolerance_us)
    except (OSError, ValueError, KeyError, subprocess.CalledProcessError, pickle.UnpicklingError) as e:
        errors, stats = [f"the comparison itself failed: {e!r}"[:500]], {}
    errors = graph_errors + errors
    stats["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    stats["graph"] = args.graph
    if args.graph:
        stats["graph_pool_events"] = pool_events(args.memforensics, native)
    result = {"ok": not errors, "loop": stats, "errors": errors[:40]}
    if errors:
        print_errors(errors, "training loop")
    elif stats:
        graph = f"; CUDA graph: {stats['graph_pool_events']} private-pool events" if args.graph else ""
        print(f"compare: {stats['events_compared']} events agree ({stats['alloc_stacks_compared']} alloc stacks, "
              f"max time difference {stats['max_time_difference_us']} us); analyze agrees on {stats['devices']} "
              f"device(s); native {stats['native_bytes']} bytes vs pickle {stats['pickle_bytes']} bytes{graph}")

    if not args.oom_child:
        result["oom_child"] = {"skipped": True}
        write_json(os.path.join(args.out, "compare.json"), result)
        sys.exit(0 if result["ok"] else 1)
    # The loop's result is kept whatever the child does (a hang, a failed read).
    result["oom_child"] = {"errors": ["the OOM child's checks did not finish"]}
    write_json(os.path.join(args.out, "compare.json"), result)

    # The OOM child: dies of the exception; its trace must hold the OOM and read complete.
    child_native = os.path.join(args.out, "oom_child.bin")
    child_pickle = os.path.join(args.out, "oom_child.pickle")
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "oom-child", "--lib", args.lib,
                            "--memforensics", args.memforensics, "--out", args.out,
                            "--steps", str(max(2, args.steps // 5))],
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        p = subprocess.CompletedProcess(e.cmd, -9, "", err + "\n(killed after 60 s)")
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
    try:
        check_oom_child(args, child, cerrors, child_native, child_pickle)
    except (OSError, ValueError, KeyError, subprocess.CalledProcessError, pickle.UnpicklingError) as e:
        cerrors.append(f"checking the child's files failed: {e!r}"[:500])
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


def check_oom_child(args, child, cerrors, child_native, child_pickle):
    """compare's checks of the OOM child's trace and snapshot, into child and cerrors."""
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
    res["compare_expandable"] = load_json(os.path.join(out, "expandable", "compare.json"))
    res["env"] = load_json(os.path.join(out, "env.json"))
    res["cupti"] = load_json(os.path.join(out, "cupti.json"))
    res["python"] = load_json(os.path.join(out, "python.json"))
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
             f"(CUDA {m.get('torch_cuda', '?')}); nvcc {m.get('nvcc', '?')}; {m.get('cmake', '')}; {m.get('glibc', '')}",
             "", "| check | result | details |", "|---|---|---|"]
    b = res["build"]
    lines.append(f"| build `libmemforensics_torch.so` (on this machine) | {status('build_hook')} | "
                 f"route: {b.get('torch_route', '?')}; tried: {b.get('routes_tried', '?')}; {b.get('seconds', '?')} s |")
    lines.append(f"| build `libmemforensics_cupti.so` (capture-only CMake) | {status('build_cupti')} | "
                 f"libcupti: {b.get('cupti', '?')}; {b.get('cupti_seconds', '?')} s |")
    for name, what in (("compare", "training loop"), ("compare_expandable", "training loop, expandable segments")):
        loop = (res[name] or {}).get("loop")
        if not loop:
            lines.append(f"| hook vs `_record_memory_history` ({what}) | {status(name)} | no results (gpu-check.log) |")
            continue
        graph = (f"CUDA graph: {loop.get('graph_pool_events', '?')} private-pool events"
                 if loop.get("graph") else "no CUDA graph")
        conf = loop.get("alloc_conf") or "unset"
        lines.append(f"| hook vs `_record_memory_history` ({what}) | {status(name)} | "
                     f"PYTORCH_CUDA_ALLOC_CONF {conf}; {loop.get('events_compared', '?')} events, "
                     f"{loop.get('alloc_stacks_compared', '?')} alloc stacks, max time difference "
                     f"{loop.get('max_time_difference_us', '?')} us; {graph}; peaks {loop.get('peaks', '?')} |")
    oc = (res["compare"] or {}).get("oom_child")
    if oc:
        lines.append(f"| OOM in a child process | {status('compare')} | exit {oc.get('exit_code', '?')}, OOM in the file "
                     f"after 300 ms: {oc.get('oom_in_file_after_300ms', '?')}, {oc.get('events_compared', '?')} events "
                     f"agree, {oc.get('events_after_snapshot', '?')} frees after the dump, "
                     f"warnings {oc.get('trace_warnings', '?')} |")
    else:
        lines.append(f"| OOM in a child process | {status('compare')} | no results (gpu-check.log) |")
    e = res["env"] or {}
    lines.append(f"| `MEMFORENSICS_OUT` | {status('env')} | {e.get('allocs', '?')} allocation(s), warnings {e.get('warnings', '?')} |")
    cu = res["cupti"] or {}
    lines.append(f"| CUPTI library under `memforensics record` | {status('cupti')} | {cu.get('calls', '?')} calls, "
                 f"{cu.get('matched_events', '?')}/{cu.get('expected_events', '?')} expected events, "
                 f"{len(cu.get('extra', []))} other events |")
    py = res["python"] or {}
    for key, what in (("record_hook", "hook"), ("record_history", "`_record_memory_history` fallback")):
        r = py.get(key) or {}
        lines.append(f"| Python `record()`, {what} | {status('python')} | method {r.get('method', '?')}; peak "
                     f"reserved {r.get('peak_reserved_bytes', '?')} (PyTorch {r.get('max_memory_reserved', '?')}), "
                     f"requested {r.get('peak_requested_bytes', '?')} (PyTorch {r.get('max_requested', '?')}), "
                     f"allocated {r.get('peak_allocated_bytes', '?')} (PyTorch {r.get('max_memory_allocated', '?')}; "
                     f"exact: {r.get('allocated_exact', '?')}); {r.get('events_rows', '?')} events() rows |")
    pr, pt = py.get("run") or {}, py.get("pytest") or {}
    lines.append(f"| `python -m memforensics run` | {status('python')} | exit {pr.get('exit', '?')} (the script's 3); "
                 f"peak reserved {pr.get('peak_reserved_bytes', '?')}; segment_map events after the script set "
                 f"expandable segments: {pr.get('segment_map_events', '?')} |")
    lines.append(f"| pytest `gpu_memory` marker | {status('python')} | "
                 f"{pt.get('skipped') or pt.get('outcomes', '?')}; reports {pt.get('reports', '?')} |")
    for name in ("compare", "compare_expandable", "env", "cupti", "python"):
        r = res[name] or {}
        errs = list(r.get("errors") or []) + list((r.get("oom_child") or {}).get("errors") or [])
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


def expandable_selftest_trace():
    """A trace as expandable segments make it: one segment's range mapped in two 2 MiB steps and
    unmapped in two at the end; allocs with Python stacks, frees with the alloc's stack (context
    "alloc")."""
    base = 0x7f2000000000
    mib = 1 << 20
    s1 = [{"filename": "/w/train.py", "line": 10, "name": "step"},
          {"filename": "/w/train.py", "line": 20, "name": "main"}]
    s2 = [{"filename": "/w/model.py", "line": 5, "name": "forward"}] + s1
    evs = []

    def ev(action, addr, size, frames=None):
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1000 + len(evs)}
        if frames is not None:
            e["frames"] = frames
        evs.append(e)

    ev("segment_map", base, 2 * mib)
    ev("alloc", base, mib, s1)
    ev("segment_map", base + 2 * mib, 2 * mib)
    ev("alloc", base + mib, 3 * mib, s2)
    ev("free_requested", base, mib, s1)
    ev("free_completed", base, mib, s1)
    ev("alloc", base, 512 * 1024, s2)
    ev("free_requested", base + mib, 3 * mib, s2)
    ev("free_completed", base + mib, 3 * mib, s2)
    ev("free_requested", base, 512 * 1024, s2)
    ev("free_completed", base, 512 * 1024, s2)
    ev("segment_unmap", base + 2 * mib, 2 * mib)
    ev("segment_unmap", base, 2 * mib)
    return evs


def write_pair(memforensics, out, name, events):
    """A PyTorch-format snapshot of device 0's events and its conversion to a native trace."""
    path = os.path.join(out, f"self_{name}.pickle")
    with open(path, "wb") as f:
        pickle.dump({"segments": [], "device_traces": [events]}, f, protocol=4)
    native = os.path.join(out, f"self_{name}.bin")
    run([memforensics, "convert", path, "-o", native, "--to", "native"])
    return path, native


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

    # Expandable segments (compare_expandable): segments are mapped and unmapped, never allocated.
    exp_events = expandable_selftest_trace()
    exp_theirs, exp_native = write_pair(args.memforensics, args.out, "expandable", exp_events)
    errors, st = compare_pair(args.memforensics, exp_theirs, exp_native, args.out)
    if errors or st["events_compared"] != len(exp_events) or st["alloc_stacks_compared"] < 3:
        failures.append(f"expandable segments: an agreeing pair does not compare equal: {errors[:3]} {st}")
    map2 = [i for i, e in enumerate(exp_events) if e["action"] == "segment_map"][1]
    exp_cases = {
        "size": ([dict(e, size=e["size"] + (2 << 20)) if i == map2 else e for i, e in enumerate(exp_events)],
                 "size"),
        "missing": ([e for e in exp_events if e["action"] != "segment_unmap"], "events"),
    }
    for name, (evs, needle) in exp_cases.items():
        bad = write_pair(args.memforensics, args.out, f"expandable_{name}", evs)[1]
        errors, _ = compare_pair(args.memforensics, exp_theirs, bad, args.out)
        if not any(needle in e for e in errors):
            failures.append(f"expandable segments: altered pair '{name}' not caught (errors: {errors[:3]})")
    # A child that died after its snapshot may go on unmapping.
    last_alloc = max(i for i, e in enumerate(exp_events) if e["action"] == "alloc")
    cut_theirs = write_pair(args.memforensics, args.out, "expandable_cut", exp_events[:last_alloc + 1])[0]
    errors, st = compare_pair(args.memforensics, cut_theirs, exp_native, args.out, prefix=True)
    if errors or st["events_after_snapshot"] != len(exp_events) - last_alloc - 1:
        failures.append(f"expandable segments, prefix: {errors[:3]} {st.get('events_after_snapshot')}")

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
    # compare's count of the CUDA graph's private-pool events reads pools the same way.
    n_pool = pool_events(args.memforensics, os.path.join(args.out, "self_cupti_None_1.bin"))
    if n_pool != sum(1 for x in exp if x[3]):
        failures.append(f"pool_events: {n_pool}, expected {sum(1 for x in exp if x[3])}")
    unmap_idx = next(i for i, x in enumerate(exp) if x[0] == "segment_unmap")
    for drop, needle in ((0, "missing segment_alloc"), (unmap_idx, "missing segment_unmap")):
        errors, _ = compare_cupti(calls, trace_of(exp, drop=drop))
        if not any(needle in e for e in errors):
            failures.append(f"CUPTI: dropped event {drop} not caught ({errors[:3]})")
    bad_async = [(a, ad, s, False) if a == "alloc" and asy else (a, ad, s, asy) for a, ad, s, asy in exp]
    errors, _ = compare_cupti(calls, trace_of(bad_async))
    if not any("stream-ordered" in e for e in errors):
        failures.append(f"CUPTI: a stream-ordered allocation without stream/pool not caught ({errors[:3]})")

    # hook-sources: the tree's lists, and a target list it cannot resolve refused.
    srcs = []
    try:
        srcs = [os.path.relpath(x, ROOT) for x in hook_sources()]
        for want in ("src/capture/torch_hook.cc", "src/capture/recorder.cc", "src/format/trace/trace_writer.cc",
                     "src/common/status.cc"):
            if want not in srcs:
                failures.append(f"hook-sources: {want} not in {srcs}")
    except (OSError, ValueError) as e:
        failures.append(f"hook-sources: {e}")
    with tempfile.TemporaryDirectory() as fake:
        for rel, text in (("src/capture/CMakeLists.txt", "set(MEMF_CAPTURE_CORE_SOURCES a.cc)\n"
                                                          "add_library(memforensics_torch SHARED h.cc ${other})\n"),
                          ("src/format/CMakeLists.txt", "add_library(memf_trace STATIC trace/t.cc)\n"),
                          ("src/common/CMakeLists.txt", "add_library(memf_common STATIC c.cc)\n"),
                          ("src/capture/h.cc", ""), ("src/capture/a.cc", ""), ("src/format/trace/t.cc", ""),
                          ("src/common/c.cc", "")):
            os.makedirs(os.path.dirname(os.path.join(fake, rel)), exist_ok=True)
            with open(os.path.join(fake, rel), "w") as f:
                f.write(text)
        try:
            hook_sources(fake)
            failures.append("hook-sources: an unknown ${other} in the target's sources not refused")
        except ValueError:
            pass

    # The report renders from fabricated sections, both compare runs as rows of their own.
    write_json(os.path.join(args.out, "sections.json"),
               {"build_hook": "ok", "build_cupti": "ok", "compare": "ok", "compare_expandable": "FAILED (exit 1)"})
    write_json(os.path.join(args.out, "build.json"), {"torch_route": "direct", "routes_tried": "python package direct",
                                                      "seconds": 41, "cupti": "/x/libcupti.so", "cupti_seconds": 17})
    write_json(os.path.join(args.out, "compare.json"),
               {"ok": True, "errors": [], "loop": {"events_compared": 1111, "alloc_stacks_compared": 222,
                                                   "max_time_difference_us": 3, "graph": True, "graph_pool_events": 17,
                                                   "alloc_conf": ""},
                "oom_child": {"exit_code": 1, "events_compared": 55, "errors": []}})
    os.makedirs(os.path.join(args.out, "expandable"), exist_ok=True)
    write_json(os.path.join(args.out, "expandable", "compare.json"),
               {"ok": False, "errors": ["device 0 event 9: size 4 (PyTorch) != 5 (hook)"],
                "loop": {"events_compared": 999, "alloc_stacks_compared": 111, "max_time_difference_us": 4,
                         "graph": False, "alloc_conf": "expandable_segments:True"}, "oom_child": {"skipped": True}})
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
    for needle in ("| hook vs `_record_memory_history` (training loop) | ok | PYTORCH_CUDA_ALLOC_CONF unset; 1111 events",
                   "CUDA graph: 17 private-pool events",
                   "| hook vs `_record_memory_history` (training loop, expandable segments) | FAILED (exit 1) | "
                   "PYTORCH_CUDA_ALLOC_CONF expandable_segments:True; 999 events",
                   "| compare_expandable: mismatch | | device 0 event 9: size 4 (PyTorch) != 5 (hook) |",
                   "| build `libmemforensics_torch.so` (on this machine) | ok | route: direct;",
                   "| OOM in a child process | ok | exit 1,"):
        if needle not in md:
            failures.append(f"report: no '{needle}' in results.md")
    for p in glob.glob(os.path.join(args.out, "self_*")):
        os.unlink(p)
    for p in ("compare.json", "expandable/compare.json", "build.json"):
        os.unlink(os.path.join(args.out, p))
    os.rmdir(os.path.join(args.out, "expandable"))
    if failures:
        for f_ in failures:
            print("SELFTEST FAILED:", f_, file=sys.stderr)
        sys.exit(1)
    print(f"selftest: snapshot/trace comparison ({stats['events_compared']} events; 4 alterations and the prefix "
          f"rule caught), expandable segments ({len(exp_events)} events; 2 alterations and the prefix rule caught), "
          f"CUPTI call-log comparison ({len(exp)} expected events; 3 alterations caught), pool count, "
          f"hook-sources ({len(srcs)} files), report with both compare runs: OK")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["compare", "oom-child", "env", "overhead", "cupti", "report", "selftest",
                                    "hook-sources"])
    p.add_argument("--lib")
    p.add_argument("--memforensics")
    p.add_argument("--out", default="/tmp/memf_gpu_check")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--config", default="baseline")
    p.add_argument("--time-tolerance-us", type=int, default=2000)
    p.add_argument("--calls-program")
    p.add_argument("--cupti-lib")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True,
                   help="compare: capture and replay a CUDA graph after the loop (default on)")
    p.add_argument("--no-oom-child", dest="oom_child", action="store_false",
                   help="compare: leave out the child process that dies of an OOM")
    args = p.parse_args()
    needs_gpu = args.mode in ("compare", "oom-child", "overhead")  # env's parent only starts a child
    if needs_gpu and not torch_module().cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        sys.exit(2)
    {"compare": compare, "oom-child": oom_child, "env": env_start, "overhead": overhead, "cupti": cupti,
     "report": report, "selftest": selftest, "hook-sources": print_hook_sources}[args.mode](args)


if __name__ == "__main__":
    main()
