#!/bin/bash
# The UDP transport when the wire or the peer misbehaves: two network
# namespaces joined by a veth (198.18.1.1/30 and 198.18.1.2/30, plus
# 198.18.1.5/30 and 198.18.1.6/30 on the same link for the spoofed
# source), and udp_peer (tests/integration/udp_peer.c) on both ends:
#   1. exact atomics under loss, duplicates, reordering and corruption
#      (one client keeping 4 outstanding, the other 64):
#      two clients, 10,000 FETCH_AND_ADD each, the counter exactly 20,000
#      and every fetched value distinct;
#   2. 30% loss both ways: RDMA WRITEs then a READ back, byte for byte
#      (retried with new seeds when the retries run out, see there);
#   3. 100% loss: IBV_WC_RETRY_EXC_ERR after (retry_cnt + 1) local ACK
#      timeouts, timed;
#   4. RNR: IBV_WC_RNR_RETRY_EXC_ERR with rnr_retry 1, 2, 3; rnr_retry 7
#      waits for a late receive;
#   5. the server killed mid-stream: IBV_WC_RETRY_EXC_ERR within the
#      retry budget, then IBV_WC_WR_FLUSH_ERR; the retries are probes
#      that ask for their answer (AckReq, in the client's capture);
#   6. hostile datagrams, from a raw socket, at a live QP (DESIGN 7): bad
#      ICRC, unknown QPN, PSNs outside the window, a spoofed source,
#      truncated headers, bad opcodes and sequences, wrong rkey, out of
#      bounds, no access, a SEND cut by a refused request (its receive
#      completes in error); the server survives, its memory outside what
#      it allowed is untouched, and a real client still gets through; and
#      IPv4 numbered as rxe and RoCE NICs number it: refused by default,
#      taken with SOFTVERBS_IPV4_ID=any;
#   7. a seeded random mix of every RC operation (WRITE, READ, SEND, the
#      IMM variants, both atomics; lengths 0 to 64 KiB, scattered SGEs,
#      inline, unsignaled, fenced) on two QPs, checked against a model of
#      the server's memory: on one host (shm), across the veth (and the
#      order and MSNs of the server's answers in its capture), and under
#      the faults of 1;
#   8. one schedule of losses, scripted by a fake responder (a plain UDP
#      socket): a SEND behind an atomic answered while a READ's hole held
#      the requester back must still go and complete.
# Needs root (namespaces); without it, says so and passes.
#
# Knobs: SV_FAULTS_SEED=N (the fault seed, default random, printed);
# SV_FAULTS_ATOMICS=N (per client, default 10000); SV_FAULTS_MIX=N
# (operations per QP in 7, default 3000).
set -u
here=$(dirname "$0")
. "$here/lib.sh"
. "$here/netns.sh"

if [ "$(id -u)" -ne 0 ]; then
	echo "skipped: udp_faults needs root to make network namespaces and a veth pair"
	exit 0
fi

PEER=$SV_BUILD/bin/udp_peer
NSA=svfA-$$ NSB=svfB-$$
IFA=sfa IFB=sfb
A=198.18.1.1 B=198.18.1.2 A2=198.18.1.5 B2=198.18.1.6
SEED=${SV_FAULTS_SEED:-$RANDOM}
NATOM=${SV_FAULTS_ATOMICS:-10000}
NMIX=${SV_FAULTS_MIX:-3000}
FAULT="drop=0.05,dup=0.02,reorder=0.02,corrupt=0.01"
PORT=18515
PIDS=()
HAVE_NS=0

cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	[ $HAVE_NS = 1 ] && ns_del "$NSA" "$NSB"
	# Each network namespace is a host with a registry of its own.
	[ -n "${SOFTVERBS_REGISTRY:-}" ] && rm -f /dev/shm/"$SOFTVERBS_REGISTRY".n*
	rm -rf "$TMP"
}
ns_traps cleanup

# peer NS SECONDS LOG VAR=VALUE... -- ARGS...: udp_peer ARGS in NS on
# softverbs in RoCE mode, output to LOG, killed after SECONDS.
peer() {
	local ns=$1 t=$2 log=$3 envs=("LD_LIBRARY_PATH=$LD_LIBRARY_PATH" SOFTVERBS_LINK_LAYER=roce)
	shift 3
	[ -n "${LD_PRELOAD:-}" ] && envs+=("LD_PRELOAD=$LD_PRELOAD" "ASAN_OPTIONS=${ASAN_OPTIONS:-}")
	while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
	shift
	timeout -k 5 "$t" ip netns exec "$ns" env "${envs[@]}" "$PEER" "$@" --limit $((t - 2)) >"$log" 2>&1
}

# server LOG PORT VAR=VALUE... -- ARGS...: a server in A, in the
# background (SRV: its timeout's pid); fails unless it listens.
server() {
	local log=$1 port=$2
	shift 2
	# (2>/dev/null: not the program's output, which goes to LOG, but
	# bash's "Killed" when check 5 kills it.)
	peer "$NSA" 150 "$log" "$@" --addr $A --port "$port" 2>/dev/null &
	SRV=$!
	PIDS+=("$SRV")
	if ! ns_wait_listen "$NSA" "$port"; then
		bad "the server on port $port never listened"
		sed 's/^/    srv: /' "$log" | tail -5
		kill "$SRV" 2>/dev/null
		return 1
	fi
}

# verdicts WHAT LOG: the "check:" lines of LOG, as ok and bad.
verdicts() {
	local line
	while IFS= read -r line; do
		case $line in
		"check: ok: "*) ok "${line#check: ok: }" ;;
		"check: FAIL: "*) bad "${line#check: FAIL: }" ;;
		esac
	done <"$2"
}

# finished WHAT RC LOG: a program's exit; its last lines when it failed.
finished() {
	if [ "$2" -eq 0 ]; then
		return 0
	fi
	local why="rc $2"
	[ "$2" -eq 124 ] || [ "$2" -eq 137 ] && why="$why: killed by its timeout"
	[ "$2" -eq 3 ] && why="$why: its own time limit"
	bad "$1 exited with $why"
	grep -v '^check: ok' "$3" | sed 's/^/    /' | tail -12
	return 1
}

# ---- the hosts ----
for _ in $(seq 60); do [ -x "$PEER" ] && [ -e "$SV_BUILD/lib/libibverbs.so.1" ] && break; sleep 1; done
if [ ! -x "$PEER" ]; then
	bad "$PEER is not built (cmake --build builds it with the tests)"
	finish
	exit
fi
section "hosts: namespaces $NSA and $NSB, a veth"
ns_sweep svfA svfB
HAVE_NS=1
if ns_add "$NSA" && ns_add "$NSB" && ns_veth "$NSA" $IFA $A/30 "$NSB" $IFB $B/30 &&
   ip -n "$NSA" addr add $A2/30 dev $IFA && ip -n "$NSB" addr add $B2/30 dev $IFB; then
	# The spoofed source must reach softverbs, not die in the kernel's
	# reverse path filter (it has a route back anyway: the second /30).
	ns_in "$NSA" sysctl -qw net.ipv4.conf.all.rp_filter=0 \
		"net.ipv4.conf.$IFA.rp_filter=0" >/dev/null 2>&1
	ok "namespaces $NSA ($A, $A2) and $NSB ($B, $B2), joined by a veth"
else
	bad "could not make the namespaces and their veth"
	finish
	exit
fi
echo "    fault seed $SEED (SV_FAULTS_SEED=N sets it; with several sending threads a seed fixes the rates, not the exact pattern)"

# ---- 1. atomics under faults ----
# Timeout 14 (67 ms, perftest's and rdma-core's pingpongs'), not 12: a
# QP's budget of retry_cnt + 1 timeouts must outlast the host's
# scheduling, since here the engine that answers is a process, not a
# NIC.  This kernel runs a busy task for up to 100 ms before it lets
# another have the core (perf sched timehist: a shell loop's and
# softverbs' threads' runs of 100.4-101.6 ms), so under two busy loops
# a client waited 150-225 ms to run, and the other client, whose
# answers the kernel had given to its socket to forward, used up timeout
# 12's 8 x 16.8 ms: 8 failed runs of 117 of this section, with and
# without forward()'s wait in udp.c alike; with timeout 14, 0 of 65.
# The second client keeps 64 atomics outstanding: an answer lost while
# later ones ran must still be answered from the server's records.
section "1. exact atomics: 2 x $NATOM FETCH_AND_ADD (4 and 64 outstanding), faults $FAULT on both sides"
port=$((PORT++))
if server "$TMP/a-srv.log" $port "SOFTVERBS_FAULT=$FAULT,seed=$SEED" -- \
	server --conns 2 --expect-counter $((2 * NATOM)); then
	c=()
	for i in 1 2; do
		peer "$NSB" 140 "$TMP/a-cli$i.log" "SOFTVERBS_FAULT=$FAULT,seed=$((SEED + i))" -- \
			atomic --addr $B --server $A --port $port --count "$NATOM" --depth $((i == 1 ? 4 : 64)) \
			--timeout 14 --retry 7 --rnr-retry 7 --out "$TMP/fetched$i.txt" &
		c+=($!)
		PIDS+=($!)
	done
	for i in 1 2; do
		wait "${c[$((i - 1))]}"
		r=$?
		verdicts "client $i" "$TMP/a-cli$i.log"
		finished "atomic client $i" $r "$TMP/a-cli$i.log"
	done
	wait "$SRV"
	r=$?
	grep '^server: counter' "$TMP/a-srv.log" | sed 's/^/    /'
	if finished "atomic server" $r "$TMP/a-srv.log"; then
		expect "the counter is exactly $((2 * NATOM)) after 2 x $NATOM FETCH_AND_ADD of 1" \
			"$TMP/a-srv.log" "^server: counter $((2 * NATOM)), canaries intact"
	fi
	if [ -s "$TMP/fetched1.txt" ] && [ -s "$TMP/fetched2.txt" ]; then
		all=$(sort -n "$TMP/fetched1.txt" "$TMP/fetched2.txt" | uniq | wc -l)
		dup=$(sort -n "$TMP/fetched1.txt" "$TMP/fetched2.txt" | uniq -d | wc -l)
		lo=$(sort -n "$TMP/fetched1.txt" "$TMP/fetched2.txt" | head -1)
		hi=$(sort -n "$TMP/fetched1.txt" "$TMP/fetched2.txt" | tail -1)
		if [ "$all" -eq $((2 * NATOM)) ] && [ "$dup" -eq 0 ] && [ "$lo" -eq 0 ] &&
		   [ "$hi" -eq $((2 * NATOM - 1)) ]; then
			ok "the two clients fetched every value 0..$((2 * NATOM - 1)) exactly once (no atomic executed twice or lost)"
		else
			bad "fetched values: $all distinct, $dup repeated across clients, from $lo to $hi (want 0..$((2 * NATOM - 1)), each once)"
		fi
	else
		bad "the atomic clients wrote no fetched values"
	fi
fi

# ---- 2. 30% loss ----
# A requester gets retry_cnt (at most 7) timeouts in a row without
# progress; at 30% loss each way a probe and its answer both arrive
# about half the time, so a stall outlives 8 timeouts about once in 200
# (0.51^8), however right the transport.  Stalls are holes whose one
# NAK, or whose tail, was lost: a run of 32 WRITEs had 19 to 31 of them,
# and 1 to 5 such runs in 10 ended, honestly, in IBV_WC_RETRY_EXC_ERR
# (udp_peer exits 4, nothing else wrong); 16 WRITEs have half as many.
# Such a run is tried again with other fault seeds, 6 times at most; a
# wrong byte, any other status or a hang fails at once.  (The 12.8 MB a
# larger test would move fails that way nearly every time.)
section "2. 30% loss both ways: 16 RDMA WRITEs of 4 KiB, then a READ back"
for attempt in 1 2 3 4 5 6; do
	port=$((PORT++))
	s=$((SEED + 10 * attempt))
	server "$TMP/w-srv.log" $port "SOFTVERBS_FAULT=drop=0.3,seed=$s" -- server || break
	peer "$NSB" 100 "$TMP/w-cli.log" "SOFTVERBS_FAULT=drop=0.3,seed=$((s + 1))" SOFTVERBS_EXPLAIN=1 -- \
		write --addr $B --server $A --port $port --count 16 --size 4096 --depth 4 \
		--timeout 12 --retry 7
	r=$?
	wait "$SRV"
	rs=$?
	if [ $r -eq 4 ] && ! grep -q '^check: FAIL' "$TMP/w-cli.log"; then
		echo "    attempt $attempt (seeds $s, $((s + 1))): $(grep '^exhausted:' "$TMP/w-cli.log")"
		grep 'error completion' "$TMP/w-cli.log" | head -1 | cut -c1-200 | sed 's/^/        /'
		[ $attempt -lt 6 ] && continue
		bad "30% loss: the retries ran out in all 6 attempts (by chance under 1 in 10,000)"
		break
	fi
	verdicts write "$TMP/w-cli.log"
	finished "write client (30% loss, attempt $attempt)" $r "$TMP/w-cli.log" &&
		finished "write server (30% loss)" $rs "$TMP/w-srv.log" &&
		ok "30% loss both ways: completed on attempt $attempt of 6"
	break
done

# ---- 3. 100% loss ----
section "3. 100% loss from the client: IBV_WC_RETRY_EXC_ERR on time"
port=$((PORT++))
if server "$TMP/r-srv.log" $port -- server; then
	peer "$NSB" 60 "$TMP/r-cli.log" "SOFTVERBS_FAULT=drop=1" -- \
		retry --addr $B --server $A --port $port --timeout 14 --retry 3
	r=$?
	grep '^retry:' "$TMP/r-cli.log" | sed 's/^/    /'
	verdicts retry "$TMP/r-cli.log"
	finished "retry client (100% loss)" $r "$TMP/r-cli.log"
	wait "$SRV"
	finished "retry server" $? "$TMP/r-srv.log"
fi

# ---- 4. RNR ----
section "4. RNR: no receive posted"
port=$((PORT++))
if server "$TMP/n-srv.log" $port -- server; then
	peer "$NSB" 60 "$TMP/n-cli.log" -- rnr --addr $B --server $A --port $port --timeout 14 --retry 7
	r=$?
	verdicts rnr "$TMP/n-cli.log"
	finished "rnr client" $r "$TMP/n-cli.log"
	wait "$SRV"
	finished "rnr server" $? "$TMP/n-srv.log"
fi

# ---- 5. the peer dies ----
section "5. the server killed (SIGKILL) while the client streams RDMA WRITEs"
port=$((PORT++))
rm -f "$TMP/ready" "$TMP/srv.pid"
if server "$TMP/k-srv.log" $port -- server --pidfile "$TMP/srv.pid"; then
	rm -f "$TMP/k-cli.pcap"
	peer "$NSB" 60 "$TMP/k-cli.log" "SOFTVERBS_PCAP=$TMP/k-cli.pcap" -- stream --addr $B \
		--server $A --port $port --timeout 14 \
		--retry 3 --depth 16 --size 4096 --count 2000 --ready "$TMP/ready" &
	cli=$!
	PIDS+=("$cli")
	for _ in $(seq 300); do
		[ -e "$TMP/ready" ] && break
		kill -0 $cli 2>/dev/null || break
		sleep 0.05
	done
	if [ -e "$TMP/ready" ] && [ -s "$TMP/srv.pid" ]; then
		kill -9 "$(cat "$TMP/srv.pid")"
		echo "    killed the server (pid $(cat "$TMP/srv.pid")) mid-stream"
	else
		bad "the stream never got going (no ready file in 15 s)"
		kill "$SRV" 2>/dev/null
	fi
	wait $cli
	r=$?
	grep '^stream:' "$TMP/k-cli.log" | sed 's/^/    /'
	verdicts stream "$TMP/k-cli.log"
	finished "stream client" $r "$TMP/k-cli.log"
	wait "$SRV" 2>/dev/null
	# With the server gone, each retry is a probe: the first packet not
	# answered, alone, asking for its answer (AckReq), since a responder
	# acknowledges a FIRST or MIDDLE packet only when asked.  So the
	# client's packets that repeat a PSN, from 60 ms after the server's
	# last (timeout 14 is 67 ms), are retry_cnt probes of one PSN, each
	# with AckReq (a window still leaving then, on a slow machine, has
	# PSNs of its own).
	if ! command -v tshark >/dev/null; then
		echo "skipped: the probes' AckReq: tshark is not installed"
	else
		tshark -r "$TMP/k-cli.pcap" -T fields -e frame.time_relative -e ip.src \
			-e infiniband.bth.psn -e infiniband.bth.a 2>/dev/null >"$TMP/k-cli.txt"
		read -r probes psns asked < <(awk -F'\t' -v srv=$A '
			$2 == srv { last = $1 }
			{ t[NR] = $1; s[NR] = $2; p[NR] = $3; a[NR] = $4 }
			END {
				for (i = 1; i <= NR; i++) {
					if (s[i] != srv && t[i] > last + 0.06 && (p[i] in sent)) {
						n++; seen[p[i]] = 1; k += a[i] == 1
					}
					if (s[i] != srv)
						sent[p[i]] = 1
				}
				for (x in seen) m++
				print n + 0, m + 0, k + 0
			}' "$TMP/k-cli.txt")
		# Tail-loss probes (engine/pkt_req.c tail_probe, at most
		# PKT_TLP_MAX, 3) come before the timeouts' and may fall after
		# the 60 ms too: the retry_cnt probes and up to 3 more, all of
		# one PSN, each with AckReq.
		if [ "$probes" -ge 3 ] && [ "$probes" -le 6 ] && [ "$psns" -eq 1 ] &&
			[ "$asked" -eq "$probes" ]; then
			ok "after the server died: $probes probes (retry_cnt 3 and tail-loss probes) of one PSN, each with AckReq"
		else
			bad "after the server died: $probes packets, $psns PSNs, $asked with AckReq (want 3 to 6, 1, all)"
		fi
	fi
fi

# ---- 6. hostile packets ----
section "6. hostile packets at a live RC QP"
port=$((PORT++))
rm -f "$TMP"/h-*.pcap
if server "$TMP/h-srv.log" $port SOFTVERBS_EXPLAIN=1 "SOFTVERBS_PCAP=$TMP/h-%p.pcap" -- server; then
	# softverbs status in A, over and over while the server lives: the
	# last view of its endpoint that names port 4791 is kept, and all of
	# them (a QP refused into ERR leaves the table when it is reset).
	# The client keeps its QPs until a view shows the attacked QP's
	# drops (h-seen) or 20 s have passed, however slow the machine.
	# Once the server's endpoint is up, a process of another user in its
	# namespace sends a datagram to every packet engine's forwarding
	# socket (an abstract name, open to all): only the user's own
	# processes forward packets, so the server must drop it.
	rm -f "$TMP/h-status-all.txt" "$TMP/h-seen" "$TMP/h-forged"
	(
		while kill -0 "$SRV" 2>/dev/null; do
			if [ -s "$TMP/h-status.txt" ] && [ ! -e "$TMP/h-forged" ]; then
				ip netns exec "$NSA" setpriv --reuid=65534 --regid=65534 --clear-groups \
					/usr/bin/python3 -c 'import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
n = 0
for line in open("/proc/net/unix"):
    f = line.split()
    if len(f) >= 8 and f[7].startswith("@softverbs-udp:"):
        s.sendto(bytes(80), b"\0" + f[7][1:].encode())
        n += 1
print(n)' >"$TMP/h-forged" 2>&1
			fi
			ip netns exec "$NSA" env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" SOFTVERBS_LINK_LAYER=roce \
				"$SV_BUILD/bin/softverbs" status >"$TMP/h-status.new" 2>&1
			awk -v p="$B/0x" 'index($2, p) == 1 && $NF > 0 {f = 1} END {exit !f}' \
				"$TMP/h-status.new" && touch "$TMP/h-seen"
			awk '/^UDP endpoints/ {u = 1; next} u && $3 == 4791 {f = 1} END {exit !f}' \
				"$TMP/h-status.new" && cat "$TMP/h-status.new" >>"$TMP/h-status-all.txt" &&
				mv "$TMP/h-status.new" "$TMP/h-status.txt"
			sleep 0.2
		done
	) &
	watcher=$!
	peer "$NSB" 60 "$TMP/h-cli.log" "SOFTVERBS_PCAP=$TMP/h-%p.pcap" -- \
		hostile --addr $B --server $A --port $port --spoof $B2 --timeout 14 --retry 7 \
		--hold "$TMP/h-seen"
	r=$?
	verdicts hostile "$TMP/h-cli.log"
	finished "hostile client" $r "$TMP/h-cli.log"
	# The server must have lived through it all: it exits 0 only after
	# the client's goodbye, with its canaries checked.
	wait "$SRV"
	r=$?
	if finished "hostile server" $r "$TMP/h-srv.log"; then
		expect "the server survived the barrage, canaries and read-only MR intact" \
			"$TMP/h-srv.log" "^server: counter 0, canaries intact, read-only MR intact"
	fi
	wait $watcher
	# Each kind of drop is counted where softverbs status shows it: the
	# endpoint's columns 5 (bad ICRC), 9 (bad header), 10 (unknown QPN)
	# and 11 (a source other than the QP's peer), and the QP's drops.
	if [ -s "$TMP/h-status.txt" ]; then
		sed 's/^/    /' "$TMP/h-status.txt" | grep -A3 -E '^    (UDP endpoints|QPs reached)'
		for col in "5 bad ICRC" "9 truncated or malformed headers" "10 unknown QPN" \
			"11 a source other than the QP's peer"; do
			if awk -v c="${col%% *}" '/^UDP endpoints/ {u = 1; next} u && $3 == 4791 && $c > 0 {f = 1}
				END {exit !f}' "$TMP/h-status.txt"; then
				ok "softverbs status counts the drops for ${col#* }"
			else
				bad "softverbs status: no drop counted for ${col#* }"
			fi
		done
		if awk -v p="$B/0x" 'index($2, p) == 1 && $NF > 0 {f = 1} END {exit !f}' "$TMP/h-status-all.txt"; then
			ok "softverbs status counts the attacked QP's drops (sequence, rkey, bounds, access)"
		else
			bad "softverbs status: the attacked QP (peer $B) counted no drops"
		fi
	else
		bad "softverbs status never showed the server's UDP endpoint"
	fi
	if [ "$(cat "$TMP/h-forged" 2>/dev/null)" -gt 0 ] 2>/dev/null; then
		expect "the server dropped a datagram another user sent to its forwarding socket" \
			"$TMP/h-srv.log" "uid 65534, dropped: only this user's processes forward packets"
	else
		bad "no datagram reached a forwarding socket from another user: $(cat "$TMP/h-forged" 2>/dev/null)"
	fi
	# SOFTVERBS_EXPLAIN names each refusal's cause (DESIGN 8).
	for want in "is not registered" "is outside rkey 0x[0-9a-f]+'s region" \
		"registered without IBV_ACCESS_REMOTE_WRITE" "registered without IBV_ACCESS_REMOTE_ATOMIC" \
		"RDMA_WRITE_MIDDLE breaks the opcode sequence" "has a wrong payload length" \
		"do not add up to its RETH length" "RDMA READ refused"; do
		expect "the server's explain output says \"$want\"" "$TMP/h-srv.log" "$want"
	done
fi
# The same raw sender, sending IPv4 as rxe and RoCE NICs do (the
# identification numbered, the ICRC computed for it), at a server run with
# SOFTVERBS_IPV4_ID=any: taken, unless its ICRC is off.  The hostile run
# above, with the default, had one such WRITE refused.
port=$((PORT++))
if server "$TMP/f-srv.log" $port SOFTVERBS_IPV4_ID=any -- server; then
	peer "$NSB" 60 "$TMP/f-cli.log" -- foreign --addr $B --server $A --port $port --timeout 14 \
		--retry 7
	r=$?
	verdicts foreign "$TMP/f-cli.log"
	finished "foreign client" $r "$TMP/f-cli.log"
	wait "$SRV"
	finished "foreign server" $? "$TMP/f-srv.log"
fi

# ---- 7. a random mix of every operation ----
# Three runs: between two processes of A (one host, so shm), across the
# veth without faults, captured at the server (the order of its answers
# below), and across the veth with the faults of 1 on both sides.
section "7. a random mix of every RC operation, checked against a model"
for where in shm udp faults; do
	port=$((PORT++))
	srv_env=() cli_ns=$NSB cli_addr=$B cli_env=()
	case $where in
	shm) cli_ns=$NSA cli_addr=$A ;;
	udp) rm -f "$TMP/m-srv.pcap"; srv_env=("SOFTVERBS_PCAP=$TMP/m-srv.pcap") ;;
	faults)
		srv_env=("SOFTVERBS_FAULT=$FAULT,seed=$((SEED + 70))")
		cli_env=("SOFTVERBS_FAULT=$FAULT,seed=$((SEED + 71))") ;;
	esac
	server "$TMP/m-$where-srv.log" $port "${srv_env[@]}" -- server || continue
	peer "$cli_ns" 120 "$TMP/m-$where-cli.log" "${cli_env[@]}" -- mix --addr $cli_addr \
		--server $A --port $port --count "$NMIX" --qps 2 --depth 8 --seed $((SEED + 72)) \
		--timeout 14 --retry 7 --rnr-retry 7
	r=$?
	grep '^mix:' "$TMP/m-$where-cli.log" | sed "s/^/    $where: /"
	verdicts mix "$TMP/m-$where-cli.log"
	finished "mix client ($where)" $r "$TMP/m-$where-cli.log"
	wait "$SRV"
	finished "mix server ($where)" $? "$TMP/m-$where-srv.log"
done
# Responses go in the order of the requests (IBA 9.7.5.1): an ACK or NAK
# the server sends never has a PSN behind a READ response or atomic ACK
# it sent before on that QP (a coalesced ACK held to the batch's end
# went after the READ response of a later request).  And a READ's first
# response or an atomic's ACK, when it answers a new request (its PSN
# past every answer before), carries that request's own MSN (C9-148):
# more than any MSN the QP sent before.  Only without faults: `reorder`
# changes the order on the wire on purpose.
if ! command -v tshark >/dev/null; then
	echo "skipped: the order of the server's answers: tshark is not installed"
elif [ -s "$TMP/m-srv.pcap" ]; then
	read -r acks behind first news stale sfirst < <(tshark -r "$TMP/m-srv.pcap" -T fields \
		-e frame.number -e ip.src -e infiniband.bth.opcode -e infiniband.bth.destqp \
		-e infiniband.bth.psn -e infiniband.aeth.msn 2>/dev/null | awk -F'\t' -v srv=$A '
		function newer(a, b) { return (a - b + 16777216) % 16777216 < 8388608 }
		$2 != srv { next }
		$3 == 13 || $3 == 16 || $3 == 18 {
			if (!($4 in top) || ($5 != top[$4] && newer($5, top[$4]))) {
				m++
				if (($4 in msn) && !newer($6, msn[$4] + 1) && !s++)
					g = $1
			}
		}
		$3 >= 13 && $3 <= 18 && $3 != 17 {
			if (!($4 in top) || newer($5, top[$4]))
				top[$4] = $5
		}
		$3 == 17 {
			n++
			if (($4 in top) && $5 != top[$4] && newer(top[$4], $5) && !bad++)
				f = $1
		}
		$6 != "" && (!($4 in msn) || newer($6, msn[$4])) { msn[$4] = $6 }
		END { print n + 0, bad + 0, f + 0, m + 0, s + 0, g + 0 }')
	if [ "$acks" -gt 0 ] && [ "$behind" -eq 0 ]; then
		ok "the server's $acks ACKs and NAKs never went behind a later READ response or atomic ACK"
	else
		bad "the server's ACKs and NAKs: $behind of $acks behind a later response (the first: frame $first)"
	fi
	if [ "$news" -gt 0 ] && [ "$stale" -eq 0 ]; then
		ok "the server's answers to $news new READs and atomics each carried a new MSN"
	else
		bad "the server's answers to new READs and atomics: $stale of $news without a new MSN (the first: frame $sfirst)"
	fi
else
	bad "the mix across the veth left no server capture"
fi

# ---- 8. a scripted schedule of losses ----
section "8. a SEND behind an answered atomic and a READ's repaired hole (scripted responder)"
port=$((PORT++))
# The fake responder binds port 4791 itself: nothing of softverbs in A
# may run meanwhile (every server above has exited).
peer "$NSA" 30 "$TMP/s-srv.log" -- fakeresp --addr $A --port $port &
fake=$!
PIDS+=("$fake")
if ns_wait_listen "$NSA" $port; then
	peer "$NSB" 30 "$TMP/s-cli.log" -- stale --addr $B --server $A --port $port --depth 4 \
		--timeout 14 --retry 7
	r=$?
	verdicts stale "$TMP/s-cli.log"
	finished "stale client" $r "$TMP/s-cli.log"
	wait $fake
	r=$?
	verdicts fakeresp "$TMP/s-srv.log"
	finished "fake responder" $r "$TMP/s-srv.log"
else
	bad "the fake responder never listened"
	sed 's/^/    fake: /' "$TMP/s-srv.log" | tail -5
fi

section ""
echo "time: all: $SECONDS s"
finish
