/* SPDX-License-Identifier: MIT */
/*
 * The CQ ring's multi-producer protocol (transport/shm/shm.h): producer
 * threads push through sv_cq_push, as initiators of any process do, while
 * the owner polls and resizes.  Every completion must arrive exactly once
 * and in each producer's order; a full ring must refuse (overrun), never
 * overwrite.  ThreadSanitizer runs this test too.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>

#include "helpers.h"
#include "sv.h"

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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_producers_poller_resize, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_full_ring_refuses, fix_setup, fix_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
