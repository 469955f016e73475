/* SPDX-License-Identifier: MIT */
/*
 * seq.c - sequences: a request's block table, prefix matching and
 * publication, fork with copy-on-write of the partial block, quotas.
 *
 * A sequence lives in its worker's memory; everything it holds it holds
 * through the worker (held[] references), so a worker killed with open
 * sequences is reclaimed like any other: its exclusive blocks are freed, its
 * references dropped, and published blocks it was the last holder of become
 * cached.
 *
 * Publication of a full block we hold exclusively, in this order:
 *   1. index entry VALID (key -> block, epoch)   a matcher sees the block
 *                                                OWNED: a miss, no harm
 *   2. the block's meta: where the entry is
 *   3. descriptor OWNED -> SHARED|PUB{us}        release: the block's bytes
 *                                                and 2. before any match
 * Killed after 1: the block is freed by reclaim (epoch bumped), the entry is
 * stale and removed by whoever meets it. A match's acquire CAS on the
 * descriptor reads 3. or a later CAS of the same release sequence, so the
 * bytes it then reads are the publisher's.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "prefix_pvt.h"



static void u32_add(_Atomic uint32_t *p, int64_t v)
{
	atomic_store_explicit(p, (uint32_t)(atomic_load_explicit(p, memory_order_relaxed) + v),
			      memory_order_relaxed);
}

/* usage accounting of @n more (or fewer) blocks held by sequence @s */
void kva__usage_add(struct kva_seq *s, int64_t n)
{
	u32_add(&s->w->slot->kind_blocks[s->kind], n);
	if (s->tenant_q >= 0)
		u32_add(&s->w->slot->tenant_blocks[s->tenant_q], n);
}

/*
 * kva__pins_add - the pinned hint of the blocks @ids of sequence @s (struct
 * kva__bmeta.pins), @delta (+1 or -1) a block, if @s is pinned. Called
 * while we hold every one of them (after taking, before dropping), so the
 * epoch each is tagged with is its current life's: a count left by an
 * earlier life is replaced, never added to. Relaxed throughout: a hint that
 * orders nothing and that nothing decides from (kva_arena_block_states
 * reads it for pictures); the CAS is for other workers' pinned sequences
 * holding the same block. Killed half-way, some blocks are counted and
 * others not: a picture off until their next life.
 */
void kva__pins_add(struct kva_seq *s, const uint32_t *ids, size_t n, int delta)
{
	struct kva_arena *a = s->w->arena;

	if (s->kind != KVA_OWNER_PINNED)
		return;
	for (size_t k = 0; k < n; k++) {
		uint32_t id = ids[k];
		uint64_t e = kva__d_epoch(atomic_load_explicit(&s->w->desc[id], memory_order_relaxed));
		_Atomic uint64_t *pins = &a->bmeta[id].pins;
		uint64_t old = atomic_load_explicit(pins, memory_order_relaxed), nw;

		do {
			uint32_t count = kva__pins_epoch(old) == e ? kva__pins_count(old) : 0;

			if (delta > 0)
				nw = kva__pins_make(e, count == UINT32_MAX ? count : count + 1);
			else if (count)
				nw = kva__pins_make(e, count - 1);
			else
				break; /* an earlier life's count, or none: nothing of ours */
		} while (!atomic_compare_exchange_weak_explicit(pins, &old, nw, memory_order_relaxed,
								memory_order_relaxed));
	}
}

static uint64_t sum_slots_kind(struct kva_arena *a, unsigned kind)
{
	uint64_t sum = 0;

	for (uint32_t i = 0; i < a->max_workers; i++)
		sum += atomic_load_explicit(&a->slots[i].kind_blocks[kind], memory_order_relaxed);
	return sum;
}

static uint64_t sum_slots_tenant(struct kva_arena *a, int q)
{
	uint64_t sum = 0;

	for (uint32_t i = 0; i < a->max_workers; i++)
		sum += atomic_load_explicit(&a->slots[i].tenant_blocks[q], memory_order_relaxed);
	return sum;
}

/*
 * quota_take - count @more blocks of sequence @s against its owner kind's and
 * tenant's quotas, or -EDQUOT with nothing counted. The caller gives them
 * back (usage_add of -@more) if it then fails.
 *
 * Exact against concurrent takers in any process: our usage is stored first,
 * then (seq_cst fence) every slot's is read. Of two takers, the one whose
 * fence comes later in their total order reads both stores, so the two
 * cannot both see room for one (a Dekker pair): what sequences hold never
 * passes a quota; two takers at once may both be refused where one would
 * have fitted.
 */
int kva__quota_take(struct kva_seq *s, uint64_t more)
{
	struct kva_arena *a = s->w->arena;
	static const char *const kinds[] = { "inference", "training", "pinned" };
	uint32_t lim = atomic_load_explicit(&a->pool->quota_kind[s->kind], memory_order_relaxed);
	uint32_t tlim = s->tenant_q < 0 ? 0
					: atomic_load_explicit(&a->pool->quota_tenant[s->tenant_q][1],
							       memory_order_relaxed);
	uint64_t used;

	kva__usage_add(s, (int64_t)more);
	if (!lim && !tlim)
		return 0;
	/* pairs with the same fence of every other taker */
	atomic_thread_fence(memory_order_seq_cst);
	if (lim && (used = sum_slots_kind(a, s->kind)) > lim) {
		kva__usage_add(s, -(int64_t)more);
		return kva__err(-EDQUOT, "quota: %s sequences hold %llu blocks, %llu more would "
				"pass their quota of %u", kinds[s->kind],
				(unsigned long long)(used - more), (unsigned long long)more, lim);
	}
	if (tlim && (used = sum_slots_tenant(a, s->tenant_q)) > tlim) {
		kva__usage_add(s, -(int64_t)more);
		return kva__err(-EDQUOT, "quota: tenant %u holds %llu blocks, %llu more would "
				"pass its quota of %u",
				atomic_load_explicit(&a->pool->quota_tenant[s->tenant_q][0],
						     memory_order_relaxed),
				(unsigned long long)(used - more), (unsigned long long)more, tlim);
	}
	return 0;
}

int kva_arena_set_quotas(struct kva_arena *a, const struct kva_quotas *q)
{
	if (!a || !q)
		return kva__err(-EINVAL, "set quotas: NULL argument");
	if (a->readonly)
		return kva__err(-EROFS, "set quotas: this mapping is read-only");
	for (unsigned i = 0; i < KVA_MAX_TENANT_QUOTAS; i++)
		for (unsigned j = 0; j < i; j++)
			if (q->tenant[i].blocks && q->tenant[j].blocks &&
			    q->tenant[i].tenant == q->tenant[j].tenant)
				return kva__err(-EINVAL, "set quotas: tenant %u twice",
						q->tenant[i].tenant);
	for (unsigned k = 0; k < KVA_OWNER_KINDS; k++)
		atomic_store_explicit(&a->pool->quota_kind[k], q->kind[k], memory_order_relaxed);
	for (unsigned i = 0; i < KVA_MAX_TENANT_QUOTAS; i++) {
		atomic_store_explicit(&a->pool->quota_tenant[i][0], q->tenant[i].tenant,
				      memory_order_relaxed);
		atomic_store_explicit(&a->pool->quota_tenant[i][1], q->tenant[i].blocks,
				      memory_order_relaxed);
	}
	return 0;
}

/* room for @n more ids in the block table; every caller has bounded
 * n_blocks + n by the arena's block count, and this checks it again */
int kva__table_room(struct kva_seq *s, size_t n)
{
	size_t cap = s->cap ? s->cap : 16;
	uint32_t *ids;

	if (n > s->w->arena->blocks - s->n_blocks)
		return kva__err(-ENOSPC, "sequence: %zu blocks more than its %zu, the arena has %u",
				n, s->n_blocks, s->w->arena->blocks);
	if (s->n_blocks + n <= s->cap)
		return 0;
	while (cap < s->n_blocks + n)
		cap *= 2;
	ids = realloc(s->ids, cap * sizeof(*ids));
	if (!ids)
		return kva__err(-ENOMEM, "sequence: a block table of %zu blocks", cap);
	s->ids = ids;
	s->cap = cap;
	return 0;
}

/* blocks needed to cover @tokens: no overflow for any size_t */
static size_t blocks_for(const struct kva_seq *s, size_t tokens)
{
	return tokens / kva__btok(s) + (tokens % kva__btok(s) != 0);
}

/*
 * reserve_blocks - blocks to cover @upto_tokens, all or nothing. A size no
 * arena could hold is refused before anything is allocated or changed.
 */
static int reserve_blocks(struct kva_seq *s, size_t upto_tokens)
{
	size_t need = blocks_for(s, upto_tokens);
	int ret;

	if (s->max_tokens && upto_tokens > s->max_tokens)
		return kva__err(-EFBIG, "reserve: %zu tokens, the sequence's maximum is %zu",
				upto_tokens, s->max_tokens);
	if (need <= s->n_blocks)
		return 0;
	if (need > s->w->arena->blocks)
		return kva__err(-ENOSPC, "reserve: %zu tokens need %zu blocks, the arena has %u",
				upto_tokens, need, s->w->arena->blocks);
	need -= s->n_blocks;
	if ((ret = kva__quota_take(s, need)) < 0)
		return ret;
	if ((ret = kva__table_room(s, need)) < 0 ||
	    (ret = kva_alloc(s->w, (uint32_t)need, s->ids + s->n_blocks)) < 0) {
		kva__usage_add(s, -(int64_t)need);
		return ret;
	}
	kva__pins_add(s, s->ids + s->n_blocks, need, 1);
	s->n_blocks += need;
	return 0;
}

int kva_seq_open(struct kva_worker *w, const struct kva_seq_opts *o, struct kva_seq **out)
{
	struct kva_seq *s;
	int ret;

	if (!w || !o || !out)
		return kva__err(-EINVAL, "seq_open: NULL argument");
	if ((unsigned)o->kind >= KVA_OWNER_KINDS)
		return kva__err(-EINVAL, "seq_open: owner kind %d", (int)o->kind);
	if ((ret = kva__worker_check_live(w)) < 0)
		return ret;
	s = calloc(1, sizeof(*s));
	if (!s || !(s->part = malloc(sizeof(int32_t) * w->arena->info.geometry.block_tokens))) {
		free(s);
		return kva__err(-ENOMEM, "seq_open: out of memory");
	}
	s->w = w;
	s->kind = o->kind;
	s->max_tokens = o->max_tokens;
	s->tenant_q = -1;
	for (int i = 0; i < KVA_MAX_TENANT_QUOTAS; i++)
		if (atomic_load_explicit(&w->arena->pool->quota_tenant[i][1], memory_order_relaxed) &&
		    atomic_load_explicit(&w->arena->pool->quota_tenant[i][0], memory_order_relaxed) ==
			    o->tenant)
			s->tenant_q = i;
	kva_prefix_salt(o->model, o->adapter, o->tenant, s->salt);
	if (o->kind == KVA_OWNER_TRAINING) {
		/* a run's blocks are its own: the run id is in the salt */
		uint64_t run[2] = { o->run_id, 0x7472616e696e67ull };

		kva_prefix_hash(run, s->salt, NULL, 0, s->salt);
	}
	u32_add(&w->slot->open_seqs, 1);
	if (o->reserve_tokens && (ret = reserve_blocks(s, o->reserve_tokens)) < 0) {
		kva__err_hold(true);
		kva_seq_close(s);
		kva__err_hold(false);
		return ret;
	}
	*out = s;
	return 0;
}

/* Is @b's current publication the one of @key? Only meaningful while we
 * hold @b (struct kva__bmeta). */
static bool block_has_key(struct kva_arena *a, uint32_t b, const uint64_t key[2])
{
	return atomic_load_explicit(&a->bmeta[b].key[0], memory_order_relaxed) == key[0] &&
	       atomic_load_explicit(&a->bmeta[b].key[1], memory_order_relaxed) == key[1];
}

/*
 * join - take a reference to block @b of entry @f, found for @key, if the
 * block is still a publication of @key. The CAS is the linearization point
 * against an evictor's (evict.c). acquire: pairs with the publisher's
 * release, so the block's bytes and its key are the publisher's.
 */
static bool join(struct kva_seq *s, const struct kva__found *f, const uint64_t key[2])
{
	struct kva_worker *w = s->w;
	struct kva_arena *a = w->arena;
	uint32_t b = kva__p_block(f->ctrl), held = w->c.held[b];
	uint64_t d = atomic_load_explicit(&w->desc[b], memory_order_acquire), nd;

	if (held) {
		/* we hold it already (another sequence of ours): it is shared
		 * with our bit, nobody can evict it; one more reference */
		if (held == KVA__HELD_EXCL || held >= KVA__HELD_MAXREF ||
		    kva__d_kind(d) != KVA__D_SHARED || !(d & KVA__D_PUB) ||
		    kva__d_epoch(d) != kva__p_epoch(f->ctrl) || !block_has_key(a, b, key))
			return false;
		w->c.held[b] = held + 1;
		return true;
	}
	do {
		if (kva__d_epoch(d) != kva__p_epoch(f->ctrl))
			return false;
		if (kva__d_kind(d) == KVA__D_CACHED)
			nd = kva__d_make(KVA__D_SHARED, kva__d_epoch(d), w->holder_bit) |
			     KVA__D_PUB | KVA__D_REF;
		else if (kva__d_kind(d) == KVA__D_SHARED && (d & KVA__D_PUB) &&
			 !(d & w->holder_bit))
			nd = d | w->holder_bit | KVA__D_REF;
		else
			return false; /* not published yet, or gone */
	} while (!atomic_compare_exchange_weak_explicit(&w->desc[b], &d, nd,
							memory_order_acquire,
							memory_order_acquire));
	KVA__CRASH_POINT(KVA__CP_MATCH_JOINED);
	w->c.held[b] = 1;
	/* Held now: the block stays in this life, and its key with it, until
	 * we let go. The epoch matched, but epochs are 12 bits: after 4096
	 * lives between our lookup and our CAS the entry's (block, epoch) may
	 * name another prefix's publication. The key cannot. */
	if (!block_has_key(a, b, key)) {
		/* the entry, if it still holds our key, is an older life's
		 * (its block has another key now): gone, for whoever comes next */
		if (kva__index_retire(a, f->pos, f->ctrl, key))
			kva__sc_add(w, KVA__SC_STALE, 1);
		kva_free(w, &b, 1);
		return false;
	}
	return true;
}

/*
 * match - attach the longest prefix of @tokens' full blocks found in the
 * arena, and (tiers running) record how many blocks after it are below.
 */
static int match(struct kva_seq *s, const int32_t *tokens, size_t n, size_t *matched_tokens)
{
	struct kva_worker *w;
	struct kva_arena *a;
	uint32_t bt;
	size_t full, m = 0;
	uint64_t key[2] = { 0, 0 }, k[2] = { 0, 0 }, stale = 0, tick;
	uint32_t *got;
	int ret;

	if (!s || (n && !tokens) || !matched_tokens)
		return kva__err(-EINVAL, "seq_match: NULL argument");
	*matched_tokens = 0;
	if (s->n_tokens)
		return kva__err(-EBUSY, "seq_match: the sequence already has %zu tokens",
				s->n_tokens);
	if (s->fetch)
		return kva__err(-EBUSY, "seq_match: a fetch is in flight");
	w = s->w;
	a = w->arena;
	bt = kva__btok(s);
	s->n_below = 0;
	full = n / bt;
	if (s->max_tokens && full * bt > s->max_tokens)
		full = s->max_tokens / bt;
	/* each matched block is another key, so another block: no match is
	 * longer than the arena, whatever @n says */
	if (full > a->blocks)
		full = a->blocks;
	if ((ret = kva__worker_check_live(w)) < 0)
		return ret;
	if (!full)
		return 0;
	if ((ret = kva__table_room(s, full)) < 0)
		return ret;
	got = s->ids + s->n_blocks; /* room past the table; moved to the front below */
	tick = atomic_load_explicit(&a->pool->tick, memory_order_relaxed);
	for (; m < full; m++) {
		struct kva__found f;

		kva_prefix_hash(m ? key : NULL, s->salt, tokens + m * bt, bt, k);
		if (!kva__index_lookup(a, k, &f, &stale))
			break;
		KVA__CRASH_POINT(KVA__CP_MATCH_LOOKED_UP);
		if (!join(s, &f, k))
			break;
		got[m] = kva__p_block(f.ctrl);
		kva__hint_touch(a, got[m], tick, true);
		key[0] = k[0];
		key[1] = k[1];
	}
	if (stale)
		kva__sc_add(w, KVA__SC_STALE, stale);
	kva__sc_add(w, KVA__SC_HITS, m);
	kva__sc_add(w, KVA__SC_MISSES, full - m);
	if (m < full && atomic_load_explicit(&a->pool->tiers, memory_order_relaxed))
		kva__look_below(s, tokens, m, full, k);
	if (!m)
		return 0;
	if ((ret = kva__quota_take(s, m)) < 0)
		goto drop;
	/* matched blocks first, then what was reserved */
	if (s->n_blocks) {
		uint32_t *tmp = malloc(m * sizeof(*tmp));

		if (!tmp) {
			kva__usage_add(s, -(int64_t)m);
			ret = kva__err(-ENOMEM, "seq_match: out of memory");
			goto drop;
		}
		memcpy(tmp, got, m * sizeof(*tmp));
		memmove(s->ids + m, s->ids, s->n_blocks * sizeof(*s->ids));
		memcpy(s->ids, tmp, m * sizeof(*tmp));
		free(tmp);
	}
	kva__pins_add(s, s->ids, m, 1);
	s->n_blocks += m;
	s->n_tokens = m * bt;
	s->n_hashed = m;
	s->key[0] = key[0];
	s->key[1] = key[1];
	*matched_tokens = s->n_tokens;
	return 0;
drop:
	s->n_below = 0;
	kva__err_hold(true);
	kva_free(w, got, (uint32_t)m);
	kva__err_hold(false);
	return ret;
}

int kva_seq_match(struct kva_seq *s, const int32_t *tokens, size_t n, size_t *matched_tokens)
{
	return match(s, tokens, n, matched_tokens);
}

int kva_seq_match_tiers(struct kva_seq *s, const int32_t *tokens, size_t n, struct kva_match *m)
{
	int ret;

	if (!m)
		return kva__err(-EINVAL, "seq_match: NULL argument");
	memset(m, 0, sizeof(*m));
	if ((ret = match(s, tokens, n, &m->tokens)) < 0)
		return ret;
	for (size_t i = 0; i < s->n_below; i++) {
		if (kva__loc_tier(s->below[i].loc) == KVA__LOC_DISK)
			m->below_disk_tokens += kva__btok(s);
		else
			m->below_host_tokens += kva__btok(s);
	}
	m->below_tokens = m->below_host_tokens + m->below_disk_tokens;
	return 0;
}

int kva_seq_reserve(struct kva_seq *s, size_t n_tokens)
{
	int ret;

	if (!s)
		return kva__err(-EINVAL, "seq_reserve: NULL sequence");
	if ((ret = kva__worker_check_live(s->w)) < 0)
		return ret;
	if (n_tokens > SIZE_MAX - s->n_tokens)
		return kva__err(-EFBIG, "reserve: %zu tokens", n_tokens);
	return reserve_blocks(s, s->n_tokens + n_tokens);
}

/* the partial block is shared with a fork: this side takes a private copy */
static int unshare_partial(struct kva_seq *s)
{
	struct kva_worker *w = s->w;
	size_t i = s->n_tokens / kva__btok(s);
	uint32_t fresh, old = s->ids[i];
	int ret;

	/* for a moment both blocks are held: the quota must have room */
	if ((ret = kva__quota_take(s, 1)) < 0)
		return ret;
	if ((ret = kva_alloc(w, 1, &fresh)) < 0) {
		kva__usage_add(s, -1);
		return ret;
	}
	/* on a GPU arena a driver copy, which can fail: then the fork keeps
	 * sharing the old block and the caller hears why */
	if ((ret = kva__block_copy(w->arena, fresh, old)) < 0) {
		kva_free(w, &fresh, 1);
		kva__usage_add(s, -1);
		return ret;
	}
	s->ids[i] = fresh;
	kva__pins_add(s, &fresh, 1, 1);
	kva__pins_add(s, &old, 1, -1);
	kva_free(w, &old, 1);
	kva__usage_add(s, -1);
	s->cow = false;
	return 0;
}

/*
 * kva__publish_block - publish block @id, which we hold exclusively, under
 * @key (@info: the index's parent and depth hints; @depth: the eviction
 * hint's). @backing: where a copy of these bytes already is below (a fetched
 * block: the record it came from), or 0. true: it is SHARED|PUB with us its
 * one holder (held 1); false: still ours alone (a duplicate, or no room).
 */
bool kva__publish_block(struct kva_worker *w, uint32_t id, const uint64_t key[2], uint64_t info,
			uint32_t depth, uint64_t backing)
{
	struct kva_arena *a = w->arena;
	uint64_t d, pos, twin_loc;
	uint32_t uses;
	int ret;

	/* ours alone: nobody else writes its descriptor, so it cannot move */
	d = atomic_load_explicit(&w->desc[id], memory_order_relaxed);
	if (!kva__publish_room(w, id)) {
		kva__sc_add(w, KVA__SC_INDEX_FULL, 1);
		return false;
	}
	KVA__CRASH_POINT(KVA__CP_PUBLISH_COUNTED);
	ret = kva__index_insert(w, key, id, kva__d_epoch(d), info, &pos, &uses, &twin_loc);
	if (ret < 0) {
		kva__publish_done(w, false);
		kva__sc_add(w, ret == -EEXIST ? KVA__SC_DUPLICATES : KVA__SC_INDEX_FULL, 1);
		return false;
	}
	KVA__CRASH_POINT(KVA__CP_PUBLISH_INDEXED);
	/* a key evicted not long ago and wanted again counts as used before;
	 * a key whose copy below we took over from its spilled ghost keeps
	 * that copy as this block's (the same key: the same bytes) */
	if (!backing)
		backing = twin_loc;
	kva__hint_publish(a, id, key, atomic_load_explicit(&a->pool->tick, memory_order_relaxed),
			  depth, uses, pos, backing);
	/* release: the block's bytes and its meta (its key) before any
	 * matcher's acquire */
	atomic_store_explicit(&w->desc[id],
			      kva__d_make(KVA__D_SHARED, kva__d_epoch(d), w->holder_bit) | KVA__D_PUB,
			      memory_order_release);
	kva__publish_done(w, true);
	w->c.held[id] = 1;
	kva__sc_add(w, KVA__SC_PUBLISHED, 1);
	if (!backing && atomic_load_explicit(&a->pool->tiers, memory_order_relaxed))
		kva__spill_mark(w, id);
	return true;
}

/* publish block @i of the sequence, whose key is @key */
static void publish(struct kva_seq *s, size_t i, const uint64_t key[2])
{
	uint32_t id = s->ids[i];

	if (s->w->c.held[id] != KVA__HELD_EXCL)
		return; /* a block shared by fork before it was full: stays private */
	kva__publish_block(s->w, id, key, (i ? (uint64_t)s->ids[i - 1] + 1 : 0) | ((uint64_t)i << 32),
			   (uint32_t)i, 0);
}

int kva_seq_append(struct kva_seq *s, const int32_t *tokens, size_t n)
{
	uint32_t bt;
	int ret;

	if (!s || (n && !tokens))
		return kva__err(-EINVAL, "seq_append: NULL argument");
	if (s->fetch)
		return kva__err(-EBUSY, "seq_append: a fetch is in flight (wait for it or cancel "
				"it)");
	if ((ret = kva__worker_check_live(s->w)) < 0)
		return ret;
	if (!n)
		return 0;
	if (n > SIZE_MAX - s->n_tokens)
		return kva__err(-EFBIG, "append: %zu tokens", n);
	if ((ret = reserve_blocks(s, s->n_tokens + n)) < 0)
		return ret;
	bt = kva__btok(s);
	if (s->cow && s->n_tokens % bt && (ret = unshare_partial(s)) < 0)
		return ret;
	s->cow = false;
	for (size_t k = 0; k < n; k++) {
		s->part[s->n_tokens % bt] = tokens[k];
		s->n_tokens++;
		if (s->n_tokens % bt == 0) {
			uint64_t key[2];

			kva_prefix_hash(s->n_hashed ? s->key : NULL, s->salt, s->part, bt, key);
			publish(s, s->n_hashed, key);
			s->n_hashed++;
			s->key[0] = key[0];
			s->key[1] = key[1];
		}
	}
	return 0;
}

int kva_seq_fork(struct kva_seq *s, struct kva_seq **child)
{
	struct kva_seq *c;
	size_t used;
	int ret;

	if (!s || !child)
		return kva__err(-EINVAL, "seq_fork: NULL argument");
	if (s->fetch)
		return kva__err(-EBUSY, "seq_fork: a fetch is in flight (wait for it or cancel it)");
	if ((ret = kva__worker_check_live(s->w)) < 0)
		return ret;
	used = blocks_for(s, s->n_tokens);
	if (s->n_tokens % kva__btok(s) && !s->w->arena->data)
		return kva__err(-ENOTSUP, "seq_fork: the partial block cannot be copied here");
	if ((ret = kva__quota_take(s, used)) < 0)
		return ret;
	c = malloc(sizeof(*c));
	if (!c) {
		kva__usage_add(s, -(int64_t)used);
		return kva__err(-ENOMEM, "seq_fork: out of memory");
	}
	*c = *s;
	c->below = NULL;
	c->n_below = c->below_cap = 0;
	c->fetch = NULL;
	c->ids = NULL;
	c->cap = 0;
	c->n_blocks = 0;
	c->part = malloc(sizeof(int32_t) * kva__btok(s));
	if (!c->part || (ret = kva__table_room(c, used ? used : 1)) < 0 ||
	    (used && (ret = kva_share(s->w, s->ids, (uint32_t)used)) < 0)) {
		free(c->part);
		free(c->ids);
		free(c);
		kva__usage_add(s, -(int64_t)used); /* s's kind and tenant are c's */
		return ret < 0 ? ret : kva__err(-ENOMEM, "seq_fork: out of memory");
	}
	memcpy(c->part, s->part, sizeof(int32_t) * kva__btok(s));
	memcpy(c->ids, s->ids, used * sizeof(*s->ids));
	c->n_blocks = used;
	kva__pins_add(c, c->ids, used, 1);
	u32_add(&s->w->slot->open_seqs, 1);
	s->cow = c->cow = s->n_tokens % kva__btok(s) != 0;
	*child = c;
	return 0;
}

int kva_seq_block_table(const struct kva_seq *s, const uint32_t **ids, size_t *n_blocks,
			size_t *n_tokens)
{
	if (!s)
		return -EINVAL;
	if (ids)
		*ids = s->ids;
	if (n_blocks)
		*n_blocks = s->n_blocks;
	if (n_tokens)
		*n_tokens = s->n_tokens;
	return 0;
}

void kva_seq_close(struct kva_seq *s)
{
	struct kva_worker *w;

	if (!s)
		return;
	w = s->w;
	if (s->fetch)
		kva__fetch_abandon(s);
	if (kva__worker_check_live(w) == 0) {
		struct kva_arena *a = w->arena;
		uint64_t tick = atomic_fetch_add_explicit(&a->pool->tick, 1, memory_order_relaxed) + 1;

		/* the request is over: its blocks were used now (the hint's
		 * depth orders them: the root counts as the most recent) */
		for (size_t i = 0; i < s->n_hashed && i < s->n_blocks; i++)
			kva__hint_touch(a, s->ids[i], tick, false);
		/* counted out while we still hold them: after the free their
		 * life may end (then the count no longer matters) or go on
		 * with other holders (then it must be right) */
		kva__pins_add(s, s->ids, s->n_blocks, -1);
		if (s->n_blocks)
			kva_free(w, s->ids, (uint32_t)s->n_blocks);
		kva__usage_add(s, -(int64_t)s->n_blocks);
		u32_add(&w->slot->open_seqs, -1);
	}
	free(s->ids);
	free(s->part);
	free(s->below);
	free(s);
}
