#!/usr/bin/env bash
# Builds memforensics with AddressSanitizer + UndefinedBehaviorSanitizer into build-asan/ (gcc,
# -O1 -g, assertions on) and runs the whole test suite on it, the end-to-end CLI test included:
# any sanitizer report aborts the test that triggered it. See docs/fuzzing.md.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build-asan"
"$root/scripts/setup-debian.sh"
cmake -S "$root" -B "$build" -G Ninja -DMEMF_SANITIZERS=ON -DCMAKE_BUILD_TYPE=Debug -DMEMF_REQUIRE_BROWSER_TESTS=ON \
  "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g" >/dev/null
cmake --build "$build" -j"$(nproc)"
# Exported, so the executable that cli_golden starts from Python inherits them too.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# ASan's redzones make stack frames several times larger: give the tests the headroom they have
# uninstrumented (libstdc++'s std::regex, used by tests, recurses once per character matched).
ulimit -s 262144 2>/dev/null || ulimit -s "$(ulimit -Hs)" 2>/dev/null || true
cd "$build"
ctest --output-on-failure -j"$(nproc)"
