/* SPDX-License-Identifier: MIT */
/*
 * bench.h - what the kvarena-bench subcommands share: the clock, the one
 * get/put loop every allocator is measured with, trials in one or several
 * processes and their median, and JSON lines on stdout.
 *
 * Conventions as in the library: int functions return 0 or a negative errno.
 * A subcommand's entry point is the exception: it returns an exit status
 * (0 done, 1 failed, 2 bad usage), as main() does.
 */
#ifndef KVA_BENCH_H
#define KVA_BENCH_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

/* ------------------------------------------------------------------ clock */

static inline uint64_t bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * bench_sleep_until - sleep until CLOCK_MONOTONIC reads @ns. That clock is the
 * same in every process of the machine, so processes given one @ns start
 * together, to within their wake-up latency.
 */
static inline void bench_sleep_until(uint64_t ns)
{
	struct timespec ts = {
		.tv_sec = (time_t)(ns / 1000000000ull),
		.tv_nsec = (long)(ns % 1000000000ull),
	};

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* xorshift64*: reproducible runs, the same sequence on every machine. */
static inline uint64_t bench_rand(uint64_t *state)
{
	uint64_t x = *state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545f4914f6cdd1dull;
}

/* ------------------------------------------------------------- the loop */

/* Take (get) or give back (put) the objects at [at, at + n) of the context's table. */
typedef int (*bench_op_fn)(void *ctx, uint32_t at, uint32_t n);

struct bench_result {
	uint64_t pairs;      /* get+put pairs done */
	uint64_t elapsed_ns;
};

/* Pairs between two reads of the clock: a clock read costs ~20 ns, so its
 * share of a 5 ns pair stays under 0.2%, and a trial overruns its end by a
 * few microseconds at most. */
#define BENCH_PAIRS_PER_CLOCK 2048u

/*
 * bench_loop - the loop every allocator is measured with, after DPDK's
 * mempool_perf_autotest: repeat { get @keep objects, @step per call; put them
 * back in the same order, @step per call } from @start_ns until @end_ns.
 * A failed get or put ends the trial with its error.
 *
 * Always inlined, and meant to be called with constant @step and with @get
 * and @put always-inline functions of the caller's file: each allocator's
 * calls are then compiled into its own copy of the loop, as they would be in
 * its user's code (DPDK's inline, kvarena's a call into libkvarena.so), and no
 * indirect call of the benchmark's own is measured.
 */
static inline __attribute__((always_inline)) int
bench_loop(void *ctx, uint32_t keep, uint32_t step, bench_op_fn get, bench_op_fn put,
	   uint64_t start_ns, uint64_t end_ns, struct bench_result *res)
{
	uint32_t rounds = keep < BENCH_PAIRS_PER_CLOCK ? BENCH_PAIRS_PER_CLOCK / keep : 1;
	uint64_t pairs = 0, t0, now;
	int ret;

	bench_sleep_until(start_ns);
	t0 = bench_now_ns();
	do {
		for (uint32_t r = 0; r < rounds; r++) {
			for (uint32_t at = 0; at < keep; at += step)
				if ((ret = get(ctx, at, step)) < 0)
					return ret;
			for (uint32_t at = 0; at < keep; at += step)
				if ((ret = put(ctx, at, step)) < 0)
					return ret;
		}
		pairs += (uint64_t)rounds * keep;
		now = bench_now_ns();
	} while (now < end_ns);
	res->pairs = pairs;
	res->elapsed_ns = now - t0;
	return 0;
}

/* ------------------------------------------------------------- trials */

#define BENCH_MAX_TRIALS 99u
#define BENCH_MAX_PROCS 8u

struct bench_plan {
	unsigned trials;    /* measured trials, 1..BENCH_MAX_TRIALS */
	uint64_t trial_ns;  /* length of each */
	uint64_t warmup_ns; /* one trial before them, not counted: caches, page faults */
};

/*
 * What is measured, in each process that runs the loop: @open makes the
 * process's context (joins a worker, say) and is called in that process;
 * @trial runs bench_loop() over [start_ns, end_ns); @close undoes @open.
 */
struct bench_subject {
	const char *name; /* for messages */
	void *arg;
	int (*open)(void *arg, unsigned proc, void **ctx);
	int (*trial)(void *ctx, uint64_t start_ns, uint64_t end_ns, struct bench_result *r);
	void (*close)(void *ctx);
};

struct bench_figure {
	double pair_ns;   /* ns per pair and process at the summed rate:
			   * processes / ops_per_s (elapsed / pairs for one) */
	double ops_per_s; /* pairs per second, summed over the processes */
	double pair_ns_min, pair_ns_max; /* the fastest and slowest trial's pair_ns */
};

/*
 * bench_measure - run @s in @procs processes at once (1: this one; more:
 * forked children, each starting every trial at the same instant), a warm-up
 * and then @p->trials trials, and give the median trial (ranked by ops_per_s;
 * for an even count, the upper of the two middle ones).
 * Return: 0, a subject's error, or the errno of a fork/pipe/child failure.
 */
int bench_measure(const struct bench_subject *s, const struct bench_plan *p, unsigned procs,
		  struct bench_figure *out);

/*
 * bench_measure_turns - measure @n subjects (@s[i] in @procs[i] processes)
 * taking turns: one trial of each, then the next trial of each, so that a
 * slow spell of a shared machine falls on every subject alike instead of on
 * all the trials of one. Each trial is a bench_measure() of one trial after
 * its warm-up, from open to close. @out[i] is @s[i]'s median trial.
 * Return: as bench_measure(); the failing subject is named on stderr.
 */
int bench_measure_turns(const struct bench_subject *s, const unsigned *procs, unsigned n,
			const struct bench_plan *p, struct bench_figure *out);
/*
 * bench_measure_turns_with - the same, and @turn(@arg, t) first in each
 * round of turns (t = 0 .. trials - 1): a peer measured elsewhere (another
 * process) takes its turns there. A negative return stops the rounds. If
 * @trials is not NULL, @trials[i][t] is @s[i]'s trial t, in the order run.
 */
int bench_measure_turns_with(const struct bench_subject *s, const unsigned *procs, unsigned n,
			     const struct bench_plan *p, struct bench_figure *out,
			     int (*turn)(void *arg, unsigned t), void *arg,
			     struct bench_figure (*trials)[BENCH_MAX_TRIALS]);
/* bench_figure_median - the median of @n trials' figures (sorted in place),
 * with the fastest and slowest trial's pair_ns, as bench_measure gives it */
struct bench_figure bench_figure_median(struct bench_figure *f, unsigned n);

/* bench_median - the median of @v (sorted in place); NaN when @n is 0. */
double bench_median(double *v, unsigned n);

/*
 * bench_percentile - the nearest-rank @pct percentile of @v (sorted in
 * place): the smallest value that at least @pct % of the values do not
 * exceed. With 20 values the 99th is the largest. NaN when @n is 0.
 */
double bench_percentile(double *v, unsigned n, double pct);

/*
 * bench_read_full - read exactly @len bytes from @fd, waiting at most
 * @timeout_ms for each part. Return: 0, -ETIMEDOUT, -EPIPE (end of file
 * first), or a failed poll/read's -errno.
 */
int bench_read_full(int fd, void *buf, size_t len, int timeout_ms);

/* bench_reap - wait for child @pid. Return: 0 if it exited with status 0, else -ECHILD or -errno. */
int bench_reap(pid_t pid);

/*
 * bench_victim_hold - the end of a victim process (one that holds blocks to
 * be killed): tell the parent, through @fd, its slot (@slot_or_err >= 0) and
 * wait for the SIGKILL; or the error that stopped it, and exit 1.
 */
void bench_victim_hold(int fd, int slot_or_err, const char *who) __attribute__((noreturn));

/* bench_parse_u32 / bench_parse_double - a whole string as a number in [lo, hi]; -EINVAL if not. */
int bench_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out);
int bench_parse_double(const char *s, double lo, double hi, double *out);

/* ------------------------------------------------------------ JSON lines */

/*
 * One JSON object, printed as one line. Keys, the bench and the mode names
 * are the program's own constants and need no escaping.
 */
struct bench_line {
	char buf[2048];
	size_t len;
	bool overflow;
};

/* @mode NULL: a line without "mode" (the GPU benches' "no device" line) */
void bench_line_begin(struct bench_line *l, const char *bench, const char *mode);
/* a number with @decimals digits after the point; NaN or infinity print null */
void bench_line_num(struct bench_line *l, const char *key, double v, int decimals);
/* a string value: the program's own constant (a dtype or ISA name), not escaped */
void bench_line_str(struct bench_line *l, const char *key, const char *v);
/* any text (a driver's message, a device's name), escaped for JSON; cut
 * short, at a whole character or escape, past 511 bytes escaped */
void bench_line_text(struct bench_line *l, const char *key, const char *v);
void bench_line_bool(struct bench_line *l, const char *key, bool v);
/*
 * bench_huge_bytes - bytes of the mapping that holds @p that 2 MiB pages map
 * in this process: its AnonHugePages, ShmemPmdMapped and FilePmdMapped in
 * /proc/self/smaps (a hugetlb mapping counts none: its caller knows). 0 if
 * no mapping holds @p or smaps cannot be read.
 */
static inline uint64_t bench_huge_bytes(const void *p)
{
	static const char *const keys[] = { "AnonHugePages:", "ShmemPmdMapped:", "FilePmdMapped:" };
	FILE *f = fopen("/proc/self/smaps", "re");
	char line[512];
	bool in = false;
	uint64_t kb = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char c;

		/* an entry's first line is "lo-hi perms ...", the others "Key: value" */
		if (sscanf(line, "%lx-%lx %c", &lo, &hi, &c) == 3) {
			in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
			continue;
		}
		for (size_t k = 0; in && k < sizeof(keys) / sizeof(keys[0]); k++) {
			size_t n = strlen(keys[k]);
			unsigned long long v;

			if (!strncmp(line, keys[k], n) && sscanf(line + n, "%llu", &v) == 1)
				kb += v;
		}
	}
	fclose(f);
	return kb << 10;
}

/*
 * bench_json_escape - @s as the inside of a JSON string: '"' and '\'
 * escaped, control characters as \n, \t or \u00XX, in @out (@len bytes,
 * NUL-terminated, cut at a whole escape). Return: the length written.
 * Inline: kvarena-ab, which links nothing of bench.c, uses it too.
 */
static inline size_t bench_json_escape(const char *s, char *out, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	size_t n = 0;

	if (!len)
		return 0;
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		char e[6] = { '\\', (char)c };
		size_t k = 2;

		if (c == '\n') {
			e[1] = 'n';
		} else if (c == '\t') {
			e[1] = 't';
		} else if (c < 0x20) {
			memcpy(e, "\\u00", 4);
			e[4] = hex[c >> 4];
			e[5] = hex[c & 15];
			k = 6;
		} else if (c != '"' && c != '\\') {
			e[0] = (char)c;
			k = 1;
		}
		if (n + k >= len) {
			/* cut short: no half escape, and no half of a UTF-8
			 * character (its continuation bytes, then its lead) */
			while (n && ((unsigned char)out[n - 1] & 0xc0) == 0x80)
				n--;
			if (n && (unsigned char)out[n - 1] >= 0xc0)
				n--;
			break;
		}
		memcpy(out + n, e, k);
		n += k;
	}
	out[n] = '\0';
	return n;
}
/* Return: 0, -ENOBUFS (the line outgrew its buffer), -EIO (stdout failed). */
int bench_line_print(struct bench_line *l);

/* ------------------------------------------------------------ subcommands */

int bench_alloc_main(int argc, char **argv);         /* bench_alloc.c */
/* One kvarena-agent process of a benchmark's and where it lives (bench_agent.c). */
struct bench_agent {
	pid_t pid;          /* 0 once reaped */
	char dir[32];       /* mkdtemp's */
	char socket[64];
	char log[64];
	const char *who;    /* the subcommand, for messages */
};
struct kva_arena;
/* start @path with --socket, --name and @extra (NULL-ended) in a fresh
 * directory, wait until it answers; @observer maps its arena read-only */
int bench_agent_start(const char *path, const char *const *extra, struct bench_agent *ap,
		      struct kva_arena **observer);
/* stop it (SIGTERM, exit 0 expected); keep its log if @status < 0 */
int bench_agent_stop(struct bench_agent *ap, int status);

int bench_attach_main(int argc, char **argv);        /* bench_agent.c */
int bench_spill_main(int argc, char **argv);         /* bench_spill.c */
int bench_reclaim_agent_main(int argc, char **argv); /* bench_agent.c */
int bench_decode_main(int argc, char **argv);        /* bench_decode.c */

/* ------------------------------ bench_readbw.c: memory read bandwidth */

enum bench_read_pattern {
	BENCH_READ_SWEEP = 0, /* each thread reads one contiguous share */
	BENCH_READ_4K = 1,    /* 4 KiB chunks in a random order, a share each */
	BENCH_READ_64K = 2,   /* 64 KiB chunks likewise */
	BENCH_READ_4K_PF = 3, /* BENCH_READ_4K prefetched: bench_readbw_run_prefetched() */
	BENCH_READ_4K_ARITH = 4, /* the same read by a caller's function: bench_readbw_run_over() */
	BENCH_READ_SWEEP_ARITH = 5, /* BENCH_READ_SWEEP's shares by a caller's function, likewise */
};

/* A buffer of random bytes (each 16 bits a finite, normal number in every
 * dtype: bench_readbw_run_over), touched, and a team of threads that read it. */
struct bench_readbw;

/*
 * bench_readbw_open - map and fill @max_bytes, start @max_threads - 1 helper
 * threads (the caller is the first), pick the widest reader the CPU has.
 * Return: 0, -EINVAL, -ENOMEM, or a failed mmap's or pthread_create's -errno.
 */
int bench_readbw_open(size_t max_bytes, unsigned max_threads, uint64_t seed,
		      struct bench_readbw **out);
void bench_readbw_close(struct bench_readbw *r);
/* the reader's instruction set: "avx512", "avx2" or "scalar" */
const char *bench_readbw_isa(const struct bench_readbw *r);

/*
 * bench_readbw_run - read the first @bytes of the buffer @reps times over
 * in @pattern with @threads threads (each repeats its own share @reps
 * times), and say how long that took, wall clock, from the start of the
 * first thread to the end of the last. The chunk orders for a new @bytes
 * are drawn before the clock starts.
 * Return: 0, -EINVAL, -ENOMEM.
 */
int bench_readbw_run(struct bench_readbw *r, enum bench_read_pattern pattern, size_t bytes,
		     unsigned threads, unsigned reps, uint64_t *elapsed_ns);

/*
 * bench_readbw_run_prefetched - BENCH_READ_4K, each thread's share of the
 * random 4 KiB order read as the tiles read pages: while a chunk is read,
 * a prefetcht1 of each line of the chunk @distance bytes further along the
 * share (a multiple of 4 KiB), a few lines at a time; the first @distance
 * bytes asked for before the first read. The chunks are BENCH_READ_4K's
 * (the same order, drawn once for the same @bytes); only whole ones are
 * read, @bytes / 4096 of them.
 * Return: 0, -EINVAL, -ENOMEM.
 */
int bench_readbw_run_prefetched(struct bench_readbw *r, size_t bytes, size_t distance,
				unsigned threads, unsigned reps, uint64_t *elapsed_ns);

/*
 * bench_readbw_run_over - bench_readbw_run_prefetched()'s order, shares,
 * first prefetches and distance, but each whole chunk read by @fn rather
 * than summed: fn(@ctx, thread, chunk, the chunk @distance ahead in the
 * share (or the chunk itself past the share's end), 4096), on thread
 * [0, @threads). @fn asks for the lines ahead itself, as it reads. With
 * @contiguous, the chunks in address order instead, each thread's share
 * one contiguous run of them as BENCH_READ_SWEEP's (no paging: what the
 * hardware prefetchers see at their best).
 * Return: 0, -EINVAL, -ENOMEM.
 */
typedef void (*bench_chunk_fn)(void *ctx, unsigned thread, const char *p, const char *pf,
			       size_t len);
int bench_readbw_run_over(struct bench_readbw *r, size_t bytes, size_t distance, bool contiguous,
			  unsigned threads, unsigned reps, bench_chunk_fn fn, void *ctx,
			  uint64_t *elapsed_ns);

/*
 * bench_readbw_latency - what one load costs when its address is the value
 * the load before read: a chain through a random line of each of up to
 * @loads random 4 KiB chunks of the first @bytes, @loads loads round it
 * (more than once round where the bytes have fewer chunks) after a pass
 * over the bytes, in ns a load (*@ns). Nothing overlaps, so it is the
 * latency of those bytes from wherever such a pass leaves them: memory,
 * TLB misses included, when they are larger than the cache. Over a
 * machine's latency, a core's outstanding misses bound what it can read.
 * Writes a pointer into each line of the chain. Return: 0, -EINVAL, -ENOMEM.
 */
int bench_readbw_latency(struct bench_readbw *r, size_t bytes, uint32_t loads, double *ns);

/*
 * bench_readbw_prefetch_kept - how many software prefetches one core keeps
 * in flight: @burst prefetches (prefetcht1, the tiles' hint), back to back,
 * to as many lines of the first @bytes that are in no cache (their pages in
 * the TLB); then a wait far longer than memory's latency, and a timed load
 * of each. A load slower than the midpoint between one from memory and one
 * from the cache (measured first) found its line missing: the core dropped
 * that prefetch. *@kept: @burst less the mean missed over @rounds rounds.
 * A core that queues what it cannot start keeps them all; one that drops
 * the excess keeps about as many as it has misses in flight. *@kept is NaN
 * where a load from memory took less than twice one from the cache (no
 * telling them apart). On the calling thread. Return: 0, -EINVAL (fewer
 * than @burst 4 KiB chunks in @bytes), -ENOMEM.
 */
int bench_readbw_prefetch_kept(struct bench_readbw *r, size_t bytes, unsigned burst,
			       unsigned rounds, double *kept);

/* ------------------------- bench_cuda.c: the CUDA driver, loaded by hand */

/*
 * What the GPU figures are measured with. There is one where libcuda.so.1
 * loads, cuInit works, the device exists and is not the tests' driver
 * stand-in, whose name starts with BENCH_GPU_STAND_IN (device memory that
 * is host memory, copies that are memcpy, no kernels). Pointers to device
 * memory are void *, as kvarena_kernels.h has them.
 */
#define BENCH_GPU_STAND_IN "kvarena CUDA driver stand-in"

struct bench_gpu;

enum bench_gpu_dir { BENCH_GPU_HTOD, BENCH_GPU_DTOH, BENCH_GPU_DTOD };

/*
 * bench_gpu_open - device @ordinal, its primary context retained and pushed
 * on the calling thread (kva_decode_cuda runs in the current context), a
 * non-blocking stream and two timing events in it. Use it from that thread.
 * Return: 0; -ENODEV, no GPU to measure (no driver, one older than CUDA
 * 12.0, cuInit failed, no such device, or the stand-in); -ENOMEM, -EIO (a
 * driver call failed). @why says which, naming the call and its CUresult.
 */
int bench_gpu_open(int ordinal, struct bench_gpu **out, char *why, size_t len);
/* the stream waited for, what was made in the context destroyed, the
 * context popped and released; NULL is ignored */
void bench_gpu_close(struct bench_gpu *g);

const char *bench_gpu_name(const struct bench_gpu *g);
int bench_gpu_ordinal(const struct bench_gpu *g);
int bench_gpu_driver_version(const struct bench_gpu *g); /* 12080: CUDA 12.8; 0 unknown */
uint64_t bench_gpu_l2_bytes(const struct bench_gpu *g);  /* 0: the driver did not say */
void *bench_gpu_stream(const struct bench_gpu *g);       /* a CUstream */

/*
 * The rest return 0 or a negative errno (-ENOMEM for the driver's
 * CUDA_ERROR_OUT_OF_MEMORY, else -EIO) and say on stderr which call failed
 * and its CUresult's name.
 */
int bench_gpu_mem_info(struct bench_gpu *g, uint64_t *free_bytes, uint64_t *total_bytes);
int bench_gpu_alloc(struct bench_gpu *g, size_t bytes, void **dptr);  /* cuMemAlloc */
void bench_gpu_free(struct bench_gpu *g, void *dptr);
int bench_gpu_host_alloc(struct bench_gpu *g, size_t bytes, void **p); /* pinned */
void bench_gpu_host_free(struct bench_gpu *g, void *p);
/* synchronous copies, to (put) and from (get) the device, any host memory */
int bench_gpu_put(struct bench_gpu *g, void *dst, const void *src, size_t bytes);
int bench_gpu_get(struct bench_gpu *g, void *dst, const void *src, size_t bytes);
/* one copy queued on the stream (host memory pinned, or the copy is staged) */
int bench_gpu_copy_async(struct bench_gpu *g, enum bench_gpu_dir dir, void *dst,
			 const void *src, size_t bytes);
/* wait for the stream: also where a failure of queued work is told */
int bench_gpu_sync(struct bench_gpu *g);
/* the device's time, in ns, of what the stream ran between start and stop
 * (cuEventRecord, cuEventElapsedTime: about 0.5 us of resolution) */
int bench_gpu_timer_start(struct bench_gpu *g);
int bench_gpu_timer_stop(struct bench_gpu *g, double *ns);

/*
 * bench_gpu_no_device - the one line a GPU bench prints when it cannot
 * measure: {"bench":@bench,"backend":"cuda","status":@status,"reason":@why}
 * (@why escaped), and the same on stderr. Return: as bench_line_print.
 */
int bench_gpu_no_device(const char *bench, const char *status, const char *why);

/* ----------------------------------------- bench_dpdk.c: the DPDK peer */

#define BENCH_DPDK_MAX_OCC 2u
#define BENCH_DPDK_MAX_RUNS 6u

/*
 * What to measure with rte_mempool: runs (cache, bulk, processes) at
 * occupancies, one trial at a time on request (bench_dpdk_serve), each
 * trial as @plan says (its warm-up, then one trial of plan.trial_ns).
 */
struct bench_dpdk_request {
	struct bench_plan plan;
	uint32_t objects;   /* mempool size */
	uint32_t keep;
	unsigned occupancies;
	double occupancy[BENCH_DPDK_MAX_OCC]; /* objects held while measuring */
	unsigned runs;
	struct {
		uint32_t cache;  /* per-lcore cache size, 0 = none */
		bool bulk;       /* one call for all @keep objects */
		unsigned procs;  /* processes sharing the pool (0 or 1: this one);
				  * more are forked, each with its own cache */
	} run[BENCH_DPDK_MAX_RUNS];
};

/* one trial asked for: run @run at occupancy @occ */
struct bench_dpdk_ask {
	uint32_t occ, run;
};

/* ... and its answer */
struct bench_dpdk_answer {
	int32_t status;          /* 0, or -errno (told on stderr too) */
	double occupancy;        /* as measured: objects in use / size */
	struct bench_figure fig; /* NaN figures: no figure (see stderr) */
};

/*
 * bench_dpdk_serve - initialise DPDK's EAL in this process, then answer
 * each struct bench_dpdk_ask read from @in_fd with one trial of it
 * (rte_mempool_get/put with bench_loop(), on a pool per cache size and
 * occupancy kept from one ask to the next) written to @out_fd, until @in_fd
 * ends. So the allocator's trials and the peer's can take turns. The EAL
 * pins the process to CPU 0 and cannot be undone: call it in a process
 * made for it (a child that forks nothing but the runs' processes).
 * Return: 0 at the end of @in_fd, or -errno (the EAL would not start, or a
 * pipe failed; told on stderr).
 */
int bench_dpdk_serve(const struct bench_dpdk_request *req, int in_fd, int out_fd);

#endif /* KVA_BENCH_H */
