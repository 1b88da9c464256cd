/* SPDX-License-Identifier: MIT */
/*
 * Memory registration: the access-flag rules, key staleness, unmapped
 * memory, and rereg.
 */
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "helpers.h"
#include "sv.h"

#define LW IBV_ACCESS_LOCAL_WRITE
#define RW IBV_ACCESS_REMOTE_WRITE
#define RR IBV_ACCESS_REMOTE_READ
#define RA IBV_ACCESS_REMOTE_ATOMIC

/* IBA 10.6.3.1 (C10-46 and the kernel's ib_check_mr_access): remote
 * write or atomic access needs local write; optional bits are hints. */
static const struct { int access; int err; const char *why; } access_cases[] = {
	{ 0, 0, "no access at all is a valid local-read MR" },
	{ LW, 0, "local write" },
	{ RR, 0, "remote read needs nothing else" },
	{ LW | RW, 0, "remote write with local write" },
	{ LW | RA, 0, "remote atomic with local write" },
	{ LW | RW | RR | RA, 0, "everything" },
	{ RW, EINVAL, "remote write without local write" },
	{ RA, EINVAL, "remote atomic without local write" },
	{ RW | RR, EINVAL, "remote write+read without local write" },
	{ RA | RR, EINVAL, "remote atomic+read without local write" },
	{ LW | IBV_ACCESS_RELAXED_ORDERING, 0, "relaxed ordering is ignored" },
	{ LW | RW | (1 << 25), 0, "any optional-range bit is ignored" },
	{ LW | IBV_ACCESS_MW_BIND, 0, "MW bind right" },
	{ LW | IBV_ACCESS_HUGETLB, 0, "hugetlb hint" },
	{ LW | (1 << 12), EINVAL, "an unknown, non-optional bit" },
	{ LW | IBV_ACCESS_ON_DEMAND, 0, "on-demand paging" },
	{ RW | IBV_ACCESS_ON_DEMAND, EINVAL, "ODP does not lift the local-write rule" },
};

static void test_access_rules(void **state)
{
	struct fix *f = *state;
	static char buf[8192];

	for (size_t i = 0; i < sizeof(access_cases) / sizeof(access_cases[0]); i++) {
		errno = 0;
		struct ibv_mr *mr = ibv_reg_mr_iova2(f->pd, buf, sizeof(buf), (uintptr_t)buf,
						     (unsigned)access_cases[i].access);
		if (access_cases[i].err) {
			if (mr)
				fail_msg("accepted: %s", access_cases[i].why);
			assert_int_equal(errno, access_cases[i].err);
		} else {
			if (!mr)
				fail_msg("refused (%d): %s", errno, access_cases[i].why);
			assert_ptr_equal(mr->addr, buf);
			assert_int_equal(mr->length, sizeof(buf));
			assert_int_equal(mr->lkey, mr->rkey);
			assert_int_equal(ibv_dereg_mr(mr), 0);
		}
	}
}

static void test_keys_go_stale(void **state)
{
	struct fix *f = *state;
	struct sv_context *c = sv_ctx(f->ctx);
	static char buf[4096];
	uint32_t seen[512];

	/* Register and deregister repeatedly: a deregistered key must never
	 * resolve again, even once its slot has been reused. */
	for (int i = 0; i < 512; i++) {
		struct ibv_mr *mr = ibv_reg_mr(f->pd, buf, sizeof(buf), LW);
		assert_non_null(mr);
		assert_ptr_equal(sv_keytab_lookup(&c->mrs, mr->lkey, SHM_KIND_MR), mr);
		seen[i] = mr->lkey;
		assert_int_equal(ibv_dereg_mr(mr), 0);
		assert_null(sv_keytab_lookup(&c->mrs, seen[i], SHM_KIND_MR));
		for (int j = 0; j < i; j++)
			assert_int_not_equal(seen[j], seen[i]);
	}
	assert_null(sv_keytab_lookup(&c->mrs, 0, SHM_KIND_MR));
}

static void test_keytab_reuse_order(void **state)
{
	(void)state;
	struct sv_keytab t;
	uint32_t a, b, a2;
	int x, y;

	assert_int_equal(sv_keytab_init(&t, 4), 0);
	assert_int_equal(sv_keytab_alloc(&t, &x, 0, &a), 0);
	assert_int_equal(sv_keytab_alloc(&t, &y, 0, &b), 0);
	sv_keytab_free(&t, a);
	/* The freed slot goes to the back of the queue. */
	assert_int_equal(sv_keytab_alloc(&t, &x, 0, &a2), 0);
	assert_int_not_equal(a2 >> 8, a >> 8);
	assert_null(sv_keytab_lookup(&t, a, 0));
	assert_ptr_equal(sv_keytab_lookup(&t, b, 0), &y);
	/* Index right, key byte wrong: a miss. */
	assert_null(sv_keytab_lookup(&t, (b & ~0xffu) | ((b + 1) & 0xff), 0));
	/* The table is bounded by its maximum. */
	uint32_t k;
	assert_int_equal(sv_keytab_alloc(&t, &x, 0, &k), 0);
	assert_int_equal(sv_keytab_alloc(&t, &x, 0, &k), 0);
	assert_int_equal(sv_keytab_alloc(&t, &x, 0, &k), ENOMEM);
	sv_keytab_destroy(&t);
}

static void test_unmapped_is_efault(void **state)
{
	struct fix *f = *state;
	long pg = sysconf(_SC_PAGESIZE);
	char *m = mmap(NULL, (size_t)pg * 3, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	assert_true(m != MAP_FAILED);
	assert_int_equal(munmap(m + pg, (size_t)pg), 0);	/* a hole in the middle */
	errno = 0;
	assert_null(ibv_reg_mr(f->pd, m, (size_t)pg * 3, LW));
	assert_int_equal(errno, EFAULT);
	errno = 0;
	assert_null(ibv_reg_mr(f->pd, NULL, 4096, LW));
	assert_int_equal(errno, EFAULT);
	errno = 0;
	assert_null(ibv_reg_mr(f->pd, m, 0, LW));
	assert_int_equal(errno, EINVAL);
	/* The mapped pages on either side register fine. */
	struct ibv_mr *mr = ibv_reg_mr(f->pd, m + 2 * pg, (size_t)pg, LW);
	assert_non_null(mr);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	munmap(m, (size_t)pg);
	munmap(m + 2 * pg, (size_t)pg);
}

/* ib_umem_get pins with FOLL_WRITE for any access that lets the MR be
 * written: a read-only page is EFAULT then, and fine for read-only access
 * (also through rereg, both ways in). */
static void test_read_only_pages(void **state)
{
	struct fix *f = *state;
	long pg = sysconf(_SC_PAGESIZE);
	char *m = mmap(NULL, (size_t)pg * 3, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	static const int writing[] = { LW, LW | RW, LW | RA, LW | IBV_ACCESS_MW_BIND };

	assert_true(m != MAP_FAILED);
	assert_int_equal(mprotect(m + pg, (size_t)pg, PROT_READ), 0);	/* the middle page */
	for (size_t i = 0; i < SV_ARRAY_LEN(writing); i++) {
		errno = 0;
		assert_null(ibv_reg_mr(f->pd, m, (size_t)pg * 3, writing[i]));
		assert_int_equal(errno, EFAULT);
	}
	struct ibv_mr *ro = ibv_reg_mr(f->pd, m, (size_t)pg * 3, RR);
	assert_non_null(ro);
	assert_int_equal(ibv_rereg_mr(ro, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, LW), IBV_REREG_MR_ERR_CMD);
	struct ibv_mr *rw = ibv_reg_mr(f->pd, m + 2 * pg, (size_t)pg, LW);
	assert_non_null(rw);
	assert_int_equal(ibv_rereg_mr(rw, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, m, (size_t)pg * 2, 0),
			 IBV_REREG_MR_ERR_CMD);
	/* An ODP MR proves nothing at registration. */
	struct ibv_mr *odp = ibv_reg_mr(f->pd, m, (size_t)pg * 3, LW | IBV_ACCESS_ON_DEMAND);
	assert_non_null(odp);
	assert_int_equal(ibv_dereg_mr(odp), 0);
	assert_int_equal(ibv_dereg_mr(rw), 0);
	assert_int_equal(ibv_dereg_mr(ro), 0);
	munmap(m, (size_t)pg * 3);
}

static void test_large_mr_no_pinning(void **state)
{
	struct fix *f = *state;
	/* 1 GiB of untouched anonymous memory: nothing is pinned, so this
	 * works whatever RLIMIT_MEMLOCK is, and costs no resident memory. */
	size_t len = 1ul << 30;
	char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		       -1, 0);

	assert_true(m != MAP_FAILED);
	struct ibv_mr *mr = ibv_reg_mr(f->pd, m, len, LW | RW);
	assert_non_null(mr);
	assert_int_equal(mr->length, len);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	munmap(m, len);
}

static void test_odp(void **state)
{
	struct fix *f = *state;
	long pg = sysconf(_SC_PAGESIZE);
	char *m = mmap(NULL, (size_t)pg * 4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_device_attr_ex x;

	assert_int_equal(ibv_query_device_ex(f->ctx, NULL, &x), 0);
	assert_true(x.odp_caps.general_caps & IBV_ODP_SUPPORT);
	assert_true(x.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT);
	assert_true(x.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_WRITE);
	/* An ODP MR may cover memory that is not mapped (yet). */
	assert_int_equal(munmap(m + pg, (size_t)pg), 0);
	struct ibv_mr *mr = ibv_reg_mr(f->pd, m, (size_t)pg * 4, LW | RW | IBV_ACCESS_ON_DEMAND);
	assert_non_null(mr);
	/* Implicit ODP: the whole address space. */
	struct ibv_mr *all = ibv_reg_mr(f->pd, NULL, SIZE_MAX, LW | IBV_ACCESS_ON_DEMAND);
	assert_non_null(all);
	assert_int_equal(all->length, SIZE_MAX);
	/* Prefetch accepts ODP MRs only. */
	struct ibv_sge sge = { (uintptr_t)m, 64, mr->lkey };
	assert_int_equal(ibv_advise_mr(f->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
				       IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1), 0);
	static char plain[64];
	struct ibv_mr *pmr = ibv_reg_mr(f->pd, plain, sizeof(plain), LW);
	sge.lkey = pmr->lkey;
	assert_int_equal(ibv_advise_mr(f->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1), EINVAL);
	assert_int_equal(ibv_dereg_mr(pmr), 0);
	assert_int_equal(ibv_dereg_mr(all), 0);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	munmap(m, (size_t)pg);
	munmap(m + 2 * pg, (size_t)pg * 2);
}

static void test_parent_domain(void **state)
{
	struct fix *f = *state;
	struct ibv_td_init_attr ta = { 0 };
	struct ibv_td *td = ibv_alloc_td(f->ctx, &ta);
	assert_non_null(td);
	struct ibv_parent_domain_init_attr pa = { .pd = f->pd, .td = td };
	struct ibv_pd *pdom = ibv_alloc_parent_domain(f->ctx, &pa);
	assert_non_null(pdom);
	/* Its protection is its parent's: an MR of the parent serves a QP
	 * of the parent domain. */
	assert_int_equal(pdom->handle, f->pd->handle);
	/* In use: neither the TD nor the parent PD can go first. */
	assert_int_equal(ibv_dealloc_td(td), EBUSY);
	assert_int_equal(ibv_dealloc_pd(f->pd), EBUSY);
	/* A parent domain of a parent domain is refused. */
	pa.pd = pdom;
	pa.td = NULL;
	errno = 0;
	assert_null(ibv_alloc_parent_domain(f->ctx, &pa));
	assert_int_equal(errno, EINVAL);
	assert_int_equal(ibv_dealloc_pd(pdom), 0);
	/* (A second ibv_dealloc_td would be the application's own
	 * use-after-free: the verbs.h inline reads td->context first.) */
	assert_int_equal(ibv_dealloc_td(td), 0);
}

static void test_rereg(void **state)
{
	struct fix *f = *state;
	static char a[4096], b[8192];
	struct ibv_pd *pd2 = ibv_alloc_pd(f->ctx);
	struct ibv_mr *mr = ibv_reg_mr(f->pd, a, sizeof(a), LW);

	assert_non_null(mr);
	assert_int_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, b, sizeof(b), 0), 0);
	assert_ptr_equal(mr->addr, b);
	assert_int_equal(mr->length, sizeof(b));
	assert_int_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0), 0);
	assert_ptr_equal(mr->pd, pd2);
	/* The PD now has a user; the old one has none. */
	assert_int_equal(ibv_dealloc_pd(pd2), EBUSY);
	/* Bad input: no flags, bad access, unmapped translation. */
	assert_true(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) < 0);
	assert_true(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, RW) < 0);
	assert_int_equal(errno, EINVAL);
	assert_true(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 10, 0) < 0);
	/* A failed rereg changed nothing. */
	assert_ptr_equal(mr->addr, b);
	assert_ptr_equal(mr->pd, pd2);
	assert_int_equal(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, LW | RW), 0);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	assert_int_equal(ibv_dealloc_pd(pd2), 0);
}

static void test_rereg_foreign_pd(void **state)
{
	struct fix *f = *state;
	static char a[4096];
	struct ibv_context *other = ibv_open_device(f->list[0]);
	struct ibv_pd *opd = ibv_alloc_pd(other);
	struct ibv_mr *mr = ibv_reg_mr(f->pd, a, sizeof(a), LW);

	assert_non_null(mr);
	errno = 0;
	assert_true(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, opd, NULL, 0, 0) < 0);
	assert_int_equal(errno, EINVAL);
	assert_ptr_equal(mr->pd, f->pd);
	assert_int_equal(ibv_dereg_mr(mr), 0);
	assert_int_equal(ibv_dereg_mr(mr), EINVAL);	/* twice */
	assert_int_equal(ibv_dealloc_pd(opd), 0);
	assert_int_equal(ibv_close_device(other), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_access_rules, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_keys_go_stale, fix_setup, fix_teardown),
		cmocka_unit_test(test_keytab_reuse_order),
		cmocka_unit_test_setup_teardown(test_unmapped_is_efault, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_read_only_pages, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_large_mr_no_pinning, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_odp, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_parent_domain, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_rereg, fix_setup, fix_teardown),
		cmocka_unit_test_setup_teardown(test_rereg_foreign_pd, fix_setup, fix_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
