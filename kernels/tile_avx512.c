/* SPDX-License-Identifier: MIT */
/*
 * tile_avx512.c - the decode tile with AVX-512 (head_dim a multiple of 16),
 * the same steps as tile_scalar.c, arranged to keep up with memory.
 *
 * Groups of 3 to 16 query heads (head_dim up to 256), but those whose pad
 * heads would be more than a quarter of the padded group (5, 9-11:
 * kva__avx512_gp), score sliced (sl_block below): each K element
 * converted once for the whole group, W = 16 / GP
 * consecutive elements of a row broadcast to every head, no dot-product
 * reductions; their softmax runs lane by lane over every head at once, and
 * the output takes every head of the group for each V chunk converted. On
 * Zen 5 groups 3 and 4 score as dot products instead, into the same lanes
 * (g4_scores, kva__sl_dot).
 *
 * Groups of 1, 2, 5, 9-11 (and past 16) score dot products: a block of
 * tokens x query heads 16 at a time (16 tokens x 1 head, 8 x 2 or 4 x 4: each K
 * chunk converted once is used by the whole group), each dot accumulated
 * in a zmm across head_dim and the 16 reduced together by one transposed
 * reduction (about 3 instructions a score). Softmax: the block's scores
 * are folded into each head's running max and exponentiated 16 at a time
 * (exp2 by a polynomial and vscalefps). Output: each V chunk, converted
 * once, is multiplied into every head's accumulator. On Zen 5 groups 5,
 * 9-11 and past 16 run as subgroups instead (head_block,
 * kva__avx512_sub): 16, 8 or 4 heads sliced, then the rest (a group of 1
 * or 2 as dot products, or of 3 sliced), one after the other over the
 * same rows; a last one or two heads after a sliced 4 (groups 5, 21, and
 * 6 at elements of up to 2 bytes), 8 or 16 (9, 10, 17, 18: tile
 * instances of their own, rider_turn) run inside its block instead, on
 * the chunks it converts (sl_block's X).
 *
 * The next turn's rows (a head's at a block, kernels_pvt.h) are prefetched
 * while this one is computed (pages are scattered, and the hardware
 * prefetcher does not cross them), by the cursor of kernels_pvt.h, as in
 * the AVX2 tile: paired on Intel Xeon family 6 model 207 against a block
 * ahead (what this tile took before), out of cache, 2 threads, one run in
 * each order: group 1 1.09-1.10x as fast, 4 1.11-1.13x, 8 1.08-1.12x, 16
 * 1.11x (doc/figures.md, twenty-fourth session).
 */
#include <immintrin.h>

#include "kernels_pvt.h"
#include "load_x86.h"

#define AI __attribute__((always_inline)) static inline

/*
 * The dot products' prefetch steps: for groups of 1 and 2 at head_dim 64
 * and 128, inline (kva__pfq_step, the turn's runs listed) at each K chunk
 * of the scores and each V row of the output; in the generic instance
 * (more heads, 4 x 4 tiles: groups 5 and 9-11 where not subgroups,
 * kva__avx512_sub; other head_dims) the
 * cursor's call (kva__pf_step) once a score16 and every ACC_STEP V rows of
 * each part, as before (every 4 rows measured slower). Paired on Intel
 * Xeon family 6 model 207 (AVX-512, out of cache, f16), the inline steps
 * read groups 1 and 2 1.04-1.11x as fast as the calls, groups 5, 9 and 11
 * 0.93-1.02, finer or not (doc/figures.md, twenty-seventh session).
 */
#define ACC_STEP 8

/*
 * The lines an inline step asks for: three quarters of the lines it reads
 * (@bytes: a K chunk of the score16's rows, or a V row's chunks), rounded,
 * so that the next turn's lines are asked for a little slower than this
 * turn's are read, and the last quarter at the turn's end (kva__pfq_end).
 * The steps had asked for the turn's lines spread evenly (the cursor's
 * per, a quarter above the lines at f16 head_dim 128: its count allows a
 * line more a row): 7 lines at every step where a K chunk reads 8 and a V
 * row 4, so 1.75 lines asked for each line read through the output loop,
 * whose V loads were where the samples stalled out of cache. Paired on
 * Zen 5 (AMD EPYC family 26 model 2, AVX-512, 2 threads, out of cache,
 * f16 head_dim 128), three quarters read group 1 1.05-1.20x and group 2
 * 1.17-1.33x as fast as the even spread; a step's own lines (all of them)
 * 1.07-1.08x and 1.09-1.13x, half 1.18x and 1.16x; head_dim 64, f32,
 * bf16, int8 and NHD pages 1.03-1.14x, fp8 1.00-1.01, one thread 1.18x,
 * in L3 1.06x, one page 0.94-1.29 (noise) (doc/figures.md, twenty-ninth session).
 * The AVX2 tile's steps taken the same way gained out of cache but lost
 * in cache and on fp8: not taken there (README, the tried list).
 */
AI int dot_ask(size_t bytes)
{
	const int lines = (int)((bytes + 63) / 64);

	return (3 * lines + 2) / 4;
}

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
 * 1e-8 there), times 2^n by vscalefps. Below -126 (-inf: a masked lane or
 * a pad head's, and NaN) it is 0, and the lanes of such x are masked off
 * the scalef: a result below 2^-126 is a denormal, which Intel cores make
 * with a microcode assist of the whole instruction. With x clamped at
 * -150 and scalef's 2^-150 as the zero, the sliced groups with pad heads
 * (then 3, 5-7, 9-15: every exponentiated vector has a lane of one) ran
 * 1.6-1.8x as long as the dot-product tile on Intel Xeon family 6 model 207
 * (doc/figures.md, twenty-fifth session). From -126 up, n >= -126 and f >= 0
 * where n = -126, so the result is a normal number.
 */
AI __m512 exp2_ps(__m512 x)
{
	const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
	__m512 n, f, p;

	x = _mm512_max_ps(x, _mm512_set1_ps(-126.0f));
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
	return _mm512_maskz_scalef_ps(live, p, n);
}

/* the lanes below n (none for n <= 0) */
AI __mmask16 first(int n)
{
	return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/*
 * Head @g's block of dot-product scores (token i's at sg[i], n of them),
 * times the K scales @ks (fp8, int8), folded into its running state (m,
 * l, its accumulators rescaled where the maximum moved); sg becomes p
 * times the V scales @vs, ready for the output.
 */
AI void dot_fold(const struct kva__tile *t, int g, float *sg, int n, const float *ks,
		 const float *vs, const enum kva_dtype dt, int NC)
{
	enum { NV = KVA__BLOCK_TOKENS / 16 };
	const int D = NC * 16;
	const bool scaled = dt == KVA_FP8_E4M3 || dt == KVA_INT8;
	__m512 sv[NV], mv = _mm512_set1_ps(-INFINITY), m, psum = _mm512_setzero_ps();
	float mb, r;

	for (int j = 0; j < NV; j++) {
		sv[j] = _mm512_mask_loadu_ps(mv, first(n - 16 * j), sg + 16 * j);
		if (scaled) /* the K scales */
			sv[j] = _mm512_mask_mul_ps(sv[j], first(n - 16 * j), sv[j],
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
		__m512 p = _mm512_maskz_mov_ps(first(n - 16 * j), exp2_ps(_mm512_sub_ps(sv[j], m)));

		psum = _mm512_add_ps(psum, p);
		if (scaled)
			p = _mm512_mul_ps(p, _mm512_load_ps(vs + 16 * j));
		_mm512_store_ps(sg + 16 * j, p);
	}
	t->l[g] += _mm512_reduce_add_ps(psum);
}

/*
 * Score tokens [i, i + nt) x heads [g0, g0 + ng) of the block into s[g][i]:
 * up to TB * GB = 16 dot products, reduced together. Called with nt == TB
 * and ng == GB as constants for all but a block's last tile, so that the
 * loops unroll without a test.
 */
AI void score_body(const struct kva__tile *t, const struct kva__rows *bk, struct kva__pfq *pf,
		   size_t hoff, int i, int g0,
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
		if (pf) /* a step a chunk (else a call a score16) */
			kva__pfq_step(pf, dot_ask((size_t)nt * 16 * esize));
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
	score_body(t, bk, NULL, hoff, i, g0, s, dt, NC, GB, nt, ng);
}

AI void score16(const struct kva__tile *t, const struct kva__rows *bk, struct kva__pf *cur,
		struct kva__pfq *pf,
		size_t hoff, int i, int g0, float s[][KVA__BLOCK_TOKENS], const enum kva_dtype dt, int NC,
		const int TB, const int GB)
{
	const int nt = bk->n - i < TB ? bk->n - i : TB;
	const int ng = t->group - g0 < GB ? t->group - g0 : GB;

	/* the prefetch steps with the first heads' scores (head_steps) */
	if (g0)
		pf = NULL;
	else if (!pf)
		kva__pf_step(cur);
	if (nt == TB && ng == GB)
		score_body(t, bk, pf, hoff, i, g0, s, dt, NC, GB, TB, GB);
	else if (nt == TB && GB == 4 && ng == 3) /* a group's last three heads */
		score_body(t, bk, pf, hoff, i, g0, s, dt, NC, GB, TB, 3);
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
			struct kva__pf *cur, struct kva__pfq *pf, float s[][KVA__BLOCK_TOKENS],
			int g0, int c0,
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

		if (pf) /* a step a row, inline, or a call every ACC_STEP */
			kva__pfq_step(pf, dot_ask((size_t)nc * 16 * esize));
		else if (i % ACC_STEP == 0)
			kva__pf_step(cur);

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
						      struct kva__pf *cur,
						      float s[][KVA__BLOCK_TOKENS], int g0, int c0,
						      enum kva_dtype dt, int NC, int CG, int ng,
						      int nc)
{
	accumulate_body(t, bk, hoff, cur, NULL, s, g0, c0, dt, NC, CG, ng, nc);
}

AI void accumulate_part(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
			struct kva__pf *cur, struct kva__pfq *pf, float s[][KVA__BLOCK_TOKENS],
			int g0, int c0, const enum kva_dtype dt, int NC, const int GB, const int CG)
{
	const int ng = t->group - g0 < GB ? t->group - g0 : GB;
	const int nc = NC - c0 < CG ? NC - c0 : CG;

	if (nc != CG)
		accumulate_tail(t, bk, hoff, cur, s, g0, c0, dt, NC, CG, ng, nc);
	else if (ng == GB)
		accumulate_body(t, bk, hoff, cur, pf, s, g0, c0, dt, NC, CG, GB, CG);
	/* a group's last heads, fewer than GB: constants too (each test names
	 * GB, so that no instance is made for more heads than GB x CG holds) */
	else if (GB > 3 && ng == 3)
		accumulate_body(t, bk, hoff, cur, pf, s, g0, c0, dt, NC, CG, 3, CG);
	else if (GB > 2 && ng == 2)
		accumulate_body(t, bk, hoff, cur, pf, s, g0, c0, dt, NC, CG, 2, CG);
	else if (GB > 1 && ng == 1)
		accumulate_body(t, bk, hoff, cur, pf, s, g0, c0, dt, NC, CG, 1, CG);
	else
		accumulate_tail(t, bk, hoff, cur, s, g0, c0, dt, NC, CG, ng, nc);
}

/* every part takes a prefetch step a V row (groups 1 and 2), or every ACC_STEP */
AI void parts(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
	      struct kva__pf *cur, struct kva__pfq *pf, float s[][KVA__BLOCK_TOKENS],
	      const enum kva_dtype dt, int NC, const int GB, const int CG)
{
	for (int g0 = 0; g0 < t->group; g0 += GB)
		for (int c0 = 0; c0 < NC; c0 += CG)
			accumulate_part(t, bk, hoff, cur, pf, s, g0, c0, dt, NC, GB, CG);
}

/*
 * The register tile (GB heads x CG chunks, at most 16 accumulators) fitted
 * to head_dim 64, 80, 96, 128 and 256, so that none of them runs the tail;
 * any other head_dim gets 1 x 16 or 4 x 4 and a tail where they do not fit.
 * Four heads a V chunk when the group has them: fewer conversions a byte.
 */
AI void accumulate(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
		   struct kva__pf *cur, struct kva__pfq *nx, float s[][KVA__BLOCK_TOKENS],
		   const enum kva_dtype dt, int NC, const bool ALL)
{
	const int G = t->group;

	/* groups of 3 or more take the dot products only in the generic
	 * instance (tile_any below): the others take only the groups
	 * tile_fits() lets in, sliced from 3 on (never here) */
	if (!ALL && G > 2)
		return;

	switch (NC) {
	case 4:
		if (G == 1)
			parts(t, bk, hoff, cur, nx, s, dt, NC, 1, 4);
		else if (G == 2)
			parts(t, bk, hoff, cur, nx, s, dt, NC, 2, 4);
		else
			parts(t, bk, hoff, cur, nx, s, dt, NC, 4, 4);
		return;
	case 5:
		if (G == 1)
			parts(t, bk, hoff, cur, nx, s, dt, NC, 1, 5);
		else
			parts(t, bk, hoff, cur, nx, s, dt, NC, 2, 5);
		return;
	case 6:
		if (G == 1)
			parts(t, bk, hoff, cur, nx, s, dt, NC, 1, 6);
		else
			parts(t, bk, hoff, cur, nx, s, dt, NC, 2, 6);
		return;
	case 8:
		if (G == 1)
			parts(t, bk, hoff, cur, nx, s, dt, NC, 1, 8);
		else if (G == 2)
			parts(t, bk, hoff, cur, nx, s, dt, NC, 2, 8);
		else
			parts(t, bk, hoff, cur, nx, s, dt, NC, 4, 4);
		return;
	case 16:
		if (G == 1)
			parts(t, bk, hoff, cur, nx, s, dt, NC, 1, 16);
		else if (G == 2)
			parts(t, bk, hoff, cur, nx, s, dt, NC, 2, 8);
		else
			parts(t, bk, hoff, cur, nx, s, dt, NC, 4, 4);
		return;
	default:
		if (G == 1)
			parts(t, bk, hoff, cur, nx, s, dt, NC, 1, 16);
		else
			parts(t, bk, hoff, cur, nx, s, dt, NC, 4, 4);
		return;
	}
}

/* ------------------------------------------- sliced scores: groups 3 to 16 */

/*
 * A group of 3 to 16 query heads, padded to GP = 4, 8 or 16 (kva__avx512_gp):
 * each zmm of score sums is one token's GP heads x W = 16 / GP slices of
 * head_dim, lane g * W + j summing q[g][d] k[d] over the
 * d = j mod W. One FMA takes W consecutive elements of the token's K row,
 * repeated over the zmm (vbroadcastss, vbroadcastsd, vbroadcastf32x4: a
 * load, no shuffle), times a row of q laid out to match (decode.c:
 * [head_dim / W][16]). So each K element is converted once for every head
 * of the group (into 12 rows of fp32 on the stack, then read from L1), and
 * a score costs log2(W) shuffles to fold its slices, where a dot product's
 * 16 lanes took about 2 (30 for 16 scores) on the port the FMAs share.
 *
 * Why: on a core where a zmm conversion takes both FMA ports for a cycle
 * (Intel Xeon family 6 model 207, AVX-512), the dot products' 4 x 4 shapes
 * converted each K and V element twice at group 8 and spent a third of
 * the FMAs' time again on reductions. In a throwaway loop over one block
 * in L1 (gcc -O3, the same core), scores at group 8 took 16.4 ns a token
 * against 24.1, at group 4 9.8 against 11.6; the output with each V chunk
 * converted once for 8 heads (8 x 2 accumulators, below) 15.3 against 18.2.
 *
 * A block's scores, folded, are W tokens x GP heads a vector: token tt's
 * head g in lane sl_lane(tt, g), vector i / W for token i, and stay so
 * through the softmax (lane by lane, every head at once), into p, which
 * the output broadcasts from there. Pad heads (g >= group) have q 0 and
 * are masked to p = 0; their accumulators are never loaded or stored.
 */
#define SL_TB 12 /* tokens a pass over q: 12 accumulators */
_Static_assert(KVA__BLOCK_TOKENS % SL_TB == 0, "a block is whole 12-token passes");

/*
 * The prefetch sites (kva__pfq_site): every S-th iteration of the scores'
 * loop over q's rows (4 D / W a 48-token turn) and of the output's over
 * the tokens (3 D / W), L lines each, for a turn's 2 x 48 x D x esize / 64
 * lines: 0.21 W esize a site, and L / S an eighth or more above it, so that
 * the lines are asked for evenly through the turn and all of them by its
 * last output pass (whatever is left, kva__pfq_end asks for at the end).
 */
AI int sl_pf_lines(const int W, size_t esize)
{
	return W * (int)esize >= 16 ? 4 : W * (int)esize >= 8 ? 2 : 1;
}

AI int sl_pf_every(const int W, size_t esize)
{
	return W * (int)esize >= 4 ? 1 : W * (int)esize >= 2 ? 2 : 4;
}

/* lane of token tt (of W) and head g (of 16 / W) in a folded score vector */
AI int sl_lane(int tt, int g, const int W)
{
	return W == 1 ? g : W == 2 ? 4 * (g >> 1) + 2 * tt + (g & 1) : 4 * g + tt;
}

/* the head of lane l: sl_lane's inverse */
AI int sl_head(int l, const int W)
{
	return W == 1 ? l : W == 2 ? 2 * (l >> 2) + (l & 1) : l >> 2;
}

/* lane -> its head: the index vector that spreads a head-major vector over
 * the lanes, and lane of token 0 of each head: the one that gathers it back */
AI __m512i sl_heads(const int W)
{
	int32_t ix[16];

	for (int l = 0; l < 16; l++)
		ix[l] = sl_head(l, W);
	return _mm512_loadu_si512((const void *)ix);
}

AI __m512i sl_firsts(const int W)
{
	int32_t ix[16];

	for (int g = 0; g < 16; g++)
		ix[g] = g < 16 / W ? sl_lane(0, g, W) : 0;
	return _mm512_loadu_si512((const void *)ix);
}

/* lanes of tokens below m (1..W) of a vector */
AI __mmask16 sl_tokens(int m, const int W)
{
	if (W == 1 || m >= W)
		return 0xffff;
	if (W == 2)
		return 0x3333; /* m == 1: tt 0 is bit 1 of the lane clear */
	return m == 1 ? 0x1111 : m == 2 ? 0x3333 : 0x7777;
}

/* W consecutive floats at p, repeated over 16 lanes */
AI __m512 sl_bcast(const float *p, const int W)
{
	if (W == 1)
		return _mm512_broadcastss_ps(_mm_load_ss(p));
	if (W == 2)
		return _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_load_sd((const double *)(const void *)p)));
	return _mm512_broadcast_f32x4(_mm_loadu_ps(p));
}

/* x folded over each head's W token lanes: in every lane, the max (@max)
 * or the sum of its head's W; a head's token lanes are lane ^ 2 (W 2) and
 * lane ^ 1, ^ 2 (W 4) within 128 bits */
AI __m512 sl_fold_op(__m512 a, __m512 b, const bool max)
{
	return max ? _mm512_max_ps(a, b) : _mm512_add_ps(a, b);
}

AI __m512 sl_fold(__m512 x, const int W, const bool max)
{
	if (W == 4)
		x = sl_fold_op(x, _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)), max);
	if (W >= 2)
		x = sl_fold_op(x, _mm512_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)), max);
	return x;
}

/* per-token scales x[] (kva__scales_at) in the lanes of vector k's tokens */
AI __m512 sl_token_scales(const float *x, int k, const int W)
{
	if (W == 1)
		return _mm512_set1_ps(x[k]);
	if (W == 2) /* lane l's token is bit 1 of l */
		return _mm512_permute_ps(_mm512_castpd_ps(_mm512_broadcastsd_pd(
						 _mm_load_sd((const double *)(const void *)(x + 2 * k)))),
					 _MM_SHUFFLE(1, 1, 0, 0));
	return _mm512_broadcast_f32x4(_mm_loadu_ps(x + 4 * k)); /* bits 0-1 */
}

/*
 * Scores of tokens [i, i + 12) of the block into vectors i / W.. of s (a
 * row past the block's end is its first row again, which the softmax
 * masks): the 12 K rows converted into kf, then one pass over q, each q row
 * loaded once for the 12 tokens.
 */
AI void sl_scores(const struct kva__tile *t, const struct kva__rows *bk, struct kva__pfq *pq,
		  size_t hoff, int i, float *s, float *kf, const float *xq, float *u,
		  const enum kva_dtype dt, int NC, const int W, const int X)
{
	const int D = NC * 16;
	const size_t esize = kva__esize(dt);
	const float *qb = t->q;
	__m512 a[SL_TB];

	for (int j = 0; j < SL_TB; j++) {
		const char *row = bk->k[i + j < bk->n ? i + j : 0] + hoff;

		for (int c = 0; c < NC; c++)
			_mm512_store_ps(kf + j * D + c * 16, kva__load16(row + (size_t)c * 16 * esize, dt));
	}
	for (int j = 0; j < SL_TB; j++)
		a[j] = _mm512_setzero_ps();
	for (int d = 0; d < D; d += W, qb += 16) {
		const __m512 q = _mm512_load_ps(qb);

		if (d / W % sl_pf_every(W, esize) == 0)
			kva__pfq_site(pq, sl_pf_lines(W, esize));
		for (int j = 0; j < SL_TB; j++)
			a[j] = _mm512_fmadd_ps(sl_bcast(kf + j * D + d, W), q, a[j]);
	}
	/* fold the slices: W tokens' GP heads a vector */
	s += (size_t)(i / W) * 16;
	if (W == 1) {
		for (int j = 0; j < SL_TB; j++)
			_mm512_store_ps(s + 16 * j, a[j]);
	} else if (W == 2) {
		/* in each 128-bit lane (heads 2L, 2L + 1, a slice pair each),
		 * token j's pairs summed, then token j + 1's */
		for (int j = 0; j < SL_TB; j += 2)
			_mm512_store_ps(s + 8 * j, _mm512_add_ps(
				_mm512_shuffle_ps(a[j], a[j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
				_mm512_shuffle_ps(a[j], a[j + 1], _MM_SHUFFLE(3, 1, 3, 1))));
	} else {
		/* a 128-bit lane is one head's 4 slices: 4 tokens' sums of them */
		for (int j = 0; j < SL_TB; j += 4) {
			__m512 x0 = _mm512_add_ps(_mm512_unpacklo_ps(a[j], a[j + 1]),
						  _mm512_unpackhi_ps(a[j], a[j + 1]));
			__m512 x1 = _mm512_add_ps(_mm512_unpacklo_ps(a[j + 2], a[j + 3]),
						  _mm512_unpackhi_ps(a[j + 2], a[j + 3]));
			__m512d y0 = _mm512_castps_pd(x0), y1 = _mm512_castps_pd(x1);

			_mm512_store_ps(s + 4 * j, _mm512_add_ps(
				_mm512_castpd_ps(_mm512_unpacklo_pd(y0, y1)),
				_mm512_castpd_ps(_mm512_unpackhi_pd(y0, y1))));
		}
	}
	/* the extra heads, together: 12 sums each over the fp32 rows, each
	 * row chunk loaded once for both (27 zmm), unreduced (head h's token
	 * j at u + 16 (48 h + j)) */
	if (X) {
		__m512 b[SL_TB];

		for (int j = 0; j < SL_TB; j++)
			a[j] = b[j] = _mm512_setzero_ps();
		for (int c = 0; c < NC; c++) {
			const __m512 q0 = _mm512_load_ps(xq + c * 16);
			const __m512 q1 = X == 2 ? _mm512_load_ps(xq + D + c * 16) : q0;

			for (int j = 0; j < SL_TB; j++) {
				const __m512 k = _mm512_load_ps(kf + j * D + c * 16);

				a[j] = _mm512_fmadd_ps(k, q0, a[j]);
				if (X == 2)
					b[j] = _mm512_fmadd_ps(k, q1, b[j]);
			}
		}
		for (int j = 0; j < SL_TB; j++) {
			_mm512_store_ps(u + (size_t)(i + j) * 16, a[j]);
			if (X == 2)
				_mm512_store_ps(u + (size_t)(KVA__BLOCK_TOKENS + i + j) * 16, b[j]);
		}
	}
}

/*
 * Groups of 3 and 4 (GP 4) on a CPU where it is faster (kva__sl_dot, Zen
 * 5): scores as dot products, q [4][head_dim] (a pad head's row 0, decode.c).
 * Tokens [i, i + 4) x the 4 heads are 16 sums: each K chunk converted once
 * into a register and multiplied into its token's 4 sums by the 4 heads' q
 * chunk (loaded once for the 4 tokens), the 16 sums reduced together
 * (reduce16) into vector i / 4 of s, sum (tt, g) in lane sl_lane(tt, g),
 * as sl_scores leaves it for the softmax. A row past the block's end is
 * its first row again (the softmax masks it). A prefetch site at every
 * chunk asks for as many lines as the chunk's 4 rows read (with the X
 * extra heads of sl_block, three quarters as many). The X heads' sums,
 * 4 tokens each, are stored unreduced into @u.
 *
 * Why: the sliced FMA broadcasts 4 floats (vbroadcastf32x4 from the fp32
 * rows), which Zen 5 issues at about two thirds of an FMA's rate; in a
 * throwaway loop over one block in L1 (family 26 model 2, gcc -O3), 24
 * tokens' scores at head_dim 128 took 148 ns this way against 244 sliced
 * (at group 8 and its 2 x 8 sums, 353 against 413, and 682 against 720
 * at 16 x 1). Paired in the tile (kvarena-ab, f16, head_dim 128, 8 KV
 * heads, 2 threads, both orders; doc/figures.md, thirty-third session):
 * group 4 1.06-1.11x as fast out of cache and 1.21x on one page, group 3
 * 1.06-1.08x; groups 6, 8 and 16 so scored read 0.90-0.99 out of cache
 * (8 1.00-1.06 and 16 0.96 on one page) and stay sliced.
 */
AI void g4_scores(const struct kva__tile *t, const struct kva__rows *bk, struct kva__pfq *pq,
		  size_t hoff, int i, float *s, const float *xq, float *u,
		  const enum kva_dtype dt, int NC, const int X)
{
	const int D = NC * 16;
	const size_t esize = kva__esize(dt);
	/* the lines of a chunk of 4 rows, 64 esize bytes; with heads of X
	 * (longer between sites) three quarters of them: f32 groups 5 1.03-1.05x
	 * as fast as all, 6 1.03-1.06x (Zen 5, thirty-seventh session); half
	 * 0.91-0.92 at group 5; 1.5x 0.92-0.96 at both (f16 0.96-0.98) */
	const int L = X ? (3 * (int)esize + 2) / 4 : (int)esize;
	const char *row[4];
	__m512 a[16], x[2][4];

	for (int tt = 0; tt < 4; tt++)
		row[tt] = bk->k[i + tt < bk->n ? i + tt : 0] + hoff;
	for (int l = 0; l < 16; l++)
		a[l] = _mm512_setzero_ps();
	for (int h = 0; h < X; h++)
		for (int tt = 0; tt < 4; tt++)
			x[h][tt] = _mm512_setzero_ps();
	for (int c = 0; c < NC; c++) {
		__m512 q[4], qx[2];

		kva__pfq_site(pq, L);
		for (int g = 0; g < 4; g++)
			q[g] = _mm512_load_ps(t->q + (size_t)g * D + c * 16);
		for (int h = 0; h < X; h++)
			qx[h] = _mm512_load_ps(xq + (size_t)h * D + c * 16);
		for (int tt = 0; tt < 4; tt++) {
			const __m512 k = kva__load16(row[tt] + (size_t)c * 16 * esize, dt);

			for (int g = 0; g < 4; g++)
				a[sl_lane(tt, g, 4)] = _mm512_fmadd_ps(k, q[g], a[sl_lane(tt, g, 4)]);
			/* the extra heads: 26 zmm in all with one, 31 with two */
			for (int h = 0; h < X; h++)
				x[h][tt] = _mm512_fmadd_ps(k, qx[h], x[h][tt]);
		}
	}
	_mm512_store_ps(s + (size_t)i * 4, reduce16(a));
	for (int h = 0; h < X; h++)
		for (int tt = 0; tt < 4; tt++)
			_mm512_store_ps(u + (size_t)(h * KVA__BLOCK_TOKENS + i + tt) * 16, x[h][tt]);
}

/* output: token i's (tt-th of its vector) V chunks [c0, c0 + nc) into the
 * accumulators of the GP heads, each p broadcast once for its nc chunks */
AI void sl_out_token(const struct kva__rows *bk, size_t off, const float *pv, const float *px,
		     int i, __m512 *acc, __m512 *ax, const enum kva_dtype dt, const int tt,
		     const int nc, const int W, const int X)
{
	const size_t esize = kva__esize(dt);
	const char *row = bk->v[i] + off;
	__m512 vc[4];

	__asm__("" : "+r"(row));
	for (int cc = 0; cc < nc; cc++)
		vc[cc] = kva__load16(row + (size_t)cc * 16 * esize, dt);
	for (int g = 0; g < 16 / W; g++) {
		const __m512 b = _mm512_broadcastss_ps(_mm_load_ss(pv + sl_lane(tt, g, W)));

		for (int cc = 0; cc < nc; cc++)
			acc[g * W + cc] = _mm512_fmadd_ps(b, vc[cc], acc[g * W + cc]);
	}
	/* the extra heads: 16 + W X accumulators, W chunks, a p each */
	for (int h = 0; h < X; h++) {
		const __m512 b = _mm512_broadcastss_ps(_mm_load_ss(px + h * KVA__BLOCK_TOKENS + i));

		for (int cc = 0; cc < nc; cc++)
			ax[h * 4 + cc] = _mm512_fmadd_ps(b, vc[cc], ax[h * 4 + cc]);
	}
}

/*
 * acc[g] += sum_t p[g][t] v[t] for V chunks [c0, c0 + nc), nc <= W, all GP
 * heads at once (GP x W = 16 accumulators): each chunk converted once for
 * every head. A prefetch site every S tokens (sl_pf_every).
 */
AI void sl_out_pass(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
		    struct kva__pfq *pq, const float *s, const float *px, int c0,
		    const enum kva_dtype dt, int NC, const int nc, const int W, const int X)
{
	const int D = NC * 16, GP = 16 / W, G = t->group, n = bk->n;
	const size_t esize = kva__esize(dt), off = hoff + (size_t)c0 * 16 * esize;
	const int L = sl_pf_lines(W, esize), S = sl_pf_every(W, esize);
	/* the extra heads' accumulators: heads G.., after the group's */
	float *const xo = t->acc + (size_t)G * D + c0 * 16;
	__m512 acc[16], ax[8];
	int i = 0;

	for (int g = 0; g < GP; g++)
		for (int cc = 0; cc < nc; cc++)
			acc[g * W + cc] = g < G ? _mm512_loadu_ps(t->acc + (size_t)g * D + (c0 + cc) * 16)
						: _mm512_setzero_ps();
	for (int h = 0; h < X; h++)
		for (int cc = 0; cc < nc; cc++)
			ax[h * 4 + cc] = _mm512_loadu_ps(xo + (size_t)h * D + cc * 16);
	for (; i + W <= n; i += W) {
		const float *pv = s + (size_t)(i / W) * 16;

		for (int tt = 0; tt < W; tt++) {
			if ((i + tt) % S == 0)
				kva__pfq_site(pq, L);
			sl_out_token(bk, off, pv, px, i + tt, acc, ax, dt, tt, nc, W, X);
		}
	}
	if (i < n) { /* the block's last 1 to W - 1 tokens */
		const float *pv = s + (size_t)(i / W) * 16;

		for (int tt = 0; tt < W - 1; tt++)
			if (i + tt < n) {
				if ((i + tt) % S == 0)
					kva__pfq_site(pq, L);
				sl_out_token(bk, off, pv, px, i + tt, acc, ax, dt, tt, nc, W, X);
			}
	}
	for (int g = 0; g < GP && g < G; g++)
		for (int cc = 0; cc < nc; cc++)
			_mm512_storeu_ps(t->acc + (size_t)g * D + (c0 + cc) * 16, acc[g * W + cc]);
	for (int h = 0; h < X; h++)
		for (int cc = 0; cc < nc; cc++)
			_mm512_storeu_ps(xo + (size_t)h * D + cc * 16, ax[h * 4 + cc]);
}

/* head @g's output accumulators times @r: the running maximum moved */
AI void sl_scale_acc(const struct kva__tile *t, int g, int NC, float r)
{
	const __m512 rv = _mm512_set1_ps(r);
	float *o = t->acc + (size_t)g * NC * 16;

	for (int c = 0; c < NC; c++)
		_mm512_storeu_ps(o + c * 16, _mm512_mul_ps(_mm512_loadu_ps(o + c * 16), rv));
}

/*
 * One KV head's turn at a block, sliced: scores, softmax, output. With @X
 * (1 or 2), as many heads more (heads G.., their q after the group's
 * kva__avx512_qrows rows: the last one or two of a group run as
 * subgroups, 4 + 1 and 4 + 2 from head_block, 8 + 1, 8 + 2, 16 + 1 and
 * 16 + 2 from rider_turn) ride along: their dot products take each K
 * chunk the group's take (g4_scores) or the fp32 rows (sl_scores), and
 * their output each V chunk the group's converted, where as a subgroup
 * of their own they read and converted the rows again. Their sums are
 * the subgroup's, in the same order: bit for bit its results.
 * Paired on Zen 5 (family 26 model 2, kvarena-ab --isa avx512, 2
 * threads, both orders; doc/figures.md, thirty-seventh session), group 5
 * against 4 + 1 as subgroups: f16 head_dim 128 1.08-1.12x as fast out of
 * cache, bf16 1.10-1.11x, fp8 1.41-1.42x, f32 1.24-1.27x, int8
 * 1.06-1.08x, head_dims 64-256 1.07-1.15x, in L3 1.10-1.12x, one page
 * 1.12-1.16x; group 21 1.01-1.03x. Group 6 against its padded 8
 * (kva__avx512_sub): kernels_pvt.h.
 */
AI void sl_block(const struct kva__tile *t, const struct kva__rows *bk, struct kva__pfq *pq,
		 int32_t tb, size_t hoff, const enum kva_dtype dt, int NC, const int W,
		 const int X)
{
	const int G = t->group, n = bk->n, nvec = (n + W - 1) / W;
	const bool scaled = dt == KVA_FP8_E4M3 || dt == KVA_INT8;
	const __m512 minf = _mm512_set1_ps(-INFINITY);
	const __m512i heads = sl_heads(W), firsts = sl_firsts(W);
	/* the group's heads, head-major, and their lanes */
	const __mmask16 gmask = (__mmask16)((1u << G) - 1);
	const __mmask16 live = _mm512_cmplt_epi32_mask(heads, _mm512_set1_epi32(G));
	_Alignas(64) float s[KVA__BLOCK_TOKENS * 16];
	_Alignas(64) float kf[SL_TB * KVA__SLICED_MAX_DIM];
	_Alignas(64) float ks[KVA__BLOCK_TOKENS], vs[KVA__BLOCK_TOKENS], r[16];
	/* the extra heads' q (head h's at xq + h D), their sums unreduced
	 * (head h's token i's 16 at u + 16 (48 h + i)) and their scores, then
	 * p (at px + 48 h) */
	const float *const xq = t->q + (size_t)kva__avx512_qrows(G, NC * 16) * NC * 16;
	_Alignas(64) float u[2 * KVA__BLOCK_TOKENS * 16], px[2 * KVA__BLOCK_TOKENS];
	__m512 mv = minf, mold, mnew, rv, lv, psum = _mm512_setzero_ps();
	int scored;

	/* sl_dot is the CPU's answer (decode.c), for GP 4 only; W == 4
	 * keeps g4_scores out of the W 2 and W 1 instances */
	if (W == 4 && t->sl_dot)
		for (scored = 0; scored < n; scored += 4)
			g4_scores(t, bk, pq, hoff, scored, s, xq, u, dt, NC, X);
	else
		for (scored = 0; scored < n; scored += SL_TB)
			sl_scores(t, bk, pq, hoff, scored, s, kf, xq, u, dt, NC, W, X);
	if (scaled)
		kva__scales_at(t, tb, n, t->kv_head, ks, vs);
	/* each extra head's sums, 16 tokens a reduce16 (the rows up to a 16
	 * past the last scored 0: lanes the fold masks off; past that, 0
	 * stored, which the fold does not read, so that px is written whole
	 * where gcc can see it), folded as a dot product's (dot_fold) */
	for (int h = 0; h < X; h++) {
		float *const uh = u + (size_t)h * KVA__BLOCK_TOKENS * 16;
		float *const ph = px + h * KVA__BLOCK_TOKENS;

		for (int j = scored; j % 16; j++)
			_mm512_store_ps(uh + (size_t)j * 16, _mm512_setzero_ps());
		for (int i = 0; i < KVA__BLOCK_TOKENS; i += 16) {
			__m512 v[16];

			if (i >= n) {
				_mm512_store_ps(ph + i, _mm512_setzero_ps());
				continue;
			}
			for (int j = 0; j < 16; j++)
				v[j] = _mm512_load_ps(uh + (size_t)(i + j) * 16);
			_mm512_store_ps(ph + i, reduce16(v));
		}
		dot_fold(t, G + h, ph, n, ks, vs, dt, NC);
	}
	/* the block's maxima; a pad head's lanes and a token's past the end
	 * are -inf, so that their p is 0 */
	for (int k = 0; k < nvec; k++) {
		__m512 x = _mm512_load_ps(s + 16 * k);

		if (scaled)
			x = _mm512_mul_ps(x, sl_token_scales(ks, k, W));
		x = _mm512_mask_mov_ps(minf, live & sl_tokens(n - k * W, W), x);
		_mm512_store_ps(s + 16 * k, x);
		mv = _mm512_max_ps(mv, x);
	}
	/* the running state, spread over the lanes: a pad head's lanes 0 */
	mold = _mm512_permutexvar_ps(heads, _mm512_maskz_loadu_ps(gmask, t->m));
	lv = _mm512_permutexvar_ps(heads, _mm512_maskz_loadu_ps(gmask, t->l));
	mnew = _mm512_max_ps(mold, sl_fold(mv, W, true));
	/* exp2(m_old - m_new); a head with no scores yet (m_old -inf) has l
	 * and acc 0, and exp2_ps gives 0 for -inf (or a NaN) */
	rv = exp2_ps(_mm512_sub_ps(mold, mnew));
	for (int k = 0; k < nvec; k++) {
		__m512 p = exp2_ps(_mm512_sub_ps(_mm512_load_ps(s + 16 * k), mnew));

		psum = _mm512_add_ps(psum, p);
		if (scaled) /* the V scales: p's weights of the rows */
			p = _mm512_mul_ps(p, sl_token_scales(vs, k, W));
		_mm512_store_ps(s + 16 * k, p);
	}
	lv = _mm512_fmadd_ps(lv, rv, sl_fold(psum, W, false));
	_mm512_mask_storeu_ps(t->m, gmask, _mm512_permutexvar_ps(firsts, mnew));
	_mm512_mask_storeu_ps(t->l, gmask, _mm512_permutexvar_ps(firsts, lv));
	_mm512_store_ps(r, _mm512_permutexvar_ps(firsts, rv));
	for (int g = 0; g < G; g++)
		if (r[g] != 1.0f)
			sl_scale_acc(t, g, NC, r[g]);
	for (int c0 = 0; c0 + W <= NC; c0 += W)
		sl_out_pass(t, bk, hoff, pq, s, px, c0, dt, NC, W, W, X);
	/* the last NC % W chunks (head_dim 80, 96: NC 5, 6 at W 2 or 4) */
	if (W == 2 && NC % 2)
		sl_out_pass(t, bk, hoff, pq, s, px, NC - 1, dt, NC, 1, W, X);
	else if (W == 4 && NC % 4 == 1)
		sl_out_pass(t, bk, hoff, pq, s, px, NC - 1, dt, NC, 1, W, X);
	else if (W == 4 && NC % 4 == 2)
		sl_out_pass(t, bk, hoff, pq, s, px, NC - 2, dt, NC, 2, W, X);
	else if (W == 4 && NC % 4 == 3)
		sl_out_pass(t, bk, hoff, pq, s, px, NC - 3, dt, NC, 3, W, X);
}

/* One subgroup's turn (the whole group's, where it is one): score, fold
 * into the softmax state, accumulate, asking for the next turn's lines
 * from @pq (head_block) or from the cursor @pf. */
AI void head_subgroup(const struct kva__tile *t, const struct kva__rows *bk,
		     struct kva__pf *pf, struct kva__pfq *pq, bool listed, int32_t tb,
		     size_t hoff, const enum kva_dtype dt, int NC, const bool ALL, int x)
{
	const int G = t->group, D = NC * 16;
	_Alignas(64) float s[KVA__MAX_GROUP][KVA__BLOCK_TOKENS];
	_Alignas(64) float ks[KVA__BLOCK_TOKENS], vs[KVA__BLOCK_TOKENS];

	/* the sliced sites ask with T1, a constant: on Zen 5 T0 read 0.96-1.04
	 * there (groups 4, 6, 8; thirty-second and fortieth sessions), and a
	 * test of a hint in their loops cost 2-5% (thirty-ninth) */
	pq->t0 = false;
	/* sliced: groups 3 to 16 but 5, 9-11 (a subgroup's own G: on Zen 5 a
	 * group of 6 arrives as 4 with x 2, kva__avx512_sub) */
	switch (kva__avx512_gp(G, D)) {
	case 4:
		if (x == 1)
			sl_block(t, bk, pq, tb, hoff, dt, NC, 4, 1);
		else if (x == 2)
			sl_block(t, bk, pq, tb, hoff, dt, NC, 4, 2);
		else
			sl_block(t, bk, pq, tb, hoff, dt, NC, 4, 0);
		return;
	case 8:
		sl_block(t, bk, pq, tb, hoff, dt, NC, 2, 0);
		return;
	case 16:
		sl_block(t, bk, pq, tb, hoff, dt, NC, 1, 0);
		return;
	}
	/* the next turn's lines: in the head_dim 64 and 128 instances
	 * (groups 1 and 2 only, tile_fits) from the list, dot_ask's counts
	 * (kva__pfq_step, inline); in the generic one from the cursor, its
	 * spread over head_steps (kva__pf_step), unless head_block @listed
	 * them for a sliced subgroup before this one (which asked for them
	 * all: none is left, and the cursor is not stepped, head_steps
	 * counting none). dq decides which, down to the loops. */
	struct kva__pfq *dq = listed ? pq : NULL;

	pq->t0 = t->pf_t0; /* T0 on Zen 5 (struct kva__pfq) */
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
			score16(t, bk, pf, dq, hoff, i, 0, s, dt, NC, 16, 1);
	} else if (G == 2) {
		for (int i = 0; i < bk->n; i += 8)
			score16(t, bk, pf, dq, hoff, i, 0, s, dt, NC, 8, 2);
	} else if (ALL) {
		const int rest = G % 4 == 3 ? 0 : G % 4;

		for (int i = 0; i < bk->n; i += 4)
			for (int g0 = 0; g0 < G - rest; g0 += 4)
				score16(t, bk, pf, dq, hoff, i, g0, s, dt, NC, 4, 4);
		if (rest == 1)
			for (int i = 0; i < bk->n; i += 16)
				score16(t, bk, pf, dq, hoff, i, G - 1, s, dt, NC, 16, 1);
		else if (rest == 2)
			for (int i = 0; i < bk->n; i += 8)
				score16(t, bk, pf, dq, hoff, i, G - 2, s, dt, NC, 8, 2);
	}

	/* fold the block's scores, times the K scales, into each head's
	 * running state; s becomes p * (V scale), ready for accumulate() */
	for (int g = 0; g < G; g++)
		dot_fold(t, g, s[g], bk->n, ks, vs, dt, NC);
	accumulate(t, bk, hoff, pf, dq, s, dt, NC, ALL);
}

/*
 * One KV head's turn at a block: its group's subgroups (kva__avx512_sub)
 * one after another, each a group of its own (its heads' q, acc, m and l;
 * q laid out subgroup after subgroup, decode.c), over the same rows (in
 * L1 or L2 from the first on): @t, the turn's own copy of the tile
 * (kva__tile_head), moved from one to the next, so that a group of one
 * subgroup takes no copy of its own. The next turn's lines are listed
 * once; the first subgroup (sliced) asks for them from its loops, as a
 * whole group does, and for the rest at its end (kva__pfq_end), so that
 * the ones after it find the list empty. A share of the list for each, in proportion to
 * its heads, read no faster (f16 group 5 1.00-1.01x, group 9 1.00x, bf16
 * group 10 0.96-1.04x, f32 group 5 0.95; Zen 5, doc/figures.md,
 * thirty-fifth session).
 */
AI void head_block(struct kva__tile *t, const struct kva__rows *bk, struct kva__pf *pf,
		   int32_t tb, size_t hoff, const enum kva_dtype dt, int NC, const bool ALL)
{
	const int D = NC * 16;
	const int32_t group = t->group;
	const char *run[KVA__PFQ_RUNS][2];
	struct kva__pfq pq;
	int32_t g0 = 0;
	bool listed;

	t->group = kva__avx512_sub(group, D, kva__esize(dt), t->subgroups);
	/* the sliced groups, and the dot products of the head_dim 64 and
	 * 128 instances, ask from the list; the generic instance's from the
	 * cursor (kva__pf_step) */
	listed = !ALL || kva__avx512_gp(t->group, D);
	kva__pfq_begin(pf, &pq, run, listed);
	for (;;) {
		/* a last one or two heads after a subgroup of 4 ride along
		 * in it (sl_block's X): a group of 5 or 6 is one subgroup */
		const int32_t rest = group - g0 - t->group;
		const int x = rest <= 2 && kva__avx512_gp(t->group, D) == 4 ? rest : 0;

		head_subgroup(t, bk, pf, &pq, listed, tb, hoff, dt, NC, ALL, x);
		kva__pfq_end(&pq);
		g0 += t->group + x;
		if (g0 >= group)
			return;
		t->q += (size_t)kva__avx512_qrows(t->group, D) * D;
		t->acc += (size_t)t->group * D;
		t->m += t->group;
		t->l += t->group;
		t->group = kva__avx512_sub(group - g0, D, kva__esize(dt), true);
	}
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

/* the prefetch steps of one head's turn at a block of n tokens, over
 * which the cursor spreads the next turn's lines: the generic instance's
 * (ALL) calls, one a score16 of the first four heads and one every
 * ACC_STEP V rows of each part. The sliced tile's sites and the head_dim
 * 64 and 128 instances' inline steps (groups 1 and 2, head_block's dq)
 * ask for counts of their own (sl_pf_lines, dot_ask): none. */
static int head_steps(int G, int NC, int n, size_t esize, bool ALL, bool subgroups)
{
	const int tb = G == 1 ? 16 : G == 2 ? 8 : 4;

	/* as subgroups, the first is sliced (kva__avx512_sub) */
	if (kva__avx512_gp(G, NC * 16) || !ALL || kva__avx512_sub(G, NC * 16, esize, subgroups) != G)
		return 0;
	return (n + tb - 1) / tb + acc_parts(G, NC) * ((n + ACC_STEP - 1) / ACC_STEP);
}

/*
 * One KV head's turn at a block for a group of one sliced subgroup of 8
 * or 16 and one or two heads more (9, 10, 17, 18 on Zen 5,
 * kva__avx512_sub): the two ride in one block (sl_block's X, at W 2 or
 * 1), head_block's turn for them with its only shape. They have tile
 * instances of their own (riders below), so that the other groups' code
 * is what it was: with these shapes in every tile instead, group 6 read
 * 0.94-0.98 as fast (f16, bf16, head_dims 64 and 128, in and out of
 * cache), its own code the same (Zen 5, paired both orders;
 * doc/figures.md, thirty-eighth session).
 */
AI void rider_turn(struct kva__tile *t, const struct kva__rows *bk, struct kva__pf *pf,
		   int32_t tb, size_t hoff, const enum kva_dtype dt, int NC, const int W,
		   const int X)
{
	const char *run[KVA__PFQ_RUNS][2];
	struct kva__pfq pq;

	t->group = 16 / W;
	kva__pfq_begin(pf, &pq, run, true);
	pq.t0 = false; /* the sliced sites ask with T1 (head_subgroup) */
	sl_block(t, bk, &pq, tb, hoff, dt, NC, W, X);
	kva__pfq_end(&pq);
}

/*
 * The tile: each KV head's turns by head_block, or (@RW, the W of the
 * riders' block, not 0) by rider_turn with @RX heads riding.
 *
 * The head's tile (th) is copied from @t once and only its head's fields
 * set at each turn (kva__tile_head_at). Copied whole at every turn (gcc:
 * two overlapping 64-byte stores), the reads of its fields just after
 * stalled at one byte load (th.subgroups, in the second store: 7% of the
 * tile's samples at group 1 on one page, Zen 5; a narrow load waiting for
 * a wide store to be written fits, with no PMU here to count it). Paired on
 * Zen 5 (family 26 model 2, kvarena-ab --isa avx512, 2 threads, both
 * orders; doc/figures.md, forty-third session), on one page: group 1
 * 1.06-1.10x as fast, 2 1.04x, 5 1.03x, head_dim 64 1.08x, bf16 1.06x,
 * f32 1.03x, fp8 1.01x, groups 4 and 8 0.99-1.00; out of cache, where
 * group 8 is compute bound and the rest memory bound, 0.99-1.01 (groups
 * 1, 2, 4, 8). The AVX2 tile the same way read 0.98-0.99 on one page
 * (groups 1, 2, 4 and 8; head_dim 64 1.02) and keeps its copy.
 */
AI void tile(const struct kva__tile *t, const enum kva_dtype dt, int NC, const bool ALL,
	     const int RW, const int RX)
{
	const size_t row_bytes = (size_t)NC * 16 * kva__esize(dt);
	struct kva__blocks b;
	struct kva__tile th;

	kva__blocks_begin(&b, t, row_bytes,
			  head_steps(t->group, NC, KVA__BLOCK_TOKENS, kva__esize(dt), ALL, t->subgroups),
			  true);
	kva__tile_head(t, 0, &th);
	for (int32_t tb = t->t0; tb < t->t1; tb += KVA__BLOCK_TOKENS) {
		const struct kva__rows *bk = kva__blocks_next(&b, t, tb);

		for (int h = 0; h < t->heads; h++) {
			kva__blocks_turn(&b, t, h);
			kva__tile_head_at(t, h, &th);
			if (RW)
				rider_turn(&th, bk, &b.pf, tb, kva__head_offset(t->kv, h), dt, NC,
					   RW, RX);
			else
				head_block(&th, bk, &b.pf, tb, kva__head_offset(t->kv, h), dt,
					   NC, ALL);
			kva__blocks_turn_end(&b, bk);
		}
	}
}

/*
 * One instance per dtype (its conversion is in the innermost loops) and per
 * head_dim 64 and 128 besides the generic one, each a function of its own,
 * as in tile_avx2.c: with head_dim a constant, the sliced scores' 12 rows
 * of fp32 and q's rows are displacements from one register each. Those two
 * take groups up to 16 (sliced from 3 on, kva__avx512_gp); the generic one
 * takes any group and head_dim, with every shape (ALL). The dot products'
 * shapes for 3 heads and more in every instance made this file take gcc
 * with ASan and UBSan 5 minutes to compile, against 1.4 before the sliced
 * groups. The riders (groups 9, 10, 17, 18 on Zen 5, rider_turn) have the
 * same three of their own.
 */
/* the groups the instances without ALL take: dot products for 1 and 2,
 * sliced for the rest (their head_block has no other shapes) */
static inline bool tile_fits(const struct kva__tile *t)
{
	return t->group <= 2 || kva__avx512_gp(t->group, t->kv->head_dim) ||
	       (t->subgroups && t->kv->head_dim <= KVA__SLICED_MAX_DIM);
}

/*
 * The heads past a sliced subgroup of 8 or 16 that ride in its block
 * (rider_turn): 1 or 2 (groups 9, 10, 17, 18 where subgroups run), or 0.
 * Not f16 at head_dim 64, the one shape where they lost: there the riders
 * read groups 9, 10, 17 and 18 0.95-0.99 as fast as the subgroups (Zen 5,
 * paired both orders; at head_dim 64 bf16 0.98-1.01, f32 0.99-1.08, int8
 * 1.01-1.07, fp8 1.16-1.24; f16 at head_dims 32 and 96 1.08-1.23;
 * doc/figures.md, thirty-ninth session), and with the generic riders'
 * instance 0.90-0.92 as fast as with the head_dim 64 one.
 */
static inline int32_t riding(const struct kva__tile *t)
{
	const int32_t D = t->kv->head_dim;
	const int32_t sub = kva__avx512_sub(t->group, D, kva__esize(t->kv->dtype), t->subgroups);
	const int gp = kva__avx512_gp(sub, D);

	if (t->kv->dtype == KVA_F16 && D == 64)
		return 0;
	return (gp == 8 || gp == 16) && t->group - sub <= 2 ? t->group - sub : 0;
}

AI void riders_nc(const struct kva__tile *t, const enum kva_dtype dt, int NC, int W, int X)
{
	if (W == 2 && X == 1)
		tile(t, dt, NC, false, 2, 1);
	else if (W == 2)
		tile(t, dt, NC, false, 2, 2);
	else if (X == 1)
		tile(t, dt, NC, false, 1, 1);
	else
		tile(t, dt, NC, false, 1, 2);
}

/* the riders' tile, each shape a constant instance; head_dims 128 and 64
 * in functions of their own, as the others' (rather than one function for
 * all three, whose head_dim 64 read group 10 0.84-0.87 as fast as its
 * subgroups) */
AI void riders(const struct kva__tile *t, const enum kva_dtype dt, int NC, int32_t X)
{
	riders_nc(t, dt, NC, 16 / kva__avx512_gp(t->group - X, NC * 16), X);
}

#define TILE_INSTANCES(DT, name)                                                  \
	static __attribute__((noinline)) void name##_128(const struct kva__tile *t) \
	{                                                                         \
		tile(t, DT, 8, false, 0, 0);                                      \
	}                                                                         \
	static __attribute__((noinline)) void name##_64(const struct kva__tile *t)  \
	{                                                                         \
		tile(t, DT, 4, false, 0, 0);                                      \
	}                                                                         \
	static __attribute__((noinline)) void name##_any(const struct kva__tile *t) \
	{                                                                         \
		tile(t, DT, t->kv->head_dim / 16, true, 0, 0);                    \
	}                                                                         \
	static __attribute__((noinline)) void name##_riders_128(const struct kva__tile *t, \
							      int32_t x)          \
	{                                                                         \
		riders(t, DT, 8, x);                                              \
	}                                                                         \
	static __attribute__((noinline)) void name##_riders_64(const struct kva__tile *t, \
							      int32_t x)          \
	{                                                                         \
		riders(t, DT, 4, x);                                              \
	}                                                                         \
	static __attribute__((noinline)) void name##_riders_any(const struct kva__tile *t, \
							      int32_t x)          \
	{                                                                         \
		riders(t, DT, t->kv->head_dim / 16, x);                           \
	}                                                                         \
	static void name(const struct kva__tile *t)                               \
	{                                                                         \
		const int32_t x = riding(t);                                      \
                                                                                  \
		if (x && t->kv->head_dim == 128)                                  \
			name##_riders_128(t, x);                                  \
		else if (x && t->kv->head_dim == 64)                              \
			name##_riders_64(t, x);                                   \
		else if (x)                                                       \
			name##_riders_any(t, x);                                  \
		else if (t->kv->head_dim == 128 && tile_fits(t))                  \
			name##_128(t);                                            \
		else if (t->kv->head_dim == 64 && tile_fits(t))                   \
			name##_64(t);                                             \
		else                                                              \
			name##_any(t);                                            \
	}

TILE_INSTANCES(KVA_F32, tile_f32)
TILE_INSTANCES(KVA_F16, tile_f16)
TILE_INSTANCES(KVA_BF16, tile_bf16)
TILE_INSTANCES(KVA_FP8_E4M3, tile_fp8)
TILE_INSTANCES(KVA_INT8, tile_int8)

void kva__tile_avx512(const struct kva__tile *t)
{
	switch (t->kv->dtype) {
	case KVA_F32:
		tile_f32(t);
		return;
	case KVA_F16:
		tile_f16(t);
		return;
	case KVA_BF16:
		tile_bf16(t);
		return;
	case KVA_FP8_E4M3:
		tile_fp8(t);
		return;
	case KVA_INT8:
		tile_int8(t);
		return;
	}
}

void kva__axpy_avx512(float *y, const float *x, float a, int32_t n)
{
	const __m512 av = _mm512_set1_ps(a);

	for (int32_t i = 0; i < n; i += 16)
		_mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
}
