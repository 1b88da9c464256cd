/* SPDX-License-Identifier: MIT */
/*
 * The poller window: how the udp link's endpoint thread (udp.c
 * rx_thread) tells whether an application thread is polling a CQ, and
 * when the polls have stopped.  The decisions are pure functions of the
 * thread's state, the last poll's time and the clock, so that a table
 * checks them (tests/unit/test_udp_window.c).
 *
 * Pollers count as active until a look of the thread finds no poll in
 * the window.  It starts short, so that an application that polls only
 * now and then gets its packets from the thread, and doubles while the
 * polls go on: each look is a thread wake-up on the poller's core, and
 * on a virtual machine a wake-up's timer and switches cost the poller
 * tens of microseconds.  What a poller leaves (held ACKs, packets that
 * came after its last poll) waits two windows at most after the thread
 * runs, far below any retransmission timeout in use (IBA 9.7.6.1.3's
 * 4.096 us x 2^timeout: 2 ms is timeout 9; rdma-core's tools and
 * perftest use 14).
 */
#ifndef SV_UDP_WINDOW_H
#define SV_UDP_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

#define POLLER_MIN_NS	200000ull
#define POLLER_MAX_NS	1000000ull

/*
 * An application that polled a CQ (unarmed) this recently is a polling
 * one, whose next post is near: what the thread itself receives for it
 * then holds its ACKs as a poll's batch does, for that post to carry, and
 * the thread ticks (sending them) after HELD_ACK_NS at the latest.  The
 * bound is two of the longest windows: the thread receives for such an
 * application once a window has closed, up to a window after its last
 * poll's.  Without it, a ping-pong over one-sided WRITEs, each side
 * waiting for the other's data in memory and not on a CQ (ib_write_lat),
 * fell from its good cycle, where every ACK rides with the next WRITE and
 * arrives while the peer polls for it, into one where every ACK left
 * alone: the peer's poll ended with the ACK, and the WRITE that followed
 * waited in the socket for the thread's look, a window away (averages of
 * 421-768 us against a typical 10-13 us; 18-39 us since).  Holding the
 * ACK brings the cycle back at the next exchange.
 */
#define POLLER_RECENT_NS	(2 * POLLER_MAX_NS)
#define HELD_ACK_NS		POLLER_MIN_NS

static inline bool sv_window_recent(uint64_t last_poll, uint64_t now)
{
	return last_poll && last_poll + POLLER_RECENT_NS > now;
}

/* The thread's own; the polls' side is one time, last_poll. */
struct sv_poll_window {
	uint64_t len;		/* a poll counts as active this long */
	uint64_t ticked;	/* last_poll as the thread's last tick read it */
};

static inline void sv_window_init(struct sv_poll_window *w)
{
	w->len = POLLER_MIN_NS;
	w->ticked = 0;
}

/* A poll's time may be later than the caller's clock read. */
static inline bool sv_window_open(const struct sv_poll_window *w, uint64_t last_poll,
				  uint64_t now)
{
	return last_poll + w->len > now;
}

/*
 * A look: returns whether pollers are active, and sets *closed when a
 * poll came since the last tick and its window has closed, so that the
 * thread ticks and sends what the polls held.  It goes by the polls'
 * time, not by what the thread saw: a poll that kicked the thread,
 * whose whole window passed before the thread got its core, is over
 * all the same, and what it held waits for that tick.
 */
static inline bool sv_window_look(struct sv_poll_window *w, uint64_t last_poll, uint64_t now,
				  bool *closed)
{
	bool open = sv_window_open(w, last_poll, now);

	if (!open)
		w->len = POLLER_MIN_NS;
	*closed = !open && last_poll != w->ticked;
	return open;
}

/* The thread ticked (any tick sends what polls held) after it read
 * last_poll: polls up to then are served. */
static inline void sv_window_ticked(struct sv_poll_window *w, uint64_t last_poll)
{
	w->ticked = last_poll;
}

/* A look that found nothing while they poll: the window grows. */
static inline void sv_window_quiet(struct sv_poll_window *w)
{
	w->len = 2 * w->len < POLLER_MAX_NS ? 2 * w->len : POLLER_MAX_NS;
}

#endif
