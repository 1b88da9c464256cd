#!/bin/bash
# Debian's ibverbs-utils on softverbs: ibv_devices, ibv_devinfo -v in both
# link-layer modes, and ibv_asyncwatch.
. "$(dirname "$0")/lib.sh"

ibv_devices >"$TMP/devices" 2>&1
expect "ibv_devices lists softverbs0" "$TMP/devices" '^\s+softverbs0\s+[0-9a-f]{16}$'

SOFTVERBS_LINK_LAYER=ib ibv_devinfo -v >"$TMP/ib" 2>&1
expect "devinfo: hca_id" "$TMP/ib" 'hca_id:\s+softverbs0'
expect "devinfo: port active" "$TMP/ib" 'state:\s+PORT_ACTIVE \(4\)'
expect "devinfo: InfiniBand link layer" "$TMP/ib" 'link_layer:\s+InfiniBand'
expect "devinfo: a LID" "$TMP/ib" 'port_lid:\s+[1-9][0-9]*'
expect "devinfo: GID 0" "$TMP/ib" 'GID\[  0\]:\s+fe80:0000:0000:0000:5356'
expect "devinfo: board_id via ibv_read_sysfs_file" "$TMP/ib" 'board_id:\s+SOFTVERBS_0'
expect "devinfo: ATOMIC_HCA" "$TMP/ib" 'atomic_cap:\s+ATOMIC_HCA'
expect "devinfo: timestamps" "$TMP/ib" 'completion timestamp_mask:\s+0x[f]+'

SOFTVERBS_LINK_LAYER=roce ibv_devinfo -v >"$TMP/roce" 2>&1
expect "devinfo roce: Ethernet link layer" "$TMP/roce" 'link_layer:\s+Ethernet'
expect "devinfo roce: RoCEv2 loopback GID" "$TMP/roce" 'GID\[ +[0-9]+\]:\s+::ffff:127\.0\.0\.1, RoCE v2'
expect "devinfo roce: link-local RoCEv2 GID" "$TMP/roce" 'GID\[  0\]:\s+fe80::5356.*RoCE v2'

ibv_devinfo -l >"$TMP/list" 2>&1
expect "devinfo -l" "$TMP/list" '1 HCAs? found'
ibv_devinfo -i 2 >"$TMP/badport" 2>&1; rc=$?
[ $rc -ne 0 ] && ok "devinfo -i 2 fails (rc $rc)" || bad "devinfo -i 2 succeeded"

# ibv_asyncwatch shows real port changes only: none at open, then the
# cable pulled and plugged with `softverbs port`.
timeout -k 5 3 ibv_asyncwatch >"$TMP/async" 2>&1 &
watch=$!
sleep 0.5
"$SV_BUILD/bin/softverbs" port softverbs0/1 down >"$TMP/down" 2>&1
ibv_devinfo >"$TMP/downinfo" 2>&1
"$SV_BUILD/bin/softverbs" port softverbs0/1 up >"$TMP/up" 2>&1
wait $watch
expect "asyncwatch: async fd" "$TMP/async" 'softverbs0: async event FD [0-9]+'
expect "port down" "$TMP/down" 'softverbs0/1 down'
expect "devinfo: port down" "$TMP/downinfo" 'state:\s+PORT_DOWN \(1\)'
expect "asyncwatch: PORT_ERR then PORT_ACTIVE" "$TMP/async" \
	'event_type IBV_EVENT_PORT_ERR \(10\), port 1'
expect "asyncwatch: PORT_ACTIVE" "$TMP/async" 'event_type IBV_EVENT_PORT_ACTIVE \(9\), port 1'
if [ "$(grep -c event_type "$TMP/async")" -eq 2 ]; then ok "asyncwatch: two events, none at open"
else bad "asyncwatch: $(grep -c event_type "$TMP/async") events"; fi
finish
