/* SPDX-License-Identifier: MIT */
/*
 * cudastub_pvt.h - every entry point the CUDA driver stand-in (cudastub.c)
 * serves through cuGetProcAddress, with its CUDA 12.0 signature (the
 * versioned names of cuda.h: cuMemGetInfo_v2, cuIpcOpenMemHandle_v2, ...),
 * written once.
 *
 * The signatures are written over DRV_* type names that the includer may
 * define first. cudastub.c and its test leave them to the defaults below,
 * arena/cudrv_pvt.h's types, so the compiler holds the stand-in's
 * definitions to this list; abi_check.c defines them as cuda.h's types and
 * holds cuda.h's prototypes to the same list. Between the two, the
 * stand-in serves exactly the ABI a real driver hands out at 12.0.
 *
 * E(name, parameters): name is the base name cuGetProcAddress is asked
 * for, parameters a parenthesised parameter list.
 */
#ifndef KVA_CUDASTUB_PVT_H
#define KVA_CUDASTUB_PVT_H

#ifndef DRV_DEVICE
#include "cudrv_pvt.h"
#define DRV_RESULT cu_result
#define DRV_DEVICE cu_device
#define DRV_DEVICE_ATTRIBUTE int
#define DRV_UUID cu_uuid
#define DRV_CONTEXT cu_context
#define DRV_STREAM cu_stream
#define DRV_DEVICEPTR cu_deviceptr
#define DRV_MEM_HANDLE cu_mem_handle
#define DRV_ALLOCATION_PROP cu_mem_allocation_prop
#define DRV_HANDLE_TYPE int
#define DRV_GRANULARITY_OPTION int
#define DRV_ACCESS_DESC cu_mem_access_desc
#define DRV_IPC_HANDLE cu_ipc_mem_handle
#define DRV_MODULE void *
#define DRV_FUNCTION void *
#define DRV_FUNC_ATTRIBUTE int
#define DRV_PROC_FLAGS unsigned long long
#define DRV_PROC_STATUS int
#endif

#define CUDASTUB_ENTRY_POINTS(E) \
	E(cuInit, (unsigned int flags)) \
	E(cuDriverGetVersion, (int *version)) \
	E(cuDeviceGetCount, (int *count)) \
	E(cuDeviceGet, (DRV_DEVICE *dev, int ordinal)) \
	E(cuDeviceGetName, (char *name, int len, DRV_DEVICE dev)) \
	E(cuDeviceGetUuid, (DRV_UUID *uuid, DRV_DEVICE dev)) \
	E(cuDeviceTotalMem, (size_t *bytes, DRV_DEVICE dev)) \
	E(cuDeviceGetAttribute, (int *value, DRV_DEVICE_ATTRIBUTE attr, DRV_DEVICE dev)) \
	E(cuDeviceGetPCIBusId, (char *bus_id, int len, DRV_DEVICE dev)) \
	E(cuGetErrorString, (DRV_RESULT error, const char **str)) \
	E(cuGetErrorName, (DRV_RESULT error, const char **str)) \
	E(cuDevicePrimaryCtxRetain, (DRV_CONTEXT *ctx, DRV_DEVICE dev)) \
	E(cuDevicePrimaryCtxRelease, (DRV_DEVICE dev)) \
	E(cuCtxGetCurrent, (DRV_CONTEXT *ctx)) \
	E(cuCtxSetCurrent, (DRV_CONTEXT ctx)) \
	E(cuCtxPushCurrent, (DRV_CONTEXT ctx)) \
	E(cuCtxPopCurrent, (DRV_CONTEXT *ctx)) \
	E(cuCtxGetDevice, (DRV_DEVICE *dev)) \
	E(cuCtxSynchronize, (void)) \
	E(cuCtxGetId, (DRV_CONTEXT ctx, unsigned long long *id)) \
	E(cuMemGetInfo, (size_t *free_bytes, size_t *total_bytes)) \
	E(cuMemGetAllocationGranularity, (size_t *granularity, const DRV_ALLOCATION_PROP *prop, \
					  DRV_GRANULARITY_OPTION option)) \
	E(cuMemCreate, (DRV_MEM_HANDLE *handle, size_t size, const DRV_ALLOCATION_PROP *prop, \
			unsigned long long flags)) \
	E(cuMemRelease, (DRV_MEM_HANDLE handle)) \
	E(cuMemExportToShareableHandle, (void *shareable, DRV_MEM_HANDLE handle, \
					 DRV_HANDLE_TYPE type, unsigned long long flags)) \
	E(cuMemImportFromShareableHandle, (DRV_MEM_HANDLE *handle, void *os_handle, \
					   DRV_HANDLE_TYPE type)) \
	E(cuMemAddressReserve, (DRV_DEVICEPTR *ptr, size_t size, size_t alignment, \
				DRV_DEVICEPTR addr, unsigned long long flags)) \
	E(cuMemAddressFree, (DRV_DEVICEPTR ptr, size_t size)) \
	E(cuMemMap, (DRV_DEVICEPTR ptr, size_t size, size_t offset, DRV_MEM_HANDLE handle, \
		     unsigned long long flags)) \
	E(cuMemUnmap, (DRV_DEVICEPTR ptr, size_t size)) \
	E(cuMemSetAccess, (DRV_DEVICEPTR ptr, size_t size, const DRV_ACCESS_DESC *desc, \
			   size_t count)) \
	E(cuMemAlloc, (DRV_DEVICEPTR *ptr, size_t size)) \
	E(cuMemFree, (DRV_DEVICEPTR ptr)) \
	E(cuIpcGetMemHandle, (DRV_IPC_HANDLE *handle, DRV_DEVICEPTR ptr)) \
	E(cuIpcOpenMemHandle, (DRV_DEVICEPTR *ptr, DRV_IPC_HANDLE handle, unsigned int flags)) \
	E(cuIpcCloseMemHandle, (DRV_DEVICEPTR ptr)) \
	E(cuMemcpyHtoD, (DRV_DEVICEPTR dst, const void *src, size_t bytes)) \
	E(cuMemcpyDtoH, (void *dst, DRV_DEVICEPTR src, size_t bytes)) \
	E(cuMemcpyDtoD, (DRV_DEVICEPTR dst, DRV_DEVICEPTR src, size_t bytes)) \
	E(cuMemcpyHtoDAsync, (DRV_DEVICEPTR dst, const void *src, size_t bytes, \
			      DRV_STREAM stream)) \
	E(cuMemcpyDtoHAsync, (void *dst, DRV_DEVICEPTR src, size_t bytes, DRV_STREAM stream)) \
	E(cuMemcpyDtoDAsync, (DRV_DEVICEPTR dst, DRV_DEVICEPTR src, size_t bytes, \
			      DRV_STREAM stream)) \
	E(cuMemsetD8, (DRV_DEVICEPTR dst, unsigned char value, size_t count)) \
	E(cuMemsetD32, (DRV_DEVICEPTR dst, unsigned int value, size_t count)) \
	E(cuMemsetD32Async, (DRV_DEVICEPTR dst, unsigned int value, size_t count, \
			     DRV_STREAM stream)) \
	E(cuStreamCreate, (DRV_STREAM *stream, unsigned int flags)) \
	E(cuStreamDestroy, (DRV_STREAM stream)) \
	E(cuStreamSynchronize, (DRV_STREAM stream)) \
	E(cuMemHostRegister, (void *p, size_t bytes, unsigned int flags)) \
	E(cuMemHostUnregister, (void *p)) \
	E(cuModuleLoadData, (DRV_MODULE *module, const void *image)) \
	E(cuModuleGetFunction, (DRV_FUNCTION *fn, DRV_MODULE module, const char *name)) \
	E(cuFuncGetAttribute, (int *value, DRV_FUNC_ATTRIBUTE attr, DRV_FUNCTION fn)) \
	E(cuFuncSetAttribute, (DRV_FUNCTION fn, DRV_FUNC_ATTRIBUTE attr, int value)) \
	E(cuLaunchKernel, (DRV_FUNCTION fn, unsigned int grid_x, unsigned int grid_y, \
			   unsigned int grid_z, unsigned int block_x, unsigned int block_y, \
			   unsigned int block_z, unsigned int shared_bytes, DRV_STREAM stream, \
			   void **params, void **extra)) \
	E(cuMemAllocAsync, (DRV_DEVICEPTR *ptr, size_t size, DRV_STREAM stream)) \
	E(cuMemFreeAsync, (DRV_DEVICEPTR ptr, DRV_STREAM stream))

/* the two entry points the library exports by name: the first
 * cuGetProcAddress (CUDA 11.3) and its _v2 (12.0), which says why a symbol
 * was not found in @status (CUdriverProcAddressQueryResult) */
#define CUDASTUB_GET_PROC_V1_PARAMS \
	(const char *symbol, void **pfn, int version, DRV_PROC_FLAGS flags)
#define CUDASTUB_GET_PROC_V2_PARAMS \
	(const char *symbol, void **pfn, int version, DRV_PROC_FLAGS flags, DRV_PROC_STATUS *status)

#endif /* KVA_CUDASTUB_PVT_H */
