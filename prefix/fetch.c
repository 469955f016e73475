/* SPDX-License-Identifier: MIT */
/*
 * fetch.c - the worker's side of the tiers below the arena: marking
 * publications for a copy below, finding what a match could fetch, and
 * fetching it through the agent.
 *
 * A fetch, step by step (the crash argument for each):
 *   0. a block in the host tier is copied here, from the tier's memory
 *      (mapped read-only), under its record's seqlock, and checked against
 *      its key and hash (host_copy): no agent, no wait. What follows is for
 *      the rest (the disk tier's, and a host record rewritten meanwhile).
 *   1. fresh blocks, allocated and made SHARED with our bit alone: a death
 *      here is an ordinary reclaim (our bit dropped, the last holder frees)
 *   2. one request per block in our slot's fetch area (arena_pvt.h), POSTED,
 *      our fetch_pending bit set, the doorbell rung if the agent sleeps
 *   3. the agent takes a request (POSTED -> BUSY), joins the block (its bit
 *      too: so nobody, reclaim included, frees it while it is written), reads
 *      the record into it, checks its header, drops its bit, stores DONE
 *      (with the hash the bytes must have) or FAILED.
 *      A death of ours before it joins: reclaim freed the block and the
 *      agent's join fails on the epoch; after: reclaim drops our bit, the
 *      agent's drop frees the block
 *   4. we take each served block back as our own (SHARED{us} -> OWNED, one
 *      CAS), hash it (nothing is used before its bytes are checked: a record
 *      that does not verify is reported to the agent, which drops it), and
 *      publish it under its key, which takes its spilled entry over
 *      (index.c); its copy below stays its backing (the same bytes)
 * Blocks served in order from the first are attached to the sequence; one
 * served after a block that was not is published and let go (cached): the
 * next request finds it in the arena.
 */
#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "prefix_pvt.h"

/* What this worker knows of its fetch items, in its own memory. */
enum { MINE_NO = 0, MINE_YES = 1, MINE_ABANDONED = 2 };
#define GRANULE (2ull << 20) /* host tier pages are mapped in this many at a time */

struct kva__fetcher {
	uint32_t count;       /* tickets issued */
	uint32_t cursor;      /* where the next free item is looked for */
	uint8_t mine[KVA__FETCH_ITEMS];
	/* host tier granules in our page tables, a bit each; in the same
	 * allocation, which the core frees at leave without knowing its shape */
	uint64_t mapped[];
};

/*
 * A block of a fetch: to copy here from the host tier (HOST), for the agent
 * and not posted yet (WAIT), posted (POSTED), served by the agent and not
 * checked yet (DONE), ours and checked (OK), not served (FAIL), or given up
 * while the agent still writes it (ABANDONED).
 */
enum { B_HOST, B_WAIT, B_POSTED, B_DONE, B_OK, B_FAIL, B_ABANDONED };
struct kva__fblk {
	uint32_t dest, dest_epoch;
	uint32_t item, ticket;
	uint8_t st, tier;
	uint64_t hash;             /* DONE: what the record says the bytes hash to */
	uint64_t loc;              /* DONE: where the agent served it from */
};

struct kva__fetch {
	size_t n, posted, next;    /* next: the first block not settled in order */
	uint64_t t0, next_alive_check;
	struct kva__fblk b[];
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * ring - wake the agent's tier thread if it sleeps. Callers made their work
 * visible with a seq_cst RMW (a dirty or pending bit); the agent stores
 * sleeping, then (seq_cst) reads those bits: one of the two sees the other.
 * An eventfd write only when it sleeps: a burst costs one.
 */
static void ring(struct kva_worker *w)
{
	uint64_t one = 1;

	if (w->doorbell < 0 || !atomic_load(&w->arena->pool->sleeping))
		return;
	if (write(w->doorbell, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is at its maximum, so it is awake anyway */
	}
}

/*
 * kva__spill_mark - block @id was just published without a copy below: its
 * dirty bit, then its word's summary bit (always, after: the agent clears a
 * summary bit before it reads the word, so a bit set after its read leaves
 * the summary bit set for the next pass).
 */
void kva__spill_mark(struct kva_worker *w, uint32_t id)
{
	struct kva_arena *a = w->arena;
	uint32_t word = id / 64;

	atomic_fetch_or(&a->dirty[word], 1ull << (id % 64));
	atomic_fetch_or(&a->dsum[word / 64], 1ull << (word % 64));
	ring(w);
}

void kva__look_below(struct kva_seq *s, const int32_t *tokens, size_t m, size_t full,
		     const uint64_t k[2])
{
	struct kva_arena *a = s->w->arena;
	uint32_t bt = kva__btok(s);
	uint64_t key[2] = { k[0], k[1] };
	size_t n = 0;

	for (size_t j = m; j < full; j++) {
		struct kva__found f;

		if (j > m)
			kva_prefix_hash(key, s->salt, tokens + j * bt, bt, key);
		if (!kva__index_lookup_spilled(a, key, &f))
			break;
		if (n == s->below_cap) {
			size_t cap = s->below_cap ? 2 * s->below_cap : 16;
			struct kva__below *b = realloc(s->below, cap * sizeof(*b));

			if (!b)
				break; /* a shorter fetch, not an error */
			s->below = b;
			s->below_cap = cap;
		}
		s->below[n].key[0] = key[0];
		s->below[n].key[1] = key[1];
		s->below[n].loc = kva__p_loc(f.ctrl);
		n++;
	}
	s->n_below = n;
	s->below_at = m;
	if (n)
		kva__sc_add(s->w, KVA__SC_BELOW, n);
}

/* ------------------------------------------------------------ items */

static struct kva__fetch_area *area(struct kva_worker *w)
{
	return &w->arena->fetch[w->slot_id];
}

/*
 * fetcher - ours, made at the first fetch. Requests an earlier life of this
 * slot left POSTED are taken back (the agent's CAS on them then fails);
 * those it left BUSY are the agent's until it is done with them.
 */
static struct kva__fetcher *fetcher(struct kva_worker *w)
{
	struct kva__fetcher *f = w->fetcher;
	struct kva__fetch_area *fa = area(w);

	if (f)
		return f;
	f = calloc(1, sizeof(*f) + (w->host_bytes + GRANULE * 64 - 1) / (GRANULE * 64) *
				   sizeof(uint64_t));
	if (!f)
		return NULL;
	for (uint32_t i = 0; i < KVA__FETCH_ITEMS; i++) {
		uint32_t st = atomic_load_explicit(&fa->item[i].state, memory_order_acquire);

		if (kva__f_kind(st) == KVA__F_POSTED &&
		    !atomic_compare_exchange_strong(&fa->item[i].state, &st,
						    kva__f_word(KVA__F_FREE, 0)))
			st = atomic_load_explicit(&fa->item[i].state, memory_order_acquire);
		if (kva__f_kind(st) == KVA__F_POSTED || kva__f_kind(st) == KVA__F_BUSY)
			f->mine[i] = MINE_ABANDONED;
	}
	w->fetcher = f;
	return f;
}

/* an item nobody uses: ours to fill, or UINT32_MAX */
static uint32_t item_get(struct kva_worker *w, struct kva__fetcher *f)
{
	struct kva__fetch_area *fa = area(w);

	for (uint32_t k = 0; k < KVA__FETCH_ITEMS; k++) {
		uint32_t i = (f->cursor + k) % KVA__FETCH_ITEMS, kind;

		if (f->mine[i] == MINE_YES)
			continue;
		kind = kva__f_kind(atomic_load_explicit(&fa->item[i].state, memory_order_acquire));
		if (kind == KVA__F_POSTED || kind == KVA__F_BUSY)
			continue; /* an abandoned request the agent still has */
		f->mine[i] = MINE_YES;
		f->cursor = i + 1;
		return i;
	}
	return UINT32_MAX;
}

static uint32_t ticket_next(struct kva_worker *w, struct kva__fetcher *f)
{
	return (w->gen & 0xfffu) << 16 | (++f->count & 0xffffu);
}

/* ------------------------------------------------------------ the host tier */

/* a record that did not verify: the agent drops it (it keeps the last few) */
static void reject(struct kva_worker *w, uint64_t loc, bool disk)
{
	struct kva__fetch_area *fa = area(w);
	uint32_t k = atomic_load_explicit(&fa->reject_next, memory_order_relaxed);

	atomic_store_explicit(&fa->reject[k % KVA__REJECTS], loc, memory_order_relaxed);
	atomic_store_explicit(&fa->reject_next, k + 1, memory_order_relaxed);
	kva__sc_add(w, disk ? KVA__SC_VERIFY_DISK : KVA__SC_VERIFY_HOST, 1);
}

static void hist_add(struct kva_worker *w, uint64_t ns)
{
	_Atomic uint64_t *b = &area(w)->host_hist[kva__hist_bucket(ns)];

	/* ours alone to write: a relaxed load and store */
	atomic_store_explicit(b, atomic_load_explicit(b, memory_order_relaxed) + 1,
			      memory_order_relaxed);
}

/*
 * host_map_in - the host tier's pages of [@off, @off + @len) in our page
 * tables, a 2 MiB granule at a time (MADV_POPULATE_READ, Linux 5.14): one
 * call where touching them would fault each 4 KiB page in on its own, which
 * costs a first copy several times the copy.
 */
static void host_map_in(struct kva_worker *w, uint64_t off, uint64_t len)
{
	struct kva__fetcher *f = w->fetcher;
	uint64_t granules = (w->host_bytes + GRANULE - 1) / GRANULE;

	for (uint64_t g = off / GRANULE; g <= (off + len - 1) / GRANULE && g < granules; g++) {
		if (f->mapped[g / 64] & (1ull << (g % 64)))
			continue;
		madvise((void *)(w->host_map + g * GRANULE),
			g * GRANULE + GRANULE <= w->host_bytes ? GRANULE : w->host_bytes - g * GRANULE,
			MADV_POPULATE_READ);
		f->mapped[g / 64] |= 1ull << (g % 64);
	}
}

/*
 * host_copy - record @loc of the host tier into block @dest (ours alone), by
 * the seqlock of arena_pvt.h: magic (acquire), the header checked against
 * @key, the bytes copied and hashed, then (acquire fence) the header again.
 * The agent never waits for us: a record it rewrote meanwhile shows in the
 * header and we give the block to the agent instead. A record that holds
 * still and does not hash to its header is corrupt: reported, never used.
 */
static bool host_copy(struct kva_worker *w, uint32_t dest, const uint64_t key[2], uint64_t loc)
{
	struct kva_arena *a = w->arena;
	uint64_t bb = a->info.layout.block_bytes, rb = kva_tier_record_bytes(bb);
	uint64_t t0 = now_ns(), slot = kva__loc_slot(loc);
	const struct kva__rec_hdr *hp;
	struct kva__rec_hdr h, again;
	bool ok;

	if (!w->host_map || (slot + 1) * rb > w->host_bytes)
		return false;
	host_map_in(w, slot * rb, rb);
	hp = (const struct kva__rec_hdr *)(w->host_map + slot * rb);
	if (atomic_load_explicit(&hp->magic, memory_order_acquire) != KVA__REC_MAGIC)
		return false;
	memcpy(&h, hp, sizeof(h));
	if (kva__rec_hdr_check(&h, w->rec_fp, key, bb))
		return false;
	ok = kva__rec_scatter(a, dest, (const uint8_t *)hp + KVA__REC_HDR_BYTES, h.data_hash);
	atomic_thread_fence(memory_order_acquire);
	memcpy(&again, hp, sizeof(again));
	if (memcmp(&h, &again, sizeof(h)))
		return false; /* rewritten while we copied */
	if (!ok) {
		reject(w, loc, false);
		return false;
	}
	hist_add(w, now_ns() - t0);
	return true;
}

/* give block @j to the agent: the request in its meta, shared for its join */
static void for_agent(struct kva_worker *w, struct kva_seq *s, struct kva__fblk *b, size_t j)
{
	struct kva__bmeta *m = &w->arena->bmeta[b->dest];

	b->ticket = ticket_next(w, w->fetcher);
	/* the request in the block's meta, which is ours to write while we
	 * hold it alone (arena_pvt.h, kva__fetch_tag) */
	atomic_store_explicit(&m->key[0], s->below[j].key[0], memory_order_relaxed);
	atomic_store_explicit(&m->key[1], s->below[j].key[1], memory_order_relaxed);
	atomic_store_explicit(&m->backing, kva__fetch_tag(w->slot_id, b->ticket),
			      memory_order_relaxed);
	/* ours alone, so a store: SHARED with our bit alone, which is what the
	 * agent's join will insist on. release: the meta above before the
	 * agent's acquire join */
	atomic_store_explicit(&w->desc[b->dest],
			      kva__d_make(KVA__D_SHARED, b->dest_epoch, w->holder_bit),
			      memory_order_release);
	w->c.held[b->dest] = 1;
	b->st = B_WAIT;
}

/* the host tier's blocks, copied here (up to @budget bytes; 0: all) */
static bool copy_host(struct kva_seq *s, uint64_t budget)
{
	struct kva_worker *w = s->w;
	struct kva__fetch *ft = s->fetch;
	uint64_t bb = w->arena->info.layout.block_bytes, done = 0;
	bool changed = false;

	for (size_t j = 0; j < ft->n && (!budget || done < budget); j++) {
		struct kva__fblk *b = &ft->b[j];

		if (b->st != B_HOST)
			continue;
		changed = true;
		done += bb;
		if (host_copy(w, b->dest, s->below[j].key, s->below[j].loc)) {
			b->st = B_OK;
			b->tier = KVA__LOC_HOST;
		} else {
			for_agent(w, s, b, j); /* moved, or being rewritten: it knows */
		}
	}
	return changed;
}

/* post what waits for the agent, as far as items go */
static void post(struct kva_seq *s)
{
	struct kva_worker *w = s->w;
	struct kva__fetch *ft = s->fetch;
	struct kva__fetcher *f = w->fetcher;
	struct kva__fetch_area *fa = area(w);
	uint64_t t = now_ns();
	bool any = false;

	for (size_t j = 0; j < ft->n; j++) {
		struct kva__fblk *b = &ft->b[j];
		struct kva__below *bl = &s->below[j];
		struct kva__fitem *it;
		uint32_t i;

		if (b->st != B_WAIT)
			continue;
		if ((i = item_get(w, f)) == UINT32_MAX)
			break; /* every item in use: the rest when some come back */
		it = &fa->item[i];
		b->item = i;
		atomic_store_explicit(&it->dest, b->dest, memory_order_relaxed);
		atomic_store_explicit(&it->dest_epoch, b->dest_epoch, memory_order_relaxed);
		atomic_store_explicit(&it->result, 0, memory_order_relaxed);
		atomic_store_explicit(&it->key[0], bl->key[0], memory_order_relaxed);
		atomic_store_explicit(&it->key[1], bl->key[1], memory_order_relaxed);
		atomic_store_explicit(&it->loc, bl->loc, memory_order_relaxed);
		atomic_store_explicit(&it->posted_ns, t, memory_order_relaxed);
		/* release: the fields before the agent's acquire CAS */
		atomic_store_explicit(&it->state, kva__f_word(KVA__F_POSTED, b->ticket),
				      memory_order_release);
		b->st = B_POSTED;
		ft->posted++;
		any = true;
	}
	if (any) {
		atomic_fetch_or(&w->arena->pool->fetch_pending, 1ull << w->slot_id);
		ring(w);
	}
}

/* what the agent finished: served (to check) or not */
static bool collect(struct kva_seq *s)
{
	struct kva_worker *w = s->w;
	struct kva__fetch *ft = s->fetch;
	struct kva__fetch_area *fa = area(w);
	bool changed = false;

	for (size_t j = 0; j < ft->n; j++) {
		struct kva__fblk *b = &ft->b[j];
		struct kva__fitem *it;
		uint32_t st, kind;

		if (b->st != B_POSTED)
			continue;
		it = &fa->item[b->item];
		/* acquire: pairs with the agent's release of DONE, after its
		 * last write into the block */
		st = atomic_load_explicit(&it->state, memory_order_acquire);
		kind = kva__f_kind(st);
		if (kva__f_ticket(st) != b->ticket || (kind != KVA__F_DONE && kind != KVA__F_FAILED))
			continue;
		if (kind == KVA__F_DONE) {
			b->st = B_DONE;
			b->tier = (uint8_t)((atomic_load_explicit(&it->result,
								  memory_order_relaxed) >> 8) & 3);
			b->hash = atomic_load_explicit(&it->data_hash, memory_order_relaxed);
			b->loc = atomic_load_explicit(&it->loc, memory_order_relaxed);
		} else {
			b->st = B_FAIL;
		}
		w->fetcher->mine[b->item] = MINE_NO;
		changed = true;
	}
	if (changed)
		post(s);
	return changed;
}

static bool over(const struct kva__fetch *ft)
{
	for (size_t j = 0; j < ft->n; j++)
		if (ft->b[j].st == B_HOST || ft->b[j].st == B_WAIT || ft->b[j].st == B_POSTED)
			return false;
	return true;
}

/*
 * take_back - a block the agent served, SHARED with our bit alone, becomes
 * ours alone (acquire: with collect()'s, everything the agent wrote is ours
 * to read), and is checked: the bytes must hash to what the record said.
 * On a GPU arena the agent checked them on the host before it copied them
 * up (tiers/: kva__rec_put_dev), and the CPU does not read device memory.
 */
static bool take_back(struct kva_worker *w, struct kva__fblk *b)
{
	uint64_t d = kva__d_make(KVA__D_SHARED, b->dest_epoch, w->holder_bit);

	if (!atomic_compare_exchange_strong_explicit(
		    &w->desc[b->dest], &d,
		    kva__d_make(KVA__D_OWNED, b->dest_epoch, w->owner_payload),
		    memory_order_acq_rel, memory_order_relaxed))
		return false;
	w->c.held[b->dest] = KVA__HELD_EXCL;
	if (!w->arena->dev && kva__block_hash(w->arena, b->dest) != b->hash) {
		reject(w, b->loc, b->tier == KVA__LOC_DISK);
		return false;
	}
	return true;
}

/* the fetch is over (or cancelled): check, attach, publish, let go, report */
static void finish(struct kva_seq *s, struct kva_fetch_result *r)
{
	struct kva_worker *w = s->w;
	struct kva__fetch *ft = s->fetch;
	struct kva_fetch_result res = { 0 };
	uint32_t bt = kva__btok(s);
	size_t prefix = 0, at = s->n_hashed, reserved;
	bool gap = false;

	for (size_t j = 0; j < ft->n; j++) {
		struct kva__fblk *b = &ft->b[j];
		const struct kva__below *bl = &s->below[j];
		uint32_t depth = (uint32_t)(at + j);

		if (b->st == B_DONE)
			b->st = take_back(w, b) ? B_OK : B_FAIL;
		if (b->st != B_OK) {
			/* not served, or not as it should be: let go of it (the
			 * agent frees it if it still holds it) */
			if (w->c.held[b->dest])
				kva_free(w, &b->dest, 1);
			res.failed_blocks++;
			gap = true;
			continue;
		}
		if (b->tier == KVA__LOC_DISK)
			res.disk_blocks++;
		else
			res.host_blocks++;
		if (gap) {
			/* useful to the next request, not to this one */
			kva__publish_block(w, b->dest, bl->key, (uint64_t)depth << 32, depth, bl->loc);
			kva_free(w, &b->dest, 1);
			res.orphan_blocks++;
			continue;
		}
		/* after the matched blocks, before the reserved ones */
		reserved = s->n_blocks - (at + prefix);
		memmove(s->ids + at + prefix + 1, s->ids + at + prefix, reserved * sizeof(*s->ids));
		s->ids[at + prefix] = b->dest;
		s->n_blocks++;
		kva__pins_add(s, &b->dest, 1, 1);
		kva__publish_block(w, b->dest, bl->key,
				   (at + prefix ? (uint64_t)s->ids[at + prefix - 1] + 1 : 0) |
					   (uint64_t)depth << 32,
				   depth, b->loc ? b->loc : bl->loc);
		s->key[0] = bl->key[0];
		s->key[1] = bl->key[1];
		prefix++;
	}
	/* the blocks not attached were counted against the quotas at start */
	kva__usage_add(s, -(int64_t)(ft->n - prefix));
	s->n_hashed += prefix;
	s->n_tokens = s->n_hashed * bt;
	kva__sc_add(w, KVA__SC_FETCHED_HOST, res.host_blocks);
	kva__sc_add(w, KVA__SC_FETCHED_DISK, res.disk_blocks);
	kva__sc_add(w, KVA__SC_FETCH_FAILED, res.failed_blocks);
	res.tokens = s->n_tokens;
	res.fetched_tokens = prefix * bt;
	res.ns = now_ns() - ft->t0;
	s->n_below = 0;
	s->fetch = NULL;
	free(ft);
	if (r)
		*r = res;
}

/* ------------------------------------------------------------ API */

#define POLL_COPY_BYTES (8ull << 20) /* host-tier bytes a poll copies at most */

int kva_seq_fetch_start(struct kva_seq *s, size_t max_tokens)
{
	struct kva_worker *w;
	struct kva__fetch *ft;
	uint32_t *ids;
	size_t n;
	int ret;

	if (!s)
		return kva__err(-EINVAL, "fetch: NULL sequence");
	w = s->w;
	if ((ret = kva__worker_check_live(w)) < 0)
		return ret;
	if (s->fetch)
		return kva__err(-EBUSY, "fetch: one is in flight already");
	if (!s->n_below)
		return kva__err(-ENODATA, "fetch: the last match found nothing below the arena");
	if (s->below_at != s->n_hashed || s->n_tokens != s->n_hashed * kva__btok(s))
		return kva__err(-EBUSY, "fetch: the sequence moved since its match");
	if (w->doorbell < 0)
		return kva__err(-ENOTCONN, "fetch: this worker has no agent to fetch from "
				"(kva_attach)");
	n = s->n_below;
	if (max_tokens && max_tokens / kva__btok(s) < n)
		n = max_tokens / kva__btok(s);
	if (!n)
		return kva__err(-ENODATA, "fetch: %zu tokens is less than a block", max_tokens);
	if (!fetcher(w))
		return kva__err(-ENOMEM, "fetch: out of memory");
	ft = calloc(1, sizeof(*ft) + n * sizeof(ft->b[0]));
	ids = malloc(n * sizeof(*ids));
	if (!ft || !ids || (ret = kva__table_room(s, n)) < 0) {
		free(ft);
		free(ids);
		return ret < 0 ? ret : kva__err(-ENOMEM, "fetch: out of memory");
	}
	if ((ret = kva__quota_take(s, n)) < 0 || (ret = kva_alloc(w, (uint32_t)n, ids)) < 0) {
		if (ret != -EDQUOT)
			kva__usage_add(s, -(int64_t)n);
		free(ft);
		free(ids);
		return ret;
	}
	for (size_t j = 0; j < n; j++) {
		uint64_t d = atomic_load_explicit(&w->desc[ids[j]], memory_order_relaxed);

		ft->b[j] = (struct kva__fblk){ .dest = ids[j], .dest_epoch = (uint32_t)kva__d_epoch(d),
					       .item = UINT32_MAX, .st = B_HOST };
		/* the host tier's are copied here (by poll and wait); the rest
		 * goes to the agent now */
		if (kva__loc_tier(s->below[j].loc) != KVA__LOC_HOST || !w->host_map)
			for_agent(w, s, &ft->b[j], j);
	}
	free(ids);
	ft->n = n;
	ft->t0 = now_ns();
	ft->next_alive_check = ft->t0 + 200000000ull;
	s->fetch = ft;
	post(s);
	return 0;
}

/* the agent that serves us is gone: nothing more will be served */
static bool agent_gone(struct kva_worker *w)
{
	int32_t pid = atomic_load_explicit(&w->arena->pool->agent_pid, memory_order_relaxed);

	return pid > 0 && kill(pid, 0) < 0 && errno == ESRCH;
}

/* one step: host copies (up to @budget bytes), the agent's completions */
static int step(struct kva_seq *s, uint64_t budget, struct kva_fetch_result *r)
{
	uint64_t t;

	if (copy_host(s, budget))
		post(s);
	collect(s);
	if (over(s->fetch)) {
		finish(s, r);
		return 0;
	}
	t = now_ns();
	if (t >= s->fetch->next_alive_check) {
		s->fetch->next_alive_check = t + 200000000ull;
		if (agent_gone(s->w))
			return kva_seq_fetch_cancel(s, r);
	}
	return -EINPROGRESS;
}

int kva_seq_fetch_poll(struct kva_seq *s, struct kva_fetch_result *r)
{
	if (!s || !s->fetch)
		return kva__err(-EINVAL, "fetch: none in flight");
	return step(s, POLL_COPY_BYTES, r);
}

static long futex_wait(_Atomic uint32_t *addr, uint32_t val, uint64_t ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };

	/* not FUTEX_PRIVATE: the word is in memory shared with the agent */
	return syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

int kva_seq_fetch_wait(struct kva_seq *s, int timeout_ms, struct kva_fetch_result *r)
{
	struct kva__fetch_area *fa;
	uint64_t end;
	int ret;

	if (!s || !s->fetch)
		return kva__err(-EINVAL, "fetch: none in flight");
	fa = area(s->w);
	end = timeout_ms < 0 ? UINT64_MAX : now_ns() + (uint64_t)timeout_ms * 1000000ull;
	for (;;) {
		uint64_t t, slice;
		uint32_t v;

		/* the host tier's blocks all at once: a copy, nothing to wait for */
		if ((ret = step(s, 0, r)) != -EINPROGRESS)
			return ret;
		t = now_ns();
		if (t >= end)
			return kva__err(-ETIMEDOUT, "fetch: not over after %d ms", timeout_ms);
		/* at most 100 ms at a time: step checks that the agent lives */
		slice = end - t < 100000000ull ? end - t : 100000000ull;
		/* Dekker with the agent, which bumps done, then reads waiting:
		 * either it sees us waiting and wakes us, or our read of done
		 * (or the re-check) sees its bump */
		atomic_fetch_add(&fa->waiting, 1);
		v = atomic_load(&fa->done);
		if (!collect(s) && !over(s->fetch))
			futex_wait(&fa->done, v, slice);
		atomic_fetch_sub(&fa->waiting, 1);
	}
}

int kva_seq_fetch_cancel(struct kva_seq *s, struct kva_fetch_result *r)
{
	struct kva__fetch *ft;
	struct kva__fetch_area *fa;

	if (!s || !s->fetch)
		return kva__err(-EINVAL, "fetch: none in flight");
	ft = s->fetch;
	fa = area(s->w);
	collect(s);
	for (size_t j = 0; j < ft->n; j++) {
		struct kva__fblk *b = &ft->b[j];
		uint32_t want, st;

		if (b->st == B_HOST || b->st == B_WAIT) {
			b->st = B_FAIL;
			continue;
		}
		if (b->st != B_POSTED)
			continue;
		/* not taken yet: take it back, and the agent never will */
		want = kva__f_word(KVA__F_POSTED, b->ticket);
		if (atomic_compare_exchange_strong(&fa->item[b->item].state, &want,
						   kva__f_word(KVA__F_FREE, b->ticket))) {
			s->w->fetcher->mine[b->item] = MINE_NO;
			b->st = B_FAIL;
			continue;
		}
		st = atomic_load_explicit(&fa->item[b->item].state, memory_order_acquire);
		if (kva__f_kind(st) == KVA__F_DONE || kva__f_kind(st) == KVA__F_FAILED)
			continue; /* collected below */
		/* the agent is on it: it keeps the item and its hold on the
		 * block until it is done; we let go of both */
		s->w->fetcher->mine[b->item] = MINE_ABANDONED;
		b->st = B_ABANDONED;
	}
	/* served between our collect and the CAS: as served */
	collect(s);
	for (size_t j = 0; j < ft->n; j++)
		if (ft->b[j].st == B_POSTED) /* a word no request of ours can be */
			ft->b[j].st = B_ABANDONED;
	finish(s, r);
	return 0;
}

void kva__fetch_abandon(struct kva_seq *s)
{
	kva__err_hold(true);
	kva_seq_fetch_cancel(s, NULL);
	kva__err_hold(false);
}
