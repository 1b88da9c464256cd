/* SPDX-License-Identifier: MIT */
/*
 * Tag matching (IBV_SRQT_TM): capabilities and creation rules, the list
 * operations and their completions, eager and rendezvous messages matched
 * and unexpected, phase synchronisation, and every error status: a stale
 * handle, a full list, a message longer than its tag buffer, a rendezvous
 * into a short buffer or from a bad rkey, and no buffer at all.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <infiniband/tm_types.h>
#include <stdio.h>

#include "helpers.h"
#include "pair.h"

#define NTAGS 8

/* A client end (pair.h) sends to a server whose RC QP receives through a
 * TM SRQ; every server completion lands in one extended CQ. */
struct tm_server {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq_ex *cq;
	struct ibv_srq *srq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	struct ibv_port_attr port;
	union ibv_gid gid;
};

struct tm_wc {
	uint64_t wr_id, tag;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	unsigned flags;
	uint32_t byte_len, priv;
};

static struct ibv_srq *tm_srq(struct tm_server *s, uint32_t tags, struct ibv_cq *cq)
{
	struct ibv_srq_init_attr_ex a = {
		.attr = { .max_wr = 16, .max_sge = 2 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ |
			     IBV_SRQ_INIT_ATTR_TM,
		.srq_type = IBV_SRQT_TM, .pd = s->pd, .cq = cq,
		.tm_cap = { .max_num_tags = tags, .max_ops = 16 },
	};
	return ibv_create_srq_ex(s->ctx, &a);
}

static void server_open(struct tm_server *s)
{
	memset(s, 0, sizeof(*s));
	s->ctx = ibv_open_device(devs[0]);
	assert_non_null(s->ctx);
	s->pd = ibv_alloc_pd(s->ctx);
	struct ibv_cq_init_attr_ex ca = { .cqe = 256, .wc_flags = IBV_WC_STANDARD_FLAGS |
					  IBV_WC_EX_WITH_TM_INFO };
	s->cq = ibv_create_cq_ex(s->ctx, &ca);
	assert_non_null(s->cq);
	s->buf = aligned_alloc(4096, BUF);
	memset(s->buf, 0, BUF);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUF, ALL_ACCESS);
	s->srq = tm_srq(s, NTAGS, ibv_cq_ex_to_cq(s->cq));
	assert_non_null(s->srq);
	struct ibv_qp_init_attr ia = { .send_cq = ibv_cq_ex_to_cq(s->cq),
				       .recv_cq = ibv_cq_ex_to_cq(s->cq), .srq = s->srq,
				       .qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 0 } };
	s->qp = ibv_create_qp(s->pd, &ia);
	assert_non_null(s->qp);
	assert_int_equal(ibv_query_port(s->ctx, 1, &s->port), 0);
	assert_int_equal(ibv_query_gid(s->ctx, 1, 0, &s->gid), 0);
}

static void server_close(struct tm_server *s)
{
	assert_int_equal(ibv_destroy_qp(s->qp), 0);
	assert_int_equal(ibv_destroy_srq(s->srq), 0);
	assert_int_equal(ibv_dereg_mr(s->mr), 0);
	assert_int_equal(ibv_destroy_cq(ibv_cq_ex_to_cq(s->cq)), 0);
	assert_int_equal(ibv_dealloc_pd(s->pd), 0);
	assert_int_equal(ibv_close_device(s->ctx), 0);
	free(s->buf);
}

static void tm_pair(struct end *c, struct tm_server *s, uint8_t rnr_retry)
{
	struct qp_opts o = rc_default;
	struct end as_peer = { 0 };

	o.rnr_retry = rnr_retry;
	server_open(s);
	end_open(c, &o);
	as_peer.port = s->port;
	as_peer.gid = s->gid;
	connect_qp(c->qp, &as_peer, s->qp->qp_num, &o);
	connect_qp(s->qp, c, c->qp->qp_num, &o);
}

static struct tm_wc tm_poll(struct ibv_cq_ex *cq)
{
	struct ibv_poll_cq_attr pa = { 0 };
	struct tm_wc w = { 0 };
	struct timespec t0, t;
	int ret;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while ((ret = ibv_start_poll(cq, &pa)) == ENOENT) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10)
			fail_msg("no TM completion in 10 s");
	}
	assert_int_equal(ret, 0);
	struct ibv_wc_tm_info tm;
	w.wr_id = cq->wr_id;
	w.status = cq->status;
	w.opcode = ibv_wc_read_opcode(cq);
	w.flags = ibv_wc_read_wc_flags(cq);
	w.byte_len = ibv_wc_read_byte_len(cq);
	ibv_wc_read_tm_info(cq, &tm);
	w.tag = tm.tag;
	w.priv = tm.priv;
	ibv_end_poll(cq);
	return w;
}

static void assert_tm_empty(struct ibv_cq_ex *cq)
{
	struct ibv_poll_cq_attr pa = { 0 };

	usleep(2000);
	assert_int_equal(ibv_start_poll(cq, &pa), ENOENT);
}

/* ADD, signaled; returns the handle after checking its completion. */
static uint32_t tag_add(struct tm_server *s, uint64_t tag, uint64_t mask, uint32_t off,
			uint32_t len, uint64_t recv_wr_id, uint32_t unexp, unsigned want_flags)
{
	struct ibv_sge sge = { (uintptr_t)s->buf + off, len, s->mr->lkey };
	struct ibv_ops_wr op = { .wr_id = 0xadd, .opcode = IBV_WR_TAG_ADD, .flags = IBV_OPS_SIGNALED,
				 .tm = { .unexpected_cnt = unexp, .add = { .recv_wr_id = recv_wr_id,
				 .sg_list = &sge, .num_sge = 1, .tag = tag, .mask = mask } } }, *bad;

	assert_int_equal(ibv_post_srq_ops(s->srq, &op, &bad), 0);
	struct tm_wc w = tm_poll(s->cq);
	assert_int_equal(w.status, IBV_WC_SUCCESS);
	assert_int_equal(w.opcode, IBV_WC_TM_ADD);
	assert_int_equal(w.wr_id, 0xadd);
	assert_int_equal(w.flags & IBV_WC_TM_SYNC_REQ, want_flags);
	return op.tm.handle;
}

static struct tm_wc tag_op(struct tm_server *s, enum ibv_ops_wr_opcode opcode, uint32_t handle,
			   uint32_t unexp)
{
	struct ibv_ops_wr op = { .wr_id = 0x0b, .opcode = opcode,
				 .flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC,
				 .tm = { .unexpected_cnt = unexp, .handle = handle } }, *bad;

	assert_int_equal(ibv_post_srq_ops(s->srq, &op, &bad), 0);
	return tm_poll(s->cq);
}

static void srq_recv(struct tm_server *s, uint32_t off, uint32_t len, uint64_t wr_id)
{
	struct ibv_sge sge = { (uintptr_t)s->buf + off, len, s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;

	assert_int_equal(ibv_post_srq_recv(s->srq, &wr, &bad), 0);
}

/* A TM message in the client's buffer at offset 0: header, then payload. */
static uint32_t tm_msg(struct end *c, uint8_t op, uint64_t tag, uint32_t app, const char *payload)
{
	struct ibv_tmh h = { .opcode = op, .app_ctx = htobe32(app), .tag = htobe64(tag) };

	memcpy(c->buf, &h, sizeof(h));
	strcpy(c->buf + sizeof(h), payload);
	return (uint32_t)(sizeof(h) + strlen(payload) + 1);
}

static void send_ok(struct end *c, uint32_t len)
{
	assert_int_equal(post(c, IBV_WR_SEND, c->buf, len, c->mr->lkey, 0, 0, 0x5e, IBV_SEND_SIGNALED), 0);
	struct ibv_wc wc = poll_one(c->cq);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.opcode, IBV_WC_SEND);
}

static void test_caps_and_rules(void **state)
{
	struct fix *f = *state;
	struct ibv_device_attr_ex ax;

	assert_int_equal(ibv_query_device_ex(f->ctx, NULL, &ax), 0);
	assert_true(ax.tm_caps.flags & IBV_TM_CAP_RC);
	assert_true(ax.tm_caps.max_num_tags >= NTAGS);
	assert_true(ax.tm_caps.max_rndv_hdr_size >= sizeof(struct ibv_tmh) + sizeof(struct ibv_rvh));
	assert_true(ax.tm_caps.max_sge >= 1);

	struct tm_server s = { .ctx = f->ctx, .pd = f->pd };
	static const struct {
		const char *what;
		uint32_t tags, comp_mask_off;
	} bad[] = {
		{ "no CQ", NTAGS, IBV_SRQ_INIT_ATTR_CQ },
		{ "no tm_cap", NTAGS, IBV_SRQ_INIT_ATTR_TM },
		{ "zero tags", 0, 0 },
		{ "more tags than max_num_tags", 100000, 0 },
	};
	for (size_t i = 0; i < SV_ARRAY_LEN(bad); i++) {
		struct ibv_srq_init_attr_ex a = {
			.attr = { .max_wr = 4, .max_sge = 1 },
			.comp_mask = (IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
				      IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM) & ~bad[i].comp_mask_off,
			.srq_type = IBV_SRQT_TM, .pd = f->pd, .cq = f->cq,
			.tm_cap = { .max_num_tags = bad[i].tags, .max_ops = 4 },
		};
		errno = 0;
		if (ibv_create_srq_ex(f->ctx, &a))
			fail_msg("%s: created", bad[i].what);
		assert_int_equal(errno, EINVAL);
	}
	/* Tag matching is RC only. */
	s.srq = tm_srq(&s, NTAGS, f->cq);
	assert_non_null(s.srq);
	struct ibv_qp_init_attr ia = { .send_cq = f->cq, .recv_cq = f->cq, .srq = s.srq,
				       .qp_type = IBV_QPT_UC, .cap = { 1, 0, 1, 0, 0 } };
	errno = 0;
	assert_null(ibv_create_qp(f->pd, &ia));
	assert_int_equal(errno, EINVAL);
	/* List operations need a TM SRQ, a known opcode and a valid handle. */
	struct ibv_srq_init_attr basic_a = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *basic = ibv_create_srq(f->pd, &basic_a);
	struct ibv_ops_wr op = { .opcode = IBV_WR_TAG_SYNC }, *badop = NULL;
	assert_int_equal(ibv_post_srq_ops(basic, &op, &badop), EINVAL);
	assert_ptr_equal(badop, &op);
	op.opcode = IBV_WR_TAG_DEL;
	op.tm.handle = NTAGS;
	assert_int_equal(ibv_post_srq_ops(s.srq, &op, &badop), EINVAL);
	op.opcode = (enum ibv_ops_wr_opcode)7;
	assert_int_equal(ibv_post_srq_ops(s.srq, &op, &badop), EINVAL);
	/* max_num_tags is the list's size: one more ADD is ENOMEM. */
	struct ibv_sge sge = { 0, 0, 0 };
	struct ibv_ops_wr add = { .opcode = IBV_WR_TAG_ADD, .tm.add = { .sg_list = &sge } };
	for (int i = 0; i < NTAGS; i++)
		assert_int_equal(ibv_post_srq_ops(s.srq, &add, &badop), 0);
	badop = NULL;
	assert_int_equal(ibv_post_srq_ops(s.srq, &add, &badop), ENOMEM);
	assert_ptr_equal(badop, &add);
	assert_int_equal(ibv_destroy_srq(basic), 0);
	assert_int_equal(ibv_destroy_srq(s.srq), 0);
}

static void test_eager_match_order_and_mask(void **state)
{
	struct end c;
	struct tm_server s;

	(void)state;
	tm_pair(&c, &s, 7);
	/* Two tags match 0x1234 under their masks; the earlier one wins. */
	tag_add(&s, 0x9999, ~0ull, 0, 256, 1, 0, 0);
	tag_add(&s, 0x1200, 0xff00, 256, 256, 2, 0, 0);
	tag_add(&s, 0x0034, 0x00ff, 512, 256, 3, 0, 0);
	uint32_t len = tm_msg(&c, IBV_TMH_EAGER, 0x1234, 0xabcd, "eager payload");
	send_ok(&c, len);
	struct tm_wc w = tm_poll(s.cq);
	assert_int_equal(w.status, IBV_WC_SUCCESS);
	assert_int_equal(w.opcode, IBV_WC_TM_RECV);
	assert_int_equal(w.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID),
			 IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID);
	assert_int_equal(w.wr_id, 2);
	assert_int_equal(w.tag, 0x1234);
	assert_int_equal(w.priv, 0xabcd);
	/* The header is skipped: the payload starts the buffer. */
	assert_int_equal(w.byte_len, len - sizeof(struct ibv_tmh));
	assert_string_equal(s.buf + 256, "eager payload");
	/* The same tag again now takes the next match. */
	send_ok(&c, len);
	w = tm_poll(s.cq);
	assert_int_equal(w.wr_id, 3);
	assert_string_equal(s.buf + 512, "eager payload");
	assert_tm_empty(s.cq);
	end_close(&c);
	server_close(&s);
}

static void test_unexpected_and_sync(void **state)
{
	struct end c;
	struct tm_server s;

	(void)state;
	tm_pair(&c, &s, 7);
	srq_recv(&s, 4096, 256, 0x51);
	srq_recv(&s, 8192, 256, 0x52);
	srq_recv(&s, 12288, 256, 0x53);
	/* No tag posted: unexpected, delivered whole, headers included. */
	uint32_t len = tm_msg(&c, IBV_TMH_EAGER, 0x77, 1, "early");
	send_ok(&c, len);
	struct tm_wc w = tm_poll(s.cq);
	assert_int_equal(w.status, IBV_WC_SUCCESS);
	assert_int_equal(w.opcode, IBV_WC_TM_RECV);
	assert_int_equal(w.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), 0);
	assert_int_equal(w.wr_id, 0x51);
	assert_int_equal(w.byte_len, len);
	assert_memory_equal(s.buf + 4096, c.buf, len);
	/* A tag added before software saw that message (count 0 of 1) must
	 * not match yet: its completion asks for a sync, and the next
	 * message with its tag is unexpected too. */
	tag_add(&s, 0x77, ~0ull, 0, 256, 7, 0, IBV_WC_TM_SYNC_REQ);
	send_ok(&c, len);
	w = tm_poll(s.cq);
	assert_int_equal(w.wr_id, 0x52);
	assert_int_equal(w.flags & IBV_WC_TM_MATCH, 0);
	/* A sync reporting both enables it. */
	w = tag_op(&s, IBV_WR_TAG_SYNC, 0, 2);
	assert_int_equal(w.status, IBV_WC_SUCCESS);
	assert_int_equal(w.opcode, IBV_WC_TM_SYNC);
	assert_int_equal(w.flags & IBV_WC_TM_SYNC_REQ, 0);
	send_ok(&c, len);
	w = tm_poll(s.cq);
	assert_int_equal(w.wr_id, 7);
	assert_true(w.flags & IBV_WC_TM_MATCH);
	/* NO_TAG is unexpected by definition, but not counted: a tag added
	 * with count 2 is active at once. */
	len = tm_msg(&c, IBV_TMH_NO_TAG, 0x77, 0, "untagged");
	send_ok(&c, len);
	w = tm_poll(s.cq);
	assert_int_equal(w.opcode, IBV_WC_TM_NO_TAG);
	assert_int_equal(w.wr_id, 0x53);
	assert_int_equal(w.tag, 0);
	assert_memory_equal(s.buf + 12288, c.buf, len);
	tag_add(&s, 0x78, ~0ull, 0, 256, 8, 2, 0);
	/* A message too short to hold a TMH is an ordinary receive. */
	srq_recv(&s, 4096, 256, 0x54);
	assert_int_equal(post(&c, IBV_WR_SEND, c.buf, 4, c.mr->lkey, 0, 0, 0, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(c.cq).status, IBV_WC_SUCCESS);
	w = tm_poll(s.cq);
	assert_int_equal(w.opcode, IBV_WC_RECV);
	assert_int_equal(w.wr_id, 0x54);
	end_close(&c);
	server_close(&s);
}

static void test_del(void **state)
{
	struct end c;
	struct tm_server s;

	(void)state;
	tm_pair(&c, &s, 7);
	uint32_t h = tag_add(&s, 5, ~0ull, 0, 256, 5, 0, 0);
	struct tm_wc w = tag_op(&s, IBV_WR_TAG_DEL, h, 0);
	assert_int_equal(w.status, IBV_WC_SUCCESS);
	assert_int_equal(w.opcode, IBV_WC_TM_DEL);
	/* Deleted twice, or after the slot was reused: the stale handle fails
	 * in its completion (IBV_WC_TM_ERR), the new tag stays. */
	uint32_t h2 = tag_add(&s, 6, ~0ull, 0, 256, 6, 0, 0);
	assert_int_equal(h2 & 0xffff, h & 0xffff);
	assert_int_not_equal(h2, h);
	w = tag_op(&s, IBV_WR_TAG_DEL, h, 0);
	assert_int_equal(w.status, IBV_WC_TM_ERR);
	assert_int_equal(w.opcode, IBV_WC_TM_DEL);
	/* A tag consumed by a message cannot be deleted either. */
	send_ok(&c, tm_msg(&c, IBV_TMH_EAGER, 6, 0, "x"));
	assert_int_equal(tm_poll(s.cq).wr_id, 6);
	w = tag_op(&s, IBV_WR_TAG_DEL, h2, 0);
	assert_int_equal(w.status, IBV_WC_TM_ERR);
	/* An unsignaled DEL that succeeds leaves no completion. */
	uint32_t h3 = tag_add(&s, 9, ~0ull, 0, 256, 9, 0, 0);
	struct ibv_ops_wr op = { .opcode = IBV_WR_TAG_DEL, .tm.handle = h3 }, *bad;
	assert_int_equal(ibv_post_srq_ops(s.srq, &op, &bad), 0);
	assert_tm_empty(s.cq);
	end_close(&c);
	server_close(&s);
}

/* The client's rendezvous request at offset 0 naming `len` bytes of its
 * buffer at offset 1024 under rkey. */
static uint32_t rndv_msg(struct end *c, uint64_t tag, uint32_t rkey, uint32_t len)
{
	struct ibv_tmh h = { .opcode = IBV_TMH_RNDV, .app_ctx = htobe32(0x42), .tag = htobe64(tag) };
	struct ibv_rvh r = { .va = htobe64((uintptr_t)c->buf + 1024), .rkey = htobe32(rkey),
			     .len = htobe32(len) };

	memcpy(c->buf, &h, sizeof(h));
	memcpy(c->buf + sizeof(h), &r, sizeof(r));
	for (uint32_t i = 0; i < len; i++)
		c->buf[1024 + i] = (char)('a' + i % 26);
	return sizeof(h) + sizeof(r);
}

static void test_rndv(void **state)
{
	struct end c;
	struct tm_server s;

	(void)state;
	tm_pair(&c, &s, 7);
	post_recv(&c, c.buf + 32768, 64, 0xf1);
	tag_add(&s, 0x100, ~0ull, 0, 4096, 0x100, 0, 0);
	send_ok(&c, rndv_msg(&c, 0x100, c.mr->rkey, 3000));
	/* The match at once, the data once read, then the FIN, which the
	 * sender receives after its SEND's own completion. */
	struct tm_wc w = tm_poll(s.cq);
	assert_int_equal(w.opcode, IBV_WC_TM_RECV);
	assert_int_equal(w.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), IBV_WC_TM_MATCH);
	assert_int_equal(w.wr_id, 0x100);
	assert_int_equal(w.tag, 0x100);
	assert_int_equal(w.priv, 0x42);
	w = tm_poll(s.cq);
	assert_int_equal(w.status, IBV_WC_SUCCESS);
	assert_int_equal(w.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), IBV_WC_TM_DATA_VALID);
	assert_int_equal(w.wr_id, 0x100);
	assert_int_equal(w.byte_len, 3000);
	assert_memory_equal(s.buf, c.buf + 1024, 3000);
	struct ibv_wc fin = poll_one(c.cq);
	assert_int_equal(fin.status, IBV_WC_SUCCESS);
	assert_int_equal(fin.opcode, IBV_WC_RECV);
	assert_int_equal(fin.wr_id, 0xf1);
	assert_int_equal(fin.byte_len, 32);
	assert_int_equal(fin.src_qp, s.qp->qp_num);
	assert_int_equal((uint8_t)c.buf[32768], IBV_TMH_FIN);
	assert_memory_equal(c.buf + 32768 + 1, c.buf + 1, 31);

	/* No receive WQE for the FIN: it waits, as an RNR-retried message
	 * would, and lands when the sender posts one. */
	tag_add(&s, 0x103, ~0ull, 0, 4096, 0x103, 0, 0);
	send_ok(&c, rndv_msg(&c, 0x103, c.mr->rkey, 100));
	assert_true(tm_poll(s.cq).flags & IBV_WC_TM_MATCH);
	assert_int_equal(tm_poll(s.cq).status, IBV_WC_SUCCESS);
	assert_cq_empty(c.cq);
	post_recv(&c, c.buf + 32768, 64, 0xf2);
	fin = poll_one(c.cq);
	assert_int_equal(fin.wr_id, 0xf2);
	assert_int_equal(fin.byte_len, 32);

	/* A tag buffer smaller than the payload: the headers land there,
	 * with IBV_WC_TM_RNDV_INCOMPLETE, and software takes over. */
	tag_add(&s, 0x101, ~0ull, 8192, 100, 0x101, 0, 0);
	uint32_t len = rndv_msg(&c, 0x101, c.mr->rkey, 3000);
	send_ok(&c, len);
	assert_true(tm_poll(s.cq).flags & IBV_WC_TM_MATCH);
	w = tm_poll(s.cq);
	assert_int_equal(w.status, IBV_WC_TM_RNDV_INCOMPLETE);
	assert_int_equal(w.wr_id, 0x101);
	assert_memory_equal(s.buf + 8192, c.buf, len);

	/* The RVH's rkey is checked as an RDMA READ at the sender would be:
	 * a bad one fails the tag's transfer (remote access error) and
	 * takes both QPs to ERR, the sender's with an access error event;
	 * the request itself was delivered. */
	tag_add(&s, 0x102, ~0ull, 0, 4096, 0x102, 0, 0);
	send_ok(&c, rndv_msg(&c, 0x102, c.mr->rkey + 0x100, 3000));
	assert_true(tm_poll(s.cq).flags & IBV_WC_TM_MATCH);
	w = tm_poll(s.cq);
	assert_int_equal(w.status, IBV_WC_REM_ACCESS_ERR);
	assert_int_equal(w.wr_id, 0x102);
	assert_tm_empty(s.cq);
	assert_cq_empty(c.cq);
	assert_int_equal(qp_state(s.qp), IBV_QPS_ERR);
	assert_int_equal(qp_state(c.qp), IBV_QPS_ERR);
	struct ibv_async_event ev;
	assert_int_equal(ibv_get_async_event(c.ctx, &ev), 0);
	assert_int_equal(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
	assert_ptr_equal(ev.element.qp, c.qp);
	ibv_ack_async_event(&ev);
	end_close(&c);
	server_close(&s);
}

static void test_errors(void **state)
{
	struct end c;
	struct tm_server s;

	(void)state;
	/* Neither a matching tag nor an ordinary buffer: RNR NAKs, and with
	 * rnr_retry 0 the sender's error. */
	tm_pair(&c, &s, 0);
	tag_add(&s, 1, ~0ull, 0, 256, 1, 0, 0);
	uint32_t len = tm_msg(&c, IBV_TMH_EAGER, 2, 0, "nowhere to go");
	assert_int_equal(post(&c, IBV_WR_SEND, c.buf, len, c.mr->lkey, 0, 0, 0, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(c.cq).status, IBV_WC_RNR_RETRY_EXC_ERR);
	assert_tm_empty(s.cq);
	end_close(&c);
	server_close(&s);

	/* A matched eager message longer than its tag's buffer: a local
	 * length error on the tag, an Invalid Request NAK for the sender
	 * (C9-?? 9.7.4.1.7, as for any receive). */
	tm_pair(&c, &s, 7);
	tag_add(&s, 3, ~0ull, 0, 8, 3, 0, 0);
	len = tm_msg(&c, IBV_TMH_EAGER, 3, 0, "longer than eight bytes");
	assert_int_equal(post(&c, IBV_WR_SEND, c.buf, len, c.mr->lkey, 0, 0, 0, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(c.cq).status, IBV_WC_REM_INV_REQ_ERR);
	struct tm_wc w = tm_poll(s.cq);
	assert_int_equal(w.status, IBV_WC_LOC_LEN_ERR);
	assert_int_equal(w.wr_id, 3);
	end_close(&c);
	server_close(&s);
}

/* What the two processes tell each other through pipes. */
struct peer_info {
	uint32_t qpn;
	struct ibv_port_attr port;
	union ibv_gid gid;
};

/* The server of test_across_processes, in the child: returns the exit
 * status (0 when every completion and byte was as expected). */
static int child_server(int to_parent, int from_parent)
{
	struct tm_server s;
	struct peer_info me, client;
	struct qp_opts o = rc_default;
	char ok;

	server_open(&s);
	me = (struct peer_info){ s.qp->qp_num, s.port, s.gid };
	if (write(to_parent, &me, sizeof(me)) != sizeof(me) ||
	    read(from_parent, &client, sizeof(client)) != sizeof(client))
		return 2;
	struct end as_peer = { .port = client.port, .gid = client.gid };
	connect_qp(s.qp, &as_peer, client.qpn, &o);
	tag_add(&s, 0x10, ~0ull, 0, 4096, 0x10, 0, 0);
	tag_add(&s, 0x20, ~0ull, 8192, 4096, 0x20, 0, 0);
	srq_recv(&s, 16384, 256, 0x99);
	if (write(to_parent, "r", 1) != 1)
		return 3;
	/* Eager into tag 0x10, rendezvous into tag 0x20, then an
	 * unexpected message into the ordinary buffer. */
	struct tm_wc w = tm_poll(s.cq);
	if (w.status || w.wr_id != 0x10 || strcmp(s.buf, "across"))
		return 4;
	w = tm_poll(s.cq);
	if (w.status || w.wr_id != 0x20 || !(w.flags & IBV_WC_TM_MATCH))
		return 5;
	w = tm_poll(s.cq);
	if (w.status || w.wr_id != 0x20 || w.byte_len != 3000)
		return 6;
	for (int i = 0; i < 3000; i++)
		if (s.buf[8192 + i] != (char)('a' + i % 26))
			return 7;
	w = tm_poll(s.cq);
	if (w.status || w.wr_id != 0x99 || (w.flags & IBV_WC_TM_MATCH))
		return 8;
	if (read(from_parent, &ok, 1) != 1)
		return 9;
	server_close(&s);
	return 0;
}

static void test_across_processes(void **state)
{
	int up[2], down[2];
	struct peer_info srv;
	struct end c;
	char ready;

	(void)state;
	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down), 0);
	pid_t pid = fix_fork();
	assert_true(pid >= 0);
	if (!pid)
		_exit(child_server(up[1], down[0]));
	end_open(&c, &rc_default);
	assert_int_equal(read(up[0], &srv, sizeof(srv)), sizeof(srv));
	struct peer_info me = { c.qp->qp_num, c.port, c.gid };
	assert_int_equal(write(down[1], &me, sizeof(me)), sizeof(me));
	struct end as_peer = { .port = srv.port, .gid = srv.gid };
	connect_qp(c.qp, &as_peer, srv.qpn, &rc_default);
	post_recv(&c, c.buf + 32768, 64, 0xf1);
	assert_int_equal(read(up[0], &ready, 1), 1);
	send_ok(&c, tm_msg(&c, IBV_TMH_EAGER, 0x10, 1, "across"));
	send_ok(&c, rndv_msg(&c, 0x20, c.mr->rkey, 3000));
	struct ibv_wc fin = poll_one(c.cq);
	assert_int_equal(fin.status, IBV_WC_SUCCESS);
	assert_int_equal(fin.wr_id, 0xf1);
	assert_int_equal((uint8_t)c.buf[32768], IBV_TMH_FIN);
	send_ok(&c, tm_msg(&c, IBV_TMH_EAGER, 0x77, 1, "nobody's"));
	assert_int_equal(write(down[1], "d", 1), 1);
	assert_child_ok(pid, "server");
	end_close(&c);
}

int main(void)
{
	devs = ibv_get_device_list(NULL);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_caps_and_rules, fix_setup, fix_teardown),
		cmocka_unit_test(test_eager_match_order_and_mask),
		cmocka_unit_test(test_unexpected_and_sync),
		cmocka_unit_test(test_del),
		cmocka_unit_test(test_rndv),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_across_processes),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	ibv_free_device_list(devs);
	return r;
}
