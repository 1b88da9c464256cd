/* SPDX-License-Identifier: MIT */
/*
 * XRC: domains, XRC SRQs, XRC_SEND and XRC_RECV QPs, with the exact
 * statuses when a request names a wrong SRQ, one of another domain, or
 * memory outside the SRQ's PD.  Debian's ibv_xsrq_pingpong (one and two
 * clients) runs in tests/integration/pingpong.sh.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>

#include "helpers.h"
#include "pair.h"

/* One side of an XRC conversation in one context: an XRC_SEND QP, an
 * XRC_RECV QP and an XRC SRQ (with its own CQ), all in one domain. */
struct xside {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_xrcd *xrcd;
	struct ibv_srq *srq;
	struct ibv_qp *send, *recv;
	struct ibv_mr *mr;
	char *buf;
	struct ibv_port_attr port;
	union ibv_gid gid;
	uint32_t srqn;
};

static struct ibv_xrcd *open_xrcd(struct ibv_context *ctx, int fd, int oflags)
{
	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD |
					 IBV_XRCD_INIT_ATTR_OFLAGS, .fd = fd, .oflags = oflags };

	return ibv_open_xrcd(ctx, &xa);
}

static void xside_open(struct xside *x)
{
	memset(x, 0, sizeof(*x));
	x->ctx = ibv_open_device(devs[0]);
	assert_non_null(x->ctx);
	x->pd = ibv_alloc_pd(x->ctx);
	x->scq = ibv_create_cq(x->ctx, 64, NULL, NULL, 0);
	x->rcq = ibv_create_cq(x->ctx, 64, NULL, NULL, 0);
	x->buf = calloc(1, BUF);
	x->mr = ibv_reg_mr(x->pd, x->buf, BUF, ALL_ACCESS);
	x->xrcd = open_xrcd(x->ctx, -1, 0);	/* a private domain */
	assert_non_null(x->xrcd);
	struct ibv_srq_init_attr_ex sa = {
		.attr = { .max_wr = 16, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
			     IBV_SRQ_INIT_ATTR_CQ,
		.srq_type = IBV_SRQT_XRC, .pd = x->pd, .xrcd = x->xrcd, .cq = x->rcq,
	};
	x->srq = ibv_create_srq_ex(x->ctx, &sa);
	assert_non_null(x->srq);
	assert_int_equal(ibv_get_srq_num(x->srq, &x->srqn), 0);
	struct ibv_qp_init_attr_ex ra = { .qp_type = IBV_QPT_XRC_RECV,
					  .comp_mask = IBV_QP_INIT_ATTR_XRCD, .xrcd = x->xrcd };
	x->recv = ibv_create_qp_ex(x->ctx, &ra);
	assert_non_null(x->recv);
	struct ibv_qp_init_attr_ex ia = { .qp_type = IBV_QPT_XRC_SEND, .send_cq = x->scq,
					  .cap = { .max_send_wr = 16, .max_send_sge = 1 },
					  .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = x->pd };
	x->send = ibv_create_qp_ex(x->ctx, &ia);
	assert_non_null(x->send);
	assert_int_equal(ibv_query_port(x->ctx, 1, &x->port), 0);
	assert_int_equal(ibv_query_gid(x->ctx, 1, 0, &x->gid), 0);
}

static void xside_close(struct xside *x)
{
	assert_int_equal(ibv_destroy_qp(x->send), 0);
	assert_int_equal(ibv_destroy_qp(x->recv), 0);
	assert_int_equal(ibv_destroy_srq(x->srq), 0);
	assert_int_equal(ibv_close_xrcd(x->xrcd), 0);
	ibv_dereg_mr(x->mr);
	ibv_destroy_cq(x->scq);
	ibv_destroy_cq(x->rcq);
	ibv_dealloc_pd(x->pd);
	assert_int_equal(ibv_close_device(x->ctx), 0);
	free(x->buf);
}

static void to_rtr(struct ibv_qp *qp, const struct xside *peer, uint32_t dest, bool tgt)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = tgt ? IBV_ACCESS_REMOTE_WRITE : 0 };

	assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				       IBV_QP_ACCESS_FLAGS), 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.dlid = peer->port.lid;
	if (peer->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = peer->gid;
	}
	int m = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (tgt)
		m |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	/* The XRC_SEND row (the kernel's XRC_INI) takes neither: it never
	 * receives, so a receive-side attribute is refused. */
	if (!tgt)
		assert_int_equal(ibv_modify_qp(qp, &a, m | IBV_QP_MIN_RNR_TIMER), EINVAL);
	assert_int_equal(ibv_modify_qp(qp, &a, m), 0);
}

/* a's XRC_SEND -> b's XRC_RECV (and back, for the RTS of the sender). */
static void xconnect(struct xside *a, struct xside *b, uint8_t rnr_retry)
{
	to_rtr(b->recv, a, a->send->qp_num, true);
	to_rtr(a->send, b, b->recv->qp_num, false);
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				 .rnr_retry = rnr_retry, .max_rd_atomic = 1 };
	assert_int_equal(ibv_modify_qp(a->send, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN |
				       IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC), 0);
}

static int xpost(struct xside *a, enum ibv_wr_opcode op, uint32_t srqn, uint64_t raddr,
		 uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)a->buf, 64, a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 0x77, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.qp_type.xrc.remote_srqn = srqn;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(a->send, &wr, &bad);
}

static void srq_recv(struct xside *b)
{
	struct ibv_sge sge = { (uintptr_t)b->buf, 128, b->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 0x55, .sg_list = &sge, .num_sge = 1 }, *bad;

	assert_int_equal(ibv_post_srq_recv(b->srq, &wr, &bad), 0);
}

static void test_xrc_send_and_write(void **state)
{
	(void)state;
	struct xside a, b;

	xside_open(&a);
	xside_open(&b);
	xconnect(&a, &b, 7);
	strcpy(a.buf, "through an XRC SRQ");
	srq_recv(&b);
	assert_int_equal(xpost(&a, IBV_WR_SEND, b.srqn, 0, 0), 0);
	assert_int_equal(poll_one(a.scq).status, IBV_WC_SUCCESS);
	/* The completion is on the SRQ's CQ and names the XRC_RECV QP. */
	struct ibv_wc wc = poll_one(b.rcq);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.opcode, IBV_WC_RECV);
	assert_int_equal(wc.wr_id, 0x55);
	assert_int_equal(wc.qp_num, b.recv->qp_num);
	assert_int_equal(wc.src_qp, a.send->qp_num);
	assert_int_equal(wc.byte_len, 64);
	assert_string_equal(b.buf, "through an XRC SRQ");
	/* RDMA WRITE: checked against the SRQ's PD. */
	strcpy(a.buf, "written");
	assert_int_equal(xpost(&a, IBV_WR_RDMA_WRITE, b.srqn, (uintptr_t)b.buf + 1024, b.mr->rkey), 0);
	assert_int_equal(poll_one(a.scq).status, IBV_WC_SUCCESS);
	assert_string_equal(b.buf + 1024, "written");
	xside_close(&a);
	xside_close(&b);
}

enum xcase { X_NO_SRQ, X_OTHER_DOMAIN, X_OTHER_PD, X_SRQ_EMPTY };

static const struct {
	const char *what;
	enum xcase c;
	enum ibv_wc_status want;
} xcases[] = {
	{ "remote_srqn names no SRQ", X_NO_SRQ, IBV_WC_REM_INV_REQ_ERR },
	{ "remote_srqn names an SRQ of another domain", X_OTHER_DOMAIN, IBV_WC_REM_INV_REQ_ERR },
	{ "WRITE to an MR outside the SRQ's PD", X_OTHER_PD, IBV_WC_REM_ACCESS_ERR },
	{ "SEND to an empty SRQ, rnr_retry 0", X_SRQ_EMPTY, IBV_WC_RNR_RETRY_EXC_ERR },
};

static void test_xrc_errors(void **state)
{
	(void)state;
	for (size_t i = 0; i < SV_ARRAY_LEN(xcases); i++) {
		struct xside a, b;
		struct ibv_pd *pd2 = NULL;
		struct ibv_mr *mr2 = NULL;
		struct ibv_xrcd *x2 = NULL;
		struct ibv_srq *s2 = NULL;
		int ret = 0;

		print_message("  %s\n", xcases[i].what);
		xside_open(&a);
		xside_open(&b);
		xconnect(&a, &b, 0);
		switch (xcases[i].c) {
		case X_NO_SRQ:
			ret = xpost(&a, IBV_WR_SEND, b.recv->qp_num, 0, 0);	/* a QP, not an SRQ */
			break;
		case X_OTHER_DOMAIN: {
			x2 = open_xrcd(b.ctx, -1, 0);
			struct ibv_srq_init_attr_ex sa = {
				.attr = { .max_wr = 4, .max_sge = 1 },
				.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
					     IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ,
				.srq_type = IBV_SRQT_XRC, .pd = b.pd, .xrcd = x2, .cq = b.rcq,
			};
			s2 = ibv_create_srq_ex(b.ctx, &sa);
			uint32_t n2;
			assert_int_equal(ibv_get_srq_num(s2, &n2), 0);
			ret = xpost(&a, IBV_WR_SEND, n2, 0, 0);
			break;
		}
		case X_OTHER_PD:
			pd2 = ibv_alloc_pd(b.ctx);
			mr2 = ibv_reg_mr(pd2, b.buf, BUF, ALL_ACCESS);
			ret = xpost(&a, IBV_WR_RDMA_WRITE, b.srqn, (uintptr_t)b.buf, mr2->rkey);
			break;
		case X_SRQ_EMPTY:
			ret = xpost(&a, IBV_WR_SEND, b.srqn, 0, 0);
			break;
		}
		assert_int_equal(ret, 0);
		assert_int_equal(poll_one(a.scq).status, xcases[i].want);
		assert_int_equal(qp_state(a.send), IBV_QPS_ERR);
		if (s2)
			assert_int_equal(ibv_destroy_srq(s2), 0);
		if (x2)
			assert_int_equal(ibv_close_xrcd(x2), 0);
		if (mr2)
			ibv_dereg_mr(mr2);
		if (pd2)
			ibv_dealloc_pd(pd2);
		xside_close(&a);
		xside_close(&b);
	}
}

static void test_xrc_objects(void **state)
{
	struct fix *f = *state;
	char path[] = "/tmp/svxrcXXXXXX";
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	/* One file, one domain: O_EXCL refuses a second open. */
	struct ibv_xrcd *x = open_xrcd(f->ctx, fd, O_CREAT);
	assert_non_null(x);
	errno = 0;
	assert_null(open_xrcd(f->ctx, fd, O_CREAT | O_EXCL));
	assert_int_equal(errno, EEXIST);
	struct ibv_xrcd *again = open_xrcd(f->ctx, fd, 0);
	assert_non_null(again);
	assert_int_equal(ibv_close_xrcd(again), 0);
	errno = 0;
	assert_null(open_xrcd(f->ctx, 12345, O_CREAT));
	assert_int_equal(errno, EBADF);
	/* XRC_RECV needs the domain; XRC_SEND has no receive side. */
	struct ibv_qp_init_attr_ex ra = { .qp_type = IBV_QPT_XRC_RECV };
	errno = 0;
	assert_null(ibv_create_qp_ex(f->ctx, &ra));
	assert_int_equal(errno, EINVAL);
	ra.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	ra.xrcd = x;
	struct ibv_qp *rq = ibv_create_qp_ex(f->ctx, &ra);
	assert_non_null(rq);
	assert_null(rq->pd);
	/* The domain is in use now. */
	assert_int_equal(ibv_close_xrcd(x), EBUSY);
	struct ibv_qp_init_attr_ex sa = { .qp_type = IBV_QPT_XRC_SEND, .send_cq = f->cq,
					  .recv_cq = f->cq, .cap = { 4, 4, 1, 1, 0 },
					  .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = f->pd };
	errno = 0;
	assert_null(ibv_create_qp_ex(f->ctx, &sa));
	assert_int_equal(errno, EINVAL);	/* max_recv_wr 4 */
	sa.cap.max_recv_wr = sa.cap.max_recv_sge = 0;
	struct ibv_qp *sq = ibv_create_qp_ex(f->ctx, &sa);
	assert_non_null(sq);
	/* ibv_open_qp: the same target QP, one more reference. */
	struct ibv_qp_open_attr oa = { .comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD |
				       IBV_QP_OPEN_ATTR_TYPE, .qp_num = rq->qp_num, .xrcd = x,
				       .qp_type = IBV_QPT_XRC_RECV };
	struct ibv_qp *opened = ibv_open_qp(f->ctx, &oa);
	assert_ptr_equal(opened, rq);
	oa.qp_num = sq->qp_num;
	errno = 0;
	assert_null(ibv_open_qp(f->ctx, &oa));	/* an XRC_SEND QP */
	assert_int_equal(errno, EINVAL);
	assert_int_equal(ibv_destroy_qp(opened), 0);	/* drops the open's reference */
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	assert_int_equal(ibv_query_qp(rq, &qa, IBV_QP_STATE, &qia), 0);	/* still there */
	/* Neither has a receive queue; XRC_RECV has no send queue. */
	struct ibv_recv_wr rw = { 0 }, *rbad;
	assert_int_equal(ibv_post_recv(sq, &rw, &rbad), EINVAL);
	assert_int_equal(ibv_post_recv(rq, &rw, &rbad), EINVAL);
	struct ibv_send_wr swr = { .opcode = IBV_WR_SEND }, *sbad;
	assert_int_equal(ibv_post_send(rq, &swr, &sbad), EINVAL);
	/* Only XRC SRQs have numbers. */
	struct ibv_srq_init_attr basic = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *bs = ibv_create_srq(f->pd, &basic);
	uint32_t n;
	assert_int_equal(ibv_get_srq_num(bs, &n), EINVAL);
	/* An XRC SRQ needs its domain and CQ. */
	struct ibv_srq_init_attr_ex xa = { .attr = { .max_wr = 4, .max_sge = 1 },
					   .comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
					   .srq_type = IBV_SRQT_XRC, .pd = f->pd };
	errno = 0;
	assert_null(ibv_create_srq_ex(f->ctx, &xa));
	assert_int_equal(errno, EINVAL);
	assert_int_equal(ibv_destroy_srq(bs), 0);
	assert_int_equal(ibv_destroy_qp(sq), 0);
	assert_int_equal(ibv_destroy_qp(rq), 0);
	assert_int_equal(ibv_close_xrcd(x), 0);
	close(fd);
	unlink(path);
}

/* ---- an XRC target QP opened from another process ---- */

struct tgt_info {
	uint32_t qpn, srqn;
	struct ibv_port_attr port;
	union ibv_gid gid;
	char path[64];
};

/*
 * The opener: its own context and XRC_SEND QP; the creator's target QP,
 * opened by number in the same domain (the same file), configured from
 * here and sent to.  Returns 0 or the step that failed.
 */
static int opener(int up, int down)
{
	struct tgt_info t;
	char go;

	if (read(down, &t, sizeof(t)) != sizeof(t))
		return 1;
	struct xside me;
	xside_open(&me);
	int fd = open(t.path, O_RDONLY);
	struct ibv_xrcd *x = open_xrcd(me.ctx, fd, 0);
	if (!x)
		return 2;
	struct ibv_qp_open_attr oa = { .comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD |
				       IBV_QP_OPEN_ATTR_TYPE, .qp_num = t.qpn, .xrcd = x,
				       .qp_type = IBV_QPT_XRC_RECV };
	struct ibv_qp *tq = ibv_open_qp(me.ctx, &oa);
	if (!tq || tq->qp_num != t.qpn || tq->context != me.ctx || tq->qp_type != IBV_QPT_XRC_RECV)
		return 3;
	/* Another domain's view of the number is no QP. */
	oa.xrcd = me.xrcd;
	errno = 0;
	if (ibv_open_qp(me.ctx, &oa) || errno != EINVAL)
		return 4;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	if (ibv_query_qp(tq, &qa, IBV_QP_STATE, &qia) || qa.qp_state != IBV_QPS_RESET ||
	    qia.qp_type != IBV_QPT_XRC_RECV)
		return 5;
	/* The owner checks the transition: RESET -> RTR skips INIT. */
	struct ibv_qp_attr bad = { .qp_state = IBV_QPS_RTR };
	if (ibv_modify_qp(tq, &bad, IBV_QP_STATE) != EINVAL)
		return 6;
	struct xside creator = { .port = t.port, .gid = t.gid };
	to_rtr(tq, &me, me.send->qp_num, true);
	to_rtr(me.send, &creator, t.qpn, false);
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				 .rnr_retry = 7, .max_rd_atomic = 1 };
	if (ibv_modify_qp(me.send, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN |
			  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		return 7;
	if (ibv_query_qp(tq, &qa, IBV_QP_STATE, &qia) || qa.qp_state != IBV_QPS_RTR ||
	    qa.dest_qp_num != me.send->qp_num || tq->state != IBV_QPS_RTR)
		return 8;
	strcpy(me.buf, "first");
	if (xpost(&me, IBV_WR_SEND, t.srqn, 0, 0) || !wc_ok(me.scq, 0x77) ||
	    write(up, "a", 1) != 1)
		return 9;
	/* The creator destroyed its handle: the QP lives while ours is open. */
	if (read(down, &go, 1) != 1 || ibv_query_qp(tq, &qa, IBV_QP_STATE, &qia) ||
	    qa.qp_state != IBV_QPS_RTR)
		return 10;
	strcpy(me.buf, "second");
	if (xpost(&me, IBV_WR_SEND, t.srqn, 0, 0) || !wc_ok(me.scq, 0x77) ||
	    write(up, "c", 1) != 1 || read(down, &go, 1) != 1)
		return 11;
	/* The last handle goes, and the QP with it. */
	if (ibv_destroy_qp(tq))
		return 12;
	oa.xrcd = x;
	errno = 0;
	if (ibv_open_qp(me.ctx, &oa) || errno != EINVAL)
		return 13;
	if (ibv_close_xrcd(x))
		return 14;
	close(fd);
	xside_close(&me);
	return 0;
}

static void test_open_qp_across_processes(void **state)
{
	(void)state;
	int up[2], down[2];
	char path[] = "/tmp/svxrcXXXXXX", c;
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down), 0);
	pid_t pid = fix_fork();
	assert_true(pid >= 0);
	if (!pid) {
		close(up[0]);
		close(down[1]);
		_exit(opener(up[1], down[0]));
	}
	close(up[1]);
	close(down[0]);
	/* The creator: a domain on the file, an XRC SRQ and a target QP
	 * left in RESET for the opener to configure. */
	struct xside me;
	xside_open(&me);
	struct ibv_xrcd *x = open_xrcd(me.ctx, fd, O_CREAT);
	assert_non_null(x);
	struct ibv_srq_init_attr_ex sa = {
		.attr = { .max_wr = 16, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
			     IBV_SRQ_INIT_ATTR_CQ,
		.srq_type = IBV_SRQT_XRC, .pd = me.pd, .xrcd = x, .cq = me.rcq,
	};
	struct ibv_srq *srq = ibv_create_srq_ex(me.ctx, &sa);
	assert_non_null(srq);
	struct ibv_qp_init_attr_ex ra = { .qp_type = IBV_QPT_XRC_RECV,
					  .comp_mask = IBV_QP_INIT_ATTR_XRCD, .xrcd = x };
	struct ibv_qp *tq = ibv_create_qp_ex(me.ctx, &ra);
	assert_non_null(tq);
	struct tgt_info t = { .qpn = tq->qp_num, .port = me.port, .gid = me.gid };
	assert_int_equal(ibv_get_srq_num(srq, &t.srqn), 0);
	snprintf(t.path, sizeof(t.path), "%s", path);
	for (int i = 0; i < 2; i++) {
		struct ibv_sge sge = { (uintptr_t)me.buf + 128 * i, 128, me.mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1 }, *bad;
		assert_int_equal(ibv_post_srq_recv(srq, &wr, &bad), 0);
	}
	assert_int_equal(write(down[1], &t, sizeof(t)), sizeof(t));
	/* A failed opener closes its pipe: its exit status names the step. */
	if (read(up[0], &c, 1) != 1)
		assert_child_ok(pid, "opener");
	struct ibv_wc wc = poll_one(me.rcq);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_string_equal(me.buf, "first");
	/* Destroying the creator's handle leaves the opener's. */
	assert_int_equal(ibv_destroy_qp(tq), 0);
	assert_int_equal(write(down[1], "b", 1), 1);
	if (read(up[0], &c, 1) != 1)
		assert_child_ok(pid, "opener");
	wc = poll_one(me.rcq);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_string_equal(me.buf + 128, "second");
	assert_int_equal(write(down[1], "d", 1), 1);
	assert_child_ok(pid, "opener");
	assert_int_equal(ibv_destroy_srq(srq), 0);
	assert_int_equal(ibv_close_xrcd(x), 0);
	xside_close(&me);
	close(fd);
	unlink(path);
}

int main(void)
{
	devs = ibv_get_device_list(NULL);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_xrc_send_and_write),
		cmocka_unit_test(test_xrc_errors),
		cmocka_unit_test_setup_teardown(test_xrc_objects, fix_setup, fix_teardown),
		cmocka_unit_test(test_open_qp_across_processes),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	ibv_free_device_list(devs);
	return r;
}
