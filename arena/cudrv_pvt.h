/* SPDX-License-Identifier: MIT */
/*
 * cudrv_pvt.h - the CUDA driver, by hand: the driver API types and constants
 * libkvarena uses, declared with cuda.h's values (CUDA 13.0), and the loader
 * that finds the driver at run time (cudrv.c). The library builds where the
 * toolkit is absent and never links libcuda; all of this is part of the
 * driver's stable ABI. Where cuda.h is present the test build checks every
 * declaration here against it (tests/cudastub/abi_check.c).
 *
 * Entry points are fetched with cuGetProcAddress at CU_API_VERSION (12.0),
 * so their signatures are those of cuda.h's versioned names at 12.0:
 * cuMemGetInfo_v2, cuMemAlloc_v2, cuCtxPushCurrent_v2, cuDeviceGetUuid_v2,
 * cuMemcpyDtoHAsync_v2, cuIpcOpenMemHandle_v2, ...
 */
#ifndef KVA_CUDRV_PVT_H
#define KVA_CUDRV_PVT_H

#include <stddef.h>
#include <stdint.h>

#define CU_API_VERSION 12000

typedef int cu_result;                           /* CUresult */
typedef int cu_device;                           /* CUdevice */
typedef struct cu_ctx_st *cu_context;            /* CUcontext */
typedef struct cu_stream_st *cu_stream;          /* CUstream */
typedef unsigned long long cu_deviceptr;         /* CUdeviceptr */
typedef unsigned long long cu_mem_handle;        /* CUmemGenericAllocationHandle */

/* CUresult values */
#define CU_SUCCESS 0
#define CU_ERROR_INVALID_VALUE 1
#define CU_ERROR_OUT_OF_MEMORY 2
#define CU_ERROR_NOT_INITIALIZED 3
#define CU_ERROR_DEINITIALIZED 4
#define CU_ERROR_NOT_A_DRIVER 34 /* the toolkit's link-time libcuda.so answered */
#define CU_ERROR_NO_DEVICE 100
#define CU_ERROR_INVALID_DEVICE 101
#define CU_ERROR_INVALID_CONTEXT 201
#define CU_ERROR_MAP_FAILED 205
#define CU_ERROR_OPERATING_SYSTEM 304
#define CU_ERROR_INVALID_HANDLE 400
#define CU_ERROR_ILLEGAL_STATE 401
#define CU_ERROR_NOT_FOUND 500
#define CU_ERROR_ILLEGAL_ADDRESS 700
#define CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CU_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define CU_ERROR_NOT_PERMITTED 800
#define CU_ERROR_NOT_SUPPORTED 801

/* cuGetProcAddress: flags, and CUdriverProcAddressQueryResult */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1 /* a NULL stream is the legacy default stream */
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2

/* CUdevice_attribute */
#define CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING 41
#define CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97
#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103
#define CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED 110

/* CUmemAllocationType, CUmemAllocationHandleType, CUmemLocationType,
 * CUmemAccess_flags, CUmemAllocationGranularity_flags */
#define CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define CU_MEM_HANDLE_TYPE_NONE 0x0
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_ACCESS_FLAGS_PROT_NONE 0x0
#define CU_MEM_ACCESS_FLAGS_PROT_READ 0x1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#define CU_MEM_ALLOC_GRANULARITY_RECOMMENDED 0x1

#define CU_IPC_HANDLE_SIZE 64
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
#define CU_STREAM_DEFAULT 0x0
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define CU_MEMHOSTREGISTER_READ_ONLY 0x08

typedef struct { char bytes[16]; } cu_uuid;                              /* CUuuid */
typedef struct { char reserved[CU_IPC_HANDLE_SIZE]; } cu_ipc_mem_handle; /* CUipcMemHandle */

typedef struct {                                                 /* CUmemLocation */
	int type;
	int id;
} cu_mem_location;

typedef struct {                                                 /* CUmemAllocationProp */
	int type;
	int requested_handle_types;
	cu_mem_location location;
	void *win32_handle_meta_data;
	struct {
		unsigned char compression_type;
		unsigned char gpu_direct_rdma_capable;
		unsigned short usage;
		unsigned char reserved[4];
	} alloc_flags;
} cu_mem_allocation_prop;

typedef struct {                                                 /* CUmemAccessDesc */
	cu_mem_location location;
	int flags;
} cu_mem_access_desc;

_Static_assert(sizeof(cu_mem_allocation_prop) == 32, "CUmemAllocationProp is 32 bytes");
_Static_assert(sizeof(cu_mem_access_desc) == 12, "CUmemAccessDesc is 12 bytes");

/* ---------------------------------------------------------------- loader */

/* One entry point a user of the driver wants: its name (without version
 * suffix: cuGetProcAddress picks the ABI of CU_API_VERSION), where in the
 * user's table of function pointers it goes, and whether the user can do
 * without it (the pointer is then left NULL). */
struct kva__cu_entry {
	const char *name;
	size_t offset;
	int optional;
};

/*
 * kva__cu_load - fill @table (a struct of function pointers) with the @n
 * entry points @e names. dlopen("libcuda.so.1") happens once per process
 * and the library stays loaded. Return: 0, or -ENODEV with the reason in
 * @why (no libcuda, the toolkit's stub library, a driver older than CUDA
 * 12.0, a required entry point missing). Thread-safe.
 */
int kva__cu_load(const struct kva__cu_entry *e, size_t n, void *table, char *why, size_t len);

#endif /* KVA_CUDRV_PVT_H */
