/* SPDX-License-Identifier: MIT */
/*
 * rsockets are not implemented yet: every call fails with EOPNOTSUPP and
 * an explain line, so that a program (or librspreload.so) linked against
 * them loads and learns at once that the stream transport is missing,
 * instead of waiting on a socket that never connects.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <rdma/rsocket.h>

#include "cm.h"

static int missing(const char *call)
{
	softverbs_cm_explain(call, "failed (EOPNOTSUPP): softverbs' librdmacm has no rsockets "
			     "yet");
	errno = EOPNOTSUPP;
	return -1;
}

#define NOT_YET(ret, name, ...)					\
	CM_EXPORT ret name(__VA_ARGS__)				\
	{							\
		return (ret)missing(#name);			\
	}

NOT_YET(int, rsocket, int domain, int type, int protocol)
NOT_YET(int, rbind, int socket, const struct sockaddr *addr, socklen_t addrlen)
NOT_YET(int, rlisten, int socket, int backlog)
NOT_YET(int, raccept, int socket, struct sockaddr *addr, socklen_t *addrlen)
NOT_YET(int, rconnect, int socket, const struct sockaddr *addr, socklen_t addrlen)
NOT_YET(int, rshutdown, int socket, int how)
NOT_YET(int, rclose, int socket)
NOT_YET(ssize_t, rrecv, int socket, void *buf, size_t len, int flags)
NOT_YET(ssize_t, rrecvfrom, int socket, void *buf, size_t len, int flags, struct sockaddr *src_addr,
	socklen_t *addrlen)
NOT_YET(ssize_t, rrecvmsg, int socket, struct msghdr *msg, int flags)
NOT_YET(ssize_t, rsend, int socket, const void *buf, size_t len, int flags)
NOT_YET(ssize_t, rsendto, int socket, const void *buf, size_t len, int flags,
	const struct sockaddr *dest_addr, socklen_t addrlen)
NOT_YET(ssize_t, rsendmsg, int socket, const struct msghdr *msg, int flags)
NOT_YET(ssize_t, rread, int socket, void *buf, size_t count)
NOT_YET(ssize_t, rreadv, int socket, const struct iovec *iov, int iovcnt)
NOT_YET(ssize_t, rwrite, int socket, const void *buf, size_t count)
NOT_YET(ssize_t, rwritev, int socket, const struct iovec *iov, int iovcnt)
NOT_YET(int, rpoll, struct pollfd *fds, nfds_t nfds, int timeout)
NOT_YET(int, rselect, int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds,
	struct timeval *timeout)
NOT_YET(int, rgetpeername, int socket, struct sockaddr *addr, socklen_t *addrlen)
NOT_YET(int, rgetsockname, int socket, struct sockaddr *addr, socklen_t *addrlen)
NOT_YET(int, rsetsockopt, int socket, int level, int optname, const void *optval,
	socklen_t optlen)
NOT_YET(int, rgetsockopt, int socket, int level, int optname, void *optval, socklen_t *optlen)
NOT_YET(off_t, riomap, int socket, void *buf, size_t len, int prot, int flags, off_t offset)
NOT_YET(int, riounmap, int socket, void *buf, size_t len)

CM_EXPORT int rfcntl(int socket, int cmd, ...)
{
	return missing("rfcntl");
}

/* riowrite returns size_t: (size_t)-1 with errno, as rdma-core's does. */
CM_EXPORT size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags)
{
	return (size_t)missing("riowrite");
}
