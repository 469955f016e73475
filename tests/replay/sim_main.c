/* SPDX-License-Identifier: MIT */
/*
 * sim_main.c - research driver for sim.c: the table of hit ratios of every
 * policy at 5, 10, 20 and 40% of a trace's distinct full blocks.
 *
 *   sim_main TRACE.jsonl        a Mooncake-format trace
 *   sim_main --conversation     rp_trace_gen_conversation(seed 1, 4000)
 *
 * Exit status: 0 done, 1 failed, 2 bad usage.
 */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#endif
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "sim.h"

#define CONV_SEED 1
#define CONV_REQUESTS 4000

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int hit(const struct rp_trace *t, enum rp_sim_policy p, uint64_t cap,
	       const struct rp_sim_opts *o, double *out, double *slowest)
{
	struct rp_sim_result r;
	double t0 = now_s(), dt;
	int rc = rp_sim_ex(t, p, cap, o, &r);

	if (rc) {
		fprintf(stderr, "sim_main: %s at %" PRIu64 " blocks: %s\n", rp_sim_policy_name(p),
			cap, strerror(-rc));
		return rc;
	}
	*out = r.hit_ratio;
	dt = now_s() - t0;
	if (slowest && dt > *slowest)
		*slowest = dt;
	return 0;
}

int main(int argc, char **argv)
{
	static const double fractions[] = { 0.05, 0.10, 0.20, 0.40 };
	const struct rp_sim_opts k16 = { .sample = 16 }, k32 = { .sample = 32 },
				 plain = { .sample = 32, .plain = true };
	struct rp_trace t;
	char err[512] = "";
	double inf, slowest = 0.0;
	bool conv;
	int rc;

	if (argc != 2) {
		fprintf(stderr, "usage: sim_main TRACE.jsonl | --conversation\n");
		return 2;
	}
	conv = !strcmp(argv[1], "--conversation");
	rc = conv ? rp_trace_gen_conversation(CONV_SEED, CONV_REQUESTS, &t)
		  : rp_trace_load(argv[1], &t, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "sim_main: %s\n", conv ? strerror(-rc) : err);
		return 1;
	}
	printf("%s: %zu requests, %" PRIu64 " full blocks, %" PRIu64 " distinct\n",
	       conv ? "conversation (seed 1)" : argv[1], t.n, t.total_full, t.unique_full);
	if (hit(&t, RP_SIM_INFINITE, 0, NULL, &inf, NULL))
		goto fail;
	printf("frac  blocks   inf    belady bypass lru    clock  cand16 cand32 exact  plain32 |"
	       " clock  cand16 cand32 exact  plain32 (/lru)\n");
	for (size_t f = 0; f < sizeof(fractions) / sizeof(fractions[0]); f++) {
		uint64_t cap = rp_capacity_from_fraction(&t, fractions[f]);
		double bel, byp, lru, clk, c16, c32, ex, pl;

		if (hit(&t, RP_SIM_BELADY, cap, NULL, &bel, &slowest) ||
		    hit(&t, RP_SIM_BELADY_BYPASS, cap, NULL, &byp, &slowest) ||
		    hit(&t, RP_SIM_LRU, cap, NULL, &lru, &slowest) ||
		    hit(&t, RP_SIM_CLOCK, cap, NULL, &clk, &slowest) ||
		    hit(&t, RP_SIM_CANDIDATE, cap, &k16, &c16, &slowest) ||
		    hit(&t, RP_SIM_CANDIDATE, cap, &k32, &c32, &slowest) ||
		    hit(&t, RP_SIM_CANDIDATE_EXACT, cap, NULL, &ex, &slowest) ||
		    hit(&t, RP_SIM_CANDIDATE, cap, &plain, &pl, &slowest))
			goto fail;
		printf("%3.0f%% %7" PRIu64 " %.4f %.4f %.4f %.4f %.4f %.4f %.4f %.4f %.4f  | %.3f  %.3f  %.3f  %.3f  %.3f\n",
		       fractions[f] * 100, cap, inf, bel, byp, lru, clk, c16, c32, ex, pl, clk / lru,
		       c16 / lru, c32 / lru, ex / lru, pl / lru);
	}
	printf("slowest single run: %.3f s\n", slowest);
	rp_trace_free(&t);
	return 0;
fail:
	rp_trace_free(&t);
	return 1;
}
