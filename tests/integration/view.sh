#!/bin/bash
# The view `softverbs run` gives a command -- /dev/infiniband/uverbsN and
# /sys/class/infiniband{,_verbs} -- as root and as an unprivileged user,
# processes in views reaching each other by CMA, and `softverbs setup`
# making the same entries for every process (here inside a mount
# namespace of the test's own, so the host is left as it was).
# Port window 19600-19699.
. "$(dirname "$0")/lib.sh"
SV="$SV_BUILD/bin/softverbs"
port=$((19600 + RANDOM % 90))

check_view() {	# WHO SOFTVERBS-BINARY [RUNNER...]
	local who=$1 sv=$2
	shift 2
	"$@" "$sv" run -- sh -c 'stat -c "%F" /dev/infiniband/uverbs0;
		cat /sys/class/infiniband/softverbs0/ports/1/state
		cat /sys/class/infiniband/softverbs0/ports/1/link_layer
		cat /sys/class/infiniband/softverbs0/ports/1/gids/0
		cat /sys/class/infiniband/softverbs0/node_type
		cat /sys/class/infiniband_verbs/uverbs0/ibdev
		cat /sys/class/infiniband_verbs/abi_version
		ls /sys/class/net; echo written >/dev/null && echo devnull-ok' >"$TMP/view" 2>&1
	expect "$who: /dev/infiniband/uverbs0 is a character device" "$TMP/view" '^character special file$'
	expect "$who: port state" "$TMP/view" '^4: ACTIVE$'
	expect "$who: link layer" "$TMP/view" '^InfiniBand$'
	expect "$who: GID 0" "$TMP/view" '^fe80:0000:0000:0000:5356:'
	expect "$who: node type" "$TMP/view" '^1: CA$'
	expect "$who: infiniband_verbs/uverbs0/ibdev" "$TMP/view" '^softverbs0$'
	expect "$who: the host's classes are still there" "$TMP/view" '^lo$'
	expect "$who: the host's devices still work" "$TMP/view" '^devnull-ok$'
}

SOFTVERBS_LINK_LAYER=ib check_view "run (as $(id -un))" "$SV"
[ ! -e /dev/infiniband ] && ok "the host has no /dev/infiniband afterwards" ||
	bad "/dev/infiniband appeared on the host"
SOFTVERBS_LINK_LAYER=roce "$SV" run -- sh -c 'ls /sys/class/infiniband/softverbs0/device/net;
	cat /sys/class/infiniband/softverbs0/ports/1/gid_attrs/types/1' >"$TMP/roce" 2>&1
expect "RoCE: device/net names the GIDs' interface" "$TMP/roce" '^lo$'
expect "RoCE: GID types" "$TMP/roce" '^RoCE v2$'
"$SV" run --no-view -- sh -c 'test -e /dev/infiniband && echo there || echo absent' >"$TMP/nov" 2>&1
expect "run --no-view: no view" "$TMP/nov" '^absent$'

# Unprivileged: a user namespace with the view; two processes in views
# copy by CMA (they share the user's one view).
if [ "$(id -u)" -eq 0 ]; then
	U=$(mktemp -d /tmp/svview.XXXXXX)
	mkdir "$U/bin" "$U/lib"
	cp "$SV" "$U/bin/" && cp -L "$SV_BUILD/lib/libibverbs.so.1" "$U/lib/"
	chmod -R a+rX "$U"
	AS=(setpriv --reuid=65534 --regid=65534 --clear-groups env
	    SOFTVERBS_REGISTRY="${SOFTVERBS_REGISTRY:-sv}-nobody" SOFTVERBS_LINK_LAYER=ib)
	USV="$U/bin/softverbs"
else
	AS=(env)
	USV="$SV"
fi
if [ ${#AS[@]} -gt 1 ] || [ "$(id -u)" -ne 0 ]; then
	check_view "run (unprivileged)" "$USV" "${AS[@]}"
	(cd /tmp && "${AS[@]}" timeout -k 5 60 "$USV" run -- ib_write_lat -p $port -D 3 >"$TMP/wsrv.log" 2>&1) &
	srv=$!
	wait_listen $port
	(cd /tmp && "${AS[@]}" timeout -k 5 60 "$USV" run -- ib_write_lat -p $port -D 3 localhost \
		>"$TMP/wcli.log" 2>&1) &
	cli=$!
	sleep 1.5
	(cd /tmp && "${AS[@]}" "$USV" status) >"$TMP/ustatus" 2>&1
	wait $cli; crc=$?
	wait $srv; src=$?
	[ $crc -eq 0 ] && [ $src -eq 0 ] && ok "ib_write_lat between two unprivileged views" ||
		bad "ib_write_lat between views (client rc $crc, server rc $src)"
	# Columns: ENDPOINT PID DEVICE QPS LOCAL DIRECT CMA BOUNCE ...
	cma=$(awk '$3 == "softverbs0" && $7 > 0 { n++ } END { print n + 0 }' "$TMP/ustatus")
	bounce=$(awk '$3 == "softverbs0" && $8 > 0 { n++ } END { print n + 0 }' "$TMP/ustatus")
	[ "$cma" -ge 2 ] && [ "$bounce" -eq 0 ] && ok "both views' processes copy by CMA" ||
		{ bad "views: $cma endpoints with CMA bytes, $bounce with bounce bytes"; cat "$TMP/ustatus"; }
	[ -n "${U:-}" ] && rm -rf "$U"
fi

# Host-wide, as root: in a mount namespace of this test's own, over a /dev
# of its own, so that nothing of the host changes.
if [ "$(id -u)" -eq 0 ]; then
	unshare -m --propagation private bash -c '
		shm=$(mktemp -d) && mount --rbind /dev/shm "$shm" &&
		mount -t tmpfs tmpfs /dev && mknod -m 666 /dev/null c 1 3 && mkdir /dev/shm &&
		mount --move "$shm" /dev/shm && rmdir "$shm" || exit 9
		"$0" setup || exit 1
		stat -c "%F %t:%T %a" /dev/infiniband/uverbs0
		ucx_info -d 2>/dev/null | grep "Memory domain: softverbs0"
		ls /sys/class/infiniband /sys/class/net
		"$0" setup --remove || exit 2
		test -e /sys/class/infiniband && echo still-there || echo removed' "$SV" >"$TMP/setup" 2>&1
	rc=$?
	[ $rc -eq 0 ] && ok "setup and setup --remove" || bad "setup (rc $rc): $(head -3 "$TMP/setup")"
	expect "setup: a uverbs character device 231:192, mode 666" "$TMP/setup" \
		'^character special file e7:c0 666$'
	expect "setup: UCX sees softverbs0 without softverbs run" "$TMP/setup" 'Memory domain: softverbs0'
	expect "setup: /sys/class/infiniband lists softverbs0" "$TMP/setup" '^softverbs0$'
	expect "setup: the host's classes are still there" "$TMP/setup" '^lo$'
	expect "setup --remove: gone" "$TMP/setup" '^removed$'
fi
finish
