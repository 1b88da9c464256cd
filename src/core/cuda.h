/* SPDX-License-Identifier: MIT */
/*
 * The few CUDA driver API entry points softverbs calls, declared here as
 * projects that load libcuda.so.1 lazily do: the build needs no CUDA
 * toolkit, and the library is found at run time (core/gpu.c).  Types and
 * values are the driver API's stable 64-bit ABI; each function is looked
 * up under the name libcuda exports for it (the _v2 names where the
 * unversioned symbol is the old 32-bit-size ABI).
 *
 * The test double (tests/cuda/libcuda.c) implements exactly these.
 */
#ifndef SV_CUDA_H
#define SV_CUDA_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_ALREADY_MAPPED = 208,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* CUpointer_attribute */
enum {
	CU_POINTER_ATTRIBUTE_CONTEXT = 1,
	CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	CU_POINTER_ATTRIBUTE_SYNC_MEMOPS = 6,
	CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
	CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
};

/* CUmemorytype */
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2, CU_MEMORYTYPE_UNIFIED = 4 };

enum { CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1 };
enum { CU_MEMHOSTREGISTER_PORTABLE = 1 };

#define CU_IPC_HANDLE_SIZE 64
typedef struct { char reserved[CU_IPC_HANDLE_SIZE]; } CUipcMemHandle;
typedef struct { char bytes[16]; } CUuuid;

/* X(name in this table, symbol libcuda exports, return, parameters) */
#define SV_CUDA_CALLS(X) \
	X(cuInit, "cuInit", CUresult, (unsigned flags)) \
	X(cuDriverGetVersion, "cuDriverGetVersion", CUresult, (int *version)) \
	X(cuGetErrorName, "cuGetErrorName", CUresult, (CUresult err, const char **name)) \
	X(cuDeviceGet, "cuDeviceGet", CUresult, (CUdevice *dev, int ordinal)) \
	X(cuDeviceGetCount, "cuDeviceGetCount", CUresult, (int *count)) \
	X(cuDeviceGetUuid, "cuDeviceGetUuid", CUresult, (CUuuid *uuid, CUdevice dev)) \
	X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult, \
	  (CUcontext *ctx, CUdevice dev)) \
	X(cuCtxGetCurrent, "cuCtxGetCurrent", CUresult, (CUcontext *ctx)) \
	X(cuCtxPushCurrent, "cuCtxPushCurrent_v2", CUresult, (CUcontext ctx)) \
	X(cuCtxPopCurrent, "cuCtxPopCurrent_v2", CUresult, (CUcontext *ctx)) \
	X(cuCtxSynchronize, "cuCtxSynchronize", CUresult, (void)) \
	X(cuPointerGetAttribute, "cuPointerGetAttribute", CUresult, \
	  (void *data, int attribute, CUdeviceptr ptr)) \
	X(cuPointerSetAttribute, "cuPointerSetAttribute", CUresult, \
	  (const void *value, int attribute, CUdeviceptr ptr)) \
	X(cuMemGetAddressRange, "cuMemGetAddressRange_v2", CUresult, \
	  (CUdeviceptr *base, size_t *size, CUdeviceptr ptr)) \
	X(cuMemcpy, "cuMemcpy", CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t n)) \
	X(cuIpcGetMemHandle, "cuIpcGetMemHandle", CUresult, (CUipcMemHandle *h, CUdeviceptr ptr)) \
	X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", CUresult, \
	  (CUdeviceptr *ptr, CUipcMemHandle h, unsigned flags)) \
	X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", CUresult, (CUdeviceptr ptr)) \
	X(cuMemHostRegister, "cuMemHostRegister_v2", CUresult, (void *p, size_t n, unsigned flags)) \
	X(cuMemHostUnregister, "cuMemHostUnregister", CUresult, (void *p))

#endif
