/* SPDX-License-Identifier: MIT */
/*
 * worker.c - joining and leaving an arena, and a worker's view of block data.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena_pvt.h"

static void slot_set_name(struct kva__slot *s, const char *name)
{
	char buf[sizeof(s->name)] = { 0 };

	snprintf(buf, sizeof(buf), "%s", name);
	for (unsigned i = 0; i < 4; i++) {
		uint64_t v;

		memcpy(&v, buf + 8 * i, 8);
		atomic_store_explicit(&s->name[i], v, memory_order_relaxed);
	}
}

/* kva__slot_name - copy a slot's name out; always NUL-terminated. */
void kva__slot_name(struct kva__slot *s, char out[32])
{
	for (unsigned i = 0; i < 4; i++) {
		uint64_t v = atomic_load_explicit(&s->name[i], memory_order_relaxed);

		memcpy(out + 8 * i, &v, 8);
	}
	out[31] = '\0';
}

int kva_worker_join(struct kva_arena *a, const char *name, struct kva_worker **out)
{
	struct kva_worker *w;
	struct kva__slot *s = NULL;
	uint64_t cur = 0, start_time = 0;
	pid_t pid = getpid();
	uint32_t id;
	int ret;

	if (!a || !out)
		return kva__err(-EINVAL, "kva_worker_join: NULL argument");
	kva__err_clear();
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->c.held = calloc(a->blocks, sizeof(*w->c.held));
	if (!w->c.held) {
		ret = -ENOMEM;
		goto fail;
	}
	w->arena = a;
	w->desc = a->desc;
	w->c.blocks = a->blocks;
	if ((ret = kva__cache_resize(w, a->hdr.cache_blocks)) < 0)
		goto fail;
	kva__pid_start_time(pid, &start_time, NULL);

	for (id = 0; id < a->max_workers; id++) {
		s = &a->slots[id];
		cur = atomic_load_explicit(&s->state, memory_order_acquire);
		/* Claim: FREE -> JOINING with our pid, one CAS, so that a joiner
		 * killed from here on leaves a slot a reclaimer can find. acquire:
		 * the previous holder's release of the slot happens before. */
		if (kva__slot_kind(cur) == KVA_SLOT_FREE &&
		    atomic_compare_exchange_strong_explicit(
			    &s->state, &cur,
			    kva__slot_word(KVA_SLOT_JOINING, kva__slot_gen(cur), pid),
			    memory_order_acquire, memory_order_relaxed))
			break;
	}
	if (id == a->max_workers) {
		ret = kva__err(-EUSERS, "join: all %u worker slots are taken", a->max_workers);
		goto fail;
	}
	KVA__CRASH_POINT(KVA__CP_JOIN_CLAIMED);
	atomic_store_explicit(&s->start_time, start_time, memory_order_relaxed);
	atomic_store_explicit(&s->owner_pid, pid, memory_order_relaxed);
	slot_set_name(s, name ? name : "worker");
	atomic_store_explicit(&s->cached, 0, memory_order_relaxed);
	atomic_store_explicit(&s->shares, 0, memory_order_relaxed);
	atomic_store_explicit(&s->refills, 0, memory_order_relaxed);
	atomic_store_explicit(&s->flushes, 0, memory_order_relaxed);

	w->slot = s;
	w->slot_id = id;
	w->gen = kva__slot_gen(cur);
	w->owner_payload = kva__owner_tag(id, w->gen);
	w->holder_bit = 1ull << id;
	w->slot_word = kva__slot_word(KVA_SLOT_LIVE, w->gen, pid);
	/* start claiming far from the other slots: slot * golden ratio, mod 1,
	 * spreads any number of them evenly around the arena */
	w->cursor = (uint32_t)(((uint64_t)a->blocks * (uint32_t)(id * 0x9e3779b9u)) >> 32);
	/* release: the fields above are visible to whoever sees LIVE */
	atomic_store_explicit(&s->state, w->slot_word, memory_order_release);
	*out = w;
	return 0;
fail:
	free(w->c.ids);
	free(w->c.held);
	free(w);
	return ret;
}

void kva_worker_leave(struct kva_worker *w)
{
	uint64_t cur;

	if (!w)
		return;
	if (kva__worker_check_live(w) == 0) {
		kva__worker_release_all(w);
		/* The slot is free for a new worker with the next generation: no
		 * tag of ours can be taken for its. release: our last descriptor
		 * writes come before the next joiner's acquire of the slot. */
		cur = w->slot_word;
		atomic_compare_exchange_strong_explicit(
			&w->slot->state, &cur,
			kva__slot_word(KVA_SLOT_FREE, w->gen + 1, 0),
			memory_order_release, memory_order_relaxed);
	}
	free(w->c.ids);
	free(w->c.held);
	free(w);
}

int kva_worker_slot(const struct kva_worker *w)
{
	return w ? (int)w->slot_id : -EINVAL;
}

struct kva_arena *kva_worker_arena(const struct kva_worker *w)
{
	return w ? w->arena : NULL;
}

int kva_worker_set_cache(struct kva_worker *w, uint32_t blocks)
{
	int ret;

	if (!w || blocks > KVA__CACHE_MAX)
		return kva__err(-EINVAL, "set_cache: capacity %u above %u", blocks,
				KVA__CACHE_MAX);
	if ((ret = kva__worker_check_live(w)) < 0)
		return ret;
	return kva__cache_resize(w, blocks);
}

void *kva_block_data(struct kva_worker *w, uint32_t id)
{
	struct kva_arena *a;

	if (!w || id >= w->c.blocks)
		return NULL;
	a = w->arena;
	return a->data + kva_kv_offset(&a->info.geometry, &a->info.layout, a->blocks, id, 0, 0, 0);
}

int kva_block_kv(struct kva_worker *w, uint32_t id, uint32_t layer, void **k, void **v)
{
	struct kva_arena *a;

	if (!w || id >= w->c.blocks || !k || !v)
		return -EINVAL;
	a = w->arena;
	if (layer >= a->info.geometry.layers)
		return -EINVAL;
	*k = a->data + kva_kv_offset(&a->info.geometry, &a->info.layout, a->blocks, id, layer, 0, 0);
	*v = a->data + kva_kv_offset(&a->info.geometry, &a->info.layout, a->blocks, id, layer, 1, 0);
	return 0;
}
