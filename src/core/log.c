/* SPDX-License-Identifier: MIT */
/*
 * Leveled logs and explain mode.  Everything goes to stderr as whole lines
 * written with one write(2), so lines from several threads or processes
 * never interleave.  The library never writes to stdout: applications such
 * as perftest print their reports there.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../sv.h"

static const char *const level_name[] = {
	[SV_LOG_NONE] = "none", [SV_LOG_ERROR] = "error", [SV_LOG_WARN] = "warn",
	[SV_LOG_INFO] = "info", [SV_LOG_DEBUG] = "debug",
};

int sv_parse_log_level(const char *s)
{
	for (size_t i = 0; i < SV_ARRAY_SIZE(level_name); i++)
		if (!strcasecmp(s, level_name[i]) || (s[0] == (char)('0' + i) && !s[1]))
			return (int)i;
	return -1;
}

static void emit(const char *prefix, const char *fmt, va_list ap)
{
	char line[1024];
	int n = snprintf(line, sizeof(line), "softverbs[%d]: %s", (int)getpid(), prefix);

	if (n < 0)
		return;
	int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	if (m < 0)
		return;
	n += m;
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	/* A failed diagnostic write has nowhere better to go.  Raw: glibc's
	 * write() is a cancellation point, and a diagnostic may come from a
	 * verb that holds an engine lock (transport/udp/tap.h says why). */
	ssize_t w = syscall(SYS_write, STDERR_FILENO, line, (size_t)n);
	(void)w;
}

void sv_log(enum sv_log_level lvl, const char *fmt, ...)
{
	char prefix[16];
	va_list ap;
	int saved = errno;

	if ((int)lvl > sv_config()->log_level)
		return;
	snprintf(prefix, sizeof(prefix), "%s: ", level_name[lvl]);
	va_start(ap, fmt);
	emit(prefix, fmt, ap);
	va_end(ap);
	errno = saved;
}

static void explain(int err, const char *verb, const char *fmt, va_list ap)
{
	char prefix[160];

	if (!sv_config()->explain && sv_config()->log_level < SV_LOG_DEBUG)
		return;
	snprintf(prefix, sizeof(prefix), "%s failed (%s): ", verb, sv_errno_name(err));
	emit(prefix, fmt, ap);
}

void sv_explain(const char *what, const char *fmt, ...)
{
	char prefix[160];
	va_list ap;
	int saved = errno;

	if (!sv_config()->explain && sv_config()->log_level < SV_LOG_DEBUG)
		return;
	snprintf(prefix, sizeof(prefix), "%s: ", what);
	va_start(ap, fmt);
	emit(prefix, fmt, ap);
	va_end(ap);
	errno = saved;
}

/* librdmacm.so.1's explain lines are these (SOFTVERBS_PRIVATE_1). */
void softverbs_cm_explain(const char *what, const char *fmt, ...) __attribute__((alias("sv_explain")));

/* The calling thread's last failure, for a verb run on another process's
 * behalf (owner.c) to send its explanation back. */
static __thread char last_failure[SV_FAILURE_LEN];

const char *sv_last_failure(void)
{
	return last_failure;
}

static void fail(int err, const char *verb, const char *fmt, va_list ap)
{
	va_list copy;

	va_copy(copy, ap);
	vsnprintf(last_failure, sizeof(last_failure), fmt, copy);
	va_end(copy);
	explain(err, verb, fmt, ap);
}

int sv_fail(int err, const char *verb, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fail(err, verb, fmt, ap);
	va_end(ap);
	errno = err;
	return err;
}

void *sv_fail_null(int err, const char *verb, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fail(err, verb, fmt, ap);
	va_end(ap);
	errno = err;
	return NULL;
}

const char *sv_errno_name(int err)
{
	const char *n = strerrorname_np(err);

	return n ? n : "E?";
}

uint64_t sv_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/*
 * A NIC serves a WRITE or a READ while the target's application spins on
 * its buffer; softverbs' thread must get the core from it first.  Under
 * EEVDF (Linux 6.6 on) a woken task preempts the running one only once
 * that one has used its slice (0.75 ms and more) unless the woken task's
 * own slice is shorter (custom slices, 6.12): so this thread asks for
 * the shortest, 0.1 ms, which any user may for a SCHED_OTHER thread.  It
 * runs for microseconds at a wake, so it takes nothing from the others'
 * share.  Older kernels refuse sched_runtime for SCHED_OTHER (EINVAL) or
 * ignore it: nothing changes there.
 */
void sv_thread_prompt(void)
{
	struct {
		uint32_t size, policy;
		uint64_t flags;
		int32_t nice;
		uint32_t priority;
		uint64_t runtime, deadline, period;
	} a = { .size = 48, .policy = 0 /* SCHED_OTHER */, .runtime = 100000 };
	_Static_assert(sizeof(a) == 48, "struct sched_attr, SCHED_ATTR_SIZE_VER0");

	a.nice = (int32_t)getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
	syscall(SYS_sched_setattr, 0, &a, 0);
}

/* rdma-core's ibv_wc_status_str() strings (verbs/strings.c answers with
 * this table), for explanations in every layer. */
static const char *const wc_status_str[] = {
	[IBV_WC_SUCCESS] = "success",
	[IBV_WC_LOC_LEN_ERR] = "local length error",
	[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
	[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
	[IBV_WC_LOC_PROT_ERR] = "local protection error",
	[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
	[IBV_WC_MW_BIND_ERR] = "memory management operation error",
	[IBV_WC_BAD_RESP_ERR] = "bad response error",
	[IBV_WC_LOC_ACCESS_ERR] = "local access error",
	[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
	[IBV_WC_REM_ACCESS_ERR] = "remote access error",
	[IBV_WC_REM_OP_ERR] = "remote operation error",
	[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
	[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
	[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
	[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
	[IBV_WC_REM_ABORT_ERR] = "aborted error",
	[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
	[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
	[IBV_WC_FATAL_ERR] = "fatal error",
	[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
	[IBV_WC_GENERAL_ERR] = "general error",
};
_Static_assert(SV_ARRAY_SIZE(wc_status_str) == IBV_WC_GENERAL_ERR + 1, "wc statuses");

const char *sv_wc_status_name(enum ibv_wc_status s)
{
	return (unsigned)s < SV_ARRAY_SIZE(wc_status_str) && wc_status_str[s] ? wc_status_str[s] :
	       "unknown";
}
