/* SPDX-License-Identifier: MIT */
/*
 * Imports (rdma-core 44): a second context on a context's command fd, and
 * its PD, MR and DM by handle, used together with the original's objects;
 * and the lifetime rule that the shared state lives until the original
 * and every import are closed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>

#include "helpers.h"
#include "pair.h"

static void test_import_objects(void **state)
{
	(void)state;
	struct end a, peer;

	end_open(&a, &rc_default);
	end_open(&peer, &rc_default);
	errno = 0;
	assert_null(ibv_import_device(-1));
	assert_int_equal(errno, EBADF);
	int other = open("/dev/null", O_RDWR);
	errno = 0;
	assert_null(ibv_import_device(other));
	assert_int_equal(errno, EOPNOTSUPP);	/* not a softverbs context of this process */
	close(other);

	struct ibv_context *b = ibv_import_device(dup(a.ctx->cmd_fd));
	assert_non_null(b);
	assert_ptr_not_equal(b, a.ctx);
	assert_ptr_equal(b->device, a.ctx->device);
	/* The PD and MR are the original objects, found by handle (so their
	 * context field names the original context). */
	struct ibv_pd *pd = ibv_import_pd(b, a.pd->handle);
	assert_ptr_equal(pd, a.pd);
	struct ibv_mr *mr = ibv_import_mr(pd, a.mr->handle);
	assert_ptr_equal(mr, a.mr);
	assert_int_equal(mr->rkey, a.mr->rkey);
	errno = 0;
	assert_null(ibv_import_pd(b, a.pd->handle + 1000));
	assert_int_equal(errno, EINVAL);
	errno = 0;
	assert_null(ibv_import_mr(pd, a.mr->handle + 0x100));
	assert_int_equal(errno, EINVAL);
	/* A PD of another context is not this context's to import. */
	errno = 0;
	assert_null(ibv_import_pd(b, peer.pd->handle));
	assert_int_equal(errno, EINVAL);

	/* Objects of the import work with the imported PD and MR: a QP and
	 * CQ of b, WRITE from peer into the imported MR, READ back by b. */
	struct ibv_cq *cq = ibv_create_cq(b, 16, NULL, NULL, 0);
	assert_non_null(cq);
	struct ibv_qp_init_attr_ex ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					  .cap = { 8, 8, 1, 1, 0 }, .pd = pd,
					  /* With only PD set, verbs.h routes to ibv_create_qp(pd). */
					  .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					  .send_ops_flags = IBV_QP_EX_WITH_RDMA_READ };
	struct ibv_qp *qp = ibv_create_qp_ex(b, &ia);
	assert_non_null(qp);
	assert_ptr_equal(qp->context, b);
	struct end bend = a;	/* b's side, with a's port and gid */
	bend.qp = qp;
	bend.cq = cq;
	connect_qp(qp, &peer, peer.qp->qp_num, &rc_default);
	connect_qp(peer.qp, &bend, qp->qp_num, &rc_default);
	strcpy(peer.buf, "into an imported MR");
	assert_int_equal(post(&peer, IBV_WR_RDMA_WRITE, peer.buf, 32, peer.mr->lkey,
			      (uintptr_t)a.buf + 64, mr->rkey, 1, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(peer.cq).status, IBV_WC_SUCCESS);
	assert_string_equal(a.buf + 64, "into an imported MR");
	assert_int_equal(post(&bend, IBV_WR_RDMA_READ, a.buf + 256, 32, mr->lkey,
			      (uintptr_t)peer.buf, peer.mr->rkey, 2, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(cq).status, IBV_WC_SUCCESS);
	assert_string_equal(a.buf + 256, "into an imported MR");

	/* Device memory by handle, through the import. */
	struct ibv_alloc_dm_attr da = { .length = 64 };
	struct ibv_dm *dm = ibv_alloc_dm(a.ctx, &da);
	struct ibv_dm *idm = ibv_import_dm(b, dm->handle);
	assert_non_null(idm);
	uint32_t v = 7, w = 0;
	assert_int_equal(ibv_memcpy_to_dm(dm, 0, &v, 4), 0);
	assert_int_equal(ibv_memcpy_from_dm(&w, idm, 0, 4), 0);
	assert_int_equal(w, 7);
	ibv_unimport_dm(idm);
	assert_int_equal(ibv_free_dm(dm), 0);

	/* Closing the original first: the import still works (the kernel
	 * keeps a context while an imported fd holds it). */
	ibv_unimport_mr(mr);
	ibv_unimport_pd(pd);
	assert_int_equal(ibv_destroy_qp(peer.qp), 0);
	peer.qp = NULL;
	a.qp = NULL;
	assert_int_equal(ibv_destroy_qp(qp), 0);
	assert_int_equal(ibv_close_device(a.ctx), 0);
	struct ibv_wc wc;
	assert_int_equal(ibv_poll_cq(cq, 1, &wc), 0);
	struct ibv_pd *pd2 = ibv_alloc_pd(b);
	assert_non_null(pd2);
	assert_int_equal(ibv_close_device(b), 0);	/* frees pd2, cq and the original's state */
	free(a.buf);
	end_close(&peer);
}

int main(void)
{
	devs = ibv_get_device_list(NULL);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_import_objects),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	ibv_free_device_list(devs);
	return r;
}
