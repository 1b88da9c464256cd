/* SPDX-License-Identifier: MIT */
/*
 * What executing one send WQE can come to, and what each outcome means
 * for the requester.  The responder's side effects happen where the
 * responder's check fails (engine/resp.c); this is the one table that turns
 * an outcome into the requester's work-completion status.
 */
#ifndef SV_ENGINE_H
#define SV_ENGINE_H

#include "../sv.h"

#define SV_RESULTS(X)							\
	/* result         requester status             IBA rule */	\
	X(OK,             IBV_WC_SUCCESS)        /* ACK */		\
	X(DROPPED,        IBV_WC_SUCCESS)        /* UC/UD: lost silently, C9-?? */ \
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
/* A failed process_vm_* call, as an outcome. */
enum sv_result sv_copy_failed(int err, int32_t pid);
/* Why the last WQE this thread executed failed, for explain mode. */
extern __thread char sv_last_why[SV_WHY_LEN];

/* engine/tm.c: a message arriving at a tag-matching SRQ. */
enum sv_result sv_tm_deliver(struct sv_qp *qp, const struct sv_swqe *w, struct sv_target *t,
			     struct shm_wq *wq, const struct iovec *msg, int nmsg, uint64_t len);


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

#endif
