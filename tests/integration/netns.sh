# shellcheck shell=bash
# Network namespaces as test hosts, for the integration scripts (udp.sh):
# make and remove them, join two with a veth pair, run a program in one,
# read its counters.  Source after lib.sh; every function needs root.
#
# A namespace made here is named PREFIX-PID (PID: the script that made it),
# so that ns_sweep can tell the leftovers of a killed run (a SIGKILL, as
# from ctest's timeout, runs no trap) from those of a run still going.

# ns_sweep PREFIX...: removes the namespaces PREFIX-PID whose PID is gone.
ns_sweep() {
	local ns pre pid
	for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
		for pre in "$@"; do
			case $ns in "$pre"-*) ;; *) continue ;; esac
			pid=${ns#"$pre"-}
			case $pid in '' | *[!0-9]*) continue ;; esac
			kill -0 "$pid" 2>/dev/null && continue
			echo "note: removing namespace $ns, left by a run (pid $pid) that is gone"
			ns_del "$ns"
		done
	done
}

# ns_add NAME: a namespace with lo up and IPv6 off (no router or neighbour
# solicitations, so its interfaces send only what the test makes them send).
ns_add() {
	ip netns add "$1" || return 1
	ns_in "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 \
		net.ipv6.conf.default.disable_ipv6=1 >/dev/null 2>&1
	ip -n "$1" link set lo up
}

# ns_del NAME...: ends what still runs in each namespace (only this script
# starts anything there), then removes it, and with it its veth end.
ns_del() {
	local ns pids
	for ns in "$@"; do
		[ -e "/run/netns/$ns" ] || continue
		pids=$(ip netns pids "$ns" 2>/dev/null)
		if [ -n "$pids" ]; then
			# shellcheck disable=SC2086
			kill $pids 2>/dev/null
			for _ in $(seq 20); do
				[ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
				sleep 0.1
			done
			pids=$(ip netns pids "$ns" 2>/dev/null)
			# shellcheck disable=SC2086
			[ -n "$pids" ] && kill -9 $pids 2>/dev/null
		fi
		ip netns del "$ns" 2>/dev/null
	done
}

# ns_veth NS1 IF1 ADDR1/LEN NS2 IF2 ADDR2/LEN: a veth pair made directly
# inside the two namespaces (its names never exist on the host, so runs
# side by side cannot collide), addressed and up.  The kernel adds the
# connected route of each address; nothing else is routed.
ns_veth() {
	ip link add "$2" netns "$1" type veth peer name "$5" netns "$4" || return 1
	ip -n "$1" addr add "$3" dev "$2" && ip -n "$4" addr add "$6" dev "$5" &&
		ip -n "$1" link set "$2" up && ip -n "$4" link set "$5" up
}

# ns_in NS CMD...: CMD in NS's network stack alone, within 20 s: nsenter
# joins the namespace without the mount namespace and sysfs that `ip netns
# exec` sets up (so CMD reads /proc/net, which is its namespace's, not
# /sys), and the time limit keeps a read of counters from stopping a test
# for good (a test's programs run under `timeout` likewise).
ns_in() {
	local ns=$1
	shift
	timeout -k 2 20 nsenter --net="/run/netns/$ns" "$@"
}

# ns_counters NS IF: "TX_BYTES UDP_OUT UDP6_OUT": the bytes IF has sent
# (the tenth column of /proc/net/dev), and the UDP datagrams the namespace
# has sent over IPv4 and over IPv6 (/proc/net/snmp and snmp6; without IPv6
# the last is 0).  /proc/net is the reader's namespace's.  NS "" is the
# current namespace.
ns_counters() {
	local get='awk -v i="$1" '\''{sub(":", " ")} $1 == i {print $10}'\'' /proc/net/dev; cat /proc/net/snmp; cat /proc/net/snmp6 2>/dev/null'
	if [ -n "$1" ]; then ns_in "$1" sh -c "$get" _ "$2"; else sh -c "$get" _ "$2"; fi 2>/dev/null |
		awk 'NR == 1 {tx = $1}
		     $1 == "Udp:" && !h {for (i = 2; i <= NF; i++) if ($i == "OutDatagrams") c = i; h = 1; next}
		     $1 == "Udp:" && h {out = $c}
		     $1 == "Udp6OutDatagrams" {out6 = $2}
		     END {print (tx == "" ? -1 : tx), (out == "" ? -1 : out), (out6 == "" ? 0 : out6)}'
}

# ns_ipv6 NS IF ADDR/LEN: IPv6 on IF (ns_add turned it off), with ADDR
# and no other address: no EUI-64 link-local (addr_gen_mode 1), no router
# solicitations or advertisements, and no duplicate address detection,
# so that ADDR is usable at once (nodad).
ns_ipv6() {
	ns_in "$1" sysctl -qw "net.ipv6.conf.$2.addr_gen_mode=1" "net.ipv6.conf.$2.accept_dad=0" \
		"net.ipv6.conf.$2.accept_ra=0" "net.ipv6.conf.$2.router_solicitations=0" \
		"net.ipv6.conf.$2.disable_ipv6=0" >/dev/null &&
		ip -n "$1" addr add "$3" dev "$2" nodad
}

# ns_wait_listen NS PORT: until a TCP socket of NS listens on PORT (at most
# 15 s); lib.sh's wait_listen, inside the namespace.
ns_wait_listen() {
	local hex
	hex=$(printf ':%04X ' "$2")
	ns_in "$1" bash -c '
		for _ in $(seq 150); do
			grep -q "$1.* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null && exit 0
			sleep 0.1
		done
		exit 1' _ "$hex"
}

# ns_gid_index NS ADDR ENV...: the index of the RoCE v2 GID of ADDR in
# `ibv_devinfo -v` run in NS ("" for here) with ENV; nothing if none.  An
# IPv4 ADDR's GID is ::ffff:ADDR; an IPv6 one's is ADDR itself, as
# inet_ntop writes it (compressed: 2001:2::1).
ns_gid_index() {
	local ns=$1 ip=$2 pre=() gid
	shift 2
	[ -n "$ns" ] && pre=(timeout -k 2 30 ip netns exec "$ns")
	case $ip in *:*) gid=$ip ;; *) gid=::ffff:$ip ;; esac
	"${pre[@]}" env "$@" ibv_devinfo -v 2>/dev/null |
		sed -nE "s/^[[:space:]]*GID\[ *([0-9]+)\]:[[:space:]]+${gid//./\\.}, RoCE v2.*/\1/p" | head -1
}

# job_tree PID: PID and every process below it, parents first.  The
# children come from /proc/PID/task/*/children, read by the shell itself:
# an external tool would inherit the ASan build's LD_PRELOAD, under which
# procps' pgrep and pkill hang for good in a futex (seen in CI: the tests
# stopped in the job_kill of a server until ctest's 900 s ran out).
job_tree() {
	local c f kids=""
	echo "$1"
	for f in /proc/"$1"/task/*/children; do
		c=()
		read -r -a c 2>/dev/null <"$f"	# no newline at its end: read says 1
		kids="$kids ${c[*]:-}"
	done
	for c in $kids; do job_tree "$c"; done
}

# job_kill PID...: ends background jobs started as `func ... &`: each is a
# subshell waiting on its command (a timeout wrapper, which passes the
# signal on), and killing the subshell alone would leave the command
# running, holding its sockets, until its timeout.  TERM first; whatever
# is still there after 3 s is named, with its state and where it waits,
# and killed, so that a program that does not end on TERM shows up in the
# log instead of hanging the test.
job_kill() {
	local p q tree left
	for p in "$@"; do
		tree=$(job_tree "$p")
		# shellcheck disable=SC2086
		kill -TERM $tree 2>/dev/null
		for _ in $(seq 30); do
			left=""
			for q in $tree; do job_alive "$q" && left="$left $q"; done
			[ -z "$left" ] && break
			sleep 0.1
		done
		for q in $left; do
			job_alive "$q" || continue
			# stat and wchan, not cmdline or status: those take the
			# process's memory lock, which a stuck process may hold.
			echo "note: pid $q did not end on TERM: $(cut -d' ' -f2,3 "/proc/$q/stat" 2>/dev/null)," \
				"waiting in $(cat "/proc/$q/wchan" 2>/dev/null); killed"
			kill -KILL "$q" 2>/dev/null
		done
		wait "$p" 2>/dev/null
	done
	return 0
}

# job_alive PID: PID runs (a zombie, which only waits to be reaped, does not).
job_alive() {
	local st
	st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
	[ -n "$st" ] && [ "$st" != Z ]
}

# ns_traps FUNC: FUNC runs on every exit (also ^C, TERM, HUP), so that no
# namespace outlives the test.
ns_traps() {
	trap "$1" EXIT
	trap 'echo "interrupted"; exit 130' INT
	trap 'exit 143' TERM
	trap 'exit 129' HUP
}

# section NAME: starts a timed section ("time: NAME: N s" when it ends).
sec_name="" sec_t0=0
section() {
	[ -n "$sec_name" ] && echo "time: $sec_name: $((SECONDS - sec_t0)) s"
	sec_name=$1 sec_t0=$SECONDS
	[ -n "$1" ] && echo "== $1"
}
