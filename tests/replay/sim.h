/* SPDX-License-Identifier: MIT */
/*
 * sim.h - the offline half of kvarena-replay: load a Mooncake-format request
 * trace (or generate a conversation-style one) and replay it through a
 * simulated prefix cache under one eviction policy, for hit ratios that can
 * be put next to what the arena measures.
 *
 * The semantics are fixed so that figures compare across tools. Units are
 * trace blocks (512 tokens). Requests are processed one at a time, in file
 * order. A request has nf = input_length / 512 full blocks, its first nf
 * hash ids; its last block is partial (never matched, never published)
 * unless input_length is a multiple of 512. It matches the longest cached
 * prefix of its full blocks (k blocks, all hits), then publishes its other
 * full blocks hash_ids[k..nf), evicting as needed; its own blocks (matched
 * or just published) are not evictable until it finishes. hit_ratio = sum k
 * / sum nf.
 *
 * Conventions as in the library: int functions return 0 or a negative errno.
 */
#ifndef KVA_REPLAY_SIM_H
#define KVA_REPLAY_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RP_BLOCK_TOKENS 512

struct rp_request {
	int64_t ts_ms;               /* arrival, ms */
	int32_t input_len, output_len; /* tokens */
	uint32_t n_hash;             /* ceil(input_len / 512) at most */
	uint32_t *hash_ids;          /* prefix block ids, n_hash of them */
};

struct rp_trace {
	struct rp_request *req;
	size_t n;
	uint64_t unique_full;        /* distinct ids among the requests' full blocks */
	uint64_t total_full;         /* sum of nf over the requests */
};

/*
 * rp_trace_load - read a JSON-lines trace from @path into @t (zeroed first).
 * Blank lines are skipped. Each other line must be one JSON object with
 * integer "timestamp" >= 0, "input_length" >= 0, "output_length" >= 0 and
 * "hash_ids", an array of at most ceil(input_length / 512) distinct integers
 * in [0, 2^32), and at least input_length / 512 of them (the full blocks).
 * Other keys are ignored.
 * @err: on failure, "PATH:LINE: why" (or why the file could not be read),
 *	@errlen bytes at most, NUL-terminated. May be NULL.
 * Return: 0; -EINVAL (a malformed line, @t left empty), -ENOMEM, or the
 * negative errno of opening or reading the file.
 */
int rp_trace_load(const char *path, struct rp_trace *t, char *err, size_t errlen);

/* rp_trace_truncate - keep the first @n requests, counts redone. 0 or -ENOMEM. */
int rp_trace_truncate(struct rp_trace *t, size_t n);

/* rp_trace_free - release what rp_trace_load or rp_trace_gen_* gave @t; zeroes it. */
void rp_trace_free(struct rp_trace *t);

/*
 * rp_trace_gen_conversation - a synthetic multi-turn chat trace of
 * @n_requests requests in @t, the same for the same @seed on every machine.
 * The traffic model is described in sim.c above the generator.
 * Return: 0, -EINVAL (@n_requests 0), -ENOMEM.
 */
int rp_trace_gen_conversation(uint64_t seed, size_t n_requests, struct rp_trace *t);

enum rp_sim_policy {
	RP_SIM_INFINITE,        /* unbounded cache: the ceiling the trace allows */
	RP_SIM_LRU,             /* exact LRU, a finished request touched leaf to root */
	RP_SIM_BELADY,          /* evict the block used again farthest ahead */
	RP_SIM_CANDIDATE,       /* the recommended policy, sampled as the arena does:
				 * leaf-first sampling, reuse bonus (sim.c) */
	RP_SIM_CLOCK,           /* second chance; a hit sets the reference bit */
	RP_SIM_CANDIDATE_EXACT, /* the recommended policy's score, exact order */
	RP_SIM_BELADY_BYPASS,   /* Belady that may decline to publish (see sim.c) */
	RP_SIM_POLICIES,
};

struct rp_sim_result {
	double hit_ratio;
	uint64_t hits, full_blocks, evictions;
	uint64_t unpublished; /* full blocks left unpublished: nothing evictable (the
			       * request outgrew the cache), or declined by
			       * RP_SIM_BELADY_BYPASS */
};

struct rp_sim_opts {
	uint32_t sample;    /* RP_SIM_CANDIDATE: candidates compared per victim (0 = 32) */
	bool plain;         /* RP_SIM_CANDIDATE: any evictable block is a candidate and
			     * no walk up to the victim's parent (the ablation) */
};

/*
 * rp_sim - replay @t through a cache of @capacity_blocks blocks under policy
 * @p (@capacity_blocks is ignored by RP_SIM_INFINITE) and fill @r.
 * Deterministic. RP_SIM_CANDIDATE compares 32 sampled candidates.
 * Return: 0, -EINVAL (bad policy, capacity 0, a request whose full blocks
 * repeat an id), -ENOMEM.
 */
int rp_sim(const struct rp_trace *t, enum rp_sim_policy p, uint64_t capacity_blocks,
	   struct rp_sim_result *r);

/* rp_sim_ex - rp_sim with options; @o may be NULL (defaults). */
int rp_sim_ex(const struct rp_trace *t, enum rp_sim_policy p, uint64_t capacity_blocks,
	      const struct rp_sim_opts *o, struct rp_sim_result *r);

/* rp_sim_policy_name - "lru", "belady", ... ; "?" for no such policy. */
const char *rp_sim_policy_name(enum rp_sim_policy p);

/*
 * rp_capacity_from_fraction - @f times the trace's distinct full-block ids,
 * rounded down, at least 1.
 */
uint64_t rp_capacity_from_fraction(const struct rp_trace *t, double f);

#endif /* KVA_REPLAY_SIM_H */
