/* SPDX-License-Identifier: MIT */
/*
 * stats.c - what ops tools read of the prefix cache and of sequences.
 */
#include <errno.h>
#include <string.h>

#include "prefix_pvt.h"

int kva_arena_prefix_stats(struct kva_arena *a, struct kva_prefix_stats *st)
{
	uint64_t sc[KVA__SC_N] = { 0 };

	if (!a || !st)
		return -EINVAL;
	memset(st, 0, sizeof(*st));
	st->policy = atomic_load_explicit(&a->pool->policy, memory_order_relaxed) == KVA_EVICT_CLOCK
			     ? KVA_EVICT_CLOCK
			     : KVA_EVICT_PREFIX;
	st->index_entries = a->idx_mask + 1;
	for (uint64_t pos = 0; pos <= a->idx_mask; pos++) {
		uint32_t state = kva__p_state(atomic_load_explicit(&a->idx[pos].ctrl,
								   memory_order_relaxed));

		uint64_t c = atomic_load_explicit(&a->idx[pos].ctrl, memory_order_relaxed);

		st->index_valid += state == KVA__P_VALID;
		st->index_tombstones += state == KVA__P_TOMB && !(c & KVA__P_GHOST);
		st->index_ghosts += state == KVA__P_TOMB && (c & KVA__P_GHOST) &&
				    kva__ghost_live(a, atomic_load_explicit(&a->idx[pos].info,
									   memory_order_relaxed));
	}
	for (uint32_t id = 0; id < a->blocks; id++) {
		uint64_t d = atomic_load_explicit(&a->desc[id], memory_order_relaxed);

		st->cached_blocks += kva__d_kind(d) == KVA__D_CACHED;
		st->published_blocks += kva__d_kind(d) == KVA__D_SHARED && (d & KVA__D_PUB);
	}
	for (unsigned i = 0; i < KVA__SC_N; i++)
		sc[i] = atomic_load_explicit(&a->pool->gone[i], memory_order_relaxed);
	for (uint32_t s = 0; s < a->max_workers; s++) {
		struct kva__slot *sl = &a->slots[s];

		for (unsigned i = 0; i < KVA__SC_N; i++)
			sc[i] += atomic_load_explicit(&sl->sc[i], memory_order_relaxed);
		st->open_seqs += atomic_load_explicit(&sl->open_seqs, memory_order_relaxed);
		for (unsigned k = 0; k < KVA_OWNER_KINDS; k++)
			st->kind_blocks[k] += atomic_load_explicit(&sl->kind_blocks[k],
								   memory_order_relaxed);
		for (unsigned t = 0; t < KVA_MAX_TENANT_QUOTAS; t++)
			st->tenant_blocks[t] += atomic_load_explicit(&sl->tenant_blocks[t],
								     memory_order_relaxed);
	}
	st->hits = sc[KVA__SC_HITS];
	st->misses = sc[KVA__SC_MISSES];
	st->published = sc[KVA__SC_PUBLISHED];
	st->duplicates = sc[KVA__SC_DUPLICATES];
	st->evictions = sc[KVA__SC_EVICTIONS];
	st->stale_entries = sc[KVA__SC_STALE];
	st->index_full = sc[KVA__SC_INDEX_FULL];
	st->published_now = kva__pub_sum(a);
	st->cache_limit = atomic_load_explicit(&a->pool->cache_limit, memory_order_relaxed);
	for (unsigned k = 0; k < KVA_OWNER_KINDS; k++)
		st->quotas.kind[k] = atomic_load_explicit(&a->pool->quota_kind[k],
							  memory_order_relaxed);
	for (unsigned t = 0; t < KVA_MAX_TENANT_QUOTAS; t++) {
		st->quotas.tenant[t].tenant = atomic_load_explicit(&a->pool->quota_tenant[t][0],
								   memory_order_relaxed);
		st->quotas.tenant[t].blocks = atomic_load_explicit(&a->pool->quota_tenant[t][1],
								   memory_order_relaxed);
	}
	return 0;
}

int kva_arena_seq_stats(struct kva_arena *a, uint32_t slot, struct kva_seq_slot_stats *st)
{
	struct kva__slot *sl;

	if (!a || !st || slot >= a->max_workers)
		return -EINVAL;
	sl = &a->slots[slot];
	memset(st, 0, sizeof(*st));
	st->open_seqs = atomic_load_explicit(&sl->open_seqs, memory_order_relaxed);
	for (unsigned k = 0; k < KVA_OWNER_KINDS; k++)
		st->kind_blocks[k] = atomic_load_explicit(&sl->kind_blocks[k], memory_order_relaxed);
	st->hits = atomic_load_explicit(&sl->sc[KVA__SC_HITS], memory_order_relaxed);
	st->misses = atomic_load_explicit(&sl->sc[KVA__SC_MISSES], memory_order_relaxed);
	st->published = atomic_load_explicit(&sl->sc[KVA__SC_PUBLISHED], memory_order_relaxed);
	st->evictions = atomic_load_explicit(&sl->sc[KVA__SC_EVICTIONS], memory_order_relaxed);
	return 0;
}

