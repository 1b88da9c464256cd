#!/bin/bash
# Debian's perftest as server and client on localhost: the lat tests with
# default sizes, the bw tests over every size (-a).  Then perftest's
# ibv_wr_* path, taken when the device looks like a ConnectX-6.
. "$(dirname "$0")/lib.sh"
# Its own port window, 18800-18999 (pingpong.sh says why).
port=$((18800 + RANDOM % 150))
iters=${SV_PERFTEST_ITERS:-200}
for t in ib_send_lat ib_write_lat ib_read_lat ib_atomic_lat; do
	pair $((port++)) "$t" $t -n "$iters" && expect "$t reports" "$TMP/cli.log" '^ +[0-9]+ +[0-9]+ +[0-9.]+'
done
# -F: perftest calibrates the CPU clock again for each size of a sweep and,
# without it, exits ("Can't produce a report") when a loaded host's
# scheduling spoils one calibration (r^2 0.897 < 0.9 seen under two busy
# loops); with it that row's rates may read inf, so the 8 MiB row is
# checked by its size and iterations.
for t in ib_send_bw ib_write_bw ib_read_bw; do
	pair $((port++)) "$t -a" $t -F -a -n "$iters" &&
		expect "$t -a: 8 MiB row" "$TMP/cli.log" '^ 8388608 +[0-9]+ '
done
pair $((port++)) "ib_atomic_bw" ib_atomic_bw -n "$iters"
export SOFTVERBS_VENDOR_PART_ID=4123
for t in ib_write_bw ib_send_bw ib_read_lat ib_atomic_lat; do
	pair $((port++)) "$t (ibv_wr* API)" $t -n "$iters" &&
		expect "$t used ibv_wr*" "$TMP/cli.log" 'ibv_wr\* API +: ON'
done
unset SOFTVERBS_VENDOR_PART_ID
SOFTVERBS_LINK_LAYER=roce pair $((port++)) "ib_write_bw (RoCE)" ib_write_bw -n "$iters"

# Shareable memory: perftest's --use_hugepages buffers are SysV shm, which
# softverbs maps and reaches by plain loads and stores (the direct path).
# Huge pages are reserved if this user may; otherwise the runs are skipped.
free_hp=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
if [ "${free_hp:-0}" -lt 32 ] && [ -w /proc/sys/vm/nr_hugepages ]; then
	echo $(( $(cat /proc/sys/vm/nr_hugepages) + 64 )) > /proc/sys/vm/nr_hugepages 2>/dev/null
	free_hp=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
fi
if [ "${free_hp:-0}" -ge 32 ]; then
	for t in ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_atomic_lat; do
		pair $((port++)) "$t --use_hugepages" $t --use_hugepages -n "$iters"
	done
else
	echo "skipped: --use_hugepages runs (no huge pages can be reserved here)"
fi
finish
