#!/usr/bin/env bash
# Builds the memforensics executable (only what it needs: no tests, no browser) and analyzes the
# sample snapshot that ships in snapshots/. The build's progress goes to stderr.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh" --analysis >&2
cd "$root"
exec build/src/cli/memforensics analyze snapshots/sample_training.pickle "$@"
