/* SPDX-License-Identifier: MIT */
/*
 * alloc.c - kva_alloc, kva_free, kva_share.
 *
 * The common path is a worker's private cache of blocks it owns: alloc pops,
 * free pushes (inline, in kvarena.h), and neither executes an atomic
 * instruction nor touches shared memory. That is safe because a block OWNED by a
 * worker (in the descriptor) is written by nobody else: other workers can
 * only reference blocks that their holder has shared. The cache is refilled
 * and flushed in batches through the shared pool (pool.c).
 *
 * Whether this worker holds a block, and how many references, is its private
 * array w->c.held; it mirrors the descriptor exactly for the blocks it holds,
 * so double and foreign frees are caught without reading shared memory.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "arena_pvt.h"

void kva__cache_publish(struct kva_worker *w)
{
	struct kva__slot *s = w->slot;

	/* Single writer (us), read by ops tools as hints: relaxed stores, on
	 * the slow paths only (the inline fast path touches no shared line). */
	atomic_store_explicit(&s->cached, w->c.len, memory_order_relaxed);
	atomic_store_explicit(&s->shares, w->shares, memory_order_relaxed);
	atomic_store_explicit(&s->refills, w->refills, memory_order_relaxed);
	atomic_store_explicit(&s->flushes, w->flushes, memory_order_relaxed);
}

/* cache_trim - send the cache down to @keep blocks. */
static void cache_trim(struct kva_worker *w, uint32_t keep)
{
	if (w->c.len <= keep)
		return;
	kva__pool_release(w, w->c.ids + keep, w->c.len - keep);
	w->c.len = keep;
	w->flushes++;
}

static inline bool under_pressure(struct kva_worker *w)
{
	/* a line written only when the arena turns nearly full or stops being:
	 * in every worker's cache, read-only, almost always */
	return atomic_load_explicit(&w->pool->pressure, memory_order_relaxed);
}

static void set_pressure(struct kva_worker *w, bool on)
{
	if (under_pressure(w) != on)
		atomic_store_explicit(&w->pool->pressure, on, memory_order_relaxed);
}

/* put_block - an exclusive block nobody holds any more goes to the cache. */
static void put_block(struct kva_worker *w, uint32_t id)
{
	if (unlikely(w->c.len == w->c.cap || under_pressure(w))) {
		if (!w->c.cap || under_pressure(w)) {
			cache_trim(w, 0);
			kva__pool_release_one(w, id);
			return;
		}
		/* keep half: the next frees need room, the next allocs blocks */
		cache_trim(w, w->c.cap / 2);
	}
	w->c.ids[w->c.len++] = id;
}

static __attribute__((noinline, cold)) int reclaimed(struct kva_worker *w)
{
	return kva__err(-ESTALE, "worker slot %u was reclaimed: this handle is dead", w->slot_id);
}

/* inline on the uncached paths, where a call is a fair part of the cost */
static inline int check_live(struct kva_worker *w)
{
	/* Only a reclaimer changes our slot word, and only if it decided we are
	 * dead: then nothing we hold is ours any more. */
	if (unlikely(atomic_load_explicit(&w->slot->state, memory_order_relaxed) !=
		     w->slot_word))
		return reclaimed(w);
	return 0;
}

int kva__worker_check_live(struct kva_worker *w)
{
	return check_live(w);
}

static __attribute__((noinline, cold)) int stopping(void)
{
	return kva__err(-ESHUTDOWN, "the agent is shutting down: free what you hold and detach");
}

/* taking: a new block or reference; refused while the agent is stopping */
static inline int check_taking(struct kva_worker *w)
{
	int ret = check_live(w);

	if (ret < 0)
		return ret;
	if (unlikely(atomic_load_explicit(&w->pool->agent_state, memory_order_relaxed) ==
		     KVA_AGENT_STOPPING))
		return stopping();
	return 0;
}

/*
 * refill - top the cache up to half its capacity, unless the arena is short
 * of blocks: then cache nothing (and try again only every cap-th slow call,
 * so that a nearly full arena does not make every call scan it).
 */
static void refill(struct kva_worker *w)
{
	uint32_t want, more;

	if (!w->c.cap || w->c.len >= w->c.cap / 2)
		return;
	if (under_pressure(w) && w->probe) {
		w->probe--;
		return;
	}
	want = (uint32_t)(w->c.cap / 2 - w->c.len);
	more = kva__pool_claim(w, want, w->c.ids + w->c.len);
	w->c.len += more;
	w->refills++;
	/* a short refill means the arena is nearly full: hoard nothing */
	set_pressure(w, more < want);
	if (more < want) {
		cache_trim(w, 0);
		w->probe = (uint32_t)w->c.cap;
	}
}

/* the uncached alloc of one block, when the snapshot has none: the l0
 * walk, then eviction, then -ENOSPC */
static __attribute__((noinline)) int alloc_one_walk(struct kva_worker *w, uint32_t *ids)
{
	if (!kva__pool_claim_one(w, ids) && !kva__evict(w, 1, ids)) {
		set_pressure(w, true);
		return kva__err(-ENOSPC, "alloc of 1 block: none free outside worker caches");
	}
	w->c.held[ids[0]] = KVA__HELD_EXCL;
	return 0;
}

static __attribute__((noinline)) int alloc_slow(struct kva_worker *w, uint32_t n, uint32_t *ids);

/*
 * The uncached alloc of one block first, with nothing else in the way:
 * the checks, a CAS on the block we gave back last or else on the candidate
 * our snapshot of l0 names, our held[] entry. The rest is alloc_slow(), so
 * that this path saves no registers.
 */
int kva_alloc_slow(struct kva_worker *w, uint32_t n, uint32_t *ids)
{
	int ret;

	if (likely(w && ids && n == 1 && !w->c.cap)) {
		if (unlikely((ret = check_taking(w)) < 0))
			return ret;
		if (!kva__pool_claim_recent(w, ids) && !kva__pool_claim_snap(w, ids))
			return alloc_one_walk(w, ids);
		w->c.held[ids[0]] = KVA__HELD_EXCL;
		return 0;
	}
	return alloc_slow(w, n, ids);
}

static int alloc_slow(struct kva_worker *w, uint32_t n, uint32_t *ids)
{
	uint32_t from_cache, need, got;
	int ret;

	if (!w || (n && !ids))
		return -EINVAL;
	if (n <= w->c.len) /* a cache hit, for callers of the symbol */
		return n ? kva__alloc_inline(w, n, ids) : 0;
	if ((ret = check_taking(w)) < 0)
		return ret;
	if (n == 1 && !w->c.cap) /* uncached (from kva_alloc_slow, never) */
		return alloc_one_walk(w, ids);
	if (n > w->c.blocks) {
		cache_trim(w, 0);
		return kva__err(-ENOSPC, "alloc of %u blocks: the arena has %zu", n, w->c.blocks);
	}

	from_cache = (uint32_t)w->c.len; /* all of it: the hit case is above */
	w->c.len = 0;
	if (from_cache)
		memcpy(ids, w->c.ids, from_cache * sizeof(*ids));
	need = n - from_cache;
	got = need ? kva__pool_claim(w, need, ids + from_cache) : 0;
	if (got < need) /* nothing free: take cached prefix blocks */
		got += kva__evict(w, need - got, ids + from_cache + got);
	if (got < need) {
		/* all or nothing; and our own cache goes back too, so that our
		 * failure does not keep free blocks from the others */
		kva__pool_release(w, ids, from_cache + got);
		cache_trim(w, 0);
		set_pressure(w, true);
		kva__cache_publish(w);
		return kva__err(-ENOSPC, "alloc of %u blocks: %u free outside worker caches", n,
				from_cache + got);
	}
	refill(w);
	for (uint32_t k = 0; k < n; k++)
		w->c.held[ids[k]] = KVA__HELD_EXCL;
	kva__cache_publish(w);
	return 0;
}

int kva_alloc(struct kva_worker *w, uint32_t n, uint32_t *ids)
{
	return kva__alloc_inline(w, n, ids);
}

/*
 * drop_holder - remove this worker from a shared block's holders. The last
 * holder takes the block back as its own (one CAS: SHARED{us} -> OWNED by us)
 * and frees it; a published block becomes CACHED instead (same CAS), for a
 * later match or an evictor. release: our reads of the block come before anyone reuses
 * it; acquire: so do the other holders', when we are the one to free it.
 */
static void drop_holder(struct kva_worker *w, uint32_t id)
{
	uint64_t d = atomic_load_explicit(&w->desc[id], memory_order_relaxed), nd, rest;

	do {
		if (unlikely(kva__d_kind(d) != KVA__D_SHARED ||
			     !(kva__d_payload(d) & w->holder_bit)))
			return; /* not ours any more: our slot was reclaimed */
		rest = kva__d_payload(d) & ~w->holder_bit;
		if (rest)
			nd = (d & ~KVA__D_PAYLOAD_MASK) | rest;
		else if (d & KVA__D_PUB) /* published: stays, cached, until evicted */
			nd = kva__d_make(KVA__D_CACHED, kva__d_epoch(d), 0) | (d & KVA__D_REF);
		else
			nd = kva__d_make(KVA__D_OWNED, kva__d_epoch(d), w->owner_payload);
	} while (!atomic_compare_exchange_weak_explicit(&w->desc[id], &d, nd,
							memory_order_acq_rel,
							memory_order_relaxed));
	if (!rest && kva__d_kind(nd) == KVA__D_OWNED) {
		KVA__CRASH_POINT(KVA__CP_DROP_LAST);
		put_block(w, id);
	}
}

/* free_one - drop one reference to a block we hold; the held check is done */
static void free_one(struct kva_worker *w, uint32_t id, uint32_t held)
{
	if (held == KVA__HELD_EXCL) {
		w->c.held[id] = 0;
		put_block(w, id);
	} else {
		w->c.held[id] = held - 1;
		if (held == 1)
			drop_holder(w, id);
	}
}

static __attribute__((noinline)) int free_slow(struct kva_worker *w, const uint32_t *ids,
					       uint32_t n);

/*
 * The uncached free of one block we hold alone first, as kva_alloc_slow()
 * does: checks, our held[] entry, the release. Anything else (a bad id, a
 * shared block, a cache, a reclaimed slot) goes to free_slow(), which
 * checks it all again and says why.
 */
int kva_free_slow(struct kva_worker *w, const uint32_t *ids, uint32_t n)
{
	if (likely(w && ids && n == 1 && !w->c.cap)) {
		uint32_t id = ids[0];

		/* A reclaimed worker must not touch holder bits or blocks: its
		 * slot's next worker may own them under the same tag. */
		if (likely(id < w->c.blocks && w->c.held[id] == KVA__HELD_EXCL &&
			   check_live(w) == 0)) {
			w->c.held[id] = 0;
			kva__pool_release_one(w, id);
			return 0;
		}
	}
	return free_slow(w, ids, n);
}

static int free_slow(struct kva_worker *w, const uint32_t *ids, uint32_t n)
{
	uint32_t k;
	int ret;

	if (!w || (n && !ids))
		return -EINVAL;
	/* A reclaimed worker must not touch holder bits: its slot's next
	 * worker may hold the same blocks under the same bit. */
	if ((ret = check_live(w)) < 0)
		return ret;
	if (n == 1) {
		uint32_t id = ids[0], held;

		if (id >= w->c.blocks)
			return kva__err(-EINVAL, "free: block %u out of range (%zu blocks)", id,
					w->c.blocks);
		held = w->c.held[id];
		if (!held)
			return kva__err(-EPERM, "free: block %u is not held by worker %u", id,
					w->slot_id);
		if (held == KVA__HELD_EXCL && !w->c.cap) { /* uncached: one release */
			w->c.held[id] = 0;
			kva__pool_release_one(w, id);
			return 0;
		}
		free_one(w, id, held);
		kva__cache_publish(w);
		return 0;
	}

	/* Pass 1: check every id and mark what will go, so that a failure
	 * changes nothing (ids may repeat: each occurrence drops one reference). */
	for (k = 0; k < n; k++) {
		uint32_t id = ids[k], p;

		if (id >= w->c.blocks) {
			ret = kva__err(-EINVAL, "free: block %u out of range (%zu blocks)", id,
				       w->c.blocks);
			goto undo;
		}
		p = w->c.held[id];
		if (p == KVA__HELD_EXCL) {
			w->c.held[id] = KVA__HELD_EXCL | KVA__HELD_PENDING;
		} else if (p & KVA__HELD_EXCL || !(p & KVA__HELD_MAXREF)) {
			ret = kva__err(-EPERM, "free: block %u is not held by worker %u%s", id,
				       w->slot_id, p ? " (freed twice in this call)" : "");
			goto undo;
		} else {
			w->c.held[id] = ((p & KVA__HELD_MAXREF) - 1) | KVA__HELD_PENDING;
		}
	}

	/* Pass 2: do it. */
	for (k = 0; k < n; k++) {
		uint32_t id = ids[k], p = w->c.held[id];

		if (!(p & KVA__HELD_PENDING))
			continue; /* a repeat, done at its first occurrence */
		if (p & KVA__HELD_EXCL) {
			w->c.held[id] = 0;
			put_block(w, id);
		} else {
			w->c.held[id] = p & KVA__HELD_MAXREF;
			if (!w->c.held[id])
				drop_holder(w, id);
		}
	}
	kva__cache_publish(w);
	return 0;

undo:
	for (uint32_t j = 0; j < k; j++) {
		uint32_t id = ids[j], p = w->c.held[id];

		if (!(p & KVA__HELD_EXCL))
			w->c.held[id] = ((p & KVA__HELD_MAXREF) + 1) | KVA__HELD_PENDING;
	}
	for (uint32_t j = 0; j < k; j++)
		w->c.held[ids[j]] &= ~KVA__HELD_PENDING;
	return ret;
}

int kva_free(struct kva_worker *w, const uint32_t *ids, uint32_t n)
{
	return kva__free_inline(w, ids, n);
}

/*
 * join_holders - add this worker to the holders of a block someone shared.
 * acquire: pairs with the release that made the block SHARED (and with every
 * holder CAS after it, all one release sequence), so the data its publisher
 * wrote is visible to us.
 */
static int join_holders(struct kva_worker *w, uint32_t id)
{
	uint64_t d = atomic_load_explicit(&w->desc[id], memory_order_acquire);

	do {
		if (kva__d_kind(d) != KVA__D_SHARED || !kva__d_payload(d))
			return kva__err(-EPERM, "share: block %u is %s", id,
					kva__d_kind(d) == KVA__D_FREE ? "free"
					: kva__d_kind(d) == KVA__D_OWNED
						? "held exclusively by a worker (it must share it first)"
						: "in no shareable state");
		if (kva__d_payload(d) & w->holder_bit)
			return kva__err(-EPERM, "share: block %u lists worker %u as holder, "
					"which it is not: slot reclaimed?", id, w->slot_id);
	} while (!atomic_compare_exchange_weak_explicit(&w->desc[id], &d, d | w->holder_bit,
							memory_order_acquire,
							memory_order_acquire));
	return 0;
}

/*
 * unshare_one - undo one reference taken earlier in a failed kva_share().
 * KVA__HELD_PENDING marks blocks this call turned from exclusive to shared;
 * they go back to exclusive if nobody joined them meanwhile.
 */
static void unshare_one(struct kva_worker *w, uint32_t id)
{
	uint32_t p = w->c.held[id], cnt = p & KVA__HELD_MAXREF;

	if ((p & KVA__HELD_PENDING) && cnt == 2) {
		uint64_t d = atomic_load_explicit(&w->desc[id], memory_order_relaxed);

		if (d == kva__d_make(KVA__D_SHARED, kva__d_epoch(d), w->holder_bit) &&
		    atomic_compare_exchange_strong_explicit(
			    &w->desc[id], &d,
			    kva__d_make(KVA__D_OWNED, kva__d_epoch(d), w->owner_payload),
			    memory_order_acq_rel, memory_order_relaxed))
			w->c.held[id] = KVA__HELD_EXCL;
		else
			w->c.held[id] = 1 | KVA__HELD_PENDING; /* others hold it now */
	} else if (cnt > 1) {
		w->c.held[id] = (cnt - 1) | (p & KVA__HELD_PENDING);
	} else {
		w->c.held[id] = 0;
		drop_holder(w, id);
	}
}

int kva_share(struct kva_worker *w, const uint32_t *ids, uint32_t n)
{
	uint32_t k;
	int ret;

	if (!w || (n && !ids))
		return -EINVAL;
	if (!n)
		return 0;
	if ((ret = check_taking(w)) < 0)
		return ret;
	for (k = 0; k < n; k++) {
		uint32_t id = ids[k], p;

		if (id >= w->c.blocks) {
			ret = kva__err(-EINVAL, "share: block %u out of range (%zu blocks)", id,
				       w->c.blocks);
			goto undo;
		}
		p = w->c.held[id];
		if (p == KVA__HELD_EXCL) {
			/* Ours alone: nobody else writes its descriptor, so a
			 * store makes it shared. release: what we wrote into the
			 * block is visible to whoever joins (join_holders). */
			uint64_t d = atomic_load_explicit(&w->desc[id], memory_order_relaxed);

			atomic_store_explicit(&w->desc[id],
					      kva__d_make(KVA__D_SHARED, kva__d_epoch(d),
							  w->holder_bit),
					      memory_order_release);
			KVA__CRASH_POINT(KVA__CP_SHARE_EXCL);
			w->c.held[id] = 2 | KVA__HELD_PENDING;
		} else if ((p & KVA__HELD_MAXREF) == KVA__HELD_MAXREF) {
			ret = kva__err(-EOVERFLOW, "share: block %u has %u references from "
				       "worker %u", id, KVA__HELD_MAXREF, w->slot_id);
			goto undo;
		} else if (p & KVA__HELD_MAXREF) {
			w->c.held[id] = p + 1;
		} else {
			if ((ret = join_holders(w, id)) < 0)
				goto undo;
			KVA__CRASH_POINT(KVA__CP_SHARE_JOIN);
			w->c.held[id] = 1;
		}
	}
	for (k = 0; k < n; k++)
		w->c.held[ids[k]] &= ~KVA__HELD_PENDING;
	w->shares += n;
	kva__cache_publish(w);
	return 0;

undo:
	for (uint32_t j = k; j-- > 0;)
		unshare_one(w, ids[j]);
	for (uint32_t j = 0; j < k; j++)
		w->c.held[ids[j]] &= ~KVA__HELD_PENDING;
	return ret;
}

/*
 * kva__worker_release_all - everything this worker holds goes back: its cache,
 * its exclusive blocks, its references. Used by kva_worker_leave().
 */
void kva__worker_release_all(struct kva_worker *w)
{
	uint32_t batch[256], n = 0;

	cache_trim(w, 0);
	for (uint32_t id = 0; id < w->c.blocks; id++) {
		uint32_t p = w->c.held[id];

		if (!p)
			continue;
		w->c.held[id] = 0;
		KVA__CRASH_POINT(KVA__CP_LEAVE_RELEASE);
		if (p & KVA__HELD_EXCL) {
			batch[n++] = id;
			if (n == sizeof(batch) / sizeof(batch[0])) {
				kva__pool_release(w, batch, n);
				n = 0;
			}
		} else {
			drop_holder(w, id); /* may land in the cache */
		}
	}
	kva__pool_release(w, batch, n);
	cache_trim(w, 0);
}

int kva__cache_resize(struct kva_worker *w, uint32_t cap)
{
	uint32_t *cache;

	cache_trim(w, cap);
	if (!cap) {
		free(w->c.ids);
		w->c.ids = NULL;
	} else {
		cache = realloc(w->c.ids, cap * sizeof(*cache));
		if (!cache)
			return -ENOMEM;
		w->c.ids = cache;
	}
	w->c.cap = cap;
	return 0;
}
