/* SPDX-License-Identifier: MIT */
/*
 * Completion queues and completion channels.
 *
 * Every CQ is an ibv_cq_ex, so one object answers both ibv_poll_cq() and
 * the ibv_start_poll() family (ibv_cq_ex_to_cq() is a cast).  Completions
 * sit in a ring of struct sv_cqe; the extended read_* functions read the
 * entry the current poll holds.
 *
 * A completion channel is an fd-backed event queue: ibv_req_notify_cq()
 * arms the CQ, the next completion (or the next solicited one) queues one
 * event and disarms it (IBA 11.4.2.2).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../sv.h"
#include "../engine/engine.h"
#include "../transport/shm/shm.h"

/* ---- completion channels ---- */

SV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx)
{
	struct sv_channel *ch;

	if (!sv_context_live(ctx, "ibv_create_comp_channel"))
		return NULL;
	ch = calloc(1, sizeof(*ch));
	if (!ch)
		return sv_fail_null(ENOMEM, "ibv_create_comp_channel", "out of memory");
	int ret = sv_evq_init(&ch->q);
	if (ret || (ret = sv_obj_add(ch, SV_OBJ_CHANNEL, ctx))) {
		if (ch->q.fd > 0)
			sv_evq_destroy(&ch->q);
		free(ch);
		return sv_fail_null(ret, "ibv_create_comp_channel", "cannot create its fd: %s",
				    strerror(ret));
	}
	ch->ibch.context = ctx;
	ch->ibch.fd = ch->q.fd;
	ch->ibch.refcnt = 0;
	return &ch->ibch;
}

void sv_channel_release(struct sv_channel *ch)
{
	if (!sv_obj_del(ch, SV_OBJ_CHANNEL))
		return;
	sv_evq_destroy(&ch->q);
	free(ch);
}

SV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ibch)
{
	if (!sv_obj_live(ibch, SV_OBJ_CHANNEL))
		return sv_fail(EINVAL, "ibv_destroy_comp_channel", "channel %p is not live",
			       (void *)ibch), -1;
	if (ibch->refcnt)
		return sv_fail(EBUSY, "ibv_destroy_comp_channel", "channel fd %d still serves %d "
			       "CQs; destroy them first", ibch->fd, ibch->refcnt), -1;
	sv_channel_release((struct sv_channel *)ibch);
	return 0;
}

SV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *ibch, struct ibv_cq **cq, void **cq_ctx)
{
	struct sv_channel *ch = (struct sv_channel *)ibch;
	struct sv_event e;

	if (!sv_obj_live(ibch, SV_OBJ_CHANNEL))
		return sv_fail(EINVAL, "ibv_get_cq_event", "channel %p is not live", (void *)ibch), -1;
	int ret = sv_evq_pop(&ch->q, &e);
	if (ret) {
		errno = ret;
		return -1;
	}
	struct sv_cq *c = e.obj;
	pthread_mutex_lock(&c->ex.mutex);
	c->comp_events_reported++;
	pthread_mutex_unlock(&c->ex.mutex);
	*cq = ibv_cq_ex_to_cq(&c->ex);
	*cq_ctx = c->ex.cq_context;
	return 0;
}

SV_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

/* ---- CQs ---- */

#define SUPPORTED_WC_FLAGS (IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | \
	IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | \
	IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS | \
	IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK | \
	IBV_WC_EX_WITH_TM_INFO)
#define KNOWN_CQ_FLAGS (IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)

/* The entry at the head once a producer has published it (shm.h). */
static struct shm_cqe *cq_peek_at(struct sv_cq *cq, uint64_t head)
{
	struct shm_cq *q = cq->sh;
	struct shm_cqe *e = &shm_cq_ring(cq->ctx->seg.h, q)[head % q->size];

	/* Pairs with the producer's release store of seq. */
	return atomic_load_explicit(&e->seq, memory_order_acquire) == (uint32_t)head + 1 ? e : NULL;
}

/* Frees the head's slot for the producers' next lap; under lock. */
static void cq_consume(struct sv_cq *cq)
{
	struct shm_cq *q = cq->sh;
	uint64_t head = atomic_load_explicit(&q->head, memory_order_relaxed);
	struct shm_cqe *e = &shm_cq_ring(cq->ctx->seg.h, q)[head % q->size];

	/* Pairs with the acquire load of a producer that claims the slot. */
	atomic_store_explicit(&e->seq, (uint32_t)(head + q->size), memory_order_release);
	atomic_store_explicit(&q->head, head + 1, memory_order_relaxed);
}

/* Data the producer left for the poller to place (transport/shm/defer.c)
 * lands before its completion is seen, and before a dropped one goes. */
static void place_deferred(struct sv_cq *cq, struct shm_cqe *e)
{
	if (e->defer) {
		sv_defer_place(cq->ctx->seg.h, NULL, e->defer);
		atomic_store_explicit(&cq->defer_next, sv_defer_next(cq->ctx->seg.h, e->defer),
				      memory_order_relaxed);
		e->defer = 0;
	}
}

/* The next live entry, dropping those a QP's reset took back; under lock. */
static struct shm_cqe *cq_peek(struct sv_cq *cq)
{
	struct shm_cqe *e;

	while ((e = cq_peek_at(cq, atomic_load_explicit(&cq->sh->head, memory_order_relaxed)))) {
		place_deferred(cq, e);
		if (e->opcode != SHM_CQE_DEAD)
			break;
		cq_consume(cq);
	}
	return e;
}

/* Lock-free look for a completion, so that an empty poll takes no lock. */
static bool cq_maybe_ready(struct sv_cq *cq)
{
	return cq_peek_at(cq, atomic_load_explicit(&cq->sh->head, memory_order_relaxed)) != NULL;
}

/*
 * An empty poll.  A sender fills deferred slots in turn, so the slot of
 * this CQ's next deferred message is most likely the one after the last:
 * reading its line here, while the poller waits anyway, brings the
 * message's data in as the sender writes it, instead of as a second
 * transfer after its completion is seen.  A shared copy, not one to
 * write: the sender fetches the slot for writing as its SEND starts, and
 * an exclusive copy here made it take the line back (ib_send_lat on
 * private memory 0.39 us against 0.35; docs/architecture.md section 10).
 * Only a hint: a wrong guess costs a line's transfer, never a wrong
 * result.
 */
static bool cq_empty(struct sv_cq *cq)
{
	if (cq_maybe_ready(cq))
		return false;
	/* A context that talks to other hosts receives here first, so a
	 * polling application meets its packets without a thread wake-up. */
	if (cq->ctx->pkt) {
		sv_pkt_poll(cq->ctx, atomic_load_explicit(&cq->sh->armed, memory_order_relaxed));
		if (cq_maybe_ready(cq))
			return false;
	}
	const void *next = atomic_load_explicit(&cq->defer_next, memory_order_relaxed);

	if (next)
		__builtin_prefetch(next, 0, 3);
	return true;
}

static void load_current(struct sv_cq *cq, struct shm_cqe *e)
{
	cq->cur = e;
	cq->ex.wr_id = e->wr_id;
	cq->ex.status = (enum ibv_wc_status)e->status;
}

static int cq_start_poll(struct ibv_cq_ex *ex, struct ibv_poll_cq_attr *attr)
{
	struct sv_cq *cq = (struct sv_cq *)ex;

	if (attr && attr->comp_mask)
		return EINVAL;
	if (cq_empty(cq))
		return ENOENT;
	sv_own_lock(&cq->sh->lock);
	struct shm_cqe *e = cq_peek(cq);
	if (!e) {
		/* verbs.h: on ENOENT the caller does not call end_poll. */
		sv_own_unlock(&cq->sh->lock);
		return ENOENT;
	}
	load_current(cq, e);
	return 0;	/* the lock is held until end_poll */
}

static int cq_next_poll(struct ibv_cq_ex *ex)
{
	struct sv_cq *cq = (struct sv_cq *)ex;

	cq_consume(cq);
	struct shm_cqe *e = cq_peek(cq);
	if (!e)
		return ENOENT;
	load_current(cq, e);
	return 0;
}

static void cq_end_poll(struct ibv_cq_ex *ex)
{
	struct sv_cq *cq = (struct sv_cq *)ex;

	if (cq->cur == cq_peek(cq))
		cq_consume(cq);
	cq->cur = NULL;
	sv_own_unlock(&cq->sh->lock);
}

#define CUR(ex) (((struct sv_cq *)(ex))->cur)
static enum ibv_wc_opcode rd_opcode(struct ibv_cq_ex *ex) { return (enum ibv_wc_opcode)CUR(ex)->opcode; }
static uint32_t rd_vendor_err(struct ibv_cq_ex *ex) { return CUR(ex)->vendor_err; }
static uint32_t rd_byte_len(struct ibv_cq_ex *ex) { return CUR(ex)->byte_len; }
static __be32 rd_imm(struct ibv_cq_ex *ex) { return CUR(ex)->imm; }
static uint32_t rd_qp_num(struct ibv_cq_ex *ex) { return CUR(ex)->qp_num; }
static uint32_t rd_src_qp(struct ibv_cq_ex *ex) { return CUR(ex)->src_qp; }
static unsigned int rd_wc_flags(struct ibv_cq_ex *ex) { return CUR(ex)->wc_flags; }
static uint32_t rd_slid(struct ibv_cq_ex *ex) { return CUR(ex)->slid; }
static uint8_t rd_sl(struct ibv_cq_ex *ex) { return CUR(ex)->sl; }
static uint8_t rd_dlid_path_bits(struct ibv_cq_ex *ex) { return CUR(ex)->dlid_path_bits; }
static uint64_t rd_ts(struct ibv_cq_ex *ex) { return CUR(ex)->ts; }

static void rd_tm_info(struct ibv_cq_ex *ex, struct ibv_wc_tm_info *tm)
{
	tm->tag = CUR(ex)->tag;
	tm->priv = CUR(ex)->imm;	/* the TMH's app_ctx, as sent */
}

static uint64_t rd_wallclock(struct ibv_cq_ex *ex)
{
	/* Timestamps are CLOCK_MONOTONIC; convert by the current offset. */
	struct timespec rt, mt;

	clock_gettime(CLOCK_REALTIME, &rt);
	clock_gettime(CLOCK_MONOTONIC, &mt);
	int64_t off = (rt.tv_sec - mt.tv_sec) * 1000000000ll + (rt.tv_nsec - mt.tv_nsec);
	return CUR(ex)->ts + (uint64_t)off;
}

bool sv_cq_of(struct ibv_cq *cq, struct ibv_context *ctx, const char *verb, const char *role)
{
	if (!sv_obj_live(cq, SV_OBJ_CQ)) {
		sv_fail(EINVAL, verb, "%s %p is not a live CQ", role, (void *)cq);
		return false;
	}
	if (ctx && !sv_same_ctx(cq->context, ctx)) {
		sv_fail(EINVAL, verb, "%s %p belongs to another device context", role, (void *)cq);
		return false;
	}
	return true;
}

static int check_cq_attr(struct ibv_context *ctx, const struct ibv_cq_init_attr_ex *a)
{
	const char *verb = "ibv_create_cq";

	if (a->cqe < 1 || a->cqe > SV_MAX_CQE)
		return sv_fail(EINVAL, verb, "cqe %u is out of range 1..%d (max_cqe)", a->cqe, SV_MAX_CQE);
	if (a->comp_vector >= (uint32_t)ctx->num_comp_vectors)
		return sv_fail(EINVAL, verb, "comp_vector %u: the device has %d completion vectors",
			       a->comp_vector, ctx->num_comp_vectors);
	if (a->channel && (!sv_obj_live(a->channel, SV_OBJ_CHANNEL) || !sv_same_ctx(a->channel->context, ctx)))
		return sv_fail(EINVAL, verb, "channel %p is not a live channel of this context",
			       (void *)a->channel);
	if (a->wc_flags & ~(uint64_t)SUPPORTED_WC_FLAGS)
		return sv_fail(EOPNOTSUPP, verb, "wc_flags 0x%llx: only 0x%llx are supported "
			       "(no CVLAN or flow tag)",
			       (unsigned long long)a->wc_flags, (unsigned long long)SUPPORTED_WC_FLAGS);
	if (a->comp_mask & ~(uint32_t)(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD))
		return sv_fail(EINVAL, verb, "unknown comp_mask bits 0x%x", a->comp_mask);
	/* A CQ may live in a parent domain (rdma-core verbs.h); a plain PD is
	 * not one. */
	if ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) &&
	    (!sv_pd_of(a->parent_domain, ctx, verb) || !sv_pd(a->parent_domain)->parent))
		return sv_fail(EINVAL, verb, "parent_domain is not a parent domain of this context");
	if ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (a->flags & ~(uint32_t)KNOWN_CQ_FLAGS))
		return sv_fail(EOPNOTSUPP, verb, "unsupported CQ flags 0x%x", a->flags);
	return 0;
}

/* Where a CQ's first ring sits: right after its header, in one block.
 * A resize moves the ring out of it (ibv_resize_cq). */
static uint64_t first_ring_off(uint64_t cq_off)
{
	return (cq_off + sizeof(struct shm_cq) + SHM_ALIGN - 1) & ~(uint64_t)(SHM_ALIGN - 1);
}

/* The CQ header and its ring, in the context's segment. */
static bool cq_alloc_ring(struct sv_context *c, struct sv_cq *cq, uint32_t cqe)
{
	uint64_t bytes = sizeof(struct shm_cq) + SHM_ALIGN + (uint64_t)cqe * sizeof(struct shm_cqe);
	uint64_t off = sv_seg_alloc(&c->seg, bytes);

	if (!off)
		return false;
	struct shm_cq *q = shm_at(c->seg.h, off);
	q->size = cqe;
	q->ring_off = first_ring_off(off);
	sv_cq_ring_init(shm_at(c->seg.h, q->ring_off), cqe, 0);
	cq->sh = q;
	cq->sh_off = off;
	cq->sh_bytes = bytes;
	return true;
}

struct ibv_cq_ex *sv_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *a)
{
	struct sv_context *c;
	struct sv_cq *cq;

	if (!sv_context_live(ctx, "ibv_create_cq"))
		return NULL;
	if (!a)
		return sv_fail_null(EINVAL, "ibv_create_cq", "attr is NULL");
	if (check_cq_attr(ctx, a))
		return NULL;
	c = sv_ctx(ctx);
	if (atomic_fetch_add(&c->ncq, 1) >= SV_MAX_CQ) {
		atomic_fetch_sub(&c->ncq, 1);
		return sv_fail_null(ENOMEM, "ibv_create_cq", "the context has max_cq=%d CQs", SV_MAX_CQ);
	}
	cq = calloc(1, sizeof(*cq));
	if (cq && !cq_alloc_ring(c, cq, a->cqe))
		cq->sh = NULL;
	if (!cq || !cq->sh || sv_obj_add(cq, SV_OBJ_CQ, ctx)) {
		if (cq && cq->sh)
			sv_seg_free(&c->seg, cq->sh_off, cq->sh_bytes);
		free(cq);
		atomic_fetch_sub(&c->ncq, 1);
		return sv_fail_null(ENOMEM, "ibv_create_cq", "out of memory for %u entries", a->cqe);
	}
	cq->ctx = c;
	struct ibv_cq_ex *ex = &cq->ex;
	ex->context = ctx;
	ex->channel = a->channel;
	ex->cq_context = a->cq_context;
	ex->cqe = (int)a->cqe;
	pthread_mutex_init(&ex->mutex, NULL);
	pthread_cond_init(&ex->cond, NULL);
	cq->wc_flags = a->wc_flags;
	cq->sh->stamp = !!(a->wc_flags & (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
					  IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK));
	if (a->channel) {
		cq->ch = (struct sv_channel *)a->channel;
		pthread_mutex_lock(&ctx->mutex);
		a->channel->refcnt++;
		pthread_mutex_unlock(&ctx->mutex);
	}
	ex->start_poll = cq_start_poll;
	ex->next_poll = cq_next_poll;
	ex->end_poll = cq_end_poll;
	ex->read_opcode = rd_opcode;
	ex->read_vendor_err = rd_vendor_err;
	ex->read_byte_len = rd_byte_len;
	ex->read_imm_data = rd_imm;
	ex->read_qp_num = rd_qp_num;
	ex->read_src_qp = rd_src_qp;
	ex->read_wc_flags = rd_wc_flags;
	ex->read_slid = rd_slid;
	ex->read_sl = rd_sl;
	ex->read_dlid_path_bits = rd_dlid_path_bits;
	ex->read_completion_ts = rd_ts;
	ex->read_completion_wallclock_ns = rd_wallclock;
	ex->read_tm_info = rd_tm_info;
	pthread_mutex_lock(&c->lock);
	cq->next = c->cqs;
	c->cqs = cq;
	pthread_mutex_unlock(&c->lock);
	return ex;
}

SV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
				       struct ibv_comp_channel *channel, int comp_vector)
{
	struct ibv_cq_init_attr_ex a = {
		.cqe = cqe < 0 ? 0 : (uint32_t)cqe, .cq_context = cq_context,
		.channel = channel, .comp_vector = comp_vector < 0 ? UINT32_MAX : (uint32_t)comp_vector,
		.wc_flags = IBV_WC_STANDARD_FLAGS,
	};
	struct ibv_cq_ex *ex = sv_create_cq_ex(ctx, &a);

	return ex ? ibv_cq_ex_to_cq(ex) : NULL;
}

int sv_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
	struct sv_cq *cq = sv_cq(ibcq);
	int i;

	if (cq_empty(cq))
		return 0;	/* the common empty poll takes no lock */
	sv_own_lock(&cq->sh->lock);
	for (i = 0; i < n; i++) {
		struct shm_cqe *e = cq_peek(cq);
		if (!e)
			break;
		wc[i] = (struct ibv_wc){
			.wr_id = e->wr_id, .status = (enum ibv_wc_status)e->status,
			.opcode = (enum ibv_wc_opcode)e->opcode, .vendor_err = e->vendor_err,
			.byte_len = e->byte_len, .imm_data = e->imm, .qp_num = e->qp_num,
			.src_qp = e->src_qp, .wc_flags = e->wc_flags, .pkey_index = e->pkey_index,
			.slid = e->slid, .sl = e->sl, .dlid_path_bits = e->dlid_path_bits,
		};
		cq_consume(cq);
	}
	sv_own_unlock(&cq->sh->lock);
	return i;
}

int sv_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct sv_cq *cq = sv_cq(ibcq);

	if (!cq->ch)
		return sv_fail(EINVAL, "ibv_req_notify_cq", "CQ %p has no completion channel",
			       (void *)ibcq);
	/* Solicited-only never weakens an arm for every completion.  A
	 * producer takes the arm with a compare-and-swap (sv_cq_push). */
	uint32_t cur = atomic_load(&cq->sh->armed);
	while (cur != 1 && !atomic_compare_exchange_weak(&cq->sh->armed, &cur,
							 solicited_only ? 2u : 1u))
		;
	/* Pairs with the producer's fence between publishing an entry and
	 * reading the arm: either it sees the arm, or the application's
	 * poll after this call sees its entry. */
	atomic_thread_fence(memory_order_seq_cst);
	return 0;
}

SV_EXPORT int ibv_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct sv_cq *cq = sv_cq(ibcq);

	if (!sv_cq_of(ibcq, NULL, "ibv_resize_cq", "CQ"))
		return EINVAL;
	if (cqe < 1 || cqe > SV_MAX_CQE)
		return sv_fail(EINVAL, "ibv_resize_cq", "cqe %d is out of range 1..%d", cqe, SV_MAX_CQE);
	struct shm_hdr *h = cq->ctx->seg.h;
	uint64_t off = sv_seg_alloc(&cq->ctx->seg, (uint64_t)cqe * sizeof(struct shm_cqe));
	if (!off)
		return sv_fail(ENOMEM, "ibv_resize_cq", "out of memory");
	struct shm_cq *q = cq->sh;
	sv_own_lock(&q->lock);
	/* Stop producers (shm.h): a claimed slot is always finished first. */
	atomic_store(&q->frozen, 1);
	while (atomic_load(&q->producers))
		sched_yield();
	uint64_t head = atomic_load_explicit(&q->head, memory_order_relaxed);
	uint32_t n = (uint32_t)(atomic_load_explicit(&q->tail, memory_order_relaxed) - head);
	if ((uint32_t)cqe < n) {
		atomic_store(&q->frozen, 0);
		sv_own_unlock(&q->lock);
		sv_seg_free(&cq->ctx->seg, off, (uint64_t)cqe * sizeof(struct shm_cqe));
		return sv_fail(EINVAL, "ibv_resize_cq", "CQ holds %u completions, more than cqe %d; "
			       "poll them first", n, cqe);
	}
	/* The header stays where QPs of any process find it; only the ring
	 * moves, while no producer is in it. */
	struct shm_cqe *old = shm_cq_ring(h, q), *ring = shm_at(h, off);
	for (uint32_t i = 0; i < n; i++)
		memcpy(&ring[i], &old[(head + i) % q->size], offsetof(struct shm_cqe, seq));
	sv_cq_ring_init(ring, (uint32_t)cqe, n);
	uint64_t old_off = q->ring_off, old_bytes = (uint64_t)q->size * sizeof(struct shm_cqe);
	q->ring_off = off;
	q->size = (uint32_t)cqe;
	atomic_store_explicit(&q->head, 0, memory_order_relaxed);
	atomic_store_explicit(&q->tail, n, memory_order_relaxed);
	ibcq->cqe = cqe;
	atomic_store(&q->frozen, 0);
	sv_own_unlock(&q->lock);
	/* The first ring is part of the CQ's own block; later ones are not. */
	if (old_off != first_ring_off(cq->sh_off))
		sv_seg_free(&cq->ctx->seg, old_off, old_bytes);
	return 0;
}

/* Frees the CQ; the caller has checked it may go. */
static void cq_free(struct sv_cq *cq)
{
	struct ibv_cq *ibcq = ibv_cq_ex_to_cq(&cq->ex);
	struct ibv_context *ctx = ibcq->context;

	if (cq->ch) {
		pthread_mutex_lock(&ctx->mutex);
		cq->ch->ibch.refcnt--;
		pthread_mutex_unlock(&ctx->mutex);
	}
	struct sv_context *c = cq->ctx;
	pthread_mutex_lock(&c->lock);
	SV_LIST_DEL(&c->cqs, cq);
	pthread_mutex_unlock(&c->lock);
	/* Completions never polled still place their data. */
	for (uint64_t p = atomic_load_explicit(&cq->sh->head, memory_order_relaxed);; p++) {
		struct shm_cqe *e = cq_peek_at(cq, p);
		if (!e)
			break;
		place_deferred(cq, e);
	}
	if (cq->sh->ring_off != first_ring_off(cq->sh_off))
		sv_seg_free(&c->seg, cq->sh->ring_off, (uint64_t)cq->sh->size * sizeof(struct shm_cqe));
	sv_seg_free(&c->seg, cq->sh_off, cq->sh_bytes);
	atomic_fetch_sub(&c->ncq, 1);
	pthread_cond_destroy(&ibcq->cond);
	pthread_mutex_destroy(&ibcq->mutex);
	free(cq);
}

void sv_cq_release(struct sv_cq *cq)
{
	if (sv_obj_del(cq, SV_OBJ_CQ))
		cq_free(cq);
}

SV_EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	struct sv_cq *cq = sv_cq(ibcq);

	if (!sv_cq_of(ibcq, NULL, "ibv_destroy_cq", "CQ"))
		return EINVAL;
	unsigned users = atomic_load(&cq->users);
	if (users)
		return sv_fail(EBUSY, "ibv_destroy_cq", "CQ %p is still used by %u QPs; "
			       "destroy them first", (void *)ibcq, users);
	if (!sv_obj_del(cq, SV_OBJ_CQ))
		return EINVAL;
	/* Events not yet read die with the CQ; events read must be acked
	 * before it can go (rdma-core ibv_destroy_cq). */
	sv_events_settle(ibcq->context, cq->ch ? &cq->ch->q : NULL, cq, &ibcq->mutex, &ibcq->cond,
			 &ibcq->comp_events_completed, &cq->comp_events_reported);
	sv_events_settle(ibcq->context, NULL, cq, &ibcq->mutex, &ibcq->cond,
			 &ibcq->async_events_completed, &cq->async_events_reported);
	cq_free(cq);
	return 0;
}
