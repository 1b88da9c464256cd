#!/bin/bash
# Every Debian consumer of libibverbs.so.1 named in reference/abi resolves
# against softverbs: `ldd -r` reports no undefined symbol and no missing
# version information, and the library it binds is ours.
. "$(dirname "$0")/lib.sh"
lib=$(readlink -f "$SV_BUILD/lib/libibverbs.so.1")
shopt -s nullglob
consumers=(/usr/bin/ibv_* /usr/bin/ib_*_bw /usr/bin/ib_*_lat /usr/bin/raw_ethernet_* /usr/bin/qperf
	/usr/bin/rping /usr/bin/ucmatose /usr/bin/udaddy /usr/bin/mckey /usr/bin/rdma_server
	/usr/bin/rdma_client /usr/bin/rdma_xserver /usr/bin/rdma_xclient /usr/bin/cmtime
	/usr/bin/riostream /usr/bin/rstream /usr/bin/udpong
	/lib/x86_64-linux-gnu/librdmacm.so.1 /lib/x86_64-linux-gnu/libmlx5.so.1
	/lib/x86_64-linux-gnu/libefa.so.1 /lib/x86_64-linux-gnu/libmlx4.so.1
	/usr/lib/python3/dist-packages/pyverbs/*.so /usr/lib/python3/dist-packages/pyverbs/providers/*/*.so)
[ ${#consumers[@]} -ge 40 ] || bad "only ${#consumers[@]} consumers found: are ibverbs-utils, perftest, qperf, rdmacm-utils and python3-pyverbs installed?"
unset LD_PRELOAD
for f in "${consumers[@]}"; do
	# Some pyverbs modules (enum tables) link no RDMA library at all.
	readelf -d "$f" | grep -qE 'NEEDED.*lib(ibverbs|rdmacm|mlx5|efa)' || continue
	out=$(ldd -r "$f" 2>&1)
	bound=$(echo "$out" | awk '/libibverbs.so.1 =>/ {print $3}')
	if [ -z "$bound" ]; then
		# librdmacm's dependants bind libibverbs through it.
		echo "$out" | grep -q "librdmacm.so.1 =>" || { bad "$f does not load libibverbs.so.1"; continue; }
	elif [ "$(readlink -f "$bound")" != "$lib" ]; then
		bad "$f binds $bound, not softverbs"; continue
	fi
	if echo "$out" | grep -qE "undefined symbol|no version information|not found"; then
		bad "$f: $(echo "$out" | grep -E 'undefined symbol|no version information|not found' | head -3)"
	else
		ok "$f"
	fi
done
# The version nodes themselves: all 13 of rdma-core 44.
nodes=$(objdump -T "$lib" | grep -oE 'IBVERBS_[0-9A-Z_.]+' | sort -u | wc -l)
[ "$nodes" -eq 13 ] && ok "13 version nodes" || bad "$nodes version nodes, want 13"
finish
