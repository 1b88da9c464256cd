#!/bin/bash
# RoCEv2 over UDP between two hosts: two network namespaces joined by a
# veth pair (198.18.0.1/30 and 198.18.0.2/30, nothing else routed), the
# server of each pair in one, its client in the other.  Debian's
# pingpongs, perftest and qperf must pass, and the veth counters must show
# that the traffic crossed the wire: /dev/shm is shared by the two
# namespaces, so a pair that passes through shared memory instead is a
# FAIL.  Then the reliable ones again with loss, duplicates, reordering
# and corruption (SOFTVERBS_FAULT); one run captured (SOFTVERBS_PCAP) and
# decoded by tshark.  Then IPv6: the veth ends get 2001:2::1/64 and
# 2001:2::2/64 (RFC 5180's benchmarking range, no other IPv6 address) and
# a few of the runs go again over their IPv6 GIDs, checked to have
# crossed the veth as UDP over IPv6.  Last, the UDP transport on one
# host's lo.
#
# Without root only the lo part runs.  The script runs in a network
# namespace of its own (as rdmacm.sh), so its lo and its TCP ports are its
# own; the two host namespaces are svA-PID and svB-PID, removed on exit.
#
# Knobs (none is set by CMake):
#   SV_UDP_NO_TRAFFIC_CHECK=1  report the counters but do not check them
#                              (to develop this script before the transport);
#   SV_UDP_BUDGET=S            seconds for the whole script (default 840:
#                              ctest's TIMEOUT is 900); runs that do not fit
#                              are FAILs, not hangs;
#   SV_UDP_BW_ITERS=N          -n of the perftest -a sweeps (default 100);
#   SV_UDP_LOSS_ITERS=N        the same with faults, captured, and on lo
#                              (default 5, perftest's least);
#   SV_UDP_SEED=N              the fault seed (default random, printed);
#   SV_UDP_NS_ENV="V=X ..."    more variables for both hosts' programs.
set -u
if [ -z "${SV_UDP_REEXEC:-}" ]; then
	export SV_UDP_REEXEC=1 SV_UDP_ROOT=0 SV_UDP_PRIVATE=0
	[ "$(id -u)" -eq 0 ] && SV_UDP_ROOT=1
	if [ $SV_UDP_ROOT = 1 ] && unshare -n true 2>/dev/null; then
		SV_UDP_PRIVATE=1 exec unshare -n bash "$0" "$@"
	elif unshare -rn true 2>/dev/null; then
		SV_UDP_PRIVATE=1 exec unshare -rn bash "$0" "$@"
	fi
fi
here=$(dirname "$0")
. "$here/lib.sh"
. "$here/netns.sh"
: "${SV_SOURCE:=$(cd "$here/../.." && pwd)}"

NSA=svA-$$ NSB=svB-$$
IFA=sva IFB=svb
ADDR_A=198.18.0.1 ADDR_B=198.18.0.2
ADDR6_A=2001:2::1 ADDR6_B=2001:2::2
# The IPv6 section sets these: GID_A6/GID_B6 for @GID@, the counter the
# traffic is checked on (udp6: Udp6OutDatagrams), a tag for the names.
GID_FAMILY="" P_UDP=udp P_TAG=""
# The link layer of every run; the IB section sets ib, where a peer is
# named by its LID alone.
LINK=roce
BUDGET=${SV_UDP_BUDGET:-840}
BW_N=${SV_UDP_BW_ITERS:-100}
LOSS_N=${SV_UDP_LOSS_ITERS:-5}
SEED=${SV_UDP_SEED:-$RANDOM}
NOCHECK=${SV_UDP_NO_TRAFFIC_CHECK:-0}
FAULT="drop=0.05,dup=0.02,reorder=0.02,corrupt=0.01,seed=$SEED"
PP_N=200          # pingpong and perftest lat iterations
PP_SIZE=4096      # their message size (UD: 1024, under the veth's MTU)
SWEEP=$(((1 << 24) - 2))  # the bytes of one -a iteration: 2 + 4 + ... + 8 MiB
C2S_MAX=0         # when set, the most bytes the client's side may send
S2C_MAX=0         # ... and the server's
EXTRA_ENV=()      # more VAR=VALUE for both sides (A:VAR=VALUE: for side A
                  # only); @SIDE@ in VALUE becomes the side, A, B or L
read -r -a NS_ENV <<<"${SV_UDP_NS_ENV:-}"
HAVE_NS=0

cleanup() {
	local p
	# The background programs not waited for yet; those waited for may
	# have had their pid reused.
	# shellcheck disable=SC2046
	job_kill $(jobs -p)
	[ $HAVE_NS != 0 ] && ns_del "$NSA" "$NSB"
	# Each network namespace is a host with a registry of its own.
	[ -n "${SOFTVERBS_REGISTRY:-}" ] && rm -f /dev/shm/"$SOFTVERBS_REGISTRY".n*
	rm -rf "$TMP"
}
ns_traps cleanup

# tmo WANT: WANT seconds, or what is left of the budget; fails under 10 s.
tmo() {
	local left=$((BUDGET - SECONDS))
	[ $left -ge 10 ] || return 1
	echo $(($1 < left ? $1 : left))
}

# run_in NS SIDE TIMEOUT CMD ARGS...: CMD in namespace NS ("" for this one)
# under softverbs in $LINK mode; @GID@ in ARGS becomes the side's GID index,
# and in IB mode goes with the flag before it (-g, -x): the peer is named
# by LID.
run_in() {
	local ns=$1 side=$2 t=$3 a gidvar
	shift 3
	gidvar=GID_$side$GID_FAMILY
	local args=() envs=("LD_LIBRARY_PATH=$LD_LIBRARY_PATH" SOFTVERBS_LINK_LAYER=$LINK)
	[ -n "${LD_PRELOAD:-}" ] && envs+=("LD_PRELOAD=$LD_PRELOAD" "ASAN_OPTIONS=${ASAN_OPTIONS:-}")
	envs+=("${NS_ENV[@]}")
	for a in "${EXTRA_ENV[@]}"; do
		case $a in [A-Z]:*) [ "${a%%:*}" = "$side" ] || continue; a=${a#?:} ;; esac
		envs+=("${a//@SIDE@/$side}")
	done
	for a in "$@"; do
		if [ "$LINK" = ib ] && [ "$a" = @GID@ ]; then
			unset 'args[-1]'
			continue
		fi
		args+=("${a//@GID@/${!gidvar:-}}")
	done
	if [ -n "$ns" ]; then
		timeout -k 5 "$t" ip netns exec "$ns" env "${envs[@]}" "${args[@]}"
	else
		timeout -k 5 "$t" env "${envs[@]}" "${args[@]}"
	fi
}

# stop PID GRACE: lets PID (a background run_in) end within GRACE
# seconds, else ends it.
stop() {
	for _ in $(seq $(($2 * 10))); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 0.1
	done
	job_kill "$1"
}

# The pair's placement: server namespace, client namespace, the sides (for
# @GID@ and @SIDE@), the address the client dials, the interfaces counted.
place_hosts() { P_SNS=$NSA P_CNS=$NSB P_SS=A P_CS=B P_DST=$ADDR_A P_SIF=$IFA P_CIF=$IFB P_LO=0 P_WIRE="the veth"; }
place_lo() { P_SNS="" P_CNS="" P_SS=L P_CS=L P_DST=127.0.0.1 P_SIF=lo P_CIF=lo P_LO=1 P_WIRE=lo; }
PORT=20000
P_T=60

# pair WHAT PATTERN S2C C2S DGS DGC CMD ARGS...: CMD as server (-p PORT)
# and client (-p PORT ADDRESS) as placed; both must exit 0 within P_T s
# and the client's output match PATTERN.  Then the traffic: the server's
# interface must have sent S2C bytes more, the client's C2S, and the
# server's and client's namespaces DGS and DGC UDP datagrams.
pair() {
	local what=$1$P_TAG pat=$2 s2c=$3 c2s=$4 dgs=$5 dgc=$6
	shift 6
	local t port=$((PORT++)) srv cli crc src cs0 cc0 cs1 cc1 t0=$SECONDS
	if ! t=$(tmo $P_T); then
		bad "$what: not run: the script's time budget (${BUDGET} s) is spent"
		return 1
	fi
	cs0=$(ns_counters "$P_SNS" "$P_SIF")
	cc0=$(ns_counters "$P_CNS" "$P_CIF")
	run_in "$P_SNS" "$P_SS" "$t" "$@" -p $port >"$TMP/srv.log" 2>&1 &
	srv=$!
	if [ -n "$P_SNS" ]; then ns_wait_listen "$P_SNS" $port; else wait_listen $port; fi || {
		bad "$what: the server never listened"
		job_kill $srv
		sed 's/^/    srv: /' "$TMP/srv.log" | tail -5
		return 1
	}
	run_in "$P_CNS" "$P_CS" "$t" "$@" -p $port "$P_DST" >"$TMP/cli.log" 2>&1 &
	cli=$!
	wait $cli
	crc=$?
	[ $crc -ne 0 ] && stop $srv 5
	wait $srv
	src=$?
	if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
		local why="client rc $crc, server rc $src"
		case " $crc $src " in *" 124 "* | *" 137 "*) why="$why; 124 or 137: over its ${t} s" ;; esac
		bad "$what ($why, after $((SECONDS - t0)) s)"
		grep -v ' address: ' "$TMP/cli.log" | sed 's/^/    cli: /' | tail -8
		grep -v ' address: ' "$TMP/srv.log" | sed 's/^/    srv: /' | tail -8
		return 1
	fi
	if ! grep -qE -- "$pat" "$TMP/cli.log"; then
		bad "$what: both exited 0, but the client did not say /$pat/:"
		sed 's/^/    cli: /' "$TMP/cli.log" | tail -8
		return 1
	fi
	ok "$what ($((SECONDS - t0)) s)"
	cs1=$(ns_counters "$P_SNS" "$P_SIF")
	cc1=$(ns_counters "$P_CNS" "$P_CIF")
	traffic "$what" "$cs0" "$cs1" "$cc0" "$cc1" "$s2c" "$c2s" "$dgs" "$dgc"
}

# traffic WHAT S0 S1 C0 C1 S2C C2S DGS DGC: the check of pair's counters
# ("TX_BYTES UDP_OUT UDP6_OUT" before and after, server and client side;
# the datagrams counted are P_UDP's: udp for IPv4, udp6 for IPv6).  On lo
# the one interface carries both ways and one namespace sends both sides'
# datagrams: the sums are checked.
traffic() {
	local what=$1 s2c=$6 c2s=$7 dgs=$8 dgc=$9
	local sb0 su0 s60 sb1 su1 s61 cb0 cu0 c60 cb1 cu1 c61
	read -r sb0 su0 s60 <<<"$2"
	read -r sb1 su1 s61 <<<"$3"
	read -r cb0 cu0 c60 <<<"$4"
	read -r cb1 cu1 c61 <<<"$5"
	local ds=$((sb1 - sb0)) dc=$((cb1 - cb0)) us=$((su1 - su0)) uc=$((cu1 - cu0)) msg okay=1
	local UDP=UDP
	if [ "$P_UDP" = udp6 ]; then
		us=$((s61 - s60)) uc=$((c61 - c60)) UDP="UDP/IPv6"
	fi
	if [ "$sb0" -lt 0 ] || [ "$sb1" -lt 0 ] || [ "$cb0" -lt 0 ] || [ "$cb1" -lt 0 ]; then
		bad "$what: the interface counters could not be read"
		return 1
	fi
	if [ $P_LO = 1 ]; then
		msg="lo sent $ds bytes (needs >= $((s2c + c2s))), $us $UDP datagrams (needs >= $((dgs + dgc)))"
		[ $ds -ge $((s2c + c2s)) ] && [ $us -ge $((dgs + dgc)) ] || okay=0
		[ "$SV_UDP_PRIVATE" = 1 ] || msg="$msg; relaxed: this lo is the host's, others' traffic counts too"
	else
		msg="$NSA sent $ds bytes (needs >= $s2c) in $us $UDP datagrams (needs >= $dgs)"
		msg="$msg, $NSB sent $dc bytes (needs >= $c2s) in $uc $UDP datagrams (needs >= $dgc)"
		[ $ds -ge "$s2c" ] && [ $dc -ge "$c2s" ] && [ $us -ge "$dgs" ] && [ $uc -ge "$dgc" ] || okay=0
		if [ "$C2S_MAX" -gt 0 ] && [ $dc -gt "$C2S_MAX" ]; then
			bad "$what: $NSB sent $dc bytes, more than $C2S_MAX: go-back-N sent too much again after losses (engine/pkt_req.c loss_seen)"
			return 1
		fi
		if [ "$S2C_MAX" -gt 0 ] && [ $ds -gt "$S2C_MAX" ]; then
			bad "$what: $NSA sent $ds bytes, more than $S2C_MAX: READ responses asked for again too often after losses (engine/pkt_req.c read_lost)"
			return 1
		fi
		[ "$C2S_MAX" -gt 0 ] && msg="$msg, at most $C2S_MAX"
		[ "$S2C_MAX" -gt 0 ] && msg="$msg, at most $S2C_MAX from $NSA"
	fi
	if [ "$NOCHECK" = 1 ]; then
		echo "note: $what: traffic not checked (SV_UDP_NO_TRAFFIC_CHECK=1): $msg"
	elif [ $okay = 1 ]; then
		ok "$what: its traffic crossed $P_WIRE ($msg)"
	else
		bad "$what passed, but its traffic did not cross $P_WIRE as RoCEv2 over $UDP: $msg; it went another way (shared memory?)"
		return 1
	fi
}

# ---- the clients ----
# pingpong TYPE LABEL FLAGS...: ibv_TYPE_pingpong, PP_N messages each way.
pingpong() {
	local t=$1 label=$2 size=$PP_SIZE dg=$PP_N
	shift 2
	[ "$t" = ud ] && size=1024
	# srq's 16 QPs send at once: a transport may batch them; one datagram
	# each way is what it cannot do without.
	[ "$t" = srq ] && dg=1
	pair "ibv_${t}_pingpong${*:+ $*}$label" "^$PP_N iters in" $((size * PP_N)) $((size * PP_N)) $dg $dg \
		"ibv_${t}_pingpong" -g @GID@ -s $size -n $PP_N "$@"
}

# xsrq LABEL FLAGS...: XRC, 50 messages each way.  Its -c is the number of
# clients (on the server; see xsrq_two), not a data check; -m 1024 as its
# default path MTU, 2048, does not fit a 1500-byte Ethernet.
xsrq() {
	local label=$1
	shift
	pair "ibv_xsrq_pingpong${*:+ $*}$label" "^success" $((4096 * 50)) $((4096 * 50)) 1 1 \
		ibv_xsrq_pingpong -g @GID@ -m 1024 -n 50 "$@"
}

# xsrq_two: one server (-c 2) in A, two clients in B, one SRQ for both.
xsrq_two() {
	local what="ibv_xsrq_pingpong -c 2 (two clients)" t port=$((PORT++)) srv c1 c2 r1 r2 rs
	t=$(tmo $P_T) || { bad "$what: not run: the time budget is spent"; return 1; }
	local cs0 cc0 cs1 cc1
	cs0=$(ns_counters "$NSA" $IFA)
	cc0=$(ns_counters "$NSB" $IFB)
	run_in "$NSA" A "$t" ibv_xsrq_pingpong -g @GID@ -m 1024 -n 20 -c 2 -p $port >"$TMP/srv.log" 2>&1 &
	srv=$!
	if ! ns_wait_listen "$NSA" $port; then
		bad "$what: the server never listened"; job_kill $srv; return 1
	fi
	run_in "$NSB" B "$t" ibv_xsrq_pingpong -g @GID@ -m 1024 -n 20 -p $port $ADDR_A >"$TMP/c1.log" 2>&1 &
	c1=$!
	run_in "$NSB" B "$t" ibv_xsrq_pingpong -g @GID@ -m 1024 -n 20 -p $port $ADDR_A >"$TMP/c2.log" 2>&1 &
	c2=$!
	wait $c1; r1=$?
	wait $c2; r2=$?
	[ $r1 -ne 0 ] || [ $r2 -ne 0 ] && stop $srv 5
	wait $srv; rs=$?
	if [ $r1 -ne 0 ] || [ $r2 -ne 0 ] || [ $rs -ne 0 ]; then
		bad "$what (clients rc $r1/$r2, server rc $rs)"
		tail -n 4 "$TMP/srv.log" "$TMP/c1.log" "$TMP/c2.log" | sed 's/^/    /'
		return 1
	fi
	ok "$what"
	cs1=$(ns_counters "$NSA" $IFA)
	cc1=$(ns_counters "$NSB" $IFB)
	traffic "$what" "$cs0" "$cs1" "$cc0" "$cc1" $((2 * 20 * 4096)) $((2 * 20 * 4096)) 1 1
}

# lat NAME: a perftest latency test, PP_N iterations (one message in
# flight: a datagram each at least), 4 KiB but for the atomics.
lat() {
	local t=$1 s=$PP_SIZE
	case $t in
	ib_send_lat | ib_write_lat)
		pair "$t -s $s" '^ +[0-9]+ +[0-9]+ +[0-9.]+' $((s * PP_N)) $((s * PP_N)) $PP_N $PP_N \
			"$t" -x @GID@ -F -s $s -n $PP_N ;;
	ib_read_lat)	# the server's memory read: data one way, requests the other
		pair "$t -s $s" '^ +[0-9]+ +[0-9]+ +[0-9.]+' $((s * PP_N)) 0 $PP_N $PP_N \
			"$t" -x @GID@ -F -s $s -n $PP_N ;;
	ib_atomic_lat)
		pair "$t" '^ +[0-9]+ +[0-9]+ +[0-9.]+' 0 0 $PP_N $PP_N "$t" -x @GID@ -F -n $PP_N ;;
	esac
}

# bw NAME N LABEL: a perftest bandwidth test over every size (-a), N
# iterations each: N * (2 + 4 + ... + 8 MiB) bytes the data's way.
bw() {
	local t=$1 n=${2:-} label=${3:-} old=$P_T
	P_T=120
	case $t in
	ib_write_bw | ib_send_bw)
		pair "$t -a -n $n$label" '^ 8388608 +[0-9]+ +[0-9.]+' 0 $((SWEEP * n)) 1 1 \
			"$t" -x @GID@ -F -a -n "$n" ;;
	ib_read_bw)
		pair "$t -a -n $n$label" '^ 8388608 +[0-9]+ +[0-9.]+' $((SWEEP * n)) 0 1 1 \
			"$t" -x @GID@ -F -a -n "$n" ;;
	ib_atomic_bw)	# 8 bytes an operation: only datagrams prove anything
		pair "$t -n $PP_N$label" '^ +8 +[0-9]+ +[0-9.]+' 0 0 1 1 "$t" -x @GID@ -F -n $PP_N ;;
	esac
	local rc=$?
	P_T=$old
	return $rc
}

# qval FILE KEY: qperf's value of KEY (e.g. "4.85 GB", "35,967") as a number.
qval() {
	awk -v k="$2" '$1 == k && $2 == "=" {
		v = $3; gsub(",", "", v); u = $4
		m = u == "KB" ? 1e3 : u == "MB" ? 1e6 : u == "GB" ? 1e9 : u == "TB" ? 1e12 : u == "thousand" ? 1e3 : u == "million" ? 1e6 : u == "billion" ? 1e9 : 1
		printf "%d\n", v * m; exit }' "$1"
}

# qperf's tests with the server in A.  qperf 0.4.11 puts no GRH in its
# address vectors unless it connects through rdma_cm (-cm1), which serves
# only RC: in RoCE mode, which needs a GRH, the RC tests run through
# rdma_cm; in IB mode every test runs as qperf sets it up, by LID.
# Time-based (-t 1): what moved is what the client reports (-vvs), of
# which 90% is asked of the wire (qperf rounds to 3 digits).
qperf_hosts() {
	local port=$((PORT++)) srv t rc a2b b2a dga dgb cs0 cc0 cs1 cc1
	local tq cm=() tests=(rc_lat rc_bw rc_rdma_write_lat rc_rdma_read_bw rc_compare_swap_mr)
	if [ "$LINK" = ib ]; then
		tests+=(ud_lat uc_bw)
	else
		cm=(-cm1)
	fi
	tq=$(tmo 300) || { bad "qperf: not run: the time budget is spent"; return 1; }
	run_in "$NSA" A "$tq" qperf -lp $port >"$TMP/qsrv.log" 2>&1 &
	srv=$!
	if ! ns_wait_listen "$NSA" $port; then
		bad "qperf: the server never listened"; sed 's/^/    /' "$TMP/qsrv.log" | tail -3; return 1
	fi
	for t in "${tests[@]}"; do
		local what="qperf${cm:+ ${cm[*]}} $t$P_TAG"
		tq=$(tmo 30) || { bad "$what: not run: the time budget is spent"; continue; }
		cs0=$(ns_counters "$NSA" $IFA)
		cc0=$(ns_counters "$NSB" $IFB)
		run_in "$NSB" B "$tq" qperf -lp $port "${cm[@]}" -t 1 -vvs $ADDR_A $t >"$TMP/q.log" 2>&1
		rc=$?
		if [ $rc -ne 0 ] || ! grep -qE '(latency|bw|msg_rate) += +[0-9.]+ ' "$TMP/q.log"; then
			bad "$what (rc $rc)"
			sed 's/^/    cli: /' "$TMP/q.log" | head -5
			continue
		fi
		ok "$what: $(grep -E '^ +(latency|bw|msg_rate) ' "$TMP/q.log" | head -1 | tr -s ' ')"
		cs1=$(ns_counters "$NSA" $IFA)
		cc1=$(ns_counters "$NSB" $IFB)
		a2b=0 b2a=0 dga=1 dgb=1
		case $t in
		rc_lat | rc_rdma_write_lat | ud_lat)
			a2b=$(($(qval "$TMP/q.log" rem_send_bytes) * 9 / 10))
			b2a=$(($(qval "$TMP/q.log" loc_send_bytes) * 9 / 10))
			dga=$(($(qval "$TMP/q.log" rem_send_msgs) * 9 / 10))
			dgb=$(($(qval "$TMP/q.log" loc_send_msgs) * 9 / 10)) ;;
		# What the server received crossed the wire; what the client
		# posted may still have been queued when the time ran out.
		rc_bw) b2a=$(($(qval "$TMP/q.log" recv_bytes) * 9 / 10)) ;;
		uc_bw)	# UC: no ACKs, nothing comes back
			b2a=$(($(qval "$TMP/q.log" recv_bytes) * 9 / 10)) dga=0 ;;
		rc_rdma_read_bw) a2b=$(($(qval "$TMP/q.log" recv_bytes) * 9 / 10)) ;;
		esac
		traffic "$what" "$cs0" "$cs1" "$cc0" "$cc1" $a2b $b2a $dga $dgb
	done
	[ "$LINK" = ib ] ||
		echo "note: qperf ud_lat, uc_bw: qperf 0.4.11 sets no GRH without -cm1, and -cm1" \
			"is RC only, so neither can run on RoCE; they run in the IB section"
	job_kill $srv
}

# lid_of NS WANT: the port's LID in NS, in IB mode with SOFTVERBS_LID=addr,
# must be WANT (its veth address's host part).
lid_of() {
	local lid
	lid=$(run_in "$1" A 30 ibv_devinfo 2>/dev/null | sed -nE 's/.*port_lid:[[:space:]]+([0-9]+).*/\1/p' | head -1)
	if [ "${lid:-}" = "$2" ]; then
		ok "$1: port_lid $lid, its address's host part"
	else
		bad "$1: port_lid ${lid:-none}, not $2"
	fi
}

# loss_pass NAME...: the named runs again, with SOFTVERBS_FAULT on both
# sides.  Only reliable transports: a lost UC or UD message is never
# redelivered, and its pingpong would wait for it forever.  The
# pingpongs' two ends each exit as soon as their own last completion is
# in; the other end's last ACK may be lost on the way, and the QP it
# would answer is then destroyed: a destroyed QP's tombstone answers
# those retransmissions while its context closes (engine/pkt.c).
loss_pass() {
	local n
	for n in "$@"; do
		EXTRA_ENV=("SOFTVERBS_FAULT=$FAULT")
		case $n in
		rc)
			pingpong "$n" " (faults)" -c ;;
		srq)
			# One QP, not 16: ibv_srq_pingpong posts a SEND on every QP
			# whose last exchange is done while its count of completed
			# SENDs is short, so with 16 QPs up to 15 SENDs beyond -n
			# are under way when the peer, done, exits.  Nothing
			# receives them; their sender fails with
			# IBV_WC_RETRY_EXC_ERR if it still polls when their retries
			# run out, which loss makes likely (seen 3 runs in 30 under
			# load; 0 in 40 with -q 1).  A NIC does the same.
			pingpong "$n" " (faults)" -c -q 1 ;;
		xsrq) xsrq " (faults)" ;;
		ib_write_bw | ib_send_bw)
			# What a loss costs is what the requester had in flight
			# after it, all sent again: the window that losses cut
			# keeps it under 4x the payload (1.5x measured; 46x
			# with the whole window in flight).
			C2S_MAX=$((4 * SWEEP * LOSS_N))
			bw "$n" "$LOSS_N" " (faults)"
			C2S_MAX=0 ;;
		ib_read_bw)
			# The responder's side: a lost response is asked for
			# again alone, as soon as a later answer shows it lost,
			# so the responses stay under 3x the payload (1.55x
			# measured; 5x when a lost repair waited for the ACK
			# timeout and the window went again).
			S2C_MAX=$((3 * SWEEP * LOSS_N))
			bw "$n" "$LOSS_N" " (faults)"
			S2C_MAX=0 ;;
		ib_*_bw) bw "$n" "$LOSS_N" " (faults)" ;;
		*) bad "loss_pass: no run named $n" ;;
		esac
	done
	EXTRA_ENV=()
}

# capture_check SIDE [ipv6]: SIDE's capture: tshark finds no error, every
# frame RoCEv2 (UDP to 4791, decoded as InfiniBand) between the two hosts'
# IPv4 addresses (ipv6: over IPv6, between their IPv6 addresses); then
# icrc_check.py.
capture_check() {
	local side=$1 f files ipf=ip a=$ADDR_A b=$ADDR_B
	[ "${2:-}" = ipv6 ] && ipf=ipv6 a=$ADDR6_A b=$ADDR6_B
	files=$(ls "$TMP"/cap-"$side"-*.pcap 2>/dev/null)
	if [ -z "$files" ]; then
		if [ "$NOCHECK" = 1 ]; then
			echo "note: side $side wrote no capture (SV_UDP_NO_TRAFFIC_CHECK=1: not checked)"
		else
			bad "capture: side $side wrote no $TMP/cap-$side-PID.pcap (SOFTVERBS_PCAP)"
		fi
		return 1
	fi
	for f in $files; do
		local name total ib port addr t
		name="capture $side ($(basename "$f"), $(stat -c %s "$f") bytes)"
		if ! t=$(tmo 120); then
			bad "$name: not checked: the time budget is spent"
		elif ! command -v tshark >/dev/null; then
			echo "skipped: $name: tshark is not installed"
		else
			# Frames with an error, and the protocols tshark saw in them.
			# The payload is the application's bytes, which tshark also
			# guesses at (an Ethertype when bytes 2-3 are zero, iSER,
			# RPC over RDMA...): an error in a protocol it found inside
			# the InfiniBand payload is about random data, not the
			# packet.  A payload it took for nothing ("infiniband:data")
			# leaves any error to the headers: that one counts.
			local flagged real guessed
			if ! flagged=$(timeout -k 5 "$t" tshark -r "$f" -Y '_ws.malformed || _ws.expert.severity == error' \
				-T fields -e frame.number -e frame.protocols 2>"$TMP/tshark.err"); then
				bad "$name: tshark failed"; sed 's/^/    /' "$TMP/tshark.err" | head -5
			else
				real=$(awk 'NF && ($2 !~ /infiniband:/ || $2 ~ /infiniband:data$/)' <<<"$flagged")
				guessed=$(awk 'NF && $2 ~ /infiniband:/ && $2 !~ /infiniband:data$/' <<<"$flagged" | wc -l)
				[ "$guessed" -gt 0 ] && echo "note: $name: $guessed frame(s) whose payload tshark" \
					"took for another protocol and found malformed (payload bytes, ignored)"
				if [ -n "$real" ]; then
					timeout -k 5 "$t" tshark -r "$f" -q -z expert >"$TMP/expert.txt" 2>/dev/null
					bad "$name: tshark finds errors in the packets (frame protocols):"
					sed 's/^/    /' <<<"$real" | head -10
					sed 's/^/    /' "$TMP/expert.txt" | head -20
				else
					ok "$name: tshark finds no error in the packets"
				fi
			fi
			timeout -k 5 "$t" tshark -r "$f" -T fields -E separator=' ' -e frame.protocols -e udp.dstport \
				-e $ipf.src -e $ipf.dst >"$TMP/frames.txt" 2>"$TMP/tshark.err"
			total=$(wc -l <"$TMP/frames.txt")
			ib=$(grep -c ":$ipf:udp:infiniband" "$TMP/frames.txt")
			port=$(awk '$2 == 4791' "$TMP/frames.txt" | wc -l)
			addr=$(awk -v a="$a" -v b="$b" '($3 == a && $4 == b) || ($3 == b && $4 == a)' \
				"$TMP/frames.txt" | wc -l)
			if [ "$total" -gt 0 ] && [ "$ib" -eq "$total" ] && [ "$port" -eq "$total" ] && [ "$addr" -eq "$total" ] &&
			   ! grep -q malformed "$TMP/frames.txt"; then
				ok "$name: all $total frames RoCEv2 ($ipf, UDP to 4791, InfiniBand) between $a and $b"
			else
				bad "$name: $total frames, $ib $ipf/UDP/InfiniBand, $port to UDP 4791, $addr between $a and $b"
				grep -v ":$ipf:udp:infiniband" "$TMP/frames.txt" | sort | uniq -c | head -5 | sed 's/^/    /'
			fi
		fi
		if [ ! -f "$SV_SOURCE/tests/integration/icrc_check.py" ]; then
			echo "skipped: $name: ICRC check: $SV_SOURCE/tests/integration/icrc_check.py does not exist yet"
		elif ! t=$(tmo 120); then
			bad "$name: ICRC not checked: the time budget is spent"
		elif timeout -k 5 "$t" python3 "$SV_SOURCE/tests/integration/icrc_check.py" "$f" >"$TMP/icrc.txt" 2>&1; then
			ok "$name: icrc_check.py: $(tail -1 "$TMP/icrc.txt")"
		else
			bad "$name: icrc_check.py"; sed 's/^/    /' "$TMP/icrc.txt" | tail -8
		fi
	done
}

# wire_check: the frames as a wire carries them.  Each veth end cuts
# UDP GSO runs into packets in software (gso_max_segs 1), as a host
# without segmentation offload does, so the kernel writes every packet's
# own IP header; A's kernel captures what crosses, and
# icrc_check.py recomputes each ICRC over the headers captured.  Among
# them is the IPv4 identification, which a run numbers 0, 1, 2 ... and
# the ICRC covers (transport/udp/icrc.c), and which no SOFTVERBS_PCAP
# capture shows, being rebuilt from what softverbs knows.  dumpcap
# captures; tshark reads.
wire_check() {
	local f=$TMP/wire.pcap cap t n ids i segs_a segs_b
	if ! command -v tshark >/dev/null || ! command -v dumpcap >/dev/null; then
		echo "skipped: the wire: tshark (and its dumpcap) is not installed"
		return 0
	fi
	segs_a=$(ip -n "$NSA" -d link show $IFA | sed -nE 's/.* gso_max_segs ([0-9]+).*/\1/p')
	segs_b=$(ip -n "$NSB" -d link show $IFB | sed -nE 's/.* gso_max_segs ([0-9]+).*/\1/p')
	ip -n "$NSA" link set $IFA gso_max_segs 1 && ip -n "$NSB" link set $IFB gso_max_segs 1
	if [ "$(ip -n "$NSA" -d link show $IFA | sed -nE 's/.* gso_max_segs ([0-9]+).*/\1/p')" != 1 ] ||
	   [ "$(ip -n "$NSB" -d link show $IFB | sed -nE 's/.* gso_max_segs ([0-9]+).*/\1/p')" != 1 ]; then
		bad "the wire: the veth's gso_max_segs did not become 1 (was $segs_a and $segs_b)"
		ip -n "$NSA" link set $IFA gso_max_segs "${segs_a:-65535}"
		ip -n "$NSB" link set $IFB gso_max_segs "${segs_b:-65535}"
		return 1
	fi
	rm -f "$f"
	# dumpcap, tshark's capture engine, without its dissectors to load:
	# under the suite's other jobs tshark itself took more than 10 s to
	# start capturing.
	ip netns exec "$NSA" timeout -k 10 -s INT 300 dumpcap -q -P -i $IFA -f "udp port 4791" \
		-w "$f" >"$TMP/wire.log" 2>&1 &
	cap=$!
	for i in $(seq 600); do
		grep -q "Capturing on" "$TMP/wire.log" && break
		sleep 0.1
	done
	if ! grep -q "Capturing on" "$TMP/wire.log"; then
		bad "the wire: dumpcap did not start capturing within 60 s"
		sed 's/^/    /' "$TMP/wire.log" | tail -5
		kill -INT $cap 2>/dev/null
		wait $cap
		ip -n "$NSA" link set $IFA gso_max_segs "${segs_a:-65535}"
		ip -n "$NSB" link set $IFB gso_max_segs "${segs_b:-65535}"
		return 1
	fi
	# WRITEs of whole runs, and READ responses whose runs end in a
	# shorter packet (5,000 bytes in 1,024-byte packets).
	pair "ib_write_bw -s 65536 (each packet's own header, captured by the kernel)" \
		'^ 65536 +50 +[0-9.]+' 0 $((50 * 65536)) 1 1 ib_write_bw -x @GID@ -F -s 65536 -n 50
	pair "ib_read_bw -s 5000 (each packet's own header, captured by the kernel)" \
		'^ 5000 +200 +[0-9.]+' $((200 * 5000)) 0 1 1 ib_read_bw -x @GID@ -F -s 5000 -n 200
	kill -INT $cap 2>/dev/null
	wait $cap
	ip -n "$NSA" link set $IFA gso_max_segs "${segs_a:-65535}"
	ip -n "$NSB" link set $IFB gso_max_segs "${segs_b:-65535}"
	if ! t=$(tmo 120); then
		bad "the wire: not checked: the time budget is spent"
	elif timeout -k 5 "$t" python3 "$SV_SOURCE/tests/integration/icrc_check.py" "$f" >"$TMP/icrc.txt" 2>&1; then
		# 3.2 MB and 1 MB in packets of at most 4 KiB, and runs cut
		# into packets: some with an identification other than 0.
		n=$(sed -nE 's/^checked ([0-9]+) RoCEv2 frames.*/\1/p' "$TMP/icrc.txt")
		ids=$(timeout -k 5 "$t" tshark -r "$f" -Y 'ip.id != 0' 2>/dev/null | wc -l)
		if [ "${n:-0}" -ge 1000 ] && [ "$ids" -ge 100 ]; then
			ok "the wire: icrc_check.py: $(tail -1 "$TMP/icrc.txt"), $ids with an IPv4 identification other than 0"
		else
			bad "the wire: ${n:-0} RoCEv2 frames captured (needs >= 1000), $ids with an identification other than 0 (needs >= 100)"
			sed 's/^/    /' "$TMP/wire.log" | tail -5
		fi
	else
		bad "the wire: icrc_check.py"; sed 's/^/    /' "$TMP/icrc.txt" | tail -8
	fi
	rm -f "$f"
}

# status_check [PEER]: `softverbs status` in A while ib_write_bw runs from
# B shows A's UDP endpoint on 4791 with packets in, and its QP with B's
# address (PEER: B's IPv4 address unless given) as its peer and packets
# both ways.
status_check() {
	local t port=$((PORT++)) srv cli peer=${1:-$ADDR_B}
	t=$(tmo 30) || { bad "softverbs status: not run: the time budget is spent"; return 1; }
	run_in "$NSA" A "$t" ib_write_bw -x @GID@ -F -D 3 -p $port >"$TMP/srv.log" 2>&1 &
	srv=$!
	ns_wait_listen "$NSA" $port || { bad "softverbs status: the server never listened"; stop $srv 1; return 1; }
	run_in "$NSB" B "$t" ib_write_bw -x @GID@ -F -D 3 -p $port $ADDR_A >"$TMP/cli.log" 2>&1 &
	cli=$!
	sleep 2
	run_in "$NSA" A 10 "$SV_BUILD/bin/softverbs" status >"$TMP/status.txt" 2>&1
	wait $cli
	wait $srv
	sed 's/^/    /' "$TMP/status.txt" | grep -A3 -E '^    (UDP endpoints|QPs reached)'
	if awk '/^UDP endpoints/ {u = 1; next} u && $3 == 4791 && $4 > 0 {f = 1} /^$/ {u = 0} END {exit !f}' "$TMP/status.txt"; then
		ok "softverbs status$P_TAG: A's UDP endpoint on port 4791, with packets in"
	else
		bad "softverbs status$P_TAG: no UDP endpoint on 4791 with packets in:"; sed 's/^/    /' "$TMP/status.txt"
	fi
	if awk -v p="$peer/0x" 'index($2, p) == 1 && $4 > 0 && $5 > 0 {f = 1} END {exit !f}' "$TMP/status.txt"; then
		ok "softverbs status: A's QP, its peer $peer and its QPN, packets out and in"
	else
		bad "softverbs status: no QP with peer $peer and packets both ways"
	fi
}

# gid_of NS IP SIDE: finds SIDE's GID index (GID_SIDE) in NS's table; IP
# an IPv4 address (GID ::ffff:IP) or an IPv6 one (GID IP).
gid_of() {
	local ns=$1 ip=$2 side=$3 idx where=${1:-this namespace} gid=::ffff:$2
	case $ip in *:*) gid=$ip ;; esac
	idx=$(ns_gid_index "$ns" "$ip" "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" SOFTVERBS_LINK_LAYER=roce "${NS_ENV[@]}")
	if [ -z "$idx" ]; then
		bad "$where: no RoCE v2 GID $gid in ibv_devinfo -v"
		${ns:+ip netns exec "$ns"} env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" SOFTVERBS_LINK_LAYER=roce \
			ibv_devinfo -v 2>&1 | grep -E 'GID|active_mtu|state' | sed 's/^/    /'
		return 1
	fi
	printf -v "GID_$side" %s "$idx"
	ok "$where: $gid is GID[$idx] (RoCE v2)"
	${ns:+ip netns exec "$ns"} env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" SOFTVERBS_LINK_LAYER=roce \
		ibv_devinfo -v 2>/dev/null | grep -E 'GID\[|active_mtu' | tr -s '\t ' ' ' | sed "s/^/    $where:/"
}

# ---- run ----
for _ in $(seq 60); do [ -e "$SV_BUILD/lib/libibverbs.so.1" ] && break; sleep 1; done
[ "$NOCHECK" = 1 ] && echo "note: SV_UDP_NO_TRAFFIC_CHECK=1: the traffic is not checked; this run proves nothing about the transport"
if [ "$SV_UDP_PRIVATE" = 1 ]; then
	ip link set lo up || bad "lo does not come up in the script's network namespace"
else
	PORT=$((19600 + RANDOM % 80))
	echo "note: no network namespace of its own: the lo checks are relaxed"
fi

if [ "$SV_UDP_ROOT" = 1 ]; then
	section "hosts: two namespaces and a veth"
	ns_sweep svA svB
	HAVE_NS=1
	if ns_add "$NSA" && ns_add "$NSB" && ns_veth "$NSA" $IFA $ADDR_A/30 "$NSB" $IFB $ADDR_B/30; then
		ok "namespaces $NSA ($ADDR_A) and $NSB ($ADDR_B), joined by a veth"
	else
		bad "could not make the namespaces and their veth"
		HAVE_NS=2
	fi
	if [ $HAVE_NS = 1 ]; then
		mtu=$(ip -n "$NSA" -o link show "$IFA" | sed -nE 's/.* mtu ([0-9]+) .*/\1/p')
		routes=$(ip -n "$NSA" route; ip -n "$NSB" route)
		echo "    routes: $(echo "$routes" | tr '\n' ';')"
		[ "$(echo "$routes" | grep -c .)" -eq 2 ] || bad "a namespace has routes other than its connected /30"
		gid_of "$NSA" $ADDR_A A && gid_of "$NSB" $ADDR_B B || HAVE_NS=2
		for ns in "$NSA" "$NSB"; do
			am=$(timeout -k 2 30 ip netns exec "$ns" env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" SOFTVERBS_LINK_LAYER=roce \
				ibv_devinfo -v 2>/dev/null | sed -nE 's/.*active_mtu:[[:space:]]+([0-9]+).*/\1/p' | head -1)
			[ "${am:-0}" -gt 1024 ] &&
				echo "note: $ns: the port's active_mtu is $am, the veth's MTU $mtu: RoCEv2 packets of more than 1024 bytes' payload do not fit it (perftest takes active_mtu as its path MTU)"
		done
	fi
fi

if [ "$SV_UDP_ROOT" = 1 ] && [ $HAVE_NS = 1 ]; then
	place_hosts
	section "pingpongs between the hosts"
	for t in rc uc ud srq; do
		pingpong $t "" -c
		pingpong $t "" -e -c
	done
	xsrq ""
	xsrq "" -e
	xsrq_two

	section "perftest between the hosts"
	for t in ib_send_lat ib_write_lat ib_read_lat ib_atomic_lat; do lat $t; done
	for t in ib_send_bw ib_write_bw ib_read_bw; do bw $t "$BW_N"; done
	bw ib_atomic_bw
	status_check

	section "qperf between the hosts"
	qperf_hosts

	# IB mode: each host's LID is its veth address's host part, and every
	# run names its peer by LID alone (no GRH), as qperf's UD and UC
	# tests do.
	section "IB mode between the hosts: LIDs from the addresses (SOFTVERBS_LID=addr)"
	LINK=ib EXTRA_ENV=(SOFTVERBS_LID=addr) P_TAG=" [IB]"
	lid_of "$NSA" 1
	lid_of "$NSB" 2
	for t in rc uc ud srq; do pingpong $t "" -c; done
	lat ib_send_lat
	bw ib_write_bw "$LOSS_N"
	qperf_hosts
	LINK=roce EXTRA_ENV=() P_TAG=""

	section "faults ($FAULT) between the hosts"
	loss_pass rc srq xsrq ib_write_bw ib_read_bw ib_send_bw

	section "capture between the hosts"
	rm -f "$TMP"/cap-*.pcap
	EXTRA_ENV=("SOFTVERBS_PCAP=$TMP/cap-@SIDE@-%p.pcap")
	bw ib_write_bw "$LOSS_N" " (captured)"
	EXTRA_ENV=()
	capture_check A
	capture_check B
	rm -f "$TMP"/cap-*.pcap

	section "the wire between the hosts, cut into packets as a host without segmentation offload cuts them"
	wire_check

	# IPv6: the same veth, now also with IPv6 addresses; each host's GID
	# table lists its address after the IPv4 ones.  Every run uses the
	# two IPv6 GIDs (the pingpongs' and perftest's TCP side channel stays
	# on IPv4) and is checked on Udp6OutDatagrams: a run that went over
	# IPv4, or shared memory, fails.
	section "IPv6 between the hosts"
	if ns_ipv6 "$NSA" $IFA $ADDR6_A/64 && ns_ipv6 "$NSB" $IFB $ADDR6_B/64; then
		ok "IPv6 on the veth: $NSA $ADDR6_A, $NSB $ADDR6_B"
		echo "    $NSA: $(ip -n "$NSA" -6 -o addr show | awk '{print $2, $4}' | tr '\n' ';')"
		if gid_of "$NSA" $ADDR6_A A6 && gid_of "$NSB" $ADDR6_B B6; then
			GID_FAMILY=6 P_UDP=udp6 P_TAG=" [IPv6]"
			pingpong rc "" -c
			pingpong ud "" -c
			bw ib_write_bw "$LOSS_N"
			lat ib_read_lat
			loss_pass rc
			status_check $ADDR6_B
			rm -f "$TMP"/cap-*.pcap
			# Small, to keep tshark's time short: WRITE FIRST,
			# MIDDLE, LAST and ACKs, 64 KiB a message.
			EXTRA_ENV=("SOFTVERBS_PCAP=$TMP/cap-@SIDE@-%p.pcap")
			pair "ib_write_bw -s 65536 -n 50 (captured)" '^ 65536 +50 +[0-9.]+' 0 $((65536 * 50)) 1 1 \
				ib_write_bw -x @GID@ -F -s 65536 -n 50
			EXTRA_ENV=()
			capture_check A ipv6
			capture_check B ipv6
			rm -f "$TMP"/cap-*.pcap
			GID_FAMILY="" P_UDP=udp P_TAG=""
		fi
	else
		bad "could not give the veth ends IPv6 addresses"
	fi
elif [ "$SV_UDP_ROOT" != 1 ]; then
	echo "skipped: the two hosts: network namespaces and veths need root"
fi

section "the UDP transport on lo"
place_lo
if gid_of "" 127.0.0.1 L; then
	EXTRA_ENV=(SOFTVERBS_TRANSPORT=udp)
	pair "ibv_rc_pingpong -c (lo, SOFTVERBS_TRANSPORT=udp)" "^$PP_N iters in" $((PP_SIZE * PP_N)) \
		$((PP_SIZE * PP_N)) $PP_N $PP_N ibv_rc_pingpong -g @GID@ -s $PP_SIZE -n $PP_N -c
	bw ib_write_bw "$LOSS_N" " (lo, SOFTVERBS_TRANSPORT=udp)"
	EXTRA_ENV=()
fi
# Two users on one host: each user's processes share a registry of their
# own, so a QP of the other user is beyond reach.  Both sides must say so
# at once (the move to RTR fails), never wait out the retry budget.
section "two users on one host"
if [ "$SV_UDP_ROOT" = 1 ] && [ "$SV_UDP_PRIVATE" = 1 ] && command -v setpriv >/dev/null; then
	other=/dev/shm/softverbs-65534.n$(stat -L -c %i /proc/self/ns/net).v*.registry
	port=$((PORT++))
	timeout -k 5 30 env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" SOFTVERBS_EXPLAIN=1 ib_send_lat -n 20 -p $port \
		>"$TMP/srv.log" 2>&1 &
	srv=$!
	wait_listen $port || bad "two users: the server never listened"
	start=$SECONDS
	timeout -k 5 30 setpriv --reuid=65534 --regid=65534 --clear-groups env -u SOFTVERBS_REGISTRY \
		"LD_LIBRARY_PATH=$LD_LIBRARY_PATH" SOFTVERBS_EXPLAIN=1 ib_send_lat -n 20 -p $port 127.0.0.1 \
		>"$TMP/cli.log" 2>&1
	crc=$?
	took=$((SECONDS - start))
	wait $srv
	src=$?
	if [ $crc -ne 0 ] && [ $took -le 10 ] && case " $crc $src " in *" 124 "* | *" 137 "*) false ;; esac; then
		ok "a root server and a client of user 65534: both fail at once (client rc $crc after ${took} s, server rc $src)"
	else
		bad "a root server and a client of user 65534: client rc $crc after ${took} s, server rc $src"
	fi
	expect "the client says why" "$TMP/cli.log" "is no QP of user 65534's on this host, and user 0 runs softverbs here too"
	expect "the server says why" "$TMP/srv.log" "is no QP of user 0's on this host, and user 65534 runs softverbs here too"
	# shellcheck disable=SC2086
	rm -f $other
else
	echo "skipped: two users on one host: needs root, setpriv and the script's own network namespace"
fi

section ""
echo "time: all: $SECONDS s"
finish
