/* SPDX-License-Identifier: MIT */
/*
 * abi_check.c - arena/cudrv_pvt.h, and the stand-in's entry points, held
 * to cuda.h at compile time. Built only where the toolkit's headers are
 * found; where it builds, it passes (it runs only to be a test).
 *
 * cudrv_pvt.h declares the driver by hand so that kvarena builds without
 * the toolkit; a value copied wrong there would pass every test against
 * the stand-in, which takes its values from the same header. This is the
 * one place the two are compared: every constant, every field's offset and
 * size, and every signature in cudastub_pvt.h against cuda.h's prototype
 * of the versioned name at 12.0 (cuMemGetInfo is cuda.h's macro for
 * cuMemGetInfo_v2, and so on).
 */
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

/*
 * cudrv_pvt.h #defines constants under cuda.h's own names, which would
 * turn cuda.h's enumerators into numbers: so cuda.h comes first, its
 * values are kept under names of their own (theirs_*), and then
 * cudrv_pvt.h's definitions are compared with them. A macro both headers
 * define differently is a redefinition warning, which -Werror fails.
 */
#define SHARED_NAMES(X) \
	X(CU_GET_PROC_ADDRESS_DEFAULT) \
	X(CU_GET_PROC_ADDRESS_LEGACY_STREAM) \
	X(CU_GET_PROC_ADDRESS_SUCCESS) \
	X(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND) \
	X(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) \
	X(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) \
	X(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) \
	X(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) \
	X(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) \
	X(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) \
	X(CU_MEM_ALLOCATION_TYPE_PINNED) \
	X(CU_MEM_HANDLE_TYPE_NONE) \
	X(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) \
	X(CU_MEM_LOCATION_TYPE_DEVICE) \
	X(CU_MEM_ACCESS_FLAGS_PROT_NONE) \
	X(CU_MEM_ACCESS_FLAGS_PROT_READ) \
	X(CU_MEM_ACCESS_FLAGS_PROT_READWRITE) \
	X(CU_MEM_ALLOC_GRANULARITY_MINIMUM) \
	X(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) \
	X(CU_IPC_HANDLE_SIZE) \
	X(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) \
	X(CU_STREAM_DEFAULT) \
	X(CU_STREAM_NON_BLOCKING) \
	X(CU_MEMHOSTREGISTER_PORTABLE) \
	X(CU_MEMHOSTREGISTER_DEVICEMAP) \
	X(CU_MEMHOSTREGISTER_READ_ONLY)

#define THEIRS(name) theirs_##name = name,
enum theirs { SHARED_NAMES(THEIRS) };
/* the stand-in's own copies of what cudrv_pvt.h does not carry */
_Static_assert(CU_MEMHOSTREGISTER_IOMEMORY == 0x04, "cudastub.c's HOST_REGISTER_IOMEMORY");
_Static_assert(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM == 0x2,
	       "cudastub.c's GET_PROC_PER_THREAD_STREAM");

#include "cudrv_pvt.h"

#define SAME(ours, theirs) _Static_assert((ours) == (theirs), #ours " is not cuda.h's " #theirs);
#define SAME_AS_THEIRS(name) \
	_Static_assert((name) == theirs_##name, #name " is not cuda.h's");
SHARED_NAMES(SAME_AS_THEIRS)

_Static_assert(CU_API_VERSION >= 12000, "entry points are asked for at 12.0 or later");
_Static_assert(CUDA_VERSION >= CU_API_VERSION, "cuda.h is older than the API asked for");

SAME(CU_SUCCESS, CUDA_SUCCESS)
SAME(CU_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE)
SAME(CU_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY)
SAME(CU_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED)
SAME(CU_ERROR_DEINITIALIZED, CUDA_ERROR_DEINITIALIZED)
SAME(CU_ERROR_NOT_A_DRIVER, CUDA_ERROR_STUB_LIBRARY)
SAME(CU_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE)
SAME(CU_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE)
SAME(CU_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT)
SAME(CU_ERROR_MAP_FAILED, CUDA_ERROR_MAP_FAILED)
SAME(CU_ERROR_OPERATING_SYSTEM, CUDA_ERROR_OPERATING_SYSTEM)
SAME(CU_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE)
SAME(CU_ERROR_ILLEGAL_STATE, CUDA_ERROR_ILLEGAL_STATE)
SAME(CU_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND)
SAME(CU_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_ILLEGAL_ADDRESS)
SAME(CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
SAME(CU_ERROR_HOST_MEMORY_NOT_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
SAME(CU_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_PERMITTED)
SAME(CU_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED)

/* ---------------------------------------------------------- the structs */

#define SAME_FIELD(ours, theirs, field, their_field) \
	_Static_assert(offsetof(ours, field) == offsetof(theirs, their_field) && \
		       sizeof(((ours *)0)->field) == sizeof(((theirs *)0)->their_field), \
		       #ours "." #field " is not " #theirs "." #their_field)

_Static_assert(sizeof(cu_result) == sizeof(CUresult), "CUresult");
_Static_assert(sizeof(cu_device) == sizeof(CUdevice), "CUdevice");
_Static_assert(sizeof(cu_context) == sizeof(CUcontext), "CUcontext");
_Static_assert(sizeof(cu_stream) == sizeof(CUstream), "CUstream");
_Static_assert(__builtin_types_compatible_p(cu_device, CUdevice), "CUdevice is an int");
_Static_assert(__builtin_types_compatible_p(cu_deviceptr, CUdeviceptr), "CUdeviceptr");
_Static_assert(__builtin_types_compatible_p(cu_mem_handle, CUmemGenericAllocationHandle),
	       "CUmemGenericAllocationHandle");

_Static_assert(sizeof(cu_mem_location) == sizeof(CUmemLocation), "CUmemLocation");
SAME_FIELD(cu_mem_location, CUmemLocation, type, type);
SAME_FIELD(cu_mem_location, CUmemLocation, id, id);

_Static_assert(sizeof(cu_mem_allocation_prop) == sizeof(CUmemAllocationProp),
	       "CUmemAllocationProp");
SAME_FIELD(cu_mem_allocation_prop, CUmemAllocationProp, type, type);
SAME_FIELD(cu_mem_allocation_prop, CUmemAllocationProp, requested_handle_types,
	   requestedHandleTypes);
SAME_FIELD(cu_mem_allocation_prop, CUmemAllocationProp, location, location);
SAME_FIELD(cu_mem_allocation_prop, CUmemAllocationProp, location.type, location.type);
SAME_FIELD(cu_mem_allocation_prop, CUmemAllocationProp, location.id, location.id);
SAME_FIELD(cu_mem_allocation_prop, CUmemAllocationProp, win32_handle_meta_data,
	   win32HandleMetaData);
SAME_FIELD(cu_mem_allocation_prop, CUmemAllocationProp, alloc_flags, allocFlags);
SAME_FIELD(cu_mem_allocation_prop, CUmemAllocationProp, alloc_flags.compression_type,
	   allocFlags.compressionType);
SAME_FIELD(cu_mem_allocation_prop, CUmemAllocationProp, alloc_flags.gpu_direct_rdma_capable,
	   allocFlags.gpuDirectRDMACapable);
SAME_FIELD(cu_mem_allocation_prop, CUmemAllocationProp, alloc_flags.usage, allocFlags.usage);
SAME_FIELD(cu_mem_allocation_prop, CUmemAllocationProp, alloc_flags.reserved,
	   allocFlags.reserved);

_Static_assert(sizeof(cu_mem_access_desc) == sizeof(CUmemAccessDesc), "CUmemAccessDesc");
SAME_FIELD(cu_mem_access_desc, CUmemAccessDesc, location, location);
SAME_FIELD(cu_mem_access_desc, CUmemAccessDesc, flags, flags);

_Static_assert(sizeof(cu_uuid) == sizeof(CUuuid), "CUuuid");
SAME_FIELD(cu_uuid, CUuuid, bytes, bytes);
_Static_assert(sizeof(cu_ipc_mem_handle) == sizeof(CUipcMemHandle), "CUipcMemHandle");
SAME_FIELD(cu_ipc_mem_handle, CUipcMemHandle, reserved, reserved);

/* --------------------------------------------------- the entry points */

/*
 * The enums the stand-in takes as int are passed as the int they are the
 * size of; cu_result is returned as the int CUresult is the size of.
 */
_Static_assert(sizeof(CUdevice_attribute) == sizeof(int), "CUdevice_attribute");
_Static_assert(sizeof(CUmemAllocationHandleType) == sizeof(int), "CUmemAllocationHandleType");
_Static_assert(sizeof(CUmemAllocationGranularity_flags) == sizeof(int),
	       "CUmemAllocationGranularity_flags");
_Static_assert(sizeof(CUfunction_attribute) == sizeof(int), "CUfunction_attribute");
_Static_assert(sizeof(CUdriverProcAddressQueryResult) == sizeof(int),
	       "CUdriverProcAddressQueryResult");
_Static_assert(sizeof(cuuint64_t) == sizeof(unsigned long long), "cuuint64_t");

/* cudastub_pvt.h's signatures, written over cuda.h's types */
#define DRV_RESULT CUresult
#define DRV_DEVICE CUdevice
#define DRV_DEVICE_ATTRIBUTE CUdevice_attribute
#define DRV_UUID CUuuid
#define DRV_CONTEXT CUcontext
#define DRV_STREAM CUstream
#define DRV_DEVICEPTR CUdeviceptr
#define DRV_MEM_HANDLE CUmemGenericAllocationHandle
#define DRV_ALLOCATION_PROP CUmemAllocationProp
#define DRV_HANDLE_TYPE CUmemAllocationHandleType
#define DRV_GRANULARITY_OPTION CUmemAllocationGranularity_flags
#define DRV_ACCESS_DESC CUmemAccessDesc
#define DRV_IPC_HANDLE CUipcMemHandle
#define DRV_MODULE CUmodule
#define DRV_FUNCTION CUfunction
#define DRV_FUNC_ATTRIBUTE CUfunction_attribute
#define DRV_PROC_FLAGS cuuint64_t
#define DRV_PROC_STATUS CUdriverProcAddressQueryResult
#include "cudastub_pvt.h"

/* @name is cuda.h's macro for the versioned name where there is one */
#define SAME_SIGNATURE(name, params) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(&name), CUresult (*)params), \
		       #name ": the stand-in's signature is not cuda.h's");
CUDASTUB_ENTRY_POINTS(SAME_SIGNATURE)

/* cuda.h declares only the _v2 of cuGetProcAddress (its macro renames the
 * first); the first differs by the missing status */
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuGetProcAddress_v2),
					    CUresult (*)CUDASTUB_GET_PROC_V2_PARAMS),
	       "cuGetProcAddress_v2");

/* all the rest is done: what no constant expression can compare */
int main(void)
{
	/* cudastub.c's STREAM_LEGACY and STREAM_PER_THREAD */
	return (uintptr_t)CU_STREAM_LEGACY != 0x1 || (uintptr_t)CU_STREAM_PER_THREAD != 0x2;
}
