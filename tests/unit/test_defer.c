/* SPDX-License-Identifier: MIT */
/*
 * Deferred placement (transport/shm/defer.c): a small SEND into another
 * process's private memory is placed by the receiver when it polls.  The
 * receiver here is a forked process that does only what the parent asks;
 * every case checks what the memory holds *before* the receiver polls,
 * which is what the guards are for: a READ or WRITE after the SEND,
 * deregistration, a reset that drops the completion, a second context,
 * and more messages than there are slots.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>

#include "counters.h"
#include "helpers.h"
#include "pair.h"
#include "transport/shm/shm.h"

struct exch {
	uint32_t qpn, rkey;
	uint16_t lid;
	union ibv_gid gid;
	uint64_t addr;
};

enum op { POST, POST2, PEEK, POLL, DEREG2, SECOND_CONTEXT, CLOSE_SECOND, RESET, DESTROY, QUIT };

struct cmd {
	uint32_t op, off, len, n;
};

struct reply {
	int32_t status;		/* a completion's, or -1 for none */
	uint32_t qpn;		/* DESTROY: the new QP */
	uint64_t wr_id;
	uint32_t byte_len;
	char data[32];		/* the receiver's memory at off, as it is now */
};

/* ---- the receiver: private memory, and no verb unless asked ---- */

static void receiver(int sock)
{
	struct end r;
	struct cmd c;
	struct ibv_context *second = NULL;
	char *buf2 = aligned_alloc(4096, 4096);

	end_open(&r, &rc_default);	/* aligned_alloc: private memory */
	/* Room for more unpolled receives than there are slots. */
	ibv_destroy_qp(r.qp);
	struct ibv_qp_init_attr ia = { .send_cq = r.cq, .recv_cq = r.cq, .qp_type = IBV_QPT_RC,
				       .cap = { 16, 2 * SHM_DEFER_SLOTS, 1, 1, 0 } };
	r.qp = ibv_create_qp(r.pd, &ia);
	if (!r.qp)
		_exit(1);
	memset(buf2, 0, 4096);
	struct ibv_mr *mr2 = ibv_reg_mr(r.pd, buf2, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct exch me = { r.qp->qp_num, r.mr->rkey, r.port.lid, r.gid, (uintptr_t)r.buf };
	struct exch peer;
	if (!mr2 || write(sock, &me, sizeof(me)) != sizeof(me) ||
	    read(sock, &peer, sizeof(peer)) != sizeof(peer))
		_exit(2);
	struct end as_peer = { .port = r.port, .gid = peer.gid };
	as_peer.port.lid = peer.lid;
	connect_qp(r.qp, &as_peer, peer.qpn, &rc_default);
	while (read(sock, &c, sizeof(c)) == sizeof(c)) {
		struct reply rep = { .status = -1 };
		struct ibv_wc wc;
		char *at = (c.op == POST2 || c.op == DEREG2 ? buf2 : r.buf) + c.off;
		switch (c.op) {
		case POST:
			for (uint32_t i = 0; i < c.n; i++)
				post_recv(&r, at + i * c.len, c.len, c.off + i * c.len);
			break;
		case POST2: {
			struct ibv_sge sge = { (uintptr_t)at, c.len, mr2->lkey };
			struct ibv_recv_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *bad;
			if (ibv_post_recv(r.qp, &wr, &bad))
				_exit(3);
			break;
		}
		case POLL:
			wc = poll_one(r.cq);
			rep = (struct reply){ wc.status, 0, wc.wr_id, wc.byte_len, "" };
			break;
		case DEREG2:
			if (ibv_dereg_mr(mr2))
				_exit(4);
			break;
		case SECOND_CONTEXT:
			if (!(second = ibv_open_device(devs[0])))
				_exit(5);
			break;
		case CLOSE_SECOND:
			if (ibv_close_device(second))
				_exit(5);
			break;
		case RESET: {
			/* The completion goes with the reset; the data lands
			 * when the poller drops it.  Then back to RTS. */
			struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };
			if (ibv_modify_qp(r.qp, &a, IBV_QP_STATE))
				_exit(6);
			rep.status = ibv_poll_cq(r.cq, 1, &wc);
			memcpy(rep.data, at, sizeof(rep.data));
			connect_qp(r.qp, &as_peer, peer.qpn, &rc_default);
			if (write(sock, &rep, sizeof(rep)) != sizeof(rep))
				_exit(7);
			continue;
		}
		case DESTROY:
			/* The QP and then its CQ go with a completion unpolled:
			 * the data lands all the same.  Then a new pair. */
			if (ibv_destroy_qp(r.qp) || ibv_destroy_cq(r.cq))
				_exit(9);
			memcpy(rep.data, at, sizeof(rep.data));
			r.cq = ibv_create_cq(r.ctx, 256, NULL, NULL, 0);
			ia.send_cq = ia.recv_cq = r.cq;
			r.qp = r.cq ? ibv_create_qp(r.pd, &ia) : NULL;
			if (!r.qp)
				_exit(10);
			connect_qp(r.qp, &as_peer, peer.qpn, &rc_default);
			rep.qpn = r.qp->qp_num;
			if (write(sock, &rep, sizeof(rep)) != sizeof(rep))
				_exit(7);
			continue;
		case QUIT:
			_exit(0);
		}
		memcpy(rep.data, at, sizeof(rep.data));
		if (write(sock, &rep, sizeof(rep)) != sizeof(rep))
			_exit(7);
	}
	_exit(8);
}

/* ---- the sender ---- */

static int sock;
static pid_t rpid;
static struct end s;
static struct exch x;

static struct reply ask(enum op op, uint32_t off, uint32_t len, uint32_t n)
{
	struct cmd c = { op, off, len, n };
	struct reply rep;

	assert_int_equal(write(sock, &c, sizeof(c)), sizeof(c));
	if (read(sock, &rep, sizeof(rep)) != sizeof(rep))
		assert_child_ok(rpid, "receiver");
	return rep;
}

static int setup(void **state)
{
	(void)state;
	int sp[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
	rpid = fix_fork();
	if (!rpid) {
		close(sp[0]);
		receiver(sp[1]);
	}
	close(sp[1]);
	sock = sp[0];
	end_open(&s, &rc_default);
	assert_int_equal(read(sock, &x, sizeof(x)), sizeof(x));
	struct exch me = { s.qp->qp_num, s.mr->rkey, s.port.lid, s.gid, (uintptr_t)s.buf };
	assert_int_equal(write(sock, &me, sizeof(me)), sizeof(me));
	struct end peer = { .port = s.port, .gid = x.gid };
	peer.port.lid = x.lid;
	connect_qp(s.qp, &peer, x.qpn, &rc_default);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	struct cmd c = { QUIT, 0, 0, 0 };

	assert_int_equal(write(sock, &c, sizeof(c)), sizeof(c));
	assert_child_ok(rpid, "receiver");
	end_close(&s);
	close(sock);
	return 0;
}

/* A signaled SEND of a string (with its NUL) that completes. */
static void send_str(const char *str, uint32_t len)
{
	strncpy(s.buf, str, len);
	assert_int_equal(post(&s, IBV_WR_SEND, s.buf, len, s.mr->lkey, 0, 0, 0x5e, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(s.cq).status, IBV_WC_SUCCESS);
}

/* The sender's SEND completed; the receiver has not polled.  A READ of
 * the buffer returns the message (the READ placed it), and the
 * receiver's completion finds it placed. */
static void test_read_after_send(void **state)
{
	(void)state;
	uint64_t deferred = my_bytes(SV_PATH_DEFER);

	ask(POST, 0, 32, 1);
	send_str("read after send", 32);
	assert_int_equal(my_bytes(SV_PATH_DEFER) - deferred, 32);	/* no system call */
	assert_int_equal(post(&s, IBV_WR_RDMA_READ, s.buf + 512, 32, s.mr->lkey, x.addr, x.rkey, 1,
			      IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(s.cq).status, IBV_WC_SUCCESS);
	assert_string_equal(s.buf + 512, "read after send");
	struct reply r = ask(POLL, 0, 0, 0);
	assert_int_equal(r.status, IBV_WC_SUCCESS);
	assert_int_equal(r.wr_id, 0);
	assert_int_equal(r.byte_len, 32);
	assert_string_equal(r.data, "read after send");
}

/* A WRITE after a SEND into the same buffer wins, even though the
 * receiver polls the SEND's completion after both. */
static void test_write_after_send(void **state)
{
	(void)state;
	ask(POST, 64, 32, 1);
	send_str("the send", 32);
	strcpy(s.buf + 512, "the write");
	assert_int_equal(post(&s, IBV_WR_RDMA_WRITE, s.buf + 512, 10, s.mr->lkey, x.addr + 64, x.rkey,
			      2, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(s.cq).status, IBV_WC_SUCCESS);
	struct reply r = ask(POLL, 64, 0, 0);
	assert_int_equal(r.status, IBV_WC_SUCCESS);
	assert_int_equal(r.wr_id, 64);
	assert_string_equal(r.data, "the write");
}

/* Deregistering the receive buffer's MR places the message before it
 * returns; the completion polled afterwards writes nothing. */
static void test_dereg_places(void **state)
{
	(void)state;
	ask(POST2, 0, 32, 1);
	send_str("before dereg", 32);
	struct reply r = ask(DEREG2, 0, 0, 0);
	assert_string_equal(r.data, "before dereg");
	r = ask(POLL, 0, 0, 0);
	assert_int_equal(r.status, IBV_WC_SUCCESS);
	assert_int_equal(r.wr_id, 2);
}

/* A reset takes the completion back; the message still lands (the slot
 * is placed and freed as the poller drops the entry). */
static void test_reset_places(void **state)
{
	(void)state;
	ask(POST, 256, 32, 1);
	send_str("reset", 32);
	struct reply r = ask(RESET, 256, 0, 0);
	assert_int_equal(r.status, 0);		/* no completion */
	assert_string_equal(r.data, "reset");
}

/* Destroying the QP and its CQ with the completion unpolled still places
 * the message (and frees its slot: the next test counts them). */
static void test_destroy_places(void **state)
{
	(void)state;
	ask(POST, 320, 32, 1);
	send_str("destroyed unpolled", 32);
	struct reply r = ask(DESTROY, 320, 0, 0);
	assert_string_equal(r.data, "destroyed unpolled");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };
	assert_int_equal(ibv_modify_qp(s.qp, &a, IBV_QP_STATE), 0);
	struct end peer = { .port = s.port, .gid = x.gid };
	peer.port.lid = x.lid;
	connect_qp(s.qp, &peer, r.qpn, &rc_default);
	x.qpn = r.qpn;
}

/* More unpolled messages than slots: the rest are placed by the sender
 * (CMA), all arrive, and every slot is free again once polled. */
static void test_more_than_slots(void **state)
{
	(void)state;
	enum { N = SHM_DEFER_SLOTS + 36, LEN = 16 };
	uint64_t deferred = my_bytes(SV_PATH_DEFER), cma = my_bytes(SV_PATH_CMA);
	char msg[LEN];

	ask(POST, 1024, LEN, N);
	for (int i = 0; i < N; i++) {
		snprintf(msg, sizeof(msg), "m%03d", i);
		send_str(msg, LEN);
	}
	assert_int_equal(my_bytes(SV_PATH_DEFER) - deferred, SHM_DEFER_SLOTS * LEN);
	assert_int_equal(my_bytes(SV_PATH_CMA) - cma, (N - SHM_DEFER_SLOTS) * LEN);
	for (int i = 0; i < N; i++) {
		struct reply r = ask(POLL, 1024 + (uint32_t)i * LEN, 0, 0);
		snprintf(msg, sizeof(msg), "m%03d", i);
		assert_int_equal(r.status, IBV_WC_SUCCESS);
		assert_int_equal(r.wr_id, 1024 + (uint64_t)i * LEN);
		assert_string_equal(r.data, msg);
	}
	deferred = my_bytes(SV_PATH_DEFER);
	ask(POST, 1024, LEN, SHM_DEFER_SLOTS);
	for (int i = 0; i < SHM_DEFER_SLOTS; i++)
		send_str("again", LEN);
	assert_int_equal(my_bytes(SV_PATH_DEFER) - deferred, SHM_DEFER_SLOTS * LEN);
	for (int i = 0; i < SHM_DEFER_SLOTS; i++)
		assert_int_equal(ask(POLL, 1024, 0, 0).status, IBV_WC_SUCCESS);
}

/* A second context in the receiving process could reach the buffer
 * through keys of its own: opening it places what is pending and stops
 * deferral there; closing it again resumes it. */
static void test_second_context_places(void **state)
{
	(void)state;
	ask(POST, 4096, 32, 2);
	send_str("before the second", 32);
	struct reply r = ask(SECOND_CONTEXT, 4096, 0, 0);
	assert_string_equal(r.data, "before the second");
	uint64_t deferred = my_bytes(SV_PATH_DEFER);
	send_str("after the second", 32);
	assert_int_equal(my_bytes(SV_PATH_DEFER), deferred);
	assert_string_equal(ask(PEEK, 4096 + 32, 0, 0).data, "after the second");
	assert_int_equal(ask(POLL, 0, 0, 0).status, IBV_WC_SUCCESS);
	assert_int_equal(ask(POLL, 0, 0, 0).status, IBV_WC_SUCCESS);
	ask(CLOSE_SECOND, 0, 0, 0);
	ask(POST, 4096, 32, 1);
	send_str("alone again", 32);
	assert_int_equal(my_bytes(SV_PATH_DEFER) - deferred, 32);
	assert_string_equal(ask(POLL, 4096, 0, 0).data, "alone again");
}

/* ---- a placer that stops: overtaken only once its process is dead ---- */

struct fake_seg {
	struct shm_hdr *h;
	struct shm_defer_slot *s;
	char dst[8];
	bool overtaken;		/* the placer found the bytes copied by another */
};

/* A segment of this process with only a deferred ring and an idle bounce
 * mailbox, and slot 0 claimed (PLACING) by `placer`, holding 8 bytes for
 * dst. */
static void fake_seg(struct fake_seg *f, int32_t placer)
{
	size_t hl = (sizeof(struct shm_hdr) + 63) & ~(size_t)63;
	size_t dl = (sizeof(struct shm_defer) + 63) & ~(size_t)63;

	size_t len = (hl + dl + sizeof(struct shm_bounce) + 63) & ~(size_t)63;

	f->h = aligned_alloc(64, len);
	memset(f->h, 0, len);
	f->h->pid = getpid();
	f->h->defer_off = hl;
	f->h->bounce_off = hl + dl;
	sv_seg_defer_init(f->h);
	memset(f->dst, 0, sizeof(f->dst));
	f->overtaken = false;
	f->s = &((struct shm_defer *)shm_at(f->h, hl))->slot[0];
	f->s->niov = 1;
	f->s->len = 8;
	f->s->iov0.addr = (uintptr_t)f->dst;
	f->s->iov0.len = 8;
	memcpy(f->s->data, "deferred", 8);
	atomic_store(&f->s->placer, placer);
	atomic_store(&f->s->state, SHM_DEFER_PLACING);
}

static double seconds_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

static void test_dead_placer_overtaken(void **state)
{
	struct fake_seg f;
	struct timespec t0;
	pid_t pid = fix_fork();

	(void)state;
	if (!pid)
		_exit(0);
	assert_int_equal(waitpid(pid, NULL, 0), pid);	/* dead, reaped */
	fake_seg(&f, pid);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	sv_defer_place(f.h, NULL, 1);
	assert_memory_equal(f.dst, "deferred", 8);
	assert_true(seconds_since(&t0) >= 1.0);
	assert_int_equal(atomic_load(&f.s->state), SHM_DEFER_FREE);
	free(f.h);
}

static void *slow_placer(void *arg)
{
	struct fake_seg *f = arg;

	usleep(1500000);	/* past the waiter's first look at the placer */
	f->overtaken = memcmp(f->dst, "\0\0\0\0\0\0\0\0", 8) != 0;
	memcpy(f->dst, "placer!!", 8);
	atomic_store_explicit(&f->s->state, SHM_DEFER_PLACED, memory_order_release);
	return NULL;
}

static void test_live_placer_waited_for(void **state)
{
	struct fake_seg f;
	pthread_t t;

	(void)state;
	fake_seg(&f, getpid());
	assert_int_equal(pthread_create(&t, NULL, slow_placer, &f), 0);
	sv_defer_place(f.h, NULL, 1);
	/* Only the placer's copy: the waiter did not copy again. */
	assert_memory_equal(f.dst, "placer!!", 8);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_false(f.overtaken);
	assert_int_equal(atomic_load(&f.s->state), SHM_DEFER_FREE);
	free(f.h);
}

int main(void)
{
	devs = ibv_get_device_list(NULL);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_read_after_send),
		cmocka_unit_test(test_write_after_send),
		cmocka_unit_test(test_dereg_places),
		cmocka_unit_test(test_reset_places),
		cmocka_unit_test(test_destroy_places),
		cmocka_unit_test(test_more_than_slots),
		cmocka_unit_test(test_second_context_places),
		cmocka_unit_test(test_dead_placer_overtaken),
		cmocka_unit_test(test_live_placer_waited_for),
	};
	int r = cmocka_run_group_tests(tests, setup, teardown);
	ibv_free_device_list(devs);
	return r;
}
