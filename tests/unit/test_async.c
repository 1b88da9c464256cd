/* SPDX-License-Identifier: MIT */
/*
 * Asynchronous events and completion channels: pollable fds, the events
 * the state machine raises, and the destroy/ack handshake.
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#include "helpers.h"

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms);
}

static void set_nonblock(int fd)
{
	assert_int_equal(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
}

/* Port events are port changes (`softverbs port`), as with rxe's user
 * contexts: a freshly opened context has none pending. */
static void test_no_event_after_open(void **state)
{
	struct fix *f = *state;
	struct ibv_async_event ev;

	assert_true(f->ctx->async_fd >= 0);
	assert_int_equal(readable(f->ctx->async_fd, 200), 0);
	set_nonblock(f->ctx->async_fd);
	assert_int_equal(ibv_get_async_event(f->ctx, &ev), -1);
	assert_int_equal(errno, EAGAIN);
}

static void test_sq_drained(void **state)
{
	struct fix *f = *state;
	struct ibv_qp *qp = fix_qp(f, IBV_QPT_RC);
	struct ibv_async_event ev;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 1 };

	fix_walk(f, qp, IBV_QPS_RTS);
	assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
	assert_int_equal(readable(f->ctx->async_fd, 1000), 1);
	assert_int_equal(ibv_get_async_event(f->ctx, &ev), 0);
	assert_int_equal(ev.event_type, IBV_EVENT_SQ_DRAINED);
	assert_ptr_equal(ev.element.qp, qp);
	ibv_ack_async_event(&ev);
	/* Without the notify bit, no event. */
	a.qp_state = IBV_QPS_RTS;
	assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
	a.qp_state = IBV_QPS_SQD;
	assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
	assert_int_equal(readable(f->ctx->async_fd, 50), 0);
	assert_int_equal(ibv_destroy_qp(qp), 0);
}

static void test_last_wqe_reached_and_destroy_waits(void **state)
{
	struct fix *f = *state;
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(f->pd, &sa);
	struct ibv_qp_init_attr ia = { .send_cq = f->cq, .recv_cq = f->cq, .srq = srq,
				       .qp_type = IBV_QPT_RC, .cap = { 1, 0, 1, 0, 0 } };
	struct ibv_qp *qp = ibv_create_qp(f->pd, &ia), *qp2 = ibv_create_qp(f->pd, &ia);
	struct ibv_async_event ev;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	assert_non_null(qp);
	assert_int_equal(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
	assert_int_equal(ibv_modify_qp(qp2, &a, IBV_QP_STATE), 0);
	assert_int_equal(ibv_get_async_event(f->ctx, &ev), 0);
	assert_int_equal(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
	assert_ptr_equal(ev.element.qp, qp);
	/* Read but not yet acked: destroy would wait, so ack first (as
	 * rdma-core requires) and then destroy returns. */
	ibv_ack_async_event(&ev);
	assert_int_equal(ibv_destroy_qp(qp), 0);
	/* qp2's event was never read: destroying qp2 drops it, and the fd
	 * reports no event for a destroyed QP. */
	assert_int_equal(ibv_destroy_qp(qp2), 0);
	set_nonblock(f->ctx->async_fd);
	assert_int_equal(ibv_get_async_event(f->ctx, &ev), -1);
	assert_int_equal(errno, EAGAIN);
	assert_int_equal(ibv_destroy_srq(srq), 0);
}

static void test_comp_channel(void **state)
{
	struct fix *f = *state;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(f->ctx);
	struct ibv_cq *cq, *got;
	void *cctx;

	assert_non_null(ch);
	assert_true(ch->fd >= 0);
	assert_ptr_equal(ch->context, f->ctx);
	cq = ibv_create_cq(f->ctx, 8, (void *)0x1234, ch, 0);
	assert_non_null(cq);
	assert_ptr_equal(cq->channel, ch);
	assert_int_equal(ibv_req_notify_cq(cq, 0), 0);
	assert_int_equal(ibv_req_notify_cq(cq, 1), 0);
	/* No completion, so no event. */
	assert_int_equal(readable(ch->fd, 20), 0);
	set_nonblock(ch->fd);
	assert_int_equal(ibv_get_cq_event(ch, &got, &cctx), -1);
	assert_int_equal(errno, EAGAIN);
	assert_int_equal(ibv_destroy_cq(cq), 0);
	assert_int_equal(ibv_destroy_comp_channel(ch), 0);
}

static void on_signal(int sig)
{
	(void)sig;
}

struct blocked {
	struct ibv_comp_channel *ch;
	struct ibv_context *ctx;
	_Atomic int ret;	/* 1 while the thread has not returned */
	int err;
};

static void *wait_cq_event(void *arg)
{
	struct blocked *b = arg;
	struct ibv_cq *cq;
	void *cq_ctx;

	int r = ibv_get_cq_event(b->ch, &cq, &cq_ctx);
	b->err = errno;
	b->ret = r;
	return NULL;
}

static void *wait_async_event(void *arg)
{
	struct blocked *b = arg;
	struct ibv_async_event ev;

	int r = ibv_get_async_event(b->ctx, &ev);
	b->err = errno;
	b->ret = r;
	return NULL;
}

/* A signal without SA_RESTART ends a blocked wait with -1/EINTR, as the
 * kernel's read() of the uverbs fd does in rdma-core. */
static void interrupt(void *(*fn)(void *), struct blocked *b)
{
	struct sigaction sa = { .sa_handler = on_signal }, old;
	pthread_t t;

	assert_int_equal(sigaction(SIGUSR2, &sa, &old), 0);
	atomic_store(&b->ret, 1);
	assert_int_equal(pthread_create(&t, NULL, fn, b), 0);
	usleep(20000);
	assert_int_equal(atomic_load(&b->ret), 1);	/* nothing to return for */
	/* A signal that lands before the thread is in read() only runs the
	 * handler: signal until the wait ends (one lands inside it), for at
	 * most 5 s.  A wait that retried EINTR would never end. */
	for (int i = 0; i < 250 && atomic_load(&b->ret) == 1; i++) {
		assert_int_equal(pthread_kill(t, SIGUSR2), 0);
		usleep(20000);
	}
	if (atomic_load(&b->ret) == 1)
		fail_msg("the blocked wait did not return on a signal");
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(b->ret, -1);
	assert_int_equal(b->err, EINTR);
	assert_int_equal(sigaction(SIGUSR2, &old, NULL), 0);
}

static void test_waits_return_eintr(void **state)
{
	struct fix *f = *state;
	struct blocked b = { .ctx = f->ctx };

	b.ch = ibv_create_comp_channel(f->ctx);
	assert_non_null(b.ch);
	interrupt(wait_cq_event, &b);
	assert_int_equal(ibv_destroy_comp_channel(b.ch), 0);
	interrupt(wait_async_event, &b);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, fix_setup, fix_teardown)
	const struct CMUnitTest tests[] = {
		T(test_no_event_after_open), T(test_sq_drained),
		T(test_last_wqe_reached_and_destroy_waits), T(test_comp_channel),
		T(test_waits_return_eintr),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
