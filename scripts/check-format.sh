#!/usr/bin/env bash
# Checks that every tracked C/C++/CUDA source matches the committed .clang-format (Debian 12's
# clang-format 14). Prints the files that differ and exits 1; `--fix` rewrites them in place.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v clang-format >/dev/null || { echo "check-format: clang-format not found (scripts/setup-debian.sh installs it)" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cpp' '*.hpp')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} of ${#files[@]} files differ from .clang-format (run scripts/check-format.sh --fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files match .clang-format"
