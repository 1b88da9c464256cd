#!/bin/bash
# The first README command: install what is missing, build, and run the
# main job -- the devices, the verbs walkthrough with explanations, two
# processes over one RC connection, and async events from a pulled cable.
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
echo
echo "== two processes, one RC connection: every operation and the three pitfalls"
SOFTVERBS_EXPLAIN=1 $sv run -- build/bin/rdma_demo server 18515 &
server=$!
sleep 0.3
SOFTVERBS_EXPLAIN=1 $sv run -- build/bin/rdma_demo client localhost 18515
wait $server
echo
echo "== async events: ibv_asyncwatch (Debian's) while the port's cable is pulled and plugged"
$sv run -- timeout 2 ibv_asyncwatch &
watch=$!
sleep 0.5
$sv port softverbs0/1 down
$sv run -- ibv_devinfo | grep -E "^\s+state:"
$sv port softverbs0/1 up
wait $watch || true

