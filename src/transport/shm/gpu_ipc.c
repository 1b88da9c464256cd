/* SPDX-License-Identifier: MIT */
/*
 * GPU memory between processes: a peer reaches another process's GPU MR
 * through CUDA IPC, so that every operation on it is one cuMemcpy in the
 * initiator, as the direct path is one memcpy for shareable host memory.
 *
 * The owner exports the allocation's IPC handle at registration
 * (sv_gpu_describe).  A peer opens it on first use and keeps it for every
 * later operation on that MR (sv_gpu_map): one open per MR per process.
 * Deregistration closes it everywhere before it returns
 * (sv_gpu_release): the owner asks each importer named in the MR's
 * importer slots to close, and waits.  CUDA leaves a cuMemFree of memory
 * that another process still has open undefined, and an application
 * frees its buffer right after ibv_dereg_mr.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shm.h"

uint64_t sv_gpu_describe(struct sv_seg *s, const struct sv_gpu_mem *g, const void *addr,
			 char *why, size_t wlen)
{
	struct shm_share sh = { .kind = SHM_SHARE_CUDA };

	if (sv_gpu_export(g, sh.cuda.handle, why, wlen))
		return 0;
	memcpy(sh.cuda.uuid, g->uuid, sizeof(sh.cuda.uuid));
	sh.cuda.size = g->size;
	sh.offset = (uintptr_t)addr - g->base;
	uint64_t off = sv_seg_alloc(s, sizeof(sh));
	if (!off)
		snprintf(why, wlen, "the context's segment is full");
	else
		memcpy(shm_at(s->h, off), &sh, sizeof(sh));
	return off;
}

/* ---- the importer's side ---- */

struct opened {
	const struct shm_hdr *owner;	/* the MR's segment, as mapped here */
	int32_t pid;
	uint64_t start_time;
	uint32_t idx, key;		/* the MR entry and the registration */
	struct shm_share *sh;		/* in the owner's segment */
	int slot;			/* sh->importers[slot] is ours */
	const struct shm_hdr *via;	/* the context whose progress thread sweeps */
	char *base;			/* the allocation, opened here */
	uint64_t size;
	void *ctx;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct opened *open_list;
static int nopen, cap;

static void close_one(int i)
{
	struct opened *o = &open_list[i];

	sv_gpu_close(o->base, o->size, o->ctx);
	/* Pairs with the owner's acquire loads while it waits: the handle
	 * is closed. */
	atomic_store_explicit(&o->sh->importers[o->slot].pid, 0, memory_order_release);
	sv_dbg("gpu: closed pid %d's MR key 0x%x", (int)o->pid, o->key);
	open_list[i] = open_list[--nopen];
}

static int claim_slot(struct shm_share *sh, const struct shm_hdr *via)
{
	for (int i = 0; i < SHM_GPU_IMPORTERS; i++) {
		int32_t expect = 0;
		if (atomic_compare_exchange_strong(&sh->importers[i].pid, &expect, sv_pid())) {
			sh->importers[i].ep = via->ep;
			sh->importers[i].start_time = via->start_time;
			return i;
		}
	}
	return -1;
}

static struct opened *open_mr(const struct shm_hdr *seg, const struct shm_mr *m,
			      const struct shm_hdr *via, char *why, size_t wlen)
{
	if (!m->share_off) {
		snprintf(why, wlen, "pid %d could not export its GPU memory by CUDA IPC "
			 "(cuIpcGetMemHandle refused it), so only that process reaches it",
			 (int)seg->pid);
		return NULL;
	}
	struct shm_share *sh = shm_at(seg, m->share_off);

	if (nopen == cap) {
		int ncap = cap ? cap * 2 : 8;
		void *n = realloc(open_list, (size_t)ncap * sizeof(*open_list));
		if (!n) {
			snprintf(why, wlen, "out of memory");
			return NULL;
		}
		open_list = n;
		cap = ncap;
	}
	/* The slot first: from here the owner's deregistration waits for
	 * this process to close what it opens. */
	int slot = claim_slot(sh, via);
	if (slot < 0) {
		snprintf(why, wlen, "its GPU memory is open in %d other processes already, "
			 "the most softverbs tracks", SHM_GPU_IMPORTERS);
		return NULL;
	}
	void *ctx;
	char *base = sv_gpu_open(sh->cuda.handle, sh->cuda.uuid, sh->cuda.size, &ctx, why, wlen);
	if (!base) {
		atomic_store_explicit(&sh->importers[slot].pid, 0, memory_order_release);
		return NULL;
	}
	struct opened *o = &open_list[nopen++];
	*o = (struct opened){ seg, seg->pid, seg->start_time, (uint32_t)(m - shm_mrs(seg)),
			      atomic_load_explicit(&m->key, memory_order_relaxed), sh, slot, via,
			      base, sh->cuda.size, ctx };
	sv_dbg("gpu: opened pid %d's MR key 0x%x (%llu-byte allocation) by CUDA IPC", (int)seg->pid,
	       o->key, (unsigned long long)o->size);
	return o;
}

void *sv_gpu_map(const struct shm_hdr *seg, const struct shm_mr *m, uint64_t va,
		 const struct shm_hdr *via, char *why, size_t wlen)
{
	uint32_t idx = (uint32_t)(m - shm_mrs(seg));
	uint32_t key = atomic_load_explicit(&m->key, memory_order_relaxed);
	struct opened *o = NULL;

	/* The caller holds m: its key and share are stable. */
	pthread_mutex_lock(&lock);
	for (int i = 0; i < nopen && !o; i++)
		if (open_list[i].owner == seg && open_list[i].idx == idx && open_list[i].key == key &&
		    open_list[i].pid == seg->pid && open_list[i].start_time == seg->start_time)
			o = &open_list[i];
	if (!o)
		o = open_mr(seg, m, via, why, wlen);
	char *p = o ? o->base + o->sh->offset + (va - m->addr) : NULL;
	pthread_mutex_unlock(&lock);
	return p;
}

static bool stale(const struct opened *o)
{
	const struct shm_mr *m = &shm_mrs(o->owner)[o->idx];

	return sv_seg_gone(o->owner, false) ||
	       atomic_load_explicit(&m->key, memory_order_acquire) != o->key;
}

void sv_gpu_sweep(void)
{
	pthread_mutex_lock(&lock);
	for (int i = nopen - 1; i >= 0; i--)
		if (stale(&open_list[i]))
			close_one(i);
	pthread_mutex_unlock(&lock);
}

/* The mappings are the process's, and another context's QPs may be
 * copying through one: they move to another open context, whose progress
 * thread sweeps them from then on; only the last context closes them. */
void sv_gpu_forget(const struct shm_hdr *via)
{
	const struct shm_hdr *other = sv_seg_local_other(via);

	pthread_mutex_lock(&lock);
	for (int i = nopen - 1; i >= 0; i--) {
		struct opened *o = &open_list[i];
		if (o->via != via)
			continue;
		if (!other) {
			close_one(i);
			continue;
		}
		o->via = other;
		o->sh->importers[o->slot].ep = other->ep;
		o->sh->importers[o->slot].start_time = other->start_time;
	}
	pthread_mutex_unlock(&lock);
}

/* ---- the owner's deregistration ---- */

void sv_gpu_release(struct shm_hdr *h, uint64_t share_off)
{
	struct shm_share *sh = shm_at(h, share_off);
	uint64_t start = sv_now_ns();

	for (int i = 0; i < SHM_GPU_IMPORTERS; i++) {
		int32_t pid = atomic_load(&sh->importers[i].pid);
		struct shm_hdr *peer = pid ? sv_seg_peer(sh->importers[i].ep, pid,
							 sh->importers[i].start_time) : NULL;
		if (!peer)
			continue;
		/* Pairs with the exchange in the importer's progress thread. */
		atomic_store_explicit(&peer->gpu_sweep, 1, memory_order_release);
		sv_seg_ring(peer);
	}
	for (int i = 0; i < SHM_GPU_IMPORTERS; i++) {
		int32_t pid;
		while ((pid = atomic_load_explicit(&sh->importers[i].pid, memory_order_acquire))) {
			/* A process that died closed everything with it. */
			if (!sv_proc_alive(pid, 0))
				break;
			if (sv_now_ns() - start > 2000000000ull) {
				sv_warn("GPU MR: pid %d still has it open by CUDA IPC after 2 s", (int)pid);
				break;
			}
			sched_yield();
		}
	}
}
