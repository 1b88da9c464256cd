#!/bin/bash
# UCX (Debian's ucx-utils) on softverbs, unmodified: ucx_info sees the
# device, and uct and ucp perftests pass over rc_verbs and ud_verbs as two
# processes, each through `softverbs run` (which gives UCX the
# /dev/infiniband node it looks for).  The same tests over UCX's own
# shared-memory transports run beside them, and both figures are printed.
# Port window 19400-19499.
. "$(dirname "$0")/lib.sh"
SV="$SV_BUILD/bin/softverbs"
port=$((19400 + RANDOM % 60))

"$SV" run -- ucx_info -d >"$TMP/info" 2>&1
expect "ucx_info: softverbs0 memory domain" "$TMP/info" '# Memory domain: softverbs0'
expect "ucx_info: rc_verbs on softverbs0:1" "$TMP/info" 'Transport: rc_verbs'
expect "ucx_info: ud_verbs" "$TMP/info" 'Transport: ud_verbs'
expect "ucx_info: device softverbs0:1" "$TMP/info" 'Device: softverbs0:1'

# upair WHAT TLS ARGS...: server and client of ucx_perftest; prints the
# Final line's median latency (us) and bandwidth (MB/s).
upair() {
	local what=$1 tls=$2 p=$((port++))
	shift 2
	# No UCX_TLS at all for uct tests, which name their transport.
	env ${tls:+UCX_TLS=$tls} timeout -k 5 120 "$SV" run -- ucx_perftest -p $p >"$TMP/usrv.log" 2>&1 &
	local srv=$!
	if ! wait_listen $p; then
		bad "$what: the server never listened"; kill $srv 2>/dev/null; wait $srv 2>/dev/null
		return 1
	fi
	env ${tls:+UCX_TLS=$tls} timeout -k 5 120 "$SV" run -- ucx_perftest localhost -p $p "$@" \
		>"$TMP/ucli.log" 2>&1
	local crc=$?
	wait $srv
	local src=$?
	local fin
	fin=$(grep '^Final:' "$TMP/ucli.log")
	if [ $crc -eq 0 ] && [ $src -eq 0 ] && [ -n "$fin" ]; then
		ok "$what: $(echo "$fin" | awk '{printf "median %s us, %s MB/s", $3, $6}')"
		echo "$what|$(echo "$fin" | awk '{print $3 "|" $6}')" >>"$TMP/figures"
		return 0
	fi
	bad "$what (client rc $crc, server rc $src)"
	tail -5 "$TMP/ucli.log" | sed 's/^/    cli: /'
	tail -5 "$TMP/usrv.log" | sed 's/^/    srv: /'
	return 1
}
: >"$TMP/figures"
RC="-x rc_verbs -d softverbs0:1"
UD="-x ud_verbs -d softverbs0:1"
# shellcheck disable=SC2086
{
upair "uct put_lat rc_verbs" "" -t put_lat $RC -n 20000
upair "uct get zcopy 64 KiB rc_verbs" "" -t get -D zcopy -s 65536 $RC -n 2000
upair "uct am_bw bcopy 4 KiB rc_verbs" "" -t am_bw -D bcopy -s 4096 $RC -n 20000
upair "uct add_lat rc_verbs" "" -t add_lat $RC -n 20000
upair "uct am_lat ud_verbs" "" -t am_lat $UD -n 20000
upair "ucp tag_lat rc_verbs,ud_verbs" rc_verbs,ud_verbs,self -t tag_lat -n 20000
upair "ucp put_bw 1 MiB rc_verbs,ud_verbs" rc_verbs,ud_verbs,self -t ucp_put_bw -s 1048576 -n 500
upair "ucp tag_bw 64 KiB ud_verbs" ud_verbs,self -t tag_bw -s 65536 -n 2000
}
# UCX's own shared memory, in the same run, for the comparison.
SM="-x posix -d memory"
# shellcheck disable=SC2086
{
upair "uct put_lat posix (sm)" "" -t put_lat $SM -n 20000
upair "uct get zcopy 64 KiB cma (sm)" "" -t get -D zcopy -s 65536 -x cma -d memory -n 2000
upair "uct am_bw bcopy 4 KiB posix (sm)" "" -t am_bw -D bcopy -s 4096 $SM -n 20000
upair "uct add_lat posix (sm)" "" -t add_lat $SM -n 20000
upair "uct am_lat posix (sm)" "" -t am_lat $SM -n 20000
upair "ucp tag_lat sm" sm,self -t tag_lat -n 20000
upair "ucp put_bw 1 MiB sm" sm,self -t ucp_put_bw -s 1048576 -n 500
upair "ucp tag_bw 64 KiB sm" sm,self -t tag_bw -s 65536 -n 2000
}
echo "figures (test | median latency us | bandwidth MB/s):"
sed 's/^/    /' "$TMP/figures"
finish
