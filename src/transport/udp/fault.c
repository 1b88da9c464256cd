/* SPDX-License-Identifier: MIT */
/*
 * The wire out, and SOFTVERBS_FAULT: a lossy, duplicating, reordering,
 * corrupting or slow link, for testing what the transport does about it
 * (IBA 9.7, reliable service: retransmission, duplicate and out-of-
 * sequence PSNs; A17.8: a packet with a bad ICRC is dropped).
 *
 * Verdicts are a pure function of (seed, sender, k), k the packet's
 * number in this process: one relaxed fetch-add numbers packets, and
 * splitmix64 turns the triple into independent draws, one per fault.  A
 * run with one sending thread is therefore reproducible packet for
 * packet; several threads numbering packets in a racing order reproduce
 * the fault rates, not the pattern.  A PRNG state per thread was
 * rejected: it would make the pattern depend on which thread sent what.
 *
 * The sender (the packet's source address and the process's registry
 * endpoint) is in the draw because both ends of a connection are usually
 * given the same SOFTVERBS_FAULT, and a real link's two directions lose
 * independently.  With (seed, k) alone the ends drew one sequence, and
 * their packet numbers advance together while a probe and its ACK go
 * back and forth after a timeout: one run of losses in the sequence then
 * took the probe or its answer on every retry, both ends' copies of it
 * in turn (4 losses in a row cost 7 retries and ended an
 * ibv_srq_pingpong in IBV_WC_RETRY_EXC_ERR, its peer alive).
 *
 * With faults off, the path is one sendmsg, one relaxed counter add and
 * the capture check; nothing is copied and no lock is taken.  With faults
 * on, every packet goes through one mutex: held packets (reorder, delay)
 * wait on one list sorted by due time, and sending them under the same
 * lock as new packets is what makes "sent after the next packet" exact.
 * A mutex is fine there: faults are for tests, not for speed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../sv.h"
#include "tap.h"

#define REORDER_WAIT_NS	1000000ull	/* a reordered packet waits at most 1 ms */
#define HELD_MAX	4096		/* beyond this, packets go out at once */
#define BTH_RESV8A	4		/* the byte the ICRC masks (icrc.c) */
#define TOKEN_SHOW	40		/* how much of a bad token an error quotes */

/* ---- settings ---- */

static void set_err(char *err, size_t errlen, const char *fmt, ...) SV_PRINTF(3, 4);
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* A probability: a number in [0, 1], or a percentage in [0%, 100%]. */
static bool parse_prob(const char *v, double *out)
{
	char *end;
	double p;

	/* strtod also takes "inf", "nan" and hex floats: only plain decimals. */
	if (!*v || strspn(v, "0123456789.eE+-%") != strlen(v))
		return false;
	p = strtod(v, &end);
	if (end == v || !isfinite(p))
		return false;
	if (*end == '%') {
		end++;
		p /= 100;
	}
	if (*end || p < 0 || p > 1)
		return false;
	*out = p;
	return true;
}

static bool parse_u64(const char *v, int base, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long x;

	/* strtoull would take a sign and leading blanks. */
	if (*v < '0' || *v > '9')
		return false;
	errno = 0;
	x = strtoull(v, &end, base);
	if (*end || errno || x > max)
		return false;
	*out = x;
	return true;
}

enum fault_key { K_DROP, K_DUP, K_REORDER, K_CORRUPT, K_DELAY, K_SEED, K_COUNT };

static const char *const key_name[K_COUNT] = {
	[K_DROP] = "drop", [K_DUP] = "dup", [K_REORDER] = "reorder",
	[K_CORRUPT] = "corrupt", [K_DELAY] = "delay", [K_SEED] = "seed",
};

static bool blank(char ch)
{
	return ch == ' ' || ch == '\t';
}

/* p[0..*len) without the blanks around it. */
static const char *trim(const char *p, size_t *len)
{
	while (*len && blank(*p))
		p++, (*len)--;
	while (*len && blank(p[*len - 1]))
		(*len)--;
	return p;
}

/* One key=value item of p[0..len), blanks trimmed, into n; 0 or EINVAL. */
static int parse_item(const char *p, size_t len, struct sv_fault_cfg *n, bool *seen,
		      char *err, size_t errlen)
{
	const char *item = trim(p, &len), *eq = memchr(item, '=', len), *key, *v;
	size_t klen, vlen;
	char val[64];
	uint64_t u;
	int k;

	if (!eq) {
		set_err(err, errlen, "\"%.*s\": expected key=value",
			(int)(len < TOKEN_SHOW ? len : TOKEN_SHOW), item);
		return EINVAL;
	}
	klen = (size_t)(eq - item);
	key = trim(item, &klen);
	vlen = len - (size_t)(eq + 1 - item);
	v = trim(eq + 1, &vlen);
	for (k = 0; k < K_COUNT; k++)
		if (klen == strlen(key_name[k]) && !memcmp(key, key_name[k], klen))
			break;
	if (k == K_COUNT) {
		set_err(err, errlen, "\"%.*s\": unknown setting (drop, dup, reorder, corrupt, delay, seed)",
			(int)(len < TOKEN_SHOW ? len : TOKEN_SHOW), item);
		return EINVAL;
	}
	if (vlen >= sizeof(val)) {
		set_err(err, errlen, "\"%.*s...\": value too long", TOKEN_SHOW, item);
		return EINVAL;
	}
	memcpy(val, v, vlen);
	val[vlen] = 0;
	if (seen[k]) {
		set_err(err, errlen, "\"%s=%s\": %s given twice", key_name[k], val, key_name[k]);
		return EINVAL;
	}
	seen[k] = true;

	switch (k) {
	case K_DROP: case K_DUP: case K_REORDER: case K_CORRUPT: {
		double *prob = k == K_DROP ? &n->drop : k == K_DUP ? &n->dup :
			       k == K_REORDER ? &n->reorder : &n->corrupt;

		if (parse_prob(val, prob))
			return 0;
		set_err(err, errlen, "\"%s=%s\": not a probability (0..1 or 0%%..100%%)",
			key_name[k], val);
		return EINVAL;
	}
	case K_DELAY:
		if (parse_u64(val, 10, UINT32_MAX, &u)) {
			n->delay_us = (uint32_t)u;
			return 0;
		}
		set_err(err, errlen, "\"%s=%s\": not a delay in microseconds (0..%u)",
			key_name[k], val, UINT32_MAX);
		return EINVAL;
	default:
		if (parse_u64(val, 0, UINT64_MAX, &u)) {
			n->seed = u;
			return 0;
		}
		set_err(err, errlen, "\"%s=%s\": not a seed (a decimal or 0x number)",
			key_name[k], val);
		return EINVAL;
	}
}

int sv_fault_parse(const char *s, struct sv_fault_cfg *c, char *err, size_t errlen)
{
	struct sv_fault_cfg n = { .on = false };
	bool seen[K_COUNT] = { false };

	size_t all = s ? strlen(s) : 0;

	*c = n;
	set_err(err, errlen, "%s", "");
	/* Nothing, or only blanks, is no fault. */
	trim(s, &all);
	if (!all)
		return 0;
	/* Blanks around items are allowed: "drop=1%, dup=1%". */
	for (const char *p = s; *p;) {
		size_t len = strcspn(p, ","), tlen = len;

		trim(p, &tlen);
		if (!tlen) {
			set_err(err, errlen, "\"%.*s\": empty item", TOKEN_SHOW, s);
			return EINVAL;
		}
		if (parse_item(p, len, &n, seen, err, errlen))
			return EINVAL;
		p += len;
		if (*p == ',' && !*++p) {
			set_err(err, errlen, "\"%.*s\": ends with a comma", TOKEN_SHOW, s);
			return EINVAL;
		}
	}
	n.on = n.drop > 0 || n.dup > 0 || n.reorder > 0 || n.corrupt > 0 || n.delay_us > 0;
	*c = n;
	return 0;
}

static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static struct sv_fault_cfg cfg;

static void cfg_load(void)
{
	const char *s = getenv("SOFTVERBS_FAULT");
	char err[160];

	if (s && sv_fault_parse(s, &cfg, err, sizeof(err)))
		sv_warn("SOFTVERBS_FAULT: %s; no faults injected", err);
}

const struct sv_fault_cfg *sv_fault_config(void)
{
	pthread_once(&cfg_once, cfg_load);
	return &cfg;
}

/* ---- verdicts ---- */

/* Steele, Lea, Flood, "Fast splittable pseudorandom number generators"
 * (OOPSLA 2014): a bijective 64-bit mixer, so distinct inputs never
 * collide and every output bit depends on every input bit. */
static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* True with probability p: the draw's top 53 bits as a double in [0, 1),
 * so p = 1 always hits and p = 0 never does. */
static bool hit(uint64_t draw, double p)
{
	return (double)(draw >> 11) * 0x1p-53 < p;
}

struct verdict {
	unsigned faults;	/* SV_FAULT_* */
	uint64_t corrupt_draw;	/* which byte, and how */
};

/* The sender as one word: its address and its registry endpoint. */
static uint64_t sender_key(const struct sv_flow *f, uint32_t sender)
{
	uint64_t a[2];

	memcpy(a, &f->src, sizeof(a));
	return splitmix64(splitmix64(a[0] ^ sender) ^ a[1]);
}

static struct verdict verdict_of(const struct sv_fault_cfg *c, uint64_t key, uint64_t k)
{
	uint64_t h = splitmix64(c->seed ^ key ^ splitmix64(k));
	struct verdict v = { 0 };

	if (hit(splitmix64(h + 1), c->drop))
		v.faults |= SV_FAULT_DROP;
	if (hit(splitmix64(h + 2), c->dup))
		v.faults |= SV_FAULT_DUP;
	if (hit(splitmix64(h + 3), c->reorder))
		v.faults |= SV_FAULT_REORDER;
	if (hit(splitmix64(h + 4), c->corrupt))
		v.faults |= SV_FAULT_CORRUPT;
	v.corrupt_draw = splitmix64(h + 5);
	return v;
}

/* ---- counters ---- */

static struct {
	_Atomic uint64_t sent, dropped, duplicated, reordered, corrupted, delayed;
} counts;

static void count(_Atomic uint64_t *c)
{
	atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

void sv_fault_counts(struct sv_fault_counts *out)
{
	out->sent = atomic_load_explicit(&counts.sent, memory_order_relaxed);
	out->dropped = atomic_load_explicit(&counts.dropped, memory_order_relaxed);
	out->duplicated = atomic_load_explicit(&counts.duplicated, memory_order_relaxed);
	out->reordered = atomic_load_explicit(&counts.reordered, memory_order_relaxed);
	out->corrupted = atomic_load_explicit(&counts.corrupted, memory_order_relaxed);
	out->delayed = atomic_load_explicit(&counts.delayed, memory_order_relaxed);
}

/* ---- sending ---- */

static struct cmsghdr *add_cmsg(struct msghdr *m, struct cmsghdr *prev, int level, int type,
				const void *data, size_t len)
{
	struct cmsghdr *c = prev ? CMSG_NXTHDR(m, prev) : CMSG_FIRSTHDR(m);

	if (!c)
		return prev;
	c->cmsg_level = level;
	c->cmsg_type = type;
	c->cmsg_len = CMSG_LEN(len);
	memcpy(CMSG_DATA(c), data, len);
	return c;
}

size_t sv_flow_cmsg(const struct sv_flow *f, int family, void *buf, size_t len)
{
	/* CMSG_NXTHDR checks room against msg_controllen, so the whole
	 * buffer is offered and then cut to what was used. */
	struct msghdr m = { .msg_control = buf, .msg_controllen = len };
	struct cmsghdr *c = NULL;
	int tos = f->tclass, ttl = f->ttl;
	static const struct in6_addr any;

	memset(buf, 0, len);
	if (family == AF_INET6 && memcmp(&f->src, &any, sizeof(any))) {
		/* IPv6 addresses are checked against the host's (EINVAL for
		 * one it does not have); an IPv4-mapped one sets the IPv4
		 * source (ip_cmsg_send). */
		struct in6_pktinfo pi = { .ipi6_addr = f->src, .ipi6_ifindex = f->ifindex };
		c = add_cmsg(&m, c, IPPROTO_IPV6, IPV6_PKTINFO, &pi, sizeof(pi));
	}
	if (family != AF_INET6 || f->v4) {
		c = add_cmsg(&m, c, IPPROTO_IP, IP_TOS, &tos, sizeof(tos));
		if (ttl)
			c = add_cmsg(&m, c, IPPROTO_IP, IP_TTL, &ttl, sizeof(ttl));
	} else {
		c = add_cmsg(&m, c, IPPROTO_IPV6, IPV6_TCLASS, &tos, sizeof(tos));
		if (ttl)
			c = add_cmsg(&m, c, IPPROTO_IPV6, IPV6_HOPLIMIT, &ttl, sizeof(ttl));
	}
	return c ? (size_t)((char *)c - (char *)buf) + CMSG_SPACE(c->cmsg_len - CMSG_LEN(0)) : 0;
}

/* One datagram, captured if it left; 0 or an errno. */
static int xmit(int fd, const struct sockaddr *to, socklen_t tolen, const struct sv_flow *f,
		const struct iovec *pkt, int n, size_t len)
{
	union {
		struct cmsghdr align;
		char buf[SV_FLOW_CMSG_SPACE];
	} ctl;
	struct msghdr m = {
		.msg_name = (void *)to, .msg_namelen = tolen,
		.msg_iov = (struct iovec *)pkt, .msg_iovlen = (size_t)n,
		.msg_control = ctl.buf,
	};

	m.msg_controllen = sv_flow_cmsg(f, to->sa_family, ctl.buf, sizeof(ctl.buf));
	if (!m.msg_controllen)
		m.msg_control = NULL;

	int err = sv_pcap_send(fd, &m, f, pkt, n, len);
	if (!err)
		count(&counts.sent);
	return err;
}

/* A packet of ours: a private copy, with what it takes to send it later. */
struct held {
	struct held *next;
	uint64_t due;			/* CLOCK_MONOTONIC ns */
	int fd;
	int copies;			/* 2 when duplicated */
	socklen_t tolen;
	struct sockaddr_storage to;
	struct sv_flow flow;
	size_t len;
	uint8_t data[];
};

static struct {
	pthread_mutex_t lock;
	struct held *head, *tail;	/* by due time, ties in arrival order */
	struct held *waiter;		/* reordered: goes after the next packet */
	unsigned count;			/* on the list, and the waiter */
	/* count as sv_wire_flush reads it without the lock: a stale value
	 * only delays the flush to its next call. */
	_Atomic unsigned any;
} wire = { .lock = PTHREAD_MUTEX_INITIALIZER };

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct held *hold(int fd, const struct sockaddr *to, socklen_t tolen,
			 const struct sv_flow *f, const struct iovec *pkt, int n, size_t len)
{
	struct held *h;
	size_t off = 0;

	if (tolen > sizeof(h->to))
		return NULL;
	h = malloc(sizeof(*h) + len);
	if (!h)
		return NULL;
	*h = (struct held){ .fd = fd, .copies = 1, .tolen = tolen, .flow = *f, .len = len };
	memcpy(&h->to, to, tolen);
	for (int i = 0; i < n && off < len; i++) {
		size_t l = pkt[i].iov_len < len - off ? pkt[i].iov_len : len - off;

		memcpy(h->data + off, pkt[i].iov_base, l);
		off += l;
	}
	h->len = off;
	return h;
}

/* Flips one byte of the copy so that its ICRC fails.  Any byte may be hit,
 * headers and ICRC included, except BTH resv8a: the ICRC does not cover
 * it (icrc.c), so flipping it would be a corruption no receiver sees. */
static void corrupt(struct held *h, uint64_t draw)
{
	size_t pos;
	uint8_t x = (uint8_t)(draw >> 56);

	if (!h->len)
		return;
	if (h->len > BTH_RESV8A) {
		pos = (size_t)(draw % (h->len - 1));
		if (pos >= BTH_RESV8A)
			pos++;
	} else {
		pos = (size_t)(draw % h->len);
	}
	/* Any nonzero pattern in one byte is a burst CRC-32 always detects. */
	h->data[pos] ^= x ? x : 0xff;
}

/* The first copy's error: for a packet sent later, the caller has long
 * returned, and a full socket buffer loses it as on a congested link. */
static int send_held(struct held *h)
{
	struct iovec iov = { .iov_base = h->data, .iov_len = h->len };
	int ret = xmit(h->fd, (struct sockaddr *)&h->to, h->tolen, &h->flow, &iov, 1, h->len);

	for (int i = 1; i < h->copies; i++)
		xmit(h->fd, (struct sockaddr *)&h->to, h->tolen, &h->flow, &iov, 1, h->len);
	return ret;
}

/* Under wire.lock. */
static void list_insert(struct held *h)
{
	struct held **pp;

	if (!wire.tail || wire.tail->due <= h->due) {
		/* The usual case: dues grow as packets come. */
		h->next = NULL;
		if (wire.tail)
			wire.tail->next = h;
		else
			wire.head = h;
		wire.tail = h;
		return;
	}
	for (pp = &wire.head; (*pp)->due <= h->due; pp = &(*pp)->next)
		;
	h->next = *pp;
	*pp = h;
}

/* Under wire.lock. */
static void set_count(unsigned c)
{
	wire.count = c;
	atomic_store_explicit(&wire.any, c, memory_order_relaxed);
}

/* Sends what is due by now; under wire.lock. */
static void send_due(uint64_t now)
{
	struct held *h;

	while ((h = wire.head) && h->due <= now) {
		wire.head = h->next;
		if (!wire.head)
			wire.tail = NULL;
		send_held(h);
		free(h);
		set_count(wire.count - 1);
	}
	if (wire.waiter && wire.waiter->due <= now) {
		send_held(wire.waiter);
		free(wire.waiter);
		wire.waiter = NULL;
		set_count(wire.count - 1);
	}
}

/* Holds h for the delay; under wire.lock, h already in wire.count. */
static void delay(struct held *h, uint64_t now, uint32_t delay_us)
{
	h->due = now + (uint64_t)delay_us * 1000;
	list_insert(h);
	count(&counts.delayed);
}

/* When the first packet still held is due, 0 when none; under wire.lock. */
static uint64_t next_due(void)
{
	uint64_t next = wire.head ? wire.head->due : 0;

	if (wire.waiter && (!next || wire.waiter->due < next))
		next = wire.waiter->due;
	return next;
}

/* The k-th packet of this process: the number its verdict is drawn for. */
static _Atomic uint64_t packet_seq;

static int send_faulty(const struct sv_fault_cfg *c, int fd, const struct sockaddr *to,
		       socklen_t tolen, const struct sv_flow *f, uint32_t sender,
		       const struct iovec *pkt, int n, size_t len, uint64_t *due)
{
	uint64_t k = atomic_fetch_add_explicit(&packet_seq, 1, memory_order_relaxed);
	struct verdict v = verdict_of(c, sender_key(f, sender), k);
	struct held *h = NULL, *w;
	uint64_t now;
	int ret = 0;

	if (v.faults & SV_FAULT_DROP) {
		count(&counts.dropped);
		*due = sv_wire_flush(0);	/* sends nothing: what is held stays */
		return 0;
	}
	if (tolen > sizeof(struct sockaddr_storage))
		return EINVAL;
	if ((v.faults & (SV_FAULT_CORRUPT | SV_FAULT_REORDER)) || c->delay_us) {
		/* Copied outside the lock; the caller may reuse its buffers
		 * as soon as we return. */
		h = hold(fd, to, tolen, f, pkt, n, len);
		if (!h)
			return ENOMEM;
		if (v.faults & SV_FAULT_CORRUPT) {
			corrupt(h, v.corrupt_draw);
			count(&counts.corrupted);
		}
		if (v.faults & SV_FAULT_DUP)
			h->copies = 2;
	}
	if (v.faults & SV_FAULT_DUP)
		count(&counts.duplicated);

	pthread_mutex_lock(&wire.lock);
	now = mono_ns();
	/* What was due before this packet came goes before it. */
	send_due(now);
	if ((v.faults & SV_FAULT_REORDER) && !wire.waiter && wire.count < HELD_MAX) {
		/* One packet waits at a time: a reorder verdict while one
		 * waits makes this packet the one that overtakes it. */
		h->due = now + REORDER_WAIT_NS + (uint64_t)c->delay_us * 1000;
		wire.waiter = h;
		set_count(wire.count + 1);
		count(&counts.reordered);
		*due = next_due();
		pthread_mutex_unlock(&wire.lock);
		return 0;
	}
	if (h && c->delay_us && wire.count < HELD_MAX) {
		set_count(wire.count + 1);
		delay(h, now, c->delay_us);
	} else if (h) {
		ret = send_held(h);
		free(h);
	} else {
		ret = xmit(fd, to, tolen, f, pkt, n, len);
		if (v.faults & SV_FAULT_DUP)
			xmit(fd, to, tolen, f, pkt, n, len);
	}
	w = wire.waiter;
	if (w) {
		/* Right behind this packet: at once, or at its due time
		 * (its due is ours, and ties keep arrival order). */
		wire.waiter = NULL;
		if (c->delay_us) {
			delay(w, now, c->delay_us);
		} else {
			send_held(w);
			free(w);
			set_count(wire.count - 1);
		}
	}
	*due = next_due();
	pthread_mutex_unlock(&wire.lock);
	return ret;
}

int sv_wire_send(int fd, const struct sockaddr *to, socklen_t tolen, const struct sv_flow *f,
		 uint32_t sender, const struct iovec *pkt, int n, size_t len, uint64_t *due)
{
	const struct sv_fault_cfg *c = sv_fault_config();
	uint64_t none;

	if (!due)
		due = &none;
	*due = 0;
	if (!c->on)
		return xmit(fd, to, tolen, f, pkt, n, len);
	return send_faulty(c, fd, to, tolen, f, sender, pkt, n, len, due);
}

uint64_t sv_wire_flush(uint64_t now_ns)
{
	uint64_t next = 0;

	if (!atomic_load_explicit(&wire.any, memory_order_relaxed))
		return 0;
	pthread_mutex_lock(&wire.lock);
	send_due(now_ns);
	next = next_due();
	pthread_mutex_unlock(&wire.lock);
	return next;
}

void sv_wire_forget(int fd)
{
	struct held **pp, *h;
	unsigned gone = 0;

	if (!atomic_load_explicit(&wire.any, memory_order_relaxed))
		return;
	pthread_mutex_lock(&wire.lock);
	for (pp = &wire.head, wire.tail = NULL; (h = *pp);) {
		if (h->fd == fd) {
			*pp = h->next;
			free(h);
			gone++;
		} else {
			wire.tail = h;
			pp = &h->next;
		}
	}
	if (wire.waiter && wire.waiter->fd == fd) {
		free(wire.waiter);
		wire.waiter = NULL;
		gone++;
	}
	set_count(wire.count - gone);
	pthread_mutex_unlock(&wire.lock);
}
