#!/bin/bash
# rdmacm-utils, perftest -R and librspreload on softverbs' librdmacm.so.1,
# server and client as two processes of one host.  The script runs in a network
# namespace of its own (a host with only lo), so its rdma_cm ports cannot
# meet those of any other test: the port space is the namespace's.
. "$(dirname "$0")/lib.sh"
if [ -z "${SV_RDMACM_NETNS:-}" ]; then
	export SV_RDMACM_NETNS=1
	if [ "$(id -u)" -eq 0 ]; then
		exec unshare -n bash "$0" "$@"
	fi
	exec unshare -rn bash "$0" "$@"
fi
ip link set lo up || { echo "FAIL: lo does not come up in the test's network namespace"; exit 1; }
lib=$(readlink -f "$SV_BUILD/lib/librdmacm.so.1")

# Every Debian consumer of librdmacm binds ours.
for f in /usr/bin/rping /usr/bin/ucmatose /usr/bin/udaddy /usr/bin/mckey /usr/bin/cmtime \
	/usr/bin/rdma_server /usr/bin/rdma_client /usr/bin/rdma_xserver /usr/bin/rdma_xclient \
	/usr/bin/ib_send_lat /usr/bin/ib_write_bw /usr/bin/qperf; do
	out=$(ldd -r "$f" 2>&1)
	bound=$(echo "$out" | awk '/librdmacm.so.1 =>/ {print $3}')
	if [ "$(readlink -f "$bound")" != "$lib" ]; then
		bad "$f binds ${bound:-no librdmacm}, not softverbs'"
	elif echo "$out" | grep -qE "undefined symbol|no version information"; then
		bad "$f: $(echo "$out" | grep -E 'undefined symbol|no version information' | head -2)"
	else
		ok "$f binds softverbs' librdmacm.so.1"
	fi
done

# wait_cm PORT [PS]: until an rdma_cm id listens on PORT of the port
# space (hex, TCP by default): its abstract socket, listening.  The name
# is taken at rdma_bind_addr, before rdma_listen, and a REQ in between is
# refused (REJ, invalid service ID) as rdma_cm refuses it: only the
# Flags column's __SO_ACCEPTCON (00010000) says listen() was called.
wait_cm() {
	local name="@softverbs-rdmacm:${2:-0106}:$1"
	for _ in $(seq 150); do
		awk -v n="$name" '$8 == n && $4 == "00010000" {f=1} END {exit !f}' /proc/net/unix && return 0
		sleep 0.1
	done
	return 1
}

# cm_pair WHAT PORT PS "SERVER CMD" "CLIENT CMD": both must exit 0.
# With CM_RELISTEN=1 the pair is perftest's: its -R server listens on the
# port for the handshake, closes that listener, and listens again for the
# test's own connection while the client is already resolving and
# connecting -- nothing orders the two.  A client that wins that race is
# rejected exactly as rdma_cm does it (REJ, invalid service ID: status 8),
# and the server waits for a connection that never comes.  That rejection,
# and only it, is retried (at most 3 runs), and said so.
cm_pair() {
	local what=$1 port=$2 ps=$3 srvcmd=$4 clicmd=$5 run
	for run in 1 2 3; do
		# shellcheck disable=SC2086
		timeout -k 5 120 $srvcmd >"$TMP/srv.log" 2>&1 &
		local srv=$!
		if ! wait_cm "$port" "$ps"; then
			bad "$what: the server never listened"; kill $srv 2>/dev/null; wait $srv 2>/dev/null
			sed 's/^/    srv: /' "$TMP/srv.log" | tail -5
			return 1
		fi
		# shellcheck disable=SC2086
		timeout -k 5 120 $clicmd >"$TMP/cli.log" 2>&1
		local crc=$?
		if [ $crc -ne 0 ] && [ "${CM_RELISTEN:-0}" = 1 ] && [ $run -lt 3 ] &&
			grep -q "Event: RDMA_CM_EVENT_REJECTED; error: 8\." "$TMP/cli.log"; then
			echo "    $what: run $run: the client connected before the server's second listen (perftest's race); again"
			kill $srv 2>/dev/null
			wait $srv 2>/dev/null
			continue
		fi
		wait $srv
		pair_verdict "$what" $crc $?
		return
	done
}

for ll in ib roce; do
	export SOFTVERBS_LINK_LAYER=$ll
	cm_pair "rping -V, 20 pings ($ll)" 7174 0106 "rping -s -a 127.0.0.1 -C 20 -V" \
		"rping -c -a 127.0.0.1 -C 20 -V -v" &&
		expect "rping: the 20th ping's data came back ($ll)" "$TMP/cli.log" "ping data: rdma-ping-19: "
	cm_pair "ucmatose, 8 connections x 50 messages ($ll)" 7471 0106 "ucmatose -c 8 -C 50" \
		"ucmatose -s 127.0.0.1 -c 8 -C 50" &&
		expect "ucmatose: every transfer ($ll)" "$TMP/cli.log" "^return status 0"
	cm_pair "udaddy, 4 UD endpoints ($ll)" 7174 0111 "udaddy -c 4 -C 20" \
		"udaddy -s 127.0.0.1 -c 4 -C 20" &&
		expect "udaddy: every transfer ($ll)" "$TMP/srv.log" "^return status 0"
	# mckey: the receivers join first, then a sender sends to the group.
	timeout -k 5 60 mckey -m 239.1.2.3 -C 20 >"$TMP/mc.log" 2>&1 &
	mc=$!
	for _ in $(seq 50); do grep -q "receiving data transfers" "$TMP/mc.log" && break; sleep 0.1; done
	timeout -k 5 60 mckey -m 239.1.2.3 -s -C 20 >"$TMP/mcs.log" 2>&1
	src=$?
	wait $mc
	mrc=$?
	if [ $src -eq 0 ] && [ $mrc -eq 0 ] && grep -q "^test complete" "$TMP/mc.log"; then
		ok "mckey: 20 messages to 239.1.2.3 received ($ll)"
	else
		bad "mckey ($ll): sender rc $src, receiver rc $mrc"
		tail -5 "$TMP/mc.log" "$TMP/mcs.log"
	fi
	cm_pair "rdma_server/rdma_client ($ll)" 7471 0106 "rdma_server" "rdma_client -s 127.0.0.1"
	cm_pair "rdma_xserver/rdma_xclient RC ($ll)" 7471 0106 "rdma_xserver -c r" \
		"rdma_xclient -s 127.0.0.1 -c r"
	cm_pair "rdma_xserver/rdma_xclient XRC ($ll)" 7471 013f "rdma_xserver -c x" \
		"rdma_xclient -s 127.0.0.1 -c x"
done
export SOFTVERBS_LINK_LAYER=roce

# cmtime's server serves until it is killed; the client times every step.
timeout -k 5 120 cmtime -p 7500 >"$TMP/srv.log" 2>&1 &
srv=$!
if wait_cm 7500; then
	"$SV_BUILD/bin/softverbs" status >"$TMP/status" 2>&1
	expect "softverbs status lists the listening rdma_cm port" "$TMP/status" "^TCP +7500 +listening +0"
fi
if timeout -k 5 120 cmtime -s 127.0.0.1 -p 7500 -c 100 >"$TMP/cli.log" 2>&1; then
	expect "cmtime: 100 connections set up and torn down" "$TMP/cli.log" "^disconnect +:"
else
	bad "cmtime -c 100"; tail -5 "$TMP/cli.log" "$TMP/srv.log"
fi
kill $srv 2>/dev/null
wait $srv 2>/dev/null

# perftest through rdma_cm (-R).
for t in ib_send_lat ib_write_lat ib_read_lat; do
	CM_RELISTEN=1 cm_pair "$t -R" 18515 0106 "$t -R -n 2000" "$t -R -n 2000 127.0.0.1" &&
		expect "$t -R: a latency line" "$TMP/cli.log" "^ 2 +2000 "
done
CM_RELISTEN=1 cm_pair "ib_write_bw -R -a" 18515 0106 "ib_write_bw -R -a -n 200" \
	"ib_write_bw -R -a -n 200 127.0.0.1" &&
	expect "ib_write_bw -R -a: up to 8 MiB" "$TMP/cli.log" "^ 8388608 +200 "

# rsockets: rstream (blocking, then non-blocking with rpoll) and riostream
# (riomap/riowrite) at several sizes with the data verified, and rcopy of
# a file.
for sz in 64 4096 65536 1048576; do
	cnt=$((sz > 65536 ? 50 : 2000))
	cm_pair "rstream -T v -S $sz" 7471 0106 "rstream -T v -S $sz -C $cnt" \
		"rstream -s 127.0.0.1 -T v -S $sz -C $cnt" &&
		expect "rstream -T v -S $sz: $cnt transfers" "$TMP/cli.log" "^custom +[0-9.]+[kmg]? +[0-9.]+k? +1 +"
	cm_pair "riostream -T v -S $sz" 7471 0106 "riostream -T v -S $sz -C $cnt" \
		"riostream -s 127.0.0.1 -T v -S $sz -C $cnt" &&
		expect "riostream -T v -S $sz: $cnt transfers" "$TMP/cli.log" "^custom +[0-9.]+[kmg]? +[0-9.]+k? +1 +"
done
for sz in 4096 1048576; do
	cm_pair "rstream -T a -S $sz (non-blocking, rpoll)" 7471 0106 "rstream -T a -S $sz -C 50" \
		"rstream -s 127.0.0.1 -T a -S $sz -C 50" &&
		expect "rstream -T a -S $sz: 50 transfers" "$TMP/cli.log" "^custom +[0-9.]+[kmg]? +50 +1 +"
done
head -c 3000017 /dev/urandom >"$TMP/src.bin"
(cd "$TMP" && timeout -k 5 60 rcopy >"$TMP/srv.log" 2>&1) &
rc_srv=$!
if wait_cm 7427; then
	timeout -k 5 60 rcopy "$TMP/src.bin" "127.0.0.1:$TMP/dst.bin" >"$TMP/cli.log" 2>&1
	rrc=$?
	for _ in $(seq 50); do grep -q "closing...done" "$TMP/srv.log" && break; sleep 0.1; done
	if [ $rrc -eq 0 ] && cmp -s "$TMP/src.bin" "$TMP/dst.bin"; then
		ok "rcopy: 3000017 bytes, the copy equal byte for byte"
	else
		bad "rcopy (rc $rrc)"; tail -3 "$TMP/cli.log" "$TMP/srv.log"
	fi
else
	bad "rcopy: the server never listened"
fi
kill $rc_srv 2>/dev/null
wait $rc_srv 2>/dev/null

# Datagram rsockets (rsocket_dgram.c): udpong's server and client, in each
# of udpong's modes: non-blocking (its default), blocking (-T b), rpoll
# (-T a), and echo (-T e: every datagram comes back, and the client resends
# what a millisecond does not answer).  The server serves until it is
# killed; its first line names the client's address, the source of the
# client's first datagram.  A one-way run prints how many datagrams the
# server counted, which must not be 0 (UDP may lose some; none is not
# loss); an echo run, 2 x the round trips.
wait_udp() {
	local hex
	hex=$(printf ':%04X ' "$1")
	for _ in $(seq 150); do
		grep -q "$hex" /proc/net/udp 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}
udpong_pair() {
	local what=$1 args=$2 pat=$3 srv crc
	timeout 120 stdbuf -oL udpong -b 127.0.0.1 -p 7174 >"$TMP/srv.log" 2>&1 &
	srv=$!
	if ! wait_udp 7174; then
		bad "$what: the server never bound its port"; kill $srv 2>/dev/null; wait $srv 2>/dev/null
		sed 's/^/    srv: /' "$TMP/srv.log" | tail -5
		return 1
	fi
	# shellcheck disable=SC2086
	timeout 120 udpong -s 127.0.0.1 -p 7174 $args >"$TMP/cli.log" 2>&1
	crc=$?
	kill $srv 2>/dev/null
	wait $srv 2>/dev/null
	if [ $crc -ne 0 ]; then
		bad "$what: client rc $crc"; sed 's/^/    cli: /' "$TMP/cli.log" | tail -5
		return 1
	fi
	expect "$what" "$TMP/cli.log" "$pat"
	expect "$what: the server named the client's address" "$TMP/srv.log" \
		"^client login from 127\.0\.0\.1$"
}
for ll in ib roce; do
	export SOFTVERBS_LINK_LAYER=$ll
	udpong_pair "udpong -C 2000 -S 1000, non-blocking ($ll)" "-C 2000 -S 1000" \
		"^custom +1000 +[1-9][0-9.]*k? +"
	udpong_pair "udpong -T b -C 2000 -S 2000, blocking ($ll)" "-T b -C 2000 -S 2000" \
		"^custom +1\.9k +[1-9][0-9.]*k? +"
	udpong_pair "udpong -T e -C 500 -S 2048, echo ($ll)" "-T e -C 500 -S 2048" "^custom +2k +1k +"
	udpong_pair "udpong -T a -T e -C 500 -S 64, rpoll and echo ($ll)" "-T a -T e -C 500 -S 64" \
		"^custom +64 +1k +"
	udpong_pair "udpong -T b -T e -C 500 -S 1000, blocking echo ($ll)" "-T b -T e -C 500 -S 1000" \
		"^custom +1000 +1k +"
done
export SOFTVERBS_LINK_LAYER=roce

# librspreload: a plain TCP program on rsockets.  While its server
# listens, the port is an rdma_cm port and no kernel TCP socket listens.
preload=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD }$preload" timeout -k 5 60 "$SV_BUILD/bin/tcp_echo" server 7600 \
	>"$TMP/srv.log" 2>&1 &
srv=$!
if wait_cm 7600; then
	if ss -tln 2>/dev/null | grep -q ":7600 "; then
		bad "librspreload: a kernel TCP socket listens on 7600"
	else
		ok "librspreload: the server's port is an rdma_cm port, not a kernel TCP one"
	fi
	LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD }$preload" timeout -k 5 60 "$SV_BUILD/bin/tcp_echo" \
		client 7600 $((8 << 20)) >"$TMP/cli.log" 2>&1
	crc=$?
	wait $srv
	src=$?
	if [ $crc -eq 0 ] && [ $src -eq 0 ]; then
		expect "librspreload: 8 MiB through a plain TCP client and server" "$TMP/cli.log" \
			"^client: 8388608 [0-9]+ \(match\)"
	else
		bad "librspreload: client rc $crc, server rc $src"; tail -3 "$TMP/cli.log" "$TMP/srv.log"
	fi
else
	bad "librspreload: the server never listened on an rdma_cm port"
	sed 's/^/    srv: /' "$TMP/srv.log" | tail -5
	kill $srv 2>/dev/null
	wait $srv 2>/dev/null
fi

# librspreload's fork support (RDMAV_FORK_SAFE=1): the server accepts on a
# kernel TCP socket, forks, and its child's first read moves the
# connection to an rsocket (the preload's fork_passive, with
# fork_active in the client), so the RC QP is the child's.
LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD }$preload" RDMAV_FORK_SAFE=1 SOFTVERBS_LOG=debug \
	timeout -k 5 60 "$SV_BUILD/bin/tcp_echo" fork-server 7602 >"$TMP/srv.log" 2>&1 &
srv=$!
if wait_listen 7602; then
	LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD }$preload" RDMAV_FORK_SAFE=1 timeout -k 5 60 \
		"$SV_BUILD/bin/tcp_echo" client 7602 $((8 << 20)) >"$TMP/cli.log" 2>&1
	crc=$?
	wait $srv
	src=$?
	fork_verdict "librspreload, fork mode" $crc $src \
		"a forking TCP server's child took 8 MiB over rsockets"
else
	bad "librspreload, fork mode: the server never listened on TCP port 7602"
	kill $srv 2>/dev/null
	wait $srv 2>/dev/null
fi

# Explain mode names what went wrong, in one line.
SOFTVERBS_EXPLAIN=1 timeout -k 5 30 rping -c -a 127.0.0.1 -p 7999 -C 1 >"$TMP/cli.log" 2>&1
expect "rping to a port nothing listens on: REJECTED, explained" "$TMP/cli.log" \
	"RDMA_CM_EVENT_REJECTED: status 8: id .* 127\.0\.0\.1:[0-9]+ -> 127\.0\.0\.1:7999: nothing listens"
SOFTVERBS_EXPLAIN=1 timeout -k 5 30 rping -c -a 198.18.0.9 -p 7999 -C 1 >"$TMP/cli.log" 2>&1
expect "rping to an address on no host: ADDR_ERROR, explained" "$TMP/cli.log" \
	"RDMA_CM_EVENT_ADDR_ERROR: status -113: .*no host answers"
finish
