/* SPDX-License-Identifier: MIT */
/*
 * bench_readbw.c - how fast this machine reads memory: the ceiling a
 * memory-bound kernel is judged against (`kvarena-bench decode`).
 *
 * Our own threads and our own read loop, nothing of libkvarena's, so that
 * the ceiling does not move when the library does. Each thread sums its
 * share of the buffer with the widest integer adds the CPU has (AVX-512,
 * else AVX2, else 64-bit scalar), eight independent accumulators so that
 * the adds never wait on one another and only the loads set the pace.
 * Integer adds: whatever bytes the buffer holds, no denormal can slow them.
 *
 * Patterns: the contiguous sweep (each thread one contiguous share), and
 * the buffer read as 4 KiB or 64 KiB chunks in a random order (each thread
 * a contiguous share of that order), which is how a paged KV cache is read:
 * an arena block holds one KV head's 16 tokens of K, then of V, in 4 KiB
 * (f16, head_dim 128) at a time, and the hardware prefetcher stops at a
 * 4 KiB page boundary. And the 4 KiB order again with software prefetches
 * as the tiles issue them (prefetcht1, a few lines at a time, spread over
 * the reads, a distance ahead in the thread's order): how fast a paged
 * layout's reads can be when they are prefetched, with nothing else to do.
 * And the same prefetched order read by a caller's function instead of
 * the sum (bench_readbw_run_over: the decode's arithmetic,
 * bench_roofline.c), to see what the reads and some work give together;
 * and by that function over the sweep's contiguous shares, in address order
 * (no paging, the hardware prefetchers' best case).
 *
 * The buffer is anonymous memory on 4 KiB pages (no madvise for huge
 * pages), as the arena's shared memory is when the system has no hugetlb
 * pool, so the ceiling pays the same TLB misses the kernel does.
 */
#include <errno.h>
#include <math.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <x86intrin.h>

#include "bench.h"
#include "tsc_x86.h"

#define MAX_THREADS 64u
#define PREFETCH_WAIT_NS 20000u /* 20 us: tens of memory latencies */

/* ------------------------------------------------------------- readers */

/*
 * Each reader in two instances: the plain sum, and the same loop with a
 * prefetcht1 of each line of @pf as it reads the line at the same offset of
 * @p (PF): the lines of the chunk a distance ahead, asked for a few at a
 * time while this chunk is read, as a tile spreads its prefetches over its
 * loops. PF is a constant in each instance, so the plain sum's loop is the
 * loop it always was.
 */
#define READER __attribute__((always_inline)) static inline

__attribute__((target("avx512f"))) READER uint64_t read_avx512(const char *p, const char *pf,
							       size_t len, const bool PF)
{
	__m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
		a6 = a0, a7 = a0;
	uint64_t lanes[8], tail = 0;

	for (; len >= 512; p += 512, pf += PF ? 512 : 0, len -= 512) {
		for (int l = 0; PF && l < 512; l += 64)
			_mm_prefetch(pf + l, _MM_HINT_T1);
		a0 = _mm512_add_epi64(a0, _mm512_loadu_si512((const void *)(p + 0)));
		a1 = _mm512_add_epi64(a1, _mm512_loadu_si512((const void *)(p + 64)));
		a2 = _mm512_add_epi64(a2, _mm512_loadu_si512((const void *)(p + 128)));
		a3 = _mm512_add_epi64(a3, _mm512_loadu_si512((const void *)(p + 192)));
		a4 = _mm512_add_epi64(a4, _mm512_loadu_si512((const void *)(p + 256)));
		a5 = _mm512_add_epi64(a5, _mm512_loadu_si512((const void *)(p + 320)));
		a6 = _mm512_add_epi64(a6, _mm512_loadu_si512((const void *)(p + 384)));
		a7 = _mm512_add_epi64(a7, _mm512_loadu_si512((const void *)(p + 448)));
	}
	for (; len; p++, len--)
		tail += (unsigned char)*p;
	a0 = _mm512_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)),
			      _mm512_add_epi64(_mm512_add_epi64(a4, a5), _mm512_add_epi64(a6, a7)));
	/* Not _mm512_reduce_add_epi64: its lanes are signed, and the sum is
	 * meant to wrap. */
	_mm512_storeu_si512((void *)lanes, a0);
	return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] +
	       lanes[7] + tail;
}

__attribute__((target("avx2"))) READER uint64_t read_avx2(const char *p, const char *pf,
							  size_t len, const bool PF)
{
	__m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
		a6 = a0, a7 = a0;
	uint64_t lanes[4], tail = 0;

	for (; len >= 256; p += 256, pf += PF ? 256 : 0, len -= 256) {
		for (int l = 0; PF && l < 256; l += 64)
			_mm_prefetch(pf + l, _MM_HINT_T1);
		a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(p + 0)));
		a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(p + 32)));
		a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(p + 64)));
		a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(p + 96)));
		a4 = _mm256_add_epi64(a4, _mm256_loadu_si256((const __m256i *)(p + 128)));
		a5 = _mm256_add_epi64(a5, _mm256_loadu_si256((const __m256i *)(p + 160)));
		a6 = _mm256_add_epi64(a6, _mm256_loadu_si256((const __m256i *)(p + 192)));
		a7 = _mm256_add_epi64(a7, _mm256_loadu_si256((const __m256i *)(p + 224)));
	}
	for (; len; p++, len--)
		tail += (unsigned char)*p;
	a0 = _mm256_add_epi64(_mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)),
			      _mm256_add_epi64(_mm256_add_epi64(a4, a5), _mm256_add_epi64(a6, a7)));
	_mm256_storeu_si256((__m256i *)lanes, a0);
	return lanes[0] + lanes[1] + lanes[2] + lanes[3] + tail;
}

READER uint64_t read_scalar(const char *p, const char *pf, size_t len, const bool PF)
{
	uint64_t a[8] = { 0 }, w, tail = 0;

	for (; len >= 64; p += 64, pf += PF ? 64 : 0, len -= 64) {
		if (PF)
			_mm_prefetch(pf, _MM_HINT_T1);
		for (int i = 0; i < 8; i++) {
			memcpy(&w, p + 8 * i, sizeof(w));
			a[i] += w;
		}
	}
	for (; len; p++, len--)
		tail += (unsigned char)*p;
	return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7] + tail;
}

__attribute__((target("avx512f"))) static uint64_t sum_avx512(const char *p, size_t len)
{
	return read_avx512(p, p, len, false);
}

__attribute__((target("avx512f"))) static uint64_t sum_pf_avx512(const char *p, const char *pf,
								 size_t len)
{
	return read_avx512(p, pf, len, true);
}

__attribute__((target("avx2"))) static uint64_t sum_avx2(const char *p, size_t len)
{
	return read_avx2(p, p, len, false);
}

__attribute__((target("avx2"))) static uint64_t sum_pf_avx2(const char *p, const char *pf,
							    size_t len)
{
	return read_avx2(p, pf, len, true);
}

static uint64_t sum_scalar(const char *p, size_t len)
{
	return read_scalar(p, p, len, false);
}

static uint64_t sum_pf_scalar(const char *p, const char *pf, size_t len)
{
	return read_scalar(p, pf, len, true);
}

/* --------------------------------------------------------------- team */

struct job {
	enum bench_read_pattern pattern;
	size_t bytes;
	unsigned threads, reps;
	uint32_t ahead; /* BENCH_READ_4K_PF and the _ARITHs: chunks between a read and its prefetch */
	bench_chunk_fn fn; /* the _ARITHs: what reads a chunk */
	void *ctx;
};

struct bench_readbw {
	char *buf;
	size_t size;
	uint64_t (*sum)(const char *p, size_t len);
	uint64_t (*sum_pf)(const char *p, const char *pf, size_t len);
	const char *isa;
	uint64_t rng;
	/* the chunk orders for the size last prepared */
	size_t prepared;
	uint32_t *order[3], chunks[3];
	/* helpers 1..helpers (the caller is thread 0). Under lock: job, gen,
	 * running and quit, written by the caller, read by the helpers. */
	pthread_mutex_t lock;
	pthread_cond_t go, done;
	struct job job;
	uint64_t gen;
	unsigned running, helpers;
	bool quit;
	pthread_t tid[MAX_THREADS];
	uint64_t sink[MAX_THREADS]; /* what each thread summed: the reads are used */
};

static const size_t chunk_bytes[3] = { 0, 4096, 65536 };

/* thread @t's part of one pass: a contiguous share of the bytes, or of the chunk order */
static uint64_t pass(struct bench_readbw *r, const struct job *j, unsigned t)
{
	uint64_t s = 0;

	if (j->pattern == BENCH_READ_SWEEP) {
		/* shares on 64-byte boundaries: no cache line read by two threads */
		size_t lines = (j->bytes + 63) / 64;
		size_t from = lines * t / j->threads * 64, to = lines * (t + 1) / j->threads * 64;

		if (to > j->bytes)
			to = j->bytes;
		return from < to ? r->sum(r->buf + from, to - from) : 0;
	}
	if (j->pattern == BENCH_READ_4K_PF || j->pattern == BENCH_READ_4K_ARITH ||
	    j->pattern == BENCH_READ_SWEEP_ARITH) {
		/* BENCH_READ_4K's order and share (or, contiguous, the chunks
		 * in address order), its whole chunks only (a last partial one
		 * is skipped: a multiple of 64 bytes is what the readers
		 * prefetch for); the first chunks' lines asked for before the
		 * first read, as a tile asks for its first block's before it
		 * starts */
		const bool contig = j->pattern == BENCH_READ_SWEEP_ARITH;
		const uint32_t *order = r->order[BENCH_READ_4K], n = r->chunks[BENCH_READ_4K];
		const uint32_t from = (uint32_t)((uint64_t)n * t / j->threads),
			       to = (uint32_t)((uint64_t)n * (t + 1) / j->threads);
		const uint32_t whole = (uint32_t)(j->bytes / 4096); /* chunks below it are whole */
#define AT(i) (contig ? (i) : order[i])

		for (uint32_t i = from; i < to && i < from + j->ahead; i++)
			for (size_t l = 0; l < 4096 && AT(i) < whole; l += 64)
				_mm_prefetch(r->buf + (size_t)AT(i) * 4096 + l, _MM_HINT_T1);
		for (uint32_t i = from; i < to; i++) {
			const char *p = r->buf + (size_t)AT(i) * 4096;
			/* past the share's end, or a partial chunk ahead: the
			 * chunk being read (no line of anyone else's share, and
			 * none past the bytes, is asked for) */
			const uint32_t k = i + j->ahead;
			const char *pf = k < to && AT(k) < whole ? r->buf + (size_t)AT(k) * 4096 : p;

			if (AT(i) >= whole)
				continue;
			if (j->pattern != BENCH_READ_4K_PF)
				j->fn(j->ctx, t, p, pf, 4096);
			else
				s += r->sum_pf(p, pf, 4096);
		}
#undef AT
		return s;
	}
	size_t cb = chunk_bytes[j->pattern];
	uint32_t n = r->chunks[j->pattern];
	const uint32_t *order = r->order[j->pattern];

	for (uint32_t i = (uint32_t)((uint64_t)n * t / j->threads);
	     i < (uint32_t)((uint64_t)n * (t + 1) / j->threads); i++) {
		size_t off = (size_t)order[i] * cb, len = j->bytes - off < cb ? j->bytes - off : cb;

		s += r->sum(r->buf + off, len);
	}
	return s;
}

static void work(struct bench_readbw *r, const struct job *j, unsigned t)
{
	uint64_t s = 0;

	for (unsigned k = 0; k < j->reps; k++)
		s += pass(r, j, t);
	r->sink[t] += s;
}

struct helper_arg {
	struct bench_readbw *r;
	unsigned index;
};

static void *helper_main(void *arg)
{
	struct helper_arg h = *(struct helper_arg *)arg;
	struct bench_readbw *r = h.r;
	uint64_t seen = 0;

	free(arg);
	pthread_mutex_lock(&r->lock);
	for (;;) {
		struct job j;

		/* asleep, not spinning, between jobs: an idle helper must not
		 * take a CPU from the kernel measured in between */
		while (!r->quit && r->gen == seen)
			pthread_cond_wait(&r->go, &r->lock);
		if (r->quit)
			break;
		seen = r->gen;
		j = r->job;
		if (h.index >= j.threads)
			continue;
		pthread_mutex_unlock(&r->lock);
		work(r, &j, h.index);
		pthread_mutex_lock(&r->lock);
		if (--r->running == 0)
			pthread_cond_signal(&r->done);
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

/* ---------------------------------------------------------------- API */

void bench_readbw_close(struct bench_readbw *r)
{
	if (!r)
		return;
	pthread_mutex_lock(&r->lock);
	r->quit = true;
	pthread_cond_broadcast(&r->go);
	pthread_mutex_unlock(&r->lock);
	for (unsigned k = 1; k <= r->helpers; k++)
		pthread_join(r->tid[k], NULL);
	pthread_mutex_destroy(&r->lock);
	pthread_cond_destroy(&r->go);
	pthread_cond_destroy(&r->done);
	for (int p = 0; p < 3; p++)
		free(r->order[p]);
	if (r->buf)
		munmap(r->buf, r->size);
	free(r);
}

int bench_readbw_open(size_t max_bytes, unsigned max_threads, uint64_t seed,
		      struct bench_readbw **out)
{
	struct bench_readbw *r;
	int ret = 0;

	if (!max_bytes || !max_threads || max_threads > MAX_THREADS || !out)
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->go, NULL);
	pthread_cond_init(&r->done, NULL);
	r->rng = seed | 1;
	r->size = max_bytes;
	r->buf = mmap(NULL, max_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r->buf == MAP_FAILED) {
		r->buf = NULL;
		ret = -errno;
		goto fail;
	}
	/*
	 * Every page backed by its own memory (an untouched page would read
	 * the shared zero page, from cache), and every element finite and
	 * normal in each dtype, for BENCH_READ_4K_ARITH's arithmetic (a
	 * denormal would cost some cores an assist an FMA): each 16 bits
	 * 0x38xx or 0x39xx with a low byte below 0x40, as bench_roofline's
	 * buffer (halves about 0.5, bf16 about 2^-15, f32 about 2^-14, fp8
	 * bytes below 0x40 or 0x38-0x39).
	 */
	for (size_t i = 0; i < max_bytes; i += sizeof(uint64_t)) {
		uint64_t x = bench_rand(&r->rng) & 0x013f013f013f013full;

		x |= 0x3800380038003800ull;
		memcpy(r->buf + i, &x, max_bytes - i < sizeof(x) ? max_bytes - i : sizeof(x));
	}
	if (__builtin_cpu_supports("avx512f")) {
		r->sum = sum_avx512;
		r->sum_pf = sum_pf_avx512;
		r->isa = "avx512";
	} else if (__builtin_cpu_supports("avx2")) {
		r->sum = sum_avx2;
		r->sum_pf = sum_pf_avx2;
		r->isa = "avx2";
	} else {
		r->sum = sum_scalar;
		r->sum_pf = sum_pf_scalar;
		r->isa = "scalar";
	}
	for (unsigned k = 1; k < max_threads; k++) {
		struct helper_arg *h = malloc(sizeof(*h));

		if (!h) {
			ret = -ENOMEM;
			goto fail;
		}
		*h = (struct helper_arg){ r, k };
		if ((ret = -pthread_create(&r->tid[k], NULL, helper_main, h)) < 0) {
			free(h);
			goto fail;
		}
		r->helpers = k;
	}
	*out = r;
	return 0;
fail:
	bench_readbw_close(r);
	return ret;
}

const char *bench_readbw_isa(const struct bench_readbw *r)
{
	return r->isa;
}

/* the chunk orders for @bytes: a random permutation of its chunks, per chunk size */
static int prepare(struct bench_readbw *r, size_t bytes)
{
	if (r->prepared == bytes)
		return 0;
	r->prepared = 0;
	for (int p = BENCH_READ_4K; p <= BENCH_READ_64K; p++) {
		size_t n = (bytes + chunk_bytes[p] - 1) / chunk_bytes[p];
		uint32_t *o;

		if (n > UINT32_MAX)
			return -EOVERFLOW;
		o = realloc(r->order[p], n * sizeof(*o));
		if (!o)
			return -ENOMEM;
		r->order[p] = o;
		r->chunks[p] = (uint32_t)n;
		for (uint32_t i = 0; i < n; i++)
			o[i] = i;
		for (uint32_t i = (uint32_t)n - 1; i > 0; i--) {
			uint32_t k = (uint32_t)(bench_rand(&r->rng) % (i + 1)), x = o[i];

			o[i] = o[k];
			o[k] = x;
		}
	}
	r->prepared = bytes;
	return 0;
}

static int run_job(struct bench_readbw *r, struct job j, uint64_t *elapsed_ns)
{
	uint64_t t0;
	int ret;

	if (j.pattern != BENCH_READ_SWEEP && (ret = prepare(r, j.bytes)) < 0)
		return ret;
	t0 = bench_now_ns();
	if (j.threads > 1) {
		pthread_mutex_lock(&r->lock);
		r->job = j;
		r->running = j.threads - 1;
		r->gen++;
		pthread_cond_broadcast(&r->go);
		pthread_mutex_unlock(&r->lock);
	}
	work(r, &j, 0);
	if (j.threads > 1) {
		pthread_mutex_lock(&r->lock);
		while (r->running)
			pthread_cond_wait(&r->done, &r->lock);
		pthread_mutex_unlock(&r->lock);
	}
	*elapsed_ns = bench_now_ns() - t0;
	return 0;
}

int bench_readbw_run(struct bench_readbw *r, enum bench_read_pattern pattern, size_t bytes,
		     unsigned threads, unsigned reps, uint64_t *elapsed_ns)
{
	if (!r || !bytes || bytes > r->size || !threads || threads > r->helpers + 1 || !reps ||
	    pattern > BENCH_READ_64K || !elapsed_ns)
		return -EINVAL;
	return run_job(r, (struct job){ .pattern = pattern, .bytes = bytes, .threads = threads,
					 .reps = reps },
		       elapsed_ns);
}

int bench_readbw_run_prefetched(struct bench_readbw *r, size_t bytes, size_t distance,
				unsigned threads, unsigned reps, uint64_t *elapsed_ns)
{
	if (!r || bytes < 4096 || bytes > r->size || !distance || distance % 4096 || !threads ||
	    threads > r->helpers + 1 || !reps || !elapsed_ns)
		return -EINVAL;
	return run_job(r, (struct job){ .pattern = BENCH_READ_4K_PF, .bytes = bytes,
					 .threads = threads, .reps = reps,
					 .ahead = (uint32_t)(distance / 4096) },
		       elapsed_ns);
}

int bench_readbw_run_over(struct bench_readbw *r, size_t bytes, size_t distance, bool contiguous,
			  unsigned threads, unsigned reps, bench_chunk_fn fn, void *ctx,
			  uint64_t *elapsed_ns)
{
	if (!r || bytes < 4096 || bytes > r->size || !distance || distance % 4096 || !threads ||
	    threads > r->helpers + 1 || !reps || !fn || !elapsed_ns)
		return -EINVAL;
	return run_job(r, (struct job){ .pattern = contiguous ? BENCH_READ_SWEEP_ARITH
							       : BENCH_READ_4K_ARITH,
					 .bytes = bytes,
					 .threads = threads, .reps = reps,
					 .ahead = (uint32_t)(distance / 4096), .fn = fn, .ctx = ctx },
		       elapsed_ns);
}

int bench_readbw_latency(struct bench_readbw *r, size_t bytes, uint32_t loads, double *ns)
{
	const uint32_t *order;
	uint32_t n = 0;
	uint64_t t0, *saved;
	char **line, *p;
	int ret;

	if (!r || bytes < 4096 || bytes > r->size || !loads || !ns)
		return -EINVAL;
	if ((ret = prepare(r, bytes)) < 0)
		return ret;
	line = malloc(sizeof(*line) * loads);
	saved = malloc(sizeof(*saved) * loads);
	if (!line || !saved) {
		free(line);
		free(saved);
		return -ENOMEM;
	}
	/* a random line in each of the first whole chunks of the random 4 KiB
	 * order: distinct lines, so the chain is one cycle through them all */
	order = r->order[BENCH_READ_4K];
	for (uint32_t i = 0; i < r->chunks[BENCH_READ_4K] && n < loads; i++)
		if ((size_t)order[i] * 4096 + 4096 <= bytes)
			line[n++] = r->buf + (size_t)order[i] * 4096 + bench_rand(&r->rng) % 64 * 64;
	if (!n) { /* never: bytes >= 4096 leaves chunk 0 whole */
		free(line);
		free(saved);
		return -EINVAL;
	}
	/* the lines' own bytes put back after: the buffer stays finite
	 * elements for BENCH_READ_4K_ARITH (a pointer's bytes are not) */
	for (uint32_t i = 0; i < n; i++) {
		memcpy(&saved[i], line[i], sizeof(saved[i]));
		memcpy(line[i], &line[(i + 1) % n], sizeof(char *));
	}
	/* the lines were just written: read the bytes once, so that what is
	 * still cached is what a pass over them leaves (all of it, if they
	 * fit in the cache; the last of them, if not) */
	r->sink[0] += r->sum(r->buf, bytes);
	/* each load's address is the one before's value: nothing overlaps.
	 * @loads of them, round the cycle again where the bytes have fewer
	 * chunks, so that a small buffer's figure is not the clock's grain */
	p = line[0];
	t0 = bench_now_ns();
	for (uint32_t i = 0; i < loads; i++) {
		char *next;

		memcpy(&next, p, sizeof(next));
		p = next;
	}
	*ns = (double)(bench_now_ns() - t0) / loads;
	r->sink[0] += (uintptr_t)p;
	for (uint32_t i = 0; i < n; i++)
		memcpy(line[i], &saved[i], sizeof(saved[i]));
	free(line);
	free(saved);
	return 0;
}

/* --------------------------------------------------- software prefetches */

/*
 * Round @k's @n target lines: a random line in each of @n chunks of the 4
 * KiB order that lie wholly in the first @bytes (distinct chunks, so
 * distinct lines), their pages in the TLB and the lines themselves in no
 * cache. The TLB is warmed through another line of each page, half a page
 * away, so that no prefetcher of the machine's takes the target for a
 * neighbour.
 */
static void cold_lines(struct bench_readbw *r, size_t bytes, unsigned k, unsigned n,
		       const char **line)
{
	const uint32_t *order = r->order[BENCH_READ_4K];
	uint32_t chunks = (uint32_t)(bytes / 4096), at = (uint32_t)(k * n) % chunks;
	unsigned got = 0;

	for (uint32_t seen = 0; got < n && seen < r->chunks[BENCH_READ_4K]; seen++) {
		uint32_t c = order[(at + seen) % r->chunks[BENCH_READ_4K]];
		unsigned l = (unsigned)(bench_rand(&r->rng) % 64);

		if (c >= chunks)
			continue;
		line[got] = r->buf + (size_t)c * 4096 + l * 64;
		r->sink[0] += (unsigned char)r->buf[(size_t)c * 4096 + (l + 32) % 64 * 64];
		got++;
	}
	for (unsigned i = 0; i < n; i++)
		_mm_clflush(line[i]);
	_mm_mfence();
}

int bench_readbw_prefetch_kept(struct bench_readbw *r, size_t bytes, unsigned burst,
			       unsigned rounds, double *kept)
{
	const char **line;
	double *cold, *hot, cold_ticks, hot_ticks, limit;
	uint64_t missed = 0;
	int ret;

	if (!r || !burst || !rounds || !kept || bytes > r->size || bytes / 4096 < burst)
		return -EINVAL;
	if ((ret = prepare(r, bytes)) < 0)
		return ret;
	line = malloc(sizeof(*line) * burst);
	cold = malloc(sizeof(*cold) * burst);
	hot = malloc(sizeof(*hot) * burst);
	if (!line || !cold || !hot) {
		ret = -ENOMEM;
		goto out;
	}
	/* what a load costs from memory and from the cache, on this machine
	 * and in its time stamp counter's ticks: the midpoint tells them apart */
	cold_lines(r, bytes, 0, burst, line);
	for (unsigned i = 0; i < burst; i++) {
		cold[i] = (double)kva__timed_load(line[i]);
		hot[i] = (double)kva__timed_load(line[i]);
	}
	cold_ticks = bench_median(cold, burst);
	hot_ticks = bench_median(hot, burst);
	if (!(cold_ticks >= 2 * hot_ticks)) {
		/* memory and cache look alike (a flush that did nothing, a
		 * machine under emulation): no count, rather than a wrong one */
		*kept = NAN;
		ret = 0;
		goto out;
	}
	limit = (cold_ticks + hot_ticks) / 2;
	for (unsigned k = 1; k <= rounds; k++) {
		uint64_t until;

		cold_lines(r, bytes, k, burst, line);
		for (unsigned i = 0; i < burst; i++)
			_mm_prefetch(line[i], _MM_HINT_T1); /* the tiles' hint */
		/* far longer than memory takes to answer: a prefetch kept has
		 * long arrived */
		until = bench_now_ns() + PREFETCH_WAIT_NS;
		while (bench_now_ns() < until)
			;
		for (unsigned i = 0; i < burst; i++)
			missed += (double)kva__timed_load(line[i]) > limit;
	}
	*kept = burst - (double)missed / rounds;
	ret = 0;
out:
	free(line);
	free(cold);
	free(hot);
	return ret;
}
