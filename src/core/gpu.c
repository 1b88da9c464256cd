/* SPDX-License-Identifier: MIT */
/*
 * GPU memory: the CUDA driver, loaded at run time, and the ranges of
 * device memory this process can name.
 *
 * softverbs moves every byte itself, so device memory is only ever
 * touched by cuMemcpy: never by a CPU load or store, nor by
 * process_vm_readv/writev, which cannot reach it.  The copy layer asks
 * this file, per scatter entry, whether an address is device memory: the
 * ranges of this process's own GPU MRs, and of the peers' GPU MRs it has
 * opened by CUDA IPC.  While there are none -- every process that never
 * registers GPU memory -- the question costs one relaxed load.
 *
 * libcuda.so.1 is looked for only when it can matter: registration asks
 * only a process that has the driver loaded already (a device pointer
 * cannot exist in one that has not), and a process that must open a
 * peer's GPU MR loads it then.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sv.h"
#include "cuda.h"

static struct {
#define X(name, sym, ret, args) ret (*name) args;
	SV_CUDA_CALLS(X)
#undef X
} cu;

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int loaded;		/* 1 = cu is filled in (release) */
static char load_err[160];

static const char *cu_name(CUresult r)
{
	const char *n = NULL;

	if (cu.cuGetErrorName && cu.cuGetErrorName(r, &n) == CUDA_SUCCESS && n)
		return n;
	return "CUDA error";
}

static bool resolve(void *lib)
{
#define X(name, sym, ret, args)						\
	if (!(cu.name = (ret (*) args)dlsym(lib, sym))) {		\
		snprintf(load_err, sizeof(load_err), "libcuda.so.1 has no %s", sym); \
		return false;						\
	}
	SV_CUDA_CALLS(X)
#undef X
	CUresult r = cu.cuInit(0);
	if (r != CUDA_SUCCESS) {
		snprintf(load_err, sizeof(load_err), "cuInit: %s (%d)", cu_name(r), r);
		return false;
	}
	return true;
}

/* true when the driver is usable; with !force, only if the process has
 * loaded it already. */
static bool load(bool force)
{
	if (atomic_load_explicit(&loaded, memory_order_acquire))
		return true;
	pthread_mutex_lock(&load_lock);
	if (!atomic_load_explicit(&loaded, memory_order_relaxed)) {
		int mode = RTLD_NOW | RTLD_LOCAL | (force ? 0 : RTLD_NOLOAD);
		void *lib = dlopen("libcuda.so.1", mode);
		if (!lib && force)
			snprintf(load_err, sizeof(load_err), "%s", dlerror());
		else if (!lib)
			snprintf(load_err, sizeof(load_err),
				 "no CUDA driver (libcuda.so.1) is loaded in this process");
		else if (resolve(lib))
			atomic_store_explicit(&loaded, 1, memory_order_release);
		/* A handle is kept: the library stays, as its memory does. */
	}
	pthread_mutex_unlock(&load_lock);
	return atomic_load_explicit(&loaded, memory_order_relaxed);
}

/* ---- the ranges of device memory this process names ---- */

struct range {
	uintptr_t base;
	size_t len;
	CUcontext ctx;
	bool sync;		/* SYNC_MEMOPS refused: synchronise after copies into it */
};

atomic_int sv_gpu_ranges;
static pthread_rwlock_t ranges_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct range *ranges;
static int nranges, cap;

static int track(uintptr_t base, size_t len, CUcontext ctx, bool sync)
{
	pthread_rwlock_wrlock(&ranges_lock);
	if (nranges == cap) {
		int ncap = cap ? cap * 2 : 16;
		void *n = realloc(ranges, (size_t)ncap * sizeof(*ranges));
		if (!n) {
			pthread_rwlock_unlock(&ranges_lock);
			return ENOMEM;
		}
		ranges = n;
		cap = ncap;
	}
	ranges[nranges++] = (struct range){ base, len, ctx, sync };
	atomic_store_explicit(&sv_gpu_ranges, nranges, memory_order_relaxed);
	pthread_rwlock_unlock(&ranges_lock);
	return 0;
}

static void untrack(uintptr_t base, size_t len)
{
	pthread_rwlock_wrlock(&ranges_lock);
	for (int i = 0; i < nranges; i++)
		if (ranges[i].base == base && ranges[i].len == len) {
			ranges[i] = ranges[--nranges];
			break;
		}
	atomic_store_explicit(&sv_gpu_ranges, nranges, memory_order_relaxed);
	pthread_rwlock_unlock(&ranges_lock);
}

/* The device range holding p, or NULL for host memory.  The caller
 * holds ranges_lock for reading. */
static const struct range *dev_range(const void *p)
{
	uintptr_t a = (uintptr_t)p;

	for (int i = 0; i < nranges; i++)
		if (a >= ranges[i].base && a - ranges[i].base < ranges[i].len)
			return &ranges[i];
	return NULL;
}

bool sv_gpu_dev_iov(const struct iovec *v, int n)
{
	bool dev = false;

	if (!sv_gpu_active())
		return false;
	pthread_rwlock_rdlock(&ranges_lock);
	for (int i = 0; i < n && !dev; i++)
		dev = v[i].iov_len && dev_range(v[i].iov_base);
	pthread_rwlock_unlock(&ranges_lock);
	return dev;
}

/* ---- copies ---- */

static CUresult memcpy_sync(void *dst, const void *src, size_t n, bool sync)
{
	CUresult r = cu.cuMemcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n);

	return r == CUDA_SUCCESS && sync ? cu.cuCtxSynchronize() : r;
}

/* cuMemcpy needs a current context; softverbs' own threads have none,
 * and an application thread's stays as it was. */
static CUresult copy(void *dst, const void *src, size_t n, CUcontext ctx, bool sync)
{
	CUcontext cur = NULL, popped;

	if (cu.cuCtxGetCurrent(&cur) != CUDA_SUCCESS || !cur) {
		CUresult r = cu.cuCtxPushCurrent(ctx);
		if (r != CUDA_SUCCESS)
			return r;
		r = memcpy_sync(dst, src, n, sync);
		cu.cuCtxPopCurrent(&popped);
		return r;
	}
	return memcpy_sync(dst, src, n, sync);
}

int sv_gpu_copy(void *dst, const void *src, size_t n)
{
	int err = 0;

	pthread_rwlock_rdlock(&ranges_lock);
	const struct range *d = dev_range(dst), *s = dev_range(src);
	if (d || s) {
		CUresult r = copy(dst, src, n, d ? d->ctx : s->ctx, d && d->sync);
		if (r != CUDA_SUCCESS) {
			sv_dbg("cuMemcpy(%p, %p, %zu): %s (%d)", dst, src, n, cu_name(r), r);
			err = EFAULT;
		}
	} else {
		memcpy(dst, src, n);
	}
	pthread_rwlock_unlock(&ranges_lock);
	return err;
}

/* Page-locks a staging buffer, so that copies from and to it are DMA
 * without the driver's own bounce; 0, or an errno (then it is a plain
 * buffer, slower but correct). */
/* The calls need a current context: a tracked range's, pushed on
 * softverbs' own threads; PORTABLE pins for every context. */
static CUcontext any_ctx(void)
{
	CUcontext ctx = NULL;

	pthread_rwlock_rdlock(&ranges_lock);
	if (nranges)
		ctx = ranges[0].ctx;
	pthread_rwlock_unlock(&ranges_lock);
	return ctx;
}

static CUresult with_ctx(CUcontext ctx, CUresult (*fn)(void *, size_t, unsigned),
			 void (*fn1)(void *), void *p, size_t n)
{
	CUcontext cur = NULL, popped;
	bool push = (cu.cuCtxGetCurrent(&cur) != CUDA_SUCCESS || !cur) && ctx;
	CUresult r = CUDA_SUCCESS;

	if (push && cu.cuCtxPushCurrent(ctx) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (fn)
		r = fn(p, n, CU_MEMHOSTREGISTER_PORTABLE);
	else
		fn1(p);
	if (push)
		cu.cuCtxPopCurrent(&popped);
	return r;
}

static void unregister(void *p)
{
	cu.cuMemHostUnregister(p);
}

int sv_gpu_pin(void *p, size_t n, void **ctx)
{
	if (!atomic_load_explicit(&loaded, memory_order_acquire))
		return ENODEV;
	*ctx = any_ctx();
	return with_ctx(*ctx, cu.cuMemHostRegister, NULL, p, n) == CUDA_SUCCESS ? 0 : EFAULT;
}

void sv_gpu_unpin(void *p, void *ctx)
{
	with_ctx(ctx, NULL, unregister, p, 0);
}

/* ---- registration ---- */

int sv_gpu_probe(const void *addr, size_t len, struct sv_gpu_mem *g, char *why, size_t wlen)
{
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr, base;
	unsigned type = 0;
	size_t size;
	int managed = 0;

	memset(g, 0, sizeof(*g));
	if (!load(false)) {
		snprintf(why, wlen, "%s", load_err);
		return 0;
	}
	/* Host memory CUDA does not know answers an error here, as in
	 * UCX's memory type detection. */
	if (cu.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != CUDA_SUCCESS ||
	    type != CU_MEMORYTYPE_DEVICE) {
		snprintf(why, wlen, "libcuda.so.1 says it is no device memory either");
		return 0;
	}
	/* Managed memory is host-addressable and migrates on its own: it
	 * is registered as host memory, as before softverbs knew CUDA. */
	if (cu.cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p) == CUDA_SUCCESS &&
	    managed) {
		snprintf(why, wlen, "it is CUDA managed memory, registered as host memory");
		return 0;
	}
	CUresult r = cu.cuMemGetAddressRange(&base, &size, p);
	if (r != CUDA_SUCCESS) {
		snprintf(why, wlen, "cuMemGetAddressRange: %s (%d)", cu_name(r), r);
		return -EFAULT;
	}
	if (p - base > size || len > size - (p - base)) {
		snprintf(why, wlen, "it is device memory, but runs %zu bytes past the end of its "
			 "allocation [0x%llx, +%zu)", len - (size - (size_t)(p - base)), base, size);
		return -EFAULT;
	}
	r = cu.cuPointerGetAttribute(&g->ctx, CU_POINTER_ATTRIBUTE_CONTEXT, p);
	if (r == CUDA_SUCCESS)
		r = cu.cuPointerGetAttribute(&g->ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
	CUdevice dev;
	if (r == CUDA_SUCCESS)
		r = cu.cuDeviceGet(&dev, g->ordinal);
	if (r == CUDA_SUCCESS)
		r = cu.cuDeviceGetUuid((CUuuid *)g->uuid, dev);
	/* Memory of the virtual memory management API has no context:
	 * its device's primary one copies it. */
	if (r == CUDA_SUCCESS && !g->ctx)
		r = cu.cuDevicePrimaryCtxRetain((CUcontext *)&g->ctx, dev);
	if (r != CUDA_SUCCESS) {
		snprintf(why, wlen, "the device of the allocation: %s (%d)", cu_name(r), r);
		return -EFAULT;
	}
	/* Every copy into it completes before cuMemcpy returns, even from
	 * pageable host memory (which otherwise returns once the data is
	 * staged): a completion softverbs posts after the copy then means
	 * the data is in device memory, for every stream and process.  Where
	 * the attribute is refused, each copy into it synchronises. */
	int one = 1;
	g->sync = cu.cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, base) !=
		  CUDA_SUCCESS;
	g->base = base;
	g->size = size;
	return 1;
}

int sv_gpu_track(const void *addr, size_t len, void *ctx, bool sync)
{
	return track((uintptr_t)addr, len, ctx, sync);
}

void sv_gpu_untrack(const void *addr, size_t len)
{
	untrack((uintptr_t)addr, len);
}

int sv_gpu_export(const struct sv_gpu_mem *g, void *handle, char *why, size_t wlen)
{
	CUresult r = cu.cuIpcGetMemHandle(handle, g->base);

	if (r != CUDA_SUCCESS) {
		snprintf(why, wlen, "cuIpcGetMemHandle: %s (%d)", cu_name(r), r);
		return EFAULT;
	}
	return 0;
}

/* ---- a peer's GPU memory, by CUDA IPC ---- */

/* The primary context of the device with this UUID, retained once for
 * the life of the process (cuda_ipc in UCX does the same). */
static CUcontext primary_ctx(const uint8_t uuid[16], char *why, size_t wlen)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	static struct { uint8_t uuid[16]; CUcontext ctx; } known[16];
	static int nknown;
	CUcontext ctx = NULL;
	int count = 0;

	pthread_mutex_lock(&lock);
	for (int i = 0; i < nknown && !ctx; i++)
		if (!memcmp(known[i].uuid, uuid, 16))
			ctx = known[i].ctx;
	CUresult r = ctx ? CUDA_SUCCESS : cu.cuDeviceGetCount(&count);
	for (int i = 0; !ctx && r == CUDA_SUCCESS && i < count; i++) {
		CUdevice dev;
		CUuuid u;
		if (cu.cuDeviceGet(&dev, i) != CUDA_SUCCESS ||
		    cu.cuDeviceGetUuid(&u, dev) != CUDA_SUCCESS || memcmp(u.bytes, uuid, 16))
			continue;
		r = cu.cuDevicePrimaryCtxRetain(&ctx, dev);
		if (r == CUDA_SUCCESS && nknown < (int)SV_ARRAY_SIZE(known)) {
			memcpy(known[nknown].uuid, uuid, 16);
			known[nknown++].ctx = ctx;
		}
	}
	pthread_mutex_unlock(&lock);
	if (!ctx)
		snprintf(why, wlen, r != CUDA_SUCCESS ? "the GPU's context: %s" :
			 "its GPU is not visible to this process (CUDA_VISIBLE_DEVICES?)%s",
			 r != CUDA_SUCCESS ? cu_name(r) : "");
	return ctx;
}

void *sv_gpu_open(const void *handle, const uint8_t uuid[16], uint64_t size, void **ctxp,
		  char *why, size_t wlen)
{
	CUipcMemHandle h;
	CUdeviceptr p = 0;
	CUcontext popped;

	if (!load(true)) {
		snprintf(why, wlen, "it is GPU memory, and this process cannot load the CUDA "
			 "driver: %s", load_err);
		return NULL;
	}
	CUcontext ctx = primary_ctx(uuid, why, wlen);
	if (!ctx)
		return NULL;
	memcpy(&h, handle, sizeof(h));
	CUresult r = cu.cuCtxPushCurrent(ctx);
	if (r == CUDA_SUCCESS) {
		r = cu.cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
		cu.cuCtxPopCurrent(&popped);
	}
	if (r != CUDA_SUCCESS) {
		snprintf(why, wlen, "cuIpcOpenMemHandle: %s (%d)", cu_name(r), r);
		return NULL;
	}
	/* As at registration: copies into it complete before they return. */
	int one = 1;
	bool sync = cu.cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p) !=
		    CUDA_SUCCESS;
	if (track((uintptr_t)p, size, ctx, sync)) {
		sv_gpu_close((void *)(uintptr_t)p, size, ctx);
		snprintf(why, wlen, "out of memory");
		return NULL;
	}
	*ctxp = ctx;
	return (void *)(uintptr_t)p;
}

void sv_gpu_close(void *base, uint64_t size, void *ctx)
{
	CUcontext popped;

	untrack((uintptr_t)base, size);
	if (cu.cuCtxPushCurrent(ctx) != CUDA_SUCCESS)
		return;
	CUresult r = cu.cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)base);
	if (r != CUDA_SUCCESS)
		sv_dbg("cuIpcCloseMemHandle(%p): %s (%d)", base, cu_name(r), r);
	cu.cuCtxPopCurrent(&popped);
}
