/* SPDX-License-Identifier: MIT */
/*
 * bench_dpdk.c - the DPDK peer of `kvarena-bench alloc`: rte_mempool measured
 * with the same loop as kvarena (bench_loop), in the same run. Built only
 * when libdpdk is found; it alone is compiled with DPDK's flags.
 */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_mempool.h>

#include "bench.h"

struct mp_ctx {
	struct rte_mempool *mp;
	uint32_t keep;
	bool bulk;
	void **objs;
	/* several processes: each its own cache (NULL: none), as lcores have */
	unsigned procs;
	struct rte_mempool_cache *caches[BENCH_MAX_PROCS], *cache;
};

static inline __attribute__((always_inline)) int
mp_get(void *ctx, uint32_t at, uint32_t n)
{
	struct mp_ctx *c = ctx;

	/* with n == 1 after inlining, this is rte_mempool_get() */
	return rte_mempool_get_bulk(c->mp, c->objs + at, n);
}

static inline __attribute__((always_inline)) int
mp_put(void *ctx, uint32_t at, uint32_t n)
{
	struct mp_ctx *c = ctx;

	rte_mempool_put_bulk(c->mp, c->objs + at, n);
	return 0;
}

/* the same with the process's own cache, passed: forked processes share an lcore id */
static inline __attribute__((always_inline)) int
mp_get_own(void *ctx, uint32_t at, uint32_t n)
{
	struct mp_ctx *c = ctx;

	return rte_mempool_generic_get(c->mp, c->objs + at, n, c->cache);
}

static inline __attribute__((always_inline)) int
mp_put_own(void *ctx, uint32_t at, uint32_t n)
{
	struct mp_ctx *c = ctx;

	rte_mempool_generic_put(c->mp, c->objs + at, n, c->cache);
	return 0;
}

static int mp_trial(void *ctx, uint64_t start_ns, uint64_t end_ns, struct bench_result *r)
{
	struct mp_ctx *c = ctx;

	/* two call sites, so that each copy of the loop has a constant step */
	if (c->procs > 1)
		return bench_loop(c, c->keep, 1, mp_get_own, mp_put_own, start_ns, end_ns, r);
	if (c->bulk)
		return bench_loop(c, c->keep, c->keep, mp_get, mp_put, start_ns, end_ns, r);
	return bench_loop(c, c->keep, 1, mp_get, mp_put, start_ns, end_ns, r);
}

/*
 * The context is made by measure_pool(), in this process: nothing to open.
 * Several processes are forked from this one (bench_measure) and share the
 * pool, whose memory the EAL maps shared (a memfd, under --no-huge; checked
 * by shared_memory()). The EAL pinned this process to one CPU: each child
 * is let run anywhere again, as kvarena's processes are.
 */
static int mp_open(void *arg, unsigned proc, void **ctx)
{
	struct mp_ctx *c = arg;

	if (c->procs > 1) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		cpu_set_t all;

		CPU_ZERO(&all);
		for (long k = 0; k < n && k < CPU_SETSIZE; k++)
			CPU_SET((int)k, &all);
		if (sched_setaffinity(0, sizeof(all), &all) < 0)
			return -errno;
		c->cache = c->caches[proc]; /* our copy of the context (fork) */
	}
	*ctx = c;
	return 0;
}

static void mp_close(void *ctx)
{
	struct mp_ctx *c = ctx;

	/* a child's cache goes back to the pool before the child does */
	if (c->cache)
		rte_mempool_cache_flush(c->cache, c->mp);
}

static int eal_init(void)
{
	/* No huge pages, devices or shared config: only the mempool library is
	 * used, on lcore 0, the CPU this process is pinned to. */
	char *argv[] = {
		"kvarena-bench", "--no-huge", "--no-pci", "--no-shconf", "-l", "0",
		"--log-level=error", "--no-telemetry", "-m", "512", NULL,
	};

	if (rte_eal_init((int)(sizeof(argv) / sizeof(argv[0])) - 1, argv) < 0) {
		int err = rte_errno ? rte_errno : EIO;

		fprintf(stderr, "alloc: DPDK rte_eal_init: %s\n", rte_strerror(err));
		return -err;
	}
	return 0;
}

/* whether the page at @p is mapped shared: forked processes then see one pool */
static bool shared_memory(const void *p)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512], perms[8];
	unsigned long from, to;
	bool shared = false;

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx %7s", &from, &to, perms) == 3 &&
		    (uintptr_t)p >= from && (uintptr_t)p < to) {
			shared = perms[3] == 's';
			break;
		}
	fclose(f);
	return shared;
}

/* a pool of one cache size at one occupancy, kept from one ask to the next */
struct pool {
	struct rte_mempool *mp;
	void **held; /* the objects taken away from the loop */
	double occupancy;
};

/*
 * pool_make - a mempool of @cache per-lcore cache with the occupancy @oi's
 * share of its objects taken away from the loop (straight from the ring, not
 * through the cache). On failure @p keeps its held array and no pool, so
 * that the next ask for it fails at once.
 */
static int pool_make(const struct bench_dpdk_request *req, uint32_t cache, unsigned oi,
		     struct pool *p)
{
	uint32_t held = (uint32_t)(req->occupancy[oi] * req->objects + 0.5);
	char name[RTE_MEMPOOL_NAMESIZE];
	int ret;

	p->held = malloc(((size_t)held + 1) * sizeof(void *));
	if (!p->held)
		return -ENOMEM;
	snprintf(name, sizeof(name), "kvab_c%u_o%u", cache, oi);
	p->mp = rte_mempool_create(name, req->objects, 64, cache, 0, NULL, NULL, NULL, NULL,
				   SOCKET_ID_ANY, 0);
	if (!p->mp) {
		ret = -(rte_errno ? rte_errno : ENOMEM);
		fprintf(stderr, "alloc: rte_mempool_create (%u objects, cache %u): %s\n",
			req->objects, cache, rte_strerror(-ret));
		return ret;
	}
	for (uint32_t at = 0; at < held; at += 256) {
		uint32_t n = held - at < 256 ? held - at : 256;

		if ((ret = rte_mempool_generic_get(p->mp, p->held + at, n, NULL)) < 0) {
			fprintf(stderr, "alloc: DPDK: holding %u objects: %s\n", held,
				rte_strerror(-ret));
			rte_mempool_free(p->mp); /* held, no pool: it failed */
			p->mp = NULL;
			return ret;
		}
	}
	p->occupancy = (double)rte_mempool_in_use_count(p->mp) / req->objects;
	return 0;
}

/* one trial (after its warm-up) of run @r of @req on @p */
static int pool_trial(const struct bench_dpdk_request *req, unsigned r, struct pool *p,
		      void **objs, struct bench_figure *fig)
{
	const struct bench_plan one = { .trials = 1, .trial_ns = req->plan.trial_ns,
					.warmup_ns = req->plan.warmup_ns };
	const uint32_t cache = req->run[r].cache;
	unsigned procs = req->run[r].procs ? req->run[r].procs : 1;
	struct mp_ctx c = { .mp = p->mp, .keep = req->keep, .bulk = req->run[r].bulk,
			    .objs = objs, .procs = procs };
	struct bench_subject s = { "rte_mempool", &c, mp_open, mp_trial, mp_close };
	int ret = 0;

	fig->pair_ns = fig->ops_per_s = fig->pair_ns_min = fig->pair_ns_max = NAN;
	if (procs > 1 && !shared_memory(p->mp)) {
		fprintf(stderr, "alloc: DPDK: the mempool is not in shared memory: no "
			"figure for %u processes\n", procs);
		return 0;
	}
	for (unsigned k = 0; procs > 1 && cache && k < procs && ret == 0; k++)
		if (!(c.caches[k] = rte_mempool_cache_create(cache, SOCKET_ID_ANY))) {
			ret = -(rte_errno ? rte_errno : ENOMEM);
			fprintf(stderr, "alloc: DPDK rte_mempool_cache_create: %s\n",
				rte_strerror(-ret));
		}
	if (ret == 0)
		ret = bench_measure(&s, &one, procs, fig);
	for (unsigned k = 0; k < procs; k++)
		if (c.caches[k])
			rte_mempool_cache_free(c.caches[k]); /* flushed by its child */
	return ret;
}

static int write_full(int fd, const void *buf, size_t len)
{
	for (const char *p = buf; len;) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int bench_dpdk_serve(const struct bench_dpdk_request *req, int in_fd, int out_fd)
{
	/* a pool per cache size (runs share it) and occupancy, made when first asked for */
	struct pool pools[BENCH_DPDK_MAX_RUNS][BENCH_DPDK_MAX_OCC] = { 0 };
	void **objs = NULL;
	int ret;

	if (req->occupancies > BENCH_DPDK_MAX_OCC || req->runs > BENCH_DPDK_MAX_RUNS ||
	    !req->keep || req->keep > req->objects)
		return -EINVAL;
	if ((ret = eal_init()) < 0)
		return ret;
	if (!(objs = malloc((size_t)req->keep * sizeof(void *))))
		ret = -ENOMEM;
	while (ret == 0) {
		struct bench_dpdk_ask ask;
		struct bench_dpdk_answer ans = { 0 };
		struct pool *p;
		unsigned first;

		if ((ret = bench_read_full(in_fd, &ask, sizeof(ask), -1)) < 0) {
			ret = ret == -EPIPE ? 0 : ret; /* the end: nothing more asked */
			break;
		}
		if (ask.occ >= req->occupancies || ask.run >= req->runs) {
			ans.status = -EINVAL;
		} else {
			/* the first run with this cache size names the pool */
			for (first = 0; req->run[first].cache != req->run[ask.run].cache; first++)
				;
			p = &pools[first][ask.occ];
			if (!p->mp && !p->held)
				ans.status = pool_make(req, req->run[first].cache, ask.occ, p);
			else if (!p->mp)
				ans.status = -ENOMEM; /* it failed before */
			if (ans.status == 0)
				ans.status = pool_trial(req, ask.run, p, objs, &ans.fig);
			ans.occupancy = p->occupancy;
		}
		ret = write_full(out_fd, &ans, sizeof(ans));
	}
	for (unsigned r = 0; r < BENCH_DPDK_MAX_RUNS; r++)
		for (unsigned o = 0; o < BENCH_DPDK_MAX_OCC; o++) {
			rte_mempool_free(pools[r][o].mp);
			free(pools[r][o].held);
		}
	free(objs);
	rte_eal_cleanup();
	return ret;
}
