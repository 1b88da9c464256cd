/* SPDX-License-Identifier: MIT */
/*
 * Scatter lists in this process: the one memcpy every path ends in (the
 * shm transport within a process, the packet engine between packets and
 * MRs), and cutting a byte range out of a list.
 */
#include <string.h>
#include <sys/uio.h>

#include "../sv.h"

/*
 * These copies are the device's: DMA into and out of registered memory,
 * ordered for the application only by the completion it polls, or by
 * what the two ends agree on out of band, often through another process.
 * ThreadSanitizer cannot see that order, and a suppression by name
 * (tests/tsan.supp) matches only while TSan can still restore the
 * copying thread's stack, which a busy progress thread's history loses:
 * so the TSan build does not track them at all.
 */
#if defined(__SANITIZE_THREAD__)
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#define DMA_BEGIN()	(AnnotateIgnoreReadsBegin(__FILE__, __LINE__), \
			 AnnotateIgnoreWritesBegin(__FILE__, __LINE__))
#define DMA_END()	(AnnotateIgnoreWritesEnd(__FILE__, __LINE__), \
			 AnnotateIgnoreReadsEnd(__FILE__, __LINE__))
#else
#define DMA_BEGIN()	((void)0)
#define DMA_END()	((void)0)
#endif

/* memcpy between two scatter lists of equal total length. */
int sv_copy_iov(const struct iovec *d, int nd, const struct iovec *s, int ns)
{
	size_t doff = 0, soff = 0;
	int di = 0, si = 0, err = 0;
	/* Only a process that named GPU memory asks where each piece is. */
	bool gpu = sv_gpu_active();

	DMA_BEGIN();
	while (di < nd && si < ns) {
		size_t n = d[di].iov_len - doff;
		if (s[si].iov_len - soff < n)
			n = s[si].iov_len - soff;
		char *dp = (char *)d[di].iov_base + doff;
		const char *sp = (const char *)s[si].iov_base + soff;
		if (n && gpu)	/* an empty SGE may have no address */
			err |= sv_gpu_copy(dp, sp, n);
		else if (n)
			memcpy(dp, sp, n);
		doff += n;
		soff += n;
		if (doff == d[di].iov_len)
			di++, doff = 0;
		if (soff == s[si].iov_len)
			si++, soff = 0;
	}
	DMA_END();
	return err;
}

int sv_iov_slice(const struct iovec *v, int n, size_t off, size_t len, struct iovec *out)
{
	int k = 0;

	for (int i = 0; i < n && len; i++) {
		if (off >= v[i].iov_len) {
			off -= v[i].iov_len;
			continue;
		}
		size_t take = v[i].iov_len - off < len ? v[i].iov_len - off : len;
		out[k].iov_base = (char *)v[i].iov_base + off;
		out[k++].iov_len = take;
		len -= take;
		off = 0;
	}
	return k;
}
