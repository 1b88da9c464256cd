/* SPDX-License-Identifier: MIT */
/* Two ends of a connection in one process -- context, PD, CQ, QP and a
 * registered buffer each -- and the steps that connect, post and poll. */
#ifndef SV_TEST_PAIR_H
#define SV_TEST_PAIR_H

#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#define BUF 65536
#define ALL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
		    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

struct end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	struct ibv_port_attr port;
	union ibv_gid gid;
};

struct qp_opts {
	enum ibv_qp_type type;
	int access;
	uint8_t rnr_retry, min_rnr_timer, timeout, retry_cnt;
	int cqe;
	struct ibv_srq *srq;
};

/* Opened by each test binary's main(). */
static struct ibv_device **devs;

static inline void end_open(struct end *e, const struct qp_opts *o)
{
	memset(e, 0, sizeof(*e));
	e->ctx = ibv_open_device(devs[0]);
	assert_non_null(e->ctx);
	e->pd = ibv_alloc_pd(e->ctx);
	e->cq = ibv_create_cq(e->ctx, o->cqe ? o->cqe : 256, NULL, NULL, 0);
	e->buf = aligned_alloc(4096, BUF);
	memset(e->buf, 0, BUF);
	e->mr = ibv_reg_mr(e->pd, e->buf, BUF, ALL_ACCESS);
	assert_non_null(e->mr);
	struct ibv_qp_init_attr ia = { .send_cq = e->cq, .recv_cq = e->cq, .qp_type = o->type,
				       .cap = { 64, 64, 4, 4, 64 } };
	e->qp = ibv_create_qp(e->pd, &ia);
	assert_non_null(e->qp);
	assert_int_equal(ibv_query_port(e->ctx, 1, &e->port), 0);
	assert_int_equal(ibv_query_gid(e->ctx, 1, 0, &e->gid), 0);
}

static inline void end_close(struct end *e)
{
	ibv_destroy_qp(e->qp);
	ibv_dereg_mr(e->mr);
	ibv_destroy_cq(e->cq);
	ibv_dealloc_pd(e->pd);
	assert_int_equal(ibv_close_device(e->ctx), 0);
	free(e->buf);
}

/* RESET -> RTS towards a peer QP. */
static inline void connect_qp(struct ibv_qp *qp, const struct end *peer, uint32_t peer_qpn,
		       const struct qp_opts *o)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = o->access, .qkey = 0x1234 };
	bool ud = o->type == IBV_QPT_UD;

	assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				       (ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS)), 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer_qpn;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = o->min_rnr_timer;
	a.ah_attr.port_num = 1;
	a.ah_attr.dlid = peer->port.lid;
	if (peer->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = peer->gid;
	}
	int mask = IBV_QP_STATE;
	if (o->type == IBV_QPT_RC)
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	else if (o->type == IBV_QPT_UC)
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	assert_int_equal(ibv_modify_qp(qp, &a, mask), 0);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = o->timeout;
	a.retry_cnt = o->retry_cnt;
	a.rnr_retry = o->rnr_retry;
	a.max_rd_atomic = 16;
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (o->type == IBV_QPT_RC)
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	assert_int_equal(ibv_modify_qp(qp, &a, mask), 0);
}

static inline void pair_up(struct end *a, struct end *b, const struct qp_opts *o)
{
	end_open(a, o);
	end_open(b, o);
	connect_qp(a->qp, b, b->qp->qp_num, o);
	connect_qp(b->qp, a, a->qp->qp_num, o);
}

static const struct qp_opts rc_default = {
	.type = IBV_QPT_RC, .access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
	IBV_ACCESS_REMOTE_ATOMIC, .rnr_retry = 7, .min_rnr_timer = 1, .timeout = 14, .retry_cnt = 7,
};

static inline struct ibv_wc poll_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		assert_true(n >= 0);
		if (n)
			return wc;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10)
			fail_msg("no completion in 10 s");
	}
}

/* For a forked peer, which reports failures by exit status: the next
 * completion succeeded and is wr_id's. */
static inline bool wc_ok(struct ibv_cq *cq, uint64_t wr_id)
{
	struct ibv_wc wc = poll_one(cq);
	return wc.status == IBV_WC_SUCCESS && wc.wr_id == wr_id;
}

static inline void assert_cq_empty(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	usleep(2000);
	assert_int_equal(ibv_poll_cq(cq, 1, &wc), 0);
}

static inline int post(struct end *e, enum ibv_wr_opcode op, void *laddr, uint32_t len, uint32_t lkey,
		uint64_t raddr, uint32_t rkey, uint64_t wr_id, int flags)
{
	struct ibv_sge sge = { (uintptr_t)laddr, len, lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = flags }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = 1;
	}
	return ibv_post_send(e->qp, &wr, &bad);
}

static inline void post_recv(struct end *e, void *addr, uint32_t len, uint64_t wr_id)
{
	struct ibv_sge sge = { (uintptr_t)addr, len, e->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;

	assert_int_equal(ibv_post_recv(e->qp, &wr, &bad), 0);
}

static inline enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	assert_int_equal(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia), 0);
	return a.qp_state;
}

/* Waits for a forked peer whose exit status is 0 or the step it failed at. */
static inline void assert_child_ok(pid_t pid, const char *who)
{
	int st;

	assert_int_equal(waitpid(pid, &st, 0), pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		fail_msg("%s process failed at step %d", who, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

#endif
