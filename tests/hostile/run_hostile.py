#!/usr/bin/env python3
"""run_hostile.py BINARY SRC_DIR [--out report.tsv] [--corpus DIR] [--timeout S] [--jobs N] [--only TEXT]

Runs every memforensics command on every input of the hostile corpus (tools/make_hostile.py,
generated into a temporary folder, or into --corpus DIR and kept there), on the special files
/dev/zero, /dev/urandom and a FIFO without a writer, and checks the hostile outputs of issue 11
(standard output on /dev/full, an output that is the input, an output onto a character device).

A run passes when:
  * the exit code is 0, 1 or 2 (not a signal, not an ASan report, not killed by the hang guard);
  * its peak resident memory (getrusage of the child) is at most --rss-limit-mib (1024);
  * standard output and standard error hold no raw control bytes (C0 other than tab and newline,
    DEL) and are valid UTF-8 (what a terminal would interpret);
  * what it wrote can be read back: `report`'s page is at most 5,000,000 bytes (docs/report.md);
    `convert -o X.bin` that exits 0 is followed by `analyze X.bin`, which must exit 0, and by
    `convert X.bin --to pickle` whose output must load in Python's pickle with a device trace for
    every segment's device (what PyTorch's memory_viz indexes); `convert --to pickle` output must
    load in Python's pickle too;
  * for inputs flagged `flag_wrong` (numbers that would be silently wrong, class 6), `analyze --json`
    refuses the file (exit 2) or says so (an anomaly of severity error, or an input warning).

The memory cap: each command runs under RLIMIT_AS = the RSS limit + the input's size (the input is
mapped, so its own size is not counted against the budget), so an unbounded allocation ends in
std::bad_alloc rather than taking the machine. Sanitizer builds need terabytes of address space:
for a binary linked with ASan (or MEMF_HOSTILE_NO_RLIMIT=1) no cap is set, the RSS is measured
against 3x the limit (shadow memory and quarantine) and a run is killed at twice that. The hang guard (--timeout, 120 s; 20 s for the special
files) detects hangs; it is not a speed assertion (runs over 30 s are counted and listed).

Prints one line per (input, command), then the largest RSS, the longest time, and last, alone on
its line, `hostile: N passed, M failed`. Exit status 1 when any run failed.
"""

import argparse
import codecs
import concurrent.futures
import hashlib
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

SLOW_S = 30.0
ASAN_RSS_FACTOR = 3
# The commands a sanitizer build runs on class 10 ("budget") inputs.
ASAN_BUDGET_COMMANDS = ("analyze --json", "convert -o X.bin")
PAGE_LIMIT = 5_000_000
CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")

PY_CHECK = r"""
import json, pickle, sys

def viz_problem(s):
    # What PyTorch's memory_viz needs: device_traces a list of lists, one for every segment's device.
    if not isinstance(s, dict):
        return None
    dt = s.get('device_traces', [])
    if not isinstance(dt, list) or not all(isinstance(t, list) for t in dt):
        return 'device_traces is not a list of lists'
    for i, sg in enumerate(s.get('segments', [])):
        d = sg.get('device', 0) if isinstance(sg, dict) else 0
        if not isinstance(d, int) or d < 0 or d >= len(dt):
            return ('segments[%d] is on device %r but there are %d device traces '
                    '(memory_viz: snapshot.device_traces[device] is not iterable)' % (i, d, len(dt)))
    return None

with open(sys.argv[1], 'rb') as f:
    out = pickle.load(f)
problem = viz_problem(out)
if problem and len(sys.argv) > 2:
    # Not the writer's fault when the input already had the problem.
    try:
        with open(sys.argv[2], 'rb') as f:
            head = f.read(1)
            f.seek(0)
            src = pickle.load(f) if head == b'\x80' else json.load(f) if head in b'{[' else None
        if src is not None and viz_problem(src):
            problem = None
    except Exception:
        pass
if problem:
    sys.exit(problem)
"""
# Python's own unpickler may need a lot of memory on a hostile input (a memo index of 2^32 is
# an array of 2^32 slots): the check runs under this address-space cap.
PY_CHECK_AS = 6 << 30


def is_asan(binary):
    if os.environ.get("MEMF_HOSTILE_NO_RLIMIT"):
        return True
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30).stdout
        if "libasan" in out or "libclang_rt.asan" in out:
            return True
    except (OSError, subprocess.SubprocessError):
        pass
    pat = b"__asan_init"
    tail = b""
    with open(binary, "rb") as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                return False
            if pat in tail + b:
                return True
            tail = b[-len(pat):]


class Result:
    def __init__(self, inp, cmd):
        self.inp, self.cmd = inp, cmd
        self.rc = None
        self.secs = 0.0
        self.rss_mib = 0.0
        self.ok = True
        self.why = []
        self.skipped = False

    def fail(self, why):
        self.ok = False
        self.why.append(why)


class Runner:
    def __init__(self, args):
        self.a = args
        self.binary = os.path.abspath(args.binary)
        self.asan = is_asan(self.binary)
        # ASan's shadow memory, redzones and quarantine add to every allocation: there the RSS
        # budget is tripled (the uninstrumented build is the one held to --rss-limit-mib).
        self.rss_limit = args.rss_limit_mib * 1024 * 1024 * (ASAN_RSS_FACTOR if self.asan else 1)
        self.lock = threading.Lock()
        self.results = []
        self.count = 0

    # -- one process --------------------------------------------------------------------------
    def run(self, res, argv, cwd, timeout, input_bytes=0, stdout_path=None, stdin=None, check_text=True):
        """Runs argv; fills res (rc, secs, rss); returns the rc (None on timeout)."""
        limit_as = None if self.asan else self.rss_limit + input_bytes + (256 << 20)

        def pre():
            os.setsid()
            if limit_as is not None:
                resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        env = dict(os.environ)
        env.setdefault("ASAN_OPTIONS", "exitcode=99")
        env.setdefault("UBSAN_OPTIONS", "exitcode=99")
        out_path = stdout_path or os.path.join(cwd, ".stdout")
        err_path = os.path.join(cwd, ".stderr")
        with open(out_path, "wb") as so, open(err_path, "wb") as se:
            t0 = time.monotonic()
            try:
                p = subprocess.Popen(argv, cwd=cwd, stdout=so, stderr=se, stdin=stdin or subprocess.DEVNULL,
                                     preexec_fn=pre, env=env)
            except OSError as e:  # e.g. the executable is being relinked
                res.fail(f"cannot start {argv[0]}: {e.strerror}")
                res.stderr_tail = ""
                return None
            rc = None
            ru = None
            delay = 0.001
            killed = None
            while True:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid != 0:
                    p.returncode = 0  # reaped here; keeps Popen from waiting again
                    break
                el = time.monotonic() - t0
                if el > timeout and killed is None:
                    killed = "timeout"
                    os.killpg(p.pid, signal.SIGKILL)
                elif self.asan and killed is None and self._rss(p.pid) > 2 * self.rss_limit:
                    killed = "rss"
                    os.killpg(p.pid, signal.SIGKILL)
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            res.secs = time.monotonic() - t0
        res.rss_mib = ru.ru_maxrss / 1024.0
        if killed == "timeout":
            res.fail(f"hung: killed after {timeout:.0f} s")
        elif killed == "rss":
            res.fail(f"killed at {2 * self.rss_limit >> 20} MiB resident")
        elif os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            res.rc = -sig
            res.fail(f"signal {signal.Signals(sig).name}")
        else:
            res.rc = rc = os.WEXITSTATUS(status)
            if rc not in (0, 1, 2):
                res.fail(f"exit {rc}")
        if ru.ru_maxrss * 1024 > self.rss_limit:
            res.fail(f"RSS {res.rss_mib:.0f} MiB > {self.rss_limit >> 20} MiB")
        paths = [err_path] + ([out_path] if stdout_path is None else [])
        if check_text:
            for path in paths:
                why = self.scan(path)
                if why:
                    res.fail(f"{'stderr' if path == err_path else 'stdout'}: {why}")
        res.stderr_tail = self.tail(err_path)
        return res.rc

    @staticmethod
    def _rss(pid):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    @staticmethod
    def tail(path, n=300):
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - n))
                return f.read().decode("utf-8", "replace").strip().replace("\n", " | ")
        except OSError:
            return ""

    @staticmethod
    def scan(path):
        """Raw control bytes or invalid UTF-8 in a text output: a description, else None."""
        dec = codecs.getincrementaldecoder("utf-8")("strict")
        off = 0
        try:
            with open(path, "rb") as f:
                while True:
                    b = f.read(8 << 20)
                    if not b:
                        break
                    m = CONTROL.search(b)
                    if m:
                        return f"raw control byte 0x{m.group()[0]:02x} at byte {off + m.start()}"
                    try:
                        dec.decode(b)
                    except UnicodeDecodeError as e:
                        return f"invalid UTF-8 at byte {off + e.start}"
                    off += len(b)
            dec.decode(b"", final=True)
        except UnicodeDecodeError:
            return "invalid UTF-8 at the end"
        except OSError as e:
            return f"cannot read: {e}"
        return None

    def py_check(self, res, path, what, original=None):
        size = os.path.getsize(path)
        if size > (1 << 30):
            res.why.append(f"{what}: {size} bytes, not loaded in Python")
            return

        def cap():
            resource.setrlimit(resource.RLIMIT_AS, (PY_CHECK_AS, PY_CHECK_AS))

        argv = [sys.executable, "-c", PY_CHECK, path]
        if original and os.path.isfile(original) and os.path.getsize(original) < (256 << 20):
            argv.append(original)
        try:
            p = subprocess.run(argv, capture_output=True, timeout=300, preexec_fn=cap)
        except subprocess.TimeoutExpired:
            res.fail(f"{what}: Python's pickle.load did not finish in 300 s")
            return
        if p.returncode != 0:
            msg = p.stderr.decode("utf-8", "replace").strip().splitlines()
            res.fail(f"{what}: {msg[-1] if msg else 'python exit ' + str(p.returncode)}")

    # -- one (input, command) -----------------------------------------------------------------
    def job(self, inp, label, args, post, work_root, timeout, flags):
        res = Result(inp["name"], label)
        w = tempfile.mkdtemp(dir=work_root)
        try:
            argv = [self.binary] + [x.replace("{IN}", inp["path"]).replace("{W}", w) for x in args]
            rc = self.run(res, argv, w, timeout, inp["bytes"])
            if post and rc == 0:
                post(self, res, w, inp, flags)
            if label == "analyze --json" and "flag_wrong" in flags and rc == 0:
                check_flagged(res, os.path.join(w, ".stdout"))
        finally:
            shutil.rmtree(w, ignore_errors=True)
        self.record(res)
        return res

    def record(self, res):
        with self.lock:
            self.results.append(res)
            self.count += 1
            verdict = "SKIP" if res.skipped else ("PASS" if res.ok else "FAIL")
            rc = "-" if res.rc is None else str(res.rc)
            why = "; ".join(res.why)
            if not res.ok and getattr(res, "stderr_tail", ""):
                why += f"  [stderr: {res.stderr_tail[-160:]}]"
            print(f"{verdict} rc={rc:>3} {res.secs:7.2f}s {res.rss_mib:7.1f}MiB  {res.inp}  {res.cmd}"
                  + (f"  -- {why}" if why else ""), flush=True)


def check_flagged(res, stdout_path):
    import json
    try:
        with open(stdout_path, "rb") as f:
            docs = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        res.fail(f"analyze --json output is not JSON: {e}")
        return
    for d in docs:
        if d.get("input", {}).get("warnings"):
            return
        for dev in d.get("devices", []):
            if any(a.get("severity") == "error" for a in dev.get("anomalies", [])):
                return
    res.fail("silently wrong: exit 0, no anomaly of severity error, no input warning")


def post_report(r, res, w, inp, flags):
    p = os.path.join(w, "out.html")
    if not os.path.exists(p):
        res.fail("exit 0 but no page written")
        return
    size = os.path.getsize(p)
    if size > PAGE_LIMIT:
        res.fail(f"page is {size} bytes, over the 5,000,000-byte bound")


def post_bin(r, res, w, inp, flags):
    p = os.path.join(w, "out.bin")
    sub = Result(inp["name"], "convert -o X.bin; analyze X.bin")
    rc = r.run(sub, [r.binary, "analyze", p], w, r.a.timeout, os.path.getsize(p))
    if rc != 0:
        sub.fail(f"we wrote what we refuse: analyze of the written trace exits {rc}")
    r.record(sub)
    sub = Result(inp["name"], "convert -o X.bin; convert X.bin --to pickle; pickle.load")
    rc = r.run(sub, [r.binary, "convert", p, "--to", "pickle", "-o", os.path.join(w, "back.pickle")], w,
               r.a.timeout, os.path.getsize(p))
    if rc != 0:
        sub.fail(f"convert of the written trace to pickle exits {rc}")
    else:
        r.py_check(sub, os.path.join(w, "back.pickle"), "pickle written from the trace", inp.get("origin", inp["path"]))
    r.record(sub)


def post_pickle(r, res, w, inp, flags):
    r.py_check(res, os.path.join(w, "out.pickle"), "written pickle", inp.get("origin", inp["path"]))


COMMANDS = [
    ("analyze", ["analyze", "{IN}"], None),
    ("analyze --json", ["analyze", "{IN}", "--json"], None),
    ("dump", ["dump", "{IN}"], None),
    ("timeline", ["timeline", "{IN}"], None),
    ("timeline --csv", ["timeline", "{IN}", "--csv"], None),
    ("timeline --json", ["timeline", "{IN}", "--json"], None),
    ("blocks --at peak", ["blocks", "{IN}", "--at", "peak"], None),
    ("blocks --at oom --json", ["blocks", "{IN}", "--at", "oom", "--json"], None),
    ("report -o X.html", ["report", "{IN}", "-o", "{W}/out.html"], post_report),
    ("convert -o X.bin", ["convert", "{IN}", "-o", "{W}/out.bin"], post_bin),
    ("convert --to pickle", ["convert", "{IN}", "--to", "pickle", "-o", "{W}/out.pickle"], post_pickle),
    ("convert --to perfetto", ["convert", "{IN}", "--to", "perfetto", "-o", "{W}/out.perfetto.json"], None),
    ("convert --to collapsed", ["convert", "{IN}", "--to", "collapsed", "-o", "{W}/out.folded"], None),
]
SPECIAL_COMMANDS = ["analyze", "dump", "timeline", "blocks --at peak", "report -o X.html", "convert -o X.bin"]


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def output_checks(r, sample, html_input, work_root):
    """Class 5: outputs that must not destroy data, and write errors that must not be ignored."""
    tasks = []

    def full(label, args):
        def t():
            res = Result("sample_valid.pickle", f"{label} > /dev/full")
            w = tempfile.mkdtemp(dir=work_root)
            rc = r.run(res, [r.binary] + [a.replace("{IN}", sample) for a in args], w, r.a.timeout,
                       stdout_path="/dev/full")
            if rc is not None and rc != 2 and res.ok:
                res.fail(f"write error on standard output ignored: exit {rc}, expected 2")
            shutil.rmtree(w, ignore_errors=True)
            r.record(res)
        return t

    for label, args in (("analyze", ["analyze", "{IN}"]), ("analyze --json", ["analyze", "{IN}", "--json"]),
                        ("dump", ["dump", "{IN}"]), ("timeline --csv", ["timeline", "{IN}", "--csv"]),
                        ("blocks", ["blocks", "{IN}"]), ("report -o -", ["report", "{IN}", "-o", "-"]),
                        ("convert --to pickle -o -", ["convert", "{IN}", "--to", "pickle", "-o", "-"]),
                        ("convert --to collapsed -o -", ["convert", "{IN}", "--to", "collapsed", "-o", "-"])):
        tasks.append(full(label, args))

    def same(label, args, src, name):
        def t():
            res = Result(name, label)
            w = tempfile.mkdtemp(dir=work_root)
            p = os.path.join(w, name)
            shutil.copyfile(src, p)
            before = sha(p)
            r.run(res, [r.binary] + [a.replace("{IN}", name) for a in args], w, r.a.timeout, os.path.getsize(p))
            if not os.path.exists(p) or sha(p) != before:
                res.fail("the input file was overwritten")
            shutil.rmtree(w, ignore_errors=True)
            r.record(res)
        return t

    tasks.append(same("convert IN -o IN", ["convert", "{IN}", "-o", "{IN}"], sample, "same.pickle"))
    tasks.append(same("convert IN --to pickle -o IN", ["convert", "{IN}", "--to", "pickle", "-o", "{IN}"], sample, "same.pickle"))
    tasks.append(same("report IN -o IN", ["report", "{IN}", "-o", "{IN}"], sample, "same.pickle"))
    tasks.append(same("report IN.html (default output name)", ["report", "{IN}"], html_input, "viz.html"))

    def chardev(label, args):
        def t():
            res = Result("sample_valid.pickle", label)
            w = tempfile.mkdtemp(dir=work_root)
            node = os.path.join(w, "null")
            try:
                os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            except OSError as e:
                res.skipped = True
                res.why.append(f"cannot make a character device here ({e.strerror})")
                r.record(res)
                shutil.rmtree(w, ignore_errors=True)
                return
            r.run(res, [r.binary] + [a.replace("{IN}", sample).replace("{OUT}", node) for a in args], w, r.a.timeout)
            st = os.lstat(node)
            if not stat.S_ISCHR(st.st_mode):
                res.fail("the character device was replaced by a regular file")
            shutil.rmtree(w, ignore_errors=True)
            r.record(res)
        return t

    tasks.append(chardev("convert -o CHARDEV", ["convert", "{IN}", "-o", "{OUT}"]))
    tasks.append(chardev("report -o CHARDEV", ["report", "{IN}", "-o", "{OUT}"]))
    tasks.append(chardev("convert --to perfetto -o CHARDEV", ["convert", "{IN}", "--to", "perfetto", "-o", "{OUT}"]))

    def badarg(label, args, want_nonzero):
        def t():
            res = Result("sample_valid.pickle", label)
            w = tempfile.mkdtemp(dir=work_root)
            rc = r.run(res, [r.binary] + [a.replace("{IN}", sample) for a in args], w, r.a.timeout)
            if want_nonzero and rc == 0:
                res.fail("accepted silently (exit 0)")
            shutil.rmtree(w, ignore_errors=True)
            r.record(res)
        return t

    for label, args, nz in (
            ("analyze --device 18446744073709551616", ["analyze", "{IN}", "--device", "18446744073709551616"], True),
            ("blocks --device 18446744073709551616", ["blocks", "{IN}", "--device", "18446744073709551616"], True),
            ("analyze --device -1", ["analyze", "{IN}", "--device", "-1"], False),
            ("analyze --top 99999999999999999999", ["analyze", "{IN}", "--top", "99999999999999999999"], True),
            ("timeline --max-points 0", ["timeline", "{IN}", "--max-points", "0"], False),
            ("timeline --max-points 18446744073709551615", ["timeline", "{IN}", "--max-points", "18446744073709551615"], False),
            ("report --keyframes 4000000000", ["report", "{IN}", "--keyframes", "4000000000", "-o", "x.html"], False),
            ("blocks --at 18446744073709551615", ["blocks", "{IN}", "--at", "18446744073709551615"], False),
            ("blocks --at t-9223372036854775808", ["blocks", "{IN}", "--at", "t-9223372036854775808"], False),
            ("convert --zstd-level 1000", ["convert", "{IN}", "--zstd-level", "1000", "-o", "x.bin"], False)):
        tasks.append(badarg(label, args, nz))
    return tasks


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("src_dir")
    ap.add_argument("--out", help="write the table as TSV here")
    ap.add_argument("--corpus", help="generate the corpus here and keep it (reused when its MANIFEST.tsv exists)")
    ap.add_argument("--timeout", type=float, default=120.0, help="hang guard per command, seconds (120)")
    ap.add_argument("--special-timeout", type=float, default=20.0, help="hang guard for /dev/zero, /dev/urandom, a FIFO (20)")
    ap.add_argument("--rss-limit-mib", type=int, default=1024)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", action="append", help="only inputs whose name contains this (repeatable)")
    a = ap.parse_args()

    r = Runner(a)
    tmp = tempfile.mkdtemp(prefix="memf-hostile-")
    try:
        corpus = a.corpus or os.path.join(tmp, "corpus")
        t0 = time.monotonic()
        manifest = os.path.join(corpus, "MANIFEST.tsv")
        if a.corpus and os.path.exists(manifest):
            print(f"corpus: reused {corpus}", flush=True)
        else:
            # In a process of its own: the generator holds hundreds of MB for a few seconds, and a
            # child's ru_maxrss starts from the RSS of the process it was forked from.
            subprocess.run([sys.executable, os.path.join(a.src_dir, "tools", "make_hostile.py"), corpus],
                           check=True, stdout=subprocess.DEVNULL)
            print(f"corpus: generated in {time.monotonic() - t0:.1f} s into {corpus}", flush=True)
        entries = []
        with open(manifest) as f:
            for line in f:
                name, cls, flags, note = line.rstrip("\n").split("\t", 3)
                entries.append((name, [x for x in flags.split(",") if x]))
        print(f"binary: {r.binary}{' (sanitizer build: RSS measured, no address-space cap)' if r.asan else ''}", flush=True)
        work = os.path.join(tmp, "work")
        os.makedirs(work)
        inputs = []
        for name, flags in entries:
            if a.only and not any(o in name for o in a.only):
                continue
            p = os.path.join(corpus, name)
            inputs.append({"name": name, "path": p, "bytes": os.path.getsize(p), "flags": flags})
        # Derived inputs: the native traces memforensics itself writes from the replay shapes.
        derived = os.path.join(tmp, "derived")
        os.makedirs(derived)
        for inp in list(inputs):
            if "derive_bin" not in inp["flags"]:
                continue
            out = os.path.join(derived, inp["name"].rsplit(".", 1)[0] + ".converted.bin")
            try:
                p = subprocess.run([r.binary, "convert", inp["path"], "-o", out], capture_output=True, timeout=a.timeout)
            except subprocess.TimeoutExpired:
                continue
            if p.returncode == 0 and os.path.exists(out):
                flags = [f for f in inp["flags"] if f != "derive_bin"]
                if b"warning" in p.stderr:
                    # convert already said what was wrong with the value (e.g. a negative time_us
                    # read as "no time"): the trace it wrote holds the corrected value.
                    flags = [f for f in flags if f != "flag_wrong"]
                inputs.append({"name": os.path.basename(out), "path": out, "bytes": os.path.getsize(out), "flags": flags,
                               "origin": inp["path"]})
        fifo = os.path.join(tmp, "fifo_no_writer")
        os.mkfifo(fifo)
        specials = [{"name": "/dev/zero", "path": "/dev/zero", "bytes": 0, "flags": []},
                    {"name": "/dev/urandom", "path": "/dev/urandom", "bytes": 0, "flags": []},
                    {"name": "FIFO without writer", "path": fifo, "bytes": 0, "flags": []}]
        if a.only:
            specials = [s for s in specials if any(o in s["name"] for o in a.only)]

        tasks = []
        for inp in inputs:
            for label, args, post in COMMANDS:
                # Class 10 (budget) inputs are sized to show time and memory out of proportion:
                # a sanitizer build, 3-10x slower and held to no RSS cap, runs two commands on
                # them (their memory safety), not all fifteen, and not the read-back of what
                # convert wrote (two more runs, checked by the build without sanitizers).
                if r.asan and "budget" in inp["flags"]:
                    if label not in ASAN_BUDGET_COMMANDS:
                        continue
                    post = None
                tasks.append((r.job, (inp, label, args, post, work, a.timeout, inp["flags"])))
        for inp in specials:
            for label, args, post in COMMANDS:
                if label in SPECIAL_COMMANDS:
                    tasks.append((r.job, (inp, label, args, post, work, a.special_timeout, [])))
        sample = os.path.join(corpus, "sample_valid.pickle")
        html = os.path.join(corpus, "c7_invalid_utf8.html")
        if not a.only and os.path.exists(sample) and os.path.exists(html):
            tasks += [(t, ()) for t in output_checks(r, sample, html, work)]

        # Largest inputs first, so that the slow ones overlap the many small ones.
        tasks.sort(key=lambda t: -(t[1][0]["bytes"] if t[1] else 0))
        t_run = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
            futs = [ex.submit(f, *args) for f, args in tasks]
            for fu in futs:
                fu.result()
        wall = time.monotonic() - t_run

        res = r.results
        passed = sum(1 for x in res if x.ok and not x.skipped)
        failed = sum(1 for x in res if not x.ok)
        skipped = sum(1 for x in res if x.skipped)
        if a.out:
            with open(a.out, "w") as f:
                f.write("input\tcommand\trc\tseconds\tmax_rss_mib\tverdict\treason\n")
                for x in sorted(res, key=lambda x: (x.inp, x.cmd)):
                    v = "SKIP" if x.skipped else ("PASS" if x.ok else "FAIL")
                    f.write(f"{x.inp}\t{x.cmd}\t{'' if x.rc is None else x.rc}\t{x.secs:.2f}\t{x.rss_mib:.1f}\t{v}\t"
                            f"{'; '.join(x.why)}\n")
        biggest = max(res, key=lambda x: x.rss_mib)
        longest = max(res, key=lambda x: x.secs)
        slow = [x for x in res if x.secs > SLOW_S]
        commands = sorted({x.cmd for x in res})
        print(f"inputs: {len(inputs) + len(specials)} ({len(specials)} special files), command kinds: {len(commands)}, "
              f"runs: {len(res)}, wall {wall:.0f} s with {a.jobs} jobs")
        print(f"largest RSS: {biggest.rss_mib:.0f} MiB ({biggest.inp}, {biggest.cmd})")
        print(f"longest time: {longest.secs:.1f} s ({longest.inp}, {longest.cmd})")
        print(f"runs over {SLOW_S:.0f} s: {len(slow)}" + "".join(f"\n  {x.secs:.1f} s  {x.inp}  {x.cmd}" for x in slow))
        if failed:
            print("failed:")
            for x in sorted(res, key=lambda x: (x.inp, x.cmd)):
                if not x.ok:
                    print(f"  {x.inp}  {x.cmd}  -- {'; '.join(x.why)}")
        if skipped:
            print(f"skipped: {skipped}")
        print(f"hostile: {passed} passed, {failed} failed")
        return 1 if failed else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
