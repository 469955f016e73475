/* SPDX-License-Identifier: MIT */
/*
 * kvarena_tiers.h - the tiers below the arena: cached blocks that eviction
 * takes out of the arena (T1) go down to host DRAM (T2) and NVMe (T3),
 * kept by the agent, and come back on a prefix hit. Included by kvarena.h.
 *
 * The prefix index is one index for all tiers: a key whose block left the
 * arena keeps its entry, which says where the copy is. kva_seq_match_tiers
 * says how many tokens matched in the arena and how many more are below; a
 * fetch brings those into fresh arena blocks of the sequence: a host
 * record is copied by the worker itself from a read-only mapping of the
 * host tier, a disk record is read by the agent straight into the worker's
 * block (io_uring, O_DIRECT), asynchronously. Nothing is used before it
 * verified against its key, the arena's geometry, its length and its
 * XXH3 checksum; a record that does not is dropped and counted, never
 * served. A fetch that fails or is cancelled just means a shorter match.
 *
 * Copies below are made by the agent ahead of eviction (it copies published
 * blocks to the host tier while they are still in the arena, the coldest
 * first, and writes the host tier to disk in sequential runs), so that a
 * worker's kva_alloc / kva_free and its evictions never wait for a copy or
 * an I/O: an evictor only writes where the copy is into the index entry.
 */
#ifndef KVARENA_TIERS_H
#define KVARENA_TIERS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kva_seq;
struct kva_arena;

struct kva_match {
	size_t tokens;            /* matched in the arena and attached (as kva_seq_match) */
	size_t below_tokens;      /* the tokens right after them whose blocks are below */
	size_t below_host_tokens; /* of them, in the host tier */
	size_t below_disk_tokens; /* and in the disk tier */
};

/*
 * kva_seq_match_tiers - kva_seq_match, and how much more a fetch could
 * bring. kva_seq_match records the same (a fetch may follow either).
 */
int kva_seq_match_tiers(struct kva_seq *s, const int32_t *tokens, size_t n, struct kva_match *m);

/* What a fetch brought; filled by poll, wait and cancel once it is over. */
struct kva_fetch_result {
	size_t tokens;           /* the sequence's length now: matched plus fetched */
	size_t fetched_tokens;   /* of them, brought up by this fetch */
	uint32_t host_blocks;    /* blocks read from the host tier and attached */
	uint32_t disk_blocks;    /* ... from the disk tier */
	uint32_t failed_blocks;  /* not served: gone, did not verify, I/O error, cancelled */
	uint32_t orphan_blocks;  /* served after a block that was not: published, not attached */
	uint64_t ns;             /* from start to the end */
};

/*
 * kva_seq_fetch_start - bring up to @max_tokens (0: all) of what the last
 * match found below into fresh blocks (allocated and counted against the
 * sequence's quotas now), in order, through the agent. Right after a match
 * only (-EBUSY if the sequence moved since); reserve is allowed while it
 * runs, append, fork and match are not. Never waits for I/O.
 * Return: 0; -ENODATA (nothing below); -EBUSY; -ENOTCONN (no agent: the
 * worker was not attached with kva_attach); -ENOSPC / -EDQUOT (the blocks);
 * -ESTALE, -ESHUTDOWN.
 */
int kva_seq_fetch_start(struct kva_seq *s, size_t max_tokens);

/*
 * kva_seq_fetch_poll - collect what the agent finished, without waiting.
 * 0: the fetch is over, @r (may be NULL) says what it brought, and the
 * sequence's blocks and length include it (each fetched block is published
 * again, so the next match finds it in the arena); -EINPROGRESS: not yet.
 */
int kva_seq_fetch_poll(struct kva_seq *s, struct kva_fetch_result *r);

/*
 * kva_seq_fetch_wait - poll, sleeping (on a futex in shared memory) until
 * the fetch is over or @timeout_ms passed (-1: no limit). 0 as poll;
 * -ETIMEDOUT: still in flight (wait again, or cancel).
 */
int kva_seq_fetch_wait(struct kva_seq *s, int timeout_ms, struct kva_fetch_result *r);

/*
 * kva_seq_fetch_cancel - end the fetch now: the blocks served so far, in
 * order from the first, are kept; the rest are given up (a block the agent
 * is still writing is freed when it is done with it). Returns 0 and fills
 * @r; -EINVAL if no fetch is in flight.
 */
int kva_seq_fetch_cancel(struct kva_seq *s, struct kva_fetch_result *r);

/* ------------------------------------------------------- ops tools */

/*
 * kva_tier_record_bytes - what one block takes in either tier (a 4 KiB
 * header, then the block's bytes padded to 4 KiB): to size --host-bytes and
 * --disk-bytes for a number of blocks.
 */
uint64_t kva_tier_record_bytes(uint64_t block_bytes);

enum kva_tier_id { KVA_TIER_HOST = 0, KVA_TIER_DISK = 1, KVA_TIERS = 2 };

/* One tier, as the agent reports it (kva_arena_tier_stats). */
struct kva_tier_stats {
	int enabled;
	int degraded;             /* I/O failed: no new writes until a retry works */
	int direct;               /* disk: O_DIRECT (else buffered, said in the log) */
	int hugetlb;              /* host: on huge pages */
	int preallocated;         /* disk: the file's blocks are allocated */
	int warming;              /* disk: records of a previous run still being scanned */
	int32_t numa_node;        /* host: -1 none */
	uint32_t queue_depth;     /* disk: io_uring queue depth */
	uint64_t capacity_records, used_records, record_bytes;
	uint64_t hits;            /* blocks fetched from this tier into the arena */
	uint64_t records_in;      /* records written into this tier */
	uint64_t bytes_in, bytes_out;
	uint64_t fetch_p50_ns, fetch_p99_ns; /* request posted to block served */
	uint64_t io_errors;       /* failed or short reads and writes, ENOSPC */
	uint64_t verify_failed;   /* records that did not verify: dropped, never served */
	uint64_t stale;           /* fetches of a record since replaced */
	uint64_t dropped;         /* records given up: the tier full, nothing below it */
	uint64_t restart_found;   /* disk: records found valid at a warm restart */
	uint64_t restart_dropped; /* disk: and found invalid */
	uint64_t scan_done, scan_total; /* disk: the warm restart's progress */
	uint64_t degraded_ms;     /* how long it has been degraded */
	char reason[96];          /* why it is degraded (or was last) */
	char path[128];           /* disk: the tier file */
};

struct kva_tiers_stats {
	struct kva_tier_stats tier[KVA_TIERS];
	uint64_t backed;          /* published blocks copied below while in the arena */
	uint64_t back_skipped;    /* published blocks not copied (gone before the agent came) */
	uint64_t unbacked_evictions; /* cached blocks evicted without a copy below: lost */
	uint64_t below_found;     /* full blocks matches found below */
	uint64_t fetched, fetch_failed; /* blocks brought up / not */
	uint64_t fetch_requests;  /* requests the agent took */
	uint64_t spilled_host, spilled_disk; /* index entries naming a copy below */
};

/*
 * kva_arena_tier_stats - what the agent reports of its tiers, and what the
 * workers count. An arena without tiers gives zeros. -EINVAL on NULL.
 */
int kva_arena_tier_stats(struct kva_arena *a, struct kva_tiers_stats *st);

#ifdef __cplusplus
}
#endif

#endif /* KVARENA_TIERS_H */
