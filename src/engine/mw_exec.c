/* SPDX-License-Identifier: MIT */
/*
 * BIND_MW and LOCAL_INV as the requester executes them, in send-queue
 * order as on hardware: a bind revokes the window's entry (no initiator
 * still holds it), rewrites its range and rights, and publishes the new
 * rkey last; an invalidation revokes it.  The rules are those of
 * rxe_mw.c, with the spec's numbers.  The window objects are verbs/mw.c's.
 */
#define _GNU_SOURCE
#include <stdio.h>

#include "engine.h"

#define WHY(...) (snprintf(why, len, __VA_ARGS__), -1)

/* The checks of IBA 10.6.7.2.1 / rxe_check_bind_mw, in its order. */
static int bind_check(struct sv_qp *qp, struct sv_mw *mw, uint32_t rkey,
		      const struct ibv_mw_bind_info *b, char *why, size_t len)
{
	struct sv_mr *mr = sv_mr(b->mr);
	unsigned acc = b->mw_access_flags;
	bool type1 = mw->ibmw.type == IBV_MW_TYPE_1;

	if ((rkey >> 8) != (mw->ibmw.rkey >> 8))
		return WHY("new rkey 0x%x does not keep the window's index (rkey 0x%x); derive it "
			   "with ibv_inc_rkey()", rkey, mw->ibmw.rkey);
	if (type1 && (acc & IBV_ACCESS_ZERO_BASED))	/* o10-36.2.2 */
		return WHY("a type 1 window cannot be zero-based");
	if (!type1) {
		/* o10-37.2.30: a type 2 window is bound once, until invalidated. */
		if (atomic_load(&sv_key_entry(mw->ibmw.context, mw->ibmw.rkey)->key))
			return WHY("type 2 window rkey 0x%x is bound; invalidate it first",
				   mw->ibmw.rkey);
		/* C10-72 */
		if (sv_pd_base(qp->pd) != sv_pd_base(mw->pd))
			return WHY("the window's PD is not the QP's");
		/* o10-37.2.40 */
		if (!mr || !b->length)
			return WHY("a type 2 window is invalidated with LOCAL_INV or SEND_WITH_INV, "
				   "not by binding zero length");
	}
	if (!mr)
		return 0;
	if (!sv_obj_live(mr, SV_OBJ_MR))
		return WHY("bind_info.mr %p is not a registered MR", (void *)mr);
	if (sv_pd_base(mr->pd) != sv_pd_base(mw->pd))
		return WHY("the MR's PD is not the window's");
	if (mr->access & IBV_ACCESS_ZERO_BASED)
		return WHY("MR lkey 0x%x is zero-based; windows bind to virtually addressed MRs",
			   mr->ibmr.lkey);
	if (!(mr->access & IBV_ACCESS_MW_BIND))	/* C10-73 */
		return WHY("MR lkey 0x%x was registered without IBV_ACCESS_MW_BIND", mr->ibmr.lkey);
	if ((acc & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(mr->access & IBV_ACCESS_LOCAL_WRITE))	/* C10-74 */
		return WHY("a writable window needs an MR with IBV_ACCESS_LOCAL_WRITE");
	/* C10-75: the window lies inside its MR. */
	bool zb = acc & IBV_ACCESS_ZERO_BASED;
	uint64_t start = zb ? mr->iova : b->addr;
	if (b->length > mr->ibmr.length || start < mr->iova ||
	    start - mr->iova > mr->ibmr.length - b->length)
		return WHY("window [0x%llx, +%llu) is not inside MR lkey 0x%x [0x%llx, +%zu)",
			   (unsigned long long)b->addr, (unsigned long long)b->length,
			   mr->ibmr.lkey, (unsigned long long)mr->iova, mr->ibmr.length);
	return 0;
}

int sv_mw_exec_bind(struct sv_qp *qp, struct ibv_mw *ibmw, uint32_t rkey,
		    const struct ibv_mw_bind_info *b, char *why, size_t len)
{
	if (!sv_obj_live(ibmw, SV_OBJ_MW))
		return WHY("MW %p is not allocated", (void *)ibmw);
	struct sv_mw *mw = sv_mw(ibmw);
	if (bind_check(qp, mw, rkey, b, why, len))
		return -1;

	/* A type 1 rebind replaces a live binding: nobody may still be
	 * using the old one when its range changes. */
	struct shm_mr *e = sv_key_entry(ibmw->context, rkey);
	uint32_t cur = atomic_load(&e->key);
	if (cur)
		sv_key_revoke(sv_ctx(mw->ibmw.context)->seg.h, e, cur);
	/* The key table follows the rkey, so LOCAL_INV finds it. */
	sv_keytab_rekey(&sv_ctx(ibmw->context)->mrs, mw->key, rkey);
	mw->key = rkey;
	if (!b->mr || !b->length)
		return 0;	/* type 1 with zero length: unbound (o10-36.2.4) */
	struct sv_mr *mr = sv_mr(b->mr);
	bool zb = b->mw_access_flags & IBV_ACCESS_ZERO_BASED;
	uint64_t start = zb ? mr->iova : b->addr;
	e->access = b->mw_access_flags;
	e->mem = mr->gpu ? SHM_MEM_CUDA : SHM_MEM_HOST;	/* the memory is its MR's */
	e->pd = sv_pd_base(mw->pd)->ibpd.handle;
	e->addr = (uintptr_t)mr->ibmr.addr + (start - mr->iova);
	e->length = b->length;
	e->iova = zb ? 0 : b->addr;
	e->mw.mr_key = mr->ibmr.lkey;
	e->mw.qpn = ibmw->type == IBV_MW_TYPE_2 ? qp->ex.qp_base.qp_num : 0;
	atomic_store(&e->key, rkey);	/* publish last; pairs with hold_mr's loads */
	if (ibmw->type == IBV_MW_TYPE_2)
		ibmw->rkey = rkey;
	return 0;
}

int sv_mw_exec_local_inv(struct sv_qp *qp, uint32_t rkey, char *why, size_t len)
{
	struct sv_context *c = qp->ctx;
	struct sv_mw *mw = sv_keytab_lookup(&c->mrs, rkey, SHM_KIND_MW2);

	if (!mw) {
		if (sv_keytab_lookup(&c->mrs, rkey, SHM_KIND_MW1))
			return WHY("rkey 0x%x is a type 1 window, which only a zero-length "
				   "ibv_bind_mw unbinds", rkey);
		if (sv_keytab_lookup(&c->mrs, rkey, SHM_KIND_MR))
			return WHY("rkey 0x%x is an MR; softverbs has no fast-registration MRs, "
				   "so only windows can be invalidated", rkey);
		return WHY("rkey 0x%x is not a memory window of this context", rkey);
	}
	if (sv_pd_base(mw->pd) != sv_pd_base(qp->pd))
		return WHY("window rkey 0x%x is in another PD than the QP", rkey);
	struct shm_mr *e = sv_key_entry(mw->ibmw.context, rkey);
	if (atomic_load(&e->key) != rkey)
		return WHY("window rkey 0x%x is not bound (invalidated already?)", rkey);
	sv_key_revoke(sv_ctx(mw->ibmw.context)->seg.h, e, rkey);
	return 0;
}
