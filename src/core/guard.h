/* SPDX-License-Identifier: MIT */
/*
 * The guard: a small process of its own (`softverbs __guard`, started on
 * first use) that sends, once this process has died, the packets it was
 * given for that moment.  A kernel does this for a process that dies with
 * connections open: ib_cm sends their DREQs when the process's files
 * close, and the peers see DISCONNECTED.  A process here owns its
 * connections in user space, and a kill -9 leaves nobody to speak for
 * them but a process that outlives it.
 *
 * The library and the guard share the messages below over a
 * SOCK_SEQPACKET pair.  An ADD carries, as SCM_RIGHTS, the socket to send
 * from (so the source address and port are the ones the packet was made
 * for); a DEL takes the packet back.  The guard watches this process with
 * a pidfd, so a fork child that inherits the pair changes nothing.
 */
#ifndef SV_CORE_GUARD_H
#define SV_CORE_GUARD_H

#include <netinet/in.h>
#include <stdint.h>

/* One datagram as it will be sent: destination, ancillary data, bytes. */
struct sv_frame {
	struct sockaddr_in6 to;		/* an AF_INET or AF_INET6 address */
	uint32_t tolen;
	uint32_t ctllen;
	uint32_t len;
	uint32_t pad;
	uint8_t ctl[128] __attribute__((aligned(8)));	/* cmsghdrs */
	uint8_t pkt[320];
};

enum sv_guard_op { SV_GUARD_ADD = 1, SV_GUARD_DEL = 2 };

struct sv_guard_msg {
	uint32_t op;
	uint32_t pad;
	uint64_t key;
	struct sv_frame f;		/* ADD only */
};

/* The guard sends key's frame from a dup of fd after this process dies,
 * replacing what key held.  0, or an errno (the guard could not start;
 * said once). */
int sv_guard_add(uint64_t key, int fd, const struct sv_frame *f);
/* key's frame is not sent. */
void sv_guard_del(uint64_t key);

/* The guard's side (tools/guard.c): fd 3 is the pair, fd 4 the pidfd. */
#define SV_GUARD_SOCK_FD	3
#define SV_GUARD_PIDFD		4
#define SV_GUARD_ROUNDS		3	/* each frame goes this often ... */
#define SV_GUARD_GAP_MS		50	/* ... this far apart: a lost one is covered */

#endif
