#!/usr/bin/env python3
"""GPU validation of libmemforensics_torch.so (run by scripts/gpu-check.sh; needs a CUDA GPU and
PyTorch >= 2.2).

  gpu_check.py compare  --lib LIB --memforensics BIN --out DIR
      A small training loop with PyTorch's own history (_record_memory_history, context "alloc",
      Python stacks) and the hook recording at the same time, plus a caught OOM. PyTorch's snapshot
      and the native trace must agree event by event (action, address, size, stream, stack; times
      within a tolerance) and in `memforensics analyze --json` (events by action, peaks, final
      state). Exits 1 on any mismatch, printing the first ones.
  gpu_check.py env      --lib LIB --memforensics BIN --out DIR
      MEMFORENSICS_OUT starts the recording when the library is loaded.
  gpu_check.py overhead --lib LIB --config CONFIG --steps N
      Median step time of the loop under one configuration (one process each: the tracker cannot be
      detached): baseline, history (PyTorch's history with Python stacks, no hook), hook (no
      stacks), hook_stacks (hook + Python stacks through PyTorch's context capture), hook_native
      (hook + C++ return addresses). Prints one JSON line.
"""
import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import time

import torch


def model_and_data(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096), torch.nn.GELU(),
        torch.nn.Linear(4096, 1024)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device=device)
    y = torch.randn(256, 1024, device=device)
    return model, opt, x, y


def step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    # A few temporaries of varied sizes, so that the caching allocator splits and reuses blocks.
    for k in range(1, 6):
        t = torch.empty(k * 123457, device=x.device)
        del t


def record_history(max_entries):
    # Keyword form accepted from 2.1 on.
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=max_entries)


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def analyze(binary, path):
    out = run([binary, "analyze", path, "--json"])
    return json.loads(out.splitlines()[0])


def fail(msgs):
    for m in msgs[:40]:
        print("MISMATCH:", m, file=sys.stderr)
    if len(msgs) > 40:
        print(f"... and {len(msgs) - 40} more", file=sys.stderr)
    sys.exit(1)


def frames_key(frames):
    return [(f.get("filename"), f.get("line"), f.get("name")) for f in frames or []]


def compare(args):
    os.makedirs(args.out, exist_ok=True)
    native = os.path.join(args.out, "hook.bin")
    theirs = os.path.join(args.out, "pytorch.pickle")
    ours_pickle = os.path.join(args.out, "hook.pickle")
    torch.cuda.init()
    record_history(1_000_000)
    torch.ops.load_library(args.lib)
    assert torch.ops.memforensics.start(native, True, False), "start() failed"
    model, opt, x, y = model_and_data("cuda")
    for _ in range(args.steps):
        step(model, opt, x, y)
    torch.cuda.synchronize()
    # An OOM: the hook must have it in the file before the exception reaches us (observer flush).
    free, total = torch.cuda.mem_get_info()
    try:
        torch.empty(int(total * 4) // 4 + (1 << 30), dtype=torch.float32, device="cuda")
        print("warning: the oversized allocation succeeded; no OOM in this run", file=sys.stderr)
        expect_oom = False
    except torch.cuda.OutOfMemoryError:
        expect_oom = True
    if expect_oom:
        mid = analyze(args.memforensics, native)  # still recording: read up to the last chunk
        if sum(d.get("oom_count", 0) for d in mid["devices"]) < 1:
            fail(["the OOM is not in the native trace right after OutOfMemoryError (no flush on OOM)"])
    step(model, opt, x, y)
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(theirs)
    assert torch.ops.memforensics.stop(), "stop() failed"
    torch.cuda.memory._record_memory_history(enabled=None)

    run([args.memforensics, "convert", native, "-o", ours_pickle, "--to", "pickle"])
    with open(theirs, "rb") as f:
        a = pickle.load(f)
    with open(ours_pickle, "rb") as f:
        b = pickle.load(f)
    errors = []
    ndev = max(len(a["device_traces"]), len(b["device_traces"]))
    max_dt = 0
    compared = 0
    for d in range(ndev):
        ta = [e for e in (a["device_traces"][d] if d < len(a["device_traces"]) else []) if e["action"] != "snapshot"]
        tb = [e for e in (b["device_traces"][d] if d < len(b["device_traces"]) else []) if e["action"] != "snapshot"]
        if len(ta) != len(tb):
            errors.append(f"device {d}: PyTorch has {len(ta)} events, the hook {len(tb)}")
        for i, (ea, eb) in enumerate(zip(ta, tb)):
            compared += 1
            for k in ("action", "addr", "size", "stream"):
                if ea.get(k) != eb.get(k):
                    errors.append(f"device {d} event {i}: {k} {ea.get(k)!r} (PyTorch) != {eb.get(k)!r} (hook)")
            if "time_us" in ea and "time_us" in eb:
                dt = abs(ea["time_us"] - eb["time_us"])
                max_dt = max(max_dt, dt)
                if dt > args.time_tolerance_us:
                    errors.append(f"device {d} event {i}: time_us differs by {dt} us")
            if "frames" in ea and ea["action"] == "alloc" and frames_key(ea["frames"]) != frames_key(eb.get("frames")):
                errors.append(f"device {d} event {i}: stacks differ: {frames_key(ea['frames'])[:3]} vs "
                              f"{frames_key(eb.get('frames'))[:3]}")
    ja, jb = analyze(args.memforensics, theirs), analyze(args.memforensics, native)
    da = {x["device"]: x for x in ja["devices"]}
    db = {x["device"]: x for x in jb["devices"]}
    if set(da) != set(db):
        errors.append(f"devices differ: {sorted(da)} vs {sorted(db)}")
    for dev in set(da) & set(db):
        x, y = da[dev], db[dev]
        ca = {k: v for k, v in x["events_by_action"].items() if k != "snapshot"}
        cb = {k: v for k, v in y["events_by_action"].items() if k != "snapshot"}
        if ca != cb:
            errors.append(f"device {dev}: events by action {ca} (PyTorch) != {cb} (hook)")
        for k in ("peak_reserved_bytes", "peak_requested_bytes", "peak_allocated_bytes", "peak_active_bytes",
                  "final_reserved_bytes", "final_requested_bytes", "final_allocated_bytes", "segments", "oom_count"):
            if x.get(k) != y.get(k):
                errors.append(f"device {dev}: {k} {x.get(k)} (PyTorch) != {y.get(k)} (hook)")
    warn = jb["input"].get("warnings") or []
    if any("dropped" in w for w in warn):
        errors.append(f"the hook dropped events: {warn}")
    if errors:
        fail(errors)
    print(f"compare: {compared} events agree (max time difference {max_dt} us); analyze agrees on "
          f"{len(da)} device(s); native {os.path.getsize(native)} bytes vs pickle {os.path.getsize(theirs)} bytes")


def env_start(args):
    os.makedirs(args.out, exist_ok=True)
    native = os.path.join(args.out, "env.bin")
    code = (
        "import torch, sys\n"
        "torch.cuda.init()\n"
        f"torch.ops.load_library({args.lib!r})\n"
        "x = torch.empty(1 << 20, device='cuda'); del x\n"
    )
    env = dict(os.environ, MEMFORENSICS_OUT=native)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    j = analyze(args.memforensics, native)
    allocs = sum(d["events_by_action"].get("alloc", 0) for d in j["devices"])
    if allocs < 1 or j["input"].get("warnings"):
        fail([f"MEMFORENSICS_OUT: {allocs} allocs, warnings {j['input'].get('warnings')}"])
    print(f"env: MEMFORENSICS_OUT recorded {allocs} allocations, file complete")


def overhead(args):
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
    print(json.dumps({"config": cfg, "median_step_ms": statistics.median(times), "file_bytes": size}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["compare", "env", "overhead"])
    p.add_argument("--lib", required=True)
    p.add_argument("--memforensics")
    p.add_argument("--out", default="/tmp/memf_gpu_check")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--config", default="baseline")
    p.add_argument("--time-tolerance-us", type=int, default=2000)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        sys.exit(2)
    {"compare": compare, "env": env_start, "overhead": overhead}[args.mode](args)


if __name__ == "__main__":
    main()
