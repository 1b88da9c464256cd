#!/bin/bash
# build.sh [DIR [CMAKE ARGS...]]: configure and build softverbs into DIR
# (default build/).  The library lands in DIR/lib/libibverbs.so.1.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
