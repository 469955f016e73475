/* SPDX-License-Identifier: MIT */
/*
 * decode_math.h - the arithmetic of decode attention and KV store, shared by
 * the C kernels and the CUDA kernels so that the tested C path and the CUDA
 * path cannot drift apart: number formats, the log2-domain online softmax,
 * the split plan, the merge of splits, and addressing through the strides.
 *
 * C99/C++ compatible (nvcc compiles it as C++); no libc beyond math.h and
 * string.h; every function is inline and host/device under CUDA.
 */
#ifndef KVA_DECODE_MATH_H
#define KVA_DECODE_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KVA_HD __host__ __device__ __forceinline__
#else
#define KVA_HD static inline
#endif

/* Scores are kept in the log2 domain (q is scaled by sm_scale * log2(e)),
 * so that every exponential is an exp2. */
#define KVA_LOG2E 1.4426950408889634f
#define KVA_LN2 0.6931471805599453f

#define KVA_DEFAULT_SPLIT_TOKENS 512
#define KVA_DEFAULT_MAX_SPLITS 64

KVA_HD float kva_bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

KVA_HD uint32_t kva_f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

/* ----------------------------------------------------------- formats */

/*
 * IEEE half to float: exact, subnormals, infinities and NaN (payload kept)
 * included. Without a branch, so that a loop of them vectorizes (the
 * portable tile, tile_scalar.c) and a warp does not diverge: the exponent
 * moved by 112 for normal values, to all-ones for inf and NaN; subnormals
 * as mant * 2^-24 from an integer conversion, never a multiply of a
 * denormal float, which a caller's flush-to-zero or denormals-are-zero mode
 * would change. test_kernels.c checks every input against a plain
 * branch-by-case reference, in both modes.
 */
KVA_HD float kva_f16_to_f32(uint16_t h)
{
	const uint32_t o = (uint32_t)(h & 0x7fffu) << 13, e = o & 0x0f800000u;
	/* masks, not conditions */
	const uint32_t inf = 0u - (uint32_t)(e == 0x0f800000u), sub = 0u - (uint32_t)(e == 0);
	const uint32_t n = o + (112u << 23) + (inf & (112u << 23)); /* inf, NaN: 255 */
	const uint32_t s = kva_f32_bits((float)(int32_t)(h & 0x3ffu) * 5.9604644775390625e-8f);

	return kva_bits_f32(((n & ~sub) | (s & sub)) | (uint32_t)(h & 0x8000u) << 16);
}

/* float to IEEE half, rounding to nearest even (F. Giesen's method: the
 * subnormal range rounds by an fp32 add, which rounds to nearest even). */
KVA_HD uint16_t kva_f32_to_f16(float f)
{
	const uint32_t infty = 255u << 23, f16max = (127u + 16u) << 23;
	const uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
	uint32_t u = kva_f32_bits(f), sign = u & 0x80000000u;
	uint16_t o;

	u ^= sign;
	if (u >= f16max) {
		o = u > infty ? 0x7e00 : 0x7c00; /* NaN stays NaN; overflow is infinity */
	} else if (u < (113u << 23)) {
		o = (uint16_t)(kva_f32_bits(kva_bits_f32(u) + kva_bits_f32(magic)) - magic);
	} else {
		uint32_t mant_odd = (u >> 13) & 1u;

		u += ((uint32_t)(15 - 127) << 23) + 0xfffu + mant_odd;
		o = (uint16_t)(u >> 13);
	}
	return (uint16_t)(o | (sign >> 16));
}

KVA_HD float kva_bf16_to_f32(uint16_t b)
{
	return kva_bits_f32((uint32_t)b << 16);
}

/* float to bfloat16, rounding to nearest even; NaN stays a quiet NaN. */
KVA_HD uint16_t kva_f32_to_bf16(float f)
{
	uint32_t u = kva_f32_bits(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* 1 if e4m3 byte @x is one of its two NaNs (S.1111.111), else 0 */
KVA_HD int kva_fp8_is_nan(uint8_t x)
{
	return (x & 0x7fu) == 0x7fu;
}

/*
 * fp8 e4m3 ("fn": no infinities, S.1111.111 is NaN, largest finite 448) to
 * float. Its bits, moved under a half's exponent and mantissa, are a half
 * 2^8 times too small: that holds for subnormals too, and is how the SIMD
 * paths convert (shift, vcvtph2ps; the AVX-512 tile multiplies by 2^8, the
 * AVX2 tile's scales carry it).
 */
KVA_HD float kva_fp8_to_f32(uint8_t x)
{
	const uint16_t h = (uint16_t)(((x & 0x7fu) << 7) | ((x & 0x80u) << 8));
	const uint32_t f = kva_f32_bits(kva_f16_to_f32(h) * 256.0f);
	const uint32_t nan = 0u - (uint32_t)kva_fp8_is_nan(x); /* a mask, as above */

	return kva_bits_f32((f & ~nan) | ((0x7fc00000u | (uint32_t)(x & 0x80u) << 24) & nan));
}

#define KVA_FP8_MAX 448.0f

/* float to fp8 e4m3, rounding to nearest even, saturating at +-448 (as a
 * KV cache wants: an outlier clips rather than turning into NaN). */
KVA_HD uint8_t kva_f32_to_fp8(float f)
{
	uint32_t u = kva_f32_bits(f), sign = (u >> 24) & 0x80u, r;

	u &= 0x7fffffffu;
	if (u > 0x7f800000u)
		return (uint8_t)(sign | 0x7fu);
	if (u >= kva_f32_bits(KVA_FP8_MAX))
		return (uint8_t)(sign | 0x7eu);
	if (u < (121u << 23)) { /* below 2^-6: subnormal, in steps of 2^-9 */
		float q = kva_bits_f32(u) * 512.0f + 8388608.0f; /* rounds to an integer, RNE */

		return (uint8_t)(sign | (kva_f32_bits(q) - kva_f32_bits(8388608.0f)));
	}
	/* round 23 mantissa bits to 3 (a carry moves into the exponent) */
	u += 0x7ffffu + ((u >> 20) & 1u);
	r = (u >> 20) - (120u << 3);
	return (uint8_t)(sign | (r > 0x7eu ? 0x7eu : r));
}

/* int8 with a scale: x = q * scale; q in -127..127. */
KVA_HD int8_t kva_f32_to_i8(float x, float inv_scale)
{
	float q = rintf(x * inv_scale);

	q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
	return (int8_t)q;
}

/* ------------------------------------------------------- online softmax */

/*
 * The state of one query head over the tokens seen so far: m the largest
 * score (log2 domain), l = sum 2^(s - m), acc = sum 2^(s - m) v. A new block
 * of scores with maximum m_blk rescales the old state by 2^(m - m_new).
 */
KVA_HD float kva_max(float a, float b)
{
	return a > b ? a : b;
}

/* 2^(m_old - m_new); 0 when there was nothing (m_old = -inf) */
KVA_HD float kva_rescale(float m_old, float m_new)
{
	return m_old == -INFINITY ? 0.0f : exp2f(m_old - m_new);
}

/*
 * Merging two partial states of one head (two splits): with M = max(m_a, m_b),
 * l = l_a 2^(m_a - M) + l_b 2^(m_b - M), acc likewise. These are the weights.
 */
KVA_HD void kva_merge_weights(float m_a, float m_b, float *m, float *w_a, float *w_b)
{
	*m = kva_max(m_a, m_b);
	*w_a = kva_rescale(m_a, *m);
	*w_b = kva_rescale(m_b, *m);
}

/* the natural-log lse of a final state; -inf for no token */
KVA_HD float kva_lse(float m, float l)
{
	return l > 0.0f ? (m + log2f(l)) * KVA_LN2 : -INFINITY;
}

/* ---------------------------------------------------------- the plan */

KVA_HD int32_t kva_seq_len(const int32_t *indptr, const int32_t *last_page_len, int32_t b,
			   int32_t page_size)
{
	int32_t pages = indptr[b + 1] - indptr[b];

	return pages ? (pages - 1) * page_size + last_page_len[b] : 0;
}

/*
 * The split plan of a sequence of @len tokens: as few splits of about
 * @split_tokens as cover it, at most @max_splits, each a whole number of
 * pages (a tile never shares a page with another). Depends on nothing but
 * these numbers: the same plan on any thread count and on the GPU.
 */
KVA_HD int32_t kva_split_len(int32_t len, int32_t page_size, int32_t split_tokens,
			     int32_t max_splits)
{
	int32_t n = (len + split_tokens - 1) / split_tokens, per;

	if (n < 1)
		n = 1;
	if (n > max_splits)
		n = max_splits;
	per = (len + n - 1) / n;
	per = (per + page_size - 1) / page_size * page_size;
	return per > 0 ? per : page_size;
}

KVA_HD int32_t kva_split_count(int32_t len, int32_t split_len)
{
	return len ? (len + split_len - 1) / split_len : 1;
}

/* ------------------------------------------------------- addressing */

/* element offset of token @t's head @h in page @page */
KVA_HD int64_t kva_kv_index(int64_t page_stride, int64_t token_stride, int64_t head_stride,
			    int32_t page, int32_t t, int32_t h)
{
	return (int64_t)page * page_stride + (int64_t)t * token_stride + (int64_t)h * head_stride;
}

#endif /* KVA_DECODE_MATH_H */
