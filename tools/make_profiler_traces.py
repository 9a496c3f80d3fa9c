#!/usr/bin/env python3
"""Fabricated torch.profiler outputs for the profiler reader's tests and fuzz seeds.

    tools/make_profiler_traces.py OUT_DIR [--seeds] [--no-bomb]

Writes Kineto chrome traces (plain and gzip) and export_memory_timeline files of known content
(docs/profiler-traces.md): nested ops on two threads, several devices with CPU events, frees
without allocs, the 2021 format (Bytes only), both timeline forms, and hostile ones (huge and
negative Bytes, a NaN ts, deep JSON, deep op nesting, a cut gzip stream, a gzip bomb). Output is
deterministic (gzip with mtime 0). --seeds writes only the small ones (fuzz/corpus/fuzz_profiler);
--no-bomb leaves out the 400 MiB (decompressed) bomb.
"""
import argparse
import gzip
import io
import json
import os


def mem(ts, nbytes, addr=None, dev=0, ta=None, tr=None, tid=1, dev_type=1, ev_idx=None):
    args = {"Device Type": dev_type, "Device Id": dev, "Bytes": nbytes}
    if addr is not None:
        args["Addr"] = addr
    if ta is not None:
        args["Total Allocated"] = ta
    if tr is not None:
        args["Total Reserved"] = tr
    if ev_idx is not None:
        args["Ev Idx"] = ev_idx
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 7,
            "tid": tid, "ts": ts, "args": args}


def op(cat, name, ts, dur, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur,
            "args": {"Input Dims": [[4, 4], []]}}


def trace(events, **top):
    d = {"schemaVersion": 1}
    d.update(top)
    d["traceEvents"] = events
    return json.dumps(d, indent=None).encode()


def gz(data):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as f:
        f.write(data)
    return buf.getvalue()


def with_totals(items, dev=0, reserved_step=1 << 21):
    """[(ts, bytes, addr, stack-ops...)] -> [memory] events with running totals."""
    out, ta, tr = [], 0, 0
    for ts, nbytes, addr in items:
        ta += nbytes
        while tr < ta:
            tr += reserved_step
        out.append(mem(ts, nbytes, addr, dev, ta, tr))
    return out


def small_traces():
    files = {}
    # A training step: ProfilerStep > python frames > ops, allocations inside, a free at the end.
    step = [
        op("user_annotation", "ProfilerStep#1", 0, 1000),
        op("python_function", "train.py(20): train_step", 1, 990),
        op("python_function", "model.py(8): forward", 5, 400),
        op("cpu_op", "aten::linear", 10, 100),
        op("cpu_op", "aten::addmm", 12, 50),
        op("cpu_op", "aten::relu", 200, 50),
        op("python_function", "train.py(25): backward", 500, 300),
        op("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 510, 100, tid=2),
        op("cpu_op", "aten::mm", 520, 50, tid=2),
    ] + with_totals([(20, 1 << 20, 0x7f0000000000), (210, 1 << 20, 0x7f0000100000),
                     (530, 4 << 20, 0x7f0000200000), (700, -(4 << 20), 0x7f0000200000),
                     (900, -(1 << 20), 0x7f0000100000)])
    for e in step:
        if e.get("name") == "[memory]" and e["ts"] == 530:
            e["tid"] = 2
    props = [{"id": 0, "name": "Fabricated GPU", "totalGlobalMem": 16 << 30}]
    files["step.json"] = trace(step, deviceProperties=props,
                               distributedInfo={"backend": "nccl", "rank": 0, "world_size": 1})
    files["step.json.gz"] = gz(files["step.json"])
    # Two CUDA devices and CPU events (ignored).
    files["devices.json"] = trace(
        with_totals([(1, 512, 0x1000), (2, 1024, 0x2000), (3, -512, 0x1000)], dev=0) +
        with_totals([(1, 4096, 0x1000), (5, 8192, 0x9000)], dev=2) +
        [mem(4, 64, 0x10, dev=-1, dev_type=0)])
    # Frees of blocks from before the profile; Total Allocated says 3 MiB were there.
    files["frees_without_allocs.json"] = trace([
        mem(1, 1 << 20, 0x5000, 0, (3 << 20) + (1 << 20), 8 << 20),
        mem(2, -(2 << 20), 0x9000, 0, 2 << 20, 8 << 20),
        mem(3, -(1 << 20), 0x5000, 0, 1 << 20, 8 << 20)])
    # The 2021 format: Bytes, Device Type, Device Id only. Running sum peak: 6000.
    files["old_format_2021.json"] = trace(
        [op("cpu_op", "aten::empty", 0, 10)] +
        [mem(t, b) for t, b in [(1, 1000), (2, 2000), (3, -1000), (4, 4000), (5, -2000),
                                (6, -4000)]])
    # export_memory_timeline: raw rows [time_ns, action, bytes, category] and [times, sizes].
    raw = [[-1, 1, 4096, 0], [-1, 1, 4096, 1], [1000, 2, 8192, 4], [2000, 3, -8192, 4],
           [2000, 3, 8192, 5], [3000, 2, 512, 3], [4000, 4, -512, 3], [5000, 4, -8192, 5]]
    files["timeline.raw.json.gz"] = gz(json.dumps(raw).encode())
    files["timeline.json"] = json.dumps(
        [[10, 20, 30], [[0, 100, 0, 0, 0, 0, 0, 0, 0], [0, 100, 0, 0, 0, 900, 0, 0, 0],
                        [0, 100, 0, 0, 0, 300, 0, 0, 0]]]).encode()
    # Hostile values: huge and negative Bytes, out-of-range ids, a NaN ts (a JSON error).
    files["hostile_values.json"] = trace([
        mem(1, 512, 1), mem(2, 18446744073709551615, 5), mem(2, -9223372036854775808, 5),
        mem(-5, 512, 6), mem(3, 512, 6, dev=99999999999), mem(3, 1 << 62, 7, ta=-3)])
    files["hostile_nan_ts.json"] = b'{"traceEvents": [{"ph": "i", "name": "[memory]", "ts": NaN}]}'
    files["hostile_deep_json.json"] = b'{"traceEvents": [' + b"[" * 500 + b"]" * 500 + b"]}"
    files["hostile_deep_ops.json"] = trace(
        [op("cpu_op", "op%d" % i, i, 10000 - i) for i in range(300)] + [mem(5000, 512, 1)])
    files["hostile_cut.json.gz"] = files["step.json.gz"][: len(files["step.json.gz"]) // 2]
    return files


def write_bomb(path, mib=400):
    """A valid trace whose text is `mib` MiB of JSON whitespace: ~0.4 MB compressed."""
    with open(path, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as f:
            f.write(b'{"traceEvents": [')
            chunk = b" " * (1 << 20)
            for _ in range(mib):
                f.write(chunk)
            f.write(b"]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seeds", action="store_true", help="only the small files (fuzz seeds)")
    ap.add_argument("--no-bomb", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name, data in small_traces().items():
        with open(os.path.join(a.out, name), "wb") as f:
            f.write(data)
    if not a.seeds and not a.no_bomb:
        write_bomb(os.path.join(a.out, "hostile_bomb.json.gz"))


if __name__ == "__main__":
    main()
