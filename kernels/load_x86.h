/* SPDX-License-Identifier: MIT */
/*
 * load_x86.h - a K or V row's stored elements as fp32, 8 (AVX2 + F16C) or 16
 * (AVX-512) at a time: the conversions the vector tiles run in their
 * innermost loops, and that `kvarena-bench decode`'s arithmetic roofline
 * (tests/bench/bench_roofline.c) runs too, so that the roofline counts the
 * instructions the tiles do.
 *
 * Each function carries its instruction set as a target attribute: the
 * header compiles in any file, and inlines into callers built for that
 * instruction set or more (the tiles, with -m flags; the bench, with the
 * same attribute).
 */
#ifndef KVA_LOAD_X86_H
#define KVA_LOAD_X86_H

#include <immintrin.h>

#include "kvarena.h"

#define KVA__AI __attribute__((always_inline)) static inline
#define KVA__TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KVA__TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))

/* what kva__load8() gives for an fp8 element of value 1 */
#define KVA__FP8_LOAD8_UNIT 0x1p-8f

/* 8 elements of a K or V row, as fp32 (without the row's scale; fp8's x
 * KVA__FP8_LOAD8_UNIT, and its NaNs as finite values: see below) */
KVA__AI KVA__TARGET_AVX2 __m256 kva__load8(const void *p, const enum kva_dtype dt)
{
	switch (dt) {
	case KVA_F16:
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
	case KVA_BF16:
		return _mm256_castsi256_ps(_mm256_slli_epi32(
			_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
	case KVA_FP8_E4M3: {
		/*
		 * e4m3 bits under a half's fields: the value x 2^-8, which the
		 * AVX2 tile's scales take back (KVA__FP8_LOAD8_UNIT), so that
		 * no multiply takes an FMA pipe's slot here. The byte sign-
		 * extended and shifted left 7 puts the magnitude's 7 bits under
		 * the half's exponent and mantissa and the sign in bit 15; bit
		 * 14 then holds a copy of the sign, which the mask clears (a
		 * positive byte has 0 there). Three operations and one constant:
		 * in the tile's 4 x 3 shapes, where 15 of the 16 ymm are taken,
		 * the conversion that also made e4m3's NaNs (0x7f, 0xff) a
		 * half's NaN spilled an accumulator. Here they read as +-480
		 * (x KVA__FP8_LOAD8_UNIT), and the tile finds them apart
		 * (tile_avx2.c, fp8_any_nan).
		 */
		__m128i x = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));

		return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(x, 7),
						     _mm_set1_epi16((short)0xbfff)));
	}
	case KVA_INT8:
		return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
	default:
		return _mm256_loadu_ps(p);
	}
}

/* 16 elements of a K or V row, as fp32 (without the row's scale) */
KVA__AI KVA__TARGET_AVX512 __m512 kva__load16(const void *p, const enum kva_dtype dt)
{
	switch (dt) {
	case KVA_F16:
		return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
	case KVA_BF16:
		return _mm512_castsi512_ps(_mm512_slli_epi32(
			_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
	case KVA_FP8_E4M3: {
		/* under a half's exponent and mantissa, e4m3 bits are a half 2^8
		 * too small (decode_math.h); S.1111.111 is NaN */
		__m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
		__m256i mag = _mm256_and_si256(x, _mm256_set1_epi16(0x7f));
		__m256i h = _mm256_or_si256(_mm256_slli_epi16(mag, 7),
					    _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8));
		__m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
		__mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7f));

		return _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(__builtin_nanf("")));
	}
	case KVA_INT8:
		return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
	default:
		return _mm512_loadu_ps(p);
	}
}

#endif
