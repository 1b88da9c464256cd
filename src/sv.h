/* SPDX-License-Identifier: MIT */
/*
 * softverbs internal interfaces, grouped by the file that implements them.
 *
 * The public surface is <infiniband/verbs.h> from Debian's libibverbs-dev;
 * nothing here is visible to applications.  Every verbs object below starts
 * with the ibv_* struct an application holds a pointer to, so the
 * conversion is a cast (container_of at offset 0) and the layout contract
 * of rdma-core 44 (reference/abi.md §2) holds.
 */
#ifndef SV_H
#define SV_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/uio.h>
#include <stdint.h>

#include "core/params.h"
#include "core/seg.h"

#define SV_EXPORT __attribute__((visibility("default")))
#define SV_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define SV_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* Removes obj from a singly linked list chained through `next`. */
#define SV_LIST_DEL(headp, obj)						\
	do {								\
		for (__typeof__(obj) *p_ = (headp); *p_; p_ = &(*p_)->next)	\
			if (*p_ == (obj)) {				\
				*p_ = (obj)->next;			\
				break;					\
			}						\
	} while (0)

/* Not in the installed headers: rdma-core 44 libibverbs/driver.h:130. */
enum ibv_gid_type_sysfs {
	IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
	IBV_GID_TYPE_SYSFS_ROCE_V2,
};

/* Exported, but declared only in rdma-core's driver.h (not installed). */
const char *ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);
int ibv_read_ibdev_sysfs_file(char *buf, size_t size, void *sysfs_dev, const char *fnfmt, ...);
int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index,
		       enum ibv_gid_type_sysfs *type);

/* ------------------------------------------------------------------ */
/* core/config.c: settings from the environment and the config file   */

enum sv_link { SV_LINK_IB, SV_LINK_ROCE };

struct sv_config {
	int num_devices;		/* SOFTVERBS_DEVICES */
	char dev_prefix[32];		/* SOFTVERBS_DEVICE_NAME */
	enum sv_link link;		/* SOFTVERBS_LINK_LAYER */
	enum ibv_mtu active_mtu;	/* SOFTVERBS_MTU */
	uint32_t vendor_part_id;	/* SOFTVERBS_VENDOR_PART_ID */
	uint16_t lid;			/* SOFTVERBS_LID, 0 = derive */
	bool lid_addr;			/* SOFTVERBS_LID=addr: from the IPv4 address */
	int explain;			/* SOFTVERBS_EXPLAIN */
	int log_level;			/* SOFTVERBS_LOG */
	char registry[128];		/* SOFTVERBS_REGISTRY */
	enum sv_copy_mode { SV_COPY_AUTO, SV_COPY_CMA, SV_COPY_BOUNCE } copy;	/* SOFTVERBS_COPY */
	/* SOFTVERBS_ASSIST: whether the target's progress thread takes part
	 * in large CMA copies and answers atomics; `force` makes it take part
	 * in every one (tests). */
	enum sv_assist_mode { SV_ASSIST_AUTO, SV_ASSIST_OFF, SV_ASSIST_FORCE } assist;
	uint8_t cm_timeout;		/* SOFTVERBS_CM_TIMEOUT: 4.096 us * 2^n */
	uint8_t cm_retries;		/* SOFTVERBS_CM_RETRIES */
	/* SOFTVERBS_TRANSPORT: a peer on this host goes by shm (auto) or, to
	 * measure or test the packet path, by UDP like any other (udp). */
	enum sv_transport { SV_TRANSPORT_AUTO, SV_TRANSPORT_UDP } transport;
	/* SOFTVERBS_IPV4_ID: the IPv4 identifications a received packet's
	 * ICRC may be for: a GSO run's, 0-63 (gso), or any, as rxe and RoCE
	 * NICs send (transport/udp/icrc.c). */
	enum sv_ipv4_id { SV_IPV4_ID_GSO, SV_IPV4_ID_ANY } ipv4_id;
	char source[256];		/* config file that was read, or "" */
};

const struct sv_config *sv_config(void);
uint64_t sv_host_hash(void);
int32_t sv_pid(void);	/* getpid() without the system call */

/* ------------------------------------------------------------------ */
/* core/log.c: leveled logs and explain mode, stderr only              */

enum sv_log_level { SV_LOG_NONE, SV_LOG_ERROR, SV_LOG_WARN, SV_LOG_INFO, SV_LOG_DEBUG };

void sv_log(enum sv_log_level lvl, const char *fmt, ...) SV_PRINTF(2, 3);
/* A failed verb: sets errno, prints one explain line when enabled, and
 * returns err.  The message names the object, the cause and the fix. */
int sv_fail(int err, const char *verb, const char *fmt, ...) SV_PRINTF(3, 4);
void *sv_fail_null(int err, const char *verb, const char *fmt, ...) SV_PRINTF(3, 4);
#define SV_FAILURE_LEN 200
const char *sv_last_failure(void);	/* the text of this thread's last sv_fail */
/* An explain line about something other than a verb's return (an error
 * completion, say); errno is left alone. */
void sv_explain(const char *what, const char *fmt, ...) SV_PRINTF(2, 3);
int sv_parse_log_level(const char *s);
/* ibv_wc_status_str()'s names. */
const char *sv_wc_status_name(enum ibv_wc_status s);
/* librdmacm's access to the settings and explain lines (SOFTVERBS_PRIVATE_1) */
SV_EXPORT int softverbs_cm_setting(const char *key);
SV_EXPORT void softverbs_cm_explain(const char *what, const char *fmt, ...) SV_PRINTF(2, 3);

#define sv_dbg(...)  sv_log(SV_LOG_DEBUG, __VA_ARGS__)
#define sv_warn(...) sv_log(SV_LOG_WARN, __VA_ARGS__)

/* ------------------------------------------------------------------ */
/* core/gpu.c: CUDA device memory, through libcuda.so.1 loaded at run time */

/* What registration learns of a device pointer. */
struct sv_gpu_mem {
	uint64_t base, size;		/* its allocation */
	void *ctx;			/* CUcontext */
	int ordinal;
	uint8_t uuid[16];		/* the GPU, as other processes find it */
	bool sync;			/* SYNC_MEMOPS refused: copies into it synchronise */
};
/* 1: [addr, +len) is CUDA device memory, within one allocation; 0: it is
 * not (why says how that was found); -errno: device memory that cannot
 * be registered (why says why). */
int sv_gpu_probe(const void *addr, size_t len, struct sv_gpu_mem *g, char *why, size_t wlen);
int sv_gpu_track(const void *addr, size_t len, void *ctx, bool sync);
void sv_gpu_untrack(const void *addr, size_t len);
int sv_gpu_export(const struct sv_gpu_mem *g, void *handle, char *why, size_t wlen);
/* A peer's allocation by its IPC handle: this process's address of it
 * (tracked as device memory until sv_gpu_close), or NULL with why. */
void *sv_gpu_open(const void *handle, const uint8_t uuid[16], uint64_t size, void **ctx,
		  char *why, size_t wlen);
void sv_gpu_close(void *base, uint64_t size, void *ctx);
/* How many device ranges this process names: 0 in every process that
 * never registered or opened GPU memory, where nothing else is asked. */
extern atomic_int sv_gpu_ranges;
static inline bool sv_gpu_active(void)
{
	return atomic_load_explicit(&sv_gpu_ranges, memory_order_relaxed) > 0;
}
bool sv_gpu_dev_iov(const struct iovec *v, int n);
/* Page-locks a host buffer (0, or an errno: then it stays pageable);
 * ctx is the context to unpin it with. */
int sv_gpu_pin(void *p, size_t n, void **ctx);
void sv_gpu_unpin(void *p, void *ctx);
/* n bytes, by cuMemcpy when either side is device memory: 0 or EFAULT. */
int sv_gpu_copy(void *dst, const void *src, size_t n);

/* ------------------------------------------------------------------ */
/* core/handles.c: the set of live objects                             */

/*
 * Every object a verb hands out is recorded here until it is destroyed, so
 * a destroy of a destroyed object, or an object of another context, is
 * answered with EINVAL instead of a use-after-free.  Only the control
 * plane consults it; the data path never does.
 */
enum sv_obj_type {
	SV_OBJ_CONTEXT = 1, SV_OBJ_PD, SV_OBJ_MR, SV_OBJ_CQ, SV_OBJ_CHANNEL,
	SV_OBJ_SRQ, SV_OBJ_QP, SV_OBJ_AH, SV_OBJ_TD, SV_OBJ_MW, SV_OBJ_DM, SV_OBJ_XRCD,
	SV_OBJ_FLOW, SV_OBJ_WQ, SV_OBJ_RWQ_IND,
};

int sv_obj_add(void *obj, enum sv_obj_type type, struct ibv_context *ctx);
bool sv_obj_live(const void *obj, enum sv_obj_type type);
/* Removes obj if it is live with this type; false if it was not. */
bool sv_obj_del(const void *obj, enum sv_obj_type type);
/* The first live object of the type that match() accepts, or NULL.
 * match runs under the table's lock and must not call into it. */
void *sv_obj_find(enum sv_obj_type type, bool (*match)(const void *obj, const void *arg),
		  const void *arg);
/* Removes every live object of ctx with the given type and frees each
 * with free_fn (a closing context's leftovers). */
void sv_obj_release_all(struct ibv_context *ctx, enum sv_obj_type type, void (*free_fn)(void *obj));
/* Calls fn for every live object of ctx with the given type. */
void sv_obj_foreach(struct ibv_context *ctx, enum sv_obj_type type,
		    void (*fn)(void *obj, void *arg), void *arg);

/* ------------------------------------------------------------------ */
/* core/keys.c: index + key-byte tables (lkey/rkey)                    */

/*
 * A key is (index << 8) | key byte.  The key byte changes every time a slot
 * is reused and freed slots are reused oldest-first, so a stale key misses
 * (the scheme of rxe_pool.c).
 */
struct sv_key_slot {
	void *obj;
	uint32_t next_free;
	uint8_t key;
	uint8_t kind;			/* enum shm_mr_kind: MRs and MWs share keys */
};

struct sv_keytab {
	pthread_mutex_t lock;
	struct sv_key_slot *slots;
	uint32_t cap, max, used;
	uint32_t free_head, free_tail;	/* FIFO of free indices, 0 = none */
};

int sv_keytab_init(struct sv_keytab *t, uint32_t max);
void sv_keytab_destroy(struct sv_keytab *t);
/* Returns 0 and the new key, or ENOMEM when the table is full. */
int sv_keytab_alloc(struct sv_keytab *t, void *obj, uint8_t kind, uint32_t *key);
void sv_keytab_free(struct sv_keytab *t, uint32_t key);
/* The object behind key when it is live and of this kind, else NULL. */
void *sv_keytab_lookup(struct sv_keytab *t, uint32_t key, uint8_t kind);
/* Moves a live key to new_key, which must keep its index (a memory
 * window's rkey changes on every bind); 0 or EINVAL. */
int sv_keytab_rekey(struct sv_keytab *t, uint32_t key, uint32_t new_key);

/* ------------------------------------------------------------------ */
/* core/registry.c: the host registry in /dev/shm                      */

enum sv_reg_ep_state { SV_EP_FREE, SV_EP_LIVE };

/* How bytes moved: memcpy in one process, load/store into a peer's
 * mapping, the kernel, the owner's bounce mailbox, or left for the
 * receiver to place (transport/shm/defer.c).  ASSIST is counted by the
 * other side: bytes this process's progress thread moved by CMA for a
 * peer's operation (transport/shm/assist.c), which the peer also counts
 * as its own CMA bytes. */
enum sv_copy_path { SV_PATH_LOCAL, SV_PATH_DIRECT, SV_PATH_CMA, SV_PATH_BOUNCE, SV_PATH_DEFER,
		    SV_PATH_ASSIST, SV_COPY_PATHS };

struct sv_reg_ep_info {
	uint32_t index;
	int32_t pid;
	uint64_t start_time;
	uint32_t dev_index;
	uint32_t nqps;
	uint64_t bytes[SV_COPY_PATHS];
};

struct sv_reg_qp_info {
	uint32_t qpn;
	uint32_t ep;
	int32_t pid;
	uint8_t qp_type;
	uint8_t state;
};

int sv_reg_open(void);
const char *sv_reg_path(void);
/* The registry file's name, which names the host: user and network
 * namespace (its inode number, sv_netns_id). */
void sv_reg_name(char *buf, size_t len);
uint64_t sv_netns_id(void);
/* The first QPN of this user's range, and whether qpn is in it. */
extern uint32_t sv_qpn_base;
bool sv_qpn_ours(uint32_t qpn);
/* True when a process of another user has a registry in this network
 * namespace: one of its QPs is beyond this user's reach (*uid: that user). */
bool sv_reg_other_user(uid_t *uid);
uint16_t sv_reg_lid(unsigned dev_index);
/* A device's port state, host-wide: a word whose low bit is 1 while the
 * port is down and whose upper bits count changes.  Setting it returns
 * 0, or EALREADY when the port already is in that state. */
#define SV_PORT_DOWN(w)		((w) & 1u)
uint32_t sv_reg_port(unsigned dev_index);
int sv_reg_port_set(unsigned dev_index, bool up);
int sv_reg_ep_attach(unsigned dev_index, uint32_t *ep);
void sv_reg_ep_detach(uint32_t ep);
int sv_reg_qpn_alloc(uint32_t ep, enum ibv_qp_type type, uint32_t *qpn);
/* The endpoint owning qpn: 0, or ENOENT when no live process owns it. */
int sv_reg_qpn_owner(uint32_t qpn, struct sv_reg_ep_info *out);
void sv_reg_qpn_free(uint32_t qpn);
void sv_reg_qpn_set_state(uint32_t qpn, enum ibv_qp_state state);
void sv_reg_count_bytes(uint32_t ep, enum sv_copy_path path, uint64_t n);
/* A packet was forwarded to endpoint ep's forwarding socket (after the
 * send); the count its owner watches, NULL when the registry is closed. */
void sv_reg_ep_forwarded(uint32_t ep);
const _Atomic uint32_t *sv_reg_ep_forwards(uint32_t ep);
/* UD multicast: attach/detach a QPN to a group (0, ENOMEM, EINVAL), and
 * the QPNs attached to a group, by GID or (without a GRH) by LID. */
/* A raw frame's headers as flow steering sees them: the filters of
 * verbs.h (network byte order), plus which L3 and L4 are present. */
struct sv_pkt_key {
	struct ibv_flow_eth_filter eth;
	struct ibv_flow_ipv4_ext_filter ip4;
	struct ibv_flow_ipv6_filter ip6;
	struct ibv_flow_tcp_udp_filter l4;
	uint8_t l3;			/* 4, 6, or 0 */
	uint8_t l4proto;		/* IPPROTO_TCP, IPPROTO_UDP, or 0 */
};

/* A compiled ibv_flow_attr: a frame matches when every key byte the mask
 * selects equals the value's. */
struct sv_flow_rule {
	struct sv_pkt_key val, mask;
	uint16_t priority;
	uint8_t port, type;		/* enum ibv_flow_attr_type */
};

int sv_reg_flow_add(uint32_t qpn, const struct sv_flow_rule *r, uint32_t *slot);
void sv_reg_flow_del(uint32_t slot, uint32_t qpn);
/* The QPNs one frame on port reaches, each once. */
int sv_reg_flow_targets(const struct sv_pkt_key *k, uint8_t port, uint32_t *qpns, int max);
int sv_reg_mcast_attach(uint32_t qpn, const union ibv_gid *gid, uint16_t lid);
int sv_reg_mcast_detach(uint32_t qpn, const union ibv_gid *gid, uint16_t lid);
int sv_reg_mcast_members(const union ibv_gid *gid, uint16_t lid, bool by_gid, uint32_t *qpns,
			 int max);
/* Reclaims the entries of dead processes; returns how many. */
int sv_reg_sweep(void);
/* Snapshot for `softverbs status` and the tests. */
int sv_reg_list_eps(struct sv_reg_ep_info *out, int max);
int sv_reg_list_qps(struct sv_reg_qp_info *out, int max);
/* Checks the registry's invariants; returns 0 or a description. */
const char *sv_reg_check(void);
/* Running (not gone, not a zombie) and, unless start_time is 0, the
 * process that started then. */
bool sv_proc_alive(int32_t pid, uint64_t start_time);
uint64_t sv_proc_start_time(int32_t pid);

/* ------------------------------------------------------------------ */
/* core/qp_state.c: the IBTA QP state transition table                 */

struct sv_qp_transition_error {
	int missing;		/* required bits absent */
	int extra;		/* bits neither required nor optional */
	int required, optional;	/* of the transition, when it is legal */
	bool illegal;		/* no such transition for this QP type */
};

int sv_qp_transition_check(enum ibv_qp_type type, enum ibv_qp_state cur,
			   enum ibv_qp_state next, int mask,
			   struct sv_qp_transition_error *why);
/* For explanations: the next hop on the shortest legal path cur -> goal,
 * or -1 when goal cannot be reached. */
int sv_qp_next_hop(enum ibv_qp_type type, enum ibv_qp_state cur,
		   enum ibv_qp_state goal);
int sv_qp_required_mask(enum ibv_qp_type type, enum ibv_qp_state cur,
			enum ibv_qp_state next);
const char *sv_qp_state_name(enum ibv_qp_state s);
const char *sv_qp_type_name(enum ibv_qp_type t);
/* Writes "IBV_QP_AV|IBV_QP_PATH_MTU" into buf. */
const char *sv_qp_mask_str(int mask, char *buf, size_t len);

/* ------------------------------------------------------------------ */
/* core/evq.c: an fd-backed event queue (async_fd, completion channel)  */

struct sv_event {
	void *obj;
	int type;		/* enum ibv_event_type, or 0 for CQ events */
	int port;
};

struct sv_evq {
	int fd;			/* eventfd(EFD_SEMAPHORE): one count per event */
	pthread_mutex_t lock;
	struct sv_event *ev;
	uint32_t cap, head, count;
};

int sv_evq_init(struct sv_evq *q);
void sv_evq_destroy(struct sv_evq *q);
int sv_evq_push(struct sv_evq *q, void *obj, int type, int port);
/* Blocks (or fails with EAGAIN when fd is non-blocking) until an event. */
int sv_evq_pop(struct sv_evq *q, struct sv_event *out);
/* Drops the not yet retrieved events of obj; returns how many. */
int sv_evq_forget(struct sv_evq *q, const void *obj);

/* ------------------------------------------------------------------ */
/* verbs objects                                                        */

struct sv_device {
	struct ibv_device ibdev;	/* first: applications hold &ibdev */
	unsigned index;
	uint64_t guid;			/* host order */
};

struct sv_seg_extent {
	uint64_t off, len, t;
};

/* The owner's view of its shared segment. */
struct sv_seg {
	struct shm_hdr *h;
	int fd;				/* the segment file; also context->cmd_fd */
	pthread_mutex_t lock;		/* the allocator */
	uint64_t heap_end;
	struct sv_seg_extent *free, *quar;
	uint32_t nfree, cap, nquar, quar_cap;
};

struct sv_context {
	struct verbs_context vctx;	/* vctx.context is what apps hold */
	/* An imported context (ibv_import_device) is only this header and
	 * vctx: every verb works on its origin's state.  The origin's state
	 * lives until it and all its imports are closed. */
	struct sv_context *origin;
	/* Imported from a context of another process: that context's
	 * segment (mapped from the command fd), which holds this one's keys
	 * and PDs; NULL otherwise.  Its own queues live in seg as usual. */
	struct shm_hdr *home;
	int home_fd;			/* the command fd it was imported with, or -1 */
	bool home_unmap;		/* home is this context's own mapping */
	atomic_uint imports;		/* open imports of this context */
	bool closed;			/* ibv_close_device was called, imports remain */
	struct sv_device *dev;
	struct sv_seg seg;
	pthread_mutex_t lock;		/* the object lists below */
	struct sv_cq *cqs;
	struct sv_qp *qps;
	struct sv_srq *srqs;
	pthread_t progress;
	bool progress_started;
	atomic_bool stopping;
	uint32_t port_seen;		/* sv_reg_port() as last delivered (progress thread) */
	struct sv_evq async;		/* behind context.async_fd */
	uint32_t ep;			/* host registry endpoint */
	struct sv_keytab mrs;		/* lkey/rkey -> MR */
	atomic_uint nqp, ncq, npd, nsrq, nah;
	atomic_uint wq_seq;		/* numbers of WQs and indirection tables */
	/* Runs a verb another process asked of this context's XRC target QP
	 * through the owner mailbox (transport/shm/owner.c): verbs/qp.c's
	 * sv_qp_serve, handed down so that the transport calls no verb. */
	void (*owner_serve)(struct sv_context *c, struct shm_owner_req *r);
	/* The transports (engine/engine.h struct sv_transport_ops), bound
	 * when the context opens: to contexts of this host (shm) and of
	 * other hosts (udp). */
	const struct sv_transport_ops *tp_mem, *tp_link;
	/* Packets to and from other hosts (engine/pkt.c): set once, when
	 * the first QP meets another host; read by every empty CQ poll. */
	struct pkt_ctx *_Atomic pkt;
};

struct sv_pd {
	struct ibv_pd ibpd;
	atomic_uint users;		/* MRs, QPs, SRQs, AHs, parent domains */
	struct shm_pd *slot;		/* the handle's slot; a parent domain: its parent's */
	bool foreign;			/* imported from another process's context */
	/* A parent domain (rdma-core verbs.h, ibv_alloc_parent_domain): a PD
	 * whose protection is its parent's, with a thread domain and the
	 * application's allocator for queue memory. */
	struct sv_pd *parent;
	struct ibv_td *td;
	void *(*alloc)(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment,
		       uint64_t resource_type);
	void (*free)(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type);
	void *pd_context;
};

/* The PD whose handle protection checks compare. */
static inline struct sv_pd *sv_pd_base(struct sv_pd *pd)
{
	return pd->parent ? pd->parent : pd;
}

/* Device memory: a block of the context's shared segment (shm.h struct
 * shm_dm), so peers reach it by direct load/store like any shareable
 * MR. */
struct sv_dm {
	struct ibv_dm ibdm;
	char *base;			/* the data, in this context's mapping */
	uint64_t len;
	uint64_t block_off, block_len;	/* the segment allocation */
	atomic_uint users;		/* MRs on it */
	bool imported;			/* ibv_import_dm: freed by ibv_unimport_dm */
};

struct sv_mr {
	struct ibv_mr ibmr;
	struct sv_dm *dm;		/* ibv_reg_dm_mr: the device memory */
	struct sv_pd *pd;
	uint64_t iova;
	int access;
	uint64_t share_off;		/* struct shm_share in the segment, or 0 */
	bool gpu;			/* CUDA device memory (core/gpu.c) */
	bool foreign;			/* imported from another process's context */
};

/* A memory window (IBA 10.6.7).  Its rkey, range and rights live in the
 * context's shared key table, where initiators check them. */
struct sv_mw {
	struct ibv_mw ibmw;
	struct sv_pd *pd;
	uint32_t key;			/* what the key table holds: the last bound rkey */
};

struct sv_channel {
	struct ibv_comp_channel ibch;	/* ibch.refcnt counts attached CQs */
	struct sv_evq q;
};

struct sv_cq {
	struct ibv_cq_ex ex;		/* ibv_cq_ex_to_cq() is a cast */
	struct sv_context *ctx;
	struct sv_channel *ch;
	struct shm_cq *sh;		/* the ring, in the context's segment */
	uint64_t sh_off, sh_bytes;
	uint64_t wc_flags;
	atomic_uint users;		/* QPs using it */
	uint32_t comp_events_reported;	/* guarded by ex.mutex */
	uint32_t async_events_reported;
	struct shm_cqe *cur;		/* the entry start_poll/next_poll hold */
	/* The deferred slot most likely next (cq.c): set under the CQ's lock,
	 * read by empty polls without it. */
	_Atomic(const void *) defer_next;
	struct sv_cq *next;		/* context's list, under ctx->lock */
};

/* An XRC domain (IBA 11.2.? "XRC Domain"): XRC target QPs and XRC SRQs of one
 * domain may deliver to each other.  Opened on a file, it is the same
 * domain in every process that opens that file (the id is the inode's). */
struct sv_xrcd {
	struct ibv_xrcd ibxrcd;
	uint64_t id;
	atomic_uint users;		/* XRC SRQs and XRC_RECV QPs */
};

struct sv_srq {
	struct ibv_srq ibsrq;
	struct sv_pd *pd;
	/* XRC SRQs: the domain, the CQ completions go to, the SRQ number
	 * and the directory entry initiators find it by. */
	struct sv_xrcd *xrcd;
	struct sv_cq *cq;
	uint32_t srqn;
	struct shm_qp *xsh;
	uint64_t xsh_off;
	struct ibv_srq_attr attr;
	struct shm_wq *wq;
	uint64_t wq_off, wq_bytes;
	struct sv_srq *next;		/* context's list, under ctx->lock */
	atomic_uint users;		/* QPs using it */
	uint32_t events_reported;
};

/* A send WQE as queued: the WR copied, SGEs and inline data after it. */
/* A send-queue WQE the device queues itself (engine/pkt_req.c): the
 * RDMA READ of a rendezvous payload from another host, into the matched
 * tag's buffer, and the FIN that follows it.  Neither completes to the
 * send CQ: the READ completes the tag in the SRQ's CQ. */
enum sv_hidden { SV_HIDDEN_NONE, SV_HIDDEN_RNDV_READ, SV_HIDDEN_FIN };

/* The READ responses a requester keeps ahead of the first one missing:
 * more than its window of them in flight (engine/pkt_req.c), so that
 * none that arrives is thrown away for being too far ahead. */
#define SV_READ_OOO_BITS	576u

struct sv_swqe {
	uint64_t wr_id;
	uint32_t opcode, send_flags;
	uint32_t imm;			/* big endian, as posted; or the rkey to invalidate */
	uint32_t num_sge;
	uint32_t inline_len;
	uint32_t rkey;
	uint64_t remote_addr;
	uint64_t compare_add, swap;
	uint32_t remote_qpn, remote_qkey;
	uint32_t srqn;			/* XRC_SEND: the remote XRC SRQ */
	struct ibv_ah_attr av;		/* UD destination */
	int rnr_left;			/* RNR retries left; -1 = infinite */
	int retry_left;			/* transport retries left */
	uint64_t rnr_deadline;		/* CLOCK_MONOTONIC ns of the next try */
	struct ibv_mw *mw;		/* BIND_MW: the window, its new rkey in rkey */
	struct ibv_mw_bind_info bind;
	/* A WQE to another host (engine/pkt_req.c): its first PSN, how many
	 * it takes, how many responses have come in (READ, atomics), and
	 * where it stands. */
	uint32_t psn, npkts, got;
	uint64_t ooo[SV_READ_OOO_BITS / 64];	/* READ: responses got + i that came early, bit i */
	uint8_t pstate, pstatus;	/* enum pkt_wqe_state; its error status */
	uint8_t hidden;			/* enum sv_hidden: the device's own work, not a WR */
	struct ibv_sge sge[];		/* num_sge entries, then inline bytes */
};

/* What the requester resolved last for a QP (engine/resp.c), so that the
 * next operation to the same place takes no lock: the peer's segment
 * (peers stay mapped for the life of the process), and the direct
 * mapping of the last MR it reached (mappings are never unmapped).  Both
 * are revalidated on every use, and used under the QP's sq_lock. */
struct sv_peer_cache {
	struct shm_hdr *seg;
	uint32_t ep;
	int32_t pid;
	uint64_t start_time;
};

struct sv_map_cache {
	const struct shm_mr *mr;	/* the entry, in the peer's segment */
	uint32_t key;
	uint64_t addr, length, share_off;
	char *base;			/* this process's address of addr; NULL: not mappable */
};

struct sv_qp {
	struct ibv_qp_ex ex;		/* ex.qp_base is the ibv_qp */
	struct sv_context *ctx;
	struct shm_qp *sh;		/* what initiators see */
	uint16_t slid;			/* this port's LID, for receivers' completions */
	uint64_t sh_off;
	struct shm_wq *rq;		/* own receive queue, NULL with an SRQ */
	uint64_t rq_off, rq_bytes;
	/* The send queue is private: only this process executes it. */
	pthread_mutex_t sq_lock;
	char *sq;
	bool sq_from_app;		/* allocated by a parent domain's allocator */
	uint32_t sq_size, sq_stride, sq_head, sq_count;
	/* Of sq_count, the device's own WQEs (enum sv_hidden): a QP of a
	 * tag-matching SRQ reads rendezvous payloads from another host and
	 * sends their FINs on its send queue, in sq_hidden_max slots beyond
	 * max_send_wr (SV_TM_HIDDEN_WQES for such a QP, else 0). */
	uint32_t sq_hidden, sq_hidden_max;
	/* The head WQE waits for an RNR or retry timer.  Written under
	 * sq_lock; the progress thread reads it without, as a hint, and then
	 * takes the lock. */
	atomic_bool rnr_waiting;
	struct sv_qp *next;		/* context's list, under ctx->lock */
	bool has_ex;			/* created with SEND_OPS_FLAGS */
	struct sv_pd *pd;		/* NULL for XRC_RECV */
	struct sv_cq *scq, *rcq;	/* NULL where the type has no such queue */
	struct sv_srq *srq;
	struct sv_xrcd *xrcd;		/* XRC_RECV */
	atomic_uint opens;		/* XRC_RECV: handles from ibv_open_qp, here and elsewhere */
	/* A handle from ibv_open_qp on another process's XRC target QP: that
	 * QP's segment, whose owner runs every verb on it (owner.c); sh is
	 * its block there.  NULL for this process's QPs. */
	struct shm_hdr *owner;
	atomic_uint flows;		/* raw packet: its flow rules (verbs/flow.c) */
	struct sv_rwq_ind *ind;		/* raw packet with RSS: its indirection table */
	uint64_t rss_off, rss_bytes;
	struct ibv_qp_cap cap;
	int sq_sig_all;
	struct ibv_qp_attr attr;	/* everything modify_qp has set */
	pthread_mutex_t lock;
	uint32_t events_reported;
	struct sv_peer_cache peer;
	struct sv_map_cache map;
	bool defer_last;		/* the last SEND's data was deferred (req.c) */
	/* Rendezvous FINs the device owes this QP (engine/tm.c), oldest
	 * first, under sq_lock: each is sent after the SEND that asked for it
	 * completes, as its ACK precedes the read, and waits for a receive
	 * WQE as an RNR-retried message would.  fins_due mirrors fin_n for
	 * ibv_post_recv, which looks without the lock. */
	struct sv_fin {
		uint32_t from_qpn;
		uint8_t hdr[32];	/* struct ibv_tmh + struct ibv_rvh */
	} fin[SV_MAX_FIN_DUE];
	uint32_t fin_n;
	atomic_uint fins_due;
	/* Packets (engine/pkt*.c): set for a QP that may meet another host;
	 * pq_remote when its own peer is there (RC, UC, XRC). */
	struct pkt_qp *pq;
	bool pq_remote;
	int wr_err;			/* ibv_wr_* batch: first error */
	uint32_t wr_n;			/* ibv_wr_* batch: WQEs built */
};

struct sv_ah {
	struct ibv_ah ibah;
	struct ibv_ah_attr attr;
	struct sv_pd *pd;
};

/* sv_ctx_self: the context struct behind an ibv_context.  sv_ctx: the
 * context whose state it uses: itself, or for one made by
 * ibv_import_device the context it imports (verbs/context.c). */
static inline struct sv_context *sv_ctx_self(struct ibv_context *c)
{
	return (struct sv_context *)((char *)c - offsetof(struct verbs_context, context));
}

static inline struct sv_context *sv_ctx(struct ibv_context *c)
{
	struct sv_context *s = sv_ctx_self(c);

	return s->origin ? s->origin : s;
}

/* The segment whose key table and PD table the context uses: its own,
 * or for an import from another process the home context's. */
static inline struct shm_hdr *sv_keys(struct sv_context *c)
{
	return c->home ? c->home : c->seg.h;
}

/* Objects of a context and of its imports may be used together. */
static inline bool sv_same_ctx(struct ibv_context *a, struct ibv_context *b)
{
	return sv_ctx(a) == sv_ctx(b);
}
#define sv_pd(p)  ((struct sv_pd *)(p))
#define sv_mr(p)  ((struct sv_mr *)(p))
#define sv_cq(p)  ((struct sv_cq *)(p))
#define sv_srq(p) ((struct sv_srq *)(p))

/* A receive work queue (ibv_create_wq) and an indirection table of them. */
struct sv_wq {
	struct ibv_wq ibwq;
	struct sv_context *ctx;
	struct sv_pd *pd;
	struct sv_cq *cq;
	struct shm_wq *sh;
	uint64_t sh_off;
	atomic_uint users;		/* indirection tables holding it */
};
#define sv_wq(p) ((struct sv_wq *)(p))

struct sv_rwq_ind {
	struct ibv_rwq_ind_table ib;
	uint32_t log_size;
	atomic_uint users;		/* QPs hashing into it */
	struct sv_wq *wqs[];
};
#define sv_qp(p)  ((struct sv_qp *)(p))
#define sv_ah(p)  ((struct sv_ah *)(p))
#define sv_mw(p)  ((struct sv_mw *)(p))
#define sv_xrcd(p) ((struct sv_xrcd *)(p))

/* core/registry.c: the file of endpoint ep of process pid. */
void sv_seg_name(char *buf, size_t len, int32_t pid, uint32_t ep);

/* core/seg.c: the context's segment (core/seg.h) */
int sv_seg_create(struct sv_seg *s, uint32_t ep, uint32_t dev_index);
/* A new segment's deferred-placement ring (transport/shm/defer.c uses it). */
void sv_seg_defer_init(struct shm_hdr *h);
struct shm_hdr *sv_seg_map_fd(int fd);
/* The context of segment t has closed, or (check_pid: a /proc read, so
 * not on every spin) its process has died. */
bool sv_seg_gone(const struct shm_hdr *t, bool check_pid);
void sv_seg_unmap(struct shm_hdr *h);
void sv_seg_destroy(struct sv_seg *s);
uint64_t sv_seg_alloc(struct sv_seg *s, uint64_t size);
void sv_seg_free(struct sv_seg *s, uint64_t off, uint64_t size);
struct shm_wq *sv_seg_new_wq(struct sv_seg *s, uint32_t size, uint32_t max_sge, uint64_t *off);
uint64_t sv_seg_wq_bytes(const struct shm_wq *wq);
/* Where a queue's slots start when they are still in its first block. */
uint64_t sv_seg_wq_slots(uint64_t wq_off);
/* This process's contexts' segments: h opens (add) or closes.  solo is
 * told, under the list's lock, which segments are now alone in the
 * process (true) or no longer (false). */
void sv_seg_register_local(struct shm_hdr *h, bool add,
			   void (*solo)(struct shm_hdr *h, bool solo));
/* Another open context's segment of this process, or NULL. */
struct shm_hdr *sv_seg_local_other(const struct shm_hdr *not);
struct shm_hdr *sv_seg_peer(uint32_t ep, int32_t pid, uint64_t start_time);
struct shm_qp *sv_seg_qp(const struct shm_hdr *h, uint32_t qpn);
void sv_seg_publish_qp(struct shm_hdr *h, uint32_t qpn, uint64_t off);
void sv_seg_ring(struct shm_hdr *h);
void sv_shm_mutex_init(pthread_mutex_t *m);	/* robust, process-shared */
/* A lock-free receive queue (struct shm_wq): the owner posts one WR,
 * holding the queue's lock (ENOMEM when full); any initiator takes the
 * oldest WQE (false when none). */
int sv_rq_post(struct shm_hdr *h, struct shm_wq *wq, const struct ibv_recv_wr *wr);
bool sv_rq_take(struct shm_hdr *h, struct shm_wq *wq, struct shm_rwqe *out);
void sv_shm_lock(pthread_mutex_t *m);
void sv_shm_unlock(pthread_mutex_t *m);
/* A lock only the owning process's threads take (seg.c says why). */
void sv_own_lock(_Atomic uint32_t *l);
void sv_own_unlock(_Atomic uint32_t *l);

/* core/iov.c: scatter lists in this process */
/* memcpy between two scatter lists of equal length, cuMemcpy where one
 * side is device memory: 0, or EFAULT when the driver refused. */
int sv_copy_iov(const struct iovec *d, int nd, const struct iovec *s, int ns);
/* Cuts [off, off + len) out of an iovec list into out; returns its count. */
int sv_iov_slice(const struct iovec *v, int n, size_t off, size_t len, struct iovec *out);

static inline void sv_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

/* Asks for the line at p in order to write it.  On x86 this needs
 * PREFETCHW (CPUID 0x80000001 ECX bit 8, checked once at load:
 * sv_prefetchw_ok); without it a read prefetch would fetch the line
 * shared, and the write after it would move it again. */
extern bool sv_prefetchw_ok;
static inline void sv_prefetchw(const void *p)
{
#if defined(__x86_64__) || defined(__i386__)
	if (sv_prefetchw_ok)
		__asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
	__builtin_prefetch(p, 1);
#endif
}

/* engine/comp.c: completions */
/* Adds a completion to a CQ in segment h; raises the channel event when
 * armed.  Returns false on overrun. */
bool sv_cq_push(struct shm_hdr *h, struct shm_cq *cq, const struct shm_cqe *e);
/* Sequence numbers of a fresh ring whose first `used` slots hold entries. */
void sv_cq_ring_init(struct shm_cqe *ring, uint32_t size, uint32_t used);
/* Removes every completion of QP qpn from a CQ (a QP entering RESET). */
void sv_cq_clean(struct shm_hdr *h, struct shm_cq *cq, uint32_t qpn);
/* Completes every WQE of a receive queue with IBV_WC_WR_FLUSH_ERR. */
void sv_flush_rq(struct sv_qp *qp);
/* Takes every WQE out of a lock-free receive queue (a QP's RQ, a WQ),
 * completing each with IBV_WC_WR_FLUSH_ERR into cq, or silently when cq
 * is NULL (RESET). */
void sv_rq_drain(struct shm_hdr *h, struct shm_wq *wq, struct shm_cq *cq, uint32_t qpn);
/* An asynchronous event on the context's queue (its async_fd). */
int sv_async_event(struct ibv_context *ctx, void *obj, enum ibv_event_type type);

/* engine/resp.c: the key table entries initiators hold */
/* The shared table entry (shm.h) of an MR or MW key of this context. */
struct shm_mr *sv_key_entry(struct ibv_context *ctx, uint32_t key);
/* Clears an entry's key, then waits until no initiator holds it. */
bool sv_key_revoke_if(const struct shm_hdr *h, struct shm_mr *e, uint32_t key);
void sv_key_revoke(const struct shm_hdr *h, struct shm_mr *e, uint32_t key);

/* engine/mw_exec.c: BIND_MW and LOCAL_INV, executed in send-queue order
 * by the requester: 0, or -1 with the reason in why. */
int sv_mw_exec_bind(struct sv_qp *qp, struct ibv_mw *mw, uint32_t rkey,
		    const struct ibv_mw_bind_info *b, char *why, size_t len);
int sv_mw_exec_local_inv(struct sv_qp *qp, uint32_t rkey, char *why, size_t len);

/* engine/qp_enter.c: the effects of entering a QP state */
void sv_qp_enter_state(struct sv_qp *qp, enum ibv_qp_state cur, enum ibv_qp_state next,
		       const struct ibv_qp_attr *a, int mask);
/* Moves a QP to ERR from the engine, with its flushes and events. */
void sv_qp_to_err(struct sv_qp *qp, int ev);	/* ev: an ibv_event_type, or -1 */
/* Applies an ERR a peer's request left pending (resp.c sv_resp_fail). */
void sv_qp_sync(struct sv_qp *qp);
void sv_qp_mark_err(struct sv_qp *qp, uint32_t pending);

/* engine/req.c: the requester */
void sv_sq_progress(struct sv_qp *qp);
/* Runs the send queue, whose sq_lock the caller holds, then releases the
 * lock and applies what the run requires (the QP to ERR). */
void sv_sq_run_unlock(struct sv_qp *qp);
/* The same for an application's post (ibv_post_send, ibv_wr_complete). */
void sv_sq_post_unlock(struct sv_qp *qp);
void sv_sq_flush(struct sv_qp *qp);
uint64_t sv_rnr_delay_ns(unsigned min_rnr_timer);

/* engine/wr.c: the ibv_wr_* send API */
uint64_t sv_wr_ops_supported(enum ibv_qp_type type);
void sv_wr_install(struct sv_qp *qp);

/* engine/progress.c: the per-context progress thread */
int sv_progress_start(struct sv_context *c);
void sv_progress_stop(struct sv_context *c);


/* core/port.c: the host's devices, GID table and port MTU */
struct sv_device *sv_device_get(struct ibv_device *d);
int sv_device_count(void);
struct sv_device *sv_device_at(int i);
/* GID table: returns false for an empty or out-of-range entry. */
bool sv_gid_entry(const struct sv_device *dev, unsigned index,
		  union ibv_gid *gid, enum ibv_gid_type *type);
int sv_gid_find(const struct sv_device *dev, const union ibv_gid *gid);
/* The interface a RoCE GID is an address of (0: none). */
uint32_t sv_gid_ifindex(const struct sv_device *dev, unsigned index);
bool sv_port_needs_grh(const struct sv_device *dev);
/* The port's active MTU: SOFTVERBS_MTU, or less when the interfaces the
 * port's packets leave by carry less (RoCE: every interface of the host;
 * IB with SOFTVERBS_LID=addr: the subnet's). */
enum ibv_mtu sv_port_mtu(const struct sv_device *dev);
/* IB mode: the port's LID.  With SOFTVERBS_LID=addr the first device's
 * is the host part of the host's IPv4 address on its subnet, and every
 * LID of that subnet is a host's address (sv_lid_addr, sv_addr_lid). */
uint16_t sv_port_lid(const struct sv_device *dev);
/* Whether other hosts reach this port by LID (IB, SOFTVERBS_LID=addr,
 * and an IPv4 subnet to number the hosts of). */
bool sv_port_lid_routed(const struct sv_device *dev);
/* The IPv4 address of LID lid on the port's subnet, and the port's own
 * (network byte order); false when lid names no address there. */
bool sv_lid_addr(const struct sv_device *dev, uint16_t lid, uint32_t *dst, uint32_t *src);
/* The LID of an IPv4 address (network byte order) on the port's subnet;
 * 0 for any other. */
uint16_t sv_addr_lid(const struct sv_device *dev, uint32_t addr);
/* That subnet as text, "198.18.0.0/30" ("" when there is none). */
const char *sv_port_subnet(const struct sv_device *dev, char *buf, size_t len);

/* verbs/device.c */
void sv_port_attr(const struct sv_device *dev, struct ibv_port_attr *pa);
int sv_port_set_state(unsigned dev, bool up);
extern const char *const sv_device_attr_files[];
int sv_device_attr_file(const struct sv_device *d, const char *file, char *buf, size_t size);
void sv_device_attr(const struct sv_device *dev, struct ibv_device_attr *a);
int sv_query_device_ex(struct ibv_context *ctx,
		       const struct ibv_query_device_ex_input *input,
		       struct ibv_device_attr_ex *attr, size_t attr_size);
int sv_query_port_op(struct ibv_context *ctx, uint8_t port,
		     struct ibv_port_attr *attr, size_t attr_len);

/* verbs/context.c */
bool sv_context_live(struct ibv_context *ctx, const char *verb);
/* Destroy verbs: drop obj's unread events, then wait until every event
 * read so far has been acknowledged (rdma-core's destroy contract). */
void sv_events_settle(struct ibv_context *ctx, struct sv_evq *chq, const void *obj,
		      pthread_mutex_t *m, pthread_cond_t *c,
		      const uint32_t *acked, const uint32_t *reported);

/* verbs/pd.c */
bool sv_pd_of(struct ibv_pd *pd, struct ibv_context *ctx, const char *verb);
struct ibv_td *sv_alloc_td(struct ibv_context *ctx, struct ibv_td_init_attr *attr);
int sv_dealloc_td(struct ibv_td *td);
struct ibv_pd *sv_alloc_parent_domain(struct ibv_context *ctx,
				      struct ibv_parent_domain_init_attr *attr);
/* Queue memory from a parent domain's allocator, or calloc. */
/* Count an object in or out of a PD, here and in its shared slot. */
void sv_pd_users_add(struct sv_pd *pd, int d);
void sv_pd_release(void *pd);
/* The owner mailbox's verbs (transport/shm/owner.c runs them). */
void sv_qp_serve(struct sv_context *c, struct shm_owner_req *r);	/* a context's close: its handle, and what it allocated */
/* Verbs that write the key table need it to be this process's. */
bool sv_keys_own(struct ibv_context *ctx, const char *verb);
void *sv_pd_alloc(struct sv_pd *pd, size_t size, size_t align, bool *from_app);
void sv_pd_free(struct sv_pd *pd, void *p, bool from_app);

/* verbs/mr.c */
int sv_mr_check_access(int access, const char **why);
/* Registers [addr, +length) after the verb's own checks passed. */
struct ibv_mr *sv_mr_new(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
			 unsigned access, struct sv_dm *dm, const struct sv_gpu_mem *gpu,
			 const char *verb);
int sv_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
		 struct ibv_sge *sg, uint32_t num_sge);
void sv_mr_release_all(struct ibv_context *ctx);

/* verbs/mw.c */
struct ibv_mw *sv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int sv_dealloc_mw(struct ibv_mw *mw);
int sv_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *bind);
void sv_mw_release_all(struct ibv_context *ctx);

/* verbs/dm.c */
struct ibv_dm *sv_alloc_dm(struct ibv_context *ctx, struct ibv_alloc_dm_attr *attr);
int sv_free_dm(struct ibv_dm *dm);
struct ibv_mr *sv_reg_dm_mr(struct ibv_pd *pd, struct ibv_dm *dm, uint64_t dm_offset,
			    size_t length, unsigned int access);
void sv_dm_release_all(struct ibv_context *ctx);

/* verbs/xrcd.c */
struct ibv_xrcd *sv_open_xrcd(struct ibv_context *ctx, struct ibv_xrcd_init_attr *attr);
int sv_close_xrcd(struct ibv_xrcd *xrcd);
bool sv_xrcd_of(struct ibv_xrcd *xrcd, struct ibv_context *ctx, const char *verb);
void sv_xrcd_release_all(struct ibv_context *ctx);

/* verbs/cq.c */
struct ibv_cq_ex *sv_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr);
int sv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int sv_req_notify_cq(struct ibv_cq *cq, int solicited_only);
bool sv_cq_of(struct ibv_cq *cq, struct ibv_context *ctx, const char *verb, const char *role);
void sv_cq_release(struct sv_cq *cq);
void sv_channel_release(struct sv_channel *ch);

/* verbs/srq.c */
struct ibv_srq *sv_create_srq_ex(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *attr);
int sv_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
/* Posts a list of receive WRs into wq under its lock; on failure *bad and
 * an explanation naming the object ("qpn 0x11", "SRQ 0x...") for verb.  The
 * name is formatted only then: a receive is posted per message. */
int sv_wq_post_list(struct shm_hdr *h, struct shm_wq *wq, struct ibv_recv_wr *wr,
		    struct ibv_recv_wr **bad, const char *verb, const char *kind, uint64_t id);
int sv_wq_post(struct shm_hdr *h, struct shm_wq *wq, const struct ibv_recv_wr *wr, const char **why);
int sv_get_srq_num(struct ibv_srq *srq, uint32_t *srq_num);
/* verbs/tm.c: tag-matching SRQs. */
int sv_tm_list_new(struct sv_context *c, struct shm_wq *wq, uint32_t tags);
void sv_tm_list_free(struct sv_context *c, struct shm_wq *wq);
int sv_post_srq_ops(struct ibv_srq *srq, struct ibv_ops_wr *op, struct ibv_ops_wr **bad);
/* engine/tm.c: delivers the FINs rendezvous left due on qp (qp->fin)
 * while it has receive WQEs; the caller holds qp->sq_lock. */
void sv_tm_send_fins(struct sv_qp *qp);
/* verbs/flow.c and verbs/wq.c: raw packet steering and receive side scaling. */
bool sv_has_net_raw(void);
struct ibv_flow *sv_create_flow(struct ibv_qp *qp, struct ibv_flow_attr *a);
int sv_destroy_flow(struct ibv_flow *flow);
void sv_flow_free(void *obj);
struct ibv_wq *sv_create_wq(struct ibv_context *ctx, struct ibv_wq_init_attr *a);
int sv_modify_wq(struct ibv_wq *wq, struct ibv_wq_attr *a);
int sv_destroy_wq(struct ibv_wq *wq);
void sv_wq_free(void *obj);
struct ibv_rwq_ind_table *sv_create_rwq_ind_table(struct ibv_context *ctx,
						  struct ibv_rwq_ind_table_init_attr *a);
int sv_destroy_rwq_ind_table(struct ibv_rwq_ind_table *t);
void sv_rwq_ind_free(void *obj);
void sv_srq_release(struct sv_srq *srq);

/* verbs/qp.c */
struct ibv_qp *sv_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr);
struct ibv_qp *sv_open_qp(struct ibv_context *ctx, struct ibv_qp_open_attr *attr);
int sv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int sv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
void sv_qp_release(struct sv_qp *qp);

/* verbs/ah.c */
/* Validates an address vector against the port; 0 or EINVAL with *why. */
int sv_ah_attr_check(const struct sv_device *dev, const struct ibv_ah_attr *ah,
		     const char **why);
void sv_ah_release(struct sv_ah *ah);

/* core/log.c: "EINVAL" for EINVAL, in explanations. */
const char *sv_errno_name(int err);
/* core/log.c: CLOCK_MONOTONIC in ns, for timers and explanations. */
uint64_t sv_now_ns(void);
/* core/log.c: the calling thread, one that sleeps until the device has
 * work (a progress or receive thread), asks the scheduler for the
 * shortest slice, so that its wake-up preempts an application thread
 * spinning on the same core at once. */
void sv_thread_prompt(void);

#endif
