/* SPDX-License-Identifier: MIT */
/*
 * Shared segments: the owner's side (create, lay out, allocate queue
 * blocks, destroy) and the peers' side (find and map another context's
 * segment from the host registry).  The layout contract is in seg.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../sv.h"

void sv_shm_mutex_init(pthread_mutex_t *m)
{
	pthread_mutexattr_t ma;

	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(m, &ma);
	pthread_mutexattr_destroy(&ma);
}

void sv_shm_lock(pthread_mutex_t *m)
{
	int r = EBUSY;

	/* Spin briefly before sleeping.  These locks guard a few hundred
	 * nanoseconds of queue work, but a locker that finds one held sleeps
	 * in FUTEX_WAIT and its holder then pays a FUTEX_WAKE: two system
	 * calls, about 1 us each here, where the wait itself was shorter
	 * (`strace -c` of ib_send_lat once showed a pair per message, when
	 * CQs still had this lock).  The futex word is read before each try,
	 * so spinning does not take the line from the holder; a holder off
	 * its core is waited for by sleeping. */
	for (int i = 0; i < SV_LOCK_SPINS && r == EBUSY; i++) {
		if (__atomic_load_n(&m->__data.__lock, __ATOMIC_RELAXED) == 0)
			r = pthread_mutex_trylock(m);
		else
			sv_cpu_relax();
	}
	if (r == EBUSY)
		r = pthread_mutex_lock(m);
	/* A holder that died mid-update leaves at worst one queue entry
	 * half-written; the queue itself stays usable. */
	if (r == EOWNERDEAD)
		pthread_mutex_consistent(m);
}

void sv_shm_unlock(pthread_mutex_t *m)
{
	pthread_mutex_unlock(m);
}

/*
 * The lock of a queue only its owner's threads take (a CQ's pollers, a
 * lock-free receive queue's posters).  Its release is a plain store, where
 * a mutex's is a locked instruction: that waits for every store before it
 * to reach the cache, among them the one that just wrote a line the peer
 * holds (a freed CQE, a posted WQE), and so made the poll or post that
 * answers a message wait a cache-line transfer for nothing.  The acquire
 * spins, then yields: a holder off its core is waited for by yielding,
 * never sleeping, since a plain-store release wakes nobody.
 */
void sv_own_lock(_Atomic uint32_t *l)
{
	for (unsigned i = 0;; i++) {
		if (!atomic_load_explicit(l, memory_order_relaxed) &&
		    !atomic_exchange_explicit(l, 1, memory_order_acquire))
			return;
		if (i < SV_LOCK_SPINS)
			sv_cpu_relax();
		else
			sched_yield();
	}
}

void sv_own_unlock(_Atomic uint32_t *l)
{
	atomic_store_explicit(l, 0, memory_order_release);
}

static void reclaim_aged(struct sv_seg *s);

static uint64_t align_up(uint64_t v)
{
	return (v + SHM_ALIGN - 1) & ~(uint64_t)(SHM_ALIGN - 1);
}

static uint64_t shm_layout(struct shm_hdr *h)
{
	uint64_t off = align_up(sizeof(*h));

	h->n_mrs = SV_MAX_MR + 1;	/* key index 0 is never issued */
	h->off_mrs = off;
	off = align_up(off + (uint64_t)h->n_mrs * sizeof(struct shm_mr));
	h->off_mr_users = off;
	off = align_up(off + (uint64_t)h->n_mrs * sizeof(struct shm_mr_users));
	h->n_pds = SV_MAX_PD;
	h->off_pds = off;
	off = align_up(off + (uint64_t)h->n_pds * sizeof(struct shm_pd));
	h->n_qps = SV_HOST_MAX_QP;
	h->off_qps = off;
	off = align_up(off + (uint64_t)h->n_qps * sizeof(uint64_t));
	h->owner_off = off;
	off = align_up(off + sizeof(struct shm_owner));
	h->defer_off = off;
	off = align_up(off + sizeof(struct shm_defer));
	h->assist_off = off;
	off = align_up(off + sizeof(struct shm_assist));
	h->bounce_off = off;
	off = align_up(off + sizeof(struct shm_bounce));
	off = (off + 4095) & ~4095ull;
	struct shm_bounce *b = shm_at(h, h->bounce_off);
	b->data_off = off;
	off += SHM_BOUNCE_CHUNK;
	h->heap_off = (off + 4095) & ~4095ull;
	return h->heap_off;
}

void sv_seg_defer_init(struct shm_hdr *h)
{
	struct shm_defer *d = shm_at(h, h->defer_off);

	/* Slot i is first filled by position i (seg.h). */
	for (uint32_t i = 0; i < SHM_DEFER_SLOTS; i++)
		atomic_store_explicit(&d->slot[i].seq, i, memory_order_relaxed);
}

int sv_seg_create(struct sv_seg *s, uint32_t ep, uint32_t dev_index)
{
	char name[128];
	int fd, ret;

	memset(s, 0, sizeof(*s));
	sv_seg_name(name, sizeof(name), sv_pid(), ep);
	fd = open(name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return errno;
	if (ftruncate(fd, (off_t)SHM_SEG_SIZE)) {
		ret = errno;
		close(fd);
		unlink(name);
		return ret;
	}
	void *m = mmap(NULL, SHM_SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ret = errno;
	if (m == MAP_FAILED) {
		close(fd);
		unlink(name);
		return ret;
	}
	s->fd = fd;
	struct shm_hdr *h = m;
	h->size = SHM_SEG_SIZE;
	h->pid = sv_pid();
	h->ep = ep;
	h->start_time = sv_proc_start_time(h->pid);
	h->dev_index = dev_index;
	s->heap_end = shm_layout(h);
	sv_seg_defer_init(h);
	sv_shm_mutex_init(&h->atomic_lock);
	sv_shm_mutex_init(&((struct shm_bounce *)shm_at(h, h->bounce_off))->lock);
	sv_shm_mutex_init(&((struct shm_owner *)shm_at(h, h->owner_off))->lock);
	sv_shm_mutex_init(&((struct shm_assist *)shm_at(h, h->assist_off))->lock);
	pthread_mutex_init(&s->lock, NULL);
	s->h = h;
	h->magic = SHM_MAGIC;
	h->version = SHM_VERSION;
	/* Pairs with the acquire load in sv_seg_peer(). */
	atomic_store_explicit(&h->ready, 1, memory_order_release);
	return 0;
}

void sv_seg_destroy(struct sv_seg *s)
{
	char name[128];

	if (!s->h)
		return;
	sv_seg_name(name, sizeof(name), s->h->pid, s->h->ep);
	unlink(name);
	/* Processes that keep it mapped (a peer, an importer waiting on the
	 * owner mailbox) see the context gone. */
	atomic_store_explicit(&s->h->ready, 0, memory_order_release);
	munmap(s->h, SHM_SEG_SIZE);
	close(s->fd);
	free(s->free);
	free(s->quar);
	pthread_mutex_destroy(&s->lock);
	s->h = NULL;
}

/*
 * Heap blocks: first fit over a sorted free list, with a bump pointer
 * beyond it.  Only the owner allocates, so this lives in private memory.
 * Freed pages are returned to tmpfs with MADV_REMOVE.
 */
uint64_t sv_seg_alloc(struct sv_seg *s, uint64_t size)
{
	uint64_t off = 0;

	size = align_up(size);
	pthread_mutex_lock(&s->lock);
	reclaim_aged(s);
	for (uint32_t i = 0; i < s->nfree; i++) {
		if (s->free[i].len < size)
			continue;
		off = s->free[i].off;
		s->free[i].off += size;
		s->free[i].len -= size;
		if (!s->free[i].len) {
			memmove(&s->free[i], &s->free[i + 1], (s->nfree - i - 1) * sizeof(*s->free));
			s->nfree--;
		}
		break;
	}
	if (!off && s->heap_end + size <= SHM_SEG_SIZE) {
		off = s->heap_end;
		s->heap_end += size;
	}
	pthread_mutex_unlock(&s->lock);
	if (off)
		memset(shm_at(s->h, off), 0, size);
	return off;
}

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void free_now(struct sv_seg *s, uint64_t off, uint64_t size);

/*
 * A destroyed object's block is not reused for SHM_QUARANTINE_NS: an
 * initiator in another process that looked the object up just before it
 * was destroyed may still be finishing its operation on it (checks, then
 * one copy, then one completion), and must not find a new object there.
 */
#define SHM_QUARANTINE_NS 2000000000ull

static void reclaim_aged(struct sv_seg *s)
{
	uint64_t now = now_ns();
	uint32_t kept = 0;

	for (uint32_t i = 0; i < s->nquar; i++) {
		if (now - s->quar[i].t >= SHM_QUARANTINE_NS)
			free_now(s, s->quar[i].off, s->quar[i].len);
		else
			s->quar[kept++] = s->quar[i];
	}
	s->nquar = kept;
}

void sv_seg_free(struct sv_seg *s, uint64_t off, uint64_t size)
{
	pthread_mutex_lock(&s->lock);
	if (s->nquar == s->quar_cap) {
		uint32_t ncap = s->quar_cap ? s->quar_cap * 2 : 32;
		void *n = realloc(s->quar, ncap * sizeof(*s->quar));
		if (!n) {
			pthread_mutex_unlock(&s->lock);
			return;	/* only heap space is lost */
		}
		s->quar = n;
		s->quar_cap = ncap;
	}
	s->quar[s->nquar++] = (struct sv_seg_extent){ off, align_up(size), now_ns() };
	pthread_mutex_unlock(&s->lock);
}

/* Caller holds s->lock. */
static void free_now(struct sv_seg *s, uint64_t off, uint64_t size)
{
	if (s->nfree == s->cap) {
		uint32_t ncap = s->cap ? s->cap * 2 : 32;
		void *n = realloc(s->free, ncap * sizeof(*s->free));
		if (!n) {
			return;	/* losing track of a block only wastes heap space */
		}
		s->free = n;
		s->cap = ncap;
	}
	uint32_t i = 0;
	while (i < s->nfree && s->free[i].off < off)
		i++;
	memmove(&s->free[i + 1], &s->free[i], (s->nfree - i) * sizeof(*s->free));
	s->free[i].off = off;
	s->free[i].len = size;
	s->nfree++;
	/* Coalesce with the neighbours. */
	if (i + 1 < s->nfree && s->free[i].off + s->free[i].len == s->free[i + 1].off) {
		s->free[i].len += s->free[i + 1].len;
		memmove(&s->free[i + 1], &s->free[i + 2], (s->nfree - i - 2) * sizeof(*s->free));
		s->nfree--;
	}
	if (i > 0 && s->free[i - 1].off + s->free[i - 1].len == s->free[i].off) {
		s->free[i - 1].len += s->free[i].len;
		memmove(&s->free[i], &s->free[i + 1], (s->nfree - i - 1) * sizeof(*s->free));
		s->nfree--;
	}
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t a = (off + (uint64_t)pg - 1) & ~(uint64_t)(pg - 1), e = (off + size) & ~(uint64_t)(pg - 1);
	if (e > a)
		madvise(shm_at(s->h, a), e - a, MADV_REMOVE);
}

int sv_rq_post(struct shm_hdr *h, struct shm_wq *wq, const struct ibv_recv_wr *wr)
{
	struct shm_rwqe *w = shm_wq_slot(h, wq, wq->tail);

	/* Pairs with the consumer's release store freeing the slot. */
	if (atomic_load_explicit(&w->seq, memory_order_acquire) != (uint32_t)wq->tail)
		return ENOMEM;
	w->wr_id = wr->wr_id;
	w->num_sge = (uint32_t)wr->num_sge;
	if (wr->num_sge)	/* sg_list may be NULL then */
		memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(w->sge[0]));
	/* Pairs with the consumer's acquire load: the WQE before its seq. */
	atomic_store_explicit(&w->seq, (uint32_t)wq->tail + 1, memory_order_release);
	wq->tail++;
	/* The next post's slot was freed by a consumer long ago (the queue
	 * has SV_RQ_SLACK slots more than an application keeps posted): ask
	 * for its line now, while this thread has nothing to wait for. */
	sv_prefetchw(shm_wq_slot(h, wq, wq->tail));
	return 0;
}

bool sv_rq_take(struct shm_hdr *h, struct shm_wq *wq, struct shm_rwqe *out)
{
	uint64_t pos = atomic_load_explicit(&wq->rx_head, memory_order_relaxed);

	for (;;) {
		struct shm_rwqe *w = shm_wq_slot(h, wq, pos);
		int32_t d = (int32_t)(atomic_load_explicit(&w->seq, memory_order_acquire) -
				      ((uint32_t)pos + 1));
		if (d < 0)
			return false;	/* nothing posted at pos yet */
		if (d > 0) {		/* another consumer took it */
			pos = atomic_load_explicit(&wq->rx_head, memory_order_relaxed);
			continue;
		}
		if (!atomic_compare_exchange_weak_explicit(&wq->rx_head, &pos, pos + 1,
							   memory_order_relaxed, memory_order_relaxed))
			continue;
		memcpy(out, w, sizeof(*w) + w->num_sge * sizeof(w->sge[0]));
		atomic_store_explicit(&w->seq, (uint32_t)(pos + wq->size), memory_order_release);
		return true;
	}
}

struct shm_wq *sv_seg_new_wq(struct sv_seg *s, uint32_t size, uint32_t max_sge, uint64_t *off)
{
	uint32_t stride = (uint32_t)align_up(sizeof(struct shm_rwqe) +
					     (max_sge ? max_sge : 1) * sizeof(struct ibv_sge));
	uint64_t o = sv_seg_alloc(s, sizeof(struct shm_wq) + SHM_ALIGN + (uint64_t)size * stride);

	if (!o)
		return NULL;
	struct shm_wq *wq = shm_at(s->h, o);
	sv_shm_mutex_init(&wq->lock);
	wq->size = size ? size : 1;
	wq->max_sge = max_sge;
	wq->stride = stride;
	wq->wqe_off = sv_seg_wq_slots(o);
	for (uint32_t i = 0; i < wq->size; i++)
		atomic_store_explicit(&shm_wq_slot(s->h, wq, i)->seq, i, memory_order_relaxed);
	*off = o;
	return wq;
}

uint64_t sv_seg_wq_slots(uint64_t wq_off)
{
	return align_up(wq_off + sizeof(struct shm_wq));
}

uint64_t sv_seg_wq_bytes(const struct shm_wq *wq)
{
	return sizeof(*wq) + SHM_ALIGN + (uint64_t)wq->size * wq->stride;
}

/* ---- peers ---- */

struct peer {
	uint32_t ep;
	int32_t pid;
	uint64_t start_time;
	struct shm_hdr *h;
};

static pthread_mutex_t peers_lock = PTHREAD_MUTEX_INITIALIZER;
static struct peer *peers;
static uint32_t npeers, peers_cap;

/* Local segments, so that same-process peers use the owner's mapping. */
static struct shm_hdr *local_segs[64];

void sv_seg_register_local(struct shm_hdr *h, bool add,
			   void (*solo)(struct shm_hdr *h, bool solo))
{
	pthread_mutex_lock(&peers_lock);
	for (size_t i = 0; i < SV_ARRAY_SIZE(local_segs); i++) {
		if (add && !local_segs[i]) {
			local_segs[i] = h;
			break;
		}
		if (!add && local_segs[i] == h) {
			local_segs[i] = NULL;
			break;
		}
	}
	/* Deferred placement needs the process's only context
	 * (transport/shm/defer.c, which solo is): a second one ends it for
	 * all, placing what is pending first; when one is left again (the
	 * others' keys are gone), it resumes.  Under peers_lock, so that
	 * contexts opening and closing at once leave the last word right. */
	struct shm_hdr *only = NULL;
	int n = 0;
	for (size_t i = 0; i < SV_ARRAY_SIZE(local_segs); i++)
		if (local_segs[i]) {
			only = local_segs[i];
			n++;
		}
	for (size_t i = 0; n > 1 && i < SV_ARRAY_SIZE(local_segs); i++)
		if (local_segs[i])
			solo(local_segs[i], false);
	if (n == 1)
		solo(only, true);
	pthread_mutex_unlock(&peers_lock);
}

struct shm_hdr *sv_seg_local_other(const struct shm_hdr *not)
{
	struct shm_hdr *h = NULL;

	pthread_mutex_lock(&peers_lock);
	for (size_t i = 0; i < SV_ARRAY_SIZE(local_segs) && !h; i++)
		if (local_segs[i] && local_segs[i] != not)
			h = local_segs[i];
	pthread_mutex_unlock(&peers_lock);
	return h;
}

/*
 * The segment of endpoint ep owned by (pid, start_time), mapped once and
 * kept for the life of the process: a peer that died leaves its mapping
 * here (the file is unlinked, so only pages this process already touched
 * stay), which is bounded by the number of peers ever talked to.
 */
struct shm_hdr *sv_seg_peer(uint32_t ep, int32_t pid, uint64_t start_time)
{
	struct shm_hdr *h = NULL;
	char name[128];

	pthread_mutex_lock(&peers_lock);
	if (pid == sv_pid()) {
		for (size_t i = 0; i < SV_ARRAY_SIZE(local_segs); i++)
			if (local_segs[i] && local_segs[i]->ep == ep)
				h = local_segs[i];
		pthread_mutex_unlock(&peers_lock);
		return h;
	}
	for (uint32_t i = 0; i < npeers; i++)
		if (peers[i].ep == ep && peers[i].pid == pid && peers[i].start_time == start_time)
			h = peers[i].h;
	pthread_mutex_unlock(&peers_lock);
	if (h)
		return h;

	sv_seg_name(name, sizeof(name), pid, ep);
	int fd = open(name, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	void *m = mmap(NULL, SHM_SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return NULL;
	h = m;
	if (!atomic_load_explicit(&h->ready, memory_order_acquire) || h->magic != SHM_MAGIC ||
	    h->version != SHM_VERSION || h->pid != pid || h->ep != ep) {
		munmap(m, SHM_SEG_SIZE);
		return NULL;
	}
	pthread_mutex_lock(&peers_lock);
	if (npeers == peers_cap) {
		uint32_t ncap = peers_cap ? peers_cap * 2 : 16;
		void *n = realloc(peers, ncap * sizeof(*peers));
		if (!n) {
			pthread_mutex_unlock(&peers_lock);
			munmap(m, SHM_SEG_SIZE);
			return NULL;
		}
		peers = n;
		peers_cap = ncap;
	}
	peers[npeers++] = (struct peer){ ep, pid, start_time, h };
	pthread_mutex_unlock(&peers_lock);
	return h;
}

/* Another process's segment, by its file (a command fd it passed us);
 * NULL with errno EINVAL when fd is no softverbs segment, ESHUTDOWN when
 * its context has closed. */
struct shm_hdr *sv_seg_map_fd(int fd)
{
	struct stat st;

	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != SHM_SEG_SIZE) {
		errno = EINVAL;
		return NULL;
	}
	struct shm_hdr *h = mmap(NULL, SHM_SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (h == MAP_FAILED) {
		errno = EINVAL;
		return NULL;
	}
	/* Pairs with the release store of `ready` in sv_seg_create(); 0
	 * again once the context closed (sv_seg_destroy()). */
	bool ours = h->magic == SHM_MAGIC && h->version == SHM_VERSION;
	if (!ours || !atomic_load_explicit(&h->ready, memory_order_acquire)) {
		munmap(h, SHM_SEG_SIZE);
		errno = ours ? ESHUTDOWN : EINVAL;
		return NULL;
	}
	return h;
}

void sv_seg_unmap(struct shm_hdr *h)
{
	munmap(h, SHM_SEG_SIZE);
}

struct shm_qp *sv_seg_qp(const struct shm_hdr *h, uint32_t qpn)
{
	uint32_t i = qpn - sv_qpn_base;

	if (qpn < sv_qpn_base || i >= h->n_qps)
		return NULL;
	/* Pairs with the release store in sv_seg_publish_qp(). */
	uint64_t off = atomic_load_explicit(&shm_qp_dir(h)[i], memory_order_acquire);
	return off ? shm_at(h, off) : NULL;
}

void sv_seg_publish_qp(struct shm_hdr *h, uint32_t qpn, uint64_t off)
{
	atomic_store_explicit(&shm_qp_dir(h)[qpn - sv_qpn_base], off, memory_order_release);
}

/* Whether t's context closed (`ready` back to 0), or with check_pid its
 * process died (or is a zombie its parent has not reaped, which
 * kill(pid, 0) would not tell). */
bool sv_seg_gone(const struct shm_hdr *t, bool check_pid)
{
	return !atomic_load_explicit(&t->ready, memory_order_acquire) ||
	       (check_pid && !sv_proc_alive(t->pid, 0));
}

void sv_seg_ring(struct shm_hdr *h)
{
	atomic_fetch_add_explicit(&h->doorbell, 1, memory_order_release);
	syscall(SYS_futex, &h->doorbell, FUTEX_WAKE, 1, NULL, NULL, 0);
}
