#!/usr/bin/env bash
# Benchmark memforensics against Python's own pickle.load on real and large snapshots.
#
# Usage: bench/run_bench.sh BUILD_DIR [OUT_MD]
#
# Files: the largest snapshot in ../shared/snapshots-real (relative to the repository root), and
# a >= 300 MB snapshot built from it with bench/make_large.py into bench/out/ (reused while it is
# newer than its inputs).  For each file it times, best of 5 wall-clock runs (3 for Python),
#   BUILD_DIR/src/cli/memforensics analyze --json FILE >/dev/null
#   python3 -c "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))" FILE
# and records both peak RSS (/usr/bin/time -f %M when installed, Debian package `time`;
# otherwise resource.getrusage(RUSAGE_CHILDREN) in a fresh measuring process per run) and the CPU
# time (user + sys) of the best run. The large file is timed a second time with MEMF_THREADS=1
# (the analysis on one core) to show what the cores add.
# Then the native-trace row (issue 16): the large file converted with `memforensics convert` and
# its defaults (zstd level 3, a checkpoint every 262,144 events, as convert writes them) into
# the same folder, and `analyze --json` of that .bin timed the same way, with the default threads
# and with MEMF_THREADS=1.
# Environment: see bench/large_file.sh (MEMF_BENCH_SOURCE, MEMF_BENCH_N, MEMF_BENCH_OUT).
#
# Before the table it prints how fast a fresh process writes 256 MB of memory it never touched,
# in 4 KB pages and with the huge-page hint: every command here pays that for the fresh memory it
# takes (Python's pickle.load about 2.4 GB, memforensics 0.3-0.45 GB). On the project machine (a
# VM that hands freed memory back to its host within seconds) it is 1-1.5 GB/s whatever ran
# before, where a bare-metal machine zeroes pages at 10 GB/s or more; write the figure with the
# table, since a machine whose figure differs gives other times.
set -euo pipefail

usage() { echo "usage: $0 BUILD_DIR [OUT_MD]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd "$SCRIPT_DIR/.." && pwd -P)
BUILD_DIR=$(cd "$1" 2>/dev/null && pwd -P) || { echo "error: build directory '$1' not found" >&2; exit 1; }
OUT_MD=${2:-}
BIN="$BUILD_DIR/src/cli/memforensics"
if [ ! -x "$BIN" ]; then
    echo "error: memforensics binary not found at $BIN" >&2
    echo "       build it first, e.g.: cmake -S $REPO -B $BUILD_DIR -DCMAKE_BUILD_TYPE=Release && cmake --build $BUILD_DIR" >&2
    exit 1
fi

REAL_DIR="$REPO/../shared/snapshots-real"
if [ ! -d "$REAL_DIR" ]; then
    echo "error: real snapshots directory not found: $REAL_DIR" >&2
    exit 1
fi
REAL_DIR=$(cd "$REAL_DIR" && pwd -P)

PY=$(python3 -c 'import sys; print(sys.executable)')
[ -x "$PY" ] || { echo "error: cannot resolve the python3 executable" >&2; exit 1; }

# the largest real snapshot and the >= 300 MB file built from it (bench/large_file.sh)
source "$SCRIPT_DIR/large_file.sh"
memf_large_file "$REAL_DIR" "$PY"

TIME_BIN=""
if [ -x /usr/bin/time ]; then TIME_BIN=/usr/bin/time; fi

NATIVE="${LARGE%.pickle}.bin"
if [ ! -s "$NATIVE" ] || [ "$NATIVE" -ot "$LARGE" ] || [ "$NATIVE" -ot "$BIN" ]; then
    echo "converting $LARGE to $NATIVE ..." >&2
    "$BIN" convert "$LARGE" -o "$NATIVE" >/dev/null
fi

# First-write speed of fresh memory (see above).
MEMSTATE=$("$PY" - <<'PYEOF'
import mmap, subprocess, sys, time
# One fresh process per figure; MADV_HUGEPAGE is 14 on Linux.
PROBE = r'''
import mmap, sys, time
n = 256 << 20
m = mmap.mmap(-1, n)
if sys.argv[1] == "huge":
    try:
        m.madvise(14)
    except (AttributeError, OSError):
        pass
view = memoryview(m)
t0 = time.perf_counter()
for off in range(0, n, 4096):
    view[off] = 1
print("%.2f" % (n / (time.perf_counter() - t0) / 1e9))
'''
rates = []
for kind in ("4k", "huge"):
    runs = [float(subprocess.check_output([sys.executable, "-c", PROBE, kind], text=True))
            for _ in range(3)]
    rates.append("%s pages %.2f-%.2f GB/s" % ("4 KB" if kind == "4k" else "huge", min(runs), max(runs)))
print("first write of fresh memory (256 MB, 3 processes each): " + ", ".join(rates))
PYEOF
)
echo "$MEMSTATE" >&2

TABLE=$("$PY" - "$PY" "$BIN" "$TIME_BIN" "$NATIVE" "$LARGEST" "$LARGE" <<'PYEOF'
import os, subprocess, sys, tempfile

py, binary, time_bin, native = sys.argv[1:5]
files = sys.argv[5:]
RUNS = 5          # memforensics: its times vary by 20-30 % between runs on the shared machine
PY_RUNS = 3       # pickle.load: 10-25 s a run

# Runs one command in a fresh process: prints "<wall seconds> <peak RSS KiB> <exit code> <CPU
# seconds, user + sys, of the command and its children>".
MEASURE = r'''
import os, resource, subprocess, sys, time
time_bin, out = sys.argv[1], sys.argv[2]
cmd = sys.argv[3:]
rss_file = None
if time_bin:
    fd, rss_file = __import__("tempfile").mkstemp()
    os.close(fd)
    cmd = [time_bin, "-f", "%M", "-o", rss_file] + cmd
with open(out, "wb") as sink:
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, stdin=subprocess.DEVNULL, stdout=sink)
    wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss   # KiB on Linux
if rss_file:
    try:
        with open(rss_file) as f:
            lines = [l for l in f.read().split("\n") if l.strip().isdigit()]
        if lines:
            rss = int(lines[-1])
    finally:
        os.unlink(rss_file)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print("%.6f %d %d %.6f" % (wall, rss, rc, ru.ru_utime + ru.ru_stime))
'''

def measure(cmd, env=None, runs=RUNS):
    """Best wall time of `runs` runs, the CPU time (user + sys) of that run, the peak RSS of all."""
    best, cpu, peak, rc = None, 0.0, 0, 0
    for _ in range(runs):
        r = subprocess.run([py, "-c", MEASURE, time_bin, os.devnull] + cmd,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           env=dict(os.environ, **(env or {})))
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            raise SystemExit("measuring %s failed" % cmd)
        wall, kib, code, used = r.stdout.split()
        if int(code) != 0:
            rc = int(code)
        if best is None or float(wall) < best:
            best, cpu = float(wall), float(used)
        peak = max(peak, int(kib))
    return best, peak * 1024, rc, cpu

rows = []
ONE_THREAD = {"MEMF_THREADS": "1"}   # the analysis (and the native decoding) on one core

def cell(seconds, rc):
    return "%.3f" % seconds if rc == 0 else "%.3f (exit %d)" % (seconds, rc)

for path in files:
    size = os.path.getsize(path)
    sys.stderr.write("timing %s (%.1f MB) ...\n" % (os.path.basename(path), size / 1e6))
    mf_s, mf_rss, mf_rc, mf_cpu = measure([binary, "analyze", "--json", path])
    py_s, py_rss, py_rc, _ = measure([py, "-c",
                                      "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))", path],
                                     runs=PY_RUNS)
    if mf_rc != 0:
        sys.stderr.write("warning: memforensics exited with %d on %s\n" % (mf_rc, path))
    speed = "%.1f" % (py_s / mf_s) if mf_s > 0 and mf_rc == 0 and py_rc == 0 else "n/a"
    rows.append("| %s | %.1f | %s | %.3f | %s | %s | %.1f | %.2f | %.1f |" % (
        os.path.basename(path), size / 1e6, cell(mf_s, mf_rc), mf_cpu, cell(py_s, py_rc), speed,
        mf_rss / 1e6, mf_rss / size, py_rss / 1e6))
    if path == files[-1]:
        one_s, one_rss, one_rc, one_cpu = measure([binary, "analyze", "--json", path], ONE_THREAD)
        speed = "%.1f" % (py_s / one_s) if one_s > 0 and one_rc == 0 and py_rc == 0 else "n/a"
        rows.append("| same, MEMF_THREADS=1 | | %s | %.3f | | %s | %.1f | %.2f | |" % (
            cell(one_s, one_rc), one_cpu, speed, one_rss / 1e6, one_rss / size))

sys.stderr.write("timing %s (native trace) ...\n" % os.path.basename(native))
for label, env in (("", None), (", MEMF_THREADS=1", ONE_THREAD)):
    nat_s, nat_rss, nat_rc, nat_cpu = measure([binary, "analyze", "--json", native], env)
    rows.append("| %s (native trace of the row above, checkpoints on%s) | %.1f | %s | %.3f | | | %.1f | | |" % (
        os.path.basename(native), label, os.path.getsize(native) / 1e6, cell(nat_s, nat_rc), nat_cpu,
        nat_rss / 1e6))

print("| file | size MB | memforensics s | memforensics CPU s | python s | speedup × | memforensics peak RSS MB | RSS/file-size ratio | python peak RSS MB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
print("\n".join(rows))
PYEOF
)

TABLE=$(printf '%s\n\n%s\n' "$MEMSTATE" "$TABLE")
echo "$TABLE"
if [ -n "$OUT_MD" ]; then
    printf '%s\n' "$TABLE" > "$OUT_MD"
    echo "wrote $OUT_MD" >&2
fi
