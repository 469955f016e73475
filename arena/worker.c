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

/*
 * kva__name_copy - @name into @out (@size bytes, zero-padded), cut at a
 * character: if the first byte that does not fit continues a UTF-8
 * character, the cut goes back to before that character.
 */
void kva__name_copy(char *out, size_t size, const char *name)
{
	size_t n = strnlen(name, size - 1);

	memset(out, 0, size);
	memcpy(out, name, n);
	while (name[n] && n > 0 && ((unsigned char)name[n] & 0xc0) == 0x80)
		out[--n] = '\0';
}

static void slot_set_name(struct kva__slot *s, const char *name)
{
	char buf[sizeof(s->name)];

	kva__name_copy(buf, sizeof(buf), name);
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

/* the start time of @pid, tagged for generation @gen of slot @s */
static void slot_set_start(struct kva__slot *s, uint32_t gen, pid_t pid)
{
	uint64_t start_time = 0;

	kva__pid_start_time(pid, &start_time, NULL);
	atomic_store_explicit(&s->start, kva__start_make(gen, start_time), memory_order_relaxed);
}

/*
 * slot_claim - FREE -> JOINING for @pid, one CAS, on the first free slot:
 * from then on a process killed at any instruction leaves a slot that names
 * it, which a reclaimer can find. acquire: the previous holder's release of
 * the slot happens before. The other fields of the slot's first line are
 * written after the claim, before LIVE is published (worker_make); until the
 * start time is, it is the last holder's, tagged with the last generation,
 * and readers know it for no start time at all (kva__start_for).
 */
static int slot_claim(struct kva_arena *a, pid_t pid, uint32_t *slot, uint32_t *gen)
{
	for (uint32_t id = 0; id < a->max_workers; id++) {
		struct kva__slot *s = &a->slots[id];
		uint64_t cur = atomic_load_explicit(&s->state, memory_order_acquire);

		if (kva__slot_kind(cur) != KVA_SLOT_FREE ||
		    !atomic_compare_exchange_strong_explicit(
			    &s->state, &cur,
			    kva__slot_word(KVA_SLOT_JOINING, kva__slot_gen(cur), pid),
			    memory_order_acquire, memory_order_relaxed))
			continue;
		KVA__CRASH_POINT(KVA__CP_JOIN_CLAIMED);
		atomic_store_explicit(&s->owner_pid, pid, memory_order_relaxed);
		slot_set_start(s, kva__slot_gen(cur), pid);
		*slot = id;
		*gen = kva__slot_gen(cur);
		return 0;
	}
	return kva__err(-EUSERS, "join: all %u worker slots are taken", a->max_workers);
}

/*
 * worker_make - the private half of a worker for slot @id, generation @gen
 * (JOINING, ours): memory, then the slot's name and counters, then LIVE.
 */
static int worker_make(struct kva_arena *a, uint32_t id, uint32_t gen, const char *name,
		       bool adopted, struct kva_worker **out)
{
	struct kva__slot *s = &a->slots[id];
	struct kva_worker *w = calloc(1, sizeof(*w));
	int ret = -ENOMEM;

	if (!w)
		return -ENOMEM;
	w->c.held = calloc(a->blocks, sizeof(*w->c.held));
	if (!w->c.held)
		goto fail;
	w->arena = a;
	w->pool = a->pool;
	w->desc = a->desc;
	w->l0 = a->l0;
	w->snap_word = UINT32_MAX;
	w->doorbell = -1;
	w->c.blocks = a->blocks;
	if ((ret = kva__cache_resize(w, a->hdr.cache_blocks)) < 0)
		goto fail;

	slot_set_name(s, name ? name : "worker");
	atomic_store_explicit(&s->cached, 0, memory_order_relaxed);
	atomic_store_explicit(&s->shares, 0, memory_order_relaxed);
	atomic_store_explicit(&s->refills, 0, memory_order_relaxed);
	atomic_store_explicit(&s->flushes, 0, memory_order_relaxed);
	w->slot = s;
	w->slot_id = id;
	w->gen = gen;
	w->owner_payload = kva__owner_tag(id, gen);
	w->holder_bit = 1ull << id;
	w->slot_word = kva__slot_word(KVA_SLOT_LIVE, gen, getpid());
	/* start claiming far from the other slots: slot * golden ratio, mod 1,
	 * spreads any number of them evenly around the arena */
	w->cursor = (uint32_t)(((uint64_t)a->blocks * (uint32_t)(id * 0x9e3779b9u)) >> 32);
	/* JOINING -> LIVE. release: the fields above are visible to whoever
	 * sees LIVE. A CAS, not a store: a reserved slot may have been taken
	 * back by its reserver meanwhile (kva_arena_release_slot). */
	{
		uint64_t joining = kva__slot_word(KVA_SLOT_JOINING, gen, getpid());

		if (!atomic_compare_exchange_strong_explicit(&s->state, &joining, w->slot_word,
							     memory_order_release,
							     memory_order_relaxed)) {
			ret = kva__err(-ESTALE, "join: slot %u was taken back before it was "
				       "adopted", id);
			goto fail;
		}
	}
	/* The reserver (the agent) wrote our start time as /proc showed it;
	 * ours now, from our own /proc entry, which every process can read. A
	 * store after LIVE: the slot is ours, nobody else writes it. */
	if (adopted)
		slot_set_start(s, gen, getpid());
	*out = w;
	return 0;
fail:
	free(w->c.ids);
	free(w->c.held);
	free(w);
	return ret;
}

int kva_worker_join(struct kva_arena *a, const char *name, struct kva_worker **out)
{
	uint32_t id, gen;
	int ret;

	if (!a || !out)
		return kva__err(-EINVAL, "kva_worker_join: NULL argument");
	kva__err_clear();
	if (a->readonly)
		return kva__err(-EROFS, "join: this mapping of the arena is read-only");
	if ((ret = slot_claim(a, getpid(), &id, &gen)) < 0)
		return ret;
	ret = worker_make(a, id, gen, name, false, out);
	if (ret < 0) { /* give the slot back: we hold nothing in it */
		kva__err_hold(true); /* what failed is the message, not this */
		kva_arena_release_slot(a, id, gen);
		kva__err_hold(false);
	}
	return ret;
}

int kva_arena_reserve_slot(struct kva_arena *a, pid_t pid, uint32_t *slot, uint32_t *gen)
{
	if (!a || pid <= 0 || !slot || !gen)
		return kva__err(-EINVAL, "reserve_slot: bad argument");
	if (a->readonly)
		return kva__err(-EROFS, "reserve_slot: this mapping of the arena is read-only");
	return slot_claim(a, pid, slot, gen);
}

int kva_arena_release_slot(struct kva_arena *a, uint32_t slot, uint32_t gen)
{
	struct kva__slot *s;
	uint64_t cur;

	if (!a || slot >= a->max_workers)
		return kva__err(-EINVAL, "release_slot: no slot %u", slot);
	if (a->readonly)
		return kva__err(-EROFS, "release_slot: this mapping of the arena is read-only");
	s = &a->slots[slot];
	cur = atomic_load_explicit(&s->state, memory_order_acquire);
	/* only a slot nobody adopted: a JOINING slot holds no block */
	if (kva__slot_kind(cur) != KVA_SLOT_JOINING || kva__slot_gen(cur) != (gen & KVA__S_GEN_MASK))
		return kva__err(-EBUSY, "release_slot: slot %u is not a reservation of "
				"generation %u", slot, gen);
	if (!atomic_compare_exchange_strong_explicit(&s->state, &cur,
						     kva__slot_word(KVA_SLOT_FREE, gen + 1, 0),
						     memory_order_release, memory_order_relaxed))
		return kva__err(-EBUSY, "release_slot: slot %u was adopted meanwhile", slot);
	return 0;
}

int kva_worker_adopt(struct kva_arena *a, uint32_t slot, uint32_t gen, const char *name,
		     struct kva_worker **out)
{
	uint64_t cur;

	if (!a || !out || slot >= a->max_workers)
		return kva__err(-EINVAL, "adopt: no slot %u", slot);
	kva__err_clear();
	if (a->readonly)
		return kva__err(-EROFS, "adopt: this mapping of the arena is read-only");
	cur = atomic_load_explicit(&a->slots[slot].state, memory_order_acquire);
	if (cur != kva__slot_word(KVA_SLOT_JOINING, gen, getpid()))
		return kva__err(-ESTALE, "adopt: slot %u is not reserved for this process "
				"(generation %u)", slot, gen);
	return worker_make(a, slot, gen, name, true, out);
}

/*
 * kva__slot_retire_counters - a slot's sequence counters go to the pool's
 * totals and its usage to zero, by whoever takes the slot back (its leaving
 * worker, or a reclaimer once it is dead), before the slot is FREE.
 */
void kva__slot_retire_counters(struct kva_arena *a, struct kva__slot *s)
{
	for (unsigned i = 0; i < KVA__SC_N; i++) {
		uint64_t v = atomic_exchange_explicit(&s->sc[i], 0, memory_order_relaxed);

		if (v)
			atomic_fetch_add_explicit(&a->pool->gone[i], v, memory_order_relaxed);
	}
	for (unsigned k = 0; k < KVA_OWNER_KINDS; k++)
		atomic_store_explicit(&s->kind_blocks[k], 0, memory_order_relaxed);
	for (unsigned t = 0; t < KVA_MAX_TENANT_QUOTAS; t++)
		atomic_store_explicit(&s->tenant_blocks[t], 0, memory_order_relaxed);
	atomic_store_explicit(&s->open_seqs, 0, memory_order_relaxed);
	atomic_store_explicit(&s->inserting, 0, memory_order_relaxed);
}

void kva_worker_leave(struct kva_worker *w)
{
	uint64_t cur;

	if (!w)
		return;
	if (kva__worker_check_live(w) == 0) {
		kva__worker_release_all(w);
		kva__slot_retire_counters(w->arena, w->slot);
		/* The slot is free for a new worker with the next generation: no
		 * tag of ours can be taken for its. release: our last descriptor
		 * writes come before the next joiner's acquire of the slot. */
		cur = w->slot_word;
		atomic_compare_exchange_strong_explicit(
			&w->slot->state, &cur,
			kva__slot_word(KVA_SLOT_FREE, w->gen + 1, 0),
			memory_order_release, memory_order_relaxed);
	}
	if (w->on_leave) /* kva_attach's: the agent connection, the mapping */
		w->on_leave(w, w->on_leave_ctx);
	free(w->c.ids);
	free(w->c.held);
	free(w->ranks);
	free(w->fetcher);
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
