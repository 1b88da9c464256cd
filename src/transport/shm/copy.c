/* SPDX-License-Identifier: MIT */
/*
 * Moving bytes: the one copy of every operation, straight from the source
 * buffer to the destination buffer.  Within one process it is memcpy over
 * the two scatter lists; across processes it is one process_vm_writev or
 * process_vm_readv call (CMA), which the kernel performs as a single copy
 * between the two address spaces.  A short transfer is progress, not
 * failure: the call is repeated for the rest (as UCX's uct_cma does).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../../sv.h"

/* memcpy between two scatter lists of equal total length. */
static void copy_iov(const struct iovec *d, int nd, const struct iovec *s, int ns)
{
	size_t doff = 0, soff = 0;
	int di = 0, si = 0;

	while (di < nd && si < ns) {
		size_t n = d[di].iov_len - doff;
		if (s[si].iov_len - soff < n)
			n = s[si].iov_len - soff;
		memcpy((char *)d[di].iov_base + doff, (const char *)s[si].iov_base + soff, n);
		doff += n;
		soff += n;
		if (doff == d[di].iov_len)
			di++, doff = 0;
		if (soff == s[si].iov_len)
			si++, soff = 0;
	}
}

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

static int cma(bool write, int32_t pid, const struct iovec *l, int nl, const struct iovec *r, int nr)
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

/* Within this process memcpy is the one copy -- unless an ODP MR exists,
 * whose pages may be unmapped: then the kernel copies and answers EFAULT
 * where memcpy would crash the process. */
static bool plain_memcpy(int32_t pid)
{
	return pid == getpid() && !atomic_load_explicit(&sv_odp_mrs, memory_order_relaxed);
}

int sv_copy_to(int32_t pid, const struct iovec *l, int nl, const struct iovec *r, int nr)
{
	if (plain_memcpy(pid)) {
		copy_iov(r, nr, l, nl);
		return 0;
	}
	return cma(true, pid, l, nl, r, nr);
}

int sv_copy_from(int32_t pid, const struct iovec *l, int nl, const struct iovec *r, int nr)
{
	if (plain_memcpy(pid)) {
		copy_iov(l, nl, r, nr);
		return 0;
	}
	return cma(false, pid, l, nl, r, nr);
}
