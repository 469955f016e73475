/* SPDX-License-Identifier: MIT */
/*
 * stats.c - what ops tools read of the prefix cache and of sequences.
 */
#include <errno.h>
#include <stdio.h>
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
				    !(c & KVA__P_SPILLED) &&
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


static void view_str(const _Atomic uint64_t *w, size_t words, char *out, size_t len)
{
	char buf[256];
	size_t n;

	for (size_t i = 0; i < words && i * 8 + 8 <= sizeof(buf); i++) {
		uint64_t v = atomic_load_explicit(&w[i], memory_order_relaxed);

		memcpy(buf + 8 * i, &v, 8);
	}
	buf[words * 8 - 1] = 0; /* whatever was written there */
	n = strnlen(buf, len - 1);
	memcpy(out, buf, n);
	out[n] = 0;
}

int kva_arena_tier_stats(struct kva_arena *a, struct kva_tiers_stats *st)
{
	const struct kva__tier_view *v;
	uint64_t sc[KVA__SC_N] = { 0 };

	if (!a || !st)
		return kva__err(-EINVAL, "tier stats: NULL argument");
	memset(st, 0, sizeof(*st));
	v = &a->pool->tier_view;
	for (int k = 0; k < KVA_TIERS; k++) {
		const struct kva__tier_view_one *o = &v->t[k];
		struct kva_tier_stats *t = &st->tier[k];
		uint64_t x[KVA__TV_N];

		for (int j = 0; j < KVA__TV_N; j++)
			x[j] = atomic_load_explicit(&o->v[j], memory_order_relaxed);
		t->enabled = !!(x[KVA__TV_FLAGS] & KVA__TVF_ENABLED);
		t->degraded = !!(x[KVA__TV_FLAGS] & KVA__TVF_DEGRADED);
		t->direct = !!(x[KVA__TV_FLAGS] & KVA__TVF_DIRECT);
		t->hugetlb = !!(x[KVA__TV_FLAGS] & KVA__TVF_HUGETLB);
		t->preallocated = !!(x[KVA__TV_FLAGS] & KVA__TVF_PREALLOC);
		t->warming = !!(x[KVA__TV_FLAGS] & KVA__TVF_WARMING);
		if (k == KVA_TIER_HOST)
			t->numa_node = (int32_t)(uint32_t)x[KVA__TV_NODE_QD];
		else
			t->queue_depth = (uint32_t)x[KVA__TV_NODE_QD];
		if (k == KVA_TIER_DISK)
			t->numa_node = -1;
		t->capacity_records = x[KVA__TV_CAP_RECORDS];
		t->used_records = x[KVA__TV_USED_RECORDS];
		t->record_bytes = x[KVA__TV_RECORD_BYTES];
		t->hits = x[KVA__TV_HITS];
		t->records_in = x[KVA__TV_RECORDS_IN];
		t->bytes_in = x[KVA__TV_BYTES_IN];
		t->bytes_out = x[KVA__TV_BYTES_OUT];
		t->fetch_p50_ns = x[KVA__TV_P50_NS];
		t->fetch_p99_ns = x[KVA__TV_P99_NS];
		t->io_errors = x[KVA__TV_IO_ERRORS];
		t->verify_failed = x[KVA__TV_VERIFY_FAILED];
		t->stale = x[KVA__TV_STALE];
		t->dropped = x[KVA__TV_DROPPED];
		t->restart_found = x[KVA__TV_RESTART_FOUND];
		t->restart_dropped = x[KVA__TV_RESTART_DROPPED];
		t->scan_done = x[KVA__TV_SCAN_DONE];
		t->scan_total = x[KVA__TV_SCAN_TOTAL];
		t->degraded_ms = x[KVA__TV_DEGRADED_MS];
		view_str(o->reason, 12, t->reason, sizeof(t->reason));
		view_str(o->path, 16, t->path, sizeof(t->path));
	}
	st->backed = atomic_load_explicit(&v->v[KVA__TVS_BACKED], memory_order_relaxed);
	st->back_skipped = atomic_load_explicit(&v->v[KVA__TVS_BACK_SKIPPED], memory_order_relaxed);
	st->fetch_requests = atomic_load_explicit(&v->v[KVA__TVS_FETCH_REQUESTS],
						  memory_order_relaxed);
	for (unsigned i = 0; i < KVA__SC_N; i++)
		sc[i] = atomic_load_explicit(&a->pool->gone[i], memory_order_relaxed);
	for (uint32_t s = 0; s < a->max_workers; s++)
		for (unsigned i = 0; i < KVA__SC_N; i++)
			sc[i] += atomic_load_explicit(&a->slots[s].sc[i], memory_order_relaxed);
	st->unbacked_evictions = sc[KVA__SC_UNBACKED];
	st->below_found = sc[KVA__SC_BELOW];
	st->fetched = sc[KVA__SC_FETCHED_HOST] + sc[KVA__SC_FETCHED_DISK];
	st->fetch_failed = sc[KVA__SC_FETCH_FAILED];
	/* hits are the blocks workers got and checked; the host tier's are
	 * copied by the workers themselves, so its latencies are theirs too */
	st->tier[KVA_TIER_HOST].hits = sc[KVA__SC_FETCHED_HOST];
	st->tier[KVA_TIER_DISK].hits = sc[KVA__SC_FETCHED_DISK];
	st->tier[KVA_TIER_HOST].bytes_out = sc[KVA__SC_FETCHED_HOST] * a->info.layout.block_bytes;
	st->tier[KVA_TIER_HOST].verify_failed += sc[KVA__SC_VERIFY_HOST];
	st->tier[KVA_TIER_DISK].verify_failed += sc[KVA__SC_VERIFY_DISK];
	{
		uint64_t h[KVA__HIST_N] = { 0 }, total = 0, acc = 0;
		bool p50 = false;

		for (uint32_t s = 0; s < a->max_workers; s++)
			for (unsigned b = 0; b < KVA__HIST_N; b++)
				h[b] += atomic_load_explicit(&a->fetch[s].host_hist[b],
							     memory_order_relaxed);
		for (unsigned b = 0; b < KVA__HIST_N; b++)
			total += h[b];
		for (unsigned b = 0; b < KVA__HIST_N && total; b++) {
			acc += h[b];
			if (!p50 && 2 * acc >= total) {
				st->tier[KVA_TIER_HOST].fetch_p50_ns = kva__hist_value(b);
				p50 = true;
			}
			if (100 * acc >= 99 * total) {
				st->tier[KVA_TIER_HOST].fetch_p99_ns = kva__hist_value(b);
				break;
			}
		}
	}
	for (uint64_t pos = 0; pos <= a->idx_mask; pos++) {
		uint64_t c = atomic_load_explicit(&a->idx[pos].ctrl, memory_order_relaxed);

		if (kva__p_is_spilled(c)) {
			if (c & KVA__P_DISK)
				st->spilled_disk++;
			else
				st->spilled_host++;
		}
	}
	return 0;
}
