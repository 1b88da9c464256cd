/* SPDX-License-Identifier: MIT */
/*
 * rdma_cm's events, exactly: both ends of a connection in this process on
 * two event channels, and a peer in a spawned process where a death or a
 * port held by another process is the point.
 *
 * The CM timeout is shortened (SOFTVERBS_CM_TIMEOUT=16, 268 ms, and
 * SOFTVERBS_CM_RETRIES=2) so that the unreachable case takes under a
 * second: 3 x 268 ms.
 *
 *   test_rdmacm [--child-connect PORT | --child-bind PORT |
 *                --reject-server ADDR PORT | --reject-client ADDR PORT]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <rdma/rdma_cma.h>

#include "inet.h"

extern char **environ;

/* The next event of ch within ms milliseconds, or NULL. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, int ms)
{
	struct rdma_cm_event *ev;
	double end = now_s() + ms / 1000.0;
	int fl = fcntl(ch->fd, F_GETFL);

	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
	for (;;) {
		if (!rdma_get_cm_event(ch, &ev))
			break;
		assert_int_equal(errno, EAGAIN);
		int left = (int)((end - now_s()) * 1000);
		if (left <= 0) {
			ev = NULL;
			break;
		}
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		poll(&p, 1, left);
	}
	fcntl(ch->fd, F_SETFL, fl);
	return ev;
}

static struct rdma_cm_event *expect_event(struct rdma_event_channel *ch,
					  enum rdma_cm_event_type type)
{
	struct rdma_cm_event *ev = next_event(ch, 5000);

	if (!ev)
		fail_msg("no event, wanted %s", rdma_event_str(type));
	if (ev->event != type)
		fail_msg("got %s (status %d), wanted %s", rdma_event_str(ev->event), ev->status,
			 rdma_event_str(type));
	return ev;
}

static void expect_ack(struct rdma_event_channel *ch, enum rdma_cm_event_type type, int status)
{
	struct rdma_cm_event *ev = expect_event(ch, type);

	assert_int_equal(ev->status, status);
	assert_int_equal(rdma_ack_cm_event(ev), 0);
}

static void no_event(struct rdma_event_channel *ch)
{
	struct rdma_cm_event *ev = next_event(ch, 100);

	if (ev)
		fail_msg("unexpected %s", rdma_event_str(ev->event));
}

/* A listener on an ephemeral port of 127.0.0.1. */
static struct rdma_cm_id *listener(struct rdma_event_channel *ch, int backlog, uint16_t *port)
{
	struct rdma_cm_id *l;
	struct sockaddr_in a = loopback(0);

	assert_int_equal(rdma_create_id(ch, &l, NULL, RDMA_PS_TCP), 0);
	assert_int_equal(rdma_bind_addr(l, (struct sockaddr *)&a), 0);
	assert_int_equal(rdma_listen(l, backlog), 0);
	*port = ntohs(rdma_get_src_port(l));
	assert_in_range(*port, 32768, 60999);
	return l;
}

/* An active id with its route to 127.0.0.1:port resolved. */
static struct rdma_cm_id *routed(struct rdma_event_channel *ch, uint16_t port)
{
	struct rdma_cm_id *c;
	struct sockaddr_in a = loopback(port);

	assert_int_equal(rdma_create_id(ch, &c, NULL, RDMA_PS_TCP), 0);
	assert_int_equal(rdma_resolve_addr(c, NULL, (struct sockaddr *)&a, 1000), 0);
	expect_ack(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	assert_int_equal(rdma_resolve_route(c, 1000), 0);
	expect_ack(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
	return c;
}

static void connect_qpless(struct rdma_cm_id *c, uint32_t qpn, const char *pdata)
{
	struct rdma_conn_param p = { .qp_num = qpn, .private_data = pdata,
				     .private_data_len = (uint8_t)(pdata ? strlen(pdata) + 1 : 0),
				     .responder_resources = 1, .initiator_depth = 1,
				     .retry_count = 7, .rnr_retry_count = 7 };

	assert_int_equal(rdma_connect(c, &p), 0);
}

/* ---- REJECTED carries the rejecter's private data ---- */
static void test_reject_private_data(void **state)
{
	struct rdma_event_channel *pa = rdma_create_event_channel(), *ac = rdma_create_event_channel();
	uint16_t port;
	struct rdma_cm_id *l = listener(pa, 4, &port), *c = routed(ac, port);
	struct rdma_cm_event *ev;

	connect_qpless(c, 0x123, "knock knock");
	ev = expect_event(pa, RDMA_CM_EVENT_CONNECT_REQUEST);
	assert_ptr_equal(ev->listen_id, l);
	/* The REQ's private data less rdma_cm's 36-byte header (IBTA 12.6.5). */
	assert_int_equal(ev->param.conn.private_data_len, 56);
	assert_string_equal(ev->param.conn.private_data, "knock knock");
	assert_int_equal(ev->param.conn.qp_num, 0x123);
	struct rdma_cm_id *child = ev->id;
	assert_int_equal(ntohs(rdma_get_dst_port(child)), ntohs(rdma_get_src_port(c)));
	assert_int_equal(rdma_reject(child, "go away", 8), 0);
	assert_int_equal(rdma_ack_cm_event(ev), 0);

	ev = expect_event(ac, RDMA_CM_EVENT_REJECTED);
	assert_int_equal(ev->status, 28);	/* IB_CM_REJ_CONSUMER_DEFINED */
	assert_int_equal(ev->param.conn.private_data_len, 148);
	assert_string_equal(ev->param.conn.private_data, "go away");
	rdma_ack_cm_event(ev);

	/* Too much private data is refused before anything is sent. */
	struct rdma_cm_id *c2 = routed(ac, port);
	char big[100] = { 0 };
	struct rdma_conn_param p = { .qp_num = 1, .private_data = big, .private_data_len = 57 };
	assert_int_equal(rdma_connect(c2, &p), -1);
	assert_int_equal(errno, EINVAL);

	rdma_destroy_id(child);
	rdma_destroy_id(c2);
	rdma_destroy_id(c);
	rdma_destroy_id(l);
	rdma_destroy_event_channel(pa);
	rdma_destroy_event_channel(ac);
}

/* ---- nobody listens: REJECTED with invalid service ID ---- */
static void test_no_listener(void **state)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	uint16_t port;
	struct rdma_cm_id *l = listener(ch, 1, &port);

	rdma_destroy_id(l);	/* the port is free again, and nobody listens */
	struct rdma_cm_id *c = routed(ch, port);
	connect_qpless(c, 1, NULL);
	expect_ack(ch, RDMA_CM_EVENT_REJECTED, 8);	/* IB_CM_REJ_INVALID_SERVICE_ID */
	rdma_destroy_id(c);
	rdma_destroy_event_channel(ch);
}

/* ---- an address on no host ---- */
static void test_addr_error(void **state)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *c;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(7) };

	inet_pton(AF_INET, "198.18.0.77", &a.sin_addr);
	assert_int_equal(rdma_create_id(ch, &c, NULL, RDMA_PS_TCP), 0);
	assert_int_equal(rdma_resolve_addr(c, NULL, (struct sockaddr *)&a, 500), 0);
	expect_ack(ch, RDMA_CM_EVENT_ADDR_ERROR, -EHOSTUNREACH);
	/* A route needs an address. */
	assert_int_equal(rdma_resolve_route(c, 500), -1);
	assert_int_equal(errno, EINVAL);
	rdma_destroy_id(c);

	/* The synchronous form returns the failure. */
	assert_int_equal(rdma_create_id(NULL, &c, NULL, RDMA_PS_TCP), 0);
	assert_int_equal(rdma_resolve_addr(c, NULL, (struct sockaddr *)&a, 500), -1);
	assert_int_equal(errno, EHOSTUNREACH);
	rdma_destroy_id(c);
	rdma_destroy_event_channel(ch);
}

/* ---- a silent peer: UNREACHABLE after cm_timeout x (cm_retries + 1) ---- */
static void test_unreachable(void **state)
{
	struct rdma_event_channel *pa = rdma_create_event_channel(), *ac = rdma_create_event_channel();
	uint16_t port;
	struct rdma_cm_id *l = listener(pa, 4, &port), *c = routed(ac, port);

	/* The listener's channel is never read: the REQ gets no answer. */
	double t0 = now_s();
	connect_qpless(c, 1, NULL);
	struct rdma_cm_event *ev = next_event(ac, 5000);
	double dt = now_s() - t0;
	assert_non_null(ev);
	assert_int_equal(ev->event, RDMA_CM_EVENT_UNREACHABLE);
	assert_int_equal(ev->status, -ETIMEDOUT);
	rdma_ack_cm_event(ev);
	/* 3 x 4.096 us x 2^16 = 0.805 s */
	if (dt < 0.80 || dt > 2.5)
		fail_msg("UNREACHABLE after %.3f s, want 0.805 s", dt);
	rdma_destroy_id(c);
	rdma_destroy_id(l);	/* and its unread request with it */
	rdma_destroy_event_channel(pa);
	rdma_destroy_event_channel(ac);
}

/* ---- a whole connection with QPs: RTS both ways, DISCONNECTED, TIMEWAIT_EXIT ---- */
static int qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	assert_int_equal(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia), 0);
	return a.qp_state;
}

static void test_connect_disconnect(void **state)
{
	struct rdma_event_channel *pa = rdma_create_event_channel(), *ac = rdma_create_event_channel();
	uint16_t port;
	struct rdma_cm_id *l = listener(pa, 4, &port), *c = routed(ac, port);
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						.max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	struct rdma_cm_event *ev;

	assert_int_equal(rdma_create_qp(c, NULL, &qa), 0);
	assert_non_null(c->send_cq);
	assert_int_equal(qp_state(c->qp), IBV_QPS_INIT);
	struct rdma_conn_param p = { .private_data = "hi", .private_data_len = 3,
				     .responder_resources = 2, .initiator_depth = 2,
				     .retry_count = 7, .rnr_retry_count = 7 };
	assert_int_equal(rdma_connect(c, &p), 0);
	ev = expect_event(pa, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *s = ev->id;
	assert_int_equal(ev->param.conn.qp_num, c->qp->qp_num);
	assert_int_equal(ev->param.conn.initiator_depth, 2);
	rdma_ack_cm_event(ev);
	memset(&qa, 0, sizeof(qa));
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.qp_type = IBV_QPT_RC;
	assert_int_equal(rdma_create_qp(s, NULL, &qa), 0);
	struct rdma_conn_param rp = { .private_data = "welcome", .private_data_len = 8,
				      .responder_resources = 1, .initiator_depth = 1 };
	assert_int_equal(rdma_accept(s, &rp), 0);
	assert_int_equal(qp_state(s->qp), IBV_QPS_RTS);

	ev = expect_event(ac, RDMA_CM_EVENT_ESTABLISHED);
	assert_int_equal(ev->param.conn.private_data_len, 196);
	assert_string_equal(ev->param.conn.private_data, "welcome");
	assert_int_equal(ev->param.conn.qp_num, s->qp->qp_num);
	rdma_ack_cm_event(ev);
	assert_int_equal(qp_state(c->qp), IBV_QPS_RTS);
	/* The negotiated reads: min of what each side asked and served. */
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	assert_int_equal(ibv_query_qp(c->qp, &a, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_DEST_QPN, &ia), 0);
	assert_int_equal(a.max_rd_atomic, 1);
	assert_int_equal(a.dest_qp_num, s->qp->qp_num);
	expect_ack(pa, RDMA_CM_EVENT_ESTABLISHED, 0);

	assert_int_equal(rdma_disconnect(c), 0);
	assert_int_equal(qp_state(c->qp), IBV_QPS_ERR);
	expect_ack(pa, RDMA_CM_EVENT_DISCONNECTED, 0);
	expect_ack(ac, RDMA_CM_EVENT_DISCONNECTED, 0);
	assert_int_equal(rdma_disconnect(s), 0);	/* after the peer's: no new event */
	assert_int_equal(qp_state(s->qp), IBV_QPS_ERR);
	/* Time wait lasts one CM response timeout (268 ms here). */
	expect_ack(ac, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
	expect_ack(pa, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
	no_event(ac);
	no_event(pa);

	rdma_destroy_qp(s);
	rdma_destroy_qp(c);
	rdma_destroy_id(s);
	rdma_destroy_id(c);
	rdma_destroy_id(l);
	rdma_destroy_event_channel(pa);
	rdma_destroy_event_channel(ac);
}

/* ---- the backlog: requests beyond it are rejected ---- */
static void test_backlog(void **state)
{
	struct rdma_event_channel *pa = rdma_create_event_channel(), *ac = rdma_create_event_channel();
	uint16_t port;
	struct rdma_cm_id *l = listener(pa, 2, &port), *c[3];
	struct rdma_cm_event *ev[2];

	for (int i = 0; i < 3; i++) {
		c[i] = routed(ac, port);
		connect_qpless(c[i], 0x100 + (uint32_t)i, NULL);
	}
	/* The listener's channel is read once the three REQs are in: two
	 * are queued, the third is beyond the backlog. */
	ev[0] = expect_event(pa, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_event *rej = expect_event(ac, RDMA_CM_EVENT_REJECTED);
	assert_int_equal(rej->status, 28);
	assert_ptr_equal(rej->id, c[2]);
	rdma_ack_cm_event(rej);
	ev[1] = expect_event(pa, RDMA_CM_EVENT_CONNECT_REQUEST);
	assert_int_equal(ev[0]->param.conn.qp_num, 0x100);
	assert_int_equal(ev[1]->param.conn.qp_num, 0x101);
	no_event(pa);
	no_event(ac);
	for (int i = 0; i < 2; i++) {
		struct rdma_cm_id *s = ev[i]->id;

		rdma_ack_cm_event(ev[i]);
		rdma_destroy_id(s);	/* unanswered: its peer is rejected */
		expect_ack(ac, RDMA_CM_EVENT_REJECTED, 28);
	}
	for (int i = 0; i < 3; i++)
		rdma_destroy_id(c[i]);
	rdma_destroy_id(l);
	rdma_destroy_event_channel(pa);
	rdma_destroy_event_channel(ac);
}

/* ---- the port space: EADDRINUSE, release, ephemeral ports ---- */
static void test_port_space(void **state)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	uint16_t port;
	struct rdma_cm_id *l = listener(ch, 1, &port), *b;
	struct sockaddr_in a = loopback(port);

	assert_int_equal(rdma_create_id(ch, &b, NULL, RDMA_PS_TCP), 0);
	assert_int_equal(rdma_bind_addr(b, (struct sockaddr *)&a), -1);
	assert_int_equal(errno, EADDRINUSE);
	rdma_destroy_id(b);
	/* The UDP port space is another. */
	assert_int_equal(rdma_create_id(ch, &b, NULL, RDMA_PS_UDP), 0);
	assert_int_equal(rdma_bind_addr(b, (struct sockaddr *)&a), 0);
	rdma_destroy_id(b);
	rdma_destroy_id(l);
	assert_int_equal(rdma_create_id(ch, &b, NULL, RDMA_PS_TCP), 0);
	assert_int_equal(rdma_bind_addr(b, (struct sockaddr *)&a), 0);
	assert_int_equal(ntohs(rdma_get_src_port(b)), port);
	rdma_destroy_id(b);
	/* An address that is not this host's. */
	inet_pton(AF_INET, "198.18.0.77", &a.sin_addr);
	assert_int_equal(rdma_create_id(ch, &b, NULL, RDMA_PS_TCP), 0);
	assert_int_equal(rdma_bind_addr(b, (struct sockaddr *)&a), -1);
	assert_int_equal(errno, EADDRNOTAVAIL);
	rdma_destroy_id(b);
	rdma_destroy_event_channel(ch);
}

/* ---- another process: its death ---- */
static pid_t spawn(const char *mode, uint16_t port)
{
	char p[16], self[] = "test_rdmacm";
	char *argv[] = { self, (char *)mode, p, NULL };
	pid_t pid;

	snprintf(p, sizeof(p), "%u", port);
	assert_int_equal(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ), 0);
	return pid;
}

static void kill9(pid_t pid)
{
	int st;

	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &st, 0), pid);
}

static void test_peer_killed(void **state)
{
	struct rdma_event_channel *pa = rdma_create_event_channel();
	uint16_t port;
	struct rdma_cm_id *l = listener(pa, 4, &port);
	pid_t pid = spawn("--child-connect", port);
	struct rdma_cm_event *ev = expect_event(pa, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *s = ev->id;

	assert_int_equal(ev->param.conn.qp_num, 0x4242);
	rdma_ack_cm_event(ev);
	struct rdma_conn_param rp = { .qp_num = 0x77, .responder_resources = 1,
				      .initiator_depth = 1 };
	assert_int_equal(rdma_accept(s, &rp), 0);
	expect_ack(pa, RDMA_CM_EVENT_ESTABLISHED, 0);
	kill9(pid);
	expect_ack(pa, RDMA_CM_EVENT_DISCONNECTED, 0);
	rdma_destroy_id(s);
	rdma_destroy_id(l);

	/* A port held by a process that is killed is free at once.  The
	 * child takes a port of its choosing and says which: a port this
	 * test chose could be an ephemeral one that another test's id of
	 * this namespace holds (the child's bind failed so once in a
	 * ctest -j2). */
	int fds[2];
	posix_spawn_file_actions_t fa;
	char self[] = "test_rdmacm", mode[] = "--child-bind", zero[] = "0";
	char *argv[] = { self, mode, zero, NULL }, line[16] = "";
	assert_int_equal(pipe(fds), 0);
	assert_int_equal(posix_spawn_file_actions_init(&fa), 0);
	assert_int_equal(posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO), 0);
	assert_int_equal(posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ), 0);
	posix_spawn_file_actions_destroy(&fa);
	close(fds[1]);
	FILE *f = fdopen(fds[0], "r");
	assert_non_null(f);
	assert_non_null(fgets(line, sizeof(line), f));	/* once the child holds it */
	fclose(f);
	port = (uint16_t)atoi(line);
	assert_int_not_equal(port, 0);
	struct rdma_cm_id *b;
	struct sockaddr_in a = loopback(port);
	assert_int_equal(rdma_create_id(pa, &b, NULL, RDMA_PS_TCP), 0);
	assert_int_not_equal(rdma_bind_addr(b, (struct sockaddr *)&a), 0);
	assert_int_equal(errno, EADDRINUSE);
	kill9(pid);
	assert_int_equal(rdma_bind_addr(b, (struct sockaddr *)&a), 0);
	rdma_destroy_id(b);
	rdma_destroy_event_channel(pa);
}

/* ---- rdma_destroy_id and events not acknowledged ---- */
static volatile int acked;

static void *ack_later(void *ev)
{
	usleep(200000);
	acked = 1;
	rdma_ack_cm_event(ev);
	return NULL;
}

static void test_destroy_with_events(void **state)
{
	struct rdma_event_channel *pa = rdma_create_event_channel(), *ac = rdma_create_event_channel();
	uint16_t port;
	struct rdma_cm_id *l = listener(pa, 4, &port), *c = routed(ac, port);

	/* Queued, never retrieved: discarded with the id. */
	struct rdma_cm_id *d;
	struct sockaddr_in a = loopback(port);
	assert_int_equal(rdma_create_id(ac, &d, NULL, RDMA_PS_TCP), 0);
	assert_int_equal(rdma_resolve_addr(d, NULL, (struct sockaddr *)&a, 100), 0);
	struct pollfd p = { .fd = ac->fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 1000), 1);	/* ADDR_RESOLVED is queued */
	assert_int_equal(rdma_destroy_id(d), 0);
	no_event(ac);
	rdma_destroy_id(c);

	/* A connection request queued for a listener that is destroyed: its
	 * requester is rejected. */
	struct rdma_cm_id *l2;
	uint16_t port2;
	l2 = listener(pa, 4, &port2);
	c = routed(ac, port2);
	connect_qpless(c, 1, NULL);
	p.fd = pa->fd;
	struct rdma_cm_event *ev;
	usleep(20000);
	rdma_destroy_id(l2);
	expect_ack(ac, RDMA_CM_EVENT_REJECTED, 28);
	rdma_destroy_id(c);

	struct rdma_conn_param rp = { .qp_num = 2 };
	/* Retrieved, not acked: rdma_destroy_id waits for the ack. */
	c = routed(ac, port);
	connect_qpless(c, 3, NULL);
	ev = expect_event(pa, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *s = ev->id;
	rdma_ack_cm_event(ev);
	assert_int_equal(rdma_accept(s, &rp), 0);
	ev = expect_event(ac, RDMA_CM_EVENT_CONNECT_RESPONSE);
	assert_int_equal(ev->param.conn.qp_num, 2);
	pthread_t t;
	acked = 0;
	assert_int_equal(pthread_create(&t, NULL, ack_later, ev), 0);
	double t0 = now_s();
	assert_int_equal(rdma_destroy_id(c), 0);
	assert_true(acked);
	assert_true(now_s() - t0 >= 0.15);
	pthread_join(t, NULL);

	rdma_destroy_id(s);
	rdma_destroy_id(l);
	rdma_destroy_event_channel(pa);
	rdma_destroy_event_channel(ac);
}

/* ---- the channel: blocking, non-blocking, EINTR ---- */
static void on_alarm(int sig)
{
	(void)sig;
}

static void test_channel_modes(void **state)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_event *ev;
	struct sigaction sa = { .sa_handler = on_alarm };

	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	assert_int_equal(rdma_get_cm_event(ch, &ev), -1);
	assert_int_equal(errno, EAGAIN);
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) & ~O_NONBLOCK);
	/* A blocking wait ends with EINTR on a signal (no SA_RESTART). */
	sigaction(SIGALRM, &sa, NULL);
	ualarm(100000, 0);
	assert_int_equal(rdma_get_cm_event(ch, &ev), -1);
	assert_int_equal(errno, EINTR);
	/* poll(2) on the fd wakes for a queued event. */
	struct rdma_cm_id *c;
	struct sockaddr_in a = loopback(9);
	assert_int_equal(rdma_create_id(ch, &c, NULL, RDMA_PS_TCP), 0);
	assert_int_equal(rdma_resolve_addr(c, NULL, (struct sockaddr *)&a, 100), 0);
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 1000), 1);
	assert_int_equal(rdma_get_cm_event(ch, &ev), 0);
	assert_int_equal(ev->event, RDMA_CM_EVENT_ADDR_RESOLVED);
	rdma_ack_cm_event(ev);
	assert_int_equal(poll(&p, 1, 0), 0);
	rdma_destroy_id(c);
	rdma_destroy_event_channel(ch);
}

/* ---- a channel destroyed while a thread waits in it ---- */
struct getter {
	struct rdma_event_channel *ch;
	_Atomic int done;
	int ret, err;
};

static void *get_one(void *arg)
{
	struct getter *g = arg;
	struct rdma_cm_event *ev;

	g->ret = rdma_get_cm_event(g->ch, &ev);
	g->err = errno;
	atomic_store(&g->done, 1);
	return NULL;
}

/* rping's CM thread waits in rdma_get_cm_event() while its main thread
 * destroys the channel and returns.  With rdma-core the thread stays
 * blocked, as a read of a closed file does, until a signal ends it with
 * EINTR; it must not fail (rping exits 255 when it does).  The wait is
 * woken here by readiness of the epoll file it polls, kept alive by a
 * dup of ch->fd and given a pipe: what an event racing the destruction
 * does to it. */
static void test_destroy_channel_while_waiting(void **state)
{
	struct getter g = { .ch = rdma_create_event_channel() };
	struct sigaction sa = { .sa_handler = on_alarm };
	pthread_t t;
	int p[2];

	sigaction(SIGALRM, &sa, NULL);
	assert_non_null(g.ch);
	assert_int_equal(pipe(p), 0);
	int ep = dup(g.ch->fd);
	assert_true(ep >= 0);
	assert_int_equal(pthread_create(&t, NULL, get_one, &g), 0);
	usleep(50000);
	assert_int_equal(atomic_load(&g.done), 0);
	rdma_destroy_event_channel(g.ch);
	struct epoll_event e = { .events = EPOLLIN };
	assert_int_equal(epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &e), 0);
	assert_int_equal(write(p[1], "x", 1), 1);
	usleep(100000);
	assert_int_equal(atomic_load(&g.done), 0);
	pthread_kill(t, SIGALRM);
	pthread_join(t, NULL);
	assert_int_equal(g.ret, -1);
	assert_int_equal(g.err, EINTR);
	close(ep);
	close(p[0]);
	close(p[1]);
}

/* ---- rdma_migrate_id: a synchronous id, and a listener with a request ---- */
static void test_migrate(void **state)
{
	struct rdma_event_channel *a1 = rdma_create_event_channel(), *a2 = rdma_create_event_channel();
	struct rdma_event_channel *ac = rdma_create_event_channel();
	struct rdma_cm_id *sid;
	struct sockaddr_in lo = loopback(9);
	uint16_t port;

	/* A synchronous id holds its last event: migrating acks it. */
	assert_int_equal(rdma_create_id(NULL, &sid, NULL, RDMA_PS_TCP), 0);
	assert_int_equal(rdma_resolve_addr(sid, NULL, (struct sockaddr *)&lo, 100), 0);
	assert_non_null(sid->event);
	assert_int_equal(rdma_migrate_id(sid, a2), 0);
	assert_ptr_equal(sid->channel, a2);
	assert_int_equal(rdma_destroy_id(sid), 0);

	/* A listener moved with a request it has not reported: the request
	 * and the connection continue on the new channel. */
	struct rdma_cm_id *l = listener(a1, 4, &port), *c = routed(ac, port);
	connect_qpless(c, 0x55, NULL);
	struct pollfd p = { .fd = a1->fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 2000), 1);	/* the listener's socket is readable */
	no_event(a2);
	struct rdma_cm_event *ev = next_event(a1, 200);	/* reads it: the request is queued */
	assert_non_null(ev);
	assert_int_equal(ev->event, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *s = ev->id;
	rdma_ack_cm_event(ev);
	assert_int_equal(rdma_migrate_id(l, a2), 0);
	assert_int_equal(rdma_migrate_id(s, a2), 0);
	struct rdma_conn_param rp = { .qp_num = 0x66 };
	assert_int_equal(rdma_accept(s, &rp), 0);
	ev = expect_event(ac, RDMA_CM_EVENT_CONNECT_RESPONSE);
	rdma_ack_cm_event(ev);
	assert_int_equal(rdma_establish(c), 0);
	expect_ack(a2, RDMA_CM_EVENT_ESTABLISHED, 0);
	no_event(a1);
	rdma_destroy_id(s);
	rdma_destroy_id(c);
	rdma_destroy_id(l);
	rdma_destroy_event_channel(a1);
	rdma_destroy_event_channel(a2);
	rdma_destroy_event_channel(ac);
}

/* ---- children ---- */
static int child_connect(uint16_t port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *c;
	struct rdma_cm_event *ev;
	struct sockaddr_in a = loopback(port);
	struct rdma_conn_param p = { .qp_num = 0x4242, .responder_resources = 1,
				     .initiator_depth = 1 };

	if (!ch || rdma_create_id(ch, &c, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(c, NULL, (struct sockaddr *)&a, 1000) ||
	    rdma_get_cm_event(ch, &ev) || rdma_ack_cm_event(ev) || rdma_resolve_route(c, 1000) ||
	    rdma_get_cm_event(ch, &ev) || rdma_ack_cm_event(ev) || rdma_connect(c, &p) ||
	    rdma_get_cm_event(ch, &ev) || ev->event != RDMA_CM_EVENT_CONNECT_RESPONSE ||
	    rdma_ack_cm_event(ev) || rdma_establish(c))
		return 1;
	pause();	/* until killed */
	return 0;
}

static int child_bind(uint16_t port)
{
	struct rdma_cm_id *b;
	struct sockaddr_in a = loopback(port);

	if (rdma_create_id(NULL, &b, NULL, RDMA_PS_TCP) || rdma_bind_addr(b, (struct sockaddr *)&a))
		return 1;
	printf("%u\n", ntohs(rdma_get_src_port(b)));	/* the port taken (port 0: any) */
	fflush(stdout);
	pause();
	return 0;
}

/* ---- REJECTED with private data across hosts (integration.rdmacm_hosts) ----
 * --reject-server ADDR PORT listens, checks the REQ's private data and
 * rejects it with its own; --reject-client ADDR PORT connects from
 * another host and must get REJECTED, status 28, with that data.  Each
 * says what it got and exits 0 only on exactly the event wanted. */
static struct sockaddr_in addr_port(const char *addr, const char *port)
{
	struct sockaddr_in a = loopback((uint16_t)atoi(port));

	inet_pton(AF_INET, addr, &a.sin_addr);
	return a;
}

static int reject_server(struct sockaddr_in a)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *l;
	struct rdma_cm_event *ev;

	if (!ch || rdma_create_id(ch, &l, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(l, (struct sockaddr *)&a) || rdma_listen(l, 1) ||
	    rdma_get_cm_event(ch, &ev)) {
		perror("reject-server");
		return 1;
	}
	printf("server: %s, private data \"%.56s\" (%u bytes)\n", rdma_event_str(ev->event),
	       ev->param.conn.private_data ? (const char *)ev->param.conn.private_data : "",
	       ev->param.conn.private_data_len);
	if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST || ev->param.conn.private_data_len != 56 ||
	    strcmp(ev->param.conn.private_data, "knock knock"))
		return 1;
	if (rdma_reject(ev->id, "go away", 8))
		return 1;
	rdma_ack_cm_event(ev);
	return 0;
}

static int reject_client(struct sockaddr_in a)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *c;
	struct rdma_cm_event *ev;
	struct rdma_conn_param p = { .qp_num = 0x4242, .private_data = "knock knock",
				     .private_data_len = 12, .responder_resources = 1,
				     .initiator_depth = 1 };

	if (!ch || rdma_create_id(ch, &c, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(c, NULL, (struct sockaddr *)&a, 1000) ||
	    rdma_get_cm_event(ch, &ev) || rdma_ack_cm_event(ev) || rdma_resolve_route(c, 1000) ||
	    rdma_get_cm_event(ch, &ev) || rdma_ack_cm_event(ev) || rdma_connect(c, &p) ||
	    rdma_get_cm_event(ch, &ev)) {
		perror("reject-client");
		return 1;
	}
	printf("client: %s, status %d, private data \"%.148s\" (%u bytes)\n",
	       rdma_event_str(ev->event), ev->status,
	       ev->param.conn.private_data ? (const char *)ev->param.conn.private_data : "",
	       ev->param.conn.private_data_len);
	/* IB_CM_REJ_CONSUMER_DEFINED; a REJ's private data is 148 bytes. */
	return ev->event == RDMA_CM_EVENT_REJECTED && ev->status == 28 &&
	       ev->param.conn.private_data_len == 148 &&
	       !strcmp(ev->param.conn.private_data, "go away") ? 0 : 1;
}

int main(int argc, char **argv)
{
	setenv("SOFTVERBS_CM_TIMEOUT", "16", 0);
	setenv("SOFTVERBS_CM_RETRIES", "2", 0);
	if (argc == 3 && !strcmp(argv[1], "--child-connect"))
		return child_connect((uint16_t)atoi(argv[2]));
	if (argc == 3 && !strcmp(argv[1], "--child-bind"))
		return child_bind((uint16_t)atoi(argv[2]));
	if (argc == 4 && !strcmp(argv[1], "--reject-server"))
		return reject_server(addr_port(argv[2], argv[3]));
	if (argc == 4 && !strcmp(argv[1], "--reject-client"))
		return reject_client(addr_port(argv[2], argv[3]));
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reject_private_data),
		cmocka_unit_test(test_no_listener),
		cmocka_unit_test(test_addr_error),
		cmocka_unit_test(test_unreachable),
		cmocka_unit_test(test_connect_disconnect),
		cmocka_unit_test(test_backlog),
		cmocka_unit_test(test_port_space),
		cmocka_unit_test(test_peer_killed),
		cmocka_unit_test(test_destroy_with_events),
		cmocka_unit_test(test_channel_modes),
		cmocka_unit_test(test_destroy_channel_while_waiting),
		cmocka_unit_test(test_migrate),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
