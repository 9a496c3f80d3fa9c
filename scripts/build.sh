#!/usr/bin/env bash
# Configures and builds memforensics into build/ (installing Debian packages first if needed).
#   build.sh             everything: the executable, the tests (browser tests required)
#   build.sh --analysis  only the memforensics executable and what it needs (analyze-sample.sh)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "${1:-}" = "--analysis" ]; then
  "$root/scripts/setup-debian.sh" --analysis
  # Tests stay as configured before (a build/ that test.sh made keeps them); a fresh build/ has none.
  tests=()
  [ -f "$root/build/CMakeCache.txt" ] || tests=(-DMEMF_BUILD_TESTS=OFF)
  cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${tests[@]}" >/dev/null
  cmake --build "$root/build" -j"$(nproc)" --target memforensics
  exit 0
fi
"$root/scripts/setup-debian.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMF_BUILD_TESTS=ON -DMEMF_REQUIRE_BROWSER_TESTS=ON >/dev/null
cmake --build "$root/build" -j"$(nproc)"
