#!/usr/bin/env bash
# Configures and builds memforensics into build/ (installing Debian packages first if needed).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup-debian.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMF_REQUIRE_BROWSER_TESTS=ON >/dev/null
cmake --build "$root/build" -j"$(nproc)"
