/* SPDX-License-Identifier: MIT */
/*
 * demo.h - what kvarena-demo's parent (kvarena-demo.c) and its engine
 * processes (demo_engine.c) share: the workload's shape, the table in shared
 * memory, and the system prompt's bytes, which both sides compute from the
 * seed. The arena itself is kvarena-agent's: each side attaches to it on its
 * own.
 */
#ifndef KVA_DEMO_H
#define KVA_DEMO_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "kvarena.h"

#define BLOCK_TOKENS 16u
#define PROMPT_BLOCKS 32u      /* the shared system prompt: 512 tokens */
#define SEQS_PER_ENGINE 8u     /* sequences one engine decodes together */
#define USER_TOKENS_MIN 100u   /* prompt tokens after the system prompt */
#define USER_TOKENS_MAX 3000u
#define OUTPUT_TOKENS_MIN 20u
#define OUTPUT_TOKENS_MAX 400u
#define FORK_PERCENT 10u       /* requests that ask for a second sample */

/* An engine's running totals; the names of the report's columns. */
enum counter {
	C_REQUESTS,     /* requests whose first sample finished */
	C_TOKENS,       /* tokens decoded, preempted work included */
	C_BLOCKS,       /* blocks taken with kva_alloc */
	C_PREFIX_REFS,  /* references taken with kva_share */
	C_FORKS,        /* second samples started by sharing a sequence's blocks */
	C_WAITS,        /* requests that found the arena full and had to wait */
	C_PREEMPTIONS,  /* decoding sequences that found it full and were put back */
	C_DATA_ERRORS,  /* blocks whose contents were not what was written */
	C_API_ERRORS,   /* library calls that failed in a way they must not, and
			 * the agent stopping or going away during the run */
	C_LEAKED,       /* blocks still held when leaving: kva_worker_leave() would
			 * return them, and hide that the engine lost track of them */
	C_N,
};

/*
 * One per engine. Written only by that engine: the counters once per decode
 * step, from its private totals (plain stores, no read-modify-write, since
 * there is one writer). Read by the parent for the progress line and the
 * report. Relaxed both ways: each counter is read on its own and publishes
 * nothing else. If the engine dies half-way through a step, the counters
 * keep the totals of its last whole step.
 */
struct engine_cell {
	_Alignas(64) _Atomic uint64_t count[C_N];
	/* slot (from kva_attach), then joined with release; the parent reads
	 * slot after an acquire load of joined */
	int32_t slot;
	_Atomic uint32_t joined;
};

/*
 * The memory the parent shares with the engines (MAP_SHARED | MAP_ANONYMOUS,
 * made before the fork; the arena is not in it). The parent writes
 * prompt_ids, then sets prompt_ready with release; an engine reads the ids
 * after its acquire load of prompt_ready. If the parent dies, the engines die with it
 * (PR_SET_PDEATHSIG), so no engine waits on a table nobody will fill.
 */
struct demo_shared {
	uint32_t prompt_ids[PROMPT_BLOCKS];
	_Atomic uint32_t prompt_ready;
	/* parent -> engines; relaxed: an engine only has to see it eventually,
	 * and the parent waitpid()s before it reads anything the engines wrote */
	_Atomic uint32_t stop;
	struct engine_cell cells[];
};

static inline void sleep_ns(long ns)
{
	struct timespec ts = { ns / 1000000000L, ns % 1000000000L };

	nanosleep(&ts, NULL);
}

/* splitmix64's finalizer: a good 64-bit mix, the same in every process */
static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The system prompt's bytes: word @j of block @k, from the run's seed alone,
 * so an engine can tell what the parent wrote without asking it. */
static inline uint64_t prompt_word(uint64_t seed, uint32_t k, uint64_t j)
{
	return mix64(seed * 0x9e3779b97f4a7c15ull + ((uint64_t)k << 40) + j);
}

/*
 * demo_engine_main - the body of engine process @index, forked from the
 * parent @parent: it closes @inherited (the parent's read-only observer
 * mapping, NULL if none), attaches to the agent at @socket as "engine-@index"
 * and serves until told to stop; never returns. Exit status 0 if every call
 * went as it must and every byte checked was right.
 */
_Noreturn void demo_engine_main(const char *socket, struct kva_arena *inherited,
				struct demo_shared *sh, unsigned index, uint64_t seed,
				pid_t parent);

/*
 * demo_ctl - run kvarena-ctl (@ctl: a path, or a name looked up in PATH)
 * with --socket @socket and the NULL-terminated arguments after it; its
 * output goes to the demo's as it is. Called by the parent only.
 * Return: 0 when it succeeded; otherwise -1, after saying on stderr why (it
 * could not be run, it failed, or it took over 10 s and was killed).
 */
int demo_ctl(const char *ctl, const char *socket, ...) __attribute__((sentinel));

#endif
