/* SPDX-License-Identifier: MIT */
/* Fixtures shared by the unit tests: a context with a PD and CQ, QPs of
 * any type, and the attributes that make every legal transition valid. */
#ifndef SV_TEST_HELPERS_H
#define SV_TEST_HELPERS_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#define SV_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

struct fix {
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_port_attr port;
	union ibv_gid gid;
};

/* fork() for tests: a failed assert in the child aborts the child.  Without
 * this, cmocka longjmps back into the child's copy of the test runner,
 * which goes on to run the remaining tests a second time, in the wrong
 * process, and the parent waits on a child that never does its job. */
static inline pid_t fix_fork(void)
{
	pid_t pid = fork();

	if (!pid)
		setenv("CMOCKA_TEST_ABORT", "1", 1);
	return pid;
}

static inline int fix_setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	int n;

	f->list = ibv_get_device_list(&n);
	assert_non_null(f->list);
	assert_true(n >= 1);
	f->ctx = ibv_open_device(f->list[0]);
	assert_non_null(f->ctx);
	f->pd = ibv_alloc_pd(f->ctx);
	assert_non_null(f->pd);
	f->cq = ibv_create_cq(f->ctx, 64, NULL, NULL, 0);
	assert_non_null(f->cq);
	assert_int_equal(ibv_query_port(f->ctx, 1, &f->port), 0);
	assert_int_equal(ibv_query_gid(f->ctx, 1, 0, &f->gid), 0);
	*state = f;
	return 0;
}

static inline int fix_teardown(void **state)
{
	struct fix *f = *state;

	assert_int_equal(ibv_destroy_cq(f->cq), 0);
	assert_int_equal(ibv_dealloc_pd(f->pd), 0);
	assert_int_equal(ibv_close_device(f->ctx), 0);
	ibv_free_device_list(f->list);
	free(f);
	return 0;
}

static inline struct ibv_qp *fix_qp(struct fix *f, enum ibv_qp_type type)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = f->cq, .recv_cq = f->cq, .qp_type = type,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(f->pd, &ia);

	assert_non_null(qp);
	return qp;
}

/* Attribute values valid for every transition, so that a mask decides. */
static inline void fix_valid_attr(struct fix *f, struct ibv_qp *qp, struct ibv_qp_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->port_num = 1;
	a->qkey = 0x11111111;
	a->qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	a->path_mtu = IBV_MTU_1024;
	a->dest_qp_num = qp->qp_num;
	a->rq_psn = 1;
	a->sq_psn = 1;
	a->max_dest_rd_atomic = 1;
	a->max_rd_atomic = 1;
	a->min_rnr_timer = 12;
	a->timeout = 14;
	a->retry_cnt = 7;
	a->rnr_retry = 7;
	a->ah_attr.port_num = 1;
	a->ah_attr.dlid = f->port.lid ? f->port.lid : 1;
	if (f->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
		a->ah_attr.is_global = 1;
		a->ah_attr.grh.dgid = f->gid;
		a->ah_attr.grh.hop_limit = 64;
	}
	a->alt_ah_attr = a->ah_attr;
	a->alt_port_num = 1;
	a->alt_timeout = 14;
	a->path_mig_state = IBV_MIG_MIGRATED;
}

/* Walks a fresh QP from RESET up to `to` (INIT, RTR or RTS), with the
 * attributes each QP type requires. */
static inline void fix_walk(struct fix *f, struct ibv_qp *qp, enum ibv_qp_state to)
{
	bool ud = qp->qp_type == IBV_QPT_UD, rc = qp->qp_type == IBV_QPT_RC;
	struct ibv_qp_attr a;
	int m;

	fix_valid_attr(f, qp, &a);
	a.qp_state = IBV_QPS_INIT;
	m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | (ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
	assert_int_equal(ibv_modify_qp(qp, &a, m), 0);
	if (to == IBV_QPS_INIT)
		return;
	a.qp_state = IBV_QPS_RTR;
	m = IBV_QP_STATE;
	if (!ud)
		m |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (rc)
		m |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	assert_int_equal(ibv_modify_qp(qp, &a, m), 0);
	if (to == IBV_QPS_RTR)
		return;
	a.qp_state = IBV_QPS_RTS;
	m = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (rc)
		m |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	assert_int_equal(ibv_modify_qp(qp, &a, m), 0);
}

#endif
