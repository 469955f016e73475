/* SPDX-License-Identifier: MIT */
/*
 * tiers.h - the tiers below the arena, as the agent runs them: a host DRAM
 * tier (T2, a memfd bound to a NUMA node) and a disk tier (T3, one
 * preallocated file, O_DIRECT, io_uring), served by one thread of the agent
 * (engine.c) that is a worker of its own arena.
 *
 * Linked into the agent (and kvarena-bench) only: liburing and libnuma are
 * this room's dependencies, and neither the allocator core nor the prefix
 * room knows it exists.
 */
#ifndef KVA_TIERS_H
#define KVA_TIERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvarena.h"

enum tier_direct { TIER_DIRECT_AUTO = 0, TIER_DIRECT_REQUIRE = 1, TIER_DIRECT_OFF = 2 };

struct tier_config {
	uint64_t host_bytes;         /* 0: no host tier */
	int32_t host_node;           /* bind the host tier to this NUMA node; -1: none */
	bool host_hugepages;         /* try huge pages first */
	char disk_dir[256];          /* "": no disk tier */
	uint64_t disk_bytes;
	enum tier_direct direct;
	uint32_t queue_depth;        /* io_uring queue depth */
	/* test-only fault injection (KVA_TIER_INJECT, said loudly in the log):
	 * "write-eio:N", "read-eio:N", "write-short:N", "read-short:N",
	 * "write-enospc:N" (from the Nth I/O of that kind on), "nodirect" */
	const char *inject;
};

/* what a record takes in either tier, for a block of @block_bytes */
uint64_t tiers_record_bytes(uint64_t block_bytes);
/* how many records the tiers of @c hold: the keys the arena's index keeps
 * room for (kva_arena_opts.tier_keys) */
uint64_t tiers_keys(const struct tier_config *c, uint64_t block_bytes);

struct tiers;

/*
 * tiers_start - set the tiers up (the host region, the disk file and its
 * warm restart, the io_uring and its registered buffers) and start their
 * thread, which works through @self, the agent's own worker of arena @a.
 * Every refusal is a sentence in @err (a memlock limit too low, O_DIRECT
 * required and not there, a file of another agent...). 0 or a negative
 * errno.
 */
int tiers_start(const struct tier_config *c, struct kva_arena *a, struct kva_worker *self,
		struct tiers **out, char *err, size_t errlen);
/* the doorbell workers ring (an eventfd, sent with their WELCOME) */
int tiers_doorbell(const struct tiers *t);
/* the host tier's memfd (workers get it read-only, to copy from), or -1 */
int tiers_host_fd(const struct tiers *t);
/* stop the thread (I/O in flight finishes first), free everything */
void tiers_stop(struct tiers *t);

/* log lines from the tier thread go through the agent's logger; @site is
 * the line's format (its call site, for rate limiting), @msg the line */
typedef void tiers_log_fn(int level, const char *site, const char *msg);
void tiers_set_log(tiers_log_fn *fn);

#endif /* KVA_TIERS_H */
