/* SPDX-License-Identifier: MIT */
/*
 * kvarena-demo - one kvarena-agent's arena shared by several serving-engine
 * processes, one of them SIGKILLed half-way, and nothing lost.
 *
 * The arena is the agent's (scripts/demo.sh starts one). The parent maps it
 * read-only with kva_observe() for its progress line and its checks, and
 * forks the engines; each engine attaches to the agent on its own with
 * kva_attach(), as a process that is not the demo's child would. The parent
 * attaches a worker too, as the holder of a 32-block system prompt that it
 * writes and shares; every request of every engine takes references on
 * those blocks (prefix sharing across processes) and allocates the rest of
 * its prompt and its output as it decodes, with continuous batching,
 * preemption on a full arena and occasional forks for parallel sampling, as
 * vLLM does.
 *
 * At --kill-at the parent SIGKILLs the engine holding the most blocks and
 * does not touch its slot: the agent sees the process die (a pidfd) and
 * takes back everything it held while the others keep serving. The parent
 * shows the block map as the death leaves it and again once the agent gave
 * the slot back, with kvarena-ctl, and measures how long that took. At the
 * end every engine frees what it holds and detaches, and the arena must be
 * exactly empty.
 *
 * Exit status: 0 if the arena check passed, every block is free, no data
 * was found changed and the killed engine's slot came back from the agent
 * with nothing of it left; 1 otherwise; 2 bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "demo.h"

#define MIN_BLOCKS 512u               /* room for the prompt and every engine's batch */
#define START_TIMEOUT_NS 10000000000ull  /* an engine attaches within this */
#define RECLAIM_TIMEOUT_NS 5000000000ull /* the agent gives a dead engine's slot back */
#define LEAVE_TIMEOUT_NS 10000000000ull  /* an engine frees everything and detaches */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* 1234567 -> "1.23M": numbers in the progress line keep their width */
static const char *human(char buf[16], double v)
{
	if (v >= 1e9)
		snprintf(buf, 16, "%.2fG", v / 1e9);
	else if (v >= 1e6)
		snprintf(buf, 16, "%.2fM", v / 1e6);
	else if (v >= 1e4)
		snprintf(buf, 16, "%.1fk", v / 1e3);
	else
		snprintf(buf, 16, "%.0f", v);
	return buf;
}

struct options {
	const char *socket;   /* the agent's */
	const char *ctl;      /* kvarena-ctl: a path, or a name looked up in PATH */
	unsigned workers;
	double seconds, kill_at;
	uint64_t seed;
};

struct engine_proc {
	pid_t pid;
	int32_t slot;
	uint32_t generation; /* of its slot while it held it: the agent's reclaim bumps it */
	bool alive;
	bool killed;
	int status;          /* waitpid() status once it is gone */
};

struct kill_record {
	bool done;
	unsigned engine;
	double at;              /* seconds into the run */
	int32_t slot;
	uint32_t held_owned;    /* what its slot held at the SIGKILL */
	uint32_t held_shared;
	bool returned;          /* the agent gave the slot back in time */
	double death_ms;        /* from the SIGKILL until waitpid() saw the engine gone */
	double reclaim_ms;      /* from the SIGKILL until the slot was seen free */
	bool all_returned;      /* ... and nothing of it is left in the arena */
};

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvarena-demo --socket PATH [--ctl PATH] [--workers N] [--seconds S]\n"
		"                    [--kill-at S] [--seed N]\n"
		"\n"
		"Serves a synthetic LLM workload from engine processes attached to the\n"
		"kvarena-agent at --socket, SIGKILLs one of them, lets the agent reclaim it\n"
		"and checks that nothing was lost. The arena is the agent's, and must be\n"
		"unused when the demo starts: block-major, %u tokens per block, at least %u\n"
		"blocks (scripts/demo.sh starts such an agent; its --blocks N sets the size).\n"
		"\n"
		"  --socket PATH  the agent's socket (required)\n"
		"  --ctl PATH     kvarena-ctl, run to show the agent's map and status\n"
		"                 (default: kvarena-ctl from PATH)\n"
		"  --workers N    engine processes (default 4, 4..%u; each takes a worker\n"
		"                 slot, and the parent one more)\n"
		"  --seconds S    length of the run (default 6)\n"
		"  --kill-at S    when to SIGKILL one engine (default half of --seconds)\n"
		"  --seed N       seed of the workload and of the system prompt's bytes\n"
		"                 (default 1)\n",
		BLOCK_TOKENS, MIN_BLOCKS, KVA_MAX_WORKERS - 1);
}

static int parse_options(int argc, char **argv, struct options *o)
{
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 'S' },
		{ "ctl", required_argument, NULL, 'c' },
		{ "workers", required_argument, NULL, 'w' },
		{ "seconds", required_argument, NULL, 's' },
		{ "kill-at", required_argument, NULL, 'k' },
		{ "seed", required_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool kill_given = false;
	char *end;
	int c;

	*o = (struct options){ .ctl = "kvarena-ctl", .workers = 4, .seconds = 6, .seed = 1 };
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		unsigned long long v;
		double d;

		errno = 0;
		switch (c) {
		case 'S':
			o->socket = optarg;
			break;
		case 'c':
			o->ctl = optarg;
			break;
		case 'w':
			v = strtoull(optarg, &end, 10);
			if (errno || *end || v < 4 || v > KVA_MAX_WORKERS - 1) {
				/* one slot is the parent's, holding the system prompt */
				fprintf(stderr, "kvarena-demo: --workers: 4..%u\n",
					KVA_MAX_WORKERS - 1);
				return -EINVAL;
			}
			o->workers = (unsigned)v;
			break;
		case 's':
		case 'k':
			d = strtod(optarg, &end);
			if (errno || *end || !(d > 0 && d <= 86400)) {
				fprintf(stderr, "kvarena-demo: --%s: seconds, above 0\n",
					c == 's' ? "seconds" : "kill-at");
				return -EINVAL;
			}
			if (c == 's') {
				o->seconds = d;
			} else {
				o->kill_at = d;
				kill_given = true;
			}
			break;
		case 'r':
			o->seed = strtoull(optarg, &end, 0);
			if (errno || *end) {
				fprintf(stderr, "kvarena-demo: --seed: a number\n");
				return -EINVAL;
			}
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvarena-demo: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return -EINVAL;
	}
	if (!o->socket || !*o->socket) {
		fprintf(stderr, "kvarena-demo: --socket PATH is required: the demo runs on a "
			"kvarena-agent (scripts/demo.sh starts one)\n");
		return -EINVAL;
	}
	if (!kill_given)
		o->kill_at = o->seconds / 2;
	if (o->kill_at >= o->seconds) {
		fprintf(stderr, "kvarena-demo: --kill-at %.3g must come before the end "
			"(--seconds %.3g)\n", o->kill_at, o->seconds);
		return -EINVAL;
	}
	return 0;
}

struct demo {
	struct options opt;
	struct kva_arena *obs;             /* read-only, from kva_observe() */
	struct kva_agent_info agent;
	struct kva_worker *prompt_holder;  /* the parent's slot, from kva_attach() */
	uint32_t prompt_ids[PROMPT_BLOCKS];
	uint32_t prompt_left;   /* blocks the parent still held before it left */
	unsigned parent_errors; /* the parent's calls that failed at the end */
	unsigned ctl_failures;  /* kvarena-ctl runs that failed */
	bool agent_lost;        /* the agent stopped or went away during the run */
	struct demo_shared *sh;
	size_t sh_bytes;
	struct engine_proc *engines;
	struct kill_record kill;
	bool tty;
	uint64_t t0;
	/* the progress line's rate, over the last interval */
	uint64_t last_tokens, last_ns;
};

static double elapsed_s(const struct demo *d)
{
	return (double)(now_ns() - d->t0) / 1e9;
}

static uint64_t total(const struct demo *d, enum counter c)
{
	uint64_t sum = 0;

	for (unsigned k = 0; k < d->opt.workers; k++)
		sum += atomic_load_explicit(&d->sh->cells[k].count[c], memory_order_relaxed);
	return sum;
}

/*
 * Every kvarena-ctl run goes through here, so that a failed one fails the
 * demo: the ops tool is part of what it shows. (A macro, since a variadic
 * function cannot pass its arguments on to another.)
 */
#define run_ctl(d, ...)                                                           \
	do {                                                                      \
		if (demo_ctl((d)->opt.ctl, (d)->opt.socket, __VA_ARGS__, (char *)NULL) < 0) \
			(d)->ctl_failures++;                                      \
	} while (0)

/*
 * arena_fits - the agent's arena is one this demo can run in and check:
 * the geometry the engines write, room for them, and nobody else in it (the
 * run ends by checking that it is exactly empty).
 */
static int arena_fits(struct demo *d)
{
	const struct kva_arena_info *info = kva_arena_info(d->obs);
	enum kva_agent_state state = kva_arena_agent(d->obs, NULL);
	struct kva_stats st;
	int ret;

	if ((ret = kva_arena_stats(d->obs, &st)) < 0) {
		fprintf(stderr, "kvarena-demo: kva_arena_stats: %s\n", strerror(-ret));
		return ret;
	}
	if (state != KVA_AGENT_RUNNING) {
		fprintf(stderr, "kvarena-demo: the agent is %s\n",
			state == KVA_AGENT_STOPPING ? "stopping" : "not running");
		return -ESHUTDOWN;
	}
	if (info->geometry.layout != KVA_LAYOUT_BLOCK_MAJOR ||
	    info->geometry.block_tokens != BLOCK_TOKENS) {
		fprintf(stderr, "kvarena-demo: the agent's blocks are %u tokens, %s; the demo "
			"writes whole %u-token blocks and needs block-major ones\n",
			info->geometry.block_tokens,
			info->geometry.layout == KVA_LAYOUT_BLOCK_MAJOR ? "block-major"
									  : "layer-major",
			BLOCK_TOKENS);
		return -EINVAL;
	}
	if (info->blocks < MIN_BLOCKS) {
		fprintf(stderr, "kvarena-demo: the agent's arena has %u blocks; the demo needs at "
			"least %u\n", info->blocks, MIN_BLOCKS);
		return -EINVAL;
	}
	if (st.workers || st.free_blocks != st.total_blocks) {
		fprintf(stderr, "kvarena-demo: the agent's arena is in use (%u workers, %u blocks "
			"held); the demo ends by checking that it is empty, so it needs an agent "
			"of its own\n", st.workers, st.total_blocks - st.free_blocks);
		return -EBUSY;
	}
	if (st.max_workers < d->opt.workers + 1) {
		fprintf(stderr, "kvarena-demo: the agent has %u worker slots; %u engines and the "
			"parent need %u\n", st.max_workers, d->opt.workers, d->opt.workers + 1);
		return -EUSERS;
	}
	return 0;
}

/* Stop what was started after a failure in the parent: no engine outlives
 * it, and the agent reclaims what they held. */
static void engines_kill_all(struct demo *d)
{
	for (unsigned k = 0; k < d->opt.workers; k++)
		if (d->engines[k].alive) {
			kill(d->engines[k].pid, SIGKILL);
			waitpid(d->engines[k].pid, &d->engines[k].status, 0);
			d->engines[k].alive = false;
		}
}

/*
 * engines_start - fork the engines one by one, each attached before the
 * next starts, so that on a fresh agent engine-K has slot K and the map's
 * characters read as the engines' numbers.
 */
static int engines_start(struct demo *d)
{
	pid_t parent = getpid();

	for (unsigned k = 0; k < d->opt.workers; k++) {
		struct engine_proc *p = &d->engines[k];
		uint64_t deadline = now_ns() + START_TIMEOUT_NS;
		enum kva_slot_state state;
		int32_t holder;
		pid_t pid;

		fflush(stdout);
		fflush(stderr);
		pid = fork();
		if (pid < 0) {
			int err = errno;

			fprintf(stderr, "kvarena-demo: fork: %s\n", strerror(err));
			return -err;
		}
		if (pid == 0)
			demo_engine_main(d->opt.socket, d->obs, d->sh, k, d->opt.seed, parent);
		p->pid = pid;
		p->alive = true;
		/* acquire: pairs with the engine's release after it wrote its slot */
		while (!atomic_load_explicit(&d->sh->cells[k].joined, memory_order_acquire)) {
			if (waitpid(pid, &p->status, WNOHANG) == pid) {
				p->alive = false;
				fprintf(stderr, "kvarena-demo: engine-%u exited before attaching "
					"(status %#x)\n", k, p->status);
				return -ECHILD;
			}
			if (now_ns() > deadline) {
				fprintf(stderr, "kvarena-demo: engine-%u did not attach in %llu s\n",
					k, START_TIMEOUT_NS / 1000000000ull);
				return -ETIMEDOUT;
			}
			sleep_ns(1000000);
		}
		p->slot = d->sh->cells[k].slot;
		/* the generation its slot has while it holds it: the agent's
		 * reclaim moves it on */
		if (kva_arena_slot(d->obs, (uint32_t)p->slot, &state, &p->generation, &holder) < 0 ||
		    state != KVA_SLOT_LIVE || holder != pid) {
			fprintf(stderr, "kvarena-demo: engine-%u says slot %d, which the arena does "
				"not show as its own\n", k, (int)p->slot);
			return -EPROTO;
		}
	}
	return 0;
}

/*
 * prompt_publish - the system prompt: attach the parent's own worker, take
 * 32 blocks, write every byte, share them and keep one reference for the
 * whole run (a prefix cache entry that outlives each request), then post
 * the ids for the engines.
 */
static int prompt_publish(struct demo *d)
{
	const struct kva_arena_info *info = kva_arena_info(d->obs);
	size_t words = info->layout.block_bytes / 8;
	int ret;

	if ((ret = kva_attach(d->opt.socket, "system-prompt", &d->prompt_holder)) < 0) {
		fprintf(stderr, "kvarena-demo: kva_attach: %s (%s)\n", strerror(-ret),
			kva_errmsg());
		return ret;
	}
	/* no cache: the parent takes blocks once, and a cache would keep a
	 * refill's worth of them away from the engines for the whole run */
	if ((ret = kva_worker_set_cache(d->prompt_holder, 0)) < 0 ||
	    (ret = kva_alloc(d->prompt_holder, PROMPT_BLOCKS, d->prompt_ids)) < 0) {
		fprintf(stderr, "kvarena-demo: taking %u blocks for the system prompt: %s (%s)\n",
			PROMPT_BLOCKS, strerror(-ret), kva_errmsg());
		return ret;
	}
	/* through kva_block_write: on a GPU arena the CPU must not touch the blocks */
	{
		uint64_t *p = malloc(words * sizeof(uint64_t));

		for (uint32_t k = 0; p && k < PROMPT_BLOCKS; k++) {
			for (size_t j = 0; j < words; j++)
				p[j] = prompt_word(d->opt.seed, k, j);
			if ((ret = kva_block_write(d->prompt_holder, d->prompt_ids[k], 0, p,
						   words * sizeof(uint64_t))) < 0)
				break;
		}
		free(p);
		if (!p || ret < 0) {
			fprintf(stderr, "kvarena-demo: writing the system prompt: %s\n",
				p ? kva_errmsg() : "out of memory");
			return p ? ret : -ENOMEM;
		}
	}
	/* shared: two references of ours; the engines can now take theirs. Then
	 * one is dropped, so the run ends by freeing exactly one. */
	if ((ret = kva_share(d->prompt_holder, d->prompt_ids, PROMPT_BLOCKS)) < 0 ||
	    (ret = kva_free(d->prompt_holder, d->prompt_ids, PROMPT_BLOCKS)) < 0) {
		fprintf(stderr, "kvarena-demo: sharing the system prompt: %s (%s)\n",
			strerror(-ret), kva_errmsg());
		return ret;
	}
	memcpy(d->sh->prompt_ids, d->prompt_ids, sizeof(d->prompt_ids));
	/* release: the ids are written before an engine sees prompt_ready */
	atomic_store_explicit(&d->sh->prompt_ready, 1, memory_order_release);
	return 0;
}

/* a terminal's line is 80 columns: the progress line must fit, or "\r" no
 * longer takes it back */
#define BAR_WIDTH 8

/* what the parent's slot still holds once it dropped the prompt: nothing, or
 * kva_detach() would be hiding a lost reference */
static void prompt_holder_check(struct demo *d)
{
	struct kva_stats st;
	int slot = kva_worker_slot(d->prompt_holder);
	int ret = kva_stats(d->prompt_holder, &st);

	if (ret < 0) {
		fprintf(stderr, "kvarena-demo: kva_stats: %s\n", strerror(-ret));
		d->parent_errors++;
		return;
	}
	d->prompt_left = st.slots[slot].owned + st.slots[slot].shared;
}

static void progress_line(struct demo *d, double el)
{
	struct kva_stats st;
	char req[16], rate[16];
	char bar[BAR_WIDTH + 1];
	uint64_t tokens = total(d, C_TOKENS), t = now_ns();
	double dt = (double)(t - d->last_ns) / 1e9;
	unsigned filled = (unsigned)(BAR_WIDTH * (el / d->opt.seconds));

	if (kva_arena_stats(d->obs, &st) < 0)
		return;
	if (filled > BAR_WIDTH)
		filled = BAR_WIDTH;
	memset(bar, '#', filled);
	memset(bar + filled, '.', BAR_WIDTH - filled);
	bar[BAR_WIDTH] = '\0';
	human(req, (double)total(d, C_REQUESTS));
	human(rate, dt > 0 ? (double)(tokens - d->last_tokens) / dt : 0);
	d->last_tokens = tokens;
	d->last_ns = t;
	printf("%s%4.1fs [%s] %5s req %5s tok/s  used %u free %u shared %u cached %u%s",
	       d->tty ? "\r" : "  ", el, bar, req, rate, st.used_blocks, st.free_blocks,
	       st.shared_blocks, st.cached_blocks, d->tty ? "\033[K" : "\n");
	fflush(stdout);
}

/* the progress line is rewritten in place on a terminal: clear it before
 * printing anything else */
static void progress_clear(struct demo *d)
{
	if (d->tty)
		fputs("\r\033[K", stdout);
}

/*
 * slot_given_back - wait until the agent has reclaimed @p's slot: FREE, or
 * taken by someone else under a newer generation. Polled on the observer
 * mapping until @deadline. Return: true, with the time it was seen in @seen.
 */
static bool slot_given_back(struct demo *d, const struct engine_proc *p, uint64_t deadline,
			    uint64_t *seen)
{
	for (;;) {
		enum kva_slot_state state;
		uint32_t gen;

		*seen = now_ns();
		if (kva_arena_slot(d->obs, (uint32_t)p->slot, &state, &gen, NULL) < 0)
			return false;
		if (state == KVA_SLOT_FREE ||
		    (state != KVA_SLOT_RECLAIMING && gen != p->generation))
			return true;
		if (*seen > deadline)
			return false;
		sleep_ns(100000);
	}
}

static void print_reclaim_line(const struct demo *d)
{
	const struct kill_record *k = &d->kill;

	printf("  reclaim: engine-%u (pid %d, slot %d) SIGKILLed at %.1fs holding %u blocks of "
	       "its own (cache included) and references on %u shared blocks: ", k->engine,
	       (int)d->engines[k->engine].pid, (int)k->slot, k->at, k->held_owned,
	       k->held_shared);
	if (!k->returned)
		printf("the agent did NOT give its slot back in %llu s\n",
		       RECLAIM_TIMEOUT_NS / 1000000000ull);
	else
		printf("its slot was free again %.3f ms after the SIGKILL (the process took "
		       "%.3f ms to die, the agent %.3f ms more to see it and reclaim)%s\n",
		       k->reclaim_ms, k->death_ms, k->reclaim_ms - k->death_ms,
		       k->all_returned ? "" : "  -- NOT everything it held came back");
}

/*
 * kill_one - SIGKILL the engine holding the most blocks, show the map with
 * its blocks in it, wait for the agent to reclaim its slot while the others
 * run, and show the agent's status and map again. Returns false when no
 * engine holds a block yet (try later).
 *
 * The engine is stopped (SIGSTOP) first: the agent reclaims within a
 * millisecond of the death, sooner than kvarena-ctl can start, so the map
 * that shows what the death leaves behind is taken with the engine frozen,
 * holding exactly what its SIGKILL then leaves.
 */
static bool kill_one(struct demo *d, double el)
{
	struct kill_record *k = &d->kill;
	struct kva_stats st;
	struct kva_check_report cr;
	uint32_t best_held = 0;
	uint64_t t_kill, t_dead, t_free;
	int best = -1, ws = 0;
	struct engine_proc *p;

	if (kva_arena_stats(d->obs, &st) < 0)
		return false;
	for (unsigned e = 0; e < d->opt.workers; e++) {
		struct kva_slot_stats *s = &st.slots[d->engines[e].slot];

		if (d->engines[e].alive && s->owned + s->shared > best_held) {
			best_held = s->owned + s->shared;
			best = (int)e;
		}
	}
	if (best < 0)
		return false;
	p = &d->engines[best];
	progress_clear(d);
	/* an engine that is not reaped yet takes signals, even as a zombie:
	 * waitpid() says whether it stopped or ended on its own just now */
	kill(p->pid, SIGSTOP);
	if (waitpid(p->pid, &ws, WUNTRACED) != p->pid || !WIFSTOPPED(ws)) {
		/* a failure the report shows */
		p->alive = false;
		p->status = ws;
		fprintf(stderr, "kvarena-demo: engine-%u (pid %d) ended on its own at %.1fs "
			"(status %#x); the agent reclaims its slot\n", best, (int)p->pid, el, ws);
		return false;
	}
	k->done = true;
	k->engine = (unsigned)best;
	k->at = el;
	k->slot = p->slot;
	/* frozen: what its slot holds now is what the SIGKILL leaves */
	kva_arena_stats(d->obs, &st);
	k->held_owned = st.slots[p->slot].owned;
	k->held_shared = st.slots[p->slot].shared;
	printf("\n  SIGKILL engine-%u (pid %d, slot %d) at %.1fs: it holds %u blocks of its own "
	       "(cache included) and references on %u shared blocks\n",
	       best, (int)p->pid, (int)p->slot, el, k->held_owned, k->held_shared);
	printf("  kvarena-ctl map, as the kill leaves it (engine-%u's blocks are '%c'; it was "
	       "stopped for this picture):\n", best, kva_slot_char((uint32_t)p->slot));
	run_ctl(d, "map", "--width", "64", "--rows", "16");

	kill(p->pid, SIGKILL);
	t_kill = now_ns();
	waitpid(p->pid, &p->status, 0);
	t_dead = now_ns();
	p->alive = false;
	p->killed = true;
	/* the agent's turn: its pidfd of the engine fires, it reclaims */
	k->returned = slot_given_back(d, p, t_kill + RECLAIM_TIMEOUT_NS, &t_free);
	k->death_ms = (double)(t_dead - t_kill) / 1e6;
	k->reclaim_ms = (double)(t_free - t_kill) / 1e6;
	kva_arena_stats(d->obs, &st);
	kva_arena_check(d->obs, &cr);
	/* All of it came back: the slot is free and holds nothing, no
	 * descriptor names it any more, and no holder bit of a dead slot is
	 * left. (The other engines are running: of the check, only what
	 * cannot be transient is looked at.) */
	k->all_returned = k->returned && st.slots[p->slot].state == KVA_SLOT_FREE &&
			  st.slots[p->slot].owned == 0 && st.slots[p->slot].shared == 0 &&
			  cr.stale_owners == 0 && cr.dead_holders == 0 && cr.bad_descriptors == 0;
	print_reclaim_line(d);
	printf("  kvarena-ctl status:\n");
	run_ctl(d, "status");
	printf("  kvarena-ctl map, after the agent's reclaim (the other engines kept serving):\n");
	run_ctl(d, "map", "--width", "64", "--rows", "16");
	printf("\n");
	fflush(stdout);
	return true;
}

/*
 * reap_unexpected - an engine that died without being killed (a crash, or
 * someone else's SIGKILL) is a failure of the run; its blocks are the
 * agent's to take back, as for the one the parent kills.
 */
static void reap_unexpected(struct demo *d, double el)
{
	for (unsigned e = 0; e < d->opt.workers; e++) {
		struct engine_proc *p = &d->engines[e];

		if (!p->alive || waitpid(p->pid, &p->status, WNOHANG) != p->pid)
			continue;
		p->alive = false;
		progress_clear(d);
		fprintf(stderr, "kvarena-demo: engine-%u (pid %d) ended on its own at %.1fs "
			"(status %#x); the agent reclaims its slot\n", e, (int)p->pid, el,
			p->status);
	}
}

/*
 * engines_stop - raise the stop flag and wait for every engine to free what
 * it holds and detach. One that has not left after 10 s is stuck: it is
 * killed, the agent reclaims its slot, and the run fails (its exit status
 * says so).
 */
static void engines_stop(struct demo *d)
{
	uint64_t deadline = now_ns() + LEAVE_TIMEOUT_NS;

	atomic_store_explicit(&d->sh->stop, 1, memory_order_relaxed);
	for (unsigned e = 0; e < d->opt.workers; e++) {
		struct engine_proc *p = &d->engines[e];

		while (p->alive && waitpid(p->pid, &p->status, WNOHANG) == 0) {
			if (now_ns() > deadline) {
				fprintf(stderr, "kvarena-demo: engine-%u (pid %d) did not leave in "
					"%llu s: killing it\n", e, (int)p->pid,
					LEAVE_TIMEOUT_NS / 1000000000ull);
				kill(p->pid, SIGKILL);
				waitpid(p->pid, &p->status, 0);
				break;
			}
			sleep_ns(1000000);
		}
		p->alive = false;
	}
}

/*
 * arena_wait_empty - after everyone left: detached slots are free at once,
 * but those of engines that died (a stuck one, a crash) come back when the
 * agent reclaims them. Wait for that, bounded.
 */
static void arena_wait_empty(struct demo *d)
{
	uint64_t deadline = now_ns() + RECLAIM_TIMEOUT_NS;
	struct kva_stats st;

	while (kva_arena_stats(d->obs, &st) == 0 && st.workers && now_ns() < deadline)
		sleep_ns(1000000);
}

static void run(struct demo *d)
{
	double interval = d->tty ? 0.2 : 1.0, next_display = interval, el;

	d->last_ns = d->t0;
	for (;;) {
		int ret;

		sleep_ns(20000000);
		el = elapsed_s(d);
		reap_unexpected(d, el);
		/* the agent stopping or gone ends the run: the engines see it too */
		if ((ret = kva_worker_poll(d->prompt_holder)) < 0) {
			progress_clear(d);
			fprintf(stderr, "kvarena-demo: at %.1fs: %s\n", el, kva_errmsg());
			d->agent_lost = true;
			break;
		}
		if (!d->kill.done && el >= d->opt.kill_at)
			kill_one(d, el);
		if (el >= d->opt.seconds || interrupted)
			break;
		if (el >= next_display) {
			progress_line(d, el);
			while (next_display <= el)
				next_display += interval;
		}
	}
	progress_line(d, el);
	if (d->tty)
		printf("\n");
}

/*
 * report - the final table and verdict, after every engine is gone and the
 * parent has dropped the system prompt and detached. Returns the exit status.
 */
static int report(struct demo *d, double run_s)
{
	/* the table's columns: the engines' counters but C_LEAKED, which gets
	 * a line of its own */
	static const struct {
		const char *head;
		int width;
	} cols[C_LEAKED] = {
		[C_REQUESTS] = { "requests", 9 },   [C_TOKENS] = { "tokens", 10 },
		[C_BLOCKS] = { "blocks", 9 },       [C_PREFIX_REFS] = { "prefix-refs", 11 },
		[C_FORKS] = { "forks", 6 },         [C_WAITS] = { "waits", 6 },
		[C_PREEMPTIONS] = { "preempt", 7 }, [C_DATA_ERRORS] = { "data-err", 8 },
		[C_API_ERRORS] = { "api-err", 7 },
	};
	struct kva_check_report cr;
	struct kva_stats st;
	uint64_t sum[C_N] = { 0 };
	bool engines_ok = true;
	int check_ret;

	printf("\nfinal report (%.1fs of serving)\n", run_s);
	printf("  %-9s %-7s", "engine", "pid");
	for (unsigned c = 0; c < C_LEAKED; c++)
		printf(" %*s", cols[c].width, cols[c].head);
	printf("\n");
	for (unsigned e = 0; e < d->opt.workers; e++) {
		struct engine_proc *p = &d->engines[e];
		bool left = WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0;
		char name[24];

		snprintf(name, sizeof(name), "engine-%u", e);
		printf("  %-9s %-7d", name, (int)p->pid);
		for (unsigned c = 0; c < C_N; c++) {
			uint64_t v = atomic_load_explicit(&d->sh->cells[e].count[c],
							  memory_order_relaxed);

			sum[c] += v;
			if (c < C_LEAKED)
				printf(" %*" PRIu64, cols[c].width, v);
		}
		if (p->killed)
			printf("  <- SIGKILLed at %.1fs", d->kill.at);
		else if (WIFSIGNALED(p->status))
			printf("  <- FAILED: died of signal %d", WTERMSIG(p->status));
		else if (!left)
			printf("  <- FAILED: exit status %d", WEXITSTATUS(p->status));
		printf("\n");
		if (!p->killed && !left)
			engines_ok = false;
	}
	printf("  %-9s %-7s", "total", "");
	for (unsigned c = 0; c < C_LEAKED; c++)
		printf(" %*" PRIu64, cols[c].width, sum[c]);
	printf("\n");
	printf("  throughput: %.0f tokens/s, %.0f requests/s (the killed engine's counts stop at "
	       "its death)\n", (double)sum[C_TOKENS] / run_s, (double)sum[C_REQUESTS] / run_s);
	if (d->kill.done)
		print_reclaim_line(d);
	else
		printf("  no engine was killed: %s\n",
		       interrupted || d->agent_lost ? "the run ended before --kill-at"
						    : "none held a block at --kill-at");
	printf("  before leaving: the engines still held %" PRIu64 " blocks beyond their caches, "
	       "the parent %u\n", sum[C_LEAKED], d->prompt_left);

	kva_arena_stats(d->obs, &st);
	check_ret = kva_arena_check(d->obs, &cr);
	printf("  after everyone left: %u of %u blocks free, %u workers attached\n",
	       st.free_blocks, st.total_blocks, st.workers);
	printf("  kva_arena_check: %s: %u leaked, 0 double-owned (one owner per descriptor; %u "
	       "corrupt), %u stale owners, %u dead holders, %u unfindable free blocks\n",
	       check_ret == 0 ? "passed" : "FAILED", cr.owned_blocks + cr.shared_blocks,
	       cr.bad_descriptors, cr.stale_owners, cr.dead_holders, cr.hints_missing);
	printf("  block map at the end:\n");
	kva_arena_map_print(d->obs, stdout, 64, 4);
	printf("  kvarena-ctl --json status:\n");
	run_ctl(d, "--json", "status");

	if (check_ret == 0 && st.free_blocks == st.total_blocks && st.workers == 0 &&
	    sum[C_DATA_ERRORS] == 0 && sum[C_API_ERRORS] == 0 && d->parent_errors == 0 &&
	    d->ctl_failures == 0 && !d->agent_lost && sum[C_LEAKED] == 0 &&
	    d->prompt_left == 0 && d->kill.done && d->kill.all_returned && engines_ok) {
		printf("\nresult: PASS - the arena kept serving through a SIGKILL, the agent "
		       "reclaimed the dead engine, and nothing was lost\n");
		return 0;
	}
	printf("\nresult: FAIL -");
	if (check_ret || st.free_blocks != st.total_blocks || st.workers)
		printf(" the arena is not empty and consistent;");
	if (sum[C_DATA_ERRORS])
		printf(" %" PRIu64 " data errors;", sum[C_DATA_ERRORS]);
	if (sum[C_API_ERRORS] || d->parent_errors)
		printf(" %" PRIu64 " failed calls;", sum[C_API_ERRORS] + d->parent_errors);
	if (d->ctl_failures)
		printf(" kvarena-ctl failed %u times;", d->ctl_failures);
	if (d->agent_lost)
		printf(" the agent stopped during the run;");
	if (sum[C_LEAKED] || d->prompt_left)
		printf(" blocks left held at leave;");
	if (!d->kill.done)
		printf(" no engine was killed;");
	else if (!d->kill.all_returned)
		printf(" the killed engine's blocks did not all come back;");
	if (!engines_ok)
		printf(" an engine failed;");
	printf("\n");
	return 1;
}

static void print_header(const struct demo *d)
{
	const struct kva_arena_info *info = kva_arena_info(d->obs);
	const struct kva_geometry *g = &info->geometry;

	printf("kvarena-demo: arena \"%s\" of kvarena-agent pid %d (%s): %u blocks of %" PRIu64
	       " KiB (%u tokens x %u layers x K,V x %u kv heads x %u x %s, %s): %.0f MiB data, "
	       "%.0f KiB metadata%s\n",
	       info->name, (int)d->agent.pid, d->opt.socket, info->blocks,
	       info->layout.block_bytes / 1024, g->block_tokens, g->layers, g->kv_heads,
	       g->head_dim, kva_dtype_name(g->dtype),
	       g->layout == KVA_LAYOUT_BLOCK_MAJOR ? "block-major" : "layer-major",
	       (double)info->layout.data_bytes / (1 << 20), (double)info->meta_bytes / 1024,
	       info->hugetlb ? ", huge pages" : "");
	printf("  %u engines (slots", d->opt.workers);
	for (unsigned e = 0; e < d->opt.workers; e++)
		printf(" %d", (int)d->engines[e].slot);
	printf(", pids");
	for (unsigned e = 0; e < d->opt.workers; e++)
		printf(" %d", (int)d->engines[e].pid);
	printf("), each attached with kva_attach, a cache of %u blocks and up to %u sequences\n",
	       info->cache_blocks, SEQS_PER_ENGINE);
	printf("  system prompt: %u blocks (%u tokens) written and shared by the parent's worker "
	       "(slot %d); every request references them\n",
	       PROMPT_BLOCKS, PROMPT_BLOCKS * BLOCK_TOKENS, kva_worker_slot(d->prompt_holder));
	printf("  requests: prompt = system prompt + %u..%u tokens, output %u..%u tokens (skewed "
	       "short); %u%% fork a second sample\n",
	       USER_TOKENS_MIN, USER_TOKENS_MAX, OUTPUT_TOKENS_MIN, OUTPUT_TOKENS_MAX,
	       FORK_PERCENT);
	printf("  run %.1fs; SIGKILL the engine holding the most blocks at %.1fs and let the "
	       "agent reclaim it; seed %" PRIu64 "\n\n",
	       d->opt.seconds, d->opt.kill_at, d->opt.seed);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct demo d = { 0 };
	struct sigaction sa = { 0 };
	double run_s;
	int ret, status = 1;

	if (parse_options(argc, argv, &d.opt) < 0)
		return 2;
	/* a closed pipe on stdout must end the demo through its own checks */
	signal(SIGPIPE, SIG_IGN);
	sa.sa_handler = on_interrupt;
	/* waitpid() goes on after a Ctrl-C; the sleeps of the loops end early,
	 * which is all they need to see the flag */
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	d.tty = isatty(STDOUT_FILENO);

	if ((ret = kva_observe(d.opt.socket, &d.obs, &d.agent)) < 0) {
		fprintf(stderr, "kvarena-demo: kva_observe: %s (%s)\n", strerror(-ret),
			kva_errmsg());
		return 1;
	}
	if (arena_fits(&d) < 0)
		goto out;
	d.sh_bytes = sizeof(*d.sh) + d.opt.workers * sizeof(struct engine_cell);
	d.sh = mmap(NULL, d.sh_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (d.sh == MAP_FAILED)
		d.sh = NULL;
	d.engines = calloc(d.opt.workers, sizeof(*d.engines));
	if (!d.sh || !d.engines) {
		fprintf(stderr, "kvarena-demo: out of memory\n");
		goto out;
	}

	/* the engines first: nothing of the parent's worker may go through fork() */
	if (engines_start(&d) < 0 || prompt_publish(&d) < 0) {
		atomic_store_explicit(&d.sh->stop, 1, memory_order_relaxed);
		engines_kill_all(&d);
		goto out;
	}
	d.t0 = now_ns();
	print_header(&d);

	run(&d);
	run_s = elapsed_s(&d);
	if (interrupted)
		printf("  interrupted: stopping the engines\n");

	/* the engines free what they hold and detach; then the prompt goes */
	engines_stop(&d);
	if ((ret = kva_free(d.prompt_holder, d.prompt_ids, PROMPT_BLOCKS)) < 0) {
		fprintf(stderr, "kvarena-demo: freeing the system prompt: %s (%s)\n",
			strerror(-ret), kva_errmsg());
		d.parent_errors++;
	}
	prompt_holder_check(&d);
	kva_detach(d.prompt_holder);
	d.prompt_holder = NULL;
	arena_wait_empty(&d);
	status = report(&d, run_s);
out:
	if (d.prompt_holder)
		kva_detach(d.prompt_holder);
	if (d.sh)
		munmap(d.sh, d.sh_bytes);
	free(d.engines);
	kva_arena_close(d.obs);
	return status;
}
