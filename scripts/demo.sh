#!/bin/bash
# The first README command: install what is missing, build, and run the
# main job -- the devices, then the verbs walkthrough with explanations.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh build
sv=build/bin/softverbs
echo
echo "== softverbs devices -v"
$sv devices -v
echo
echo "== ibv_devinfo (Debian's, unmodified) on softverbs"
$sv run -- ibv_devinfo
echo
echo "== the verbs control plane, step by step (explanations on stderr)"
$sv run --explain -- build/bin/walkthrough
