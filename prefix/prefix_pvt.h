/* SPDX-License-Identifier: MIT */
/*
 * prefix_pvt.h - the prefix room: the index (index.c), eviction (evict.c),
 * sequences (seq.c), and what ops tools and the check read of them (stats.c,
 * check.c). The shared-memory layouts they work on (index entries, block
 * meta, the published count) are in arena/arena_pvt.h with the rest of the
 * metadata region.
 *
 * Dependencies run one way: seq.c -> evict.c -> index.c -> the core. The
 * core calls back only through the few functions arena_pvt.h declares.
 */
#ifndef KVA_PREFIX_PVT_H
#define KVA_PREFIX_PVT_H

#include "arena_pvt.h"

/* index.c */
struct kva__found {
	uint64_t pos;     /* entry index */
	uint64_t ctrl;    /* its VALID word */
};
bool kva__index_lookup(struct kva_arena *a, const uint64_t key[2], struct kva__found *f,
		       uint64_t *stale);
int kva__index_insert(struct kva_worker *w, const uint64_t key[2], uint32_t block,
		      uint64_t epoch, uint64_t info, uint64_t *pos, uint32_t *uses);
bool kva__index_remove(struct kva_arena *a, uint64_t pos, uint32_t block, uint64_t epoch,
		       uint32_t uses, uint64_t evseq);
bool kva__index_retire(struct kva_arena *a, uint64_t pos, uint64_t c, const uint64_t key[2]);
/* a ghost (an evicted key's history) still counts: see index.c */
bool kva__ghost_live(struct kva_arena *a, uint64_t info);

/* evict.c */
void kva__hint_touch(struct kva_arena *a, uint32_t id, uint64_t tick, bool hit);
void kva__hint_publish(struct kva_arena *a, uint32_t id, const uint64_t key[2], uint64_t tick,
		       uint32_t depth, uint32_t hits, uint64_t pos);
bool kva__publish_room(struct kva_worker *w, uint32_t id);
void kva__publish_done(struct kva_worker *w, bool published);
uint64_t kva__pub_sum(struct kva_arena *a);

#endif /* KVA_PREFIX_PVT_H */
