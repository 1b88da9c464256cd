#!/bin/bash
# qperf on softverbs: each test five times in a row against one server.
# qperf waits in ibv_get_cq_event and ends its timed runs with SIGALRM, so
# a wait that a signal does not interrupt hangs its server; these runs
# are what caught it.  Port window 19500-19599.
. "$(dirname "$0")/lib.sh"
port=$((19500 + RANDOM % 90))
timeout -k 5 300 qperf -lp $port >"$TMP/qsrv.log" 2>&1 &
srv=$!
if ! wait_listen $port; then
	bad "qperf server never listened"
	finish
	exit 1
fi
for t in rc_lat rc_bw rc_rdma_write_lat rc_rdma_read_bw rc_compare_swap_mr ud_lat uc_bw; do
	pass=0
	for run in 1 2 3 4 5; do
		if timeout -k 5 30 qperf -lp $port -t 1 localhost $t >"$TMP/q.log" 2>&1 &&
		   grep -qE '(latency|bw|msg_rate) += +[0-9.]+ ' "$TMP/q.log"; then
			pass=$((pass + 1))
		else
			sed 's/^/    /' "$TMP/q.log" | head -5
		fi
	done
	if [ $pass -eq 5 ]; then ok "qperf $t: 5 of 5 ($(tr -s ' \n' ' ' <"$TMP/q.log"))"
	else bad "qperf $t: $pass of 5"; fi
done
kill $srv 2>/dev/null
wait $srv 2>/dev/null
finish
