/* SPDX-License-Identifier: MIT */
/*
 * The packet responder: requests from another host, executed in this
 * process against its own segment with the same checks engine/resp.c
 * runs for shm initiators (IBA 9.7.4, rxe_resp.c).
 *
 * RC (IBA 9.7.5): a request must carry the expected PSN.  A later PSN is
 * out of sequence (one NAK per expected PSN, 9.7.5.2.?); an earlier one
 * is a duplicate, answered again but never executed twice: a READ is
 * served again from memory, an atomic from the result kept for it
 * (9.7.5.3.2), a SEND or WRITE with an ACK.  ACKs are coalesced: one per
 * QP per received batch, for the last packet that asked (9.7.5.1.1).
 * UC: no responses; a message with a lost packet is dropped whole
 * (9.7.5.? and rxe's "drop until the next FIRST").  UD: DETH, Q_Key,
 * and the GRH built from the received IP header (IBA 11.4.1.1, RoCEv2
 * A17.4.5.1).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "pkt.h"

static unsigned tr_code(const struct pkt_qp *q)
{
	return q->tr;
}

static bool rc(const struct pkt_qp *q)
{
	unsigned tr = tr_code(q);

	return tr == IB_TR_RC || tr == IB_TR_XRC;
}

/* An ACK or NAK (AETH syndrome syn) for psn. */
static void send_aeth(struct pkt_qp *q, uint8_t syn, uint32_t psn)
{
	uint8_t hdr[sizeof(struct ib_bth) + sizeof(struct ib_aeth)];

	/* A NAK acknowledges every request before its PSN (the requester
	 * completes them, pkt_req.c nak), so an ACK still due adds nothing;
	 * one for psn or later is void (a WRITE whose run into GPU memory
	 * failed had its ACK due). */
	if ((syn & 0xe0) != AETH_ACK)
		q->ack_due = false;

	bth_set((struct ib_bth *)hdr, (uint8_t)(tr_code(q) | IB_OP_ACK), false, 0, 0xffff,
		q->dest_qpn, false, psn);
	aeth_set((struct ib_aeth *)(hdr + sizeof(struct ib_bth)), syn, q->msn);
	pkt_send(q, &q->peer, hdr, sizeof(hdr), NULL, 0, 0);
}

void pkt_resp_ack(struct pkt_qp *q)
{
	q->ack_due = false;
	send_aeth(q, AETH_ACK | AETH_CREDITS_INVALID, q->ack_psn);
}

/*
 * A coalesced ACK still due leaves before a READ or an atomic is
 * answered, new or duplicate (pkt_resp_rx, duplicate): responses go in
 * the order of the requests (IBA 9.7.5.1), and the requester reads an
 * ACK for a PSN behind a later response as a stale duplicate.  Held
 * until the batch's end, it also carried the MSN of messages after its
 * PSN.  What it acknowledges is in place first (a run into GPU memory
 * is copied; a failed copy NAKs instead).
 */
static void send_due_ack(struct pkt_qp *q)
{
	if (!q->ack_due)
		return;
	pkt_gpu_flush_resp(q->pc);
	if (q->ack_due)
		pkt_resp_ack(q);
}

void pkt_resp_reset(struct pkt_qp *q)
{
	q->nak_sent = q->ack_due = false;
	q->cur = 0;
	q->have_wqe = false;
	q->off = q->wleft = 0;
	memset(q->ares, 0, sizeof(q->ares));
}

/* A message took its receive WQE: where that completes is kept with it,
 * for a QP that enters Error before the message ends.  Only where it
 * lives as long as the QP: in the QP's own context, not an XRC SRQ's
 * (which may be another context's, closed since, or destroyed). */
static void hold_wqe(struct pkt_qp *q, const struct sv_target *t)
{
	q->have_wqe = true;
	q->held_seg = t->seg == q->qp->ctx->seg.h && tr_code(q) != IB_TR_XRC ? t->seg : NULL;
	q->held_cq = t->rcq_off;
	q->held_qpn = t->wq_num ? t->wq_num : t->qp->qpn;
}

/* IBA 10.3.1.7: entering Error, every outstanding WQE completes flushed,
 * also the one a message under way took from its queue (rxe completes
 * its resp.wqe so).  Before the queue's own, which it preceded. */
void sv_pkt_rq_flush_held(struct sv_qp *qp)
{
	struct pkt_ctx *pc = qp->ctx->pkt;

	if (!pc)
		return;
	/* qp->pq under rx_lock: destroying the QP detaches it under that
	 * lock (pkt.c), from another thread than this transition's. */
	pthread_mutex_lock(&pc->rx_lock);
	struct pkt_qp *q = qp->pq;
	/* A tag's completion is the SRQ's (engine/tm.c): not flushed here. */
	if (q && q->have_wqe && q->held_seg && !q->tm) {
		struct shm_cqe e = { .wr_id = q->rwqe.w.wr_id, .status = IBV_WC_WR_FLUSH_ERR,
				     .opcode = IBV_WC_RECV, .qp_num = q->held_qpn };
		sv_cq_push(q->held_seg, shm_at(q->held_seg, q->held_cq), &e);
		q->have_wqe = false;
		q->cur = 0;
		q->off = 0;
	}
	pthread_mutex_unlock(&pc->rx_lock);
}

static void want_ack(struct pkt_qp *q, uint32_t psn)
{
	q->ack_psn = psn;
	q->ack_due = true;
	/* Listed once however often its ACK falls due and is cleared (a
	 * reset while a poller holds the list): only the list's walk and
	 * unhash() take it off. */
	if (!q->ack_listed) {
		q->ack_listed = true;
		q->ack_next = q->pc->acks;
		q->pc->acks = q;
	}
}

/*
 * The responder's error: a NAK at once for RC, and the QP to ERR with the
 * receive WQE's completion and the affiliated event (IBA 9.9.3.1.?,
 * 11.6.3.1), as sv_resp_fail() does for shm initiators.  UC drops.
 */
static void fail(struct pkt_qp *q, struct sv_target *t, uint8_t nak, uint32_t psn,
		 enum ibv_wc_status st, int ev, const char *what)
{
	struct shm_rwqe *w = q->have_wqe ? &q->rwqe.w : NULL;

	PKT_COUNT(q, drops);
	if (!rc(q))
		return;
	char a[INET6_ADDRSTRLEN + 12];
	sv_explain("responder", "qpn 0x%x psn 0x%x from qpn 0x%x at %s: %s%s%s", q->qpn, psn,
		   q->dest_qpn, sv_route_addr(&q->peer.dst, q->peer.ifindex, a, sizeof(a)), what,
		   t->why[0] ? ": " : "", t->why);
	send_aeth(q, (uint8_t)(AETH_NAK | nak), psn);
	/* The receive WQE the message took completes in error whatever
	 * failed, with the status the NAK gives the requester, as rxe's
	 * do_class_ac_error() sets it. */
	if (w && st == IBV_WC_SUCCESS)
		st = nak == NAK_REM_ACCESS ? IBV_WC_REM_ACCESS_ERR :
		     nak == NAK_INV_REQ ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR;
	sv_resp_fail(t, w, st, ev);
	q->have_wqe = false;
	q->cur = 0;
}

/* C10-?: an RNR NAK carries the responder's min_rnr_timer (9.7.5.2.8). */
static void rnr(struct pkt_qp *q, uint32_t psn)
{
	PKT_COUNT(q, rnr_naks);
	if (rc(q))
		send_aeth(q, (uint8_t)(AETH_RNR | (q->qp->sh->min_rnr_timer & 0x1f)), psn);
}

/* Copies the payload into the receive WQE at q->off. */
static enum sv_result place_recv(struct pkt_qp *q, struct sv_target *t, const uint8_t *data,
				 size_t len, uint64_t extra_at, const void *extra, size_t elen)
{
	struct iovec riov[SV_MAX_SGE], dst[SV_MAX_SGE + 1], src[2];
	struct shm_mr *held[SV_MAX_SGE];
	uint64_t cap;
	int ns = 0;

	enum sv_result r = sv_resp_recv_iov(t, &q->rwqe.w, riov, &cap, held);
	if (r != SV_R_OK)
		return r;
	if (q->off + elen + len > cap) {
		sv_resp_recv_put(t, &q->rwqe.w, held);
		snprintf(t->why, sizeof(t->why), "the message is longer than receive wr_id 0x%llx's "
			 "%llu bytes", (unsigned long long)q->rwqe.w.wr_id, (unsigned long long)cap);
		return SV_R_LOC_LEN;
	}
	(void)extra_at;
	if (elen)
		src[ns++] = (struct iovec){ (void *)extra, elen };
	if (len)
		src[ns++] = (struct iovec){ (void *)data, len };
	int nd = sv_iov_slice(riov, (int)q->rwqe.w.num_sge, q->off, elen + len, dst);
	int err = ns ? sv_target_move(t, true, src, ns, dst, nd) : 0;
	sv_resp_recv_put(t, &q->rwqe.w, held);
	if (err)
		return SV_R_LOC_PROT;
	q->off += elen + len;
	return SV_R_OK;
}

/*
 * A message's receive completion.  For RC its ACK is due with the batch's
 * (coalesced, or held by a CQ poller until its application's next post:
 * sv_pkt_rx_unlock_poller).  An application that sees the completion and
 * leaves still sends it: destroying the QP or closing the context sends
 * what is held, and so does exit() (pkt.c).  A process killed before
 * that loses it, as an ACK lost on the wire with its responder gone: the
 * requester's retries end in IBV_WC_RETRY_EXC_ERR, which IBA allows for
 * a message that was delivered (C9-140).
 */
static bool complete_recv(struct pkt_qp *q, struct sv_target *t, enum ibv_wc_opcode op,
			  uint32_t len, uint32_t src_qp, uint32_t wc_flags, uint32_t imm, bool se,
			  uint32_t psn)
{
	/* The completion follows the data; a run of this QP's that failed
	 * has failed the QP, and nothing completes. */
	if (pkt_gpu_flush_held(q->pc, NULL) == q)
		return false;
	if (rc(q)) {
		want_ack(q, psn);
		q->acked = true;
	}
	struct shm_cqe e = {
		.wr_id = q->rwqe.w.wr_id, .opcode = (uint8_t)op, .byte_len = len,
		.qp_num = t->wq_num ? t->wq_num : t->qp->qpn, .src_qp = src_qp,
		.wc_flags = wc_flags, .imm = imm, .solicited = se, .tag = q->tm ? q->tm_how.tag : 0,
		.slid = sv_config()->link == SV_LINK_IB ? q->src_lid : 0,
	};

	q->have_wqe = false;
	sv_cq_push(t->seg, shm_at(t->seg, t->rcq_off), &e);
	return true;
}

/*
 * The end of a rendezvous message that matched a tag (engine/tm.c): the
 * match completes, then either the message, landed whole in a buffer too
 * small for the payload, completes IBV_WC_TM_RNDV_INCOMPLETE, or this
 * QP's device reads the payload from the sender and sends it the FIN
 * (pkt_req_rndv).  The SEND's ACK leaves first: on the wire it precedes
 * the READ, so the sender sees its SEND complete before the FIN arrives,
 * as the shm path orders them.
 */
static void rndv_done(struct pkt_qp *q, struct sv_target *t, bool se, uint32_t psn)
{
	const struct sv_tm_recv *h = &q->tm_how;
	uint64_t wr_id = q->rwqe.w.wr_id;

	if (!complete_recv(q, t, IBV_WC_TM_RECV, 0, q->dest_qpn, IBV_WC_TM_MATCH, h->imm, se, psn))
		return;
	if (h->rndv == SV_TM_RNDV_SHORT) {
		struct shm_cqe e = { .wr_id = wr_id, .status = IBV_WC_TM_RNDV_INCOMPLETE,
				     .opcode = IBV_WC_TM_RECV, .byte_len = (uint32_t)q->off,
				     .qp_num = t->qp->qpn, .src_qp = q->dest_qpn, .tag = h->tag,
				     .imm = h->imm };
		sv_cq_push(t->seg, shm_at(t->seg, t->rcq_off), &e);
		return;
	}
	pkt_resp_ack(q);
	pkt_req_rndv(q, &q->rwqe.w, h->hdr);
}

/* The 40 bytes before a UD message: the IPv6 header it came with, or for
 * IPv4 its IPv4 header in the last 20 (RoCEv2, Annex A17.4.5.1).  Both
 * as received: traffic class, flow label and hop limit, or TOS and TTL,
 * from the socket's ancillary data (udp.c). */
static void grh_of(const struct sv_link_pkt *p, uint8_t *g)
{
	memset(g, 0, 40);
	if (!p->route.v4) {
		g[0] = (uint8_t)(0x60 | p->route.tclass >> 4);
		g[1] = (uint8_t)(p->route.tclass << 4 | (p->route.flow >> 16 & 0xf));
		g[2] = (uint8_t)(p->route.flow >> 8);
		g[3] = (uint8_t)p->route.flow;
		uint16_t pl = (uint16_t)(8 + p->len + 4);
		g[4] = (uint8_t)(pl >> 8);
		g[5] = (uint8_t)pl;
		g[6] = 17;
		g[7] = p->route.ttl;
		memcpy(g + 8, &p->route.src, 16);
		memcpy(g + 24, &p->route.dst, 16);
		return;
	}
	uint8_t *ip = g + 20;
	uint16_t tot = (uint16_t)(20 + 8 + p->len + 4);
	ip[0] = 0x45;
	ip[1] = p->route.tclass;
	ip[2] = (uint8_t)(tot >> 8);
	ip[3] = (uint8_t)tot;
	ip[6] = 0x40;	/* DF */
	ip[8] = p->route.ttl;
	ip[9] = 17;
	memcpy(ip + 12, &p->route.src.s6_addr[12], 4);
	memcpy(ip + 16, &p->route.dst.s6_addr[12], 4);
	sv_ipv4_csum(ip);
}

static void ud_rx(struct pkt_qp *q, const struct ib_bth *bth, const struct sv_link_pkt *p)
{
	const uint8_t *h = p->buf + sizeof(*bth);
	unsigned hl = sizeof(*bth) + ib_hdr_len(bth->opcode);
	size_t plen = p->len - hl - bth_pad(bth);
	uint32_t qkey = ib_get32(h), sqp = ib_get32(h + 4) & SV_QPN_MASK;
	bool imm = ib_opinfo[bth_op(bth)].flags & IBH_IMM;
	struct sv_target t;

	if (sv_resp_local(q->qp->ctx, q->qpn, &t) != SV_R_OK)
		return;
	/* C10-15: the Q_Key must match (a UD QP takes nothing else). */
	if (qkey != atomic_load_explicit(&t.qp->qkey, memory_order_relaxed)) {
		PKT_COUNT(q, drops);
		return;
	}
	if (sv_resp_take_recv(&t, &q->rwqe.w) != SV_R_OK) {
		PKT_COUNT(q, drops);	/* UD: no receive WQE, the message is lost */
		return;
	}
	hold_wqe(q, &t);
	/* The first 40 bytes are the GRH's (IBA 11.4.1.1).  In IB mode
	 * none travels (a RoCEv2 packet has its IP header in that place):
	 * they are left as they are, as a NIC leaves them for a packet
	 * without one, and the LID is the sender address's. */
	bool ib = sv_config()->link == SV_LINK_IB;
	uint8_t grh[40];
	if (ib) {
		uint32_t from;
		memcpy(&from, &p->route.src.s6_addr[12], 4);
		q->src_lid = p->route.v4 ? sv_addr_lid(q->qp->ctx->dev, from) : 0;
		if (!q->src_lid)	/* forced packets on this host */
			q->src_lid = sv_port_lid(q->qp->ctx->dev);
	} else {
		grh_of(p, grh);
	}
	q->off = ib ? 40 : 0;
	enum sv_result r = place_recv(q, &t, p->buf + hl, plen, 0, ib ? NULL : grh, ib ? 0 : 40);
	if (r != SV_R_OK) {
		sv_resp_fail(&t, &q->rwqe.w, r == SV_R_LOC_LEN ? IBV_WC_LOC_LEN_ERR :
			     IBV_WC_LOC_PROT_ERR, -1);
		q->have_wqe = false;
		return;
	}
	uint32_t iv = 0;
	if (imm)
		memcpy(&iv, h + 8, 4);
	complete_recv(q, &t, IBV_WC_RECV, (uint32_t)(plen + 40), sqp,
		      (ib ? 0 : IBV_WC_GRH) | (imm ? IBV_WC_WITH_IMM : 0), iv, bth_se(bth), 0);
}

/* READ responses for [va, va + len) from PSN psn on. */
static void read_respond(struct pkt_qp *q, struct sv_target *t, uint32_t psn, uint64_t va,
			 uint32_t rkey, uint32_t len)
{
	struct shm_mr *mr;
	void *addr;
	enum sv_result r = sv_resp_mr_get(t, rkey, va, len, IBV_ACCESS_REMOTE_READ, &mr, &addr);

	if (r != SV_R_OK) {
		fail(q, t, NAK_REM_ACCESS, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_ACCESS_ERR,
		     "RDMA READ refused");
		return;
	}
	uint32_t n = len ? (len + q->mtu - 1) / q->mtu : 1;
	/* Memory of another process (an imported context's home), that
	 * may be unmapped (ODP) or that is GPU memory goes through a copy;
	 * the rest is gathered straight into the datagram. */
	bool copy = t->pid != sv_pid() ||
		    (mr && ((mr->access & IBV_ACCESS_ON_DEMAND) || mr->mem != SHM_MEM_HOST));
	uint8_t buf[4096];
	for (uint32_t k = 0; k < n; k++) {
		uint8_t hdr[sizeof(struct ib_bth) + sizeof(struct ib_aeth)];
		uint64_t off = (uint64_t)k * q->mtu;
		uint32_t plen = (uint32_t)(len - off < q->mtu ? len - off : q->mtu);
		unsigned op = n == 1 ? IB_OP_READ_RESP_ONLY : k == 0 ? IB_OP_READ_RESP_FIRST :
			      k + 1 == n ? IB_OP_READ_RESP_LAST : IB_OP_READ_RESP_MIDDLE;
		bool aeth = op != IB_OP_READ_RESP_MIDDLE;
		bth_set((struct ib_bth *)hdr, (uint8_t)(tr_code(q) | op), false, -plen & 3, 0xffff,
			q->dest_qpn, false, psn_add(psn, k));
		if (aeth)
			aeth_set((struct ib_aeth *)(hdr + sizeof(struct ib_bth)),
				 AETH_ACK | AETH_CREDITS_INVALID, q->msn);
		struct iovec pl = { (char *)addr + off, plen };
		if (copy && plen) {
			struct iovec b = { buf, plen };
			int cerr = sv_target_move(t, false, &b, 1, &pl, 1);
			if (cerr) {
				fail(q, t, NAK_REM_OP, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_FATAL,
				     "the READ's memory could not be read");
				break;
			}
			pl = b;
		}
		pkt_send(q, &q->peer, hdr, aeth ? sizeof(hdr) : sizeof(struct ib_bth), &pl,
			 plen ? 1 : 0, plen);
		if (copy)
			pkt_flush(q);	/* the payload is in buf */
	}
	pkt_flush(q);	/* before the MR may go */
	sv_resp_mr_put(t->mseg, mr);
}

static void send_atomic_ack(struct pkt_qp *q, uint32_t psn, uint64_t orig)
{
	uint8_t hdr[sizeof(struct ib_bth) + sizeof(struct ib_aeth) + sizeof(struct ib_atmack)];

	bth_set((struct ib_bth *)hdr, (uint8_t)(tr_code(q) | IB_OP_ATOMIC_ACK), false, 0, 0xffff,
		q->dest_qpn, false, psn);
	aeth_set((struct ib_aeth *)(hdr + sizeof(struct ib_bth)), AETH_ACK | AETH_CREDITS_INVALID,
		 q->msn);
	ib_put64(hdr + sizeof(struct ib_bth) + sizeof(struct ib_aeth), orig);
	pkt_send(q, &q->peer, hdr, sizeof(hdr), NULL, 0, 0);
}

/* An atomic write's answer: an RDMA READ response of no payload, its
 * AETH acknowledging it, as rxe answers one (send_read_response_ack)
 * and the requester waits for it as for a READ's. */
static void send_empty_read_resp(struct pkt_qp *q, uint32_t psn)
{
	uint8_t hdr[sizeof(struct ib_bth) + sizeof(struct ib_aeth)];

	bth_set((struct ib_bth *)hdr, (uint8_t)(tr_code(q) | IB_OP_READ_RESP_ONLY), false, 0,
		0xffff, q->dest_qpn, false, psn);
	aeth_set((struct ib_aeth *)(hdr + sizeof(struct ib_bth)), AETH_ACK | AETH_CREDITS_INVALID,
		 q->msn);
	pkt_send(q, &q->peer, hdr, sizeof(hdr), NULL, 0, 0);
}

/* CMP_SWAP and FETCH_ADD (IBA 9.4.5), atomic against every other
 * softverbs atomic on this memory (IBV_ATOMIC_HCA): the same lock. */
static bool atomic_exec(struct pkt_qp *q, struct sv_target *t, unsigned op, uint32_t psn,
			const uint8_t *ae)
{
	uint64_t va = ib_get64(ae), swap_add = ib_get64(ae + 12), cmp = ib_get64(ae + 20);
	uint32_t rkey = ib_get32(ae + 8);
	struct shm_mr *mr;
	void *addr;

	if (va & 7) {
		snprintf(t->why, sizeof(t->why), "remote_addr 0x%llx is not 8-byte aligned",
			 (unsigned long long)va);
		fail(q, t, NAK_INV_REQ, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_REQ_ERR, "atomic refused");
		return false;
	}
	if (sv_resp_mr_get(t, rkey, va, 8, IBV_ACCESS_REMOTE_ATOMIC, &mr, &addr) != SV_R_OK) {
		fail(q, t, NAK_REM_ACCESS, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_ACCESS_ERR,
		     "atomic refused");
		return false;
	}
	uint64_t old = 0, new;
	struct iovec rv = { addr, 8 }, ov = { &old, 8 }, nv = { &new, 8 };
	sv_shm_lock(&t->mseg->atomic_lock);
	int err = sv_target_move(t, false, &ov, 1, &rv, 1);
	if (!err) {
		new = op == IB_OP_FETCH_ADD ? old + swap_add : old == cmp ? swap_add : old;
		if (new != old)
			err = sv_target_move(t, true, &nv, 1, &rv, 1);
	}
	sv_shm_unlock(&t->mseg->atomic_lock);
	sv_resp_mr_put(t->mseg, mr);
	if (err) {
		fail(q, t, NAK_REM_OP, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_FATAL,
		     "the atomic's memory could not be reached");
		return false;
	}
	struct pkt_atomic_res *res = &q->ares[q->ares_next++ % PKT_ATOMIC_RES];
	*res = (struct pkt_atomic_res){ psn, true, old };
	q->msn = psn_add(q->msn, 1);
	send_atomic_ack(q, psn, old);
	return true;
}

_Static_assert((PKT_ATOMIC_RES & (PKT_ATOMIC_RES - 1)) == 0,
	       "ares_next's wrap at 2^32 keeps its place in the ring");

/* The record of the atomic at psn, the newest first: after the PSNs
 * wrap, an older record of the same PSN is another atomic's. */
static const struct pkt_atomic_res *atomic_record(const struct pkt_qp *q, uint32_t psn)
{
	for (unsigned i = 1; i <= PKT_ATOMIC_RES; i++) {
		const struct pkt_atomic_res *r = &q->ares[(q->ares_next - i) % PKT_ATOMIC_RES];
		if (r->valid && r->psn == psn)
			return r;
	}
	return NULL;
}

/* A duplicate atomic or atomic write, of a live QP or a tombstone: its
 * answer again, never the operation (9.7.5.3.2).  An atomic older than
 * max_dest_rd_atomic others has no record and no answer: a requester
 * within its max_rd_atomic has completed it.  An atomic write is not
 * written again, since a later write to the word may have landed. */
static bool answer_again(struct pkt_qp *q, unsigned op, uint32_t psn)
{
	if (op == IB_OP_CMP_SWAP || op == IB_OP_FETCH_ADD) {
		const struct pkt_atomic_res *r = atomic_record(q, psn);
		if (r)
			send_atomic_ack(q, psn, r->orig);
		return true;
	}
	if (op == IB_OP_ATOMIC_WRITE) {
		send_empty_read_resp(q, psn);
		return true;
	}
	return false;
}

static void duplicate(struct pkt_qp *q, const struct ib_bth *bth, struct sv_target *t)
{
	unsigned op = bth_op(bth);
	uint32_t psn = bth_psn(bth);
	const uint8_t *h = (const uint8_t *)bth + sizeof(*bth) + (tr_code(q) == IB_TR_XRC ? 4 : 0);

	PKT_COUNT(q, dups);
	if (op == IB_OP_READ_REQ || op == IB_OP_CMP_SWAP || op == IB_OP_FETCH_ADD ||
	    op == IB_OP_ATOMIC_WRITE)
		send_due_ack(q);
	if (op == IB_OP_READ_REQ) {
		/* A READ has no side effect: it is served again (9.7.5.3.1),
		 * if it could have been served at all. */
		if (ib_get32(h + 12) <= SV_MAX_MSG_SZ)
			read_respond(q, t, psn, ib_get64(h), ib_get32(h + 8), ib_get32(h + 12));
		return;
	}
	if (answer_again(q, op, psn))
		return;
	/* C9-105: every duplicate SEND or WRITE is acknowledged again
	 * (coalesced with the batch): its ACK may be what was lost. */
	want_ack(q, psn_add(q->epsn, SV_PSN_MASK));
}

void pkt_resp_tomb(struct pkt_qp *q, const struct ib_bth *bth)
{
	unsigned op = bth_op(bth);
	uint32_t psn = bth_psn(bth);

	if (psn_compare(psn, q->epsn) >= 0)
		return;	/* new work for a QP that is gone: dropped (9.7.6) */
	q->linger_until = sv_now_ns() + q->linger_ns;
	PKT_COUNT(q, dups);
	if (answer_again(q, op, psn))
		return;
	if (op != IB_OP_READ_REQ)
		want_ack(q, psn_add(q->epsn, SV_PSN_MASK));
}

void pkt_resp_tomb_ack(struct pkt_qp *q)
{
	want_ack(q, psn_add(q->epsn, SV_PSN_MASK));
}

void pkt_resp_rx(struct pkt_qp *q, const struct ib_bth *bth, const struct sv_link_pkt *p)
{
	enum ibv_qp_type type = q->qp->ex.qp_base.qp_type;
	unsigned op = bth_op(bth);
	uint32_t f = ib_opinfo[op].flags, psn = bth_psn(bth);
	const uint8_t *h = p->buf + sizeof(*bth);
	unsigned hl = sizeof(*bth) + ib_hdr_len(bth->opcode);
	size_t plen = p->len - hl - bth_pad(bth);
	const uint8_t *data = p->buf + hl;
	struct sv_target t;

	if (type == IBV_QPT_UD) {
		ud_rx(q, bth, p);
		return;
	}
	q->last_rx = p->at;
	/* Only a WRITE's data joins a run into GPU memory; anything else
	 * may read or complete what the run holds. */
	if (!(f & IBH_WRITE) || (f & (IBH_RECV | IBH_WORD)))
		pkt_gpu_flush(q->pc);
	if (type == IBV_QPT_RC || type == IBV_QPT_UC || type == IBV_QPT_XRC_RECV) {
		/* ok: a responder */
	} else {
		PKT_COUNT(q, drops);
		return;
	}
	/* C10-29: only RTR, RTS and SQD receive. */
	if (sv_resp_local(q->qp->ctx, q->qpn, &t) != SV_R_OK) {
		PKT_COUNT(q, drops);
		return;
	}
	uint32_t srqn = 0;
	if (tr_code(q) == IB_TR_XRC) {
		srqn = ib_get32(h) & SV_QPN_MASK;
		h += 4;
	}
	int32_t d = psn_compare(psn, q->epsn);
	if (op == IB_OP_READ_REQ)
		sv_dbg("qpn 0x%x: READ request psn 0x%x, expected 0x%x%s", q->qpn, psn, q->epsn,
		       q->nak_sent ? " (NAK sent)" : "");
	if (rc(q) && d > 0) {
		/* 9.7.5.2.?: out of sequence, one NAK until it is repaired. */
		PKT_COUNT(q, drops);
		if (!q->nak_sent) {
			q->nak_sent = true;
			send_aeth(q, AETH_NAK | NAK_PSN_SEQ, q->epsn);
		}
		return;
	}
	if (rc(q) && d < 0) {
		if (srqn && sv_resp_xrc(&t, srqn) != SV_R_OK)
			return;
		duplicate(q, bth, &t);
		return;
	}
	if (!rc(q) && d != 0) {
		/* UC: packets were lost; the message under way is dropped and
		 * the next one starts at a FIRST or ONLY. */
		PKT_COUNT(q, drops);
		q->cur = 0;
		q->off = 0;
		q->epsn = psn;
	}
	q->nak_sent = false;
	/* The opcode sequence (9.7.5.2.?, C9-?): a message in progress
	 * continues with its MIDDLE or LAST, anything else starts with a
	 * FIRST or ONLY. */
	uint32_t cls = f & (IBH_SEND | IBH_WRITE | IBH_READ | IBH_ATOMIC);
	bool seq_ok = q->cur ? cls == q->cur && (f & (IBH_MIDDLE | IBH_LAST)) && !(f & IBH_FIRST) :
			       (f & IBH_FIRST) != 0;
	bool len_ok = (f & IBH_PAYLOAD) || plen == 0;
	if ((f & (IBH_FIRST | IBH_LAST)) != (IBH_FIRST | IBH_LAST) && (f & IBH_PAYLOAD) &&
	    !(f & IBH_LAST) && plen != q->mtu)
		len_ok = false;	/* FIRST and MIDDLE carry exactly one MTU (9.7.5.1.?) */
	if (!seq_ok || !len_ok || plen > q->mtu) {
		if (!rc(q)) {
			PKT_COUNT(q, drops);
			q->cur = 0;
			q->epsn = psn_add(psn, 1);
			return;
		}
		snprintf(t.why, sizeof(t.why), "%s %s", ib_opcode_name(bth->opcode),
			 !seq_ok ? "breaks the opcode sequence" : "has a wrong payload length");
		fail(q, &t, NAK_INV_REQ, psn, IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR,
		     "invalid request");
		return;
	}
	if ((f & IBH_FIRST) && srqn) {
		q->srqn = srqn;
	}
	if (tr_code(q) == IB_TR_XRC && sv_resp_xrc(&t, q->srqn) != SV_R_OK) {
		fail(q, &t, NAK_INV_REQ, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_REQ_ERR, "XRC request refused");
		return;
	}
	const uint8_t *reth = f & IBH_RETH ? h : NULL;
	if (reth)
		h += sizeof(struct ib_reth);
	if (reth && ib_get32(reth + 12) > SV_MAX_MSG_SZ) {
		/* A message is at most 2^31 bytes (max_msg_sz; rxe's
		 * check_length()): at a 256-byte MTU a READ of 2^31 takes
		 * 2^23 PSNs already, the most psn_compare() orders. */
		snprintf(t.why, sizeof(t.why), "its RETH length %u exceeds 2^31",
			 ib_get32(reth + 12));
		fail(q, &t, NAK_INV_REQ, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_REQ_ERR,
		     "invalid request");
		return;
	}
	uint32_t npsn = 1;

	/* A due ACK leaves before this request is answered, with the MSN
	 * from before it. */
	if (cls == IBH_READ || cls == IBH_ATOMIC || (f & IBH_WORD))
		send_due_ack(q);
	if (cls == IBH_READ) {
		uint32_t len = ib_get32(reth + 12);
		/* C9-148: a READ's responses carry its own MSN, so it counts
		 * before they go, as an atomic's ACK does (atomic_exec). */
		q->msn = psn_add(q->msn, 1);
		read_respond(q, &t, psn, ib_get64(reth), ib_get32(reth + 8), len);
		npsn = len ? (len + q->mtu - 1) / q->mtu : 1;
		q->epsn = psn_add(psn, npsn);
		return;
	}
	if (cls == IBH_ATOMIC) {
		if (atomic_exec(q, &t, op, psn, h))
			q->epsn = psn_add(psn, 1);
		return;
	}
	if (f & IBH_WORD) {
		/* Atomic write (IBA 1.5): one aligned 8-byte store. */
		uint64_t va = ib_get64(reth);
		struct shm_mr *mr;
		void *addr;
		if ((va & 7) || plen != 8 || ib_get32(reth + 12) != 8) {
			snprintf(t.why, sizeof(t.why), "an atomic write is one aligned 8-byte word");
			fail(q, &t, NAK_INV_REQ, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_REQ_ERR,
			     "invalid request");
			return;
		}
		if (sv_resp_mr_get(&t, ib_get32(reth + 8), va, 8, IBV_ACCESS_REMOTE_WRITE, &mr,
				   &addr) != SV_R_OK) {
			fail(q, &t, NAK_REM_ACCESS, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_ACCESS_ERR,
			     "atomic write refused");
			return;
		}
		struct iovec s = { (void *)data, 8 }, dv = { addr, 8 };
		sv_shm_lock(&t.mseg->atomic_lock);
		int err = sv_target_move(&t, true, &s, 1, &dv, 1);
		sv_shm_unlock(&t.mseg->atomic_lock);
		sv_resp_mr_put(t.mseg, mr);
		if (err) {
			fail(q, &t, NAK_REM_OP, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_FATAL,
			     "the atomic write's memory could not be reached");
			return;
		}
		/* Its own MSN, and its answer at once, as an atomic's. */
		q->msn = psn_add(q->msn, 1);
		send_empty_read_resp(q, psn);
		q->epsn = psn_add(psn, 1);
		q->acked = false;
		return;
	}
	if (cls == IBH_WRITE) {
		if (f & IBH_FIRST) {
			q->wva = ib_get64(reth);
			q->wrkey = ib_get32(reth + 8);
			q->wleft = ib_get32(reth + 12);
			q->off = q->wleft;	/* the length a WRITE_WITH_IMM reports */
			struct shm_mr *mr;
			void *addr;
			/* 9.7.4.1.?: the whole WRITE is checked at its first packet. */
			if (sv_resp_mr_get(&t, q->wrkey, q->wva, q->wleft, IBV_ACCESS_REMOTE_WRITE,
					   &mr, &addr) != SV_R_OK) {
				if (rc(q))
					fail(q, &t, NAK_REM_ACCESS, psn, IBV_WC_SUCCESS,
					     IBV_EVENT_QP_ACCESS_ERR, "RDMA WRITE refused");
				else
					q->epsn = psn_add(psn, 1);
				return;
			}
			sv_resp_mr_put(t.mseg, mr);
		}
		if (plen > q->wleft || ((f & IBH_LAST) && plen != q->wleft)) {
			snprintf(t.why, sizeof(t.why), "the WRITE's packets do not add up to its RETH "
				 "length");
			fail(q, &t, NAK_INV_REQ, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_REQ_ERR,
			     "invalid request");
			return;
		}
		if ((f & IBH_RECV) && !q->have_wqe) {
			/* WRITE_WITH_IMM consumes a receive WQE at its last
			 * packet, taken before the bytes land so that an RNR
			 * retry writes them once more, not twice differently. */
			if (sv_resp_take_recv(&t, &q->rwqe.w) != SV_R_OK) {
				rnr(q, psn);
				return;
			}
			hold_wqe(q, &t);
		}
		if (plen) {
			struct shm_mr *mr;
			void *addr;
			if (sv_resp_mr_get(&t, q->wrkey, q->wva, plen, IBV_ACCESS_REMOTE_WRITE, &mr,
					   &addr) != SV_R_OK) {
				fail(q, &t, NAK_REM_ACCESS, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_ACCESS_ERR,
				     "RDMA WRITE refused");
				return;
			}
			struct iovec s = { (void *)data, plen }, dv = { addr, plen };
			int err = 0;
			if (t.pid != sv_pid() ||
			    !pkt_gpu_put(q, addr, data, plen, NULL, psn, t.mseg, mr)) {
				err = sv_target_move(&t, true, &s, 1, &dv, 1);
				sv_resp_mr_put(t.mseg, mr);
			}
			if (err) {
				fail(q, &t, NAK_REM_OP, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_FATAL,
				     "the WRITE's memory could not be reached");
				return;
			}
			q->wva += plen;
			q->wleft -= plen;
		}
		q->cur = (f & IBH_LAST) ? 0 : IBH_WRITE;
		if (f & IBH_LAST) {
			q->msn = psn_add(q->msn, 1);
			if (f & IBH_RECV) {
				uint32_t iv;
				memcpy(&iv, h, 4);
				complete_recv(q, &t, IBV_WC_RECV_RDMA_WITH_IMM, (uint32_t)q->off,
					      q->dest_qpn, IBV_WC_WITH_IMM, iv, bth_se(bth), psn);
			}
		}
		goto done;
	}
	/* SEND */
	struct shm_wq *twq = t.rx->srq_off ? shm_at(t.seg, t.wq_off) : NULL;
	if (twq && !twq->tm_tags)
		twq = NULL;
	if ((f & IBH_FIRST) && twq) {
		/* Tag matching decides at the first packet: its TMH. */
		if (!q->have_wqe) {
			enum sv_result r = sv_tm_take_first(&t, twq, data, plen,
							    pkt_req_rndv_room(q), &q->rwqe.w,
							    &q->tm_how);
			if (r == SV_R_RNR) {
				rnr(q, psn);
				if (!rc(q))
					q->epsn = psn_add(psn, 1);
				return;
			}
			if (r != SV_R_OK) {
				fail(q, &t, NAK_INV_REQ, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_REQ_ERR,
				     "invalid request");
				return;
			}
			hold_wqe(q, &t);
			q->tm = true;
		}
		q->off = 0;
		if (q->tm) {
			data += q->tm_how.skip;
			plen -= q->tm_how.skip;
		}
	} else if (f & IBH_FIRST) {
		q->tm = false;
		if (!q->have_wqe) {
			if (sv_resp_take_recv(&t, &q->rwqe.w) != SV_R_OK) {
				rnr(q, psn);	/* UC: the message is lost */
				if (!rc(q))
					q->epsn = psn_add(psn, 1);
				return;
			}
			hold_wqe(q, &t);
		}
		q->off = 0;
	}
	enum sv_result r = SV_R_OK;
	if (q->tm && q->tm_how.rndv == SV_TM_RNDV_READ)
		q->off += plen;	/* headers only: the payload is read from the sender */
	else
		r = place_recv(q, &t, data, plen, 0, NULL, 0);
	if (r != SV_R_OK) {
		if (!rc(q)) {
			q->cur = 0;
			q->epsn = psn_add(psn, 1);
			return;
		}
		if (r == SV_R_LOC_LEN)
			fail(q, &t, NAK_INV_REQ, psn, IBV_WC_LOC_LEN_ERR, -1, "message too long");
		else
			fail(q, &t, NAK_REM_OP, psn, IBV_WC_LOC_PROT_ERR, -1,
			     "the receive buffer failed its checks");
		return;
	}
	q->cur = (f & IBH_LAST) ? 0 : IBH_SEND;
	if (f & IBH_LAST) {
		uint32_t iv = 0, flags = 0;
		if (f & IBH_IETH) {
			uint32_t rkey = ib_get32(h);
			if (sv_resp_invalidate(&t, rkey)) {
				fail(q, &t, NAK_INV_REQ, psn, IBV_WC_REM_INV_REQ_ERR, -1,
				     "invalidation refused");
				return;
			}
			iv = rkey;
			flags = IBV_WC_WITH_INV;
		} else if (f & IBH_IMM) {
			memcpy(&iv, h, 4);
			flags = IBV_WC_WITH_IMM;
		}
		q->msn = psn_add(q->msn, 1);
		if (q->tm) {
			t.rcq_off = twq ? twq->cq_off : t.rcq_off;
			if (q->tm_how.rndv)
				rndv_done(q, &t, bth_se(bth), psn);
			else
				complete_recv(q, &t, (enum ibv_wc_opcode)q->tm_how.opcode,
					      (uint32_t)q->off, q->dest_qpn, q->tm_how.wc_flags,
					      q->tm_how.imm, bth_se(bth), psn);
			q->tm = false;
		} else {
			complete_recv(q, &t, IBV_WC_RECV, (uint32_t)q->off, q->dest_qpn, flags, iv,
				      bth_se(bth), psn);
		}
	}
done:
	q->epsn = psn_add(psn, 1);
	if (rc(q) && bth_ackreq(bth) && !q->acked)
		want_ack(q, psn);
	q->acked = false;
}

void pkt_resp_gpu_failed(struct pkt_qp *q, uint32_t psn)
{
	struct sv_target t;

	if (sv_resp_local(q->qp->ctx, q->qpn, &t) != SV_R_OK)
		return;
	snprintf(t.why, sizeof(t.why), "cuMemcpy into the GPU memory failed (freed?)");
	fail(q, &t, NAK_REM_OP, psn, IBV_WC_SUCCESS, IBV_EVENT_QP_FATAL,
	     "the WRITE's memory could not be reached");
}
