/* SPDX-License-Identifier: MIT */
/*
 * rsockets: stream sockets over rdma_cm and an RC QP, as librdmacm's
 * rsocket API gives them (and librspreload.so, which puts them under
 * unmodified socket programs).
 *
 * The stream.  Each end registers a receive ring of RS_SLOTS slots of
 * RS_SLOT bytes and tells the other its address and rkey in the private
 * data of the connection (REQ one way, REP the other).  A send is an RDMA
 * WRITE_WITH_IMM of up to one slot into the peer's next slot, the
 * immediate naming the message (data, credit, FIN, iomap) and its length;
 * RC ordering means the slots fill in order.  The sender holds one credit
 * per free slot of the peer's ring; the receiver returns slots as the
 * application consumes them, in a zero-byte SEND whose immediate carries
 * the count.  Receive WQEs carry no buffer (every byte lands by WRITE), so
 * they are reposted as soon as they complete; a side has at most RS_SLOTS
 * data messages and RS_SLOTS credit messages in flight towards the other,
 * and the receive queue holds both.
 *
 * riomap() registers a buffer and sends its offset, address and rkey to
 * the peer through the stream; riowrite() is then an RDMA WRITE into it,
 * ordered with the stream's messages.
 *
 * An rsocket's number is the fd of its rdma_cm event channel, so every
 * rsocket has a distinct small integer that the kernel will not hand out
 * again while the rsocket lives.  rpoll() polls the CQ's completion
 * channel and the event channel of each rsocket, and any other fd as it is.
 *
 * Datagram rsockets (SOCK_DGRAM) are rsocket_dgram.c's: each call below
 * hands a datagram rsocket's number to it first (ds_is), and rpoll()
 * polls both kinds and kernel fds together.
 *
 * Fork: an rsocket does not survive fork(), as in rdma-core.  librspreload's
 * fork mode (RDMAV_FORK_SAFE=1) works on these: it accepts on a kernel TCP
 * socket and moves the connection to an rsocket at its first use, in
 * whichever process that is.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <rdma/rsocket.h>

#include "cm.h"

enum { RS_SLOTS = 32, RS_SLOT = 64 * 1024, RS_MAX_IOMAP = 16 };
#define RS_POLL_NS 20000L	/* how long a blocking call polls before it sleeps */
enum { RS_SQ = 2 * RS_SLOTS + 8, RS_RQ = 2 * RS_SLOTS + 8, RS_CQ = RS_SQ + RS_RQ };

/* The immediate: the operation in the top 3 bits, a length or count below. */
enum { RS_OP_DATA = 1, RS_OP_CREDIT = 2, RS_OP_FIN = 3, RS_OP_IOMAP = 4 };
#define RS_IMM(op, v)	(((uint32_t)(op) << 29) | ((uint32_t)(v) & 0x1fffffff))
#define RS_IMM_OP(i)	((i) >> 29)
#define RS_IMM_VAL(i)	((i) & 0x1fffffff)

/* What each end tells the other when connecting. */
struct rs_conn_data {
	uint8_t version;
	uint8_t pad[3];
	uint32_t rkey;
	uint64_t addr;
	uint32_t slots, slot_size;
};

struct rs_iomap {
	uint64_t offset, addr, len;
	uint32_t rkey, pad;
};

enum rs_state { RS_IDLE, RS_BOUND, RS_LISTENING, RS_RESOLVING, RS_CONNECTING, RS_CONNECTED,
		RS_FAILED };

struct rs {
	int fd;
	int domain;
	enum rs_state state;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	bool nonblock;
	int err;			/* SO_ERROR */
	bool eof;			/* the peer's FIN or disconnect */
	bool wr_shut, rd_shut;
	bool disconnected;
	pthread_mutex_t mu;

	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	bool armed;
	uint8_t *rbuf, *sbuf;
	struct ibv_mr *rmr, *smr;
	uint64_t peer_addr;
	uint32_t peer_rkey;

	unsigned credits;		/* free slots of the peer's ring */
	unsigned peer_head;		/* the next peer slot to write */
	unsigned sq_used;		/* send WQEs outstanding */
	unsigned stage;			/* the next staging slot */
	unsigned stage_used;		/* staging slots in flight */

	uint32_t rlen[RS_SLOTS];	/* bytes in each filled slot */
	unsigned rhead, rcount;		/* the first filled slot, and how many */
	unsigned roff;			/* bytes of the first slot consumed */
	unsigned returned;		/* consumed slots not yet credited back */

	struct rs_iomap target[RS_MAX_IOMAP];	/* the peer's maps */
	int ntarget;
	struct ibv_mr *local[RS_MAX_IOMAP];
	int nlocal;
	int iomap_size;
	int sndbuf, rcvbuf;
};

/* ---- the table of rsockets, by number ---- */
enum { RS_MAX_FD = 65536 };
static struct rs *table[RS_MAX_FD];
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;

static struct rs *rs_get(int fd)
{
	struct rs *r = NULL;

	if (fd < 0 || fd >= RS_MAX_FD)
		return NULL;
	pthread_mutex_lock(&table_mu);
	r = table[fd];
	pthread_mutex_unlock(&table_mu);
	return r;
}

static struct rs *lookup(int fd, const char *call)
{
	struct rs *r = rs_get(fd);

	if (!r) {
		softverbs_cm_explain(call, "failed (EBADF): %d is not an rsocket", fd);
		errno = EBADF;
	}
	return r;
}

static int rs_fail(int err, struct rs *r, const char *call, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int rs_fail(int err, struct rs *r, const char *call, const char *fmt, ...)
{
	char why[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	softverbs_cm_explain(call, "failed (%s): rsocket %d: %s", strerrorname_np(err) ?
			     strerrorname_np(err) : "?", r ? r->fd : -1, why);
	errno = err;
	return -1;
}

static struct rs *rs_new(int domain, struct rdma_event_channel *ch, struct rdma_cm_id *id)
{
	struct rs *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->domain = domain;
	r->ch = ch;
	r->id = id;
	r->fd = ch->fd;
	r->iomap_size = RS_MAX_IOMAP;
	r->sndbuf = r->rcvbuf = RS_SLOTS * RS_SLOT;
	id->context = r;
	pthread_mutex_init(&r->mu, NULL);
	/* The channel is always read without blocking; a blocking call
	 * waits in poll(2). */
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	pthread_mutex_lock(&table_mu);
	table[r->fd] = r;
	pthread_mutex_unlock(&table_mu);
	return r;
}

static void rs_free_resources(struct rs *r)
{
	for (int i = 0; i < r->nlocal; i++)
		ibv_dereg_mr(r->local[i]);
	r->nlocal = 0;
	if (r->id && r->id->qp)
		rdma_destroy_qp(r->id);
	if (r->rmr)
		ibv_dereg_mr(r->rmr);
	if (r->smr)
		ibv_dereg_mr(r->smr);
	if (r->cq)
		ibv_destroy_cq(r->cq);
	if (r->cc)
		ibv_destroy_comp_channel(r->cc);
	r->rmr = r->smr = NULL;
	r->cq = NULL;
	r->cc = NULL;
	if (r->rbuf)
		munmap(r->rbuf, (size_t)RS_SLOTS * RS_SLOT);
	if (r->sbuf)
		munmap(r->sbuf, (size_t)RS_SLOTS * RS_SLOT);
	r->rbuf = r->sbuf = NULL;
}

/* ---- the QP, its CQ and the rings ---- */
static int post_recv(struct rs *r)
{
	struct ibv_recv_wr wr = { .wr_id = 0 }, *bad;

	return ibv_post_recv(r->id->qp, &wr, &bad);
}

static int rs_setup(struct rs *r)
{
	struct ibv_qp_init_attr qa = { 0 };
	size_t len = (size_t)RS_SLOTS * RS_SLOT;

	r->cc = ibv_create_comp_channel(r->id->verbs);
	if (!r->cc)
		return -1;
	fcntl(r->cc->fd, F_SETFL, fcntl(r->cc->fd, F_GETFL) | O_NONBLOCK);
	r->cq = ibv_create_cq(r->id->verbs, RS_CQ, r, r->cc, 0);
	r->rbuf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	r->sbuf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!r->cq || r->rbuf == MAP_FAILED || r->sbuf == MAP_FAILED) {
		if (r->rbuf == MAP_FAILED)
			r->rbuf = NULL;
		if (r->sbuf == MAP_FAILED)
			r->sbuf = NULL;
		return -1;
	}
	r->rmr = ibv_reg_mr(r->id->pd, r->rbuf, len, IBV_ACCESS_LOCAL_WRITE |
			    IBV_ACCESS_REMOTE_WRITE);
	r->smr = ibv_reg_mr(r->id->pd, r->sbuf, len, IBV_ACCESS_LOCAL_WRITE);
	if (!r->rmr || !r->smr)
		return -1;
	qa.send_cq = qa.recv_cq = r->cq;
	qa.cap.max_send_wr = RS_SQ;
	qa.cap.max_recv_wr = RS_RQ;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.qp_type = IBV_QPT_RC;
	qa.sq_sig_all = 1;
	if (rdma_create_qp(r->id, r->id->pd, &qa))
		return -1;
	for (int i = 0; i < RS_RQ; i++)
		if (post_recv(r))
			return -1;
	r->credits = RS_SLOTS;
	return 0;
}

static void conn_data(struct rs *r, struct rs_conn_data *d)
{
	memset(d, 0, sizeof(*d));
	d->version = 1;
	d->rkey = r->rmr->rkey;
	d->addr = (uint64_t)(uintptr_t)r->rbuf;
	d->slots = RS_SLOTS;
	d->slot_size = RS_SLOT;
}

static int take_peer(struct rs *r, const void *pdata, size_t len)
{
	struct rs_conn_data d;

	if (!pdata || len < sizeof(d))
		return -1;
	memcpy(&d, pdata, sizeof(d));
	if (d.version != 1 || d.slots != RS_SLOTS || d.slot_size != RS_SLOT)
		return -1;
	r->peer_addr = d.addr;
	r->peer_rkey = d.rkey;
	return 0;
}

/* ---- progress: CM events and completions, never blocking ---- */
static void failed(struct rs *r, int err)
{
	r->err = err;
	r->state = RS_FAILED;
}

static void on_cm_event(struct rs *r, struct rdma_cm_event *ev)
{
	switch (ev->event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (rdma_resolve_route(r->id, 2000))
			failed(r, errno);
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED: {
		struct rs_conn_data d;
		struct rdma_conn_param p = { .private_data = &d, .private_data_len = sizeof(d),
					     .responder_resources = 1, .initiator_depth = 1,
					     .retry_count = 7, .rnr_retry_count = 7 };

		if (rs_setup(r)) {
			failed(r, errno ? errno : ENOMEM);
			break;
		}
		conn_data(r, &d);
		if (rdma_connect(r->id, &p))
			failed(r, errno);
		else
			r->state = RS_CONNECTING;
		break;
	}
	case RDMA_CM_EVENT_ESTABLISHED:
		if (r->state == RS_CONNECTING) {
			if (take_peer(r, ev->param.conn.private_data, ev->param.conn.private_data_len)) {
				failed(r, ECONNREFUSED);
				rdma_disconnect(r->id);
			} else {
				r->state = RS_CONNECTED;
			}
		}
		break;
	case RDMA_CM_EVENT_REJECTED:
		failed(r, ECONNREFUSED);
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		failed(r, EHOSTUNREACH);
		break;
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		failed(r, ETIMEDOUT);
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		r->disconnected = true;
		r->eof = true;
		break;
	default:
		break;
	}
}

static void cm_progress(struct rs *r)
{
	struct rdma_cm_event *ev;

	if (r->state == RS_LISTENING)
		return;	/* its events are requests, for raccept */
	while (!rdma_get_cm_event(r->ch, &ev)) {
		on_cm_event(r, ev);
		rdma_ack_cm_event(ev);
	}
}

static int send_credit(struct rs *r, uint32_t op, uint32_t val)
{
	struct ibv_send_wr wr = { .opcode = IBV_WR_SEND_WITH_IMM,
				  .imm_data = htobe32(RS_IMM(op, val)) }, *bad;

	if (r->sq_used >= RS_SQ)
		return -1;
	if (ibv_post_send(r->id->qp, &wr, &bad))
		return -1;
	r->sq_used++;
	return 0;
}

static void take_iomap(struct rs *r, const uint8_t *p, uint32_t len)
{
	struct rs_iomap m;

	if (len != sizeof(m) || r->ntarget == RS_MAX_IOMAP)
		return;
	memcpy(&m, p, sizeof(m));
	r->target[r->ntarget++] = m;
}

/* Returns how many completions it took. */
static int cq_progress(struct rs *r)
{
	struct ibv_wc wc[16];
	int n, took = 0;

	if (!r->cq)
		return 0;
	while ((n = ibv_poll_cq(r->cq, 16, wc)) > 0) {
		took += n;
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				if (!(wc[i].opcode & IBV_WC_RECV) && r->sq_used)
					r->sq_used--;
				if (wc[i].status != IBV_WC_WR_FLUSH_ERR && !r->err)
					r->err = ECONNRESET;
				r->eof = true;
				continue;
			}
			if (!(wc[i].opcode & IBV_WC_RECV)) {
				r->sq_used--;
				if (wc[i].wr_id & 1)
					r->stage_used--;
				continue;
			}
			uint32_t imm = be32toh(wc[i].imm_data);
			post_recv(r);
			switch (RS_IMM_OP(imm)) {
			case RS_OP_DATA:
			case RS_OP_IOMAP: {
				unsigned slot = (r->rhead + r->rcount) % RS_SLOTS;

				r->rlen[slot] = RS_IMM_VAL(imm);
				if (RS_IMM_OP(imm) == RS_OP_IOMAP) {
					/* Consumed at once: the slot goes straight back. */
					take_iomap(r, r->rbuf + (size_t)slot * RS_SLOT, RS_IMM_VAL(imm));
					r->rlen[slot] = 0;
				}
				r->rcount++;
				break;
			}
			case RS_OP_CREDIT:
				r->credits += RS_IMM_VAL(imm);
				break;
			case RS_OP_FIN:
				r->eof = true;
				break;
			}
		}
	}
	/* Empty slots at the head (iomap messages, drained data) go back. */
	while (r->rcount && r->rlen[r->rhead] == r->roff) {
		r->rhead = (r->rhead + 1) % RS_SLOTS;
		r->rcount--;
		r->roff = 0;
		r->returned++;
	}
	if (r->returned && (r->returned >= RS_SLOTS / 4 || !r->rcount) &&
	    !send_credit(r, RS_OP_CREDIT, r->returned))
		r->returned = 0;
	return took;
}

static void progress(struct rs *r)
{
	cm_progress(r);
	cq_progress(r);
}

/* Waits for anything on r (CM events, completions) for at most ms (-1:
 * no limit); 0, or -1 with errno. */
static int wait_rs(struct rs *r, int ms)
{
	struct pollfd p[2] = { { .fd = r->ch->fd, .events = POLLIN } };
	int n = 1;

	if (r->cc) {
		/* A reply often comes within microseconds: poll the CQ that
		 * long before sleeping on its channel, as rdma-core's
		 * rsockets do (polling_time), since a wakeup costs the
		 * progress thread's futex and an eventfd. */
		struct timespec t0, t;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		do {
			if (cq_progress(r))
				return 0;
			clock_gettime(CLOCK_MONOTONIC, &t);
		} while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) <
			 RS_POLL_NS);
		if (!r->armed && !ibv_req_notify_cq(r->cq, 0))
			r->armed = true;
		/* What arrived before the arming raises no event: it is
		 * taken now, and the caller looks again. */
		if (cq_progress(r))
			return 0;
		p[1].fd = r->cc->fd;
		p[1].events = POLLIN;
		n = 2;
	}
	pthread_mutex_unlock(&r->mu);
	int ret = poll(p, (nfds_t)n, ms);
	pthread_mutex_lock(&r->mu);
	if (ret < 0)
		return -1;
	if (r->cc && (p[1].revents & POLLIN)) {
		struct ibv_cq *cq;
		void *ctx;

		if (!ibv_get_cq_event(r->cc, &cq, &ctx)) {
			ibv_ack_cq_events(cq, 1);
			r->armed = false;
		}
	}
	return 0;
}

/* ---- the socket calls ---- */
CM_EXPORT int rsocket(int domain, int type, int protocol)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct rs *r;

	if (domain != AF_INET && domain != AF_INET6)
		return rs_fail(EAFNOSUPPORT, NULL, "rsocket", "domain %d: rsockets are AF_INET or "
			       "AF_INET6", domain);
	if ((type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) == SOCK_DGRAM &&
	    (!protocol || protocol == IPPROTO_UDP))
		return ds_socket(domain, type);
	if ((type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) != SOCK_STREAM ||
	    (protocol && protocol != IPPROTO_TCP))
		return rs_fail(EOPNOTSUPP, NULL, "rsocket", "type %d protocol %d: rsockets are "
			       "SOCK_STREAM (TCP) or SOCK_DGRAM (UDP)", type, protocol);
	ch = rdma_create_event_channel();
	if (!ch)
		return -1;
	if (ch->fd >= RS_MAX_FD || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		int err = ch->fd >= RS_MAX_FD ? EMFILE : errno;

		rdma_destroy_event_channel(ch);
		return rs_fail(err, NULL, "rsocket", "rdma_create_id: %s", strerror(err));
	}
	r = rs_new(domain, ch, id);
	if (!r) {
		rdma_destroy_id(id);
		rdma_destroy_event_channel(ch);
		return rs_fail(ENOMEM, NULL, "rsocket", "out of memory");
	}
	r->nonblock = type & SOCK_NONBLOCK;
	return r->fd;
}

CM_EXPORT int rbind(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
	struct rs *r;
	int ret;

	if (ds_is(socket))
		return ds_bind(socket, addr, addrlen);
	r = lookup(socket, "rbind");
	if (!r)
		return -1;
	if (!addr || addrlen < sizeof(struct sockaddr_in))
		return rs_fail(EINVAL, r, "rbind", "a short address");
	pthread_mutex_lock(&r->mu);
	ret = rdma_bind_addr(r->id, (struct sockaddr *)addr);
	if (!ret)
		r->state = RS_BOUND;
	pthread_mutex_unlock(&r->mu);
	return ret;
}

CM_EXPORT int rlisten(int socket, int backlog)
{
	struct rs *r;
	int ret;

	if (ds_is(socket))
		return rs_fail(EOPNOTSUPP, NULL, "rlisten", "rsocket %d is a datagram socket", socket);
	r = lookup(socket, "rlisten");
	if (!r)
		return -1;
	pthread_mutex_lock(&r->mu);
	ret = rdma_listen(r->id, backlog);
	if (!ret)
		r->state = RS_LISTENING;
	pthread_mutex_unlock(&r->mu);
	return ret;
}

static void copy_addr(const struct sockaddr *a, struct sockaddr *out, socklen_t *len)
{
	socklen_t n = a->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) :
		      sizeof(struct sockaddr_in);

	if (out && len) {
		memcpy(out, a, *len < n ? *len : n);
		*len = n;
	}
}

CM_EXPORT int raccept(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	struct rs *l, *r;
	struct rdma_cm_event *ev;
	struct rdma_event_channel *ch;

	if (ds_is(socket))
		return rs_fail(EOPNOTSUPP, NULL, "raccept", "rsocket %d is a datagram socket", socket);
	l = lookup(socket, "raccept");
	if (!l)
		return -1;
	pthread_mutex_lock(&l->mu);
	if (l->state != RS_LISTENING) {
		pthread_mutex_unlock(&l->mu);
		return rs_fail(EINVAL, l, "raccept", "the rsocket does not listen");
	}
	for (;;) {
		if (!rdma_get_cm_event(l->ch, &ev)) {
			if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
				break;
			rdma_ack_cm_event(ev);
			continue;
		}
		if (errno != EAGAIN || l->nonblock) {
			pthread_mutex_unlock(&l->mu);
			return -1;
		}
		if (wait_rs(l, -1)) {
			pthread_mutex_unlock(&l->mu);
			return -1;
		}
	}
	pthread_mutex_unlock(&l->mu);

	struct rdma_cm_id *id = ev->id;
	struct rs_conn_data peer, mine;
	bool ok = ev->param.conn.private_data_len >= sizeof(peer);
	if (ok)
		memcpy(&peer, ev->param.conn.private_data, sizeof(peer));
	rdma_ack_cm_event(ev);
	ch = rdma_create_event_channel();
	if (!ch || ch->fd >= RS_MAX_FD || rdma_migrate_id(id, ch) || !(r = rs_new(l->domain, ch, id))) {
		int err = errno ? errno : ENOMEM;

		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		if (ch)
			rdma_destroy_event_channel(ch);
		return rs_fail(err, l, "raccept", "a new rsocket: %s", strerror(err));
	}
	pthread_mutex_lock(&r->mu);
	if (!ok || take_peer(r, &peer, sizeof(peer)) || rs_setup(r)) {
		int err = ok ? (errno ? errno : ENOMEM) : EPROTO;

		rdma_reject(id, NULL, 0);
		pthread_mutex_unlock(&r->mu);
		rclose(r->fd);
		return rs_fail(err, l, "raccept", "the connection's rings: %s", strerror(err));
	}
	conn_data(r, &mine);
	struct rdma_conn_param p = { .private_data = &mine, .private_data_len = sizeof(mine),
				     .responder_resources = 1, .initiator_depth = 1,
				     .rnr_retry_count = 7 };
	if (rdma_accept(id, &p)) {
		int err = errno;

		pthread_mutex_unlock(&r->mu);
		rclose(r->fd);
		return rs_fail(err, l, "raccept", "rdma_accept: %s", strerror(err));
	}
	/* The QP is in RTS once rdma_accept returns: data may flow before
	 * the RTU arrives (rdma_notify's rule, IBA 12.6.10). */
	r->state = RS_CONNECTED;
	r->nonblock = l->nonblock;
	pthread_mutex_unlock(&r->mu);
	copy_addr(&id->route.addr.dst_addr, addr, addrlen);
	return r->fd;
}

CM_EXPORT int rconnect(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
	struct rs *r;

	if (ds_is(socket))
		return ds_connect(socket, addr, addrlen);
	r = lookup(socket, "rconnect");
	if (!r)
		return -1;
	if (!addr || addrlen < sizeof(struct sockaddr_in))
		return rs_fail(EINVAL, r, "rconnect", "a short address");
	pthread_mutex_lock(&r->mu);
	if (r->state == RS_CONNECTED || r->state == RS_LISTENING) {
		pthread_mutex_unlock(&r->mu);
		return rs_fail(EISCONN, r, "rconnect", "connected or listening already");
	}
	if (r->state == RS_IDLE || r->state == RS_BOUND) {
		if (rdma_resolve_addr(r->id, NULL, (struct sockaddr *)addr, 2000)) {
			int err = errno;

			pthread_mutex_unlock(&r->mu);
			return rs_fail(err, r, "rconnect", "rdma_resolve_addr: %s", strerror(err));
		}
		r->state = RS_RESOLVING;
		/* A non-blocking connect is under way, as TCP's: rpoll says
		 * POLLOUT when it is done and SO_ERROR how it went. */
		if (r->nonblock) {
			pthread_mutex_unlock(&r->mu);
			errno = EINPROGRESS;
			return -1;
		}
	}
	for (;;) {
		progress(r);
		if (r->state == RS_CONNECTED) {
			pthread_mutex_unlock(&r->mu);
			return 0;
		}
		if (r->state == RS_FAILED) {
			int err = r->err ? r->err : ECONNREFUSED;

			pthread_mutex_unlock(&r->mu);
			return rs_fail(err, r, "rconnect", "the connection failed");
		}
		if (r->nonblock) {
			pthread_mutex_unlock(&r->mu);
			errno = EALREADY;
			return -1;
		}
		if (wait_rs(r, -1)) {
			pthread_mutex_unlock(&r->mu);
			return -1;
		}
	}
}

/* ---- the stream ---- */
static bool can_send(struct rs *r)
{
	return r->credits && r->sq_used + 2 <= RS_SQ && r->stage_used < RS_SLOTS;
}

/* WRITEs the staged slot (n bytes) into the peer's next slot as message op. */
static int post_slot(struct rs *r, uint32_t op, size_t n)
{
	uint8_t *stage = r->sbuf + (size_t)r->stage * RS_SLOT;
	struct ibv_sge sge = { .addr = (uintptr_t)stage, .length = (uint32_t)n,
			       .lkey = r->smr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
				  .imm_data = htobe32(RS_IMM(op, n)) }, *bad;

	wr.wr.rdma.remote_addr = r->peer_addr + (uint64_t)r->peer_head * RS_SLOT;
	wr.wr.rdma.rkey = r->peer_rkey;
	if (ibv_post_send(r->id->qp, &wr, &bad))
		return -1;
	r->sq_used++;
	r->stage_used++;
	r->stage = (r->stage + 1) % RS_SLOTS;
	r->credits--;
	r->peer_head = (r->peer_head + 1) % RS_SLOTS;
	return 0;
}

/* One message of at most one slot, gathered from iov; the iov is advanced. */
static ssize_t send_one(struct rs *r, const struct iovec **iov, int *iovcnt, size_t *ioff,
			size_t left)
{
	size_t n = left < RS_SLOT ? left : RS_SLOT, done = 0;
	uint8_t *stage = r->sbuf + (size_t)r->stage * RS_SLOT;

	while (done < n) {
		size_t k = (*iov)->iov_len - *ioff;

		if (k > n - done)
			k = n - done;
		memcpy(stage + done, (const uint8_t *)(*iov)->iov_base + *ioff, k);
		done += k;
		*ioff += k;
		if (*ioff == (*iov)->iov_len) {
			(*iov)++;
			(*iovcnt)--;
			*ioff = 0;
		}
	}
	return post_slot(r, RS_OP_DATA, n) ? -1 : (ssize_t)n;
}

/* The connected rsocket a stream call works on, locked, and the bytes its
 * iovec holds; NULL (errno set) when there is none. */
static struct rs *stream_begin(int socket, const struct iovec *iov, int iovcnt, size_t *total,
			       const char *call)
{
	struct rs *r = lookup(socket, call);

	if (!r)
		return NULL;
	*total = 0;
	for (int i = 0; i < iovcnt; i++)
		*total += iov[i].iov_len;
	pthread_mutex_lock(&r->mu);
	if (r->state != RS_CONNECTED) {
		pthread_mutex_unlock(&r->mu);
		rs_fail(ENOTCONN, r, call, "not connected");
		return NULL;
	}
	return r;
}

static ssize_t rs_sendv(int socket, const struct iovec *iov, int iovcnt, int flags,
			const char *call)
{
	size_t total, sent = 0, ioff = 0;
	struct rs *r = stream_begin(socket, iov, iovcnt, &total, call);

	if (!r)
		return -1;
	while (sent < total) {
		progress(r);
		if (r->wr_shut || r->disconnected || r->err) {
			pthread_mutex_unlock(&r->mu);
			if (sent)
				return (ssize_t)sent;
			return rs_fail(r->err ? r->err : EPIPE, r, call, "the connection is closed");
		}
		if (!can_send(r)) {
			if (r->nonblock || (flags & MSG_DONTWAIT)) {
				pthread_mutex_unlock(&r->mu);
				if (sent)
					return (ssize_t)sent;
				errno = EWOULDBLOCK;
				return -1;
			}
			if (wait_rs(r, -1)) {
				pthread_mutex_unlock(&r->mu);
				return sent ? (ssize_t)sent : -1;
			}
			continue;
		}
		ssize_t n = send_one(r, &iov, &iovcnt, &ioff, total - sent);
		if (n < 0) {
			pthread_mutex_unlock(&r->mu);
			return sent ? (ssize_t)sent : rs_fail(ECONNRESET, r, call, "ibv_post_send");
		}
		sent += (size_t)n;
	}
	pthread_mutex_unlock(&r->mu);
	return (ssize_t)sent;
}

static ssize_t rs_recvv(int socket, const struct iovec *iov, int iovcnt, int flags,
			const char *call)
{
	size_t total, got = 0, voff = 0;
	int vi = 0;
	struct rs *r = stream_begin(socket, iov, iovcnt, &total, call);

	if (!r)
		return -1;
	for (;;) {
		progress(r);
		/* Copy what the filled slots hold. */
		unsigned slot = r->rhead, count = r->rcount, off = r->roff;
		while (got < total && count) {
			uint32_t avail = r->rlen[slot] - off;
			size_t k = iov[vi].iov_len - voff;

			if (k > avail)
				k = avail;
			if (k > total - got)
				k = total - got;
			memcpy((uint8_t *)iov[vi].iov_base + voff,
			       r->rbuf + (size_t)slot * RS_SLOT + off, k);
			got += k;
			voff += k;
			off += (unsigned)k;
			if (voff == iov[vi].iov_len) {
				vi++;
				voff = 0;
			}
			if (off == r->rlen[slot]) {
				slot = (slot + 1) % RS_SLOTS;
				count--;
				off = 0;
				if (!(flags & MSG_PEEK))
					r->returned++;
			}
		}
		if (!(flags & MSG_PEEK)) {
			r->rhead = slot;
			r->rcount = count;
			r->roff = off;
		}
		if (got && !(flags & MSG_WAITALL && got < total && !r->eof))
			break;
		if (got == total && total)
			break;
		if (r->eof || r->rd_shut || !total)
			break;
		if (r->nonblock || (flags & MSG_DONTWAIT)) {
			pthread_mutex_unlock(&r->mu);
			errno = EWOULDBLOCK;
			return -1;
		}
		if (wait_rs(r, -1)) {
			pthread_mutex_unlock(&r->mu);
			return got ? (ssize_t)got : -1;
		}
	}
	cq_progress(r);	/* return the slots just consumed */
	pthread_mutex_unlock(&r->mu);
	return (ssize_t)got;
}

/* A datagram rsocket's send, with its destination (NULL: the peer). */
static ssize_t ds_sendv(int socket, const struct iovec *iov, int iovcnt, int flags,
			const struct sockaddr *to, socklen_t tolen, const char *call)
{
	struct msghdr m = { .msg_name = (void *)to, .msg_namelen = to ? tolen : 0,
			    .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };

	if (iovcnt < 0)
		return rs_fail(EINVAL, NULL, call, "iovcnt %d", iovcnt);
	return ds_sendmsg(socket, &m, flags, call);
}

static ssize_t ds_recvv(int socket, const struct iovec *iov, int iovcnt, int flags,
			struct sockaddr *from, socklen_t *fromlen, const char *call)
{
	struct msghdr m = { .msg_name = from, .msg_namelen = from && fromlen ? *fromlen : 0,
			    .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
	ssize_t n;

	if (iovcnt < 0)
		return rs_fail(EINVAL, NULL, call, "iovcnt %d", iovcnt);
	n = ds_recvmsg(socket, &m, flags, call);
	if (n >= 0 && from && fromlen)
		*fromlen = m.msg_namelen;
	return n;
}

CM_EXPORT ssize_t rsend(int socket, const void *buf, size_t len, int flags)
{
	struct iovec v = { .iov_base = (void *)buf, .iov_len = len };

	if (ds_is(socket))
		return ds_sendv(socket, &v, 1, flags, NULL, 0, "rsend");
	return rs_sendv(socket, &v, 1, flags, "rsend");
}

CM_EXPORT ssize_t rsendto(int socket, const void *buf, size_t len, int flags,
			  const struct sockaddr *dest_addr, socklen_t addrlen)
{
	struct iovec v = { .iov_base = (void *)buf, .iov_len = len };

	if (ds_is(socket))
		return ds_sendv(socket, &v, 1, flags, dest_addr, addrlen, "rsendto");
	/* A connected stream ignores the address, as TCP does. */
	return rs_sendv(socket, &v, 1, flags, "rsendto");
}

CM_EXPORT ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags)
{
	if (!msg)
		return rs_fail(EINVAL, NULL, "rsendmsg", "msg is NULL");
	if (ds_is(socket))
		return ds_sendmsg(socket, msg, flags, "rsendmsg");
	return rs_sendv(socket, msg->msg_iov, (int)msg->msg_iovlen, flags, "rsendmsg");
}

CM_EXPORT ssize_t rwrite(int socket, const void *buf, size_t count)
{
	return rsend(socket, buf, count, 0);
}

CM_EXPORT ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt)
{
	if (ds_is(socket))
		return ds_sendv(socket, iov, iovcnt, 0, NULL, 0, "rwritev");
	return rs_sendv(socket, iov, iovcnt, 0, "rwritev");
}

CM_EXPORT ssize_t rrecv(int socket, void *buf, size_t len, int flags)
{
	struct iovec v = { .iov_base = buf, .iov_len = len };

	if (ds_is(socket))
		return ds_recvv(socket, &v, 1, flags, NULL, NULL, "rrecv");
	return rs_recvv(socket, &v, 1, flags, "rrecv");
}

CM_EXPORT ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags,
			    struct sockaddr *src_addr, socklen_t *addrlen)
{
	struct iovec v = { .iov_base = buf, .iov_len = len };

	if (ds_is(socket))
		return ds_recvv(socket, &v, 1, flags, src_addr, addrlen, "rrecvfrom");
	ssize_t n = rs_recvv(socket, &v, 1, flags, "rrecvfrom");
	struct rs *r = rs_get(socket);

	if (n >= 0 && r && src_addr)
		copy_addr(&r->id->route.addr.dst_addr, src_addr, addrlen);
	return n;
}

CM_EXPORT ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags)
{
	if (!msg)
		return rs_fail(EINVAL, NULL, "rrecvmsg", "msg is NULL");
	if (ds_is(socket))
		return ds_recvmsg(socket, msg, flags, "rrecvmsg");
	return rs_recvv(socket, msg->msg_iov, (int)msg->msg_iovlen, flags, "rrecvmsg");
}

CM_EXPORT ssize_t rread(int socket, void *buf, size_t count)
{
	return rrecv(socket, buf, count, 0);
}

CM_EXPORT ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt)
{
	if (ds_is(socket))
		return ds_recvv(socket, iov, iovcnt, 0, NULL, NULL, "rreadv");
	return rs_recvv(socket, iov, iovcnt, 0, "rreadv");
}

/* ---- poll and select ---- */
static short rs_revents(struct rs *r, short events)
{
	short re = 0;

	progress(r);
	switch (r->state) {
	case RS_LISTENING: {
		struct pollfd p = { .fd = r->ch->fd, .events = POLLIN };

		if (poll(&p, 1, 0) > 0)
			re |= POLLIN;
		break;
	}
	case RS_CONNECTED:
		if (r->rcount || r->eof)
			re |= POLLIN;
		if (can_send(r) && !r->eof)
			re |= POLLOUT;
		if (r->eof && !r->rcount)
			re |= POLLHUP;
		if (r->err)
			re |= POLLERR;
		break;
	case RS_FAILED:
		re |= POLLERR | POLLHUP;
		break;
	default:
		break;
	}
	return re & (events | POLLERR | POLLHUP | POLLNVAL);
}

/* What rpoll does with each entry: a kernel fd is polled as it is; a
 * stream rsocket sleeps on its event channel and CQ channel, a datagram
 * rsocket on its CQ channel and kernel socket (rsocket_dgram.c). */
enum rs_kind { RS_KERNEL, RS_STREAM, RS_DGRAM };

struct rs_slot {
	enum rs_kind kind;
	int at, n;		/* its pollfds in the kernel poll */
};

/* The readiness of an rsocket entry, after progress that never blocks. */
static short entry_revents(const struct pollfd *f, enum rs_kind kind)
{
	struct rs *r;
	short re;

	if (kind == RS_DGRAM)
		return ds_poll_revents(f->fd, f->events);
	r = rs_get(f->fd);
	if (!r)
		return POLLNVAL;
	pthread_mutex_lock(&r->mu);
	re = rs_revents(r, f->events);
	pthread_mutex_unlock(&r->mu);
	return re;
}

/* The pollfds an entry sleeps on, from p; how many. */
static int entry_sleep_fds(const struct pollfd *f, enum rs_kind kind, struct pollfd *p,
			   bool *again)
{
	struct rs *r;
	int n = 0;

	if (kind == RS_KERNEL) {
		p[0] = *f;
		p[0].revents = 0;
		return 1;
	}
	if (kind == RS_DGRAM)
		return ds_poll_fds(f->fd, f->events, p, again);
	r = rs_get(f->fd);
	if (!r)
		return 0;
	pthread_mutex_lock(&r->mu);
	p[n++] = (struct pollfd){ .fd = r->ch->fd, .events = POLLIN };
	if (r->cc) {
		if (!r->armed && !ibv_req_notify_cq(r->cq, 0))
			r->armed = true;
		/* Completions before the arming raise no event. */
		if (cq_progress(r))
			*again = true;
		p[n++] = (struct pollfd){ .fd = r->cc->fd, .events = POLLIN };
	}
	pthread_mutex_unlock(&r->mu);
	return n;
}

/* After the kernel poll: a stream's or datagram's CQ event is taken. */
static void entry_woke(const struct pollfd *f, enum rs_kind kind, const struct pollfd *p, int n)
{
	struct rs *r;

	if (kind == RS_DGRAM) {
		ds_poll_woke(f->fd, p, n);
		return;
	}
	r = rs_get(f->fd);
	if (!r || n < 2)
		return;
	pthread_mutex_lock(&r->mu);
	if (r->cc && p[1].fd == r->cc->fd && (p[1].revents & POLLIN)) {
		struct ibv_cq *cq;
		void *ctx;

		if (!ibv_get_cq_event(r->cc, &cq, &ctx)) {
			ibv_ack_cq_events(cq, 1);
			r->armed = false;
		}
	}
	pthread_mutex_unlock(&r->mu);
}

static long elapsed_ms(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

/*
 * An answer often comes within microseconds: before sleeping, rpoll looks
 * at its rsockets for RS_POLL_NS, as a blocking stream call does (wait_rs)
 * and rdma-core's rpoll does (polling_time), since a wakeup costs the
 * progress thread's futex and an eventfd (measured with udpong's echo: 47
 * us a round trip sleeping at once).  Only when every entry is an
 * rsocket: a kernel fd would cost a system call each look.  How many are
 * ready, or 0.
 */
static int spin(struct pollfd *fds, nfds_t nfds, struct rs_slot *e, int timeout)
{
	struct timespec t0, t;

	if (!timeout)
		return 0;
	for (nfds_t i = 0; i < nfds; i++) {
		e[i].kind = ds_is(fds[i].fd) ? RS_DGRAM : rs_get(fds[i].fd) ? RS_STREAM : RS_KERNEL;
		if (e[i].kind == RS_KERNEL)
			return 0;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		int ready = 0;

		for (nfds_t i = 0; i < nfds; i++) {
			fds[i].revents = entry_revents(&fds[i], e[i].kind);
			if (fds[i].revents)
				ready++;
		}
		if (ready)
			return ready;
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < RS_POLL_NS);
	return 0;
}

CM_EXPORT int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	struct pollfd *p = calloc(nfds * 2 + 1, sizeof(*p));
	struct rs_slot *e = calloc(nfds + 1, sizeof(*e));
	struct timespec t0;
	int ret = -1;

	if (!p || !e) {
		errno = ENOMEM;
		goto out;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ret = spin(fds, nfds, e, timeout);
	if (ret)
		goto out;
	for (;;) {
		int ready = 0, np = 0;
		bool again = false;

		for (nfds_t i = 0; i < nfds; i++) {
			e[i].kind = ds_is(fds[i].fd) ? RS_DGRAM : rs_get(fds[i].fd) ? RS_STREAM :
				    RS_KERNEL;
			fds[i].revents = e[i].kind == RS_KERNEL ? 0 : entry_revents(&fds[i], e[i].kind);
			if (fds[i].revents)
				ready++;
		}
		/* The kernel's fds, and what each rsocket sleeps on. */
		for (nfds_t i = 0; i < nfds; i++) {
			e[i].at = np;
			e[i].n = entry_sleep_fds(&fds[i], e[i].kind, &p[np], &again);
			np += e[i].n;
		}
		int wait = ready || again ? 0 : timeout;
		if (wait > 0) {
			long el = elapsed_ms(&t0);

			wait = el >= timeout ? 0 : (int)(timeout - el);
		}
		int n = poll(p, (nfds_t)np, wait);
		if (n < 0)
			goto out;
		/* Copy back the kernel fds' answers; take the CQ events. */
		for (nfds_t i = 0; i < nfds; i++) {
			if (e[i].kind == RS_KERNEL) {
				fds[i].revents = p[e[i].at].revents;
				if (fds[i].revents)
					ready++;
			} else {
				entry_woke(&fds[i], e[i].kind, &p[e[i].at], e[i].n);
			}
		}
		if (ready || again) {
			/* Recount: rsockets may have become ready too. */
			ready = 0;
			for (nfds_t i = 0; i < nfds; i++) {
				if (e[i].kind != RS_KERNEL)
					fds[i].revents = entry_revents(&fds[i], e[i].kind);
				if (fds[i].revents)
					ready++;
			}
			if (ready || timeout == 0) {
				ret = ready;
				goto out;
			}
			continue;
		}
		if (!n && timeout >= 0 && elapsed_ms(&t0) >= timeout) {
			ret = 0;
			goto out;
		}
	}
out:
	free(p);
	free(e);
	return ret;
}

CM_EXPORT int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds,
		      struct timeval *timeout)
{
	struct pollfd *p = calloc((size_t)nfds + 1, sizeof(*p));
	int n = 0, ret;

	if (!p) {
		errno = ENOMEM;
		return -1;
	}
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;

		if (readfds && FD_ISSET(fd, readfds))
			ev |= POLLIN;
		if (writefds && FD_ISSET(fd, writefds))
			ev |= POLLOUT;
		if (exceptfds && FD_ISSET(fd, exceptfds))
			ev |= POLLPRI;
		if (ev)
			p[n++] = (struct pollfd){ .fd = fd, .events = ev };
	}
	ret = rpoll(p, (nfds_t)n, timeout ? (int)(timeout->tv_sec * 1000 +
						     timeout->tv_usec / 1000) : -1);
	if (ret >= 0) {
		ret = 0;
		if (readfds)
			FD_ZERO(readfds);
		if (writefds)
			FD_ZERO(writefds);
		if (exceptfds)
			FD_ZERO(exceptfds);
		for (int i = 0; i < n; i++) {
			if (readfds && (p[i].revents & (POLLIN | POLLHUP | POLLERR)))
				FD_SET(p[i].fd, readfds), ret++;
			if (writefds && (p[i].revents & (POLLOUT | POLLERR)))
				FD_SET(p[i].fd, writefds), ret++;
			if (exceptfds && (p[i].revents & POLLPRI))
				FD_SET(p[i].fd, exceptfds), ret++;
		}
	}
	free(p);
	return ret;
}

/* ---- names, options, shutdown, close ---- */
CM_EXPORT int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	struct rs *r;

	if (ds_is(socket))
		return ds_getpeername(socket, addr, addrlen);
	r = lookup(socket, "rgetpeername");
	if (!r)
		return -1;
	if (r->state != RS_CONNECTED)
		return rs_fail(ENOTCONN, r, "rgetpeername", "not connected");
	copy_addr(&r->id->route.addr.dst_addr, addr, addrlen);
	return 0;
}

CM_EXPORT int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	struct rs *r;

	if (ds_is(socket))
		return ds_getsockname(socket, addr, addrlen);
	r = lookup(socket, "rgetsockname");
	if (!r)
		return -1;
	if (r->state == RS_IDLE) {
		struct sockaddr_storage any = { .ss_family = (sa_family_t)r->domain };

		copy_addr((struct sockaddr *)&any, addr, addrlen);
		return 0;
	}
	copy_addr(&r->id->route.addr.src_addr, addr, addrlen);
	return 0;
}

CM_EXPORT int rsetsockopt(int socket, int level, int optname, const void *optval,
			  socklen_t optlen)
{
	struct rs *r;

	if (ds_is(socket))
		return ds_setsockopt(socket, level, optname, optval, optlen);
	r = lookup(socket, "rsetsockopt");
	if (!r)
		return -1;
	if (!optval || optlen < sizeof(int))
		return rs_fail(EINVAL, r, "rsetsockopt", "optval too short");
	int v = *(const int *)optval;
	if (level == SOL_SOCKET) {
		switch (optname) {
		case SO_REUSEADDR:
			return r->state == RS_IDLE ?
			       rdma_set_option(r->id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR,
					       &v, sizeof(v)) : 0;
		case SO_SNDBUF:
			r->sndbuf = v;
			return 0;
		case SO_RCVBUF:
			r->rcvbuf = v;
			return 0;
		case SO_REUSEPORT:
		case SO_KEEPALIVE:
		case SO_LINGER:
		case SO_OOBINLINE:
			return 0;	/* accepted; a reliable connection needs no probes */
		default:
			break;
		}
	} else if (level == IPPROTO_TCP && (optname == TCP_NODELAY || optname == TCP_MAXSEG)) {
		return 0;	/* every send is a message of its own already */
	} else if (level == SOL_RDMA) {
		switch (optname) {
		case RDMA_SQSIZE:
		case RDMA_RQSIZE:
		case RDMA_INLINE:
			return 0;	/* the rings are fixed: RS_SLOTS x 64 KiB */
		case RDMA_IOMAPSIZE:
			if (v < 0 || v > RS_MAX_IOMAP)
				return rs_fail(EINVAL, r, "rsetsockopt", "RDMA_IOMAPSIZE %d: at most %d",
					       v, RS_MAX_IOMAP);
			r->iomap_size = v;
			return 0;
		default:
			break;
		}
	}
	return rs_fail(ENOPROTOOPT, r, "rsetsockopt", "level %d option %d", level, optname);
}

CM_EXPORT int rgetsockopt(int socket, int level, int optname, void *optval, socklen_t *optlen)
{
	struct rs *r;
	int v;

	if (ds_is(socket))
		return ds_getsockopt(socket, level, optname, optval, optlen);
	r = lookup(socket, "rgetsockopt");
	if (!r)
		return -1;
	if (!optval || !optlen || *optlen < sizeof(int))
		return rs_fail(EINVAL, r, "rgetsockopt", "optval too short");
	if (level == SOL_SOCKET && optname == SO_ERROR) {
		pthread_mutex_lock(&r->mu);
		progress(r);
		v = r->state == RS_FAILED || r->err ? r->err : 0;
		r->err = 0;
		pthread_mutex_unlock(&r->mu);
	} else if (level == SOL_SOCKET && optname == SO_SNDBUF) {
		v = r->sndbuf;
	} else if (level == SOL_SOCKET && optname == SO_RCVBUF) {
		v = r->rcvbuf;
	} else if (level == SOL_SOCKET && optname == SO_TYPE) {
		v = SOCK_STREAM;
	} else if (level == SOL_SOCKET && (optname == SO_REUSEADDR || optname == SO_KEEPALIVE)) {
		v = 0;
	} else if (level == IPPROTO_TCP && optname == TCP_NODELAY) {
		v = 1;
	} else if (level == IPPROTO_TCP && optname == TCP_MAXSEG) {
		v = RS_SLOT;
	} else if (level == SOL_RDMA && optname == RDMA_IOMAPSIZE) {
		v = r->iomap_size;
	} else {
		return rs_fail(ENOPROTOOPT, r, "rgetsockopt", "level %d option %d", level, optname);
	}
	*(int *)optval = v;
	*optlen = sizeof(int);
	return 0;
}

CM_EXPORT int rfcntl(int socket, int cmd, ...)
{
	struct rs *r;
	va_list ap;
	long arg;

	va_start(ap, cmd);
	arg = va_arg(ap, long);
	va_end(ap);
	if (ds_is(socket))
		return ds_fcntl(socket, cmd, arg);
	r = lookup(socket, "rfcntl");
	if (!r)
		return -1;
	switch (cmd) {
	case F_GETFL:
		return O_RDWR | (r->nonblock ? O_NONBLOCK : 0);
	case F_SETFL:
		r->nonblock = arg & O_NONBLOCK;
		return 0;
	case F_GETFD:
		return FD_CLOEXEC;
	case F_SETFD:
		return 0;
	default:
		return rs_fail(EINVAL, r, "rfcntl", "command %d: rsockets take F_GETFL, F_SETFL, "
			       "F_GETFD and F_SETFD", cmd);
	}
}

CM_EXPORT int rshutdown(int socket, int how)
{
	struct rs *r;

	if (ds_is(socket))
		return ds_shutdown(socket, how);
	r = lookup(socket, "rshutdown");
	if (!r)
		return -1;
	pthread_mutex_lock(&r->mu);
	if (r->state != RS_CONNECTED) {
		pthread_mutex_unlock(&r->mu);
		return rs_fail(ENOTCONN, r, "rshutdown", "not connected");
	}
	if ((how == SHUT_WR || how == SHUT_RDWR) && !r->wr_shut) {
		progress(r);
		send_credit(r, RS_OP_FIN, 0);
		r->wr_shut = true;
	}
	if (how == SHUT_RD || how == SHUT_RDWR)
		r->rd_shut = true;
	pthread_mutex_unlock(&r->mu);
	return 0;
}

CM_EXPORT int rclose(int socket)
{
	struct rs *r;

	if (ds_is(socket))
		return ds_close(socket);
	r = lookup(socket, "rclose");
	if (!r)
		return -1;
	pthread_mutex_lock(&table_mu);
	table[socket] = NULL;
	pthread_mutex_unlock(&table_mu);
	pthread_mutex_lock(&r->mu);
	if (r->state == RS_CONNECTED) {
		/* What was sent is delivered before the connection goes: wait
		 * (a bounded time) for the send queue to drain. */
		for (int i = 0; i < 2000 && r->sq_used && !r->err && !r->disconnected; i++) {
			progress(r);
			if (r->sq_used && wait_rs(r, 1))
				break;
		}
		if (!r->wr_shut && !r->disconnected)
			send_credit(r, RS_OP_FIN, 0);
		rdma_disconnect(r->id);
	}
	rs_free_resources(r);
	pthread_mutex_unlock(&r->mu);
	rdma_destroy_id(r->id);
	rdma_destroy_event_channel(r->ch);
	pthread_mutex_destroy(&r->mu);
	free(r);
	return 0;
}

/* ---- iomap ---- */
CM_EXPORT off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset)
{
	struct rs *r;
	struct rs_iomap m;

	if (ds_is(socket))
		return rs_fail(EOPNOTSUPP, NULL, "riomap", "rsocket %d is a datagram socket", socket);
	r = lookup(socket, "riomap");
	if (!r)
		return -1;
	if (prot != PROT_WRITE || flags)
		return rs_fail(EINVAL, r, "riomap", "prot must be PROT_WRITE and flags 0");
	pthread_mutex_lock(&r->mu);
	if (r->state != RS_CONNECTED || r->nlocal >= r->iomap_size) {
		pthread_mutex_unlock(&r->mu);
		return rs_fail(r->state != RS_CONNECTED ? ENOTCONN : ENOMEM, r, "riomap",
			       "%s", r->state != RS_CONNECTED ? "not connected" :
			       "RDMA_IOMAPSIZE mappings are in use");
	}
	struct ibv_mr *mr = ibv_reg_mr(r->id->pd, buf, len, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE);
	if (!mr) {
		int err = errno;

		pthread_mutex_unlock(&r->mu);
		return rs_fail(err, r, "riomap", "ibv_reg_mr: %s", strerror(err));
	}
	if (offset == -1) {	/* the next free offset: after every map so far */
		offset = 0;
		for (int i = 0; i < r->nlocal; i++)
			offset += (off_t)r->local[i]->length;
	}
	m = (struct rs_iomap){ .offset = (uint64_t)offset, .addr = (uintptr_t)buf, .len = len,
			       .rkey = mr->rkey };
	/* The map travels in the stream, so the peer knows it before any
	 * message sent after this call. */
	while (!can_send(r) && !r->err && !r->disconnected && !wait_rs(r, -1))
		progress(r);
	memcpy(r->sbuf + (size_t)r->stage * RS_SLOT, &m, sizeof(m));
	if (!can_send(r) || post_slot(r, RS_OP_IOMAP, sizeof(m))) {
		ibv_dereg_mr(mr);
		pthread_mutex_unlock(&r->mu);
		return rs_fail(ECONNRESET, r, "riomap", "the connection is gone");
	}
	r->local[r->nlocal++] = mr;
	pthread_mutex_unlock(&r->mu);
	return offset;
}

CM_EXPORT int riounmap(int socket, void *buf, size_t len)
{
	struct rs *r;

	if (ds_is(socket))
		return rs_fail(EOPNOTSUPP, NULL, "riounmap", "rsocket %d is a datagram socket", socket);
	r = lookup(socket, "riounmap");
	if (!r)
		return -1;
	pthread_mutex_lock(&r->mu);
	for (int i = 0; i < r->nlocal; i++)
		if (r->local[i]->addr == buf && r->local[i]->length == len) {
			ibv_dereg_mr(r->local[i]);
			r->local[i] = r->local[--r->nlocal];
			pthread_mutex_unlock(&r->mu);
			return 0;
		}
	pthread_mutex_unlock(&r->mu);
	return rs_fail(EINVAL, r, "riounmap", "no mapping of that buffer");
}

CM_EXPORT size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags)
{
	struct rs *r;
	size_t done = 0;

	if (ds_is(socket))
		return (size_t)rs_fail(EOPNOTSUPP, NULL, "riowrite", "rsocket %d is a datagram socket",
				       socket);
	r = lookup(socket, "riowrite");
	if (!r)
		return (size_t)-1;
	pthread_mutex_lock(&r->mu);
	while (done < count) {
		progress(r);
		const struct rs_iomap *m = NULL;
		uint64_t at = (uint64_t)offset + done;

		for (int i = 0; i < r->ntarget; i++)
			if (at >= r->target[i].offset && at < r->target[i].offset + r->target[i].len)
				m = &r->target[i];
		if (!m) {
			pthread_mutex_unlock(&r->mu);
			if (done)
				return done;
			return (size_t)rs_fail(EINVAL, r, "riowrite", "offset %lld is in none of the "
					       "peer's riomap()s", (long long)at);
		}
		if (r->err || r->disconnected) {
			pthread_mutex_unlock(&r->mu);
			return done ? done : (size_t)rs_fail(ECONNRESET, r, "riowrite", "closed");
		}
		if (r->sq_used + 2 > RS_SQ || r->stage_used >= RS_SLOTS) {
			if (r->nonblock || (flags & MSG_DONTWAIT)) {
				pthread_mutex_unlock(&r->mu);
				if (done)
					return done;
				errno = EWOULDBLOCK;
				return (size_t)-1;
			}
			if (wait_rs(r, -1))
				break;
			continue;
		}
		size_t n = count - done;
		if (n > RS_SLOT)
			n = RS_SLOT;
		if (n > m->offset + m->len - at)
			n = (size_t)(m->offset + m->len - at);
		uint8_t *stage = r->sbuf + (size_t)r->stage * RS_SLOT;
		memcpy(stage, (const uint8_t *)buf + done, n);
		struct ibv_sge sge = { .addr = (uintptr_t)stage, .length = (uint32_t)n,
				       .lkey = r->smr->lkey };
		struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE }, *bad;
		wr.wr.rdma.remote_addr = m->addr + (at - m->offset);
		wr.wr.rdma.rkey = m->rkey;
		if (ibv_post_send(r->id->qp, &wr, &bad))
			break;
		r->sq_used++;
		r->stage_used++;
		r->stage = (r->stage + 1) % RS_SLOTS;
		done += n;
	}
	pthread_mutex_unlock(&r->mu);
	return done;
}
