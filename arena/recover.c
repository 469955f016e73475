/* SPDX-License-Identifier: MIT */
/*
 * recover.c - taking back what a dead worker held, and checking the arena.
 *
 * Reclaim runs while the other workers go on. One reclaimer at a time per
 * slot: it holds the slot's reclaim lease (a robust mutex, only ever
 * try-locked: struct kva__slot) from before it decides the holder is dead
 * until the slot is FREE again, so no second reclaimer, not even a thread of
 * the same process, can finish first and let a new worker into the slot
 * while the first still sweeps. If the reclaimer dies, the lease says so
 * (EOWNERDEAD) and the next one finishes the job: every step below can be
 * done twice.
 *
 * It owns the dead slot's OWNED descriptors outright (their owner is gone and
 * the slot is RECLAIMING, so no new owner of that slot can appear), and still
 * frees each by CAS, and only if it still names the dead slot and its
 * generation. It changes SHARED words by CAS like any holder. It reads every
 * index from shared memory as untrusted.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "arena_pvt.h"

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * lease_take - the right to reclaim @slot, or -EBUSY if a live thread (of any
 * process, this one included) has it. A lease whose holder died comes with
 * that holder's unfinished reclaim, which the caller completes.
 */
static int lease_take(struct kva__slot *s, uint32_t slot)
{
	int ret = pthread_mutex_trylock(&s->reclaim);

	if (ret == EOWNERDEAD) { /* its reclaimer died: ours now, with its work */
		pthread_mutex_consistent(&s->reclaim);
		ret = 0;
	}
	if (ret == EBUSY)
		return kva__err(-EBUSY, "reclaim: slot %u is being reclaimed by another thread "
				"or process", slot);
	if (ret)
		return kva__err(-ret, "reclaim: the reclaim lease of slot %u is unusable: %s",
				slot, strerror(ret));
	return 0;
}

/*
 * take_slot - with the lease held: move @slot to RECLAIMING (generation
 * bumped) on behalf of this process, if its holder is gone. A slot already
 * RECLAIMING is a dead reclaimer's, whose lease we hold now.
 *
 * With @vouched, the caller (the agent) watched the process of life @gen
 * exit (a pidfd): nothing about the holder is read from shared memory. The
 * life is taken if the word still shows it (JOINING or LIVE at @gen, or
 * RECLAIMING at @gen + 1), or shows it overwritten to FREE at @gen (a real
 * end of a life leaves the next generation); any other word means the life
 * ended and the slot moved on: -ESRCH, and the caller sweeps its stray tags.
 */
static int take_slot(struct kva_arena *a, uint32_t slot, bool vouched, uint32_t vgen,
		     uint64_t *word)
{
	struct kva__slot *s = &a->slots[slot];
	pid_t self = getpid();

	for (;;) {
		uint64_t cur = atomic_load_explicit(&s->state, memory_order_acquire), next;
		int32_t pid = kva__slot_pid(cur);
		uint32_t gen = kva__slot_gen(cur), kind = kva__slot_kind(cur);

		if (vouched) {
			vgen &= KVA__S_GEN_MASK;
			if (kind == KVA_SLOT_RECLAIMING && gen == ((vgen + 1) & KVA__S_GEN_MASK))
				next = kva__slot_word(KVA_SLOT_RECLAIMING, gen, self);
			else if (gen == vgen && (kind != KVA_SLOT_FREE || !pid))
				next = kva__slot_word(KVA_SLOT_RECLAIMING, gen + 1, self);
			else
				return -ESRCH;
		} else {
			switch (kind) {
			case KVA_SLOT_FREE:
				return kva__err(-ENOENT, "reclaim: slot %u is not in use", slot);
			case KVA_SLOT_RECLAIMING:
				/* generation already bumped by the reclaimer that began */
				next = kva__slot_word(KVA_SLOT_RECLAIMING, gen, self);
				break;
			default:
				if (!kva__slot_holder_gone(cur, atomic_load_explicit(
									&s->start, memory_order_relaxed)))
					return kva__err(-EBUSY, "reclaim: slot %u belongs to process "
							"%d, which is alive", slot, pid);
				/* from here on, tags of generation gen are stale */
				next = kva__slot_word(KVA_SLOT_RECLAIMING, gen + 1, self);
				break;
			}
		}
		/* A failed CAS: the slot moved (a reservation given back, a
		 * joiner's claim): look again. */
		if (atomic_compare_exchange_strong_explicit(&s->state, &cur, next,
							    memory_order_acq_rel,
							    memory_order_relaxed)) {
			/* The state word named the holder from its first instant;
			 * owner_pid may be older if it died right after claiming.
			 * Keep the holder's pid there for the report and ops tools. */
			if (kind != KVA_SLOT_RECLAIMING && !vouched)
				atomic_store_explicit(&s->owner_pid, pid, memory_order_relaxed);
			*word = next;
			return 0;
		}
	}
}

/*
 * Remove @slot's holder bit from a shared block; true if the block became
 * free. The last holder of a published block leaves it CACHED instead.
 */
static bool drop_dead_holder(struct kva_arena *a, uint32_t id, uint64_t bit, uint64_t d,
			     struct kva_reclaim_report *r)
{
	uint64_t nd, rest;

	do {
		if (kva__d_kind(d) != KVA__D_SHARED || !(kva__d_payload(d) & bit))
			return false;
		rest = kva__d_payload(d) & ~bit;
		/* release: the block becomes free for a claimer (acquire) */
		if (rest)
			nd = (d & ~KVA__D_PAYLOAD_MASK) | rest;
		else if (d & KVA__D_PUB)
			nd = kva__d_make(KVA__D_CACHED, kva__d_epoch(d), 0) | (d & KVA__D_REF);
		else
			nd = kva__d_next_free(d);
	} while (!atomic_compare_exchange_weak_explicit(&a->desc[id], &d, nd, memory_order_acq_rel,
							memory_order_relaxed));
	if (!rest && kva__d_kind(nd) == KVA__D_CACHED)
		r->shared_cached++;
	return kva__d_kind(nd) == KVA__D_FREE;
}

/*
 * sweep - one pass over the descriptors: free the blocks of the dead slot's
 * generation @gen, drop its references, and set the hint bit of every free
 * block that lacks it (a worker killed between freeing a descriptor and
 * setting its bit).
 *
 * Per word of 64 blocks, three masks are computed without a branch per block
 * (a random arena would mispredict most of them), then only the set bits
 * are visited.
 */
static void sweep(struct kva_arena *a, uint32_t slot, uint32_t gen, bool holders,
		  struct kva_reclaim_report *r)
{
	/* everything but the epoch: kind, flags, and the tag (slot, gen) */
	const uint64_t tag_mask = ~(KVA__D_EPOCH_MASK << KVA__D_EPOCH_SHIFT);
	const uint64_t tag_ours = kva__d_make(KVA__D_OWNED, 0, kva__owner_tag(slot, gen));
	/* holder bits carry no generation: dropped only while the slot is ours */
	const uint64_t holder = holders ? 1ull << slot : 0;

	for (uint32_t i = 0; i < a->l0_words; i++) {
		uint32_t base = i * 64, n = a->blocks - base < 64 ? a->blocks - base : 64;
		uint64_t free_m = 0, mine = 0, held = 0, freed = 0, missing;

		for (uint32_t b = 0; b < n; b++) {
			uint64_t d = atomic_load_explicit(&a->desc[base + b], memory_order_relaxed);

			free_m |= (uint64_t)(d >> KVA__D_KIND_SHIFT == KVA__D_FREE) << b;
			mine |= (uint64_t)((d & tag_mask) == tag_ours) << b;
			held |= (uint64_t)(d >> KVA__D_KIND_SHIFT == KVA__D_SHARED && (d & holder) != 0) << b;
		}
		for (; mine; mine &= mine - 1) {
			uint32_t id = base + (uint32_t)__builtin_ctzll(mine);
			uint64_t d = atomic_load_explicit(&a->desc[id], memory_order_relaxed);

			/* The dead generation's alone: nobody else may write it,
			 * and still a CAS, so that a word that is no longer this
			 * life's (whoever changed it) is never freed. release:
			 * pairs with the next claimer's acquire CAS. */
			if ((d & tag_mask) != tag_ours ||
			    !atomic_compare_exchange_strong_explicit(&a->desc[id], &d,
								     kva__d_next_free(d),
								     memory_order_release,
								     memory_order_relaxed))
				continue;
			freed |= mine & -mine;
			r->owned_freed++;
		}
		for (; held; held &= held - 1) {
			uint32_t id = base + (uint32_t)__builtin_ctzll(held);

			r->shared_dropped++;
			if (drop_dead_holder(a, id, holder,
					     atomic_load_explicit(&a->desc[id], memory_order_relaxed), r)) {
				freed |= held & -held;
				r->shared_freed++;
			}
		}
		if (i == a->l0_words / 2)
			KVA__CRASH_POINT(KVA__CP_RECLAIM_SWEEP);
		free_m |= freed;
		missing = free_m & ~atomic_load_explicit(&a->l0[i], memory_order_relaxed);
		r->hints_repaired += (uint32_t)__builtin_popcountll(missing & ~freed);
		if (missing)
			kva__hint_set(a, i, missing);
		else if (free_m &&
			 !(atomic_load_explicit(&a->l1[i / 64], memory_order_relaxed) &
			   (1ull << (i % 64))))
			kva__hint_set(a, i, 0); /* l0 bits without their l1 bit */
	}
}

/*
 * kva__reclaim_as - kva_arena_reclaim(), or with @vouched the agent's reclaim
 * of life @gen of @slot, whose process it watched exit. A vouched life that
 * already ended (the slot moved on) leaves at most blocks still tagged with
 * it, which are swept (its references are not: holder bits carry no
 * generation, and may be the next life's); -ENOENT if there were none.
 */
int kva__reclaim_as(struct kva_arena *a, uint32_t slot, uint32_t gen, bool vouched,
		    struct kva_reclaim_report *r)
{
	struct kva_reclaim_report local;
	struct kva__slot *s;
	uint64_t word = 0, t0 = now_ns(), cur;
	uint32_t dead_gen;
	int ret;

	if (!r)
		r = &local;
	memset(r, 0, sizeof(*r));
	if (!a || slot >= a->max_workers)
		return kva__err(-EINVAL, "reclaim: no slot %u", slot);
	kva__err_clear();
	if (a->readonly)
		return kva__err(-EROFS, "reclaim: this mapping of the arena is read-only");
	s = &a->slots[slot];
	r->slot = slot;
	if ((ret = lease_take(s, slot)) < 0)
		return ret;
	KVA__CRASH_POINT(KVA__CP_RECLAIM_LEASED);
	ret = take_slot(a, slot, vouched, gen, &word);
	if (ret == -ESRCH) { /* vouched, and the life is over: its stray tags */
		sweep(a, slot, gen & KVA__S_GEN_MASK, false, r);
		ret = r->owned_freed ? 0 : kva__err(-ENOENT, "reclaim: life %u of slot %u is over",
						    gen, slot);
		r->elapsed_ns = now_ns() - t0;
		goto out;
	}
	if (ret < 0)
		goto out;
	if (!vouched)
		r->pid = (int32_t)atomic_load_explicit(&s->owner_pid, memory_order_relaxed);
	kva__slot_name(s, r->name);
	dead_gen = (kva__slot_gen(word) - 1) & KVA__S_GEN_MASK;

	/* Its publication or eviction in flight, settled from the block's
	 * descriptor before the sweep changes it. One store: done twice (a
	 * reclaimer that takes over) it finds nothing in flight. */
	atomic_store_explicit(&a->pool->pub[slot],
			      kva__pub_word(kva__pub_settled(a, slot, dead_gen,
							     atomic_load_explicit(&a->pool->pub[slot],
										  memory_order_relaxed)),
					    0),
			      memory_order_relaxed);
	sweep(a, slot, dead_gen, true, r);
	/* died inside an index insert: its BUSY entries become tombstones */
	if (atomic_load_explicit(&s->inserting, memory_order_relaxed))
		kva__index_reclaim_busy(a, slot);
	kva__slot_retire_counters(a, s);

	atomic_store_explicit(&s->cached, 0, memory_order_relaxed);
	/* release: the sweep's writes come before the next joiner's acquire.
	 * A CAS from our own word: nobody else moves a slot we lease. */
	cur = word;
	atomic_compare_exchange_strong_explicit(&s->state, &cur,
						kva__slot_word(KVA_SLOT_FREE, kva__slot_gen(word), 0),
						memory_order_release, memory_order_relaxed);
	r->elapsed_ns = now_ns() - t0;
out:
	pthread_mutex_unlock(&s->reclaim);
	return ret;
}

int kva_arena_reclaim(struct kva_arena *a, uint32_t slot, struct kva_reclaim_report *r)
{
	return kva__reclaim_as(a, slot, 0, false, r);
}

/* What a slot table snapshot says, for kva_arena_check(). */
struct slots_view {
	uint64_t joined;             /* bit per slot that may hold blocks */
	uint64_t reclaiming;         /* bit per slot whose blocks a reclaimer is freeing */
	uint64_t all;                /* bit per slot that exists */
	uint32_t gen[KVA_MAX_WORKERS];
	uint32_t kind[KVA_MAX_WORKERS];
};

static void view_slot(struct kva_arena *a, struct slots_view *v, uint32_t s)
{
	uint64_t st = atomic_load_explicit(&a->slots[s].state, memory_order_acquire);

	v->gen[s] = kva__slot_gen(st);
	v->kind[s] = kva__slot_kind(st);
	v->joined &= ~(1ull << s);
	v->reclaiming &= ~(1ull << s);
	if (kva__slot_joined(st))
		v->joined |= 1ull << s;
	else if (v->kind[s] == KVA_SLOT_RECLAIMING)
		v->reclaiming |= 1ull << s;
}

static const char *const slot_kind_name[] = { "free", "joining", "live", "being reclaimed" };

/* the first problem, in one line (the report's first_problem) */
void kva__check_problem(struct kva_check_report *r, int64_t block, const char *fmt, ...)
{
	va_list ap;

	if (r->first_problem[0])
		return;
	va_start(ap, fmt);
	vsnprintf(r->first_problem, sizeof(r->first_problem), fmt, ap);
	va_end(ap);
	if (block >= 0 && r->first_bad_block < 0)
		r->first_bad_block = block;
}

/* check_one - account one descriptor in @r; false if it breaks the invariant. */
static bool check_one(struct kva_arena *a, uint32_t id, uint64_t d, const struct slots_view *v,
		      struct kva_check_report *r)
{
	uint64_t p = kva__d_payload(d), flags = d & KVA__D_FLAGS_MASK;

	/* flags: PUB and REF on shared blocks, REF on cached ones, else none */
	if ((flags && kva__d_kind(d) != KVA__D_SHARED && kva__d_kind(d) != KVA__D_CACHED) ||
	    (kva__d_kind(d) == KVA__D_CACHED && (flags & KVA__D_PUB)) ||
	    (kva__d_kind(d) == KVA__D_SHARED && (flags & KVA__D_REF) && !(flags & KVA__D_PUB))) {
		r->bad_descriptors++;
		kva__check_problem(r, id, "block %u: descriptor %#llx has flags no state has", id,
			(unsigned long long)d);
		return false;
	}
	switch (kva__d_kind(d)) {
	case KVA__D_FREE: {
		uint32_t i = id / 64;

		r->free_blocks++;
		if (p) {
			r->bad_descriptors++;
			kva__check_problem(r, id, "block %u: free, with a payload (%#llx)", id,
				(unsigned long long)p);
			return false;
		}
		/* findable: its l0 bit, and its l0 word's l1 bit */
		if (!(atomic_load_explicit(&a->l0[i], memory_order_relaxed) & (1ull << (id % 64))) ||
		    !(atomic_load_explicit(&a->l1[i / 64], memory_order_relaxed) &
		      (1ull << (i % 64)))) {
			r->hints_missing++;
			kva__check_problem(r, id, "block %u: free, but its hint bits are clear: allocators "
				"cannot find it", id);
			return false;
		}
		return true;
	}
	case KVA__D_OWNED: {
		uint32_t s = kva__tag_slot(p);

		r->owned_blocks++;
		if ((p >> 32) || s >= a->max_workers) {
			r->bad_descriptors++;
			kva__check_problem(r, id, "block %u: owned by slot %u, which does not exist", id, s);
			return false;
		}
		/* a slot being reclaimed: its dead generation's blocks are the
		 * reclaimer's to free, accounted */
		if ((v->reclaiming & (1ull << s)) &&
		    kva__tag_gen(p) == ((v->gen[s] - 1) & KVA__S_GEN_MASK))
			return true;
		if (!(v->joined & (1ull << s)) || kva__tag_gen(p) != v->gen[s]) {
			r->stale_owners++;
			kva__check_problem(r, id, "block %u: owned by slot %u generation %u, but slot %u is "
				"%s at generation %u", id, s, kva__tag_gen(p), s,
				slot_kind_name[v->kind[s]], v->gen[s]);
			return false;
		}
		return true;
	}
	case KVA__D_SHARED:
		r->shared_blocks++;
		r->shared_refs += (uint32_t)__builtin_popcountll(p);
		r->published_blocks += !!(d & KVA__D_PUB);
		if (!p || (p & ~v->all)) {
			r->bad_descriptors++;
			kva__check_problem(r, id, "block %u: shared by %s", id,
				p ? "slots that do not exist" : "no slot");
			return false;
		}
		if (p & ~(v->joined | v->reclaiming)) {
			uint64_t dead = p & ~(v->joined | v->reclaiming);
			uint32_t s = (uint32_t)__builtin_ctzll(dead);

			r->dead_holders += (uint32_t)__builtin_popcountll(dead);
			kva__check_problem(r, id, "block %u: held by slot %u, which is %s (generation %u)", id,
				s, slot_kind_name[v->kind[s]], v->gen[s]);
			return false;
		}
		return true;
	case KVA__D_CACHED:
		r->cached_blocks++;
		r->published_blocks++;
		if (p) {
			r->bad_descriptors++;
			kva__check_problem(r, id, "block %u: cached, with a payload (%#llx)", id,
				(unsigned long long)p);
			return false;
		}
		return true;
	default:
		r->bad_descriptors++;
		return false;
	}
}

/* the slots descriptor @d names, looked at again */
static void view_named(struct kva_arena *a, struct slots_view *v, uint64_t d)
{
	uint64_t p = kva__d_payload(d);

	if (kva__d_kind(d) == KVA__D_OWNED && kva__tag_slot(p) < a->max_workers)
		view_slot(a, v, kva__tag_slot(p));
	else if (kva__d_kind(d) == KVA__D_SHARED)
		for (p &= v->all; p; p &= p - 1)
			view_slot(a, v, (uint32_t)__builtin_ctzll(p));
}

static void report_add(struct kva_check_report *r, const struct kva_check_report *x)
{
	r->free_blocks += x->free_blocks;
	r->owned_blocks += x->owned_blocks;
	r->shared_blocks += x->shared_blocks;
	r->shared_refs += x->shared_refs;
	r->cached_blocks += x->cached_blocks;
	r->published_blocks += x->published_blocks;
	r->bad_descriptors += x->bad_descriptors;
	r->stale_owners += x->stale_owners;
	r->dead_holders += x->dead_holders;
	r->hints_missing += x->hints_missing;
	if (x->first_problem[0])
		kva__check_problem(r, x->first_bad_block, "%s", x->first_problem);
}

/*
 * check_block - check_one() of block @id, whose descriptor was *@d. On an
 * arena in use the slot table snapshot ages while the scan runs (a worker
 * leaves and a newcomer takes its slot, a reclaim ends): what looks like a
 * breach is looked at again, descriptor and slots re-read, and counted only
 * if it stays. A real breach does not go away by itself.
 */
static void check_block(struct kva_arena *a, uint32_t id, uint64_t *d, struct slots_view *v,
			struct kva_check_report *r)
{
	struct kva_check_report x;

	for (int look = 0;; look++) {
		memset(&x, 0, sizeof(x));
		x.first_bad_block = -1;
		if (check_one(a, id, *d, v, &x) || look == 2)
			break;
		view_named(a, v, *d);
		*d = atomic_load_explicit(&a->desc[id], memory_order_acquire);
		view_named(a, v, *d);
	}
	report_add(r, &x);
}

int kva_arena_check(struct kva_arena *a, struct kva_check_report *r)
{
	struct kva_check_report local;
	struct slots_view v = { 0 };
	uint32_t count;

	if (!r)
		r = &local;
	memset(r, 0, sizeof(*r));
	r->first_bad_block = -1;
	if (!a)
		return -EINVAL;
	v.all = (1ull << a->max_workers) - 1; /* max_workers <= 48 */
	count = (uint32_t)atomic_load_explicit(&a->pool->pub_fix, memory_order_relaxed);
	for (uint32_t s = 0; s < a->max_workers; s++) {
		uint64_t st = atomic_load_explicit(&a->slots[s].state, memory_order_acquire);
		uint64_t pw = atomic_load_explicit(&a->pool->pub[s], memory_order_relaxed);

		view_slot(a, &v, s);
		/* the slot's share of the published count; a live worker's (or a
		 * dead one's) operation in flight settled as reclaim would: the
		 * generation of its blocks is the state's, or the one before it
		 * once the slot is being reclaimed or free */
		count += kva__pub_settled(a, s,
					  kva__slot_joined(st) ? kva__slot_gen(st)
							       : (kva__slot_gen(st) - 1) & KVA__S_GEN_MASK,
					  pw);
		if (kva__slot_joined(st) &&
		    kva__slot_holder_gone(st, atomic_load_explicit(&a->slots[s].start,
								   memory_order_relaxed)))
			r->dead_slots++;
	}
	for (uint32_t id = 0; id < a->blocks; id++) {
		uint64_t d = atomic_load_explicit(&a->desc[id], memory_order_relaxed);

		check_block(a, id, &d, &v, r);
		if (kva__d_kind(d) == KVA__D_CACHED ||
		    (kva__d_kind(d) == KVA__D_SHARED && (d & KVA__D_PUB)))
			kva__prefix_check_block(a, id, d, r);
	}
	kva__prefix_check_index(a, r);
	r->published_count = count;
	if (r->published_count != r->published_blocks) {
		r->published_bad = 1;
		kva__check_problem(r, -1, "the published count (the cache limit's) is %llu, but %u blocks "
			"are published", (unsigned long long)r->published_count,
			r->published_blocks);
	}
	if (r->bad_descriptors || r->stale_owners || r->dead_holders || r->hints_missing ||
	    r->index_bad || r->published_bad)
		return kva__err(-EUCLEAN, "check: %u bad descriptors, %u stale owners, %u dead "
				"holders, %u unfindable free blocks, %u bad index entries, "
				"published count %s; first: %s",
				r->bad_descriptors, r->stale_owners, r->dead_holders,
				r->hints_missing, r->index_bad, r->published_bad ? "wrong" : "right",
				r->first_problem);
	return 0;
}
