/* SPDX-License-Identifier: MIT */
/*
 * Shared receive queues: create, modify (resize and limit), query, destroy.
 * The limit is armed by ibv_modify_srq(IBV_SRQ_LIMIT) and fires
 * IBV_EVENT_SRQ_LIMIT_REACHED once when the queue drains below it
 * (IBA 10.2.9.3, 11.6.3.3).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sv.h"

/* An XRC SRQ gets a number from the host registry and an entry in the
 * segment's directory, where initiators look it up (shm.h). */
static int xsrq_publish(struct sv_context *c, struct sv_srq *srq,
			const struct ibv_srq_init_attr_ex *a)
{
	if (sv_reg_qpn_alloc(c->ep, (enum ibv_qp_type)SHM_TYPE_XSRQ, &srq->srqn))
		return ENOMEM;
	srq->xsh_off = sv_seg_alloc(&c->seg, sizeof(struct shm_qp));
	if (!srq->xsh_off) {
		sv_reg_qpn_free(srq->srqn);
		srq->srqn = 0;
		return ENOMEM;
	}
	struct shm_qp *x = shm_at(c->seg.h, srq->xsh_off);
	x->qpn = srq->srqn;
	x->type = SHM_TYPE_XSRQ;
	x->pd = sv_pd_base(sv_pd(a->pd))->ibpd.handle;
	x->srq_off = srq->wq_off;
	x->rcq_off = sv_cq(a->cq)->sh_off;
	x->xrcd = sv_xrcd(a->xrcd)->id;
	atomic_store(&x->state, IBV_QPS_RTS);
	srq->xsh = x;
	sv_seg_publish_qp(c->seg.h, srq->srqn, srq->xsh_off);
	return 0;
}

static void xsrq_unpublish(struct sv_context *c, struct sv_srq *srq)
{
	if (!srq->srqn)
		return;
	sv_seg_publish_qp(c->seg.h, srq->srqn, 0);
	sv_seg_free(&c->seg, srq->xsh_off, sizeof(struct shm_qp));
	sv_reg_qpn_free(srq->srqn);
	srq->srqn = 0;
}

int sv_get_srq_num(struct ibv_srq *ibsrq, uint32_t *srq_num)
{
	struct sv_srq *srq = sv_srq(ibsrq);

	if (!sv_obj_live(ibsrq, SV_OBJ_SRQ))
		return sv_fail(EINVAL, "ibv_get_srq_num", "SRQ %p is not live", (void *)ibsrq);
	if (!srq->srqn)
		return sv_fail(EINVAL, "ibv_get_srq_num", "SRQ %p is not an XRC SRQ; only those "
			       "are addressed by number", (void *)ibsrq);
	*srq_num = srq->srqn;
	return 0;
}

struct ibv_srq *sv_create_srq_ex(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *a)
{
	const char *verb = "ibv_create_srq";
	struct sv_context *c;
	struct sv_srq *srq;

	if (!sv_context_live(ctx, verb))
		return NULL;
	if (!a)
		return sv_fail_null(EINVAL, verb, "attr is NULL");
	if (a->comp_mask & ~(uint32_t)(IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
				       IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
				       IBV_SRQ_INIT_ATTR_TM))
		return sv_fail_null(EINVAL, verb, "unknown comp_mask bits 0x%x", a->comp_mask);
	enum ibv_srq_type type = a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE ? a->srq_type : IBV_SRQT_BASIC;
	if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC && type != IBV_SRQT_TM)
		return sv_fail_null(EINVAL, verb, "srq_type %d is not an SRQ type", type);
	if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD))
		return sv_fail_null(EINVAL, verb, "an SRQ needs a PD (IBV_SRQ_INIT_ATTR_PD)");
	if (!sv_pd_of(a->pd, ctx, verb))
		return NULL;
	bool xrc = type == IBV_SRQT_XRC;
	if (xrc && ((a->comp_mask & (IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ)) !=
		    (IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ)))
		return sv_fail_null(EINVAL, verb, "an XRC SRQ needs an XRC domain and a CQ "
				    "(IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ)");
	if (xrc && (!sv_xrcd_of(a->xrcd, ctx, verb) || !sv_cq_of(a->cq, ctx, verb, "cq")))
		return NULL;
	bool tm = type == IBV_SRQT_TM;
	if (tm && ((a->comp_mask & (IBV_SRQ_INIT_ATTR_TM | IBV_SRQ_INIT_ATTR_CQ)) !=
		   (IBV_SRQ_INIT_ATTR_TM | IBV_SRQ_INIT_ATTR_CQ)))
		return sv_fail_null(EINVAL, verb, "a tag-matching SRQ needs tm_cap and a CQ "
				    "(IBV_SRQ_INIT_ATTR_TM | IBV_SRQ_INIT_ATTR_CQ)");
	if (tm && (a->tm_cap.max_num_tags < 1 || a->tm_cap.max_num_tags > SV_MAX_TM_TAGS ||
		   a->tm_cap.max_ops > SV_MAX_TM_OPS))
		return sv_fail_null(EINVAL, verb, "tm_cap max_num_tags %u / max_ops %u: the device "
				    "allows 1..%d tags and %d operations", a->tm_cap.max_num_tags,
				    a->tm_cap.max_ops, SV_MAX_TM_TAGS, SV_MAX_TM_OPS);
	if (tm && !sv_cq_of(a->cq, ctx, verb, "cq"))
		return NULL;
	if (a->attr.max_wr < 1 || a->attr.max_wr > SV_MAX_SRQ_WR)
		return sv_fail_null(EINVAL, verb, "max_wr %u is out of range 1..%d", a->attr.max_wr,
				    SV_MAX_SRQ_WR);
	if (a->attr.max_sge < 1 || a->attr.max_sge > SV_MAX_SRQ_SGE)
		return sv_fail_null(EINVAL, verb, "max_sge %u is out of range 1..%d", a->attr.max_sge,
				    SV_MAX_SRQ_SGE);
	/* The limit is set by modify_srq; at creation it is ignored, as
	 * the kernel does (ib_uverbs_create_srq). */
	c = sv_ctx(ctx);
	if (atomic_fetch_add(&c->nsrq, 1) >= SV_MAX_SRQ) {
		atomic_fetch_sub(&c->nsrq, 1);
		return sv_fail_null(ENOMEM, verb, "the context has max_srq=%d SRQs", SV_MAX_SRQ);
	}
	srq = calloc(1, sizeof(*srq));
	if (srq)
		srq->wq = sv_seg_new_wq(&c->seg, a->attr.max_wr, a->attr.max_sge, &srq->wq_off);
	if (srq && srq->wq)
		srq->wq_bytes = sv_seg_wq_bytes(srq->wq);
	if (srq && srq->wq && ((xrc && xsrq_publish(c, srq, a)) ||
			       (tm && sv_tm_list_new(c, srq->wq, a->tm_cap.max_num_tags)))) {
		sv_seg_free(&c->seg, srq->wq_off, srq->wq_bytes);
		srq->wq = NULL;
	}
	if (!srq || !srq->wq || sv_obj_add(srq, SV_OBJ_SRQ, ctx)) {
		if (srq && srq->wq) {
			xsrq_unpublish(c, srq);
			sv_tm_list_free(c, srq->wq);
			sv_seg_free(&c->seg, srq->wq_off, srq->wq_bytes);
		}
		free(srq);
		atomic_fetch_sub(&c->nsrq, 1);
		return sv_fail_null(ENOMEM, verb, "out of memory");
	}
	if (xrc) {
		srq->xrcd = sv_xrcd(a->xrcd);
		atomic_fetch_add(&srq->xrcd->users, 1);
	}
	if (xrc || tm) {
		srq->cq = sv_cq(a->cq);
		srq->wq->cq_off = tm ? srq->cq->sh_off : 0;
		atomic_fetch_add(&srq->cq->users, 1);
	}
	srq->ibsrq.context = ctx;
	srq->ibsrq.srq_context = a->srq_context;
	srq->ibsrq.pd = a->pd;
	pthread_mutex_init(&srq->ibsrq.mutex, NULL);
	pthread_cond_init(&srq->ibsrq.cond, NULL);
	srq->pd = sv_pd(a->pd);
	srq->attr.max_wr = a->attr.max_wr;
	srq->attr.max_sge = a->attr.max_sge;
	sv_pd_users_add(srq->pd, 1);
	pthread_mutex_lock(&c->lock);
	srq->next = c->srqs;
	c->srqs = srq;
	pthread_mutex_unlock(&c->lock);
	return &srq->ibsrq;
}

SV_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct ibv_srq_init_attr_ex a;
	struct ibv_srq *srq;

	if (!sv_pd_of(pd, NULL, "ibv_create_srq"))
		return NULL;
	if (!attr)
		return sv_fail_null(EINVAL, "ibv_create_srq", "attr is NULL");
	memset(&a, 0, sizeof(a));
	a.srq_context = attr->srq_context;
	a.attr = attr->attr;
	a.comp_mask = IBV_SRQ_INIT_ATTR_PD;
	a.pd = pd;
	srq = sv_create_srq_ex(pd->context, &a);
	if (srq)
		attr->attr = a.attr;
	return srq;
}

SV_EXPORT int ibv_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
	const char *verb = "ibv_modify_srq";
	struct sv_srq *srq = sv_srq(ibsrq);

	if (!sv_obj_live(ibsrq, SV_OBJ_SRQ))
		return sv_fail(EINVAL, verb, "SRQ %p is not live", (void *)ibsrq);
	if (!attr || mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
		return sv_fail(EINVAL, verb, "attr_mask 0x%x: only IBV_SRQ_MAX_WR and "
			       "IBV_SRQ_LIMIT can be modified", (unsigned)mask);
	uint32_t max_wr = mask & IBV_SRQ_MAX_WR ? attr->max_wr : srq->attr.max_wr;
	if (max_wr < 1 || max_wr > SV_MAX_SRQ_WR)
		return sv_fail(EINVAL, verb, "max_wr %u is out of range 1..%d", max_wr, SV_MAX_SRQ_WR);
	/* IBA 10.2.9.2: the limit must not exceed the queue's depth. */
	if ((mask & IBV_SRQ_LIMIT) && attr->srq_limit > max_wr)
		return sv_fail(EINVAL, verb, "srq_limit %u exceeds max_wr %u", attr->srq_limit, max_wr);
	struct sv_context *c = sv_ctx(ibsrq->context);
	struct shm_wq *wq = srq->wq;
	uint64_t slots = 0;
	if (max_wr != wq->size) {
		slots = sv_seg_alloc(&c->seg, (uint64_t)max_wr * wq->stride);
		if (!slots)
			return sv_fail(ENOMEM, verb, "out of memory for %u WQEs", max_wr);
	}
	sv_shm_lock(&wq->lock);
	if (max_wr < wq->count) {
		uint32_t n = wq->count;
		sv_shm_unlock(&wq->lock);
		sv_seg_free(&c->seg, slots, (uint64_t)max_wr * wq->stride);
		return sv_fail(EINVAL, verb, "max_wr %u is below the %u WQEs posted", max_wr, n);
	}
	if (slots) {
		/* The header stays put (QPs of every process point at it);
		 * the slots move under the lock every consumer takes. */
		for (uint32_t i = 0; i < wq->count; i++)
			memcpy(shm_at(c->seg.h, slots + (uint64_t)i * wq->stride),
			       shm_wq_slot(c->seg.h, wq, wq->head + i), wq->stride);
		uint64_t old = wq->wqe_off, old_bytes = (uint64_t)wq->size * wq->stride;
		bool embedded = old == sv_seg_wq_slots(srq->wq_off);
		wq->wqe_off = slots;
		wq->head = 0;
		wq->size = max_wr;
		if (!embedded)
			sv_seg_free(&c->seg, old, old_bytes);
	}
	if (mask & IBV_SRQ_LIMIT)
		wq->limit = attr->srq_limit;	/* arms the limit event */
	sv_shm_unlock(&wq->lock);
	pthread_mutex_lock(&ibsrq->mutex);
	srq->attr.max_wr = max_wr;
	pthread_mutex_unlock(&ibsrq->mutex);
	return 0;
}

SV_EXPORT int ibv_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	if (!sv_obj_live(ibsrq, SV_OBJ_SRQ))
		return sv_fail(EINVAL, "ibv_query_srq", "SRQ %p is not live", (void *)ibsrq);
	if (!attr)
		return sv_fail(EINVAL, "ibv_query_srq", "attr is NULL");
	pthread_mutex_lock(&ibsrq->mutex);
	*attr = sv_srq(ibsrq)->attr;
	pthread_mutex_unlock(&ibsrq->mutex);
	/* The limit reads back as 0 once its event has fired (IBA 10.2.9.3). */
	attr->srq_limit = sv_srq(ibsrq)->wq->limit;
	return 0;
}

/* Writes one receive WR into a receive queue; the caller holds its lock. */
int sv_wq_post(struct shm_hdr *h, struct shm_wq *wq, const struct ibv_recv_wr *wr, const char **why)
{
	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > wq->max_sge) {
		*why = "num_sge exceeds the queue's max_sge";
		return EINVAL;
	}
	/* A QP's RQ and a WQ are lock-free for their consumers (shm.h):
	 * sv_rq_post() has posted unless the queue was full. */
	bool full = wq->lockfree ? sv_rq_post(h, wq, wr) != 0 : wq->count == wq->size;
	if (full) {
		*why = "the receive queue is full (max_wr outstanding)";
		return ENOMEM;
	}
	if (wq->lockfree)
		return 0;
	struct shm_rwqe *w = shm_wq_slot(h, wq, wq->head + wq->count);
	w->wr_id = wr->wr_id;
	w->num_sge = (uint32_t)wr->num_sge;
	if (wr->num_sge)	/* sg_list may be NULL then */
		memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(w->sge[0]));
	wq->count++;
	return 0;
}

int sv_wq_post_list(struct shm_hdr *h, struct shm_wq *wq, struct ibv_recv_wr *wr,
		    struct ibv_recv_wr **bad, const char *verb, const char *kind, uint64_t id)
{
	const char *why;
	int ret = 0;

	if (wq->lockfree)
		sv_own_lock(&wq->post_lock);
	else
		sv_shm_lock(&wq->lock);
	for (; wr && !ret; wr = wr->next) {
		ret = sv_wq_post(h, wq, wr, &why);
		if (ret) {
			*bad = wr;
			sv_fail(ret, verb, "%s 0x%llx wr_id 0x%llx: %s", kind, (unsigned long long)id,
				(unsigned long long)wr->wr_id, why);
		}
	}
	if (wq->lockfree)
		sv_own_unlock(&wq->post_lock);
	else
		sv_shm_unlock(&wq->lock);
	return ret;
}

int sv_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	return sv_wq_post_list(sv_ctx(ibsrq->context)->seg.h, sv_srq(ibsrq)->wq, wr, bad,
			       "ibv_post_srq_recv", "SRQ", (uintptr_t)ibsrq);
}

static void srq_free(struct sv_srq *srq)
{
	struct sv_context *c = sv_ctx(srq->ibsrq.context);

	xsrq_unpublish(c, srq);
	pthread_mutex_lock(&c->lock);
	SV_LIST_DEL(&c->srqs, srq);
	pthread_mutex_unlock(&c->lock);
	if (srq->xrcd)
		atomic_fetch_sub(&srq->xrcd->users, 1);
	if (srq->cq)
		atomic_fetch_sub(&srq->cq->users, 1);
	sv_tm_list_free(c, srq->wq);
	if (srq->wq->wqe_off != sv_seg_wq_slots(srq->wq_off))
		sv_seg_free(&c->seg, srq->wq->wqe_off, (uint64_t)srq->wq->size * srq->wq->stride);
	sv_seg_free(&c->seg, srq->wq_off, srq->wq_bytes);
	sv_pd_users_add(srq->pd, -1);
	atomic_fetch_sub(&sv_ctx(srq->ibsrq.context)->nsrq, 1);
	pthread_cond_destroy(&srq->ibsrq.cond);
	pthread_mutex_destroy(&srq->ibsrq.mutex);
	free(srq);
}

void sv_srq_release(struct sv_srq *srq)
{
	if (sv_obj_del(srq, SV_OBJ_SRQ))
		srq_free(srq);
}

SV_EXPORT int ibv_destroy_srq(struct ibv_srq *ibsrq)
{
	struct sv_srq *srq = sv_srq(ibsrq);

	if (!sv_obj_live(ibsrq, SV_OBJ_SRQ))
		return sv_fail(EINVAL, "ibv_destroy_srq", "SRQ %p is not live", (void *)ibsrq);
	unsigned users = atomic_load(&srq->users);
	if (users)
		return sv_fail(EBUSY, "ibv_destroy_srq", "SRQ %p is still attached to %u QPs",
			       (void *)ibsrq, users);
	if (!sv_obj_del(srq, SV_OBJ_SRQ))
		return EINVAL;
	sv_events_settle(ibsrq->context, NULL, srq, &ibsrq->mutex, &ibsrq->cond,
			 &ibsrq->events_completed, &srq->events_reported);
	srq_free(srq);
	return 0;
}
