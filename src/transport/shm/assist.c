/* SPDX-License-Identifier: MIT */
/*
 * Assisted copies: a large copy between an initiator and another process's
 * private memory, moved by both processes at once.
 *
 * One process_vm_writev/readv call copies on the core that makes it, and
 * a 1 MiB WRITE into private memory was as fast as that one call and no
 * faster (UCX's CMA transport makes the same call).  The target process
 * has a core too, and a thread of ours on it: its progress thread.  So an
 * initiator with at least SHM_ASSIST_MIN bytes to move cuts them into
 * chunks (halves, up to SHM_ASSIST_MAX_CHUNK), offers them in the
 * target's assist mailbox (struct shm_assist) and copies chunks itself
 * while the target's progress thread takes others, each side with its own
 * CMA call (the target's reads from or writes into the initiator, which
 * allows that: PR_SET_PTRACER in context.c).  Whoever is first takes the
 * next chunk, so a target that is asleep, busy or slow to wake costs the
 * initiator one doorbell and nothing else: it copies whatever the helper
 * has not claimed.  The initiator waits only for chunks the helper has
 * claimed, then releases the memory as before.  A helper that just finished a job polls for the
 * next one for ASSIST_LINGER_NS, so a stream of large operations keeps it
 * on its core without a wake-up per operation; while it polls it also
 * answers atomics on its own memory (sv_assist_atomic).
 *
 * This is the NIC's view of the operation too: the responder's engine
 * places the data into its own memory.  The rkey was checked, and the MRs
 * are held, by the initiator, which does not complete the operation until
 * every chunk is in; a failed or refused chunk makes the initiator copy
 * the whole operation again by itself (a copy is idempotent), so the
 * outcome and its error are exactly those of the unassisted path.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include "shm.h"

#define ASSIST_LINGER_NS	50000ull	/* a helper polls this long after its last work */
#define ASSIST_PICKUP_NS	5000ull		/* an atomic waits this long to be taken */
#define ASSIST_PREEMPTED_NS	20000ull	/* a lingering helper that lost its core this long stops */
#define ASSIST_SLICE_NS		1000000ull	/* a polling helper's other duties wait at most this */
#define ASSIST_BACKOFF_NS	1000000ull	/* then atomics go by CMA this long */
#define ASSIST_FORCE_WAIT_NS	1000000000ull	/* SOFTVERBS_ASSIST=force: for the tests */
#define JOB(w)		((uint32_t)((w) >> 32))
#define CHUNKS(w)	((uint32_t)((w) & (SHM_ASSIST_FAILED - 1)))
/* A claim index past any job's chunks: the job is closed, or being written. */
#define CLOSED		UINT32_MAX

static struct shm_assist *mailbox(const struct shm_hdr *h)
{
	return shm_at(h, h->assist_off);
}

/* Claims the next chunk of job `job` below `limit`: its index, or -1 when
 * the job is closed or has none left. */
static int64_t claim(struct shm_assist *a, uint32_t job, uint32_t limit)
{
	uint64_t w = atomic_load_explicit(&a->claim, memory_order_acquire);

	for (;;) {
		if (JOB(w) != job || (uint32_t)w >= limit)
			return -1;
		if (atomic_compare_exchange_weak_explicit(&a->claim, &w, w + 1, memory_order_acq_rel,
							  memory_order_acquire))
			return (uint32_t)w;
	}
}

/* What the helper copies by: the job's fields, read once. */
struct job {
	int32_t pid;
	bool write, force;
	int nl, nr;
	struct iovec l[SHM_ASSIST_IOV], r[SHM_ASSIST_IOV];
	size_t len, chunk;
};

/* Reads job `job`'s fields, and checks afterwards that the mailbox still
 * holds that job (a seqlock read: an initiator marks `claim` before it
 * writes a new job's fields).  false: it no longer does. */
static bool snapshot(struct shm_assist *a, uint32_t job, struct job *j)
{
	j->pid = a->pid;
	j->write = a->write;
	j->force = a->force;
	j->chunk = a->chunk;
	j->nl = a->nl < SHM_ASSIST_IOV ? (int)a->nl : SHM_ASSIST_IOV;
	j->nr = a->nr < SHM_ASSIST_IOV ? (int)a->nr : SHM_ASSIST_IOV;
	j->len = 0;
	for (int i = 0; i < j->nl; i++) {
		j->l[i] = (struct iovec){ (void *)(uintptr_t)a->l[i].addr, a->l[i].len };
		j->len += a->l[i].len;
	}
	for (int i = 0; i < j->nr; i++)
		j->r[i] = (struct iovec){ (void *)(uintptr_t)a->r[i].addr, a->r[i].len };
	atomic_thread_fence(memory_order_acquire);
	return JOB(atomic_load_explicit(&a->claim, memory_order_relaxed)) == job;
}

/* Bytes per chunk for a len-byte job: half of it, page-rounded, within
 * [SHM_ASSIST_MIN_CHUNK, SHM_ASSIST_MAX_CHUNK]. */
static size_t chunk_size(size_t len)
{
	size_t c = ((len / 2) + 4095) & ~(size_t)4095;

	return c < SHM_ASSIST_MIN_CHUNK ? SHM_ASSIST_MIN_CHUNK :
	       c > SHM_ASSIST_MAX_CHUNK ? SHM_ASSIST_MAX_CHUNK : c;
}

/* Chunk k of a len-byte copy: [off, off + n) of both lists. */
static size_t chunk_of(const struct iovec *l, int nl, const struct iovec *r, int nr, size_t len,
		       size_t chunk, uint32_t k, struct iovec *ls, int *cl, struct iovec *rs,
		       int *cr)
{
	size_t off = (size_t)k * chunk;
	size_t n = len - off < chunk ? len - off : chunk;

	*cl = sv_iov_slice(l, nl, off, n, ls);
	*cr = sv_iov_slice(r, nr, off, n, rs);
	return n;
}

/* Waits until `done` reaches want chunks (the helper's), or the target is
 * gone.  false when it is gone or a helper chunk failed. */
static bool await_helper(const struct shm_hdr *t, struct shm_assist *a, uint32_t job,
			 uint32_t want)
{
	for (uint64_t i = 0;; i++) {
		/* Pairs with the helper's release when it counts a chunk: the
		 * chunk's bytes are in before we complete the operation. */
		uint64_t w = atomic_load_explicit(&a->done, memory_order_acquire);
		if (JOB(w) == job && CHUNKS(w) >= want)
			return !(w & SHM_ASSIST_FAILED);
		if (i < 4096) {
			sv_cpu_relax();
			continue;
		}
		/* The helper shares our core or lost its own: let it run. */
		sched_yield();
		if (i % 4096 == 0 && sv_seg_gone(t, true))
			return false;
	}
}

/* Force mode (the tests'): the helper takes at least the last chunk, and
 * pauses before each chunk it takes. */
static bool await_claimed(const struct shm_hdr *t, struct shm_assist *a, uint32_t job,
			  uint32_t nchunks)
{
	for (uint64_t i = 1;; i++) {
		uint64_t w = atomic_load_explicit(&a->claim, memory_order_acquire);
		if (JOB(w) != job || (uint32_t)w >= nchunks)
			return true;
		sched_yield();
		if (i % 4096 == 0 && sv_seg_gone(t, true))
			return false;
	}
}

bool sv_assist_copy(struct shm_hdr *t, bool write, const struct iovec *l, int nl,
		    const struct iovec *r, int nr, size_t len)
{
	struct shm_assist *a = mailbox(t);

	if (nl > SHM_ASSIST_IOV || nr > SHM_ASSIST_IOV ||
	    atomic_load_explicit(&a->refused, memory_order_relaxed))
		return false;
	int lk = pthread_mutex_trylock(&a->lock);
	if (lk == EOWNERDEAD)	/* its helper chunks fail on a dead pid */
		pthread_mutex_consistent(&a->lock);
	else if (lk)
		return false;
	size_t chunk = chunk_size(len);
	uint32_t nchunks = (uint32_t)((len + chunk - 1) / chunk);
	uint32_t job = JOB(atomic_load_explicit(&a->claim, memory_order_relaxed)) + 1;
	if (!job)
		job = 1;
	/* The seqlock's mark, before the fields change: a helper still
	 * reading the previous job's (one of a dead initiator's, whose
	 * chunks nobody waits for) sees it and drops what it read. */
	atomic_store_explicit(&a->claim, ((uint64_t)job << 32) | CLOSED, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	a->pid = sv_pid();
	a->write = write;
	a->nchunks = nchunks;
	a->chunk = chunk;
	a->nl = (uint32_t)nl;
	a->nr = (uint32_t)nr;
	bool force = sv_config()->assist == SV_ASSIST_FORCE;
	a->force = force;
	for (int i = 0; i < nl; i++)
		a->l[i].addr = (uintptr_t)l[i].iov_base, a->l[i].len = l[i].iov_len;
	for (int i = 0; i < nr; i++)
		a->r[i].addr = (uintptr_t)r[i].iov_base, a->r[i].len = r[i].iov_len;
	atomic_store_explicit(&a->done, (uint64_t)job << 32, memory_order_relaxed);
	/* Publishes the job (the helper's acquire in claim()), and with the
	 * load of `lingering` after it forms a store-load pair with the
	 * helper's store of lingering = 0 and its load of claim: one of us
	 * sees the other, so a job is never left for a sleeping helper
	 * without a doorbell. */
	atomic_store_explicit(&a->claim, (uint64_t)job << 32, memory_order_seq_cst);
	if (!atomic_load_explicit(&a->lingering, memory_order_seq_cst))
		sv_seg_ring(t);

	uint32_t mine = 0;
	int err = 0;
	int64_t k;
	while (!err && (k = claim(a, job, force ? nchunks - 1 : nchunks)) >= 0) {
		struct iovec ls[SHM_ASSIST_IOV], rs[SHM_ASSIST_IOV];
		int cl, cr;
		chunk_of(l, nl, r, nr, len, chunk, (uint32_t)k, ls, &cl, rs, &cr);
		err = sv_cma(write, t->pid, ls, cl, rs, cr);
		mine++;
	}
	bool ok = !err && (!force || await_claimed(t, a, job, nchunks));
	/* Close the job: what the helper has not claimed by now it never
	 * will, and the number it claimed is final. */
	uint64_t w = atomic_exchange_explicit(&a->claim, ((uint64_t)job << 32) | CLOSED,
					      memory_order_acq_rel);
	uint32_t claimed = (uint32_t)w < nchunks ? (uint32_t)w : nchunks;
	ok = await_helper(t, a, job, claimed - mine) && ok;
	pthread_mutex_unlock(&a->lock);
	return ok;
}

/* Takes chunks of the open job until none is left; true if it took any. */
static bool serve(struct shm_hdr *own, struct shm_assist *a)
{
	uint64_t w = atomic_load_explicit(&a->claim, memory_order_acquire);
	uint32_t job = JOB(w);
	struct job j;
	bool known = false;
	int64_t k;

	if (!job || (uint32_t)w == CLOSED)
		return false;
	while ((k = claim(a, job, a->nchunks)) >= 0) {
		/* Our claim keeps the job open, so its fields hold still. */
		if (!known && !(known = snapshot(a, job, &j)))
			break;
		if (j.force) {
			/* The tests' setting: a helper chunk still in flight
			 * when the initiator is done with its own, so that
			 * completing without waiting for it would show. */
			struct timespec ms = { 0, 2000000 };
			nanosleep(&ms, NULL);
		}
		struct iovec ls[SHM_ASSIST_IOV], rs[SHM_ASSIST_IOV];
		int cl, cr;
		size_t n = chunk_of(j.l, j.nl, j.r, j.nr, j.len, j.chunk, (uint32_t)k, ls, &cl, rs,
				    &cr);
		/* Our local side is the target's memory; the initiator's is
		 * remote, and the direction turns round. */
		int err = sv_cma(!j.write, j.pid, rs, cr, ls, cl);
		if (err == EPERM || err == ENOSYS)
			atomic_store_explicit(&a->refused, 1, memory_order_relaxed);
		if (!err)
			sv_reg_count_bytes(own->ep, SV_PATH_ASSIST, (uint64_t)n);
		/* Pairs with the initiator's acquire in await_helper(). */
		uint64_t d = atomic_load_explicit(&a->done, memory_order_relaxed);
		while (JOB(d) == job &&
		       !atomic_compare_exchange_weak_explicit(&a->done, &d,
							      (d + 1) | (err ? SHM_ASSIST_FAILED : 0),
							      memory_order_release,
							      memory_order_relaxed))
			;
	}
	return known;
}

static bool job_open(struct shm_assist *a)
{
	uint64_t w = atomic_load_explicit(&a->claim, memory_order_seq_cst);

	return JOB(w) && (uint32_t)w != CLOSED && (uint32_t)w < a->nchunks;
}

/* An atomic posted by an initiator, answered with a CPU atomic on our own
 * memory.  The initiator checked the rkey (an MR, not ODP, registered
 * writable: mr.c) and holds it. */
static bool serve_atomic(struct shm_hdr *own, struct shm_assist *a)
{
	uint32_t s = SHM_ASSIST_POSTED;

	/* seq_cst: the helper's half of the initiator's store-load pair. */
	if (atomic_load_explicit(&a->astate, memory_order_seq_cst) != SHM_ASSIST_POSTED ||
	    !atomic_compare_exchange_strong_explicit(&a->astate, &s, SHM_ASSIST_TAKEN,
						     memory_order_acquire, memory_order_relaxed))
		return false;
	uint64_t *p = (uint64_t *)(uintptr_t)a->aaddr, old = a->acompare_add;
	if (a->aop == IBV_WR_ATOMIC_FETCH_AND_ADD)
		old = __atomic_fetch_add(p, a->acompare_add, __ATOMIC_SEQ_CST);
	else	/* on failure `old` becomes the value found: either way, the value before */
		__atomic_compare_exchange_n(p, &old, a->aswap, false, __ATOMIC_SEQ_CST,
					    __ATOMIC_SEQ_CST);
	a->aold = old;
	sv_reg_count_bytes(own->ep, SV_PATH_ASSIST, 8);
	/* Pairs with the initiator's acquire load of DONE. */
	atomic_store_explicit(&a->astate, SHM_ASSIST_DONE, memory_order_release);
	return true;
}

bool sv_assist_serve(struct shm_hdr *own)
{
	struct shm_assist *a = mailbox(own);
	bool kicked = atomic_exchange_explicit(&a->kick, 0, memory_order_relaxed);
	/* Only this thread writes `lingering`. */
	bool was = atomic_load_explicit(&a->lingering, memory_order_relaxed);
	uint64_t now = sv_now_ns(), slice = now, last = now;

	if (!was) {
		if (!serve(own, a) && !serve_atomic(own, a) && !kicked)
			return false;
		a->idle_since = sv_now_ns();
		atomic_store_explicit(&a->lingering, 1, memory_order_seq_cst);
	}
	for (uint64_t i = 0;; i++) {
		bool any = serve(own, a);
		any |= serve_atomic(own, a);
		if (any) {
			a->idle_since = last = sv_now_ns();
			continue;
		}
		sv_cpu_relax();
		if (i % 64)
			continue;
		/* A gap between two looks means this core has other work
		 * (we were preempted): give it back rather than compete
		 * with the application for it. */
		now = sv_now_ns();
		if (now - a->idle_since > ASSIST_LINGER_NS || now - last > ASSIST_PREEMPTED_NS)
			break;
		/* Still polling, but the progress thread has other duties
		 * (events, retries, the other mailboxes): back soon. */
		if (now - slice > ASSIST_SLICE_NS)
			return true;
		last = now;
	}
	/* The other half of the initiator's store-load pair. */
	atomic_store_explicit(&a->lingering, 0, memory_order_seq_cst);
	if (job_open(a))
		serve(own, a);
	serve_atomic(own, a);	/* posted as we stopped */
	return false;
}

void sv_assist_stop(struct shm_hdr *own)
{
	atomic_store_explicit(&mailbox(own)->lingering, 0, memory_order_seq_cst);
	serve_atomic(own, mailbox(own));	/* posted as we stopped */
}

bool sv_assist_atomic(struct shm_hdr *t, enum ibv_wr_opcode op, void *addr, uint64_t compare_add,
		      uint64_t swap, uint64_t *old)
{
	struct shm_assist *a = mailbox(t);
	uint64_t now = sv_now_ns();
	bool stream = now - a->last_atomic_ns < ASSIST_LINGER_NS;
	/* The tests' setting: every atomic goes to the helper. */
	bool force = sv_config()->assist == SV_ASSIST_FORCE;
	uint64_t pickup = force ? ASSIST_FORCE_WAIT_NS : ASSIST_PICKUP_NS;

	a->last_atomic_ns = now;
	if (now < a->backoff_until_ns)
		return false;
	a->aop = op;
	a->aaddr = (uintptr_t)addr;
	a->acompare_add = compare_add;
	a->aswap = swap;
	/* Publishes the request (the helper's acquire compare-and-swap), and
	 * with the load of `lingering` after it is a store-load pair with the
	 * helper's store of lingering = 0 and its last look at astate: a
	 * request posted as the helper stops is taken or seen untaken. */
	atomic_store_explicit(&a->astate, SHM_ASSIST_POSTED, memory_order_seq_cst);
	if (!atomic_load_explicit(&a->lingering, memory_order_seq_cst)) {
		/* A second atomic within the linger time: more are likely,
		 * so have the helper wait for them.  A lone one never wakes
		 * the target. */
		if (stream || force) {
			atomic_store_explicit(&a->kick, 1, memory_order_relaxed);
			sv_seg_ring(t);
		}
		uint32_t p = SHM_ASSIST_POSTED;
		if (!force && atomic_compare_exchange_strong_explicit(&a->astate, &p, SHM_ASSIST_IDLE,
								      memory_order_relaxed,
								      memory_order_relaxed))
			return false;
	}
	for (uint64_t i = 1;; i++) {
		uint32_t s = atomic_load_explicit(&a->astate, memory_order_acquire);
		if (s == SHM_ASSIST_DONE) {
			*old = a->aold;
			atomic_store_explicit(&a->astate, SHM_ASSIST_IDLE, memory_order_relaxed);
			return true;
		}
		sv_cpu_relax();
		if (i % 64)
			continue;
		if (s == SHM_ASSIST_POSTED && sv_now_ns() - now > pickup) {
			/* The helper stopped, or lost its core: take it back,
			 * and leave the helper alone for a while. */
			uint32_t p = SHM_ASSIST_POSTED;
			if (atomic_compare_exchange_strong_explicit(&a->astate, &p, SHM_ASSIST_IDLE,
								    memory_order_relaxed,
								    memory_order_relaxed)) {
				a->backoff_until_ns = sv_now_ns() + ASSIST_BACKOFF_NS;
				return false;
			}
		}
		/* Taken: the answer comes unless the target died. */
		if (i % (1u << 16) == 0 && sv_seg_gone(t, true))
			return false;
	}
}
