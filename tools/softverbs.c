/* SPDX-License-Identifier: MIT */
/*
 * softverbs: run programs on softverbs (in a view with its device nodes
 * and sysfs entries), list its devices, show the live endpoints of this
 * host, pull or plug a port's cable, and make the view host-wide.
 *
 *   softverbs run [--explain] [--roce] [--log LEVEL] [--no-view] -- CMD [ARGS...]
 *   softverbs setup [--remove]
 *   softverbs devices [-v]
 *   softverbs status
 *   softverbs port DEVICE[/1] up|down
 *   softverbs version
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "guard.h"
#include "sv.h"
#include "view.h"

static int usage(FILE *f, int rc)
{
	fprintf(f,
		"usage: softverbs COMMAND\n"
		"\n"
		"  run [--explain] [--roce] [--log LEVEL] [--no-view] -- CMD [ARGS...]\n"
		"      run CMD with softverbs as its libibverbs.so.1 (no install, no root),\n"
		"      in a view with /dev/infiniband and /sys/class/infiniband (--no-view: not)\n"
		"  setup [--remove]  root: those entries for every process of the host\n"
		"  devices [-v]      list softverbs devices (-v: ports and GIDs)\n"
		"  status            live endpoints and QPs in this host's registry, and\n"
		"                    the rdma_cm ports of this network namespace\n"
		"  port DEV[/1] up|down\n"
		"                    plug or pull the port's cable, for every process of the\n"
		"                    host: contexts get PORT_ACTIVE or PORT_ERR\n"
		"  version           print the version\n"
		"\n"
		"Settings are SOFTVERBS_* variables or a config file; see README.md.\n");
	return rc;
}

/* The library sits in ../lib beside bin/softverbs in the build tree, and
 * in its private directory (SV_LIBDIR_FROM_BIN, relative to bin/) once
 * installed. */
static int find_libdir(char *out, size_t len)
{
	static const char *const rel[] = { "../lib", SV_LIBDIR_FROM_BIN };
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (n < 0)
		return -1;
	exe[n] = 0;
	const char *bin = dirname(exe);
	for (size_t i = 0; i < SV_ARRAY_SIZE(rel); i++) {
		char dir[PATH_MAX + 64], probe[PATH_MAX + 96];
		snprintf(dir, sizeof(dir), "%s/%s", bin, rel[i]);
		snprintf(probe, sizeof(probe), "%s/libibverbs.so.1", dir);
		if (access(probe, R_OK))
			continue;
		char *real = realpath(dir, NULL);
		snprintf(out, len, "%.*s", (int)len - 1, real ? real : dir);
		free(real);
		return 0;
	}
	return -1;
}

static int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "explain", no_argument, NULL, 'e' }, { "roce", no_argument, NULL, 'r' },
		{ "log", required_argument, NULL, 'l' }, { "help", no_argument, NULL, 'h' },
		{ "no-view", no_argument, NULL, 'n' }, { 0 },
	};
	bool view = true;
	char libdir[PATH_MAX], path[2 * PATH_MAX];
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+erl:h", opts, NULL)) != -1) {
		switch (c) {
		case 'e': setenv("SOFTVERBS_EXPLAIN", "1", 1); break;
		case 'r': setenv("SOFTVERBS_LINK_LAYER", "roce", 1); break;
		case 'l': setenv("SOFTVERBS_LOG", optarg, 1); break;
		case 'n': view = false; break;
		case 'h': return usage(stdout, 0);
		default: return usage(stderr, 2);
		}
	}
	if (optind >= argc) {
		fprintf(stderr, "softverbs run: no command given (softverbs run -- CMD ...)\n");
		return 2;
	}
	if (find_libdir(libdir, sizeof(libdir))) {
		fprintf(stderr, "softverbs run: cannot find libibverbs.so.1 in ../lib or %s next "
			"to this program\n", SV_LIBDIR_FROM_BIN);
		return 1;
	}
	/* Programs that look for /dev/infiniband (UCX) run without it, so a
	 * refusal is said once and the command still runs. */
	if (view && sv_view_enter())
		fprintf(stderr, "softverbs run: no /dev/infiniband or /sys/class/infiniband for this "
			"command (%s); verbs work, but UCX and others that look for them will not "
			"see softverbs (see README, \"Device nodes and sysfs\")\n", sv_view_why());
	const char *old = getenv("LD_LIBRARY_PATH");
	snprintf(path, sizeof(path), "%s%s%s", libdir, old && *old ? ":" : "", old ? old : "");
	setenv("LD_LIBRARY_PATH", path, 1);
	execvp(argv[optind], argv + optind);
	fprintf(stderr, "softverbs run: %s: %s\n", argv[optind], strerror(errno));
	return 127;
}

static const char *mtu_str(enum ibv_mtu m)
{
	static const char *const s[] = { "?", "256", "512", "1024", "2048", "4096" };
	return (unsigned)m < SV_ARRAY_SIZE(s) ? s[m] : "?";
}

static void print_gids(struct ibv_context *ctx)
{
	for (int i = 0; i < SV_GID_TBL_LEN; i++) {
		struct ibv_gid_entry e;
		char buf[INET6_ADDRSTRLEN];

		if (ibv_query_gid_ex(ctx, SV_PORT, (uint32_t)i, &e, 0))
			continue;
		inet_ntop(AF_INET6, e.gid.raw, buf, sizeof(buf));
		printf("      GID[%2d] %-40s %s\n", i, buf,
		       e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCEv2" : "IB");
	}
}

static int cmd_devices(int argc, char **argv)
{
	bool verbose = argc > 1 && !strcmp(argv[1], "-v");
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);

	if (!list) {
		perror("softverbs devices");
		return 1;
	}
	if (!n)
		printf("no softverbs devices (SOFTVERBS_DEVICES=0)\n");
	for (int i = 0; i < n; i++) {
		struct ibv_context *ctx = ibv_open_device(list[i]);
		struct ibv_port_attr pa;

		if (!ctx) {
			printf("%-12s cannot open: %s\n", ibv_get_device_name(list[i]), strerror(errno));
			continue;
		}
		ibv_query_port(ctx, SV_PORT, &pa);
		printf("%-12s guid %016llx  port 1 %s  %s  mtu %s  lid %u\n",
		       ibv_get_device_name(list[i]),
		       (unsigned long long)be64toh(ibv_get_device_guid(list[i])),
		       ibv_port_state_str(pa.state),
		       pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE (Ethernet)" : "InfiniBand",
		       mtu_str(pa.active_mtu), pa.lid);
		if (verbose)
			print_gids(ctx);
		ibv_close_device(ctx);
	}
	ibv_free_device_list(list);
	return 0;
}

/* rdma_cm's port space is the abstract sockets "@softverbs-rdmacm:PS:PORT"
 * of this network namespace (src/rdmacm/cm.h): a listening one, an
 * accepted one per connection the listener took, an active id's own. */
static void rdmacm_ports(void)
{
	struct cm_port { unsigned ps, port, listening, connected, bound; } ports[512];
	int n = 0;
	char line[512];
	FILE *f = fopen("/proc/net/unix", "r");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		unsigned flags, st, ps, port;
		char *name = strstr(line, "@softverbs-rdmacm:");

		if (!name || sscanf(line, "%*s %*s %*s %x %*s %x", &flags, &st) != 2 ||
		    sscanf(name, "@softverbs-rdmacm:%x:%u", &ps, &port) != 2)
			continue;
		int i;
		for (i = 0; i < n && (ports[i].ps != ps || ports[i].port != port); i++)
			;
		if (i == n) {
			if (n == (int)SV_ARRAY_SIZE(ports))
				continue;
			ports[n++] = (struct cm_port){ .ps = ps, .port = port };
		}
		if (flags & 0x10000)	/* __SO_ACCEPTCON: listening */
			ports[i].listening = 1;
		else if (st == 3)	/* SS_CONNECTED */
			ports[i].connected++;
		else
			ports[i].bound++;
	}
	fclose(f);
	printf("\nrdma_cm ports of this host (its network namespace): %d\n", n);
	if (n)
		printf("%-6s %-6s %-10s %s\n", "PS", "PORT", "STATE", "CONNECTED");
	for (int i = 0; i < n; i++)
		printf("%-6s %-6u %-10s %u\n", ports[i].ps == 0x106 ? "TCP" : ports[i].ps == 0x111 ?
		       "UDP" : ports[i].ps == 0x13f ? "IB" : "IPOIB", ports[i].port,
		       ports[i].listening ? "listening" : ports[i].connected ? "connected" : "bound",
		       ports[i].connected);
}

/* The endpoint's segment, if its process still owns it. */
static struct shm_hdr *ep_seg(const struct sv_reg_ep_info *eps, int ne, uint32_t ep)
{
	for (int i = 0; i < ne; i++)
		if (eps[i].index == ep)
			return sv_seg_peer(ep, eps[i].pid, eps[i].start_time);
	return NULL;
}

static unsigned long long ld(_Atomic uint64_t *c)
{
	return (unsigned long long)atomic_load_explicit(c, memory_order_relaxed);
}

/* Across hosts: each context's UDP endpoint and each QP's peer, with
 * their packet counters, as the owners publish them in their segments
 * (core/stats.h). */
static void udp_status(const struct sv_reg_ep_info *eps, int ne, const struct sv_reg_qp_info *qps,
		       int nq)
{
	int nu = 0, np = 0;

	for (int i = 0; i < ne; i++) {
		struct shm_hdr *h = sv_seg_peer(eps[i].index, eps[i].pid, eps[i].start_time);
		if (!h || !atomic_load_explicit(&h->pkt.on, memory_order_acquire))
			continue;
		if (!nu++)
			printf("\nUDP endpoints (RoCEv2):\n%-8s %-8s %-5s %12s %9s %9s %9s %9s %9s "
			       "%11s %9s\n", "ENDPOINT", "PID", "PORT", "RX_PKTS", "BAD_ICRC",
			       "NO_OWNER", "FWD_OUT", "FWD_IN", "BAD_HDR", "UNKNOWN_QPN", "BAD_SRC");
		struct sv_pkt_ep_stats *e = &h->pkt;
		printf("%-8u %-8d %-5u %12llu %9llu %9llu %9llu %9llu %9llu %11llu %9llu\n",
		       eps[i].index, eps[i].pid, e->port, ld(&e->rx_pkts), ld(&e->rx_bad_icrc),
		       ld(&e->rx_no_owner), ld(&e->rx_forwarded), ld(&e->rx_fwd_in),
		       ld(&e->drop_bad_hdr), ld(&e->drop_unknown_qpn), ld(&e->drop_bad_src));
	}
	/* PEER/QPN is an IPv4 address or an IPv6 one, up to 39 characters:
	 * the column is as wide as its widest entry. */
	static char peers[SV_HOST_MAX_QP][INET6_ADDRSTRLEN + 16];
	int width = 26;
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < nq; i++) {
			struct shm_hdr *h = ep_seg(eps, ne, qps[i].ep);
			struct shm_qp *sq = h ? sv_seg_qp(h, qps[i].qpn) : NULL;
			if (pass == 0)
				peers[i][0] = 0;	/* shown only if seen on in pass 0 */
			if (!sq || !atomic_load_explicit(&sq->pkt.on, memory_order_acquire) ||
			    (pass == 1 && !peers[i][0]))
				continue;
			struct sv_pkt_qp_stats *q = &sq->pkt;
			char *peer = peers[i];
			if (pass == 0) {
				const uint8_t *a = q->peer;
				snprintf(peer, sizeof(peers[i]), "any");
				if (q->dest_qpn) {
					static const uint8_t v4[12] = { [10] = 0xff, [11] = 0xff };
					if (!memcmp(a, v4, sizeof(v4)))
						snprintf(peer, sizeof(peers[i]), "%u.%u.%u.%u", a[12],
							 a[13], a[14], a[15]);
					else
						inet_ntop(AF_INET6, a, peer, INET6_ADDRSTRLEN);
					size_t l = strlen(peer);
					snprintf(peer + l, sizeof(peers[i]) - l, "/0x%06x", q->dest_qpn);
				}
				if ((int)strlen(peer) > width)
					width = (int)strlen(peer);
				continue;
			}
			if (!np++)
				printf("\nQPs reached by packets:\n%-8s %-*s %-6s %11s %11s %8s %8s %8s "
				       "%8s %8s\n", "QPN", width, "PEER/QPN", "SPORT", "TX_PKTS", "RX_PKTS",
				       "RETRANS", "SEQ_NAKS", "RNR_NAKS", "DUPS", "DROPS");
			printf("0x%06x %-*s %-6u %11llu %11llu %8llu %8llu %8llu %8llu %8llu\n",
			       qps[i].qpn, width, peer, q->sport, ld(&q->tx_pkts), ld(&q->rx_pkts),
			       ld(&q->retrans), ld(&q->naks_seq), ld(&q->rnr_naks), ld(&q->dups),
			       ld(&q->drops));
		}
	}
	if (!nu)
		printf("\nUDP endpoints (RoCEv2): none (no QP of this host reaches another host)\n");
}

static int cmd_status(void)
{
	static struct sv_reg_ep_info eps[SV_HOST_MAX_ENDPOINTS];
	static struct sv_reg_qp_info qps[SV_HOST_MAX_QP];
	int reclaimed = sv_reg_sweep();

	if (reclaimed < 0) {
		fprintf(stderr, "softverbs status: cannot open the host registry %s\n", sv_reg_path());
		return 1;
	}
	int ne = sv_reg_list_eps(eps, (int)SV_ARRAY_SIZE(eps));
	int nq = sv_reg_list_qps(qps, (int)SV_ARRAY_SIZE(qps));

	printf("registry %s: %d endpoints, %d QPs", sv_reg_path(), ne, nq);
	if (reclaimed)
		printf(" (%d stale entries of dead processes reclaimed)", reclaimed);
	printf("\n");
	if (ne > 0)
		printf("\n%-8s %-8s %-10s %-5s %14s %14s %14s %14s %14s %14s\n", "ENDPOINT", "PID",
		       "DEVICE", "QPS", "LOCAL_BYTES", "DIRECT_BYTES", "CMA_BYTES", "BOUNCE_BYTES",
		       "RECEIVER_BYTES", "ASSIST_BYTES");
	for (int i = 0; i < ne; i++) {
		struct sv_device *d = sv_device_at((int)eps[i].dev_index);
		printf("%-8u %-8d %-10s %-5u %14llu %14llu %14llu %14llu %14llu %14llu\n", eps[i].index,
		       eps[i].pid,
		       d ? d->ibdev.name : "?", eps[i].nqps,
		       (unsigned long long)eps[i].bytes[SV_PATH_LOCAL],
		       (unsigned long long)eps[i].bytes[SV_PATH_DIRECT],
		       (unsigned long long)eps[i].bytes[SV_PATH_CMA],
		       (unsigned long long)eps[i].bytes[SV_PATH_BOUNCE],
		       (unsigned long long)eps[i].bytes[SV_PATH_DEFER],
		       (unsigned long long)eps[i].bytes[SV_PATH_ASSIST]);
	}
	if (nq > 0)
		printf("\n%-8s %-6s %-6s %-8s %s\n", "QPN", "TYPE", "STATE", "PID", "ENDPOINT");
	for (int i = 0; i < nq; i++)
		printf("0x%06x %-6s %-6s %-8d %u\n", qps[i].qpn,
		       sv_qp_type_name((enum ibv_qp_type)qps[i].qp_type),
		       sv_qp_state_name((enum ibv_qp_state)qps[i].state), qps[i].pid, qps[i].ep);
	udp_status(eps, ne, qps, nq);
	rdmacm_ports();
	return 0;
}

static int cmd_setup(int argc, char **argv)
{
	bool remove = argc > 1 && !strcmp(argv[1], "--remove");

	if (argc > 2 || (argc == 2 && !remove)) {
		fprintf(stderr, "usage: softverbs setup [--remove]\n");
		return 2;
	}
	if (sv_view_setup_host(remove)) {
		fprintf(stderr, "softverbs setup: %s\n", sv_view_why());
		return 1;
	}
	printf(remove ? "softverbs: /dev/infiniband and /sys/class/infiniband removed\n" :
	       "softverbs: /dev/infiniband and /sys/class/infiniband are there for every process\n");
	return 0;
}

static int cmd_port(int argc, char **argv)
{
	if (argc != 3 || (strcmp(argv[2], "up") && strcmp(argv[2], "down"))) {
		fprintf(stderr, "usage: softverbs port DEVICE[/1] up|down\n");
		return 2;
	}
	char name[IBV_SYSFS_NAME_MAX];
	snprintf(name, sizeof(name), "%s", argv[1]);
	char *slash = strchr(name, '/');
	if (slash) {
		*slash = 0;
		if (strcmp(slash + 1, "1")) {
			fprintf(stderr, "softverbs port: %s has one port, port 1\n", name);
			return 2;
		}
	}
	struct sv_device *d = NULL;
	for (int i = 0; (d = sv_device_at(i)) && strcmp(d->ibdev.name, name); i++)
		;
	if (!d) {
		fprintf(stderr, "softverbs port: no device %s (softverbs devices lists them)\n", name);
		return 1;
	}
	bool up = !strcmp(argv[2], "up");
	int ret = sv_port_set_state(d->index, up);
	if (ret == EALREADY) {
		printf("%s/1 is already %s\n", name, up ? "up" : "down");
		return 0;
	}
	if (ret) {
		fprintf(stderr, "softverbs port: %s\n", strerror(ret));
		return 1;
	}
	printf("%s/1 %s\n", name, up ? "up: PORT_ACTIVE delivered" : "down: PORT_ERR delivered");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage(stderr, 2);
	const char *cmd = argv[1];
	if (!strcmp(cmd, "__guard"))	/* started by the library, never by hand */
		return guard_main();
	if (!strcmp(cmd, "run"))
		return cmd_run(argc - 1, argv + 1);
	if (!strcmp(cmd, "devices"))
		return cmd_devices(argc - 1, argv + 1);
	if (!strcmp(cmd, "status"))
		return cmd_status();
	if (!strcmp(cmd, "port"))
		return cmd_port(argc - 1, argv + 1);
	if (!strcmp(cmd, "setup"))
		return cmd_setup(argc - 1, argv + 1);
	if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
		printf("softverbs %s (rdma-core 44 ABI)\n", SV_VERSION_STRING);
		return 0;
	}
	if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h"))
		return usage(stdout, 0);
	fprintf(stderr, "softverbs: unknown command \"%s\"\n", cmd);
	return usage(stderr, 2);
}
