#!/usr/bin/env bash
# Native trace benchmarks: size against the pickle on every real snapshot, load time of the same
# content from each form, writer and decoder throughput.
#
# Usage: bench/trace_bench.sh BUILD_DIR [OUT_MD]
#   BUILD_DIR must be configured with -DMEMF_BUILD_BENCH=ON (it builds bench/trace_bench) and
#   contain src/cli/memforensics. The >= 300 MB file is the one bench/run_bench.sh builds into
#   bench/out/ (run that first, or the large row is skipped).
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 BUILD_DIR [OUT_MD]" >&2; exit 2; }
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
BUILD=$(cd "$1" && pwd -P)
OUT_MD=${2:-}
REAL="$REPO/../shared/snapshots-real"
[ -d "$REAL" ] || { echo "error: $REAL not found" >&2; exit 1; }
cmake --build "$BUILD" --target trace_bench memforensics >/dev/null
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# 1. Sizes: memforensics convert (default zstd level 3) on every real snapshot.
for f in "$REAL"/*.pickle; do
  "$BUILD/src/cli/memforensics" convert "$f" -o "$TMP/$(basename "$f" .pickle).bin" 2>/dev/null
done
LARGE=$(ls -S "$REPO"/bench/out/*.pickle 2>/dev/null | head -1 || true)
LOADS=("$REAL/wedsonlin__assignment2-systems__medium_128_training_memory_snapshot.pickle"
       "$REAL/zidongliu__decomfl__memory.pickle"
       "$REAL/felixburton7__voxelflex__dump_snapshot.pickle")
[ -n "$LARGE" ] && LOADS+=("$LARGE") && "$BUILD/src/cli/memforensics" convert "$LARGE" -o "$TMP/large.bin" 2>/dev/null

# 2. Load times (same content, from memory) and writer/decoder throughput.
"$BUILD/bench/trace_bench" --benchmark_min_time=0.3 --benchmark_format=json "${LOADS[@]}" > "$TMP/bench.json"

TABLE=$(python3 - "$REAL" "$TMP" "${LARGE:-}" <<'PY'
import json, os, sys
real, tmp, large = sys.argv[1], sys.argv[2], sys.argv[3]
out = []
out.append("| real snapshot | pickle bytes | native bytes | pickle / native |")
out.append("|---|---:|---:|---:|")
worst = None
for f in sorted(os.listdir(real)):
    if not f.endswith(".pickle"):
        continue
    p = os.path.getsize(os.path.join(real, f))
    n = os.path.getsize(os.path.join(tmp, f[:-7] + ".bin"))
    worst = p / n if worst is None else min(worst, p / n)
    out.append("| %s | %d | %d | %.1f |" % (f[:-7], p, n, p / n))
if large:
    p = os.path.getsize(large); n = os.path.getsize(os.path.join(tmp, "large.bin"))
    out.append("| %s (built) | %d | %d | %.1f |" % (os.path.basename(large)[:-7], p, n, p / n))
out.append("")
out.append("Smallest ratio over the real snapshots: %.1f (target: at least 10)." % worst)
out.append("")
b = json.load(open(os.path.join(tmp, "bench.json")))["benchmarks"]
by = {x["name"]: x for x in b}
out.append("| load (same content, from memory) | events | pickle ms | native ms | speed-up |")
out.append("|---|---:|---:|---:|---:|")
for name in by:
    if not name.startswith("BM_Load/pickle/"):
        continue
    stem = name[len("BM_Load/pickle/"):]
    pk, nat = by[name], by["BM_Load/native/" + stem]
    out.append("| %s | %d | %.3f | %.3f | %.1f× |" % (stem, pk["events"], pk["real_time"], nat["real_time"],
                                                    pk["real_time"] / nat["real_time"]))
out.append("")
out.append("| throughput (1 Mi synthetic events, one core) | events/s | bytes/event |")
out.append("|---|---:|---:|")
for name, x in by.items():
    if name.startswith("BM_TraceWriter"):
        out.append("| writer, zstd level %s (checkpoints on) | %.1f M | %.2f |" % (name.split("/")[1], x["items_per_second"] / 1e6, x["bytes_per_event"]))
    elif name.startswith("BM_TraceDecode"):
        out.append("| decoder, zstd level %s | %.1f M | |" % (name.split("/")[1], x["items_per_second"] / 1e6))
print("\n".join(out))
PY
)
echo "$TABLE"
[ -z "$OUT_MD" ] || { printf '%s\n' "$TABLE" > "$OUT_MD"; echo "wrote $OUT_MD" >&2; }
