/* SPDX-License-Identifier: MIT */
/*
 * kvarena-demo - one arena shared by several serving-engine processes, one
 * of them SIGKILLed half-way, and nothing lost.
 *
 * The parent creates the arena (embedded: there is no agent yet) and forks
 * the engines. Each engine maps the arena on its own from the two region fds
 * and joins as a worker. The parent joins too, as the holder of a 32-block
 * system prompt that it writes and shares; every request of every engine
 * takes references on those blocks (prefix sharing across processes) and
 * allocates the rest of its prompt and its output as it decodes, with
 * continuous batching, preemption on a full arena and occasional forks for
 * parallel sampling, as vLLM does.
 *
 * At --kill-at the parent SIGKILLs the engine holding the most blocks,
 * prints the block map, takes back everything the dead engine held with
 * kva_arena_reclaim() while the others keep serving, and prints the map
 * again. At the end every engine frees what it holds and leaves, and the
 * arena must be exactly empty.
 *
 * Exit status: 0 if the arena check passed, every block is free, no data
 * was found changed and the killed engine's blocks all came back;
 * 1 otherwise; 2 bad usage.
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

static const struct kva_geometry demo_geometry = {
	.block_tokens = BLOCK_TOKENS, .layers = 4, .kv_heads = 2, .head_dim = 64,
	.dtype = KVA_F16, .layout = KVA_LAYOUT_BLOCK_MAJOR,
};

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
	uint32_t blocks;
	unsigned workers;
	double seconds, kill_at;
	uint64_t seed;
};

struct engine_proc {
	pid_t pid;
	int32_t slot;
	bool alive;
	bool killed;
	int status;        /* waitpid() status once it is gone */
};

struct kill_record {
	bool done;
	unsigned engine;
	double at;              /* seconds into the run */
	uint32_t held_owned;    /* what its slot held once it was dead, before reclaim */
	uint32_t held_shared;
	int reclaim_ret;
	struct kva_reclaim_report report;
	bool all_returned;
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
		"usage: kvarena-demo [--blocks N] [--workers N] [--seconds S] [--kill-at S]\n"
		"                    [--seed N]\n"
		"\n"
		"  --blocks N    arena size in 32 KiB blocks (default 2048, at least 512)\n"
		"  --workers N   engine processes (default 4, 4..%u)\n"
		"  --seconds S   length of the run (default 6)\n"
		"  --kill-at S   when to SIGKILL one engine (default half of --seconds)\n"
		"  --seed N      seed of the workload and of the system prompt's bytes\n"
		"                (default 1)\n",
		KVA_MAX_WORKERS - 1);
}

static int parse_options(int argc, char **argv, struct options *o)
{
	static const struct option longopts[] = {
		{ "blocks", required_argument, NULL, 'b' },
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

	*o = (struct options){ .blocks = 2048, .workers = 4, .seconds = 6, .seed = 1 };
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		unsigned long long v;
		double d;

		errno = 0;
		switch (c) {
		case 'b':
			v = strtoull(optarg, &end, 10);
			if (errno || *end || v < 512 || v > KVA_MAX_BLOCKS) {
				fprintf(stderr, "kvarena-demo: --blocks: 512..%u\n",
					KVA_MAX_BLOCKS);
				return -EINVAL;
			}
			o->blocks = (uint32_t)v;
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
	struct kva_arena *a;
	struct kva_worker *prompt_holder;  /* the parent's slot */
	uint32_t prompt_ids[PROMPT_BLOCKS];
	uint32_t prompt_left;   /* blocks the parent still held before it left */
	unsigned parent_errors; /* the parent's calls that failed at the end */
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

/* Stop what was started after a failure in the parent: no engine outlives it. */
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
 * engines_start - fork the engines one by one, each joined before the next
 * starts, so that engine-K has slot K and the map's characters read as the
 * engines' numbers.
 */
static int engines_start(struct demo *d)
{
	pid_t parent = getpid();

	fflush(stdout);
	fflush(stderr);
	for (unsigned k = 0; k < d->opt.workers; k++) {
		struct engine_proc *p = &d->engines[k];
		uint64_t deadline = now_ns() + 10ull * 1000000000ull;
		pid_t pid = fork();

		if (pid < 0) {
			int err = errno;

			fprintf(stderr, "kvarena-demo: fork: %s\n", strerror(err));
			return -err;
		}
		if (pid == 0)
			demo_engine_main(d->a, d->sh, k, d->opt.seed, parent);
		p->pid = pid;
		p->alive = true;
		/* acquire: pairs with the engine's release after it wrote its slot */
		while (!atomic_load_explicit(&d->sh->cells[k].joined, memory_order_acquire)) {
			if (waitpid(pid, &p->status, WNOHANG) == pid) {
				p->alive = false;
				fprintf(stderr, "kvarena-demo: engine-%u exited before joining "
					"(status %#x)\n", k, p->status);
				return -ECHILD;
			}
			if (now_ns() > deadline) {
				fprintf(stderr, "kvarena-demo: engine-%u did not join in 10 s\n",
					k);
				return -ETIMEDOUT;
			}
			sleep_ns(1000000);
		}
		p->slot = d->sh->cells[k].slot;
	}
	return 0;
}

/*
 * prompt_publish - the system prompt: take 32 blocks, write every byte, share
 * them and keep one reference for the whole run (a prefix cache entry that
 * outlives each request), then post the ids for the engines.
 */
static int prompt_publish(struct demo *d)
{
	const struct kva_arena_info *info = kva_arena_info(d->a);
	size_t words = info->layout.block_bytes / 8;
	int ret;

	if ((ret = kva_worker_join(d->a, "system-prompt", &d->prompt_holder)) < 0) {
		fprintf(stderr, "kvarena-demo: kva_worker_join: %s (%s)\n", strerror(-ret),
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
	for (uint32_t k = 0; k < PROMPT_BLOCKS; k++) {
		uint64_t *p = kva_block_data(d->prompt_holder, d->prompt_ids[k]);

		for (size_t j = 0; j < words; j++)
			p[j] = prompt_word(d->opt.seed, k, j);
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
 * kva_worker_leave() would be hiding a lost reference */
static void prompt_holder_check(struct demo *d)
{
	struct kva_stats st;
	int ret = kva_stats(d->prompt_holder, &st);

	if (ret < 0) {
		fprintf(stderr, "kvarena-demo: kva_stats: %s\n", strerror(-ret));
		d->parent_errors++;
		return;
	}
	d->prompt_left = st.slots[kva_worker_slot(d->prompt_holder)].owned +
			 st.slots[kva_worker_slot(d->prompt_holder)].shared;
}

static void progress_line(struct demo *d, double el)
{
	struct kva_stats st;
	char req[16], rate[16];
	char bar[BAR_WIDTH + 1];
	uint64_t tokens = total(d, C_TOKENS), t = now_ns();
	double dt = (double)(t - d->last_ns) / 1e9;
	unsigned filled = (unsigned)(BAR_WIDTH * (el / d->opt.seconds));

	if (kva_arena_stats(d->a, &st) < 0)
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

static void print_reclaim_line(const struct demo *d)
{
	const struct kill_record *k = &d->kill;

	if (k->reclaim_ret < 0) {
		printf("  reclaim of engine-%u (pid %d) failed: %s\n", k->engine,
		       (int)d->engines[k->engine].pid, strerror(-k->reclaim_ret));
		return;
	}
	printf("  reclaim: engine-%u (pid %d, slot %u) killed at %.1fs: %u owned blocks returned, "
	       "its hold on %u shared blocks dropped (%u of them freed), %u free-block hints repaired, "
	       "%.3f ms%s\n",
	       k->engine, (int)k->report.pid, k->report.slot, k->at, k->report.owned_freed,
	       k->report.shared_dropped, k->report.shared_freed, k->report.hints_repaired,
	       (double)k->report.elapsed_ns / 1e6,
	       k->all_returned ? "" : "  -- NOT everything it held came back");
}

/*
 * kill_one - SIGKILL the engine holding the most blocks, show the map with
 * its blocks still in it, reclaim its slot while the others run, show the
 * map again. Returns false when no engine holds a block yet (try later).
 */
static bool kill_one(struct demo *d, double el)
{
	struct kill_record *k = &d->kill;
	struct kva_stats st;
	struct kva_check_report cr;
	uint32_t best_held = 0;
	int best = -1, slot = -1;
	struct engine_proc *p;

	if (kva_arena_stats(d->a, &st) < 0)
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
	kill(p->pid, SIGKILL);
	waitpid(p->pid, &p->status, 0);
	p->alive = false;
	p->killed = true;
	k->done = true;
	k->engine = (unsigned)best;
	k->at = el;

	/* the dead engine's holdings are frozen now: nobody else may touch its
	 * owned blocks, and its holder bits go only through reclaim */
	kva_arena_stats(d->a, &st);
	for (uint32_t s = 0; s < st.max_workers; s++)
		if (st.slots[s].state != KVA_SLOT_FREE && st.slots[s].pid == p->pid)
			slot = (int)s;
	progress_clear(d);
	if (slot < 0) {
		printf("\n  SIGKILL engine-%u (pid %d) at %.1fs: its slot is not in the arena\n",
		       best, (int)p->pid, el);
		k->reclaim_ret = -ENOENT;
		return true;
	}
	k->held_owned = st.slots[slot].owned;
	k->held_shared = st.slots[slot].shared;
	printf("\n  SIGKILL engine-%u (pid %d, slot %d) at %.1fs: it held %u blocks of its own "
	       "(cache included) and references on %u shared blocks\n",
	       best, (int)p->pid, slot, el, k->held_owned, k->held_shared);
	printf("  block map before reclaim (engine-%u's blocks are '%c'):\n", best,
	       kva_slot_char((uint32_t)slot));
	kva_arena_map_print(d->a, stdout, 64, 16);

	k->reclaim_ret = kva_arena_reclaim(d->a, (uint32_t)slot, &k->report);
	kva_arena_stats(d->a, &st);
	kva_arena_check(d->a, &cr);
	/* All of it came back: the counts match what it held, no descriptor
	 * names the slot any more, and no holder bit of a dead slot is left.
	 * (The other engines are running: of the check, only what cannot be
	 * transient is looked at.) */
	k->all_returned = k->reclaim_ret == 0 && k->report.owned_freed == k->held_owned &&
			  k->report.shared_dropped == k->held_shared &&
			  st.slots[slot].state == KVA_SLOT_FREE && st.slots[slot].owned == 0 &&
			  st.slots[slot].shared == 0 && cr.stale_owners == 0 &&
			  cr.dead_holders == 0 && cr.bad_descriptors == 0;
	print_reclaim_line(d);
	printf("  block map after reclaim (the other engines kept serving):\n");
	kva_arena_map_print(d->a, stdout, 64, 16);
	printf("\n");
	fflush(stdout);
	return true;
}

/* reclaim_dead - take back what a dead engine left in its slot, if anything */
static void reclaim_dead(struct demo *d, struct engine_proc *p)
{
	struct kva_reclaim_report r;
	int ret = kva_arena_reclaim(d->a, (uint32_t)p->slot, &r);

	if (ret == 0)
		fprintf(stderr, "kvarena-demo: reclaim of pid %d: %u owned blocks returned, %u "
			"references dropped, %.3f ms\n", (int)p->pid, r.owned_freed,
			r.shared_dropped, (double)r.elapsed_ns / 1e6);
	else if (ret != -ENOENT) /* ENOENT: it had left its slot before it ended */
		fprintf(stderr, "kvarena-demo: reclaim of slot %d: %s (%s)\n", p->slot,
			strerror(-ret), kva_errmsg());
}

/*
 * reap_unexpected - an engine that died without being killed (a crash, or
 * someone else's SIGKILL) is a failure of the run, but its blocks must not
 * be: the parent takes them back as it does for the one it kills.
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
			"(status %#x)\n", e, (int)p->pid, el, p->status);
		reclaim_dead(d, p);
	}
}

/*
 * engines_stop - raise the stop flag and wait for every engine to free what
 * it holds and leave. One that has not left after 10 s is stuck: it is
 * killed and its slot reclaimed, and the run fails (its exit status says so).
 */
static void engines_stop(struct demo *d)
{
	uint64_t deadline = now_ns() + 10ull * 1000000000ull;

	atomic_store_explicit(&d->sh->stop, 1, memory_order_relaxed);
	for (unsigned e = 0; e < d->opt.workers; e++) {
		struct engine_proc *p = &d->engines[e];

		while (p->alive && waitpid(p->pid, &p->status, WNOHANG) == 0) {
			if (now_ns() > deadline) {
				fprintf(stderr, "kvarena-demo: engine-%u (pid %d) did not leave in "
					"10 s: killing it\n", e, (int)p->pid);
				kill(p->pid, SIGKILL);
				waitpid(p->pid, &p->status, 0);
				reclaim_dead(d, p);
				break;
			}
			sleep_ns(1000000);
		}
		p->alive = false;
	}
}

static void run(struct demo *d)
{
	double interval = d->tty ? 0.2 : 1.0, next_display = interval, el;

	d->last_ns = d->t0;
	for (;;) {
		sleep_ns(20000000);
		el = elapsed_s(d);
		reap_unexpected(d, el);
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
 * parent has dropped the system prompt and left. Returns the exit status.
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
		printf("  no engine was killed: %s\n", interrupted ? "interrupted before --kill-at"
							     : "none held a block at --kill-at");
	printf("  before leaving: the engines still held %" PRIu64 " blocks beyond their caches, "
	       "the parent %u\n", sum[C_LEAKED], d->prompt_left);

	kva_arena_stats(d->a, &st);
	check_ret = kva_arena_check(d->a, &cr);
	printf("  after everyone left: %u of %u blocks free, %u workers joined\n", st.free_blocks,
	       st.total_blocks, st.workers);
	printf("  kva_arena_check: %s: %u leaked, 0 double-owned (one owner per descriptor; %u "
	       "corrupt), %u stale owners, %u dead holders, %u unfindable free blocks\n",
	       check_ret == 0 ? "passed" : "FAILED", cr.owned_blocks + cr.shared_blocks,
	       cr.bad_descriptors, cr.stale_owners, cr.dead_holders, cr.hints_missing);
	printf("  block map at the end:\n");
	kva_arena_map_print(d->a, stdout, 64, 4);

	if (check_ret == 0 && st.free_blocks == st.total_blocks && st.workers == 0 &&
	    sum[C_DATA_ERRORS] == 0 && sum[C_API_ERRORS] == 0 && d->parent_errors == 0 &&
	    sum[C_LEAKED] == 0 && d->prompt_left == 0 && d->kill.done && d->kill.all_returned &&
	    engines_ok) {
		printf("\nresult: PASS - the arena kept serving through a SIGKILL, "
		       "and lost nothing\n");
		return 0;
	}
	printf("\nresult: FAIL -");
	if (check_ret || st.free_blocks != st.total_blocks || st.workers)
		printf(" the arena is not empty and consistent;");
	if (sum[C_DATA_ERRORS])
		printf(" %" PRIu64 " data errors;", sum[C_DATA_ERRORS]);
	if (sum[C_API_ERRORS] || d->parent_errors)
		printf(" %" PRIu64 " failed calls;", sum[C_API_ERRORS] + d->parent_errors);
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
	const struct kva_arena_info *info = kva_arena_info(d->a);
	const struct kva_geometry *g = &info->geometry;

	printf("kvarena-demo: arena \"%s\": %u blocks of %" PRIu64 " KiB (%u tokens x %u layers "
	       "x K,V x %u kv heads x %u x %s, %s): %.0f MiB data, %.0f KiB metadata%s\n",
	       info->name, info->blocks, info->layout.block_bytes / 1024, g->block_tokens,
	       g->layers, g->kv_heads, g->head_dim, kva_dtype_name(g->dtype),
	       g->layout == KVA_LAYOUT_BLOCK_MAJOR ? "block-major" : "layer-major",
	       (double)info->layout.data_bytes / (1 << 20), (double)info->meta_bytes / 1024,
	       info->hugetlb ? ", huge pages" : "");
	printf("  %u engines (slots %d-%d, pids", d->opt.workers, (int)d->engines[0].slot,
	       (int)d->engines[d->opt.workers - 1].slot);
	for (unsigned e = 0; e < d->opt.workers; e++)
		printf(" %d", (int)d->engines[e].pid);
	printf("), each with its own mapping, a cache of %u blocks and up to %u sequences\n",
	       info->cache_blocks, SEQS_PER_ENGINE);
	printf("  system prompt: %u blocks (%u tokens) written and shared by the parent (slot %d); "
	       "every request references them\n",
	       PROMPT_BLOCKS, PROMPT_BLOCKS * BLOCK_TOKENS, kva_worker_slot(d->prompt_holder));
	printf("  requests: prompt = system prompt + %u..%u tokens, output %u..%u tokens (skewed "
	       "short); %u%% fork a second sample\n",
	       USER_TOKENS_MIN, USER_TOKENS_MAX, OUTPUT_TOKENS_MIN, OUTPUT_TOKENS_MAX,
	       FORK_PERCENT);
	printf("  run %.1fs; SIGKILL the engine holding the most blocks at %.1fs; seed %" PRIu64
	       "\n\n",
	       d->opt.seconds, d->opt.kill_at, d->opt.seed);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct demo d = { 0 };
	struct kva_arena_opts ao = { 0 };
	struct sigaction sa = { 0 };
	double run_s;
	int ret, status = 1;

	if (parse_options(argc, argv, &d.opt) < 0)
		return 2;
	/* a closed pipe on stdout must end the demo through its own checks */
	signal(SIGPIPE, SIG_IGN);
	sa.sa_handler = on_interrupt;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	d.tty = isatty(STDOUT_FILENO);

	ao.blocks = d.opt.blocks;
	ao.max_workers = d.opt.workers + 1; /* the engines and the prompt holder */
	ao.numa_node = -1;
	ao.name = "demo";
	if ((ret = kva_arena_create(&demo_geometry, &ao, &d.a)) < 0) {
		fprintf(stderr, "kvarena-demo: kva_arena_create: %s (%s)\n", strerror(-ret),
			kva_errmsg());
		return 1;
	}
	d.sh_bytes = sizeof(*d.sh) + d.opt.workers * sizeof(struct engine_cell);
	d.sh = mmap(NULL, d.sh_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (d.sh == MAP_FAILED)
		d.sh = NULL;
	d.engines = calloc(d.opt.workers, sizeof(*d.engines));
	if (!d.sh || !d.engines) {
		fprintf(stderr, "kvarena-demo: out of memory\n");
		goto out;
	}

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

	/* the engines free what they hold and leave; then the prompt goes */
	engines_stop(&d);
	if ((ret = kva_free(d.prompt_holder, d.prompt_ids, PROMPT_BLOCKS)) < 0) {
		fprintf(stderr, "kvarena-demo: freeing the system prompt: %s (%s)\n",
			strerror(-ret), kva_errmsg());
		d.parent_errors++;
	}
	prompt_holder_check(&d);
	kva_worker_leave(d.prompt_holder);
	d.prompt_holder = NULL;
	status = report(&d, run_s);
out:
	kva_worker_leave(d.prompt_holder);
	if (d.sh)
		munmap(d.sh, d.sh_bytes);
	free(d.engines);
	kva_arena_close(d.a);
	return status;
}
