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

/* blocks the prefetches run ahead of the compute (tile_avx512.c's reason) */
#define AHEAD 2

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

/* the rows AHEAD blocks on, a few at a time, every line, into L2 (tile_avx512.c) */
AI void prefetch(const char *const *rows, size_t hoff, const struct kva__rows *nx, int i, int n,
		 size_t row_bytes)
{
	for (int j = i; j < i + n && j < nx->n; j++)
		for (size_t off = 0; off < row_bytes; off += 64)
			_mm_prefetch(rows[j] + hoff + off, _MM_HINT_T1);
}

/* Score tokens [i, i + nt) x heads [g0, g0 + ng), at most 8, into s[g][i]. */
AI void score_body(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
		   const float *ks, int i, int g0, float s[][KVA__BLOCK_TOKENS],
		   const enum kva_dtype dt, int NC, const int GB, const int nt, const int ng)
{
	const int D = NC * 8;
	const size_t esize = kva__esize(dt);
	__m256 a[8], qv[4];
	float r[8];
	const char *kr[8];

	for (int j = 0; j < 8; j++)
		a[j] = _mm256_setzero_ps();
	/* each token's row of this head, once */
	for (int tt = 0; tt < nt; tt++)
		kr[tt] = bk->k[i + tt] + hoff;
	/* registers: 8 accumulators, GB query chunks, one K chunk */
	for (int c = 0; c < NC; c++) {
		for (int gg = 0; gg < ng; gg++)
			qv[gg] = _mm256_loadu_ps(t->q + (size_t)(g0 + gg) * D + c * 8);
		for (int tt = 0; tt < nt; tt++) {
			__m256 kc = load8(kr[tt] + (size_t)c * 8 * esize, dt);

			for (int gg = 0; gg < ng; gg++)
				a[tt * GB + gg] = _mm256_fmadd_ps(kc, qv[gg], a[tt * GB + gg]);
		}
	}
	_mm256_storeu_ps(r, reduce8(a));
	for (int tt = 0; tt < nt; tt++)
		for (int gg = 0; gg < ng; gg++)
			s[g0 + gg][i + tt] = dt == KVA_FP8_E4M3 || dt == KVA_INT8
						     ? r[tt * GB + gg] * ks[i + tt] : r[tt * GB + gg];
}

/* the tail of a block, or of a group of heads: one shared instance */
static __attribute__((noinline)) void score_tail(const struct kva__tile *t,
						 const struct kva__rows *bk, size_t hoff,
						 const float *ks, int i, int g0,
						 float s[][KVA__BLOCK_TOKENS], enum kva_dtype dt,
						 int NC, int GB, int nt, int ng)
{
	score_body(t, bk, hoff, ks, i, g0, s, dt, NC, GB, nt, ng);
}

AI void score8(const struct kva__tile *t, const struct kva__rows *bk, const struct kva__rows *nx,
	       size_t hoff, const float *ks, int i, int g0, float s[][KVA__BLOCK_TOKENS],
	       const enum kva_dtype dt, int NC, const int TB, const int GB)
{
	const int nt = bk->n - i < TB ? bk->n - i : TB;
	const int ng = t->group - g0 < GB ? t->group - g0 : GB;

	if (g0 == 0)
		prefetch(nx->k, hoff, nx, i, TB, (size_t)NC * 8 * kva__esize(dt));
	if (nt == TB && ng == GB)
		score_body(t, bk, hoff, ks, i, g0, s, dt, NC, GB, TB, GB);
	else
		score_tail(t, bk, hoff, ks, i, g0, s, dt, NC, GB, nt, ng);
}

/* acc[g] += sum_t p[g][t] v[t] for ng heads x nc chunks kept in registers */
AI void accumulate_body(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
			const struct kva__rows *pf, float s[][KVA__BLOCK_TOKENS], int g0, int c0,
			const enum kva_dtype dt, int NC, const int CG, const int ng, const int nc)
{
	const int D = NC * 8;
	const size_t esize = kva__esize(dt);
	__m256 acc[8];

	for (int gg = 0; gg < ng; gg++)
		for (int cc = 0; cc < nc; cc++)
			acc[gg * CG + cc] = _mm256_loadu_ps(t->acc + (size_t)(g0 + gg) * D + (c0 + cc) * 8);
	for (int i = 0; i < bk->n; i++) {
		const char *row = bk->v[i] + hoff + (size_t)c0 * 8 * esize;

		/* one register, the chunks at displacements from it: left to
		 * itself, the compiler keeps hoff + chunk offset per chunk and
		 * spills them */
		__asm__("" : "+r"(row));

		if (pf)
			prefetch(pf->v, hoff, pf, i, 1, (size_t)D * esize);
		for (int cc = 0; cc < nc; cc++) {
			__m256 vc = load8(row + (size_t)cc * 8 * esize, dt);

			for (int gg = 0; gg < ng; gg++)
				acc[gg * CG + cc] = _mm256_fmadd_ps(_mm256_broadcast_ss(&s[g0 + gg][i]), vc,
								    acc[gg * CG + cc]);
		}
	}
	for (int gg = 0; gg < ng; gg++)
		for (int cc = 0; cc < nc; cc++)
			_mm256_storeu_ps(t->acc + (size_t)(g0 + gg) * D + (c0 + cc) * 8,
					 acc[gg * CG + cc]);
}

static __attribute__((noinline)) void accumulate_tail(const struct kva__tile *t,
						      const struct kva__rows *bk, size_t hoff,
						      const struct kva__rows *pf,
						      float s[][KVA__BLOCK_TOKENS], int g0, int c0,
						      enum kva_dtype dt, int NC, int CG, int ng,
						      int nc)
{
	accumulate_body(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, ng, nc);
}

AI void accumulate_part(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
			const struct kva__rows *pf, float s[][KVA__BLOCK_TOKENS], int g0, int c0,
			const enum kva_dtype dt, int NC, const int GB, const int CG)
{
	const int ng = t->group - g0 < GB ? t->group - g0 : GB;
	const int nc = NC - c0 < CG ? NC - c0 : CG;

	if (ng == GB && nc == CG)
		accumulate_body(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, GB, CG);
	else
		accumulate_tail(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, ng, nc);
}

/* the V rows of block @pf are prefetched token by token in the first part */
AI void parts(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
	      const struct kva__rows *pf, float s[][KVA__BLOCK_TOKENS], const enum kva_dtype dt,
	      int NC, const int GB, const int CG)
{
	for (int g0 = 0; g0 < t->group; g0 += GB)
		for (int c0 = 0; c0 < NC; c0 += CG)
			accumulate_part(t, bk, hoff, g0 == 0 && c0 == 0 ? pf : NULL, s, g0, c0, dt,
					NC, GB, CG);
}

/* 8 accumulators: 1 head x 8 chunks, 2 x 4, or 4 x 2 */
AI void accumulate(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
		   const struct kva__rows *pf, float s[][KVA__BLOCK_TOKENS],
		   const enum kva_dtype dt, int NC)
{
	const int G = t->group;

	if (G == 1)
		parts(t, bk, hoff, pf, s, dt, NC, 1, 8);
	else if (G == 2)
		parts(t, bk, hoff, pf, s, dt, NC, 2, 4);
	else
		parts(t, bk, hoff, pf, s, dt, NC, 4, 2);
}

/* One KV head's turn at a block: score, fold into the softmax state, accumulate. */
AI void head_block(const struct kva__tile *t, const struct kva__rows *bk,
		   const struct kva__rows *nx, int32_t tb, size_t hoff, const enum kva_dtype dt,
		   int NC)
{
	const int G = t->group, D = NC * 8;
	const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	_Alignas(32) float s[KVA__MAX_GROUP][KVA__BLOCK_TOKENS];
	_Alignas(32) float ks[KVA__BLOCK_TOKENS], vs[KVA__BLOCK_TOKENS];
	int nv = (bk->n + 7) / 8;

	if (dt == KVA_FP8_E4M3 || dt == KVA_INT8)
		kva__scales_at(t, tb, bk->n, t->kv_head, ks, vs);
	if (G == 1)
		for (int i = 0; i < bk->n; i += 8)
			score8(t, bk, nx, hoff, ks, i, 0, s, dt, NC, 8, 1);
	else if (G == 2)
		for (int i = 0; i < bk->n; i += 4)
			score8(t, bk, nx, hoff, ks, i, 0, s, dt, NC, 4, 2);
	else
		for (int i = 0; i < bk->n; i += 2)
			for (int g0 = 0; g0 < G; g0 += 4)
				score8(t, bk, nx, hoff, ks, i, g0, s, dt, NC, 2, 4);

	for (int g = 0; g < G; g++) {
		__m256 sv[KVA__BLOCK_TOKENS / 8], mv = _mm256_set1_ps(-INFINITY), psum;
		float mb, r;

		for (int i = bk->n; i < nv * 8; i++)
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
				_mm256_set1_epi32(bk->n - 8 * j), lane));
			__m256 pj = _mm256_and_ps(live, exp2_ps(_mm256_sub_ps(sv[j],
									_mm256_set1_ps(mb))));

			psum = _mm256_add_ps(psum, pj);
			if (dt == KVA_FP8_E4M3 || dt == KVA_INT8)
				pj = _mm256_mul_ps(pj, _mm256_load_ps(vs + 8 * j));
			_mm256_store_ps(s[g] + 8 * j, pj);
		}
		t->l[g] += hsum8(psum);
	}
	accumulate(t, bk, hoff, nx, s, dt, NC);
}

AI void tile(const struct kva__tile *t, const enum kva_dtype dt, int NC)
{
	const int D = NC * 8, H = t->heads;
	const size_t row_bytes = (size_t)D * kva__esize(dt);
	struct kva__rows rows[AHEAD + 1];
	int k = 0;

	for (int g = 0; g < H * t->group; g++) {
		t->m[g] = -INFINITY;
		t->l[g] = 0.0f;
	}
	memset(t->acc, 0, sizeof(float) * (size_t)H * t->group * D);
	for (int a = 0; a < AHEAD; a++) {
		kva__rows_at(t, t->t0 + a * KVA__BLOCK_TOKENS, &rows[a]);
		for (int h = 0; h < H; h++) {
			prefetch(rows[a].k, kva__head_offset(t->kv, h), &rows[a], 0, rows[a].n, row_bytes);
			prefetch(rows[a].v, kva__head_offset(t->kv, h), &rows[a], 0, rows[a].n, row_bytes);
		}
	}

	for (int32_t tb = t->t0; tb < t->t1; tb += KVA__BLOCK_TOKENS, k++) {
		const struct kva__rows *bk = &rows[k % (AHEAD + 1)];
		struct kva__rows *nx = &rows[(k + AHEAD) % (AHEAD + 1)];

		/* n = 0 past the end */
		kva__rows_at(t, tb + AHEAD * KVA__BLOCK_TOKENS, nx);
		for (int h = 0; h < H; h++) {
			struct kva__tile th;

			kva__tile_head(t, h, &th);
			head_block(&th, bk, nx, tb, kva__head_offset(t->kv, h), dt, NC);
		}
	}
}

/*
 * One instance per dtype (its conversion is in the innermost loops); head_dim
 * is a run-time count of 8-lane chunks: unrolling over it as well made the
 * code ten times larger for no speed that could be measured.
 */
void kva__tile_avx2(const struct kva__tile *t)
{
	const int NC = t->kv->head_dim / 8;

	switch (t->kv->dtype) {
	case KVA_F32:
		tile(t, KVA_F32, NC);
		return;
	case KVA_F16:
		tile(t, KVA_F16, NC);
		return;
	case KVA_BF16:
		tile(t, KVA_BF16, NC);
		return;
	case KVA_FP8_E4M3:
		tile(t, KVA_FP8_E4M3, NC);
		return;
	case KVA_INT8:
		tile(t, KVA_INT8, NC);
		return;
	}
}
