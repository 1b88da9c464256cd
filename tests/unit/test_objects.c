/* SPDX-License-Identifier: MIT */
/*
 * Bad input to the object verbs: wrong combinations, out-of-range values,
 * busy objects and double destroys.  Each must fail with the right errno,
 * change nothing, and leave no leak (the sanitizer build checks that).
 */
#include <arpa/inet.h>
#include <poll.h>

#include "helpers.h"

static void test_cross_context_objects(void **state)
{
	struct fix *f = *state;
	struct ibv_context *o = ibv_open_device(f->list[0]);
	struct ibv_cq *ocq = ibv_create_cq(o, 8, NULL, NULL, 0);
	struct ibv_pd *opd = ibv_alloc_pd(o);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *osrq = ibv_create_srq(opd, &sa);
	struct ibv_comp_channel *och = ibv_create_comp_channel(o);

	assert_non_null(ocq);
	assert_non_null(osrq);
	assert_non_null(och);
	struct ibv_qp_init_attr ia = {
		.send_cq = ocq, .recv_cq = f->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	errno = 0;
	assert_null(ibv_create_qp(f->pd, &ia));		/* send CQ of another context */
	assert_int_equal(errno, EINVAL);
	ia.send_cq = f->cq;
	ia.recv_cq = ocq;
	errno = 0;
	assert_null(ibv_create_qp(f->pd, &ia));		/* recv CQ of another context */
	assert_int_equal(errno, EINVAL);
	ia.recv_cq = f->cq;
	ia.srq = osrq;
	errno = 0;
	assert_null(ibv_create_qp(f->pd, &ia));		/* SRQ of another context */
	assert_int_equal(errno, EINVAL);
	ia.srq = NULL;
	errno = 0;
	assert_null(ibv_create_cq(f->ctx, 8, NULL, och, 0));	/* channel of another context */
	assert_int_equal(errno, EINVAL);
	/* Nothing was consumed: the foreign objects are free to go. */
	assert_int_equal(ibv_destroy_srq(osrq), 0);
	assert_int_equal(ibv_destroy_comp_channel(och), 0);
	assert_int_equal(ibv_destroy_cq(ocq), 0);
	assert_int_equal(ibv_dealloc_pd(opd), 0);
	assert_int_equal(ibv_close_device(o), 0);
}

static void test_qp_create_limits(void **state)
{
	struct fix *f = *state;
	static const struct {
		struct ibv_qp_cap cap;
		enum ibv_qp_type type;
		int err;
	} cases[] = {
		{ { 16385, 1, 1, 1, 0 }, IBV_QPT_RC, EINVAL },	/* max_send_wr > max_qp_wr */
		{ { 1, 16385, 1, 1, 0 }, IBV_QPT_RC, EINVAL },
		{ { 1, 1, 33, 1, 0 }, IBV_QPT_RC, EINVAL },	/* max_send_sge > max_sge */
		{ { 1, 1, 1, 33, 0 }, IBV_QPT_UD, EINVAL },
		{ { 1, 1, 1, 1, 257 }, IBV_QPT_UC, EINVAL },	/* inline beyond the limit */
		{ { 1, 1, 1, 1, 0 }, IBV_QPT_XRC_SEND, EINVAL },	/* XRC_SEND: no receive side */
		{ { 1, 1, 1, 1, 0 }, (enum ibv_qp_type)77, EINVAL },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct ibv_qp_init_attr ia = { .send_cq = f->cq, .recv_cq = f->cq,
					       .qp_type = cases[i].type, .cap = cases[i].cap };
		errno = 0;
		struct ibv_qp *qp = ibv_create_qp(f->pd, &ia);
		if (qp)
			fail_msg("case %zu accepted", i);
		assert_int_equal(errno, cases[i].err);
	}
	struct ibv_qp_init_attr ia = { .send_cq = f->cq, .recv_cq = NULL, .qp_type = IBV_QPT_RC };
	errno = 0;
	assert_null(ibv_create_qp(f->pd, &ia));
	assert_int_equal(errno, EINVAL);
	errno = 0;
	assert_null(ibv_create_qp(f->pd, NULL));
	assert_int_equal(errno, EINVAL);
}

static void test_qp_reports_actual_caps(void **state)
{
	struct fix *f = *state;
	struct ibv_qp_init_attr ia = { .send_cq = f->cq, .recv_cq = f->cq, .qp_type = IBV_QPT_RC,
				       .cap = { 10, 20, 2, 3, 16 } };
	struct ibv_qp *qp = ibv_create_qp(f->pd, &ia);
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr q;

	assert_non_null(qp);
	assert_true(ia.cap.max_inline_data >= 16);
	assert_int_equal(ibv_query_qp(qp, &a, IBV_QP_CAP, &q), 0);
	assert_int_equal(q.cap.max_send_wr, 10);
	/* At least what was asked (the receive queue has spare slots), and
	 * the same from creation and from query. */
	assert_true(ia.cap.max_recv_wr >= 20);
	assert_int_equal(q.cap.max_recv_wr, ia.cap.max_recv_wr);
	assert_int_equal(q.cap.max_send_sge, 2);
	assert_int_equal(q.cap.max_recv_sge, 3);
	assert_int_equal(q.cap.max_inline_data, ia.cap.max_inline_data);
	assert_ptr_equal(q.send_cq, f->cq);
	assert_int_equal(q.qp_type, IBV_QPT_RC);
	assert_int_equal(qp->state, IBV_QPS_RESET);
	/* Created without send_ops_flags: no ibv_qp_ex. */
	assert_null(ibv_qp_to_qp_ex(qp));
	assert_int_equal(ibv_destroy_qp(qp), 0);
}

static void test_busy_objects(void **state)
{
	struct fix *f = *state;
	static char buf[64];
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(f->pd, &sa);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(f->ctx);
	struct ibv_cq *cq = ibv_create_cq(f->ctx, 4, NULL, ch, 0);
	struct ibv_qp_init_attr ia = { .send_cq = f->cq, .recv_cq = cq, .srq = srq,
				       .qp_type = IBV_QPT_RC, .cap = { 1, 1, 1, 1, 0 } };
	struct ibv_qp *qp = ibv_create_qp(f->pd, &ia);
	struct ibv_mr *mr = ibv_reg_mr(f->pd, buf, sizeof(buf), 0);

	assert_non_null(qp);
	assert_non_null(mr);
	assert_int_equal(ia.cap.max_recv_wr, 0);	/* the SRQ receives */
	assert_int_equal(ibv_destroy_cq(cq), EBUSY);
	assert_int_equal(ibv_destroy_srq(srq), EBUSY);
	assert_int_equal(ibv_dealloc_pd(f->pd), EBUSY);
	assert_int_equal(ibv_destroy_comp_channel(ch), -1);
	assert_int_equal(errno, EBUSY);
	/* Still intact and usable. */
	assert_int_equal(ibv_req_notify_cq(cq, 0), 0);
	assert_int_equal(ibv_destroy_qp(qp), 0);
	assert_int_equal(ibv_destroy_cq(cq), 0);
	assert_int_equal(ibv_destroy_comp_channel(ch), 0);
	assert_int_equal(ibv_destroy_srq(srq), 0);
	assert_int_equal(ibv_dereg_mr(mr), 0);
}

static void test_double_destroy(void **state)
{
	struct fix *f = *state;
	static char buf[64];
	struct ibv_context *c = ibv_open_device(f->list[0]);
	struct ibv_pd *pd = ibv_alloc_pd(c);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), 0);
	struct ibv_cq *cq = ibv_create_cq(c, 4, NULL, NULL, 0);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(c);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { 1, 1, 1, 1, 0 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	struct ibv_port_attr pa;
	assert_int_equal(ibv_query_port(c, 1, &pa), 0);
	union ibv_gid gid;
	assert_int_equal(ibv_query_gid(c, 1, 0, &gid), 0);
	struct ibv_ah_attr aa = { .dlid = pa.lid ? pa.lid : 1, .port_num = 1,
				  .is_global = pa.link_layer == IBV_LINK_LAYER_ETHERNET };
	aa.grh.dgid = gid;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);

	assert_non_null(ah);
	assert_non_null(qp);
	assert_int_equal(ibv_destroy_ah(ah), 0);
	assert_int_equal(ibv_destroy_ah(ah), EINVAL);
	assert_int_equal(ibv_destroy_qp(qp), 0);
	assert_int_equal(ibv_destroy_qp(qp), EINVAL);
	assert_int_equal(ibv_destroy_srq(srq), 0);
	assert_int_equal(ibv_destroy_srq(srq), EINVAL);
	assert_int_equal(ibv_destroy_cq(cq), 0);
	assert_int_equal(ibv_destroy_cq(cq), EINVAL);
	assert_int_equal(ibv_destroy_comp_channel(ch), 0);
	assert_int_equal(ibv_destroy_comp_channel(ch), -1);
	assert_int_equal(errno, EINVAL);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	assert_int_equal(ibv_dereg_mr(mr), EINVAL);
	assert_int_equal(ibv_dealloc_pd(pd), 0);
	assert_int_equal(ibv_dealloc_pd(pd), EINVAL);
	assert_int_equal(ibv_close_device(c), 0);
	assert_int_equal(ibv_close_device(c), -1);
	assert_int_equal(errno, EINVAL);
	/* Verbs on a closed context fail cleanly too. */
	errno = 0;
	assert_null(ibv_alloc_pd(c));
	assert_int_equal(errno, EINVAL);
}

static void test_close_with_live_objects(void **state)
{
	struct fix *f = *state;
	static char buf[64];
	struct ibv_context *c = ibv_open_device(f->list[0]);
	struct ibv_pd *pd = ibv_alloc_pd(c);
	struct ibv_cq *cq = ibv_create_cq(c, 4, NULL, ibv_create_comp_channel(c), 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { 1, 1, 1, 1, 0 } };

	assert_non_null(ibv_reg_mr(pd, buf, sizeof(buf), 0));
	assert_non_null(ibv_create_qp(pd, &ia));
	/* Like closing the uverbs file: everything left is destroyed; the
	 * sanitizer build proves nothing leaks. */
	assert_int_equal(ibv_close_device(c), 0);
}

static void test_post_bad_input(void **state)
{
	struct fix *f = *state;
	struct ibv_qp *rc = fix_qp(f, IBV_QPT_RC), *uc = fix_qp(f, IBV_QPT_UC);
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(f->pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sge = { (uintptr_t)buf, 8, mr->lkey };
	struct ibv_send_wr wr = { .opcode = IBV_WR_SEND, .sg_list = &sge, .num_sge = 1 }, *bad;
	struct ibv_recv_wr rwr = { .sg_list = &sge, .num_sge = 1 }, *rbad;

	/* RESET: neither queue takes work (C10-29/30). */
	assert_int_equal(ibv_post_send(rc, &wr, &bad), EINVAL);
	assert_int_equal(ibv_post_recv(rc, &rwr, &rbad), EINVAL);
	assert_ptr_equal(rbad, &rwr);
	fix_walk(f, rc, IBV_QPS_INIT);
	/* INIT takes receives, not sends. */
	assert_int_equal(ibv_post_recv(rc, &rwr, &rbad), 0);
	assert_int_equal(ibv_post_send(rc, &wr, &bad), EINVAL);
	/* Too many SGEs; a full receive queue. */
	rwr.num_sge = 2;
	assert_int_equal(ibv_post_recv(rc, &rwr, &rbad), EINVAL);
	rwr.num_sge = 1;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	assert_int_equal(ibv_query_qp(rc, &qa, IBV_QP_CAP, &qi), 0);
	for (uint32_t i = 1; i < qi.cap.max_recv_wr; i++)
		assert_int_equal(ibv_post_recv(rc, &rwr, &rbad), 0);
	assert_int_equal(ibv_post_recv(rc, &rwr, &rbad), ENOMEM);
	/* UC has no READ: refused at post time on an RTS UC QP. */
	fix_walk(f, uc, IBV_QPS_RTS);
	wr.opcode = IBV_WR_RDMA_READ;
	assert_int_equal(ibv_post_send(uc, &wr, &bad), EINVAL);
	wr.opcode = IBV_WR_SEND;
	wr.num_sge = 2;
	assert_int_equal(ibv_post_send(uc, &wr, &bad), EINVAL);
	assert_int_equal(ibv_destroy_qp(rc), 0);
	assert_int_equal(ibv_destroy_qp(uc), 0);
	assert_int_equal(ibv_dereg_mr(mr), 0);
}

static void test_cq_values(void **state)
{
	struct fix *f = *state;
	struct ibv_cq *cq;

	errno = 0;
	assert_null(ibv_create_cq(f->ctx, 0, NULL, NULL, 0));
	assert_int_equal(errno, EINVAL);
	errno = 0;
	assert_null(ibv_create_cq(f->ctx, 65537, NULL, NULL, 0));
	assert_int_equal(errno, EINVAL);
	errno = 0;
	assert_null(ibv_create_cq(f->ctx, 4, NULL, NULL, 1));	/* one vector only */
	assert_int_equal(errno, EINVAL);
	cq = ibv_create_cq(f->ctx, 4, NULL, NULL, 0);
	assert_non_null(cq);
	assert_int_equal(ibv_req_notify_cq(cq, 0), EINVAL);	/* no channel */
	assert_int_equal(ibv_resize_cq(cq, 0), EINVAL);
	assert_int_equal(ibv_resize_cq(cq, 100000), EINVAL);
	assert_int_equal(ibv_resize_cq(cq, 100), 0);
	assert_int_equal(cq->cqe, 100);
	struct ibv_wc wc;
	assert_int_equal(ibv_poll_cq(cq, 1, &wc), 0);	/* empty */
	assert_int_equal(ibv_destroy_cq(cq), 0);

	struct ibv_cq_init_attr_ex ax = { .cqe = 4, .wc_flags = IBV_WC_EX_WITH_FLOW_TAG };
	errno = 0;
	assert_null(ibv_create_cq_ex(f->ctx, &ax));
	assert_int_equal(errno, EOPNOTSUPP);
	ax.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	ax.comp_mask = 1u << 7;
	errno = 0;
	assert_null(ibv_create_cq_ex(f->ctx, &ax));
	assert_int_equal(errno, EINVAL);
	ax.comp_mask = 0;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(f->ctx, &ax);
	assert_non_null(cqx);
	struct ibv_poll_cq_attr pa = { 0 };
	assert_int_equal(ibv_start_poll(cqx, &pa), ENOENT);
	assert_int_equal(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), 0);
}

static void test_srq_values(void **state)
{
	struct fix *f = *state;
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 0, .max_sge = 1 } };
	struct ibv_srq_attr q;

	errno = 0;
	assert_null(ibv_create_srq(f->pd, &sa));
	assert_int_equal(errno, EINVAL);
	sa.attr.max_wr = 16385;
	errno = 0;
	assert_null(ibv_create_srq(f->pd, &sa));
	assert_int_equal(errno, EINVAL);
	sa.attr.max_wr = 16;
	sa.attr.max_sge = 33;
	errno = 0;
	assert_null(ibv_create_srq(f->pd, &sa));
	assert_int_equal(errno, EINVAL);
	sa.attr.max_sge = 2;
	struct ibv_srq *srq = ibv_create_srq(f->pd, &sa);
	assert_non_null(srq);
	struct ibv_srq_attr m = { .srq_limit = 17 };
	assert_int_equal(ibv_modify_srq(srq, &m, IBV_SRQ_LIMIT), EINVAL);	/* above max_wr */
	m.srq_limit = 8;
	assert_int_equal(ibv_modify_srq(srq, &m, IBV_SRQ_LIMIT), 0);
	m.max_wr = 64;
	assert_int_equal(ibv_modify_srq(srq, &m, IBV_SRQ_MAX_WR), 0);
	assert_int_equal(ibv_modify_srq(srq, &m, 1 << 5), EINVAL);
	assert_int_equal(ibv_query_srq(srq, &q), 0);
	assert_int_equal(q.max_wr, 64);
	assert_int_equal(q.max_sge, 2);
	assert_int_equal(q.srq_limit, 8);
	assert_int_equal(ibv_destroy_srq(srq), 0);
}

static void test_ah_values(void **state)
{
	struct fix *f = *state;
	bool roce = f->port.link_layer == IBV_LINK_LAYER_ETHERNET;
	struct ibv_ah_attr a = { .dlid = 0x10, .port_num = 1 };

	errno = 0;
	if (roce) {
		/* RoCE: an AH without a GRH addresses nothing. */
		assert_null(ibv_create_ah(f->pd, &a));
		assert_int_equal(errno, EINVAL);
		a.is_global = 1;
		a.grh.dgid = f->gid;
	} else {
		a.dlid = 0;
		assert_null(ibv_create_ah(f->pd, &a));
		assert_int_equal(errno, EINVAL);
		a.dlid = 0x10;
	}
	a.port_num = 2;
	errno = 0;
	assert_null(ibv_create_ah(f->pd, &a));
	assert_int_equal(errno, EINVAL);
	a.port_num = 1;
	struct ibv_ah *ah = ibv_create_ah(f->pd, &a);
	assert_non_null(ah);
	assert_int_equal(ibv_destroy_ah(ah), 0);

	/* An AH from a received UD completion addresses its sender. */
	struct ibv_wc wc = { .slid = 0x22, .sl = 3, .wc_flags = roce ? IBV_WC_GRH : 0 };
	struct ibv_grh grh;
	memset(&grh, 0, sizeof(grh));
	grh.sgid = f->gid;
	grh.dgid = f->gid;
	grh.version_tclass_flow = htonl(6u << 28);
	struct ibv_ah_attr back;
	assert_int_equal(ibv_init_ah_from_wc(f->ctx, 1, &wc, &grh, &back), 0);
	assert_int_equal(back.dlid, 0x22);
	assert_int_equal(back.sl, 3);
	assert_int_equal(back.is_global, roce);
	ah = ibv_create_ah_from_wc(f->pd, &wc, &grh, 1);
	if (roce)
		assert_non_null(ah);
	if (ah)
		assert_int_equal(ibv_destroy_ah(ah), 0);
}

static void test_unsupported_is_eopnotsupp(void **state)
{
	struct fix *f = *state;

	errno = 0;
	assert_null(ibv_reg_dmabuf_mr(f->pd, 0, 4096, 0, 3, 0));
	assert_int_equal(errno, EOPNOTSUPP);
	struct ibv_counters_init_attr ca = { 0 };
	errno = 0;
	assert_null(ibv_create_counters(f->ctx, &ca));
	assert_int_equal(errno, EOPNOTSUPP);
	struct ibv_qp *qp = fix_qp(f, IBV_QPT_UD);
	/* TSO (raw packet QPs only) is refused at post time. */
	fix_walk(f, qp, IBV_QPS_RTS);
	struct ibv_send_wr wr = { .opcode = IBV_WR_TSO }, *bad = NULL;
	assert_int_equal(ibv_post_send(qp, &wr, &bad), EOPNOTSUPP);
	assert_ptr_equal(bad, &wr);
	struct ibv_qp_init_attr_ex xia = { .qp_type = IBV_QPT_RC, .send_cq = f->cq, .recv_cq = f->cq,
					   .pd = f->pd, .cap = { 1, 1, 1, 1, 0 },
					   .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					   .send_ops_flags = IBV_QP_EX_WITH_TSO };
	errno = 0;
	assert_null(ibv_create_qp_ex(f->ctx, &xia));
	assert_int_equal(errno, EOPNOTSUPP);
	/* UD offers SEND only. */
	xia.qp_type = IBV_QPT_UD;
	xia.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
	errno = 0;
	assert_null(ibv_create_qp_ex(f->ctx, &xia));
	assert_int_equal(errno, EOPNOTSUPP);
	xia.send_ops_flags = IBV_QP_EX_WITH_SEND;
	struct ibv_qp *qx = ibv_create_qp_ex(f->ctx, &xia);
	assert_non_null(qx);
	assert_non_null(ibv_qp_to_qp_ex(qx));
	assert_ptr_equal(&ibv_qp_to_qp_ex(qx)->qp_base, qx);
	assert_int_equal(ibv_destroy_qp(qx), 0);
	assert_int_equal(ibv_destroy_qp(qp), 0);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, fix_setup, fix_teardown)
	const struct CMUnitTest tests[] = {
		T(test_cross_context_objects), T(test_qp_create_limits), T(test_qp_reports_actual_caps),
		T(test_busy_objects), T(test_double_destroy), T(test_close_with_live_objects),
		T(test_post_bad_input), T(test_cq_values), T(test_srq_values), T(test_ah_values),
		T(test_unsupported_is_eopnotsupp),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
