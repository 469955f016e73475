/* SPDX-License-Identifier: MIT */
/*
 * evict.c - taking cached blocks back when allocation finds nothing free.
 *
 * Only CACHED blocks (published, no holder) are candidates; the eviction
 * itself is one CAS, CACHED(epoch e) -> OWNED by the evictor (epoch e + 1),
 * which is also the linearization point against a matcher's CAS
 * CACHED -> SHARED: exactly one lands. Then the evictor removes the block's
 * index entry; if it dies first, the entry names an old epoch and whoever
 * meets it removes it (index.c).
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

#include "prefix_pvt.h"

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

/* Our pub[] word: ours alone to write (arena_pvt.h). */
static uint64_t pub_mine(struct kva_worker *w)
{
	return atomic_load_explicit(&w->arena->pool->pub[w->slot_id], memory_order_relaxed);
}

static void pub_set(struct kva_worker *w, uint32_t count, uint32_t op)
{
	atomic_store_explicit(&w->arena->pool->pub[w->slot_id], kva__pub_word(count, op),
			      memory_order_relaxed);
}

/* kva__pub_sum - the published-block count as the slots' words say it, their
 * operations in flight included: what the cache limit is held against. */
uint64_t kva__pub_sum(struct kva_arena *a)
{
	uint32_t sum = (uint32_t)atomic_load_explicit(&a->pool->pub_fix, memory_order_relaxed);

	for (uint32_t i = 0; i < a->max_workers; i++)
		sum += kva__pub_count(atomic_load_explicit(&a->pool->pub[i], memory_order_relaxed));
	return sum;
}

/*
 * kva__pub_settled - slot @slot's share of the count with @word's operation
 * in flight settled as if the worker had died there: a publication whose
 * block is still OWNED by the slot's generation @gen did not land (its
 * reservation goes); an eviction whose block is OWNED by it did (one block
 * fewer). The worker writes nothing between its CAS or store and settling
 * the word itself, so these are the only states its block can be in.
 */
uint32_t kva__pub_settled(struct kva_arena *a, uint32_t slot, uint32_t gen, uint64_t word)
{
	uint32_t op = kva__pub_op(word), id = (op & ~KVA__PUB_EVICT) - 1;
	const uint64_t tag_mask = ~(KVA__D_EPOCH_MASK << KVA__D_EPOCH_SHIFT);
	uint64_t d;

	if (!op || id >= a->blocks) /* none, or a word nobody wrote as such */
		return kva__pub_count(word);
	d = atomic_load_explicit(&a->desc[id], memory_order_relaxed);
	if ((d & tag_mask) == kva__d_make(KVA__D_OWNED, 0, kva__owner_tag(slot, gen)))
		return kva__pub_count(word) - 1;
	return kva__pub_count(word);
}

/*
 * kva__publish_room - reserve a place for @id among the published blocks,
 * evicting (and freeing) a cached one first if the cache limit says so.
 * false: at the limit with nothing evictable; the caller does not publish.
 * On true the caller ends with kva__publish_done().
 *
 * The limit holds exactly against concurrent publishers: each stores its
 * reservation, then (seq_cst fence) reads everyone's. Of two reservers, the
 * later in the fences' total order reads both reservations, so they cannot
 * both see room for one (a Dekker pair); a reserver that sees too many
 * withdraws and evicts, or gives up.
 */
bool kva__publish_room(struct kva_worker *w, uint32_t id)
{
	struct kva__pool *p = w->arena->pool;
	uint64_t lim = atomic_load_explicit(&p->cache_limit, memory_order_relaxed);

	for (;;) {
		uint32_t c = kva__pub_count(pub_mine(w)), victim;

		pub_set(w, c + 1, id + 1);
		if (!lim)
			return true;
		/* pairs with the same fence of every other reserver */
		atomic_thread_fence(memory_order_seq_cst);
		if (kva__pub_sum(w->arena) <= lim)
			return true;
		pub_set(w, c, 0);
		if (!kva__evict(w, 1, &victim))
			return false;
		kva__pool_release_one(w, victim);
	}
}

/* kva__publish_done - the publication reserved by kva__publish_room() landed
 * (the block is SHARED|PUB) or was given up (the block is still ours). */
void kva__publish_done(struct kva_worker *w, bool published)
{
	uint32_t c = kva__pub_count(pub_mine(w));

	pub_set(w, published ? c : c - 1, 0);
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
		       uint32_t depth, uint32_t hits, uint64_t pos, uint64_t backing)
{
	atomic_store_explicit(&a->bmeta[id].backing, backing, memory_order_relaxed);
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

/* PREFIX's rank, lower evicted first: used twice or more above once, then
 * the last use, then the deeper block first */
static uint64_t rank(uint64_t h)
{
	return ((uint64_t)(hint_hits(h) > 0) << 62) | (hint_tick(h) & ((1ull << 46) - 1)) << 16 |
	       (0xffff - hint_depth(h));
}

/*
 * The rank of block @id. With tiers below the arena, a block the agent has
 * not copied yet ranks above every block it has: evicting a copied block
 * only moves it down a tier (a hit still, from there), evicting one not
 * copied loses it. So while the agent catches up with a burst of
 * publications, evictions take what is safe first.
 */
static uint64_t rank_of(struct kva_arena *a, uint32_t id)
{
	uint64_t r = rank(atomic_load_explicit(&a->bmeta[id].hint, memory_order_relaxed));

	if (atomic_load_explicit(&a->pool->tiers, memory_order_relaxed) &&
	    !kva__loc_ok(atomic_load_explicit(&a->bmeta[id].backing, memory_order_relaxed)))
		r |= 1ull << 63;
	return r;
}

/*
 * the eviction CAS; true if the block is now ours. Our pub[] word says which
 * block we are about to take before the CAS and counts it out after: a death
 * between the two is settled by reclaim from the block's descriptor.
 *
 * With tiers below the arena, the block's index entry becomes a spilled
 * ghost naming its copy there, if the agent made one (backing, read after
 * our acquire CAS: the agent stored it while holding the block, before its
 * release); without a copy the bytes are gone, and counted as such.
 */
static bool take(struct kva_worker *w, uint32_t id, uint64_t d)
{
	struct kva_arena *a = w->arena;
	uint32_t c = kva__pub_count(pub_mine(w));
	uint64_t pos, loc = 0;

	if (kva__d_kind(d) != KVA__D_CACHED)
		return false;
	pub_set(w, c, (id + 1) | KVA__PUB_EVICT);
	/* acquire: the last holder's reads of the block (its release CAS)
	 * come before we hand the block out to be written */
	if (!atomic_compare_exchange_strong_explicit(
		    &w->desc[id], &d, kva__d_make(KVA__D_OWNED, kva__d_epoch(d) + 1, w->owner_payload),
		    memory_order_acquire, memory_order_relaxed)) {
		pub_set(w, c, 0);
		return false;
	}
	KVA__CRASH_POINT(KVA__CP_EVICT_TAKEN);
	pub_set(w, c - 1, 0);
	if (atomic_load_explicit(&a->pool->tiers, memory_order_relaxed)) {
		loc = atomic_load_explicit(&a->bmeta[id].backing, memory_order_relaxed);
		if (!kva__loc_ok(loc))
			kva__sc_add(w, KVA__SC_UNBACKED, 1);
	}
	pos = atomic_load_explicit(&a->bmeta[id].entry, memory_order_relaxed);
	if (pos) /* the entry stays as a ghost: this key's history */
		kva__index_remove(a, pos - 1, id, kva__d_epoch(d),
				  hint_hits(atomic_load_explicit(&a->bmeta[id].hint,
								 memory_order_relaxed)) + 1,
				  atomic_fetch_add_explicit(&a->pool->evictions, 1,
							    memory_order_relaxed) + 1,
				  loc);
	atomic_store_explicit(&a->bmeta[id].entry, 0, memory_order_relaxed);
	atomic_store_explicit(&a->bmeta[id].backing, 0, memory_order_relaxed);
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

/* w->ranks, allocated once per worker: RANKS at most. NULL without memory. */
static uint64_t *ranks_buffer(struct kva_worker *w)
{
	if (!w->ranks)
		w->ranks = malloc(sizeof(*w->ranks) * RANKS);
	return w->ranks;
}

static uint32_t evict_prefix(struct kva_worker *w, uint32_t want, uint32_t *ids)
{
	struct kva_arena *a = w->arena;
	uint64_t thr = atomic_load_explicit(&a->pool->threshold, memory_order_relaxed);
	uint32_t got = 0, n = 0, scanned = 0, limit = a->blocks < RANKS ? a->blocks : RANKS;
	uint32_t resets = 0;

	if (!ranks_buffer(w))
		return 0; /* no memory for a threshold: the exhaustive pass */
	while (got < want) {
		uint32_t id = next_id(w);
		uint64_t d = atomic_load_explicit(&w->desc[id], memory_order_relaxed), r;

		scanned++;
		if (kva__d_kind(d) == KVA__D_CACHED) {
			r = rank_of(a, id);
			if (r <= thr && take(w, id, d)) {
				ids[got++] = id;
				scanned = n = resets = 0;
				continue;
			}
			if (n < limit)
				w->ranks[n++] = r;
		}
		if (scanned < limit)
			continue;
		/* a stretch without a victim: a new threshold from its ranks */
		if (!n || ++resets > 4)
			break; /* few cached near the hand, or every victim taken under
				* us: the exhaustive pass decides */
		qsort(w->ranks, n, sizeof(*w->ranks), cmp_u64);
		thr = w->ranks[(n - 1) / QUANTILE];
		atomic_store_explicit(&a->pool->threshold, thr, memory_order_relaxed);
		scanned = n = 0;
	}
	return got;
}

/*
 * evict_exhaustive - what the policy's sweep could not find: every id once,
 * from the hand on. PREFIX ranks every cached block first (up to RANKS of
 * them) and takes the @want lowest, then anything cached that is left; CLOCK
 * takes what is cached, REF or not. So -ENOSPC means that at every id this
 * worker looked at, nothing was evictable: the sweep alone gives up after
 * 8192 ids, or 2 turns of a hand shared with other evictors.
 */
static uint32_t evict_exhaustive(struct kva_worker *w, uint32_t want, uint32_t *ids, bool ranked)
{
	struct kva_arena *a = w->arena;
	uint32_t start = atomic_load_explicit(&a->pool->hand, memory_order_relaxed) % a->blocks;
	uint32_t got = 0, n = 0;
	uint64_t thr = UINT64_MAX;

	if (ranked && ranks_buffer(w)) {
		for (uint32_t i = 0, id = start; i < a->blocks; i++, id = id + 1 == a->blocks ? 0 : id + 1)
			if (n < RANKS && kva__d_kind(atomic_load_explicit(
						 &w->desc[id], memory_order_relaxed)) == KVA__D_CACHED)
				w->ranks[n++] = rank_of(a, id);
		if (!n)
			return 0;
		qsort(w->ranks, n, sizeof(*w->ranks), cmp_u64);
		thr = w->ranks[(want < n ? want : n) - 1];
	}
	for (;;) {
		for (uint32_t i = 0, id = start; i < a->blocks && got < want;
		     i++, id = id + 1 == a->blocks ? 0 : id + 1) {
			uint64_t d = atomic_load_explicit(&w->desc[id], memory_order_relaxed);

			if (kva__d_kind(d) == KVA__D_CACHED &&
			    (thr == UINT64_MAX ||
			     rank_of(a, id) <= thr) &&
			    take(w, id, d))
				ids[got++] = id;
		}
		if (got == want || thr == UINT64_MAX)
			return got;
		thr = UINT64_MAX; /* the lowest were taken under us: anything */
	}
}

/*
 * kva__evict - up to @want cached blocks, now OWNED by @w (not yet in its
 * held[]), in @ids. Returns how many; fewer than @want only if nothing more
 * was evictable (evict_exhaustive).
 */
uint32_t kva__evict(struct kva_worker *w, uint32_t want, uint32_t *ids)
{
	struct kva_arena *a = w->arena;
	bool clock;
	uint32_t got;

	if (!want)
		return 0;
	/* The published count is never below the number of published blocks
	 * (a publication is counted before it lands, an eviction after): zero
	 * means nothing is cached, and no scan is needed to say so. */
	if (!kva__pub_sum(a))
		return 0;
	clock = atomic_load_explicit(&a->pool->policy, memory_order_relaxed) == KVA_EVICT_CLOCK;
	got = clock ? evict_clock(w, want, ids) : evict_prefix(w, want, ids);
	if (got < want)
		got += evict_exhaustive(w, want - got, ids + got, !clock);
	if (got)
		kva__sc_add(w, KVA__SC_EVICTIONS, got);
	return got;
}
