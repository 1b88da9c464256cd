/* SPDX-License-Identifier: MIT */
/*
 * Datagram rsockets (SOCK_DGRAM): UDP's semantics over a UD QP, as
 * librdmacm's rsocket API gives them.  rsocket.c hands every call on a
 * datagram rsocket to this file.
 *
 * Each datagram rsocket is a kernel UDP socket and a UD QP of its own.
 *
 * - The kernel socket owns the address: rbind(), the ephemeral port,
 *   EADDRINUSE, rgetsockname() are the kernel's, so a datagram rsocket
 *   and a UDP socket can never hold the same port, and its fd is the
 *   rsocket's number (a small integer the kernel hands out once).
 * - Data goes by the UD QP: one datagram is one UD SEND, so message
 *   boundaries are the QP's, and a datagram is lost where a UD message is
 *   (no receive WQE posted, a QPN or Q_Key nobody has), never waited for.
 *   The same QP reaches a peer on this host by shm and one on another host
 *   by RoCEv2 packets.  Each datagram starts with a 12-byte header (24 for
 *   IPv6: struct ds_hdr): the sender's address and port, which UD does
 *   not carry (in IB mode the GRH has no IP address, or there is none),
 *   and its Q_Key, so the receiver can answer by UD at once.
 * - Where a destination's QP is not known yet, the datagram goes by the
 *   kernel socket to the destination's address and port, behind a 32-byte
 *   header (struct ds_udp_hdr) with the sender's QPN, Q_Key, LID and GID,
 *   and asks the receiver for its own; the receiver answers with a
 *   header alone.  From then on both sides send by UD, and each UD
 *   datagram received confirms its sender's QP (ibv_create_ah_from_wc).
 *   A QP not confirmed for 1 s is asked for again (a peer may have
 *   closed and another socket taken its port), by a header alone while
 *   the data keeps going by UD.  A destination that cannot be reached by
 *   RDMA (IB mode across hosts, IPv6 across hosts) keeps using the
 *   kernel socket, with the same header and limits.
 *
 * Why: rdma-core's datagram rsockets also hold a UDP socket for the
 * address and resolve destinations through it, with a service thread per
 * process.  Here nothing runs behind the application's back: the kernel
 * socket is read, and questions answered, in the application's own calls
 * (rrecv*, rpoll, and rsend* while an answer is due), as stream rsockets
 * progress their CM events.  Rejected: SIDR through rdma_cm for every
 * destination (a SIDR_REQ needs the receiver to accept it, so the first
 * datagram would wait for the receiver's process, and a destination nobody
 * has would wait for the CM's timeout); and a table of ports in the host
 * registry (it would not reach other hosts, and a port would be the
 * registry's and not the kernel's).  The Q_Key is random per socket, so a
 * stale QPN that another socket reuses drops what was meant for the old
 * one (C10-15) rather than delivering it.
 *
 * Limits.  A datagram is one UD message, and a UD message is one packet
 * (IBA 9.8.2): at most the port's active MTU (the SOFTVERBS_MTU setting,
 * 4096 by default; in RoCE mode no more than the smallest interface of the
 * namespace allows, so 1024 on a 1500-byte veth), less the header: 4084
 * bytes for IPv4 with a 4096 MTU, 1012 over a 1500-byte link.  Larger
 * sends get EMSGSIZE whichever way the datagram would go, as UDP's limit
 * does not depend on the route either.  Not built: fragmentation
 * above the MTU, broadcast and multicast destinations (EOPNOTSUPP),
 * control messages, and fork.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <rdma/rsocket.h>

#include "../core/rawsock.h"
#include "cm.h"

enum {
	DS_VERSION = 1,
	DS_GRH = 40,			/* the GRH before every UD message received (IBA 8.3) */
	DS_MAX_MTU = 4096,		/* the largest IB MTU: any peer's message fits a slot */
	DS_RSLOT = DS_GRH + DS_MAX_MTU,
	DS_SSLOT = DS_MAX_MTU,
	DS_DESTS = 256,			/* destinations remembered per socket */
	DS_Q_MIN = 64, DS_Q_MAX = 2048,	/* send and receive queue depths */
	DS_BUF_DEFAULT = 212992,	/* Linux's rmem_default and wmem_default */
	DS_RQ_PER = 512,		/* SO_RCVBUF bytes per receive slot */
	DS_SQ_PER = 4096,		/* SO_SNDBUF bytes per send slot */
	DS_HDR_V4 = 12, DS_HDR_V6 = 24,
	DS_MAX_FD = 65536,
};
#define DS_UDP_MAGIC	0x53564447u		/* "SVDG" */
#define DS_WR_SEND	(1ull << 32)		/* in a send's wr_id; a receive's is its slot */
#define DS_STALE_NS	1000000000ull		/* a QP unconfirmed this long is asked again */
#define DS_ASK_NS	10000000ull		/* questions to one destination, at most */
#define DS_SPIN_NS	20000L			/* a blocking call polls this long before sleeping */
#define DS_LOOK_NS	50000ull		/* an empty kernel socket is looked at again after */
#define DS_HANDOVER_NS	100000000ull		/* after its data, the kernel socket is read first */

/* The header of a datagram over the UD QP (DS_HDR_V4 or DS_HDR_V6 bytes). */
struct ds_hdr {
	uint8_t version;
	uint8_t family;			/* 4 or 6: what addr holds */
	uint16_t port;			/* the sender's, network order */
	uint32_t qkey;			/* the sender's Q_Key, network order */
	uint8_t addr[16];		/* the sender's address (4 bytes for IPv4) */
};

/* The header of a datagram over the kernel socket. */
enum { DS_F_DATA = 1, DS_F_ASK = 2 };	/* a payload follows; answer with your QP */
struct ds_udp_hdr {
	uint32_t magic;			/* DS_UDP_MAGIC, network order */
	uint8_t version;
	uint8_t flags;			/* DS_F_* */
	uint16_t lid;			/* network order, as the rest */
	uint32_t qpn;
	uint32_t qkey;
	uint8_t gid[16];		/* the sender's GID for the address it sent from */
};
_Static_assert(sizeof(struct ds_udp_hdr) == 32, "the kernel socket's header is 32 bytes");

/* What a socket knows about one destination address. */
struct ds_dest {
	struct sockaddr_storage addr;	/* the key, normalized; family 0: unused */
	struct ibv_ah *ah;		/* NULL: by the kernel socket */
	uint32_t qpn, qkey;
	bool udp_only;			/* answered, but no RDMA path reaches it */
	uint64_t heard_ns;		/* its QP last confirmed */
	uint64_t asked_ns;		/* last asked for its QP */
	uint64_t used_ns;
	struct ds_hdr hdr;		/* what we send it: our address towards it */
	uint8_t hdr_len;		/* 0: not worked out yet */
	struct sockaddr_storage src;	/* that address */
	union ibv_gid gid;		/* and its GID, for the kernel socket's header */
};

struct ds {
	int fd;				/* the kernel UDP socket, the rsocket's number */
	int domain;
	bool nonblock;
	pthread_mutex_t mu;
	uint16_t port;			/* network order; 0 while unbound */
	struct sockaddr_storage local;	/* the bound address */
	bool connected;
	struct sockaddr_storage peer;	/* normalized */
	bool rd_shut, wr_shut;
	int sndbuf, rcvbuf, sq_want, rq_want;
	unsigned max_msg;		/* EMSGSIZE above */

	/* the UD QP, made at first use */
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	bool armed;
	bool roce;
	uint16_t lid;
	uint32_t qkey;
	unsigned sq, rq;
	uint8_t *rbuf, *sbuf;
	struct ibv_mr *rmr, *smr;
	unsigned s_next, s_used;	/* send slots: the next, and those in flight */
	unsigned *ready;		/* received slots, in arrival order */
	uint32_t *rlen;			/* each slot's message length, after the GRH */
	unsigned r_head, r_count;
	bool broken;			/* a work request failed: the QP goes round again */

	/* the kernel socket */
	bool udp_data;			/* a datagram with data heads its queue */
	uint64_t udp_empty_ns;		/* when a look found it empty */
	uint64_t answer_due_ns;		/* read it on sends until then */
	uint64_t udp_data_ns;		/* when it last gave the application data */
	unsigned udp_streak;		/* datagrams it gave in a row while the QP had some */

	struct ds_dest dests[DS_DESTS];
	struct ds_dest *last;
};

static struct ds *table[DS_MAX_FD];
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static struct ds *ds_get(int fd)
{
	struct ds *d;

	if (fd < 0 || fd >= DS_MAX_FD)
		return NULL;
	pthread_mutex_lock(&table_mu);
	d = table[fd];
	pthread_mutex_unlock(&table_mu);
	return d;
}

bool ds_is(int fd)
{
	return ds_get(fd) != NULL;
}

static int ds_fail(int err, const struct ds *d, const char *call, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int ds_fail(int err, const struct ds *d, const char *call, const char *fmt, ...)
{
	char why[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	softverbs_cm_explain(call, "failed (%s): datagram rsocket %d: %s",
			     strerrorname_np(err) ? strerrorname_np(err) : "?", d ? d->fd : -1, why);
	errno = err;
	return -1;
}

/* ---- addresses ---- */

/* An IPv4-mapped IPv6 address is its IPv4 address; the unspecified
 * address is this host's loopback, as for UDP.  0, or EINVAL/EAFNOSUPPORT. */
static int normalize(const struct ds *d, const struct sockaddr *a, socklen_t len,
		     struct sockaddr_storage *out)
{
	memset(out, 0, sizeof(*out));
	if (!a || len < sizeof(sa_family_t))
		return EINVAL;
	if (a->sa_family == AF_INET) {
		struct sockaddr_in *o = (struct sockaddr_in *)out;

		if (len < sizeof(struct sockaddr_in))
			return EINVAL;
		memcpy(o, a, sizeof(*o));
		memset(o->sin_zero, 0, sizeof(o->sin_zero));
		if (o->sin_addr.s_addr == htonl(INADDR_ANY))
			o->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		return 0;
	}
	if (a->sa_family != AF_INET6 || d->domain != AF_INET6)
		return EAFNOSUPPORT;
	if (len < sizeof(struct sockaddr_in6))
		return EINVAL;
	const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)a;
	if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
		struct sockaddr_in *o = (struct sockaddr_in *)out;

		o->sin_family = AF_INET;
		o->sin_port = s6->sin6_port;
		memcpy(&o->sin_addr, &s6->sin6_addr.s6_addr[12], 4);
		return 0;
	}
	struct sockaddr_in6 *o = (struct sockaddr_in6 *)out;
	o->sin6_family = AF_INET6;
	o->sin6_port = s6->sin6_port;
	o->sin6_addr = IN6_IS_ADDR_UNSPECIFIED(&s6->sin6_addr) ? in6addr_loopback :
		       s6->sin6_addr;
	if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr))
		o->sin6_scope_id = s6->sin6_scope_id;
	return 0;
}

static uint16_t port_of(const struct sockaddr_storage *a)
{
	return a->ss_family == AF_INET ? ((const struct sockaddr_in *)a)->sin_port :
	       ((const struct sockaddr_in6 *)a)->sin6_port;
}

static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family || port_of(a) != port_of(b))
		return false;
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
		       &((const struct sockaddr_in6 *)b)->sin6_addr, 16);
}

/* A normalized address as the socket's family reports it: an IPv4
 * address to an AF_INET6 socket is IPv4-mapped. */
static void report_addr(const struct ds *d, const struct sockaddr_storage *a,
			struct sockaddr *out, socklen_t *len)
{
	struct sockaddr_storage r = *a;
	socklen_t n;

	if (!out || !len)
		return;
	if (a->ss_family == AF_INET && d->domain == AF_INET6) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)a;
		struct sockaddr_in6 *m = (struct sockaddr_in6 *)&r;

		memset(&r, 0, sizeof(r));
		m->sin6_family = AF_INET6;
		m->sin6_port = s->sin_port;
		m->sin6_addr.s6_addr[10] = m->sin6_addr.s6_addr[11] = 0xff;
		memcpy(&m->sin6_addr.s6_addr[12], &s->sin_addr, 4);
	}
	n = r.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
	memcpy(out, &r, *len < n ? *len : n);
	*len = n;
}

static bool addr_is_any(const struct sockaddr_storage *a)
{
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY);
	return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)a)->sin6_addr);
}

static bool addr_is_group(const struct sockaddr_storage *a)
{
	if (a->ss_family == AF_INET) {
		uint32_t v = ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr);

		return IN_MULTICAST(v) || v == INADDR_BROADCAST;
	}
	return IN6_IS_ADDR_MULTICAST(&((const struct sockaddr_in6 *)a)->sin6_addr);
}

/* The local address the kernel would send from towards dst, as UDP picks
 * it for an unbound or wildcard-bound socket. */
static int route_source(const struct sockaddr_storage *dst, struct sockaddr_storage *src)
{
	socklen_t len = sizeof(*src);
	int s = sv_socket(dst->ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	int ret = -1;

	if (s < 0)
		return -1;
	if (!connect(s, (const struct sockaddr *)dst, dst->ss_family == AF_INET ?
		     sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6)) &&
	    !getsockname(s, (struct sockaddr *)src, &len))
		ret = 0;
	close(s);
	return ret;
}

/* ---- GIDs ---- */

/* The GID and GID index of a local address; an address the table does
 * not hold (loopback in RoCE mode, IPv6) has the port's first GID, which
 * is this host's alone. */
static void local_gid(struct ds *d, const struct sockaddr_storage *a, union ibv_gid *gid,
		      uint8_t *index)
{
	union ibv_gid g;

	cm_addr_gid(d->ctx, (const struct sockaddr *)a, gid, index);
	if (ibv_query_gid(d->ctx, 1, *index, &g) || memcmp(&g, gid, sizeof(g))) {
		*index = 0;
		ibv_query_gid(d->ctx, 1, 0, gid);
	}
}

static bool gid_here(struct ds *d, const union ibv_gid *gid)
{
	struct ibv_port_attr pa;
	union ibv_gid g;

	if (ibv_query_port(d->ctx, 1, &pa))
		return false;
	for (int i = 0; i < pa.gid_tbl_len && i < 256; i++)
		if (!ibv_query_gid(d->ctx, 1, i, &g) && !memcmp(&g, gid, sizeof(g)))
			return true;
	return false;
}

static bool gid_v4(const union ibv_gid *gid)
{
	static const uint8_t prefix[12] = { [10] = 0xff, [11] = 0xff };

	return !memcmp(gid->raw, prefix, sizeof(prefix));
}

/* ---- the UD QP ---- */

/*
 * A queue's depth: RDMA_SQSIZE/RDMA_RQSIZE, else from SO_SNDBUF/SO_RCVBUF.
 * The kernel charges a small UDP datagram about 512 bytes of its receive
 * buffer (the buffer's size is doubled, and each datagram costs its
 * sk_buff besides its data), so a receive slot per 512 bytes holds as many
 * small datagrams as a UDP socket would: 416 by default, 1024 for the
 * 512 KiB udpong asks for.  Fewer made udpong's echo lose the one answer
 * it waited for under load, after which it only resends stale ones.
 */
static unsigned depth(int want, int buf, unsigned per)
{
	long n = want > 0 ? want : (buf > 0 ? buf : DS_BUF_DEFAULT) / (long)per;

	return n < DS_Q_MIN ? DS_Q_MIN : n > DS_Q_MAX ? DS_Q_MAX : (unsigned)n;
}

static int post_recv(struct ds *d, unsigned slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(d->rbuf + (size_t)slot * DS_RSLOT),
			       .length = DS_RSLOT, .lkey = d->rmr->lkey };
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(d->qp, &wr, &bad);
}

/* RESET -> INIT -> RTR -> RTS with the socket's Q_Key (IBA 10.3.1, Table 91: UD
 * needs only the P_Key index, port and Q_Key, then the send PSN). */
static int qp_up(struct ds *d)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qkey = d->qkey };

	if (ibv_modify_qp(d->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		return -1;
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR };
	if (ibv_modify_qp(d->qp, &a, IBV_QP_STATE))
		return -1;
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .sq_psn = 0 };
	return ibv_modify_qp(d->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

static void ep_free(struct ds *d)
{
	for (int i = 0; i < DS_DESTS; i++)
		if (d->dests[i].ah)
			ibv_destroy_ah(d->dests[i].ah);
	if (d->qp)
		ibv_destroy_qp(d->qp);
	if (d->rmr)
		ibv_dereg_mr(d->rmr);
	if (d->smr)
		ibv_dereg_mr(d->smr);
	if (d->cq)
		ibv_destroy_cq(d->cq);
	if (d->cc)
		ibv_destroy_comp_channel(d->cc);
	if (d->rbuf)
		munmap(d->rbuf, (size_t)d->rq * DS_RSLOT);
	if (d->sbuf)
		munmap(d->sbuf, (size_t)d->sq * DS_SSLOT);
	free(d->ready);
	free(d->rlen);
	d->qp = NULL;
	d->rmr = d->smr = NULL;
	d->cq = NULL;
	d->cc = NULL;
	d->rbuf = d->sbuf = NULL;
	d->ready = NULL;
	d->rlen = NULL;
}

/* The QP, its CQ and the rings, at the socket's first use (after the
 * options that size them).  0, or an errno. */
static int ep_init(struct ds *d)
{
	struct ibv_port_attr pa;
	struct ibv_qp_init_attr qa = { 0 };

	if (d->qp)
		return 0;
	if (ibv_query_port(d->ctx, 1, &pa))
		return errno ? errno : ENODEV;
	d->roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
	d->lid = pa.lid;
	d->sq = depth(d->sq_want, d->sndbuf, DS_SQ_PER);
	d->rq = depth(d->rq_want, d->rcvbuf, DS_RQ_PER);
	d->cc = ibv_create_comp_channel(d->ctx);
	if (!d->cc)
		goto fail;
	fcntl(d->cc->fd, F_SETFL, fcntl(d->cc->fd, F_GETFL) | O_NONBLOCK);
	d->cq = ibv_create_cq(d->ctx, (int)(d->sq + d->rq), d, d->cc, 0);
	d->rbuf = mmap(NULL, (size_t)d->rq * DS_RSLOT, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	d->sbuf = mmap(NULL, (size_t)d->sq * DS_SSLOT, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (d->rbuf == MAP_FAILED)
		d->rbuf = NULL;
	if (d->sbuf == MAP_FAILED)
		d->sbuf = NULL;
	d->ready = calloc(d->rq, sizeof(*d->ready));
	d->rlen = calloc(d->rq, sizeof(*d->rlen));
	if (!d->cq || !d->rbuf || !d->sbuf || !d->ready || !d->rlen)
		goto fail;
	d->rmr = ibv_reg_mr(d->pd, d->rbuf, (size_t)d->rq * DS_RSLOT, IBV_ACCESS_LOCAL_WRITE);
	d->smr = ibv_reg_mr(d->pd, d->sbuf, (size_t)d->sq * DS_SSLOT, 0);
	if (!d->rmr || !d->smr)
		goto fail;
	qa.send_cq = qa.recv_cq = d->cq;
	qa.qp_type = IBV_QPT_UD;
	qa.sq_sig_all = 1;
	qa.cap.max_send_wr = d->sq;
	qa.cap.max_recv_wr = d->rq;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	d->qp = ibv_create_qp(d->pd, &qa);
	/* A Q_Key of our own, high bit clear (C10-15: a set bit means the
	 * sender's own), never 0. */
	if (getrandom(&d->qkey, sizeof(d->qkey), 0) != sizeof(d->qkey))
		d->qkey = (uint32_t)now_ns() ^ (uint32_t)getpid() << 8;
	d->qkey = (d->qkey & 0x7fffffffu) | 1;
	if (!d->qp || qp_up(d))
		goto fail;
	for (unsigned i = 0; i < d->rq; i++)
		if (post_recv(d, i))
			goto fail;
	return 0;
fail:;
	int err = errno ? errno : ENOMEM;
	ep_free(d);
	return err;
}

/* A send or receive failed (the QP is in SQE or ERR): take it round to
 * RTS again and post every slot that holds no message.  The QPN stays. */
static void qp_restart(struct ds *d)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };
	bool *held = calloc(d->rq, sizeof(*held));

	d->broken = false;
	if (!held || ibv_modify_qp(d->qp, &a, IBV_QP_STATE) || qp_up(d)) {
		free(held);
		return;
	}
	for (unsigned i = 0; i < d->r_count; i++)
		held[d->ready[(d->r_head + i) % d->rq]] = true;
	for (unsigned i = 0; i < d->rq; i++)
		if (!held[i])
			post_recv(d, i);
	d->s_used = 0;	/* RESET dropped what was queued */
	free(held);
}

/* ---- destinations ---- */

static struct ds_dest *dest_find(struct ds *d, const struct sockaddr_storage *a)
{
	if (d->last && same_addr(&d->last->addr, a))
		return d->last;
	for (int i = 0; i < DS_DESTS; i++)
		if (d->dests[i].addr.ss_family && same_addr(&d->dests[i].addr, a))
			return d->last = &d->dests[i];
	return NULL;
}

/* Found or made; a full table forgets the destination used longest ago. */
static struct ds_dest *dest_get(struct ds *d, const struct sockaddr_storage *a)
{
	struct ds_dest *e = dest_find(d, a), *old = &d->dests[0];

	if (e)
		return e;
	for (int i = 0; i < DS_DESTS && old->addr.ss_family; i++)
		if (!d->dests[i].addr.ss_family || d->dests[i].used_ns < old->used_ns)
			old = &d->dests[i];
	/* A send WQE holds a copy of its address vector: the AH may go. */
	if (old->ah)
		ibv_destroy_ah(old->ah);
	memset(old, 0, sizeof(*old));
	old->addr = *a;
	old->used_ns = now_ns();
	return d->last = old;
}

/* The header we send e: our address towards it and our port. */
static void dest_header(struct ds *d, struct ds_dest *e)
{
	struct sockaddr_storage src = d->local;
	uint8_t index;

	if (e->hdr_len)
		return;
	if (src.ss_family != e->addr.ss_family || addr_is_any(&src))
		if (route_source(&e->addr, &src))
			src = e->addr;	/* no route: the send itself will say so */
	e->src = src;
	local_gid(d, &src, &e->gid, &index);
	e->hdr.version = DS_VERSION;
	e->hdr.port = d->port;
	e->hdr.qkey = htonl(d->qkey);
	if (src.ss_family == AF_INET) {
		e->hdr.family = 4;
		memcpy(e->hdr.addr, &((struct sockaddr_in *)&src)->sin_addr, 4);
		e->hdr_len = DS_HDR_V4;
	} else {
		e->hdr.family = 6;
		memcpy(e->hdr.addr, &((struct sockaddr_in6 *)&src)->sin6_addr, 16);
		e->hdr_len = DS_HDR_V6;
	}
}

static void dest_set_ah(struct ds_dest *e, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
	if (e->ah)
		ibv_destroy_ah(e->ah);
	e->ah = ah;
	e->qpn = qpn;
	e->qkey = qkey;
	e->udp_only = !ah;
	e->heard_ns = now_ns();
}

/* A peer's QP, from the header of its datagram over the kernel socket;
 * local is our address it came to.  Reachable by RDMA: in IB mode a LID
 * of this host; in RoCE mode a GID of this host, or an IPv4 one (another
 * host, by RoCEv2). */
static void learn_udp(struct ds *d, const struct sockaddr_storage *from,
		      const struct sockaddr_storage *local, const struct ds_udp_hdr *h)
{
	struct ds_dest *e = dest_get(d, from);
	uint32_t qpn = ntohl(h->qpn), qkey = ntohl(h->qkey);
	struct ibv_ah_attr a = { .port_num = 1 };
	union ibv_gid gid;

	if (!qpn)
		return;
	if (e->ah && e->qpn == qpn && e->qkey == qkey) {
		e->heard_ns = now_ns();
		return;
	}
	memcpy(gid.raw, h->gid, 16);
	if (!d->roce) {
		if (ntohs(h->lid) != d->lid) {
			dest_set_ah(e, NULL, 0, 0);	/* another host: IB mode has no route */
			return;
		}
		a.dlid = d->lid;
	} else {
		if (!gid_v4(&gid) && !gid_here(d, &gid)) {
			dest_set_ah(e, NULL, 0, 0);	/* IPv6 on another host */
			return;
		}
		a.is_global = 1;
		a.grh.dgid = gid;
		a.grh.hop_limit = 64;
		local_gid(d, local, &gid, &a.grh.sgid_index);
	}
	dest_set_ah(e, ibv_create_ah(d->pd, &a), qpn, qkey);
}

/* A peer's QP, from a datagram it sent us by UD. */
static void learn_ud(struct ds *d, const struct sockaddr_storage *from, struct ibv_wc *wc,
		     struct ibv_grh *grh, uint32_t qkey)
{
	struct ds_dest *e = dest_get(d, from);

	if (e->ah && e->qpn == wc->src_qp && e->qkey == qkey) {
		e->heard_ns = now_ns();
		return;
	}
	struct ibv_ah *ah = ibv_create_ah_from_wc(d->pd, wc, grh, 1);
	if (ah)
		dest_set_ah(e, ah, wc->src_qp, qkey);
}

/* ---- receiving ---- */

/* The sender's address from a UD datagram's header; false if the
 * datagram is malformed. */
static bool hdr_source(const uint8_t *msg, uint32_t len, struct sockaddr_storage *from,
		       uint32_t *qkey, unsigned *hlen)
{
	struct ds_hdr h;

	if (len < DS_HDR_V4)
		return false;
	memcpy(&h, msg, len < sizeof(h) ? len : sizeof(h));
	if (h.version != DS_VERSION || (h.family != 4 && h.family != 6) ||
	    (h.family == 6 && len < DS_HDR_V6) || !h.port)
		return false;
	memset(from, 0, sizeof(*from));
	if (h.family == 4) {
		struct sockaddr_in *s = (struct sockaddr_in *)from;

		s->sin_family = AF_INET;
		s->sin_port = h.port;
		memcpy(&s->sin_addr, h.addr, 4);
		*hlen = DS_HDR_V4;
	} else {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)from;

		s->sin6_family = AF_INET6;
		s->sin6_port = h.port;
		memcpy(&s->sin6_addr, h.addr, 16);
		*hlen = DS_HDR_V6;
	}
	*qkey = ntohl(h.qkey);
	return true;
}

static bool from_peer(const struct ds *d, const struct sockaddr_storage *from)
{
	return !d->connected || same_addr(&d->peer, from);
}

/* Takes the CQ's completions; returns how many. */
static int cq_take(struct ds *d)
{
	struct ibv_wc wc[16];
	int n, took = 0;

	if (!d->cq)
		return 0;
	while ((n = ibv_poll_cq(d->cq, 16, wc)) > 0) {
		took += n;
		for (int i = 0; i < n; i++) {
			struct ibv_wc *w = &wc[i];

			/* An error completion's opcode is undefined: the
			 * wr_id tells sends from receives.  A failed send
			 * (SQE) or receive (ERR) takes the QP round again. */
			if (w->status != IBV_WC_SUCCESS && w->status != IBV_WC_WR_FLUSH_ERR)
				d->broken = true;
			if (w->wr_id & DS_WR_SEND) {
				if (d->s_used)
					d->s_used--;
				continue;
			}
			unsigned slot = (unsigned)w->wr_id;
			if (w->status != IBV_WC_SUCCESS)
				continue;
			uint8_t *buf = d->rbuf + (size_t)slot * DS_RSLOT;
			uint32_t len = w->byte_len > DS_GRH ? w->byte_len - DS_GRH : 0;
			struct sockaddr_storage from;
			uint32_t qkey;
			unsigned hlen;
			if (!hdr_source(buf + DS_GRH, len, &from, &qkey, &hlen) ||
			    !from_peer(d, &from) || d->r_count == d->rq) {
				post_recv(d, slot);	/* dropped, as UDP drops */
				continue;
			}
			learn_ud(d, &from, w, (struct ibv_grh *)buf, qkey);
			d->rlen[slot] = len;
			d->ready[(d->r_head + d->r_count) % d->rq] = slot;
			d->r_count++;
		}
	}
	if (d->broken)
		qp_restart(d);
	return took;
}

/* Sends a header alone (a question or an answer) by the kernel socket. */
static void udp_control(struct ds *d, const struct sockaddr_storage *to,
			const struct sockaddr_storage *local, uint8_t flags)
{
	struct ds_udp_hdr h = { .magic = htonl(DS_UDP_MAGIC), .version = DS_VERSION,
				.flags = flags, .lid = htons(d->lid), .qpn = htonl(d->qp->qp_num),
				.qkey = htonl(d->qkey) };
	union ibv_gid gid;
	uint8_t index;

	local_gid(d, local, &gid, &index);
	memcpy(h.gid, gid.raw, 16);
	sendto(d->fd, &h, sizeof(h), MSG_DONTWAIT | MSG_NOSIGNAL, (const struct sockaddr *)to,
	       to->ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
}

/* Reads the kernel socket's next datagram's header (peeked with flags
 * MSG_PEEK, else taken), its sender and the local address it came to.
 * The datagram's length, 0 for a datagram that is not ours, -1 when the
 * queue is empty or the read failed (errno). */
static ssize_t udp_read(struct ds *d, int flags, struct ds_udp_hdr *h,
			const struct iovec *data, int ndata, struct sockaddr_storage *from,
			struct sockaddr_storage *local)
{
	struct iovec stack[9], *iov = stack;
	union {
		struct cmsghdr c;
		uint8_t b[CMSG_SPACE(sizeof(struct in6_pktinfo)) + CMSG_SPACE(sizeof(struct in_pktinfo))];
	} ctl;
	struct sockaddr_storage name;
	struct msghdr m = { .msg_name = &name, .msg_namelen = sizeof(name), .msg_control = &ctl,
			    .msg_controllen = sizeof(ctl) };
	ssize_t n;

	if (ndata + 1 > (int)(sizeof(stack) / sizeof(stack[0]))) {
		iov = calloc((size_t)ndata + 1, sizeof(*iov));
		if (!iov)
			return errno = ENOMEM, -1;
	}
	iov[0] = (struct iovec){ h, sizeof(*h) };
	for (int i = 0; i < ndata; i++)
		iov[i + 1] = data[i];
	m.msg_iov = iov;
	m.msg_iovlen = (size_t)ndata + 1;
	n = recvmsg(d->fd, &m, flags | MSG_DONTWAIT | MSG_TRUNC);
	if (iov != stack)
		free(iov);
	if (n < 0)
		return -1;
	if (normalize(d, (struct sockaddr *)&name, m.msg_namelen, from))
		return 0;
	*local = d->local;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
			struct in_pktinfo pi;
			struct sockaddr_in *l = (struct sockaddr_in *)local;

			memcpy(&pi, CMSG_DATA(c), sizeof(pi));
			memset(local, 0, sizeof(*local));
			l->sin_family = AF_INET;
			l->sin_addr = pi.ipi_addr;
		} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
			struct in6_pktinfo pi;
			struct sockaddr_in6 *l = (struct sockaddr_in6 *)local;

			memcpy(&pi, CMSG_DATA(c), sizeof(pi));
			memset(local, 0, sizeof(*local));
			l->sin6_family = AF_INET6;
			l->sin6_addr = pi.ipi6_addr;
		}
	}
	if ((size_t)n < sizeof(*h) || ntohl(h->magic) != DS_UDP_MAGIC || h->version != DS_VERSION)
		return 0;
	return n;
}

/* A datagram's header taken: learn its sender, answer its question. */
static int ep_init(struct ds *d);

static void udp_heard(struct ds *d, const struct ds_udp_hdr *h,
		      const struct sockaddr_storage *from, const struct sockaddr_storage *local)
{
	if (!d->qp && ep_init(d))
		return;
	learn_udp(d, from, local, h);
	if (h->flags & DS_F_ASK)
		udp_control(d, from, local, 0);
}

/* Reads the kernel socket up to its first datagram with data for the
 * application: answers and questions are handled and consumed, datagrams
 * that are not ours or not from the connected peer are dropped. */
static void udp_take(struct ds *d, bool now)
{
	struct ds_udp_hdr h;
	struct sockaddr_storage from, local;

	/* A caller polling in a loop would make a system call each time:
	 * an empty socket is looked at again DS_LOOK_NS later, unless the
	 * caller is about to sleep on it anyway. */
	if (!now && d->udp_empty_ns && now_ns() - d->udp_empty_ns < DS_LOOK_NS)
		return;
	while (!d->udp_data) {
		ssize_t n = udp_read(d, MSG_PEEK, &h, NULL, 0, &from, &local);

		if (n < 0) {
			d->udp_empty_ns = now_ns();
			return;
		}
		d->udp_empty_ns = 0;
		if (n > 0 && (h.flags & DS_F_DATA) && from_peer(d, &from)) {
			d->udp_data = true;
			return;
		}
		n = udp_read(d, 0, &h, NULL, 0, &from, &local);
		if (n > 0 && !(h.flags & DS_F_DATA))
			udp_heard(d, &h, &from, &local);
	}
}

/* Copies msg into iov; the bytes copied. */
static size_t copy_out(const struct iovec *iov, int iovcnt, const uint8_t *msg, size_t len)
{
	size_t done = 0;

	for (int i = 0; i < iovcnt && done < len; i++) {
		size_t k = iov[i].iov_len < len - done ? iov[i].iov_len : len - done;

		memcpy(iov[i].iov_base, msg + done, k);
		done += k;
	}
	return done;
}

static void ds_lock(struct ds *d)
{
	pthread_mutex_lock(&d->mu);
}

static void ds_unlock(struct ds *d)
{
	pthread_mutex_unlock(&d->mu);
}

/* The completion channel's event, taken: the CQ must be armed again. */
static void ds_cq_event(struct ds *d)
{
	struct ibv_cq *cq;
	void *ctx;

	if (!ibv_get_cq_event(d->cc, &cq, &ctx)) {
		ibv_ack_cq_events(cq, 1);
		d->armed = false;
	}
}

/* Waits (the lock dropped) for a completion, or with the kernel socket
 * too for data, at most ms (-1: no limit).  0, or -1 with errno. */
static int ds_wait(struct ds *d, bool readable, int ms)
{
	struct pollfd p[2];
	int n = 0;

	if (d->cq) {
		/* A datagram often comes within microseconds: poll that long
		 * before sleeping (a wakeup costs the progress thread's futex
		 * and an eventfd), as stream rsockets do. */
		uint64_t t0 = now_ns();
		do {
			if (cq_take(d))
				return 0;
		} while (now_ns() - t0 < (uint64_t)DS_SPIN_NS);
		if (!d->armed && !ibv_req_notify_cq(d->cq, 0))
			d->armed = true;
		if (cq_take(d))	/* before the arming: no event */
			return 0;
		p[n++] = (struct pollfd){ .fd = d->cc->fd, .events = POLLIN };
	}
	if (readable)
		p[n++] = (struct pollfd){ .fd = d->fd, .events = POLLIN };
	ds_unlock(d);
	int ret = poll(p, (nfds_t)n, ms);
	ds_lock(d);
	if (ret < 0)
		return -1;
	if (d->cq && (p[0].revents & POLLIN))
		ds_cq_event(d);
	if (readable && (p[n - 1].revents & POLLIN))
		d->udp_empty_ns = 0;	/* look at once */
	return 0;
}

/* A call that must wait: EAGAIN where it may not (O_NONBLOCK,
 * MSG_DONTWAIT), else ds_wait().  0, or -1 with errno and the lock
 * dropped. */
static int ds_block(struct ds *d, int flags, bool readable)
{
	int err = EAGAIN;

	if (!d->nonblock && !(flags & MSG_DONTWAIT)) {
		if (!ds_wait(d, readable, -1))
			return 0;
		err = errno;
	}
	ds_unlock(d);
	errno = err;
	return -1;
}

enum { DS_RECV_FLAGS = MSG_DONTWAIT | MSG_PEEK | MSG_TRUNC | MSG_WAITALL | MSG_NOSIGNAL |
		       MSG_CMSG_CLOEXEC };

ssize_t ds_recvmsg(int fd, struct msghdr *msg, int flags, const char *call)
{
	struct ds *d = ds_get(fd);
	const struct iovec *iov = msg->msg_iov;
	int iovcnt = (int)msg->msg_iovlen;
	size_t total = 0;
	ssize_t ret = -1;

	if (!d)
		return ds_fail(EBADF, NULL, call, "%d is not an rsocket", fd);
	if (flags & ~DS_RECV_FLAGS)
		return ds_fail(EOPNOTSUPP, d, call, "flags 0x%x: datagram rsockets take MSG_DONTWAIT, "
			       "MSG_PEEK and MSG_TRUNC", flags);
	if (iovcnt < 0 || (iovcnt && !iov))
		return ds_fail(EINVAL, d, call, "a bad iovec");
	for (int i = 0; i < iovcnt; i++)
		total += iov[i].iov_len;
	ds_lock(d);
	int err = ep_init(d);
	if (err) {
		ds_unlock(d);
		return ds_fail(err, d, call, "the UD QP: %s", strerror(err));
	}
	msg->msg_flags = 0;
	msg->msg_controllen = 0;
	for (;;) {
		cq_take(d);
		/*
		 * A sender's first datagrams come by the kernel socket and the
		 * later ones by UD, so the kernel socket's are the older:
		 * they go first, and for DS_HANDOVER_NS after the last of
		 * them the socket is looked at on every call; later only
		 * every DS_LOOK_NS, so that the QP's datagrams cost no system
		 * call.  Neither starves the other (udp_streak).
		 */
		uint64_t now = now_ns();
		bool ud = d->r_count > 0;
		udp_take(d, now - d->udp_data_ns < DS_HANDOVER_NS);
		if (ud && (!d->udp_data || d->udp_streak >= 16)) {
			unsigned slot = d->ready[d->r_head];
			const uint8_t *m = d->rbuf + (size_t)slot * DS_RSLOT + DS_GRH;
			struct sockaddr_storage from;
			uint32_t qkey;
			unsigned hlen;

			hdr_source(m, d->rlen[slot], &from, &qkey, &hlen);
			size_t plen = d->rlen[slot] - hlen;
			size_t got = copy_out(iov, iovcnt, m + hlen, plen);
			if (got < plen)
				msg->msg_flags |= MSG_TRUNC;
			report_addr(d, &from, msg->msg_name, &msg->msg_namelen);
			if (!(flags & MSG_PEEK)) {
				d->r_head = (d->r_head + 1) % d->rq;
				d->r_count--;
				post_recv(d, slot);
			}
			d->udp_streak = 0;
			ret = (ssize_t)(flags & MSG_TRUNC ? plen : got);
			break;
		}
		if (d->udp_data) {
			struct ds_udp_hdr h;
			struct sockaddr_storage from, local;
			ssize_t n = udp_read(d, flags & MSG_PEEK, &h, iov, iovcnt, &from, &local);

			if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
				err = errno;
				ds_unlock(d);
				return ds_fail(err, d, call, "recvmsg: %s", strerror(err));
			}
			if (n < 0 || !(flags & MSG_PEEK))
				d->udp_data = false;
			if (n <= 0)
				continue;
			if (!(flags & MSG_PEEK))
				udp_heard(d, &h, &from, &local);
			d->udp_data_ns = now;
			d->udp_streak += ud;
			size_t plen = (size_t)n - sizeof(h);
			if (plen > total)
				msg->msg_flags |= MSG_TRUNC;
			report_addr(d, &from, msg->msg_name, &msg->msg_namelen);
			ret = (ssize_t)(flags & MSG_TRUNC || plen < total ? plen : total);
			break;
		}
		if (d->rd_shut) {
			ret = 0;
			break;
		}
		if (ds_block(d, flags, true))
			return -1;
	}
	ds_unlock(d);
	return ret;
}

/* ---- sending ---- */

/* Binds an unbound socket to the wildcard address and an ephemeral port,
 * as UDP does at a first send.  0, or an errno. */
static int autobind(struct ds *d, const struct sockaddr_storage *near)
{
	struct sockaddr_storage a;
	socklen_t len = sizeof(a);

	if (d->port)
		return 0;
	memset(&a, 0, sizeof(a));
	a.ss_family = (sa_family_t)d->domain;
	if (near) {	/* rconnect: the source address towards the peer */
		struct sockaddr_storage src;

		if (!route_source(near, &src) && src.ss_family == d->domain) {
			a = src;
			if (a.ss_family == AF_INET)
				((struct sockaddr_in *)&a)->sin_port = 0;
			else
				((struct sockaddr_in6 *)&a)->sin6_port = 0;
		}
	}
	if (bind(d->fd, (struct sockaddr *)&a, d->domain == AF_INET ? sizeof(struct sockaddr_in) :
		 sizeof(struct sockaddr_in6)) ||
	    getsockname(d->fd, (struct sockaddr *)&d->local, &len))
		return errno;
	d->port = port_of(&d->local);
	return 0;
}

enum { DS_SEND_FLAGS = MSG_DONTWAIT | MSG_NOSIGNAL | MSG_CONFIRM };

/* Over the UD QP, from a send slot. */
static int send_ud(struct ds *d, struct ds_dest *e, const struct iovec *iov, int iovcnt,
		   size_t len)
{
	uint8_t *slot = d->sbuf + (size_t)d->s_next * DS_SSLOT;
	size_t off = e->hdr_len;

	memcpy(slot, &e->hdr, e->hdr_len);
	for (int i = 0; i < iovcnt; i++) {
		memcpy(slot + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	struct ibv_sge sge = { .addr = (uintptr_t)slot, .length = (uint32_t)(e->hdr_len + len),
			       .lkey = d->smr->lkey };
	struct ibv_send_wr wr = { .wr_id = DS_WR_SEND | d->s_next, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND }, *bad;
	wr.wr.ud.ah = e->ah;
	wr.wr.ud.remote_qpn = e->qpn;
	wr.wr.ud.remote_qkey = e->qkey;
	int err = ibv_post_send(d->qp, &wr, &bad);
	if (err)
		return err;
	d->s_next = (d->s_next + 1) % d->sq;
	d->s_used++;
	return 0;
}

/* Over the kernel socket, behind our QP's header, asking for the
 * destination's QP when due.  0, or an errno. */
static int send_udp(struct ds *d, struct ds_dest *e, const struct iovec *iov, int iovcnt,
		    int flags, uint64_t now)
{
	struct ds_udp_hdr h = { .magic = htonl(DS_UDP_MAGIC), .version = DS_VERSION,
				.flags = DS_F_DATA, .lid = htons(d->lid), .qpn = htonl(d->qp->qp_num),
				.qkey = htonl(d->qkey) };
	struct iovec stack[9], *v = stack;
	bool ask = now - e->asked_ns > (e->udp_only ? DS_STALE_NS : DS_ASK_NS);

	if (ask)
		h.flags |= DS_F_ASK;
	memcpy(h.gid, e->gid.raw, 16);
	if (iovcnt + 1 > (int)(sizeof(stack) / sizeof(stack[0]))) {
		v = calloc((size_t)iovcnt + 1, sizeof(*v));
		if (!v)
			return ENOMEM;
	}
	v[0] = (struct iovec){ &h, sizeof(h) };
	for (int i = 0; i < iovcnt; i++)
		v[i + 1] = iov[i];
	struct msghdr m = { .msg_name = &e->addr, .msg_iov = v, .msg_iovlen = (size_t)iovcnt + 1,
			    .msg_namelen = e->addr.ss_family == AF_INET ?
					   sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6) };
	ssize_t n = sendmsg(d->fd, &m, MSG_NOSIGNAL | (flags & MSG_DONTWAIT) |
			    (d->nonblock ? MSG_DONTWAIT : 0));
	int err = n < 0 ? errno : 0;
	if (v != stack)
		free(v);
	if (!err && ask) {
		e->asked_ns = now;
		d->answer_due_ns = now + DS_STALE_NS;
	}
	return err;
}

ssize_t ds_sendmsg(int fd, const struct msghdr *msg, int flags, const char *call)
{
	struct ds *d = ds_get(fd);
	struct sockaddr_storage to;
	size_t len = 0;
	int err;

	if (!d)
		return ds_fail(EBADF, NULL, call, "%d is not an rsocket", fd);
	if (flags & ~DS_SEND_FLAGS)
		return ds_fail(EOPNOTSUPP, d, call, "flags 0x%x: datagram rsockets take MSG_DONTWAIT "
			       "and MSG_NOSIGNAL", flags);
	if (msg->msg_controllen)
		return ds_fail(EOPNOTSUPP, d, call, "control messages are not built");
	if ((int)msg->msg_iovlen < 0 || (msg->msg_iovlen && !msg->msg_iov))
		return ds_fail(EINVAL, d, call, "a bad iovec");
	for (size_t i = 0; i < msg->msg_iovlen; i++)
		len += msg->msg_iov[i].iov_len;
	if (len > d->max_msg)
		return ds_fail(EMSGSIZE, d, call, "%zu bytes: a datagram is one UD message, at most "
			       "the path MTU less its header: %u bytes", len, d->max_msg);
	if (msg->msg_name) {
		err = normalize(d, msg->msg_name, msg->msg_namelen, &to);
		if (err)
			return ds_fail(err, d, call, "the destination: family %d, %u bytes",
				       msg->msg_namelen >= sizeof(sa_family_t) ?
				       ((struct sockaddr *)msg->msg_name)->sa_family : -1,
				       (unsigned)msg->msg_namelen);
		if (!port_of(&to))
			return ds_fail(EINVAL, d, call, "destination port 0");
		if (addr_is_group(&to))
			return ds_fail(EOPNOTSUPP, d, call, "a broadcast or multicast destination: "
				       "datagram rsockets send to one address");
	}
	ds_lock(d);
	if (!msg->msg_name) {
		if (!d->connected) {
			ds_unlock(d);
			return ds_fail(EDESTADDRREQ, d, call, "no destination, and not connected");
		}
		to = d->peer;
	}
	if (d->wr_shut) {
		ds_unlock(d);
		return ds_fail(EPIPE, d, call, "shut down for writing");
	}
	err = ep_init(d);
	if (!err)
		err = autobind(d, NULL);
	if (err) {
		ds_unlock(d);
		return ds_fail(err, d, call, "%s", strerror(err));
	}
	uint64_t now = now_ns();
	cq_take(d);
	if (now < d->answer_due_ns)
		udp_take(d, false);
	struct ds_dest *e = dest_get(d, &to);
	e->used_ns = now;
	dest_header(d, e);
	if (e->ah) {
		/* Confirm the QP now and then: the port may have changed hands. */
		if (now - e->heard_ns > DS_STALE_NS && now - e->asked_ns > DS_STALE_NS) {
			udp_control(d, &e->addr, &e->src, DS_F_ASK);
			e->asked_ns = now;
			d->answer_due_ns = now + DS_STALE_NS;
		}
		while (d->s_used == d->sq) {
			if (cq_take(d))
				continue;
			if (ds_block(d, flags, false))
				return -1;
		}
		err = send_ud(d, e, msg->msg_iov, (int)msg->msg_iovlen, len);
	} else {
		err = send_udp(d, e, msg->msg_iov, (int)msg->msg_iovlen, flags, now);
	}
	ds_unlock(d);
	if (err == EAGAIN || err == EWOULDBLOCK)
		return errno = EAGAIN, -1;
	if (err)
		return ds_fail(err, d, call, "%s", strerror(err));
	return (ssize_t)len;
}

/* ---- the socket ---- */

int ds_socket(int domain, int type)
{
	struct ibv_port_attr pa;
	struct ds *d;
	int fd, one = 1;

	fd = sv_socket(domain, SOCK_DGRAM | (type & SOCK_CLOEXEC), IPPROTO_UDP);
	if (fd < 0)
		return ds_fail(errno, NULL, "rsocket", "the address's UDP socket: %s", strerror(errno));
	if (fd >= DS_MAX_FD) {
		close(fd);
		return ds_fail(EMFILE, NULL, "rsocket", "fd %d: too many rsockets", fd);
	}
	/* The local address each datagram comes to: the GID we answer with. */
	setsockopt(fd, domain == AF_INET ? IPPROTO_IP : IPPROTO_IPV6,
		   domain == AF_INET ? IP_PKTINFO : IPV6_RECVPKTINFO, &one, sizeof(one));
	if (domain == AF_INET6)
		setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one));
	d = calloc(1, sizeof(*d));
	if (!d) {
		close(fd);
		return ds_fail(ENOMEM, NULL, "rsocket", "out of memory");
	}
	d->fd = fd;
	d->domain = domain;
	d->nonblock = type & SOCK_NONBLOCK;
	d->local.ss_family = (sa_family_t)domain;
	d->ctx = cm_device();
	d->pd = d->ctx ? cm_default_pd(d->ctx) : NULL;
	if (!d->pd || ibv_query_port(d->ctx, 1, &pa)) {
		close(fd);
		free(d);
		return ds_fail(ENODEV, NULL, "rsocket", "no RDMA device");
	}
	unsigned mtu = 128u << pa.active_mtu;
	d->max_msg = (mtu > DS_MAX_MTU ? DS_MAX_MTU : mtu) -
		     (domain == AF_INET ? DS_HDR_V4 : DS_HDR_V6);
	pthread_mutex_init(&d->mu, NULL);
	pthread_mutex_lock(&table_mu);
	table[fd] = d;
	pthread_mutex_unlock(&table_mu);
	return fd;
}

int ds_bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct ds *d = ds_get(fd);
	socklen_t n = sizeof(d->local);

	if (!d)
		return ds_fail(EBADF, NULL, "rbind", "%d is not an rsocket", fd);
	ds_lock(d);
	if (bind(d->fd, addr, len) || getsockname(d->fd, (struct sockaddr *)&d->local, &n)) {
		int err = errno;

		ds_unlock(d);
		return ds_fail(err, d, "rbind", "%s", strerror(err));
	}
	d->port = port_of(&d->local);
	for (int i = 0; i < DS_DESTS; i++)
		d->dests[i].hdr_len = 0;	/* our address in them changed */
	/* A bound socket answers for its QP from now on: make it. */
	int err = ep_init(d);
	ds_unlock(d);
	if (err)
		return ds_fail(err, d, "rbind", "the UD QP: %s", strerror(err));
	return 0;
}

int ds_connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct ds *d = ds_get(fd);
	struct sockaddr_storage to;
	int err;

	if (!d)
		return ds_fail(EBADF, NULL, "rconnect", "%d is not an rsocket", fd);
	if (addr && len >= sizeof(sa_family_t) && addr->sa_family == AF_UNSPEC) {
		ds_lock(d);	/* UDP: dissolve the association */
		d->connected = false;
		ds_unlock(d);
		return 0;
	}
	err = normalize(d, addr, len, &to);
	if (!err && !port_of(&to))
		err = EINVAL;
	if (err)
		return ds_fail(err, d, "rconnect", "the peer's address");
	if (addr_is_group(&to))
		return ds_fail(EOPNOTSUPP, d, "rconnect", "a broadcast or multicast peer");
	ds_lock(d);
	err = ep_init(d);
	if (!err)
		err = autobind(d, &to);
	if (err) {
		ds_unlock(d);
		return ds_fail(err, d, "rconnect", "%s", strerror(err));
	}
	/* From now on only the peer's datagrams are taken; those queued
	 * before stay, as with connect(2) on a UDP socket. */
	d->peer = to;
	d->connected = true;
	ds_unlock(d);
	return 0;
}

int ds_getsockname(int fd, struct sockaddr *addr, socklen_t *len)
{
	struct ds *d = ds_get(fd);

	if (!d)
		return ds_fail(EBADF, NULL, "rgetsockname", "%d is not an rsocket", fd);
	return getsockname(d->fd, addr, len);
}

int ds_getpeername(int fd, struct sockaddr *addr, socklen_t *len)
{
	struct ds *d = ds_get(fd);

	if (!d)
		return ds_fail(EBADF, NULL, "rgetpeername", "%d is not an rsocket", fd);
	ds_lock(d);
	if (!d->connected) {
		ds_unlock(d);
		return ds_fail(ENOTCONN, d, "rgetpeername", "not connected");
	}
	if (!addr || !len) {
		ds_unlock(d);
		return ds_fail(EFAULT, d, "rgetpeername", "addr or addrlen is NULL");
	}
	report_addr(d, &d->peer, addr, len);
	ds_unlock(d);
	return 0;
}

int ds_setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	struct ds *d = ds_get(fd);

	if (!d)
		return ds_fail(EBADF, NULL, "rsetsockopt", "%d is not an rsocket", fd);
	if (!val || len < sizeof(int))
		return ds_fail(EINVAL, d, "rsetsockopt", "optval too short");
	int v = *(const int *)val;
	if (level == SOL_SOCKET) {
		switch (name) {
		case SO_SNDBUF:
		case SO_RCVBUF:
			/* The kernel socket's (the first datagrams) and, before
			 * the first use, the depth of the UD queues. */
			if (setsockopt(d->fd, level, name, val, len))
				return ds_fail(errno, d, "rsetsockopt", "%s", strerror(errno));
			ds_lock(d);
			*(name == SO_SNDBUF ? &d->sndbuf : &d->rcvbuf) = v;
			ds_unlock(d);
			return 0;
		case SO_REUSEADDR:
		case SO_REUSEPORT:
			/* They decide what rbind may take, which the kernel
			 * socket's bind does. */
			if (setsockopt(d->fd, level, name, val, len))
				return ds_fail(errno, d, "rsetsockopt", "%s", strerror(errno));
			return 0;
		default:
			break;
		}
	} else if (level == IPPROTO_IPV6 && name == IPV6_V6ONLY && d->domain == AF_INET6) {
		if (setsockopt(d->fd, level, name, val, len))
			return ds_fail(errno, d, "rsetsockopt", "%s", strerror(errno));
		return 0;
	} else if (level == SOL_RDMA && (name == RDMA_SQSIZE || name == RDMA_RQSIZE ||
					 name == RDMA_INLINE)) {
		if (v < 0)
			return ds_fail(EINVAL, d, "rsetsockopt", "a negative size");
		ds_lock(d);
		if (name == RDMA_SQSIZE)
			d->sq_want = v;
		else if (name == RDMA_RQSIZE)
			d->rq_want = v;
		/* RDMA_INLINE: every datagram is copied into a send slot. */
		ds_unlock(d);
		return 0;
	}
	return ds_fail(ENOPROTOOPT, d, "rsetsockopt", "level %d option %d is not built for "
		       "datagram rsockets", level, name);
}

int ds_getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	struct ds *d = ds_get(fd);
	int v;

	if (!d)
		return ds_fail(EBADF, NULL, "rgetsockopt", "%d is not an rsocket", fd);
	if (!val || !len || *len < sizeof(int))
		return ds_fail(EINVAL, d, "rgetsockopt", "optval too short");
	if (level == SOL_SOCKET && (name == SO_SNDBUF || name == SO_RCVBUF ||
				    name == SO_REUSEADDR || name == SO_REUSEPORT)) {
		if (getsockopt(d->fd, level, name, val, len))
			return ds_fail(errno, d, "rgetsockopt", "%s", strerror(errno));
		return 0;
	}
	if (level == IPPROTO_IPV6 && name == IPV6_V6ONLY && d->domain == AF_INET6) {
		if (getsockopt(d->fd, level, name, val, len))
			return ds_fail(errno, d, "rgetsockopt", "%s", strerror(errno));
		return 0;
	}
	ds_lock(d);
	if (level == SOL_SOCKET && name == SO_ERROR)
		v = 0;	/* nothing is reported later: a lost datagram is lost */
	else if (level == SOL_SOCKET && name == SO_TYPE)
		v = SOCK_DGRAM;
	else if (level == SOL_SOCKET && name == SO_DOMAIN)
		v = d->domain;
	else if (level == SOL_SOCKET && name == SO_PROTOCOL)
		v = IPPROTO_UDP;
	else if (level == SOL_RDMA && name == RDMA_SQSIZE)
		v = (int)(d->qp ? d->sq : depth(d->sq_want, d->sndbuf, DS_SQ_PER));
	else if (level == SOL_RDMA && name == RDMA_RQSIZE)
		v = (int)(d->qp ? d->rq : depth(d->rq_want, d->rcvbuf, DS_RQ_PER));
	else if (level == SOL_RDMA && name == RDMA_INLINE)
		v = 0;
	else {
		ds_unlock(d);
		return ds_fail(ENOPROTOOPT, d, "rgetsockopt", "level %d option %d is not built for "
			       "datagram rsockets", level, name);
	}
	ds_unlock(d);
	*(int *)val = v;
	*len = sizeof(int);
	return 0;
}

int ds_fcntl(int fd, int cmd, long arg)
{
	struct ds *d = ds_get(fd);

	if (!d)
		return ds_fail(EBADF, NULL, "rfcntl", "%d is not an rsocket", fd);
	switch (cmd) {
	case F_GETFL:
		return O_RDWR | (d->nonblock ? O_NONBLOCK : 0);
	case F_SETFL:
		d->nonblock = arg & O_NONBLOCK;
		return 0;
	case F_GETFD:
	case F_SETFD:
		return fcntl(d->fd, cmd, arg);
	default:
		return ds_fail(EINVAL, d, "rfcntl", "command %d: rsockets take F_GETFL, F_SETFL, "
			       "F_GETFD and F_SETFD", cmd);
	}
}

int ds_shutdown(int fd, int how)
{
	struct ds *d = ds_get(fd);

	if (!d)
		return ds_fail(EBADF, NULL, "rshutdown", "%d is not an rsocket", fd);
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return ds_fail(EINVAL, d, "rshutdown", "how %d", how);
	ds_lock(d);
	if (!d->connected) {
		ds_unlock(d);
		return ds_fail(ENOTCONN, d, "rshutdown", "not connected");
	}
	if (how != SHUT_WR)
		d->rd_shut = true;
	if (how != SHUT_RD)
		d->wr_shut = true;
	ds_unlock(d);
	return 0;
}

int ds_close(int fd)
{
	struct ds *d = ds_get(fd);

	if (!d)
		return ds_fail(EBADF, NULL, "rclose", "%d is not an rsocket", fd);
	pthread_mutex_lock(&table_mu);
	table[fd] = NULL;
	pthread_mutex_unlock(&table_mu);
	ds_lock(d);
	/* What was posted leaves before the QP goes (bounded: 100 ms). */
	for (int i = 0; i < 100 && d->s_used; i++) {
		cq_take(d);
		if (d->s_used)
			ds_wait(d, false, 1);
	}
	ep_free(d);
	ds_unlock(d);
	close(d->fd);
	pthread_mutex_destroy(&d->mu);
	free(d);
	return 0;
}

/* ---- rpoll ---- */

short ds_poll_revents(int fd, short events)
{
	struct ds *d = ds_get(fd);
	short re = 0;

	if (!d)
		return POLLNVAL;
	ds_lock(d);
	cq_take(d);
	if (events & POLLIN)
		udp_take(d, false);
	if (d->r_count || d->udp_data || d->rd_shut)
		re |= POLLIN;
	if (!d->qp || d->s_used < d->sq || d->wr_shut)
		re |= POLLOUT;
	ds_unlock(d);
	return re & (events | POLLERR | POLLHUP | POLLNVAL);
}

/* The fds rpoll sleeps on for fd: its CQ's channel, armed, and for
 * POLLIN its kernel socket.  *again: a completion came before the
 * arming, so look again without sleeping. */
int ds_poll_fds(int fd, short events, struct pollfd *p, bool *again)
{
	struct ds *d = ds_get(fd);
	int n = 0;

	if (!d)
		return 0;
	ds_lock(d);
	if (d->cq) {
		if (!d->armed && !ibv_req_notify_cq(d->cq, 0))
			d->armed = true;
		if (cq_take(d))
			*again = true;
		p[n++] = (struct pollfd){ .fd = d->cc->fd, .events = POLLIN };
	}
	if (events & POLLIN)
		p[n++] = (struct pollfd){ .fd = d->fd, .events = POLLIN };
	ds_unlock(d);
	return n;
}

void ds_poll_woke(int fd, const struct pollfd *p, int n)
{
	struct ds *d = ds_get(fd);

	if (!d || !n)
		return;
	ds_lock(d);
	if (d->cq && p[0].fd == d->cc->fd && (p[0].revents & POLLIN))
		ds_cq_event(d);
	if (p[n - 1].fd == d->fd && (p[n - 1].revents & POLLIN))
		d->udp_empty_ns = 0;	/* look at once */
	ds_unlock(d);
}
