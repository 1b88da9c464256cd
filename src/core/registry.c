/* SPDX-License-Identifier: MIT */
/*
 * The host registry: one shared region per user in /dev/shm that every
 * softverbs process maps.  It holds the host-wide QPN allocation, the
 * ports' LIDs, the endpoint table (which process owns which QPNs) and
 * the UD multicast attachments (which QPN listens to which group).
 *
 * Layout: a header with magic, version and the offsets of the two tables,
 * computed in one place (layout()), then the endpoint table and the QPN
 * table.  Initialisation happens under flock(), which the kernel releases
 * if the initialiser dies; `ready` is stored last with release semantics
 * and read with acquire by every later opener.
 *
 * Mutation happens under a robust, process-shared mutex.  If its holder
 * dies, the next locker gets EOWNERDEAD and runs a sweep, which rebuilds
 * every invariant from facts that cannot be half-written: an endpoint is
 * owned by (pid, start time) and a QPN by an endpoint index.  Each update
 * writes the owner's identity before the field that makes the entry count
 * (state or owner), so a writer killed between two stores leaves either a
 * free entry or one owned by a dead process, which the sweep frees.
 *
 * A process is identified by pid plus its start time from /proc/PID/stat,
 * so a recycled pid is not mistaken for the process that died.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../sv.h"

#define REG_MAGIC	0x47525653u	/* "SVRG" */

/*
 * Two cache lines per endpoint.  Initiators read the first (who owns a
 * QPN) on every operation; the owner writes the second (its byte
 * counters) on every operation.  Sharing a line, or sharing one with a
 * neighbour's counters, would move it between cores on each operation:
 * ib_write_lat on shareable memory went from 0.41 to 0.30 us (far
 * regime) when they were split.
 */
struct __attribute__((aligned(64))) reg_ep {
	_Atomic uint32_t state;		/* enum sv_reg_ep_state */
	/* The owner's identity: written under the lock before state (relaxed,
	 * ordered by state's release store), read without it by
	 * sv_reg_qpn_owner() while the entry may be freed and taken again;
	 * atomic so that such a read is a stale answer, never a torn one
	 * the compiler may assume unchanged. */
	_Atomic int32_t pid;
	_Atomic uint64_t start_time;
	_Atomic uint32_t dev_index;
	uint32_t nqps;
	/* Bytes this endpoint moved, by copy path (relaxed: statistics). */
	_Alignas(64) _Atomic uint64_t bytes[SV_COPY_PATHS];
	/* Packets other processes forwarded to this endpoint's forwarding
	 * socket (transport/udp/udp.c): its CQ pollers read that socket only
	 * when this moved.  Added to by the forwarder after its send
	 * (release), read by the owner before its read (acquire). */
	_Atomic uint32_t forwarded;
};
_Static_assert(sizeof(struct reg_ep) == 128, "two cache lines per endpoint");

struct reg_qpn {
	_Atomic uint32_t owner;		/* endpoint index + 1; 0 = free */
	uint8_t qp_type;
	_Atomic uint8_t state;		/* informational, for `softverbs status` */
	uint16_t pad;
};

/* One QP attached to one multicast group.  Entries belong to their QPN:
 * freeing the QPN (or the sweep freeing it) drops them. */
struct reg_mcast {
	uint32_t qpn;			/* 0 = free */
	uint16_t lid;
	uint16_t pad;
	uint8_t gid[16];
};

/* One flow steering rule of a raw packet QP (ibv_create_flow), owned by
 * its QPN like an attachment. */
struct reg_flow {
	uint32_t qpn;			/* 0 = free */
	uint32_t pad;
	struct sv_flow_rule r;
};

struct reg_hdr {
	uint32_t magic, version;
	uint64_t size;
	uint32_t off_eps, n_eps;
	uint32_t off_qpns, n_qpns;
	uint32_t off_mcast, n_mcast;
	uint32_t off_flows, n_flows;
	pthread_mutex_t lock;		/* robust, process-shared */
	uint32_t qpn_cursor;		/* next QPN index to try */
	uint16_t lid[SV_MAX_DEVICES];
	_Atomic uint32_t ready;		/* stored last (release) */
	/* Each device's port: changes << 1 | down (sv_reg_port_set).  Read on
	 * every operation, written only when someone toggles a port: a line
	 * of its own. */
	_Alignas(64) _Atomic uint32_t port[SV_MAX_DEVICES];
};

static struct reg_hdr *reg;
/* `reg` for lock-free readers on the data path, stored once it is usable. */
static struct reg_hdr *_Atomic reg_pub;
static char reg_path[192];
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

/* Places n entries of size bytes at the next cache-line boundary. */
static size_t place(size_t off, uint32_t *at, uint32_t *count, uint32_t n, size_t size)
{
	off = (off + 63) & ~(size_t)63;
	*at = (uint32_t)off;
	*count = n;
	return off + n * size;
}

static size_t layout(struct reg_hdr *h)
{
	size_t off = sizeof(*h);

	off = place(off, &h->off_eps, &h->n_eps, SV_HOST_MAX_ENDPOINTS, sizeof(struct reg_ep));
	off = place(off, &h->off_qpns, &h->n_qpns, SV_HOST_MAX_QP, sizeof(struct reg_qpn));
	off = place(off, &h->off_mcast, &h->n_mcast, SV_HOST_MAX_MCAST_ATTACH,
		    sizeof(struct reg_mcast));
	off = place(off, &h->off_flows, &h->n_flows, SV_HOST_MAX_FLOWS, sizeof(struct reg_flow));
	return (off + 4095) & ~(size_t)4095;
}

static struct reg_ep *eps(void)
{
	return (struct reg_ep *)((char *)reg + reg->off_eps);
}

static struct reg_qpn *qpns(void)
{
	return (struct reg_qpn *)((char *)reg + reg->off_qpns);
}

static struct reg_mcast *mcasts(void)
{
	return (struct reg_mcast *)((char *)reg + reg->off_mcast);
}

static struct reg_flow *flows(void)
{
	return (struct reg_flow *)((char *)reg + reg->off_flows);
}

static bool qpn_free_locked(uint32_t qpn)
{
	uint32_t q = qpn - sv_qpn_base;

	return q >= reg->n_qpns || !atomic_load_explicit(&qpns()[q].owner, memory_order_relaxed);
}

/* Drops the attachments and flow rules of QPNs that are free.  Caller
 * holds reg->lock. */
static void mcast_sweep_locked(void)
{
	for (uint32_t i = 0; i < reg->n_mcast; i++)
		if (mcasts()[i].qpn && qpn_free_locked(mcasts()[i].qpn))
			mcasts()[i].qpn = 0;
	for (uint32_t i = 0; i < reg->n_flows; i++)
		if (flows()[i].qpn && qpn_free_locked(flows()[i].qpn))
			flows()[i].qpn = 0;
}

uint64_t sv_proc_start_time(int32_t pid)
{
	char path[64], buf[1024];
	unsigned long long st = 0;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	/* The command name may contain spaces and ')': fields restart after
	 * the last ')'.  Field 22 (starttime) is the 20th after it. */
	char *p = strrchr(buf, ')');
	if (!p)
		return 0;
	p++;
	for (int field = 3; field < 22 && p; field++)
		p = strchr(p + 1, ' ');
	if (!p || sscanf(p, " %llu", &st) != 1)
		return 0;
	return st ? st : 1;
}

bool sv_proc_alive(int32_t pid, uint64_t start_time)
{
	uint64_t st = sv_proc_start_time(pid);

	/* /proc/PID/stat of a zombie still exists; a zombie holds nothing. */
	if (!st)
		return false;
	char path[64], state = 0, buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "re");
	if (f) {
		if (fgets(buf, sizeof(buf), f)) {
			char *p = strrchr(buf, ')');
			if (p && p[1] == ' ')
				state = p[2];
		}
		fclose(f);
	}
	return (!start_time || st == start_time) && state != 'Z' && state != 'X';
}

/* Frees every entry whose owner is gone.  Caller holds reg->lock. */
static int sweep_locked(void)
{
	struct reg_ep *ep = eps();
	struct reg_qpn *q = qpns();
	int freed = 0;

	for (uint32_t i = 0; i < reg->n_eps; i++) {
		if (atomic_load_explicit(&ep[i].state, memory_order_relaxed) != SV_EP_LIVE)
			continue;
		if (sv_proc_alive(ep[i].pid, ep[i].start_time))
			continue;
		/* Its shared segment dies with it. */
		char seg[128];
		sv_seg_name(seg, sizeof(seg), ep[i].pid, i);
		unlink(seg);
		atomic_store_explicit(&ep[i].state, SV_EP_FREE, memory_order_relaxed);
		freed++;
	}
	/* QPNs whose endpoint is free, including ones an allocator wrote just
	 * before dying, go back to the pool; nqps is recounted from scratch. */
	for (uint32_t i = 0; i < reg->n_eps; i++)
		ep[i].nqps = 0;
	for (uint32_t i = 0; i < reg->n_qpns; i++) {
		uint32_t o = atomic_load_explicit(&q[i].owner, memory_order_relaxed);

		if (!o)
			continue;
		if (o > reg->n_eps ||
		    atomic_load_explicit(&ep[o - 1].state, memory_order_relaxed) != SV_EP_LIVE) {
			atomic_store_explicit(&q[i].owner, 0, memory_order_relaxed);
			freed++;
		} else {
			ep[o - 1].nqps++;
		}
	}
	mcast_sweep_locked();
	return freed;
}

static void reg_lock(void)
{
	int r = pthread_mutex_lock(&reg->lock);

	if (r == EOWNERDEAD) {
		/* The previous holder died mid-update: rebuild, then mark the
		 * mutex consistent so it stays usable. */
		sv_warn("host registry %s: a process died holding its lock; reclaiming", reg_path);
		sweep_locked();
		pthread_mutex_consistent(&reg->lock);
	}
}

static void reg_unlock(void)
{
	pthread_mutex_unlock(&reg->lock);
}

static uint16_t derive_lid(unsigned dev)
{
	const struct sv_config *c = sv_config();

	if (c->lid)
		return (uint16_t)(c->lid + dev > SV_LID_MAX_UNICAST ? c->lid : c->lid + dev);
	/* Leave room above for the other devices of this host. */
	return (uint16_t)(1 + (sv_host_hash() + dev) % (SV_LID_MAX_UNICAST - SV_MAX_DEVICES));
}

static int init_region(int fd, struct stat *st)
{
	struct reg_hdr tmp;
	size_t size = layout(&tmp);
	pthread_mutexattr_t ma;

	if (st->st_size != 0 && (size_t)st->st_size != size) {
		/* A registry of another layout: only a different version of
		 * softverbs makes one.  Say so rather than corrupt it. */
		return EPROTO;
	}
	if (st->st_size == 0 && ftruncate(fd, (off_t)size))
		return errno;
	void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return errno;
	reg = m;
	if (atomic_load_explicit(&reg->ready, memory_order_acquire)) {
		if (reg->magic != REG_MAGIC || reg->version != SV_REGISTRY_VERSION) {
			munmap(m, size);
			reg = NULL;
			return EPROTO;
		}
		return 0;
	}
	/* We hold the flock and nobody has published: (re)initialise.  A
	 * creator that died before `ready` left a region we may overwrite. */
	memset(m, 0, size);
	layout(reg);
	reg->size = size;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&reg->lock, &ma);
	pthread_mutexattr_destroy(&ma);
	for (unsigned d = 0; d < SV_MAX_DEVICES; d++)
		reg->lid[d] = derive_lid(d);
	reg->magic = REG_MAGIC;
	reg->version = SV_REGISTRY_VERSION;
	/* Pairs with the acquire load above in every later opener. */
	atomic_store_explicit(&reg->ready, 1, memory_order_release);
	return 0;
}

/*
 * A host is a network namespace (docs/architecture.md §3): processes in
 * two namespaces are two hosts even where they share /dev/shm, so the
 * namespace is part of the registry's name.
 */
uint64_t sv_netns_id(void)
{
	struct stat st;

	return stat("/proc/self/ns/net", &st) ? 0 : (uint64_t)st.st_ino;
}

void sv_reg_name(char *buf, size_t len)
{
	const struct sv_config *c = sv_config();
	unsigned long long ns = (unsigned long long)sv_netns_id();

	if (c->registry[0])
		snprintf(buf, len, "/dev/shm/%s.n%llu.v%u", c->registry, ns, SV_REGISTRY_VERSION);
	else
		snprintf(buf, len, "/dev/shm/softverbs-%u.n%llu.v%u.registry", (unsigned)getuid(), ns,
			 SV_REGISTRY_VERSION);
}

/*
 * Each user has a registry of its own, so two users' processes would
 * allocate the same QPNs; a QPN of the other user's would then name one of
 * this user's QPs, and a connection between them would be made silently
 * to the wrong QP.  Each user slot allocates from a range of its own, so
 * that a QPN of another user is known for one (sv_pkt_qp_route says so).
 * Users whose uids are equal modulo SV_QPN_USERS share a range.
 */
uint32_t sv_qpn_base = SV_QPN_BASE;

static void __attribute__((constructor)) qpn_range(void)
{
	sv_qpn_base = SV_QPN_BASE + (uint32_t)(getuid() % SV_QPN_USERS) * SV_HOST_MAX_QP;
}

bool sv_qpn_ours(uint32_t qpn)
{
	return qpn - sv_qpn_base < SV_HOST_MAX_QP;
}

bool sv_reg_other_user(uid_t *uid)
{
	char tag[64];
	bool found = false;
	DIR *d = opendir("/dev/shm");

	if (!d)
		return false;
	int n = snprintf(tag, sizeof(tag), ".n%llu.v%u", (unsigned long long)sv_netns_id(),
			 SV_REGISTRY_VERSION);
	for (struct dirent *e; !found && (e = readdir(d));) {
		const char *at = strstr(e->d_name, tag);
		struct stat st;

		/* A registry's name ends in the tag (SOFTVERBS_REGISTRY's) or
		 * in the tag and ".registry" (the default). */
		if (!at || (at[n] && strcmp(at + n, ".registry")) ||
		    fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode) ||
		    st.st_uid == getuid())
			continue;
		*uid = st.st_uid;
		found = true;
	}
	closedir(d);
	return found;
}

/* An endpoint's segment file: named here, beside the registry, which
 * removes the files of dead processes' endpoints (sweep). */
void sv_seg_name(char *buf, size_t len, int32_t pid, uint32_t ep)
{
	snprintf(buf, len, "/dev/shm/softverbs-%u-seg-%d-%u", (unsigned)getuid(), (int)pid, ep);
}

int sv_reg_open(void)
{
	struct stat st;
	int ret = 0;

	pthread_mutex_lock(&open_lock);
	if (reg)
		goto out;
	/* The layout version is part of the name: processes of two softverbs
	 * versions cannot share a registry, and must not block each other. */
	sv_reg_name(reg_path, sizeof(reg_path));
	int fd = open(reg_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		ret = errno;
		goto out;
	}
	if (flock(fd, LOCK_EX)) {
		ret = errno;
	} else {
		ret = fstat(fd, &st) ? errno : init_region(fd, &st);
		flock(fd, LOCK_UN);
	}
	close(fd);
	if (!ret)
		atomic_store_explicit(&reg_pub, reg, memory_order_release);
out:
	pthread_mutex_unlock(&open_lock);
	if (ret == EPROTO)
		sv_log(SV_LOG_ERROR, "host registry %s was made by another softverbs version; "
		       "stop its users and remove it", reg_path);
	else if (ret)
		sv_log(SV_LOG_ERROR, "host registry %s: %s", reg_path, strerror(ret));
	return ret;
}

const char *sv_reg_path(void)
{
	return reg_path;
}

uint32_t sv_reg_port(unsigned dev)
{
	struct reg_hdr *r = atomic_load_explicit(&reg_pub, memory_order_acquire);

	if (!r && (sv_reg_open() || !(r = reg)))
		return 0;
	/* Pairs with the release in sv_reg_port_set(): nothing else is
	 * published with it, relaxed would do; acquire keeps it simple. */
	return dev < SV_MAX_DEVICES ? atomic_load_explicit(&r->port[dev], memory_order_acquire) : 0;
}

int sv_reg_port_set(unsigned dev, bool up)
{
	if (dev >= SV_MAX_DEVICES)
		return EINVAL;
	int ret = sv_reg_open();
	if (ret)
		return ret;
	reg_lock();
	uint32_t w = atomic_load_explicit(&reg->port[dev], memory_order_relaxed);
	ret = !(w & 1) == up ? EALREADY : 0;
	if (!ret)
		atomic_store_explicit(&reg->port[dev], ((w >> 1) + 1) << 1 | !up, memory_order_release);
	reg_unlock();
	return ret;
}

uint16_t sv_reg_lid(unsigned dev)
{
	if (sv_reg_open() || dev >= SV_MAX_DEVICES)
		return 0;
	return reg->lid[dev];
}

int sv_reg_ep_attach(unsigned dev_index, uint32_t *out)
{
	int32_t pid = sv_pid();
	uint64_t st = sv_proc_start_time(pid);
	int ret = sv_reg_open();

	if (ret)
		return ret;
	reg_lock();
	/* A newcomer pays for the dead: stale entries never accumulate. */
	sweep_locked();
	ret = ENOSPC;
	for (uint32_t i = 0; i < reg->n_eps; i++) {
		struct reg_ep *ep = &eps()[i];

		if (atomic_load_explicit(&ep->state, memory_order_relaxed) != SV_EP_FREE)
			continue;
		atomic_store_explicit(&ep->pid, pid, memory_order_relaxed);
		atomic_store_explicit(&ep->start_time, st, memory_order_relaxed);
		atomic_store_explicit(&ep->dev_index, dev_index, memory_order_relaxed);
		ep->nqps = 0;
		for (int k = 0; k < SV_COPY_PATHS; k++)
			atomic_store_explicit(&ep->bytes[k], 0, memory_order_relaxed);
		/* Identity first, then LIVE: see the file comment. */
		atomic_store_explicit(&ep->state, SV_EP_LIVE, memory_order_release);
		*out = i;
		ret = 0;
		break;
	}
	reg_unlock();
	return ret;
}

void sv_reg_ep_detach(uint32_t idx)
{
	if (!reg || idx >= reg->n_eps)
		return;
	reg_lock();
	for (uint32_t i = 0; i < reg->n_qpns; i++)
		if (atomic_load_explicit(&qpns()[i].owner, memory_order_relaxed) == idx + 1)
			atomic_store_explicit(&qpns()[i].owner, 0, memory_order_relaxed);
	atomic_store_explicit(&eps()[idx].state, SV_EP_FREE, memory_order_release);
	reg_unlock();
}

int sv_reg_qpn_alloc(uint32_t ep, enum ibv_qp_type type, uint32_t *qpn)
{
	int ret = ENOSPC;

	if (!reg || ep >= reg->n_eps)
		return EINVAL;
	reg_lock();
	for (int pass = 0; pass < 2 && ret; pass++) {
		/* Round-robin from the cursor, so a just-freed QPN is the last
		 * to be reused, as on hardware. */
		for (uint32_t n = 0; n < reg->n_qpns; n++) {
			uint32_t i = (reg->qpn_cursor + n) % reg->n_qpns;
			struct reg_qpn *q = &qpns()[i];

			if (atomic_load_explicit(&q->owner, memory_order_relaxed))
				continue;
			q->qp_type = (uint8_t)type;
			atomic_store_explicit(&q->state, IBV_QPS_RESET, memory_order_relaxed);
			atomic_store_explicit(&q->owner, ep + 1, memory_order_release);
			eps()[ep].nqps++;
			reg->qpn_cursor = (i + 1) % reg->n_qpns;
			*qpn = sv_qpn_base + i;
			ret = 0;
			break;
		}
		if (ret && !sweep_locked())
			break;
	}
	reg_unlock();
	return ret;
}

/*
 * Lock-free: the data path resolves destinations here.  The owner index is
 * stored last by the allocator (release), so the endpoint it names is
 * complete; a stale answer (the owner died or the entry was reused since)
 * is caught by the segment header, which names its pid and endpoint.
 */
int sv_reg_qpn_owner(uint32_t qpn, struct sv_reg_ep_info *out)
{
	uint32_t i = qpn - sv_qpn_base;
	/* The caller has a context, so the registry is open: no lock here.
	 * Pairs with the release store in sv_reg_open(). */
	struct reg_hdr *r = atomic_load_explicit(&reg_pub, memory_order_acquire);

	if (!r || qpn < sv_qpn_base || i >= r->n_qpns)
		return ENOENT;
	uint32_t o = atomic_load_explicit(&qpns()[i].owner, memory_order_acquire);
	if (!o || o > reg->n_eps)
		return ENOENT;
	struct reg_ep *ep = &eps()[o - 1];
	if (atomic_load_explicit(&ep->state, memory_order_acquire) != SV_EP_LIVE)
		return ENOENT;
	*out = (struct sv_reg_ep_info){
		.index = o - 1,
		.pid = atomic_load_explicit(&ep->pid, memory_order_relaxed),
		.start_time = atomic_load_explicit(&ep->start_time, memory_order_relaxed),
		.dev_index = atomic_load_explicit(&ep->dev_index, memory_order_relaxed),
	};
	return 0;
}

void sv_reg_qpn_free(uint32_t qpn)
{
	uint32_t i = qpn - sv_qpn_base;

	if (!reg || qpn < sv_qpn_base || i >= reg->n_qpns)
		return;
	reg_lock();
	uint32_t o = atomic_load_explicit(&qpns()[i].owner, memory_order_relaxed);
	if (o && o <= reg->n_eps && eps()[o - 1].nqps)
		eps()[o - 1].nqps--;
	atomic_store_explicit(&qpns()[i].owner, 0, memory_order_release);
	mcast_sweep_locked();
	reg_unlock();
}

static bool mcast_match(const struct reg_mcast *m, const union ibv_gid *gid, uint16_t lid)
{
	return !memcmp(m->gid, gid->raw, 16) && m->lid == lid;
}

int sv_reg_mcast_attach(uint32_t qpn, const union ibv_gid *gid, uint16_t lid)
{
	struct reg_mcast *free_slot = NULL;
	int ret = 0;

	reg_lock();
	for (uint32_t i = 0; i < reg->n_mcast; i++) {
		struct reg_mcast *m = &mcasts()[i];
		if (m->qpn == qpn && mcast_match(m, gid, lid))
			goto out;	/* attached already: nothing to do (rxe) */
		if (!m->qpn && !free_slot)
			free_slot = m;
	}
	if (!free_slot) {
		ret = ENOMEM;
		goto out;
	}
	memcpy(free_slot->gid, gid->raw, 16);
	free_slot->lid = lid;
	free_slot->qpn = qpn;
out:
	reg_unlock();
	return ret;
}

int sv_reg_mcast_detach(uint32_t qpn, const union ibv_gid *gid, uint16_t lid)
{
	int ret = EINVAL;

	reg_lock();
	for (uint32_t i = 0; i < reg->n_mcast; i++) {
		struct reg_mcast *m = &mcasts()[i];
		if (m->qpn == qpn && mcast_match(m, gid, lid)) {
			m->qpn = 0;
			ret = 0;
		}
	}
	reg_unlock();
	return ret;
}

int sv_reg_mcast_members(const union ibv_gid *gid, uint16_t lid, bool by_gid, uint32_t *qpns_out,
			 int max)
{
	int n = 0;

	reg_lock();
	for (uint32_t i = 0; i < reg->n_mcast && n < max; i++) {
		struct reg_mcast *m = &mcasts()[i];
		if (!m->qpn || (by_gid ? memcmp(m->gid, gid->raw, 16) : m->lid != lid))
			continue;
		/* A QP attached to one MGID under two MLIDs gets one copy. */
		int k = 0;
		while (k < n && qpns_out[k] != m->qpn)
			k++;
		if (k == n)
			qpns_out[n++] = m->qpn;
	}
	reg_unlock();
	return n;
}

int sv_reg_flow_add(uint32_t qpn, const struct sv_flow_rule *r, uint32_t *slot)
{
	int ret = ENOMEM;

	reg_lock();
	for (uint32_t i = 0; i < reg->n_flows; i++) {
		if (flows()[i].qpn)
			continue;
		flows()[i].r = *r;
		flows()[i].qpn = qpn;
		*slot = i;
		ret = 0;
		break;
	}
	reg_unlock();
	return ret;
}

void sv_reg_flow_del(uint32_t slot, uint32_t qpn)
{
	reg_lock();
	if (slot < reg->n_flows && flows()[slot].qpn == qpn)
		flows()[slot].qpn = 0;
	reg_unlock();
}

/* Every byte of the key that the rule masks must agree. */
static bool flow_match(const struct sv_flow_rule *r, const struct sv_pkt_key *k)
{
	const uint8_t *v = (const uint8_t *)&r->val, *m = (const uint8_t *)&r->mask;
	const uint8_t *p = (const uint8_t *)k;

	for (size_t i = 0; i < sizeof(*k); i++)
		if ((p[i] ^ v[i]) & m[i])
			return false;
	return true;
}

static int add_target(uint32_t *qpns_out, int n, int max, uint32_t qpn)
{
	for (int k = 0; k < n; k++)
		if (qpns_out[k] == qpn)
			return n;
	if (n < max)
		qpns_out[n++] = qpn;
	return n;
}

int sv_reg_flow_targets(const struct sv_pkt_key *k, uint8_t port, uint32_t *qpns_out, int max)
{
	int best = INT32_MAX, n = 0;

	reg_lock();
	/* NORMAL rules: the matching ones of the best (lowest) priority. */
	for (uint32_t i = 0; i < reg->n_flows; i++) {
		const struct reg_flow *f = &flows()[i];
		if (f->qpn && f->r.port == port && f->r.type == IBV_FLOW_ATTR_NORMAL &&
		    f->r.priority < best && flow_match(&f->r, k))
			best = f->r.priority;
	}
	for (uint32_t i = 0; i < reg->n_flows; i++) {
		const struct reg_flow *f = &flows()[i];
		if (!f->qpn || f->r.port != port)
			continue;
		bool take;
		switch (f->r.type) {
		case IBV_FLOW_ATTR_NORMAL:
			take = f->r.priority == best && flow_match(&f->r, k);
			break;
		/* The defaults take what no NORMAL rule took (all traffic, or
		 * multicast: the group bit of the destination MAC). */
		case IBV_FLOW_ATTR_ALL_DEFAULT:
			take = best == INT32_MAX;
			break;
		case IBV_FLOW_ATTR_MC_DEFAULT:
			take = best == INT32_MAX && (k->eth.dst_mac[0] & 1);
			break;
		default:	/* SNIFFER: a copy of everything */
			take = true;
			break;
		}
		if (take)
			n = add_target(qpns_out, n, max, f->qpn);
	}
	reg_unlock();
	return n;
}

void sv_reg_count_bytes(uint32_t ep, enum sv_copy_path path, uint64_t n)
{
	/* Only this process writes its entry: a plain add, not a locked one.
	 * Two of its threads counting at once may lose one count; these are
	 * statistics. */
	if (reg && ep < reg->n_eps) {
		_Atomic uint64_t *b = &eps()[ep].bytes[path];
		atomic_store_explicit(b, atomic_load_explicit(b, memory_order_relaxed) + n,
				      memory_order_relaxed);
	}
}

void sv_reg_ep_forwarded(uint32_t ep)
{
	if (reg && ep < reg->n_eps)
		atomic_fetch_add_explicit(&eps()[ep].forwarded, 1, memory_order_release);
}

const _Atomic uint32_t *sv_reg_ep_forwards(uint32_t ep)
{
	return reg && ep < reg->n_eps ? &eps()[ep].forwarded : NULL;
}

void sv_reg_qpn_set_state(uint32_t qpn, enum ibv_qp_state state)
{
	uint32_t i = qpn - sv_qpn_base;

	/* Read only by `softverbs status`; no lock, relaxed is enough. */
	if (reg && qpn >= sv_qpn_base && i < reg->n_qpns)
		atomic_store_explicit(&qpns()[i].state, (uint8_t)state, memory_order_relaxed);
}

int sv_reg_sweep(void)
{
	int n;

	if (sv_reg_open())
		return -1;
	reg_lock();
	n = sweep_locked();
	reg_unlock();
	return n;
}

int sv_reg_list_eps(struct sv_reg_ep_info *out, int max)
{
	int n = 0;

	if (sv_reg_open())
		return -1;
	reg_lock();
	for (uint32_t i = 0; i < reg->n_eps && n < max; i++) {
		struct reg_ep *ep = &eps()[i];

		if (atomic_load_explicit(&ep->state, memory_order_relaxed) != SV_EP_LIVE)
			continue;
		out[n] = (struct sv_reg_ep_info){ .index = i, .pid = ep->pid, .start_time = ep->start_time,
					  .dev_index = ep->dev_index, .nqps = ep->nqps };
		for (int k = 0; k < SV_COPY_PATHS; k++)
			out[n].bytes[k] = atomic_load_explicit(&ep->bytes[k], memory_order_relaxed);
		n++;
	}
	reg_unlock();
	return n;
}

int sv_reg_list_qps(struct sv_reg_qp_info *out, int max)
{
	int n = 0;

	if (sv_reg_open())
		return -1;
	reg_lock();
	for (uint32_t i = 0; i < reg->n_qpns && n < max; i++) {
		struct reg_qpn *q = &qpns()[i];
		uint32_t o = atomic_load_explicit(&q->owner, memory_order_relaxed);

		if (!o || o > reg->n_eps)
			continue;
		out[n++] = (struct sv_reg_qp_info){
			sv_qpn_base + i, o - 1, eps()[o - 1].pid, q->qp_type,
			atomic_load_explicit(&q->state, memory_order_relaxed) };
	}
	reg_unlock();
	return n;
}

const char *sv_reg_check(void)
{
	static char why[160];
	const char *ret = NULL;

	if (sv_reg_open())
		return "cannot open the registry";
	reg_lock();
	uint32_t *count = calloc(reg->n_eps, sizeof(*count));
	for (uint32_t i = 0; count && i < reg->n_qpns && !ret; i++) {
		uint32_t o = atomic_load_explicit(&qpns()[i].owner, memory_order_relaxed);

		if (!o)
			continue;
		if (o > reg->n_eps || eps()[o - 1].state != SV_EP_LIVE) {
			snprintf(why, sizeof(why), "QPN 0x%x is owned by free endpoint %u",
				 sv_qpn_base + i, o - 1);
			ret = why;
		} else {
			count[o - 1]++;
		}
	}
	for (uint32_t i = 0; count && i < reg->n_eps && !ret; i++) {
		if (eps()[i].state == SV_EP_LIVE && eps()[i].nqps != count[i]) {
			snprintf(why, sizeof(why), "endpoint %u counts %u QPNs but owns %u",
				 i, eps()[i].nqps, count[i]);
			ret = why;
		}
	}
	if (!count)
		ret = "out of memory";
	free(count);
	reg_unlock();
	return ret;
}
