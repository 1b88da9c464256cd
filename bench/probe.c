/* SPDX-License-Identifier: MIT */
/*
 * The machine's limits, measured the way bench/run.py compares against:
 *
 *   sv_probe pingpong N     cache-line hand-off between two processes
 *                           (fork, shared mapping, one line each way),
 *                           one-way ns over the best 10k-round-trip batch
 *   sv_probe cma SIZE N     process_vm_writev of SIZE bytes into a child,
 *                           ns per call and GB/s
 *   sv_probe memcpy SIZE N  memcpy of SIZE bytes, GB/s
 *   sv_probe qpmem N        /dev/shm bytes a softverbs context spends per
 *                           idle RC QP of depth 1, above its queues
 *   sv_probe idle SECONDS   CPU use of a process whose two RC QPs are
 *                           connected to each other through the first
 *                           IPv4-mapped GID (over UDP with
 *                           SOFTVERBS_TRANSPORT=udp), after one SEND
 *                           crossed, while the application sleeps
 *   sv_probe udp_floor server|client PEER SELF PORT N
 *                           the kernel's floor for a RoCEv2 ping-pong
 *                           across hosts: what ib_send_lat's exchange
 *                           costs with no verbs work between the system
 *                           calls.  Each way, one UDP GSO datagram of two
 *                           segments (an 8-byte SEND, 24 bytes, and the
 *                           previous one's ACK, 20), sent and received on
 *                           dual-stack sockets with the ancillary data
 *                           softverbs sends and asks for, read by a busy
 *                           recvmmsg; the client prints the median
 *                           one-way microseconds of N round trips
 *   sv_probe rss CMD ...    runs CMD and prints its peak RSS on stderr;
 *                           a small launcher, because a process's maxrss
 *                           keeps the high-water mark of whatever forked it
 *                           (a Python harness's, say) across exec
 *
 * Each prints key=value lines.  The ping-pong also tells bench/run.py
 * which of the host's two core placements ("regimes") a run was in.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

static double now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void pin(int cpu)
{
	cpu_set_t s;

	CPU_ZERO(&s);
	CPU_SET(cpu % (int)sysconf(_SC_NPROCESSORS_ONLN), &s);
	sched_setaffinity(0, sizeof(s), &s);
}

static int pingpong(long n)
{
	struct lines { _Alignas(64) _Atomic long ping; _Alignas(64) _Atomic long pong; } *l;
	const long batch = 10000;
	double best = 1e18;

	l = mmap(NULL, sizeof(*l), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	memset(l, 0, sizeof(*l));
	pid_t pid = fork();
	if (!pid) {
		pin(1);
		for (long i = 1; i <= n; i++) {
			while (atomic_load_explicit(&l->ping, memory_order_acquire) != i)
				;
			atomic_store_explicit(&l->pong, i, memory_order_release);
		}
		_exit(0);
	}
	pin(0);
	for (long i = 1; i <= n;) {
		double t0 = now_ns();
		long end = i + batch > n + 1 ? n + 1 : i + batch;
		for (; i < end; i++) {
			atomic_store_explicit(&l->ping, i, memory_order_release);
			while (atomic_load_explicit(&l->pong, memory_order_acquire) != i)
				;
		}
		double one_way = (now_ns() - t0) / (double)batch / 2;
		if (one_way < best)
			best = one_way;
	}
	waitpid(pid, NULL, 0);
	printf("pingpong_oneway_ns=%.1f\n", best);
	/* The two placements measured on this kind of machine: ~76 ns
	 * ("near") and ~300 ns ("far"); the threshold sits between. */
	printf("regime=%s\n", best < 150 ? "near" : "far");
	return 0;
}

static int cma(size_t size, long n)
{
	char *buf = aligned_alloc(4096, size);
	int up[2], down[2];	/* child -> parent, parent -> child */

	memset(buf, 1, size);
	if (pipe(up) || pipe(down))
		return 1;
	pid_t pid = fork();
	if (!pid) {
		char *dst = aligned_alloc(4096, size), c;
		memset(dst, 0, size);
		if (write(up[1], &dst, sizeof(dst)) != sizeof(dst))
			_exit(1);
		if (read(down[0], &c, 1) < 0)
			_exit(1);
		_exit(0);
	}
	char *remote;
	if (read(up[0], &remote, sizeof(remote)) != sizeof(remote))
		return 1;
	struct iovec l = { buf, size }, r = { remote, size };
	double t0 = now_ns();
	for (long i = 0; i < n; i++)
		if (process_vm_writev(pid, &l, 1, &r, 1, 0) != (ssize_t)size)
			return perror("process_vm_writev"), 1;
	double per = (now_ns() - t0) / (double)n;
	if (write(down[1], "x", 1) != 1)
		return 1;
	waitpid(pid, NULL, 0);
	printf("cma_size=%zu\ncma_ns_per_call=%.1f\ncma_gbps=%.2f\n", size, per, (double)size / per);
	return 0;
}

static int mcpy(size_t size, long n)
{
	char *a = aligned_alloc(4096, size), *b = aligned_alloc(4096, size);

	memset(a, 1, size);
	memset(b, 2, size);
	double t0 = now_ns();
	for (long i = 0; i < n; i++) {
		memcpy(b, a, size);
		__asm__ volatile("" ::: "memory");
	}
	double per = (now_ns() - t0) / (double)n;
	printf("memcpy_size=%zu\nmemcpy_gbps=%.2f\n", size, (double)size / per);
	return 0;
}

/* Allocated /dev/shm bytes of this process's softverbs segments. */
static long long seg_bytes(void)
{
	char prefix[64];
	long long sum = 0;
	struct dirent *d;
	DIR *dir = opendir("/dev/shm");

	snprintf(prefix, sizeof(prefix), "softverbs-%u-seg-%d-", (unsigned)getuid(), (int)getpid());
	while (dir && (d = readdir(dir))) {
		char path[512];
		struct stat st;
		if (strncmp(d->d_name, prefix, strlen(prefix)))
			continue;
		snprintf(path, sizeof(path), "/dev/shm/%s", d->d_name);
		if (!stat(path, &st))
			sum += (long long)st.st_blocks * 512;
	}
	if (dir)
		closedir(dir);
	return sum;
}

static int qpmem(long n)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *ctx = l && l[0] ? ibv_open_device(l[0]) : NULL;

	if (!ctx)
		return fprintf(stderr, "sv_probe: no softverbs device\n"), 1;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	long long before = seg_bytes();
	for (long i = 0; i < n; i++) {
		struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					       .cap = { 1, 1, 1, 1, 0 } };
		if (!ibv_create_qp(pd, &ia))
			return perror("ibv_create_qp"), 1;
	}
	long long after = seg_bytes();
	printf("qps=%ld\nshm_bytes_per_idle_qp=%.0f\n", n, (double)(after - before) / (double)n);
	ibv_close_device(ctx);
	ibv_free_device_list(l);
	return 0;
}

static int idle_fail(const char *what)
{
	fprintf(stderr, "sv_probe idle: %s\n", what);
	return 1;
}

static int idle_to_rts(struct ibv_qp *qp, const union ibv_gid *gid, int gidx, uint32_t dqpn)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };

	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dqpn,
				  .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
				  .ah_attr = { .is_global = 1, .port_num = 1,
					       .grh = { .dgid = *gid, .sgid_index = (uint8_t)gidx,
							.hop_limit = 64 } } };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				  .rnr_retry = 7, .max_rd_atomic = 1 };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static int idle(long seconds)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *ctx = l && l[0] ? ibv_open_device(l[0]) : NULL;
	union ibv_gid gid;
	int gidx = -1;

	if (!ctx)
		return idle_fail("no softverbs device");
	for (int i = 0; i < 16 && gidx < 0; i++) {
		static const uint8_t v4[12] = { [10] = 0xff, [11] = 0xff };
		if (!ibv_query_gid(ctx, 1, i, &gid) && !memcmp(gid.raw, v4, sizeof(v4)))
			gidx = i;
	}
	if (gidx < 0)
		return idle_fail("no IPv4-mapped GID (RoCE mode: SOFTVERBS_LINK_LAYER=roce)");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	static char buf[64];
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_qp *qp[2];
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					       .cap = { 1, 1, 1, 1, 0 } };
		if (!cq || !mr || !(qp[i] = ibv_create_qp(pd, &ia)))
			return idle_fail("could not create the QPs");
	}
	if (idle_to_rts(qp[0], &gid, gidx, qp[1]->qp_num) || idle_to_rts(qp[1], &gid, gidx, qp[0]->qp_num))
		return idle_fail("could not connect the QPs");
	struct ibv_sge sge = { (uintptr_t)buf, 8, mr->lkey };
	struct ibv_recv_wr rw = { .sg_list = &sge, .num_sge = 1 }, *brw;
	struct ibv_send_wr sw = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bsw;
	if (ibv_post_recv(qp[1], &rw, &brw) || ibv_post_send(qp[0], &sw, &bsw))
		return idle_fail("could not post the SEND");
	struct ibv_wc wc;
	int got = 0;
	for (double t0 = now_ns(); got < 2 && now_ns() - t0 < 5e9;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n > 0 && wc.status != IBV_WC_SUCCESS)
			return idle_fail(ibv_wc_status_str(wc.status));
		got += n > 0;
	}
	if (got < 2)
		return idle_fail("the SEND did not complete in 5 s");
	/* Let the progress thread settle (ACKs, timers), then sample. */
	sleep(1);
	double c0 = cpu_s(), w0 = now_ns();
	sleep((unsigned)seconds);
	double c1 = cpu_s(), w1 = now_ns();
	printf("idle_seconds=%.1f\nidle_cpu_s=%.4f\nidle_cpu_pct=%.3f\n", (w1 - w0) / 1e9, c1 - c0,
	       100.0 * (c1 - c0) / ((w1 - w0) / 1e9));
	return 0;
}

static int dcmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void mapped(const char *v4, struct in6_addr *a)
{
	char m[64];

	snprintf(m, sizeof(m), "::ffff:%s", v4);
	inet_pton(AF_INET6, m, a);
}

/* One GSO datagram of the two segments to `to`, from `src`, with the
 * source, TOS and TTL as ancillary data (softverbs' udp.c, fault.c). */
static void floor_send(int fd, const struct sockaddr_in6 *to, const struct in6_addr *src)
{
	static char pkt[24 + 20];
	struct iovec v = { pkt, sizeof(pkt) };
	union { struct cmsghdr a; char b[256]; } c;
	struct msghdr m = { .msg_name = (void *)to, .msg_namelen = sizeof(*to), .msg_iov = &v,
			    .msg_iovlen = 1, .msg_control = c.b, .msg_controllen = sizeof(c.b) };
	struct in6_pktinfo pi = { .ipi6_addr = *src };
	int tos = 0, ttl = 64;
	uint16_t seg = 24;
	struct cmsghdr *h = CMSG_FIRSTHDR(&m);

	memset(c.b, 0, sizeof(c.b));
	h->cmsg_level = IPPROTO_IPV6, h->cmsg_type = IPV6_PKTINFO, h->cmsg_len = CMSG_LEN(sizeof(pi));
	memcpy(CMSG_DATA(h), &pi, sizeof(pi));
	h = CMSG_NXTHDR(&m, h);
	h->cmsg_level = IPPROTO_IP, h->cmsg_type = IP_TOS, h->cmsg_len = CMSG_LEN(sizeof(tos));
	memcpy(CMSG_DATA(h), &tos, sizeof(tos));
	h = CMSG_NXTHDR(&m, h);
	h->cmsg_level = IPPROTO_IP, h->cmsg_type = IP_TTL, h->cmsg_len = CMSG_LEN(sizeof(ttl));
	memcpy(CMSG_DATA(h), &ttl, sizeof(ttl));
	h = CMSG_NXTHDR(&m, h);
	h->cmsg_level = SOL_UDP, h->cmsg_type = UDP_SEGMENT, h->cmsg_len = CMSG_LEN(sizeof(seg));
	memcpy(CMSG_DATA(h), &seg, sizeof(seg));
	m.msg_controllen = (size_t)((char *)h - c.b) + CMSG_SPACE(sizeof(seg));
	struct mmsghdr mm = { .msg_hdr = m };
	if (sendmmsg(fd, &mm, 1, 0) != 1)
		perror("sv_probe udp_floor: sendmmsg");
}

/* Busy reads until a datagram comes; false if none by `until` (ns). */
static bool floor_recv(int fd, double until)
{
	static char buf[16][2048], ctl[16][256];
	static struct sockaddr_in6 from[16];
	struct iovec v[16];
	struct mmsghdr m[16];

	for (;;) {
		for (int i = 0; i < 16; i++) {
			v[i] = (struct iovec){ buf[i], sizeof(buf[i]) };
			m[i].msg_hdr = (struct msghdr){ .msg_name = &from[i], .msg_namelen = sizeof(from[i]),
							.msg_iov = &v[i], .msg_iovlen = 1,
							.msg_control = ctl[i], .msg_controllen = sizeof(ctl[i]) };
		}
		if (recvmmsg(fd, m, 16, MSG_DONTWAIT, NULL) > 0)
			return true;
		if (until && now_ns() > until)
			return false;
	}
}

static int udp_floor(const char *role, const char *peer, const char *self, int port, long n)
{
	bool server = !strcmp(role, "server");
	int one = 1, zero = 0;
	int rx = socket(AF_INET6, SOCK_DGRAM, 0), tx = socket(AF_INET6, SOCK_DGRAM, 0);
	struct sockaddr_in6 any = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port) };
	struct sockaddr_in6 to = any, eph = { .sin6_family = AF_INET6 };
	struct in6_addr src;
	static const int rxopts[][2] = {
		{ IPPROTO_IP, IP_PKTINFO }, { IPPROTO_IP, IP_RECVTOS }, { IPPROTO_IP, IP_RECVTTL },
		{ IPPROTO_IPV6, IPV6_RECVPKTINFO }, { IPPROTO_IPV6, IPV6_RECVTCLASS },
		{ IPPROTO_IPV6, IPV6_RECVHOPLIMIT }, { SOL_UDP, UDP_GRO },
	};

	mapped(peer, &to.sin6_addr);
	mapped(self, &src);
	setsockopt(rx, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	setsockopt(tx, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	for (size_t i = 0; i < sizeof(rxopts) / sizeof(rxopts[0]); i++)
		setsockopt(rx, rxopts[i][0], rxopts[i][1], &one, sizeof(one));
	if (bind(rx, (struct sockaddr *)&any, sizeof(any)) ||
	    bind(tx, (struct sockaddr *)&eph, sizeof(eph))) {
		perror("sv_probe udp_floor: bind");
		return 1;
	}
	pin(server ? 1 : 0);
	if (server) {
		for (;;) {
			if (!floor_recv(rx, now_ns() + 2e9))
				return 0;	/* the client is done */
			floor_send(tx, &to, &src);
		}
	}
	double *lat = calloc((size_t)n, sizeof(*lat));
	/* A first exchange, sent again until the server is up. */
	for (int k = 0; k < 50; k++) {
		floor_send(tx, &to, &src);
		if (floor_recv(rx, now_ns() + 1e8))
			break;
	}
	for (long i = 0; i < n; i++) {
		double t0 = now_ns();
		floor_send(tx, &to, &src);
		floor_recv(rx, 0);
		lat[i] = (now_ns() - t0) / 2e3;
	}
	qsort(lat, (size_t)n, sizeof(*lat), dcmp);
	printf("udp_floor_oneway_us=%.2f\n", lat[n / 2]);
	free(lat);
	return 0;
}

static int rss(char **argv)
{
	struct rusage ru;
	int status;
	pid_t pid = fork();

	if (!pid) {
		execvp(argv[0], argv);
		_exit(127);
	}
	if (wait4(pid, &status, 0, &ru) != pid)
		return 1;
	fprintf(stderr, "sv_probe_peak_rss_kib=%ld\n", ru.ru_maxrss);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "rss"))
		return rss(argv + 2);
	if (argc >= 3 && !strcmp(argv[1], "pingpong"))
		return pingpong(atol(argv[2]));
	if (argc >= 4 && !strcmp(argv[1], "cma"))
		return cma((size_t)atol(argv[2]), atol(argv[3]));
	if (argc >= 4 && !strcmp(argv[1], "memcpy"))
		return mcpy((size_t)atol(argv[2]), atol(argv[3]));
	if (argc >= 3 && !strcmp(argv[1], "qpmem"))
		return qpmem(atol(argv[2]));
	if (argc >= 3 && !strcmp(argv[1], "idle"))
		return idle(atol(argv[2]));
	if (argc >= 7 && !strcmp(argv[1], "udp_floor"))
		return udp_floor(argv[2], argv[3], argv[4], atoi(argv[5]), atol(argv[6]));
	fprintf(stderr, "usage: sv_probe pingpong N | cma SIZE N | memcpy SIZE N | qpmem N | idle SECONDS | "
		"udp_floor server|client PEER SELF PORT N | rss CMD...\n");
	return 2;
}
