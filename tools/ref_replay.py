#!/usr/bin/env python3
"""Independent reference replay of a PyTorch CUDA memory snapshot, for cross-checking tests.

Usage:
    python3 tools/ref_replay.py FILE.pickle

Prints one JSON object:
    {"devices": [{"device": d, "events": n,
                  "peak_reserved_bytes": ..., "peak_requested_bytes": ...,
                  "final_reserved_bytes": ..., "final_requested_bytes": ...,
                  "start_reserved_bytes": ..., "start_requested_bytes": ...,
                  "consistent": true, "untrusted": []}, ...]}
for every device that has segments or a non-empty trace, sorted by device.

Method (deliberately unlike a live-block replay): arithmetic on totals only.
  * final_reserved  = sum of total_size of the device's segments;
    final_requested = sum of requested_size of its active_allocated / active_pending_free
    blocks (fallbacks: history[0]['real_size'], then size).
  * Walk the trace backwards from the final totals to get the start totals: undo
    segment_alloc/segment_map (-size) and segment_free/segment_unmap (+size) for reserved;
    undo alloc (-size) and free_completed (+size) for requested.  If the trace has
    free_requested events but no free_completed at all (skip_actions) and the final state has
    no pending-free blocks, free_requested takes the role of free_completed.
  * Walk forward from the start totals; peak = max(start, every running value).
  * Consistency: a total that goes below zero anywhere on the way back (at the start or after
    any event) means the trace cannot have led to the final state (e.g. the trace stops before
    the segments were taken: allocs that the final state never shows freed). Then the start and
    the peaks are unknowable: "consistent": false, "untrusted": ["start", "peaks"], and the
    start_* and peak_* figures are null (never a negative byte count). The final_* figures are
    the file's own and stay.

The file is loaded with an Unpickler whose find_class always raises, so a pickle that tries to
import anything (i.e. run code) is rejected instead of executed.
"""

import io
import json
import pickle
import sys

ACTIVE_STATES = ("active_allocated", "active_pending_free")


class DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("refusing global %s.%s: not a data-only snapshot"
                                     % (module, name))


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    return DataOnlyUnpickler(io.BytesIO(data)).load()


def block_requested(block):
    if "requested_size" in block:
        return block["requested_size"]
    hist = block.get("history")
    if hist:
        return hist[0]["real_size"]
    return block["size"]


def replay_device(device, segments, trace):
    final_reserved = sum(s["total_size"] for s in segments)
    final_requested = sum(block_requested(b)
                          for s in segments for b in s.get("blocks", [])
                          if b.get("state") in ACTIVE_STATES)

    actions = set(e.get("action") for e in trace)
    free_action = "free_completed"
    # skip_actions=["free_completed"] leaves free_requested as the only free; but a trace whose
    # frees are merely still pending also has no free_completed, and then the final state holds
    # active_pending_free blocks. Only without those does free_requested stand in.
    any_pending = any(b.get("state") == "active_pending_free"
                      for s in segments for b in s.get("blocks", []))
    if "free_completed" not in actions and "free_requested" in actions and not any_pending:
        free_action = "free_requested"

    def deltas(entry):
        """(reserved delta, requested delta) the entry applied going forward."""
        a = entry.get("action")
        size = entry.get("size", 0)
        if a in ("segment_alloc", "segment_map"):
            return size, 0
        if a in ("segment_free", "segment_unmap"):
            return -size, 0
        if a == "alloc":
            return 0, size
        if a == free_action:
            return 0, -size
        return 0, 0

    reserved, requested = final_reserved, final_requested
    lowest = min(reserved, requested)
    for entry in reversed(trace):
        dr, dq = deltas(entry)
        reserved -= dr
        requested -= dq
        lowest = min(lowest, reserved, requested)
    start_reserved, start_requested = reserved, requested
    consistent = lowest >= 0

    peak_reserved, peak_requested = reserved, requested
    for entry in trace:
        dr, dq = deltas(entry)
        reserved += dr
        requested += dq
        peak_reserved = max(peak_reserved, reserved)
        peak_requested = max(peak_requested, requested)

    def known(v):
        return v if consistent else None

    return {
        "device": device,
        "events": len(trace),
        "peak_reserved_bytes": known(peak_reserved),
        "peak_requested_bytes": known(peak_requested),
        "final_reserved_bytes": final_reserved,
        "final_requested_bytes": final_requested,
        "start_reserved_bytes": known(start_reserved),
        "start_requested_bytes": known(start_requested),
        "consistent": consistent,
        "untrusted": [] if consistent else ["start", "peaks"],
    }


def replay(obj):
    if isinstance(obj, list):            # bare segment list (1.13 / memory_snapshot())
        obj = {"segments": obj, "device_traces": []}
    if not isinstance(obj, dict):
        raise ValueError("top-level object is %s, not a snapshot dict or list"
                         % type(obj).__name__)
    segments = obj.get("segments") or []
    traces = obj.get("device_traces") or []
    by_device = {}
    for s in segments:
        by_device.setdefault(s["device"], []).append(s)
    devices = set(by_device)
    devices.update(i for i, t in enumerate(traces) if t)
    out = []
    for d in sorted(devices):
        trace = traces[d] if d < len(traces) else []
        out.append(replay_device(d, by_device.get(d, []), trace))
    return {"devices": out}


def main(argv):
    if len(argv) != 2:
        print("usage: ref_replay.py FILE.pickle", file=sys.stderr)
        return 2
    try:
        result = replay(load(argv[1]))
    except (OSError, pickle.UnpicklingError, ValueError, KeyError, TypeError, EOFError) as e:
        print("ref_replay: %s: %s" % (argv[1], e), file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
