/* SPDX-License-Identifier: MIT */
/*
 * Verbs on another process's objects, run by their owner: the requester
 * writes the owner mailbox of the object's segment and waits; the owner's
 * progress thread runs the verb on its own object and answers
 * (core/seg.h struct shm_owner).  The owner's private state stays the
 * owner's to write, and what the verb explains on failure travels back
 * with it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"

int sv_shm_await(const struct shm_hdr *t, _Atomic uint32_t *done, uint32_t seq,
		 struct shm_hdr *own)
{
	for (int waited = 0;; waited++) {
		if (atomic_load_explicit(done, memory_order_acquire) == seq)
			return 0;
		if (own)
			sv_bounce_serve(own);
		struct timespec ts = { 0, 200000 };
		syscall(SYS_futex, done, FUTEX_WAIT, seq - 1, &ts, NULL, 0);
		if (sv_seg_gone(t, waited % 5000 == 4999))
			return ESRCH;
	}
}

int sv_owner_call(struct shm_hdr *t, struct shm_owner_req *r)
{
	struct shm_owner *o = shm_at(t, t->owner_off);
	int ret = 0;

	sv_shm_lock(&o->lock);
	o->r = *r;
	uint32_t seq = atomic_load_explicit(&o->req, memory_order_relaxed) + 1;
	/* Pairs with the owner's acquire load of req in sv_owner_serve(). */
	atomic_store_explicit(&o->req, seq, memory_order_release);
	sv_seg_ring(t);
	if (sv_shm_await(t, &o->done, seq, NULL))
		ret = ENODEV;	/* a context that closed, or a process that died */
	if (!ret)
		*r = o->r;
	sv_shm_unlock(&o->lock);
	return ret;
}

void sv_owner_serve(struct sv_context *c)
{
	struct shm_hdr *h = c->seg.h;
	struct shm_owner *o = shm_at(h, h->owner_off);
	uint32_t req = atomic_load_explicit(&o->req, memory_order_acquire);

	if (req == atomic_load_explicit(&o->done, memory_order_relaxed))
		return;
	o->r.status = 0;
	o->r.why[0] = 0;
	c->owner_serve(c, &o->r);
	atomic_store_explicit(&o->done, req, memory_order_release);
	syscall(SYS_futex, &o->done, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
