#!/bin/bash
# own_netns.sh CMD [ARGS...]: runs a test in a network namespace of its own,
# with lo up.  RoCEv2 goes to UDP port 4791, which every softverbs context
# of a namespace shares (transport/udp/udp.c); tests run in parallel, each
# with a registry of its own, would otherwise take each other's packets.
# A host is a network namespace, so this is a host of the test's own.
set -euo pipefail
if [ -z "${SV_OWN_NETNS:-}" ]; then
	export SV_OWN_NETNS=1
	if [ "$(id -u)" = 0 ] && unshare -n true 2>/dev/null; then
		exec unshare -n "$0" "$@"
	elif unshare -rn true 2>/dev/null; then
		exec unshare -rn "$0" "$@"
	fi
	echo "own_netns.sh: no private network namespace here; running in this one" >&2
	exec "$@"
fi
# Here only after unshare: the namespace is the test's, which a test that
# sets up interfaces checks (SV_NETNS_PRIVATE).
export SV_NETNS_PRIVATE=1
ip link set lo up
exec "$@"
