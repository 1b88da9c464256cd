/* SPDX-License-Identifier: MIT */
/*
 * An event queue an application can poll: an eventfd in semaphore mode
 * counts the queued events, and a ring under a mutex holds them.
 *
 * The fd is what verbs exposes (context->async_fd, channel->fd), so
 * poll/epoll/select and O_NONBLOCK work exactly as with the kernel's
 * uverbs file.  Each push adds one to the counter after the event is in
 * the ring; each pop takes one count and then one event.  When an object
 * is destroyed its unread events are forgotten, leaving a count with no
 * event; pop skips such counts, so the fd may be readable once more than
 * there are events -- a spurious wakeup, never a lost or invented event.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "../sv.h"

int sv_evq_init(struct sv_evq *q)
{
	memset(q, 0, sizeof(*q));
	q->fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (q->fd < 0)
		return errno;
	pthread_mutex_init(&q->lock, NULL);
	return 0;
}

void sv_evq_destroy(struct sv_evq *q)
{
	if (q->fd >= 0)
		close(q->fd);
	q->fd = -1;
	free(q->ev);
	q->ev = NULL;
	pthread_mutex_destroy(&q->lock);
}

int sv_evq_push(struct sv_evq *q, void *obj, int type, int port)
{
	uint64_t one = 1;

	pthread_mutex_lock(&q->lock);
	if (q->count == q->cap) {
		uint32_t ncap = q->cap ? q->cap * 2 : 16;
		struct sv_event *n = malloc(ncap * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&q->lock);
			return ENOMEM;
		}
		for (uint32_t i = 0; i < q->count; i++)
			n[i] = q->ev[(q->head + i) % q->cap];
		free(q->ev);
		q->ev = n;
		q->cap = ncap;
		q->head = 0;
	}
	q->ev[(q->head + q->count) % q->cap] = (struct sv_event){ obj, type, port };
	q->count++;
	pthread_mutex_unlock(&q->lock);
	/* The counter is raised only after the event is visible in the ring
	 * (the mutex orders them), so a reader woken by it finds the event. */
	if (write(q->fd, &one, sizeof(one)) != sizeof(one))
		return errno;
	return 0;
}

int sv_evq_pop(struct sv_evq *q, struct sv_event *out)
{
	for (;;) {
		uint64_t v;

		/* A signal ends the wait with EINTR, as rdma-core's plain read()
		 * of the uverbs fd does: programs such as qperf rely on an alarm
		 * interrupting ibv_get_cq_event. */
		if (read(q->fd, &v, sizeof(v)) != sizeof(v))
			return errno;
		pthread_mutex_lock(&q->lock);
		bool got = q->count > 0;
		if (got) {
			*out = q->ev[q->head];
			q->head = (q->head + 1) % q->cap;
			q->count--;
		}
		pthread_mutex_unlock(&q->lock);
		if (got)
			return 0;
		/* A count whose event was forgotten: wait for the next one. */
	}
}

int sv_evq_forget(struct sv_evq *q, const void *obj)
{
	int dropped = 0;

	pthread_mutex_lock(&q->lock);
	uint32_t kept = 0;
	for (uint32_t i = 0; i < q->count; i++) {
		struct sv_event e = q->ev[(q->head + i) % q->cap];
		if (e.obj == obj)
			dropped++;
		else
			q->ev[(q->head + kept++) % q->cap] = e;
	}
	q->count = kept;
	pthread_mutex_unlock(&q->lock);
	return dropped;
}
