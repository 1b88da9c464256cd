/* SPDX-License-Identifier: MIT */
/*
 * The lock-free rings of core/seg.h, driven by threads as
 * initiators of any process drive them:
 *  - a CQ's producers (sv_cq_push) against the owner polling and
 *    resizing: every completion arrives exactly once and in each
 *    producer's order, and a full ring refuses (overrun), never overwrites;
 *  - a receive queue's consumers (sv_rq_take) against the owner posting:
 *    every WQE is taken exactly once, each consumer sees them in posting
 *    order, and a full queue refuses the post (ENOMEM);
 *  - a CQ's producer against the owner re-arming it: no event is lost;
 *  - the owner's own threads polling one CQ, and posting to one receive
 *    queue, at once: each completion is returned once, and each WQE is
 *    taken once (the owner-only locks, sv_own_lock);
 *  - the bounce mailbox's claim: a late server thread never serves a
 *    request again.
 * ThreadSanitizer runs this test too.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdio.h>

#include "helpers.h"
#include "sv.h"
#include "transport/shm/shm.h"

#define PRODUCERS 3
#define PER_PRODUCER 20000

struct producer {
	struct sv_cq *cq;
	uint32_t id;
	_Atomic uint32_t *refused;
};

static void *produce(void *arg)
{
	struct producer *p = arg;
	struct shm_hdr *h = p->cq->ctx->seg.h;

	for (uint32_t i = 0; i < PER_PRODUCER;) {
		struct shm_cqe e = { .wr_id = (uint64_t)p->id << 32 | i, .qp_num = p->id,
				     .opcode = IBV_WC_RECV };
		/* A full ring refuses; this producer then tries again, as a
		 * retransmission would. */
		if (sv_cq_push(h, p->cq->sh, &e))
			i++;
		else
			atomic_fetch_add(p->refused, 1);
	}
	return NULL;
}

static void test_producers_poller_resize(void **state)
{
	struct fix *f = *state;
	struct ibv_cq *ibcq = ibv_create_cq(f->ctx, 16, NULL, NULL, 0);
	struct sv_cq *cq = sv_cq(ibcq);
	_Atomic uint32_t refused = 0;
	struct producer p[PRODUCERS];
	pthread_t t[PRODUCERS];
	uint32_t next[PRODUCERS] = { 0 };

	for (uint32_t i = 0; i < PRODUCERS; i++) {
		p[i] = (struct producer){ cq, i, &refused };
		assert_int_equal(pthread_create(&t[i], NULL, produce, &p[i]), 0);
	}
	uint32_t got = 0, resizes = 0;
	while (got < PRODUCERS * PER_PRODUCER) {
		struct ibv_wc wc[8];
		int n = ibv_poll_cq(ibcq, 8, wc);
		assert_true(n >= 0);
		for (int k = 0; k < n; k++) {
			uint32_t id = (uint32_t)(wc[k].wr_id >> 32), seq = (uint32_t)wc[k].wr_id;
			assert_true(id < PRODUCERS);
			if (seq != next[id])
				fail_msg("producer %u: got %u, expected %u", id, seq, next[id]);
			next[id]++;
		}
		got += (uint32_t)n;
		/* Grow and shrink the ring under the producers now and then;
		 * a shrink below what it holds is refused. */
		if (got / 200 > resizes) {
			resizes++;
			int r = ibv_resize_cq(ibcq, resizes % 2 ? 64 : 16);
			assert_true(r == 0 || r == EINVAL);
		}
	}
	for (uint32_t i = 0; i < PRODUCERS; i++)
		assert_int_equal(pthread_join(t[i], NULL), 0);
	struct ibv_wc wc;
	assert_int_equal(ibv_poll_cq(ibcq, 1, &wc), 0);
	assert_true(resizes >= 250);
	printf("# %u completions, %u refused as overruns, %u resizes\n", got,
	       (unsigned)atomic_load(&refused), resizes);
	assert_int_equal(ibv_destroy_cq(ibcq), 0);
}

static void test_full_ring_refuses(void **state)
{
	struct fix *f = *state;
	struct ibv_cq *ibcq = ibv_create_cq(f->ctx, 4, NULL, NULL, 0);
	struct sv_cq *cq = sv_cq(ibcq);
	struct shm_hdr *h = cq->ctx->seg.h;
	struct ibv_wc wc[8];

	/* Several laps: the slots' sequence numbers wrap with the ring. */
	for (uint64_t lap = 0; lap < 5; lap++) {
		for (uint64_t i = 0; i < 4; i++) {
			struct shm_cqe e = { .wr_id = lap * 10 + i, .opcode = IBV_WC_SEND };
			assert_true(sv_cq_push(h, cq->sh, &e));
		}
		struct shm_cqe extra = { .wr_id = 99 };
		assert_false(sv_cq_push(h, cq->sh, &extra));
		assert_int_equal(ibv_poll_cq(ibcq, 8, wc), 4);
		for (int i = 0; i < 4; i++)
			assert_int_equal(wc[i].wr_id, lap * 10 + (uint64_t)i);
	}
	assert_int_equal(ibv_destroy_cq(ibcq), 0);
}

/* Arming races publishing (ibv_req_notify_cq(3)): the owner drains,
 * re-arms and drains again, as applications do, while a producer pushes
 * one completion at a time, each a random moment after the owner has
 * taken the one before -- so around the arm.  Either the producer sees
 * the arm and raises an event, or the second drain sees its completion;
 * a lost one leaves the owner waiting (its poll(2) has a deadline). */
#define EVENTS 3000

static _Atomic uint32_t drained;

static void *produce_spaced(void *arg)
{
	struct producer *p = arg;
	struct shm_hdr *h = p->cq->ctx->seg.h;
	unsigned seed = 7;

	for (uint32_t i = 0; i < EVENTS; i++) {
		struct shm_cqe e = { .wr_id = i, .opcode = IBV_WC_RECV };
		while (atomic_load(&drained) < i)
			;
		for (volatile unsigned k = rand_r(&seed) % 300; k; k--)
			;
		while (!sv_cq_push(h, p->cq->sh, &e))
			;
	}
	return NULL;
}

static void test_arm_races_push(void **state)
{
	struct fix *f = *state;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(f->ctx);
	struct ibv_cq *ibcq = ibv_create_cq(f->ctx, EVENTS + 1, NULL, ch, 0);
	_Atomic uint32_t refused = 0;
	struct producer p = { sv_cq(ibcq), 0, &refused };
	pthread_t t;
	uint32_t got = 0, events = 0;

	atomic_store(&drained, 0);
	assert_int_equal(ibv_req_notify_cq(ibcq, 0), 0);
	assert_int_equal(pthread_create(&t, NULL, produce_spaced, &p), 0);
	while (got < EVENTS) {
		struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
		if (poll(&pfd, 1, 10000) != 1)
			fail_msg("no event after %u of %u completions: a notification was lost", got,
				 EVENTS);
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		assert_int_equal(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
		events++;
		for (int pass = 0; pass < 2; pass++) {
			struct ibv_wc wc[16];
			int n;
			while ((n = ibv_poll_cq(ibcq, 16, wc)) > 0)
				for (int k = 0; k < n; k++, got++)
					assert_int_equal(wc[k].wr_id, got);
			atomic_store(&drained, got);
			if (!pass)
				assert_int_equal(ibv_req_notify_cq(ibcq, 0), 0);
		}
	}
	assert_int_equal(pthread_join(t, NULL), 0);
	ibv_ack_cq_events(ibcq, events);
	printf("# %u completions, %u events\n", got, events);
	assert_int_equal(ibv_destroy_cq(ibcq), 0);
	assert_int_equal(ibv_destroy_comp_channel(ch), 0);
}

#define CONSUMERS 3
#define WQES 30000

struct consumer {
	struct sv_qp *qp;
	_Atomic uint32_t *taken;
	uint8_t *seen;
};

static void *consume(void *arg)
{
	struct consumer *c = arg;
	union { struct shm_rwqe w; char buf[sizeof(struct shm_rwqe) + 4 * sizeof(struct ibv_sge)]; } rw;
	uint64_t last = 0;

	while (atomic_load(c->taken) < WQES) {
		if (!sv_rq_take(c->qp->ctx->seg.h, c->qp->rq, &rw.w))
			continue;
		/* One WQE's fields travel together: its SGE names its wr_id. */
		assert_int_equal(rw.w.num_sge, 1);
		assert_int_equal(rw.w.sge[0].addr, rw.w.wr_id * 8);
		if (rw.w.wr_id <= last && last)
			fail_msg("wr_id %llu after %llu", (unsigned long long)rw.w.wr_id,
				 (unsigned long long)last);
		last = rw.w.wr_id;
		c->seen[rw.w.wr_id - 1]++;
		atomic_fetch_add(c->taken, 1);
	}
	return NULL;
}

static void test_rq_consumers(void **state)
{
	struct fix *f = *state;
	struct ibv_qp *ibqp = fix_qp(f, IBV_QPT_RC);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	assert_int_equal(ibv_modify_qp(ibqp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				       IBV_QP_ACCESS_FLAGS), 0);
	struct sv_qp *qp = sv_qp(ibqp);
	_Atomic uint32_t taken = 0;
	uint8_t *seen = calloc(WQES, 1);
	struct consumer c[CONSUMERS];
	pthread_t t[CONSUMERS];

	for (int i = 0; i < CONSUMERS; i++) {
		c[i] = (struct consumer){ qp, &taken, seen };
		assert_int_equal(pthread_create(&t[i], NULL, consume, &c[i]), 0);
	}
	uint32_t full = 0;
	for (uint64_t id = 1; id <= WQES;) {
		struct ibv_sge sge = { id * 8, 8, 0 };
		struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
		int r = ibv_post_recv(ibqp, &wr, &bad);
		if (r == 0)
			id++;
		else if (r == ENOMEM)
			full++;
		else
			fail_msg("post_recv: %d", r);
	}
	for (int i = 0; i < CONSUMERS; i++)
		assert_int_equal(pthread_join(t[i], NULL), 0);
	for (uint32_t i = 0; i < WQES; i++)
		if (seen[i] != 1)
			fail_msg("wr_id %u taken %u times", i + 1, seen[i]);
	printf("# %u WQEs taken once each, %u posts refused as full\n", WQES, full);
	free(seen);
	assert_int_equal(ibv_destroy_qp(ibqp), 0);
}

/*
 * The owner's threads share a CQ's poll and a receive queue's post.  Each
 * round fills the queue first and then starts both threads at a barrier,
 * so that on two cores they run at once and meet on every entry.
 */
#define OWNER_THREADS 2
#define PER_ROUND 8000
#define ROUNDS 200

struct sharer {
	pthread_barrier_t *go;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint64_t first;			/* a poster posts first, first + OWNER_THREADS, ... */
	uint8_t *seen;			/* per wr_id, counted under no lock: per thread */
	int err;			/* a failure, checked by the main thread */
};

static void *poll_shared(void *arg)
{
	struct sharer *s = arg;
	struct ibv_wc wc;

	pthread_barrier_wait(s->go);
	while (ibv_poll_cq(s->cq, 1, &wc) == 1) {
		if (wc.wr_id >= PER_ROUND) {
			s->err = EPROTO;	/* a completion never pushed */
			break;
		}
		s->seen[wc.wr_id]++;
	}
	return NULL;
}

static void *post_shared(void *arg)
{
	struct sharer *s = arg;

	pthread_barrier_wait(s->go);
	for (uint64_t id = s->first; id < PER_ROUND; id += OWNER_THREADS) {
		struct ibv_sge sge = { (id + 1) * 8, 8, 0 };
		struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
		if ((s->err = ibv_post_recv(s->qp, &wr, &bad)))
			break;
	}
	return NULL;
}

static void test_owner_threads_share(void **state)
{
	struct fix *f = *state;
	struct ibv_cq *ibcq = ibv_create_cq(f->ctx, PER_ROUND, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = f->cq, .recv_cq = f->cq, .qp_type = IBV_QPT_RC,
				       .cap = { 1, PER_ROUND, 1, 1, 0 } };
	struct ibv_qp *ibqp = ibv_create_qp(f->pd, &ia);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	assert_int_equal(ibv_modify_qp(ibqp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				       IBV_QP_ACCESS_FLAGS), 0);
	struct sv_qp *qp = sv_qp(ibqp);
	pthread_barrier_t go;
	struct sharer s[OWNER_THREADS];
	pthread_t t[OWNER_THREADS];
	uint8_t *seen = malloc((size_t)OWNER_THREADS * PER_ROUND);
	union { struct shm_rwqe w; char buf[sizeof(struct shm_rwqe) + 4 * sizeof(struct ibv_sge)]; } rw;

	assert_int_equal(pthread_barrier_init(&go, NULL, OWNER_THREADS), 0);
	for (int round = 0; round < ROUNDS; round++) {
		/* Both threads poll one CQ: each completion returned once. */
		for (uint64_t id = 0; id < PER_ROUND; id++) {
			struct shm_cqe e = { .wr_id = id, .opcode = IBV_WC_RECV };
			assert_true(sv_cq_push(sv_cq(ibcq)->ctx->seg.h, sv_cq(ibcq)->sh, &e));
		}
		memset(seen, 0, (size_t)OWNER_THREADS * PER_ROUND);
		for (int i = 0; i < OWNER_THREADS; i++) {
			s[i] = (struct sharer){ .go = &go, .cq = ibcq, .seen = seen + i * PER_ROUND };
			assert_int_equal(pthread_create(&t[i], NULL, poll_shared, &s[i]), 0);
		}
		for (int i = 0; i < OWNER_THREADS; i++) {
			assert_int_equal(pthread_join(t[i], NULL), 0);
			assert_int_equal(s[i].err, 0);
		}
		for (uint32_t id = 0; id < PER_ROUND; id++)
			if (seen[id] + seen[PER_ROUND + id] != 1)
				fail_msg("round %d: completion %u returned %u times", round, id,
					 seen[id] + seen[PER_ROUND + id]);
		/* Both threads post to one receive queue: each WQE taken once. */
		for (int i = 0; i < OWNER_THREADS; i++) {
			s[i] = (struct sharer){ .go = &go, .qp = ibqp, .first = (uint64_t)i };
			assert_int_equal(pthread_create(&t[i], NULL, post_shared, &s[i]), 0);
		}
		for (int i = 0; i < OWNER_THREADS; i++) {
			assert_int_equal(pthread_join(t[i], NULL), 0);
			assert_int_equal(s[i].err, 0);
		}
		memset(seen, 0, PER_ROUND);
		for (uint32_t n = 0; n < PER_ROUND; n++) {
			if (!sv_rq_take(qp->ctx->seg.h, qp->rq, &rw.w))
				fail_msg("round %d: %u of %u posted WQEs there", round, n, PER_ROUND);
			if (rw.w.wr_id >= PER_ROUND || rw.w.sge[0].addr != (rw.w.wr_id + 1) * 8)
				fail_msg("round %d: WQE wr_id %llu addr 0x%llx was never posted", round,
					 (unsigned long long)rw.w.wr_id,
					 (unsigned long long)rw.w.sge[0].addr);
			seen[rw.w.wr_id]++;
		}
		for (uint32_t id = 0; id < PER_ROUND; id++)
			if (seen[id] != 1)
				fail_msg("round %d: wr_id %u taken %u times", round, id, seen[id]);
	}
	printf("# %d rounds: %d completions polled once each by %d threads, %d WQEs posted by "
	       "%d threads taken once each\n", ROUNDS, PER_ROUND, OWNER_THREADS, PER_ROUND,
	       OWNER_THREADS);
	pthread_barrier_destroy(&go);
	free(seen);
	assert_int_equal(ibv_destroy_qp(ibqp), 0);
	assert_int_equal(ibv_destroy_cq(ibcq), 0);
}

/*
 * The bounce mailbox's claim (transport/shm/copy.c), step by step as the
 * interleavings that matter leave it: a server thread read `req`, then
 * `taken` moved on without it.  Each row is the `taken` it finds, the
 * `req` it read, and whether it may serve.
 */
static void test_bounce_claim(void **state)
{
	(void)state;
	static const struct {
		const char *what;
		uint32_t taken, req;
		bool serves;
		uint32_t taken_after;
	} rows[] = {
		{ "the first request", 0, 1, true, 1 },
		{ "the next request", 6, 7, true, 7 },
		{ "served already by another thread", 7, 7, false, 7 },
		{ "stale: others served it and the next one", 8, 7, false, 8 },
		{ "stale by many", 100, 7, false, 100 },
		{ "an initiator died before its request was served", 5, 7, true, 7 },
		{ "across the wrap of the counter", UINT32_MAX, 0, true, 0 },
		{ "stale across the wrap", 1, UINT32_MAX, false, 1 },
	};
	struct shm_bounce b;

	for (size_t i = 0; i < SV_ARRAY_SIZE(rows); i++) {
		memset(&b, 0, sizeof(b));
		atomic_store(&b.taken, rows[i].taken);
		if (sv_bounce_claim(&b, rows[i].req) != rows[i].serves)
			fail_msg("%s (taken %u, req %u): claim %s", rows[i].what, rows[i].taken,
				 rows[i].req, rows[i].serves ? "refused" : "granted");
		assert_int_equal(atomic_load(&b.taken), rows[i].taken_after);
		/* A second thread with the same `req` never serves it again. */
		assert_false(sv_bounce_claim(&b, rows[i].req));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_producers_poller_resize, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_full_ring_refuses, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_rq_consumers, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_arm_races_push, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_owner_threads_share, fix_setup, fix_teardown),
		cmocka_unit_test(test_bounce_claim),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
