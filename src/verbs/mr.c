/* SPDX-License-Identifier: MIT */
/*
 * Memory regions.  softverbs pins nothing -- no page is locked, so
 * RLIMIT_MEMLOCK never matters -- but registration still proves the range
 * is mapped -- and writable when the access lets anything write -- (EFAULT
 * otherwise, as get_user_pages would), checks the access
 * flags as the spec says, and hands out an lkey/rkey from the context's
 * key table.  Deregistration revokes the key before it returns.
 *
 * CUDA device memory registers too, as nvidia-peermem lets it on
 * hardware (core/gpu.c): its bytes are moved by cuMemcpy only, and other
 * processes reach it by CUDA IPC (transport/shm/gpu_ipc.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../sv.h"
#include "../transport/shm/shm.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define KNOWN_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
		      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | \
		      IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED | \
		      IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB)

/* Returns 0, EINVAL or EOPNOTSUPP, with the reason in *why. */
int sv_mr_check_access(int access, const char **why)
{
	/* Bits in IBV_ACCESS_OPTIONAL_RANGE (relaxed ordering and its kin)
	 * are hints a device may ignore (verbs.h, "optional access flags"). */
	access &= ~IBV_ACCESS_OPTIONAL_RANGE;
	if (access & ~KNOWN_ACCESS) {
		*why = "unknown access bits";
		return EINVAL;
	}
	/* IBA 10.6.3.1 / C10-46: remote write or atomic access needs local
	 * write access, since the HCA writes the memory on the peer's behalf. */
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE)) {
		*why = "IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC needs "
		       "IBV_ACCESS_LOCAL_WRITE too";
		return EINVAL;
	}
	return 0;
}

/* The kernel's get_user_pages fails with EFAULT on an unmapped page;
 * mincore(2) answers ENOMEM for exactly those, without touching memory. */
static bool range_mapped(const void *addr, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(pg - 1);
	uintptr_t end = (uintptr_t)addr + len;
	unsigned char vec[4096];
	size_t chunk = sizeof(vec) * (size_t)pg;

	for (uintptr_t p = start; p < end; p += chunk) {
		size_t n = end - p < chunk ? end - p : chunk;
		if (mincore((void *)p, n, vec) && errno == ENOMEM)
			return false;
	}
	return true;
}

/* The entry peers check this MR's rkey against (engine/resp.c publishes
 * nothing: mr_publish does; revoking and holding are the engine's). */
static struct shm_mr *mr_entry(struct sv_mr *mr)
{
	return sv_key_entry(mr->ibmr.context, mr->ibmr.lkey);
}

static void mr_publish(struct sv_mr *mr)
{
	struct shm_mr *e = mr_entry(mr);

	e->mem = mr->gpu ? SHM_MEM_CUDA : SHM_MEM_HOST;
	e->addr = (uintptr_t)mr->ibmr.addr;
	e->length = mr->ibmr.length;
	e->iova = mr->iova;
	e->access = (uint32_t)mr->access;
	e->pd = sv_pd_base(mr->pd)->ibpd.handle;
	e->kind = SHM_KIND_MR;
	e->share_off = mr->share_off;
	atomic_store(&e->key, mr->ibmr.lkey);
}

/* Shareable memory gets a description peers can map (direct.c); an ODP
 * MR may cover what is not mapped yet, so it never does. */
static void mr_describe(struct sv_mr *mr)
{
	struct sv_context *c = sv_ctx(mr->ibmr.context);

	if (mr->gpu)
		return;		/* its CUDA IPC handle, described at creation */
	if (mr->share_off)
		sv_seg_free(&c->seg, mr->share_off, sizeof(struct shm_share));
	mr->share_off = mr->access & IBV_ACCESS_ON_DEMAND ? 0 :
			sv_direct_describe(&c->seg, mr->ibmr.addr, mr->ibmr.length);
}

/* After the key is gone, SENDs still waiting for their receiver to place
 * them land too (transport/shm/defer.c): nothing is written into the
 * memory once the verb returns. */
static void mr_revoke(struct sv_mr *mr)
{
	struct shm_hdr *h = sv_ctx(mr->ibmr.context)->seg.h;

	sv_key_revoke(h, mr_entry(mr), mr->ibmr.lkey);
	sv_defer_flush(h, h);
}

/* ib_umem_get pins with FOLL_WRITE whenever the access lets anything
 * write (ib_access_writable), and get_user_pages then fails with EFAULT on
 * a page mapped without write permission.  Here it also keeps a peer's
 * write, or the target's own thread answering an atomic (assist.c), from
 * meeting a read-only page. */
static bool writes(int access)
{
	return access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND);
}

static bool vma_writable(const struct sv_vma *v, void *arg)
{
	(void)arg;
	return v->perms[1] == 'w';
}

/* `gpu`: why the range is no GPU memory either, where that was asked. */
static int check_writable(void *addr, size_t length, int access, const char *verb,
			  const char *gpu)
{
	/* A maps file that cannot be read proves nothing: the copies still
	 * fail cleanly. */
	if (writes(access) && !(access & IBV_ACCESS_ON_DEMAND) &&
	    !sv_vma_walk(addr, length, vma_writable, NULL))
		return sv_fail(EFAULT, verb, "[%p, +%zu) is not all writable memory, and access 0x%x "
			       "lets it be written%s%s", addr, length, (unsigned)access,
			       gpu && *gpu ? "; " : "", gpu ? gpu : "");
	return 0;
}

static int check_range(void *addr, size_t length, int access, const char *verb, const char *gpu)
{
	if (!length)
		return sv_fail(EINVAL, verb, "length is 0");
	if ((uintptr_t)addr + length < (uintptr_t)addr)
		return sv_fail(EINVAL, verb, "addr %p + length %zu wraps around", addr, length);
	if (!range_mapped(addr, length))
		return sv_fail(EFAULT, verb, "[%p, +%zu) is not all mapped memory%s%s", addr, length,
			       gpu && *gpu ? "; " : "", gpu ? gpu : "");
	return check_writable(addr, length, access, verb, gpu);
}

/* 1: GPU memory, registrable (g filled); 0: not GPU memory (why says how
 * that was found); -1: failed, errno set. */
static int probe_gpu(void *addr, size_t length, unsigned access, struct sv_gpu_mem *g,
		     char *why, size_t wlen, const char *verb)
{
	if (!length || (uintptr_t)addr + length < (uintptr_t)addr)
		return 0;	/* check_range says what is wrong */
	int gpu = sv_gpu_probe(addr, length, g, why, wlen);
	if (gpu < 0)
		return sv_fail(-gpu, verb, "[%p, +%zu): %s", addr, length, why), -1;
	/* nvidia-peermem pins GPU pages; there is no on-demand paging of
	 * device memory to register. */
	if (gpu && (access & IBV_ACCESS_ON_DEMAND))
		return sv_fail(EOPNOTSUPP, verb, "[%p, +%zu) is GPU memory, which cannot be registered "
			       "with IBV_ACCESS_ON_DEMAND", addr, length), -1;
	return gpu;
}

static int check_access(int access, const char *verb)
{
	const char *why;
	int ret = sv_mr_check_access(access, &why);

	return ret ? sv_fail(ret, verb, "access 0x%x: %s", (unsigned)access, why) : 0;
}

/* IBV_ACCESS_ON_DEMAND over the whole address space: rdma-core's implicit
 * ODP MR (addr NULL, length SIZE_MAX). */
static bool implicit_odp(void *addr, size_t length, unsigned access)
{
	return (access & IBV_ACCESS_ON_DEMAND) && !addr && length == SIZE_MAX;
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
					  uint64_t iova, unsigned int access)
{
	const char *verb = "ibv_reg_mr";
	struct sv_gpu_mem g = { 0 };
	char why[200] = "";
	int ret, gpu = 0;

	if (!sv_pd_of(pd, NULL, verb))
		return NULL;
	ret = check_access((int)access, verb);
	if (!ret && !implicit_odp(addr, length, access)) {
		gpu = probe_gpu(addr, length, access, &g, why, sizeof(why), verb);
		if (gpu < 0)
			return NULL;
	}
	/* Nothing is ever pinned, so on-demand paging is what every MR
	 * already is; an ODP MR only skips the proof that its pages are
	 * mapped now, and its accesses fail cleanly when they are not. */
	if (!ret && !gpu && !implicit_odp(addr, length, access)) {
		if (access & IBV_ACCESS_ON_DEMAND) {
			if (!length || (uintptr_t)addr + length < (uintptr_t)addr)
				ret = sv_fail(EINVAL, verb, "addr %p length %zu is not a range", addr,
					      length);
		} else {
			ret = check_range(addr, length, (int)access, verb, why);
		}
	}
	if (ret)
		return NULL;
	return sv_mr_new(pd, addr, length, access & IBV_ACCESS_ZERO_BASED ? 0 : iova, access,
			 NULL, gpu ? &g : NULL, verb);
}

/* A GPU MR's device range is known to the copy layer, and its IPC
 * handle is in the segment for peers.  Memory CUDA IPC cannot export
 * (the virtual memory management API's, stream-ordered pools') still
 * registers: this process reaches it, other processes cannot. */
static int gpu_attach(struct sv_mr *mr, const struct sv_gpu_mem *g, const char *verb)
{
	struct sv_context *c = sv_ctx(mr->ibmr.context);
	char why[200];

	mr->share_off = sv_gpu_describe(&c->seg, g, mr->ibmr.addr, why, sizeof(why));
	if (!mr->share_off)
		sv_dbg("%s: GPU memory [%p, +%zu) without an IPC handle (%s): other processes "
		       "cannot reach it", verb, mr->ibmr.addr, mr->ibmr.length, why);
	if (sv_gpu_track(mr->ibmr.addr, mr->ibmr.length, g->ctx, g->sync)) {
		if (mr->share_off)
			sv_seg_free(&c->seg, mr->share_off, sizeof(struct shm_share));
		return sv_fail(ENOMEM, verb, "out of memory");
	}
	mr->gpu = true;
	return 0;
}

/* After the key is revoked: no peer holds the range open any more. */
static void gpu_detach(struct sv_mr *mr)
{
	struct sv_context *c = sv_ctx(mr->ibmr.context);

	if (!mr->gpu)
		return;
	if (mr->share_off)
		sv_gpu_release(c->seg.h, mr->share_off);
	sv_gpu_untrack(mr->ibmr.addr, mr->ibmr.length);
	if (mr->share_off)
		sv_seg_free(&c->seg, mr->share_off, sizeof(struct shm_share));
	mr->share_off = 0;
	mr->gpu = false;
}

struct ibv_mr *sv_mr_new(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
			 unsigned access, struct sv_dm *dm, const struct sv_gpu_mem *gpu,
			 const char *verb)
{
	struct sv_context *c = sv_ctx(pd->context);
	struct sv_mr *mr;
	uint32_t key;

	if (!sv_keys_own(pd->context, verb))
		return NULL;
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return sv_fail_null(ENOMEM, verb, "out of memory");
	mr->ibmr.addr = addr;
	mr->ibmr.length = length;
	mr->ibmr.context = pd->context;
	if (gpu && gpu_attach(mr, gpu, verb)) {
		free(mr);
		return NULL;
	}
	if (sv_keytab_alloc(&c->mrs, mr, SHM_KIND_MR, &key)) {
		gpu_detach(mr);
		free(mr);
		return sv_fail_null(ENOMEM, verb, "the context has max_mr=%d MRs already", SV_MAX_MR);
	}
	mr->ibmr.context = pd->context;
	mr->ibmr.pd = pd;
	mr->ibmr.addr = addr;
	mr->ibmr.length = length;
	mr->ibmr.handle = key;
	mr->ibmr.lkey = key;
	mr->ibmr.rkey = key;
	mr->pd = sv_pd(pd);
	mr->access = (int)access;
	mr->iova = iova;
	mr->dm = dm;
	if (sv_obj_add(mr, SV_OBJ_MR, pd->context)) {
		sv_keytab_free(&c->mrs, key);
		gpu_detach(mr);
		free(mr);
		return sv_fail_null(ENOMEM, verb, "out of memory");
	}
	sv_pd_users_add(mr->pd, 1);
	if (dm)
		atomic_fetch_add(&dm->users, 1);
	if (access & IBV_ACCESS_ON_DEMAND)
		atomic_fetch_add(&sv_odp_mrs, 1);
	mr_describe(mr);
	mr_publish(mr);
	sv_dbg("reg_mr %p len %zu access 0x%x%s -> key 0x%x", addr, length, access,
	       gpu ? " (GPU memory)" : "", key);
	return &mr->ibmr;
}

SV_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
					 uint64_t iova, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

SV_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
					   uint64_t iova, int fd, int access)
{
	(void)pd; (void)offset; (void)length; (void)iova; (void)access;
	/* softverbs moves bytes itself, and cannot reach a dma-buf's from
	 * user space: NVIDIA's exporter refuses mmap, the CUDA driver API
	 * maps no fd back to a device pointer, and CMA cannot reach
	 * PFN-mapped memory (README, "GPU memory"). */
	return sv_fail_null(EOPNOTSUPP, "ibv_reg_dmabuf_mr", "fd %d: softverbs cannot reach a "
			    "dma-buf's bytes from user space; register a CUDA device pointer with "
			    "ibv_reg_mr instead", fd);
}

/* An MR imported from another process's context: ibv_dereg_mr destroys
 * it for every process (the key revoked in the home's table, as the
 * home's own dereg would: holders drained first), closing the context
 * only drops this handle.  The home's slot stays its owner's until the
 * owner deregisters or closes. */
static void foreign_free(struct sv_mr *mr, bool destroy)
{
	struct sv_context *c = sv_ctx(mr->ibmr.context);
	if (destroy && sv_key_revoke_if(c->home, &shm_mrs(c->home)[mr->ibmr.lkey >> 8],
					mr->ibmr.lkey))
		sv_defer_flush(c->home, c->seg.h);
	atomic_fetch_sub(&mr->pd->users, 1);
	free(mr);
}

static void mr_free(void *obj)
{
	struct sv_mr *mr = obj;

	if (mr->foreign) {
		foreign_free(mr, false);
		return;
	}
	/* The key dies first: from here no new access can resolve it. */
	mr_revoke(mr);
	sv_keytab_free(&sv_ctx(mr->ibmr.context)->mrs, mr->ibmr.lkey);
	sv_pd_users_add(mr->pd, -1);
	if (mr->dm)
		atomic_fetch_sub(&mr->dm->users, 1);
	if (mr->access & IBV_ACCESS_ON_DEMAND)
		atomic_fetch_sub(&sv_odp_mrs, 1);
	gpu_detach(mr);
	if (mr->share_off)
		sv_seg_free(&sv_ctx(mr->ibmr.context)->seg, mr->share_off, sizeof(struct shm_share));
	free(mr);
}

SV_EXPORT int ibv_dereg_mr(struct ibv_mr *ibmr)
{
	if (!sv_obj_del(ibmr, SV_OBJ_MR))
		return sv_fail(EINVAL, "ibv_dereg_mr", "MR %p is not registered "
			       "(deregistered already?)", (void *)ibmr);
	if (sv_mr(ibmr)->foreign)
		foreign_free(sv_mr(ibmr), true);
	else
		mr_free(sv_mr(ibmr));
	return 0;
}

void sv_mr_release_all(struct ibv_context *ctx)
{
	sv_obj_release_all(ctx, SV_OBJ_MR, mr_free);
}

/* rdma-core's enum ibv_rereg_mr_err_code values. */
enum { REREG_ERR_INPUT = -1, REREG_ERR_CMD = -4 };

SV_EXPORT int ibv_rereg_mr(struct ibv_mr *ibmr, int flags, struct ibv_pd *pd, void *addr,
			   size_t length, int access)
{
	const char *verb = "ibv_rereg_mr";
	struct sv_mr *mr = sv_mr(ibmr);

	if (!sv_obj_live(ibmr, SV_OBJ_MR))
		return sv_fail(EINVAL, verb, "MR %p is not registered", (void *)ibmr), REREG_ERR_INPUT;
	if (mr->foreign)
		return sv_fail(EOPNOTSUPP, verb, "MR key 0x%x was imported from pid %d; "
			       "reregister it there", ibmr->lkey,
			       (int)sv_ctx(ibmr->context)->home->pid), REREG_ERR_INPUT;
	if (mr->dm)
		return sv_fail(EINVAL, verb, "MR key 0x%x is on device memory; register it anew "
			       "with ibv_reg_dm_mr instead", ibmr->lkey), REREG_ERR_INPUT;
	if (mr->gpu)
		return sv_fail(EOPNOTSUPP, verb, "MR key 0x%x is GPU memory, which softverbs does "
			       "not reregister; deregister it and register anew", ibmr->lkey),
		       REREG_ERR_INPUT;
	if (!flags || (flags & ~(IBV_REREG_MR_FLAGS_SUPPORTED)))
		return sv_fail(EINVAL, verb, "flags 0x%x: need one or more of CHANGE_TRANSLATION, "
			       "CHANGE_PD, CHANGE_ACCESS", (unsigned)flags), REREG_ERR_INPUT;
	if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!addr || !length))
		return sv_fail(EINVAL, verb, "CHANGE_TRANSLATION needs addr and length"),
		       REREG_ERR_INPUT;
	if ((flags & IBV_REREG_MR_CHANGE_PD) && !sv_pd_of(pd, ibmr->context, verb))
		return REREG_ERR_INPUT;
	if ((flags & IBV_REREG_MR_CHANGE_ACCESS) && check_access(access, verb))
		return REREG_ERR_CMD;
	int eff = flags & IBV_REREG_MR_CHANGE_ACCESS ? access : (int)mr->access;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		struct sv_gpu_mem g;
		char why[200] = "";
		int gpu = probe_gpu(addr, length, (unsigned)eff, &g, why, sizeof(why), verb);
		if (gpu > 0)
			sv_fail(EOPNOTSUPP, verb, "[%p, +%zu) is GPU memory: register it with "
				"ibv_reg_mr instead", addr, length);
		if (gpu || check_range(addr, length, eff, verb, why))
			return REREG_ERR_CMD;
	}
	if (!(flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (flags & IBV_REREG_MR_CHANGE_ACCESS) &&
	    check_writable(ibmr->addr, ibmr->length, eff, verb, NULL))
		return REREG_ERR_CMD;
	/* Every check passed: apply all changes, none partially, with the
	 * key revoked meanwhile so that no peer sees half of them. */
	mr_revoke(mr);
	if (flags & IBV_REREG_MR_CHANGE_PD) {
		sv_pd_users_add(mr->pd, -1);
		mr->pd = sv_pd(pd);
		sv_pd_users_add(mr->pd, 1);
		ibmr->pd = pd;
	}
	if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
		int was = mr->access & IBV_ACCESS_ON_DEMAND, now = access & IBV_ACCESS_ON_DEMAND;
		if (was != now)
			atomic_fetch_add(&sv_odp_mrs, now ? 1 : -1);
		mr->access = access;
	}
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		ibmr->addr = addr;
		ibmr->length = length;
		mr->iova = mr->access & IBV_ACCESS_ZERO_BASED ? 0 : (uintptr_t)addr;
	}
	if (flags & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS))
		mr_describe(mr);
	mr_publish(mr);
	return 0;
}

int sv_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
		 struct ibv_sge *sg, uint32_t num_sge)
{
	const char *verb = "ibv_advise_mr";

	if (!sv_pd_of(pd, NULL, verb))
		return EINVAL;
	if (advice > IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT || (flags & ~IBV_ADVISE_MR_FLAG_FLUSH))
		return sv_fail(EINVAL, verb, "advice %d flags 0x%x: unknown", advice, flags);
	if (!num_sge || !sg)
		return sv_fail(EINVAL, verb, "no SGEs given");
	for (uint32_t i = 0; i < num_sge; i++) {
		struct sv_mr *mr = sv_keytab_lookup(&sv_ctx(pd->context)->mrs, sg[i].lkey, SHM_KIND_MR);
		if (!mr || sv_pd_base(mr->pd) != sv_pd_base(sv_pd(pd)) ||
		    !(mr->access & IBV_ACCESS_ON_DEMAND))
			return sv_fail(EINVAL, verb, "lkey 0x%x is not an ODP MR of this PD", sg[i].lkey);
		/* Prefetch is a hint; the kernel's is the right one. */
		if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) {
			long pg = sysconf(_SC_PAGESIZE);
			uintptr_t a = (uintptr_t)sg[i].addr & ~(uintptr_t)(pg - 1);
			madvise((void *)a, sg[i].length + (sg[i].addr - a), MADV_WILLNEED);
		}
	}
	return 0;
}

/* The home's MR behind handle, for a context imported from another
 * process: a registered MR (not a window) of that PD.  The imported MR
 * has the home's keys, and no address, as rdma-core's (ibv_import_mr(3):
 * addr "is not applicable"). */
static struct ibv_mr *import_foreign(struct ibv_pd *pd, uint32_t handle)
{
	const char *verb = "ibv_import_mr";
	struct shm_hdr *h = sv_ctx(pd->context)->home;
	uint32_t idx = handle >> 8;
	const struct shm_mr *e = idx && idx < h->n_mrs ? &shm_mrs(h)[idx] : NULL;

	/* Pairs with the release store of the key in mr_publish(). */
	if (!e || atomic_load_explicit(&e->key, memory_order_acquire) != handle ||
	    e->kind != SHM_KIND_MR || e->pd != sv_pd_base(sv_pd(pd))->ibpd.handle)
		return sv_fail_null(EINVAL, verb, "handle %u names no MR of this PD in pid %d",
				    handle, (int)h->pid);
	struct sv_mr *mr = calloc(1, sizeof(*mr));
	if (!mr || sv_obj_add(mr, SV_OBJ_MR, pd->context)) {
		free(mr);
		return sv_fail_null(ENOMEM, verb, "out of memory");
	}
	mr->ibmr.context = pd->context;
	mr->ibmr.pd = pd;
	mr->ibmr.length = e->length;
	mr->ibmr.handle = mr->ibmr.lkey = mr->ibmr.rkey = handle;
	mr->pd = sv_pd(pd);
	mr->access = (int)e->access;
	mr->iova = e->iova;
	mr->foreign = true;
	atomic_fetch_add(&mr->pd->users, 1);
	return &mr->ibmr;
}

/* As ibv_import_pd: within a process, the MR itself, found by its handle
 * (its key); from another process's context, a handle on the home's. */
SV_EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t handle)
{
	const char *verb = "ibv_import_mr";

	if (!sv_pd_of(pd, NULL, verb))
		return NULL;
	if (sv_ctx(pd->context)->home)
		return import_foreign(pd, handle);
	struct sv_mr *mr = sv_keytab_lookup(&sv_ctx(pd->context)->mrs, handle, SHM_KIND_MR);
	if (!mr || sv_pd_base(mr->pd) != sv_pd_base(sv_pd(pd)))
		return sv_fail_null(EINVAL, verb, "handle %u names no MR of this PD", handle);
	return &mr->ibmr;
}

SV_EXPORT void ibv_unimport_mr(struct ibv_mr *ibmr)
{
	if (ibmr && sv_obj_live(ibmr, SV_OBJ_MR) && sv_mr(ibmr)->foreign &&
	    sv_obj_del(ibmr, SV_OBJ_MR))
		foreign_free(sv_mr(ibmr), false);
}
