/* SPDX-License-Identifier: MIT */
/*
 * store.c - kva_store_kv: new tokens' K and V into their cache slots, in the
 * cache's dtype. Every slot is checked before anything is written, so a bad
 * slot mapping changes nothing.
 */
#include <errno.h>

#include "arena_pvt.h"
#include "kernels_pvt.h"

static float load_in(const void *src, enum kva_dtype t, size_t i)
{
	switch (t) {
	case KVA_F16:
		return kva_f16_to_f32(((const uint16_t *)src)[i]);
	case KVA_BF16:
		return kva_bf16_to_f32(((const uint16_t *)src)[i]);
	default:
		return ((const float *)src)[i];
	}
}

/* one token's head: @x (head_dim floats) into @dst; int8 also writes *scale */
static void store_row(const struct kva_kv_desc *kv, const float *x, void *dst, float fp8_scale,
		      float *int8_scale)
{
	const int32_t D = kv->head_dim;

	switch (kv->dtype) {
	case KVA_F32:
		memcpy(dst, x, sizeof(float) * (size_t)D);
		break;
	case KVA_F16:
		for (int32_t d = 0; d < D; d++)
			((uint16_t *)dst)[d] = kva_f32_to_f16(x[d]);
		break;
	case KVA_BF16:
		for (int32_t d = 0; d < D; d++)
			((uint16_t *)dst)[d] = kva_f32_to_bf16(x[d]);
		break;
	case KVA_FP8_E4M3: {
		float inv = 1.0f / fp8_scale;

		for (int32_t d = 0; d < D; d++)
			((uint8_t *)dst)[d] = kva_f32_to_fp8(x[d] * inv);
		break;
	}
	case KVA_INT8: {
		float amax = 0.0f, scale, inv;

		for (int32_t d = 0; d < D; d++)
			amax = kva_max(amax, fabsf(x[d]));
		scale = amax / 127.0f;
		inv = scale > 0.0f ? 1.0f / scale : 0.0f;
		for (int32_t d = 0; d < D; d++)
			((int8_t *)dst)[d] = kva_f32_to_i8(x[d], inv);
		*int8_scale = scale;
		break;
	}
	}
}

int kva_store_kv(const struct kva_kv_desc *kv, const void *k, const void *v,
		 enum kva_dtype in_dtype, const int64_t *slot_mapping, int32_t n_tokens)
{
	const size_t esize = kv ? kva_dtype_size(kv->dtype) : 0;
	float row[KVA__MAX_HEAD_DIM];
	int ret;

	if ((ret = kva__kv_desc_check(kv)) < 0)
		return ret;
	if (n_tokens < 0 || (n_tokens && (!k || !v || !slot_mapping)))
		return kva__err(-EINVAL, "store: NULL input or negative n_tokens");
	if (in_dtype != KVA_F32 && in_dtype != KVA_F16 && in_dtype != KVA_BF16)
		return kva__err(-EINVAL, "store: input must be f32, f16 or bf16");
	if (kv->dtype == KVA_FP8_E4M3) {
		int32_t n = kv->flags & KVA_KV_SCALE_PER_TENSOR ? 1 : kv->num_kv_heads;

		for (int32_t h = 0; h < n; h++)
			if (!(kv->k_scale[h] > 0.0f) || !(kv->v_scale[h] > 0.0f) ||
			    kv->k_scale[h] > 1e30f || kv->v_scale[h] > 1e30f)
				return kva__err(-EINVAL, "store: fp8 scale of head %d not a positive "
						"finite number", h);
	}
	for (int32_t i = 0; i < n_tokens; i++)
		if (slot_mapping[i] >= (int64_t)kv->num_pages * kv->page_size)
			return kva__err(-EINVAL, "store: slot %lld of token %d past the last page",
					(long long)slot_mapping[i], i);

	for (int32_t i = 0; i < n_tokens; i++) {
		int32_t page, off;

		if (slot_mapping[i] < 0)
			continue;
		page = (int32_t)(slot_mapping[i] / kv->page_size);
		off = (int32_t)(slot_mapping[i] % kv->page_size);
		for (int32_t h = 0; h < kv->num_kv_heads; h++) {
			size_t src = ((size_t)i * kv->num_kv_heads + (size_t)h) * kv->head_dim;
			int64_t e = kva_kv_index(kv->page_stride, kv->token_stride, kv->head_stride,
						 page, off, h);
			int64_t se = (int64_t)page * kv->scale_page_stride +
				     (int64_t)off * kv->scale_token_stride +
				     (int64_t)h * kv->scale_head_stride;
			int32_t sh = kv->flags & KVA_KV_SCALE_PER_TENSOR ? 0 : h;

			for (int kvi = 0; kvi < 2; kvi++) {
				const void *in = kvi ? v : k;
				char *base = (char *)(kvi ? kv->v : kv->k);
				float *scales = (float *)(kvi ? kv->v_scale : kv->k_scale);

				for (int32_t d = 0; d < kv->head_dim; d++)
					row[d] = load_in(in, in_dtype, src + (size_t)d);
				store_row(kv, row, base + e * (int64_t)esize,
					  kv->dtype == KVA_FP8_E4M3 ? scales[sh] : 1.0f,
					  kv->dtype == KVA_INT8 ? &scales[se] : NULL);
			}
		}
	}
	return 0;
}
