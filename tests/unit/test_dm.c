/* SPDX-License-Identifier: MIT */
/*
 * Device memory: allocation limits, the copy verbs' alignment and bounds
 * (mlx5's rules, which rdma-core's tests encode), MRs on device memory,
 * import by handle, and traffic into and out of it.  The cross-process
 * direct path into device memory is test_dataplane's sleeping target.
 */
#define _GNU_SOURCE
#include <stdio.h>

#include "helpers.h"
#include "pair.h"

static struct ibv_dm *dm_alloc(struct ibv_context *ctx, size_t len, uint32_t log_align)
{
	struct ibv_alloc_dm_attr a = { .length = len, .log_align_req = log_align };

	return ibv_alloc_dm(ctx, &a);
}

static void test_alloc_limits(void **state)
{
	struct fix *f = *state;
	struct ibv_device_attr_ex ax;

	assert_int_equal(ibv_query_device_ex(f->ctx, NULL, &ax), 0);
	assert_true(ax.max_dm_size >= 4096);
	struct ibv_dm *dm = dm_alloc(f->ctx, ax.max_dm_size, 0);
	assert_non_null(dm);
	assert_int_equal(ibv_free_dm(dm), 0);
	errno = 0;
	assert_null(dm_alloc(f->ctx, ax.max_dm_size + 1, 0));
	assert_int_equal(errno, ENOMEM);
	struct ibv_alloc_dm_attr bad = { .length = 64, .comp_mask = 1 };
	errno = 0;
	assert_null(ibv_alloc_dm(f->ctx, &bad));
	assert_int_equal(errno, EINVAL);
	errno = 0;
	assert_null(dm_alloc(f->ctx, 64, 20));
	assert_int_equal(errno, EINVAL);
	/* A requested alignment is honoured: the handle is the data offset
	 * in the segment, and every DM starts zeroed. */
	dm = dm_alloc(f->ctx, 100, 12);
	assert_non_null(dm);
	assert_int_equal(dm->handle % 4096, 0);
	char z[100], zero[100] = { 0 };
	assert_int_equal(ibv_memcpy_from_dm(z, dm, 0, 100), 0);
	assert_memory_equal(z, zero, 100);
	assert_int_equal(ibv_free_dm(dm), 0);
}

static const struct {
	const char *what;
	uint64_t off;
	size_t len;
	int want;
} copy_cases[] = {
	{ "aligned, inside", 4, 8, 0 },
	{ "the whole allocation", 0, 100, 0 },
	{ "unaligned offset", 1, 4, EINVAL },
	{ "unaligned length", 4, 3, EINVAL },
	{ "offset past the end", 104, 4, EINVAL },
	{ "length past the end", 0, 104, EINVAL },
	{ "offset + length wrapping", 8, SIZE_MAX - 3, EINVAL },
};

static void test_copy_bounds(void **state)
{
	struct fix *f = *state;
	struct ibv_dm *dm = dm_alloc(f->ctx, 100, 0);
	char buf[128];

	assert_non_null(dm);
	for (size_t i = 0; i < SV_ARRAY_LEN(copy_cases); i++) {
		size_t n = copy_cases[i].len > sizeof(buf) ? sizeof(buf) : copy_cases[i].len;
		print_message("  %s\n", copy_cases[i].what);
		memset(buf, (int)i + 1, n);
		assert_int_equal(ibv_memcpy_to_dm(dm, copy_cases[i].off, buf, copy_cases[i].len),
				 copy_cases[i].want);
		char back[128];
		assert_int_equal(ibv_memcpy_from_dm(back, dm, copy_cases[i].off, copy_cases[i].len),
				 copy_cases[i].want);
		if (!copy_cases[i].want)
			assert_memory_equal(back, buf, n);
	}
	assert_int_equal(ibv_free_dm(dm), 0);
}

static void test_dm_mr_rules(void **state)
{
	struct fix *f = *state;
	struct ibv_dm *dm = dm_alloc(f->ctx, 100, 0);
	int zb = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE;

	errno = 0;
	assert_null(ibv_reg_dm_mr(f->pd, dm, 0, 100, IBV_ACCESS_LOCAL_WRITE));
	assert_int_equal(errno, EINVAL);	/* not zero-based */
	errno = 0;
	assert_null(ibv_reg_dm_mr(f->pd, dm, 0, 104, zb));
	assert_int_equal(errno, EINVAL);	/* larger than the DM */
	errno = 0;
	assert_null(ibv_reg_dm_mr(f->pd, dm, 96, 8, zb));
	assert_int_equal(errno, EINVAL);	/* past its end */
	struct ibv_mr *mr = ibv_reg_dm_mr(f->pd, dm, 0, 100, zb);
	assert_non_null(mr);
	/* The DM is in use while an MR covers it; so is the PD. */
	assert_int_equal(ibv_free_dm(dm), EBUSY);
	assert_int_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
				      IBV_ACCESS_LOCAL_WRITE), -1);
	/* Imported by handle: the same bytes. */
	struct ibv_dm *imp = ibv_import_dm(f->ctx, dm->handle);
	assert_non_null(imp);
	uint32_t v = 0xabcdef01, w = 0;
	assert_int_equal(ibv_memcpy_to_dm(dm, 8, &v, 4), 0);
	assert_int_equal(ibv_memcpy_from_dm(&w, imp, 8, 4), 0);
	assert_int_equal(w, v);
	assert_int_equal(ibv_free_dm(imp), EINVAL);	/* the owner frees it */
	ibv_unimport_dm(imp);
	errno = 0;
	assert_null(ibv_import_dm(f->ctx, dm->handle + 64));
	assert_int_equal(errno, EINVAL);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	uint32_t handle = dm->handle;
	assert_int_equal(ibv_free_dm(dm), 0);
	/* A freed DM's handle imports nothing. */
	errno = 0;
	assert_null(ibv_import_dm(f->ctx, handle));
	assert_int_equal(errno, EINVAL);
}

/* SEND from device memory, RDMA WRITE into it, READ out of it. */
static void test_dm_traffic(void **state)
{
	(void)state;
	struct end a, b;
	int acc = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
		  IBV_ACCESS_REMOTE_READ;

	pair_up(&a, &b, &rc_default);
	struct ibv_dm *da = dm_alloc(a.ctx, 4096, 0), *db = dm_alloc(b.ctx, 4096, 0);
	struct ibv_mr *ma = ibv_reg_dm_mr(a.pd, da, 0, 4096, acc);
	struct ibv_mr *mb = ibv_reg_dm_mr(b.pd, db, 0, 4096, acc);
	assert_non_null(ma);
	assert_non_null(mb);
	char msg[64] = "from device memory";
	assert_int_equal(ibv_memcpy_to_dm(da, 0, msg, sizeof(msg)), 0);
	post_recv(&b, b.buf, 64, 1);
	assert_int_equal(post(&a, IBV_WR_SEND, 0, 64, ma->lkey, 0, 0, 2, IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_SUCCESS);
	assert_int_equal(poll_one(b.cq).status, IBV_WC_SUCCESS);
	assert_string_equal(b.buf, msg);
	/* WRITE into b's DM at zero-based offset 256, then READ it back. */
	assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, (void *)0, 64, ma->lkey, 256, mb->rkey, 3,
			      IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_SUCCESS);
	char got[64];
	assert_int_equal(ibv_memcpy_from_dm(got, db, 256, 64), 0);
	assert_string_equal(got, msg);
	assert_int_equal(post(&a, IBV_WR_RDMA_READ, (void *)128, 64, ma->lkey, 256, mb->rkey, 4,
			      IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_SUCCESS);
	assert_int_equal(ibv_memcpy_from_dm(got, da, 128, 64), 0);
	assert_string_equal(got, msg);
	/* Past the DM MR's end: a remote access error, as for any MR. */
	assert_int_equal(post(&a, IBV_WR_RDMA_WRITE, (void *)0, 64, ma->lkey, 4096 - 32, mb->rkey, 5,
			      IBV_SEND_SIGNALED), 0);
	assert_int_equal(poll_one(a.cq).status, IBV_WC_REM_ACCESS_ERR);
	ibv_dereg_mr(ma);
	ibv_dereg_mr(mb);
	assert_int_equal(ibv_free_dm(da), 0);
	assert_int_equal(ibv_free_dm(db), 0);
	end_close(&a);
	end_close(&b);
}

int main(void)
{
	devs = ibv_get_device_list(NULL);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_alloc_limits, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_copy_bounds, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_dm_mr_rules, fix_setup, fix_teardown),
		cmocka_unit_test(test_dm_traffic),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	ibv_free_device_list(devs);
	return r;
}
