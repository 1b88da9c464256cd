/* SPDX-License-Identifier: MIT */
/*
 * The direct path: when the memory behind an MR is shareable -- a SysV shm
 * segment (perftest's --use_hugepages buffers), POSIX shm, a hugetlbfs or
 * any other named MAP_SHARED file -- a peer maps the same pages once and
 * then moves bytes with plain loads and stores: no system call per
 * operation.  Private memory stays on CMA.
 *
 * The owner describes the backing at registration (/proc/self/maps is the
 * only source of truth for what backs an address range); the peer maps it
 * on first use, checks it is the same object (device and inode), and keeps
 * the mapping for the life of the process, as it keeps peer segments.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "shm.h"

static bool parse_vma(const char *line, struct sv_vma *v)
{
	int n = 0;

	v->path[0] = 0;
	if (sscanf(line, "%lx-%lx %4s %lx %x:%x %lu %n", &v->start, &v->end, v->perms, &v->offset,
		   &v->maj, &v->min, &v->ino, &n) < 7)
		return false;
	snprintf(v->path, sizeof(v->path), "%s", line + n);
	v->path[strcspn(v->path, "\n")] = 0;
	return true;
}

int sv_vma_walk(const void *addr, size_t len, bool (*fn)(const struct sv_vma *v, void *arg),
		void *arg)
{
	uintptr_t at = (uintptr_t)addr, e = at + len;
	struct sv_vma v;
	char *line = NULL;
	size_t cap = 0;
	FILE *f = fopen("/proc/self/maps", "re");

	if (!f)
		return -1;
	/* getline: a line with a long path is still one line. */
	while (at < e && getline(&line, &cap, f) > 0) {
		if (!parse_vma(line, &v) || v.end <= at)
			continue;
		if (v.start > at || !fn(&v, arg))
			break;	/* a gap, or refused */
		at = v.end;
	}
	free(line);
	fclose(f);
	return at >= e;
}

/* Every page of the range: shared, one object, contiguous. */
struct describe {
	struct shm_share sh;
	bool first;
	int64_t delta;		/* object offset - address, constant over the range */
};

static bool describe_vma(const struct sv_vma *v, void *arg)
{
	struct describe *d = arg;
	int64_t delta = (int64_t)v->offset - (int64_t)v->start;

	/* A SysV segment's inode number is its id, and 0 is a valid id: the
	 * first segment an IPC namespace creates (a fresh machine or
	 * container) has it.  A file needs a real inode. */
	bool sysv = !strncmp(v->path, "/SYSV", 5);
	if (v->perms[3] != 's' || (!v->ino && !sysv))
		return false;
	if (!d->first)
		return delta == d->delta && makedev(v->maj, v->min) == d->sh.dev &&
		       v->ino == d->sh.ino;
	d->first = false;
	d->delta = delta;
	d->sh.dev = makedev(v->maj, v->min);
	d->sh.ino = v->ino;
	if (sysv) {
		d->sh.kind = SHM_SHARE_SYSV;
		d->sh.shmid = (int32_t)v->ino;	/* a SysV segment's inode is its id */
		return true;
	}
	if (v->path[0] == '/' && !strstr(v->path, " (deleted)")) {
		d->sh.kind = SHM_SHARE_FILE;
		snprintf(d->sh.path, sizeof(d->sh.path), "%s", v->path);
		return true;
	}
	return false;	/* memfd, deleted files, /dev/zero: no name to open */
}

uint64_t sv_direct_describe(struct sv_seg *s, const void *addr, size_t len)
{
	struct describe d = { .first = true };

	if (sv_vma_walk(addr, len, describe_vma, &d) != 1)
		return 0;
	d.sh.offset = (uint64_t)((int64_t)(uintptr_t)addr + d.delta);
	uint64_t off = sv_seg_alloc(s, sizeof(d.sh));
	if (off)
		memcpy(shm_at(s->h, off), &d.sh, sizeof(d.sh));
	return off;
}

/* ---- the peer's side ---- */

struct mapping {
	uint64_t dev, ino;
	uint64_t off, len;	/* object range mapped */
	char *base;		/* address of object offset `off`; NULL = cannot map */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct mapping *maps;
static uint32_t nmaps, cap;

static struct mapping *find(uint64_t dev, uint64_t ino, uint64_t off, uint64_t len)
{
	for (uint32_t i = 0; i < nmaps; i++)
		if (maps[i].dev == dev && maps[i].ino == ino && off >= maps[i].off &&
		    off + len <= maps[i].off + maps[i].len)
			return &maps[i];
	return NULL;
}

static struct mapping *add(const struct mapping *m)
{
	if (nmaps == cap) {
		uint32_t ncap = cap ? cap * 2 : 16;
		void *n = realloc(maps, ncap * sizeof(*maps));
		if (!n)
			return NULL;
		maps = n;
		cap = ncap;
	}
	maps[nmaps] = *m;
	return &maps[nmaps++];
}

/* Maps the object range [off, off + len) of share sh; base NULL if not. */
static struct mapping map_object(const struct shm_share *sh, uint64_t off, uint64_t len)
{
	struct mapping m = { sh->dev, sh->ino, off, len, NULL };
	long pg = sysconf(_SC_PAGESIZE);

	if (sh->kind == SHM_SHARE_SYSV) {
		struct shmid_ds ds;
		/* The whole segment, at its offset 0; a segment marked for
		 * removal can still be attached on Linux while in use. */
		if (shmctl(sh->shmid, IPC_STAT, &ds) || off + len > ds.shm_segsz)
			return m;
		void *p = shmat(sh->shmid, NULL, 0);
		if (p == (void *)-1)
			return m;
		m.off = 0;
		m.len = ds.shm_segsz;
		m.base = p;
		return m;
	}
	int fd = open(sh->path, O_RDWR | O_CLOEXEC);
	struct stat st;
	if (fd < 0)
		return m;
	/* The same object the owner registered, not a file renamed since. */
	if (fstat(fd, &st) || st.st_dev != sh->dev || st.st_ino != sh->ino) {
		close(fd);
		return m;
	}
	uint64_t a = off & ~(uint64_t)(pg - 1), e = (off + len + (uint64_t)pg - 1) & ~(uint64_t)(pg - 1);
	void *p = mmap(NULL, e - a, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)a);
	close(fd);
	if (p == MAP_FAILED)
		return m;
	m.off = a;
	m.len = e - a;
	m.base = p;
	return m;
}

void *sv_direct_map(const struct shm_hdr *seg, const struct shm_mr *mr, uint64_t va, uint64_t len)
{
	if (!mr->share_off)
		return NULL;
	const struct shm_share *sh = shm_at(seg, mr->share_off);
	/* The MR's object range; the whole MR is mapped on first use. */
	uint64_t mr_off = sh->offset, obj = mr_off + (va - mr->addr);
	struct mapping *m;

	pthread_mutex_lock(&lock);
	m = find(sh->dev, sh->ino, obj, len);
	if (!m) {
		struct mapping fresh = map_object(sh, mr_off, mr->length);
		if (!fresh.base) {
			/* Remember the failure for this MR's range: CMA it is. */
			fresh.off = mr_off;
			fresh.len = mr->length;
		}
		m = add(&fresh);
		if (m && m->base)
			sv_dbg("direct path: mapped %s object dev %llu ino %llu [%llu, +%llu) of pid %d",
			       sh->kind == SHM_SHARE_SYSV ? "SysV shm" : sh->path,
			       (unsigned long long)sh->dev, (unsigned long long)sh->ino,
			       (unsigned long long)m->off, (unsigned long long)m->len, (int)seg->pid);
	}
	char *p = m && m->base ? m->base + (obj - m->off) : NULL;
	pthread_mutex_unlock(&lock);
	return p;
}
