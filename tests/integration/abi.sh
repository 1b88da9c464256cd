#!/bin/bash
# Every Debian consumer of libibverbs.so.1 and librdmacm.so.1 named in
# reference/abi resolves against softverbs: `ldd -r` reports no undefined
# symbol and no missing version information, and the libraries it binds are
# ours.
. "$(dirname "$0")/lib.sh"
lib=$(readlink -f "$SV_BUILD/lib/libibverbs.so.1")
cmlib=$(readlink -f "$SV_BUILD/lib/librdmacm.so.1")
shopt -s nullglob
consumers=(/usr/bin/ibv_* /usr/bin/ib_*_bw /usr/bin/ib_*_lat /usr/bin/raw_ethernet_* /usr/bin/qperf
	/usr/bin/rping /usr/bin/ucmatose /usr/bin/udaddy /usr/bin/mckey /usr/bin/rdma_server
	/usr/bin/rdma_client /usr/bin/rdma_xserver /usr/bin/rdma_xclient /usr/bin/cmtime
	/usr/bin/riostream /usr/bin/rstream /usr/bin/udpong /usr/bin/rcopy
	/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so.1
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
	if readelf -d "$f" | grep -q 'NEEDED.*librdmacm'; then
		cmbound=$(echo "$out" | awk '/librdmacm.so.1 =>/ {print $3}')
		if [ "$(readlink -f "$cmbound")" != "$cmlib" ]; then
			bad "$f binds ${cmbound:-no librdmacm}, not softverbs' librdmacm.so.1"; continue
		fi
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
# librdmacm.so.1: rdma-core 44's 4 version nodes and all 68 default exports.
nodes=$(objdump -T "$cmlib" | grep -oE 'RDMACM_1\.[0-9]+' | sort -u | wc -l)
[ "$nodes" -eq 4 ] && ok "librdmacm: 4 version nodes" || bad "librdmacm: $nodes version nodes, want 4"
want=$(sort "$SV_SOURCE/../shared/reference/abi/rdmacm/librdmacm-exports.txt" 2>/dev/null)
have=$(objdump -T "$cmlib" | awk 'NF >= 7 && $NF !~ /^RDMACM/ && $(NF-1) ~ /^RDMACM/ && $4 != "*UND*" {print $NF "@@" $(NF-1)}' | sort)
if [ -z "$want" ]; then
	n=$(echo "$have" | grep -c .)
	[ "$n" -eq 68 ] && ok "librdmacm: 68 default exports" || bad "librdmacm: $n default exports, want 68"
elif [ "$want" = "$have" ]; then
	ok "librdmacm: the 68 default exports of rdma-core 44, each in its node"
else
	bad "librdmacm exports differ from reference/abi/rdmacm: $(diff <(echo "$want") <(echo "$have") | head -5)"
fi
finish
