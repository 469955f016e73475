/* SPDX-License-Identifier: MIT */
/*
 * test_stress.c - everything at once, for a bounded time, on a real agent:
 * worker processes of one to three threads (one attached through the agent,
 * the others joined on their own), some with their main thread gone
 * (pthread_exit: alive, though /proc shows a zombie leader), run requests
 * over shared prompt families (match, reserve, publish, fork, close, under a
 * cache limit and a quota, so eviction runs all the time), hold private
 * blocks, leave and join again, and reclaim every slot they find dead, while
 * the agent reclaims the same slots and the test SIGKILLs processes at random
 * (reclaimers among them, half-way through a sweep now and then).
 *
 * What must hold throughout: no live worker is ever told its slot was
 * reclaimed (-ESTALE), no matched block holds another key's bytes, no private
 * block changes under its owner, no call fails in a way it must not. At the
 * end, with every worker gone: every slot free, every block free or cached,
 * the published count right, kva_arena_check and kvarena-ctl check clean.
 *
 * usage: test_stress AGENT CTL [--seconds N]   (KVA_STRESS_SECONDS too; 20)
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

#define BT 16u          /* the agent's --block-tokens below */
#define BLOCKS 1024u
#define MAX_WORKERS 16u
#define FAMILIES 48u
#define PROCS 6         /* worker processes kept running */
#define MAX_THREADS 3
#define MAX_PRIVATE 100
#define MAX_REQ 24      /* full blocks of a request, at most */

static const char *agent_path, *ctl_path;
static double seconds = 20;

/* counters every worker process adds to, in shared memory */
struct shared {
	_Atomic uint32_t stop;
	_Atomic uint64_t requests, matched_blocks, published_tokens, forks;
	_Atomic uint64_t private_ops, rejoins, reclaims, reclaim_busy, enospc, edquot, eusers;
	_Atomic uint64_t bad_stamps;     /* a matched block with another key's bytes */
	_Atomic uint64_t bad_private;    /* a private block changed under its owner */
	_Atomic uint64_t stale;          /* -ESTALE on a live worker */
	_Atomic uint64_t unexpected;     /* any other failure that must not happen */
};

static struct shared *sh;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void unexpected(const char *what, int ret)
{
	if (ret == -ESTALE) {
		atomic_fetch_add(&sh->stale, 1);
		fprintf(stderr, "pid %d: %s: a live worker's slot was reclaimed (%s)\n",
			(int)getpid(), what, kva_errmsg());
		return;
	}
	atomic_fetch_add(&sh->unexpected, 1);
	fprintf(stderr, "pid %d: %s: %s (%s)\n", (int)getpid(), what, strerror(-ret),
		kva_errmsg());
}

/* a failure that is part of the game: a full arena, a quota, no slot */
static bool expected(int ret)
{
	if (ret == -ENOSPC)
		atomic_fetch_add_explicit(&sh->enospc, 1, memory_order_relaxed);
	else if (ret == -EDQUOT)
		atomic_fetch_add_explicit(&sh->edquot, 1, memory_order_relaxed);
	else
		return false;
	return true;
}

/* ------------------------------------------------------------ prefixes */

static const struct kva_seq_opts infer = { .kind = KVA_OWNER_INFERENCE, .model = "stress" };

static int32_t tok(uint32_t f, uint32_t i)
{
	return (int32_t)((f * 2654435761u + i * 40503u) & 0x7fffffff);
}

/* the stamp of a published block: its key, then a pattern from it */
static void stamp_make(const uint64_t key[2], uint64_t out[4])
{
	out[0] = key[0];
	out[1] = key[1];
	out[2] = key[0] * 0x9e3779b97f4a7c15ull ^ key[1];
	out[3] = ~key[1];
}

struct thread_ctx {
	struct kva_worker *w;
	bool attached;      /* the agent's worker: leaves only with the process */
	uint64_t rng;
	uint32_t priv[MAX_PRIVATE], priv_seq[MAX_PRIVATE], n_priv, seq;
	bool dead;          /* its slot was reclaimed: stop */
};

static int fail_call(struct thread_ctx *t, const char *what, int ret)
{
	if (!expected(ret)) {
		unexpected(what, ret);
		if (ret == -ESTALE)
			t->dead = true;
	}
	return ret;
}

static void request(struct thread_ctx *t)
{
	uint32_t f = (uint32_t)(tu_rand(&t->rng) % FAMILIES);
	uint32_t nb = 1 + (uint32_t)(tu_rand(&t->rng) % MAX_REQ), n;
	int32_t tokens[(MAX_REQ + 1) * BT];
	uint64_t keys[MAX_REQ][2], salt[2], st[4];
	const uint32_t *ids;
	size_t m = 0, nbk, nt;
	struct kva_seq *s, *c;
	int ret;

	f = f * f / FAMILIES; /* a skew: low families are hot */
	n = nb * BT + (uint32_t)(tu_rand(&t->rng) % BT);
	for (uint32_t i = 0; i < n; i++)
		tokens[i] = tok(f, i);
	kva_prefix_salt(infer.model, NULL, 0, salt);
	for (uint32_t j = 0; j < nb; j++)
		kva_prefix_hash(j ? keys[j - 1] : NULL, salt, tokens + j * BT, BT, keys[j]);

	if ((ret = kva_seq_open(t->w, &infer, &s)) < 0) {
		fail_call(t, "seq_open", ret);
		return;
	}
	atomic_fetch_add_explicit(&sh->requests, 1, memory_order_relaxed);
	if ((ret = kva_seq_match(s, tokens, n, &m)) < 0) {
		fail_call(t, "seq_match", ret);
		goto close;
	}
	kva_seq_block_table(s, &ids, &nbk, &nt);
	for (size_t j = 0; j < m / BT; j++) {
		stamp_make(keys[j], st);
		if (memcmp(kva_block_data(t->w, ids[j]), st, sizeof(st))) {
			atomic_fetch_add(&sh->bad_stamps, 1);
			fprintf(stderr, "pid %d: matched block %u (family %u, block %zu) holds "
				"another key's bytes\n", (int)getpid(), ids[j], f, j);
		}
	}
	atomic_fetch_add_explicit(&sh->matched_blocks, m / BT, memory_order_relaxed);
	if ((ret = kva_seq_reserve(s, n - m)) < 0) {
		fail_call(t, "seq_reserve", ret);
		goto close;
	}
	kva_seq_block_table(s, &ids, &nbk, &nt);
	for (size_t j = m / BT; j < nb; j++) {
		stamp_make(keys[j], st);
		memcpy(kva_block_data(t->w, ids[j]), st, sizeof(st));
	}
	if ((ret = kva_seq_append(s, tokens + m, n - m)) < 0) {
		fail_call(t, "seq_append", ret);
		goto close;
	}
	atomic_fetch_add_explicit(&sh->published_tokens, n - m, memory_order_relaxed);
	if (tu_rand(&t->rng) % 8 == 0) { /* a second answer to the same prompt */
		if ((ret = kva_seq_fork(s, &c)) < 0) {
			fail_call(t, "seq_fork", ret);
		} else {
			int32_t more[BT];

			for (uint32_t i = 0; i < BT; i++)
				more[i] = (int32_t)(tu_rand(&t->rng) & 0x7fffffff);
			if ((ret = kva_seq_append(c, more, 1 + tu_rand(&t->rng) % BT)) < 0)
				fail_call(t, "fork append", ret);
			kva_seq_close(c);
			atomic_fetch_add_explicit(&sh->forks, 1, memory_order_relaxed);
		}
	}
close:
	kva_seq_close(s);
}

/* ------------------------------------------------------- private blocks */

static void priv_stamp(struct thread_ctx *t, uint32_t k)
{
	uint64_t v[4] = { 0x70726976ull, (uint64_t)getpid(), t->priv[k], t->priv_seq[k] };

	memcpy(kva_block_data(t->w, t->priv[k]), v, sizeof(v));
}

static bool priv_ok(struct thread_ctx *t, uint32_t k)
{
	uint64_t v[4] = { 0x70726976ull, (uint64_t)getpid(), t->priv[k], t->priv_seq[k] };

	return !memcmp(kva_block_data(t->w, t->priv[k]), v, sizeof(v));
}

static void priv_free(struct thread_ctx *t, uint32_t k)
{
	int ret;

	if (!priv_ok(t, k)) {
		atomic_fetch_add(&sh->bad_private, 1);
		fprintf(stderr, "pid %d: private block %u changed under its owner\n",
			(int)getpid(), t->priv[k]);
	}
	if ((ret = kva_free(t->w, &t->priv[k], 1)) < 0)
		fail_call(t, "free private", ret);
	t->priv[k] = t->priv[--t->n_priv];
	t->priv_seq[k] = t->priv_seq[t->n_priv];
}

static void private_blocks(struct thread_ctx *t)
{
	uint32_t k = 1 + (uint32_t)(tu_rand(&t->rng) % 24), ids[24];
	int ret;

	while (t->n_priv && (t->n_priv + k > MAX_PRIVATE || tu_rand(&t->rng) % 4 == 0))
		priv_free(t, (uint32_t)(tu_rand(&t->rng) % t->n_priv));
	if ((ret = kva_alloc(t->w, k, ids)) < 0) {
		fail_call(t, "alloc", ret);
		return;
	}
	for (uint32_t j = 0; j < k; j++) {
		t->priv[t->n_priv] = ids[j];
		t->priv_seq[t->n_priv] = ++t->seq;
		priv_stamp(t, t->n_priv++);
	}
	atomic_fetch_add_explicit(&sh->private_ops, 1, memory_order_relaxed);
}

static void private_drain(struct thread_ctx *t)
{
	while (t->n_priv && !t->dead)
		priv_free(t, t->n_priv - 1);
}

/* ------------------------------------------------------------- reclaim */

/* every slot but @self that is in use: reclaim it if its holder is dead */
static void reclaim_slots(struct kva_arena *a, uint32_t self)
{
	for (uint32_t s = 0; s < MAX_WORKERS; s++) {
		enum kva_slot_state state;
		int ret;

		if (s == self || kva_arena_slot(a, s, &state, NULL, NULL) < 0 ||
		    state == KVA_SLOT_FREE)
			continue;
		ret = kva_arena_reclaim(a, s, NULL);
		if (ret == 0)
			atomic_fetch_add(&sh->reclaims, 1);
		else if (ret == -EBUSY)
			atomic_fetch_add_explicit(&sh->reclaim_busy, 1, memory_order_relaxed);
		else if (ret != -ENOENT)
			unexpected("reclaim", ret);
	}
}

static void reclaim_scan(struct thread_ctx *t)
{
	reclaim_slots(kva_worker_arena(t->w), (uint32_t)kva_worker_slot(t->w));
}

/* ------------------------------------------------------ worker process */

struct proc_ctx {
	struct kva_arena *a;
	uint64_t seed;
	uint64_t until_ns;  /* then the process leaves on its own */
	bool half_exit;     /* the main thread is gone: thread 0 ends the process */
	_Atomic bool started;
	uint32_t threads;
	pthread_t th[MAX_THREADS], rth[2];
};

static void thread_loop(struct proc_ctx *p, struct thread_ctx *t)
{
	while (!atomic_load_explicit(&sh->stop, memory_order_relaxed) && now_ns() < p->until_ns &&
	       !t->dead) {
		uint32_t r = (uint32_t)(tu_rand(&t->rng) % 100);

		if (r < 70) {
			request(t);
		} else if (r < 88) {
			private_blocks(t);
		} else if (r < 93) {
			reclaim_scan(t);
		} else if (!t->attached) { /* leave, and join again */
			int ret;

			private_drain(t);
			if (t->dead)
				break;
			kva_worker_leave(t->w);
			t->w = NULL;
			while ((ret = kva_worker_join(p->a, "stress-thread", &t->w)) == -EUSERS) {
				atomic_fetch_add_explicit(&sh->eusers, 1, memory_order_relaxed);
				if (atomic_load(&sh->stop))
					return;
				usleep(1000);
			}
			if (ret < 0) {
				unexpected("join again", ret);
				return;
			}
			atomic_fetch_add_explicit(&sh->rejoins, 1, memory_order_relaxed);
		}
	}
	private_drain(t);
}

/* a thread with no slot that only reclaims: two per process, so that two
 * reclaimers of one process meet on every dead slot (and the agent too) */
static void *reclaimer_main(void *arg)
{
	struct proc_ctx *p = arg;

	while (!atomic_load_explicit(&sh->stop, memory_order_relaxed) && now_ns() < p->until_ns) {
		reclaim_slots(p->a, UINT32_MAX);
		usleep(200);
	}
	return NULL;
}

static void *thread_main(void *arg)
{
	struct proc_ctx *p = ((void **)arg)[0];
	struct thread_ctx *t = ((void **)arg)[1];
	int ret;

	if (!t->w) {
		while ((ret = kva_worker_join(p->a, "stress-thread", &t->w)) == -EUSERS) {
			atomic_fetch_add_explicit(&sh->eusers, 1, memory_order_relaxed);
			if (atomic_load(&sh->stop))
				return NULL;
			usleep(1000);
		}
		if (ret < 0) {
			unexpected("join", ret);
			return NULL;
		}
	}
	thread_loop(p, t);
	if (!t->attached && t->w)
		kva_worker_leave(t->w);
	if (t->attached && p->half_exit) {
		/* the main thread is gone: the last thread would end the process
		 * through exit(), and its handlers; end it as the others do */
		while (!atomic_load(&p->started))
			usleep(1000);
		for (uint32_t i = 1; i < p->threads; i++)
			pthread_join(p->th[i], NULL);
		for (int i = 0; i < 2; i++)
			pthread_join(p->rth[i], NULL);
		if (!t->dead)
			kva_detach(t->w);
		_exit(0);
	}
	return NULL;
}

static void worker_process(const char *sock, uint64_t seed)
{
	static struct proc_ctx p;
	static struct thread_ctx t[MAX_THREADS];
	static void *args[MAX_THREADS][2];
	pthread_t *th = p.th, *rth = p.rth;
	struct kva_worker *w0;
	uint32_t threads;
	int ret;

	p.seed = seed;
	threads = p.threads = 1 + (uint32_t)(tu_rand(&p.seed) % MAX_THREADS);
	p.half_exit = tu_rand(&p.seed) % 4 == 0;
	p.until_ns = now_ns() + (20 + tu_rand(&p.seed) % 400) * 1000000ull;
	ret = kva_attach(sock, "stress", &w0);
	if (ret == -EUSERS) {
		atomic_fetch_add(&sh->eusers, 1);
		_exit(0);
	}
	if (ret < 0) {
		unexpected("attach", ret);
		_exit(1);
	}
	p.a = kva_worker_arena(w0);
	for (uint32_t i = 0; i < threads; i++) {
		t[i] = (struct thread_ctx){ .w = i ? NULL : w0, .attached = i == 0,
					    .rng = seed * 131 + i };
		args[i][0] = &p;
		args[i][1] = &t[i];
		if (pthread_create(&th[i], NULL, thread_main, args[i]))
			_exit(1);
	}
	for (int i = 0; i < 2; i++)
		if (pthread_create(&rth[i], NULL, reclaimer_main, &p))
			_exit(1);
	atomic_store(&p.started, true);
	if (p.half_exit) /* the process lives on in its threads */
		pthread_exit(NULL);
	for (uint32_t i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 2; i++)
		pthread_join(rth[i], NULL);
	if (!t[0].dead)
		kva_detach(w0);
	_exit(0);
}

/* ------------------------------------------------------------- the test */

struct child {
	pid_t pid;
};

static unsigned reap(struct child *c, unsigned n, unsigned *bad_exit)
{
	unsigned live = 0;

	for (unsigned i = 0; i < n; i++) {
		int status;

		if (!c[i].pid)
			continue;
		if (waitpid(c[i].pid, &status, WNOHANG) == c[i].pid) {
			if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
				++*bad_exit;
			c[i].pid = 0;
			continue;
		}
		live++;
	}
	return live;
}

static void test_everything_at_once_loses_nothing(void **state)
{
	static const char *const args[] = {
		"--log-level", "info", "--blocks", "1024", "--max-workers", "16",
		"--block-tokens", "16", "--layers", "1", "--kv-heads", "1", "--head-dim", "32",
		"--cache-limit", "400", "--quota-inference", "200", "--check-interval", "0.05",
		NULL,
	};
	struct tu_agent ag;
	struct child kids[PROCS] = { 0 };
	struct kva_arena *obs;
	struct kva_check_report cr;
	struct kva_prefix_stats ps;
	struct kva_stats st;
	uint64_t rng = 12345, t_end, spawned = 0, kills = 0, seed = 1;
	unsigned bad_exit = 0;
	char out[4096];
	int status;

	(void)state;
	sh = tu_shared_alloc(sizeof(*sh));
	assert_non_null(sh);
	assert_int_equal(tu_agent_start(&ag, agent_path, args), 0);

	t_end = now_ns() + (uint64_t)(seconds * 1e9);
	while (now_ns() < t_end) {
		reap(kids, PROCS, &bad_exit);
		for (unsigned i = 0; i < PROCS; i++) {
			if (kids[i].pid)
				continue;
			kids[i].pid = tu_fork();
			assert_true(kids[i].pid >= 0);
			if (kids[i].pid == 0)
				worker_process(ag.socket, seed);
			seed++;
			spawned++;
		}
		usleep(2000 + (useconds_t)(tu_rand(&rng) % 20000));
		if (tu_rand(&rng) % 3 == 0) {
			unsigned i = (unsigned)(tu_rand(&rng) % PROCS);

			if (kids[i].pid && kill(kids[i].pid, SIGKILL) == 0)
				kills++;
		}
	}
	/* the end: workers still running leave on their own, then the rest die */
	atomic_store(&sh->stop, 1);
	for (int k = 0; k < 500 && reap(kids, PROCS, &bad_exit); k++)
		usleep(10000);
	for (unsigned i = 0; i < PROCS; i++)
		if (kids[i].pid) {
			kill(kids[i].pid, SIGKILL);
			waitpid(kids[i].pid, NULL, 0);
			kids[i].pid = 0;
			kills++;
		}

	/* the agent reclaims what is left: attached workers by pidfd, the
	 * others by its periodic check */
	assert_int_equal(kva_observe(ag.socket, &obs, NULL), 0);
	for (int k = 0; k < 1000; k++) {
		kva_arena_stats(obs, &st);
		if (!st.workers)
			break;
		usleep(10000);
	}
	assert_int_equal(kva_arena_stats(obs, &st), 0);
	assert_int_equal(kva_arena_prefix_stats(obs, &ps), 0);
	fprintf(stderr, "  %.0f s: %llu worker processes, %llu SIGKILLs; %llu requests, %llu "
		"blocks matched, %llu forks, %llu private batches, %llu rejoins\n"
		"  reclaims by workers %llu (%llu refused: another reclaimer or alive), by the "
		"agent %u; -ENOSPC %llu, -EDQUOT %llu, -EUSERS %llu; evictions %llu\n",
		seconds, (unsigned long long)spawned, (unsigned long long)kills,
		(unsigned long long)sh->requests, (unsigned long long)sh->matched_blocks,
		(unsigned long long)sh->forks, (unsigned long long)sh->private_ops,
		(unsigned long long)sh->rejoins, (unsigned long long)sh->reclaims,
		(unsigned long long)sh->reclaim_busy,
		tu_agent_log_count(&ag, "reclaimed"), (unsigned long long)sh->enospc,
		(unsigned long long)sh->edquot, (unsigned long long)sh->eusers,
		(unsigned long long)ps.evictions);
	if (st.workers)
		fail_msg("%u slots still in use after every worker died", st.workers);
	if (kva_arena_check(obs, &cr))
		fail_msg("%s", kva_errmsg());
	assert_int_equal(st.owned_blocks, 0);
	assert_int_equal(st.shared_blocks, 0);
	assert_int_equal(st.free_blocks + st.prefix_cached_blocks, BLOCKS);
	assert_int_equal(cr.published_count, cr.published_blocks);
	assert_int_equal(ps.published_now, st.prefix_cached_blocks);
	assert_true(st.prefix_cached_blocks <= 400); /* the cache limit */
	kva_arena_close(obs);
	{
		const char *argv[] = { ctl_path, "--socket", ag.socket, "check", NULL };

		if (tu_run(argv, out, sizeof(out)) != 0)
			fail_msg("kvarena-ctl check: %s", out);
	}

	assert_int_equal(sh->bad_stamps, 0);
	assert_int_equal(sh->bad_private, 0);
	assert_int_equal(sh->stale, 0);
	assert_int_equal(sh->unexpected, 0);
	assert_int_equal(bad_exit, 0);
	assert_true(sh->requests > 0 && sh->matched_blocks > 0 && ps.evictions > 0);
	/* nothing the agent had to call corrupt, no reclaim it failed */
	assert_int_equal(tu_agent_log_count(&ag, "corrupt descriptors"), 0);
	assert_int_equal(tu_agent_log_count(&ag, "will retry"), 0);
	/* nobody overwrote anything here: a repair would be the agent
	 * mistaking a worker's own join, leave or reclaim for an overwrite */
	if (tu_agent_log_count(&ag, "repaired:"))
		fail_msg("the agent repaired %u words no one overwrote (see %s)",
			 tu_agent_log_count(&ag, "repaired:"), ag.log);
	assert_int_equal(tu_agent_stop(&ag, SIGTERM, 5000, &status), 0);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	tu_agent_cleanup(&ag);
	tu_shared_free(sh, sizeof(*sh));
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_everything_at_once_loses_nothing),
	};
	const char *env = getenv("KVA_STRESS_SECONDS");

	if (argc < 3) {
		fprintf(stderr, "usage: %s AGENT CTL [--seconds N]\n", argv[0]);
		return 2;
	}
	agent_path = argv[1];
	ctl_path = argv[2];
	if (env)
		seconds = atof(env);
	if (argc >= 5 && !strcmp(argv[3], "--seconds"))
		seconds = atof(argv[4]);
	if (!(seconds > 0)) {
		fprintf(stderr, "%s: --seconds wants a positive number\n", argv[0]);
		return 2;
	}
	return cmocka_run_group_tests_name("arena_stress", tests, NULL, NULL);
}
