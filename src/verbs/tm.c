/* SPDX-License-Identifier: MIT */
/*
 * Tag-matching SRQs (IBV_SRQT_TM): the matching list and ibv_post_srq_ops.
 *
 * The list lives in the owner's segment next to the SRQ's queue and under
 * its lock, because initiators match arriving messages against it
 * (engine/tm.c) exactly as they take receive WQEs.  List operations run
 * synchronously here, so max_ops bounds nothing and every completion is
 * in the SRQ's CQ when ibv_post_srq_ops returns.
 *
 * Phase synchronisation (rdma-core Documentation/tag_matching.md): each
 * unexpected message the device delivers counts in wq->tm_unexp.  A tag
 * added while software has reported fewer unexpected messages than that
 * may not match yet -- an earlier unexpected message might be its match --
 * so it waits (SHM_TM_PENDING) until an operation with IBV_OPS_TM_SYNC
 * reports the full count; its completion, like every list completion while
 * the counts differ, carries IBV_WC_TM_SYNC_REQ.
 */
#include <errno.h>
#include <string.h>

#include "../sv.h"

int sv_tm_list_new(struct sv_context *c, struct shm_wq *wq, uint32_t tags)
{
	uint32_t stride = (uint32_t)((sizeof(struct shm_tm_tag) + wq->stride + 7) & ~7ul);
	uint64_t off = sv_seg_alloc(&c->seg, (uint64_t)tags * stride);

	if (!off)
		return ENOMEM;
	wq->tm_off = off;
	wq->tm_stride = stride;
	wq->tm_tags = tags;
	return 0;
}

void sv_tm_list_free(struct sv_context *c, struct shm_wq *wq)
{
	if (wq->tm_tags)
		sv_seg_free(&c->seg, wq->tm_off, (uint64_t)wq->tm_tags * wq->tm_stride);
	wq->tm_tags = 0;
}

/* An operation's report of the unexpected messages software has seen:
 * once it covers every one delivered, pending tags may match. */
static void tm_sync(struct shm_hdr *h, struct shm_wq *wq, uint32_t seen)
{
	wq->tm_synced = seen;
	if (seen != wq->tm_unexp)
		return;
	for (uint32_t i = 0; i < wq->tm_tags; i++) {
		struct shm_tm_tag *t = shm_tm_at(h, wq, i);
		if (t->state == SHM_TM_PENDING)
			t->state = SHM_TM_ACTIVE;
	}
}

static int tm_add(struct shm_hdr *h, struct shm_wq *wq, struct ibv_ops_wr *op, const char **why)
{
	if (op->tm.add.num_sge < 0 || (uint32_t)op->tm.add.num_sge > wq->max_sge) {
		*why = "tm.add.num_sge exceeds the SRQ's max_sge";
		return EINVAL;
	}
	if (op->tm.add.num_sge && !op->tm.add.sg_list) {
		*why = "tm.add.sg_list is NULL";
		return EINVAL;
	}
	struct shm_tm_tag *t = NULL;
	for (uint32_t i = 0; i < wq->tm_tags && !t; i++)
		if (shm_tm_at(h, wq, i)->state == SHM_TM_FREE)
			t = shm_tm_at(h, wq, i);
	if (!t) {
		*why = "the matching list is full (tm_cap.max_num_tags tags posted)";
		return ENOMEM;
	}
	struct shm_rwqe *w = shm_tm_wqe(t);
	w->wr_id = op->tm.add.recv_wr_id;
	w->num_sge = (uint32_t)op->tm.add.num_sge;
	if (w->num_sge)
		memcpy(w->sge, op->tm.add.sg_list, w->num_sge * sizeof(w->sge[0]));
	t->tag = op->tm.add.tag;
	t->mask = op->tm.add.mask;
	t->seq = wq->tm_seq++;
	t->state = op->tm.unexpected_cnt == wq->tm_unexp ? SHM_TM_ACTIVE : SHM_TM_PENDING;
	wq->tm_used++;
	uint32_t idx = (uint32_t)(((char *)t - (char *)shm_tm_at(h, wq, 0)) / wq->tm_stride);
	op->tm.handle = t->gen << 16 | idx;
	return 0;
}

/* DEL of a tag a message consumed meanwhile fails in its completion
 * (IBV_WC_TM_ERR), not in the verb: the application cannot know. */
static enum ibv_wc_status tm_del(struct shm_hdr *h, struct shm_wq *wq, uint32_t handle)
{
	struct shm_tm_tag *t = shm_tm_at(h, wq, handle & 0xffff);

	if (t->state == SHM_TM_FREE || t->gen != handle >> 16)
		return IBV_WC_TM_ERR;
	t->state = SHM_TM_FREE;
	t->gen = (t->gen + 1) & 0xffff;
	wq->tm_used--;
	return IBV_WC_SUCCESS;
}

int sv_post_srq_ops(struct ibv_srq *ibsrq, struct ibv_ops_wr *op, struct ibv_ops_wr **bad)
{
	const char *verb = "ibv_post_srq_ops";
	struct sv_srq *srq = sv_srq(ibsrq);

	if (!sv_obj_live(ibsrq, SV_OBJ_SRQ)) {
		*bad = op;
		return sv_fail(EINVAL, verb, "SRQ %p is not live", (void *)ibsrq);
	}
	struct shm_wq *wq = srq->wq;
	if (!wq->tm_tags) {
		*bad = op;
		return sv_fail(EINVAL, verb, "SRQ %p is not a tag-matching SRQ (IBV_SRQT_TM)",
			       (void *)ibsrq);
	}
	struct shm_hdr *h = srq->cq->ctx->seg.h;
	const char *why = NULL;
	int ret = 0;

	sv_shm_lock(&wq->lock);
	for (; op && !ret; op = op->next) {
		enum ibv_wc_status status = IBV_WC_SUCCESS;
		enum ibv_wc_opcode wc = IBV_WC_TM_SYNC;
		if (op->flags & ~(IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC)) {
			why = "unknown flags";
			ret = EINVAL;
		} else if (op->opcode == IBV_WR_TAG_ADD) {
			wc = IBV_WC_TM_ADD;
			if (op->flags & IBV_OPS_TM_SYNC)
				tm_sync(h, wq, op->tm.unexpected_cnt);
			ret = tm_add(h, wq, op, &why);
		} else if (op->opcode == IBV_WR_TAG_DEL) {
			wc = IBV_WC_TM_DEL;
			if ((op->tm.handle & 0xffff) >= wq->tm_tags) {
				why = "tm.handle is no handle IBV_WR_TAG_ADD returned";
				ret = EINVAL;
			} else {
				if (op->flags & IBV_OPS_TM_SYNC)
					tm_sync(h, wq, op->tm.unexpected_cnt);
				status = tm_del(h, wq, op->tm.handle);
			}
		} else if (op->opcode == IBV_WR_TAG_SYNC) {
			wc = IBV_WC_TM_SYNC;
			tm_sync(h, wq, op->tm.unexpected_cnt);
		} else {
			why = "opcode is not IBV_WR_TAG_ADD, _DEL or _SYNC";
			ret = EINVAL;
		}
		if (ret) {
			*bad = op;
			sv_fail(ret, verb, "SRQ %p wr_id 0x%llx: %s", (void *)ibsrq,
				(unsigned long long)op->wr_id, why);
			break;
		}
		if (!(op->flags & IBV_OPS_SIGNALED) && status == IBV_WC_SUCCESS)
			continue;
		struct shm_cqe e = { .wr_id = op->wr_id, .status = status, .opcode = wc };
		if (wq->tm_synced != wq->tm_unexp)
			e.wc_flags = IBV_WC_TM_SYNC_REQ;
		sv_cq_push(h, srq->cq->sh, &e);
	}
	sv_shm_unlock(&wq->lock);
	return ret;
}
