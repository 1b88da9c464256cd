/* SPDX-License-Identifier: MIT */
/*
 * What entering a QP state does, beyond the state itself: the device's
 * side of a transition (IBA 10.3.1, 11.6.3).  RESET forgets and discards,
 * ERR flushes both queues, SQD reports the drain; and a move to ERR the
 * engine itself causes (a failed request), or one a peer's request left
 * pending in the QP's shared block.  modify_qp (verbs/qp.c) checks a
 * transition and then applies it here.
 */
#define _GNU_SOURCE
#include <string.h>

#include "engine.h"

/* Side effects of entering a state (IBA 10.3.1, 11.6.3). */
void sv_qp_enter_state(struct sv_qp *qp, enum ibv_qp_state cur, enum ibv_qp_state next,
		       const struct ibv_qp_attr *a, int mask)
{
	struct ibv_qp *ib = &qp->ex.qp_base;

	switch (next) {
	case IBV_QPS_RESET:
		/* RESET forgets every attribute and discards both queues
		 * without completions (IBA 10.3.1.1). */
		memset(&qp->attr, 0, sizeof(qp->attr));
		pthread_mutex_lock(&qp->sq_lock);
		qp->sq_count = qp->sq_hidden = 0;
		qp->fin_n = 0;
		atomic_store_explicit(&qp->fins_due, 0, memory_order_relaxed);
		atomic_store_explicit(&qp->rnr_waiting, false, memory_order_relaxed);
		pthread_mutex_unlock(&qp->sq_lock);
		sv_pkt_qp_detach(qp);	/* its packet state goes with its attributes */
		if (qp->rq)
			sv_rq_drain(qp->ctx->seg.h, qp->rq, NULL, 0);
		/* Its completions still in the CQs go too, as mlx5 does
		 * (mlx5_cq_clean): a reset QP starts from nothing. */
		if (qp->scq)
			sv_cq_clean(qp->ctx->seg.h, qp->scq->sh, ib->qp_num);
		if (qp->rcq && qp->rcq != qp->scq)
			sv_cq_clean(qp->ctx->seg.h, qp->rcq->sh, ib->qp_num);
		break;
	case IBV_QPS_ERR:
		/* Initiators stop seeing the QP first, then every outstanding
		 * WQE of both queues completes with IBV_WC_WR_FLUSH_ERR,
		 * unsignaled ones included (IBA 10.3.1.7, C10-?). */
		atomic_store_explicit(&qp->sh->state, IBV_QPS_ERR, memory_order_release);
		sv_sq_flush(qp);
		sv_pkt_rq_flush_held(qp);
		sv_flush_rq(qp);
		/* A QP on an SRQ reports that its last WQE is consumed. */
		if (cur != IBV_QPS_ERR && qp->srq)
			sv_async_event(ib->context, ib, IBV_EVENT_QP_LAST_WQE_REACHED);
		break;
	case IBV_QPS_SQD: {
		/* Over shm every message started is complete, so the queue is
		 * drained at once; over packets, when the messages under way
		 * are acknowledged (engine/pkt_req.c).  The event is asked for
		 * per transition (IBA 11.2.5, "Enable SQD Affiliated
		 * Asynchronous Event"), not remembered. */
		bool ask = cur == IBV_QPS_RTS && (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) &&
			   a->en_sqd_async_notify;
		/* SQD before the look: no message starts after it, and the
		 * last to complete sees SQD (both under sq_lock). */
		atomic_store_explicit(&qp->sh->state, IBV_QPS_SQD, memory_order_release);
		if (cur == IBV_QPS_RTS && sv_pkt_sq_drained(qp, ask) && ask)
			sv_async_event(ib->context, ib, IBV_EVENT_SQ_DRAINED);
		break;
	}
	default:
		break;
	}
	ib->state = next;
	qp->attr.qp_state = next;
	qp->attr.cur_qp_state = next;
	/* Mirror what initiators check; the state last (release). */
	struct shm_qp *sh = qp->sh;
	atomic_store_explicit(&sh->access, qp->attr.qp_access_flags, memory_order_relaxed);
	atomic_store_explicit(&sh->qkey, qp->attr.qkey, memory_order_relaxed);
	sh->min_rnr_timer = qp->attr.min_rnr_timer;
	sh->port = qp->attr.port_num;
	sh->pkey_index = qp->attr.pkey_index;
	atomic_store_explicit(&sh->state, (uint8_t)next, memory_order_release);
	sv_reg_qpn_set_state(ib->qp_num, next);
}

/* The caller holds qp->lock. */
static void to_err_locked(struct sv_qp *qp)
{
	struct ibv_qp *ib = &qp->ex.qp_base;

	if (ib->state != IBV_QPS_ERR && ib->state != IBV_QPS_RESET)
		sv_qp_enter_state(qp, ib->state, IBV_QPS_ERR, &qp->attr, 0);
	else if (ib->state == IBV_QPS_ERR)
		sv_sq_flush(qp);	/* WQEs posted after the transition */
}

void sv_qp_to_err(struct sv_qp *qp, int ev)
{
	pthread_mutex_lock(&qp->lock);
	to_err_locked(qp);
	pthread_mutex_unlock(&qp->lock);
	if (ev >= 0)
		sv_async_event(qp->ex.qp_base.context, &qp->ex.qp_base, (enum ibv_event_type)ev);
}

/* Marks the QP in ERR for everyone at once; its owner applies the rest of
 * the transition (sv_qp_sync, or sv_qp_to_err at once).  pending is
 * err_pending's code (1, or 2 + an event): an event outranks a plain ERR
 * already pending, and one already pending stays. */
void sv_qp_mark_err(struct sv_qp *qp, uint32_t pending)
{
	uint32_t cur = 0;

	atomic_store_explicit(&qp->sh->state, IBV_QPS_ERR, memory_order_release);
	if (!atomic_compare_exchange_strong(&qp->sh->err_pending, &cur, pending) && cur == 1 &&
	    pending > 1)
		atomic_compare_exchange_strong(&qp->sh->err_pending, &cur, pending);
}

/* Applies an ERR transition a peer's request caused (resp.c), so that the
 * owner's verbs never act on a state the QP has already left.  The flag
 * is taken under the QP's lock: a verb that finds it taken by another
 * thread (the progress thread) then waits on that lock for the transition
 * instead of reading the state before it. */
void sv_qp_sync(struct sv_qp *qp)
{
	/* Read before writing: the block's line is read by every initiator,
	 * and a write would take it from their caches. */
	if (!atomic_load_explicit(&qp->sh->err_pending, memory_order_relaxed))
		return;
	pthread_mutex_lock(&qp->lock);
	uint32_t e = atomic_exchange_explicit(&qp->sh->err_pending, 0, memory_order_acquire);
	if (e)
		to_err_locked(qp);
	pthread_mutex_unlock(&qp->lock);
	if (e >= 2)
		sv_async_event(qp->ex.qp_base.context, &qp->ex.qp_base, (enum ibv_event_type)(e - 2));
}
