/* SPDX-License-Identifier: MIT */
/*
 * The host registry under process death and concurrency: entries of a
 * process killed with SIGKILL are reclaimed, a process killed at any
 * instant (even holding the registry lock) leaves it consistent, and
 * concurrent QP creation from several processes never hands one QPN to
 * two QPs.  Runs against a private registry (SOFTVERBS_REGISTRY).
 */
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"
#include "sv.h"

static struct sv_reg_qp_info qps[SV_HOST_MAX_QP];
static struct sv_reg_ep_info eps[SV_HOST_MAX_ENDPOINTS];

static int count_pid_qps(pid_t pid)
{
	int n = sv_reg_list_qps(qps, SV_HOST_MAX_QP), c = 0;

	for (int i = 0; i < n; i++)
		c += qps[i].pid == pid;
	return c;
}

static int count_pid_eps(pid_t pid)
{
	int n = sv_reg_list_eps(eps, SV_HOST_MAX_ENDPOINTS), c = 0;

	for (int i = 0; i < n; i++)
		c += eps[i].pid == pid;
	return c;
}

static void child_hold_qps(int fd, int nqps)
{
	struct fix *f;
	fix_setup((void **)&f);
	for (int i = 0; i < nqps; i++) {
		struct ibv_qp *qp = fix_qp(f, IBV_QPT_RC);
		if (write(fd, &qp->qp_num, sizeof(qp->qp_num)) != sizeof(qp->qp_num))
			_exit(3);
	}
	for (;;)
		pause();
}

static void test_kill9_reclaim(void **state)
{
	(void)state;
	int p[2];
	assert_int_equal(pipe(p), 0);
	pid_t pid = fix_fork();
	if (!pid)
		child_hold_qps(p[1], 5);
	uint32_t qpn[5];
	for (int i = 0; i < 5; i++)
		assert_int_equal(read(p[0], &qpn[i], sizeof(qpn[i])), sizeof(qpn[i]));
	assert_int_equal(count_pid_qps(pid), 5);
	assert_int_equal(count_pid_eps(pid), 1);
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, NULL, 0), pid);
	/* Still listed until somebody sweeps; then gone. */
	assert_int_equal(count_pid_qps(pid), 5);
	assert_int_equal(sv_reg_sweep(), 6);
	assert_int_equal(count_pid_qps(pid), 0);
	assert_int_equal(count_pid_eps(pid), 0);
	assert_null(sv_reg_check());
	close(p[0]);
	close(p[1]);
}

static void churn_forever(void)
{
	struct fix *f;
	struct ibv_qp *live[4] = { 0 };

	fix_setup((void **)&f);
	for (unsigned i = 0;; i++) {
		unsigned s = i % 4;
		if (live[s])
			ibv_destroy_qp(live[s]);
		live[s] = fix_qp(f, IBV_QPT_UD);
		if (i % 64 == 63) {	/* contexts come and go too */
			for (unsigned k = 0; k < 4; k++)
				assert_int_equal(ibv_destroy_qp(live[k]), 0);
			fix_teardown((void **)&f);
			memset(live, 0, sizeof(live));
			fix_setup((void **)&f);
		}
	}
}

static void test_kill_at_any_instant(void **state)
{
	(void)state;
	pid_t victims[40];
	struct timespec ts;

	srand((unsigned)getpid());
	for (int i = 0; i < 40; i++) {
		pid_t pid = fix_fork();
		if (!pid)
			churn_forever();
		victims[i] = pid;
		ts.tv_sec = 0;
		ts.tv_nsec = 1000000 + (rand() % 4000) * 1000;	/* 1..5 ms */
		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		int st;
		assert_int_equal(waitpid(pid, &st, 0), pid);
		/* Died of our SIGKILL, not of a failed check of its own. */
		assert_true(WIFSIGNALED(st));
		assert_int_equal(WTERMSIG(st), SIGKILL);
	}
	/* Whatever instant each died at -- mid-allocation, holding the lock --
	 * one sweep restores every invariant and frees all they held. */
	sv_reg_sweep();
	assert_null(sv_reg_check());
	for (int i = 0; i < 40; i++) {
		assert_int_equal(count_pid_qps(victims[i]), 0);
		assert_int_equal(count_pid_eps(victims[i]), 0);
	}
	/* And the registry still works. */
	struct fix *f;
	fix_setup((void **)&f);
	struct ibv_qp *qp = fix_qp(f, IBV_QPT_RC);
	assert_int_equal(count_pid_qps(getpid()), 1);
	assert_int_equal(ibv_destroy_qp(qp), 0);
	fix_teardown((void **)&f);
}

#define NPROC 6
#define ITERS 300

static int churn_checked(_Atomic int32_t *owner)
{
	struct fix *f;
	struct ibv_qp *live[8] = { 0 };
	int dups = 0;

	fix_setup((void **)&f);
	for (int i = 0; i < ITERS; i++) {
		int s = i % 8;
		if (live[s]) {
			/* Release the claim before the QPN can be reused. */
			atomic_store(&owner[live[s]->qp_num - sv_qpn_base], 0);
			if (ibv_destroy_qp(live[s]))
				dups++;
		}
		live[s] = fix_qp(f, i % 3 == 0 ? IBV_QPT_UD : IBV_QPT_RC);
		int32_t zero = 0;
		if (!atomic_compare_exchange_strong(&owner[live[s]->qp_num - sv_qpn_base], &zero,
						    getpid()))
			dups++;
	}
	for (int s = 0; s < 8; s++) {
		atomic_store(&owner[live[s]->qp_num - sv_qpn_base], 0);
		ibv_destroy_qp(live[s]);
	}
	fix_teardown((void **)&f);
	return dups;
}

static void test_concurrent_creation(void **state)
{
	(void)state;
	_Atomic int32_t *owner = mmap(NULL, SV_HOST_MAX_QP * sizeof(*owner), PROT_READ | PROT_WRITE,
				      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pid_t kids[NPROC];

	assert_true(owner != MAP_FAILED);
	for (int i = 0; i < NPROC; i++) {
		kids[i] = fix_fork();
		if (!kids[i])
			_exit(churn_checked(owner) ? 1 : 0);
	}
	for (int i = 0; i < NPROC; i++) {
		int st;
		assert_int_equal(waitpid(kids[i], &st, 0), kids[i]);
		assert_true(WIFEXITED(st));
		if (WEXITSTATUS(st))
			fail_msg("process %d saw a QPN owned twice", kids[i]);
		assert_int_equal(count_pid_qps(kids[i]), 0);
		assert_int_equal(count_pid_eps(kids[i]), 0);
	}
	assert_null(sv_reg_check());
	munmap(owner, SV_HOST_MAX_QP * sizeof(*owner));
}

static void test_qpn_not_reused_at_once(void **state)
{
	(void)state;
	struct fix *f;

	fix_setup((void **)&f);
	struct ibv_qp *a = fix_qp(f, IBV_QPT_RC);
	uint32_t first = a->qp_num;
	assert_true(first >= sv_qpn_base);
	assert_int_equal(ibv_destroy_qp(a), 0);
	a = fix_qp(f, IBV_QPT_RC);
	assert_int_not_equal(a->qp_num, first);
	assert_int_equal(ibv_destroy_qp(a), 0);
	fix_teardown((void **)&f);
}

int main(void)
{
	const char *name = getenv("SOFTVERBS_REGISTRY");
	char path[256];

	if (!name) {
		fprintf(stderr, "test_registry: set SOFTVERBS_REGISTRY to a private name\n");
		return 1;
	}
	sv_reg_name(path, sizeof(path));
	unlink(path);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kill9_reclaim),
		cmocka_unit_test(test_kill_at_any_instant),
		cmocka_unit_test(test_concurrent_creation),
		cmocka_unit_test(test_qpn_not_reused_at_once),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	unlink(path);
	return rc;
}
