#!/bin/bash
# softverbs installed, as a new user would have it: `cmake --install` into
# a prefix, and the Debian package (`cpack -G DEB`) installed with apt
# (as root; otherwise unpacked).  Each is used with no build tree on the
# path: `softverbs run -- ibv_devinfo` and an ib_write_lat pair.  The
# system's libibverbs.so.1 must be untouched.  Port window 19700-19799.
. "$(dirname "$0")/lib.sh"
port=$((19700 + RANDOM % 90))
sys=/usr/lib/x86_64-linux-gnu/libibverbs.so.1
sys_sum=$(md5sum "$(readlink -f $sys)" 2>/dev/null)

# use WHAT SOFTVERBS: the installed command on its own.
use() {
	local what=$1 sv=$2
	env -u LD_LIBRARY_PATH -u SV_BUILD "$sv" run --no-view -- ibv_devinfo >"$TMP/di" 2>&1
	expect "$what: softverbs run -- ibv_devinfo" "$TMP/di" 'hca_id:\s+softverbs0'
	env -u LD_LIBRARY_PATH "$sv" run --no-view -- sh -c 'echo "$LD_LIBRARY_PATH"' >"$TMP/lp" 2>&1
	if grep -q "$SV_BUILD" "$TMP/lp"; then bad "$what: the build tree is on the path"
	else ok "$what: library from $(cut -d: -f1 "$TMP/lp")"; fi
	env -u LD_LIBRARY_PATH timeout -k 5 60 "$sv" run -- ib_write_lat -p $port -n 2000 >"$TMP/isrv" 2>&1 &
	local srv=$!
	wait_listen $port
	env -u LD_LIBRARY_PATH timeout -k 5 60 "$sv" run -- ib_write_lat -p $port -n 2000 localhost \
		>"$TMP/icli" 2>&1
	local crc=$?
	wait $srv
	local src=$?
	port=$((port + 1))
	[ $crc -eq 0 ] && [ $src -eq 0 ] && ok "$what: ib_write_lat, two processes" ||
		{ bad "$what: ib_write_lat (client rc $crc, server rc $src)"; tail -3 "$TMP/icli"; }
}

# A prefix: the library in a directory of its own, never in PREFIX/lib.
P="$TMP/prefix"
cmake --install "$SV_BUILD" --prefix "$P" >"$TMP/install.log" 2>&1 &&
	ok "cmake --install --prefix" || bad "cmake --install: $(tail -3 "$TMP/install.log")"
[ -f "$P/lib/softverbs/libibverbs.so.1" ] && [ ! -e "$P/lib/libibverbs.so.1" ] &&
	ok "prefix: lib/softverbs/libibverbs.so.1 only" || bad "prefix: library not in lib/softverbs"
[ -f "$P/share/man/man1/softverbs.1" ] && ok "prefix: the man page" || bad "prefix: no man page"
# man is Debian's: no sanitizer runtime for it.
env -u LD_PRELOAD man -l "$P/share/man/man1/softverbs.1" 2>/dev/null | col -b >"$TMP/man"
expect "man page renders" "$TMP/man" 'softverbs run'
missing=""
for v in CONFIG LINK_LAYER DEVICES DEVICE_NAME MTU LID VENDOR_PART_ID EXPLAIN LOG REGISTRY COPY ASSIST; do
	grep -q "SOFTVERBS_$v" "$TMP/man" || missing="$missing SOFTVERBS_$v"
done
[ -z "$missing" ] && ok "man page: every SOFTVERBS_* setting" || bad "man page lacks$missing"
use "prefix" "$P/bin/softverbs"

# The Debian package scripts/build.sh made with `cpack -G DEB` (made
# there, not here: cpack first brings the build tree up to date, which a
# test must not do while others run from it).
deb=$(ls -t "$SV_BUILD"/softverbs_*.deb 2>/dev/null | head -1)
[ -n "$deb" ] && [ "$deb" -nt "$SV_BUILD/lib/libibverbs.so.1" ] && ok "package: $(basename "$deb")" ||
	bad "no package newer than the library in $SV_BUILD (scripts/build.sh makes it)"
if [ -n "$deb" ] && [ "$(id -u)" -eq 0 ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$deb" >"$TMP/apt.log" 2>&1 &&
		ok "apt install ./$(basename "$deb")" || bad "apt install: $(tail -3 "$TMP/apt.log")"
	[ -f /usr/lib/softverbs/libibverbs.so.1 ] && ok "package: /usr/lib/softverbs/libibverbs.so.1" ||
		bad "package: library missing"
	use "package" /usr/bin/softverbs
	env -u LD_PRELOAD man -w softverbs >/dev/null 2>&1 && ok "package: man softverbs" || bad "package: no man page"
	DEBIAN_FRONTEND=noninteractive apt-get remove -y -q softverbs >"$TMP/rm.log" 2>&1 &&
		ok "apt remove softverbs" || bad "apt remove: $(tail -3 "$TMP/rm.log")"
elif [ -n "$deb" ]; then
	dpkg-deb -x "$deb" "$TMP/x" && use "package (unpacked)" "$TMP/x/usr/bin/softverbs"
fi
[ "$(md5sum "$(readlink -f $sys)" 2>/dev/null)" = "$sys_sum" ] &&
	ok "the system's libibverbs.so.1 is untouched" || bad "the system's libibverbs.so.1 changed"
finish
