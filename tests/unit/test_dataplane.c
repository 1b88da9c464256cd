/* SPDX-License-Identifier: MIT */
/*
 * Data-path semantics with their exact work-completion statuses, as the
 * IBA spec and rdma-core/rxe define them: remote and local access errors,
 * short receive buffers, misaligned atomics, RNR and transport retries,
 * flush on ERR, ordering, CQ overrun, SRQ limits, solicited events, and
 * one-sided operations landing in a process that sleeps meanwhile.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <signal.h>
#include <stdio.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "counters.h"
#include "nocma.h"
#include "helpers.h"
#include "pair.h"
#include "sv.h"

static enum ibv_event_type next_event(struct ibv_context *ctx, int ms)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;

	if (poll(&p, 1, ms) != 1)
		return (enum ibv_event_type)-1;
	assert_int_equal(ibv_get_async_event(ctx, &ev), 0);
	ibv_ack_async_event(&ev);
	return ev.event_type;
}

/* ---- remote access: every way an rkey can be wrong ---- */

enum rkey_case { RK_DEREGISTERED, RK_UNKNOWN, RK_OUT_OF_BOUNDS, RK_OTHER_PD, RK_NO_RIGHT,
		 RK_QP_NO_RIGHT };

static const struct {
	const char *what;
	enum rkey_case c;
	enum ibv_wr_opcode op;
} rkey_cases[] = {
	{ "WRITE to a deregistered rkey", RK_DEREGISTERED, IBV_WR_RDMA_WRITE },
	{ "READ from a deregistered rkey", RK_DEREGISTERED, IBV_WR_RDMA_READ },
	{ "ATOMIC on a deregistered rkey", RK_DEREGISTERED, IBV_WR_ATOMIC_FETCH_AND_ADD },
	{ "WRITE to an unknown rkey", RK_UNKNOWN, IBV_WR_RDMA_WRITE },
	{ "WRITE past the MR's end", RK_OUT_OF_BOUNDS, IBV_WR_RDMA_WRITE },
	{ "READ past the MR's end", RK_OUT_OF_BOUNDS, IBV_WR_RDMA_READ },
	{ "WRITE to an MR of another PD", RK_OTHER_PD, IBV_WR_RDMA_WRITE },
	{ "WRITE to an MR without REMOTE_WRITE", RK_NO_RIGHT, IBV_WR_RDMA_WRITE },
	{ "READ from an MR without REMOTE_READ", RK_NO_RIGHT, IBV_WR_RDMA_READ },
	{ "ATOMIC on an MR without REMOTE_ATOMIC", RK_NO_RIGHT, IBV_WR_ATOMIC_CMP_AND_SWP },
	{ "WRITE to a QP without remote write access", RK_QP_NO_RIGHT, IBV_WR_RDMA_WRITE },
};

static void test_remote_access_errors(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(rkey_cases) / sizeof(rkey_cases[0]); i++) {
		struct end a, b;
		struct qp_opts o = rc_default;
		struct ibv_pd *pd2 = NULL;
		struct ibv_mr *mr = NULL;
		uint32_t rkey;
		uint64_t raddr;

		if (rkey_cases[i].c == RK_QP_NO_RIGHT)
			o.access = IBV_ACCESS_REMOTE_READ;
		pair_up(&a, &b, &o);
		raddr = (uintptr_t)b.buf;
		rkey = b.mr->rkey;
		switch (rkey_cases[i].c) {
		case RK_DEREGISTERED:
			mr = ibv_reg_mr(b.pd, b.buf, 4096, ALL_ACCESS);
			rkey = mr->rkey;
			assert_int_equal(ibv_dereg_mr(mr), 0);
			break;
		case RK_UNKNOWN:
			rkey = 0x7fff00 | (rkey & 0xff);
			break;
		case RK_OUT_OF_BOUNDS:
			raddr = (uintptr_t)b.buf + BUF - 4;
			break;
		case RK_OTHER_PD:
			pd2 = ibv_alloc_pd(b.ctx);
			mr = ibv_reg_mr(pd2, b.buf, 4096, ALL_ACCESS);
			rkey = mr->rkey;
			break;
		case RK_NO_RIGHT:
			mr = ibv_reg_mr(b.pd, b.buf, 4096, IBV_ACCESS_LOCAL_WRITE);
			rkey = mr->rkey;
			break;
		case RK_QP_NO_RIGHT:
			break;
		}
		uint32_t len = rkey_cases[i].op == IBV_WR_RDMA_WRITE || rkey_cases[i].op == IBV_WR_RDMA_READ ? 64 : 8;
		assert_int_equal(post(&a, rkey_cases[i].op, a.buf, len, a.mr->lkey, raddr, rkey, 7,
				      IBV_SEND_SIGNALED), 0);
		struct ibv_wc wc = poll_one(a.cq);
		if (wc.status != IBV_WC_REM_ACCESS_ERR)
			fail_msg("%s: status %s", rkey_cases[i].what, ibv_wc_status_str(wc.status));
		assert_int_equal(wc.wr_id, 7);
		/* The requester's QP goes to ERR; the responder's too, with
		 * a local access violation event (IBA 11.6.3.1). */
		assert_int_equal(qp_state(a.qp), IBV_QPS_ERR);
		assert_int_equal(next_event(b.ctx, 1000), IBV_EVENT_QP_ACCESS_ERR);
		assert_int_equal(qp_state(b.qp), IBV_QPS_ERR);
		/* And nothing was written. */
		for (int j = 0; j < BUF; j++)
			if (b.buf[j])
				fail_msg("%s: byte %d was written", rkey_cases[i].what, j);
		if (mr && rkey_cases[i].c != RK_DEREGISTERED)
			ibv_dereg_mr(mr);
		if (pd2)
			ibv_dealloc_pd(pd2);
		end_close(&a);
		end_close(&b);
	}
}

static void test_bad_lkey_is_loc_prot_err(void **state)
{
	(void)state;
	struct end a, b;

	pair_up(&a, &b, &rc_default);
	post_recv(&b, b.buf, 64, 1);
	assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 64, a.mr->lkey ^ 0x100, 0, 0, 3,
			      IBV_SEND_SIGNALED), 0);
	struct ibv_wc wc = poll_one(a.cq);
	assert_int_equal(wc.status, IBV_WC_LOC_PROT_ERR);
	assert_int_equal(qp_state(a.qp), IBV_QPS_ERR);
	end_close(&a);
	end_close(&b);

	/* The WRs behind a failed one are flushed, and never reach the
	 * peer: a WRITE reported flushed must not have landed, nor a SEND
	 * have taken a receive. */
	pair_up(&a, &b, &rc_default);
	post_recv(&b, b.buf, 64, 1);
	memset(b.buf + 256, 0x11, 64);
	memset(a.buf, 0x77, 64);
	struct ibv_sge bad_sge = { (uintptr_t)a.buf, 64, a.mr->lkey ^ 0x100 };
	struct ibv_sge sge = { (uintptr_t)a.buf, 64, a.mr->lkey };
	struct ibv_send_wr send = { .wr_id = 6, .sg_list = &sge, .num_sge = 1,
				    .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr write = { .wr_id = 5, .next = &send, .sg_list = &sge, .num_sge = 1,
				     .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr first = { .wr_id = 4, .next = &write, .sg_list = &bad_sge, .num_sge = 1,
				     .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *badwr;
	write.wr.rdma.remote_addr = (uintptr_t)b.buf + 256;
	write.wr.rdma.rkey = b.mr->rkey;
	assert_int_equal(ibv_post_send(a.qp, &first, &badwr), 0);
	wc = poll_one(a.cq);
	assert_int_equal(wc.wr_id, 4);
	assert_int_equal(wc.status, IBV_WC_LOC_PROT_ERR);
	for (uint64_t id = 5; id <= 6; id++) {
		wc = poll_one(a.cq);
		assert_int_equal(wc.wr_id, id);
		assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
	}
	usleep(50000);		/* what a wrongly sent packet would take to land */
	for (int i = 0; i < 64; i++)
		assert_int_equal((unsigned char)b.buf[256 + i], 0x11);
	assert_cq_empty(b.cq);
	end_close(&a);
	end_close(&b);
}

static void test_short_receive_buffer(void **state)
{
	(void)state;
	struct end a, b;

	pair_up(&a, &b, &rc_default);
	post_recv(&b, b.buf, 16, 11);
	assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 64, a.mr->lkey, 0, 0, 12, IBV_SEND_SIGNALED), 0);
	/* IBA 9.7.4.1.7: local length error at the responder, invalid
	 * request NAK at the requester. */
	struct ibv_wc wc = poll_one(a.cq);
	assert_int_equal(wc.status, IBV_WC_REM_INV_REQ_ERR);
	wc = poll_one(b.cq);
	assert_int_equal(wc.status, IBV_WC_LOC_LEN_ERR);
	assert_int_equal(wc.wr_id, 11);
	assert_int_equal(qp_state(b.qp), IBV_QPS_ERR);
	end_close(&a);
	end_close(&b);
}

static void test_misaligned_atomic(void **state)
{
	(void)state;
	struct end a, b;

	pair_up(&a, &b, &rc_default);
	assert_int_equal(post(&a, IBV_WR_ATOMIC_FETCH_AND_ADD, a.buf, 8, a.mr->lkey,
			      (uintptr_t)b.buf + 4, b.mr->rkey, 1, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_REM_INV_REQ_ERR);
	assert_int_equal(next_event(b.ctx, 1000), IBV_EVENT_QP_REQ_ERR);
	end_close(&a);
	end_close(&b);
}

static void test_atomics_and_read(void **state)
{
	(void)state;
	struct end a, b;
	uint64_t *target, *res;

	pair_up(&a, &b, &rc_default);
	target = (uint64_t *)b.buf;
	res = (uint64_t *)a.buf;
	*target = 41;
	assert_int_equal(post(&a, IBV_WR_ATOMIC_FETCH_AND_ADD, res, 8, a.mr->lkey,
			      (uintptr_t)target, b.mr->rkey, 1, IBV_SEND_SIGNALED), 0);
	struct ibv_wc wc = poll_one(a.cq);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.opcode, IBV_WC_FETCH_ADD);
	assert_int_equal(*res, 41);
	assert_int_equal(*target, 42);
	/* compare_add is 1 (post()); 42 != 1, so no swap, old value back. */
	assert_int_equal(post(&a, IBV_WR_ATOMIC_CMP_AND_SWP, res, 8, a.mr->lkey,
			      (uintptr_t)target, b.mr->rkey, 2, IBV_SEND_SIGNALED), 0);
	wc = poll_one(a.cq);
	assert_int_equal(wc.opcode, IBV_WC_COMP_SWAP);
	assert_int_equal(*res, 42);
	assert_int_equal(*target, 42);
	memcpy(b.buf + 100, "remote bytes", 12);
	assert_int_equal(post(&a, IBV_WR_RDMA_READ, a.buf + 200, 12, a.mr->lkey,
			      (uintptr_t)b.buf + 100, b.mr->rkey, 3, IBV_SEND_SIGNALED), 0);
	wc = poll_one(a.cq);
	assert_int_equal(wc.opcode, IBV_WC_RDMA_READ);
	assert_memory_equal(a.buf + 200, "remote bytes", 12);
	end_close(&a);
	end_close(&b);
}

/*
 * A READ's response acknowledges the requests before it and nothing
 * after it (engine/pkt_req.c, read_response).  Over packets a long WRITE
 * posted behind a short READ is still going out, window by window, when
 * the READ's answer arrives; taking that answer for an acknowledgement of
 * everything posted completed the WRITE with half its packets never sent.
 * The WRITE must complete only with every byte at the target.
 */
#define LONG_WRITE (1u << 20)

static void test_read_then_long_write(void **state)
{
	(void)state;
	struct end a, b;

	pair_up(&a, &b, &rc_default);
	char *src = aligned_alloc(4096, LONG_WRITE), *dst = aligned_alloc(4096, LONG_WRITE);
	assert_non_null(src);
	assert_non_null(dst);
	for (size_t i = 0; i < LONG_WRITE; i++)
		src[i] = (char)(i * 7 + 1);
	memset(dst, 0, LONG_WRITE);
	struct ibv_mr *smr = ibv_reg_mr(a.pd, src, LONG_WRITE, ALL_ACCESS);
	struct ibv_mr *dmr = ibv_reg_mr(b.pd, dst, LONG_WRITE, ALL_ACCESS);
	assert_non_null(smr);
	assert_non_null(dmr);
	memcpy(b.buf, "readable", 8);
	for (int round = 0; round < 2; round++) {
		assert_int_equal(post(&a, IBV_WR_RDMA_READ, a.buf + 64, 8, a.mr->lkey,
				      (uintptr_t)b.buf, b.mr->rkey, 1, IBV_SEND_SIGNALED), 0);
		assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, src, LONG_WRITE, smr->lkey,
				      (uintptr_t)dst, dmr->rkey, 2, IBV_SEND_SIGNALED), 0);
		for (uint64_t id = 1; id <= 2; id++) {
			struct ibv_wc wc = poll_one(a.cq);
			assert_int_equal(wc.status, IBV_WC_SUCCESS);
			assert_int_equal(wc.wr_id, id);
		}
		assert_memory_equal(a.buf + 64, "readable", 8);
		size_t bad = 0;
		for (size_t i = 0; i < LONG_WRITE; i++)
			bad += dst[i] != src[i];
		if (bad)
			fail_msg("round %d: the WRITE completed with %zu of %u bytes not at the target",
				 round, bad, LONG_WRITE);
		memset(dst, 0, LONG_WRITE);
	}
	assert_int_equal(ibv_dereg_mr(smr), 0);
	assert_int_equal(ibv_dereg_mr(dmr), 0);
	free(src);
	free(dst);
	end_close(&a);
	end_close(&b);
}

/* ---- SEND vs WRITE: RNR ---- */

static void test_rnr_retry_exhausted(void **state)
{
	(void)state;
	struct end a, b;
	struct qp_opts o = rc_default;
	struct timespec t0, t1;

	o.rnr_retry = 2;
	o.min_rnr_timer = 14;	/* 0.96 ms per retry (IBA Table 45) */
	pair_up(&a, &b, &o);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 8, a.mr->lkey, 0, 0, 5, IBV_SEND_SIGNALED), 0);
	struct ibv_wc wc = poll_one(a.cq);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
	assert_int_equal(wc.status, IBV_WC_RNR_RETRY_EXC_ERR);
	/* Two retries, each after the responder's 0.96 ms timer. */
	if (ms < 1.9)
		fail_msg("RNR retries took %.2f ms, less than 2 x 0.96 ms", ms);
	/* WRITE needs no receive: it succeeds on a fresh pair at once. */
	end_close(&a);
	end_close(&b);
	pair_up(&a, &b, &o);
	assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, a.buf, 8, a.mr->lkey, (uintptr_t)b.buf,
			      b.mr->rkey, 6, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_SUCCESS);
	end_close(&a);
	end_close(&b);
}

static void test_rnr_infinite_then_recv(void **state)
{
	(void)state;
	struct end a, b;

	pair_up(&a, &b, &rc_default);	/* rnr_retry 7: forever */
	strcpy(a.buf, "late receiver");
	assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 14, a.mr->lkey, 0, 0, 9, IBV_SEND_SIGNALED), 0);
	usleep(20000);
	struct ibv_wc wc;
	assert_int_equal(ibv_poll_cq(a.cq, 1, &wc), 0);	/* still retrying */
	post_recv(&b, b.buf, 64, 10);
	wc = poll_one(a.cq);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	wc = poll_one(b.cq);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.opcode, IBV_WC_RECV);
	assert_int_equal(wc.byte_len, 14);
	assert_string_equal(b.buf, "late receiver");
	end_close(&a);
	end_close(&b);
}

static void test_peer_gone_retry_exceeded(void **state)
{
	(void)state;
	struct end a, b;
	struct qp_opts o = rc_default;

	o.timeout = 4;		/* 65.5 us */
	o.retry_cnt = 3;
	pair_up(&a, &b, &o);
	end_close(&b);		/* the peer disappears */
	assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, a.buf, 8, a.mr->lkey, 0x1000, 0x100, 4,
			      IBV_SEND_SIGNALED), 0);
	struct ibv_wc wc = poll_one(a.cq);
	assert_int_equal(wc.status, IBV_WC_RETRY_EXC_ERR);
	end_close(&a);
}

/* ---- ERR: flush, unsignaled included ---- */

static void test_flush_on_err(void **state)
{
	(void)state;
	struct end a, b;
	struct qp_opts o = rc_default;

	o.timeout = 20;		/* 4.3 s: the first WQE waits on a peer that never answers */
	pair_up(&a, &b, &o);
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_ERR };
	assert_int_equal(ibv_modify_qp(b.qp, &m, IBV_QP_STATE), 0);
	assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 8, a.mr->lkey, 0, 0, 1, 0), 0);
	assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, a.buf, 8, a.mr->lkey, (uintptr_t)b.buf,
			      b.mr->rkey, 2, 0), 0);
	assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 8, a.mr->lkey, 0, 0, 3, IBV_SEND_SIGNALED), 0);
	post_recv(&a, a.buf, 8, 100);
	post_recv(&a, a.buf, 8, 101);
	assert_cq_empty(a.cq);
	assert_int_equal(ibv_modify_qp(a.qp, &m, IBV_QP_STATE), 0);
	/* Every outstanding WR, unsignaled ones included, in order. */
	uint64_t seen[5];
	for (int i = 0; i < 5; i++) {
		struct ibv_wc wc = poll_one(a.cq);
		assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
		seen[i] = wc.wr_id;
	}
	assert_cq_empty(a.cq);
	uint64_t want[] = { 1, 2, 3, 100, 101 };
	for (int i = 0; i < 5; i++) {
		bool found = false;
		for (int j = 0; j < 5; j++)
			found |= seen[j] == want[i];
		assert_true(found);
	}
	/* Posting to a QP in ERR: flushed right away. */
	assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 8, a.mr->lkey, 0, 0, 7, 0), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_WR_FLUSH_ERR);
	end_close(&a);
	end_close(&b);
}

/* Two 8 MiB buffers for one message: src registered at a (filled with
 * a byte per page), dst at b (zeroed, remote write allowed). */
struct big {
	char *src, *dst;
	struct ibv_mr *ms, *md;
};
#define BIG_SZ (8u << 20)

static void big_up(struct big *g, struct end *a, struct end *b)
{
	g->src = aligned_alloc(4096, BIG_SZ);
	g->dst = aligned_alloc(4096, BIG_SZ);
	assert_non_null(g->src);
	assert_non_null(g->dst);
	for (uint32_t i = 0; i < BIG_SZ; i += 4096)
		memset(g->src + i, (int)(i >> 12) | 1, 4096);
	memset(g->dst, 0, BIG_SZ);
	g->ms = ibv_reg_mr(a->pd, g->src, BIG_SZ, IBV_ACCESS_LOCAL_WRITE);
	g->md = ibv_reg_mr(b->pd, g->dst, BIG_SZ, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	assert_non_null(g->ms);
	assert_non_null(g->md);
}

static void big_down(struct big *g)
{
	ibv_dereg_mr(g->ms);
	ibv_dereg_mr(g->md);
	free(g->src);
	free(g->dst);
}

/* A QP that enters ERR with a message under way: the receive WQE the
 * message took completes flushed, as the queued ones do (IBA 10.3.1.7).
 * The sender stops in its first window (its QP to ERR), so over packets
 * the receiver holds part of the message; over shm the SEND completes
 * whole in the post. */
static void test_err_mid_message(void **state)
{
	(void)state;
	struct end a, b;
	struct big g;
	const char *tr = getenv("SOFTVERBS_TRANSPORT");
	bool packets = tr && !strcmp(tr, "udp");

	pair_up(&a, &b, &rc_default);
	big_up(&g, &a, &b);
	struct ibv_sge rs = { (uintptr_t)g.dst, BIG_SZ, g.md->lkey };
	struct ibv_recv_wr rw = { .wr_id = 77, .sg_list = &rs, .num_sge = 1 }, *badr;
	assert_int_equal(ibv_post_recv(b.qp, &rw, &badr), 0);
	assert_int_equal(post(&a, IBV_WR_SEND, g.src, BIG_SZ, g.ms->lkey, 0, 0, 1, IBV_SEND_SIGNALED),
			 0);
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_ERR };
	assert_int_equal(ibv_modify_qp(a.qp, &m, IBV_QP_STATE), 0);
	if (packets) {
		/* The first window arrives (its first packet takes the WQE),
		 * however slow the machine. */
		const _Atomic uint64_t *rx = &sv_qp(b.qp)->sh->pkt.rx_pkts;
		for (int i = 0; i < 5000 && !atomic_load(rx); i++)
			usleep(1000);
		assert_true(atomic_load(rx) > 0);
		usleep(20000);
	}
	assert_int_equal(ibv_modify_qp(b.qp, &m, IBV_QP_STATE), 0);
	struct ibv_wc wc = poll_one(b.cq);
	assert_int_equal(wc.wr_id, 77);
	if (packets)
		assert_int_equal(wc.status, IBV_WC_WR_FLUSH_ERR);
	else
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_cq_empty(b.cq);
	big_down(&g);
	end_close(&a);
	end_close(&b);
}

/* SQD with a long WRITE under way (IBA 10.3.1): the WRITE finishes,
 * retransmissions and all, SQ_DRAINED comes once it has, and a WR posted
 * in SQD waits for RTS.  Over shm the WRITE is complete in its post. */
static void test_sqd_finishes_the_message(void **state)
{
	(void)state;
	struct end a, b;
	struct big g;

	pair_up(&a, &b, &rc_default);
	big_up(&g, &a, &b);
	int fl = fcntl(a.ctx->async_fd, F_GETFL);
	assert_int_equal(fcntl(a.ctx->async_fd, F_SETFL, fl | O_NONBLOCK), 0);
	assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, g.src, BIG_SZ, g.ms->lkey, (uintptr_t)g.dst,
			      g.md->rkey, 1, IBV_SEND_SIGNALED), 0);
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 1 };
	assert_int_equal(ibv_modify_qp(a.qp, &m, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
	assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, g.src, 8, g.ms->lkey, (uintptr_t)g.dst,
			      g.md->rkey, 2, IBV_SEND_SIGNALED), 0);
	struct ibv_wc wc = poll_one(a.cq);
	assert_int_equal(wc.wr_id, 1);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(memcmp(g.src, g.dst, BIG_SZ), 0);
	struct ibv_async_event ev;
	struct pollfd p = { a.ctx->async_fd, POLLIN, 0 };
	assert_int_equal(poll(&p, 1, 5000), 1);
	assert_int_equal(ibv_get_async_event(a.ctx, &ev), 0);
	assert_int_equal(ev.event_type, IBV_EVENT_SQ_DRAINED);
	assert_ptr_equal(ev.element.qp, a.qp);
	ibv_ack_async_event(&ev);
	usleep(20000);
	assert_cq_empty(a.cq);	/* WR 2 waits for RTS */
	m.qp_state = IBV_QPS_RTS;
	assert_int_equal(ibv_modify_qp(a.qp, &m, IBV_QP_STATE), 0);
	wc = poll_one(a.cq);
	assert_int_equal(wc.wr_id, 2);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	big_down(&g);
	end_close(&a);
	end_close(&b);
}

/* ---- completion order, exactly once; signaling ---- */

static void test_order_and_signaling(void **state)
{
	(void)state;
	struct end a, b;

	pair_up(&a, &b, &rc_default);
	for (int i = 0; i < 60; i++)
		post_recv(&b, b.buf + i * 64, 64, 1000 + (uint64_t)i);
	for (int i = 0; i < 60; i++) {
		a.buf[i * 64] = (char)i;
		assert_int_equal(post(&a, IBV_WR_SEND, a.buf + i * 64, (uint32_t)(1 + i), a.mr->lkey,
				      0, 0, (uint64_t)i, i % 3 == 2 ? IBV_SEND_SIGNALED : 0), 0);
	}
	for (int i = 0; i < 60; i++) {
		struct ibv_wc wc = poll_one(b.cq);
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(wc.wr_id, 1000 + (uint64_t)i);
		assert_int_equal(wc.byte_len, 1 + i);
		assert_int_equal(wc.src_qp, a.qp->qp_num);
		assert_int_equal(b.buf[i * 64], (char)i);
	}
	/* Only the signaled sends complete: every third. */
	for (int i = 2; i < 60; i += 3)
		assert_int_equal(poll_one(a.cq).wr_id, (uint64_t)i);
	assert_cq_empty(a.cq);
	end_close(&a);
	end_close(&b);
}

static void test_write_with_imm_and_inline(void **state)
{
	(void)state;
	struct end a, b;

	pair_up(&a, &b, &rc_default);
	post_recv(&b, b.buf, 0, 77);
	struct ibv_sge sge = { (uintptr_t)"inline!", 8, 0 };
	struct ibv_send_wr wr = { .wr_id = 5, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .imm_data = htonl(0xabcd),
				  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE }, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf + 128;
	wr.wr.rdma.rkey = b.mr->rkey;
	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
	assert_int_equal(poll_one(a.cq).opcode, IBV_WC_RDMA_WRITE);
	struct ibv_wc wc = poll_one(b.cq);
	assert_int_equal(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
	assert_int_equal(wc.wr_id, 77);
	assert_true(wc.wc_flags & IBV_WC_WITH_IMM);
	assert_int_equal(ntohl(wc.imm_data), 0xabcd);
	assert_int_equal(wc.byte_len, 8);
	assert_string_equal(b.buf + 128, "inline!");
	end_close(&a);
	end_close(&b);
}

static void test_cq_overrun_event(void **state)
{
	(void)state;
	struct end a, b;
	struct qp_opts o = rc_default;

	o.cqe = 2;
	pair_up(&a, &b, &o);
	for (int i = 0; i < 3; i++)
		assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, a.buf, 8, a.mr->lkey, (uintptr_t)b.buf,
				      b.mr->rkey, (uint64_t)i, IBV_SEND_SIGNALED), 0);
	/* The CQ and the QP that could not complete into it. */
	enum ibv_event_type e1 = next_event(a.ctx, 1000), e2 = next_event(a.ctx, 1000);
	assert_true((e1 == IBV_EVENT_CQ_ERR && e2 == IBV_EVENT_QP_FATAL) ||
		    (e1 == IBV_EVENT_QP_FATAL && e2 == IBV_EVENT_CQ_ERR));
	assert_int_equal(qp_state(a.qp), IBV_QPS_ERR);
	end_close(&a);
	end_close(&b);
}

static void test_srq_limit_event(void **state)
{
	(void)state;
	struct end a, b;

	end_open(&a, &rc_default);
	end_open(&b, &rc_default);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(b.pd, &sa);
	struct ibv_qp_init_attr ia = { .send_cq = b.cq, .recv_cq = b.cq, .srq = srq,
				       .qp_type = IBV_QPT_RC, .cap = { 4, 0, 1, 0, 0 } };
	struct ibv_qp *bq = ibv_create_qp(b.pd, &ia);
	ibv_destroy_qp(b.qp);
	b.qp = bq;
	connect_qp(a.qp, &b, b.qp->qp_num, &rc_default);
	connect_qp(b.qp, &a, a.qp->qp_num, &rc_default);
	for (int i = 0; i < 4; i++) {
		struct ibv_sge sge = { (uintptr_t)b.buf + (uint64_t)i * 64, 64, b.mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1 }, *bad;
		assert_int_equal(ibv_post_srq_recv(srq, &wr, &bad), 0);
	}
	struct ibv_srq_attr lim = { .srq_limit = 3 };
	assert_int_equal(ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT), 0);
	assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 8, a.mr->lkey, 0, 0, 1, 0), 0);	/* 4 -> 3 */
	assert_int_equal((int)next_event(b.ctx, 50), -1);
	assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 8, a.mr->lkey, 0, 0, 2, 0), 0);	/* 3 -> 2 */
	assert_int_equal(next_event(b.ctx, 1000), IBV_EVENT_SRQ_LIMIT_REACHED);
	struct ibv_srq_attr q;
	assert_int_equal(ibv_query_srq(srq, &q), 0);
	assert_int_equal(q.srq_limit, 0);	/* disarmed by the event */
	assert_int_equal(poll_one(b.cq).wr_id, 0);
	assert_int_equal(poll_one(b.cq).wr_id, 1);
	ibv_destroy_qp(b.qp);
	b.qp = fix_qp(&(struct fix){ .pd = b.pd, .cq = b.cq }, IBV_QPT_RC);
	assert_int_equal(ibv_destroy_srq(srq), 0);
	end_close(&a);
	end_close(&b);
}

static void test_solicited_events(void **state)
{
	(void)state;
	struct end a, b;
	struct ibv_cq *cq;
	void *cctx;

	pair_up(&a, &b, &rc_default);
	/* Re-home b's receive CQ on a completion channel. */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(b.ctx);
	struct ibv_cq *rcq = ibv_create_cq(b.ctx, 16, NULL, ch, 0);
	struct ibv_qp_init_attr ia = { .send_cq = b.cq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
				       .cap = { 4, 4, 1, 1, 0 } };
	ibv_destroy_qp(b.qp);
	b.qp = ibv_create_qp(b.pd, &ia);
	ibv_destroy_qp(a.qp);
	a.qp = ibv_create_qp(a.pd, &(struct ibv_qp_init_attr){ .send_cq = a.cq, .recv_cq = a.cq,
			     .qp_type = IBV_QPT_RC, .cap = { 4, 4, 1, 1, 0 } });
	connect_qp(a.qp, &b, b.qp->qp_num, &rc_default);
	connect_qp(b.qp, &a, a.qp->qp_num, &rc_default);
	post_recv(&b, b.buf, 64, 1);
	post_recv(&b, b.buf, 64, 2);
	assert_int_equal(ibv_req_notify_cq(rcq, 1), 0);	/* solicited only */
	assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 8, a.mr->lkey, 0, 0, 1, 0), 0);
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 50), 0);		/* unsolicited: no event */
	assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 8, a.mr->lkey, 0, 0, 2, IBV_SEND_SOLICITED), 0);
	assert_int_equal(poll(&p, 1, 1000), 1);
	assert_int_equal(ibv_get_cq_event(ch, &cq, &cctx), 0);
	assert_ptr_equal(cq, rcq);
	ibv_ack_cq_events(cq, 1);
	struct ibv_wc wc[2];
	assert_int_equal(ibv_poll_cq(rcq, 2, wc), 2);
	ibv_destroy_qp(b.qp);
	b.qp = ibv_create_qp(b.pd, &(struct ibv_qp_init_attr){ .send_cq = b.cq, .recv_cq = b.cq,
			     .qp_type = IBV_QPT_RC, .cap = { 1, 1, 1, 1, 0 } });
	assert_int_equal(ibv_destroy_cq(rcq), 0);
	assert_int_equal(ibv_destroy_comp_channel(ch), 0);
	end_close(&a);
	end_close(&b);
}

/* ODP: registration does not need the pages, and a page unmapped after
 * registration fails that one access cleanly (Remote Operational Error,
 * as a page fault the device cannot resolve), while the rest of the MR
 * still works. */
static void test_odp_page_unmapped_after_registration(void **state)
{
	(void)state;
	struct end a, b;
	long pg = sysconf(_SC_PAGESIZE);

	pair_up(&a, &b, &rc_default);
	char *m = mmap(NULL, (size_t)pg * 3, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);
	struct ibv_mr *odp = ibv_reg_mr(b.pd, m, (size_t)pg * 3, ALL_ACCESS | IBV_ACCESS_ON_DEMAND);
	assert_non_null(odp);
	assert_int_equal(munmap(m + pg, (size_t)pg), 0);
	strcpy(a.buf, "odp");
	assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, a.buf, 4, a.mr->lkey, (uintptr_t)m + 2 * pg,
			      odp->rkey, 1, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_SUCCESS);
	assert_string_equal(m + 2 * pg, "odp");
	assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, a.buf, 4, a.mr->lkey, (uintptr_t)m + pg + 8,
			      odp->rkey, 2, IBV_SEND_SIGNALED), 0);
	struct ibv_wc wc = poll_one(a.cq);
	assert_int_equal(wc.wr_id, 2);
	assert_int_equal(wc.status, IBV_WC_REM_OP_ERR);
	assert_int_equal(qp_state(a.qp), IBV_QPS_ERR);
	assert_int_equal(ibv_dereg_mr(odp), 0);
	munmap(m, (size_t)pg);
	munmap(m + 2 * pg, (size_t)pg);
	end_close(&a);
	end_close(&b);
}

/* UD multicast: every attached QP but the sender gets a copy. */
static void test_ud_multicast(void **state)
{
	(void)state;
	struct qp_opts o = { .type = IBV_QPT_UD };
	struct end a, b, c;
	union ibv_gid mgid = { .raw = { 0xff, 0x12, 0x40, 0x1b, [15] = 0x42 } };
	uint16_t mlid = 0xc001;

	pair_up(&a, &b, &o);
	end_open(&c, &o);
	connect_qp(c.qp, &a, a.qp->qp_num, &o);
	bool roce = a.port.link_layer == IBV_LINK_LAYER_ETHERNET;
	/* What ib_attach_mcast() refuses. */
	union ibv_gid ucast = a.gid;
	assert_int_equal(ibv_attach_mcast(b.qp, &ucast, mlid), EINVAL);
	if (!roce)
		assert_int_equal(ibv_attach_mcast(b.qp, &mgid, 0x12), EINVAL);	/* unicast LID */
	struct end r;
	end_open(&r, &rc_default);
	assert_int_equal(ibv_attach_mcast(r.qp, &mgid, mlid), EINVAL);	/* not UD */
	end_close(&r);
	assert_int_equal(ibv_detach_mcast(b.qp, &mgid, mlid), EINVAL);	/* not attached */

	assert_int_equal(ibv_attach_mcast(b.qp, &mgid, mlid), 0);
	assert_int_equal(ibv_attach_mcast(b.qp, &mgid, mlid), 0);	/* again: no change */
	assert_int_equal(ibv_attach_mcast(c.qp, &mgid, mlid), 0);
	assert_int_equal(ibv_attach_mcast(a.qp, &mgid, mlid), 0);	/* the sender too */
	if (!roce)	/* one MGID under a second MLID: still one copy for b */
		assert_int_equal(ibv_attach_mcast(b.qp, &mgid, mlid + 1), 0);
	struct ibv_ah_attr aa = { .dlid = mlid, .port_num = 1, .is_global = 1 };
	aa.grh.dgid = mgid;
	struct ibv_ah *ah = ibv_create_ah(a.pd, &aa);
	assert_non_null(ah);
	struct ibv_sge sge = { (uintptr_t)a.buf, 6, a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = 0xffffff;
	wr.wr.ud.remote_qkey = 0x1234;
	for (int round = 0; round < 2; round++) {
		post_recv(&a, a.buf + 1024, 128, 10);
		post_recv(&b, b.buf, 128, 11);
		post_recv(&b, b.buf + 2048, 128, 13);	/* room for a duplicate */
		post_recv(&c, c.buf, 128, 12);
		strcpy(a.buf, round ? "again" : "group");
		assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
		assert_int_equal(poll_one(a.cq).status, IBV_WC_SUCCESS);
		struct ibv_wc wb = poll_one(b.cq);
		assert_int_equal(wb.status, IBV_WC_SUCCESS);
		assert_int_equal(wb.src_qp, a.qp->qp_num);
		assert_true(wb.wc_flags & IBV_WC_GRH);
		assert_string_equal((wb.wr_id == 13 ? b.buf + 2048 : b.buf) + 40, a.buf);
		assert_cq_empty(b.cq);		/* exactly one copy */
		if (round == 0) {
			assert_int_equal(poll_one(c.cq).status, IBV_WC_SUCCESS);
			assert_string_equal(c.buf + 40, "group");
			/* c leaves the group before the second round. */
			assert_int_equal(ibv_detach_mcast(c.qp, &mgid, mlid), 0);
		} else {
			assert_cq_empty(c.cq);	/* detached */
		}
		assert_cq_empty(a.cq);		/* never to the sender itself */
		/* Drain the unused receives: flushed when the QPs are closed. */
	}
	ibv_destroy_ah(ah);
	end_close(&a);
	end_close(&b);
	end_close(&c);
}

static void test_ud_grh_and_qkey(void **state)
{
	(void)state;
	struct end a, b;
	struct qp_opts o = { .type = IBV_QPT_UD };

	pair_up(&a, &b, &o);
	bool roce = a.port.link_layer == IBV_LINK_LAYER_ETHERNET;
	struct ibv_ah_attr aa = { .dlid = b.port.lid, .port_num = 1, .is_global = roce };
	aa.grh.dgid = b.gid;
	struct ibv_ah *ah = ibv_create_ah(a.pd, &aa);
	post_recv(&b, b.buf, 40 + 32, 1);
	strcpy(a.buf, "datagram");
	struct ibv_sge sge = { (uintptr_t)a.buf, 9, a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = b.qp->qp_num;
	wr.wr.ud.remote_qkey = 0x1234;
	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_SUCCESS);
	struct ibv_wc wc = poll_one(b.cq);
	assert_int_equal(wc.byte_len, 40 + 9);
	assert_int_equal(wc.src_qp, a.qp->qp_num);
	assert_int_equal(!!(wc.wc_flags & IBV_WC_GRH), roce);
	assert_int_equal(wc.slid, roce ? 0 : a.port.lid);	/* the sender's port */
	assert_string_equal(b.buf + 40, "datagram");
	/* A wrong Q_Key: silently dropped; the sender still succeeds. */
	wr.wr.ud.remote_qkey = 0x9999;
	post_recv(&b, b.buf, 72, 2);
	assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_SUCCESS);
	assert_cq_empty(b.cq);
	ibv_destroy_ah(ah);
	end_close(&a);
	end_close(&b);
}

/* ---- the target process sleeps; 64 MiB land anyway ---- */

#define BIG (64ul << 20)

struct exch {
	uint32_t qpn;
	uint16_t lid;
	union ibv_gid gid;
	uint64_t addr;
	uint32_t rkey;
};

/* A forked child's end: opened, its address sent to the parent over fd
 * and the parent's read back, connected; false if the parent is gone. */
static bool child_meets_parent(struct end *t, int fd, const struct qp_opts *o)
{
	struct exch x;

	end_open(t, o);
	struct exch me = { .qpn = t->qp->qp_num, .lid = t->port.lid, .gid = t->gid };
	if (write(fd, &me, sizeof(me)) != sizeof(me) || read(fd, &x, sizeof(x)) != sizeof(x))
		return false;
	struct end peer = { .port = t->port, .gid = x.gid };
	peer.port.lid = x.lid;
	connect_qp(t->qp, &peer, x.qpn, o);
	return true;
}

/* The parent's end: the child's address (returned) first, then its own. */
static struct exch parent_meets_child(struct end *a, int fd, const struct qp_opts *o)
{
	struct exch x;

	end_open(a, o);
	assert_int_equal(read(fd, &x, sizeof(x)), sizeof(x));
	struct exch me = { .qpn = a->qp->qp_num, .lid = a->port.lid, .gid = a->gid };
	assert_int_equal(write(fd, &me, sizeof(me)), sizeof(me));
	struct end peer = { .port = a->port, .gid = x.gid };
	peer.port.lid = x.lid;
	connect_qp(a->qp, &peer, x.qpn, o);
	return x;
}

/* The target: registers memory of the given kind, publishes it, then
 * sleeps in nanosleep and never calls into verbs again.  Woken by
 * SIGUSR1, it checks what landed. */
static char posix_name[64];

static void target_exit(int code)
{
	if (posix_name[0])
		shm_unlink(posix_name);
	_exit(code);
}

/* 0 private, 1 SysV, 2 POSIX shm: 64 MiB; 3 device memory: max_dm_size. */
static size_t kind_size(int kind)
{
	return kind == 3 ? SV_MAX_DM_SIZE : BIG;
}

static void sleeping_target(int wfd, int kind)
{
	struct qp_opts o = rc_default;
	struct end t;
	struct ibv_dm *dm = NULL;
	size_t sz = kind_size(kind);
	char *mem;
	/* SIGUSR1 ends the sleep.  Blocked before the device opens, so
	 * softverbs' threads (which copy for peers) inherit the mask: sent
	 * before this thread waits for it, it stays pending instead of
	 * killing the process through one of them. */
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, SIGUSR1);
	sigprocmask(SIG_BLOCK, &s, NULL);

	end_open(&t, &o);
	if (kind == 3) {
		/* Device memory: staged here, copied in with memcpy_to_dm. */
		struct ibv_alloc_dm_attr da = { .length = sz };
		dm = ibv_alloc_dm(t.ctx, &da);
		mem = malloc(sz);
		if (!dm || !mem)
			target_exit(9);
	} else if (kind == 0) {
		mem = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	} else if (kind == 1) {
		int id = shmget(IPC_PRIVATE, BIG, IPC_CREAT | 0600);
		mem = shmat(id, NULL, 0);
		shmctl(id, IPC_RMID, NULL);
	} else {
		/* A named POSIX shm object; unlinked only at exit, so peers
		 * can open it by name (the direct path). */
		snprintf(posix_name, sizeof(posix_name), "/svtest-%d", (int)getpid());
		int fd = shm_open(posix_name, O_RDWR | O_CREAT, 0600);
		if (ftruncate(fd, (off_t)BIG))
			target_exit(3);
		mem = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	}
	for (size_t i = 0; i < sz; i += 4096)
		mem[i] = (char)(i >> 12);
	struct ibv_mr *mr;
	if (dm) {
		if (ibv_memcpy_to_dm(dm, 0, mem, sz))
			target_exit(10);
		mr = ibv_reg_dm_mr(t.pd, dm, 0, sz, ALL_ACCESS | IBV_ACCESS_ZERO_BASED);
	} else {
		mr = ibv_reg_mr(t.pd, mem, sz, ALL_ACCESS);
	}
	if (!mr)
		target_exit(11);
	struct exch x = { .qpn = t.qp->qp_num, .lid = t.port.lid, .gid = t.gid,
			  .addr = dm ? 0 : (uintptr_t)mem, .rkey = mr->rkey };
	if (write(wfd, &x, sizeof(x)) != sizeof(x))
		target_exit(4);
	struct exch peer;
	if (read(wfd, &peer, sizeof(peer)) != sizeof(peer))
		target_exit(5);
	struct end pe = { .port = t.port, .gid = peer.gid };
	pe.port.lid = peer.lid;
	connect_qp(t.qp, &pe, peer.qpn, &o);
	if (write(wfd, "R", 1) != 1)
		target_exit(6);
	/* Sleep: no verbs, no polling. */
	struct timespec ten = { 10, 0 };
	int sig;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	sig = sigtimedwait(&s, NULL, &ten);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (sig != SIGUSR1)
		target_exit(7);
	if (dm && ibv_memcpy_from_dm(mem, dm, 0, sz))
		target_exit(12);
	/* The initiator wrote 0x5a everywhere but the last page. */
	for (size_t i = 0; i < sz - 4096; i += 512)
		if (mem[i] != 0x5a)
			target_exit(8);
	target_exit(0);
}

/* The path each kind of target memory must take, for the copy mode of
 * this run: shareable memory is mapped (direct), private memory goes by
 * CMA -- or by bounce when that is forced or CMA is refused. */
static enum sv_copy_path expected_path(int kind, bool cma_refused)
{
	const char *mode = getenv("SOFTVERBS_COPY");

	if (mode && !strcmp(mode, "bounce"))
		return SV_PATH_BOUNCE;
	if (mode && !strcmp(mode, "cma"))
		return SV_PATH_CMA;
	if (kind != 0)
		return SV_PATH_DIRECT;
	return cma_refused ? SV_PATH_BOUNCE : SV_PATH_CMA;
}

static bool cma_refused;

static void one_sided_into_sleeper(int kind)
{
	size_t sz = kind_size(kind);
	int sp[2];
	struct end a;
	struct exch x;
	char r;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
	pid_t pid = fix_fork();
	if (!pid) {
		close(sp[0]);
		sleeping_target(sp[1], kind);
	}
	close(sp[1]);
	/* Over UDP the sleeper's thread answers, and under load waits for
	 * its core: a budget of 8 x 268 ms (timeout 16) outlasts that where
	 * 8 x 67 ms ran out once (RETRY_EXC_ERR on the READ, two busy loops
	 * beside integration.udp_faults). */
	struct qp_opts o = rc_default;
	o.timeout = 16;
	x = parent_meets_child(&a, sp[0], &o);
	assert_int_equal(read(sp[0], &r, 1), 1);
	char *src = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *back = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(src, 0x5a, sz);
	struct ibv_mr *ms = ibv_reg_mr(a.pd, src, sz, ALL_ACCESS);
	struct ibv_mr *mb = ibv_reg_mr(a.pd, back, sz, ALL_ACCESS);
	enum sv_copy_path path = expected_path(kind, cma_refused);
	uint64_t before = my_bytes(path);
	/* 64 MiB WRITE, but leave the last page as the target wrote it. */
	assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, src, (uint32_t)(sz - 4096), ms->lkey, x.addr,
			      x.rkey, 1, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_SUCCESS);
	/* 64 MiB READ of all of it back. */
	assert_int_equal(post(&a, IBV_WR_RDMA_READ, back, (uint32_t)sz, mb->lkey, x.addr, x.rkey, 2,
			      IBV_SEND_SIGNALED), 0);
	struct ibv_wc wc = poll_one(a.cq);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.byte_len, sz);
	assert_int_equal(memcmp(back, src, sz - 4096), 0);
	assert_int_equal(back[sz - 4096], (char)((sz - 4096) >> 12));
	/* Both 64 MiB transfers went the expected way (the shm copy paths;
	 * packets, SOFTVERBS_TRANSPORT=udp, count no copy path). */
	uint64_t moved = my_bytes(path) - before;
	const char *tr = getenv("SOFTVERBS_TRANSPORT");
	if ((!tr || strcmp(tr, "udp")) && moved < 2 * sz - 4096)
		fail_msg("memory kind %d: only %llu bytes by path %d", kind,
			 (unsigned long long)moved, path);
	kill(pid, SIGUSR1);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	if (WEXITSTATUS(st))
		fail_msg("target (memory kind %d) exited %d", kind, WEXITSTATUS(st));
	ibv_dereg_mr(ms);
	ibv_dereg_mr(mb);
	munmap(src, sz);
	munmap(back, sz);
	end_close(&a);
	close(sp[0]);
}

/*
 * A receiver that sees its last completion and calls exit() at once, as
 * a ping-pong's last round does: the sender's SEND still completes with
 * success.  Over packets, the ACK of a message that a CQ poller received
 * may wait for the application's next post (engine/pkt.c); exit() must
 * not lose it.  The first message wakes the receiver's endpoint thread,
 * which then leaves reception to the polling application thread; the
 * second is that thread's, and its completion is the last.  The
 * sender's retry budget (timeout 12 x 3 tries, about 50 ms) is far
 * shorter than the 10 s poll, so a lost ACK fails the test.
 */
static void test_receiver_exits_at_once(void **state)
{
	(void)state;
	struct qp_opts o = rc_default;
	o.timeout = 12;
	o.retry_cnt = 2;
	for (int round = 0; round < 5; round++) {
		int sp[2];
		char r;

		assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
		pid_t pid = fix_fork();
		if (!pid) {
			struct end t;
			close(sp[0]);
			if (!child_meets_parent(&t, sp[1], &o))
				_exit(2);
			post_recv(&t, t.buf, 64, 7);
			post_recv(&t, t.buf, 64, 8);
			if (write(sp[1], "r", 1) != 1)
				_exit(3);
			if (!wc_ok(t.cq, 7))
				_exit(4);
			exit(wc_ok(t.cq, 8) ? 0 : 5);	/* no teardown: exit() alone */
		}
		close(sp[1]);
		struct end a;
		parent_meets_child(&a, sp[0], &o);
		assert_int_equal(read(sp[0], &r, 1), 1);
		for (uint64_t id = 1; id <= 2; id++) {
			if (id == 2)
				usleep(5000);	/* the receiver polls all along */
			assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 64, a.mr->lkey, 0, 0, id,
					      IBV_SEND_SIGNALED), 0);
			struct ibv_wc wc = poll_one(a.cq);
			if (wc.status != IBV_WC_SUCCESS)
				fail_msg("round %d: SEND %llu to a receiver that exits after its last "
					 "completion ended %s", round, (unsigned long long)id,
					 ibv_wc_status_str(wc.status));
		}
		assert_child_ok(pid, "receiver");
		end_close(&a);
		close(sp[0]);
	}
}

/*
 * Posts while messages are unacknowledged (engine/pkt_req.c, corked):
 * with 16 messages in flight a post sends nothing until what waits makes
 * 16 packets, which go in one datagram, and the next ACK sends the rest.
 * The receiver is stopped (SIGSTOP) while the sender posts 60 SENDs, so
 * no ACK comes: 16 datagrams of one packet, then 2 of 16, and 12 SENDs
 * left waiting.  Then it runs, and the sender makes no call at all until
 * the receiver has all 60 in order: only the ACKs, taken in by the
 * sender's endpoint thread, can have sent those 12.  It runs over UDP
 * only (main).  The ACK timeout is 1 s (timeout 18), so that a loaded
 * host's pauses add no retransmission to the count.
 */
#define CORK_SENDS 60

/* lo's packets sent, into *tx; false if unreadable.  /proc/net/dev is
 * this process's network namespace; /sys/class/net is the namespace
 * sysfs was mounted in, which own_netns.sh's is not.  It asserts
 * nothing: the test reads it while its receiver is stopped. */
static bool lo_tx_packets(unsigned long *tx)
{
	unsigned long v[10];
	char line[512];
	bool found = false;
	FILE *f = fopen("/proc/net/dev", "r");

	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f)) {
		const char *c = strchr(line, ':');
		if (!c || strncmp(line + strspn(line, " "), "lo:", 3))
			continue;
		/* rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes packets */
		found = sscanf(c + 1, "%lu %lu %lu %lu %lu %lu %lu %lu %lu %lu", &v[0], &v[1],
			       &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]) == 10;
	}
	fclose(f);
	*tx = v[9];
	return found;
}

static void test_posts_wait_for_the_ack(void **state)
{
	(void)state;
	struct qp_opts o = rc_default;
	o.timeout = 18;
	int sp[2];
	char r;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
	pid_t pid = fix_fork();
	if (!pid) {
		struct end t;
		close(sp[0]);
		if (!child_meets_parent(&t, sp[1], &o))
			_exit(2);
		for (uint64_t i = 0; i < CORK_SENDS; i++)
			post_recv(&t, t.buf + i * 64, 64, i);
		if (write(sp[1], "r", 1) != 1)
			_exit(3);
		for (uint64_t i = 0; i < CORK_SENDS; i++) {
			uint64_t got;
			if (!wc_ok(t.cq, i))
				_exit(4);
			memcpy(&got, t.buf + i * 64, sizeof(got));
			if (got != i)
				_exit(5);
		}
		if (write(sp[1], "d", 1) != 1 || read(sp[1], &r, 1) != 1)
			_exit(6);
		end_close(&t);
		exit(0);
	}
	close(sp[1]);
	struct end a;
	parent_meets_child(&a, sp[0], &o);
	assert_int_equal(read(sp[0], &r, 1), 1);

	int st;
	assert_int_equal(kill(pid, SIGSTOP), 0);
	assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
	assert_true(WIFSTOPPED(st));
	/* No assertion until the receiver runs again: a stopped child would
	 * hold the test's output open. */
	unsigned long before = 0, after = 0;
	bool counted = lo_tx_packets(&before);
	int posted = 0;
	while (posted < CORK_SENDS) {
		uint64_t i = (uint64_t)posted;
		memcpy(a.buf + i * 64, &i, sizeof(i));
		if (post(&a, IBV_WR_SEND, a.buf + i * 64, sizeof(i), a.mr->lkey, 0, 0, i,
			 IBV_SEND_SIGNALED))
			break;
		posted++;
	}
	counted = lo_tx_packets(&after) && counted;
	assert_int_equal(kill(pid, SIGCONT), 0);
	assert_int_equal(posted, CORK_SENDS);
	assert_true(counted);
	unsigned long datagrams = after - before;

	struct pollfd p = { .fd = sp[0], .events = POLLIN };
	if (poll(&p, 1, 10000) != 1 || read(sp[0], &r, 1) != 1 || r != 'd') {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		fail_msg("the receiver did not get %d SENDs in order while the sender waited",
			 CORK_SENDS);
	}
	for (uint64_t i = 0; i < CORK_SENDS; i++) {
		struct ibv_wc wc = poll_one(a.cq);
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(wc.wr_id, i);
	}
	assert_int_equal(write(sp[0], "x", 1), 1);
	assert_child_ok(pid, "receiver");
	end_close(&a);
	close(sp[0]);

	if (getenv("SV_NETNS_PRIVATE")) {	/* lo is this test's alone */
		print_message("%d SENDs to a stopped receiver: %lu datagrams\n", CORK_SENDS,
			      datagrams);
		if (datagrams > CORK_SENDS / 2)
			fail_msg("%d SENDs posted with 16 unacknowledged took %lu datagrams "
				 "(one each is %d)", CORK_SENDS, datagrams, CORK_SENDS);
	}
}

/*
 * Over packets, the ACK of a message a CQ poller received waits for the
 * application's next post or poll (engine/pkt.c), and at most until its
 * polls stop (transport/udp/udp.c: the endpoint thread ticks as the
 * poller window closes); a poll of an armed CQ, whose application is
 * about to wait for the event, holds none.  The receiver here polls,
 * gets its completion and stops; the sender's only try (retry_cnt 0,
 * timeout 14: 67 ms) ends in RETRY_EXC_ERR if the ACK stays held.  The
 * unarmed receiver polls for 20 ms before the SEND, so that its thread
 * leaves the socket to the polls and the poll is what receives it; the
 * armed one races its thread for the packet, so there are 20 rounds.
 * The third receiver polls once and then waits elsewhere, as ib_write_lat
 * waits for a WRITE in its memory: its thread receives the WRITE that
 * follows and, the application having polled a moment ago, holds the ACK
 * for its next post (transport/udp/window.h, sv_window_recent), which
 * never comes; the thread's own tick must send it.
 * On shm there is no ACK, and the SENDs and WRITEs simply complete.
 */
static void drain_cq_events(struct ibv_comp_channel *ch)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct ibv_cq *cq;
	void *ctx;

	while (poll(&p, 1, 0) == 1) {
		assert_int_equal(ibv_get_cq_event(ch, &cq, &ctx), 0);
		ibv_ack_cq_events(cq, 1);
	}
}

/* An end's CQ again, on a completion channel of its own, and its QP
 * (still in RESET) on that CQ; end_close_channel() closes it. */
static struct ibv_comp_channel *end_channel(struct end *e, enum ibv_qp_type type)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(e->ctx);
	assert_non_null(ch);
	assert_int_equal(ibv_destroy_qp(e->qp), 0);
	assert_int_equal(ibv_destroy_cq(e->cq), 0);
	e->cq = ibv_create_cq(e->ctx, 256, NULL, ch, 0);
	assert_non_null(e->cq);
	struct ibv_qp_init_attr ia = { .send_cq = e->cq, .recv_cq = e->cq, .qp_type = type,
				       .cap = { 64, 64, 4, 4, 64 } };
	e->qp = ibv_create_qp(e->pd, &ia);
	assert_non_null(e->qp);
	return ch;
}

/* end_close for an end whose CQ has a completion channel: the channel
 * goes after its CQ and before its context. */
static void end_close_channel(struct end *e, struct ibv_comp_channel *ch)
{
	assert_int_equal(ibv_destroy_qp(e->qp), 0);
	assert_int_equal(ibv_destroy_cq(e->cq), 0);
	assert_int_equal(ibv_destroy_comp_channel(ch), 0);
	assert_int_equal(ibv_dereg_mr(e->mr), 0);
	assert_int_equal(ibv_dealloc_pd(e->pd), 0);
	assert_int_equal(ibv_close_device(e->ctx), 0);
	free(e->buf);
}

static void test_held_ack_is_sent(void **state)
{
	static const struct {
		const char *what;
		bool armed, write_after_one_poll;
		int rounds;
	} cases[] = {
		{ "a poller that stops", false, false, 3 },
		{ "polls of an armed CQ", true, false, 20 },
		{ "a WRITE after one poll", false, true, 1 },
	};
	(void)state;
	struct qp_opts o = rc_default;
	/* No retransmission (its duplicate would be acknowledged and hide
	 * an ACK never sent; a tail-loss probe, engine/pkt_req.c, may still
	 * ask again once a round trip has been timed, so each case's first
	 * round is the one nothing can rescue, and the WRITE case has only
	 * that one), and a timeout of 1.07 s, not 67 ms: on a
	 * loaded 2-core host the thread that must send the ACK waited its
	 * core longer than 67 ms (1 run in 15 under two busy loops
	 * beside integration.udp_faults); architecture §10, "Forwarding
	 * waits a little", has the measurement of this host's scheduling. */
	o.retry_cnt = 0;
	o.timeout = 18;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct end a, b;
		struct ibv_comp_channel *ch = NULL;
		end_open(&a, &o);
		end_open(&b, &o);
		if (cases[c].armed)
			ch = end_channel(&b, IBV_QPT_RC);
		connect_qp(a.qp, &b, b.qp->qp_num, &o);
		connect_qp(b.qp, &a, a.qp->qp_num, &o);
		for (int round = 0; round < cases[c].rounds; round++) {
			struct ibv_wc wc;
			if (cases[c].write_after_one_poll) {
				assert_int_equal(ibv_poll_cq(b.cq, 1, &wc), 0);
				assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, a.buf, 64, a.mr->lkey,
						      (uintptr_t)b.buf, b.mr->rkey, 3,
						      IBV_SEND_SIGNALED), 0);
				wc = poll_one(a.cq);
				if (wc.status != IBV_WC_SUCCESS)
					fail_msg("%s, round %d: the WRITE ended %s", cases[c].what,
						 round, ibv_wc_status_str(wc.status));
				continue;
			}
			post_recv(&b, b.buf, 64, 1);
			if (ch) {
				assert_int_equal(ibv_req_notify_cq(b.cq, 0), 0);
			} else {
				struct timespec t0, t;
				clock_gettime(CLOCK_MONOTONIC, &t0);
				do {
					assert_int_equal(ibv_poll_cq(b.cq, 1, &wc), 0);
					clock_gettime(CLOCK_MONOTONIC, &t);
				} while ((t.tv_sec - t0.tv_sec) * 1000000000L + t.tv_nsec - t0.tv_nsec <
					 20000000L);
			}
			assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 64, a.mr->lkey, 0, 0, 2,
					      IBV_SEND_SIGNALED), 0);
			wc = poll_one(b.cq);
			assert_int_equal(wc.status, IBV_WC_SUCCESS);
			wc = poll_one(a.cq);
			if (wc.status != IBV_WC_SUCCESS)
				fail_msg("%s, round %d: the SEND ended %s", cases[c].what, round,
					 ibv_wc_status_str(wc.status));
			if (ch)
				drain_cq_events(ch);
		}
		end_close(&a);
		if (ch)
			end_close_channel(&b, ch);
		else
			end_close(&b);
	}
}

/*
 * Run with SOFTVERBS_FAULT=reorder=1 (unit.dataplane.udp_held): every
 * packet is held back until its process sends its next one, or 1 ms.  A
 * packet held by a thread other than the endpoint's (here the post)
 * while that thread sleeps must still leave within the 1 ms: the thread
 * is asked to look then.  The sender is a process of its own (any
 * endpoint thread of a process sends what the process holds), forked
 * before this one starts threads (ThreadSanitizer follows no fork of a
 * threaded process); its datagram starts no timer, and it never polls,
 * so nothing else wakes its thread.  When the packet waited for one, the
 * receiver's event never came.
 */
struct held_peer {
	uint32_t qpn;
	uint16_t lid;
	union ibv_gid gid;
};

/* The forked sender: plain checks, each with an exit code of its own,
 * not cmocka's asserts, which belong to the parent's test run. */
static int held_sender(int info, int go)
{
	struct held_peer b;
	if (read(info, &b, sizeof(b)) != (ssize_t)sizeof(b))
		return 10;
	struct ibv_context *ctx = ibv_open_device(devs[0]);
	if (!ctx)
		return 11;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	char *buf = calloc(1, 64);
	struct ibv_mr *mr = pd && buf ? ibv_reg_mr(pd, buf, 64, 0) : NULL;
	struct ibv_qp *qp = mr && cq ? ibv_create_qp(pd, &(struct ibv_qp_init_attr){
					     .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
					     .cap = { 16, 16, 1, 1, 0 } }) : NULL;
	if (!qp)
		return 12;
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x1234 };
	if (ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		return 13;
	qa.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &qa, IBV_QP_STATE))
		return 14;
	qa.qp_state = IBV_QPS_RTS;
	if (ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN))
		return 15;
	struct ibv_ah_attr aa = { .dlid = b.lid, .port_num = 1, .is_global = 1 };
	aa.grh.dgid = b.gid;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah)
		return 16;
	char c;
	int sent = 0;
	while (read(go, &c, 1) == 1) {
		struct ibv_sge sge = { (uintptr_t)buf, 64, mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
				   *bad;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = b.qpn;
		wr.wr.ud.remote_qkey = 0x1234;
		if (ibv_post_send(qp, &wr, &bad))
			return 17;
		sent++;
	}
	struct ibv_wc wc;
	for (int got = 0; got < sent;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0 || (n == 1 && wc.status != IBV_WC_SUCCESS))
			return 18;
		got += n;
	}
	ibv_destroy_ah(ah);
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	return ibv_close_device(ctx) ? 19 : 0;
}

static void test_held_packet_leaves(void **state)
{
	(void)state;
	int info[2], go[2];
	assert_int_equal(pipe(info), 0);
	assert_int_equal(pipe(go), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		close(info[1]);
		close(go[1]);
		_exit(held_sender(info[0], go[0]));
	}
	close(info[0]);
	close(go[0]);
	struct qp_opts o = { .type = IBV_QPT_UD };
	struct end b;
	end_open(&b, &o);
	struct ibv_comp_channel *ch = end_channel(&b, IBV_QPT_UD);
	connect_qp(b.qp, &b, b.qp->qp_num, &o);
	struct held_peer hp = { .qpn = b.qp->qp_num, .lid = b.port.lid, .gid = b.gid };
	assert_int_equal(write(info[1], &hp, sizeof(hp)), (ssize_t)sizeof(hp));
	close(info[1]);
	for (int round = 0; round < 5; round++) {
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		struct ibv_cq *cq;
		void *cctx;
		struct ibv_wc wc;

		post_recv(&b, b.buf, 40 + 64, (uint64_t)round);
		assert_int_equal(ibv_req_notify_cq(b.cq, 0), 0);
		assert_int_equal(write(go[1], "g", 1), 1);
		if (poll(&p, 1, 2000) != 1) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			fail_msg("round %d: the datagram did not arrive within 2 s", round);
		}
		assert_int_equal(ibv_get_cq_event(ch, &cq, &cctx), 0);
		ibv_ack_cq_events(cq, 1);
		assert_int_equal(ibv_poll_cq(b.cq, 1, &wc), 1);
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		assert_int_equal(wc.byte_len, 40 + 64);
	}
	close(go[1]);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	end_close_channel(&b, ch);
}

/*
 * A thread that polls a CQ and is cancelled (pthread_cancel, deferred) at
 * its next cancellation point: ibv_poll_cq is none, as in rdma-core, so
 * the thread dies outside it and leaves no lock held.  Over packets a
 * poll receives, with the context's reception lock held through its
 * read; when that read was a cancellation point, a cancel landed there in
 * most rounds and the context received nothing more (the SEND below
 * found no taker).  Here it is cancelled while polling, 20 times, and the
 * context must still receive and complete a SEND.
 */
static void *poll_until_cancelled(void *arg)
{
	struct ibv_cq *cq = arg;
	/* Not on the stack: AddressSanitizer leaves the redzones of frames
	 * that a cancellation unwinds poisoned, and its thread exit then
	 * trips over them. */
	static __thread struct ibv_wc wc;

	for (;;) {
		if (ibv_poll_cq(cq, 1, &wc) < 0)
			return (void *)1;
		pthread_testcancel();
	}
}

static void test_poller_cancelled(void **state)
{
	(void)state;
	struct end a, b;
	pair_up(&a, &b, &rc_default);
	for (int round = 0; round < 20; round++) {
		pthread_t t;
		void *ret;
		assert_int_equal(pthread_create(&t, NULL, poll_until_cancelled, b.cq), 0);
		usleep(1000);
		assert_int_equal(pthread_cancel(t), 0);
		assert_int_equal(pthread_join(t, &ret), 0);
		assert_ptr_equal(ret, PTHREAD_CANCELED);
		post_recv(&b, b.buf, 64, 1);
		assert_int_equal(post(&a, IBV_WR_SEND, a.buf, 64, a.mr->lkey, 0, 0, 2,
				      IBV_SEND_SIGNALED), 0);
		struct ibv_wc wc = poll_one(b.cq);
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
		wc = poll_one(a.cq);
		assert_int_equal(wc.status, IBV_WC_SUCCESS);
	}
	end_close(&a);
	end_close(&b);
}

static void test_64mib_into_sleeping_private(void **state) { (void)state; one_sided_into_sleeper(0); }
static void test_64mib_into_sleeping_sysv_shm(void **state) { (void)state; one_sided_into_sleeper(1); }
static void test_64mib_into_sleeping_posix_shm(void **state) { (void)state; one_sided_into_sleeper(2); }
static void test_into_sleeping_device_memory(void **state) { (void)state; one_sided_into_sleeper(3); }

/*
 * --without-cma: the kernel refuses process_vm_readv/writev to this
 * process (a seccomp filter, as a container runtime might install), so
 * every cross-process copy must take the bounce path.
 */
static void test_cma_is_refused(void **state)
{
	(void)state;
	char a = 0, b = 0;
	struct iovec l = { &a, 1 }, r = { &b, 1 };

	/* The premise of the --without-cma run. */
	errno = 0;
	assert_int_equal(process_vm_readv(getppid(), &l, 1, &r, 1, 0), -1);
	assert_int_equal(errno, EPERM);
}

/*
 * A port taken down (softverbs port DEV/1 down) is a cable pulled for the
 * whole host: every context gets PORT_ERR, the port reports DOWN, and a
 * request gets no answer, so it ends in IBV_WC_RETRY_EXC_ERR once its
 * retries are spent (C9-140).  Up again: PORT_ACTIVE everywhere, and a new
 * connection works.
 */
static void test_port_down_and_up(void **state)
{
	struct qp_opts o = rc_default;
	struct end a, b;
	struct ibv_port_attr pa;

	(void)state;
	o.timeout = 1;		/* 8 us per try */
	o.retry_cnt = 2;
	/* The registry outlives processes, as a switch would: a run that
	 * failed midway may have left the port down. */
	sv_port_set_state(0, true);
	pair_up(&a, &b, &o);
	assert_int_equal((int)next_event(a.ctx, 0), -1);	/* nothing at open */
	assert_int_equal(sv_port_set_state(0, false), 0);
	assert_int_equal(sv_port_set_state(0, false), EALREADY);
	assert_int_equal(next_event(a.ctx, 2000), IBV_EVENT_PORT_ERR);
	assert_int_equal(next_event(b.ctx, 2000), IBV_EVENT_PORT_ERR);
	assert_int_equal(ibv_query_port(a.ctx, 1, &pa), 0);
	assert_int_equal(pa.state, IBV_PORT_DOWN);
	assert_int_equal(pa.phys_state, 3);	/* Disabled */
	assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, a.buf, 8, a.mr->lkey, (uintptr_t)b.buf,
			      b.mr->rkey, 1, IBV_SEND_SIGNALED), 0);
	struct ibv_wc wc = poll_one(a.cq);
	assert_int_equal(wc.status, IBV_WC_RETRY_EXC_ERR);
	/* A connection made while the port is down comes up (modify_qp does
	 * not look at the link, as on mlx5) but carries nothing. */
	struct end c, d;
	pair_up(&c, &d, &o);
	assert_int_equal(post(&c, IBV_WR_SEND, c.buf, 8, c.mr->lkey, 0, 0, 3, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(c.cq).status, IBV_WC_RETRY_EXC_ERR);
	end_close(&c);
	end_close(&d);
	/* Up: both contexts hear it, and a fresh connection carries data. */
	assert_int_equal(sv_port_set_state(0, true), 0);
	assert_int_equal(next_event(a.ctx, 2000), IBV_EVENT_PORT_ACTIVE);
	assert_int_equal(next_event(b.ctx, 2000), IBV_EVENT_PORT_ACTIVE);
	assert_int_equal(ibv_query_port(b.ctx, 1, &pa), 0);
	assert_int_equal(pa.state, IBV_PORT_ACTIVE);
	end_close(&a);
	end_close(&b);
	pair_up(&a, &b, &rc_default);
	memcpy(a.buf, "port up", 8);
	assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, a.buf, 8, a.mr->lkey, (uintptr_t)b.buf,
			      b.mr->rkey, 2, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_SUCCESS);
	assert_memory_equal(b.buf, "port up", 8);
	/* Down and up faster than anyone looks is still both events. */
	assert_int_equal(sv_port_set_state(0, false), 0);
	assert_int_equal(sv_port_set_state(0, true), 0);
	assert_int_equal(next_event(a.ctx, 2000), IBV_EVENT_PORT_ERR);
	assert_int_equal(next_event(a.ctx, 2000), IBV_EVENT_PORT_ACTIVE);
	assert_int_equal((int)next_event(a.ctx, 100), -1);
	end_close(&a);
	end_close(&b);
}

/*
 * --fresh-ipc: a new IPC namespace, as on a fresh machine or in a
 * container, where the first SysV segment gets id 0 -- and its inode
 * number in /proc/PID/maps is its id.  Unprivileged, a user namespace
 * mapping only this user comes with it.
 */
static void enter_fresh_ipc_namespace(void)
{
	char map[64];
	uid_t uid = geteuid();
	gid_t gid = getegid();

	if (uid == 0 ? unshare(CLONE_NEWIPC) : unshare(CLONE_NEWUSER | CLONE_NEWIPC)) {
		perror("unshare");
		exit(1);
	}
	if (uid != 0) {
		int fd = open("/proc/self/setgroups", O_WRONLY);
		if (fd < 0 || write(fd, "deny", 4) != 4)
			exit(1);
		close(fd);
		snprintf(map, sizeof(map), "%u %u 1", (unsigned)uid, (unsigned)uid);
		fd = open("/proc/self/uid_map", O_WRONLY);
		if (fd < 0 || write(fd, map, strlen(map)) != (ssize_t)strlen(map))
			exit(1);
		close(fd);
		snprintf(map, sizeof(map), "%u %u 1", (unsigned)gid, (unsigned)gid);
		fd = open("/proc/self/gid_map", O_WRONLY);
		if (fd < 0 || write(fd, map, strlen(map)) != (ssize_t)strlen(map))
			exit(1);
		close(fd);
	}
}

/* The premise of --fresh-ipc: no segment exists, so the target's is id 0. */
static void test_ipc_namespace_is_fresh(void **state)
{
	char line[256];
	int lines = 0;
	FILE *f = fopen("/proc/sysvipc/shm", "r");

	(void)state;
	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		lines++;
	fclose(f);
	assert_int_equal(lines, 1);	/* the header only */
}

int main(int argc, char **argv)
{
	const char *skip = getenv("SV_TEST_SKIP");
	int n;

	/* A cmocka pattern of tests to leave out: scripts/test.sh's TSan run
	 * names those whose forked targets start threads. */
	if (skip && *skip)
		cmocka_set_skip_filter(skip);
	if (argc > 1 && !strcmp(argv[1], "--fresh-ipc")) {
		enter_fresh_ipc_namespace();
		devs = ibv_get_device_list(&n);
		const struct CMUnitTest fresh[] = {
			cmocka_unit_test(test_ipc_namespace_is_fresh),
			cmocka_unit_test(test_64mib_into_sleeping_sysv_shm),
		};
		int rc = cmocka_run_group_tests_name("fresh IPC namespace", fresh, NULL, NULL);
		ibv_free_device_list(devs);
		return rc;
	}
	devs = ibv_get_device_list(&n);
	if (argc > 1 && !strcmp(argv[1], "--held")) {
		const struct CMUnitTest held[] = {
			cmocka_unit_test(test_held_packet_leaves),
		};
		int rc = cmocka_run_group_tests_name("held packets", held, NULL, NULL);
		ibv_free_device_list(devs);
		return rc;
	}
	if (argc > 1 && !strcmp(argv[1], "--without-cma")) {
		forbid_cma();
		cma_refused = true;
		const struct CMUnitTest no_cma[] = {
			cmocka_unit_test(test_cma_is_refused),
			cmocka_unit_test(test_64mib_into_sleeping_private),
			cmocka_unit_test(test_64mib_into_sleeping_sysv_shm),
			cmocka_unit_test(test_64mib_into_sleeping_posix_shm),
			cmocka_unit_test(test_into_sleeping_device_memory),
			cmocka_unit_test(test_atomics_and_read),
		};
		int rc = cmocka_run_group_tests_name("without CMA", no_cma, NULL, NULL);
		ibv_free_device_list(devs);
		return rc;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_remote_access_errors),
		cmocka_unit_test(test_bad_lkey_is_loc_prot_err),
		cmocka_unit_test(test_short_receive_buffer),
		cmocka_unit_test(test_misaligned_atomic),
		cmocka_unit_test(test_atomics_and_read),
		cmocka_unit_test(test_read_then_long_write),
		cmocka_unit_test(test_rnr_retry_exhausted),
		cmocka_unit_test(test_rnr_infinite_then_recv),
		cmocka_unit_test(test_peer_gone_retry_exceeded),
		cmocka_unit_test(test_flush_on_err),
		cmocka_unit_test(test_err_mid_message),
		cmocka_unit_test(test_sqd_finishes_the_message),
		cmocka_unit_test(test_order_and_signaling),
		cmocka_unit_test(test_write_with_imm_and_inline),
		cmocka_unit_test(test_cq_overrun_event),
		cmocka_unit_test(test_srq_limit_event),
		cmocka_unit_test(test_solicited_events),
		cmocka_unit_test(test_ud_grh_and_qkey),
		cmocka_unit_test(test_ud_multicast),
		cmocka_unit_test(test_odp_page_unmapped_after_registration),
		cmocka_unit_test(test_receiver_exits_at_once),
		cmocka_unit_test(test_held_ack_is_sent),
		cmocka_unit_test(test_poller_cancelled),
		cmocka_unit_test(test_64mib_into_sleeping_private),
		cmocka_unit_test(test_64mib_into_sleeping_sysv_shm),
		cmocka_unit_test(test_64mib_into_sleeping_posix_shm),
		cmocka_unit_test(test_into_sleeping_device_memory),
		cmocka_unit_test(test_port_down_and_up),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	/* Only packets have ACKs to wait for; on shm a stopped target cannot
	 * serve the forced bounce path, and a post to it would wait. */
	const char *tr = getenv("SOFTVERBS_TRANSPORT");
	if (tr && !strcmp(tr, "udp")) {
		const struct CMUnitTest packets[] = {
			cmocka_unit_test(test_posts_wait_for_the_ack),
		};
		rc |= cmocka_run_group_tests_name("over packets", packets, NULL, NULL);
	}
	ibv_free_device_list(devs);
	return rc;
}
