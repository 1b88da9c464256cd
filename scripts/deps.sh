#!/bin/bash
# Installs the Debian 12 packages softverbs builds and tests with, if any
# is missing.  Run as root (or through sudo).
set -euo pipefail
pkgs=(
	build-essential cmake pkg-config python3
	libibverbs-dev   # the ABI contract: <infiniband/verbs.h> of rdma-core 44
	librdmacm-dev    # and <rdma/rdma_cma.h> for librdmacm.so.1
	libcmocka-dev    # unit tests
	libisal-dev      # the RoCEv2 ICRC's CRC-32 (src/transport/udp/icrc.c)
	zlib1g-dev       # its independent check in the unit tests
	tshark           # tests: captures (SOFTVERBS_PCAP) decode as RoCEv2
	ibverbs-utils perftest qperf rdmacm-utils  # real clients for the integration tests
	rdma-core python3-pyverbs                  # rdma-core's own conformance suite
	ucx-utils gnuplot-nox                      # bench/ and tests: the UCX peer, and the plots
	man-db bsdextrautils                       # tests: the man page renders (man, col)
)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "softverbs: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
