/* SPDX-License-Identifier: MIT */
/*
 * tiers_pvt.h - the tier room's insides: the host tier's memory (host.c),
 * the disk tier's file and io_uring (disk.c, its superblock in super.c), and
 * the thread that runs them (engine.c). The record format they share with
 * the workers is in arena_pvt.h and prefix/record.c.
 *
 * The disk tier's file: a superblock in [0, 4096) (struct tier_super),
 * then records of record_bytes each, slot i at 4096 + i * record_bytes.
 */
#ifndef KVA_TIERS_PVT_H
#define KVA_TIERS_PVT_H

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "prefix_pvt.h"
#include "tiers.h"

#define TIER_ALIGN KVA__REC_ALIGN
#define TIER_HDR_BYTES KVA__REC_HDR_BYTES
#define TIER_SUPER_MAGIC 0x3152454954415641ull /* "AVATIER1" little-endian */
#define TIER_FORMAT KVA__REC_FORMAT
#ifndef RWF_DONTCACHE
#define RWF_DONTCACHE 0x00000080 /* uncached buffered I/O, Linux 6.14 */
#endif

struct tier_super {
	uint64_t magic;
	uint32_t format, super_bytes;
	uint64_t fingerprint, record_bytes, records, data_off;
	char arena[32];
	uint64_t hash;          /* XXH3-64 of the fields above */
};

/* super.c */
void tier_super_fill(struct tier_super *s, uint64_t fp, uint64_t record_bytes, uint64_t records,
		     const char *arena);
const char *tier_super_check(const struct tier_super *s);

/* fault injection (engine.c parses it; disk.c applies it) */
enum { INJ_WRITE_EIO, INJ_READ_EIO, INJ_WRITE_SHORT, INJ_READ_SHORT, INJ_WRITE_ENOSPC, INJ_N };
struct tier_inject {
	uint64_t from[INJ_N];   /* 0: off; else from the Nth operation on */
	bool nodirect;
	bool any;
};
int tier_inject_parse(const char *spec, struct tier_inject *inj, char *err, size_t len);

/* The agent's own truth about one record slot. */
enum { R_FREE = 0, R_VALID, R_WRITING, R_DEAD /* invalid: freed when its users are done */ };
#define TIER_NONE UINT32_MAX
struct tier_rec {
	uint64_t key[2];
	uint64_t seq;
	uint32_t gen;           /* KVA__LOC_GEN_MASK bits used */
	uint8_t state;
	uint8_t ref;            /* clock: used since the hand last passed */
	uint16_t users;         /* I/O in flight that reads (disk: fetches) or
				 * writes from (host: flushes) this record */
	uint32_t next_free;     /* host without disk: the free list */
	uint32_t other;         /* host: the disk record holding the same bytes (clean);
				 * disk: the host record it is a copy of; TIER_NONE */
};

/* One tier's private bookkeeping and counters. */
struct tier {
	bool on;
	bool ring;              /* host with a disk tier: a ring flushed to disk */
	struct tier_rec *rec;
	uint32_t n, used, hand, free_head;
	/* the ring: head is where the next copy goes (host), or the next
	 * record written (disk, a log); host: flush is the oldest record not
	 * yet written to disk, dirty how many of them there are, [flush, head) */
	uint32_t head, flush, dirty;
	uint64_t record_bytes;
	/* counters, copied to the arena's tier view */
	uint64_t hits, records_in, bytes_in, bytes_out, io_errors, verify_failed, stale, dropped;
	uint64_t hist[KVA__HIST_N];  /* fetch latencies (kva__hist_bucket) */
	bool degraded;
	uint64_t degraded_since, retry_at;
	char reason[96];
};

/* host.c */
struct host_mem {
	uint8_t *base;
	uint64_t bytes;
	int fd;
	bool hugetlb;
	int32_t node;
};
int host_mem_create(struct host_mem *h, uint64_t bytes, int32_t node, bool hugepages,
		    char *err, size_t len);
void host_mem_destroy(struct host_mem *h);

/* disk.c: the file and its ring. An operation in flight: */
enum { OP_DEMOTE = 1, OP_FETCH, OP_SCAN };
struct disk_op {
	uint8_t kind;
	bool staged;                 /* OP_FETCH: read whole into staging, then copied */
	uint32_t next_free;
	uint32_t rec;                /* the disk record slot read or written */
	uint32_t host_rec;           /* OP_DEMOTE: the first host record written from */
	uint32_t nrec;               /* OP_DEMOTE: how many, to as many disk records */
	uint64_t expect;             /* bytes the operation must move */
	/* OP_FETCH: the request being served */
	uint32_t slot, item, ticket, dest;
	uint64_t key[2], posted_ns, loc;
	struct iovec *iov;           /* this op's own iovec array */
	uint32_t niov;
};
struct disk {
	int fd, dirfd;
	char path[320];
	bool direct, prealloc, dontcache;
	uint32_t dio_mem, dio_off;
	uint64_t records, record_bytes, data_off;
	struct io_uring ring;
	bool ring_ok;
	int ring_efd;
	uint32_t qd, inflight;
	struct disk_op *ops;
	uint32_t free_op;
	struct iovec *regs;          /* the registered buffers: the host tier in pieces, staging */
	uint32_t n_regs, host_regs;
	uint8_t *staging;            /* qd x TIER_HDR_BYTES, then qd x record_bytes if needed */
	uint64_t staging_bytes;
	bool staged_reads;           /* the arena's pieces cannot take O_DIRECT reads */
	uint64_t ops_done[INJ_N];
	struct tier_inject inj;
	bool fresh;                  /* made new at start (no records of an earlier run) */
	uint64_t old_records;        /* records of the earlier run to scan */
};

int disk_open(struct disk *d, const struct tier_config *c, const struct kva_arena_info *info,
	      uint64_t fp, char *err, size_t len);
int disk_ring(struct disk *d, const struct host_mem *h, const struct kva_arena_info *info,
	      char *err, size_t len);
void disk_close(struct disk *d);

/* the engine (engine.c) */
struct tiers {
	struct tier_config cfg;
	struct kva_arena *a;
	struct kva_worker *self;
	const struct kva_arena_info *info;
	uint64_t fp, seq;
	struct tier t[KVA_TIERS];    /* host, disk */
	struct host_mem host;
	struct disk disk;
	int doorbell, ep, tfd;
	pthread_t thread;
	_Atomic bool stop;
	bool started;
	/* blocks we hold and could not let go of (our slot word scribbled):
	 * retried each round */
	uint32_t *unreleased;
	uint32_t n_unreleased, cap_unreleased;
	uint64_t backed, back_skipped, fetch_requests, fetch_failed, doorbells, forwarded;
	uint64_t scan_next, scan_done, restart_found, restart_dropped;
	bool warming;
	uint64_t last_view;
	struct kva__piece *pieces;   /* scratch for one block's pieces */
	uint32_t pieces_max;
	uint32_t demoting;           /* records being written to disk */
	uint64_t scan_last_seq;      /* warm restart: the newest record found, */
	uint32_t scan_last_slot;     /* and where: the log goes on after it */
	uint32_t serve_from;         /* the slot a round of requests starts at */
	bool view_now;               /* something ops tools should see at once */
	bool fetch_blocked;          /* requests wait for a free disk operation */
	uint64_t wake;               /* slots whose requests finished this round */
	bool probe_inflight;         /* the one write a degraded disk tier tries */
	/* a GPU arena: the tier thread's stream for its copies, and the host
	 * memory pinned for them (the host tier, the disk's staging) */
	struct kva__dev_queue *q;
	bool host_pinned, staging_pinned;
	uint64_t dev_errors;         /* device copies that failed */
};

void tier_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
enum { TLOG_ERR = 0, TLOG_WARN = 1, TLOG_INFO = 2, TLOG_DEBUG = 3 };

#endif /* KVA_TIERS_PVT_H */
