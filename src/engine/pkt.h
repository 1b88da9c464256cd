/* SPDX-License-Identifier: MIT */
/*
 * The packet engine's state: what a context and a QP keep to talk IBA
 * packets with other hosts.  Private to engine/pkt*.c.
 */
#ifndef SV_PKT_H
#define SV_PKT_H

#include "engine.h"
#include "ibhdr.h"

/* Bytes in flight per QP, and how often a long message asks for an
 * ACK: the window must fit the peer's socket buffer (4 MiB asked for,
 * transport/udp), where a packet takes its size plus about 1 KiB of
 * kernel overhead. */
#define PKT_WINDOW_BYTES	(1u << 20)
#define PKT_WINDOW_MAX		512u
#define PKT_ACKREQ_EVERY	64u
/* The least window a loss leaves (pkt_req.c, loss_seen), in packets:
 * RFC 5681's is 2; across a veth losing 5% each way, 4 moved a transfer
 * fastest, and a window of 2 stalls more often on its lost ACKs. */
#define PKT_CWND_MIN		4u
/* The tail-loss probe's least wait, however short the round trip, and
 * how many probes go before the ACK timeout.  A CQ poller may hold an
 * ACK up to 2 ms (sv_pkt_rx_unlock_poller); a probe sent meanwhile costs
 * a packet, which the peer's thread answers with the ACK at once, or
 * within 200 us where its application polled a moment ago.  3 ms
 * made a faulted transfer 20% (WRITE) and 40% (READ) slower than 1 ms. */
#define PKT_PTO_MIN_NS		1000000u
#define PKT_TLP_MAX		3u
/* A post while at least PKT_CORK_INFLIGHT messages of its QP are sent
 * and not acknowledged sends nothing until what waits makes
 * PKT_CORK_PKTS packets: the next ACK, which those messages bring (each
 * one's last packet asks for one), sends it all in one system call
 * (pkt_req.c, corked). */
#define PKT_CORK_INFLIGHT	16u
#define PKT_CORK_PKTS		16u
/* A READ is asked for in requests of at most this many response
 * packets, each its own request on the wire, so that no responder
 * bursts more than a window at its requester. */
#define PKT_READ_CHUNK		64u
/* READ ranges asked for again at once (pkt_req.c, read_lost); a hole
 * found when all are in use waits for the ACK timeout. */
#define PKT_REPAIRS		32u
/* Atomic results kept for duplicates (IBA 9.7.5.3.2: a responder
 * answers a repeated atomic from its record, never executing it twice):
 * one for each atomic a requester may have outstanding at it, as many
 * as max_dest_rd_atomic allows (rxe keeps that many resources).  Fewer
 * would leave a retried atomic, whose answer was lost while later ones
 * ran, with no answer at all: RETRY_EXC_ERR on a healthy connection. */
#define PKT_ATOMIC_RES		SV_MAX_QP_RD_ATOM
#define PKT_HASH		256u
#define PKT_HDR_MAX		64u

enum pkt_wqe_state { PW_NEW, PW_SENT, PW_DONE, PW_ERROR };

struct pkt_ctx;

struct pkt_qp {
	struct sv_qp *qp;
	struct pkt_ctx *pc;
	struct pkt_gpu_tx *gpu_tx;	/* GPU payload copied out for sending (pkt_gpu.c) */
	uint32_t qpn;
	struct pkt_qp *hnext;		/* pc->hash chain, under pc->rx_lock */
	int fd;				/* the sending socket */
	uint16_t sport;			/* its port: the QP's UDP source port */
	struct sv_route peer;		/* RC, UC, XRC: the destination */
	/* IB mode: the LID a message came from, for its completion's slid:
	 * the peer's (RC, UC, XRC), each datagram's sender's (UD). */
	uint16_t src_lid;
	uint32_t mtu;			/* path_mtu in bytes */
	uint32_t dest_qpn;
	uint8_t tr;			/* its opcodes' transport (IB_TR_*) */
	/* A destroyed RC QP lingers (qp NULL): it acknowledges its peer's
	 * retransmissions of what it already received, until linger_until. */
	bool dead;
	uint8_t tomb_acks;		/* its last ACK, sent again this many times more */
	uint64_t last_rx, linger_until, linger_ns, tomb_ack_at;

	/* ---- requester: under qp->sq_lock ---- */
	uint32_t npsn;			/* the next PSN a new WQE takes */
	uint32_t una;			/* the oldest PSN not acknowledged */
	uint32_t nassigned;		/* WQEs from sq_head that have PSNs */
	uint32_t tx_w, tx_pkt;		/* the next packet to send: WQE from sq_head, packet in it */
	uint32_t max_rd;		/* max_rd_atomic, at least 1 */
	int retry_left, rnr_left;	/* reset whenever the peer makes progress */
	uint64_t deadline;		/* retransmission timer, 0 when idle */
	uint64_t rnr_until;		/* an RNR NAK's wait, 0 when none */
	/* READ responses asked for again (pkt_req.c, read_lost): the
	 * PSNs [psn, end) not yet all in, the order of the request
	 * (seq), the first PSN not yet sent when it went (mark), and
	 * when it went. */
	struct pkt_repair {
		uint32_t psn, end, seq, mark;
		uint64_t sent;
		struct sv_swqe *w;
	} rep[PKT_REPAIRS];
	uint32_t nrep, rep_seq;
	uint32_t rd_seen;		/* the PSN after the last first-sent one answered */
	/* A WQE failed: none after it starts (they flush when it takes the
	 * QP to Error), as rxe's requester stops at its error. */
	bool halted;
	/* SQD with SQ_DRAINED asked for and messages still under way: the
	 * event goes when the last of them completes (complete_head). */
	bool drain_notify;
	bool probing;			/* after a timeout: only probe_psn goes until progress */
	bool tail_probe;		/* a tail-loss probe at probe_psn awaits its answer */
	bool tlp_armed;			/* the deadline is a tail-loss probe's, not a timeout */
	uint8_t tlps;			/* probes since the last progress */
	uint32_t probe_psn;
	/* Congestion (RFC 5681, in packets): a loss halves the window
	 * once per window of packets, a timeout takes it to PKT_CWND_MIN,
	 * from which it doubles each window back to ssthresh; past that,
	 * each window acknowledged adds a packet. */
	uint32_t cwnd;			/* 0: the whole window (PKT_WINDOW_BYTES) */
	uint32_t ssthresh;		/* slow start's end */
	uint32_t cwnd_acked;		/* acknowledged toward the next packet more */
	uint32_t snd_max;		/* the PSN after the highest sent */
	uint32_t recover;		/* losses before this PSN are the last cut's */
	bool recovering;
	/* The round trip (RFC 6298's smoothed estimate), timed on one
	 * packet at a time, never on one sent again (Karn). */
	bool rtt_timing;
	uint32_t rtt_psn;
	uint64_t rtt_sent, srtt;

	/* ---- responder: under pc->rx_lock ---- */
	uint32_t epsn;			/* the next PSN expected */
	uint32_t msn;
	bool nak_sent;			/* a sequence NAK for epsn is out */
	bool ack_due;
	bool ack_listed;		/* on pc->acks, whether or not an ACK is still due */
	uint32_t ack_psn;		/* the PSN the coalesced ACK acknowledges */
	bool acked;			/* this packet's ACK has left already */
	struct pkt_qp *ack_next;	/* pc->acks, this batch */
	uint32_t cur;			/* IBH_SEND or IBH_WRITE while a message is under way */
	bool have_wqe;
	/* Where the WQE's completion goes: its CQ's context and offset,
	 * and the QP or WQ number it reports (hold_wqe). */
	struct shm_hdr *held_seg;
	uint64_t held_cq;
	uint32_t held_qpn;
	union {
		struct shm_rwqe w;
		char buf[sizeof(struct shm_rwqe) + SV_MAX_SGE * sizeof(struct ibv_sge)];
	} rwqe;
	uint64_t off;			/* bytes of the message placed */
	/* A SEND into a tag-matching SRQ: its completion, decided at its
	 * first packet (engine/tm.c). */
	bool tm;
	struct sv_tm_recv tm_how;
	uint64_t wva;			/* WRITE: where the next byte goes */
	uint32_t wrkey;
	uint64_t wleft;			/* WRITE: bytes the RETH announced that are still to come */
	uint32_t srqn;			/* XRC: the SRQ of the message under way */
	struct pkt_atomic_res {
		uint32_t psn;
		bool valid;
		uint64_t orig;
	} ares[PKT_ATOMIC_RES];
	unsigned ares_next;
	/* Statistics (softverbs status, tests): relaxed counters, bumped by
	 * the requester and the responder alike, in the QP's block of the
	 * segment (core/stats.h); a tombstone's are its own. */
	struct sv_pkt_qp_stats *st, tomb_st;
};

struct pkt_gpu_rx;
struct pkt_gpu_tx;

struct pkt_ctx {
	struct sv_context *ctx;
	struct pkt_gpu_rx *gpu_rx;	/* GPU-bound payloads being gathered (pkt_gpu.c) */
	const struct sv_transport_ops *ops;	/* the context's tp_link */
	struct sv_link_ep *link;
	pthread_mutex_t rx_lock;	/* reception, the hash, the responders */
	pthread_mutex_t qps_lock;	/* `all`: the QPs whose timers run */
	struct pkt_qp *hash[PKT_HASH];
	struct pkt_qp *acks;		/* QPs owing an ACK at the end of this batch */
	/* A CQ poller's batch holds its ACKs back (sv_pkt_rx_unlock_poller):
	 * set under rx_lock; read without it by the requester, which sends
	 * them with its next packets when it can take rx_lock. */
	_Atomic bool acks_held;
	struct pkt_ctx *live_next;	/* every context's, under pkt.c's open_lock */
	struct pkt_qp **all;
	uint32_t nall, cap;
	/* The endpoint's counters, in the context's segment: drops of
	 * packets that reached no QP, or failed a check before one. */
	struct sv_pkt_ep_stats *st;
	/* QP1 (gsi.c): the socket MADs leave from, and the one that hands
	 * received MADs to their takers; under qps_lock until opened. */
	int gsi_fd, gsi_rx;
	uint16_t gsi_port;
	bool gsi_closed;
	_Atomic uint32_t gsi_psn;
};

static inline struct pkt_qp *pkt_lookup(struct pkt_ctx *pc, uint32_t qpn)
{
	struct pkt_qp *q = pc->hash[qpn % PKT_HASH];

	while (q && q->qpn != qpn)
		q = q->hnext;
	return q;
}

/* pkt.c */
/* The context's packet state, opened on first use; NULL with why. */
struct pkt_ctx *pkt_ctx_get(struct sv_context *c, char *why, size_t len);
#define PKT_COUNT(q, field) atomic_fetch_add_explicit(&(q)->st->field, 1, memory_order_relaxed)

static inline void pkt_flush(struct pkt_qp *q)
{
	q->pc->ops->flush(q->pc->link);
}
int pkt_send(struct pkt_qp *q, const struct sv_route *r, const void *hdr, size_t hlen,
	     const struct iovec *payload, int np, size_t plen);
/* The ACKs due, sent now (rx_lock held). */
void pkt_send_acks(struct pkt_ctx *pc);
/* pkt_resp.c: a request packet for q (the caller holds rx_lock). */
void pkt_resp_rx(struct pkt_qp *q, const struct ib_bth *bth, const struct sv_link_pkt *p);
void pkt_resp_ack(struct pkt_qp *q);
void pkt_resp_reset(struct pkt_qp *q);
/* A request for a tombstone (q->dead). */
void pkt_resp_tomb(struct pkt_qp *q, const struct ib_bth *bth);
/* A tombstone's last ACK, sent again unasked. */
void pkt_resp_tomb_ack(struct pkt_qp *q);
/* pkt_req.c: a response packet for q. */
void pkt_req_rx(struct pkt_qp *q, const struct ib_bth *bth, const struct sv_link_pkt *p);
uint64_t pkt_req_tick(struct pkt_qp *q, uint64_t now);
/* The requester's state for a QP entering RTS from RTR at psn (sq_lock held). */
void pkt_req_start(struct pkt_qp *q, uint32_t psn);
/* Rendezvous from another host into a tag-matching SRQ (engine/tm.c):
 * whether q can queue the device's READ and FIN now, and queueing them:
 * the READ of the payload hdr's RVH names into tag's buffer, then the
 * FIN (the caller holds rx_lock). */
bool pkt_req_rndv_room(struct pkt_qp *q);
void pkt_req_rndv(struct pkt_qp *q, const struct shm_rwqe *tag, const uint8_t hdr[32]);
/* A staged copy into GPU memory failed: the responder's WRITE at psn, or
 * the requester's READ w. */
void pkt_resp_gpu_failed(struct pkt_qp *q, uint32_t psn);
void pkt_req_gpu_failed(struct pkt_qp *q, struct sv_swqe *w, bool locked);
/* pkt_gpu.c: GPU memory on the packet path, in runs (rx_lock held). */
/* Takes len bytes bound for device memory dst into the current run, or
 * false (not device memory, or no stage): the caller copies them.  A
 * responder passes its held MR, which the run then owns. */
bool pkt_gpu_put(struct pkt_qp *q, void *dst, const void *src, size_t len, struct sv_swqe *w,
		 uint32_t psn, const struct shm_hdr *mseg, struct shm_mr *mr);
/* The run to the device now: before any ACK, completion or memory read.
 * Returns the QP whose run failed (its failure handled), or NULL; `held`
 * is a QP whose sq_lock the caller holds. */
struct pkt_qp *pkt_gpu_flush_held(struct pkt_ctx *pc, struct pkt_qp *held);
void pkt_gpu_flush(struct pkt_ctx *pc);
/* Only a responder's run, which holds an MR. */
void pkt_gpu_flush_resp(struct pkt_ctx *pc);
/* The host address of payload bytes [off, +plen) of w, whose local
 * memory liov is GPU memory (sq_lock held); NULL if it cannot be read. */
const void *pkt_gpu_tx(struct pkt_qp *q, const struct sv_swqe *w, const struct iovec *liov,
		       int nl, uint64_t len, uint64_t off, uint64_t plen);
void pkt_gpu_qp_free(struct pkt_qp *q);
void pkt_gpu_ctx_free(struct pkt_ctx *pc);

/* gsi.c: QP1 */
void pkt_gsi_rx(struct pkt_ctx *pc, const struct sv_link_pkt *p);
void pkt_gsi_close(struct pkt_ctx *pc);

#endif
