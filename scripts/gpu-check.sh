#!/usr/bin/env bash
# GPU validation of the LibTorch hook, for a machine with an NVIDIA GPU and a CUDA PyTorch >= 2.2:
#   1. builds libmemforensics_torch.so against the installed torch (and the CLI) into build-gpu/;
#   2. runs a small training loop with PyTorch's own _record_memory_history and the hook at once
#      and checks that both files agree on every event, the peaks and the final state
#      (scripts/gpu_check.py compare), that an OOM reaches the file at once, and that
#      MEMFORENSICS_OUT starts a recording (gpu_check.py env);
#   3. measures the step time with and without the hook, with and without stacks.
# Fails loudly (non-zero exit, MISMATCH lines) when the two files disagree.
#
#   PYTHON=python3 scripts/gpu-check.sh [STEPS]
#
# Needs the build dependencies of the README (Debian packages: scripts/setup-debian.sh) besides torch.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
steps=${1:-30}
build=${MEMF_GPU_BUILD:-$root/build-gpu}
out=${MEMF_GPU_OUT:-$build/gpu-check}

"$py" - <<'PY' || { echo "gpu-check: needs a CUDA device and a CUDA PyTorch >= 2.2" >&2; exit 2; }
import sys, torch
v = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device: "
      f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
sys.exit(0 if torch.cuda.is_available() and torch.version.cuda and v >= (2, 2) else 1)
PY

# The paths always come from the python (scripts/torch_build_flags.py), never from Torch's CMake
# package: that one stops the configuration with a fatal error (QUIET or not) when it finds no
# CUDA toolkit (a pip-installed torch brings only the runtime), and also with some toolkits that
# are there (torch <= 2.4 with a CUDA 12 toolkit: "Failed to find nvToolsExt", pytorch#116242).
torch_args=(-DMEMF_TORCH_PYTHON="$(command -v "$py")" -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMF_BUILD_TESTS=OFF \
  "${torch_args[@]}" -DMEMF_BUILD_TORCH_HOOK=ON
cmake --build "$build" -j"$(nproc)" --target memforensics_torch memforensics
lib="$build/src/capture/libmemforensics_torch.so"
bin="$build/src/cli/memforensics"
mkdir -p "$out"

echo "== compare: PyTorch's snapshot against the hook's trace"
"$py" "$root/scripts/gpu_check.py" compare --lib "$lib" --memforensics "$bin" --out "$out" --steps "$steps"
echo "== MEMFORENSICS_OUT"
"$py" "$root/scripts/gpu_check.py" env --lib "$lib" --memforensics "$bin" --out "$out"

echo "== overhead (median step time, $steps steps, one process per configuration)"
results="$out/overhead.jsonl"
: > "$results"
for cfg in baseline hook history hook_stacks hook_native; do
  "$py" "$root/scripts/gpu_check.py" overhead --lib "$lib" --config "$cfg" --steps "$steps" | tee -a "$results"
done
"$py" - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = next(r["median_step_ms"] for r in rows if r["config"] == "baseline")
print(f"{'config':<12} {'step ms':>9} {'overhead':>9} {'file bytes':>11}")
for r in rows:
    print(f"{r['config']:<12} {r['median_step_ms']:9.3f} {100 * (r['median_step_ms'] / base - 1):8.1f}% {r['file_bytes']:11d}")
PY
echo "gpu-check: OK"
