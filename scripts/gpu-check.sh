#!/usr/bin/env bash
# GPU validation of the capture side (docs/capture.md; issue 17), in three modes:
#
#   scripts/gpu-check.sh --prepare [BUILD]   here, on the build machine: builds memforensics_portable
#       in BUILD (default build/, configured; needs the full build's dependencies) and copies it into
#       build-carry/ (ignored by git; it travels as a carried path), with libmemforensics_cupti.so
#       as a fallback; fails unless `ldd` shows only glibc's libraries. 4.5 MB.
#   scripts/gpu-check.sh --dry-run           here and in CI, without torch or a GPU: the carried
#       binary runs and needs only glibc; gpu_check.py's comparison logic on fabricated files
#       (`gpu_check.py selftest`); gpu_check_calls.cu compiles when nvcc is there.
#   scripts/gpu-check.sh [STEPS]             on the GPU machine, in one command of at most
#       MEMF_GPU_BUDGET_S seconds (default 450): builds libmemforensics_torch.so against the
#       installed torch and libmemforensics_cupti.so with a capture-only configure (only CMake,
#       ninja, a C++ compiler and the CUDA toolkit are needed), then
#         1. compare: a training loop with PyTorch's _record_memory_history and the hook at once,
#            every event, stack and peak compared, and a child process that dies of an OOM;
#         2. cupti: gpu_check_calls.cu (compiled with nvcc) under `memforensics record`, its
#            calls checked in the trace;
#         3. env: MEMFORENSICS_OUT starts a recording;
#         4. overhead: median step time of STEPS steps (default 50) without and with the hook,
#            with and without stacks (one process per configuration).
#       Results: results.md (a table) and results.json, the log, the CUPTI call log and the dump
#       of its trace, under $OUT (the device tool's folder) or MEMF_GPU_OUT (default
#       build-gpu/out). Exit status 1 when any check failed (MISMATCH lines in the log).
#
# A device session: `--prepare` here (through the build lock), then run
#   bash scripts/gpu-check.sh          with carry: ["build-carry"], timeout_s 540
# and copy results.md into docs/performance.md ("GPU validation").
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
carry=${MEMF_CARRY:-$root/build-carry}

# Allowed shared libraries of the carried binary: glibc's own (any machine with glibc >= the
# build machine's has them).
glibc_only() {
  local bad
  bad=$(ldd "$1" | grep -Ev '^\s*(linux-vdso\.so|/lib64/ld-linux|(libc|libm|libpthread|libdl|librt)\.so\.[0-9]+ )' || true)
  if [ -n "$bad" ]; then
    echo "gpu-check: $1 needs libraries beyond glibc:" >&2
    echo "$bad" >&2
    return 1
  fi
}

case "${1:-}" in
--prepare)
  set -e
  build=${2:-$root/build}
  cmake --build "$build" --target memforensics_portable
  mkdir -p "$carry"
  cp "$build/portable/memforensics-portable" "$carry/memforensics"
  if [ -f "$build/src/capture/libmemforensics_cupti.so" ]; then
    # fallback if the build there fails
    strip --strip-debug -o "$carry/libmemforensics_cupti.so" "$build/src/capture/libmemforensics_cupti.so"
  fi
  ldd "$carry/memforensics"
  glibc_only "$carry/memforensics"
  glibc=$(objdump -T "$carry/memforensics" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  {
    echo "memforensics $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), built $(date -u +%FT%TZ)"
    echo "needs $glibc or newer"
    ldd "$carry/memforensics"
  } >"$carry/MANIFEST"
  echo "gpu-check: carried binary in $carry ($(du -sh "$carry" | cut -f1)), needs $glibc or newer"
  exit 0
  ;;
--dry-run)
  set -e
  bin=$carry/memforensics
  if [ ! -x "$bin" ]; then
    echo "gpu-check: no $bin (run scripts/gpu-check.sh --prepare first)" >&2
    exit 2
  fi
  "$bin" --version
  glibc_only "$bin"
  echo "gpu-check: $bin runs and needs only glibc"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$py" "$root/scripts/gpu_check.py" selftest --memforensics "$bin" --out "$tmp"
  nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
  if [ -n "$nvcc" ]; then
    "$nvcc" -O1 -o "$tmp/gpu_check_calls" "$root/scripts/gpu_check_calls.cu" -lcuda
    echo "gpu-check: gpu_check_calls.cu compiles ($("$nvcc" --version | tail -1))"
  else
    echo "gpu-check: no nvcc here: gpu_check_calls.cu not compiled"
  fi
  echo "gpu-check: dry run OK"
  exit 0
  ;;
-*)
  echo "usage: $0 [--prepare [BUILD] | --dry-run | STEPS]" >&2
  exit 2
  ;;
esac

# ---- on the GPU machine --------------------------------------------------------------------------
steps=${1:-50}
budget=${MEMF_GPU_BUDGET_S:-450}
work=${MEMF_GPU_WORK:-$root/build-gpu}
out=${OUT:-${MEMF_GPU_OUT:-$work/out}}
res=$work/results  # the sections' JSON files
rm -rf "$res"
mkdir -p "$work" "$out" "$res"
exec > >(tee "$out/gpu-check.log") 2>&1
tee_pid=$!
export PYTHONUNBUFFERED=1
bin=$carry/memforensics
declare -A status

# section NAME SECONDS FUNCTION: runs FUNCTION in this shell with T set to the smaller of SECONDS
# and what the budget has left (keeping 20 s for the report); FUNCTION runs its commands under
# `timeout "$T"`. Records ok / FAILED (exit N) / timed out / skipped.
section() {
  local name=$1 want=$2 fn=$3
  local left=$((budget - SECONDS - 20))
  if [ "$left" -lt 15 ]; then
    echo "== $name: skipped (budget of ${budget}s spent)"
    status[$name]="skipped (budget)"
    return 1
  fi
  [ "$want" -gt "$left" ] && want=$left
  T=$want
  section_start=$SECONDS
  echo "== $name (at most ${want}s; ${SECONDS}s elapsed)"
  local start=$SECONDS rc=0
  "$fn" || rc=$?
  if [ $rc -eq 0 ]; then
    status[$name]="ok"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    status[$name]="timed out (${want}s)"
  else
    status[$name]="FAILED (exit $rc)"
  fi
  echo "== $name: ${status[$name]} ($((SECONDS - start))s)"
  return $rc
}
# timeout for the rest of the current section
tmo() { local left=$((T - (SECONDS - section_start))); [ $left -lt 1 ] && left=1; timeout --kill-after=5 "$left" "$@"; }

write_sections() {
  local args=()
  for k in "${!status[@]}"; do args+=("$k=${status[$k]}"); done
  "$py" -c 'import json, sys; json.dump(dict(a.split("=", 1) for a in sys.argv[2:]), open(sys.argv[1], "w"), indent=1)' \
    "$res/sections.json" "${args[@]}"
}

machine() {
  tmo "$py" - "$res/machine.json" <<'PY'
import json, platform, subprocess, sys
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"? ({e})"
m = {"kernel": platform.release(), "python": platform.python_version(),
     "gpu": sh("nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1"),
     "driver": sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1"),
     "nvcc": sh("nvcc --version | tail -1"), "cmake": sh("cmake --version | head -1"),
     "ninja": sh("ninja --version"), "cxx": sh("c++ --version | head -1"), "glibc": sh("ldd --version | head -1")}
try:
    import torch
    import torch.utils
    m.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
             device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
             cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI), torch_cmake_prefix_path=torch.utils.cmake_prefix_path)
except Exception as e:  # noqa: BLE001
    m["torch_error"] = repr(e)
json.dump(m, open(sys.argv[1], "w"), indent=1)
print(json.dumps(m, indent=1))
sys.exit(0 if m.get("cuda_available") else 1)
PY
}
carried_binary() { tmo "$bin" --version && ldd "$bin" && glibc_only "$bin"; }

# ---- build, capture-only ------------------------------------------------------------------------
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
cuda_root=${CUDA_HOME:-}
[ -z "$cuda_root" ] && [ -n "$nvcc" ] && cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
export CUDA_HOME=$cuda_root
# CUPTI in the toolkit, else in the nvidia-cuda-cupti wheel (which has no unversioned libcupti.so).
find_first() {  # find_first PATTERN DIR...: the first DIR/PATTERN that exists
  local pat=$1 d f
  shift
  for d in "$@"; do
    for f in $d/$pat; do [ -e "$f" ] && { echo "$f"; return 0; }; done
  done
  return 1
}
inc_dirs=("$cuda_root/include" "$cuda_root/extras/CUPTI/include" "$cuda_root/targets/x86_64-linux/include")
lib_dirs=("$cuda_root/lib64" "$cuda_root/lib" "$cuda_root/extras/CUPTI/lib64" "$cuda_root/targets/x86_64-linux/lib")
wheel_dirs=$("$py" -c 'import glob, sys; print("\n".join(sorted({d for p in sys.path for d in glob.glob(p + "/nvidia/*")})))' 2>/dev/null || true)
while read -r d; do [ -n "$d" ] && inc_dirs+=("$d/include") && lib_dirs+=("$d/lib"); done <<<"$wheel_dirs"
cupti_h=$(find_first cupti_activity.h "${inc_dirs[@]}" || true)
cuda_h=$(find_first cuda.h "${inc_dirs[@]}" || true)
cupti_so=$(find_first libcupti.so "${lib_dirs[@]}" || find_first 'libcupti.so.[0-9]*' "${lib_dirs[@]}" || true)
cupti_args=(-DMEMF_BUILD_CUPTI=OFF)
if [ -n "$cupti_h" ] && [ -n "$cuda_h" ] && [ -n "$cupti_so" ]; then
  cupti_args=(-DMEMF_BUILD_CUPTI=ON -DMEMF_CUPTI_INCLUDE_DIR="$(dirname "$cupti_h")"
              -DMEMF_CUDA_INCLUDE_DIR="$(dirname "$cuda_h")" -DMEMF_CUPTI_LIBRARY="$cupti_so")
fi
torch_prefix=$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)

capture_build=
build_route=none
build() {
  echo "CUDA at '$cuda_root'; cupti_activity.h '$cupti_h', cuda.h '$cuda_h', libcupti '$cupti_so'; torch prefix '$torch_prefix'"
  # Route 1: Torch's CMake package (torch.utils.cmake_prefix_path). Route 2, when that configure or
  # build fails (Torch's config is strict about the toolkit): paths from the python
  # (scripts/torch_build_flags.py, MEMF_TORCH_PYTHON).
  local common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMF_CAPTURE_ONLY=ON -DMEMF_BUILD_TESTS=OFF
                --no-warn-unused-cli -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON
                -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON
                -DMEMF_BUILD_TORCH_HOOK=ON "${cupti_args[@]}")
  [ -n "$nvcc" ] && common+=(-DCUDAToolkit_ROOT="$cuda_root" -DCMAKE_CUDA_COMPILER="$nvcc")
  local targets=(memforensics_torch) t0=$SECONDS
  [ "${cupti_args[0]}" = "-DMEMF_BUILD_CUPTI=ON" ] && targets+=(memforensics_cupti)
  if [ -n "$torch_prefix" ] &&
     tmo cmake -S "$root" -B "$work/build-pkg" "${common[@]}" -DCMAKE_PREFIX_PATH="$torch_prefix" >"$work/build-pkg.log" 2>&1 &&
     tmo cmake --build "$work/build-pkg" -j"$(nproc)" --target "${targets[@]}" >>"$work/build-pkg.log" 2>&1; then
    build_route="package"
    capture_build=$work/build-pkg
  else
    echo "Torch's CMake package route failed; its last lines:"
    tail -25 "$work/build-pkg.log" 2>/dev/null
    tmo cmake -S "$root" -B "$work/build-py" "${common[@]}" -DMEMF_TORCH_PYTHON="$(command -v "$py")" \
      -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON >"$work/build-py.log" 2>&1 &&
      tmo cmake --build "$work/build-py" -j"$(nproc)" --target "${targets[@]}" >>"$work/build-py.log" 2>&1 ||
      { local rc=$?; tail -40 "$work/build-py.log"; cp "$work/build-py.log" "$out/build.log"; return $rc; }
    build_route="python"
    capture_build=$work/build-py
  fi
  "$py" -c 'import json, sys; json.dump({"torch_route": sys.argv[2], "cupti": sys.argv[3], "seconds": int(sys.argv[4])}, open(sys.argv[1], "w"))' \
    "$res/build.json" "$build_route" "${cupti_so:-not found}" "$((SECONDS - t0))"
  echo "built ${targets[*]} in $((SECONDS - t0))s by the $build_route route"
  ls -la "$capture_build"/src/capture/*.so
}

calls_program=$work/gpu_check_calls
calls() {
  # Shared cudart (as PyTorch uses it), RPATH to the toolkit; the static one if that fails.
  tmo "$nvcc" -O1 -cudart shared -Xlinker -rpath -Xlinker "$cuda_root/lib64" -o "$calls_program" \
    "$root/scripts/gpu_check_calls.cu" -lcuda ||
    tmo "$nvcc" -O1 -o "$calls_program" "$root/scripts/gpu_check_calls.cu" -lcuda
}

hook_lib() { echo "$capture_build/src/capture/libmemforensics_torch.so"; }
have_hook() { [ -f "$(hook_lib)" ] || { echo "no libmemforensics_torch.so: the build failed"; return 1; }; }
cupti_lib() {
  if [ -f "$capture_build/src/capture/libmemforensics_cupti.so" ]; then
    echo "$capture_build/src/capture/libmemforensics_cupti.so"
  elif [ -f "$carry/libmemforensics_cupti.so" ]; then
    echo "$carry/libmemforensics_cupti.so"  # built on the build machine (needs libzstd.so.1 here)
  fi
}
compare() { have_hook || return 1; tmo "$py" "$root/scripts/gpu_check.py" compare --lib "$(hook_lib)" --memforensics "$bin" --out "$res" --steps 20; }
cupti() {
  local lib
  lib=$(cupti_lib)
  [ -n "$lib" ] || { echo "no libmemforensics_cupti.so"; return 1; }
  echo "CUPTI library: $lib"
  local d
  d=$(dirname "$cupti_so" 2>/dev/null || true)
  LD_LIBRARY_PATH=${d:+$d:}${LD_LIBRARY_PATH:-} tmo "$py" "$root/scripts/gpu_check.py" cupti --memforensics "$bin" \
    --calls-program "$calls_program" --cupti-lib "$lib" --out "$res"
  local rc=$?
  [ -f "$res/cupti.bin" ] && "$bin" dump --stacks "$res/cupti.bin" >"$out/cupti_dump.txt" 2>&1
  [ -f "$res/cupti_calls.jsonl" ] && cp "$res/cupti_calls.jsonl" "$out/"
  return $rc
}
env_start() { have_hook || return 1; tmo "$py" "$root/scripts/gpu_check.py" env --lib "$(hook_lib)" --memforensics "$bin" --out "$res"; }
overhead() {
  have_hook || return 1
  : >"$res/overhead.jsonl"
  local cfg
  for cfg in baseline hook history hook_stacks hook_native; do
    tmo "$py" "$root/scripts/gpu_check.py" overhead --lib "$(hook_lib)" --config "$cfg" --steps "$steps" |
      tee -a "$res/overhead.jsonl" || return 1
  done
}

section machine 60 machine || echo "gpu-check: no CUDA device or no CUDA torch: the GPU checks will fail"
section carried_binary 20 carried_binary ||
  echo "gpu-check: the carried memforensics does not run here (run --prepare on the build machine, carry build-carry)"
section build 200 build
[ -n "$nvcc" ] && section calls_program 60 calls
section compare 120 compare
section cupti 60 cupti
section env 45 env_start
section overhead 150 overhead
write_sections
"$py" "$root/scripts/gpu_check.py" report --out "$res" >/dev/null
cp "$res/results.md" "$res/results.json" "$out/" 2>/dev/null
cat "$out/results.md"
failed=0
for k in "${!status[@]}"; do [ "${status[$k]}" = ok ] || failed=1; done
echo "gpu-check: $([ $failed = 0 ] && echo OK || echo 'FAILED (see the MISMATCH lines and results.md)') in ${SECONDS}s; results in $out"
exec 1>&- 2>&-
wait "$tee_pid" 2>/dev/null  # the whole log is in $out before the command returns
exit $failed
