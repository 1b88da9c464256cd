/* SPDX-License-Identifier: MIT */
/*
 * Connection messages across hosts: the IBTA CM's MADs (chapter 12),
 * sent from QP1 to QP1 through libibverbs' packet engine (src/gsi.h).
 *
 * An id whose peer is on another host is "remote".  Its messages are the
 * same struct cm_msg the same-host path sends over its socket, and the
 * same handlers in conn.c take them; only the wire differs:
 *
 *   - out, a message is formatted as its MAD (the layouts of IBA tables
 *     106 to 120, with rdma_cm's 36-byte header first in a REQ's or
 *     SIDR_REQ's private data, as the kernel's cma_format_hdr writes it)
 *     and sent to the peer's QP1;
 *   - in, a listener takes REQs and SIDR_REQs for its service ID on a
 *     datagram socket of that name, and a connection takes every other
 *     message on one named after its local communication ID.
 *
 * MADs are datagrams, so what ib_cm retries, this retries: a REQ, REP or
 * DREQ unanswered within one CM response timeout goes again, up to
 * cm_retries times, and a repeated REQ, REP or DREQ is answered with the
 * REP, RTU or DREP sent before (ib_cm's cm_dup_req_handler and
 * cm_dup_rep_handler).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../core/rawsock.h"
#include "../gsi.h"
#include "cm.h"

#define D(off)	(SV_MAD_HDR + (off))	/* a message field's offset in the MAD */

/* Private data offsets (IBA tables 106 to 120). */
enum {
	REQ_PDATA = 140, REP_PDATA = 36, RTU_PDATA = 8, REJ_PDATA = 84, DREQ_PDATA = 12,
	DREP_PDATA = 8, MRA_PDATA = 10, SIDR_REQ_PDATA = 16, SIDR_REP_PDATA = 96,
};

static TAILQ_HEAD(, cm_id) remote_ids = TAILQ_HEAD_INITIALIZER(remote_ids);

/* ---- big-endian fields ---- */
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static void put24(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 16);
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)v;
}
static void put32(uint8_t *p, uint32_t v) { put16(p, (uint16_t)(v >> 16)); put16(p + 2, (uint16_t)v); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get24(const uint8_t *p) { return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2]; }
static uint32_t get32(const uint8_t *p) { return (uint32_t)get16(p) << 16 | get16(p + 2); }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }

/* The kernel's cma_get_service_id: the port space above the port. */
uint64_t cm_service_id(enum rdma_port_space ps, uint16_t port)
{
	return (uint64_t)ps << 16 | port;
}

static int private_offset(enum cm_msg_type t)
{
	switch (t) {
	case CM_MSG_REQ: return REQ_PDATA;
	case CM_MSG_REP: return REP_PDATA;
	case CM_MSG_RTU: return RTU_PDATA;
	case CM_MSG_REJ: return REJ_PDATA;
	case CM_MSG_DREQ: return DREQ_PDATA;
	case CM_MSG_DREP: return DREP_PDATA;
	case CM_MSG_MRA: return MRA_PDATA;
	case CM_MSG_SIDR_REQ: return SIDR_REQ_PDATA;
	case CM_MSG_SIDR_REP: return SIDR_REP_PDATA;
	}
	return -1;
}

/* ---- rdma_cm's header in a REQ's private data (kernel cma_hdr) ---- */
static void put_ip(uint8_t *p, const struct sockaddr_storage *a)
{
	if (a->ss_family == AF_INET)
		memcpy(p + 12, &((const struct sockaddr_in *)a)->sin_addr, 4);
	else
		memcpy(p, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
}

static void put_cma_hdr(uint8_t *p, const struct cm_msg *m)
{
	p[0] = 0;	/* CMA_VERSION */
	p[1] = (uint8_t)((m->src.ss_family == AF_INET6 ? 6 : 4) << 4);
	put16(p + 2, cm_addr_port((const struct sockaddr *)&m->src));
	put_ip(p + 4, &m->src);
	put_ip(p + 20, &m->dst);
}

static bool get_cma_hdr(const uint8_t *p, uint16_t dport, struct cm_msg *m)
{
	unsigned v = p[1] >> 4;

	if (p[0] != 0 || (v != 4 && v != 6))
		return false;
	memset(&m->src, 0, sizeof(m->src));
	memset(&m->dst, 0, sizeof(m->dst));
	if (v == 4) {
		struct sockaddr_in *s = (struct sockaddr_in *)&m->src, *d = (struct sockaddr_in *)&m->dst;

		s->sin_family = d->sin_family = AF_INET;
		memcpy(&s->sin_addr, p + 16, 4);
		memcpy(&d->sin_addr, p + 32, 4);
	} else {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)&m->src,
				    *d = (struct sockaddr_in6 *)&m->dst;

		s->sin6_family = d->sin6_family = AF_INET6;
		memcpy(&s->sin6_addr, p + 4, 16);
		memcpy(&d->sin6_addr, p + 20, 16);
	}
	cm_addr_set_port((struct sockaddr *)&m->src, get16(p + 2));
	cm_addr_set_port((struct sockaddr *)&m->dst, dport);
	return true;
}

/* IBA 12.7.2 transport service type; XRC is type 3 with extended type 1. */
static void put_qp_type(uint8_t *mad, uint8_t qpt)
{
	unsigned tst = qpt == IBV_QPT_UC ? 1 : qpt == IBV_QPT_XRC_SEND ? 3 : 0;

	mad[D(43)] = (uint8_t)((mad[D(43)] & ~0x06) | tst << 1);
	if (tst == 3)
		mad[D(51)] = (uint8_t)((mad[D(51)] & ~0x07) | 1);
}

static uint8_t get_qp_type(const uint8_t *mad)
{
	unsigned tst = (mad[D(43)] >> 1) & 3;

	return tst == 1 ? IBV_QPT_UC : tst == 3 ? IBV_QPT_XRC_SEND : IBV_QPT_RC;
}

/* ---- formatting ---- */
static void format(const struct cm_id *c, const struct cm_msg *m, uint8_t *mad)
{
	int po = private_offset((enum cm_msg_type)m->type);
	uint8_t tmo = (uint8_t)softverbs_cm_setting("cm_timeout");

	memset(mad, 0, SV_MAD_SIZE);
	mad[0] = 1;			/* BaseVersion */
	mad[1] = SV_MGMT_CLASS_CM;
	mad[2] = SV_CM_CLASS_VERSION;
	mad[3] = 0x03;			/* Send (IBA 13.4.5) */
	put64(&mad[8], c->tid);
	put16(&mad[16], m->type);
	switch (m->type) {
	case CM_MSG_REQ:
		put32(&mad[D(0)], c->local_comm_id);
		put24(&mad[D(5)], m->ece.vendor_id);
		put64(&mad[D(8)], cm_service_id(c->id.ps, cm_addr_port((const struct sockaddr *)&m->dst)));
		put64(&mad[D(16)], be64toh(ibv_get_device_guid(c->id.verbs->device)));
		put32(&mad[D(28)], m->qkey);
		put24(&mad[D(32)], m->qpn);
		mad[D(35)] = m->responder_resources;
		put24(&mad[D(36)], m->ece.options);
		mad[D(39)] = m->initiator_depth;
		mad[D(43)] = (uint8_t)(tmo << 3 | (m->flags & CM_F_FLOW_CONTROL ? 1 : 0));
		put_qp_type(mad, m->qp_type);
		put24(&mad[D(44)], m->psn);
		mad[D(47)] = (uint8_t)(tmo << 3 | (m->retry_count & 7));
		put16(&mad[D(48)], 0xffff);
		mad[D(50)] = (uint8_t)((c->id.route.path_rec && c->id.route.path_rec->mtu ?
					 c->id.route.path_rec->mtu : IBV_MTU_1024) << 4 |
				       (m->rnr_retry_count & 7));
		mad[D(51)] = (uint8_t)((mad[D(51)] & 0x07) |
				       (softverbs_cm_setting("cm_retries") & 0xf) << 4 |
				       (m->flags & CM_F_SRQ ? 0x08 : 0));
		put16(&mad[D(52)], 0xffff);	/* LIDs: permissive, as ib_cm on RoCE */
		put16(&mad[D(54)], 0xffff);
		memcpy(&mad[D(56)], c->id.route.addr.addr.ibaddr.sgid.raw, 16);
		memcpy(&mad[D(72)], c->id.route.addr.addr.ibaddr.dgid.raw, 16);
		mad[D(91)] = 3;			/* IB_RATE_10_GBPS */
		mad[D(92)] = c->tos;
		mad[D(93)] = 64;
		/* The local ACK timeout the QP gets (qp.c), 5 bits. */
		mad[D(95)] = (uint8_t)(((c->ack_timeout_set ? c->ack_timeout : 18) & 0x1f) << 3);
		put_cma_hdr(&mad[D(po)], m);
		memcpy(&mad[D(po) + CM_IP_HDR], m->pdata, m->pdata_len);
		return;
	case CM_MSG_SIDR_REQ:
		put32(&mad[D(0)], c->local_comm_id);
		put16(&mad[D(4)], 0xffff);
		put64(&mad[D(8)], cm_service_id(c->id.ps, cm_addr_port((const struct sockaddr *)&m->dst)));
		put_cma_hdr(&mad[D(po)], m);
		memcpy(&mad[D(po) + CM_IP_HDR], m->pdata, m->pdata_len);
		return;
	case CM_MSG_SIDR_REP:
		put32(&mad[D(0)], c->remote_comm_id);
		mad[D(4)] = (uint8_t)m->reason;
		put24(&mad[D(8)], m->qpn);
		put64(&mad[D(12)], cm_service_id(c->id.ps, c->port));
		put32(&mad[D(20)], m->qkey);
		break;
	default:
		put32(&mad[D(0)], c->local_comm_id);
		put32(&mad[D(4)], c->remote_comm_id);
		break;
	}
	switch (m->type) {
	case CM_MSG_REP:
		put32(&mad[D(8)], m->qkey);
		put24(&mad[D(12)], m->qpn);
		put24(&mad[D(20)], m->psn);
		mad[D(24)] = m->responder_resources;
		mad[D(25)] = m->initiator_depth;
		mad[D(26)] = m->flags & CM_F_FLOW_CONTROL ? 1 : 0;
		mad[D(27)] = (uint8_t)((m->rnr_retry_count & 7) << 5 | (m->flags & CM_F_SRQ ? 0x10 : 0));
		put64(&mad[D(28)], be64toh(ibv_get_device_guid(c->id.verbs->device)));
		break;
	case CM_MSG_REJ:
		/* What it rejects (IBA 12.6.7): a REQ before our REP, else the REP. */
		mad[D(8)] = (uint8_t)((c->state == CM_REP_RCVD || c->state == CM_FAILED) &&
				      c->remote_qpn ? 1 << 6 : 0);
		put16(&mad[D(10)], (uint16_t)m->reason);
		break;
	case CM_MSG_DREQ:
		put24(&mad[D(8)], c->remote_qpn);
		break;
	default:
		break;
	}
	memcpy(&mad[D(po)], m->pdata, m->pdata_len);
}

/* A MAD into the message conn.c reads; false if it is not one. */
static bool parse(const struct sv_gsi_dgram *d, struct cm_msg *m, uint32_t *local, uint32_t *remote,
		  uint64_t *tid)
{
	const uint8_t *mad = d->mad;
	uint16_t attr = get16(&mad[16]);
	int po = private_offset((enum cm_msg_type)attr);

	if (po < 0 || mad[0] != 1 || mad[1] != SV_MGMT_CLASS_CM || mad[2] != SV_CM_CLASS_VERSION ||
	    mad[3] != 0x03)
		return false;
	memset(m, 0, sizeof(*m));
	m->type = (uint8_t)attr;
	memcpy(m->gid.raw, d->src_gid, 16);
	*tid = get64(&mad[8]);
	*local = get32(&mad[D(0)]);
	*remote = get32(&mad[D(4)]);
	int room = SV_MAD_SIZE - D(po);
	switch (attr) {
	case CM_MSG_REQ:
		if (!get_cma_hdr(&mad[D(po)], (uint16_t)get64(&mad[D(8)]), m))
			return false;
		*remote = 0;
		m->ece.vendor_id = get24(&mad[D(5)]);
		m->qkey = get32(&mad[D(28)]);
		m->qpn = get24(&mad[D(32)]);
		m->responder_resources = mad[D(35)];
		m->ece.options = get24(&mad[D(36)]);
		m->initiator_depth = mad[D(39)];
		m->flags = (uint8_t)((mad[D(43)] & 1 ? CM_F_FLOW_CONTROL : 0) |
				     (mad[D(51)] & 0x08 ? CM_F_SRQ : 0));
		m->qp_type = get_qp_type(mad);
		m->psn = get24(&mad[D(44)]);
		m->retry_count = mad[D(47)] & 7;
		m->rnr_retry_count = mad[D(50)] & 7;
		m->lid = get16(&mad[D(52)]);
		po += CM_IP_HDR;
		room -= CM_IP_HDR;
		break;
	case CM_MSG_SIDR_REQ:
		if (!get_cma_hdr(&mad[D(po)], (uint16_t)get64(&mad[D(8)]), m))
			return false;
		*remote = 0;
		m->qp_type = IBV_QPT_UD;
		po += CM_IP_HDR;
		room -= CM_IP_HDR;
		break;
	case CM_MSG_SIDR_REP:
		*remote = *local;	/* the Request ID: ours */
		*local = 0;
		m->reason = mad[D(4)];
		m->qpn = get24(&mad[D(8)]);
		m->qkey = get32(&mad[D(20)]);
		break;
	case CM_MSG_REP:
		m->qkey = get32(&mad[D(8)]);
		m->qpn = get24(&mad[D(12)]);
		m->psn = get24(&mad[D(20)]);
		m->responder_resources = mad[D(24)];
		m->initiator_depth = mad[D(25)];
		m->flags = (uint8_t)((mad[D(26)] & 1 ? CM_F_FLOW_CONTROL : 0) |
				     (mad[D(27)] & 0x10 ? CM_F_SRQ : 0));
		m->rnr_retry_count = mad[D(27)] >> 5;
		break;
	case CM_MSG_REJ:
		m->reason = get16(&mad[D(10)]);
		break;
	default:
		break;
	}
	if (room > CM_PDATA_MAX)
		room = CM_PDATA_MAX;
	memcpy(m->pdata, &mad[D(po)], (size_t)room);
	m->pdata_len = (uint8_t)room;
	return true;
}

/* ---- sockets ---- */
static int dgram_bound(enum sv_gsi_key k, uint64_t id)
{
	struct sockaddr_un u;
	socklen_t ul = sv_gsi_name(&u, k, id);
	int fd = sv_socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	/* Each datagram then carries its sender's credentials (read_one). */
	int one = 1;
	if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) ||
	    bind(fd, (struct sockaddr *)&u, ul)) {
		int err = errno;

		close(fd);
		errno = err;
		return -1;
	}
	return fd;
}

/* A connection's socket, named after a fresh local communication ID: the
 * bind is the claim, host-wide. */
static int comm_socket(struct cm_id *c)
{
	for (int i = 0; i < 64; i++) {
		uint32_t id = 0;

		if (getrandom(&id, sizeof(id), 0) != sizeof(id))
			id = (uint32_t)rand();
		if (!id)
			continue;
		int fd = dgram_bound(SV_GSI_COMM, id);
		if (fd >= 0) {
			c->local_comm_id = id;
			return fd;
		}
		if (errno != EADDRINUSE)
			return -1;
	}
	errno = EADDRINUSE;
	return -1;
}

static void go_remote(struct cm_id *c)
{
	c->remote = true;
	TAILQ_INSERT_TAIL(&remote_ids, c, rlink);
}

/* A connection to another host leaves its DREQ with this process's guard
 * (core/guard.h) while it is established: if the process dies with it
 * open, the peer still gets the DREQ and its DISCONNECTED, as it does
 * from the kernel's ib_cm when a process dies.  Any message that ends
 * the connection takes it back. */
void cm_mad_established(struct cm_id *c)
{
	uint8_t mad[SV_MAD_SIZE];

	if (!c->remote || c->id.qp_type == IBV_QPT_UD || c->will)
		return;
	format(c, &(struct cm_msg){ .type = CM_MSG_DREQ }, mad);
	if (softverbs_gsi_will(c->id.verbs, c->local_comm_id, c->id.route.addr.addr.ibaddr.sgid.raw,
			       c->remote_gid.raw, c->tos, mad))
		softverbs_cm_explain("rdma_cm", "id %p: no DREQ for the peer if this process "
				     "dies: %s", (void *)c, strerror(errno));
	else
		c->will = true;
}

static void will_cancel(struct cm_id *c)
{
	if (c->will)
		softverbs_gsi_will_cancel(c->local_comm_id);
	c->will = false;
}

void cm_mad_forget(struct cm_id *c)
{
	will_cancel(c);
	if (c->remote)
		TAILQ_REMOVE(&remote_ids, c, rlink);
	c->remote = false;
}

void cm_mad_bind(struct cm_id *c)
{
	const struct sockaddr *a = &c->id.route.addr.src_addr;
	bool lo = a->sa_family == AF_INET ?
		  (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127 :
		  IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);

	if (!lo && c->mfd < 0 && cm_mad_listen(c))
		softverbs_cm_explain("rdma_bind_addr", "port %u: other hosts cannot reach it: %s",
				     c->port, strerror(errno));
}

int cm_mad_listen(struct cm_id *l)
{
	if (!cm_roce(l->id.verbs ? l->id.verbs : cm_device()))
		return 0;	/* IB mode: no other host can reach this one */
	if (softverbs_gsi_open(l->id.verbs ? l->id.verbs : cm_device()))
		return -1;
	int fd = dgram_bound(SV_GSI_SVC, cm_service_id(l->id.ps, l->port));
	if (fd < 0)
		return -1;
	l->mfd = fd;
	return 0;
}

int cm_mad_connect(struct cm_id *c)
{
	uint64_t tid = 0;

	if (softverbs_gsi_open(c->id.verbs))
		return -1;
	int fd = comm_socket(c);
	if (fd < 0)
		return -1;
	/* The port stays held by its socket; the connection's messages
	 * come in on the new one. */
	cm_watch(c, false);
	c->port_fd = c->fd;
	c->fd = fd;
	if (getrandom(&tid, sizeof(tid), 0) != sizeof(tid))
		tid = (uint64_t)rand() << 32 | (uint64_t)rand();
	c->tid = tid;
	go_remote(c);
	return 0;
}

int cm_mad_send(struct cm_id *c, const struct cm_msg *m)
{
	if (m->type == CM_MSG_DREQ || m->type == CM_MSG_DREP || m->type == CM_MSG_REJ)
		will_cancel(c);
	format(c, m, c->last_mad);
	c->last_type = m->type;
	return softverbs_gsi_send(c->id.verbs, c->id.route.addr.addr.ibaddr.sgid.raw,
				  c->remote_gid.raw, c->tos, c->last_mad);
}

void cm_mad_resend(struct cm_id *c)
{
	if (c->last_type)
		softverbs_gsi_send(c->id.verbs, c->id.route.addr.addr.ibaddr.sgid.raw,
				   c->remote_gid.raw, c->tos, c->last_mad);
}

static struct cm_id *find(uint32_t remote_comm_id, const uint8_t *gid)
{
	struct cm_id *c;

	TAILQ_FOREACH(c, &remote_ids, rlink)
		if (c->remote_comm_id == remote_comm_id && !memcmp(c->remote_gid.raw, gid, 16))
			return c;
	return NULL;
}

/* A REQ for an address the listener is not bound to: the host's answer
 * for a service nobody holds, from the address it was sent to. */
static void refuse_unbound(struct cm_id *l, const struct sv_gsi_dgram *d)
{
	uint8_t mad[SV_MAD_SIZE];

	if (!sv_cm_no_taker(d->mad, mad))
		return;
	softverbs_cm_explain("rdma_listen", "listener %p on port %u: a request for another "
			     "address of this host is rejected (invalid service ID)", (void *)l,
			     l->port);
	softverbs_gsi_send(l->id.verbs ? l->id.verbs : cm_device(), d->dst_gid, d->src_gid,
			   d->tclass, mad);
}

/* A REQ or SIDR_REQ for a listener. */
static void on_request(struct cm_id *l, const struct sv_gsi_dgram *d, const struct cm_msg *m,
		       uint32_t local, uint64_t tid)
{
	struct cm_id *dup = find(local, m->gid.raw);

	if (dup) {
		/* IBA 12.9.8.1 (ib_cm's cm_dup_req_handler): a repeated REQ
		 * is answered with what was sent for it (REP, REJ, SIDR_REP),
		 * else ignored while the consumer decides. */
		if (dup->state == CM_REP_SENT || dup->last_type == CM_MSG_REJ ||
		    (dup->state == CM_ESTABLISHED && dup->last_type == CM_MSG_SIDR_REP))
			cm_mad_resend(dup);
		return;
	}
	/* A listener bound to one address is no listener for the host's
	 * others: ib_cm matches the REQ to no id, and rejects it. */
	const struct sockaddr *la = &l->id.route.addr.src_addr;
	uint8_t lgid[16] = { 0 };
	lgid[10] = lgid[11] = 0xff;
	if (la->sa_family == AF_INET) {
		memcpy(&lgid[12], &((const struct sockaddr_in *)la)->sin_addr, 4);
		if (((const struct sockaddr_in *)la)->sin_addr.s_addr != htonl(INADDR_ANY) &&
		    memcmp(lgid, d->dst_gid, 16)) {
			refuse_unbound(l, d);
			return;
		}
	}
	struct cm_id *c = cm_id_new(l->chan, l->id.context, l->id.ps, l->id.qp_type);
	if (!c)
		return;
	int fd = comm_socket(c);
	if (fd < 0) {
		softverbs_cm_explain("rdma_listen", "listener %p on port %u: a request from another "
				     "host is dropped: no socket: %s", (void *)l, l->port,
				     strerror(errno));
		cm_chan_detach(c);
		cm_id_free(c);
		return;
	}
	c->fd = fd;
	c->port = l->port;
	c->listener = l;
	c->state = CM_ACCEPTING;
	c->remote_comm_id = local;
	c->remote_gid = m->gid;
	c->tid = tid;
	c->tos = d->tclass;
	/* Our address is the one the packet reached, whatever the REQ's
	 * header says; the device and its GID now, so that a refusal
	 * before the consumer sees the request still leaves as a REJ. */
	struct cm_msg req = *m;
	if (req.dst.ss_family == AF_INET)
		memcpy(&((struct sockaddr_in *)&req.dst)->sin_addr, &d->dst_gid[12], 4);
	memcpy(&c->id.route.addr.src_storage, &req.dst, sizeof(req.dst));
	cm_use_device(c);
	cm_addr_gid(c->id.verbs, &c->id.route.addr.src_addr, &c->id.route.addr.addr.ibaddr.sgid,
		    &c->sgid_index);
	go_remote(c);
	cm_watch(c, true);
	cm_on_msg(c, &req);
}

/* The next MAD a packet engine of this user handed on.  The names are
 * visible to every process of the namespace (/proc/net/unix), so what
 * another user's process writes to them is dropped: port 4791 is this
 * user's (its reuseport group), and only its processes take packets. */
static bool read_one(int fd, struct sv_gsi_dgram *d)
{
	for (;;) {
		union {
			struct cmsghdr h;
			char buf[CMSG_SPACE(sizeof(struct ucred))];
		} ctl;
		struct iovec v = { d, sizeof(*d) };
		struct msghdr mh = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl.buf,
				     .msg_controllen = sizeof(ctl.buf) };
		ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_TRUNC);

		if (n < 0)
			return false;
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		struct ucred cr = { .uid = (uid_t)-1 };
		if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS)
			memcpy(&cr, CMSG_DATA(cm), sizeof(cr));
		if (n == (ssize_t)sizeof(*d) && cr.uid == geteuid())
			return true;
		softverbs_cm_explain("rdma_cm", "a CM datagram of %zd bytes from uid %d dropped: "
				     "only this user's packet engines hand MADs on", n, (int)cr.uid);
	}
}

void cm_mad_on_listener(struct cm_id *l)
{
	struct sv_gsi_dgram d;
	struct cm_msg m;
	uint32_t local, remote;
	uint64_t tid;

	while (l->mfd >= 0 && l->state == CM_LISTEN && read_one(l->mfd, &d)) {
		if (!parse(&d, &m, &local, &remote, &tid) ||
		    (m.type != CM_MSG_REQ && m.type != CM_MSG_SIDR_REQ)) {
			softverbs_cm_explain("rdma_listen", "listener %p on port %u: a malformed CM "
					     "MAD dropped", (void *)l, l->port);
			continue;
		}
		on_request(l, &d, &m, local, tid);
	}
}

void cm_mad_on_readable(struct cm_id *c)
{
	struct sv_gsi_dgram d;
	struct cm_msg m;
	uint32_t local, remote;
	uint64_t tid;

	while (c->fd >= 0 && read_one(c->fd, &d)) {
		if (!parse(&d, &m, &local, &remote, &tid) || remote != c->local_comm_id ||
		    memcmp(d.src_gid, c->remote_gid.raw, 16)) {
			softverbs_cm_explain("rdma_cm", "id %p: a CM MAD that is not its peer's "
					     "dropped", (void *)c);
			continue;
		}
		if ((m.type == CM_MSG_REP || m.type == CM_MSG_SIDR_REP) && c->state == CM_REQ_SENT)
			c->remote_comm_id = local;
		/* Repeats whose answer was lost (ib_cm's cm_dup_rep_handler). */
		if (m.type == CM_MSG_REP && c->state == CM_ESTABLISHED && c->last_type == CM_MSG_RTU) {
			cm_mad_resend(c);
			continue;
		}
		if (m.type == CM_MSG_MRA)
			continue;	/* the peer needs longer: our retries cover it */
		if (m.type == CM_MSG_RTU && c->state == CM_ESTABLISHED)
			continue;	/* a repeat: the REP it answers went twice */
		cm_on_msg(c, &m);
		if (c->state != CM_ESTABLISHED)
			will_cancel(c);	/* the peer ended it (DREQ, REJ): it knows */
	}
}
