/* SPDX-License-Identifier: MIT */
/*
 * cuda.c - the host side of the CUDA kernels: load the driver at run time,
 * load the module libkvarena carries into the caller's context, check the
 * arguments as the CPU path does, launch decode.cu's kernels.
 *
 * THIS CODE HAS ONLY BEEN COMPILED, AND RUN ON A MACHINE WITHOUT A DRIVER:
 * everything past a successful dlopen("libcuda.so.1") - module loading,
 * launches, scratch memory - has never run. tests/test_cuda.c exercises it
 * against the CPU kernels wherever a driver and a device are present.
 *
 * libcuda is never linked (so every binary starts where there is no driver):
 * arena/cudrv.c finds it and gives every entry point through
 * cuGetProcAddress at a fixed API version. Only the driver API is used;
 * there is no cudart. The driver types and constants are arena/cudrv_pvt.h's,
 * declared with cuda.h's values, because the library must build where the
 * toolkit is absent.
 *
 * Kernels run in the calling thread's current context (the one the engine's
 * streams and memory belong to), or, when none is current, in device 0's
 * primary context, pushed for the call and popped after. A module is loaded
 * once per context and kept for the life of the process.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "arena_pvt.h"
#include "cudrv_pvt.h"
#include "cuda_config.h"
#include "cuda_pvt.h"
#include "kernels_pvt.h"

#if KVA_CUDA_KERNELS
/* bin2c's rendering of nvcc's fatbin (kernels/meson.build): an array of
 * unsigned long long, which gives the image the 8-byte alignment the
 * driver's loader wants */
#include "decode_fatbin.h"
#endif


_Static_assert(sizeof(struct kva__cuda_kv) == KVA__CUDA_KV_SIZE, "kva__cuda_kv layout");
_Static_assert(sizeof(struct kva__cuda_decode_args) == KVA__CUDA_DECODE_ARGS_SIZE,
	       "decode args layout");
_Static_assert(sizeof(struct kva__cuda_store_args) == KVA__CUDA_STORE_ARGS_SIZE,
	       "store args layout");

/* ------------------------------------------------ the driver, by hand */

typedef struct cu_mod_st *cu_module;   /* CUmodule */
typedef struct cu_func_st *cu_function;

#define CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES 1
#define CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8

struct driver {
	int status;       /* 0, or -errno with why */
	char why[224];
	int version;      /* cuDriverGetVersion: 1000 * major + 10 * minor */
	cu_result (*init)(unsigned int flags);
	cu_result (*driver_get_version)(int *version);
	cu_result (*device_get_count)(int *count);
	cu_result (*device_get)(cu_device *dev, int ordinal);
	cu_result (*device_get_attribute)(int *value, int attr, cu_device dev);
	cu_result (*primary_ctx_retain)(cu_context *ctx, cu_device dev);
	cu_result (*ctx_get_current)(cu_context *ctx);
	cu_result (*ctx_push_current)(cu_context ctx);
	cu_result (*ctx_pop_current)(cu_context *ctx);
	cu_result (*ctx_get_device)(cu_device *dev);
	cu_result (*ctx_get_id)(cu_context ctx, unsigned long long *id); /* 12.0+; may be NULL */
	cu_result (*ctx_synchronize)(void);
	cu_result (*module_load_data)(cu_module *mod, const void *image);
	cu_result (*module_get_function)(cu_function *fn, cu_module mod, const char *name);
	cu_result (*func_get_attribute)(int *value, int attr, cu_function fn);
	cu_result (*func_set_attribute)(cu_function fn, int attr, int value);
	cu_result (*launch_kernel)(cu_function fn, unsigned int gx, unsigned int gy,
				   unsigned int gz, unsigned int bx, unsigned int by,
				   unsigned int bz, unsigned int smem, cu_stream stream,
				   void **params, void **extra);
	cu_result (*mem_alloc_async)(cu_deviceptr *ptr, size_t bytes, cu_stream stream);
	cu_result (*mem_free_async)(cu_deviceptr ptr, cu_stream stream);
	cu_result (*memset_d32_async)(cu_deviceptr ptr, unsigned int value, size_t n,
				      cu_stream stream);
	cu_result (*mem_alloc)(cu_deviceptr *ptr, size_t bytes);
	cu_result (*mem_free)(cu_deviceptr ptr);
	cu_result (*memcpy_htod)(cu_deviceptr dst, const void *src, size_t bytes);
	cu_result (*memcpy_dtoh)(void *dst, cu_deviceptr src, size_t bytes);
	cu_result (*memset_d32)(cu_deviceptr ptr, unsigned int value, size_t n);
	cu_result (*get_error_string)(cu_result err, const char **str);
};

/* written once by load_driver under pthread_once, read-only after: the
 * once's own synchronization publishes it to every caller */
static struct driver drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static const struct kva__cu_entry entries[] = {
#define E(name, field) { name, offsetof(struct driver, field), 0 }
	E("cuInit", init),
	E("cuDriverGetVersion", driver_get_version),
	E("cuDeviceGetCount", device_get_count),
	E("cuDeviceGet", device_get),
	E("cuDeviceGetAttribute", device_get_attribute),
	E("cuDevicePrimaryCtxRetain", primary_ctx_retain),
	E("cuCtxGetCurrent", ctx_get_current),
	E("cuCtxPushCurrent", ctx_push_current),
	E("cuCtxPopCurrent", ctx_pop_current),
	E("cuCtxGetDevice", ctx_get_device),
	{ "cuCtxGetId", offsetof(struct driver, ctx_get_id), 1 },
	E("cuCtxSynchronize", ctx_synchronize),
	E("cuModuleLoadData", module_load_data),
	E("cuModuleGetFunction", module_get_function),
	E("cuFuncGetAttribute", func_get_attribute),
	E("cuFuncSetAttribute", func_set_attribute),
	E("cuLaunchKernel", launch_kernel),
	E("cuMemAllocAsync", mem_alloc_async),
	E("cuMemFreeAsync", mem_free_async),
	E("cuMemsetD32Async", memset_d32_async),
	E("cuMemAlloc", mem_alloc),
	E("cuMemFree", mem_free),
	E("cuMemcpyHtoD", memcpy_htod),
	E("cuMemcpyDtoH", memcpy_dtoh),
	E("cuMemsetD32", memset_d32),
	E("cuGetErrorString", get_error_string),
#undef E
};

static void driver_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void driver_fail(int err, const char *fmt, ...)
{
	va_list ap;

	drv.status = err;
	va_start(ap, fmt);
	vsnprintf(drv.why, sizeof(drv.why), fmt, ap);
	va_end(ap);
}

static void load_driver(void)
{
	char why[200];
	int count = 0;
	cu_result r;

	if (!KVA_CUDA_KERNELS) {
		driver_fail(-ENOTSUP, "cuda: libkvarena was built without nvcc, so it has no CUDA "
			    "kernels");
		return;
	}
	if (kva__cu_load(entries, sizeof(entries) / sizeof(entries[0]), &drv, why,
			 sizeof(why)) < 0) {
		driver_fail(-ENODEV, "cuda: %s", why);
		return;
	}
	r = drv.init(0);
	if (r != CU_SUCCESS) {
		const char *s = NULL;

		drv.get_error_string(r, &s);
		driver_fail(-ENODEV, r == CU_ERROR_NO_DEVICE ? "cuda: cuInit: no CUDA device (%s, "
			    "CUresult %d)" : "cuda: cuInit failed: %s (CUresult %d)",
			    s ? s : "unknown error", r);
		return;
	}
	if (drv.driver_get_version(&drv.version) != CU_SUCCESS)
		drv.version = 0;
	if (drv.device_get_count(&count) != CU_SUCCESS || count < 1) {
		driver_fail(-ENODEV, "cuda: the CUDA driver sees no device");
		return;
	}
	drv.status = 0;
}

int kva_cuda_available(void)
{
	pthread_once(&drv_once, load_driver);
	return drv.status ? kva__err(drv.status, "%s", drv.why) : 0;
}

const void *kva__cuda_fatbin(size_t *len)
{
#if KVA_CUDA_KERNELS
	/* the image's own size: a 16-byte header whose second quad is the
	 * size of what follows (bin2c may pad the array past it) */
	size_t n = 16 + (size_t)kva__fatbin_image[1];

	*len = n <= sizeof(kva__fatbin_image) ? n : sizeof(kva__fatbin_image);
	return kva__fatbin_image;
#else
	*len = 0;
	return NULL;
#endif
}

static int cu_fail(cu_result r, const char *what)
{
	const char *s = NULL;

	if (drv.get_error_string)
		drv.get_error_string(r, &s);
	return kva__err(r == CU_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO, "cuda: %s: %s (CUresult %d)",
			what, s ? s : "unknown error", r);
}

/* ------------------------------------------------- context and module */

#define MAX_CONTEXTS 64

/*
 * One loaded module per context. Filled under modules_lock, then published
 * by the release store of key, which pairs with the acquire load in
 * module_find: a thread that sees the key sees the handles. Entries are
 * never removed; a process that outlives more than MAX_CONTEXTS contexts
 * gets -ENOSPC.
 */
struct module {
	_Atomic uint64_t key;  /* context id + 1; 0: free */
	cu_module mod;
	cu_function q, tile, merge, store_check, store;
	/* KVA_CUDA_ERR_* of this context: set by the kernels (atomicOr), read
	 * and cleared by kva_cuda_take_errors after a synchronize. A word of
	 * our own rather than a __device__ variable: nvcc gives those local
	 * binding in a non-relocatable cubin, and an allocation needs no
	 * symbol lookup at all. */
	cu_deviceptr errors;
	int32_t tile_smem;     /* dynamic shared memory a tile block may have */
};

static struct module modules[MAX_CONTEXTS];
static pthread_mutex_t modules_lock = PTHREAD_MUTEX_INITIALIZER;
static cu_context primary; /* device 0's, retained once; under modules_lock */

struct call {
	cu_context ctx;
	uint64_t key;
	bool pushed;
	struct module *m;
};

/* the context to run in: the current one, else device 0's primary */
static int ctx_enter(struct call *c)
{
	unsigned long long id;
	cu_result r;

	memset(c, 0, sizeof(*c));
	if ((r = drv.ctx_get_current(&c->ctx)) != CU_SUCCESS)
		return cu_fail(r, "cuCtxGetCurrent");
	if (!c->ctx) {
		cu_device dev;

		pthread_mutex_lock(&modules_lock);
		r = CU_SUCCESS;
		if (!primary && (r = drv.device_get(&dev, 0)) == CU_SUCCESS)
			r = drv.primary_ctx_retain(&primary, dev);
		c->ctx = primary;
		pthread_mutex_unlock(&modules_lock);
		if (r != CU_SUCCESS)
			return cu_fail(r, "cuDevicePrimaryCtxRetain (no context was current)");
		if ((r = drv.ctx_push_current(c->ctx)) != CU_SUCCESS)
			return cu_fail(r, "cuCtxPushCurrent");
		c->pushed = true;
	}
	/* a context's id is never reused, its handle may be after a destroy */
	if (drv.ctx_get_id && drv.ctx_get_id(c->ctx, &id) == CU_SUCCESS)
		c->key = (uint64_t)id + 1;
	else
		c->key = (uint64_t)(uintptr_t)c->ctx + 1;
	return 0;
}

static void ctx_leave(struct call *c)
{
	cu_context popped;

	if (c->pushed)
		drv.ctx_pop_current(&popped);
}

static struct module *module_find(uint64_t key)
{
	for (int i = 0; i < MAX_CONTEXTS; i++)
		if (atomic_load_explicit(&modules[i].key, memory_order_acquire) == key)
			return &modules[i];
	return NULL;
}

static int module_load(struct module *m)
{
	const void *image;
	size_t len;
	cu_device dev;
	int optin = 48 * 1024, stat = 0;
	cu_result r;
	const struct {
		cu_function *fn;
		const char *name;
	} fns[] = {
		{ &m->q, KVA__CUDA_FN_Q },
		{ &m->tile, KVA__CUDA_FN_TILE },
		{ &m->merge, KVA__CUDA_FN_MERGE },
		{ &m->store_check, KVA__CUDA_FN_STORE_CHECK },
		{ &m->store, KVA__CUDA_FN_STORE },
	};

	image = kva__cuda_fatbin(&len);
	if ((r = drv.module_load_data(&m->mod, image)) != CU_SUCCESS) {
		char what[160];

		snprintf(what, sizeof(what), "cuModuleLoadData of libkvarena's kernels (sm_80, "
			 "sm_90, compute_90 PTX) with driver %d.%d, which must be as new as the "
			 "toolkit that built them", drv.version / 1000, drv.version % 1000 / 10);
		return cu_fail(r, what);
	}
	for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
		if ((r = drv.module_get_function(fns[i].fn, m->mod, fns[i].name)) != CU_SUCCESS)
			return cu_fail(r, fns[i].name);
	if ((r = drv.mem_alloc(&m->errors, sizeof(uint32_t))) != CU_SUCCESS)
		return cu_fail(r, "cuMemAlloc of the error word");
	if ((r = drv.memset_d32(m->errors, 0, 1)) != CU_SUCCESS)
		return cu_fail(r, "cuMemsetD32 of the error word");
	/* a tile may use all the shared memory a block can opt in to, less
	 * what the kernel declares statically */
	if (drv.ctx_get_device(&dev) == CU_SUCCESS)
		drv.device_get_attribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
					 dev);
	drv.func_get_attribute(&stat, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, m->tile);
	m->tile_smem = optin - stat;
	if (m->tile_smem > 48 * 1024 &&
	    drv.func_set_attribute(m->tile, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
				   m->tile_smem) != CU_SUCCESS)
		m->tile_smem = 48 * 1024 - stat;
	return 0;
}

/* the context, and the module in it (loaded on first use in a context) */
static int enter(struct call *c)
{
	struct module *m;
	int ret;

	if ((ret = ctx_enter(c)) < 0)
		return ret;
	if ((c->m = module_find(c->key)))
		return 0;
	pthread_mutex_lock(&modules_lock);
	if (!(m = module_find(c->key))) {
		m = module_find(0);
		if (!m) {
			ret = kva__err(-ENOSPC, "cuda: kernels loaded in %d contexts already",
				       MAX_CONTEXTS);
		} else if ((ret = module_load(m)) == 0) {
			atomic_store_explicit(&m->key, c->key, memory_order_release);
		}
		/* after a failed load the slot's key stays 0: the next call
		 * tries again, and says again why it cannot */
	}
	pthread_mutex_unlock(&modules_lock);
	if (ret < 0) {
		ctx_leave(c);
		return ret;
	}
	c->m = m;
	return 0;
}

static int launch(cu_function fn, unsigned int gx, unsigned int gy, unsigned int gz,
		  unsigned int threads, unsigned int smem, cu_stream stream, void *args,
		  const char *name)
{
	void *params[] = { args };
	cu_result r = drv.launch_kernel(fn, gx, gy, gz, threads, 1, 1, smem, stream, params, NULL);

	return r == CU_SUCCESS ? 0 : cu_fail(r, name);
}

/* --------------------------------------------------------------- decode */

static int bad(const char *what)
{
	return kva__err(-EINVAL, "decode_cuda: %s", what);
}

static size_t tile_smem(int32_t T, int32_t G, int32_t D, int32_t q_in, int32_t acc_in)
{
	return sizeof(float) * ((size_t)T * D + (size_t)G * T + (size_t)T + 3 * (size_t)G +
				(size_t)(q_in + acc_in) * G * D);
}

/*
 * Shared memory of a tile (decode.cu, kva_cuda_tile). acc leaves shared
 * memory first: it is read and written once per token block, while q is
 * read once per token; then q; then fewer tokens per block. A block of one
 * token with both in global memory needs under 5 KiB, so a layout exists.
 */
static size_t tile_layout(struct kva__cuda_decode_args *a, int32_t max_bytes)
{
	static const int32_t modes[3][2] = { { 1, 1 }, { 1, 0 }, { 0, 0 } };
	const int32_t G = a->group, D = a->kv.head_dim;

	for (int i = 0; i < 3; i++)
		for (int32_t T = KVA__CUDA_MAX_BLOCK_TOKENS; T >= 1; T /= 2)
			if (tile_smem(T, G, D, modes[i][0], modes[i][1]) <= (size_t)max_bytes ||
			    (i == 2 && T == 1)) {
				a->block_tokens = T;
				a->q_in_smem = modes[i][0];
				a->acc_in_smem = modes[i][1];
				return tile_smem(T, G, D, modes[i][0], modes[i][1]);
			}
	return 0;
}

static void kv_args(struct kva__cuda_kv *d, const struct kva_kv_desc *kv)
{
	*d = (struct kva__cuda_kv){
		.k = kv->k, .v = kv->v, .k_scale = kv->k_scale, .v_scale = kv->v_scale,
		.page_stride = kv->page_stride, .token_stride = kv->token_stride,
		.head_stride = kv->head_stride, .scale_page_stride = kv->scale_page_stride,
		.scale_token_stride = kv->scale_token_stride,
		.scale_head_stride = kv->scale_head_stride, .num_kv_heads = kv->num_kv_heads,
		.head_dim = kv->head_dim, .page_size = kv->page_size, .num_pages = kv->num_pages,
		.dtype = (int32_t)kv->dtype, .flags = kv->flags,
	};
}

int kva_decode_cuda(const struct kva_kv_desc *kv, const struct kva_page_table *pt,
		    const void *q, enum kva_dtype q_dtype, int32_t num_q_heads, float sm_scale,
		    void *out, float *lse, const struct kva_decode_opts *opts, void *stream)
{
	struct kva_decode_opts o = opts ? *opts : (struct kva_decode_opts){ 0 };
	struct kva__cuda_decode_args a = { 0 };
	cu_stream s = stream;
	cu_deviceptr scratch = 0;
	int64_t rows, tiles;
	size_t qbytes, bytes, smem;
	struct call c;
	cu_result r;
	int ret;

	if ((ret = kva__decode_args_check(kv, pt, q, q_dtype, num_q_heads, sm_scale, out, &o)) < 0)
		return ret;
	if ((ret = kva_cuda_available()) < 0)
		return ret;
	if (!pt->batch)
		return 0;
	kv_args(&a.kv, kv);
	a.indptr = pt->indptr;
	a.indices = pt->indices;
	a.last_page_len = pt->last_page_len;
	a.q = q;
	a.out = out;
	a.lse = lse;
	a.batch = pt->batch;
	a.num_q_heads = num_q_heads;
	a.group = num_q_heads / kv->num_kv_heads;
	a.split_tokens = o.split_tokens ? o.split_tokens : KVA_DEFAULT_SPLIT_TOKENS;
	a.max_splits = o.max_splits ? o.max_splits : KVA_DEFAULT_MAX_SPLITS;
	a.q_dtype = (int32_t)q_dtype;
	a.q_scale = sm_scale * KVA_LOG2E;
	a.part_stride = (int64_t)a.group * (2 + (int64_t)kv->head_dim);
	rows = (int64_t)pt->batch * num_q_heads;
	tiles = (int64_t)pt->batch * kv->num_kv_heads * a.max_splits;
	/* one block per row or tile: the grid's x dimension is below 2^31 */
	if (rows > INT32_MAX || tiles > INT32_MAX)
		return bad("too many tiles: fewer splits or a smaller batch");

	if ((ret = enter(&c)) < 0)
		return ret;
	smem = tile_layout(&a, c.m->tile_smem);
	qbytes = ((sizeof(float) * (size_t)rows * (size_t)kv->head_dim) + 255) & ~(size_t)255;
	bytes = qbytes + sizeof(float) * (size_t)tiles * (size_t)a.part_stride;
	/* stream-ordered: freed behind the merge on the same stream, and safe
	 * to capture in a graph */
	if ((r = drv.mem_alloc_async(&scratch, bytes, s)) != CU_SUCCESS) {
		ret = cu_fail(r, "cuMemAllocAsync of decode scratch");
		goto out;
	}
	a.qf = (float *)(uintptr_t)scratch;
	a.part = (float *)(uintptr_t)(scratch + qbytes);
	a.errors = (uint32_t *)(uintptr_t)c.m->errors;
	if ((ret = launch(c.m->q, (unsigned int)rows, 1, 1, KVA__CUDA_ROW_THREADS, 0, s, &a,
			  KVA__CUDA_FN_Q)) < 0 ||
	    (ret = launch(c.m->tile, (unsigned int)tiles, 1, 1, KVA__CUDA_TILE_THREADS,
			  (unsigned int)smem, s, &a, KVA__CUDA_FN_TILE)) < 0 ||
	    (ret = launch(c.m->merge, (unsigned int)rows, 1, 1, KVA__CUDA_ROW_THREADS, 0, s, &a,
			  KVA__CUDA_FN_MERGE)) < 0) {
		drv.mem_free_async(scratch, s);
		goto out;
	}
	if ((r = drv.mem_free_async(scratch, s)) != CU_SUCCESS)
		ret = cu_fail(r, "cuMemFreeAsync of decode scratch");
out:
	ctx_leave(&c);
	return ret;
}

/* ---------------------------------------------------------------- store */

int kva_store_kv_cuda(const struct kva_kv_desc *kv, const void *k, const void *v,
		      enum kva_dtype in_dtype, const int64_t *slot_mapping, int32_t n_tokens,
		      void *stream)
{
	struct kva__cuda_store_args a = { 0 };
	cu_stream s = stream;
	cu_deviceptr flag = 0;
	struct call c;
	cu_result r;
	int ret;

	/* store.c's checks, but for the slots and fp8 scales, which are in
	 * device memory: kva_cuda_store_check tests them */
	if ((ret = kva__kv_desc_check(kv)) < 0)
		return ret;
	if (n_tokens < 0 || (n_tokens && (!k || !v || !slot_mapping)))
		return kva__err(-EINVAL, "store_cuda: NULL input or negative n_tokens");
	if (in_dtype != KVA_F32 && in_dtype != KVA_F16 && in_dtype != KVA_BF16)
		return kva__err(-EINVAL, "store_cuda: input must be f32, f16 or bf16");
	if ((ret = kva_cuda_available()) < 0)
		return ret;
	if (!n_tokens)
		return 0;
	kv_args(&a.kv, kv);
	a.k = k;
	a.v = v;
	a.slot_mapping = slot_mapping;
	a.n_tokens = n_tokens;
	a.in_dtype = (int32_t)in_dtype;

	if ((ret = enter(&c)) < 0)
		return ret;
	if ((r = drv.mem_alloc_async(&flag, sizeof(uint32_t), s)) != CU_SUCCESS) {
		ret = cu_fail(r, "cuMemAllocAsync of the store's flag");
		goto out;
	}
	a.flag = (uint32_t *)(uintptr_t)flag;
	a.errors = (uint32_t *)(uintptr_t)c.m->errors;
	if ((r = drv.memset_d32_async(flag, 0, 1, s)) != CU_SUCCESS)
		ret = cu_fail(r, "cuMemsetD32Async of the store's flag");
	else if ((ret = launch(c.m->store_check,
			       (unsigned int)((n_tokens + KVA__CUDA_CHECK_THREADS - 1) /
					      KVA__CUDA_CHECK_THREADS),
			       1, 1, KVA__CUDA_CHECK_THREADS, 0, s, &a, KVA__CUDA_FN_STORE_CHECK)) == 0)
		ret = launch(c.m->store, (unsigned int)n_tokens, (unsigned int)kv->num_kv_heads, 2,
			     KVA__CUDA_ROW_THREADS, 0, s, &a, KVA__CUDA_FN_STORE);
	if ((r = drv.mem_free_async(flag, s)) != CU_SUCCESS && ret == 0)
		ret = cu_fail(r, "cuMemFreeAsync of the store's flag");
out:
	ctx_leave(&c);
	return ret;
}

/* --------------------------------------------------------------- errors */

int kva_cuda_take_errors(uint32_t *errors)
{
	uint32_t bits = 0;
	struct call c;
	cu_result r;
	int ret;

	if (!errors)
		return kva__err(-EINVAL, "cuda: NULL errors");
	*errors = 0;
	if ((ret = kva_cuda_available()) < 0)
		return ret;
	if ((ret = enter(&c)) < 0)
		return ret;
	/* kernels set bits with atomicOr until they finish; after the
	 * synchronize, the read and the clear see no kernel of this context
	 * but those queued since, whose bits the next call reports */
	if ((r = drv.ctx_synchronize()) != CU_SUCCESS)
		ret = cu_fail(r, "cuCtxSynchronize");
	else if ((r = drv.memcpy_dtoh(&bits, c.m->errors, sizeof(bits))) != CU_SUCCESS)
		ret = cu_fail(r, "cuMemcpyDtoH of the error word");
	else if ((r = drv.memset_d32(c.m->errors, 0, 1)) != CU_SUCCESS)
		ret = cu_fail(r, "cuMemsetD32 of the error word");
	*errors = bits;
	ctx_leave(&c);
	return ret;
}

/* ----------------------------------------------- memory, for the tests */

int kva__cuda_malloc(void **dptr, size_t bytes)
{
	cu_deviceptr p = 0;
	struct call c;
	cu_result r;
	int ret;

	*dptr = NULL;
	if ((ret = kva_cuda_available()) < 0 || (ret = ctx_enter(&c)) < 0)
		return ret;
	if ((r = drv.mem_alloc(&p, bytes ? bytes : 1)) != CU_SUCCESS)
		ret = cu_fail(r, "cuMemAlloc");
	else
		*dptr = (void *)(uintptr_t)p;
	ctx_leave(&c);
	return ret;
}

int kva__cuda_free(void *dptr)
{
	struct call c;
	cu_result r;
	int ret;

	if (!dptr)
		return 0;
	if ((ret = kva_cuda_available()) < 0 || (ret = ctx_enter(&c)) < 0)
		return ret;
	if ((r = drv.mem_free((cu_deviceptr)(uintptr_t)dptr)) != CU_SUCCESS)
		ret = cu_fail(r, "cuMemFree");
	ctx_leave(&c);
	return ret;
}

int kva__cuda_copy(void *dst, const void *src, size_t bytes, int to_device)
{
	struct call c;
	cu_result r;
	int ret;

	if ((ret = kva_cuda_available()) < 0 || (ret = ctx_enter(&c)) < 0)
		return ret;
	r = to_device ? drv.memcpy_htod((cu_deviceptr)(uintptr_t)dst, src, bytes)
		      : drv.memcpy_dtoh(dst, (cu_deviceptr)(uintptr_t)src, bytes);
	if (r != CU_SUCCESS)
		ret = cu_fail(r, to_device ? "cuMemcpyHtoD" : "cuMemcpyDtoH");
	ctx_leave(&c);
	return ret;
}

int kva__cuda_sync(void)
{
	struct call c;
	cu_result r;
	int ret;

	if ((ret = kva_cuda_available()) < 0 || (ret = ctx_enter(&c)) < 0)
		return ret;
	if ((r = drv.ctx_synchronize()) != CU_SUCCESS)
		ret = cu_fail(r, "cuCtxSynchronize");
	ctx_leave(&c);
	return ret;
}
