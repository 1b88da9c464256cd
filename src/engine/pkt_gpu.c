/* SPDX-License-Identifier: MIT */
/*
 * GPU memory on the packet path.  The kernel can neither gather a
 * datagram from device memory nor place one into it, and a cuMemcpy
 * costs microseconds whatever its size, so packets are not copied to or
 * from the GPU one by one:
 *
 *   - received: the payloads of a run of packets bound for consecutive
 *     device addresses gather in the context's pinned staging area, and
 *     reach the device in one cuMemcpy when the run ends -- at the end of
 *     the received batch, before anything is acknowledged or completed,
 *     and before the responder reads memory for a READ or an atomic;
 *   - sent: a QP's payload is copied from the device a window at a time
 *     into its own pinned staging area, and its packets are gathered from
 *     there.
 *
 * Both run under the lock that serialises their side: the context's
 * rx_lock for reception, the QP's sq_lock for sending.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pkt.h"

#define RX_STAGE (1u << 20)
#define TX_STAGE (256u << 10)

struct pkt_gpu_rx {
	uint8_t *buf;
	bool pinned;
	void *ctx;			/* the context it was pinned in */
	char *dst;			/* the run: where its first byte goes */
	size_t len;
	struct pkt_qp *q;		/* whose data, to fail it if the copy does */
	struct sv_swqe *w;		/* a READ's WQE (requester), or NULL (responder) */
	uint32_t psn;
	const struct shm_hdr *mseg;	/* the responder's held MR, put after the copy */
	struct shm_mr *mr;
};

struct pkt_gpu_tx {
	uint8_t *buf;
	bool pinned;
	void *ctx;
	const struct sv_swqe *w;	/* whose bytes: the WQE and its first PSN */
	uint32_t psn;
	uint64_t off, len;		/* the message's bytes [off, off + len) */
};

static uint8_t *stage_alloc(size_t n, bool *pinned, void **ctx)
{
	uint8_t *b = aligned_alloc(4096, n);

	*pinned = b && !sv_gpu_pin(b, n, ctx);
	return b;
}

static void stage_free(uint8_t *b, bool pinned, void *ctx)
{
	if (pinned)
		sv_gpu_unpin(b, ctx);
	free(b);
}

struct pkt_qp *pkt_gpu_flush_held(struct pkt_ctx *pc, struct pkt_qp *held)
{
	struct pkt_gpu_rx *g = pc->gpu_rx;

	if (!g || !g->len)
		return NULL;
	struct iovec d = { g->dst, g->len }, s = { g->buf, g->len };
	int err = sv_copy_iov(&d, 1, &s, 1);
	if (g->mr)
		sv_resp_mr_put(g->mseg, g->mr);
	struct pkt_qp *q = g->q;
	struct sv_swqe *w = g->w;
	uint32_t psn = g->psn;
	g->len = 0;
	g->mr = NULL;
	if (err && w)
		pkt_req_gpu_failed(q, w, q == held);
	else if (err)
		pkt_resp_gpu_failed(q, psn);
	return err ? q : NULL;
}

void pkt_gpu_flush(struct pkt_ctx *pc)
{
	pkt_gpu_flush_held(pc, NULL);
}

void pkt_gpu_flush_resp(struct pkt_ctx *pc)
{
	if (pc->gpu_rx && pc->gpu_rx->len && !pc->gpu_rx->w)
		pkt_gpu_flush_held(pc, NULL);
}

bool pkt_gpu_put(struct pkt_qp *q, void *dst, const void *src, size_t len, struct sv_swqe *w,
		 uint32_t psn, const struct shm_hdr *mseg, struct shm_mr *mr)
{
	struct pkt_ctx *pc = q->pc;
	struct iovec d = { dst, len };

	if (!len || len > RX_STAGE || !sv_gpu_dev_iov(&d, 1))
		return false;
	struct pkt_gpu_rx *g = pc->gpu_rx;
	if (!g) {
		g = calloc(1, sizeof(*g));
		if (!g || !(g->buf = stage_alloc(RX_STAGE, &g->pinned, &g->ctx))) {
			free(g);
			return false;
		}
		pc->gpu_rx = g;
	}
	/* A run is one QP's consecutive bytes of one MR. */
	if (g->len && (g->q != q || g->w != w || g->mr != mr || (char *)dst != g->dst + g->len ||
		       g->len + len > RX_STAGE))
		pkt_gpu_flush(pc);
	if (!g->len) {
		g->dst = dst;
		g->q = q;
		g->w = w;
		g->psn = psn;
		g->mseg = mseg;
		g->mr = mr;	/* the run holds it until the copy */
	} else if (mr) {
		sv_resp_mr_put(mseg, mr);	/* the run holds that entry already */
	}
	memcpy(g->buf + g->len, src, len);
	g->len += len;
	return true;
}

const void *pkt_gpu_tx(struct pkt_qp *q, const struct sv_swqe *w, const struct iovec *liov,
		       int nl, uint64_t len, uint64_t off, uint64_t plen)
{
	struct pkt_gpu_tx *g = q->gpu_tx;

	if (!g) {
		g = calloc(1, sizeof(*g));
		if (!g || !(g->buf = stage_alloc(TX_STAGE, &g->pinned, &g->ctx))) {
			free(g);
			return NULL;
		}
		q->gpu_tx = g;
	}
	if (g->w != w || g->psn != w->psn || off < g->off || off + plen > g->off + g->len) {
		/* Packets queued in the link may still point into the stage. */
		pkt_flush(q);
		struct iovec part[SV_MAX_SGE + 1];
		uint64_t n = len - off < TX_STAGE ? len - off : TX_STAGE;
		int np = sv_iov_slice(liov, nl, off, n, part);
		struct iovec b = { g->buf, n };
		g->w = NULL;
		int err = sv_copy_iov(&b, 1, part, np);
		if (err || plen > n)
			return NULL;
		g->w = w;
		g->psn = w->psn;
		g->off = off;
		g->len = n;
	}
	return g->buf + (off - g->off);
}

void pkt_gpu_qp_free(struct pkt_qp *q)
{
	struct pkt_gpu_tx *g = q->gpu_tx;

	if (!g)
		return;
	stage_free(g->buf, g->pinned, g->ctx);
	free(g);
	q->gpu_tx = NULL;
}

void pkt_gpu_ctx_free(struct pkt_ctx *pc)
{
	struct pkt_gpu_rx *g = pc->gpu_rx;

	if (!g)
		return;
	pkt_gpu_flush(pc);
	stage_free(g->buf, g->pinned, g->ctx);
	free(g);
	pc->gpu_rx = NULL;
}
