#!/usr/bin/env python3
"""Byte-exact goldens of the CLI's outputs on every input (ctest `goldens`, docs/testing.md).

Usage: golden_test.py MEMFORENSICS_BINARY REPO_ROOT REAL_SNAPSHOTS_DIR [--jobs N] [--only SUBSTR]
                      [--native]

Inputs: snapshots/*.pickle, snapshots/scenarios/*.pickle and every .pickle / .html file in
REAL_SNAPSHOTS_DIR (../shared/snapshots-real, read in place; skipped with a note when absent).
For each input, into tests/golden/expected/<input-stem>/:

  analyze.txt               analyze
  analyze-frames.txt        analyze --top-frames 10
  analyze.json              analyze --json
  timeline.json             timeline --json
  blocks-peak.json          blocks --json --at peak         (per device: blocks-peak.dev<N>.json
  blocks-oom.json           blocks --json --at oom           when the file has several devices;
                                                             -oom only where the device has an OOM)
  report-data.json          report -o -: the JSON of <script id="memf-data"> only, not the page
  perfetto.json             convert --to perfetto -o -
  collapsed.folded          convert --to collapsed -o -
  collapsed-allocated.folded  convert --to collapsed --value allocated -o -
  collapsed-user.folded     convert --to collapsed --user-frames -o -

Every command runs in the input's own folder with the file's bare name as its argument, so no
output holds a machine-specific path (checked: no output may contain the repository's, the real
snapshots' or the working folder's absolute path).

JSON is stored pretty-printed without changing a byte of its tokens: the tool writes compact JSON
(no whitespace between tokens), and the layout only inserts newlines and indentation between
tokens, so two outputs have the same stored form exactly when their bytes are equal. Output that
is not compact is stored as it is. A stored file above 256 KiB is kept gzip-compressed (mtime 0)
as <name>.gz; the comparison is on the decompressed bytes.

Nondeterministic fields normalized: none in the stored outputs. The HTML page's CSP nonce
(MEMF_NONCE, random per report) lies outside the data block and is not stored; the rest of the page
(template, style, script) is checked to be the same for every input.

--native (ctest `goldens_native`): each input is converted to a native trace (`convert --to
native`), and every command above on the .bin must give the pickle's golden, except for what
describes the file itself: the top-level `path`, in `input` the format, size, origin, pickle
protocol and the counts of interned strings, frames and stacks (the pickle reader also interns
what the model does not keep, e.g. legacy history entries after the first), Perfetto's
otherData.source_format, the report's what-if panel's `file`, and the text outputs' header (up to the first empty line). Differences
known to be bugs are listed in KNOWN_NATIVE with their cause; such an entry that no longer differs
is a failure too, so the fix removes it. This mode never writes goldens.

MEMF_UPDATE_GOLDEN=1 rewrites the goldens that differ, writes missing ones and deletes stale ones.
On a mismatch the file and the first 40 lines of a unified diff are printed. Every golden diff that
is committed must be explained in its commit message (docs/testing.md).
"""
import difflib
import gzip
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

GZIP_ABOVE = 256 * 1024  # stored files larger than this are kept as .gz
DIFF_LINES = 40  # lines of unified diff printed per mismatch

args = [a for a in sys.argv[1:]]
JOBS = 2
ONLY = None
if "--jobs" in args:
    i = args.index("--jobs")
    JOBS = int(args[i + 1])
    del args[i : i + 2]
NATIVE = "--native" in args
if NATIVE:
    args.remove("--native")
if "--only" in args:
    i = args.index("--only")
    ONLY = args[i + 1]
    del args[i : i + 2]
BIN, ROOT, REAL = os.path.abspath(args[0]), os.path.abspath(args[1]), os.path.abspath(args[2])
UPDATE = os.environ.get("MEMF_UPDATE_GOLDEN") == "1"
# The text report wraps to COLUMNS when it is set: the expected outputs are at the default 100.
os.environ.pop("COLUMNS", None)
EXPECTED = os.path.join(ROOT, "tests", "golden", "expected")
# Top-level files in EXPECTED belong to tests/cli/cli_test.py; this runner owns the folders.

failures = []
notes = []


# ---- Layout of compact JSON ---------------------------------------------------------------------

STRING = r'"(?:[^"\\]|\\.)*"'
# A container holding no container and no whitespace between its tokens: kept on one line.
FLAT = r'[\[{](?:' + STRING + r'|[^\[\]{}"\s])*[\]}]'
TOKEN = re.compile(FLAT + "|" + STRING + r'|[{}\[\],:]|[^\s{}\[\],:"]+|\s+', re.S)
ELEMENT = re.compile(STRING + r'|[^,"]+', re.S)
WRAP = 100  # a long list of scalars is wrapped at about this many characters per line


def layout_json(text):
    """The same tokens with newlines and indentation between them, or None when `text` is not a
    sequence of compact JSON documents (whitespace only between documents)."""
    out = []
    depth = 0
    end = 0
    for m in TOKEN.finditer(text):
        if m.start() != end:
            return None  # a character no token matches (an unterminated string)
        end = m.end()
        t = m.group()
        c = t[0]
        if c in "{[":
            if len(t) > 1 and t[-1] in "]}":  # a flat container
                if c == "[" and len(t) + depth > WRAP:
                    parts = ELEMENT.findall(t[1:-1])
                    pad = "\n" + " " * (depth + 1)
                    out.append("[")
                    line = ""
                    for i, p in enumerate(parts):
                        piece = p + ("," if i + 1 < len(parts) else "")
                        if line and len(line) + len(piece) + depth > WRAP:
                            out.append(pad + line)
                            line = ""
                        line += piece
                    out.append(pad + line)
                    out.append("\n" + " " * depth + "]")
                else:
                    out.append(t)
                continue
            depth += 1
            out.append(c + "\n" + " " * depth)
        elif c in "}]" and len(t) == 1:
            depth -= 1
            if depth < 0:
                return None
            out.append("\n" + " " * depth + c)
        elif t == ",":
            if depth == 0:
                return None
            out.append(",\n" + " " * depth)
        elif c.isspace():
            if depth:
                return None  # not compact: stored as it is
            out.append(t)
        else:
            out.append(t)
    if end != len(text) or depth:
        return None
    return "".join(out)


def stored_json(raw):
    text = raw.decode("utf-8", "surrogateescape")
    laid = layout_json(text)
    if laid is None:
        return raw
    if not laid.endswith("\n"):
        laid += "\n"
    return laid.encode("utf-8", "surrogateescape")


# ---- The report page ----------------------------------------------------------------------------

DATA_OPEN = b'<script id="memf-data" type="application/json">'
NONCE = re.compile(rb"nonce-[0-9a-f]{32}|nonce=\"[0-9a-f]{32}\"")


def split_report(page):
    """(data JSON bytes, the page without data and with its nonce normalized) or raises."""
    a = page.find(DATA_OPEN)
    if a < 0 or page.find(DATA_OPEN, a + 1) >= 0:
        raise ValueError("report page: expected exactly one memf-data script")
    a += len(DATA_OPEN)
    b = page.find(b"</script>", a)
    if b < 0:
        raise ValueError("report page: unterminated memf-data script")
    shell = page[:a] + b"DATA" + page[b:]
    shell = NONCE.sub(b"NONCE", shell)
    return page[a:b], shell


# ---- Running ------------------------------------------------------------------------------------


def run(cwd, argv):
    r = subprocess.run([BIN, *argv], cwd=cwd, capture_output=True)
    return r.returncode, r.stdout, r.stderr


def collect_inputs():
    inputs = []  # (stem, folder, file name)
    snap = os.path.join(ROOT, "snapshots")
    for d in (snap, os.path.join(snap, "scenarios")):
        inputs += [(d, f) for f in sorted(os.listdir(d)) if f.endswith(".pickle")]
    real_present = os.path.isdir(REAL)
    if real_present:
        inputs += [(REAL, f) for f in sorted(os.listdir(REAL)) if f.endswith((".pickle", ".html"))]
    else:
        notes.append(f"note: {REAL} not found: the real snapshots' goldens are skipped")
    out = []
    stems = {}
    for d, f in inputs:
        stem = os.path.splitext(f)[0]
        stems.setdefault(stem, []).append(f)
    for d, f in inputs:
        stem = os.path.splitext(f)[0]
        out.append((stem if len(stems[stem]) == 1 else f, d, f))
    return out, real_present


def expected_path(stem, name):
    return os.path.join(EXPECTED, stem, name)


def read_golden(stem, name):
    p = expected_path(stem, name)
    if os.path.exists(p + ".gz"):
        with open(p + ".gz", "rb") as f:
            return gzip.decompress(f.read())
    if os.path.exists(p):
        with open(p, "rb") as f:
            return f.read()
    return None


def write_golden(stem, name, data):
    p = expected_path(stem, name)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    for q in (p, p + ".gz"):
        if os.path.exists(q):
            os.remove(q)
    if len(data) > GZIP_ABOVE:
        with open(p + ".gz", "wb") as f:
            f.write(gzip.compress(data, compresslevel=9, mtime=0))
    else:
        with open(p, "wb") as f:
            f.write(data)


def show_diff(want, got):
    a = want.decode("utf-8", "replace").splitlines(True)
    b = got.decode("utf-8", "replace").splitlines(True)
    # Only around the first difference: difflib on two large, very different files takes minutes.
    first = 0
    while first < min(len(a), len(b)) and a[first] == b[first]:
        first += 1
    start = max(0, first - 3)
    a, b = a[start : first + 400], b[start : first + 400]
    lines = []
    for line in difflib.unified_diff(a, b, "expected", "actual", n=2):
        if line.startswith("@@") and start:
            # Line numbers of the whole files.
            m = re.match(r"@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@", line)
            if m:
                line = (f"@@ -{int(m.group(1)) + start}{m.group(2) or ''} "
                        f"+{int(m.group(3)) + start}{m.group(4) or ''} @@\n")
        lines.append(line if line.endswith("\n") else line + "\n")
        if len(lines) >= DIFF_LINES:
            lines.append("...\n")
            break
    return "".join(lines)


FORBIDDEN = None
INPUT_PATHS = {}  # stem -> (folder, file name)
INPUT_BYTES = {}  # stem -> the input file's bytes, read once


def machine_paths(stem, data):
    """Absolute paths of this machine (repository, real snapshots, working folder) that `data`
    holds and the input itself does not (a real file may record /tmp/... frames)."""
    found = [p for p in FORBIDDEN if p.encode() in data]
    if not found:
        return []
    if stem not in INPUT_BYTES:
        d, f = INPUT_PATHS[stem]
        with open(os.path.join(d, f), "rb") as fh:
            INPUT_BYTES[stem] = fh.read()
    return [p for p in found if p.encode() not in INPUT_BYTES[stem]]


def compare(stem, name, data):
    """Checks (or with MEMF_UPDATE_GOLDEN=1 writes) one golden."""
    bad = machine_paths(stem, data)
    if bad:
        failures.append(f"{stem}/{name}: output contains the machine-specific path {bad[0]}")
        return
    want = read_golden(stem, name)
    if want == data:
        return
    if UPDATE:
        write_golden(stem, name, data)
        notes.append(f"updated {stem}/{name}")
        return
    where = os.path.relpath(expected_path(stem, name), ROOT)
    if want is None:
        failures.append(f"{where}: missing (run with MEMF_UPDATE_GOLDEN=1)")
        return
    failures.append(f"{where}: differs\n{show_diff(want, data)}")


def commands(devices):
    """(golden name, argv before the file name, kind) for an input with these devices."""
    cmds = [
        ("analyze.txt", ["analyze"], "text"),
        ("analyze-frames.txt", ["analyze", "--top-frames", "10"], "text"),
        ("timeline.json", ["timeline", "--json"], "json"),
        ("report-data.json", ["report", "-o", "-"], "report"),
        ("perfetto.json", ["convert", "--to", "perfetto", "-o", "-"], "json"),
        ("collapsed.folded", ["convert", "--to", "collapsed", "-o", "-"], "text"),
        ("collapsed-allocated.folded",
         ["convert", "--to", "collapsed", "--value", "allocated", "-o", "-"], "text"),
        ("collapsed-user.folded", ["convert", "--to", "collapsed", "--user-frames", "-o", "-"],
         "text"),
    ]
    for dev, has_oom in devices:
        suffix = "" if len(devices) == 1 else f".dev{dev}"
        sel = ["--device", str(dev)] if len(devices) > 1 else []
        cmds.append((f"blocks-peak{suffix}.json", ["blocks", "--json", "--at", "peak", *sel], "json"))
        if has_oom:
            cmds.append((f"blocks-oom{suffix}.json", ["blocks", "--json", "--at", "oom", *sel],
                         "json"))
    return cmds


def main():
    global FORBIDDEN
    t0 = time.time()
    inputs, real_present = collect_inputs()
    if ONLY:
        inputs = [x for x in inputs if ONLY in x[0]]
    FORBIDDEN = sorted({ROOT, REAL, os.path.realpath(ROOT), os.path.realpath(REAL),
                        os.getcwd()}, key=len, reverse=True)
    INPUT_PATHS.update({stem: (d, f) for stem, d, f in inputs})
    if not inputs:
        print("FAIL no inputs")
        return 1

    # Pass 1: analyze --json (its device list says which blocks goldens exist).
    def first(inp):
        stem, d, f = inp
        return run(d, ["analyze", "--json", f])

    with ThreadPoolExecutor(JOBS) as ex:
        firsts = list(ex.map(first, inputs))
    jobs = []
    produced = {}
    for (stem, d, f), (rc, out, err) in zip(inputs, firsts):
        produced[stem] = {"analyze.json"}
        if rc != 0:
            failures.append(f"{stem}: analyze --json exit {rc}: {err.decode(errors='replace')}")
            continue
        compare(stem, "analyze.json", stored_json(out))
        devices = []
        for line in out.decode().splitlines():
            if line.strip():
                for dev in json.loads(line)["devices"]:
                    devices.append((dev["device"], bool(dev.get("ooms"))))
        for name, argv, kind in commands(devices):
            produced[stem].add(name)
            jobs.append((stem, d, f, name, argv, kind))

    def second(job):
        stem, d, f, name, argv, kind = job
        return job, run(d, [*argv, f])

    shells = {}
    with ThreadPoolExecutor(JOBS) as ex:
        for (stem, d, f, name, argv, kind), (rc, out, err) in ex.map(second, jobs):
            if rc != 0:
                failures.append(f"{stem}/{name}: {' '.join(argv)} exit {rc}: "
                                f"{err.decode(errors='replace')}")
                continue
            if kind == "json":
                data = stored_json(out)
            elif kind == "report":
                try:
                    raw, shell = split_report(out)
                except ValueError as e:
                    failures.append(f"{stem}/{name}: {e}")
                    continue
                shells.setdefault(shell, []).append(stem)
                data = stored_json(raw)
            else:
                data = out
            compare(stem, name, data)
    if len(shells) > 1:
        groups = "; ".join(f"{len(v)} like {v[0]}" for v in shells.values())
        failures.append(f"report pages differ outside their data and nonce: {groups}")

    # Stale goldens: folders or files no command produced.
    if os.path.isdir(EXPECTED) and not ONLY:
        for stem in sorted(os.listdir(EXPECTED)):
            folder = os.path.join(EXPECTED, stem)
            if not os.path.isdir(folder):
                continue  # tests/cli/cli_test.py's goldens
            if stem not in produced:
                if not real_present:
                    continue  # perhaps a real snapshot's folder, while they are absent
                if UPDATE:
                    for f in os.listdir(folder):
                        os.remove(os.path.join(folder, f))
                    os.rmdir(folder)
                    notes.append(f"removed stale {stem}/")
                else:
                    failures.append(f"tests/golden/expected/{stem}/: no such input (stale)")
                continue
            for f in sorted(os.listdir(folder)):
                name = f[:-3] if f.endswith(".gz") else f
                if name not in produced[stem]:
                    if UPDATE:
                        os.remove(os.path.join(folder, f))
                        notes.append(f"removed stale {stem}/{f}")
                    else:
                        failures.append(f"tests/golden/expected/{stem}/{f}: no command makes it "
                                        "(stale)")
            names = os.listdir(folder)
            for f in names:
                if f + ".gz" in names:
                    failures.append(f"tests/golden/expected/{stem}/{f}: both {f} and {f}.gz")

    for n in notes:
        print(n)
    for f in failures:
        print("FAIL " + f)
    count = sum(len(v) for v in produced.values())
    print(f"{len(inputs)} inputs, {count} goldens, {len(failures)} failed, "
          f"{time.time() - t0:.1f} s")
    return 1 if failures else 0


# ---- Native trace round trip (--native) -------------------------------------------------------

# Outputs of the native-trace round trip known to differ from the pickle's, with their cause; an
# entry fails once the outputs are equal again, so that it is removed. None is known at present
# (the call graph's hot path used to depend on interned-id order: fixed by the one frame tree).
KNOWN_NATIVE: dict = {}

INPUT_DESCRIBES_FILE = ("bytes", "format", "origin", "pickle_protocol", "strings", "frames",
                        "stacks")


def normalize_native(name, data):
    """The stored form of an output without what describes the file rather than the snapshot."""
    if name.endswith(".txt"):
        text = data.decode("utf-8", "surrogateescape")
        cut = text.find("\n\n")
        return text[cut:] if cut >= 0 else text
    if not name.endswith(".json"):
        return data
    docs = []
    text = data.decode("utf-8", "surrogateescape")
    try:
        parsed = [json.loads(text)]  # one document (laid out, or Perfetto's one event per line)
    except ValueError:
        parsed = [json.loads(line) for line in text.splitlines() if line.strip()]  # JSON lines
    for j in parsed:
        for holder in (j, j.get("analysis") if isinstance(j, dict) else None):
            if not isinstance(holder, dict):
                continue
            holder.pop("path", None)
            if isinstance(holder.get("input"), dict):
                for k in INPUT_DESCRIBES_FILE:
                    holder["input"].pop(k, None)
            if isinstance(holder.get("otherData"), dict):
                holder["otherData"].pop("source_format", None)
            if isinstance(holder.get("whatif"), dict):
                holder["whatif"].pop("file", None)  # the report's what-if panel names its file
        docs.append(j)
    return docs  # compared as values; laid out only to show a difference


def as_bytes(x):
    if isinstance(x, list):
        x = "\n".join(json.dumps(j, indent=1, ensure_ascii=False) for j in x) + "\n"
    return x.encode("utf-8", "surrogateescape") if isinstance(x, str) else x


def main_native():
    import tempfile
    t0 = time.time()
    inputs, _ = collect_inputs()
    if ONLY:
        inputs = [x for x in inputs if ONLY in x[0]]
    tmp = tempfile.mkdtemp(prefix="memf-goldens-native-")
    seen_known = set()
    try:
        def convert(inp):
            stem, d, f = inp
            return run(d, ["convert", "--to", "native", "-o", os.path.join(tmp, stem + ".bin"), f])

        with ThreadPoolExecutor(JOBS) as ex:
            converted = list(ex.map(convert, inputs))
        jobs = []
        for (stem, d, f), (rc, out, err) in zip(inputs, converted):
            if rc != 0:
                failures.append(f"{stem}: convert --to native exit {rc}: "
                                f"{err.decode(errors='replace')}")
                continue
            want = read_golden(stem, "analyze.json")
            if want is None:
                failures.append(f"{stem}: no analyze.json golden (run the goldens first)")
                continue
            devices = []
            for dev in normalize_native("analyze.json", want)[0]["devices"]:
                devices.append((dev["device"], bool(dev.get("ooms"))))
            jobs.append((stem, "analyze.json", ["analyze", "--json"], "json"))
            for name, argv, kind in commands(devices):
                jobs.append((stem, name, argv, kind))

        def one(job):
            stem, name, argv, kind = job
            return job, run(tmp, [*argv, stem + ".bin"])

        count = 0
        with ThreadPoolExecutor(JOBS) as ex:
            for (stem, name, argv, kind), (rc, out, err) in ex.map(one, jobs):
                count += 1
                where = f"{stem}.bin {name}"
                if rc != 0:
                    failures.append(f"{where}: {' '.join(argv)} exit {rc}: "
                                    f"{err.decode(errors='replace')}")
                    continue
                if kind == "json":
                    data = stored_json(out)
                elif kind == "report":
                    try:
                        data = stored_json(split_report(out)[0])
                    except ValueError as e:
                        failures.append(f"{where}: {e}")
                        continue
                else:
                    data = out
                want = read_golden(stem, name)
                if want is None:
                    failures.append(f"{where}: no golden for the pickle")
                    continue
                a, b = normalize_native(name, want), normalize_native(name, data)
                known = KNOWN_NATIVE.get((stem, name))
                if known is not None:
                    seen_known.add((stem, name))
                    if a == b:
                        failures.append(f"{where}: listed in KNOWN_NATIVE but equal now: remove "
                                        "the entry")
                    else:
                        notes.append(f"known difference {where}: {known}")
                    continue
                if a != b:
                    failures.append(f"{where}: differs from the pickle's golden\n"
                                    f"{show_diff(as_bytes(a), as_bytes(b))}")
    finally:
        for f in os.listdir(tmp):
            os.remove(os.path.join(tmp, f))
        os.rmdir(tmp)
    stems = {s for s, d, f in inputs}
    for key in sorted(set(KNOWN_NATIVE) - seen_known):
        if key[0] in stems:
            failures.append(f"KNOWN_NATIVE {key}: no such output was compared")
    for n in notes:
        print(n)
    for f in failures:
        print("FAIL " + f)
    print(f"native round trip: {len(inputs)} inputs, {count} outputs, {len(failures)} failed, "
          f"{time.time() - t0:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main_native() if NATIVE else main())
