/* SPDX-License-Identifier: MIT */
/*
 * The responder's checks (IBA 9.7.4 and rxe_resp.c), executed by the
 * initiator against the target context's segment: that is how a one-sided
 * operation completes while the target process sleeps.  Each check names
 * the outcome the requester sees; the responder's own side effects (an
 * error completion on the receive WQE, the QP moving to ERR, an affiliated
 * event) are posted to the target through its segment and delivered by its
 * progress thread.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

/* The direct path applies between processes, unless a path is forced. */
static bool try_direct(const struct sv_target *t)
{
	return t->pid != sv_pid() && sv_config()->copy == SV_COPY_AUTO;
}

/*
 * Keys and memory of the receiving context t->seg: its own, or its
 * home's.  A home that cannot be mapped any more (its process exited)
 * leaves the context's own table, which holds no key, so every access
 * fails its key check as on a deregistered MR.
 */
static void set_mem(struct sv_target *t)
{
	const struct shm_hdr *s = t->seg;

	t->mseg = s->home_pid ? sv_seg_peer(s->home_ep, s->home_pid, s->home_start) : NULL;
	if (!t->mseg)
		t->mseg = t->seg;
	t->pid = t->mseg->pid;
}

/* The target QP qpn in t->seg, with its queues and memory. */
static enum sv_result find_qp(struct sv_target *t, uint32_t qpn)
{
	t->qseg = t->seg;
	t->qp = sv_seg_qp(t->seg, qpn);
	if (!t->qp)
		return SV_R_NO_RESPONSE;
	t->rx = t->qp;
	t->rcq_off = t->qp->rcq_off;
	t->wq_off = t->qp->srq_off ? t->qp->srq_off : t->qp->rq_off;
	t->wq_num = 0;
	set_mem(t);
	return SV_R_OK;
}

enum sv_result sv_resp_locate(struct sv_qp *qp, uint32_t qpn, struct sv_target *t)
{
	struct sv_reg_ep_info ep;

	/* No owner, no segment or no such QP: nothing answers (9.7.6). */
	if (sv_reg_qpn_owner(qpn, &ep))
		return SV_R_NO_RESPONSE;
	/* Nor does anything behind a port that is down, ours or the
	 * target's: the requester times out and retries (C9-140). */
	unsigned dev = qp->ctx->dev->index;
	bool ours = SV_PORT_DOWN(sv_reg_port(dev));
	if (ours || (ep.dev_index != dev && SV_PORT_DOWN(sv_reg_port(ep.dev_index)))) {
		snprintf(t->why, sizeof(t->why), "port 1 of %.40s is down (softverbs port %.40s/1 up)",
			 ours ? qp->ctx->dev->ibdev.name : "the target's device",
			 ours ? qp->ctx->dev->ibdev.name : "DEV");
		return SV_R_NO_RESPONSE;
	}
	struct sv_peer_cache *pc = &qp->peer;
	if (pc->seg && pc->ep == ep.index && pc->pid == ep.pid && pc->start_time == ep.start_time) {
		t->seg = pc->seg;
	} else {
		t->seg = sv_seg_peer(ep.index, ep.pid, ep.start_time);
		/* This process's own segments are unmapped when their context
		 * closes, so only peers' are remembered. */
		if (t->seg && ep.pid != sv_pid())
			*pc = (struct sv_peer_cache){ t->seg, ep.index, ep.pid, ep.start_time };
	}
	if (!t->seg)
		return SV_R_NO_RESPONSE;
	t->cache = &qp->map;
	t->own = qp->ctx->seg.h;
	t->tp = qp->ctx->tp_mem;
	return find_qp(t, qpn);
}

/* C10-29: a QP receives only in RTR, RTS and SQD; packets for a QP in
 * any other state are silently dropped. */
bool sv_resp_receiving(const struct shm_qp *qp)
{
	uint8_t st = atomic_load_explicit(&qp->state, memory_order_acquire);

	return st == IBV_QPS_RTR || st == IBV_QPS_RTS || st == IBV_QPS_SQD;
}

bool sv_resp_gone(const struct sv_target *t)
{
	/* qp_free() takes the QP out of RTR/RTS first (and out of the
	 * directory), before its owner can deregister anything. */
	return !sv_resp_receiving(t->qp);
}

enum sv_result sv_resp_find(struct sv_qp *qp, uint32_t qpn, struct sv_target *t)
{
	enum sv_result r = sv_resp_locate(qp, qpn, t);

	if (r != SV_R_OK)
		return r;
	enum ibv_qp_type type = qp->ex.qp_base.qp_type;
	/* An XRC initiator talks to an XRC target; other types to their own. */
	if (t->qp->type != (type == IBV_QPT_XRC_SEND ? IBV_QPT_XRC_RECV : type))
		return SV_R_NO_RESPONSE;
	return sv_resp_receiving(t->qp) ? SV_R_OK : SV_R_NO_RESPONSE;
}

enum sv_result sv_resp_xrc(struct sv_target *t, uint32_t srqn)
{
	struct sv_reg_ep_info ep;
	struct shm_hdr *seg = NULL;
	struct shm_qp *x = NULL;

	/* The SRQ may belong to another process than the target QP: a
	 * domain opened on one file spans processes, as in
	 * ibv_xsrq_pingpong -c 2, where a client's XRC_RECV QP delivers to
	 * the other client's SRQ. */
	if (!sv_reg_qpn_owner(srqn, &ep))
		seg = sv_seg_peer(ep.index, ep.pid, ep.start_time);
	if (seg)
		x = sv_seg_qp(seg, srqn);
	/* IBA 9.7.4.1.?: the XRCETH must name an XRC SRQ of the target QP's
	 * domain, else Invalid Request. */
	if (!x || x->type != SHM_TYPE_XSRQ || x->xrcd != t->qp->xrcd) {
		snprintf(t->why, sizeof(t->why), "remote_srqn 0x%x is %s target qpn 0x%x", srqn,
			 x && x->type == SHM_TYPE_XSRQ ? "an XRC SRQ of another domain than" :
			 "no XRC SRQ, as seen from", t->qp->qpn);
		return SV_R_NAK_INV_REQ;
	}
	/* From here the receiving context is the SRQ's: its buffers, its
	 * MRs (through the SRQ's PD), its CQ. */
	t->seg = seg;
	set_mem(t);
	t->rx = x;
	t->rcq_off = x->rcq_off;
	t->wq_off = x->srq_off;
	return SV_R_OK;
}

/*
 * Holding an MR: count ourselves in `users`, then re-check the key.  The
 * owner's deregistration stores key 0 and then waits for users to drain;
 * with sequentially consistent ordering on both sides, either we see key 0
 * or the owner sees us, so memory is never written after dereg returns.
 */
static struct shm_mr *hold_mr(const struct shm_hdr *h, uint32_t key)
{
	uint32_t idx = key >> 8;

	if (!idx || idx >= h->n_mrs)
		return NULL;
	struct shm_mr *m = &shm_mrs(h)[idx];
	if (atomic_load(&m->key) != key)
		return NULL;
	atomic_fetch_add(shm_mr_users(h, m), 1);
	if (atomic_load(&m->key) != key) {
		atomic_fetch_sub(shm_mr_users(h, m), 1);
		return NULL;
	}
	return m;
}

static void put_entry(const struct shm_hdr *h, struct shm_mr *m)
{
	if (m)
		atomic_fetch_sub(shm_mr_users(h, m), 1);
}

/*
 * The shared MR table entry peers check rkeys against (shm.h).  Publishing
 * writes every field and then the key; revoking stores key 0 and then
 * waits until no initiator is between its check and the end of its copy
 * (resp.c hold_mr), so after dereg returns no peer touches the memory.
 */
struct shm_mr *sv_key_entry(struct ibv_context *ctx, uint32_t key)
{
	return &shm_mrs(sv_ctx(ctx)->seg.h)[key >> 8];
}

static void drain_holders(const struct shm_hdr *h, struct shm_mr *e, uint32_t key)
{
	_Atomic uint32_t *users = shm_mr_users(h, e);
	uint64_t start = sv_now_ns();

	while (atomic_load(users)) {
		/* Holders finish one copy; only a peer that died mid-copy
		 * could hold on, and it can no longer write. */
		if (sv_now_ns() - start > 2000000000ull) {
			sv_warn("key 0x%x: a peer still holds it after 2 s; revoking anyway", key);
			atomic_store(users, 0);
			break;
		}
		sched_yield();
	}
}

void sv_key_revoke(const struct shm_hdr *h, struct shm_mr *e, uint32_t key)
{
	e->revoked_key = key;
	e->revoked_ns = sv_now_ns();
	atomic_store(&e->key, 0);
	drain_holders(h, e, key);
}

/* Another process's revoke (a dereg through an import): only while the
 * entry still holds this key, which its owner may have revoked or reused
 * meanwhile.  The compare-and-swap is sequentially consistent, as the
 * owner's store is. */
bool sv_key_revoke_if(const struct shm_hdr *h, struct shm_mr *e, uint32_t key)
{
	uint32_t expect = key;

	if (!atomic_compare_exchange_strong(&e->key, &expect, 0))
		return false;
	e->revoked_key = key;
	e->revoked_ns = sv_now_ns();
	drain_holders(h, e, key);
	return true;
}

/* The MR a held window lies in.  Its fields are stable while the window
 * is held: a rebind first revokes, and waits for holders. */
static struct shm_mr *window_mr(const struct shm_hdr *h, const struct shm_mr *w)
{
	return &shm_mrs(h)[w->mw.mr_key >> 8];
}

void sv_resp_mr_put(const struct shm_hdr *h, struct shm_mr *mr)
{
	if (mr && mr->kind != SHM_KIND_MR)
		put_entry(h, window_mr(h, mr));
	put_entry(h, mr);
}

/* This process's address for target address va of held MR m, when the
 * direct path applies: from the QP's cache while m is the same
 * registration, else from direct.c, which maps the whole MR. */
static void *direct_map(struct sv_target *t, const struct shm_mr *m, uint64_t va)
{
	struct sv_map_cache *c = t->cache;

	/* Another process's GPU memory is reached only this way, whatever
	 * copy path is chosen for host memory; gpu_ipc.c keeps what it
	 * opened, and closes it when the MR goes. */
	if (m->mem == SHM_MEM_CUDA)
		return t->pid == sv_pid() ? NULL :
		       t->tp->map_gpu(t->mseg, m, va, t->own, t->why, sizeof(t->why));
	if (!try_direct(t))
		return NULL;
	if (c->mr != m || c->key != atomic_load_explicit(&m->key, memory_order_relaxed) ||
	    c->addr != m->addr || c->length != m->length || c->share_off != m->share_off)
		*c = (struct sv_map_cache){ m, atomic_load_explicit(&m->key, memory_order_relaxed),
					    m->addr, m->length, m->share_off,
					    t->tp->map(t->mseg, m, m->addr, m->length) };
	return c->base ? c->base + (va - m->addr) : NULL;
}

/* [va, va + len) inside the MR's IOVA range, without overflow. */
static bool in_bounds(const struct shm_mr *m, uint64_t va, uint64_t len)
{
	return va >= m->iova && len <= m->length && va - m->iova <= m->length - len;
}

static const char *access_name(unsigned access)
{
	return access & IBV_ACCESS_REMOTE_ATOMIC ? "atomic" :
	       access & IBV_ACCESS_REMOTE_READ ? "read" : "write";
}

static void explain_rkey(struct sv_target *t, const struct shm_mr *m, uint32_t rkey,
			 uint64_t va, uint64_t len, unsigned access)
{
	uint32_t idx = rkey >> 8;

	if (!m) {
		const struct shm_mr *e = idx && idx < t->mseg->n_mrs ? &shm_mrs(t->mseg)[idx] : NULL;
		bool win = e && e->kind != SHM_KIND_MR;
		if (e && e->revoked_key == rkey)
			snprintf(t->why, sizeof(t->why), "%s 0x%x was %s %.3f ms ago by pid %d",
				 win ? "window rkey" : "rkey", rkey, win ? "invalidated or rebound" :
				 "deregistered", (double)(sv_now_ns() - e->revoked_ns) / 1e6,
				 (int)t->mseg->pid);
		else
			snprintf(t->why, sizeof(t->why), "rkey 0x%x is not %s in pid %d", rkey,
				 win ? "a bound window" : "registered", (int)t->mseg->pid);
	} else if (m->pd != t->rx->pd) {
		snprintf(t->why, sizeof(t->why), "rkey 0x%x belongs to another PD than target qpn 0x%x",
			 rkey, t->qp->qpn);
	} else if ((m->access & access) != access) {
		snprintf(t->why, sizeof(t->why), "rkey 0x%x was registered without "
			 "IBV_ACCESS_REMOTE_%s", rkey, access & IBV_ACCESS_REMOTE_ATOMIC ? "ATOMIC" :
			 access & IBV_ACCESS_REMOTE_READ ? "READ" : "WRITE");
	} else {
		snprintf(t->why, sizeof(t->why), "[0x%llx, +%llu) is outside rkey 0x%x's region "
			 "[0x%llx, +%llu)", (unsigned long long)va, (unsigned long long)len, rkey,
			 (unsigned long long)m->iova, (unsigned long long)m->length);
	}
}

enum sv_result sv_resp_mr_get(struct sv_target *t, uint32_t rkey, uint64_t va, uint64_t len,
			      unsigned access, struct shm_mr **mr, void **addr)
{
	*mr = NULL;
	*addr = NULL;
	/* C9-88: the QP must allow the remote access at all. */
	if ((atomic_load_explicit(&t->qp->access, memory_order_relaxed) & access) != access) {
		snprintf(t->why, sizeof(t->why), "target qpn 0x%x was not given remote %s access "
			 "(qp_access_flags)", t->qp->qpn, access_name(access));
		return SV_R_NAK_ACCESS;
	}
	/* IBA 9.4.3: a zero-length RDMA carries no address to check. */
	if (!len)
		return SV_R_OK;
	struct shm_mr *m = hold_mr(t->mseg, rkey), *region = m;
	if (m && m->kind != SHM_KIND_MR) {
		/* A window: also hold its MR, whose deregistration ends the
		 * window's access too.  A type 2 window answers only on the
		 * QP it was bound through (IBA 10.6.7.2, type 2B). */
		region = hold_mr(t->mseg, m->mw.mr_key);
		if (!region || (m->kind == SHM_KIND_MW2 && m->mw.qpn != t->qp->qpn)) {
			snprintf(t->why, sizeof(t->why), region ?
				 "window rkey 0x%x was bound through qpn 0x%x, not target qpn 0x%x" :
				 "window rkey 0x%x lies in MR key 0x%x, which was deregistered", rkey,
				 region ? m->mw.qpn : m->mw.mr_key, t->qp->qpn);
			put_entry(t->mseg, region);
			put_entry(t->mseg, m);
			return SV_R_NAK_ACCESS;
		}
	}
	/* C9-89..C9-91 (rxe check_rkey): unknown or stale key, another PD,
	 * missing rights, or outside the region: Remote Access Error. */
	if (!m || m->pd != t->rx->pd || (m->access & access) != access || !in_bounds(m, va, len)) {
		explain_rkey(t, m, rkey, va, len, access);
		sv_resp_mr_put(t->mseg, m);
		return SV_R_NAK_ACCESS;
	}
	/* SENDs left for the receiver to place land before this access
	 * (deferred placement, transport/shm/defer.c). */
	t->tp->defer_flush(t->mseg, t->own);
	*mr = m;
	uint64_t tva = m->addr + (va - m->iova);
	void *local = direct_map(t, region, tva);
	t->mapped = local != NULL;
	*addr = local ? local : (void *)(uintptr_t)tva;
	if (!local && region->mem == SHM_MEM_CUDA && t->pid != sv_pid()) {
		*mr = NULL;
		sv_resp_mr_put(t->mseg, m);
		return SV_R_NAK_OP;	/* t->why: what CUDA answered */
	}
	return SV_R_OK;
}

bool sv_resp_pop_locked(struct sv_target *t, struct shm_wq *wq, struct shm_rwqe *out)
{
	struct shm_rwqe *w = shm_wq_slot(t->seg, wq, wq->head);

	memcpy(out, w, sizeof(*w) + w->num_sge * sizeof(w->sge[0]));
	wq->head = (wq->head + 1) % wq->size;
	wq->count--;
	/* IBA 10.2.9.3: dropping below an armed limit raises one event. */
	if (!wq->limit || wq->count >= wq->limit)
		return false;
	wq->limit = 0;
	atomic_store_explicit(&wq->limit_hit, 1, memory_order_release);
	return true;
}

enum sv_result sv_resp_take_recv(struct sv_target *t, struct shm_rwqe *out)
{
	struct shm_wq *wq = shm_at(t->seg, t->wq_off);

	if (wq->lockfree)	/* 9.7.5.2.8: no receive WQE, RNR NAK */
		return sv_rq_take(t->seg, wq, out) ? SV_R_OK : SV_R_RNR;
	sv_shm_lock(&wq->lock);
	if (!wq->count) {
		sv_shm_unlock(&wq->lock);
		return SV_R_RNR;	/* 9.7.5.2.8: no receive WQE, RNR NAK */
	}
	bool ring = sv_resp_pop_locked(t, wq, out);
	sv_shm_unlock(&wq->lock);
	if (ring)
		sv_seg_ring(t->seg);
	return SV_R_OK;
}

enum sv_result sv_resp_recv_iov(struct sv_target *t, const struct shm_rwqe *w, struct iovec *iov,
				uint64_t *cap, struct shm_mr **held)
{
	*cap = 0;
	for (uint32_t i = 0; i < w->num_sge; i++) {
		const struct ibv_sge *s = &w->sge[i];
		struct shm_mr *m = s->length ? hold_mr(t->mseg, s->lkey) : NULL;

		held[i] = m;
		iov[i].iov_len = s->length;
		iov[i].iov_base = NULL;
		if (!s->length)
			continue;
		/* The receiver's own lkey: an MR with local write access in
		 * its PD (a window's rkey is no lkey). */
		if (!m || m->kind != SHM_KIND_MR || m->pd != t->rx->pd ||
		    !(m->access & IBV_ACCESS_LOCAL_WRITE) ||
		    !in_bounds(m, s->addr, s->length)) {
			sv_resp_recv_put(t, w, held);
			return SV_R_NAK_OP;
		}
		iov[i].iov_base = (void *)(uintptr_t)(m->addr + (s->addr - m->iova));
		*cap += s->length;
	}
	/* All of the buffer mapped here, or none of it.  Another process's
	 * GPU memory can only be mapped, so a buffer with some must be. */
	void *local[SV_MAX_SGE];
	bool gpu = false;
	for (uint32_t i = 0; i < w->num_sge; i++)
		gpu |= w->sge[i].length && held[i]->mem == SHM_MEM_CUDA;
	gpu &= t->pid != sv_pid();
	t->mapped = try_direct(t) || gpu;
	for (uint32_t i = 0; i < w->num_sge && t->mapped; i++) {
		local[i] = w->sge[i].length ? direct_map(t, held[i], (uintptr_t)iov[i].iov_base) : NULL;
		t->mapped = !w->sge[i].length || local[i];
	}
	if (gpu && !t->mapped) {
		if (!t->why[0])
			snprintf(t->why, sizeof(t->why), "receive wr_id 0x%llx mixes GPU "
				 "memory with private host memory of pid %d, which softverbs "
				 "cannot reach in one copy", (unsigned long long)w->wr_id,
				 (int)t->pid);
		sv_resp_recv_put(t, w, held);
		return SV_R_NAK_OP;
	}
	for (uint32_t i = 0; i < w->num_sge && t->mapped; i++)
		if (w->sge[i].length)
			iov[i].iov_base = local[i];
	return SV_R_OK;
}

void sv_resp_recv_put(struct sv_target *t, const struct shm_rwqe *w, struct shm_mr **held)
{
	for (uint32_t i = 0; i < w->num_sge; i++) {
		sv_resp_mr_put(t->mseg, held[i]);
		held[i] = NULL;
	}
}

void sv_resp_fail(struct sv_target *t, const struct shm_rwqe *wqe, enum ibv_wc_status status,
		  int ev)
{
	if (wqe) {
		struct shm_cqe e = { .wr_id = wqe->wr_id, .status = status, .opcode = IBV_WC_RECV,
				     .qp_num = t->qp->qpn };
		sv_cq_push(t->seg, shm_at(t->seg, t->rcq_off), &e);
	}
	/* No initiator may deliver to the QP from now on.  The owner applies
	 * the rest of the transition (flushes, events) on its next verb on
	 * the QP or from its progress thread, whichever comes first:
	 * err_pending 0 = nothing, 1 = ERR without an event, 2 + ev = ERR
	 * with affiliated event ev. */
	atomic_store_explicit(&t->qp->state, IBV_QPS_ERR, memory_order_release);
	atomic_store_explicit(&t->qp->err_pending, (uint32_t)(ev + 2), memory_order_release);
	sv_seg_ring(t->qseg);
	if (wqe && t->seg != t->qseg)
		sv_seg_ring(t->seg);	/* the SRQ owner delivers the completion's event */
}

int sv_resp_invalidate(struct sv_target *t, uint32_t rkey)
{
	uint32_t idx = rkey >> 8;
	struct shm_mr *m = idx && idx < t->mseg->n_mrs ? &shm_mrs(t->mseg)[idx] : NULL;
	uint32_t expect = rkey;

	/* o10-37.2.43..: only a bound type 2 window of the target QP's PD,
	 * through the QP it was bound to; MRs are not invalidated this way
	 * (softverbs has no fast-registration MRs). */
	if (!m || m->kind != SHM_KIND_MW2 || m->pd != t->rx->pd || m->mw.qpn != t->qp->qpn ||
	    !atomic_compare_exchange_strong(&m->key, &expect, 0)) {
		snprintf(t->why, sizeof(t->why), "SEND_WITH_INV names rkey 0x%x, which is not a type 2 "
			 "window bound through target qpn 0x%x", rkey, t->qp->qpn);
		return -1;
	}
	m->revoked_key = rkey;
	m->revoked_ns = sv_now_ns();
	return 0;
}

enum sv_result sv_resp_local(struct sv_context *c, uint32_t qpn, struct sv_target *t)
{
	/* The direct path is never taken into this process's own memory,
	 * so the map cache is only a place for resp.c to look. */
	static __thread struct sv_map_cache none;

	t->why[0] = 0;
	t->mapped = false;
	t->seg = t->own = c->seg.h;
	t->tp = c->tp_mem;
	t->cache = &none;
	if (find_qp(t, qpn) != SV_R_OK)
		return SV_R_NO_RESPONSE;
	return sv_resp_receiving(t->qp) ? SV_R_OK : SV_R_NO_RESPONSE;
}
