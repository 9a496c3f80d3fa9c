# large_file.sh: sourced by the benchmark scripts. memf_large_file REAL_DIR PY sets LARGEST (the
# largest real snapshot) and LARGE (a >= 300 MB snapshot built from it with make_large.py into
# bench/out/, reused while it is newer than its inputs).
# Environment: MEMF_BENCH_SOURCE names the real snapshot to replicate instead of the largest one
# (issue 16 measured zidongliu__decomfl__memory, a complete trace: 207 copies, 4.78 M events);
# MEMF_BENCH_N the number of copies (grown when the file comes out under 300 MB); MEMF_BENCH_OUT
# the folder for the built file instead of bench/out/.
memf_large_file() {
    local REAL_DIR=$1 PY=$2
    local SCRIPT_DIR
    SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
    local REPO="$SCRIPT_DIR/.."
    # largest real snapshot (by size)
    LARGEST=""
    local LARGEST_SIZE=0 s f
    for f in "$REAL_DIR"/*.pickle; do
        [ -f "$f" ] || continue
        s=$(stat -c %s "$f")
        if [ "$s" -gt "$LARGEST_SIZE" ]; then LARGEST=$f; LARGEST_SIZE=$s; fi
    done
    [ -n "$LARGEST" ] || { echo "error: no *.pickle in $REAL_DIR" >&2; exit 1; }
    if [ -n "${MEMF_BENCH_SOURCE:-}" ]; then
        LARGEST=$REAL_DIR/$(basename "$MEMF_BENCH_SOURCE" .pickle).pickle
        [ -f "$LARGEST" ] || { echo "error: $LARGEST not found" >&2; exit 1; }
        LARGEST_SIZE=$(stat -c %s "$LARGEST")
    fi

    # >= 300 MB file: N copies of the largest file's device 0 (copies come out a bit larger than
    # the source file, so ceil(300 MB / size) is normally enough; grow N if not)
    local TARGET=300000000 OUT_DIR N LSIZE
    OUT_DIR="${MEMF_BENCH_OUT:-$REPO/bench/out}"
    mkdir -p "$OUT_DIR"
    N=$(( (TARGET + LARGEST_SIZE - 1) / LARGEST_SIZE ))
    if [ -n "${MEMF_BENCH_N:-}" ]; then N=$MEMF_BENCH_N; fi  # copies (grown if under 300 MB)
    while :; do
        LARGE="$OUT_DIR/$(basename "$LARGEST" .pickle)_x$N.pickle"
        if [ ! -s "$LARGE" ] || [ "$LARGE" -ot "$LARGEST" ] || [ "$LARGE" -ot "$SCRIPT_DIR/make_large.py" ]; then
            echo "building $LARGE ..." >&2
            "$PY" "$SCRIPT_DIR/make_large.py" "$LARGEST" "$N" -o "$LARGE"
        fi
        LSIZE=$(stat -c %s "$LARGE")
        [ "$LSIZE" -ge "$TARGET" ] && break
        N=$(( N * TARGET / LSIZE + 1 ))
    done
}
