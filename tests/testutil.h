/* SPDX-License-Identifier: MIT */
/*
 * testutil.h - what the arena tests share: a small arena, a random workload
 * that writes and verifies block contents, and the exact comparison of every
 * worker's own view of its holdings with the descriptors.
 */
#ifndef KVA_TESTUTIL_H
#define KVA_TESTUTIL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvarena.h"

/* 16 tokens x 2 layers x 2 heads x 64 x f16: 16 KiB blocks */
struct kva_geometry tu_geometry(void);
struct kva_arena *tu_arena(uint32_t blocks, uint32_t cache, uint32_t max_workers);

/* Memory shared with forked children (MAP_SHARED | MAP_ANONYMOUS), zeroed. */
void *tu_shared_alloc(size_t bytes);
void tu_shared_free(void *p, size_t bytes);

/* Ids that workers shared, for others to take references on. */
#define TU_BOARD_SIZE 256
struct tu_board {
	_Atomic uint32_t ids[TU_BOARD_SIZE]; /* id + 1; 0 = empty */
	_Atomic uint32_t next;
	_Atomic uint32_t errors;             /* data found changed under a reference */
	_Atomic uint32_t unexpected;         /* a call failed in a way it must not */
	_Atomic uint64_t cross_shares;       /* references taken on others' blocks */
	_Atomic uint64_t ops;
};

/* What one worker holds, as it knows it, written where the checker reads it. */
struct tu_view {
	int32_t slot;     /* -1: no worker */
	uint32_t n;
	struct tu_hold {
		uint32_t id;
		uint32_t refs; /* TU_EXCL, TU_CACHED, or a shared reference count */
	} e[];
};
#define TU_EXCL 0xffffffffu
#define TU_CACHED 0xfffffffeu
size_t tu_view_bytes(uint32_t blocks);
void tu_view_capture(struct kva_worker *w, struct tu_view *v);

struct tu_mismatch {
	uint32_t leaked;       /* not free, and no worker knows it holds it */
	uint32_t double_owned; /* two workers, or an owner and holders */
	uint32_t refcount;     /* holder bits differ from the workers that hold it */
	uint32_t lost;         /* a worker holds it, the descriptor disagrees */
};
/* Compare every block with the views; true if they match exactly. */
bool tu_views_match(struct kva_arena *a, struct tu_view *const *views, uint32_t n,
		    struct tu_mismatch *m);

/* The random workload: one reference per entry. */
struct tu_ref {
	uint32_t id;
	uint32_t seq;   /* the stamp the block carried when we took the reference */
	bool excl;
};
struct tu_work {
	struct kva_worker *w;
	struct tu_board *board;
	struct tu_ref *refs;
	uint32_t n_refs, max_refs;
	uint32_t seq;
	uint64_t rng;
	uint64_t ops, enospc;
	_Atomic uint32_t *phase; /* where this worker is, for the crash histogram */
};
enum tu_phase { TU_IDLE, TU_ALLOC, TU_FREE, TU_SHARE_OWN, TU_SHARE_OTHER, TU_RECLAIM, TU_NPHASE };
extern const char *const tu_phase_name[TU_NPHASE];

void tu_work_init(struct tu_work *t, struct kva_worker *w, struct tu_board *b, uint32_t max_refs,
		  uint64_t seed);
void tu_work_step(struct tu_work *t);
/* Drop every reference, verifying data. */
void tu_work_drain(struct tu_work *t);
void tu_work_fini(struct tu_work *t);

uint64_t tu_rand(uint64_t *s);

/* Every cached block out of the arena: allocate all there is, free it.
 * Return: 0, or kva_free's error, -ENOMEM. */
int tu_evict_all(struct kva_worker *w);

/* fork(), and the child dies with this process (a failed test leaves no
 * worker running). */
pid_t tu_fork(void);

/* The slot that process @pid joined (or is joining), or -1. */
int tu_slot_of(struct kva_arena *a, pid_t pid);

/* A kvarena-agent process for a test, with its socket and log in a fresh
 * directory. */
struct tu_agent {
	pid_t pid;
	char dir[64];
	char socket[108];
	char log[128];
};
/* Start @path with --socket and --log-level debug, then @args (NULL-ended);
 * returns once it answers observers (0), or -ETIMEDOUT/-ECHILD. */
int tu_agent_start(struct tu_agent *ag, const char *path, const char *const *args);
/* the same, calling @pre_exec(@arg) in the agent's process before exec (limits) */
int tu_agent_start_ex(struct tu_agent *ag, const char *path, const char *const *args,
		      void (*pre_exec)(void *), void *arg);
/* Send @sig and wait up to @timeout_ms; *status is waitpid's. -ETIMEDOUT
 * (the agent is then killed). */
int tu_agent_stop(struct tu_agent *ag, int sig, int timeout_ms, int *status);
/* How many lines of the agent's log contain @needle. */
unsigned tu_agent_log_count(const struct tu_agent *ag, const char *needle);
/* Remove the agent's directory (its log included; kept with TU_KEEP_LOGS set). */
void tu_agent_cleanup(struct tu_agent *ag);
/* Run @argv, its stdout into @out (NUL-terminated, at most @len - 1 bytes);
 * returns its exit status, or -1. */
int tu_run(const char *const *argv, char *out, size_t len);

#endif
