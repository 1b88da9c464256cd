/* SPDX-License-Identifier: MIT */
/*
 * Completions: adding them to CQs (in any process's segment), raising
 * completion events, flushing, and the outcome -> status table.
 */
#define _GNU_SOURCE
#include <time.h>

#include "engine.h"

#define RESULT_STATUS(name, status) [SV_R_##name] = status,
static const enum ibv_wc_status result_status[] = { SV_RESULTS(RESULT_STATUS) };
#undef RESULT_STATUS
#define RESULT_NAME(name, status) [SV_R_##name] = #name,
static const char *const result_name[] = { SV_RESULTS(RESULT_NAME) };
#undef RESULT_NAME
_Static_assert(SV_ARRAY_SIZE(result_status) == SV_R_COUNT, "result table");

enum ibv_wc_status sv_result_status(enum sv_result r)
{
	return result_status[r];
}

const char *sv_result_name(enum sv_result r)
{
	return result_name[r];
}

uint64_t sv_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

bool sv_cq_push(struct shm_hdr *h, struct shm_cq *cq, const struct shm_cqe *e)
{
	bool ring = false, ok = true;

	sv_shm_lock(&cq->lock);
	uint32_t n = atomic_load_explicit(&cq->count, memory_order_relaxed);
	if (n == cq->size) {
		/* IBA 11.4.2.1: an overrun CQ is in error; the owner raises
		 * IBV_EVENT_CQ_ERR. */
		atomic_store_explicit(&cq->overrun, 1, memory_order_relaxed);
		ok = false;
		ring = true;
	} else {
		struct shm_cqe *slot = &shm_cq_ring(h, cq)[(cq->head + n) % cq->size];
		*slot = *e;
		/* The clock is read only for CQs that report it. */
		if (cq->stamp)
			slot->ts = sv_now_ns();
		/* Pairs with the acquire load of count in the owner's poll:
		 * the entry is complete before it is counted. */
		atomic_store_explicit(&cq->count, n + 1, memory_order_release);
		/* IBA 11.4.2.2: an armed CQ raises one event for the next
		 * completion; solicited-only arms fire on solicited or failed
		 * ones. */
		uint32_t armed = atomic_load_explicit(&cq->armed, memory_order_relaxed);
		if (armed == 1 || (armed == 2 && (e->solicited || e->status != IBV_WC_SUCCESS))) {
			atomic_store_explicit(&cq->armed, 0, memory_order_relaxed);
			atomic_store_explicit(&cq->notify, 1, memory_order_release);
			ring = true;
		}
	}
	sv_shm_unlock(&cq->lock);
	if (ring)
		sv_seg_ring(h);
	return ok;
}

void sv_cq_clean(struct shm_hdr *h, struct shm_cq *cq, uint32_t qpn)
{
	sv_shm_lock(&cq->lock);
	struct shm_cqe *ring = shm_cq_ring(h, cq);
	uint32_t n = atomic_load_explicit(&cq->count, memory_order_relaxed), kept = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct shm_cqe e = ring[(cq->head + i) % cq->size];
		if (e.qp_num != qpn)
			ring[(cq->head + kept++) % cq->size] = e;
	}
	atomic_store_explicit(&cq->count, kept, memory_order_release);
	sv_shm_unlock(&cq->lock);
}

void sv_flush_rq(struct sv_qp *qp)
{
	struct shm_hdr *h = qp->ctx->seg.h;
	struct shm_wq *wq = qp->rq;

	if (!wq)
		return;
	sv_shm_lock(&wq->lock);
	while (wq->count) {
		struct shm_rwqe *w = shm_wq_slot(h, wq, wq->head);
		struct shm_cqe e = { .wr_id = w->wr_id, .status = IBV_WC_WR_FLUSH_ERR,
				     .opcode = IBV_WC_RECV, .qp_num = qp->ex.qp_base.qp_num,
 };
		wq->head = (wq->head + 1) % wq->size;
		wq->count--;
		sv_cq_push(h, qp->rcq->sh, &e);
	}
	sv_shm_unlock(&wq->lock);
}
