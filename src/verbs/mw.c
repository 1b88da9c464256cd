/* SPDX-License-Identifier: MIT */
/*
 * Memory windows (IBA 10.6.7): an rkey for part of an MR, granted and
 * revoked through the send queue, without re-registering anything.
 *
 * A window takes a slot of the context's key table, so its rkey is checked
 * by initiators exactly as an MR's (engine/resp.c), against the entry
 * published in the shared segment.  Binding and invalidation run in
 * send-queue order, executed by the requester (engine/mw_exec.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "../sv.h"

struct ibv_mw *sv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	const char *verb = "ibv_alloc_mw";
	struct sv_context *c;
	struct sv_mw *mw;
	uint32_t key;

	if (!sv_pd_of(pd, NULL, verb))
		return NULL;
	if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2)
		return sv_fail_null(EINVAL, verb, "type %d: a window is IBV_MW_TYPE_1 or "
				    "IBV_MW_TYPE_2", (int)type);
	if (!sv_keys_own(pd->context, verb))
		return NULL;
	c = sv_ctx(pd->context);
	mw = calloc(1, sizeof(*mw));
	if (!mw)
		return sv_fail_null(ENOMEM, verb, "out of memory");
	uint8_t kind = type == IBV_MW_TYPE_1 ? SHM_KIND_MW1 : SHM_KIND_MW2;
	if (sv_keytab_alloc(&c->mrs, mw, kind, &key)) {
		free(mw);
		return sv_fail_null(ENOMEM, verb, "the context has max_mr + max_mw = %d keys already",
				    SV_MAX_MR);
	}
	if (sv_obj_add(mw, SV_OBJ_MW, pd->context)) {
		sv_keytab_free(&c->mrs, key);
		free(mw);
		return sv_fail_null(ENOMEM, verb, "out of memory");
	}
	mw->ibmw.context = pd->context;
	mw->ibmw.pd = pd;
	mw->ibmw.rkey = key;
	mw->ibmw.handle = key;
	mw->ibmw.type = type;
	mw->key = key;
	mw->pd = sv_pd(pd);
	sv_pd_users_add(mw->pd, 1);
	/* Unbound: no key published, so its rkey grants nothing yet. */
	struct shm_mr *e = sv_key_entry(pd->context, key);
	e->kind = kind;
	e->mem = SHM_MEM_HOST;	/* the slot may have held a GPU MR */
	e->pd = sv_pd_base(mw->pd)->ibpd.handle;
	return &mw->ibmw;
}

static void mw_free(void *obj)
{
	struct sv_mw *mw = obj;
	struct sv_context *c = sv_ctx(mw->ibmw.context);
	struct shm_mr *e = sv_key_entry(mw->ibmw.context, mw->key);
	uint32_t cur = atomic_load(&e->key);

	if (cur)
		sv_key_revoke(c->seg.h, e, cur);
	sv_keytab_free(&c->mrs, mw->key);
	sv_pd_users_add(mw->pd, -1);
	free(mw);
}

int sv_dealloc_mw(struct ibv_mw *ibmw)
{
	if (!sv_obj_del(ibmw, SV_OBJ_MW))
		return sv_fail(EINVAL, "ibv_dealloc_mw", "MW %p is not allocated (deallocated "
			       "already?)", (void *)ibmw);
	mw_free(sv_mw(ibmw));
	return 0;
}

void sv_mw_release_all(struct ibv_context *ctx)
{
	sv_obj_release_all(ctx, SV_OBJ_MW, mw_free);
}

/* ibv_bind_mw (type 1 only; verbs.h checked the type, the MR's presence
 * and its PD): a BIND_MW work request, as rxe's provider posts it.  The
 * new rkey is the next key byte, and mw->rkey takes it now; a consumer
 * that gets an error completion must undo that (rdma-core's contract). */
int sv_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b)
{
	struct ibv_send_wr wr = {
		.wr_id = b->wr_id, .opcode = IBV_WR_BIND_MW, .send_flags = b->send_flags,
		.bind_mw = { .mw = mw, .rkey = ibv_inc_rkey(mw->rkey), .bind_info = b->bind_info },
	}, *bad;

	if (!sv_obj_live(mw, SV_OBJ_MW))
		return sv_fail(EINVAL, "ibv_bind_mw", "MW %p is not allocated", (void *)mw);
	int ret = sv_post_send(qp, &wr, &bad);
	if (!ret)
		mw->rkey = wr.bind_mw.rkey;
	return ret;
}
