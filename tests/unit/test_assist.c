/* SPDX-License-Identifier: MIT */
/*
 * Assisted copies (transport/shm/assist.c): a large WRITE or READ on
 * another process's private memory is moved partly by that process's
 * progress thread.  The target here is a forked process that makes no
 * verb call after connecting; SOFTVERBS_ASSIST=force makes its progress
 * thread take at least one chunk of every operation, so each case knows
 * the split happened (the target's ASSIST counter) and checks every byte,
 * across SGE boundaries on both sides.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <sys/socket.h>

#include "counters.h"
#include "nocma.h"
#include "pair.h"

#define REGION	(5u << 20)
#define AT	4099u		/* the target offset: no alignment to lean on */

struct exch {
	uint32_t qpn, rkey;
	uint32_t qpn2;		/* the target's second QP, for a second initiator */
	uint16_t lid;
	union ibv_gid gid;
	uint64_t addr;
};

enum op { CHECK, FILL, REFUSE, ASYNC, QUIT };

struct cmd {
	uint32_t op, off, len, seed;
};

struct reply {
	int64_t bad;		/* CHECK: the first wrong offset, or -1; ASYNC: the event, or -1 */
	uint64_t assisted;	/* the target's ASSIST bytes so far */
};

static uint8_t pattern(uint32_t seed, size_t off)
{
	return (uint8_t)(off * 131 + (off >> 12) + seed);
}

static void fill(char *p, size_t len, uint32_t seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (char)pattern(seed, i);
}

static int64_t first_bad(const char *p, size_t len, uint32_t seed)
{
	for (size_t i = 0; i < len; i++)
		if ((uint8_t)p[i] != pattern(seed, i))
			return (int64_t)i;
	return -1;
}

/* ---- the target: private memory, and no verb after connecting ---- */

static void target(int sock)
{
	struct end t;
	struct cmd c;
	char *mem = aligned_alloc(4096, REGION);

	end_open(&t, &rc_default);
	memset(mem, 0, REGION);
	struct ibv_mr *mr = ibv_reg_mr(t.pd, mem, REGION, ALL_ACCESS);
	struct ibv_qp_init_attr ia = { .send_cq = t.cq, .recv_cq = t.cq, .qp_type = IBV_QPT_RC,
				       .cap = { 4, 4, 1, 1, 0 } };
	struct ibv_qp *q2 = ibv_create_qp(t.pd, &ia);
	struct exch me = { t.qp->qp_num, mr ? mr->rkey : 0, q2 ? q2->qp_num : 0, t.port.lid, t.gid,
			   (uintptr_t)mem };
	struct exch peer;
	if (!mr || !q2 || write(sock, &me, sizeof(me)) != sizeof(me) ||
	    read(sock, &peer, sizeof(peer)) != sizeof(peer))
		_exit(2);
	struct end as_peer = { .port = t.port, .gid = peer.gid };
	as_peer.port.lid = peer.lid;
	connect_qp(t.qp, &as_peer, peer.qpn, &rc_default);
	connect_qp(q2, &as_peer, peer.qpn2, &rc_default);
	while (read(sock, &c, sizeof(c)) == sizeof(c)) {
		struct reply rep = { -1, 0 };
		switch (c.op) {
		case CHECK:
			rep.bad = first_bad(mem + c.off, c.len, c.seed);
			break;
		case FILL:
			fill(mem + c.off, c.len, c.seed);
			break;
		case REFUSE:
			forbid_cma();
			break;
		case ASYNC: {
			/* Only the progress thread delivers it: no verb here.
			 * A QP's event, past the port's. */
			struct pollfd pf = { t.ctx->async_fd, POLLIN, 0 };
			struct ibv_async_event ev;
			while (rep.bad < 0 && poll(&pf, 1, (int)c.len) == 1 &&
			       !ibv_get_async_event(t.ctx, &ev)) {
				if (ev.event_type < IBV_EVENT_DEVICE_FATAL)
					rep.bad = ev.event_type;
				ibv_ack_async_event(&ev);
			}
			break;
		}
		case QUIT:
			_exit(0);
		}
		rep.assisted = my_bytes(SV_PATH_ASSIST);
		if (write(sock, &rep, sizeof(rep)) != sizeof(rep))
			_exit(3);
	}
	_exit(4);
}

/* ---- the initiator ---- */

static int sock;
static pid_t tpid;
static struct end s, s2;
static struct exch x;
static char *big;
static struct ibv_mr *big_mr;

static struct reply ask(enum op op, uint32_t off, uint32_t len, uint32_t seed)
{
	struct cmd c = { op, off, len, seed };
	struct reply rep;

	assert_int_equal(write(sock, &c, sizeof(c)), sizeof(c));
	if (read(sock, &rep, sizeof(rep)) != sizeof(rep))
		assert_child_ok(tpid, "target");
	return rep;
}

static int setup(void **state)
{
	(void)state;
	int sp[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
	tpid = fix_fork();
	if (!tpid) {
		close(sp[0]);
		target(sp[1]);
	}
	close(sp[1]);
	sock = sp[0];
	end_open(&s, &rc_default);
	end_open(&s2, &rc_default);
	big = aligned_alloc(4096, REGION);
	big_mr = ibv_reg_mr(s.pd, big, REGION, ALL_ACCESS);
	assert_non_null(big_mr);
	assert_int_equal(read(sock, &x, sizeof(x)), sizeof(x));
	struct exch me = { s.qp->qp_num, s.mr->rkey, s2.qp->qp_num, s.port.lid, s.gid,
			   (uintptr_t)s.buf };
	assert_int_equal(write(sock, &me, sizeof(me)), sizeof(me));
	struct end peer = { .port = s.port, .gid = x.gid };
	peer.port.lid = x.lid;
	connect_qp(s.qp, &peer, x.qpn, &rc_default);
	connect_qp(s2.qp, &peer, x.qpn2, &rc_default);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	struct cmd c = { QUIT, 0, 0, 0 };

	assert_int_equal(write(sock, &c, sizeof(c)), sizeof(c));
	assert_child_ok(tpid, "target");
	ibv_dereg_mr(big_mr);
	free(big);
	end_close(&s);
	end_close(&s2);
	close(sock);
	return 0;
}

/* Three SGEs of odd lengths over `big`, with gaps between them; the
 * bytes they cover, in order, are the message. */
static const uint32_t sge_len[3] = { (1u << 20) + 13, (2u << 20) - 77, (1u << 20) + 64 };
#define MSG_LEN	((1u << 20) + 13 + (2u << 20) - 77 + (1u << 20) + 64)

static void sges(struct ibv_sge *sg)
{
	uint64_t at = (uintptr_t)big + 5;

	for (int i = 0; i < 3; i++) {
		sg[i] = (struct ibv_sge){ at, sge_len[i], big_mr->lkey };
		at += sge_len[i] + 4096 + 7;
	}
}

static void post_sges(enum ibv_wr_opcode op, uint64_t raddr)
{
	struct ibv_sge sg[3];
	struct ibv_send_wr wr = { .wr_id = op, .sg_list = sg, .num_sge = 3, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	sges(sg);
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = x.rkey;
	assert_int_equal(ibv_post_send(s.qp, &wr, &bad), 0);
	struct ibv_wc wc = poll_one(s.cq);
	assert_int_equal(wc.status, IBV_WC_SUCCESS);
	assert_int_equal(wc.wr_id, op);
}

/* The message as the SGEs scatter it: gathered back into msg. */
static void gather(char *msg)
{
	struct ibv_sge sg[3];
	size_t off = 0;

	sges(sg);
	for (int i = 0; i < 3; i++) {
		memcpy(msg + off, (void *)(uintptr_t)sg[i].addr, sg[i].length);
		off += sg[i].length;
	}
}

static void scatter(const char *msg)
{
	struct ibv_sge sg[3];
	size_t off = 0;

	sges(sg);
	for (int i = 0; i < 3; i++) {
		memcpy((void *)(uintptr_t)sg[i].addr, msg + off, sg[i].length);
		off += sg[i].length;
	}
}

/* WRITE of 4 MiB from three SGEs; the completion means every chunk is in,
 * the target's thread's included: an 8-byte READ of the message's last
 * bytes right after it (too small to be assisted) sees them. */
static void test_write(void **state)
{
	(void)state;
	char *msg = malloc(MSG_LEN);
	uint64_t before = ask(CHECK, 0, 0, 0).assisted;

	fill(msg, MSG_LEN, 1);
	scatter(msg);
	post_sges(IBV_WR_RDMA_WRITE, x.addr + AT);
	assert_int_equal(post(&s, IBV_WR_RDMA_READ, s.buf, 8, s.mr->lkey, x.addr + AT + MSG_LEN - 8,
			      x.rkey, 7, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(s.cq).status, IBV_WC_SUCCESS);
	assert_memory_equal(s.buf, msg + MSG_LEN - 8, 8);
	struct reply r = ask(CHECK, AT, MSG_LEN, 1);
	assert_int_equal(r.bad, -1);
	assert_true(r.assisted - before >= SHM_ASSIST_MIN_CHUNK);
	assert_true(r.assisted - before <= MSG_LEN);
	free(msg);
}

static void test_read(void **state)
{
	(void)state;
	char *msg = malloc(MSG_LEN);
	uint64_t before = ask(FILL, AT, MSG_LEN, 2).assisted;

	memset(big, 0, REGION);
	post_sges(IBV_WR_RDMA_READ, x.addr + AT);
	gather(msg);
	assert_int_equal(first_bad(msg, MSG_LEN, 2), -1);
	struct reply r = ask(CHECK, 0, 0, 0);
	assert_true(r.assisted - before >= SHM_ASSIST_MIN_CHUNK);
	free(msg);
}

/* Below SHM_ASSIST_MIN the initiator copies alone. */
static void test_small_alone(void **state)
{
	(void)state;
	uint64_t before = ask(CHECK, 0, 0, 0).assisted;

	fill(big, SHM_ASSIST_MIN - 1, 3);
	assert_int_equal(post(&s, IBV_WR_RDMA_WRITE, big, SHM_ASSIST_MIN - 1, big_mr->lkey, x.addr,
			      x.rkey, 3, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(s.cq).status, IBV_WC_SUCCESS);
	struct reply r = ask(CHECK, 0, SHM_ASSIST_MIN - 1, 3);
	assert_int_equal(r.bad, -1);
	assert_int_equal(r.assisted, before);
}

/* Atomics answered by the target's thread (every one, in force mode):
 * two initiators, each in its own thread and context, add to one counter;
 * every value a FETCH_ADD returned is distinct and the sum is exact. */
#define ADDS	2000
#define COUNTER	(REGION - 64)

struct adder {
	struct end *e;
	uint64_t *seen;		/* ADDS values FETCH_ADD returned */
};

static void *add_many(void *arg)
{
	struct adder *d = arg;

	for (int i = 0; i < ADDS; i++) {
		if (post(d->e, IBV_WR_ATOMIC_FETCH_AND_ADD, d->e->buf, 8, d->e->mr->lkey,
			 x.addr + COUNTER, x.rkey, (uint64_t)i, IBV_SEND_SIGNALED))
			return "post";
		struct ibv_wc wc = poll_one(d->e->cq);
		if (wc.status != IBV_WC_SUCCESS)
			return "status";
		memcpy(&d->seen[i], d->e->buf, 8);
	}
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x1 = *(const uint64_t *)a, x2 = *(const uint64_t *)b;

	return x1 < x2 ? -1 : x1 > x2;
}

static void test_atomics(void **state)
{
	(void)state;
	uint64_t *seen = calloc(2 * ADDS, sizeof(*seen)), v;
	struct adder d[2] = { { &s, seen }, { &s2, seen + ADDS } };
	pthread_t th;
	uint64_t before = ask(CHECK, 0, 0, 0).assisted;

	assert_int_equal(pthread_create(&th, NULL, add_many, &d[1]), 0);
	assert_null(add_many(&d[0]));
	void *r;
	assert_int_equal(pthread_join(th, &r), 0);
	assert_null(r);
	qsort(seen, 2 * ADDS, sizeof(*seen), cmp_u64);
	for (uint64_t i = 0; i < 2 * ADDS; i++)
		assert_int_equal(seen[i], i);
	/* CMP_SWP that fails and one that succeeds: each returns the value
	 * it found; a READ sees the swap. */
	struct ibv_sge sge = { (uintptr_t)s.buf, 8, s.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_ATOMIC_CMP_AND_SWP, .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	wr.wr.atomic.remote_addr = x.addr + COUNTER;
	wr.wr.atomic.rkey = x.rkey;
	uint64_t tries[2][2] = { { 7, 70 }, { 2 * ADDS, 77 } };
	for (int i = 0; i < 2; i++) {
		wr.wr.atomic.compare_add = tries[i][0];
		wr.wr.atomic.swap = tries[i][1];
		assert_int_equal(ibv_post_send(s.qp, &wr, &bad), 0);
		assert_int_equal(poll_one(s.cq).status, IBV_WC_SUCCESS);
		memcpy(&v, s.buf, 8);
		assert_int_equal(v, 2 * ADDS);
	}
	assert_int_equal(post(&s, IBV_WR_RDMA_READ, s.buf, 8, s.mr->lkey, x.addr + COUNTER, x.rkey,
			      10, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(s.cq).status, IBV_WC_SUCCESS);
	memcpy(&v, s.buf, 8);
	assert_int_equal(v, 77);
	/* Every one of them by the target's thread. */
	assert_int_equal(ask(CHECK, 0, 0, 0).assisted - before, 8 * (2 * ADDS + 2));
	free(seen);
}

/* A stream of atomics keeps the target's thread polling; its other duties
 * still run: an error a peer's request leaves on another of the target's
 * QPs reaches the target as an async event while the stream goes on. */
static _Atomic bool stop_stream;
static _Atomic int streamed;

static void *stream(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop_stream)) {
		if (post(&s, IBV_WR_ATOMIC_FETCH_AND_ADD, s.buf, 8, s.mr->lkey, x.addr + COUNTER, x.rkey,
			 1, IBV_SEND_SIGNALED) || poll_one(s.cq).status != IBV_WC_SUCCESS)
			return "atomic";
		atomic_fetch_add(&streamed, 1);
	}
	return NULL;
}

static void test_events_while_polling(void **state)
{
	(void)state;
	pthread_t th;
	void *r;

	assert_int_equal(pthread_create(&th, NULL, stream, NULL), 0);
	while (atomic_load(&streamed) < 1000)
		sched_yield();
	/* A WRITE with a key the target never issued: its QP goes to ERR,
	 * and the target hears of it from its progress thread. */
	assert_int_equal(post(&s2, IBV_WR_RDMA_WRITE, s2.buf, 8, s2.mr->lkey, x.addr, x.rkey + 0x100000,
			      11, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(s2.cq).status, IBV_WC_REM_ACCESS_ERR);
	/* The stream goes on until the event is in. */
	struct reply rep = ask(ASYNC, 0, 2000, 0);
	atomic_store(&stop_stream, true);
	assert_int_equal(pthread_join(th, &r), 0);
	assert_null(r);
	assert_int_equal(rep.bad, IBV_EVENT_QP_ACCESS_ERR);
}

/* A target the kernel will not let copy into peers: its chunk fails, the
 * initiator copies the operation again alone, and no later operation
 * waits for it. */
static void test_target_refused(void **state)
{
	(void)state;
	char *msg = malloc(MSG_LEN);
	uint64_t before = ask(REFUSE, 0, 0, 0).assisted;

	for (uint32_t seed = 4; seed < 6; seed++) {
		fill(msg, MSG_LEN, seed);
		scatter(msg);
		post_sges(IBV_WR_RDMA_WRITE, x.addr + AT);
		struct reply r = ask(CHECK, AT, MSG_LEN, seed);
		assert_int_equal(r.bad, -1);
		assert_int_equal(r.assisted, before);
	}
	free(msg);
}

int main(void)
{
	/* Before the first verb, which reads the settings. */
	setenv("SOFTVERBS_ASSIST", "force", 1);
	devs = ibv_get_device_list(NULL);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_write),
		cmocka_unit_test(test_read),
		cmocka_unit_test(test_small_alone),
		cmocka_unit_test(test_atomics),
		cmocka_unit_test(test_events_while_polling),
		cmocka_unit_test(test_target_refused),
	};
	int r = cmocka_run_group_tests(tests, setup, teardown);
	ibv_free_device_list(devs);
	return r;
}
