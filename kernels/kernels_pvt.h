/* SPDX-License-Identifier: MIT */
/*
 * kernels_pvt.h - what the decode driver (decode.c) and the per-ISA tile
 * kernels (tile_*.c) agree on.
 *
 * A tile is one (sequence, split, span of KV heads): a run of whole pages of
 * one sequence, read once for every query head of the span's groups. Its
 * kernel leaves, per query head, the log2-domain online-softmax state (m, l)
 * and the unnormalised output acc; the driver merges the splits
 * (decode_math.h) and normalises.
 *
 * A span is every KV head unless the batch has too few splits to keep the
 * threads busy. The arena's pages are HND, [kv_head][token][head_dim]: a
 * head's rows of a page are one piece (4 KiB: 16 tokens, f16, head_dim 128)
 * and the heads' pieces lie end to end, so a tile over all of them reads
 * each page whole (the prefetch cursor below walks it in address order),
 * where a tile per head reads one piece of each page and leaves the rest of
 * every DRAM row to seven other tiles. Each head is computed alone, in the
 * same order whatever the span: the result does not depend on how heads
 * were grouped.
 */
#ifndef KVA_KERNELS_PVT_H
#define KVA_KERNELS_PVT_H

#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <stdint.h>
#ifdef KVA__PF_AUDIT
#include <stdio.h>
#include <stdlib.h>
#endif

#include "decode_math.h"
#include "kvarena.h"

#define KVA__MAX_GROUP 64      /* query heads per KV head */
#define KVA__MAX_HEAD_DIM 1024
#define KVA__BLOCK_TOKENS 48   /* tokens a tile scores before it updates its softmax state */
_Static_assert(KVA__BLOCK_TOKENS % 48 == 0, "the vector tiles take blocks in 3 x 16 and 12 x 4 tokens");

struct kva__tile {
	const struct kva_kv_desc *kv;
	const int32_t *pages;  /* the sequence's page ids, all checked < num_pages */
	int32_t t0, t1;        /* its tokens [t0, t1), t0 < t1; t0 is page-aligned */
	int32_t kv_head;       /* the span: KV heads [kv_head, kv_head + heads) */
	int32_t heads;
	int32_t group;         /* query heads per KV head, 1..KVA__MAX_GROUP */
	const float *q;        /* [heads][group][head_dim]: q * sm_scale * log2(e), fp32;
				* for the AVX-512 tile's sliced groups [heads][head_dim / W][16]
				* (kva__avx512_gp), or [heads][4][head_dim] (sl_dot); as
				* subgroups, each one's after the other's (kva__avx512_sub) */
	size_t q_stride;       /* floats from one KV head's q to the next's */
	float *acc;            /* [heads][group][head_dim] out */
	float *m, *l;          /* [heads][group] out */
	/* the tile this thread runs next (NULL: none), whose first block the
	 * vector tiles prefetch while they compute their own last one; and
	 * whether this tile's first block was prefetched so (by the tile before) */
	const struct kva__tile *next;
	bool warm;
	/* the AVX2 tile: tokens of one head's output rows between prefetch
	 * steps (tile_avx2.c), >= 1 */
	int32_t one_step;
	/* the AVX2 tile, on a core that keeps a whole burst of prefetches
	 * (kva__pf_queues): the cursor asks for a run's lines back to back
	 * (kva__pf_lines), and the multi-head parts step every 16 tokens */
	bool pf_queue;
	/* the AVX-512 tile's dot products (groups 1 and 2 at head_dim 64 and
	 * 128), on a CPU that reads faster with it (kva__pf_t0): their sites
	 * ask for lines with hint T0, not T1 (struct kva__pfq) */
	bool pf_t0;
	/* the step cursor (kva__pf_lines) asks for lines with hint T0, not
	 * T1: the AVX2 tile at group 1 on pages where a head's rows lie end
	 * to end, on a CPU that reads faster so (kva__cursor_t0) */
	bool pf_cursor_t0;
	/* the AVX-512 tile's groups of 3 and 4 (kva__avx512_gp 4), on a CPU
	 * where it is faster (kva__sl_dot), score by dot products (its
	 * g4_scores): q is then [heads][4][head_dim], a pad head's row 0 */
	bool sl_dot;
	/* the AVX2 tile's one-head scores (group 1, a group's last head), on a
	 * CPU that reads faster so (kva__avx2_cols), at element sizes of 2
	 * bytes or less: 12 rows a chunk at a time, not 2 rows from start to
	 * end (tile_avx2.c, score_body) */
	bool one_cols;
	/* the AVX-512 tile: a group with no sliced shape as subgroups
	 * (kva__avx512_sub), on a CPU that reads faster so
	 * (kva__avx512_subgroups); q is then each subgroup's layout after
	 * the other's */
	bool subgroups;
};

/*
 * A core that keeps (nearly) all of a burst of 64 prefetches to lines in
 * no cache (kva_cpu_prefetch_kept(): Zen 4 63-64), not one that drops what
 * it cannot start (Zen 3 21-26). The two want different cursors: a run's
 * lines asked for in one tight loop read 1.08-1.09x as fast in L2 at group
 * 1 on Zen 4 and 0.99-1.06 out of cache (doc/figures.md, twenty-first session),
 * where on Zen 3 the same loop read 0.957-0.974 at group 1 (8-token
 * steps) and 0.945 at group 2 out of cache (seventeenth session).
 */
static inline bool kva__pf_queues(int32_t kept)
{
	/* 7/8 of the burst: the measured counts sit at either end (Zen 4
	 * 63-64, Zen 3 21-26). Under TSan, whose instrumented loads slow the
	 * probe, a Zen 4 read 16-55 (16 runs): either cursor may run there,
	 * and only speed depends on it */
	return kept >= 56;
}

/*
 * The AVX-512 tile's sliced scores (tile_avx512.c): a group of 3 to 16
 * query heads padded to GP = 4, 8 or 16, each zmm of score sums GP heads x
 * W = 16 / GP slices of head_dim, for head_dim up to 256 (its K rows in fp32
 * on the stack), where the pad heads are no more than a quarter of GP
 * (groups 3, 4, 6-8, 12-16); 0: dot products, q as it is (groups 5 and
 * 9-11, whose pads would be 3 of 8 and 5 to 7 of 16: paired on Intel Xeon
 * family 6 model 207, the dot products ran group 5 1.07-1.16x as fast as
 * sliced, 9 1.13-1.19x, 10 1.05-1.08x, 11 1.0x; group 6 1.0x, 7 0.94-0.96x,
 * 12 0.90-0.94x, doc/figures.md, twenty-fifth session; on Zen 5 they run
 * as subgroups, kva__avx512_sub below). Where it is not 0 the driver
 * lays each KV head's q out as [head_dim / W][16] (decode.c): lane g * W + j
 * of row r is q[g][r * W + j], 0 for a pad head (g >= group).
 */
#define KVA__SLICED_MAX_DIM 256

static inline int kva__avx512_gp(int32_t group, int32_t head_dim)
{
	int gp;

	if (group < 3 || group > 16 || head_dim > KVA__SLICED_MAX_DIM)
		return 0;
	gp = group <= 4 ? 4 : group <= 8 ? 8 : 16;
	return 4 * group >= 3 * gp ? gp : 0;
}

/*
 * The AVX-512 tile's subgroups, on a CPU that takes them
 * (kva__avx512_subgroups): a group with no sliced shape above (5, 9-11,
 * past 16), which the generic instance scores as 4 x 4 dot products, runs
 * as subgroups one after another over the same turn's rows (in L1 or L2
 * from the first on), each a group of its own: 16, 8 or 4 heads sliced
 * first, then the rest, cut the same way. So 5 = 4 + 1, 9 = 8 + 1, 10 =
 * 8 + 2, 11 = 8 + 3, 21 = 16 + 4 + 1; and 6 = 4 + 2 at elements of
 * @esize 2 bytes or less. A last 1 or 2 after a sliced 4, 8 or 16 is
 * computed inside its block (tile_avx512.c, sl_block's X, rider_turn),
 * laid out as here (groups 5, 6, 9, 10, 17, 18; 21 is 16, then 4 + 1).
 * The heads of the first subgroup of @group (all of them: one); each
 * subgroup's q is laid out as its own group's, kva__avx512_qrows rows
 * (decode.c).
 *
 * Groups that have a padded sliced shape (6, 12-14) keep it otherwise: as
 * subgroups one after another, 6 read 1.05-1.09x as fast at f16 on Zen 5
 * but 0.80-0.84 at fp8, whose conversion the second subgroup did again,
 * and 0.97 at head_dim 64 (doc/figures.md, thirty-fifth session). As 4 +
 * 2 in one block (thirty-seventh session) 6 reads 1.16-1.20x as fast at
 * f16, bf16 1.15-1.17x, fp8 1.08-1.10x, int8 1.20-1.22x, head_dims 64-256
 * 1.02-1.39x, but f32 (twice the bytes a row, memory bound) 0.93-0.96
 * and 0.90-0.93 at head_dim 64, so f32 keeps its padded 8.
 */
static inline int32_t kva__avx512_sub(int32_t group, int32_t head_dim, size_t esize,
				      bool subgroups)
{
	if (!subgroups || group <= 2 || head_dim > KVA__SLICED_MAX_DIM)
		return group;
	if (group == 6 && esize <= 2) /* 4 + 2, in one block */
		return 4;
	if (kva__avx512_gp(group, head_dim))
		return group;
	return group > 16 ? 16 : group > 8 ? 8 : 4;
}

/* the rows of q a subgroup of @heads takes (a head_dim of floats each):
 * its padded heads where sliced, else its heads */
static inline int32_t kva__avx512_qrows(int32_t heads, int32_t head_dim)
{
	const int32_t gp = kva__avx512_gp(heads, head_dim);

	return gp ? gp : heads;
}

/* The tile as its @i-th head sees it: a span of one. */
static inline void kva__tile_head(const struct kva__tile *t, int32_t i, struct kva__tile *h)
{
	const size_t gq = (size_t)i * (size_t)t->group;

	*h = *t;
	h->kv_head = t->kv_head + i;
	h->heads = 1;
	h->q = t->q + (size_t)i * t->q_stride;
	h->acc = t->acc + gq * (size_t)t->kv->head_dim;
	h->m = t->m + gq;
	h->l = t->l + gq;
}

/* @h, a copy of @t made once (kva__tile_head), set to its @i-th head: the
 * fields kva__tile_head sets. A turn over @h (the AVX-512 tile's head_block
 * and rider_turn) may move group, q, acc, m and l and nothing else, so
 * that this resets all it moved */
static inline void kva__tile_head_at(const struct kva__tile *t, int32_t i, struct kva__tile *h)
{
	const size_t gq = (size_t)i * (size_t)t->group;

	h->kv_head = t->kv_head + i;
	h->heads = 1;
	h->group = t->group;
	h->q = t->q + (size_t)i * t->q_stride;
	h->acc = t->acc + gq * (size_t)t->kv->head_dim;
	h->m = t->m + gq;
	h->l = t->l + gq;
}

typedef void (*kva__tile_fn)(const struct kva__tile *t);

/* tile_scalar.c: any dtype, any head_dim */
void kva__tile_scalar(const struct kva__tile *t);
/* tile_avx2.c, tile_avx512.c: head_dim a multiple of 8 / 16 */
void kva__tile_avx2(const struct kva__tile *t);
void kva__tile_avx512(const struct kva__tile *t);
/* y[0, n) += a x[0, n): the splits' merge (decode.c), in the tile's ISA;
 * n a multiple of 8 (AVX2), 16 (AVX-512) */
typedef void (*kva__axpy_fn)(float *y, const float *x, float a, int32_t n);
void kva__axpy_avx2(float *y, const float *x, float a, int32_t n);
void kva__axpy_avx512(float *y, const float *x, float a, int32_t n);
/* tile_avx2.c: the one_step the AVX2 tile takes for @dt, @head_dim (a
 * multiple of 8), @group, on a core that keeps @kept of a burst of 64
 * prefetches (0: not known). Plain integer code, but compiled with AVX2:
 * call it only where kva__isa_supported(KVA_ISA_AVX2) */
int kva__avx2_one_step(enum kva_dtype dt, int head_dim, int group, int kept);
/* decode.c: whether the AVX2 tile's step cursor asks for lines with hint
 * T0 (struct kva__tile's pf_cursor_t0) over @kv read by @group query heads
 * a KV head: at group 1, where a head's rows of a page lie end to end, on
 * a CPU that reads faster so (kva__pf_t0) */
bool kva__cursor_t0(const struct kva_kv_desc *kv, int32_t group);

/* Scale of token @t's head in int8 K (or V), or the fp8 scale; 1 otherwise. */
static inline float kva__scale(const struct kva_kv_desc *kv, const float *base, int32_t page,
			       int32_t t, int32_t head)
{
	if (kv->dtype == KVA_INT8)
		return base[(int64_t)page * kv->scale_page_stride + (int64_t)t * kv->scale_token_stride +
			    (int64_t)head * kv->scale_head_stride];
	if (kv->dtype == KVA_FP8_E4M3)
		return base[kv->flags & KVA_KV_SCALE_PER_TENSOR ? 0 : head];
	return 1.0f;
}

/* bytes per element, inline (kva_dtype_size is a library call) */
static inline size_t kva__esize(enum kva_dtype t)
{
	return t == KVA_F32 ? 4 : t == KVA_F16 || t == KVA_BF16 ? 2 : 1;
}

/* The address of token @t (in the sequence) of the tile's head in K or V. */
static inline const void *kva__row(const struct kva__tile *tl, const void *base, int32_t t)
{
	const struct kva_kv_desc *kv = tl->kv;
	int64_t e = kva_kv_index(kv->page_stride, kv->token_stride, kv->head_stride,
				 tl->pages[t / kv->page_size], t % kv->page_size, tl->kv_head);

	return (const char *)base + e * (int64_t)kva__esize(kv->dtype);
}

/*
 * The rows of a block of the tile's tokens: K and V addresses of the span's
 * first head, walked page by page without a division per token (the vector
 * paths call this once per block of KVA__BLOCK_TOKENS); the span's head i is
 * kva__head_offset(i) bytes on.
 *
 * seg[i] is the end of row i's segment: the first j > i whose row does not
 * lie one token stride past row j - 1's (a page's tokens, or more where
 * pages lie end to end). K's rows and V's are at the same offsets from their
 * bases, so one table serves both, and every head of the span. The prefetch
 * cursor takes its runs and pages by segment, at every head's turn (16
 * turns a block at 8 KV heads, K and V). Worked out here once a block, not
 * by a scan of the rows at each turn: 7% fewer instructions at group 4, and
 * on Zen 3 (AVX2, out of cache, against the build before) 1.05-1.10x as fast
 * at groups 1 and 4 with 8 KV heads, 1.05-1.17x with one (doc/figures.md,
 * fourteenth session; the AVX-512 tile shares it, unmeasured).
 */
struct kva__rows {
	const char *k[KVA__BLOCK_TOKENS], *v[KVA__BLOCK_TOKENS];
	uint8_t seg[KVA__BLOCK_TOKENS];
	int n;
};
_Static_assert(KVA__BLOCK_TOKENS <= UINT8_MAX, "a segment's end is a row index in a uint8_t");

static inline void kva__rows_at(const struct kva__tile *t, int32_t tb, struct kva__rows *r)
{
	const struct kva_kv_desc *kv = t->kv;
	const int64_t esize = (int64_t)kva__esize(kv->dtype);
	const int64_t head = (int64_t)t->kv_head * kv->head_stride, tok_bytes = kv->token_stride * esize;
	int32_t pi = tb / kv->page_size, off = tb % kv->page_size, n;
	const char *kp = NULL, *vp = NULL;

	n = t->t1 - tb < KVA__BLOCK_TOKENS ? t->t1 - tb : KVA__BLOCK_TOKENS;
	r->n = n > 0 ? n : 0;
	for (int i = 0; i < r->n; i++, off++) {
		if (off == kv->page_size) {
			off = 0;
			pi++;
		}
		if (i == 0 || off == 0) {
			int64_t e = (int64_t)t->pages[pi] * kv->page_stride + head;

			kp = (const char *)kv->k + e * esize;
			vp = (const char *)kv->v + e * esize;
		}
		r->k[i] = kp + off * tok_bytes;
		r->v[i] = vp + off * tok_bytes;
	}
	/* from the last row back, the end in a register: read back from
	 * seg[i + 1], each row waited for the store before it */
	for (int i = r->n - 1, end = r->n; i >= 0; i--) {
		if (i + 1 < r->n &&
		    (uintptr_t)r->k[i + 1] != (uintptr_t)r->k[i] + (uintptr_t)tok_bytes)
			end = i + 1;
		r->seg[i] = (uint8_t)end;
	}
}

static inline size_t kva__head_offset(const struct kva_kv_desc *kv, int32_t i)
{
	return (size_t)i * (size_t)kv->head_stride * kva__esize(kv->dtype);
}

/*
 * The K and V scales of tokens [tb, tb + n) of KV head @h (int8 and fp8:
 * the other dtypes have none); past n, 0 in vs (p is 0 past the end of a
 * block, and so must p * vs be) and 1 in ks (a score past the end is -inf,
 * and so must a whole vector of scores times ks keep it).
 */
static inline void kva__scales_at(const struct kva__tile *t, int32_t tb, int n, int32_t h,
				  float ks[KVA__BLOCK_TOKENS], float vs[KVA__BLOCK_TOKENS])
{
	const struct kva_kv_desc *kv = t->kv;
	int32_t pi = tb / kv->page_size, off = tb % kv->page_size;

	if (kv->dtype != KVA_INT8) { /* fp8: one scale a head (or the tensor) */
		const float k = kva__scale(kv, kv->k_scale, 0, 0, h);
		const float v = kva__scale(kv, kv->v_scale, 0, 0, h);

		for (int i = 0; i < n; i++) {
			ks[i] = k;
			vs[i] = v;
		}
	} else {
		/* int8: one a token, a page's run of them at a fixed stride from
		 * the page's own, worked out once a page */
		for (int i = 0; i < n; pi++, off = 0) {
			const int64_t at = (int64_t)t->pages[pi] * kv->scale_page_stride +
					   (int64_t)h * kv->scale_head_stride;
			const int64_t st = kv->scale_token_stride;
			const float *kb = kv->k_scale + at, *vb = kv->v_scale + at;

			for (int64_t o = off; o < kv->page_size && i < n; o++, i++) {
				ks[i] = kb[o * st];
				vs[i] = vb[o * st];
			}
		}
	}
	for (int i = n; i < KVA__BLOCK_TOKENS; i++) {
		ks[i] = 1.0f;
		vs[i] = 0.0f;
	}
}

/*
 * Prefetching the next block (or a head's next turn at one, see the block
 * loop below) while this one is computed, spread over the loops that
 * compute it (a burst of a whole block's prefetches stalls on the line
 * fill buffers) and in address order, K then V: in the arena's
 * HND pages ([head][token][dim]) a head's rows of a page lie end to end,
 * so the cursor takes one head's rows of a page as one run (4 KiB: f16,
 * head_dim 128) and the span's heads one after another, each page front to
 * back, as DRAM rows and the hardware prefetchers like; in NHD pages a
 * token's heads lie end to end instead, and it takes tokens in order.
 * Every line, into L2 (hint 2, T1): L1 cannot hold a block, and L2 to L1
 * is what out-of-order execution hides; measured on Zen 4 with one thread,
 * T1 gave 0.75 of the read ceiling where T0 gave 0.52 and NTA 0.49. On
 * Zen 5 (family 26), with twice the read bandwidth a core, T0 read up
 * to 1.1-1.2x more than T1 (avx2 on one thread; both paths on two at
 * group 1; not at group 4 on avx512), with this order or the one before:
 * the hint stays T1, whose loss there is smaller than T0's on Zen 4 (but
 * the AVX-512 tile's dot products take T0 on Zen 5, through their list of
 * runs: struct kva__pfq, kva__pf_t0). On Zen 3 (family 25 model 1, AVX2)
 * T0, T2 and NTA read 0.95-1.03 of T1 at groups 1 and 4 (doc/figures.md,
 * fifteenth session): no difference there. Since the fortieth session the
 * AVX2 tile's cursor asks with T0 on Zen 5 where that read faster, at
 * group 1 on head-major pages (pf->t0, kva__cursor_t0).
 */
struct kva__pf {
	const char *p;              /* the next line of the current run to ask for, */
	int left;                   /* and how many of its lines are left */
	const struct kva__rows *nx;
	size_t hstride, row, tok;   /* bytes from one head's row to the next's, of a
				     * run's piece (a row, or all the heads' of a
				     * token), from one token's row to the next's */
	int runs, per;              /* pieces a token has (heads, or 1 if they are
				     * one); lines a step asks for */
	bool head_major;            /* heads outer, tokens inner: a head's rows lie
				     * before the next head's (HND), or a
				     * segment's pieces lie end to end */
	int part, j, h;             /* the next run: K (0) or V (1), token, head */
	int j0, j1;                 /* tokens [j0, j1): rows one token stride apart */
	size_t base;                /* bytes from the rows' table to the first
				     * head the cursor reads (kva__pf_begin_head) */
	bool tight;                 /* a run's lines back to back (the tile's pf_queue) */
	bool t0;                    /* with hint T0 (the tile's pf_cursor_t0) */
#ifdef KVA__PF_AUDIT
	int taken;                  /* steps the turn's loops took (kva__blocks_turn_end) */
#endif
};

/*
 * A run is what the cursor reads front to back, so that its work is a count
 * and an add a line, not a row's address worked out again every four lines
 * (at group 4 the cursor runs between every few tokens' FMAs, and its own
 * instructions showed in the tile's profile): one head's rows of the
 * tokens of a page where they lie end to end (HND), all the heads' rows of
 * them where a token's heads lie end to end and so do the tokens (NHD),
 * else a row. Taking HND's rows token by token, each head in turn, jumped
 * 4 KiB every 256 bytes; in address order group 1 reads 1.1-1.4x faster
 * on one thread of Zen 5, on both vector paths (doc/figures.md).
 */
static inline void kva__pf_begin(struct kva__pf *pf, const struct kva__tile *t,
				 const struct kva__rows *nx, size_t row_bytes, int steps)
{
	size_t lines;

	pf->nx = nx;
	pf->hstride = kva__head_offset(t->kv, 1);
	pf->tok = (size_t)t->kv->token_stride * kva__esize(t->kv->dtype);
	pf->runs = pf->hstride == row_bytes ? 1 : t->heads;
	pf->row = pf->runs == 1 ? row_bytes * (size_t)t->heads : row_bytes;
	/* rows end to end (a whole segment a run) count as head-major too:
	 * with runs == 1 that is NHD's one run a segment */
	pf->head_major = pf->tok == pf->row || (pf->runs > 1 && pf->hstride > pf->tok);
	/* at most a run a row, and a run not on a line boundary touches one
	 * line more */
	lines = (size_t)(2 * nx->n * pf->runs) * ((pf->row + 63) / 64 + 1);
	pf->per = steps > 0 ? (int)((lines + (size_t)steps - 1) / (size_t)steps) : (int)lines;
	pf->part = nx->n ? 0 : 2;
	pf->j = pf->h = pf->j0 = pf->j1 = 0;
	pf->p = NULL;
	pf->left = 0;
	pf->base = 0;
	pf->tight = t->pf_queue;
	pf->t0 = t->pf_cursor_t0;
#ifdef KVA__PF_AUDIT
	pf->taken = 0;
#endif
}

/* a cursor with nothing to ask for: its steps do nothing */
static inline void kva__pf_none(struct kva__pf *pf)
{
	memset(pf, 0, sizeof(*pf));
	pf->part = 2;
}

/* the cursor on one head of @t's span, its @h-th, over the rows @nx of the
 * span's first head: a head's turn at a block, where kva__pf_begin takes
 * the whole span */
static inline void kva__pf_begin_head(struct kva__pf *pf, const struct kva__tile *t,
				      const struct kva__rows *nx, int32_t h, size_t row_bytes,
				      int steps)
{
	struct kva__tile th;

	kva__tile_head(t, h, &th);
	kva__pf_begin(pf, &th, nx, row_bytes, steps);
	pf->base = kva__head_offset(t->kv, h);
}

/* the next run's first byte and length; the cursor moved past it */
static inline uintptr_t kva__pf_run(struct kva__pf *pf, size_t *len)
{
	const char *const *row = pf->part ? pf->nx->v : pf->nx->k;
	uintptr_t r;

	if (pf->j == pf->j1) { /* a new segment */
		pf->j0 = pf->j;
		pf->j1 = pf->nx->seg[pf->j];
	}
	r = (uintptr_t)row[pf->j] + pf->base + (size_t)pf->h * pf->hstride;
	if (pf->head_major) {
		/* head by head over the segment's tokens: all of them as one
		 * run where they lie end to end, else a row at a time */
		const int n = pf->tok == pf->row ? pf->j1 - pf->j : 1;

		*len = pf->row * (size_t)n;
		if ((pf->j += n) == pf->j1) {
			if (++pf->h < pf->runs)
				pf->j = pf->j0; /* the next head, the same tokens */
			else
				pf->h = 0;
		}
	} else { /* token by token, each head of the token */
		*len = pf->row;
		if (++pf->h == pf->runs) {
			pf->h = 0;
			pf->j++;
		}
	}
	if (pf->j == pf->nx->n && pf->h == 0) {
		pf->j = pf->j0 = pf->j1 = 0;
		pf->part++;
	}
	return r;
}

/* the next run's lines into *p and *left; false when there are none */
static inline bool kva__pf_next(struct kva__pf *pf, const char **p, int *left)
{
	uintptr_t r;
	size_t len;

	if (pf->part >= 2)
		return false;
	r = kva__pf_run(pf, &len);
	/* from the line the run starts in to the one it ends in */
	*p = (const char *)(r & ~(uintptr_t)63);
	*left = (int)((r % 64 + len + 63) / 64);
	return true;
}

/* a line the cursor asks for (a test may count them instead) */
#ifndef KVA__PREFETCH
#define KVA__PREFETCH(a) __builtin_prefetch((a), 0, 2)
#endif

/* a line asked for with hint T0 (a test may count them too) */
#ifndef KVA__PREFETCH_T0
#define KVA__PREFETCH_T0(a) __builtin_prefetch((a), 0, 3)
#endif

/* a line a list's site (or the cursor) asks for: with hint T0 where @t0
 * (struct kva__pfq, kva__pf_lines), else as the cursor asks */
#define KVA__PREFETCH_AT(a, t0)                \
	do {                                   \
		if (t0)                        \
			KVA__PREFETCH_T0(a);   \
		else                           \
			KVA__PREFETCH(a);      \
	} while (0)

/*
 * @lines more lines (all that are left if @lines < 0). On a core that
 * queues prefetches (kva__pf_queues), as many of the run's lines as are
 * asked for in one loop, a prefetch and an add a line, the counts once a
 * run; else a line at a time with the counts, as the cursor always did
 * before (on Zen 3 the tight loop read 0.945-0.974 of it out of cache).
 */
static inline __attribute__((always_inline)) void kva__pf_lines_hint(struct kva__pf *pf,
									int lines, const bool T0)
{
	const char *p = pf->p;
	int left = pf->left;

	if (!pf->tight) {
		for (; lines != 0; lines--, left--) {
			if (!left && !kva__pf_next(pf, &p, &left))
				break;
			KVA__PREFETCH_AT(p, T0);
			p += 64;
		}
	} else {
		while (lines != 0) {
			const char *end;
			int n;

			if (!left && !kva__pf_next(pf, &p, &left))
				break;
			n = lines > 0 && lines < left ? lines : left; /* >= 1 */
			end = p + (size_t)n * 64;
			left -= n;
			if (lines > 0)
				lines -= n;
			do {
				KVA__PREFETCH_AT(p, T0);
				p += 64;
			} while (p != end);
		}
	}
	pf->p = p;
	pf->left = left;
}

/* the hint tested once a call, not a line: a test in the line loops,
 * never true, read the AVX2 tile 0.89-0.93 as fast (thirty-second session) */
static inline void kva__pf_lines(struct kva__pf *pf, int lines)
{
	if (pf->t0)
		kva__pf_lines_hint(pf, lines, true);
	else
		kva__pf_lines_hint(pf, lines, false);
}

/*
 * One step: pf->per lines, back to back. Left to the compiler, which makes
 * it a call in the AVX2 tile (gcc sees which registers the callee uses, so
 * the accumulators stay in theirs across it). Measured on Zen 3 (README
 * "Current figures", eleventh session), group 1, f16: its common case
 * inline (the run's next lines, a call only for a new run) computed 1.2x
 * faster with the data in L2, but read 0.48-0.67 of the sweep out of cache
 * where the call read 0.68-0.74; steps of 3 lines at every chunk and every
 * token, inline, read no more at group 1 and less at group 4. A core may
 * drop prefetches it cannot start (`prefetch_kept` of kvarena-bench
 * decode: 22-24 of 64 kept on that Zen 3), but bursts cut to fewer lines
 * read no more there either. Paired in one process on Zen 3 (kvarena-ab,
 * doc/figures.md, fifteenth session), over one page of 8 KV heads (in L2, group
 * 4): without any cursor the decode computed 1.20-1.33x as fast, with an
 * empty call in the place of each step 0.96-1.09 of the real cursor, with
 * the prefetches and no call (the common case inline) 1.00-1.07; so about
 * half of the cursor's cost in the core is this call. But out of cache
 * the inline step read 0.945-1.005 of the call's speed at group 4, and
 * finer steps of it (every 4 or 2 tokens of the output) 0.89-0.94: the
 * call stays.
 */
static inline void kva__pf_step(struct kva__pf *pf)
{
#ifdef KVA__PF_AUDIT
	pf->taken++;
#endif
	kva__pf_lines(pf, pf->per);
}

/*
 * A turn's lines asked for from inside the FMA loops, inline: the AVX-512
 * tile's cursor (tile_avx512.c: its sliced groups, and its dot products
 * for groups 1 and 2). The turn's runs are listed when it starts
 * (kva__pfq_begin, from the cursor above: at most two a token, a page's K
 * and V pieces of one head where pages are whole, a row each where they
 * are not), and every S-th iteration of the scores' and the output's loops
 * asks for the list's next L lines (kva__pfq_site; the dot products
 * a count of lines a step, kva__pfq_step), the current run's next line and
 * end held in two registers: a compare, the prefetches and an add, where a
 * step was a call, a line loop with two counts and its state's loads and
 * stores. kva__pfq_end asks for what the sites left (a turn of fewer
 * tokens than the one it prefetches for). No site calls anything: a call
 * in the loops (to fill the list again, with a shorter list) kept the
 * loops' general registers in memory and cost more than the cursor it
 * replaced.
 *
 * Why: paired on Intel Xeon family 6 model 207 (AVX-512, kvarena-ab, f16,
 * 2 threads, one page), the build with the cursor's logic but no prefetch
 * instruction read as fast as the real one, and one with no cursor at all
 * 1.27-1.33x (group 4) and 1.14-1.19x (group 8) as fast: the steps'
 * bookkeeping, not the prefetches, was a fifth (group 4) to a seventh
 * (group 8) of the tile's time in the core (doc/figures.md, twenty-seventh
 * session).
 */
#define KVA__PFQ_RUNS (2 * KVA__BLOCK_TOKENS)

struct kva__pfq {
	const char *p, *end;    /* the run being asked for: its next line, and its end */
	const char *(*run)[2];  /* the turn's runs, [first line, end) */
	int r, n;               /* the list's next run, and its runs */
	/* hint T0, not T1: false from kva__pfq_begin, so that the sliced
	 * groups' loops hold no test of it; the dot products set the tile's
	 * pf_t0. Paired on Zen 5 (family 26 model 2, AVX-512, 2 threads, f16,
	 * head_dim 128), T0 read group 1 1.01-1.06x and group 2 1.03-1.08x as
	 * fast out of cache (group 1 0.95x in L2), where the sliced groups (0.96-1.04)
	 * and the AVX2 tile (0.96-1.05) gained nothing (doc/figures.md,
	 * thirty-second session). Only here: the test, in the cursor's line
	 * loops (kva__pf_lines) and never true, cost the AVX2 tile 0.89-0.93
	 * at groups 4 and 8 and the AVX-512 generic instance 0.86-0.92 */
	bool t0;
};

/* the cursor's runs (up to KVA__PFQ_RUNS: all of a turn's) into @run; how many */
static __attribute__((noinline, unused)) int kva__pfq_fill(struct kva__pf *pf,
							     const char *run[][2])
{
	int n = 0;

	while (n < KVA__PFQ_RUNS && (pf->left || kva__pf_next(pf, &pf->p, &pf->left))) {
		run[n][0] = pf->p;
		pf->p += (size_t)pf->left * 64;
		run[n][1] = pf->p;
		pf->left = 0;
		n++;
	}
	return n;
}

/* @q on the turn the cursor @pf is set on: with @list its runs listed in
 * @run (taken from the cursor), else none (the cursor's own steps take
 * them, and kva__pfq_end has nothing to ask for) */
static inline __attribute__((always_inline)) void kva__pfq_begin(struct kva__pf *pf,
								   struct kva__pfq *q,
								   const char *run[][2], bool list)
{
	q->p = q->end = NULL;
	q->t0 = false;
	q->run = run;
	q->r = 0;
	q->n = list ? kva__pfq_fill(pf, run) : 0;
}

/* the next run's first line where the run has ended; false past the last */
static inline __attribute__((always_inline)) bool kva__pfq_run(struct kva__pfq *q)
{
	if (q->p < q->end)
		return true;
	if (q->r >= q->n)
		return false;
	q->p = q->run[q->r][0];
	q->end = q->run[q->r][1];
	q->r++;
	return true;
}

/*
 * One site: the list's next @L lines (fewer past its last), in one run or
 * two. A run of a row or a few (NHD, pages of few tokens, padded rows)
 * may end inside a site: its last lines and then the next run's first, as
 * a step goes on, so that a turn's sites ask for L lines each wherever
 * its runs end. When a site stopped at a run's end, 2-line runs under
 * 4-line sites left a third of the turn's lines to kva__pfq_end (asked for
 * at the turn's end, when the next turn already wants them).
 */
static inline __attribute__((always_inline)) void kva__pfq_site(struct kva__pfq *q, const int L)
{
	if (!kva__pfq_run(q))
		return;
	if (q->end - q->p >= 64 * L) {
		for (int l = 0; l < L; l++)
			KVA__PREFETCH_AT(q->p + 64 * l, q->t0);
		q->p += 64 * L;
	} else { /* across the run's end, a line at a time (p stops at each end) */
		for (int left = L; left > 0 && kva__pfq_run(q); left--) {
			KVA__PREFETCH_AT(q->p, q->t0);
			q->p += 64;
		}
	}
}

/*
 * One step: @lines lines (a constant of the call site: the dot products
 * ask for a share of what the step reads, tile_avx512.c's dot_ask), from
 * run to run, a line at a time as kva__pf_step asks for them where the
 * cursor is not tight (the AVX-512 tile's never is), kva__pfq_end the
 * rest, but inline and with the run's state in registers. Like a site it
 * takes its own count, not the cursor's spread, so the audit does not
 * count it (a tile counts 0 steps for it). @q NULL (a noinline tail's,
 * whose loops must not take the state's address): nothing, left to
 * kva__pfq_end.
 */
static inline __attribute__((always_inline)) void kva__pfq_step(struct kva__pfq *q, int lines)
{
	if (!q)
		return;
	for (int left = lines; left > 0 && kva__pfq_run(q); left--) {
		KVA__PREFETCH_AT(q->p, q->t0);
		q->p += 64;
	}
}

/* the turn's end: the rest of the run and of the list (the cursor's own
 * runs past it are kva__pf_lines(-1)'s) */
static inline void kva__pfq_end(struct kva__pfq *q)
{
	while (kva__pfq_run(q))
		for (; q->p < q->end; q->p += 64)
			KVA__PREFETCH_AT(q->p, q->t0);
}

/*
 * The block loop of the vector tiles, in one of two distances:
 *
 * - a block ahead (turns false): block k computed while block k + 1 is
 *   prefetched (by the cursor above, spread over k's loops). A block of a
 *   whole span is 48 tokens x 8 heads x 512 bytes (f16, head_dim 128) =
 *   192 KiB, which takes longer to compute than memory takes to answer;
 *   two ahead measured no better on either path at group 1 or 4 (Zen 4).
 *   Neither tile takes it now: the AVX-512 tile did until the twenty-
 *   fourth session, when a turn ahead read 1.08-1.13x as fast on Intel
 *   Xeon family 6 model 207 (groups 1 to 16, out of cache).
 *
 * - a head's turn ahead (turns true): while head h computes its turn at
 *   block k, the cursor prefetches the turn that comes next: head h + 1's
 *   rows of block k, or after the span's last head head 0's of block k + 1
 *   (24 KiB at f16, head_dim 128: one head's K and V rows of 48 tokens).
 *   The turn's rows are read in the order the next turn reads them, one
 *   page's 4 KiB piece after another, and what is in flight is an eighth
 *   of a block. On Zen 3 a turn ahead read group 1 1.3-1.5x faster on two
 *   threads (doc/figures.md). Not for want of L2 alone: a block
 *   ahead holds two blocks (384 KiB) in Zen 3's 512 KiB, but blocks of 16
 *   tokens (64 KiB, a page of every head) a block ahead were slower too,
 *   about 0.75 of the turn ahead (doc/figures.md, ninth session: a throwaway
 *   build, not one this tree can make). Turns of two and four KV heads
 *   (runs of 8 and 16 KiB in address order) read 0.85-0.90 and 0.80-0.82
 *   of one head's turns, and a cursor that started a quarter or half a
 *   turn late 0.82-0.94 (Zen 3, groups 1 and 4, doc/figures.md, fifteenth
 *   session). With a span of one head the two are the same.
 *
 * Past a tile's last block (or turn) the cursor runs over the next tile's
 * first (t->next), so that the next tile does not start cold; a warm tile
 * skips the prefetch of its own first block (or turn), which the tile
 * before asked for with the same distance (a thread's tiles all run the
 * same kernel).
 *
 *   kva__blocks_begin(&b, t, row_bytes, steps, turns);
 *   for (tb = t->t0; tb < t->t1; tb += KVA__BLOCK_TOKENS) {
 *           bk = kva__blocks_next(&b, t, tb);
 *           for (h = 0; h < t->heads; h++) {
 *                   kva__blocks_turn(&b, t, h);          (turns only)
 *                   ... head h's turn at bk, kva__pf_step(&b.pf) as it goes ...
 *                   kva__blocks_turn_end(&b, bk);        (turns only)
 *           }
 *           kva__pf_lines(&b.pf, -1);                    (a block ahead only)
 *   }
 *
 * @steps: the prefetch steps a block's (a turn's) loops take, over which
 * the next block's (turn's) rows are spread. The tile's outputs (m, l,
 * acc) start empty.
 */
struct kva__blocks {
	struct kva__rows rows[2], after;
	/* the block after the current one: its rows (rows[] or after; NULL
	 * past the thread's last) and whose they are (the tile, or the next) */
	const struct kva__rows *nr;
	const struct kva__tile *nt;
	struct kva__pf pf;
	size_t row_bytes;
	int steps, k;
	bool turns;
};

static inline void kva__blocks_begin(struct kva__blocks *b, const struct kva__tile *t,
				     size_t row_bytes, int steps, bool turns)
{
	const int gq = t->heads * t->group;

	for (int g = 0; g < gq; g++) {
		t->m[g] = -INFINITY;
		t->l[g] = 0.0f;
	}
	memset(t->acc, 0, sizeof(float) * (size_t)gq * (size_t)t->kv->head_dim);
	b->row_bytes = row_bytes;
	b->steps = steps;
	b->k = 0;
	b->turns = turns;
	kva__rows_at(t, t->t0, &b->rows[0]);
	if (!t->warm) { /* else the tile before asked for these */
		if (turns)
			kva__pf_begin_head(&b->pf, t, &b->rows[0], 0, row_bytes, 1);
		else
			kva__pf_begin(&b->pf, t, &b->rows[0], row_bytes, 1);
		kva__pf_lines(&b->pf, -1);
	}
	/* nothing more until the first block or turn sets it: a warm tile
	 * never set it, and a turn with none after it leaves it so */
	kva__pf_none(&b->pf);
}

#define KVA__OS_PAGE 4096u /* the smallest page x86 maps: a TLB entry's reach */

/*
 * kva__pf_pages - one prefetch into each 4 KiB page the cursor's block lies
 * in, all at once, before the cursor's lines are spread over the block. On
 * ordinary pages each head's run of a KV page (HND: 16 tokens x 256 bytes,
 * f16, head_dim 128) is a page of its own, 48 of them a block, all past
 * the TLB's reach, and a page's first touch in the middle of the spread
 * waited for its page walk. Walked here, they overlap one another and are
 * done before the lines are asked for: on Zen 4 it brought 4 KiB pages
 * close to what 2 MiB pages give, on both vector paths (doc/figures.md
 * has the runs). Each address asked for is one the block reads (a run's
 * first byte, or a page start inside a run); tokens whose rows lie
 * one token stride apart are taken as one range per head, where no gap
 * between rows can hold a page of its own.
 */
static inline void kva__pf_pages(const struct kva__pf *pf)
{
	const struct kva__rows *r = pf->nx;

	for (int part = 0; part < 2; part++) {
		const char *const *row = part ? r->v : r->k;

		for (int i = 0, j; i < r->n; i = j) {
			j = pf->tok <= KVA__OS_PAGE ? r->seg[i] : i + 1;
			for (int h = 0; h < pf->runs; h++) {
				uintptr_t a = (uintptr_t)row[i] + pf->base + (size_t)h * pf->hstride;
				uintptr_t end = (uintptr_t)row[j - 1] + pf->base +
						(size_t)h * pf->hstride + pf->row;

				for (; a < end; a = (a | (KVA__OS_PAGE - 1)) + 1)
					__builtin_prefetch((const void *)a, 0, 2);
			}
		}
	}
}

/* the rows of block @tb (the one after the last's); a block ahead, the
 * cursor set on the next */
static inline const struct kva__rows *kva__blocks_next(struct kva__blocks *b,
						       const struct kva__tile *t, int32_t tb)
{
	const struct kva__rows *bk = &b->rows[b->k % 2];
	struct kva__rows *nx = &b->rows[(b->k + 1) % 2];

	b->k++;
	/* n = 0 past the end, where the next tile's first block goes */
	kva__rows_at(t, tb + KVA__BLOCK_TOKENS, nx);
	b->nr = nx;
	b->nt = t;
	if (!nx->n) {
		b->nr = NULL;
		if (t->next) {
			kva__rows_at(t->next, t->next->t0, &b->after);
			b->nr = &b->after;
			b->nt = t->next;
		}
	}
	if (b->turns)
		return bk;
	if (b->nr) {
		kva__pf_begin(&b->pf, b->nt, b->nr, b->row_bytes, b->steps);
		kva__pf_pages(&b->pf);
	} else {
		kva__pf_none(&b->pf);
	}
	return bk;
}

/*
 * A head's turn ahead: the cursor set on the turn after head @h's at the
 * block kva__blocks_next gave last: head h + 1's, else the next block's
 * head 0, else the next tile's first block's head 0, else none.
 */
static inline void kva__blocks_turn(struct kva__blocks *b, const struct kva__tile *t, int32_t h)
{
	if (h + 1 < t->heads) {
		kva__pf_begin_head(&b->pf, t, &b->rows[(b->k + 1) % 2], h + 1, b->row_bytes,
				   b->steps);
	} else if (b->nr) {
		kva__pf_begin_head(&b->pf, b->nt, b->nr, 0, b->row_bytes, b->steps);
	} else {
		kva__pf_none(&b->pf);
		return;
	}
	kva__pf_pages(&b->pf);
}

/*
 * A turn's end at @bk: what its steps left (a turn of fewer tokens than
 * the one it prefetches for). With KVA__PF_AUDIT (the sanitizer builds) a
 * turn at a whole block must have taken the steps its tile counted
 * (kva__blocks_begin's @steps), else the process aborts with both counts.
 * A miscount changes no result, only when the lines are asked for: spread
 * over more steps than the loops take, most of them wait for this call,
 * at the end of the turn they were meant to hide under. The AVX-512
 * generic instance's groups 1 and 2 counted the other instances' finer
 * steps for a sitting: at head_dim 256 they read 0.92-0.97 (group 1) and
 * 0.82-0.85 (group 2) of what they read counted right (AVX-512, Intel Xeon
 * family 6 model 207; doc/figures.md, twenty-eighth session).
 */
static inline void kva__blocks_turn_end(struct kva__blocks *b, const struct kva__rows *bk)
{
#ifdef KVA__PF_AUDIT
	if (bk->n == KVA__BLOCK_TOKENS && b->pf.taken != b->steps) {
		fprintf(stderr, "kvarena: a turn took %d prefetch steps where its tile counted %d\n",
			b->pf.taken, b->steps);
		abort();
	}
#else
	(void)bk;
#endif
	kva__pf_lines(&b->pf, -1);
}

/* decode.c: argument checks shared with the CUDA entry points */
int kva__kv_desc_check(const struct kva_kv_desc *kv);
int kva__decode_args_check(const struct kva_kv_desc *kv, const struct kva_page_table *pt,
			   const void *q, enum kva_dtype q_dtype, int32_t num_q_heads,
			   float sm_scale, const void *out, const struct kva_decode_opts *o);

/* pool.c */

/*
 * kva__parallel - fn(ctx, task) for every task in [0, n), on up to @threads
 * threads, the caller one of them. Tasks are handed out one at a time by an
 * atomic counter, so uneven tasks balance; which thread runs a task never
 * changes what it computes.
 */
int kva__parallel(int threads, uint32_t n, void (*fn)(void *ctx, uint32_t task), void *ctx);
/*
 * kva__parallel_ahead - the same, each thread claiming its next task before
 * it runs this one: fn(ctx, task, next, warm), @next its next task
 * (UINT32_MAX: none), @warm false for the first task a thread runs and true
 * for every one it was told of as @next. Costs balance only at the very end
 * (a thread holds one task more than it runs).
 */
int kva__parallel_ahead(int threads, uint32_t n,
			void (*fn)(void *ctx, uint32_t task, uint32_t next, bool warm), void *ctx);

/* isa.c */
bool kva__isa_supported(enum kva_isa isa);
/* whether this core splits each 512-bit FP operation into two 256-bit
 * halves (Zen 4): the AVX-512 path then runs the AVX2 tile where that is
 * faster (decode.c); kva__avx512_split_force(1 / 0) says yes / no for a
 * test, -1 the CPU's answer again */
bool kva__avx512_split(void);
void kva__avx512_split_force(int split);
/* whether this CPU (Zen 5) reads faster with prefetch hint T0 where the
 * tiles take it: the AVX-512 tile's dot products, and the AVX2 tile's
 * cursor at group 1 on head-major pages (isa.c, kva__cursor_t0);
 * kva__pf_t0_force(1 / 0) says yes / no for a test, -1 the CPU's answer
 * again */
bool kva__pf_t0(void);
void kva__pf_t0_force(int t0);
/* whether the AVX-512 tile scores groups of 3 and 4 as dot products on
 * this CPU (Zen 5), not sliced (isa.c); kva__sl_dot_force as above */
bool kva__sl_dot(void);
void kva__sl_dot_force(int dot);
/* whether the AVX2 tile scores one head 12 rows a chunk at a time on this
 * CPU (Zen 5), not 2 rows from start to end (isa.c); kva__avx2_cols_force
 * as above */
bool kva__avx2_cols(void);
void kva__avx2_cols_force(int cols);
/* whether the AVX-512 tile runs a group with no sliced shape as
 * subgroups (kva__avx512_sub) on this CPU (Zen 5), not as dot products
 * (isa.c); kva__avx512_subgroups_force as above */
bool kva__avx512_subgroups(void);
void kva__avx512_subgroups_force(int subgroups);

#endif /* KVA_KERNELS_PVT_H */
