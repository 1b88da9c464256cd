/* SPDX-License-Identifier: MIT */
/*
 * rsockets as a socket program sees them: a stream whose bytes arrive in
 * order and whole, end of file after the peer's shutdown or close, flow
 * control that blocks (or says EWOULDBLOCK) when the peer reads nothing,
 * rpoll over rsockets and kernel fds together, and the errors a refused
 * connection gives.  The listening end runs in a thread of its own.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "inet.h"
#include <rdma/rsocket.h>

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 13 + i / 977);
}

/* A listening rsocket on an ephemeral port. */
static int listener(uint16_t *port)
{
	int l = rsocket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = loopback(0);
	socklen_t len = sizeof(a);

	assert_true(l >= 0);
	assert_int_equal(rbind(l, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(rlisten(l, 4), 0);
	assert_int_equal(rgetsockname(l, (struct sockaddr *)&a, &len), 0);
	*port = ntohs(a.sin_port);
	assert_true(*port != 0);
	return l;
}

static int connect_to(uint16_t port)
{
	int s = rsocket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = loopback(port);

	assert_true(s >= 0);
	assert_int_equal(rconnect(s, (struct sockaddr *)&a, sizeof(a)), 0);
	return s;
}

/* ---- the server thread: reads until EOF, checks, answers the count ---- */
struct server {
	int listen_fd;
	size_t got;
	int bad;		/* the first wrong byte's index + 1 */
	int peek_ok;
};

static void *serve(void *arg)
{
	struct server *sv = arg;
	int c = raccept(sv->listen_fd, NULL, NULL);
	uint8_t buf[70000];
	ssize_t n;

	if (c < 0)
		return NULL;
	/* A peek shows the first bytes and leaves them. */
	n = rrecv(c, buf, 8, MSG_PEEK);
	sv->peek_ok = n > 0;
	for (ssize_t i = 0; i < n; i++)
		if (buf[i] != pattern((size_t)i))
			sv->peek_ok = 0;
	while ((n = rrecv(c, buf, (size_t)(rand() % (int)sizeof(buf)) + 1, 0)) > 0) {
		for (ssize_t i = 0; i < n; i++)
			if (!sv->bad && buf[i] != pattern(sv->got + (size_t)i))
				sv->bad = (int)(sv->got + (size_t)i) + 1;
		sv->got += (size_t)n;
	}
	uint64_t v = sv->got;
	rsend(c, &v, sizeof(v), 0);
	rclose(c);
	return NULL;
}

static void test_stream(void **state)
{
	struct server sv = { 0 };
	uint16_t port;
	pthread_t t;
	size_t total = 5u << 20, sent = 0;
	uint8_t *d = malloc(total);

	sv.listen_fd = listener(&port);
	assert_int_equal(pthread_create(&t, NULL, serve, &sv), 0);
	int s = connect_to(port);
	struct sockaddr_in peer;
	socklen_t plen = sizeof(peer);
	assert_int_equal(rgetpeername(s, (struct sockaddr *)&peer, &plen), 0);
	assert_int_equal(ntohs(peer.sin_port), port);
	for (size_t i = 0; i < total; i++)
		d[i] = pattern(i);
	/* Writes of every size, some larger than a slot, some of one byte. */
	while (sent < total) {
		size_t n = (size_t)(rand() % 200000) + 1;

		if (n > total - sent)
			n = total - sent;
		ssize_t k = rsend(s, d + sent, n, 0);
		assert_true(k > 0);
		sent += (size_t)k;
	}
	assert_int_equal(rshutdown(s, SHUT_WR), 0);
	assert_int_equal(rsend(s, d, 1, 0), -1);
	assert_int_equal(errno, EPIPE);
	uint64_t v = 0;
	assert_int_equal(rrecv(s, &v, sizeof(v), MSG_WAITALL), sizeof(v));
	assert_int_equal(v, total);
	/* The server closed: end of file. */
	assert_int_equal(rrecv(s, &v, sizeof(v), 0), 0);
	pthread_join(t, NULL);
	assert_int_equal(sv.bad, 0);
	assert_int_equal(sv.got, total);
	assert_true(sv.peek_ok);
	rclose(s);
	rclose(sv.listen_fd);
	free(d);
}

/* ---- flow control, non-blocking calls and rpoll ---- */
struct holder {
	int listen_fd, fd;
};

static void *accept_only(void *arg)
{
	struct holder *h = arg;

	h->fd = raccept(h->listen_fd, NULL, NULL);
	return NULL;
}

static void test_nonblocking_and_poll(void **state)
{
	struct holder h = { .fd = -1 };
	uint16_t port;
	pthread_t t;
	static uint8_t chunk[65536];

	h.listen_fd = listener(&port);
	assert_int_equal(pthread_create(&t, NULL, accept_only, &h), 0);
	int s = connect_to(port);
	pthread_join(t, NULL);
	assert_true(h.fd >= 0);
	assert_int_equal(rfcntl(s, F_SETFL, O_NONBLOCK), 0);
	assert_true(rfcntl(s, F_GETFL) & O_NONBLOCK);

	/* Nothing to read yet. */
	uint8_t b;
	assert_int_equal(rrecv(s, &b, 1, 0), -1);
	assert_int_equal(errno, EWOULDBLOCK);
	struct pollfd p = { .fd = s, .events = POLLIN };
	double t0 = now_s();
	assert_int_equal(rpoll(&p, 1, 150), 0);
	assert_true(now_s() - t0 >= 0.14);

	/* The peer reads nothing: the sender runs out of credit. */
	size_t sent = 0;
	for (int i = 0; i < 1000; i++) {
		ssize_t k = rsend(s, chunk, sizeof(chunk), 0);

		if (k < 0) {
			assert_int_equal(errno, EWOULDBLOCK);
			break;
		}
		sent += (size_t)k;
	}
	assert_true(sent >= 1u << 20);
	assert_true(sent < 64u << 20);
	p = (struct pollfd){ .fd = s, .events = POLLOUT };
	assert_int_equal(rpoll(&p, 1, 50), 0);

	/* rpoll over an rsocket and a kernel pipe: the pipe is ready. */
	int pipefd[2];
	assert_int_equal(pipe(pipefd), 0);
	assert_int_equal(write(pipefd[1], "x", 1), 1);
	struct pollfd two[2] = { { .fd = s, .events = POLLIN }, { .fd = pipefd[0], .events = POLLIN } };
	assert_int_equal(rpoll(two, 2, 1000), 1);
	assert_int_equal(two[0].revents, 0);
	assert_true(two[1].revents & POLLIN);

	/* The peer reads: credit comes back and the sender may go on. */
	size_t got = 0;
	static uint8_t sink[65536];
	while (got < sent) {
		ssize_t k = rrecv(h.fd, sink, sizeof(sink), 0);

		assert_true(k > 0);
		got += (size_t)k;
	}
	p = (struct pollfd){ .fd = s, .events = POLLOUT };
	assert_int_equal(rpoll(&p, 1, 2000), 1);
	assert_true(p.revents & POLLOUT);
	assert_true(rsend(s, chunk, 100, 0) == 100);

	/* The peer closes: the reader sees end of file, rpoll says so. */
	assert_int_equal(rrecv(h.fd, sink, 100, MSG_WAITALL), 100);
	rclose(h.fd);
	p = (struct pollfd){ .fd = s, .events = POLLIN };
	assert_int_equal(rpoll(&p, 1, 2000), 1);
	assert_int_equal(rrecv(s, &b, 1, 0), 0);
	close(pipefd[0]);
	close(pipefd[1]);
	rclose(s);
	rclose(h.listen_fd);
}

/* ---- refused connections, and what is not built ---- */
static void test_refused(void **state)
{
	uint16_t port;
	int l = listener(&port);

	rclose(l);	/* nobody listens on port now */
	int s = rsocket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = loopback(port);
	assert_int_equal(rconnect(s, (struct sockaddr *)&a, sizeof(a)), -1);
	assert_int_equal(errno, ECONNREFUSED);
	rclose(s);

	/* Non-blocking: EINPROGRESS, then POLLERR and SO_ERROR. */
	s = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	assert_int_equal(rconnect(s, (struct sockaddr *)&a, sizeof(a)), -1);
	assert_int_equal(errno, EINPROGRESS);
	struct pollfd p = { .fd = s, .events = POLLOUT };
	assert_int_equal(rpoll(&p, 1, 2000), 1);
	assert_true(p.revents & POLLERR);
	int err = 0;
	socklen_t len = sizeof(err);
	assert_int_equal(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len), 0);
	assert_int_equal(err, ECONNREFUSED);
	rclose(s);

	assert_int_equal(rsocket(AF_INET, SOCK_DGRAM, 0), -1);
	assert_int_equal(errno, EOPNOTSUPP);
	assert_int_equal(rsend(12345, "x", 1, 0), -1);
	assert_int_equal(errno, EBADF);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stream),
		cmocka_unit_test(test_nonblocking_and_poll),
		cmocka_unit_test(test_refused),
	};
	srand(7);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
