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
