/* SPDX-License-Identifier: MIT */
/*
 * The packet engine's frame: which peers are on another host, a
 * context's link and its QPs, and the dispatch of received packets to
 * the requester (responses) and the responder (requests).
 *
 * A host is a network namespace (core/registry.c keys the registry by
 * it).  A destination GID that is one of this namespace's addresses is
 * on this host and goes by shm; any other goes by packets, unless
 * SOFTVERBS_TRANSPORT=udp sends everything by packets.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/rawsock.h"
#include "../gsi.h"
#include "pkt.h"

/* IBA Table 35 and what each operation carries (9.2-9.3). */
#define S (IBH_SEND | IBH_PAYLOAD | IBH_RECV)
#define W (IBH_WRITE | IBH_PAYLOAD)
#define R (IBH_READ | IBH_RESP | IBH_PAYLOAD)
#define ALL (IBT_RC | IBT_UC | IBT_XRC)
#define RCX (IBT_RC | IBT_XRC)
const struct ib_opinfo ib_opinfo[IB_OP_COUNT] = {
	[IB_OP_SEND_FIRST] = { "SEND_FIRST", S | IBH_FIRST, ALL },
	[IB_OP_SEND_MIDDLE] = { "SEND_MIDDLE", S | IBH_MIDDLE, ALL },
	[IB_OP_SEND_LAST] = { "SEND_LAST", S | IBH_LAST, ALL },
	[IB_OP_SEND_LAST_IMM] = { "SEND_LAST_WITH_IMMEDIATE", S | IBH_LAST | IBH_IMM, ALL },
	[IB_OP_SEND_ONLY] = { "SEND_ONLY", S | IBH_FIRST | IBH_LAST, ALL | IBT_UD },
	[IB_OP_SEND_ONLY_IMM] = { "SEND_ONLY_WITH_IMMEDIATE", S | IBH_FIRST | IBH_LAST | IBH_IMM,
				  ALL | IBT_UD },
	[IB_OP_WRITE_FIRST] = { "RDMA_WRITE_FIRST", W | IBH_FIRST | IBH_RETH, ALL },
	[IB_OP_WRITE_MIDDLE] = { "RDMA_WRITE_MIDDLE", W | IBH_MIDDLE, ALL },
	[IB_OP_WRITE_LAST] = { "RDMA_WRITE_LAST", W | IBH_LAST, ALL },
	[IB_OP_WRITE_LAST_IMM] = { "RDMA_WRITE_LAST_WITH_IMMEDIATE",
				   W | IBH_LAST | IBH_IMM | IBH_RECV, ALL },
	[IB_OP_WRITE_ONLY] = { "RDMA_WRITE_ONLY", W | IBH_FIRST | IBH_LAST | IBH_RETH, ALL },
	[IB_OP_WRITE_ONLY_IMM] = { "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
				   W | IBH_FIRST | IBH_LAST | IBH_RETH | IBH_IMM | IBH_RECV, ALL },
	[IB_OP_READ_REQ] = { "RDMA_READ_REQUEST", IBH_READ | IBH_FIRST | IBH_LAST | IBH_RETH, RCX },
	[IB_OP_READ_RESP_FIRST] = { "RDMA_READ_RESPONSE_FIRST", R | IBH_FIRST | IBH_AETH, RCX },
	[IB_OP_READ_RESP_MIDDLE] = { "RDMA_READ_RESPONSE_MIDDLE", R | IBH_MIDDLE, RCX },
	[IB_OP_READ_RESP_LAST] = { "RDMA_READ_RESPONSE_LAST", R | IBH_LAST | IBH_AETH, RCX },
	[IB_OP_READ_RESP_ONLY] = { "RDMA_READ_RESPONSE_ONLY", R | IBH_FIRST | IBH_LAST | IBH_AETH,
				   RCX },
	[IB_OP_ACK] = { "ACKNOWLEDGE", IBH_RESP | IBH_AETH | IBH_FIRST | IBH_LAST, RCX },
	[IB_OP_ATOMIC_ACK] = { "ATOMIC_ACKNOWLEDGE",
			       IBH_RESP | IBH_ATOMIC | IBH_AETH | IBH_ATMACK | IBH_FIRST | IBH_LAST,
			       RCX },
	[IB_OP_CMP_SWAP] = { "COMPARE_SWAP", IBH_ATOMIC | IBH_ATMETH | IBH_FIRST | IBH_LAST, RCX },
	[IB_OP_FETCH_ADD] = { "FETCH_ADD", IBH_ATOMIC | IBH_ATMETH | IBH_FIRST | IBH_LAST, RCX },
	[IB_OP_SEND_LAST_INV] = { "SEND_LAST_WITH_INVALIDATE", S | IBH_LAST | IBH_IETH, RCX },
	[IB_OP_SEND_ONLY_INV] = { "SEND_ONLY_WITH_INVALIDATE", S | IBH_FIRST | IBH_LAST | IBH_IETH,
				  RCX },
	[IB_OP_ATOMIC_WRITE] = { "ATOMIC_WRITE",
				 IBH_WRITE | IBH_WORD | IBH_PAYLOAD | IBH_FIRST | IBH_LAST | IBH_RETH,
				 RCX },
};
#undef S
#undef W
#undef R
#undef ALL
#undef RCX

unsigned ib_hdr_len(uint8_t opcode)
{
	uint32_t f = ib_opinfo[opcode & 0x1f].flags;
	unsigned tr = opcode & 0xe0, n = 0;

	if (tr == IB_TR_XRC && !(f & IBH_RESP))
		n += sizeof(struct ib_xrceth);
	if (tr == IB_TR_UD)
		n += sizeof(struct ib_deth);
	if (f & IBH_RETH)
		n += sizeof(struct ib_reth);
	if (f & IBH_ATMETH)
		n += sizeof(struct ib_atmeth);
	if (f & IBH_AETH)
		n += sizeof(struct ib_aeth);
	if (f & IBH_ATMACK)
		n += sizeof(struct ib_atmack);
	if (f & (IBH_IMM | IBH_IETH))
		n += 4;
	return n;
}

const char *ib_opcode_name(uint8_t opcode)
{
	const char *n = ib_opinfo[opcode & 0x1f].name;

	return n ? n : "reserved";
}

/* ---- routes ---- */

static void route_v4(struct in6_addr *a, uint32_t be_addr)
{
	memset(a, 0, sizeof(*a));
	a->s6_addr[10] = a->s6_addr[11] = 0xff;
	memcpy(&a->s6_addr[12], &be_addr, 4);
}

const char *sv_route_addr(const struct in6_addr *a, uint32_t ifindex, char *buf, size_t len)
{
	const uint8_t *d = a->s6_addr;

	if (sv_gid_v4(d)) {
		snprintf(buf, len, "%u.%u.%u.%u", d[12], d[13], d[14], d[15]);
		return buf;
	}
	char t[INET6_ADDRSTRLEN];
	inet_ntop(AF_INET6, a, t, sizeof(t));
	if (IN6_IS_ADDR_LINKLOCAL(a) && ifindex)
		snprintf(buf, len, "%s%%%u", t, ifindex);
	else
		snprintf(buf, len, "%s", t);
	return buf;
}

/* The source address the kernel would pick for r's destination. */
static bool probe_src(struct sv_route *r)
{
	struct sockaddr_in6 s6 = { .sin6_family = AF_INET6, .sin6_port = htons(SV_ROCE_PORT),
				   .sin6_addr = r->dst, .sin6_scope_id = r->ifindex };
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(SV_ROCE_PORT) };
	struct sockaddr *sa = r->v4 ? (struct sockaddr *)&sin : (struct sockaddr *)&s6;
	socklen_t sl = r->v4 ? sizeof(sin) : sizeof(s6);
	int fd = sv_socket(sa->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	bool ok = false;

	if (fd < 0)
		return false;
	memcpy(&sin.sin_addr, &r->dst.s6_addr[12], 4);
	if (!connect(fd, sa, sl) && !getsockname(fd, sa, &sl)) {
		if (r->v4)
			route_v4(&r->src, sin.sin_addr.s_addr);
		else
			r->src = s6.sin6_addr;
		ok = true;
	}
	close(fd);
	return ok;
}

/* Whether a GID names this host: one of its table (every address of its
 * interfaces), or loopback, 127.0.0.0/8 or ::1, which are always its own. */
static bool gid_here(const struct sv_device *dev, const union ibv_gid *gid)
{
	const uint8_t *d = gid->raw;

	return sv_gid_find(dev, gid) >= 0 || (sv_gid_v4(d) && d[12] == 127) ||
	       IN6_IS_ADDR_LOOPBACK((const struct in6_addr *)d);
}

bool sv_route_remote(const struct sv_device *dev, const struct ibv_ah_attr *av,
		     struct sv_route *r, const char **why)
{
	static __thread char buf[200];
	char a[INET6_ADDRSTRLEN + 12];
	bool forced = sv_config()->transport == SV_TRANSPORT_UDP;

	*why = NULL;
	memset(r, 0, sizeof(*r));
	r->ttl = 64;
	if (sv_config()->link == SV_LINK_IB) {
		uint16_t own = sv_port_lid(dev);
		bool here = av->dlid == own || av->dlid >= 0xc000;
		uint32_t dst, src;
		if (!here && sv_lid_addr(dev, av->dlid, &dst, &src)) {
			/* Another host of the subnet (SOFTVERBS_LID=addr): its
			 * address; the GRH, if any, does not travel (RoCEv2
			 * has the IP header in its place). */
			route_v4(&r->dst, dst);
			route_v4(&r->src, src);
			r->v4 = true;
			return true;
		}
		if (!here) {
			if (sv_port_lid_routed(dev))
				snprintf(buf, sizeof(buf), "dlid 0x%x is not on this host (its LID is "
					 "0x%x) nor a host's of its subnet, %s (a LID there is an "
					 "address's host part)", av->dlid, own,
					 sv_port_subnet(dev, a, sizeof(a)));
			else
				snprintf(buf, sizeof(buf), "dlid 0x%x is not on this host (its LID is "
					 "0x%x); other hosts are reached by LID with SOFTVERBS_LID=addr "
					 "on every host (LIDs from IPv4 addresses), or by GID with "
					 "SOFTVERBS_LINK_LAYER=roce", av->dlid, own);
			*why = buf;
			return false;
		}
		if (!forced)
			return false;
		/* Forced packets on one IB host travel over loopback. */
		route_v4(&r->dst, htonl(INADDR_LOOPBACK));
		r->src = r->dst;
		r->v4 = true;
		return true;
	}
	if (!av->is_global)
		return false;	/* RoCE needs a GRH; ah.c has said so */
	const uint8_t *d = av->grh.dgid.raw;
	bool here = gid_here(dev, &av->grh.dgid);
	if (here && !forced)
		return false;
	r->tclass = av->grh.traffic_class;
	if (here && sv_gid_find(dev, &av->grh.dgid) == 0) {
		/* Forced packets to the GUID's link-local GID, which is no
		 * address of an interface, travel over IPv4 loopback. */
		route_v4(&r->dst, htonl(INADDR_LOOPBACK));
		r->src = r->dst;
		r->v4 = true;
		return true;
	}
	/* Another host, or this one's own address with packets forced: the
	 * dgid is the IP destination, IPv4 for an IPv4-mapped GID and IPv6
	 * for any other (RoCEv2, A17.4.5). */
	memcpy(&r->dst, d, 16);
	r->v4 = sv_gid_v4(d);
	r->ttl = av->grh.hop_limit ? av->grh.hop_limit : 64;
	union ibv_gid sgid;
	bool sgid_ok = sv_gid_entry(dev, av->grh.sgid_index, &sgid, NULL) && av->grh.sgid_index &&
		       sv_gid_v4(sgid.raw) == r->v4;
	if (IN6_IS_ADDR_LINKLOCAL(&r->dst)) {
		/* A link-local address means something on one link only: the
		 * packet leaves by the source GID's interface. */
		r->ifindex = sgid_ok ? sv_gid_ifindex(dev, av->grh.sgid_index) : 0;
		if (!r->ifindex || !IN6_IS_ADDR_LINKLOCAL((const struct in6_addr *)sgid.raw)) {
			snprintf(buf, sizeof(buf), "dgid %s is link-local: grh.sgid_index must name "
				 "this host's link-local GID of the interface that link is on",
				 sv_route_addr(&r->dst, 0, a, sizeof(a)));
			*why = buf;
			return false;
		}
	}
	/* The source is the source GID's address, as a NIC sends from it;
	 * a GID of the other family (or GID[0], no address) leaves it to the
	 * kernel's choice. */
	if (sgid_ok)
		memcpy(&r->src, sgid.raw, 16);
	else if (!probe_src(r)) {
		snprintf(buf, sizeof(buf), "no route from this host to %s%s",
			 sv_route_addr(&r->dst, 0, a, sizeof(a)),
			 r->v4 ? "" : " (an IPv6 address: is IPv6 enabled on an interface that "
			 "reaches it?)");
		*why = buf;
		return false;
	}
	return true;
}

/* ---- a context's packet state ---- */

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
/* Contexts with packet state (live_next), for pkt_at_exit(). */
static struct pkt_ctx *live;

/* A forked child's copies of its parent's contexts are not its own: at
 * its exit it must neither acknowledge for them nor read their sockets,
 * which it shares with the parent. */
static void live_prepare(void) { pthread_mutex_lock(&open_lock); }
static void live_parent(void) { pthread_mutex_unlock(&open_lock); }
static void live_child(void)
{
	live = NULL;
	pthread_mutex_init(&open_lock, NULL);
}
static pthread_once_t live_once = PTHREAD_ONCE_INIT;
static void live_init(void) { pthread_atfork(live_prepare, live_parent, live_child); }

struct pkt_ctx *pkt_ctx_get(struct sv_context *c, char *why, size_t len)
{
	pthread_once(&live_once, live_init);
	pthread_mutex_lock(&open_lock);
	struct pkt_ctx *pc = c->pkt;

	if (pc) {
		pthread_mutex_unlock(&open_lock);
		return pc;
	}
	pc = calloc(1, sizeof(*pc));
	if (!pc) {
		pthread_mutex_unlock(&open_lock);
		snprintf(why, len, "out of memory");
		return NULL;
	}
	pc->ctx = c;
	pc->gsi_fd = pc->gsi_rx = -1;
	pc->st = &c->seg.h->pkt;
	pc->ops = c->tp_link;
	pthread_mutex_init(&pc->rx_lock, NULL);
	pthread_mutex_init(&pc->qps_lock, NULL);
	/* Published before the link starts: its thread reads c->pkt. */
	c->pkt = pc;
	pc->link = pc->ops->open(c, why, len);
	if (!pc->link) {
		c->pkt = NULL;
		pthread_mutex_destroy(&pc->rx_lock);
		pthread_mutex_destroy(&pc->qps_lock);
		free(pc);
		pc = NULL;
	} else {
		atomic_store_explicit(&pc->st->on, 1, memory_order_release);
		pc->live_next = live;
		live = pc;
	}
	pthread_mutex_unlock(&open_lock);
	return pc;
}

/*
 * The ACKs still due go out now: those a CQ poller held, and those of a
 * batch another thread is receiving, whose completions its application
 * may have seen already (taking rx_lock waits for that batch, whose end
 * sends them).  At exit() the wait is bounded: a thread stopped inside
 * the library for good must not keep the process from ending.
 */
static bool send_due_acks(struct pkt_ctx *pc, bool at_exit)
{
	if (at_exit) {
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 100000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		if (pthread_mutex_timedlock(&pc->rx_lock, &until))
			return false;
	} else {
		pthread_mutex_lock(&pc->rx_lock);
	}
	pkt_send_acks(pc);
	pc->ops->flush(pc->link);
	pthread_mutex_unlock(&pc->rx_lock);
	return true;
}

/* An application that saw its last completion and calls exit() without
 * closing its contexts still acknowledges what it received, and hands on
 * what its endpoints hold for other processes. */
__attribute__((destructor)) static void pkt_at_exit(void)
{
	pthread_mutex_lock(&open_lock);
	for (struct pkt_ctx *pc = live; pc; pc = pc->live_next)
		if (send_due_acks(pc, true))
			pc->ops->drain(pc->link);
	pthread_mutex_unlock(&open_lock);
}

struct sv_pkt_ep_stats *sv_pkt_ep_stats(struct sv_context *c)
{
	return &c->seg.h->pkt;
}

static void unhash(struct pkt_ctx *pc, struct pkt_qp *q)
{
	for (struct pkt_qp **p = &pc->hash[q->qpn % PKT_HASH]; *p; p = &(*p)->hnext)
		if (*p == q) {
			*p = q->hnext;
			break;
		}
	for (struct pkt_qp **p = &pc->acks; *p; p = &(*p)->ack_next)
		if (*p == q) {
			*p = q->ack_next;
			q->ack_listed = false;
			break;
		}
}

static void free_pq(struct pkt_ctx *pc, struct pkt_qp *q)
{
	pc->ops->sock_close(pc->link, q->fd);
	pkt_gpu_qp_free(q);
	free(q);
}

static bool tombs(struct pkt_ctx *pc)
{
	for (unsigned i = 0; i < PKT_HASH; i++)
		for (struct pkt_qp *q = pc->hash[i]; q; q = q->hnext)
			if (q->dead)
				return true;
	return false;
}

void sv_pkt_ctx_close(struct sv_context *c)
{
	struct pkt_ctx *pc = c->pkt;

	if (!pc)
		return;
	pthread_mutex_lock(&open_lock);
	for (struct pkt_ctx **p = &live; *p; p = &(*p)->live_next)
		if (*p == pc) {
			*p = pc->live_next;
			break;
		}
	pthread_mutex_unlock(&open_lock);
	send_due_acks(pc, false);
	pc->ops->drain(pc->link);
	/* Tombstones answer retransmissions while the link still runs. */
	for (int i = 0; i < 200; i++) {
		pthread_mutex_lock(&pc->rx_lock);
		bool any = tombs(pc);
		pthread_mutex_unlock(&pc->rx_lock);
		if (!any)
			break;
		struct timespec ts = { 0, 5000000 };
		nanosleep(&ts, NULL);
	}
	pkt_gsi_close(pc);
	pc->ops->close(pc->link);
	atomic_store_explicit(&pc->st->on, 0, memory_order_relaxed);
	for (unsigned i = 0; i < PKT_HASH; i++)
		while (pc->hash[i]) {
			struct pkt_qp *q = pc->hash[i];
			pc->hash[i] = q->hnext;
			free_pq(pc, q);	/* tombstones past the wait */
		}
	pkt_gpu_ctx_free(pc);
	c->pkt = NULL;
	pthread_mutex_destroy(&pc->rx_lock);
	pthread_mutex_destroy(&pc->qps_lock);
	free(pc);
}

bool sv_pkt_owns(struct sv_context *c, uint32_t qpn)
{
	struct pkt_ctx *pc = c->pkt;

	/* QP1 is every context's: its MADs go on by their CM IDs (gsi.c).
	 * So is the multicast QPN: each context that joined a group gets
	 * its own copy of the group's packets, for its own members. */
	return pc && (qpn == SV_GSI_QPN || qpn == SV_MCAST_QPN ||
		      sv_seg_qp(c->seg.h, qpn) != NULL);
}

/* Whether a QP of this context is still attached to the group. */
static bool ctx_member(struct sv_context *c, const union ibv_gid *mgid)
{
	uint32_t m[SV_MAX_MCAST_QP_ATTACH];
	int n = sv_reg_mcast_members(mgid, 0, true, m, (int)SV_ARRAY_SIZE(m));

	for (int i = 0; i < n; i++)
		if (sv_seg_qp(c->seg.h, m[i]))
			return true;
	return false;
}

/*
 * Across hosts a RoCEv2 multicast group is its IPv4 group address, as a
 * RoCE NIC joins it for an IPv4-mapped MGID (the kernel's
 * cma_iboe_join_multicast has the netdev join).  Failing to join is not
 * fatal: the QP still takes the group's packets from this host, which
 * the registry delivers (engine/req.c).
 */
void sv_pkt_mcast(struct sv_qp *qp, const union ibv_gid *mgid, bool join)
{
	char why[160];
	struct pkt_ctx *pc;

	if ((sv_config()->link != SV_LINK_ROCE && sv_config()->transport != SV_TRANSPORT_UDP) ||
	    !sv_gid_v4(mgid->raw))
		return;
	if (!join) {
		/* The last of the context's members leaving takes the
		 * membership with it; a destroyed QP's linger until the
		 * context closes, which costs packets only. */
		pc = qp->ctx->pkt;
		if (pc && !ctx_member(qp->ctx, mgid))
			pc->ops->mcast(pc->link, mgid, false, why, sizeof(why));
		return;
	}
	pc = pkt_ctx_get(qp->ctx, why, sizeof(why));
	if (!pc || pc->ops->mcast(pc->link, mgid, true, why, sizeof(why)))
		sv_explain("attach_mcast", "qpn 0x%x receives group %u.%u.%u.%u from this host "
			   "only: %s", qp->ex.qp_base.qp_num, mgid->raw[12], mgid->raw[13],
			   mgid->raw[14], mgid->raw[15], why);
}

/* A packet to a multicast group: each UD QP of this context attached to
 * the group (its IPv4 destination address) takes it, as every member
 * port of a switch gets a copy. */
static void mcast_rx(struct pkt_ctx *pc, const struct ib_bth *bth, const struct sv_link_pkt *p)
{
	union ibv_gid mgid;
	uint32_t m[SV_MAX_MCAST_QP_ATTACH];
	int n = 0, took = 0;

	memcpy(mgid.raw, &p->route.dst, 16);
	if (bth_tr(bth) == IB_TR_UD && sv_gid_v4(mgid.raw) && (mgid.raw[12] & 0xf0) == 0xe0)
		n = sv_reg_mcast_members(&mgid, 0, true, m, (int)SV_ARRAY_SIZE(m));
	for (int i = 0; i < n; i++) {
		struct pkt_qp *q = pkt_lookup(pc, m[i]);
		if (!q || q->dead || q->qp->ex.qp_base.qp_type != IBV_QPT_UD)
			continue;
		PKT_COUNT(q, rx_pkts);
		pkt_resp_rx(q, bth, p);
		took++;
	}
	if (!took)
		atomic_fetch_add_explicit(&pc->st->drop_unknown_qpn, 1, memory_order_relaxed);
}

static struct pkt_qp *qp_attach(struct sv_qp *qp, char *why, size_t len)
{
	if (qp->pq)
		return qp->pq;
	struct pkt_ctx *pc = pkt_ctx_get(qp->ctx, why, len);
	if (!pc)
		return NULL;
	struct pkt_qp *q = calloc(1, sizeof(*q));
	if (!q) {
		snprintf(why, len, "out of memory");
		return NULL;
	}
	q->qp = qp;
	q->pc = pc;
	q->qpn = qp->ex.qp_base.qp_num;
	enum ibv_qp_type t = qp->ex.qp_base.qp_type;
	q->tr = t == IBV_QPT_UC ? IB_TR_UC : t == IBV_QPT_UD ? IB_TR_UD :
		t == IBV_QPT_XRC_SEND || t == IBV_QPT_XRC_RECV ? IB_TR_XRC : IB_TR_RC;
	q->fd = pc->ops->sock(pc->link, &q->sport, why, len);
	if (q->fd < 0) {
		free(q);
		return NULL;
	}
	q->st = &qp->sh->pkt;
	q->st->sport = q->sport;
	pthread_mutex_lock(&pc->rx_lock);
	q->hnext = pc->hash[q->qpn % PKT_HASH];
	pc->hash[q->qpn % PKT_HASH] = q;
	pthread_mutex_unlock(&pc->rx_lock);
	qp->pq = q;
	return q;
}

/*
 * A destroyed QP that received requests lately lingers as a tombstone,
 * answering its peer's retransmissions of what it had acknowledged: the
 * last ACK may have been lost, and the peer would end in
 * IBV_WC_RETRY_EXC_ERR against a QP that did all it was asked
 * (ibv_rc_pingpong's server and client each exit as soon as their own
 * last completion arrives).  It lasts (retry_cnt + 1) ACK timeouts after
 * the last request it saw, the peer's whole retry budget when both ends
 * use the same attributes, as TCP's TIME-WAIT outlives a closed
 * connection; a QP that saw nothing within that time needs none.  A
 * closing context waits for its tombstones (sv_pkt_ctx_close), at most
 * 1 s.  The tombstone also sends its last ACK again, unasked, at once and
 * twice more a quarter of its life apart (a duplicate ACK is harmless,
 * IBA 9.7.5.1.2), so that the peer need not retransmit at all.
 */
static bool entomb(struct pkt_qp *q)
{
	struct sv_qp *qp = q->qp;
	enum ibv_qp_type t = qp->ex.qp_base.qp_type;
	uint64_t now = sv_now_ns();

	if ((t != IBV_QPT_RC && t != IBV_QPT_XRC_SEND && t != IBV_QPT_XRC_RECV) || !q->last_rx)
		return false;
	/* The peer's whole retry budget, as this end's attributes tell it:
	 * its last retransmission may come (retry_cnt + 1) timeouts after
	 * the request it repeats. */
	q->linger_ns = qp->attr.timeout ? sv_ack_timeout_ns(qp->attr.timeout) *
					  (qp->attr.retry_cnt + 1u) : 100000000ull;
	if (q->linger_ns > 1000000000ull)
		q->linger_ns = 1000000000ull;
	if (now - q->last_rx >= q->linger_ns)
		return false;
	q->linger_until = q->last_rx + q->linger_ns;
	/* The QP's block goes with it: a tombstone counts on its own. */
	atomic_store_explicit(&q->st->on, 0, memory_order_relaxed);
	q->st = &q->tomb_st;
	q->dead = true;
	q->qp = NULL;
	q->tomb_acks = 3;
	q->tomb_ack_at = now;
	q->pc->ops->want_tick(q->pc->link, now);
	return true;
}

void sv_pkt_qp_detach(struct sv_qp *qp)
{
	struct pkt_qp *q = qp->pq;

	if (!q)
		return;
	struct pkt_ctx *pc = q->pc;
	struct sv_pkt_qp_stats *st = q->st;
	sv_dbg("qpn 0x%x packets: %llu out, %llu in, %llu rewinds, %llu sequence NAKs, %llu RNR NAKs, "
	       "%llu duplicates, %llu dropped", q->qpn, (unsigned long long)atomic_load(&st->tx_pkts),
	       (unsigned long long)atomic_load(&st->rx_pkts),
	       (unsigned long long)atomic_load(&st->retrans),
	       (unsigned long long)atomic_load(&st->naks_seq),
	       (unsigned long long)atomic_load(&st->rnr_naks), (unsigned long long)atomic_load(&st->dups),
	       (unsigned long long)atomic_load(&st->drops));
	/* Under rx_lock, which every reception and tick holds: once it is
	 * out of the hash, or a tombstone, nothing of the link's reaches
	 * the QP. */
	pthread_mutex_lock(&pc->rx_lock);
	/* Its ACK, if a poller held it, before it leaves the list. */
	if (q->ack_due) {
		pkt_send_acks(pc);
		pkt_flush(q);
	}
	pthread_mutex_lock(&qp->sq_lock);
	qp->pq = NULL;
	qp->pq_remote = false;
	pthread_mutex_unlock(&qp->sq_lock);
	bool kept = entomb(q);
	if (!kept) {
		atomic_store_explicit(&q->st->on, 0, memory_order_relaxed);
		unhash(pc, q);
	}
	pthread_mutex_unlock(&pc->rx_lock);
	if (!kept)
		free_pq(pc, q);
}

static uint32_t mtu_bytes(enum ibv_mtu m)
{
	return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128u << m : 1024u;
}

/*
 * Each user's processes share a registry of their own (DESIGN §7: a
 * process trusts only its own user's), so a QP of another user on this
 * host is out of reach: its packets would go unanswered, and both sides
 * would wait out the retry budget in silence.  Each user allocates QPNs
 * from a range of its own (sv_qpn_base), so a connected QP whose
 * destination is on this host and outside this user's range fails the
 * move to RTR at once, when another user runs softverbs here.  Without one
 * the number is no QP of this host's, as a NIC would not know either.
 */
static int other_user(struct sv_qp *qp, const struct ibv_qp_attr *a, int mask, char *why,
		      size_t len)
{
	enum ibv_qp_type type = qp->ex.qp_base.qp_type;
	uint32_t dest = (mask & IBV_QP_DEST_QPN ? a->dest_qp_num : qp->attr.dest_qp_num) &
			SV_QPN_MASK;
	uid_t uid;

	if ((type != IBV_QPT_RC && type != IBV_QPT_UC) || sv_qpn_ours(dest) ||
	    !sv_reg_other_user(&uid))
		return 0;
	snprintf(why, len, "dest_qp_num 0x%x is no QP of user %u's on this host, and user %u runs "
		 "softverbs here too: processes of two users do not reach each other on one host; "
		 "run both sides as one user", dest, (unsigned)getuid(), (unsigned)uid);
	return EINVAL;
}

int sv_pkt_qp_route(struct sv_qp *qp, const struct ibv_qp_attr *a, int mask, char *why,
		    size_t len)
{
	enum ibv_qp_type type = qp->ex.qp_base.qp_type;
	enum ibv_qp_state next = a->qp_state;
	/* Whether another host can address this QP: by GID, or by LID
	 * (SOFTVERBS_LID=addr); forced packets reach it on this one. */
	bool reachable = sv_config()->link == SV_LINK_ROCE ||
			 sv_config()->transport == SV_TRANSPORT_UDP ||
			 sv_port_lid_routed(qp->ctx->dev);

	if (!(mask & IBV_QP_STATE))
		return 0;
	if (next == IBV_QPS_RTS && qp->pq && qp->pq_remote) {
		/* The requester starts at sq_psn (IBA 9.7.1). */
		struct pkt_qp *q = qp->pq;
		pthread_mutex_lock(&qp->sq_lock);
		uint32_t psn = (mask & IBV_QP_SQ_PSN ? a->sq_psn : qp->attr.sq_psn) & SV_PSN_MASK;
		if (qp->ex.qp_base.state == IBV_QPS_RTR)
			pkt_req_start(q, psn);
		unsigned rd = mask & IBV_QP_MAX_QP_RD_ATOMIC ? a->max_rd_atomic :
			      qp->attr.max_rd_atomic;
		q->max_rd = rd ? rd : 1;
		q->retry_left = mask & IBV_QP_RETRY_CNT ? a->retry_cnt : qp->attr.retry_cnt;
		unsigned rnr = mask & IBV_QP_RNR_RETRY ? a->rnr_retry : qp->attr.rnr_retry;
		q->rnr_left = rnr == 7 ? -1 : (int)rnr;
		pthread_mutex_unlock(&qp->sq_lock);
		return 0;
	}
	if (next != IBV_QPS_RTR || qp->ex.qp_base.state != IBV_QPS_INIT)
		return 0;
	if (type == IBV_QPT_UD || type == IBV_QPT_XRC_RECV) {
		/* Anyone may send to these: receive packets too when another
		 * host could reach this one.  Not fatal: shm works without. */
		if (reachable && !qp_attach(qp, why, len))
			sv_explain("modify_qp", "qpn 0x%x receives from this host only: %s",
				   qp->ex.qp_base.qp_num, why);
		else if (qp->pq)	/* any peer: none named */
			atomic_store_explicit(&qp->pq->st->on, 1, memory_order_release);
		if (type == IBV_QPT_UD || !qp->pq)
			return 0;
	}
	if (type != IBV_QPT_RC && type != IBV_QPT_UC && type != IBV_QPT_XRC_SEND &&
	    type != IBV_QPT_XRC_RECV)
		return 0;
	const struct ibv_ah_attr *av = mask & IBV_QP_AV ? &a->ah_attr : &qp->attr.ah_attr;
	struct sv_route r;
	const char *bad;
	if (!sv_route_remote(qp->ctx->dev, av, &r, &bad)) {
		if (bad && type != IBV_QPT_XRC_RECV) {
			snprintf(why, len, "%s", bad);
			return EINVAL;
		}
		if (type != IBV_QPT_XRC_RECV)
			sv_pkt_qp_detach(qp);
		return other_user(qp, a, mask, why, len);
	}
	struct pkt_qp *q = qp_attach(qp, why, len);
	if (!q)
		return EADDRNOTAVAIL;
	pthread_mutex_lock(&q->pc->rx_lock);
	q->peer = r;
	q->src_lid = av->dlid;
	/* No packet larger than the link carries: the path MTU, within the
	 * port's (an interface's MTU, sv_port_mtu). */
	q->mtu = mtu_bytes(mask & IBV_QP_PATH_MTU ? a->path_mtu : qp->attr.path_mtu);
	if (q->mtu > mtu_bytes(sv_port_mtu(qp->ctx->dev)))
		q->mtu = mtu_bytes(sv_port_mtu(qp->ctx->dev));
	q->dest_qpn = (mask & IBV_QP_DEST_QPN ? a->dest_qp_num : qp->attr.dest_qp_num) &
		      SV_QPN_MASK;
	q->epsn = (mask & IBV_QP_RQ_PSN ? a->rq_psn : qp->attr.rq_psn) & SV_PSN_MASK;
	q->msn = 0;
	pkt_resp_reset(q);
	q->st->dest_qpn = q->dest_qpn;
	memcpy(q->st->peer, &r.dst, sizeof(q->st->peer));
	/* Pairs with softverbs status's acquire load: the peer is set. */
	atomic_store_explicit(&q->st->on, 1, memory_order_release);
	pthread_mutex_unlock(&q->pc->rx_lock);
	pthread_mutex_lock(&qp->sq_lock);
	qp->pq_remote = type != IBV_QPT_XRC_RECV;
	pthread_mutex_unlock(&qp->sq_lock);
	return 0;
}

void sv_pkt_poll(struct sv_context *c, bool armed)
{
	struct pkt_ctx *pc = c->pkt;

	if (pc)
		pc->ops->poll(pc->link, armed);
}

/* ---- sending ---- */

int pkt_send(struct pkt_qp *q, const struct sv_route *r, const void *hdr, size_t hlen,
	     const struct iovec *payload, int np, size_t plen)
{
	struct iovec iov[SV_MAX_SGE + 3];
	static const uint8_t zero[4];
	unsigned pad = (unsigned)(-plen & 3);
	int n = 0;

	iov[n++] = (struct iovec){ (void *)hdr, hlen };
	for (int i = 0; i < np; i++)
		if (payload[i].iov_len)
			iov[n++] = payload[i];
	if (pad)
		iov[n++] = (struct iovec){ (void *)zero, pad };
	/* A pulled cable (softverbs port DEV/1 down) carries nothing: RC
	 * work times out and retries as on a real port (C9-140). */
	if (SV_PORT_DOWN(sv_reg_port(q->pc->ctx->dev->index)))
		return 0;
	struct sv_route rt = *r;
	rt.sport = q->sport;
	PKT_COUNT(q, tx_pkts);
	return q->pc->ops->send(q->pc->link, q->fd, &rt, iov, n, hlen + plen + pad);
}

/* ---- reception ---- */

bool sv_pkt_rx_lock(struct sv_context *c, bool wait)
{
	struct pkt_ctx *pc = c->pkt;

	if (!pc)
		return false;
	if (wait) {
		pthread_mutex_lock(&pc->rx_lock);
		return true;
	}
	return !pthread_mutex_trylock(&pc->rx_lock);
}

void pkt_send_acks(struct pkt_ctx *pc)
{
	/* Coalesced ACKs: one per QP per batch (IBA 9.7.5.1.1 lets a
	 * responder acknowledge several packets with one ACK). */
	while (pc->acks) {
		struct pkt_qp *q = pc->acks;
		pc->acks = q->ack_next;
		q->ack_next = NULL;
		q->ack_listed = false;
		if (q->ack_due)
			pkt_resp_ack(q);
	}
	atomic_store_explicit(&pc->acks_held, false, memory_order_relaxed);
}

void sv_pkt_rx_unlock(struct sv_context *c)
{
	struct pkt_ctx *pc = c->pkt;

	/* The batch's data is in place before anything acknowledges it. */
	pkt_gpu_flush(pc);
	pkt_send_acks(pc);
	pc->ops->flush(pc->link);
	pthread_mutex_unlock(&pc->rx_lock);
}

/*
 * A thread polling a CQ received: its application is about to see the
 * completions, and the ACKs' system call would stand between them.  So
 * the ACKs this batch made wait: for the application's next post on a
 * QP of this context, which sends them in its own system call
 * (sv_pkt_sq_run: a ping-pong's reply carries its ACK), or for the next
 * poll, which sends what an earlier one held, or at the latest for the
 * tick the link runs once the polls stop (sv_transport_ops.poll).
 * Responses (READ, atomic) and NAKs leave at once.  An ACK may be
 * delayed (IBA 9.7.5.1.1 sets no deadline below the requester's
 * timeout); the udp link's bound, 2 ms, is far below the smallest one in
 * use.  The link's own thread holds its batch's ACKs this way too when
 * the application polled a moment ago and waits for data in memory, not
 * on a CQ (a one-sided ping-pong), and ticks within 200 us.
 */
bool sv_pkt_rx_unlock_poller(struct sv_context *c)
{
	struct pkt_ctx *pc = c->pkt;
	bool hold;

	pkt_gpu_flush(pc);
	hold = pc->acks && !atomic_load_explicit(&pc->acks_held, memory_order_relaxed);
	if (hold)
		atomic_store_explicit(&pc->acks_held, true, memory_order_relaxed);
	else
		pkt_send_acks(pc);
	pc->ops->flush(pc->link);
	pthread_mutex_unlock(&pc->rx_lock);
	return hold;
}

static bool same_addr(const struct sv_route *a, const struct in6_addr *b)
{
	return !memcmp(&a->dst, b, sizeof(*b));
}

/* IBA 9.6.1: a packet's opcode must belong to the QP's
 * transport: an RC packet for a UC QP and the like are dropped. */
static bool transport_ok(enum ibv_qp_type t, unsigned tr)
{
	switch (t) {
	case IBV_QPT_RC: return tr == IB_TR_RC;
	case IBV_QPT_UC: return tr == IB_TR_UC;
	case IBV_QPT_UD: return tr == IB_TR_UD;
	case IBV_QPT_XRC_SEND: case IBV_QPT_XRC_RECV: return tr == IB_TR_XRC;
	default: return false;
	}
}

void sv_pkt_rx(struct sv_context *c, const struct sv_link_pkt *p)
{
	struct pkt_ctx *pc = c->pkt;
	const struct ib_bth *bth = (const struct ib_bth *)p->buf;

	if (SV_PORT_DOWN(sv_reg_port(c->dev->index)))
		return;	/* nothing arrives through a port that is down */
	/* Header checks (IBA 9.6.1.1): room for BTH, a known opcode of a
	 * known transport, TVer 0, and room for its headers and pad. */
	if (p->len < sizeof(*bth) || bth_tver(bth) != 0 ||
	    !ib_opinfo[bth_op(bth)].name ||
	    !(ib_opinfo[bth_op(bth)].types & IBT(bth_tr(bth))) ||
	    p->len < sizeof(*bth) + ib_hdr_len(bth->opcode) + bth_pad(bth)) {
		atomic_fetch_add_explicit(&pc->st->drop_bad_hdr, 1, memory_order_relaxed);
		return;
	}
	if (bth_qpn(bth) == SV_GSI_QPN) {
		pkt_gsi_rx(pc, p);
		return;
	}
	if (bth_qpn(bth) == SV_MCAST_QPN) {
		mcast_rx(pc, bth, p);
		return;
	}
	struct pkt_qp *q = pkt_lookup(pc, bth_qpn(bth));
	if (q && q->dead) {
		if (same_addr(&q->peer, &p->route.src) && bth_tr(bth) == q->tr &&
		    !(ib_opinfo[bth_op(bth)].flags & IBH_RESP))
			pkt_resp_tomb(q, bth);
		return;
	}
	if (!q || !transport_ok(q->qp->ex.qp_base.qp_type, bth_tr(bth))) {
		atomic_fetch_add_explicit(&pc->st->drop_unknown_qpn, 1, memory_order_relaxed);
		return;
	}
	/* A connected QP takes packets from its peer's address only
	 * (IBA 9.6.1.5: the source must match the QP's destination). */
	if (q->qp->ex.qp_base.qp_type != IBV_QPT_UD && !same_addr(&q->peer, &p->route.src)) {
		atomic_fetch_add_explicit(&pc->st->drop_bad_src, 1, memory_order_relaxed);
		return;
	}
	PKT_COUNT(q, rx_pkts);
	if (ib_opinfo[bth_op(bth)].flags & IBH_RESP)
		pkt_req_rx(q, bth, p);
	else
		pkt_resp_rx(q, bth, p);
}

uint64_t sv_pkt_tick(struct sv_context *c, uint64_t now)
{
	struct pkt_ctx *pc = c->pkt;
	uint64_t next = 0;

	if (!pc)
		return 0;
	pthread_mutex_lock(&pc->rx_lock);
	for (unsigned i = 0; i < PKT_HASH; i++)
		for (struct pkt_qp *q = pc->hash[i], *nx; q; q = nx) {
			nx = q->hnext;
			if (q->dead) {
				if (now >= q->linger_until) {
					unhash(pc, q);
					free_pq(pc, q);
					continue;
				}
				if (q->tomb_acks && now >= q->tomb_ack_at) {
					pkt_resp_tomb_ack(q);
					q->tomb_acks--;
					q->tomb_ack_at = now + q->linger_ns / 4;
				}
				uint64_t t = q->tomb_acks && q->tomb_ack_at < q->linger_until ?
					     q->tomb_ack_at : q->linger_until;
				if (!next || t < next)
					next = t;
				continue;
			}
			uint64_t t = pkt_req_tick(q, now);
			if (t && (!next || t < next))
				next = t;
		}
	sv_pkt_rx_unlock(c);
	return next;
}
