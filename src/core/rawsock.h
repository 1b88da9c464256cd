/* SPDX-License-Identifier: MIT */
/*
 * The libraries' own sockets are made by the socket system call, never by
 * a socket() that another library may interpose: librspreload.so takes
 * every socket() of its process to try rsocket() on it first, ours
 * included, and the UDP transport's sockets would then be datagram
 * rsockets running on top of themselves.  Once made, an fd it did not
 * create passes through its other wrappers untouched.
 */
#ifndef SV_CORE_RAWSOCK_H
#define SV_CORE_RAWSOCK_H

#include <sys/syscall.h>
#include <unistd.h>

static inline int sv_socket(int domain, int type, int protocol)
{
	return (int)syscall(SYS_socket, domain, type, protocol);
}

#endif
