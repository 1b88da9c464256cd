/* SPDX-License-Identifier: MIT */
/*
 * Receive work queues and their indirection tables: the receive side of
 * a raw packet QP with RSS (engine/raw.c picks the WQ).  A WQ is a
 * receive queue in the context's segment with its own CQ and state;
 * frames reach it only while it is ready (IBV_WQS_RDY).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sv.h"

#define WQ_STATE_NAME(s) ((s) == IBV_WQS_RESET ? "RESET" : (s) == IBV_WQS_RDY ? "RDY" : "ERR")

static int post_wq_recv(struct ibv_wq *ibwq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct sv_wq *wq = sv_wq(ibwq);

	if (atomic_load_explicit(&wq->sh->wq_state, memory_order_relaxed) == IBV_WQS_ERR) {
		*bad = wr;
		return sv_fail(EINVAL, "ibv_post_wq_recv", "WQ 0x%x is in ERR", ibwq->wq_num);
	}
	return sv_wq_post_list(wq->ctx->seg.h, wq->sh, wr, bad, "ibv_post_wq_recv", "WQ",
			       ibwq->wq_num);
}

struct ibv_wq *sv_create_wq(struct ibv_context *ctx, struct ibv_wq_init_attr *a)
{
	const char *verb = "ibv_create_wq";

	if (!sv_context_live(ctx, verb))
		return NULL;
	if (!a || a->wq_type != IBV_WQT_RQ)
		return sv_fail_null(EINVAL, verb, "wq_type must be IBV_WQT_RQ");
	if (a->comp_mask & ~(uint32_t)IBV_WQ_INIT_ATTR_FLAGS)
		return sv_fail_null(EINVAL, verb, "unknown comp_mask bits 0x%x", a->comp_mask);
	if ((a->comp_mask & IBV_WQ_INIT_ATTR_FLAGS) && a->create_flags)
		return sv_fail_null(EOPNOTSUPP, verb, "create_flags 0x%x: no VLAN stripping, FCS "
				    "scatter, delay drop or padding", a->create_flags);
	if (a->max_wr < 1 || a->max_wr > SV_MAX_QP_WR || a->max_sge < 1 || a->max_sge > SV_MAX_SGE)
		return sv_fail_null(EINVAL, verb, "max_wr %u / max_sge %u: the device allows 1..%d "
				    "and 1..%d", a->max_wr, a->max_sge, SV_MAX_QP_WR, SV_MAX_SGE);
	if (!sv_pd_of(a->pd, ctx, verb) || !sv_cq_of(a->cq, ctx, verb, "cq"))
		return NULL;
	struct sv_context *c = sv_ctx(ctx);
	struct sv_wq *wq = calloc(1, sizeof(*wq));
	if (wq)
		wq->sh = sv_seg_new_wq(&c->seg, a->max_wr + SV_RQ_SLACK, a->max_sge, &wq->sh_off);
	if (!wq || !wq->sh || sv_obj_add(wq, SV_OBJ_WQ, ctx)) {
		if (wq && wq->sh)
			sv_seg_free(&c->seg, wq->sh_off, sv_seg_wq_bytes(wq->sh));
		free(wq);
		return sv_fail_null(ENOMEM, verb, "out of memory for %u WQEs", a->max_wr);
	}
	wq->ctx = c;
	wq->pd = sv_pd(a->pd);
	wq->cq = sv_cq(a->cq);
	sv_pd_users_add(wq->pd, 1);
	atomic_fetch_add(&wq->cq->users, 1);
	struct ibv_wq *ib = &wq->ibwq;
	ib->context = ctx;
	ib->wq_context = a->wq_context;
	ib->pd = a->pd;
	ib->cq = a->cq;
	ib->wq_num = ib->handle = atomic_fetch_add(&c->wq_seq, 1) + 1;
	ib->state = IBV_WQS_RESET;
	ib->wq_type = IBV_WQT_RQ;
	ib->post_recv = post_wq_recv;
	pthread_mutex_init(&ib->mutex, NULL);
	pthread_cond_init(&ib->cond, NULL);
	wq->sh->lockfree = 1;
	wq->sh->cq_off = wq->cq->sh_off;
	wq->sh->wq_num = ib->wq_num;
	atomic_store(&wq->sh->wq_state, IBV_WQS_RESET);
	a->max_wr = wq->sh->size;
	return ib;
}

int sv_modify_wq(struct ibv_wq *ibwq, struct ibv_wq_attr *a)
{
	const char *verb = "ibv_modify_wq";
	struct sv_wq *wq = sv_wq(ibwq);

	if (!sv_obj_live(ibwq, SV_OBJ_WQ))
		return sv_fail(EINVAL, verb, "WQ %p is not live", (void *)ibwq);
	if (!a || a->attr_mask & ~(uint32_t)(IBV_WQ_ATTR_STATE | IBV_WQ_ATTR_CURR_STATE |
					     IBV_WQ_ATTR_FLAGS))
		return sv_fail(EINVAL, verb, "unknown attr_mask bits");
	if ((a->attr_mask & IBV_WQ_ATTR_FLAGS) && (a->flags & a->flags_mask))
		return sv_fail(EOPNOTSUPP, verb, "no WQ flag can be set");
	pthread_mutex_lock(&ibwq->mutex);
	enum ibv_wq_state cur = ibwq->state;
	if ((a->attr_mask & IBV_WQ_ATTR_CURR_STATE) && a->curr_wq_state != cur) {
		pthread_mutex_unlock(&ibwq->mutex);
		return sv_fail(EINVAL, verb, "curr_wq_state %d, but WQ 0x%x is in %s",
			       a->curr_wq_state, ibwq->wq_num, WQ_STATE_NAME(cur));
	}
	if (a->attr_mask & IBV_WQ_ATTR_STATE) {
		enum ibv_wq_state next = a->wq_state;
		/* The kernel's WQ transitions: RESET -> RDY, RDY -> RDY,
		 * anything -> RESET or ERR. */
		if (next > IBV_WQS_ERR || (next == IBV_WQS_RDY && cur == IBV_WQS_ERR)) {
			pthread_mutex_unlock(&ibwq->mutex);
			return sv_fail(EINVAL, verb, "WQ 0x%x cannot go from %s to state %d",
				       ibwq->wq_num, WQ_STATE_NAME(cur), next);
		}
		atomic_store_explicit(&wq->sh->wq_state, next, memory_order_relaxed);
		if (next != IBV_WQS_RDY && cur != next)
			sv_rq_drain(wq->ctx->seg.h, wq->sh, next == IBV_WQS_ERR ? wq->cq->sh : NULL,
				    ibwq->wq_num);
		ibwq->state = next;
	}
	pthread_mutex_unlock(&ibwq->mutex);
	return 0;
}

void sv_wq_free(void *obj)
{
	struct sv_wq *wq = obj;

	atomic_store(&wq->sh->wq_state, IBV_WQS_RESET);
	sv_seg_free(&wq->ctx->seg, wq->sh_off, sv_seg_wq_bytes(wq->sh));
	sv_pd_users_add(wq->pd, -1);
	atomic_fetch_sub(&wq->cq->users, 1);
	pthread_cond_destroy(&wq->ibwq.cond);
	pthread_mutex_destroy(&wq->ibwq.mutex);
	free(wq);
}

int sv_destroy_wq(struct ibv_wq *ibwq)
{
	struct sv_wq *wq = sv_wq(ibwq);

	if (!sv_obj_live(ibwq, SV_OBJ_WQ))
		return sv_fail(EINVAL, "ibv_destroy_wq", "WQ %p is not live", (void *)ibwq);
	if (atomic_load(&wq->users))
		return sv_fail(EBUSY, "ibv_destroy_wq", "WQ 0x%x is in %u indirection tables",
			       ibwq->wq_num, atomic_load(&wq->users));
	if (sv_obj_del(wq, SV_OBJ_WQ))
		sv_wq_free(wq);
	return 0;
}

struct ibv_rwq_ind_table *sv_create_rwq_ind_table(struct ibv_context *ctx,
						  struct ibv_rwq_ind_table_init_attr *a)
{
	const char *verb = "ibv_create_rwq_ind_table";

	if (!sv_context_live(ctx, verb))
		return NULL;
	if (!a || a->comp_mask || a->log_ind_tbl_size > SV_MAX_RWQ_IND_LOG || !a->ind_tbl)
		return sv_fail_null(EINVAL, verb, "comp_mask must be 0, log_ind_tbl_size at most %d "
				    "and ind_tbl set", SV_MAX_RWQ_IND_LOG);
	uint32_t n = 1u << a->log_ind_tbl_size;
	for (uint32_t i = 0; i < n; i++)
		if (!sv_obj_live(a->ind_tbl[i], SV_OBJ_WQ) || !sv_same_ctx(a->ind_tbl[i]->context, ctx))
			return sv_fail_null(EINVAL, verb, "ind_tbl[%u] is not a live WQ of this "
					    "context", i);
	struct sv_rwq_ind *t = calloc(1, sizeof(*t) + n * sizeof(t->wqs[0]));
	if (!t || sv_obj_add(t, SV_OBJ_RWQ_IND, ctx)) {
		free(t);
		return sv_fail_null(ENOMEM, verb, "out of memory");
	}
	t->log_size = a->log_ind_tbl_size;
	for (uint32_t i = 0; i < n; i++) {
		t->wqs[i] = sv_wq(a->ind_tbl[i]);
		atomic_fetch_add(&t->wqs[i]->users, 1);
	}
	t->ib.context = ctx;
	t->ib.ind_tbl_handle = t->ib.ind_tbl_num = (int)(atomic_fetch_add(&sv_ctx(ctx)->wq_seq, 1) + 1);
	return &t->ib;
}

void sv_rwq_ind_free(void *obj)
{
	struct sv_rwq_ind *t = obj;

	for (uint32_t i = 0; i < 1u << t->log_size; i++)
		atomic_fetch_sub(&t->wqs[i]->users, 1);
	free(t);
}

int sv_destroy_rwq_ind_table(struct ibv_rwq_ind_table *ib)
{
	struct sv_rwq_ind *t = (struct sv_rwq_ind *)ib;

	if (!sv_obj_live(ib, SV_OBJ_RWQ_IND))
		return sv_fail(EINVAL, "ibv_destroy_rwq_ind_table", "table %p is not live", (void *)ib);
	if (atomic_load(&t->users))
		return sv_fail(EBUSY, "ibv_destroy_rwq_ind_table", "table %d serves %u QPs",
			       ib->ind_tbl_num, atomic_load(&t->users));
	if (sv_obj_del(t, SV_OBJ_RWQ_IND))
		sv_rwq_ind_free(t);
	return 0;
}
