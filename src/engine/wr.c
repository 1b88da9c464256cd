/* SPDX-License-Identifier: MIT */
/*
 * The ibv_wr_* send API (struct ibv_qp_ex), a second way to fill the same
 * send queue as ibv_post_send.  As in rdma-core's providers, wr_start takes
 * the send-queue lock and wr_complete or wr_abort releases it; WQEs built
 * in between become visible only at wr_complete, all of them or -- when
 * any step failed -- none.
 */
#include <errno.h>
#include <string.h>

#include "engine.h"

static struct sv_qp *to_qp(struct ibv_qp_ex *qx)
{
	return (struct sv_qp *)qx;
}

static struct sv_swqe *cur(struct sv_qp *qp)
{
	return qp->wr_n ? sv_sq_slot(qp, qp->sq_head + qp->sq_count + qp->wr_n - 1) : NULL;
}

static void wr_start(struct ibv_qp_ex *qx)
{
	struct sv_qp *qp = to_qp(qx);

	pthread_mutex_lock(&qp->sq_lock);
	qp->wr_n = 0;
	qp->wr_err = 0;
}

static int wr_complete(struct ibv_qp_ex *qx)
{
	struct sv_qp *qp = to_qp(qx);
	int err = qp->wr_err;

	/* As ibv_post_send: the send queue works from RTS on (C10-30). */
	if (!err && atomic_load_explicit(&qp->sh->state, memory_order_relaxed) < IBV_QPS_RTS)
		err = EINVAL;
	if (err) {
		qp->wr_n = 0;
		pthread_mutex_unlock(&qp->sq_lock);
		return sv_fail(err, "ibv_wr_complete", "qpn 0x%x: the batch was discarded",
			       qx->qp_base.qp_num);
	}
	qp->sq_count += qp->wr_n;
	qp->wr_n = 0;
	sv_sq_post_unlock(qp);	/* in the same hold of the lock, as ibv_post_send */
	return 0;
}

static void wr_abort(struct ibv_qp_ex *qx)
{
	struct sv_qp *qp = to_qp(qx);

	qp->wr_n = 0;
	pthread_mutex_unlock(&qp->sq_lock);
}

/* Opens the next WQE of the batch, or records why it cannot be. */
static struct sv_swqe *begin(struct ibv_qp_ex *qx, enum ibv_wr_opcode op)
{
	struct sv_qp *qp = to_qp(qx);

	if (qp->wr_err)
		return NULL;
	if (!sv_wr_opcode_ok(qp, op)) {
		qp->wr_err = EINVAL;
		return NULL;
	}
	if (qp->sq_count - qp->sq_hidden + qp->wr_n >= qp->cap.max_send_wr) {
		qp->wr_err = ENOMEM;
		return NULL;
	}
	qp->wr_n++;
	struct sv_swqe *w = cur(qp);
	sv_swqe_init(qp, w, qx->wr_id, op, qx->wr_flags);
	return w;
}

static void wr_send(struct ibv_qp_ex *qx)
{
	begin(qx, IBV_WR_SEND);
}

static void wr_send_imm(struct ibv_qp_ex *qx, __be32 imm)
{
	struct sv_swqe *w = begin(qx, IBV_WR_SEND_WITH_IMM);
	if (w)
		w->imm = imm;
}

static void rdma(struct ibv_qp_ex *qx, enum ibv_wr_opcode op, uint32_t rkey, uint64_t addr,
		 __be32 imm)
{
	struct sv_swqe *w = begin(qx, op);
	if (w) {
		w->rkey = rkey;
		w->remote_addr = addr;
		w->imm = imm;
	}
}

static void wr_rdma_write(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr)
{
	rdma(qx, IBV_WR_RDMA_WRITE, rkey, addr, 0);
}

static void wr_rdma_write_imm(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr, __be32 imm)
{
	rdma(qx, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr, imm);
}

static void wr_rdma_read(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr)
{
	rdma(qx, IBV_WR_RDMA_READ, rkey, addr, 0);
}

static void atomic(struct ibv_qp_ex *qx, enum ibv_wr_opcode op, uint32_t rkey, uint64_t addr,
		   uint64_t compare_add, uint64_t swap)
{
	struct sv_swqe *w = begin(qx, op);
	if (w) {
		w->rkey = rkey;
		w->remote_addr = addr;
		w->compare_add = compare_add;
		w->swap = swap;
	}
}

static void wr_atomic_cmp_swp(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr,
			      uint64_t compare, uint64_t swap)
{
	atomic(qx, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, addr, compare, swap);
}

static void wr_atomic_fetch_add(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr, uint64_t add)
{
	atomic(qx, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, addr, add, 0);
}

static void wr_set_sge_list(struct ibv_qp_ex *qx, size_t num, const struct ibv_sge *sg)
{
	struct sv_qp *qp = to_qp(qx);
	struct sv_swqe *w = cur(qp);

	if (!w || qp->wr_err)
		return;
	if (num > qp->cap.max_send_sge) {
		qp->wr_err = EINVAL;
		return;
	}
	w->num_sge = (uint32_t)num;
	w->inline_len = 0;
	if (num)
		memcpy(w->sge, sg, num * sizeof(*sg));
}

static void wr_set_sge(struct ibv_qp_ex *qx, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge sge = { addr, length, lkey };

	wr_set_sge_list(qx, 1, &sge);
}

static void wr_set_inline_data_list(struct ibv_qp_ex *qx, size_t num, const struct ibv_data_buf *b)
{
	struct sv_qp *qp = to_qp(qx);
	struct sv_swqe *w = cur(qp);
	size_t len = 0;

	if (!w || qp->wr_err)
		return;
	for (size_t i = 0; i < num; i++)
		len += b[i].length;
	if (len > qp->cap.max_inline_data) {
		qp->wr_err = EINVAL;
		return;
	}
	char *dst = sv_swqe_inline(qp, w);
	w->num_sge = 0;
	w->inline_len = 0;
	for (size_t i = 0; i < num; i++) {
		struct iovec d = { dst + w->inline_len, b[i].length },
			     s = { b[i].addr, b[i].length };
		sv_copy_iov(&d, 1, &s, 1);	/* GPU memory too */
		w->inline_len += (uint32_t)b[i].length;
	}
}

static void wr_set_inline_data(struct ibv_qp_ex *qx, void *addr, size_t length)
{
	struct ibv_data_buf b = { addr, length };

	wr_set_inline_data_list(qx, 1, &b);
}

static void wr_set_ud_addr(struct ibv_qp_ex *qx, struct ibv_ah *ah, uint32_t remote_qpn,
			   uint32_t remote_qkey)
{
	struct sv_qp *qp = to_qp(qx);
	struct sv_swqe *w = cur(qp);

	if (!w || qp->wr_err)
		return;
	if (!sv_obj_live(ah, SV_OBJ_AH)) {
		qp->wr_err = EINVAL;
		return;
	}
	w->av = sv_ah(ah)->attr;
	w->remote_qpn = remote_qpn;
	w->remote_qkey = remote_qkey;
}

static void wr_bind_mw(struct ibv_qp_ex *qx, struct ibv_mw *mw, uint32_t rkey,
		       const struct ibv_mw_bind_info *info)
{
	struct sv_qp *qp = to_qp(qx);
	struct sv_swqe *w;

	if (!qp->wr_err && !sv_obj_live(mw, SV_OBJ_MW)) {
		qp->wr_err = EINVAL;
		return;
	}
	w = begin(qx, IBV_WR_BIND_MW);
	if (w) {
		w->mw = mw;
		w->rkey = rkey;
		w->bind = *info;
	}
}

/* LOCAL_INV and SEND_WITH_INV: the rkey travels where imm_data would. */
static void inv(struct ibv_qp_ex *qx, enum ibv_wr_opcode op, uint32_t rkey)
{
	struct sv_swqe *w = begin(qx, op);
	if (w)
		w->imm = rkey;
}

static void wr_local_inv(struct ibv_qp_ex *qx, uint32_t rkey)
{
	inv(qx, IBV_WR_LOCAL_INV, rkey);
}

static void wr_send_inv(struct ibv_qp_ex *qx, uint32_t rkey)
{
	inv(qx, IBV_WR_SEND_WITH_INV, rkey);
}

/* The 8 bytes are taken now, as inline data: the caller's buffer is free
 * again when the call returns (rdma-core verbs.h). */
static void wr_atomic_write(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t addr, const void *v)
{
	struct sv_qp *qp = to_qp(qx);
	struct sv_swqe *w = begin(qx, IBV_WR_ATOMIC_WRITE);

	if (w) {
		w->rkey = rkey;
		w->remote_addr = addr;
		memcpy(sv_swqe_inline(qp, w), v, 8);
		w->inline_len = 8;
	}
}

/* TSO needs a raw packet QP; creation refuses its send_ops_flag, so this
 * is reached only by a caller ignoring that, and it fails the batch
 * rather than leave a NULL to jump through. */
static void wr_send_tso(struct ibv_qp_ex *qx, void *hdr, uint16_t hdr_sz, uint16_t mss)
{
	(void)hdr; (void)hdr_sz; (void)mss;
	to_qp(qx)->wr_err = EOPNOTSUPP;
}

static void wr_set_xrc_srqn(struct ibv_qp_ex *qx, uint32_t srqn)
{
	struct sv_qp *qp = to_qp(qx);
	struct sv_swqe *w = cur(qp);

	if (!w || qp->wr_err)
		return;
	if (qx->qp_base.qp_type != IBV_QPT_XRC_SEND) {
		qp->wr_err = EINVAL;
		return;
	}
	w->srqn = srqn;
}

#define OPS_UC (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | \
		IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_BIND_MW | \
		IBV_QP_EX_WITH_LOCAL_INV)
#define OPS_RC (OPS_UC | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | \
		IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV | \
		IBV_QP_EX_WITH_ATOMIC_WRITE)
#define OPS_UD (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM)

uint64_t sv_wr_ops_supported(enum ibv_qp_type type)
{
	return type == IBV_QPT_RC || type == IBV_QPT_XRC_SEND ? OPS_RC : type == IBV_QPT_UC ? OPS_UC :
	       type == IBV_QPT_UD ? OPS_UD : 0;
}

void sv_wr_install(struct sv_qp *qp)
{
	struct ibv_qp_ex *x = &qp->ex;

	x->wr_start = wr_start;
	x->wr_complete = wr_complete;
	x->wr_abort = wr_abort;
	x->wr_send = wr_send;
	x->wr_send_imm = wr_send_imm;
	x->wr_rdma_write = wr_rdma_write;
	x->wr_rdma_write_imm = wr_rdma_write_imm;
	x->wr_rdma_read = wr_rdma_read;
	x->wr_atomic_cmp_swp = wr_atomic_cmp_swp;
	x->wr_atomic_fetch_add = wr_atomic_fetch_add;
	x->wr_set_sge = wr_set_sge;
	x->wr_set_sge_list = wr_set_sge_list;
	x->wr_set_inline_data = wr_set_inline_data;
	x->wr_set_inline_data_list = wr_set_inline_data_list;
	x->wr_set_ud_addr = wr_set_ud_addr;
	x->wr_bind_mw = wr_bind_mw;
	x->wr_local_inv = wr_local_inv;
	x->wr_send_inv = wr_send_inv;
	x->wr_send_tso = wr_send_tso;
	x->wr_set_xrc_srqn = wr_set_xrc_srqn;
	x->wr_atomic_write = wr_atomic_write;
	qp->has_ex = true;
}
