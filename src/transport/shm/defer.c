/* SPDX-License-Identifier: MIT */
/*
 * Deferred placement: the receive-side copy of a small SEND.
 *
 * A SEND into a peer's private memory costs a process_vm_writev (about
 * 2 us here) when the initiator places it.  For a message of at most
 * SHM_DEFER_MAX bytes the initiator instead leaves the bytes and the
 * receiver's addresses in a slot of the receiver's segment, and the
 * receiver places them with memcpy when it polls the completion naming
 * the slot, as UCX's shared-memory transport does for eager messages.
 *
 * Hardware has placed a SEND's data by the time the requester sees its
 * ACK, so the receive-side copy is correct only with guards:
 *   - an RDMA READ, WRITE or atomic through any key of the context first
 *     places every pending slot (sv_defer_flush() from sv_resp_mr_get()):
 *     a READ after a SEND returns the SEND's data, a WRITE after it wins;
 *   - deregistering or re-registering memory places them before the
 *     verb returns, so nothing lands in memory that is no longer
 *     registered;
 *   - a completion dropped unread (a QP's reset, a destroyed CQ, a CQ
 *     overrun) still has its slot placed and freed;
 *   - another context of the same process reaches the same memory through
 *     keys of its own, which flushers of this segment do not see: slots
 *     are used only while the process has this one context (`solo`):
 *     opening a second one places every pending slot first, and closing
 *     back to one resumes.  An initiator
 *     re-reads `solo` after publishing (both sequentially consistent), so
 *     either the opener's flush sees its slot or it sees the opener's
 *     store and places the slot itself.
 * See shm.h struct shm_defer for the states and who writes what.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <string.h>

#include "shm.h"

static struct shm_defer *ring(const struct shm_hdr *h)
{
	return shm_at(h, h->defer_off);
}

static int slot_iov(const struct shm_defer_slot *s, struct iovec *v)
{
	v[0] = (struct iovec){ (void *)(uintptr_t)s->iov0.addr, s->iov0.len };
	for (uint32_t i = 1; i < s->niov; i++)
		v[i] = (struct iovec){ (void *)(uintptr_t)s->iov[i - 1].addr, s->iov[i - 1].len };
	return s->niov;
}

/* Copies a claimed slot into the owner's memory: memcpy in the owner,
 * the kernel (or the owner's bounce path) elsewhere.  A receiver that
 * died needs nothing placed. */
static void place(struct shm_hdr *h, struct shm_hdr *own, struct shm_defer_slot *s)
{
	struct iovec dst[SHM_DEFER_IOV], src = { s->data, s->len };
	int n = slot_iov(s, dst);

	if (h->pid == sv_pid())
		sv_copy_iov(dst, n, &src, 1);
	else
		sv_copy_to(h, own, &src, 1, dst, n);
	atomic_fetch_add(&ring(h)->placed, 1);
}

static bool claim(struct shm_defer_slot *s)
{
	uint32_t expect = SHM_DEFER_PENDING;

	if (!atomic_compare_exchange_strong(&s->state, &expect, SHM_DEFER_PLACING))
		return false;
	atomic_store_explicit(&s->placer, sv_pid(), memory_order_relaxed);
	return true;
}

/*
 * Waits while another thread or process places slot s.  Its copy may go
 * through the bounce mailbox of this process (or of the caller's), so the
 * waiter serves those meanwhile.  A placer killed mid-copy never finishes:
 * once it is dead the waiter copies the slot again itself (the same bytes
 * to the same place; nothing newer can have landed there, since the access
 * that was placing it never went on) and marks it placed.  A placer that is
 * merely slow is never overtaken: the slot, freed and refilled, would then
 * be marked placed by it with the new message unplaced, and its late copy
 * would land in memory the application got back.
 */
static void await_placed(struct shm_hdr *h, struct shm_hdr *own, struct shm_defer_slot *s)
{
	uint64_t start = sv_now_ns();

	while (atomic_load_explicit(&s->state, memory_order_acquire) == SHM_DEFER_PLACING) {
		if (h->pid == sv_pid())
			sv_bounce_serve(h);
		if (own && own != h)
			sv_bounce_serve(own);
		if (sv_now_ns() - start > 1000000000ull) {
			int32_t pid = atomic_load_explicit(&s->placer, memory_order_relaxed);
			if (pid && !sv_proc_alive(pid, 0)) {
				sv_warn("a deferred SEND's placer (pid %d) died mid-copy; placing it "
					"again", (int)pid);
				place(h, own, s);
				atomic_store_explicit(&s->state, SHM_DEFER_PLACED,
						      memory_order_release);
				return;
			}
			start = sv_now_ns();
		}
		sched_yield();
	}
}

uint8_t sv_defer_put(struct shm_hdr *h, struct shm_hdr *own, const struct iovec *src, int ns,
		     const struct iovec *dst, int nd, uint64_t len)
{
	struct shm_defer *d = ring(h);
	struct shm_defer_slot *s;

	if (len > SHM_DEFER_MAX || nd > SHM_DEFER_IOV || !atomic_load(&d->solo))
		return 0;
	/* Take the next position (shm.h): its slot must have been freed
	 * for it, a lap after its last use. */
	uint64_t p = atomic_load_explicit(&d->tail, memory_order_relaxed);
	for (;;) {
		s = &d->slot[p % SHM_DEFER_SLOTS];
		/* Pairs with the poller's release store freeing the slot. */
		int32_t lag = (int32_t)(atomic_load_explicit(&s->seq, memory_order_acquire) -
					(uint32_t)p);
		if (lag < 0)
			return 0;	/* not freed yet: the initiator places it itself */
		if (lag > 0)		/* another initiator took p */
			p = atomic_load_explicit(&d->tail, memory_order_relaxed);
		else if (atomic_compare_exchange_weak_explicit(&d->tail, &p, p + 1,
							       memory_order_relaxed,
							       memory_order_relaxed))
			break;
	}
	atomic_store_explicit(&s->seq, (uint32_t)p + 1, memory_order_relaxed);
	s->niov = (uint16_t)nd;
	s->len = (uint16_t)len;
	s->iov0.addr = (uintptr_t)dst[0].iov_base;
	s->iov0.len = dst[0].iov_len;
	for (int j = 1; j < nd; j++) {
		s->iov[j - 1].addr = (uintptr_t)dst[j].iov_base;
		s->iov[j - 1].len = dst[j].iov_len;
	}
	struct iovec data = { s->data, len };
	sv_copy_iov(&data, 1, src, ns);
	/* Pairs with the acquire loads of the poller and of flushers. */
	atomic_store_explicit(&s->state, SHM_DEFER_PENDING, memory_order_release);
	atomic_fetch_add(&d->published, 1);
	sv_reg_count_bytes(own->ep, SV_PATH_DEFER, len);
	if (!atomic_load(&d->solo) && claim(s)) {
		/* A second context opened meanwhile (see above). */
		place(h, own, s);
		atomic_store_explicit(&s->state, SHM_DEFER_PLACED, memory_order_release);
	}
	return (uint8_t)(p % SHM_DEFER_SLOTS + 1);
}

/* The poller of the completion naming the slot (or, for a completion the
 * CQ could not take, its producer, with its own segment). */
void sv_defer_place(struct shm_hdr *h, struct shm_hdr *own, uint8_t defer)
{
	struct shm_defer_slot *s = &ring(h)->slot[defer - 1];

	if (claim(s))
		place(h, own, s);
	else	/* a flusher has it: its copy must be in before the completion */
		await_placed(h, own, s);
	atomic_store_explicit(&s->state, SHM_DEFER_FREE, memory_order_relaxed);
	/* Pairs with the acquire load of the initiator taking the slot's
	 * position a lap later: it sees the slot placed and FREE. */
	uint32_t next = atomic_load_explicit(&s->seq, memory_order_relaxed) - 1 + SHM_DEFER_SLOTS;
	atomic_store_explicit(&s->seq, next, memory_order_release);
}

const void *sv_defer_next(const struct shm_hdr *h, uint8_t defer)
{
	return &ring(h)->slot[defer % SHM_DEFER_SLOTS];
}

const void *sv_defer_next_put(const struct shm_hdr *h)
{
	const struct shm_defer *d = ring(h);

	return &d->slot[atomic_load_explicit(&d->tail, memory_order_relaxed) % SHM_DEFER_SLOTS];
}

void sv_defer_flush(struct shm_hdr *h, struct shm_hdr *own)
{
	struct shm_defer *d = ring(h);

	/* Every slot published before this access was counted in
	 * `published` before its completion could be seen.  (A placer taken
	 * over by await_placed() may count twice: `placed` then runs ahead
	 * and flushes scan the slots, which costs time, not correctness.) */
	if (atomic_load(&d->published) == atomic_load(&d->placed))
		return;
	for (uint32_t i = 0; i < SHM_DEFER_SLOTS; i++) {
		struct shm_defer_slot *s = &d->slot[i];
		uint32_t st = atomic_load_explicit(&s->state, memory_order_acquire);
		if (st == SHM_DEFER_PENDING && claim(s)) {
			place(h, own, s);
			atomic_store_explicit(&s->state, SHM_DEFER_PLACED, memory_order_release);
		} else if (st == SHM_DEFER_PLACING) {
			await_placed(h, own, s);
		}
	}
}

void sv_defer_solo(struct shm_hdr *h, bool solo)
{
	atomic_store(&ring(h)->solo, solo);
	if (!solo)
		sv_defer_flush(h, NULL);
}
