/* SPDX-License-Identifier: MIT */
/*
 * bench_decode.c - `kvarena-bench decode`: one decode step of paged
 * attention (kva_decode) over a real arena's blocks, judged by the memory
 * read bandwidth the same threads reach on a buffer of the same size,
 * measured in the same run (bench_readbw.c), and by a naive scalar decode.
 *
 * The KV cache: an arena (kva_arena_create) of one layer, block-major,
 * block_tokens = page_size = 16, per geometry (dtype, head_dim, kv_heads),
 * of 2 GiB of data (--arena-mib), or more if its largest batch needs it.
 * One worker takes every block; the ids are shuffled and each
 * configuration's sequences take them in that order, so a sequence's pages
 * lie at random places in the whole arena, as in a serving arena much
 * larger than one batch.
 * Every block is filled once with random K and V through kva_store_kv (which
 * also picks the int8 scales); fp8 gets one scale per KV head. All sequences
 * of a batch are `context` tokens long. q and out are f32.
 *
 * Per configuration, after a warm-up: `trials` trials, each timing `reps`
 * decode calls, then `reps` passes of each read pattern over a buffer of
 * the bytes one call reads; decode and ceiling take turns trial by trial,
 * so a slow spell of a shared machine falls on both, and so does the
 * arithmetic roofline's loop. Medians are reported.
 * The naive decode (naive_head) runs on a sample of the (sequence, query
 * head) pairs spread over the batch; its time is scaled to the whole batch
 * by the pair count (all pairs cost the same: equal lengths). Its output is
 * the reference kvarena's is checked against on those pairs, in every
 * configuration: an error above 1e-3 fails the run (exit 1).
 *
 * Output: one JSON object per line on stdout:
 *
 *   bench, mode        "decode", "kvarena"
 *   dtype              the KV cache's: f32, f16, bf16, fp8_e4m3, int8
 *   head_dim, kv_heads, page_size
 *   batch, context     sequences, and tokens in each
 *   group              query heads per KV head (num_q_heads / kv_heads)
 *   threads            kva_decode_opts.threads, and the ceiling's threads
 *   isa                the decode path that ran (auto resolved as kva_decode does)
 *   tile               the tile that path ran (kva_decode_tile): "avx512",
 *                      "avx2" or "scalar"; the AVX-512 path runs the AVX2
 *                      tile for groups 3, 4, 6-8 on a core that splits
 *                      512-bit operations (Zen 4). roofline_gbps stays the
 *                      path's (on that core zmm and ymm FMAs have the same
 *                      peak)
 *   q_dtype            "f32" (q and out)
 *   bytes              K, V and scales one call reads: per sequence
 *                      len * kv_heads * head_dim * 2 * elem_bytes, plus
 *                      int8 len * kv_heads * 2 * 4, fp8 kv_heads * 2 * 4
 *   arena_bytes        the arena's data region, over which the batch's
 *                      blocks are scattered (--arena-mib)
 *   hugetlb            true when that region is on 2 MiB huge pages
 *                      (--hugepages, and the hugetlb pool had them)
 *   huge_bytes         of that region, the bytes 2 MiB pages map in this
 *                      process once the batch is written: all of it with
 *                      hugetlb, else what transparent huge pages gave (the
 *                      library asks for them; the system's shmem_enabled
 *                      decides)
 *   ms                 median time of one kva_decode call
 *   gbps               bytes / ms, in 1e9 bytes per second
 *   ceiling_gbps       the contiguous read sweep of `bytes` with `threads`
 *                      threads (BENCH_READ_SWEEP): the ceiling
 *   ratio              gbps / ceiling_gbps
 *   scatter4k_gbps, scatter64k_gbps   the same bytes read as 4 KiB / 64 KiB
 *                      chunks in random order: how much of the ceiling a
 *                      paged layout can hope for (not the ceiling: the
 *                      sweep is the figure a kernel is held to)
 *   scatter4k_pf_gbps  the 4 KiB chunks again, with software prefetches as
 *                      the tiles issue them (prefetcht1, a few lines at a
 *                      time, spread over the reads, a distance ahead in
 *                      each thread's order; bench_readbw_run_prefetched):
 *                      what a paged layout's reads reach when prefetched
 *                      with nothing else to do. The fastest of 4 distances
 *                      (16, 32, 64, 128 KiB), each the median of the trials
 *   scatter4k_pf_distance   that distance, in bytes
 *   scatter4k_pf_ratio gbps / scatter4k_pf_gbps (still not the ceiling)
 *   ceiling_isa        the reader's instructions (avx512, avx2, scalar)
 *   latency_ns         one thread's load whose address the load before
 *                      read, to a random line of as many bytes, after a
 *                      pass over them (bench_readbw_latency; median): for
 *                      bytes past the cache, memory's latency, TLB misses
 *                      included. A core reads at most its outstanding
 *                      misses x 64 bytes a latency, so a machine with twice
 *                      the latency needs twice the misses in flight to
 *                      reach the same ceiling
 *   prefetch_kept      of 64 software prefetches (prefetcht1, the tiles'
 *                      hint on most CPUs and shapes; next to 0 on a host
 *                      in a phase that drops them, where the library's
 *                      count is T0's, kva_cpu_prefetch_kept) one thread
 *                      issues back to back to lines of those bytes in no
 *                      cache, how many the core kept:
 *                      their lines are in the cache when it looks, 20 us
 *                      later (bench_readbw_prefetch_kept; median). 64 on a
 *                      core that queues what it cannot start; about its
 *                      misses in flight on one that drops the rest, which
 *                      is then all a burst of prefetches can have in
 *                      flight. null for bytes of fewer than 64 4 KiB chunks,
 *                      and where a load from memory could not be told
 *                      from one from the cache (under 2x its time)
 *   pf_step            the AVX2 tile's step of one head's rows (tokens
 *                      between prefetch steps) that the library takes for
 *                      this dtype, head_dim and group on this CPU, as the
 *                      trials ran it (kva_decode_pf_step: 8 where the
 *                      lines of a step are no more than the library's own
 *                      count of prefetches kept, kva_cpu_prefetch_kept,
 *                      else 4); the bench waits up to a second for that
 *                      count before the trials, so that the step stays
 *                      (and says on stderr if it changed all the same);
 *                      null where another tile runs
 *   roofline_gbps      the arithmetic roofline of the decode's ISA, with
 *                      `threads` threads, in the same run (bench_roofline.c):
 *                      bytes a second if memory cost nothing, each stored
 *                      element converted once and multiplied into `group`
 *                      accumulators; null on the scalar path
 *   bound              "memory" when ceiling_gbps is the lower of the two,
 *                      "compute" when roofline_gbps is; null without a roofline
 *   bound_gbps         min(ceiling_gbps, roofline_gbps): what the
 *                      configuration is held to
 *   bound_ratio        gbps / bound_gbps
 *   bound_ratio_paired the median over the trials of each trial's own
 *                      ratio: its decode against the lower of its sweep and
 *                      its roofline, measured on either side of it. On a
 *                      shared machine whose speed moves from one trial to
 *                      the next, the steadier figure (bound_ratio divides
 *                      medians taken at different moments)
 *   arith_stream_gbps  a plain loop's figure in the same run, as a peer:
 *                      the roofline's arithmetic (each element converted
 *                      once, `group` FMAs) over the decode's bytes read as
 *                      scatter4k_pf reads them (the random 4 KiB order from
 *                      memory, prefetcht1 spread over the reads a distance
 *                      ahead: bench_readbw_run_over, bench_arith_chunk), at
 *                      the fastest of scatter4k_pf's distances. Not a bound:
 *                      what a straightforward kernel gets where arithmetic
 *                      and reads must overlap, on this machine
 *   arith_stream_distance  that distance in bytes
 *   arith_stream_ratio gbps / arith_stream_gbps: above 1, the decode
 *                      overlaps its reads and arithmetic better than the
 *                      plain loop
 *   arith_stream_ratio_paired  the median of the trials' own ratios (each
 *                      plain loop run right after its trial's decode)
 *   arith_stream_of_bound  arith_stream_gbps / bound_gbps: how near the
 *                      plain loop comes to min(ceiling, roofline) here
 *   arith_sweep_gbps   the same plain loop over the sweep's contiguous
 *                      shares, in address order (no paging: the hardware
 *                      prefetchers' best case; each 4 KiB asking for the
 *                      lines 32 KiB ahead), right after the others: what
 *                      the machine gives a loop with nothing between its
 *                      arithmetic and the ceiling's own reads
 *   arith_sweep_of_bound  arith_sweep_gbps / bound_gbps (these seven null
 *                      on the scalar path or under 4 KiB)
 *   serial_gbps        1 / (1 / ceiling_gbps + 1 / roofline_gbps): the
 *                      rate if reading and arithmetic did not overlap at
 *                      all, each at its own best; a plain loop near it (and
 *                      not near bound_gbps) says this machine does not
 *                      overlap the two (null on the scalar path)
 *   cache_resident     bytes < 2 x the last-level cache (sysfs index3):
 *                      the figures then say more about caches than memory;
 *                      null when sysfs does not tell the cache size
 *   llc_bytes          that cache size
 *   naive_ms           the naive decode of the whole batch, one thread
 *                      (scaled from the sample)
 *   naive_threads      1
 *   naive_sampled      the fraction of (sequence, query head) pairs timed
 *   speedup_vs_naive   naive_ms / ms
 *   max_rel_err        max over the sampled pairs of max_d |out - ref| /
 *                      max_d |ref|, kvarena against naive (null if an
 *                      output was not finite: a failure)
 *   other_cpus         CPUs other processes kept busy while this line was
 *                      measured, on average (/proc/stat less our own time):
 *                      on a shared machine, how far to trust it
 *   trials, reps       trials per median, calls (and passes) per trial
 *
 * --backend cuda: kva_decode_cuda on a GPU, over a copy of the same arena
 * in device memory (see "the GPU" below), the same configurations (no
 * threads, no isa). Its lines have "backend":"cuda" and, in place of the CPU
 * ceiling, the naive decode and other_cpus:
 *
 *   device, driver_version   the GPU's name (cuDeviceGetName) and the
 *                      driver's version (cuDriverGetVersion: 12080 is 12.8)
 *   ms                 median time of one kva_decode_cuda call on the
 *                      device's clock (cuEventElapsedTime over `reps`
 *                      calls queued back to back)
 *   gbps               bytes / ms, as above
 *   ceiling            "cuMemcpyDtoD": the ceiling is a device-to-device copy
 *   ceiling_copy_bytes the size of that copy: at least 256 MiB, and 8 x L2
 *   ceiling_counts     "read+write": ceiling_gbps counts 2 x ceiling_copy_bytes
 *                      per copy
 *   ceiling_gbps       the fastest copy of the run's trials
 *   ratio              gbps / ceiling_gbps
 *   l2_bytes, cache_resident   the device's L2, and bytes < 2 x L2
 *   reference          "kva_decode": what the output is checked against
 *   max_abs_err        max over every output element of |gpu - cpu|
 *   max_rel_err        max over the (sequence, query head) rows of
 *                      max_d |gpu - cpu| / max_d |cpu| (null if not finite);
 *                      above 1e-3 fails the run (exit 1)
 *   kernel_errors      the KVA_CUDA_ERR_* bits the kernels set (nonzero
 *                      fails the run)
 *   timing             "cuEventElapsedTime"
 *   trials, reps
 *
 * Where there is no GPU to measure (no libcuda.so.1, cuInit fails, no such
 * device, or the tests' driver stand-in) the one line is
 * {"bench":"decode","backend":"cuda","status":"no device","reason":"..."},
 * and the exit status 0; "status":"no kernels" if libkvarena was built
 * without nvcc.
 *
 * A one-line summary per configuration goes to stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/times.h>
#include <unistd.h>

#include "bench.h"
#include "bench_roofline.h"
#include "decode_math.h"
#include "kvarena.h"

#define SEED 0x6465636f64656b76ull /* fixed: every run builds the same cache */
#define PAGE_TOKENS 16u
#define MAX_LIST 16u
#define MAX_CONFIGS 4096u
#define MAX_THREADS 64u
#define MAX_ERR 1e-3
/* a trial lasts at least this long: small configurations repeat the call */
#define MIN_TRIAL_NS 20000000ull
/* loads of the latency chain a trial: 10-20 ms at a few hundred ns each */
#define LATENCY_LOADS (1u << 15)
/* software prefetches issued back to back, and rounds of them a trial (about
 * 1 ms): more than any core of ours has misses in flight */
#define PREFETCH_BURST 64u
#define PREFETCH_ROUNDS 16u
/* K and V elements the naive decode reads per trial, about: 0.05-0.1 s */
#define NAIVE_ELEMS (1ull << 25)
#define NAIVE_TRIALS 3u
#define FILL_TOKENS 64u /* tokens per kva_store_kv call while filling */
#define FILL_PARTS 4u
#define DEFAULT_ARENA_MIB 2048u

struct config {
	enum kva_dtype dtype;
	uint32_t head_dim, kv_heads, batch, context, group, threads;
};

struct decode_opts {
	struct config *configs;
	unsigned n;
	enum kva_isa isa;
	unsigned trials;
	uint32_t arena_mib;  /* data region of each arena at least; 0: what the batches need */
	bool quick;
	bool hugepages;      /* --hugepages: each arena asks for KVA_ARENA_HUGETLB */
	bool cuda;           /* --backend cuda: kva_decode_cuda on device @device */
	uint32_t device;
};

/* ------------------------------------------------------------ the cache */

/* One arena and everything in it: what the configurations of one geometry share. */
struct kvcache {
	struct kva_arena *arena;
	struct kva_worker *w;
	uint32_t blocks;
	uint32_t *ids;           /* every block, shuffled: sequences take them in order */
	struct kva_kv_desc kv;
	float *fp8_scale;        /* fp8: [2][kv_heads], K's then V's */
};

static void cache_free(struct kvcache *c)
{
	if (c->w && c->ids)
		(void)kva_free(c->w, c->ids, c->blocks);
	kva_worker_leave(c->w);
	kva_arena_close(c->arena);
	free(c->ids);
	free(c->fp8_scale);
	memset(c, 0, sizeof(*c));
}

static float frand(uint64_t *rng)
{
	return (float)((double)(bench_rand(rng) >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
}

/* One filler thread's share: tokens [from, to) of the block order, its own random stream. */
struct fill_part {
	const struct kvcache *c;
	uint64_t from, to, rng;
	int ret;
};

/* two values in [-1, 1) from one draw: filling gigabytes, the draws count */
static void frand2(uint64_t *rng, float *a, float *b)
{
	uint64_t x = bench_rand(rng);

	*a = (float)(x >> 40) * (1.0f / (1u << 23)) - 1.0f;
	*b = (float)((x >> 16) & 0xffffffu) * (1.0f / (1u << 23)) - 1.0f;
}

static void *fill_part(void *arg)
{
	struct fill_part *f = arg;
	const struct kvcache *c = f->c;
	const size_t row = (size_t)c->kv.num_kv_heads * (size_t)c->kv.head_dim;
	float *k = malloc(sizeof(float) * row * FILL_TOKENS);
	float *v = malloc(sizeof(float) * row * FILL_TOKENS);
	int64_t slots[FILL_TOKENS];

	f->ret = k && v ? 0 : -ENOMEM;
	for (uint64_t t0 = f->from; t0 < f->to && f->ret == 0; t0 += FILL_TOKENS) {
		uint32_t n = f->to - t0 < FILL_TOKENS ? (uint32_t)(f->to - t0) : FILL_TOKENS;

		for (uint32_t i = 0; i < n; i++) {
			uint64_t t = t0 + i;

			slots[i] = (int64_t)c->ids[t / PAGE_TOKENS] * PAGE_TOKENS + (int64_t)(t % PAGE_TOKENS);
		}
		for (size_t i = 0; i < row * n; i++)
			frand2(&f->rng, &k[i], &v[i]);
		f->ret = kva_store_kv(&c->kv, k, v, KVA_F32, slots, (int32_t)n);
	}
	free(k);
	free(v);
	return NULL;
}

/*
 * cache_fill - every block's K and V: random values in [-1, 1), through
 * kva_store_kv, by FILL_PARTS threads on disjoint slots (each part its own
 * random stream: the same values whatever the number of CPUs).
 */
static int cache_fill(struct kvcache *c, uint64_t *rng)
{
	struct fill_part part[FILL_PARTS];
	pthread_t tid[FILL_PARTS];
	uint64_t tokens = (uint64_t)c->blocks * PAGE_TOKENS;
	uint64_t runs = (tokens + FILL_TOKENS - 1) / FILL_TOKENS;
	unsigned started = 0;
	int ret = 0;

	for (unsigned p = 0; p < FILL_PARTS; p++) {
		part[p] = (struct fill_part){ .c = c, .rng = bench_rand(rng) | 1,
					      .from = runs * p / FILL_PARTS * FILL_TOKENS,
					      .to = runs * (p + 1) / FILL_PARTS * FILL_TOKENS };
		if (part[p].to > tokens)
			part[p].to = tokens;
	}
	for (; started < FILL_PARTS; started++)
		if ((ret = -pthread_create(&tid[started], NULL, fill_part, &part[started])) < 0)
			break;
	for (unsigned p = 0; p < started; p++) {
		pthread_join(tid[p], NULL);
		if (ret == 0)
			ret = part[p].ret;
	}
	return ret;
}

static int cache_make(const struct config *g, uint32_t blocks, bool hugepages, uint64_t *rng,
		      struct kvcache *c)
{
	struct kva_geometry geo = {
		.block_tokens = PAGE_TOKENS, .layers = 1, .kv_heads = g->kv_heads,
		.head_dim = g->head_dim, .dtype = g->dtype, .layout = KVA_LAYOUT_BLOCK_MAJOR,
	};
	struct kva_arena_opts o = { .blocks = blocks, .cache_blocks = KVA_CACHE_NONE,
				    .numa_node = -1, .name = "kvarena-bench",
				    .flags = hugepages ? KVA_ARENA_HUGETLB : 0 };
	const char *step;
	int ret;

	memset(c, 0, sizeof(*c));
	c->blocks = blocks;
	step = "kva_arena_create";
	if ((ret = kva_arena_create(&geo, &o, &c->arena)) < 0)
		goto fail;
	step = "kva_worker_join";
	if ((ret = kva_worker_join(c->arena, "decode", &c->w)) < 0)
		goto fail;
	step = "kva_alloc";
	c->ids = malloc(sizeof(uint32_t) * blocks);
	if (!c->ids) {
		ret = -ENOMEM;
		goto fail;
	}
	if ((ret = kva_alloc(c->w, blocks, c->ids)) < 0) {
		free(c->ids);
		c->ids = NULL;
		goto fail;
	}
	for (uint32_t i = blocks - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(bench_rand(rng) % (i + 1)), x = c->ids[i];

		c->ids[i] = c->ids[j];
		c->ids[j] = x;
	}
	step = "kva_kv_desc_for_arena";
	if ((ret = kva_kv_desc_for_arena(c->arena, 0, &c->kv)) < 0)
		goto fail;
	if (g->dtype == KVA_FP8_E4M3) {
		/* values in [-1, 1) become up to +-64 and +-32 in e4m3: well
		 * inside its +-448, with its full precision */
		c->fp8_scale = malloc(sizeof(float) * 2 * g->kv_heads);
		if (!c->fp8_scale) {
			ret = -ENOMEM;
			goto fail;
		}
		for (uint32_t h = 0; h < g->kv_heads; h++) {
			c->fp8_scale[h] = 1.0f / 64;
			c->fp8_scale[g->kv_heads + h] = 1.0f / 32;
		}
		c->kv.k_scale = c->fp8_scale;
		c->kv.v_scale = c->fp8_scale + g->kv_heads;
	}
	step = "filling";
	if ((ret = cache_fill(c, rng)) < 0)
		goto fail;
	return 0;
fail:
	fprintf(stderr, "decode: %s (%s, %u blocks): %s (%s)\n", step, kva_dtype_name(g->dtype),
		blocks, strerror(-ret), kva_errmsg());
	cache_free(c);
	return ret;
}

/* ------------------------------------------------------------ a batch */

struct batch {
	int32_t *indptr, *indices, *last;
	struct kva_page_table pt;
	float *q, *out, *ref, *scores;
	uint32_t q_heads;
	size_t bytes;            /* K, V and scales one call reads */
	uint64_t huge_bytes;     /* of the arena's data, what 2 MiB pages map here */
};

static void batch_free(struct batch *b)
{
	free(b->indptr);
	free(b->indices);
	free(b->last);
	free(b->q);
	free(b->out);
	free(b->ref);
	free(b->scores);
	memset(b, 0, sizeof(*b));
}

static uint32_t pages_of(uint32_t context)
{
	return (context + PAGE_TOKENS - 1) / PAGE_TOKENS;
}

static size_t bytes_read(const struct config *c)
{
	size_t per_token = (size_t)c->kv_heads * c->head_dim * 2 * kva_dtype_size(c->dtype);

	if (c->dtype == KVA_INT8)
		per_token += (size_t)c->kv_heads * 2 * sizeof(float);
	return (size_t)c->batch * ((size_t)c->context * per_token +
				   (c->dtype == KVA_FP8_E4M3 ? (size_t)c->kv_heads * 2 * sizeof(float) : 0));
}

static int batch_make(const struct config *c, const struct kvcache *kc, uint64_t *rng,
		      struct batch *b)
{
	uint32_t pages = pages_of(c->context);
	size_t qn;

	memset(b, 0, sizeof(*b));
	b->q_heads = c->kv_heads * c->group;
	qn = (size_t)c->batch * b->q_heads * c->head_dim;
	b->indptr = malloc(sizeof(int32_t) * (c->batch + 1));
	b->indices = malloc(sizeof(int32_t) * (size_t)c->batch * pages);
	b->last = malloc(sizeof(int32_t) * c->batch);
	b->q = malloc(sizeof(float) * qn);
	b->out = malloc(sizeof(float) * qn);
	b->ref = malloc(sizeof(float) * qn);
	b->scores = malloc(sizeof(float) * c->context);
	if (!b->indptr || !b->indices || !b->last || !b->q || !b->out || !b->ref || !b->scores) {
		batch_free(b);
		return -ENOMEM;
	}
	b->indptr[0] = 0;
	for (uint32_t s = 0; s < c->batch; s++) {
		b->indptr[s + 1] = (int32_t)((s + 1) * pages);
		b->last[s] = (int32_t)(c->context - (pages - 1) * PAGE_TOKENS);
	}
	for (size_t i = 0; i < (size_t)c->batch * pages; i++)
		b->indices[i] = (int32_t)kc->ids[i];
	/* q in [-2, 2): scores spread enough that the softmax is not flat */
	for (size_t i = 0; i < qn; i++)
		b->q[i] = 2.0f * frand(rng);
	b->pt = (struct kva_page_table){ (int32_t)c->batch, PAGE_TOKENS, b->indptr, b->indices,
					 b->last };
	b->bytes = bytes_read(c);
	b->huge_bytes = bench_huge_bytes(kc->kv.k);
	return 0;
}

/* ------------------------------------------------------------ naive */

/* element @d of a K or V row, without its scale */
static float elem(const void *row, enum kva_dtype t, int32_t d)
{
	switch (t) {
	case KVA_F16:
		return kva_f16_to_f32(((const uint16_t *)row)[d]);
	case KVA_BF16:
		return kva_bf16_to_f32(((const uint16_t *)row)[d]);
	case KVA_FP8_E4M3:
		return kva_fp8_to_f32(((const uint8_t *)row)[d]);
	case KVA_INT8:
		return (float)((const int8_t *)row)[d];
	default:
		return ((const float *)row)[d];
	}
}

static const void *row_of(const struct kva_kv_desc *kv, const void *base, const int32_t *pages,
			  int32_t t, int32_t h)
{
	int64_t e = kva_kv_index(kv->page_stride, kv->token_stride, kv->head_stride,
				 pages[t / kv->page_size], t % kv->page_size, h);

	return (const char *)base + e * (int64_t)kva_dtype_size(kv->dtype);
}

static float scale_of(const struct kva_kv_desc *kv, const float *base, const int32_t *pages,
		      int32_t t, int32_t h)
{
	if (kv->dtype == KVA_INT8)
		return base[(int64_t)pages[t / kv->page_size] * kv->scale_page_stride +
			    (int64_t)(t % kv->page_size) * kv->scale_token_stride +
			    (int64_t)h * kv->scale_head_stride];
	if (kv->dtype == KVA_FP8_E4M3)
		return base[kv->flags & KVA_KV_SCALE_PER_TENSOR ? 0 : h];
	return 1.0f;
}

/*
 * naive_head - attention of one query head over one sequence, as written
 * from the formula: scores (each K row converted element by element), a max
 * pass, exponentials and their sum, then the V rows weighted. One query
 * head at a time, so a KV head's rows are read again for every query head
 * of its group. @s: room for @len scores.
 */
static void naive_head(const struct kva_kv_desc *kv, const int32_t *pages, int32_t len,
		       int32_t kv_head, const float *q, float sm_scale, float *s, float *out)
{
	const int32_t D = kv->head_dim;
	float m = -INFINITY, l = 0.0f;

	for (int32_t t = 0; t < len; t++) {
		const void *k = row_of(kv, kv->k, pages, t, kv_head);
		float dot = 0.0f;

		for (int32_t d = 0; d < D; d++)
			dot += q[d] * elem(k, kv->dtype, d);
		s[t] = dot * scale_of(kv, kv->k_scale, pages, t, kv_head) * sm_scale;
	}
	for (int32_t t = 0; t < len; t++)
		m = s[t] > m ? s[t] : m;
	for (int32_t t = 0; t < len; t++) {
		s[t] = expf(s[t] - m);
		l += s[t];
	}
	for (int32_t d = 0; d < D; d++)
		out[d] = 0.0f;
	for (int32_t t = 0; t < len; t++) {
		const void *v = row_of(kv, kv->v, pages, t, kv_head);
		float p = s[t] * scale_of(kv, kv->v_scale, pages, t, kv_head);

		for (int32_t d = 0; d < D; d++)
			out[d] += p * elem(v, kv->dtype, d);
	}
	for (int32_t d = 0; d < D; d++)
		out[d] /= l;
}

/* the pairs the naive decode times: @n of @total, spread evenly */
static uint64_t sample_pair(uint64_t k, uint64_t n, uint64_t total)
{
	return k * total / n;
}

/* ------------------------------------------------------------ measuring */

struct figures {
	double ms, gbps, ceiling_gbps, scatter4k_gbps, scatter64k_gbps, latency_ns;
	double scatter4k_pf_gbps, scatter4k_pf_distance;
	double prefetch_kept; /* NaN: too few bytes for a burst, or no trial could count */
	double roofline_gbps; /* NaN on the scalar path */
	double stream_gbps, stream_distance; /* NaN on the scalar path or under 4 KiB */
	double stream_ratio_paired;
	double sweep_arith_gbps; /* NaN on the scalar path or under 4 KiB */
	double bound_ratio_paired; /* the median of the trials' own ratios */
	double naive_ms, naive_sampled, max_rel_err;
	double other_cpus;
	double pf_step; /* NaN off the AVX2 path */
	unsigned reps;
};

/*
 * CPU time in clock ticks: of every CPU (/proc/stat), and of this process's
 * threads (times()). The machine may be shared: what others ran while we
 * measured says how far to trust the figures.
 */
struct cpu_sample {
	uint64_t busy, total, self;
};

static void cpu_sample(struct cpu_sample *s)
{
	unsigned long long user, nice, sys, idle, iowait, irq, softirq, steal;
	FILE *f = fopen("/proc/stat", "r");
	struct tms t;
	int n = 0;

	memset(s, 0, sizeof(*s));
	if (f) {
		n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &sys, &idle,
			   &iowait, &irq, &softirq, &steal);
		fclose(f);
	}
	if (n != 8)
		return;
	/* steal: the hypervisor ran someone else on our CPUs */
	s->busy = user + nice + sys + irq + softirq + steal;
	s->total = s->busy + idle + iowait;
	times(&t);
	s->self = (uint64_t)t.tms_utime + (uint64_t)t.tms_stime;
}

/* CPUs kept busy by other processes between @a and @b, on average; NaN if unknown */
static double other_cpus(const struct cpu_sample *a, const struct cpu_sample *b)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	double total = (double)(b->total - a->total);
	double other = (double)(b->busy - a->busy) - (double)(b->self - a->self);

	if (!a->total || total <= 0 || cpus < 1)
		return NAN;
	return other < 0 ? 0.0 : other / total * (double)cpus;
}

static int decode_call(const struct config *c, const struct kvcache *kc, struct batch *b,
		       enum kva_isa isa)
{
	struct kva_decode_opts o = { .threads = (int32_t)c->threads, .isa = isa };
	int ret = kva_decode(&kc->kv, &b->pt, b->q, KVA_F32, (int32_t)b->q_heads,
			     1.0f / sqrtf((float)c->head_dim), b->out, NULL, &o);

	if (ret < 0)
		fprintf(stderr, "decode: kva_decode: %s (%s)\n", strerror(-ret), kva_errmsg());
	return ret;
}

static int time_decode(const struct config *c, const struct kvcache *kc, struct batch *b,
		       enum kva_isa isa, unsigned reps, double *ns)
{
	uint64_t t0 = bench_now_ns();
	int ret = 0;

	for (unsigned k = 0; k < reps && ret == 0; k++)
		ret = decode_call(c, kc, b, isa);
	*ns = (double)(bench_now_ns() - t0) / reps;
	return ret;
}

/*
 * One read of @bytes in pattern @p; BENCH_READ_4K_PF: its whole 4 KiB chunks
 * (the same order as BENCH_READ_4K's), prefetched @distance bytes ahead.
 */
static int time_read(struct bench_readbw *rb, enum bench_read_pattern p, size_t distance,
		     const struct config *c, size_t bytes, unsigned reps, double *ns)
{
	uint64_t el;
	int ret = p == BENCH_READ_4K_PF
			  ? bench_readbw_run_prefetched(rb, bytes, distance, c->threads, reps, &el)
			  : bench_readbw_run(rb, p, bytes, c->threads, reps, &el);

	if (ret < 0)
		fprintf(stderr, "decode: read sweep: %s\n", strerror(-ret));
	*ns = (double)el / reps;
	return ret;
}

/*
 * The decode's arithmetic over @bytes read as BENCH_READ_4K_PF reads them
 * (bench_readbw_run_over, bench_arith_chunk), prefetched @distance ahead;
 * @contiguous, in the sweep's shares instead.
 */
static int time_over(struct bench_readbw *rb, struct bench_arith *a, size_t distance,
		     bool contiguous, const struct config *c, size_t bytes, unsigned reps,
		     double *ns)
{
	uint64_t el;
	int ret = bench_readbw_run_over(rb, bytes, distance, contiguous, c->threads, reps,
					bench_arith_chunk, a, &el);

	if (ret < 0)
		fprintf(stderr, "decode: the arithmetic over memory: %s\n", strerror(-ret));
	*ns = (double)el / reps;
	return ret;
}

/* the prefetch distances of scatter4k_pf_gbps and stream_gbps, in bytes */
static const size_t pf_distances[] = { 16u << 10, 32u << 10, 64u << 10, 128u << 10 };
#define PF_DISTANCES (sizeof(pf_distances) / sizeof(pf_distances[0]))
/* arith_sweep_gbps's: in address order the hardware prefetchers run ahead
 * too, and the distance hardly matters (on Zen 5 the same at 4 to 32 KiB) */
#define SWEEP_ARITH_DISTANCE (32u << 10)

/* the naive decode on a sample of pairs: its time for the whole batch, and its error */
static void measure_naive(const struct config *c, const struct kvcache *kc, struct batch *b,
			  unsigned trials, struct figures *f)
{
	uint64_t total = (uint64_t)c->batch * b->q_heads;
	uint64_t per_pair = (uint64_t)c->context * c->head_dim * 2;
	uint64_t n = NAIVE_ELEMS / per_pair;
	float sm_scale = 1.0f / sqrtf((float)c->head_dim);
	double t[NAIVE_TRIALS], err = 0.0;

	n = n < 1 ? 1 : n > total ? total : n;
	for (unsigned tr = 0; tr < trials; tr++) {
		uint64_t t0 = bench_now_ns();

		for (uint64_t k = 0; k < n; k++) {
			uint64_t pair = sample_pair(k, n, total);
			uint32_t seq = (uint32_t)(pair / b->q_heads), qh = (uint32_t)(pair % b->q_heads);
			size_t at = (size_t)pair * c->head_dim;

			naive_head(&kc->kv, b->indices + b->indptr[seq], (int32_t)c->context,
				   (int32_t)(qh / c->group), b->q + at, sm_scale, b->scores, b->ref + at);
		}
		t[tr] = (double)(bench_now_ns() - t0);
	}
	for (uint64_t k = 0; k < n; k++) {
		size_t at = (size_t)sample_pair(k, n, total) * c->head_dim;
		double dmax = 0.0, rmax = 0.0;
		bool finite = true;

		for (uint32_t d = 0; d < c->head_dim; d++) {
			/* fmax() drops a NaN: a NaN anywhere must fail, so test it first */
			finite = finite && isfinite(b->out[at + d]) && isfinite(b->ref[at + d]);
			dmax = fmax(dmax, fabs((double)b->out[at + d] - b->ref[at + d]));
			rmax = fmax(rmax, fabs((double)b->ref[at + d]));
		}
		if (!finite)
			err = INFINITY;
		else
			err = fmax(err, rmax > 0.0 ? dmax / rmax : dmax);
	}
	f->naive_ms = bench_median(t, trials) * (double)total / (double)n / 1e6;
	f->naive_sampled = (double)n / (double)total;
	f->max_rel_err = err;
}

static enum kva_isa isa_used(enum kva_isa want, uint32_t head_dim);

/*
 * The AVX2 tile's step for @c, once the library knows this core's count of
 * prefetches kept: its probe may fall in one of a host's spells and try
 * again 10, 20, 40 ms ... later, and a step that changed from 4 to 8 in the
 * middle of the trials would mix two kernels in one median. Up to a
 * second; past it, the step the library takes meanwhile (4).
 */
static double settled_pf_step(const struct config *c)
{
	for (int ms = 0; ms < 1000 && kva_cpu_prefetch_kept() == 0; ms++)
		usleep(1000);
	return kva_decode_pf_step(c->dtype, (int32_t)c->head_dim, (int32_t)c->group);
}

/* the roofline's share of a trial: as many bytes as the call reads, within bounds */
static uint64_t roofline_bytes(const struct config *c, const struct batch *b)
{
	uint64_t per = b->bytes / c->threads;

	return per < (16u << 20) ? 16u << 20 : per > (256u << 20) ? 256u << 20 : per;
}

static int measure(const struct config *c, const struct kvcache *kc, struct batch *b,
		   struct bench_readbw *rb, const struct decode_opts *o, struct figures *f)
{
	const enum kva_isa isa = isa_used(o->isa, c->head_dim);
	/* the AVX2 tile runs on the AVX2 path, and on the AVX-512 path's
	 * groups a split core gives it (kva_decode_tile) */
	const char *tile = kva_decode_tile(isa, (int32_t)c->head_dim, (int32_t)c->group);
	const bool avx2_tile = tile && !strcmp(tile, "avx2");
	double roof[BENCH_MAX_TRIALS], paired[BENCH_MAX_TRIALS];
	double dec[BENCH_MAX_TRIALS], sweep[BENCH_MAX_TRIALS], s4k[BENCH_MAX_TRIALS],
		s64k[BENCH_MAX_TRIALS], lat[BENCH_MAX_TRIALS], pfk[BENCH_MAX_TRIALS], once, unused;
	double spf[PF_DISTANCES][BENCH_MAX_TRIALS], ovl[PF_DISTANCES][BENCH_MAX_TRIALS],
		ovs[BENCH_MAX_TRIALS];
	struct bench_arith *arith = NULL;
	const bool over = isa != KVA_ISA_SCALAR && b->bytes >= 4096;
	unsigned npfk = 0;
	struct cpu_sample c0, c1;
	int ret;

	cpu_sample(&c0);
	/* warm-up: the pool's threads, the scratch buffers, the chunk orders */
	if ((ret = decode_call(c, kc, b, o->isa)) < 0 ||
	    (ret = time_decode(c, kc, b, o->isa, 1, &once)) < 0)
		return ret;
	for (int p = BENCH_READ_SWEEP; p <= BENCH_READ_64K; p++)
		if ((ret = time_read(rb, (enum bench_read_pattern)p, 0, c, b->bytes, 1, &unused)) < 0)
			return ret;
	if (b->bytes >= 4096 && (ret = time_read(rb, BENCH_READ_4K_PF, pf_distances[0], c, b->bytes,
						 1, &unused)) < 0)
		return ret;
	if (over && ((ret = bench_arith_open(isa, c->dtype, c->group, c->threads, &arith)) < 0 ||
		     (ret = time_over(rb, arith, pf_distances[0], false, c, b->bytes, 1, &unused)) < 0 ||
		     (ret = time_over(rb, arith, SWEEP_ARITH_DISTANCE, true, c, b->bytes, 1,
				      &unused)) < 0)) {
		fprintf(stderr, "decode: the arithmetic over memory: %s\n", strerror(-ret));
		bench_arith_close(arith);
		return ret;
	}
	f->pf_step = avx2_tile ? settled_pf_step(c) : NAN;
	f->reps = once >= MIN_TRIAL_NS ? 1 : (unsigned)ceil(MIN_TRIAL_NS / once);
	if (f->reps > 10000)
		f->reps = 10000;
	for (unsigned t = 0; t < o->trials; t++) {
		/* the roofline, the decode and the sweep back to back: a trial's
		 * bound and decode a moment apart (bound_ratio_paired) */
		if (isa != KVA_ISA_SCALAR &&
		    (ret = bench_roofline(isa, c->dtype, c->group, c->threads,
					  roofline_bytes(c, b), &roof[t])) < 0) {
			fprintf(stderr, "decode: roofline: %s\n", strerror(-ret));
			goto out;
		}
		if ((ret = time_decode(c, kc, b, o->isa, f->reps, &dec[t])) < 0)
			goto out;
		/* right after the decode, each distance, for stream_ratio_paired */
		for (unsigned d = 0; over && d < PF_DISTANCES; d++)
			if ((ret = time_over(rb, arith, pf_distances[d], false, c, b->bytes, f->reps,
					     &ovl[d][t])) < 0)
				goto out;
		if (over && (ret = time_over(rb, arith, SWEEP_ARITH_DISTANCE, true, c, b->bytes,
					     f->reps, &ovs[t])) < 0)
			goto out;
		if ((ret = time_read(rb, BENCH_READ_SWEEP, 0, c, b->bytes, f->reps, &sweep[t])) < 0 ||
		    (ret = time_read(rb, BENCH_READ_4K, 0, c, b->bytes, f->reps, &s4k[t])) < 0 ||
		    (ret = time_read(rb, BENCH_READ_64K, 0, c, b->bytes, f->reps, &s64k[t])) < 0)
			goto out;
		for (unsigned d = 0; d < PF_DISTANCES && b->bytes >= 4096; d++)
			if ((ret = time_read(rb, BENCH_READ_4K_PF, pf_distances[d], c, b->bytes, f->reps,
						&spf[d][t])) < 0)
				goto out;
		if ((ret = bench_readbw_latency(rb, b->bytes, LATENCY_LOADS, &lat[t])) < 0) {
			fprintf(stderr, "decode: memory latency: %s\n", strerror(-ret));
			goto out;
		}
		if (b->bytes / 4096 >= PREFETCH_BURST) {
			double kept;

			if ((ret = bench_readbw_prefetch_kept(rb, b->bytes, PREFETCH_BURST,
							      PREFETCH_ROUNDS, &kept)) < 0) {
				fprintf(stderr, "decode: prefetches kept: %s\n", strerror(-ret));
				goto out;
			}
			if (isfinite(kept)) /* the median of the trials that could count */
				pfk[npfk++] = kept;
		}
		/* the trials' own ratios, before the medians sort the arrays */
		paired[t] = (double)b->bytes / dec[t] /
			    (isa == KVA_ISA_SCALAR ? (double)b->bytes / sweep[t]
						   : fmin((double)b->bytes / sweep[t], roof[t]));
	}
	f->bound_ratio_paired = bench_median(paired, o->trials);
	/* the distance whose median is fastest, and the trials' own ratios at it */
	f->stream_gbps = f->stream_distance = f->stream_ratio_paired = NAN;
	f->sweep_arith_gbps = over ? (double)(b->bytes / 4096 * 4096) / bench_median(ovs, o->trials)
				   : NAN;
	for (unsigned d = 0; over && d < PF_DISTANCES; d++) {
		double own[BENCH_MAX_TRIALS], g;

		for (unsigned t = 0; t < o->trials; t++)
			own[t] = ovl[d][t] / dec[t] * (double)b->bytes / (double)(b->bytes / 4096 * 4096);
		g = (double)(b->bytes / 4096 * 4096) / bench_median(ovl[d], o->trials);
		if (!(g <= f->stream_gbps)) {
			f->stream_gbps = g;
			f->stream_distance = (double)pf_distances[d];
			f->stream_ratio_paired = bench_median(own, o->trials);
		}
	}
	f->ms = bench_median(dec, o->trials) / 1e6;
	f->gbps = (double)b->bytes / (f->ms * 1e6);
	f->ceiling_gbps = (double)b->bytes / bench_median(sweep, o->trials);
	f->scatter4k_gbps = (double)b->bytes / bench_median(s4k, o->trials);
	f->scatter64k_gbps = (double)b->bytes / bench_median(s64k, o->trials);
	f->scatter4k_pf_gbps = f->scatter4k_pf_distance = NAN; /* fewer bytes than a chunk */
	for (unsigned d = 0; d < PF_DISTANCES && b->bytes >= 4096; d++) {
		double g = (double)(b->bytes / 4096 * 4096) / bench_median(spf[d], o->trials);

		if (!(g <= f->scatter4k_pf_gbps)) { /* the first, or a faster one */
			f->scatter4k_pf_gbps = g;
			f->scatter4k_pf_distance = (double)pf_distances[d];
		}
	}
	if (avx2_tile &&
	    kva_decode_pf_step(c->dtype, (int32_t)c->head_dim, (int32_t)c->group) != f->pf_step)
		fprintf(stderr, "decode: the library's prefetch step changed during the trials "
				"(its count of prefetches kept came late): pf_step is the first\n");
	f->latency_ns = bench_median(lat, o->trials);
	f->prefetch_kept = bench_median(pfk, npfk); /* NaN if none */
	f->roofline_gbps = isa == KVA_ISA_SCALAR ? NAN : bench_median(roof, o->trials);
	/* b->out now holds kvarena's answer, which the naive one is checked against */
	measure_naive(c, kc, b, o->quick ? 1 : NAIVE_TRIALS, f);
	cpu_sample(&c1);
	f->other_cpus = other_cpus(&c0, &c1);
	ret = 0;
out:
	bench_arith_close(arith);
	return ret;
}

/* ------------------------------------------------------------ output */

/* the path kva_decode takes for @want (decode.c's pick(), restated) */
static enum kva_isa isa_used(enum kva_isa want, uint32_t head_dim)
{
	enum kva_isa best = kva_isa_best();

	if (want != KVA_ISA_AUTO)
		return want;
	if (best == KVA_ISA_AVX512 && head_dim % 16 == 0)
		return KVA_ISA_AVX512;
	if (best >= KVA_ISA_AVX2 && head_dim % 8 == 0)
		return KVA_ISA_AVX2;
	return KVA_ISA_SCALAR;
}

/* the last-level cache in bytes, from sysfs ("107520K"); 0 if it does not say */
static uint64_t llc_bytes(void)
{
	FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
	unsigned long long n = 0;
	char unit = 0;

	if (!f)
		return 0;
	if (fscanf(f, "%llu%c", &n, &unit) < 1)
		n = 0;
	fclose(f);
	return unit == 'K' ? n << 10 : unit == 'M' ? n << 20 : unit == 'G' ? n << 30 : n;
}

static int print_line(const struct config *c, const struct batch *b, const struct figures *f,
		      enum kva_isa isa, const struct bench_readbw *rb, uint64_t llc, unsigned trials,
		      const struct kva_arena_info *arena)
{
	struct bench_line l;
	const char *tile;

	bench_line_begin(&l, "decode", "kvarena");
	bench_line_str(&l, "dtype", kva_dtype_name(c->dtype));
	bench_line_num(&l, "head_dim", c->head_dim, 0);
	bench_line_num(&l, "kv_heads", c->kv_heads, 0);
	bench_line_num(&l, "page_size", PAGE_TOKENS, 0);
	bench_line_num(&l, "batch", c->batch, 0);
	bench_line_num(&l, "context", c->context, 0);
	bench_line_num(&l, "group", c->group, 0);
	bench_line_num(&l, "threads", c->threads, 0);
	bench_line_str(&l, "isa", kva_isa_name(isa_used(isa, c->head_dim)));
	tile = kva_decode_tile(isa_used(isa, c->head_dim), (int32_t)c->head_dim, (int32_t)c->group);
	bench_line_str(&l, "tile", tile ? tile : "?"); /* the decode ran: never NULL */
	bench_line_str(&l, "q_dtype", "f32");
	bench_line_num(&l, "bytes", (double)b->bytes, 0);
	bench_line_num(&l, "arena_bytes", (double)arena->layout.data_bytes, 0);
	bench_line_bool(&l, "hugetlb", arena->hugetlb);
	bench_line_num(&l, "huge_bytes",
		       arena->hugetlb ? (double)arena->data_map_bytes : (double)b->huge_bytes, 0);
	bench_line_num(&l, "ms", f->ms, 4);
	bench_line_num(&l, "gbps", f->gbps, 2);
	bench_line_num(&l, "ceiling_gbps", f->ceiling_gbps, 2);
	bench_line_num(&l, "ratio", f->gbps / f->ceiling_gbps, 3);
	bench_line_num(&l, "scatter4k_gbps", f->scatter4k_gbps, 2);
	bench_line_num(&l, "scatter64k_gbps", f->scatter64k_gbps, 2);
	bench_line_num(&l, "scatter4k_pf_gbps", f->scatter4k_pf_gbps, 2);
	bench_line_num(&l, "scatter4k_pf_distance", f->scatter4k_pf_distance, 0);
	bench_line_num(&l, "scatter4k_pf_ratio", f->gbps / f->scatter4k_pf_gbps, 3);
	bench_line_str(&l, "ceiling_isa", bench_readbw_isa(rb));
	bench_line_num(&l, "latency_ns", f->latency_ns, 1);
	bench_line_num(&l, "prefetch_kept", f->prefetch_kept, 1);
	bench_line_num(&l, "pf_step", f->pf_step, 0);
	bench_line_num(&l, "roofline_gbps", f->roofline_gbps, 2);
	if (isnan(f->roofline_gbps)) {
		bench_line_num(&l, "bound", NAN, 0);
		bench_line_num(&l, "bound_gbps", f->ceiling_gbps, 2);
		bench_line_num(&l, "bound_ratio", f->gbps / f->ceiling_gbps, 3);
	} else {
		double bound = fmin(f->ceiling_gbps, f->roofline_gbps);

		bench_line_str(&l, "bound", f->roofline_gbps < f->ceiling_gbps ? "compute" : "memory");
		bench_line_num(&l, "bound_gbps", bound, 2);
		bench_line_num(&l, "bound_ratio", f->gbps / bound, 3);
	}
	bench_line_num(&l, "bound_ratio_paired", f->bound_ratio_paired, 3);
	bench_line_num(&l, "arith_stream_gbps", f->stream_gbps, 2);
	bench_line_num(&l, "arith_stream_distance", f->stream_distance, 0);
	bench_line_num(&l, "arith_stream_ratio", f->gbps / f->stream_gbps, 3);
	bench_line_num(&l, "arith_stream_ratio_paired", f->stream_ratio_paired, 3);
	bench_line_num(&l, "arith_stream_of_bound", isnan(f->roofline_gbps) ? NAN
			: f->stream_gbps / fmin(f->ceiling_gbps, f->roofline_gbps), 3);
	bench_line_num(&l, "arith_sweep_gbps", f->sweep_arith_gbps, 2);
	bench_line_num(&l, "arith_sweep_of_bound", isnan(f->roofline_gbps) ? NAN
			: f->sweep_arith_gbps / fmin(f->ceiling_gbps, f->roofline_gbps), 3);
	bench_line_num(&l, "serial_gbps", 1.0 / (1.0 / f->ceiling_gbps + 1.0 / f->roofline_gbps), 2);
	if (llc)
		bench_line_bool(&l, "cache_resident", b->bytes < 2 * llc);
	else
		bench_line_num(&l, "cache_resident", NAN, 0);
	bench_line_num(&l, "llc_bytes", llc ? (double)llc : NAN, 0);
	bench_line_num(&l, "naive_ms", f->naive_ms, 3);
	bench_line_num(&l, "naive_threads", 1, 0);
	bench_line_num(&l, "naive_sampled", f->naive_sampled, 5);
	bench_line_num(&l, "speedup_vs_naive", f->naive_ms / f->ms, 1);
	/* nine decimals: an error of 1e-7 must not print as 0 */
	bench_line_num(&l, "max_rel_err", f->max_rel_err, 9);
	bench_line_num(&l, "other_cpus", f->other_cpus, 2);
	bench_line_num(&l, "trials", trials, 0);
	bench_line_num(&l, "reps", f->reps, 0);
	return bench_line_print(&l);
}

/* ------------------------------------------------------------ the run */

static bool same_geometry(const struct config *a, const struct config *b)
{
	return a->dtype == b->dtype && a->head_dim == b->head_dim && a->kv_heads == b->kv_heads;
}

/* bytes of one block of @g's geometry, in an arena of one layer */
static uint64_t block_bytes(const struct config *g)
{
	struct kva_geometry geo = {
		.block_tokens = PAGE_TOKENS, .layers = 1, .kv_heads = g->kv_heads,
		.head_dim = g->head_dim, .dtype = g->dtype, .layout = KVA_LAYOUT_BLOCK_MAJOR,
	};
	struct kva_block_layout l;

	return kva_geometry_layout(&geo, 1, &l) == 0 ? l.block_stride : 0;
}

/*
 * The arena of @g's geometry: the blocks its largest batch needs, and at
 * least o->arena_mib of them. A fixed size, not the largest batch of the
 * run, so that a configuration measures the same alone as in the full run:
 * how far apart its pages lie (TLB misses: the arena is on 4 KiB pages
 * unless the system has a hugetlb pool) depends on the arena's size.
 */
static uint32_t arena_blocks(const struct decode_opts *o, const struct config *g)
{
	uint64_t bb = block_bytes(g), blocks = bb ? ((uint64_t)o->arena_mib << 20) / bb : 0;

	for (unsigned i = 0; i < o->n; i++)
		if (same_geometry(&o->configs[i], g) &&
		    (uint64_t)o->configs[i].batch * pages_of(o->configs[i].context) > blocks)
			blocks = (uint64_t)o->configs[i].batch * pages_of(o->configs[i].context);
	return blocks > KVA_MAX_BLOCKS ? KVA_MAX_BLOCKS : (uint32_t)blocks;
}

/* every configuration of @g's geometry, on one cache */
static int run_geometry(const struct decode_opts *o, const struct config *g,
			struct bench_readbw *rb, uint64_t llc, uint64_t *rng, bool *wrong)
{
	struct kvcache kc;
	uint32_t blocks = arena_blocks(o, g);
	uint64_t t0 = bench_now_ns();
	int ret;

	if ((ret = cache_make(g, blocks, o->hugepages, rng, &kc)) < 0)
		return ret;
	fprintf(stderr, "decode: %s, head_dim %u, %u KV heads: %u blocks (%.0f MiB%s) filled in "
		"%.1f s\n", kva_dtype_name(g->dtype), g->head_dim, g->kv_heads, blocks,
		(double)kva_arena_info(kc.arena)->layout.data_bytes / (1 << 20),
		kva_arena_info(kc.arena)->hugetlb ? ", huge pages"
		: o->hugepages ? ", no huge pages free: ordinary pages" : "",
		(double)(bench_now_ns() - t0) / 1e9);
	for (unsigned i = 0; i < o->n && ret == 0; i++) {
		const struct config *c = &o->configs[i];
		struct figures f = { 0 };
		struct batch b;

		if (!same_geometry(c, g))
			continue;
		if ((ret = batch_make(c, &kc, rng, &b)) < 0)
			break;
		ret = measure(c, &kc, &b, rb, o, &f);
		if (ret == 0)
			ret = print_line(c, &b, &f, o->isa, rb, llc, o->trials,
					 kva_arena_info(kc.arena));
		if (ret == 0) {
			fprintf(stderr, "decode: %-8s hd %3u b %2u ctx %5u g %u t %u: %9.3f ms "
				"%6.2f GB/s of %6.2f (%.2f), prefetched 4k %6.2f, roofline %6.1f, plain loop %6.2f (contiguous %6.2f)  latency %4.0f ns  prefetches kept %4.1f  naive x%.0f  "
				"err %.1e  others %.2f%s\n",
				kva_dtype_name(c->dtype), c->head_dim, c->batch, c->context, c->group,
				c->threads, f.ms, f.gbps, f.ceiling_gbps, f.gbps / f.ceiling_gbps,
				f.scatter4k_pf_gbps, f.roofline_gbps, f.stream_gbps, f.sweep_arith_gbps,
				f.latency_ns,
				f.prefetch_kept,
				f.naive_ms / f.ms, f.max_rel_err, f.other_cpus,
				f.max_rel_err <= MAX_ERR ? "" : "  WRONG");
			if (!(f.max_rel_err <= MAX_ERR))
				*wrong = true;
		}
		batch_free(&b);
	}
	cache_free(&kc);
	return ret;
}

/* ------------------------------------------------------------ the GPU */

/*
 * --backend cuda: the same cache and batches, on a GPU. Each geometry's
 * arena is made and filled on the host as for the CPU, then its data region
 * is copied whole into one cuMemAlloc and the descriptor's pointers are
 * moved to the copy: the GPU reads the bytes the CPU reads, the int8 scales
 * kva_store_kv picked included. The page table, q and the fp8 scales are
 * copied too. The reference is kva_decode on the host over the arena with
 * the same arguments and options (the same split plan): one call of each,
 * compared element by element before anything is timed.
 *
 * Timing is the device's (events on the bench's stream): `reps` calls
 * queued back to back, `trials` times after a warm-up (the first call in a
 * context loads the kernels, and the stream-ordered pool grows), the median
 * per call. The ceiling is cuMemcpyDtoD of a buffer far larger than L2, one
 * copy after each decode trial, the fastest kept: a copy reads and writes,
 * so twice its size is counted. A read-only kernel would be the truer
 * ceiling of a decode, which only reads, but would need a module of the
 * bench's own; against a copy a decode may come out a little above 1.
 */
#define GPU_CEILING_BYTES (256ull << 20) /* at least; 8 x L2 where that is more */

struct gpu_figures {
	double ms, gbps, ceiling_gbps, max_abs_err, max_rel_err;
	uint32_t kernel_errors;
	unsigned reps;
};

/* what every configuration shares: the device and the ceiling's buffers */
struct gpu_setup {
	struct bench_gpu *g;
	void *ceiling_src, *ceiling_dst;
	size_t ceiling_bytes;
};

/* a cache's data region on the device, and the descriptor of that copy */
struct gpu_cache {
	void *data, *fp8_scale;
	struct kva_kv_desc kv;
};

struct gpu_batch {
	void *indptr, *indices, *last, *q, *out;
	struct kva_page_table pt;
};

static void gpu_cache_free(struct bench_gpu *g, struct gpu_cache *gc)
{
	bench_gpu_free(g, gc->data);
	bench_gpu_free(g, gc->fp8_scale);
	memset(gc, 0, sizeof(*gc));
}

/* @p, a pointer into the host's data region at @base, moved to the device's copy */
static const void *moved(const void *p, const uint8_t *base, uint64_t bytes, void *dev)
{
	const uint8_t *q = p;

	if (!p || q < base || q >= base + bytes)
		return NULL;
	return (const uint8_t *)dev + (q - base);
}

static int gpu_cache_make(struct bench_gpu *g, const struct kvcache *kc, struct gpu_cache *gc)
{
	const struct kva_arena_info *info = kva_arena_info(kc->arena);
	/* block 0's K page of layer 0 is where the data region starts */
	const uint8_t *base = (const uint8_t *)kva_block_data(kc->w, 0) -
		kva_kv_offset(&info->geometry, &info->layout, info->blocks, 0, 0, 0, 0);
	uint64_t bytes = info->layout.data_bytes;
	int ret;

	memset(gc, 0, sizeof(*gc));
	if ((ret = bench_gpu_alloc(g, bytes, &gc->data)) < 0 ||
	    (ret = bench_gpu_put(g, gc->data, base, bytes)) < 0)
		goto fail;
	gc->kv = kc->kv;
	gc->kv.k = moved(kc->kv.k, base, bytes, gc->data);
	gc->kv.v = moved(kc->kv.v, base, bytes, gc->data);
	if (kc->kv.dtype == KVA_INT8) {
		/* in the blocks, beside the values */
		gc->kv.k_scale = moved(kc->kv.k_scale, base, bytes, gc->data);
		gc->kv.v_scale = moved(kc->kv.v_scale, base, bytes, gc->data);
	} else if (kc->kv.dtype == KVA_FP8_E4M3) {
		size_t n = sizeof(float) * 2 * (size_t)kc->kv.num_kv_heads;

		if ((ret = bench_gpu_alloc(g, n, &gc->fp8_scale)) < 0 ||
		    (ret = bench_gpu_put(g, gc->fp8_scale, kc->fp8_scale, n)) < 0)
			goto fail;
		gc->kv.k_scale = gc->fp8_scale;
		gc->kv.v_scale = (const float *)gc->fp8_scale + kc->kv.num_kv_heads;
	}
	if (!gc->kv.k || !gc->kv.v ||
	    (kc->kv.dtype == KVA_INT8 && (!gc->kv.k_scale || !gc->kv.v_scale))) {
		fprintf(stderr, "decode: the arena's descriptor points outside its data region\n");
		ret = -EINVAL;
		goto fail;
	}
	return 0;
fail:
	gpu_cache_free(g, gc);
	return ret;
}

static void gpu_batch_free(struct bench_gpu *g, struct gpu_batch *gb)
{
	bench_gpu_free(g, gb->indptr);
	bench_gpu_free(g, gb->indices);
	bench_gpu_free(g, gb->last);
	bench_gpu_free(g, gb->q);
	bench_gpu_free(g, gb->out);
	memset(gb, 0, sizeof(*gb));
}

/* @b's page table and q on the device, and room for out */
static int gpu_batch_make(struct bench_gpu *g, const struct config *c, const struct batch *b,
			  struct gpu_batch *gb)
{
	size_t seqs = sizeof(int32_t) * c->batch;
	size_t pages = sizeof(int32_t) * c->batch * (size_t)pages_of(c->context);
	size_t qn = sizeof(float) * c->batch * (size_t)b->q_heads * c->head_dim;
	int ret;

	memset(gb, 0, sizeof(*gb));
	if ((ret = bench_gpu_alloc(g, seqs + sizeof(int32_t), &gb->indptr)) < 0 ||
	    (ret = bench_gpu_alloc(g, pages, &gb->indices)) < 0 ||
	    (ret = bench_gpu_alloc(g, seqs, &gb->last)) < 0 ||
	    (ret = bench_gpu_alloc(g, qn, &gb->q)) < 0 ||
	    (ret = bench_gpu_alloc(g, qn, &gb->out)) < 0 ||
	    (ret = bench_gpu_put(g, gb->indptr, b->indptr, seqs + sizeof(int32_t))) < 0 ||
	    (ret = bench_gpu_put(g, gb->indices, b->indices, pages)) < 0 ||
	    (ret = bench_gpu_put(g, gb->last, b->last, seqs)) < 0 ||
	    (ret = bench_gpu_put(g, gb->q, b->q, qn)) < 0) {
		gpu_batch_free(g, gb);
		return ret;
	}
	gb->pt = (struct kva_page_table){ (int32_t)c->batch, PAGE_TOKENS, gb->indptr, gb->indices,
					  gb->last };
	return 0;
}

static int gpu_decode_call(struct bench_gpu *g, const struct config *c, const struct batch *b,
			   const struct gpu_cache *gc, const struct gpu_batch *gb)
{
	/* the options of the reference's call (decode_call): the same split plan */
	struct kva_decode_opts o = { .threads = (int32_t)c->threads, .isa = KVA_ISA_AUTO };
	int ret = kva_decode_cuda(&gc->kv, &gb->pt, gb->q, KVA_F32, (int32_t)b->q_heads,
				  1.0f / sqrtf((float)c->head_dim), gb->out, NULL, &o,
				  bench_gpu_stream(g));

	if (ret < 0)
		fprintf(stderr, "decode: kva_decode_cuda: %s (%s)\n", strerror(-ret), kva_errmsg());
	return ret;
}

/*
 * gpu_check - one call on each side, and how far apart they are: the
 * largest |gpu - cpu| of any element, and the largest over the (sequence,
 * query head) rows of max |gpu - cpu| / max |cpu| (measure_naive's error);
 * infinity if an output is not finite. Also the bits the kernels set.
 */
static int gpu_check(struct bench_gpu *g, const struct config *c, const struct kvcache *kc,
		     struct batch *b, const struct gpu_cache *gc, const struct gpu_batch *gb,
		     struct gpu_figures *f)
{
	size_t rows = (size_t)c->batch * b->q_heads;
	double abs_err = 0.0, rel_err = 0.0;
	int ret;

	if ((ret = decode_call(c, kc, b, KVA_ISA_AUTO)) < 0 ||
	    (ret = gpu_decode_call(g, c, b, gc, gb)) < 0 ||
	    (ret = bench_gpu_get(g, b->ref, gb->out, sizeof(float) * rows * c->head_dim)) < 0)
		return ret;
	if ((ret = kva_cuda_take_errors(&f->kernel_errors)) < 0) {
		fprintf(stderr, "decode: kva_cuda_take_errors: %s (%s)\n", strerror(-ret),
			kva_errmsg());
		return ret;
	}
	for (size_t r = 0; r < rows; r++) {
		const float *gpu = b->ref + r * c->head_dim, *cpu = b->out + r * c->head_dim;
		double dmax = 0.0, rmax = 0.0;
		bool finite = true;

		for (uint32_t d = 0; d < c->head_dim; d++) {
			/* fmax() drops a NaN: a NaN anywhere must fail, so test it first */
			finite = finite && isfinite(gpu[d]) && isfinite(cpu[d]);
			dmax = fmax(dmax, fabs((double)gpu[d] - cpu[d]));
			rmax = fmax(rmax, fabs((double)cpu[d]));
		}
		if (!finite) {
			abs_err = rel_err = INFINITY;
			break;
		}
		abs_err = fmax(abs_err, dmax);
		rel_err = fmax(rel_err, rmax > 0.0 ? dmax / rmax : dmax);
	}
	f->max_abs_err = abs_err;
	f->max_rel_err = rel_err;
	return 0;
}

static int gpu_time_decode(struct bench_gpu *g, const struct config *c, const struct batch *b,
			   const struct gpu_cache *gc, const struct gpu_batch *gb, unsigned reps,
			   double *ns)
{
	int ret = bench_gpu_timer_start(g);

	for (unsigned k = 0; k < reps && ret == 0; k++)
		ret = gpu_decode_call(g, c, b, gc, gb);
	if (ret == 0 && (ret = bench_gpu_timer_stop(g, ns)) == 0)
		*ns /= reps;
	return ret;
}

static int gpu_time_ceiling(const struct gpu_setup *gr, double *ns)
{
	int ret;

	if ((ret = bench_gpu_timer_start(gr->g)) < 0 ||
	    (ret = bench_gpu_copy_async(gr->g, BENCH_GPU_DTOD, gr->ceiling_dst, gr->ceiling_src,
					gr->ceiling_bytes)) < 0)
		return ret;
	return bench_gpu_timer_stop(gr->g, ns);
}

static int gpu_measure(const struct gpu_setup *gr, const struct config *c, const struct kvcache *kc,
		       struct batch *b, const struct gpu_cache *gc, const struct gpu_batch *gb,
		       unsigned trials, struct gpu_figures *f)
{
	double dec[BENCH_MAX_TRIALS], best = INFINITY, once, copy;
	int ret;

	/* the check is the warm-up: kernels loaded, scratch pool grown */
	if ((ret = gpu_check(gr->g, c, kc, b, gc, gb, f)) < 0 ||
	    (ret = gpu_time_decode(gr->g, c, b, gc, gb, 1, &once)) < 0 ||
	    (ret = gpu_time_ceiling(gr, &copy)) < 0)
		return ret;
	f->reps = once >= MIN_TRIAL_NS ? 1 : (unsigned)ceil(MIN_TRIAL_NS / fmax(once, 1.0));
	if (f->reps > 10000)
		f->reps = 10000;
	for (unsigned t = 0; t < trials; t++) {
		if ((ret = gpu_time_decode(gr->g, c, b, gc, gb, f->reps, &dec[t])) < 0 ||
		    (ret = gpu_time_ceiling(gr, &copy)) < 0)
			return ret;
		best = fmin(best, copy);
	}
	f->ms = bench_median(dec, trials) / 1e6;
	f->gbps = (double)b->bytes / (f->ms * 1e6);
	f->ceiling_gbps = 2.0 * (double)gr->ceiling_bytes / best;
	return 0;
}

static int gpu_print_line(const struct gpu_setup *gr, const struct config *c, const struct batch *b,
			  const struct gpu_figures *f, unsigned trials, uint64_t arena_bytes)
{
	uint64_t l2 = bench_gpu_l2_bytes(gr->g);
	struct bench_line l;

	bench_line_begin(&l, "decode", "kvarena");
	bench_line_str(&l, "backend", "cuda");
	bench_line_text(&l, "device", bench_gpu_name(gr->g));
	bench_line_num(&l, "driver_version", bench_gpu_driver_version(gr->g), 0);
	bench_line_str(&l, "dtype", kva_dtype_name(c->dtype));
	bench_line_num(&l, "head_dim", c->head_dim, 0);
	bench_line_num(&l, "kv_heads", c->kv_heads, 0);
	bench_line_num(&l, "page_size", PAGE_TOKENS, 0);
	bench_line_num(&l, "batch", c->batch, 0);
	bench_line_num(&l, "context", c->context, 0);
	bench_line_num(&l, "group", c->group, 0);
	bench_line_str(&l, "q_dtype", "f32");
	bench_line_num(&l, "bytes", (double)b->bytes, 0);
	bench_line_num(&l, "arena_bytes", (double)arena_bytes, 0);
	bench_line_num(&l, "ms", f->ms, 4);
	bench_line_num(&l, "gbps", f->gbps, 2);
	bench_line_str(&l, "ceiling", "cuMemcpyDtoD");
	bench_line_num(&l, "ceiling_copy_bytes", (double)gr->ceiling_bytes, 0);
	bench_line_str(&l, "ceiling_counts", "read+write");
	bench_line_num(&l, "ceiling_gbps", f->ceiling_gbps, 2);
	bench_line_num(&l, "ratio", f->gbps / f->ceiling_gbps, 3);
	if (l2)
		bench_line_bool(&l, "cache_resident", b->bytes < 2 * l2);
	else
		bench_line_num(&l, "cache_resident", NAN, 0);
	bench_line_num(&l, "l2_bytes", l2 ? (double)l2 : NAN, 0);
	bench_line_str(&l, "reference", "kva_decode");
	bench_line_num(&l, "max_abs_err", f->max_abs_err, 9);
	bench_line_num(&l, "max_rel_err", f->max_rel_err, 9);
	bench_line_num(&l, "kernel_errors", f->kernel_errors, 0);
	bench_line_str(&l, "timing", "cuEventElapsedTime");
	bench_line_num(&l, "trials", trials, 0);
	bench_line_num(&l, "reps", f->reps, 0);
	return bench_line_print(&l);
}

/* every configuration of @g's geometry, on one cache, copied to the device */
static int gpu_run_geometry(const struct decode_opts *o, const struct gpu_setup *gr,
			    const struct config *g, uint64_t *rng, bool *wrong)
{
	struct kvcache kc;
	struct gpu_cache gc;
	uint64_t t0 = bench_now_ns();
	uint64_t arena_bytes;
	int ret;

	if ((ret = cache_make(g, arena_blocks(o, g), false, rng, &kc)) < 0)
		return ret;
	arena_bytes = kva_arena_info(kc.arena)->layout.data_bytes;
	if ((ret = gpu_cache_make(gr->g, &kc, &gc)) < 0) {
		fprintf(stderr, "decode: %.0f MiB of cache to the device: %s\n",
			(double)arena_bytes / (1 << 20), strerror(-ret));
		cache_free(&kc);
		return ret;
	}
	fprintf(stderr, "decode: %s, head_dim %u, %u KV heads: %u blocks (%.0f MiB) filled and "
		"copied to the device in %.1f s\n", kva_dtype_name(g->dtype), g->head_dim,
		g->kv_heads, kc.blocks, (double)arena_bytes / (1 << 20),
		(double)(bench_now_ns() - t0) / 1e9);
	for (unsigned i = 0; i < o->n && ret == 0; i++) {
		const struct config *c = &o->configs[i];
		struct gpu_figures f = { 0 };
		struct gpu_batch gb;
		struct batch b;
		bool bad;

		if (!same_geometry(c, g))
			continue;
		if ((ret = batch_make(c, &kc, rng, &b)) < 0)
			break;
		if ((ret = gpu_batch_make(gr->g, c, &b, &gb)) == 0) {
			ret = gpu_measure(gr, c, &kc, &b, &gc, &gb, o->trials, &f);
			gpu_batch_free(gr->g, &gb);
		}
		if (ret == 0)
			ret = gpu_print_line(gr, c, &b, &f, o->trials, arena_bytes);
		if (ret == 0) {
			bad = !(f.max_rel_err <= MAX_ERR) || f.kernel_errors;
			fprintf(stderr, "decode: %-8s hd %3u b %2u ctx %5u g %u: %9.4f ms %7.1f GB/s "
				"of %7.1f (%.2f)  err %.1e  kernel errors %#x%s\n",
				kva_dtype_name(c->dtype), c->head_dim, c->batch, c->context, c->group,
				f.ms, f.gbps, f.ceiling_gbps, f.gbps / f.ceiling_gbps, f.max_rel_err,
				f.kernel_errors, bad ? "  WRONG" : "");
			*wrong = *wrong || bad;
		}
		batch_free(&b);
	}
	gpu_cache_free(gr->g, &gc);
	cache_free(&kc);
	return ret;
}

/*
 * gpu_open - device o->device, for gpu_run. No GPU to measure (no driver,
 * the tests' stand-in, a library without kernels) is one line that says
 * so, and a run that did what it could. Return: 0 and *@out; 1, that line
 * printed; or -errno, told on stderr.
 */
static int gpu_open(const struct decode_opts *o, struct bench_gpu **out)
{
	char why[512];
	int ret = bench_gpu_open((int)o->device, out, why, sizeof(why));

	if (ret == -ENODEV)
		return bench_gpu_no_device("decode", "no device", why) < 0 ? -EIO : 1;
	if (ret < 0) {
		fprintf(stderr, "decode: --backend cuda: %s\n", why);
		return ret;
	}
	if ((ret = kva_cuda_available()) < 0) {
		/* this loader found a GPU; the library's did not, or has no kernels */
		ret = bench_gpu_no_device("decode", ret == -ENOTSUP ? "no kernels" : "no device",
					  kva_errmsg());
		bench_gpu_close(*out);
		*out = NULL;
		return ret < 0 ? -EIO : 1;
	}
	return 0;
}

/* the whole run on @g (closed at the end) */
static int gpu_run(const struct decode_opts *o, struct bench_gpu *g)
{
	struct gpu_setup gr = { .g = g };
	uint64_t rng = SEED, free_b = 0, total_b = 0, l2 = bench_gpu_l2_bytes(g);
	bool wrong = false;
	int ret;

	gr.ceiling_bytes = 8 * l2 > GPU_CEILING_BYTES ? 8 * l2 : GPU_CEILING_BYTES;
	if ((ret = bench_gpu_mem_info(g, &free_b, &total_b)) < 0)
		goto out;
	fprintf(stderr, "decode: GPU %d: %s, driver %d.%d, %.1f GiB free of %.1f, L2 %.0f MiB; "
		"ceiling: cuMemcpyDtoD of %.0f MiB\n", bench_gpu_ordinal(g), bench_gpu_name(g),
		bench_gpu_driver_version(g) / 1000, bench_gpu_driver_version(g) % 1000 / 10,
		(double)free_b / (1ull << 30), (double)total_b / (1ull << 30),
		(double)l2 / (1 << 20), (double)gr.ceiling_bytes / (1 << 20));
	if ((ret = bench_gpu_alloc(g, gr.ceiling_bytes, &gr.ceiling_src)) < 0 ||
	    (ret = bench_gpu_alloc(g, gr.ceiling_bytes, &gr.ceiling_dst)) < 0)
		goto out;
	for (unsigned i = 0; i < o->n && ret == 0; i++) {
		bool first = true;

		for (unsigned k = 0; k < i && first; k++)
			first = !same_geometry(&o->configs[k], &o->configs[i]);
		if (first)
			ret = gpu_run_geometry(o, &gr, &o->configs[i], &rng, &wrong);
	}
	if (ret == 0 && wrong) {
		fprintf(stderr, "decode: kva_decode_cuda's output differs from kva_decode's by more "
			"than %g, or its kernels reported errors: the figures above are of a wrong "
			"computation\n", MAX_ERR);
		ret = -EDOM;
	}
out:
	bench_gpu_free(g, gr.ceiling_src);
	bench_gpu_free(g, gr.ceiling_dst);
	bench_gpu_close(g);
	return ret;
}

static int run(const struct decode_opts *o)
{
	struct bench_readbw *rb = NULL;
	uint64_t rng = SEED, llc = llc_bytes();
	size_t max_bytes = 0;
	unsigned max_threads = 1;
	bool wrong = false;
	int ret;

	for (unsigned i = 0; i < o->n; i++) {
		size_t bytes = bytes_read(&o->configs[i]);

		max_bytes = bytes > max_bytes ? bytes : max_bytes;
		if (o->configs[i].threads > max_threads)
			max_threads = o->configs[i].threads;
	}
	if ((ret = bench_readbw_open(max_bytes, max_threads, SEED, &rb)) < 0) {
		fprintf(stderr, "decode: the read buffer (%zu bytes): %s\n", max_bytes, strerror(-ret));
		return ret;
	}
	for (unsigned i = 0; i < o->n && ret == 0; i++) {
		bool first = true;

		for (unsigned k = 0; k < i && first; k++)
			first = !same_geometry(&o->configs[k], &o->configs[i]);
		if (first)
			ret = run_geometry(o, &o->configs[i], rb, llc, &rng, &wrong);
	}
	bench_readbw_close(rb);
	if (ret == 0 && wrong) {
		fprintf(stderr, "decode: kva_decode's output differs from the naive decode's by "
			"more than %g: the figures above are of a wrong computation\n", MAX_ERR);
		return -EDOM;
	}
	return ret;
}

/* ------------------------------------------------------------ options */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvarena-bench decode [options]\n"
		"\n"
		"kva_decode over an arena's block-major pages (16 tokens, random order), with\n"
		"the read bandwidth of the same threads over the same bytes (the ceiling) and a\n"
		"naive scalar decode, all in this run. One JSON line per configuration.\n"
		"\n"
		"Default: f16, head_dim 128, 8 KV heads, batch 1,8,32 x context 1024,4096,16384\n"
		"x group 1,4,8 x threads 1,2; bf16, fp8_e4m3, int8 and f32 at batch 8, context\n"
		"4096, group 1,4,8, threads 1,2; f16 at head_dim 64, batch 8, context 4096,\n"
		"group 4, threads 1,2. Any of the options below that take lists replaces that\n"
		"list, and the run is then every combination (defaults: f16, 1,8,32,\n"
		"1024,4096,16384, 1,4,8, 1,2, head_dim 128, 8 KV heads).\n"
		"\n"
		"  --dtype LIST      f32, f16, bf16, fp8_e4m3, int8 (comma-separated)\n"
		"  --batch LIST      sequences per call, 1..4096\n"
		"  --context LIST    tokens per sequence, 1..1048576\n"
		"  --group LIST      query heads per KV head, 1..64\n"
		"  --threads LIST    kva_decode threads (and the ceiling's), 1..%u\n"
		"  --head-dim LIST   1..1024\n"
		"  --kv-heads LIST   1..64\n"
		"  --isa NAME        auto (default), scalar, avx2, avx512\n"
		"  --trials N        trials per median, 1..%u (default 7)\n"
		"  --arena-mib N     each arena's data at least N MiB (default %u; 0: what\n"
		"                    the batches need); a batch's blocks are scattered over it\n"
		"  --quick           one small configuration (f16, batch 2, context 200,\n"
		"                    group 4, threads 2, head_dim 64, 2 KV heads), 2 trials,\n"
		"                    --arena-mib 0; the options above change it\n"
		"  --hugepages       each arena on 2 MiB huge pages, as kvarena-agent\n"
		"                    --hugepages puts it, if the system's hugetlb pool has\n"
		"                    them (else ordinary pages; \"hugetlb\" says which);\n"
		"                    not with --backend cuda\n"
		"  --backend B       host (default): kva_decode as above; cuda: kva_decode_cuda\n"
		"                    over a copy of the arena in device memory, against\n"
		"                    cuMemcpyDtoD's bandwidth in the same run and checked\n"
		"                    against kva_decode (no --threads, no --isa). Without a\n"
		"                    GPU (no driver, or the tests' driver stand-in): one\n"
		"                    \"no device\" line, exit 0\n"
		"  --device N        cuda: the device ordinal (default 0)\n"
		"  --help            this text\n",
		MAX_THREADS, BENCH_MAX_TRIALS, DEFAULT_ARENA_MIB);
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvarena-bench decode: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n(kvarena-bench decode --help lists the options)\n");
	return -EINVAL;
}

struct list {
	uint32_t v[MAX_LIST];
	unsigned n;
};

/* a comma-separated list of numbers in [lo, hi] */
static int parse_list(const char *name, const char *s, uint32_t lo, uint32_t hi, struct list *out)
{
	char buf[256], *save = NULL;

	if (strlen(s) >= sizeof(buf))
		return usage_error("--%s: list too long", name);
	strcpy(buf, s);
	out->n = 0;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (out->n == MAX_LIST)
			return usage_error("--%s: at most %u values", name, MAX_LIST);
		if (bench_parse_u32(tok, lo, hi, &out->v[out->n]) < 0)
			return usage_error("--%s '%s': numbers from %u to %u", name, tok, lo, hi);
		out->n++;
	}
	if (!out->n)
		return usage_error("--%s: an empty list", name);
	return 0;
}

static int parse_dtypes(const char *s, struct list *out)
{
	char buf[256], *save = NULL;

	if (strlen(s) >= sizeof(buf))
		return usage_error("--dtype: list too long");
	strcpy(buf, s);
	out->n = 0;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		enum kva_dtype t;

		if (out->n == MAX_LIST)
			return usage_error("--dtype: at most %u values", MAX_LIST);
		if (kva_dtype_parse(tok, &t) < 0)
			return usage_error("--dtype '%s': f32, f16, bf16, fp8_e4m3 or int8", tok);
		out->v[out->n++] = (uint32_t)t;
	}
	if (!out->n)
		return usage_error("--dtype: an empty list");
	return 0;
}

enum dim { DTYPE, BATCH, CONTEXT, GROUP, THREADS, HEAD_DIM, KV_HEADS, DIMS };

static int add(struct decode_opts *o, enum kva_dtype dt, uint32_t hd, uint32_t kvh, uint32_t b,
	       uint32_t ctx, uint32_t g, uint32_t t)
{
	if (o->n == MAX_CONFIGS)
		return usage_error("more than %u configurations", MAX_CONFIGS);
	o->configs[o->n++] = (struct config){ .dtype = dt, .head_dim = hd, .kv_heads = kvh,
					      .batch = b, .context = ctx, .group = g, .threads = t };
	return 0;
}

/* every combination of the lists */
static int cross(struct decode_opts *o, const struct list l[DIMS])
{
	int ret = 0;

	for (unsigned a = 0; a < l[DTYPE].n; a++)
		for (unsigned hd = 0; hd < l[HEAD_DIM].n; hd++)
			for (unsigned kvh = 0; kvh < l[KV_HEADS].n; kvh++)
				for (unsigned b = 0; b < l[BATCH].n; b++)
					for (unsigned c = 0; c < l[CONTEXT].n; c++)
						for (unsigned g = 0; g < l[GROUP].n; g++)
							for (unsigned t = 0; t < l[THREADS].n && ret == 0; t++)
								ret = add(o, (enum kva_dtype)l[DTYPE].v[a],
									  l[HEAD_DIM].v[hd], l[KV_HEADS].v[kvh],
									  l[BATCH].v[b], l[CONTEXT].v[c],
									  l[GROUP].v[g], l[THREADS].v[t]);
	return ret;
}

/* the default run: the f16 grid, the other dtypes at the main shape, one head_dim 64 shape */
static int default_configs(struct decode_opts *o, const struct list l[DIMS])
{
	static const enum kva_dtype others[] = { KVA_BF16, KVA_FP8_E4M3, KVA_INT8, KVA_F32 };
	int ret = cross(o, l);

	for (unsigned k = 0; k < 4 && ret == 0; k++)
		for (unsigned g = 0; g < l[GROUP].n && ret == 0; g++)
			for (unsigned t = 0; t < l[THREADS].n && ret == 0; t++)
				ret = add(o, others[k], 128, 8, 8, 4096, l[GROUP].v[g], l[THREADS].v[t]);
	for (unsigned t = 0; t < l[THREADS].n && ret == 0; t++)
		ret = add(o, KVA_F16, 64, 8, 8, 4096, 4, l[THREADS].v[t]);
	return ret;
}

static int parse(int argc, char **argv, struct decode_opts *o)
{
	static const struct option longopts[] = {
		{ "dtype", required_argument, NULL, 'd' },
		{ "batch", required_argument, NULL, 'b' },
		{ "context", required_argument, NULL, 'c' },
		{ "group", required_argument, NULL, 'g' },
		{ "threads", required_argument, NULL, 't' },
		{ "head-dim", required_argument, NULL, 'D' },
		{ "kv-heads", required_argument, NULL, 'H' },
		{ "isa", required_argument, NULL, 'i' },
		{ "trials", required_argument, NULL, 'T' },
		{ "arena-mib", required_argument, NULL, 'A' },
		{ "quick", no_argument, NULL, 'q' },
		{ "hugepages", no_argument, NULL, 'P' },
		{ "backend", required_argument, NULL, 'B' },
		{ "device", required_argument, NULL, 'G' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct list l[DIMS] = {
		[DTYPE] = { { KVA_F16 }, 1 },
		[BATCH] = { { 1, 8, 32 }, 3 },
		[CONTEXT] = { { 1024, 4096, 16384 }, 3 },
		[GROUP] = { { 1, 4, 8 }, 3 },
		[THREADS] = { { 1, 2 }, 2 },
		[HEAD_DIM] = { { 128 }, 1 },
		[KV_HEADS] = { { 8 }, 1 },
	};
	static const struct list quick[DIMS] = {
		[DTYPE] = { { KVA_F16 }, 1 },
		[BATCH] = { { 2 }, 1 },
		[CONTEXT] = { { 200 }, 1 },
		[GROUP] = { { 4 }, 1 },
		[THREADS] = { { 2 }, 1 },
		[HEAD_DIM] = { { 64 }, 1 },
		[KV_HEADS] = { { 2 }, 1 },
	};
	bool given[DIMS] = { false };
	bool any = false;
	uint32_t trials = 0, arena_mib = DEFAULT_ARENA_MIB;
	bool arena_given = false, isa_given = false, device_given = false;
	enum dim d = DTYPE;
	int c, ret = 0;

	*o = (struct decode_opts){ .isa = KVA_ISA_AUTO };
	opterr = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		switch (c) {
		case 'd':
			ret = parse_dtypes(optarg, &l[d = DTYPE]);
			break;
		case 'b':
			ret = parse_list("batch", optarg, 1, 4096, &l[d = BATCH]);
			break;
		case 'c':
			ret = parse_list("context", optarg, 1, 1u << 20, &l[d = CONTEXT]);
			break;
		case 'g':
			ret = parse_list("group", optarg, 1, 64, &l[d = GROUP]);
			break;
		case 't':
			ret = parse_list("threads", optarg, 1, MAX_THREADS, &l[d = THREADS]);
			break;
		case 'D':
			ret = parse_list("head-dim", optarg, 1, 1024, &l[d = HEAD_DIM]);
			break;
		case 'H':
			ret = parse_list("kv-heads", optarg, 1, 64, &l[d = KV_HEADS]);
			break;
		case 'i':
			if (!strcmp(optarg, "auto"))
				o->isa = KVA_ISA_AUTO;
			else if (!strcmp(optarg, "scalar"))
				o->isa = KVA_ISA_SCALAR;
			else if (!strcmp(optarg, "avx2"))
				o->isa = KVA_ISA_AVX2;
			else if (!strcmp(optarg, "avx512"))
				o->isa = KVA_ISA_AVX512;
			else
				return usage_error("--isa '%s': auto, scalar, avx2 or avx512", optarg);
			isa_given = true;
			continue;
		case 'T':
			if (bench_parse_u32(optarg, 1, BENCH_MAX_TRIALS, &trials) < 0)
				return usage_error("--trials '%s': 1 to %u", optarg, BENCH_MAX_TRIALS);
			continue;
		case 'A':
			if (bench_parse_u32(optarg, 0, 1u << 20, &arena_mib) < 0)
				return usage_error("--arena-mib '%s': 0 to 1048576", optarg);
			arena_given = true;
			continue;
		case 'q':
			o->quick = true;
			continue;
		case 'P':
			o->hugepages = true;
			continue;
		case 'B':
			if (strcmp(optarg, "host") && strcmp(optarg, "cuda"))
				return usage_error("--backend '%s': host or cuda", optarg);
			o->cuda = !strcmp(optarg, "cuda");
			continue;
		case 'G':
			if (bench_parse_u32(optarg, 0, 1023, &o->device) < 0)
				return usage_error("--device '%s': an ordinal, 0 to 1023", optarg);
			device_given = true;
			continue;
		case 'h':
			return 1;
		case ':':
			return usage_error("option '%s' needs a value", argv[optind - 1]);
		default:
			return usage_error("unknown option '%s'", argv[optind - 1]);
		}
		if (ret < 0)
			return ret;
		given[d] = any = true;
	}
	if (optind < argc)
		return usage_error("unexpected argument '%s'", argv[optind]);
	if (o->quick)
		for (d = 0; d < DIMS; d++)
			if (!given[d])
				l[d] = quick[d];
	if (o->cuda) {
		if (given[THREADS] || isa_given)
			return usage_error("--threads and --isa are the CPU's: --backend cuda has "
					   "neither (its reference, kva_decode, takes the defaults)");
		/* one configuration per shape: threads 0 is kva_decode's default
		 * for the reference, and kva_decode_cuda ignores it */
		l[THREADS] = (struct list){ { 0 }, 1 };
		if (o->hugepages)
			return usage_error("--hugepages is for the host's arena: --backend cuda "
					   "decodes a copy of it in device memory");
	} else if (device_given) {
		return usage_error("--device is for --backend cuda");
	}
	o->trials = trials ? trials : o->quick ? 2 : 7;
	o->arena_mib = arena_given || !o->quick ? arena_mib : 0;
	o->configs = malloc(sizeof(*o->configs) * MAX_CONFIGS);
	if (!o->configs)
		return -ENOMEM;
	ret = any || o->quick ? cross(o, l) : default_configs(o, l);
	if (ret < 0) {
		free(o->configs);
		return ret;
	}
	return 0;
}

/*
 * check_memory - the largest arena (one is mapped at a time) and the read
 * buffer (as large as the largest batch's bytes, mapped for the whole run)
 * must fit in this machine's memory, with room to spare.
 */
static int check_memory(const struct decode_opts *o)
{
	double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
	double arena = 0, buffer = 0;

	for (unsigned i = 0; i < o->n; i++) {
		const struct config *c = &o->configs[i];

		arena = fmax(arena, (double)arena_blocks(o, c) * (double)block_bytes(c));
		/* the ceiling's read buffer is the CPU's: a GPU's copies its own memory */
		if (!o->cuda)
			buffer = fmax(buffer, (double)bytes_read(c));
	}
	if (phys > 0 && arena + buffer > 0.8 * phys)
		return usage_error("the largest arena (%.1f GiB) and read buffer (%.1f GiB) need "
				   "more memory than this machine should give", arena / (1 << 30),
				   buffer / (1 << 30));
	return 0;
}

int bench_decode_main(int argc, char **argv)
{
	struct bench_gpu *g = NULL;
	struct decode_opts o;
	int ret;

	if ((ret = parse(argc, argv, &o)) != 0) {
		if (ret > 0)
			usage(stdout);
		return ret > 0 ? 0 : ret == -EINVAL ? 2 : 1;
	}
	/* no GPU is a line and exit 0, whatever the configurations would need */
	if (o.cuda && (ret = gpu_open(&o, &g)) != 0) {
		free(o.configs);
		return ret > 0 ? 0 : 1;
	}
	if ((ret = check_memory(&o)) < 0) {
		bench_gpu_close(g);
		free(o.configs);
		return 2;
	}
	if (o.cuda) {
		fprintf(stderr, "decode: %u configurations, %u trials each, on GPU %u\n", o.n,
			o.trials, o.device);
		ret = gpu_run(&o, g);
	} else {
		fprintf(stderr, "decode: %u configurations, %u trials each, isa %s\n", o.n,
			o.trials, kva_isa_name(o.isa));
		ret = run(&o);
	}
	free(o.configs);
	if (ret < 0 && ret != -EDOM)
		fprintf(stderr, "kvarena-bench decode: failed: %s\n", strerror(-ret));
	return ret < 0 ? 1 : 0;
}
