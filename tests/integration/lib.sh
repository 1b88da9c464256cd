# Shared by the integration tests: run Debian's binaries on the softverbs
# library of the build under test, and report like a test runner.
set -u
: "${SV_BUILD:?SV_BUILD must name the build directory}"
export LD_LIBRARY_PATH="$SV_BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# A sanitizer build of the library needs its runtime loaded first in
# uninstrumented programs; their own leaks are not ours to report.
if [ -n "${SV_ASAN_RT:-}" ]; then
	export LD_PRELOAD="$SV_ASAN_RT"
	export ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0"
fi
SV_PASS=0
SV_FAIL=0
ok() { SV_PASS=$((SV_PASS + 1)); echo "ok: $*"; }
bad() { SV_FAIL=$((SV_FAIL + 1)); echo "FAIL: $*"; }
# expect DESCRIPTION FILE PATTERN: FILE must contain the extended regex.
expect() {
	if grep -qE -- "$3" "$2"; then ok "$1"; else bad "$1 (no /$3/ in output:)"; sed 's/^/    /' "$2" | head -40; fi
}
finish() {
	echo "$SV_PASS passed, $SV_FAIL failed"
	[ "$SV_FAIL" -eq 0 ]
}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# wait_listen PORT: until a TCP socket listens on PORT (at most 15 s).
# Probing by connecting would steal the server's one accept().
wait_listen() {
	local hex
	hex=$(printf ':%04X ' "$1")
	for _ in $(seq 150); do
		grep -q "$hex.* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

# pair PORT DESCRIPTION CMD ARGS...: run CMD as server and client on
# localhost (the server with `-p PORT`), and pass if both exit 0.
pair() {
	local port=$1 what=$2
	shift 2
	timeout -k 5 120 "$@" -p "$port" >"$TMP/srv.log" 2>&1 &
	local srv=$!
	if ! wait_listen "$port"; then
		bad "$what: the server never listened"; kill $srv 2>/dev/null; wait $srv 2>/dev/null
		sed 's/^/    srv: /' "$TMP/srv.log" | tail -5
		return 1
	fi
	timeout -k 5 120 "$@" -p "$port" localhost >"$TMP/cli.log" 2>&1
	local crc=$?
	wait $srv
	pair_verdict "$what" $crc $?
}

# echo_verdict WHAT CLIENT_RC SERVER_RC: tcp_echo's client and server
# both exited 0 and agree on its 8 MiB ($TMP/cli.log, $TMP/srv.log); the
# failure is said, and false returned, otherwise.
echo_verdict() {
	if [ "$2" -ne 0 ] || [ "$3" -ne 0 ]; then
		bad "$1: client rc $2, server rc $3"
		tail -3 "$TMP/cli.log" "$TMP/srv.log" | sed 's/^/    /'
		return 1
	fi
	if ! grep -qE "^client: 8388608 [0-9]+ \(match\)" "$TMP/cli.log"; then
		bad "$1: the server's count and sum do not match"; sed 's/^/    /' "$TMP/cli.log"
		return 1
	fi
}

# fork_verdict WHAT CLIENT_RC SERVER_RC OK_TEXT: echo_verdict, and the
# server (run with SOFTVERBS_LOG=debug) made an RC QP: in librspreload's
# fork mode its child moved the connection to an rsocket.
fork_verdict() {
	echo_verdict "$1" "$2" "$3" || return
	if grep -q "qpn 0x[0-9a-f]*: created RC" "$TMP/srv.log"; then
		ok "$1: $4"
	else
		bad "$1: the data did not go by an RC QP of the server's child"
	fi
}

# pair_verdict WHAT CLIENT_RC SERVER_RC: ok when both exited 0, else the
# failure with what each side said last ($TMP/cli.log, $TMP/srv.log).
pair_verdict() {
	if [ "$2" -eq 0 ] && [ "$3" -eq 0 ]; then
		ok "$1"
		return 0
	fi
	bad "$1 (client rc $2, server rc $3)"
	# perftest's and the pingpongs' address lines come last (stdout is
	# flushed at exit, after the error on stderr): what else was said.
	grep -v ' address: ' "$TMP/cli.log" | sed 's/^/    cli: /' | tail -8
	grep -v ' address: ' "$TMP/srv.log" | sed 's/^/    srv: /' | tail -8
	return 1
}
