/* SPDX-License-Identifier: MIT */
/*
 * stats.c - counts and the block map, from one pass over the descriptors.
 * Read-only; every index read from shared memory is checked before use.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "arena_pvt.h"

int kva_arena_stats(struct kva_arena *a, struct kva_stats *st)
{
	if (!a || !st)
		return -EINVAL;
	memset(st, 0, sizeof(*st));
	st->total_blocks = a->blocks;
	st->max_workers = a->max_workers;
	for (uint32_t i = 0; i < a->max_workers; i++) {
		struct kva__slot *s = &a->slots[i];
		struct kva_slot_stats *o = &st->slots[i];
		uint64_t word = atomic_load_explicit(&s->state, memory_order_acquire);

		o->slot = i;
		o->state = kva__slot_kind(word);
		o->generation = kva__slot_gen(word);
		if (o->state == KVA_SLOT_FREE)
			continue;
		st->workers++;
		/* the state word names the joiner from the first instant; while
		 * RECLAIMING it names the reclaimer instead */
		o->pid = o->state == KVA_SLOT_RECLAIMING
				 ? (int32_t)atomic_load_explicit(&s->owner_pid, memory_order_relaxed)
				 : kva__slot_pid(word);
		kva__slot_name(s, o->name);
		o->cached = (uint32_t)atomic_load_explicit(&s->cached, memory_order_relaxed);
		o->shares = atomic_load_explicit(&s->shares, memory_order_relaxed);
		o->refills = atomic_load_explicit(&s->refills, memory_order_relaxed);
		o->flushes = atomic_load_explicit(&s->flushes, memory_order_relaxed);
		st->cached_blocks += o->cached;
	}
	for (uint32_t id = 0; id < a->blocks; id++) {
		uint64_t d = atomic_load_explicit(&a->desc[id], memory_order_relaxed);
		uint64_t p = kva__d_payload(d);

		switch (kva__d_kind(d)) {
		case KVA__D_FREE:
			st->free_blocks++;
			break;
		case KVA__D_OWNED:
			st->owned_blocks++;
			if (kva__tag_slot(p) < a->max_workers)
				st->slots[kva__tag_slot(p)].owned++;
			break;
		case KVA__D_SHARED:
			st->shared_blocks++;
			st->shared_refs += (uint32_t)__builtin_popcountll(p);
			for (p &= (1ull << a->max_workers) - 1; p; p &= p - 1)
				st->slots[__builtin_ctzll(p)].shared++;
			break;
		case KVA__D_CACHED:
			st->prefix_cached_blocks++;
			break;
		}
	}
	st->used_blocks = st->owned_blocks + st->shared_blocks;
	return 0;
}

int kva_arena_slot(const struct kva_arena *a, uint32_t slot, enum kva_slot_state *state,
		   uint32_t *generation, int32_t *pid)
{
	uint64_t word;

	if (!a || slot >= a->max_workers)
		return -EINVAL;
	word = atomic_load_explicit(&a->slots[slot].state, memory_order_acquire);
	if (state)
		*state = (enum kva_slot_state)kva__slot_kind(word);
	if (generation)
		*generation = kva__slot_gen(word);
	if (pid)
		*pid = kva__slot_pid(word);
	return 0;
}

int kva_stats(struct kva_worker *w, struct kva_stats *st)
{
	if (!w)
		return -EINVAL;
	kva__cache_publish(w);
	return kva_arena_stats(w->arena, st);
}

char kva_slot_char(uint32_t slot)
{
	static const char chars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKL";

	return slot < KVA_MAX_WORKERS ? chars[slot] : '?';
}

/*
 * The classifier of kva_arena_map and kva_arena_block_states: one judgement
 * of a block, for both. It reads, never decides: whatever shared memory
 * says, it returns one of the kinds, and a word it cannot make sense of is
 * BAD ('!'), never a reason to index anything.
 *
 * joined: the slots that may hold blocks, read from their state words when
 * the pass began; a descriptor naming a slot outside it is read again
 * against the slot words before it is called stale, so that a worker that
 * joined during a long pass is not drawn as corruption. agent_bit: the
 * agent's own slot (its tier thread's holds), as the agent reports it:
 * a picture, not a decision.
 */
struct classifier {
	const struct kva_arena *a;
	uint64_t joined, agent_bit;
};

static void classifier_load(struct classifier *c, const struct kva_arena *a)
{
	c->a = a;
	c->joined = 0;
	c->agent_bit = 0;
	for (uint32_t s = 0; s < a->max_workers; s++) {
		/* acquire: pairs with the joiner's release of LIVE, as every
		 * reader of a slot word (kva_arena_stats) */
		if (kva__slot_joined(atomic_load_explicit(&a->slots[s].state, memory_order_acquire)))
			c->joined |= 1ull << s;
		if (atomic_load_explicit(&a->pool->view.slot[s][0], memory_order_relaxed) >> 56 ==
		    KVA_AGENT_SLOT_AGENT)
			c->agent_bit |= 1ull << s;
	}
}

/* Are the slots of @mask joined? Once more against the slot words if not. */
static bool classifier_joined(struct classifier *c, uint64_t mask)
{
	if (!(mask & ~c->joined))
		return true;
	classifier_load(c, c->a);
	return !(mask & ~c->joined);
}

static void classify(struct classifier *c, uint32_t id, struct kva_block_state *out)
{
	const struct kva_arena *a = c->a;
	/* relaxed: a snapshot for a picture; nothing is read through it */
	uint64_t d = atomic_load_explicit(&a->desc[id], memory_order_relaxed);
	uint64_t p = kva__d_payload(d), all = a->max_workers < 64 ? (1ull << a->max_workers) - 1 : ~0ull;
	uint64_t pins;
	uint8_t kind;

	memset(out, 0, sizeof(*out));
	out->slot = 0xff;
	out->epoch = (uint16_t)kva__d_epoch(d);
	switch (kva__d_kind(d)) {
	case KVA__D_FREE:
		kind = p || (d & KVA__D_FLAGS_MASK) ? KVA_BLOCK_BAD : KVA_BLOCK_FREE;
		break;
	case KVA__D_CACHED:
		kind = p ? KVA_BLOCK_BAD : KVA_BLOCK_CACHED;
		break;
	case KVA__D_OWNED:
		kind = KVA_BLOCK_BAD;
		if (d & KVA__D_FLAGS_MASK || kva__tag_slot(p) >= a->max_workers ||
		    !classifier_joined(c, 1ull << kva__tag_slot(p)))
			break;
		kind = KVA_BLOCK_OWNED;
		out->slot = (uint8_t)kva__tag_slot(p);
		out->holders = 1;
		out->holder_mask = 1ull << out->slot;
		break;
	default: /* SHARED */
		kind = KVA_BLOCK_BAD;
		if (!p || (p & ~all) || !classifier_joined(c, p))
			break;
		out->holders = (uint8_t)__builtin_popcountll(p);
		out->holder_mask = p;
		out->slot = (uint8_t)__builtin_ctzll(p);
		if (!(d & KVA__D_PUB) &&
		    atomic_load_explicit(&a->bmeta[id].backing, memory_order_relaxed) >> 63)
			kind = KVA_BLOCK_FETCHING; /* its meta names a fetch request */
		else if ((d & KVA__D_PUB) && (p & c->agent_bit))
			kind = KVA_BLOCK_DEMOTING;
		else
			kind = KVA_BLOCK_SHARED;
		break;
	}
	out->kind = kind;
	if (kind == KVA_BLOCK_BAD) {
		out->holders = 0;
		out->holder_mask = 0;
		out->slot = 0xff;
		return;
	}
	/* a cached block is a publication nobody holds, whatever its bits */
	if (kind == KVA_BLOCK_CACHED || (d & KVA__D_PUB))
		out->flags |= KVA_BLOCK_PUBLISHED;
	/* the pinned hint (struct kva__bmeta): believed for this life only,
	 * and only while someone holds the block */
	if (kind == KVA_BLOCK_OWNED || kind == KVA_BLOCK_SHARED || kind == KVA_BLOCK_DEMOTING) {
		pins = atomic_load_explicit(&a->bmeta[id].pins, memory_order_relaxed);
		if (kva__pins_epoch(pins) == kva__d_epoch(d) && kva__pins_count(pins)) {
			out->flags |= KVA_BLOCK_PINNED;
			out->pins = kva__pins_count(pins) > 0xffff ? 0xffff
								  : (uint16_t)kva__pins_count(pins);
		}
	}
}

int kva_arena_block_states(const struct kva_arena *a, uint32_t first, uint32_t n,
			   struct kva_block_state *out)
{
	struct classifier c;

	if (!a || (n && !out) || first > a->blocks)
		return -EINVAL;
	if (n > a->blocks - first)
		n = a->blocks - first;
	classifier_load(&c, a);
	for (uint32_t k = 0; k < n; k++)
		classify(&c, first + k, &out[k]);
	return (int)n;
}

/* Map classes: one per slot, then these. */
enum { CLS_FREE = KVA_MAX_WORKERS, CLS_SHARED, CLS_CACHED, CLS_DEMOTING, CLS_FETCHING, CLS_BAD,
       CLS_N };

static unsigned map_class(const struct kva_block_state *st)
{
	switch (st->kind) {
	case KVA_BLOCK_FREE:
		return CLS_FREE;
	case KVA_BLOCK_OWNED:
		return st->slot;
	case KVA_BLOCK_SHARED:
		return CLS_SHARED;
	case KVA_BLOCK_CACHED:
		return CLS_CACHED;
	case KVA_BLOCK_DEMOTING:
		return CLS_DEMOTING;
	case KVA_BLOCK_FETCHING:
		return CLS_FETCHING;
	default:
		return CLS_BAD;
	}
}

static char class_char(unsigned c)
{
	return c < KVA_MAX_WORKERS ? kva_slot_char(c)
	       : c == CLS_FREE	   ? '.'
	       : c == CLS_SHARED   ? '#'
	       : c == CLS_CACHED   ? '+'
	       : c == CLS_DEMOTING ? 'v'
	       : c == CLS_FETCHING ? '^'
				   : '!';
}

int kva_arena_map(struct kva_arena *a, char *buf, size_t len, uint32_t cells)
{
	struct classifier cl;

	if (!a || !buf || !cells || len < (size_t)cells + 1)
		return -EINVAL;
	if (cells > a->blocks)
		cells = a->blocks;
	classifier_load(&cl, a);
	for (uint32_t c = 0; c < cells; c++) {
		uint32_t lo = (uint32_t)((uint64_t)a->blocks * c / cells);
		uint32_t hi = (uint32_t)((uint64_t)a->blocks * (c + 1) / cells);
		uint32_t count[CLS_N] = { 0 }, best = CLS_FREE;

		for (uint32_t id = lo; id < hi; id++) {
			struct kva_block_state st;

			classify(&cl, id, &st);
			count[map_class(&st)]++;
		}
		for (unsigned k = 0; k < CLS_N; k++)
			if (count[k] > count[best])
				best = k;
		/* a corrupt descriptor must not hide behind a majority */
		buf[c] = class_char(count[CLS_BAD] ? CLS_BAD : best);
	}
	buf[cells] = '\0';
	return (int)cells;
}

/*
 * A slot's name (any worker can write it) made safe for a terminal: printable
 * ASCII and well-formed UTF-8 of printable code points kept, every other
 * byte '?', so that no escape sequence or control byte reaches the reader's
 * screen. @out holds 32 bytes.
 */
static const char *printable_name(const char *in, char *out)
{
	const unsigned char *p = (const unsigned char *)in;
	size_t len = strnlen(in, 31), o = 0;

	for (size_t i = 0; i < len;) {
		unsigned c = p[i], n = c < 0xe0 ? 1 : c < 0xf0 ? 2 : 3; /* continuation bytes */
		uint32_t cp = c & (0x3f >> n);
		bool ok = c < 0x80 ? c >= 0x20 && c != 0x7f : c >= 0xc2 && c < 0xf5;

		if (c < 0x80)
			n = 0;
		for (unsigned k = 1; ok && k <= n; k++) {
			ok = i + k < len && (p[i + k] & 0xc0) == 0x80;
			if (ok)
				cp = cp << 6 | (p[i + k] & 0x3f);
		}
		/* no C1 controls, overlong forms, surrogates or code points past U+10FFFF */
		if (ok && c >= 0x80)
			ok = cp >= 0xa0 && !(n == 2 && cp < 0x800) && !(n == 3 && cp < 0x10000) &&
			     !(cp >= 0xd800 && cp <= 0xdfff) && cp <= 0x10ffff;
		if (!ok) {
			out[o++] = '?';
			i++;
			continue;
		}
		memcpy(out + o, p + i, n + 1);
		o += n + 1;
		i += n + 1;
	}
	out[o] = '\0';
	return out;
}

int kva_arena_map_print(struct kva_arena *a, FILE *f, uint32_t width, uint32_t rows)
{
	struct kva_stats st;
	uint32_t cells;
	char *map;
	int n;

	if (!a || !f)
		return -EINVAL;
	if (!width)
		width = 64;
	cells = a->blocks;
	if (rows && (uint64_t)width * rows < cells)
		cells = width * rows;
	map = malloc((size_t)cells + 1);
	if (!map)
		return -ENOMEM;
	n = kva_arena_map(a, map, (size_t)cells + 1, cells);
	kva_arena_stats(a, &st);
	for (int off = 0; off < n; off += (int)width)
		fprintf(f, "  %.*s\n", (int)width, map + off);
	free(map);
	fprintf(f, "  legend: . free  # shared  + cached prefix  v being copied below  ^ being "
		"fetched  ! corrupt or stale%s\n",
		(uint32_t)n < a->blocks ? "  (one character per run of blocks, its most common state)"
					: "");
	for (uint32_t s = 0; s < a->max_workers; s++) {
		struct kva_slot_stats *o = &st.slots[s];
		char name[32];

		if (o->state == KVA_SLOT_FREE)
			continue;
		fprintf(f, "          %c %-16s pid %-7d owned %-7u shared %-7u cached %u\n",
			kva_slot_char(s), printable_name(o->name, name), o->pid, o->owned, o->shared,
			o->cached);
	}
	return ferror(f) ? -EIO : 0;
}
