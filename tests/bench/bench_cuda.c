/* SPDX-License-Identifier: MIT */
/*
 * bench_cuda.c - the CUDA driver for the benchmarks' GPU figures (decode
 * --backend cuda, spill --backend cuda): device memory, pinned host memory,
 * copies, a stream and a pair of timing events, in one device's primary
 * context.
 *
 * kvarena-bench links the public library alone, and the library keeps its
 * driver to itself, so this is the bench's own loader, made as the
 * library's (arena/cudrv.c): dlopen("libcuda.so.1"), dlsym of
 * cuGetProcAddress alone, and every other entry point through it at
 * CU_API_VERSION (12.0). The signatures are therefore those of cuda.h's
 * names at 12.0: cuCtxPushCurrent_v2, cuCtxPopCurrent_v2,
 * cuDevicePrimaryCtxRelease_v2, cuMemGetInfo_v2, cuMemAlloc_v2,
 * cuMemFree_v2, cuMemAllocHost_v2, cuMemcpy{HtoD,DtoH,DtoD}Async_v2,
 * cuStreamDestroy_v2, cuEventDestroy_v2, and cuEventElapsedTime (its _v2
 * is of 12.8). Types and constants are arena/cudrv_pvt.h's, with the few it
 * lacks below, at cuda.h's values.
 *
 * THIS CODE HAS NEVER RUN ON A GPU: the project's machines have none. What
 * the tests run is the way out before any figure: no libcuda.so.1, and the
 * project's driver stand-in (tests/cudastub), which is refused by its
 * device name before anything past cuDeviceGetName is asked of it. The
 * paths past that ran once, while they were written, over a throwaway shim
 * that let the stand-in through (copies by memcpy, events by the host's
 * clock, kernels launched as no-ops): every call made, no figure.
 *
 * A struct bench_gpu is used by the thread that opened it: its context is
 * pushed on that thread for the whole run, because kva_decode_cuda runs in
 * the calling thread's current context, which must be the one the bench's
 * memory and stream belong to.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cudrv_pvt.h"

/* cuda.h's, absent from cudrv_pvt.h (the library has no use for them) */
typedef struct cu_event_st *cu_event;       /* CUevent */
#define CU_EVENT_DEFAULT 0x0                /* timing on; the host spins in a wait */
#define CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE 38

/* ------------------------------------------------------------ the driver */

static struct driver {
	/* what tells which device this is: the stand-in has these */
	cu_result (*init)(unsigned int flags);
	cu_result (*driver_get_version)(int *version);
	cu_result (*device_get_count)(int *count);
	cu_result (*device_get)(cu_device *dev, int ordinal);
	cu_result (*device_get_name)(char *name, int len, cu_device dev);
	cu_result (*get_error_name)(cu_result r, const char **s);
	cu_result (*get_error_string)(cu_result r, const char **s);
	/* what measuring takes (the stand-in has no events, no cuMemAllocHost) */
	cu_result (*device_get_attribute)(int *value, int attr, cu_device dev);
	cu_result (*primary_ctx_retain)(cu_context *ctx, cu_device dev);
	cu_result (*primary_ctx_release)(cu_device dev);
	cu_result (*ctx_push_current)(cu_context ctx);
	cu_result (*ctx_pop_current)(cu_context *ctx);
	cu_result (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
	cu_result (*mem_alloc)(cu_deviceptr *ptr, size_t bytes);
	cu_result (*mem_free)(cu_deviceptr ptr);
	cu_result (*mem_alloc_host)(void **p, size_t bytes);
	cu_result (*mem_free_host)(void *p);
	cu_result (*memcpy_htod_async)(cu_deviceptr dst, const void *src, size_t bytes,
				       cu_stream s);
	cu_result (*memcpy_dtoh_async)(void *dst, cu_deviceptr src, size_t bytes, cu_stream s);
	cu_result (*memcpy_dtod_async)(cu_deviceptr dst, cu_deviceptr src, size_t bytes,
				       cu_stream s);
	cu_result (*stream_create)(cu_stream *s, unsigned int flags);
	cu_result (*stream_synchronize)(cu_stream s);
	cu_result (*stream_destroy)(cu_stream s);
	cu_result (*event_create)(cu_event *e, unsigned int flags);
	cu_result (*event_record)(cu_event e, cu_stream s);
	cu_result (*event_synchronize)(cu_event e);
	cu_result (*event_elapsed_time)(float *ms, cu_event start, cu_event end);
	cu_result (*event_destroy)(cu_event e);
} drv;

struct entry {
	const char *name; /* base name: cuGetProcAddress picks the 12.0 ABI */
	size_t offset;
};

#define E(name, field) { name, offsetof(struct driver, field) }
static const struct entry first[] = {
	E("cuInit", init),
	E("cuDriverGetVersion", driver_get_version),
	E("cuDeviceGetCount", device_get_count),
	E("cuDeviceGet", device_get),
	E("cuDeviceGetName", device_get_name),
	E("cuGetErrorName", get_error_name),
	E("cuGetErrorString", get_error_string),
};

static const struct entry rest[] = {
	E("cuDeviceGetAttribute", device_get_attribute),
	E("cuDevicePrimaryCtxRetain", primary_ctx_retain),
	E("cuDevicePrimaryCtxRelease", primary_ctx_release),
	E("cuCtxPushCurrent", ctx_push_current),
	E("cuCtxPopCurrent", ctx_pop_current),
	E("cuMemGetInfo", mem_get_info),
	E("cuMemAlloc", mem_alloc),
	E("cuMemFree", mem_free),
	E("cuMemAllocHost", mem_alloc_host),
	E("cuMemFreeHost", mem_free_host),
	E("cuMemcpyHtoDAsync", memcpy_htod_async),
	E("cuMemcpyDtoHAsync", memcpy_dtoh_async),
	E("cuMemcpyDtoDAsync", memcpy_dtod_async),
	E("cuStreamCreate", stream_create),
	E("cuStreamSynchronize", stream_synchronize),
	E("cuStreamDestroy", stream_destroy),
	E("cuEventCreate", event_create),
	E("cuEventRecord", event_record),
	E("cuEventSynchronize", event_synchronize),
	E("cuEventElapsedTime", event_elapsed_time),
	E("cuEventDestroy", event_destroy),
};
#undef E

/* cuGetProcAddress_v2 (CUDA 12+) has a status out-parameter; the first
 * cuGetProcAddress (CUDA 11.3..11.8) does not */
typedef cu_result (*get_proc_v2_fn)(const char *symbol, void **pfn, int version,
				    unsigned long long flags, int *status);
typedef cu_result (*get_proc_v1_fn)(const char *symbol, void **pfn, int version,
				    unsigned long long flags);

/* POSIX makes a data pointer from dlsym callable; ISO C has no conversion
 * between object and function pointers, so the representation is copied */
_Static_assert(sizeof(void *) == sizeof(cu_result (*)(void)), "function pointers are not void *");

/* set once, by the first bench_gpu_open of the process (its main thread) */
static get_proc_v2_fn get_proc_v2;
static get_proc_v1_fn get_proc_v1;

static int say(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int say(char *why, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, len, fmt, ap);
	va_end(ap);
	return -ENODEV;
}

/* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)", or the number the driver
 * has no name for */
static const char *cu_name(cu_result r, char *buf, size_t len)
{
	const char *name = NULL, *str = NULL;

	if (drv.get_error_name)
		drv.get_error_name(r, &name);
	if (drv.get_error_string)
		drv.get_error_string(r, &str);
	if (name)
		snprintf(buf, len, "%s (%s)", name, str ? str : "no description");
	else
		snprintf(buf, len, "CUresult %d", r);
	return buf;
}

/* the libcuda.so.1 of the loader path, and its cuGetProcAddress */
static int open_lib(char *why, size_t len)
{
	void *lib, *sym;

	if (get_proc_v2 || get_proc_v1)
		return 0;
	/* never closed: the entry points it gives point into it, and the
	 * library under test loads the same object for its own calls */
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return say(why, len, "no CUDA driver: libcuda.so.1 does not load (%s)", dlerror());
	if ((sym = dlsym(lib, "cuGetProcAddress_v2")))
		memcpy(&get_proc_v2, &sym, sizeof(sym));
	else if ((sym = dlsym(lib, "cuGetProcAddress")))
		memcpy(&get_proc_v1, &sym, sizeof(sym));
	else
		return say(why, len, "the CUDA driver is too old: libcuda.so.1 has no "
			   "cuGetProcAddress (CUDA 11.3)");
	return 0;
}

/* the @n entry points @e names into drv; -ENODEV with @why if one is missing */
static int load(const struct entry *e, size_t n, char *why, size_t len)
{
	for (size_t i = 0; i < n; i++) {
		void *sym = NULL;
		int status = CU_GET_PROC_ADDRESS_SUCCESS;
		char r_name[160];
		cu_result r;

		/* a NULL stream is the legacy default stream, as for the library */
		r = get_proc_v2 ? get_proc_v2(e[i].name, &sym, CU_API_VERSION,
					      CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status)
				: get_proc_v1(e[i].name, &sym, CU_API_VERSION,
					      CU_GET_PROC_ADDRESS_LEGACY_STREAM);
		if (r == CU_SUCCESS && status == CU_GET_PROC_ADDRESS_SUCCESS && sym) {
			memcpy((char *)&drv + e[i].offset, &sym, sizeof(sym));
			continue;
		}
		if (r == CU_ERROR_NOT_A_DRIVER)
			return say(why, len, "no CUDA driver: libcuda.so.1 is the toolkit's "
				   "link-time stub (cuGetProcAddress: CUDA_ERROR_STUB_LIBRARY)");
		if (r == CU_SUCCESS || r == CU_ERROR_NOT_FOUND)
			return say(why, len, "the CUDA driver has no %s at API version %d: it is "
				   "older than CUDA 12.0 (cuGetProcAddress status %d)", e[i].name,
				   CU_API_VERSION, status);
		return say(why, len, "cuGetProcAddress(%s) failed: %s", e[i].name,
			   cu_name(r, r_name, sizeof(r_name)));
	}
	return 0;
}

/* ------------------------------------------------------------ a device */

struct bench_gpu {
	cu_device dev;
	int ordinal;
	int driver_version;       /* 1000 * major + 10 * minor */
	char name[128];
	uint64_t l2_bytes;
	cu_context ctx;
	bool retained, pushed;
	cu_stream stream;
	cu_event ev[2];           /* start, end of a timed span */
};

/* a failed call, on stderr, and its errno */
static int fail(cu_result r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(cu_result r, const char *fmt, ...)
{
	char what[200], r_name[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	fprintf(stderr, "gpu: %s: %s\n", what, cu_name(r, r_name, sizeof(r_name)));
	return r == CU_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
}

void bench_gpu_close(struct bench_gpu *g)
{
	cu_context popped;
	cu_result r;

	if (!g)
		return;
	/* what was made in the context goes while it is current: the work
	 * queued on the stream first, then the events and the stream; then
	 * the context, released last. Failures are told and passed over:
	 * the rest must go all the same. */
	if (g->pushed) {
		if (g->stream && (r = drv.stream_synchronize(g->stream)) != CU_SUCCESS)
			fail(r, "cuStreamSynchronize, closing");
		for (int i = 0; i < 2; i++)
			if (g->ev[i] && (r = drv.event_destroy(g->ev[i])) != CU_SUCCESS)
				fail(r, "cuEventDestroy");
		if (g->stream && (r = drv.stream_destroy(g->stream)) != CU_SUCCESS)
			fail(r, "cuStreamDestroy");
		if ((r = drv.ctx_pop_current(&popped)) != CU_SUCCESS)
			fail(r, "cuCtxPopCurrent");
	}
	if (g->retained && (r = drv.primary_ctx_release(g->dev)) != CU_SUCCESS)
		fail(r, "cuDevicePrimaryCtxRelease(device %d)", g->ordinal);
	free(g);
}

/* the device, from its ordinal up to its name; no context yet */
static int find(struct bench_gpu *g, int ordinal, char *why, size_t len)
{
	const char *visible = getenv("CUDA_VISIBLE_DEVICES");
	char r_name[160];
	int count = 0;
	cu_result r;

	if ((r = drv.init(0)) != CU_SUCCESS)
		return say(why, len, "cuInit: %s", cu_name(r, r_name, sizeof(r_name)));
	if (drv.driver_get_version(&g->driver_version) != CU_SUCCESS)
		g->driver_version = 0;
	if ((r = drv.device_get_count(&count)) != CU_SUCCESS)
		return say(why, len, "cuDeviceGetCount: %s", cu_name(r, r_name, sizeof(r_name)));
	if (ordinal >= count)
		return say(why, len, "no CUDA device %d: the driver sees %d "
			   "(CUDA_VISIBLE_DEVICES=%s)", ordinal, count, visible ? visible : "(unset)");
	if ((r = drv.device_get(&g->dev, ordinal)) != CU_SUCCESS)
		return say(why, len, "cuDeviceGet(%d): %s", ordinal,
			   cu_name(r, r_name, sizeof(r_name)));
	g->ordinal = ordinal;
	if ((r = drv.device_get_name(g->name, (int)sizeof(g->name) - 1, g->dev)) != CU_SUCCESS)
		return say(why, len, "cuDeviceGetName(device %d): %s", ordinal,
			   cu_name(r, r_name, sizeof(r_name)));
	g->name[sizeof(g->name) - 1] = '\0';
	/* the tests' stand-in serves host memory through memcpy and runs no
	 * kernel: whatever it gave would be a figure of this CPU */
	if (!strncmp(g->name, BENCH_GPU_STAND_IN, strlen(BENCH_GPU_STAND_IN)))
		return say(why, len, "device %d is \"%s\", the project's CUDA driver stand-in "
			   "(tests/cudastub): its device memory is host memory, its copies are "
			   "memcpy and it runs no kernels, so no GPU figure can come from it",
			   ordinal, g->name);
	return 0;
}

/* the primary context current on this thread, a stream and two events in it */
static int enter(struct bench_gpu *g, char *why, size_t len)
{
	char r_name[160];
	int attr = 0;
	cu_result r;
	const char *call;

	call = "cuDevicePrimaryCtxRetain";
	if ((r = drv.primary_ctx_retain(&g->ctx, g->dev)) != CU_SUCCESS)
		goto fail;
	g->retained = true;
	call = "cuCtxPushCurrent";
	if ((r = drv.ctx_push_current(g->ctx)) != CU_SUCCESS)
		goto fail;
	g->pushed = true;
	/* not blocking: what is timed on it neither waits for nor is waited
	 * for by the legacy stream, where the library's synchronous copies
	 * (kva_block_write on a GPU arena) run */
	call = "cuStreamCreate";
	if ((r = drv.stream_create(&g->stream, CU_STREAM_NON_BLOCKING)) != CU_SUCCESS)
		goto fail;
	call = "cuEventCreate";
	for (int i = 0; i < 2; i++)
		if ((r = drv.event_create(&g->ev[i], CU_EVENT_DEFAULT)) != CU_SUCCESS)
			goto fail;
	if (drv.device_get_attribute(&attr, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, g->dev) ==
	    CU_SUCCESS && attr > 0)
		g->l2_bytes = (uint64_t)attr;
	return 0;
fail:
	snprintf(why, len, "%s (device %d, %s): %s", call, g->ordinal, g->name,
		 cu_name(r, r_name, sizeof(r_name)));
	return r == CU_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
}

int bench_gpu_open(int ordinal, struct bench_gpu **out, char *why, size_t len)
{
	struct bench_gpu *g;
	int ret;

	*out = NULL;
	if (ordinal < 0)
		return say(why, len, "no CUDA device %d", ordinal);
	g = calloc(1, sizeof(*g));
	if (!g) {
		snprintf(why, len, "out of memory");
		return -ENOMEM;
	}
	/* the stand-in's check comes before the entry points it lacks are
	 * asked for: it is "no device", not "a driver too old" */
	if ((ret = open_lib(why, len)) < 0 ||
	    (ret = load(first, sizeof(first) / sizeof(first[0]), why, len)) < 0 ||
	    (ret = find(g, ordinal, why, len)) < 0 ||
	    (ret = load(rest, sizeof(rest) / sizeof(rest[0]), why, len)) < 0 ||
	    (ret = enter(g, why, len)) < 0) {
		bench_gpu_close(g);
		return ret;
	}
	*out = g;
	return 0;
}

const char *bench_gpu_name(const struct bench_gpu *g)
{
	return g->name;
}

int bench_gpu_ordinal(const struct bench_gpu *g)
{
	return g->ordinal;
}

int bench_gpu_driver_version(const struct bench_gpu *g)
{
	return g->driver_version;
}

uint64_t bench_gpu_l2_bytes(const struct bench_gpu *g)
{
	return g->l2_bytes;
}

void *bench_gpu_stream(const struct bench_gpu *g)
{
	return g->stream;
}

int bench_gpu_mem_info(struct bench_gpu *g, uint64_t *free_bytes, uint64_t *total_bytes)
{
	size_t f = 0, t = 0;
	cu_result r = drv.mem_get_info(&f, &t);

	(void)g; /* of the current context, which is g's */
	if (r != CU_SUCCESS)
		return fail(r, "cuMemGetInfo");
	*free_bytes = f;
	*total_bytes = t;
	return 0;
}

/* ------------------------------------------------------------ memory */

int bench_gpu_alloc(struct bench_gpu *g, size_t bytes, void **dptr)
{
	cu_deviceptr p = 0;
	cu_result r = drv.mem_alloc(&p, bytes ? bytes : 1);

	(void)g;
	*dptr = NULL;
	if (r != CU_SUCCESS)
		return fail(r, "cuMemAlloc of %zu bytes", bytes);
	*dptr = (void *)(uintptr_t)p;
	return 0;
}

void bench_gpu_free(struct bench_gpu *g, void *dptr)
{
	cu_result r;

	(void)g;
	if (dptr && (r = drv.mem_free((cu_deviceptr)(uintptr_t)dptr)) != CU_SUCCESS)
		fail(r, "cuMemFree");
}

int bench_gpu_host_alloc(struct bench_gpu *g, size_t bytes, void **p)
{
	cu_result r = drv.mem_alloc_host(p, bytes ? bytes : 1);

	(void)g;
	if (r != CU_SUCCESS) {
		*p = NULL;
		return fail(r, "cuMemAllocHost of %zu bytes", bytes);
	}
	return 0;
}

void bench_gpu_host_free(struct bench_gpu *g, void *p)
{
	cu_result r;

	(void)g;
	if (p && (r = drv.mem_free_host(p)) != CU_SUCCESS)
		fail(r, "cuMemFreeHost");
}

/*
 * Copies of setting up and checking, through the bench's stream and waited
 * for: a synchronous cuMemcpyHtoD of pageable memory may return before its
 * DMA is done, and the legacy stream it runs on orders nothing with a
 * non-blocking stream, so the stream's own order is the one to rely on.
 */
int bench_gpu_put(struct bench_gpu *g, void *dst, const void *src, size_t bytes)
{
	int ret = bench_gpu_copy_async(g, BENCH_GPU_HTOD, dst, src, bytes);

	return ret < 0 ? ret : bench_gpu_sync(g);
}

int bench_gpu_get(struct bench_gpu *g, void *dst, const void *src, size_t bytes)
{
	int ret = bench_gpu_copy_async(g, BENCH_GPU_DTOH, dst, src, bytes);

	return ret < 0 ? ret : bench_gpu_sync(g);
}

/* ------------------------------------------------------------ the stream */

int bench_gpu_copy_async(struct bench_gpu *g, enum bench_gpu_dir dir, void *dst,
			 const void *src, size_t bytes)
{
	cu_deviceptr d = (cu_deviceptr)(uintptr_t)dst, s = (cu_deviceptr)(uintptr_t)src;
	cu_result r;

	switch (dir) {
	case BENCH_GPU_HTOD:
		if ((r = drv.memcpy_htod_async(d, src, bytes, g->stream)) != CU_SUCCESS)
			return fail(r, "cuMemcpyHtoDAsync of %zu bytes", bytes);
		return 0;
	case BENCH_GPU_DTOH:
		if ((r = drv.memcpy_dtoh_async(dst, s, bytes, g->stream)) != CU_SUCCESS)
			return fail(r, "cuMemcpyDtoHAsync of %zu bytes", bytes);
		return 0;
	case BENCH_GPU_DTOD:
		if ((r = drv.memcpy_dtod_async(d, s, bytes, g->stream)) != CU_SUCCESS)
			return fail(r, "cuMemcpyDtoDAsync of %zu bytes", bytes);
		return 0;
	}
	return -EINVAL;
}

int bench_gpu_sync(struct bench_gpu *g)
{
	cu_result r = drv.stream_synchronize(g->stream);

	/* an error of earlier asynchronous work comes out here too */
	return r == CU_SUCCESS ? 0 : fail(r, "cuStreamSynchronize");
}

int bench_gpu_timer_start(struct bench_gpu *g)
{
	cu_result r = drv.event_record(g->ev[0], g->stream);

	return r == CU_SUCCESS ? 0 : fail(r, "cuEventRecord (start)");
}

int bench_gpu_timer_stop(struct bench_gpu *g, double *ns)
{
	float ms = 0.0f;
	cu_result r;

	if ((r = drv.event_record(g->ev[1], g->stream)) != CU_SUCCESS)
		return fail(r, "cuEventRecord (end)");
	if ((r = drv.event_synchronize(g->ev[1])) != CU_SUCCESS)
		return fail(r, "cuEventSynchronize");
	if ((r = drv.event_elapsed_time(&ms, g->ev[0], g->ev[1])) != CU_SUCCESS)
		return fail(r, "cuEventElapsedTime");
	*ns = (double)ms * 1e6;
	return 0;
}

/* ------------------------------------------------------------ "no device" */

int bench_gpu_no_device(const char *bench, const char *status, const char *why)
{
	struct bench_line l;

	fprintf(stderr, "%s: --backend cuda: %s: %s\n", bench, status, why);
	bench_line_begin(&l, bench, NULL);
	bench_line_str(&l, "backend", "cuda");
	bench_line_str(&l, "status", status);
	bench_line_text(&l, "reason", why);
	return bench_line_print(&l);
}
