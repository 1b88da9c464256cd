/* SPDX-License-Identifier: MIT */
/*
 * The shm transport's own functions: how a process reaches the segments
 * and memory of other processes on this host.  Only the transport and
 * the verbs that set it up include this; the engine reaches it through
 * its ops table (sv_transport_shm, engine/engine.h).
 */
#ifndef SV_TRANSPORT_SHM_H
#define SV_TRANSPORT_SHM_H

#include "../../sv.h"

/* transport/shm/shm.c: the ops table */
struct sv_transport_ops;
extern const struct sv_transport_ops sv_transport_shm;

/* transport/shm/owner.c: verbs on another process's objects, run by their
 * owner (verbs/qp.c says which). */
int sv_owner_call(struct shm_hdr *t, struct shm_owner_req *r);
void sv_owner_serve(struct sv_context *c);
/*
 * A requester's wait for a mailbox of t's owner (bounce, owner) to answer
 * request seq: 0 once `done` reaches it (acquire, pairing with the
 * owner's release store), ESRCH once t's context closed or its process
 * died, checked once a second.  own, if given, has its bounce mailbox
 * served meanwhile: two processes bouncing to each other from their
 * progress threads then cannot wait on each other forever.
 */
int sv_shm_await(const struct shm_hdr *t, _Atomic uint32_t *done, uint32_t seq,
		 struct shm_hdr *own);

/* transport/shm/defer.c */
uint8_t sv_defer_put(struct shm_hdr *h, struct shm_hdr *own, const struct iovec *src, int ns,
		     const struct iovec *dst, int nd, uint64_t len);
void sv_defer_place(struct shm_hdr *h, struct shm_hdr *own, uint8_t defer);
/* The slot a sender that just used slot defer - 1 fills next, as the
 * receiver guesses it; the slot the next sv_defer_put() fills, as a
 * sender knows it. */
const void *sv_defer_next(const struct shm_hdr *h, uint8_t defer);
const void *sv_defer_next_put(const struct shm_hdr *h);
void sv_defer_flush(struct shm_hdr *h, struct shm_hdr *own);
void sv_defer_solo(struct shm_hdr *h, bool solo);
/* transport/shm/copy.c: moving bytes between processes */
/* One process_vm_writev (write) or process_vm_readv call, repeated for
 * what a short transfer left: 0 or an errno. */
int sv_cma(bool write, int32_t pid, const struct iovec *l, int nl, const struct iovec *r, int nr);
/* Copies local -> remote (write) or remote -> local (read), the remote
 * side being memory of the process that owns segment `target`; `own` is
 * the initiator's segment, whose bounce mailbox it serves while it waits.
 * 0 or an errno. */
int sv_copy_to(struct shm_hdr *target, struct shm_hdr *own, const struct iovec *l, int nl,
	       const struct iovec *r, int nr);
int sv_copy_from(struct shm_hdr *target, struct shm_hdr *own, const struct iovec *l, int nl,
		 const struct iovec *r, int nr);
/* The remote iovecs were translated into this process's mapping of the
 * target's shareable memory (transport/shm/direct.c): a plain memcpy. */
int sv_copy_mapped(struct shm_hdr *own, bool write, const struct iovec *l, int nl,
		   const struct iovec *r, int nr);

/* Counted by verbs/mr.c: ODP MRs in this process; copies within the
 * process may then meet unmapped pages and go through the kernel instead
 * of memcpy. */
extern atomic_int sv_odp_mrs;

/* transport/shm/direct.c: shareable memory, mapped by peers */
/* One line of /proc/self/maps. */
struct sv_vma {
	uintptr_t start, end;
	uint64_t offset, ino;
	unsigned maj, min;
	char perms[5];
	char path[256];
};
/* Calls fn on each mapping of [addr, +len) in address order until it
 * answers false: 1 when the mappings cover the range without a gap and fn
 * accepted each, 0 when not, -1 when /proc/self/maps cannot be read. */
int sv_vma_walk(const void *addr, size_t len, bool (*fn)(const struct sv_vma *v, void *arg),
		void *arg);
/* Owner: describes how peers can map [addr, +len) (SysV shm, or a named
 * MAP_SHARED file); 0 when they cannot. */
uint64_t sv_direct_describe(struct sv_seg *s, const void *addr, size_t len);
/* Peer: this process's address for target address va of MR m, or NULL. */
void *sv_direct_map(const struct shm_hdr *seg, const struct shm_mr *m, uint64_t va, uint64_t len);
/* The owner's side of the bounce path: serves a pending request. */
void sv_bounce_serve(struct shm_hdr *own);
/* True when this thread is the one to serve request req of mailbox b. */
bool sv_bounce_claim(struct shm_bounce *b, uint32_t req);

/* transport/shm/gpu_ipc.c: GPU MRs between processes, by CUDA IPC */
/* Owner: the share entry of a GPU MR (its IPC handle); 0 with why. */
uint64_t sv_gpu_describe(struct sv_seg *s, const struct sv_gpu_mem *g, const void *addr,
			 char *why, size_t wlen);
/* Owner, deregistering: every importer has closed it (or 2 s passed). */
void sv_gpu_release(struct shm_hdr *h, uint64_t share_off);
/* Peer: this process's address of va in held GPU MR m of segment seg,
 * opened once and kept; `via` is the initiator's context segment. */
void *sv_gpu_map(const struct shm_hdr *seg, const struct shm_mr *m, uint64_t va,
		 const struct shm_hdr *via, char *why, size_t wlen);
/* Peer: closes what is no longer registered, or what context `via` opened. */
void sv_gpu_sweep(void);
void sv_gpu_forget(const struct shm_hdr *via);

/* transport/shm/assist.c: large CMA copies split with the target */
/* Copies as sv_copy_to/from do by CMA, with the target's progress thread
 * moving part of it; false when the mailbox is busy or the split failed,
 * and the caller then copies it all itself (the copy is idempotent). */
bool sv_assist_copy(struct shm_hdr *t, bool write, const struct iovec *l, int nl,
		    const struct iovec *r, int nr, size_t len);
/* An 8-byte FETCH_ADD or CMP_SWP at addr (the target's address) answered by
 * the target's progress thread while it lingers after recent work; the
 * caller holds t's atomic_lock.  false: do it by CMA (the helper was not
 * polling, or did not take it in time). */
bool sv_assist_atomic(struct shm_hdr *t, enum ibv_wr_opcode op, void *addr, uint64_t compare_add,
		      uint64_t swap, uint64_t *old);
/* The target's side: takes chunks of the open job and atomics, then polls
 * for more a little while.  Called by the progress thread; true when it is
 * still polling and returned only to let the thread's other work run: the
 * thread then comes back without sleeping. */
bool sv_assist_serve(struct shm_hdr *own);
/* The progress thread ends: it polls no more. */
void sv_assist_stop(struct shm_hdr *own);

#endif
