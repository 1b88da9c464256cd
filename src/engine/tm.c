/* SPDX-License-Identifier: MIT */
/*
 * A message arriving at a tag-matching SRQ, executed by the initiator as
 * every receive is (engine/resp.c).  The rules are rdma-core's
 * (Documentation/tag_matching.md) with mlx5's completions, which
 * rdma-core's tests encode:
 *
 *  - EAGER matching a tag: the payload after the TMH lands in the tag's
 *    buffer; one TM_RECV completion with TM_MATCH | TM_DATA_VALID, the tag
 *    and the app_ctx.
 *  - RNDV matching a tag: TM_RECV with TM_MATCH at once; the device then
 *    reads the payload the RVH names from the sender -- checked as an RDMA
 *    READ arriving at the sending QP: its access flags, the rkey in its PD
 *    -- completes TM_RECV with TM_DATA_VALID, and sends the sender a FIN
 *    (the TMH and RVH with opcode FIN) into a receive WQE of the sending
 *    QP.  A tag buffer too small for the payload gets the headers instead
 *    and IBV_WC_TM_RNDV_INCOMPLETE; software finishes the transfer.
 *  - Anything else goes whole, headers included, to an ordinary SRQ
 *    buffer: IBV_WC_TM_NO_TAG for a NO_TAG message, IBV_WC_TM_RECV without
 *    flags for an unexpected tagged one (which counts for phase
 *    synchronisation, verbs/tm.c), IBV_WC_RECV for one without a TMH.
 *
 * Every completion goes to the SRQ's CQ.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <infiniband/tm_types.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"

struct tm_hdr {
	struct ibv_tmh tmh;
	struct ibv_rvh rvh;
};

/* The first n bytes of a message gathered from its iovec. */
static void gather(const struct iovec *msg, int nmsg, void *buf, size_t n)
{
	for (int i = 0; i < nmsg && n; i++) {
		size_t k = msg[i].iov_len < n ? msg[i].iov_len : n;
		struct iovec d = { buf, k };
		sv_copy_iov(&d, 1, &msg[i], 1);	/* the sender's buffer may be GPU memory */
		buf = (char *)buf + k;
		n -= k;
	}
}

/* The message without its first `skip` bytes. */
static int advance(const struct iovec *msg, int nmsg, size_t skip, struct iovec *out)
{
	int n = 0;

	for (int i = 0; i < nmsg; i++) {
		size_t k = msg[i].iov_len < skip ? msg[i].iov_len : skip;
		skip -= k;
		if (msg[i].iov_len > k)
			out[n++] = (struct iovec){ (char *)msg[i].iov_base + k, msg[i].iov_len - k };
	}
	return n;
}

/*
 * One decision under the SRQ's lock: the earliest posted active tag that
 * matches, or else an ordinary WQE.  An unexpected message is counted in
 * the same hold, so a tag added after it cannot match a later message
 * before software has seen this one.
 */
static enum sv_result tm_take(struct sv_target *t, struct shm_wq *wq, bool tagged, uint64_t tag,
			      struct shm_rwqe *out, bool *matched)
{
	struct shm_tm_tag *best = NULL;

	*matched = false;
	sv_shm_lock(&wq->lock);
	for (uint32_t i = 0, seen = 0; tagged && i < wq->tm_tags && seen < wq->tm_used; i++) {
		struct shm_tm_tag *e = shm_tm_at(t->seg, wq, i);
		if (e->state == SHM_TM_FREE)
			continue;
		seen++;
		if (e->state == SHM_TM_ACTIVE && !((tag ^ e->tag) & e->mask) &&
		    (!best || e->seq < best->seq))
			best = e;
	}
	if (best) {
		struct shm_rwqe *w = shm_tm_wqe(best);
		memcpy(out, w, sizeof(*w) + w->num_sge * sizeof(w->sge[0]));
		best->state = SHM_TM_FREE;
		best->gen = (best->gen + 1) & 0xffff;
		wq->tm_used--;
		*matched = true;
		sv_shm_unlock(&wq->lock);
		return SV_R_OK;
	}
	if (!wq->count) {
		sv_shm_unlock(&wq->lock);
		return SV_R_RNR;	/* 9.7.5.2.8: no receive WQE, RNR NAK */
	}
	bool ring = sv_resp_pop_locked(t, wq, out);
	if (tagged)
		wq->tm_unexp++;
	sv_shm_unlock(&wq->lock);
	if (ring)
		sv_seg_ring(t->seg);
	return SV_R_OK;
}

static uint64_t wqe_capacity(const struct shm_rwqe *w)
{
	uint64_t cap = 0;

	for (uint32_t i = 0; i < w->num_sge; i++)
		cap += w->sge[i].length;
	return cap;
}

/* The device's FINs to a rendezvous sender, into receive WQEs of the
 * sending QP: each the TMH and RVH of its request with opcode FIN.  A FIN
 * without a WQE waits for the next ibv_post_recv, as a message the
 * receiver NAKs with RNR is retried (rnr_retry 7). */
void sv_tm_send_fins(struct sv_qp *qp)
{
	union { struct shm_rwqe w; char buf[sizeof(struct shm_rwqe) + SV_MAX_SGE * sizeof(struct ibv_sge)]; } rw;
	struct sv_target self;
	uint32_t sent = 0;

	if (sv_resp_find(qp, qp->ex.qp_base.qp_num, &self) != SV_R_OK)
		return;
	while (sent < qp->fin_n && sv_resp_take_recv(&self, &rw.w) == SV_R_OK) {
		struct tm_hdr fin;
		struct iovec v = { &fin, sizeof(fin) };
		struct shm_cqe e = { .opcode = IBV_WC_RECV, .src_qp = qp->fin[sent].from_qpn };
		_Static_assert(sizeof(fin) == sizeof(qp->fin[0].hdr), "FIN header");
		memcpy(&fin, qp->fin[sent].hdr, sizeof(fin));
		fin.tmh.opcode = IBV_TMH_FIN;
		sent++;
		if (sv_deliver_wqe(qp, NULL, &self, &rw.w, &v, 1, sizeof(fin), true, &e) != SV_R_OK)
			break;
	}
	qp->fin_n -= sent;
	memmove(qp->fin, qp->fin + sent, qp->fin_n * sizeof(qp->fin[0]));
	atomic_store_explicit(&qp->fins_due, qp->fin_n, memory_order_relaxed);
}

static enum sv_result rndv(struct sv_qp *qp, struct sv_target *t, const struct shm_rwqe *w,
			   const struct tm_hdr *h, const struct iovec *msg, int nmsg, uint64_t len)
{
	uint64_t tag = be64toh(h->tmh.tag);
	uint32_t priv = be32toh(h->tmh.app_ctx), rlen = be32toh(h->rvh.len);
	struct shm_cqe e = { .wr_id = w->wr_id, .opcode = IBV_WC_TM_RECV, .wc_flags = IBV_WC_TM_MATCH,
			     .tag = tag, .imm = priv, .qp_num = t->qp->qpn,
			     .src_qp = qp->ex.qp_base.qp_num };

	sv_cq_push(t->seg, shm_at(t->seg, t->rcq_off), &e);
	if (rlen > wqe_capacity(w)) {
		struct shm_cqe inc = { .status = IBV_WC_TM_RNDV_INCOMPLETE, .opcode = IBV_WC_TM_RECV,
				       .tag = tag, .imm = priv };
		return sv_deliver_wqe(qp, NULL, t, w, msg, nmsg, len, true, &inc);
	}
	/* The device's RDMA READ of the payload, as the sending QP's
	 * responder would check it (C9-88..91). */
	struct sv_target self = { .why = "" };
	struct shm_mr *mr = NULL;
	void *addr = NULL;
	enum sv_result r = sv_resp_find(qp, qp->ex.qp_base.qp_num, &self);
	if (r == SV_R_OK)
		r = sv_resp_mr_get(&self, be32toh(h->rvh.rkey), be64toh(h->rvh.va), rlen,
				   IBV_ACCESS_REMOTE_READ, &mr, &addr);
	if (r != SV_R_OK) {
		/* The device's READ was NAKed: the tag completes with the
		 * requester's status and the receiving QP goes to ERR; the
		 * sending QP, the READ's responder, goes to ERR with an access
		 * error event (IBA 11.6.3.1).  The SEND itself was delivered. */
		sv_explain("rendezvous read failed", "tag 0x%llx: %s", (unsigned long long)tag,
			   self.why[0] ? self.why : "the sending QP is not receiving");
		struct shm_cqe bad = { .wr_id = w->wr_id, .status = sv_result_status(r),
				       .opcode = IBV_WC_TM_RECV, .qp_num = t->qp->qpn,
				       .src_qp = qp->ex.qp_base.qp_num };
		sv_cq_push(t->seg, shm_at(t->seg, t->rcq_off), &bad);
		sv_resp_fail(t, NULL, IBV_WC_SUCCESS, -1);
		if (r == SV_R_NAK_ACCESS)
			sv_resp_fail(&self, NULL, IBV_WC_SUCCESS, IBV_EVENT_QP_ACCESS_ERR);
		return SV_R_OK;
	}
	struct iovec src = { addr, rlen };
	struct shm_cqe done = { .opcode = IBV_WC_TM_RECV, .wc_flags = IBV_WC_TM_DATA_VALID };
	r = sv_deliver_wqe(qp, NULL, t, w, &src, 1, rlen, true, &done);
	sv_resp_mr_put(self.mseg, mr);
	if (r == SV_R_OK && qp->fin_n < SV_MAX_FIN_DUE) {
		qp->fin[qp->fin_n].from_qpn = t->qp->qpn;
		memcpy(qp->fin[qp->fin_n++].hdr, h, sizeof(*h));
		atomic_store_explicit(&qp->fins_due, qp->fin_n, memory_order_relaxed);
	} else if (r == SV_R_OK) {
		sv_explain("rendezvous FIN lost", "qpn 0x%x awaits %d FINs already (post receives "
			   "for them)", qp->ex.qp_base.qp_num, SV_MAX_FIN_DUE);
	}
	return r;
}

/*
 * The decision both paths make on a message's first bytes (h, of a
 * message of at least len bytes): the WQE it lands in, and how its
 * completion reads.  *rndv: a rendezvous message matched a tag, whose
 * payload is still to be read from the sender.
 */
static enum sv_result decide(struct sv_target *t, struct shm_wq *wq, const struct tm_hdr *h,
			     uint64_t len, struct shm_rwqe *out, struct sv_tm_recv *how, bool *rndv)
{
	bool has_tmh = len >= sizeof(h->tmh);
	bool is_rndv = len >= sizeof(*h) && h->tmh.opcode == IBV_TMH_RNDV;
	bool tagged = (has_tmh && h->tmh.opcode == IBV_TMH_EAGER) || is_rndv;
	bool matched;

	t->rcq_off = wq->cq_off;	/* every completion to the SRQ's CQ */
	enum sv_result r = tm_take(t, wq, tagged, be64toh(h->tmh.tag), out, &matched);
	if (r != SV_R_OK)
		return r;
	*rndv = matched && is_rndv;
	if (!matched)
		*how = (struct sv_tm_recv){ .opcode = tagged ? IBV_WC_TM_RECV :
						      has_tmh && h->tmh.opcode == IBV_TMH_NO_TAG ?
						      IBV_WC_TM_NO_TAG : IBV_WC_RECV };
	else
		*how = (struct sv_tm_recv){ .opcode = IBV_WC_TM_RECV,
					    .wc_flags = IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID,
					    .tag = be64toh(h->tmh.tag),
					    .imm = be32toh(h->tmh.app_ctx), .skip = sizeof(h->tmh) };
	return SV_R_OK;
}

enum sv_result sv_tm_deliver(struct sv_qp *qp, const struct sv_swqe *w, struct sv_target *t,
			     struct shm_wq *wq, const struct iovec *msg, int nmsg, uint64_t len)
{
	union { struct shm_rwqe w; char buf[sizeof(struct shm_rwqe) + SV_MAX_SGE * sizeof(struct ibv_sge)]; } rw;
	struct tm_hdr h = { 0 };
	struct sv_tm_recv how;
	bool rndv_matched;

	gather(msg, nmsg, &h, len < sizeof(h) ? len : sizeof(h));
	enum sv_result r = decide(t, wq, &h, len, &rw.w, &how, &rndv_matched);
	if (r != SV_R_OK)
		return r;
	if (rndv_matched)
		return rndv(qp, t, &rw.w, &h, msg, nmsg, len);
	struct iovec payload[SV_MAX_SGE + 1];
	int n = advance(msg, nmsg, how.skip, payload);
	struct shm_cqe e = { .opcode = how.opcode, .wc_flags = how.wc_flags, .tag = how.tag,
			     .imm = how.imm };
	return sv_deliver_wqe(qp, w, t, &rw.w, payload, n, len - how.skip, true, &e);
}

enum sv_result sv_tm_take_first(struct sv_target *t, struct shm_wq *wq, const uint8_t *first,
				size_t first_len, bool rndv_room, struct shm_rwqe *out,
				struct sv_tm_recv *how)
{
	struct tm_hdr h = { 0 };
	bool rndv_matched;

	memcpy(&h, first, first_len < sizeof(h) ? first_len : sizeof(h));
	/* A rendezvous's READ and FIN need slots of the receiving QP's own
	 * (engine/pkt_req.c): without them the message waits, as for a
	 * missing receive WQE (9.7.5.2.8), before it can take a tag. */
	if (first_len >= sizeof(h) && h.tmh.opcode == IBV_TMH_RNDV && !rndv_room)
		return SV_R_RNR;
	enum sv_result r = decide(t, wq, &h, first_len, out, how, &rndv_matched);
	if (r != SV_R_OK || !rndv_matched)
		return r;
	/* The match completes at the message's end; then the payload is
	 * read from the sender (the device's READ), or, when the tag's
	 * buffer cannot hold it, the message itself lands there. */
	memcpy(how->hdr, &h, sizeof(h));
	how->wc_flags = IBV_WC_TM_MATCH;
	how->rndv = be32toh(h.rvh.len) > wqe_capacity(out) ? SV_TM_RNDV_SHORT : SV_TM_RNDV_READ;
	how->skip = 0;
	return SV_R_OK;
}
