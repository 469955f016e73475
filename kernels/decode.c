/* SPDX-License-Identifier: MIT */
/*
 * decode.c - kva_decode: check everything, plan tiles, run them on the pool,
 * merge the splits.
 *
 * Phase 1, one task per tile (sequence, split, span of KV heads): the ISA
 * kernel reads the split's pages once for every query head of the span and
 * leaves (m, l, acc) per query head in a scratch area indexed by tile. The
 * span is all KV heads (a page streamed whole: kernels_pvt.h) unless that
 * leaves fewer than TASKS_PER_THREAD tiles a thread. Phase 2, one task per
 * (sequence, query head): merge that head's splits in split order, normalise,
 * convert to the output dtype. Both phases write disjoint memory, and the
 * plan depends only on the arguments, so the result is the same on any
 * number of threads, bit for bit.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "arena_pvt.h"
#include "kernels_pvt.h"

struct plan {
	const struct kva_kv_desc *kv;
	const struct kva_page_table *pt;
	const void *q;
	enum kva_dtype q_dtype;
	int32_t num_q_heads, group, head_dim;
	float q_scale;             /* sm_scale * log2(e) */
	void *out;
	float *lse;
	kva__tile_fn tile;
	kva__axpy_fn axpy;         /* the merge's y += a x, the tile's ISA */
	int32_t one_step;          /* struct kva__tile's */
	bool pf_queue;             /* struct kva__tile's */
	bool pf_t0;                /* struct kva__tile's */
	bool pf_cursor_t0;         /* struct kva__tile's */
	bool sl_dot;               /* struct kva__tile's; q of 3 or 4 heads [4][head_dim] (q_sub) */
	bool one_cols;             /* struct kva__tile's */
	bool subgroups;            /* struct kva__tile's */
	int32_t split_tokens, max_splits;
	int32_t span, spans;       /* KV heads per tile, tiles per split */
	/* per sequence: its first tile, its split length and count */
	uint32_t *tile0;
	int32_t *split_len, *splits;
	uint32_t tiles;
	float *qf;                 /* [batch][num_q_heads][head_dim]: q * q_scale, or
				    * for the AVX-512 tile each KV head's subgroups (q_sub) */
	bool avx512;               /* the tile is the AVX-512 tile's */
	size_t q_stride;           /* floats of qf a KV head */
	/* per tile: m[span][group], l[span][group], acc[span][group][head_dim] */
	float *part;
	size_t part_stride;        /* floats per tile */
};

/* tiles a thread at least, where the batch has the splits for it: uneven
 * sequences and a late-waking thread balance */
#define TASKS_PER_THREAD 4

static int bad(const char *what)
{
	return kva__err(-EINVAL, "decode: %s", what);
}

static size_t qdtype_size(enum kva_dtype t)
{
	return t == KVA_F32 ? 4 : t == KVA_F16 || t == KVA_BF16 ? 2 : 0;
}

static float load_q(const void *q, enum kva_dtype t, size_t i)
{
	switch (t) {
	case KVA_F16:
		return kva_f16_to_f32(((const uint16_t *)q)[i]);
	case KVA_BF16:
		return kva_bf16_to_f32(((const uint16_t *)q)[i]);
	default:
		return ((const float *)q)[i];
	}
}

static void store_out(void *out, enum kva_dtype t, size_t i, float v)
{
	switch (t) {
	case KVA_F16:
		((uint16_t *)out)[i] = kva_f32_to_f16(v);
		break;
	case KVA_BF16:
		((uint16_t *)out)[i] = kva_f32_to_bf16(v);
		break;
	default:
		((float *)out)[i] = v;
	}
}

/* kva__kv_desc_check - the descriptor on its own; shared with kva_store_kv. */
int kva__kv_desc_check(const struct kva_kv_desc *kv)
{
	if (!kv || !kv->k || !kv->v)
		return bad("NULL descriptor or K/V pointer");
	if (!kva_dtype_size(kv->dtype))
		return bad("unknown KV dtype");
	if (kv->num_kv_heads < 1 || kv->num_kv_heads > 4096)
		return bad("num_kv_heads out of range 1..4096");
	if (kv->head_dim < 1 || kv->head_dim > KVA__MAX_HEAD_DIM)
		return bad("head_dim out of range 1..1024");
	if (kv->page_size < 1 || kv->page_size > 65536)
		return bad("page_size out of range 1..65536");
	if (kv->num_pages < 1)
		return bad("num_pages must be at least 1");
	if (kv->flags & ~KVA_KV_SCALE_PER_TENSOR)
		return bad("unknown descriptor flags");
	/* a token's head is head_dim contiguous elements: strides may not make
	 * two tokens or heads overlap inside a page */
	if (kv->token_stride < 0 || kv->head_stride < 0 || kv->page_stride < 0)
		return bad("negative stride");
	if ((kv->page_size > 1 && kv->token_stride < kv->head_dim) ||
	    (kv->num_kv_heads > 1 && kv->head_stride < kv->head_dim))
		return bad("token_stride and head_stride must each be at least head_dim");
	if ((kv->dtype == KVA_FP8_E4M3 || kv->dtype == KVA_INT8) && (!kv->k_scale || !kv->v_scale))
		return bad("fp8 and int8 need k_scale and v_scale");
	if (kv->dtype == KVA_INT8 && (kv->scale_page_stride < 0 || kv->scale_token_stride < 0 ||
				      kv->scale_head_stride < 0))
		return bad("negative int8 scale stride");
	return 0;
}

/*
 * kva__decode_args_check - everything kva_decode checks that does not read
 * the page table's arrays: shared with kva_decode_cuda, whose page table is
 * in device memory.
 */
int kva__decode_args_check(const struct kva_kv_desc *kv, const struct kva_page_table *pt,
			   const void *q, enum kva_dtype q_dtype, int32_t num_q_heads,
			   float sm_scale, const void *out, const struct kva_decode_opts *o)
{
	int ret;

	if ((ret = kva__kv_desc_check(kv)) < 0)
		return ret;
	if (!pt || !q || !out)
		return bad("NULL page table, q or out");
	if (!qdtype_size(q_dtype))
		return bad("q and out must be f32, f16 or bf16");
	if (num_q_heads < 1 || num_q_heads % kv->num_kv_heads)
		return bad("num_q_heads must be a multiple of num_kv_heads");
	if (num_q_heads / kv->num_kv_heads > KVA__MAX_GROUP)
		return bad("more than 64 query heads per KV head");
	if (!(sm_scale == sm_scale) || sm_scale == 0.0f || sm_scale > 1e30f || sm_scale < -1e30f)
		return bad("sm_scale must be finite and not 0");
	if (pt->batch < 0 || (pt->batch && (!pt->indptr || !pt->last_page_len)))
		return bad("page table: negative batch or NULL arrays");
	if (pt->page_size != kv->page_size)
		return bad("page table and descriptor disagree on page_size");
	if (o && (o->threads < 0 || o->threads > 256 || o->split_tokens < 0 || o->max_splits < 0))
		return bad("options: threads 0..256, split_tokens and max_splits >= 0");
	if (o && (o->pf_step < 0 || o->pf_step > KVA__BLOCK_TOKENS))
		return bad("options: pf_step 0..48");
	return 0;
}

/* the page table's arrays, which kva_decode can read */
static int table_check(const struct kva_kv_desc *kv, const struct kva_page_table *pt)
{
	if (pt->batch && pt->indptr[0] != 0)
		return bad("page table: indptr[0] must be 0");
	for (int32_t b = 0; b < pt->batch; b++) {
		int32_t pages = pt->indptr[b + 1] - pt->indptr[b];

		if (pages < 0)
			return bad("page table: indptr decreases");
		if (pages && (pt->last_page_len[b] < 1 || pt->last_page_len[b] > pt->page_size))
			return bad("page table: last_page_len out of 1..page_size");
		if (pages && (int64_t)(pages - 1) * pt->page_size + pt->last_page_len[b] > INT32_MAX)
			return bad("page table: sequence longer than 2^31 tokens");
	}
	if (pt->batch && pt->indptr[pt->batch] && !pt->indices)
		return bad("page table: NULL indices");
	for (int32_t i = 0; pt->batch && i < pt->indptr[pt->batch]; i++)
		if (pt->indices[i] < 0 || pt->indices[i] >= kv->num_pages)
			return kva__err(-EINVAL, "decode: page id %d at indices[%d] out of range "
					"0..%d", pt->indices[i], i, kv->num_pages - 1);
	return 0;
}

/*
 * The AVX2 tile's cursor asks for the next turn's lines with hint T0 (into
 * L1), not T1, at group 1 where a head's rows of a page lie end to end
 * (HND, or NHD with one KV head: token_stride is head_dim), on Zen 5
 * (kva__pf_t0). Paired there (family 26 model 2, KVM, 2 threads, out of
 * cache, both orders; doc/figures.md, fortieth session), T0 at group 1
 * read f16 1.13-1.15x, bf16 1.10-1.11x and one thread 1.09-1.12x at
 * head_dim 128, f32 1.01-1.10x, fp8 and int8 1.00-1.02, head_dim 64 and
 * pages in L3 0.99-1.01; but token-major pages (NHD, a head's rows rows
 * apart) 0.96, and groups 2 to 8 0.95-1.02 (group 2 at head_dim 64 0.975,
 * NHD 0.95; 3 to 8 0.976-0.986): those keep T1, as every other CPU does
 * (T0 read 0.87 of T1 on Zen 4, 0.90-0.97 on Intel Xeon family 6 model
 * 207). Why group 1 on head-major pages alone gains was not found; the
 * rule is what was measured.
 */
bool kva__cursor_t0(const struct kva_kv_desc *kv, int32_t group)
{
	return group == 1 && kv->token_stride == kv->head_dim && kva__pf_t0();
}

static kva__tile_fn pick(enum kva_isa isa, int32_t head_dim, int *err)
{
	if (isa == KVA_ISA_AUTO) {
		if (head_dim % 16 == 0 && kva__isa_supported(KVA_ISA_AVX512))
			return kva__tile_avx512;
		if (head_dim % 8 == 0 && kva__isa_supported(KVA_ISA_AVX2))
			return kva__tile_avx2;
		return kva__tile_scalar;
	}
	if (!kva__isa_supported(isa)) {
		*err = kva__err(-ENOTSUP, "decode: this CPU has no %s", kva_isa_name(isa));
		return NULL;
	}
	if ((isa == KVA_ISA_AVX512 && head_dim % 16) || (isa == KVA_ISA_AVX2 && head_dim % 8)) {
		*err = kva__err(-EINVAL, "decode: the %s path needs head_dim a multiple of %d",
				kva_isa_name(isa), isa == KVA_ISA_AVX512 ? 16 : 8);
		return NULL;
	}
	return isa == KVA_ISA_AVX512 ? kva__tile_avx512
	       : isa == KVA_ISA_AVX2 ? kva__tile_avx2 : kva__tile_scalar;
}

/*
 * The tile that runs @group query heads per KV head at @head_dim, where
 * pick() chose @tile: its own, but for the AVX-512 tile's sliced groups of 3
 * to 8 (kva__avx512_gp 4 or 8: groups 3, 4, 6, 7, 8) on a core that splits
 * 512-bit operations in two (kva__avx512_split, Zen 4), which run the AVX2
 * tile (it takes head_dim a multiple of 8, and every AVX-512 CPU has AVX2,
 * FMA and F16C). On that core the zmm tile's sliced scores pay a broadcast
 * an FMA and a stored fp32 row a K row, which the ymm tile's dot products
 * (3 tokens x 4 heads, q from L1) do not. Paired there (kvarena-ab, f16,
 * head_dim 128, 8 KV heads, batch 8 x 4096, 2 threads; doc/figures.md,
 * thirtieth session), the AVX2 tile read groups 3, 6, 7 and 8 1.05-1.35x
 * as fast out of cache, group 4 (memory bound there) 0.97-1.06, and
 * 1.16-1.54x on one page; group 5 (dot products on both)
 * 1.02, and lost at 2 (0.93), 9, 10 (0.93-0.95) and 16 (0.89-0.92).
 */
static kva__tile_fn tile_for(kva__tile_fn tile, int32_t group, int32_t head_dim)
{
	const int gp = kva__avx512_gp(group, head_dim);

	if (tile == kva__tile_avx512 && (gp == 4 || gp == 8) && kva__avx512_split() &&
	    kva__isa_supported(KVA_ISA_AVX2))
		return kva__tile_avx2;
	return tile;
}

/* the sequence a tile belongs to: the last b with tile0[b] <= tile */
static int32_t tile_seq(const struct plan *p, uint32_t tile)
{
	int32_t lo = 0, hi = p->pt->batch - 1;

	while (lo < hi) {
		int32_t mid = (lo + hi + 1) / 2;

		if (p->tile0[mid] <= tile)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/*
 * One subgroup's q (@np heads from q element @in on) into @o, laid out as the
 * AVX-512 tile reads it (kva__avx512_qrows rows): sliced, row r lane
 * g * w + j is q[g][r * w + j] (kernels_pvt.h, kva__avx512_gp); as dot
 * products, [np][head_dim], or at groups 3 and 4 on a CPU that scores
 * them so (sl_dot) [4][head_dim]; a pad head's lanes or row 0. The
 * floats written.
 */
static size_t q_sub(const struct plan *p, float *o, size_t in, int32_t np)
{
	const int32_t gp = kva__avx512_gp(np, p->head_dim), w = gp ? 16 / gp : 1;

	if (!gp || (gp == 4 && p->sl_dot)) {
		const int32_t rows = gp ? gp : np;

		for (int32_t i = 0; i < rows * p->head_dim; i++)
			o[i] = i < np * p->head_dim
				? load_q(p->q, p->q_dtype, in + (size_t)i) * p->q_scale
				: 0.0f;
		return (size_t)rows * (size_t)p->head_dim;
	}
	for (int32_t r = 0; r < p->head_dim / w; r++)
		for (int32_t lane = 0; lane < 16; lane++) {
			int32_t g = lane / w, d = r * w + lane % w;

			o[r * 16 + lane] = g < np
				? load_q(p->q, p->q_dtype,
					 in + (size_t)g * p->head_dim + (size_t)d) * p->q_scale
				: 0.0f;
		}
	return (size_t)gp * (size_t)p->head_dim;
}

static void run_q(void *ctx, uint32_t b)
{
	const struct plan *p = ctx;
	size_t n = (size_t)p->num_q_heads * p->head_dim, base = (size_t)b * n;
	int32_t heads = p->num_q_heads / p->group;

	if (!p->avx512) {
		for (size_t i = 0; i < n; i++)
			p->qf[base + i] = load_q(p->q, p->q_dtype, base + i) * p->q_scale;
		return;
	}
	/* each KV head's subgroups, one after the other (kva__avx512_sub) */
	for (int32_t h = 0; h < heads; h++) {
		float *o = p->qf + ((size_t)b * heads + (size_t)h) * p->q_stride;

		for (int32_t g0 = 0, np; g0 < p->group; g0 += np) {
			np = kva__avx512_sub(p->group - g0, p->head_dim, kva__esize(p->kv->dtype),
					     p->subgroups);
			o += q_sub(p, o, base + ((size_t)h * p->group + (size_t)g0) * p->head_dim, np);
		}
	}
}

/* tile @tile of the plan; false if its sequence is empty */
static bool tile_at(const struct plan *p, uint32_t tile, struct kva__tile *t)
{
	const struct kva_page_table *pt = p->pt;
	int32_t b = tile_seq(p, tile), local = (int32_t)(tile - p->tile0[b]);
	int32_t s = local / p->spans, h0 = local % p->spans * p->span;
	int32_t len = kva_seq_len(pt->indptr, pt->last_page_len, b, pt->page_size);
	int32_t heads = p->kv->num_kv_heads - h0 < p->span ? p->kv->num_kv_heads - h0 : p->span;
	float *part = p->part + (size_t)tile * p->part_stride;

	*t = (struct kva__tile){
		.kv = p->kv,
		.pages = pt->indices + pt->indptr[b],
		.t0 = s * p->split_len[b],
		.t1 = (s + 1) * p->split_len[b] < len ? (s + 1) * p->split_len[b] : len,
		.kv_head = h0,
		.heads = heads,
		.group = p->group,
		.q = p->qf + ((size_t)b * p->kv->num_kv_heads + (size_t)h0) * p->q_stride,
		.q_stride = p->q_stride,
		.m = part,
		.l = part + (size_t)p->span * p->group,
		.acc = part + 2 * (size_t)p->span * p->group,
		.one_step = p->one_step,
		.pf_queue = p->pf_queue,
		.pf_t0 = p->pf_t0,
		.pf_cursor_t0 = p->pf_cursor_t0,
		.sl_dot = p->sl_dot,
		.one_cols = p->one_cols,
		.subgroups = p->subgroups,
	};
	return t->t0 < t->t1;
}

/*
 * One tile, told the next this thread runs: a tile starts on pages nobody
 * asked for yet, which it would wait for while it computes its first block
 * (a tenth of a 512-token split); so each tile prefetches its successor's
 * first block while it computes its own last one.
 */
static void run_tile(void *ctx, uint32_t tile, uint32_t next, bool warm)
{
	const struct plan *p = ctx;
	struct kva__tile t, n;

	if (tile_at(p, tile, &t)) {
		t.warm = warm;
		if (next != UINT32_MAX && tile_at(p, next, &n))
			t.next = &n;
		p->tile(&t);
		return;
	}
	for (int32_t g = 0; g < t.heads * p->group; g++) { /* an empty sequence */
		t.m[g] = -INFINITY;
		t.l[g] = 0.0f;
	}
	memset(t.acc, 0, sizeof(float) * (size_t)t.heads * p->group * p->head_dim);
}

static void axpy_scalar(float *y, const float *x, float a, int32_t n)
{
	for (int32_t i = 0; i < n; i++)
		y[i] += a * x[i];
}

/*
 * One query head's splits, merged: the largest maximum M first, then each
 * split weighted by 2^(m - M) (kva_rescale) into one sum, in split order.
 * The same as merging them pairwise (kva_merge_weights, as decode.cu does
 * per element), with one weight a split, not two, and one multiply-add an
 * element, not three: in the splits' pairwise merge, scalar, a tenth of a
 * decode's time went here (group 8, both vector paths, Intel Xeon family
 * 6 model 207, README).
 */
static void run_merge(void *ctx, uint32_t task)
{
	const struct plan *p = ctx;
	int32_t b = (int32_t)(task / (uint32_t)p->num_q_heads);
	int32_t qh = (int32_t)(task % (uint32_t)p->num_q_heads);
	int32_t h = qh / p->group, n = p->splits[b], j = h / p->span;
	/* the head's place in its tile's span */
	size_t at = (size_t)(h - j * p->span) * p->group + (size_t)(qh % p->group);
	size_t sg = (size_t)p->span * p->group;
	_Alignas(64) float acc[KVA__MAX_HEAD_DIM];
	float m = -INFINITY, l = 0.0f;
	size_t obase = ((size_t)b * p->num_q_heads + (size_t)qh) * p->head_dim;
	const float *part0 = p->part + (size_t)p->tile0[b] * p->part_stride;
	const size_t split_stride = (size_t)p->spans * p->part_stride;

	memset(acc, 0, sizeof(float) * p->head_dim);
	for (int32_t s = 0; s < n; s++)
		m = kva_max(m, part0[(size_t)s * split_stride + (size_t)j * p->part_stride + at]);
	for (int32_t s = 0; s < n; s++) {
		const float *part = part0 + (size_t)s * split_stride + (size_t)j * p->part_stride;
		const float w = kva_rescale(part[at], m);

		l += w * part[sg + at];
		p->axpy(acc, part + 2 * sg + at * p->head_dim, w, p->head_dim);
	}
	for (int32_t d = 0; d < p->head_dim; d++)
		store_out(p->out, p->q_dtype, obase + (size_t)d, l > 0.0f ? acc[d] / l : 0.0f);
	if (p->lse)
		p->lse[(size_t)b * p->num_q_heads + (size_t)qh] = kva_lse(m, l);
}

/* scratch kept per calling thread: a decode per layer per step must not
 * pay page faults for a fresh buffer each time */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

struct scratch {
	void *buf;
	size_t size;
};

static void scratch_free(void *p)
{
	struct scratch *s = p;

	free(s->buf);
	free(s);
}

static void scratch_init(void)
{
	pthread_key_create(&scratch_key, scratch_free);
}

static void *scratch(size_t bytes)
{
	struct scratch *s;

	pthread_once(&scratch_once, scratch_init);
	s = pthread_getspecific(scratch_key);
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s || pthread_setspecific(scratch_key, s)) {
			free(s);
			return NULL;
		}
	}
	if (s->size < bytes) {
		void *b = realloc(s->buf, bytes);

		if (!b)
			return NULL;
		s->buf = b;
		s->size = bytes;
	}
	return s->buf;
}

int kva_decode(const struct kva_kv_desc *kv, const struct kva_page_table *pt, const void *q,
	       enum kva_dtype q_dtype, int32_t num_q_heads, float sm_scale, void *out, float *lse,
	       const struct kva_decode_opts *opts)
{
	struct kva_decode_opts o = opts ? *opts : (struct kva_decode_opts){ 0 };
	struct plan p = { 0 };
	size_t meta, qbytes, bytes;
	uint64_t split_sum = 0;
	int ret = 0, threads;
	char *buf;

	if ((ret = kva__decode_args_check(kv, pt, q, q_dtype, num_q_heads, sm_scale, out, &o)) < 0 ||
	    (ret = table_check(kv, pt)) < 0)
		return ret;
	if (!pt->batch)
		return 0;
	p.tile = pick(o.isa, kv->head_dim, &ret);
	if (!p.tile)
		return ret;
	p.tile = tile_for(p.tile, num_q_heads / kv->num_kv_heads, kv->head_dim);
	p.axpy = p.tile == kva__tile_avx512 ? kva__axpy_avx512
		 : p.tile == kva__tile_avx2 ? kva__axpy_avx2 : axpy_scalar;
	/* the AVX2 tile's steps and cursor, for this CPU unless the caller
	 * chose the step, and the order of its one-head scores */
	p.one_step = o.pf_step ? o.pf_step : KVA__BLOCK_TOKENS;
	if (p.tile == kva__tile_avx2) {
		const int32_t kept = kva_cpu_prefetch_kept();

		p.pf_queue = kva__pf_queues(kept);
		p.one_cols = kva__avx2_cols();
		if (!o.pf_step)
			p.one_step = kva__avx2_one_step(kv->dtype, kv->head_dim,
							num_q_heads / kv->num_kv_heads, kept);
	}
	/* the prefetch hints: the AVX-512 tile's dot products' (struct
	 * kva__pfq) and the AVX2 tile's cursor's (kva__cursor_t0) */
	p.pf_t0 = p.tile == kva__tile_avx512 && kva__pf_t0();
	p.pf_cursor_t0 = p.tile == kva__tile_avx2 &&
			 kva__cursor_t0(kv, num_q_heads / kv->num_kv_heads);
	threads = o.threads ? o.threads : kva_kernel_threads();
	p.kv = kv;
	p.pt = pt;
	p.q = q;
	p.q_dtype = q_dtype;
	p.num_q_heads = num_q_heads;
	p.group = num_q_heads / kv->num_kv_heads;
	p.head_dim = kv->head_dim;
	p.avx512 = p.tile == kva__tile_avx512;
	p.sl_dot = p.avx512 && kva__sl_dot();
	p.subgroups = p.avx512 && kva__avx512_subgroups();
	p.q_stride = 0;
	for (int32_t g0 = 0, np; g0 < p.group; g0 += np) {
		np = kva__avx512_sub(p.group - g0, kv->head_dim, kva__esize(kv->dtype), p.subgroups);
		p.q_stride += (size_t)(p.avx512 ? kva__avx512_qrows(np, kv->head_dim) : np) *
			      (size_t)kv->head_dim;
	}
	p.q_scale = sm_scale * KVA_LOG2E;
	p.out = out;
	p.lse = lse;
	p.split_tokens = o.split_tokens ? o.split_tokens : KVA_DEFAULT_SPLIT_TOKENS;
	p.max_splits = o.max_splits ? o.max_splits : KVA_DEFAULT_MAX_SPLITS;

	/* one buffer: the plan's arrays, then the partial results */
	meta = (sizeof(uint32_t) + 2 * sizeof(int32_t)) * (size_t)pt->batch;
	meta = (meta + 63) & ~(size_t)63;
	buf = scratch(meta);
	if (!buf)
		return -ENOMEM;
	p.tile0 = (uint32_t *)buf;
	p.split_len = (int32_t *)(p.tile0 + pt->batch);
	p.splits = p.split_len + pt->batch;
	for (int32_t b = 0; b < pt->batch; b++) {
		int32_t len = kva_seq_len(pt->indptr, pt->last_page_len, b, pt->page_size);

		p.split_len[b] = kva_split_len(len, pt->page_size, p.split_tokens, p.max_splits);
		p.splits[b] = kva_split_count(len, p.split_len[b]);
		split_sum += (uint64_t)p.splits[b];
	}
	/* the widest span, halved while it leaves the threads short of tiles */
	p.span = kv->num_kv_heads;
	p.spans = 1;
	while (p.span > 1 && split_sum * (uint64_t)p.spans < (uint64_t)TASKS_PER_THREAD * threads) {
		p.span = (p.span + 1) / 2;
		p.spans = (kv->num_kv_heads + p.span - 1) / p.span;
	}
	if (split_sum * (uint64_t)p.spans > UINT32_MAX / 2)
		return bad("too many tiles: fewer splits or a smaller batch");
	for (int32_t b = 0; b < pt->batch; b++) {
		p.tile0[b] = p.tiles;
		p.tiles += (uint32_t)p.splits[b] * (uint32_t)p.spans;
	}
	p.part_stride = (size_t)p.span * p.group * (2 + (size_t)kv->head_dim);
	qbytes = sizeof(float) * (size_t)pt->batch * (size_t)kv->num_kv_heads * p.q_stride;
	qbytes = (qbytes + 63) & ~(size_t)63;
	/* 64 bytes more, so that qf starts on a line (the AVX-512 tile loads
	 * a row of sliced q as one zmm) */
	bytes = meta + 64 + qbytes + sizeof(float) * p.part_stride * p.tiles;
	buf = scratch(bytes);
	if (!buf)
		return -ENOMEM;
	p.tile0 = (uint32_t *)buf; /* it may have moved */
	p.split_len = (int32_t *)(p.tile0 + pt->batch);
	p.splits = p.split_len + pt->batch;
	p.qf = (float *)(buf + meta + (-(uintptr_t)(buf + meta) & 63));
	p.part = p.qf + qbytes / sizeof(float);

	kva__parallel(threads, (uint32_t)pt->batch, run_q, &p);
	kva__parallel_ahead(threads, p.tiles, run_tile, &p);
	kva__parallel(threads, (uint32_t)pt->batch * (uint32_t)num_q_heads, run_merge, &p);
	return 0;
}

const char *kva_decode_tile(enum kva_isa isa, int32_t head_dim, int32_t group)
{
	kva__tile_fn tile;
	int err = 0;

	if (isa < KVA_ISA_AUTO || isa > KVA_ISA_AVX512 || head_dim < 1 ||
	    head_dim > KVA__MAX_HEAD_DIM || group < 1 || group > KVA__MAX_GROUP) {
		kva__err(-EINVAL, "decode: tile: a known isa, head_dim 1..%d and group 1..%d",
			 KVA__MAX_HEAD_DIM, KVA__MAX_GROUP);
		return NULL;
	}
	if (!(tile = pick(isa, head_dim, &err)))
		return NULL;
	tile = tile_for(tile, group, head_dim);
	return tile == kva__tile_avx512 ? "avx512" : tile == kva__tile_avx2 ? "avx2" : "scalar";
}

int32_t kva_decode_pf_step(enum kva_dtype dtype, int32_t head_dim, int32_t group)
{
	if (!kva_dtype_size(dtype) || head_dim < 8 || head_dim > KVA__MAX_HEAD_DIM ||
	    head_dim % 8 || group < 1 || group > KVA__MAX_GROUP)
		return kva__err(-EINVAL, "decode: pf_step: head_dim a multiple of 8 in 8..%d, "
				"group 1..%d and a known dtype", KVA__MAX_HEAD_DIM, KVA__MAX_GROUP);
	if (!kva__isa_supported(KVA_ISA_AVX2))
		return 0;
	return kva__avx2_one_step(dtype, head_dim, group, kva_cpu_prefetch_kept());
}
