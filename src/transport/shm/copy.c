/* SPDX-License-Identifier: MIT */
/*
 * Moving bytes: the one copy of every operation, straight from the source
 * buffer to the destination buffer.  Within one process it is memcpy over
 * the two scatter lists (core/iov.c); across processes it is a memcpy
 * through this process's mapping of the target's memory (direct.c), or
 * one process_vm_writev or process_vm_readv call (CMA), which the kernel
 * performs as a single copy between the two address spaces.  A short transfer is progress, not
 * failure: the call is repeated for the rest (as UCX's uct_cma does).
 * A large CMA copy is shared with the target's progress thread
 * (assist.c), so that two cores move it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"

/* Advances an iovec array past n bytes, in place. */
static void iov_advance(struct iovec **v, int *n, size_t bytes)
{
	while (*n && bytes >= (*v)->iov_len) {
		bytes -= (*v)->iov_len;
		(*v)++;
		(*n)--;
	}
	if (*n && bytes) {
		(*v)->iov_base = (char *)(*v)->iov_base + bytes;
		(*v)->iov_len -= bytes;
	}
}

int sv_cma(bool write, int32_t pid, const struct iovec *l, int nl, const struct iovec *r, int nr)
{
	struct iovec lv[SV_MAX_SGE + 2], rv[SV_MAX_SGE + 2];
	struct iovec *lp = lv, *rp = rv;
	size_t total = 0;

	if (nl > (int)SV_ARRAY_SIZE(lv) || nr > (int)SV_ARRAY_SIZE(rv))
		return EINVAL;
	memcpy(lv, l, (size_t)nl * sizeof(*l));
	memcpy(rv, r, (size_t)nr * sizeof(*r));
	for (int i = 0; i < nl; i++)
		total += l[i].iov_len;
	while (total) {
		ssize_t n = write ? process_vm_writev(pid, lp, (unsigned long)nl, rp, (unsigned long)nr, 0)
				  : process_vm_readv(pid, lp, (unsigned long)nl, rp, (unsigned long)nr, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		if (n == 0)
			return EFAULT;
		total -= (size_t)n;
		iov_advance(&lp, &nl, (size_t)n);
		iov_advance(&rp, &nr, (size_t)n);
	}
	return 0;
}

atomic_int sv_odp_mrs;

/* Within this process memcpy is the one copy -- unless an ODP MR exists,
 * whose pages may be unmapped: then the kernel copies and answers EFAULT
 * where memcpy would crash the process. */
static bool plain_memcpy(int32_t pid)
{
	return pid == sv_pid() && !atomic_load_explicit(&sv_odp_mrs, memory_order_relaxed);
}

/* ---- the bounce path ---- */

static void serve(struct shm_hdr *own, struct shm_bounce *b, uint32_t req)
{
	struct iovec d[SHM_BOUNCE_IOV], c;
	size_t len = 0;

	for (uint32_t i = 0; i < b->niov; i++) {
		d[i].iov_base = (void *)(uintptr_t)b->iov[i].addr;
		d[i].iov_len = b->iov[i].len;
		len += b->iov[i].len;
	}
	c.iov_base = shm_at(own, b->data_off);
	c.iov_len = len;
	/* The initiator checked these addresses against this process's MR
	 * table and holds the MRs until it has the answer. */
	int st = b->write ? sv_copy_to(own, NULL, &c, 1, d, (int)b->niov)
			  : sv_copy_from(own, NULL, &c, 1, d, (int)b->niov);
	b->status = st;
	/* The request this thread claimed, not `req` read again: the
	 * initiator may have staged the next one already if this is late.
	 * Pairs with the initiator's acquire load of done. */
	atomic_store_explicit(&b->done, req, memory_order_release);
	syscall(SYS_futex, &b->done, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

bool sv_bounce_claim(struct shm_bounce *b, uint32_t req)
{
	uint32_t taken = atomic_load_explicit(&b->taken, memory_order_relaxed);

	/* Two threads of this process may both see a request pending; the
	 * one whose compare-and-swap moves `taken` to it serves it.  `taken`
	 * only moves forward: a thread that read `req` and was then delayed
	 * while others served that request and the next finds `taken` ahead
	 * of its `req` and gives up.  Had it claimed (any `taken != req`
	 * once let it), it moved `taken` back and copied the mailbox while
	 * the initiator staged a later chunk there: user data corrupted.
	 * Ahead by more than one is an initiator that died holding the
	 * mailbox (robust lock) before its request was served: the next
	 * request is still served. */
	return (int32_t)(req - taken) > 0 &&
	       atomic_compare_exchange_strong_explicit(&b->taken, &taken, req, memory_order_relaxed,
						       memory_order_relaxed);
}

void sv_bounce_serve(struct shm_hdr *own)
{
	struct shm_bounce *b = shm_at(own, own->bounce_off);
	/* Pairs with the initiator's release store of req: the staged chunk
	 * and destination list are visible. */
	uint32_t req = atomic_load_explicit(&b->req, memory_order_acquire);

	if (!sv_bounce_claim(b, req))
		return;
	/* The initiator staged this request only after `done` reached the
	 * previous one: this acquire pairs with the release store of the
	 * thread that served that one, whose writes to the mailbox (status)
	 * are then ordered before this thread's. */
	(void)atomic_load_explicit(&b->done, memory_order_acquire);
	serve(own, b, req);
}

/* One chunk through the target's mailbox; the caller holds its lock. */
static int bounce_chunk(struct shm_hdr *t, struct shm_hdr *own, bool write,
			const struct iovec *l, int nl, const struct iovec *r, int nr, size_t len)
{
	struct shm_bounce *b = shm_at(t, t->bounce_off);
	struct iovec c = { shm_at(t, b->data_off), len };

	if (nr > SHM_BOUNCE_IOV)
		return EINVAL;
	if (write)
		sv_copy_iov(&c, 1, l, nl);
	b->write = write;
	b->niov = (uint32_t)nr;
	for (int i = 0; i < nr; i++) {
		b->iov[i].addr = (uintptr_t)r[i].iov_base;
		b->iov[i].len = r[i].iov_len;
	}
	uint32_t seq = atomic_load_explicit(&b->req, memory_order_relaxed) + 1;
	atomic_store_explicit(&b->req, seq, memory_order_release);
	sv_seg_ring(t);
	int err = sv_shm_await(t, &b->done, seq, own);
	if (err)
		return err;
	if (b->status)
		return b->status;
	if (!write)
		sv_copy_iov(l, nl, &c, 1);
	return 0;
}

static int bounce(struct shm_hdr *t, struct shm_hdr *own, bool write, const struct iovec *l,
		  int nl, const struct iovec *r, int nr)
{
	struct shm_bounce *b = shm_at(t, t->bounce_off);
	struct iovec ls[SHM_BOUNCE_IOV], rs[SHM_BOUNCE_IOV];
	size_t total = 0;
	int err = 0;

	for (int i = 0; i < nl; i++)
		total += l[i].iov_len;
	sv_shm_lock(&b->lock);
	for (size_t off = 0; off < total && !err; off += SHM_BOUNCE_CHUNK) {
		size_t len = total - off < SHM_BOUNCE_CHUNK ? total - off : SHM_BOUNCE_CHUNK;
		int a = sv_iov_slice(l, nl, off, len, ls), c = sv_iov_slice(r, nr, off, len, rs);
		err = bounce_chunk(t, own, write, ls, a, rs, c, len);
	}
	sv_shm_unlock(&b->lock);
	return err;
}

static size_t iov_len(const struct iovec *v, int n)
{
	size_t len = 0;

	for (int i = 0; i < n; i++)
		len += v[i].iov_len;
	return len;
}

static void count(struct shm_hdr *own, enum sv_copy_path path, const struct iovec *l, int nl)
{
	if (own)
		sv_reg_count_bytes(own->ep, path, iov_len(l, nl));
}

int sv_copy_mapped(struct shm_hdr *own, bool write, const struct iovec *l, int nl,
		   const struct iovec *r, int nr)
{
	int err = write ? sv_copy_iov(r, nr, l, nl) : sv_copy_iov(l, nl, r, nr);

	if (!err)
		count(own, SV_PATH_DIRECT, l, nl);
	return err;
}

/*
 * This process's GPU memory and another process's private host memory:
 * CMA cannot read or write device memory, so the bytes go through a host
 * buffer, one cuMemcpy and one CMA call per chunk.  The one path with two
 * copies; a peer's GPU memory, and shareable host memory, are mapped
 * here and take one.
 */
#define GPU_STAGE (1u << 20)

static pthread_key_t stage_key;
static pthread_once_t stage_once = PTHREAD_ONCE_INIT;

static void stage_init(void)
{
	pthread_key_create(&stage_key, free);
}

static int gpu_staged(bool write, int32_t pid, const struct iovec *l, int nl,
		      const struct iovec *r, int nr)
{
	struct iovec ls[SV_MAX_SGE + 2], rs[SV_MAX_SGE + 2];
	size_t total = iov_len(l, nl);
	int err = 0;

	pthread_once(&stage_once, stage_init);
	char *stage = pthread_getspecific(stage_key);
	if (!stage) {
		if (!(stage = malloc(GPU_STAGE)))
			return ENOMEM;
		pthread_setspecific(stage_key, stage);
	}
	for (size_t off = 0; off < total && !err; off += GPU_STAGE) {
		size_t len = total - off < GPU_STAGE ? total - off : GPU_STAGE;
		struct iovec b = { stage, len };
		int a = sv_iov_slice(l, nl, off, len, ls), c = sv_iov_slice(r, nr, off, len, rs);
		if (write) {
			err = sv_copy_iov(&b, 1, ls, a);
			if (!err)
				err = sv_cma(true, pid, &b, 1, rs, c);
		} else {
			err = sv_cma(false, pid, &b, 1, rs, c);
			if (!err)
				err = sv_copy_iov(ls, a, &b, 1);
		}
	}
	return err;
}

static int move(bool write, struct shm_hdr *t, struct shm_hdr *own, const struct iovec *l,
		int nl, const struct iovec *r, int nr)
{
	int err;

	/* Device memory on either side: within this process cuMemcpy
	 * reaches both, across processes the local side is staged (the
	 * remote side is host memory here: a peer's GPU MR is mapped). */
	bool self = t->pid == sv_pid();
	if (sv_gpu_active() && (sv_gpu_dev_iov(l, nl) || (self && sv_gpu_dev_iov(r, nr)))) {
		if (!self)
			err = gpu_staged(write, t->pid, l, nl, r, nr);
		else
			err = write ? sv_copy_iov(r, nr, l, nl) : sv_copy_iov(l, nl, r, nr);
		if (!err)
			count(own, self ? SV_PATH_LOCAL : SV_PATH_CMA, l, nl);
		return err;
	}
	if (plain_memcpy(t->pid)) {
		if (write)
			sv_copy_iov(r, nr, l, nl);
		else
			sv_copy_iov(l, nl, r, nr);
		count(own, SV_PATH_LOCAL, l, nl);
		return 0;
	}
	enum sv_copy_mode mode = sv_config()->copy;
	/* The bounce path needs the target's progress thread; a process's
	 * own memory (ODP) always goes through the kernel. */
	if (mode == SV_COPY_BOUNCE && t->pid != sv_pid() && own) {
		err = bounce(t, own, write, l, nl, r, nr);
		if (!err)
			count(own, SV_PATH_BOUNCE, l, nl);
		return err;
	}
	size_t len = iov_len(l, nl);
	if (len >= SHM_ASSIST_MIN && own && t->pid != sv_pid() &&
	    sv_config()->assist != SV_ASSIST_OFF && sv_assist_copy(t, write, l, nl, r, nr, len)) {
		count(own, SV_PATH_CMA, l, nl);
		return 0;
	}
	err = sv_cma(write, t->pid, l, nl, r, nr);
	if ((err == EPERM || err == ENOSYS) && mode == SV_COPY_AUTO && t->pid != sv_pid() && own) {
		sv_dbg("CMA into pid %d refused (%s); using the bounce path", (int)t->pid,
		       sv_errno_name(err));
		err = bounce(t, own, write, l, nl, r, nr);
		if (!err)
			count(own, SV_PATH_BOUNCE, l, nl);
		return err;
	}
	if (!err)
		count(own, SV_PATH_CMA, l, nl);
	return err;
}

int sv_copy_to(struct shm_hdr *t, struct shm_hdr *own, const struct iovec *l, int nl,
	       const struct iovec *r, int nr)
{
	return move(true, t, own, l, nl, r, nr);
}

int sv_copy_from(struct shm_hdr *t, struct shm_hdr *own, const struct iovec *l, int nl,
		 const struct iovec *r, int nr)
{
	return move(false, t, own, l, nl, r, nr);
}
