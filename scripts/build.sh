#!/bin/bash
# build.sh [DIR [CMAKE ARGS...]]: configure and build softverbs into DIR
# (default build/).  The library lands in DIR/lib/libibverbs.so.1, the
# package in DIR/softverbs_VERSION_ARCH.deb.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
# The Debian package, beside the build (tests/integration/install.sh).
(cd "$dir" && cpack -G DEB >/dev/null)
