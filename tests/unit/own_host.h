/* SPDX-License-Identifier: MIT */
/*
 * For tests that are a host of their own (own_netns.sh): they set up the
 * namespace's interfaces before the library reads them, and read back the
 * library's explain lines, which go to stderr.
 */
#ifndef SV_TEST_OWN_HOST_H
#define SV_TEST_OWN_HOST_H

#include <fcntl.h>
#include <stdio.h>
#include <time.h>

#include "helpers.h"

/* Runs each command (ip, sysctl); -1 at the first that fails. */
static inline int host_setup(const char *test, const char *const *cmds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char c[512];
		snprintf(c, sizeof(c), "%s >/dev/null 2>&1", cmds[i]);
		if (system(c)) {
			fprintf(stderr, "%s: setup failed: %s\n", test, cmds[i]);
			return -1;
		}
	}
	return 0;
}

static char host_errpath[64];
static int host_saved_stderr = -1;

/* Explain mode on, and stderr into a file host_said() reads. */
static inline int host_explain_capture(const char *test)
{
	snprintf(host_errpath, sizeof(host_errpath), "/tmp/sv%s-%d.err", test, (int)getpid());
	setenv("SOFTVERBS_EXPLAIN", "1", 1);
	host_saved_stderr = dup(2);
	int fd = open(host_errpath, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
	if (fd < 0 || host_saved_stderr < 0 || dup2(fd, 2) < 0)
		return -1;
	close(fd);
	return 0;
}

/* Whether the library has written `what` on stderr. */
static inline bool host_said(const char *what)
{
	static char buf[65536];
	FILE *p = fopen(host_errpath, "r");
	size_t n;

	assert_non_null(p);
	n = fread(buf, 1, sizeof(buf) - 1, p);
	buf[n] = 0;
	fclose(p);
	return strstr(buf, what) != NULL;
}

/* stderr back, with the library's lines copied to it for the log;
 * returns ret, or 1 if they could not be. */
static inline int host_explain_release(int ret)
{
	char cmd[256];

	dup2(host_saved_stderr, 2);
	snprintf(cmd, sizeof(cmd), "sed 's/^/    lib: /' %s >&2; rm -f %s", host_errpath,
		 host_errpath);
	if (system(cmd))
		ret = ret ? ret : 1;
	return ret;
}

/* One completion within `seconds`, polling. */
static inline bool host_poll(struct ibv_cq *cq, struct ibv_wc *wc, double seconds)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		int n = ibv_poll_cq(cq, 1, wc);
		assert_true(n >= 0);
		if (n)
			return true;
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
	return false;
}

#endif
