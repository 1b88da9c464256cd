/* SPDX-License-Identifier: MIT */
/*
 * Connections: listen, connect, accept, reject, establish, disconnect, and
 * the messages that carry them (cm.h).  Each step is the IBTA CM's
 * (chapter 12) as the kernel's ib_cm and rdma_cm run it, and each
 * outcome is the event the kernel would report:
 *
 *   no listener on the port         REJECTED, status 8 (invalid service ID)
 *   rdma_reject, or a full backlog  REJECTED, status 28 (consumer defined)
 *   no REP within the CM timeout    UNREACHABLE, status -ETIMEDOUT
 *   SIDR_REP with a reject status   UNREACHABLE, status = the SIDR status
 *   the peer's DREQ, or its death   DISCONNECTED
 *   our DREQ answered or timed out  DISCONNECTED, then TIMEWAIT_EXIT
 *
 * A peer's death is its socket's end of file: the kernel closes the
 * sockets of a dead process, as its ib_cm sends DREQ or REJ for the ids
 * of a process that exits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cm.h"

static uint32_t random_psn(void)
{
	uint32_t r = 0;

	if (getrandom(&r, sizeof(r), 0) != sizeof(r))
		r = (uint32_t)getpid() * 2654435761u;
	return r & 0xffffff;
}

static void dev_limits(struct ibv_context *ctx, uint8_t *resp, uint8_t *init)
{
	struct ibv_device_attr a;

	*resp = *init = 16;
	if (ctx && !ibv_query_device(ctx, &a)) {
		*resp = (uint8_t)(a.max_qp_rd_atom > 255 ? 255 : a.max_qp_rd_atom);
		*init = (uint8_t)(a.max_qp_init_rd_atom > 255 ? 255 : a.max_qp_init_rd_atom);
	}
}

static bool is_ud(const struct cm_id *c)
{
	return c->id.qp_type == IBV_QPT_UD;
}

int cm_send(struct cm_id *c, struct cm_msg *m)
{
	struct ibv_port_attr pa;

	m->gid = c->id.route.addr.addr.ibaddr.sgid;
	if (c->id.verbs && !ibv_query_port(c->id.verbs, 1, &pa))
		m->lid = pa.lid;
	memcpy(&m->src, &c->id.route.addr.src_storage, sizeof(m->src));
	memcpy(&m->dst, &c->id.route.addr.dst_storage, sizeof(m->dst));
	if (c->remote)
		return c->fd < 0 || cm_mad_send(c, m) ? -1 : 0;
	if (c->fd < 0 || send(c->fd, m, sizeof(*m), MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof(*m))
		return -1;
	return 0;
}

static void send_simple(struct cm_id *c, enum cm_msg_type t, uint32_t reason,
			const void *pdata, uint8_t len)
{
	struct cm_msg m = { .type = (uint8_t)t, .reason = reason, .pdata_len = len };

	if (len)
		memcpy(m.pdata, pdata, len);
	cm_send(c, &m);
}

static void close_socket(struct cm_id *c)
{
	cm_watch(c, false);
	if (c->fd >= 0)
		close(c->fd);
	if (c->mfd >= 0)
		close(c->mfd);
	if (c->port_fd >= 0)
		close(c->port_fd);
	c->fd = c->mfd = c->port_fd = -1;
}

/* The wait for a response: for a peer on this host, one CM timeout for
 * all its tries (its socket cannot lose a message); across hosts each
 * try waits one CM response timeout, and cm_on_timer sends again. */
static void await(struct cm_id *c, enum cm_timer t, unsigned local_tries)
{
	c->tries = 0;
	cm_set_timer(c, t, c->remote ? cm_response_ns() : cm_response_ns() * local_tries);
}

static unsigned cm_tries(void)
{
	return (unsigned)softverbs_cm_setting("cm_retries") + 1;
}

/* rdma_destroy_id and dropped requests: tell the peer, as ib_cm does when
 * a cm_id is destroyed (REJ before the connection, DREQ after it). */
void cm_drop_connection(struct cm_id *c)
{
	switch (c->state) {
	case CM_REQ_RCVD:
		if (is_ud(c))
			send_simple(c, CM_MSG_SIDR_REP, CM_SIDR_REJECT, NULL, 0);
		else
			send_simple(c, CM_MSG_REJ, CM_REJ_CONSUMER_DEFINED, NULL, 0);
		break;
	case CM_ESTABLISHED:
	case CM_REP_SENT:
	case CM_REP_RCVD:
		if (!is_ud(c))
			send_simple(c, CM_MSG_DREQ, 0, NULL, 0);
		break;
	default:
		break;
	}
	if (c->state != CM_LISTEN && c->state != CM_BOUND && c->state != CM_IDLE &&
	    c->state != CM_ADDR_RESOLVED && c->state != CM_ROUTE_RESOLVED)
		close_socket(c);
}

static void fail_with(struct cm_id *c, enum rdma_cm_event_type t, int status, const char *why)
{
	struct cm_event *e;

	c->state = CM_FAILED;
	cm_set_timer(c, CM_T_NONE, 0);
	e = cm_event_queue(c, t, status);
	if (e)
		cm_explain_event(c, &e->ev, why);
}

/* ---- listen ---- */
CM_EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	struct cm_id *c = cm_of(id);

	if (!id)
		return cm_fail(EINVAL, NULL, "rdma_listen", "id is NULL");
	pthread_mutex_lock(&cm_mu);
	if (c->state == CM_IDLE && cm_bind_locked(c, NULL)) {
		pthread_mutex_unlock(&cm_mu);
		return -1;
	}
	if (c->state != CM_BOUND) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, "rdma_listen", "the id is %s; only a bound id listens",
			       cm_state_name(c->state));
	}
	if (listen(c->fd, SOMAXCONN)) {
		int err = errno;

		pthread_mutex_unlock(&cm_mu);
		return cm_fail(err, c, "rdma_listen", "listen: %s", strerror(err));
	}
	/* The kernel's ucma caps the backlog at max_backlog, 1024. */
	c->backlog = backlog <= 0 || backlog > 1024 ? 1024 : backlog;
	/* Other hosts reach the listener by its service ID. */
	cm_mad_bind(c);
	c->state = CM_LISTEN;
	cm_watch(c, true);
	pthread_mutex_unlock(&cm_mu);
	return 0;
}

static void on_listener(struct cm_id *l)
{
	for (;;) {
		int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			/* Out of fds (or memory): the pending connection keeps
			 * the socket readable, so the listener stops watching
			 * it for a while rather than spin. */
			if (errno != EAGAIN && errno != EINTR) {
				softverbs_cm_explain("rdma_listen", "listener %p on port %u: accept: %s; "
						     "retrying in 100 ms", (void *)l, l->port,
						     strerror(errno));
				cm_watch(l, false);
				cm_set_timer(l, CM_T_REWATCH, 100000000ull);
			}
			return;
		}
		struct cm_id *c = cm_id_new(l->chan, l->id.context, l->id.ps, l->id.qp_type);
		if (!c) {
			close(fd);
			continue;
		}
		c->fd = fd;
		c->port = l->port;
		c->listener = l;
		c->state = CM_ACCEPTING;
		memcpy(&c->id.route.addr.src_storage, &l->id.route.addr.src_storage,
		       sizeof(c->id.route.addr.src_storage));
		cm_watch(c, true);
		/* A connection that sends no REQ is dropped after one CM
		 * response timeout, so that silent sockets cannot pile up. */
		cm_set_timer(c, CM_T_REQ, cm_response_ns());
	}
}

/* ---- the passive side ---- */
static void fill_conn_param(struct cm_event *e, const struct cm_msg *m, int pdata_max)
{
	struct rdma_conn_param *p = &e->ev.param.conn;

	memcpy(e->pdata, m->pdata, m->pdata_len);
	p->private_data = e->pdata;
	p->private_data_len = (uint8_t)pdata_max;
	/* The receiver's view: the sender's initiator depth is the
	 * responder resources asked of us, and the other way round
	 * (ib_cm's req_rcvd and rep_rcvd parameters). */
	p->responder_resources = m->initiator_depth;
	p->initiator_depth = m->responder_resources;
	p->flow_control = !!(m->flags & CM_F_FLOW_CONTROL);
	p->retry_count = m->retry_count;
	p->rnr_retry_count = m->rnr_retry_count;
	p->srq = !!(m->flags & CM_F_SRQ);
	p->qp_num = m->qpn;
}

/* A request the listener does not take: REJ (or a SIDR reject), and the
 * new id goes. */
static void refuse(struct cm_id *c, const char *why)
{
	softverbs_cm_explain("rdma_listen", "listener %p on port %u: a request is rejected: %s",
			     (void *)c->listener, c->port, why);
	c->state = CM_REQ_RCVD;
	cm_drop_connection(c);
	cm_chan_detach(c);
	cm_id_free(c);
}

static bool addr_unspecified(const struct sockaddr *a)
{
	static const struct in6_addr any6;

	return a->sa_family == AF_INET ?
	       ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY) :
	       !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &any6, sizeof(any6));
}

static void on_req(struct cm_id *c, const struct cm_msg *m)
{
	struct cm_id *l = c->listener;
	bool sidr = m->type == CM_MSG_SIDR_REQ;
	struct cm_event *e;

	cm_set_timer(c, CM_T_NONE, 0);
	/* ucma refuses a request beyond the backlog, and ib_cm rejects it
	 * as the consumer's (cm_destroy_id in REQ_RCVD). */
	if (l->pending >= l->backlog)
		return refuse(c, "beyond the listener's backlog");
	/* A UD listener takes SIDR requests, a connected one REQs. */
	if (sidr != (l->id.qp_type == IBV_QPT_UD))
		return refuse(c, sidr ? "a SIDR request to a connected listener" :
			      "a connection request to a UD listener");
	/* Our side of the connection is the listener's port, and its address
	 * unless it listens on every address: then the one the peer reached,
	 * if it is this host's. */
	memcpy(&c->id.route.addr.src_storage, &l->id.route.addr.src_storage,
	       sizeof(c->id.route.addr.src_storage));
	if (addr_unspecified(&l->id.route.addr.src_addr) &&
	    cm_addr_local((const struct sockaddr *)&m->dst))
		memcpy(&c->id.route.addr.src_storage, &m->dst, sizeof(m->dst));
	cm_addr_set_port(&c->id.route.addr.src_addr, l->port);
	memcpy(&c->id.route.addr.dst_storage, &m->src, sizeof(m->src));
	cm_use_device(c);
	cm_addr_gid(c->id.verbs, &c->id.route.addr.src_addr, &c->id.route.addr.addr.ibaddr.sgid,
		    &c->sgid_index);
	c->id.route.addr.addr.ibaddr.dgid = m->gid;
	c->id.route.addr.addr.ibaddr.pkey = htobe16(0xffff);
	cm_fill_path(c);
	c->remote_gid = m->gid;
	c->remote_lid = m->lid;
	c->remote_qpn = m->qpn & 0xffffff;
	c->remote_psn = m->psn & 0xffffff;
	c->remote_ece = m->ece;
	c->responder_resources = m->initiator_depth;
	c->initiator_depth = m->responder_resources;
	/* 3-bit fields in the REQ (IBTA 12.7.27, 12.7.38). */
	c->retry_count = m->retry_count > 7 ? 7 : m->retry_count;
	c->rnr_retry_count = m->rnr_retry_count > 7 ? 7 : m->rnr_retry_count;
	c->remote_srq = m->flags & CM_F_SRQ;
	c->psn = random_psn();
	c->state = CM_REQ_RCVD;
	e = cm_event_queue(c, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
	if (!e)
		return refuse(c, "out of memory for its event");
	l->pending++;
	e->owner = l;
	e->ev.listen_id = &l->id;
	if (sidr) {
		memcpy(e->pdata, m->pdata, m->pdata_len);
		e->ev.param.ud.private_data = e->pdata;
		e->ev.param.ud.private_data_len = (uint8_t)cm_private_max(c, CM_MSG_SIDR_REQ);
		e->ev.param.ud.qp_num = m->qpn & 0xffffff;
		e->ev.param.ud.qkey = m->qkey;
	} else {
		fill_conn_param(e, m, cm_private_max(c, CM_MSG_REQ));
		e->ev.param.conn.retry_count = c->retry_count;
		e->ev.param.conn.rnr_retry_count = c->rnr_retry_count;
		e->ev.param.conn.qp_num = c->remote_qpn;
	}
}

CM_EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	struct cm_id *c = cm_of(id);
	struct cm_msg m = { 0 };
	uint8_t max_resp, max_init;
	int ret;

	if (!id)
		return cm_fail(EINVAL, NULL, "rdma_accept", "id is NULL");
	pthread_mutex_lock(&cm_mu);
	if (c->state != CM_REQ_RCVD) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, "rdma_accept", "the id is %s; only a connection request "
			       "is accepted", cm_state_name(c->state));
	}
	int max = cm_private_max(c, is_ud(c) ? CM_MSG_SIDR_REP : CM_MSG_REP);
	if (param && param->private_data_len > max) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, "rdma_accept", "%u bytes of private data; %s carries %d",
			       param->private_data_len, is_ud(c) ? "SIDR_REP" : "REP", max);
	}
	if (param && param->private_data_len) {
		memcpy(m.pdata, param->private_data, param->private_data_len);
		m.pdata_len = param->private_data_len;
	}
	if (is_ud(c)) {
		m.type = CM_MSG_SIDR_REP;
		m.qpn = id->qp ? id->qp->qp_num : param ? param->qp_num : 0;
		m.qkey = RDMA_UDP_QKEY;
		if (id->qp) {
			struct ibv_qp_attr a;
			struct ibv_qp_init_attr ia;

			if (!ibv_query_qp(id->qp, &a, IBV_QP_QKEY, &ia))
				m.qkey = a.qkey;
		}
		c->state = CM_ESTABLISHED;
		ret = cm_send(c, &m) ? cm_fail(ECONNRESET, c, "rdma_accept", "the requester is "
					       "gone") : 0;
		pthread_mutex_unlock(&cm_mu);
		return ret;
	}
	/* rdma-core's rdma_accept: without a parameter, or with the
	 * RDMA_MAX_* values, the request's figures capped by the device. */
	dev_limits(c->id.verbs, &max_resp, &max_init);
	if (param && param->responder_resources != RDMA_MAX_RESP_RES &&
	    param->responder_resources > max_resp) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, "rdma_accept", "responder_resources %u > the device's "
			       "max_qp_rd_atom %u", param->responder_resources, max_resp);
	}
	if (param && param->initiator_depth != RDMA_MAX_INIT_DEPTH &&
	    param->initiator_depth > max_init) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, "rdma_accept", "initiator_depth %u > the device's "
			       "max_qp_init_rd_atom %u", param->initiator_depth, max_init);
	}
	if (!param || param->responder_resources == RDMA_MAX_RESP_RES)
		c->responder_resources = c->responder_resources < max_resp ?
					 c->responder_resources : max_resp;
	else
		c->responder_resources = param->responder_resources;
	if (!param || param->initiator_depth == RDMA_MAX_INIT_DEPTH)
		c->initiator_depth = c->initiator_depth < max_init ? c->initiator_depth : max_init;
	else
		c->initiator_depth = param->initiator_depth;
	if (id->qp && (cm_modify_qp(c, IBV_QPS_INIT) || cm_modify_qp(c, IBV_QPS_RTR) ||
		       cm_modify_qp(c, IBV_QPS_RTS))) {
		int err = errno;

		cm_qp_err(c);
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(err, c, "rdma_accept", "moving qpn 0x%x to RTS: %s",
			       id->qp->qp_num, strerror(err));
	}
	m.type = CM_MSG_REP;
	m.qp_type = (uint8_t)c->id.qp_type;
	m.qpn = id->qp ? id->qp->qp_num : param ? param->qp_num : 0;
	m.psn = c->psn;
	m.responder_resources = c->responder_resources;
	m.initiator_depth = c->initiator_depth;
	m.rnr_retry_count = param ? param->rnr_retry_count : 7;
	m.flags = (uint8_t)((id->srq || (param && param->srq) ? CM_F_SRQ : 0) |
			    (param && param->flow_control ? CM_F_FLOW_CONTROL : 0));
	m.ece = c->local_ece;
	if (cm_send(c, &m)) {
		cm_qp_err(c);
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(ECONNRESET, c, "rdma_accept", "the requester is gone");
	}
	c->state = CM_REP_SENT;
	await(c, CM_T_RTU, cm_tries());
	ret = cm_sync_wait(c);
	pthread_mutex_unlock(&cm_mu);
	return ret;
}

static int reject(struct rdma_cm_id *id, const void *pdata, uint8_t len, uint32_t reason,
		  const char *verb)
{
	struct cm_id *c = cm_of(id);

	if (!id)
		return cm_fail(EINVAL, NULL, verb, "id is NULL");
	pthread_mutex_lock(&cm_mu);
	if (c->state != CM_REQ_RCVD) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, verb, "the id is %s; only a connection request is "
			       "rejected", cm_state_name(c->state));
	}
	int max = cm_private_max(c, is_ud(c) ? CM_MSG_SIDR_REP : CM_MSG_REJ);
	if (len > max) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, verb, "%u bytes of private data; %s carries %d", len,
			       is_ud(c) ? "SIDR_REP" : "REJ", max);
	}
	if (is_ud(c))
		send_simple(c, CM_MSG_SIDR_REP, CM_SIDR_REJECT, pdata, len);
	else
		send_simple(c, CM_MSG_REJ, reason, pdata, len);
	c->state = CM_FAILED;
	close_socket(c);
	pthread_mutex_unlock(&cm_mu);
	return 0;
}

CM_EXPORT int rdma_reject(struct rdma_cm_id *id, const void *private_data,
			  uint8_t private_data_len)
{
	return reject(id, private_data, private_data_len, CM_REJ_CONSUMER_DEFINED, "rdma_reject");
}

/* The kernel rejects with "vendor option not supported" (IBTA 12.6.7.2,
 * reason 35) when the ECE does not match. */
CM_EXPORT int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data,
			      uint8_t private_data_len)
{
	return reject(id, private_data, private_data_len, 35, "rdma_reject_ece");
}

/* ---- the active side ---- */
CM_EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	struct cm_id *c = cm_of(id);
	struct cm_msg m = { 0 };
	struct sockaddr_un u;
	uint8_t max_resp, max_init;
	int ret;

	if (!id)
		return cm_fail(EINVAL, NULL, "rdma_connect", "id is NULL");
	pthread_mutex_lock(&cm_mu);
	if (c->state != CM_ROUTE_RESOLVED) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, "rdma_connect", "the id is %s; rdma_connect needs a "
			       "resolved route (rdma_resolve_route)", cm_state_name(c->state));
	}
	enum cm_msg_type t = is_ud(c) ? CM_MSG_SIDR_REQ : CM_MSG_REQ;
	int max = cm_private_max(c, t);
	if (param && param->private_data_len > max) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, "rdma_connect", "%u bytes of private data; %s carries %d "
			       "for the user", param->private_data_len,
			       t == CM_MSG_REQ ? "REQ" : "SIDR_REQ", max);
	}
	if (!is_ud(c) && !id->qp && !param) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, "rdma_connect", "without a QP on the id the parameters "
			       "must give qp_num");
	}
	dev_limits(c->id.verbs, &max_resp, &max_init);
	if (param && !is_ud(c) &&
	    ((param->responder_resources != RDMA_MAX_RESP_RES &&
	      param->responder_resources > max_resp) ||
	     (param->initiator_depth != RDMA_MAX_INIT_DEPTH && param->initiator_depth > max_init))) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, "rdma_connect", "responder_resources %u or initiator_depth "
			       "%u exceeds the device's %u and %u", param->responder_resources,
			       param->initiator_depth, max_resp, max_init);
	}
	c->responder_resources = !param || param->responder_resources == RDMA_MAX_RESP_RES ?
				 max_resp : param->responder_resources;
	c->initiator_depth = !param || param->initiator_depth == RDMA_MAX_INIT_DEPTH ?
			     max_init : param->initiator_depth;
	/* rdma-core's defaults without a parameter: 7 retries of each kind. */
	c->retry_count = param ? param->retry_count : 7;
	c->rnr_retry_count = param ? param->rnr_retry_count : 7;
	c->psn = random_psn();
	m.type = (uint8_t)t;
	m.qp_type = (uint8_t)c->id.qp_type;
	m.qpn = id->qp ? id->qp->qp_num : param ? param->qp_num : 0;
	m.psn = c->psn;
	m.qkey = RDMA_UDP_QKEY;
	m.responder_resources = c->responder_resources;
	m.initiator_depth = c->initiator_depth;
	m.retry_count = c->retry_count;
	m.rnr_retry_count = c->rnr_retry_count;
	m.flags = (uint8_t)((id->srq || (param && param->srq) ? CM_F_SRQ : 0) |
			    (param && param->flow_control ? CM_F_FLOW_CONTROL : 0));
	m.ece = c->local_ece;
	if (param && param->private_data_len) {
		memcpy(m.pdata, param->private_data, param->private_data_len);
		m.pdata_len = param->private_data_len;
	}
	uint16_t port = cm_addr_port(&c->id.route.addr.dst_addr);
	c->state = CM_REQ_SENT;
	/* An id that connects takes no REQs from other hosts. */
	if (c->mfd >= 0) {
		close(c->mfd);
		c->mfd = -1;
	}
	if (!cm_addr_local(&c->id.route.addr.dst_addr)) {
		/* Another host: a REQ MAD to its QP1 (mad.c). */
		c->remote_gid = c->id.route.addr.addr.ibaddr.dgid;
		if (cm_mad_connect(c)) {
			int err = errno;

			c->state = CM_ROUTE_RESOLVED;
			pthread_mutex_unlock(&cm_mu);
			return cm_fail(err, c, "rdma_connect", "no CM socket for the connection: %s",
				       strerror(err));
		}
	} else if (connect(c->fd, (struct sockaddr *)&u, cm_port_addr(c->id.ps, port, &u))) {
		int err = errno;

		if (err == ECONNREFUSED || err == ENOENT)
			fail_with(c, RDMA_CM_EVENT_REJECTED, CM_REJ_INVALID_SERVICE_ID,
				  "nothing listens on that port of this host (REJ: invalid "
				  "service ID)");
		else
			fail_with(c, RDMA_CM_EVENT_REJECTED, CM_REJ_CONSUMER_DEFINED,
				  "the listener takes no more connections");
		ret = cm_sync_wait(c);
		pthread_mutex_unlock(&cm_mu);
		return ret;
	}
	if (cm_send(c, &m)) {
		fail_with(c, RDMA_CM_EVENT_REJECTED, CM_REJ_CONSUMER_DEFINED,
			  "the listener went away");
	} else {
		cm_watch(c, true);
		await(c, CM_T_REP, cm_tries());
	}
	ret = cm_sync_wait(c);
	pthread_mutex_unlock(&cm_mu);
	return ret;
}

static void on_rep(struct cm_id *c, const struct cm_msg *m)
{
	struct cm_event *e;

	cm_set_timer(c, CM_T_NONE, 0);
	c->remote_qpn = m->qpn;
	c->remote_psn = m->psn;
	c->remote_gid = m->gid;
	c->remote_lid = m->lid;
	c->remote_ece = m->ece;
	c->remote_srq = m->flags & CM_F_SRQ;
	/* ib_cm's cm_rep_handler: what the passive side serves bounds our
	 * reads, and the other way round. */
	c->initiator_depth = m->responder_resources < c->initiator_depth ?
			     m->responder_resources : c->initiator_depth;
	c->responder_resources = m->initiator_depth < c->responder_resources ?
				 m->initiator_depth : c->responder_resources;
	c->rnr_retry_count = m->rnr_retry_count;
	c->state = CM_REP_RCVD;
	if (!c->id.qp) {
		e = cm_event_queue(c, RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
		if (e)
			fill_conn_param(e, m, CM_PDATA_REP);
		return;
	}
	if (cm_modify_qp(c, IBV_QPS_INIT) || cm_modify_qp(c, IBV_QPS_RTR) ||
	    cm_modify_qp(c, IBV_QPS_RTS)) {
		int err = errno;
		char why[128];

		cm_qp_err(c);
		send_simple(c, CM_MSG_REJ, CM_REJ_CONSUMER_DEFINED, NULL, 0);
		snprintf(why, sizeof(why), "moving qpn 0x%x to RTS failed: %s", c->id.qp->qp_num,
			 strerror(err));
		fail_with(c, RDMA_CM_EVENT_CONNECT_ERROR, -err, why);
		close_socket(c);
		return;
	}
	send_simple(c, CM_MSG_RTU, 0, NULL, 0);
	c->state = CM_ESTABLISHED;
	cm_mad_established(c);
	e = cm_event_queue(c, RDMA_CM_EVENT_ESTABLISHED, 0);
	if (e)
		fill_conn_param(e, m, CM_PDATA_REP);
}

static void on_sidr_rep(struct cm_id *c, const struct cm_msg *m)
{
	struct cm_event *e;
	struct ibv_port_attr pa = { 0 };

	cm_set_timer(c, CM_T_NONE, 0);
	if (m->reason) {
		fail_with(c, RDMA_CM_EVENT_UNREACHABLE, (int)(m->reason & 0xff),
			  "the listener rejected the SIDR request");
		return;
	}
	c->state = CM_ESTABLISHED;
	c->remote_qpn = m->qpn;
	c->remote_qkey = m->qkey;
	c->remote_gid = m->gid;
	e = cm_event_queue(c, RDMA_CM_EVENT_ESTABLISHED, 0);
	if (!e)
		return;
	memcpy(e->pdata, m->pdata, m->pdata_len);
	e->ev.param.ud.private_data = e->pdata;
	e->ev.param.ud.private_data_len = CM_PDATA_SIDR_REP;
	e->ev.param.ud.qp_num = m->qpn;
	e->ev.param.ud.qkey = m->qkey;
	struct ibv_ah_attr *ah = &e->ev.param.ud.ah_attr;
	ibv_query_port(c->id.verbs, 1, &pa);
	ah->port_num = 1;
	ah->dlid = m->lid;
	if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
		ah->is_global = 1;
		ah->grh.dgid = m->gid;
		ah->grh.sgid_index = c->sgid_index;
		ah->grh.hop_limit = 64;
		ah->grh.traffic_class = c->tos;
	}
}

CM_EXPORT int rdma_establish(struct rdma_cm_id *id)
{
	struct cm_id *c = cm_of(id);

	if (!id)
		return cm_fail(EINVAL, NULL, "rdma_establish", "id is NULL");
	pthread_mutex_lock(&cm_mu);
	if (c->state != CM_REP_RCVD || id->qp) {
		pthread_mutex_unlock(&cm_mu);
		return cm_fail(EINVAL, c, "rdma_establish", "the id is %s%s; rdma_establish "
			       "answers a CONNECT_RESPONSE on an id without a QP",
			       cm_state_name(c->state), id->qp ? " with a QP" : "");
	}
	send_simple(c, CM_MSG_RTU, 0, NULL, 0);
	c->state = CM_ESTABLISHED;
	cm_mad_established(c);
	pthread_mutex_unlock(&cm_mu);
	return 0;
}

static void establish_passive(struct cm_id *c)
{
	cm_set_timer(c, CM_T_NONE, 0);
	c->state = CM_ESTABLISHED;
	cm_mad_established(c);
	struct cm_event *e = cm_event_queue(c, RDMA_CM_EVENT_ESTABLISHED, 0);
	if (e)
		e->ev.param.conn.private_data_len = 0;
}

CM_EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	struct cm_id *c = cm_of(id);
	int ret = 0;

	if (!id)
		return cm_fail(EINVAL, NULL, "rdma_notify", "id is NULL");
	pthread_mutex_lock(&cm_mu);
	if (c->state < CM_REQ_SENT || c->state == CM_FAILED)
		ret = cm_fail(EINVAL, c, "rdma_notify", "the id has no connection");
	else if (event == IBV_EVENT_COMM_EST && c->state == CM_REP_SENT)
		establish_passive(c);	/* ib_cm_notify: a first packet stands for the RTU */
	else if (event == IBV_EVENT_COMM_EST && c->state == CM_ESTABLISHED)
		ret = cm_fail(EISCONN, c, "rdma_notify", "the connection is established already");
	pthread_mutex_unlock(&cm_mu);
	return ret;
}

/* ---- disconnect ---- */
static void disconnected(struct cm_id *c)
{
	c->state = CM_DISCONNECTED;
	cm_event_queue(c, RDMA_CM_EVENT_DISCONNECTED, 0);
	cm_set_timer(c, CM_T_TIMEWAIT, cm_response_ns());
}

CM_EXPORT int rdma_disconnect(struct rdma_cm_id *id)
{
	struct cm_id *c = cm_of(id);
	int ret = 0;

	if (!id)
		return cm_fail(EINVAL, NULL, "rdma_disconnect", "id is NULL");
	pthread_mutex_lock(&cm_mu);
	switch (c->state) {
	case CM_ESTABLISHED:
	case CM_REP_SENT:
	case CM_REP_RCVD:
		/* librdmacm moves the QP to ERR first, so that its
		 * outstanding work flushes. */
		cm_qp_err(c);
		if (is_ud(c)) {
			pthread_mutex_unlock(&cm_mu);
			return 0;
		}
		c->state = CM_DREQ_SENT;
		if (cm_send(c, &(struct cm_msg){ .type = CM_MSG_DREQ }))
			disconnected(c);
		else
			await(c, CM_T_DREP, 1);
		ret = cm_sync_wait(c);
		break;
	case CM_DREQ_SENT:
	case CM_DISCONNECTED:
		cm_qp_err(c);
		/* A synchronous id completes with its DISCONNECTED, which
		 * may be queued already (the peer's DREQ came first). */
		if (c->chan->sync && !TAILQ_EMPTY(&c->chan->events))
			ret = cm_sync_wait(c);
		break;
	case CM_REQ_SENT:
	case CM_REQ_RCVD:
	case CM_FAILED:
		cm_qp_err(c);
		break;
	default:
		ret = cm_fail(EINVAL, c, "rdma_disconnect", "the id has no connection");
	}
	pthread_mutex_unlock(&cm_mu);
	return ret;
}

/* ---- messages and timers ---- */
static void peer_gone(struct cm_id *c)
{
	enum cm_state s = c->state;

	close_socket(c);
	if (is_ud(c) && s != CM_REQ_SENT)
		return;
	switch (s) {
	case CM_ACCEPTING:
		cm_chan_detach(c);
		cm_id_free(c);
		return;
	case CM_REQ_SENT:
	case CM_REP_SENT:
	case CM_REP_RCVD:
		fail_with(c, RDMA_CM_EVENT_REJECTED, CM_REJ_CONSUMER_DEFINED,
			  "the peer's process closed the connection before it was established");
		return;
	case CM_ESTABLISHED:
	case CM_DREQ_SENT:
		cm_set_timer(c, CM_T_NONE, 0);
		disconnected(c);
		return;
	default:
		return;
	}
}

static bool msg_ok(const struct cm_msg *m, ssize_t n)
{
	return n == (ssize_t)sizeof(*m) && m->pdata_len <= CM_PDATA_MAX &&
	       (m->src.ss_family == AF_INET || m->src.ss_family == AF_INET6) &&
	       (m->dst.ss_family == AF_INET || m->dst.ss_family == AF_INET6);
}

void cm_on_msg(struct cm_id *c, const struct cm_msg *m)
{
	switch (m->type) {
	case CM_MSG_REQ:
	case CM_MSG_SIDR_REQ:
		if (c->state == CM_ACCEPTING)
			return on_req(c, m);
		break;
	case CM_MSG_REP:
		if (c->state == CM_REQ_SENT && !is_ud(c))
			return on_rep(c, m);
		break;
	case CM_MSG_SIDR_REP:
		if (c->state == CM_REQ_SENT && is_ud(c))
			return on_sidr_rep(c, m);
		break;
	case CM_MSG_REJ:
		if (c->state == CM_REQ_SENT && c->remote && m->reason == CM_REJ_INVALID_SERVICE_ID &&
		    c->rej_grace < CM_REJ_GRACE_TRIES) {
			/* Another host has no listener yet: the REQ goes again
			 * in 20 ms, for up to half a second (cm.h). */
			c->rej_grace++;
			c->grace_due = true;
			cm_set_timer(c, CM_T_REP, 20000000ull);
			return;
		}
		if (c->state == CM_REQ_SENT || c->state == CM_REP_SENT || c->state == CM_REP_RCVD) {
			struct cm_event *e;

			c->state = CM_FAILED;
			cm_set_timer(c, CM_T_NONE, 0);
			/* REJ reasons are 16 bits (IBTA table 112). */
			e = cm_event_queue(c, RDMA_CM_EVENT_REJECTED, (int)(m->reason & 0xffff));
			if (e) {
				memcpy(e->pdata, m->pdata, m->pdata_len);
				e->ev.param.conn.private_data = e->pdata;
				e->ev.param.conn.private_data_len = CM_PDATA_REJ;
				cm_explain_event(c, &e->ev, "the listener rejected the request");
			}
			close_socket(c);
			return;
		}
		break;
	case CM_MSG_RTU:
		if (c->state == CM_REP_SENT)
			return establish_passive(c);
		break;
	case CM_MSG_DREQ:
		if (c->state == CM_ESTABLISHED || c->state == CM_REP_SENT ||
		    c->state == CM_DREQ_SENT || c->state == CM_REP_RCVD) {
			send_simple(c, CM_MSG_DREP, 0, NULL, 0);
			cm_set_timer(c, CM_T_NONE, 0);
			return disconnected(c);
		}
		if (c->state == CM_DISCONNECTED)
			return send_simple(c, CM_MSG_DREP, 0, NULL, 0);
		break;
	case CM_MSG_DREP:
		if (c->state == CM_DREQ_SENT) {
			cm_set_timer(c, CM_T_NONE, 0);
			return disconnected(c);
		}
		if (c->state == CM_DISCONNECTED)
			return;
		break;
	default:
		break;
	}
	softverbs_cm_explain("rdma_cm", "id %p in state %s: message 0x%x dropped (IBTA 12.9: "
			     "a message the state does not expect is discarded)", (void *)c,
			     cm_state_name(c->state), m->type);
}

void cm_on_readable(struct cm_id *c)
{
	struct cm_msg m;

	if (c->state == CM_LISTEN) {
		on_listener(c);
		cm_mad_on_listener(c);
		return;
	}
	if (c->remote)
		return cm_mad_on_readable(c);
	for (;;) {
		enum cm_state before = c->state;
		/* MSG_TRUNC: a record longer than a message reports its
		 * real length, and is refused below. */
		ssize_t n = recv(c->fd, &m, sizeof(m), MSG_DONTWAIT | MSG_TRUNC);

		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (n <= 0)
			return peer_gone(c);
		if (!msg_ok(&m, n)) {
			softverbs_cm_explain("rdma_cm", "id %p: a malformed message of %zd bytes "
					     "dropped", (void *)c, n);
			continue;
		}
		cm_on_msg(c, &m);
		/* A request beyond the backlog freed its id: c is not touched
		 * again (epoll is level-triggered, so what is left is read on
		 * the next pump).  A connection that ended closed its socket. */
		if (before == CM_ACCEPTING || c->fd < 0)
			return;
	}
}

void cm_on_timer(struct cm_id *c)
{
	enum cm_timer t = c->timer;

	c->timer = CM_T_NONE;
	if (c->grace_due && t == CM_T_REP) {
		/* Not a lost REQ: one answered "no listener yet" (cm.h). */
		c->grace_due = false;
		cm_mad_resend(c);
		cm_set_timer(c, t, cm_response_ns());
		return;
	}
	/* Across hosts a MAD may be lost: it goes again (ib_cm's
	 * cm_process_send_error retries up to max_cm_retries). */
	if (c->remote && (t == CM_T_REP || t == CM_T_RTU || t == CM_T_DREP) &&
	    c->tries + 1 < cm_tries()) {
		c->tries++;
		cm_mad_resend(c);
		cm_set_timer(c, t, cm_response_ns());
		return;
	}
	switch (t) {
	case CM_T_REP:
	case CM_T_RTU:
		/* ib_cm's REQ_ERROR and REP_ERROR, as rdma_cm reports them. */
		fail_with(c, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT, t == CM_T_REP ?
			  "no REP within the CM timeout (cm_timeout x (cm_retries + 1))" :
			  "no RTU within the CM timeout (cm_timeout x (cm_retries + 1))");
		close_socket(c);
		break;
	case CM_T_DREP:
		/* ib_cm's DREQ_ERROR: DISCONNECTED, with the timeout as its status. */
		c->state = CM_DISCONNECTED;
		cm_event_queue(c, RDMA_CM_EVENT_DISCONNECTED, -ETIMEDOUT);
		cm_set_timer(c, CM_T_TIMEWAIT, cm_response_ns());
		break;
	case CM_T_TIMEWAIT:
		cm_event_queue(c, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
		break;
	case CM_T_REQ:
		softverbs_cm_explain("rdma_listen", "port %u: a connection sent no REQ within the "
				     "CM timeout and is dropped", c->port);
		close_socket(c);
		cm_chan_detach(c);
		cm_id_free(c);
		break;
	case CM_T_REWATCH:
		cm_watch(c, true);
		break;
	default:
		break;
	}
}
