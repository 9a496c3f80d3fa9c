#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ into build-fuzz/ (clang, ASan + UBSan) and runs each one
# for SECONDS_PER_TARGET (default 60). Exits non-zero, naming the reproducer, when a target finds a
# crash, a sanitizer report, a leak, a timeout or an out-of-memory. See docs/fuzzing.md.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
#
# Corpora live in build-fuzz/fuzz-work/<target>/ (kept between local runs, never in the
# repository). Each run starts from that corpus plus fresh seeds:
#   * fuzz/corpus/<target>/: committed regression inputs (add every input that once crashed);
#   * for fuzz_pickle: fuzz/make_seeds.py's minimised copies of snapshots/*.pickle and of
#     ../shared/snapshots-real/*.pickle when present (a real snapshot is 0.1-3 MB; fuzzing it
#     whole runs a few inputs a second), plus the small ones as they are;
#   * for fuzz_trace: those minimised snapshots converted to native traces (stored and zstd
#     chunks, a checkpoint every 16 events) and each cut in half;
#   * fuzz_pipeline builds its snapshots from the input bytes and needs no seeds (-max_len 4096);
#   * fuzz_profiler (torch.profiler traces and memory timelines, plain and gzip): the committed
#     fuzz/corpus/fuzz_profiler/, small fabricated traces that tools/make_profiler_traces.py
#     --seeds writes (hostile ones included), with fuzz/profiler.dict.
# A target's dictionary is fuzz/<target without fuzz_>.dict when there is one (fuzz/pickle.dict).
set -euo pipefail
seconds=${1:-60}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build-fuzz"
work="$build/fuzz-work"
"$root/scripts/setup-debian.sh"

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DMEMF_FUZZ=ON -DMEMF_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O2 -g" >/dev/null
cmake --build "$build" -j"$(nproc)" --target fuzzers memforensics

fuzzers=()
for f in "$build"/fuzz/fuzz_*; do
  [ -f "$f" ] && [ -x "$f" ] && fuzzers+=("$f")
done
if [ ${#fuzzers[@]} -eq 0 ]; then
  echo "fuzz.sh: no fuzzer was built in $build/fuzz" >&2
  exit 1
fi

failed=()
for bin in "${fuzzers[@]}"; do
  name=$(basename "$bin")
  corpus="$work/$name/corpus"
  seeds="$work/$name/seeds"
  artifacts="$work/$name/artifacts"
  log="$work/$name/fuzz.log"
  rm -rf "$seeds" "$artifacts"
  mkdir -p "$corpus" "$seeds" "$artifacts"
  dirs=("$corpus" "$seeds")
  [ -d "$root/fuzz/corpus/$name" ] && dirs+=("$root/fuzz/corpus/$name")
  max_len=65536
  extra=()
  case "$name" in
    fuzz_pipeline)
      # The input is a program that builds a snapshot in memory (no seeds needed): 4 KiB already
      # makes a few devices with ~150 events each; longer inputs only run slower. Every run walks
      # the whole pipeline (~40,000 features), which makes the entropic schedule's per-feature
      # bookkeeping most of the time: without it, 116 instead of 73 runs a second.
      max_len=4096
      extra=(-entropic=0)
      ;;
    fuzz_pickle)
      inputs=("$root"/snapshots/*.pickle)
      for f in "$root"/../shared/snapshots-real/*.pickle; do [ -f "$f" ] && inputs+=("$f"); done
      python3 "$root/fuzz/make_seeds.py" "$seeds" "${inputs[@]}"
      ;;
    fuzz_trace)
      # Native traces of the minimised snapshots: stored and zstd chunks, dense checkpoints, and
      # a copy of each cut in the middle (a killed writer).
      small="$work/$name/small-pickles"
      rm -rf "$small" && mkdir -p "$small"
      inputs=("$root"/snapshots/*.pickle)
      for f in "$root"/../shared/snapshots-real/*.pickle; do [ -f "$f" ] && inputs+=("$f"); done
      python3 "$root/fuzz/make_seeds.py" "$small" "${inputs[@]}" >/dev/null
      for f in "$small"/*.pickle; do
        b=$(basename "$f" .pickle)
        "$build/src/cli/memforensics" convert "$f" -o "$seeds/$b.z0.bin" --zstd-level 0 --checkpoint-every 16 2>/dev/null || continue
        "$build/src/cli/memforensics" convert "$f" -o "$seeds/$b.z3.bin" --zstd-level 3 2>/dev/null || true
        size=$(stat -c %s "$seeds/$b.z0.bin")
        head -c $((size / 2)) "$seeds/$b.z0.bin" > "$seeds/$b.cut.bin"
      done
      ;;
  esac
  args=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len="$max_len"
        -print_final_stats=1 -artifact_prefix="$artifacts/" ${extra[@]+"${extra[@]}"})
  dict="$root/fuzz/${name#fuzz_}.dict"
  [ -f "$dict" ] && args+=(-dict="$dict")

  echo "fuzz.sh: $name for ${seconds}s (log: $log)"
  rc=0
  # libFuzzer writes new inputs into the first folder only: the corpus, never the repository.
  (cd "$work/$name" && "$bin" "${args[@]}" "${dirs[@]}") >"$log" 2>&1 || rc=$?
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::' "$log" | sed "s/^/  $name: /" || true
  if [ $rc -ne 0 ]; then
    failed+=("$name")
    echo "fuzz.sh: $name FAILED (exit $rc); the end of its log:" >&2
    grep -v '# Uses: ' "$log" | tail -n 60 >&2
    for a in "$artifacts"/*; do
      [ -f "$a" ] || continue
      echo "fuzz.sh: reproducer: $a" >&2
      echo "fuzz.sh:   rerun: $bin $a" >&2
      echo "fuzz.sh:   keep it as a regression input: cp $a $root/fuzz/corpus/$name/" >&2
    done
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: ${#failed[@]} of ${#fuzzers[@]} fuzzers failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: ${#fuzzers[@]} fuzzers ran ${seconds}s each without a finding"
