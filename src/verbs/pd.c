/* SPDX-License-Identifier: MIT */
/* Protection domains: the scope an MR, QP, SRQ or AH must share (IBA 10.2.3). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../sv.h"

bool sv_pd_of(struct ibv_pd *pd, struct ibv_context *ctx, const char *verb)
{
	if (!sv_obj_live(pd, SV_OBJ_PD)) {
		sv_fail(EINVAL, verb, "PD %p is not a live protection domain", (void *)pd);
		return false;
	}
	if (ctx && !sv_same_ctx(pd->context, ctx)) {
		sv_fail(EINVAL, verb, "PD %p belongs to another device context; "
			"allocate it from the same context as the other objects", (void *)pd);
		return false;
	}
	return true;
}

/*
 * A handle from the PD table of the context's key segment (shm.h struct
 * shm_pd).  Slots are searched from a per-segment start and a slot's
 * generation moves on with each reuse, so that handles of different
 * contexts and of a freed PD rarely meet again.
 */
static struct shm_pd *slot_claim(struct shm_hdr *h, uint32_t *handle)
{
	struct shm_pd *t = shm_pds(h);
	uint32_t start = (h->ep * 131u) % h->n_pds;

	for (uint32_t n = 0; n < h->n_pds; n++) {
		uint32_t i = (start + n) % h->n_pds, expect = 0;
		if (atomic_load_explicit(&t[i].handle, memory_order_relaxed))
			continue;
		uint32_t gen = (t[i].last >> 16) + 1;
		if (!t[i].last)
			gen = h->ep % 0xfff0u + 1;
		if (gen > 0xffff)
			gen = 1;
		*handle = gen << 16 | i;
		/* Pairs with the release store of 0 in slot_release(): `last`
		 * is read before the claim, and a racing claimant that read
		 * the same `last` loses the compare-and-swap. */
		if (atomic_compare_exchange_strong(&t[i].handle, &expect, *handle)) {
			atomic_store_explicit(&t[i].users, 0, memory_order_relaxed);
			return &t[i];
		}
	}
	return NULL;
}

static void slot_release(struct shm_pd *s, uint32_t handle)
{
	s->last = handle;
	uint32_t expect = handle;
	atomic_compare_exchange_strong_explicit(&s->handle, &expect, 0, memory_order_release,
						memory_order_relaxed);
}

/* The slot holds this handle still: the PD was not destroyed through
 * another process's import. */
static bool slot_live(const struct shm_pd *s, uint32_t handle)
{
	return atomic_load_explicit(&s->handle, memory_order_acquire) == handle;
}

static struct sv_pd *pd_new(struct ibv_context *ctx, uint32_t handle, struct shm_pd *slot)
{
	struct sv_pd *pd = calloc(1, sizeof(*pd));

	if (!pd || sv_obj_add(pd, SV_OBJ_PD, ctx)) {
		free(pd);
		return NULL;
	}
	pd->ibpd.context = ctx;
	pd->ibpd.handle = handle;
	pd->slot = slot;
	return pd;
}

SV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	struct sv_context *c;
	struct sv_pd *pd;
	uint32_t handle;

	if (!sv_context_live(ctx, "ibv_alloc_pd"))
		return NULL;
	c = sv_ctx(ctx);
	if (atomic_fetch_add(&c->npd, 1) >= SV_MAX_PD) {
		atomic_fetch_sub(&c->npd, 1);
		return sv_fail_null(ENOMEM, "ibv_alloc_pd", "the context has max_pd=%d PDs already",
				    SV_MAX_PD);
	}
	struct shm_pd *slot = slot_claim(sv_keys(c), &handle);
	if (!slot) {
		atomic_fetch_sub(&c->npd, 1);
		return sv_fail_null(ENOMEM, "ibv_alloc_pd", "the context and its imports have "
				    "max_pd=%d PDs already", SV_MAX_PD);
	}
	pd = pd_new(ctx, handle, slot);
	if (!pd) {
		slot_release(slot, handle);
		atomic_fetch_sub(&c->npd, 1);
		return sv_fail_null(ENOMEM, "ibv_alloc_pd", "out of memory");
	}
	return &pd->ibpd;
}

void sv_pd_users_add(struct sv_pd *pd, int d)
{
	atomic_fetch_add(&pd->users, (unsigned)d);
	atomic_fetch_add(&pd->slot->users, (unsigned)d);
}

bool sv_keys_own(struct ibv_context *ctx, const char *verb)
{
	if (!sv_ctx(ctx)->home)
		return true;
	sv_fail(EOPNOTSUPP, verb, "this context was imported from pid %d, whose key table it "
		"uses; register memory and allocate windows in that process (or in a context "
		"of this one) and import them", (int)sv_ctx(ctx)->home->pid);
	return false;
}

/* ---- thread domains and parent domains (rdma-core verbs.h) ---- */

struct sv_td {
	struct ibv_td ibtd;
	atomic_uint users;	/* parent domains */
};

struct ibv_td *sv_alloc_td(struct ibv_context *ctx, struct ibv_td_init_attr *attr)
{
	if (!sv_context_live(ctx, "ibv_alloc_td"))
		return NULL;
	if (!attr || attr->comp_mask)
		return sv_fail_null(EINVAL, "ibv_alloc_td", "init_attr.comp_mask must be 0");
	struct sv_td *td = calloc(1, sizeof(*td));
	if (!td || sv_obj_add(td, SV_OBJ_TD, ctx)) {
		free(td);
		return sv_fail_null(ENOMEM, "ibv_alloc_td", "out of memory");
	}
	/* softverbs' queues take their own locks; a thread domain is the
	 * application's promise of single-threaded use, which costs nothing
	 * to accept. */
	td->ibtd.context = ctx;
	return &td->ibtd;
}

int sv_dealloc_td(struct ibv_td *ibtd)
{
	struct sv_td *td = (struct sv_td *)ibtd;

	if (!sv_obj_live(td, SV_OBJ_TD))
		return sv_fail(EINVAL, "ibv_dealloc_td", "thread domain %p is not live", (void *)ibtd);
	if (atomic_load(&td->users))
		return sv_fail(EBUSY, "ibv_dealloc_td", "thread domain %p is used by a parent domain",
			       (void *)ibtd);
	sv_obj_del(td, SV_OBJ_TD);
	free(td);
	return 0;
}

struct ibv_pd *sv_alloc_parent_domain(struct ibv_context *ctx,
				      struct ibv_parent_domain_init_attr *a)
{
	const char *verb = "ibv_alloc_parent_domain";

	if (!sv_context_live(ctx, verb))
		return NULL;
	if (!a || a->comp_mask & ~(uint32_t)(IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
					     IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT))
		return sv_fail_null(EINVAL, verb, "unknown comp_mask bits");
	if (!sv_pd_of(a->pd, ctx, verb))
		return NULL;
	if (sv_pd(a->pd)->parent)
		return sv_fail_null(EINVAL, verb, "attr.pd is itself a parent domain");
	if (a->td && (!sv_obj_live(a->td, SV_OBJ_TD) || !sv_same_ctx(a->td->context, ctx)))
		return sv_fail_null(EINVAL, verb, "attr.td is not a thread domain of this context");
	if ((a->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) && (!a->alloc || !a->free))
		return sv_fail_null(EINVAL, verb, "allocators need both alloc and free");
	struct sv_pd *pd = calloc(1, sizeof(*pd));
	if (!pd || sv_obj_add(pd, SV_OBJ_PD, ctx)) {
		free(pd);
		return sv_fail_null(ENOMEM, verb, "out of memory");
	}
	pd->ibpd.context = ctx;
	pd->ibpd.handle = a->pd->handle;
	pd->parent = sv_pd(a->pd);
	pd->td = a->td;
	if (a->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) {
		pd->alloc = a->alloc;
		pd->free = a->free;
	}
	if (a->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)
		pd->pd_context = a->pd_context;
	pd->slot = pd->parent->slot;
	sv_pd_users_add(pd->parent, 1);
	if (pd->td)
		atomic_fetch_add(&((struct sv_td *)pd->td)->users, 1);
	atomic_fetch_add(&sv_ctx(ctx)->npd, 1);
	return &pd->ibpd;
}

/* The resource type softverbs passes to a parent domain's allocator: its
 * send-queue buffers, the only queue memory private to one process. */
#define SV_RES_TYPE_SQ 0x5356000000000001ull

void *sv_pd_alloc(struct sv_pd *pd, size_t size, size_t align, bool *from_app)
{
	*from_app = false;
	if (pd->alloc) {
		void *p = pd->alloc(&pd->ibpd, pd->pd_context, size, align, SV_RES_TYPE_SQ);
		if (p != IBV_ALLOCATOR_USE_DEFAULT) {
			*from_app = p != NULL;
			if (p)
				memset(p, 0, size);
			return p;
		}
	}
	return calloc(1, size);
}

void sv_pd_free(struct sv_pd *pd, void *p, bool from_app)
{
	if (from_app)
		pd->free(&pd->ibpd, pd->pd_context, p, SV_RES_TYPE_SQ);
	else
		free(p);
}

/* destroy: the PD goes for every process (ibv_dealloc_pd); else only
 * this process's handle on an imported one (closing the context). */
static void pd_free(struct sv_pd *pd, bool destroy)
{
	if (pd->parent)
		sv_pd_users_add(pd->parent, -1);
	else if (!pd->foreign || destroy)
		slot_release(pd->slot, pd->ibpd.handle);
	if (pd->td)
		atomic_fetch_sub(&((struct sv_td *)pd->td)->users, 1);
	if (!pd->foreign)
		atomic_fetch_sub(&sv_ctx(pd->ibpd.context)->npd, 1);
	free(pd);
}

void sv_pd_release(void *obj)
{
	struct sv_pd *pd = obj;

	/* The context's PDs go in any order: a parent domain leaves its
	 * parent's count in the shared slot only. */
	if (pd->parent) {
		atomic_fetch_sub(&pd->slot->users, 1);
		free(pd);
		return;
	}
	pd_free(pd, false);
}

SV_EXPORT int ibv_dealloc_pd(struct ibv_pd *ibpd)
{
	struct sv_pd *pd = sv_pd(ibpd);

	if (!sv_pd_of(ibpd, NULL, "ibv_dealloc_pd"))
		return EINVAL;
	/* IBA 10.6.1: a PD with resources still associated cannot go; those
	 * of every process sharing it count (its slot's users), as for the
	 * kernel's object. */
	unsigned users = atomic_load(pd->parent ? &pd->users : &pd->slot->users);
	if (users)
		return sv_fail(EBUSY, "ibv_dealloc_pd", "PD %p still has %u MRs, QPs, SRQs or AHs%s; "
			       "destroy them first", (void *)ibpd, users,
			       pd->parent ? "" : " (in this and any importing process)");
	if (!pd->parent && !slot_live(pd->slot, ibpd->handle))
		return sv_fail(EINVAL, "ibv_dealloc_pd", "PD handle %u was deallocated already "
			       "through an import in another process; only ibv_unimport_pd is "
			       "left for it", ibpd->handle);
	if (!sv_obj_del(pd, SV_OBJ_PD))
		return EINVAL;
	pd_free(pd, true);
	return 0;
}

struct pd_key {
	struct sv_context *c;
	uint32_t handle;
};

static bool pd_match(const void *obj, const void *arg)
{
	const struct sv_pd *pd = obj;
	const struct pd_key *k = arg;

	return !pd->parent && pd->ibpd.handle == k->handle && sv_ctx(pd->ibpd.context) == k->c;
}

/*
 * rdma-core 44 imports name the kernel object, so within a process an
 * imported PD is the PD itself: any holder may deallocate it (which
 * destroys it for all), and unimporting frees nothing, as
 * ibv_unimport_pd(3) says.  A context imported from another process gets
 * its own handle on the home's PD slot: deallocating it destroys the PD
 * for every process (EBUSY while anything lies in it anywhere),
 * unimporting frees only the handle.  The home imports a PD an importer
 * allocated the same way.
 */
SV_EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *ctx, uint32_t handle)
{
	const char *verb = "ibv_import_pd";

	if (!sv_context_live(ctx, verb))
		return NULL;
	struct sv_context *c = sv_ctx(ctx);
	struct pd_key k = { c, handle };
	struct sv_pd *pd = sv_obj_find(SV_OBJ_PD, pd_match, &k);
	if (pd)
		return &pd->ibpd;
	struct shm_hdr *h = sv_keys(c);
	struct shm_pd *slot = &shm_pds(h)[handle & 0xffff];
	if ((handle & 0xffff) >= h->n_pds || !handle || !slot_live(slot, handle))
		return sv_fail_null(EINVAL, verb, "handle %u names no PD of this context", handle);
	pd = pd_new(ctx, handle, slot);
	if (!pd)
		return sv_fail_null(ENOMEM, verb, "out of memory");
	pd->foreign = true;
	return &pd->ibpd;
}

SV_EXPORT void ibv_unimport_pd(struct ibv_pd *ibpd)
{
	struct sv_pd *pd = sv_pd(ibpd);

	if (ibpd && sv_obj_live(ibpd, SV_OBJ_PD) && pd->foreign && !atomic_load(&pd->users) &&
	    sv_obj_del(pd, SV_OBJ_PD))
		free(pd);
}
