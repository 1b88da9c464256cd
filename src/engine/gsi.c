/* SPDX-License-Identifier: MIT */
/*
 * QP1, the GSI, of a context's packet endpoint: CM MADs to and from other
 * hosts (src/gsi.h).
 *
 * Out: softverbs_gsi_send() wraps a MAD librdmacm formatted in BTH, DETH
 * and ICRC and sends it from the context's GSI socket.
 *
 * In: a packet for QP1, whichever context of the host the kernel gave it
 * to, is checked as the GSI checks it (a UD SEND_ONLY with the GSI's
 * Q_Key, one 256-byte MAD of the CM class) and handed to the abstract
 * name its service ID or communication ID gives.  What has no taker is
 * answered here, as ib_cm answers it when it finds no cm_id
 * (sv_cm_no_taker): the process that got it may not have librdmacm.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "../core/guard.h"
#include "../core/rawsock.h"
#include "../gsi.h"
#include "pkt.h"

struct gsi_pkt {
	struct ib_bth bth;
	struct ib_deth deth;
	uint8_t mad[SV_MAD_SIZE];
} __attribute__((packed));
_Static_assert(sizeof(struct gsi_pkt) == 12 + 8 + SV_MAD_SIZE, "BTH, DETH and a MAD");

static uint16_t be16_at(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t be32_at(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static uint64_t be64_at(const uint8_t *p) { return (uint64_t)be32_at(p) << 32 | be32_at(p + 4); }

/* Where in a MAD a CM message's fields sit: the common header, then the
 * message (IBA 12.6.5 and following). */
#define CM_DATA(off)	(SV_MAD_HDR + (off))

static int gsi_fd(struct pkt_ctx *pc, uint16_t *port)
{
	char why[128];

	pthread_mutex_lock(&pc->qps_lock);
	if (pc->gsi_fd < 0 && !pc->gsi_closed)
		pc->gsi_fd = pc->ops->sock(pc->link, &pc->gsi_port, why, sizeof(why));
	else if (pc->gsi_closed)
		snprintf(why, sizeof(why), "the context is closing");
	int fd = pc->gsi_fd;
	*port = pc->gsi_port;
	pthread_mutex_unlock(&pc->qps_lock);
	if (fd < 0)
		sv_dbg("gsi: %s", why);
	return fd;
}

/* IBA 13.5.1: GSI MADs leave QP1 for QP1, on the default P_Key. */
static void gsi_packet(struct pkt_ctx *pc, struct gsi_pkt *p, const uint8_t *mad)
{
	uint32_t psn = atomic_fetch_add_explicit(&pc->gsi_psn, 1, memory_order_relaxed);

	bth_set(&p->bth, IB_TR_UD | IB_OP_SEND_ONLY, false, 0, 0xffff, SV_GSI_QPN, false, psn);
	p->deth.qkey = htobe32(SV_GSI_QKEY);
	p->deth.sqp = htobe32(SV_GSI_QPN);
	memcpy(p->mad, mad, SV_MAD_SIZE);
}

static int send_mad(struct pkt_ctx *pc, const struct sv_route *r, const uint8_t *mad)
{
	struct gsi_pkt p;
	uint16_t port;
	int fd = gsi_fd(pc, &port);

	if (fd < 0)
		return EMFILE;
	if (SV_PORT_DOWN(sv_reg_port(pc->ctx->dev->index)))
		return 0;	/* a pulled cable carries nothing; the CM retries */
	gsi_packet(pc, &p, mad);
	struct sv_route rt = *r;
	rt.sport = port;
	/* Headers, then payload: the link copies the one and references the other. */
	struct iovec v[2] = { { &p, offsetof(struct gsi_pkt, mad) }, { p.mad, SV_MAD_SIZE } };
	int err = pc->ops->send(pc->link, fd, &rt, v, 2, sizeof(p));
	pc->ops->flush(pc->link);
	return err;
}

SV_EXPORT int softverbs_gsi_open(struct ibv_context *ibctx)
{
	char why[128];

	if (!ibctx || !pkt_ctx_get(sv_ctx(ibctx), why, sizeof(why))) {
		if (ibctx)
			sv_dbg("gsi: %s", why);
		errno = ibctx ? EIO : EINVAL;
		return -1;
	}
	return 0;
}

/* The arguments of softverbs_gsi_send and _will: the context's packet
 * endpoint and the route, or NULL with errno set. */
static struct pkt_ctx *gsi_route(struct ibv_context *ibctx, const uint8_t *sgid, const uint8_t *dgid,
				 uint8_t tclass, const uint8_t *mad, struct sv_route *r)
{
	char why[128];
	struct pkt_ctx *pc;

	if (!ibctx || !sgid || !dgid || !mad) {
		errno = EINVAL;
		return NULL;
	}
	if (!sv_gid_v4(sgid) || !sv_gid_v4(dgid)) {
		errno = EAFNOSUPPORT;	/* rdma_cm across hosts is IPv4 only */
		return NULL;
	}
	pc = pkt_ctx_get(sv_ctx(ibctx), why, sizeof(why));
	if (!pc) {
		sv_dbg("gsi: %s", why);
		errno = EIO;
		return NULL;
	}
	*r = (struct sv_route){ .tclass = tclass, .ttl = 64, .v4 = true };
	memcpy(&r->src, sgid, 16);
	memcpy(&r->dst, dgid, 16);
	return pc;
}

SV_EXPORT int softverbs_gsi_send(struct ibv_context *ibctx, const uint8_t sgid[16],
				 const uint8_t dgid[16], uint8_t tclass,
				 const uint8_t mad[SV_MAD_SIZE])
{
	struct sv_route r;
	struct pkt_ctx *pc = gsi_route(ibctx, sgid, dgid, tclass, mad, &r);

	if (!pc)
		return -1;
	int err = send_mad(pc, &r, mad);
	if (err) {
		errno = err;
		return -1;
	}
	return 0;
}

SV_EXPORT int softverbs_gsi_will(struct ibv_context *ibctx, uint64_t key, const uint8_t sgid[16],
				 const uint8_t dgid[16], uint8_t tclass,
				 const uint8_t mad[SV_MAD_SIZE])
{
	struct sv_route r;
	struct pkt_ctx *pc = gsi_route(ibctx, sgid, dgid, tclass, mad, &r);
	struct gsi_pkt p;
	struct sv_frame f;
	uint16_t port;

	if (!pc)
		return -1;
	int fd = gsi_fd(pc, &port);
	if (fd < 0) {
		errno = EMFILE;
		return -1;
	}
	gsi_packet(pc, &p, mad);
	r.sport = port;
	struct iovec v = { &p, sizeof(p) };
	int err = pc->ops->frame(pc->link, &r, &v, 1, sizeof(p), &f);
	if (!err)
		err = sv_guard_add(key, fd, &f);
	if (err) {
		errno = err;
		return -1;
	}
	return 0;
}

SV_EXPORT void softverbs_gsi_will_cancel(uint64_t key)
{
	sv_guard_del(key);
}

/* Nobody takes it: the answer ib_cm gives in place of its cm_id's. */
static void answer(struct pkt_ctx *pc, const struct sv_link_pkt *p, const uint8_t *in)
{
	uint8_t out[SV_MAD_SIZE];

	if (!sv_cm_no_taker(in, out))
		return;
	struct sv_route r = { .src = p->route.dst, .dst = p->route.src, .tclass = p->route.tclass,
			      .ttl = 64, .v4 = p->route.v4, .ifindex = p->route.ifindex };
	send_mad(pc, &r, out);
}

void pkt_gsi_rx(struct pkt_ctx *pc, const struct sv_link_pkt *p)
{
	const struct gsi_pkt *g = (const struct gsi_pkt *)p->buf;

	/* C13-? (IBA 13.5.1): QP1 takes UD SENDs with the GSI's Q_Key;
	 * MADs are 256 bytes.  Only the CM class has a taker here. */
	if (p->len != sizeof(*g) || g->bth.opcode != (IB_TR_UD | IB_OP_SEND_ONLY) ||
	    be32toh(g->deth.qkey) != SV_GSI_QKEY || g->mad[0] != 1 ||
	    g->mad[1] != SV_MGMT_CLASS_CM || g->mad[2] != SV_CM_CLASS_VERSION) {
		atomic_fetch_add_explicit(&pc->st->drop_bad_hdr, 1, memory_order_relaxed);
		return;
	}
	uint16_t attr = be16_at(&g->mad[16]);
	enum sv_gsi_key k = SV_GSI_COMM;
	uint64_t id;
	if (attr == SV_CM_ATTR_REQ || attr == SV_CM_ATTR_SIDR_REQ) {
		k = SV_GSI_SVC;
		id = be64_at(&g->mad[CM_DATA(8)]);
	} else if (attr == SV_CM_ATTR_SIDR_REP) {
		id = be32_at(&g->mad[CM_DATA(0)]);	/* the requester's Request ID */
	} else {
		id = be32_at(&g->mad[CM_DATA(4)]);	/* Remote Communication ID */
	}
	struct sv_gsi_dgram d = { .src_port = p->route.sport, .tclass = p->route.tclass };
	memcpy(d.src_gid, &p->route.src, 16);
	memcpy(d.dst_gid, &p->route.dst, 16);
	memcpy(d.mad, g->mad, SV_MAD_SIZE);
	struct sockaddr_un u;
	socklen_t ul = sv_gsi_name(&u, k, id);
	pthread_mutex_lock(&pc->qps_lock);
	if (pc->gsi_rx < 0 && !pc->gsi_closed) {
		pc->gsi_rx = sv_socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		/* A short wait, as the link's forwarder waits: a fresh network
		 * namespace queues only 10 datagrams on an AF_UNIX socket
		 * (net.unix.max_dgram_qlen), and a listener's burst of REQs
		 * would lose the rest to a CM timeout. */
		struct timeval tv = { 0, 2000 };
		if (pc->gsi_rx >= 0)
			setsockopt(pc->gsi_rx, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	}
	int fd = pc->gsi_rx;
	pthread_mutex_unlock(&pc->qps_lock);
	/* A taker that does not read within the wait loses the MAD, which
	 * the CM's retries cover. */
	if (fd >= 0 && sendto(fd, &d, sizeof(d), 0, (struct sockaddr *)&u, ul) ==
	    (ssize_t)sizeof(d))
		return;
	int err = errno;
	atomic_fetch_add_explicit(&pc->st->drop_unknown_qpn, 1, memory_order_relaxed);
	if (err == ECONNREFUSED || err == ENOENT)
		answer(pc, p, g->mad);	/* no such name: nobody holds the ID */
	else
		sv_dbg("gsi: CM attribute 0x%04x for %s %llx dropped: %s", attr,
		       k == SV_GSI_SVC ? "service" : "communication ID", (unsigned long long)id,
		       strerror(err));
}

void pkt_gsi_close(struct pkt_ctx *pc)
{
	/* The link's thread may be handing a MAD on (rx_lock, then qps_lock). */
	pthread_mutex_lock(&pc->rx_lock);
	pthread_mutex_lock(&pc->qps_lock);
	if (pc->gsi_fd >= 0)
		pc->ops->sock_close(pc->link, pc->gsi_fd);
	if (pc->gsi_rx >= 0)
		close(pc->gsi_rx);
	pc->gsi_fd = pc->gsi_rx = -1;
	pc->gsi_closed = true;	/* nothing reopens them while the link stops */
	pthread_mutex_unlock(&pc->qps_lock);
	pthread_mutex_unlock(&pc->rx_lock);
}
