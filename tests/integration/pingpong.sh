#!/bin/bash
# Debian's pingpongs as two processes on localhost: default flags, -e
# (completion channels), -c (data validated), rc with -N (ibv_wr_*), and
# XRC (ibv_xsrq_pingpong: XRC_SEND -> XRC_RECV -> XRC SRQ, both ways).
. "$(dirname "$0")/lib.sh"
# ctest runs the integration scripts side by side: each keeps to its own
# port window (this one 18600-18799, about 45 pairs after a random start;
# perftest.sh 18800-18999, demo.sh 19200-19399).
port=$((18600 + RANDOM % 150))
for t in rc uc ud srq; do
	for flags in "" "-e" "-c" "-e -c"; do
		# shellcheck disable=SC2086
		pair $((port++)) "ibv_${t}_pingpong $flags" "ibv_${t}_pingpong" -n 300 $flags &&
			expect "ibv_${t}_pingpong $flags: 300 iterations" "$TMP/cli.log" "300 iters in"
	done
done
pair $((port++)) "ibv_rc_pingpong -N" ibv_rc_pingpong -n 300 -N
pair $((port++)) "ibv_rc_pingpong -N -e -c" ibv_rc_pingpong -n 300 -N -e -c
# RoCE: a GID is needed; -g picks the GID index (1 = ::ffff:127.0.0.1).
SOFTVERBS_LINK_LAYER=roce pair $((port++)) "ibv_rc_pingpong (RoCE, -g 1)" ibv_rc_pingpong -n 300 -g 1
SOFTVERBS_LINK_LAYER=roce pair $((port++)) "ibv_ud_pingpong (RoCE, -g 1)" ibv_ud_pingpong -n 300 -g 1
for flags in "" "-e" "-s 64 -m 1024"; do
	# shellcheck disable=SC2086
	pair $((port++)) "ibv_xsrq_pingpong $flags" ibv_xsrq_pingpong -n 50 $flags &&
		expect "ibv_xsrq_pingpong $flags: success" "$TMP/cli.log" "^success"
done
SOFTVERBS_LINK_LAYER=roce pair $((port++)) "ibv_xsrq_pingpong (RoCE, -g 1)" ibv_xsrq_pingpong -n 50 -g 1
# One server, two clients: one SRQ receives from both clients' XRC QPs.
p=$((port++))
timeout -k 5 120 ibv_xsrq_pingpong -c 2 -n 20 -p $p >"$TMP/srv.log" 2>&1 &
srv=$!
if wait_listen $p; then
	timeout -k 5 120 ibv_xsrq_pingpong -n 20 -p $p localhost >"$TMP/c1.log" 2>&1 &
	c1=$!
	timeout -k 5 120 ibv_xsrq_pingpong -n 20 -p $p localhost >"$TMP/c2.log" 2>&1
	c2rc=$?
	wait $c1; c1rc=$?
	wait $srv; srvrc=$?
	if [ $c1rc -eq 0 ] && [ $c2rc -eq 0 ] && [ $srvrc -eq 0 ]; then
		ok "ibv_xsrq_pingpong -c 2: one server, two clients"
	else
		bad "ibv_xsrq_pingpong -c 2 (clients rc $c1rc/$c2rc, server rc $srvrc)"
		tail -n 5 "$TMP/srv.log" "$TMP/c1.log" "$TMP/c2.log"
	fi
else
	bad "ibv_xsrq_pingpong -c 2: the server never listened"
	kill $srv
fi
finish
