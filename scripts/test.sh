#!/bin/bash
# The second README command, and what CI runs: install what is missing,
# build twice (plain, and with AddressSanitizer + UBSan), and run every
# test in both builds.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
jobs=$(nproc)
./scripts/build.sh build
./scripts/build.sh build-asan -DSOFTVERBS_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
for dir in build build-asan; do
	echo "== ctest in $dir"
	(cd "$dir" && ctest -j"$jobs" --output-on-failure --timeout 900)
done
