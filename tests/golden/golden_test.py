#!/usr/bin/env python3
"""Goldens of the CLI's outputs on every input (ctest `goldens`, docs/testing.md): byte-exact where
the bytes are the contract, invariants against analyze where only the figures are.

Usage: golden_test.py MEMFORENSICS_BINARY REPO_ROOT REAL_SNAPSHOTS_DIR [--jobs N] [--only SUBSTR]
                      [--native]

Inputs: snapshots/*.pickle, snapshots/scenarios/*.pickle and every .pickle / .html file in
REAL_SNAPSHOTS_DIR (../shared/snapshots-real, read in place; skipped with a note when absent).

Stored byte for byte in tests/golden/expected/<input-stem>/:

  analyze.txt               analyze
  analyze-frames.txt        analyze --top-frames 10
  analyze.json              analyze --json
  dump.txt                  dump --stacks                   (the samples in snapshots/ only)
  blocks-peak.json          blocks --json --at peak         (per device: blocks-peak.dev<N>.json
  blocks-oom.json           blocks --json --at oom           when the file has several devices;
                                                             -oom only where the device has an OOM)

Checked by invariants against the same input's analyze --json (tests/golden/invariants.py), not
stored: their layout may change, their figures may not:

  timeline.json             timeline --json
  report-data.json          report -o -: the JSON of <script id="memf-data"> only, not the page
  perfetto.json             convert --to perfetto -o -
  collapsed.folded          convert --to collapsed -o -
  collapsed-allocated.folded  convert --to collapsed --value allocated -o -
  collapsed-user.folded     convert --to collapsed --user-frames -o -

Checks across one input's outputs (cross_problems): the report's points and phases are the
timeline's, Perfetto's counters its series, the folded stacks the blocks of `blocks --at peak`.
Each invariant check is itself tested: mutations of the sample's outputs (MUTATIONS) must fail it.

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
native`), and every command above on the .bin must give the pickle's output (its golden, or for
an output checked by invariants the same command's output on the pickle, whose invariants are
checked too), except for what describes the file itself: the top-level `path`, in `input` the
format, size, origin, pickle protocol and the counts of interned strings, frames and stacks (the
pickle reader also interns what the model does not keep, e.g. legacy history entries after the
first), Perfetto's otherData.source_format, the report's what-if panel's `file`, and the text
outputs' header (up to the first empty line); `dump`, which prints the file's interned ids, is not
compared. Differences known to be bugs are listed in KNOWN_NATIVE with their cause; such an entry
that no longer differs is a failure too, so the fix removes it. This mode never writes goldens.

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import invariants  # noqa: E402

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


# Outputs checked by invariants against analyze --json (tests/golden/invariants.py), not stored:
# their figures must equal analyze's, their layout is free to change.
INVARIANT_CHECKS = {
    "timeline.json": lambda out, an: invariants.check_timeline(json.loads(out), an),
    "report-data.json": lambda out, an: invariants.check_report(json.loads(out), an),
    "report-data-runs.json": lambda out, an: invariants.check_report(json.loads(out), an),
    "perfetto.json": lambda out, an: invariants.check_perfetto(json.loads(out), an),
    "collapsed.folded": lambda out, an: invariants.check_collapsed(out.decode(), an, "requested"),
    "collapsed-allocated.folded":
        lambda out, an: invariants.check_collapsed(out.decode(), an, "allocated"),
    "collapsed-user.folded": lambda out, an: invariants.check_collapsed(out.decode(), an,
                                                                        "requested", user=True),
}


def commands(devices, folder):
    """(output name, argv before the file name, kind) for an input with these devices in this
    folder. Names in INVARIANT_CHECKS are checked, the others stored as goldens."""
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
    # Every event and stack, for the samples in snapshots/ only (a real file's dump is megabytes).
    if os.path.realpath(folder) == os.path.realpath(os.path.join(ROOT, "snapshots")):
        cmds.append(("dump.txt", ["dump", "--stacks"], "text"))
    # A block budget small enough that neighbouring small blocks are merged into runs, for the
    # scenarios: the block-map invariants on runs (mixed allocated and pending-free) get inputs.
    if os.path.realpath(folder) == os.path.realpath(os.path.join(ROOT, "snapshots", "scenarios")):
        cmds.append(("report-data-runs.json", ["report", "--max-blocks", "1000", "-o", "-"],
                     "report"))
    for dev, has_oom in devices:
        suffix = "" if len(devices) == 1 else f".dev{dev}"
        sel = ["--device", str(dev)] if len(devices) > 1 else []
        cmds.append((f"blocks-peak{suffix}.json", ["blocks", "--json", "--at", "peak", *sel], "json"))
        if has_oom:
            cmds.append((f"blocks-oom{suffix}.json", ["blocks", "--json", "--at", "oom", *sel],
                         "json"))
    return cmds


def check_invariants(where, name, out, an):
    """Runs the output's invariant checks; a check that raises is a failure too."""
    try:
        problems = INVARIANT_CHECKS[name](out, an)
    except Exception as e:  # a missing field or a malformed output
        problems = [f"the check raised {type(e).__name__}: {e}"]
    report_problems(f"{where}: invariant", problems)


def report_problems(where, problems):
    """The first 8 problems as failures, then how many more."""
    for p in problems[:8]:
        failures.append(f"{where}: {p}")
    if len(problems) > 8:
        failures.append(f"{where}: ... and {len(problems) - 8} more")


def cross_problems(outs, an):
    """Checks across one input's outputs: the views agree with each other (the report's points
    and phases are the timeline's, Perfetto's counters its series), the two folded-stack values
    name the same stacks, and the folded stacks' held and pending-free bytes are the blocks of
    `blocks --at peak`."""
    try:
        problems = []
        if all(n in outs for n in ("timeline.json", "report-data.json", "perfetto.json")):
            problems += invariants.check_cross(json.loads(outs["timeline.json"]),
                                               json.loads(outs["report-data.json"]),
                                               json.loads(outs["perfetto.json"]), an)
        if "collapsed.folded" in outs and "collapsed-allocated.folded" in outs:
            problems += invariants.check_collapsed_pair(outs["collapsed.folded"].decode(),
                                                        outs["collapsed-allocated.folded"].decode(),
                                                        an)
        devices = [d["device"] for d in an["devices"]]
        blocks = {}
        for d in devices:
            name = "blocks-peak.json" if len(devices) == 1 else f"blocks-peak.dev{d}.json"
            if name in outs:
                blocks[d] = json.loads(outs[name])
        if "collapsed.folded" in outs:
            problems += invariants.check_collapsed_extra(outs["collapsed.folded"].decode(), an,
                                                         "requested", blocks=blocks)
    except Exception as e:  # a missing field or a malformed output
        problems = [f"the check raised {type(e).__name__}: {e}"]
    return problems


def cross_invariants(stem, outs, an):
    report_problems(f"{stem}: invariant across outputs", cross_problems(outs, an))


def one_document(out):
    docs = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    if len(docs) != 1:
        raise ValueError(f"{len(docs)} JSON documents")
    return docs[0]


def output_bytes(kind, out, where, shells=None, stem=None):
    """What is compared or checked of a command's stdout: laid-out JSON, the report's data, or
    the text; None (after a failure) when the report page has no data block."""
    if kind == "json":
        return stored_json(out)
    if kind == "report":
        try:
            raw, shell = split_report(out)
        except ValueError as e:
            failures.append(f"{where}: {e}")
            return None
        if shells is not None:
            shells.setdefault(shell, []).append(stem)
        return stored_json(raw)
    return out


# ---- Self-test of the invariants ----------------------------------------------------------------

# Each mutation breaks one figure the way a renderer bug would; every one must be caught, by the
# output's own checks or by the checks across outputs. Run on the sample's outputs.
def _bump_point(doc):
    doc["devices"][0]["points"][-1][2] += 512  # reserved at the last event


def _block_overrun(doc):
    for d in doc["devices"]:
        for k in d["keyframes"]:
            if k["blocks"]:
                k["blocks"][0] += 512  # a block 512 bytes larger than it is
                return


def _icicle_self(doc):
    doc["devices"][0]["icicle"]["self"][-1] += 1


def _analysis(doc):
    doc["analysis"]["devices"][0]["segments"] += 1


def _last_counter(doc):
    for e in reversed(doc["traceEvents"]):
        if e.get("ph") == "C" and e["name"] == "allocated":
            e["args"]["bytes"] += 512
            return


def _point_time(doc):
    t = doc["devices"][0]["points"]["time_us"]
    i = next(i for i in range(len(t) // 2, len(t)) if t[i - 1] < t[i])
    t[i] = t[i - 1]  # still in order


def _oom_keyframe(doc):
    d = doc["devices"][0]
    ooms = {o["event"] for o in d["ooms"]}
    d["keyframes"] = [k for k in d["keyframes"] if k["event"] not in ooms]


def _phase_name(doc):
    doc["devices"][0]["phases"][0]["name"] += "x"


def _oom_request(doc):
    for e in doc["traceEvents"]:
        if e.get("ph") == "i" and e["name"] == "OOM":
            e["args"]["request_bytes"] += 512
            return


def _swap_bytes(lines):
    split = [line.rpartition(" ") for line in lines]
    a = 0
    b = next(i for i, s in enumerate(split) if s[2] != split[a][2])  # two stacks, unlike bytes
    lines[a], lines[b] = f"{split[a][0]} {split[b][2]}", f"{split[b][0]} {split[a][2]}"


def _frame_name(lines):
    lines[0] = lines[0].replace("(", "(x", 1)


MUTATIONS = [
    ("timeline.json", "a point above the end state", _bump_point),
    ("report-data.json", "a block that overruns its segment", _block_overrun),
    ("report-data.json", "a call-tree node whose self bytes are off", _icicle_self),
    ("report-data.json", "an analysis that is not analyze's", _analysis),
    ("report-data.json", "a point's time off, still in order", _point_time),
    ("report-data.json", "no block map at the OOM", _oom_keyframe),
    ("report-data.json", "a phase's name off", _phase_name),
    ("perfetto.json", "a last allocated counter off the final state", _last_counter),
    ("perfetto.json", "an OOM's request off", _oom_request),
    ("collapsed.folded", "a stack left out", lambda lines: lines.pop(0)),
    ("collapsed.folded", "two stacks' bytes swapped", _swap_bytes),
    ("collapsed-allocated.folded", "a stack counted twice", lambda lines: lines.append(lines[0])),
    ("collapsed-user.folded", "a frame's name off", _frame_name),
]


def selftest_invariants(outputs, an):
    """outputs: name -> bytes of one input. Every mutation must make a check fail."""
    for name, what, mutate in MUTATIONS:
        if name not in outputs:
            failures.append(f"invariant self-test: no {name} of the sample")
            continue
        if name.endswith(".folded"):
            lines = outputs[name].decode().splitlines()
            mutate(lines)
            data = ("\n".join(lines) + "\n").encode()
        else:
            doc = json.loads(outputs[name])
            mutate(doc)
            data = json.dumps(doc).encode()
        if not INVARIANT_CHECKS[name](data, an) and not cross_problems({**outputs, name: data},
                                                                       an):
            failures.append(f"invariant self-test: {name} with {what} passed its checks")


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
    analyses = {}  # stem -> analyze's parsed document
    for (stem, d, f), (rc, out, err) in zip(inputs, firsts):
        produced[stem] = {"analyze.json"}
        if rc != 0:
            failures.append(f"{stem}: analyze --json exit {rc}: {err.decode(errors='replace')}")
            continue
        compare(stem, "analyze.json", stored_json(out))
        try:
            analyses[stem] = one_document(out)
        except ValueError as e:
            failures.append(f"{stem}: analyze --json: {e}")
            continue
        devices = [(dev["device"], bool(dev.get("ooms"))) for dev in analyses[stem]["devices"]]
        for name, argv, kind in commands(devices, d):
            if name not in INVARIANT_CHECKS:
                produced[stem].add(name)
            jobs.append((stem, d, f, name, argv, kind))

    def second(job):
        stem, d, f, name, argv, kind = job
        return job, run(d, [*argv, f])

    shells = {}
    checked = 0
    outputs = {}  # stem -> name -> bytes, for the checks across outputs
    with ThreadPoolExecutor(JOBS) as ex:
        for (stem, d, f, name, argv, kind), (rc, out, err) in ex.map(second, jobs):
            if rc != 0:
                failures.append(f"{stem}/{name}: {' '.join(argv)} exit {rc}: "
                                f"{err.decode(errors='replace')}")
                continue
            data = output_bytes(kind, out, f"{stem}/{name}", shells, stem)
            if data is None:
                continue
            if name in INVARIANT_CHECKS:
                bad = machine_paths(stem, data)
                if bad:
                    failures.append(f"{stem}/{name}: output contains the machine-specific path "
                                    f"{bad[0]}")
                check_invariants(f"{stem}/{name}", name, data, analyses[stem])
                checked += 1
            else:
                compare(stem, name, data)
            outputs.setdefault(stem, {})[name] = data
    for stem, outs in sorted(outputs.items()):
        cross_invariants(stem, outs, analyses[stem])
    if "sample_training" in outputs:
        selftest_invariants(outputs["sample_training"], analyses["sample_training"])
    if len(shells) > 1:
        groups = "; ".join(f"{len(v)} like {v[0]}" for v in shells.values())
        failures.append(f"report pages differ outside their data and nonce: {groups}")

    # Stale goldens: folders or files no command produced.
    if os.path.isdir(EXPECTED) and not ONLY:
        for stem in sorted(os.listdir(EXPECTED)):
            folder = os.path.join(EXPECTED, stem)
            if not os.path.isdir(folder):  # goldens live in the input's folder only
                if UPDATE:
                    os.remove(folder)
                    notes.append(f"removed stale {stem}")
                else:
                    failures.append(f"tests/golden/expected/{stem}: not in an input's folder "
                                    "(stale)")
                continue
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
    print(f"{len(inputs)} inputs, {count} goldens, {checked} outputs checked by invariants, "
          f"{len(failures)} failed, {time.time() - t0:.1f} s")
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
        firsts = []
        for (stem, d, f), (rc, out, err) in zip(inputs, converted):
            if rc != 0:
                failures.append(f"{stem}: convert --to native exit {rc}: "
                                f"{err.decode(errors='replace')}")
                continue
            if read_golden(stem, "analyze.json") is None:
                failures.append(f"{stem}: no analyze.json golden (run the goldens first)")
                continue
            firsts.append((stem, d, f))

        def one(job):
            stem, d, f, name, argv, kind = job
            got = run(tmp, [*argv, stem + ".bin"])
            # An output checked by invariants has no golden: the pickle's own output is the peer.
            peer = run(d, [*argv, f]) if name in INVARIANT_CHECKS else None
            return job, got, peer

        count = 0
        analyses = {}

        def outcome(job, got, peer):
            nonlocal count
            stem, d, f, name, argv, kind = job
            rc, out, err = got
            count += 1
            where = f"{stem}.bin {name}"
            if rc != 0:
                failures.append(f"{where}: {' '.join(argv)} exit {rc}: "
                                f"{err.decode(errors='replace')}")
                return
            data = output_bytes(kind, out, where)
            if data is None:
                return
            if name == "analyze.json":
                try:
                    analyses[stem] = one_document(out)
                except ValueError as e:
                    failures.append(f"{where}: {e}")
            if name in INVARIANT_CHECKS:
                if stem in analyses:
                    check_invariants(where, name, data, analyses[stem])
                if peer[0] != 0:
                    failures.append(f"{stem}/{name} (the pickle's): exit {peer[0]}")
                    return
                want = output_bytes(kind, peer[1], f"{stem}/{name}")
                if want is None:
                    return
            else:
                want = read_golden(stem, name)
                if want is None:
                    failures.append(f"{where}: no golden for the pickle")
                    return
            a, b = normalize_native(name, want), normalize_native(name, data)
            known = KNOWN_NATIVE.get((stem, name))
            if known is not None:
                seen_known.add((stem, name))
                if a == b:
                    failures.append(f"{where}: listed in KNOWN_NATIVE but equal now: remove "
                                    "the entry")
                else:
                    notes.append(f"known difference {where}: {known}")
                return
            if a != b:
                failures.append(f"{where}: differs from the pickle's output\n"
                                f"{show_diff(as_bytes(a), as_bytes(b))}")

        # analyze --json first: the invariants of the other outputs are checked against it.
        with ThreadPoolExecutor(JOBS) as ex:
            for res in ex.map(one, [(stem, d, f, "analyze.json", ["analyze", "--json"], "json")
                                    for stem, d, f in firsts]):
                outcome(*res)
        jobs = []
        for stem, d, f in firsts:
            if stem not in analyses:
                continue
            devices = [(dev["device"], bool(dev.get("ooms"))) for dev in analyses[stem]["devices"]]
            # dump prints the file's own interned ids, which a conversion renumbers: not compared.
            jobs += [(stem, d, f, name, argv, kind) for name, argv, kind in commands(devices, d)
                     if name != "dump.txt"]
        with ThreadPoolExecutor(JOBS) as ex:
            for res in ex.map(one, jobs):
                outcome(*res)
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
