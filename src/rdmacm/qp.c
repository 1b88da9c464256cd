/* SPDX-License-Identifier: MIT */
/*
 * QPs, SRQs and endpoints on rdma_cm ids, and the QP attributes each
 * connection state implies (rdma_init_qp_attr).  The attribute rules are
 * the kernel's: cma_ib_init_qp_attr before a connection exists, ib_cm's
 * cm_init_qp_{init,rtr,rts}_attr once it does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/rdma_verbs.h>

#include "cm.h"

static bool connected(const struct cm_id *c)
{
	return c->state >= CM_REQ_SENT && c->state != CM_ACCEPTING;
}

static bool remote_known(const struct cm_id *c)
{
	return c->state == CM_REQ_RCVD || c->state == CM_REP_SENT || c->state == CM_REP_RCVD ||
	       c->state == CM_ESTABLISHED || c->state == CM_DREQ_SENT ||
	       c->state == CM_DISCONNECTED;
}

int cm_init_qp_attr(struct cm_id *c, struct ibv_qp_attr *a, int *mask)
{
	enum ibv_qp_type t = c->id.qp ? c->id.qp->qp_type : c->id.qp_type;
	bool ud = t == IBV_QPT_UD;
	bool rc = t == IBV_QPT_RC;
	struct ibv_port_attr pa = { 0 };
	enum ibv_qp_state want = a->qp_state;

	if (!c->id.verbs)
		return cm_fail(EINVAL, c, "rdma_init_qp_attr", "the id has no device yet (bind "
			       "or resolve an address first)");
	memset(a, 0, sizeof(*a));
	a->qp_state = want;
	*mask = IBV_QP_STATE;
	switch (want) {
	case IBV_QPS_INIT:
		a->pkey_index = 0;
		a->port_num = 1;
		*mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT;
		if (ud) {
			a->qkey = RDMA_UDP_QKEY;
			*mask |= IBV_QP_QKEY;
		} else {
			/* Remote access only once a connection says what the
			 * peer may do: writes, and reads and atomics when we
			 * serve any (cm_init_qp_init_attr). */
			if (connected(c)) {
				a->qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
				if (c->responder_resources && t != IBV_QPT_UC)
					a->qp_access_flags |= IBV_ACCESS_REMOTE_READ |
							      IBV_ACCESS_REMOTE_ATOMIC;
			}
			*mask |= IBV_QP_ACCESS_FLAGS;
		}
		return 0;
	case IBV_QPS_RTR:
		if (ud)
			return 0;
		if (!remote_known(c))
			return cm_fail(EINVAL, c, "rdma_init_qp_attr", "RTR needs the peer's QP: "
				       "wait for the connection request or response");
		ibv_query_port(c->id.verbs, 1, &pa);
		a->ah_attr.port_num = 1;
		a->ah_attr.dlid = c->remote_lid;
		if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
			a->ah_attr.is_global = 1;
			a->ah_attr.grh.dgid = c->remote_gid;
			a->ah_attr.grh.sgid_index = c->sgid_index;
			a->ah_attr.grh.hop_limit = 64;
			a->ah_attr.grh.traffic_class = c->tos;
		}
		a->path_mtu = c->id.route.path_rec ? (enum ibv_mtu)c->id.route.path_rec->mtu :
			      pa.active_mtu;
		a->dest_qp_num = c->remote_qpn;
		a->rq_psn = c->remote_psn;
		*mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		if (rc || t == IBV_QPT_XRC_RECV) {
			a->max_dest_rd_atomic = c->responder_resources;
			a->min_rnr_timer = 0;	/* cm_init_qp_rtr_attr */
			*mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
		return 0;
	case IBV_QPS_RTS:
		if (ud) {
			a->sq_psn = 0;
			*mask |= IBV_QP_SQ_PSN;
			return 0;
		}
		if (!remote_known(c))
			return cm_fail(EINVAL, c, "rdma_init_qp_attr", "RTS needs a connection");
		a->sq_psn = c->psn;
		*mask |= IBV_QP_SQ_PSN;
		if (t == IBV_QPT_UC)
			return 0;
		/* The path's lifetime (16) + 2, as ib_cm derives the local
		 * ACK timeout, unless ACK_TIMEOUT was set; an XRC target
		 * takes only that (cm_init_qp_rts_attr). */
		a->timeout = c->ack_timeout_set ? c->ack_timeout : 18;
		*mask |= IBV_QP_TIMEOUT;
		if (t != IBV_QPT_XRC_RECV) {
			a->retry_cnt = c->retry_count;
			a->rnr_retry = c->rnr_retry_count;
			a->max_rd_atomic = c->initiator_depth;
			*mask |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
		}
		return 0;
	default:
		return cm_fail(EINVAL, c, "rdma_init_qp_attr", "qp_state %d: rdma_cm gives INIT, "
			       "RTR and RTS", want);
	}
}

CM_EXPORT int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr,
				int *qp_attr_mask)
{
	int ret;

	if (!id || !qp_attr || !qp_attr_mask)
		return cm_fail(EINVAL, NULL, "rdma_init_qp_attr", "a NULL argument");
	pthread_mutex_lock(&cm_mu);
	ret = cm_init_qp_attr(cm_of(id), qp_attr, qp_attr_mask);
	pthread_mutex_unlock(&cm_mu);
	return ret;
}

int cm_modify_qp(struct cm_id *c, enum ibv_qp_state s)
{
	struct ibv_qp_attr a = { .qp_state = s };
	int mask, ret;

	if (!c->id.qp)
		return 0;
	if (cm_init_qp_attr(c, &a, &mask))
		return -1;
	ret = ibv_modify_qp(c->id.qp, &a, mask);
	if (ret) {
		errno = ret;
		return -1;
	}
	return 0;
}

int cm_qp_err(struct cm_id *c)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	return c->id.qp ? ibv_modify_qp(c->id.qp, &a, IBV_QP_STATE) : 0;
}

/* ---- rdma_create_qp: CQs with channels when none are given ---- */
static int create_cqs(struct rdma_cm_id *id, uint32_t send_size, uint32_t recv_size)
{
	if (recv_size) {
		id->recv_cq_channel = ibv_create_comp_channel(id->verbs);
		if (!id->recv_cq_channel)
			return -1;
		id->recv_cq = ibv_create_cq(id->verbs, (int)recv_size, id, id->recv_cq_channel, 0);
		if (!id->recv_cq)
			return -1;
	}
	if (send_size) {
		id->send_cq_channel = ibv_create_comp_channel(id->verbs);
		if (!id->send_cq_channel)
			return -1;
		id->send_cq = ibv_create_cq(id->verbs, (int)send_size, id, id->send_cq_channel, 0);
		if (!id->send_cq)
			return -1;
	}
	return 0;
}

static void destroy_cqs(struct rdma_cm_id *id)
{
	if (id->qp_type == IBV_QPT_XRC_RECV && id->srq)
		return;
	if (id->recv_cq) {
		ibv_destroy_cq(id->recv_cq);
		if (id->send_cq == id->recv_cq)
			id->send_cq = NULL;
		id->recv_cq = NULL;
	}
	if (id->recv_cq_channel) {
		ibv_destroy_comp_channel(id->recv_cq_channel);
		if (id->send_cq_channel == id->recv_cq_channel)
			id->send_cq_channel = NULL;
		id->recv_cq_channel = NULL;
	}
	if (id->send_cq) {
		ibv_destroy_cq(id->send_cq);
		id->send_cq = NULL;
	}
	if (id->send_cq_channel) {
		ibv_destroy_comp_channel(id->send_cq_channel);
		id->send_cq_channel = NULL;
	}
}

static struct ibv_xrcd *xrcd_of(struct ibv_context *ctx)
{
	static struct ibv_xrcd *x;
	struct ibv_xrcd_init_attr a = { .comp_mask = IBV_XRCD_INIT_ATTR_FD |
						     IBV_XRCD_INIT_ATTR_OFLAGS,
					.fd = -1, .oflags = O_CREAT };

	/* One per process, as librdmacm keeps one per device. */
	pthread_mutex_lock(&cm_mu);
	if (!x)
		x = ibv_open_xrcd(ctx, &a);
	pthread_mutex_unlock(&cm_mu);
	return x;
}

CM_EXPORT int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
	struct cm_id *c = cm_of(id);
	struct ibv_qp *qp;

	if (!id || !attr)
		return cm_fail(EINVAL, NULL, "rdma_create_qp_ex", "a NULL argument");
	if (id->qp)
		return cm_fail(EINVAL, c, "rdma_create_qp_ex", "the id has a QP already");
	if (!id->verbs)
		return cm_fail(EINVAL, c, "rdma_create_qp_ex", "the id has no device yet (bind or "
			       "resolve an address first)");
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
		attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
		attr->pd = id->pd ? id->pd : cm_default_pd(id->verbs);
	} else if (attr->pd->context != id->verbs) {
		return cm_fail(EINVAL, c, "rdma_create_qp_ex", "the PD is of another device");
	}
	if ((id->recv_cq && attr->recv_cq && id->recv_cq != attr->recv_cq) ||
	    (id->send_cq && attr->send_cq && id->send_cq != attr->send_cq))
		return cm_fail(EINVAL, c, "rdma_create_qp_ex", "the CQs differ from the id's");
	if (attr->qp_type == IBV_QPT_XRC_RECV &&
	    (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd)) {
		attr->xrcd = xrcd_of(id->verbs);
		attr->comp_mask |= IBV_QP_INIT_ATTR_XRCD;
	}
	/* rdma-core's rdma_create_qp_ex: a CQ of the queue's size, with a
	 * channel, for each queue the caller gave none. */
	if (create_cqs(id, attr->send_cq || id->send_cq ? 0 : attr->cap.max_send_wr,
		       attr->recv_cq || id->recv_cq ? 0 : attr->cap.max_recv_wr))
		goto fail;
	if (!attr->send_cq)
		attr->send_cq = id->send_cq;
	if (!attr->recv_cq)
		attr->recv_cq = id->recv_cq;
	if (id->srq && !attr->srq)
		attr->srq = id->srq;
	qp = ibv_create_qp_ex(id->verbs, attr);
	if (!qp)
		goto fail;
	/* id->qp changes under cm_mu: a thread reading the id's socket
	 * (a REP, a disconnect) modifies the QP it finds there. */
	pthread_mutex_lock(&cm_mu);
	id->qp = qp;
	int ret = cm_modify_qp(c, IBV_QPS_INIT);
	if (!ret && qp->qp_type == IBV_QPT_UD)
		ret = cm_modify_qp(c, IBV_QPS_RTR) || cm_modify_qp(c, IBV_QPS_RTS) ? -1 : 0;
	if (ret)
		id->qp = NULL;
	pthread_mutex_unlock(&cm_mu);
	if (ret) {
		int err = errno;

		ibv_destroy_qp(qp);
		destroy_cqs(id);
		return cm_fail(err, c, "rdma_create_qp_ex", "moving the new QP to %s: %s",
			       qp->qp_type == IBV_QPT_UD ? "RTS" : "INIT", strerror(err));
	}
	id->pd = qp->pd;
	return 0;
fail:;
	int err = errno ? errno : ENOMEM;
	destroy_cqs(id);
	return cm_fail(err, c, "rdma_create_qp_ex", "creating the QP or its CQs: %s",
		       strerror(err));
}

CM_EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd,
			     struct ibv_qp_init_attr *qp_init_attr)
{
	struct ibv_qp_init_attr_ex a;
	int ret;

	if (!id || !qp_init_attr)
		return cm_fail(EINVAL, NULL, "rdma_create_qp", "a NULL argument");
	memset(&a, 0, sizeof(a));
	memcpy(&a, qp_init_attr, sizeof(*qp_init_attr));
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = pd ? pd : id->pd;
	ret = rdma_create_qp_ex(id, &a);
	/* rdma-core hands the attributes back whole, CQs included. */
	memcpy(qp_init_attr, &a, sizeof(*qp_init_attr));
	return ret;
}

CM_EXPORT void rdma_destroy_qp(struct rdma_cm_id *id)
{
	struct ibv_qp *qp;

	if (!id || !id->qp)
		return;
	pthread_mutex_lock(&cm_mu);
	qp = id->qp;
	id->qp = NULL;
	pthread_mutex_unlock(&cm_mu);
	ibv_destroy_qp(qp);
	destroy_cqs(id);
}

CM_EXPORT int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
	struct ibv_srq *srq;

	if (!id || !attr)
		return cm_fail(EINVAL, NULL, "rdma_create_srq_ex", "a NULL argument");
	if (!id->verbs)
		return cm_fail(EINVAL, cm_of(id), "rdma_create_srq_ex", "the id has no device yet");
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE))
		return cm_fail(EINVAL, cm_of(id), "rdma_create_srq_ex", "srq_type is required");
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
		attr->pd = id->pd ? id->pd : cm_default_pd(id->verbs);
		attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
	}
	if (attr->srq_type == IBV_SRQT_XRC) {
		if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd) {
			attr->xrcd = xrcd_of(id->verbs);
			attr->comp_mask |= IBV_SRQ_INIT_ATTR_XRCD;
		}
		if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq) {
			if (!id->recv_cq && create_cqs(id, 0, attr->attr.max_wr))
				goto fail;
			attr->cq = id->recv_cq;
			attr->comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
		}
	}
	srq = ibv_create_srq_ex(id->verbs, attr);
	if (!srq)
		goto fail;
	id->pd = attr->pd;
	id->srq = srq;
	return 0;
fail:;
	int err = errno ? errno : ENOMEM;
	if (attr->srq_type == IBV_SRQT_XRC)
		destroy_cqs(id);
	return cm_fail(err, cm_of(id), "rdma_create_srq_ex", "%s", strerror(err));
}

CM_EXPORT int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd,
			      struct ibv_srq_init_attr *attr)
{
	struct ibv_srq_init_attr_ex a;
	int ret;

	if (!id || !attr)
		return cm_fail(EINVAL, NULL, "rdma_create_srq", "a NULL argument");
	memset(&a, 0, sizeof(a));
	memcpy(&a, attr, sizeof(*attr));
	a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
	a.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
	a.pd = pd;
	ret = rdma_create_srq_ex(id, &a);
	if (!ret)
		memcpy(attr, &a, sizeof(*attr));
	return ret;
}

CM_EXPORT void rdma_destroy_srq(struct rdma_cm_id *id)
{
	if (!id || !id->srq)
		return;
	ibv_destroy_srq(id->srq);
	id->srq = NULL;
	if (id->qp_type == IBV_QPT_XRC_RECV)
		destroy_cqs(id);
}

/* ---- endpoints: synchronous ids with their QP ---- */
CM_EXPORT int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
			     struct ibv_qp_init_attr *qp_init_attr)
{
	struct rdma_cm_id *cid;
	struct cm_id *c;

	if (!id || !res)
		return cm_fail(EINVAL, NULL, "rdma_create_ep", "a NULL argument");
	if (rdma_create_id(NULL, &cid, NULL, (enum rdma_port_space)res->ai_port_space))
		return -1;
	c = cm_of(cid);
	cid->qp_type = (enum ibv_qp_type)res->ai_qp_type;
	if (res->ai_flags & RAI_PASSIVE) {
		if (rdma_bind_addr(cid, res->ai_src_addr))
			goto fail;
		cid->pd = pd;
		if (qp_init_attr) {
			c->ep_qp_attr = calloc(1, sizeof(*c->ep_qp_attr));
			if (!c->ep_qp_attr) {
				errno = ENOMEM;
				goto fail;
			}
			memcpy(c->ep_qp_attr, qp_init_attr, sizeof(*qp_init_attr));
			c->ep_qp_attr->qp_type = (enum ibv_qp_type)res->ai_qp_type;
		}
		*id = cid;
		return 0;
	}
	if (rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000) ||
	    rdma_resolve_route(cid, 2000))
		goto fail;
	if (qp_init_attr) {
		qp_init_attr->qp_type = (enum ibv_qp_type)res->ai_qp_type;
		if (rdma_create_qp(cid, pd, qp_init_attr))
			goto fail;
	}
	*id = cid;
	return 0;
fail:;
	int err = errno;
	rdma_destroy_id(cid);
	errno = err;
	return -1;
}

CM_EXPORT void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (!id)
		return;
	if (id->qp)
		rdma_destroy_qp(id);
	if (id->srq)
		rdma_destroy_srq(id);
	rdma_destroy_id(id);
}

CM_EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	struct cm_id *l = cm_of(listen);
	struct rdma_cm_event *ev;

	if (!listen || !id)
		return cm_fail(EINVAL, NULL, "rdma_get_request", "a NULL argument");
	if (!l->chan->sync)
		return cm_fail(EINVAL, l, "rdma_get_request", "the listener has an event channel: "
			       "use rdma_get_cm_event");
	if (listen->event) {
		rdma_ack_cm_event(listen->event);
		listen->event = NULL;
	}
	if (rdma_get_cm_event(listen->channel, &ev))
		return -1;
	if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST || ev->status) {
		/* rdma-core's rdma_get_request: REJECTED is ECONNREFUSED, a
		 * status its errno, anything else EINVAL. */
		int err = ev->event == RDMA_CM_EVENT_REJECTED ? ECONNREFUSED :
			  ev->status < 0 ? -ev->status : ev->status ? ev->status : EINVAL;

		listen->event = ev;
		return cm_fail(err, l, "rdma_get_request", "%s, status %d",
			       rdma_event_str(ev->event), ev->status);
	}
	/* A synchronous listener's requests are synchronous ids too: the new
	 * id gets a channel of its own and its event (librdmacm's
	 * ucma_process_conn_req). */
	struct rdma_cm_id *child = ev->id;
	if (rdma_migrate_id(child, NULL)) {
		int err = errno;

		rdma_ack_cm_event(ev);
		rdma_destroy_id(child);	/* its requester is rejected */
		errno = err;
		return -1;
	}
	pthread_mutex_lock(&cm_mu);
	((struct cm_event *)ev)->owner = cm_of(child);
	l->events_out--;
	cm_of(child)->events_out++;
	pthread_cond_broadcast(&cm_cv);
	pthread_mutex_unlock(&cm_mu);
	child->event = ev;
	if (l->ep_qp_attr) {
		struct ibv_qp_init_attr a;

		memcpy(&a, l->ep_qp_attr, sizeof(a));
		if (rdma_create_qp(child, listen->pd, &a)) {
			int err = errno;

			rdma_destroy_id(child);
			errno = err;
			return -1;
		}
	}
	*id = child;
	return 0;
}
