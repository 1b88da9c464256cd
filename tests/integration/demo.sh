#!/bin/bash
# The examples as a user runs them: both sides of rdma_demo, in IB and RoCE
# mode, with explain mode; the outcome of every step is checked.
. "$(dirname "$0")/lib.sh"
port=$((19200 + RANDOM % 200))
for ll in ib roce; do
	export SOFTVERBS_LINK_LAYER=$ll SOFTVERBS_EXPLAIN=1
	"$SV_BUILD/bin/rdma_demo" server $port >"$TMP/s.out" 2>"$TMP/s.err" &
	srv=$!
	wait_listen $port || bad "$ll: demo server never listened"
	timeout -k 5 60 "$SV_BUILD/bin/rdma_demo" client localhost $port >"$TMP/c.out" 2>"$TMP/c.err"
	rc=$?
	wait $srv
	[ $rc -eq 0 ] && [ $? -eq 0 ] && ok "$ll: rdma_demo ran" || bad "$ll: rdma_demo rc $rc"
	expect "$ll: SEND landed" "$TMP/s.out" 'received 16 bytes: "hello over SEND" \(success\)'
	expect "$ll: WRITE landed" "$TMP/s.out" 'memory now holds "written by the client" and counter 30'
	expect "$ll: READ came back" "$TMP/c.out" 'READ it back: "written by the client" \(success\)'
	expect "$ll: atomics" "$TMP/c.out" 'old value 20 \(success\)'
	expect "$ll: SEND without RECV" "$TMP/c.out" 'SEND with no receive posted: RNR retry counter exceeded \(status 13\)'
	expect "$ll: WRITE without RECV" "$TMP/c.out" 'WRITE, still no receive posted: success'
	expect "$ll: dead rkey" "$TMP/c.out" 'remote access error \(status 10\)'
	expect "$ll: explained: dead rkey" "$TMP/c.err" 'rkey 0x[0-9a-f]+ was deregistered [0-9.]+ ms ago by pid [0-9]+'
	expect "$ll: explained: RNR" "$TMP/c.err" 'RNR retry counter exceeded \(RNR_EXHAUSTED\)'
	expect "$ll: skipped INIT" "$TMP/c.out" 'skipping INIT: Invalid argument'
	port=$((port + 1))
done
finish
