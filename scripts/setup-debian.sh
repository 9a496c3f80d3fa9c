#!/usr/bin/env bash
# Installs what memforensics needs to build and test on Debian 12, by package name only.
# Safe to run again; skips apt entirely when everything is already installed.
#   setup-debian.sh             everything the tests, the format check and the fuzzers need
#   setup-debian.sh --analysis  only what building the memforensics executable needs (the README's
#                               first quick-start command: no browser, no clang, no test libraries)
set -euo pipefail
packages=(build-essential cmake ninja-build python3 libcli11-dev nlohmann-json3-dev
          libboost-graph-dev libzstd-dev zlib1g-dev pkg-config)
if [ "${1:-}" != "--analysis" ]; then
packages+=(libgtest-dev libgmock-dev libbenchmark-dev time)
# scripts/check-format.sh: the formatter the committed .clang-format is checked with.
packages+=(clang-format)
# scripts/fuzz.sh: clang with libFuzzer and its sanitizer runtimes, llvm-symbolizer for reports.
packages+=(clang libclang-rt-14-dev llvm)
# tests/report/browser_test.py: the HTML report opened in headless Chromium through ChromeDriver.
packages+=(chromium chromium-driver)
# tests/python/run.sh: the Python package installed offline into a venv of Debian's python3 that
# sees these (docs/python.md); pandas for the DataFrame results.
packages+=(python3-venv python3-pip python3-setuptools python3-wheel python3-pytest python3-pandas)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
