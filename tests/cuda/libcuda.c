/* SPDX-License-Identifier: MIT */
/*
 * A CUDA driver API double, for tests only: libcuda.so.1 with exactly
 * the calls softverbs makes (src/core/cuda.h) and the few a test needs to
 * allocate and fill device memory, implemented with host memory.
 *
 * It is strict where a GPU would be:
 *   - "device memory" is an address range mapped PROT_NONE: a CPU load or
 *     store, or process_vm_readv/writev, of it fails (SIGSEGV, EFAULT), so
 *     a test passes only if softverbs touches it with cuMemcpy alone.  The
 *     bytes live in a second, private mapping of the same file that only
 *     this library uses;
 *   - copies and allocations need a current context;
 *   - an IPC handle opens only in another process, and a second open of
 *     the same handle returns the same address with a reference taken,
 *     as the driver does;
 *   - a freed allocation's addresses stay reserved and answer
 *     CUDA_ERROR_INVALID_VALUE.
 * What it cannot prove: DMA ordering, stream semantics, peer access
 * between GPUs, the real driver's speed.
 *
 * cudouble_stats() gives the counters tests check (IPC opens and closes).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/cuda.h"

/* Every entry point is found by name (dlsym), as the real driver's are;
 * no header of this library declares them. */
#pragma GCC diagnostic ignored "-Wmissing-prototypes"

#define EXPORT __attribute__((visibility("default")))
#define HANDLE_MAGIC 0x44554356u	/* "VCUD" */

struct handle {
	uint32_t magic;
	int32_t pid;
	uint64_t size;
	char name[48];
};
_Static_assert(sizeof(struct handle) <= CU_IPC_HANDLE_SIZE, "fits a CUipcMemHandle");

struct alloc {
	uintptr_t dptr;			/* the PROT_NONE range: the "device address" */
	size_t size;
	char *bytes;			/* where the bytes are */
	char name[48];			/* the backing file, in /dev/shm */
	bool imported, freed;
	int refs;			/* imported: opens not closed yet */
	bool sync_memops;
};

struct cudouble_stats {
	unsigned long ipc_opens;	/* cuIpcOpenMemHandle calls that succeeded */
	unsigned long ipc_closes;
	unsigned long ipc_open_now;	/* imported allocations mapped now */
	unsigned long sync_memops;	/* cuPointerSetAttribute(SYNC_MEMOPS) calls */
	unsigned long memcpys;
	unsigned long allocs_now;
	unsigned long pinned_now;	/* cuMemHostRegister'ed buffers */
	unsigned long memcpy_bytes;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *allocs;
static int nallocs, cap;
static struct cudouble_stats stats;
static bool inited;
static struct CUctx_st { int device; } primary = { 0 };
static __thread CUcontext stack[8];
static __thread int depth;

EXPORT void cudouble_stats(struct cudouble_stats *out)
{
	pthread_mutex_lock(&lock);
	*out = stats;
	pthread_mutex_unlock(&lock);
}

static CUcontext current(void)
{
	return depth ? stack[depth - 1] : NULL;
}

/* The live allocation holding [p, +n), or NULL; *gone when p lies in a
 * freed one.  Called with the lock held. */
static struct alloc *find(uintptr_t p, size_t n, bool *gone)
{
	*gone = false;
	for (int i = 0; i < nallocs; i++) {
		struct alloc *a = &allocs[i];
		if (p < a->dptr || p - a->dptr >= a->size)
			continue;
		if (a->freed) {
			*gone = true;
			continue;
		}
		return n <= a->size - (p - a->dptr) ? a : NULL;
	}
	return NULL;
}

static struct alloc *add(void)
{
	if (nallocs == cap) {
		int ncap = cap ? cap * 2 : 16;
		void *n = realloc(allocs, (size_t)ncap * sizeof(*allocs));
		if (!n)
			return NULL;
		allocs = n;
		cap = ncap;
	}
	memset(&allocs[nallocs], 0, sizeof(allocs[0]));
	return &allocs[nallocs++];
}

/* Maps the file `name` as a new allocation: the reserved range and the
 * bytes. */
static CUresult map(struct alloc *a, int fd, size_t size)
{
	void *d = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	void *b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (d == MAP_FAILED || b == MAP_FAILED) {
		if (d != MAP_FAILED)
			munmap(d, size);
		if (b != MAP_FAILED)
			munmap(b, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->dptr = (uintptr_t)d;
	a->bytes = b;
	a->size = size;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuInit(unsigned flags)
{
	if (flags)
		return CUDA_ERROR_INVALID_VALUE;
	inited = true;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v)
{
	*v = 12000;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorName(CUresult r, const char **name)
{
	switch (r) {
	case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
	case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
	case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
	case CUDA_ERROR_NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
	case CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
	case CUDA_ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; break;
	case CUDA_ERROR_INVALID_HANDLE: *name = "CUDA_ERROR_INVALID_HANDLE"; break;
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n)
{
	if (!inited)
		return CUDA_ERROR_NOT_INITIALIZED;
	*n = 1;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
	if (!inited)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ordinal)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = 0;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice dev)
{
	if (dev)
		return CUDA_ERROR_INVALID_DEVICE;
	memcpy(u->bytes, "softverbs-double", 16);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
	if (!inited)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev)
		return CUDA_ERROR_INVALID_DEVICE;
	*ctx = &primary;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx)
{
	*ctx = current();
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
	if (!depth)
		depth = 1;
	stack[depth - 1] = ctx;
	if (!ctx)
		depth = 0;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void)
{
	return current() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	if (ctx != &primary)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth == (int)(sizeof(stack) / sizeof(stack[0])))
		return CUDA_ERROR_OUT_OF_MEMORY;
	stack[depth++] = ctx;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
	if (!depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	*ctx = stack[--depth];
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
	static unsigned long seq;
	char name[48];

	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!size)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	snprintf(name, sizeof(name), "/cudouble.%d.%lu", (int)getpid(), ++seq);
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
	struct alloc *a = fd >= 0 && !ftruncate(fd, (off_t)size) ? add() : NULL;
	if (a && (r = map(a, fd, size)) == CUDA_SUCCESS) {
		snprintf(a->name, sizeof(a->name), "%s", name);
		*p = a->dptr;
		stats.allocs_now++;
	} else {
		if (a)
			nallocs--;
		if (fd >= 0)
			shm_unlink(name);
	}
	if (fd >= 0)
		close(fd);
	pthread_mutex_unlock(&lock);
	return r;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
	bool gone;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&lock);
	struct alloc *a = find((uintptr_t)p, 1, &gone);
	if (a && !a->imported && a->dptr == p) {
		/* The range stays reserved: a late access still faults. */
		munmap(a->bytes, a->size);
		shm_unlink(a->name);
		a->freed = true;
		stats.allocs_now--;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	bool gone;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&lock);
	struct alloc *a = find((uintptr_t)p, 1, &gone);
	if (a) {
		*base = a->dptr;
		*size = a->size;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
	bool gone;
	CUresult r = CUDA_SUCCESS;

	if (!inited)
		return CUDA_ERROR_NOT_INITIALIZED;
	pthread_mutex_lock(&lock);
	struct alloc *a = find((uintptr_t)p, 1, &gone);
	if (!a)
		r = CUDA_ERROR_INVALID_VALUE;	/* host memory CUDA does not know */
	else if (attr == CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
		*(unsigned *)data = CU_MEMORYTYPE_DEVICE;
	else if (attr == CU_POINTER_ATTRIBUTE_CONTEXT)
		*(CUcontext *)data = &primary;
	else if (attr == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
		*(int *)data = 0;
	else if (attr == CU_POINTER_ATTRIBUTE_IS_MANAGED)
		*(unsigned *)data = 0;
	else
		r = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&lock);
	return r;
}

EXPORT CUresult cuPointerSetAttribute(const void *value, int attr, CUdeviceptr p)
{
	bool gone;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&lock);
	struct alloc *a = find((uintptr_t)p, 1, &gone);
	if (a && attr == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) {
		a->sync_memops = *(const int *)value;
		stats.sync_memops++;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

/* Where the bytes of [p, +n) are: the allocation's own mapping, or p
 * itself for host memory. */
static CUresult resolve(uintptr_t p, size_t n, char **out)
{
	bool gone;
	struct alloc *a = find(p, n, &gone);

	if (a) {
		*out = a->bytes + (p - a->dptr);
		return CUDA_SUCCESS;
	}
	for (int i = 0; i < nallocs; i++)	/* in an allocation but past its end */
		if (!allocs[i].freed && p >= allocs[i].dptr && p - allocs[i].dptr < allocs[i].size)
			return CUDA_ERROR_INVALID_VALUE;
	if (gone)
		return CUDA_ERROR_INVALID_VALUE;
	*out = (char *)p;
	return CUDA_SUCCESS;
}

/* CUDOUBLE_COPY_US=N, or cudouble_copy_us(N): every copy takes N µs
 * more, as a real cuMemcpy's launch and synchronisation cost does (some
 * µs). */
static _Atomic int extra_us = -1;

EXPORT void cudouble_copy_us(int us)
{
	atomic_store(&extra_us, us);
}

static unsigned copy_us(void)
{
	if (atomic_load(&extra_us) < 0) {
		const char *e = getenv("CUDOUBLE_COPY_US");
		atomic_store(&extra_us, e ? atoi(e) : 0);
	}
	return (unsigned)atomic_load(&extra_us);
}

EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	char *d, *s;
	CUresult r;

	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (copy_us())
		usleep(copy_us());
	pthread_mutex_lock(&lock);
	r = resolve(dst, n, &d);
	if (r == CUDA_SUCCESS)
		r = resolve(src, n, &s);
	if (r == CUDA_SUCCESS) {
		stats.memcpys++;
		stats.memcpy_bytes += n;
		memmove(d, s, n);
	}
	pthread_mutex_unlock(&lock);
	return r;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	return cuMemcpy(dst, (CUdeviceptr)(uintptr_t)src, n);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	return cuMemcpy((CUdeviceptr)(uintptr_t)dst, src, n);
}

/* Pinned host memory is host memory that the GPU reaches by DMA: here,
 * counted. */
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags)
{
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!p || !n || (flags & ~(unsigned)CU_MEMHOSTREGISTER_PORTABLE))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	stats.pinned_now++;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lock);
	stats.pinned_now--;
	pthread_mutex_unlock(&lock);
	return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
	bool gone;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&lock);
	struct alloc *a = find((uintptr_t)p, 1, &gone);
	if (a && !a->imported && a->dptr == p) {
		struct handle hd = { HANDLE_MAGIC, (int32_t)getpid(), a->size, "" };
		snprintf(hd.name, sizeof(hd.name), "%s", a->name);
		memset(h, 0, sizeof(*h));
		memcpy(h, &hd, sizeof(hd));
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags)
{
	struct handle hd;
	CUresult r = CUDA_SUCCESS;

	(void)flags;
	memcpy(&hd, &h, sizeof(hd));
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (hd.magic != HANDLE_MAGIC)
		return CUDA_ERROR_INVALID_VALUE;
	if (hd.pid == (int32_t)getpid())
		return CUDA_ERROR_INVALID_CONTEXT;	/* as the driver: not in the exporter */
	pthread_mutex_lock(&lock);
	struct alloc *a = NULL;
	for (int i = 0; i < nallocs && !a; i++)
		if (allocs[i].imported && !allocs[i].freed && !strcmp(allocs[i].name, hd.name))
			a = &allocs[i];
	if (!a) {
		int fd = shm_open(hd.name, O_RDWR, 0);
		if (fd < 0) {
			r = CUDA_ERROR_INVALID_HANDLE;	/* freed by its exporter */
		} else if (!(a = add())) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else if ((r = map(a, fd, hd.size)) != CUDA_SUCCESS) {
			nallocs--;
			a = NULL;
		} else {
			a->imported = true;
			snprintf(a->name, sizeof(a->name), "%s", hd.name);
			stats.ipc_open_now++;
		}
		if (fd >= 0)
			close(fd);
	}
	if (a) {
		a->refs++;
		stats.ipc_opens++;
		*p = a->dptr;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
	bool gone;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lock);
	struct alloc *a = find((uintptr_t)p, 1, &gone);
	if (a && a->imported && a->dptr == p) {
		stats.ipc_closes++;
		if (!--a->refs) {
			munmap(a->bytes, a->size);
			a->freed = true;
			stats.ipc_open_now--;
		}
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lock);
	return r;
}
