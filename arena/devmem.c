/* SPDX-License-Identifier: MIT */
/*
 * devmem.c - a GPU data region: made by the agent with the CUDA VMM API and
 * exported, imported and mapped by workers (devmem_pvt.h says how). The
 * driver is found at run time (cudrv.c); no binary links libcuda.
 *
 * THIS CODE HAS RUN ONLY AGAINST THE PROJECT'S DRIVER STAND-IN
 * (tests/cudastub/), never on a GPU: the stand-in enforces the driver API's
 * documented contract (granularity, handle types, access before use, unmap
 * before address free, contexts, nothing left at exit), but it is not the
 * driver. tests/test_gpu_arena.c runs the same checks on a real device
 * wherever one is present.
 *
 * The steps follow PyTorch's expandable segments and NCCL's cuMem path:
 *   creator   cuMemGetAllocationGranularity (recommended), cuMemAddressReserve
 *             of the whole range, then per chunk cuMemCreate (POSIX fd handle
 *             type, GPUDirect RDMA where the device has it), cuMemMap,
 *             cuMemExportToShareableHandle, cuMemRelease (the mapping and
 *             the fd keep the memory); one cuMemSetAccess over the range;
 *             cuMemsetD8 to zero it
 *   importer  the device by UUID, cuMemAddressReserve, per chunk
 *             cuMemImportFromShareableHandle, cuMemMap, cuMemRelease; one
 *             cuMemSetAccess for this process's device
 *   close     cuMemUnmap per chunk (a mapping is unmapped whole), then
 *             cuMemAddressFree of the range, then the primary context
 *             released
 * Legacy IPC instead: one cuMemAlloc, cuIpcGetMemHandle; importers
 * cuIpcOpenMemHandle, and cuIpcCloseMemHandle at close.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "arena_pvt.h"
#include "cudrv_pvt.h"
#include "devmem_pvt.h"

#define DEFAULT_CHUNK (512ull << 20)

/* ------------------------------------------------------------ the driver */

static struct driver {
	cu_result (*init)(unsigned int flags);
	cu_result (*device_get_count)(int *count);
	cu_result (*device_get)(cu_device *dev, int ordinal);
	cu_result (*device_get_name)(char *name, int len, cu_device dev);
	cu_result (*device_get_uuid)(cu_uuid *uuid, cu_device dev);
	cu_result (*device_total_mem)(size_t *bytes, cu_device dev);
	cu_result (*device_get_attribute)(int *value, int attr, cu_device dev);
	cu_result (*primary_ctx_retain)(cu_context *ctx, cu_device dev);
	cu_result (*primary_ctx_release)(cu_device dev);
	cu_result (*ctx_push_current)(cu_context ctx);
	cu_result (*ctx_pop_current)(cu_context *ctx);
	cu_result (*ctx_synchronize)(void);
	cu_result (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
	cu_result (*mem_get_allocation_granularity)(size_t *g, const cu_mem_allocation_prop *prop,
						    int option);
	cu_result (*mem_create)(cu_mem_handle *h, size_t size, const cu_mem_allocation_prop *prop,
				unsigned long long flags);
	cu_result (*mem_release)(cu_mem_handle h);
	cu_result (*mem_export)(void *shareable, cu_mem_handle h, int type,
				unsigned long long flags);
	cu_result (*mem_import)(cu_mem_handle *h, void *os_handle, int type);
	cu_result (*mem_address_reserve)(cu_deviceptr *ptr, size_t size, size_t alignment,
					 cu_deviceptr addr, unsigned long long flags);
	cu_result (*mem_address_free)(cu_deviceptr ptr, size_t size);
	cu_result (*mem_map)(cu_deviceptr ptr, size_t size, size_t offset, cu_mem_handle h,
			     unsigned long long flags);
	cu_result (*mem_unmap)(cu_deviceptr ptr, size_t size);
	cu_result (*mem_set_access)(cu_deviceptr ptr, size_t size, const cu_mem_access_desc *desc,
				    size_t count);
	cu_result (*mem_alloc)(cu_deviceptr *ptr, size_t bytes);
	cu_result (*mem_free)(cu_deviceptr ptr);
	cu_result (*ipc_get_mem_handle)(cu_ipc_mem_handle *h, cu_deviceptr ptr);
	cu_result (*ipc_open_mem_handle)(cu_deviceptr *ptr, cu_ipc_mem_handle h, unsigned int flags);
	cu_result (*ipc_close_mem_handle)(cu_deviceptr ptr);
	cu_result (*memcpy_htod)(cu_deviceptr dst, const void *src, size_t bytes);
	cu_result (*memcpy_dtoh)(void *dst, cu_deviceptr src, size_t bytes);
	cu_result (*memcpy_htod_async)(cu_deviceptr dst, const void *src, size_t bytes,
				       cu_stream s);
	cu_result (*memcpy_dtoh_async)(void *dst, cu_deviceptr src, size_t bytes, cu_stream s);
	cu_result (*memcpy_dtod_async)(cu_deviceptr dst, cu_deviceptr src, size_t bytes,
				       cu_stream s);
	cu_result (*memset_d8)(cu_deviceptr dst, unsigned char value, size_t n);
	cu_result (*stream_create)(cu_stream *s, unsigned int flags);
	cu_result (*stream_destroy)(cu_stream s);
	cu_result (*stream_synchronize)(cu_stream s);
	cu_result (*mem_host_register)(void *p, size_t bytes, unsigned int flags);
	cu_result (*mem_host_unregister)(void *p);
	cu_result (*get_error_string)(cu_result r, const char **s);
	cu_result (*get_error_name)(cu_result r, const char **s);
} drv;

static const struct kva__cu_entry entries[] = {
#define E(name, field) { name, offsetof(struct driver, field), 0 }
	E("cuInit", init),
	E("cuDeviceGetCount", device_get_count),
	E("cuDeviceGet", device_get),
	E("cuDeviceGetName", device_get_name),
	E("cuDeviceGetUuid", device_get_uuid),
	E("cuDeviceTotalMem", device_total_mem),
	E("cuDeviceGetAttribute", device_get_attribute),
	E("cuDevicePrimaryCtxRetain", primary_ctx_retain),
	E("cuDevicePrimaryCtxRelease", primary_ctx_release),
	E("cuCtxPushCurrent", ctx_push_current),
	E("cuCtxPopCurrent", ctx_pop_current),
	E("cuCtxSynchronize", ctx_synchronize),
	E("cuMemGetInfo", mem_get_info),
	E("cuMemGetAllocationGranularity", mem_get_allocation_granularity),
	E("cuMemCreate", mem_create),
	E("cuMemRelease", mem_release),
	E("cuMemExportToShareableHandle", mem_export),
	E("cuMemImportFromShareableHandle", mem_import),
	E("cuMemAddressReserve", mem_address_reserve),
	E("cuMemAddressFree", mem_address_free),
	E("cuMemMap", mem_map),
	E("cuMemUnmap", mem_unmap),
	E("cuMemSetAccess", mem_set_access),
	E("cuMemAlloc", mem_alloc),
	E("cuMemFree", mem_free),
	E("cuIpcGetMemHandle", ipc_get_mem_handle),
	E("cuIpcOpenMemHandle", ipc_open_mem_handle),
	E("cuIpcCloseMemHandle", ipc_close_mem_handle),
	E("cuMemcpyHtoD", memcpy_htod),
	E("cuMemcpyDtoH", memcpy_dtoh),
	E("cuMemcpyHtoDAsync", memcpy_htod_async),
	E("cuMemcpyDtoHAsync", memcpy_dtoh_async),
	E("cuMemcpyDtoDAsync", memcpy_dtod_async),
	E("cuMemsetD8", memset_d8),
	E("cuStreamCreate", stream_create),
	E("cuStreamDestroy", stream_destroy),
	E("cuStreamSynchronize", stream_synchronize),
	E("cuMemHostRegister", mem_host_register),
	E("cuMemHostUnregister", mem_host_unregister),
	E("cuGetErrorString", get_error_string),
	E("cuGetErrorName", get_error_name),
#undef E
};

/* written once under drv_once, read-only after: the once publishes them */
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static int drv_status;
static char drv_why[224];

static void load_driver(void)
{
	char why[200];
	cu_result r;

	if (kva__cu_load(entries, sizeof(entries) / sizeof(entries[0]), &drv, why,
			 sizeof(why)) < 0) {
		drv_status = -ENODEV;
		snprintf(drv_why, sizeof(drv_why), "%s", why);
		return;
	}
	if ((r = drv.init(0)) != CU_SUCCESS) {
		const char *s = NULL;

		drv.get_error_string(r, &s);
		drv_status = -ENODEV;
		snprintf(drv_why, sizeof(drv_why), "cuInit: %s (CUresult %d)",
			 s ? s : "unknown error", r);
	}
}

static int driver(void)
{
	pthread_once(&drv_once, load_driver);
	return drv_status ? kva__err(drv_status, "cuda: %s", drv_why) : 0;
}

/* a driver failure as an errno, and the sentence that names the call */
static int cu_fail(cu_result r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int cu_fail(cu_result r, const char *fmt, ...)
{
	const char *name = NULL, *str = NULL;
	char what[160];
	va_list ap;
	int err;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	drv.get_error_name(r, &name);
	drv.get_error_string(r, &str);
	switch (r) {
	case CU_ERROR_OUT_OF_MEMORY:
		err = -ENOMEM;
		break;
	case CU_ERROR_NOT_SUPPORTED:
		err = -ENOTSUP;
		break;
	case CU_ERROR_NO_DEVICE:
	case CU_ERROR_INVALID_DEVICE:
		err = -ENODEV;
		break;
	case CU_ERROR_NOT_PERMITTED:
		err = -EPERM;
		break;
	default:
		err = -EIO;
	}
	return kva__err(err, "cuda: %s: %s (%s, CUresult %d)", what, str ? str : "unknown error",
			name ? name : "?", r);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* ------------------------------------------------------------ a region */

struct kva__dev {
	struct kva__dev_geom g;
	cu_device dev;
	int ordinal;              /* the device as this process sees it */
	cu_context ctx;           /* its primary context, retained once here */
	bool retained;
	bool creator;             /* made it (else imported it) */
	bool reserved;            /* KVA_IPC_FD: the range [base, base + map_bytes) */
	cu_deviceptr base;        /* the range, or the legacy allocation / IPC mapping */
	uint32_t mapped;          /* chunks mapped so far, from 0 */
	bool access;              /* cuMemSetAccess done: the region is usable */
	int *fds;                 /* creator, KVA_IPC_FD: the exported fds, -1 if none */
	cu_ipc_mem_handle ipc;    /* creator, KVA_IPC_LEGACY */
	struct kva__dev_times t;
};

void kva__dev_uuid_str(const uint8_t u[16], char out[48])
{
	snprintf(out, 48, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
		 u[13], u[14], u[15]);
}

/* the device's primary context current for the call, and no longer after */
static int enter(struct kva__dev *d)
{
	cu_result r = drv.ctx_push_current(d->ctx);

	return r == CU_SUCCESS ? 0 : cu_fail(r, "cuCtxPushCurrent");
}

static void leave(void)
{
	cu_context popped;

	drv.ctx_pop_current(&popped);
}

static const char *visible_devices(void)
{
	const char *v = getenv("CUDA_VISIBLE_DEVICES");

	return v ? v : "(unset)";
}

/*
 * The device @spec names: an ordinal, or "GPU-..." matched against each
 * visible device's UUID (a unique prefix will do, as CUDA_VISIBLE_DEVICES
 * takes it).
 */
static int find_device(const char *spec, cu_device *dev, int *ordinal)
{
	int count = 0, found = -1;
	cu_result r;

	if ((r = drv.device_get_count(&count)) != CU_SUCCESS)
		return cu_fail(r, "cuDeviceGetCount");
	if (!spec || !*spec)
		spec = "0";
	if (!strncasecmp(spec, "GPU-", 4)) {
		for (int i = 0; i < count; i++) {
			cu_device dv;
			cu_uuid u;
			char s[48];

			if (drv.device_get(&dv, i) != CU_SUCCESS ||
			    drv.device_get_uuid(&u, dv) != CU_SUCCESS)
				continue;
			kva__dev_uuid_str((const uint8_t *)u.bytes, s);
			if (strncasecmp(s, spec, strlen(spec)))
				continue;
			if (found >= 0)
				return kva__err(-EINVAL, "cuda: %s names more than one device: give "
						"more of the UUID", spec);
			found = i;
		}
		if (found < 0)
			return kva__err(-ENODEV, "cuda: no visible device has the UUID %s (%d "
					"devices visible; CUDA_VISIBLE_DEVICES=%s)", spec, count,
					visible_devices());
	} else {
		char *end;
		long v = strtol(spec, &end, 10);

		if (*end || end == spec || v < 0)
			return kva__err(-EINVAL, "cuda: device \"%s\" is neither an ordinal nor a "
					"UUID (GPU-...)", spec);
		if (v >= count)
			return kva__err(-ENODEV, "cuda: no device %ld: %d visible "
					"(CUDA_VISIBLE_DEVICES=%s)", v, count, visible_devices());
		found = (int)v;
	}
	if ((r = drv.device_get(dev, found)) != CU_SUCCESS)
		return cu_fail(r, "cuDeviceGet(%d)", found);
	*ordinal = found;
	return 0;
}

/* the device's UUID among those visible */
static int find_uuid(const uint8_t uuid[16], cu_device *dev, int *ordinal)
{
	int count = 0;
	cu_result r;
	char s[48];

	if ((r = drv.device_get_count(&count)) != CU_SUCCESS)
		return cu_fail(r, "cuDeviceGetCount");
	for (int i = 0; i < count; i++) {
		cu_uuid u;

		if (drv.device_get(dev, i) == CU_SUCCESS &&
		    drv.device_get_uuid(&u, *dev) == CU_SUCCESS && !memcmp(u.bytes, uuid, 16)) {
			*ordinal = i;
			return 0;
		}
	}
	kva__dev_uuid_str(uuid, s);
	return kva__err(-ENODEV, "cuda: the arena's device %s is not visible to this process "
			"(%d devices visible; CUDA_VISIBLE_DEVICES=%s)", s, count,
			visible_devices());
}

static int retain(struct kva__dev *d)
{
	cu_result r = drv.primary_ctx_retain(&d->ctx, d->dev);

	if (r != CU_SUCCESS)
		return cu_fail(r, "cuDevicePrimaryCtxRetain(device %d)", d->ordinal);
	d->retained = true;
	return 0;
}

static int attribute(struct kva__dev *d, int attr)
{
	int v = 0;

	return drv.device_get_attribute(&v, attr, d->dev) == CU_SUCCESS ? v : 0;
}

static cu_mem_allocation_prop chunk_prop(const struct kva__dev *d, bool rdma)
{
	cu_mem_allocation_prop p;

	memset(&p, 0, sizeof(p));
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.requested_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = d->ordinal;
	/* a NIC may then read and write the blocks directly (NIXL, UCX) */
	p.alloc_flags.gpu_direct_rdma_capable = rdma;
	return p;
}

static int granularity(struct kva__dev *d, uint64_t *g)
{
	cu_mem_allocation_prop p = chunk_prop(d, false);
	size_t v = 0;
	cu_result r = drv.mem_get_allocation_granularity(&v, &p,
							  CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);

	if (r != CU_SUCCESS)
		return cu_fail(r, "cuMemGetAllocationGranularity");
	if (!v || (v & (v - 1)))
		return kva__err(-EIO, "cuda: the driver's granularity %zu is not a power of two", v);
	*g = v;
	return 0;
}

/*
 * Undo whatever is done, in the reverse order: unmap each chunk (a mapping
 * goes whole), free the range (only once nothing is mapped in it), free or
 * close the legacy memory, close the exported fds, pop, release the
 * context. The failure paths and kva__dev_close both end here.
 */
static void teardown(struct kva__dev *d)
{
	bool in = d->retained && enter(d) == 0;

	kva__err_hold(true);
	if (in) {
		if (d->g.ipc == KVA_IPC_FD) {
			while (d->mapped) {
				uint32_t i = --d->mapped;

				drv.mem_unmap(d->base + (uint64_t)i * d->g.chunk_bytes,
					      kva__dev_chunk_size(&d->g, i));
			}
			if (d->reserved)
				drv.mem_address_free(d->base, d->g.map_bytes);
		} else if (d->base) {
			if (d->creator)
				drv.mem_free(d->base);
			else
				drv.ipc_close_mem_handle(d->base);
		}
		leave();
	}
	if (d->fds)
		for (uint32_t i = 0; i < d->g.chunks; i++)
			if (d->fds[i] >= 0)
				close(d->fds[i]);
	free(d->fds);
	if (d->retained)
		drv.primary_ctx_release(d->dev);
	kva__err_hold(false);
	free(d);
}

void kva__dev_close(struct kva__dev *d)
{
	if (d)
		teardown(d);
}

/* ------------------------------------------------------------ creator */

/* the region's geometry for @data_bytes: chunks of the granularity */
static int plan_chunks(struct kva__dev *d, const struct kva_cuda_opts *o, uint64_t data_bytes)
{
	struct kva__dev_geom *g = &d->g;
	uint64_t chunk;

	g->map_bytes = round_up(data_bytes, g->granularity);
	chunk = o->chunk_bytes ? round_up(o->chunk_bytes, g->granularity)
			       : round_up(DEFAULT_CHUNK, g->granularity);
	if ((g->map_bytes + chunk - 1) / chunk > KVA_MAX_CHUNKS) {
		if (o->chunk_bytes)
			return kva__err(-EINVAL, "cuda: chunks of %llu bytes make %llu of them for "
					"%llu bytes, above %u: larger chunks",
					(unsigned long long)chunk,
					(unsigned long long)((g->map_bytes + chunk - 1) / chunk),
					(unsigned long long)g->map_bytes, KVA_MAX_CHUNKS);
		chunk = round_up((g->map_bytes + KVA_MAX_CHUNKS - 1) / KVA_MAX_CHUNKS,
				 g->granularity);
	}
	if (chunk > g->map_bytes)
		chunk = g->map_bytes;
	g->chunk_bytes = chunk;
	g->chunks = (uint32_t)((g->map_bytes + chunk - 1) / chunk);
	return 0;
}

/* KVA_IPC_FD: the range, each chunk made, mapped, exported; access; zeroed */
static int create_fd(struct kva__dev *d, bool rdma)
{
	cu_mem_allocation_prop prop = chunk_prop(d, rdma);
	cu_mem_access_desc acc = { { CU_MEM_LOCATION_TYPE_DEVICE, d->ordinal },
				   CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	struct kva__dev_geom *g = &d->g;
	cu_result r;

	d->fds = malloc(sizeof(int) * g->chunks);
	if (!d->fds)
		return kva__err(-ENOMEM, "cuda: out of memory");
	for (uint32_t i = 0; i < g->chunks; i++)
		d->fds[i] = -1;
	r = drv.mem_address_reserve(&d->base, g->map_bytes, g->granularity, 0, 0);
	if (r != CU_SUCCESS)
		return cu_fail(r, "cuMemAddressReserve of %llu bytes",
			       (unsigned long long)g->map_bytes);
	d->reserved = true;
	for (uint32_t i = 0; i < g->chunks; i++) {
		uint64_t size = kva__dev_chunk_size(g, i);
		cu_deviceptr at = d->base + (uint64_t)i * g->chunk_bytes;
		cu_mem_handle h;
		int fd = -1;

		if ((r = drv.mem_create(&h, size, &prop, 0)) != CU_SUCCESS)
			return cu_fail(r, "cuMemCreate of chunk %u of %u (%llu MiB)", i, g->chunks,
				       (unsigned long long)(size >> 20));
		if ((r = drv.mem_map(at, size, 0, h, 0)) != CU_SUCCESS) {
			drv.mem_release(h);
			return cu_fail(r, "cuMemMap of chunk %u of %u", i, g->chunks);
		}
		d->mapped = i + 1;
		r = drv.mem_export(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
		/* mapped and (if it worked) exported: both keep the memory,
		 * which the handle no longer needs to */
		drv.mem_release(h);
		if (r != CU_SUCCESS)
			return cu_fail(r, "cuMemExportToShareableHandle of chunk %u as a POSIX fd",
				       i);
		d->fds[i] = fd;
	}
	if ((r = drv.mem_set_access(d->base, g->map_bytes, &acc, 1)) != CU_SUCCESS)
		return cu_fail(r, "cuMemSetAccess of %llu bytes", (unsigned long long)g->map_bytes);
	d->access = true;
	return 0;
}

/* KVA_IPC_LEGACY: one allocation and its IPC handle */
static int create_legacy(struct kva__dev *d)
{
	cu_result r = drv.mem_alloc(&d->base, d->g.map_bytes);

	if (r != CU_SUCCESS) {
		d->base = 0;
		return cu_fail(r, "cuMemAlloc of %llu bytes", (unsigned long long)d->g.map_bytes);
	}
	if ((r = drv.ipc_get_mem_handle(&d->ipc, d->base)) != CU_SUCCESS)
		return cu_fail(r, "cuIpcGetMemHandle");
	d->access = true;
	return 0;
}

/* the region zeroed, as a fresh memfd is: no block shows another's bytes */
static int zero(struct kva__dev *d)
{
	cu_result r = drv.memset_d8(d->base, 0, d->g.map_bytes);

	/* a memset of device memory returns before it is done */
	if (r == CU_SUCCESS)
		r = drv.ctx_synchronize();
	return r == CU_SUCCESS ? 0 : cu_fail(r, "cuMemsetD8 of the region");
}

/* a fresh region for @o; *@out unset on failure */
static int create(const struct kva_cuda_opts *o, uint64_t data_bytes, enum kva_cuda_ipc ipc,
		  struct kva__dev **out)
{
	struct kva__dev *d = calloc(1, sizeof(*d));
	size_t free_b = 0, total_b = 0;
	cu_uuid u;
	bool vmm, posix_fd, rdma;
	cu_result r;
	int ret;

	if (!d)
		return kva__err(-ENOMEM, "cuda: out of memory");
	d->creator = true;
	if ((ret = find_device(o->device, &d->dev, &d->ordinal)) < 0 || (ret = retain(d)) < 0)
		goto fail;
	drv.device_get_name(d->g.name, sizeof(d->g.name) - 1, d->dev);
	if ((r = drv.device_get_uuid(&u, d->dev)) != CU_SUCCESS) {
		ret = cu_fail(r, "cuDeviceGetUuid");
		goto fail;
	}
	memcpy(d->g.uuid, u.bytes, 16);
	vmm = attribute(d, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
	posix_fd = vmm && attribute(d, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
	rdma = vmm && attribute(d, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED);
	if (ipc == KVA_IPC_AUTO)
		ipc = posix_fd ? KVA_IPC_FD : KVA_IPC_LEGACY;
	if (ipc == KVA_IPC_FD && !posix_fd) {
		ret = kva__err(-ENOTSUP, "cuda: %s cannot share VMM memory as POSIX fds (%s): "
			       "legacy CUDA IPC instead (--ipc legacy)", d->g.name,
			       vmm ? "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0"
				   : "no virtual memory management");
		goto fail;
	}
	d->g.ipc = ipc;
	if ((ret = enter(d)) < 0)
		goto fail;
	if (vmm && (ret = granularity(d, &d->g.granularity)) < 0)
		goto fail_in;
	if ((r = drv.mem_get_info(&free_b, &total_b)) != CU_SUCCESS) {
		ret = cu_fail(r, "cuMemGetInfo");
		goto fail_in;
	}
	d->g.total_bytes = total_b;
	if (ipc == KVA_IPC_FD) {
		if ((ret = plan_chunks(d, o, data_bytes)) < 0)
			goto fail_in;
	} else {
		d->g.map_bytes = d->g.chunk_bytes = data_bytes;
		d->g.chunks = 1;
	}
	if (d->g.map_bytes > free_b) {
		ret = kva__err(-ENOMEM, "cuda: the arena needs %.2f GiB of device memory, %s has "
			       "%.2f GiB free of %.2f GiB", (double)d->g.map_bytes / (1ull << 30),
			       d->g.name, (double)free_b / (1ull << 30),
			       (double)total_b / (1ull << 30));
		goto fail_in;
	}
	ret = ipc == KVA_IPC_FD ? create_fd(d, rdma) : create_legacy(d);
	if (ret == 0)
		ret = zero(d);
	if (ret < 0)
		goto fail_in;
	leave();
	*out = d;
	return 0;
fail_in:
	leave();
fail:
	teardown(d);
	return ret;
}

int kva__dev_create(const struct kva_cuda_opts *o, uint64_t data_bytes, struct kva__dev_geom *g,
		    struct kva__dev **out)
{
	struct kva__dev *d = NULL;
	int ret;

	if (!o || !g || !out || !data_bytes)
		return kva__err(-EINVAL, "cuda: bad argument");
	if ((unsigned)o->ipc > KVA_IPC_LEGACY)
		return kva__err(-EINVAL, "cuda: unknown ipc %d", (int)o->ipc);
	if ((ret = driver()) < 0)
		return ret;
	ret = create(o, data_bytes, o->ipc, &d);
	if (ret == -ENOTSUP && o->ipc == KVA_IPC_AUTO) {
		/* the device said it could, then the export said it cannot (a
		 * container without the right to, an old driver): the legacy way */
		char first[256];

		snprintf(first, sizeof(first), "%s", kva_errmsg());
		ret = create(o, data_bytes, KVA_IPC_LEGACY, &d);
		if (ret < 0) {
			char second[256];

			snprintf(second, sizeof(second), "%s", kva_errmsg());
			kva__err(ret, "%s; and legacy IPC: %s", first, second);
		}
	}
	if (ret < 0)
		return ret;
	*g = d->g;
	*out = d;
	return 0;
}

const int *kva__dev_fds(const struct kva__dev *d)
{
	return d && d->g.ipc == KVA_IPC_FD ? d->fds : NULL;
}

const void *kva__dev_ipc_handle(const struct kva__dev *d)
{
	return d && d->g.ipc == KVA_IPC_LEGACY ? &d->ipc : NULL;
}

/* ------------------------------------------------------------ importer */

int kva__dev_import_begin(const struct kva__dev_geom *g, struct kva__dev **out)
{
	uint64_t t0 = now_ns(), t1;
	struct kva__dev *d;
	cu_result r;
	int ret;

	if ((ret = driver()) < 0)
		return ret;
	d = calloc(1, sizeof(*d));
	if (!d)
		return kva__err(-ENOMEM, "cuda: out of memory");
	d->g = *g;
	if ((ret = find_uuid(g->uuid, &d->dev, &d->ordinal)) < 0 || (ret = retain(d)) < 0)
		goto fail;
	t1 = now_ns();
	d->t.driver_ns = t1 - t0;
	if (g->ipc == KVA_IPC_FD) {
		if ((ret = enter(d)) < 0)
			goto fail;
		r = drv.mem_address_reserve(&d->base, g->map_bytes, g->granularity, 0, 0);
		leave();
		if (r != CU_SUCCESS) {
			ret = cu_fail(r, "cuMemAddressReserve of %llu bytes",
				      (unsigned long long)g->map_bytes);
			goto fail;
		}
		d->reserved = true;
		d->t.reserve_ns = now_ns() - t1;
	}
	*out = d;
	return 0;
fail:
	teardown(d);
	return ret;
}

int kva__dev_import_fd(struct kva__dev *d, uint32_t chunk, int fd)
{
	uint64_t size, t0 = now_ns(), t1;
	cu_mem_handle h;
	cu_result r;
	int ret;

	if (d->g.ipc != KVA_IPC_FD || chunk != d->mapped || chunk >= d->g.chunks)
		return kva__err(-EPROTO, "protocol: chunk %u where chunk %u of %u was due", chunk,
				d->mapped, d->g.chunks);
	size = kva__dev_chunk_size(&d->g, chunk);
	if ((ret = enter(d)) < 0)
		return ret;
	r = drv.mem_import(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	t1 = now_ns();
	d->t.import_ns += t1 - t0;
	if (r != CU_SUCCESS) {
		leave();
		return cu_fail(r, "cuMemImportFromShareableHandle of chunk %u", chunk);
	}
	r = drv.mem_map(d->base + (uint64_t)chunk * d->g.chunk_bytes, size, 0, h, 0);
	/* mapped, the handle is not needed: the mapping holds the memory */
	drv.mem_release(h);
	leave();
	d->t.map_ns += now_ns() - t1;
	if (r != CU_SUCCESS)
		return cu_fail(r, "cuMemMap of chunk %u (%llu bytes)", chunk,
			       (unsigned long long)size);
	d->mapped++;
	return 0;
}

int kva__dev_import_ipc(struct kva__dev *d, const void *handle)
{
	uint64_t t0 = now_ns();
	cu_ipc_mem_handle h;
	cu_result r;
	int ret;

	if (d->g.ipc != KVA_IPC_LEGACY || d->base)
		return kva__err(-EPROTO, "protocol: an IPC handle for an arena not shared so");
	memcpy(&h, handle, sizeof(h));
	if ((ret = enter(d)) < 0)
		return ret;
	r = drv.ipc_open_mem_handle(&d->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	leave();
	d->t.import_ns += now_ns() - t0;
	if (r != CU_SUCCESS) {
		d->base = 0;
		return cu_fail(r, "cuIpcOpenMemHandle");
	}
	d->mapped = 1;
	return 0;
}

int kva__dev_import_end(struct kva__dev *d)
{
	cu_mem_access_desc acc = { { CU_MEM_LOCATION_TYPE_DEVICE, d->ordinal },
				   CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	uint64_t t0 = now_ns();
	cu_result r;
	int ret;

	if (d->mapped != d->g.chunks)
		return kva__err(-EPROTO, "protocol: %u of %u chunks came", d->mapped, d->g.chunks);
	if (d->g.ipc == KVA_IPC_LEGACY) {
		d->access = true; /* an IPC mapping is usable as opened */
		return 0;
	}
	if ((ret = enter(d)) < 0)
		return ret;
	/* one call over the whole range: it is fully mapped now */
	r = drv.mem_set_access(d->base, d->g.map_bytes, &acc, 1);
	leave();
	d->t.access_ns = now_ns() - t0;
	if (r != CU_SUCCESS)
		return cu_fail(r, "cuMemSetAccess of %llu bytes for device %d",
			       (unsigned long long)d->g.map_bytes, d->ordinal);
	d->access = true;
	return 0;
}

void kva__dev_times(const struct kva__dev *d, struct kva__dev_times *t)
{
	*t = d->t;
}

/* ------------------------------------------------------------ using it */

uint64_t kva__dev_base(const struct kva__dev *d)
{
	return d && d->access ? d->base : 0;
}

int kva__dev_mem_info(struct kva__dev *d, uint64_t *free_bytes, uint64_t *total_bytes)
{
	size_t f = 0, t = 0;
	cu_result r;
	int ret;

	if ((ret = enter(d)) < 0)
		return ret;
	r = drv.mem_get_info(&f, &t);
	leave();
	if (r != CU_SUCCESS)
		return cu_fail(r, "cuMemGetInfo");
	*free_bytes = f;
	*total_bytes = t;
	return 0;
}

int kva__dev_host_register(struct kva__dev *d, void *p, size_t bytes)
{
	cu_result r;
	int ret;

	if ((ret = enter(d)) < 0)
		return ret;
	r = drv.mem_host_register(p, bytes, CU_MEMHOSTREGISTER_PORTABLE);
	leave();
	return r == CU_SUCCESS ? 0 : cu_fail(r, "cuMemHostRegister of %zu bytes", bytes);
}

void kva__dev_host_unregister(struct kva__dev *d, void *p)
{
	if (enter(d) < 0)
		return;
	drv.mem_host_unregister(p);
	leave();
}

/* [off, off + len) inside the region */
static int in_region(const struct kva__dev *d, uint64_t off, uint64_t len)
{
	if (!d->access || off > d->g.map_bytes || len > d->g.map_bytes - off)
		return kva__err(-EINVAL, "cuda: bytes %llu..+%llu outside the region of %llu",
				(unsigned long long)off, (unsigned long long)len,
				(unsigned long long)d->g.map_bytes);
	return 0;
}

int kva__dev_read(struct kva__dev *d, void *dst, uint64_t off, uint64_t len)
{
	cu_result r;
	int ret;

	if ((ret = in_region(d, off, len)) < 0 || (ret = enter(d)) < 0)
		return ret;
	r = drv.memcpy_dtoh(dst, d->base + off, len);
	leave();
	return r == CU_SUCCESS ? 0 : cu_fail(r, "cuMemcpyDtoH of %llu bytes", (unsigned long long)len);
}

int kva__dev_write(struct kva__dev *d, uint64_t off, const void *src, uint64_t len)
{
	cu_result r;
	int ret;

	if ((ret = in_region(d, off, len)) < 0 || (ret = enter(d)) < 0)
		return ret;
	/* from pageable memory the copy returns once the bytes are staged,
	 * before the DMA lands (the driver API's synchronization rules): a
	 * block published next must be whole for a reader in another process,
	 * so the legacy stream the copy went on is waited for */
	r = drv.memcpy_htod(d->base + off, src, len);
	if (r == CU_SUCCESS)
		r = drv.stream_synchronize(NULL);
	leave();
	return r == CU_SUCCESS ? 0 : cu_fail(r, "cuMemcpyHtoD of %llu bytes", (unsigned long long)len);
}

int kva__dev_copy_within(struct kva__dev *d, uint64_t dst_off, uint64_t src_off, uint64_t len)
{
	cu_result r;
	int ret;

	if ((ret = in_region(d, dst_off, len)) < 0 || (ret = in_region(d, src_off, len)) < 0 ||
	    (ret = enter(d)) < 0)
		return ret;
	/* device to device does not wait for itself: the legacy stream (NULL,
	 * as the entry points were asked for) is waited for */
	r = drv.memcpy_dtod_async(d->base + dst_off, d->base + src_off, len, NULL);
	if (r == CU_SUCCESS)
		r = drv.stream_synchronize(NULL);
	leave();
	return r == CU_SUCCESS ? 0 : cu_fail(r, "cuMemcpyDtoD of %llu bytes", (unsigned long long)len);
}

/* ------------------------------------------------------------ queues */

struct kva__dev_queue {
	struct kva__dev *d;
	cu_stream s;
	int err;          /* the first failure since the last wait */
};

int kva__dev_queue_open(struct kva__dev *d, struct kva__dev_queue **out)
{
	struct kva__dev_queue *q = calloc(1, sizeof(*q));
	cu_result r;
	int ret;

	if (!q)
		return kva__err(-ENOMEM, "cuda: out of memory");
	q->d = d;
	if ((ret = enter(d)) < 0) {
		free(q);
		return ret;
	}
	/* not blocking: the copies need not wait for work on the legacy stream */
	r = drv.stream_create(&q->s, CU_STREAM_NON_BLOCKING);
	leave();
	if (r != CU_SUCCESS) {
		free(q);
		return cu_fail(r, "cuStreamCreate");
	}
	*out = q;
	return 0;
}

void kva__dev_queue_close(struct kva__dev_queue *q)
{
	if (!q)
		return;
	if (enter(q->d) == 0) {
		drv.stream_synchronize(q->s);
		drv.stream_destroy(q->s);
		leave();
	}
	free(q);
}

/* one copy queued between @host and the region at @off: down (@to_host) or up */
static int queue_copy(struct kva__dev_queue *q, bool to_host, void *host, uint64_t off,
		      uint64_t len)
{
	cu_result r;
	int ret;

	if (q->err)
		return q->err;
	if ((ret = in_region(q->d, off, len)) < 0 || (ret = enter(q->d)) < 0)
		return q->err = ret;
	r = to_host ? drv.memcpy_dtoh_async(host, q->d->base + off, len, q->s)
		    : drv.memcpy_htod_async(q->d->base + off, host, len, q->s);
	leave();
	if (r != CU_SUCCESS)
		q->err = cu_fail(r, "%s of %llu bytes",
				 to_host ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync",
				 (unsigned long long)len);
	return q->err;
}

int kva__dev_queue_to_host(struct kva__dev_queue *q, void *dst, uint64_t off, uint64_t len)
{
	return queue_copy(q, true, dst, off, len);
}

int kva__dev_queue_from_host(struct kva__dev_queue *q, uint64_t off, const void *src,
			     uint64_t len)
{
	/* the driver only reads @src: the cast is for the one helper */
	return queue_copy(q, false, (void *)src, off, len);
}

int kva__dev_queue_wait(struct kva__dev_queue *q)
{
	int ret = q->err;
	cu_result r;

	q->err = 0;
	if (enter(q->d) < 0)
		return ret ? ret : -EIO;
	r = drv.stream_synchronize(q->s);
	leave();
	if (r != CU_SUCCESS && !ret)
		ret = cu_fail(r, "cuStreamSynchronize");
	return ret;
}

/* ------------------------------------------------------------ the public query */

int kva_cuda_device_query(const char *device, struct kva_cuda_device *out)
{
	struct kva__dev d = { 0 };
	size_t f = 0, t = 0;
	cu_uuid u;
	cu_result r;
	int ret;

	if (!out)
		return kva__err(-EINVAL, "kva_cuda_device_query: NULL argument");
	kva__err_clear();
	memset(out, 0, sizeof(*out));
	if ((ret = driver()) < 0 || (ret = find_device(device, &d.dev, &d.ordinal)) < 0)
		return ret;
	out->ordinal = d.ordinal;
	drv.device_get_name(out->name, sizeof(out->name) - 1, d.dev);
	if ((r = drv.device_get_uuid(&u, d.dev)) != CU_SUCCESS)
		return cu_fail(r, "cuDeviceGetUuid");
	kva__dev_uuid_str((const uint8_t *)u.bytes, out->uuid);
	out->vmm = attribute(&d, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
	out->posix_fd = out->vmm &&
			attribute(&d, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
	out->rdma = out->vmm && attribute(&d, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED);
	if ((ret = retain(&d)) < 0)
		return ret;
	/* in the device's context, as every other call here */
	if ((ret = enter(&d)) == 0) {
		if (out->vmm)
			ret = granularity(&d, &out->granularity);
		if (ret == 0 && (r = drv.mem_get_info(&f, &t)) != CU_SUCCESS)
			ret = cu_fail(r, "cuMemGetInfo");
		leave();
	}
	drv.primary_ctx_release(d.dev);
	out->free_bytes = f;
	out->total_bytes = t;
	return ret;
}
