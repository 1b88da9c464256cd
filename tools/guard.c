/* SPDX-License-Identifier: MIT */
/*
 * softverbs __guard: the guard of one process (src/core/guard.h), started
 * by its library.  It holds the packets that process gave it and sends
 * them once the process is gone: SV_GUARD_ROUNDS times each, as DREQs are
 * retried, then exits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/guard.h"
#include "guard.h"

struct will {
	uint64_t key;
	int fd;
	struct sv_frame f;
};

static struct will *wills;
static size_t nwills, cap;

static void drop(size_t i)
{
	close(wills[i].fd);
	wills[i] = wills[--nwills];
}

static void take(const struct sv_guard_msg *m, int fd)
{
	for (size_t i = 0; i < nwills; i++)
		if (wills[i].key == m->key) {
			drop(i);
			break;
		}
	if (m->op != SV_GUARD_ADD || fd < 0)
		return;
	if (nwills == cap) {
		size_t n = cap ? 2 * cap : 16;
		struct will *w = realloc(wills, n * sizeof(*w));
		if (!w) {
			close(fd);
			return;
		}
		wills = w;
		cap = n;
	}
	wills[nwills++] = (struct will){ .key = m->key, .fd = fd, .f = m->f };
}

/* One message from the library: false at its end (EOF or an error other
 * than a wait). */
static bool read_one(int s, int flags)
{
	struct sv_guard_msg m;
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec v = { &m, sizeof(m) };
	struct msghdr h = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl.buf,
			    .msg_controllen = sizeof(ctl.buf) };
	ssize_t n = recvmsg(s, &h, MSG_CMSG_CLOEXEC | flags);
	int fd = -1;

	if (n <= 0)
		return n < 0 && errno == EINTR;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			memcpy(&fd, CMSG_DATA(c), sizeof(fd));
	bool add_ok = m.op == SV_GUARD_ADD && (size_t)n == sizeof(m) && m.f.len <= sizeof(m.f.pkt) &&
		      m.f.ctllen <= sizeof(m.f.ctl) && m.f.tolen <= sizeof(m.f.to);
	bool del_ok = m.op == SV_GUARD_DEL && (size_t)n >= offsetof(struct sv_guard_msg, f);
	if (add_ok || del_ok)
		take(&m, fd);
	else if (fd >= 0)
		close(fd);
	return true;
}

static void send_all(void)
{
	for (int round = 0; round < SV_GUARD_ROUNDS; round++) {
		if (round) {
			struct timespec t = { 0, SV_GUARD_GAP_MS * 1000000L };
			while (nanosleep(&t, &t) && errno == EINTR)
				;
		}
		for (size_t i = 0; i < nwills; i++) {
			struct sv_frame *f = &wills[i].f;
			struct iovec v = { f->pkt, f->len };
			struct msghdr h = { .msg_name = &f->to, .msg_namelen = f->tolen,
					    .msg_iov = &v, .msg_iovlen = 1,
					    .msg_control = f->ctllen ? f->ctl : NULL,
					    .msg_controllen = f->ctllen };
			(void)sendmsg(wills[i].fd, &h, MSG_DONTWAIT);
		}
	}
}

int guard_main(void)
{
	int s = SV_GUARD_SOCK_FD;
	struct pollfd p[2] = { { .fd = s, .events = POLLIN },
			       { .fd = SV_GUARD_PIDFD, .events = POLLIN } };

	/* Only the pair and the pidfd: a descriptor of the application's
	 * that it did not mark close-on-exec (a TCP socket, a pipe) must
	 * close when the application closes it. */
	close_range(SV_GUARD_PIDFD + 1, ~0U, 0);
	if (chdir("/"))
		return 1;
	/* The library waits for this process; the guard is its child. */
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid > 0)
		_exit(0);
	for (;;) {
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			return 1;
		}
		if (p[1].revents)
			break;		/* the process is gone */
		if (p[0].revents && !read_one(s, 0))
			break;		/* so is every holder of its end */
	}
	/* What it said before it went is still queued. */
	while (read_one(s, MSG_DONTWAIT))
		;
	send_all();
	return 0;
}
