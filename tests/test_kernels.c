/* SPDX-License-Identifier: MIT */
/*
 * test_kernels.c - paged decode attention and KV store against a reference:
 * gather each sequence's K and V through its page table into dense arrays
 * and compute attention in double. Every case runs on every ISA path this
 * CPU has (scalar, AVX2, AVX-512): random permuted page tables, pages shared
 * between sequences, lengths around page and split boundaries and past 16k,
 * GQA 1/4/8/16 and MQA, head_dim 64..256, NaN in unused slots and invalid ids
 * in unused table entries (never read), padded strides, NHD and HND, large
 * logits, lse, split and thread invariance, store round trips, quantization
 * error bounds, malformed arguments, and the number formats exhaustively.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <spawn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "decode_math.h"

/* the cursors' prefetches counted, where a test asks (test_pfq_...);
 * those with hint T0 (t0) apart */
static struct {
	bool on;
	size_t n, t0;
	const char *line[8192];
} pf_log;

#define KVA__PREFETCH(a)                                                  \
	do {                                                              \
		const char *pf_a_ = (const char *)(a);                    \
                                                                          \
		if (pf_log.on && pf_log.n < 8192)                         \
			pf_log.line[pf_log.n++] = pf_a_;                  \
		__builtin_prefetch(pf_a_, 0, 2);                          \
	} while (0)

#define KVA__PREFETCH_T0(a)                                               \
	do {                                                              \
		const char *pf_a_ = (const char *)(a);                    \
                                                                          \
		if (pf_log.on && pf_log.n < 8192) {                       \
			pf_log.line[pf_log.n++] = pf_a_;                  \
			pf_log.t0++;                                      \
		}                                                         \
		__builtin_prefetch(pf_a_, 0, 3);                          \
	} while (0)

#include "kernels_pvt.h"
#include "kvarena.h"
#include "testutil.h"

static enum kva_isa isas[3];
static int n_isas;

/* whether the @isa path takes head_dim @dim: AVX-512 a multiple of 16,
 * AVX2 of 8 (kva_decode refuses the others: test_malformed_decode_arguments) */
static bool isa_takes(enum kva_isa isa, int32_t dim)
{
	return isa == KVA_ISA_AVX512 ? dim % 16 == 0 : isa == KVA_ISA_AVX2 ? dim % 8 == 0 : true;
}

/* ------------------------------------------------------- a paged cache */

enum order { HND, NHD };

struct cache {
	struct kva_kv_desc kv;
	void *k, *v;
	float *k_scale, *v_scale;
	size_t bytes, scale_floats;
};

static void cache_make(struct cache *c, enum kva_dtype dt, int32_t pages, int32_t page_size,
		       int32_t heads, int32_t dim, enum order order, int32_t pad)
{
	int64_t token_stride, head_stride, page_stride;

	memset(c, 0, sizeof(*c));
	if (order == HND) { /* [page][head][token][dim + pad] */
		token_stride = dim + pad;
		head_stride = token_stride * page_size;
		page_stride = head_stride * heads + pad;
	} else { /* [page][token][head][dim + pad] */
		head_stride = dim + pad;
		token_stride = head_stride * heads;
		page_stride = token_stride * page_size + pad;
	}
	c->bytes = (size_t)page_stride * pages * kva_dtype_size(dt);
	c->k = malloc(c->bytes);
	c->v = malloc(c->bytes);
	/* everything not written later reads as NaN (or, for int8, the
	 * maximum with a NaN scale): a kernel that reads it cannot hide it */
	memset(c->k, dt == KVA_INT8 ? 0x7f : 0xff, c->bytes);
	memset(c->v, dt == KVA_INT8 ? 0x7f : 0xff, c->bytes);
	c->kv = (struct kva_kv_desc){
		.k = c->k, .v = c->v, .page_stride = page_stride, .token_stride = token_stride,
		.head_stride = head_stride, .num_kv_heads = heads, .head_dim = dim, .dtype = dt,
		.page_size = page_size, .num_pages = pages,
	};
	if (dt == KVA_FP8_E4M3) {
		c->scale_floats = (size_t)heads;
		c->k_scale = malloc(sizeof(float) * c->scale_floats);
		c->v_scale = malloc(sizeof(float) * c->scale_floats);
		for (int32_t h = 0; h < heads; h++) {
			c->k_scale[h] = 0.01f * (1 + h % 3);
			c->v_scale[h] = 0.02f * (1 + h % 2);
		}
	} else if (dt == KVA_INT8) {
		c->scale_floats = (size_t)pages * page_size * heads;
		c->k_scale = malloc(sizeof(float) * c->scale_floats);
		c->v_scale = malloc(sizeof(float) * c->scale_floats);
		for (size_t i = 0; i < c->scale_floats; i++)
			c->k_scale[i] = c->v_scale[i] = NAN;
		c->kv.scale_page_stride = (int64_t)page_size * heads;
		c->kv.scale_token_stride = heads;
		c->kv.scale_head_stride = 1;
	}
	c->kv.k_scale = c->k_scale;
	c->kv.v_scale = c->v_scale;
}

static void cache_free(struct cache *c)
{
	free(c->k);
	free(c->v);
	free(c->k_scale);
	free(c->v_scale);
}

/* the exact value a cache element holds, in double */
static double elem(const struct cache *c, const void *base, const float *scale, int32_t page,
		   int32_t t, int32_t h, int32_t d)
{
	const struct kva_kv_desc *kv = &c->kv;
	int64_t e = kva_kv_index(kv->page_stride, kv->token_stride, kv->head_stride, page, t, h) + d;

	switch (kv->dtype) {
	case KVA_F32:
		return ((const float *)base)[e];
	case KVA_F16:
		return kva_f16_to_f32(((const uint16_t *)base)[e]);
	case KVA_BF16:
		return kva_bf16_to_f32(((const uint16_t *)base)[e]);
	case KVA_FP8_E4M3:
		return (double)kva_fp8_to_f32(((const uint8_t *)base)[e]) *
		       scale[kv->flags & KVA_KV_SCALE_PER_TENSOR ? 0 : h];
	case KVA_INT8:
		return (double)((const int8_t *)base)[e] *
		       scale[(int64_t)page * kv->scale_page_stride + (int64_t)t * kv->scale_token_stride +
			     (int64_t)h * kv->scale_head_stride];
	}
	return NAN;
}

/* ------------------------------------------------------ a page table */

struct batch {
	int32_t n, page_size;
	int32_t *indptr, *indices, *last, *lens;
	struct kva_page_table pt;
};

/*
 * Sequences of the given lengths over random, permuted pages; sequence 1,
 * when there is one and @share, begins with sequence 0's first pages (a
 * shared prefix).
 */
static void batch_make(struct batch *b, const int32_t *lens, int32_t n, int32_t page_size,
		       int32_t num_pages, bool share, uint64_t *rng)
{
	int32_t total = 0, *perm = malloc(sizeof(int32_t) * (size_t)num_pages), next = 0;

	memset(b, 0, sizeof(*b));
	b->n = n;
	b->page_size = page_size;
	b->indptr = calloc((size_t)n + 1, sizeof(int32_t));
	b->last = calloc((size_t)n, sizeof(int32_t));
	b->lens = calloc((size_t)n, sizeof(int32_t));
	for (int32_t i = 0; i < n; i++) {
		total += (lens[i] + page_size - 1) / page_size;
		b->lens[i] = lens[i];
	}
	b->indices = calloc((size_t)total + 1, sizeof(int32_t));
	for (int32_t p = 0; p < num_pages; p++)
		perm[p] = p;
	for (int32_t p = num_pages - 1; p > 0; p--) {
		int32_t j = (int32_t)(tu_rand(rng) % (uint64_t)(p + 1)), x = perm[p];

		perm[p] = perm[j];
		perm[j] = x;
	}
	for (int32_t i = 0; i < n; i++) {
		int32_t pages = (lens[i] + page_size - 1) / page_size;

		b->indptr[i + 1] = b->indptr[i] + pages;
		b->last[i] = pages ? lens[i] - (pages - 1) * page_size : 0;
		for (int32_t p = 0; p < pages; p++) {
			int32_t slot = b->indptr[i] + p;

			if (share && i == 1 && p < b->indptr[1] - 1 && p < pages - 1)
				b->indices[slot] = b->indices[p]; /* sequence 0's full pages */
			else
				b->indices[slot] = perm[next++ % num_pages];
		}
	}
	b->pt = (struct kva_page_table){ n, page_size, b->indptr, b->indices, b->last };
	free(perm);
}

static void batch_free(struct batch *b)
{
	free(b->indptr);
	free(b->indices);
	free(b->last);
	free(b->lens);
}

/* pages a batch needs, if no two sequences share */
static int32_t pages_for(const int32_t *lens, int32_t n, int32_t page_size)
{
	int32_t p = 0;

	for (int32_t i = 0; i < n; i++)
		p += (lens[i] + page_size - 1) / page_size;
	return p;
}

static float frand(uint64_t *rng)
{
	return (float)((double)(tu_rand(rng) >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
}

/* Write every token of the batch through kva_store_kv (in f32), with values
 * of magnitude @amp. Each page is written once even if shared. */
static void fill(struct cache *c, const struct batch *b, float amp, uint64_t *rng)
{
	const struct kva_kv_desc *kv = &c->kv;
	size_t row = (size_t)kv->num_kv_heads * kv->head_dim;
	float *k = malloc(sizeof(float) * row), *v = malloc(sizeof(float) * row);
	uint8_t *done = calloc((size_t)kv->num_pages * kv->page_size, 1);

	for (int32_t i = 0; i < b->n; i++)
		for (int32_t t = 0; t < b->lens[i]; t++) {
			int64_t slot = (int64_t)b->indices[b->indptr[i] + t / b->page_size] *
				       b->page_size + t % b->page_size;

			if (done[slot]++)
				continue;
			for (size_t j = 0; j < row; j++) {
				k[j] = amp * frand(rng);
				v[j] = amp * frand(rng);
			}
			assert_int_equal(kva_store_kv(kv, k, v, KVA_F32, &slot, 1), 0);
		}
	free(k);
	free(v);
	free(done);
}

/* ------------------------------------------------------ the reference */

/* terms reference() weighed below 2^-126 of their sequence's largest: how
 * deep into exp2's underflow a run's logits reach */
static size_t ref_deep_terms;

/* out[b][h][d] and lse[b][h] in double, from the values the cache holds */
static void reference(const struct cache *c, const struct batch *b, const float *q,
		      int32_t num_q_heads, double sm_scale, double *out, double *lse)
{
	const struct kva_kv_desc *kv = &c->kv;
	const int32_t D = kv->head_dim, group = num_q_heads / kv->num_kv_heads;

	for (int32_t i = 0; i < b->n; i++) {
		int32_t len = b->lens[i];
		double *s = malloc(sizeof(double) * (size_t)(len ? len : 1));

		for (int32_t h = 0; h < num_q_heads; h++) {
			const float *qh = q + ((size_t)i * num_q_heads + h) * D;
			double *o = out + ((size_t)i * num_q_heads + h) * D, m = -INFINITY, sum = 0;
			int32_t kh = h / group;

			memset(o, 0, sizeof(double) * D);
			for (int32_t t = 0; t < len; t++) {
				int32_t page = b->indices[b->indptr[i] + t / b->page_size];
				double dot = 0;

				for (int32_t d = 0; d < D; d++)
					dot += qh[d] * elem(c, c->k, c->k_scale, page, t % b->page_size,
							    kh, d);
				s[t] = dot * sm_scale;
				m = fmax(m, s[t]);
			}
			for (int32_t t = 0; t < len; t++) {
				int32_t page = b->indices[b->indptr[i] + t / b->page_size];
				double p = exp(s[t] - m);

				ref_deep_terms += (s[t] - m) / M_LN2 < -126;
				sum += p;
				for (int32_t d = 0; d < D; d++)
					o[d] += p * elem(c, c->v, c->v_scale, page, t % b->page_size, kh, d);
			}
			for (int32_t d = 0; d < D; d++)
				o[d] = len ? o[d] / sum : 0;
			lse[(size_t)i * num_q_heads + h] = len ? m + log(sum) : -INFINITY;
		}
		free(s);
	}
}

/* max |out - ref| over the batch, relative to the largest |ref| of its head */
static double worst(const float *out, const double *ref, size_t heads, int32_t D)
{
	double w = 0;

	for (size_t h = 0; h < heads; h++) {
		double scale = 1e-30;

		for (int32_t d = 0; d < D; d++)
			scale = fmax(scale, fabs(ref[h * D + d]));
		for (int32_t d = 0; d < D; d++) {
			double e = fabs(out[h * D + d] - ref[h * D + d]) / scale;

			if (!(e <= w)) /* NaN counts as the worst */
				w = isnan(e) ? INFINITY : e;
		}
	}
	return w;
}

struct run {
	enum kva_dtype dt;
	int32_t heads, group, dim, page_size;
	const int32_t *lens;
	int32_t n;
	enum order order;
	int32_t pad;
	float q_amp;     /* logit magnitude */
	bool share;
	struct kva_decode_opts opts;
	double tol;
};

static double tolerance(enum kva_dtype dt)
{
	/* the cache's values are exact in the reference; what is left is fp32
	 * accumulation and exp2 (and, for fp8/int8, the scale multiplications) */
	return dt == KVA_F32 ? 2e-5 : 5e-5;
}

/* decode on every ISA; returns the worst error seen */
static double check_run(const struct run *r, uint64_t seed)
{
	uint64_t rng = seed;
	struct cache c;
	struct batch b;
	int32_t pages = pages_for(r->lens, r->n, r->page_size) + 3, qh = r->heads * r->group;
	size_t nq = (size_t)r->n * qh * r->dim;
	float *q = malloc(sizeof(float) * nq), *out = malloc(sizeof(float) * nq);
	float *lse = malloc(sizeof(float) * (size_t)r->n * qh);
	double *ref = malloc(sizeof(double) * nq), *rlse = malloc(sizeof(double) * (size_t)r->n * qh);
	double sm = 1.0 / sqrt((double)r->dim), worst_seen = 0;

	cache_make(&c, r->dt, pages, r->page_size, r->heads, r->dim, r->order, r->pad);
	batch_make(&b, r->lens, r->n, r->page_size, pages, r->share, &rng);
	fill(&c, &b, 1.0f, &rng);
	for (size_t i = 0; i < nq; i++)
		q[i] = r->q_amp * frand(&rng);
	reference(&c, &b, q, qh, sm, ref, rlse);
	for (int k = 0; k < n_isas; k++) {
		struct kva_decode_opts o = r->opts;
		double w, wl = 0;
		int ret;

		if (!isa_takes(isas[k], r->dim))
			continue;
		o.isa = isas[k];
		memset(out, 0, sizeof(float) * nq);
		ret = kva_decode(&c.kv, &b.pt, q, KVA_F32, qh, (float)sm, out, lse, &o);
		if (ret)
			fail_msg("decode (%s): %d %s", kva_isa_name(isas[k]), ret, kva_errmsg());
		w = worst(out, ref, (size_t)r->n * qh, r->dim);
		for (size_t h = 0; h < (size_t)r->n * qh; h++) {
			double e = isinf(rlse[h]) ? (lse[h] == rlse[h] ? 0 : INFINITY)
						 : fabs(lse[h] - rlse[h]) / fmax(1.0, fabs(rlse[h]));

			wl = fmax(wl, e);
		}
		if (!(w <= r->tol) || !(wl <= r->tol))
			fail_msg("%s %s dim %d group %d page %d: error %.3g, lse error %.3g (limit %.3g)",
				 kva_isa_name(isas[k]), kva_dtype_name(r->dt), r->dim, r->group,
				 r->page_size, w, wl, r->tol);
		worst_seen = fmax(worst_seen, w);
	}
	cache_free(&c);
	batch_free(&b);
	free(q);
	free(out);
	free(lse);
	free(ref);
	free(rlse);
	return worst_seen;
}

/* -------------------------------------------------------------- tests */

static void test_every_dtype_and_head_dim_matches_the_reference(void **state)
{
	static const enum kva_dtype dts[] = { KVA_F32, KVA_F16, KVA_BF16, KVA_FP8_E4M3, KVA_INT8 };
	static const int32_t dims[] = { 64, 80, 96, 128, 256 };
	static const int32_t lens[] = { 1, 15, 16, 17, 37, 100 };

	(void)state;
	for (unsigned i = 0; i < sizeof(dts) / sizeof(dts[0]); i++)
		for (unsigned j = 0; j < sizeof(dims) / sizeof(dims[0]); j++) {
			struct run r = { .dt = dts[i], .heads = 2, .group = 4, .dim = dims[j],
					 .page_size = 16, .lens = lens, .n = 6, .q_amp = 1,
					 .share = true, .tol = tolerance(dts[i]) };

			check_run(&r, 100 * i + j);
		}
}

/*
 * Groups that are not a multiple of four: the vector tiles take four heads
 * at a time and the last 1-3 in shapes of their own (scores and output),
 * so every dtype and head_dim goes through each of those shapes here.
 */
static void test_every_group_remainder_every_dtype_and_head_dim(void **state)
{
	static const enum kva_dtype dts[] = { KVA_F32, KVA_F16, KVA_BF16, KVA_FP8_E4M3, KVA_INT8 };
	static const int32_t dims[] = { 64, 80, 96, 128, 256 };
	static const int32_t groups[] = { 3, 5, 6, 7 };
	static const int32_t lens[] = { 1, 17, 49, 100 };

	(void)state;
	for (unsigned i = 0; i < sizeof(dts) / sizeof(dts[0]); i++)
		for (unsigned j = 0; j < sizeof(dims) / sizeof(dims[0]); j++)
			for (unsigned g = 0; g < sizeof(groups) / sizeof(groups[0]); g++) {
				struct run r = { .dt = dts[i], .heads = 2, .group = groups[g],
						 .dim = dims[j], .page_size = 16, .lens = lens,
						 .n = 4, .q_amp = 1, .tol = tolerance(dts[i]) };

				check_run(&r, 1000 + 100 * i + 10 * j + g);
			}
}

/*
 * Every dtype x @dims x @groups over @n sequences, of lengths @lens[0..n),
 * with q of amplitude 1 and 30 (large enough that the running maxima move
 * from block to block, and the accumulators are rescaled); the seeds from
 * @seed.
 */
static void check_groups_every_dtype(const int32_t *dims, unsigned nd, const int32_t *groups,
				     unsigned ng, const int32_t *lens, int32_t n, uint64_t seed)
{
	static const enum kva_dtype dts[] = { KVA_F32, KVA_F16, KVA_BF16, KVA_FP8_E4M3, KVA_INT8 };
	static const float amps[] = { 1, 30 };

	for (unsigned i = 0; i < sizeof(dts) / sizeof(dts[0]); i++)
		for (unsigned j = 0; j < nd; j++)
			for (unsigned g = 0; g < ng; g++)
				for (unsigned a = 0; a < 2; a++) {
					struct run r = { .dt = dts[i], .heads = 2, .group = groups[g],
							 .dim = dims[j], .page_size = 16, .lens = lens,
							 .n = n, .q_amp = amps[a],
							 .tol = a ? 1e-4 : tolerance(dts[i]) };

					check_run(&r, seed + 100 * i + 10 * j + 3 * g + a);
				}
}

/*
 * A group's last five heads (groups 5, 9, 13) take the AVX2 tile's output
 * as 5 heads x 2 chunks (kernels/tile_avx2.c, out_heads): head dims whose
 * chunks of 8 are odd in number (NC 1, 3, 5, 9, 15) end in a part of one
 * chunk; every dtype, odd lengths, maxima that move.
 */
static void test_five_head_output_parts_every_dtype(void **state)
{
	static const int32_t dims[] = { 8, 24, 40, 72, 120, 128 };
	static const int32_t groups[] = { 5, 9, 13 };
	static const int32_t lens[] = { 1, 47, 49, 100 };

	(void)state;
	check_groups_every_dtype(dims, sizeof(dims) / sizeof(dims[0]), groups,
				 sizeof(groups) / sizeof(groups[0]), lens, 4, 9000);
}

/*
 * Groups of 4, 8 and 16 heads take the AVX2 tile's token-major scores
 * (kernels/tile_avx2.c, tg_block): a ymm of scores is 2 tokens, 1 or half
 * of one, an odd block end leaves half a vector at group 4, and one vector
 * exponential rescales every head; fp8's and int8's scales go into each
 * token's lanes (int8's differ from token to token). Head dims whose
 * output parts end in 1 or 2 chunks, odd lengths, and q large enough that
 * the running maxima move from block to block.
 */
static void test_token_major_groups_every_dtype(void **state)
{
	static const int32_t dims[] = { 8, 40, 56, 96, 128, 256 };
	static const int32_t groups[] = { 4, 8, 16 };
	static const int32_t lens[] = { 1, 2, 47, 49, 97, 130 };

	(void)state;
	check_groups_every_dtype(dims, sizeof(dims) / sizeof(dims[0]), groups,
				 sizeof(groups) / sizeof(groups[0]), lens, 6, 3000);
}

static void test_gqa_and_mqa_groups(void **state)
{
	static const int32_t groups[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 21, 33, 64 };
	static const int32_t lens[] = { 33, 64, 1, 70 };

	(void)state;
	for (unsigned g = 0; g < sizeof(groups) / sizeof(groups[0]); g++) {
		struct run r = { .dt = KVA_F16, .heads = 2, .group = groups[g], .dim = 128,
				 .page_size = 16, .lens = lens, .n = 4, .q_amp = 1, .tol = 5e-5 };
		struct run mqa = r;

		check_run(&r, 7 + g);
		mqa.heads = 1; /* MQA: one KV head for every query head */
		check_run(&mqa, 70 + g);
	}
}

static void test_page_sizes_and_lengths_around_boundaries(void **state)
{
	static const int32_t sizes[] = { 1, 7, 16, 32 };

	(void)state;
	for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		int32_t P = sizes[s];
		int32_t lens[] = { 1, P > 1 ? P - 1 : 1, P, P + 1, 2 * P + 3, 9 };
		struct run r = { .dt = KVA_BF16, .heads = 2, .group = 4, .dim = 64, .page_size = P,
				 .lens = lens, .n = 6, .q_amp = 1, .share = true, .tol = 5e-5 };

		check_run(&r, 200 + s);
	}
}

static void test_split_boundaries_and_split_invariance(void **state)
{
	static const int32_t lens[] = { 511, 512, 513, 1024, 1025, 100 };
	static const int32_t splits[] = { 16, 64, 512, 100000 };
	const int32_t qh = 8, D = 128;
	uint64_t rng = 5;
	struct cache c;
	struct batch b;
	int32_t pages = pages_for(lens, 6, 16);
	size_t nq = 6 * (size_t)qh * D;
	float *q = malloc(sizeof(float) * nq), *base = malloc(sizeof(float) * nq);
	float *out = malloc(sizeof(float) * nq);
	double *ref = malloc(sizeof(double) * nq), rlse[6 * 8];

	(void)state;
	cache_make(&c, KVA_F16, pages, 16, 2, D, HND, 0);
	batch_make(&b, lens, 6, 16, pages, false, &rng);
	fill(&c, &b, 1.0f, &rng);
	for (size_t i = 0; i < nq; i++)
		q[i] = frand(&rng);
	reference(&c, &b, q, qh, 0.1, ref, rlse);
	for (int k = 0; k < n_isas; k++)
		for (unsigned s = 0; s < sizeof(splits) / sizeof(splits[0]); s++) {
			struct kva_decode_opts o = { .split_tokens = splits[s], .isa = isas[k] };

			assert_int_equal(kva_decode(&c.kv, &b.pt, q, KVA_F32, qh, 0.1f, out, NULL, &o), 0);
			if (!(worst(out, ref, 6 * (size_t)qh, D) <= 5e-5))
				fail_msg("%s split %d: error %.3g", kva_isa_name(isas[k]), splits[s],
					 worst(out, ref, 6 * (size_t)qh, D));
			if (s == 0)
				memcpy(base, out, sizeof(float) * nq);
			/* splits merge by log-sum-exp: the same within rounding */
			for (size_t i = 0; i < nq; i++)
				assert_true(fabsf(out[i] - base[i]) <= 1e-5f * (1 + fabsf(base[i])));
		}
	cache_free(&c);
	batch_free(&b);
	free(q);
	free(base);
	free(out);
	free(ref);
}

static void test_thread_count_changes_nothing(void **state)
{
	static const int32_t lens[] = { 3000, 17, 900, 1, 2048, 333, 5, 700 };
	static const int threads[] = { 1, 2, 3, 7 };
	const int32_t qh = 16, D = 64;
	uint64_t rng = 9;
	struct cache c;
	struct batch b;
	int32_t pages = pages_for(lens, 8, 32);
	size_t nq = 8 * (size_t)qh * D;
	float *q = malloc(sizeof(float) * nq), *first = malloc(sizeof(float) * nq);
	float *out = malloc(sizeof(float) * nq), lse1[8 * 16], lse[8 * 16];

	(void)state;
	cache_make(&c, KVA_F16, pages, 32, 4, D, NHD, 0);
	batch_make(&b, lens, 8, 32, pages, false, &rng);
	fill(&c, &b, 1.0f, &rng);
	for (size_t i = 0; i < nq; i++)
		q[i] = frand(&rng);
	for (int k = 0; k < n_isas; k++)
		for (unsigned t = 0; t < 4; t++) {
			struct kva_decode_opts o = { .threads = threads[t], .split_tokens = 256,
						     .isa = isas[k] };

			assert_int_equal(kva_decode(&c.kv, &b.pt, q, KVA_F32, qh, 0.125f, out, lse, &o),
					 0);
			if (t == 0) {
				memcpy(first, out, sizeof(float) * nq);
				memcpy(lse1, lse, sizeof(lse));
			}
			/* the plan does not depend on threads: bit for bit */
			assert_memory_equal(out, first, sizeof(float) * nq);
			assert_memory_equal(lse, lse1, sizeof(lse));
		}
	cache_free(&c);
	batch_free(&b);
	free(q);
	free(first);
	free(out);
}

/*
 * The tests of a choice the library makes by the CPU (struct choice): its
 * force's semantics (check_force), then one cache and q decoded twice on
 * the choice's path (2 KV heads, 4 sequences of its lengths, pages of 16
 * tokens), with way(0) and then way(1) before each call and way(-1)
 * after, for every dtype, each of its head_dims and groups (up to
 * TWO_WAYS_GROUP), HND and NHD; its check compares the two. Nothing to
 * run where the CPU has no such path.
 */
#define TWO_WAYS_GROUP 24

struct two_ways;

struct choice {
	enum kva_isa isa;               /* the path it is made on */
	bool (*ask)(void);              /* the CPU's answer (isa.c) */
	void (*force)(int);             /* its force: 1 yes, 0 no, -1 the CPU's */
	void (*way)(int);               /* what makes the path take way 0 or 1 */
	const char *ways[2];            /* way 0's and way 1's names, for messages */
	int32_t dims[6], groups[8];     /* head_dims and groups, 0-terminated */
	int32_t lens[4];
	uint64_t seed;
	void (*check)(const struct two_ways *w);
	const char *what;               /* the choice, for main()'s runs the other way */
};

struct two_ways {
	const struct choice *ch;
	enum kva_dtype dt;
	int32_t D, group, qh;
	int order;
	struct cache c;
	struct batch b;
	float *q, *out[2];
	float lse[2][4 * 2 * TWO_WAYS_GROUP];
	size_t nq;
};

static void two_ways_one(struct two_ways *w, uint64_t rng)
{
	const int32_t heads = 2, pages = pages_for(w->ch->lens, 4, 16);

	assert_true(w->group <= TWO_WAYS_GROUP);
	w->qh = heads * w->group;
	w->nq = 4 * (size_t)w->qh * w->D;
	w->q = malloc(sizeof(float) * w->nq);
	w->out[0] = malloc(sizeof(float) * w->nq);
	w->out[1] = malloc(sizeof(float) * w->nq);
	assert_non_null(w->q);
	assert_non_null(w->out[0]);
	assert_non_null(w->out[1]);
	cache_make(&w->c, w->dt, pages, 16, heads, w->D, w->order, 0);
	batch_make(&w->b, w->ch->lens, 4, 16, pages, false, &rng);
	fill(&w->c, &w->b, 1.0f, &rng);
	for (size_t i = 0; i < w->nq; i++)
		w->q[i] = frand(&rng);
	for (int way = 0; way < 2; way++) {
		struct kva_decode_opts o = { .threads = 2, .split_tokens = 256,
					     .isa = w->ch->isa };

		w->ch->way(way);
		assert_int_equal(kva_decode(&w->c.kv, &w->b.pt, w->q, KVA_F32, w->qh, 0.125f,
					    w->out[way], w->lse[way], &o),
				 0);
	}
	w->ch->way(-1);
}

/* a choice's force: yes, no, then the CPU's own answer, the same each time */
static void check_force(bool (*ask)(void), void (*force)(int))
{
	bool cpu;

	force(1);
	assert_true(ask());
	force(0);
	assert_false(ask());
	force(-1);
	cpu = ask();
	assert_true(ask() == cpu);
}

static void check_choice(const struct choice *ch)
{
	static const enum kva_dtype dts[] = { KVA_F32, KVA_F16, KVA_BF16, KVA_FP8_E4M3, KVA_INT8 };

	check_force(ch->ask, ch->force);
	if (kva_isa_best() < ch->isa)
		return;
	for (unsigned d = 0; d < sizeof(dts) / sizeof(dts[0]); d++)
		for (unsigned j = 0; ch->dims[j]; j++)
			for (unsigned gi = 0; ch->groups[gi]; gi++)
				for (int order = HND; order <= NHD; order++) {
					struct two_ways w = { .ch = ch, .dt = dts[d], .D = ch->dims[j],
							      .group = ch->groups[gi], .order = order };

					two_ways_one(&w, ch->seed + d * 11 + j * 5 + gi);
					ch->check(&w);
					cache_free(&w.c);
					batch_free(&w.b);
					free(w.q);
					free(w.out[0]);
					free(w.out[1]);
				}
}

static const char *two_ways_name(const struct two_ways *w)
{
	static char buf[64];

	snprintf(buf, sizeof(buf), "%s head_dim %d group %d %s", kva_dtype_name(w->dt), w->D,
		 w->group, w->order == HND ? "HND" : "NHD");
	return buf;
}

static void check_same_bits(const struct two_ways *w)
{
	if (memcmp(w->out[0], w->out[1], sizeof(float) * w->nq) ||
	    memcmp(w->lse[0], w->lse[1], sizeof(float) * 4 * (size_t)w->qh))
		fail_msg("%s: %s and %s differ", two_ways_name(w), w->ch->ways[0], w->ch->ways[1]);
}

/*
 * The AVX-512 tile's prefetch hint (T0 on Zen 5, T1 elsewhere: kva__pf_t0)
 * changes when lines arrive, never what is computed: groups 1 and 2 at
 * head_dims 64 and 128 (the dot products' sites, which take it), and
 * group 4 and head_dim 96 (which keep T1 whatever it says), every dtype,
 * HND and NHD, bit for bit the same with the hint forced either way. And
 * the force: yes, no, then the CPU's own answer, the same each time.
 */
static void test_prefetch_hint_changes_nothing(void **state)
{
	static const struct choice t0 = {
		KVA_ISA_AVX512, kva__pf_t0, kva__pf_t0_force, kva__pf_t0_force, { "T1", "T0" },
		{ 64, 96, 128 }, { 1, 2, 4 }, { 700, 37, 300, 1 }, 77, check_same_bits,
		"AVX-512 dot products' prefetch hint",
	};

	(void)state;
	check_choice(&t0);
}

/*
 * The AVX2 tile's cursor's hint (T0 at group 1 on head-major pages on Zen
 * 5, T1 elsewhere: kva__cursor_t0) changes when lines arrive, never what
 * is computed: groups 1, 2 and 4 at head_dims 64, 96 and 128, every dtype,
 * HND (group 1 takes it) and NHD (which keeps T1 whatever the CPU), bit for
 * bit the same with kva__pf_t0 forced either way; and the force. That the
 * hint reaches the cursor's lines is test_cursor_asks_with_the_tiles_hint's,
 * and the rule kva_decode hands the tile, test_cursor_t0_rule's.
 */
static void test_cursor_hint_changes_nothing(void **state)
{
	static const struct choice avx2 = {
		KVA_ISA_AVX2, kva__pf_t0, kva__pf_t0_force, kva__pf_t0_force, { "T1", "T0" },
		{ 64, 96, 128 }, { 1, 2, 4 }, { 700, 37, 300, 1 }, 79, check_same_bits,
		"AVX2 cursor's prefetch hint",
	};

	(void)state;
	check_choice(&avx2);
}

/*
 * kva__cursor_t0, the rule kva_decode takes the AVX2 tile's cursor hint
 * from: T0 exactly at group 1 where a head's rows of a page lie end to end
 * (HND, or NHD with one KV head), and only on a CPU where kva__pf_t0.
 */
static void test_cursor_t0_rule(void **state)
{
	struct kva_kv_desc kv = { .head_dim = 128, .num_kv_heads = 8, .page_size = 16 };

	(void)state;
	for (int cpu = 0; cpu < 2; cpu++) {
		kva__pf_t0_force(cpu);
		/* HND: [head][token][dim] */
		kv.token_stride = 128;
		kv.head_stride = 16 * 128;
		kv.num_kv_heads = 8;
		assert_int_equal(kva__cursor_t0(&kv, 1), cpu);
		for (int32_t g = 2; g <= 8; g++)
			assert_false(kva__cursor_t0(&kv, g));
		/* NHD: [token][head][dim], rows of a head 8 rows apart */
		kv.token_stride = 8 * 128;
		kv.head_stride = 128;
		assert_false(kva__cursor_t0(&kv, 1));
		assert_false(kva__cursor_t0(&kv, 2));
		/* NHD with one KV head: its rows end to end */
		kv.num_kv_heads = 1;
		kv.token_stride = 128;
		assert_int_equal(kva__cursor_t0(&kv, 1), cpu);
		/* padded rows: end to end no more, with one KV head or eight */
		kv.token_stride = 136;
		assert_false(kva__cursor_t0(&kv, 1));
		kv.num_kv_heads = 8;
		kv.head_stride = 16 * 136;
		assert_false(kva__cursor_t0(&kv, 1));
	}
	kva__pf_t0_force(-1);
}

/* groups 3 and 4 scored sliced (0) or as dot products (1), on the AVX-512
 * tile whatever the core (-1: the CPU's answers again) */
static void force_sl_dot(int dot)
{
	kva__sl_dot_force(dot);
	kva__avx512_split_force(dot < 0 ? -1 : 0);
}

/* the two within 2e-5 of each other (their sums' order differs), and each
 * within its dtype's tolerance of the reference */
static void check_close(const struct two_ways *w)
{
	double *ref = malloc(sizeof(double) * w->nq), rlse[4 * 2 * TWO_WAYS_GROUP];
	float diff = 0.0f;

	assert_non_null(ref);
	for (size_t i = 0; i < w->nq; i++)
		diff = fmaxf(diff, fabsf(w->out[0][i] - w->out[1][i]));
	for (int i = 0; i < 4 * w->qh; i++)
		diff = fmaxf(diff, fabsf(w->lse[0][i] - w->lse[1][i]));
	if (!(diff <= 2e-5f))
		fail_msg("%s: %s and %s differ by %g", two_ways_name(w), w->ch->ways[0],
			 w->ch->ways[1], (double)diff);
	reference(&w->c, &w->b, w->q, w->qh, 0.125, ref, rlse);
	for (int way = 0; way < 2; way++)
		if (!(worst(w->out[way], ref, 4 * (size_t)w->qh, w->D) <= tolerance(w->dt)))
			fail_msg("%s, %s: error %.3g", two_ways_name(w), w->ch->ways[way],
				 worst(w->out[way], ref, 4 * (size_t)w->qh, w->D));
	free(ref);
}

/*
 * The AVX-512 tile's groups of 3 and 4 score as dot products on Zen 5 and
 * sliced elsewhere (kva__sl_dot): both, every dtype, head_dims 64 to 256
 * (80 and 96: chunks past the slices' multiple), HND and NHD, lengths with
 * a block's last 1 to 3 tokens, against each other and against the
 * reference; and the force's semantics. The main suites check whichever
 * this CPU runs, and main() runs them again with the choice the other way.
 */
static const struct choice choice_sl_dot = {
	KVA_ISA_AVX512, kva__sl_dot, kva__sl_dot_force, force_sl_dot,
	{ "sliced", "dot products" }, { 64, 80, 96, 128, 256 }, { 3, 4 }, { 701, 38, 299, 1 },
	91, check_close, "AVX-512 groups 3 and 4 scored",
};

static void test_groups_3_and_4_score_the_same_either_way(void **state)
{
	(void)state;
	check_choice(&choice_sl_dot);
}

/*
 * The AVX2 tile's one-head scores take 12 rows a chunk at a time on Zen 5
 * and 2 rows from start to end elsewhere (kva__avx2_cols), f32 2 rows
 * everywhere: both, every dtype, head_dims 64, 96 (the generic instance),
 * 128 and 256, group 1 and group 5 (whose last head is scored as group 1
 * is), HND and NHD, lengths that leave a 12-token step short (the shared
 * tail) at a sequence's and a split's end, against each other and
 * against the reference; and the force's semantics. main() runs the
 * decode suites again with the choice the other way.
 */
static const struct choice choice_cols = {
	KVA_ISA_AVX2, kva__avx2_cols, kva__avx2_cols_force, kva__avx2_cols_force,
	{ "2 rows", "12 rows" }, { 64, 96, 128, 256 }, { 1, 5 }, { 700, 37, 301, 1 },
	95, check_close, "AVX2 one-head scores over",
};

static void test_one_head_scores_the_same_either_way(void **state)
{
	(void)state;
	check_choice(&choice_cols);
}

/*
 * The AVX-512 tile's groups with no sliced shape (5, 9-11, past 16) run as
 * subgroups on Zen 5 (kva__avx512_sub: 16, 8 or 4 heads sliced, then the
 * rest) and as the generic instance's dot products elsewhere
 * (kva__avx512_subgroups): both, every dtype, head_dims 64 and 128 (the
 * fitted instances) and 80, 96, 256 (the generic one), groups 5 (4 + 1,
 * the 1 inside the 4's block), 6 (4 + 2 so, but f32: its padded sliced
 * shape either way), 9 and 10 (8 + 1, 8 + 2, inside the 8's), 11 (8 + 3,
 * a sliced rest), 18 (16 + 2, inside the 16's) and 21 (16, then 4 + 1),
 * HND and NHD, against each other and against the reference; and the force's
 * semantics. The last sequence is two whole blocks, so that the last
 * tile's last turn, with no turn after it to ask for, is a whole block,
 * whose prefetch steps the sanitizer builds count (KVA__PF_AUDIT): the
 * dot products after a sliced subgroup of the generic instance step no
 * cursor, as its count says. main() runs the decode suites again with
 * the choice the other way.
 */
static const struct choice choice_subgroups = {
	KVA_ISA_AVX512, kva__avx512_subgroups, kva__avx512_subgroups_force,
	kva__avx512_subgroups_force, { "dot products", "subgroups" }, { 64, 80, 96, 128, 256 },
	{ 5, 6, 9, 10, 11, 18, 21 }, { 702, 39, 298, 96 }, 97, check_close,
	"AVX-512 groups 5, 9-11 and past 16 as",
};

static void test_groups_without_a_sliced_shape_the_same_either_way(void **state)
{
	(void)state;
	check_choice(&choice_subgroups);
}

/*
 * A tile covers a span of KV heads: all of them when the batch has splits
 * enough for the threads, fewer otherwise (decode.c). Three KV heads, 12
 * splits: 1 thread runs spans of 3, 4 threads spans of 2 and 1 (an uneven
 * last span), 8 threads spans of 1. Each head is computed alone: bit for bit
 * the same, per-head scales (int8, fp8) included, and the same as the
 * reference; NaN in the padding between heads is never read.
 */
static void test_head_spans_change_nothing(void **state)
{
	static const enum kva_dtype dts[] = { KVA_F16, KVA_INT8, KVA_FP8_E4M3 };
	static const int32_t lens[] = { 700, 650, 513, 600 };
	static const int threads[] = { 1, 4, 8 };
	const int32_t heads = 3, group = 4, qh = heads * group, D = 64;

	(void)state;
	for (unsigned d = 0; d < 3; d++)
		for (int order = HND; order <= NHD; order++) {
			uint64_t rng = 41 + d;
			struct cache c;
			struct batch b;
			int32_t pages = pages_for(lens, 4, 16) + 2;
			size_t nq = 4 * (size_t)qh * D;
			float *q = malloc(sizeof(float) * nq), *first = malloc(sizeof(float) * nq);
			float *out = malloc(sizeof(float) * nq), lse1[4 * 12], lse[4 * 12];
			double *ref = malloc(sizeof(double) * nq), rlse[4 * 12];

			cache_make(&c, dts[d], pages, 16, heads, D, (enum order)order, 8);
			batch_make(&b, lens, 4, 16, pages, false, &rng);
			fill(&c, &b, 1.0f, &rng);
			for (size_t i = 0; i < nq; i++)
				q[i] = frand(&rng);
			reference(&c, &b, q, qh, 0.125, ref, rlse);
			for (int k = 0; k < n_isas; k++)
				for (unsigned t = 0; t < 3; t++) {
					struct kva_decode_opts o = { .threads = threads[t],
								     .split_tokens = 200,
								     .isa = isas[k] };

					assert_int_equal(kva_decode(&c.kv, &b.pt, q, KVA_F32, qh, 0.125f,
								    out, lse, &o), 0);
					if (!(worst(out, ref, 4 * (size_t)qh, D) <= tolerance(dts[d])))
						fail_msg("%s %s threads %d: error %.3g",
							 kva_isa_name(isas[k]), kva_dtype_name(dts[d]),
							 threads[t], worst(out, ref, 4 * (size_t)qh, D));
					if (t == 0) {
						memcpy(first, out, sizeof(float) * nq);
						memcpy(lse1, lse, sizeof(lse));
					}
					assert_memory_equal(out, first, sizeof(float) * nq);
					assert_memory_equal(lse, lse1, sizeof(lse));
				}
			cache_free(&c);
			batch_free(&b);
			free(q);
			free(first);
			free(out);
			free(ref);
		}
}

static void test_long_context_past_16k(void **state)
{
	static const int32_t lens[] = { 16384 + 5, 3 };
	struct run r = { .dt = KVA_F16, .heads = 1, .group = 8, .dim = 128, .page_size = 16,
			 .lens = lens, .n = 2, .q_amp = 1, .tol = 5e-5 };

	(void)state;
	check_run(&r, 31);
}

static void test_strides_nhd_hnd_and_padding(void **state)
{
	static const int32_t lens[] = { 40, 7, 65 };
	static const enum order orders[] = { HND, NHD };
	static const int32_t pads[] = { 0, 16, 24 };

	(void)state;
	for (unsigned o = 0; o < 2; o++)
		for (unsigned p = 0; p < 3; p++) {
			struct run r = { .dt = KVA_F16, .heads = 3, .group = 2, .dim = 96,
					 .page_size = 16, .lens = lens, .n = 3, .order = orders[o],
					 .pad = pads[p], .q_amp = 1, .share = true, .tol = 5e-5 };

			check_run(&r, 40 + 3 * o + p);
		}
}

/* ------------------------------------------------- the prefetch cursor */

/*
 * The cursor that prefetches a tile's next block (kernels_pvt.h) reads what
 * the block reads and nothing else: every byte of every span head's K and V
 * row of each token once, no run over another, in address order within
 * each page (a head's rows, then the next head's, in HND; the tokens in
 * order in NHD), and in no more lines than the steps it was given ask for.
 * @one >= 0: the cursor on the span's head @one alone (kva__pf_begin_head,
 * a head's turn), which reads that head's rows and no other's.
 */
static void check_cursor(const struct cache *c, const int32_t *pages, int32_t t0, int32_t t1,
			 int32_t kv_head, int32_t heads, int steps, int32_t one)
{
	const struct kva_kv_desc *kv = &c->kv;
	const size_t esize = kva_dtype_size(kv->dtype), row = (size_t)kv->head_dim * esize;
	const struct kva__tile t = { .kv = kv, .pages = pages, .t0 = t0, .t1 = t1,
				     .kv_head = kv_head, .heads = heads, .group = 1 };
	const size_t page_bytes = (size_t)kv->page_stride * esize;

	for (int32_t tb = t0; tb < t1; tb += KVA__BLOCK_TOKENS) {
		struct kva__rows rows;
		struct kva__pf pf;
		size_t lines = 0, want = 0, got = 0;
		uintptr_t last[2][64];
		int nruns = 0;

		kva__rows_at(&t, tb, &rows);
		/* each row's segment ends at the first row after it that is not
		 * one token stride past the one before, K and V alike (pages end
		 * to end make one segment: the run of neighbours below, in NHD) */
		for (int i = 0; i < rows.n; i++) {
			const size_t tok = (size_t)kv->token_stride * esize;
			int j = i + 1;

			while (j < rows.n && rows.k[j] == rows.k[j - 1] + tok &&
			       rows.v[j] == rows.v[j - 1] + tok)
				j++;
			assert_int_equal(rows.seg[i], j);
		}
		if (one < 0)
			kva__pf_begin(&pf, &t, &rows, row, steps);
		else
			kva__pf_begin_head(&pf, &t, &rows, one, row, steps);
		memset(last, 0, sizeof(last));
		for (int part = 0; part < 2; part++)
			want += (size_t)rows.n * (size_t)(one < 0 ? heads : 1) * row;
		while (pf.part < 2) {
			const int part = pf.part;
			const char *base = part ? c->v : c->k;
			size_t len;
			uintptr_t r = kva__pf_run(&pf, &len);
			/* the run lies in one page of the block, within rows it reads */
			size_t at = (size_t)(r - (uintptr_t)base);
			int32_t pg = (int32_t)(at / page_bytes), i;

			assert_true(len > 0 && pg < kv->num_pages);
			for (i = 0; i < rows.n && pages[(tb + i) / kv->page_size] != pg; i++)
				;
			assert_true(i < rows.n); /* a page of the block */
			for (size_t b = 0; b < len; b += row) {
				/* each row of the run is a span head's row of a token */
				const char *p = (const char *)r + b;
				bool found = false;

				for (int j = 0; j < rows.n && !found; j++)
					for (int h = 0; h < heads && !found; h++)
						found = (one < 0 || h == one) &&
							p == (part ? rows.v : rows.k)[j] +
								     kva__head_offset(kv, h);
				assert_true(found);
			}
			assert_true(len % row == 0);
			/* address order within a page: each run past the one before */
			assert_true(pg < 64);
			assert_true(r >= last[part][pg]);
			last[part][pg] = r + len;
			got += len;
			lines += (r % 64 + len + 63) / 64;
			nruns++;
			assert_true(nruns <= 2 * rows.n * heads);
		}
		/* every byte once: the rows are distinct, each run's rows are
		 * rows of the block, and no run starts before the last ended */
		assert_int_equal(got, want);
		assert_true(lines <= (size_t)pf.per * (size_t)steps);

		/* a core that queues prefetches takes a run's lines back to
		 * back, one that drops them a line at a time (kva__pf_queues):
		 * the same lines, the cursor in the same place after every
		 * step, steps of 1 to 23 lines and "all that are left" */
		struct kva__tile tq = t;
		struct kva__pf a, b;

		tq.pf_queue = true;
		if (one < 0) {
			kva__pf_begin(&a, &tq, &rows, row, steps);
			kva__pf_begin(&b, &t, &rows, row, steps);
		} else {
			kva__pf_begin_head(&a, &tq, &rows, one, row, steps);
			kva__pf_begin_head(&b, &t, &rows, one, row, steps);
		}
		assert_true(a.tight && !b.tight);
		for (int k = 0; a.part < 2 || a.left; k++) {
			const int n = k % 5 == 4 ? -1 : 1 + k * 7 % 23;

			kva__pf_lines(&a, n);
			kva__pf_lines(&b, n);
			assert_ptr_equal(a.p, b.p);
			assert_int_equal(a.left, b.left);
			assert_int_equal(a.part, b.part);
			assert_int_equal(a.j, b.j);
			assert_int_equal(a.h, b.h);
		}
	}
}

/*
 * The cursor tests' caches: both layouts, three pads, four page sizes
 * (runs of a page, of a row) and three dtypes, CURSOR_PAGES pages each,
 * the first half scattered and the second neighbours; @check on each.
 */
enum { CURSOR_PAGES = 64 };

static void for_each_cursor_cache(void (*check)(const struct cache *c, const int32_t *pages,
						int32_t ps, uint64_t *rng),
				  uint64_t seed)
{
	static const enum order orders[] = { HND, NHD };
	static const int32_t pads[] = { 0, 8, 32 }, page_sizes[] = { 16, 32, 5, 1 };
	static const enum kva_dtype dts[] = { KVA_F16, KVA_F32, KVA_INT8 };
	uint64_t rng = seed;

	for (unsigned o = 0; o < 2; o++)
		for (unsigned p = 0; p < 3; p++)
			for (unsigned z = 0; z < 4; z++)
				for (unsigned d = 0; d < 3; d++) {
					const int32_t ps = page_sizes[z], npages = CURSOR_PAGES;
					int32_t pages[CURSOR_PAGES], perm[CURSOR_PAGES];
					struct cache c;

					cache_make(&c, dts[d], npages, ps, 8, 128, orders[o], pads[p]);
					for (int32_t i = 0; i < npages; i++)
						perm[i] = i;
					for (int32_t i = npages / 2 - 1; i > 0; i--) {
						int32_t j = (int32_t)(tu_rand(&rng) % (uint64_t)(i + 1)),
							x = perm[i];

						perm[i] = perm[j];
						perm[j] = x;
					}
					/* scattered pages, then a run of neighbours */
					for (int32_t i = 0; i < npages; i++)
						pages[i] = i < npages / 2 ? perm[i] : i;
					check(&c, pages, ps, &rng);
					cache_free(&c);
				}
}

static void cursor_checks(const struct cache *c, const int32_t *pages, int32_t ps, uint64_t *rng)
{
	(void)rng;
	/* all heads, a span in the middle, one head; a block cut short; a
	 * tile from a later page */
	check_cursor(c, pages, 0, ps * 12 < 100 ? ps * 12 : 100, 0, 8, 40, -1);
	check_cursor(c, pages, ps, ps + 47, 2, 3, 7, -1);
	check_cursor(c, pages + CURSOR_PAGES / 2 - 2, 0, 3 * ps + 1, 5, 1, 1, -1);
	/* and each head alone, as a head's turn reads it */
	for (int32_t h = 0; h < 3; h++)
		check_cursor(c, pages, ps, ps + 47, 2, 3, 7, h);
	check_cursor(c, pages, 0, ps * 12 < 100 ? ps * 12 : 100, 0, 8, 16, 7);
}

static void test_prefetch_cursor_reads_the_block_in_address_order(void **state)
{
	(void)state;
	for_each_cursor_cache(cursor_checks, 0x9e3779b97f4a7c15ull);
}

/*
 * The tile's pf_cursor_t0 reaches the step cursor's lines: a head's turn
 * asked for by kva__pf_lines, first as a tile without the hint (every line
 * T1), then with it (every line T0, the same lines in the same order),
 * both cursor loops (a line at a time, and a run's lines back to back).
 */
static void hint_checks(const struct cache *c, const int32_t *pages, int32_t ps, uint64_t *rng)
{
	const struct kva_kv_desc *kv = &c->kv;
	const size_t row = (size_t)kv->head_dim * kva_dtype_size(kv->dtype);
	const int32_t heads = 8;
	static const char *plain[8192];
	struct kva__rows rows;

	(void)rng;
	for (int tight = 0; tight < 2; tight++) {
		struct kva__tile t = { .kv = kv, .pages = pages, .t0 = ps, .t1 = ps + 47,
				       .kv_head = 0, .heads = heads, .group = 1,
				       .pf_queue = tight };
		size_t n = 0;

		kva__rows_at(&t, t.t0, &rows);
		for (int hint = 0; hint < 2; hint++) {
			struct kva__pf pf;

			t.pf_cursor_t0 = hint;
			kva__pf_begin_head(&pf, &t, &rows, heads - 1, row, 5);
			pf_log.on = true;
			pf_log.n = pf_log.t0 = 0;
			for (int s = 0; s < 5; s++)
				kva__pf_step(&pf);
			kva__pf_lines(&pf, -1);
			pf_log.on = false;
			assert_true(pf_log.n > 0 && pf_log.n < 8192);
			if (!hint) {
				assert_int_equal(pf_log.t0, 0);
				n = pf_log.n;
				memcpy(plain, pf_log.line, n * sizeof(plain[0]));
			} else {
				if (pf_log.t0 != pf_log.n)
					fail_msg("with the hint, %zu of %zu lines asked with T0",
						 pf_log.t0, pf_log.n);
				assert_int_equal(pf_log.n, n);
				assert_memory_equal(pf_log.line, plain, n * sizeof(plain[0]));
			}
		}
	}
}

static void test_cursor_asks_with_the_tiles_hint(void **state)
{
	(void)state;
	for_each_cursor_cache(hint_checks, 0x51ed27f3a1b2c3d4ull);
}

/*
 * The in-loop cursor (kva__pfq_*): a turn's runs listed, L lines a site
 * and a step's own count (1 to 23) a step, mixed, for any number of them
 * (each exactly its count, across runs' ends, until the list runs out),
 * what they left at the turn's end,
 * then the step cursor's kva__pf_lines(-1) as the tile calls it: exactly
 * the lines the step cursor asks for, in its order, none twice, whatever
 * the layout (HND, NHD, pads), page size (runs of a page, of a row), dtype
 * and cut of the block; and a site past the last line asks for nothing.
 */
static void check_pfq(const struct cache *c, const int32_t *pages, int32_t t0, int32_t t1,
		      int32_t heads, uint64_t *rng)
{
	const struct kva_kv_desc *kv = &c->kv;
	const size_t row = (size_t)kv->head_dim * kva_dtype_size(kv->dtype);
	const struct kva__tile t = { .kv = kv, .pages = pages, .t0 = t0, .t1 = t1,
				     .kv_head = 0, .heads = heads, .group = 1 };
	static const char *want[8192];

	for (int32_t tb = t0; tb < t1; tb += KVA__BLOCK_TOKENS) {
		struct kva__rows rows;

		kva__rows_at(&t, tb, &rows);
		for (int32_t h = 0; h < heads; h++) {
			static const int lines[] = { 1, 2, 4 };
			const int L = lines[tu_rand(rng) % 3];
			const int sites = (int)(tu_rand(rng) % 900);
			const char *run[KVA__PFQ_RUNS][2];
			struct kva__pf a, b;
			struct kva__pfq q;
			size_t nwant, listed, asked;

			kva__pf_begin_head(&a, &t, &rows, h, row, 7);
			b = a;
			pf_log.on = true;
			pf_log.n = 0;
			kva__pf_lines(&a, -1);
			nwant = pf_log.n;
			assert_true(nwant > 0 && nwant < 8192);
			memcpy(want, pf_log.line, nwant * sizeof(want[0]));

			pf_log.n = 0;
			kva__pfq_begin(&b, &q, run, true);
			assert_true(q.n > 0 && q.n <= KVA__PFQ_RUNS);
			const int per = 1 + (int)(tu_rand(rng) % 23);
			listed = 0;
			for (int r = 0; r < q.n; r++)
				listed += (size_t)(run[r][1] - run[r][0]) / 64;
			asked = 0;
			for (int k = 0; k < sites; k++) {
				/* the sliced tile's sites, the other tiles' steps */
				asked += k % 3 == 2 ? (size_t)per : (size_t)L;
				if (k % 3 == 2)
					kva__pfq_step(&q, per);
				else if (L == 1)
					kva__pfq_site(&q, 1);
				else if (L == 2)
					kva__pfq_site(&q, 2);
				else
					kva__pfq_site(&q, 4);
			}
			/* each site and step asked for all its lines, across the
			 * runs' ends, until the list ran out */
			if (pf_log.n != (asked < listed ? asked : listed))
				fail_msg("block %d head %d, L %d, %d sites: %zu lines before the end, "
					 "%zu asked for of %zu listed",
					 tb, h, L, sites, pf_log.n, asked, listed);
			kva__pfq_end(&q);
			kva__pf_lines(&b, -1);
			pf_log.on = false;
			assert_true(b.part >= 2 && b.left == 0);
			if (pf_log.n != nwant)
				fail_msg("block %d head %d, L %d, %d sites: %zu lines, the steps' %zu",
					 tb, h, L, sites, pf_log.n, nwant);
			for (size_t i = 0; i < nwant; i++)
				assert_ptr_equal(pf_log.line[i], want[i]);
			/* past the turn's lines a site asks for none */
			pf_log.on = true;
			pf_log.n = 0;
			kva__pfq_site(&q, 4);
			kva__pfq_step(&q, 4);
			kva__pfq_step(NULL, 4);
			pf_log.on = false;
			assert_int_equal(pf_log.n, 0);
		}
	}
}

static void pfq_checks(const struct cache *c, const int32_t *pages, int32_t ps, uint64_t *rng)
{
	/* whole blocks, and a last one cut short */
	check_pfq(c, pages, 0, ps * 12 < 100 ? ps * 12 : 100, 3, rng);
	check_pfq(c, pages, ps, ps + 47 + 12, 2, rng);
}

static void test_pfq_asks_for_the_lines_the_steps_do(void **state)
{
	(void)state;
	for_each_cursor_cache(pfq_checks, 0x243f6a8885a308d3ull);
}

/*
 * A head's turn ahead (kva__blocks_turn): the cursor on each turn reads the
 * rows of the turn after it and nothing else: the span's next head at the
 * same block, after the last head the next block's first head, after the
 * last block the next tile's first block's first head (its own span, its
 * own pages), and after that nothing.
 */
static void check_turn(const struct kva__blocks *b, const struct kva__tile *want_t, int32_t tb,
		       int32_t h)
{
	struct kva__rows rows;
	struct kva__pf pf = b->pf;
	const size_t row = b->row_bytes;
	size_t got = 0;

	kva__rows_at(want_t, tb, &rows);
	assert_true(rows.n > 0);
	while (pf.part < 2) {
		const int part = pf.part;
		size_t len;
		uintptr_t r = kva__pf_run(&pf, &len);

		assert_true(len > 0 && len % row == 0);
		for (size_t o = 0; o < len; o += row) {
			const char *p = (const char *)r + o;
			bool found = false;

			for (int j = 0; j < rows.n && !found; j++)
				found = p == (part ? rows.v : rows.k)[j] +
						     kva__head_offset(want_t->kv, h);
			assert_true(found);
		}
		got += len;
	}
	assert_int_equal(got, 2 * (size_t)rows.n * row);
}

static void test_turn_cursor_reads_the_next_turn(void **state)
{
	static const enum order orders[] = { HND, NHD };
	int32_t pages[16], pages2[16];
	float m[16], l[16], acc[16 * 64];

	(void)state;
	for (int32_t i = 0; i < 16; i++) {
		pages[i] = (i * 7 + 3) % 16;
		pages2[i] = 15 - i;
	}
	for (unsigned o = 0; o < 2; o++)
		for (int with_next = 0; with_next < 2; with_next++) {
			struct cache c;
			struct kva__blocks b;

			cache_make(&c, KVA_F16, 16, 16, 6, 64, orders[o], 0);
			{
				/* heads 2..4, 100 tokens (blocks of 48, 48, 4), then a
				 * tile of heads 0..1 from token 32 of other pages */
				const struct kva__tile next = { .kv = &c.kv, .pages = pages2, .t0 = 32,
								.t1 = 90, .kv_head = 0, .heads = 2,
								.group = 1 };
				const struct kva__tile t = { .kv = &c.kv, .pages = pages, .t0 = 0,
							     .t1 = 100, .kv_head = 2, .heads = 3,
							     .group = 1, .q = NULL, .acc = acc, .m = m,
							     .l = l, .next = with_next ? &next : NULL };
				const size_t row = 64 * 2;

				kva__blocks_begin(&b, &t, row, 5, true);
				for (int32_t tb = t.t0; tb < t.t1; tb += KVA__BLOCK_TOKENS) {
					(void)kva__blocks_next(&b, &t, tb);
					for (int32_t h = 0; h < t.heads; h++) {
						kva__blocks_turn(&b, &t, h);
						if (h + 1 < t.heads)
							check_turn(&b, &t, tb, h + 1);
						else if (tb + KVA__BLOCK_TOKENS < t.t1)
							check_turn(&b, &t, tb + KVA__BLOCK_TOKENS, 0);
						else if (with_next)
							check_turn(&b, &next, next.t0, 0);
						else
							assert_int_equal(b.pf.part, 2);
					}
				}
			}
			cache_free(&c);
		}
	/* a warm tile of one turn with none after it: the tile before asked for
	 * the turn, and the cursor is left with nothing to ask for (not with
	 * what an uninitialized one would hold) */
	{
		struct cache c;
		struct kva__blocks b;
		const struct kva__tile t = { .pages = pages, .t0 = 0, .t1 = 20, .kv_head = 1,
					     .heads = 1, .group = 1, .acc = acc, .m = m, .l = l,
					     .warm = true };
		struct kva__tile tt = t;

		cache_make(&c, KVA_F16, 16, 16, 2, 64, HND, 0);
		tt.kv = &c.kv;
		memset(&b, 0xa5, sizeof(b));
		kva__blocks_begin(&b, &tt, 64 * 2, 5, true);
		assert_int_equal(b.pf.part, 2);
		assert_int_equal(b.pf.left, 0);
		(void)kva__blocks_next(&b, &tt, 0);
		memset(&b.pf, 0xa5, sizeof(b.pf));
		kva__blocks_turn(&b, &tt, 0);
		assert_int_equal(b.pf.part, 2);
		assert_int_equal(b.pf.left, 0);
		assert_int_equal(b.pf.per, 0);
		cache_free(&c);
	}
}

/*
 * The AVX2 tile's step of one head's rows (pf_step) moves only its
 * prefetches: for every step, group shape that takes it (1, and 5 and 7,
 * whose last head does), dtype and head_dim, the same result bit for bit,
 * and the reference's. Steps that do not divide a block (48), one past it
 * and every token, over blocks cut short by the sequences' ends. On every
 * path this CPU has: the others ignore the step, and must.
 */
static void test_every_pf_step_computes_the_same(void **state)
{
	static const enum kva_dtype dts[] = { KVA_F32, KVA_F16, KVA_INT8 };
	static const int32_t dims[] = { 64, 80, 128, 256 };
	static const int32_t groups[] = { 1, 5, 7 };
	static const int32_t steps[] = { 0, 1, 3, 4, 8, 13, 47, 48 };
	static const int32_t lens[] = { 1, 47, 49, 100, 131 };
	const int32_t heads = 2, P = 16, n = 5;

	(void)state;
	for (unsigned i = 0; i < sizeof(dts) / sizeof(dts[0]); i++)
		for (unsigned j = 0; j < sizeof(dims) / sizeof(dims[0]); j++)
			for (unsigned g = 0; g < sizeof(groups) / sizeof(groups[0]); g++) {
				const int32_t qh = heads * groups[g], D = dims[j];
				const size_t nq = (size_t)n * qh * D;
				uint64_t rng = 300 + 100 * i + 10 * j + g;
				struct cache c;
				struct batch b;
				int32_t pages = pages_for(lens, n, P);
				float *q = malloc(sizeof(float) * nq), *out = malloc(sizeof(float) * nq);
				float *first = malloc(sizeof(float) * nq);
				double *ref = malloc(sizeof(double) * nq), rlse[5 * 2 * 7];

				cache_make(&c, dts[i], pages, P, heads, D, HND, 0);
				batch_make(&b, lens, n, P, pages, false, &rng);
				fill(&c, &b, 1.0f, &rng);
				for (size_t e = 0; e < nq; e++)
					q[e] = frand(&rng);
				reference(&c, &b, q, qh, 0.1, ref, rlse);
				for (int k = 0; k < n_isas; k++)
					for (unsigned s = 0; s < sizeof(steps) / sizeof(steps[0]); s++) {
						struct kva_decode_opts o = { .isa = isas[k],
									     .pf_step = steps[s] };
						double w;

						assert_int_equal(kva_decode(&c.kv, &b.pt, q, KVA_F32, qh,
									    0.1f, out, NULL, &o), 0);
						w = worst(out, ref, (size_t)n * qh, D);
						if (!(w <= tolerance(dts[i])))
							fail_msg("%s %s dim %d group %d pf_step %d: error %.3g",
								 kva_isa_name(isas[k]),
								 kva_dtype_name(dts[i]), D, groups[g],
								 steps[s], w);
						if (s == 0)
							memcpy(first, out, sizeof(float) * nq);
						else if (memcmp(out, first, sizeof(float) * nq))
							fail_msg("%s %s dim %d group %d: pf_step %d differs "
								 "from the chosen one's",
								 kva_isa_name(isas[k]),
								 kva_dtype_name(dts[i]), D, groups[g],
								 steps[s]);
					}
				cache_free(&c);
				batch_free(&b);
				free(q);
				free(out);
				free(first);
				free(ref);
			}
}

static void *kept_thread(void *arg)
{
	*(int32_t *)arg = kva_cpu_prefetch_kept();
	return NULL;
}

/*
 * The step chosen for this CPU: 8 where a step's lines are no more than the
 * prefetches the core keeps, else 4; a count in 0..64, the same from every
 * thread once known; bad geometry refused.
 */
static void test_pf_step_follows_the_prefetches_kept(void **state)
{
	pthread_t th[4];
	int32_t got[4], kept;
	bool avx2 = false;

	(void)state;
	for (int i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&th[i], NULL, kept_thread, &got[i]), 0);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
		assert_true(got[i] >= 0 && got[i] <= 64);
	}
	/* a probe that fell in a spell of dropped prefetches leaves 0, tried
	 * again at a later call (10 ms later, then 20 ...): the count may
	 * still come while this runs, and once there it stays */
	kept = kva_cpu_prefetch_kept();
	fprintf(stderr, "  prefetches kept of 64: %d\n", kept);
	assert_true(kept >= 0 && kept <= 64);
	for (int i = 0; i < 4; i++) {
		int32_t again = kva_cpu_prefetch_kept();

		assert_true(again >= 0 && again <= 64);
		assert_true(!kept || again == kept);
		kept = again;
	}
	for (int k = 0; k < n_isas; k++)
		avx2 |= isas[k] == KVA_ISA_AVX2;
	if (!avx2) {
		assert_int_equal(kva_decode_pf_step(KVA_F16, 128, 1), 0);
	} else {
		/* the count each step was chosen with: the same before and after */
		int32_t k0, s16, s32, s1k, s8[64], k1;

		do {
			k0 = kva_cpu_prefetch_kept();
			/* f16, head_dim 128, group 1: 480 lines a turn, 44 a step at 8 */
			s16 = kva_decode_pf_step(KVA_F16, 128, 1);
			/* f32: 864 lines, 79 a step at 8, more than a burst */
			s32 = kva_decode_pf_step(KVA_F32, 128, 1);
			/* f32, head_dim 256: 1632 lines, 96 a step at 8 */
			s1k = kva_decode_pf_step(KVA_F32, 256, 1);
			for (int32_t g = 1; g <= 64; g++)
				s8[g - 1] = kva_decode_pf_step(KVA_INT8, 64, g);
			k1 = kva_cpu_prefetch_kept();
		} while (k0 != k1);
		assert_int_equal(s16, k0 >= 44 ? 8 : 4);
		assert_int_equal(s32, 4);
		assert_int_equal(s1k, 4);
		for (int32_t g = 1; g <= 64; g++) {
			assert_true(s8[g - 1] == 4 || s8[g - 1] == 8);
			assert_true(k0 || s8[g - 1] == 4);
		}
	}
	assert_int_equal(kva_decode_pf_step(KVA_F16, 12, 1), -EINVAL);
	assert_int_equal(kva_decode_pf_step(KVA_F16, 0, 1), -EINVAL);
	assert_int_equal(kva_decode_pf_step(KVA_F16, 1032, 1), -EINVAL);
	assert_int_equal(kva_decode_pf_step(KVA_F16, 128, 0), -EINVAL);
	assert_int_equal(kva_decode_pf_step(KVA_F16, 128, 65), -EINVAL);
	assert_int_equal(kva_decode_pf_step((enum kva_dtype)17, 128, 1), -EINVAL);
}

static void test_large_logits_stay_finite_and_exact(void **state)
{
	static const int32_t lens[] = { 300, 50 };
	/* |q.k| * sm_scale in the hundreds: exp overflows without the running max */
	struct run r = { .dt = KVA_F32, .heads = 2, .group = 4, .dim = 64, .page_size = 16,
			 .lens = lens, .n = 2, .q_amp = 60, .tol = 1e-4 };

	(void)state;
	check_run(&r, 50);
}

/*
 * The same over groups 3 to 16 at head_dim 128 (the AVX-512 tile slices
 * all but 5 and 9-11, with pad heads at 3, 6, 7 and 12-15): logits in the
 * hundreds, so that terms fall below 2^-126 of the largest, where the
 * vector exp2s stop (AVX-512: 0, masked off its scalef, never a denormal;
 * AVX2: clamped), beside the pad heads' lanes at -inf. The reference
 * counts such terms, so that the test cannot quietly stop reaching there.
 */
static void test_large_logits_groups_3_to_16(void **state)
{
	static const int32_t lens[] = { 200, 37 };

	(void)state;
	for (int32_t g = 3; g <= 16; g++) {
		struct run r = { .dt = KVA_F16, .heads = 2, .group = g, .dim = 128, .page_size = 16,
				 .lens = lens, .n = 2, .q_amp = 60, .tol = 1e-4 };

		ref_deep_terms = 0;
		check_run(&r, 70 + (uint64_t)g);
		if (!ref_deep_terms)
			fail_msg("group %d: no term below 2^-126 of its sequence's largest", g);
	}
}

static void test_empty_sequence_gives_zero_and_minus_inf_lse(void **state)
{
	static const int32_t lens[] = { 0, 20, 0 };
	struct run r = { .dt = KVA_F16, .heads = 1, .group = 2, .dim = 64, .page_size = 16,
			 .lens = lens, .n = 3, .q_amp = 1, .tol = 5e-5 };

	(void)state;
	check_run(&r, 60);
}

/* q and out in f16 and bf16: q rounded the same way for the reference */
static void test_half_precision_queries_and_outputs(void **state)
{
	static const enum kva_dtype qts[] = { KVA_F16, KVA_BF16 };
	static const int32_t lens[] = { 50, 16 };
	const int32_t qh = 4, D = 64;
	uint64_t rng = 70;
	struct cache c;
	struct batch b;
	size_t nq = 2 * (size_t)qh * D;
	float *qf = malloc(sizeof(float) * nq), *outf = malloc(sizeof(float) * nq);
	uint16_t *q = malloc(2 * nq), *out = malloc(2 * nq);
	double *ref = malloc(sizeof(double) * nq), rlse[8];

	(void)state;
	cache_make(&c, KVA_F16, 10, 16, 2, D, HND, 0);
	batch_make(&b, lens, 2, 16, 10, false, &rng);
	fill(&c, &b, 1.0f, &rng);
	for (unsigned t = 0; t < 2; t++) {
		for (size_t i = 0; i < nq; i++) {
			float x = frand(&rng);

			q[i] = qts[t] == KVA_F16 ? kva_f32_to_f16(x) : kva_f32_to_bf16(x);
			qf[i] = qts[t] == KVA_F16 ? kva_f16_to_f32(q[i]) : kva_bf16_to_f32(q[i]);
		}
		reference(&c, &b, qf, qh, 0.125, ref, rlse);
		for (int k = 0; k < n_isas; k++) {
			struct kva_decode_opts o = { .isa = isas[k] };

			assert_int_equal(kva_decode(&c.kv, &b.pt, q, qts[t], qh, 0.125f, out, NULL, &o),
					 0);
			for (size_t i = 0; i < nq; i++)
				outf[i] = qts[t] == KVA_F16 ? kva_f16_to_f32(out[i])
							    : kva_bf16_to_f32(out[i]);
			/* output rounding: 2^-11 (f16), 2^-8 (bf16) */
			assert_true(worst(outf, ref, 2 * (size_t)qh, D) <=
				    (qts[t] == KVA_F16 ? 1e-3 : 8e-3));
		}
	}
	cache_free(&c);
	batch_free(&b);
	free(qf);
	free(outf);
	free(q);
	free(out);
	free(ref);
}

/* fp8 and int8: exact against the dequantized values, and within their
 * quantization error of the f32 values that were stored */
static void test_quantized_caches_are_close_to_what_was_stored(void **state)
{
	static const int32_t lens[] = { 200, 31 };
	static const enum kva_dtype dts[] = { KVA_FP8_E4M3, KVA_INT8 };
	const int32_t qh = 8, D = 128, heads = 2;
	uint64_t seed = 80;

	(void)state;
	for (unsigned t = 0; t < 2; t++) {
		struct cache exact, quant;
		struct batch b;
		uint64_t r1 = seed, r2 = seed;
		int32_t pages = pages_for(lens, 2, 16);
		size_t nq = 2 * (size_t)qh * D;
		float *q = malloc(sizeof(float) * nq), *out = malloc(sizeof(float) * nq);
		double *ref = malloc(sizeof(double) * nq), rlse[16];

		cache_make(&exact, KVA_F32, pages, 16, heads, D, HND, 0);
		cache_make(&quant, dts[t], pages, 16, heads, D, HND, 0);
		batch_make(&b, lens, 2, 16, pages, false, &r1);
		r2 = r1; /* the same values below, for both caches */
		fill(&exact, &b, 1.0f, &r1);
		fill(&quant, &b, 1.0f, &r2); /* the same values, quantized */
		for (size_t i = 0; i < nq; i++)
			q[i] = frand(&r1);
		reference(&exact, &b, q, qh, 0.1, ref, rlse);
		for (int k = 0; k < n_isas; k++) {
			struct kva_decode_opts o = { .isa = isas[k] };
			double w;

			assert_int_equal(kva_decode(&quant.kv, &b.pt, q, KVA_F32, qh, 0.1f, out, NULL, &o),
					 0);
			w = worst(out, ref, 2 * (size_t)qh, D);
			/* int8: 1/254 of the range a value; fp8 e4m3: 2^-4 relative */
			if (!(w <= (dts[t] == KVA_INT8 ? 0.02 : 0.08)))
				fail_msg("%s %s: %.3g from the unquantized result", kva_isa_name(isas[k]),
					 kva_dtype_name(dts[t]), w);
		}
		cache_free(&exact);
		cache_free(&quant);
		batch_free(&b);
		free(q);
		free(out);
		free(ref);
		seed++;
	}
}

/*
 * e4m3's two NaNs (0x7f, 0xff) in V reach the output as NaN on every ISA,
 * in their own column of their own KV head's query heads, and nowhere
 * else; groups of 1, 4 (token-major), 5 (head-major) and 8, head_dim 64
 * and 40, with the NaN tokens in the first and the second block of 48.
 */
static void test_fp8_nan_in_v_reaches_only_its_column(void **state)
{
	static const int32_t lens[] = { 70 };
	static const int32_t groups[] = { 1, 4, 5, 8 };
	const int32_t H = 2;

	(void)state;
	/* head_dim 40: column 35 is in the last 8 bytes, which the scan reads
	 * apart from the 32-byte pieces */
	for (unsigned g = 0; g < 2 * sizeof(groups) / sizeof(groups[0]); g++) {
		const int32_t G = groups[g % 4], D = g < 4 ? 64 : 40, qh = H * G;
		uint64_t rng = 40 + g;
		struct cache c;
		struct batch b;
		float *q = malloc(sizeof(float) * (size_t)qh * D), *out = malloc(sizeof(float) * (size_t)qh * D);
		/* token, KV head, column, byte */
		static const int32_t nans[2][4] = { { 20, 1, 5, 0x7f }, { 60, 0, 35, 0xff } };

		cache_make(&c, KVA_FP8_E4M3, 8, 16, H, D, HND, 0);
		batch_make(&b, lens, 1, 16, 8, false, &rng);
		fill(&c, &b, 1.0f, &rng);
		for (int i = 0; i < 2; i++) {
			const int32_t t = nans[i][0];
			int64_t e = kva_kv_index(c.kv.page_stride, c.kv.token_stride, c.kv.head_stride,
						 b.indices[t / 16], t % 16, nans[i][1]) + nans[i][2];

			((uint8_t *)c.v)[e] = (uint8_t)nans[i][3];
		}
		for (int i = 0; i < qh * D; i++)
			q[i] = frand(&rng);
		for (int k = 0; k < n_isas; k++) {
			struct kva_decode_opts o = { .isa = isas[k] };

			if (!isa_takes(isas[k], D))
				continue;
			assert_int_equal(kva_decode(&c.kv, &b.pt, q, KVA_F32, qh, 0.125f, out, NULL, &o), 0);
			for (int32_t h = 0; h < qh; h++)
				for (int32_t d = 0; d < D; d++) {
					const bool nan = (h / G == 1 && d == 5) || (h / G == 0 && d == 35);

					if (nan != (bool)isnan(out[h * D + d]))
						fail_msg("isa %d group %d head_dim %d head %d column %d: %g",
							 (int)isas[k], G, D, h, d, out[h * D + d]);
				}
		}
		cache_free(&c);
		batch_free(&b);
		free(q);
		free(out);
	}
}

/*
 * An e4m3 NaN in K is a NaN on every ISA, as one in an f32 cache is. The
 * AVX2 tile reads fp8's NaNs as finite values and marks the scores they
 * reach apart (tile_avx2.c, fp8_nan_scores): the same cache in f32, with
 * NaNs in the same places, must decode to the same output on each ISA,
 * whatever that ISA makes of a NaN score.
 */
static void test_fp8_nan_in_k_is_a_nan_as_in_f32(void **state)
{
	static const int32_t lens[] = { 70 };
	static const int32_t groups[] = { 1, 4, 5, 8 };
	const int32_t D = 64, H = 2, P = 16, pages = 8;

	(void)state;
	for (unsigned g = 0; g < sizeof(groups) / sizeof(groups[0]); g++) {
		const int32_t G = groups[g], qh = H * G;
		uint64_t rng = 50 + g;
		struct cache c8, c32;
		struct batch b;
		float *q = malloc(sizeof(float) * (size_t)qh * D);
		float *o8 = malloc(sizeof(float) * (size_t)qh * D), *o32 = malloc(sizeof(float) * (size_t)qh * D);
		/* token, KV head, column, byte */
		static const int32_t nans[2][4] = { { 20, 1, 3, 0x7f }, { 60, 0, 40, 0xff } };

		cache_make(&c8, KVA_FP8_E4M3, pages, P, H, D, HND, 0);
		cache_make(&c32, KVA_F32, pages, P, H, D, HND, 0);
		batch_make(&b, lens, 1, P, pages, false, &rng);
		fill(&c8, &b, 1.0f, &rng);
		for (int i = 0; i < 2; i++) {
			const int32_t t = nans[i][0];
			int64_t e = kva_kv_index(c8.kv.page_stride, c8.kv.token_stride, c8.kv.head_stride,
						 b.indices[t / P], t % P, nans[i][1]) + nans[i][2];

			((uint8_t *)c8.k)[e] = (uint8_t)nans[i][3];
		}
		/* the same values in f32, the NaNs too (kva_fp8_to_f32 makes them NaN) */
		for (int32_t pg = 0; pg < pages; pg++)
			for (int32_t h = 0; h < H; h++)
				for (int32_t t = 0; t < P; t++)
					for (int32_t d = 0; d < D; d++) {
						int64_t e = kva_kv_index(c8.kv.page_stride, c8.kv.token_stride,
									 c8.kv.head_stride, pg, t, h) + d;

						((float *)c32.k)[e] = (float)elem(&c8, c8.k, c8.k_scale, pg, t, h, d);
						((float *)c32.v)[e] = (float)elem(&c8, c8.v, c8.v_scale, pg, t, h, d);
					}
		for (int i = 0; i < qh * D; i++)
			q[i] = frand(&rng);
		for (int k = 0; k < n_isas; k++) {
			struct kva_decode_opts o = { .isa = isas[k] };

			assert_int_equal(kva_decode(&c8.kv, &b.pt, q, KVA_F32, qh, 0.125f, o8, NULL, &o), 0);
			assert_int_equal(kva_decode(&c32.kv, &b.pt, q, KVA_F32, qh, 0.125f, o32, NULL, &o), 0);
			for (int32_t i = 0; i < qh * D; i++)
				if (isnan(o8[i]) != isnan(o32[i]) ||
				    (!isnan(o8[i]) && !(fabsf(o8[i] - o32[i]) <= 1e-5f)))
					fail_msg("isa %d group %d: out[%d] fp8 %g, f32 %g", (int)isas[k], G,
						 i, o8[i], o32[i]);
		}
		cache_free(&c8);
		cache_free(&c32);
		batch_free(&b);
		free(q);
		free(o8);
		free(o32);
	}
}

static void test_fp8_per_tensor_scale(void **state)
{
	static const int32_t lens[] = { 40 };
	uint64_t rng = 90;
	struct cache c;
	struct batch b;
	float q[4 * 64], out[4 * 64];
	double ref[4 * 64], rlse[4];

	(void)state;
	cache_make(&c, KVA_FP8_E4M3, 4, 16, 2, 64, HND, 0);
	c.kv.flags = KVA_KV_SCALE_PER_TENSOR;
	c.k_scale[0] = 0.02f;
	c.v_scale[0] = 0.03f;
	batch_make(&b, lens, 1, 16, 4, false, &rng);
	fill(&c, &b, 1.0f, &rng);
	for (int i = 0; i < 4 * 64; i++)
		q[i] = frand(&rng);
	reference(&c, &b, q, 4, 0.125, ref, rlse);
	for (int k = 0; k < n_isas; k++) {
		struct kva_decode_opts o = { .isa = isas[k] };

		assert_int_equal(kva_decode(&c.kv, &b.pt, q, KVA_F32, 4, 0.125f, out, NULL, &o), 0);
		assert_true(worst(out, ref, 4, 64) <= 5e-5);
	}
	cache_free(&c);
	batch_free(&b);
}

/* ------------------------------------------------------------- store */

static void test_store_round_trips_and_skips_negative_slots(void **state)
{
	static const enum kva_dtype dts[] = { KVA_F32, KVA_F16, KVA_BF16, KVA_FP8_E4M3, KVA_INT8 };
	const int32_t heads = 2, D = 64, n = 6;
	int64_t slots[6] = { 5, -1, 17, 0, -7, 31 };
	uint64_t rng = 11;

	(void)state;
	for (unsigned t = 0; t < 5; t++) {
		struct cache c;
		float k[6 * 2 * 64], v[6 * 2 * 64];
		char *before;

		cache_make(&c, dts[t], 2, 16, heads, D, NHD, 8);
		for (int i = 0; i < n * heads * D; i++) {
			k[i] = 3 * frand(&rng);
			v[i] = 3 * frand(&rng);
		}
		before = malloc(c.bytes);
		memcpy(before, c.k, c.bytes);
		assert_int_equal(kva_store_kv(&c.kv, k, v, KVA_F32, slots, n), 0);
		for (int i = 0; i < n; i++) {
			if (slots[i] < 0)
				continue;
			for (int h = 0; h < heads; h++)
				for (int d = 0; d < D; d++) {
					int32_t page = (int32_t)(slots[i] / 16), off = (int32_t)(slots[i] % 16);
					double got = elem(&c, c.k, c.k_scale, page, off, h, d);
					double want = k[(i * heads + h) * D + d], bound;

					switch (dts[t]) {
					case KVA_F32: bound = 0; break;
					case KVA_F16: bound = fabs(want) * 0x1p-11; break;
					case KVA_BF16: bound = fabs(want) * 0x1p-8; break;
					case KVA_FP8_E4M3: bound = fabs(want) * 0x1p-4 + 0.01 * 0x1p-9; break;
					default: bound = 3.0 / 254 + 1e-6; break;
					}
					if (!(fabs(got - want) <= bound))
						fail_msg("%s: slot %lld head %d dim %d: stored %g, read %g",
							 kva_dtype_name(dts[t]), (long long)slots[i], h, d,
							 want, got);
				}
		}
		/* nothing else in the cache changed: the skipped slots and padding */
		{
			size_t changed = 0;

			for (size_t i = 0; i < c.bytes; i++)
				changed += before[i] != ((char *)c.k)[i];
			assert_true(changed <= 4u * (size_t)heads * D * kva_dtype_size(dts[t]));
		}
		free(before);
		cache_free(&c);
	}
}

static void test_store_checks_every_slot_before_writing(void **state)
{
	struct cache c;
	float x[2 * 64] = { 1 };
	int64_t slots[2] = { 3, 32 }; /* 32 is past 2 pages of 16 */
	char *before;

	(void)state;
	cache_make(&c, KVA_F16, 2, 16, 1, 64, HND, 0);
	before = malloc(c.bytes);
	memcpy(before, c.k, c.bytes);
	assert_int_equal(kva_store_kv(&c.kv, x, x, KVA_F32, slots, 2), -EINVAL);
	assert_memory_equal(before, c.k, c.bytes); /* slot 3 was not written either */
	assert_int_equal(kva_store_kv(&c.kv, x, x, KVA_INT8, slots, 1), -EINVAL);
	assert_int_equal(kva_store_kv(&c.kv, NULL, x, KVA_F32, slots, 1), -EINVAL);
	assert_int_equal(kva_store_kv(&c.kv, x, x, KVA_F32, slots, -1), -EINVAL);
	assert_int_equal(kva_store_kv(&c.kv, x, x, KVA_F32, slots, 0), 0);
	free(before);
	cache_free(&c);
}

/* ------------------------------------------------------- bad arguments */

static void test_malformed_decode_arguments_are_einval(void **state)
{
	static const int32_t lens[] = { 20, 5 };
	uint64_t rng = 3;
	struct cache c;
	struct batch b;
	float q[2 * 4 * 64], out[2 * 4 * 64];
	struct kva_kv_desc kv;
	struct kva_page_table pt;
	int32_t bad_indptr[3], bad_last[2], bad_idx[3];

	(void)state;
	cache_make(&c, KVA_F16, 8, 16, 2, 64, HND, 0);
	batch_make(&b, lens, 2, 16, 8, false, &rng);
	fill(&c, &b, 1, &rng);
	memset(q, 0, sizeof(q));
#define EXPECT(kvp, ptp, qh, scale) \
	assert_int_equal(kva_decode(kvp, ptp, q, KVA_F32, qh, scale, out, NULL, NULL), -EINVAL)
	EXPECT(NULL, &b.pt, 4, 1.0f);
	EXPECT(&c.kv, NULL, 4, 1.0f);
	EXPECT(&c.kv, &b.pt, 3, 1.0f);          /* not a multiple of the KV heads */
	EXPECT(&c.kv, &b.pt, 2 * 65, 1.0f);     /* 65 query heads a KV head */
	EXPECT(&c.kv, &b.pt, 4, 0.0f);
	EXPECT(&c.kv, &b.pt, 4, NAN);
	kv = c.kv, kv.head_dim = 0;
	EXPECT(&kv, &b.pt, 4, 1.0f);
	kv = c.kv, kv.dtype = (enum kva_dtype)17;
	EXPECT(&kv, &b.pt, 4, 1.0f);
	kv = c.kv, kv.token_stride = 10;         /* rows would overlap */
	EXPECT(&kv, &b.pt, 4, 1.0f);
	kv = c.kv, kv.page_size = 8;             /* disagrees with the table */
	EXPECT(&kv, &b.pt, 4, 1.0f);
	kv = c.kv, kv.dtype = KVA_INT8, kv.k_scale = NULL;
	EXPECT(&kv, &b.pt, 4, 1.0f);
	kv = c.kv, kv.num_pages = 1;             /* ids past it */
	EXPECT(&kv, &b.pt, 4, 1.0f);
	pt = b.pt;
	memcpy(bad_indptr, b.indptr, sizeof(bad_indptr));
	bad_indptr[1] = bad_indptr[2] + 1;       /* decreasing */
	pt.indptr = bad_indptr;
	EXPECT(&c.kv, &pt, 4, 1.0f);
	bad_indptr[0] = 1;
	EXPECT(&c.kv, &pt, 4, 1.0f);
	pt = b.pt;
	memcpy(bad_last, b.last, sizeof(bad_last));
	bad_last[0] = 17;
	pt.last_page_len = bad_last;
	EXPECT(&c.kv, &pt, 4, 1.0f);
	bad_last[0] = 0;
	EXPECT(&c.kv, &pt, 4, 1.0f);
	pt = b.pt;
	memcpy(bad_idx, b.indices, sizeof(bad_idx));
	bad_idx[2] = -1;
	pt.indices = bad_idx;
	EXPECT(&c.kv, &pt, 4, 1.0f);
	bad_idx[2] = 8;
	EXPECT(&c.kv, &pt, 4, 1.0f);
	assert_non_null(strstr(kva_errmsg(), "page id 8"));
	assert_int_equal(kva_decode(&c.kv, &b.pt, q, KVA_FP8_E4M3, 4, 1.0f, out, NULL, NULL),
			 -EINVAL);
	{
		struct kva_decode_opts o = { .threads = -1 };

		assert_int_equal(kva_decode(&c.kv, &b.pt, q, KVA_F32, 4, 1.0f, out, NULL, &o),
				 -EINVAL);
		o = (struct kva_decode_opts){ .pf_step = -1 };
		assert_int_equal(kva_decode(&c.kv, &b.pt, q, KVA_F32, 4, 1.0f, out, NULL, &o),
				 -EINVAL);
		o.pf_step = KVA__BLOCK_TOKENS + 1;
		assert_int_equal(kva_decode(&c.kv, &b.pt, q, KVA_F32, 4, 1.0f, out, NULL, &o),
				 -EINVAL);
		assert_non_null(strstr(kva_errmsg(), "pf_step"));
	}
#undef EXPECT
	cache_free(&c);
	batch_free(&b);
}

/* ---------------------------------------------------------- page tables */

static void test_block_table_to_csr_reads_only_used_entries(void **state)
{
	/* vLLM's padded table: 3 rows of 5, padding holds invalid ids */
	const int32_t table[15] = { 4, 9, -77, -77, -77,  2, 0, 1, 3, -77,  -77, -77, -77, -77, -77 };
	const int32_t lens[3] = { 20, 49, 0 };
	int32_t indptr[4], indices[8], last[3];

	(void)state;
	assert_int_equal(kva_page_table_from_block_table(table, 5, lens, 3, 16, indptr, indices, last),
			 6);
	assert_int_equal(indptr[0], 0);
	assert_int_equal(indptr[1], 2);
	assert_int_equal(indptr[2], 6);
	assert_int_equal(indptr[3], 6);
	assert_int_equal(indices[0], 4);
	assert_int_equal(indices[1], 9);
	assert_int_equal(indices[5], 3);
	assert_int_equal(last[0], 4);
	assert_int_equal(last[1], 1);
	assert_int_equal(last[2], 0);
	{
		const int32_t too_long[1] = { 100 };

		assert_int_equal(kva_page_table_from_block_table(table, 5, too_long, 1, 16, indptr,
								 indices, last), -EINVAL);
	}
	assert_int_equal(kva_page_table_from_block_table(table, 5, lens, -1, 16, indptr, indices,
							 last), -EINVAL);
}

/* ------------------------------------------------------ number formats */

static void test_half_and_bfloat_round_trip_exhaustively(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = kva_f16_to_f32((uint16_t)h), g = kva_bf16_to_f32((uint16_t)h);

		if (f == f)
			assert_int_equal(kva_f32_to_f16(f), h);
		else
			assert_true(kva_f32_to_f16(f) != kva_f32_to_f16(f) ||
				    (kva_f32_to_f16(f) & 0x7c00) == 0x7c00);
		if (g == g)
			assert_int_equal(kva_f32_to_bf16(g), h);
	}
	/* ties round to even, overflow to infinity, underflow to zero */
	assert_int_equal(kva_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
	assert_int_equal(kva_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
	assert_int_equal(kva_f32_to_f16(65520.0f), 0x7c00);
	assert_int_equal(kva_f32_to_f16(0x1p-26f), 0);
	assert_int_equal(kva_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
}

/* half to float case by case, as the format is specified: the reference
 * the branch-free kva_f16_to_f32 and kva_fp8_to_f32 are checked against */
static float ref_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
	float f;

	if (exp == 0x1f)
		return kva_bits_f32(sign | 0x7f800000u | (mant << 13));
	if (exp == 0) { /* zero or subnormal: mant * 2^-24, exactly */
		f = (float)ldexp((double)mant, -24);
		return sign ? -f : f;
	}
	return kva_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

static float ref_fp8_to_f32(uint8_t x)
{
	if ((x & 0x7fu) == 0x7fu)
		return kva_bits_f32(0x7fc00000u | ((uint32_t)(x & 0x80u) << 24));
	return ref_f16_to_f32((uint16_t)(((x & 0x7fu) << 7) | ((x & 0x80u) << 8))) * 256.0f;
}

/*
 * decode_math.h's branch-free conversions against the reference, bit for
 * bit over every input, in the default floating-point mode and (on x86)
 * with flush-to-zero and denormals-are-zero set, as a caller's framework
 * may leave them: neither may take a denormal float as an operand.
 */
static void test_branch_free_conversions_are_exact(void **state)
{
	(void)state;
	for (int mode = 0; mode < 2; mode++) {
		uint32_t bad = UINT32_MAX, a = 0, b = 0;
#if defined(__x86_64__) || defined(__i386__)
		const unsigned csr = _mm_getcsr();

		if (mode)
			_mm_setcsr(csr | 0x8040u); /* FTZ | DAZ */
#else
		if (mode)
			break;
#endif
		/* the first difference, reported once the mode is restored */
		for (uint32_t i = 0; i < 65536 && bad == UINT32_MAX; i++) {
			volatile uint16_t h = (uint16_t)i; /* computed here, not folded */

			a = kva_f32_bits(ref_f16_to_f32(h));
			b = kva_f32_bits(kva_f16_to_f32(h));
			if (a != b)
				bad = i;
		}
		for (uint32_t i = 0; i < 256 && bad == UINT32_MAX; i++) {
			volatile uint8_t x = (uint8_t)i;

			a = kva_f32_bits(ref_fp8_to_f32(x));
			b = kva_f32_bits(kva_fp8_to_f32(x));
			if (a != b)
				bad = 0x10000u + i;
		}
#if defined(__x86_64__) || defined(__i386__)
		_mm_setcsr(csr);
#endif
		if (bad != UINT32_MAX)
			fail_msg("%s %#x: reference %#010x, kva %#010x (mode %d)",
				 bad < 0x10000u ? "f16" : "fp8", bad & 0xffffu, a, b, mode);
	}
}

/* the fp8 value nearest to x, ties to even, by brute force over all 254 */
static uint8_t fp8_nearest(double x)
{
	uint8_t best = 0;
	double bd = INFINITY;

	if (fabs(x) >= 448)
		return (uint8_t)(x < 0 ? 0xfe : 0x7e);
	for (unsigned c = 0; c < 256; c++) {
		double v = kva_fp8_to_f32((uint8_t)c), d = fabs(v - x);

		if (v != v || (v == 0 && (c & 0x80) != (x < 0 ? 0x80u : 0u)))
			continue;
		if (d < bd || (d == bd && !(c & 1))) {
			bd = d;
			best = (uint8_t)c;
		}
	}
	return best;
}

static void test_fp8_encodes_to_the_nearest_value(void **state)
{
	uint64_t rng = 12;

	(void)state;
	for (unsigned c = 0; c < 256; c++) {
		float f = kva_fp8_to_f32((uint8_t)c);

		if ((c & 0x7f) == 0x7f) {
			assert_true(f != f);
			continue;
		}
		assert_int_equal(kva_f32_to_fp8(f), c); /* every value round trips */
	}
	assert_true(kva_fp8_to_f32(0x7e) == 448.0f);
	assert_true(kva_fp8_to_f32(0x01) == 0x1p-9f);
	for (int i = 0; i < 20000; i++) {
		float x = frand(&rng) * (i % 2 ? 500.0f : 0.03f);

		if (kva_f32_to_fp8(x) != fp8_nearest(x))
			fail_msg("fp8 of %a: %#x, nearest %#x", x, kva_f32_to_fp8(x), fp8_nearest(x));
	}
	assert_int_equal(kva_f32_to_fp8(1e9f), 0x7e);
	assert_int_equal(kva_f32_to_fp8(-1e9f), 0xfe);
	assert_int_equal(kva_f32_to_fp8(NAN) & 0x7f, 0x7f);
}

/* ------------------------------------------------------ over an arena */

static void test_decode_over_arena_blocks_in_both_layouts(void **state)
{
	static const enum kva_layout layouts[] = { KVA_LAYOUT_BLOCK_MAJOR, KVA_LAYOUT_LAYER_MAJOR };
	static const enum kva_dtype dts[] = { KVA_F16, KVA_INT8 };

	(void)state;
	for (unsigned l = 0; l < 2; l++)
		for (unsigned t = 0; t < 2; t++) {
			struct kva_geometry g = { .block_tokens = 16, .layers = 3, .kv_heads = 2,
						  .head_dim = 64, .dtype = dts[t],
						  .layout = layouts[l] };
			struct kva_arena_opts o = { .blocks = 64, .numa_node = -1 };
			struct kva_arena *a;
			struct kva_worker *w;
			uint32_t ids[10];
			int32_t indptr[3] = { 0, 6, 10 }, indices[10], last[2] = { 7, 16 };
			struct kva_page_table pt = { 2, 16, indptr, indices, last };
			struct kva_kv_desc kv;
			struct cache shadow;
			uint64_t rng = 13;
			float q[2 * 4 * 64], out[2 * 4 * 64], k[2 * 64], v[2 * 64];
			double ref[2 * 4 * 64], rlse[8];
			struct batch b = { .n = 2, .page_size = 16, .indptr = indptr,
					   .indices = indices, .last = last };
			int32_t lens[2] = { 87, 64 };

			assert_int_equal(kva_arena_create(&g, &o, &a), 0);
			assert_int_equal(kva_worker_join(a, "kernels", &w), 0);
			assert_int_equal(kva_alloc(w, 10, ids), 0);
			for (int i = 0; i < 10; i++)
				indices[i] = (int32_t)ids[9 - i]; /* a permuted table */
			b.lens = lens;
			assert_int_equal(kva_kv_desc_for_arena(a, 1, &kv), 0);
			assert_int_equal(kva_kv_desc_for_arena(a, 3, &kv), -EINVAL);
			assert_int_equal(kva_kv_desc_for_arena(a, 1, &kv), 0);
			/* write layer 1 of every used block through the descriptor */
			for (int i = 0; i < 2; i++)
				for (int32_t tk = 0; tk < lens[i]; tk++) {
					int64_t slot = (int64_t)indices[indptr[i] + tk / 16] * 16 + tk % 16;

					for (int j = 0; j < 2 * 64; j++) {
						k[j] = frand(&rng);
						v[j] = frand(&rng);
					}
					assert_int_equal(kva_store_kv(&kv, k, v, KVA_F32, &slot, 1), 0);
				}
			for (int i = 0; i < 2 * 4 * 64; i++)
				q[i] = frand(&rng);
			shadow = (struct cache){ .kv = kv, .k_scale = (float *)kv.k_scale,
						 .v_scale = (float *)kv.v_scale };
			shadow.k = (void *)kv.k;
			shadow.v = (void *)kv.v;
			reference(&shadow, &b, q, 4, 0.125, ref, rlse);
			for (int k2 = 0; k2 < n_isas; k2++) {
				struct kva_decode_opts dopts = { .isa = isas[k2] };

				assert_int_equal(kva_decode(&kv, &pt, q, KVA_F32, 4, 0.125f, out, NULL,
							    &dopts), 0);
				assert_true(worst(out, ref, 8, 64) <= 5e-5);
			}
			assert_int_equal(kva_free(w, ids, 10), 0);
			kva_worker_leave(w);
			kva_arena_close(a);
		}
}

/*
 * A child forked while a thread of its parent probes the prefetches its
 * core keeps: the probe's flag is set in the child, where no thread will
 * clear it, unless the library clears it at the fork. Run in a fresh
 * process (KVA_TEST_FORK_PROBE, below), where nothing has probed yet: a
 * thread starts the first probe (about a millisecond), and the main thread
 * forks @us microseconds later. The child then calls for up to 3 s, and
 * must count or at least probe: a call that probes takes a few hundred
 * microseconds or more (a MiB mapped and written, 16 rounds of 5 us
 * waits), one that does not returns at once. Counting alone would not do:
 * under the load of the whole suite every probe of 3 s may fall in a spell
 * (they come with memory traffic), and the next is tried 10, 20, 40 ... ms
 * later. Exit status: 0 the child counted or probed, or the parent never
 * counted (this CPU cannot tell: nothing to compare); 1 the parent
 * counted and the child did neither; 2 a failed call.
 */
static int64_t mono_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int32_t kept_within(int ms)
{
	int32_t v = 0;

	for (int i = 0; i < ms && (v = kva_cpu_prefetch_kept()) == 0; i++)
		usleep(1000);
	return v;
}

/* the child's part: 0 once a call counted or probed (took 100 us or more) */
static int child_counts_or_probes(void)
{
	for (int i = 0; i < 3000; i++) {
		int64_t t = mono_ns();

		if (kva_cpu_prefetch_kept() > 0 || mono_ns() - t >= 100000)
			return 0;
		usleep(1000);
	}
	return 1;
}

static int fork_during_probe(long us)
{
	static int32_t got; /* the thread's, unread: the calls below wait */
	pthread_attr_t attr;
	int32_t parent;
	pthread_t th;
	int64_t t0;
	int status;
	pid_t pid;

	/* detached: a child forked after the thread ended would otherwise
	 * hold a thread nobody joins (ThreadSanitizer reports it) */
	if (pthread_attr_init(&attr) ||
	    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) ||
	    pthread_create(&th, &attr, kept_thread, &got))
		return 2;
	pthread_attr_destroy(&attr);
	t0 = mono_ns();
	while (mono_ns() - t0 < us * 1000)
		;
	pid = fork();
	if (pid == 0)
		_exit(child_counts_or_probes());
	if (pid < 0)
		return 2;
	parent = kept_within(3000);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return 2;
	fprintf(stderr, "  fork %ld us into the probe: parent %d, child %s\n", us, parent,
		WEXITSTATUS(status) ? "neither counted nor probed" : "counted or probed");
	return parent > 0 ? WEXITSTATUS(status) : 0;
}

/* forks at times before, during and after the first probe (0 to 2.4 ms,
 * every 100 us: where a probe falls varies from process to process), each
 * from a fresh process of this program */
static void test_a_child_forked_during_a_probe_probes_again(void **state)
{
	extern char **environ;
	size_t n = 0;
	char **envp;

	(void)state;
	while (environ[n])
		n++;
	envp = calloc(n + 2, sizeof(*envp));
	assert_non_null(envp);
	memcpy(envp, environ, n * sizeof(*envp));
	for (int us = 0; us <= 2400; us += 100) {
		char var[64], *const argv[] = { "test_kernels", NULL };
		int status;
		pid_t pid;

		snprintf(var, sizeof(var), "KVA_TEST_FORK_PROBE=%d", us);
		envp[n] = var;
		assert_int_equal(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, envp), 0);
		assert_int_equal(waitpid(pid, &status, 0), pid);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
	free(envp);
}

/*
 * The tile each path runs (kva_decode_tile), as kva_decode picks it: on a
 * core that splits 512-bit operations in two (forced here either way), the
 * AVX-512 path's sliced groups of 3 to 8 (3, 4, 6, 7, 8; head_dim up to
 * 256) run the AVX2 tile and every other group and head_dim its own; on
 * any other core the AVX-512 path runs its own tile. AUTO resolves as
 * kva_decode does; an ISA the CPU lacks, a head_dim the path refuses and
 * out-of-range arguments are NULL with a message.
 */
static void test_decode_tile_names_the_tile_that_runs(void **state)
{
	static const int32_t dims[] = { 16, 64, 96, 128, 256, 272 };

	(void)state;
	assert_string_equal(kva_decode_tile(KVA_ISA_SCALAR, 12, 8), "scalar");
	assert_string_equal(kva_decode_tile(KVA_ISA_AUTO, 12, 8), "scalar");
	assert_null(kva_decode_tile(KVA_ISA_SCALAR, 0, 8));
	assert_null(kva_decode_tile(KVA_ISA_SCALAR, 1025, 8));
	assert_null(kva_decode_tile(KVA_ISA_SCALAR, 128, 0));
	assert_null(kva_decode_tile(KVA_ISA_SCALAR, 128, 65));
	assert_null(kva_decode_tile((enum kva_isa)7, 128, 8));
	assert_non_null(strstr(kva_errmsg(), "group"));
	if (kva_isa_best() < KVA_ISA_AVX2) {
		assert_null(kva_decode_tile(KVA_ISA_AVX2, 128, 8));
		return;
	}
	assert_string_equal(kva_decode_tile(KVA_ISA_AVX2, 128, 8), "avx2");
	assert_string_equal(kva_decode_tile(KVA_ISA_AVX2, 40, 16), "avx2");
	assert_null(kva_decode_tile(KVA_ISA_AVX2, 12, 8));
	if (kva_isa_best() < KVA_ISA_AVX512) {
		assert_null(kva_decode_tile(KVA_ISA_AVX512, 128, 8));
		assert_string_equal(kva_decode_tile(KVA_ISA_AUTO, 128, 8), "avx2");
		return;
	}
	assert_null(kva_decode_tile(KVA_ISA_AVX512, 40, 8)); /* not a multiple of 16 */
	assert_string_equal(kva_decode_tile(KVA_ISA_AUTO, 40, 8), "avx2");
	for (int split = 0; split < 2; split++) {
		kva__avx512_split_force(split);
		for (unsigned j = 0; j < sizeof(dims) / sizeof(dims[0]); j++)
			for (int32_t g = 1; g <= KVA__MAX_GROUP; g++) {
				const bool avx2 = split && dims[j] <= 256 &&
						  (g == 3 || g == 4 || (g >= 6 && g <= 8));
				const char *want = avx2 ? "avx2" : "avx512";

				if (strcmp(kva_decode_tile(KVA_ISA_AVX512, dims[j], g), want) ||
				    strcmp(kva_decode_tile(KVA_ISA_AUTO, dims[j], g), want))
					fail_msg("split %d head_dim %d group %d: %s, %s (want %s)", split,
						 dims[j], g, kva_decode_tile(KVA_ISA_AVX512, dims[j], g),
						 kva_decode_tile(KVA_ISA_AUTO, dims[j], g), want);
			}
	}
	kva__avx512_split_force(-1);
}

static int setup(void **state)
{
	(void)state;
	n_isas = 0;
	for (int isa = KVA_ISA_SCALAR; isa <= KVA_ISA_AVX512; isa++)
		if ((int)kva_isa_best() >= isa)
			isas[n_isas++] = (enum kva_isa)isa;
	fprintf(stderr, "  ISA paths tested:");
	for (int k = 0; k < n_isas; k++)
		fprintf(stderr, " %s", kva_isa_name(isas[k]));
	fprintf(stderr, "\n");
	return 0;
}

/* the choice @ask makes on this CPU forced the other way; the CPU's */
static bool flip(bool (*ask)(void), void (*force)(int))
{
	bool cpu;

	force(-1);
	cpu = ask();
	force(!cpu);
	return cpu;
}

/* the AVX-512 path's groups 3 to 8 on one tile or the other by the core
 * (kva__avx512_split): a choice with no two-ways test of its own (the
 * decode suites run with it either way are its test) */
static const struct choice choice_split = {
	.isa = KVA_ISA_AVX512, .ask = kva__avx512_split, .force = kva__avx512_split_force,
	.ways = { "a core that does not split 512-bit operations", "a core that splits them" },
	.what = "AVX-512 path's tiles as on",
};

/* the choice main() runs the decode suites with the other way */
static const struct choice *other_way;

static int setup_other_way(void **state)
{
	bool cpu = flip(other_way->ask, other_way->force);

	fprintf(stderr, "  %s %s (this CPU: %s)\n", other_way->what, other_way->ways[!cpu],
		other_way->ways[cpu]);
	return setup(state);
}

/* every choice the CPU's again */
static int teardown_forces(void **state)
{
	(void)state;
	kva__avx512_split_force(-1);
	kva__sl_dot_force(-1);
	kva__avx2_cols_force(-1);
	kva__avx512_subgroups_force(-1);
	kva__pf_t0_force(-1);
	return 0;
}

int main(void)
{
	const char *fork_probe = getenv("KVA_TEST_FORK_PROBE");

	if (fork_probe) /* test_a_child_forked_during_a_probe_probes_again's process */
		return fork_during_probe(atol(fork_probe));

	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_dtype_and_head_dim_matches_the_reference),
		cmocka_unit_test(test_token_major_groups_every_dtype),
		cmocka_unit_test(test_gqa_and_mqa_groups),
		cmocka_unit_test(test_every_group_remainder_every_dtype_and_head_dim),
		cmocka_unit_test(test_five_head_output_parts_every_dtype),
		cmocka_unit_test(test_page_sizes_and_lengths_around_boundaries),
		cmocka_unit_test(test_split_boundaries_and_split_invariance),
		cmocka_unit_test(test_thread_count_changes_nothing),
		cmocka_unit_test(test_head_spans_change_nothing),
		cmocka_unit_test(test_prefetch_hint_changes_nothing),
		cmocka_unit_test(test_cursor_hint_changes_nothing),
		cmocka_unit_test(test_cursor_t0_rule),
		cmocka_unit_test(test_groups_3_and_4_score_the_same_either_way),
		cmocka_unit_test(test_one_head_scores_the_same_either_way),
		cmocka_unit_test(test_groups_without_a_sliced_shape_the_same_either_way),
		cmocka_unit_test(test_long_context_past_16k),
		cmocka_unit_test(test_strides_nhd_hnd_and_padding),
		cmocka_unit_test(test_prefetch_cursor_reads_the_block_in_address_order),
		cmocka_unit_test(test_cursor_asks_with_the_tiles_hint),
		cmocka_unit_test(test_pfq_asks_for_the_lines_the_steps_do),
		cmocka_unit_test(test_turn_cursor_reads_the_next_turn),
		cmocka_unit_test(test_every_pf_step_computes_the_same),
		cmocka_unit_test(test_pf_step_follows_the_prefetches_kept),
		cmocka_unit_test(test_a_child_forked_during_a_probe_probes_again),
		cmocka_unit_test(test_large_logits_stay_finite_and_exact),
		cmocka_unit_test(test_large_logits_groups_3_to_16),
		cmocka_unit_test(test_empty_sequence_gives_zero_and_minus_inf_lse),
		cmocka_unit_test(test_half_precision_queries_and_outputs),
		cmocka_unit_test(test_quantized_caches_are_close_to_what_was_stored),
		cmocka_unit_test(test_fp8_nan_in_v_reaches_only_its_column),
		cmocka_unit_test(test_fp8_nan_in_k_is_a_nan_as_in_f32),
		cmocka_unit_test(test_fp8_per_tensor_scale),
		cmocka_unit_test(test_store_round_trips_and_skips_negative_slots),
		cmocka_unit_test(test_store_checks_every_slot_before_writing),
		cmocka_unit_test(test_malformed_decode_arguments_are_einval),
		cmocka_unit_test(test_block_table_to_csr_reads_only_used_entries),
		cmocka_unit_test(test_half_and_bfloat_round_trip_exhaustively),
		cmocka_unit_test(test_branch_free_conversions_are_exact),
		cmocka_unit_test(test_fp8_encodes_to_the_nearest_value),
		cmocka_unit_test(test_decode_over_arena_blocks_in_both_layouts),
		cmocka_unit_test(test_decode_tile_names_the_tile_that_runs),
	};

	int failed = cmocka_run_group_tests_name("kernels", tests, setup, NULL);

	/*
	 * Choices the library makes by the CPU, each checked the other way
	 * too, so that every tile's shapes meet the reference on any machine
	 * with the path: the decode tests again (the other suites do not
	 * depend on them).
	 */
	const struct CMUnitTest other[] = {
		cmocka_unit_test(test_every_dtype_and_head_dim_matches_the_reference),
		cmocka_unit_test(test_token_major_groups_every_dtype),
		cmocka_unit_test(test_gqa_and_mqa_groups),
		cmocka_unit_test(test_every_group_remainder_every_dtype_and_head_dim),
		cmocka_unit_test(test_five_head_output_parts_every_dtype),
		cmocka_unit_test(test_page_sizes_and_lengths_around_boundaries),
		cmocka_unit_test(test_split_boundaries_and_split_invariance),
		cmocka_unit_test(test_head_spans_change_nothing),
		cmocka_unit_test(test_strides_nhd_hnd_and_padding),
		cmocka_unit_test(test_every_pf_step_computes_the_same),
		cmocka_unit_test(test_large_logits_groups_3_to_16),
		cmocka_unit_test(test_half_precision_queries_and_outputs),
		cmocka_unit_test(test_quantized_caches_are_close_to_what_was_stored),
		cmocka_unit_test(test_fp8_nan_in_v_reaches_only_its_column),
		cmocka_unit_test(test_fp8_nan_in_k_is_a_nan_as_in_f32),
		cmocka_unit_test(test_decode_over_arena_blocks_in_both_layouts),
	};

	/*
	 * Where the AVX-512 path runs, its groups of 3 to 8 run one tile or the
	 * other by the core (kva__avx512_split), its groups of 3 and 4 score
	 * one way or the other by the CPU (kva__sl_dot), and so do its groups
	 * with no sliced shape (kva__avx512_subgroups).
	 */
	if (kva_isa_best() == KVA_ISA_AVX512) {
		other_way = &choice_split;
		failed += cmocka_run_group_tests_name("kernels, AVX-512 split the other way", other,
						      setup_other_way, teardown_forces);
		/* where the AVX-512 tile runs groups 3 and 4 (a core that does
		 * not split), the same with them scored the other way */
		other_way = &choice_sl_dot;
		if (!kva__avx512_split())
			failed += cmocka_run_group_tests_name(
				"kernels, AVX-512 groups 3 and 4 scored the other way", other,
				setup_other_way, teardown_forces);
		/* its groups with no sliced shape as subgroups or as dot
		 * products by the CPU (kva__avx512_subgroups) */
		other_way = &choice_subgroups;
		failed += cmocka_run_group_tests_name(
			"kernels, AVX-512 groups without a sliced shape the other way", other,
			setup_other_way, teardown_forces);
	}
	/* where the AVX2 path runs, its one-head scores over 12 rows or 2 by
	 * the CPU (kva__avx2_cols) */
	other_way = &choice_cols;
	if (kva_isa_best() >= KVA_ISA_AVX2)
		failed += cmocka_run_group_tests_name("kernels, AVX2 one-head scores the other way",
						      other, setup_other_way, teardown_forces);
	return failed;
}
