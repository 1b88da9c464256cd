/* SPDX-License-Identifier: MIT */
/*
 * Memory windows and atomic write, with the exact statuses of IBA 10.6.7
 * and rxe: binding (type 1 through ibv_bind_mw, type 2 through the send
 * queue), remote access through a window's rkey within its bounds and
 * rights, and each way a window stops granting access -- rebinding,
 * LOCAL_INV, SEND_WITH_INV, dealloc, deregistering its MR.
 */
#define _GNU_SOURCE
#include <stdio.h>

#include "helpers.h"
#include "pair.h"

#define WIN_OFF 4096u
#define WIN_LEN 4096u
#define RW (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

/* b owns the window over b->buf; a is the initiator. */
struct mwfix {
	struct end a, b;
	struct ibv_mr *mr;	/* b's MR with IBV_ACCESS_MW_BIND */
	struct ibv_mw *mw;
	uint32_t rkey;
};

static void mw_open(struct mwfix *f, enum ibv_mw_type type, int mr_access)
{
	pair_up(&f->a, &f->b, &rc_default);
	f->mr = ibv_reg_mr(f->b.pd, f->b.buf, BUF, mr_access);
	assert_non_null(f->mr);
	f->mw = ibv_alloc_mw(f->b.pd, type);
	assert_non_null(f->mw);
	assert_int_equal(f->mw->type, type);
}

static void mw_close(struct mwfix *f)
{
	if (f->mw)
		assert_int_equal(ibv_dealloc_mw(f->mw), 0);
	if (f->mr)
		assert_int_equal(ibv_dereg_mr(f->mr), 0);
	end_close(&f->a);
	end_close(&f->b);
}

/* Binds through the send queue (type 2) and returns the completion. */
static struct ibv_wc bind2(struct mwfix *f, uint32_t rkey, uint64_t off, uint64_t len, int access)
{
	struct ibv_send_wr wr = { .wr_id = 7, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.bind_mw.mw = f->mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){ f->mr, (uintptr_t)f->b.buf + off, len,
							  (unsigned)access };
	assert_int_equal(ibv_post_send(f->b.qp, &wr, &bad), 0);
	struct ibv_wc wc = poll_one(f->b.cq);
	assert_int_equal(wc.wr_id, 7);
	if (wc.status == IBV_WC_SUCCESS) {
		assert_int_equal(wc.opcode, IBV_WC_BIND_MW);
		f->rkey = rkey;
	}
	return wc;
}

/* ibv_bind_mw (type 1). */
static struct ibv_wc bind1(struct mwfix *f, struct ibv_mr *mr, uint64_t off, uint64_t len,
			   int access)
{
	struct ibv_mw_bind b = { .wr_id = 9, .send_flags = IBV_SEND_SIGNALED,
				 .bind_info = { mr, mr ? (uintptr_t)f->b.buf + off : 0, len,
						(unsigned)access } };

	assert_int_equal(ibv_bind_mw(f->b.qp, f->mw, &b), 0);
	struct ibv_wc wc = poll_one(f->b.cq);
	assert_int_equal(wc.wr_id, 9);
	if (wc.status == IBV_WC_SUCCESS) {
		assert_int_equal(wc.opcode, IBV_WC_BIND_MW);
		f->rkey = f->mw->rkey;
	}
	return wc;
}

/* a writes 8 bytes at b->buf + off through rkey; the initiator's status. */
static enum ibv_wc_status access_at(struct mwfix *f, enum ibv_wr_opcode op, uint64_t off,
				    uint32_t len, uint32_t rkey)
{
	memset(f->a.buf, 0x5a, len);
	assert_int_equal(post(&f->a, op, f->a.buf, len, f->a.mr->lkey,
			      (uintptr_t)f->b.buf + off, rkey, 1, IBV_SEND_SIGNALED), 0);
	return poll_one(f->a.cq).status;
}

static uint32_t other_key_byte(uint32_t rkey)
{
	return ibv_inc_rkey(rkey);
}

/* ---- access through a window ---- */

enum undo { U_NONE, U_REBIND_ZERO, U_REBIND_OLD_KEY, U_LOCAL_INV, U_SEND_INV, U_DEALLOC,
	    U_DEREG_MR };

static const struct {
	const char *what;
	enum ibv_mw_type type;
	int access;
	enum ibv_wr_opcode op;
	uint64_t off;
	uint32_t len;
	enum undo undo;
	enum ibv_wc_status want;
} access_cases[] = {
	{ "type 1: WRITE inside", IBV_MW_TYPE_1, RW, IBV_WR_RDMA_WRITE, WIN_OFF, 64, U_NONE,
	  IBV_WC_SUCCESS },
	{ "type 1: READ at the last byte", IBV_MW_TYPE_1, RW, IBV_WR_RDMA_READ,
	  WIN_OFF + WIN_LEN - 1, 1, U_NONE, IBV_WC_SUCCESS },
	{ "type 1: WRITE across the end", IBV_MW_TYPE_1, RW, IBV_WR_RDMA_WRITE,
	  WIN_OFF + WIN_LEN - 4, 8, U_NONE, IBV_WC_REM_ACCESS_ERR },
	{ "type 1: WRITE before the start (inside the MR)", IBV_MW_TYPE_1, RW, IBV_WR_RDMA_WRITE,
	  WIN_OFF - 8, 8, U_NONE, IBV_WC_REM_ACCESS_ERR },
	{ "type 1: READ without the window's read right", IBV_MW_TYPE_1, IBV_ACCESS_REMOTE_WRITE,
	  IBV_WR_RDMA_READ, WIN_OFF, 8, U_NONE, IBV_WC_REM_ACCESS_ERR },
	{ "type 1: ATOMIC without the window's atomic right", IBV_MW_TYPE_1, RW,
	  IBV_WR_ATOMIC_FETCH_AND_ADD, WIN_OFF, 8, U_NONE, IBV_WC_REM_ACCESS_ERR },
	{ "type 1: after a zero-length bind", IBV_MW_TYPE_1, RW, IBV_WR_RDMA_WRITE, WIN_OFF, 8,
	  U_REBIND_ZERO, IBV_WC_REM_ACCESS_ERR },
	{ "type 1: the previous rkey after a rebind", IBV_MW_TYPE_1, RW, IBV_WR_RDMA_WRITE,
	  WIN_OFF, 8, U_REBIND_OLD_KEY, IBV_WC_REM_ACCESS_ERR },
	{ "type 2: WRITE inside", IBV_MW_TYPE_2, RW, IBV_WR_RDMA_WRITE, WIN_OFF, 64, U_NONE,
	  IBV_WC_SUCCESS },
	{ "type 2: after LOCAL_INV", IBV_MW_TYPE_2, RW, IBV_WR_RDMA_WRITE, WIN_OFF, 8,
	  U_LOCAL_INV, IBV_WC_REM_ACCESS_ERR },
	{ "type 2: after SEND_WITH_INV", IBV_MW_TYPE_2, RW, IBV_WR_RDMA_WRITE, WIN_OFF, 8,
	  U_SEND_INV, IBV_WC_REM_ACCESS_ERR },
	{ "type 2: after dealloc", IBV_MW_TYPE_2, RW, IBV_WR_RDMA_WRITE, WIN_OFF, 8, U_DEALLOC,
	  IBV_WC_REM_ACCESS_ERR },
	{ "type 2: after its MR was deregistered", IBV_MW_TYPE_2, RW, IBV_WR_RDMA_WRITE, WIN_OFF,
	  8, U_DEREG_MR, IBV_WC_REM_ACCESS_ERR },
};

static void undo_binding(struct mwfix *f, enum undo u)
{
	struct ibv_send_wr wr = { .wr_id = 3, .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;

	switch (u) {
	case U_NONE:
		break;
	case U_REBIND_ZERO:
		assert_int_equal(bind1(f, NULL, 0, 0, 0).status, IBV_WC_SUCCESS);
		break;
	case U_REBIND_OLD_KEY: {
		uint32_t old = f->rkey;
		assert_int_equal(bind1(f, f->mr, WIN_OFF, WIN_LEN, RW).status, IBV_WC_SUCCESS);
		assert_int_not_equal(f->rkey, old);
		f->rkey = old;
		break;
	}
	case U_LOCAL_INV:
		wr.opcode = IBV_WR_LOCAL_INV;
		wr.invalidate_rkey = f->rkey;
		assert_int_equal(ibv_post_send(f->b.qp, &wr, &bad), 0);
		wc = poll_one(f->b.cq);
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(wc.opcode, IBV_WC_LOCAL_INV);
		break;
	case U_SEND_INV:
		/* a invalidates b's window remotely, through b's QP. */
		post_recv(&f->b, f->b.buf + BUF - 64, 64, 5);
		wr.opcode = IBV_WR_SEND_WITH_INV;
		wr.invalidate_rkey = f->rkey;
		assert_int_equal(ibv_post_send(f->a.qp, &wr, &bad), 0);
		assert_int_equal(poll_one(f->a.cq).status, IBV_WC_SUCCESS);
		wc = poll_one(f->b.cq);
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(wc.opcode, IBV_WC_RECV);
		assert_true(wc.wc_flags & IBV_WC_WITH_INV);
		assert_int_equal(wc.invalidated_rkey, f->rkey);
		break;
	case U_DEALLOC:
		assert_int_equal(ibv_dealloc_mw(f->mw), 0);
		f->mw = NULL;
		break;
	case U_DEREG_MR:
		assert_int_equal(ibv_dereg_mr(f->mr), 0);
		f->mr = NULL;
		break;
	}
}

static void test_window_access(void **state)
{
	(void)state;
	for (size_t i = 0; i < SV_ARRAY_LEN(access_cases); i++) {
		struct mwfix f = { 0 };
		struct ibv_wc wc;

		print_message("  %s\n", access_cases[i].what);
		mw_open(&f, access_cases[i].type,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND | RW | IBV_ACCESS_REMOTE_ATOMIC);
		if (access_cases[i].type == IBV_MW_TYPE_1)
			wc = bind1(&f, f.mr, WIN_OFF, WIN_LEN, access_cases[i].access);
		else
			wc = bind2(&f, other_key_byte(f.mw->rkey), WIN_OFF, WIN_LEN,
				   access_cases[i].access);
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		undo_binding(&f, access_cases[i].undo);
		enum ibv_wc_status st = access_at(&f, access_cases[i].op, access_cases[i].off,
						  access_cases[i].len, f.rkey);
		assert_int_equal(st, access_cases[i].want);
		if (st == IBV_WC_SUCCESS && access_cases[i].op == IBV_WR_RDMA_WRITE)
			assert_int_equal((unsigned char)f.b.buf[access_cases[i].off], 0x5a);
		if (st != IBV_WC_SUCCESS) {
			/* C10-?? (11.6.3.1): both ends go to ERR. */
			assert_int_equal(qp_state(f.a.qp), IBV_QPS_ERR);
			assert_int_equal(qp_state(f.b.qp), IBV_QPS_ERR);
		}
		mw_close(&f);
	}
}

/* ---- binds that break a rule: IBV_WC_MW_BIND_ERR ---- */

enum bind_case { B_BEYOND_MR, B_NO_BIND_RIGHT, B_WRITABLE_NO_LOCAL_WRITE, B_TYPE2_TWICE,
		 B_TYPE2_ZERO_LEN, B_TYPE1_ZERO_BASED, B_OTHER_INDEX };

static const struct {
	const char *what;
	enum bind_case c;
	enum ibv_mw_type type;
	int mr_access;
} bind_cases[] = {
	{ "window beyond its MR (C10-75)", B_BEYOND_MR, IBV_MW_TYPE_2,
	  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND },
	{ "type 1 window beyond its MR", B_BEYOND_MR, IBV_MW_TYPE_1,
	  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND },
	{ "MR without IBV_ACCESS_MW_BIND (C10-73)", B_NO_BIND_RIGHT, IBV_MW_TYPE_2,
	  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE },
	{ "writable window on a read-only MR (C10-74)", B_WRITABLE_NO_LOCAL_WRITE, IBV_MW_TYPE_2,
	  IBV_ACCESS_MW_BIND | IBV_ACCESS_REMOTE_READ },
	{ "type 2 bound twice (o10-37.2.30)", B_TYPE2_TWICE, IBV_MW_TYPE_2,
	  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND },
	{ "type 2 zero length (o10-37.2.40)", B_TYPE2_ZERO_LEN, IBV_MW_TYPE_2,
	  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND },
	{ "type 1 zero-based (o10-36.2.2)", B_TYPE1_ZERO_BASED, IBV_MW_TYPE_1,
	  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND },
	{ "new rkey of another index", B_OTHER_INDEX, IBV_MW_TYPE_2,
	  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND },
};

static void test_bind_errors(void **state)
{
	(void)state;
	for (size_t i = 0; i < SV_ARRAY_LEN(bind_cases); i++) {
		struct mwfix f = { 0 };
		struct ibv_wc wc;
		uint32_t k;

		print_message("  %s\n", bind_cases[i].what);
		mw_open(&f, bind_cases[i].type, bind_cases[i].mr_access);
		k = other_key_byte(f.mw->rkey);
		switch (bind_cases[i].c) {
		case B_BEYOND_MR:
			wc = bind_cases[i].type == IBV_MW_TYPE_1 ?
			     bind1(&f, f.mr, BUF - 100, WIN_LEN, IBV_ACCESS_REMOTE_WRITE) :
			     bind2(&f, k, BUF - 100, WIN_LEN, IBV_ACCESS_REMOTE_WRITE);
			break;
		case B_NO_BIND_RIGHT:
			wc = bind2(&f, k, 0, WIN_LEN, IBV_ACCESS_REMOTE_WRITE);
			break;
		case B_WRITABLE_NO_LOCAL_WRITE:
			wc = bind2(&f, k, 0, WIN_LEN, IBV_ACCESS_REMOTE_WRITE);
			break;
		case B_TYPE2_TWICE:
			assert_int_equal(bind2(&f, k, 0, WIN_LEN, 0).status, IBV_WC_SUCCESS);
			wc = bind2(&f, ibv_inc_rkey(k), 0, WIN_LEN, 0);
			break;
		case B_TYPE2_ZERO_LEN:
			wc = bind2(&f, k, 0, 0, 0);
			break;
		case B_TYPE1_ZERO_BASED:
			wc = bind1(&f, f.mr, 0, WIN_LEN, IBV_ACCESS_ZERO_BASED);
			break;
		case B_OTHER_INDEX:
			wc = bind2(&f, k + 0x100, 0, WIN_LEN, 0);
			break;
		}
		assert_int_equal(wc.status, IBV_WC_MW_BIND_ERR);
		assert_int_equal(qp_state(f.b.qp), IBV_QPS_ERR);
		mw_close(&f);
	}
}

/* ---- invalidations that are refused ---- */

static void test_invalidate_errors(void **state)
{
	(void)state;
	enum { I_MR, I_TYPE1, I_UNBOUND, I_REMOTE_BAD };
	for (int c = I_MR; c <= I_REMOTE_BAD; c++) {
		struct mwfix f = { 0 };
		struct ibv_send_wr wr = { .wr_id = 4, .opcode = IBV_WR_LOCAL_INV,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;

		mw_open(&f, c == I_TYPE1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
		wr.invalidate_rkey = c == I_MR ? f.mr->rkey : f.mw->rkey;
		if (c == I_REMOTE_BAD) {
			/* SEND_WITH_INV naming an MR: Invalid Request at both ends. */
			post_recv(&f.b, f.b.buf, 64, 5);
			wr.opcode = IBV_WR_SEND_WITH_INV;
			wr.invalidate_rkey = f.mr->rkey;
			assert_int_equal(ibv_post_send(f.a.qp, &wr, &bad), 0);
			assert_int_equal(poll_one(f.a.cq).status, IBV_WC_REM_INV_REQ_ERR);
			struct ibv_wc wc = poll_one(f.b.cq);
			assert_int_equal(wc.wr_id, 5);
			assert_int_equal(wc.status, IBV_WC_REM_INV_REQ_ERR);
		} else {
			assert_int_equal(ibv_post_send(f.b.qp, &wr, &bad), 0);
			struct ibv_wc wc = poll_one(f.b.cq);
			assert_int_equal(wc.status, IBV_WC_LOC_QP_OP_ERR);
			assert_int_equal(qp_state(f.b.qp), IBV_QPS_ERR);
		}
		mw_close(&f);
	}
}

/* ---- the verbs themselves ---- */

static void test_alloc_dealloc(void **state)
{
	struct fix *fx = *state;
	struct ibv_device_attr da;

	assert_int_equal(ibv_query_device(fx->ctx, &da), 0);
	assert_true(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
	assert_true(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
	assert_true(da.max_mw > 0);
	errno = 0;
	assert_null(ibv_alloc_mw(fx->pd, (enum ibv_mw_type)3));
	assert_int_equal(errno, EINVAL);
	struct ibv_mw *mw = ibv_alloc_mw(fx->pd, IBV_MW_TYPE_2);
	assert_non_null(mw);
	assert_ptr_equal(mw->pd, fx->pd);
	/* The PD is in use while the window exists. */
	assert_int_equal(ibv_dealloc_pd(fx->pd), EBUSY);
	assert_int_equal(ibv_dealloc_mw(mw), 0);
	/* A type 2 window cannot go through ibv_bind_mw (verbs.h). */
	mw = ibv_alloc_mw(fx->pd, IBV_MW_TYPE_2);
	struct ibv_qp *qp = fix_qp(fx, IBV_QPT_RC);
	struct ibv_mw_bind b = { 0 };
	assert_int_equal(ibv_bind_mw(qp, mw, &b), EINVAL);
	/* BIND_MW naming no window is refused at post time. */
	fix_walk(fx, qp, IBV_QPS_RTS);
	struct ibv_send_wr wr = { .opcode = IBV_WR_BIND_MW }, *bad;
	wr.bind_mw.mw = (struct ibv_mw *)&wr;
	assert_int_equal(ibv_post_send(qp, &wr, &bad), EINVAL);
	assert_int_equal(ibv_destroy_qp(qp), 0);
	assert_int_equal(ibv_dealloc_mw(mw), 0);
}

/* ---- atomic write ---- */

static void test_atomic_write(void **state)
{
	(void)state;
	struct end a, b;
	uint64_t v = 0x1122334455667788ull;

	pair_up(&a, &b, &rc_default);
	/* ibv_post_send with one 8-byte SGE. */
	memcpy(a.buf, &v, 8);
	assert_int_equal(post(&a, IBV_WR_ATOMIC_WRITE, a.buf, 8, a.mr->lkey, (uintptr_t)b.buf + 64,
			      b.mr->rkey, 1, IBV_SEND_SIGNALED), 0);
	struct ibv_wc wc = poll_one(a.cq);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.opcode, IBV_WC_ATOMIC_WRITE);
	assert_memory_equal(b.buf + 64, &v, 8);
	/* Anything but 8 bytes is refused at post time. */
	assert_int_equal(post(&a, IBV_WR_ATOMIC_WRITE, a.buf, 4, a.mr->lkey, (uintptr_t)b.buf,
			      b.mr->rkey, 1, IBV_SEND_SIGNALED), EINVAL);
	/* Misaligned: Invalid Request (as for the other atomics, 9.4.5). */
	assert_int_equal(post(&a, IBV_WR_ATOMIC_WRITE, a.buf, 8, a.mr->lkey, (uintptr_t)b.buf + 4,
			      b.mr->rkey, 2, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_REM_INV_REQ_ERR);
	end_close(&a);
	end_close(&b);

	/* ibv_wr_atomic_write; the MR needs remote write access (rxe). */
	end_open(&a, &rc_default);
	end_open(&b, &rc_default);
	struct ibv_mr *ro = ibv_reg_mr(b.pd, b.buf, BUF, IBV_ACCESS_REMOTE_READ);
	struct ibv_qp_init_attr_ex xa = {
		.qp_type = IBV_QPT_RC, .send_cq = a.cq, .recv_cq = a.cq, .pd = a.pd,
		.cap = { 8, 8, 1, 1, 0 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE,
	};
	struct ibv_qp *q = ibv_create_qp_ex(a.ctx, &xa);
	assert_non_null(q);
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(q);
	connect_qp(q, &b, b.qp->qp_num, &rc_default);
	connect_qp(b.qp, &a, q->qp_num, &rc_default);
	uint64_t w = 42;
	ibv_wr_start(qx);
	qx->wr_id = 11;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(qx, b.mr->rkey, (uintptr_t)b.buf + 128, &w);
	w = 0;	/* taken at the call */
	assert_int_equal(ibv_wr_complete(qx), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_SUCCESS);
	assert_int_equal(*(uint64_t *)(b.buf + 128), 42);
	ibv_wr_start(qx);
	qx->wr_id = 12;
	ibv_wr_atomic_write(qx, ro->rkey, (uintptr_t)b.buf + 128, &w);
	assert_int_equal(ibv_wr_complete(qx), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_REM_ACCESS_ERR);
	assert_int_equal(ibv_destroy_qp(q), 0);
	assert_int_equal(ibv_dereg_mr(ro), 0);
	end_close(&a);
	end_close(&b);
}

int main(void)
{
	devs = ibv_get_device_list(NULL);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_window_access),
		cmocka_unit_test(test_bind_errors),
		cmocka_unit_test(test_invalidate_errors),
		cmocka_unit_test_setup_teardown(test_alloc_dealloc, fix_setup, fix_teardown),
		cmocka_unit_test(test_atomic_write),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	ibv_free_device_list(devs);
	return r;
}
