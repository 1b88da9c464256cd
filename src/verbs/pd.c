/* SPDX-License-Identifier: MIT */
/* Protection domains: the scope an MR, QP, SRQ or AH must share (IBA 10.2.3). */
#include <errno.h>
#include <stdlib.h>

#include "../sv.h"

bool sv_pd_of(struct ibv_pd *pd, struct ibv_context *ctx, const char *verb)
{
	if (!sv_obj_live(pd, SV_OBJ_PD)) {
		sv_fail(EINVAL, verb, "PD %p is not a live protection domain", (void *)pd);
		return false;
	}
	if (ctx && pd->context != ctx) {
		sv_fail(EINVAL, verb, "PD %p belongs to another device context; "
			"allocate it from the same context as the other objects", (void *)pd);
		return false;
	}
	return true;
}

SV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	static atomic_uint next_handle;
	struct sv_context *c;
	struct sv_pd *pd;

	if (!sv_context_live(ctx, "ibv_alloc_pd"))
		return NULL;
	c = sv_ctx(ctx);
	if (atomic_fetch_add(&c->npd, 1) >= SV_MAX_PD) {
		atomic_fetch_sub(&c->npd, 1);
		return sv_fail_null(ENOMEM, "ibv_alloc_pd", "the context has max_pd=%d PDs already",
				    SV_MAX_PD);
	}
	pd = calloc(1, sizeof(*pd));
	if (!pd || sv_obj_add(pd, SV_OBJ_PD, ctx)) {
		free(pd);
		atomic_fetch_sub(&c->npd, 1);
		return sv_fail_null(ENOMEM, "ibv_alloc_pd", "out of memory");
	}
	pd->ibpd.context = ctx;
	pd->ibpd.handle = atomic_fetch_add(&next_handle, 1);
	return &pd->ibpd;
}

SV_EXPORT int ibv_dealloc_pd(struct ibv_pd *ibpd)
{
	struct sv_pd *pd = sv_pd(ibpd);

	if (!sv_pd_of(ibpd, NULL, "ibv_dealloc_pd"))
		return EINVAL;
	/* IBA 10.6.1: a PD with resources still associated cannot go. */
	unsigned users = atomic_load(&pd->users);
	if (users)
		return sv_fail(EBUSY, "ibv_dealloc_pd", "PD %p still has %u MRs, QPs, SRQs or AHs; "
			       "destroy them first", (void *)ibpd, users);
	if (!sv_obj_del(pd, SV_OBJ_PD))
		return EINVAL;
	atomic_fetch_sub(&sv_ctx(ibpd->context)->npd, 1);
	free(pd);
	return 0;
}
