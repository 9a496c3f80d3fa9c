#!/usr/bin/env python3
"""Writes small seed inputs for fuzz_pickle from real snapshot pickles.

Usage: make_seeds.py OUT_DIR SNAPSHOT.pickle...

A real snapshot is 0.1-3 MB: at that size a fuzzer runs a few inputs per second and spends them
re-reading the same trace. The seeds keep what makes each file different (its PyTorch era's keys,
its pickle protocol, frames lists shared through the memo, history entries, annotations,
allocator settings) and little of its bulk:

  * <name>.min.pickle: the snapshot with at most 6 segments, 6 blocks per segment (the cut ones
    merged into one inactive block, so blocks still tile their segment), 2 history entries,
    5 frames per stack, 48 trace entries per device and 8 items in any other list, pickled again
    with the file's protocol (shared objects stay shared, so BINGET/MEMOIZE paths are exercised);
  * <name>.pickle: the file itself when it is at most 64 KiB;
  * for the first input only: the minimised snapshot as JSON, as a memory_viz HTML page, and
    pickled with protocol 2 (BINPUT/BINGET memo, no FRAME), so every loader path has a seed.

Files are read with an Unpickler that refuses every global (ref_replay.py does the same), so a
hostile file cannot run code here. Inputs that are not data-only pickles are skipped.
"""

import base64
import io
import json
import os
import pickle
import sys

SMALL = 64 * 1024
LIMITS = {"segments": 6, "blocks": 6, "history": 2, "frames": 5}
TRACE_ENTRIES = 48
OTHER_LISTS = 8


class DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing global {module}.{name}")


def shrink(obj, key=None, seen=None):
    """Copy of obj with long lists cut; an object shared in the input is shared in the copy."""
    if seen is None:
        seen = {}
    if id(obj) in seen:
        return seen[id(obj)]
    if isinstance(obj, dict):
        out = {}
        seen[id(obj)] = out
        for k, v in obj.items():
            out[k] = shrink(v, k, seen)
        return out
    if isinstance(obj, list) and key == "blocks" and len(obj) > LIMITS["blocks"]:
        # Blocks must tile their segment: the cut ones become one inactive block.
        keep, rest = obj[: LIMITS["blocks"] - 1], obj[LIMITS["blocks"] - 1 :]
        tail = {"size": sum(b.get("size", 0) for b in rest), "requested_size": 0, "state": "inactive"}
        if "address" in rest[0]:
            tail = {"address": rest[0]["address"], **tail}
        out = []
        seen[id(obj)] = out
        out.extend(shrink(v, None, seen) for v in keep)
        out.append(tail)
        return out
    if isinstance(obj, list):
        if key == "device_traces":  # one list per device: keep every device, shorten each trace
            limit = None
        elif key == "_trace":
            limit = TRACE_ENTRIES
        else:
            limit = LIMITS.get(key, OTHER_LISTS)
        out = []
        seen[id(obj)] = out
        child = "_trace" if key == "device_traces" else None
        out.extend(shrink(v, child, seen) for v in (obj if limit is None else obj[:limit]))
        return out
    if isinstance(obj, tuple):
        out = tuple(shrink(v, None, seen) for v in obj)
        seen[id(obj)] = out
        return out
    return obj


def html_page(pk):
    pk = pk + b"\0" * (-len(pk) % 3)  # what torch.cuda._memory_viz does before base64
    b64 = base64.b64encode(pk).decode()
    return ("<!DOCTYPE html><html><head></head><body><script type=\"module\">\n"
            f"const data = [{{\"name\": \"snapshot.pickle\", \"base64\": \"{b64}\"}}];\n"
            "</script></body></html>\n").encode()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    first = True
    written = 0
    for path in sys.argv[2:]:
        with open(path, "rb") as f:
            data = f.read()
        name = os.path.splitext(os.path.basename(path))[0]
        if len(data) <= SMALL:
            with open(os.path.join(out_dir, name + ".pickle"), "wb") as f:
                f.write(data)
            written += 1
        try:
            snap = DataOnlyUnpickler(io.BytesIO(data)).load()
        except Exception as e:  # not a data-only pickle: nothing to minimise
            print(f"make_seeds: skipping {path}: {e}", file=sys.stderr)
            continue
        proto = data[1] if len(data) > 1 and data[0] == 0x80 else 2
        small = shrink(snap)
        pk = pickle.dumps(small, protocol=min(proto, pickle.HIGHEST_PROTOCOL))
        with open(os.path.join(out_dir, name + ".min.pickle"), "wb") as f:
            f.write(pk)
        written += 1
        if first:
            first = False
            with open(os.path.join(out_dir, name + ".min.json"), "w") as f:
                json.dump(small, f, default=repr)
            with open(os.path.join(out_dir, name + ".min.html"), "wb") as f:
                f.write(html_page(pk))
            with open(os.path.join(out_dir, name + ".min.p2.pickle"), "wb") as f:
                f.write(pickle.dumps(small, protocol=2))
            written += 3
    print(f"make_seeds: {written} seeds in {out_dir}")


if __name__ == "__main__":
    main()
