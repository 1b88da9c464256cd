/* SPDX-License-Identifier: MIT */
/*
 * The per-context progress thread: the work that cannot finish inside the
 * verb that started it.  It sleeps on the segment's doorbell futex and
 * wakes when anyone -- this process or a peer -- rings it, or when the
 * earliest RNR/retry timer is due.  Idle, it costs no CPU.
 *
 * On each wake it first serves peers waiting on it: its part of a large
 * copy, an atomic (assist.c, which may keep it polling a while) and the
 * bounce mailbox; then it delivers port changes and what peers left in
 * the segment: completion events for armed CQs, CQ overruns, SRQ limit
 * events, and QPs a peer's request moved to ERR; then it retries send
 * queues whose timers expired.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

/*
 * The port's changes since the last look (`softverbs port`), as events: a
 * change counted but not yet seen is a cable pulled or plugged.  Changes
 * that came faster than this thread woke are shown as their net effect
 * with the state they passed through: down and up again is PORT_ERR then
 * PORT_ACTIVE, never nothing.
 */
static void port_events(struct sv_context *c)
{
	uint32_t w = sv_reg_port(c->dev->index), seen = c->port_seen;

	if (w == seen)
		return;
	uint32_t changes = (w >> 1) - (seen >> 1);
	unsigned n = changes & 1 ? (changes > 1 ? 3 : 1) : 2;
	bool down = !SV_PORT_DOWN(seen);	/* the first change's direction */
	for (unsigned k = 0; k < n; k++, down = !down)
		sv_async_event(&c->vctx.context, NULL, down ? IBV_EVENT_PORT_ERR :
				IBV_EVENT_PORT_ACTIVE);
	c->port_seen = w;
}

static void deliver(struct sv_context *c, uint64_t *next)
{
	pthread_mutex_lock(&c->lock);
	for (struct sv_cq *cq = c->cqs; cq; cq = cq->next) {
		if (atomic_exchange_explicit(&cq->sh->notify, 0, memory_order_acquire) && cq->ch)
			sv_evq_push(&cq->ch->q, cq, 0, 0);
		if (atomic_exchange_explicit(&cq->sh->overrun, 0, memory_order_acquire))
			sv_async_event(&c->vctx.context, ibv_cq_ex_to_cq(&cq->ex), IBV_EVENT_CQ_ERR);
	}
	for (struct sv_srq *srq = c->srqs; srq; srq = srq->next)
		if (atomic_exchange_explicit(&srq->wq->limit_hit, 0, memory_order_acquire))
			sv_async_event(&c->vctx.context, &srq->ibsrq, IBV_EVENT_SRQ_LIMIT_REACHED);
	uint64_t now = sv_now_ns();
	for (struct sv_qp *qp = c->qps; qp; qp = qp->next) {
		sv_qp_sync(qp);
		if (!atomic_load_explicit(&qp->rnr_waiting, memory_order_relaxed))
			continue;
		pthread_mutex_lock(&qp->sq_lock);
		uint64_t due = qp->sq_count ? ((struct sv_swqe *)(qp->sq + (size_t)qp->sq_head *
								 qp->sq_stride))->rnr_deadline : 0;
		pthread_mutex_unlock(&qp->sq_lock);
		if (due <= now)
			sv_sq_progress(qp);
		else if (due < *next)
			*next = due;
	}
	pthread_mutex_unlock(&c->lock);
}

static void *progress_main(void *arg)
{
	struct sv_context *c = arg;
	struct shm_hdr *h = c->seg.h;

	sv_thread_prompt();
	for (;;) {
		/* Read the doorbell before scanning; sleeping only while it
		 * still has this value means no ring is ever missed. */
		uint32_t seq = atomic_load_explicit(&h->doorbell, memory_order_acquire);
		if (atomic_load(&c->stopping))
			break;
		uint64_t next = UINT64_MAX;
		/* Copies and atomics a peer waits for come first. */
		bool polling = c->tp_mem->serve(c);
		port_events(c);
		deliver(c, &next);
		if (polling)
			continue;
		struct timespec ts, *tp = NULL;
		if (next != UINT64_MAX) {
			uint64_t now = sv_now_ns(), d = next > now ? next - now : 0;
			ts.tv_sec = (time_t)(d / 1000000000ull);
			ts.tv_nsec = (long)(d % 1000000000ull);
			tp = &ts;
		}
		syscall(SYS_futex, &h->doorbell, FUTEX_WAIT, seq, tp, NULL, 0);
	}
	c->tp_mem->stop(c);
	return NULL;
}

int sv_progress_start(struct sv_context *c)
{
	int ret = pthread_create(&c->progress, NULL, progress_main, c);

	c->progress_started = !ret;
	return ret;
}

void sv_progress_stop(struct sv_context *c)
{
	if (!c->progress_started)
		return;
	atomic_store(&c->stopping, true);
	sv_seg_ring(c->seg.h);
	pthread_join(c->progress, NULL);
	c->progress_started = false;
}
