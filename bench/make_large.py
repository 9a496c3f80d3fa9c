#!/usr/bin/env python3
"""Build a large synthetic snapshot for benchmarks by replicating one device N times.

Usage:
    python3 bench/make_large.py IN.pickle N -o OUT.pickle

Device 0's trace, segments and external annotations of IN are copied N times as devices
0..N-1 (segments' and annotations' "device" field renumbered).  Every copy is a
copy.deepcopy (its own dicts and lists; immutable strings stay shared, like PyTorch's interned
key strings), so the output grows about N-fold instead of collapsing into pickle memo
references, while the sharing *inside* one copy (frame dicts, frames lists) is kept.  Other
top-level keys (allocator_settings, ...) are kept as they are.  The wedsonlin training snapshot
(3.1 MB) at N=100 gives about 374 MB.
The output is written with pickle protocol 4, like torch.cuda.memory._dump_snapshot.
IN is loaded with a data-only unpickler (no imports, no code).
"""

import argparse
import copy as copy_module
import io
import os
import pickle
import sys


class DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("refusing global %s.%s" % (module, name))


def data_only_loads(blob):
    return DataOnlyUnpickler(io.BytesIO(blob)).load()


def main(argv=None):
    ap = argparse.ArgumentParser(description="Replicate device 0 of a snapshot as N devices.")
    ap.add_argument("input")
    ap.add_argument("n", type=int)
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error("N must be >= 1")

    with open(args.input, "rb") as f:
        obj = data_only_loads(f.read())
    if isinstance(obj, list):
        obj = {"segments": obj, "device_traces": []}
    if not isinstance(obj, dict):
        print("make_large: %s is not a snapshot" % args.input, file=sys.stderr)
        return 1

    traces = obj.get("device_traces") or []
    device0 = {
        "segments": [s for s in obj.get("segments", []) if s.get("device") == 0],
        "trace": traces[0] if traces else [],
        "annotations": [a for a in obj.get("external_annotations", [])
                        if a.get("device", 0) == 0],
    }
    if not device0["segments"] and not device0["trace"]:
        print("make_large: %s has nothing on device 0" % args.input, file=sys.stderr)
        return 1

    had_annotations = "external_annotations" in obj
    out = {k: v for k, v in obj.items()
           if k not in ("segments", "device_traces", "external_annotations")}
    del obj, traces
    segments, out_traces, annotations = [], [], []
    for dev in range(args.n):
        # device 0 keeps the original objects; every further device gets its own deep copy
        copy = device0 if dev == 0 else copy_module.deepcopy(device0)
        for s in copy["segments"]:
            s["device"] = dev
        for a in copy["annotations"]:
            a["device"] = dev
        segments.extend(copy["segments"])
        out_traces.append(copy["trace"])
        annotations.extend(copy["annotations"])
    annotations.sort(key=lambda a: a.get("time_us", 0))   # one time-ordered buffer

    result = {"segments": segments, "device_traces": out_traces}
    result.update(out)
    if had_annotations:
        result["external_annotations"] = annotations

    tmp = args.output + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(result, f, protocol=4)
    os.replace(tmp, args.output)
    print("make_large: wrote %s (%d devices, %.1f MB)"
          % (args.output, args.n, os.path.getsize(args.output) / 1e6), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
