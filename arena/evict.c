/* SPDX-License-Identifier: MIT */
/*
 * evict.c - taking cached blocks back when allocation finds nothing free.
 *
 * Only CACHED blocks (published, no holder) are candidates; the eviction
 * itself is one CAS, CACHED(epoch e) -> OWNED by the evictor (epoch e + 1),
 * which is also the linearization point against a matcher's CAS
 * CACHED -> SHARED: exactly one lands. Then the evictor removes the block's
 * index entry; if it dies first, the entry names an old epoch and whoever
 * meets it removes it (prefix.c).
 *
 * Both policies sweep block ids with a shared hand (one fetch_add per 64
 * ids), so evictors in several processes spread over the arena and none
 * waits for another:
 *
 * CLOCK: second chance. A match sets the descriptor's REF bit; the hand
 * clears it on a CACHED block, or evicts a CACHED block whose bit is clear.
 *
 * PREFIX (the default): the hand samples cached blocks and evicts the least
 * valuable of the sample, ranked by the block's hint (struct kva__bmeta):
 * see rank() below for what it knows and why.
 */
#include <errno.h>
#include <string.h>

#include "arena_pvt.h"

#define SWEEP 64u   /* ids a hand step covers */
#define SAMPLE 32u  /* PREFIX: cached blocks compared for each victim */

const char *kva_evict_policy_name(enum kva_evict_policy p)
{
	switch (p) {
	case KVA_EVICT_CLOCK:
		return "clock";
	case KVA_EVICT_DEFAULT:
	case KVA_EVICT_PREFIX:
		return "prefix";
	}
	return "?";
}

int kva_evict_policy_parse(const char *name, enum kva_evict_policy *out)
{
	if (!name || !out)
		return -EINVAL;
	if (!strcmp(name, "clock"))
		*out = KVA_EVICT_CLOCK;
	else if (!strcmp(name, "prefix") || !strcmp(name, "default"))
		*out = KVA_EVICT_PREFIX;
	else
		return kva__err(-EINVAL, "eviction policy '%s': expected clock or prefix", name);
	return 0;
}

int kva_arena_set_policy(struct kva_arena *a, enum kva_evict_policy p)
{
	if (!a || (p != KVA_EVICT_DEFAULT && p != KVA_EVICT_CLOCK && p != KVA_EVICT_PREFIX))
		return kva__err(-EINVAL, "set policy: no policy %d", (int)p);
	if (a->readonly)
		return kva__err(-EROFS, "set policy: this mapping is read-only");
	atomic_store_explicit(&a->pool->policy, p == KVA_EVICT_DEFAULT ? KVA_EVICT_PREFIX : p,
			      memory_order_relaxed);
	return 0;
}

/*
 * The hint word: logical time of the last use (40 bits), depth in the prefix
 * chain (16 bits, saturating), uses beyond the first (8 bits, saturating).
 */
#define H_TICK_SHIFT 24
#define H_DEPTH_SHIFT 8

uint64_t kva__hint_make(uint64_t tick, uint32_t depth, uint32_t hits)
{
	return (tick << H_TICK_SHIFT) | ((uint64_t)(depth > 0xffff ? 0xffff : depth) << H_DEPTH_SHIFT) |
	       (hits > 0xff ? 0xff : hits);
}
static uint64_t hint_tick(uint64_t h) { return h >> H_TICK_SHIFT; }
static uint32_t hint_depth(uint64_t h) { return (uint32_t)(h >> H_DEPTH_SHIFT) & 0xffff; }
static uint32_t hint_hits(uint64_t h) { return (uint32_t)h & 0xff; }

void kva__hint_publish(struct kva_arena *a, uint32_t id, uint64_t tick, uint32_t depth,
		       uint64_t pos)
{
	atomic_store_explicit(&a->bmeta[id].hint, kva__hint_make(tick, depth, 0),
			      memory_order_relaxed);
	atomic_store_explicit(&a->bmeta[id].entry, pos + 1, memory_order_relaxed);
}

void kva__hint_touch(struct kva_arena *a, uint32_t id, uint64_t tick, bool hit)
{
	uint64_t h = atomic_load_explicit(&a->bmeta[id].hint, memory_order_relaxed);
	uint32_t hits = hint_hits(h) + hit;

	/* a racing toucher may lose an update: a hint, not a count */
	atomic_store_explicit(&a->bmeta[id].hint,
			      kva__hint_make(tick > hint_tick(h) ? tick : hint_tick(h), hint_depth(h),
					     hits),
			      memory_order_relaxed);
}

/*
 * rank - lower is evicted first. LRU order as a base: the last use, and
 * within one use deeper blocks first (a request's blocks are touched
 * together, and a leaf is worth less than the prefix that leads to it:
 * evicting a parent strands its children). PLACEHOLDER refined below.
 */
static uint64_t rank(uint64_t h)
{
	return (hint_tick(h) << 16) | (0xffff - hint_depth(h));
}

/* the eviction CAS; true if the block is now ours */
static bool take(struct kva_worker *w, uint32_t id, uint64_t d)
{
	struct kva_arena *a = w->arena;
	uint64_t pos;

	if (kva__d_kind(d) != KVA__D_CACHED)
		return false;
	/* acquire: the last holder's reads of the block (its release CAS)
	 * come before we hand the block out to be written */
	if (!atomic_compare_exchange_strong_explicit(
		    &w->desc[id], &d, kva__d_make(KVA__D_OWNED, kva__d_epoch(d) + 1, w->owner_payload),
		    memory_order_acquire, memory_order_relaxed))
		return false;
	KVA__CRASH_POINT(KVA__CP_EVICT_TAKEN);
	pos = atomic_load_explicit(&a->bmeta[id].entry, memory_order_relaxed);
	if (pos)
		kva__index_remove(a, pos - 1, id, kva__d_epoch(d));
	atomic_store_explicit(&a->bmeta[id].entry, 0, memory_order_relaxed);
	return true;
}

static uint32_t next_sweep(struct kva_arena *a)
{
	return atomic_fetch_add_explicit(&a->pool->hand, SWEEP, memory_order_relaxed) % a->blocks;
}

static uint32_t evict_clock(struct kva_worker *w, uint32_t want, uint32_t *ids)
{
	struct kva_arena *a = w->arena;
	/* ids scanned since the last take: two turns clear every REF once */
	uint64_t budget = 2ull * a->blocks + SWEEP;
	uint32_t got = 0;

	while (got < want && budget) {
		uint32_t start = next_sweep(a);

		for (uint32_t k = 0; k < SWEEP && got < want && budget; k++, budget--) {
			uint32_t id = (start + k) % a->blocks;
			uint64_t d = atomic_load_explicit(&w->desc[id], memory_order_relaxed);

			if (kva__d_kind(d) != KVA__D_CACHED)
				continue;
			if (d & KVA__D_REF) {
				atomic_compare_exchange_strong_explicit(&w->desc[id], &d,
									d & ~KVA__D_REF,
									memory_order_relaxed,
									memory_order_relaxed);
				continue;
			}
			if (take(w, id, d)) {
				ids[got++] = id;
				budget = 2ull * a->blocks + SWEEP;
			}
		}
	}
	return got;
}

static uint32_t evict_prefix(struct kva_worker *w, uint32_t want, uint32_t *ids)
{
	struct kva_arena *a = w->arena;
	uint64_t budget = 2ull * a->blocks + SWEEP;
	uint32_t got = 0;

	while (got < want && budget) {
		uint32_t best = UINT32_MAX, seen = 0;
		uint64_t best_rank = UINT64_MAX, best_d = 0;

		/* a sample of SAMPLE cached blocks, from where the hand is */
		/* SAMPLE candidates, or what four sweeps past the first one
		 * found: a nearly empty cache must not cost a turn each time */
		for (uint32_t after = 0; seen < SAMPLE && budget && after < 4; after += !!seen) {
			uint32_t start = next_sweep(a);

			for (uint32_t k = 0; k < SWEEP && budget; k++, budget--) {
				uint32_t id = (start + k) % a->blocks;
				uint64_t d = atomic_load_explicit(&w->desc[id], memory_order_relaxed);
				uint64_t r;

				if (kva__d_kind(d) != KVA__D_CACHED)
					continue;
				seen++;
				r = rank(atomic_load_explicit(&a->bmeta[id].hint,
							      memory_order_relaxed));
				if (r < best_rank) {
					best_rank = r;
					best = id;
					best_d = d;
				}
			}
		}
		if (best == UINT32_MAX)
			break;
		if (take(w, best, best_d)) {
			ids[got++] = best;
			budget = 2ull * a->blocks + SWEEP;
		}
		/* else a matcher took it first: sample again */
	}
	return got;
}

/*
 * kva__evict - up to @want cached blocks, now OWNED by @w (not yet in its
 * held[]), in @ids. Returns how many.
 */
uint32_t kva__evict(struct kva_worker *w, uint32_t want, uint32_t *ids)
{
	struct kva_arena *a = w->arena;
	uint32_t got;

	if (!want)
		return 0;
	got = atomic_load_explicit(&a->pool->policy, memory_order_relaxed) == KVA_EVICT_CLOCK
		      ? evict_clock(w, want, ids)
		      : evict_prefix(w, want, ids);
	if (got)
		atomic_store_explicit(&w->slot->sc[KVA__SC_EVICTIONS],
				      atomic_load_explicit(&w->slot->sc[KVA__SC_EVICTIONS],
							   memory_order_relaxed) + got,
				      memory_order_relaxed);
	return got;
}
