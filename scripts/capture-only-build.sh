#!/usr/bin/env bash
# Proves the capture-only build (docs/capture.md, "Building on a machine with only a compiler and
# CUDA"): -DMEMF_CAPTURE_ONLY=ON configures and builds the capture libraries with find_package() of
# CLI11, nlohmann_json, Boost and GTest disabled, once with zstd and once without
# (-DCMAKE_DISABLE_FIND_PACKAGE_zstd=ON), and the traces these builds write are read by the full
# build's memforensics (the normal reader):
#   * capture_only_probe (tests/capture-only): the capture core records a fixed stream, reads it
#     back itself (all chunks stored without zstd) and prints what analyze must report;
#   * libmemforensics_cupti.so driven by the stand-in libcupti (tests/capture/cupti_inject_sim.cc):
#     the events of its "normal" run.
# libmemforensics_torch.so is built too when the configure finds a CUDA torch (not in CI).
# Only the capture targets are built (75 s to 2 min per tree on 2 cores). Called from .ci/run.
#
#   scripts/capture-only-build.sh [--reader PATH/TO/memforensics] [--dir BASE] [-j N]
#
# BASE (default build-capture-only in this checkout, so that two checkouts never share a tree)
# gets the zstd tree; BASE-nozstd the other one.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
reader=$root/build/src/cli/memforensics
base=$root/build-capture-only
jobs=2
while [ $# -gt 0 ]; do
  case $1 in
    --reader) reader=$2; shift 2 ;;
    --dir) base=$2; shift 2 ;;
    -j) jobs=$2; shift 2 ;;
    *) echo "usage: $0 [--reader MEMFORENSICS] [--dir BASE] [-j N]" >&2; exit 2 ;;
  esac
done
[ -x "$reader" ] || { echo "capture-only-build: no memforensics at $reader (build the full project first, or --reader)" >&2; exit 2; }
py=${PYTHON:-python3}

fail() { echo "capture-only-build: FAILED: $*" >&2; exit 1; }

# analyze --json of FILE must match the expectation (JSON: device -> events_by_action, peak).
check_read() {
  local file=$1 want=$2 what=$3
  "$reader" analyze "$file" --json | head -1 | "$py" -c '
import json, sys
got, want, what = json.load(sys.stdin), json.loads(sys.argv[1]), sys.argv[2]
errors = []
if got["input"].get("warnings"):
    errors.append("reader warnings: %s" % got["input"]["warnings"])
devs = {str(d["device"]): d for d in got["devices"]}
if sorted(devs) != sorted(want):
    errors.append("devices %s, expected %s" % (sorted(devs), sorted(want)))
for dev, w in want.items():
    g = devs.get(dev, {})
    if g.get("events_by_action") != w["events_by_action"]:
        errors.append("device %s: events %s, expected %s" % (dev, g.get("events_by_action"), w["events_by_action"]))
    if g.get("peak_reserved_bytes") != w["peak_reserved_bytes"]:
        errors.append("device %s: peak reserved %s, expected %s" % (dev, g.get("peak_reserved_bytes"), w["peak_reserved_bytes"]))
for e in errors:
    print("capture-only-build: %s: %s" % (what, e), file=sys.stderr)
if errors:
    sys.exit(1)
print("capture-only-build: %s: read by the full build: %s" % (what, ", ".join(
    "device %s %d events, peak %d B" % (k, sum(v["events_by_action"].values()), v["peak_reserved_bytes"])
    for k, v in sorted(want.items()))))
' "$want" "$what"
}

# What cupti_inject_sim's "normal" run records (tests/capture/cupti_inject_sim.cc, header comment;
# the same numbers as tests/capture/record_test.py).
sim_want='{"0": {"events_by_action": {"alloc": 2, "free_requested": 1, "free_completed": 1, "segment_alloc": 2, "segment_free": 1}, "peak_reserved_bytes": 1051648},
           "1": {"events_by_action": {"alloc": 1, "segment_map": 1}, "peak_reserved_bytes": 2097152}}'

for variant in zstd nozstd; do
  dir=$base
  extra=()
  if [ $variant = nozstd ]; then dir=$base-nozstd; extra=(-DCMAKE_DISABLE_FIND_PACKAGE_zstd=ON); fi
  echo "== capture-only build ($variant) in $dir"
  mkdir -p "$dir"
  cmake -S "$root" -B "$dir" -G Ninja --no-warn-unused-cli -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMEMF_CAPTURE_ONLY=ON -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON \
    -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON "${extra[@]}" >"$dir/memf-configure.log" 2>&1 ||
    { cat "$dir/memf-configure.log" >&2; fail "configure ($variant)"; }
  grep -E '^-- memforensics:' "$dir/memf-configure.log" || true
  if grep -Eq '^(CLI11|nlohmann_json|Boost|GTest)_DIR:PATH=/' "$dir/CMakeCache.txt"; then
    fail "a capture-only configure found one of CLI11, nlohmann_json, Boost, GTest"
  fi
  targets=(memf_capture capture_only_probe)
  targets_all=$(ninja -C "$dir" -t targets all)
  have() { grep -q "^$1: " <<<"$targets_all"; }
  have memforensics_cupti && targets+=(memforensics_cupti cupti_inject_sim)
  have memforensics_torch && targets+=(memforensics_torch)
  cmake --build "$dir" -j"$jobs" --target "${targets[@]}" >"$dir/memf-build.log" 2>&1 ||
    { tail -40 "$dir/memf-build.log" >&2; fail "build ($variant)"; }
  echo "built: ${targets[*]}"

  trace=$dir/probe.bin
  want=$("$dir/tests/capture-only/capture_only_probe" "$trace") || fail "capture_only_probe ($variant)"
  want_devices=$("$py" -c 'import json, sys; j = json.loads(sys.argv[1]); print(json.dumps(j["devices"])); print("zstd chunks: %d of %d" % (j["zstd_chunks"], j["chunks"]), file=sys.stderr)' "$want")
  check_read "$trace" "$want_devices" "capture core ($variant)"

  if have memforensics_cupti; then
    lib=$dir/src/capture/libmemforensics_cupti.so
    if [ $variant = nozstd ] && ldd "$lib" | grep -q libzstd; then fail "$lib links libzstd in a build without zstd"; fi
    rm -f "$dir/sim.bin"
    MEMFORENSICS_QUIET=1 MEMFORENSICS_CUPTI_OUT=$dir/sim.bin \
      "$dir/tests/capture-only/cupti_inject_sim" "$dir/tests/capture-only/fake_cupti/libcupti.so.13" "$lib" normal >/dev/null ||
      fail "cupti_inject_sim ($variant)"
    check_read "$dir/sim.bin" "$sim_want" "CUPTI library ($variant)"
  else
    echo "capture-only-build: no CUPTI found: libmemforensics_cupti.so not built ($variant)"
  fi
done
echo "capture-only-build: OK"
