/* SPDX-License-Identifier: MIT */
/*
 * tile_scalar.c - the portable decode tile: any dtype, any head_dim, no
 * vector intrinsics. It is also the specification the vector paths are
 * tested against, so it follows decode_math.h step by step: score a block
 * of tokens for every query head of the group, fold the block's maximum into
 * the running state, accumulate exp2(score - max) * v.
 *
 * Written so that a compiler can vectorize it for the target (SSE2 on any
 * x86-64; other targets untried): the row conversions are decode_math.h's
 * branch-free ones (with branches, an element at a time, they took about
 * three quarters of the tile's time), and each dot product is 8 partial
 * sums in a fixed order, which a compiler may not make of one running sum
 * (it may not reorder float additions). Zen 4 without AVX-512 under KVM,
 * `--isa scalar`, f16: 2.1-2.9x as fast as before (kvarena-ab, groups 1, 4
 * and 8; doc/figures.md, eighteenth session).
 */
#include "kernels_pvt.h"

/* one token's head, dequantized to fp32 (the scale is applied by the caller) */
static void load_row(const void *row, enum kva_dtype t, int32_t n, float *restrict out)
{
	switch (t) {
	case KVA_F32:
		memcpy(out, row, sizeof(float) * (size_t)n);
		break;
	case KVA_F16:
		for (int32_t d = 0; d < n; d++)
			out[d] = kva_f16_to_f32(((const uint16_t *)row)[d]);
		break;
	case KVA_BF16:
		for (int32_t d = 0; d < n; d++)
			out[d] = kva_bf16_to_f32(((const uint16_t *)row)[d]);
		break;
	case KVA_FP8_E4M3:
		for (int32_t d = 0; d < n; d++)
			out[d] = kva_fp8_to_f32(((const uint8_t *)row)[d]);
		break;
	case KVA_INT8:
		for (int32_t d = 0; d < n; d++)
			out[d] = (float)((const int8_t *)row)[d];
		break;
	}
}

/* q . row over n elements: 8 partial sums (lane j takes elements j, j + 8,
 * ...; the last n % 8 go to lanes 0..), added pairwise in a fixed order */
static float dot(const float *restrict q, const float *restrict row, int32_t n)
{
	float p[8] = { 0 };
	int32_t d = 0;

	for (; d + 8 <= n; d += 8)
		for (int j = 0; j < 8; j++)
			p[j] += q[d + j] * row[d + j];
	for (int j = 0; d < n; d++, j++)
		p[j] += q[d] * row[d];
	return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

/* one KV head (a span of one) */
static void head(const struct kva__tile *t)
{
	const struct kva_kv_desc *kv = t->kv;
	const int32_t G = t->group, D = kv->head_dim, P = kv->page_size;
	float s[KVA__BLOCK_TOKENS][KVA__MAX_GROUP], row[KVA__MAX_HEAD_DIM];

	for (int32_t g = 0; g < G; g++) {
		t->m[g] = -INFINITY;
		t->l[g] = 0.0f;
	}
	memset(t->acc, 0, sizeof(float) * (size_t)G * D);

	for (int32_t tb = t->t0; tb < t->t1; tb += KVA__BLOCK_TOKENS) {
		int32_t n = t->t1 - tb < KVA__BLOCK_TOKENS ? t->t1 - tb : KVA__BLOCK_TOKENS;

		for (int32_t i = 0; i < n; i++) {
			int32_t tok = tb + i, page = t->pages[tok / P];
			float ks = kva__scale(kv, kv->k_scale, page, tok % P, t->kv_head);

			load_row(kva__row(t, kv->k, tok), kv->dtype, D, row);
			for (int32_t g = 0; g < G; g++)
				s[i][g] = dot(t->q + (size_t)g * D, row, D) * ks;
		}
		for (int32_t g = 0; g < G; g++) {
			float mb = t->m[g], r;

			for (int32_t i = 0; i < n; i++)
				mb = kva_max(mb, s[i][g]);
			r = kva_rescale(t->m[g], mb);
			t->l[g] *= r;
			for (int32_t d = 0; d < D; d++)
				t->acc[(size_t)g * D + d] *= r;
			t->m[g] = mb;
		}
		for (int32_t i = 0; i < n; i++) {
			int32_t tok = tb + i, page = t->pages[tok / P];
			float vs = kva__scale(kv, kv->v_scale, page, tok % P, t->kv_head);

			load_row(kva__row(t, kv->v, tok), kv->dtype, D, row);
			for (int32_t g = 0; g < G; g++) {
				float p = exp2f(s[i][g] - t->m[g]), pv = p * vs;
				float *acc = t->acc + (size_t)g * D;

				t->l[g] += p;
				for (int32_t d = 0; d < D; d++)
					acc[d] += pv * row[d];
			}
		}
	}
}

void kva__tile_scalar(const struct kva__tile *t)
{
	struct kva__tile h;

	for (int32_t i = 0; i < t->heads; i++) {
		kva__tile_head(t, i, &h);
		head(&h);
	}
}
