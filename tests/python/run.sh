#!/usr/bin/env bash
# The Python package's test (ctest python_package; docs/python.md): installs the package offline into
# a fresh venv that sees the system's site packages (Debian's setuptools, wheel, pip, pytest and
# pandas), reusing the CMake build directory BUILD (only brought up to date), then runs tests/python
# against the installed copy.   usage: run.sh BUILD [pytest options...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "$1" && pwd)
shift
venv="$build/python-venv"
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages --without-pip "$venv"
MEMFORENSICS_BUILD_DIR="$build" "$venv/bin/python" -m pip install --no-build-isolation --no-index \
  --no-deps --no-cache-dir --disable-pip-version-check -q "$root"
cd "$root/tests/python"
# The directory before the options: pytest finds this conftest (which defines them) from it.
"$venv/bin/python" -m pytest -q -p no:cacheprovider . "$@"
