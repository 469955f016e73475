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
 * PREFIX (the default): LRU-2 in the manner of ARC's history. A cached block
 * that has been used by two requests (a match, or a publication of a key
 * evicted not long ago) is ranked above every block used once; within a
 * class, least recently used first, and within one request's blocks the
 * deepest first (a leaf is worth less than the prefix leading to it, and
 * evicting a parent strands its children). A one-time document therefore
 * never pushes out a prefix that requests share, and a block evicted too
 * early is recognised when it comes back: its index entry stays as a ghost
 * (key, use count, eviction number) for the next 2 x c evictions (c the
 * cache's capacity: ARC's directory size), and a publication of the same key takes the ghost's
 * history over. Nothing in it is tuned to a trace.
 *
 * The order is kept nearly exact without a shared list: evictors take any
 * cached block ranked at or below a shared threshold as the hand passes it,
 * and when the hand finds none, the threshold is set again to the 1/32
 * quantile of the ranks it saw (up to 8192 of them). A sample of 32 ranked
 * by minimum, tried first, lost 6-9% of LRU's hits on the shared trace.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "arena_pvt.h"

#define SWEEP 64u   /* ids a hand step covers */

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

int kva_arena_set_cache_limit(struct kva_arena *a, uint64_t blocks)
{
	if (!a)
		return kva__err(-EINVAL, "set cache limit: NULL arena");
	if (a->readonly)
		return kva__err(-EROFS, "set cache limit: this mapping is read-only");
	atomic_store_explicit(&a->pool->cache_limit, blocks, memory_order_relaxed);
	return 0;
}

/*
 * kva__publish_room - count one more published block, evicting (and
 * freeing) a cached one first if the cache limit says so. false: at the
 * limit with nothing evictable; the caller does not publish.
 */
bool kva__publish_room(struct kva_worker *w)
{
	struct kva__pool *p = w->arena->pool;
	uint64_t lim = atomic_load_explicit(&p->cache_limit, memory_order_relaxed);
	uint64_t n = atomic_load_explicit(&p->published, memory_order_relaxed);

	for (;;) {
		uint32_t id;

		if (!lim || n < lim) {
			if (atomic_compare_exchange_weak_explicit(&p->published, &n, n + 1,
								  memory_order_relaxed,
								  memory_order_relaxed))
				return true;
			continue;
		}
		if (!kva__evict(w, 1, &id))
			return false;
		kva__pool_release_one(w, id);
		n = atomic_load_explicit(&p->published, memory_order_relaxed);
	}
}

/*
 * The hint word: logical time of the last use (40 bits), depth in the prefix
 * chain (16 bits, saturating), uses beyond the first (8 bits, saturating).
 */
#define H_TICK_SHIFT 24
#define H_DEPTH_SHIFT 8

static uint64_t hint_make(uint64_t tick, uint32_t depth, uint32_t hits)
{
	return (tick << H_TICK_SHIFT) | ((uint64_t)(depth > 0xffff ? 0xffff : depth) << H_DEPTH_SHIFT) |
	       (hits > 0xff ? 0xff : hits);
}
static uint64_t hint_tick(uint64_t h) { return h >> H_TICK_SHIFT; }
static uint32_t hint_depth(uint64_t h) { return (uint32_t)(h >> H_DEPTH_SHIFT) & 0xffff; }
static uint32_t hint_hits(uint64_t h) { return (uint32_t)h & 0xff; }

/* by the publisher, holding @id alone, before the release that publishes it */
void kva__hint_publish(struct kva_arena *a, uint32_t id, const uint64_t key[2], uint64_t tick,
		       uint32_t depth, uint32_t hits, uint64_t pos)
{
	atomic_store_explicit(&a->bmeta[id].key[0], key[0], memory_order_relaxed);
	atomic_store_explicit(&a->bmeta[id].key[1], key[1], memory_order_relaxed);
	atomic_store_explicit(&a->bmeta[id].hint, hint_make(tick, depth, hits),
			      memory_order_relaxed);
	atomic_store_explicit(&a->bmeta[id].entry, pos + 1, memory_order_relaxed);
}

void kva__hint_touch(struct kva_arena *a, uint32_t id, uint64_t tick, bool hit)
{
	uint64_t h = atomic_load_explicit(&a->bmeta[id].hint, memory_order_relaxed);
	uint32_t hits = hint_hits(h) + hit;

	/* a racing toucher may lose an update: a hint, not a count */
	atomic_store_explicit(&a->bmeta[id].hint,
			      hint_make(tick > hint_tick(h) ? tick : hint_tick(h), hint_depth(h),
					     hits),
			      memory_order_relaxed);
}

/*
 * A ghost (evict.c's history in the index) is live for 2 x c evictions, c the
 * cache's capacity (its limit, else the arena): ARC's directory of 2c.
 */
bool kva__ghost_live(struct kva_arena *a, uint64_t info)
{
	uint64_t now = atomic_load_explicit(&a->pool->evictions, memory_order_relaxed);
	uint64_t c = atomic_load_explicit(&a->pool->cache_limit, memory_order_relaxed);

	return now - (info >> 8) <= 2ull * (c && c < a->blocks ? c : a->blocks);
}

/* PREFIX's rank, lower evicted first: used twice or more above once, then
 * the last use, then the deeper block first */
static uint64_t rank(uint64_t h)
{
	return ((uint64_t)(hint_hits(h) > 0) << 63) | (hint_tick(h) & ((1ull << 47) - 1)) << 16 |
	       (0xffff - hint_depth(h));
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
	atomic_fetch_sub_explicit(&a->pool->published, 1, memory_order_relaxed);
	KVA__CRASH_POINT(KVA__CP_EVICT_TAKEN);
	pos = atomic_load_explicit(&a->bmeta[id].entry, memory_order_relaxed);
	if (pos) /* the entry stays as a ghost: this key's history */
		kva__index_remove(a, pos - 1, id, kva__d_epoch(d),
				  hint_hits(atomic_load_explicit(&a->bmeta[id].hint,
								 memory_order_relaxed)) + 1,
				  atomic_fetch_add_explicit(&a->pool->evictions, 1,
							    memory_order_relaxed) + 1);
	atomic_store_explicit(&a->bmeta[id].entry, 0, memory_order_relaxed);
	return true;
}

/*
 * next_id - the next block id under the hand. Each worker takes SWEEP ids at
 * a time from the shared hand and looks at every one of them, across calls:
 * a hand that skipped the rest of its share after a victim would leave the
 * same ids unseen forever (and evict the blocks that land on the others).
 */
static uint32_t next_id(struct kva_worker *w)
{
	struct kva_arena *a = w->arena;
	uint32_t id;

	if (!w->sweep_left) {
		w->sweep_pos = atomic_fetch_add_explicit(&a->pool->hand, SWEEP,
							 memory_order_relaxed) % a->blocks;
		w->sweep_left = SWEEP;
	}
	id = w->sweep_pos;
	w->sweep_pos = w->sweep_pos + 1 == a->blocks ? 0 : w->sweep_pos + 1;
	w->sweep_left--;
	return id;
}

static uint32_t evict_clock(struct kva_worker *w, uint32_t want, uint32_t *ids)
{
	struct kva_arena *a = w->arena;
	/* ids looked at since the last take: two turns clear every REF once */
	uint64_t budget = 2ull * a->blocks + SWEEP;
	uint32_t got = 0;

	while (got < want && budget--) {
		uint32_t id = next_id(w);
		uint64_t d = atomic_load_explicit(&w->desc[id], memory_order_relaxed);

		if (kva__d_kind(d) != KVA__D_CACHED)
			continue;
		if (d & KVA__D_REF) {
			atomic_compare_exchange_strong_explicit(&w->desc[id], &d, d & ~KVA__D_REF,
								memory_order_relaxed,
								memory_order_relaxed);
			continue;
		}
		if (take(w, id, d)) {
			ids[got++] = id;
			budget = 2ull * a->blocks + SWEEP;
		}
	}
	return got;
}

#define QUANTILE 32u   /* PREFIX: the threshold is the 1/32 quantile of ranks */
#define RANKS 8192u    /* ranks a threshold is computed from, at most */

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;

	return a < b ? -1 : a > b;
}

static uint32_t evict_prefix(struct kva_worker *w, uint32_t want, uint32_t *ids)
{
	struct kva_arena *a = w->arena;
	uint64_t thr = atomic_load_explicit(&a->pool->threshold, memory_order_relaxed);
	uint32_t got = 0, n = 0, scanned = 0, limit = a->blocks < RANKS ? a->blocks : RANKS;
	uint32_t resets = 0;

	while (got < want) {
		uint32_t id = next_id(w);
		uint64_t d = atomic_load_explicit(&w->desc[id], memory_order_relaxed), r;

		scanned++;
		if (kva__d_kind(d) == KVA__D_CACHED) {
			r = rank(atomic_load_explicit(&a->bmeta[id].hint, memory_order_relaxed));
			if (r <= thr && take(w, id, d)) {
				ids[got++] = id;
				scanned = n = resets = 0;
				continue;
			}
			/* once per worker, not per eviction: RANKS at most */
			if (!w->ranks && !(w->ranks = malloc(sizeof(*w->ranks) * RANKS)))
				return got; /* no memory for the threshold: what we have */
			if (n < limit)
				w->ranks[n++] = r;
		}
		if (scanned < limit)
			continue;
		/* a stretch without a victim: a new threshold from its ranks */
		if (!n || ++resets > 4)
			break; /* nothing cached (or every victim taken under us) */
		qsort(w->ranks, n, sizeof(*w->ranks), cmp_u64);
		thr = w->ranks[(n - 1) / QUANTILE];
		atomic_store_explicit(&a->pool->threshold, thr, memory_order_relaxed);
		scanned = n = 0;
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
