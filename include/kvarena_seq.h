/* SPDX-License-Identifier: MIT */
/*
 * kvarena_seq.h - sequences, the cross-process prefix index, eviction and
 * quotas. Included by kvarena.h.
 *
 * A sequence is one request's KV: a private block table (worker memory) over
 * arena blocks. Each block that becomes full is *published*: its 128-bit
 * chained hash goes into the prefix index in shared memory, and any process
 * of the arena whose sequence starts with the same tokens (and salt) attaches
 * the block by reference instead of computing it again. A published block
 * that nobody holds stays *cached*; allocation under pressure evicts cached
 * blocks by the arena's policy.
 *
 * Block states (one descriptor word each): free; owned (one worker);
 * shared (holder bit per worker; "published" if the index may point to it);
 * cached (published, no holder, evictable). A published block's bytes never
 * change: it is written before it is published and evicted before it is
 * written again.
 *
 * A sequence belongs to the worker (and thread) that opened it; sequences of
 * one worker must not be used from two threads at once. Close every sequence
 * before kva_worker_leave / kva_detach: leaving gives back what they hold,
 * and the sequence handles then name a worker that is gone.
 */
#ifndef KVARENA_SEQ_H
#define KVARENA_SEQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kva_worker;
struct kva_arena;
struct kva_seq;

enum kva_owner_kind {
	KVA_OWNER_INFERENCE = 0, /* serving requests */
	KVA_OWNER_TRAINING = 1,  /* a training run (adapter, run id) */
	KVA_OWNER_PINNED = 2,    /* kept by an operator's choice */
	KVA_OWNER_KINDS = 3,
};

struct kva_seq_opts {
	enum kva_owner_kind kind;
	const char *model;        /* salt: model id (NULL = "") */
	const char *adapter;      /* salt: adapter id, e.g. the LoRA name (NULL = "") */
	uint32_t tenant;          /* salt and quota key */
	uint64_t run_id;          /* KVA_OWNER_TRAINING: the run */
	size_t reserve_tokens;    /* reserved at open (all or nothing) */
	size_t max_tokens;        /* 0 = no maximum; reserve beyond it is -EFBIG */
};

/*
 * kva_seq_open - a new, empty sequence of worker @w.
 * Return: 0, -EINVAL, -ENOMEM, -ENOSPC / -EDQUOT (the initial reservation),
 * -ESTALE, -ESHUTDOWN.
 */
int kva_seq_open(struct kva_worker *w, const struct kva_seq_opts *o, struct kva_seq **out);

/*
 * kva_seq_match - attach the longest cached prefix of @tokens made of full
 * blocks, by reference, and set *@matched_tokens to its length (a multiple of
 * the block size, possibly 0). Only on an empty sequence (-EBUSY otherwise).
 * The linearization point of a match against an eviction of the same block
 * is the CAS on the block's descriptor: whichever lands first wins; a block
 * matched is held, and its bytes are what its publisher wrote.
 */
int kva_seq_match(struct kva_seq *s, const int32_t *tokens, size_t n, size_t *matched_tokens);

/*
 * kva_seq_reserve - make room for @n_tokens more tokens past the current
 * length: all or nothing. -ENOSPC (nothing free or evictable), -EDQUOT (the
 * owner kind's or tenant's quota), -EFBIG (past max_tokens).
 */
int kva_seq_reserve(struct kva_seq *s, size_t n_tokens);

/*
 * kva_seq_append - advance the length by @n tokens (reserving what is
 * missing), after their K and V are written to the blocks. Each block that
 * becomes full is published to the prefix index. If another worker published
 * the same block first, this sequence keeps its own copy, unpublished (it is
 * freed at close); the index keeps one block per hash.
 */
int kva_seq_append(struct kva_seq *s, const int32_t *tokens, size_t n);

/*
 * kva_seq_fork - a child sharing every block of @s by reference. A partial
 * last block is shared until either side appends: that side copies it
 * first. On a GPU arena the copy is a device-to-device cuMemcpy on the
 * legacy default stream, waited for: the caller's writes to that block
 * must be done (their stream synchronized) before that append.
 */
int kva_seq_fork(struct kva_seq *s, struct kva_seq **child);

/* kva_seq_block_table - the sequence's block ids (valid until the next call
 * that changes it) and lengths. Reserved blocks past the length included. */
int kva_seq_block_table(const struct kva_seq *s, const uint32_t **ids, size_t *n_blocks,
			size_t *n_tokens);

/* kva_seq_close - drop every reference; published blocks stay cached. */
void kva_seq_close(struct kva_seq *s);

/* ---------------------------------------------------------------- hashes */

/*
 * kva_prefix_salt - the salt of (@model, @adapter, @tenant): XXH3-128 of
 * "kvarena-salt-v1" NUL model NUL adapter NUL tenant (4 bytes, little endian).
 * kva_prefix_hash - one block's key: XXH3-128 of parent (16 bytes: low word,
 * high word, little endian; zeros for the first block), salt (same) and the
 * @n token ids (int32, little endian). Identical in every process, across
 * restarts and machines.
 */
void kva_prefix_salt(const char *model, const char *adapter, uint32_t tenant, uint64_t out[2]);
void kva_prefix_hash(const uint64_t parent[2], const uint64_t salt[2], const int32_t *tokens,
		     size_t n, uint64_t out[2]);

/* ----------------------------------------------------------- eviction */

enum kva_evict_policy {
	KVA_EVICT_DEFAULT = 0, /* KVA_EVICT_PREFIX */
	KVA_EVICT_CLOCK = 1,   /* second chance over the descriptors */
	KVA_EVICT_PREFIX = 2,  /* prefix- and reuse-aware (see README) */
};

const char *kva_evict_policy_name(enum kva_evict_policy p);
int kva_evict_policy_parse(const char *name, enum kva_evict_policy *out);

/* Quotas, in blocks held by sequences (0 = no limit). */
#define KVA_MAX_TENANT_QUOTAS 16
struct kva_quotas {
	uint32_t kind[KVA_OWNER_KINDS];
	struct {
		uint32_t tenant;
		uint32_t blocks;   /* 0: this entry is unused */
	} tenant[KVA_MAX_TENANT_QUOTAS];
};

/*
 * kva_arena_set_policy / kva_arena_set_quotas - by the arena's creator (the
 * agent), before or while workers run. Read by workers on their slow paths.
 * A quota is checked against the sum of every slot's usage after the taker
 * has counted its own: what sequences hold never passes it; two workers
 * reserving at the same instant may both be refused where one would fit.
 */
int kva_arena_set_policy(struct kva_arena *a, enum kva_evict_policy p);
/* At most @blocks published blocks (cached or held) at once, 0 = no limit: a
 * publication past it first evicts a cached block (freed), or is skipped if
 * none can be. The prefix cache's share of the arena (agent --cache-limit). */
int kva_arena_set_cache_limit(struct kva_arena *a, uint64_t blocks);
int kva_arena_set_quotas(struct kva_arena *a, const struct kva_quotas *q);

/* What ops tools read (kvarena-ctl prefix / seqs). */
struct kva_prefix_stats {
	enum kva_evict_policy policy;
	uint64_t index_entries;       /* capacity */
	uint64_t index_valid;         /* entries naming a block */
	uint64_t index_tombstones;
	uint64_t index_ghosts;        /* keys of recent evictions kept as history */
	uint64_t cached_blocks;       /* published, no holder: evictable */
	uint64_t published_blocks;    /* published and held */
	uint64_t hits, misses;        /* full blocks matched / not matched by kva_seq_match */
	uint64_t published, duplicates; /* blocks published / lost a publication race */
	uint64_t evictions;           /* cached blocks taken by allocation under pressure */
	uint64_t stale_entries;       /* index entries removed because their block changed */
	uint64_t index_full;          /* publications skipped: no free entry in reach, or
				       * the cache limit reached with nothing evictable */
	uint64_t published_now;       /* the count the cache limit applies to */
	uint64_t cache_limit;
	uint64_t open_seqs;
	uint64_t kind_blocks[KVA_OWNER_KINDS];   /* blocks held by sequences, by owner kind */
	struct kva_quotas quotas;
	uint64_t tenant_blocks[KVA_MAX_TENANT_QUOTAS]; /* usage of quotas.tenant[i] */
};

int kva_arena_prefix_stats(struct kva_arena *a, struct kva_prefix_stats *st);

/* Per worker (slot): open sequences and what they hold. */
struct kva_seq_slot_stats {
	uint32_t open_seqs;
	uint64_t kind_blocks[KVA_OWNER_KINDS];
	uint64_t hits, misses, published, evictions;
};
int kva_arena_seq_stats(struct kva_arena *a, uint32_t slot, struct kva_seq_slot_stats *st);

#ifdef __cplusplus
}
#endif

#endif /* KVARENA_SEQ_H */
