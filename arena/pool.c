/* SPDX-License-Identifier: MIT */
/*
 * pool.c - the free blocks that no worker holds, shared by all workers.
 *
 * The truth is the descriptor array: a block is free iff its descriptor is
 * FREE, and it is claimed by one CAS that writes its owner. Two bitmaps only
 * help to find free blocks quickly, at any occupancy:
 *
 *   l0: one bit per block, "may be free"
 *   l1: one bit per l0 word, "that word may have bits"
 *
 * Invariant kept by every path (and restored by reclaim after a crash):
 *   every FREE descriptor has its l0 bit set, and every nonzero l0 word has
 *   its l1 bit set.
 * Bits may be set for blocks that are not free ("stale"): a claimer that meets
 * one just finds the descriptor taken. So a bit is always cleared *before*
 * the descriptor is looked at again (clearers re-check), and always set
 * *after* the descriptor became FREE (setters publish). A worker killed
 * between two of these steps leaves at worst a free block whose bit is clear;
 * kva_arena_reclaim() sweeps those back.
 *
 * Nothing here waits for anyone: a claimer that loses a race moves to the
 * next bit.
 */
#include "arena_pvt.h"

/*
 * summary_clear - l0 word @i was seen empty: clear its l1 bit, unless it
 * became nonempty meanwhile.
 *
 * Pairs with kva__hint_set(): a setter does (RMW l0, load l1) and we do
 * (RMW l1, load l0), all seq_cst, so at least one of us sees the other's
 * write: either we see the new l0 bits and put the l1 bit back, or the setter
 * sees our cleared l1 bit and sets it again.
 */
static void summary_clear(struct kva_arena *a, uint32_t i)
{
	uint64_t bit = 1ull << (i % 64);

	atomic_fetch_and_explicit(&a->l1[i / 64], ~bit, memory_order_seq_cst);
	KVA__CRASH_POINT(KVA__CP_SUMMARY_CLEAR);
	if (atomic_load_explicit(&a->l0[i], memory_order_seq_cst))
		atomic_fetch_or_explicit(&a->l1[i / 64], bit, memory_order_seq_cst);
}

/*
 * kva__hint_set - mark @bits of l0 word @i "may be free", after the blocks'
 * descriptors were made FREE.
 *
 * The fetch_or is a release that a claimer's or clearer's RMW on the same
 * word acquires (the word's RMWs form one release sequence), so whoever
 * clears one of these bits sees the FREE descriptors written before it. The
 * l1 part pairs with summary_clear().
 */
void kva__hint_set(struct kva_arena *a, uint32_t i, uint64_t bits)
{
	kva__hint_set_inline(a, i, bits);
}

/*
 * claim_word - claim up to @want free blocks among the @mask bits of l0 word
 * @i for @w.
 *
 * A single claim (want == 1, the uncached path) that meets no stale bit
 * leaves its own bit set: one CAS is the whole claim, and the worker's cursor
 * moves past the bit, so the next visitor of the word clears it. A batch (a
 * cache refill) clears what it took, and any stale bits it met, with one
 * fetch_and.
 */
static uint32_t claim_word(struct kva_worker *w, uint32_t i, uint64_t mask, uint32_t want,
			   uint32_t *ids)
{
	struct kva_arena *a = w->arena;
	uint64_t word, bits, taken = 0, stale = 0, old, back = 0;
	uint32_t got = 0;

	/* acquire: pairs with the fetch_or of kva__hint_set(), so the descriptors
	 * we are about to read are at least as new as the bits */
	word = atomic_load_explicit(&a->l0[i], memory_order_acquire);
	if (!word) {
		summary_clear(a, i);
		return 0;
	}
	bits = word & mask;
	while (bits && got < want) {
		uint32_t b = (uint32_t)__builtin_ctzll(bits);
		uint32_t id = i * 64 + b;
		uint64_t d;

		bits &= bits - 1;
		if (unlikely(id >= a->blocks)) { /* a corrupt bit past the end */
			stale |= 1ull << b;
			continue;
		}
		d = atomic_load_explicit(&w->desc[id], memory_order_relaxed);
		/* The claim: FREE -> OWNED by us, one CAS. acquire: the block's
		 * previous owner wrote its data before the release store that
		 * made it FREE (kva__pool_release); we read and overwrite after. */
		if (kva__d_kind(d) == KVA__D_FREE &&
		    atomic_compare_exchange_strong_explicit(
			    &w->desc[id], &d,
			    kva__d_make(KVA__D_OWNED, kva__d_epoch(d), w->owner_payload),
			    memory_order_acquire, memory_order_relaxed)) {
			KVA__CRASH_POINT(KVA__CP_CLAIM_CAS);
			ids[got++] = id;
			taken |= 1ull << b;
			w->cursor = id + 1 < a->blocks ? id + 1 : 0;
		} else {
			stale |= 1ull << b;
		}
	}
	if (!stale && (want == 1 || !taken))
		return got;

	old = atomic_fetch_and_explicit(&a->l0[i], ~(taken | stale), memory_order_acq_rel);
	/* A stale bit we just cleared may have been set again by a free that
	 * raced with us (descriptor FREE, then fetch_or before our fetch_and).
	 * Our fetch_and read that fetch_or's value (acquire), so the FREE
	 * descriptor is visible here: put such bits back. */
	for (uint64_t s = old & stale; s; s &= s - 1) {
		uint32_t b = (uint32_t)__builtin_ctzll(s);
		uint32_t id = i * 64 + b;

		if (id < a->blocks &&
		    kva__d_kind(atomic_load_explicit(&w->desc[id], memory_order_relaxed)) ==
			    KVA__D_FREE)
			back |= 1ull << b;
	}
	if (back)
		kva__hint_set_inline(a, i, back);
	else if (!(old & ~(taken | stale)))
		summary_clear(a, i);
	return got;
}

/*
 * kva__pool_claim - claim up to @want free blocks for @w into @ids; returns how
 * many. Walks the arena once around from the worker's cursor (the block after
 * its last claim), using l1 to skip words with no free block: at 99%
 * occupancy that is a few cache lines of l1, not the descriptor array.
 * Workers start their cursors apart (kva_worker_join) so they rarely meet.
 */
uint32_t kva__pool_claim(struct kva_worker *w, uint32_t want, uint32_t *ids)
{
	struct kva_arena *a = w->arena;
	uint32_t i0 = w->cursor / 64, b0 = w->cursor % 64, j0 = i0 / 64;
	uint32_t got;

	w->snap_bits = 0; /* the cursor moves on: the snapshot may fall behind it */

	/* the cursor's own word: from the cursor up now, below it at the end */
	got = claim_word(w, i0, ~0ull << b0, want, ids);
	for (uint32_t step = 0; step <= a->l1_words && got < want; step++) {
		uint32_t j = (j0 + step) % a->l1_words;
		uint64_t sum = atomic_load_explicit(&a->l1[j], memory_order_acquire);
		uint32_t k0 = i0 % 64;

		if (step == 0) /* words after i0 */
			sum &= k0 == 63 ? 0 : ~0ull << (k0 + 1);
		else if (step == a->l1_words) /* came round: words before i0 */
			sum &= ~(~0ull << k0);
		while (sum && got < want) {
			uint32_t i = j * 64 + (uint32_t)__builtin_ctzll(sum);

			sum &= sum - 1;
			if (likely(i < a->l0_words)) /* never trust a bit past the end */
				got += claim_word(w, i, ~0ull, want - got, ids + got);
		}
	}
	if (got < want && b0)
		got += claim_word(w, i0, ~(~0ull << b0), want - got, ids + got);
	return got;
}

/*
 * next_word - the first l0 word after @i that l1 says may have free blocks,
 * looking no further than the l1 word after @i's; UINT32_MAX if none there.
 */
static inline uint32_t next_word(struct kva_arena *a, uint32_t i)
{
	uint32_t j = i / 64;
	uint64_t sum = (i % 64 == 63) ? 0
				      : atomic_load_explicit(&a->l1[j], memory_order_acquire) &
						(~0ull << (i % 64 + 1));

	if (!sum && ++j < a->l1_words)
		sum = atomic_load_explicit(&a->l1[j], memory_order_acquire);
	if (!sum)
		return UINT32_MAX;
	i = j * 64 + (uint32_t)__builtin_ctzll(sum);
	return i < a->l0_words ? i : UINT32_MAX;
}

/*
 * kva__pool_claim_one - claim one block: the first free one after the
 * cursor, in the cursor's word or the next few words l1 points to; else the
 * full walk of kva__pool_claim(), which also clears stale bits. An uncached
 * alloc comes here when the blocks it gave back last are gone: a CAS, with
 * the candidate taken from our own snapshot of the cursor's l0 word (a load
 * of l0 the first time in each word); the claimed block's hint bit is left
 * for the next visitor to clear.
 *
 * The snapshot may be older than l0: a bit it has may be stale (the CAS
 * finds the descriptor taken, and we look again in l0 itself), and a bit it
 * lacks is found when the snapshot runs out and l0 is read again. Nothing
 * depends on its being current: the descriptor decides, and the CAS's
 * acquire pairs with the release store that made the block FREE.
 */
bool kva__pool_claim_one(struct kva_worker *w, uint32_t *id_out)
{
	struct kva_arena *a = w->arena;
	uint32_t i = w->cursor / 64;
	uint64_t mask = ~0ull << (w->cursor % 64);

	if (kva__pool_claim_snap(w, id_out))
		return true;
	for (int words = 0; words < 4 && i != UINT32_MAX; words++, mask = ~0ull) {
		/* acquire: pairs with kva__hint_set()'s fetch_or, as in claim_word() */
		uint64_t word = atomic_load_explicit(&w->l0[i], memory_order_acquire);
		uint64_t bits = word & mask;

		if (!word)
			summary_clear(a, i); /* l1 pointed at an empty word */
		if (bits) {
			uint32_t id = i * 64 + (uint32_t)__builtin_ctzll(bits);

			if (unlikely(id >= a->blocks) || !kva__claim_desc(w, id))
				break; /* a stale bit: the walk clears it */
			KVA__CRASH_POINT(KVA__CP_CLAIM_CAS);
			w->cursor = id + 1 < a->blocks ? id + 1 : 0;
			*id_out = id;
			if ((w->snap_bits = bits & (bits - 1)))
				w->snap_word = i;
			else
				kva__pool_lookahead(w, i);
			return true;
		}
		i = next_word(a, i);
	}
	return kva__pool_claim(w, 1, id_out) == 1;
}

/*
 * kva__pool_lookahead - the snapshot of word @i ran out: take one of the
 * next word l1 points to (within the next l1 word; none past the end, where
 * the cursor wraps), and ask for its first candidate's descriptor line, for
 * writing. Loads and a prefetch, none waited for: the next claim, not this
 * one, uses them.
 */
void kva__pool_lookahead(struct kva_worker *w, uint32_t i)
{
	struct kva_arena *a = w->arena;
	uint32_t n = next_word(a, i);
	uint64_t word;

	w->snap_bits = 0;
	if (n == UINT32_MAX)
		return;
	/* acquire: as in claim_word() */
	word = atomic_load_explicit(&w->l0[n], memory_order_acquire);
	if (!word)
		return;
	w->snap_word = n;
	w->snap_bits = word;
	/* a bit past the last block is corrupt: claim_snap refuses it, and no
	 * address past the array is formed for it here either */
	if (n * 64 + (uint32_t)__builtin_ctzll(word) < a->blocks)
		__builtin_prefetch(&w->desc[n * 64 + (uint32_t)__builtin_ctzll(word)], 1, 3);
}

/*
 * kva__pool_release - @w gives back blocks it owns and nobody holds: each
 * descriptor becomes FREE (its epoch bumped), then its hint bit is set; and
 * an uncached @w remembers them, for kva__pool_claim_recent() (a worker with
 * a cache refills it by the walk of kva__pool_claim() and never reads them).
 *
 * An OWNED descriptor is written by its owner alone, so a plain store frees
 * it; release makes the block's data written so far happen-before the next
 * owner's claim (its acquire CAS). A descriptor that does not say OWNED by us
 * is left alone: that can only mean our slot was reclaimed under us.
 */
void kva__pool_release(struct kva_worker *w, const uint32_t *ids, uint32_t n)
{
	struct kva_arena *a = w->arena;
	uint64_t mine = kva__d_make(KVA__D_OWNED, 0, w->owner_payload);
	uint64_t match = ~(KVA__D_EPOCH_MASK << KVA__D_EPOCH_SHIFT);
	const bool remember = !w->c.cap;
	uint32_t word = UINT32_MAX;
	uint64_t bits = 0;

	for (uint32_t k = 0; k < n; k++) {
		uint32_t id = ids[k];
		uint64_t d = atomic_load_explicit(&a->desc[id], memory_order_relaxed);

		if (unlikely((d & match) != mine))
			continue;
		atomic_store_explicit(&a->desc[id], kva__d_next_free(d), memory_order_release);
		KVA__CRASH_POINT(KVA__CP_RELEASE_STORE);
		if (remember) /* ours alone: read after we return */
			kva__pool_recent_push(w, id);
		if (id / 64 != word) {
			if (bits)
				kva__hint_set_inline(a, word, bits);
			word = id / 64;
			bits = 0;
		}
		bits |= 1ull << (id % 64);
	}
	if (bits)
		kva__hint_set_inline(a, word, bits);
}
