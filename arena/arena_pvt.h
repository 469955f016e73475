/* SPDX-License-Identifier: MIT */
/*
 * arena_pvt.h - the metadata region's layout and the allocator's private types.
 *
 * Metadata region (a memfd sealed against shrink and grow), at offsets fixed by
 * kva__meta_layout() from the header's geometry, never read back as pointers:
 *
 *   [0, 4096)   header        written once by the creator, then only read
 *   pool_off    pool state    one line of hints about the pool (struct kva__pool)
 *   slots_off   slot table    max_workers x struct kva__slot
 *   desc_off    descriptors   blocks x 64-bit word: the truth of every block
 *   l0_off      free hints    one bit per block: "this block may be free"
 *   l1_off      summary       one bit per l0 word: "that word may have bits"
 *   idx_off     prefix index  idx_entries x struct kva__pentry (prefix/index.c)
 *   bmeta_off   block meta    blocks x struct kva__bmeta: eviction hints and
 *                             where the block's index entry is (prefix/evict.c)
 *   dirty_off   spill hints   one bit per block: "published, maybe without a
 *                             copy in a tier below" (tiers/), and a summary
 *                             bit per word (dsum_off): set by publishers
 *                             (fetch_or, word then summary), taken by the
 *                             agent (summary cleared, then the word
 *                             exchanged). Hints only: a bit lost to a crash
 *                             is a block evicted without a copy (counted),
 *                             a bit set for nothing is a skipped copy
 *   fetch_off   fetch queues  max_workers x struct kva__fetch_area: a worker's
 *                             requests to the agent to bring blocks up from
 *                             the tiers (prefix/fetch.c, tiers/)
 *
 * l0 and l1 are written by every worker (a claim clears, a free sets) and by
 * reclaimers, and read by claimers; a writer that dies half-way leaves at
 * worst a free block whose bit is clear, which reclaim sets again (pool.c).
 *
 * That is 8 + 1/8 + 1/4096 bytes of allocator state per block, and 48 of block
 * meta plus 128 to 256 of index (four to eight entries a block) for prefixes;
 * 64 to 128 bytes of index more per record the tiers below can hold.
 */
#ifndef KVA_ARENA_PVT_H
#define KVA_ARENA_PVT_H

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvarena.h"
#include "kvarena_seq.h"

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

#define KVA__MAGIC 0x31414e455241564bull /* "KVARENA1" read as a little-endian word */
#define KVA__ABI_VERSION 5u
#define KVA__HEADER_BYTES 4096u
#define KVA__HDR_HUGETLB 0x1u
#define KVA__CACHE_MAX 65536u

/*
 * The header. Written by kva_arena_create() before the region's fd is handed to
 * anyone, never written again. Every process copies it to private memory,
 * validates the copy (checksum, each field, and the layout recomputed from the
 * geometry) and uses only the copy: a worker scribbling on the shared header
 * after that changes nothing for the others.
 */
struct kva__header {
	uint64_t magic;
	uint32_t abi_version;
	uint32_t header_bytes;  /* sizeof(struct kva__header) */
	uint32_t block_tokens, layers, kv_heads, head_dim;
	uint32_t dtype, layout;
	uint32_t blocks, max_workers;
	uint32_t cache_blocks, flags;
	int32_t numa_node;
	uint32_t reserved0;
	uint64_t tier_keys;     /* keys the index holds for the tiers, beyond the blocks */
	uint64_t block_bytes, block_stride, page_bytes, data_bytes;
	uint64_t meta_bytes, pool_off, slots_off, desc_off, l0_off, l1_off;
	uint64_t l0_words, l1_words;
	uint64_t idx_off, idx_entries, bmeta_off;
	uint64_t dirty_off, dsum_off, fetch_off;
	char name[32];
	/* where the data is (enum kva_backend). For KVA_BACKEND_CUDA, the
	 * region as devmem_pvt.h's struct kva__dev_geom says it: the device
	 * (importers find it by UUID: ordinals depend on CUDA_VISIBLE_DEVICES),
	 * how it is shared (enum kva_cuda_ipc), its chunks. All zero for host
	 * memory. */
	uint32_t backend, ipc;
	uint64_t granularity, chunk_bytes, map_bytes, device_total;
	uint32_t chunks, reserved1;
	uint8_t device_uuid[16];
	char device_name[64];
	uint64_t checksum;      /* XXH64 of every byte above, seed KVA__HDR_SEED */
};

#define KVA__HDR_SEED 0x6b76617265616e61ull

/* slot counters; the same indices in kva__pool.gone. BELOW: full blocks a
 * match found in a tier below the arena; FETCHED_*: blocks a fetch brought
 * up from each tier, checked; FETCH_FAILED: not; UNBACKED: cached blocks
 * evicted, while tiers run, before the agent had copied them below (their
 * data is gone); VERIFY_*: records whose bytes did not hash to their header */
enum { KVA__SC_HITS, KVA__SC_MISSES, KVA__SC_PUBLISHED, KVA__SC_DUPLICATES,
       KVA__SC_EVICTIONS, KVA__SC_STALE, KVA__SC_INDEX_FULL, KVA__SC_BELOW, KVA__SC_FETCHED_HOST,
       KVA__SC_FETCHED_DISK, KVA__SC_FETCH_FAILED, KVA__SC_UNBACKED, KVA__SC_VERIFY_HOST,
       KVA__SC_VERIFY_DISK, KVA__SC_N };
#define KVA__SC_MAX 16
_Static_assert(KVA__SC_N <= KVA__SC_MAX, "slot counters fit their words");

/* the words of one tier in the agent's report (struct kva__tier_view) */
enum { KVA__TV_FLAGS, KVA__TV_CAP_RECORDS, KVA__TV_USED_RECORDS, KVA__TV_RECORD_BYTES,
       KVA__TV_HITS, KVA__TV_BYTES_IN, KVA__TV_BYTES_OUT, KVA__TV_RECORDS_IN, KVA__TV_P50_NS,
       KVA__TV_P99_NS, KVA__TV_IO_ERRORS, KVA__TV_VERIFY_FAILED, KVA__TV_STALE, KVA__TV_DROPPED,
       KVA__TV_NODE_QD, KVA__TV_RESTART_FOUND, KVA__TV_RESTART_DROPPED, KVA__TV_SCAN_DONE,
       KVA__TV_SCAN_TOTAL, KVA__TV_DEGRADED_MS, KVA__TV_N };
/* ... and of the tiers as a whole */
enum { KVA__TVS_BACKED, KVA__TVS_BACK_SKIPPED, KVA__TVS_FETCH_REQUESTS, KVA__TVS_FETCH_FAILED,
       KVA__TVS_DOORBELLS, KVA__TVS_N };
/* KVA__TV_FLAGS */
#define KVA__TVF_ENABLED 0x1u
#define KVA__TVF_DEGRADED 0x2u
#define KVA__TVF_DIRECT 0x4u
#define KVA__TVF_HUGETLB 0x8u
#define KVA__TVF_PREALLOC 0x10u
#define KVA__TVF_WARMING 0x20u

/*
 * Pool state. pressure is set by a worker whose claim came back short (the
 * arena is nearly full) and cleared by one whose refill was filled; any
 * worker writes it, only at those transitions, with a relaxed store after a
 * load that saw the other value. While it is set, caches are not refilled,
 * and a worker whose cache overflows sends all of it back rather than half:
 * no more than one cache's worth of blocks per worker sits idle while
 * another gets -ENOSPC. It is read on slow paths only. A hint: a crash
 * leaves it either way and the next refill corrects it.
 */
struct kva__pool {
	alignas(128) _Atomic uint32_t pressure;
	/*
	 * The agent that owns the arena, if any: written by it alone (relaxed
	 * stores; it has nothing else to publish), read by workers on their
	 * slow paths. STOPPING makes new allocations and references fail with
	 * -ESHUTDOWN. If the agent dies the word stays as it was.
	 */
	_Atomic uint32_t agent_state;
	_Atomic int32_t agent_pid;
	/* Eviction (prefix/evict.c). policy: written by the arena's creator (the
	 * agent), read on slow paths. hand: fetch_add by evictors, SWEEP ids
	 * at a time. tick: fetch_add by each sequence's close. evictions:
	 * fetch_add by each eviction: the age of ghosts. threshold (below):
	 * stored by whichever evictor last computed it, read by all. All
	 * relaxed: hints that order no block's data; a worker killed anywhere
	 * leaves each a valid value (a skipped number, a stale threshold). */
	alignas(64) _Atomic uint32_t policy;
	alignas(64) _Atomic uint32_t hand;
	alignas(64) _Atomic uint64_t tick;
	_Atomic uint64_t evictions;
	/* cache_limit (0: none) caps the published blocks (cached or held):
	 * kva_arena_set_cache_limit. Their count is pub[] below. */
	_Atomic uint64_t cache_limit;
	_Atomic uint64_t threshold;  /* PREFIX: evict cached blocks ranked at or below */
	/* Quotas (kva_arena_set_quotas), read on reserve. */
	alignas(64) _Atomic uint32_t quota_kind[KVA_OWNER_KINDS];
	_Atomic uint32_t quota_tenant[KVA_MAX_TENANT_QUOTAS][2]; /* tenant, blocks */
	/* The counters of slots gone (left or reclaimed), added by whoever
	 * took the slot back, so that totals survive their workers. */
	alignas(64) _Atomic uint64_t gone[KVA__SC_MAX];
	/*
	 * The published-block count, one word per slot (kva__pub_*, prefix/evict.c):
	 * bits 0..31 the slot's share of the count, modulo 2^32 (publications
	 * and their reservations counted, minus evictions, over all of the
	 * slot's lives: the sum over slots is the count, which is below 2^32,
	 * so the wrap is harmless), bits 32..63 the one operation in flight
	 * (KVA__PUB_OP_*). Written only by the slot's worker, and by its
	 * reclaimer once it is dead, with single stores: a count and the
	 * operation that changed it cannot be torn apart by a death. Reclaim
	 * settles an operation left in flight from the block's descriptor
	 * (recover.c); a global counter could not tell whether the dead worker
	 * had counted yet.
	 */
	alignas(64) _Atomic uint64_t pub[KVA_MAX_WORKERS];
	/* A correction of that count, in the same modular sense: written by the
	 * agent alone, when it finds the slots' words off by a steady amount (a
	 * word overwritten), and counted in the sum. */
	_Atomic uint64_t pub_fix;
	/* What the agent reports (kva_arena_agent_report): written by the agent
	 * alone, rewritten whole every tick from its private state (so an
	 * overwrite lasts a tick), and its repair words also at each repair,
	 * before the repair is logged; read by ops tools; nobody decides from
	 * it. Relaxed words: a reader may see one tick's count with another's
	 * text, and an agent that dies leaves the last tick's view. */
	alignas(64) struct kva__agent_view {
		_Atomic uint64_t repairs;
		_Atomic uint64_t last_repair[16];       /* 127 bytes and a NUL */
		_Atomic uint64_t pending;               /* reclaims waiting to be retried */
		_Atomic uint64_t slot[KVA_MAX_WORKERS][2]; /* kva__view_slot_word() */
		/* a GPU arena: cuMemGetInfo, rewritten once a second */
		_Atomic uint64_t dev_free, dev_total;
	} view;
	/*
	 * The tiers below the arena (tiers/). tiers: KVA__TIERS_* bits, written
	 * by the agent alone (repaired like agent_state), read by workers on
	 * publication, eviction and match: whether to mark a publication for a
	 * copy, keep an evicted block's place below, look below. fetch_pending:
	 * a bit per slot with fetch requests posted (fetch_or by the worker,
	 * exchange by the agent). sleeping: the agent's tier thread is about to
	 * sleep and must be woken by the doorbell (a Dekker pair with
	 * fetch_pending and the dirty summary: each side stores, fences, reads
	 * the other's). tier_view: what the agent reports of them, rewritten
	 * whole by it (kva_arena_tier_stats); nobody decides from it.
	 */
	alignas(64) _Atomic uint32_t tiers;
	_Atomic uint32_t sleeping;
	_Atomic uint64_t fetch_pending;
	alignas(64) struct kva__tier_view {
		struct kva__tier_view_one {
			_Atomic uint64_t v[KVA__TV_N];
			_Atomic uint64_t reason[12];    /* 95 bytes and a NUL */
			_Atomic uint64_t path[16];      /* 127 bytes and a NUL */
		} t[2];                                 /* host, disk */
		_Atomic uint64_t v[KVA__TVS_N];
	} tier_view;
};

#define KVA__TIERS_HOST 0x1u
#define KVA__TIERS_DISK 0x2u


/* a slot in the agent's view: state (8) | generation (24) | pid (32); then
 * uid (32) | ms a reclaim has been pending (32) */
static inline uint64_t kva__view_slot_word(uint32_t state, uint32_t gen, int32_t pid)
{
	return (uint64_t)(state & 0xff) << 56 | (uint64_t)(gen & 0xffffffull) << 32 | (uint32_t)pid;
}

/* the operation in flight in a pub[] word: 0 none, else block id + 1 of a
 * publication (its reservation counted), or with KVA__PUB_EVICT, of an
 * eviction (counted out when its CAS lands) */
#define KVA__PUB_EVICT 0x80000000u
static inline uint64_t kva__pub_word(uint32_t count, uint32_t op) { return (uint64_t)op << 32 | count; }
static inline uint32_t kva__pub_count(uint64_t w) { return (uint32_t)w; }
static inline uint32_t kva__pub_op(uint64_t w) { return (uint32_t)(w >> 32); }

/*
 * A worker slot. The state word is claimed by a joiner (CAS FREE -> JOINING),
 * published LIVE by it, and taken back by kva_worker_leave() or a reclaimer
 * (CAS -> RECLAIMING -> FREE with the generation bumped). The other fields of
 * the first line are written by the joiner between JOINING and LIVE (release
 * on LIVE); readers (stats, reclaim) read them after an acquire load of the
 * state. The second line holds counters only the slot's own worker writes,
 * with relaxed stores; ops tools read them as hints. If the joiner dies while
 * JOINING, the pid in the state word is enough to reclaim the slot.
 *
 * start is the holder's kernel start time tagged with the generation it was
 * written for (kva__start_make): written after the claim, so for an instant
 * the slot names its new holder while start is still the last holder's; a
 * reader trusts it only for the generation it read in the state word, and
 * otherwise knows no start time (liveness by pid alone, which errs towards
 * alive).
 *
 * reclaim is the reclaim lease: a robust, process-shared mutex that is only
 * ever try-locked (nobody waits on it). Whoever holds it is the one reclaimer
 * of the slot; another, even a thread of the same process, gets -EBUSY. If
 * its holder dies, the kernel marks it (EOWNERDEAD) and the next reclaimer
 * takes over the unfinished work: exact, where a pid and start time cannot
 * tell two threads of one process apart. Initialised by the arena's creator.
 */
struct kva__slot {
	alignas(128) _Atomic uint64_t state; /* see kva__slot_word() */
	_Atomic uint64_t start;              /* kva__start_make(gen, starttime); 0 = unknown */
	_Atomic int64_t owner_pid;           /* the joiner, kept through RECLAIMING */
	_Atomic uint64_t name[4];            /* 31 bytes and a NUL */
	pthread_mutex_t reclaim;             /* the reclaim lease (recover.c) */
	alignas(64) _Atomic uint64_t cached;
	_Atomic uint64_t shares, refills, flushes;
	/* Sequences (prefix/seq.c), written by the slot's worker alone (relaxed),
	 * summed by readers: counters (KVA__SC_*), blocks held by sequences by
	 * owner kind and by tenant quota entry, and a count of index insertions
	 * in flight (nonzero at death: reclaim looks for its BUSY entries). */
	alignas(64) _Atomic uint64_t sc[KVA__SC_MAX];
	_Atomic uint32_t kind_blocks[KVA_OWNER_KINDS];
	_Atomic uint32_t open_seqs;
	_Atomic uint32_t inserting;
	_Atomic uint32_t tenant_blocks[KVA_MAX_TENANT_QUOTAS];
};

/* A start time (clock ticks since boot: 40 bits last 348 years at 100 Hz)
 * and the slot generation it belongs to, in one word. */
#define KVA__START_BITS 40
#define KVA__START_MASK ((1ull << KVA__START_BITS) - 1)

_Static_assert(sizeof(struct kva__slot) == 512, "one slot is eight cache lines");

/* Slot state word: kind (2 bits) | generation (24 bits) | pid (32 bits). */
#define KVA__S_KIND_SHIFT 62
#define KVA__S_GEN_SHIFT 32
#define KVA__S_GEN_MASK 0xffffffull

static inline uint64_t kva__slot_word(uint32_t kind, uint32_t gen, int32_t pid)
{
	return ((uint64_t)kind << KVA__S_KIND_SHIFT) |
	       ((uint64_t)(gen & KVA__S_GEN_MASK) << KVA__S_GEN_SHIFT) | (uint32_t)pid;
}
static inline uint32_t kva__slot_kind(uint64_t s) { return (uint32_t)(s >> KVA__S_KIND_SHIFT); }
static inline uint32_t kva__slot_gen(uint64_t s)
{
	return (uint32_t)((s >> KVA__S_GEN_SHIFT) & KVA__S_GEN_MASK);
}
static inline int32_t kva__slot_pid(uint64_t s) { return (int32_t)(uint32_t)s; }

static inline uint64_t kva__start_make(uint32_t gen, uint64_t start_time)
{
	start_time &= KVA__START_MASK;
	return start_time ? (uint64_t)(gen & KVA__S_GEN_MASK) << KVA__START_BITS | start_time : 0;
}
/* The start time @s records for generation @gen, or 0 (unknown). */
static inline uint64_t kva__start_for(uint64_t s, uint32_t gen)
{
	return s >> KVA__START_BITS == (gen & KVA__S_GEN_MASK) ? s & KVA__START_MASK : 0;
}

/*
 * A block descriptor, one 64-bit word per block:
 *
 *   63..62  kind    FREE, OWNED (one worker, its cache included), SHARED or
 *                   CACHED (published, no holder: evictable)
 *   61..60  flags   PUB: a SHARED block the prefix index may name (always
 *                   with CACHED); REF: used since the clock hand last passed
 *   59..48  epoch   bumped each time the block becomes free: a CAS that
 *                   expected the block's previous life fails
 *   47..0   payload FREE: 0; OWNED: slot (bits 0..7) | slot generation
 *                   (bits 8..31); SHARED: one holder bit per slot
 *
 * Writers: a FREE word is claimed by CAS (any worker). An OWNED word is
 * written only by its owner (no other worker may touch it, which is what lets
 * the owner's cache and frees run without atomic read-modify-writes), or by a
 * reclaimer once the owner is dead. A SHARED word is changed by CAS by any
 * holder, by a worker joining the holders, and by a reclaimer. A crash
 * between two of these steps leaves every word at one of its states: the
 * claim of a block and the record of its owner are the same instruction.
 * A CACHED word is changed by CAS by a matcher (-> SHARED|PUB, holding it) or
 * an evictor (-> OWNED by it, epoch bumped): whichever CAS lands first.
 */
#define KVA__D_KIND_SHIFT 62
#define KVA__D_EPOCH_SHIFT 48
#define KVA__D_EPOCH_MASK 0xfffull
#define KVA__D_PAYLOAD_MASK ((1ull << 48) - 1)
#define KVA__D_FLAGS_MASK (3ull << 60)
#define KVA__D_FREE 0u
#define KVA__D_OWNED 1u
#define KVA__D_SHARED 2u
#define KVA__D_CACHED 3u
#define KVA__D_PUB (1ull << 60)
#define KVA__D_REF (1ull << 61)

static inline uint32_t kva__d_kind(uint64_t d) { return (uint32_t)(d >> KVA__D_KIND_SHIFT); }
static inline uint64_t kva__d_epoch(uint64_t d)
{
	return (d >> KVA__D_EPOCH_SHIFT) & KVA__D_EPOCH_MASK;
}
static inline uint64_t kva__d_payload(uint64_t d) { return d & KVA__D_PAYLOAD_MASK; }
static inline uint64_t kva__d_make(uint32_t kind, uint64_t epoch, uint64_t payload)
{
	return ((uint64_t)kind << KVA__D_KIND_SHIFT) |
	       ((epoch & KVA__D_EPOCH_MASK) << KVA__D_EPOCH_SHIFT) | payload;
}
static inline uint64_t kva__owner_tag(uint32_t slot, uint32_t gen)
{
	return (uint64_t)slot | ((uint64_t)(gen & KVA__S_GEN_MASK) << 8);
}
static inline uint32_t kva__tag_slot(uint64_t payload) { return (uint32_t)(payload & 0xff); }
static inline uint32_t kva__tag_gen(uint64_t payload)
{
	return (uint32_t)((payload >> 8) & KVA__S_GEN_MASK);
}
/* The free word that follows a block's life @d. */
static inline uint64_t kva__d_next_free(uint64_t d)
{
	return kva__d_make(KVA__D_FREE, kva__d_epoch(d) + 1, 0);
}

/*
 * A prefix index entry (prefix/index.c). ctrl is the entry's state and the only word
 * whose value orders the others:
 *
 *   63..62  state   EMPTY (the whole word 0, never again once used), BUSY
 *                   (being written by slot `block`), VALID, TOMB (deleted)
 *   61..48  tag     14 bits of the key: a cheap first compare, and how an
 *                   inserter recognises a BUSY entry for its own key
 *   47..36  epoch   the block's descriptor epoch when published
 *   34      disk    (spilled) the copy is in the disk tier, else the host's
 *   33      spilled TOMB|ghost of a key whose block is no longer in the arena
 *                   but whose copy is in a tier below: epoch holds the
 *                   record's generation (12 bits) and block its record slot
 *   32      ghost   TOMB of an evicted block whose key (and, in info, use
 *                   count and eviction number) is kept: the eviction
 *                   history the PREFIX policy reads (prefix/evict.c)
 *   31..0   block   VALID: the block id; BUSY: the inserting slot;
 *                   spilled: the record slot
 *
 * key is written between BUSY and VALID (release); a reader that saw VALID
 * (or a ghost) reads key, then ctrl again, and trusts the key only if ctrl
 * did not move. A spilled entry is where a key's block went when it left
 * the arena (written by its evictor, from the block's backing below, or by
 * the agent); nothing is served from it before the record it names is read
 * and verified against the key (tiers/).
 */
struct kva__pentry {
	_Atomic uint64_t ctrl;
	_Atomic uint64_t key[2];
	_Atomic uint64_t info; /* VALID: parent block + 1 | depth << 32 (hints);
				* ghost: uses | eviction number << 8 */
};

#define KVA__P_EMPTY 0u
#define KVA__P_BUSY 1u
#define KVA__P_VALID 2u
#define KVA__P_TOMB 3u
#define KVA__P_MAX_PROBE 128u
#define KVA__P_GHOST (1ull << 32)
#define KVA__P_SPILLED (1ull << 33)
#define KVA__P_DISK (1ull << 34)

static inline uint32_t kva__p_state(uint64_t c) { return (uint32_t)(c >> 62); }
static inline uint32_t kva__p_tag(uint64_t c) { return (uint32_t)((c >> 48) & 0x3fff); }
static inline uint64_t kva__p_epoch(uint64_t c) { return (c >> 36) & KVA__D_EPOCH_MASK; }
static inline uint32_t kva__p_block(uint64_t c) { return (uint32_t)c; }
static inline uint64_t kva__p_make(uint32_t state, uint32_t tag, uint64_t epoch, uint32_t block)
{
	return ((uint64_t)state << 62) | ((uint64_t)(tag & 0x3fff) << 48) |
	       ((epoch & KVA__D_EPOCH_MASK) << 36) | block;
}

/*
 * Where a block's copy lives below the arena: tier (KVA__LOC_HOST or
 * KVA__LOC_DISK) | record generation (12 bits) | record slot (32 bits); 0 is
 * nowhere. The agent bumps a record slot's generation each time it puts
 * another record there, so an old location names nothing (and the record's
 * own header, checked against the key, says so again).
 */
#define KVA__LOC_HOST 1u
#define KVA__LOC_DISK 2u
#define KVA__LOC_GEN_MASK 0xfffu
static inline uint64_t kva__loc_make(uint32_t tier, uint32_t gen, uint32_t slot)
{
	return (uint64_t)(tier & 3) << 44 | (uint64_t)(gen & KVA__LOC_GEN_MASK) << 32 | slot;
}
static inline uint32_t kva__loc_tier(uint64_t loc) { return (uint32_t)(loc >> 44) & 3; }
static inline uint32_t kva__loc_gen(uint64_t loc) { return (uint32_t)(loc >> 32) & KVA__LOC_GEN_MASK; }
static inline uint32_t kva__loc_slot(uint64_t loc) { return (uint32_t)loc; }
/* a well-formed location: a tier, and nothing in the bits it does not use */
static inline bool kva__loc_ok(uint64_t loc)
{
	return (kva__loc_tier(loc) == KVA__LOC_HOST || kva__loc_tier(loc) == KVA__LOC_DISK) &&
	       !(loc >> 46);
}
/* the spilled ghost of @tag whose copy is at @loc */
static inline uint64_t kva__p_spilled(uint32_t tag, uint64_t loc)
{
	return kva__p_make(KVA__P_TOMB, tag, kva__loc_gen(loc), kva__loc_slot(loc)) | KVA__P_GHOST |
	       KVA__P_SPILLED | (kva__loc_tier(loc) == KVA__LOC_DISK ? KVA__P_DISK : 0);
}
static inline bool kva__p_is_spilled(uint64_t c)
{
	return kva__p_state(c) == KVA__P_TOMB && (c & KVA__P_SPILLED);
}
/* the location a spilled entry names */
static inline uint64_t kva__p_loc(uint64_t c)
{
	return kva__loc_make(c & KVA__P_DISK ? KVA__LOC_DISK : KVA__LOC_HOST,
			     (uint32_t)kva__p_epoch(c), kva__p_block(c));
}

/*
 * Per-block meta. hint and entry are advisory (prefix/evict.c): written with relaxed
 * stores by whoever touches the block, read by evictors to rank candidates; a
 * torn or stale value costs a worse choice, never a wrong one. entry: the
 * index position + 1 of the block's entry (0: none), written by its
 * publisher.
 *
 * key is not advisory: the key the block was published under, written by its
 * publisher while it holds the block alone, before the release store that
 * publishes it (prefix/seq.c). A matcher reads it after its acquire CAS has made it
 * a holder, when it can no longer change (a block leaves its life only once
 * nobody holds it), and attaches the block only if it is the key it looked
 * up. Epochs are 12 bits and come round; keys are 128.
 *
 * backing: where a copy of this life's bytes is below the arena (a
 * location, 0: none), so that an evictor keeps the key's place there. Set
 * by the publisher (0, or the twin's copy it took over in the index), then
 * by the agent, holding the block, once its copy is whole; read by the
 * evictor after its acquire CAS. Advisory in the other direction: a stale
 * or scribbled location costs a miss (the record, checked against the key,
 * does not match), never wrong data.
 *
 * pins: how many references pinned sequences (KVA_OWNER_PINNED) hold on the
 * block, tagged with the descriptor epoch of the life they hold it in
 * (kva__pins_make). A hint for ops tools' pictures alone: nothing decides
 * from it (eviction reads the descriptor, which a pinned holder keeps
 * SHARED or OWNED). Written by CAS (relaxed: it orders nothing) by each
 * worker whose pinned sequence takes (prefix/seq.c: reserve, match, fork,
 * the copy of a fork's partial block, a fetch's blocks) or drops (close,
 * that copy) a reference, while it holds the block, so the epoch it tags
 * with is the block's current one; a count of an earlier life is replaced,
 * not added to. Read by kva_arena_block_states, relaxed, and believed only
 * while its epoch is the descriptor's and someone holds the block. A
 * pinned holder that dies, or leaves with its sequences open, never counts
 * itself out: its count stays until the block's next life (freed, or
 * evicted), so a block may show pinned for a while after its pinned
 * holder died (held by others, or matched again from the cache). The
 * epoch is 12 bits: a count 4096 lives old could be believed again.
 */
struct kva__bmeta {
	_Atomic uint64_t hint;
	_Atomic uint64_t entry;
	_Atomic uint64_t key[2];
	_Atomic uint64_t backing;
	_Atomic uint64_t pins;
};

/* the pins word: the block's epoch (bits 32..43) | a count (bits 0..31) */
static inline uint64_t kva__pins_make(uint64_t epoch, uint32_t count)
{
	return (epoch & KVA__D_EPOCH_MASK) << 32 | count;
}
static inline uint64_t kva__pins_epoch(uint64_t w) { return w >> 32; }
static inline uint32_t kva__pins_count(uint64_t w) { return (uint32_t)w; }

/*
 * A fetch request (prefix/fetch.c posts it, tiers/ serves it): bring the
 * record at loc, checked against key, into block dest of epoch dest_epoch,
 * which the requester holds as SHARED with its bit alone (so that nobody,
 * reclaim included, frees it while the agent writes it: the agent joins it
 * before the I/O and drops it after).
 *
 * state is the only word that orders the others: kind (4 bits) | ticket
 * (28 bits: the slot generation's low 12 bits and a 16-bit count, so a word
 * of another life or an earlier request never matches). The worker fills
 * the fields and stores POSTED (release); the agent takes it POSTED -> BUSY
 * by CAS (acquire), serves it, and stores DONE or FAILED with the same
 * ticket by CAS (release, after its last write to the block and its drop).
 * A worker cancels a request the agent has not taken by CAS POSTED ->
 * FREE; one the agent has taken it leaves to finish, and only then reuses
 * the item. Everything the agent reads here is checked: dest against the
 * arena and the descriptor, loc against its own table, key against the
 * record. A crash half-way: a worker that dies leaves its items to the
 * slot's next life, which frees those still POSTED and leaves BUSY ones to
 * the agent (prefix/fetch.c, fetcher()); reclaim drops the dead worker's
 * bit on each dest, and the agent's drop frees it. An agent that dies
 * leaves items BUSY: their waiter sees the agent gone and gives them up.
 */
/*
 * A record of the tiers below the arena: the same bytes in both tiers, so
 * that moving one down a tier is one write of them.
 *
 *   [0, 4096)            header: struct kva__rec_hdr, then zeros
 *   [4096, 4096 + data)  the block's bytes in canonical order: every
 *                        (layer, K/V) page in turn, then their int8 scales
 *                        (a block-major block as it lies; a layer-major
 *                        block gathered), zero-padded to 4096
 *
 * The header carries the key, the geometry's fingerprint, the length, an
 * XXH3-64 of the data and one of itself (prefix/record.c). In the host tier,
 * which workers map read-only and copy from themselves, magic is a seqlock:
 * the agent clears it (then a release fence) before it writes a record's
 * bytes, and stores it (release) after the rest of the header; a reader
 * reads magic (acquire), the header, the bytes, then (after an acquire
 * fence) magic and seq again, and trusts the copy only if neither moved and
 * the data's hash is the header's.
 */
#define KVA__REC_HDR_BYTES 4096u
#define KVA__REC_ALIGN 4096u
#define KVA__REC_MAGIC 0x31434552415641ebull
#define KVA__REC_FORMAT 1u
struct kva__rec_hdr {
	_Atomic uint64_t magic;
	uint32_t format, hdr_bytes;
	uint64_t fingerprint;   /* kva__rec_fingerprint() of the arena that wrote it */
	uint64_t key[2];
	uint64_t length;        /* data bytes (the block's bytes) */
	uint64_t data_hash;     /* XXH3-64 of the data */
	uint64_t seq;           /* the writer's order: the newer of two wins at restart */
	uint64_t hdr_hash;      /* XXH3-64 of the fields above */
};

enum { KVA__F_FREE = 0, KVA__F_POSTED = 1, KVA__F_BUSY = 2, KVA__F_DONE = 3, KVA__F_FAILED = 4 };
#define KVA__F_TICKET_MASK 0x0fffffffu
static inline uint32_t kva__f_word(uint32_t kind, uint32_t ticket)
{
	return kind << 28 | (ticket & KVA__F_TICKET_MASK);
}
static inline uint32_t kva__f_kind(uint32_t w) { return w >> 28; }
static inline uint32_t kva__f_ticket(uint32_t w) { return w & KVA__F_TICKET_MASK; }

/* why a request FAILED, in its result word (with the tier in bits 8..9 on DONE) */
enum { KVA__FR_OK = 0, KVA__FR_STALE = 1, KVA__FR_IO = 2, KVA__FR_VERIFY = 3, KVA__FR_DEST = 4,
       KVA__FR_DEGRADED = 5, KVA__FR_BAD = 6 };

/*
 * A request's block carries the request in its meta (bmeta.key: the key
 * asked for; bmeta.backing: this tag, never a location), written by the
 * requester before it shares the block for the agent; the agent writes
 * into a block only if its meta names the very request it serves. A
 * request of an earlier life of the slot, served late, finds another tag
 * (the ticket has the generation in it), whatever the block's epoch says.
 */
static inline uint64_t kva__fetch_tag(uint32_t slot, uint32_t ticket)
{
	return 1ull << 63 | (uint64_t)(slot & 0xff) << 32 | (ticket & KVA__F_TICKET_MASK);
}

struct kva__fitem {
	_Atomic uint32_t state;
	_Atomic uint32_t dest;
	_Atomic uint32_t dest_epoch;
	_Atomic uint32_t result;       /* agent: KVA__FR_* | tier << 8 */
	_Atomic uint64_t key[2];
	_Atomic uint64_t loc;          /* worker: where; agent, on DONE: where it was served from */
	_Atomic uint64_t posted_ns;    /* CLOCK_MONOTONIC at posting: the agent's latency figure */
	_Atomic uint64_t data_hash;    /* agent, on DONE: what the block's bytes must hash to */
	uint64_t pad;
};

/*
 * Latency histograms: log-linear, four buckets a power of two, up to ~8 s.
 * kva__hist_value is the smallest value of a bucket.
 */
#define KVA__HIST_N 128u
static inline unsigned kva__hist_bucket(uint64_t ns)
{
	unsigned lg, b;

	if (ns < 4)
		return (unsigned)ns;
	lg = 63 - (unsigned)__builtin_clzll(ns);
	b = (lg - 1) * 4 + (unsigned)((ns >> (lg - 2)) & 3);
	return b < KVA__HIST_N ? b : KVA__HIST_N - 1;
}
static inline uint64_t kva__hist_value(unsigned b)
{
	return b < 4 ? b : (uint64_t)(4 + b % 4) << (b / 4 - 1);
}

#define KVA__FETCH_ITEMS 128u

/*
 * One slot's fetch requests. done: a count the agent bumps (release) after
 * finishing any of the slot's requests, and FUTEX_WAKEs if waiting is set;
 * a waiting worker sets waiting, re-checks its requests, and sleeps on done
 * (a Dekker pair with the agent's bump-then-read of waiting). Written by the
 * slot's worker (items it owns, waiting) and the agent (done, item results).
 */
#define KVA__REJECTS 4u
struct kva__fetch_area {
	alignas(64) _Atomic uint32_t done;
	_Atomic uint32_t waiting;
	/* the worker: the last records it found corrupt (locations, 0: none),
	 * for the agent to drop; its host-tier copies' latencies */
	alignas(64) _Atomic uint64_t reject[KVA__REJECTS];
	_Atomic uint32_t reject_next;
	_Atomic uint64_t host_hist[KVA__HIST_N];
	alignas(64) struct kva__fitem item[KVA__FETCH_ITEMS];
};

/* An arena mapping in this process. Everything here is private memory. */
struct kva_arena {
	struct kva__header hdr;      /* validated private copy */
	struct kva_arena_info info;
	int meta_fd, data_fd;        /* data_fd: -1 for a GPU arena */
	uint8_t *meta;
	uint8_t *data;               /* a GPU arena: a device address (NULL for an
				      * observer, which maps no device memory) */
	struct kva__dev *dev;        /* a GPU arena's mapping (devmem.c); else NULL */
	size_t data_map_bytes;
	bool readonly;               /* an observer's mapping: PROT_READ only */
	struct kva__pool *pool;
	struct kva__slot *slots;
	_Atomic uint64_t *desc;
	_Atomic uint64_t *l0;
	_Atomic uint64_t *l1;
	struct kva__pentry *idx;
	struct kva__bmeta *bmeta;
	_Atomic uint64_t *dirty;     /* l0_words words */
	_Atomic uint64_t *dsum;      /* l1_words words */
	struct kva__fetch_area *fetch; /* max_workers of them */
	uint64_t idx_mask;           /* idx_entries - 1 */
	uint32_t blocks, l0_words, l1_words, max_workers;
};

/*
 * What one worker holds of one block, in that worker's memory (c.held[id]):
 * 0 not held; KVA__HELD_EXCL held exclusively (the descriptor says OWNED by
 * us); n in 1..KVA__HELD_MAXREF we hold n references to a shared block (the
 * descriptor has our holder bit). A block in our cache is 0 here and OWNED by
 * us in the descriptor. KVA__HELD_PENDING marks ids inside a kva_free() or
 * kva_share() call.
 */
#define KVA__HELD_PENDING 0x40000000u
#define KVA__HELD_MAXREF 0x3fffffffu

/* how many of the blocks it gave back last a worker remembers (a power of 2) */
#define KVA__RECENT 1024u

struct kva_worker {
	struct kva_worker_cache c; /* first: the inline fast path's view */
	struct kva_arena *arena;
	struct kva__slot *slot;
	struct kva__pool *pool;     /* arena->pool: one load less on the slow paths */
	_Atomic uint64_t *desc;
	uint32_t slot_id;
	uint32_t gen;
	uint64_t owner_payload;    /* kva__owner_tag(slot_id, gen) */
	uint64_t holder_bit;       /* 1 << slot_id */
	uint64_t slot_word;        /* our LIVE state word; changes only if reclaimed */
	uint32_t cursor;           /* the block after our last claim */
	/* pool.c: l0 word snap_word (at or after the cursor) as we last read
	 * it, less what we claimed from it since and below the cursor: where
	 * the uncached claim looks first (a hint, like l0 itself; the
	 * descriptor's CAS decides). snap_bits 0: none */
	uint32_t snap_word;
	uint64_t snap_bits;
	_Atomic uint64_t *l0;      /* arena->l0 */
	/* pool.c: the blocks we gave back to the arena last (kept while we
	 * have no cache), newest at
	 * recent[(recent_top - 1) % KVA__RECENT]: where the uncached claim
	 * looks before the snapshot (a hint too: they are FREE to everyone,
	 * and the descriptor's CAS decides). Ours alone, in our memory: a
	 * death leaves nothing of it to repair. recent_len 0: none */
	uint32_t recent_top, recent_len;
	uint32_t sweep_pos, sweep_left; /* prefix/evict.c: our share of the hand not yet seen */
	uint64_t *ranks;           /* prefix/evict.c: ranks a threshold is computed from */
	uint32_t probe;            /* slow allocs until we try a refill under pressure */
	uint64_t shares, refills, flushes;
	/* set by kva_attach: what leaving must also undo (the agent connection,
	 * the mapping); the arena itself knows nothing of the agent */
	/* prefix/fetch.c: the doorbell of the agent's tier thread (-1: none; set
	 * by kva_attach), and our fetch requests' private state (one malloc) */
	int doorbell;
	struct kva__fetcher *fetcher;
	/* the host tier, mapped read-only (set by kva_attach; NULL: none) */
	const uint8_t *host_map;
	uint64_t host_bytes;
	uint64_t rec_fp;           /* kva__rec_fingerprint of our arena */
	void (*on_leave)(struct kva_worker *w, void *ctx);
	void *on_leave_ctx;
	uint32_t recent[KVA__RECENT]; /* last: 4 KiB, the ring of recent_top */
};

/*
 * Crash points: in the test build of the library (KVA_CRASH_POINTS), a test
 * process can make itself die by SIGKILL the n-th time it passes one of these
 * places, each the middle of a multi-step change to shared memory, or have a
 * function of its own called there (to stop the process or hold the thread
 * while another does something in between). In the real library they
 * compile to nothing.
 */
enum kva__crash_point {
	KVA__CP_NONE = 0,
	KVA__CP_CLAIM_CAS,        /* claimed a block, its hint bit not yet cleared */
	KVA__CP_RELEASE_STORE,    /* descriptor FREE, its hint bit not yet set */
	KVA__CP_HINT_L0,          /* l0 bits set, l1 not yet */
	KVA__CP_SUMMARY_CLEAR,    /* l1 bit cleared, l0 not yet re-checked */
	KVA__CP_SHARE_JOIN,       /* holder bit set, private count not yet */
	KVA__CP_SHARE_EXCL,       /* own block made shared, private count not yet */
	KVA__CP_DROP_LAST,        /* last holder took the block back, not yet freed */
	KVA__CP_JOIN_CLAIMED,     /* slot JOINING, not yet LIVE */
	KVA__CP_LEAVE_RELEASE,    /* half-way through giving everything back */
	KVA__CP_RECLAIM_SWEEP,    /* reclaimer half-way through the sweep */
	KVA__CP_INDEX_BUSY,       /* index entry claimed BUSY, key not yet written */
	KVA__CP_PUBLISH_INDEXED,  /* entry VALID, the block not yet PUB */
	KVA__CP_MATCH_JOINED,     /* holder bit of a matched block set, held[] not yet */
	KVA__CP_EVICT_TAKEN,      /* cached block taken, its index entry not yet removed */
	KVA__CP_MATCH_LOOKED_UP,  /* index entry found, its block not yet joined */
	KVA__CP_PUBLISH_COUNTED,  /* room for a publication counted, nothing indexed yet */
	KVA__CP_RECLAIM_LEASED,   /* a reclaimer holds the slot's lease, nothing done yet */
	KVA__CP_COUNT
};
#ifdef KVA_CRASH_POINTS
void kva__crash_point(enum kva__crash_point p);
void kva__crash_arm(enum kva__crash_point p, uint32_t nth);
/* @fn(@p, @arg) each time any thread of this process passes @p; NULL: none */
typedef void kva__crash_hook_fn(enum kva__crash_point p, void *arg);
void kva__crash_hook(enum kva__crash_point p, kva__crash_hook_fn *fn, void *arg);
#define KVA__CRASH_POINT(p) kva__crash_point(p)
#else
#define KVA__CRASH_POINT(p) ((void)0)
#endif

/* meta.c: the region layout and the header */
struct kva__meta_layout {
	uint64_t pool_off, slots_off, desc_off, l0_off, l1_off, idx_off, bmeta_off, meta_bytes;
	uint64_t dirty_off, dsum_off, fetch_off;
	uint64_t idx_entries;
	uint32_t l0_words, l1_words;
};
/* the largest tier_keys an arena takes: 2^32 records (a location's slot) */
#define KVA__TIER_KEYS_MAX 0xffffffffull
void kva__meta_layout(uint32_t blocks, uint32_t max_workers, uint64_t tier_keys,
		      struct kva__meta_layout *m);
uint64_t kva__header_checksum(const struct kva__header *h);
int kva__header_validate(const struct kva__header *h, uint64_t meta_size, uint64_t data_size);

/* region.c: the OS layer (memfd, seals, mapping, NUMA) */
int kva__region_create(const char *name, uint64_t bytes, bool hugetlb, int *fd_out,
		       uint64_t *mapped_bytes);
int kva__region_seal(int fd);
int kva__region_seals_ok(int fd);
int kva__region_size(int fd, uint64_t *bytes);
int kva__region_map(int fd, uint64_t bytes, bool readonly, void **addr);
int kva__region_bind_node(void *addr, uint64_t bytes, int node);
int kva__region_advise_huge(void *addr, uint64_t bytes);
int64_t kva__region_huge_bytes(const void *addr);
void kva__thp_shmem(char *out, size_t len);
int kva__pid_start_time(pid_t pid, uint64_t *start_time, char *state);
bool kva__pid_gone(pid_t pid, uint64_t start);
/* the liveness of slot state word @st, whose start word is @start */
static inline bool kva__slot_holder_gone(uint64_t st, uint64_t start)
{
	return kva__pid_gone(kva__slot_pid(st), kva__start_for(start, kva__slot_gen(st)));
}

/* pool.c: the free-block pool shared by all workers */
uint32_t kva__pool_claim(struct kva_worker *w, uint32_t want, uint32_t *ids);
bool kva__pool_claim_one(struct kva_worker *w, uint32_t *id);
void kva__pool_release(struct kva_worker *w, const uint32_t *ids, uint32_t n);
void kva__hint_set(struct kva_arena *a, uint32_t word, uint64_t bits);

/*
 * What follows is pool.c's too, inline here for the uncached alloc and free
 * (alloc.c), where a call is a fair part of the cost; pool.c explains the
 * hint bits and why each order is what it is.
 */

/* the claim: FREE -> OWNED by us, one CAS (pool.c: claim_word) */
static inline bool kva__claim_desc(struct kva_worker *w, uint32_t id)
{
	uint64_t d = atomic_load_explicit(&w->desc[id], memory_order_relaxed);

	/* acquire: the block's previous owner wrote its data before the
	 * release store that made it FREE; we read and overwrite after */
	return kva__d_kind(d) == KVA__D_FREE &&
	       atomic_compare_exchange_strong_explicit(
		       &w->desc[id], &d,
		       kva__d_make(KVA__D_OWNED, kva__d_epoch(d), w->owner_payload),
		       memory_order_acquire, memory_order_relaxed);
}

/*
 * kva__hint_set_inline - kva__hint_set(): mark @bits of l0 word @i "may be
 * free", after the blocks' descriptors were made FREE. The fetch_or is a
 * release a claimer's or clearer's RMW on the word acquires; the l1 part
 * pairs with pool.c's summary_clear() (all seq_cst).
 */
static inline void kva__hint_set_inline(struct kva_arena *a, uint32_t i, uint64_t bits)
{
	uint64_t bit = 1ull << (i % 64);

	atomic_fetch_or_explicit(&a->l0[i], bits, memory_order_seq_cst);
	KVA__CRASH_POINT(KVA__CP_HINT_L0);
	if (!(atomic_load_explicit(&a->l1[i / 64], memory_order_seq_cst) & bit))
		atomic_fetch_or_explicit(&a->l1[i / 64], bit, memory_order_seq_cst);
}

void kva__pool_lookahead(struct kva_worker *w, uint32_t i);

/*
 * kva__pool_claim_recent - the uncached claim's first try: the block we
 * gave back last, and one CAS. Its descriptor line is in our cache and its
 * hint bit set (the release set it), so taking it back
 * touches nothing another worker is likely to have touched since: what a
 * LIFO free list gives, with no list in shared memory. The ring is only a
 * hint: the blocks in it are FREE, in l0, to every worker, and one that
 * another took fails the CAS; then the rest of the ring is likely as old,
 * and we forget it. false: ask the snapshot.
 */
static inline bool kva__pool_claim_recent(struct kva_worker *w, uint32_t *id_out)
{
	uint32_t id;

	if (!w->recent_len)
		return false;
	id = w->recent[--w->recent_top % KVA__RECENT];
	w->recent_len--;
	if (!kva__claim_desc(w, id)) {
		w->recent_len = 0;
		return false;
	}
	KVA__CRASH_POINT(KVA__CP_CLAIM_CAS);
	*id_out = id;
	return true;
}

/* kva__pool_recent_push - remember block @id, just given back, for
 * kva__pool_claim_recent(); the oldest falls out of a full ring */
static inline void kva__pool_recent_push(struct kva_worker *w, uint32_t id)
{
	w->recent[w->recent_top++ % KVA__RECENT] = id;
	if (w->recent_len < KVA__RECENT)
		w->recent_len++;
}

/*
 * kva__pool_claim_snap - the uncached claim's second try: the first bit of
 * our own snapshot of an l0 word at or after the cursor (w->snap_word,
 * w->snap_bits), and one CAS. The snapshot is a hint, as l0 is: a stale bit
 * fails the CAS, and a bit it lacks is found when kva__pool_claim_one()
 * reads l0 again; the descriptor decides, and the CAS's acquire pairs with
 * the release store that made the block FREE. When the snapshot runs out,
 * kva__pool_lookahead() reads the next word l1 points to and asks for its
 * first candidate's descriptor line, so that the next claim's CAS finds it
 * on its way. false: ask kva__pool_claim_one().
 */
static inline bool kva__pool_claim_snap(struct kva_worker *w, uint32_t *id_out)
{
	uint64_t bits = w->snap_bits;
	uint32_t i = w->snap_word, id;

	if (!bits)
		return false;
	id = i * 64 + (uint32_t)__builtin_ctzll(bits);
	if (unlikely(id >= w->c.blocks) || !kva__claim_desc(w, id)) {
		w->snap_bits = 0;
		return false;
	}
	KVA__CRASH_POINT(KVA__CP_CLAIM_CAS);
	w->snap_bits = bits &= bits - 1;
	w->cursor = id + 1 < w->c.blocks ? id + 1 : 0;
	*id_out = id;
	if (!bits)
		kva__pool_lookahead(w, i);
	return true;
}

/*
 * kva__pool_release_one - give back one block @w owns and nobody holds: its
 * descriptor FREE (epoch bumped), then its hint bit (pool.c:
 * kva__pool_release), and we remember it for kva__pool_claim_recent(). A
 * descriptor that does not say OWNED by us is left alone: that can only mean
 * our slot was reclaimed under us.
 */
static inline void kva__pool_release_one(struct kva_worker *w, uint32_t id)
{
	uint64_t d = atomic_load_explicit(&w->desc[id], memory_order_relaxed);

	if (unlikely((d & ~(KVA__D_EPOCH_MASK << KVA__D_EPOCH_SHIFT)) !=
		     kva__d_make(KVA__D_OWNED, 0, w->owner_payload)))
		return;
	/* release: the block's data written so far happens-before the next
	 * owner's claim (its acquire CAS) */
	atomic_store_explicit(&w->desc[id], kva__d_next_free(d), memory_order_release);
	KVA__CRASH_POINT(KVA__CP_RELEASE_STORE);
	kva__hint_set_inline(w->arena, id / 64, 1ull << (id % 64));
	kva__pool_recent_push(w, id);
}

/* error.c */
int kva__err(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kva__err_clear(void);
/* while held (calls nest), kva__err() and kva__err_clear() leave the message
 * alone: around the cleanup after a failure, whose cause is the message */
void kva__err_hold(bool on);

/* alloc.c */
int kva__worker_check_live(struct kva_worker *w);
void kva__cache_publish(struct kva_worker *w);
void kva__worker_release_all(struct kva_worker *w);
int kva__cache_resize(struct kva_worker *w, uint32_t cap);

/* worker.c */
void kva__slot_name(struct kva__slot *s, char out[32]);
void kva__name_copy(char *out, size_t size, const char *name);
void kva__slot_retire_counters(struct kva_arena *a, struct kva__slot *s);

/*
 * The prefix room (prefix/: the index, eviction, sequences) as the core calls
 * it: allocation under pressure evicts, reclaim settles what a dead worker
 * left half-done there, and the check reads it. The room's own interface is
 * prefix/prefix_pvt.h; the core knows nothing else of it, and nothing of the
 * tiers (tiers/).
 */
uint32_t kva__evict(struct kva_worker *w, uint32_t want, uint32_t *ids);
uint32_t kva__pub_settled(struct kva_arena *a, uint32_t slot, uint32_t gen, uint64_t word);
void kva__index_reclaim_busy(struct kva_arena *a, uint32_t slot);
/* kva_arena_check's prefix half: every published block findable under its
 * key, every VALID entry naming a published block */
struct kva_check_report;
void kva__prefix_check_block(struct kva_arena *a, uint32_t id, uint64_t d,
			     struct kva_check_report *r);
void kva__prefix_check_index(struct kva_arena *a, struct kva_check_report *r);
/* recover.c: a problem found by the check, counted by the caller */
void kva__check_problem(struct kva_check_report *r, int64_t block, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* agentside.c: what the agent, which owns the arena, does to it. It alone
 * calls these; it decides from its own table, never from shared memory. */
int kva__slot_reserve_at(struct kva_arena *a, uint32_t slot, pid_t pid, uint32_t *gen,
			 uint64_t *start);
void kva__slot_restore(struct kva_arena *a, uint32_t slot, uint64_t word, uint64_t start);
uint64_t kva__slot_start_of(pid_t pid, uint32_t gen);
int kva__reclaim_life(struct kva_arena *a, uint32_t slot, uint32_t gen,
		      struct kva_reclaim_report *r);
/* The words only the agent writes, as it last wrote them. */
struct kva__agent_words {
	uint8_t header[KVA__HEADER_BYTES];
	uint32_t agent_state, policy, tiers;
	int32_t agent_pid;
	uint64_t cache_limit, pub_fix;
	uint32_t quota_kind[KVA_OWNER_KINDS];
	uint32_t quota_tenant[KVA_MAX_TENANT_QUOTAS][2];
};
void kva__agent_words_save(struct kva_arena *a, struct kva__agent_words *w);
unsigned kva__agent_words_repair(struct kva_arena *a, const struct kva__agent_words *w,
				 char *what, size_t len);
uint32_t kva__repair_hints(struct kva_arena *a);
void kva__view_set_slot(struct kva_arena *a, uint32_t slot, uint32_t state, uint32_t gen,
			int32_t pid, uint32_t uid, uint32_t pending_ms);
void kva__view_set(struct kva_arena *a, uint64_t repairs, const char *last_repair,
		   uint32_t pending);
void kva__view_set_device(struct kva_arena *a, uint64_t free_bytes, uint64_t total_bytes);

/* blockio.c: a block's contents. Its pieces are its K, V (and scale) spans
 * in the data region, in canonical order (kva_block_read); one for
 * block-major, 2 x layers (x 2 with scales) for layer-major. */
struct kva__piece {
	uint64_t off, len;      /* in the data region */
};
/* piece @i of block @block; false past the last */
bool kva__block_piece_at(const struct kva_arena_info *info, uint32_t block, uint32_t i,
			 struct kva__piece *p);
/* block @from's contents into block @to, wherever the arena lives; -EIO */
int kva__block_copy(struct kva_arena *a, uint32_t to, uint32_t from);

/* arena.c */
int kva__arena_prefault(struct kva_arena *a);
void kva__arena_pages(const struct kva_arena *a, char *buf, size_t len);
/* a GPU arena's metadata alone (its worker imports the data next, and
 * gives it with kva__arena_set_dev); -EPROTO if the arena is not a GPU's */
struct kva__dev;
struct kva__dev_geom;
int kva__arena_open_meta(int meta_fd, unsigned flags, struct kva_arena **out);
void kva__arena_geom(const struct kva_arena *a, struct kva__dev_geom *g);
void kva__arena_set_dev(struct kva_arena *a, struct kva__dev *d);

/* recover.c */
int kva__reclaim_as(struct kva_arena *a, uint32_t slot, uint32_t gen, bool vouched,
		    struct kva_reclaim_report *r);

/* A slot whose worker may hold blocks. */
static inline bool kva__slot_joined(uint64_t state)
{
	return kva__slot_kind(state) == KVA_SLOT_JOINING || kva__slot_kind(state) == KVA_SLOT_LIVE;
}

#endif /* KVA_ARENA_PVT_H */
