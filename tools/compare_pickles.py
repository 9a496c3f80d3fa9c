#!/usr/bin/env python3
"""compare_pickles.py: checks a snapshot pickle written by memforensics against the original.

Both files are loaded with Python's own pickle module (an independent reader: not our C++ one),
through an unpickler that refuses to import anything, so only plain data loads. Then every key the
memforensics model keeps must be equal: segments with their blocks, device_traces entry by entry
(action, addr, device_free, size, stream, time_us, frames, compile_context, user_metadata,
pool_id), the allocator_settings fields the model reads and every other settings key with a scalar
value, and external_annotations. Values are
compared as the model reads them: segments grouped by device (a stable sort: memforensics writes
them so), a block's address falls back to the running offset in its segment,
and its frames and requested size to the legacy history[0] entry; frames are compared as
(filename, line, name) triples.

With --deep, everything Python loads must be equal instead (every key, every list item, every
type but int/float widths), except under paths matching an --allow pattern: a difference the
converter declared ("does not keep ..."). Paths read like segments[3].blocks[0].history[2].addr;
a pattern is an fnmatch pattern over that path with the indexes written [*] (e.g.
"segments[*].blocks[*].history[*].addr"); a list whose length differs is reported as
LIST.__len__ (e.g. "segments[*].blocks[*].history.__len__"), and its common items are compared.

Usage:
  compare_pickles.py ORIGINAL WRITTEN
  compare_pickles.py --dirs ORIGINAL_DIR WRITTEN_DIR   (every ORIGINAL_DIR/*.pickle; exit 0 with a
                                                       message when ORIGINAL_DIR does not exist)
  compare_pickles.py --deep [--allow PATTERN]... ORIGINAL WRITTEN
Prints the first difference of each file with its path; exits 1 on any difference.
"""
import fnmatch
import re
import os
import pickle
import sys

EVENT_KEYS = ("action", "addr", "device_free", "size", "stream", "time_us", "compile_context",
              "user_metadata", "pool_id", "frames")
SETTINGS_KEYS = ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold",
                 "expandable_segments")
ANNOTATION_KEYS = ("device", "name", "stage", "time_us")
MISSING = "<absent>"


class Mismatch(Exception):
    pass


class DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to import {module}.{name}: not a plain-data snapshot")


def load(path):
    with open(path, "rb") as f:
        return DataOnlyUnpickler(f).load()


class Comparer:
    def __init__(self):
        self.frames_cache = {}  # id(frames list) -> normalized, since files share the lists
        self.counts = {"segments": 0, "blocks": 0, "events": 0, "annotations": 0}

    def eq(self, path, a, b):
        if a != b or type(a) is bool and type(b) is not bool or type(b) is bool and type(a) is not bool:
            raise Mismatch(f"{path}: original {a!r} != written {b!r}")

    def frames(self, v):
        if v is None or v is MISSING:
            return v
        key = id(v)
        hit = self.frames_cache.get(key)
        if hit is None:
            hit = (v, tuple((f.get("filename"), f.get("line"), f.get("name")) for f in v))
            self.frames_cache[key] = hit
        return hit[1]

    def frames_eq(self, path, a, b):
        """Normalized frames: names the first differing frame rather than printing whole stacks."""
        if a == b:
            return
        if not isinstance(a, tuple) or not isinstance(b, tuple):
            def show(v):
                return f"a list of {len(v)} frames" if isinstance(v, tuple) else repr(v)
            raise Mismatch(f"{path}: original {show(a)} != written {show(b)}")
        for j, (fa, fb) in enumerate(zip(a, b)):
            self.eq(f"{path}[{j}]", fa, fb)
        raise Mismatch(f"{path}: original has {len(a)} frames, written {len(b)}")

    def pair(self, v):
        return tuple(v) if isinstance(v, (list, tuple)) else v

    def root(self, a, b):
        self.eq("<root type>", type(a).__name__, type(b).__name__)
        if isinstance(a, list):
            self.segments("segments", a, b)
            return
        for k in ("device_traces", "allocator_settings", "external_annotations"):
            self.eq(f"{k} (key present)", k in a, k in b)
        self.segments("segments", a["segments"], b["segments"])
        if "device_traces" in a:
            self.traces(a["device_traces"], b["device_traces"])
        if isinstance(a.get("allocator_settings"), dict):
            self.settings(a["allocator_settings"], b["allocator_settings"])
        if isinstance(a.get("external_annotations"), list):
            self.annotations(a["external_annotations"], b["external_annotations"])

    def segments(self, path, a, b):
        self.eq(f"{path} (length)", len(a), len(b))
        # memforensics writes a file's segments grouped by device, each device's in the file's
        # order (docs/cli.md, convert): compare them in that order (a stable sort by device).
        def by_device(segs):
            return sorted(segs, key=lambda s: s.get("device", 0) if isinstance(s, dict) else 0)
        a, b = by_device(a), by_device(b)
        for i, (sa, sb) in enumerate(zip(a, b)):
            p = f"{path}[{i}]"
            self.counts["segments"] += 1
            self.eq(f"{p}.device", sa.get("device", 0), sb.get("device", 0))
            for k in ("address", "total_size"):
                self.eq(f"{p}.{k}", sa[k], sb[k])
            for k in ("allocated_size", "active_size", "requested_size", "stream"):
                self.eq(f"{p}.{k}", sa.get(k, 0), sb.get(k, 0))
            if "segment_type" in sa:
                self.eq(f"{p}.segment_type", sa["segment_type"], sb.get("segment_type", MISSING))
            if "segment_pool_id" in sa:
                self.eq(f"{p}.segment_pool_id", self.pair(sa["segment_pool_id"]),
                        self.pair(sb.get("segment_pool_id", MISSING)))
            self.eq(f"{p}.is_expandable", sa.get("is_expandable", False), sb.get("is_expandable", False))
            self.frames_eq(f"{p}.frames", self.frames(sa.get("frames")), self.frames(sb.get("frames")))
            ba, bb = sa["blocks"], sb["blocks"]
            self.eq(f"{p}.blocks (length)", len(ba), len(bb))
            cur_a = cur_b = sa["address"]
            for k, (xa, xb) in enumerate(zip(ba, bb)):
                va, cur_a = self.block_view(xa, cur_a)
                vb, cur_b = self.block_view(xb, cur_b)
                q = f"{p}.blocks[{k}]"
                self.counts["blocks"] += 1
                for name, x, y in zip(("address", "size", "state", "requested_size"), va, vb):
                    self.eq(f"{q}.{name}", x, y)
                self.frames_eq(f"{q}.frames", va[4], vb[4])

    def block_view(self, b, cursor):
        """The block as the model reads it, and the next block's fallback address."""
        addr = b.get("address", cursor)
        frames = b.get("frames")
        requested = b.get("requested_size")
        history = b.get("history")
        if history:
            h0 = history[0]
            if frames is None:
                frames = h0.get("frames")
            if requested is None:
                requested = h0.get("real_size")
        view = (addr, b["size"], b.get("state"), requested, self.frames(frames))
        return view, addr + b["size"]

    def traces(self, a, b):
        self.eq("device_traces (length)", len(a), len(b))
        for d, (ta, tb) in enumerate(zip(a, b)):
            self.eq(f"device_traces[{d}] (length)", len(ta), len(tb))
            for i, (ea, eb) in enumerate(zip(ta, tb)):
                self.counts["events"] += 1
                for k in EVENT_KEYS:
                    x, y = ea.get(k, MISSING), eb.get(k, MISSING)
                    if k == "frames":
                        self.frames_eq(f"device_traces[{d}][{i}].frames", self.frames(x), self.frames(y))
                        continue
                    if k == "pool_id":
                        x, y = self.pair(x), self.pair(y)
                    self.eq(f"device_traces[{d}][{i}].{k}", x, y)

    def settings(self, a, b):
        for k in SETTINGS_KEYS:
            if k in a:
                self.eq(f"allocator_settings.{k}", a[k], b.get(k, MISSING))
        # Every other key with a scalar value, as it was (the model carries the keys it does not
        # read: release_lock_on_cudamalloc, pinned_*, graph_capture_record_stream_reuse, ...).
        for k, v in a.items():
            if k in SETTINGS_KEYS or k == "roundup_power2_divisions":
                continue
            if v is None or isinstance(v, (bool, int, float, str)):
                self.eq(f"allocator_settings.{k}", v, b.get(k, MISSING))
                self.eq(f"allocator_settings.{k} (type)", type(v).__name__,
                        type(b.get(k, MISSING)).__name__)
        k = "roundup_power2_divisions"
        ra, rb = a.get(k), b.get(k)
        if isinstance(ra, dict):
            if not isinstance(rb, dict):
                raise Mismatch(f"allocator_settings.{k}: original {ra!r} != written {rb!r}")
            # The model keeps one division count per power-of-two MiB interval; absent means 0.
            for j in range(16):
                mib = str(1 << j)
                self.eq(f"allocator_settings.{k}[{mib!r}]", ra.get(mib, 0), rb.get(mib, 0))

    def annotations(self, a, b):
        self.eq("external_annotations (length)", len(a), len(b))
        for i, (xa, xb) in enumerate(zip(a, b)):
            self.counts["annotations"] += 1
            for k in ANNOTATION_KEYS:
                self.eq(f"external_annotations[{i}].{k}", xa.get(k, MISSING), xb.get(k, MISSING))


def compare(original, written):
    """(None, counts) when equal, else (the first difference, counts so far)."""
    try:
        a, b = load(original), load(written)
    except Exception as e:  # a file that does not load is a difference too
        return f"cannot load: {type(e).__name__}: {e}", None
    c = Comparer()
    try:
        c.root(a, b)
    except Mismatch as m:
        return str(m), c.counts
    except (KeyError, TypeError, AttributeError) as e:
        return f"structure differs: {type(e).__name__}: {e}", c.counts
    return None, c.counts


def deep_differences(a, b, allow=(), limit=20):
    """Every difference between two loaded pickles (at most `limit`), as (pattern path, message),
    skipping paths that match an `allow` pattern."""
    out = []

    def allowed(path):
        pattern = re.sub(r"\[\d+\]", "[*]", path)
        return any(fnmatch.fnmatchcase(pattern, p.replace("[", "[[]")) for p in allow)

    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def differ(path, what):
        if not allowed(path):
            out.append((path, what))

    def walk(x, y, path):
        if len(out) >= limit:
            return
        if type(x) is not type(y) and not (number(x) and number(y)):
            differ(path, f"{type(x).__name__} became {type(y).__name__}")
        elif isinstance(x, dict):
            for k in x:
                sub = f"{path}.{k}" if path else str(k)
                if k not in y:
                    differ(sub, "missing from the written file")
                else:
                    walk(x[k], y[k], sub)
            for k in y:
                if k not in x:
                    differ(f"{path}.{k}" if path else str(k), "added by the written file")
        elif isinstance(x, (list, tuple)):
            if len(x) != len(y):
                differ(f"{path}.__len__", f"{len(x)} items became {len(y)}")
            for i, (xi, yi) in enumerate(zip(x, y)):
                walk(xi, yi, f"{path}[{i}]")
        elif x != y and not (isinstance(x, float) and isinstance(y, float) and x != x and y != y):
            differ(path, f"{x!r:.80} became {y!r:.80}")

    walk(a, b, "")
    return out


def main_deep(argv):
    allow, files = [], []
    i = 0
    while i < len(argv):
        if argv[i] == "--allow" and i + 1 < len(argv):
            allow.append(argv[i + 1])
            i += 2
        else:
            files.append(argv[i])
            i += 1
    if len(files) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        a, b = load(files[0]), load(files[1])
    except Exception as e:  # a file that does not load is a difference too
        print(f"FAIL {os.path.basename(files[0])}: cannot load: {type(e).__name__}: {e}")
        return 1
    diffs = deep_differences(a, b, allow)
    name = os.path.basename(files[0])
    if not diffs:
        print(f"ok   {name}: equal as Python loads them" + (f" (allowed: {', '.join(allow)})" if allow else ""))
        return 0
    for path, what in diffs:
        print(f"FAIL {name}: {path or '(root)'}: {what}")
    return 1


def main(argv):
    if len(argv) >= 2 and argv[1] == "--deep":
        return main_deep(argv[2:])
    if len(argv) == 4 and argv[1] == "--dirs":
        orig_dir, written_dir = argv[2], argv[3]
        if not os.path.isdir(orig_dir):
            print(f"compare_pickles: no snapshot folder at {orig_dir}; nothing to compare")
            return 0
        names = sorted(n for n in os.listdir(orig_dir) if n.endswith(".pickle"))
        pairs = [(os.path.join(orig_dir, n), os.path.join(written_dir, n)) for n in names]
    elif len(argv) == 3 and not argv[1].startswith("--"):
        pairs = [(argv[1], argv[2])]
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    failed = 0
    for orig, written in pairs:
        name = os.path.basename(orig)
        if not os.path.isfile(written):
            print(f"FAIL {name}: written file {written} is missing")
            failed += 1
            continue
        diff, counts = compare(orig, written)
        if diff is None:
            print(f"ok   {name}: {counts['segments']} segments, {counts['blocks']} blocks, "
                  f"{counts['events']} trace entries, {counts['annotations']} annotations")
        else:
            print(f"FAIL {name}: {diff}")
            failed += 1
    print(f"compare_pickles: {len(pairs) - failed} of {len(pairs)} equal")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
