/* SPDX-License-Identifier: MIT */
/*
 * agentside.c - what the agent that owns an arena does to it, apart from what
 * any worker does: reserve a slot it chose, put back a slot word it knows,
 * reclaim a life it watched end, keep the words only it writes as it wrote
 * them, repair what every worker may have broken, and tell ops tools what it
 * sees.
 *
 * The agent decides from its own table (agent/), never from shared memory:
 * these functions take its knowledge as arguments and write it into the
 * arena, where any admitted worker could have written something else.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "arena_pvt.h"

/*
 * kva__slot_reserve_at - FREE -> JOINING for @pid on @slot itself (one the
 * agent's table says is free), and the slot's start time for @pid (in
 * *@start too). -EBUSY if the word is not FREE: a worker joined on its own,
 * or wrote there.
 */
int kva__slot_reserve_at(struct kva_arena *a, uint32_t slot, pid_t pid, uint32_t *gen,
			 uint64_t *start)
{
	struct kva__slot *s;
	uint64_t cur;

	if (!a || slot >= a->max_workers || pid <= 0 || a->readonly)
		return -EINVAL;
	s = &a->slots[slot];
	cur = atomic_load_explicit(&s->state, memory_order_acquire);
	/* acquire: as slot_claim() (worker.c) */
	if (kva__slot_kind(cur) != KVA_SLOT_FREE || kva__slot_pid(cur) ||
	    !atomic_compare_exchange_strong_explicit(
		    &s->state, &cur, kva__slot_word(KVA_SLOT_JOINING, kva__slot_gen(cur), pid),
		    memory_order_acquire, memory_order_relaxed))
		return -EBUSY;
	atomic_store_explicit(&s->owner_pid, pid, memory_order_relaxed);
	*start = kva__slot_start_of(pid, kva__slot_gen(cur));
	atomic_store_explicit(&s->start, *start, memory_order_relaxed);
	*gen = kva__slot_gen(cur);
	return 0;
}

/* the start word of @pid for generation @gen (0 if /proc cannot say) */
uint64_t kva__slot_start_of(pid_t pid, uint32_t gen)
{
	uint64_t st = 0;

	kva__pid_start_time(pid, &st, NULL);
	return kva__start_make(gen, st);
}

/*
 * kva__slot_restore - @slot's state word and start word back to what the
 * agent knows they are (a live worker it admitted), over whatever was
 * written there. The worker, alive, reads its own word on every slow call:
 * once it is back, it goes on.
 */
void kva__slot_restore(struct kva_arena *a, uint32_t slot, uint64_t word, uint64_t start)
{
	if (!a || slot >= a->max_workers || a->readonly)
		return;
	atomic_store_explicit(&a->slots[slot].start, start, memory_order_relaxed);
	/* release: the start word before a reader's acquire of the state */
	atomic_store_explicit(&a->slots[slot].state, word, memory_order_release);
}

/*
 * kva__reclaim_life - everything life @gen of @slot held comes back: its
 * process has exited, which the agent knows from its pidfd, so neither the
 * pid nor the start time in the slot is consulted (a worker could have
 * written a live process's pid there to keep the blocks).
 */
int kva__reclaim_life(struct kva_arena *a, uint32_t slot, uint32_t gen,
		      struct kva_reclaim_report *r)
{
	return kva__reclaim_as(a, slot, gen, true, r);
}

/* ------------------------------------------------- words only the agent writes */

void kva__agent_words_save(struct kva_arena *a, struct kva__agent_words *w)
{
	struct kva__pool *p = a->pool;

	memset(w, 0, sizeof(*w));
	memcpy(w->header, a->meta, sizeof(w->header));
	w->agent_state = atomic_load_explicit(&p->agent_state, memory_order_relaxed);
	w->agent_pid = atomic_load_explicit(&p->agent_pid, memory_order_relaxed);
	w->policy = atomic_load_explicit(&p->policy, memory_order_relaxed);
	w->cache_limit = atomic_load_explicit(&p->cache_limit, memory_order_relaxed);
	w->pub_fix = atomic_load_explicit(&p->pub_fix, memory_order_relaxed);
	w->tiers = atomic_load_explicit(&p->tiers, memory_order_relaxed);
	for (unsigned k = 0; k < KVA_OWNER_KINDS; k++)
		w->quota_kind[k] = atomic_load_explicit(&p->quota_kind[k], memory_order_relaxed);
	for (unsigned t = 0; t < KVA_MAX_TENANT_QUOTAS; t++)
		for (unsigned j = 0; j < 2; j++)
			w->quota_tenant[t][j] = atomic_load_explicit(&p->quota_tenant[t][j],
								     memory_order_relaxed);
}

/* one word: put back @want if it reads otherwise; describe the first */
#define RESTORE(field, want, name)                                                        \
	do {                                                                              \
		uint64_t got_ = atomic_load_explicit(&(field), memory_order_relaxed);    \
		if (got_ != (uint64_t)(want)) {                                           \
			atomic_store_explicit(&(field), (want), memory_order_relaxed);   \
			if (!n++)                                                          \
				snprintf(what, len, "%s was %llu, restored %llu", name,   \
					 (unsigned long long)got_,                        \
					 (unsigned long long)(uint64_t)(want));            \
		}                                                                         \
	} while (0)

/*
 * kva__agent_words_repair - every word only the agent writes, compared with
 * @w (what it last wrote) and put back where it differs. Returns how many,
 * and in @what the first in a sentence. The header is compared as it is
 * written once: whole; a reader opening the arena at the instant of the
 * repair sees a checksum that fails, and tries again.
 */
unsigned kva__agent_words_repair(struct kva_arena *a, const struct kva__agent_words *w,
				 char *what, size_t len)
{
	struct kva__pool *p = a->pool;
	unsigned n = 0;

	if (a->readonly)
		return 0;
	if (memcmp(a->meta, w->header, sizeof(w->header))) {
		for (size_t off = 0; off < sizeof(w->header); off++)
			if (a->meta[off] != w->header[off]) {
				snprintf(what, len, "the arena header (byte %zu was %#x)", off,
					 a->meta[off]);
				break;
			}
		memcpy(a->meta, w->header, sizeof(w->header));
		n++;
	}
	RESTORE(p->agent_state, w->agent_state, "agent_state");
	RESTORE(p->agent_pid, w->agent_pid, "agent_pid");
	RESTORE(p->policy, w->policy, "the eviction policy");
	RESTORE(p->cache_limit, w->cache_limit, "the cache limit");
	RESTORE(p->pub_fix, w->pub_fix, "the published count's correction");
	RESTORE(p->tiers, w->tiers, "the tiers word");
	for (unsigned k = 0; k < KVA_OWNER_KINDS; k++)
		RESTORE(p->quota_kind[k], w->quota_kind[k], "a quota");
	for (unsigned t = 0; t < KVA_MAX_TENANT_QUOTAS; t++)
		for (unsigned j = 0; j < 2; j++)
			RESTORE(p->quota_tenant[t][j], w->quota_tenant[t][j], "a tenant quota");
	return n;
}

/*
 * kva__repair_hints - every free block findable again: its l0 bit and its
 * word's l1 bit set. Setting a hint is always safe (a claimer re-checks the
 * descriptor), so no race with workers matters. Returns the bits that were
 * missing: a handful at most while frees are in flight; thousands when a
 * worker zeroed the hint words.
 */
uint32_t kva__repair_hints(struct kva_arena *a)
{
	uint32_t repaired = 0;

	if (a->readonly)
		return 0;
	for (uint32_t i = 0; i < a->l0_words; i++) {
		uint32_t base = i * 64, n = a->blocks - base < 64 ? a->blocks - base : 64;
		uint64_t free_m = 0, missing;
		bool l1_lost;

		for (uint32_t b = 0; b < n; b++)
			free_m |= (uint64_t)(kva__d_kind(atomic_load_explicit(
					&a->desc[base + b], memory_order_relaxed)) == KVA__D_FREE) << b;
		if (!free_m)
			continue;
		missing = free_m & ~atomic_load_explicit(&a->l0[i], memory_order_relaxed);
		l1_lost = !(atomic_load_explicit(&a->l1[i / 64], memory_order_relaxed) &
			    (1ull << (i % 64)));
		if (!missing && !l1_lost)
			continue;
		/* without its l1 bit, none of the word's free blocks is found */
		repaired += (uint32_t)__builtin_popcountll(l1_lost ? free_m : missing);
		kva__hint_set(a, i, missing);
	}
	return repaired;
}

/* ------------------------------------------------------------- the view */

void kva__view_set_slot(struct kva_arena *a, uint32_t slot, uint32_t state, uint32_t gen,
			int32_t pid, uint32_t uid, uint32_t pending_ms)
{
	if (a->readonly || slot >= a->max_workers)
		return;
	atomic_store_explicit(&a->pool->view.slot[slot][0], kva__view_slot_word(state, gen, pid),
			      memory_order_relaxed);
	atomic_store_explicit(&a->pool->view.slot[slot][1], (uint64_t)uid << 32 | pending_ms,
			      memory_order_relaxed);
}

void kva__view_set(struct kva_arena *a, uint64_t repairs, const char *last_repair,
		   uint32_t pending)
{
	char buf[128] = { 0 };

	if (a->readonly)
		return;
	snprintf(buf, sizeof(buf), "%s", last_repair ? last_repair : "");
	atomic_store_explicit(&a->pool->view.repairs, repairs, memory_order_relaxed);
	for (unsigned i = 0; i < 16; i++) {
		uint64_t v;

		memcpy(&v, buf + 8 * i, 8);
		atomic_store_explicit(&a->pool->view.last_repair[i], v, memory_order_relaxed);
	}
	atomic_store_explicit(&a->pool->view.pending, pending, memory_order_relaxed);
}

void kva__view_set_device(struct kva_arena *a, uint64_t free_bytes, uint64_t total_bytes)
{
	if (a->readonly)
		return;
	atomic_store_explicit(&a->pool->view.dev_free, free_bytes, memory_order_relaxed);
	atomic_store_explicit(&a->pool->view.dev_total, total_bytes, memory_order_relaxed);
}

int kva_arena_agent_report(const struct kva_arena *a, struct kva_agent_report *r)
{
	char buf[128];

	if (!a || !r)
		return -EINVAL;
	memset(r, 0, sizeof(*r));
	r->repairs = atomic_load_explicit(&a->pool->view.repairs, memory_order_relaxed);
	for (unsigned i = 0; i < 16; i++) {
		uint64_t v = atomic_load_explicit(&a->pool->view.last_repair[i], memory_order_relaxed);

		memcpy(buf + 8 * i, &v, 8);
	}
	buf[sizeof(buf) - 1] = '\0';
	memcpy(r->last_repair, buf, sizeof(r->last_repair));
	r->reclaims_pending = (uint32_t)atomic_load_explicit(&a->pool->view.pending,
							     memory_order_relaxed);
	r->max_workers = a->max_workers;
	r->device_free_bytes = atomic_load_explicit(&a->pool->view.dev_free, memory_order_relaxed);
	r->device_total_bytes = atomic_load_explicit(&a->pool->view.dev_total,
						     memory_order_relaxed);
	for (uint32_t s = 0; s < a->max_workers; s++) {
		uint64_t w0 = atomic_load_explicit(&a->pool->view.slot[s][0], memory_order_relaxed);
		uint64_t w1 = atomic_load_explicit(&a->pool->view.slot[s][1], memory_order_relaxed);
		uint32_t st = (uint32_t)(w0 >> 56);

		/* never trust a word from shared memory to be in range */
		r->slots[s].state = st <= KVA_AGENT_SLOT_AGENT ? st : KVA_AGENT_SLOT_FREE;
		r->slots[s].generation = (uint32_t)(w0 >> 32) & KVA__S_GEN_MASK;
		r->slots[s].pid = (int32_t)(uint32_t)w0;
		r->slots[s].uid = (uint32_t)(w1 >> 32);
		r->slots[s].pending_ms = (uint32_t)w1;
	}
	return 0;
}
