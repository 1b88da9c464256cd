/* SPDX-License-Identifier: MIT */
/*
 * The per-context shared segment: the context's queues, CQs, key table
 * and QP directory, and the cross-process contract of the shm transport.
 * Verbs create objects in it; peers on this host reach it through the
 * shm transport, and the packet responder delivers into it for peers on
 * other hosts.  Every field is a fixed-size type at a fixed offset; peers
 * locate objects by offsets from the segment base, never by pointers.
 *
 *   header | MR table | MR holders | PD table | QPN directory | owner
 *   mailbox | deferred placements | assist | bounce | heap
 *
 * The owner creates and lays out the segment (shm_layout()), then stores
 * `ready` last with release; a peer maps it, loads `ready` with acquire and
 * checks magic and version before using anything else.
 *
 * Who writes what:
 *   - MR entries, QP blocks, the directory: the owner only.  An entry's
 *     `key` (MR) or directory slot (QP) is stored last, with release; a
 *     reader loads it with acquire and then reads the rest.  One
 *     exception: SEND_WITH_INV clears a type 2 window's key (struct
 *     shm_mr).
 *   - MR holders: initiators, seq_cst increments and decrements around
 *     each access; the owner waits for zero when it revokes a key.
 *   - A QP's receive queue and a WQ: the owner posts, any initiator takes,
 *     without a shared lock (struct shm_wq).  SRQs: the owner and any
 *     initiator, under the queue's robust process-shared mutex (a dead
 *     holder is recovered).
 *   - CQs: any initiator produces without a lock (struct shm_cq); the
 *     owner consumes.
 *   - `doorbell`: anyone; increment then FUTEX_WAKE.  The owner's progress
 *     thread reads it with acquire before scanning and FUTEX_WAITs on the
 *     value it read, so a ring between scan and sleep is never lost.
 */
#ifndef SV_SEG_H
#define SV_SEG_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "stats.h"

#define SHM_MAGIC	0x4d485653u	/* "SVHM" */
#define SHM_VERSION	11u
#define SHM_SEG_SIZE	(256ull << 20)	/* sparse: only touched pages cost memory */
#define SHM_ALIGN	64u

/* What a key table entry describes: a memory region, or a memory window
 * of type 1 or 2 (IBA 10.6.7), which share one key space as in rxe. */
enum shm_mr_kind { SHM_KIND_MR, SHM_KIND_MW1, SHM_KIND_MW2 };

/*
 * A window is an entry whose addr/iova/length/access are its bound range
 * and rights; it refers to its MR by key, and an initiator using it holds
 * both (resp.c), so deregistering the MR also ends access through every
 * window bound to it.  Besides the owner, one writer: an initiator
 * executing SEND_WITH_INV clears a type 2 window's key with a
 * compare-and-swap from the rkey to 0 (seq_cst, pairing with hold_mr's
 * loads).
 */
struct shm_mr {
	_Atomic uint32_t key;		/* lkey/rkey; 0 = none.  Stored last (release). */
	uint32_t access;
	uint32_t pd;			/* PD handle: rkey and QP must share it */
	uint32_t pad0;
	uint64_t addr, length, iova;
	/* For explanations only: the key last revoked here, and when
	 * (CLOCK_MONOTONIC ns, which is system-wide). */
	uint32_t revoked_key;
	uint8_t kind;			/* enum shm_mr_kind */
	uint8_t mem;			/* enum shm_mem: what addr points into */
	uint8_t pad[2];
	uint64_t revoked_ns;
	union {
		uint64_t share_off;	/* MR: struct shm_share, 0 = not shareable */
		struct {
			uint32_t mr_key;	/* the MR the window lies in */
			uint32_t qpn;		/* type 2: the QP it was bound through */
		} mw;
	};
};

/* Host memory, or CUDA device memory that only cuMemcpy touches. */
enum shm_mem { SHM_MEM_HOST, SHM_MEM_CUDA };

/* How a peer maps an MR's memory for direct load/store (direct.c), or
 * opens its GPU memory by CUDA IPC. */
enum shm_share_kind { SHM_SHARE_SYSV = 1, SHM_SHARE_FILE = 2, SHM_SHARE_CUDA = 3 };

/*
 * The processes that hold a GPU MR's allocation open by CUDA IPC.  An
 * importer claims a free slot (compare-and-swap of pid 0 -> its pid,
 * seq_cst) before it opens, and stores 0 (release) after it has closed.
 * Deregistration asks each one to close (its segment's gpu_sweep, then a
 * ring) and waits for the slots to empty: CUDA leaves it undefined what
 * happens when memory is freed while another process has it open.
 */
#define SHM_GPU_IMPORTERS 16
struct shm_gpu_importer {
	_Atomic int32_t pid;
	uint32_t ep;
	uint64_t start_time;		/* with pid and ep: the segment to ring */
};

struct shm_share {
	uint32_t kind;
	int32_t shmid;			/* SYSV */
	uint64_t dev, ino;		/* the backing object, checked by the peer */
	uint64_t offset;		/* object offset of the MR's first byte */
	union {
		char path[256];		/* FILE */
		struct {		/* CUDA */
			uint8_t handle[64];	/* CUipcMemHandle of the allocation */
			uint8_t uuid[16];	/* its GPU */
			uint64_t size;		/* the allocation's size; `offset` is
						 * the MR's first byte within it */
		} cuda;
	};
	struct shm_gpu_importer importers[SHM_GPU_IMPORTERS];	/* CUDA */
};
_Static_assert(sizeof(struct shm_mr) == 64, "one cache line per MR");

/*
 * The initiators between their check of an entry and the end of their
 * copy, one cache line per MR index, apart from the entry: initiators
 * write it on every access, while the owner reads its own entry on every
 * post (its lkeys), and sharing one line would move it between their
 * cores on each operation.
 */
struct shm_mr_users {
	_Atomic uint32_t n;
	uint8_t pad[60];
};

/* The header of a device-memory block; the data follows at the next
 * SHM_ALIGN-or-requested boundary, and a DM's handle is that offset.
 * `len` is written before `magic` (release); an importer loads `magic`
 * with acquire.  Freeing clears `magic` first. */
#define SHM_DM_MAGIC	0x4d445653u	/* "SVDM" */

struct shm_dm {
	_Atomic uint32_t magic;
	uint32_t pad;
	uint64_t len;
};

/*
 * A receive queue: a QP's RQ, a WQ, or an SRQ.
 *
 * An SRQ works under its robust mutex (head, count; the limit, resizing
 * and tag matching need it).  A QP's RQ and a WQ are lock-free for their
 * consumers (`lockfree`), the initiators: slots carry sequence numbers as
 * a CQ's do (struct shm_cq).  The owner posts at `tail` under `post_lock`,
 * which only its own threads take, when the slot's seq is the position,
 * and publishes with seq = position + 1 (release); a consumer takes the
 * position at `rx_head` whose slot shows position + 1 (acquire) with a
 * compare-and-swap on rx_head, copies the WQE and frees the slot with
 * seq = position + size (release).  So taking a WQE moves the WQE's line
 * and the consumers' own line, never a lock line the owner also takes.
 *
 * Three lines, by who writes them: the first is written at creation (and
 * by an SRQ's resize and a WQ's state change), so every consumer keeps a
 * shared copy; the second is the lock's and the owner's posting state;
 * the third the consumers'.  A field that consumers read on every message
 * kept beside the lock would cost each message a miss for the line the
 * owner's last post took, and the owner's next post another to take it
 * back (ib_send_lat: one of five such misses per message before).
 */
struct shm_wq {
	uint32_t size;			/* slots (max_wr) */
	uint32_t max_sge;
	uint32_t stride;		/* bytes per WQE */
	uint32_t lockfree;
	uint32_t tm_tags;		/* a tag-matching SRQ's list length; 0 = not one */
	/* A WQ's number and state (enum ibv_wq_state, written by the owner,
	 * read by initiators: relaxed, a frame races a state change as it
	 * would on the wire). */
	uint32_t wq_num;
	_Atomic uint32_t wq_state;
	uint32_t pad;
	uint64_t wqe_off;		/* segment offset of slot 0 */
	/* The CQ every completion of this queue goes to when it is not the
	 * receiving QP's: a tag-matching SRQ's, a WQ's (ibv_create_wq). */
	uint64_t cq_off;
	uint64_t tm_off;		/* tag matching: the list (tm_tags entries) */
	uint32_t tm_stride;
	/* The locks' line: an SRQ's whole state, a lock-free queue's posts. */
	_Alignas(64) pthread_mutex_t lock;	/* an SRQ's: robust, process-shared */
	_Atomic uint32_t post_lock;	/* a lock-free queue's posters' (sv_own_lock) */
	uint32_t head, count;		/* under lock (SRQ) */
	uint32_t limit;			/* SRQ limit; 0 = not armed */
	_Atomic uint32_t limit_hit;	/* an initiator crossed the limit */
	uint64_t tail;			/* lock-free: the owner's next post, under lock */
	/* Tag matching (IBV_SRQT_TM), under lock: the tags posted so far, the
	 * unexpected messages delivered so far (the "hardware" count of phase
	 * synchronisation), the count software last reported, the live tags. */
	uint64_t tm_seq;		/* posting order of the next tag */
	uint32_t tm_unexp, tm_synced;
	uint32_t tm_used;
	/* Lock-free: the consumers' line. */
	_Alignas(64) _Atomic uint64_t rx_head;
};

/* A raw packet QP's receive side scaling (IBV_QP_INIT_ATTR_RX_HASH): the
 * Toeplitz key, the fields hashed (enum ibv_rx_hash_fields) and the
 * indirection table, as segment offsets of its WQs' struct shm_wq. */
struct shm_rss {
	uint64_t fields;
	uint32_t log_size, key_len;
	uint8_t key[128];
	uint64_t wq_off[];
};

/* One entry of a tag-matching list, followed by its buffer as a receive
 * WQE (wr_id = the recv_wr_id TM_RECV completions carry).  A handle is
 * gen << 16 | index, so a handle of a consumed entry fails to delete a
 * later tag in the same slot. */
enum shm_tm_state { SHM_TM_FREE, SHM_TM_ACTIVE, SHM_TM_PENDING /* until a sync */ };

struct shm_tm_tag {
	uint64_t tag, mask;
	uint64_t seq;			/* the earliest posted match wins */
	uint32_t state;			/* enum shm_tm_state */
	uint32_t gen;
};

struct shm_rwqe {
	uint64_t wr_id;
	uint32_t num_sge;
	_Atomic uint32_t seq;		/* a lock-free queue's slot sequence (struct shm_wq) */
	struct ibv_sge sge[];
};

/* One completion, as produced by either side.  A tag-matching receive
 * carries the TMH's tag and, in imm, its app_ctx (ibv_wc_tm_info).  `seq`
 * is the slot's sequence number (struct shm_cq) and is stored last. */
struct shm_cqe {
	uint64_t wr_id;
	uint64_t ts;
	uint64_t tag;
	uint32_t vendor_err, byte_len;
	uint32_t imm, qp_num, src_qp, wc_flags;
	uint16_t pkey_index, slid;
	uint8_t status, opcode;		/* enum ibv_wc_status, enum ibv_wc_opcode: below 256 */
	uint8_t sl, dlid_path_bits, solicited;
	uint8_t defer;			/* slot + 1 of data the poller places first (defer.c) */
	_Atomic uint32_t seq;
};
#define SHM_CQE_DEAD	0xff	/* opcode of an entry a QP's reset took back */
_Static_assert(sizeof(struct shm_cqe) == 64, "one cache line per CQE");
_Static_assert(IBV_WC_DRIVER3 < 256 && IBV_WC_TM_RNDV_INCOMPLETE < 256, "opcode and status fit a byte");

/*
 * A CQ is a bounded multi-producer ring with a sequence number per slot
 * (D. Vyukov's): slot i starts with seq = i; a producer claims position p
 * when its slot's seq is p (compare-and-swap on `tail`), writes the entry
 * and stores seq = p + 1 (release); the owner consumes position p when it
 * loads seq == p + 1 (acquire), and frees the slot with seq = p + size
 * (release, paired with the producer's acquire load before it claims).  A
 * producer that finds seq behind p finds the CQ full: an overrun.  So a
 * completion crossing processes moves its entry's line and nothing else:
 * no lock line goes back and forth between producer and poller.
 *
 * `lock` is the owner's only (sv_own_lock()): pollers, resize and the
 * clean-up of a reset QP's entries.  Resize also stops producers: it raises
 * `frozen` and waits for `producers` (counted around each push) to drain;
 * both sides use sequentially consistent order, so a producer either sees
 * the flag or is seen counted.
 *
 * Three lines, by who writes them (struct shm_wq says why): the ring's
 * shape and the arm, which change only on resize and when the owner asks
 * for an event; the owner's lock and head, written by every poll that
 * finds a completion; the producers' words.
 */
struct shm_cq {
	uint32_t size;			/* slots */
	uint32_t stamp;			/* producers timestamp completions (set at creation) */
	uint64_t ring_off;
	_Atomic uint32_t armed;		/* 0, 1 = next completion, 2 = next solicited */
	_Atomic uint32_t notify;	/* an event is due: the owner delivers it */
	_Atomic uint32_t overrun;	/* a completion found the CQ full */
	/* The owner's line. */
	_Alignas(64) _Atomic uint32_t lock;	/* the owner's threads' (sv_own_lock) */
	_Atomic uint64_t head;		/* next position to consume: under lock, read without */
	/* Producers' line. */
	_Alignas(64) _Atomic uint64_t tail;	/* next position to claim */
	_Atomic uint32_t producers;	/* pushes in progress */
	_Atomic uint32_t frozen;	/* a resize is moving the ring */
};

struct shm_qp {
	uint32_t qpn;
	uint8_t type;			/* enum ibv_qp_type */
	_Atomic uint8_t state;		/* enum ibv_qp_state, mirrored by the owner */
	uint8_t min_rnr_timer;		/* the responder's, sent back in RNR NAKs */
	uint8_t port;
	uint32_t pd;
	_Atomic uint32_t access;	/* qp_access_flags */
	_Atomic uint32_t qkey;
	uint32_t pkey_index;
	uint64_t rcq_off;		/* the receive CQ */
	uint64_t rq_off;		/* own receive queue, or 0 */
	uint64_t srq_off;		/* or the SRQ's */
	_Atomic uint32_t err_pending;	/* an initiator moved it to ERR (IBV_EVENT_*) */
	uint32_t pad;
	uint64_t xrcd;			/* XRC_RECV and XRC SRQ: the XRC domain's id */
	uint64_t rss_off;		/* raw packet QP with RSS: struct shm_rss, else 0 */
	struct sv_pkt_qp_stats pkt;	/* across hosts: its peer and packets */
};

/* An XRC SRQ is published in the QPN directory too, under its SRQ
 * number, as a shm_qp of this type: srq_off is its queue, rcq_off its
 * CQ, pd its PD (which XRC requests are checked against, IBA 9.7.4.1),
 * xrcd its domain. */
#define SHM_TYPE_XSRQ	0xfe

/*
 * The bounce mailbox: the copy path for when the kernel refuses CMA
 * (ptrace scope, seccomp).  One initiator at a time (lock) stages a chunk
 * and its destination list, bumps `req` (release) and rings the doorbell.
 * Every thread of the owner may serve it -- the progress thread, and any
 * thread waiting for a mailbox of another process (sv_seg_await) -- so a
 * server first claims the request by a compare-and-swap of `taken` from
 * the last one claimed to `req`: exactly one thread copies each request.
 * It copies between the chunk and its own memory, stores `status` and then
 * `done` = the request it claimed (release), and wakes `done`.
 */
#define SHM_BOUNCE_CHUNK	(1u << 20)
#define SHM_BOUNCE_IOV		(32 + 2)

struct shm_bounce {
	pthread_mutex_t lock;		/* robust, process-shared */
	_Atomic uint32_t req, done;	/* futex word: done */
	_Atomic uint32_t taken;		/* the last request a server claimed */
	uint32_t write;			/* 1: chunk -> owner memory; 0: owner memory -> chunk */
	uint32_t niov;
	int32_t status;			/* 0 or an errno */
	struct { uint64_t addr, len; } iov[SHM_BOUNCE_IOV];
	uint64_t data_off;		/* segment offset of the chunk */
};

/*
 * A protection domain's slot (the context's PD handles).  Any process
 * whose context shares this segment's keys allocates here: the owner, and
 * a context imported from it (ibv_import_device), so a handle names one
 * PD in every process.  `handle` is gen << 16 | index, 0 when free; a
 * claim is a compare-and-swap from 0, a release stores `last` and then
 * handle 0.  `users` counts what lies in the PD (MRs, QPs, SRQs, AHs,
 * windows, WQs, parent domains) in every process, so that deallocation
 * in any of them sees EBUSY as the kernel's shared object would.
 */
struct shm_pd {
	_Atomic uint32_t handle;
	uint32_t last;
	_Atomic uint32_t users;
	uint32_t pad;
};

/*
 * The owner mailbox: verbs another process runs on this context's objects,
 * executed by the owner's progress thread (owner.c), today on XRC target
 * QPs opened from another process (ibv_open_qp).  One requester at a time
 * (lock) writes `r`, bumps `req` (release) and rings the doorbell; the
 * owner answers in `r`, then stores `done = req` (release) and wakes it.
 */
enum shm_owner_op { SHM_OWNER_OPEN_QP = 1, SHM_OWNER_MODIFY_QP, SHM_OWNER_QUERY_QP,
		    SHM_OWNER_CLOSE_QP };

struct shm_owner_req {
	uint32_t op, qpn;
	uint64_t xrcd;			/* OPEN: the opener's domain */
	int32_t mask;			/* MODIFY, QUERY */
	int32_t status;			/* the answer: 0 or an errno */
	struct ibv_qp_attr attr;	/* MODIFY in, QUERY out (no pointers) */
	struct ibv_qp_cap cap;		/* QUERY out */
	char why[200];			/* a failure's explanation */
};

struct shm_owner {
	pthread_mutex_t lock;		/* robust, process-shared */
	_Atomic uint32_t req, done;	/* futex word: done */
	struct shm_owner_req r;
};

/*
 * Deferred placement (transport/shm/defer.c): a small SEND into private
 * memory left for the receiver to place when it polls.  Initiators take
 * slots in turn, as the producers of D. Vyukov's bounded queue: position
 * p may fill slot p % SHM_DEFER_SLOTS once the slot's `seq` is p (acquire),
 * and becomes one initiator's by a compare-and-swap on `tail`, a line only
 * initiators write, so that filling the slot needs no locked instruction
 * on its line.  The initiator stores seq = p + 1, fills the slot and
 * publishes it (PENDING, release; then `published`, seq_cst).  Whoever
 * places it -- the poller of the completion that names it, or a flusher
 * before an RDMA access to this memory -- claims it (PENDING -> PLACING),
 * records its pid in `placer`, copies, counts `placed` and marks it
 * PLACED; one who finds it PLACING waits, and copies it again itself only
 * once the placer's process is dead; only the poller frees it
 * (FREE, then seq = p + SHM_DEFER_SLOTS, release), after clearing the
 * completion's reference.  A slot not yet freed a lap later stops
 * deferral (its position waits for it) until its completion is polled.
 * The first iovec and the data share the slot's first line: an 8-byte
 * message is one line.  `tail` and `published` are written by initiators
 * only and `placed` by placers only, on lines of their own: a flusher
 * compares the two counts.
 */
#define SHM_DEFER_SLOTS	64
#define SHM_DEFER_IOV	4
#define SHM_DEFER_MAX	176

enum shm_defer_state { SHM_DEFER_FREE, SHM_DEFER_PENDING, SHM_DEFER_PLACING, SHM_DEFER_PLACED };

struct shm_defer_slot {
	_Atomic uint32_t state;
	_Atomic uint32_t seq;		/* the position that may fill it; + 1 once filled */
	uint16_t niov, len;
	_Atomic int32_t placer;		/* pid of the claimer (relaxed: a hint for takeover) */
	struct { uint64_t addr, len; } iov0;
	uint8_t data[SHM_DEFER_MAX];
	struct { uint64_t addr, len; } iov[SHM_DEFER_IOV - 1];	/* the rest */
};
_Static_assert(sizeof(struct shm_defer_slot) == 256, "four lines per slot");

struct shm_defer {
	_Atomic uint32_t solo;		/* the owner process has only this context */
	/* The initiators' line. */
	_Alignas(64) _Atomic uint64_t tail;	/* the next position */
	_Atomic uint32_t published;
	_Alignas(64) _Atomic uint32_t placed;
	_Alignas(64) struct shm_defer_slot slot[SHM_DEFER_SLOTS];
};

/*
 * The assist mailbox (transport/shm/assist.c): a large copy between an
 * initiator and this process's private memory, split with this context's
 * progress thread so that both processes' cores move bytes.  One job at a
 * time (lock, taken with trylock: a busy mailbox means copying alone).
 * The initiator marks `claim` closed under the new job number, writes the
 * job, then publishes it by storing `claim` = job << 32 (seq_cst: it also
 * pairs with the load of `lingering`); from then on both sides claim
 * chunks with a compare-and-swap on `claim`, which carries the job number,
 * so a chunk is claimed only while its job is open, and a helper reads the
 * fields once and checks the job number after (a seqlock read).  The
 * helper counts each finished chunk in `done` (compare-and-swap on the job
 * number, release); the initiator closes the job (index UINT32_MAX), waits
 * until `done` counts every chunk the helper claimed (acquire), and only
 * then lets go of the memory.
 *
 * The same helper answers atomics while it lingers after a job (polling
 * for the next): an initiator holding the segment's atomic_lock writes a
 * request and `astate` = POSTED (release) on one line; the helper takes
 * it (POSTED -> TAKEN, compare-and-swap), performs it with a CPU atomic on
 * its own memory, writes `aold` and `astate` = DONE (release); the
 * initiator loads DONE (acquire), reads `aold`, and stores IDLE.  An
 * initiator that sees no pickup in time takes the request back (POSTED ->
 * IDLE) and uses CMA.  `kick` asks a sleeping helper to linger.
 */
enum shm_assist_astate { SHM_ASSIST_IDLE, SHM_ASSIST_POSTED, SHM_ASSIST_TAKEN, SHM_ASSIST_DONE };

/* A job is cut in halves, each at least 64 KiB and at most 512 KiB
 * (measured: docs/architecture.md §10), so two equal parties split it
 * evenly and a long one still balances. */
#define SHM_ASSIST_MIN_CHUNK	(64u << 10)
#define SHM_ASSIST_MAX_CHUNK	(512u << 10)
#define SHM_ASSIST_MIN		(2 * SHM_ASSIST_MIN_CHUNK)
#define SHM_ASSIST_IOV		(32 + 2)
#define SHM_ASSIST_FAILED	(1ull << 31)	/* in `done`: a helper chunk failed */

struct shm_assist {
	pthread_mutex_t lock;		/* robust, process-shared */
	_Atomic uint32_t refused;	/* this process may not copy into peers: no jobs */
	_Alignas(64) _Atomic uint64_t claim;	/* job << 32 | next unclaimed chunk */
	_Alignas(64) _Atomic uint64_t done;	/* job << 32 | FAILED | chunks the helper finished */
	_Alignas(64) _Atomic uint32_t lingering;	/* the helper is polling for work */
	_Atomic uint32_t kick;		/* an initiator asks the helper to linger */
	uint64_t idle_since;		/* the helper's own: when it last had work */
	/* Atomics: the request, its state and its answer share a line. */
	_Alignas(64) _Atomic uint32_t astate;	/* enum shm_assist_astate */
	uint32_t aop;			/* IBV_WR_ATOMIC_FETCH_AND_ADD or _CMP_AND_SWP */
	uint64_t aaddr, acompare_add, aswap;
	uint64_t aold;			/* the value before, written before DONE */
	/* Initiators' bookkeeping, under the segment's atomic_lock. */
	_Alignas(64) uint64_t last_atomic_ns;	/* when the latest atomic came */
	uint64_t backoff_until_ns;	/* a request went untaken: CMA until then */
	_Alignas(64) int32_t pid;	/* the initiator */
	uint32_t write;			/* 1: initiator memory -> this process's memory */
	uint32_t nchunks, nl, nr;
	uint32_t force;			/* SOFTVERBS_ASSIST=force: the helper dawdles */
	uint64_t chunk;			/* bytes per chunk, the last one shorter */
	struct { uint64_t addr, len; } l[SHM_ASSIST_IOV];	/* the initiator's side */
	struct { uint64_t addr, len; } r[SHM_ASSIST_IOV];	/* this process's side */
};

struct shm_hdr {
	uint32_t magic, version;
	uint64_t size;
	int32_t pid;
	uint32_t ep;
	uint64_t start_time;		/* the owner's (registry.c), with pid and ep */
	uint32_t dev_index;
	uint32_t pad2;
	/* A context imported from another process's context (its "home"):
	 * the home's segment holds the keys and PDs of this one, and every
	 * MR this context's QPs use is the home's, in the home process's
	 * memory.  home_pid 0: this segment's own keys. */
	int32_t home_pid;
	uint32_t home_ep;
	uint64_t home_start;
	uint64_t off_pds;		/* struct shm_pd[n_pds] */
	uint32_t n_pds;
	uint32_t pad1;
	uint64_t off_mrs;
	uint64_t off_mr_users;		/* struct shm_mr_users[n_mrs] */
	uint32_t n_mrs;
	uint32_t n_qps;
	uint64_t off_qps;		/* uint64_t[n_qps]: QP block offset by QPN index */
	uint64_t heap_off;
	_Atomic uint32_t doorbell;	/* futex word: wakes the owner's progress thread */
	/* Set (release) by a process deregistering GPU memory this process
	 * may hold open; the progress thread exchanges it to 0 and closes
	 * what is no longer registered (direct.c sv_gpu_sweep). */
	_Atomic uint32_t gpu_sweep;
	pthread_mutex_t atomic_lock;	/* serialises atomics aimed at this context */
	uint64_t bounce_off;		/* struct shm_bounce */
	uint64_t owner_off;		/* struct shm_owner */
	uint64_t defer_off;		/* struct shm_defer */
	uint64_t assist_off;		/* struct shm_assist */
	struct sv_pkt_ep_stats pkt;	/* the context's packet endpoint */
	_Atomic uint32_t ready;		/* stored last (release) */
};

static inline void *shm_at(const struct shm_hdr *h, uint64_t off)
{
	return (char *)h + off;
}

static inline struct shm_mr *shm_mrs(const struct shm_hdr *h)
{
	return shm_at(h, h->off_mrs);
}

static inline _Atomic uint32_t *shm_mr_users(const struct shm_hdr *h, const struct shm_mr *m)
{
	struct shm_mr_users *u = shm_at(h, h->off_mr_users);

	return &u[m - shm_mrs(h)].n;
}

static inline struct shm_pd *shm_pds(const struct shm_hdr *h)
{
	return shm_at(h, h->off_pds);
}

static inline _Atomic uint64_t *shm_qp_dir(const struct shm_hdr *h)
{
	return shm_at(h, h->off_qps);
}

static inline struct shm_cqe *shm_cq_ring(const struct shm_hdr *h, const struct shm_cq *cq)
{
	return shm_at(h, cq->ring_off);
}

static inline struct shm_tm_tag *shm_tm_at(const struct shm_hdr *h, const struct shm_wq *wq,
					   uint32_t i)
{
	return shm_at(h, wq->tm_off + (uint64_t)i * wq->tm_stride);
}

/* The buffer of a tag entry. */
static inline struct shm_rwqe *shm_tm_wqe(struct shm_tm_tag *t)
{
	return (struct shm_rwqe *)(t + 1);
}

/* The slot of position i (a lock-free queue's positions never wrap). */
static inline struct shm_rwqe *shm_wq_slot(const struct shm_hdr *h, const struct shm_wq *wq,
					   uint64_t i)
{
	return shm_at(h, wq->wqe_off + (i % wq->size) * wq->stride);
}

#endif
