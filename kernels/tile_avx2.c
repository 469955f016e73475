/* SPDX-License-Identifier: MIT */
/*
 * tile_avx2.c - the decode tile with AVX2 + FMA + F16C (head_dim a multiple
 * of 8), for the 16 ymm registers AVX2 has.
 *
 * What bounds it (measured on Zen 4 with tilebench-like loops over cached
 * pages): an FMA has a latency of 4 cycles and two issue each cycle, so 8
 * independent accumulators only just keep the FMA pipes busy, and any
 * stall shows; 12 leave slack. The shapes below all keep 12 accumulators
 * where the group allows, with at most 16 registers live:
 *
 *   scores      3 tokens x 4 heads: 3 K chunks in registers, q from memory
 *               6 x 2: q chunks in registers, K chunks in turn
 *               one head: 2 tokens at a time, each K row from start to
 *               end into 6 partial sums, q from memory; or, on a CPU
 *               where it is faster (t->one_cols), 12 tokens a chunk at
 *               a time, q's chunk in a register
 *   output      4 heads x 3 chunks: the chunks converted once into three
 *               registers, each head's p broadcast into the sixteenth;
 *               2 heads x 4: the V chunks loaded in turn
 *               one head: 16 chunks a pass (a row of head_dim 128 whole),
 *               8 accumulators in registers and 8 in L1
 *
 * Out of cache, how many rows the loads are spread over at once counts as
 * much as the arithmetic (measured on Zen 3, AVX2, group 1): scores over
 * 12 rows a chunk at a time read less than over 2 rows each from start to
 * end (doc/figures.md, twelfth session).
 *
 * and read each K and V line of a head once per block where the group allows
 * (all heads of a group at once). A page is [kv_head][token][head_dim], so
 * one head's rows of a page are one piece (4 KiB at f16, head_dim 128, 16
 * tokens: a line in each of L1's 64 sets), and a block of 48 tokens is
 * three such pieces. Copying a turn's V rows into one buffer first, before
 * or during the scores, computed 0.934-0.951x as fast (group 8, paired on
 * Zen 4; doc/figures.md, twenty-third session). A block is 48 tokens (3 x 16).
 * exp2 builds 2^n from its exponent bits (AVX2 has no vscalefps).
 *
 * Groups of 4, 8 and 16 heads keep a block's scores token-major (tg_block:
 * a token's scores side by side), so that the softmax runs lane by lane
 * over every head at once, and the 3 x 4 tiles' sums are stored as they
 * come; other groups head-major (head_block: a head's scores side by side,
 * 8 tokens a vector). Paired on Zen 4 (doc/figures.md, twenty-second session):
 * group 8 1.052-1.065x as fast, group 4 1.019-1.054x, group 16
 * 1.018-1.055x (f16); fp8 and int8 since the twenty-third, their scales in
 * each token's lanes.
 *
 * fp8 (e4m3) converts in three operations with no multiply and no NaN
 * check (load_x86.h): the 2^8 its conversion leaves out is in the scales
 * (block_scales), and a turn looks for NaN bytes apart (fp8_any_nan). The
 * conversion that did both had the 4 x 3 shapes spill an accumulator.
 */
#include <immintrin.h>

#include "kernels_pvt.h"
#include "load_x86.h"

#define AI __attribute__((always_inline)) static inline

/*
 * Tokens of a part between prefetch steps: 8, and 16 on a core that queues
 * prefetches (t->pf_queue, kva__pf_queues), where fewer calls of the
 * cursor's tight loop cost the core less. On Zen 3 (it drops them), AVX2,
 * group 4 out of cache, each build in four code layouts: 16 0.98-0.99,
 * 6 0.96, 4 0.94-0.95 of 8 (doc/figures.md, seventeenth session). On Zen 4 without
 * AVX-512, kvarena-ab paired in each order with the tight loop (doc/figures.md,
 * twenty-first session): 16 in the parts of two heads read group 2 out of
 * cache 1.043-1.082 (4 runs), on one thread 1.085, in L2 1.041-1.060,
 * group 6 0.999-1.016; 16 in every part then read group 3 1.037-1.080,
 * group 8 1.013-1.033, group 4 0.967-1.028 and group 5 0.978-1.022 of
 * that (4 runs each).
 */
#define ACC_STEP 8
#define ACC_STEP_QUEUED 16

static inline int acc_step(bool pf_queue)
{
	return pf_queue ? ACC_STEP_QUEUED : ACC_STEP;
}

/*
 * ... and of one head's whole rows (accumulate_one: group 1, or a group's
 * last head), chosen per machine: t->one_step (struct kva__tile), which
 * kva__avx2_one_step() below picks. A step spreads a turn's lines over the
 * steps its loops take, and group 1 takes few (its FMAs are few): at 8
 * tokens a step each asks for 44 lines at once (f16, head_dim 128), at 4
 * for 29. A core that drops what it cannot start (about 22 of a burst of
 * 64 on Zen 3: `prefetch_kept`) wants the short step, one that keeps the
 * whole burst (Zen 4: 63-64) the long one, whose steps cost fewer calls.
 * Each build in four code layouts, kvarena-ab, AVX2: Zen 3 group 1 out of
 * cache 1.02-1.06x as fast at 4 as at 8 (4 runs), 0.93 at 16, 1.01-1.02 at
 * 2, in L2 0.96 at 4 (doc/figures.md, seventeenth session); Zen 4 8 against 4
 * 1.04-1.10 at group 1 out of cache (4 runs, all 16 layout pairs faster),
 * 1.00 in L2, 1.07 at group 5 (nineteenth session).
 */
#define ONE_STEP_SHORT 4
#define ONE_STEP_LONG 8

/* lane i = the sum of v[i]'s 8 lanes */
AI __m256 reduce8(const __m256 v[8])
{
	__m256 s01 = _mm256_hadd_ps(v[0], v[1]), s23 = _mm256_hadd_ps(v[2], v[3]);
	__m256 s45 = _mm256_hadd_ps(v[4], v[5]), s67 = _mm256_hadd_ps(v[6], v[7]);
	__m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);

	return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
			     _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

/* lane i = the sum of v[i]'s 8 lanes, for 4 */
AI __m128 reduce4(const __m256 v[4])
{
	__m256 s = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));

	return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
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

/*
 * A block's scores, then its p: s[g][t]. A row has room past the block for
 * what the transposed stores of score_body write beyond a call's tokens
 * (the next call overwrites it, or nothing reads it).
 */
#define ROW (KVA__BLOCK_TOKENS + 8)

/* groups of 4, 8 and 16 heads score token-major (tg_block): s as rows of G */
_Static_assert(KVA__BLOCK_TOKENS * 16 <= KVA__MAX_GROUP * ROW, "token-major scores fit s");

/*
 * Score tokens [i, i + nt) x heads [g0, g0 + ng) into s[g][i]: TB x GB dot
 * products, each accumulated in a ymm across head_dim, then reduced 8 (and
 * 4) at a time. The caller passes nt == TB and ng == GB as constants except
 * at a block's or a group's end. The K scales of fp8 and int8 are the
 * fold's to apply, 8 scores a multiply. @TG: 0 for head-major scores,
 * s[g][t] (the 3 x 4 tile's sums transposed to store a head's three at
 * once), else the row length of token-major ones, s[t][g] (tg_block: the
 * sums stored as they come).
 */
AI void score_body(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
		   int i, int g0, float s[][ROW],
		   const enum kva_dtype dt, int NC, const int TB, const int GB, const int nt,
		   const int ng, const int TG)
{
	const int D = NC * 8;
	const size_t esize = kva__esize(dt);
	const float *qb = t->q + (size_t)g0 * D;
	__m256 a[12];
	_Alignas(32) float r[16];
	const char *kr[12];

	for (int j = 0; j < 12; j++)
		a[j] = _mm256_setzero_ps();
	for (int tt = 0; tt < nt; tt++)
		kr[tt] = bk->k[i + tt] + hoff;
	if (TB == 12 && GB == 1 && nt == TB && ng == GB && !(esize <= 2 && t->one_cols)) {
		/*
		 * One head: two tokens at a time, each K row read from its
		 * start to its end into 6 partial sums (12 accumulators, q from
		 * L1), not all 12 rows a chunk at a time as below. Group 1 on
		 * Zen 3 (AVX2, f16), as the median of 7-10 runs alternating
		 * with other builds: over 12 rows at once it read 0.69-0.76 of
		 * the sweep, over 6 0.68, 3 0.77-0.80, 2 0.79-0.88 and 1 0.72
		 * (doc/figures.md, twelfth session). Where the CPU says so
		 * (t->one_cols: Zen 5, kva__avx2_cols) and a chunk is 16 bytes
		 * or less, the 12 rows below, q's chunk in a register: group
		 * 1 f16 1.03-1.09x as fast out of cache there, 1.08-1.14x on
		 * one page; at f32 0.89-0.96 out of cache (doc/figures.md,
		 * thirty-fourth session).
		 */
		__m256 sum[12];

		for (int j0 = 0; j0 < 12; j0 += 2) {
			int c = 0;

			for (int k = 0; k < 12; k++)
				a[k] = _mm256_setzero_ps();
			for (; c + 6 <= NC; c += 6)
				for (int k = 0; k < 6; k++)
					for (int j = 0; j < 2; j++)
						a[j * 6 + k] = _mm256_fmadd_ps(
							kva__load8(kr[j0 + j] + (size_t)(c + k) * 8 * esize, dt),
							_mm256_loadu_ps(qb + (c + k) * 8), a[j * 6 + k]);
			/* the last NC % 6 chunks, apart: in one loop guarded by
			 * c + k < NC, head_dim 128 computed 0.85x as fast in L2
			 * (Zen 3, AVX2, 1 thread, 3 alternating rounds) */
			for (int k = 0; k < 5; k++)
				if (c + k < NC)
					for (int j = 0; j < 2; j++)
						a[j * 6 + k] = _mm256_fmadd_ps(
							kva__load8(kr[j0 + j] + (size_t)(c + k) * 8 * esize, dt),
							_mm256_loadu_ps(qb + (c + k) * 8), a[j * 6 + k]);
			for (int j = 0; j < 2; j++) {
				const __m256 *p = a + j * 6;

				sum[j0 + j] = _mm256_add_ps(
					_mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3])),
					_mm256_add_ps(p[4], p[5]));
			}
		}
		_mm256_storeu_ps(&s[g0][i], reduce8(sum));
		_mm_storeu_ps(&s[g0][i + 8], reduce4(sum + 8));
		return;
	}
	for (int c = 0; c < NC; c++) {
		if (GB >= 3 || ng > 2) {
			/* the tokens' K chunks in registers, q from memory
			 * (ng > 2 implies GB >= 3; said for the shared tail's
			 * instance, where GB is not a constant, so that the
			 * compiler sees qv[2] below indexed below 2) */
			__m256 kc[3];

			for (int tt = 0; tt < nt; tt++)
				kc[tt] = kva__load8(kr[tt] + (size_t)c * 8 * esize, dt);
			for (int gg = 0; gg < ng; gg++) {
				__m256 q = _mm256_loadu_ps(qb + (size_t)gg * D + c * 8);

				for (int tt = 0; tt < nt; tt++)
					a[tt * GB + gg] = _mm256_fmadd_ps(kc[tt], q, a[tt * GB + gg]);
			}
		} else {
			/* q in registers (as a memory operand it would be loaded
			 * TB times), the tokens' K chunks in turn */
			__m256 qv[2];

			for (int gg = 0; gg < ng; gg++) {
				qv[gg] = _mm256_loadu_ps(qb + (size_t)gg * D + c * 8);
				__asm__("" : "+x"(qv[gg]));
			}
			for (int tt = 0; tt < nt; tt++) {
				__m256 kc = kva__load8(kr[tt] + (size_t)c * 8 * esize, dt);

				for (int gg = 0; gg < ng; gg++)
					a[tt * GB + gg] = _mm256_fmadd_ps(kc, qv[gg], a[tt * GB + gg]);
			}
		}
	}
	if (TG && TB == 3 && GB == 4 && nt == TB && ng == 4) {
		/* token-major rows of TG scores (tg_block): lanes t0g0..t0g3
		 * t1g0..t1g3 are two rows' 4 heads as they are, t2g0..t2g3
		 * the third's; no transposes */
		float *st = &s[0][0] + (size_t)i * TG + g0;
		__m256 r8 = reduce8(a);

		_mm_storeu_ps(st, _mm256_castps256_ps128(r8));
		_mm_storeu_ps(st + TG, _mm256_extractf128_ps(r8, 1));
		_mm_storeu_ps(st + 2 * TG, reduce4(a + 8));
		return;
	}
	if (TB == 3 && GB == 4 && nt == TB && ng >= 3) {
		/* lanes t0g0..t0g3 t1g0..t1g3 and t2g0..t2g3: transposed, each
		 * head's three scores are one store (and a fourth lane the next
		 * call overwrites). A last group of three heads stores a fourth
		 * row too, of zeros, into s[g0 + 3]: a row of the array (g0 + 3
		 * is then the group, below KVA__MAX_GROUP) that nothing reads. */
		__m256 r8 = reduce8(a);
		__m128 c0 = _mm256_castps256_ps128(r8), c1 = _mm256_extractf128_ps(r8, 1);
		__m128 c2 = reduce4(a + 8), c3 = _mm_setzero_ps();

		_MM_TRANSPOSE4_PS(c0, c1, c2, c3);
		_mm_storeu_ps(&s[g0][i], c0);
		_mm_storeu_ps(&s[g0 + 1][i], c1);
		_mm_storeu_ps(&s[g0 + 2][i], c2);
		_mm_storeu_ps(&s[g0 + 3][i], c3);
		return;
	}
	if (TB == 12 && GB == 1 && nt == TB && ng == GB) { /* 12 rows a chunk at a time */
		_mm256_storeu_ps(&s[g0][i], reduce8(a));
		_mm_storeu_ps(&s[g0][i + 8], reduce4(a + 8));
		return;
	}
	_mm256_store_ps(r, reduce8(a));
	if (TB * GB > 8)
		_mm_store_ps(r + 8, reduce4(a + 8));
	for (int tt = 0; tt < nt; tt++)
		for (int gg = 0; gg < ng; gg++)
			if (TG)
				(&s[0][0])[(size_t)(i + tt) * TG + g0 + gg] = r[tt * GB + gg];
			else
				s[g0 + gg][i + tt] = r[tt * GB + gg];
}

/* the tail of a block, or of a group of heads: one shared instance */
static __attribute__((noinline)) void score_tail(const struct kva__tile *t,
						 const struct kva__rows *bk, size_t hoff, int i,
						 int g0, float s[][ROW], enum kva_dtype dt, int NC,
						 int TB, int GB, int nt, int ng, int tg)
{
	score_body(t, bk, hoff, i, g0, s, dt, NC, TB, GB, nt, ng, tg);
}

/*
 * heads [g0, g0 + GB) x every token of the block, K prefetches between
 * calls; a last group of three heads (groups 3, 7, 11, ...) is a constant
 * shape too: 9 of the 12 accumulators, not the shared tail's loops
 */
AI void score_heads(const struct kva__tile *t, const struct kva__rows *bk,
		    struct kva__pf *pf, size_t hoff, int g0, float s[][ROW],
		    const enum kva_dtype dt, int NC, const int TB, const int GB, const int TG)
{
	const int ng = t->group - g0 < GB ? t->group - g0 : GB;

	for (int i = 0; i < bk->n; i += TB) {
		kva__pf_step(pf);
		if (bk->n - i >= TB && ng == GB)
			score_body(t, bk, hoff, i, g0, s, dt, NC, TB, GB, TB, GB, TG);
		else if (GB == 4 && bk->n - i >= TB && ng == 3)
			score_body(t, bk, hoff, i, g0, s, dt, NC, TB, GB, TB, 3, TG);
		else
			score_tail(t, bk, hoff, i, g0, s, dt, NC, TB, GB,
				   bk->n - i < TB ? bk->n - i : TB, ng, TG);
	}
}

/*
 * acc[g] += sum_t p[g][t] v[t] for heads [g0, g0 + ng) x chunks [c0, c0 + nc)
 * kept in registers over the block: four heads share the chunks converted
 * once; fewer go in pairs, each pair with its two broadcasts and the V
 * chunks loaded again for each pair.
 */
AI void accumulate_body(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
			struct kva__pf *pf, float s[][ROW], int g0, int c0, const enum kva_dtype dt,
			int NC, const int CG, const int ng, const int nc, const int PH, const int PT)
{
	const int D = NC * 8;
	const size_t esize = kva__esize(dt);
	__m256 acc[12];

	for (int gg = 0; gg < ng; gg++)
		for (int cc = 0; cc < nc; cc++)
			acc[gg * CG + cc] = _mm256_loadu_ps(t->acc + (size_t)(g0 + gg) * D + (c0 + cc) * 8);
	/*
	 * Pointers, not indices: the rows' table, this token's p for the
	 * first head (the others a constant ROW apart) and the loop's end stay
	 * in registers, with the accumulators' sixteen ymm the loop has no
	 * general register to spare for a reload from the stack.
	 */
	const char *const *vp = bk->v, *const *vend = bk->v + bk->n;
	const float *sp = &s[0][0] + (size_t)g0 * PH;
	const size_t off = hoff + (size_t)c0 * 8 * esize;

	const ptrdiff_t step = acc_step(t->pf_queue);

	/* a prefetch step every acc_step() tokens: the next block's lines
	 * spread over the output loop as over the scores */
	for (const char *const *cend; vp < vend;) {
		kva__pf_step(pf);
		cend = vend - vp > step ? vp + step : vend;
		for (; vp < cend; vp++, sp += PT) {
			const char *row = *vp + off;

			if (ng >= 3 && nc <= 3) {
				/*
				 * Four heads (or a group's last three): the
				 * part's V chunks converted once into three
				 * registers, then each head's p broadcast and
				 * used three times: 12 accumulators, 3 chunks
				 * and a broadcast are all sixteen ymm, and a
				 * token costs 3 conversions, not 6. A group's
				 * last five (out_heads) the same way, 5 x 2.
				 */
				const char *rr = row;
				const float *pq = sp;
				__m256 vc[3];

				__asm__ volatile("" : "+r"(rr), "+r"(pq));
				for (int cc = 0; cc < nc; cc++)
					vc[cc] = kva__load8(rr + (size_t)cc * 8 * esize, dt);
				for (int gg = 0; gg < ng; gg++) {
					__m256 b = _mm256_broadcast_ss(pq + gg * PH);

					for (int cc = 0; cc < nc; cc++)
						acc[gg * CG + cc] =
							_mm256_fmadd_ps(b, vc[cc], acc[gg * CG + cc]);
				}
				continue;
			}
			for (int gp = 0; gp < ng; gp += 2) {
				const char *rr = row;
				const float *pq = sp;
				__m256 b0, b1;

				/*
				 * The chunks at displacements from one register, and
				 * loaded again for each pair: without the barrier the
				 * compiler keeps them from the first pair, runs out of
				 * registers and spills an accumulator, whose FMA chain
				 * then goes through memory. The same for p, whose rows
				 * it would otherwise address with a register each.
				 */
				__asm__ volatile("" : "+r"(rr), "+r"(pq));
				b0 = _mm256_broadcast_ss(pq + gp * PH);
				b1 = gp + 1 < ng ? _mm256_broadcast_ss(pq + (gp + 1) * PH) : b0;
				for (int cc = 0; cc < nc; cc++) {
					__m256 vc = kva__load8(rr + (size_t)cc * 8 * esize, dt);

					acc[gp * CG + cc] = _mm256_fmadd_ps(b0, vc, acc[gp * CG + cc]);
					if (gp + 1 < ng)
						acc[(gp + 1) * CG + cc] =
							_mm256_fmadd_ps(b1, vc, acc[(gp + 1) * CG + cc]);
				}
			}
		}
	}
	for (int gg = 0; gg < ng; gg++)
		for (int cc = 0; cc < nc; cc++)
			_mm256_storeu_ps(t->acc + (size_t)(g0 + gg) * D + (c0 + cc) * 8,
					 acc[gg * CG + cc]);
}

static __attribute__((noinline)) void accumulate_tail(const struct kva__tile *t,
						      const struct kva__rows *bk, size_t hoff,
						      struct kva__pf *pf, float s[][ROW], int g0,
						      int c0, enum kva_dtype dt, int NC, int CG,
						      int ng, int nc, int ph, int pt)
{
	accumulate_body(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, ng, nc, ph, pt);
}

/* NG heads x chunks [c0, c0 + nc): constants for a whole part and for the
 * last one or two chunks of a 3-chunk part (head_dim 64, 128, 256 leave
 * one or two), so that only an odd head_dim takes the shared tail */
AI void accumulate_chunks(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
			  struct kva__pf *pf, float s[][ROW], int g0, int c0,
			  const enum kva_dtype dt, int NC, const int CG, const int NG, int nc,
			  const int PH, const int PT)
{
	if (nc == CG)
		accumulate_body(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, NG, CG, PH, PT);
	else if (nc == 1)
		accumulate_body(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, NG, 1, PH, PT);
	else if (nc == 2)
		accumulate_body(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, NG, 2, PH, PT);
	else
		accumulate_tail(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, NG, nc, PH, PT);
}

/*
 * Heads [g0, g0 + GB) x chunks [c0, c0 + CG), and a last group of three
 * heads in the 4 x 3 shape (9 accumulators): constants, never the tail's
 * loops, whatever the group.
 */
AI void accumulate_part(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
			struct kva__pf *pf, float s[][ROW], int g0, int c0, const enum kva_dtype dt,
			int NC, const int GB, const int CG, const int PH, const int PT)
{
	const int ng = t->group - g0 < GB ? t->group - g0 : GB;
	const int nc = NC - c0 < CG ? NC - c0 : CG;

	if (ng == GB)
		accumulate_chunks(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, GB, nc, PH, PT);
	else if (GB == 4 && ng == 3)
		accumulate_chunks(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, 3, nc, PH, PT);
	else
		accumulate_tail(t, bk, hoff, pf, s, g0, c0, dt, NC, CG, ng, nc, PH, PT);
}

/*
 * One head x chunks [c0, c0 + nc), 8 < nc <= 16, in one pass over the
 * tokens, so that each V row is read from start to end, not in two passes
 * of half a row: the first 8 chunks' accumulators in registers, the rest
 * in L1 (a load, an FMA and a store a chunk and token; that chain through
 * memory is shorter than a token's 16 conversions). On Zen 3 (AVX2, group
 * 1, f16) it read 0.83 of the sweep against 0.80 in two passes, and 0.81
 * against 0.80 in another comparison (medians of 8 alternating runs each):
 * less than the runs' spread, but ahead both times.
 *
 * That is the source's shape, not the machine code's: gcc 12 (f16, head_dim
 * 128) sees nothing else touch hi[] inside the loop, keeps its 8 sums in
 * registers (still storing them each token), and spills 2 of the first 8
 * accumulators to the stack instead, so that 2 chains, not 8, go through
 * memory. A compiler barrier at every token, to make it the shape written
 * here, read 0.87 of that on one page (Zen 5, family 26 model 2, AVX2,
 * group 1, 2 threads, paired; doc/figures.md, forty-first session), so the
 * loop stays as gcc lays it out. Two tokens a step and two passes of half a
 * row were measured again there: neither gains out of cache (README, tried).
 */
AI void accumulate_one(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
		       struct kva__pf *pf, float s[][ROW], int g0, int c0, const enum kva_dtype dt,
		       int NC, const int nc)
{
	const int D = NC * 8;
	const size_t esize = kva__esize(dt);
	float *out = t->acc + (size_t)g0 * D + (size_t)c0 * 8;
	_Alignas(32) float hi[64];
	float *hp = hi;
	__m256 acc[8];

	for (int cc = 0; cc < 8; cc++)
		acc[cc] = _mm256_loadu_ps(out + cc * 8);
	for (int cc = 8; cc < nc; cc++)
		_mm256_store_ps(hi + (cc - 8) * 8, _mm256_loadu_ps(out + cc * 8));
	__asm__ volatile("" : "+r"(hp) : : "memory"); /* hi stays in memory */

	const char *const *vp = bk->v, *const *vend = bk->v + bk->n;
	const float *sp = &s[g0][0];
	const size_t off = hoff + (size_t)c0 * 8 * esize;
	const ptrdiff_t step = t->one_step;

	for (const char *const *cend; vp < vend;) {
		kva__pf_step(pf);
		cend = vend - vp > step ? vp + step : vend;
		for (; vp < cend; vp++, sp++) {
			const char *row = *vp + off;
			__m256 b = _mm256_broadcast_ss(sp);

			for (int cc = 0; cc < 8; cc++)
				acc[cc] = _mm256_fmadd_ps(b, kva__load8(row + (size_t)cc * 8 * esize, dt),
							  acc[cc]);
			for (int cc = 8; cc < nc; cc++)
				_mm256_store_ps(hp + (cc - 8) * 8,
						_mm256_fmadd_ps(b, kva__load8(row + (size_t)cc * 8 * esize, dt),
								_mm256_load_ps(hp + (cc - 8) * 8)));
		}
	}
	for (int cc = 0; cc < 8; cc++)
		_mm256_storeu_ps(out + cc * 8, acc[cc]);
	for (int cc = 8; cc < nc; cc++)
		_mm256_storeu_ps(out + cc * 8, _mm256_load_ps(hp + (cc - 8) * 8));
}

/* the chunks of a part: 3-chunk parts end 3 + 1 as 2 + 2 (8 accumulators, not 4) */
static inline int part_chunks(int NC, int c0, int CG)
{
	return CG == 3 && NC - c0 == 4 ? 2 : CG;
}

/* heads [g0, g0 + GB) x all chunks, a part at a time */
AI void accumulate_heads(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
			 struct kva__pf *pf, float s[][ROW], int g0, const enum kva_dtype dt,
			 int NC, const int GB, const int CG, const int PH, const int PT)
{
	for (int c0 = 0; c0 < NC;) {
		int cg = part_chunks(NC, c0, CG);

		if (cg == 2)
			accumulate_part(t, bk, hoff, pf, s, g0, c0, dt, NC, GB, 2, PH, PT);
		else
			accumulate_part(t, bk, hoff, pf, s, g0, c0, dt, NC, GB, CG, PH, PT);
		c0 += cg;
	}
}

/*
 * The register tile of each phase for the heads [g0, g0 + rest) a group
 * has left: four heads at a time (scores 3 tokens x 4, output 4 x 3
 * chunks), and whatever is left at the end as a group of that size would
 * be: three as four, two as 2 x 6 and 2 x 4, one as 12 x 1 and 1 x 8. So a
 * group of 5, 6 or 7 runs a group of 4's code and then a group of 1, 2 or
 * 3's (but a group's last five output together, out_heads), and none of
 * them the shared tails' loops over run-time counts.
 */
static inline int score_tb(int rest)
{
	return rest >= 3 ? 3 : rest == 2 ? 6 : 12;
}

static inline int out_cg(int rest)
{
	return rest == 5 ? 2 : rest >= 3 ? 3 : rest == 2 ? 4 : 16;
}

/*
 * The heads of the output's next part: four, but the last five together
 * (groups 5, 9, 13, ...) as 5 x 2 chunks (10 accumulators, 2 chunks and a
 * broadcast: 13 ymm), where 4 x 3 and then one head alone (accumulate_one)
 * convert each V chunk twice a token, once for the four and again for the
 * fifth, and the fifth's pass keeps half its accumulators in L1. Group 5
 * is a real shape (40 query heads over 8 KV heads, as in some 14B-32B
 * models). Paired on Zen 5 (family 26 model 2, AVX2, f16, head_dim 128,
 * 2 threads; doc/figures.md, thirty-sixth session): group 5 out of cache
 * 1.01-1.10x as fast (the host's phase deciding), bf16 1.08x, fp8 1.16x,
 * f32 1.03-1.05x, int8 0.99, head_dim 80 1.07x, 256 1.01-1.02x, one
 * thread 1.05x; in L3 1.04x, but in L1 (one page, one thread) the same,
 * 1.00: what it saves is not the core's time but how the turn's reads
 * meet its arithmetic, not pinned down further. Group 13 1.02x, group 9
 * 0.97-1.00 (a build with its code unchanged read 0.98-0.99 against the
 * same).
 */
static inline int out_heads(int rest)
{
	return rest == 5 ? 5 : 4;
}

/* one head's chunks [c0, NC): accumulate_one()'s (the rest of a row in
 * one pass), or accumulate_part()'s 8 when no more than 8 are left */
AI bool one_rows(int NC, int c0)
{
	return NC - c0 > 8;
}

/* a prefetch step every acc_step() tokens of each part (t->one_step of one head's rows) */
AI void accumulate(const struct kva__tile *t, const struct kva__rows *bk, size_t hoff,
		   struct kva__pf *pf, float s[][ROW], const enum kva_dtype dt, int NC)
{
	for (int g0 = 0; g0 < t->group; g0 += out_heads(t->group - g0)) {
		const int rest = t->group - g0;

		if (rest == 5)
			accumulate_heads(t, bk, hoff, pf, s, g0, dt, NC, 5, 2, ROW, 1);
		else if (rest >= 3)
			accumulate_heads(t, bk, hoff, pf, s, g0, dt, NC, 4, 3, ROW, 1);
		else if (rest == 2)
			accumulate_heads(t, bk, hoff, pf, s, g0, dt, NC, 2, 4, ROW, 1);
		else
			for (int c0 = 0; c0 < NC; c0 += 16) {
				if (NC - c0 >= 16)
					accumulate_one(t, bk, hoff, pf, s, g0, c0, dt, NC, 16);
				else if (one_rows(NC, c0))
					accumulate_one(t, bk, hoff, pf, s, g0, c0, dt, NC, NC - c0);
				else
					accumulate_part(t, bk, hoff, pf, s, g0, c0, dt, NC, 1, 8, ROW, 1);
			}
	}
}

/* the prefetch steps of one head's turn at a block of n tokens: what
 * head_block()'s scores, softmax and accumulate() take, counted the same
 * way, with one head's rows a step every @one_step tokens */
static int head_steps(int G, int NC, int n, int one_step, bool pf_queue)
{
	int steps = G; /* the softmax: one a query head */

	for (int g0 = 0; g0 < G; g0 += 4)
		steps += (n + score_tb(G - g0) - 1) / score_tb(G - g0);
	for (int g0 = 0; g0 < G; g0 += out_heads(G - g0)) {
		const int rest = G - g0, cg = out_cg(rest);

		for (int c0 = 0; c0 < NC; c0 += part_chunks(NC, c0, cg))
			if (rest == 1 && one_rows(NC, c0))
				steps += (n + one_step - 1) / one_step;
			else
				steps += (n + acc_step(pf_queue) - 1) / acc_step(pf_queue);
	}
	return steps;
}

/*
 * The long step where the lines a step asks for (the next turn's, spread
 * over this one's steps as kva__pf_begin spreads them: one head, a run a
 * row, a line more for a run off a line boundary) are no more than the
 * core keeps of a burst; else, and where that is not known, the short one.
 * Zen 4 (64 kept): 8 at f16 and bf16 (44 lines a step at group 1, head_dim
 * 128), 4 at f32 (79); Zen 3 (21-26): 4.
 */
int kva__avx2_one_step(enum kva_dtype dt, int head_dim, int group, int kept)
{
	const int lines = 2 * KVA__BLOCK_TOKENS * (int)(((size_t)head_dim * kva__esize(dt) + 63) / 64 + 1);
	const int steps = head_steps(group, head_dim / 8, KVA__BLOCK_TOKENS, ONE_STEP_LONG,
				     kva__pf_queues(kept));

	return (lines + steps - 1) / steps <= kept ? ONE_STEP_LONG : ONE_STEP_SHORT;
}

/*
 * A block's K and V scales, one a token (kva__scales_at), fp8's times 2^8:
 * kva__load8() gives fp8 values times 2^-8 (KVA__FP8_LOAD8_UNIT), so that
 * its conversion has no multiply. A power of two: the products are those
 * of the values times the scales, bit for bit.
 */
AI void block_scales(const struct kva__tile *t, int32_t tb, int n, float *ks, float *vs,
		     const enum kva_dtype dt)
{
	kva__scales_at(t, tb, n, t->kv_head, ks, vs);
	if (dt == KVA_FP8_E4M3)
		for (int i = 0; i < n; i++) {
			ks[i] /= KVA__FP8_LOAD8_UNIT;
			vs[i] /= KVA__FP8_LOAD8_UNIT;
		}
}

/*
 * fp8's NaNs. kva__load8() reads e4m3's NaN bytes (0x7f, 0xff) as finite
 * values, so that its conversion is three operations; a turn looks for
 * them apart, in every K and V row of the block at once (a byte b is one
 * when b | 0x80 is 0xff: three operations a 32 bytes), and only where there
 * are any does it mark what they reach, as the arithmetic would have: a K
 * row's NaN makes the token's scores NaN for every head, a V row's NaN
 * makes its column of every head's output NaN (p x NaN is NaN, also where
 * p is 0). NaN stays NaN through the rescales, so the turn's end is as
 * good a place for the columns as the token's.
 */
AI bool fp8_any_nan(const char *const *rows, int n, size_t hoff, const int RB)
{
	const __m256i hi = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi8(-1);
	__m256i acc = _mm256_setzero_si256();
	__m128i acc8 = _mm_setzero_si128();

	for (int i = 0; i < n; i++) {
		const char *r = rows[i] + hoff;
		int o = 0;

		for (; o + 32 <= RB; o += 32)
			acc = _mm256_or_si256(acc, _mm256_cmpeq_epi8(_mm256_or_si256(
				_mm256_loadu_si256((const __m256i *)(const void *)(r + o)), hi), ones));
		for (; o < RB; o += 8) /* RB is a multiple of 8 (head_dim's) */
			acc8 = _mm_or_si128(acc8, _mm_cmpeq_epi8(_mm_or_si128(
				_mm_loadl_epi64((const __m128i *)(const void *)(r + o)),
				_mm256_castsi256_si128(hi)), _mm256_castsi256_si128(ones)));
	}
	/* the 8-byte loads' upper halves are 0, | 0x80: never 0xff */
	return !_mm256_testz_si256(acc, acc) || !_mm_testz_si128(acc8, acc8);
}

/* the scores of tokens whose K row holds a NaN: s[t * ts + g * hs], NaN */
static __attribute__((noinline, cold)) void fp8_nan_scores(const char *const *rows, int n,
							   size_t hoff, int RB, float *s,
							   size_t ts, size_t hs, int G)
{
	for (int i = 0; i < n; i++)
		for (int o = 0; o < RB; o++)
			if (kva_fp8_is_nan((uint8_t)rows[i][hoff + (size_t)o])) {
				for (int g = 0; g < G; g++)
					s[(size_t)i * ts + (size_t)g * hs] = NAN;
				break;
			}
}

/* the output columns some V row holds a NaN in: NaN in every head's
 * accumulators (@D, head_dim, is also a row's bytes at fp8) */
static __attribute__((noinline, cold)) void fp8_nan_columns(const struct kva__tile *t,
							    const char *const *rows, int n,
							    size_t hoff, int D)
{
	for (int d = 0; d < D; d++)
		for (int i = 0; i < n; i++)
			if (kva_fp8_is_nan((uint8_t)rows[i][hoff + (size_t)d])) {
				for (int g = 0; g < t->group; g++)
					t->acc[(size_t)g * D + (size_t)d] = NAN;
				break;
			}
}

/* head @g's output accumulators times @r: the running maximum moved */
AI void scale_acc(const struct kva__tile *t, int g, int NC, float r)
{
	const __m256 rv = _mm256_set1_ps(r);
	float *o = t->acc + (size_t)g * NC * 8;

	for (int c = 0; c < NC; c++)
		_mm256_storeu_ps(o + c * 8, _mm256_mul_ps(_mm256_loadu_ps(o + c * 8), rv));
}

/*
 * The per-token scales @x (kva__scales_at) in the lanes of token-major
 * vector @k of a group of G: lanes 0-3 are token 8k / G's, 4-7 token
 * (8k + 4) / G's (at G = 4 two tokens, at 8 and 16 one)
 */
AI __m256 token_lanes(const float *x, int k, const int G)
{
	return _mm256_setr_m128(_mm_set1_ps(x[8 * k / G]), _mm_set1_ps(x[(8 * k + 4) / G]));
}

/*
 * The turn of a group of G = 4, 8 or 16 heads, with the scores
 * token-major, s[t][g], G floats a token: the 3 x 4
 * score tiles store their sums as they come (no transposes), and the
 * softmax folds every head at once, lane by lane, with no horizontal
 * reduction per head and one exp2_ps for all the heads' rescales (not an
 * exp2f call each). A ymm of scores holds 2 tokens at G = 4, 1 at 8, half
 * of one at 16: the heads' lanes repeat every P = max(1, G / 8) vectors,
 * and the softmax keeps P of each running vector.
 * fp8 and int8 fold their scales in as head_block() does, a vector at a
 * time: the K scales into the scores before the maxima, the V scales into
 * p after l's sum, each token's in its lanes (a pad's K scale 1 and V
 * scale 0 keep it -inf and 0, whatever fp8's one scale a head is).
 * The prefetch steps are head_block()'s: the scores' and outputs' the
 * same, the softmax's G (6 vectors each).
 */
AI void tg_block(const struct kva__tile *t, const struct kva__rows *bk, struct kva__pf *pf,
		 int32_t tb, size_t hoff, const enum kva_dtype dt, int NC, const int G)
{
	const int n = bk->n, P = G >= 8 ? G / 8 : 1;
	const int nvec = (n * G + 7) / 8; /* the last one half a token's at G = 4 and n odd */
	const __m256 minf = _mm256_set1_ps(-INFINITY);
	_Alignas(32) float s[KVA__MAX_GROUP][ROW];
	_Alignas(32) float r[16];
	_Alignas(32) float ks[KVA__BLOCK_TOKENS], vs[KVA__BLOCK_TOKENS];
	const bool scaled = dt == KVA_FP8_E4M3 || dt == KVA_INT8;
	float *st = &s[0][0];
	__m256 mv[2] = { minf, minf }, mnew[2], rv[2], psum[2];

	const bool knan = dt == KVA_FP8_E4M3 && fp8_any_nan(bk->k, n, hoff, NC * 8);
	const bool vnan = dt == KVA_FP8_E4M3 && fp8_any_nan(bk->v, n, hoff, NC * 8);

	for (int g0 = 0; g0 < G; g0 += 4)
		score_heads(t, bk, pf, hoff, g0, s, dt, NC, 3, 4, G);
	if (knan)
		fp8_nan_scores(bk->k, n, hoff, NC * 8, st, G, 1, G);
	/* a tail of half a vector (G 4, n odd): the upper 4 lanes are no token
	 * (their K scale 1, V scale 0: kva__scales_at) */
	if (G == 4 && (n & 1))
		_mm_store_ps(st + n * G, _mm256_castps256_ps128(minf));
	if (scaled)
		block_scales(t, tb, n, ks, vs, dt);
	for (int k = 0; k < nvec; k++) {
		__m256 x = _mm256_load_ps(st + 8 * k);

		if (scaled) { /* the K scales, stored for the exp loop */
			x = _mm256_mul_ps(x, token_lanes(ks, k, G));
			_mm256_store_ps(st + 8 * k, x);
		}
		mv[k % P] = _mm256_max_ps(mv[k % P], x);
	}
	for (int ph = 0; ph < P; ph++) {
		/* the heads' maxima, in the lanes they have in a vector: at G = 4
		 * both halves of one are the same 4 heads, folded */
		__m256 mold = G == 4 ? _mm256_broadcast_ps((const __m128 *)t->m)
				     : _mm256_loadu_ps(t->m + 8 * ph);
		__m256 m = mv[ph];

		if (G == 4)
			m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
		mnew[ph] = _mm256_max_ps(mold, m);
		/* exp2(m_old - m_new); a head with no scores yet (m_old -inf)
		 * has l and acc 0, whatever it is multiplied by */
		rv[ph] = exp2_ps(_mm256_sub_ps(mold, mnew[ph]));
		psum[ph] = _mm256_setzero_ps();
		if (G == 4)
			_mm_storeu_ps(t->m, _mm256_castps256_ps128(mnew[ph]));
		else
			_mm256_storeu_ps(t->m + 8 * ph, mnew[ph]);
	}
	for (int k0 = 0; k0 < 6 * G; k0 += 6) { /* a block's vectors, 6 a step */
		const int k1 = k0 + 6 < nvec ? k0 + 6 : nvec;

		kva__pf_step(pf);
		for (int k = k0; k < k1; k++) {
			/* exp2(-inf - m) is 2^-126, not 0: a lane of no token is
			 * masked to 0 */
			__m256 p = exp2_ps(_mm256_sub_ps(_mm256_load_ps(st + 8 * k), mnew[k % P]));

			if (G == 4 && 8 * k + 8 > n * G)
				p = _mm256_blend_ps(p, _mm256_setzero_ps(), 0xf0);
			psum[k % P] = _mm256_add_ps(psum[k % P], p);
			if (scaled) /* the V scales: p's weights of the rows */
				p = _mm256_mul_ps(p, token_lanes(vs, k, G));
			_mm256_store_ps(st + 8 * k, p);
		}
	}
	for (int ph = 0; ph < P; ph++) {
		if (G == 4) {
			__m128 ps = _mm_add_ps(_mm256_castps256_ps128(psum[0]),
					       _mm256_extractf128_ps(psum[0], 1));

			_mm_storeu_ps(t->l, _mm_fmadd_ps(_mm_loadu_ps(t->l),
							 _mm256_castps256_ps128(rv[0]), ps));
		} else {
			_mm256_storeu_ps(t->l + 8 * ph,
					 _mm256_fmadd_ps(_mm256_loadu_ps(t->l + 8 * ph), rv[ph], psum[ph]));
		}
		_mm256_store_ps(r + 8 * ph, rv[ph]);
	}
	for (int g = 0; g < G; g++)
		if (r[g] != 1.0f)
			scale_acc(t, g, NC, r[g]);
	for (int g0 = 0; g0 < G; g0 += 4)
		accumulate_heads(t, bk, hoff, pf, s, g0, dt, NC, 4, 3, 1, G);
	if (vnan)
		fp8_nan_columns(t, bk->v, n, hoff, NC * 8);
}

/* One KV head's turn at a block: score, fold into the softmax state, accumulate. */
AI void head_block(const struct kva__tile *t, const struct kva__rows *bk, struct kva__pf *pf,
		   int32_t tb, size_t hoff, const enum kva_dtype dt, int NC)
{
	const int G = t->group, nv = (bk->n + 7) / 8;
	const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	_Alignas(32) float s[KVA__MAX_GROUP][ROW];
	_Alignas(32) float ks[KVA__BLOCK_TOKENS], vs[KVA__BLOCK_TOKENS];

	/* token-major scores (tg_block), each G a constant in an instance of
	 * its own */
	if (G == 4) {
		tg_block(t, bk, pf, tb, hoff, dt, NC, 4);
		return;
	}
	if (G == 8) {
		tg_block(t, bk, pf, tb, hoff, dt, NC, 8);
		return;
	}
	if (G == 16) {
		tg_block(t, bk, pf, tb, hoff, dt, NC, 16);
		return;
	}
	const bool knan = dt == KVA_FP8_E4M3 && fp8_any_nan(bk->k, bk->n, hoff, NC * 8);
	const bool vnan = dt == KVA_FP8_E4M3 && fp8_any_nan(bk->v, bk->n, hoff, NC * 8);

	if (dt == KVA_FP8_E4M3 || dt == KVA_INT8)
		block_scales(t, tb, bk->n, ks, vs, dt);
	for (int g0 = 0; g0 < G; g0 += 4)
		if (G - g0 >= 3)
			score_heads(t, bk, pf, hoff, g0, s, dt, NC, 3, 4, 0);
		else if (G - g0 == 2)
			score_heads(t, bk, pf, hoff, g0, s, dt, NC, 6, 2, 0);
		else
			score_heads(t, bk, pf, hoff, g0, s, dt, NC, 12, 1, 0);
	if (knan)
		fp8_nan_scores(bk->k, bk->n, hoff, NC * 8, &s[0][0], 1, ROW, G);

	for (int g = 0; g < G; g++) {
		__m256 sv[KVA__BLOCK_TOKENS / 8], mv = _mm256_set1_ps(-INFINITY), psum;
		float mb, r;

		for (int i = bk->n; i < nv * 8; i++)
			s[g][i] = -INFINITY;
		for (int j = 0; j < nv; j++) {
			sv[j] = _mm256_load_ps(s[g] + 8 * j);
			if (dt == KVA_FP8_E4M3 || dt == KVA_INT8) /* the K scales */
				sv[j] = _mm256_mul_ps(sv[j], _mm256_load_ps(ks + 8 * j));
			mv = _mm256_max_ps(mv, sv[j]);
		}
		/*
		 * A step for each head's softmax too: without one, memory
		 * idles while the softmax runs, about a tenth of group 4's
		 * time in the core (with no softmax at all group 4 read
		 * 1.07x as fast out of cache). Zen 3, AVX2, kvarena-ab (2
		 * threads): group 4 1.01-1.05x as fast out of cache and
		 * group 1 1.03, each build in four code layouts (doc/figures.md,
		 * sixteenth session); in L2 1.00.
		 */
		kva__pf_step(pf);
		mb = kva_max(t->m[g], hmax8(mv));
		r = kva_rescale(t->m[g], mb);
		if (r != 1.0f) {
			t->l[g] *= r;
			scale_acc(t, g, NC, r);
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

	/* 8 accumulators for one or two heads (memory bounds them), 12 for more */
	accumulate(t, bk, hoff, pf, s, dt, NC);
	if (vnan)
		fp8_nan_columns(t, bk->v, bk->n, hoff, NC * 8);
}

AI void tile(const struct kva__tile *t, const enum kva_dtype dt, int NC)
{
	const size_t row_bytes = (size_t)NC * 8 * kva__esize(dt);
	struct kva__blocks b;

	/* a head's turn ahead (kernels_pvt.h) */
	kva__blocks_begin(&b, t, row_bytes,
			  head_steps(t->group, NC, KVA__BLOCK_TOKENS, t->one_step, t->pf_queue), true);
	for (int32_t tb = t->t0; tb < t->t1; tb += KVA__BLOCK_TOKENS) {
		const struct kva__rows *bk = kva__blocks_next(&b, t, tb);

		for (int h = 0; h < t->heads; h++) {
			struct kva__tile th;

			kva__blocks_turn(&b, t, h);
			kva__tile_head(t, h, &th);
			head_block(&th, bk, &b.pf, tb, kva__head_offset(t->kv, h), dt, NC);
			kva__blocks_turn_end(&b, bk);
		}
	}
}

/*
 * One instance per dtype (its conversion is in the innermost loops), and
 * per head_dim 64 and 128 besides the generic one: with head_dim a constant
 * the query rows and chunks are displacements from one register, where a
 * run-time stride costs a register per row, and the ones the loop runs out
 * of are reloaded from the stack every iteration. Each instance is a
 * function of its own, called once a tile: inlined all into one function,
 * the fifteen took clang with ASan and UBSan (the fuzz build, on a 2-vCPU
 * Zen 4 guest) over 12 minutes to compile; apart, 5.6 (3.4 before
 * token-major scores).
 */
#define TILE_INSTANCES(DT, name)                                                  \
	static __attribute__((noinline)) void name##_128(const struct kva__tile *t) \
	{                                                                         \
		tile(t, DT, 16);                                                  \
	}                                                                         \
	static __attribute__((noinline)) void name##_64(const struct kva__tile *t)  \
	{                                                                         \
		tile(t, DT, 8);                                                   \
	}                                                                         \
	static __attribute__((noinline)) void name##_any(const struct kva__tile *t) \
	{                                                                         \
		tile(t, DT, t->kv->head_dim / 8);                                 \
	}                                                                         \
	static void name(const struct kva__tile *t)                               \
	{                                                                         \
		if (t->kv->head_dim == 128)                                       \
			name##_128(t);                                            \
		else if (t->kv->head_dim == 64)                                   \
			name##_64(t);                                             \
		else                                                              \
			name##_any(t);                                            \
	}

TILE_INSTANCES(KVA_F32, tile_f32)
TILE_INSTANCES(KVA_F16, tile_f16)
TILE_INSTANCES(KVA_BF16, tile_bf16)
TILE_INSTANCES(KVA_FP8_E4M3, tile_fp8)
TILE_INSTANCES(KVA_INT8, tile_int8)

void kva__tile_avx2(const struct kva__tile *t)
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

void kva__axpy_avx2(float *y, const float *x, float a, int32_t n)
{
	const __m256 av = _mm256_set1_ps(a);

	for (int32_t i = 0; i < n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
}
