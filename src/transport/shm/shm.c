/* SPDX-License-Identifier: MIT */
/*
 * The shm transport as the engine sees it: its ops table (engine/engine.h
 * struct sv_transport_ops).  An initiator on this host reaches the
 * target's segment and memory itself: it moves bytes by memcpy through a
 * mapping, CMA or the bounce mailbox (copy.c, direct.c, gpu_ipc.c),
 * leaves small SENDs for the receiver to place (defer.c), and has the
 * target's progress thread help with large copies and atomics
 * (assist.c).  It carries no packets.
 */
#include "shm.h"
#include "../../engine/engine.h"

static int shm_move(struct shm_hdr *t, struct shm_hdr *own, bool write, bool mapped,
		    const struct iovec *l, int nl, const struct iovec *r, int nr)
{
	if (mapped)
		return sv_copy_mapped(own, write, l, nl, r, nr);
	return write ? sv_copy_to(t, own, l, nl, r, nr) : sv_copy_from(t, own, l, nl, r, nr);
}

/* What peers wait for comes first: copies and atomics (assist), bounced
 * copies, the closing of GPU memory a deregistering owner asked for, and
 * the verbs of the owner mailbox. */
static bool shm_serve(struct sv_context *c)
{
	struct shm_hdr *h = c->seg.h;
	bool polling = sv_assist_serve(h);

	sv_bounce_serve(h);
	/* Pairs with the release store of a deregistering owner. */
	if (atomic_exchange_explicit(&h->gpu_sweep, 0, memory_order_acquire))
		sv_gpu_sweep();
	sv_owner_serve(c);
	return polling;
}

static void shm_stop(struct sv_context *c)
{
	sv_assist_stop(c->seg.h);
}

const struct sv_transport_ops sv_transport_shm = {
	.name = "shm",
	.move = shm_move,
	.map = sv_direct_map,
	.map_gpu = sv_gpu_map,
	.atomic = sv_assist_atomic,
	.defer_put = sv_defer_put,
	.defer_place = sv_defer_place,
	.defer_next = sv_defer_next_put,
	.defer_flush = sv_defer_flush,
	.serve = shm_serve,
	.stop = shm_stop,
	SV_TP_NO_PACKETS,
};
