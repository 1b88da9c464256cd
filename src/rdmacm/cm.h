/* SPDX-License-Identifier: MIT */
/*
 * librdmacm.so.1: rdma_cm on softverbs.
 *
 * A host is a network namespace.  Its RDMA port space, and the wire that
 * carries connection messages between processes of the host, are
 * SOCK_SEQPACKET sockets in the abstract AF_UNIX namespace, which the
 * kernel keeps per network namespace: a bound id holds the name
 * "softverbs-rdmacm:PS:PORT", so a second bind of the port gets
 * EADDRINUSE from bind(2) itself, and a process's ports are freed when it
 * dies, with no registry entry to reclaim.  A listener's socket listens; a
 * connecting id connects its own socket to the listener's name and the
 * accepted socket becomes the new id's.  The messages are those of the
 * IBTA CM (chapter 12: REQ, REP, RTU, REJ, DREQ, DREP, SIDR_REQ and
 * SIDR_REP) with their private-data sizes; their fields are the ones a CM
 * MAD carries, so the same exchange crosses hosts as MADs to QP1 (mad.c).
 *
 * Layering: this library is a verbs consumer like any other.  It includes
 * <infiniband/verbs.h> and calls libibverbs.so.1's public verbs, plus the
 * settings and explain lines of softverbs' core (SOFTVERBS_PRIVATE_1).
 *
 * Nothing runs behind the application's back: an event channel's fd is an
 * epoll set of its ids' sockets, an eventfd that is readable while events
 * are queued, and a timerfd for the CM timeouts, so poll(2) on it wakes
 * when rdma_get_cm_event() has work, and that call does the work.
 */
#ifndef SV_RDMACM_CM_H
#define SV_RDMACM_CM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <rdma/rdma_cma.h>

#include "../gsi.h"

#define CM_EXPORT __attribute__((visibility("default")))

/* ---- the id state machine ---- */
#define CM_STATES(X)							\
	X(IDLE)          /* created */					\
	X(BOUND)         /* an address and port, no peer */		\
	X(ADDR_RESOLVED)						\
	X(ROUTE_RESOLVED)						\
	X(LISTEN)							\
	X(ACCEPTING)     /* passive: socket accepted, its REQ not yet read */ \
	X(REQ_SENT)      /* active: REQ or SIDR_REQ out, waiting for REP */ \
	X(REQ_RCVD)      /* passive: CONNECT_REQUEST reported */	\
	X(REP_SENT)      /* passive: accepted, waiting for RTU */	\
	X(REP_RCVD)      /* active: CONNECT_RESPONSE reported, no QP */ \
	X(ESTABLISHED)							\
	X(DREQ_SENT)							\
	X(DISCONNECTED)							\
	X(FAILED)        /* rejected, unreachable or reset */

#define CM_STATE_ENUM(s) CM_##s,
enum cm_state { CM_STATES(CM_STATE_ENUM) CM_NSTATES };
#undef CM_STATE_ENUM
const char *cm_state_name(enum cm_state s);

/* ---- connection messages (IBTA 12.6; attribute IDs of the CM MADs) ---- */
enum cm_msg_type {
	CM_MSG_REQ = 0x10, CM_MSG_MRA = 0x11, CM_MSG_REJ = 0x12, CM_MSG_REP = 0x13,
	CM_MSG_RTU = 0x14, CM_MSG_DREQ = 0x15, CM_MSG_DREP = 0x16,
	CM_MSG_SIDR_REQ = 0x17, CM_MSG_SIDR_REP = 0x18,
};

/* Private data each message carries (IBTA table 99 and following); rdma_cm
 * puts its own 36-byte header first in REQ and SIDR_REQ for the IP port
 * spaces (kernel cma_user_data_offset), leaving the rest to the user. */
enum {
	CM_PDATA_REQ = 92, CM_PDATA_REP = 196, CM_PDATA_REJ = 148, CM_PDATA_RTU = 224,
	CM_PDATA_DREQ = 220, CM_PDATA_DREP = 224, CM_PDATA_SIDR_REQ = 216,
	CM_PDATA_SIDR_REP = 136, CM_PDATA_MAX = 224, CM_IP_HDR = 36,
};

/* REJ reasons (IBTA table 112) and SIDR_REP status (table 119). */
enum {
	CM_REJ_INVALID_SERVICE_ID = 8,
	CM_REJ_CONSUMER_DEFINED = 28,
	CM_SIDR_REJECT = 1,
};

struct cm_msg {
	uint8_t type;			/* enum cm_msg_type */
	uint8_t qp_type;		/* enum ibv_qp_type of the sender's QP */
	uint8_t pdata_len;		/* the user's bytes in pdata */
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t retry_count;
	uint8_t rnr_retry_count;
	uint8_t flags;			/* CM_F_* */
	uint32_t reason;		/* REJ reason, SIDR_REP status */
	uint32_t qpn;
	uint32_t psn;
	uint32_t qkey;
	uint16_t lid;
	uint16_t pad;
	struct ibv_ece ece;
	union ibv_gid gid;		/* the sender's port GID for its address */
	struct sockaddr_storage src;	/* the sender's address */
	struct sockaddr_storage dst;	/* the address it sent to */
	uint8_t pdata[CM_PDATA_MAX];
};
enum { CM_F_SRQ = 1, CM_F_FLOW_CONTROL = 2 };
enum { CM_REJ_GRACE_TRIES = 25 };

/* ---- objects ---- */
struct cm_id;

struct cm_event {
	struct rdma_cm_event ev;
	struct cm_id *owner;		/* whose events_out it counts in */
	struct cm_mcast *mc;		/* MULTICAST_JOIN: the group */
	TAILQ_ENTRY(cm_event) link;
	uint8_t pdata[CM_PDATA_MAX];
};

struct cm_chan {
	struct rdma_event_channel ch;	/* ch.fd: the epoll set */
	int evfd;			/* readable while events are queued */
	int tfd;			/* the earliest CM timeout of its ids */
	bool sync;			/* private to one synchronous id */
	bool closed;			/* destroyed with a getter waiting */
	int waiters;			/* getters blocked in poll, cm_mu held to count */
	TAILQ_HEAD(, cm_event) events;
	TAILQ_HEAD(, cm_id) ids;
};

/* REQ: an accepted socket that sends no REQ; REWATCH: a listener that ran
 * out of fds looks at its socket again. */
enum cm_timer { CM_T_NONE, CM_T_REP, CM_T_RTU, CM_T_DREP, CM_T_TIMEWAIT, CM_T_REQ, CM_T_REWATCH };

struct cm_mcast {
	struct sockaddr_storage addr;
	union ibv_gid mgid;
	uint16_t mlid;
	bool attached;
	void *context;
	bool send_only;
	struct cm_mcast *next;
};

struct cm_id {
	struct rdma_cm_id id;
	enum cm_state state;
	struct cm_chan *chan;
	TAILQ_ENTRY(cm_id) link;	/* in chan->ids */
	int fd;				/* the port's socket, or the connection's */
	int mfd;			/* a listener's: MADs for its service ID (mad.c) */
	int port_fd;			/* a remote connection's: the port it holds */
	bool in_epoll;
	uint16_t port;			/* host order; 0 while unbound */
	struct ibv_sa_path_rec path;
	uint8_t sgid_index;

	/* what the connection was negotiated with */
	uint32_t psn;			/* our starting PSN */
	uint32_t remote_qpn, remote_psn, remote_qkey;
	union ibv_gid remote_gid;
	uint16_t remote_lid;
	uint8_t responder_resources;	/* ours: the peer's reads we serve */
	uint8_t initiator_depth;	/* ours: our reads outstanding */
	uint8_t retry_count, rnr_retry_count;
	bool remote_srq;
	struct ibv_ece local_ece, remote_ece;

	/* options */
	uint8_t tos;
	bool tos_set;
	uint8_t ack_timeout;
	bool ack_timeout_set;
	int reuseaddr, afonly;

	/* timers */
	enum cm_timer timer;
	uint64_t deadline_ns;
	unsigned tries;
	/*
	 * REQs to another host answered "invalid service ID" and sent again.
	 * On a real fabric the client's address and route resolution take
	 * long enough that a server which tells its client the port before
	 * it binds or listens (qperf; perftest 4.5's second connection) is
	 * listening by the time the REQ comes; here they take microseconds.
	 * So that REJ is taken as final only after 25 tries 20 ms apart;
	 * newer perftest retries the same way itself (retry_rdma_connect).
	 */
	unsigned rej_grace;
	bool grace_due;		/* the CM_T_REP timer is a grace retry's */

	/* events reported to the application and not yet acked */
	unsigned events_out;
	/* listeners: CONNECT_REQUESTs queued and not yet retrieved */
	int backlog, pending;
	struct cm_id *listener;		/* a passive id's, until reported */
	bool destroying;

	/* A peer on another host: messages are CM MADs (mad.c). */
	bool remote;
	bool will;			/* its DREQ is with the guard (mad.c) */
	TAILQ_ENTRY(cm_id) rlink;	/* mad.c's remote ids */
	uint32_t local_comm_id, remote_comm_id;
	uint64_t tid;
	uint8_t last_type;		/* the last MAD sent, for retries and repeats */
	uint8_t last_mad[256];

	struct ibv_qp_init_attr_ex *ep_qp_attr;	/* rdma_create_ep, passive */
	struct cm_mcast *mcasts;
};

static inline struct cm_id *cm_of(struct rdma_cm_id *id)
{
	return (struct cm_id *)id;
}

/* One lock for the whole library: connection setup is not a fast path,
 * and one lock makes every transition atomic with its event. */
extern pthread_mutex_t cm_mu;
extern pthread_cond_t cm_cv;

/* id.c */
struct ibv_context *cm_device(void);	/* softverbs0, opened once */
struct ibv_pd *cm_default_pd(struct ibv_context *ctx);
void cm_use_device(struct cm_id *c);
struct cm_id *cm_id_new(struct cm_chan *ch, void *context, enum rdma_port_space ps,
			enum ibv_qp_type qpt);
void cm_id_free(struct cm_id *c);
int cm_fail(int err, struct cm_id *c, const char *verb, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void cm_explain_event(const struct cm_id *c, const struct rdma_cm_event *ev, const char *why);
bool cm_ps_valid(enum rdma_port_space ps);
int cm_private_max(const struct cm_id *c, enum cm_msg_type t);

/* channel.c */
struct cm_chan *cm_chan_new(bool sync);
void cm_chan_attach(struct cm_chan *ch, struct cm_id *c);
void cm_chan_detach(struct cm_id *c);
void cm_watch(struct cm_id *c, bool on);
struct cm_event *cm_event_queue(struct cm_id *c, enum rdma_cm_event_type type, int status);
void cm_set_timer(struct cm_id *c, enum cm_timer t, uint64_t ns);
uint64_t cm_now_ns(void);
uint64_t cm_response_ns(void);
int cm_sync_wait(struct cm_id *c);	/* called with cm_mu held */
void cm_discard_events(struct cm_id *c);
struct cm_chan *cm_leave_channel(struct cm_id *c);
void cm_chan_release(struct cm_chan *ch);

/* addr.c */
int cm_bind_locked(struct cm_id *c, const struct sockaddr *addr);
bool cm_addr_local(const struct sockaddr *a);
void cm_addr_gid(struct ibv_context *ctx, const struct sockaddr *a, union ibv_gid *gid,
		 uint8_t *index);
void cm_fill_path(struct cm_id *c);
socklen_t cm_port_addr(enum rdma_port_space ps, uint16_t port, void *sun);
const char *cm_addr_str(const struct sockaddr *a, char *buf, size_t len);
uint16_t cm_addr_port(const struct sockaddr *a);
void cm_addr_set_port(struct sockaddr *a, uint16_t port);
socklen_t cm_addr_len(const struct sockaddr *a);
bool cm_roce(struct ibv_context *ctx);
bool cm_addr_onlink(const struct sockaddr *dst, struct sockaddr_storage *src);

/* conn.c */
void cm_on_readable(struct cm_id *c);
void cm_on_timer(struct cm_id *c);
void cm_drop_connection(struct cm_id *c);
int cm_send(struct cm_id *c, struct cm_msg *m);
void cm_on_msg(struct cm_id *c, const struct cm_msg *m);

/* mad.c */
uint64_t cm_service_id(enum rdma_port_space ps, uint16_t port);
void cm_mad_bind(struct cm_id *c);
int cm_mad_listen(struct cm_id *l);
int cm_mad_connect(struct cm_id *c);
int cm_mad_send(struct cm_id *c, const struct cm_msg *m);
void cm_mad_resend(struct cm_id *c);
void cm_mad_on_listener(struct cm_id *l);
void cm_mad_on_readable(struct cm_id *c);
void cm_mad_forget(struct cm_id *c);
void cm_mad_established(struct cm_id *c);

/* qp.c */
int cm_init_qp_attr(struct cm_id *c, struct ibv_qp_attr *a, int *mask);
int cm_modify_qp(struct cm_id *c, enum ibv_qp_state s);
int cm_qp_err(struct cm_id *c);

/* mcast.c */
void cm_mcast_leave_all(struct cm_id *c);
void cm_mcast_joined(struct cm_id *c, struct cm_mcast *m);
bool cm_addr_multicast(const struct sockaddr *a);

/* rsocket_dgram.c: datagram rsockets; rsocket.c hands each call on one
 * (ds_is) to these, which set errno and return -1 on failure as the
 * rsocket calls do */
struct pollfd;
bool ds_is(int fd);
int ds_socket(int domain, int type);
int ds_bind(int fd, const struct sockaddr *addr, socklen_t len);
int ds_connect(int fd, const struct sockaddr *addr, socklen_t len);
ssize_t ds_sendmsg(int fd, const struct msghdr *msg, int flags, const char *call);
ssize_t ds_recvmsg(int fd, struct msghdr *msg, int flags, const char *call);
int ds_getsockname(int fd, struct sockaddr *addr, socklen_t *len);
int ds_getpeername(int fd, struct sockaddr *addr, socklen_t *len);
int ds_setsockopt(int fd, int level, int name, const void *val, socklen_t len);
int ds_getsockopt(int fd, int level, int name, void *val, socklen_t *len);
int ds_fcntl(int fd, int cmd, long arg);
int ds_shutdown(int fd, int how);
int ds_close(int fd);
short ds_poll_revents(int fd, short events);
int ds_poll_fds(int fd, short events, struct pollfd *p, bool *again);
void ds_poll_woke(int fd, const struct pollfd *p, int n);

/* softverbs' core, exported by libibverbs.so.1 under SOFTVERBS_PRIVATE_1 */
int softverbs_cm_setting(const char *key);
void softverbs_cm_explain(const char *what, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#endif
