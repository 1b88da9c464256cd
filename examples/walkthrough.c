/* SPDX-License-Identifier: MIT */
/*
 * The verbs control plane, step by step, as an RDMA program does it:
 *
 *   device list -> open -> PD -> MR -> CQ -> QP -> RESET -> INIT -> RTR -> RTS
 *
 * and the seed's QP-state pitfall: skipping INIT is refused with EINVAL,
 * and SOFTVERBS_EXPLAIN=1 says why.  This program talks only verbs.h; run
 * it on softverbs with `softverbs run -- ./walkthrough` or with
 * LD_LIBRARY_PATH=build/lib.
 *
 * Both ends of the connection are in this process: the QP is connected to
 * itself (loopback), so no out-of-band exchange is needed to show the
 * state machine.
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, what)                                                     \
	do {                                                                  \
		if (!(cond)) {                                                \
			fprintf(stderr, "walkthrough: %s failed: %s\n", what, \
				strerror(errno));                             \
			exit(1);                                              \
		}                                                             \
	} while (0)

static void step(int n, const char *what)
{
	printf("%2d. %s\n", n, what);
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_port_attr port;
	union ibv_gid gid;
	int n, ret;

	list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "ibv_get_device_list");
	step(1, "ibv_get_device_list: the RDMA devices of this host");
	for (int i = 0; i < n; i++)
		printf("      %s\n", ibv_get_device_name(list[i]));

	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device");
	step(2, "ibv_open_device: a context, the program's handle on the device");

	CHECK(!ibv_query_port(ctx, 1, &port), "ibv_query_port");
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "ibv_query_gid");
	printf("      port 1 %s, link layer %s, LID 0x%04x, active MTU %d\n",
	       ibv_port_state_str(port.state),
	       port.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" : "InfiniBand",
	       port.lid, 128 << port.active_mtu);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");
	step(3, "ibv_alloc_pd: a protection domain groups MRs and QPs");

	size_t len = 4096;
	char *buf = calloc(1, len);
	CHECK(buf, "calloc");
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(mr, "ibv_reg_mr");
	step(4, "ibv_reg_mr: register memory; the peer needs rkey and address");
	printf("      addr %p  length %zu  lkey 0x%x  rkey 0x%x\n", mr->addr, mr->length,
	       mr->lkey, mr->rkey);

	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq, "ibv_create_cq");
	step(5, "ibv_create_cq: completions of both queues land here");

	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp, "ibv_create_qp");
	step(6, "ibv_create_qp: an RC queue pair, born in RESET");
	printf("      QPN 0x%06x, max_inline_data %u\n", qp->qp_num, ia.cap.max_inline_data);

	/* The pitfall: RESET -> RTR skips INIT. */
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	printf("    ! RESET -> RTR directly: ibv_modify_qp returned %d (%s), QP still %s\n",
	       ret, strerror(ret), qp->state == IBV_QPS_RESET ? "RESET" : "changed!");
	CHECK(ret == EINVAL, "the skipped state to be refused");

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_ACCESS_FLAGS);
	errno = ret;
	CHECK(!ret, "modify_qp RESET->INIT");
	step(7, "RESET -> INIT: port, P_Key index, remote access rights");

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = port.active_mtu;
	a.dest_qp_num = qp->qp_num;	/* loopback: the peer is this QP */
	a.rq_psn = 0x1234;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.port_num = 1;
	a.ah_attr.dlid = port.lid;
	if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = gid;
		a.ah_attr.grh.hop_limit = 64;
	}
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	errno = ret;
	CHECK(!ret, "modify_qp INIT->RTR");
	step(8, "INIT -> RTR: the peer's address (LID or GID), QPN and starting PSN");

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x1234;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
			    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
	errno = ret;
	CHECK(!ret, "modify_qp RTR->RTS");
	step(9, "RTR -> RTS: timeouts, retry counts, send PSN; the QP can now send");

	struct ibv_qp_init_attr qi;
	CHECK(!ibv_query_qp(qp, &a, IBV_QP_STATE, &qi), "ibv_query_qp");
	printf("      ibv_query_qp: state %s, dest QPN 0x%06x, sq_psn 0x%x\n",
	       a.qp_state == IBV_QPS_RTS ? "RTS" : "?", a.dest_qp_num, a.sq_psn);

	CHECK(!ibv_destroy_qp(qp), "ibv_destroy_qp");
	CHECK(!ibv_destroy_cq(cq), "ibv_destroy_cq");
	CHECK(!ibv_dereg_mr(mr), "ibv_dereg_mr");
	CHECK(!ibv_dealloc_pd(pd), "ibv_dealloc_pd");
	CHECK(!ibv_close_device(ctx), "ibv_close_device");
	ibv_free_device_list(list);
	free(buf);
	step(10, "teardown in reverse order: QP, CQ, MR, PD, context");
	return 0;
}
