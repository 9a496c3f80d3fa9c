#!/usr/bin/env bash
# Builds memforensics and runs the whole test suite (unit, end-to-end, real snapshots in
# ../shared/snapshots-real when present). This is the README's test command and what CI runs.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure -j"$(nproc)"
