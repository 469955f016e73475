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

/*
 * measure_pool - one mempool of @cache per-lcore cache, @held of its objects
 * taken away from the loop (straight from the ring, not through the cache),
 * and every run of @req with that cache measured on it.
 */
static int measure_pool(const struct bench_dpdk_request *req, uint32_t cache, unsigned oi,
			struct bench_dpdk_report *rep)
{
	uint32_t held = (uint32_t)(req->occupancy[oi] * req->objects + 0.5);
	void **held_objs = malloc(((size_t)held + 1) * sizeof(void *));
	void **objs = malloc((size_t)req->keep * sizeof(void *));
	struct rte_mempool *mp = NULL;
	int ret = -ENOMEM;

	if (!held_objs || !objs)
		goto out;
	mp = rte_mempool_create(cache ? "kvab_cached" : "kvab_uncached", req->objects, 64,
				cache, 0, NULL, NULL, NULL, NULL, SOCKET_ID_ANY, 0);
	if (!mp) {
		ret = -(rte_errno ? rte_errno : ENOMEM);
		fprintf(stderr, "alloc: rte_mempool_create (%u objects, cache %u): %s\n",
			req->objects, cache, rte_strerror(-ret));
		goto out;
	}
	for (uint32_t at = 0; at < held; at += 256) {
		uint32_t n = held - at < 256 ? held - at : 256;

		if ((ret = rte_mempool_generic_get(mp, held_objs + at, n, NULL)) < 0) {
			fprintf(stderr, "alloc: DPDK: holding %u objects: %s\n", held,
				rte_strerror(-ret));
			goto out;
		}
	}
	rep->occupancy[oi] = (double)rte_mempool_in_use_count(mp) / req->objects;

	for (unsigned r = 0; r < req->runs; r++) {
		unsigned procs = req->run[r].procs ? req->run[r].procs : 1;
		struct mp_ctx c = { .mp = mp, .keep = req->keep, .bulk = req->run[r].bulk,
				    .objs = objs, .procs = procs };
		struct bench_subject s = { "rte_mempool", &c, mp_open, mp_trial, mp_close };
		char name[48];

		if (req->run[r].cache != cache)
			continue;
		if (procs > 1 && !shared_memory(mp)) {
			fprintf(stderr, "alloc: DPDK: the mempool is not in shared memory: no "
				"figure for %u processes\n", procs);
			rep->fig[oi][r].pair_ns = rep->fig[oi][r].ops_per_s = NAN;
			continue;
		}
		for (unsigned k = 0; procs > 1 && cache && k < procs; k++)
			if (!(c.caches[k] = rte_mempool_cache_create(cache, SOCKET_ID_ANY))) {
				ret = -(rte_errno ? rte_errno : ENOMEM);
				fprintf(stderr, "alloc: DPDK rte_mempool_cache_create: %s\n",
					rte_strerror(-ret));
			}
		if (ret == 0)
			ret = bench_measure(&s, &req->plan, procs, &rep->fig[oi][r]);
		for (unsigned k = 0; k < procs; k++)
			if (c.caches[k])
				rte_mempool_cache_free(c.caches[k]); /* flushed by its child */
		if (ret < 0)
			goto out;
		snprintf(name, sizeof(name), "rte_mempool cache %u%s%s", cache,
			 req->run[r].bulk ? " bulk" : "", procs > 1 ? ", 2 processes" : "");
		fprintf(stderr, "alloc: %-26s occupancy %.2f  %8.3f ns/pair (trials %.3f..%.3f)\n",
			name, rep->occupancy[oi], rep->fig[oi][r].pair_ns,
			rep->fig[oi][r].pair_ns_min, rep->fig[oi][r].pair_ns_max);
	}
	ret = 0;
out:
	rte_mempool_free(mp);
	free(objs);
	free(held_objs);
	return ret;
}

int bench_dpdk_alloc(const struct bench_dpdk_request *req, struct bench_dpdk_report *rep)
{
	int ret;

	memset(rep, 0, sizeof(*rep));
	if (req->occupancies > BENCH_DPDK_MAX_OCC || req->runs > BENCH_DPDK_MAX_RUNS ||
	    !req->keep || req->keep > req->objects)
		return rep->status = -EINVAL;
	if ((ret = eal_init()) < 0)
		return rep->status = ret;
	for (unsigned oi = 0; oi < req->occupancies && ret == 0; oi++)
		for (unsigned r = 0; r < req->runs && ret == 0; r++) {
			bool first = true;

			/* one pool per cache size, for all the runs that use it */
			for (unsigned q = 0; q < r; q++)
				first &= req->run[q].cache != req->run[r].cache;
			if (first)
				ret = measure_pool(req, req->run[r].cache, oi, rep);
		}
	rte_eal_cleanup();
	return rep->status = ret;
}
