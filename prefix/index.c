/* SPDX-License-Identifier: MIT */
/*
 * index.c - the prefix index: 128-bit block keys to block ids, in shared
 * memory, lock-free, open addressing with linear probing.
 *
 * Keys are chained: a block's key is XXH3-128 of its parent's key, the salt
 * and its own token ids, so a key names the whole prefix up to that block.
 *
 * An entry goes EMPTY -> BUSY -> VALID -> TOMB -> BUSY -> ... and never back
 * to EMPTY, so a probe chain is never cut: a lookup may stop at the first
 * EMPTY entry. Every step is one CAS (or a release store by the BUSY
 * entry's owner). Nobody waits on a BUSY entry: a lookup passes it (a miss at
 * worst), an inserter whose key it may be (same tag) gives up. Probes stop
 * after KVA__P_MAX_PROBE entries, so a full or tombstone-ridden neighbourhood
 * costs a skipped publication, never a long walk.
 *
 * An entry names (block, epoch). A block's epoch changes whenever it leaves a
 * life (freed or evicted), so an entry that outlived its block (its
 * publisher died between insert and delete, or an evictor did) is recognised
 * by its epoch and removed by whoever meets it. Matching never trusts an
 * entry alone: the CAS on the block's descriptor checks the epoch and the
 * PUB flag (seq.c).
 *
 * Two workers publishing the same key at once: both scan to the first free
 * entry of the chain, one CAS wins it, the other then sees that entry BUSY or
 * VALID with its key and gives up (its block stays private to its sequence).
 * If a tombstone appeared between their scans they may land on two entries;
 * each then rescans the entries before its own and the later one retires. A
 * lookup returns the first VALID entry of a chain, so matchers always
 * converge on one block.
 */
#include <errno.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "prefix_pvt.h"

void kva_prefix_salt(const char *model, const char *adapter, uint32_t tenant, uint64_t out[2])
{
	static const char magic[] = "kvarena-salt-v1";
	XXH3_state_t st;
	XXH128_hash_t h;
	uint8_t t[4] = { (uint8_t)tenant, (uint8_t)(tenant >> 8), (uint8_t)(tenant >> 16),
			 (uint8_t)(tenant >> 24) };

	model = model ? model : "";
	adapter = adapter ? adapter : "";
	XXH3_128bits_reset(&st);
	XXH3_128bits_update(&st, magic, sizeof(magic));          /* with its NUL */
	XXH3_128bits_update(&st, model, strlen(model) + 1);
	XXH3_128bits_update(&st, adapter, strlen(adapter) + 1);
	XXH3_128bits_update(&st, t, sizeof(t));
	h = XXH3_128bits_digest(&st);
	out[0] = h.low64;
	out[1] = h.high64;
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

void kva_prefix_hash(const uint64_t parent[2], const uint64_t salt[2], const int32_t *tokens,
		     size_t n, uint64_t out[2])
{
	uint8_t head[32], buf[1024];
	XXH3_state_t st;
	XXH128_hash_t h;

	put_le64(head, parent ? parent[0] : 0);
	put_le64(head + 8, parent ? parent[1] : 0);
	put_le64(head + 16, salt[0]);
	put_le64(head + 24, salt[1]);
	XXH3_128bits_reset(&st);
	XXH3_128bits_update(&st, head, sizeof(head));
	/* tokens as little-endian int32, whatever this machine's order */
	while (n) {
		size_t k = n < sizeof(buf) / 4 ? n : sizeof(buf) / 4;

		for (size_t i = 0; i < k; i++) {
			uint32_t v = (uint32_t)tokens[i];

			buf[4 * i] = (uint8_t)v;
			buf[4 * i + 1] = (uint8_t)(v >> 8);
			buf[4 * i + 2] = (uint8_t)(v >> 16);
			buf[4 * i + 3] = (uint8_t)(v >> 24);
		}
		XXH3_128bits_update(&st, buf, 4 * k);
		tokens += k;
		n -= k;
	}
	h = XXH3_128bits_digest(&st);
	out[0] = h.low64;
	out[1] = h.high64;
}

/*
 * A ghost (eviction's history in the index, evict.c) is live for 2 x c evictions, c the
 * cache's capacity (its limit, else the arena): ARC's directory of 2c.
 */
bool kva__ghost_live(struct kva_arena *a, uint64_t info)
{
	uint64_t now = atomic_load_explicit(&a->pool->evictions, memory_order_relaxed);
	uint64_t c = atomic_load_explicit(&a->pool->cache_limit, memory_order_relaxed);

	return now - (info >> 8) <= 2ull * (c && c < a->blocks ? c : a->blocks);
}

static inline uint32_t key_tag(const uint64_t key[2]) { return (uint32_t)(key[1] >> 50); }

/*
 * read_key - the key of entry @e, which was VALID with word @c. Seqlock
 * style: the key words are read (relaxed), then an acquire fence, then ctrl
 * again; if it still says @c the key is the one published with it (its
 * writer's release store of VALID came after the key stores).
 */
static bool read_key(struct kva__pentry *e, uint64_t c, uint64_t key[2])
{
	key[0] = atomic_load_explicit(&e->key[0], memory_order_relaxed);
	key[1] = atomic_load_explicit(&e->key[1], memory_order_relaxed);
	atomic_thread_fence(memory_order_acquire);
	return atomic_load_explicit(&e->ctrl, memory_order_relaxed) == c;
}

/* An entry whose block has left the life it was published in. */
static bool entry_stale(struct kva_arena *a, uint64_t c)
{
	uint32_t b = kva__p_block(c);
	uint64_t d;

	if (b >= a->blocks)
		return true; /* corrupt: nothing to follow */
	d = atomic_load_explicit(&a->desc[b], memory_order_relaxed);
	return kva__d_epoch(d) != kva__p_epoch(c);
}

bool kva__index_lookup(struct kva_arena *a, const uint64_t key[2], struct kva__found *f,
		       uint64_t *stale)
{
	uint32_t tag = key_tag(key);
	uint64_t pos = key[0] & a->idx_mask;

	for (uint32_t i = 0; i < KVA__P_MAX_PROBE; i++, pos = (pos + 1) & a->idx_mask) {
		struct kva__pentry *e = &a->idx[pos];
		/* acquire: pairs with the VALID store, for the key and info */
		uint64_t c = atomic_load_explicit(&e->ctrl, memory_order_acquire), k[2];

		if (c == 0)
			return false;
		if (kva__p_state(c) != KVA__P_VALID || kva__p_tag(c) != tag)
			continue;
		if (!read_key(e, c, k) || k[0] != key[0] || k[1] != key[1])
			continue;
		if (entry_stale(a, c)) {
			/* its block was freed or evicted: remove the entry for
			 * whoever comes next (a lost CAS means someone did) */
			if (!a->readonly &&
			    atomic_compare_exchange_strong_explicit(
				    &e->ctrl, &c, kva__p_make(KVA__P_TOMB, 0, 0, 0),
				    memory_order_relaxed, memory_order_relaxed) &&
			    stale)
				++*stale;
			continue;
		}
		f->pos = pos;
		f->ctrl = c;
		return true;
	}
	return false;
}

/* same key at an entry before @mine in its chain (from @start)? */
static bool earlier_twin(struct kva_arena *a, uint64_t start, uint64_t mine, const uint64_t key[2])
{
	uint32_t tag = key_tag(key);

	for (uint64_t pos = start; pos != mine; pos = (pos + 1) & a->idx_mask) {
		struct kva__pentry *e = &a->idx[pos];
		uint64_t c = atomic_load_explicit(&e->ctrl, memory_order_acquire), k[2];

		if (kva__p_tag(c) != tag)
			continue;
		if (kva__p_state(c) == KVA__P_BUSY)
			return true;
		if (kva__p_state(c) == KVA__P_VALID && read_key(e, c, k) && k[0] == key[0] &&
		    k[1] == key[1] && !entry_stale(a, c))
			return true;
	}
	return false;
}

/*
 * insert - claim an entry for @key and make it @final (VALID, or a spilled
 * ghost: kva__index_insert, kva__index_insert_spilled). The entry taken is,
 * by preference: the key's own ghost (its use count comes back in *@uses if
 * its history is recent, and where its copy below is, if it has one, in
 * *@twin_loc), else the first tombstone, expired ghost or EMPTY entry of the
 * chain, else the oldest live ghost in reach, else the oldest spilled one
 * (the copy below stays, unnamed, until the agent reuses its place). Return:
 * 0 (entry at *@pos), -EEXIST (the key is there or being inserted),
 * -ENOSPC (nothing free within reach).
 */
static int insert(struct kva_worker *w, const uint64_t key[2], uint64_t final, uint64_t info,
		  uint64_t *pos_out, uint32_t *uses, uint64_t *twin_loc)
{
	struct kva_arena *a = w->arena;
	struct kva__slot *s = w->slot;
	uint32_t tag = key_tag(key);
	uint64_t start = key[0] & a->idx_mask;

	*uses = 0;
	*twin_loc = 0;
	for (int attempt = 0; attempt < 8; attempt++) {
		uint64_t pos = start, cand = UINT64_MAX, cand_c = 0, c;
		uint64_t twin = UINT64_MAX, twin_c = 0, old = UINT64_MAX, old_c = 0, old_seq = UINT64_MAX;
		uint64_t sp = UINT64_MAX, sp_c = 0, sp_seq = UINT64_MAX;
		uint32_t twin_uses = 0;

		for (uint32_t i = 0; i < KVA__P_MAX_PROBE; i++, pos = (pos + 1) & a->idx_mask) {
			struct kva__pentry *e = &a->idx[pos];
			uint64_t k[2];

			c = atomic_load_explicit(&e->ctrl, memory_order_acquire);
			if (c == 0) {
				if (cand == UINT64_MAX) {
					cand = pos;
					cand_c = 0;
				}
				break; /* nothing of ours lies past an EMPTY entry */
			}
			switch (kva__p_state(c)) {
			case KVA__P_BUSY:
				if (kva__p_tag(c) == tag)
					return -EEXIST; /* maybe our key, being written */
				break;
			case KVA__P_VALID:
				if (kva__p_tag(c) == tag && read_key(e, c, k) && k[0] == key[0] &&
				    k[1] == key[1]) {
					uint64_t t = kva__p_make(KVA__P_TOMB, 0, 0, 0);

					if (!entry_stale(a, c))
						return -EEXIST;
					if (atomic_compare_exchange_strong_explicit(
						    &e->ctrl, &c, t, memory_order_relaxed,
						    memory_order_relaxed) &&
					    cand == UINT64_MAX) {
						cand = pos;
						cand_c = t;
					}
				}
				break;
			case KVA__P_TOMB: {
				uint64_t gi;

				if (!(c & KVA__P_GHOST)) {
					if (cand == UINT64_MAX) {
						cand = pos;
						cand_c = c;
					}
					break;
				}
				gi = atomic_load_explicit(&e->info, memory_order_relaxed);
				if (kva__p_tag(c) == tag && twin == UINT64_MAX && read_key(e, c, k) &&
				    k[0] == key[0] && k[1] == key[1]) {
					twin = pos;
					twin_c = c;
					twin_uses = kva__ghost_live(a, gi) ? (uint32_t)(gi & 0xff) : 0;
				} else if (c & KVA__P_SPILLED) {
					if ((gi >> 8) < sp_seq) { /* a copy below: the last resort */
						sp = pos;
						sp_c = c;
						sp_seq = gi >> 8;
					}
				} else if (!kva__ghost_live(a, gi)) {
					if (cand == UINT64_MAX) {
						cand = pos;
						cand_c = c;
					}
				} else if ((gi >> 8) < old_seq) {
					old = pos;
					old_c = c;
					old_seq = gi >> 8;
				}
				break;
			}
			}
		}
		if (twin != UINT64_MAX) { /* our own history: its entry */
			cand = twin;
			cand_c = twin_c;
		} else if (cand == UINT64_MAX) {
			if (old != UINT64_MAX) { /* forget the oldest history in reach */
				cand = old;
				cand_c = old_c;
			} else if (sp != UINT64_MAX) {
				cand = sp;
				cand_c = sp_c;
			} else {
				return -ENOSPC;
			}
		}

		/* Claim it. The count of our inserts in flight goes up first, so
		 * that if we die with the entry BUSY, reclaim knows to look. */
		atomic_store_explicit(&s->inserting,
				      atomic_load_explicit(&s->inserting, memory_order_relaxed) + 1,
				      memory_order_relaxed);
		c = cand_c;
		/* seq_cst: against a concurrent inserter of the same key, one of
		 * the two claims is seen by the other's scan or rescan */
		if (!atomic_compare_exchange_strong(&a->idx[cand].ctrl, &c,
						    kva__p_make(KVA__P_BUSY, tag, 0, w->slot_id))) {
			atomic_store_explicit(&s->inserting,
					      atomic_load_explicit(&s->inserting,
								   memory_order_relaxed) - 1,
					      memory_order_relaxed);
			continue; /* someone took it: scan again */
		}
		KVA__CRASH_POINT(KVA__CP_INDEX_BUSY);
		atomic_store_explicit(&a->idx[cand].key[0], key[0], memory_order_relaxed);
		atomic_store_explicit(&a->idx[cand].key[1], key[1], memory_order_relaxed);
		atomic_store_explicit(&a->idx[cand].info, info, memory_order_relaxed);
		/* release: key and info before the final word (read_key's fence) */
		atomic_store_explicit(&a->idx[cand].ctrl, final, memory_order_release);
		atomic_store_explicit(&s->inserting,
				      atomic_load_explicit(&s->inserting, memory_order_relaxed) - 1,
				      memory_order_relaxed);
		atomic_thread_fence(memory_order_seq_cst);
		if (earlier_twin(a, start, cand, key)) {
			uint64_t f = final;

			atomic_compare_exchange_strong_explicit(&a->idx[cand].ctrl, &f,
								kva__p_make(KVA__P_TOMB, 0, 0, 0),
								memory_order_relaxed,
								memory_order_relaxed);
			return -EEXIST;
		}
		*pos_out = cand;
		if (cand == twin) {
			*uses = twin_uses;
			*twin_loc = twin_c & KVA__P_SPILLED ? kva__p_loc(twin_c) : 0;
		}
		return 0;
	}
	return -ENOSPC;
}

/*
 * kva__index_insert - publish (key -> block at epoch). If the key's spilled
 * ghost is taken over, *@twin_loc says where its copy below is: the same
 * bytes (the same key), which the block's backing can name (prefix/seq.c).
 */
int kva__index_insert(struct kva_worker *w, const uint64_t key[2], uint32_t block,
		      uint64_t epoch, uint64_t info, uint64_t *pos_out, uint32_t *uses,
		      uint64_t *twin_loc)
{
	return insert(w, key, kva__p_make(KVA__P_VALID, key_tag(key), epoch, block), info, pos_out,
		      uses, twin_loc);
}

/*
 * kva__index_insert_spilled - by the agent: @key's block is nowhere in the
 * arena but its copy is at @loc (a record found again at a warm restart).
 * An entry of the key already there (VALID, or a spilled ghost: another
 * copy) wins: -EEXIST.
 */
int kva__index_insert_spilled(struct kva_worker *w, const uint64_t key[2], uint64_t loc,
			      uint64_t evseq, uint64_t *pos_out)
{
	uint64_t twin_loc;
	uint32_t uses;

	if (kva__index_lookup_spilled(w->arena, key, NULL))
		return -EEXIST;
	return insert(w, key, kva__p_spilled(key_tag(key), loc), evseq << 8, pos_out, &uses,
		      &twin_loc);
}

/*
 * kva__index_lookup_spilled - the first spilled ghost of @key in its chain:
 * where the key's block went below the arena. A hint like any entry: the
 * record it names is checked against the key before anything is served.
 */
bool kva__index_lookup_spilled(struct kva_arena *a, const uint64_t key[2], struct kva__found *f)
{
	uint32_t tag = key_tag(key);
	uint64_t pos = key[0] & a->idx_mask;

	for (uint32_t i = 0; i < KVA__P_MAX_PROBE; i++, pos = (pos + 1) & a->idx_mask) {
		struct kva__pentry *e = &a->idx[pos];
		uint64_t c = atomic_load_explicit(&e->ctrl, memory_order_acquire), k[2];

		if (c == 0)
			return false;
		if (!kva__p_is_spilled(c) || kva__p_tag(c) != tag || !kva__loc_ok(kva__p_loc(c)))
			continue;
		if (!read_key(e, c, k) || k[0] != key[0] || k[1] != key[1])
			continue;
		if (f) {
			f->pos = pos;
			f->ctrl = c;
		}
		return true;
	}
	return false;
}

/*
 * kva__index_respill - entry @pos, the spilled ghost @c, now names @loc (the
 * agent moved its copy down a tier). kva__index_unspill - it names nothing
 * below any more (the copy was dropped, or did not verify): a plain ghost,
 * the key's history kept. Each one CAS: an entry taken over meanwhile (the
 * key published again, or its place reused) is left alone.
 */
bool kva__index_respill(struct kva_arena *a, uint64_t pos, uint64_t c, uint64_t loc)
{
	if (pos > a->idx_mask || !kva__p_is_spilled(c) || !kva__loc_ok(loc))
		return false;
	return atomic_compare_exchange_strong_explicit(&a->idx[pos].ctrl, &c,
						       kva__p_spilled(kva__p_tag(c), loc),
						       memory_order_relaxed, memory_order_relaxed);
}

bool kva__index_unspill(struct kva_arena *a, uint64_t pos, uint64_t c)
{
	if (pos > a->idx_mask || !kva__p_is_spilled(c))
		return false;
	return atomic_compare_exchange_strong_explicit(
		&a->idx[pos].ctrl, &c,
		kva__p_make(KVA__P_TOMB, kva__p_tag(c), 0, 0) | KVA__P_GHOST,
		memory_order_relaxed, memory_order_relaxed);
}

/*
 * kva__index_remove - delete entry @pos if it still names (block, epoch): a
 * plain tombstone, or with @evseq nonzero a ghost that keeps the key, @uses
 * and @evseq (written before the CAS: a reader trusts a ghost's info only
 * after the ctrl word it read says ghost), spilled to @loc if that is a
 * location (the block's copy below: prefix/evict.c).
 */
bool kva__index_remove(struct kva_arena *a, uint64_t pos, uint32_t block, uint64_t epoch,
		       uint32_t uses, uint64_t evseq, uint64_t loc)
{
	struct kva__pentry *e;
	uint64_t c, t;

	if (pos > a->idx_mask)
		return false;
	e = &a->idx[pos];
	c = atomic_load_explicit(&e->ctrl, memory_order_relaxed);
	if (kva__p_state(c) != KVA__P_VALID || kva__p_block(c) != block ||
	    kva__p_epoch(c) != (epoch & KVA__D_EPOCH_MASK))
		return false;
	t = kva__p_make(KVA__P_TOMB, 0, 0, 0);
	if (evseq) {
		atomic_store_explicit(&e->info, (uses > 0xff ? 0xff : uses) | evseq << 8,
				      memory_order_relaxed);
		t = kva__loc_ok(loc) ? kva__p_spilled(kva__p_tag(c), loc)
				     : kva__p_make(KVA__P_TOMB, kva__p_tag(c), 0, 0) | KVA__P_GHOST;
	}
	/* release: the info store before the ghost word */
	return atomic_compare_exchange_strong_explicit(&e->ctrl, &c, t, memory_order_release,
						       memory_order_relaxed);
}

/*
 * kva__index_retire - delete entry @pos if it still says @c and holds @key:
 * by a matcher that holds the entry's block and found it published since
 * under another key (seq.c). The same ctrl word may be that newer
 * publication's own entry (same block, epoch, 14-bit tag, same place), so
 * the key decides; and while the block is held it cannot be published again,
 * so no entry can take this ctrl word between the key's read and the CAS.
 */
bool kva__index_retire(struct kva_arena *a, uint64_t pos, uint64_t c, const uint64_t key[2])
{
	struct kva__pentry *e;
	uint64_t k[2];

	if (pos > a->idx_mask)
		return false;
	e = &a->idx[pos];
	if (!read_key(e, c, k) || k[0] != key[0] || k[1] != key[1])
		return false;
	return atomic_compare_exchange_strong_explicit(&e->ctrl, &c, kva__p_make(KVA__P_TOMB, 0, 0, 0),
						       memory_order_relaxed, memory_order_relaxed);
}

/* kva__index_reclaim_busy - entries a dead slot left BUSY become tombstones. */
void kva__index_reclaim_busy(struct kva_arena *a, uint32_t slot)
{
	for (uint64_t pos = 0; pos <= a->idx_mask; pos++) {
		struct kva__pentry *e = &a->idx[pos];
		uint64_t c = atomic_load_explicit(&e->ctrl, memory_order_relaxed);

		if (kva__p_state(c) == KVA__P_BUSY && kva__p_block(c) == slot)
			atomic_compare_exchange_strong_explicit(&e->ctrl, &c,
								kva__p_make(KVA__P_TOMB, 0, 0, 0),
								memory_order_relaxed,
								memory_order_relaxed);
	}
}
