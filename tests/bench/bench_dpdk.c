/* SPDX-License-Identifier: MIT */
/*
 * bench_dpdk.c - the DPDK peer of `kvarena-bench alloc`: rte_mempool measured
 * with the same loop as kvarena (bench_loop), in the same run. Built only
 * when libdpdk is found; it alone is compiled with DPDK's flags.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int mp_trial(void *ctx, uint64_t start_ns, uint64_t end_ns, struct bench_result *r)
{
	struct mp_ctx *c = ctx;

	/* two call sites, so that each copy of the loop has a constant step */
	if (c->bulk)
		return bench_loop(c, c->keep, c->keep, mp_get, mp_put, start_ns, end_ns, r);
	return bench_loop(c, c->keep, 1, mp_get, mp_put, start_ns, end_ns, r);
}

/* The context is made by measure_pool(), in this process: nothing to open. */
static int mp_open(void *arg, unsigned proc, void **ctx)
{
	(void)proc;
	*ctx = arg;
	return 0;
}

static void mp_close(void *ctx)
{
	(void)ctx;
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
		struct mp_ctx c = { .mp = mp, .keep = req->keep, .bulk = req->run[r].bulk,
				    .objs = objs };
		struct bench_subject s = { "rte_mempool", &c, mp_open, mp_trial, mp_close };
		char name[32];

		if (req->run[r].cache != cache)
			continue;
		if ((ret = bench_measure(&s, &req->plan, 1, &rep->fig[oi][r])) < 0)
			goto out;
		snprintf(name, sizeof(name), "rte_mempool cache %u%s", cache,
			 req->run[r].bulk ? " bulk" : "");
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
