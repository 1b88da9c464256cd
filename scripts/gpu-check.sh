#!/bin/bash
# gpu-check.sh [BUILD]: on a machine with an NVIDIA GPU and its driver
# (libcuda.so.1), runs softverbs' GPU tests against the real driver
# instead of the test double, then the GPU benchmark.
#
# BUILD is a build directory made beforehand (scripts/build.sh BUILD), for
# a GPU machine without the build's dependencies; without it the script
# builds into build-gpu.  The figures are printed as `gpu-bench:` lines:
# host -> GPU WRITE from another process, GPU -> GPU between processes,
# GPU -> host READ, at 8 B and 1 MiB, each beside cuMemcpy between buffers
# of the same kinds, and the first-use cost of the CUDA IPC open.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-}
if [ -z "$build" ]; then
	build=build-gpu
	./scripts/build.sh "$build"
fi
bin=$build/bin/test_gpu
[ -x "$bin" ] || { echo "gpu-check: $bin is missing; build first" >&2; exit 2; }
if ! ldconfig -p | grep -q 'libcuda\.so\.1 '; then
	echo "gpu-check: no libcuda.so.1 here (no NVIDIA driver): nothing to check" >&2
	exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L
# The real driver, never the double: the loader's own search path.
unset LD_PRELOAD
export LD_LIBRARY_PATH=$build/lib
export SOFTVERBS_REGISTRY=gpu-check-$$
fail=0
run() {
	echo "== test_gpu $*"
	if ! timeout 300 env "$@" "$bin"; then
		echo "gpu-check: FAILED: $*" >&2
		fail=1
	fi
}
run SOFTVERBS_COPY=auto
run SOFTVERBS_COPY=cma
run SOFTVERBS_COPY=bounce
run SOFTVERBS_LINK_LAYER=roce SOFTVERBS_TRANSPORT=udp
echo "== benchmark (one process each side, same host)"
timeout 300 "$bin" --bench "${GPU_BENCH_ITERS:-2000}" || fail=1
rm -f /dev/shm/softverbs-*gpu-check-$$* 2>/dev/null || true
[ "$fail" = 0 ] && echo "gpu-check: passed"
exit "$fail"
