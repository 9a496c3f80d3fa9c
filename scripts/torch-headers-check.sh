#!/usr/bin/env bash
# Compiles the LibTorch hook against real PyTorch headers, on every CI run (issue 31): for each
# ../shared/pytorch-headers/<version>/include, src/capture/torch_hook.cc and
# tests/capture/torch_headers_probe.cc with g++ and with clang++ (when installed), -fsyntax-only
# -Wall -Wextra -Wpedantic -Werror, with the defines and include directories the MEMF_TORCH_PYTHON
# route uses (src/capture/CMakeLists.txt). The probe checks what torch_entry.h detects in that
# version's TraceEntry and allocator against what the version is known to have (table below).
# No LibTorch, CUDA driver or GPU is needed: only the CUDA toolkit's headers (cuda_runtime_api.h,
# from CUDA_HOME or /usr/local/cuda).
#
#   scripts/torch-headers-check.sh [HEADERS_DIR]    (default: ../shared/pytorch-headers)
#
# Without HEADERS_DIR (a clone with no ../shared beside it) the check is skipped and says so.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
headers=${1:-$root/../shared/pytorch-headers}
if [ ! -d "$headers" ]; then
  echo "torch-headers-check: skipped: no $headers (the PyTorch header sets live in ../shared)"
  exit 0
fi
cuda_inc=
for d in ${CUDA_HOME:+"$CUDA_HOME/include"} /usr/local/cuda/include /usr/include; do
  if [ -f "$d/cuda_runtime_api.h" ]; then cuda_inc=$d; break; fi
done
if [ -z "$cuda_inc" ]; then
  echo "torch-headers-check: FAILED: no cuda_runtime_api.h (install the CUDA toolkit or set CUDA_HOME)" >&2
  exit 1
fi

# What each version's headers have, as MEMF_EXPECT_* defines of the probe. A feature is checked
# only where we know the answer: mempool_ and compile_context_ (2.8), user_metadata_ (2.10),
# ANNOTATE and snapshot(mempool_id, include_traces) (2.14.1 has both; 2.6 has neither).
expectations() {
  local v=$1 major minor
  IFS=. read -r major minor _ <<<"$v"
  if ! [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ ]]; then
    echo "torch-headers-check: FAILED: $headers/$v: the folder is not named after a version" >&2
    return 1
  fi
  local n=$((major * 100 + minor)) out=()
  out+=("-DMEMF_EXPECT_MEMPOOL=$((n >= 208))" "-DMEMF_EXPECT_COMPILE_CONTEXT=$((n >= 208))")
  out+=("-DMEMF_EXPECT_USER_METADATA=$((n >= 210))" "-DMEMF_EXPECT_ANNOTATE=$((n >= 214))")
  if [ $n -lt 210 ] || [ $n -ge 214 ]; then out+=("-DMEMF_EXPECT_INCLUDE_TRACES=$((n >= 214))"); fi
  printf '%s\n' "${out[@]}"
}

compilers=(g++)
command -v clang++ >/dev/null && compilers+=(clang++)
sets=0
failed=0
for inc in "$headers"/*/include; do
  [ -d "$inc" ] || continue
  v=$(basename "$(dirname "$inc")")
  mapfile -t expect < <(expectations "$v") || { failed=1; continue; }
  [ ${#expect[@]} -gt 0 ] || { failed=1; continue; }
  sets=$((sets + 1))
  for cxx in "${compilers[@]}"; do
    for src in src/capture/torch_hook.cc tests/capture/torch_headers_probe.cc; do
      flags=(-std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror -DMEMF_TORCH_HOOK=1
             -D_GLIBCXX_USE_CXX11_ABI=1 -I"$root/src" -isystem "$inc"
             -isystem "$inc/torch/csrc/api/include" -isystem "$cuda_inc")
      [ "$src" = tests/capture/torch_headers_probe.cc ] && flags+=("${expect[@]}")
      if "$cxx" "${flags[@]}" "$root/$src" 2>"/tmp/torch-headers-check.$$.log"; then
        echo "torch-headers-check: PyTorch $v, $cxx: $src compiles"
      else
        echo "torch-headers-check: FAILED: PyTorch $v, $cxx: $src:" >&2
        head -40 "/tmp/torch-headers-check.$$.log" >&2
        failed=1
      fi
    done
  done
done
rm -f "/tmp/torch-headers-check.$$.log"
if [ $sets -eq 0 ]; then
  echo "torch-headers-check: FAILED: no <version>/include folder in $headers" >&2
  exit 1
fi
if [ $failed -ne 0 ]; then exit 1; fi
echo "torch-headers-check: OK: $sets header set(s) x ${#compilers[@]} compiler(s)"
