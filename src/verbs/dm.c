/* SPDX-License-Identifier: MIT */
/*
 * Device memory (rdma-core verbs.h, ibv_alloc_dm): memory "on the
 * device", which for softverbs is a block of the context's shared
 * segment.  That makes it what hardware device memory is for: every peer
 * on the host maps it and reaches it by plain loads and stores, with no
 * kernel call, and the owner's CPU never copies for them.
 *
 * The access rules are mlx5's, which rdma-core's tests encode: offsets and
 * lengths of ibv_memcpy_{to,from}_dm are multiples of 4 and inside the
 * allocation; an MR on device memory is zero-based and inside it too.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../sv.h"

#define DM_ALIGN 4u

static struct sv_dm *to_dm(struct ibv_dm *d)
{
	return (struct sv_dm *)d;
}

static bool dm_range_ok(struct sv_dm *dm, uint64_t off, size_t len, const char *verb)
{
	if ((off | len) % DM_ALIGN) {
		sv_fail(EINVAL, verb, "offset %llu and length %zu must be multiples of %u",
			(unsigned long long)off, len, DM_ALIGN);
		return false;
	}
	if (off > dm->len || len > dm->len - off) {
		sv_fail(EINVAL, verb, "[%llu, +%zu) is outside the %llu bytes of device memory",
			(unsigned long long)off, len, (unsigned long long)dm->len);
		return false;
	}
	return true;
}

static int memcpy_to_dm(struct ibv_dm *d, uint64_t off, const void *host, size_t len)
{
	struct sv_dm *dm = to_dm(d);

	if (!dm_range_ok(dm, off, len, "ibv_memcpy_to_dm"))
		return EINVAL;
	memcpy(dm->base + off, host, len);
	return 0;
}

static int memcpy_from_dm(void *host, struct ibv_dm *d, uint64_t off, size_t len)
{
	struct sv_dm *dm = to_dm(d);

	if (!dm_range_ok(dm, off, len, "ibv_memcpy_from_dm"))
		return EINVAL;
	memcpy(host, dm->base + off, len);
	return 0;
}

static struct sv_dm *dm_new(struct ibv_context *ctx, struct shm_hdr *seg, uint64_t data_off,
			    uint64_t len)
{
	struct sv_dm *dm = calloc(1, sizeof(*dm));

	if (!dm)
		return NULL;
	dm->ibdm.context = ctx;
	dm->ibdm.memcpy_to_dm = memcpy_to_dm;
	dm->ibdm.memcpy_from_dm = memcpy_from_dm;
	dm->ibdm.handle = (uint32_t)data_off;
	dm->base = shm_at(seg, data_off);
	dm->len = len;
	if (sv_obj_add(dm, SV_OBJ_DM, ctx)) {
		free(dm);
		return NULL;
	}
	return dm;
}

struct ibv_dm *sv_alloc_dm(struct ibv_context *ctx, struct ibv_alloc_dm_attr *attr)
{
	const char *verb = "ibv_alloc_dm";
	struct sv_context *c = sv_ctx(ctx);

	if (!sv_context_live(ctx, verb))
		return NULL;
	if (attr->comp_mask)
		return sv_fail_null(EINVAL, verb, "comp_mask 0x%x: no extension is defined",
				    attr->comp_mask);
	if (!attr->length || attr->length > SV_MAX_DM_SIZE)
		return sv_fail_null(ENOMEM, verb, "length %zu: device memory is 1 to max_dm_size=%u "
				    "bytes per allocation", attr->length, SV_MAX_DM_SIZE);
	if (attr->log_align_req > SV_DM_MAX_LOG_ALIGN)
		return sv_fail_null(EINVAL, verb, "log_align_req %u: at most %u (page alignment)",
				    attr->log_align_req, SV_DM_MAX_LOG_ALIGN);
	uint64_t align = 1ull << attr->log_align_req;
	if (align < SHM_ALIGN)
		align = SHM_ALIGN;
	/* The header, then the data at the first aligned offset after it. */
	uint64_t block_len = SHM_ALIGN + (align - SHM_ALIGN) + attr->length;
	uint64_t block = sv_seg_alloc(&c->seg, block_len);
	if (!block)
		return sv_fail_null(ENOMEM, verb, "the context's shared segment is full");
	uint64_t data = (block + SHM_ALIGN + align - 1) & ~(align - 1);
	struct sv_dm *dm = dm_new(ctx, c->seg.h, data, attr->length);
	if (!dm) {
		sv_seg_free(&c->seg, block, block_len);
		return sv_fail_null(ENOMEM, verb, "out of memory");
	}
	dm->block_off = block;
	dm->block_len = block_len;
	struct shm_dm *h = shm_at(c->seg.h, data - SHM_ALIGN);
	h->len = attr->length;
	atomic_store_explicit(&h->magic, SHM_DM_MAGIC, memory_order_release);
	return &dm->ibdm;
}

static void dm_free(void *obj)
{
	struct sv_dm *dm = obj;
	struct sv_context *c = sv_ctx(dm->ibdm.context);

	if (!dm->imported) {
		struct shm_dm *h = shm_at(c->seg.h, dm->ibdm.handle - SHM_ALIGN);
		atomic_store_explicit(&h->magic, 0, memory_order_release);
		sv_seg_free(&c->seg, dm->block_off, dm->block_len);
	}
	free(dm);
}

int sv_free_dm(struct ibv_dm *d)
{
	struct sv_dm *dm = to_dm(d);

	if (!sv_obj_live(d, SV_OBJ_DM))
		return sv_fail(EINVAL, "ibv_free_dm", "DM %p is not allocated (freed already?)",
			       (void *)d);
	if (dm->imported)
		return sv_fail(EINVAL, "ibv_free_dm", "DM %p was imported; ibv_unimport_dm releases "
			       "it and its owner frees it", (void *)d);
	if (atomic_load(&dm->users))
		return sv_fail(EBUSY, "ibv_free_dm", "device memory handle %u still has %u MRs; "
			       "deregister them first", d->handle, atomic_load(&dm->users));
	sv_obj_del(d, SV_OBJ_DM);
	dm_free(dm);
	return 0;
}

struct ibv_mr *sv_reg_dm_mr(struct ibv_pd *pd, struct ibv_dm *d, uint64_t off, size_t length,
			    unsigned int access)
{
	const char *verb = "ibv_reg_dm_mr";
	const char *why;
	struct sv_dm *dm = to_dm(d);

	if (!sv_pd_of(pd, NULL, verb))
		return NULL;
	if (!d || !sv_obj_live(d, SV_OBJ_DM) || !sv_same_ctx(d->context, pd->context))
		return sv_fail_null(EINVAL, verb, "DM %p is not device memory of the PD's context",
				    (void *)d);
	/* rdma-core verbs.h: device memory is addressed from its start. */
	if (!(access & IBV_ACCESS_ZERO_BASED))
		return sv_fail_null(EINVAL, verb, "access 0x%x lacks IBV_ACCESS_ZERO_BASED, which "
				    "device memory MRs require", access);
	if (access & IBV_ACCESS_ON_DEMAND)
		return sv_fail_null(EINVAL, verb, "device memory is never paged on demand");
	int err = sv_mr_check_access((int)access, &why);
	if (err)
		return sv_fail_null(err, verb, "access 0x%x: %s", access, why);
	/* Zero length is allowed, as mlx5_ib_reg_dm_mr allows it. */
	if (off > dm->len || length > dm->len - off)
		return sv_fail_null(EINVAL, verb, "[%llu, +%zu) is not inside the %llu bytes of "
				    "device memory", (unsigned long long)off, length,
				    (unsigned long long)dm->len);
	return sv_mr_new(pd, dm->base + off, length, 0, access, dm, NULL, verb);
}

void sv_dm_release_all(struct ibv_context *ctx)
{
	sv_obj_release_all(ctx, SV_OBJ_DM, dm_free);
}

/* rdma-core 44: another handle on the same device memory, in a context
 * sharing the owner's (here: its segment, mapped in every process that
 * imports the context); freeing stays the owner's. */
SV_EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *ctx, uint32_t handle)
{
	const char *verb = "ibv_import_dm";

	if (!sv_context_live(ctx, verb))
		return NULL;
	/* A context imported from another process imports the home's. */
	struct shm_hdr *h = sv_keys(sv_ctx(ctx));
	if (handle < h->heap_off + SHM_ALIGN || handle >= h->size || handle % SHM_ALIGN)
		return sv_fail_null(EINVAL, verb, "handle %u names no device memory of this context",
				    handle);
	struct shm_dm *sd = shm_at(h, handle - SHM_ALIGN);
	if (atomic_load_explicit(&sd->magic, memory_order_acquire) != SHM_DM_MAGIC)
		return sv_fail_null(EINVAL, verb, "handle %u names no device memory of this context",
				    handle);
	struct sv_dm *dm = dm_new(ctx, h, handle, sd->len);
	if (!dm)
		return sv_fail_null(ENOMEM, verb, "out of memory");
	dm->imported = true;
	return &dm->ibdm;
}

SV_EXPORT void ibv_unimport_dm(struct ibv_dm *d)
{
	if (d && to_dm(d)->imported && sv_obj_del(d, SV_OBJ_DM))
		dm_free(to_dm(d));
}
