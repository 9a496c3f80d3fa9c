#!/usr/bin/env bash
# GPU validation of the capture side (docs/capture.md; issue 17), in three modes:
#
#   scripts/gpu-check.sh --prepare [BUILD]   here, on the build machine: builds memforensics_portable
#       in BUILD (default build/, configured; needs the full build's dependencies) and copies it into
#       build-carry/ (ignored by git; it travels as a carried path), with libmemforensics_cupti.so
#       as a fallback; fails unless `ldd` shows only glibc's libraries. About 7 MB.
#   scripts/gpu-check.sh --dry-run           here and in CI, without torch or a GPU: the carried
#       binary runs and needs only glibc; gpu_check.py's comparison logic, report and source list
#       on fabricated files (`gpu_check.py selftest`); the python section's package layout imports
#       and analyses a sample, and its checks judge a stand-in torch's recordings right
#       (`gpu_check_python.py selftest`); gpu_check_calls.cu compiles when nvcc is there.
#   scripts/gpu-check.sh [STEPS]             on the GPU machine, in one command of at most
#       MEMF_GPU_BUDGET_S seconds (default 330); MEMF_GPU_SECTIONS="a b" runs only those sections
#       (with an earlier run's hook when build_hook is not among them). First one line per tool
#       version (CMake, the C++ compiler, nvcc, python and torch, the driver and GPU), then
#       sections, each with its own time limit, cut to what the budget has left, and none
#       stopping the others:
#         machine, carried_binary   machine.json; the carried memforensics runs here;
#         build_hook                libmemforensics_torch.so against the installed torch, by the
#                                   first route that works: (a) CMake, capture-only, with the
#                                   paths from the python (MEMF_TORCH_PYTHON); (b) CMake with
#                                   Torch's package (torch.utils.cmake_prefix_path); (c) the C++
#                                   compiler alone, with the flags of scripts/torch_build_flags.py
#                                   --flags (also the only route without CMake >= 3.25);
#         build_cupti               libmemforensics_cupti.so, capture-only CMake, the toolkit's
#                                   or the nvidia-cuda-cupti wheel's CUPTI;
#         calls_program             gpu_check_calls.cu compiled with nvcc;
#         compare                   a training loop with PyTorch's _record_memory_history and the
#                                   hook at once, then a CUDA graph captured and replayed (private
#                                   pool): every event, stack and peak compared; a child process
#                                   that dies of an OOM;
#         compare_expandable        the same loop with PYTORCH_CUDA_ALLOC_CONF=
#                                   expandable_segments:True (no OOM child);
#         cupti                     gpu_check_calls.cu under `memforensics record`, its calls
#                                   checked in the trace (the carried library if build_cupti failed);
#         env                       MEMFORENSICS_OUT starts a recording;
#         overhead                  median step time of STEPS steps (default 50) without and with
#                                   the hook, with and without stacks (one process each);
#         python                    the Python package: record() (hook and history), `python -m
#                                   memforensics run`, the pytest plugin (gpu_check_python.py).
#       The sections after the builds need only the library they use. Results: results.md (a
#       table) and results.json, rewritten after every section and on exit (so a run cut short
#       still returns them), the log, the CUPTI call log and the dump of its trace, the logs of
#       failed builds, under $OUT (the device tool's folder) or MEMF_GPU_OUT (default
#       build-gpu/out). Exit status 1 when any section did not end ok (MISMATCH lines in the log).
#
# A device session (15 minutes of device time in all, the machine's start included): `--prepare`
# here (through the build lock), then run
#   bash scripts/gpu-check.sh          with carry: ["build-carry"], timeout_s 400
# (the 330 s budget plus the report and slack: the start, one run and one rerun fit), and copy
# results.md into docs/performance.md ("GPU validation"). If the budget cut the python section,
# run it alone on the still-warm machine (it reuses the hook just built):
#   MEMF_GPU_SECTIONS=python bash scripts/gpu-check.sh      with the same carry, timeout_s 200
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
  # The python section's package layout (no torch, no hook): it imports and analyses a sample.
  "$py" "$root/scripts/gpu_check_python.py" layout --memforensics "$bin" --dest "$tmp/pkg" >/dev/null
  PYTHONPATH="$tmp/pkg" "$py" -c 'import sys, memforensics
a = memforensics.analyze(sys.argv[1])
assert a.devices and a.devices[0].events > 0, a
print("gpu-check: the python section'"'"'s package layout imports and analyses", sys.argv[1])' \
    "$root/snapshots/sample_training.pickle"
  "$py" "$root/scripts/gpu_check_python.py" selftest --memforensics "$bin"
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
if ! [[ $steps =~ ^[0-9]+$ ]]; then
  echo "usage: $0 [--prepare [BUILD] | --dry-run | STEPS]" >&2
  exit 2
fi
budget=${MEMF_GPU_BUDGET_S:-330}
work=${MEMF_GPU_WORK:-$root/build-gpu}
out=${OUT:-${MEMF_GPU_OUT:-$work/out}}
res=$work/results  # the sections' JSON files
rm -rf "$res"
mkdir -p "$work" "$out" "$res"
# tee ignores the signals that end a run: a TERM sent to the whole process group (as `timeout`
# does) must not take the log away before finish has written the results.
exec > >(trap '' TERM INT HUP; exec tee "$out/gpu-check.log") 2>&1
tee_pid=$!
# The log pipe again, for finish: bash runs a trap once the command in progress returns, which can
# be inside a function whose output goes to a build log.
exec {logfd}>&1
export PYTHONUNBUFFERED=1
bin=$carry/memforensics
declare -A status
current=         # the section running now: named in the results if the run is cut short
stopped_by=      # the signal that ended the run, if one did
T=0
section_start=0

# sections.json from the status map, without starting a python (the values are this script's own
# words; quotes and backslashes are escaped all the same).
write_sections() {
  local k v sep=''
  {
    printf '{'
    for k in "${!status[@]}"; do
      v=${status[$k]//\\/\\\\}
      v=${v//\"/\\\"}
      printf '%s\n "%s": "%s"' "$sep" "$k" "$v"
      sep=,
    done
    printf '\n}\n'
  } >"$res/sections.json"
}
# results.md and results.json into $out. Run after every section, not only at the end: if the
# device tool kills the command, what it returns still says how far the run got.
write_results() {
  write_sections
  if ! timeout 30 "$py" "$root/scripts/gpu_check.py" report --out "$res" >/dev/null 2>"$work/report.err"; then
    echo "gpu-check: the report failed:"
    tail -5 "$work/report.err"
  fi
  cp "$res/results.md" "$res/results.json" "$out/" 2>/dev/null
}
finish() {
  local rc=$? failed=0 k
  trap - EXIT TERM INT HUP
  exec >&"$logfd" 2>&1
  [ -n "$stopped_by" ] && echo "gpu-check: stopped by $stopped_by"
  [ -n "$current" ] && status[$current]="interrupted"
  write_results
  cat "$out/results.md" 2>/dev/null
  for k in "${!status[@]}"; do [ "${status[$k]}" = ok ] || failed=1; done
  [ "$rc" -eq 0 ] || failed=1
  echo "gpu-check: $([ "$failed" = 0 ] && echo OK || echo 'FAILED (see the MISMATCH lines and results.md)') in ${SECONDS}s; results in $out"
  exec 1>&- 2>&- {logfd}>&-
  # So that the whole log is in $out before the command returns. Bounded: when a trap interrupted
  # a redirection, bash still holds a saved copy of the pipe, and tee only sees its end at exit.
  for k in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    kill -0 "$tee_pid" 2>/dev/null || break
    sleep 0.1
  done
  exit "$failed"
}
trap finish EXIT
# A signal ends the script through finish (bash runs it once the command in progress returns).
trap 'stopped_by=SIGTERM; exit 143' TERM
trap 'stopped_by=SIGINT; exit 130' INT
trap 'stopped_by=SIGHUP; exit 129' HUP

# ---- versions, before anything can fail ----------------------------------------------------------
nvcc=$(command -v nvcc || ls -d /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc 2>/dev/null | head -1 || true)
cxx=${CXX:-$(command -v g++ || command -v c++ || true)}
# version_line LABEL PATTERN CMD...: the first line of CMD's output matching PATTERN (grep -E), or
# "not found" without CMD; at most 30 s, and never a failure.
version_line() {
  local label=$1 pattern=$2 line
  shift 2
  if [ -z "${1:-}" ] || ! command -v "$1" >/dev/null 2>&1; then
    echo "$label: not found"
    return 0
  fi
  line=$(timeout --kill-after=5 30 "$@" 2>&1 | grep -m1 -E "$pattern")
  echo "$label: ${line:-? (no matching output)}"
}
echo "== versions"
version_line cmake . cmake --version
version_line "c++ compiler${cxx:+ ($cxx)}" . "$cxx" --version
version_line nvcc 'release|V[0-9]' "$nvcc" --version
version_line "python, torch" '^python ' "$py" -c '
import sys
try:
    import torch
    t = f"torch {torch.__version__}, torch.version.cuda {torch.version.cuda}, CXX11 ABI {int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
except Exception as e:  # noqa: BLE001
    t = f"torch not importable: {e!r}"
print(f"python {sys.version.split()[0]} ({sys.executable}); {t}")'
version_line "driver, GPU" . nvidia-smi --query-gpu=driver_version,name,memory.total --format=csv,noheader
version_line ninja . ninja --version
echo "PYTORCH_CUDA_ALLOC_CONF: ${PYTORCH_CUDA_ALLOC_CONF:-unset}"

# section NAME SECONDS FUNCTION: runs FUNCTION in this shell with T set to the smaller of SECONDS
# and what the budget has left (keeping 20 s for the report); FUNCTION runs its commands under
# `timeout "$T"`. Records ok / FAILED (exit N) / timed out / skipped.
section() {
  local name=$1 want=$2 fn=$3
  if [ -n "${MEMF_GPU_SECTIONS:-}" ] && [[ " ${MEMF_GPU_SECTIONS//,/ } " != *" $name "* ]]; then
    echo "== $name: not selected (MEMF_GPU_SECTIONS=$MEMF_GPU_SECTIONS)"
    return 0
  fi
  local left=$((budget - SECONDS - 20))
  if [ "$left" -lt 15 ]; then
    echo "== $name: skipped (budget of ${budget}s spent)"
    status[$name]="skipped (budget)"
    write_results
    return 1
  fi
  [ "$want" -gt "$left" ] && want=$left
  T=$want
  section_start=$SECONDS
  status[$name]="did not finish (the run was cut short)"
  write_sections
  echo "== $name (at most ${want}s; ${SECONDS}s elapsed)"
  local start=$SECONDS rc=0
  current=$name
  "$fn" || rc=$?
  current=
  if [ $rc -eq 0 ]; then
    status[$name]="ok"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    status[$name]="timed out (${want}s)"
  else
    status[$name]="FAILED (exit $rc)"
  fi
  echo "== $name: ${status[$name]} ($((SECONDS - start))s)"
  write_results
  return $rc
}
# timeout for the rest of the current section
tmo() { local left=$((T - (SECONDS - section_start))); [ $left -lt 1 ] && left=1; timeout --kill-after=5 "$left" "$@"; }
# seconds the current section has left
section_left() { echo $((T - (SECONDS - section_start))); }

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

# ---- builds, capture-only -----------------------------------------------------------------------
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
wheel_dirs=$(timeout 30 "$py" -c 'import glob, sys; print("\n".join(sorted({d for p in sys.path for d in glob.glob(p + "/nvidia/*")})))' 2>/dev/null || true)
while read -r d; do [ -n "$d" ] && inc_dirs+=("$d/include") && lib_dirs+=("$d/lib"); done <<<"$wheel_dirs"
cupti_h=$(find_first cupti_activity.h "${inc_dirs[@]}" || true)
cuda_h=$(find_first cuda.h "${inc_dirs[@]}" || true)
cupti_so=$(find_first libcupti.so "${lib_dirs[@]}" || find_first 'libcupti.so.[0-9]*' "${lib_dirs[@]}" || true)

# CMake routes need CMake >= 3.25 (the project's minimum); without it only the direct route builds.
cmake_version=$(timeout 30 cmake --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -1 || true)
cmake_ok=0
if [ -n "$cmake_version" ] && [ "$(printf '%s\n' 3.25 "$cmake_version" | sort -V | head -1)" = 3.25 ]; then
  cmake_ok=1
fi
generator=(-G "Unix Makefiles")
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake_common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMF_CAPTURE_ONLY=ON -DMEMF_BUILD_TESTS=OFF
              --no-warn-unused-cli -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON
              -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON)
[ -n "$nvcc" ] && cmake_common+=(-DCUDAToolkit_ROOT="$cuda_root" -DCMAKE_CUDA_COMPILER="$nvcc")

build_json() {  # build_json KEY=VALUE...: merged into build.json (all digits: a number)
  "$py" - "$res/build.json" "$@" <<'PY' || true
import json, sys
try:
    with open(sys.argv[1]) as f:
        d = json.load(f)
except (OSError, ValueError):
    d = {}
for a in sys.argv[2:]:
    k, v = a.split("=", 1)
    d[k] = int(v) if v.isdigit() else v
with open(sys.argv[1], "w") as f:
    json.dump(d, f, indent=1)
PY
}

# keep_build_log NAME LOG: appends a failed build's log to $out/build.log under a header. One file
# for every route: the device tool returns at most 8 files from $OUT.
keep_build_log() {
  { echo "==== $1 ($2)"; cat "$2"; } >>"$out/build.log"
}

# cmake_route NAME TARGET CONFIGURE_ARGS...: configures $work/NAME capture-only and builds TARGET;
# on failure the end of the log is printed and the log copied to $out.
cmake_route() {
  local name=$1 target=$2 log=$work/$1.log rc=0
  shift 2
  if [ "$cmake_ok" != 1 ]; then
    echo "$name: needs CMake >= 3.25 (found: ${cmake_version:-none})"
    return 1
  fi
  echo "$name: CMake $cmake_version, ${generator[1]}, in $work/$name"
  tmo cmake -S "$root" -B "$work/$name" "${generator[@]}" "${cmake_common[@]}" "$@" >"$log" 2>&1 &&
    tmo cmake --build "$work/$name" -j"$(nproc)" --target "$target" >>"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "$name: failed (exit $rc); its first errors and the end of its log ($out/build.log):"
    grep -n -m10 -E 'error|Error' "$log"
    tail -30 "$log"
    keep_build_log "$name" "$log"
  fi
  return "$rc"
}

hook_so=  # the libmemforensics_torch.so that build_hook made
hook_python() {
  cmake_route hook-python memforensics_torch -DMEMF_BUILD_TORCH_HOOK=ON -DMEMF_BUILD_CUPTI=OFF \
    -DMEMF_TORCH_PYTHON="$(command -v "$py")" -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON &&
    hook_so=$work/hook-python/src/capture/libmemforensics_torch.so
}
hook_package() {
  local prefix
  [ "$cmake_ok" = 1 ] || { echo "hook-package: needs CMake >= 3.25 (found: ${cmake_version:-none})"; return 1; }
  prefix=$(tmo "$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)') || prefix=
  [ -n "$prefix" ] || { echo "hook-package: torch.utils.cmake_prefix_path not available"; return 1; }
  # Torch's package looks for the CUDA toolkit itself (CUDAToolkit_ROOT in cmake_common).
  cmake_route hook-package memforensics_torch -DMEMF_BUILD_TORCH_HOOK=ON -DMEMF_BUILD_CUPTI=OFF \
    -DCMAKE_PREFIX_PATH="$prefix" &&
    hook_so=$work/hook-package/src/capture/libmemforensics_torch.so
}
# The route without CMake: what the memforensics_torch target compiles (gpu_check.py hook-sources
# reads the lists from the CMakeLists.txt files), with the flags of the python route.
hook_direct() {
  local dir=$work/hook-direct log=$work/hook-direct.log rc=0
  local kind value flags_out srcs=() cflags=() libdir='' src obj i pids=() objs=()
  [ -n "$cxx" ] || { echo "hook-direct: no C++ compiler (g++ or c++)"; return 1; }
  rm -rf "$dir"
  mkdir -p "$dir"
  : >"$log"
  flags_out=$(tmo "$py" "$root/scripts/torch_build_flags.py" --flags 2>>"$log") || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "hook-direct: scripts/torch_build_flags.py --flags failed (exit $rc):"
    tail -5 "$log"
    return "$rc"
  fi
  while read -r kind value; do
    case $kind in
      include) cflags+=(-isystem "$value") ;;
      define) cflags+=("-D$value") ;;
      libdir) libdir=$value ;;
      cuda) [ "$value" = ON ] || { echo "hook-direct: this torch has no CUDA"; return 1; } ;;
    esac
  done <<<"$flags_out"
  [ -n "$libdir" ] || { echo "hook-direct: no torch library folder in the flags"; return 1; }
  mapfile -t srcs < <(tmo "$py" "$root/scripts/gpu_check.py" hook-sources 2>>"$log")
  if [ ${#srcs[@]} -eq 0 ]; then
    echo "hook-direct: gpu_check.py hook-sources failed:"
    tail -5 "$log"
    return 1
  fi
  # As cmake/MemfZstd.cmake: zstd-compressed chunks when zstd.h and libzstd are there, else stored.
  local zstd_def=-DMEMF_HAVE_ZSTD=0 zstd_lib=()
  if printf '#include <zstd.h>\nint main() { return ZSTD_versionNumber() == 0; }\n' |
     tmo "$cxx" -x c++ - -o "$dir/zstd_probe" -lzstd >>"$log" 2>&1; then
    zstd_def=-DMEMF_HAVE_ZSTD=1
    zstd_lib=(-lzstd)
  fi
  # NDEBUG as in the CMake routes' RelWithDebInfo.
  local common=(-std=c++20 -O2 -DNDEBUG -fPIC -pthread -I"$root/src" -DMEMF_TORCH_HOOK=1 "$zstd_def" "${cflags[@]}")
  echo "hook-direct: $cxx, ${#srcs[@]} sources in parallel, $zstd_def, torch libraries in $libdir"
  i=0
  for src in "${srcs[@]}"; do
    obj=$dir/$i-$(basename "$src" .cc).o
    objs+=("$obj")
    tmo "$cxx" "${common[@]}" -c "$src" -o "$obj" >"$obj.log" 2>&1 &
    pids+=($!)
    i=$((i + 1))
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || {
      rc=$?
      echo "hook-direct: ${srcs[$i]} did not compile (exit $rc):"
      head -40 "${objs[$i]}.log"
    }
    cat "${objs[$i]}.log" >>"$log"
  done
  if [ "$rc" -eq 0 ]; then
    tmo "$cxx" -shared -o "$dir/libmemforensics_torch.so" "${objs[@]}" -L"$libdir" -Wl,-rpath,"$libdir" \
      -ltorch -ltorch_cpu -ltorch_cuda -lc10_cuda -lc10 "${zstd_lib[@]}" -lpthread -ldl >>"$log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { echo "hook-direct: the link failed (exit $rc):"; tail -30 "$log"; }
  fi
  if [ "$rc" -ne 0 ]; then
    keep_build_log hook-direct "$log"
    return "$rc"
  fi
  hook_so=$dir/libmemforensics_torch.so
  ldd "$hook_so" | grep 'not found' && echo "hook-direct: warning: libraries not found by ldd (above)"
  return 0
}
build_hook() {
  local t0=$SECONDS route built=none tried=() rc=1
  for route in python package direct; do
    if [ "$(section_left)" -lt 10 ]; then
      echo "build_hook: no time left for the $route route"
      break
    fi
    tried+=("$route")
    rc=0
    "hook_$route" || rc=$?
    if [ "$rc" -eq 0 ]; then
      built=$route
      break
    fi
  done
  build_json torch_route="$built" routes_tried="${tried[*]}" seconds="$((SECONDS - t0))"
  [ -n "$hook_so" ] || { echo "build_hook: no route built libmemforensics_torch.so (tried: ${tried[*]})"; return "$rc"; }
  echo "build_hook: libmemforensics_torch.so by the $built route in $((SECONDS - t0))s"
  ls -la "$hook_so"
}

cupti_so_built=  # the libmemforensics_cupti.so that build_cupti made
build_cupti() {
  local t0=$SECONDS rc=0
  echo "CUDA at '$cuda_root'; cupti_activity.h '$cupti_h', cuda.h '$cuda_h', libcupti '$cupti_so'"
  if [ -z "$cupti_h" ] || [ -z "$cuda_h" ] || [ -z "$cupti_so" ]; then
    echo "build_cupti: CUPTI not found (the cupti section falls back on the carried library)"
    rc=1
  else
    cmake_route cupti memforensics_cupti -DMEMF_BUILD_TORCH_HOOK=OFF -DMEMF_BUILD_CUPTI=ON \
      -DMEMF_CUPTI_INCLUDE_DIR="$(dirname "$cupti_h")" -DMEMF_CUDA_INCLUDE_DIR="$(dirname "$cuda_h")" \
      -DMEMF_CUPTI_LIBRARY="$cupti_so" || rc=$?
  fi
  build_json cupti="${cupti_so:-not found}" cupti_seconds="$((SECONDS - t0))"
  [ "$rc" -eq 0 ] || return "$rc"
  cupti_so_built=$work/cupti/src/capture/libmemforensics_cupti.so
  ls -la "$cupti_so_built"
}

calls_program=$work/gpu_check_calls
calls() {
  [ -n "$nvcc" ] || { echo "no nvcc"; return 1; }
  # Shared cudart (as PyTorch uses it), RPATH to the toolkit; the static one if that fails.
  tmo "$nvcc" -O1 -cudart shared -Xlinker -rpath -Xlinker "$cuda_root/lib64" -o "$calls_program" \
    "$root/scripts/gpu_check_calls.cu" -lcuda ||
    tmo "$nvcc" -O1 -o "$calls_program" "$root/scripts/gpu_check_calls.cu" -lcuda
}

have_hook() {
  if [ -z "$hook_so" ] || [ ! -f "$hook_so" ]; then
    echo "no libmemforensics_torch.so: build_hook failed"
    return 1
  fi
}
cupti_lib() {
  if [ -n "$cupti_so_built" ] && [ -f "$cupti_so_built" ]; then
    echo "$cupti_so_built"
  elif [ -f "$carry/libmemforensics_cupti.so" ]; then
    echo "$carry/libmemforensics_cupti.so"  # built on the build machine (needs libzstd.so.1 here)
  fi
}
compare() {
  have_hook || return 1
  tmo "$py" "$root/scripts/gpu_check.py" compare --lib "$hook_so" --memforensics "$bin" --out "$res" --steps 20
}
# The same loop with expandable segments (cuMemMap: segment_map / segment_unmap events), in a
# folder of its own; the OOM child is left out, the default run covers it.
compare_expandable() {
  have_hook || return 1
  tmo env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$py" "$root/scripts/gpu_check.py" compare \
    --lib "$hook_so" --memforensics "$bin" --out "$res/expandable" --steps 20 --no-oom-child
}
cupti() {
  local lib
  lib=$(cupti_lib)
  [ -n "$lib" ] || { echo "no libmemforensics_cupti.so"; return 1; }
  [ -x "$calls_program" ] || { echo "no gpu_check_calls program (the calls_program section failed)"; return 1; }
  echo "CUPTI library: $lib"
  local d=
  [ -n "$cupti_so" ] && d=$(dirname "$cupti_so")
  LD_LIBRARY_PATH=${d:+$d:}${LD_LIBRARY_PATH:-} tmo "$py" "$root/scripts/gpu_check.py" cupti --memforensics "$bin" \
    --calls-program "$calls_program" --cupti-lib "$lib" --out "$res"
  local rc=$?
  [ -f "$res/cupti.bin" ] && tmo "$bin" dump --stacks "$res/cupti.bin" >"$out/cupti_dump.txt" 2>&1
  [ -f "$res/cupti_calls.jsonl" ] && cp "$res/cupti_calls.jsonl" "$out/"
  return "$rc"
}
# The Python package (issue 33): record() through the hook and through PyTorch's history, `python
# -m memforensics run` and the pytest plugin (scripts/gpu_check_python.py); without a hook the
# history half still runs.
python_package() {
  tmo "$py" "$root/scripts/gpu_check_python.py" check --memforensics "$bin" ${hook_so:+--lib "$hook_so"} --out "$res"
  local rc=$?
  [ -d "$res/python_pytest_reports" ] && cp -r "$res/python_pytest_reports" "$out/"
  return "$rc"
}
env_start() { have_hook || return 1; tmo "$py" "$root/scripts/gpu_check.py" env --lib "$hook_so" --memforensics "$bin" --out "$res"; }
overhead() {
  : >"$res/overhead.jsonl"
  local cfg rc=0
  # baseline and history need no hook: without one they still give PyTorch's own cost.
  for cfg in baseline hook history hook_stacks hook_native; do
    if [ "${cfg#hook}" != "$cfg" ] && [ -z "$hook_so" ]; then
      echo "overhead $cfg: skipped (no libmemforensics_torch.so)"
      rc=1
      continue
    fi
    tmo "$py" "$root/scripts/gpu_check.py" overhead --lib "${hook_so:-none}" --config "$cfg" --steps "$steps" |
      tee -a "$res/overhead.jsonl" || return 1
  done
  return "$rc"
}

# Most valuable first: a run cut short by the budget loses the overhead table, not the comparisons,
# and the python section (issue 33) before the overhead table (issue 31). Estimated on an H100/H200
# with both builds from scratch: about 250 s before the python section, which needs about 90 s
# more (not yet timed on a GPU): when the budget cuts it, a second call on the still-warm machine,
# MEMF_GPU_SECTIONS=python, runs it alone with the hook the first call built.
section machine 45 machine || echo "gpu-check: no CUDA device or no CUDA torch: the GPU checks will fail"
section carried_binary 15 carried_binary ||
  echo "gpu-check: the carried memforensics does not run here (run --prepare on the build machine, carry build-carry)"
section build_hook 150 build_hook
if [ -z "$hook_so" ] && [ -n "${MEMF_GPU_SECTIONS:-}" ]; then
  # build_hook not selected: the hook an earlier run built on this machine, if any.
  for f in "$work"/hook-python/src/capture/libmemforensics_torch.so \
    "$work"/hook-package/src/capture/libmemforensics_torch.so "$work"/hook-direct/libmemforensics_torch.so; do
    if [ -f "$f" ]; then
      hook_so=$f
      echo "gpu-check: the hook an earlier run built: $hook_so"
      break
    fi
  done
fi
section build_cupti 60 build_cupti
section calls_program 40 calls
section compare 100 compare
section compare_expandable 60 compare_expandable
section cupti 45 cupti
section env 30 env_start
section overhead 90 overhead
section python 120 python_package
exit 0  # finish (the EXIT trap) writes the results and sets the exit status
