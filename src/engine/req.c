/* SPDX-License-Identifier: MIT */
/*
 * The requester: ibv_post_send's checks, the send queue, and execution.
 *
 * A send queue is private to the QP's process.  post_send validates each
 * WR (errors the verb itself must return), queues it, and runs the queue:
 * each WQE is executed to the end -- the responder's checks against the
 * target's segment, the one copy, the completions -- unless it must wait
 * for an RNR or retry timer, in which case it and everything behind it
 * wait for the progress thread.  Completions are therefore in order and
 * exactly once per WQE.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gsi.h"
#include "engine.h"

/* What each WR opcode is, and which QP types may post it (IBA 9.2, C10-?:
 * UC has no READ or ATOMIC, UD has only SEND). */
enum {
	F_SEND = 1 << 0, F_WRITE = 1 << 1, F_READ = 1 << 2, F_ATOMIC = 1 << 3,
	F_IMM = 1 << 4, F_RECV = 1 << 5,	/* consumes a receive WQE */
	F_INV = 1 << 6,				/* invalidates an rkey at the responder */
	F_LOCAL = 1 << 7,			/* executed here; no packet (bind, invalidate) */
	F_WORD = 1 << 8,			/* exactly one aligned 8-byte word */
};
enum { T_RC = 1 << 0, T_UC = 1 << 1, T_UD = 1 << 2, T_XRC = 1 << 3, T_RAW = 1 << 4 };
#define T_RCX (T_RC | T_XRC)	/* XRC_SEND has RC's operations */

static const struct wr_info {
	const char *name;
	unsigned flags, types;
	enum ibv_wc_opcode wc;
} wr_info[] = {
	[IBV_WR_RDMA_WRITE] = { "RDMA_WRITE", F_WRITE, T_RCX | T_UC, IBV_WC_RDMA_WRITE },
	[IBV_WR_RDMA_WRITE_WITH_IMM] = { "RDMA_WRITE_WITH_IMM", F_WRITE | F_IMM | F_RECV,
					 T_RCX | T_UC, IBV_WC_RDMA_WRITE },
	/* A raw packet QP's SEND is a whole Ethernet frame. */
	[IBV_WR_SEND] = { "SEND", F_SEND | F_RECV, T_RCX | T_UC | T_UD | T_RAW, IBV_WC_SEND },
	[IBV_WR_SEND_WITH_IMM] = { "SEND_WITH_IMM", F_SEND | F_IMM | F_RECV, T_RCX | T_UC | T_UD,
				   IBV_WC_SEND },
	[IBV_WR_RDMA_READ] = { "RDMA_READ", F_READ, T_RCX, IBV_WC_RDMA_READ },
	[IBV_WR_ATOMIC_CMP_AND_SWP] = { "ATOMIC_CMP_AND_SWP", F_ATOMIC, T_RCX, IBV_WC_COMP_SWAP },
	[IBV_WR_ATOMIC_FETCH_AND_ADD] = { "ATOMIC_FETCH_AND_ADD", F_ATOMIC, T_RCX, IBV_WC_FETCH_ADD },
	[IBV_WR_LOCAL_INV] = { "LOCAL_INV", F_LOCAL, T_RCX | T_UC, IBV_WC_LOCAL_INV },
	[IBV_WR_BIND_MW] = { "BIND_MW", F_LOCAL, T_RCX | T_UC, IBV_WC_BIND_MW },
	[IBV_WR_SEND_WITH_INV] = { "SEND_WITH_INV", F_SEND | F_RECV | F_INV, T_RCX, IBV_WC_SEND },
	/* IBA 1.5 atomic write: an 8-byte RDMA WRITE that lands as one
	 * store; rxe checks remote write access for it. */
	[IBV_WR_ATOMIC_WRITE] = { "ATOMIC_WRITE", F_WRITE | F_WORD, T_RCX, IBV_WC_ATOMIC_WRITE },
};

/* Why the last WQE this thread executed failed, for explain mode. */
__thread char sv_last_why[SV_WHY_LEN];

static unsigned type_bit(enum ibv_qp_type t)
{
	return t == IBV_QPT_RC ? T_RC : t == IBV_QPT_UC ? T_UC : t == IBV_QPT_UD ? T_UD :
	       t == IBV_QPT_XRC_SEND ? T_XRC : t == IBV_QPT_RAW_PACKET ? T_RAW : 0;
}

/* Acknowledged transports: errors come back as NAKs and retries happen. */
static bool reliable(enum ibv_qp_type t)
{
	return t == IBV_QPT_RC || t == IBV_QPT_XRC_SEND;
}

struct sv_swqe *sv_sq_slot(struct sv_qp *qp, uint32_t i)
{
	return (struct sv_swqe *)(qp->sq + (size_t)(i % qp->sq_size) * qp->sq_stride);
}

void *sv_swqe_inline(struct sv_qp *qp, struct sv_swqe *w)
{
	return &w->sge[qp->cap.max_send_sge ? qp->cap.max_send_sge : 1];
}

void sv_swqe_init(struct sv_qp *qp, struct sv_swqe *w, uint64_t wr_id, enum ibv_wr_opcode op,
		  unsigned flags)
{
	memset(w, 0, sizeof(*w));
	w->wr_id = wr_id;
	w->opcode = op;
	w->send_flags = flags;
	w->rnr_left = qp->attr.rnr_retry == 7 ? -1 : qp->attr.rnr_retry;
	w->retry_left = qp->attr.retry_cnt;
}

bool sv_wr_opcode_ok(struct sv_qp *qp, enum ibv_wr_opcode op)
{
	return (unsigned)op < SV_ARRAY_SIZE(wr_info) && wr_info[op].name &&
	       (wr_info[op].types & type_bit(qp->ex.qp_base.qp_type));
}

/* IBA Table 45 (RNR NAK timer field): code -> microseconds x 100. */
static const uint32_t rnr_table_10us[32] = {
	65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192,
	256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576,
	32768, 49152,
};

uint64_t sv_rnr_delay_ns(unsigned code)
{
	return (uint64_t)rnr_table_10us[code & 31] * 10000ull;
}

/* IBA 9.7.6.1.3: the local ACK timeout is 4.096 us * 2^timeout. */
uint64_t sv_ack_timeout_ns(unsigned timeout)
{
	return 4096ull << (timeout > 31 ? 31 : timeout);
}

static int check_wr(struct sv_qp *qp, const struct ibv_send_wr *wr, const char **why)
{
	const struct wr_info *wi = (unsigned)wr->opcode < SV_ARRAY_SIZE(wr_info) ?
				   &wr_info[wr->opcode] : NULL;

	if (!wi || !wi->name) {
		*why = "opcode is not supported (TSO needs a raw packet QP; FLUSH is not offered)";
		return EOPNOTSUPP;
	}
	if (!(wi->types & type_bit(qp->ex.qp_base.qp_type))) {
		*why = "opcode is not valid for this QP type (UC: no READ/ATOMIC; UD: SEND only)";
		return EINVAL;
	}
	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge) {
		*why = "num_sge exceeds the QP's max_send_sge";
		return EINVAL;
	}
	if ((wi->flags & F_ATOMIC) && wr->num_sge != 1) {
		*why = "an atomic needs exactly one 8-byte SGE for the original value";
		return EINVAL;
	}
	if ((wi->flags & F_WORD) && (wr->num_sge != 1 || wr->sg_list[0].length != 8)) {
		*why = "an atomic write carries exactly one 8-byte SGE";
		return EINVAL;
	}
	if (wr->opcode == IBV_WR_BIND_MW && !sv_obj_live(wr->bind_mw.mw, SV_OBJ_MW)) {
		*why = "bind_mw.mw is not an allocated memory window";
		return EINVAL;
	}
	if ((wr->send_flags & IBV_SEND_INLINE) && !(wi->flags & (F_READ | F_ATOMIC))) {
		uint64_t len = 0;
		for (int i = 0; i < wr->num_sge; i++)
			len += wr->sg_list[i].length;
		if (len > qp->cap.max_inline_data) {
			*why = "inline data exceeds the QP's max_inline_data";
			return EINVAL;
		}
	}
	if (qp->ex.qp_base.qp_type == IBV_QPT_UD && !sv_obj_live(wr->wr.ud.ah, SV_OBJ_AH)) {
		*why = "wr.ud.ah is not a live address handle";
		return EINVAL;
	}
	return 0;
}

static void queue_wr(struct sv_qp *qp, const struct ibv_send_wr *wr)
{
	struct sv_swqe *w = sv_sq_slot(qp, qp->sq_head + qp->sq_count);
	bool inl = (wr->send_flags & IBV_SEND_INLINE) &&
		   !(wr_info[wr->opcode].flags & (F_READ | F_ATOMIC));

	sv_swqe_init(qp, w, wr->wr_id, wr->opcode, wr->send_flags);
	w->imm = wr->imm_data;
	w->remote_addr = wr->wr.rdma.remote_addr;
	w->rkey = wr->wr.rdma.rkey;
	if (wr_info[wr->opcode].flags & F_ATOMIC) {
		w->remote_addr = wr->wr.atomic.remote_addr;
		w->rkey = wr->wr.atomic.rkey;
		w->compare_add = wr->wr.atomic.compare_add;
		w->swap = wr->wr.atomic.swap;
	}
	if (qp->ex.qp_base.qp_type == IBV_QPT_XRC_SEND)
		w->srqn = wr->qp_type.xrc.remote_srqn;
	if (qp->ex.qp_base.qp_type == IBV_QPT_UD) {
		w->remote_qpn = wr->wr.ud.remote_qpn;
		w->remote_qkey = wr->wr.ud.remote_qkey;
		w->av = sv_ah(wr->wr.ud.ah)->attr;
	}
	if (wr->opcode == IBV_WR_BIND_MW) {
		w->mw = wr->bind_mw.mw;
		w->rkey = wr->bind_mw.rkey;
		w->bind = wr->bind_mw.bind_info;
	}
	if (wr_info[wr->opcode].flags & F_LOCAL) {
		qp->sq_count++;	/* no data; LOCAL_INV's rkey is in imm (a union) */
		return;
	}
	if (inl) {
		/* Inline data is copied now: the buffer may be reused as soon
		 * as post_send returns.  It may be GPU memory (sv_copy_iov). */
		char *dst = sv_swqe_inline(qp, w);
		for (int i = 0; i < wr->num_sge; i++) {
			struct iovec d = { dst + w->inline_len, wr->sg_list[i].length },
				     s = { (void *)(uintptr_t)wr->sg_list[i].addr, d.iov_len };
			sv_copy_iov(&d, 1, &s, 1);
			w->inline_len += wr->sg_list[i].length;
		}
		w->num_sge = 0;
	} else {
		w->num_sge = (uint32_t)wr->num_sge;
		if (wr->num_sge)	/* sg_list may be NULL then */
			memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(w->sge[0]));
	}
	qp->sq_count++;
}

/*
 * What a WR to a receiver reached before will touch there, asked for as
 * soon as the QP's lock is held, so that the lines travel while the WR is
 * checked and queued rather than one after the other when written:
 *   - a WRITE: its destination's first line, when the QP's map cache
 *     covers it (the receiver may well be polling that line);
 *   - a SEND: the receiver's next WQE, and the next deferred slot when the
 *     last message was deferred, else the line of the CQE it will push.
 * A deferred SEND writes its CQE about 100 ns later, after the slot, and
 * fetching that line early only let the polling receiver take it back in
 * between (ib_send_lat private 0.37 -> 0.41 us; shareable 0.27 -> 0.22).
 * Hints only: a stale cache costs a transfer.  The peer and map caches are
 * used under sq_lock, as by sv_resp_locate() and direct_map().
 */
static void prefetch_receiver(struct sv_qp *qp, const struct ibv_send_wr *wr)
{
	struct shm_hdr *seg = qp->peer.seg;
	enum ibv_qp_type type = qp->ex.qp_base.qp_type;

	if (!seg || (type != IBV_QPT_RC && type != IBV_QPT_UC) ||
	    (unsigned)wr->opcode >= SV_ARRAY_SIZE(wr_info))
		return;
	unsigned flags = wr_info[wr->opcode].flags;
	if (flags & F_WRITE) {
		const struct sv_map_cache *c = &qp->map;
		uint64_t a = wr->wr.rdma.remote_addr;

		if (c->base && a >= c->addr && a - c->addr < c->length)
			sv_prefetchw(c->base + (a - c->addr));
		return;
	}
	const struct shm_qp *tq = flags & F_SEND ? sv_seg_qp(seg, qp->attr.dest_qp_num) : NULL;
	if (!tq)
		return;
	if (tq->rq_off) {
		const struct shm_wq *wq = shm_at(seg, tq->rq_off);
		uint64_t pos = atomic_load_explicit(&wq->rx_head, memory_order_relaxed);
		sv_prefetchw(shm_wq_slot(seg, wq, pos));
	}
	if (qp->defer_last) {
		sv_prefetchw(qp->ctx->tp_mem->defer_next(seg));
	} else if (tq->rcq_off) {
		const struct shm_cq *cq = shm_at(seg, tq->rcq_off);
		uint64_t p = atomic_load_explicit(&cq->tail, memory_order_relaxed);
		sv_prefetchw(&shm_cq_ring(seg, cq)[p % cq->size]);
	}
}

int sv_post_send(struct ibv_qp *ib, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct sv_qp *qp = sv_qp(ib);
	enum ibv_qp_state st = atomic_load_explicit(&qp->sh->state, memory_order_relaxed);
	const char *why = NULL;
	int ret = 0;

	if (!qp->sq) {
		*bad = wr;
		return sv_fail(EINVAL, "ibv_post_send", "qpn 0x%x has no send queue (an XRC_RECV "
			       "QP, or a raw packet QP with RSS)", ib->qp_num);
	}
	/* C10-30: the send queue accepts work from RTS on (and in SQD and
	 * ERR, where it is held or flushed). */
	if (st < IBV_QPS_RTS) {
		*bad = wr;
		return sv_fail(EINVAL, "ibv_post_send", "qpn 0x%x is in %s; post_send needs RTS",
			       ib->qp_num, sv_qp_state_name(st));
	}
	pthread_mutex_lock(&qp->sq_lock);
	prefetch_receiver(qp, wr);
	for (; wr; wr = wr->next) {
		ret = check_wr(qp, wr, &why);
		if (!ret && qp->sq_count - qp->sq_hidden >= qp->cap.max_send_wr) {
			ret = ENOMEM;
			why = "the send queue is full (max_send_wr outstanding)";
		}
		if (ret) {
			*bad = wr;
			sv_fail(ret, "ibv_post_send", "qpn 0x%x wr_id 0x%llx: %s", ib->qp_num,
				(unsigned long long)wr->wr_id, why);
			break;
		}
		queue_wr(qp, wr);
	}
	/* Run what was queued (also the WRs before a bad one) in the same
	 * hold of the lock: one lock round trip per post. */
	sv_sq_post_unlock(qp);
	return ret;
}

/* ---- execution ---- */

/* A CMA failure that is no fault of the request. */
enum sv_result sv_copy_failed(int err, int32_t pid)
{
	if (err == ESRCH)
		return SV_R_NO_RESPONSE;
	if (err == EPERM)
		snprintf(sv_last_why, sizeof(sv_last_why), "the kernel refused process_vm_writev/readv "
			 "into pid %d (ptrace restrictions: kernel.yama.ptrace_scope >= 2, or "
			 "seccomp)", (int)pid);
	return SV_R_NAK_OP;
}

/* The local side of a WQE: lkeys in this context, in the QP's PD. */
enum sv_result sv_wqe_local_iov(struct sv_qp *qp, struct sv_swqe *w, bool write,
				struct iovec *iov, int *n, uint64_t *len)
{
	*n = 0;
	*len = 0;
	if (w->inline_len || !w->num_sge) {
		if (w->inline_len) {
			iov[0].iov_base = sv_swqe_inline(qp, w);
			iov[0].iov_len = w->inline_len;
			*n = 1;
			*len = w->inline_len;
		}
		return SV_R_OK;
	}
	/* The lkeys are checked against the context's shared MR table (its
	 * own, or its home's), which holds everything the check needs: no
	 * lock, no lookup. */
	const struct shm_hdr *own = sv_keys(qp->ctx);
	for (uint32_t i = 0; i < w->num_sge; i++) {
		const struct ibv_sge *s = &w->sge[i];
		if (!s->length)
			continue;
		uint32_t idx = s->lkey >> 8;
		const struct shm_mr *mr = idx && idx < own->n_mrs ? &shm_mrs(own)[idx] : NULL;
		/* Pairs with the release store of the key in mr_publish(). */
		if (mr && (atomic_load_explicit(&mr->key, memory_order_acquire) != s->lkey ||
			   mr->kind != SHM_KIND_MR))
			mr = NULL;
		/* IBA 10.6.3.1: the lkey must name an MR of the QP's PD
		 * covering the SGE, writable when the HCA writes into it. */
		if (!mr || mr->pd != qp->sh->pd || s->addr < mr->iova || s->length > mr->length ||
		    s->addr - mr->iova > mr->length - s->length ||
		    (write && !(mr->access & IBV_ACCESS_LOCAL_WRITE))) {
			snprintf(sv_last_why, sizeof(sv_last_why), "lkey 0x%x %s [0x%llx, +%u)", s->lkey,
				 !mr ? "is not registered, so it cannot cover" :
				 mr->pd != qp->sh->pd ? "is in another PD than the QP, for" :
				 write && !(mr->access & IBV_ACCESS_LOCAL_WRITE) ?
				 "lacks IBV_ACCESS_LOCAL_WRITE, needed to write" : "does not cover",
				 (unsigned long long)s->addr, s->length);
			return SV_R_LOC_PROT;
		}
		iov[*n].iov_base = (void *)(uintptr_t)(mr->addr + (s->addr - mr->iova));
		iov[*n].iov_len = s->length;
		(*n)++;
		*len += s->length;
	}
	return SV_R_OK;
}

void sv_ipv4_csum(uint8_t *ip)
{
	uint32_t sum = 0;

	ip[10] = ip[11] = 0;
	for (int i = 0; i < 20; i += 2)
		sum += (uint32_t)(ip[i] << 8 | ip[i + 1]);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	ip[10] = (uint8_t)(~sum >> 8);
	ip[11] = (uint8_t)~sum;
}

/* The 40 bytes that precede a UD message in the receive buffer: a GRH
 * (IBA 8.3); in RoCE mode what a RoCEv2 HCA writes there, the packet's IP
 * header (A17.4.5.1): for an IPv4-mapped GID the IPv4 header in the last
 * 20 bytes, else the IPv6 header (next header UDP), as the same message
 * sent to another host would arrive (engine/pkt_resp.c). */
static void build_grh(struct sv_qp *qp, const struct ibv_ah_attr *av, uint32_t len, uint8_t *g)
{
	union ibv_gid sgid = { 0 };
	/* UDP, BTH, DETH, payload, pad and ICRC: what follows the IP header. */
	uint32_t udp = 8 + 12 + 8 + len + (-len & 3) + 4;
	bool roce = sv_config()->link == SV_LINK_ROCE;

	memset(g, 0, 40);
	if (!av->is_global)
		return;
	sv_gid_entry(qp->ctx->dev, av->grh.sgid_index, &sgid, NULL);
	const uint8_t *d = av->grh.dgid.raw;
	bool v4 = !memcmp(d, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12);
	if (v4) {
		uint8_t *ip = g + 20;
		uint16_t tot = (uint16_t)(20 + udp);
		ip[0] = 0x45;
		ip[1] = av->grh.traffic_class;
		ip[2] = (uint8_t)(tot >> 8);
		ip[3] = (uint8_t)tot;
		ip[6] = 0x40;	/* DF, as sent */
		ip[8] = av->grh.hop_limit ? av->grh.hop_limit : 64;
		ip[9] = 17;	/* UDP */
		memcpy(ip + 12, &sgid.raw[12], 4);
		memcpy(ip + 16, &d[12], 4);
		sv_ipv4_csum(ip);
		return;
	}
	struct ibv_grh *h = (struct ibv_grh *)g;
	h->version_tclass_flow = htonl(6u << 28 | (uint32_t)av->grh.traffic_class << 20 |
				       (av->grh.flow_label & 0xfffff));
	if (roce) {
		h->paylen = htons((uint16_t)udp);
		h->next_hdr = 17;	/* UDP */
		h->hop_limit = av->grh.hop_limit ? av->grh.hop_limit : 64;
	} else {
		h->paylen = htons((uint16_t)(len + 12 + 8 + 4));
		h->next_hdr = 0x1b;
		h->hop_limit = av->grh.hop_limit;
	}
	h->sgid = sgid;
	memcpy(&h->dgid, d, 16);
}

/*
 * A small message into another process's private memory is left for the
 * receiver to place when it polls (transport/shm/defer.c): no system
 * call.  Not for UD (its GRH and lossy delivery gain nothing), not for
 * SEND_WITH_INV (its invalidation may still fail the message), not into
 * ODP memory (the receiver's memcpy would fault where the kernel's copy
 * fails cleanly), not into an imported context's memory (its poller is
 * not the memory's process), and not when a copy path is forced.
 * Returns the completion's `defer`, or 0.
 */
static uint8_t defer(struct sv_qp *qp, struct sv_target *t, const struct shm_rwqe *rw,
		     struct shm_mr *const *held, unsigned flags, const struct iovec *src, int ns,
		     const struct iovec *riov, uint64_t len)
{
	/* The transport's defer_put checks the size and the SGE count. */
	if (qp->ex.qp_base.qp_type == IBV_QPT_UD || (flags & F_INV) || t->pid == sv_pid() ||
	    t->mseg != t->seg || sv_config()->copy != SV_COPY_AUTO)
		return 0;
	for (uint32_t i = 0; i < rw->num_sge; i++)
		if (held[i] && (held[i]->access & IBV_ACCESS_ON_DEMAND))
			return 0;
	return t->tp->defer_put(t->seg, t->own, src, ns, riov, (int)rw->num_sge, len);
}

enum sv_result sv_deliver_wqe(struct sv_qp *qp, const struct sv_swqe *w, struct sv_target *t,
			      const struct shm_rwqe *rw, const struct iovec *msg, int nmsg,
			      uint64_t len, bool data, struct shm_cqe *e)
{
	struct iovec riov[SV_MAX_SGE], src[SV_MAX_SGE + 2];
	struct shm_mr *held[SV_MAX_SGE];
	bool ud = qp->ex.qp_base.qp_type == IBV_QPT_UD;
	uint8_t grh[40];
	uint64_t cap;
	enum sv_result r = sv_resp_recv_iov(t, rw, riov, &cap, held);

	if (r != SV_R_OK) {
		/* A receiver tearing down (its QP destroyed, then its MRs)
		 * drops the message as hardware would drop a packet for a QP
		 * that is gone; the requester retries and times out. */
		if (sv_resp_gone(t))
			return SV_R_NO_RESPONSE;
		/* The receiver's own buffer is bad: its local protection error,
		 * and a Remote Operational Error NAK (9.7.5.2.8). */
		sv_resp_fail(t, rw, IBV_WC_LOC_PROT_ERR, -1);
		return r;
	}
	uint64_t need = data ? len + (ud ? 40 : 0) : 0;
	if (need > cap) {
		/* IBA 9.7.4.1.7: a message longer than the receive
		 * buffer is a local length error at the responder and an
		 * Invalid Request NAK for the requester. */
		sv_resp_recv_put(t, rw, held);
		sv_resp_fail(t, rw, IBV_WC_LOC_LEN_ERR, -1);
		snprintf(sv_last_why, sizeof(sv_last_why), "the message is %llu bytes but receive wr_id "
			 "0x%llx of qpn 0x%x holds %llu", (unsigned long long)need,
			 (unsigned long long)rw->wr_id, t->qp->qpn, (unsigned long long)cap);
		return SV_R_NAK_INV_REQ;
	}
	int ns = 0;
	if (data && ud) {
		build_grh(qp, &w->av, (uint32_t)len, grh);
		src[ns].iov_base = grh;
		src[ns++].iov_len = 40;
	}
	for (int i = 0; data && i < nmsg; i++)
		src[ns++] = msg[i];
	int err = 0;
	unsigned flags = w ? wr_info[w->opcode].flags : 0;
	if (need && (t->mapped || !(e->defer = defer(qp, t, rw, held, flags, src, ns, riov, need))))
		err = sv_target_move(t, true, src, ns, riov, (int)rw->num_sge);
	if (need)
		qp->defer_last = e->defer != 0;
	sv_resp_recv_put(t, rw, held);
	if (err && sv_resp_gone(t))
		return SV_R_NO_RESPONSE;
	if (err) {
		sv_resp_fail(t, rw, IBV_WC_LOC_PROT_ERR, -1);
		return sv_copy_failed(err, t->pid);
	}
	/* SEND_WITH_INV: the responder invalidates the rkey as it completes
	 * the message.  A key it may not invalidate fails the request with
	 * an Invalid Request NAK and the receive WQE with REM_INV_REQ_ERR
	 * (rxe_resp.c, RESPST_ERR_INVALIDATE_RKEY, "Class J"). */
	if ((flags & F_INV) && sv_resp_invalidate(t, w->imm)) {
		memcpy(sv_last_why, t->why, sizeof(sv_last_why));
		sv_resp_fail(t, rw, IBV_WC_REM_INV_REQ_ERR, -1);
		return SV_R_NAK_INV_REQ;
	}
	e->wr_id = rw->wr_id;
	e->byte_len = (uint32_t)(data ? need : len);
	e->qp_num = t->wq_num ? t->wq_num : t->qp->qpn;
	if (!e->src_qp)
		e->src_qp = qp->ex.qp_base.qp_num;
	e->slid = qp->slid;
	if (w) {
		e->sl = w->av.sl;
		e->solicited = !!(w->send_flags & IBV_SEND_SOLICITED);
	}
	if (flags & (F_IMM | F_INV)) {
		e->imm = w->imm;	/* imm_data, or invalidated_rkey */
		e->wc_flags |= (flags & F_INV) ? IBV_WC_WITH_INV : IBV_WC_WITH_IMM;
	}
	if (ud && w->av.is_global)
		e->wc_flags |= IBV_WC_GRH;
	/* An overrun CQ drops the completion, not the data. */
	if (!sv_cq_push(t->seg, shm_at(t->seg, t->rcq_off), e) && e->defer)
		t->tp->defer_place(t->seg, t->own, e->defer);
	return SV_R_OK;
}

enum sv_result sv_deliver_recv(struct sv_qp *qp, struct sv_swqe *w, struct sv_target *t,
			       const struct iovec *liov, int nl, uint64_t len, bool data)
{
	union { struct shm_rwqe w; char buf[sizeof(struct shm_rwqe) + SV_MAX_SGE * sizeof(struct ibv_sge)]; } rw;
	struct shm_cqe e = { .opcode = data ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM };

	/* A tag-matching SRQ looks at every message it receives. */
	if (data && t->rx->srq_off) {
		struct shm_wq *wq = shm_at(t->seg, t->wq_off);
		if (wq->tm_tags)
			return sv_tm_deliver(qp, w, t, wq, liov, nl, len);
	}
	enum sv_result r = sv_resp_take_recv(t, &rw.w);
	if (r != SV_R_OK)
		return r;
	return sv_deliver_wqe(qp, w, t, &rw.w, liov, nl, len, data, &e);
}

/* IBA 9.4.5: atomics act on naturally aligned 8-byte words. */
static bool misaligned(const struct sv_swqe *w)
{
	if (!(w->remote_addr & 7))
		return false;
	snprintf(sv_last_why, sizeof(sv_last_why), "remote_addr 0x%llx is not 8-byte aligned",
		 (unsigned long long)w->remote_addr);
	return true;
}

/* An atomic on another process's private memory, by that process's own
 * thread when it is polling for work (transport/shm/assist.c): a line each
 * way instead of two system calls.  Not through a window, nor on ODP
 * memory (the thread's CPU atomic would fault where a copy fails), nor
 * when a copy path is forced. */
static bool helper_atomic(const struct sv_swqe *w, const struct sv_target *t,
			  const struct shm_mr *mr, void *addr, uint64_t *old)
{
	const struct sv_config *c = sv_config();

	if (t->pid == sv_pid() || mr->kind != SHM_KIND_MR || (mr->access & IBV_ACCESS_ON_DEMAND) ||
	    mr->mem != SHM_MEM_HOST || c->copy != SV_COPY_AUTO || c->assist == SV_ASSIST_OFF)
		return false;
	return t->tp->atomic(t->mseg, w->opcode, addr, w->compare_add, w->swap, old);
}

static enum sv_result do_atomic(struct sv_swqe *w, struct sv_target *t, struct iovec *liov,
				uint64_t len)
{
	struct shm_mr *mr;
	void *addr;
	uint64_t old, new;

	if (len != 8)
		return SV_R_LOC_LEN;
	if (misaligned(w))
		return SV_R_NAK_INV_REQ;
	enum sv_result r = sv_resp_mr_get(t, w->rkey, w->remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC,
					  &mr, &addr);
	if (r != SV_R_OK) {
		memcpy(sv_last_why, t->why, sizeof(sv_last_why));
		return r;
	}
	struct iovec rv = { addr, 8 }, ov = { &old, 8 }, nv = { &new, 8 };
	/* IBV_ATOMIC_HCA: atomic against every other softverbs atomic on
	 * this target, which all take this lock.  On GPU memory that is all
	 * it is atomic against: the two cuMemcpy calls are no atomic of the
	 * GPU's, and a kernel writing the word meanwhile can be lost. */
	sv_shm_lock(&t->mseg->atomic_lock);
	int err = 0;
	bool done = false;
	if (t->mapped || !(done = helper_atomic(w, t, mr, addr, &old)))
		err = sv_target_move(t, false, &ov, 1, &rv, 1);
	if (!err && !done) {
		if (w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
			new = old + w->compare_add;
		else
			new = old == w->compare_add ? w->swap : old;
		if (new != old)
			err = sv_target_move(t, true, &nv, 1, &rv, 1);
	}
	sv_shm_unlock(&t->mseg->atomic_lock);
	sv_resp_mr_put(t->mseg, mr);
	if (err)
		return sv_copy_failed(err, t->pid);
	/* The original value lands in the local buffer, which may be GPU
	 * memory. */
	return sv_copy_iov(liov, 1, &ov, 1) ? SV_R_LOC_PROT : SV_R_OK;
}

/* C10-15: a UD message is received only with the receiver's Q_Key; a
 * Q_Key with its high bit set means the sending QP's own. */
static bool qkey_ok(struct sv_qp *qp, const struct sv_swqe *w, const struct sv_target *t)
{
	uint32_t qkey = w->remote_qkey & 0x80000000u ? qp->attr.qkey : w->remote_qkey;

	return qkey == atomic_load_explicit(&t->qp->qkey, memory_order_relaxed);
}

/* IBA 10.5.2: a UD send to the multicast QPN reaches every QP attached
 * to the group but the sender (by GID when the address vector has a
 * GRH, else by LID).  As for any UD message, a member without a receive
 * WQE or with another Q_Key simply does not get it, and the send itself
 * succeeds. */
static enum sv_result send_mcast(struct sv_qp *qp, struct sv_swqe *w, struct iovec *liov, int nl,
				 uint64_t len)
{
	uint32_t members[SV_MAX_MCAST_QP_ATTACH];
	int n = sv_reg_mcast_members(&w->av.grh.dgid, w->av.dlid, w->av.is_global, members,
				     (int)SV_ARRAY_SIZE(members));

	for (int i = 0; i < n; i++) {
		struct sv_target t;
		if (members[i] == qp->ex.qp_base.qp_num || sv_resp_find(qp, members[i], &t) != SV_R_OK ||
		    !qkey_ok(qp, w, &t))
			continue;
		sv_deliver_recv(qp, w, &t, liov, nl, len, true);
	}
	/* Members on other hosts: one packet to the group's IPv4 address,
	 * which the network replicates; the link keeps it from coming back
	 * to this host, whose members have their copies. */
	if (qp->pq && w->av.is_global && sv_gid_v4(w->av.grh.dgid.raw))
		sv_pkt_ud_send(qp, w, liov, nl, len);
	return SV_R_OK;
}

/* BIND_MW and LOCAL_INV act on this context's own key table; their
 * failures are the requester's (rxe_do_local_ops). */
enum sv_result sv_wqe_exec_local(struct sv_qp *qp, struct sv_swqe *w)
{
	if (w->opcode == IBV_WR_BIND_MW)
		return sv_mw_exec_bind(qp, w->mw, w->rkey, &w->bind, sv_last_why, sizeof(sv_last_why)) ?
		       SV_R_MW_BIND : SV_R_OK;
	return sv_mw_exec_local_inv(qp, w->imm, sv_last_why, sizeof(sv_last_why)) ?
	       SV_R_LOC_QP_OP : SV_R_OK;
}

/* One 8-byte store that no other softverbs atomic on the target can
 * interleave with: the lock atomics take, and a single aligned store. */
static int store_word(struct sv_target *t, void *addr, const struct iovec *l)
{
	uint64_t v;
	struct iovec vv = { &v, 8 }, rv = { addr, 8 };
	int err = sv_copy_iov(&vv, 1, l, 1);	/* the local word may be GPU memory */

	if (err)
		return err;
	sv_shm_lock(&t->mseg->atomic_lock);
	/* GPU memory is written by cuMemcpy, which the lock orders against
	 * the other softverbs atomics only. */
	if (t->mapped && !sv_gpu_dev_iov(&rv, 1))
		__atomic_store_n((uint64_t *)addr, v, __ATOMIC_RELEASE);
	else
		err = sv_target_move(t, true, &vv, 1, &rv, 1);
	sv_shm_unlock(&t->mseg->atomic_lock);
	return err;
}

static enum sv_result execute_remote(struct sv_qp *qp, struct sv_swqe *w, struct iovec *liov,
				     int nl, uint64_t len)
{
	const struct wr_info *wi = &wr_info[w->opcode];
	enum ibv_qp_type type = qp->ex.qp_base.qp_type;
	struct sv_target t;
	enum sv_result r;

	/* A UD message fits one MTU (IBA 9.8.2). */
	if (type == IBV_QPT_UD && len > (128u << sv_port_mtu(qp->ctx->dev)))
		return SV_R_LOC_LEN;

	if (type == IBV_QPT_RAW_PACKET)
		return sv_raw_send(qp, w, liov, nl, len);
	if (type == IBV_QPT_UD && w->remote_qpn == SV_MCAST_QPN)
		return send_mcast(qp, w, liov, nl, len);
	if (type == IBV_QPT_UD && qp->pq) {
		struct sv_route rt;
		const char *why = NULL;
		if (sv_route_remote(qp->ctx->dev, &w->av, &rt, &why))
			return sv_pkt_ud_send(qp, w, liov, nl, len);
		if (why) {
			snprintf(sv_last_why, sizeof(sv_last_why), "%s", why);
			return SV_R_DROPPED;
		}
	}
	uint32_t qpn = type == IBV_QPT_UD ? w->remote_qpn : qp->attr.dest_qp_num;
	t.why[0] = 0;
	r = sv_resp_find(qp, qpn, &t);
	if (r != SV_R_OK) {
		if (t.why[0])
			memcpy(sv_last_why, t.why, sizeof(sv_last_why));
		else
			snprintf(sv_last_why, sizeof(sv_last_why), "no QP 0x%x is receiving (destroyed, "
				 "not in RTR/RTS, or its process is gone)", qpn);
		return r;
	}
	if (type == IBV_QPT_XRC_SEND && (r = sv_resp_xrc(&t, w->srqn)) != SV_R_OK) {
		memcpy(sv_last_why, t.why, sizeof(sv_last_why));
		return r;
	}
	if (type == IBV_QPT_UD && !qkey_ok(qp, w, &t))
		return SV_R_DROPPED;

	if (wi->flags & F_SEND)
		return sv_deliver_recv(qp, w, &t, liov, nl, len, true);
	if (wi->flags & F_ATOMIC)
		return do_atomic(w, &t, liov, len);

	if ((wi->flags & F_WORD) && (len != 8 || nl != 1))
		return SV_R_LOC_LEN;
	if ((wi->flags & F_WORD) && misaligned(w))
		return SV_R_NAK_INV_REQ;
	struct shm_mr *mr;
	void *addr;
	unsigned access = wi->flags & F_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	r = sv_resp_mr_get(&t, w->rkey, w->remote_addr, len, access, &mr, &addr);
	if (r != SV_R_OK) {
		memcpy(sv_last_why, t.why, sizeof(sv_last_why));
		return sv_resp_gone(&t) ? SV_R_NO_RESPONSE : r;
	}
	struct iovec rv = { addr, len };
	bool read = wi->flags & F_READ;
	int err = 0;
	if (wi->flags & F_WORD)
		err = store_word(&t, addr, &liov[0]);
	else if (len)
		err = sv_target_move(&t, !read, liov, nl, &rv, 1);
	if (!err && (wi->flags & F_RECV)) {
		/* WRITE_WITH_IMM also consumes a receive WQE, once its data has
		 * landed, so that the completion never runs ahead of the data.
		 * Without a WQE it is an RNR NAK, and the retry writes again,
		 * as a retransmission would. */
		struct iovec none;
		r = sv_deliver_recv(qp, w, &t, &none, 0, len, false);
	}
	sv_resp_mr_put(t.mseg, mr);
	if (err)
		return sv_resp_gone(&t) ? SV_R_NO_RESPONSE : sv_copy_failed(err, t.pid);
	return r;
}

/*
 * A context imported from another process uses the home's MRs, whose
 * bytes are in the home process: the WQE's local side moves through a
 * buffer here, filled before the operation and, for a READ or atomic,
 * emptied into the home's memory after it (as any peer's copy would,
 * CMA or the home's bounce path).
 */
struct stage {
	void *buf;
	struct iovec home[SV_MAX_SGE];
	int n;
	uint64_t len;
};

static enum sv_result stage_in(struct sv_qp *qp, const struct sv_swqe *w, bool write,
			       struct iovec *liov, int *nl, uint64_t len, struct stage *st)
{
	struct shm_hdr *home = qp->ctx->home;

	st->buf = NULL;
	if (!home || w->inline_len || !*nl)
		return SV_R_OK;
	st->buf = malloc(len);
	if (!st->buf) {
		snprintf(sv_last_why, sizeof(sv_last_why), "no memory to stage %llu bytes of pid "
			 "%d's MR", (unsigned long long)len, (int)home->pid);
		return SV_R_LOC_QP_OP;
	}
	memcpy(st->home, liov, (size_t)*nl * sizeof(*liov));
	st->n = *nl;
	st->len = len;
	struct iovec b = { st->buf, len };
	int err = write ? 0 : qp->ctx->tp_mem->move(home, qp->ctx->seg.h, false, false, &b, 1,
						    st->home, st->n);
	if (err) {
		free(st->buf);
		st->buf = NULL;
		snprintf(sv_last_why, sizeof(sv_last_why), "cannot read the imported MR's memory in "
			 "pid %d: %s", (int)home->pid, sv_errno_name(err));
		return SV_R_LOC_PROT;
	}
	liov[0] = b;
	*nl = 1;
	return SV_R_OK;
}

static enum sv_result stage_out(struct sv_qp *qp, bool write, struct stage *st, enum sv_result r)
{
	if (!st->buf)
		return r;
	struct iovec b = { st->buf, st->len };
	int err = write && r == SV_R_OK ?
		  qp->ctx->tp_mem->move(qp->ctx->home, qp->ctx->seg.h, true, false, &b, 1, st->home,
					st->n) : 0;
	free(st->buf);
	if (!err)
		return r;
	snprintf(sv_last_why, sizeof(sv_last_why), "cannot write the imported MR's memory in pid "
		 "%d: %s", (int)qp->ctx->home->pid, sv_errno_name(err));
	return SV_R_LOC_PROT;
}

static enum sv_result execute(struct sv_qp *qp, struct sv_swqe *w)
{
	const struct wr_info *wi = &wr_info[w->opcode];
	bool write = (wi->flags & (F_READ | F_ATOMIC)) != 0;
	struct iovec liov[SV_MAX_SGE + 1];
	struct stage st;
	uint64_t len;
	int nl;

	sv_last_why[0] = 0;
	if (wi->flags & F_LOCAL)
		return sv_wqe_exec_local(qp, w);
	enum sv_result r = sv_wqe_local_iov(qp, w, write, liov, &nl, &len);
	if (r != SV_R_OK)
		return r;
	if (len > SV_MAX_MSG_SZ)
		return SV_R_LOC_LEN;
	r = stage_in(qp, w, write, liov, &nl, len, &st);
	if (r != SV_R_OK)
		return r;
	return stage_out(qp, write, &st, execute_remote(qp, w, liov, nl, len));
}

/* The responder-side consequence of a NAK the requester received. */
static void responder_error(struct sv_qp *qp, struct sv_swqe *w, enum sv_result r)
{
	struct sv_target t;

	if (!reliable(qp->ex.qp_base.qp_type) || sv_resp_find(qp, qp->attr.dest_qp_num, &t))
		return;
	/* IBA 11.6.3.1: the responder's QP goes to ERR with an affiliated
	 * event: access violations and invalid requests. */
	if (r == SV_R_NAK_ACCESS)
		sv_resp_fail(&t, NULL, IBV_WC_SUCCESS, IBV_EVENT_QP_ACCESS_ERR);
	else if (r == SV_R_NAK_INV_REQ && (wr_info[w->opcode].flags & (F_ATOMIC | F_WORD)))
		sv_resp_fail(&t, NULL, IBV_WC_SUCCESS, IBV_EVENT_QP_REQ_ERR);
}

/* Returns false when the CQ overran. */
bool sv_wqe_complete(struct sv_qp *qp, struct sv_swqe *w, enum ibv_wc_status status,
		     uint64_t len)
{
	if (status == IBV_WC_SUCCESS && !(w->send_flags & IBV_SEND_SIGNALED) && !qp->sq_sig_all)
		return true;
	/* An error completion takes the QP to ERR (C10-?, 10.8.3.3).  The
	 * caller applies it after the queue's lock; it is marked before the
	 * completion is seen, so that a thread that polls this completion
	 * and then queries the QP finds ERR (ibv_query_qp applies what is
	 * marked), whichever thread ran the queue. */
	if (status != IBV_WC_SUCCESS &&
	    atomic_load_explicit(&qp->sh->state, memory_order_relaxed) != IBV_QPS_ERR)
		sv_qp_mark_err(qp, 1);
	struct shm_cqe e = {
		.wr_id = w->wr_id, .status = status, .opcode = wr_info[w->opcode].wc,
		.qp_num = qp->ex.qp_base.qp_num, .byte_len = (uint32_t)len,
	};
	if (sv_cq_push(qp->ctx->seg.h, qp->scq->sh, &e))
		return true;
	sv_warn("qpn 0x%x: send CQ overrun, completion of wr_id 0x%llx lost",
		qp->ex.qp_base.qp_num, (unsigned long long)w->wr_id);
	return false;
}

uint64_t sv_wqe_len(const struct sv_swqe *w)
{
	uint64_t len = w->inline_len;

	for (uint32_t i = 0; i < w->num_sge; i++)
		len += w->sge[i].length;
	return len;
}

/* Executes the send queue from its head; the caller holds sq_lock. */
static int sq_run(struct sv_qp *qp)
{
	bool failed = false, overrun = false;

	while (qp->sq_count && !failed) {
		enum ibv_qp_state st = atomic_load_explicit(&qp->sh->state, memory_order_relaxed);
		struct sv_swqe *w = sv_sq_slot(qp, qp->sq_head);

		if (st == IBV_QPS_ERR) {
			failed = true;	/* flushed below, by sv_qp_to_err */
			break;
		}
		if (st != IBV_QPS_RTS)
			break;	/* SQD: held until RTS */
		if (atomic_load_explicit(&qp->rnr_waiting, memory_order_relaxed) && sv_now_ns() < w->rnr_deadline)
			break;
		atomic_store_explicit(&qp->rnr_waiting, false, memory_order_relaxed);
		enum sv_result r = execute(qp, w);
		enum ibv_qp_type type = qp->ex.qp_base.qp_type;

		if (!reliable(type) && (r == SV_R_RNR || r == SV_R_NO_RESPONSE ||
					   r == SV_R_NAK_ACCESS || r == SV_R_NAK_INV_REQ ||
					   r == SV_R_NAK_OP))
			r = SV_R_DROPPED;	/* UC and UD have no responses */
		if (r == SV_R_RNR || r == SV_R_NO_RESPONSE) {
			/* C9-140/C9-141: retry after the responder's RNR
			 * timer, or after the ACK timeout, while counts last
			 * (rnr_retry 7 = forever; timeout 0 = forever). */
			bool rnr = r == SV_R_RNR;
			int *left = rnr ? &w->rnr_left : &w->retry_left;
			if (*left == 0) {
				r = rnr ? SV_R_RNR_EXHAUSTED : SV_R_NO_RESPONSE;
				if (rnr)
					snprintf(sv_last_why, sizeof(sv_last_why), "qpn 0x%x had no receive "
						 "posted through rnr_retry=%u retries (post receives "
						 "before the peer sends, or raise rnr_retry; 7 = "
						 "forever)", qp->attr.dest_qp_num, qp->attr.rnr_retry);
			} else {
				if (*left > 0)
					(*left)--;
				struct sv_target t;
				unsigned code = 0;
				if (rnr && !sv_resp_find(qp, qp->attr.dest_qp_num, &t))
					code = t.qp->min_rnr_timer;
				w->rnr_deadline = sv_now_ns() + (rnr ? sv_rnr_delay_ns(code) :
							 qp->attr.timeout ? sv_ack_timeout_ns(qp->attr.timeout) :
							 UINT64_MAX / 2);
				atomic_store_explicit(&qp->rnr_waiting, true, memory_order_relaxed);
				sv_seg_ring(qp->ctx->seg.h);	/* the progress thread sets its timer */
				break;
			}
		}
		enum ibv_wc_status status = sv_result_status(r);
		if (status != IBV_WC_SUCCESS) {
			sv_explain("error completion", "qpn 0x%x wr_id 0x%llx %s to qpn 0x%x: %s (%s)%s%s",
				qp->ex.qp_base.qp_num, (unsigned long long)w->wr_id,
				wr_info[w->opcode].name, qp->attr.dest_qp_num, sv_wc_status_name(status),
				sv_result_name(r), sv_last_why[0] ? ": " : "", sv_last_why);
			responder_error(qp, w, r);
			failed = true;
		}
		if (!sv_wqe_complete(qp, w, status, sv_wqe_len(w)))
			failed = overrun = true;
		if (qp->fin_n)
			sv_tm_send_fins(qp);
		qp->sq_head = (qp->sq_head + 1) % qp->sq_size;
		qp->sq_count--;
	}
	return overrun ? SV_RUN_OVERRUN : failed ? SV_RUN_FAILED : SV_RUN_OK;
}

static void run_unlock(struct sv_qp *qp, bool post)
{
	int run = qp->pq && qp->pq_remote ? sv_pkt_sq_run(qp, post) : sq_run(qp);

	pthread_mutex_unlock(&qp->sq_lock);
	/* IBA 11.6.3.1: a completion the CQ cannot take is a catastrophic
	 * error of the QP too (as well as the CQ's CQ_ERR). */
	if (run == SV_RUN_OVERRUN)
		sv_qp_to_err(qp, IBV_EVENT_QP_FATAL);
	/* IBA 10.8.3.3: an error completion takes the QP to ERR, and
	 * every WQE behind it is flushed. */
	else if (run == SV_RUN_FAILED)
		sv_qp_to_err(qp, -1);
}

void sv_sq_run_unlock(struct sv_qp *qp)
{
	run_unlock(qp, false);
}

void sv_sq_post_unlock(struct sv_qp *qp)
{
	run_unlock(qp, true);
}

void sv_sq_progress(struct sv_qp *qp)
{
	pthread_mutex_lock(&qp->sq_lock);
	sv_sq_run_unlock(qp);
}

void sv_sq_flush(struct sv_qp *qp)
{
	pthread_mutex_lock(&qp->sq_lock);
	while (qp->sq_count) {
		struct sv_swqe *w = sv_sq_slot(qp, qp->sq_head);
		/* IBA 10.3.1.7: flushed WQEs complete even when unsignaled. */
		struct shm_cqe e = { .wr_id = w->wr_id, .status = IBV_WC_WR_FLUSH_ERR,
				     .opcode = wr_info[w->opcode].wc,
				     .qp_num = qp->ex.qp_base.qp_num };
		if (!w->hidden) {
			sv_cq_push(qp->ctx->seg.h, qp->scq->sh, &e);
		} else {
			sv_pkt_hidden_done(qp, w, IBV_WC_WR_FLUSH_ERR);
			qp->sq_hidden--;
		}
		qp->sq_head = (qp->sq_head + 1) % qp->sq_size;
		qp->sq_count--;
	}
	atomic_store_explicit(&qp->rnr_waiting, false, memory_order_relaxed);
	if (qp->pq)
		sv_pkt_sq_reset(qp);
	pthread_mutex_unlock(&qp->sq_lock);
}
