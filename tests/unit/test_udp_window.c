/* SPDX-License-Identifier: MIT */
/*
 * The udp link's poller window (transport/udp/window.h): when the
 * endpoint thread counts a CQ poller as active, and when it ticks
 * because the polls stopped, which sends the ACKs they held.
 *  - a table of single looks, among them a thread that comes to its
 *    look after the poll's whole window has passed (kicked by the poll,
 *    but late to its core): what the poll held is due all the same;
 *  - a table of whether an application polled recently enough that
 *    the thread's own receptions hold their ACKs for its next post;
 *  - schedules of polls and looks at made-up times, late looks among
 *    them: the first look after a poll's window has passed ticks, no
 *    tick comes without a poll since the last, and the thread never
 *    sleeps for good with a poll unserved.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "transport/udp/window.h"

#define US 1000ull

static void test_look_table(void **state)
{
	static const struct {
		const char *what;
		uint64_t len, ticked;	/* the window before the look */
		uint64_t last_poll, now;
		bool open, closed;
		uint64_t len_after;
	} rows[] = {
		{ "no poll ever", POLLER_MIN_NS, 0, 0, 5000 * US, false, false, POLLER_MIN_NS },
		{ "a poll inside the window", POLLER_MIN_NS, 0, 1000 * US, 1100 * US, true, false,
		  POLLER_MIN_NS },
		{ "a poll later than the thread's clock read", POLLER_MIN_NS, 0, 1001 * US,
		  1000 * US, true, false, POLLER_MIN_NS },
		{ "a grown window still open", POLLER_MAX_NS, 0, 1000 * US, 1900 * US, true, false,
		  POLLER_MAX_NS },
		{ "the window just closed", POLLER_MIN_NS, 0, 1000 * US, 1200 * US, false, true,
		  POLLER_MIN_NS },
		{ "a grown window closed: it starts short again", POLLER_MAX_NS, 0, 1000 * US,
		  2000 * US, false, true, POLLER_MIN_NS },
		{ "the thread came late to the poll that kicked it", POLLER_MIN_NS, 0, 1000 * US,
		  1850 * US, false, true, POLLER_MIN_NS },
		{ "the thread came 60 ms late", POLLER_MIN_NS, 500 * US, 1000 * US, 61000 * US,
		  false, true, POLLER_MIN_NS },
		{ "closed, and ticked since", POLLER_MIN_NS, 1000 * US, 1000 * US, 1850 * US,
		  false, false, POLLER_MIN_NS },
		{ "open, and ticked since (a timer's tick)", POLLER_MIN_NS, 1000 * US, 1000 * US,
		  1100 * US, true, false, POLLER_MIN_NS },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct sv_poll_window w = { rows[i].len, rows[i].ticked };
		bool closed = !rows[i].closed;
		bool open = sv_window_look(&w, rows[i].last_poll, rows[i].now, &closed);
		if (open != rows[i].open || closed != rows[i].closed || w.len != rows[i].len_after)
			fail_msg("%s: open %d closed %d len %llu, expected %d %d %llu", rows[i].what,
				 open, closed, (unsigned long long)w.len, rows[i].open,
				 rows[i].closed, (unsigned long long)rows[i].len_after);
	}
}

static void test_quiet_looks_grow_the_window(void **state)
{
	static const uint64_t lens[] = { 400 * US, 800 * US, 1000 * US, 1000 * US };
	struct sv_poll_window w;

	(void)state;
	sv_window_init(&w);
	assert_int_equal(w.len, POLLER_MIN_NS);
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		sv_window_quiet(&w);
		assert_int_equal(w.len, lens[i]);
	}
}

/*
 * Whether the thread's own receptions hold their ACKs for the
 * application's next post: it polled (unarmed) less than two of the
 * longest windows ago.  The thread receives for a polling application
 * once a window has closed, which may be a whole window after the poll
 * and a look later still.
 */
static void test_recent_polls(void **state)
{
	static const struct {
		const char *what;
		uint64_t last_poll, now;
		bool recent;
	} rows[] = {
		{ "no poll ever", 0, 5000 * US, false },
		{ "a poll just now", 5000 * US, 5000 * US, true },
		{ "a poll later than the thread's clock read", 5001 * US, 5000 * US, true },
		{ "a poll a shortest window ago", 4800 * US, 5000 * US, true },
		{ "a poll a longest window ago", 4000 * US, 5000 * US, true },
		{ "a poll just under two longest windows ago", 3000 * US + 1, 5000 * US, true },
		{ "a poll two longest windows ago", 3000 * US, 5000 * US, false },
		{ "a poll a second ago", 1000 * US, 1001000 * US, false },
	};

	(void)state;
	assert_int_equal(POLLER_RECENT_NS, 2 * POLLER_MAX_NS);
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		if (sv_window_recent(rows[i].last_poll, rows[i].now) != rows[i].recent)
			fail_msg("%s: recent %d, expected %d", rows[i].what, !rows[i].recent,
				 rows[i].recent);
}

/* xorshift64: the schedules are the same on every run. */
static uint64_t next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/*
 * The thread's loop as udp.c runs it: look, tick when closed, otherwise
 * sleep until the window's end (while polls go on) or until kicked by
 * the next poll, and come to that look after a scheduling delay of up
 * to 3 ms.  Polls come in runs, some of a single poll, with gaps
 * between.  Checked against the test's own count of the polls since
 * the last tick: a look that finds one whose window has passed ticks;
 * no tick comes without one; the thread never sleeps with no end while
 * one waits; and the last run ends in a tick.
 */
static void test_every_poll_is_followed_by_a_tick(void **state)
{
	uint64_t seed = 0x5eed;
	unsigned late = 0;	/* ticks two windows or more after their poll */

	(void)state;
	for (int sched = 0; sched < 200; sched++) {
		uint64_t polls[64];
		size_t np = 0;
		uint64_t t = 1000 * US;
		while (np < sizeof(polls) / sizeof(polls[0])) {
			t += next_rand(&seed) % 4 ? next_rand(&seed) % (50 * US)
						  : 2000 * US + next_rand(&seed) % (5000 * US);
			polls[np++] = t;
		}
		struct sv_poll_window w;
		sv_window_init(&w);
		uint64_t now = 500 * US, last_poll = 0;
		size_t p = 0;
		bool pending = false;	/* a poll since the last tick */
		for (;;) {
			while (p < np && polls[p] <= now) {
				last_poll = polls[p++];
				pending = true;
			}
			bool closed;
			uint64_t len = w.len;
			bool pollers = sv_window_look(&w, last_poll, now, &closed);
			bool passed = now >= last_poll + len;
			if (pending && passed && !closed)
				fail_msg("schedule %d: a poll's window passed at %llu and no tick",
					 sched, (unsigned long long)now);
			if (closed && !pending)
				fail_msg("schedule %d: a tick with no poll since the last", sched);
			if (closed) {
				late += now >= last_poll + 2 * len;
				sv_window_ticked(&w, last_poll);
				pending = false;
				continue;
			}
			uint64_t wake = pollers ? now + w.len : (p < np ? polls[p] : UINT64_MAX);
			if (wake == UINT64_MAX) {
				if (pending)
					fail_msg("schedule %d: the thread sleeps for good after a poll",
						 sched);
				break;
			}
			if (pollers && !(p < np && polls[p] < wake))
				sv_window_quiet(&w);
			now = wake + next_rand(&seed) % (3000 * US);
		}
		assert_int_equal(p, np);
	}
	/* The schedules do bring the late looks this is about. */
	assert_true(late > 100);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_look_table),
		cmocka_unit_test(test_quiet_looks_grow_the_window),
		cmocka_unit_test(test_recent_polls),
		cmocka_unit_test(test_every_poll_is_followed_by_a_tick),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
