#!/bin/bash
# rdma_cm across hosts: rdmacm-utils, perftest -R and librspreload between two network
# namespaces joined by a veth (198.18.0.1/30 and 198.18.0.2/30, nothing
# else routed), the server in A, the client in B.  Their connection
# messages are CM MADs to QP1 in RoCEv2 packets (src/gsi.h): each run must
# have put traffic on the veth, and a captured run is decoded by tshark,
# which must find the CM exchange and no error.  Then the failures: REJ
# for a port nothing listens on, and a consumer's REJ with its private
# data; ADDR_ERROR for an address no host
# answers, UNREACHABLE when every MAD is lost; and a connection under 30%
# loss, which the CM's retries carry; and a kill -9 of either end, after
# which the other gets DISCONNECTED from the dead one's guard.
#
# Needs root (namespaces, veths); without it the script says so and
# passes nothing.  It runs in a network namespace of its own.
set -u
if [ -z "${SV_CMH_REEXEC:-}" ]; then
	export SV_CMH_REEXEC=1
	if [ "$(id -u)" -ne 0 ] || ! unshare -n true 2>/dev/null; then
		echo "skipped: two test hosts need root (network namespaces and a veth)"
		exit 0
	fi
	exec unshare -n bash "$0" "$@"
fi
here=$(dirname "$0")
. "$here/lib.sh"
. "$here/netns.sh"

NSA=cmA-$$ NSB=cmB-$$
ADDR_A=198.18.0.1
cleanup() {
	local p
	# shellcheck disable=SC2046
	job_kill $(jobs -p)
	ns_del "$NSA" "$NSB"
	rm -rf "$TMP"
}
ns_traps cleanup
ns_sweep cmA cmB
ip link set lo up
if ! ns_add "$NSA" || ! ns_add "$NSB" ||
	! ns_veth "$NSA" cma 198.18.0.1/30 "$NSB" cmb 198.18.0.2/30; then
	bad "the two test hosts could not be made"
	finish
	exit
fi

# on NS SECONDS CMD...: CMD in NS under softverbs in RoCE mode.
on() {
	local ns=$1 t=$2
	shift 2
	timeout -k 5 "$t" ip netns exec "$ns" env LD_LIBRARY_PATH="$LD_LIBRARY_PATH" \
		SOFTVERBS_LINK_LAYER=roce ${LD_PRELOAD:+LD_PRELOAD=$LD_PRELOAD} \
		${ASAN_OPTIONS:+ASAN_OPTIONS=$ASAN_OPTIONS} "${CM_ENV[@]}" "$@"
}
CM_ENV=()

# wait_cm NS PORT [PS]: until an rdma_cm listener in NS takes MADs for PORT
# of the port space PS (hex, TCP by default): its service ID's name (mad.c).
wait_cm() {
	local name
	name=$(printf '@softverbs-cm:svc:%016x' $(((0x${3:-0106} << 16) + $2)))
	for _ in $(seq 150); do
		ns_in "$1" awk -v n="$name" '$8 == n {f=1} END {exit !f}' /proc/net/unix &&
			return 0
		sleep 0.1
	done
	return 1
}

tx_bytes() { ns_counters "$1" "$2" | cut -d' ' -f1; }

# cm_pair WHAT PORT PATTERN "SERVER ARGS" "CLIENT ARGS": both exit 0 within
# 120 s, the client's output matches PATTERN, and both veth ends sent.
cm_pair() {
	local what=$1 port=$2 pat=$3 srv a0 b0 crc src
	a0=$(tx_bytes "$NSA" cma) b0=$(tx_bytes "$NSB" cmb)
	# shellcheck disable=SC2086
	on "$NSA" 120 $4 >"$TMP/srv.log" 2>&1 &
	srv=$!
	if ! wait_cm "$NSA" "$port" "${CM_PS:-0106}"; then
		bad "$what: the server never listened"; sed 's/^/    srv: /' "$TMP/srv.log" | tail -5
		job_kill $srv
		return 1
	fi
	# shellcheck disable=SC2086
	on "$NSB" 120 $5 >"$TMP/cli.log" 2>&1
	crc=$?
	wait $srv
	src=$?
	pair_verdict "$what" $crc $src || return 1
	local da=$(($(tx_bytes "$NSA" cma) - a0)) db=$(($(tx_bytes "$NSB" cmb) - b0))
	if ! grep -qE -- "$pat" "$TMP/cli.log" "$TMP/srv.log"; then
		bad "$what: no /$pat/ in the output"; sed 's/^/    cli: /' "$TMP/cli.log" | tail -8
	elif [ "$da" -le 0 ] || [ "$db" -le 0 ]; then
		bad "$what: the veth carried A->B $da and B->A $db bytes; both must be > 0"
	else
		ok "$what: A->B $da bytes, B->A $db bytes on the veth"
	fi
}

section "rdmacm-utils across the hosts"
cm_pair "rping -V" 7471 "ping data: rdma-ping-19" \
	"rping -s -a $ADDR_A -p 7471 -C 20 -V -v" "rping -c -a $ADDR_A -p 7471 -C 20 -V -v"
cm_pair "ucmatose, 4 connections" 7472 "^return status 0" \
	"ucmatose -b $ADDR_A -p 7472 -c 4 -C 20" "ucmatose -s $ADDR_A -p 7472 -c 4 -C 20"
# rsockets over rdma_cm and an RC QP, verified (-T v).
cm_pair "rstream -T v, 100 x 64 KiB" 7479 "^custom +64k +100 " \
	"rstream -b $ADDR_A -p 7479 -T v -S 65536 -C 100" "rstream -s $ADDR_A -p 7479 -T v -S 65536 -C 100"
# udaddy's UD port space: SIDR_REQ and SIDR_REP.
cm_pair_udp() {
	local a0 b0 srv crc src
	a0=$(tx_bytes "$NSA" cma) b0=$(tx_bytes "$NSB" cmb)
	# udaddy has no port option: 7174.
	on "$NSA" 60 udaddy -b $ADDR_A -C 20 >"$TMP/srv.log" 2>&1 &
	srv=$!
	wait_cm "$NSA" 7174 0111 || bad "udaddy: the server never listened"
	on "$NSB" 60 udaddy -s $ADDR_A -C 20 >"$TMP/cli.log" 2>&1
	crc=$?
	wait $srv
	src=$?
	pair_verdict "udaddy (SIDR)" $crc $src || return
	local da=$(($(tx_bytes "$NSA" cma) - a0)) db=$(($(tx_bytes "$NSB" cmb) - b0))
	if ! grep -q "^data transfers complete" "$TMP/cli.log"; then
		bad "udaddy: the client did not complete its transfers"
	elif [ "$da" -le 0 ] || [ "$db" -le 0 ]; then
		bad "udaddy: the veth carried A->B $da and B->A $db bytes; both must be > 0"
	else
		ok "udaddy: SIDR and 20 datagrams each way, A->B $da bytes, B->A $db bytes on the veth"
	fi
}
cm_pair_udp
# rdma_verbs.h's helpers: rdma_getaddrinfo, rdma_create_ep, rdma_post_*.
cm_pair "rdma_server/rdma_client" 7471 "^rdma_client: end 0" "rdma_server" "rdma_client -s $ADDR_A"
cm_pair "rdma_xserver/rdma_xclient RC" 7471 "^rdma_xclient: end 0" "rdma_xserver -c r" \
	"rdma_xclient -s $ADDR_A -c r"
# XRC: rdma_cm's IB port space (PS 0x3f), an XRC SRQ on the server.
CM_PS=013f cm_pair "rdma_xserver/rdma_xclient XRC" 7471 "^rdma_xclient: end 0" "rdma_xserver -c x" \
	"rdma_xclient -s $ADDR_A -c x"
# rsockets with riomap/riowrite, verified, at several sizes.
for sz in 64 65536 1048576; do
	cnt=$((sz > 65536 ? 20 : 200))
	cm_pair "riostream -T v -S $sz, $cnt transfers" 7480 "^custom +[0-9.]+[kmg]? +[0-9.]+k? +1 +" \
		"riostream -b $ADDR_A -p 7480 -T v -S $sz -C $cnt" \
		"riostream -s $ADDR_A -p 7480 -T v -S $sz -C $cnt"
done
# Datagram rsockets: udpong's server in A (it serves until it is killed),
# its client in B.  The datagrams are UD SENDs in RoCEv2 packets: the
# client's capture (SOFTVERBS_PCAP) must hold one UD SEND from B for every
# datagram it sent but the first, which goes by the kernel UDP socket
# while B does not know A's QP.  The veth's 1500 bytes give a path MTU of
# 1024, so 1012 bytes is the largest datagram, and 2000 is EMSGSIZE.
# wait_udp NS ADDR:PORT: until a UDP socket in NS is bound there.
wait_udp() {
	for _ in $(seq 150); do
		ns_in "$1" ss -Huln 2>/dev/null | grep -q " $2 " && return 0
		sleep 0.1
	done
	return 1
}
# udpong_hosts WHAT "CLIENT ARGS" PATTERN [SENT]: SENT datagrams (the
# client's count) must each have left B as a UD SEND in RoCEv2.
udpong_hosts() {
	local what=$1 args=$2 pat=$3 sent=${4:-0} srv crc a0 b0 da db cap n
	a0=$(tx_bytes "$NSA" cma) b0=$(tx_bytes "$NSB" cmb)
	on "$NSA" 120 stdbuf -oL udpong -b $ADDR_A -p 7490 >"$TMP/srv.log" 2>&1 &
	srv=$!
	if ! wait_udp "$NSA" "$ADDR_A:7490"; then
		bad "$what: the server never bound its port"; job_kill $srv
		return 1
	fi
	rm -f "$TMP"/ud-*.pcap
	CM_ENV=(SOFTVERBS_PCAP="$TMP/ud-%p.pcap")
	# shellcheck disable=SC2086
	on "$NSB" 120 udpong -s $ADDR_A -p 7490 $args >"$TMP/cli.log" 2>&1
	crc=$?
	CM_ENV=()
	job_kill $srv
	da=$(($(tx_bytes "$NSA" cma) - a0)) db=$(($(tx_bytes "$NSB" cmb) - b0))
	if [ $crc -ne 0 ]; then
		bad "$what: client rc $crc"; sed 's/^/    cli: /' "$TMP/cli.log" | tail -5
		return 1
	fi
	if ! grep -qE -- "$pat" "$TMP/cli.log"; then
		bad "$what: no /$pat/ in the output"; sed 's/^/    cli: /' "$TMP/cli.log" | tail -5
		return 1
	fi
	if ! grep -q "^client login from 198\.18\.0\.2$" "$TMP/srv.log"; then
		bad "$what: the server did not name the client's address"
		sed 's/^/    srv: /' "$TMP/srv.log" | tail -3
		return 1
	fi
	if [ "$da" -le 0 ] || [ "$db" -le 0 ]; then
		bad "$what: the veth carried A->B $da and B->A $db bytes; both must be > 0"
		return 1
	fi
	if [ "$sent" -gt 0 ]; then
		for cap in "$TMP"/ud-*.pcap; do break; done
		if ! command -v tshark >/dev/null; then
			echo "skipped: $what: counting UD SENDs: tshark is not installed"
		elif [ ! -e "$cap" ]; then
			bad "$what: no RoCEv2 packet left the client (it wrote no capture)"
			return 1
		else
			# BTH opcode 100: UD SEND Only.
			n=$(tshark -r "$cap" -Y "infiniband.bth.opcode == 100 && ip.src == 198.18.0.2" \
				2>/dev/null | wc -l)
			if [ "$n" -lt "$sent" ]; then
				bad "$what: $n UD SENDs left B in RoCEv2, fewer than the $sent datagrams"
				return 1
			fi
			ok "$what: $n UD SENDs in RoCEv2 from B; A->B $da bytes, B->A $db bytes on the veth"
			return 0
		fi
	fi
	ok "$what: A->B $da bytes, B->A $db bytes on the veth"
}
# One way: 1000 datagrams, then the server's count (not 0).
udpong_hosts "udpong -C 1000 -S 1000, one way" "-C 1000 -S 1000" "^custom +1000 +[1-9][0-9.]*k? +" 1000
# Echo: every datagram comes back (2 x 300 transfers).
udpong_hosts "udpong -T e -C 300 -S 1012, echo" "-T e -C 300 -S 1012" "^custom +1012 +600 +" 300
udpong_hosts "udpong -T a -T b -T e -C 300 -S 64, rpoll, blocking, echo" "-T a -T b -T e -C 300 -S 64" \
	"^custom +64 +600 +" 300
udpong_hosts "udpong -S 2000 across a 1500-byte veth: EMSGSIZE" "-C 10 -S 2000" \
	"^rsend: Message too long"

# rcopy of a file: the server (which serves until killed) in A writes
# where the client in B names; the copy must equal the file byte for byte.
head -c 3000017 /dev/urandom >"$TMP/src.bin"
rm -f "$TMP/dst.bin"
on "$NSA" 60 sh -c "cd '$TMP' && exec rcopy" >"$TMP/srv.log" 2>&1 &
srv=$!
if wait_cm "$NSA" 7427; then
	on "$NSB" 60 rcopy "$TMP/src.bin" "$ADDR_A:$TMP/dst.bin" >"$TMP/cli.log" 2>&1
	rrc=$?
	for _ in $(seq 50); do grep -q "closing...done" "$TMP/srv.log" && break; sleep 0.1; done
	if [ $rrc -eq 0 ] && cmp -s "$TMP/src.bin" "$TMP/dst.bin"; then
		ok "rcopy: 3000017 bytes from host B to host A, the copy equal byte for byte"
	else
		bad "rcopy (rc $rrc)"; tail -3 "$TMP/cli.log" "$TMP/srv.log"
	fi
else
	bad "rcopy: the server never listened"
fi
job_kill $srv

# librspreload: a plain TCP program (tcp_echo) on rsockets across the
# hosts.  No kernel TCP socket of A listens on its port, and its 8 MiB
# cross the veth as RoCEv2.
preload=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
preload_hosts() {
	local a0 b0 srv crc src da db tcp
	a0=$(tx_bytes "$NSA" cma) b0=$(tx_bytes "$NSB" cmb)
	on "$NSA" 60 env LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD }$preload" \
		"$SV_BUILD/bin/tcp_echo" server 7601 $ADDR_A >"$TMP/srv.log" 2>&1 &
	srv=$!
	if ! wait_cm "$NSA" 7601; then
		bad "librspreload: the server never listened on an rdma_cm port"
		sed 's/^/    srv: /' "$TMP/srv.log" | tail -5
		job_kill $srv
		return
	fi
	# A listening kernel socket on 7601 would be state 0A at :1DB1.
	tcp=$(ns_in "$NSA" awk '$2 ~ /:1DB1$/ && $4 == "0A"' /proc/net/tcp | wc -l)
	on "$NSB" 60 env LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD }$preload" \
		"$SV_BUILD/bin/tcp_echo" client 7601 $((8 << 20)) $ADDR_A >"$TMP/cli.log" 2>&1
	crc=$?
	wait $srv
	src=$?
	da=$(($(tx_bytes "$NSA" cma) - a0)) db=$(($(tx_bytes "$NSB" cmb) - b0))
	if ! echo_verdict "librspreload" $crc $src; then
		:
	elif [ "$tcp" -ne 0 ]; then
		bad "librspreload: a kernel TCP socket of A listens on 7601"
	elif [ $db -lt $((8 << 20)) ] || [ $da -le 0 ]; then
		bad "librspreload: the veth carried A->B $da and B->A $db bytes; 8 MiB B->A wanted"
	else
		ok "librspreload: tcp_echo's 8 MiB from B to A over rsockets, no kernel TCP listener, A->B $da bytes, B->A $db bytes on the veth"
	fi
}
preload_hosts

# The same in librspreload's fork mode (RDMAV_FORK_SAFE=1): A accepts on a
# kernel TCP socket and forks; the child's first read moves the connection
# to an rsocket, whose RC QP then carries the 8 MiB across the veth.
preload_fork_hosts() {
	local b0 srv crc src db
	b0=$(tx_bytes "$NSB" cmb)
	: >"$TMP/srv.log"
	on "$NSA" 60 env LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD }$preload" RDMAV_FORK_SAFE=1 \
		SOFTVERBS_LOG=debug "$SV_BUILD/bin/tcp_echo" fork-server 7602 $ADDR_A >"$TMP/srv.log" 2>&1 &
	srv=$!
	for _ in $(seq 150); do
		ns_in "$NSA" awk '$2 ~ /:1DB2$/ && $4 == "0A" {f=1} END {exit !f}' /proc/net/tcp && break
		sleep 0.1
	done
	on "$NSB" 60 env LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD }$preload" RDMAV_FORK_SAFE=1 \
		"$SV_BUILD/bin/tcp_echo" client 7602 $((8 << 20)) $ADDR_A >"$TMP/cli.log" 2>&1
	crc=$?
	wait $srv
	src=$?
	db=$(($(tx_bytes "$NSB" cmb) - b0))
	fork_verdict "librspreload, fork mode" $crc $src \
		"a forking TCP server's child in A took 8 MiB over rsockets, B->A $db bytes on the veth"
}
preload_fork_hosts

# mckey: UD multicast.  Two receivers in A and one in B join 239.1.2.3,
# then a sender in B sends 20 messages to the group: its one packet per
# message crosses the veth to the IPv4 group, and each member gets it,
# those of B from the registry.
mckey_hosts() {
	local r1 r2 r3 src a0
	rm -f "$TMP"/mc*.log
	a0=$(tx_bytes "$NSB" cmb)
	on "$NSA" 60 mckey -m 239.1.2.3 -b $ADDR_A -C 20 >"$TMP/mc1.log" 2>&1 &
	r1=$!
	on "$NSA" 60 mckey -m 239.1.2.3 -b $ADDR_A -C 20 >"$TMP/mc2.log" 2>&1 &
	r2=$!
	on "$NSB" 60 mckey -m 239.1.2.3 -b 198.18.0.2 -C 20 >"$TMP/mc3.log" 2>&1 &
	r3=$!
	for _ in $(seq 100); do
		[ "$(cat "$TMP"/mc[123].log 2>/dev/null | grep -c "receiving data transfers")" -eq 3 ] &&
			break
		sleep 0.1
	done
	on "$NSB" 60 mckey -m 239.1.2.3 -b 198.18.0.2 -s -C 20 >"$TMP/mcs.log" 2>&1
	src=$?
	local rcs=""
	for p in $r1 $r2 $r3; do wait "$p"; rcs="$rcs $?"; done
	local db=$(($(tx_bytes "$NSB" cmb) - a0)) done=0
	for f in "$TMP"/mc[123].log; do grep -q "^test complete" "$f" && done=$((done + 1)); done
	if [ $src -eq 0 ] && [ "$rcs" = " 0 0 0" ] && [ $done -eq 3 ] && [ $db -gt 0 ]; then
		ok "mckey: 20 messages from B to 239.1.2.3 received by 2 members in A and 1 in B ($db bytes left B)"
	else
		bad "mckey: sender rc $src, receivers rc$rcs, $done of 3 complete, $db bytes left B"
		tail -3 "$TMP"/mc*.log | sed 's/^/    /'
	fi
}
mckey_hosts

section "perftest -R across the hosts"
for t in ib_send_lat ib_write_lat ib_read_lat; do
	cm_pair "$t -R" 18515 "^ 2 +1000 " "$t -R -p 18515" "$t -R -p 18515 $ADDR_A"
done
cm_pair "ib_write_bw -R -a" 18516 "^ 8388608 +5 " "ib_write_bw -R -a -n 5 -p 18516" \
	"ib_write_bw -R -a -n 5 -p 18516 $ADDR_A"

section "the CM exchange on the wire"
rm -f "$TMP"/cap-*.pcap
CM_ENV=(SOFTVERBS_PCAP="$TMP/cap-%p.pcap")
cm_pair "rping -V, captured" 7474 "ping data: rdma-ping-4" \
	"rping -s -a $ADDR_A -p 7474 -C 5 -V -v" "rping -c -a $ADDR_A -p 7474 -C 5 -V -v"
CM_ENV=()
caps=$(ls "$TMP"/cap-*.pcap 2>/dev/null)
if ! command -v tshark >/dev/null; then
	echo "skipped: the capture: tshark is not installed"
elif [ "$(echo "$caps" | wc -w)" -ne 2 ]; then
	bad "capture: $(echo "$caps" | wc -w) files, not the two sides' ($TMP/cap-PID.pcap)"
else
	# Each side's capture has what it sent and received while it ran; the
	# client may exit before the DREP to its DREQ comes, so the
	# disconnection is looked for in the two together.
	cat /dev/null >"$TMP/cap.txt"
	for f in $caps; do
		tshark -r "$f" 2>/dev/null >"$TMP/cap1.txt"
		cat "$TMP/cap1.txt" >>"$TMP/cap.txt"
		flagged=$(tshark -r "$f" -Y '_ws.malformed || _ws.expert.severity == error' \
			-T fields -e frame.number 2>/dev/null | wc -l)
		missing=""
		for m in ConnectRequest ConnectReply ReadyToUse; do
			grep -q "CM: $m" "$TMP/cap1.txt" || missing="$missing $m"
		done
		if [ -n "$missing" ]; then
			bad "capture $(basename "$f"): tshark finds no CM$missing"
			head -5 "$TMP/cap1.txt" | sed 's/^/    /'
		elif [ "$flagged" -ne 0 ]; then
			bad "capture $(basename "$f"): tshark flags $flagged frames malformed or in error"
		# The REQ, not the first frame: the guard of a process of an
		# earlier test that exited with connections open may still be
		# repeating its DREQs, which this host answers (DREP).
		elif ! tshark -r "$f" -V -Y 'infiniband.mad.attributeid == 0x0010' 2>/dev/null \
			>"$TMP/capv.txt" ||
			! grep -qE "Destination Queue Pair: 0x000001" "$TMP/capv.txt" ||
			! grep -qE "Queue Key: 0x0*80010000" "$TMP/capv.txt" ||
			! grep -qE "Destination Port: 0x1d32" "$TMP/capv.txt" ||
			! grep -qE "IP CM IP Version: 0x4" "$TMP/capv.txt"; then
			bad "capture $(basename "$f"): no REQ that is a GSI MAD to QP1 (Q_Key 0x80010000) with rdma_cm's service ID for port 7474 and IP header"
			head -3 "$TMP/cap1.txt" | sed 's/^/    /'
		else
			ok "capture $(basename "$f"): $(grep -c 'CM: ' "$TMP/cap1.txt") CM MADs to QP1 decoded by tshark, the REQ with rdma_cm's service ID and IP header, no error"
		fi
	done
	for m in DisconnectRequest DisconnectReply; do
		expect "capture: the disconnection's $m" "$TMP/cap.txt" "CM: $m"
	done
fi

section "failures across the hosts"
# REJ, reason 8: a softverbs process of the other host answers for a
# service nobody holds (engine/gsi.c, as ib_cm's cm_req_handler does).
# A host with no softverbs process at all is a host without RDMA: its
# kernel drops the REQ, and the CM's retries end in UNREACHABLE.
on "$NSA" 30 rping -s -a $ADDR_A -p 7477 -C 1 >"$TMP/srv.log" 2>&1 &
srv=$!
wait_cm "$NSA" 7477
on "$NSB" 30 env SOFTVERBS_EXPLAIN=1 SOFTVERBS_CM_TIMEOUT=16 rping -c -a $ADDR_A -p 7999 -C 1 \
	>"$TMP/cli.log" 2>&1
job_kill $srv
expect "rping to a port nothing listens on in the other host: REJECTED, status 8" "$TMP/cli.log" \
	"RDMA_CM_EVENT_REJECTED: status 8: .*198\.18\.0\.1:7999"
# REJECTED with the rejecter's private data, in the REJ MAD (test_rdmacm's
# cross-host modes: the REQ's private data checked by the server, the REJ's
# by the client).
on "$NSA" 30 "$SV_BUILD/bin/test_rdmacm" --reject-server $ADDR_A 7478 >"$TMP/srv.log" 2>&1 &
srv=$!
wait_cm "$NSA" 7478
on "$NSB" 30 "$SV_BUILD/bin/test_rdmacm" --reject-client $ADDR_A 7478 >"$TMP/cli.log" 2>&1
crc=$?
wait $srv
src=$?
if [ $crc -eq 0 ] && [ $src -eq 0 ]; then
	ok "REQ and REJ private data across the hosts: $(cat "$TMP/cli.log")"
else
	bad "REJECTED with private data: client rc $crc, server rc $src"
	cat "$TMP/srv.log" "$TMP/cli.log" | sed 's/^/    /'
fi
on "$NSB" 30 env SOFTVERBS_EXPLAIN=1 rping -c -a 10.99.0.1 -p 7999 -C 1 >"$TMP/cli.log" 2>&1
expect "rping to an address with no route: ADDR_ERROR, explained" "$TMP/cli.log" \
	"RDMA_CM_EVENT_ADDR_ERROR: status -113: .*no host answers"
# Every MAD lost: 4 tries of 4096 ns x 2^12 (17 ms) each, then UNREACHABLE.
on "$NSA" 30 rping -s -a $ADDR_A -p 7475 -C 1 >"$TMP/srv.log" 2>&1 &
srv=$!
wait_cm "$NSA" 7475
t0=$(date +%s%N)
on "$NSB" 30 env SOFTVERBS_FAULT=drop=1,seed=1 SOFTVERBS_CM_TIMEOUT=12 SOFTVERBS_CM_RETRIES=3 \
	rping -c -a $ADDR_A -p 7475 -C 1 >"$TMP/cli.log" 2>&1
ms=$((($(date +%s%N) - t0) / 1000000))
job_kill $srv
if grep -q "RDMA_CM_EVENT_UNREACHABLE, error -110" "$TMP/cli.log" && [ $ms -lt 10000 ]; then
	ok "every MAD lost: UNREACHABLE, ETIMEDOUT, after $ms ms (4 tries x 17 ms)"
else
	bad "every MAD lost: no UNREACHABLE -110 within 10 s ($ms ms)"; sed 's/^/    /' "$TMP/cli.log" | tail -5
fi
# cmtime_hosts WHAT N: cmtime's client in B sets up and tears down N
# connections with the server in A (which serves until it is killed).
cmtime_hosts() {
	local srv
	on "$NSA" 120 cmtime -b $ADDR_A -p 7478 >"$TMP/srv.log" 2>&1 &
	srv=$!
	wait_cm "$NSA" 7478
	if on "$NSB" 100 cmtime -s $ADDR_A -p 7478 -c "$2" >"$TMP/cli.log" 2>&1; then
		expect "$1" "$TMP/cli.log" "^disconnect +:"
	else
		bad "$1: cmtime -c $2 failed"; tail -5 "$TMP/cli.log" "$TMP/srv.log"
	fi
	job_kill $srv
}
cmtime_hosts "cmtime: 50 connections set up and torn down across the hosts" 50
# 30% of every side's packets lost, MADs too: each REQ, REP, RTU, DREQ and
# DREP may need several tries (4096 ns x 2^14, 67 ms each); a DREQ whose
# DREP was lost after its id went is answered by the host (engine/gsi.c).
CM_ENV=(SOFTVERBS_FAULT=drop=0.3,seed=$RANDOM SOFTVERBS_CM_TIMEOUT=14)
echo "note: ${CM_ENV[0]}"
cmtime_hosts "cmtime with 30% loss on both sides: 10 connections set up and torn down" 10
CM_ENV=()

# kill -9 of one end mid-stream: its guard (core/guard.h) sends the DREQ
# the kernel's ib_cm would send for a dying process, and the survivor gets
# DISCONNECTED at once, where it would otherwise wait out its QP's
# retries.  rping takes DISCONNECTED mid-ping as the end and exits 0.
peer_killed() {
	local victim=$1 srv cli j pid rc t0 ms survivor
	: >"$TMP/srv.log"
	: >"$TMP/cli.log"
	on "$NSA" 60 rping -s -a $ADDR_A -p 7480 -v -C 100000 >"$TMP/srv.log" 2>&1 &
	srv=$!
	wait_cm "$NSA" 7480 || bad "rping $victim killed: the server never listened"
	on "$NSB" 60 rping -c -a $ADDR_A -p 7480 -v -C 100000 >"$TMP/cli.log" 2>&1 &
	cli=$!
	for _ in $(seq 200); do grep -q "rdma-ping-20:" "$TMP/cli.log" && break; sleep 0.05; done
	j=$cli survivor=srv
	[ "$victim" = server ] && j=$srv survivor=cli
	pid=""
	for p in $(job_tree $j); do
		[ "$(cat /proc/$p/comm 2>/dev/null)" = rping ] && pid=$p
	done
	if [ -z "$pid" ] || ! grep -q "rdma-ping-20:" "$TMP/cli.log"; then
		bad "rping, $victim killed: no 20 pings to kill it after"
		job_kill $srv $cli
		return
	fi
	t0=$(date +%s%N)
	kill -9 "$pid"
	if [ "$victim" = server ]; then wait $cli; else wait $srv; fi
	rc=$?
	ms=$((($(date +%s%N) - t0) / 1000000))
	job_kill $srv $cli
	# rping's CM and CQ threads both write its cb->state, unordered: a
	# completion of what the victim sent just before it died, handled
	# after the DISCONNECTED, overwrites that state, and rping returns -1
	# having printed "wait for STEP state N" with N a ping step (6 to 10,
	# not ERROR 11), as it can on any RDMA device.  An error completion
	# (ERROR, "cq completion failed") or no DISCONNECTED fails.
	local log=$TMP/$survivor.log
	if [ $ms -lt 5000 ] && grep -q "DISCONNECT EVENT" "$log" && ! grep -q "completion failed" "$log" &&
		{ [ $rc -eq 0 ] || { [ $rc -eq 255 ] && grep -q "wait for [A-Z_]* state \([6-9]\|10\)$" "$log"; }; }; then
		local how="exited 0"
		[ $rc -eq 0 ] || how="exited 255 from rping's state race ($(grep -o "wait for [A-Z_]* state [0-9]*" "$log"))"
		ok "kill -9 of the $victim's rping: the other end got DISCONNECTED and $how after $ms ms"
	else
		bad "kill -9 of the $victim's rping: the other end exited $rc after $ms ms (DISCONNECTED within 5 s wanted)"
		grep -v "ping data: rdma-ping-[0-9]*: [^ ]*$" "$log" | tail -5 | sed 's/^/    /'
	fi
}
peer_killed server
peer_killed client
section ""
finish
