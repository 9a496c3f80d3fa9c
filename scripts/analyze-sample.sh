#!/usr/bin/env bash
# Builds memforensics and analyzes the sample snapshot that ships in snapshots/.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh" >/dev/null
cd "$root"
exec build/src/cli/memforensics analyze snapshots/sample_training.pickle "$@"
