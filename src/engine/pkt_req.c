/* SPDX-License-Identifier: MIT */
/*
 * The packet requester: a send queue whose peer is on another host.
 *
 * Each WQE takes a run of PSNs (IBA 9.7.1): one per packet of a SEND or
 * WRITE segmented by the path MTU, one per response packet of a READ,
 * one for an atomic.  Packets go out from the caller's thread as soon as
 * they are posted, up to a window; ACKs, NAKs and responses are handled
 * by whichever thread receives them (engine/pkt.c); WQEs complete in
 * order from the head of the queue once the responder has acknowledged
 * them (IBA 9.7.5.1).  RC reliability is go-back-N: a sequence NAK, a
 * gap in READ responses or the retransmission timer sends everything
 * again from the first PSN not acknowledged, and the responder detects
 * the duplicates (9.7.5.1.?, 9.7.6).  UC and UD WQEs complete when their
 * packets have left.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <infiniband/tm_types.h>
#include <stdio.h>
#include <string.h>

#include "pkt.h"

static unsigned tr_code(enum ibv_qp_type t)
{
	return t == IBV_QPT_UC ? IB_TR_UC : t == IBV_QPT_UD ? IB_TR_UD :
	       t == IBV_QPT_XRC_SEND ? IB_TR_XRC : IB_TR_RC;
}

static bool is_read(const struct sv_swqe *w) { return w->opcode == IBV_WR_RDMA_READ; }
static bool is_atomic(const struct sv_swqe *w)
{
	return w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
}
static bool is_local(const struct sv_swqe *w)
{
	return w->opcode == IBV_WR_BIND_MW || w->opcode == IBV_WR_LOCAL_INV;
}
/* Writes its local buffers: a response carries data (READ) or a value
 * (atomics). */
static bool is_rd(const struct sv_swqe *w) { return is_read(w) || is_atomic(w); }
/* Completed by its response, not by an ACK, and counted against
 * max_rd_atomic: also an atomic write, which the responder answers
 * with an empty READ response (rxe: check_init_depth()). */
static bool is_resp(const struct sv_swqe *w)
{
	return is_rd(w) || w->opcode == IBV_WR_ATOMIC_WRITE;
}

static uint32_t npkts_of(const struct pkt_qp *q, const struct sv_swqe *w, uint64_t len)
{
	if (is_local(w))
		return 0;
	if (is_atomic(w) || w->opcode == IBV_WR_ATOMIC_WRITE)
		return 1;
	return len ? (uint32_t)((len + q->mtu - 1) / q->mtu) : 1;
}

static struct sv_swqe *wqe_at(struct sv_qp *qp, uint32_t i)
{
	return sv_sq_slot(qp, qp->sq_head + i);
}

/* The WQE whose PSNs hold psn, as an index from the head; -1 if none. */
static int wqe_of_psn(struct pkt_qp *q, uint32_t psn)
{
	for (uint32_t i = 0; i < q->nassigned; i++) {
		struct sv_swqe *w = wqe_at(q->qp, i);
		if (w->npkts && psn_compare(psn, w->psn) >= 0 &&
		    psn_compare(psn, psn_add(w->psn, w->npkts)) < 0)
			return (int)i;
	}
	return -1;
}

static void wqe_fail(struct pkt_qp *q, struct sv_swqe *w, enum ibv_wc_status st, const char *why)
{
	if (w->pstate == PW_DONE || w->pstate == PW_ERROR)
		return;
	/* The peer by its address, IPv4 or IPv6: a UD WQE's own. */
	bool ud = q->tr == IB_TR_UD;
	char a[INET6_ADDRSTRLEN + 12];

	w->pstate = PW_ERROR;
	w->pstatus = (uint8_t)st;
	q->halted = true;
	sv_explain("error completion", "qpn 0x%x wr_id 0x%llx to qpn 0x%x at %s: %s: %s",
		   q->qpn, (unsigned long long)w->wr_id, ud ? w->remote_qpn : q->dest_qpn,
		   sv_route_addr(ud ? (const struct in6_addr *)w->av.grh.dgid.raw : &q->peer.dst,
				 ud ? 0 : q->peer.ifindex, a, sizeof(a)),
		   sv_wc_status_name(st), why);
}

/* ---- the window ---- */

/* The packets a reliable QP may have unacknowledged: what the peer's
 * socket buffer holds. */
static uint32_t full_window(const struct pkt_qp *q)
{
	uint32_t w = PKT_WINDOW_BYTES / (q->mtu + 1024);

	return w > PKT_WINDOW_MAX ? PKT_WINDOW_MAX : w;
}

/* Less after a loss (loss_seen): go-back-N sends everything after a lost
 * packet again, so what a loss costs is the window. */
static uint32_t window(const struct pkt_qp *q)
{
	uint32_t f = full_window(q);

	return q->cwnd && q->cwnd < f ? q->cwnd : f;
}

/* A long message asks for an ACK four times a window, so that a cut
 * window keeps moving without waiting for its last packet's ACK. */
static uint32_t ack_every(const struct pkt_qp *q)
{
	uint32_t e = window(q) / 4;

	return e < 1 ? 1 : e > PKT_ACKREQ_EVERY ? PKT_ACKREQ_EVERY : e;
}

/*
 * A loss at psn: RFC 5681's multiplicative decrease (3.1, 3.2), halving
 * the window once for all the losses of the packets in flight when the
 * first was seen (up to snd_max); a timeout leaves PKT_CWND_MIN, to grow
 * back by slow start to half what it was.  IBA leaves a requester's pace
 * to it (9.7.7.2's credits only bound it); a NIC's congestion control
 * reacts to marks, this one to losses, which is all a UDP path shows.
 */
static void loss_seen(struct pkt_qp *q, uint32_t psn, bool timeout)
{
	uint32_t half = window(q) / 2;

	if (!timeout && q->recovering && psn_compare(psn, q->recover) < 0)
		return;
	q->ssthresh = half < PKT_CWND_MIN ? PKT_CWND_MIN : half;
	q->cwnd = timeout ? PKT_CWND_MIN : q->ssthresh;
	if (q->cwnd >= full_window(q))
		q->cwnd = 0;
	q->cwnd_acked = 0;
	q->recover = q->snd_max;
	q->recovering = true;
}

/* n more packets acknowledged, none while the loss that cut the window
 * is being repaired: slow start below ssthresh, then the additive
 * increase, a packet a window (RFC 5681 3.1). */
static void cwnd_grow(struct pkt_qp *q, uint32_t n)
{
	if (q->recovering && psn_compare(q->una, q->recover) >= 0)
		q->recovering = false;
	if (!q->cwnd || q->recovering)
		return;
	if (q->cwnd < q->ssthresh) {
		q->cwnd += n < q->ssthresh - q->cwnd ? n : q->ssthresh - q->cwnd;
	} else {
		q->cwnd_acked += n;
		while (q->cwnd_acked >= q->cwnd) {
			q->cwnd_acked -= q->cwnd;
			q->cwnd++;
		}
	}
	if (q->cwnd >= full_window(q))
		q->cwnd = 0;
}

/* The congestion and round-trip state of a new connection, or of a send
 * queue that was flushed. */
static void cc_reset(struct pkt_qp *q)
{
	q->cwnd = q->cwnd_acked = q->ssthresh = 0;
	q->recovering = false;
	q->rtt_timing = false;
	q->srtt = 0;
	q->tail_probe = q->tlp_armed = false;
	q->tlps = 0;
	q->snd_max = q->npsn;
}

/* ---- building packets ---- */

/* One packet of w: packet k of a SEND or WRITE, the READ request for
 * responses k.., or the atomic. */
static int send_one(struct pkt_qp *q, struct sv_swqe *w, uint32_t k, const struct iovec *liov,
		    int nl, uint64_t len, uint32_t *used)
{
	struct sv_qp *qp = q->qp;
	uint8_t hdr[PKT_HDR_MAX];
	struct ib_bth *bth = (struct ib_bth *)hdr;
	uint8_t *h = hdr + sizeof(*bth);
	unsigned tr = tr_code(qp->ex.qp_base.qp_type);
	bool last = k + 1 >= w->npkts, first = k == 0;
	uint64_t off = (uint64_t)k * q->mtu;
	uint64_t plen = 0;
	unsigned op;
	uint32_t limit = *used;

	*used = 1;
	if (tr == IB_TR_XRC) {
		ib_put32(h, w->srqn & SV_QPN_MASK);
		h += 4;
	}
	switch (w->opcode) {
	case IBV_WR_RDMA_READ: {
		/* A chunk of responses, each chunk its own request. */
		uint32_t n = w->npkts - k;
		if (n > PKT_READ_CHUNK - k % PKT_READ_CHUNK)
			n = PKT_READ_CHUNK - k % PKT_READ_CHUNK;
		if (limit && n > limit)
			n = limit;	/* a repair: only the responses missing */
		*used = n;
		op = IB_OP_READ_REQ;
		uint64_t rlen = len > off ? len - off : 0;
		if (rlen > (uint64_t)n * q->mtu)
			rlen = (uint64_t)n * q->mtu;
		ib_put64(h, w->remote_addr + off);
		ib_put32(h + 8, w->rkey);
		ib_put32(h + 12, (uint32_t)rlen);
		h += 16;
		last = true;
		break;
	}
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD: {
		bool cas = w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
		op = cas ? IB_OP_CMP_SWAP : IB_OP_FETCH_ADD;
		ib_put64(h, w->remote_addr);
		ib_put32(h + 8, w->rkey);
		ib_put64(h + 12, cas ? w->swap : w->compare_add);
		ib_put64(h + 20, cas ? w->compare_add : 0);
		h += 28;
		break;
	}
	case IBV_WR_ATOMIC_WRITE:
		op = IB_OP_ATOMIC_WRITE;
		ib_put64(h, w->remote_addr);
		ib_put32(h + 8, w->rkey);
		ib_put32(h + 12, 8);
		h += 16;
		plen = 8;
		break;
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM: {
		bool imm = w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
		op = first && last ? (imm ? IB_OP_WRITE_ONLY_IMM : IB_OP_WRITE_ONLY) :
		     first ? IB_OP_WRITE_FIRST : last ? (imm ? IB_OP_WRITE_LAST_IMM : IB_OP_WRITE_LAST) :
		     IB_OP_WRITE_MIDDLE;
		if (first) {
			ib_put64(h, w->remote_addr);
			ib_put32(h + 8, w->rkey);
			ib_put32(h + 12, (uint32_t)len);
			h += 16;
		}
		if (last && imm) {
			memcpy(h, &w->imm, 4);	/* big endian as posted */
			h += 4;
		}
		break;
	}
	default: {	/* SEND, SEND_WITH_IMM, SEND_WITH_INV */
		bool imm = w->opcode == IBV_WR_SEND_WITH_IMM, inv = w->opcode == IBV_WR_SEND_WITH_INV;
		op = first && last ? (imm ? IB_OP_SEND_ONLY_IMM : inv ? IB_OP_SEND_ONLY_INV :
				      IB_OP_SEND_ONLY) :
		     first ? IB_OP_SEND_FIRST :
		     last ? (imm ? IB_OP_SEND_LAST_IMM : inv ? IB_OP_SEND_LAST_INV : IB_OP_SEND_LAST) :
		     IB_OP_SEND_MIDDLE;
		if (tr == IB_TR_UD) {
			uint32_t qkey = w->remote_qkey & 0x80000000u ? qp->attr.qkey : w->remote_qkey;
			ib_put32(h, qkey);
			ib_put32(h + 4, q->qpn);
			h += 8;
		}
		if (last && imm) {
			memcpy(h, &w->imm, 4);
			h += 4;
		}
		if (last && inv) {
			ib_put32(h, w->imm);	/* the rkey to invalidate */
			h += 4;
		}
		break;
	}
	}
	struct iovec pl[SV_MAX_SGE + 1];
	int np = 0;
	if (op != IB_OP_READ_REQ && !is_atomic(w)) {
		if (op != IB_OP_ATOMIC_WRITE)
			plen = len - off < q->mtu ? len - off : q->mtu;
		np = sv_iov_slice(liov, nl, off, plen, pl);
	}
	/* AckReq on each message's last packet, and every so often in a
	 * long one so that the window keeps moving (IBA 9.7.5.1.1); and on
	 * a probe (after a timeout, or of a tail), which waits for its
	 * answer alone: a responder acknowledges a FIRST or MIDDLE packet
	 * only when asked, so a probe that filled the hole went unanswered
	 * and cost a second timeout of the retry_cnt budget. */
	bool ackreq = tr != IB_TR_UC && tr != IB_TR_UD &&
		      (last || (k + 1) % ack_every(q) == 0 ||
		       ((q->probing || q->tail_probe) && psn_add(w->psn, k) == q->probe_psn));
	bool se = last && (w->send_flags & IBV_SEND_SOLICITED);
	uint32_t dqpn = tr == IB_TR_UD ? w->remote_qpn : q->dest_qpn;
	bth_set(bth, (uint8_t)(tr | op), se, (unsigned)(-plen & 3), 0xffff, dqpn, ackreq,
		psn_add(w->psn, k));
	struct sv_route rt = q->peer;
	if (tr == IB_TR_UD) {
		const char *why;
		if (!sv_route_remote(qp->ctx->dev, &w->av, &rt, &why))
			return EHOSTUNREACH;
	}
	/* GPU memory cannot be gathered by the kernel, nor its ICRC taken
	 * by the CPU: the packet is gathered from the QP's copy of it
	 * (pkt_gpu.c), made a window at a time. */
	if (np && sv_gpu_dev_iov(pl, np)) {
		struct iovec b = { (void *)pkt_gpu_tx(q, w, liov, nl, len, off, plen), plen };
		if (!b.iov_base)
			return EFAULT;
		return pkt_send(q, &rt, hdr, (size_t)(h - hdr), &b, 1, plen);
	}
	return pkt_send(q, &rt, hdr, (size_t)(h - hdr), pl, np, plen);
}

enum sv_result sv_pkt_ud_send(struct sv_qp *qp, struct sv_swqe *w, const struct iovec *liov,
			      int nl, uint64_t len)
{
	struct pkt_qp *q = qp->pq;

	q->mtu = 128u << sv_port_mtu(qp->ctx->dev);
	w->psn = q->npsn;
	w->npkts = 1;
	q->npsn = psn_add(q->npsn, 1);
	/* UD is unreliable: a packet that could not leave is lost. */
	uint32_t used = 0;
	int err = send_one(q, w, 0, liov, nl, len, &used);
	pkt_flush(q);
	return err ? SV_R_DROPPED : SV_R_OK;
}

/* ---- transmission ---- */

/* The retransmission timer: first, up to PKT_TLP_MAX times between two
 * answers, a tail-loss probe's two round trips (RFC 8985 7.2), doubled at
 * each (a probe or its answer may be lost too), then the ACK timeout. */
static void arm_timer(struct pkt_qp *q, uint64_t now)
{
	if (!q->qp->attr.timeout)
		return;		/* timeout 0: wait forever (IBA 9.7.6.1.3) */
	uint64_t ato = sv_ack_timeout_ns(q->qp->attr.timeout), pto = 2 * q->srtt;

	if (pto < PKT_PTO_MIN_NS)
		pto = PKT_PTO_MIN_NS;
	pto <<= q->tlps;
	q->tlp_armed = q->srtt && q->tlps < PKT_TLP_MAX && pto < ato;
	q->deadline = now + (q->tlp_armed ? pto : ato);
	q->pc->ops->want_tick(q->pc->link, q->deadline);
}

static bool reliable(const struct pkt_qp *q)
{
	enum ibv_qp_type t = q->qp->ex.qp_base.qp_type;

	return t == IBV_QPT_RC || t == IBV_QPT_XRC_SEND;
}

/* Reads and atomics outstanding (max_rd_atomic, IBA 9.7.5.1.?): until
 * they complete, as rxe counts them, not until answered.  An atomic
 * answered behind one whose answer was lost still holds its record at
 * the responder, which keeps max_dest_rd_atomic of them: counted, the
 * lost one's record outlives every atomic started after it. */
static uint32_t rd_outstanding(struct pkt_qp *q, uint32_t upto)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < upto; i++) {
		struct sv_swqe *w = wqe_at(q->qp, i);
		if (is_resp(w) && w->pstate != PW_ERROR)
			n++;
	}
	return n;
}

/* Response got + i (i < SV_READ_OOO_BITS) arrived ahead of got: bit i. */
#define OOO_WORDS (SV_READ_OOO_BITS / 64)
static bool ooo_test(const struct sv_swqe *w, uint32_t i) { return w->ooo[i / 64] >> (i % 64) & 1; }
static void ooo_set(struct sv_swqe *w, uint32_t i) { w->ooo[i / 64] |= 1ull << (i % 64); }
/* Moves got past the responses that arrived in a row from it. */
static void ooo_advance(struct sv_swqe *w)
{
	while (w->ooo[0] & 1) {
		unsigned n = w->ooo[0] == ~0ull ? 64 : (unsigned)__builtin_ctzll(~w->ooo[0]);
		for (unsigned i = 0; i < OOO_WORDS; i++) {
			uint64_t next = i + 1 < OOO_WORDS ? w->ooo[i + 1] : 0;
			w->ooo[i] = n == 64 ? next : w->ooo[i] >> n | next << (64 - n);
		}
		w->got += n;
	}
}

/* Response k of READ w has not arrived. */
static bool resp_missing(const struct sv_swqe *w, uint32_t k)
{
	return k >= w->got && !(k - w->got < SV_READ_OOO_BITS && ooo_test(w, k - w->got));
}

/* How many responses from k on are missing, up to the end of k's chunk
 * (a request asks for no more, send_one). */
static uint32_t missing_run(const struct sv_swqe *w, uint32_t k)
{
	uint32_t e = k;

	while (e < w->npkts && e - k < PKT_READ_CHUNK - k % PKT_READ_CHUNK && resp_missing(w, e))
		e++;
	return e - k;
}

/* The first READ response still missing, in PSN order, or the next new
 * PSN: responses are taken out of order (read_response), so one that
 * completes a later READ acknowledges nothing beyond an earlier hole. */
static uint32_t read_floor(struct pkt_qp *q)
{
	for (uint32_t i = 0; i < q->nassigned; i++) {
		struct sv_swqe *w = wqe_at(q->qp, i);
		if (is_read(w) && w->pstate == PW_SENT && w->got < w->npkts)
			return psn_add(w->psn, w->got);
	}
	return q->npsn;
}

/* The first PSN in [seen, floor) of a request other than a READ, or
 * floor.  An answer acknowledges the requests before it, which the
 * responder executed first (IBA 9.7.5.1), and nothing after it: the
 * packets of a WRITE posted after the latest answered one (seen) may be
 * on the way, lost, or not sent yet.  A READ's responses show
 * themselves, so una may pass READs whose responses are all in: una on
 * a response already in would make the timeout's probe (pkt_req_tick)
 * ask for nothing.  So may it pass an atomic whose answer came while a
 * READ's hole held una back: una left on it kept the window (transmit)
 * counting from a PSN nothing would answer again, and the SEND behind
 * it never left. */
static uint32_t unanswered_after(struct pkt_qp *q, uint32_t seen, uint32_t floor)
{
	for (uint32_t i = 0; i < q->nassigned; i++) {
		struct sv_swqe *w = wqe_at(q->qp, i);
		if (psn_compare(w->psn, floor) >= 0)
			break;
		if (!w->npkts || is_read(w) || w->pstate != PW_SENT ||
		    psn_compare(psn_add(w->psn, w->npkts), seen) <= 0)
			continue;
		return psn_compare(w->psn, seen) > 0 ? w->psn : seen;
	}
	return floor;
}

/* Forgets the ranges asked again: after a rewind the requests go again
 * in PSN order, and what they miss is found anew from the floor. */
static void repairs_reset(struct pkt_qp *q)
{
	uint32_t floor = read_floor(q);

	q->nrep = 0;
	if (psn_compare(floor, q->rd_seen) < 0)
		q->rd_seen = floor;
}

static void transmit(struct pkt_qp *q)
{
	struct sv_qp *qp = q->qp;
	uint64_t now = 0;
	uint8_t st = atomic_load_explicit(&qp->sh->state, memory_order_relaxed);

	/* SQD finishes the messages under way, retransmissions included,
	 * and starts none (IBA 10.3.1, Send Queue Drain). */
	while (!q->rnr_until && q->tx_w < qp->sq_count &&
	       (st == IBV_QPS_RTS || (st == IBV_QPS_SQD && q->tx_w < q->nassigned))) {
		struct sv_swqe *w = wqe_at(qp, q->tx_w);
		struct iovec liov[SV_MAX_SGE + 1];
		uint64_t len;
		int nl;

		if (q->tx_w == q->nassigned) {
			/* A new WQE: check its local side, give it its PSNs.
			 * Not after a failed one: the peer would execute what
			 * completes here flushed (IBA 10.3.1, Error: the WQEs
			 * after an error completion are not executed). */
			if (q->halted)
				break;
			if (is_resp(w) && rd_outstanding(q, q->tx_w) >= q->max_rd)
				break;
			if ((w->send_flags & IBV_SEND_FENCE) && rd_outstanding(q, q->tx_w))
				break;	/* IBA 10.8.3.3: after every earlier READ and atomic */
			w->pstate = PW_NEW;
			w->got = 0;
			memset(w->ooo, 0, sizeof(w->ooo));
			if (is_local(w)) {
				sv_last_why[0] = 0;
				enum sv_result r = sv_wqe_exec_local(qp, w);
				w->npkts = 0;
				w->psn = q->npsn;
				q->nassigned++;
				q->tx_w++;
				if (r == SV_R_OK)
					w->pstate = PW_DONE;
				else
					wqe_fail(q, w, sv_result_status(r), sv_last_why);
				continue;
			}
			sv_last_why[0] = 0;
			enum sv_result r = sv_wqe_local_iov(qp, w, is_rd(w), liov, &nl, &len);
			if (r == SV_R_OK && qp->ctx->home)
				r = SV_R_LOC_QP_OP;	/* an imported context's memory is elsewhere */
			if (r == SV_R_OK && (len > SV_MAX_MSG_SZ || (is_atomic(w) && len != 8)))
				r = SV_R_LOC_LEN;
			w->psn = q->npsn;
			w->npkts = r == SV_R_OK ? npkts_of(q, w, len) : 0;
			q->npsn = psn_add(q->npsn, w->npkts);
			q->nassigned++;
			if (r != SV_R_OK) {
				q->tx_w++;
				wqe_fail(q, w, sv_result_status(r), sv_last_why[0] ? sv_last_why :
					 "the WQE's local buffers failed their checks");
				continue;
			}
			w->pstate = PW_SENT;
		} else if (w->pstate == PW_DONE || w->pstate == PW_ERROR) {
			q->tx_w++;
			q->tx_pkt = 0;
			continue;
		} else if (sv_wqe_local_iov(qp, w, is_rd(w), liov, &nl, &len) != SV_R_OK) {
			wqe_fail(q, w, IBV_WC_LOC_PROT_ERR, "a local buffer went away under a retry");
			q->tx_w++;
			q->tx_pkt = 0;
			continue;
		}
		/* What the peer acknowledged since a rewind (a probe's answer
		 * said it had more) does not go again. */
		if (reliable(q) && !is_rd(w) && psn_compare(q->una, psn_add(w->psn, q->tx_pkt)) > 0 &&
		    psn_compare(q->una, psn_add(w->psn, w->npkts)) < 0)
			q->tx_pkt = (uint32_t)psn_compare(q->una, w->psn);
		/* A READ's lost responses are asked for again by range
		 * (read_lost), not with its window: a loss does not narrow
		 * it.  Sent again after a rewind, a READ asks only for the
		 * responses still missing. */
		uint32_t win = is_read(w) ? full_window(q) : window(q);
		if (is_read(w)) {
			while (q->tx_pkt < w->npkts && !resp_missing(w, q->tx_pkt))
				q->tx_pkt++;
			if (q->tx_pkt >= w->npkts) {
				q->tx_w++;
				q->tx_pkt = 0;
				continue;
			}
		}
		/* After a timeout, its first packet alone (pkt_req_tick), and
		 * that one whatever the window: a retry that the window held
		 * back would spend retry_cnt without sending anything. */
		bool probe = q->probing && psn_add(w->psn, q->tx_pkt) == q->probe_psn;
		if (q->probing && !probe)
			break;
		if (reliable(q) && !probe &&
		    psn_compare(psn_add(w->psn, q->tx_pkt), q->una) >= (int32_t)win) {
			/* Held by the window, w has its PSNs and must not wait
			 * without a timer: una on a PSN that nothing will
			 * answer again would leave it so for good. */
			if (!q->deadline)
				arm_timer(q, now ? now : sv_now_ns());
			break;
		}
		uint32_t used = is_read(w) ? missing_run(w, q->tx_pkt) : 0;
		int err = send_one(q, w, q->tx_pkt, liov, nl, len, &used);
		if (err == EFAULT) {
			wqe_fail(q, w, IBV_WC_LOC_PROT_ERR, "its GPU memory could not be read "
				 "(cuMemcpy failed: freed?)");
			q->tx_w++;
			q->tx_pkt = 0;
			continue;
		}
		if (err == EHOSTUNREACH && !reliable(q)) {
			/* Lost on an unreliable transport: the WQE still completes. */
			used = w->npkts - q->tx_pkt;
		}
		if (reliable(q) && !q->deadline) {
			if (!now)
				now = sv_now_ns();
			arm_timer(q, now);
		}
		uint32_t end = psn_add(w->psn, q->tx_pkt + used);
		if (reliable(q) && psn_compare(end, q->snd_max) > 0) {
			/* A message's last packet, sent for the first time
			 * (Karn), times the round trip if none is timed. */
			if (!q->rtt_timing && q->tx_pkt + used >= w->npkts) {
				if (!now)
					now = sv_now_ns();
				q->rtt_timing = true;
				q->rtt_psn = psn_add(end, SV_PSN_MASK);
				q->rtt_sent = now;
			}
			q->snd_max = end;
		}
		q->tx_pkt += used;
		if (q->tx_pkt >= w->npkts) {
			if (!reliable(q))
				w->pstate = PW_DONE;
			q->tx_w++;
			q->tx_pkt = 0;
		}
	}
}

/* Sends everything again from psn (go-back-N, IBA 9.7.5.1.?). */
static void rewind_to(struct pkt_qp *q, uint32_t psn)
{
	int j = wqe_of_psn(q, psn);

	if (j < 0)
		return;
	struct sv_swqe *w = wqe_at(q->qp, (uint32_t)j);
	q->tx_w = (uint32_t)j;
	q->tx_pkt = is_read(w) ? w->got : (uint32_t)psn_compare(psn, w->psn);
	q->rtt_timing = false;	/* its ACK may come after the packet's second sending */
	repairs_reset(q);
	PKT_COUNT(q, retrans);
}

/* A WQE sent and not yet answered. */
static bool awaiting(struct pkt_qp *q)
{
	for (uint32_t i = 0; i < q->nassigned; i++)
		if (wqe_at(q->qp, i)->pstate == PW_SENT)
			return true;
	return false;
}

static void ack_upto(struct pkt_qp *q, uint32_t psn, uint64_t now)
{
	uint32_t next = psn_add(psn, 1), floor = read_floor(q);

	/* Never past a READ response still missing: an ACK or NAK beyond
	 * it says the request was served, not that its answer arrived. */
	if (psn_compare(next, floor) > 0)
		next = floor;
	/* Nor past what was sent: an ACK for a PSN not yet sent is forged
	 * or corrupt (a ghost, which rxe drops too). */
	if (psn_compare(next, q->snd_max) > 0)
		next = q->snd_max;

	if (psn_compare(next, q->una) > 0) {
		uint32_t n = (uint32_t)psn_compare(next, q->una);
		q->una = next;
		if (q->rtt_timing && psn_compare(next, q->rtt_psn) > 0) {
			uint64_t s = now > q->rtt_sent ? now - q->rtt_sent : 0;
			q->srtt = q->srtt ? (7 * q->srtt + s) / 8 : s;	/* RFC 6298 2.3 */
			q->rtt_timing = false;
		}
		cwnd_grow(q, n);
		q->probing = q->tail_probe = false;
		q->tlps = 0;
		q->retry_left = q->qp->attr.retry_cnt;
		q->rnr_left = q->qp->attr.rnr_retry == 7 ? -1 : q->qp->attr.rnr_retry;
		q->deadline = 0;
	}
	for (uint32_t i = 0; i < q->nassigned; i++) {
		struct sv_swqe *w = wqe_at(q->qp, i);
		if (w->pstate != PW_SENT || psn_compare(q->una, psn_add(w->psn, w->npkts)) < 0)
			continue;
		/* una stops at a READ's first missing response (read_floor),
		 * so a WQE behind it is a SEND, a WRITE or an atomic. */
		if (!is_resp(w))
			w->pstate = PW_DONE;
		else if (w->got < w->npkts)
			rewind_to(q, w->psn);	/* an atomic whose answer was lost */
	}
	/* Something still unanswered keeps the timer running. */
	if (!q->deadline && awaiting(q))
		arm_timer(q, now);
}

/* ---- READ responses ---- */

/* Asks again for the responses of READ w missing in [a, b): a READ has
 * no side effect, so the responder serves a request for just those as
 * a duplicate (9.7.5.3.1), and what arrived is not asked for again. */
static void ask_again(struct pkt_qp *q, struct sv_swqe *w, uint32_t a, uint32_t b)
{
	struct iovec liov[SV_MAX_SGE + 1];
	uint64_t len;
	int nl;

	if (b > w->npkts)
		b = w->npkts;
	if (sv_wqe_local_iov(q->qp, w, true, liov, &nl, &len) != SV_R_OK)
		return;
	for (uint32_t k = a; k < b;) {
		uint32_t n = missing_run(w, k);
		if (!n) {
			k++;
			continue;
		}
		if (n > b - k)
			n = b - k;
		PKT_COUNT(q, retrans);
		send_one(q, w, k, liov, nl, len, &n);
		k += n;
	}
}

/* The READ still waiting for psn's response, and its index there. */
static bool read_waiting(const struct sv_swqe *w, uint32_t psn, uint32_t *k)
{
	if (!is_read(w) || w->pstate != PW_SENT || psn_compare(psn, w->psn) < 0 ||
	    psn_compare(psn, psn_add(w->psn, w->npkts)) >= 0)
		return false;
	*k = (uint32_t)psn_compare(psn, w->psn);
	return true;
}

/* Asks again for READ w's missing responses in PSNs [psn, end), and
 * keeps the range to see whether this request's answers arrive. */
static void repair_add(struct pkt_qp *q, struct sv_swqe *w, uint32_t psn, uint32_t end,
		       uint64_t now)
{
	if (q->nrep == PKT_REPAIRS)
		return;		/* the ACK timeout will do */
	q->rep[q->nrep++] = (struct pkt_repair){ psn, end, ++q->rep_seq, q->snd_max, now, w };
	ask_again(q, w, (uint32_t)psn_compare(psn, w->psn), (uint32_t)psn_compare(end, w->psn));
}

/*
 * The responder answers requests in the order they came (IBA 9.5), so a
 * response, or an ACK, to a request sent after another shows that the
 * answers the earlier one still misses were lost: they are asked for
 * again at once, instead of after the ACK timeout.  This is RACK's rule
 * (RFC 8985 6.2) with the order of sending in place of its clock: a
 * responder slowed down by its host answers late but in order, so a
 * slow answer is never taken for a lost one, and nothing goes again
 * without a loss shown.  Which request an answer came from: the newest
 * repair whose range holds its PSN, else the PSN's first sending, which
 * went after every repair whose mark it is at or beyond.  psn: the
 * response's PSN, or an ACK's (ack: its first sending is later than
 * every READ response before it).
 */
static void read_lost(struct pkt_qp *q, uint32_t psn, uint64_t now)
{
	int by = -1;

	for (uint32_t i = 0; i < q->nrep; i++)
		if (psn_compare(psn, q->rep[i].psn) >= 0 && psn_compare(psn, q->rep[i].end) < 0 &&
		    (by < 0 || (int32_t)(q->rep[i].seq - q->rep[by].seq) > 0))
			by = (int)i;
	/* Sooner than half a round trip after the repair went, it is the
	 * first sending's answer, late (reordered on the way), and shows
	 * nothing about the repairs before it. */
	if (by >= 0 && now - q->rep[by].sent < q->srtt / 2)
		return;
	uint32_t by_seq = by >= 0 ? q->rep[by].seq : 0;

	/* Repairs sent before that request: what they still miss was lost. */
	for (uint32_t i = 0; i < q->nrep;) {
		struct pkt_repair *r = &q->rep[i];
		uint32_t k = 0;
		while (psn_compare(r->psn, r->end) < 0 && read_waiting(r->w, r->psn, &k) &&
		       !resp_missing(r->w, k))
			r->psn = psn_add(r->psn, 1);
		if (psn_compare(r->psn, r->end) >= 0 || !read_waiting(r->w, r->psn, &k)) {
			*r = q->rep[--q->nrep];	/* all in, or its READ is over */
			continue;
		}
		if (by >= 0 ? (int32_t)(r->seq - by_seq) < 0 : psn_compare(psn, r->mark) >= 0) {
			r->seq = ++q->rep_seq;
			r->mark = q->snd_max;
			r->sent = now;
			ask_again(q, r->w, k, (uint32_t)psn_compare(r->end, r->w->psn));
		}
		i++;
	}
	if (by >= 0 || psn_compare(psn, q->rd_seen) < 0)
		return;
	/* First sendings before it that nothing answered: lost. */
	for (uint32_t i = 0; i < q->nassigned && psn_compare(q->rd_seen, psn) < 0; i++) {
		struct sv_swqe *w = wqe_at(q->qp, i);
		uint32_t end = psn_add(w->psn, w->npkts);
		if (w->npkts && psn_compare(w->psn, psn) >= 0)
			break;		/* sent after it */
		if (!is_read(w) || w->pstate != PW_SENT || psn_compare(end, q->rd_seen) <= 0)
			continue;
		uint32_t from = psn_compare(q->rd_seen, w->psn) > 0 ? q->rd_seen : w->psn;
		uint32_t to = psn_compare(psn, end) < 0 ? psn : end;
		uint32_t k = (uint32_t)psn_compare(from, w->psn), kend = (uint32_t)psn_compare(to, w->psn);
		while (k < kend && !resp_missing(w, k))
			k++;
		if (k < kend)
			repair_add(q, w, psn_add(w->psn, k), to, now);
	}
	q->rd_seen = psn_add(psn, 1);
}

static void read_response(struct pkt_qp *q, const struct ib_bth *bth, const struct sv_link_pkt *p,
			  uint64_t now)
{
	uint32_t psn = bth_psn(bth);
	int j = wqe_of_psn(q, psn);
	struct sv_swqe *w = j >= 0 ? wqe_at(q->qp, (uint32_t)j) : NULL;

	if (w && w->opcode == IBV_WR_ATOMIC_WRITE && w->pstate == PW_SENT &&
	    bth_op(bth) == IB_OP_READ_RESP_ONLY) {
		w->got = 1;	/* its answer (responder's send_empty_read_resp) */
		w->pstate = PW_DONE;
		read_lost(q, psn, now);
		ack_upto(q, psn, now);
		return;
	}
	if (!w || !is_read(w) || w->pstate != PW_SENT) {
		PKT_COUNT(q, dups);
		return;
	}
	uint32_t k = (uint32_t)psn_compare(psn, w->psn);
	if (!resp_missing(w, k)) {
		PKT_COUNT(q, dups);	/* had it */
		read_lost(q, psn, now);	/* still an answer, and in order */
		return;
	}
	if (k - w->got >= SV_READ_OOO_BITS) {
		PKT_COUNT(q, dups);	/* beyond the window: cannot happen */
		return;
	}
	unsigned hl = sizeof(*bth) + ib_hdr_len(bth->opcode);
	size_t plen = p->len - hl - bth_pad(bth);
	struct iovec liov[SV_MAX_SGE + 1], dst[SV_MAX_SGE + 1];
	uint64_t len;
	int nl;
	if (sv_wqe_local_iov(q->qp, w, true, liov, &nl, &len) != SV_R_OK) {
		wqe_fail(q, w, IBV_WC_LOC_PROT_ERR, "the READ's buffer went away");
		return;
	}
	uint64_t off = (uint64_t)k * q->mtu;
	uint64_t want = len - off < q->mtu ? len - off : q->mtu;
	if (off > len || plen != want) {
		PKT_COUNT(q, drops);	/* not the size this response must have (9.7.5.1.?) */
		return;
	}
	/* READ responses land where their PSN says, in any order: a
	 * response ahead of a lost one is kept, not sent again. */
	int nd = sv_iov_slice(liov, nl, off, plen, dst);
	struct iovec src = { (void *)(p->buf + hl), plen };
	/* Into GPU memory, responses join a run (pkt_gpu.c). */
	if (nd != 1 || !pkt_gpu_put(q, dst[0].iov_base, src.iov_base, plen, w, psn, NULL, NULL)) {
		int err = sv_copy_iov(dst, nd, &src, 1);
		if (err) {
			wqe_fail(q, w, IBV_WC_LOC_PROT_ERR, "the READ's GPU memory could not be "
				 "written (cuMemcpy failed: freed?)");
			return;
		}
	}
	ooo_set(w, k - w->got);
	ooo_advance(w);
	if (w->got == w->npkts) {
		pkt_gpu_flush_held(q->pc, q);	/* its data in place before it completes */
		if (w->pstate == PW_SENT)
			w->pstate = PW_DONE;
	}
	read_lost(q, psn, now);
	/* Up to the first response still missing (read_floor), but past no
	 * SEND, WRITE or atomic that nothing answered after:
	 * unanswered_after. */
	uint32_t upto = read_floor(q), seen = psn_add(psn, 1);
	if (psn_compare(q->rd_seen, seen) > 0)
		seen = q->rd_seen;
	if (psn_compare(upto, seen) > 0)
		upto = unanswered_after(q, seen, upto);
	if (psn_compare(upto, q->una) > 0)
		ack_upto(q, psn_add(upto, SV_PSN_MASK), now);
}

static void atomic_ack(struct pkt_qp *q, const struct ib_bth *bth, const struct sv_link_pkt *p,
		       uint64_t now)
{
	uint32_t psn = bth_psn(bth);
	int j = wqe_of_psn(q, psn);
	struct sv_swqe *w = j >= 0 ? wqe_at(q->qp, (uint32_t)j) : NULL;

	if (!w || !is_atomic(w) || w->pstate != PW_SENT) {
		PKT_COUNT(q, dups);
		return;
	}
	struct iovec liov[SV_MAX_SGE + 1];
	uint64_t len, orig = ib_get64(p->buf + sizeof(*bth) + sizeof(struct ib_aeth));
	int nl;
	if (sv_wqe_local_iov(q->qp, w, true, liov, &nl, &len) != SV_R_OK || len != 8) {
		wqe_fail(q, w, IBV_WC_LOC_PROT_ERR, "the atomic's buffer went away");
		return;
	}
	/* The original value, in host order as a local atomic leaves it. */
	struct iovec src = { &orig, 8 };
	sv_copy_iov(liov, nl, &src, 1);
	w->got = 1;
	w->pstate = PW_DONE;
	read_lost(q, psn, now);
	ack_upto(q, psn, now);
}

static void nak(struct pkt_qp *q, uint8_t syn, uint32_t psn, uint64_t now)
{
	int j;

	if (psn_compare(psn, q->una) > 0)
		ack_upto(q, psn_add(psn, SV_PSN_MASK), now);
	j = wqe_of_psn(q, psn);
	struct sv_swqe *w = j >= 0 ? wqe_at(q->qp, (uint32_t)j) : NULL;
	if ((syn & 0xe0) == AETH_RNR) {
		/* 9.7.5.2.8: wait the responder's RNR timer, then resend
		 * from the PSN it refused, while rnr_retry lasts. */
		PKT_COUNT(q, rnr_naks);
		if (!w)
			return;
		if (q->rnr_left == 0) {
			char why[200];
			snprintf(why, sizeof(why), "qpn 0x%x had no receive posted through rnr_retry=%u "
				 "retries (post receives before the peer sends, or raise rnr_retry; 7 = "
				 "forever)", q->dest_qpn, q->qp->attr.rnr_retry);
			wqe_fail(q, w, IBV_WC_RNR_RETRY_EXC_ERR, why);
			return;
		}
		if (q->rnr_left > 0)
			q->rnr_left--;
		q->rnr_until = now + sv_rnr_delay_ns(syn & 0x1f);
		q->deadline = 0;
		rewind_to(q, psn);
		q->pc->ops->want_tick(q->pc->link, q->rnr_until);
		return;
	}
	switch (syn & 0x1f) {
	case NAK_PSN_SEQ:
		/* The responder expects psn: resend from there. */
		PKT_COUNT(q, naks_seq);
		loss_seen(q, psn, false);
		rewind_to(q, psn);
		return;
	case NAK_INV_REQ:
		if (w)
			wqe_fail(q, w, IBV_WC_REM_INV_REQ_ERR, "the responder answered Invalid Request "
				 "(a bad opcode sequence, length or atomic alignment; see its explain "
				 "line)");
		return;
	case NAK_REM_ACCESS:
		if (w)
			wqe_fail(q, w, IBV_WC_REM_ACCESS_ERR, "the responder answered Remote Access "
				 "Error (rkey, bounds or access rights; see its explain line)");
		return;
	default:
		if (w)
			wqe_fail(q, w, IBV_WC_REM_OP_ERR, "the responder answered Remote Operational "
				 "Error");
		return;
	}
}

/* Completes finished WQEs from the head, in order; the caller holds
 * sq_lock. */
static int complete_head(struct pkt_qp *q)
{
	struct sv_qp *qp = q->qp;

	while (qp->sq_count && q->nassigned) {
		struct sv_swqe *w = sv_sq_slot(qp, qp->sq_head);
		if (w->pstate != PW_DONE && w->pstate != PW_ERROR)
			break;
		bool err = w->pstate == PW_ERROR;
		enum ibv_wc_status st = err ? (enum ibv_wc_status)w->pstatus : IBV_WC_SUCCESS;
		bool ok = w->hidden ? sv_pkt_hidden_done(qp, w, st) :
			  sv_wqe_complete(qp, w, st, sv_wqe_len(w));
		if (w->hidden)
			qp->sq_hidden--;
		qp->sq_head = (qp->sq_head + 1) % qp->sq_size;
		qp->sq_count--;
		q->nassigned--;
		if (q->tx_w)
			q->tx_w--;
		else
			q->tx_pkt = 0;
		if (!ok)
			return SV_RUN_OVERRUN;
		if (err)
			return SV_RUN_FAILED;
	}
	if (!q->nassigned) {
		q->deadline = 0;
		if (q->drain_notify) {
			q->drain_notify = false;
			if (atomic_load_explicit(&qp->sh->state, memory_order_relaxed) ==
			    IBV_QPS_SQD)
				sv_async_event(qp->ex.qp_base.context, &qp->ex.qp_base,
					       IBV_EVENT_SQ_DRAINED);
		}
	}
	return SV_RUN_OK;
}

bool sv_pkt_sq_drained(struct sv_qp *qp, bool notify)
{
	/* qp->pq under sq_lock, which detaching it takes (pkt.c). */
	pthread_mutex_lock(&qp->sq_lock);
	struct pkt_qp *q = qp->pq;
	bool drained = !q || !qp->pq_remote || !q->nassigned;
	if (!drained)
		q->drain_notify = notify;
	pthread_mutex_unlock(&qp->sq_lock);
	return drained;
}

/* Whether a post leaves what waits to be sent for the next ACK
 * (PKT_CORK_INFLIGHT): only while it is less than a batch, as a long
 * message (or a READ of as many responses) alone is.  The messages in
 * flight are counted, not their packets, so that a short message posted
 * behind one long WRITE (a rendezvous's notice) leaves at once.  Timeout
 * 0 (no ACK timer, IBA 9.7.6.1.3) has no timer to repair a lost ACK, so
 * nothing waits for one. */
static bool corked(const struct pkt_qp *q)
{
	struct sv_qp *qp = q->qp;
	uint32_t pkts = 0;

	if (!reliable(q) || q->probing || !qp->attr.timeout || q->tx_w < PKT_CORK_INFLIGHT)
		return false;
	for (uint32_t i = q->tx_w; i < qp->sq_count && pkts < PKT_CORK_PKTS; i++) {
		const struct sv_swqe *w = wqe_at(qp, i);
		pkts += npkts_of(q, w, sv_wqe_len(w));
	}
	return pkts < PKT_CORK_PKTS;
}

int sv_pkt_sq_run(struct sv_qp *qp, bool post)
{
	struct pkt_qp *q = qp->pq;

	if (atomic_load_explicit(&qp->sh->state, memory_order_relaxed) == IBV_QPS_ERR)
		return SV_RUN_FAILED;
	int r = complete_head(q);
	if (r != SV_RUN_OK)
		return r;
	if (!post || !corked(q))
		transmit(q);
	/* ACKs a CQ poller held leave in this system call, after the data.
	 * Only if rx_lock is free: the caller holds sq_lock, and reception
	 * takes rx_lock first (run_after_rx holds both already). */
	struct pkt_ctx *pc = q->pc;
	if (atomic_load_explicit(&pc->acks_held, memory_order_relaxed) &&
	    !pthread_mutex_trylock(&pc->rx_lock)) {
		pkt_send_acks(pc);
		pthread_mutex_unlock(&pc->rx_lock);
	}
	pkt_flush(q);
	return complete_head(q);
}

void sv_pkt_sq_reset(struct sv_qp *qp)
{
	struct pkt_qp *q = qp->pq;

	q->nassigned = q->tx_w = q->tx_pkt = 0;
	q->deadline = q->rnr_until = 0;
	q->una = q->rd_seen = q->npsn;
	q->nrep = 0;
	q->probing = q->halted = q->drain_notify = false;
	cc_reset(q);
}

void pkt_req_start(struct pkt_qp *q, uint32_t psn)
{
	q->npsn = q->una = q->rd_seen = psn;
	q->nassigned = q->tx_w = q->tx_pkt = q->nrep = 0;
	q->halted = q->drain_notify = false;
	cc_reset(q);
}

/*
 * A tail-loss probe (RFC 8985 7): nothing was answered for two round
 * trips, which a lost tail does (no later packet shows the responder a
 * gap) as well as a lost ACK or sequence NAK (the responder NAKs a gap
 * once, 9.7.5.2.?).  The first packet not acknowledged goes again,
 * alone, asking for an ACK: a responder that had it acknowledges all it
 * has (a duplicate, 9.7.5.3.1), one waiting for it takes it and answers
 * for it alone (tail_answered).  An atomic is sent again (a responder
 * answers a duplicate from its records, 9.7.5.3.2).  No retry is spent:
 * the ACK timeout runs on behind the probes.  A READ is left to the
 * timeout: a loaded host's responder often pauses longer than a probe's
 * wait, and probes asking its responses again, whole holes or single
 * responses, made a 64 MiB READ into a sleeping process
 * (unit.dataplane.udp) miss its 10 s under load.
 */
static void tail_probe(struct pkt_qp *q, uint64_t now)
{
	int j = wqe_of_psn(q, q->una);
	struct sv_swqe *w = j >= 0 ? wqe_at(q->qp, (uint32_t)j) : NULL;
	struct iovec liov[SV_MAX_SGE + 1];
	uint64_t len;
	int nl;

	q->tlps++;
	if (w && w->pstate == PW_SENT && !is_read(w) && !q->probing &&
	    sv_wqe_local_iov(q->qp, w, is_atomic(w), liov, &nl, &len) == SV_R_OK) {
		sv_dbg("qpn 0x%x: tail-loss probe at psn 0x%x (wr_id 0x%llx)", q->qpn, q->una,
		       (unsigned long long)w->wr_id);
		q->rtt_timing = false;
		q->tail_probe = !is_resp(w);	/* an atomic (write)'s answer is no ACK */
		q->probe_psn = q->una;
		PKT_COUNT(q, retrans);
		uint32_t used = 0;
		send_one(q, w, (uint32_t)psn_compare(q->una, w->psn), liov, nl, len, &used);
	} else {
		q->tlps = PKT_TLP_MAX;	/* nothing to probe: the ACK timeout next */
	}
	arm_timer(q, now);
}

/* The probe's packet acknowledged alone: the responder was waiting for
 * it, so what followed it was lost and goes again (go-back-N). */
static void tail_answered(struct pkt_qp *q)
{
	int j = wqe_of_psn(q, q->una);

	if (j < 0 || psn_compare(q->snd_max, q->una) <= 0 || is_resp(wqe_at(q->qp, (uint32_t)j)))
		return;
	loss_seen(q, q->una, false);
	rewind_to(q, q->una);
}

/* After a response: run, and take the QP to ERR if a WQE failed.  The
 * transition is the owner's progress thread's (err_pending, as for a
 * remote-induced error): this thread holds the context's rx_lock, which
 * the verbs that take qp->lock may be waiting for. */
static void run_after_rx(struct sv_qp *qp)
{
	int r = sv_pkt_sq_run(qp, false);

	pthread_mutex_unlock(&qp->sq_lock);
	if (r == SV_RUN_OK)
		return;
	sv_qp_mark_err(qp, r == SV_RUN_OVERRUN ? 2u + IBV_EVENT_QP_FATAL : 1u);
	sv_seg_ring(qp->ctx->seg.h);
}

void pkt_req_rx(struct pkt_qp *q, const struct ib_bth *bth, const struct sv_link_pkt *p)
{
	struct sv_qp *qp = q->qp;
	uint64_t now = p->at;
	unsigned op = bth_op(bth);

	/* A responder's run holds its MR: the send queue this ACK may run
	 * (a LOCAL_INV, a bind) must not wait for it. */
	pkt_gpu_flush_resp(q->pc);
	pthread_mutex_lock(&qp->sq_lock);
	if (!qp->pq_remote || !reliable(q)) {
		pthread_mutex_unlock(&qp->sq_lock);
		return;
	}
	const struct ib_aeth *aeth = (const struct ib_aeth *)(p->buf + sizeof(*bth));
	/* A probe after a timeout (q->probing) ends when the peer makes
	 * progress (ack_upto), NAKs, or answers the probe itself: an atomic
	 * behind una whose response was lost is answered again from the
	 * responder's records and moves una nowhere.  Duplicate responses
	 * of a slow responder's backlog end nothing. */
	bool tail_answer = q->tail_probe && bth_psn(bth) == q->probe_psn;
	if (bth_psn(bth) == q->probe_psn)
		q->probing = q->tail_probe = false;
	if (op == IB_OP_ACK) {
		uint8_t syn = aeth_syn(aeth);
		if ((syn & 0xe0) == AETH_ACK) {
			read_lost(q, bth_psn(bth), now);
			ack_upto(q, bth_psn(bth), now);
			if (tail_answer)
				tail_answered(q);
		} else {
			q->probing = q->tail_probe = false;
			nak(q, syn, bth_psn(bth), now);
		}
	} else if (op == IB_OP_ATOMIC_ACK) {
		atomic_ack(q, bth, p, now);
	} else {
		read_response(q, bth, p, now);
	}
	run_after_rx(qp);
}

uint64_t pkt_req_tick(struct pkt_qp *q, uint64_t now)
{
	struct sv_qp *qp = q->qp;
	uint64_t next;

	pthread_mutex_lock(&qp->sq_lock);
	if (!qp->pq_remote) {
		pthread_mutex_unlock(&qp->sq_lock);
		return 0;
	}
	if (q->rnr_until && now >= q->rnr_until) {
		q->rnr_until = 0;
		arm_timer(q, now);
	}
	if (q->deadline && now >= q->deadline && q->tlp_armed) {
		q->deadline = 0;
		tail_probe(q, now);
	} else if (q->deadline && now >= q->deadline) {
		/* 9.7.6.1.3: no response within the local ACK timeout: send
		 * again from the first PSN not acknowledged, retry_cnt times. */
		q->deadline = 0;
		struct sv_swqe *w = NULL;
		for (uint32_t i = 0; i < q->nassigned && !w; i++)
			if (wqe_at(qp, i)->pstate == PW_SENT)
				w = wqe_at(qp, i);
		if (w && q->retry_left == 0) {
			char why[200];
			snprintf(why, sizeof(why), "no answer from qpn 0x%x within timeout %u (%.3f ms) "
				 "through retry_cnt=%u retries: the peer is gone or unreachable",
				 q->dest_qpn, qp->attr.timeout,
				 (double)sv_ack_timeout_ns(qp->attr.timeout) / 1e6, qp->attr.retry_cnt);
			wqe_fail(q, w, IBV_WC_RETRY_EXC_ERR, why);
		} else if (w) {
			/* From its first packet not answered. */
			uint32_t from = is_read(w) ? psn_add(w->psn, w->got) :
					psn_compare(q->una, w->psn) > 0 &&
					psn_compare(q->una, psn_add(w->psn, w->npkts)) < 0 ? q->una :
					w->psn;
			sv_dbg("qpn 0x%x: ACK timeout at psn 0x%x (wr_id 0x%llx), %d retries left",
			       q->qpn, from, (unsigned long long)w->wr_id, q->retry_left);
			q->retry_left--;
			/* After a timeout only the first packet not answered goes
			 * again until the peer answers (a loss window of one, as
			 * TCP's after its retransmission timeout, RFC 5681 3.1):
			 * a responder that is only slow still has the rest of
			 * the window queued, and all of it again with every
			 * timeout left it further behind each time, until the
			 * retries ran out (unit.gpu.udp_slow under load).  Once
			 * it answers (pkt_req_rx says when), the rest of the
			 * window goes again (go-back-N). */
			loss_seen(q, from, true);
			rewind_to(q, from);
			q->tail_probe = false;
			q->probing = true;
			q->probe_psn = from;
			arm_timer(q, now);
		}
	}
	next = q->rnr_until ? q->rnr_until : q->deadline;
	run_after_rx(qp);
	return next;
}

/* ---- rendezvous from another host (engine/tm.c) ---- */

/* A READ and its FIN fit in the QP's own slots (sq_lock held). */
static bool rndv_fits(const struct sv_qp *qp)
{
	return qp->sq_hidden + 2 <= qp->sq_hidden_max;
}

bool pkt_req_rndv_room(struct pkt_qp *q)
{
	struct sv_qp *qp = q->qp;

	pthread_mutex_lock(&qp->sq_lock);
	bool room = rndv_fits(qp);
	pthread_mutex_unlock(&qp->sq_lock);
	return room;
}

/*
 * What a device does for a rendezvous that matched (rdma-core's
 * Documentation/tag_matching.md): it reads the payload the RVH names
 * from the sender into the tag's buffer, on this QP, and then sends the
 * sender the FIN, the TMH and RVH with opcode FIN, into a receive WQE
 * of the sending QP.  Both are WQEs of this QP's send queue that no WR
 * posted (enum sv_hidden), so they take PSNs, are retried and fail as
 * any other: the FIN is fenced behind the READ (10.8.3.3), and the READ
 * completes the tag in the SRQ's CQ (sv_pkt_hidden_done).  The room was
 * checked at the message's first packet, and only this QP's reception
 * queues them.
 */
void pkt_req_rndv(struct pkt_qp *q, const struct shm_rwqe *tag, const uint8_t hdr[32])
{
	struct sv_qp *qp = q->qp;
	struct ibv_tmh tmh;
	struct ibv_rvh rvh;

	memcpy(&tmh, hdr, sizeof(tmh));
	memcpy(&rvh, hdr + sizeof(tmh), sizeof(rvh));
	pthread_mutex_lock(&qp->sq_lock);
	if (!rndv_fits(qp)) {
		pthread_mutex_unlock(&qp->sq_lock);
		return;
	}
	struct sv_swqe *rd = sv_sq_slot(qp, qp->sq_head + qp->sq_count);
	sv_swqe_init(qp, rd, tag->wr_id, IBV_WR_RDMA_READ, 0);
	rd->hidden = SV_HIDDEN_RNDV_READ;
	rd->remote_addr = be64toh(rvh.va);
	rd->rkey = be32toh(rvh.rkey);
	/* The tag's buffer, up to the payload's length (engine/tm.c
	 * checked that it holds it). */
	uint64_t left = be32toh(rvh.len);
	for (uint32_t i = 0; i < tag->num_sge && left; i++) {
		struct ibv_sge s = tag->sge[i];
		if (s.length > left)
			s.length = (uint32_t)left;
		left -= s.length;
		rd->sge[rd->num_sge++] = s;
	}
	struct sv_swqe *fin = sv_sq_slot(qp, qp->sq_head + qp->sq_count + 1);
	sv_swqe_init(qp, fin, tag->wr_id, IBV_WR_SEND, IBV_SEND_FENCE);
	fin->hidden = SV_HIDDEN_FIN;
	tmh.opcode = IBV_TMH_FIN;
	char *in = sv_swqe_inline(qp, fin);
	memcpy(in, &tmh, sizeof(tmh));
	memcpy(in + sizeof(tmh), &rvh, sizeof(rvh));
	fin->inline_len = sizeof(tmh) + sizeof(rvh);
	qp->sq_count += 2;
	qp->sq_hidden += 2;
	run_after_rx(qp);
}

bool sv_pkt_hidden_done(struct sv_qp *qp, const struct sv_swqe *w, enum ibv_wc_status status)
{
	/* A FIN completes nothing; one that fails has failed the QP. */
	if (w->hidden != SV_HIDDEN_RNDV_READ)
		return true;
	/* The tag's second completion, as shm's (engine/tm.c): its data, or
	 * the READ's error (IBA 11.6.3.1: the QP goes to ERR). */
	bool ok = status == IBV_WC_SUCCESS;
	struct shm_hdr *seg = qp->ctx->seg.h;
	struct shm_cqe e = { .wr_id = w->wr_id, .status = status, .opcode = IBV_WC_TM_RECV,
			     .wc_flags = ok ? IBV_WC_TM_DATA_VALID : 0,
			     .byte_len = ok ? (uint32_t)sv_wqe_len(w) : 0,
			     .qp_num = qp->ex.qp_base.qp_num, .src_qp = qp->pq->dest_qpn };
	if (sv_cq_push(seg, shm_at(seg, qp->srq->wq->cq_off), &e))
		return true;
	sv_warn("qpn 0x%x: SRQ CQ overrun, the rendezvous completion of wr_id 0x%llx lost",
		qp->ex.qp_base.qp_num, (unsigned long long)w->wr_id);
	return false;
}

void pkt_req_gpu_failed(struct pkt_qp *q, struct sv_swqe *w, bool locked)
{
	if (!locked)
		pthread_mutex_lock(&q->qp->sq_lock);
	wqe_fail(q, w, IBV_WC_LOC_PROT_ERR, "the READ's GPU memory could not be written "
		 "(cuMemcpy failed: freed?)");
	if (!locked)
		pthread_mutex_unlock(&q->qp->sq_lock);
}
