/* SPDX-License-Identifier: MIT */
/*
 * stats.c - counts and the block map, from one pass over the descriptors.
 * Read-only; every index read from shared memory is checked before use.
 */
#include <errno.h>
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

/* Map classes: one per slot, then these. DEMOTING: a published block the
 * agent holds (its tier thread copying it below); FETCHING: the destination
 * of a fetch request, its meta naming the request (kva__fetch_tag). */
enum { CLS_FREE = KVA_MAX_WORKERS, CLS_SHARED, CLS_CACHED, CLS_DEMOTING, CLS_FETCHING, CLS_BAD,
       CLS_N };

static unsigned classify(struct kva_arena *a, uint32_t id, uint64_t d, uint64_t joined,
			 uint64_t agent_bit)
{
	uint32_t max_workers = a->max_workers;
	uint64_t p = kva__d_payload(d);

	if (kva__d_kind(d) == KVA__D_SHARED && p && !(p & ~joined)) {
		if (!(d & KVA__D_PUB) &&
		    atomic_load_explicit(&a->bmeta[id].backing, memory_order_relaxed) >> 63)
			return CLS_FETCHING;
		if ((d & KVA__D_PUB) && (p & agent_bit))
			return CLS_DEMOTING;
	}
	if ((d & KVA__D_FLAGS_MASK) && kva__d_kind(d) != KVA__D_SHARED &&
	    kva__d_kind(d) != KVA__D_CACHED)
		return CLS_BAD;
	switch (kva__d_kind(d)) {
	case KVA__D_FREE:
		return p ? CLS_BAD : CLS_FREE;
	case KVA__D_CACHED:
		return p ? CLS_BAD : CLS_CACHED;
	case KVA__D_OWNED:
		if (kva__tag_slot(p) >= max_workers || !(joined & (1ull << kva__tag_slot(p))))
			return CLS_BAD;
		return kva__tag_slot(p);
	case KVA__D_SHARED:
		return p && !(p & ~joined) ? CLS_SHARED : CLS_BAD;
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
	uint64_t joined = 0, agent_bit = 0;

	if (!a || !buf || !cells || len < (size_t)cells + 1)
		return -EINVAL;
	if (cells > a->blocks)
		cells = a->blocks;
	for (uint32_t s = 0; s < a->max_workers; s++) {
		if (kva__slot_joined(atomic_load_explicit(&a->slots[s].state, memory_order_acquire)))
			joined |= 1ull << s;
		/* the agent's own slot, as it reports it (a picture, not a decision) */
		if (atomic_load_explicit(&a->pool->view.slot[s][0], memory_order_relaxed) >> 56 ==
		    KVA_AGENT_SLOT_AGENT)
			agent_bit |= 1ull << s;
	}
	for (uint32_t c = 0; c < cells; c++) {
		uint32_t lo = (uint32_t)((uint64_t)a->blocks * c / cells);
		uint32_t hi = (uint32_t)((uint64_t)a->blocks * (c + 1) / cells);
		uint32_t count[CLS_N] = { 0 }, best = CLS_FREE;

		for (uint32_t id = lo; id < hi; id++)
			count[classify(a, id, atomic_load_explicit(&a->desc[id], memory_order_relaxed),
				       joined, agent_bit)]++;
		for (unsigned k = 0; k < CLS_N; k++)
			if (count[k] > count[best])
				best = k;
		/* a corrupt descriptor must not hide behind a majority */
		buf[c] = class_char(count[CLS_BAD] ? CLS_BAD : best);
	}
	buf[cells] = '\0';
	return (int)cells;
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

		if (o->state == KVA_SLOT_FREE)
			continue;
		fprintf(f, "          %c %-16s pid %-7d owned %-7u shared %-7u cached %u\n",
			kva_slot_char(s), o->name, o->pid, o->owned, o->shared, o->cached);
	}
	return ferror(f) ? -EIO : 0;
}
