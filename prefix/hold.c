/* SPDX-License-Identifier: MIT */
/*
 * hold.c - the agent's holds on blocks, for the tiers (tiers/): the agent is
 * a worker of its own arena (a slot of its own), and holds a block the way
 * any worker does, with its holder bit, so that the lock-free protocol and
 * reclaim treat it like any other holder. It never sets REF or touches the
 * eviction hints: copying a block below is not a use.
 */
#include "prefix_pvt.h"

/*
 * kva__hold_published - join block @id if it is published (CACHED, or
 * SHARED|PUB without us), in the life *@epoch then says. While held, the
 * block stays in that life, its bytes and its meta (key, backing) with it.
 * acquire: pairs with the publisher's release, for the bytes and the key.
 * Let go with kva_free().
 */
bool kva__hold_published(struct kva_worker *w, uint32_t id, uint64_t *epoch)
{
	uint64_t d, nd;

	if (id >= w->arena->blocks || w->c.held[id])
		return false;
	d = atomic_load_explicit(&w->desc[id], memory_order_acquire);
	do {
		if (kva__d_kind(d) == KVA__D_CACHED)
			nd = kva__d_make(KVA__D_SHARED, kva__d_epoch(d), w->holder_bit) | KVA__D_PUB |
			     (d & KVA__D_REF);
		else if (kva__d_kind(d) == KVA__D_SHARED && (d & KVA__D_PUB) &&
			 !(d & w->holder_bit))
			nd = d | w->holder_bit;
		else
			return false;
	} while (!atomic_compare_exchange_weak_explicit(&w->desc[id], &d, nd, memory_order_acquire,
							memory_order_acquire));
	w->c.held[id] = 1;
	*epoch = kva__d_epoch(d);
	return true;
}

/*
 * kva__hold_dest - join block @id, the destination of a fetch request of
 * slot @requester, if it is what a request's block must be: SHARED, not
 * published, in life @epoch, with the requester's bit alone. Anything else
 * (the requester died and reclaim freed it, a request naming a block that
 * is not its to give) is refused: the agent writes only into a block its
 * requester holds alone, and holds it while it writes.
 */
bool kva__hold_dest(struct kva_worker *w, uint32_t id, uint32_t epoch, uint32_t requester)
{
	uint64_t d;

	if (id >= w->arena->blocks || requester >= w->arena->max_workers ||
	    requester == w->slot_id || w->c.held[id])
		return false;
	d = kva__d_make(KVA__D_SHARED, epoch, 1ull << requester);
	if (!atomic_compare_exchange_strong_explicit(&w->desc[id], &d, d | w->holder_bit,
						     memory_order_acquire, memory_order_relaxed))
		return false;
	w->c.held[id] = 1;
	return true;
}
