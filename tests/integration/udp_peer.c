/* SPDX-License-Identifier: MIT */
/*
 * Both ends of tests/integration/udp_faults.sh: RC peers on two hosts
 * (network namespaces) that talk RoCEv2 over UDP, written against
 * <infiniband/verbs.h> and sockets only, so that what they check is what
 * any verbs program would see.
 *
 *   udp_peer server --addr A --port P [--conns N] [--expect-counter V]
 *   udp_peer MODE --addr B --server A --port P [options]
 *
 * The server registers, in one arena, a 1 MiB data MR (remote read and
 * write), an 8-byte counter (remote atomic) and a page without remote
 * write, each between canary pages that no MR covers; it serves each TCP
 * connection on a thread of its own (its RC QPs, its CQ), and at the end
 * checks that the canaries and the read-only page are as it left them.
 * A TCP side channel on the hosts' addresses carries what
 * ibv_rc_pingpong's does (QPN, PSN, GID) plus the MRs' addresses and
 * rkeys, then the clients' commands (report, post a receive, bye).
 *
 * Client modes, one per check of udp_faults.sh:
 *   atomic   --count N: N FETCH_AND_ADD of 1 on the counter, --depth
 *            outstanding; every fetched value must be distinct (an atomic
 *            executed twice would repeat one); --out FILE gets them.
 *   write    --count N --size S: RDMA WRITEs over the data MR, then one
 *            READ of all of it, compared byte for byte.
 *   retry    one WRITE that nothing answers (SOFTVERBS_FAULT=drop=1):
 *            IBV_WC_RETRY_EXC_ERR after (retry_cnt + 1) local ACK
 *            timeouts (IBA 9.7.6.1.3: 4.096 us * 2^timeout each).
 *   rnr      SENDs to QPs with no receive posted: IBV_WC_RNR_RETRY_EXC_ERR
 *            after rnr_retry RNR NAKs; then rnr_retry 7 and a receive
 *            posted late: success.
 *   stream   WRITEs until the server dies (the script kills it once
 *            --ready FILE exists): IBV_WC_RETRY_EXC_ERR within the retry
 *            budget, then IBV_WC_WR_FLUSH_ERR for everything else.
 *   hostile  crafted RoCEv2 datagrams from a raw socket at the
 *            server's live QPs (DESIGN 7: the target enforces
 *            everything), then a legitimate WRITE and SEND.
 *   foreign  WRITEs from a raw socket with IPv4 identifications
 *            numbered as rxe and RoCE NICs number them, at a server run
 *            with SOFTVERBS_IPV4_ID=any: taken, unless the ICRC is off.
 *
 * Clients print "check: ok: ..." and "check: FAIL: ..." lines, which the
 * script counts, and exit 0 only when every check passed (write: 4 when
 * its retries ran out honestly under loss, see EXIT_EXHAUSTED; any
 * client: 2 for a setup failure, 3 past --limit).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define MAGIC		0x53565550u	/* "SVUP" */
#define MAX_QP		16
#define PAGE		4096u
#define DATA_LEN	(1u << 20)
#define RO_LEN		PAGE
#define RSLOTS		4		/* receive buffers per server QP */
#define RSLOT_LEN	PAGE
#define CANARY		0x5a
#define RO_FILL		0x77
#define ROCE_PORT	4791

static const char *prog = "udp_peer";

/* ---- small helpers ---- */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

static int failures;

/* A check's verdict, for the script to count. */
static void check(bool pass, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool pass, const char *fmt, ...)
{
	va_list ap;

	printf("check: %s: ", pass ? "ok" : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	if (!pass)
		failures++;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void on_alarm(int sig)
{
	static const char msg[] = "udp_peer: time limit reached (--limit): giving up\n";

	(void)sig;
	if (write(2, msg, sizeof(msg) - 1) < 0) {
		/* nothing more to say */
	}
	_exit(3);
}

/* The initial contents of the server's data MR, which clients rebuild. */
static uint8_t init_byte(uint64_t i)
{
	return (uint8_t)((i ^ (i >> 8) ^ (i >> 16)) * 29 + 3);
}

/* The bytes of WRITE number n. */
static uint8_t write_byte(uint64_t n, uint64_t j)
{
	return (uint8_t)(n * 37 + j * 11 + (j >> 9) + 0x81);
}

/* Byte j of mix message tag (QP index << 24 | the QP's message number):
 * a SEND of 8 bytes or more starts with the tag and its length, then
 * these bytes. */
static uint8_t mix_byte(uint32_t tag, uint32_t j)
{
	uint32_t x = tag * 0x9e3779b1u + j * 0x85ebca77u;

	return (uint8_t)((x ^ x >> 15) >> 8);
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* ---- the side channel ---- */

struct qp_info {
	uint32_t qpn, psn;
	uint32_t recvs;			/* receives the server posts on its QP */
	uint8_t min_rnr_timer;		/* the server QP's (IBA Table 45 code) */
	uint8_t pad[3];
};

struct hello {
	uint32_t magic, nqp;
	uint8_t gid[16];
	uint8_t timeout, retry_cnt, rnr_retry, flags;
	struct qp_info qp[MAX_QP];
};

/* hello.flags: the server checks each message it receives (mix_byte's
 * pattern, in order) and posts its receive again. */
#define HELLO_CHECK_RECV 1

struct welcome {
	uint32_t magic, nqp;
	int32_t pid;
	uint32_t data_len;
	uint8_t gid[16];
	struct qp_info qp[MAX_QP];
	uint64_t data_va, ctr_va, ro_va;
	uint32_t data_rkey, ctr_rkey, ro_rkey, ro_len;
};

enum { CMD_REPORT = 1, CMD_REPORT_DATA, CMD_POST_RECV, CMD_BYE };

struct cmd {
	uint32_t op, arg;
};

struct report {
	uint32_t magic;
	uint32_t canary_ok, ro_ok;
	uint32_t recv_ok, recv_err, recv_len;
	uint64_t counter;
	uint32_t qp_state[MAX_QP];
	uint8_t recv_data[64];
	uint32_t recv_bad;		/* HELLO_CHECK_RECV: messages not as sent */
	char recv_why[128];		/* the first of them */
};

static bool read_all(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return true;
}

static bool write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return true;
}

static int tcp_listen(const char *addr, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int one = 1, s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (s < 0 || inet_pton(AF_INET, addr, &a.sin_addr) != 1)
		die("listen: bad address %s", addr);
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 16))
		die("listen on %s:%d: %s", addr, port, strerror(errno));
	return s;
}

/* Connects to addr:port, trying for up to 15 s (the server may be
 * starting). */
static int tcp_connect(const char *addr, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };

	if (inet_pton(AF_INET, addr, &a.sin_addr) != 1)
		die("bad server address %s", addr);
	for (int i = 0; i < 150; i++) {
		int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (s < 0)
			die("socket: %s", strerror(errno));
		if (!connect(s, (struct sockaddr *)&a, sizeof(a)))
			return s;
		close(s);
		usleep(100000);
	}
	die("cannot connect to %s:%d", addr, port);
}

/* ---- verbs ---- */

struct dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	int gid_index;
	union ibv_gid gid;
	uint32_t max_rd;
};

/* The device, and the GID index of ::ffff:addr (RoCEv2, IPv4-mapped). */
static void dev_open(struct dev *d, const char *addr)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_port_attr pa;
	struct ibv_device_attr da;
	uint8_t want[16] = { [10] = 0xff, [11] = 0xff };

	if (!list || !list[0])
		die("no RDMA device (is build/lib first in LD_LIBRARY_PATH?)");
	d->ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!d->ctx)
		die("ibv_open_device: %s", strerror(errno));
	if (ibv_query_port(d->ctx, 1, &pa) || ibv_query_device(d->ctx, &da))
		die("ibv_query_port/device failed");
	d->max_rd = da.max_qp_rd_atom ? (uint32_t)da.max_qp_rd_atom : 1;
	if (inet_pton(AF_INET, addr, want + 12) != 1)
		die("bad address %s", addr);
	d->gid_index = -1;
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		union ibv_gid g;
		if (ibv_query_gid(d->ctx, 1, i, &g))
			break;
		if (!memcmp(g.raw, want, 16)) {
			d->gid_index = i;
			d->gid = g;
			break;
		}
	}
	if (d->gid_index < 0)
		die("no GID ::ffff:%s on port 1 (SOFTVERBS_LINK_LAYER=roce?)", addr);
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd)
		die("ibv_alloc_pd: %s", strerror(errno));
}

static struct ibv_qp *qp_create(struct dev *d, struct ibv_cq *cq, uint32_t nsend, uint32_t nrecv)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = nsend, .max_recv_wr = nrecv, .max_send_sge = 3,
			 .max_recv_sge = 1, .max_inline_data = 64 },
	};
	struct ibv_qp *qp = ibv_create_qp(d->pd, &ia);
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC,
	};

	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		die("modify_qp INIT failed");
	return qp;
}

struct qp_params {
	uint8_t min_rnr_timer, timeout, retry_cnt, rnr_retry;
	uint32_t max_rd;
};

/* RTR then RTS towards the peer (dgid, remote qpn and psn). */
static void qp_connect(struct dev *d, struct ibv_qp *qp, const uint8_t *dgid, uint32_t dqpn,
		       uint32_t rq_psn, uint32_t sq_psn, const struct qp_params *p)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dqpn,
		.rq_psn = rq_psn, .max_dest_rd_atomic = (uint8_t)d->max_rd,
		.min_rnr_timer = p->min_rnr_timer,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .sgid_index = (uint8_t)d->gid_index, .hop_limit = 64 } },
	};
	int err;

	memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
	err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (err)
		die("modify_qp RTR: %s", strerror(err));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = p->timeout;
	a.retry_cnt = p->retry_cnt;
	a.rnr_retry = p->rnr_retry;
	a.sq_psn = sq_psn;
	a.max_rd_atomic = (uint8_t)(p->max_rd < d->max_rd ? p->max_rd : d->max_rd);
	err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (err)
		die("modify_qp RTS: %s", strerror(err));
}

static struct ibv_mr *reg(struct dev *d, void *p, size_t len, int access)
{
	struct ibv_mr *mr = ibv_reg_mr(d->pd, p, len, access);

	if (!mr)
		die("ibv_reg_mr(%zu bytes): %s", len, strerror(errno));
	return mr;
}

static uint32_t rand_psn(void)
{
	return (uint32_t)lrand48() & 0xffffff;
}

/* Polls cq for one completion until deadline (ms, now_ms()); false on
 * timeout. */
static bool poll_one(struct ibv_cq *cq, struct ibv_wc *wc, double deadline)
{
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			die("ibv_poll_cq failed");
		if (n)
			return true;
		if (now_ms() > deadline)
			return false;
	}
}

static const char *state_name(uint32_t s)
{
	static const char *const n[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR" };

	return s < sizeof(n) / sizeof(n[0]) ? n[s] : "?";
}

/* ---- the server ---- */

static struct {
	struct dev d;
	uint8_t *arena;
	size_t arena_len;
	uint8_t *data, *ctr, *ro;
	struct ibv_mr *data_mr, *ctr_mr, *ro_mr;
	struct qp_params qp;
	pthread_mutex_t lock;
	int bad;
} srv;

/* The arena: canary, data MR, canary, read-only page, canary, counter
 * page (an 8-byte MR), canary.  No MR covers a canary page. */
static void arena_init(void)
{
	srv.arena_len = PAGE + DATA_LEN + PAGE + RO_LEN + PAGE + PAGE + PAGE;
	srv.arena = mmap(NULL, srv.arena_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
	if (srv.arena == MAP_FAILED)
		die("mmap: %s", strerror(errno));
	memset(srv.arena, CANARY, srv.arena_len);
	srv.data = srv.arena + PAGE;
	srv.ro = srv.data + DATA_LEN + PAGE;
	srv.ctr = srv.ro + RO_LEN + PAGE;
	for (uint32_t i = 0; i < DATA_LEN; i++)
		srv.data[i] = init_byte(i);
	memset(srv.ro, RO_FILL, RO_LEN);
	memset(srv.ctr, 0, 8);
	/* The counter page's other bytes are canary too. */
	srv.data_mr = reg(&srv.d, srv.data, DATA_LEN, IBV_ACCESS_LOCAL_WRITE |
			  IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	srv.ro_mr = reg(&srv.d, srv.ro, RO_LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	/* Remote write too: mix's atomic writes store to it. */
	srv.ctr_mr = reg(&srv.d, srv.ctr, 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC |
			 IBV_ACCESS_REMOTE_WRITE);
}

static bool all_bytes(const uint8_t *p, size_t len, uint8_t v, size_t *where)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != v) {
			if (where)
				*where = i;
			return false;
		}
	return true;
}

/* Every byte outside the MRs still the canary's; prints the first that
 * is not. */
static bool canaries_ok(void)
{
	const struct { const uint8_t *p; size_t len; const char *name; } c[] = {
		{ srv.arena, PAGE, "before the data MR" },
		{ srv.data + DATA_LEN, PAGE, "after the data MR" },
		{ srv.ro + RO_LEN, PAGE, "after the read-only MR" },
		{ srv.ctr + 8, PAGE - 8, "after the counter" },
		{ srv.ctr + PAGE, PAGE, "after the counter page" },
	};
	bool ok = true;

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		size_t at;
		if (!all_bytes(c[i].p, c[i].len, CANARY, &at)) {
			fprintf(stderr, "%s: server: canary %s changed at +%zu (0x%02x)\n", prog,
				c[i].name, at, c[i].p[at]);
			ok = false;
		}
	}
	return ok;
}

struct conn {
	int fd, id;
	pthread_t thr;
};

struct sconn {
	struct conn *c;
	struct hello h;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_qp *qp[MAX_QP];
	uint8_t *rbuf;
	struct ibv_mr *rmr;
	uint32_t rnext[MAX_QP];
	uint32_t rmsg[MAX_QP];		/* HELLO_CHECK_RECV: the next message's number */
	struct report rep;
};

static void srv_post_recv(struct sconn *s, uint32_t i)
{
	uint32_t slot = i * RSLOTS + s->rnext[i]++ % RSLOTS;
	struct ibv_sge sge = { (uintptr_t)(s->rbuf + (size_t)slot * RSLOT_LEN), RSLOT_LEN,
			       s->rmr->lkey };
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(s->qp[i], &wr, &bad))
		fprintf(stderr, "%s: server: ibv_post_recv on qpn 0x%x failed\n", prog,
			s->qp[i]->qp_num);
}

/* HELLO_CHECK_RECV: whether the receive wc on QP i is the client's next
 * message (mix: a SEND or SEND_WITH_IMM of mix_byte's pattern, or a
 * WRITE_WITH_IMM whose immediate is its tag); why says what is not. */
static bool srv_check_msg(struct sconn *s, uint32_t i, const struct ibv_wc *wc,
			  const uint8_t *buf, char *why, size_t n)
{
	uint32_t tag = i << 24 | (s->rmsg[i]++ & 0xffffff);
	bool imm = wc->wc_flags & IBV_WC_WITH_IMM;

	if (imm && ntohl(wc->imm_data) != tag) {
		snprintf(why, n, "QP %u: immediate 0x%x, want tag 0x%x", i, ntohl(wc->imm_data), tag);
		return false;
	}
	if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
		if (!imm)
			snprintf(why, n, "QP %u: WRITE_WITH_IMM tag 0x%x without its immediate", i, tag);
		return imm;
	}
	if (wc->byte_len < 8) {
		/* Too short for the header: mix_byte's bytes, and the tag as
		 * the immediate. */
		if (!imm) {
			snprintf(why, n, "QP %u: a %u-byte SEND (tag 0x%x) without an immediate", i,
				 wc->byte_len, tag);
			return false;
		}
		for (uint32_t j = 0; j < wc->byte_len; j++)
			if (buf[j] != mix_byte(tag, j)) {
				snprintf(why, n, "QP %u: SEND_WITH_IMM tag 0x%x of %u bytes: byte %u "
					 "is 0x%02x, want 0x%02x", i, tag, wc->byte_len, j, buf[j],
					 mix_byte(tag, j));
				return false;
			}
		return true;
	}
	if (get32(buf) != tag || get32(buf + 4) != wc->byte_len) {
		snprintf(why, n, "QP %u: SEND tag 0x%x length %u, want tag 0x%x length %u", i,
			 get32(buf), get32(buf + 4), tag, wc->byte_len);
		return false;
	}
	for (uint32_t j = 8; j < wc->byte_len; j++)
		if (buf[j] != mix_byte(tag, j)) {
			snprintf(why, n, "QP %u: SEND tag 0x%x of %u bytes: byte %u is 0x%02x, want "
				 "0x%02x", i, tag, wc->byte_len, j, buf[j], mix_byte(tag, j));
			return false;
		}
	return true;
}

static void srv_drain(struct sconn *s)
{
	struct ibv_wc wc[16];
	int n;

	while ((n = ibv_poll_cq(s->cq, 16, wc)) > 0)
		for (int i = 0; i < n; i++) {
			if (!(wc[i].opcode & IBV_WC_RECV))
				continue;
			if (wc[i].status != IBV_WC_SUCCESS) {
				s->rep.recv_err++;
				continue;
			}
			s->rep.recv_ok++;
			s->rep.recv_len = wc[i].byte_len;
			const uint8_t *buf = s->rbuf + wc[i].wr_id * RSLOT_LEN;
			memcpy(s->rep.recv_data, buf, sizeof(s->rep.recv_data));
			if (!(s->h.flags & HELLO_CHECK_RECV))
				continue;
			uint32_t q = (uint32_t)wc[i].wr_id / RSLOTS;
			char why[sizeof(s->rep.recv_why)];
			if (!srv_check_msg(s, q, &wc[i], buf, why, sizeof(why)) && !s->rep.recv_bad++)
				memcpy(s->rep.recv_why, why, sizeof(why));
			srv_post_recv(s, q);
		}
}

static void srv_report(struct sconn *s, bool data)
{
	srv_drain(s);
	s->rep.magic = MAGIC;
	s->rep.canary_ok = canaries_ok();
	s->rep.ro_ok = all_bytes(srv.ro, RO_LEN, RO_FILL, NULL);
	s->rep.counter = __atomic_load_n((uint64_t *)srv.ctr, __ATOMIC_ACQUIRE);
	for (uint32_t i = 0; i < s->h.nqp; i++) {
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;
		s->rep.qp_state[i] = ibv_query_qp(s->qp[i], &a, IBV_QP_STATE, &ia) ? 99 :
				     a.qp_state;
	}
	if (!write_all(s->c->fd, &s->rep, sizeof(s->rep)) ||
	    (data && !write_all(s->c->fd, srv.data, DATA_LEN)))
		fprintf(stderr, "%s: server: the report could not be sent\n", prog);
}

static void *srv_conn(void *arg)
{
	struct sconn s = { .c = arg };
	struct welcome w = { .magic = MAGIC, .pid = getpid(), .data_len = DATA_LEN };

	if (!read_all(s.c->fd, &s.h, sizeof(s.h)) || s.h.magic != MAGIC || s.h.nqp > MAX_QP ||
	    !s.h.nqp) {
		fprintf(stderr, "%s: server: connection %d: bad hello\n", prog, s.c->id);
		goto out;
	}
	/* Completions by event, as a real server would wait for them: its
	 * CQ is polled only when something completed. */
	s.ch = ibv_create_comp_channel(srv.d.ctx);
	s.cq = s.ch ? ibv_create_cq(srv.d.ctx, 1024, NULL, s.ch, 0) : NULL;
	if (!s.cq || ibv_req_notify_cq(s.cq, 0))
		die("ibv_create_cq with a completion channel: %s", strerror(errno));
	s.rbuf = aligned_alloc(PAGE, (size_t)s.h.nqp * RSLOTS * RSLOT_LEN);
	if (!s.rbuf)
		die("out of memory");
	memset(s.rbuf, 0, (size_t)s.h.nqp * RSLOTS * RSLOT_LEN);
	s.rmr = reg(&srv.d, s.rbuf, (size_t)s.h.nqp * RSLOTS * RSLOT_LEN, IBV_ACCESS_LOCAL_WRITE);
	w.nqp = s.h.nqp;
	memcpy(w.gid, srv.d.gid.raw, 16);
	for (uint32_t i = 0; i < s.h.nqp; i++) {
		struct qp_params p = {
			.min_rnr_timer = s.h.qp[i].min_rnr_timer, .timeout = s.h.timeout,
			.retry_cnt = s.h.retry_cnt, .rnr_retry = s.h.rnr_retry, .max_rd = 16,
		};
		s.qp[i] = qp_create(&srv.d, s.cq, 16, RSLOTS);
		w.qp[i].qpn = s.qp[i]->qp_num;
		pthread_mutex_lock(&srv.lock);
		w.qp[i].psn = rand_psn();
		pthread_mutex_unlock(&srv.lock);
		qp_connect(&srv.d, s.qp[i], s.h.gid, s.h.qp[i].qpn, s.h.qp[i].psn, w.qp[i].psn, &p);
		for (uint32_t k = 0; k < s.h.qp[i].recvs && k < RSLOTS; k++)
			srv_post_recv(&s, i);
	}
	w.data_va = (uintptr_t)srv.data;
	w.data_rkey = srv.data_mr->rkey;
	w.ctr_va = (uintptr_t)srv.ctr;
	w.ctr_rkey = srv.ctr_mr->rkey;
	w.ro_va = (uintptr_t)srv.ro;
	w.ro_rkey = srv.ro_mr->rkey;
	w.ro_len = RO_LEN;
	if (!write_all(s.c->fd, &w, sizeof(w)))
		goto out;
	printf("server: connection %d: %u QPs (first qpn 0x%x)\n", s.c->id, s.h.nqp, w.qp[0].qpn);
	fflush(stdout);
	for (;;) {
		struct pollfd pf[2] = { { s.c->fd, POLLIN, 0 }, { s.ch->fd, POLLIN, 0 } };
		struct cmd c;

		if (poll(pf, 2, 1000) <= 0)
			continue;
		if (pf[1].revents) {
			struct ibv_cq *ecq;
			void *ectx;
			if (!ibv_get_cq_event(s.ch, &ecq, &ectx)) {
				ibv_ack_cq_events(ecq, 1);
				ibv_req_notify_cq(ecq, 0);
			}
			srv_drain(&s);
		}
		if (!pf[0].revents)
			continue;
		if (!read_all(s.c->fd, &c, sizeof(c)) || c.op == CMD_BYE)
			break;
		if (c.op == CMD_REPORT || c.op == CMD_REPORT_DATA)
			srv_report(&s, c.op == CMD_REPORT_DATA);
		else if (c.op == CMD_POST_RECV && c.arg < s.h.nqp)
			srv_post_recv(&s, c.arg);
	}
out:
	for (uint32_t i = 0; i < MAX_QP; i++)
		if (s.qp[i])
			ibv_destroy_qp(s.qp[i]);
	if (s.rmr)
		ibv_dereg_mr(s.rmr);
	if (s.cq)
		ibv_destroy_cq(s.cq);
	if (s.ch)
		ibv_destroy_comp_channel(s.ch);
	free(s.rbuf);
	close(s.c->fd);
	return NULL;
}

static int run_server(const char *addr, int port, int conns, long long expect,
		      const char *pidfile)
{
	struct conn c[64];
	int ls, rc = 0;

	if (conns < 1 || conns > 64)
		die("--conns: 1 to 64");
	dev_open(&srv.d, addr);
	pthread_mutex_init(&srv.lock, NULL);
	arena_init();
	ls = tcp_listen(addr, port);
	if (pidfile) {
		FILE *f = fopen(pidfile, "w");
		if (!f)
			die("%s: %s", pidfile, strerror(errno));
		fprintf(f, "%d\n", (int)getpid());
		fclose(f);
	}
	printf("server: pid %d, %s:%d, GID index %d, data MR rkey 0x%x\n", (int)getpid(), addr,
	       port, srv.d.gid_index, srv.data_mr->rkey);
	fflush(stdout);
	for (int i = 0; i < conns; i++) {
		c[i].fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
		if (c[i].fd < 0)
			die("accept: %s", strerror(errno));
		c[i].id = i;
		if (pthread_create(&c[i].thr, NULL, srv_conn, &c[i]))
			die("pthread_create failed");
	}
	for (int i = 0; i < conns; i++)
		pthread_join(c[i].thr, NULL);
	close(ls);
	bool can = canaries_ok(), ro = all_bytes(srv.ro, RO_LEN, RO_FILL, NULL);
	uint64_t v = *(volatile uint64_t *)srv.ctr;
	printf("server: counter %llu, canaries %s, read-only MR %s\n", (unsigned long long)v,
	       can ? "intact" : "CHANGED", ro ? "intact" : "CHANGED");
	if (!can || !ro)
		rc = 1;
	if (expect >= 0 && v != (uint64_t)expect) {
		printf("server: counter %llu, expected %lld\n", (unsigned long long)v, expect);
		rc = 1;
	}
	ibv_dereg_mr(srv.data_mr);
	ibv_dereg_mr(srv.ro_mr);
	ibv_dereg_mr(srv.ctr_mr);
	ibv_dealloc_pd(srv.d.pd);
	ibv_close_device(srv.d.ctx);
	return rc;
}

/* ---- clients: common ---- */

struct opts {
	const char *mode, *addr, *server, *out, *ready, *spoof, *hold;
	int port, count, size, depth, timeout, retry, rnr_retry, qps;
	long long seed;
};

struct cli {
	struct dev d;
	int fd;
	struct ibv_cq *cq;
	struct ibv_qp *qp[MAX_QP];
	uint32_t nqp;
	struct hello h;
	struct welcome w;
};

/* QPs, the hello and welcome, and the QPs connected.  recvs[i] and
 * rnr[i] are for the server's QP i. */
static void cli_setup(struct cli *c, const struct opts *o, uint32_t nqp, const uint32_t *recvs,
		      const uint8_t *rnr, const uint8_t *my_rnr_retry)
{
	dev_open(&c->d, o->addr);
	c->cq = ibv_create_cq(c->d.ctx, 4096, NULL, NULL, 0);
	if (!c->cq)
		die("ibv_create_cq: %s", strerror(errno));
	c->nqp = nqp;
	c->h.magic = MAGIC;
	c->h.nqp = nqp;
	memcpy(c->h.gid, c->d.gid.raw, 16);
	c->h.timeout = 14;
	c->h.retry_cnt = 7;
	c->h.rnr_retry = 7;
	for (uint32_t i = 0; i < nqp; i++) {
		uint32_t depth = o->depth > 0 ? (uint32_t)o->depth : 1;
		c->qp[i] = qp_create(&c->d, c->cq, depth + 16, 16);
		c->h.qp[i].qpn = c->qp[i]->qp_num;
		c->h.qp[i].psn = rand_psn();
		c->h.qp[i].recvs = recvs ? recvs[i] : 0;
		c->h.qp[i].min_rnr_timer = rnr ? rnr[i] : 12;
	}
	c->fd = tcp_connect(o->server, o->port);
	if (!write_all(c->fd, &c->h, sizeof(c->h)) || !read_all(c->fd, &c->w, sizeof(c->w)) ||
	    c->w.magic != MAGIC || c->w.nqp != nqp)
		die("the side channel to %s:%d failed", o->server, o->port);
	for (uint32_t i = 0; i < nqp; i++) {
		struct qp_params p = {
			.min_rnr_timer = 12, .timeout = (uint8_t)o->timeout,
			.retry_cnt = (uint8_t)o->retry,
			.rnr_retry = my_rnr_retry ? my_rnr_retry[i] : (uint8_t)o->rnr_retry,
			.max_rd = o->depth > 0 ? (uint32_t)o->depth : 1,
		};
		qp_connect(&c->d, c->qp[i], c->w.gid, c->w.qp[i].qpn, c->w.qp[i].psn,
			   c->h.qp[i].psn, &p);
	}
}

static void cli_cmd(struct cli *c, uint32_t op, uint32_t arg)
{
	struct cmd m = { op, arg };

	if (!write_all(c->fd, &m, sizeof(m)))
		die("the side channel closed");
}

static void cli_report(struct cli *c, struct report *r, uint8_t *data)
{
	cli_cmd(c, data ? CMD_REPORT_DATA : CMD_REPORT, 0);
	if (!read_all(c->fd, r, sizeof(*r)) || r->magic != MAGIC ||
	    (data && !read_all(c->fd, data, c->w.data_len)))
		die("no report from the server");
}

static void cli_close(struct cli *c)
{
	cli_cmd(c, CMD_BYE, 0);
	close(c->fd);
	for (uint32_t i = 0; i < c->nqp; i++)
		ibv_destroy_qp(c->qp[i]);
	ibv_destroy_cq(c->cq);
	ibv_dealloc_pd(c->d.pd);
	ibv_close_device(c->d.ctx);
}

static int post_one(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id, void *buf,
		    uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t add)
{
	struct ibv_sge sge = { (uintptr_t)buf, len, lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = add;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	return ibv_post_send(qp, &wr, &bad);
}

static double budget_ms(int timeout, int retry)
{
	return (retry + 1) * 4.096e-3 * (double)(1ull << timeout);
}

/* ---- atomic ---- */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int run_atomic(const struct opts *o)
{
	struct cli c = { 0 };
	uint32_t n = (uint32_t)o->count, depth = (uint32_t)o->depth, posted = 0, done = 0;
	uint64_t *res = calloc(n, 8), *sorted = calloc(n, 8);
	struct ibv_mr *mr;
	double t0;

	if (!res || !sorted)
		die("out of memory");
	cli_setup(&c, o, 1, NULL, NULL, NULL);
	mr = reg(&c.d, res, (size_t)n * 8, IBV_ACCESS_LOCAL_WRITE);
	memset(res, 0xff, (size_t)n * 8);
	t0 = now_ms();
	while (done < n) {
		while (posted < n && posted - done < depth) {
			if (post_one(c.qp[0], IBV_WR_ATOMIC_FETCH_AND_ADD, posted, &res[posted], 8,
				     mr->lkey, c.w.ctr_va, c.w.ctr_rkey, 1))
				die("ibv_post_send failed at %u", posted);
			posted++;
		}
		struct ibv_wc wc;
		if (!poll_one(c.cq, &wc, now_ms() + 30000)) {
			check(false, "atomic: no completion in 30 s after %u of %u", done, n);
			goto out;
		}
		if (wc.status != IBV_WC_SUCCESS) {
			check(false, "atomic: FETCH_AND_ADD %llu completed with %s after %u good ones",
			      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), done);
			goto out;
		}
		if (wc.wr_id != done) {
			check(false, "atomic: completion for wr_id %llu, expected %u (out of order)",
			      (unsigned long long)wc.wr_id, done);
			goto out;
		}
		done++;
	}
	double ms = now_ms() - t0;
	memcpy(sorted, res, (size_t)n * 8);
	qsort(sorted, n, 8, cmp_u64);
	uint32_t dups = 0;
	for (uint32_t i = 1; i < n; i++)
		if (sorted[i] == sorted[i - 1])
			dups++;
	check(dups == 0, "atomic: %u FETCH_AND_ADDs in %.2f s (%d outstanding), %u repeated fetched "
	      "values, smallest %llu, largest %llu", n, ms / 1e3, o->depth, dups,
	      (unsigned long long)sorted[0], (unsigned long long)sorted[n - 1]);
	if (o->out) {
		FILE *f = fopen(o->out, "w");
		if (!f)
			die("%s: %s", o->out, strerror(errno));
		for (uint32_t i = 0; i < n; i++)
			fprintf(f, "%llu\n", (unsigned long long)res[i]);
		fclose(f);
	}
out:
	/* Closed on failure too: SOFTVERBS_LOG=debug prints the QP's and
	 * the link's counters as they close. */
	ibv_dereg_mr(mr);
	cli_close(&c);
	free(res);
	free(sorted);
	return failures ? 1 : 0;
}

/* ---- write ---- */

/*
 * Under heavy loss a requester may spend its retries honestly: retry_cnt
 * (at most 7, IBA 9.7.6.1.3; rnr_retry's 7 means forever, retry_cnt's
 * does not) bounds the timeouts in a row without progress, and at 30%
 * loss each way a retransmission and its answer both arrive about half
 * the time, so a stall outlives 8 of them now and then.  That ending,
 * IBV_WC_RETRY_EXC_ERR at the oldest WRITE and nothing else wrong, exits
 * with this code for the script to try again with other faults; a wrong
 * byte or any other status is a failure at once.
 */
#define EXIT_EXHAUSTED 4

static int run_write(const struct opts *o)
{
	struct cli c = { 0 };
	uint32_t n = (uint32_t)o->count, size = (uint32_t)o->size, depth = (uint32_t)o->depth;
	uint32_t posted = 0, done = 0, slots;
	uint8_t *src, *rd, *expect;
	struct ibv_mr *smr, *rmr;
	double t0;

	cli_setup(&c, o, 1, NULL, NULL, NULL);
	if (!size || size > c.w.data_len || c.w.data_len % size)
		die("--size must divide the server's %u-byte MR", c.w.data_len);
	slots = c.w.data_len / size;
	src = aligned_alloc(PAGE, (size_t)depth * size);
	rd = aligned_alloc(PAGE, c.w.data_len);
	expect = malloc(c.w.data_len);
	if (!src || !rd || !expect)
		die("out of memory");
	for (uint32_t i = 0; i < c.w.data_len; i++)
		expect[i] = init_byte(i);
	memset(rd, 0, c.w.data_len);
	smr = reg(&c.d, src, (size_t)depth * size, IBV_ACCESS_LOCAL_WRITE);
	rmr = reg(&c.d, rd, c.w.data_len, IBV_ACCESS_LOCAL_WRITE);
	t0 = now_ms();
	while (done < n) {
		while (posted < n && posted - done < depth) {
			uint8_t *s = src + (size_t)(posted % depth) * size;
			uint64_t off = (uint64_t)(posted % slots) * size;
			for (uint32_t j = 0; j < size; j++)
				s[j] = write_byte(posted, j);
			memcpy(expect + off, s, size);
			if (post_one(c.qp[0], IBV_WR_RDMA_WRITE, posted, s, size, smr->lkey,
				     c.w.data_va + off, c.w.data_rkey, 0))
				die("ibv_post_send failed at %u", posted);
			posted++;
		}
		struct ibv_wc wc;
		if (!poll_one(c.cq, &wc, now_ms() + 60000)) {
			check(false, "write: no completion in 60 s after %u of %u WRITEs", done, n);
			return 1;
		}
		if (wc.status == IBV_WC_RETRY_EXC_ERR && wc.wr_id == done) {
			printf("exhausted: WRITE %u: %s after %u good ones in %.2f s\n", done,
			       ibv_wc_status_str(wc.status), done, (now_ms() - t0) / 1e3);
			return EXIT_EXHAUSTED;
		}
		if (wc.status != IBV_WC_SUCCESS || wc.wr_id != done) {
			check(false, "write: WRITE %llu completed with %s after %u good ones",
			      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), done);
			return 1;
		}
		done++;
	}
	double tw = now_ms() - t0;
	/* Back: what was written (the whole MR once the WRITEs wrap). */
	uint32_t span = (uint64_t)n * size < c.w.data_len ? n * size : c.w.data_len;
	if (post_one(c.qp[0], IBV_WR_RDMA_READ, n, rd, span, rmr->lkey, c.w.data_va,
		     c.w.data_rkey, 0))
		die("ibv_post_send (READ) failed");
	struct ibv_wc wc;
	if (!poll_one(c.cq, &wc, now_ms() + 60000)) {
		check(false, "write: the READ back did not complete in 60 s");
		return 1;
	}
	double tr = now_ms() - t0 - tw;
	if (wc.status == IBV_WC_RETRY_EXC_ERR) {
		printf("exhausted: the READ back: %s after %u good WRITEs\n",
		       ibv_wc_status_str(wc.status), n);
		return EXIT_EXHAUSTED;
	}
	uint32_t bad = 0, first = 0;
	for (uint32_t i = 0; i < span; i++)
		if (rd[i] != expect[i] && !bad++)
			first = i;
	check(wc.status == IBV_WC_SUCCESS && !bad,
	      "write: %u WRITEs of %u bytes in %.2f s, READ of %u bytes back in %.2f s (%s): %u "
	      "bytes differ%s", n, size, tw / 1e3, span, tr / 1e3,
	      ibv_wc_status_str(wc.status), bad, bad ? " (see the first below)" : "");
	if (bad)
		printf("    first difference at +0x%x: read 0x%02x, expected 0x%02x\n", first,
		       rd[first], expect[first]);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(rmr);
	cli_close(&c);
	free(src);
	free(rd);
	free(expect);
	return failures ? 1 : 0;
}

/* ---- retry ---- */

static int run_retry(const struct opts *o)
{
	struct cli c = { 0 };
	static uint8_t buf[64];
	struct ibv_mr *mr;
	struct ibv_wc wc;

	cli_setup(&c, o, 1, NULL, NULL, NULL);
	mr = reg(&c.d, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	double budget = budget_ms(o->timeout, o->retry);
	double lo = 0.9 * budget, hi = 1.5 * budget + 50;
	double t0 = now_ms();
	if (post_one(c.qp[0], IBV_WR_RDMA_WRITE, 1, buf, sizeof(buf), mr->lkey, c.w.data_va,
		     c.w.data_rkey, 0))
		die("ibv_post_send failed");
	bool got = poll_one(c.cq, &wc, t0 + 10 * hi + 5000);
	double el = now_ms() - t0;
	printf("retry: timeout %d, retry_cnt %d: budget (retry_cnt + 1) x 4.096 us x 2^timeout = "
	       "%.1f ms; measured %.1f ms\n", o->timeout, o->retry, budget, el);
	if (!got) {
		check(false, "retry: no completion in %.0f ms (budget %.1f ms)", el, budget);
		return 1;
	}
	check(wc.status == IBV_WC_RETRY_EXC_ERR, "retry: the WRITE completed with %s (want %s)",
	      ibv_wc_status_str(wc.status), ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR));
	check(el >= lo && el <= hi, "retry: %.1f ms from post to completion, budget %.1f ms, "
	      "accepted [%.1f, %.1f] ms", el, budget, lo, hi);
	ibv_dereg_mr(mr);
	cli_close(&c);
	return failures ? 1 : 0;
}

/* ---- rnr ---- */

static int run_rnr(const struct opts *o)
{
	enum { NQP = 4 };
	/* QPs 0-2: rnr_retry 1, 2, 3 and no receive, ever; QP 3: rnr_retry 7
	 * (for ever) and a receive posted 200 ms after the SEND. */
	const uint8_t retries[NQP] = { 1, 2, 3, 7 }, srv_rnr[NQP] = { 1, 1, 1, 12 };
	struct cli c = { 0 };
	static uint8_t buf[NQP][64];
	struct ibv_mr *mr;
	struct ibv_wc wc;
	struct report r;

	cli_setup(&c, o, NQP, NULL, srv_rnr, retries);
	mr = reg(&c.d, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	for (int i = 0; i < NQP; i++)
		memset(buf[i], 0x30 + i, sizeof(buf[i]));
	for (int i = 0; i < 3; i++) {
		double t0 = now_ms();
		if (post_one(c.qp[i], IBV_WR_SEND, (uint64_t)i, buf[i], 64, mr->lkey, 0, 0, 0))
			die("ibv_post_send failed");
		if (!poll_one(c.cq, &wc, t0 + 10000)) {
			check(false, "rnr: rnr_retry %u: no completion in 10 s", retries[i]);
			continue;
		}
		check(wc.status == IBV_WC_RNR_RETRY_EXC_ERR && wc.wr_id == (uint64_t)i,
		      "rnr: rnr_retry %u, server min_rnr_timer %u, no receive: SEND completed with %s "
		      "(want %s) in %.1f ms", retries[i], srv_rnr[i], ibv_wc_status_str(wc.status),
		      ibv_wc_status_str(IBV_WC_RNR_RETRY_EXC_ERR), now_ms() - t0);
	}
	double t0 = now_ms();
	if (post_one(c.qp[3], IBV_WR_SEND, 3, buf[3], 64, mr->lkey, 0, 0, 0))
		die("ibv_post_send failed");
	usleep(200000);
	bool early = ibv_poll_cq(c.cq, 1, &wc) > 0;
	cli_cmd(&c, CMD_POST_RECV, 3);
	if (early) {
		check(false, "rnr: rnr_retry 7: the SEND completed (%s) before any receive was posted",
		      ibv_wc_status_str(wc.status));
	} else if (!poll_one(c.cq, &wc, now_ms() + 10000)) {
		check(false, "rnr: rnr_retry 7: no completion in 10 s after the receive was posted");
	} else {
		check(wc.status == IBV_WC_SUCCESS, "rnr: rnr_retry 7, receive posted after 200 ms: "
		      "SEND completed with %s after %.1f ms", ibv_wc_status_str(wc.status),
		      now_ms() - t0);
	}
	cli_report(&c, &r, NULL);
	check(r.recv_ok == 1 && r.recv_len == 64 && !memcmp(r.recv_data, buf[3], 64),
	      "rnr: the server received %u message(s) (want 1, 64 bytes of 0x33: got %u bytes of "
	      "0x%02x)", r.recv_ok, r.recv_len, r.recv_data[0]);
	bool rts = true;
	for (int i = 0; i < NQP; i++)
		rts &= r.qp_state[i] == IBV_QPS_RTS;
	check(rts, "rnr: the server's QPs stay RTS after sending RNR NAKs (%s %s %s %s)",
	      state_name(r.qp_state[0]), state_name(r.qp_state[1]), state_name(r.qp_state[2]),
	      state_name(r.qp_state[3]));
	ibv_dereg_mr(mr);
	cli_close(&c);
	return failures ? 1 : 0;
}

/* ---- stream: the server dies under it ---- */

static int run_stream(const struct opts *o)
{
	struct cli c = { 0 };
	uint32_t size = (uint32_t)o->size, depth = (uint32_t)o->depth;
	uint64_t posted = 0, done = 0;
	uint8_t *src;
	struct ibv_mr *mr;
	struct ibv_wc wc;
	double last_ok = 0, t_err = 0, t_ready = 0, budget = budget_ms(o->timeout, o->retry);
	bool ready = false;

	cli_setup(&c, o, 1, NULL, NULL, NULL);
	src = aligned_alloc(PAGE, (size_t)depth * size);
	if (!src || size > c.w.data_len)
		die("out of memory or --size too large");
	memset(src, 0x42, (size_t)depth * size);
	mr = reg(&c.d, src, (size_t)depth * size, IBV_ACCESS_LOCAL_WRITE);
	uint32_t slots = c.w.data_len / size;
	for (;;) {
		while (posted - done < depth) {
			if (post_one(c.qp[0], IBV_WR_RDMA_WRITE, posted, src + (posted % depth) * size,
				     size, mr->lkey, c.w.data_va + (posted % slots) * size,
				     c.w.data_rkey, 0))
				die("ibv_post_send failed at %llu", (unsigned long long)posted);
			posted++;
		}
		double lim = ready ? t_ready + 10000 : now_ms() + 30000;
		if (!poll_one(c.cq, &wc, lim)) {
			check(false, "stream: no completion for %s (%llu done)",
			      ready ? "10 s after the server was to be killed" : "30 s",
			      (unsigned long long)done);
			return 1;
		}
		if (wc.status != IBV_WC_SUCCESS) {
			t_err = now_ms();
			break;
		}
		if (wc.wr_id != done) {
			check(false, "stream: completion for wr_id %llu, expected %llu",
			      (unsigned long long)wc.wr_id, (unsigned long long)done);
			return 1;
		}
		done++;
		last_ok = now_ms();
		if (!ready && done >= (uint64_t)o->count) {
			FILE *f = fopen(o->ready, "w");
			if (!f)
				die("%s: %s", o->ready, strerror(errno));
			fclose(f);
			ready = true;
			t_ready = now_ms();
			printf("stream: %llu WRITEs of %u bytes done: ready for the kill\n",
			       (unsigned long long)done, size);
			fflush(stdout);
		}
	}
	double el = t_err - last_ok;
	double lo = 0.5 * budget, hi = 1.5 * budget + 50;
	printf("stream: %llu WRITEs completed; the first error came %.1f ms after the last success "
	       "(%.1f ms after the ready file); budget %.1f ms (timeout %d, retry_cnt %d)\n",
	       (unsigned long long)done, el, t_err - t_ready, budget, o->timeout, o->retry);
	check(ready, "stream: the error came after the ready file (%llu WRITEs before it)",
	      (unsigned long long)done);
	check(wc.status == IBV_WC_RETRY_EXC_ERR && wc.wr_id == done,
	      "stream: WRITE %llu (the oldest outstanding) completed with %s (want %s)",
	      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
	      ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR));
	check(el >= lo && el <= hi, "stream: %.1f ms from the last success to %s, budget %.1f ms, "
	      "accepted [%.1f, %.1f] ms", el, ibv_wc_status_str(wc.status), budget, lo, hi);
	uint64_t rest = posted - done - 1, flushed = 0, other = 0, next = done + 1;
	bool order = true;
	double td = now_ms() + 5000;
	while (flushed + other < rest && poll_one(c.cq, &wc, td)) {
		if (wc.status == IBV_WC_WR_FLUSH_ERR)
			flushed++;
		else
			other++;
		if (wc.wr_id != next++)
			order = false;
	}
	check(flushed == rest && order, "stream: the other %llu outstanding WRITEs: %llu "
	      "IBV_WC_WR_FLUSH_ERR, %llu other, %llu missing, %s", (unsigned long long)rest,
	      (unsigned long long)flushed, (unsigned long long)other,
	      (unsigned long long)(rest - flushed - other), order ? "in order" : "OUT OF ORDER");
	/* The server is dead: no BYE, no report. */
	close(c.fd);
	ibv_destroy_qp(c.qp[0]);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(c.cq);
	ibv_dealloc_pd(c.d.pd);
	ibv_close_device(c.d.ctx);
	free(src);
	return failures ? 1 : 0;
}

/* ---- hostile: crafted RoCEv2 packets ---- */

/*
 * The RoCEv2 ICRC (IBA Annex A17.8) of datagram p[0..len), whose last 4
 * bytes are for it: zlib's crc32 over 8 bytes of ones, the IPv4 header
 * with TOS, TTL and checksum ones (DF, and identification ipid, as
 * send_pkt() sends it: 0 unless a case says), the UDP header with its checksum ones, and the
 * datagram with BTH byte 4 ones; stored little-endian.  Written from the
 * spec and icrc_check.py, not from transport/udp/icrc.c: a second
 * opinion.
 */
static void seal_id(uint8_t *p, size_t len, struct in_addr src, struct in_addr dst, uint16_t sport,
		    uint16_t ipid)
{
	uint8_t ph[8 + 20 + 8];
	uint8_t *ip = ph + 8, *udp = ph + 28, ones = 0xff;
	uLong crc;

	memset(ph, 0xff, 8);
	ip[0] = 0x45;
	ip[1] = 0xff;
	put16(ip + 2, (uint16_t)(20 + 8 + len));
	put16(ip + 4, ipid);
	put16(ip + 6, 0x4000);
	ip[8] = 0xff;
	ip[9] = IPPROTO_UDP;
	put16(ip + 10, 0xffff);
	memcpy(ip + 12, &src, 4);
	memcpy(ip + 16, &dst, 4);
	put16(udp, sport);
	put16(udp + 2, ROCE_PORT);
	put16(udp + 4, (uint16_t)(8 + len));
	put16(udp + 6, 0xffff);
	crc = crc32(0, ph, sizeof(ph));
	crc = crc32(crc, p, 4);
	crc = crc32(crc, &ones, 1);
	crc = crc32(crc, p + 5, (uInt)(len - 4 - 5));
	for (int i = 0; i < 4; i++)
		p[len - 4 + i] = (uint8_t)(crc >> (8 * i));
}

static void seal(uint8_t *p, size_t len, struct in_addr src, struct in_addr dst, uint16_t sport)
{
	seal_id(p, len, src, dst, sport, 0);
}

/* BTH (IBA 9.2): opcode, SE/M/pad/TVer, P_Key, DestQP, AckReq and PSN. */
static size_t bth(uint8_t *p, uint8_t opcode, unsigned pad, unsigned tver, uint32_t qpn,
		  uint32_t psn)
{
	p[0] = opcode;
	p[1] = (uint8_t)((pad & 3) << 4 | (tver & 15));
	put16(p + 2, 0xffff);
	put32(p + 4, qpn & 0xffffff);
	put32(p + 8, 1u << 31 | (psn & 0xffffff));
	return 12;
}

static size_t reth(uint8_t *p, uint64_t va, uint32_t rkey, uint32_t len)
{
	put64(p, va);
	put32(p + 8, rkey);
	put32(p + 12, len);
	return 16;
}

enum { OP_SEND_FIRST = 0x00, OP_SEND_ONLY = 0x04, OP_WRITE_MIDDLE = 0x07, OP_WRITE_ONLY = 0x0a, OP_READ_REQ = 0x0c,
       OP_READ_RESP_FIRST = 0x0d, OP_READ_RESP_MIDDLE = 0x0e, OP_READ_RESP_ONLY = 0x10,
       OP_ACK = 0x11, OP_ATOMIC_ACK = 0x12, OP_FETCH_ADD = 0x14, TR_UD = 0x60 };

struct pkt {
	const char *what;
	uint8_t buf[1600];
	size_t len;
	bool spoof;		/* from the second address */
	bool seen;		/* found in the server's capture */
	uint16_t ipid;		/* its IPv4 identification (0: as softverbs sends) */
};

#define MAX_PKTS 40

struct hostile {
	struct cli c;
	int sock;		/* raw (IPPROTO_RAW): IPv4 and UDP headers are ours */
	struct in_addr me, other, srv;
	uint16_t port, spoof_port;
	struct pkt p[MAX_PKTS];
	int n;
};

/* A datagram: BTH, headers ext[0..elen), payload fill x plen, pad, ICRC
 * (bad: one bit off).  Returns it for more changes before sending. */
static struct pkt *forge(struct hostile *x, const char *what, uint8_t opcode, uint32_t qpn,
			 uint32_t psn, const uint8_t *ext, size_t elen, uint8_t fill, size_t plen,
			 unsigned tver, bool spoof, bool bad_icrc)
{
	unsigned pad = (unsigned)(-plen & 3);
	struct pkt *k;
	size_t n;

	if (x->n >= MAX_PKTS)
		die("too many packets");
	k = &x->p[x->n++];
	memset(k, 0, sizeof(*k));
	k->what = what;
	k->spoof = spoof;
	n = bth(k->buf, opcode, pad, tver, qpn, psn);
	if (elen)
		memcpy(k->buf + n, ext, elen);
	n += elen;
	memset(k->buf + n, fill, plen);
	n += plen + pad + 4;
	k->len = n;
	seal(k->buf, n, spoof ? x->other : x->me, x->srv, spoof ? x->spoof_port : x->port);
	if (bad_icrc)
		k->buf[n - 1] ^= 0x01;
	return k;
}

/* k as a sender that numbers its IPv4 identifications sends it (rxe,
 * RoCE NICs): ipid in its header, its ICRC for that (bad: one bit off). */
static struct pkt *renumber(struct hostile *x, struct pkt *k, uint16_t ipid, bool bad_icrc)
{
	k->ipid = ipid;
	seal_id(k->buf, k->len, k->spoof ? x->other : x->me, x->srv,
		k->spoof ? x->spoof_port : x->port, ipid);
	if (bad_icrc)
		k->buf[k->len - 1] ^= 0x01;
	return k;
}

/* Raw bytes, no ICRC computed (the truncated and garbage ones). */
static struct pkt *raw_pkt(struct hostile *x, const char *what, const uint8_t *b, size_t len)
{
	struct pkt *k;

	if (x->n >= MAX_PKTS)
		die("too many packets");
	k = &x->p[x->n++];
	memset(k, 0, sizeof(*k));
	k->what = what;
	memcpy(k->buf, b, len);
	k->len = len;
	return k;
}

/*
 * Each datagram leaves through a raw socket with headers of our making,
 * as an attacker's would: IPv4 with DF and identification 0 or the
 * case's (the kernel fills in the total length and the checksum, raw(7),
 * and leaves a DF packet's identification as given), UDP to 4791 with checksum 0 (none, which
 * an IPv4 receiver accepts and RoCEv2 permits, Annex A17).  The source
 * address is whatever the case says, the second one bound by no socket.
 */
static void send_pkt(struct hostile *x, const struct pkt *k)
{
	uint8_t d[20 + 8 + sizeof(k->buf)];
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_addr = x->srv };
	struct in_addr src = k->spoof ? x->other : x->me;

	memset(d, 0, 28);
	d[0] = 0x45;
	put16(d + 4, k->ipid);
	put16(d + 6, 0x4000);
	d[8] = 64;
	d[9] = IPPROTO_UDP;
	memcpy(d + 12, &src, 4);
	memcpy(d + 16, &x->srv, 4);
	put16(d + 20, k->spoof ? x->spoof_port : x->port);
	put16(d + 22, ROCE_PORT);
	put16(d + 24, (uint16_t)(8 + k->len));
	memcpy(d + 28, k->buf, k->len);
	if (sendto(x->sock, d, 28 + k->len, 0, (struct sockaddr *)&to, sizeof(to)) !=
	    (ssize_t)(28 + k->len))
		die("sendto (%s): %s", k->what, strerror(errno));
	usleep(1000);
}

/* ---- reading captures (SOFTVERBS_PCAP, classic pcap, Ethernet) ---- */

struct frame {
	struct in_addr src, dst;
	const uint8_t *pl;	/* the UDP payload */
	size_t len;
};

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *b = NULL;
	size_t cap = 0, n = 0, r;

	if (!f)
		return NULL;
	do {
		if (n == cap) {
			cap = cap ? cap * 2 : 1 << 20;
			b = realloc(b, cap);
			if (!b)
				die("out of memory");
		}
		r = fread(b + n, 1, cap - n, f);
		n += r;
	} while (r);
	fclose(f);
	*len = n;
	return b;
}

/* The next frame of capture b[0..len) from *off; false at the end. */
static bool next_frame(const uint8_t *b, size_t len, size_t *off, struct frame *fr)
{
	if (*off == 0)
		*off = 24;
	while (*off + 16 <= len) {
		uint32_t incl;
		memcpy(&incl, b + *off + 8, 4);
		const uint8_t *e = b + *off + 16;
		*off += 16 + incl;
		if (*off > len)
			return false;
		if (incl < 14 + 20 + 8 || e[12] != 0x08 || e[13] != 0x00)
			continue;
		const uint8_t *ip = e + 14;
		size_t ihl = (size_t)(ip[0] & 15) * 4;
		if (ip[9] != IPPROTO_UDP || incl < 14 + ihl + 8)
			continue;
		const uint8_t *udp = ip + ihl;
		size_t ulen = (size_t)udp[4] << 8 | udp[5];
		if (ulen < 8 || 14 + ihl + ulen > incl)
			continue;
		memcpy(&fr->src, ip + 12, 4);
		memcpy(&fr->dst, ip + 16, 4);
		fr->pl = udp + 8;
		fr->len = ulen - 8;
		return true;
	}
	return false;
}

static char *cap_path(const char *pattern, int pid)
{
	static char buf[2][512];
	static int k;
	char *out = buf[k++ & 1];
	const char *at = strstr(pattern, "%p");

	if (!at)
		snprintf(out, 512, "%s", pattern);
	else
		snprintf(out, 512, "%.*s%d%s", (int)(at - pattern), pattern, pid, at + 2);
	return out;
}

/* The responder's answer to client QP qpn at psn in our capture: the
 * AETH syndrome of an ACK (0x00-0x1f ACK, 0x20 RNR, 0x60 NAK), -1 for
 * none; *reads counts READ responses to that QP. */
static int answer_of(const uint8_t *b, size_t len, struct in_addr from, uint32_t qpn, uint32_t psn,
		     int *reads)
{
	struct frame fr;
	size_t off = 0;
	int syn = -1;

	*reads = 0;
	while (next_frame(b, len, &off, &fr)) {
		if (fr.src.s_addr != from.s_addr || fr.len < 16 ||
		    (get32(fr.pl + 4) & 0xffffff) != qpn)
			continue;
		uint8_t op = fr.pl[0];
		if (op >= OP_READ_RESP_FIRST && op <= OP_READ_RESP_ONLY)
			(*reads)++;
		if (op == OP_ACK && fr.len >= 20 && (get32(fr.pl + 8) & 0xffffff) == psn)
			syn = fr.pl[12];
	}
	return syn;
}

static const char *syn_name(int syn)
{
	if (syn < 0)
		return "no answer";
	if (syn == 0x61)
		return "NAK Invalid Request";
	if (syn == 0x62)
		return "NAK Remote Access Error";
	if (syn == 0x63)
		return "NAK Remote Operational Error";
	if (syn == 0x60)
		return "NAK PSN Sequence Error";
	if ((syn & 0xe0) == 0x20)
		return "RNR NAK";
	if ((syn & 0xe0) == 0)
		return "ACK";
	return "other";
}

/* Refused requests, one server QP each: a NAK for remote access or an
 * invalid request takes the responder's QP to ERR (as rxe does), and a
 * QP in ERR drops whatever comes next, so a case sharing a QP with an
 * earlier one would prove nothing. */
struct refusal {
	const char *what;
	int syn;		/* the NAK expected */
	uint64_t off;		/* data MR bytes that must not change, [off, off + len) */
	uint32_t len;
};

static int run_hostile(const struct opts *o)
{
	enum { QP_MAIN, QP_CTRL, QP_RKEY, QP_OOB, QP_RO, QP_SEQ, QP_WRAP, QP_READ, QP_OVER, QP_ATOM,
	       QP_MTU, QP_MIDSEND, QP_MIDREAD, QP_HUGE, NQP };
	static struct hostile x;
	struct cli *c = &x.c;
	const uint32_t recvs[NQP] = { [QP_MAIN] = 2, [QP_MIDSEND] = 1, [QP_MIDREAD] = 1 };
	const uint64_t off_ctrl = 0x1000, off_bad = 0x2000, off_legit = 0x8000;
	uint8_t e[64], legit_w[4096], legit_s[64];
	struct ibv_mr *mr_w, *mr_s;
	struct report r;
	uint8_t *data = malloc(DATA_LEN);

	if (!data)
		die("out of memory");
	cli_setup(c, o, NQP, recvs, NULL, NULL);
	if (c->w.data_len != DATA_LEN)
		die("unexpected data MR length");
	if (inet_pton(AF_INET, o->addr, &x.me) != 1 || inet_pton(AF_INET, o->server, &x.srv) != 1 ||
	    !o->spoof || inet_pton(AF_INET, o->spoof, &x.other) != 1)
		die("hostile needs --addr, --server and --spoof (IPv4)");
	x.sock = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
	if (x.sock < 0)
		die("raw socket: %s (the hostile case needs CAP_NET_RAW)", strerror(errno));
	x.port = 0xc000 | (uint16_t)(getpid() & 0x3fff);
	x.spoof_port = (uint16_t)(x.port ^ 1);

	uint32_t qpn[NQP], psn[NQP], unknown = 0x5a5a5a;
	for (int i = 0; i < NQP; i++) {
		qpn[i] = c->w.qp[i].qpn;
		psn[i] = c->h.qp[i].psn;	/* what the server's QP i expects next */
		if (unknown == qpn[i])
			unknown ^= 0x10000;
	}
	uint64_t dva = c->w.data_va;
	uint32_t drk = c->w.data_rkey;
	size_t n;

	/* The control: a forged WRITE that is right in every respect must
	 * land, or the ICRC computed here (and so every case below) is
	 * wrong. */
	n = reth(e, dva + off_ctrl, drk, 64);
	send_pkt(&x, forge(&x, "control: forged WRITE, valid in every respect", OP_WRITE_ONLY,
			   qpn[QP_CTRL], psn[QP_CTRL], e, n, 0xc1, 64, 0, false, false));
	int first_barrage = x.n;

	/* Dropped without an answer, or answered but not executed; QP_MAIN
	 * must stay usable through all of them.  Each WRITE aims at its own
	 * 64 bytes from off_bad; each SEND would take one of QP_MAIN's two
	 * receives. */
	int k = 0;
#define BAD_WRITE(what, q, p, tver, spoof, badcrc) do {				\
		n = reth(e, dva + off_bad + 64 * (uint64_t)k, drk, 64);		\
		send_pkt(&x, forge(&x, what, OP_WRITE_ONLY, q, p, e, n,		\
				   (uint8_t)(0xa0 + k), 64, tver, spoof, badcrc));	\
		k++;								\
	} while (0)
	BAD_WRITE("WRITE with a bad ICRC", qpn[QP_MAIN], psn[QP_MAIN], 0, false, true);
	send_pkt(&x, forge(&x, "SEND with a bad ICRC", OP_SEND_ONLY, qpn[QP_MAIN], psn[QP_MAIN],
			   NULL, 0, 0xe1, 64, 0, false, true));
	BAD_WRITE("WRITE to an unknown QPN", unknown, psn[QP_MAIN], 0, false, false);
	BAD_WRITE("WRITE at the next PSN but one (ahead by 1)", qpn[QP_MAIN],
		  (psn[QP_MAIN] + 1) & 0xffffff, 0, false, false);
	BAD_WRITE("WRITE at a PSN 2^22 ahead", qpn[QP_MAIN], (psn[QP_MAIN] + 0x400000) & 0xffffff,
		  0, false, false);
	send_pkt(&x, forge(&x, "SEND at a PSN 2^23-1 ahead", OP_SEND_ONLY, qpn[QP_MAIN],
			   (psn[QP_MAIN] + 0x7fffff) & 0xffffff, NULL, 0, 0xe2, 64, 0, false,
			   false));
	BAD_WRITE("WRITE at a PSN 2^22 behind", qpn[QP_MAIN], (psn[QP_MAIN] - 0x400000) & 0xffffff,
		  0, false, false);
	send_pkt(&x, forge(&x, "SEND at a PSN 2^23 behind", OP_SEND_ONLY, qpn[QP_MAIN],
			   (psn[QP_MAIN] + 0x800000) & 0xffffff, NULL, 0, 0xe3, 64, 0, false,
			   false));
	BAD_WRITE("WRITE from another source address (the right QPN and PSN)", qpn[QP_MAIN],
		  psn[QP_MAIN], 0, true, false);
	send_pkt(&x, forge(&x, "SEND from another source address (the right QPN and PSN)",
			   OP_SEND_ONLY, qpn[QP_MAIN], psn[QP_MAIN], NULL, 0, 0xe4, 64, 0, true,
			   false));
	BAD_WRITE("WRITE with BTH TVer 1", qpn[QP_MAIN], psn[QP_MAIN], 1, false, false);
	/* As rxe and RoCE NICs send IPv4: refused by default, since a UDP
	 * socket cannot see the identification (SOFTVERBS_IPV4_ID=gso; the
	 * end of udp_faults.sh's section 6 runs the "foreign" mode with
	 * any). */
	n = reth(e, dva + off_bad + 64 * (uint64_t)k, drk, 64);
	send_pkt(&x, renumber(&x, forge(&x, "WRITE with IPv4 identification 0x718c, its ICRC for it "
					"(as rxe and NICs send)", OP_WRITE_ONLY, qpn[QP_MAIN],
					psn[QP_MAIN], e, n, (uint8_t)(0xa0 + k), 64, 0, false,
					false), 0x718c, false));
	k++;
	{
		uint8_t b[64];
		memset(b, 0, sizeof(b));
		send_pkt(&x, raw_pkt(&x, "an empty datagram", b, 0));
		bth(b, OP_WRITE_ONLY, 0, 0, qpn[QP_MAIN], psn[QP_MAIN]);
		send_pkt(&x, raw_pkt(&x, "5 bytes (part of a BTH)", b, 5));
		send_pkt(&x, raw_pkt(&x, "15 bytes (a BTH and 3 of an ICRC)", b, 15));
	}
	send_pkt(&x, forge(&x, "WRITE_ONLY with a BTH and no RETH (valid ICRC)", OP_WRITE_ONLY,
			   qpn[QP_MAIN], psn[QP_MAIN], NULL, 0, 0, 0, 0, false, false));
	n = reth(e, dva + off_bad + 64 * (uint64_t)k++, drk, 64);
	send_pkt(&x, forge(&x, "WRITE_ONLY with 8 of its RETH's 16 bytes (valid ICRC)",
			   OP_WRITE_ONLY, qpn[QP_MAIN], psn[QP_MAIN], e, 8, 0, 0, 0, false, false));
	send_pkt(&x, forge(&x, "reserved RC opcode 0x15", 0x15, qpn[QP_MAIN], psn[QP_MAIN], NULL, 0,
			   0xe5, 64, 0, false, false));
	send_pkt(&x, forge(&x, "opcode 0x9f (CNP transport, reserved operation)", 0x9f, qpn[QP_MAIN],
			   psn[QP_MAIN], NULL, 0, 0xe6, 64, 0, false, false));
	{
		uint8_t d[8];
		put32(d, 0x11111111);
		put32(d + 4, qpn[QP_MAIN]);
		send_pkt(&x, forge(&x, "UD SEND_ONLY (DETH) to the RC QP", TR_UD | OP_SEND_ONLY,
				   qpn[QP_MAIN], psn[QP_MAIN], d, 8, 0xe7, 64, 0, false, false));
	}
	{
		uint8_t g[1200];
		unsigned s = 12345;
		for (size_t i = 0; i < sizeof(g); i++) {
			s = s * 1103515245 + 12345;
			g[i] = (uint8_t)(s >> 16);
		}
		g[0] = 0x1d;	/* reserved opcode, whatever else it carries */
		send_pkt(&x, raw_pkt(&x, "1200 bytes of noise", g, sizeof(g)));
	}
#undef BAD_WRITE
	int nbad = k;

	/* Refused: each at the PSN its QP expects (or that many after it),
	 * with a valid ICRC. */
	struct refusal rf[NQP] = { 0 };
	const uint32_t rf_at[NQP] = { [QP_MIDSEND] = 1, [QP_MIDREAD] = 0xffffff };
	n = reth(e, dva + 0x3000, drk ^ 0x80, 64);
	rf[QP_RKEY] = (struct refusal){ "WRITE with a wrong rkey (the data MR's, key byte changed)",
					0x62, 0x3000, 64 };
	send_pkt(&x, forge(&x, rf[QP_RKEY].what, OP_WRITE_ONLY, qpn[QP_RKEY], psn[QP_RKEY], e, n,
			   0xb1, 64, 0, false, false));
	n = reth(e, dva + DATA_LEN - 32, drk, 64);
	rf[QP_OOB] = (struct refusal){ "WRITE of 64 bytes at the data MR's last 32", 0x62,
				       DATA_LEN - 32, 32 };
	send_pkt(&x, forge(&x, rf[QP_OOB].what, OP_WRITE_ONLY, qpn[QP_OOB], psn[QP_OOB], e, n, 0xb2,
			   64, 0, false, false));
	n = reth(e, c->w.ro_va, c->w.ro_rkey, 64);
	rf[QP_RO] = (struct refusal){ "WRITE to an MR without IBV_ACCESS_REMOTE_WRITE", 0x62, 0, 0 };
	send_pkt(&x, forge(&x, rf[QP_RO].what, OP_WRITE_ONLY, qpn[QP_RO], psn[QP_RO], e, n, 0xb3, 64,
			   0, false, false));
	rf[QP_SEQ] = (struct refusal){ "WRITE_MIDDLE without a WRITE_FIRST", 0x61, 0, 0 };
	send_pkt(&x, forge(&x, rf[QP_SEQ].what, OP_WRITE_MIDDLE, qpn[QP_SEQ], psn[QP_SEQ], NULL, 0,
			   0xb4, 1024, 0, false, false));
	n = reth(e, UINT64_MAX - 63, drk, 128);
	rf[QP_WRAP] = (struct refusal){ "WRITE whose range wraps past 2^64", 0x62, 0, 0 };
	send_pkt(&x, forge(&x, rf[QP_WRAP].what, OP_WRITE_ONLY, qpn[QP_WRAP], psn[QP_WRAP], e, n,
			   0xb5, 128, 0, false, false));
	n = reth(e, dva - 64, drk, 128);
	rf[QP_READ] = (struct refusal){ "READ of 128 bytes from 64 before the data MR", 0x62, 0, 0 };
	send_pkt(&x, forge(&x, rf[QP_READ].what, OP_READ_REQ, qpn[QP_READ], psn[QP_READ], e, n, 0,
			   0, 0, false, false));
	n = reth(e, dva + DATA_LEN - 16, drk, 16);
	rf[QP_OVER] = (struct refusal){ "WRITE_ONLY with 64 bytes of payload, 16 in its RETH, at the "
					"MR's last 16", 0x61, DATA_LEN - 16, 16 };
	send_pkt(&x, forge(&x, rf[QP_OVER].what, OP_WRITE_ONLY, qpn[QP_OVER], psn[QP_OVER], e, n,
			   0xb6, 64, 0, false, false));
	put64(e, dva + 0x3100);
	put32(e + 8, drk);
	put64(e + 12, 0x0101010101010101ull);
	put64(e + 20, 0);
	rf[QP_ATOM] = (struct refusal){ "FETCH_ADD on the data MR (no IBV_ACCESS_REMOTE_ATOMIC)",
					0x62, 0x3100, 8 };
	send_pkt(&x, forge(&x, rf[QP_ATOM].what, OP_FETCH_ADD, qpn[QP_ATOM], psn[QP_ATOM], e, 28, 0,
			   0, 0, false, false));
	n = reth(e, dva + 0x4000, drk, 1400);
	rf[QP_MTU] = (struct refusal){ "WRITE_ONLY of 1400 bytes, over the 1024-byte path MTU", 0x61,
				       0x4000, 1400 };
	send_pkt(&x, forge(&x, rf[QP_MTU].what, OP_WRITE_ONLY, qpn[QP_MTU], psn[QP_MTU], e, n, 0xb7,
			   1400, 0, false, false));
	/* A SEND under way, its receive WQE taken, then a WRITE, or a READ
	 * at the PSN before (a duplicate) with a wrong rkey: each receive
	 * completes in error, never as a success (the server counts 2). */
	send_pkt(&x, forge(&x, "SEND_FIRST of 1024 bytes (its receive taken)", OP_SEND_FIRST,
			   qpn[QP_MIDSEND], psn[QP_MIDSEND], NULL, 0, 0xb8, 1024, 0, false, false));
	n = reth(e, dva + 0x5000, drk, 64);
	rf[QP_MIDSEND] = (struct refusal){ "WRITE_ONLY inside a SEND after its SEND_FIRST", 0x61,
					   0x5000, 64 };
	send_pkt(&x, forge(&x, rf[QP_MIDSEND].what, OP_WRITE_ONLY, qpn[QP_MIDSEND],
			   (psn[QP_MIDSEND] + 1) & 0xffffff, e, n, 0xb9, 64, 0, false, false));
	send_pkt(&x, forge(&x, "SEND_FIRST of 1024 bytes (its receive taken)", OP_SEND_FIRST,
			   qpn[QP_MIDREAD], psn[QP_MIDREAD], NULL, 0, 0xba, 1024, 0, false, false));
	n = reth(e, dva + 0x5000, drk ^ 0x80, 64);
	rf[QP_MIDREAD] = (struct refusal){ "a duplicate READ with a wrong rkey inside a SEND", 0x62,
					   0, 0 };
	send_pkt(&x, forge(&x, rf[QP_MIDREAD].what, OP_READ_REQ, qpn[QP_MIDREAD],
			   (psn[QP_MIDREAD] - 1) & 0xffffff, e, n, 0, 0, 0, false, false));
	/* Longer than a message may be (2^31), whatever the MR. */
	n = reth(e, dva, drk, 0x80000001u);
	rf[QP_HUGE] = (struct refusal){ "READ of 2^31 + 1 bytes", 0x61, 0, 0 };
	send_pkt(&x, forge(&x, rf[QP_HUGE].what, OP_READ_REQ, qpn[QP_HUGE], psn[QP_HUGE], e, n, 0,
			   0, 0, false, false));

	usleep(300000);

	/* Then a real client: a WRITE and a SEND on QP_MAIN. */
	for (size_t i = 0; i < sizeof(legit_w); i++)
		legit_w[i] = (uint8_t)(i * 7 + 0x11);
	memset(legit_s, 0x5e, sizeof(legit_s));
	mr_w = reg(&c->d, legit_w, sizeof(legit_w), IBV_ACCESS_LOCAL_WRITE);
	mr_s = reg(&c->d, legit_s, sizeof(legit_s), IBV_ACCESS_LOCAL_WRITE);
	if (post_one(c->qp[QP_MAIN], IBV_WR_RDMA_WRITE, 1, legit_w, sizeof(legit_w), mr_w->lkey,
		     dva + off_legit, drk, 0) ||
	    post_one(c->qp[QP_MAIN], IBV_WR_SEND, 2, legit_s, sizeof(legit_s), mr_s->lkey, 0, 0, 0))
		die("ibv_post_send failed");
	for (int i = 1; i <= 2; i++) {
		struct ibv_wc wc;
		bool got = poll_one(c->cq, &wc, now_ms() + 10000);
		check(got && wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)i,
		      "hostile: afterwards a legitimate %s on the same QP completes: %s",
		      i == 1 ? "RDMA WRITE of 4096 bytes" : "SEND of 64 bytes",
		      got ? ibv_wc_status_str(wc.status) : "no completion in 10 s");
	}
	usleep(50000);
	cli_report(c, &r, data);

	/* What the server's memory says. */
	check(r.canary_ok, "hostile: the server's canaries (the bytes around its MRs) are intact");
	check(r.ro_ok, "hostile: the server's MR without remote write is unchanged");
	check(r.recv_ok == 1 && r.recv_len == 64 && !memcmp(r.recv_data, legit_s, 64) &&
	      r.recv_err == 2,
	      "hostile: the server received exactly the legitimate SEND, and the refused SENDs' "
	      "receives completed in error (%u receive(s), %u bytes of 0x%02x; %u error "
	      "completion(s), want 2)", r.recv_ok, r.recv_len, r.recv_data[0], r.recv_err);
	bool ctrl = all_bytes(data + off_ctrl, 64, 0xc1, NULL);
	check(ctrl, "hostile: control: the forged valid WRITE landed (so this program's ICRC and "
	      "headers are right, and the refusals below mean something)");
	check(!memcmp(data + off_legit, legit_w, sizeof(legit_w)),
	      "hostile: the legitimate WRITE's 4096 bytes are in the server's MR");
	for (int i = 0; i < nbad; i++) {
		size_t at = 0;
		bool same = true;
		for (size_t j = 0; j < 64; j++)
			if (data[off_bad + 64 * i + j] != init_byte(off_bad + 64 * i + j)) {
				same = false;
				at = j;
				break;
			}
		if (!same)
			check(false, "hostile: refused WRITE %d (fill 0x%02x) changed the MR at +0x%llx",
			      i, 0xa0 + i, (unsigned long long)(off_bad + 64 * i + at));
	}
	uint64_t changed = 0, first = 0;
	for (uint64_t i = 0; i < DATA_LEN; i++) {
		bool mine = (i >= off_ctrl && i < off_ctrl + 64) ||
			    (i >= off_legit && i < off_legit + sizeof(legit_w));
		if (!mine && data[i] != init_byte(i) && !changed++)
			first = i;
	}
	check(!changed, "hostile: no other byte of the data MR changed (%llu did, first at "
	      "+0x%llx)", (unsigned long long)changed, (unsigned long long)first);
	check(r.qp_state[QP_MAIN] == IBV_QPS_RTS, "hostile: the server's attacked QP is still %s",
	      state_name(r.qp_state[QP_MAIN]));

	/* The captures: every datagram reached the server's softverbs (its
	 * capture records what it receives, before any check), so no
	 * refusal above was the kernel's; and each refused request got its
	 * NAK. */
	const char *pat = getenv("SOFTVERBS_PCAP");
	if (!pat) {
		check(false, "hostile: SOFTVERBS_PCAP is not set: the captures cannot be checked");
	} else {
		size_t sl = 0, ml = 0;
		uint8_t *sb = slurp(cap_path(pat, c->w.pid), &sl);
		uint8_t *mb = slurp(cap_path(pat, getpid()), &ml);
		int missing = 0, empty = -1;
		if (!sb || !mb)
			check(false, "hostile: captures %s, %s: cannot read them",
			      cap_path(pat, c->w.pid), cap_path(pat, getpid()));
		for (int i = 0; sb && i < x.n; i++) {
			struct frame fr;
			size_t off = 0;
			struct in_addr from = x.p[i].spoof ? x.other : x.me;
			while (!x.p[i].seen && next_frame(sb, sl, &off, &fr))
				x.p[i].seen = fr.src.s_addr == from.s_addr && fr.len == x.p[i].len &&
					      !memcmp(fr.pl, x.p[i].buf, fr.len);
			if (!x.p[i].len) {
				empty = x.p[i].seen;
			} else if (!x.p[i].seen) {
				missing++;
				printf("    not in the server's capture: %s\n", x.p[i].what);
			}
		}
		if (sb) {
			check(!missing, "hostile: all %d non-empty crafted datagrams reached the server's "
			      "softverbs (%d missing from its capture)", x.n - 1, missing);
			/* The kernel delivers a 0-byte datagram like any other; the
			 * capture (every packet received) and the malformed-packet
			 * count (DESIGN 5) must see it too. */
			check(empty == 1, "hostile: the empty UDP datagram reached the server's softverbs "
			      "(in its capture)");
		}
		for (int i = first_barrage; i < x.n; i++)
			printf("    sent: %s (%zu bytes%s)\n", x.p[i].what, x.p[i].len,
			       x.p[i].spoof ? ", from the second address" : "");
		int reads;
		int syn = mb ? answer_of(mb, ml, x.srv, c->h.qp[QP_CTRL].qpn, psn[QP_CTRL], &reads) : -1;
		check(syn >= 0 && (syn & 0xe0) == 0, "hostile: control: answered with %s",
		      syn_name(syn));
		for (int i = QP_RKEY; mb && i < NQP; i++) {
			syn = answer_of(mb, ml, x.srv, c->h.qp[i].qpn, (psn[i] + rf_at[i]) & 0xffffff,
					&reads);
			bool mem = true;
			if (rf[i].len) {
				for (uint32_t j = 0; j < rf[i].len; j++)
					if (data[rf[i].off + j] != init_byte(rf[i].off + j))
						mem = false;
			}
			check(syn == rf[i].syn && mem && !reads,
			      "hostile: %s: refused with %s (want %s), %s%s, server QP now %s",
			      rf[i].what, syn_name(syn), syn_name(rf[i].syn),
			      rf[i].len ? (mem ? "its target bytes unchanged" :
					   "its target bytes CHANGED") : "no target bytes",
			      reads ? ", and READ RESPONSES WERE SENT" : "",
			      state_name(r.qp_state[i]));
		}
		free(sb);
		free(mb);
	}
	/* The attacked QP lives until the test has seen its drops in
	 * softverbs status (it creates the file then): a loaded machine
	 * may take longer to show them than this program takes to end. */
	if (o->hold) {
		uint64_t until = now_ms() + 20000;
		while (access(o->hold, F_OK) && now_ms() < until)
			usleep(20000);
		if (access(o->hold, F_OK))
			printf("hostile: %s did not appear in 20 s; closing\n", o->hold);
	}
	ibv_dereg_mr(mr_w);
	ibv_dereg_mr(mr_s);
	cli_close(c);
	close(x.sock);
	free(data);
	return failures ? 1 : 0;
}

/* ---- foreign: IPv4 as rxe and RoCE NICs send it ---- */

/*
 * A server run with SOFTVERBS_IPV4_ID=any takes RoCEv2 packets whose IPv4
 * identification is numbered, as the kernel's rxe and RoCE NICs number
 * theirs, and whose ICRC is computed for it: a WRITE carrying 0x718c (the
 * ConnectX-4 Lx frame's) lands, one carrying 0xbeef with its ICRC one bit
 * off does not, and a legitimate WRITE still completes.  The default
 * refuses the first too (hostile).
 */
static int run_foreign(const struct opts *o)
{
	static struct hostile x;
	struct cli *c = &x.c;
	const uint32_t recvs[2] = { 0 };
	const uint64_t off_taken = 0x1000, off_bad = 0x2000, off_legit = 0x3000;
	uint8_t e[64], legit[256];
	struct report r;
	uint8_t *data = malloc(DATA_LEN);

	if (!data)
		die("out of memory");
	cli_setup(c, o, 2, recvs, NULL, NULL);
	if (c->w.data_len != DATA_LEN)
		die("unexpected data MR length");
	if (inet_pton(AF_INET, o->addr, &x.me) != 1 || inet_pton(AF_INET, o->server, &x.srv) != 1)
		die("foreign needs --addr and --server (IPv4)");
	x.sock = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
	if (x.sock < 0)
		die("raw socket: %s (the foreign case needs CAP_NET_RAW)", strerror(errno));
	x.port = 0xc000 | (uint16_t)(getpid() & 0x3fff);
	uint64_t dva = c->w.data_va;
	uint32_t drk = c->w.data_rkey;
	size_t n = reth(e, dva + off_taken, drk, 64);
	send_pkt(&x, renumber(&x, forge(&x, "WRITE with IPv4 identification 0x718c", OP_WRITE_ONLY,
					c->w.qp[0].qpn, c->h.qp[0].psn, e, n, 0xc1, 64, 0, false,
					false), 0x718c, false));
	n = reth(e, dva + off_bad, drk, 64);
	send_pkt(&x, renumber(&x, forge(&x, "WRITE with IPv4 identification 0xbeef, ICRC one bit off",
					OP_WRITE_ONLY, c->w.qp[1].qpn, c->h.qp[1].psn, e, n, 0xc2, 64,
					0, false, false), 0xbeef, true));
	usleep(300000);
	for (size_t i = 0; i < sizeof(legit); i++)
		legit[i] = (uint8_t)(i * 5 + 3);
	struct ibv_mr *mr = reg(&c->d, legit, sizeof(legit), IBV_ACCESS_LOCAL_WRITE);
	if (post_one(c->qp[1], IBV_WR_RDMA_WRITE, 1, legit, sizeof(legit), mr->lkey,
		     dva + off_legit, drk, 0))
		die("ibv_post_send failed");
	struct ibv_wc wc;
	bool got = poll_one(c->cq, &wc, now_ms() + 10000);
	check(got && wc.status == IBV_WC_SUCCESS,
	      "foreign: afterwards a legitimate WRITE on the other QP completes: %s",
	      got ? ibv_wc_status_str(wc.status) : "no completion in 10 s");
	cli_report(c, &r, data);
	check(all_bytes(data + off_taken, 64, 0xc1, NULL),
	      "foreign: the WRITE with IPv4 identification 0x718c landed");
	bool same = true;
	for (size_t j = 0; j < 64; j++)
		same = same && data[off_bad + j] == init_byte(off_bad + j);
	check(same, "foreign: the WRITE whose ICRC was one bit off did not");
	check(!memcmp(data + off_legit, legit, sizeof(legit)),
	      "foreign: the legitimate WRITE's bytes are in the server's MR");
	check(r.canary_ok, "foreign: the server's canaries are intact");
	ibv_dereg_mr(mr);
	cli_close(c);
	close(x.sock);
	free(data);
	return failures ? 1 : 0;
}

/* ---- stale: a requester whose answered atomic sits behind a READ's hole ---- */

/*
 * A scripted responder (fakeresp: a plain UDP socket on port 4791, no
 * softverbs) against a real requester (stale), to pin one schedule of
 * losses that the random mix hit about one run in three: READ A (2
 * packets), FETCH_AND_ADD, READ B (3 packets) and an 8-byte SEND, on PSNs
 * p, p+2, p+3 and p+6.  The responder
 *   - drops the first sending of everything (the ACK timeout: the window
 *     falls to 4 packets, and only READ A's request goes again);
 *   - answers that probe with READ A's first response only;
 *   - answers the atomic and READ B as they come again, and drops the
 *     requests for READ A's second response twice (the first sending and
 *     the repair its later answers trigger), so that the ACK timeout asks
 *     for it a third time, which it answers;
 *   - acknowledges the SEND when it comes.
 * The requester then has everything before the SEND answered.  una must
 * pass the atomic, answered long ago (pkt_req.c unanswered_after): left
 * on it, the SEND sat 4 packets past una, outside the window, and even
 * the timeout's probe of it was held back by the window, so the SEND
 * ended in IBV_WC_RETRY_EXC_ERR without ever going again.
 */
#define STALE_QPN	0x5a5a5u
#define STALE_ORIG	0x1122334455667788ull

static uint8_t stale_byte(uint32_t j)
{
	return (uint8_t)(j * 7 + (j >> 8) + 1);
}

static int run_fakeresp(const char *addr, int port)
{
	struct in_addr me;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(ROCE_PORT) };
	struct hello h;
	struct welcome w = { .magic = MAGIC, .nqp = 1, .pid = getpid(), .data_len = DATA_LEN,
			     .data_va = 0x10000, .data_rkey = 0x77, .ctr_va = 0x20000,
			     .ctr_rkey = 0x78 };
	uint32_t rA0 = 0, rA1 = 0, p, cpsn = rand_psn();
	double t_last = 0;
	int ls, fd, us, rc = 1;

	if (inet_pton(AF_INET, addr, &me) != 1)
		die("bad address %s", addr);
	sin.sin_addr = me;
	us = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	int df = IP_PMTUDISC_DO;
	if (us < 0 || setsockopt(us, IPPROTO_IP, IP_MTU_DISCOVER, &df, sizeof(df)) ||
	    bind(us, (struct sockaddr *)&sin, sizeof(sin)))
		die("UDP %s:%d: %s", addr, ROCE_PORT, strerror(errno));
	ls = tcp_listen(addr, port);
	printf("fakeresp: %s:%d, RoCEv2 on %s:%d\n", addr, port, addr, ROCE_PORT);
	fflush(stdout);
	fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0 || !read_all(fd, &h, sizeof(h)) || h.magic != MAGIC || h.nqp != 1)
		die("fakeresp: bad hello");
	p = h.qp[0].psn;
	w.qp[0].qpn = STALE_QPN;
	w.qp[0].psn = cpsn;
	memset(w.gid + 10, 0xff, 2);
	memcpy(w.gid + 12, &me, 4);
	if (!write_all(fd, &w, sizeof(w)))
		die("fakeresp: the welcome could not be sent");
	double until = now_ms() + 10000;
	while (now_ms() < until) {
		uint8_t b[2048], o[1200];
		struct sockaddr_in from;
		socklen_t fl = sizeof(from);
		struct pollfd pf = { us, POLLIN, 0 };
		if (poll(&pf, 1, 100) <= 0)
			continue;
		ssize_t n = recvfrom(us, b, sizeof(b), 0, (struct sockaddr *)&from, &fl);
		if (n < 16 || (get32(b + 4) & 0xffffff) != STALE_QPN)
			continue;
		uint8_t op = b[0];
		uint32_t psn = get32(b + 8) & 0xffffff, k = (psn - p) & 0xffffff;
		/* Answers: BTH, AETH (ACK, credits invalid), then the READ's
		 * bytes [off, off + len) or the AtomicAckETH. */
		struct fake_ans { uint8_t op; uint32_t psn, off, len; } ans[3];
		int na = 0;
		if (op == OP_READ_REQ && k == 0 && ++rA0 >= 2)
			ans[na++] = (struct fake_ans){ OP_READ_RESP_FIRST, p, 0, 1024 };
		else if (op == OP_READ_REQ && k == 1 && ++rA1 >= 3)
			ans[na++] = (struct fake_ans){ OP_READ_RESP_ONLY, psn, 1024, 1024 };
		else if (op == OP_FETCH_ADD && k == 2 && rA0 >= 2)
			ans[na++] = (struct fake_ans){ OP_ATOMIC_ACK, psn, 0, 0 };
		else if (op == OP_READ_REQ && k == 3 && rA0 >= 2)
			for (uint32_t i = 0; i < 3; i++)	/* FIRST, MIDDLE, LAST */
				ans[na++] = (struct fake_ans){ (uint8_t)(OP_READ_RESP_FIRST + i), p + 3 + i,
							       2048 + i * 1024, 1024 };
		else if (op == OP_SEND_ONLY && k == 6 && rA1 >= 3) {
			ans[na++] = (struct fake_ans){ OP_ACK, psn, 0, 0 };
			check(true, "fakeresp: the SEND came %.1f ms after READ A's last response",
			      now_ms() - t_last);
			rc = 0;
		}
		for (int i = 0; i < na; i++) {
			size_t m = bth(o, ans[i].op, 0, 0, h.qp[0].qpn, ans[i].psn);
			o[8] = 0;	/* no AckReq on a response */
			if (ans[i].op != OP_READ_RESP_MIDDLE) {	/* the others have an AETH */
				put32(o + m, 0x1fu << 24 | 1);
				m += 4;
			}
			if (ans[i].op == OP_ATOMIC_ACK) {
				put64(o + m, STALE_ORIG);
				m += 8;
			}
			for (uint32_t j = 0; j < ans[i].len; j++)
				o[m + j] = stale_byte(ans[i].off + j);
			m += ans[i].len + 4;
			seal(o, m, me, from.sin_addr, ROCE_PORT);
			from.sin_port = htons(ROCE_PORT);
			if (sendto(us, o, m, 0, (struct sockaddr *)&from, sizeof(from)) != (ssize_t)m)
				die("fakeresp: sendto: %s", strerror(errno));
		}
		if (op == OP_READ_REQ && k == 1 && rA1 >= 3)
			t_last = now_ms();
		if (!rc)
			break;
	}
	check(!rc, "fakeresp: READ A asked %u times, its second response %u times; the SEND %s",
	      rA0, rA1, rc ? "never came after READ A's last response" : "acknowledged");
	struct cmd c;
	read_all(fd, &c, sizeof(c));	/* the client's BYE, or its end */
	close(fd);
	close(ls);
	close(us);
	return failures ? 1 : 0;
}

static int run_stale(const struct opts *o)
{
	struct cli c = { 0 };
	static uint8_t buf[2048 + 3072 + 8 + 8] __attribute__((aligned(8)));
	uint8_t *ra = buf, *rb = buf + 2048, *at = rb + 3072, *sd = at + 8;
	struct ibv_mr *mr;
	struct {
		enum ibv_wr_opcode op;
		uint8_t *b;
		uint32_t len;
		const char *name;
	} wr[4] = {
		{ IBV_WR_RDMA_READ, ra, 2048, "READ A" },
		{ IBV_WR_ATOMIC_FETCH_AND_ADD, at, 8, "FETCH_AND_ADD" },
		{ IBV_WR_RDMA_READ, rb, 3072, "READ B" },
		{ IBV_WR_SEND, sd, 8, "SEND" },
	};

	cli_setup(&c, o, 1, NULL, NULL, NULL);
	mr = reg(&c.d, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	memset(buf, 0xee, sizeof(buf));
	for (uint32_t i = 0; i < 4; i++)
		if (post_one(c.qp[0], wr[i].op, i, wr[i].b, wr[i].len, mr->lkey,
			     wr[i].op == IBV_WR_ATOMIC_FETCH_AND_ADD ? c.w.ctr_va : c.w.data_va,
			     wr[i].op == IBV_WR_ATOMIC_FETCH_AND_ADD ? c.w.ctr_rkey : c.w.data_rkey,
			     1))
			die("ibv_post_send %u failed", i);
	double t0 = now_ms();
	for (uint32_t i = 0; i < 4; i++) {
		struct ibv_wc wc;
		if (!poll_one(c.cq, &wc, t0 + 10000)) {
			check(false, "stale: no completion for %s in 10 s", wr[i].name);
			break;
		}
		check(wc.status == IBV_WC_SUCCESS && wc.wr_id == i,
		      "stale: %s completed %s after %.0f ms (wr_id %llu)", wr[i].name,
		      ibv_wc_status_str(wc.status), now_ms() - t0, (unsigned long long)wc.wr_id);
		if (wc.status != IBV_WC_SUCCESS)
			break;
	}
	bool data = true;
	for (uint32_t j = 0; j < 2048; j++)
		data &= ra[j] == stale_byte(j);
	for (uint32_t j = 0; j < 3072; j++)
		data &= rb[j] == stale_byte(2048 + j);
	uint64_t orig;
	memcpy(&orig, at, 8);
	check(data && orig == STALE_ORIG, "stale: both READs' bytes and the atomic's value (0x%llx) "
	      "are the responder's", (unsigned long long)orig);
	ibv_dereg_mr(mr);
	cli_close(&c);
	return failures ? 1 : 0;
}

/* ---- mix: every RC operation, checked against a model ---- */

/*
 * --count operations on each of --qps QPs, --depth outstanding on each,
 * drawn from a seeded generator (--seed; printed, so that a failure can
 * be run again): WRITE and WRITE_WITH_IMM, READ, SEND and SEND_WITH_IMM,
 * and on QP 0 FETCH_AND_ADD, COMPARE_AND_SWAP and ATOMIC_WRITE; lengths from 0 to
 * MIX_MAX_LEN with the path MTU's edges over-represented, one to three
 * scattered SGEs, inline data, unsignaled WRs.  QP i owns a slice of the
 * server's data MR; QP 0 owns its counter.
 *
 * The responder executes a QP's requests in order (IBA 9.5), so the
 * model applies a WRITE or an atomic when it is posted, and a READ must
 * return the model's bytes as they were when it was posted; a WRITE
 * whose range overlaps a READ still outstanding is fenced
 * (IBV_SEND_FENCE, IBA 10.8.3.3), since a responder may read a long
 * READ's memory as it sends the responses.  A completion must be the
 * QP's oldest signaled WR (its send queue completes in order, 10.8.3.1),
 * and it completes the unsignaled ones before it.  The server checks each
 * message it receives against mix_byte's pattern, in order
 * (HELLO_CHECK_RECV); at the end its data MR must equal the model, byte
 * for byte, and its counter the model's.
 */
#define MIX_MAX_LEN	(64u << 10)
#define MIX_GAP		64u		/* between a WR's scattered pieces */
#define MIX_MAX_SGE	3
#define MIX_MTU		1024u		/* qp_connect's path MTU */
#define MIX_INLINE	64u		/* qp_create's max_inline_data */

enum mix_op { MIX_WRITE, MIX_WRITE_IMM, MIX_READ, MIX_SEND, MIX_SEND_IMM, MIX_FADD, MIX_CSWAP,
	      MIX_AWRITE, MIX_NOPS };

static const struct {
	const char *name;
	enum ibv_wr_opcode wr;
	enum ibv_wc_opcode wc;
	uint32_t weight;		/* of 100, on QP 0 (others: no atomics) */
} mix_ops[MIX_NOPS] = {
	[MIX_WRITE] = { "WRITE", IBV_WR_RDMA_WRITE, IBV_WC_RDMA_WRITE, 26 },
	[MIX_WRITE_IMM] = { "WRITE_WITH_IMM", IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WC_RDMA_WRITE, 8 },
	[MIX_READ] = { "READ", IBV_WR_RDMA_READ, IBV_WC_RDMA_READ, 26 },
	[MIX_SEND] = { "SEND", IBV_WR_SEND, IBV_WC_SEND, 14 },
	[MIX_SEND_IMM] = { "SEND_WITH_IMM", IBV_WR_SEND_WITH_IMM, IBV_WC_SEND, 6 },
	[MIX_FADD] = { "FETCH_AND_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WC_FETCH_ADD, 8 },
	[MIX_CSWAP] = { "COMPARE_AND_SWAP", IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WC_COMP_SWAP, 7 },
	/* Executed twice (a duplicate's), it would undo the atomics
	 * after it: what they fetch, and the counter, would show it. */
	[MIX_AWRITE] = { "ATOMIC_WRITE", IBV_WR_ATOMIC_WRITE, IBV_WC_ATOMIC_WRITE, 5 },
};

struct mix_wr {
	enum mix_op op;
	bool signaled;
	uint32_t off, len;		/* WRITE, READ: in the data MR */
	uint8_t *buf;			/* the WR's slot: its pieces, MIX_GAP apart */
	uint8_t *expect;		/* READ: the model's bytes when posted */
	uint64_t want;			/* atomics: the value they must fetch */
	uint32_t cut[MIX_MAX_SGE + 1];	/* piece k is [cut[k], cut[k + 1]) */
	int nsge;
};

struct mix_qp {
	struct ibv_qp *qp;
	uint32_t base, span;		/* its slice of the data MR */
	uint32_t posted, done, msgs;
	uint64_t rng;			/* its own: a seed gives each QP one sequence */
	struct mix_wr *w;		/* --depth of them, by sequence number */
};

struct mix {
	struct cli c;
	struct ibv_mr *mr;
	uint8_t *local, *model;
	uint64_t ctr;
	uint32_t nqp, depth, slot_len;
	struct mix_qp q[MAX_QP];
	uint64_t ops[MIX_NOPS], bytes, fences;
};

static uint64_t mix_rand(struct mix_qp *q)
{
	/* xorshift64* */
	q->rng ^= q->rng >> 12;
	q->rng ^= q->rng << 25;
	q->rng ^= q->rng >> 27;
	return q->rng * 0x2545f4914f6cdd1dull;
}

static uint32_t mix_below(struct mix_qp *q, uint32_t n)
{
	return n ? (uint32_t)(mix_rand(q) % n) : 0;
}

/* A length: short ones, the MTU's multiples and their neighbours, and
 * anything up to max. */
static uint32_t mix_len(struct mix_qp *m, uint32_t max)
{
	uint32_t r = mix_below(m, 100), len;

	if (r < 35)
		len = mix_below(m, 65);
	else if (r < 65)
		len = MIX_MTU * (1 + mix_below(m, 6)) + mix_below(m, 3) - 1;
	else if (r < 90)
		len = mix_below(m, 16385);
	else
		len = mix_below(m, MIX_MAX_LEN + 1);
	return len < max ? len : max;
}

static bool mix_overlaps_read(const struct mix *m, const struct mix_qp *q, uint32_t off,
			      uint32_t len)
{
	for (uint32_t s = q->done; s != q->posted; s++) {
		const struct mix_wr *w = &q->w[s % m->depth];
		if (w->op == MIX_READ && off < w->off + w->len && w->off < off + len)
			return true;
	}
	return false;
}

/* Posts QP qi's next operation; false when ibv_post_send refused it. */
static bool mix_post(struct mix *m, uint32_t qi, uint32_t total)
{
	struct mix_qp *q = &m->q[qi];
	uint32_t seq = q->posted, r = mix_below(q, qi ? 80 : 100), acc = 0;
	struct mix_wr *w = &q->w[seq % m->depth];
	struct ibv_sge sge[MIX_MAX_SGE];
	struct ibv_send_wr wr = { .wr_id = (uint64_t)qi << 32 | seq, .sg_list = sge }, *bad;
	enum mix_op op = MIX_WRITE;

	for (int k = 0; k < MIX_NOPS; k++) {
		acc += mix_ops[k].weight;
		if (r < acc) {
			op = (enum mix_op)k;
			break;
		}
	}
	w->op = op;
	w->off = w->len = 0;
	w->buf = m->local + (size_t)(qi * m->depth + seq % m->depth) * m->slot_len;
	wr.opcode = mix_ops[op].wr;
	/* Unsignaled now and then, but never the WR that fills the window
	 * (its completion must come to free the slots) or the last. */
	w->signaled = mix_below(q, 4) || q->posted + 1 - q->done == m->depth || seq + 1 == total;
	wr.send_flags = w->signaled ? IBV_SEND_SIGNALED : 0;
	if (op == MIX_FADD || op == MIX_CSWAP) {
		uint64_t v = mix_rand(q) >> mix_below(q, 64);
		w->want = m->ctr;
		w->len = 8;
		wr.wr.atomic.remote_addr = m->c.w.ctr_va;
		wr.wr.atomic.rkey = m->c.w.ctr_rkey;
		if (op == MIX_FADD) {
			wr.wr.atomic.compare_add = v;
			m->ctr += v;
		} else {
			wr.wr.atomic.compare_add = mix_below(q, 2) ? m->ctr : m->ctr ^ (1ull << mix_below(q, 64));
			wr.wr.atomic.swap = v;
			if (wr.wr.atomic.compare_add == m->ctr)
				m->ctr = v;
		}
		memset(w->buf, 0xee, 8);
		w->nsge = 1;
		w->cut[0] = 0;
		w->cut[1] = 8;
	} else if (op == MIX_AWRITE) {
		uint64_t v = mix_rand(q) >> mix_below(q, 64);
		m->ctr = v;
		w->len = 8;
		wr.wr.rdma.remote_addr = m->c.w.ctr_va;
		wr.wr.rdma.rkey = m->c.w.ctr_rkey;
		memcpy(w->buf, &v, 8);
		w->nsge = 1;
		w->cut[0] = 0;
		w->cut[1] = 8;
	} else {
		bool msg = op == MIX_SEND || op == MIX_SEND_IMM;
		uint32_t tag = qi << 24 | (q->msgs & 0xffffff);

		w->len = msg ? mix_len(q, RSLOT_LEN) : mix_len(q, q->span);
		if (op == MIX_SEND && w->len < 8)
			w->len = 8;		/* the server tells a SEND by its header */
		if (msg) {
			for (uint32_t j = 0; j < w->len; j++)
				w->buf[j] = mix_byte(tag, j);
			if (w->len >= 8) {
				put32(w->buf, tag);
				put32(w->buf + 4, w->len);
			}
		} else {
			w->off = q->base + mix_below(q, q->span - w->len + 1);
			wr.wr.rdma.remote_addr = m->c.w.data_va + w->off;
			wr.wr.rdma.rkey = m->c.w.data_rkey;
		}
		if (op == MIX_WRITE_IMM || op == MIX_SEND_IMM)
			wr.imm_data = htonl(tag);
		if (op != MIX_WRITE && op != MIX_READ)
			q->msgs++;
		/* The pieces: cut points in [0, len], then spread apart. */
		w->nsge = w->len ? 1 + (int)mix_below(q, MIX_MAX_SGE) : 0;
		w->cut[0] = 0;
		w->cut[w->nsge] = w->len;
		for (int k = 1; k < w->nsge; k++) {
			uint32_t c = w->cut[k - 1] + mix_below(q, w->len - w->cut[k - 1] + 1);
			w->cut[k] = c;
		}
		if (op == MIX_WRITE || op == MIX_WRITE_IMM) {
			for (uint32_t j = 0; j < w->len; j++)
				w->buf[j] = mix_byte(0xff000000u | seq, j + qi);
			if (mix_overlaps_read(m, q, w->off, w->len)) {
				wr.send_flags |= IBV_SEND_FENCE;
				m->fences++;
			}
		}
		if (op == MIX_READ) {
			memcpy(w->expect, m->model + w->off, w->len);
			memset(w->buf, 0xee, m->slot_len);
		}
		/* Spread the pieces MIX_GAP apart, from the last down. */
		for (int k = w->nsge - 1; k > 0 && op != MIX_READ; k--)
			memmove(w->buf + w->cut[k] + (uint32_t)k * MIX_GAP, w->buf + w->cut[k],
				w->cut[k + 1] - w->cut[k]);
		if (op == MIX_WRITE || op == MIX_WRITE_IMM)
			for (int k = 0; k < w->nsge; k++)
				for (uint32_t j = w->cut[k]; j < w->cut[k + 1]; j++)
					m->model[w->off + j] = w->buf[j + (uint32_t)k * MIX_GAP];
		if (op != MIX_READ && w->len <= MIX_INLINE && mix_below(q, 2))
			wr.send_flags |= IBV_SEND_INLINE;
	}
	for (int k = 0; k < w->nsge; k++) {
		sge[k].addr = (uintptr_t)(w->buf + w->cut[k] + (uint32_t)k * MIX_GAP);
		sge[k].length = w->cut[k + 1] - w->cut[k];
		sge[k].lkey = m->mr->lkey;
	}
	wr.num_sge = w->nsge;
	if (ibv_post_send(q->qp, &wr, &bad)) {
		check(false, "mix: QP %u: ibv_post_send of %s %u (%u bytes, %d SGEs) refused: %s", qi,
		      mix_ops[op].name, seq, w->len, w->nsge, strerror(errno));
		return false;
	}
	m->ops[op]++;
	m->bytes += w->len;
	q->posted++;
	return true;
}

/* Whether WR w, now complete, fetched or read what the model says. */
static bool mix_verify(struct mix *m, uint32_t qi, uint32_t seq, const struct mix_wr *w)
{
	if (w->op == MIX_FADD || w->op == MIX_CSWAP) {
		uint64_t got;
		memcpy(&got, w->buf, 8);
		if (got != w->want) {
			check(false, "mix: QP %u: %s %u fetched 0x%llx, want 0x%llx", qi,
			      mix_ops[w->op].name, seq, (unsigned long long)got,
			      (unsigned long long)w->want);
			return false;
		}
	} else if (w->op == MIX_READ) {
		for (int k = 0; k < w->nsge; k++)
			for (uint32_t j = w->cut[k]; j < w->cut[k + 1]; j++)
				if (w->buf[j + (uint32_t)k * MIX_GAP] != w->expect[j]) {
					check(false, "mix: QP %u: READ %u of %u bytes at +0x%x (%d SGEs): "
					      "byte %u is 0x%02x, want 0x%02x", qi, seq, w->len, w->off,
					      w->nsge, j, w->buf[j + (uint32_t)k * MIX_GAP], w->expect[j]);
					return false;
				}
	}
	return true;
}

/* Takes completions until one QP has room or the deadline passes. */
static bool mix_reap(struct mix *m, double deadline)
{
	struct ibv_wc wc[16];
	int n;

	for (;;) {
		n = ibv_poll_cq(m->c.cq, 16, wc);
		if (n < 0)
			die("ibv_poll_cq failed");
		if (n)
			break;
		if (now_ms() > deadline) {
			for (uint32_t i = 0; i < m->nqp; i++)
				printf("    QP %u: %u posted, %u done\n", i, m->q[i].posted, m->q[i].done);
			check(false, "mix: no completion in 30 s");
			return false;
		}
	}
	for (int i = 0; i < n; i++) {
		uint32_t qi = (uint32_t)(wc[i].wr_id >> 32), seq = (uint32_t)wc[i].wr_id;
		struct mix_qp *q = qi < m->nqp ? &m->q[qi] : NULL;
		if (!q || q->qp->qp_num != wc[i].qp_num || seq - q->done >= q->posted - q->done) {
			check(false, "mix: a completion for wr_id 0x%llx on qpn 0x%x that is not "
			      "outstanding", (unsigned long long)wc[i].wr_id, wc[i].qp_num);
			return false;
		}
		struct mix_wr *w = &q->w[seq % m->depth];
		if (wc[i].status != IBV_WC_SUCCESS) {
			check(false, "mix: QP %u: %s %u (%u bytes at +0x%x) completed with %s after %u "
			      "good ones", qi, mix_ops[w->op].name, seq, w->len, w->off,
			      ibv_wc_status_str(wc[i].status), q->done);
			return false;
		}
		for (uint32_t s = q->done; s != seq; s++)
			if (q->w[s % m->depth].signaled) {
				check(false, "mix: QP %u: %s %u completed before signaled %s %u", qi,
				      mix_ops[w->op].name, seq, mix_ops[q->w[s % m->depth].op].name, s);
				return false;
			}
		if (!w->signaled || wc[i].opcode != mix_ops[w->op].wc) {
			check(false, "mix: QP %u: %s %u completed %s, as opcode %d (want %d)", qi,
			      mix_ops[w->op].name, seq, w->signaled ? "signaled" : "UNSIGNALED",
			      wc[i].opcode, mix_ops[w->op].wc);
			return false;
		}
		for (uint32_t s = q->done; s != seq + 1; s++)
			if (!mix_verify(m, qi, s, &q->w[s % m->depth]))
				return false;
		q->done = seq + 1;
	}
	return true;
}

static int run_mix(const struct opts *o)
{
	static struct mix m;
	uint32_t n = (uint32_t)o->count, len;
	uint32_t recvs[MAX_QP];
	struct report r;
	uint8_t *data;
	double t0;

	m.nqp = (uint32_t)o->qps;
	m.depth = (uint32_t)o->depth;
	m.slot_len = MIX_MAX_LEN + MIX_MAX_SGE * MIX_GAP;
	for (uint32_t i = 0; i < m.nqp; i++)
		recvs[i] = RSLOTS;
	m.c.h.flags = HELLO_CHECK_RECV;
	cli_setup(&m.c, o, m.nqp, recvs, NULL, NULL);
	len = m.c.w.data_len;
	/* aligned_alloc takes a multiple of the alignment (C11 7.22.3.1). */
	size_t local_len = ((size_t)m.nqp * m.depth * m.slot_len + PAGE - 1) / PAGE * PAGE;
	m.local = aligned_alloc(PAGE, local_len);
	m.model = malloc(len);
	data = malloc(len);
	if (!m.local || !m.model || !data)
		die("out of memory");
	m.mr = reg(&m.c.d, m.local, local_len, IBV_ACCESS_LOCAL_WRITE);
	for (uint32_t i = 0; i < len; i++)
		m.model[i] = init_byte(i);
	for (uint32_t i = 0; i < m.nqp; i++) {
		m.q[i].qp = m.c.qp[i];
		m.q[i].span = len / m.nqp;
		m.q[i].base = i * m.q[i].span;
		m.q[i].rng = ((uint64_t)o->seed << 8 | i) * 0x9e3779b97f4a7c15ull | 1;
		m.q[i].w = calloc(m.depth, sizeof(struct mix_wr));
		if (!m.q[i].w)
			die("out of memory");
		for (uint32_t k = 0; k < m.depth; k++)
			if (!(m.q[i].w[k].expect = malloc(MIX_MAX_LEN)))
				die("out of memory");
	}
	printf("mix: seed %lld, %u QPs, %u operations each, %u outstanding\n", (long long)o->seed,
	       m.nqp, n, m.depth);
	t0 = now_ms();
	for (;;) {
		bool all = true;
		for (uint32_t i = 0; i < m.nqp; i++) {
			struct mix_qp *q = &m.q[i];
			while (q->posted < n && q->posted - q->done < m.depth)
				if (!mix_post(&m, i, n))
					goto out;
			all &= q->done == n;
		}
		if (all)
			break;
		if (!mix_reap(&m, now_ms() + 30000))
			goto out;
	}
	double el = now_ms() - t0;
	printf("mix: %.2f s, %llu bytes:", el / 1e3, (unsigned long long)m.bytes);
	for (int k = 0; k < MIX_NOPS; k++)
		printf(" %llu %s", (unsigned long long)m.ops[k], mix_ops[k].name);
	printf(", %llu fenced\n", (unsigned long long)m.fences);
	check(true, "mix: %u operations on %u QPs completed in order, every READ and atomic as the "
	      "model says", n * m.nqp, m.nqp);
	cli_report(&m.c, &r, data);
	uint32_t bad = 0, first = 0, msgs = 0;
	for (uint32_t i = 0; i < len; i++)
		if (data[i] != m.model[i] && !bad++)
			first = i;
	for (uint32_t i = 0; i < m.nqp; i++)
		msgs += m.q[i].msgs;
	check(!bad, "mix: the server's data MR equals the model (%u bytes differ%s)", bad,
	      bad ? ", the first below" : "");
	if (bad)
		printf("    first difference at +0x%x: 0x%02x, want 0x%02x\n", first, data[first],
		       m.model[first]);
	check(r.counter == m.ctr, "mix: the server's counter is 0x%llx (want 0x%llx)",
	      (unsigned long long)r.counter, (unsigned long long)m.ctr);
	check(r.recv_ok == msgs && !r.recv_err && !r.recv_bad,
	      "mix: the server received %u messages (want %u), %u in error, %u not as sent%s%s",
	      r.recv_ok, msgs, r.recv_err, r.recv_bad, r.recv_bad ? ": " : "",
	      r.recv_bad ? r.recv_why : "");
	check(r.canary_ok && r.ro_ok, "mix: the server's canaries and read-only MR are intact");
out:
	ibv_dereg_mr(m.mr);
	cli_close(&m.c);
	free(m.local);
	free(m.model);
	free(data);
	return failures ? 1 : 0;
}

/* ---- main ---- */

static void usage(void)
{
	fprintf(stderr,
		"usage: %s server --addr A --port P [--conns N] [--expect-counter V] [--pidfile F]\n"
		"       %s fakeresp --addr A --port P (the scripted responder of stale)\n"
		"       %s atomic|write|retry|rnr|stream|hostile|foreign|mix|stale --addr B --server A --port P\n"
		"          [--count N] [--size S] [--depth D] [--timeout T] [--retry R]\n"
		"          [--rnr-retry R] [--out FILE] [--ready FILE] [--spoof ADDR]\n"
		"          [--hold FILE] (hostile: wait for FILE before closing)\n"
		"          [--qps N] [--seed S] (mix)\n"
		"  both: [--limit SECONDS] (default 120)\n", prog, prog, prog);
	exit(2);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "addr", 1, NULL, 'a' }, { "server", 1, NULL, 's' }, { "port", 1, NULL, 'p' },
		{ "conns", 1, NULL, 'n' }, { "expect-counter", 1, NULL, 'e' },
		{ "pidfile", 1, NULL, 'P' }, { "count", 1, NULL, 'c' }, { "size", 1, NULL, 'S' },
		{ "depth", 1, NULL, 'd' }, { "timeout", 1, NULL, 't' }, { "retry", 1, NULL, 'r' },
		{ "rnr-retry", 1, NULL, 'R' }, { "out", 1, NULL, 'o' }, { "ready", 1, NULL, 'y' },
		{ "spoof", 1, NULL, 'x' }, { "limit", 1, NULL, 'l' }, { "hold", 1, NULL, 'H' },
		{ "qps", 1, NULL, 'q' }, { "seed", 1, NULL, 'z' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .count = 1000, .size = 4096, .depth = 4, .timeout = 12, .retry = 7,
			  .rnr_retry = 7, .qps = 2 };
	const char *pidfile = NULL;
	long long expect = -1;
	int conns = 1, limit = 120, ch;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2)
		usage();
	o.mode = argv[1];
	optind = 2;
	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'a': o.addr = optarg; break;
		case 's': o.server = optarg; break;
		case 'p': o.port = atoi(optarg); break;
		case 'n': conns = atoi(optarg); break;
		case 'e': expect = atoll(optarg); break;
		case 'P': pidfile = optarg; break;
		case 'c': o.count = atoi(optarg); break;
		case 'S': o.size = atoi(optarg); break;
		case 'd': o.depth = atoi(optarg); break;
		case 't': o.timeout = atoi(optarg); break;
		case 'r': o.retry = atoi(optarg); break;
		case 'R': o.rnr_retry = atoi(optarg); break;
		case 'o': o.out = optarg; break;
		case 'y': o.ready = optarg; break;
		case 'x': o.spoof = optarg; break;
		case 'H': o.hold = optarg; break;
		case 'q': o.qps = atoi(optarg); break;
		case 'z': o.seed = atoll(optarg); break;
		case 'l': limit = atoi(optarg); break;
		default: usage();
		}
	}
	if (!o.addr || !o.port || o.count < 1 || o.depth < 1 || o.depth > 256 || o.timeout < 0 ||
	    o.timeout > 31 || o.retry < 0 || o.retry > 7 || o.rnr_retry < 0 || o.rnr_retry > 7 ||
	    o.qps < 1 || o.qps > MAX_QP)
		usage();
	signal(SIGALRM, on_alarm);
	alarm((unsigned)limit);
	srand48((long)getpid() ^ (long)time(NULL));
	if (!strcmp(o.mode, "server"))
		return run_server(o.addr, o.port, conns, expect, pidfile);
	if (!strcmp(o.mode, "fakeresp"))
		return run_fakeresp(o.addr, o.port);
	if (!o.server)
		usage();
	if (!strcmp(o.mode, "atomic"))
		return run_atomic(&o);
	if (!strcmp(o.mode, "write"))
		return run_write(&o);
	if (!strcmp(o.mode, "retry"))
		return run_retry(&o);
	if (!strcmp(o.mode, "rnr"))
		return run_rnr(&o);
	if (!strcmp(o.mode, "stream")) {
		if (!o.ready)
			usage();
		return run_stream(&o);
	}
	if (!strcmp(o.mode, "hostile"))
		return run_hostile(&o);
	if (!strcmp(o.mode, "foreign"))
		return run_foreign(&o);
	if (!strcmp(o.mode, "mix"))
		return run_mix(&o);
	if (!strcmp(o.mode, "stale"))
		return run_stale(&o);
	usage();
}
