/* SPDX-License-Identifier: MIT */
/*
 * Completions: adding them to CQs (in any process's segment), raising
 * completion events, flushing, and the outcome -> status table; and the
 * affiliated and unaffiliated asynchronous events the device raises.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stddef.h>
#include <string.h>
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

void sv_cq_ring_init(struct shm_cqe *ring, uint32_t size, uint32_t used)
{
	for (uint32_t i = 0; i < size; i++)
		atomic_store_explicit(&ring[i].seq, i < used ? i + 1 : i, memory_order_relaxed);
}

/* Counts this producer in, unless a resize holds the ring (shm.h). */
static void producer_enter(struct shm_cq *cq)
{
	for (;;) {
		atomic_fetch_add(&cq->producers, 1);
		if (!atomic_load(&cq->frozen))
			return;
		atomic_fetch_sub(&cq->producers, 1);
		while (atomic_load_explicit(&cq->frozen, memory_order_relaxed))
			sched_yield();
	}
}

bool sv_cq_push(struct shm_hdr *h, struct shm_cq *cq, const struct shm_cqe *e)
{
	producer_enter(cq);
	struct shm_cqe *ring = shm_cq_ring(h, cq), *slot;
	uint32_t size = cq->size;
	uint64_t pos = atomic_load_explicit(&cq->tail, memory_order_relaxed);
	for (;;) {
		slot = &ring[pos % size];
		/* The poller is most likely reading this line: ask for it to
		 * write, or loading seq fetches it shared and the stores below
		 * must take it again. */
		sv_prefetchw(slot);
		/* Pairs with the owner's release store freeing the slot. */
		int32_t d = (int32_t)(atomic_load_explicit(&slot->seq, memory_order_acquire) -
				      (uint32_t)pos);
		if (d == 0 && atomic_compare_exchange_weak_explicit(&cq->tail, &pos, pos + 1,
								    memory_order_relaxed,
								    memory_order_relaxed))
			break;
		if (d < 0) {
			/* IBA 11.4.2.1: an overrun CQ is in error; the owner
			 * raises IBV_EVENT_CQ_ERR. */
			atomic_fetch_sub_explicit(&cq->producers, 1, memory_order_release);
			atomic_store_explicit(&cq->overrun, 1, memory_order_relaxed);
			sv_seg_ring(h);
			return false;
		}
		if (d > 0)
			pos = atomic_load_explicit(&cq->tail, memory_order_relaxed);
	}
	memcpy(slot, e, offsetof(struct shm_cqe, seq));
	/* The clock is read only for CQs that report it. */
	if (cq->stamp)
		slot->ts = sv_now_ns();
	/* Pairs with the owner's acquire load in its poll: the entry is
	 * complete before it is seen. */
	atomic_store_explicit(&slot->seq, (uint32_t)pos + 1, memory_order_release);
	atomic_fetch_sub_explicit(&cq->producers, 1, memory_order_release);
	/* IBA 11.4.2.2: an armed CQ raises one event for the next completion;
	 * solicited-only arms fire on solicited or failed ones.  The fence
	 * orders the entry before the arm is read, against the owner's arm
	 * before its re-poll (ibv_req_notify_cq(3)): one of the two sees the
	 * other. */
	atomic_thread_fence(memory_order_seq_cst);
	uint32_t armed = atomic_load_explicit(&cq->armed, memory_order_relaxed);
	if ((armed == 1 || (armed == 2 && (e->solicited || e->status != IBV_WC_SUCCESS))) &&
	    atomic_compare_exchange_strong(&cq->armed, &armed, 0)) {
		atomic_store_explicit(&cq->notify, 1, memory_order_release);
		sv_seg_ring(h);
	}
	return true;
}

void sv_cq_clean(struct shm_hdr *h, struct shm_cq *cq, uint32_t qpn)
{
	sv_own_lock(&cq->lock);
	struct shm_cqe *ring = shm_cq_ring(h, cq);
	/* Entries stay where they are (producers may be filling the slots
	 * behind them); the poller skips the ones marked dead. */
	for (uint64_t p = atomic_load_explicit(&cq->head, memory_order_relaxed);; p++) {
		struct shm_cqe *e = &ring[p % cq->size];
		if (atomic_load_explicit(&e->seq, memory_order_acquire) != (uint32_t)p + 1)
			break;
		if (e->qp_num == qpn)
			e->opcode = SHM_CQE_DEAD;
	}
	sv_own_unlock(&cq->lock);
}

void sv_rq_drain(struct shm_hdr *h, struct shm_wq *wq, struct shm_cq *cq, uint32_t qpn)
{
	union { struct shm_rwqe w; char buf[sizeof(struct shm_rwqe) + SV_MAX_SGE * sizeof(struct ibv_sge)]; } rw;

	/* The queue is lock-free for consumers: the owner takes its WQEs
	 * back as an initiator would, racing none of them. */
	while (sv_rq_take(h, wq, &rw.w)) {
		struct shm_cqe e = { .wr_id = rw.w.wr_id, .status = IBV_WC_WR_FLUSH_ERR,
				     .opcode = IBV_WC_RECV, .qp_num = qpn };
		if (cq)
			sv_cq_push(h, cq, &e);
	}
}

void sv_flush_rq(struct sv_qp *qp)
{
	if (qp->rq)
		sv_rq_drain(qp->ctx->seg.h, qp->rq, qp->rcq->sh, qp->ex.qp_base.qp_num);
}

/* The context's asynchronous event queue (its async_fd), where
 * ibv_get_async_event reads. */
int sv_async_event(struct ibv_context *ctx, void *obj, enum ibv_event_type type)
{
	struct sv_context *c = sv_ctx(ctx);

	sv_dbg("async event %d on %p", (int)type, obj);
	return sv_evq_push(&c->async, obj, (int)type, SV_PORT);
}
