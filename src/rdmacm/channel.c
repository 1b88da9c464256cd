/* SPDX-License-Identifier: MIT */
/*
 * Event channels: the queue of events, the fd the application polls, and
 * the CM timeouts.  rdma_get_cm_event() reads the sockets of the channel's
 * ids, runs the expired timers and hands out the first queued event.
 *
 * Event accounting is rdma-core's: an event is counted against its owner
 * (the id it reports on, or the listener for CONNECT_REQUEST) from
 * retrieval until rdma_ack_cm_event(), and rdma_destroy_id() waits for
 * that count to reach zero.  Events still queued when an id is destroyed
 * are discarded, as the kernel discards them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "cm.h"

pthread_mutex_t cm_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t cm_cv = PTHREAD_COND_INITIALIZER;

/* epoll data of the channel's own fds; an id's socket carries the id. */
static char evfd_tag, tfd_tag;

uint64_t cm_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* One CM response timeout: 4.096 us * 2^cm_timeout (IBA 12.7.34); rdma_cm
 * uses 20, about 4.3 s, and retries the REQ cm_retries times. */
uint64_t cm_response_ns(void)
{
	return 4096ull << softverbs_cm_setting("cm_timeout");
}

struct cm_chan *cm_chan_new(bool sync)
{
	struct cm_chan *ch = calloc(1, sizeof(*ch));
	struct epoll_event e = { .events = EPOLLIN };

	if (!ch)
		return NULL;
	TAILQ_INIT(&ch->events);
	TAILQ_INIT(&ch->ids);
	ch->sync = sync;
	ch->ch.fd = epoll_create1(EPOLL_CLOEXEC);
	ch->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	ch->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (ch->ch.fd < 0 || ch->evfd < 0 || ch->tfd < 0)
		goto fail;
	e.data.ptr = &evfd_tag;
	if (epoll_ctl(ch->ch.fd, EPOLL_CTL_ADD, ch->evfd, &e))
		goto fail;
	e.data.ptr = &tfd_tag;
	if (epoll_ctl(ch->ch.fd, EPOLL_CTL_ADD, ch->tfd, &e))
		goto fail;
	return ch;
fail:;
	int err = errno;
	if (ch->ch.fd >= 0)
		close(ch->ch.fd);
	if (ch->evfd >= 0)
		close(ch->evfd);
	if (ch->tfd >= 0)
		close(ch->tfd);
	free(ch);
	errno = err;
	return NULL;
}

/* rdma-core's channel is a file, and a thread blocked reading it stays
 * blocked when another thread destroys the channel: close() wakes no
 * read.  rping's CM thread is such a thread, and its process's main
 * returns after destroying the channel.  So a channel with a getter
 * waiting in it is closed but kept, and the getter, if it wakes, waits on
 * as that read would (wait_closed) instead of failing the application. */
static void chan_free(struct cm_chan *ch)
{
	struct cm_event *e;

	pthread_mutex_lock(&cm_mu);
	while ((e = TAILQ_FIRST(&ch->events))) {
		TAILQ_REMOVE(&ch->events, e, link);
		free(e);
	}
	close(ch->ch.fd);
	close(ch->evfd);
	close(ch->tfd);
	ch->closed = true;
	bool keep = ch->waiters > 0;
	pthread_mutex_unlock(&cm_mu);
	if (!keep)
		free(ch);
}

CM_EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct cm_chan *ch;

	if (!cm_device()) {
		cm_fail(ENODEV, NULL, "rdma_create_event_channel", "no softverbs device");
		return NULL;
	}
	ch = cm_chan_new(false);
	if (!ch) {
		cm_fail(errno, NULL, "rdma_create_event_channel", "epoll, eventfd or timerfd: %s",
			strerror(errno));
		return NULL;
	}
	return &ch->ch;
}

CM_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	if (channel)
		chan_free((struct cm_chan *)channel);
}

/* ---- the eventfd follows the queue: readable exactly while non-empty ---- */
static void queue_signal(struct cm_chan *ch, bool nonempty)
{
	uint64_t v = 1;
	ssize_t r;

	if (nonempty)
		r = write(ch->evfd, &v, sizeof(v));
	else
		r = read(ch->evfd, &v, sizeof(v));
	(void)r;	/* EAGAIN: it already was in that state */
}

struct cm_event *cm_event_queue(struct cm_id *c, enum rdma_cm_event_type type, int status)
{
	struct cm_event *e;
	struct cm_chan *ch = c->chan;

	/* An id being destroyed reports nothing more (its destroyer waits
	 * for acks with cm_mu released). */
	if (c->destroying)
		return NULL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->ev.id = &c->id;
	e->ev.event = type;
	e->ev.status = status;
	e->owner = c;
	e->ev.param.conn.private_data = e->pdata;
	bool was_empty = TAILQ_EMPTY(&ch->events);
	TAILQ_INSERT_TAIL(&ch->events, e, link);
	if (was_empty)
		queue_signal(ch, true);
	pthread_cond_broadcast(&cm_cv);
	return e;
}

/* Events of c still queued: dropped.  A CONNECT_REQUEST dropped with its
 * listener takes the new id with it (its peer sees a reject). */
void cm_discard_events(struct cm_id *c)
{
	struct cm_chan *ch = c->chan;
	struct cm_event *e, *n;

	for (e = TAILQ_FIRST(&ch->events); e; e = n) {
		n = TAILQ_NEXT(e, link);
		if (e->owner != c && e->ev.id != &c->id)
			continue;
		TAILQ_REMOVE(&ch->events, e, link);
		if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->ev.id != &c->id) {
			struct cm_id *child = cm_of(e->ev.id);

			cm_drop_connection(child);
			cm_chan_detach(child);
			cm_id_free(child);
		}
		free(e);
	}
	if (TAILQ_EMPTY(&ch->events))
		queue_signal(ch, false);
}

/* ---- ids on a channel ---- */
void cm_watch(struct cm_id *c, bool on)
{
	struct epoll_event e = { .events = EPOLLIN, .data.ptr = c };

	if (c->fd < 0 || c->in_epoll == on || !c->chan)
		return;
	epoll_ctl(c->chan->ch.fd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, c->fd, &e);
	if (c->mfd >= 0)
		epoll_ctl(c->chan->ch.fd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, c->mfd, &e);
	c->in_epoll = on;
}

void cm_chan_attach(struct cm_chan *ch, struct cm_id *c)
{
	c->chan = ch;
	c->id.channel = &ch->ch;
	TAILQ_INSERT_TAIL(&ch->ids, c, link);
}

void cm_chan_detach(struct cm_id *c)
{
	cm_watch(c, false);
	TAILQ_REMOVE(&c->chan->ids, c, link);
	c->timer = CM_T_NONE;
}

static void arm(struct cm_chan *ch)
{
	uint64_t first = 0;
	struct cm_id *c;
	struct itimerspec t = { 0 };

	TAILQ_FOREACH(c, &ch->ids, link)
		if (c->timer != CM_T_NONE && (!first || c->deadline_ns < first))
			first = c->deadline_ns;
	if (first) {
		t.it_value.tv_sec = (time_t)(first / 1000000000ull);
		t.it_value.tv_nsec = (long)(first % 1000000000ull);
	}
	timerfd_settime(ch->tfd, TFD_TIMER_ABSTIME, &t, NULL);
}

void cm_set_timer(struct cm_id *c, enum cm_timer t, uint64_t ns)
{
	c->timer = t;
	c->deadline_ns = t == CM_T_NONE ? 0 : cm_now_ns() + ns;
	if (c->chan)
		arm(c->chan);
}

/* Reads what the channel's sockets and timers have, turning it into
 * events; never blocks. */
static void pump(struct cm_chan *ch)
{
	struct epoll_event evs[32];
	int n = epoll_wait(ch->ch.fd, evs, 32, 0);
	bool timers = false;

	for (int i = 0; i < n; i++) {
		if (evs[i].data.ptr == &evfd_tag)
			continue;
		if (evs[i].data.ptr == &tfd_tag) {
			uint64_t v;
			ssize_t r = read(ch->tfd, &v, sizeof(v));

			(void)r;
			timers = true;
			continue;
		}
		/* The id may have been freed by an earlier entry of this batch
		 * (a listener's discarded request): only ids still on the
		 * channel and still watched are read. */
		struct cm_id *c, *want = evs[i].data.ptr;
		TAILQ_FOREACH(c, &ch->ids, link)
			if (c == want)
				break;
		if (c && c->in_epoll)
			cm_on_readable(c);
	}
	if (!timers)
		return;
	uint64_t now = cm_now_ns();
	struct cm_id *c, *next;
	for (c = TAILQ_FIRST(&ch->ids); c; c = next) {
		next = TAILQ_NEXT(c, link);
		if (c->timer != CM_T_NONE && c->deadline_ns <= now)
			cm_on_timer(c);
	}
	arm(ch);
}

static struct cm_event *take(struct cm_chan *ch)
{
	struct cm_event *e = TAILQ_FIRST(&ch->events);

	if (!e)
		return NULL;
	TAILQ_REMOVE(&ch->events, e, link);
	if (TAILQ_EMPTY(&ch->events))
		queue_signal(ch, false);
	e->owner->events_out++;
	if (e->ev.event == RDMA_CM_EVENT_MULTICAST_JOIN && e->mc)
		cm_mcast_joined(e->owner, e->mc);
	if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST) {
		struct cm_id *child = cm_of(e->ev.id);

		if (child->listener) {
			child->listener->pending--;
			child->listener = NULL;
		}
	}
	return e;
}

/* A getter whose channel was destroyed while it waited (chan_free): as a
 * read of rdma-core's closed file, it returns only when a signal
 * interrupts it, with EINTR.  The last such getter frees the channel.
 * With cm_mu held, as get_event. */
static int wait_closed(struct cm_chan *ch, bool interrupted)
{
	bool last = ch->waiters == 0;

	pthread_mutex_unlock(&cm_mu);
	if (last)
		free(ch);
	while (!interrupted)
		interrupted = poll(NULL, 0, -1) < 0 && errno == EINTR;
	pthread_mutex_lock(&cm_mu);
	errno = EINTR;
	return -1;
}

/* With cm_mu held; drops it while blocking. */
static int get_event(struct cm_chan *ch, struct cm_event **out)
{
	for (;;) {
		struct cm_event *e = take(ch);

		if (e) {
			*out = e;
			return 0;
		}
		pump(ch);
		if (!TAILQ_EMPTY(&ch->events))
			continue;
		if (fcntl(ch->ch.fd, F_GETFL) & O_NONBLOCK) {
			errno = EAGAIN;
			return -1;
		}
		struct pollfd p = { .fd = ch->ch.fd, .events = POLLIN };
		ch->waiters++;
		pthread_mutex_unlock(&cm_mu);
		int r = poll(&p, 1, -1);
		int err = errno;
		pthread_mutex_lock(&cm_mu);
		ch->waiters--;
		if (ch->closed)
			return wait_closed(ch, r < 0 && err == EINTR);
		if (r < 0 && err == EINTR) {
			errno = EINTR;
			return -1;
		}
	}
}

CM_EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	struct cm_event *e;
	int ret;

	if (!channel || !event)
		return cm_fail(EINVAL, NULL, "rdma_get_cm_event", "%s is NULL",
			       channel ? "event" : "channel");
	pthread_mutex_lock(&cm_mu);
	ret = get_event((struct cm_chan *)channel, &e);
	pthread_mutex_unlock(&cm_mu);
	if (ret)
		return -1;
	*event = &e->ev;
	return 0;
}

/* With cm_mu held: an event handed out is acked. */
static void ack_locked(struct cm_event *e)
{
	e->owner->events_out--;
	pthread_cond_broadcast(&cm_cv);
	free(e);
}

/* A synchronous id's last event, kept in id->event, is acked. */
static void ack_sync_event(struct cm_id *c)
{
	if (c->id.event) {
		ack_locked((struct cm_event *)c->id.event);
		c->id.event = NULL;
	}
}

CM_EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	if (!event)
		return cm_fail(EINVAL, NULL, "rdma_ack_cm_event", "event is NULL");
	pthread_mutex_lock(&cm_mu);
	ack_locked((struct cm_event *)event);
	pthread_mutex_unlock(&cm_mu);
	return 0;
}

/* A synchronous id's operation completes with its event (rdma-core's
 * ucma_complete): the previous one is acked, the next is kept in
 * id->event, and its status becomes the return value. */
int cm_sync_wait(struct cm_id *c)
{
	struct cm_event *e;

	if (!c->chan->sync)
		return 0;
	ack_sync_event(c);
	if (get_event(c->chan, &e))
		return -1;
	c->id.event = &e->ev;
	if (!e->ev.status)
		return 0;
	if (e->ev.event == RDMA_CM_EVENT_REJECTED)
		errno = ECONNREFUSED;
	else
		errno = e->ev.status < 0 ? -e->ev.status : e->ev.status;
	return -1;
}

/* Waits, with cm_mu held, until every event of c the application holds has
 * been acked. */
static void wait_acks(struct cm_id *c)
{
	while (c->events_out)
		pthread_cond_wait(&cm_cv, &cm_mu);
}

/* Moves c, its socket, its timer and its queued events to another channel. */
static void move_id(struct cm_id *c, struct cm_chan *from, struct cm_chan *to)
{
	struct cm_event *e, *n;
	bool watched = c->in_epoll;
	enum cm_timer t = c->timer;
	uint64_t deadline = c->deadline_ns;

	cm_chan_detach(c);
	cm_chan_attach(to, c);
	for (e = TAILQ_FIRST(&from->events); e; e = n) {
		n = TAILQ_NEXT(e, link);
		if (e->owner != c && e->ev.id != &c->id)
			continue;
		TAILQ_REMOVE(&from->events, e, link);
		bool was_empty = TAILQ_EMPTY(&to->events);
		TAILQ_INSERT_TAIL(&to->events, e, link);
		if (was_empty)
			queue_signal(to, true);
	}
	if (TAILQ_EMPTY(&from->events))
		queue_signal(from, false);
	if (watched)
		cm_watch(c, true);
	c->timer = t;
	c->deadline_ns = deadline;
}

CM_EXPORT int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
	struct cm_id *c = cm_of(id);
	struct cm_chan *to, *from;

	if (!id)
		return cm_fail(EINVAL, NULL, "rdma_migrate_id", "id is NULL");
	to = channel ? (struct cm_chan *)channel : cm_chan_new(true);
	if (!to)
		return cm_fail(errno, c, "rdma_migrate_id", "a private channel: %s", strerror(errno));
	pthread_mutex_lock(&cm_mu);
	from = c->chan;
	if (from == to) {
		pthread_mutex_unlock(&cm_mu);
		return 0;
	}
	/* A synchronous id's last event is the library's, not the
	 * application's: it is acked here, as rdma-core's migrate does. */
	if (from->sync)
		ack_sync_event(c);
	wait_acks(c);
	move_id(c, from, to);
	/* A listener's requests not yet reported go with it. */
	struct cm_id *o, *n;
	for (o = TAILQ_FIRST(&from->ids); o; o = n) {
		n = TAILQ_NEXT(o, link);
		if (o->listener == c)
			move_id(o, from, to);
	}
	arm(to);
	arm(from);
	/* A private channel goes with its last id (a synchronous listener's
	 * requests start on the listener's). */
	bool orphan = from->sync && TAILQ_EMPTY(&from->ids);
	pthread_mutex_unlock(&cm_mu);
	if (orphan)
		chan_free(from);
	return 0;
}

/* c's queued events, and the requests accepted for c (a listener) and
 * not yet reported: they die with it. */
static void drop_pending(struct cm_id *c)
{
	struct cm_id *o, *n;

	cm_discard_events(c);
	for (o = TAILQ_FIRST(&c->chan->ids); o; o = n) {
		n = TAILQ_NEXT(o, link);
		if (o->listener == c) {
			cm_drop_connection(o);
			cm_chan_detach(o);
			cm_id_free(o);
		}
	}
}

/* rdma_destroy_id's part: with cm_mu held, takes c off its channel once
 * the application holds none of its events.  Returns the channel when it
 * was c's private one, for the caller to free. */
struct cm_chan *cm_leave_channel(struct cm_id *c)
{
	struct cm_chan *ch = c->chan;

	ack_sync_event(c);
	/* Nothing of c runs while its destroyer waits: its socket leaves
	 * the epoll set and its timer stops. */
	cm_watch(c, false);
	c->timer = CM_T_NONE;
	drop_pending(c);
	wait_acks(c);
	drop_pending(c);
	cm_chan_detach(c);
	arm(ch);
	return ch->sync && TAILQ_EMPTY(&ch->ids) ? ch : NULL;
}

void cm_chan_release(struct cm_chan *ch)
{
	chan_free(ch);
}
