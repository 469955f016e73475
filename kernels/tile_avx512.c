/* SPDX-License-Identifier: MIT */
/*
 * tile_avx512.c - the decode tile with AVX-512 (head_dim a multiple of 16),
 * the same steps as tile_scalar.c, arranged to keep up with memory.
 *
 * Scores: a block of tokens x query heads is scored 16 dot products at a
 * time (16 tokens x 1 head, 8 x 2 or 4 x 4: each K chunk converted once is
 * used by the whole group), each dot accumulated in a zmm across head_dim and
 * the 16 reduced together by one transposed reduction (about 3 instructions
 * a score). Softmax: the block's scores are folded into the running max and
 * exponentiated 16 at a time (exp2 by a polynomial and vscalefps). Output:
 * each V chunk, converted once, is multiplied into every head's accumulator.
 * The next block's rows are prefetched while this one is computed (pages are
 * scattered, and the hardware prefetcher does not cross them), by the cursor
 * of kernels_pvt.h: a step every score16 and every ACC_STEP V rows of a part.
 */
#include <immintrin.h>

#include "kernels_pvt.h"
#include "load_x86.h"

#define AI __attribute__((always_inline)) static inline

/* V rows of a part between prefetch steps, so that the next block's lines
 * are asked for evenly over the output loop as over the scores (4 measured
 * slower; the first part alone every 4th row, 12% slower at group 4) */
#define ACC_STEP 8

/* lane i = the sum of v[i]'s 16 lanes */
AI __m512 reduce16(const __m512 v[16])
{
	__m512 a[8], b[4], c[2];

	for (int i = 0; i < 8; i++)
		a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
				     _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
	for (int i = 0; i < 4; i++)
		b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
				     _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
	for (int i = 0; i < 2; i++)
		c[i] = _mm512_add_ps(
			_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
			_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
	return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
			     _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/*
 * 2^x for x <= 0 (a score minus its running max): x = n + f, n an integer,
 * |f| <= 1/2; 2^f by its degree-7 Taylor polynomial (relative error below
 * 1e-8 there), times 2^n by vscalefps, which also takes 2^-150 to 0.
 */
AI __m512 exp2_ps(__m512 x)
{
	__m512 n, f, p;

	x = _mm512_max_ps(x, _mm512_set1_ps(-150.0f));
	n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	f = _mm512_sub_ps(x, n);
	p = _mm512_set1_ps(1.525273380405984e-05f);
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381608e-04f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-03f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-02f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-01f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-01f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
	return _mm512_scalef_ps(p, n);
}

/* the lanes below n (none for n <= 0) */
AI __mmask16 first(int n)
{
	return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/*
 * Score tokens [i, i + nt) x heads [g0, g0 + ng) of the block into s[g][i]:
 * up to TB * GB = 16 dot products, reduced together. Called with nt == TB
 * and ng == GB as constants for all but a block's last tile, so that the
 * loops unroll without a test.
 */
AI void score_body(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff, int i, int g0,
		   float s[][KVA__BLOCK_TOKENS], const enum kva_dtype dt, int NC,
		   const int GB, const int nt, const int ng)
{
	const int D = NC * 16;
	const size_t esize = kva__esize(dt);
	__m512 a[16], qv[4];
	float r[16];
	const char *kr[16];

	for (int j = 0; j < 16; j++)
		a[j] = _mm512_setzero_ps();
	/* each token's row of this head, once */
	for (int tt = 0; tt < nt; tt++)
		kr[tt] = bk->k[i + tt] + hoff;
	/* registers: 16 accumulators, GB query chunks, one K chunk */
	for (int c = 0; c < NC; c++) {
		for (int gg = 0; gg < ng; gg++)
			qv[gg] = _mm512_loadu_ps(t->q + (size_t)(g0 + gg) * D + c * 16);
		for (int tt = 0; tt < nt; tt++) {
			__m512 kc = kva__load16(kr[tt] + (size_t)c * 16 * esize, dt);

			for (int gg = 0; gg < ng; gg++)
				a[tt * GB + gg] = _mm512_fmadd_ps(kc, qv[gg], a[tt * GB + gg]);
		}
	}
	if (nt * ng == 16) {
		/* lane tt * GB + gg to lane gg * TB + tt: one permute, then
		 * each head's TB scores are one store */
		const int TB = 16 / GB;
		int32_t ix[16];
		__m512 v;

		for (int gg = 0; gg < GB; gg++)
			for (int tt = 0; tt < TB; tt++)
				ix[gg * TB + tt] = tt * GB + gg;
		v = _mm512_permutexvar_ps(_mm512_loadu_si512((const void *)ix), reduce16(a));
		if (GB == 1) {
			_mm512_storeu_ps(&s[g0][i], v);
		} else if (GB == 2) {
			_mm256_storeu_ps(&s[g0][i], _mm512_castps512_ps256(v));
			_mm256_storeu_ps(&s[g0 + 1][i], _mm512_extractf32x8_ps(v, 1));
		} else {
			_mm_storeu_ps(&s[g0][i], _mm512_castps512_ps128(v));
			_mm_storeu_ps(&s[g0 + 1][i], _mm512_extractf32x4_ps(v, 1));
			_mm_storeu_ps(&s[g0 + 2][i], _mm512_extractf32x4_ps(v, 2));
			_mm_storeu_ps(&s[g0 + 3][i], _mm512_extractf32x4_ps(v, 3));
		}
		return;
	}
	_mm512_storeu_ps(r, reduce16(a));
	for (int tt = 0; tt < nt; tt++)
		for (int gg = 0; gg < ng; gg++)
			s[g0 + gg][i + tt] = r[tt * GB + gg];
}

/* the tail of a block, or of a group of heads: one shared instance */
static __attribute__((noinline)) void score_tail(const struct kva__tile *t,
						 const struct kva__rows *bk, size_t hoff, int i,
						 int g0, float s[][KVA__BLOCK_TOKENS],
						 enum kva_dtype dt, int NC, int GB, int nt, int ng)
{
	score_body(t, bk, hoff, i, g0, s, dt, NC, GB, nt, ng);
}

AI void score16(const struct kva__tile *t, const struct kva__rows *bk, struct kva__pf *pf,
		size_t hoff, int i, int g0, float s[][KVA__BLOCK_TOKENS], const enum kva_dtype dt, int NC,
		const int TB, const int GB)
{
	const int nt = bk->n - i < TB ? bk->n - i : TB;
	const int ng = t->group - g0 < GB ? t->group - g0 : GB;

	if (g0 == 0)
		kva__pf_step(pf);
	if (nt == TB && ng == GB)
		score_body(t, bk, hoff, i, g0, s, dt, NC, GB, TB, GB);
	else if (nt == TB && GB == 4 && ng == 3) /* a group's last three heads */
		score_body(t, bk, hoff, i, g0, s, dt, NC, GB, TB, 3);
	else
		score_tail(t, bk, hoff, i, g0, s, dt, NC, GB, nt, ng);
}

/*
 * acc[g] += sum_t p[g][t] v[t] over the block. The accumulators of GB heads x
 * CG chunks of head_dim (16 zmm) stay in registers for the whole block; each
 * V chunk, converted once, feeds GB FMAs whose p comes from memory as an
 * embedded broadcast.
 */
AI void accumulate_body(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
			struct kva__pf *pf, float s[][KVA__BLOCK_TOKENS], int g0, int c0,
			const enum kva_dtype dt, int NC, const int CG, const int ng, const int nc)
{
	const int D = NC * 16;
	const size_t esize = kva__esize(dt);
	__m512 acc[16];

	for (int gg = 0; gg < ng; gg++)
		for (int cc = 0; cc < nc; cc++)
			acc[gg * CG + cc] = _mm512_loadu_ps(t->acc + (size_t)(g0 + gg) * D + (c0 + cc) * 16);
	for (int i = 0; i < bk->n; i++) {
		const char *row = bk->v[i] + hoff + (size_t)c0 * 16 * esize;

		/* one register, the chunks at displacements from it: left to
		 * itself, the compiler keeps hoff + chunk offset per chunk and
		 * spills them */
		__asm__("" : "+r"(row));

		if (i % ACC_STEP == 0)
			kva__pf_step(pf);

		for (int cc = 0; cc < nc; cc++) {
			__m512 vc = kva__load16(row + (size_t)cc * 16 * esize, dt);

			for (int gg = 0; gg < ng; gg++)
				acc[gg * CG + cc] = _mm512_fmadd_ps(_mm512_set1_ps(s[g0 + gg][i]), vc,
								    acc[gg * CG + cc]);
		}
	}
	for (int gg = 0; gg < ng; gg++)
		for (int cc = 0; cc < nc; cc++)
			_mm512_storeu_ps(t->acc + (size_t)(g0 + gg) * D + (c0 + cc) * 16,
					 acc[gg * CG + cc]);
}

/* one part whose chunk count is not CG (an odd head_dim): loops over
 * run-time counts; every other part, the group's last 1-3 heads included,
 * is a body with constant counts (accumulate_part) */
static __attribute__((noinline)) void accumulate_tail(const struct kva__tile *t,
						      const struct kva__rows *bk, size_t hoff,
						      struct kva__pf *pf,
						      float s[][KVA__BLOCK_TOKENS], int g0, int c0,
						      enum kva_dtype dt, int NC, int CG, int ng,
						      int nc)
{
	accumulate_body(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, ng, nc);
}

AI void accumulate_part(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
			struct kva__pf *pf, float s[][KVA__BLOCK_TOKENS], int g0, int c0,
			const enum kva_dtype dt, int NC, const int GB, const int CG)
{
	const int ng = t->group - g0 < GB ? t->group - g0 : GB;
	const int nc = NC - c0 < CG ? NC - c0 : CG;

	if (nc != CG)
		accumulate_tail(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, ng, nc);
	else if (ng == GB)
		accumulate_body(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, GB, CG);
	/* a group's last heads, fewer than GB: constants too (each test names
	 * GB, so that no instance is made for more heads than GB x CG holds) */
	else if (GB > 3 && ng == 3)
		accumulate_body(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, 3, CG);
	else if (GB > 2 && ng == 2)
		accumulate_body(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, 2, CG);
	else if (GB > 1 && ng == 1)
		accumulate_body(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, 1, CG);
	else
		accumulate_tail(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, ng, nc);
}

/* every part takes a prefetch step every ACC_STEP V rows */
AI void parts(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
	      struct kva__pf *pf, float s[][KVA__BLOCK_TOKENS], const enum kva_dtype dt,
	      int NC, const int GB, const int CG)
{
	for (int g0 = 0; g0 < t->group; g0 += GB)
		for (int c0 = 0; c0 < NC; c0 += CG)
			accumulate_part(t, bk, hoff, pf, s, g0, c0, dt, NC, GB, CG);
}

/*
 * The register tile (GB heads x CG chunks, at most 16 accumulators) fitted
 * to head_dim 64, 80, 96, 128 and 256, so that none of them runs the tail;
 * any other head_dim gets 1 x 16 or 4 x 4 and a tail where they do not fit.
 * Four heads a V chunk when the group has them: fewer conversions a byte.
 */
AI void accumulate(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
		   struct kva__pf *nx, float s[][KVA__BLOCK_TOKENS],
		   const enum kva_dtype dt, int NC)
{
	const int G = t->group;

	switch (NC) {
	case 4:
		if (G == 1)
			parts(t, bk, hoff, nx, s, dt, NC, 1, 4);
		else if (G == 2)
			parts(t, bk, hoff, nx, s, dt, NC, 2, 4);
		else
			parts(t, bk, hoff, nx, s, dt, NC, 4, 4);
		return;
	case 5:
		if (G == 1)
			parts(t, bk, hoff, nx, s, dt, NC, 1, 5);
		else
			parts(t, bk, hoff, nx, s, dt, NC, 2, 5);
		return;
	case 6:
		if (G == 1)
			parts(t, bk, hoff, nx, s, dt, NC, 1, 6);
		else
			parts(t, bk, hoff, nx, s, dt, NC, 2, 6);
		return;
	case 8:
		if (G == 1)
			parts(t, bk, hoff, nx, s, dt, NC, 1, 8);
		else if (G == 2)
			parts(t, bk, hoff, nx, s, dt, NC, 2, 8);
		else
			parts(t, bk, hoff, nx, s, dt, NC, 4, 4);
		return;
	case 16:
		if (G == 1)
			parts(t, bk, hoff, nx, s, dt, NC, 1, 16);
		else if (G == 2)
			parts(t, bk, hoff, nx, s, dt, NC, 2, 8);
		else
			parts(t, bk, hoff, nx, s, dt, NC, 4, 4);
		return;
	default:
		if (G == 1)
			parts(t, bk, hoff, nx, s, dt, NC, 1, 16);
		else
			parts(t, bk, hoff, nx, s, dt, NC, 4, 4);
		return;
	}
}

/* One KV head's turn at a block: score, fold into the softmax state, accumulate. */
AI void head_block(const struct kva__tile *t, const struct kva__rows *bk,
		   struct kva__pf *pf, int32_t tb, size_t hoff, const enum kva_dtype dt,
		   int NC)
{
	enum { NV = KVA__BLOCK_TOKENS / 16 };
	const int G = t->group, D = NC * 16;
	_Alignas(64) float s[KVA__MAX_GROUP][KVA__BLOCK_TOKENS];
	_Alignas(64) float ks[KVA__BLOCK_TOKENS], vs[KVA__BLOCK_TOKENS];

	if (dt == KVA_FP8_E4M3 || dt == KVA_INT8)
		kva__scales_at(t, tb, bk->n, t->kv_head, ks, vs);

	/*
	 * scores: 16 tokens x 1 head, 8 x 2 or 4 x 4 at a time; past 4 heads,
	 * 4 x 4 for each four (a last three as 4 x 3), and a last one or two
	 * heads as a group of one or two is scored. The prefetch steps go with
	 * the first loop (g0 == 0), whose length head_steps() counts.
	 */
	if (G == 1) {
		for (int i = 0; i < bk->n; i += 16)
			score16(t, bk, pf, hoff, i, 0, s, dt, NC, 16, 1);
	} else if (G == 2) {
		for (int i = 0; i < bk->n; i += 8)
			score16(t, bk, pf, hoff, i, 0, s, dt, NC, 8, 2);
	} else {
		const int rest = G % 4 == 3 ? 0 : G % 4;

		for (int i = 0; i < bk->n; i += 4)
			for (int g0 = 0; g0 < G - rest; g0 += 4)
				score16(t, bk, pf, hoff, i, g0, s, dt, NC, 4, 4);
		if (rest == 1)
			for (int i = 0; i < bk->n; i += 16)
				score16(t, bk, pf, hoff, i, G - 1, s, dt, NC, 16, 1);
		else if (rest == 2)
			for (int i = 0; i < bk->n; i += 8)
				score16(t, bk, pf, hoff, i, G - 2, s, dt, NC, 8, 2);
	}

	/* fold the block's scores, times the K scales, into each head's
	 * running state; s becomes p * (V scale), ready for accumulate() */
	for (int g = 0; g < G; g++) {
		__m512 sv[NV], mv = _mm512_set1_ps(-INFINITY), m, psum = _mm512_setzero_ps();
		float mb, r;

		for (int j = 0; j < NV; j++) {
			sv[j] = _mm512_mask_loadu_ps(mv, first(bk->n - 16 * j), s[g] + 16 * j);
			if (dt == KVA_FP8_E4M3 || dt == KVA_INT8) /* the K scales */
				sv[j] = _mm512_mask_mul_ps(sv[j], first(bk->n - 16 * j), sv[j],
							   _mm512_load_ps(ks + 16 * j));
		}
		for (int j = 0; j < NV; j++)
			mv = _mm512_max_ps(mv, sv[j]);
		mb = kva_max(t->m[g], _mm512_reduce_max_ps(mv));
		r = kva_rescale(t->m[g], mb);
		if (r != 1.0f) {
			__m512 rv = _mm512_set1_ps(r);

			t->l[g] *= r;
			for (int c = 0; c < NC; c++) {
				float *o = t->acc + (size_t)g * D + c * 16;

				_mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), rv));
			}
		}
		t->m[g] = mb;
		m = _mm512_set1_ps(mb);
		for (int j = 0; j < NV; j++) {
			/* tokens past the block end are exactly 0 */
			__m512 p = _mm512_maskz_mov_ps(first(bk->n - 16 * j),
						       exp2_ps(_mm512_sub_ps(sv[j], m)));

			psum = _mm512_add_ps(psum, p);
			if (dt == KVA_FP8_E4M3 || dt == KVA_INT8)
				p = _mm512_mul_ps(p, _mm512_load_ps(vs + 16 * j));
			_mm512_store_ps(s[g] + 16 * j, p);
		}
		t->l[g] += _mm512_reduce_add_ps(psum);
	}
	accumulate(t, bk, hoff, pf, s, dt, NC);
}

/* the parts accumulate() cuts a head's output into: its switch, restated */
static int acc_parts(int G, int NC)
{
	int GB, CG;

	switch (NC) {
	case 4: GB = G == 1 ? 1 : G == 2 ? 2 : 4; CG = 4; break;
	case 5: case 6: GB = G == 1 ? 1 : 2; CG = NC; break;
	case 8: GB = G == 1 ? 1 : G == 2 ? 2 : 4; CG = G <= 2 ? 8 : 4; break;
	case 16: GB = G == 1 ? 1 : G == 2 ? 2 : 4; CG = G == 1 ? 16 : G == 2 ? 8 : 4; break;
	default: GB = G == 1 ? 1 : 4; CG = G == 1 ? 16 : 4; break;
	}
	return (G + GB - 1) / GB * ((NC + CG - 1) / CG);
}

/* the prefetch steps of one head's turn at a block of n tokens: one a
 * score16, one every ACC_STEP V rows of each part */
static int head_steps(int G, int NC, int n)
{
	int tb = G == 1 ? 16 : G == 2 ? 8 : 4;

	return (n + tb - 1) / tb + acc_parts(G, NC) * ((n + ACC_STEP - 1) / ACC_STEP);
}

AI void tile(const struct kva__tile *t, const enum kva_dtype dt, int NC)
{
	const size_t row_bytes = (size_t)NC * 16 * kva__esize(dt);
	struct kva__blocks b;

	kva__blocks_begin(&b, t, row_bytes, t->heads * head_steps(t->group, NC, KVA__BLOCK_TOKENS),
			  false);
	for (int32_t tb = t->t0; tb < t->t1; tb += KVA__BLOCK_TOKENS) {
		const struct kva__rows *bk = kva__blocks_next(&b, t, tb);

		for (int h = 0; h < t->heads; h++) {
			struct kva__tile th;

			kva__tile_head(t, h, &th);
			head_block(&th, bk, &b.pf, tb, kva__head_offset(t->kv, h), dt, NC);
		}
		kva__pf_lines(&b.pf, -1); /* what the steps left, if the block was short */
	}
}

/* one instance per dtype and head_dim that matters, and a generic one */
/*
 * One instance per dtype (its conversion is in the innermost loops); head_dim
 * is a run-time count of 16-lane chunks: unrolling over it as well made the
 * code ten times larger for no speed that could be measured.
 */
void kva__tile_avx512(const struct kva__tile *t)
{
	const int NC = t->kv->head_dim / 16;

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
