/* SPDX-License-Identifier: MIT */
/*
 * isa.c - which vector paths this CPU can run, decided at run time, and how
 * many software prefetches its core keeps in flight (the AVX2 tile's steps
 * and its cursor's pace).
 */
#include <cpuid.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <x86intrin.h>

#include "kernels_pvt.h"
#include "tsc_x86.h"

/*
 * F16C (CPUID.1:ECX bit 29): clang 14's __builtin_cpu_supports does not know
 * it. Asked once: CPUID traps to the hypervisor in a virtual machine, a few
 * microseconds that a short decode call would pay every time. Racing first
 * callers all store the same answer (relaxed: nothing else hangs on it).
 */
static bool has_f16c(void)
{
	static _Atomic int known; /* 0 unknown, 1 no, 2 yes */
	int v = atomic_load_explicit(&known, memory_order_relaxed);

	if (v == 0) {
		unsigned a, b, c, d;

		v = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) ? 2 : 1;
		atomic_store_explicit(&known, v, memory_order_relaxed);
	}
	return v == 2;
}

bool kva__isa_supported(enum kva_isa isa)
{
	switch (isa) {
	case KVA_ISA_SCALAR:
		return true;
	case KVA_ISA_AVX2:
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
	case KVA_ISA_AVX512:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
		       __builtin_cpu_supports("fma") && has_f16c();
	default:
		return false;
	}
}

/*
 * Whether this core runs a 512-bit floating-point operation as two 256-bit
 * halves: AMD family 19h (Zen 4; its Zen 3 parts have no AVX-512, so only
 * Zen 4 asks). Its two FMA pipes are 256 bits wide: a zmm FMA issues once a
 * cycle where a ymm FMA issues twice, the same flops, but what the zmm
 * tiles add to their FMAs costs twice as much. In loops of 12 independent
 * FMAs on that core (Zen 4, family 25 model 17, KVM; doc/figures.md, thirtieth
 * session), a vbroadcastsd or vbroadcastss into a zmm before each FMA took
 * 1.32-1.37x the FMAs' time where a ymm FMA's embedded broadcast took about
 * 1.2x the ymm FMAs', a zmm store after each 2.1x; so the AVX-512 tile's
 * sliced scores (a broadcast an FMA, K rows stored as fp32) ran its groups
 * of 3 to 8 slower there than the AVX2 tile does (decode.c, tile_for).
 * Other cores that split 512-bit operations (Zen 5's 256-bit client parts)
 * are not told apart: they run as a full-width core does. Asked once, as
 * has_f16c; a test may say otherwise (kva__avx512_split_force).
 */
/* a yes or no about this CPU, asked once: known 0 unknown, 1 no, 2 yes;
 * forced 0 the CPU's answer, 1 no, 2 yes (a test's) */
struct cpu_answer {
	_Atomic int known, forced;
	bool (*ask)(void);
};

static bool cpu_answer(struct cpu_answer *a)
{
	int v = atomic_load_explicit(&a->forced, memory_order_relaxed);

	if (v)
		return v == 2;
	v = atomic_load_explicit(&a->known, memory_order_relaxed);
	if (v == 0) {
		v = a->ask() ? 2 : 1;
		atomic_store_explicit(&a->known, v, memory_order_relaxed);
	}
	return v == 2;
}

/* @yes 1 / 0 forces the answer, -1 gives the CPU's back */
static void cpu_answer_force(struct cpu_answer *a, int yes)
{
	atomic_store_explicit(&a->forced, yes < 0 ? 0 : yes ? 2 : 1, memory_order_relaxed);
}

/* the family of an AMD CPU (0x19 Zen 3 and 4, 0x1a Zen 5); 0 for any other */
static unsigned amd_family(void)
{
	unsigned a, b, c, d, family;

	/* "AuthenticAMD" in EBX, EDX, ECX */
	if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u || d != 0x69746e65u ||
	    c != 0x444d4163u || !__get_cpuid(1, &a, &b, &c, &d))
		return 0;
	family = (a >> 8) & 0xfu;
	if (family == 0xfu)
		family += (a >> 20) & 0xffu;
	return family;
}

static bool cpu_splits_512(void)
{
	return amd_family() == 0x19u;
}

static struct cpu_answer split = { .ask = cpu_splits_512 };

bool kva__avx512_split(void)
{
	return cpu_answer(&split);
}

void kva__avx512_split_force(int yes)
{
	cpu_answer_force(&split, yes);
}

/*
 * Whether this CPU reads faster with prefetcht0 (into L1) than with
 * prefetcht1 where the tiles can take it: AMD family 1Ah (Zen 5). There
 * the AVX-512 tile's groups 1 and 2 at head_dim 64 and 128 (its dot
 * products' sites, struct kva__pfq) ask with T0: paired on Zen 5 (family
 * 26 model 2, KVM, 2 threads, f16; doc/figures.md, thirty-second session),
 * in both orders, T0 there read 1.01-1.06x as fast at group 1 and
 * 1.03-1.08x at group 2 out of cache (group 1 0.95x with the pages in
 * L2); the seventh and twenty-ninth sessions saw 1.04-1.17x at group 1 on
 * the same CPU. And so does the AVX2 tile's cursor at group 1 on
 * head-major pages (kva__cursor_t0, decode.c: f16 1.13-1.15x,
 * fortieth session). The sliced groups (0.96-1.04 at groups 4 to 8) and the AVX2
 * tile's other groups and layouts (0.95-1.02) keep T1; so does every other
 * CPU: T0 read 0.87 of T1 out of cache on Zen 4 and 0.90-0.97 on Intel
 * Xeon family 6 model 207 (README, the tried list). Asked once; a test may
 * say otherwise (kva__pf_t0_force).
 */
static bool cpu_is_zen5(void)
{
	return amd_family() == 0x1au;
}

static struct cpu_answer t0 = { .ask = cpu_is_zen5 };

bool kva__pf_t0(void)
{
	return cpu_answer(&t0);
}

void kva__pf_t0_force(int yes)
{
	cpu_answer_force(&t0, yes);
}

/*
 * Whether the AVX-512 tile's groups of 3 and 4 score by dot products (its
 * g4_scores: each K chunk converted into a register, 4 tokens x 4 heads
 * of sums reduced together) rather than sliced: on AMD family 1Ah (Zen
 * 5), where the sliced FMA's 4-float broadcast runs at two thirds of an
 * FMA's rate. Paired on Zen 5 (family 26 model 2, KVM, 2 threads, f16,
 * head_dim 128; doc/figures.md, thirty-third session): 1.06-1.11x as fast
 * out of cache, 1.21x on one page. Other CPUs stay sliced: the
 * sliced design came from Intel Xeon family 6 model 207, whose shuffles
 * share a port with its 512-bit FMAs (a dot product's reduction takes
 * about 2 of them a score), and Zen 4 runs the AVX2 tile for these
 * groups (kva__avx512_split). An answer of its own, though the same
 * CPUs say yes, so that a test forces one choice and not the other.
 * Asked once; a test may say otherwise (kva__sl_dot_force).
 */
static struct cpu_answer sl_dot = { .ask = cpu_is_zen5 };

bool kva__sl_dot(void)
{
	return cpu_answer(&sl_dot);
}

void kva__sl_dot_force(int yes)
{
	cpu_answer_force(&sl_dot, yes);
}

/*
 * Whether the AVX2 tile's one-head scores (group 1, and a group's last
 * head at groups 5, 9, 13, ...) take 12 rows a chunk at a time, q's chunk
 * in a register (tile_avx2.c, score_body), rather than 2 rows from start
 * to end: on AMD family 1Ah (Zen 5), at element sizes of 2 bytes or less.
 * The 2 rows came from Zen 3 (twelfth session), which drops the
 * prefetches it cannot start, so the tile's own loads went to the
 * hardware prefetcher, and over 12 rows at once read 0.69-0.76 of the
 * sweep where 2 rows read 0.79-0.88. Paired on Zen 5 (family 26 model 2,
 * KVM, `kvarena-ab --isa avx2 --group 1`, both orders, 2 threads;
 * doc/figures.md, thirty-fourth session), 12 rows read group 1 f16
 * head_dim 128 1.03-1.09x as fast out of cache and 1.08-1.14x on one
 * page, fp8 1.04-1.08x, int8 1.04-1.07x, bf16 0.99-1.05x, head_dim 64
 * 0.99-1.08x, 96 1.07-1.10x, 256 1.03-1.05x, NHD pages 1.02-1.03x, group
 * 5 1.00-1.05x, one thread 1.05-1.12x; f32 (32-byte chunks) 0.89-0.96 out
 * of cache though 1.16-1.20x on one page, so f32 keeps 2 rows. Other
 * CPUs are not measured with it and keep 2 rows. Asked once; a test may
 * say otherwise (kva__avx2_cols_force).
 */
static struct cpu_answer cols = { .ask = cpu_is_zen5 };

bool kva__avx2_cols(void)
{
	return cpu_answer(&cols);
}

void kva__avx2_cols_force(int yes)
{
	cpu_answer_force(&cols, yes);
}

/*
 * Whether the AVX-512 tile runs a group with no sliced shape (5, 9-11,
 * past 16) as subgroups, sliced ones and a rest (kva__avx512_sub), rather
 * than as the generic instance's 4 x 4 dot products: on AMD family 1Ah
 * (Zen 5). Paired there (family 26 model 2, KVM, `kvarena-ab --isa
 * avx512`, both orders, 2 threads, f16, head_dim 128; doc/figures.md,
 * thirty-fifth session), out of cache group 5 read 1.25-1.31x as fast,
 * 9 1.20-1.33x, 10 1.22-1.31x, 11 1.14-1.17x; on one page 1.34-1.63x,
 * 1.30-1.52x, 1.24-1.32x, 1.12-1.17x; f32 group 5 0.91-0.95 (1.78x on
 * one page), the one loss seen (since the thirty-seventh session its
 * last head rides in the 4's block, 1.24-1.27x as fast as then, and
 * group 6 runs as 4 + 2 so: kernels_pvt.h). Other CPUs keep the dot
 * products: on Intel Xeon family 6 model
 * 207 they had read these groups faster than padded sliced ones (README),
 * and subgroups were not measured there; Zen 4 runs its sliced groups on
 * the AVX2 tile (kva__avx512_split). Asked once; a test may say otherwise
 * (kva__avx512_subgroups_force).
 */
static struct cpu_answer subgroups = { .ask = cpu_is_zen5 };

bool kva__avx512_subgroups(void)
{
	return cpu_answer(&subgroups);
}

void kva__avx512_subgroups_force(int yes)
{
	cpu_answer_force(&subgroups, yes);
}

enum kva_isa kva_isa_best(void)
{
	if (kva__isa_supported(KVA_ISA_AVX512))
		return KVA_ISA_AVX512;
	if (kva__isa_supported(KVA_ISA_AVX2))
		return KVA_ISA_AVX2;
	return KVA_ISA_SCALAR;
}

const char *kva_isa_name(enum kva_isa isa)
{
	switch (isa) {
	case KVA_ISA_AUTO:
		return "auto";
	case KVA_ISA_SCALAR:
		return "scalar";
	case KVA_ISA_AVX2:
		return "avx2";
	case KVA_ISA_AVX512:
		return "avx512";
	}
	return "?";
}

/* ------------------------------------------------ prefetches a core keeps */

#define KEPT_BURST 64       /* prefetches a burst */
#define KEPT_PAGES 256      /* 1 MiB: a line in each of 64 of its pages a burst */
#define KEPT_ROUNDS 16      /* rounds that count, */
#define KEPT_TRIES 64       /* of at most so many a probe (about a millisecond), */
#define KEPT_PROBES 16      /* probes at most a process, */
#define KEPT_AGAIN_NS 10000000 /* the second 10 ms after the first, each next twice as long */
#define KEPT_OFF 2          /* a round that keeps no more than this did not count */
#define KEPT_WAIT_NS 5000   /* 5 us: 20-odd memory latencies */
#define PAGE 4096u

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v, unsigned n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	return v[n / 2];
}

/*
 * A round's lines: one in each of KEPT_BURST pages drawn from the buffer,
 * a line at random in each, their pages in the TLB (through another line
 * half a page away, so that no prefetcher takes the target for a
 * neighbour) and the lines themselves in no cache.
 */
static void cold_lines(char *buf, uint64_t *rng, const char *line[KEPT_BURST])
{
	for (unsigned i = 0; i < KEPT_BURST; i++) {
		uint64_t x = *rng = *rng * 6364136223846793005u + 1442695040888963407u;
		/* the burst's pages distinct: page i of each quarter-run */
		size_t page = (size_t)i * (KEPT_PAGES / KEPT_BURST) + (x >> 33) % (KEPT_PAGES / KEPT_BURST);
		unsigned l = (unsigned)(x >> 50) % 64;

		line[i] = buf + page * PAGE + l * 64;
		(void)*(volatile char *)(buf + page * PAGE + (l + 32) % 64 * 64);
	}
	for (unsigned i = 0; i < KEPT_BURST; i++)
		_mm_clflush(line[i]);
	_mm_mfence();
}

/* a burst of prefetches with hint T0 (@t0) or T1 to @line, and how many
 * of them are in a cache KEPT_WAIT_NS later (a load under @limit ticks) */
static uint64_t kept_burst(const char *const line[KEPT_BURST], bool t0, uint64_t limit)
{
	uint64_t until, got = 0;

	for (unsigned i = 0; i < KEPT_BURST; i++)
		if (t0)
			_mm_prefetch(line[i], _MM_HINT_T0);
		else
			_mm_prefetch(line[i], _MM_HINT_T1);
	until = now_ns() + KEPT_WAIT_NS; /* a prefetch kept has long arrived */
	while (now_ns() < until)
		_mm_pause();
	for (unsigned i = 0; i < KEPT_BURST; i++)
		got += kva__timed_load(line[i]) <= limit;
	return got;
}

/*
 * As bench_readbw_prefetch_kept measures it, with the median of the rounds'
 * counts, and without the rounds in which the core kept (next to) none. On
 * the KVM hosts of the README's figures a core keeps 63-64 of a burst
 * nearly all the time, and then, for spells of a few milliseconds (0-6% of
 * 12.5 us rounds over a quarter of a second; most often in the first 5-20
 * ms a core spins after it slept), none: lines loaded in the same pages
 * just before stay in the cache, the prefetched ones do not arrive,
 * whether the wait is 2 or 100 us. A spell says what the host is doing at
 * that moment, not what the core can do, so its rounds do not count. A
 * core whose prefetches are dropped for want of room still keeps its
 * misses in flight (Zen 3: 21-26).
 *
 * A round whose T1 burst kept none asks for a second burst of fresh lines
 * with T0, whose count stands in where it kept some. Some hosts of one CPU
 * (Zen 5, family 26 model 2) drop every prefetcht1 and prefetcht2 while
 * they keep prefetcht0's, in phases: for tens of milliseconds after
 * memory is faulted in (7 probes of 8 in a row right after a process
 * faulted in and wrote 512 MiB, then none; 12 of 12 after it faulted in
 * another 512 MiB; yet none after it wrote its 512 MiB again), and
 * for minutes at a time on some hosts (the thirty-ninth session's, round
 * after round; the fortieth's, 0-5 probes of 5 in each quarter second
 * over 30 s, where earlier in the session none). T0's count tells the same
 * thing about the core (how many misses it keeps asking for), so a probe
 * in such a phase still counts (a probe that waited it out would leave a
 * process decoding just after it filled its cache with the short step).
 * The hint the tiles ask with does not follow the phase: a process's
 * first probe would decide it for the whole process (the thirty-ninth
 * session's code did, and a bench process, probing right after it wrote
 * its cache, asked with T0 where its neighbour asked with T1). Return:
 * the count; 0 if no round counted (a spell: try again later), or if a
 * load from memory timed under twice one from the cache (not told apart
 * this time: one probe timed while the machine was busy elsewhere must
 * not decide for the whole process, and a machine where they never
 * differ pays 16 probes of about a millisecond).
 */
static int32_t measure_kept(void)
{
	const size_t size = (size_t)KEPT_PAGES * PAGE;
	unsigned n = 0;
	const char *line[KEPT_BURST];
	uint64_t cold[KEPT_BURST], hot[KEPT_BURST], kept[KEPT_ROUNDS];
	uint64_t cold_t, hot_t, limit;
	uint64_t rng = (uint64_t)(uintptr_t)&rng ^ now_ns();
	char *buf;

	buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 0;
	/* a child forked while this runs gets no copy it would never unmap */
	madvise(buf, size, MADV_DONTFORK);
	memset(buf, 1, size); /* pages of their own, not the shared zero page */
	/* a load from memory and one from the cache, in this counter's ticks:
	 * the midpoint tells them apart */
	cold_lines(buf, &rng, line);
	for (unsigned i = 0; i < KEPT_BURST; i++) {
		cold[i] = kva__timed_load(line[i]);
		hot[i] = kva__timed_load(line[i]);
	}
	cold_t = median(cold, KEPT_BURST);
	hot_t = median(hot, KEPT_BURST);
	limit = (cold_t + hot_t) / 2;
	for (unsigned k = 0; cold_t >= 2 * hot_t && k < KEPT_TRIES && n < KEPT_ROUNDS; k++) {
		uint64_t got;

		/* T1, the cursor's hint but at group 1 on Zen 5; where it kept
		 * none, T0 to fresh lines (T1's dropped, T0's kept: no spell) */
		cold_lines(buf, &rng, line);
		got = kept_burst(line, false, limit);
		if (got <= KEPT_OFF) {
			cold_lines(buf, &rng, line);
			got = kept_burst(line, true, limit);
		}
		if (got > KEPT_OFF)
			kept[n++] = got;
	}
	munmap(buf, size);
	if (cold_t < 2 * hot_t || n < KEPT_ROUNDS / 4)
		return 0;
	return (int32_t)median(kept, n);
}

/*
 * Measured once, by one thread at a time: a probe that counted is the
 * answer for good; one that fell in a
 * spell leaves it unknown (0) for a later call to try again, 10 ms later, then
 * 20, 40 ...: spells come with memory traffic (another core's memset made
 * 2-17% of rounds spells), and a busy process may decode through one
 * probe after another. KEPT_PROBES in all (the last some five minutes
 * after the first), then 0 for good. The other threads do not wait for a
 * probe: they get 0 meanwhile. What the probes share is under the flag
 * (acquire/release); the answer's first load is outside it, relaxed: it
 * is a hint for the tiles' step, and any value this machine measured is
 * right.
 *
 * A process forked while one of its threads probes has the flag set and
 * no thread to clear it: its child would never probe, and would decode
 * with the short step for good. So the child clears it (pthread_atfork,
 * registered when the library is loaded, before any thread of it can set
 * the flag). The forking thread is the child's only one, and it is not
 * inside a probe: the child's first call probes afresh, with the count,
 * the probes made and the next probe's time as the parent had them when
 * it forked. Not registered through pthread_once at the first call, as it
 * first was: a fork while another thread ran that once leaves the once "in
 * progress" for good in a child where ThreadSanitizer's pthread_once (an
 * atomic 0/1/2 its waiters spin on; glibc's starts it again in a child)
 * stands in, which is the likely cause of the one hang of test_kernels's
 * fork test in scripts/test.sh's TSan run.
 */
static _Atomic int32_t kept_known = -1; /* -1 not known yet */
static atomic_flag kept_busy = ATOMIC_FLAG_INIT;
static int kept_probes;
static uint64_t kept_next_ns; /* the next probe not before */

static void kept_child(void)
{
	atomic_flag_clear_explicit(&kept_busy, memory_order_relaxed);
}

__attribute__((constructor)) static void kept_atfork(void)
{
	/* ENOMEM leaves a child forked mid-probe with the short step: a
	 * slower decode, the same results */
	(void)pthread_atfork(NULL, NULL, kept_child);
}

int32_t kva_cpu_prefetch_kept(void)
{
	int32_t v = atomic_load_explicit(&kept_known, memory_order_relaxed);
	uint64_t now;

	if (v >= 0)
		return v;
	if (atomic_flag_test_and_set_explicit(&kept_busy, memory_order_acquire))
		return 0; /* another thread is measuring */
	v = atomic_load_explicit(&kept_known, memory_order_relaxed);
	if (v < 0 && (now = now_ns()) >= kept_next_ns) {
		v = measure_kept();
		if (v != 0 || ++kept_probes == KEPT_PROBES)
			atomic_store_explicit(&kept_known, v > 0 ? v : 0, memory_order_relaxed);
		else
			kept_next_ns = now_ns() + ((uint64_t)KEPT_AGAIN_NS << (kept_probes - 1));
	}
	atomic_flag_clear_explicit(&kept_busy, memory_order_release);
	return v > 0 ? v : 0;
}
