/* SPDX-License-Identifier: MIT */
/*
 * bench_alloc.c - `kvarena-bench alloc`: what taking a block and giving it
 * back costs, against the peers a shared pool is judged by, all measured in
 * the same run with the same loop (bench_loop, after DPDK's
 * mempool_perf_autotest), and how long reclaiming a killed worker takes.
 *
 * Modes, each at every occupancy but reclaim (--mode picks one):
 *
 *   cached, uncached      one process, worker cache 256 / none
 *   *_bulk                the same, one call for all `keep` blocks
 *   contended2[_uncached] two processes in one arena
 *   separate2[_uncached]  two processes, an arena each: the same work with
 *                         nothing shared, the machine's own two-process figure
 *   mutex_baseline[_contended2]  the seeds' design (struct mutex_pool below)
 *   dpdk_*                rte_mempool, cache 256 / none (bench_dpdk.c);
 *                         dpdk_contended2[_uncached]: two processes on one
 *                         pool (forked, the EAL's memory is shared), each
 *                         with its own cache
 *   reclaim               kva_arena_reclaim() after SIGKILL (victim_run below)
 *
 * The arena: 16 tokens x 1 layer x 1 head x 64 x f16 blocks. Before
 * measuring, a filler worker takes every block and frees a random
 * (1 - occupancy) of them, so the free blocks are scattered.
 *
 * Output: one JSON object per line on stdout, with these fields:
 *
 *   bench           "alloc"
 *   mode            the name in modes[] below
 *   blocks          arena size in blocks (DPDK: mempool size in objects)
 *   occupancy       fraction of the blocks held by others while measuring
 *                   (from kva_arena_stats; the mutex list and the mempool
 *                   count theirs the same way; reclaim: with the victim's
 *                   blocks, just before the kill)
 *   keep            objects taken before they are put back
 *   processes       processes running the loop at the same time
 *   pair_ns         ns per get+put pair and process, median trial: with
 *                   several processes, processes / ops_per_s (so a lock
 *                   that lets one process run and starves the other is
 *                   judged by what the two get done together)
 *   ops_per_s       get+put pairs per second, summed over the processes
 *   ratio_vs_dpdk   pair_ns / DPDK rte_mempool pair_ns, same cache setting,
 *                   call shape and processes: the two take turns trial by
 *                   trial (DPDK in a child process of its own), and this is
 *                   the median of the trials' ratios, each trial's to the
 *                   DPDK trial just before it; null when DPDK could not be
 *                   measured
 *   ratio_vs_dpdk_best  the fastest trial's pair_ns over DPDK's fastest:
 *                   what each does when the machine is at its best (on a
 *                   shared machine whose speed moves from one trial to the
 *                   next, the steadier of the two)
 *   ratio_vs_single ops_per_s / ops_per_s of one process, same cache setting
 *   ratio_vs_mutex  pair_ns of the mutex free list with two processes /
 *                   pair_ns here (both two processes)
 *   ratio_vs_separate  ops_per_s / ops_per_s of two processes that each
 *                   have an arena of their own (separate2*): what sharing
 *                   one arena costs, on a machine whose two CPUs may not
 *                   give twice one's throughput even when nothing is shared
 *   reclaim_ms      kva_arena_reclaim() of a SIGKILLed worker, median of the
 *   reclaim_ms_max  repetitions, and the slowest
 *   blocks_returned blocks that reclaim gave back (r.owned_freed, median)
 *   meta_bytes_per_block  kva_arena_info()->alloc_meta_bytes / blocks
 *   repetitions     reclaims measured
 *
 * Progress and diagnostics go to stderr; stdout carries nothing but lines.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvarena.h"
#include "bench.h"

#define MAX_OCC BENCH_DPDK_MAX_OCC
#define SEED 0x6b766162656e6368ull /* fixed: every run frees the same blocks */

enum kind { KIND_DPDK, KIND_MUTEX, KIND_KVARENA, KIND_RECLAIM };

/* In measuring order: a line's peers come before it. */
enum mode_id {
	NONE, /* no mode: 0, so that a peer a table entry leaves out is none */
	DPDK_CACHED,
	DPDK_CACHED_BULK,
	DPDK_UNCACHED,
	DPDK_UNCACHED_BULK,
	DPDK_CONTENDED2,
	DPDK_CONTENDED2_UNCACHED,
	MUTEX,
	MUTEX_CONTENDED2,
	CACHED,
	CACHED_BULK,
	UNCACHED,
	UNCACHED_BULK,
	SEPARATE2,
	SEPARATE2_UNCACHED,
	CONTENDED2,
	CONTENDED2_UNCACHED,
	RECLAIM,
	MODES
};

#define FIRST_MODE (NONE + 1)

static const struct mode {
	const char *name;
	enum kind kind;
	uint32_t cache;   /* worker cache (kvarena) or per-lcore cache (DPDK) */
	bool bulk;        /* one call for all `keep` objects */
	bool separate;    /* each process its own arena: nothing shared */
	unsigned procs;
	/* the peers its ratios compare with */
	enum mode_id vs_dpdk, vs_single, vs_mutex, vs_separate;
} modes[MODES] = {
	[DPDK_CACHED] = { .name = "dpdk_cached", .kind = KIND_DPDK, .cache = 256, .procs = 1 },
	[DPDK_CACHED_BULK] = { .name = "dpdk_cached_bulk", .kind = KIND_DPDK, .cache = 256,
			       .bulk = true, .procs = 1 },
	[DPDK_UNCACHED] = { .name = "dpdk_uncached", .kind = KIND_DPDK, .procs = 1 },
	[DPDK_UNCACHED_BULK] = { .name = "dpdk_uncached_bulk", .kind = KIND_DPDK, .bulk = true,
				 .procs = 1 },
	[DPDK_CONTENDED2] = { .name = "dpdk_contended2", .kind = KIND_DPDK, .cache = 256,
			      .procs = 2 },
	[DPDK_CONTENDED2_UNCACHED] = { .name = "dpdk_contended2_uncached", .kind = KIND_DPDK,
				       .procs = 2 },
	[MUTEX] = { .name = "mutex_baseline", .kind = KIND_MUTEX, .procs = 1 },
	[MUTEX_CONTENDED2] = { .name = "mutex_baseline_contended2", .kind = KIND_MUTEX,
			       .procs = 2 },
	[CACHED] = { .name = "cached", .kind = KIND_KVARENA, .cache = 256, .procs = 1,
		     .vs_dpdk = DPDK_CACHED },
	[CACHED_BULK] = { .name = "cached_bulk", .kind = KIND_KVARENA, .cache = 256, .bulk = true,
			  .procs = 1, .vs_dpdk = DPDK_CACHED_BULK },
	[UNCACHED] = { .name = "uncached", .kind = KIND_KVARENA, .procs = 1,
		       .vs_dpdk = DPDK_UNCACHED },
	[UNCACHED_BULK] = { .name = "uncached_bulk", .kind = KIND_KVARENA, .bulk = true,
			    .procs = 1, .vs_dpdk = DPDK_UNCACHED_BULK },
	[SEPARATE2] = { .name = "separate2", .kind = KIND_KVARENA, .cache = 256, .separate = true,
			.procs = 2, .vs_single = CACHED },
	[SEPARATE2_UNCACHED] = { .name = "separate2_uncached", .kind = KIND_KVARENA,
				 .separate = true, .procs = 2, .vs_single = UNCACHED },
	[CONTENDED2] = { .name = "contended2", .kind = KIND_KVARENA, .cache = 256, .procs = 2,
			 .vs_dpdk = DPDK_CONTENDED2, .vs_single = CACHED, .vs_mutex = MUTEX_CONTENDED2,
			 .vs_separate = SEPARATE2 },
	[CONTENDED2_UNCACHED] = { .name = "contended2_uncached", .kind = KIND_KVARENA, .procs = 2,
				  .vs_dpdk = DPDK_CONTENDED2_UNCACHED, .vs_single = UNCACHED,
				  .vs_mutex = MUTEX_CONTENDED2,
				  .vs_separate = SEPARATE2_UNCACHED },
	[RECLAIM] = { .name = "reclaim", .kind = KIND_RECLAIM, .procs = 1 },
};

struct alloc_opts {
	uint32_t blocks, keep;
	unsigned occupancies;
	double occupancy[MAX_OCC];
	struct bench_plan plan;
	bool quick;
	bool printed[MODES];  /* lines asked for */
	bool measured[MODES]; /* and the peers their ratios need */
};

/* What one occupancy measured. */
struct group {
	bool have[MODES];
	struct bench_figure fig[MODES];
	double occupancy[MODES];
	double vs_dpdk[MODES]; /* the median of paired trials' ratios; NaN: none */
};

/* ------------------------------------------------------------- arenas */

static int arena_make(uint32_t blocks, struct kva_arena **out)
{
	/* 4 KiB blocks; the data region is a sparse memfd nothing here touches */
	struct kva_geometry g = {
		.block_tokens = 16, .layers = 1, .kv_heads = 1, .head_dim = 64,
		.dtype = KVA_F16, .layout = KVA_LAYOUT_BLOCK_MAJOR,
	};
	struct kva_arena_opts o = { .blocks = blocks, .numa_node = -1, .name = "kvarena-bench" };
	int ret = kva_arena_create(&g, &o, out);

	if (ret < 0)
		fprintf(stderr, "alloc: kva_arena_create (%u blocks): %s\n", blocks, kva_errmsg());
	return ret;
}

/* shuffle_prefix - move a random choice of @k of the @n values to the front. */
static void shuffle_prefix(uint32_t *v, uint32_t n, uint32_t k, uint64_t *rng)
{
	for (uint32_t i = 0; i < k; i++) {
		uint32_t j = i + (uint32_t)(bench_rand(rng) % (n - i)), t = v[i];

		v[i] = v[j];
		v[j] = t;
	}
}

static double arena_occupancy(struct kva_arena *a, uint32_t *free_blocks)
{
	struct kva_stats st;

	if (kva_arena_stats(a, &st) < 0)
		return NAN;
	if (free_blocks)
		*free_blocks = st.free_blocks;
	return 1.0 - (double)st.free_blocks / st.total_blocks;
}

/*
 * fill - a filler worker (no cache) takes every block, then gives back a
 * random @free_count of them: the free blocks are scattered over the whole
 * arena, as after a long run, not one run at its end. The filler stays joined
 * holding the rest.
 */
static int fill(struct kva_arena *a, uint32_t free_count, uint64_t *rng, struct kva_worker **out)
{
	uint32_t blocks = kva_arena_info(a)->blocks;
	uint32_t *ids = malloc((size_t)blocks * sizeof(*ids));
	struct kva_worker *w = NULL;
	int ret;

	if (!ids)
		return -ENOMEM;
	if ((ret = kva_worker_join(a, "filler", &w)) < 0 ||
	    (ret = kva_worker_set_cache(w, 0)) < 0 || (ret = kva_alloc(w, blocks, ids)) < 0)
		goto fail;
	shuffle_prefix(ids, blocks, free_count, rng);
	if ((ret = kva_free(w, ids, free_count)) < 0)
		goto fail;
	free(ids);
	*out = w;
	return 0;
fail:
	fprintf(stderr, "alloc: filling the arena: %s (%s)\n", strerror(-ret), kva_errmsg());
	kva_worker_leave(w);
	free(ids);
	return ret;
}

/* ------------------------------------------------- subject: kvarena */

struct kv_arg {
	struct kva_arena *arena;  /* the arena to join, unless separate */
	uint32_t cache, keep;
	bool bulk;
	bool separate;            /* make an arena like it, of our own, and join that */
	uint32_t blocks, free_count;
};

struct kv_ctx {
	struct kva_worker *w;
	struct kva_arena *own;     /* separate: our arena, and its filler */
	struct kva_worker *filler;
	uint32_t keep;
	bool bulk;
	uint32_t ids[];
};

static void kv_close(void *ctx)
{
	struct kv_ctx *c = ctx;

	kva_worker_leave(c->w);
	kva_worker_leave(c->filler);
	kva_arena_close(c->own);
	free(c);
}

static int kv_open(void *arg, unsigned proc, void **ctx)
{
	const struct kv_arg *k = arg;
	struct kv_ctx *c = calloc(1, sizeof(*c) + k->keep * sizeof(c->ids[0]));
	struct kva_arena *a = k->arena;
	uint64_t rng = SEED; /* the shared arena's free blocks, in our own */
	char name[32];
	int ret;

	if (!c)
		return -ENOMEM;
	c->keep = k->keep;
	c->bulk = k->bulk;
	if (k->separate) {
		if ((ret = arena_make(k->blocks, &c->own)) < 0 ||
		    (ret = fill(c->own, k->free_count, &rng, &c->filler)) < 0)
			goto fail;
		a = c->own;
	}
	snprintf(name, sizeof(name), "bench-%u", proc);
	if ((ret = kva_worker_join(a, name, &c->w)) < 0 ||
	    (ret = kva_worker_set_cache(c->w, k->cache)) < 0) {
		fprintf(stderr, "alloc: joining a worker: %s (%s)\n", strerror(-ret), kva_errmsg());
		goto fail;
	}
	*ctx = c;
	return 0;
fail:
	kv_close(c);
	return ret;
}

static inline __attribute__((always_inline)) int
kv_get(void *ctx, uint32_t at, uint32_t n)
{
	struct kv_ctx *c = ctx;

	return kva_alloc(c->w, n, c->ids + at);
}

static inline __attribute__((always_inline)) int
kv_put(void *ctx, uint32_t at, uint32_t n)
{
	struct kv_ctx *c = ctx;

	return kva_free(c->w, c->ids + at, n);
}

static int kv_trial(void *ctx, uint64_t start_ns, uint64_t end_ns, struct bench_result *r)
{
	struct kv_ctx *c = ctx;

	/* two call sites, so that each copy of the loop has a constant step */
	if (c->bulk)
		return bench_loop(c, c->keep, c->keep, kv_get, kv_put, start_ns, end_ns, r);
	return bench_loop(c, c->keep, 1, kv_get, kv_put, start_ns, end_ns, r);
}

/* ----------------------------------------------- subject: mutex list */

/*
 * The seeds' design, as the baseline: a stack of free block ids in shared
 * memory under one process-shared pthread mutex. Written by every process
 * that takes or returns a block, under the lock; read by nobody else. Every
 * call moves the lock's and the stack top's cache lines to the caller's core,
 * and a process killed while holding the lock leaves it held for ever (no
 * robust mutex here, as in the seeds): what kvarena's allocator does without.
 */
struct mutex_pool {
	pthread_mutex_t lock;
	uint32_t top;   /* ids[0..top) are free */
	uint32_t ids[];
};

static size_t mutex_pool_bytes(uint32_t blocks)
{
	return sizeof(struct mutex_pool) + (size_t)blocks * sizeof(uint32_t);
}

/* mutex_pool_make - a list of @free_count random ids of @blocks, in memory forked children share. */
static int mutex_pool_make(uint32_t blocks, uint32_t free_count, uint64_t *rng,
			   struct mutex_pool **out)
{
	pthread_mutexattr_t attr;
	struct mutex_pool *p;
	int ret;

	p = mmap(NULL, mutex_pool_bytes(blocks), PROT_READ | PROT_WRITE,
		 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	for (uint32_t id = 0; id < blocks; id++)
		p->ids[id] = id;
	shuffle_prefix(p->ids, blocks, free_count, rng);
	p->top = free_count;
	if ((ret = pthread_mutexattr_init(&attr)) == 0) {
		ret = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
		if (ret == 0)
			ret = pthread_mutex_init(&p->lock, &attr);
		pthread_mutexattr_destroy(&attr);
	}
	if (ret) {
		munmap(p, mutex_pool_bytes(blocks));
		return -ret;
	}
	*out = p;
	return 0;
}

static void mutex_pool_destroy(struct mutex_pool *p, uint32_t blocks)
{
	if (!p)
		return;
	pthread_mutex_destroy(&p->lock);
	munmap(p, mutex_pool_bytes(blocks));
}

struct mx_arg {
	struct mutex_pool *pool;
	uint32_t keep;
};

struct mx_ctx {
	struct mutex_pool *pool;
	uint32_t keep;
	uint32_t ids[];
};

static int mx_open(void *arg, unsigned proc, void **ctx)
{
	const struct mx_arg *m = arg;
	struct mx_ctx *c = calloc(1, sizeof(*c) + m->keep * sizeof(c->ids[0]));

	(void)proc;
	if (!c)
		return -ENOMEM;
	c->pool = m->pool;
	c->keep = m->keep;
	*ctx = c;
	return 0;
}

static void mx_close(void *ctx)
{
	free(ctx);
}

static inline __attribute__((always_inline)) int
mx_get(void *ctx, uint32_t at, uint32_t n)
{
	struct mx_ctx *c = ctx;
	struct mutex_pool *p = c->pool;
	int ret = -pthread_mutex_lock(&p->lock);

	if (ret)
		return ret;
	if (p->top < n) {
		ret = -ENOSPC;
	} else {
		p->top -= n;
		memcpy(c->ids + at, p->ids + p->top, n * sizeof(c->ids[0]));
	}
	pthread_mutex_unlock(&p->lock);
	return ret;
}

static inline __attribute__((always_inline)) int
mx_put(void *ctx, uint32_t at, uint32_t n)
{
	struct mx_ctx *c = ctx;
	struct mutex_pool *p = c->pool;
	int ret = -pthread_mutex_lock(&p->lock);

	if (ret)
		return ret;
	memcpy(p->ids + p->top, c->ids + at, n * sizeof(c->ids[0]));
	p->top += n;
	pthread_mutex_unlock(&p->lock);
	return 0;
}

static int mx_trial(void *ctx, uint64_t start_ns, uint64_t end_ns, struct bench_result *r)
{
	struct mx_ctx *c = ctx;

	return bench_loop(c, c->keep, 1, mx_get, mx_put, start_ns, end_ns, r);
}

/* --------------------------------------------------------- DPDK peer */

/*
 * The DPDK peer: rte_mempool measured in a child process of its own
 * (bench_dpdk_serve), because DPDK's EAL pins its process to one CPU and
 * cannot be shut down cleanly enough to fork afterwards, and this process
 * forks other children. It takes its turns with kvarena's modes trial by
 * trial (run_group below): one trial of each DPDK run asked for, then one
 * of each kvarena mode, and again, so that a slow spell of a shared
 * machine falls on both alike. Measured one after the other, a run's
 * DPDK trials and its kvarena trials were seconds apart, and on a shared
 * machine whose speed moves by a third in that time the ratios moved with
 * it (uncached 0.8-1.5x over runs of one build, doc/figures.md, nineteenth session).
 */
struct dpdk_peer {
	bool on;
	struct bench_dpdk_request req;
	enum mode_id mode[BENCH_DPDK_MAX_RUNS]; /* req.run[r] measures mode[r] */
	int fd; /* asks out, answers in */
	pid_t pid;
	int timeout_ms;
	/* the current group's trials, in the order run: [run][trial] */
	unsigned oi;
	struct bench_figure fig[BENCH_DPDK_MAX_RUNS][BENCH_MAX_TRIALS];
	struct bench_figure sorted[BENCH_MAX_TRIALS];
	double occupancy[BENCH_DPDK_MAX_RUNS];
	bool failed[BENCH_DPDK_MAX_RUNS];
};

/* dpdk_stop - end the peer: its asks end, it frees its pools and exits */
static void dpdk_stop(struct dpdk_peer *d)
{
	if (!d->on)
		return;
	close(d->fd); /* its next read ends, and it exits */
	bench_reap(d->pid);
	d->on = false;
}

/*
 * dpdk_start - the peer for the DPDK modes @o asks for, started and
 * waiting for asks. Return: 0 (none asked for: nothing started), or -errno
 * when DPDK cannot be measured (told on stderr): its figures are then
 * missing and the ratios to them null; the run goes on.
 */
static int dpdk_start(const struct alloc_opts *o, struct dpdk_peer *d)
{
	memset(d, 0, sizeof(*d));
	d->req = (struct bench_dpdk_request){ .plan = o->plan, .objects = o->blocks - 1,
					      .keep = o->keep, .occupancies = o->occupancies };
	memcpy(d->req.occupancy, o->occupancy, sizeof(d->req.occupancy));
	for (enum mode_id m = DPDK_CACHED; m <= DPDK_CONTENDED2_UNCACHED; m++) {
		if (!o->measured[m])
			continue;
		d->mode[d->req.runs] = m;
		d->req.run[d->req.runs].cache = modes[m].cache;
		d->req.run[d->req.runs].bulk = modes[m].bulk;
		d->req.run[d->req.runs].procs = modes[m].procs;
		d->req.runs++;
	}
	if (!d->req.runs)
		return 0;
#ifndef KVA_BENCH_DPDK
	fprintf(stderr, "alloc: kvarena-bench was built without DPDK: no DPDK lines, "
		"ratio_vs_dpdk is null\n");
	return -ENOTSUP;
#else
	int sv[2], ret = 0;

	/* a socket, not a pipe: an ask sent to a peer that has died (its EAL
	 * would not start) is EPIPE with MSG_NOSIGNAL, not a SIGPIPE for us */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	fflush(stdout);
	fflush(stderr);
	d->pid = fork();
	if (d->pid == 0) {
		close(sv[0]);
		/* it must not outlive us, and whatever the EAL prints goes to
		 * stderr: stdout is for results */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(STDERR_FILENO, STDOUT_FILENO);
		_exit(bench_dpdk_serve(&d->req, sv[1], sv[1]) < 0 ? 1 : 0);
	}
	if (d->pid < 0)
		ret = -errno;
	close(sv[1]);
	d->fd = sv[0];
	/* one trial with its warm-up, and a minute for the EAL to start */
	d->timeout_ms = (int)((o->plan.trial_ns + o->plan.warmup_ns) / 1000000) + 60000;
	d->on = ret == 0;
	if (ret < 0) {
		close(d->fd);
		fprintf(stderr, "alloc: DPDK peer: fork: %s: no DPDK lines, ratio_vs_dpdk is null\n",
			strerror(-ret));
	} else {
		fprintf(stderr, "alloc: DPDK rte_mempool in a child process, taking turns\n");
	}
	return ret;
#endif
}

/*
 * dpdk_turn - bench_measure_turns_with()'s hook: trial @t of every DPDK run
 * at the current group's occupancy. A peer that fails stops being asked
 * (its figures are missing, the ratios to them null); kvarena's go on.
 */
static int dpdk_turn(void *arg, unsigned t)
{
	struct dpdk_peer *d = arg;

	for (unsigned r = 0; r < d->req.runs && d->on; r++) {
		struct bench_dpdk_ask ask = { .occ = d->oi, .run = r };
		struct bench_dpdk_answer ans;
		int ret;

		if (d->failed[r])
			continue;
		if (send(d->fd, &ask, sizeof(ask), MSG_NOSIGNAL) != (ssize_t)sizeof(ask))
			ret = -EPIPE;
		else
			ret = bench_read_full(d->fd, &ans, sizeof(ans), d->timeout_ms);
		if (ret < 0) {
			fprintf(stderr, "alloc: DPDK peer: %s: no more DPDK figures\n",
				strerror(-ret));
			kill(d->pid, SIGKILL); /* hung, or gone */
			dpdk_stop(d);
			break;
		}
		if (ans.status < 0 || isnan(ans.fig.pair_ns)) {
			d->failed[r] = true; /* told on stderr by the peer */
			continue;
		}
		d->fig[r][t] = ans.fig;
		d->occupancy[r] = ans.occupancy;
	}
	return 0;
}

/* dpdk_group - the group's DPDK figures: the median of each run's trials */
static void dpdk_group(struct dpdk_peer *d, const struct alloc_opts *o, struct group *g)
{
	for (unsigned r = 0; r < d->req.runs; r++) {
		enum mode_id m = d->mode[r];

		if (d->failed[r] || !d->on)
			continue;
		g->have[m] = true;
		memcpy(d->sorted, d->fig[r], sizeof(d->sorted[0]) * o->plan.trials);
		g->fig[m] = bench_figure_median(d->sorted, o->plan.trials);
		g->occupancy[m] = d->occupancy[r];
		fprintf(stderr, "alloc: %-26s occupancy %.2f  %8.3f ns/pair (trials %.3f..%.3f)\n",
			modes[m].name, g->occupancy[m], g->fig[m].pair_ns, g->fig[m].pair_ns_min,
			g->fig[m].pair_ns_max);
	}
}

/* ---------------------------------------------------------- output */

static double ratio(const struct group *g, enum mode_id num, enum mode_id den, bool ns)
{
	if (num == NONE || den == NONE || !g->have[num] || !g->have[den])
		return NAN;
	return ns ? g->fig[num].pair_ns / g->fig[den].pair_ns
		  : g->fig[num].ops_per_s / g->fig[den].ops_per_s;
}

static int print_figure(const struct alloc_opts *o, const struct group *g, enum mode_id m)
{
	const struct mode *d = &modes[m];
	struct bench_line l;

	bench_line_begin(&l, "alloc", d->name);
	bench_line_num(&l, "blocks", d->kind == KIND_DPDK ? o->blocks - 1 : o->blocks, 0);
	bench_line_num(&l, "occupancy", g->occupancy[m], 4);
	bench_line_num(&l, "keep", o->keep, 0);
	bench_line_num(&l, "processes", d->procs, 0);
	bench_line_num(&l, "pair_ns", g->fig[m].pair_ns, 3);
	bench_line_num(&l, "ops_per_s", g->fig[m].ops_per_s, 0);
	if (d->vs_dpdk != NONE) {
		bench_line_num(&l, "ratio_vs_dpdk", g->vs_dpdk[m], 3);
		bench_line_num(&l, "ratio_vs_dpdk_best",
			       g->have[d->vs_dpdk] ? g->fig[m].pair_ns_min /
							     g->fig[d->vs_dpdk].pair_ns_min
						   : NAN,
			       3);
	}
	if (d->vs_single != NONE)
		bench_line_num(&l, "ratio_vs_single", ratio(g, m, d->vs_single, false), 3);
	if (d->vs_mutex != NONE)
		bench_line_num(&l, "ratio_vs_mutex", ratio(g, d->vs_mutex, m, true), 3);
	if (d->vs_separate != NONE)
		bench_line_num(&l, "ratio_vs_separate", ratio(g, m, d->vs_separate, false), 3);
	return bench_line_print(&l);
}

/* ------------------------------------------------ one occupancy */

struct group_env {
	struct kva_arena *arena;
	struct kva_worker *filler;
	struct mutex_pool *pool;
	uint32_t free_count;
};

static int group_setup(const struct alloc_opts *o, uint32_t free_count, struct group_env *e)
{
	bool kv = false, mx = false;
	uint64_t rng = SEED;
	int ret;

	for (enum mode_id m = FIRST_MODE; m < MODES; m++) {
		kv |= o->measured[m] && modes[m].kind == KIND_KVARENA;
		mx |= o->measured[m] && modes[m].kind == KIND_MUTEX;
	}
	e->free_count = free_count;
	if (kv && ((ret = arena_make(o->blocks, &e->arena)) < 0 ||
		   (ret = fill(e->arena, free_count, &rng, &e->filler)) < 0))
		return ret;
	if (mx && (ret = mutex_pool_make(o->blocks, free_count, &rng, &e->pool)) < 0) {
		fprintf(stderr, "alloc: mutex free list: %s\n", strerror(-ret));
		return ret;
	}
	return 0;
}

/*
 * group_teardown - every measured worker has left: the arena must be as the
 * filler left it, every block free or the filler's (else the allocator lost
 * or leaked blocks, and the figures cannot be trusted).
 */
static int group_teardown(struct group_env *e, uint32_t blocks)
{
	struct kva_check_report cr;
	uint32_t free_blocks = 0;
	int ret = 0;

	if (e->arena) {
		arena_occupancy(e->arena, &free_blocks);
		if ((ret = kva_arena_check(e->arena, &cr)) < 0)
			fprintf(stderr, "alloc: the arena fails its check after the run: "
				"%u bad descriptors, %u stale owners, %u hints missing\n",
				cr.bad_descriptors, cr.stale_owners, cr.hints_missing);
		if (free_blocks != e->free_count) {
			fprintf(stderr, "alloc: %u blocks free after the run, %u before\n",
				free_blocks, e->free_count);
			ret = -EUCLEAN;
		}
	}
	kva_worker_leave(e->filler);
	kva_arena_close(e->arena);
	mutex_pool_destroy(e->pool, blocks);
	return ret;
}

/* What measuring the modes of one occupancy takes, side by side. */
struct group_run {
	unsigned n;
	enum mode_id mode[MODES];
	struct bench_subject subject[MODES];
	unsigned procs[MODES];
	struct bench_figure fig[MODES];
	struct bench_figure trials[MODES][BENCH_MAX_TRIALS]; /* in the order run */
	struct kv_arg kv[MODES];
	struct mx_arg mx;
};

/* add_mode - put mode @m among the subjects of @r, and note its occupancy. */
static void add_mode(const struct alloc_opts *o, struct group_env *e, struct group *g,
		     struct group_run *r, enum mode_id m)
{
	const struct mode *d = &modes[m];
	unsigned i = r->n++;

	r->mode[i] = m;
	r->procs[i] = d->procs;
	if (d->kind == KIND_KVARENA) {
		r->kv[i] = (struct kv_arg){ .arena = e->arena, .cache = d->cache, .keep = o->keep,
					    .bulk = d->bulk, .separate = d->separate,
					    .blocks = o->blocks, .free_count = e->free_count };
		r->subject[i] = (struct bench_subject){ d->name, &r->kv[i], kv_open, kv_trial,
							kv_close };
		g->occupancy[m] = arena_occupancy(e->arena, NULL);
	} else {
		r->mx = (struct mx_arg){ .pool = e->pool, .keep = o->keep };
		r->subject[i] = (struct bench_subject){ d->name, &r->mx, mx_open, mx_trial,
							mx_close };
		g->occupancy[m] = 1.0 - (double)e->pool->top / o->blocks;
	}
}

/*
 * paired_ratio - the median over the trials of @kv[t].pair_ns over the DPDK
 * run of @peer's trial t, taken just before it; NaN without that run.
 */
static double paired_ratio(const struct alloc_opts *o, const struct dpdk_peer *d,
			   enum mode_id peer, const struct bench_figure *kv)
{
	double q[BENCH_MAX_TRIALS];

	for (unsigned r = 0; r < d->req.runs; r++) {
		if (peer == NONE || d->mode[r] != peer || d->failed[r] || !d->on)
			continue;
		for (unsigned t = 0; t < o->plan.trials; t++)
			q[t] = kv[t].pair_ns / d->fig[r][t].pair_ns;
		return bench_median(q, o->plan.trials);
	}
	return NAN;
}

/*
 * run_group - measure one occupancy's kvarena and mutex modes and the DPDK
 * peer's, taking turns (bench_measure_turns_with), and print its lines.
 */
static int run_group(const struct alloc_opts *o, unsigned oi, struct group *g,
		     struct dpdk_peer *d)
{
	uint32_t held = (uint32_t)(o->occupancy[oi] * o->blocks + 0.5);
	struct group_run *r = calloc(1, sizeof(*r));
	struct group_env e = { 0 };
	int ret = -ENOMEM;

	if (!r || (ret = group_setup(o, o->blocks - held, &e)) < 0)
		goto out;
	for (enum mode_id m = FIRST_MODE; m < MODES; m++)
		if (o->measured[m] && (modes[m].kind == KIND_KVARENA || modes[m].kind == KIND_MUTEX))
			add_mode(o, &e, g, r, m);
	fprintf(stderr, "alloc: %u modes%s, %u trials each, in turns\n", r->n,
		d->on ? " and DPDK's" : "", o->plan.trials);
	d->oi = oi;
	if ((ret = bench_measure_turns_with(r->subject, r->procs, r->n, &o->plan, r->fig,
					    d->on ? dpdk_turn : NULL, d, r->trials)) < 0)
		goto out;
	dpdk_group(d, o, g);
	for (unsigned i = 0; i < r->n; i++)
		g->vs_dpdk[r->mode[i]] = paired_ratio(o, d, modes[r->mode[i]].vs_dpdk, r->trials[i]);
	for (unsigned i = 0; i < r->n; i++) {
		enum mode_id m = r->mode[i];

		g->have[m] = true;
		g->fig[m] = r->fig[i];
		fprintf(stderr, "alloc: %-26s occupancy %.2f  %8.3f ns/pair (trials %.3f..%.3f)\n",
			modes[m].name, g->occupancy[m], g->fig[m].pair_ns, g->fig[m].pair_ns_min,
			g->fig[m].pair_ns_max);
	}
	for (enum mode_id m = FIRST_MODE; m < MODES && ret == 0; m++)
		if (o->printed[m] && g->have[m])
			ret = print_figure(o, g, m);
out:
	if (group_teardown(&e, o->blocks) < 0 && ret == 0)
		ret = -EUCLEAN;
	free(r);
	return ret;
}

/* ------------------------------------------------------------ reclaim */

#define RECLAIM_BLOCKS 1048576u
#define RECLAIM_BLOCKS_QUICK 131072u
#define RECLAIM_REPS 5u
#define RECLAIM_REPS_QUICK 2u
#define RECLAIM_MARGIN 1024u /* free blocks the victim leaves, so its cache refills in full */

/*
 * victim_run - the worker reclaim takes back, in a child process. It joins
 * with the arena's default cache, takes every free block but a margin in
 * random-sized batches, then gives back a random choice of them, again in
 * random batches, until it holds @hold: what it holds is then spread evenly
 * over the whole arena, between the filler's blocks, and its cache is
 * whatever such a life leaves in it. It tells the parent its slot (or a
 * -errno) on @fd and waits to be killed. Never returns.
 */
static void victim_run(struct kva_arena *a, uint32_t hold, uint64_t seed, int fd)
{
	uint32_t blocks = kva_arena_info(a)->blocks, free_blocks = 0, got = 0, n;
	uint32_t *ids = malloc((size_t)blocks * sizeof(*ids));
	struct kva_worker *w = NULL;
	uint64_t rng = seed;
	int ret = -ENOMEM;

	/* it waits to be killed: if the parent dies first, that must still happen */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (!ids || (ret = kva_worker_join(a, "victim", &w)) < 0)
		goto fail;
	arena_occupancy(a, &free_blocks);
	if (free_blocks < hold + RECLAIM_MARGIN) {
		ret = -ENOSPC;
		goto fail;
	}
	for (; got < free_blocks - RECLAIM_MARGIN; got += n) {
		n = 1 + (uint32_t)(bench_rand(&rng) % 64);
		if (n > free_blocks - RECLAIM_MARGIN - got)
			n = free_blocks - RECLAIM_MARGIN - got;
		if ((ret = kva_alloc(w, n, ids + got)) < 0)
			goto fail;
	}
	shuffle_prefix(ids, got, got - hold, &rng);
	for (uint32_t at = 0; at < got - hold; at += n) {
		n = 1 + (uint32_t)(bench_rand(&rng) % 64);
		if (n > got - hold - at)
			n = got - hold - at;
		if ((ret = kva_free(w, ids + at, n)) < 0)
			goto fail;
	}
	bench_victim_hold(fd, kva_worker_slot(w), "alloc: reclaim victim");
fail:
	bench_victim_hold(fd, ret, "alloc: reclaim victim");
}

struct reclaim_sample {
	double ms;
	double returned;
	double occupancy; /* with the victim's blocks, just before the kill */
};

/*
 * reclaim_once - start a victim, SIGKILL it once it holds its blocks, reap it,
 * and time kva_arena_reclaim() of its slot; then check that the arena is
 * exactly as before the victim came.
 */
static int reclaim_once(struct kva_arena *a, uint32_t hold, uint64_t seed,
			struct reclaim_sample *out)
{
	struct kva_reclaim_report r;
	struct kva_check_report cr;
	uint32_t free_before = 0, free_after = 0;
	int32_t slot = -EIO;
	int fds[2], ret;
	uint64_t t0, t1;
	pid_t pid;

	arena_occupancy(a, &free_before);
	if (pipe2(fds, O_CLOEXEC) < 0)
		return -errno;
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid == 0) {
		close(fds[0]);
		victim_run(a, hold, seed, fds[1]);
	}
	close(fds[1]);
	if (pid < 0) {
		ret = -errno;
		close(fds[0]);
		return ret;
	}
	ret = bench_read_full(fds[0], &slot, sizeof(slot), 120000);
	close(fds[0]);
	if (ret == 0 && slot < 0)
		ret = slot;
	if (ret == 0)
		out->occupancy = arena_occupancy(a, NULL);
	kill(pid, SIGKILL);
	bench_reap(pid); /* killed: its status says nothing */
	if (ret < 0)
		return ret;

	t0 = bench_now_ns();
	ret = kva_arena_reclaim(a, (uint32_t)slot, &r);
	t1 = bench_now_ns();
	if (ret < 0) {
		fprintf(stderr, "alloc: kva_arena_reclaim: %s (%s)\n", strerror(-ret), kva_errmsg());
		return ret;
	}
	out->ms = (double)(t1 - t0) / 1e6;
	out->returned = r.owned_freed;

	arena_occupancy(a, &free_after);
	if ((ret = kva_arena_check(a, &cr)) < 0 || free_after != free_before) {
		fprintf(stderr, "alloc: after reclaim %u blocks are free (%u before), "
			"check %s\n", free_after, free_before, ret < 0 ? "fails" : "passes");
		return -EUCLEAN;
	}
	return 0;
}

static int run_reclaim(const struct alloc_opts *o)
{
	uint32_t blocks = o->quick ? RECLAIM_BLOCKS_QUICK : RECLAIM_BLOCKS;
	unsigned reps = o->quick ? RECLAIM_REPS_QUICK : RECLAIM_REPS;
	double ms[RECLAIM_REPS], returned[RECLAIM_REPS], occupancy[RECLAIM_REPS], ms_max = 0;
	struct kva_arena *a = NULL;
	struct kva_worker *filler = NULL;
	uint64_t rng = SEED;
	double meta_per_block;
	struct bench_line l;
	int ret;

	fprintf(stderr, "alloc: reclaim, %u blocks, %u repetitions\n", blocks, reps);
	if ((ret = arena_make(blocks, &a)) < 0)
		return ret;
	meta_per_block = (double)kva_arena_info(a)->alloc_meta_bytes / blocks;
	/* half the arena held by a live worker, in random places */
	if ((ret = fill(a, blocks / 2, &rng, &filler)) < 0)
		goto out;
	for (unsigned k = 0; k < reps; k++) {
		struct reclaim_sample s = { 0 };

		if ((ret = reclaim_once(a, blocks / 20, bench_rand(&rng), &s)) < 0) {
			fprintf(stderr, "alloc: reclaim: %s\n", strerror(-ret));
			goto out;
		}
		fprintf(stderr, "alloc: reclaim %u: %.3f ms, %.0f blocks\n", k, s.ms, s.returned);
		ms[k] = s.ms;
		returned[k] = s.returned;
		occupancy[k] = s.occupancy;
		ms_max = s.ms > ms_max ? s.ms : ms_max;
	}
	bench_line_begin(&l, "alloc", modes[RECLAIM].name);
	bench_line_num(&l, "blocks", blocks, 0);
	bench_line_num(&l, "occupancy", bench_median(occupancy, reps), 4);
	bench_line_num(&l, "repetitions", reps, 0);
	bench_line_num(&l, "reclaim_ms", bench_median(ms, reps), 3);
	bench_line_num(&l, "reclaim_ms_max", ms_max, 3);
	bench_line_num(&l, "blocks_returned", bench_median(returned, reps), 0);
	bench_line_num(&l, "meta_bytes_per_block", meta_per_block, 3);
	ret = bench_line_print(&l);
out:
	kva_worker_leave(filler);
	kva_arena_close(a);
	return ret;
}

/* ------------------------------------------------------------ options */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvarena-bench alloc [options]\n"
		"\n"
		"Cost of a block get+put (repeat: get `keep` blocks one call at a time, put\n"
		"them back) in kvarena, DPDK rte_mempool and a mutex-protected free list, all\n"
		"in this run; and reclaim time of a killed worker. One JSON line per mode.\n"
		"\n"
		"  --mode NAME       run one mode (and, unprinted, the peers its ratios need):\n"
		"                    ");
	for (enum mode_id m = FIRST_MODE; m < MODES; m++)
		fprintf(f, "%s%s", modes[m].name,
			m + 1 == MODES ? "\n" : (m % 4 == 0 ? ",\n                    " : ", "));
	fprintf(f,
		"  --occupancy X     one occupancy in [0, 1) instead of 0.5 and 0.99\n"
		"  --blocks N        arena size for the get/put modes (default 65536)\n"
		"  --keep N          objects per round (default 32)\n"
		"  --seconds S       length of one trial (default 0.15)\n"
		"  --trials N        trials per measurement, the median is reported (default 7)\n"
		"  --quick           1 trial of 0.02 s; reclaim on 131072 blocks, twice\n"
		"  --help            this text\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvarena-bench alloc: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n(kvarena-bench alloc --help lists the options)\n");
	return -EINVAL;
}

/* parse - fill @o from the command line; 1 for --help, -EINVAL (told on stderr) if wrong. */
static int parse(int argc, char **argv, struct alloc_opts *o)
{
	static const struct option longopts[] = {
		{ "mode", required_argument, NULL, 'm' },
		{ "occupancy", required_argument, NULL, 'o' },
		{ "blocks", required_argument, NULL, 'b' },
		{ "keep", required_argument, NULL, 'k' },
		{ "seconds", required_argument, NULL, 's' },
		{ "trials", required_argument, NULL, 't' },
		{ "quick", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	double seconds = 0;
	uint32_t trials = 0;
	enum mode_id mode = NONE;
	int c;

	*o = (struct alloc_opts){
		.blocks = 65536, .keep = 32, .occupancies = 2, .occupancy = { 0.5, 0.99 },
	};
	opterr = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		switch (c) {
		case 'm':
			for (mode = FIRST_MODE; mode < MODES && strcmp(optarg, modes[mode].name); mode++)
				;
			if (mode == MODES)
				return usage_error("unknown mode '%s'", optarg);
			break;
		case 'o':
			if (bench_parse_double(optarg, 0, 0.9999, &o->occupancy[0]) < 0)
				return usage_error("--occupancy '%s': a fraction in [0, 1)", optarg);
			o->occupancies = 1;
			break;
		case 'b':
			if (bench_parse_u32(optarg, 256, 1u << 26, &o->blocks) < 0)
				return usage_error("--blocks '%s': 256 to 67108864", optarg);
			break;
		case 'k':
			if (bench_parse_u32(optarg, 1, 4096, &o->keep) < 0)
				return usage_error("--keep '%s': 1 to 4096", optarg);
			break;
		case 's':
			if (bench_parse_double(optarg, 0.001, 60, &seconds) < 0)
				return usage_error("--seconds '%s': 0.001 to 60", optarg);
			break;
		case 't':
			if (bench_parse_u32(optarg, 1, BENCH_MAX_TRIALS, &trials) < 0)
				return usage_error("--trials '%s': 1 to 99", optarg);
			break;
		case 'q':
			o->quick = true;
			break;
		case 'h':
			return 1;
		case ':':
			return usage_error("option '%s' needs a value", argv[optind - 1]);
		default:
			return usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return usage_error("unexpected argument '%s'", argv[optind]);

	o->plan.trials = trials ? trials : o->quick ? 1 : 7;
	if (!seconds)
		seconds = o->quick ? 0.02 : 0.15;
	o->plan.trial_ns = (uint64_t)(seconds * 1e9);
	o->plan.warmup_ns = o->plan.trial_ns / 4;
	for (unsigned oi = 0; oi < o->occupancies; oi++) {
		uint32_t held = (uint32_t)(o->occupancy[oi] * o->blocks + 0.5);

		/* two processes hold `keep` blocks each at once */
		if (o->blocks - held < 2 * o->keep)
			return usage_error("occupancy %.4f of %u blocks leaves fewer free "
					   "blocks than two processes keep (2 x %u)",
					   o->occupancy[oi], o->blocks, o->keep);
	}
	for (enum mode_id m = FIRST_MODE; m < MODES; m++)
		o->printed[m] = mode == NONE || mode == m;
	for (enum mode_id m = FIRST_MODE; m < MODES; m++) {
		if (!o->printed[m])
			continue;
		o->measured[m] = true;
		if (modes[m].vs_dpdk != NONE)
			o->measured[modes[m].vs_dpdk] = true;
		if (modes[m].vs_single != NONE)
			o->measured[modes[m].vs_single] = true;
		if (modes[m].vs_mutex != NONE)
			o->measured[modes[m].vs_mutex] = true;
		if (modes[m].vs_separate != NONE)
			o->measured[modes[m].vs_separate] = true;
	}
	return 0;
}

int bench_alloc_main(int argc, char **argv)
{
	struct group groups[MAX_OCC];
	struct alloc_opts o;
	bool any_group = false;
	int ret;

	if ((ret = parse(argc, argv, &o)) != 0) {
		if (ret > 0)
			usage(stdout);
		return ret > 0 ? 0 : 2;
	}
	memset(groups, 0, sizeof(groups));
	for (enum mode_id m = FIRST_MODE; m < MODES; m++)
		any_group |= o.measured[m] && modes[m].kind != KIND_RECLAIM;
	if (any_group) {
		struct dpdk_peer *d = malloc(sizeof(*d));

		if (!d) {
			fprintf(stderr, "kvarena-bench alloc: failed: %s\n", strerror(ENOMEM));
			return 1;
		}
		/* a missing peer only leaves its ratios null */
		(void)dpdk_start(&o, d);
		for (unsigned oi = 0; oi < o.occupancies && ret == 0; oi++) {
			fprintf(stderr, "alloc: occupancy %.4f, %u blocks, keep %u\n",
				o.occupancy[oi], o.blocks, o.keep);
			ret = run_group(&o, oi, &groups[oi], d);
		}
		dpdk_stop(d);
		free(d);
	}
	if (ret == 0 && o.printed[RECLAIM])
		ret = run_reclaim(&o);
	if (ret < 0)
		fprintf(stderr, "kvarena-bench alloc: failed: %s\n", strerror(-ret));
	return ret < 0 ? 1 : 0;
}
