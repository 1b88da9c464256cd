/* SPDX-License-Identifier: MIT */
/*
 * The library's side of the guard (core/guard.h): started on the first
 * packet given to it, by posix_spawn of the softverbs command found
 * beside this library, in a session of its own so that a terminal's ^C
 * for the application's process group does not take it too.  The
 * command forks once and its first process exits at once, reaped here:
 * the guard is then nobody's child that the application could wait for.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <spawn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../sv.h"
#include "guard.h"

extern char **environ;

static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER;
static int guard_fd = -1;
static bool guard_failed;	/* said once; not tried again */
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void) { pthread_mutex_lock(&guard_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&guard_lock); }

/* A fork child's connections are not its parent's: it starts a guard of
 * its own if it makes any. */
static void fork_child(void)
{
	if (guard_fd >= 0)
		close(guard_fd);
	guard_fd = -1;
	guard_failed = false;
	pthread_mutex_unlock(&guard_lock);
}

static void guard_init(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* The softverbs command: beside the library in a build tree
 * (build/lib, build/bin), at the installed bindir otherwise. */
static bool find_command(char *path, size_t len)
{
	Dl_info di;
	char lib[PATH_MAX];

	if (!dladdr((void *)sv_guard_add, &di) || !di.dli_fname ||
	    !realpath(di.dli_fname, lib))
		return false;
	const char *dir = dirname(lib);
	const char *rel[] = { "../bin", SV_BIN_FROM_LIBDIR };
	for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
		snprintf(path, len, "%s/%s/softverbs", dir, rel[i]);
		if (!access(path, X_OK))
			return true;
	}
	return false;
}

static int start(char *why, size_t len)
{
	char cmd[PATH_MAX];
	int sv[2], err;

	if (!find_command(cmd, sizeof(cmd))) {
		snprintf(why, len, "the softverbs command is not installed beside the library");
		return ENOENT;
	}
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv)) {
		err = errno;
		snprintf(why, len, "socketpair: %s", strerror(err));
		return err;
	}
	int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
	/* Above the numbers the child's dup2s write, so that neither
	 * overwrites the other's source. */
	int hi_sock = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
	int hi_pid = pidfd < 0 ? -1 : fcntl(pidfd, F_DUPFD_CLOEXEC, 10);
	if (pidfd < 0 || hi_sock < 0 || hi_pid < 0) {
		err = errno;
		snprintf(why, len, "pidfd_open or fcntl: %s", strerror(err));
		goto out;
	}
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t none;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDWR, 0);
	posix_spawn_file_actions_adddup2(&fa, 0, 1);
	posix_spawn_file_actions_adddup2(&fa, 0, 2);
	posix_spawn_file_actions_adddup2(&fa, hi_sock, SV_GUARD_SOCK_FD);
	posix_spawn_file_actions_adddup2(&fa, hi_pid, SV_GUARD_PIDFD);
	posix_spawnattr_init(&at);
	sigemptyset(&none);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
	/* Nothing preloaded: librspreload would make the guard's sockets
	 * its own. */
	size_t n = 0;
	while (environ[n])
		n++;
	char **env = calloc(n + 1, sizeof(*env));
	if (!env) {
		err = ENOMEM;
		snprintf(why, len, "out of memory");
		goto out;
	}
	for (size_t i = 0, k = 0; i < n; i++)
		if (strncmp(environ[i], "LD_PRELOAD=", 11))
			env[k++] = environ[i];
	char *argv[] = { "softverbs", "__guard", NULL };
	pid_t pid;
	err = posix_spawn(&pid, cmd, &fa, &at, argv, env);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	free(env);
	if (err) {
		snprintf(why, len, "%s: %s", cmd, strerror(err));
		goto out;
	}
	int st = 0, w;
	while ((w = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
		;
	/* w < 0 (ECHILD): an application's SIGCHLD handler reaped it first,
	 * and the pair tells whether a guard listens. */
	if (w == pid && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
		err = ECHILD;
		snprintf(why, len, "%s __guard did not start (status 0x%x)", cmd, (unsigned)st);
		goto out;
	}
	guard_fd = sv[0];
	sv[0] = -1;
out:
	if (sv[0] >= 0)
		close(sv[0]);
	close(sv[1]);
	if (pidfd >= 0)
		close(pidfd);
	if (hi_sock >= 0)
		close(hi_sock);
	if (hi_pid >= 0)
		close(hi_pid);
	return err;
}

static int put(const struct sv_guard_msg *m, size_t len, int fd)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec v = { (void *)m, len };
	struct msghdr h = { .msg_iov = &v, .msg_iovlen = 1 };

	if (fd >= 0) {
		h.msg_control = ctl.buf;
		h.msg_controllen = sizeof(ctl.buf);
		struct cmsghdr *c = CMSG_FIRSTHDR(&h);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	/* Never a wait under the CM's lock: a full queue fails this one
	 * message.  The pair is closed only when the guard is gone (EPIPE,
	 * ECONNRESET), since the guard takes its end of file, as at exec,
	 * for the process's end and sends everything it holds. */
	while (sendmsg(guard_fd, &h, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
		int err = errno;

		if (err == EINTR)
			continue;
		if (err == EPIPE || err == ECONNRESET) {
			close(guard_fd);
			guard_fd = -1;	/* the next will starts another */
		}
		return err;
	}
	return 0;
}

int sv_guard_add(uint64_t key, int fd, const struct sv_frame *f)
{
	struct sv_guard_msg m = { .op = SV_GUARD_ADD, .key = key, .f = *f };
	char why[PATH_MAX + 64];
	int err = 0;

	pthread_once(&guard_once, guard_init);
	pthread_mutex_lock(&guard_lock);
	if (guard_fd < 0 && !guard_failed) {
		err = start(why, sizeof(why));
		if (err) {
			guard_failed = true;
			sv_explain("no guard", "%s: peers on other hosts will not see DISCONNECTED "
				   "if this process dies without closing its connections", why);
		}
	}
	if (guard_fd >= 0)
		err = put(&m, sizeof(m), fd);
	else if (!err)
		err = ENOTCONN;
	pthread_mutex_unlock(&guard_lock);
	return err;
}

void sv_guard_del(uint64_t key)
{
	struct sv_guard_msg m = { .op = SV_GUARD_DEL, .key = key };

	pthread_once(&guard_once, guard_init);
	pthread_mutex_lock(&guard_lock);
	if (guard_fd >= 0)
		put(&m, offsetof(struct sv_guard_msg, f), -1);
	pthread_mutex_unlock(&guard_lock);
}
