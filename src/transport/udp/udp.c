/* SPDX-License-Identifier: MIT */
/*
 * RoCEv2 over UDP (IBA Annex A17): the link between a context and other
 * hosts: the packet slots of the transport ops table (engine/engine.h),
 * which the packet engine sends and receives through.
 *
 * Every context of a host listens on UDP port 4791 (SO_REUSEPORT: one
 * group of sockets, one per context, of one user), IPv4 and IPv6 alike:
 * each socket is AF_INET6 with IPV6_V6ONLY off, so one socket, one group
 * and one forwarding path serve both families (an IPv4 packet shows up
 * with IPv4-mapped addresses, which is what a RoCEv2 GID of an IPv4
 * address is).  A kernel without IPv6 (ipv6.disable=1) gets AF_INET
 * sockets, and IPv6 destinations are then refused.  The kernel spreads a
 * group's packets by flow, not by destination QP, so a packet may reach a
 * context that does not own its QP: that context forwards it, unchanged
 * and with its addresses, to the owner's datagram socket, an abstract
 * AF_UNIX name of the host's network namespace found through the host
 * registry.  Each QP sends from a socket of its own, so its packets carry
 * a UDP source port of their own (the flow entropy of A17.3.1).
 *
 * Reception runs in two places: a thread per context that sleeps in
 * poll(2) until a packet or a timer is due, and any thread polling one of
 * the context's CQs, which receives first (sv_pkt_poll), so that the
 * latency path needs no thread wake-up.  While such pollers are active
 * the thread watches only timers; when they stop, it ticks the engine,
 * which hands it what they left (held ACKs), and watches the sockets.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../../core/guard.h"
#include "../../core/rawsock.h"
#include "../../engine/engine.h"
#include "../../engine/ibhdr.h"
#include "tap.h"
#include "udp.h"
#include "window.h"

/* linux/in6.h, which clashes with netinet/in.h: the IPv6 header's first
 * word (traffic class and flow label) as ancillary data. */
#ifndef IPV6_FLOWINFO
#define IPV6_FLOWINFO	11
#endif

#define RX_BATCH	16
/* With UDP_GRO one datagram read may hold up to 64 KiB of segments. */
#define RX_BUF		65536
#define SOCK_BUF	(4 << 20)
/*
 * After the thread has received, with no poller about, it keeps looking
 * at its sockets this long (yielding its core between looks) before it
 * sleeps: a request-response stream to an application that waits
 * elsewhere (ib_read_lat's responder, an event loop) then finds it
 * awake, where a wake-up costs tens of microseconds on a virtual
 * machine.  A NIC's polling driver does the same; an idle process still
 * sleeps.
 */
#define LINGER_NS	50000ull
/* How long a forward waits for room at its owner (forward()), and how
 * long each look for what is forwarded here meanwhile sleeps. */
#define FWD_WAIT_NS	2000000ull
#define FWD_NAP_NS	50000

/* What a forwarded packet carries before it: where it came from (the
 * route, field by field; between processes of one host, host order). */
struct fwd_hdr {
	struct in6_addr src, dst;
	uint32_t flow, ifindex;
	uint16_t sport;
	uint8_t tclass, ttl;
	uint8_t v4;
	uint8_t pad[3];
};
_Static_assert(sizeof(struct fwd_hdr) == 48, "fwd_hdr: no implicit padding");

/* A socket address of either family. */
union sa {
	struct sockaddr sa;
	struct sockaddr_in in;
	struct sockaddr_in6 in6;
};

/* The family of every socket of the link: AF_INET6 (dual-stack) where
 * the kernel has IPv6, else AF_INET. */
static int link_af = AF_INET6;
static pthread_once_t af_once = PTHREAD_ONCE_INIT;

static void af_probe(void)
{
	int fd = sv_socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (fd < 0) {
		link_af = AF_INET;
		sv_dbg("udp link: no IPv6 in this kernel (%s): IPv4 only", strerror(errno));
		return;
	}
	close(fd);
}

static int family(void)
{
	pthread_once(&af_once, af_probe);
	return link_af;
}

/* A socket of the link's family; dual-stack when it is AF_INET6. */
static int link_socket(int flags)
{
	int fd = sv_socket(family(), SOCK_DGRAM | SOCK_CLOEXEC | flags, 0), zero = 0;

	if (fd >= 0 && family() == AF_INET6 &&
	    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero))) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Where a packet on route r goes (port 4791); its length, or 0 when the
 * link cannot reach it (IPv6 without IPv6 sockets). */
static socklen_t dest_of(const struct sv_route *r, union sa *to)
{
	memset(to, 0, sizeof(*to));
	if (family() == AF_INET6) {
		to->in6.sin6_family = AF_INET6;
		to->in6.sin6_port = htons(SV_ROCE_PORT);
		to->in6.sin6_addr = r->dst;
		if (IN6_IS_ADDR_LINKLOCAL(&r->dst))
			to->in6.sin6_scope_id = r->ifindex;
		return sizeof(to->in6);
	}
	if (!r->v4)
		return 0;
	to->in.sin_family = AF_INET;
	to->in.sin_port = htons(SV_ROCE_PORT);
	memcpy(&to->in.sin_addr, &r->dst.s6_addr[12], 4);
	return sizeof(to->in);
}

struct sv_link_ep {
	struct sv_context *ctx;
	int sock;			/* [::]:4791 dual-stack (or 0.0.0.0:4791), SO_REUSEPORT */
	int fwd;			/* @softverbs-udp:PID:EP, packets other contexts forward */
	int efd;			/* wakes the thread: a nearer timer, or stop */
	pthread_t thr;
	atomic_bool stop;
	/* When the thread looks next (UINT64_MAX: on a packet or a kick
	 * only), and whether it sleeps watching the sockets, no poller seen.
	 * Stored by the thread before it reads want_at and last_poll again,
	 * read by want_tick() and link_poll() after they store those (all
	 * sequentially consistent): either the thread sees the new time or
	 * poll, or they see it asleep past it and kick.  A thread that found
	 * pollers (watching false) reads neither again and is not kicked for
	 * a time: the polls tick, and its next look, a window on, finds
	 * whether they still go on. */
	_Atomic uint64_t wake_at;
	atomic_bool watching;
	_Atomic uint64_t last_poll;	/* a CQ poller received last then */
	_Atomic uint64_t want_at;	/* the earliest tick asked for, UINT64_MAX none */
	/* The engine's next timer, 0 none: what the last tick returned.  The
	 * thread ticks, and while pollers are active they do (link_tick). */
	_Atomic uint64_t next_tick;
	pthread_mutex_t tick_lock;	/* one tick at a time, next_tick its result */
	struct sv_poll_window win;	/* the poller window (thread) */
	uint64_t linger_until;		/* the thread looks without sleeping until then */
	bool any_id;			/* SOFTVERBS_IPV4_ID=any (icrc.c) */
	/* What other processes forwarded here (the registry's count), and
	 * the count as of a poller's last read of the forwarding socket
	 * that emptied it (rx_lock). */
	const _Atomic uint32_t *forwards;
	uint32_t fwd_seen;
	/* Only this user's processes forward (the reuseport group is per
	 * user); the forwarding socket's name is open to every process of
	 * the namespace, so each datagram's sender is checked (SO_PASSCRED):
	 * its fwd_hdr names the source the peer check trusts. */
	uid_t uid;
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(struct ucred))];
	} fctl[RX_BATCH + 1];
	/* Receive buffers (rx_lock): RX_BATCH, and a spare for what a
	 * forward takes in while it waits (forward_wait). */
	uint8_t (*bufs)[RX_BUF];
	/* Set up once (rx_init): a read changes only the name and control
	 * lengths of the entries it filled, which rx_reset() restores.  The
	 * forwarding socket's entries share the buffers. */
	struct mmsghdr msgs[RX_BATCH], fmsgs[RX_BATCH];
	struct iovec iovs[RX_BATCH];
	union sa from[RX_BATCH];
	/* Room for UDP_GRO, IP_PKTINFO, IPV6_PKTINFO, TOS/TTL or traffic
	 * class, hop limit and flow information. */
	char ctl[RX_BATCH][256] __attribute__((aligned(8)));
	/* Statistics. */
	struct sv_pkt_ep_stats *st;	/* the context's, in its segment */
	/* IPv4 multicast groups the socket has joined (mc_lock). */
	pthread_mutex_t mc_lock;
	struct in_addr *groups;
	unsigned ngroups;
};

static void fwd_name(struct sockaddr_un *a, socklen_t *len, int32_t pid, uint32_t ep)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "softverbs-udp:%d:%u", (int)pid,
			 ep);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void map_v4(struct in6_addr *a, const struct in_addr *v4)
{
	memset(a, 0, sizeof(*a));
	a->s6_addr[10] = a->s6_addr[11] = 0xff;
	memcpy(&a->s6_addr[12], v4, 4);
}

/* The route a datagram came by, and (UDP_GRO) the size of the segments
 * it holds, 0 when it is one packet.  An IPv4 packet on the dual-stack
 * socket has an IPv4-mapped source and its IPv4 ancillary data (IP_TOS,
 * IP_TTL; IP_PKTINFO and IPV6_PKTINFO both name its destination); an
 * IPv6 one its IPv6 data (IPV6_PKTINFO, IPV6_TCLASS, IPV6_HOPLIMIT and
 * IPV6_FLOWINFO, the header's first word). */
static void route_of(struct sv_route *r, const union sa *from, const struct msghdr *m, int *gso)
{
	*gso = 0;
	memset(r, 0, sizeof(*r));
	if (from->sa.sa_family == AF_INET6) {
		r->src = from->in6.sin6_addr;
		r->sport = ntohs(from->in6.sin6_port);
	} else {
		map_v4(&r->src, &from->in.sin_addr);
		r->sport = ntohs(from->in.sin_port);
	}
	r->v4 = IN6_IS_ADDR_V4MAPPED(&r->src);
	if (r->v4)
		r->dst.s6_addr[10] = r->dst.s6_addr[11] = 0xff;
	r->ttl = 64;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR((struct msghdr *)m, c)) {
		int v;
		if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
			memcpy(gso, CMSG_DATA(c), sizeof(*gso));
		} else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
			struct in_pktinfo pi;
			memcpy(&pi, CMSG_DATA(c), sizeof(pi));
			map_v4(&r->dst, &pi.ipi_addr);
			r->ifindex = (uint32_t)pi.ipi_ifindex;
		} else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
			r->tclass = *(uint8_t *)CMSG_DATA(c);
		} else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL) {
			memcpy(&v, CMSG_DATA(c), sizeof(v));
			r->ttl = (uint8_t)v;
		} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
			struct in6_pktinfo pi;
			memcpy(&pi, CMSG_DATA(c), sizeof(pi));
			r->dst = pi.ipi6_addr;
			r->ifindex = pi.ipi6_ifindex;
		} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS) {
			memcpy(&v, CMSG_DATA(c), sizeof(v));
			r->tclass = (uint8_t)v;
		} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_HOPLIMIT) {
			memcpy(&v, CMSG_DATA(c), sizeof(v));
			r->ttl = (uint8_t)v;
		} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_FLOWINFO) {
			uint32_t fi;
			memcpy(&fi, CMSG_DATA(c), sizeof(fi));
			r->flow = ntohl(fi) & 0xfffff;
		}
	}
	if (r->v4)
		r->flow = 0;
}

static void flow_of(struct sv_flow *f, const struct sv_route *r, bool out)
{
	memset(f, 0, sizeof(*f));
	f->src = r->src;
	f->dst = r->dst;
	f->sport = r->sport;
	f->dport = SV_ROCE_PORT;
	f->tclass = r->tclass;
	f->ttl = r->ttl;
	f->v4 = r->v4;
	f->flow = out ? 0 : r->flow;	/* sent: the kernel picks it */
	f->ifindex = r->ifindex;
}

static int deliver(struct sv_link_ep *l, const uint8_t *buf, size_t len, const struct sv_route *r,
		   bool forwarded, uint64_t at, unsigned id_hint);

/* A datagram another context forwarded here (buf, len bytes: its
 * fwd_hdr, then the packet) goes up with the addresses it came with, if
 * a process of this user sent it (m: its SCM_CREDENTIALS).  m's control
 * length is restored for the next read. */
static void deliver_forwarded(struct sv_link_ep *l, const uint8_t *buf, size_t len, uint64_t at,
			      struct msghdr *m)
{
	struct cmsghdr *c = CMSG_FIRSTHDR(m);
	struct ucred cr = { .pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1 };
	struct fwd_hdr h;

	if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
	    c->cmsg_len >= CMSG_LEN(sizeof(cr)))
		memcpy(&cr, CMSG_DATA(c), sizeof(cr));
	m->msg_controllen = sizeof(l->fctl[0]);
	if (cr.uid != l->uid) {
		atomic_fetch_add_explicit(&l->st->drop_bad_src, 1, memory_order_relaxed);
		sv_explain("udp link", "a forwarded datagram of %zu bytes from pid %d, uid %d, "
			   "dropped: only this user's processes forward packets", len, (int)cr.pid,
			   (int)cr.uid);
		return;
	}
	if (len < sizeof(h))
		return;
	memcpy(&h, buf, sizeof(h));
	struct sv_route r = { .src = h.src, .dst = h.dst, .sport = h.sport, .tclass = h.tclass,
			      .ttl = h.ttl, .v4 = h.v4 != 0, .flow = h.flow, .ifindex = h.ifindex };
	atomic_fetch_add_explicit(&l->st->rx_fwd_in, 1, memory_order_relaxed);
	deliver(l, buf + sizeof(h), len - sizeof(h), &r, true, at, 0);
}

/* While a forward waits for room at its owner: one datagram forwarded
 * here taken in (into the spare buffer: the batch's are in use), or a
 * nap of up to FWD_NAP_NS until one comes. */
static void forward_wait(struct sv_link_ep *l)
{
	struct iovec v = { l->bufs[RX_BATCH], RX_BUF };
	struct msghdr m = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = l->fctl[RX_BATCH].b,
			    .msg_controllen = sizeof(l->fctl[RX_BATCH]) };
	ssize_t n = sv_recvmsg(l->fwd, &m, MSG_DONTWAIT);

	if (n >= 0) {
		deliver_forwarded(l, l->bufs[RX_BATCH], (size_t)n, sv_now_ns(), &m);
		return;
	}
	struct pollfd p = { l->fwd, POLLIN, 0 };
	struct timespec nap = { 0, FWD_NAP_NS };
	sv_ppoll(&p, 1, &nap);
}

/*
 * A packet for a QP of another context of this host goes to it.  A fresh
 * network namespace queues only 10 datagrams on an AF_UNIX socket
 * (net.unix.max_dgram_qlen), so a burst waits for room, up to
 * FWD_WAIT_NS, rather than being lost.  It waits taking in what is
 * forwarded here.  It was a blocking send bounded by SO_SNDTIMEO: two
 * contexts that forward to each other, each waiting on the other's full
 * queue, read nothing meanwhile, and the kernel rounds the 2 ms up to
 * whole ticks: in integration.udp_faults' atomics under load up to 24
 * forwards a run took over 0.5 ms, 8 ms often and 14.6 ms at most, each
 * with the rx lock held, so the context's reception stood still.
 */
static bool forward(struct sv_link_ep *l, const uint8_t *buf, size_t len, const struct sv_route *r)
{
	uint32_t qpn = bth_qpn((const struct ib_bth *)buf);
	struct sv_reg_ep_info ep;

	if (sv_reg_qpn_owner(qpn, &ep) || (ep.pid == sv_pid() && ep.index == l->ctx->ep)) {
		atomic_fetch_add_explicit(&l->st->rx_no_owner, 1, memory_order_relaxed);
		return false;
	}
	struct fwd_hdr h = { r->src, r->dst, r->flow, r->ifindex, r->sport, r->tclass, r->ttl,
			     r->v4, { 0 } };
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)buf, len } };
	struct sockaddr_un a;
	socklen_t al;
	fwd_name(&a, &al, ep.pid, ep.index);
	struct msghdr m = { .msg_name = &a, .msg_namelen = al, .msg_iov = iov, .msg_iovlen = 2 };
	uint64_t until = 0;
	bool sent;
	for (;;) {
		sent = sv_sendmsg(l->fwd, &m, MSG_DONTWAIT) >= 0;
		if (sent || errno != EAGAIN)
			break;
		uint64_t now = sv_now_ns();
		if (!until)
			until = now + FWD_WAIT_NS;
		else if (now >= until)
			break;
		forward_wait(l);
	}
	if (sent) {
		atomic_fetch_add_explicit(&l->st->rx_forwarded, 1, memory_order_relaxed);
		sv_reg_ep_forwarded(ep.index);
	} else {
		atomic_fetch_add_explicit(&l->st->rx_no_owner, 1, memory_order_relaxed);
	}
	return true;
}

/* One packet as received: its ICRC checked (A17.8: a bad one is dropped
 * silently), captured, then handed up or forwarded.  Returns the IPv4
 * identification its ICRC matched (id_hint tried first: its place in a
 * GSO run delivered whole, icrc.c), or -1. */
static int deliver(struct sv_link_ep *l, const uint8_t *buf, size_t len, const struct sv_route *r,
		   bool forwarded, uint64_t at, unsigned id_hint)
{
	struct sv_flow f;

	flow_of(&f, r, false);
	int id = len < sizeof(struct ib_bth) + 4 ? -1 :
		 l->any_id ? sv_icrc_check_any(&f, buf, len, id_hint) :
			      sv_icrc_check(&f, buf, len, id_hint);
	if (sv_pcap_on()) {
		struct iovec v = { (void *)buf, len };
		f.ipid = id > 0 ? (uint16_t)id : 0;	/* the frame its ICRC was made for */
		sv_pcap_write(&f, &v, 1, len);
	}
	if (id < 0) {
		atomic_fetch_add_explicit(&l->st->rx_bad_icrc, 1, memory_order_relaxed);
		return -1;
	}
	atomic_fetch_add_explicit(&l->st->rx_pkts, 1, memory_order_relaxed);
	if (!forwarded && !sv_pkt_owns(l->ctx, bth_qpn((const struct ib_bth *)buf)) &&
	    forward(l, buf, len, r))
		return id;
	struct sv_link_pkt p = { buf, len - 4, *r, at };
	sv_pkt_rx(l->ctx, &p);
	return id;
}

/* Receives what is waiting, up to a few batches; the caller holds the
 * context's rx lock and read the clock (now) just before.  Returns the
 * number of packets.  A CQ poller (poller true) reads the forwarding
 * socket only when the registry's count of packets forwarded here moved
 * since its last read that emptied it: packets reach that
 * socket only on a host with several contexts, and an empty poll's
 * second system call made every poll the longer, which on a virtual
 * machine whose system calls are dear is the delay until the poller
 * sees a packet.  The thread, woken by either socket, reads both.
 *
 * A batch's packets carry the time its read began (sv_link_pkt.at): each
 * was in the socket by the time the read returned, so that is when it
 * arrived, within the read, as a NIC would stamp it; later batches read
 * the clock again. */

static void rx_reset(struct sv_link_ep *l, int i)
{
	l->msgs[i].msg_hdr.msg_namelen = sizeof(l->from[i]);
	l->msgs[i].msg_hdr.msg_controllen = sizeof(l->ctl[i]);
}

static void rx_init(struct sv_link_ep *l)
{
	for (int i = 0; i < RX_BATCH; i++) {
		l->iovs[i] = (struct iovec){ l->bufs[i], RX_BUF };
		l->msgs[i].msg_hdr = (struct msghdr){ .msg_name = &l->from[i], .msg_iov = &l->iovs[i],
						      .msg_iovlen = 1, .msg_control = l->ctl[i] };
		rx_reset(l, i);
		l->fmsgs[i].msg_hdr = (struct msghdr){ .msg_iov = &l->iovs[i], .msg_iovlen = 1,
						       .msg_control = l->fctl[i].b,
						       .msg_controllen = sizeof(l->fctl[i]) };
	}
}

static int receive(struct sv_link_ep *l, bool poller, uint64_t now)
{
	int total = 0;

	for (int round = 0; round < 4; round++) {
		if (round)
			now = sv_now_ns();
		int n = sv_recvmmsg(l->sock, l->msgs, RX_BATCH, MSG_DONTWAIT);
		for (int i = 0; i < n; i++) {
			struct sv_route r;
			int gso;
			route_of(&r, &l->from[i], &l->msgs[i].msg_hdr, &gso);
			size_t len = l->msgs[i].msg_len, seg = gso > 0 ? (size_t)gso : len, off = 0;
			unsigned id = 0;	/* the next packet's identification, likely */
			do {	/* an empty datagram too: it is counted as malformed */
				int got = deliver(l, l->bufs[i] + off, len - off < seg ? len - off : seg,
						  &r, false, now, id);
				id = got >= 0 ? (unsigned)got + 1 : id + 1;
				off += seg;
			} while (off < len);
			rx_reset(l, i);
		}
		/* The load pairs with the forwarder's release add, made
		 * after its send: a count seen moved finds the packet.  A
		 * read that filled its batch may have left some: the count
		 * stays unseen. */
		bool counted = poller && l->forwards;
		uint32_t f = counted ? atomic_load_explicit(l->forwards, memory_order_acquire) : 0;
		int m = -1;
		if (!counted || f != l->fwd_seen) {
			m = sv_recvmmsg(l->fwd, l->fmsgs, RX_BATCH, MSG_DONTWAIT);
			if (counted && m < RX_BATCH)
				l->fwd_seen = f;
		}
		for (int i = 0; i < m; i++)
			deliver_forwarded(l, l->bufs[i], l->fmsgs[i].msg_len, now,
					  &l->fmsgs[i].msg_hdr);
		n = n > 0 ? n : 0;
		m = m > 0 ? m : 0;
		total += n + m;
		if (n < RX_BATCH && m < RX_BATCH)
			break;
	}
	return total;
}

/*
 * The engine is ticked only when something is due: its next timer, a
 * time want_tick() asked for, or the end of a poller window.  A tick
 * takes rx_lock, which a poller holds through each of its reads, so a
 * tick on every look (each RC send asks for one: its retransmission
 * timer) made the poller and the thread wait for each other.
 *
 * While pollers are active, the timers are theirs: a poll that finds one
 * due ticks (link_poll), and the thread wakes only to look whether the
 * polls go on.  When the thread ticked for them, each of its ticks woke
 * it on the poller's core and, as often as not, found rx_lock held by a
 * read: a futex wait, and a futex wake in the poller's next unlock.  A
 * one-sided stream's sender (ib_write_bw, 1 MiB) and each side of
 * ib_send_lat met this some 1,500 times a second (docs/performance.md).
 * A timer of a poller that stops waits for the look that finds the
 * window closed, two windows (2 ms) at most, as a held ACK does
 * (window.h).  Packets that fault injection held back are the polls' too
 * (link_poll).
 */
static uint64_t earliest(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/* The engine is ticked by when (the thread's loop reads want_at before it
 * sleeps, a poll reads it after its read). */
static void ask_tick(struct sv_link_ep *l, uint64_t when)
{
	uint64_t cur = atomic_load(&l->want_at);

	while (when < cur && !atomic_compare_exchange_weak(&l->want_at, &cur, when))
		;
}

/* When the engine's timers want a tick, UINT64_MAX never. */
static uint64_t tick_due(struct sv_link_ep *l)
{
	uint64_t t = atomic_load(&l->next_tick);

	return earliest(t ? t : UINT64_MAX, atomic_load(&l->want_at));
}

/* A tick; the caller holds tick_lock, so that next_tick is the result of
 * the latest one.  What is asked for from here on stays asked: the
 * engine's state behind earlier asks is in place, and the tick's scan
 * sees it. */
static void link_tick(struct sv_link_ep *l, uint64_t now)
{
	atomic_store(&l->want_at, UINT64_MAX);
	atomic_store(&l->next_tick, sv_pkt_tick(l->ctx, now));
}

static void *rx_thread(void *arg)
{
	struct sv_link_ep *l = arg;

	sv_thread_prompt();
	while (!atomic_load(&l->stop)) {
		uint64_t now = sv_now_ns();
		uint64_t lp = atomic_load(&l->last_poll);
		bool closed;
		bool pollers = sv_window_look(&l->win, lp, now, &closed);
		if (closed || (!pollers && tick_due(l) <= now)) {
			pthread_mutex_lock(&l->tick_lock);
			sv_window_ticked(&l->win, lp);
			link_tick(l, now);
			pthread_mutex_unlock(&l->tick_lock);
			continue;
		}
		uint64_t due = pollers ? now + l->win.len : tick_due(l);
		uint64_t held = sv_wire_flush(now);
		if (held)
			due = earliest(due, held);
		bool linger = !pollers && now < l->linger_until;
		if (linger)
			due = now;
		atomic_store(&l->wake_at, due);
		atomic_store(&l->watching, !pollers);
		if (!pollers && (atomic_load(&l->want_at) < due ||
				 sv_window_open(&l->win, atomic_load(&l->last_poll), now)))
			continue;	/* asked for, or polled, meanwhile */
		struct timespec ts, *tp = NULL;
		if (due != UINT64_MAX) {
			uint64_t d = due <= now ? 0 : due - now;
			ts = (struct timespec){ (time_t)(d / 1000000000u), (long)(d % 1000000000u) };
			tp = &ts;
		}
		struct pollfd p[3] = {
			{ l->efd, POLLIN, 0 }, { l->sock, POLLIN, 0 }, { l->fwd, POLLIN, 0 },
		};
		int np = pollers ? 1 : 3;
		int k = ppoll(p, (nfds_t)np, tp, NULL);
		if (k < 0 && errno != EINTR)
			break;
		if (!k && pollers)	/* a quiet look while they poll */
			sv_window_quiet(&l->win);
		if (p[0].revents) {
			uint64_t v;
			if (read(l->efd, &v, sizeof(v)) < 0) {
				/* nothing: the count was already taken */
			}
		}
		if (atomic_load(&l->stop))
			break;
		if ((np > 1 && (p[1].revents || p[2].revents)) && sv_pkt_rx_lock(l->ctx, true)) {
			uint64_t t = sv_now_ns();
			if (receive(l, false, t) > 0)
				l->linger_until = sv_now_ns() + LINGER_NS;
			if (sv_window_recent(atomic_load(&l->last_poll), t)) {
				/* For a polling application: its ACKs wait
				 * for its next post (window.h). */
				if (sv_pkt_rx_unlock_poller(l->ctx))
					ask_tick(l, t + HELD_ACK_NS);
			} else {
				sv_pkt_rx_unlock(l->ctx);
			}
		} else if (linger) {
			sched_yield();
		}
	}
	return NULL;
}

static int sock_bufs(int fd)
{
	int sz = SOCK_BUF;

	/* FORCE goes past net.core.[rw]mem_max where the process may
	 * (CAP_NET_ADMIN); otherwise the kernel caps the plain request. */
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz)))
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)))
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	return 0;
}

static struct sv_link_ep *link_open(struct sv_context *c, char *why, size_t len)
{
	struct sv_link_ep *l = calloc(1, sizeof(*l));
	int one = 1;

	if (!l || !(l->bufs = calloc(RX_BATCH + 1, RX_BUF))) {
		free(l);
		snprintf(why, len, "out of memory");
		return NULL;
	}
	l->ctx = c;
	rx_init(l);
	l->st = sv_pkt_ep_stats(c);
	l->st->port = SV_ROCE_PORT;
	l->sock = l->fwd = l->efd = -1;
	l->sock = link_socket(SOCK_NONBLOCK);
	/* [::]:4791 takes IPv4 packets too (V6ONLY off); the IPv4 options
	 * give their ancillary data, the IPv6 ones that of IPv6 packets. */
	union sa any = { .in6 = { .sin6_family = AF_INET6, .sin6_port = htons(SV_ROCE_PORT) } };
	socklen_t anylen = sizeof(any.in6);
	if (family() == AF_INET) {
		any.in = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = htons(SV_ROCE_PORT) };
		anylen = sizeof(any.in);
	}
	if (l->sock < 0 || setsockopt(l->sock, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) ||
	    setsockopt(l->sock, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one)) ||
	    setsockopt(l->sock, IPPROTO_IP, IP_RECVTOS, &one, sizeof(one)) ||
	    setsockopt(l->sock, IPPROTO_IP, IP_RECVTTL, &one, sizeof(one)) ||
	    (family() == AF_INET6 &&
	     (setsockopt(l->sock, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof(one)) ||
	      setsockopt(l->sock, IPPROTO_IPV6, IPV6_RECVTCLASS, &one, sizeof(one)) ||
	      setsockopt(l->sock, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &one, sizeof(one)) ||
	      setsockopt(l->sock, IPPROTO_IPV6, IPV6_FLOWINFO, &one, sizeof(one)))) ||
	    bind(l->sock, &any.sa, anylen)) {
		int e = errno;
		snprintf(why, len, "cannot listen on UDP port %d: %s%s", SV_ROCE_PORT, strerror(e),
			 e == EADDRINUSE ? " (another user's softverbs, or another RoCEv2 stack such as "
			 "the kernel's rxe, holds it on this host; softverbs takes RoCEv2 packets for "
			 "one user per host)" : "");
		goto fail;
	}
	sock_bufs(l->sock);
	/* Multicast packets only for the groups this socket joined (the
	 * default, 1, is every group any socket of the host joined). */
	int zero = 0;
	setsockopt(l->sock, IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof(zero));
	pthread_mutex_init(&l->mc_lock, NULL);
	pthread_mutex_init(&l->tick_lock, NULL);
	l->any_id = sv_config()->ipv4_id == SV_IPV4_ID_ANY;
	/* Segments of one sender's burst come up in one read (UDP GRO);
	 * without it, one packet a read. */
	setsockopt(l->sock, SOL_UDP, UDP_GRO, &one, sizeof(one));
	struct sockaddr_un a;
	socklen_t al;
	fwd_name(&a, &al, sv_pid(), c->ep);
	/* Reads and sends never block (MSG_DONTWAIT; forward() waits its
	 * own way). */
	l->fwd = sv_socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (l->fwd < 0 || bind(l->fwd, (struct sockaddr *)&a, al) ||
	    setsockopt(l->fwd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one))) {
		snprintf(why, len, "cannot bind the forwarding socket: %s", strerror(errno));
		goto fail;
	}
	l->uid = getuid();	/* SCM_CREDENTIALS carry the real uid, as the registry keys */
	sock_bufs(l->fwd);
	l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (l->efd < 0) {
		snprintf(why, len, "eventfd: %s", strerror(errno));
		goto fail;
	}
	atomic_store(&l->wake_at, UINT64_MAX);
	atomic_store(&l->want_at, UINT64_MAX);
	sv_window_init(&l->win);
	l->forwards = sv_reg_ep_forwards(c->ep);
	int err = pthread_create(&l->thr, NULL, rx_thread, l);
	if (err) {
		snprintf(why, len, "cannot start the receive thread: %s", strerror(err));
		goto fail;
	}
	return l;
fail:
	if (l->sock >= 0)
		close(l->sock);
	if (l->fwd >= 0)
		close(l->fwd);
	if (l->efd >= 0)
		close(l->efd);
	free(l->bufs);
	free(l);
	return NULL;
}

static void kick(struct sv_link_ep *l)
{
	uint64_t one = 1;

	if (sv_write(l->efd, &one, sizeof(one)) < 0) {
		/* the counter is full: the thread is being woken anyway */
	}
}

static void link_close(struct sv_link_ep *l)
{
	sv_dbg("udp link: %llu packets in, %llu bad ICRC, %llu forwarded out, %llu forwarded in, "
	       "%llu without owner", (unsigned long long)l->st->rx_pkts,
	       (unsigned long long)l->st->rx_bad_icrc, (unsigned long long)l->st->rx_forwarded,
	       (unsigned long long)l->st->rx_fwd_in, (unsigned long long)l->st->rx_no_owner);
	atomic_store(&l->stop, true);
	kick(l);
	pthread_join(l->thr, NULL);
	/* What the thread held for a post (window.h) leaves before the
	 * sockets close: a tombstone's last answers among it. */
	if (sv_pkt_rx_lock(l->ctx, true))
		sv_pkt_rx_unlock(l->ctx);
	close(l->sock);	/* and with it every membership */
	close(l->fwd);
	close(l->efd);
	pthread_mutex_destroy(&l->mc_lock);
	pthread_mutex_destroy(&l->tick_lock);
	free(l->groups);
	free(l->bufs);
	free(l);
}

/*
 * A group is joined on every multicast-capable IPv4 interface but
 * loopback: which one a member's peers are behind is not known here,
 * as a RoCE NIC's port is one interface and the fabric floods.  The
 * membership is the socket's, so it goes when the context closes.
 */
static int link_mcast(struct sv_link_ep *l, const union ibv_gid *mgid, bool join, char *why,
		      size_t len)
{
	struct in_addr g;
	unsigned i;
	int err = 0;

	memcpy(&g, &mgid->raw[12], 4);
	pthread_mutex_lock(&l->mc_lock);
	for (i = 0; i < l->ngroups && l->groups[i].s_addr != g.s_addr; i++)
		;
	if ((i < l->ngroups) == join) {
		pthread_mutex_unlock(&l->mc_lock);
		return 0;
	}
	if (join) {
		struct in_addr *ng = realloc(l->groups, (l->ngroups + 1) * sizeof(*ng));
		if (!ng) {
			pthread_mutex_unlock(&l->mc_lock);
			snprintf(why, len, "out of memory");
			return ENOMEM;
		}
		l->groups = ng;
		l->groups[l->ngroups++] = g;
	} else {
		l->groups[i] = l->groups[--l->ngroups];
	}
	struct ifaddrs *ifa = NULL;
	int joined = 0;
	if (getifaddrs(&ifa)) {
		err = errno;
		snprintf(why, len, "getifaddrs: %s", strerror(err));
	}
	for (struct ifaddrs *a = ifa; a; a = a->ifa_next) {
		if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET ||
		    (a->ifa_flags & IFF_LOOPBACK) || !(a->ifa_flags & IFF_MULTICAST) ||
		    !(a->ifa_flags & IFF_UP))
			continue;
		struct ip_mreqn m = { .imr_multiaddr = g, .imr_ifindex = (int)if_nametoindex(a->ifa_name) };
		if (!setsockopt(l->sock, IPPROTO_IP, join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP,
				&m, sizeof(m)) || errno == EADDRINUSE)
			joined++;
		else if (!err && join)
			snprintf(why, len, "cannot join %s on %s: %s", inet_ntoa(g), a->ifa_name,
				 strerror(err = errno));
	}
	freeifaddrs(ifa);
	if (join && !joined) {
		if (!err) {
			snprintf(why, len, "the host has no multicast-capable IPv4 interface but "
				 "loopback");
			err = ENODEV;
		}
		l->ngroups--;	/* not joined: a later attach tries again */
	}
	pthread_mutex_unlock(&l->mc_lock);
	return join && !joined ? err : 0;
}

static int link_sock(struct sv_link_ep *l, uint16_t *port, char *why, size_t len)
{
	int fd = link_socket(0);
	int df = IP_PMTUDISC_DO, df6 = IPV6_PMTUDISC_DO, zero = 0;
	union sa a = { .in6 = { .sin6_family = AF_INET6 } };
	socklen_t sl = sizeof(a.in6);

	(void)l;
	if (family() == AF_INET) {
		a.in = (struct sockaddr_in){ .sin_family = AF_INET };
		sl = sizeof(a.in);
	}
	/* DF on an unconnected socket: the kernel gives the IPv4 header
	 * identification 0, which the ICRC covers (A17.8).  IPv6 is never
	 * fragmented on the way; IPV6_PMTUDISC_DO keeps this host from
	 * fragmenting it either (EMSGSIZE instead, as for IPv4). */
	if (fd < 0 || setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &df, sizeof(df)) ||
	    (family() == AF_INET6 &&
	     setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &df6, sizeof(df6))) ||
	    bind(fd, &a.sa, sl) || getsockname(fd, &a.sa, &sl)) {
		snprintf(why, len, "cannot open a UDP socket: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	sock_bufs(fd);
	/* A UD QP's multicast packet is for other hosts: this host's members
	 * have had theirs from the registry (engine/req.c). */
	setsockopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, &zero, sizeof(zero));
	*port = ntohs(a.sa.sa_family == AF_INET6 ? a.in6.sin6_port : a.in.sin_port);
	return fd;
}

static void link_sock_close(struct sv_link_ep *l, int fd)
{
	(void)l;
	sv_wire_forget(fd);
	close(fd);
}

/*
 * Packets leave in batches: link_send() queues them per thread and
 * link_flush() hands the batch to one sendmmsg(2), so that a window of
 * packets costs one system call and wakes the receiver once, not once a
 * packet.  Headers, pad and ICRC are copied into the batch; payloads are
 * referenced, so the engine flushes before it lets go of their memory.
 * With faults or capture on, every packet goes through sv_wire_send().
 * Each packet carries its source address, traffic class and TTL or hop
 * limit as ancillary data (sv_flow_cmsg), as a NIC takes them from the
 * address vector: the ICRC covers the source, and a UD receiver's GRH
 * shows the rest.
 */
#define TX_BATCH	64
#define TX_HDR		64
struct tx_batch {
	int fd, n;
	struct mmsghdr m[TX_BATCH];
	struct iovec iov[TX_BATCH][SV_MAX_SGE + 4];
	uint8_t hdr[TX_BATCH][TX_HDR];
	uint32_t icrc[TX_BATCH];	/* for IPv4 identification 0 */
	bool v4[TX_BATCH];
	uint32_t gicrc[TX_BATCH];	/* for its place in a GSO run (link_flush) */
	union sa to[TX_BATCH];
	char ctl[TX_BATCH][SV_FLOW_CMSG_SPACE] __attribute__((aligned(8)));
	/* What flush hands the kernel: single packets and GSO runs. */
	struct mmsghdr out[TX_BATCH];
	struct iovec giov[TX_BATCH * (SV_MAX_SGE + 4)];
	char gctl[TX_BATCH][SV_FLOW_CMSG_SPACE + CMSG_SPACE(sizeof(uint16_t))]
		__attribute__((aligned(8)));
	/* The last route sent on and what link_send made of it: a QP's
	 * packets, and the ACKs that leave with its replies, share one, so
	 * most packets skip building the flow, address and ancillary data
	 * again (memcmp: a route differing only in padding is a miss,
	 * never a wrong hit). */
	bool have_last;
	struct sv_route last;
	struct sv_flow lflow;
	union sa lto;
	socklen_t ltolen;
	size_t lcl;
	char lctl[SV_FLOW_CMSG_SPACE] __attribute__((aligned(8)));
};
static __thread struct tx_batch *txb;
static pthread_key_t txb_key;
static pthread_once_t txb_once = PTHREAD_ONCE_INIT;

static void txb_init(void)
{
	pthread_key_create(&txb_key, free);
}

/* UDP GSO (UDP_SEGMENT): a run of packets of one size to one place
 * leaves as one datagram the kernel cuts into packets; each packet is
 * a whole RoCEv2 packet, headers and ICRC included.  64 KiB at most. */
#define GSO_MAX_BYTES	(65535 - 8 - 40)
#define GSO_MAX_SEGS	64
_Static_assert(GSO_MAX_SEGS <= SV_ICRC_IDS, "a run's identifications are ones receivers accept");
static atomic_bool gso_off;

static size_t batch_len(const struct tx_batch *b, int i)
{
	size_t n = 0;

	for (size_t k = 0; k < b->m[i].msg_hdr.msg_iovlen; k++)
		n += b->iov[i][k].iov_len;
	return n;
}

/* Whether m is a GSO run (its control messages end in UDP_SEGMENT). */
static bool gso_run(const struct tx_batch *b, const struct mmsghdr *m)
{
	const char *c = m->msg_hdr.msg_control;

	return c >= b->gctl[0] && c < b->gctl[TX_BATCH];
}

static void send_msgs(const struct tx_batch *b, struct mmsghdr *m, int n)
{
	for (int i = 0; i < n;) {
		int k = sv_sendmmsg(b->fd, m + i, (unsigned)(n - i), 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && (errno == EIO || errno == EINVAL) && gso_run(b, &m[i])) {
			/* No GSO on this path: the packets of this run go one by
			 * one, and so does everything from now on. */
			atomic_store(&gso_off, true);
			return;
		}
		if (k <= 0)
			break;	/* lost, as on a congested link: the requester retries */
		i += k;
	}
}

static void link_flush(struct sv_link_ep *l)
{
	struct tx_batch *b = txb;

	(void)l;
	if (!b || !b->n)
		return;
	if (atomic_load_explicit(&gso_off, memory_order_relaxed)) {
		send_msgs(b, b->m, b->n);
		b->n = 0;
		return;
	}
	int out = 0, gi = 0;
	for (int i = 0; i < b->n;) {
		size_t seg = batch_len(b, i), total = seg;
		int j = i + 1;
		const struct msghdr *hi = &b->m[i].msg_hdr;
		while (j < b->n && j - i < GSO_MAX_SEGS && total + seg <= GSO_MAX_BYTES &&
		       !memcmp(&b->to[j], &b->to[i], sizeof(b->to[i])) &&
		       b->m[j].msg_hdr.msg_controllen == hi->msg_controllen &&
		       !memcmp(b->ctl[j], b->ctl[i], hi->msg_controllen)) {
			size_t lj = batch_len(b, j);
			if (lj > seg)
				break;
			total += lj;
			j++;
			if (lj < seg)
				break;	/* a shorter packet ends a run */
		}
		struct mmsghdr *m = &b->out[out++];
		if (j - i == 1) {
			*m = b->m[i];
			i = j;
			continue;
		}
		/* One datagram of packets i..j-1. */
		struct iovec *v = &b->giov[gi];
		size_t nv = 0;
		for (int k = i; k < j; k++) {
			for (size_t x = 0; x < b->m[k].msg_hdr.msg_iovlen; x++)
				v[nv++] = b->iov[k][x];
			/* Cut from the run, the packet leaves with IPv4
			 * identification k - i, which its ICRC covers (icrc.c);
			 * its ICRC is the last piece. */
			if (k > i && b->v4[k]) {
				size_t plen = batch_len(b, k) - 4;
				b->gicrc[k] = htole32(le32toh(b->icrc[k]) ^
						      sv_icrc_id(plen, (unsigned)(k - i)));
				v[nv - 1] = (struct iovec){ &b->gicrc[k], 4 };
			}
		}
		gi += (int)nv;
		/* The run's packets' own control messages, then UDP_SEGMENT. */
		char *ctl = b->gctl[out - 1];
		memcpy(ctl, b->ctl[i], hi->msg_controllen);
		m->msg_hdr = (struct msghdr){ .msg_name = hi->msg_name, .msg_namelen = hi->msg_namelen,
					      .msg_iov = v, .msg_iovlen = nv, .msg_control = ctl,
					      .msg_controllen = hi->msg_controllen +
								CMSG_SPACE(sizeof(uint16_t)) };
		struct cmsghdr *c = (struct cmsghdr *)(ctl + hi->msg_controllen);
		c->cmsg_level = SOL_UDP;
		c->cmsg_type = UDP_SEGMENT;
		c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
		uint16_t gs = (uint16_t)seg;
		memcpy(CMSG_DATA(c), &gs, sizeof(gs));
		i = j;
	}
	send_msgs(b, b->out, out);
	if (atomic_load_explicit(&gso_off, memory_order_relaxed))
		send_msgs(b, b->m, b->n);	/* the run that found GSO missing, and all */
	b->n = 0;
}

static struct tx_batch *tx_batch(void)
{
	pthread_once(&txb_once, txb_init);
	struct tx_batch *b = txb;
	if (!b) {
		b = txb = calloc(1, sizeof(*b));
		if (b)
			pthread_setspecific(txb_key, b);
	}
	return b;
}

static void link_want_tick(struct sv_link_ep *l, uint64_t when);

static int link_send(struct sv_link_ep *l, int fd, const struct sv_route *r, const struct iovec *pkt,
		     int n, size_t len)
{
	struct tx_batch *b = tx_batch();

	if (!b)
		return ENOMEM;
	if (n + 1 > SV_MAX_SGE + 4 || pkt[0].iov_len > TX_HDR)
		return EINVAL;
	if (!b->have_last || memcmp(&b->last, r, sizeof(*r))) {
		flow_of(&b->lflow, r, true);
		b->ltolen = dest_of(r, &b->lto);
		b->lcl = b->ltolen ? sv_flow_cmsg(&b->lflow, b->lto.sa.sa_family, b->lctl,
						  sizeof(b->lctl)) : 0;
		b->last = *r;
		b->have_last = true;
	}
	const struct sv_flow *f = &b->lflow;
	uint32_t icrc = htole32(sv_icrc(f, pkt, n, len));	/* little-endian on the wire (icrc.c) */
	socklen_t tolen = b->ltolen;
	if (!tolen)
		return EAFNOSUPPORT;	/* IPv6, on a kernel without it */
	if (r->v4 && IN_MULTICAST(((uint32_t)r->dst.s6_addr[12] << 24) | r->dst.s6_addr[13] << 16 |
				  r->dst.s6_addr[14] << 8 | r->dst.s6_addr[15])) {
		/* A group has no route: it leaves by the interface of the
		 * source GID's address, as a RoCE NIC sends by its port. */
		struct in_addr src;
		int ttl = r->ttl;
		memcpy(&src, &r->src.s6_addr[12], 4);
		link_flush(l);
		if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &src, sizeof(src)) ||
		    setsockopt(fd, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof(ttl)))
			return errno;
	}
	if (sv_fault_config()->on || sv_pcap_on()) {
		struct iovec iov[SV_MAX_SGE + 4];
		memcpy(iov, pkt, (size_t)n * sizeof(*pkt));
		iov[n] = (struct iovec){ &icrc, 4 };
		uint64_t due;
		int err = sv_wire_send(fd, &b->lto.sa, tolen, f, l->ctx->ep, iov, n + 1, len + 4,
				       &due);
		/* A packet held back (reorder, delay) leaves with the next one
		 * or, at its due time, by sv_wire_flush(): the thread's, which
		 * must look then, though nothing else may wake it, or while
		 * pollers are active theirs (link_poll). */
		if (due)
			link_want_tick(l, due);
		return err;
	}
	if (b->n && (b->fd != fd || b->n == TX_BATCH))
		link_flush(l);
	int i = b->n++;
	b->fd = fd;
	memcpy(b->hdr[i], pkt[0].iov_base, pkt[0].iov_len);
	b->iov[i][0] = (struct iovec){ b->hdr[i], pkt[0].iov_len };
	memcpy(&b->iov[i][1], &pkt[1], (size_t)(n - 1) * sizeof(*pkt));
	b->icrc[i] = icrc;
	b->v4[i] = f->v4;
	b->iov[i][n] = (struct iovec){ &b->icrc[i], 4 };
	b->to[i] = b->lto;
	size_t cl = b->lcl;
	memcpy(b->ctl[i], b->lctl, cl);
	b->m[i].msg_hdr = (struct msghdr){ .msg_name = &b->to[i], .msg_namelen = tolen,
					   .msg_iov = b->iov[i], .msg_iovlen = (size_t)n + 1,
					   .msg_control = cl ? b->ctl[i] : NULL, .msg_controllen = cl };
	return 0;
}

/*
 * The first poll after a quiet spell wakes the thread, which watches the
 * sockets then, so that it opens a window and ticks as it closes: what
 * the poller leaves held is sent by then.  A poll of an armed CQ
 * (ibv_req_notify_cq) receives but opens no window and holds nothing
 * back: its application is about to wait for the CQ's event, which the
 * thread's reception is to bring.
 */
static bool link_poll(struct sv_link_ep *l, bool armed)
{
	uint64_t now = sv_now_ns();

	if (!armed) {
		atomic_store(&l->last_poll, now);
		if (atomic_load(&l->watching) && atomic_exchange(&l->watching, false))
			kick(l);
	}
	if (!sv_pkt_rx_lock(l->ctx, false))
		return false;
	int n = receive(l, true, now);
	if (armed) {
		sv_pkt_rx_unlock(l->ctx);
		return n > 0;
	}
	sv_pkt_rx_unlock_poller(l->ctx);
	/* The timers are the pollers' while they poll (rx_thread), and so
	 * are the packets fault injection holds back: the thread is not
	 * kicked for them then (link_want_tick). */
	if (tick_due(l) <= now && !pthread_mutex_trylock(&l->tick_lock)) {
		link_tick(l, sv_now_ns());
		pthread_mutex_unlock(&l->tick_lock);
	}
	sv_wire_flush(now);
	return n > 0;
}

/*
 * Packets the kernel gave this endpoint for another context of the host
 * would die with its socket: among them, on a host whose processes talk
 * to each other by packets, the ACK of a message this process received
 * last, which the sender cannot get again once this process is gone.
 */
static void link_drain(struct sv_link_ep *l)
{
	sv_pkt_rx_lock(l->ctx, true);
	receive(l, false, sv_now_ns());
	sv_pkt_rx_unlock(l->ctx);
}

/* A thread that sleeps while pollers are active is not woken: their
 * polls, or its look as the polls stop, tick (rx_thread). */
static void link_want_tick(struct sv_link_ep *l, uint64_t when)
{
	ask_tick(l, when);
	if (when < atomic_load(&l->wake_at) && atomic_load(&l->watching))
		kick(l);
}

/* The datagram link_send would send for pkt, whole, for a sender other
 * than this process (core/guard.h): its ICRC, destination and ancillary
 * data computed now. */
static int link_frame(struct sv_link_ep *l, const struct sv_route *r, const struct iovec *pkt, int n,
		      size_t len, struct sv_frame *out)
{
	struct sv_flow f;
	union sa to;

	(void)l;
	if (len + 4 > sizeof(out->pkt))
		return EMSGSIZE;
	memset(out, 0, sizeof(*out));
	flow_of(&f, r, true);
	uint32_t icrc = htole32(sv_icrc(&f, pkt, n, len));	/* little-endian on the wire */
	size_t off = 0;
	for (int i = 0; i < n && off < len; i++) {
		size_t k = pkt[i].iov_len < len - off ? pkt[i].iov_len : len - off;
		memcpy(out->pkt + off, pkt[i].iov_base, k);
		off += k;
	}
	memcpy(out->pkt + off, &icrc, 4);
	out->len = (uint32_t)(off + 4);
	out->tolen = dest_of(r, &to);
	if (!out->tolen)
		return EAFNOSUPPORT;
	memcpy(&out->to, &to, out->tolen);
	out->ctllen = (uint32_t)sv_flow_cmsg(&f, to.sa.sa_family, out->ctl, sizeof(out->ctl));
	return 0;
}

const struct sv_transport_ops sv_transport_udp = {
	.name = "udp",
	SV_TP_NO_MEMORY,
	.open = link_open,
	.close = link_close,
	.sock = link_sock,
	.sock_close = link_sock_close,
	.send = link_send,
	.frame = link_frame,
	.flush = link_flush,
	.poll = link_poll,
	.drain = link_drain,
	.want_tick = link_want_tick,
	.mcast = link_mcast,
};
