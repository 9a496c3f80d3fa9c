#!/usr/bin/env bash
# The HTML report on every real snapshot and on the >= 300 MB benchmark file: time, peak RSS and
# page size of `memforensics report`, against what memory_viz would need for the same file (its
# trace_plot page embeds the whole pickle base64-encoded, 4/3 of the file, and the browser then
# unpickles it in JavaScript) and against Python's own pickle.load of the file (the first step of
# any Python-side viewer). Then the large file's report is opened in headless Chromium with the
# browser test's checks (tests/report/browser_test.py --input).
#
# Usage: bench/report_bench.sh BUILD_DIR [OUT_MD]
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 BUILD_DIR [OUT_MD]" >&2; exit 2; }
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd "$SCRIPT_DIR/.." && pwd -P)
BUILD_DIR=$(cd "$1" && pwd -P)
OUT_MD=${2:-}
BIN="$BUILD_DIR/src/cli/memforensics"
[ -x "$BIN" ] || { echo "error: $BIN not found: build first" >&2; exit 1; }
REAL_DIR=$(cd "$REPO/../shared/snapshots-real" && pwd -P)
PY=$(python3 -c 'import sys; print(sys.executable)')
source "$SCRIPT_DIR/large_file.sh"
memf_large_file "$REAL_DIR" "$PY"

TABLE=$("$PY" - "$BIN" "$PY" "$REAL_DIR"/*.pickle "$LARGE" <<'PYEOF'
import os, resource, subprocess, sys, tempfile, time

binary, py, files = sys.argv[1], sys.argv[2], sys.argv[3:]

def timed(cmd):
    """Best of 3 wall-clock seconds and the largest peak RSS (KiB) of a fresh child."""
    best, rss = None, 0
    for _ in range(3):
        r = subprocess.run([py, "-c", "import resource,subprocess,sys,time\n"
                            "t=time.perf_counter(); rc=subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
                            "print(time.perf_counter()-t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)"] + cmd,
                           capture_output=True, text=True, check=True)
        wall, kib, rc = r.stdout.split()
        if rc != "0":
            raise SystemExit(f"{cmd} exited {rc}")
        best = float(wall) if best is None else min(best, float(wall))
        rss = max(rss, int(kib))
    return best, rss

def mb(n):
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} KB"

print("| file | pickle | report | memory_viz page (4/3 of the pickle) | report time | peak RSS | Python pickle.load | ratio |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
with tempfile.TemporaryDirectory() as td:
    for f in files:
        out = os.path.join(td, "r.html")
        t, rss = timed([binary, "report", f, "-o", out])
        size = os.path.getsize(out)
        tp, _ = timed([py, "-c", "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))", f])
        n = os.path.getsize(f)
        name = os.path.basename(f).replace(".pickle", "")
        print(f"| {name} | {mb(n)} | {mb(size)} | {mb(4 * ((n + 2) // 3))} | {t:.2f} s | {rss / 1024:.0f} MiB | {tp:.2f} s | {tp / t:.1f}x |")
PYEOF
)
echo "$TABLE"
[ -z "$OUT_MD" ] || echo "$TABLE" > "$OUT_MD"
echo "opening the large file's report in headless Chromium ..." >&2
"$PY" "$REPO/tests/report/browser_test.py" "$BIN" "$REPO" --only input --input "$LARGE" \
    --artifacts "$REPO/bench/out/report-screenshots"
