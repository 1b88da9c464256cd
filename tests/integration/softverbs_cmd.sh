#!/bin/bash
# The softverbs command and explain mode, as a user meets them.
. "$(dirname "$0")/lib.sh"
SV="$SV_BUILD/bin/softverbs"

# `softverbs run` needs no LD_LIBRARY_PATH of the user's.
env -u LD_LIBRARY_PATH "$SV" run -- ibv_devices >"$TMP/run" 2>&1
expect "run: ibv_devices sees softverbs0" "$TMP/run" 'softverbs0'
env -u LD_LIBRARY_PATH "$SV" run --roce -- ibv_devinfo >"$TMP/runroce" 2>&1
expect "run --roce: Ethernet" "$TMP/runroce" 'link_layer:\s+Ethernet'
"$SV" run -- /nonexistent >"$TMP/run404" 2>&1; rc=$?
[ $rc -eq 127 ] && ok "run: missing program is exit 127" || bad "run: missing program rc $rc"
"$SV" devices -v >"$TMP/devs" 2>&1
expect "devices" "$TMP/devs" '^softverbs0 +guid [0-9a-f]{16} +port 1 active'

# status shows a live endpoint while a program holds a context.
ibv_asyncwatch >/dev/null 2>&1 &
watcher=$!
for _ in $(seq 50); do "$SV" status >"$TMP/status" 2>&1; grep -q " $watcher " "$TMP/status" && break; sleep 0.1; done
expect "status shows the live process" "$TMP/status" "^[0-9]+ +$watcher +softverbs0"
kill -9 $watcher; wait $watcher 2>/dev/null
"$SV" status >"$TMP/status2" 2>&1
if grep -q " $watcher " "$TMP/status2"; then bad "status still lists killed $watcher"; else ok "status reclaims a killed process"; fi

# Idle costs nothing: a process holding a context (and so a progress
# thread) for a second accrues no CPU time (utime+stime in clock ticks).
ibv_asyncwatch >/dev/null 2>&1 &
idle=$!
sleep 0.3
t0=$(awk '{print $14 + $15}' /proc/$idle/stat)
sleep 1
t1=$(awk '{print $14 + $15}' /proc/$idle/stat)
kill $idle; wait $idle 2>/dev/null
[ $((t1 - t0)) -le 1 ] && ok "idle process used $((t1 - t0)) ticks in 1 s" || bad "idle process used $((t1 - t0)) ticks in 1 s"

# The walkthrough, with explain mode: the explanation goes to stderr only.
SOFTVERBS_EXPLAIN=1 "$SV_BUILD/bin/walkthrough" >"$TMP/wt.out" 2>"$TMP/wt.err"; rc=$?
[ $rc -eq 0 ] && ok "walkthrough runs" || bad "walkthrough rc $rc"
expect "walkthrough reaches RTS" "$TMP/wt.out" 'RTR -> RTS'
expect "explain names the legal path" "$TMP/wt.err" \
	'ibv_modify_qp failed \(EINVAL\): qpn 0x[0-9a-f]+ RESET->RTR rejected: RC QPs must pass INIT first \(RESET->INIT needs IBV_QP_STATE\|IBV_QP_ACCESS_FLAGS\|IBV_QP_PKEY_INDEX\|IBV_QP_PORT\)'
if grep -q 'softverbs\[' "$TMP/wt.out"; then bad "library wrote to stdout"; else ok "library never writes to stdout"; fi
"$SV_BUILD/bin/walkthrough" >/dev/null 2>"$TMP/quiet.err"
[ ! -s "$TMP/quiet.err" ] && ok "no explanation without SOFTVERBS_EXPLAIN" || bad "stderr chatter without explain: $(head -2 "$TMP/quiet.err")"

# A bad setting is reported and the default kept.
SOFTVERBS_LINK_LAYER=fddi ibv_devices >"$TMP/badcfg.out" 2>"$TMP/badcfg.err"
expect "bad setting explained" "$TMP/badcfg.err" 'SOFTVERBS_LINK_LAYER="fddi" is not valid \(ib or roce\)'
expect "bad setting keeps the default" "$TMP/badcfg.out" 'softverbs0'
SOFTVERBS_IPV4_ID=all ibv_devices >/dev/null 2>"$TMP/badid.err"
expect "bad IPv4 identification setting explained" "$TMP/badid.err" 'SOFTVERBS_IPV4_ID="all" is not valid \(gso or any\)'
printf 'link_layer = roce\nmtu = 1024\n' >"$TMP/sv.conf"
SOFTVERBS_CONFIG="$TMP/sv.conf" ibv_devinfo >"$TMP/conf" 2>&1
expect "config file: link layer" "$TMP/conf" 'link_layer:\s+Ethernet'
expect "config file: mtu" "$TMP/conf" 'active_mtu:\s+1024'
finish
