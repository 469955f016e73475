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

/* a slot counter (KVA__SC_*) of our own: single writer, a relaxed load and store */
static inline void kva__sc_add(struct kva_worker *w, unsigned i, uint64_t v)
{
	atomic_store_explicit(&w->slot->sc[i],
			      atomic_load_explicit(&w->slot->sc[i], memory_order_relaxed) + v,
			      memory_order_relaxed);
}

/* index.c */
struct kva__found {
	uint64_t pos;     /* entry index */
	uint64_t ctrl;    /* its VALID (or spilled) word */
};
bool kva__index_lookup(struct kva_arena *a, const uint64_t key[2], struct kva__found *f,
		       uint64_t *stale);
int kva__index_insert(struct kva_worker *w, const uint64_t key[2], uint32_t block,
		      uint64_t epoch, uint64_t info, uint64_t *pos, uint32_t *uses,
		      uint64_t *twin_loc);
bool kva__index_remove(struct kva_arena *a, uint64_t pos, uint32_t block, uint64_t epoch,
		       uint32_t uses, uint64_t evseq, uint64_t loc);
/* spilled entries: where keys whose blocks left the arena have their copies */
bool kva__index_lookup_spilled(struct kva_arena *a, const uint64_t key[2], struct kva__found *f);
int kva__index_insert_spilled(struct kva_worker *w, const uint64_t key[2], uint64_t loc,
			      uint64_t evseq, uint64_t *pos);
bool kva__index_respill(struct kva_arena *a, uint64_t pos, uint64_t c, uint64_t loc);
bool kva__index_unspill(struct kva_arena *a, uint64_t pos, uint64_t c);
bool kva__index_retire(struct kva_arena *a, uint64_t pos, uint64_t c, const uint64_t key[2]);
/* a ghost (an evicted key's history) still counts: see index.c */
bool kva__ghost_live(struct kva_arena *a, uint64_t info);

/* seq.c: a sequence (kvarena_seq.h), in its worker's memory */
struct kva__below {
	uint64_t key[2];
	uint64_t loc;              /* where the spilled entry said its copy is */
};
struct kva__fetch;
struct kva_seq {
	struct kva_worker *w;
	enum kva_owner_kind kind;
	int tenant_q;              /* index of the tenant's quota entry, -1: none */
	uint64_t salt[2];
	size_t max_tokens;         /* 0: none */
	size_t n_tokens;
	uint32_t *ids;             /* [n_blocks]: covers n_tokens, then reserved */
	size_t n_blocks, cap;
	size_t n_hashed;           /* full blocks whose keys are chained so far */
	uint64_t key[2];           /* the key of block n_hashed - 1 */
	bool cow;                  /* the partial block is shared with a fork */
	int32_t *part;             /* the partial block's tokens: [block_tokens] */
	/* the tiers below (fetch.c): what the last match found there, past
	 * the blocks it attached (n_hashed was below_at then), and the fetch
	 * of them in flight, if any */
	struct kva__below *below;
	size_t n_below, below_cap, below_at;
	struct kva__fetch *fetch;
};

static inline uint32_t kva__btok(const struct kva_seq *s)
{
	return s->w->arena->info.geometry.block_tokens;
}
int kva__quota_take(struct kva_seq *s, uint64_t more);
void kva__usage_add(struct kva_seq *s, int64_t n);
/* the pinned hint of @ids (held by @s), @delta each, if @s is pinned */
void kva__pins_add(struct kva_seq *s, const uint32_t *ids, size_t n, int delta);
int kva__table_room(struct kva_seq *s, size_t n);
bool kva__publish_block(struct kva_worker *w, uint32_t id, const uint64_t key[2], uint64_t info,
			uint32_t depth, uint64_t backing);

/* fetch.c: the worker's side of the tiers */
/* a publication without a copy below: the agent is to make one */
void kva__spill_mark(struct kva_worker *w, uint32_t id);
/* the blocks past a match that are below (from @m on, the key of block m
 * already in @k), recorded in @s->below */
void kva__look_below(struct kva_seq *s, const int32_t *tokens, size_t m, size_t full,
		     const uint64_t k[2]);
/* a fetch in flight ends now (kva_seq_close) */
void kva__fetch_abandon(struct kva_seq *s);

/* hold.c: the agent's holds, for the tiers */
bool kva__hold_published(struct kva_worker *w, uint32_t id, uint64_t *epoch);
bool kva__hold_dest(struct kva_worker *w, uint32_t id, uint32_t epoch, uint32_t requester);

/* record.c: the tiers' record format (arena_pvt.h, struct kva__rec_hdr) */
uint64_t kva__rec_fingerprint(const struct kva_arena_info *info);
void kva__rec_hdr_fill(struct kva__rec_hdr *h, uint64_t fp, const uint64_t key[2],
		       uint64_t length, uint64_t data_hash, uint64_t seq);
/* NULL, or why @h is not a record of @fp (for @key, if not NULL) of @length */
const char *kva__rec_hdr_check(const struct kva__rec_hdr *h, uint64_t fp, const uint64_t *key,
			       uint64_t length);
/* a block's pieces in canonical order; their count (kva__rec_pieces_max at most) */
uint32_t kva__rec_pieces(const struct kva_arena_info *info, uint32_t block, struct kva__piece *p);
uint32_t kva__rec_pieces_max(const struct kva_arena_info *info);
/* block @id's bytes to @dst, returning their hash; from @src (checked
 * against @hash, or not: put) */
uint64_t kva__rec_gather(struct kva_arena *a, uint32_t id, uint8_t *dst);
bool kva__rec_scatter(struct kva_arena *a, uint32_t id, const uint8_t *src, uint64_t hash);
void kva__rec_put(struct kva_arena *a, uint32_t id, const uint8_t *src);
/* the hash of block @id's bytes where they lie, in canonical order */
uint64_t kva__block_hash(struct kva_arena *a, uint32_t id);
/*
 * A GPU arena's blocks, through a queue of the caller's (devmem_pvt.h): the
 * CPU never touches device memory. gather: block @id's bytes to @dst (host
 * memory, pinned for speed), waited for, and their hash. put: @src checked
 * against @hash here, on the host, then copied into the block, waited for.
 * Return: 0, -EBADMSG (put: @src does not hash to @hash), -EIO (a copy).
 */
struct kva__dev_queue;
int kva__rec_gather_dev(struct kva_arena *a, struct kva__dev_queue *q, uint32_t id, uint8_t *dst,
			uint64_t *hash);
int kva__rec_put_dev(struct kva_arena *a, struct kva__dev_queue *q, uint32_t id,
		     const uint8_t *src, uint64_t hash);
/* the same, per instruction set (record_isa.h): record.c picks one at run
 * time (KVA_RECORD_ISA forces one); test_record runs each */
#define KVA__REC_PATH(isa)                                                              \
	uint64_t kva__rec_gather_##isa(struct kva_arena *a, uint32_t id, uint8_t *dst);  \
	bool kva__rec_scatter_##isa(struct kva_arena *a, uint32_t id, const uint8_t *src, \
				    uint64_t hash);                                      \
	uint64_t kva__rec_hash_##isa(struct kva_arena *a, uint32_t id);
KVA__REC_PATH(sse2)
KVA__REC_PATH(avx2)
KVA__REC_PATH(avx512)
#undef KVA__REC_PATH

/* evict.c */
void kva__hint_touch(struct kva_arena *a, uint32_t id, uint64_t tick, bool hit);
void kva__hint_publish(struct kva_arena *a, uint32_t id, const uint64_t key[2], uint64_t tick,
		       uint32_t depth, uint32_t hits, uint64_t pos, uint64_t backing);
bool kva__publish_room(struct kva_worker *w, uint32_t id);
void kva__publish_done(struct kva_worker *w, bool published);
uint64_t kva__pub_sum(struct kva_arena *a);

#endif /* KVA_PREFIX_PVT_H */
