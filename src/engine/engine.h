/* SPDX-License-Identifier: MIT */
/*
 * What executing one send WQE can come to, and what each outcome means
 * for the requester.  The responder's side effects happen where the
 * responder's check fails (engine/resp.c); this is the one table that turns
 * an outcome into the requester's work-completion status.
 */
#ifndef SV_ENGINE_H
#define SV_ENGINE_H

#include <errno.h>
#include <stdio.h>

#include "../sv.h"

#define SV_RESULTS(X)							\
	/* result         requester status             IBA rule */	\
	X(OK,             IBV_WC_SUCCESS)        /* ACK */		\
	X(DROPPED,        IBV_WC_SUCCESS)        /* UC/UD: lost silently, 9.8 */ \
	X(RNR,            IBV_WC_SUCCESS)        /* RNR NAK: retried, 9.7.5.2.8 */ \
	X(RNR_EXHAUSTED,  IBV_WC_RNR_RETRY_EXC_ERR) /* C9-140: rnr_retry spent */ \
	X(NO_RESPONSE,    IBV_WC_RETRY_EXC_ERR)  /* 9.7.6.1.3: retry_cnt spent */ \
	X(NAK_ACCESS,     IBV_WC_REM_ACCESS_ERR) /* NAK Remote Access Error */ \
	X(NAK_INV_REQ,    IBV_WC_REM_INV_REQ_ERR) /* NAK Invalid Request */ \
	X(NAK_OP,         IBV_WC_REM_OP_ERR)     /* NAK Remote Operational Error */ \
	X(LOC_PROT,       IBV_WC_LOC_PROT_ERR)   /* bad lkey or bounds, 10.6.3.1 */ \
	X(LOC_LEN,        IBV_WC_LOC_LEN_ERR)    /* length beyond what the QP can send */ \
	X(LOC_QP_OP,      IBV_WC_LOC_QP_OP_ERR)  /* a local operation failed (rxe_req.c) */ \
	X(MW_BIND,        IBV_WC_MW_BIND_ERR)    /* C10-72..75: the bind broke a rule */

#define RESULT_ENUM(name, status) SV_R_##name,
enum sv_result { SV_RESULTS(RESULT_ENUM) SV_R_COUNT };
#undef RESULT_ENUM

enum ibv_wc_status sv_result_status(enum sv_result r);
const char *sv_result_name(enum sv_result r);

#define SV_WHY_LEN 160

/* engine/resp.c: the responder's checks, run by the initiator against the
 * target's segment. */
struct sv_target {
	struct shm_hdr *seg;	/* the receiving context: queues, CQs */
	struct shm_hdr *qseg;	/* the target QP's context: seg, except for XRC */
	/* The receiving context's keys and memory: seg, or for a context
	 * imported from another process its home's (shm_hdr.home_pid). */
	struct shm_hdr *mseg;
	struct shm_qp *qp;
	/* Where a message is received and whose PD protects the target's
	 * memory: the QP itself, or for XRC the SRQ the request names. */
	struct shm_qp *rx;
	uint64_t rcq_off;	/* where receive completions go, in seg */
	uint64_t wq_off;	/* the receive queue (RQ, SRQ or WQ), in seg */
	uint32_t wq_num;	/* a WQ's number, reported as qp_num; else 0 */
	int32_t pid;		/* whose memory: mseg's owner */
	struct shm_hdr *own;	/* the initiator's segment */
	struct sv_map_cache *cache;	/* the initiating QP's */
	const struct sv_transport_ops *tp;	/* how the initiator reaches seg: tp_mem */
	bool mapped;		/* the last buffer resolved is mapped here (direct path) */
	char why[SV_WHY_LEN];	/* the failed check, for explain mode */
};

/* The QP numbered qpn, wherever it lives, with its queues; and the same
 * checked as the destination of qp (type, receiving state). */
enum sv_result sv_resp_locate(struct sv_qp *qp, uint32_t qpn, struct sv_target *t);
enum sv_result sv_resp_find(struct sv_qp *qp, uint32_t qpn, struct sv_target *t);
bool sv_resp_receiving(const struct shm_qp *qp);
/* The target QP left the receiving states since it was found: a failure
 * seen now is its teardown, and the request is dropped, not NAKed. */
bool sv_resp_gone(const struct sv_target *t);
/* XRC: the SRQ srqn of the target QP's domain becomes t->rx. */
enum sv_result sv_resp_xrc(struct sv_target *t, uint32_t srqn);
/* A remote buffer: rkey, address and length must fall in a registered MR
 * of the target QP's PD with the access asked.  On success the MR is held
 * (users) until sv_resp_mr_put(). */
enum sv_result sv_resp_mr_get(struct sv_target *t, uint32_t rkey, uint64_t va, uint64_t len,
			      unsigned access, struct shm_mr **mr, void **addr);
void sv_resp_mr_put(const struct shm_hdr *h, struct shm_mr *mr);
/* SEND_WITH_INV at the responder: 0, or -1 with the reason in t->why. */
int sv_resp_invalidate(struct sv_target *t, uint32_t rkey);
/* Takes the next receive WQE of the target (its RQ or SRQ) into *wqe. */
enum sv_result sv_resp_take_recv(struct sv_target *t, struct shm_rwqe *wqe);
/* The same, with wq's lock held and wq->count checked by the caller;
 * true when an SRQ limit fired and the owner must be rung after unlock. */
bool sv_resp_pop_locked(struct sv_target *t, struct shm_wq *wq, struct shm_rwqe *wqe);
/* The responder side of a failed request: completes the receive WQE
 * (when there is one) with status and moves the target QP to ERR. */
void sv_resp_fail(struct sv_target *t, const struct shm_rwqe *wqe, enum ibv_wc_status status,
		  int ev);	/* ev: an affiliated ibv_event_type, or -1 */
/* Resolves the scatter list of a receive WQE in the target's MR table. */
enum sv_result sv_resp_recv_iov(struct sv_target *t, const struct shm_rwqe *w, struct iovec *iov,
				uint64_t *cap, struct shm_mr **held);
void sv_resp_recv_put(struct sv_target *t, const struct shm_rwqe *w, struct shm_mr **held);

/* engine/req.c: delivering a message (msg, len bytes; data false for
 * WRITE_WITH_IMM, whose bytes have landed) into the receive WQE rw the
 * caller took from t, and completing it into t->rcq_off with the opcode,
 * flags and tag the caller set in e.  w is NULL for a message the device
 * itself sends (a rendezvous FIN). */
enum sv_result sv_deliver_wqe(struct sv_qp *qp, const struct sv_swqe *w, struct sv_target *t,
			      const struct shm_rwqe *rw, const struct iovec *msg, int nmsg,
			      uint64_t len, bool data, struct shm_cqe *e);
/* Takes a receive WQE of t (RNR when there is none) and delivers into it. */
enum sv_result sv_deliver_recv(struct sv_qp *qp, struct sv_swqe *w, struct sv_target *t,
			       const struct iovec *liov, int nl, uint64_t len, bool data);
/* Sets the header checksum of the 20-byte IPv4 header at ip (RFC 791). */
void sv_ipv4_csum(uint8_t *ip);
/* A failed process_vm_* call, as an outcome. */
enum sv_result sv_copy_failed(int err, int32_t pid);
/* Why the last WQE this thread executed failed, for explain mode. */
extern __thread char sv_last_why[SV_WHY_LEN];

/* engine/tm.c: a message arriving at a tag-matching SRQ. */
enum sv_result sv_tm_deliver(struct sv_qp *qp, const struct sv_swqe *w, struct sv_target *t,
			     struct shm_wq *wq, const struct iovec *msg, int nmsg, uint64_t len);
/* The same decision for a message that arrives in packets, at its first:
 * the receive WQE (a tag's buffer or an ordinary one) in *out, and how
 * its completion reads.  SV_R_NAK_INV_REQ for a rendezvous message: the
 * READ of the sender's memory that a match needs is made on one host
 * only (t->why says so). */
struct sv_tm_recv {
	uint8_t opcode;			/* enum ibv_wc_opcode */
	uint32_t wc_flags, imm;
	uint64_t tag;
	uint32_t skip;			/* header bytes that do not land */
	/* A rendezvous that matched a tag: SV_TM_RNDV_READ, its payload to
	 * be read from the sender (hdr: its TMH and RVH) and nothing of the
	 * message landing; SV_TM_RNDV_SHORT, the tag's buffer too small for
	 * that payload: the message lands whole, IBV_WC_TM_RNDV_INCOMPLETE. */
	uint8_t rndv;
	uint8_t hdr[32];
};
enum { SV_TM_EAGER, SV_TM_RNDV_READ, SV_TM_RNDV_SHORT };
/* The decision for a message into a tag-matching SRQ from another host,
 * at its first packet.  rndv_room: whether the receiving QP can queue a
 * rendezvous READ now; a rendezvous is refused with RNR otherwise, before
 * it takes a tag. */
enum sv_result sv_tm_take_first(struct sv_target *t, struct shm_wq *wq, const uint8_t *first,
				size_t first_len, bool rndv_room, struct shm_rwqe *out,
				struct sv_tm_recv *how);


/* engine/raw.c: a raw packet QP's frame, to every QP whose flow rules
 * take it (UD-like: nothing comes back). */
enum sv_result sv_raw_send(struct sv_qp *qp, struct sv_swqe *w, const struct iovec *frame,
			   int n, uint64_t len);

/* engine/req.c: send-queue slots, shared by ibv_post_send and ibv_wr_*. */
struct sv_swqe *sv_sq_slot(struct sv_qp *qp, uint32_t i);
void *sv_swqe_inline(struct sv_qp *qp, struct sv_swqe *w);
void sv_swqe_init(struct sv_qp *qp, struct sv_swqe *w, uint64_t wr_id, enum ibv_wr_opcode op,
		  unsigned flags);
bool sv_wr_opcode_ok(struct sv_qp *qp, enum ibv_wr_opcode op);

/* ---- the packet engine (engine/pkt*.c) and the links it sends on ---- */

/*
 * A QP whose peer is on another host speaks IBA packets: the requester
 * segments its WQEs and keeps RC reliable (IBA 9.7), the responder runs
 * the checks above in this process against its own segment.  Packets go
 * through a link, the packet slots of a transport (RoCEv2 over UDP:
 * transport/udp); the engine includes no transport header.
 */
#include <netinet/in.h>

/* The IP addresses and fields a packet travels with.  IPv4 addresses are
 * IPv4-mapped IPv6 ones, as in a RoCEv2 GID; v4 is false for IPv6. */
struct sv_route {
	struct in6_addr src, dst;
	uint16_t sport;		/* received packets: the sender's UDP source port */
	uint8_t tclass, ttl;	/* IPv4 TOS and TTL, or IPv6 traffic class and hop limit */
	bool v4;
	/* IPv6 only.  flow: the flow label received (a sent packet's is the
	 * kernel's choice).  ifindex: the interface a link-local destination
	 * is on (it leaves by that one, as rxe's by its netdev), or the one
	 * a packet came in by; 0 when none is needed. */
	uint32_t flow;
	uint32_t ifindex;
};
/* An address as text, for messages: dotted IPv4 for an IPv4-mapped
 * one, else IPv6, with %IFINDEX for a link-local one. */
const char *sv_route_addr(const struct in6_addr *a, uint32_t ifindex, char *buf, size_t len);

/* One packet as a link hands it up: BTH through pad, the ICRC checked and
 * removed; route.src is the sender. */
struct sv_frame;	/* core/guard.h */
struct sv_link_pkt {
	const uint8_t *buf;
	size_t len;
	struct sv_route route;
	/* CLOCK_MONOTONIC ns when the link began the read that got it: the
	 * engine's clock for the packet's timers, so that a batch reads
	 * the clock once, not once per packet and role. */
	uint64_t at;
};

/*
 * A transport, as the engine sees it: one ops table, which the shm and the
 * udp transports both implement.  Its slots come in two kinds, the two
 * ways a verb reaches its peer:
 *   - memory: a context of this host, whose segment and MRs the initiator
 *     reaches itself, running the responder's checks there (shm);
 *   - packets: a context of another host, reached through a link that
 *     carries the packet engine's packets (udp).
 * A transport fills the slots of its kind and starts from SV_TP_NO_MEMORY
 * or SV_TP_NO_PACKETS for the others, so every slot can be called and
 * fails cleanly where it does not apply (as libfabric's fi_no_* and
 * rdma-core's dummy ops do).  The verbs that open a context bind its two
 * (sv_context.tp_mem, tp_link); the engine names no transport.
 */
struct sv_link_ep;
struct sv_transport_ops {
	const char *name;

	/* ---- memory (transport/shm) ---- */
	/* Moves the bytes of local list l to (write) or from r, memory of
	 * the process owning segment target; mapped: r is this process's
	 * mapping of it (map, map_gpu).  own, the initiator's segment, is
	 * served while the move waits on target.  0 or an errno. */
	int (*move)(struct shm_hdr *target, struct shm_hdr *own, bool write, bool mapped,
		    const struct iovec *l, int nl, const struct iovec *r, int nr);
	/* This process's address of target address va of held MR m of
	 * segment seg (len bytes from va), when its memory can be mapped
	 * here; NULL to move instead. */
	void *(*map)(const struct shm_hdr *seg, const struct shm_mr *m, uint64_t va, uint64_t len);
	/* The same for a GPU MR, the only way to another process's one;
	 * NULL with the reason in why.  via: the initiator's segment. */
	void *(*map_gpu)(const struct shm_hdr *seg, const struct shm_mr *m, uint64_t va,
			 const struct shm_hdr *via, char *why, size_t len);
	/* An 8-byte FETCH_ADD or CMP_SWP at addr in t's process, answered
	 * by t's own thread; the caller holds t's atomic_lock.  false: move
	 * the bytes instead. */
	bool (*atomic)(struct shm_hdr *t, enum ibv_wr_opcode op, void *addr, uint64_t compare_add,
		       uint64_t swap, uint64_t *old);
	/* Deferred placement: a small SEND's bytes left in h's segment for
	 * its owner to place when it polls the completion (their slot, or
	 * 0: move them now); placing one; the slot the next put fills, for
	 * a prefetch; placing every pending one before an access that must
	 * see them. */
	uint8_t (*defer_put)(struct shm_hdr *h, struct shm_hdr *own, const struct iovec *src,
			     int ns, const struct iovec *dst, int nd, uint64_t len);
	void (*defer_place)(struct shm_hdr *h, struct shm_hdr *own, uint8_t defer);
	const void *(*defer_next)(const struct shm_hdr *h);
	void (*defer_flush)(struct shm_hdr *h, struct shm_hdr *own);
	/* The context's progress thread's turn at what peers asked of it
	 * (copies, atomics, mailboxes): true while it should come back
	 * without sleeping.  stop: the thread ends. */
	bool (*serve)(struct sv_context *c);
	void (*stop)(struct sv_context *c);

	/* ---- packets (transport/udp) ---- */
	/* The context's endpoint: from now on every packet for the
	 * context's QPs is handed to sv_pkt_rx(). */
	struct sv_link_ep *(*open)(struct sv_context *c, char *why, size_t len);
	void (*close)(struct sv_link_ep *l);
	/* A sending socket with a source port of its own (a QP's flow):
	 * an fd, or -1 with the reason in why. */
	int (*sock)(struct sv_link_ep *l, uint16_t *port, char *why, size_t len);
	void (*sock_close)(struct sv_link_ep *l, int fd);
	/* Sends pkt[0..n) (len bytes, BTH through pad); the link adds the
	 * ICRC.  0 or an errno. */
	int (*send)(struct sv_link_ep *l, int fd, const struct sv_route *r, const struct iovec *pkt,
		    int n, size_t len);
	/* The datagram send would make of pkt, for another process to send
	 * from a dup of the same fd (core/guard.h).  0 or an errno. */
	int (*frame)(struct sv_link_ep *l, const struct sv_route *r, const struct iovec *pkt, int n,
		     size_t len, struct sv_frame *out);
	/* Packets sent may wait in a batch until this; the payloads they
	 * reference must stay valid until then. */
	void (*flush)(struct sv_link_ep *l);
	/* A thread polling a CQ drives reception: true if it received.
	 * What the engine holds back after such a poll (its ACKs) waits for
	 * the next poll, or for a tick the link runs once polls have
	 * stopped coming.  armed: the CQ asked for an event
	 * (ibv_req_notify_cq), so its application is about to wait for it
	 * instead of polling on. */
	bool (*poll)(struct sv_link_ep *l, bool armed);
	/* The process is leaving: what waits in the endpoint is received,
	 * and what belongs to other contexts of the host is handed to them,
	 * now (the caller holds no engine lock). */
	void (*drain)(struct sv_link_ep *l);
	/* sv_pkt_tick() is wanted by when_ns (CLOCK_MONOTONIC). */
	void (*want_tick)(struct sv_link_ep *l, uint64_t when_ns);
	/* Packets to the IPv4 multicast group (an IPv4-mapped MGID) reach
	 * this endpoint from other hosts (join true) or no longer do.  0 or
	 * an errno with the reason in why. */
	int (*mcast)(struct sv_link_ep *l, const union ibv_gid *mgid, bool join, char *why,
		     size_t len);
};

/* The slots of the other kind, for a transport's table to start from. */
static inline int sv_tp_no_move(struct shm_hdr *t, struct shm_hdr *o, bool w, bool m,
				const struct iovec *l, int nl, const struct iovec *r, int nr)
{
	(void)t, (void)o, (void)w, (void)m, (void)l, (void)nl, (void)r, (void)nr;
	return EOPNOTSUPP;
}
static inline void *sv_tp_no_map(const struct shm_hdr *seg, const struct shm_mr *m, uint64_t va,
				 uint64_t len)
{
	(void)seg, (void)m, (void)va, (void)len;
	return NULL;
}
static inline void *sv_tp_no_map_gpu(const struct shm_hdr *seg, const struct shm_mr *m,
				     uint64_t va, const struct shm_hdr *via, char *why, size_t len)
{
	(void)seg, (void)m, (void)va, (void)via;
	snprintf(why, len, "this transport reaches no other process's memory");
	return NULL;
}
static inline bool sv_tp_no_atomic(struct shm_hdr *t, enum ibv_wr_opcode op, void *addr,
				   uint64_t compare_add, uint64_t swap, uint64_t *old)
{
	(void)t, (void)op, (void)addr, (void)compare_add, (void)swap, (void)old;
	return false;
}
static inline uint8_t sv_tp_no_defer_put(struct shm_hdr *h, struct shm_hdr *own,
					 const struct iovec *src, int ns, const struct iovec *dst,
					 int nd, uint64_t len)
{
	(void)h, (void)own, (void)src, (void)ns, (void)dst, (void)nd, (void)len;
	return 0;
}
static inline void sv_tp_no_defer_place(struct shm_hdr *h, struct shm_hdr *own, uint8_t defer)
{
	(void)h, (void)own, (void)defer;
}
static inline const void *sv_tp_no_defer_next(const struct shm_hdr *h)
{
	return h;	/* any readable line: it is only prefetched */
}
static inline void sv_tp_no_defer_flush(struct shm_hdr *h, struct shm_hdr *own)
{
	(void)h, (void)own;
}
static inline bool sv_tp_no_serve(struct sv_context *c)
{
	(void)c;
	return false;
}
static inline void sv_tp_no_stop(struct sv_context *c)
{
	(void)c;
}
static inline struct sv_link_ep *sv_tp_no_open(struct sv_context *c, char *why, size_t len)
{
	(void)c;
	snprintf(why, len, "this transport carries no packets");
	return NULL;
}
static inline void sv_tp_no_close(struct sv_link_ep *l)
{
	(void)l;
}
static inline int sv_tp_no_sock(struct sv_link_ep *l, uint16_t *port, char *why, size_t len)
{
	(void)l, (void)port;
	snprintf(why, len, "this transport carries no packets");
	return -1;
}
static inline void sv_tp_no_sock_close(struct sv_link_ep *l, int fd)
{
	(void)l, (void)fd;
}
static inline int sv_tp_no_send(struct sv_link_ep *l, int fd, const struct sv_route *r,
				const struct iovec *pkt, int n, size_t len)
{
	(void)l, (void)fd, (void)r, (void)pkt, (void)n, (void)len;
	return EOPNOTSUPP;
}
static inline int sv_tp_no_frame(struct sv_link_ep *l, const struct sv_route *r,
				 const struct iovec *pkt, int n, size_t len, struct sv_frame *out)
{
	(void)l, (void)r, (void)pkt, (void)n, (void)len, (void)out;
	return EOPNOTSUPP;
}
static inline void sv_tp_no_link(struct sv_link_ep *l)	/* flush, drain */
{
	(void)l;
}
static inline bool sv_tp_no_poll(struct sv_link_ep *l, bool armed)
{
	(void)l, (void)armed;
	return false;
}
static inline void sv_tp_no_want_tick(struct sv_link_ep *l, uint64_t when_ns)
{
	(void)l, (void)when_ns;
}
static inline int sv_tp_no_mcast(struct sv_link_ep *l, const union ibv_gid *mgid, bool join,
				 char *why, size_t len)
{
	(void)l, (void)mgid, (void)join;
	snprintf(why, len, "this transport carries no packets");
	return EOPNOTSUPP;
}
#define SV_TP_NO_MEMORY							\
	.move = sv_tp_no_move, .map = sv_tp_no_map, .map_gpu = sv_tp_no_map_gpu,	\
	.atomic = sv_tp_no_atomic, .defer_put = sv_tp_no_defer_put,		\
	.defer_place = sv_tp_no_defer_place, .defer_next = sv_tp_no_defer_next,	\
	.defer_flush = sv_tp_no_defer_flush, .serve = sv_tp_no_serve, .stop = sv_tp_no_stop
#define SV_TP_NO_PACKETS						\
	.open = sv_tp_no_open, .close = sv_tp_no_close, .sock = sv_tp_no_sock,	\
	.sock_close = sv_tp_no_sock_close, .send = sv_tp_no_send,		\
	.frame = sv_tp_no_frame, .flush = sv_tp_no_link, .poll = sv_tp_no_poll,	\
	.drain = sv_tp_no_link, .want_tick = sv_tp_no_want_tick, .mcast = sv_tp_no_mcast

/* Moves bytes between the local list l and the target's memory r, to r
 * when write: r is this process's mapping of it when resp.c mapped it
 * (shareable memory, or another process's GPU memory), else an address
 * in the target's process, which may be another one's (a peer on this
 * host, or an imported context's home).  0 or an errno. */
static inline int sv_target_move(const struct sv_target *t, bool write, const struct iovec *l,
				 int nl, const struct iovec *r, int nr)
{
	return t->tp->move(t->mseg, t->own, write, t->mapped, l, nl, r, nr);
}

/* What a link calls.  Reception is serialised per context: a link takes
 * sv_pkt_rx_lock() (wait false: a poller that finds it taken goes on),
 * hands up a batch, and sv_pkt_rx_unlock() sends the ACKs it coalesced. */
bool sv_pkt_rx_lock(struct sv_context *c, bool wait);
void sv_pkt_rx(struct sv_context *c, const struct sv_link_pkt *p);
void sv_pkt_rx_unlock(struct sv_context *c);
/* The same for a batch whose application polls CQs: the ACKs it owes
 * may wait for its next post (pkt.c says how long), so that it sees its
 * completions first and the post carries them.  A link calls it for a
 * CQ poller's batch, and for its own thread's when the application
 * polled a moment ago; the link then ticks within its bound.  Returns
 * whether ACKs are held. */
bool sv_pkt_rx_unlock_poller(struct sv_context *c);
/* Timers (retransmission, RNR waits): returns when it is next wanted, or
 * 0 when no timer runs. */
uint64_t sv_pkt_tick(struct sv_context *c, uint64_t now_ns);
/* The context's endpoint counters, in its segment (core/stats.h). */
struct sv_pkt_ep_stats *sv_pkt_ep_stats(struct sv_context *c);
/* Whether packets for qpn are this context's to take (else the link
 * hands them to the QPN's owner on this host). */
bool sv_pkt_owns(struct sv_context *c, uint32_t qpn);

/* What the verbs and the requester call (engine/pkt.c). */
/* A QP entering RTR with attr: picks shm or packets for its peer; 0, or
 * an errno with the reason in why. */
int sv_pkt_qp_route(struct sv_qp *qp, const struct ibv_qp_attr *attr, int mask, char *why,
		    size_t len);
void sv_pkt_qp_detach(struct sv_qp *qp);	/* RESET, destroy */
/* ERR: the receive WQE of a message under way completes flushed. */
void sv_pkt_rq_flush_held(struct sv_qp *qp);
/* SQD: whether no message is under way; if one is, SQ_DRAINED (notify)
 * is raised when the last completes. */
bool sv_pkt_sq_drained(struct sv_qp *qp, bool notify);
/* A UD QP attached to (join) or detached from a multicast group: the
 * context's link takes the group's packets from other hosts while any
 * of its QPs is a member. */
void sv_pkt_mcast(struct sv_qp *qp, const union ibv_gid *mgid, bool join);
void sv_pkt_ctx_close(struct sv_context *c);
void sv_pkt_poll(struct sv_context *c, bool armed);	/* a CQ poller found nothing */
/* Whether the address vector reaches another host; *why when it
 * reaches nothing. */
bool sv_route_remote(const struct sv_device *dev, const struct ibv_ah_attr *av,
		     struct sv_route *r, const char **why);
/* engine/pkt_req.c: a QP with a remote peer runs its send queue here;
 * post: the run is an application's post, which may leave its WQEs for
 * the next ACK (PKT_CORK_INFLIGHT). */
int sv_pkt_sq_run(struct sv_qp *qp, bool post);
/* The send queue was emptied (flush, RESET); the caller holds sq_lock. */
void sv_pkt_sq_reset(struct sv_qp *qp);
/* The device's own WQE w (enum sv_hidden) done with status: a rendezvous
 * READ completes its tag in the SRQ's CQ; false when that CQ overran. */
bool sv_pkt_hidden_done(struct sv_qp *qp, const struct sv_swqe *w, enum ibv_wc_status status);
/* A UD message to another host: one packet, no response. */
enum sv_result sv_pkt_ud_send(struct sv_qp *qp, struct sv_swqe *w, const struct iovec *liov,
			      int nl, uint64_t len);

/* engine/req.c, for the packet requester. */
enum { SV_RUN_OK, SV_RUN_FAILED, SV_RUN_OVERRUN };
enum sv_result sv_wqe_local_iov(struct sv_qp *qp, struct sv_swqe *w, bool write,
				struct iovec *iov, int *n, uint64_t *len);
enum sv_result sv_wqe_exec_local(struct sv_qp *qp, struct sv_swqe *w);
bool sv_wqe_complete(struct sv_qp *qp, struct sv_swqe *w, enum ibv_wc_status status,
		     uint64_t len);
uint64_t sv_wqe_len(const struct sv_swqe *w);
uint64_t sv_ack_timeout_ns(unsigned timeout);
/* engine/resp.c: the target is a QP of this context (packets). */
enum sv_result sv_resp_local(struct sv_context *c, uint32_t qpn, struct sv_target *t);

#endif
