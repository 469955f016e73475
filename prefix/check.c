/* SPDX-License-Identifier: MIT */
/*
 * check.c - kva_arena_check()'s half in the prefix room: a published block is
 * findable in the index under the key it was published with, and every VALID
 * entry names a block published in that life under its key.
 */
#include "prefix_pvt.h"

/* entry @pos's key, read once (check runs over a quiet arena; a moving one
 * may show a mismatch that a second look does not) */
static void entry_key(struct kva_arena *a, uint64_t pos, uint64_t k[2])
{
	k[0] = atomic_load_explicit(&a->idx[pos].key[0], memory_order_relaxed);
	k[1] = atomic_load_explicit(&a->idx[pos].key[1], memory_order_relaxed);
}

static bool block_key_is(struct kva_arena *a, uint32_t b, const uint64_t k[2])
{
	return atomic_load_explicit(&a->bmeta[b].key[0], memory_order_relaxed) == k[0] &&
	       atomic_load_explicit(&a->bmeta[b].key[1], memory_order_relaxed) == k[1];
}

/* a published block: its own entry names it, in this life, under its key */
void kva__prefix_check_block(struct kva_arena *a, uint32_t id, uint64_t d, struct kva_check_report *r)
{
	uint64_t pos = atomic_load_explicit(&a->bmeta[id].entry, memory_order_relaxed), c = 0, k[2];

	if (pos && pos - 1 <= a->idx_mask)
		c = atomic_load_explicit(&a->idx[pos - 1].ctrl, memory_order_relaxed);
	if (kva__p_state(c) != KVA__P_VALID || kva__p_block(c) != id ||
	    kva__p_epoch(c) != kva__d_epoch(d)) {
		r->index_bad++;
		kva__check_problem(r, id, "block %u: %s, but no index entry names it", id,
			kva__d_kind(d) == KVA__D_CACHED ? "cached" : "published");
		return;
	}
	entry_key(a, pos - 1, k);
	if (!block_key_is(a, id, k)) {
		r->index_bad++;
		kva__check_problem(r, id, "block %u: its index entry %llu holds another key than the one "
			"it was published under", id, (unsigned long long)(pos - 1));
	}
}

/* every VALID entry: the block of its life is published, under its key */
void kva__prefix_check_index(struct kva_arena *a, struct kva_check_report *r)
{
	for (uint64_t pos = 0; pos <= a->idx_mask; pos++) {
		uint64_t c = atomic_load_explicit(&a->idx[pos].ctrl, memory_order_relaxed), d, k[2];
		uint32_t b = kva__p_block(c);

		if (kva__p_state(c) != KVA__P_VALID)
			continue;
		if (b >= a->blocks) {
			r->index_bad++;
			kva__check_problem(r, -1, "index entry %llu: names block %u, past the arena's %u",
				(unsigned long long)pos, b, a->blocks);
			continue;
		}
		d = atomic_load_explicit(&a->desc[b], memory_order_relaxed);
		if (kva__d_epoch(d) != kva__p_epoch(c))
			continue; /* an older life's: stale, removed by whoever meets it */
		if (kva__d_kind(d) != KVA__D_CACHED &&
		    !(kva__d_kind(d) == KVA__D_SHARED && (d & KVA__D_PUB))) {
			r->index_bad++;
			kva__check_problem(r, b, "index entry %llu: names block %u, which is %s in that life",
				(unsigned long long)pos, b,
				kva__d_kind(d) == KVA__D_FREE ? "free" : "not published");
			continue;
		}
		entry_key(a, pos, k);
		if (!block_key_is(a, b, k)) {
			r->index_bad++;
			kva__check_problem(r, b, "index entry %llu: names block %u, published under another "
				"key", (unsigned long long)pos, b);
		}
	}
}

