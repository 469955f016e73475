/* SPDX-License-Identifier: MIT */
/*
 * bench_roofline.c - how fast this machine's arithmetic could decode if
 * memory cost nothing: the arithmetic roofline `kvarena-bench decode`
 * prints beside the read ceiling, so that a compute-bound configuration is
 * held to what the instructions allow, and a memory-bound one to memory.
 *
 * What a decode must compute per element of the KV cache: K and V alike,
 * one conversion of the stored element to fp32 and `group` fused
 * multiply-adds (a score's dot product for each query head of the group,
 * or an output accumulation for each). The loop here does exactly that and
 * nothing else, over a buffer of stored elements that stays in L1 (16 KiB),
 * with the tiles' own conversion (kernels/load_x86.h),
 * 8 to 16 independent accumulators (at least an FMA's latency times its
 * issue width on any x86 core, so that only the issue rate sets the pace)
 * and the group's query vectors from L1, on `threads` threads of our own.
 * Past 8 query heads (AVX2) or 15 (AVX-512) the registers run out and an
 * element is converted again for each 8 or 15, as a kernel's would be;
 * the AVX-512 tile's sliced groups of 12 to 16 convert each element once
 * (K rows into fp32 first, broadcast from L1): for them the roofline
 * counts two conversions an element where the tile does one, and is not
 * a strict bound there (though the tile spends a broadcast load an FMA).
 * Per token and head a decode also reduces, exponentiates and rescales,
 * but that is `group` values against head_dim elements: left out, so that
 * the roofline is a bound no real kernel can pass.
 *
 * Its own threads and loop, like bench_readbw.c; only the conversions are
 * the tiles', so that a cheaper conversion in the tiles moves the bound
 * with them.
 *
 * The same arithmetic over memory (bench_arith_chunk): the loop's shapes
 * run over each 4 KiB chunk bench_readbw's prefetched order hands them,
 * asking for the lines ahead as they read. Not a bound but a peer: what a
 * kernel with the decode's FMAs and conversions and nothing else gets
 * where reads and arithmetic must overlap (`arith_stream_gbps`).
 */
#include <errno.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "bench_roofline.h"
#include "kernels_pvt.h" /* kva__esize */
#include "load_x86.h"

#define BUF_BYTES (16u << 10) /* in L1 on any x86 core */
#define MAX_THREADS 64u

/*
 * @passes passes over the buffer for heads [0, G), S vectors at a time:
 * each vector converted once and multiplied into its own G accumulators,
 * one per query head. The G query vectors, the S x G accumulators and the
 * vector converted last fit in the registers (an accumulator pushed out to
 * the stack would chain its FMAs through a store and a load; query vectors
 * as memory operands would make it two loads an FMA, more than a core
 * issues), with S x G as close to 12 as that allows, so that FMAs seldom
 * wait for one another. G, S and the dtype are constants in every
 * instance. The accumulators go to @sink, so that none of it is dead code.
 */
#define PASS_BODY(VEC, LOAD, ZERO, FMA, ADD, STORE, LOADQ)                                       \
	const size_t step = VEC * kva__esize(dt);                                                  \
	__typeof__(ZERO) a[S * G];                                                                \
                                                                                                  \
	for (int k = 0; k < S * G; k++)                                                           \
		a[k] = ZERO;                                                                      \
	for (unsigned r = 0; r < passes; r++)                                                     \
		for (const char *p = buf; p + S * step <= buf + BUF_BYTES; p += S * step)         \
			_Pragma("GCC unroll 16")                                                  \
			for (int v = 0; v < S; v++) {                                             \
				__typeof__(ZERO) x = LOAD(p + v * step, dt);                      \
                                                                                                  \
				_Pragma("GCC unroll 16")                                          \
				for (int g = 0; g < G; g++)                                       \
					a[v * G + g] = FMA(x, LOADQ(q + VEC * g), a[v * G + g]);  \
			}                                                                         \
	for (int k = 1; k < S * G; k++)                                                           \
		a[0] = ADD(a[0], a[k]);                                                           \
	STORE(sink, a[0])

#define AI __attribute__((always_inline)) static inline

/*
 * Each group's shape, the roofline's and the plain loop's: CALL(G, S) with
 * both constants. 16 ymm registers: S x G + G + 1 <= 16 (past G = 5, fewer
 * than 8 chains); 32 zmm: S x G + G + 1 <= 32. Past the largest G a group
 * is run in parts (part_heads).
 */
#define SHAPES_AVX2(G, CALL)                                                                      \
	switch (G) {                                                                              \
	case 1: CALL(1, 12); break;                                                               \
	case 2: CALL(2, 6); break;                                                                \
	case 3: CALL(3, 4); break;                                                                \
	case 4: CALL(4, 2); break;                                                                \
	case 5: CALL(5, 2); break;                                                                \
	case 6: CALL(6, 1); break;                                                                \
	case 7: CALL(7, 1); break;                                                                \
	default: CALL(8, 1); break;                                                               \
	}
#define SHAPES_AVX512(G, CALL)                                                                    \
	switch (G) {                                                                              \
	case 1: CALL(1, 12); break;                                                               \
	case 2: CALL(2, 6); break;                                                                \
	case 3: CALL(3, 4); break;                                                                \
	case 4: CALL(4, 3); break;                                                                \
	case 5: CALL(5, 3); break;                                                                \
	case 6: CALL(6, 2); break;                                                                \
	case 7: CALL(7, 2); break;                                                                \
	case 8: CALL(8, 2); break;                                                                \
	case 9: case 10: case 11: case 12: CALL(12, 1); break;                                    \
	default: CALL(15, 1); break;                                                              \
	}
/* the dtype a constant in each instance: CALL(D) */
#define DTYPES(dt, CALL)                                                                          \
	switch (dt) {                                                                             \
	case KVA_F16: CALL(KVA_F16); break;                                                       \
	case KVA_BF16: CALL(KVA_BF16); break;                                                     \
	case KVA_FP8_E4M3: CALL(KVA_FP8_E4M3); break;                                             \
	case KVA_INT8: CALL(KVA_INT8); break;                                                     \
	default: CALL(KVA_F32); break;                                                            \
	}

/* the most query heads one instance takes, and a vector's lanes */
static unsigned part_heads(enum kva_isa isa)
{
	return isa == KVA_ISA_AVX512 ? 15 : 8;
}

static unsigned lanes(enum kva_isa isa)
{
	return isa == KVA_ISA_AVX512 ? 16 : 8;
}

KVA__TARGET_AVX2 AI void pass_avx2_t(const char *buf, const float *q, unsigned passes, float *sink,
				const enum kva_dtype dt, const int G, const int S)
{
	PASS_BODY(8, kva__load8, _mm256_setzero_ps(), _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps,
		  _mm256_loadu_ps);
}

KVA__TARGET_AVX2 AI void pass_avx2_g(const char *buf, const float *q, unsigned passes, float *sink,
				const enum kva_dtype dt, unsigned G)
{
#define ONE(g, s) pass_avx2_t(buf, q, passes, sink, dt, g, s)
	SHAPES_AVX2(G, ONE)
#undef ONE
}

KVA__TARGET_AVX2 __attribute__((noinline)) static void pass_avx2(const char *buf, const float *q,
							    unsigned G, enum kva_dtype dt,
							    unsigned passes, float *sink)
{
#define ONE(d) pass_avx2_g(buf, q, passes, sink, d, G)
	DTYPES(dt, ONE)
#undef ONE
}

KVA__TARGET_AVX512 AI void pass_avx512_t(const char *buf, const float *q, unsigned passes,
				  float *sink, const enum kva_dtype dt, const int G, const int S)
{
	PASS_BODY(16, kva__load16, _mm512_setzero_ps(), _mm512_fmadd_ps, _mm512_add_ps,
		  _mm512_storeu_ps, _mm512_loadu_ps);
}

KVA__TARGET_AVX512 AI void pass_avx512_g(const char *buf, const float *q, unsigned passes,
				    float *sink, const enum kva_dtype dt, unsigned G)
{
#define ONE(g, s) pass_avx512_t(buf, q, passes, sink, dt, g, s)
	SHAPES_AVX512(G, ONE)
#undef ONE
}

KVA__TARGET_AVX512 __attribute__((noinline)) static void pass_avx512(const char *buf, const float *q,
								unsigned G, enum kva_dtype dt,
								unsigned passes, float *sink)
{
#define ONE(d) pass_avx512_g(buf, q, passes, sink, d, G)
	DTYPES(dt, ONE)
#undef ONE
}

/*
 * prefetcht1 of @p's line as an asm of an address, with no memory operand:
 * with _mm_prefetch (which gcc counts as a read of memory it cannot place)
 * the loop below kept its accumulators in registers but stored the whole
 * array every turn as well, and read the roofline's f16 group 8 at a third
 * of its rate from L2.
 */
AI void prefetch_t1(const char *p)
{
	__asm__ volatile("prefetcht1 (%0)" : : "r"(p));
}

/*
 * The lines of @pf that bytes [o, o + span) of a chunk start, asked for
 * (span a constant in each instance: no loop, no division). A span of 64
 * bytes or more starts a line at each 64 from o (and at most one more, the
 * line its last byte falls in, where o is not a line's start); a shorter
 * one starts the line of its last byte if that is not o - 1's.
 */
AI void prefetch_span(const char *pf, size_t o, const size_t span)
{
	if (span >= 64) {
		for (size_t l = 0; l < span; l += 64) /* constant bounds: unrolled */
			prefetch_t1(pf + o + l);
		if (span % 64)
			prefetch_t1(pf + o + span - 1);
	} else if (64 % span == 0) {
		if (!(o & 63))
			prefetch_t1(pf + o);
	} else if (!o || (o + span - 1) >> 6 != (o - 1) >> 6) {
		prefetch_t1(pf + o + span - 1);
	}
}

/*
 * The same arithmetic over memory (bench_arith_chunk, for bench_readbw's
 * pattern BENCH_READ_4K_ARITH): @len bytes at @buf, each vector converted
 * once and multiplied into its G accumulators as PASS_BODY does, and, with
 * PF, a prefetcht1 for each line of @pf at the offsets read as they are
 * first read (the lines a distance ahead, spread over the reads as the
 * tiles and BENCH_READ_4K_PF spread them): S vectors of a line or more ask
 * for each line they start; fewer, for the line their last byte starts, if
 * any (at most one). Whole turns of S vectors only: the caller gives what
 * is left past them to an instance of one vector a turn. The loops over S,
 * G and S x G are unrolled whole (S x G <= 16).
 */
#define CHUNK_BODY(VEC, LOAD, ZERO, FMA, ADD, STORE, LOADQ)                                      \
	const size_t step = VEC * kva__esize(dt), span = S * step;                            \
	const char *p = buf, *const end = buf + len;                                              \
	__typeof__(ZERO) a[S * G];                                                                \
                                                                                                  \
	_Pragma("GCC unroll 16")                                                                  \
	for (int k = 0; k < S * G; k++)                                                           \
		a[k] = ZERO;                                                                      \
	for (; p + span <= end; p += span) {                                                      \
		const size_t o = (size_t)(p - buf);                                               \
                                                                                                  \
		if (PF)                                                                           \
			prefetch_span(pf, o, span);                                               \
		_Pragma("GCC unroll 16")                                                          \
		for (int v = 0; v < S; v++) {                                                     \
			__typeof__(ZERO) x = LOAD(p + v * step, dt);                              \
                                                                                                  \
			_Pragma("GCC unroll 16")                                                  \
			for (int g = 0; g < G; g++)                                               \
				a[v * G + g] = FMA(x, LOADQ(q + VEC * g), a[v * G + g]);          \
		}                                                                                 \
	}                                                                                         \
	_Pragma("GCC unroll 16")                                                                  \
	for (int k = 1; k < S * G; k++)                                                           \
		a[0] = ADD(a[0], a[k]);                                                           \
	STORE(sink, a[0])

KVA__TARGET_AVX2 AI void chunk_avx2_s(const char *buf, const char *pf, size_t len, const float *q,
				      float *sink, const enum kva_dtype dt, const int G, const int S,
				      const bool PF)
{
	CHUNK_BODY(8, kva__load8, _mm256_setzero_ps(), _mm256_fmadd_ps, _mm256_add_ps,
		   _mm256_storeu_ps, _mm256_loadu_ps);
}

/* whole turns of S vectors, then what is left a vector at a time */
KVA__TARGET_AVX2 AI void chunk_avx2_t(const char *buf, const char *pf, size_t len, const float *q,
				      float *sink, const enum kva_dtype dt, const int G, const int S,
				      const bool PF)
{
	const size_t span = (size_t)S * 8 * kva__esize(dt), whole = len - len % span;

	chunk_avx2_s(buf, pf, whole, q, sink, dt, G, S, PF);
	if (S > 1 && whole < len)
		chunk_avx2_s(buf + whole, pf + whole, len - whole, q, sink + 8, dt, G, 1, PF);
}

KVA__TARGET_AVX2 AI void chunk_avx2_g(const char *buf, const char *pf, size_t len, const float *q,
				      float *sink, const enum kva_dtype dt, unsigned G,
				      const bool PF)
{
#define ONE(g, s) chunk_avx2_t(buf, pf, len, q, sink, dt, g, s, PF)
	SHAPES_AVX2(G, ONE)
#undef ONE
}

KVA__TARGET_AVX2 __attribute__((noinline)) static void
chunk_avx2(const char *buf, const char *pf, size_t len, const float *q, unsigned G,
	   enum kva_dtype dt, bool prefetch, float *sink)
{
	/* PF a constant in each instance: the loop asks for nothing without it */
#define WITH(d) chunk_avx2_g(buf, pf, len, q, sink, d, G, true)
#define WITHOUT(d) chunk_avx2_g(buf, pf, len, q, sink, d, G, false)
	if (prefetch)
		DTYPES(dt, WITH)
	else
		DTYPES(dt, WITHOUT)
#undef WITH
#undef WITHOUT
}

KVA__TARGET_AVX512 AI void chunk_avx512_s(const char *buf, const char *pf, size_t len,
					  const float *q, float *sink, const enum kva_dtype dt,
					  const int G, const int S, const bool PF)
{
	CHUNK_BODY(16, kva__load16, _mm512_setzero_ps(), _mm512_fmadd_ps, _mm512_add_ps,
		   _mm512_storeu_ps, _mm512_loadu_ps);
}

/* whole turns of S vectors, then what is left a vector at a time */
KVA__TARGET_AVX512 AI void chunk_avx512_t(const char *buf, const char *pf, size_t len,
					  const float *q, float *sink, const enum kva_dtype dt,
					  const int G, const int S, const bool PF)
{
	const size_t span = (size_t)S * 16 * kva__esize(dt), whole = len - len % span;

	chunk_avx512_s(buf, pf, whole, q, sink, dt, G, S, PF);
	if (S > 1 && whole < len)
		chunk_avx512_s(buf + whole, pf + whole, len - whole, q, sink + 16, dt, G, 1, PF);
}

KVA__TARGET_AVX512 AI void chunk_avx512_g(const char *buf, const char *pf, size_t len,
					  const float *q, float *sink, const enum kva_dtype dt,
					  unsigned G, const bool PF)
{
#define ONE(g, s) chunk_avx512_t(buf, pf, len, q, sink, dt, g, s, PF)
	SHAPES_AVX512(G, ONE)
#undef ONE
}

KVA__TARGET_AVX512 __attribute__((noinline)) static void
chunk_avx512(const char *buf, const char *pf, size_t len, const float *q, unsigned G,
	     enum kva_dtype dt, bool prefetch, float *sink)
{
	/* PF a constant in each instance: the loop asks for nothing without it */
#define WITH(d) chunk_avx512_g(buf, pf, len, q, sink, d, G, true)
#define WITHOUT(d) chunk_avx512_g(buf, pf, len, q, sink, d, G, false)
	if (prefetch)
		DTYPES(dt, WITH)
	else
		DTYPES(dt, WITHOUT)
#undef WITH
#undef WITHOUT
}

struct job {
	enum kva_isa isa;
	enum kva_dtype dt;
	unsigned group, passes;
	pthread_mutex_t lock;
	pthread_cond_t cv;
	unsigned ready; /* threads with their buffers filled */
	int go;         /* 1: start, -1: give up (a thread could not be made) */
	float sink[MAX_THREADS][16];
};

struct worker {
	struct job *j;
	unsigned index;
	int cpu; /* the CPU it runs on, or -1: wherever it is put */
};

static void run_one(struct job *j, unsigned index)
{
	_Alignas(64) char buf[BUF_BYTES];
	/* on lines of their own: a vector across two lines is two loads */
	float *q = aligned_alloc(64, sizeof(float) * 16 * (j->group ? j->group : 1));
	uint64_t x = 0x9e3779b97f4a7c15ull * (index + 1);
	int go;

	/* finite values in every dtype, none a NaN: halves of 0x38xx (about
	 * 0.5), bf16 of the same bits (about 2^-15), fp8 bytes below 0x40,
	 * int8 whatever they are; f32 is filled apart */
	for (size_t i = 0; i < BUF_BYTES; i += 2) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		buf[i] = (char)(x & 0x3f);
		buf[i + 1] = (char)(0x38 | (x >> 8 & 1));
	}
	if (j->dt == KVA_F32)
		for (size_t i = 0; i < BUF_BYTES; i += 4)
			*(float *)(void *)(buf + i) = 1.0f + (float)(i & 0xff) / 256.0f;
	for (unsigned g = 0; g < 16 * (j->group ? j->group : 1); g++)
		if (q)
			q[g] = 1.0f / (float)(g + 1);
	/* asleep until the word, not spinning: see bench_roofline() */
	pthread_mutex_lock(&j->lock);
	j->ready++;
	pthread_cond_broadcast(&j->cv);
	while (!j->go)
		pthread_cond_wait(&j->cv, &j->lock);
	go = j->go;
	pthread_mutex_unlock(&j->lock);
	if (q && go > 0) {
		/* a group beyond what the registers hold, in parts that each
		 * convert the element again, as a kernel would */
		const unsigned most = part_heads(j->isa), vec = lanes(j->isa);

		for (unsigned g0 = 0; g0 < j->group; g0 += most) {
			unsigned n = j->group - g0 < most ? j->group - g0 : most;

			if (j->isa == KVA_ISA_AVX512)
				pass_avx512(buf, q + vec * g0, n, j->dt, j->passes, j->sink[index]);
			else
				pass_avx2(buf, q + vec * g0, n, j->dt, j->passes, j->sink[index]);
		}
	}
	free(q);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	if (w->cpu >= 0) {
		cpu_set_t one;

		CPU_ZERO(&one);
		CPU_SET(w->cpu, &one);
		/* if it cannot be pinned, it runs where it is put */
		(void)pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
	}
	run_one(w->j, w->index);
	return NULL;
}

/*
 * How many of @c's hardware-thread siblings (its core's CPUs) that we may
 * run on come before it: 0 for the first CPU of each core. Read from
 * sysfs ("0-1", "0,64", "5"); 0 if it cannot be read.
 */
static unsigned sibling_rank(int c, const cpu_set_t *allowed)
{
	char path[96], buf[256];
	unsigned rank = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list",
		 c);
	if (!(f = fopen(path, "r")))
		return 0;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = '\0';
	fclose(f);
	for (char *p = buf;;) {
		char *e;
		long a = strtol(p, &e, 10), b = a;

		if (e == p)
			break;
		if (*e == '-') {
			p = e + 1;
			b = strtol(p, &e, 10);
			if (e == p)
				break;
		}
		for (long s = a < 0 ? 0 : a; s <= b && s < c; s++) /* s < c < CPU_SETSIZE */
			rank += CPU_ISSET((int)s, allowed) != 0;
		if (*e != ',')
			break;
		p = e + 1;
	}
	return rank;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int bench_roofline(enum kva_isa isa, enum kva_dtype dt, unsigned group, unsigned threads,
		   uint64_t bytes_per_thread, double *gbps)
{
	struct worker w[MAX_THREADS];
	pthread_t tid[MAX_THREADS];
	struct job *j;
	cpu_set_t allowed;
	unsigned rank[CPU_SETSIZE];
	int cpu[MAX_THREADS];
	unsigned started = 0, ncpu = 0;
	uint64_t t0, t1;
	int ret = 0;

	if ((isa != KVA_ISA_AVX2 && isa != KVA_ISA_AVX512) || !threads || threads > MAX_THREADS ||
	    !group || !kva_dtype_size(dt))
		return -EINVAL;
	if (!(j = calloc(1, sizeof(*j))))
		return -ENOMEM;
	pthread_mutex_init(&j->lock, NULL);
	pthread_cond_init(&j->cv, NULL);
	j->isa = isa;
	j->dt = dt;
	j->group = group;
	j->passes = (unsigned)((bytes_per_thread + BUF_BYTES - 1) / BUF_BYTES);
	if (!j->passes)
		j->passes = 1;
	/*
	 * Each thread on a CPU of its own: left to the scheduler, the threads
	 * of a 2-CPU machine were often all put on one CPU when made and ran
	 * there one after the other (seen on Zen 3 under KVM: 2 threads 1.0x
	 * to 1.2x the bound of 1, both on CPU 0 in two trials of three, also
	 * with nobody spinning). The allowed CPUs are taken a core at a time
	 * (every core's first hardware thread, then every core's second, ...),
	 * as the scheduler spreads the decode's own threads: CPUs 0 and 1 are
	 * one core's two threads on some machines (many VMs number them so).
	 * Past the CPUs allowed, threads share them in turn, as any would.
	 */
	if (sched_getaffinity(0, sizeof(allowed), &allowed) < 0)
		CPU_ZERO(&allowed);
	for (int c = 0; c < CPU_SETSIZE; c++)
		rank[c] = CPU_ISSET(c, &allowed) ? sibling_rank(c, &allowed) : 0;
	/* a rank is below the count of allowed CPUs: every one is taken */
	for (unsigned r = 0, left = (unsigned)CPU_COUNT(&allowed); left && ncpu < MAX_THREADS; r++)
		for (int c = 0; c < CPU_SETSIZE && ncpu < MAX_THREADS; c++)
			if (CPU_ISSET(c, &allowed) && rank[c] == r) {
				cpu[ncpu++] = c;
				left--;
			}
	for (; started < threads; started++) {
		w[started] = (struct worker){ j, started, ncpu ? cpu[started % ncpu] : -1 };
		if ((ret = -pthread_create(&tid[started], NULL, worker_main, &w[started])))
			break;
	}
	/*
	 * Every thread fills its buffer, then waits for the word; the clock
	 * starts when they are all there to hear it. Asleep, not spinning: a
	 * waiter spinning on a worker's CPU would hold it back.
	 */
	pthread_mutex_lock(&j->lock);
	while (!ret && j->ready < started)
		pthread_cond_wait(&j->cv, &j->lock);
	j->go = ret ? -1 : 1;
	/* before the word: a worker woken on this CPU may run first */
	t0 = now_ns();
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->lock);
	for (unsigned i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	t1 = now_ns();
	if (ret)
		goto out;
	/* bytes of stored elements converted and multiplied, by every thread */
	*gbps = (double)j->passes * BUF_BYTES * threads / (double)(t1 - t0 ? t1 - t0 : 1);
out:
	pthread_cond_destroy(&j->cv);
	pthread_mutex_destroy(&j->lock);
	free(j);
	return ret;
}

/* ------------------------------------------- the arithmetic over memory */

struct bench_arith {
	enum kva_isa isa;
	enum kva_dtype dt;
	unsigned group, threads;
	float *q;                    /* 16 x group floats a thread, on lines of their own, */
	size_t q_stride;             /* this many floats apart */
	float (*sink)[32];           /* a thread's sums, two vectors: the work is used */
};

int bench_arith_open(enum kva_isa isa, enum kva_dtype dt, unsigned group, unsigned threads,
		     struct bench_arith **out)
{
	struct bench_arith *a;
	size_t per;

	if ((isa != KVA_ISA_AVX2 && isa != KVA_ISA_AVX512) || !threads || threads > MAX_THREADS ||
	    !group || group > 1024 || !kva_dtype_size(dt) || !out)
		return -EINVAL;
	if (!(a = calloc(1, sizeof(*a))))
		return -ENOMEM;
	per = ((size_t)16 * group * sizeof(float) + 63) / 64 * 64; /* a thread's q, whole lines */
	a->q_stride = per / sizeof(float);
	a->q = aligned_alloc(64, per * threads);
	a->sink = aligned_alloc(64, sizeof(*a->sink) * threads);
	if (!a->q || !a->sink) {
		bench_arith_close(a);
		return -ENOMEM;
	}
	a->isa = isa;
	a->dt = dt;
	a->group = group;
	a->threads = threads;
	/* as run_one()'s */
	for (unsigned t = 0; t < threads; t++)
		for (unsigned g = 0; g < 16 * group; g++)
			a->q[a->q_stride * t + g] = 1.0f / (float)(g + 1);
	*out = a;
	return 0;
}

void bench_arith_close(struct bench_arith *a)
{
	if (!a)
		return;
	free(a->q);
	free(a->sink);
	free(a);
}

void bench_arith_chunk(void *ctx, unsigned thread, const char *p, const char *pf, size_t len)
{
	struct bench_arith *a = ctx;
	const float *q = a->q + a->q_stride * (thread % a->threads);
	const unsigned most = part_heads(a->isa), vec = lanes(a->isa);

	/* a group beyond the registers in parts, as run_one()'s: the first
	 * asks for the lines ahead, the others read the chunk again from L1 */
	for (unsigned g0 = 0; g0 < a->group; g0 += most) {
		unsigned n = a->group - g0 < most ? a->group - g0 : most;

		if (a->isa == KVA_ISA_AVX512)
			chunk_avx512(p, pf, len, q + vec * g0, n, a->dt, g0 == 0,
				     a->sink[thread % a->threads]);
		else
			chunk_avx2(p, pf, len, q + vec * g0, n, a->dt, g0 == 0,
				   a->sink[thread % a->threads]);
	}
}
