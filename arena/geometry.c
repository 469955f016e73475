/* SPDX-License-Identifier: MIT */
/*
 * geometry.c - block shape to byte layout. Pure arithmetic, overflow-checked.
 */
#include <errno.h>
#include <string.h>

#include "arena_pvt.h"

static const struct {
	const char *name;
	const char *alias;
	uint32_t bytes;
} dtypes[] = {
	[KVA_F32] = { "f32", "float32", 4 },
	[KVA_F16] = { "f16", "float16", 2 },
	[KVA_BF16] = { "bf16", "bfloat16", 2 },
	[KVA_FP8_E4M3] = { "fp8_e4m3", "fp8", 1 },
	[KVA_INT8] = { "int8", "i8", 1 },
};

static bool dtype_known(enum kva_dtype t)
{
	return (unsigned)t < sizeof(dtypes) / sizeof(dtypes[0]) && dtypes[t].name;
}

size_t kva_dtype_size(enum kva_dtype t)
{
	return dtype_known(t) ? dtypes[t].bytes : 0;
}

const char *kva_dtype_name(enum kva_dtype t)
{
	return dtype_known(t) ? dtypes[t].name : "?";
}

int kva_dtype_parse(const char *s, enum kva_dtype *out)
{
	if (!s || !out)
		return -EINVAL;
	for (unsigned t = 1; t < sizeof(dtypes) / sizeof(dtypes[0]); t++) {
		if (!strcmp(s, dtypes[t].name) || !strcmp(s, dtypes[t].alias)) {
			*out = (enum kva_dtype)t;
			return 0;
		}
	}
	return kva__err(-EINVAL, "unknown dtype '%s' (f32, f16, bf16, fp8_e4m3, int8)", s);
}

static bool mul_ok(uint64_t a, uint64_t b, uint64_t *r)
{
	return !__builtin_mul_overflow(a, b, r);
}

/* Round @v up to @align (a power of two) into @r; false on overflow. */
static bool align_ok(uint64_t v, uint64_t align, uint64_t *r)
{
	if (__builtin_add_overflow(v, align - 1, r))
		return false;
	*r &= ~(align - 1);
	return true;
}

static int range(const char *what, uint32_t v, uint32_t lo, uint32_t hi)
{
	if (v < lo || v > hi)
		return kva__err(-EINVAL, "geometry: %s %u out of range %u..%u", what, v, lo, hi);
	return 0;
}

int kva_geometry_layout(const struct kva_geometry *g, uint32_t blocks,
			struct kva_block_layout *out)
{
	struct kva_block_layout l = { 0 };
	uint64_t kv_pages, scale_pages, total;
	int ret;

	if (!g || !out)
		return kva__err(-EINVAL, "geometry: NULL argument");
	if ((ret = range("block_tokens", g->block_tokens, 1, 65536)) ||
	    (ret = range("layers", g->layers, 1, 4096)) ||
	    (ret = range("kv_heads", g->kv_heads, 1, 4096)) ||
	    (ret = range("head_dim", g->head_dim, 1, 65536)) ||
	    (ret = range("blocks", blocks, 1, KVA_MAX_BLOCKS)))
		return ret;
	if (!dtype_known(g->dtype))
		return kva__err(-EINVAL, "geometry: unknown dtype %d", (int)g->dtype);
	if (g->layout != KVA_LAYOUT_BLOCK_MAJOR && g->layout != KVA_LAYOUT_LAYER_MAJOR)
		return kva__err(-EINVAL, "geometry: unknown layout %d", (int)g->layout);

	l.elem_bytes = dtypes[g->dtype].bytes;
	l.token_stride = (uint64_t)g->head_dim * l.elem_bytes;
	l.head_stride = l.token_stride * g->block_tokens;         /* <= 2^34 */
	if (!mul_ok(l.head_stride, g->kv_heads, &l.page_bytes) ||
	    !align_ok(l.page_bytes, 64, &l.page_bytes))
		goto overflow;
	if (g->dtype == KVA_INT8 &&
	    !align_ok((uint64_t)g->block_tokens * g->kv_heads * sizeof(float), 64, &l.scale_bytes))
		goto overflow;

	kv_pages = 2ull * g->layers; /* K and V of every layer */
	if (!mul_ok(l.page_bytes, kv_pages, &l.block_bytes) ||
	    !mul_ok(l.scale_bytes, kv_pages, &scale_pages) ||
	    __builtin_add_overflow(l.block_bytes, scale_pages, &l.block_bytes))
		goto overflow;

	if (g->layout == KVA_LAYOUT_BLOCK_MAJOR) {
		if (!align_ok(l.block_bytes, 4096, &l.block_stride) ||
		    !mul_ok(l.block_stride, blocks, &total))
			goto overflow;
		l.page_stride = l.scale_stride = l.block_stride;
	} else {
		uint64_t scale_pool = 0;

		if (!mul_ok(l.page_bytes, blocks, &l.pool_bytes) ||
		    !align_ok(l.pool_bytes, 4096, &l.pool_bytes) ||
		    !mul_ok(l.scale_bytes, blocks, &scale_pool) ||
		    !align_ok(scale_pool, 4096, &scale_pool) ||
		    __builtin_add_overflow(l.pool_bytes, scale_pool, &total) ||
		    !mul_ok(total, kv_pages, &total))
			goto overflow;
		l.page_stride = l.page_bytes;
		l.scale_stride = l.scale_bytes;
	}
	if (total > (uint64_t)INT64_MAX)
		goto overflow;
	l.data_bytes = total;
	*out = l;
	return 0;
overflow:
	return kva__err(-EOVERFLOW, "geometry: %u blocks of this shape do not fit 63 bits of bytes",
			blocks);
}

uint64_t kva_kv_offset(const struct kva_geometry *g, const struct kva_block_layout *l,
		       uint32_t blocks, uint32_t block, uint32_t layer, int kv, int scales)
{
	uint64_t page = 2ull * layer + (kv ? 1 : 0);
	uint64_t kv_pages = 2ull * g->layers;

	if (g->layout == KVA_LAYOUT_BLOCK_MAJOR) {
		uint64_t base = (uint64_t)block * l->block_stride;

		if (scales)
			return base + kv_pages * l->page_bytes + page * l->scale_bytes;
		return base + page * l->page_bytes;
	}
	if (scales) {
		uint64_t scale_pool = ((uint64_t)blocks * l->scale_bytes + 4095) & ~4095ull;

		return kv_pages * l->pool_bytes + page * scale_pool + (uint64_t)block * l->scale_bytes;
	}
	return page * l->pool_bytes + (uint64_t)block * l->page_bytes;
}
