/* SPDX-License-Identifier: MIT */
/*
 * GPU memory as MRs: WRITE, READ, SEND/RECV, WRITE_WITH_IMM and atomics
 * between host and device memory, in both directions, within one process
 * and between two, every byte checked; registration's rules; a freed
 * allocation; a deregistered GPU MR; one CUDA IPC open per MR per peer.
 *
 * It runs against whatever libcuda.so.1 the loader finds: the test
 * double in CI (tests/cuda/libcuda.c, whose device memory the CPU cannot
 * touch), the real driver in scripts/gpu-check.sh.  With --no-cuda it
 * checks the behaviour of a process without the driver.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "pair.h"
#include "core/cuda.h"

#define BIG ((2u << 20) + 64)	/* each buffer: more than one staging chunk */

static struct {
	CUresult (*init)(unsigned);
	CUresult (*dev_get)(CUdevice *, int);
	CUresult (*retain)(CUcontext *, CUdevice);
	CUresult (*set_current)(CUcontext);
	CUresult (*alloc)(CUdeviceptr *, size_t);
	CUresult (*free)(CUdeviceptr);
	CUresult (*htod)(CUdeviceptr, const void *, size_t);
	CUresult (*dtoh)(void *, CUdeviceptr, size_t);
	CUresult (*memcpy)(CUdeviceptr, CUdeviceptr, size_t);
	void (*stats)(unsigned long *);	/* the double's counters; NULL on a GPU */
	void (*copy_us)(int);		/* the double's cost per copy */
} cu;

enum { ST_OPENS, ST_CLOSES, ST_OPEN_NOW, ST_SYNC_MEMOPS, ST_MEMCPYS, ST_ALLOCS_NOW, ST_PINNED_NOW,
       ST_MEMCPY_BYTES, ST_N };

static bool cuda_load(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);

	if (!lib)
		return false;
	cu.init = dlsym(lib, "cuInit");
	cu.dev_get = dlsym(lib, "cuDeviceGet");
	cu.retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
	cu.set_current = dlsym(lib, "cuCtxSetCurrent");
	cu.alloc = dlsym(lib, "cuMemAlloc_v2");
	cu.free = dlsym(lib, "cuMemFree_v2");
	cu.htod = dlsym(lib, "cuMemcpyHtoD_v2");
	cu.dtoh = dlsym(lib, "cuMemcpyDtoH_v2");
	cu.memcpy = dlsym(lib, "cuMemcpy");
	cu.stats = (void (*)(unsigned long *))dlsym(lib, "cudouble_stats");
	cu.copy_us = (void (*)(int))dlsym(lib, "cudouble_copy_us");
	return cu.init && cu.dev_get && cu.retain && cu.set_current && cu.alloc && cu.free &&
	       cu.htod && cu.dtoh && cu.memcpy;
}

/* The driver, a context current on this thread: after fork, in each
 * process (CUDA does not survive fork). */
static void cuda_open(void)
{
	CUdevice dev;
	CUcontext ctx;

	assert_int_equal(cu.init(0), CUDA_SUCCESS);
	assert_int_equal(cu.dev_get(&dev, 0), CUDA_SUCCESS);
	assert_int_equal(cu.retain(&ctx, dev), CUDA_SUCCESS);
	assert_int_equal(cu.set_current(ctx), CUDA_SUCCESS);
}

static unsigned long stat_of(int i)
{
	unsigned long s[ST_N];

	cu.stats(s);
	return s[i];
}

/* ---- one side: a QP with a host and a device buffer ---- */

enum mem { HOST, DEV };

struct side {
	struct end e;			/* e.mr, e.buf: the host buffer */
	char *dbuf;			/* device memory */
	struct ibv_mr *dmr;
	struct ibv_mr *wmr;		/* C_WINDOW: an MR that windows bind to */
	struct ibv_mw *mw;
};

static char *buf_of(struct side *s, enum mem m)
{
	return m == DEV ? s->dbuf : s->e.buf;
}

static struct ibv_mr *mr_of(struct side *s, enum mem m)
{
	return m == DEV ? s->dmr : s->e.mr;
}

static uint8_t pattern(uint32_t seed, size_t i)
{
	return (uint8_t)(seed * 131 + i * 7 + (i >> 9));
}

static void fill(struct side *s, enum mem m, uint32_t seed, size_t len)
{
	static uint8_t tmp[BIG];

	for (size_t i = 0; i < len; i++)
		tmp[i] = pattern(seed, i);
	if (m == DEV)
		assert_int_equal(cu.htod((CUdeviceptr)(uintptr_t)s->dbuf, tmp, len), CUDA_SUCCESS);
	else
		memcpy(s->e.buf, tmp, len);
}

/* The index of the first byte that differs, or -1. */
static long check(struct side *s, enum mem m, uint32_t seed, size_t len)
{
	static uint8_t tmp[BIG];

	if (m == DEV)
		assert_int_equal(cu.dtoh(tmp, (CUdeviceptr)(uintptr_t)s->dbuf, len), CUDA_SUCCESS);
	else
		memcpy(tmp, s->e.buf, len);
	for (size_t i = 0; i < len; i++)
		if (tmp[i] != pattern(seed, i))
			return (long)i;
	return -1;
}

static struct ibv_mr *reg_dev(struct side *s)
{
	return ibv_reg_mr(s->e.pd, s->dbuf, BIG, ALL_ACCESS);
}

static void side_open(struct side *s)
{
	CUdeviceptr d;

	memset(s, 0, sizeof(*s));
	end_open(&s->e, &rc_default);
	/* end_open's host buffer is BUF bytes; these tests want BIG. */
	ibv_dereg_mr(s->e.mr);
	free(s->e.buf);
	s->e.buf = aligned_alloc(4096, (BIG + 4095) & ~4095u);
	assert_non_null(s->e.buf);
	s->e.mr = ibv_reg_mr(s->e.pd, s->e.buf, BIG, ALL_ACCESS);
	assert_non_null(s->e.mr);
	assert_int_equal(cu.alloc(&d, BIG), CUDA_SUCCESS);
	s->dbuf = (char *)(uintptr_t)d;
	s->dmr = reg_dev(s);
	assert_non_null(s->dmr);
}

static void side_close(struct side *s)
{
	if (s->mw)
		assert_int_equal(ibv_dealloc_mw(s->mw), 0);
	if (s->wmr)
		assert_int_equal(ibv_dereg_mr(s->wmr), 0);
	if (s->dmr)
		assert_int_equal(ibv_dereg_mr(s->dmr), 0);
	assert_int_equal(cu.free((CUdeviceptr)(uintptr_t)s->dbuf), CUDA_SUCCESS);
	end_close(&s->e);
}

/* ---- the target's commands, run in its process or this one ---- */

enum op {
	C_INFO, C_FILL, C_CHECK, C_RECV, C_WAIT, C_WORD, C_DEREG, C_REREG, C_WINDOW, C_UNWINDOW,
	C_EXIT
};

struct cmd {
	enum op op;
	enum mem mem;
	uint32_t seed;
	uint64_t len;
};

struct info {
	uint32_t qpn;
	struct ibv_port_attr port;
	union ibv_gid gid;
	uint64_t addr[2];
	uint32_t rkey[2];
};

struct reply {
	long rc;			/* 0, or what failed */
	uint64_t val;
	struct info info;
};

static struct reply serve(struct side *s, const struct cmd *c)
{
	struct reply r = { 0 };
	struct ibv_wc wc;

	switch (c->op) {
	case C_INFO:
		r.info.qpn = s->e.qp->qp_num;
		r.info.port = s->e.port;
		r.info.gid = s->e.gid;
		for (int m = HOST; m <= DEV; m++) {
			r.info.addr[m] = (uintptr_t)buf_of(s, (enum mem)m);
			r.info.rkey[m] = mr_of(s, (enum mem)m)->rkey;
		}
		break;
	case C_FILL:
		fill(s, c->mem, c->seed, c->len);
		break;
	case C_CHECK:
		r.rc = check(s, c->mem, c->seed, c->len);
		break;
	case C_RECV: {
		struct ibv_sge sge = { (uintptr_t)buf_of(s, c->mem), (uint32_t)c->len,
				       mr_of(s, c->mem)->lkey };
		struct ibv_recv_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;
		r.rc = ibv_post_recv(s->e.qp, &wr, &bad);
		break;
	}
	case C_WAIT:
		wc = poll_one(s->e.cq);
		r.rc = wc.status;
		r.val = wc.byte_len | (uint64_t)(wc.wc_flags & IBV_WC_WITH_IMM ? ntohl(wc.imm_data) : 0)
				      << 32;
		break;
	case C_WORD: {
		uint64_t v;
		if (c->mem == DEV)
			assert_int_equal(cu.dtoh(&v, (CUdeviceptr)(uintptr_t)s->dbuf, 8), CUDA_SUCCESS);
		else
			memcpy(&v, s->e.buf, 8);
		r.val = v;
		break;
	}
	case C_DEREG:
		r.rc = ibv_dereg_mr(s->dmr);
		s->dmr = NULL;
		break;
	case C_REREG:
		s->dmr = reg_dev(s);
		r.rc = !s->dmr;
		if (s->dmr)
			r.info.rkey[DEV] = s->dmr->rkey;
		break;
	case C_WINDOW: {
		/* A type 1 window over [dbuf + 4096, +8192) of a GPU MR. */
		s->wmr = ibv_reg_mr(s->e.pd, s->dbuf, BIG, ALL_ACCESS | IBV_ACCESS_MW_BIND);
		s->mw = s->wmr ? ibv_alloc_mw(s->e.pd, IBV_MW_TYPE_1) : NULL;
		struct ibv_mw_bind b = { .wr_id = 9, .send_flags = IBV_SEND_SIGNALED,
					 .bind_info = { s->wmr, (uintptr_t)s->dbuf + 4096, 8192,
							IBV_ACCESS_REMOTE_WRITE |
							IBV_ACCESS_REMOTE_READ } };
		r.rc = !s->mw || ibv_bind_mw(s->e.qp, s->mw, &b) ||
		       poll_one(s->e.cq).status != IBV_WC_SUCCESS;
		r.val = s->mw ? s->mw->rkey : 0;
		break;
	}
	case C_UNWINDOW:
		r.rc = ibv_dealloc_mw(s->mw) || ibv_dereg_mr(s->wmr);
		s->mw = NULL;
		s->wmr = NULL;
		break;
	case C_EXIT:
		break;
	}
	return r;
}

/* The target: in this process (sock < 0), or a forked one. */
struct target {
	int sock;
	pid_t pid;
	struct side local;
	struct info info;
};

static struct reply call(struct target *t, enum op op, enum mem mem, uint32_t seed, uint64_t len)
{
	struct cmd c = { op, mem, seed, len };
	struct reply r;

	if (t->sock < 0)
		return serve(&t->local, &c);
	assert_int_equal(write(t->sock, &c, sizeof(c)), sizeof(c));
	assert_int_equal(read(t->sock, &r, sizeof(r)), sizeof(r));
	return r;
}

/* The target process: exec'd afresh (a forked child cannot use CUDA
 * that its parent initialised). */
static void child_main(int sock)
{
	struct side s;
	struct cmd c;
	struct info peer;
	int n;

	devs = ibv_get_device_list(&n);
	if (!devs || !n)
		_exit(1);
	cuda_open();
	side_open(&s);
	/* The initiator's address first, then commands until C_EXIT. */
	if (read(sock, &peer, sizeof(peer)) != sizeof(peer))
		_exit(2);
	struct end pe = { .port = peer.port, .gid = peer.gid };
	connect_qp(s.e.qp, &pe, peer.qpn, &rc_default);
	while (read(sock, &c, sizeof(c)) == sizeof(c)) {
		struct reply r = serve(&s, &c);
		if (write(sock, &r, sizeof(r)) != sizeof(r))
			_exit(3);
		if (c.op == C_EXIT)
			break;
	}
	side_close(&s);
	ibv_free_device_list(devs);
	_exit(0);
}

static void target_open(struct target *t, struct side *me, bool forked)
{
	memset(t, 0, sizeof(*t));
	t->sock = -1;
	if (!forked) {
		side_open(&t->local);
	} else {
		int sv[2];
		assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		t->pid = fork();
		assert_true(t->pid >= 0);
		if (!t->pid) {
			char fd[16];
			close(sv[0]);
			snprintf(fd, sizeof(fd), "%d", sv[1]);
			execl("/proc/self/exe", "test_gpu", "--target", fd, (char *)NULL);
			_exit(127);
		}
		close(sv[1]);
		t->sock = sv[0];
	}
	struct info mine = { .qpn = me->e.qp->qp_num, .port = me->e.port, .gid = me->e.gid };
	if (forked)
		assert_int_equal(write(t->sock, &mine, sizeof(mine)), sizeof(mine));
	t->info = call(t, C_INFO, HOST, 0, 0).info;
	struct end pe = { .port = t->info.port, .gid = t->info.gid };
	connect_qp(me->e.qp, &pe, t->info.qpn, &rc_default);
	if (!forked) {
		struct end me_end = { .port = me->e.port, .gid = me->e.gid };
		connect_qp(t->local.e.qp, &me_end, me->e.qp->qp_num, &rc_default);
	}
}

static void target_close(struct target *t)
{
	if (t->sock < 0) {
		side_close(&t->local);
		return;
	}
	call(t, C_EXIT, HOST, 0, 0);
	close(t->sock);
	assert_child_ok(t->pid, "target");
}

/* ---- the table ---- */

struct row {
	enum ibv_wr_opcode op;
	enum mem local, remote;
};

static const struct row rows[] = {
	{ IBV_WR_RDMA_WRITE, HOST, DEV }, { IBV_WR_RDMA_WRITE, DEV, HOST },
	{ IBV_WR_RDMA_WRITE, DEV, DEV },  { IBV_WR_RDMA_WRITE, HOST, HOST },
	{ IBV_WR_RDMA_READ, HOST, DEV },  { IBV_WR_RDMA_READ, DEV, HOST },
	{ IBV_WR_RDMA_READ, DEV, DEV },
	{ IBV_WR_SEND, HOST, DEV },       { IBV_WR_SEND, DEV, HOST },
	{ IBV_WR_SEND, DEV, DEV },
	{ IBV_WR_RDMA_WRITE_WITH_IMM, HOST, DEV }, { IBV_WR_RDMA_WRITE_WITH_IMM, DEV, DEV },
	{ IBV_WR_SEND_WITH_IMM, DEV, DEV },
};

static const size_t sizes[] = { 1, 4096 + 13, BIG };

static const char *op_name(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE: return "WRITE";
	case IBV_WR_RDMA_WRITE_WITH_IMM: return "WRITE_WITH_IMM";
	case IBV_WR_RDMA_READ: return "READ";
	case IBV_WR_SEND: return "SEND";
	case IBV_WR_SEND_WITH_IMM: return "SEND_WITH_IMM";
	default: return "?";
	}
}

static const char *mem_name(enum mem m)
{
	return m == DEV ? "GPU" : "host";
}

static struct ibv_wc post_wait(struct side *me, enum ibv_wr_opcode op, void *laddr, size_t len,
			       uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)laddr, (uint32_t)len, lkey };
	struct ibv_send_wr wr = { .wr_id = 42, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	wr.imm_data = htonl(0x5eed);
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = 5;
	}
	assert_int_equal(ibv_post_send(me->e.qp, &wr, &bad), 0);
	return poll_one(me->e.cq);
}

static void run_row(struct side *me, struct target *t, const struct row *r, size_t len,
		    uint32_t seed)
{
	bool read = r->op == IBV_WR_RDMA_READ;
	bool two_sided = r->op == IBV_WR_SEND || r->op == IBV_WR_SEND_WITH_IMM ||
			 r->op == IBV_WR_RDMA_WRITE_WITH_IMM;
	char what[96];

	snprintf(what, sizeof(what), "%s %zu B, %s -> %s", op_name(r->op), len,
		 mem_name(read ? r->remote : r->local), mem_name(read ? r->local : r->remote));
	/* The source holds the pattern, the destination another. */
	if (read) {
		assert_int_equal(call(t, C_FILL, r->remote, seed, len).rc, 0);
		fill(me, r->local, seed + 1, len);
	} else {
		fill(me, r->local, seed, len);
		assert_int_equal(call(t, C_FILL, r->remote, seed + 1, len).rc, 0);
	}
	if (two_sided)
		assert_int_equal(call(t, C_RECV, r->remote, 0, BIG).rc, 0);
	struct ibv_wc wc = post_wait(me, r->op, buf_of(me, r->local), len, mr_of(me, r->local)->lkey,
				     t->info.addr[r->remote], t->info.rkey[r->remote]);
	if (wc.status != IBV_WC_SUCCESS)
		fail_msg("%s: %s", what, ibv_wc_status_str(wc.status));
	if (two_sided) {
		struct reply w = call(t, C_WAIT, HOST, 0, 0);
		if (w.rc != IBV_WC_SUCCESS)
			fail_msg("%s: receiver: %s", what, ibv_wc_status_str((enum ibv_wc_status)w.rc));
		if (r->op != IBV_WR_RDMA_WRITE_WITH_IMM)
			assert_int_equal((uint32_t)w.val, len);
		if (r->op != IBV_WR_SEND)
			assert_int_equal(w.val >> 32, 0x5eed);
	}
	long bad = read ? check(me, r->local, seed, len) : call(t, C_CHECK, r->remote, seed, len).rc;
	if (bad >= 0)
		fail_msg("%s: byte %ld differs", what, bad);
}

static void run_table(struct side *me, struct target *t)
{
	uint32_t seed = 1;

	for (size_t i = 0; i < SV_ARRAY_LEN(rows); i++)
		for (size_t k = 0; k < SV_ARRAY_LEN(sizes); k++)
			run_row(me, t, &rows[i], sizes[k], seed += 2);
	/* Atomics on GPU memory: atomic against other softverbs atomics
	 * (docs/architecture.md); the original value lands in GPU memory. */
	for (int m = HOST; m <= DEV; m++) {
		uint64_t start = call(t, C_WORD, DEV, 0, 0).val;
		struct ibv_wc wc = post_wait(me, IBV_WR_ATOMIC_FETCH_AND_ADD, buf_of(me, (enum mem)m),
					     8, mr_of(me, (enum mem)m)->lkey, t->info.addr[DEV],
					     t->info.rkey[DEV]);
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(call(t, C_WORD, DEV, 0, 0).val, start + 5);
		uint64_t orig;
		if (m == DEV)
			assert_int_equal(cu.dtoh(&orig, (CUdeviceptr)(uintptr_t)me->dbuf, 8),
					 CUDA_SUCCESS);
		else
			memcpy(&orig, me->e.buf, 8);
		assert_int_equal(orig, start);
	}
}

static bool udp(void)
{
	const char *t = getenv("SOFTVERBS_TRANSPORT");
	return t && !strcmp(t, "udp");
}

/* A memory window inside a GPU MR: a WRITE through its rkey lands in GPU
 * memory where the window says, and a READ through it reads it back.
 * Between processes the window's MR is a second MR of the allocation,
 * opened once more by IPC (one open per MR per peer), and closed by its
 * deregistration. */
static void window_write(struct side *me, struct target *t, bool ipc)
{
	unsigned long opens = cu.stats ? stat_of(ST_OPENS) : 0;
	unsigned long closes = cu.stats ? stat_of(ST_CLOSES) : 0;
	struct reply w = call(t, C_WINDOW, HOST, 0, 0);

	assert_int_equal(w.rc, 0);
	fill(me, HOST, 77, 8192);
	uint64_t at = t->info.addr[DEV] + 4096;
	struct ibv_wc wc = post_wait(me, IBV_WR_RDMA_WRITE, me->e.buf, 8192, me->e.mr->lkey, at,
				     (uint32_t)w.val);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	memset(me->e.buf, 0, 8192);
	wc = post_wait(me, IBV_WR_RDMA_READ, me->e.buf, 8192, me->e.mr->lkey, at, (uint32_t)w.val);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(check(me, HOST, 77, 8192), -1);
	assert_int_equal(call(t, C_UNWINDOW, HOST, 0, 0).rc, 0);
	if (ipc && cu.stats) {
		assert_int_equal(stat_of(ST_OPENS), opens + 1);
		assert_int_equal(stat_of(ST_CLOSES), closes + 1);
	}
}

/* A deregistered GPU MR answers Remote Access Error; over shm the
 * initiator had it open by IPC, once, and has closed it before
 * ibv_dereg_mr returned in the target. */
static void dereg_then_access(struct side *me, struct target *t, bool ipc)
{
	unsigned long closes = cu.stats ? stat_of(ST_CLOSES) : 0;

	if (ipc && cu.stats)
		assert_int_equal(stat_of(ST_OPEN_NOW), 1);
	assert_int_equal(call(t, C_DEREG, HOST, 0, 0).rc, 0);
	if (ipc && cu.stats) {
		assert_int_equal(stat_of(ST_CLOSES), closes + 1);
		assert_int_equal(stat_of(ST_OPEN_NOW), 0);
	}
	struct ibv_wc wc = post_wait(me, IBV_WR_RDMA_WRITE, me->e.buf, 64, me->e.mr->lkey,
				     t->info.addr[DEV], t->info.rkey[DEV]);
	assert_int_equal(wc.status, IBV_WC_REM_ACCESS_ERR);
	assert_int_equal(call(t, C_REREG, HOST, 0, 0).rc, 0);
}

static void test_in_process(void **state)
{
	struct side me;
	struct target t;

	(void)state;
	side_open(&me);
	target_open(&t, &me, false);
	run_table(&me, &t);
	window_write(&me, &t, false);
	/* Nothing was opened by IPC: one process reaches its own memory. */
	if (cu.stats)
		assert_int_equal(stat_of(ST_OPENS), 0);
	dereg_then_access(&me, &t, false);
	target_close(&t);
	side_close(&me);
}

static void test_between_processes(void **state)
{
	struct side me;
	struct target t;

	(void)state;
	side_open(&me);
	target_open(&t, &me, true);
	/* The whole table, dozens of operations on the target's GPU MR:
	 * opened once. */
	run_table(&me, &t);
	if (!udp() && cu.stats)
		assert_int_equal(stat_of(ST_OPENS), 1);
	window_write(&me, &t, !udp());
	dereg_then_access(&me, &t, !udp());
	target_close(&t);
	side_close(&me);
}

/* After the target's re-registration (a new MR on the same allocation)
 * the initiator opens it again, once. */
static void test_reopen(void **state)
{
	struct side me;
	struct target t;

	(void)state;
	side_open(&me);
	target_open(&t, &me, true);
	unsigned long before = stat_of(ST_OPENS);
	run_row(&me, &t, &rows[0], 4096, 3);
	run_row(&me, &t, &rows[0], 4096, 5);
	assert_int_equal(stat_of(ST_OPENS), before + 1);
	assert_int_equal(call(&t, C_DEREG, HOST, 0, 0).rc, 0);
	struct reply r = call(&t, C_REREG, HOST, 0, 0);
	assert_int_equal(r.rc, 0);
	t.info.rkey[DEV] = r.info.rkey[DEV];
	run_row(&me, &t, &rows[0], 4096, 7);
	assert_int_equal(stat_of(ST_OPENS), before + 2);
	assert_int_equal(stat_of(ST_OPEN_NOW), 1);
	target_close(&t);
	/* The target's exit took its MR away; the initiator closes what it
	 * opened when its own context closes. */
	side_close(&me);
	assert_int_equal(stat_of(ST_OPEN_NOW), 0);
}

static void test_register(void **state)
{
	struct side s;
	CUdeviceptr small;

	(void)state;
	side_open(&s);
	/* Registration's SYNC_MEMOPS: copies into it complete on return. */
	if (cu.stats)
		assert_true(stat_of(ST_SYNC_MEMOPS) >= 1);
	/* Past the end of its allocation. */
	assert_int_equal(cu.alloc(&small, 4096), CUDA_SUCCESS);
	errno = 0;
	assert_null(ibv_reg_mr(s.e.pd, (void *)(uintptr_t)small, 8192, IBV_ACCESS_LOCAL_WRITE));
	assert_int_equal(errno, EFAULT);
	/* Inside it: an interior pointer. */
	struct ibv_mr *mr = ibv_reg_mr(s.e.pd, (void *)(uintptr_t)(small + 1024), 1024,
				       ALL_ACCESS);
	assert_non_null(mr);
	/* Not on demand, and not reregistered. */
	errno = 0;
	assert_null(ibv_reg_mr(s.e.pd, (void *)(uintptr_t)small, 4096,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND));
	assert_int_equal(errno, EOPNOTSUPP);
	assert_int_not_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
					  IBV_ACCESS_LOCAL_WRITE), 0);
	assert_int_equal(errno, EOPNOTSUPP);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	assert_int_equal(cu.free(small), CUDA_SUCCESS);
	side_close(&s);
}

/* A registered allocation the application freed: the operation fails
 * with an error completion, and the process goes on. */
static void test_freed(void **state)
{
	struct side me;
	struct target t;
	CUdeviceptr d;

	(void)state;
	side_open(&me);
	target_open(&t, &me, false);
	assert_int_equal(cu.alloc(&d, 65536), CUDA_SUCCESS);
	struct ibv_mr *mr = ibv_reg_mr(t.local.e.pd, (void *)(uintptr_t)d, 65536, ALL_ACCESS);
	assert_non_null(mr);
	assert_int_equal(cu.free(d), CUDA_SUCCESS);
	struct ibv_wc wc = post_wait(&me, IBV_WR_RDMA_WRITE, me.e.buf, 4096, me.e.mr->lkey, d,
				     mr->rkey);
	assert_int_equal(wc.status, IBV_WC_REM_OP_ERR);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	target_close(&t);
	side_close(&me);
}

/* Over UDP, GPU memory is copied in runs, not per packet: 2 MiB is 513
 * packets of 4 KiB, received into GPU memory in one cuMemcpy per batch of
 * received packets and sent from it in one per 256 KiB window, each
 * through a pinned staging area.  A received batch is what queued while
 * the last was placed, so with copies as slow as a GPU's (some µs each)
 * packets queue, and a batch holds several.  Sending, what varies is the
 * count, not the size: a retransmission (a tail-loss probe, a timeout)
 * copies again from where it starts, and a loaded host's stalls bring
 * some: 9 copies of the 2 MiB where none came, and up to 20 (copying
 * 3.8 MB) under two busy loops.  So that case bounds the bytes a copy
 * moves on average instead: a copy per packet would move 4 KiB. */
static void test_udp_runs(void **state)
{
	static const struct {
		struct row r;
		unsigned long most;	/* cuMemcpy calls the operation may take, or */
		unsigned long least;	/* the bytes one moves on average at least */
	} cases[] = {
		{ { IBV_WR_RDMA_WRITE, HOST, DEV }, 384, 0 },	/* received into GPU memory */
		{ { IBV_WR_RDMA_READ, DEV, HOST }, 384, 0 },	/* READ responses into GPU memory */
		{ { IBV_WR_RDMA_WRITE, DEV, HOST }, 0, 64 << 10 },	/* sent from GPU memory */
	};
	struct side me;
	struct target t;

	(void)state;
	assert_non_null(cu.copy_us);
	cu.copy_us(50);
	side_open(&me);
	target_open(&t, &me, false);
	for (size_t i = 0; i < SV_ARRAY_LEN(cases); i++) {
		unsigned long before = stat_of(ST_MEMCPYS), bytes = stat_of(ST_MEMCPY_BYTES);
		run_row(&me, &t, &cases[i].r, BIG, (uint32_t)(20 + i));
		/* The test's fill of GPU memory took one copy of BIG bytes
		 * (and its check of GPU memory, receiving, one more, within
		 * those cases' bound). */
		unsigned long n = stat_of(ST_MEMCPYS) - before - 1;
		bytes = stat_of(ST_MEMCPY_BYTES) - bytes - BIG;
		print_message("udp runs: case %zu: %lu cuMemcpy calls for %lu bytes\n", i, n, bytes);
		if (cases[i].most && n > cases[i].most)
			fail_msg("case %zu: %lu cuMemcpy calls for %u bytes (at most %lu)", i, n, BIG,
				 cases[i].most);
		if (cases[i].least && (!n || bytes / n < cases[i].least))
			fail_msg("case %zu: %lu cuMemcpy calls for %lu bytes, under %lu a call", i, n,
				 bytes, cases[i].least);
	}
	assert_true(stat_of(ST_PINNED_NOW) >= 2);
	target_close(&t);
	side_close(&me);
	assert_int_equal(stat_of(ST_PINNED_NOW), 0);
	cu.copy_us(0);
}

/* --no-cuda: a process without the driver registers host memory as
 * always, and an address no host memory backs fails as before, saying
 * (SOFTVERBS_EXPLAIN=1) that no CUDA driver is loaded. */
static void test_no_cuda(void **state)
{
	struct fix *f;
	int sv[2];

	(void)state;
	assert_null(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD));
	fix_setup((void **)&f);
	void *none = mmap(NULL, 65536, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(none != MAP_FAILED);
	/* Explanations go to stderr: capture them. */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	int saved = dup(2);
	dup2(sv[1], 2);
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(f->pd, none, 65536, IBV_ACCESS_LOCAL_WRITE);
	int err = errno;
	dup2(saved, 2);
	close(saved);
	close(sv[1]);
	char text[1024] = "";
	ssize_t n = read(sv[0], text, sizeof(text) - 1);
	close(sv[0]);
	text[n > 0 ? n : 0] = 0;
	assert_null(mr);
	assert_int_equal(err, EFAULT);
	if (!strstr(text, "no CUDA driver (libcuda.so.1) is loaded in this process"))
		fail_msg("the explanation does not say that no CUDA driver is loaded: %s", text);
	char *host = malloc(4096);
	mr = ibv_reg_mr(f->pd, host, 4096, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(mr);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	free(host);
	munmap(none, 65536);
	fix_teardown((void **)&f);
}


/* ---- --bench N: scripts/gpu-check.sh's figures ---- */

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The median time of one operation of len bytes, in microseconds. */
static double median_op(struct side *me, struct target *t, enum ibv_wr_opcode op, enum mem local,
			enum mem remote, size_t len, int iters)
{
	double *v = calloc((size_t)iters, sizeof(*v));

	assert_non_null(v);
	for (int i = 0; i < iters; i++) {
		double t0 = now_us();
		struct ibv_wc wc = post_wait(me, op, buf_of(me, local), len, mr_of(me, local)->lkey,
					     t->info.addr[remote], t->info.rkey[remote]);
		v[i] = now_us() - t0;
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
	}
	qsort(v, (size_t)iters, sizeof(*v), cmp_double);
	double m = v[iters / 2];
	free(v);
	return m;
}

static double median_memcpy(void *dst, const void *src, size_t len, int iters)
{
	double *v = calloc((size_t)iters, sizeof(*v));

	assert_non_null(v);
	for (int i = 0; i < iters; i++) {
		double t0 = now_us();
		assert_int_equal(cu.memcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src,
					   len), CUDA_SUCCESS);
		v[i] = now_us() - t0;
	}
	qsort(v, (size_t)iters, sizeof(*v), cmp_double);
	double m = v[iters / 2];
	free(v);
	return m;
}

static void bench(int iters)
{
	static const struct {
		const char *name;
		enum ibv_wr_opcode op;
		enum mem local, remote;
	} cases[] = {
		{ "WRITE host -> GPU of another process", IBV_WR_RDMA_WRITE, HOST, DEV },
		{ "WRITE GPU -> GPU of another process", IBV_WR_RDMA_WRITE, DEV, DEV },
		{ "READ GPU of another process -> host", IBV_WR_RDMA_READ, HOST, DEV },
	};
	static const size_t lens[] = { 8, 1u << 20 };
	struct side me;
	struct target t;
	char *cdev;
	CUdeviceptr d;

	side_open(&me);
	target_open(&t, &me, true);
	/* The cuMemcpy beside each: between buffers of the same kinds, in
	 * one process. */
	assert_int_equal(cu.alloc(&d, BIG), CUDA_SUCCESS);
	cdev = (char *)(uintptr_t)d;
	double first = now_us();
	post_wait(&me, IBV_WR_RDMA_WRITE, me.e.buf, 8, me.e.mr->lkey, t.info.addr[DEV],
		  t.info.rkey[DEV]);
	printf("gpu-bench: first WRITE into another process's GPU MR (its CUDA IPC open): "
	       "%.1f us\n", now_us() - first);
	for (size_t c = 0; c < SV_ARRAY_LEN(cases); c++)
		for (size_t k = 0; k < SV_ARRAY_LEN(lens); k++) {
			size_t len = lens[k];
			bool rd = cases[c].op == IBV_WR_RDMA_READ, dd = cases[c].local == DEV;
			double us = median_op(&me, &t, cases[c].op, cases[c].local, cases[c].remote,
					      len, iters);
			double ref = rd ? median_memcpy(me.e.buf, cdev, len, iters) :
				     median_memcpy(cdev, dd ? me.dbuf : me.e.buf, len, iters);
			printf("gpu-bench: %-40s %8zu B: median %9.2f us (%8.1f MB/s); cuMemcpy %s "
			       "same size: %9.2f us; ratio %.2f\n", cases[c].name, len, us,
			       (double)len / us, rd ? "D->H" : dd ? "D->D" : "H->D", ref, us / ref);
		}
	assert_int_equal(cu.free(d), CUDA_SUCCESS);
	target_close(&t);
	side_close(&me);
}

int main(int argc, char **argv)
{
	int n;

	signal(SIGPIPE, SIG_IGN);
	if (argc > 1 && !strcmp(argv[1], "--no-cuda")) {
		const struct CMUnitTest t[] = { cmocka_unit_test(test_no_cuda) };
		return cmocka_run_group_tests(t, NULL, NULL);
	}
	if (!cuda_load()) {
		if (argc > 1 && !strcmp(argv[1], "--target"))
			_exit(1);
		fprintf(stderr, "test_gpu: no libcuda.so.1 (%s); run it with the test double's "
			"directory in LD_LIBRARY_PATH\n", dlerror());
		return 1;
	}
	if (argc > 2 && !strcmp(argv[1], "--target"))
		child_main(atoi(argv[2]));
	devs = ibv_get_device_list(&n);
	if (argc > 2 && !strcmp(argv[1], "--bench")) {
		cuda_open();
		bench(atoi(argv[2]));
		ibv_free_device_list(devs);
		return 0;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_register),
		cmocka_unit_test(test_in_process),
		cmocka_unit_test(test_between_processes),
		cmocka_unit_test(test_freed),
		/* CUDA IPC is how processes share GPU memory over shm; over
		 * UDP each process copies into its own, and only the double
		 * counts opens. */
		cmocka_unit_test(test_reopen),
	};
	/* The parent's driver: each target process opens its own. */
	cuda_open();
	const struct CMUnitTest udp_tests[] = {
		cmocka_unit_test(test_register),
		cmocka_unit_test(test_in_process),
		cmocka_unit_test(test_between_processes),
		cmocka_unit_test(test_freed),
		/* Only the double counts copies. */
		cmocka_unit_test(test_udp_runs),
	};
	size_t ntests = udp() ? SV_ARRAY_LEN(udp_tests) - !cu.stats :
			SV_ARRAY_LEN(tests) - !cu.stats;
	int ret = _cmocka_run_group_tests("test_gpu", udp() ? udp_tests : tests, ntests, NULL, NULL);
	ibv_free_device_list(devs);
	return ret;
}
