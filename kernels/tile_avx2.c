/* SPDX-License-Identifier: MIT */
/*
 * tile_avx2.c - the decode tile with AVX2 + FMA + F16C (head_dim a multiple
 * of 8): tile_avx512.c's arrangement with 8 lanes and 16 registers. Eight
 * dot products are scored at a time (8 tokens x 1 head, 4 x 2 or 2 x 4) and
 * reduced together; exp2 builds 2^n from its exponent bits (no vscalefps).
 */
#include <immintrin.h>

#include "kernels_pvt.h"

#define AI __attribute__((always_inline)) static inline

/* 8 elements of a K or V row, as fp32 (without the row's scale) */
AI __m256 load8(const void *p, const enum kva_dtype dt)
{
	switch (dt) {
	case KVA_F16:
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
	case KVA_BF16:
		return _mm256_castsi256_ps(_mm256_slli_epi32(
			_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
	case KVA_FP8_E4M3: {
		/* as in tile_avx512.c: e4m3 bits under a half's fields, x 2^8 */
		__m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
		__m128i mag = _mm_and_si128(x, _mm_set1_epi16(0x7f));
		__m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7),
					 _mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x80)), 8));
		__m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
		__m256 nan = _mm256_castsi256_ps(
			_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f))));

		return _mm256_blendv_ps(f, _mm256_set1_ps(__builtin_nanf("")), nan);
	}
	case KVA_INT8:
		return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
	default:
		return _mm256_loadu_ps(p);
	}
}

/* lane i = the sum of v[i]'s 8 lanes */
AI __m256 reduce8(const __m256 v[8])
{
	__m256 s01 = _mm256_hadd_ps(v[0], v[1]), s23 = _mm256_hadd_ps(v[2], v[3]);
	__m256 s45 = _mm256_hadd_ps(v[4], v[5]), s67 = _mm256_hadd_ps(v[6], v[7]);
	__m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);

	return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
			     _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

/*
 * 2^x for x <= 0: x = n + f, |f| <= 1/2, 2^f by the degree-7 Taylor
 * polynomial of tile_avx512.c, 2^n as exponent bits. x is clamped at -126:
 * what it drops is below 2^-126 of the largest term.
 */
AI __m256 exp2_ps(__m256 x)
{
	__m256 n, f, p;
	__m256i e;

	x = _mm256_max_ps(x, _mm256_set1_ps(-126.0f));
	n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	f = _mm256_sub_ps(x, n);
	p = _mm256_set1_ps(1.525273380405984e-05f);
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381608e-04f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-03f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618129107628477e-03f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550410866482158e-02f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402265069591007e-01f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471805599453e-01f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
	e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

AI float hmax8(__m256 v)
{
	__m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	m = _mm_max_ps(m, _mm_movehl_ps(m, m));
	m = _mm_max_ss(m, _mm_movehdup_ps(m));
	return _mm_cvtss_f32(m);
}

AI float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

struct block {
	const char *k[KVA__BLOCK_TOKENS], *v[KVA__BLOCK_TOKENS];
	float ks[KVA__BLOCK_TOKENS], vs[KVA__BLOCK_TOKENS];
	int n;
};

/* Score tokens [i, i + TB) x heads [g0, g0 + GB), TB * GB = 8, into s[g][i]. */
AI void score8(const struct kva__tile *t, const struct block *bk, int i, int g0,
	       float s[][KVA__BLOCK_TOKENS], const enum kva_dtype dt, const int NC, const int TB,
	       const int GB)
{
	const int D = NC * 8, nt = bk->n - i < TB ? bk->n - i : TB;
	const int ng = t->group - g0 < GB ? t->group - g0 : GB;
	const size_t esize = kva_dtype_size(dt);
	__m256 a[8], qv[4];
	float r[8];

	for (int j = 0; j < 8; j++)
		a[j] = _mm256_setzero_ps();
	/* registers: 8 accumulators, GB query chunks, one K chunk */
	for (int c = 0; c < NC; c++) {
		for (int gg = 0; gg < GB; gg++)
			qv[gg] = gg < ng ? _mm256_loadu_ps(t->q + (size_t)(g0 + gg) * D + c * 8)
					 : _mm256_setzero_ps();
		for (int tt = 0; tt < TB; tt++) {
			__m256 kc;

			if (tt >= nt)
				break;
			kc = load8(bk->k[i + tt] + (size_t)c * 8 * esize, dt);
			for (int gg = 0; gg < GB; gg++)
				a[tt * GB + gg] = _mm256_fmadd_ps(kc, qv[gg], a[tt * GB + gg]);
		}
	}
	_mm256_storeu_ps(r, reduce8(a));
	for (int tt = 0; tt < nt; tt++)
		for (int gg = 0; gg < ng; gg++)
			s[g0 + gg][i + tt] = r[tt * GB + gg] * bk->ks[i + tt];
}

/* acc[g] += sum_t p[g][t] v[t]: two tokens and four heads at a time */
AI void accumulate(const struct kva__tile *t, const struct block *bk,
		   float s[][KVA__BLOCK_TOKENS], const enum kva_dtype dt, const int NC)
{
	const int D = NC * 8, G = t->group;
	const size_t esize = kva_dtype_size(dt);

	for (int i = 0; i < bk->n; i += 2) {
		const int nt = bk->n - i < 2 ? bk->n - i : 2;

		for (int g0 = 0; g0 < G; g0 += 4) {
			const int ng = G - g0 < 4 ? G - g0 : 4;
			__m256 p[4][2];

			for (int gg = 0; gg < 4; gg++)
				for (int tt = 0; tt < 2; tt++)
					p[gg][tt] = _mm256_set1_ps(gg < ng && tt < nt ? s[g0 + gg][i + tt]
										      : 0.0f);
			for (int c = 0; c < NC; c++) {
				__m256 v0 = load8(bk->v[i] + (size_t)c * 8 * esize, dt);
				__m256 v1 = nt > 1 ? load8(bk->v[i + 1] + (size_t)c * 8 * esize, dt)
						   : _mm256_setzero_ps();

				for (int gg = 0; gg < ng; gg++) {
					float *o = t->acc + (size_t)(g0 + gg) * D + c * 8;
					__m256 acc = _mm256_loadu_ps(o);

					acc = _mm256_fmadd_ps(p[gg][0], v0, acc);
					acc = _mm256_fmadd_ps(p[gg][1], v1, acc);
					_mm256_storeu_ps(o, acc);
				}
			}
		}
	}
}

AI void prefetch_rows(const struct kva__tile *t, int32_t from, int32_t to, size_t row_bytes)
{
	for (int32_t tok = from; tok < to; tok++) {
		const char *k = kva__row(t, t->kv->k, tok), *v = kva__row(t, t->kv->v, tok);

		for (size_t off = 0; off < row_bytes; off += 64) {
			_mm_prefetch(k + off, _MM_HINT_T0);
			_mm_prefetch(v + off, _MM_HINT_T0);
		}
	}
}

AI void tile(const struct kva__tile *t, const enum kva_dtype dt, const int NC)
{
	const struct kva_kv_desc *kv = t->kv;
	const int G = t->group, D = NC * 8, P = kv->page_size;
	const size_t row_bytes = (size_t)D * kva_dtype_size(dt);
	_Alignas(32) float s[KVA__MAX_GROUP][KVA__BLOCK_TOKENS];
	const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	struct block bk;

	for (int g = 0; g < G; g++) {
		t->m[g] = -INFINITY;
		t->l[g] = 0.0f;
	}
	memset(t->acc, 0, sizeof(float) * (size_t)G * D);
	prefetch_rows(t, t->t0, t->t0 + KVA__BLOCK_TOKENS < t->t1 ? t->t0 + KVA__BLOCK_TOKENS : t->t1,
		      row_bytes);

	for (int32_t tb = t->t0; tb < t->t1; tb += KVA__BLOCK_TOKENS) {
		int32_t next = tb + KVA__BLOCK_TOKENS;
		int nv;

		bk.n = t->t1 - tb < KVA__BLOCK_TOKENS ? t->t1 - tb : KVA__BLOCK_TOKENS;
		nv = (bk.n + 7) / 8;
		for (int i = 0; i < bk.n; i++) {
			int32_t tok = tb + i, page = t->pages[tok / P];

			bk.k[i] = kva__row(t, kv->k, tok);
			bk.v[i] = kva__row(t, kv->v, tok);
			bk.ks[i] = kva__scale(kv, kv->k_scale, page, tok % P, t->kv_head);
			bk.vs[i] = kva__scale(kv, kv->v_scale, page, tok % P, t->kv_head);
		}
		for (int i = bk.n; i < nv * 8; i++)
			bk.vs[i] = 0.0f;
		if (next < t->t1)
			prefetch_rows(t, next,
				      next + KVA__BLOCK_TOKENS < t->t1 ? next + KVA__BLOCK_TOKENS : t->t1,
				      row_bytes);

		if (G == 1)
			for (int i = 0; i < bk.n; i += 8)
				score8(t, &bk, i, 0, s, dt, NC, 8, 1);
		else if (G == 2)
			for (int i = 0; i < bk.n; i += 4)
				score8(t, &bk, i, 0, s, dt, NC, 4, 2);
		else
			for (int i = 0; i < bk.n; i += 2)
				for (int g0 = 0; g0 < G; g0 += 4)
					score8(t, &bk, i, g0, s, dt, NC, 2, 4);

		for (int g = 0; g < G; g++) {
			__m256 sv[KVA__BLOCK_TOKENS / 8], mv = _mm256_set1_ps(-INFINITY), psum;
			float mb, r;

			for (int i = bk.n; i < nv * 8; i++)
				s[g][i] = -INFINITY;
			for (int j = 0; j < nv; j++) {
				sv[j] = _mm256_load_ps(s[g] + 8 * j);
				mv = _mm256_max_ps(mv, sv[j]);
			}
			mb = kva_max(t->m[g], hmax8(mv));
			r = kva_rescale(t->m[g], mb);
			if (r != 1.0f) {
				__m256 rv = _mm256_set1_ps(r);

				t->l[g] *= r;
				for (int c = 0; c < NC; c++) {
					float *o = t->acc + (size_t)g * D + c * 8;

					_mm256_storeu_ps(o, _mm256_mul_ps(_mm256_loadu_ps(o), rv));
				}
			}
			t->m[g] = mb;
			psum = _mm256_setzero_ps();
			for (int j = 0; j < nv; j++) {
				/* tokens past the block end are exactly 0 */
				__m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
					_mm256_set1_epi32(bk.n - 8 * j), lane));
				__m256 pj = _mm256_and_ps(live, exp2_ps(_mm256_sub_ps(sv[j],
										_mm256_set1_ps(mb))));

				psum = _mm256_add_ps(psum, pj);
				if (dt == KVA_FP8_E4M3 || dt == KVA_INT8)
					pj = _mm256_mul_ps(pj, _mm256_loadu_ps(bk.vs + 8 * j));
				_mm256_store_ps(s[g] + 8 * j, pj);
			}
			t->l[g] += hsum8(psum);
		}
		accumulate(t, &bk, s, dt, NC);
	}
}

#define FOR_NC(dt)                                                                            \
	switch (NC) {                                                                         \
	case 8: tile(t, dt, 8); return;                                                       \
	case 10: tile(t, dt, 10); return;                                                     \
	case 12: tile(t, dt, 12); return;                                                     \
	case 16: tile(t, dt, 16); return;                                                     \
	case 32: tile(t, dt, 32); return;                                                     \
	default: tile(t, dt, NC); return;                                                     \
	}

void kva__tile_avx2(const struct kva__tile *t)
{
	const int NC = t->kv->head_dim / 8;

	switch (t->kv->dtype) {
	case KVA_F32: FOR_NC(KVA_F32)
	case KVA_F16: FOR_NC(KVA_F16)
	case KVA_BF16: FOR_NC(KVA_BF16)
	case KVA_FP8_E4M3: FOR_NC(KVA_FP8_E4M3)
	case KVA_INT8: FOR_NC(KVA_INT8)
	}
}
