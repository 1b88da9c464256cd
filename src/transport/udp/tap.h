/* SPDX-License-Identifier: MIT */
/*
 * What sits between the UDP transport and the kernel's socket: the ICRC
 * (IBTA Annex A17.8), packet capture (SOFTVERBS_PCAP) and fault injection
 * (SOFTVERBS_FAULT).  A packet here is a RoCEv2 UDP payload: BTH, extension
 * headers, payload, pad, and the 4-byte ICRC last.
 */
#ifndef SV_UDP_TAP_H
#define SV_UDP_TAP_H

#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/*
 * The link's system calls, raw: glibc's wrappers of these are
 * cancellation points, and the link makes them from the application's
 * verbs (a CQ poll receives, a post sends) with engine locks held.  A
 * verb is no cancellation point, as in rdma-core, so a thread cancelled
 * (pthread_cancel, deferred) at its next one never dies holding a lock.
 */
static inline int sv_recvmmsg(int fd, struct mmsghdr *m, unsigned n, int flags)
{
	return (int)syscall(SYS_recvmmsg, fd, m, n, flags, NULL);
}
static inline int sv_sendmmsg(int fd, struct mmsghdr *m, unsigned n, int flags)
{
	return (int)syscall(SYS_sendmmsg, fd, m, n, flags);
}
static inline ssize_t sv_recvmsg(int fd, struct msghdr *m, int flags)
{
	return syscall(SYS_recvmsg, fd, m, flags);
}
static inline int sv_ppoll(struct pollfd *p, unsigned n, const struct timespec *t)
{
	return (int)syscall(SYS_ppoll, p, n, t, NULL, (size_t)8);
}
static inline ssize_t sv_sendmsg(int fd, const struct msghdr *m, int flags)
{
	return syscall(SYS_sendmsg, fd, m, flags);
}
static inline ssize_t sv_writev(int fd, const struct iovec *iov, int n)
{
	return syscall(SYS_writev, fd, iov, n);
}
static inline ssize_t sv_write(int fd, const void *buf, size_t len)
{
	return syscall(SYS_write, fd, buf, len);
}

/* The IP and UDP fields the ICRC covers, and a capture records: the
 * addresses (IPv4 as IPv4-mapped IPv6), ports in host order, and for IPv4
 * whether DF is set (the IPv4 identification is always 0: the kernel
 * gives 0 to unconnected UDP sockets that set DF, as rxe does). */
struct sv_flow {
	struct in6_addr src, dst;
	uint16_t sport, dport;
	uint8_t tclass, ttl;	/* recorded in captures; masked in the ICRC */
	bool v4;
	uint32_t flow;		/* IPv6 flow label: recorded; masked in the ICRC */
	uint32_t ifindex;	/* sending: the interface of a link-local destination */
	/* IPv4 identification, which the ICRC covers: 0, as the kernel
	 * gives a DF datagram of an unconnected socket, except for the
	 * k-th packet of a GSO run, k (icrc.c, "The IPv4 identification"). */
	uint16_t ipid;
};

/* ---- fault.c: the ancillary data a packet leaves with ---- */
/* Room for sv_flow_cmsg's control messages, and a UDP_SEGMENT besides. */
#define SV_FLOW_CMSG_SPACE	128
/* The IP-level control messages that make a datagram on flow f leave as
 * a RoCE NIC would send it, into buf (len bytes, aligned for cmsghdr):
 * on a dual-stack AF_INET6 socket (family AF_INET6) its source address,
 * as IPV6_PKTINFO (IPv4-mapped for IPv4: the source GID's address, so
 * that the ICRC covers what the kernel sends), and for both families the
 * traffic class and the TTL or hop limit (IP_TOS and IP_TTL, IPV6_TCLASS
 * and IPV6_HOPLIMIT; a ttl of 0 leaves the kernel's default).  An AF_INET
 * socket gets TOS and TTL only.  Returns the bytes used. */
size_t sv_flow_cmsg(const struct sv_flow *f, int family, void *buf, size_t len);

/* ---- crc32.c ---- */
/* The gzip CRC-32 (zlib's crc32(), ISA-L's crc32_gzip_refl()) of buf[0..len),
 * continuing crc (0 to start). */
uint32_t sv_crc32(uint32_t crc, const void *buf, size_t len);
/* Whether long buffers take crc32.c's 256-bit fold on this processor. */
bool sv_crc32_wide(void);

/* ---- icrc.c ---- */
/* The ICRC of the packet pkt[0..n) of len bytes (BTH through pad, the
 * ICRC itself not included) sent on flow f.  The value is what goes in
 * the packet's last 4 bytes, stored little-endian as rxe does. */
uint32_t sv_icrc(const struct sv_flow *f, const struct iovec *pkt, int n, size_t len);
/* The IPv4 identifications a packet may have left with: a GSO run's
 * place (udp.c GSO_MAX_SEGS). */
#define SV_ICRC_IDS	64
/* What IPv4 identification id (below SV_ICRC_IDS) XORs into the ICRC
 * of a packet of len bytes (as sv_icrc's), against identification 0. */
uint32_t sv_icrc_id(size_t len, unsigned id);
/* Whether the packet buf[0..len) (its ICRC last) carries the right ICRC:
 * the IPv4 identification it was sent with (tried: hint first, then
 * every one below SV_ICRC_IDS; always 0 for IPv6), or -1.  Accepts an
 * IPv4 header without DF with identification 0 too. */
int sv_icrc_check(const struct sv_flow *f, const uint8_t *buf, size_t len, unsigned hint);
static inline bool sv_icrc_ok(const struct sv_flow *f, const uint8_t *buf, size_t len)
{
	return sv_icrc_check(f, buf, len, 0) >= 0;
}
/* As sv_icrc_check, and past the identifications below SV_ICRC_IDS any
 * 16-bit one of a DF header, as rxe and RoCE NICs number theirs
 * (SOFTVERBS_IPV4_ID=any): a corrupted IPv4 packet then passes with
 * probability 1 in 2^16, and a single-bit error at about one place in
 * 2^16 of a length too. */
int sv_icrc_check_any(const struct sv_flow *f, const uint8_t *buf, size_t len, unsigned hint);

/* ---- pcap.c ---- */
/* SOFTVERBS_PCAP=PATH (%p in PATH becomes the pid): opened on first use;
 * false when capture is off or the file cannot be written (said once). */
bool sv_pcap_on(void);
/* One frame: Ethernet, IPv4 (or IPv6), UDP, then the packet as sent or
 * received, ICRC included.  Thread-safe; one write(2) per frame. */
void sv_pcap_write(const struct sv_flow *f, const struct iovec *pkt, int n, size_t len);
/* sendmsg(sock, m) (m's iovecs are pkt), then the frame if it left, both
 * under the capture's lock: an answer to the packet is never captured
 * before it.  0 or the send's errno. */
int sv_pcap_send(int sock, const struct msghdr *m, const struct sv_flow *f, const struct iovec *pkt,
		 int n, size_t len);

/* ---- fault.c ---- */
struct sv_fault_cfg {
	double drop, dup, reorder, corrupt;	/* probabilities, 0..1 */
	uint32_t delay_us;
	uint64_t seed;
	bool on;
};
/* Parses SOFTVERBS_FAULT's syntax "drop=P,dup=P,reorder=P,corrupt=P,delay=USEC,seed=N"
 * (any subset, P in [0,1] or a percentage "5%"); 0, or EINVAL with
 * the reason in err. */
int sv_fault_parse(const char *s, struct sv_fault_cfg *c, char *err, size_t errlen);
/* The process's settings (SOFTVERBS_FAULT, parsed once; a bad value is
 * reported once on stderr and leaves faults off). */
const struct sv_fault_cfg *sv_fault_config(void);

enum { SV_FAULT_DROP = 1, SV_FAULT_DUP = 2, SV_FAULT_REORDER = 4, SV_FAULT_CORRUPT = 8 };
struct sv_fault_counts { uint64_t sent, dropped, duplicated, reordered, corrupted, delayed; };

/*
 * The wire out: sends one packet on fd to `to`, with the faults the
 * settings ask for, and captures what really left.  Deterministic: the
 * k-th packet this process sends gets the verdict hash(seed, sender, k),
 * the sender being the packet's source address (f->src) and which of
 * its host's processes sends it (`sender`: its registry endpoint), so
 * that two processes given the same seed lose independently.
 *   - drop: not sent (and not captured);
 *   - dup: sent twice;
 *   - corrupt: one byte of the copy sent is flipped (so its ICRC fails);
 *   - reorder: held, and sent after the next packet this process sends,
 *     or at the latest 1 ms later;
 *   - delay: every packet is held for delay_us.
 * Held packets are copied; the caller may reuse its buffers at once.
 * *due (due may be NULL): when the call returns 0 with packets held,
 * its own or earlier ones, the CLOCK_MONOTONIC ns the first is due;
 * else 0.
 * Only a later send or sv_wire_flush() sends a held packet, so the
 * caller must have sv_wire_flush() called by then.
 * Returns 0 or an errno (EAGAIN/ENOBUFS from a full socket buffer:
 * the packet is lost, as on a congested link).
 */
int sv_wire_send(int fd, const struct sockaddr *to, socklen_t tolen, const struct sv_flow *f,
		 uint32_t sender, const struct iovec *pkt, int n, size_t len, uint64_t *due);
/* Held packets whose time has come are sent; returns the
 * CLOCK_MONOTONIC ns when the next one is due, or 0 when none is held. */
uint64_t sv_wire_flush(uint64_t now_ns);
/* Drops held packets of fd, before the caller closes it. */
void sv_wire_forget(int fd);
void sv_fault_counts(struct sv_fault_counts *out);

#endif
