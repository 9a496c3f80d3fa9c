#!/usr/bin/env python3
"""roundtrip_deep: pickle -> native trace -> pickle through `memforensics convert` keeps every field
of the input as Python loads it (tools/compare_pickles.py --deep), except what `convert` itself said
the output does not keep (its "does not keep" warnings), on every real snapshot in ../shared, the
sample and the scenarios; and on fabricated 2.0-era files whose legacy block history and list-valued
settings cannot be kept, the warnings must appear and name exactly those differences.

Usage: roundtrip_deep_test.py BIN SOURCE_DIR REAL_DIR
"""
import glob
import os
import pickle
import subprocess
import sys
import tempfile

BIN, SRC, REAL = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(SRC, "tools"))
import compare_pickles  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def allowances(warnings, top_level_list):
    """The compare_pickles --allow patterns that the converter's warnings account for."""
    root = "" if top_level_list else "segments"
    allow = []
    if "entries after each block's first" in warnings:
        allow.append(f"{root}[*].blocks[*].history.__len__")
    if "first entries' addr or real_size" in warnings:
        allow.append(f"{root}[*].blocks[*].history[*].addr")
        allow.append(f"{root}[*].blocks[*].history[*].real_size")
    for line in warnings.splitlines():
        if "allocator_settings values that are lists or dicts" in line:
            names = line.split("(", 1)[1].rsplit(")", 1)[0]
            for n in names.split(", "):
                if n.startswith("'") and n.endswith("'"):
                    allow.append(f"allocator_settings.{n[1:-1]}")
    return allow


def round_trip(path, tmp):
    """(differences left after the declared ones, the converter's warnings)."""
    stem = os.path.join(tmp, os.path.basename(path))
    p1 = subprocess.run([BIN, "convert", path, "-o", stem + ".bin"], capture_output=True, text=True)
    p2 = subprocess.run([BIN, "convert", stem + ".bin", "-o", stem + ".rt.pickle"], capture_output=True,
                        text=True)
    if p1.returncode != 0 or p2.returncode != 0:
        return [("(convert)", p1.stderr + p2.stderr)], ""
    original = compare_pickles.load(path)
    written = compare_pickles.load(stem + ".rt.pickle")
    allow = allowances(p1.stderr, isinstance(original, list))
    return compare_pickles.deep_differences(original, written, allow), p1.stderr


def main():
    inputs = sorted(glob.glob(os.path.join(SRC, "snapshots", "*.pickle")) +
                    glob.glob(os.path.join(SRC, "snapshots", "scenarios", "*.pickle")))
    if os.path.isdir(REAL):
        inputs += sorted(glob.glob(os.path.join(REAL, "*.pickle")))
    else:
        print(f"roundtrip_deep: no real snapshots at {REAL} (../shared absent): only the repository's files")
    with tempfile.TemporaryDirectory() as tmp:
        declared = 0
        for path in inputs:
            diffs, warnings = round_trip(path, tmp)
            declared += bool(warnings.strip())
            for where, what in diffs[:5]:
                check(False, f"{os.path.basename(path)}: {where}: {what}")
        print(f"roundtrip_deep: {len(inputs)} files, {len(inputs) - len(set(failures))} equal as Python loads "
              f"them after pickle -> native -> pickle; {declared} with declared losses")

        # A 2.0-era snapshot whose blocks carry several history entries (a merged free block's
        # first entry at another address), and settings with a list value: each loss is declared.
        seg = 0x7F0000000000
        frames = [{"filename": "train.py", "line": 12, "name": "step"}]
        legacy = {
            "segments": [{
                "device": 0, "address": seg, "total_size": 2 << 20, "allocated_size": 1 << 20,
                "active_size": 1 << 20, "requested_size": 1000000, "stream": 0, "segment_type": "large",
                "blocks": [
                    {"size": 1 << 20, "requested_size": 1000000, "state": "active_allocated",
                     "history": [{"addr": seg, "real_size": 1000000, "frames": frames},
                                 {"addr": seg, "real_size": 4096, "frames": []}]},
                    {"size": 1 << 20, "requested_size": 0, "state": "inactive",
                     "history": [{"addr": seg + 4096, "real_size": 512, "frames": frames}]},
                ]}],
            "device_traces": [[]],
        }
        lp = os.path.join(tmp, "legacy.pickle")
        with open(lp, "wb") as f:
            pickle.dump(legacy, f, protocol=2)
        diffs, warnings = round_trip(lp, tmp)
        check("1 entries after each block's first" in warnings, f"legacy history: entries declared ({warnings!r})")
        check("1 first entries' addr or real_size" in warnings, f"legacy history: the moved first entry declared ({warnings!r})")
        check(not diffs, f"legacy history: only declared differences ({diffs})")
        written = compare_pickles.load(os.path.join(tmp, "legacy.pickle.rt.pickle"))
        check(compare_pickles.deep_differences(legacy, written), "legacy history: the loss is real (not allowed, it differs)")

        settings = dict(legacy, allocator_settings={
            "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128", "max_split_size": 128 << 20,
            "garbage_collection_threshold": 0.0, "expandable_segments": False,
            "release_lock_on_cudamalloc": True, "future_list_key": [1, 2, 3], "future_dict_key": {"a": 1}})
        for b in settings["segments"][0]["blocks"]:
            b["history"] = b["history"][:1]
            b["history"][0]["addr"] = seg if b["state"] != "inactive" else seg + (1 << 20)
            b["history"][0]["real_size"] = b["requested_size"]
        sp = os.path.join(tmp, "settings.pickle")
        with open(sp, "wb") as f:
            pickle.dump(settings, f, protocol=4)
        diffs, warnings = round_trip(sp, tmp)
        check("2 allocator_settings values that are lists or dicts ('future_list_key', 'future_dict_key')" in warnings,
              f"settings: list and dict values declared by key ({warnings!r})")
        check("legacy history" not in warnings, f"settings: no legacy-history loss claimed ({warnings!r})")
        check(not diffs, f"settings: only declared differences ({diffs})")

        clean = os.path.join(SRC, "snapshots", "sample_training.pickle")
        p = subprocess.run([BIN, "convert", clean, "-o", os.path.join(tmp, "clean.bin")], capture_output=True, text=True)
        check(p.returncode == 0 and "does not keep" not in p.stderr, f"the sample: no loss declared ({p.stderr!r})")
    if failures:
        print(f"roundtrip_deep: {len(failures)} failure(s)")
        return 1
    print("roundtrip_deep: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
