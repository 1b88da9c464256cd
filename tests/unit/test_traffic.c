/* SPDX-License-Identifier: MIT */
/*
 * Traffic in every direction at once, every byte checked, with each copy
 * path forced in turn.
 *
 * N processes (spawned afresh, so that no process forks with threads) each
 * connect an RC QP to every other and, for a given time, drive all of them
 * at once with a random mix of
 *   - an RDMA WRITE into the peer's memory, then a READ of the same range
 *     back, compared byte for byte (1 B to 4 MiB, unaligned);
 *   - the same into the peer's device memory;
 *   - SENDs of 16 B to 64 KiB (inline ones among them) carrying a sequence
 *     number and a pattern that the receiver checks;
 *   - FETCH_ADDs and CMP_SWPs incrementing one counter in each process
 *     that every peer increments too (IBV_ATOMIC_HCA): each answer must be
 *     at least what the initiator's own earlier increments imply, and the
 *     final counter must be the number of increments acknowledged;
 *   - opening the peer's XRC_RECV QP, querying it and closing it again:
 *     verbs its owner's progress thread runs for the opener (the owner
 *     mailbox), which must answer with that QP's number and state.
 * Every region a WRITE targets is written by one initiator only, so what
 * the READ returns is known.  At the end every SEND must have arrived once,
 * in order.
 *
 * The copy paths (`--path`, or one cmocka test each): bounce, CMA, direct
 * (shareable memory), deferred placement (auto on private memory),
 * assisted copies and atomics, and CMA refused by a seccomp filter.  Each
 * run also checks from the host registry's counters that the path was
 * really taken.
 *
 *   test_traffic [--path NAME] [--procs N] [--seconds S]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"
#include "nocma.h"
#include "sv.h"

extern char **environ;

#define MAXP		8
#define LAND		(4u << 20)	/* one initiator's WRITE/READ area in a target */
#define MAXLEN		LAND
#define DMS		(64u << 10)	/* one initiator's share of a target's device memory */
#define MSG		(64u << 10)	/* largest SEND */
#define RQD		16		/* receives posted per QP */
#define WAIT_S		30		/* an operation not done by then is lost */
#define MAGIC		0x5e9dc0deu

/* The layout of each process's registered memory. */
#define OFF_LAND(j)	((size_t)(j) * LAND)
#define OFF_CTR		((size_t)MAXP * LAND)
#define OFF_RES		(OFF_CTR + 512)	/* the local result of an atomic */
#define OFF_SRC		(OFF_CTR + 4096)
#define OFF_BACK	(OFF_SRC + MAXLEN)
#define OFF_SEND	(OFF_BACK + MAXLEN)
#define OFF_RECV(j, k)	(OFF_SEND + MSG + ((size_t)(j) * RQD + (k)) * MSG)
#define MEM_LEN		OFF_RECV(MAXP, 0)

enum fail { F_CORRUPT, F_LOST, F_DUP, F_ORDER, F_ATOMIC, F_STATUS, F_SETUP, F_KINDS };
static const char *const fail_name[F_KINDS] = {
	[F_CORRUPT] = "corrupted", [F_LOST] = "lost", [F_DUP] = "duplicated",
	[F_ORDER] = "out of order", [F_ATOMIC] = "atomicity", [F_STATUS] = "error completions",
	[F_SETUP] = "setup",
};
enum op { OP_WRITE_READ, OP_DM, OP_SEND, OP_FADD, OP_CAS, OP_OWNER, OP_KINDS };
static const char *const op_name[OP_KINDS] = { "write+read", "dm write+read", "send",
					       "fetch_add", "cmp_swp", "open+query+close" };

/* What the processes publish to each other and to the parent (a shared
 * mapping; each field has one writer, its process). */
struct proc {
	_Atomic uint32_t step;		/* barrier: the last step reached */
	uint16_t lid;
	union ibv_gid gid;
	uint32_t qpn[MAXP];		/* the QP that talks to peer j */
	uint64_t mem;			/* base of the registered memory */
	uint32_t rkey, dm_rkey;
	uint32_t xrc_qpn;		/* its XRC_RECV QP, in INIT, in the shared domain */
	_Atomic uint64_t sent[MAXP];	/* SENDs completed towards peer j */
	_Atomic uint64_t incs[MAXP];	/* increments of peer j's counter acknowledged */
	uint64_t ops[OP_KINDS], bytes;
	uint64_t fails[F_KINDS];
	uint64_t path_bytes[SV_COPY_PATHS];
	char why[200];
};

struct ctl {
	uint32_t nprocs;
	uint32_t seconds;
	char xrcd_path[64];		/* the file naming the processes' XRC domain */
	struct proc p[MAXP];
};

/* The copy paths, and how each is forced. */
enum mem_kind { MEM_PRIVATE, MEM_SHARED };
struct path {
	const char *name;
	const char *copy, *assist;	/* SOFTVERBS_COPY, SOFTVERBS_ASSIST */
	enum mem_kind mem;
	bool nocma;			/* a seccomp filter refuses CMA */
	enum sv_copy_path must, never;	/* counters: bytes must / must not move so */
};
static const struct path paths[] = {
	{ "bounce", "bounce", "auto", MEM_PRIVATE, false, SV_PATH_BOUNCE, SV_PATH_CMA },
	{ "cma", "cma", "off", MEM_PRIVATE, false, SV_PATH_CMA, SV_PATH_BOUNCE },
	{ "direct", "auto", "auto", MEM_SHARED, false, SV_PATH_DIRECT, SV_PATH_CMA },
	{ "deferred", "auto", "off", MEM_PRIVATE, false, SV_PATH_DEFER, SV_PATH_BOUNCE },
	{ "assist", "auto", "force", MEM_PRIVATE, false, SV_PATH_ASSIST, SV_PATH_BOUNCE },
	{ "without_cma", "auto", "auto", MEM_PRIVATE, true, SV_PATH_BOUNCE, SV_PATH_CMA },
};

/* ---- one process ---- */

struct me {
	struct ctl *ctl;
	struct proc *p;
	unsigned i, n;
	uint64_t rng;
	char *mem;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_mr *mr, *dm_mr;
	struct ibv_dm *dm;
	struct ibv_qp *qp[MAXP];
	struct ibv_xrcd *xrcd;
	struct ibv_qp *xrc_recv;
	uint64_t next_seq[MAXP];	/* the next SEND to peer j */
	uint64_t expect[MAXP];		/* the next SEND expected from peer j */
	uint64_t floor[MAXP];		/* peer j's counter is at least this */
	uint64_t tag;
};

static uint64_t rnd(struct me *m)
{
	m->rng ^= m->rng << 13;
	m->rng ^= m->rng >> 7;
	m->rng ^= m->rng << 17;
	return m->rng;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void failure(struct me *m, enum fail f, const char *fmt, ...)
{
	va_list ap;

	if (!m->p->why[0]) {
		va_start(ap, fmt);
		int k = snprintf(m->p->why, sizeof(m->p->why), "process %u: %s: ", m->i, fail_name[f]);
		vsnprintf(m->p->why + k, sizeof(m->p->why) - (size_t)k, fmt, ap);
		va_end(ap);
	}
	m->p->fails[f]++;
}

/* The bytes an operation carries: a stream only its tag gives. */
static void pattern(char *dst, size_t len, uint64_t tag)
{
	uint64_t x = tag * 0x9e3779b97f4a7c15ull | 1;

	for (size_t k = 0; k < len; k += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(dst + k, &x, len - k < 8 ? len - k : 8);
	}
}

/* Offset of the first byte that differs from pattern(tag), or -1. */
static long unpattern(const char *src, size_t len, uint64_t tag)
{
	static char want[MAXLEN];

	pattern(want, len, tag);
	if (!memcmp(want, src, len))
		return -1;
	for (size_t k = 0; k < len; k++)
		if (want[k] != src[k])
			return (long)k;
	return -1;
}

static uint64_t send_tag(unsigned from, unsigned to, uint64_t seq)
{
	return (uint64_t)from << 56 | (uint64_t)to << 48 | seq;
}

struct hdr {
	uint32_t magic, from;
	uint64_t seq;
	uint32_t len, pad;
};

static void barrier(struct me *m, uint32_t step)
{
	double t0 = now_s();

	atomic_store(&m->p->step, step);
	for (unsigned j = 0; j < m->n; j++)
		while (atomic_load(&m->ctl->p[j].step) < step) {
			if (now_s() - t0 > 60) {
				failure(m, F_SETUP, "peer %u never reached step %u", j, step);
				exit(1);
			}
			usleep(200);
		}
}

static void post_recv_slot(struct me *m, unsigned j, unsigned k)
{
	struct ibv_sge sge = { (uintptr_t)(m->mem + OFF_RECV(j, k)), MSG, m->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = j << 16 | k, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(m->qp[j], &wr, &bad))
		failure(m, F_SETUP, "ibv_post_recv: %s", strerror(errno));
}

static void check_recv(struct me *m, const struct ibv_wc *wc)
{
	unsigned j = (unsigned)(wc->wr_id >> 16), k = (unsigned)(wc->wr_id & 0xffff);
	const char *buf = m->mem + OFF_RECV(j, k);
	struct hdr h;

	if (wc->status != IBV_WC_SUCCESS) {
		failure(m, F_STATUS, "receive from %u: %s", j, ibv_wc_status_str(wc->status));
		return;
	}
	memcpy(&h, buf, sizeof(h));
	if (h.magic != MAGIC || h.from != j || h.len != wc->byte_len) {
		failure(m, F_CORRUPT, "SEND from %u: header magic 0x%x from %u len %u, byte_len %u",
			j, h.magic, h.from, h.len, wc->byte_len);
	} else if (h.seq < m->expect[j]) {
		failure(m, F_DUP, "SEND %" PRIu64 " from %u again (expected %" PRIu64 ")", h.seq, j,
			m->expect[j]);
	} else {
		if (h.seq > m->expect[j])
			failure(m, F_ORDER, "SEND %" PRIu64 " from %u, expected %" PRIu64, h.seq, j,
				m->expect[j]);
		m->expect[j] = h.seq + 1;
		long bad = unpattern(buf + sizeof(h), h.len - sizeof(h), send_tag(j, m->i, h.seq));
		if (bad >= 0)
			failure(m, F_CORRUPT, "SEND %" PRIu64 " from %u (%u B): byte %ld differs",
				h.seq, j, h.len, bad + (long)sizeof(h));
	}
	post_recv_slot(m, j, k);
}

static void drain_recv(struct me *m)
{
	struct ibv_wc wc[16];
	int n;

	while ((n = ibv_poll_cq(m->rcq, 16, wc)) > 0)
		for (int k = 0; k < n; k++)
			check_recv(m, &wc[k]);
	if (n < 0)
		failure(m, F_SETUP, "ibv_poll_cq on the receive CQ failed");
}

/* Posts one WR and waits for its completion, serving receives meanwhile. */
static bool run_wr(struct me *m, unsigned j, struct ibv_send_wr *wr, const char *what)
{
	struct ibv_send_wr *bad;
	struct ibv_wc wc;

	wr->wr_id = ++m->tag;
	wr->send_flags |= IBV_SEND_SIGNALED;
	if (ibv_post_send(m->qp[j], wr, &bad)) {
		failure(m, F_SETUP, "%s to %u: ibv_post_send: %s", what, j, strerror(errno));
		return false;
	}
	double t0 = now_s();
	for (;;) {
		int n = ibv_poll_cq(m->scq, 1, &wc);
		if (n > 0)
			break;
		if (n < 0 || now_s() - t0 > WAIT_S) {
			failure(m, F_LOST, "%s to %u: no completion in %d s", what, j, WAIT_S);
			return false;
		}
		drain_recv(m);
	}
	if (wc.wr_id != wr->wr_id) {
		failure(m, F_DUP, "%s to %u: completion of wr_id %" PRIu64 ", expected %" PRIu64, what,
			j, wc.wr_id, wr->wr_id);
		return false;
	}
	if (wc.status != IBV_WC_SUCCESS) {
		failure(m, F_STATUS, "%s to %u: %s", what, j, ibv_wc_status_str(wc.status));
		return false;
	}
	return true;
}

static uint32_t rnd_len(struct me *m, uint32_t min, uint32_t max)
{
	/* Log-uniform: small and large sizes are equally likely. */
	unsigned lo = 31 - (unsigned)__builtin_clz(min), hi = 31 - (unsigned)__builtin_clz(max);
	unsigned b = lo + (unsigned)(rnd(m) % (hi - lo + 1));
	uint64_t len = (1ull << b) + rnd(m) % (1ull << b);

	return (uint32_t)(len < min ? min : len > max ? max : len);
}

/* WRITE a fresh pattern into peer j's memory (or device memory), READ
 * it back, compare. */
static void write_read(struct me *m, unsigned j, bool dm)
{
	const struct proc *t = &m->ctl->p[j];
	uint32_t area = dm ? DMS : LAND;
	uint32_t len = rnd_len(m, 1, dm ? DMS : MAXLEN);
	uint64_t off = rnd(m) % (area - len + 1);
	uint64_t raddr = dm ? (uint64_t)m->i * DMS + off : t->mem + OFF_LAND(m->i) + off;
	uint32_t rkey = dm ? t->dm_rkey : t->rkey;
	char *src = m->mem + OFF_SRC, *back = m->mem + OFF_BACK;
	uint64_t tag = ++m->tag << 8 | m->i;

	pattern(src, len, tag);
	memset(back, 0, len);
	struct ibv_sge ws = { (uintptr_t)src, len, m->mr->lkey }, rs = { (uintptr_t)back, len,
									   m->mr->lkey };
	struct ibv_send_wr w = { .sg_list = &ws, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE };
	w.wr.rdma.remote_addr = raddr;
	w.wr.rdma.rkey = rkey;
	if (!run_wr(m, j, &w, dm ? "DM WRITE" : "WRITE"))
		return;
	struct ibv_send_wr r = { .sg_list = &rs, .num_sge = 1, .opcode = IBV_WR_RDMA_READ };
	r.wr.rdma.remote_addr = raddr;
	r.wr.rdma.rkey = rkey;
	if (!run_wr(m, j, &r, dm ? "DM READ" : "READ"))
		return;
	long bad = unpattern(back, len, tag);
	if (bad >= 0)
		failure(m, F_CORRUPT, "%s of %u B at +%" PRIu64 " in %u: READ-back byte %ld differs",
			dm ? "DM WRITE" : "WRITE", len, off, j, bad);
	m->p->ops[dm ? OP_DM : OP_WRITE_READ]++;
	m->p->bytes += 2ull * len;
}

static void do_send(struct me *m, unsigned j)
{
	/* Half of them small enough for deferred placement. */
	uint32_t len = rnd(m) & 1 ? rnd_len(m, sizeof(struct hdr), 176) :
		       rnd_len(m, sizeof(struct hdr), MSG);
	char *buf = m->mem + OFF_SEND;
	struct hdr h = { MAGIC, m->i, m->next_seq[j], len, 0 };

	memcpy(buf, &h, sizeof(h));
	pattern(buf + sizeof(h), len - sizeof(h), send_tag(m->i, j, h.seq));
	struct ibv_sge s = { (uintptr_t)buf, len, m->mr->lkey };
	struct ibv_send_wr w = { .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND };
	if (len <= 64 && rnd(m) & 1)
		w.send_flags = IBV_SEND_INLINE;
	if (!run_wr(m, j, &w, "SEND"))
		return;
	m->next_seq[j]++;
	atomic_store(&m->p->sent[j], m->next_seq[j]);
	m->p->ops[OP_SEND]++;
	m->p->bytes += len;
}

/* One increment of peer j's counter: FETCH_ADD 1, or CMP_SWP from a
 * guess of its value to one more.  Only increments, so every answer is at
 * least the floor this initiator's own acknowledged ones imply. */
static void do_atomic(struct me *m, unsigned j, bool cas)
{
	const struct proc *t = &m->ctl->p[j];
	uint64_t *res = (uint64_t *)(m->mem + OFF_RES);
	uint64_t guess = m->floor[j] + rnd(m) % 2;
	struct ibv_sge s = { (uintptr_t)res, 8, m->mr->lkey };
	struct ibv_send_wr w = { .sg_list = &s, .num_sge = 1,
				 .opcode = cas ? IBV_WR_ATOMIC_CMP_AND_SWP :
						 IBV_WR_ATOMIC_FETCH_AND_ADD };

	w.wr.atomic.remote_addr = t->mem + OFF_CTR;
	w.wr.atomic.rkey = t->rkey;
	w.wr.atomic.compare_add = cas ? guess : 1;
	w.wr.atomic.swap = guess + 1;
	*res = UINT64_MAX;
	if (!run_wr(m, j, &w, cas ? "CMP_SWP" : "FETCH_ADD"))
		return;
	uint64_t old = *res;
	if (old < m->floor[j] || old > m->floor[j] + (1ull << 40))
		failure(m, F_ATOMIC, "%s on %u's counter returned %" PRIu64 ", below %" PRIu64
			" (or garbage)", cas ? "CMP_SWP" : "FETCH_ADD", j, old, m->floor[j]);
	bool inc = !cas || old == guess;
	m->floor[j] = inc ? old + 1 : old;
	if (inc)
		atomic_fetch_add(&m->p->incs[j], 1);
	m->p->ops[cas ? OP_CAS : OP_FADD]++;
}

/* Peer j's XRC_RECV QP through the owner mailbox: open, query, close. */
static void owner_ops(struct me *m, unsigned j)
{
	const struct proc *t = &m->ctl->p[j];
	struct ibv_qp_open_attr oa = { .comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD |
				       IBV_QP_OPEN_ATTR_TYPE, .qp_num = t->xrc_qpn, .xrcd = m->xrcd,
				       .qp_type = IBV_QPT_XRC_RECV };
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	struct ibv_qp *qp = ibv_open_qp(m->ctx, &oa);

	if (!qp) {
		failure(m, F_STATUS, "ibv_open_qp of %u's QP 0x%x: %s", j, t->xrc_qpn,
			strerror(errno));
		return;
	}
	memset(&qa, 0xff, sizeof(qa));
	if (ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_PORT, &qia))
		failure(m, F_STATUS, "ibv_query_qp of %u's QP 0x%x: %s", j, t->xrc_qpn,
			strerror(errno));
	else if (qa.qp_state != IBV_QPS_INIT || qa.port_num != 1 ||
		 qia.qp_type != IBV_QPT_XRC_RECV || qp->qp_num != t->xrc_qpn)
		failure(m, F_CORRUPT, "%u's QP 0x%x queried as state %d port %u type %d",
			j, t->xrc_qpn, qa.qp_state, qa.port_num, qia.qp_type);
	if (ibv_destroy_qp(qp))
		failure(m, F_STATUS, "closing %u's QP 0x%x: %s", j, t->xrc_qpn, strerror(errno));
	m->p->ops[OP_OWNER]++;
}

static struct ibv_qp *make_qp(struct me *m)
{
	struct ibv_qp_init_attr ia = { .send_cq = m->scq, .recv_cq = m->rcq, .qp_type = IBV_QPT_RC,
				       .cap = { 4, RQD, 1, 1, 64 } };

	return ibv_create_qp(m->pd, &ia);
}

static int connect_to(struct me *m, unsigned j)
{
	const struct proc *t = &m->ctl->p[j];
	struct ibv_port_attr port;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
						    IBV_ACCESS_REMOTE_ATOMIC };

	if (ibv_query_port(m->ctx, 1, &port) ||
	    ibv_modify_qp(m->qp[j], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = t->qpn[m->i];
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.dlid = t->lid;
	if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = t->gid;
		a.ah_attr.grh.hop_limit = 1;
	}
	if (ibv_modify_qp(m->qp[j], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER))
		return -1;
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 16;
	return ibv_modify_qp(m->qp[j], &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
			     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Shareable memory is a named POSIX shm object (the direct path needs a
 * name a peer can open); the parent unlinks it once the process is gone. */
static void shm_name(char *buf, size_t len, pid_t pid)
{
	snprintf(buf, len, "/svtest-traffic-%d", (int)pid);
}

static char *map_mem(enum mem_kind kind)
{
	int fd = -1, flags = MAP_PRIVATE | MAP_ANONYMOUS;

	if (kind == MEM_SHARED) {
		char name[64];
		shm_name(name, sizeof(name), getpid());
		fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
		if (fd < 0 || ftruncate(fd, (off_t)MEM_LEN))
			return NULL;
		flags = MAP_SHARED;
	}
	char *p = mmap(NULL, MEM_LEN, PROT_READ | PROT_WRITE, flags, fd, 0);
	if (fd >= 0)
		close(fd);
	return p == MAP_FAILED ? NULL : p;
}

static void setup(struct me *m, enum mem_kind kind)
{
	struct ibv_device **devs = ibv_get_device_list(NULL);
	const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			IBV_ACCESS_REMOTE_ATOMIC;

	if (!devs || !devs[0] || !(m->ctx = ibv_open_device(devs[0])) ||
	    !(m->pd = ibv_alloc_pd(m->ctx)) ||
	    !(m->scq = ibv_create_cq(m->ctx, 16, NULL, NULL, 0)) ||
	    !(m->rcq = ibv_create_cq(m->ctx, MAXP * RQD, NULL, NULL, 0)) ||
	    !(m->mem = map_mem(kind)) ||
	    !(m->mr = ibv_reg_mr(m->pd, m->mem, MEM_LEN, acc))) {
		failure(m, F_SETUP, "context, PD, CQs or MR: %s", strerror(errno));
		exit(1);
	}
	struct ibv_alloc_dm_attr da = { .length = (size_t)m->n * DMS };
	if (!(m->dm = ibv_alloc_dm(m->ctx, &da)) ||
	    !(m->dm_mr = ibv_reg_dm_mr(m->pd, m->dm, 0, da.length, acc | IBV_ACCESS_ZERO_BASED))) {
		failure(m, F_SETUP, "device memory: %s", strerror(errno));
		exit(1);
	}
	ibv_free_device_list(devs);
	struct ibv_port_attr port;
	if (ibv_query_port(m->ctx, 1, &port) || ibv_query_gid(m->ctx, 1, 0, &m->p->gid)) {
		failure(m, F_SETUP, "port query: %s", strerror(errno));
		exit(1);
	}
	int xfd = open(m->ctl->xrcd_path, O_RDONLY);
	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD |
					 IBV_XRCD_INIT_ATTR_OFLAGS, .fd = xfd, .oflags = O_CREAT };
	struct ibv_qp_init_attr_ex ra = { .qp_type = IBV_QPT_XRC_RECV,
					  .comp_mask = IBV_QP_INIT_ATTR_XRCD };
	struct ibv_qp_attr ia = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	if (xfd < 0 || !(m->xrcd = ra.xrcd = ibv_open_xrcd(m->ctx, &xa)) ||
	    !(m->xrc_recv = ibv_create_qp_ex(m->ctx, &ra)) ||
	    ibv_modify_qp(m->xrc_recv, &ia, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS)) {
		failure(m, F_SETUP, "XRC domain or XRC_RECV QP: %s", strerror(errno));
		exit(1);
	}
	close(xfd);
	m->p->xrc_qpn = m->xrc_recv->qp_num;
	m->p->lid = port.lid;
	m->p->mem = (uintptr_t)m->mem;
	m->p->rkey = m->mr->rkey;
	m->p->dm_rkey = m->dm_mr->rkey;
	for (unsigned j = 0; j < m->n; j++) {
		if (j == m->i)
			continue;
		if (!(m->qp[j] = make_qp(m))) {
			failure(m, F_SETUP, "ibv_create_qp: %s", strerror(errno));
			exit(1);
		}
		m->p->qpn[j] = m->qp[j]->qp_num;
	}
}

static void record_paths(struct me *m)
{
	struct sv_reg_ep_info eps[64];
	int n = sv_reg_list_eps(eps, 64);

	for (int k = 0; k < n; k++)
		if (eps[k].pid == getpid())
			for (int q = 0; q < SV_COPY_PATHS; q++)
				m->p->path_bytes[q] += eps[k].bytes[q];
}

static int child(struct ctl *ctl, unsigned i, enum mem_kind kind, bool nocma)
{
	struct me m = { .ctl = ctl, .p = &ctl->p[i], .i = i, .n = ctl->nprocs };

	m.rng = 0x2545f4914f6cdd1dull ^ ((uint64_t)getpid() << 20) ^ (uint64_t)time(NULL);
	if (nocma)
		forbid_cma();
	setup(&m, kind);
	barrier(&m, 1);				/* every QP number published */
	for (unsigned j = 0; j < m.n; j++) {
		if (j == i)
			continue;
		if (connect_to(&m, j)) {
			failure(&m, F_SETUP, "connecting to %u: %s", j, strerror(errno));
			exit(1);
		}
		for (unsigned k = 0; k < RQD; k++)
			post_recv_slot(&m, j, k);
	}
	barrier(&m, 2);				/* every QP in RTS, receives posted */

	/* Past the time, each kind of operation this process has not done
	 * yet is done once: a slow run (sanitizers, a loaded machine) still
	 * checks every kind. */
	static const unsigned first_r[OP_KINDS] = { 0, 30, 45, 78, 88, 98 };
	double end = now_s() + ctl->seconds;
	for (;;) {
		unsigned j = (unsigned)(rnd(&m) % (m.n - 1));
		j += j >= i;
		unsigned r = (unsigned)(rnd(&m) % 100);
		if (now_s() >= end) {
			int missing = -1;
			for (int k = 0; k < OP_KINDS && missing < 0; k++)
				if (!m.p->ops[k])
					missing = k;
			if (missing < 0 || now_s() > end + WAIT_S)
				break;
			r = first_r[missing];
		}
		if (r < 30)
			write_read(&m, j, false);
		else if (r < 45)
			write_read(&m, j, true);
		else if (r < 78)
			do_send(&m, j);
		else if (r < 98)
			do_atomic(&m, j, r >= 88);
		else
			owner_ops(&m, j);
		drain_recv(&m);
	}
	atomic_store(&m.p->step, 3);		/* sending no more */

	/* Every SEND a peer completed must arrive; wait while peers finish. */
	double t0 = now_s();
	for (bool all = false; !all;) {
		drain_recv(&m);
		all = true;
		for (unsigned j = 0; j < m.n; j++)
			if (j != i && (atomic_load(&ctl->p[j].step) < 3 ||
				       m.expect[j] < atomic_load(&ctl->p[j].sent[i])))
				all = false;
		if (!all && now_s() - t0 > WAIT_S) {
			for (unsigned j = 0; j < m.n; j++)
				if (j != i && m.expect[j] < atomic_load(&ctl->p[j].sent[i]))
					failure(&m, F_LOST, "%" PRIu64 " SENDs from %u never arrived",
						atomic_load(&ctl->p[j].sent[i]) - m.expect[j], j);
			break;
		}
		if (!all)
			usleep(50);
	}
	barrier(&m, 4);				/* everything delivered */

	/* The counter holds exactly the increments acknowledged. */
	uint64_t want = 0, got = __atomic_load_n((uint64_t *)(m.mem + OFF_CTR), __ATOMIC_ACQUIRE);
	for (unsigned j = 0; j < m.n; j++)
		want += atomic_load(&ctl->p[j].incs[i]);
	if (got != want)
		failure(&m, F_ATOMIC, "counter %" PRIu64 ", but %" PRIu64 " increments acknowledged",
			got, want);
	for (unsigned j = 0; j < m.n; j++)
		if (j != i && m.expect[j] != atomic_load(&ctl->p[j].sent[i]))
			failure(&m, F_DUP, "%" PRIu64 " SENDs from %u, %" PRIu64 " sent", m.expect[j],
				j, atomic_load(&ctl->p[j].sent[i]));
	record_paths(&m);
	barrier(&m, 5);				/* every check done: tear down */
	for (unsigned j = 0; j < m.n; j++)
		if (m.qp[j])
			ibv_destroy_qp(m.qp[j]);
	ibv_destroy_qp(m.xrc_recv);
	ibv_close_xrcd(m.xrcd);
	ibv_dereg_mr(m.dm_mr);
	ibv_free_dm(m.dm);
	ibv_dereg_mr(m.mr);
	ibv_destroy_cq(m.scq);
	ibv_destroy_cq(m.rcq);
	ibv_dealloc_pd(m.pd);
	ibv_close_device(m.ctx);
	return 0;
}

/* ---- the parent ---- */

static unsigned opt_procs, opt_seconds = 2;
static const struct path *opt_path;

static void run(const struct path *pa, unsigned n, unsigned seconds)
{
	int fd = memfd_create("test_traffic.ctl", 0);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, sizeof(struct ctl)), 0);
	struct ctl *ctl = mmap(NULL, sizeof(*ctl), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(ctl != MAP_FAILED);
	memset(ctl, 0, sizeof(*ctl));
	ctl->nprocs = n;
	ctl->seconds = seconds;
	snprintf(ctl->xrcd_path, sizeof(ctl->xrcd_path), "/tmp/svtest-traffic-%d.xrcd",
		 (int)getpid());
	int xfd = open(ctl->xrcd_path, O_CREAT | O_RDWR | O_TRUNC, 0600);
	assert_true(xfd >= 0);
	close(xfd);

	char fdarg[16], *env[256];
	int ne = 0;
	snprintf(fdarg, sizeof(fdarg), "%d", fd);
	for (char **e = environ; *e && ne < 250; e++)
		if (strncmp(*e, "SOFTVERBS_COPY=", 15) && strncmp(*e, "SOFTVERBS_ASSIST=", 17))
			env[ne++] = *e;
	char copy[64], assist[64];
	snprintf(copy, sizeof(copy), "SOFTVERBS_COPY=%s", pa->copy);
	snprintf(assist, sizeof(assist), "SOFTVERBS_ASSIST=%s", pa->assist);
	env[ne++] = copy;
	env[ne++] = assist;
	env[ne] = NULL;

	pid_t pids[MAXP];
	for (unsigned i = 0; i < n; i++) {
		char iarg[16];
		snprintf(iarg, sizeof(iarg), "%u", i);
		char *argv[] = { "test_traffic", "--child", iarg, fdarg, (char *)pa->name, NULL };
		assert_int_equal(posix_spawn(&pids[i], "/proc/self/exe", NULL, NULL, argv, env), 0);
	}
	int bad_exit = 0;
	for (unsigned i = 0; i < n; i++) {
		int st;
		assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			bad_exit++;
		char name[64];
		shm_name(name, sizeof(name), pids[i]);
		shm_unlink(name);
	}
	close(fd);
	unlink(ctl->xrcd_path);

	uint64_t ops[OP_KINDS] = { 0 }, fails[F_KINDS] = { 0 }, paths_b[SV_COPY_PATHS] = { 0 };
	uint64_t total = 0, bytes = 0, nfail = 0;
	const char *why = NULL;
	for (unsigned i = 0; i < n; i++) {
		for (int k = 0; k < OP_KINDS; k++)
			ops[k] += ctl->p[i].ops[k], total += ctl->p[i].ops[k];
		for (int k = 0; k < F_KINDS; k++)
			fails[k] += ctl->p[i].fails[k], nfail += ctl->p[i].fails[k];
		for (int k = 0; k < SV_COPY_PATHS; k++)
			paths_b[k] += ctl->p[i].path_bytes[k];
		bytes += ctl->p[i].bytes;
		if (!why && ctl->p[i].why[0])
			why = ctl->p[i].why;
	}
	printf("traffic %s, %u processes, %u s: %" PRIu64 " operations, %.1f MB checked (", pa->name,
	       n, seconds, total, (double)bytes / 1e6);
	for (int k = 0; k < OP_KINDS; k++)
		printf("%s%s %" PRIu64, k ? ", " : "", op_name[k], ops[k]);
	printf(")\n  failures:");
	for (int k = 0; k < F_KINDS; k++)
		printf(" %s %" PRIu64 "%s", fail_name[k], fails[k], k + 1 < F_KINDS ? "," : "\n");
	printf("  MB by path: local %.1f, direct %.1f, cma %.1f, bounce %.1f, deferred %.1f, "
	       "assist %.1f\n", paths_b[SV_PATH_LOCAL] / 1e6, paths_b[SV_PATH_DIRECT] / 1e6,
	       paths_b[SV_PATH_CMA] / 1e6, paths_b[SV_PATH_BOUNCE] / 1e6,
	       paths_b[SV_PATH_DEFER] / 1e6, paths_b[SV_PATH_ASSIST] / 1e6);
	if (why)
		printf("  first failure: %s\n", why);
	fflush(stdout);
	munmap(ctl, sizeof(*ctl));

	assert_int_equal(bad_exit, 0);
	assert_int_equal(nfail, 0);
	for (int k = 0; k < OP_KINDS; k++)
		if (!ops[k])
			fail_msg("no %s completed: the run checked nothing", op_name[k]);
	if (!paths_b[pa->must])
		fail_msg("path %s: no bytes moved the way it forces", pa->name);
	if (paths_b[pa->never])
		fail_msg("path %s: %" PRIu64 " bytes took a path it excludes", pa->name,
			 paths_b[pa->never]);
}

static void test_two_way(void **state)
{
	run(*state, 2, opt_seconds);
}

static void test_n_way(void **state)
{
	run(*state, opt_procs ? opt_procs : 4, opt_seconds);
}

static const struct path *path_named(const char *name)
{
	for (size_t k = 0; k < SV_ARRAY_LEN(paths); k++)
		if (!strcmp(paths[k].name, name))
			return &paths[k];
	fprintf(stderr, "test_traffic: no path '%s'\n", name);
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "--child")) {
		const struct path *pa = path_named(argv[4]);
		struct ctl *ctl = mmap(NULL, sizeof(*ctl), PROT_READ | PROT_WRITE, MAP_SHARED,
				       atoi(argv[3]), 0);
		if (ctl == MAP_FAILED)
			return 1;
		close(atoi(argv[3]));
		child(ctl, (unsigned)atoi(argv[2]), pa->mem, pa->nocma);
		for (int k = 0; k < F_KINDS; k++)
			if (ctl->p[atoi(argv[2])].fails[k])
				return 1;
		return 0;
	}
	for (int k = 1; k < argc; k++) {
		if (!strcmp(argv[k], "--path") && k + 1 < argc)
			opt_path = path_named(argv[++k]);
		else if (!strcmp(argv[k], "--procs") && k + 1 < argc)
			opt_procs = (unsigned)atoi(argv[++k]);
		else if (!strcmp(argv[k], "--seconds") && k + 1 < argc)
			opt_seconds = (unsigned)atoi(argv[++k]);
		else {
			fprintf(stderr, "usage: test_traffic [--path NAME] [--procs 2-%d] "
				"[--seconds S]\n", MAXP);
			return 2;
		}
	}
	if (opt_procs && (opt_procs < 2 || opt_procs > MAXP)) {
		fprintf(stderr, "test_traffic: --procs is 2 to %d\n", MAXP);
		return 2;
	}
	struct CMUnitTest tests[2 * SV_ARRAY_LEN(paths)];
	static char names[2 * SV_ARRAY_LEN(paths)][40];
	size_t nt = 0;
	for (size_t k = 0; k < SV_ARRAY_LEN(paths); k++) {
		if (opt_path && opt_path != &paths[k])
			continue;
		if (!opt_procs || opt_procs == 2) {
			snprintf(names[nt], sizeof(names[nt]), "%s.two_way", paths[k].name);
			tests[nt] = (struct CMUnitTest){ names[nt], test_two_way, NULL, NULL,
							 (void *)&paths[k] };
			nt++;
		}
		if (opt_procs != 2) {
			snprintf(names[nt], sizeof(names[nt]), "%s.n_way", paths[k].name);
			tests[nt] = (struct CMUnitTest){ names[nt], test_n_way, NULL, NULL,
							 (void *)&paths[k] };
			nt++;
		}
	}
	return _cmocka_run_group_tests("traffic", tests, nt, NULL, NULL);
}
