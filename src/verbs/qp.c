/* SPDX-License-Identifier: MIT */
/*
 * Queue pairs: creation, the state machine, query and destruction.
 *
 * modify_qp is check-then-apply (rxe_qp_chk_attr / rxe_qp_from_attr): the
 * transition is checked against the IBTA table (core/qp_state.c), every
 * attribute value present in the mask is validated, and only then is
 * anything changed.  A rejected call leaves the QP exactly as it was.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sv.h"
#include "../engine/engine.h"
#include "../transport/shm/shm.h"

#define QP_INIT_KNOWN_MASK (IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | \
	IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_MAX_TSO_HEADER | \
	IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)

static int check_type(const struct ibv_qp_init_attr_ex *a, const char *verb)
{
	switch (a->qp_type) {
	case IBV_QPT_RC: case IBV_QPT_UC: case IBV_QPT_UD:
	case IBV_QPT_XRC_SEND: case IBV_QPT_XRC_RECV:
		return 0;
	case IBV_QPT_RAW_PACKET:
		/* Frames are Ethernet: the port must be (RoCE mode).  The
		 * kernel asks for CAP_NET_RAW. */
		if (sv_config()->link != SV_LINK_ROCE)
			return sv_fail(EOPNOTSUPP, verb, "raw packet QPs need an Ethernet port; "
				       "this device is InfiniBand (SOFTVERBS_LINK_LAYER=roce)");
		if (!sv_has_net_raw())
			return sv_fail(EPERM, verb, "raw packet QPs need CAP_NET_RAW");
		return 0;
	default:
		return sv_fail(EINVAL, verb, "qp_type %d is not a QP type", a->qp_type);
	}
}

#define RSS_FIELDS (IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 | IBV_RX_HASH_SRC_IPV6 | \
	IBV_RX_HASH_DST_IPV6 | IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP | \
	IBV_RX_HASH_SRC_PORT_UDP | IBV_RX_HASH_DST_PORT_UDP)

/* A receive-only raw packet QP that spreads frames over an indirection
 * table of WQs by a Toeplitz hash (engine/raw.c): no queues, no CQs. */
static int check_rss(struct ibv_context *ctx, const struct ibv_qp_init_attr_ex *a, const char *verb)
{
	const struct ibv_rx_hash_conf *h = &a->rx_hash_conf;

	if ((a->comp_mask & (IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH)) !=
	    (IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH) || a->qp_type != IBV_QPT_RAW_PACKET)
		return sv_fail(EINVAL, verb, "RSS needs a raw packet QP with both an indirection "
			       "table and a hash configuration");
	if (!sv_obj_live(a->rwq_ind_tbl, SV_OBJ_RWQ_IND) || !sv_same_ctx(a->rwq_ind_tbl->context, ctx))
		return sv_fail(EINVAL, verb, "rwq_ind_tbl is not a live table of this context");
	if (h->rx_hash_function != IBV_RX_HASH_FUNC_TOEPLITZ || h->rx_hash_fields_mask & ~RSS_FIELDS)
		return sv_fail(EOPNOTSUPP, verb, "RSS hashes with Toeplitz over IP addresses and "
			       "TCP/UDP ports only (fields 0x%llx asked)",
			       (unsigned long long)h->rx_hash_fields_mask);
	if (h->rx_hash_key_len < 4 || h->rx_hash_key_len > SV_MAX_RSS_KEY || !h->rx_hash_key)
		return sv_fail(EINVAL, verb, "rx_hash_key_len %u is out of range 4..%d",
			       h->rx_hash_key_len, SV_MAX_RSS_KEY);
	if (a->cap.max_send_wr || a->cap.max_recv_wr || a->srq)
		return sv_fail(EINVAL, verb, "an RSS QP receives through its WQs only: no send or "
			       "receive queue, no SRQ");
	return 0;
}

static int check_init_attr(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *a)
{
	const char *verb = "ibv_create_qp";
	const struct ibv_qp_cap *cap = &a->cap;

	if (a->comp_mask & ~(uint32_t)QP_INIT_KNOWN_MASK)
		return sv_fail(EINVAL, verb, "unknown comp_mask bits 0x%x", a->comp_mask);
	if (a->comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER)
		return sv_fail(EOPNOTSUPP, verb, "TSO is not offered");
	if ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags)
		return sv_fail(EOPNOTSUPP, verb, "create_flags 0x%x: no QP creation flag is "
			       "supported", a->create_flags);
	if (check_type(a, verb))
		return errno;
	if ((a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    (a->send_ops_flags & ~sv_wr_ops_supported(a->qp_type)))
		return sv_fail(EOPNOTSUPP, verb, "send_ops_flags 0x%llx: a %s QP offers 0x%llx "
			       "(TSO needs a raw packet QP)",
			       (unsigned long long)a->send_ops_flags, sv_qp_type_name(a->qp_type),
			       (unsigned long long)sv_wr_ops_supported(a->qp_type));
	/* An XRC target QP has nothing but a domain: it receives into the
	 * SRQ each message names (IBA 11.2.?, ibv_create_qp_ex(3)). */
	if (a->qp_type == IBV_QPT_XRC_RECV) {
		if (!(a->comp_mask & IBV_QP_INIT_ATTR_XRCD))
			return sv_fail(EINVAL, verb, "an XRC_RECV QP needs an XRC domain "
				       "(IBV_QP_INIT_ATTR_XRCD)");
		return sv_xrcd_of(a->xrcd, ctx, verb) ? 0 : EINVAL;
	}
	if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD))
		return sv_fail(EINVAL, verb, "a %s QP needs a PD (IBV_QP_INIT_ATTR_PD)",
			       sv_qp_type_name(a->qp_type));
	if (!sv_pd_of(a->pd, ctx, verb))
		return EINVAL;
	if (a->comp_mask & (IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH))
		return check_rss(ctx, a, verb);
	/* An XRC initiator QP only sends. */
	bool xini = a->qp_type == IBV_QPT_XRC_SEND;
	if (!a->send_cq || (!a->recv_cq && !xini))
		return sv_fail(EINVAL, verb, "%s QPs need %s", sv_qp_type_name(a->qp_type),
			       xini ? "a send_cq" : "both send_cq and recv_cq");
	if (!sv_cq_of(a->send_cq, ctx, verb, "send_cq") ||
	    (!xini && !sv_cq_of(a->recv_cq, ctx, verb, "recv_cq")))
		return EINVAL;
	if (xini && (a->srq || a->cap.max_recv_wr))
		return sv_fail(EINVAL, verb, "an XRC_SEND QP has no receive side (srq NULL, "
			       "max_recv_wr 0)");
	if (a->srq && !sv_obj_live(a->srq, SV_OBJ_SRQ))
		return sv_fail(EINVAL, verb, "srq %p is not a live SRQ", (void *)a->srq);
	if (a->srq && !sv_same_ctx(a->srq->context, ctx))
		return sv_fail(EINVAL, verb, "srq %p belongs to another device context", (void *)a->srq);
	/* Tag matching is defined for RC (IBV_TM_CAP_RC only). */
	if (a->srq && sv_srq(a->srq)->wq->tm_tags && a->qp_type != IBV_QPT_RC)
		return sv_fail(EINVAL, verb, "srq %p is a tag-matching SRQ, which serves RC QPs only",
			       (void *)a->srq);
	if (cap->max_send_wr > SV_MAX_QP_WR || (!a->srq && cap->max_recv_wr > SV_MAX_QP_WR))
		return sv_fail(EINVAL, verb, "max_send_wr %u / max_recv_wr %u: max_qp_wr is %d",
			       cap->max_send_wr, cap->max_recv_wr, SV_MAX_QP_WR);
	if (cap->max_send_sge > SV_MAX_SGE || (!a->srq && cap->max_recv_sge > SV_MAX_SGE))
		return sv_fail(EINVAL, verb, "max_send_sge %u / max_recv_sge %u: max_sge is %d",
			       cap->max_send_sge, cap->max_recv_sge, SV_MAX_SGE);
	if (cap->max_inline_data > SV_MAX_INLINE_DATA)
		return sv_fail(EINVAL, verb, "max_inline_data %u: at most %d bytes can be inline",
			       cap->max_inline_data, SV_MAX_INLINE_DATA);
	return 0;
}

static void qp_free_queues(struct sv_qp *qp)
{
	struct sv_context *c = qp->ctx;

	if (!c)
		return;
	if (qp->rq)
		sv_seg_free(&c->seg, qp->rq_off, qp->rq_bytes);
	if (qp->sh)
		sv_seg_free(&c->seg, qp->sh_off, sizeof(*qp->sh));
	if (qp->sq)
		sv_pd_free(sv_pd(qp->ex.qp_base.pd), qp->sq, qp->sq_from_app);
	if (qp->rss_off)
		sv_seg_free(&c->seg, qp->rss_off, qp->rss_bytes);
	if (qp->ind)
		atomic_fetch_sub(&qp->ind->users, 1);
	pthread_mutex_destroy(&qp->sq_lock);
}

/* What initiators hash with: the key, the fields and the WQs' queues. */
static int rss_alloc(struct sv_context *c, struct sv_qp *qp, const struct ibv_qp_init_attr_ex *a)
{
	struct sv_rwq_ind *t = (struct sv_rwq_ind *)a->rwq_ind_tbl;
	uint32_t n = 1u << t->log_size;

	qp->rss_bytes = sizeof(struct shm_rss) + n * sizeof(uint64_t);
	qp->rss_off = sv_seg_alloc(&c->seg, qp->rss_bytes);
	if (!qp->rss_off)
		return ENOMEM;
	struct shm_rss *r = shm_at(c->seg.h, qp->rss_off);
	r->fields = a->rx_hash_conf.rx_hash_fields_mask;
	r->log_size = t->log_size;
	r->key_len = a->rx_hash_conf.rx_hash_key_len;
	memcpy(r->key, a->rx_hash_conf.rx_hash_key, r->key_len);
	for (uint32_t i = 0; i < n; i++)
		r->wq_off[i] = t->wqs[i]->sh_off;
	qp->ind = t;
	atomic_fetch_add(&t->users, 1);
	return 0;
}

/* The shared QP block and receive queue, and the private send queue. */
static int qp_alloc_queues(struct sv_context *c, struct sv_qp *qp,
			   const struct ibv_qp_init_attr_ex *a)
{
	qp->ctx = c;
	pthread_mutex_init(&qp->sq_lock, NULL);
	qp->sh_off = sv_seg_alloc(&c->seg, sizeof(*qp->sh));
	if (!qp->sh_off)
		return ENOMEM;
	qp->sh = shm_at(c->seg.h, qp->sh_off);
	if (a->qp_type == IBV_QPT_XRC_RECV)
		return 0;	/* no queue at all */
	if (a->comp_mask & IBV_QP_INIT_ATTR_IND_TABLE)
		return rss_alloc(c, qp, a);	/* receives through its WQs only */
	if (!a->srq && a->qp_type != IBV_QPT_XRC_SEND) {
		qp->rq = sv_seg_new_wq(&c->seg, a->cap.max_recv_wr + SV_RQ_SLACK,
				       a->cap.max_recv_sge, &qp->rq_off);
		if (!qp->rq)
			return ENOMEM;
		qp->rq->lockfree = 1;
		qp->rq_bytes = sv_seg_wq_bytes(qp->rq);
	}
	/* An RC QP of a tag-matching SRQ has slots of the device's own
	 * beyond max_send_wr, each room for a tag's scatter list: the READs
	 * and FINs of rendezvous from another host (engine/pkt_req.c). */
	struct sv_srq *srq = a->srq ? sv_srq(a->srq) : NULL;
	bool tm = srq && srq->wq && srq->wq->tm_tags && a->qp_type == IBV_QPT_RC;
	uint32_t sges = a->cap.max_send_sge ? a->cap.max_send_sge : 1;
	if (tm && sges < SV_MAX_SRQ_SGE)
		sges = SV_MAX_SRQ_SGE;
	qp->sq_hidden_max = tm ? SV_TM_HIDDEN_WQES : 0;
	qp->sq_size = (a->cap.max_send_wr ? a->cap.max_send_wr : 1) + qp->sq_hidden_max;
	qp->sq_stride = (uint32_t)((sizeof(struct sv_swqe) + sges * sizeof(struct ibv_sge) +
				    SV_MAX_INLINE_DATA + 15) & ~15ul);
	qp->sq = sv_pd_alloc(sv_pd(a->pd), (size_t)qp->sq_size * qp->sq_stride, 64, &qp->sq_from_app);
	return qp->sq ? 0 : ENOMEM;
}

/* The objects a QP uses, each counted so it cannot be destroyed first. */
static void qp_hold(struct sv_qp *qp, int d)
{
	if (qp->pd)
		sv_pd_users_add(qp->pd, d);
	if (qp->scq)
		atomic_fetch_add(&qp->scq->users, (unsigned)d);
	if (qp->rcq)
		atomic_fetch_add(&qp->rcq->users, (unsigned)d);
	if (qp->srq)
		atomic_fetch_add(&qp->srq->users, (unsigned)d);
	if (qp->xrcd)
		atomic_fetch_add(&qp->xrcd->users, (unsigned)d);
}

struct ibv_qp *sv_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *a)
{
	const char *verb = "ibv_create_qp";
	struct sv_context *c;
	struct sv_qp *qp;
	uint32_t qpn;
	int ret;

	if (!sv_context_live(ctx, verb))
		return NULL;
	if (!a)
		return sv_fail_null(EINVAL, verb, "attr is NULL");
	if (check_init_attr(ctx, a))
		return NULL;
	c = sv_ctx(ctx);
	if (atomic_fetch_add(&c->nqp, 1) >= SV_MAX_QP) {
		atomic_fetch_sub(&c->nqp, 1);
		return sv_fail_null(ENOMEM, verb, "the context has max_qp=%d QPs", SV_MAX_QP);
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		atomic_fetch_sub(&c->nqp, 1);
		return sv_fail_null(ENOMEM, verb, "out of memory");
	}
	ret = sv_reg_qpn_alloc(c->ep, a->qp_type, &qpn);
	if (ret) {
		free(qp);
		atomic_fetch_sub(&c->nqp, 1);
		return sv_fail_null(ENOMEM, verb, "no QP number left in the host registry %s (%s)",
				    sv_reg_path(), strerror(ret));
	}
	if (qp_alloc_queues(c, qp, a) || sv_obj_add(qp, SV_OBJ_QP, ctx)) {
		qp_free_queues(qp);
		sv_reg_qpn_free(qpn);
		free(qp);
		atomic_fetch_sub(&c->nqp, 1);
		return sv_fail_null(ENOMEM, verb, "out of memory for the QP's queues");
	}

	struct ibv_qp *ib = &qp->ex.qp_base;
	ib->context = ctx;
	ib->qp_context = a->qp_context;
	ib->pd = a->pd;
	ib->send_cq = a->send_cq;
	ib->recv_cq = a->recv_cq;
	ib->srq = a->srq;
	ib->handle = qpn;
	ib->qp_num = qpn;
	ib->state = IBV_QPS_RESET;
	ib->qp_type = a->qp_type;
	pthread_mutex_init(&ib->mutex, NULL);
	pthread_cond_init(&ib->cond, NULL);
	pthread_mutex_init(&qp->lock, NULL);

	bool xtgt = a->qp_type == IBV_QPT_XRC_RECV, xini = a->qp_type == IBV_QPT_XRC_SEND;
	if (xtgt) {
		/* Nothing of the init attributes but the domain applies. */
		ib->pd = NULL;
		ib->send_cq = ib->recv_cq = NULL;
		ib->srq = NULL;
		memset(&a->cap, 0, sizeof(a->cap));
		qp->xrcd = sv_xrcd(a->xrcd);
	} else if (xini) {
		ib->recv_cq = NULL;
	}
	qp->pd = xtgt ? NULL : sv_pd(a->pd);
	qp->scq = xtgt ? NULL : sv_cq(a->send_cq);
	qp->rcq = xtgt || xini ? NULL : sv_cq(a->recv_cq);
	qp->srq = xtgt || !a->srq ? NULL : sv_srq(a->srq);
	qp->sq_sig_all = a->sq_sig_all;
	qp->cap = a->cap;
	if (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		sv_wr_install(qp);
	}
	/* The actual capacities are reported back, as every provider does:
	 * inline space is what a send slot really holds, and a QP on an SRQ
	 * has no receive queue of its own. */
	qp->cap.max_inline_data = qp->sq ? SV_MAX_INLINE_DATA : 0;
	if (!qp->rq)
		qp->cap.max_recv_wr = qp->cap.max_recv_sge = 0;
	else
		qp->cap.max_recv_wr = qp->rq->size;
	a->cap = qp->cap;
	qp_hold(qp, 1);

	/* What initiators see, published last. */
	struct shm_qp *sh = qp->sh;
	sh->qpn = qpn;
	sh->type = (uint8_t)a->qp_type;
	sh->pd = qp->pd ? sv_pd_base(qp->pd)->ibpd.handle : 0;
	sh->xrcd = qp->xrcd ? qp->xrcd->id : 0;
	sh->rcq_off = qp->rcq ? qp->rcq->sh_off : 0;
	sh->rq_off = qp->rq ? qp->rq_off : 0;
	sh->srq_off = qp->srq ? qp->srq->wq_off : 0;
	sh->rss_off = qp->rss_off;
	atomic_store(&sh->state, IBV_QPS_RESET);
	sv_seg_publish_qp(c->seg.h, qpn, qp->sh_off);
	qp->ctx = c;
	qp->slid = sv_config()->link == SV_LINK_ROCE ? 0 : sv_port_lid(c->dev);
	pthread_mutex_lock(&c->lock);
	qp->next = c->qps;
	c->qps = qp;
	pthread_mutex_unlock(&c->lock);
	sv_dbg("qpn 0x%x: created %s", qpn, sv_qp_type_name(a->qp_type));
	return ib;
}

SV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct ibv_qp_init_attr_ex a;
	struct ibv_qp *qp;

	if (!sv_pd_of(pd, NULL, "ibv_create_qp"))
		return NULL;
	if (!attr)
		return sv_fail_null(EINVAL, "ibv_create_qp", "attr is NULL");
	memset(&a, 0, sizeof(a));
	memcpy(&a, attr, sizeof(*attr));
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = pd;
	qp = sv_create_qp_ex(pd->context, &a);
	if (qp)
		attr->cap = a.cap;
	return qp;
}

SV_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct sv_qp *q = sv_qp(qp);

	return q->has_ex ? &q->ex : NULL;
}

/* ---- modify_qp ---- */

struct value_error {
	int bit;
	const char *why;
};

/* Any defined access bit is accepted in qp_access_flags, as the kernel
 * and mlx5 do; only the IBV_ACCESS_REMOTE_* bits have effect on a QP. */
#define QP_ACCESS_BITS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
			IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | \
			IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB | \
			IBV_ACCESS_OPTIONAL_RANGE)

static int check_values(struct sv_qp *qp, const struct ibv_qp_attr *a, int mask,
			struct value_error *e)
{
	const struct sv_device *dev = sv_ctx(qp->ex.qp_base.context)->dev;

#define BAD(b, w) do { e->bit = (b); e->why = (w); return EINVAL; } while (0)
	if ((mask & IBV_QP_PORT) && (a->port_num < 1 || a->port_num > SV_NUM_PORTS))
		BAD(IBV_QP_PORT, "port_num must be 1");
	if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index >= SV_PKEY_TBL_LEN)
		BAD(IBV_QP_PKEY_INDEX, "pkey_index must be below pkey_tbl_len (1)");
	if ((mask & IBV_QP_ACCESS_FLAGS) && (a->qp_access_flags & ~QP_ACCESS_BITS))
		BAD(IBV_QP_ACCESS_FLAGS, "qp_access_flags has bits that are no enum ibv_access_flags");
	if ((mask & IBV_QP_AV) && sv_ah_attr_check(dev, &a->ah_attr, &e->why))
		return e->bit = IBV_QP_AV, EINVAL;
	if (mask & IBV_QP_ALT_PATH) {
		if (sv_ah_attr_check(dev, &a->alt_ah_attr, &e->why))
			return e->bit = IBV_QP_ALT_PATH, EINVAL;
		if (a->alt_port_num < 1 || a->alt_port_num > SV_NUM_PORTS ||
		    a->alt_pkey_index >= SV_PKEY_TBL_LEN || a->alt_timeout > 31)
			BAD(IBV_QP_ALT_PATH, "alt_port_num must be 1, alt_pkey_index 0 and "
			    "alt_timeout 0..31");
	}
	if (mask & IBV_QP_PATH_MTU) {
		if (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096)
			BAD(IBV_QP_PATH_MTU, "path_mtu is not an enum ibv_mtu value");
		/* IBA 10.3.3 / C10-13: the path MTU cannot exceed the port's. */
		if (a->path_mtu > sv_config()->active_mtu)
			BAD(IBV_QP_PATH_MTU, "path_mtu is larger than the port's active_mtu "
			    "(ibv_query_port); use that or smaller");
	}
	if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31)
		BAD(IBV_QP_TIMEOUT, "timeout is a 5-bit exponent, 0..31 (0 = infinite)");
	if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7)
		BAD(IBV_QP_RETRY_CNT, "retry_cnt is 3 bits, 0..7");
	if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7)
		BAD(IBV_QP_RNR_RETRY, "rnr_retry is 3 bits, 0..7 (7 = retry forever)");
	if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31)
		BAD(IBV_QP_MIN_RNR_TIMER, "min_rnr_timer is a 5-bit code, 0..31");
	if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > SV_MAX_QP_INIT_RD_ATOM)
		BAD(IBV_QP_MAX_QP_RD_ATOMIC, "max_rd_atomic exceeds max_qp_init_rd_atom (128)");
	if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > SV_MAX_QP_RD_ATOM)
		BAD(IBV_QP_MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic exceeds max_qp_rd_atom (128)");
	if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num > SV_QPN_MASK)
		BAD(IBV_QP_DEST_QPN, "dest_qp_num is a 24-bit QP number");
	if ((mask & IBV_QP_PATH_MIG_STATE) && a->path_mig_state > IBV_MIG_ARMED)
		BAD(IBV_QP_PATH_MIG_STATE, "path_mig_state is not an enum ibv_mig_state value");
#undef BAD
	return 0;
}

static int explain_transition(struct sv_qp *qp, enum ibv_qp_state cur, enum ibv_qp_state next,
			      const struct sv_qp_transition_error *w)
{
	enum ibv_qp_type t = qp->ex.qp_base.qp_type;
	char b1[512], b2[512];
	uint32_t qpn = qp->ex.qp_base.qp_num;

	if (w->illegal) {
		int hop = sv_qp_next_hop(t, cur, next);
		if (hop >= 0)
			return sv_fail(EINVAL, "ibv_modify_qp", "qpn 0x%x %s->%s rejected: %s QPs must "
				       "pass %s first (%s->%s needs %s)", qpn, sv_qp_state_name(cur),
				       sv_qp_state_name(next), sv_qp_type_name(t),
				       sv_qp_state_name((enum ibv_qp_state)hop), sv_qp_state_name(cur),
				       sv_qp_state_name((enum ibv_qp_state)hop),
				       sv_qp_mask_str(sv_qp_required_mask(t, cur, (enum ibv_qp_state)hop),
						      b1, sizeof(b1)));
		size_t n = 0;
		b1[0] = 0;
		for (int st = IBV_QPS_RESET; st <= IBV_QPS_ERR; st++)
			if (sv_qp_required_mask(t, cur, (enum ibv_qp_state)st) >= 0)
				n += (size_t)snprintf(b1 + n, sizeof(b1) - n, "%s%s", n ? ", " : "",
						      sv_qp_state_name((enum ibv_qp_state)st));
		return sv_fail(EINVAL, "ibv_modify_qp", "qpn 0x%x %s->%s rejected: no such transition "
			       "for a %s QP; from %s it can go to %s", qpn, sv_qp_state_name(cur),
			       sv_qp_state_name(next), sv_qp_type_name(t), sv_qp_state_name(cur), b1);
	}
	if (w->missing)
		return sv_fail(EINVAL, "ibv_modify_qp", "qpn 0x%x %s %s->%s rejected: attr_mask lacks "
			       "%s (this transition requires %s)", qpn, sv_qp_type_name(t),
			       sv_qp_state_name(cur), sv_qp_state_name(next),
			       sv_qp_mask_str(w->missing, b1, sizeof(b1)),
			       sv_qp_mask_str(w->required | IBV_QP_STATE, b2, sizeof(b2)));
	return sv_fail(EINVAL, "ibv_modify_qp", "qpn 0x%x %s %s->%s rejected: %s not allowed in this "
		       "transition (optional here: %s)", qpn, sv_qp_type_name(t),
		       sv_qp_state_name(cur), sv_qp_state_name(next),
		       sv_qp_mask_str(w->extra, b1, sizeof(b1)),
		       w->optional ? sv_qp_mask_str(w->optional, b2, sizeof(b2)) : "none");
}

/* Copies the attributes named in mask; PSNs are 24 bits (IBA 9.7.1) and
 * are masked as rxe does. */
static void apply_attrs(struct sv_qp *qp, const struct ibv_qp_attr *a, int mask)
{
	struct ibv_qp_attr *s = &qp->attr;

	if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) s->en_sqd_async_notify = a->en_sqd_async_notify;
	if (mask & IBV_QP_ACCESS_FLAGS) s->qp_access_flags = a->qp_access_flags;
	if (mask & IBV_QP_PKEY_INDEX) s->pkey_index = a->pkey_index;
	if (mask & IBV_QP_PORT) s->port_num = a->port_num;
	if (mask & IBV_QP_QKEY) s->qkey = a->qkey;
	if (mask & IBV_QP_AV) s->ah_attr = a->ah_attr;
	if (mask & IBV_QP_PATH_MTU) s->path_mtu = a->path_mtu;
	if (mask & IBV_QP_TIMEOUT) s->timeout = a->timeout;
	if (mask & IBV_QP_RETRY_CNT) s->retry_cnt = a->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY) s->rnr_retry = a->rnr_retry;
	if (mask & IBV_QP_RQ_PSN) s->rq_psn = a->rq_psn & SV_PSN_MASK;
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC) s->max_rd_atomic = a->max_rd_atomic;
	if (mask & IBV_QP_ALT_PATH) {
		s->alt_ah_attr = a->alt_ah_attr;
		s->alt_pkey_index = a->alt_pkey_index;
		s->alt_port_num = a->alt_port_num;
		s->alt_timeout = a->alt_timeout;
	}
	if (mask & IBV_QP_MIN_RNR_TIMER) s->min_rnr_timer = a->min_rnr_timer;
	if (mask & IBV_QP_SQ_PSN) s->sq_psn = a->sq_psn & SV_PSN_MASK;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) s->max_dest_rd_atomic = a->max_dest_rd_atomic;
	if (mask & IBV_QP_PATH_MIG_STATE) s->path_mig_state = a->path_mig_state;
	if (mask & IBV_QP_DEST_QPN) s->dest_qp_num = a->dest_qp_num;
}

/* A verb on another process's QP, run by its owner; its failure is
 * explained here with the owner's words. */
static int owner_call(struct sv_qp *qp, struct shm_owner_req *r, const char *verb)
{
	int ret = sv_owner_call(qp->owner, r);

	if (ret)
		return sv_fail(ret, verb, "qpn 0x%x: its owner, pid %d, has closed its context or "
			       "exited", r->qpn, (int)qp->owner->pid);
	if (r->status)
		return sv_fail(r->status, verb, "qpn 0x%x (in pid %d): %s", r->qpn,
			       (int)qp->owner->pid, r->why);
	return 0;
}

static void foreign_close(struct sv_qp *qp)
{
	struct shm_owner_req r = { .op = SHM_OWNER_CLOSE_QP, .qpn = qp->ex.qp_base.qp_num };

	/* An owner that is gone took the QP with it. */
	sv_owner_call(qp->owner, &r);
	pthread_cond_destroy(&qp->ex.qp_base.cond);
	pthread_mutex_destroy(&qp->ex.qp_base.mutex);
	free(qp);
}

SV_EXPORT int ibv_modify_qp(struct ibv_qp *ib, struct ibv_qp_attr *attr, int mask)
{
	struct sv_qp *qp = sv_qp(ib);
	struct sv_qp_transition_error why;
	struct value_error ve;
	char bits[256];
	int ret;

	if (!sv_obj_live(ib, SV_OBJ_QP))
		return sv_fail(EINVAL, "ibv_modify_qp", "QP %p is not live", (void *)ib);
	if (!attr)
		return sv_fail(EINVAL, "ibv_modify_qp", "attr is NULL");
	if (qp->owner) {
		struct shm_owner_req r = { .op = SHM_OWNER_MODIFY_QP, .qpn = ib->qp_num,
					   .mask = mask, .attr = *attr };
		ret = owner_call(qp, &r, "ibv_modify_qp");
		if (!ret && (mask & IBV_QP_STATE))
			ib->state = attr->qp_state;
		return ret;
	}
	sv_qp_sync(qp);
	pthread_mutex_lock(&qp->lock);
	enum ibv_qp_state cur = ib->state;
	enum ibv_qp_state next = mask & IBV_QP_STATE ? attr->qp_state : cur;

	if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) {
		ret = sv_fail(EINVAL, "ibv_modify_qp", "qpn 0x%x: cur_qp_state says %s but the QP is "
			      "in %s; drop IBV_QP_CUR_STATE or fix it", ib->qp_num,
			      sv_qp_state_name(attr->cur_qp_state), sv_qp_state_name(cur));
		goto out;
	}
	ret = sv_qp_transition_check(ib->qp_type, cur, next, mask, &why);
	if (ret) {
		explain_transition(qp, cur, next, &why);
		goto out;
	}
	ret = check_values(qp, attr, mask, &ve);
	if (ret) {
		sv_fail(ret, "ibv_modify_qp", "qpn 0x%x %s->%s rejected: %s: %s", ib->qp_num,
			sv_qp_state_name(cur), sv_qp_state_name(next),
			sv_qp_mask_str(ve.bit, bits, sizeof(bits)), ve.why);
		goto out;
	}
	char pwhy[200];
	ret = sv_pkt_qp_route(qp, attr, mask, pwhy, sizeof(pwhy));
	if (ret) {
		sv_fail(ret, "ibv_modify_qp", "qpn 0x%x %s->%s rejected: %s", ib->qp_num,
			sv_qp_state_name(cur), sv_qp_state_name(next), pwhy);
		goto out;
	}
	apply_attrs(qp, attr, mask);
	sv_qp_enter_state(qp, cur, next, attr, mask);
	sv_dbg("qpn 0x%x: %s -> %s", ib->qp_num, sv_qp_state_name(cur), sv_qp_state_name(next));
out:
	pthread_mutex_unlock(&qp->lock);
	/* WQEs held in SQD go on in RTS. */
	if (!ret && next == IBV_QPS_RTS && cur == IBV_QPS_SQD)
		sv_sq_progress(qp);
	return ret;
}

SV_EXPORT int ibv_query_qp(struct ibv_qp *ib, struct ibv_qp_attr *attr, int mask,
			   struct ibv_qp_init_attr *init)
{
	struct sv_qp *qp = sv_qp(ib);

	if (!sv_obj_live(ib, SV_OBJ_QP))
		return sv_fail(EINVAL, "ibv_query_qp", "QP %p is not live", (void *)ib);
	if (!attr || !init)
		return sv_fail(EINVAL, "ibv_query_qp", "attr and init_attr are needed");
	if (qp->owner) {
		struct shm_owner_req r = { .op = SHM_OWNER_QUERY_QP, .qpn = ib->qp_num, .mask = mask };
		int ret = owner_call(qp, &r, "ibv_query_qp");
		if (ret)
			return ret;
		*attr = r.attr;
		ib->state = attr->qp_state;
		memset(init, 0, sizeof(*init));
		init->qp_context = ib->qp_context;
		init->cap = r.cap;
		init->qp_type = ib->qp_type;
		return 0;
	}
	(void)mask;	/* every attribute is cheap: all are returned */
	sv_qp_sync(qp);
	pthread_mutex_lock(&qp->lock);
	*attr = qp->attr;
	attr->qp_state = ib->state;
	attr->cur_qp_state = ib->state;
	attr->cap = qp->cap;
	attr->sq_draining = 0;
	memset(init, 0, sizeof(*init));
	init->qp_context = ib->qp_context;
	init->send_cq = ib->send_cq;
	init->recv_cq = ib->recv_cq;
	init->srq = ib->srq;
	init->cap = qp->cap;
	init->qp_type = ib->qp_type;
	init->sq_sig_all = qp->sq_sig_all;
	pthread_mutex_unlock(&qp->lock);
	return 0;
}

int sv_post_recv(struct ibv_qp *ib, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct sv_qp *qp = sv_qp(ib);
	enum ibv_qp_state st = atomic_load_explicit(&qp->sh->state, memory_order_relaxed);
	int ret = 0;

	if (!qp->rq || st == IBV_QPS_RESET) {
		*bad = wr;
		return sv_fail(EINVAL, "ibv_post_recv", "qpn 0x%x: %s", ib->qp_num,
			       qp->rq ? "the QP is in RESET; post receives from INIT on" :
			       qp->srq ? "the QP receives through its SRQ; use ibv_post_srq_recv" :
			       "an XRC QP has no receive queue; XRC_RECV QPs deliver into XRC SRQs");
	}
	ret = sv_wq_post_list(qp->ctx->seg.h, qp->rq, wr, bad, "ibv_post_recv", "qpn", ib->qp_num);
	/* C10-?: receives posted to a QP in ERR are flushed. */
	if (st == IBV_QPS_ERR)
		sv_flush_rq(qp);
	/* A rendezvous FIN waiting for a receive WQE takes it now. */
	else if (atomic_load_explicit(&qp->fins_due, memory_order_relaxed)) {
		pthread_mutex_lock(&qp->sq_lock);
		sv_tm_send_fins(qp);
		pthread_mutex_unlock(&qp->sq_lock);
	}
	return ret;
}

static void qp_free(struct sv_qp *qp)
{
	struct ibv_qp *ib = &qp->ex.qp_base;
	struct sv_context *c = qp->ctx;

	/* Unpublish first: from here initiators find no QP. */
	sv_seg_publish_qp(c->seg.h, ib->qp_num, 0);
	atomic_store(&qp->sh->state, IBV_QPS_RESET);
	sv_pkt_qp_detach(qp);
	pthread_mutex_lock(&c->lock);
	SV_LIST_DEL(&c->qps, qp);
	pthread_mutex_unlock(&c->lock);
	qp_free_queues(qp);
	sv_reg_qpn_free(ib->qp_num);
	qp_hold(qp, -1);
	atomic_fetch_sub(&sv_ctx(ib->context)->nqp, 1);
	pthread_mutex_destroy(&qp->lock);
	pthread_cond_destroy(&ib->cond);
	pthread_mutex_destroy(&ib->mutex);
	free(qp);
}

void sv_qp_release(struct sv_qp *qp)
{
	if (sv_obj_del(qp, SV_OBJ_QP)) {
		if (qp->owner)
			foreign_close(qp);
		else
			qp_free(qp);
	}
}

struct open_key {
	uint32_t qpn;
	uint64_t xrcd;
};

static bool xtgt_match(const void *obj, const void *arg)
{
	const struct sv_qp *qp = obj;
	const struct open_key *k = arg;

	return qp->ex.qp_base.qp_type == IBV_QPT_XRC_RECV && qp->ex.qp_base.qp_num == k->qpn &&
	       qp->xrcd && qp->xrcd->id == k->xrcd;
}

/*
 * Another process's XRC target QP: a handle here whose verbs its owner
 * runs (modify, query; destroy drops the owner's count).  The QP lives
 * while its creating context is open; the kernel's outlives the creator
 * while any handle is open, which a QP whose queues and state live in its
 * creator's memory cannot.
 */
static struct ibv_qp *open_foreign(struct ibv_context *ctx, struct ibv_qp_open_attr *a,
				   const struct sv_reg_ep_info *ep)
{
	const char *verb = "ibv_open_qp";
	struct shm_hdr *h = sv_seg_peer(ep->index, ep->pid, ep->start_time);
	struct shm_qp *sh = h ? sv_seg_qp(h, a->qp_num) : NULL;
	uint64_t xrcd = sv_xrcd(a->xrcd)->id;

	if (!sh || sh->type != IBV_QPT_XRC_RECV || sh->xrcd != xrcd)
		return sv_fail_null(EINVAL, verb, "qpn 0x%x is no XRC_RECV QP of this domain",
				    a->qp_num);
	struct sv_qp *qp = calloc(1, sizeof(*qp));
	if (!qp)
		return sv_fail_null(ENOMEM, verb, "out of memory");
	qp->owner = h;
	qp->sh = sh;
	struct shm_owner_req r = { .op = SHM_OWNER_OPEN_QP, .qpn = a->qp_num, .xrcd = xrcd };
	if (owner_call(qp, &r, verb)) {
		free(qp);
		return NULL;
	}
	struct ibv_qp *ib = &qp->ex.qp_base;
	ib->context = ctx;
	ib->qp_num = a->qp_num;
	ib->qp_type = IBV_QPT_XRC_RECV;
	ib->state = (enum ibv_qp_state)atomic_load_explicit(&sh->state, memory_order_relaxed);
	ib->qp_context = a->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT ? a->qp_context : NULL;
	qp->ctx = sv_ctx(ctx);
	pthread_mutex_init(&ib->mutex, NULL);
	pthread_cond_init(&ib->cond, NULL);
	if (sv_obj_add(qp, SV_OBJ_QP, ctx)) {
		r.op = SHM_OWNER_CLOSE_QP;
		sv_owner_call(h, &r);
		free(qp);
		return sv_fail_null(ENOMEM, verb, "out of memory");
	}
	return ib;
}

/* The owner's side of owner_call(): this context's QP numbered r->qpn. */
void sv_qp_serve(struct sv_context *c, struct shm_owner_req *r)
{
	struct sv_qp *qp;

	pthread_mutex_lock(&c->lock);
	for (qp = c->qps; qp; qp = qp->next)
		if (qp->ex.qp_base.qp_num == r->qpn && qp->ex.qp_base.qp_type == IBV_QPT_XRC_RECV)
			break;
	pthread_mutex_unlock(&c->lock);
	if (!qp || !sv_obj_live(qp, SV_OBJ_QP) ||
	    (r->op == SHM_OWNER_OPEN_QP && (!qp->xrcd || qp->xrcd->id != r->xrcd))) {
		r->status = EINVAL;
		snprintf(r->why, sizeof(r->why), "no XRC_RECV QP of this domain has that number");
		return;
	}
	struct ibv_qp *ib = &qp->ex.qp_base;
	struct ibv_qp_init_attr init;
	switch (r->op) {
	case SHM_OWNER_OPEN_QP:
		atomic_fetch_add(&qp->opens, 1);
		return;
	case SHM_OWNER_CLOSE_QP:
		/* As any handle's destroy: the QP goes with the last. */
		r->status = ibv_destroy_qp(ib);
		break;
	case SHM_OWNER_MODIFY_QP:
		r->status = ibv_modify_qp(ib, &r->attr, r->mask);
		break;
	case SHM_OWNER_QUERY_QP:
		r->status = ibv_query_qp(ib, &r->attr, r->mask, &init);
		r->cap = init.cap;
		break;
	default:
		r->status = EINVAL;
		snprintf(r->why, sizeof(r->why), "unknown request %u", r->op);
		return;
	}
	if (r->status)
		snprintf(r->why, sizeof(r->why), "%s", sv_last_failure());
}

/*
 * ibv_open_qp: another handle on an XRC target QP of the same domain.
 * Within a process, as with imports, the handle is the QP itself; each
 * open adds a reference and ibv_destroy_qp drops one, the QP going with
 * the last (the kernel's shared XRC target QPs behave the same).  The
 * opener's qp_context is not kept: the creator's stays.  Another
 * process's QP gets a handle of its own (open_foreign).
 */
struct ibv_qp *sv_open_qp(struct ibv_context *ctx, struct ibv_qp_open_attr *a)
{
	const char *verb = "ibv_open_qp";
	const uint32_t need = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;

	if (!sv_context_live(ctx, verb))
		return NULL;
	if (!a || (a->comp_mask & need) != need || (a->comp_mask & ~(need | IBV_QP_OPEN_ATTR_CONTEXT)))
		return sv_fail_null(EINVAL, verb, "comp_mask must name NUM, XRCD and TYPE (and may "
				    "name CONTEXT)");
	if (a->qp_type != IBV_QPT_XRC_RECV)
		return sv_fail_null(EINVAL, verb, "only XRC_RECV QPs can be opened");
	if (!sv_xrcd_of(a->xrcd, ctx, verb))
		return NULL;
	struct open_key k = { a->qp_num, sv_xrcd(a->xrcd)->id };
	struct sv_qp *qp = sv_obj_find(SV_OBJ_QP, xtgt_match, &k);
	if (qp) {
		atomic_fetch_add(&qp->opens, 1);
		return &qp->ex.qp_base;
	}
	struct sv_reg_ep_info ep;
	if (!sv_reg_qpn_owner(a->qp_num, &ep) && ep.pid != sv_pid())
		return open_foreign(ctx, a, &ep);
	return sv_fail_null(EINVAL, verb, "qpn 0x%x is no XRC_RECV QP of this domain", a->qp_num);
}

SV_EXPORT int ibv_destroy_qp(struct ibv_qp *ib)
{
	struct sv_qp *qp = sv_qp(ib);

	if (sv_obj_live(ib, SV_OBJ_QP) && qp->owner && sv_obj_del(ib, SV_OBJ_QP)) {
		foreign_close(qp);
		return 0;
	}
	/* A handle from ibv_open_qp: drop its reference only. */
	if (sv_obj_live(ib, SV_OBJ_QP)) {
		unsigned o = atomic_load(&qp->opens);
		while (o)
			if (atomic_compare_exchange_weak(&qp->opens, &o, o - 1))
				return 0;
	}
	/* The kernel keeps a QP with flow rules (EBUSY). */
	if (sv_obj_live(ib, SV_OBJ_QP) && atomic_load(&qp->flows))
		return sv_fail(EBUSY, "ibv_destroy_qp", "qpn 0x%x still has %u flow rules; destroy "
			       "them first", ib->qp_num, atomic_load(&qp->flows));
	if (!sv_obj_del(ib, SV_OBJ_QP))
		return sv_fail(EINVAL, "ibv_destroy_qp", "QP %p is not live (destroyed already?)",
			       (void *)ib);
	/* Unread events die with the QP; read ones must be acked first
	 * (rdma-core ibv_destroy_qp waits the same way). */
	sv_events_settle(ib->context, NULL, qp, &ib->mutex, &ib->cond, &ib->events_completed,
			 &qp->events_reported);
	qp_free(qp);
	return 0;
}
