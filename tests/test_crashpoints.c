/* SPDX-License-Identifier: MIT */
/*
 * test_crashpoints.c - a worker SIGKILLed at each place where a change to
 * shared memory takes more than one step (the crash points of arena_pvt.h,
 * armed in this test's build of the library only), at several passes through
 * it. The death must happen there (the test fails if the point is never
 * reached), and after kva_arena_reclaim() the arena must check clean and give
 * every block back: nothing leaked, nothing unfindable, no reclaimer's death
 * left a slot stuck.
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "arena_pvt.h"
#include "testutil.h"

#define BLOCKS 256u
#define NOT_REACHED 99

static const char *const point_name[KVA__CP_COUNT] = {
	[KVA__CP_CLAIM_CAS] = "claim-cas",         [KVA__CP_RELEASE_STORE] = "release-store",
	[KVA__CP_HINT_L0] = "hint-l0",             [KVA__CP_SUMMARY_CLEAR] = "summary-clear",
	[KVA__CP_SHARE_JOIN] = "share-join",       [KVA__CP_SHARE_EXCL] = "share-excl",
	[KVA__CP_DROP_LAST] = "drop-last",         [KVA__CP_JOIN_CLAIMED] = "join-claimed",
	[KVA__CP_LEAVE_RELEASE] = "leave-release", [KVA__CP_RECLAIM_SWEEP] = "reclaim-sweep",
	[KVA__CP_INDEX_BUSY] = "index-busy",       [KVA__CP_PUBLISH_INDEXED] = "publish-indexed",
	[KVA__CP_MATCH_JOINED] = "match-joined",   [KVA__CP_EVICT_TAKEN] = "evict-taken",
	[KVA__CP_MATCH_LOOKED_UP] = "match-looked-up", [KVA__CP_PUBLISH_COUNTED] = "publish-counted",
	[KVA__CP_RECLAIM_LEASED] = "reclaim-leased",
};

/* A worker that dies without leaving, holding blocks and references. */
static int dead_worker(struct kva_arena *a, struct tu_board *board)
{
	pid_t pid = tu_fork();
	int status;

	if (pid == 0) {
		struct kva_worker *w;
		struct tu_work t;

		if (kva_worker_join(a, "victim", &w))
			_exit(1);
		tu_work_init(&t, w, board, 40, 5);
		for (int k = 0; k < 500; k++)
			tu_work_step(&t);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	return tu_slot_of(a, pid);
}

#define HELD 16 /* blocks the survivor keeps shared throughout */

/* The child: arm the point, then do what passes through it. */
static void crasher(struct kva_arena *a, struct tu_board *board, const uint32_t *held,
		    enum kva__crash_point p, uint32_t nth, int victim_slot)
{
	struct kva_worker *w;
	struct tu_work t;
	uint32_t ids[BLOCKS];

	kva__crash_arm(p, nth);
	if (kva_worker_join(a, "crasher", &w) || kva_worker_set_cache(w, 4))
		_exit(1);
	if (p == KVA__CP_RECLAIM_SWEEP) {
		kva_arena_reclaim(a, (uint32_t)victim_slot, NULL);
		_exit(NOT_REACHED);
	}
	tu_work_init(&t, w, board, 48, 1000 + p * 100 + nth);
	for (int round = 0; round < 200; round++) {
		uint32_t n = 0;

		for (int k = 0; k < 100; k++)
			tu_work_step(&t);
		/* join and leave the holders of the survivor's blocks */
		if (kva_share(w, held, HELD) || kva_free(w, held, HELD))
			_exit(3);
		/* fill the arena to the last block, so hint words run empty */
		while (n < BLOCKS && kva_alloc(w, 1, &ids[n]) == 0)
			n++;
		if (kva_free(w, ids, n))
			_exit(2);
		if (p == KVA__CP_LEAVE_RELEASE && round >= 3 && t.n_refs >= 10) {
			kva_worker_leave(w); /* holding t's references */
			_exit(NOT_REACHED);
		}
	}
	_exit(NOT_REACHED);
}

static void crash_at(enum kva__crash_point p, uint32_t nth)
{
	struct kva_arena *a = tu_arena(BLOCKS, 8, 8);
	struct tu_board *board = tu_shared_alloc(sizeof(*board));
	struct kva_worker *h;
	struct kva_reclaim_report r;
	struct kva_check_report cr;
	struct kva_stats st;
	struct tu_work t;
	uint32_t held[HELD];
	int status, slot, victim = -1;
	pid_t pid;

	assert_non_null(a);
	/* a survivor holding shared blocks the crasher takes references on */
	assert_int_equal(kva_worker_join(a, "survivor", &h), 0);
	assert_int_equal(kva_alloc(h, HELD, held), 0);
	assert_int_equal(kva_share(h, held, HELD), 0);
	tu_work_init(&t, h, board, 32, 77);
	for (int k = 0; k < 300; k++)
		tu_work_step(&t);
	if (p == KVA__CP_RECLAIM_SWEEP)
		victim = dead_worker(a, board);

	pid = tu_fork();
	assert_true(pid >= 0);
	if (pid == 0)
		crasher(a, board, held, p, nth, victim);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
		fail_msg("%s #%u: the crasher was not killed there (status %#x)", point_name[p], nth,
			 status);

	slot = tu_slot_of(a, pid);
	if (p == KVA__CP_RECLAIM_SWEEP) {
		/* the victim's slot is stuck RECLAIMING by a dead reclaimer: take over */
		assert_int_equal(kva_arena_stats(a, &st), 0);
		assert_int_equal(st.slots[victim].state, KVA_SLOT_RECLAIMING);
		assert_int_equal(kva_arena_reclaim(a, (uint32_t)victim, &r), 0);
	}
	if (slot >= 0)
		assert_int_equal(kva_arena_reclaim(a, (uint32_t)slot, &r), 0);
	else
		assert_int_equal(p, KVA__CP_JOIN_CLAIMED); /* only a joiner can die slotless */

	/* the survivor kept working through all this */
	for (int k = 0; k < 300; k++)
		tu_work_step(&t);
	if (kva_arena_check(a, &cr))
		fail_msg("%s #%u: %s", point_name[p], nth, kva_errmsg());
	tu_work_drain(&t);
	tu_work_fini(&t);
	assert_int_equal(kva_free(h, held, HELD), 0);
	assert_int_equal(kva_free(h, held, HELD), 0);
	kva_worker_leave(h);
	assert_int_equal(atomic_load(&board->errors), 0);
	assert_int_equal(atomic_load(&board->unexpected), 0);
	assert_int_equal(kva_arena_stats(a, &st), 0);
	assert_int_equal(st.free_blocks, BLOCKS);
	assert_int_equal(kva_arena_check(a, NULL), 0);
	tu_shared_free(board, sizeof(*board));
	kva_arena_close(a);
}

static void test_sigkill_inside_every_multi_step_change(void **state)
{
	static const uint32_t passes[] = { 1, 2, 7, 31, 211 };

	(void)state;
	for (int p = KVA__CP_NONE + 1; p < KVA__CP_INDEX_BUSY; p++) {
		/* joining and one reclaim pass each point once; leaving passes it
		 * once per block held (at least 10) */
		unsigned n = p == KVA__CP_JOIN_CLAIMED || p == KVA__CP_RECLAIM_SWEEP ? 1
			     : p == KVA__CP_LEAVE_RELEASE ? 3 : sizeof(passes) / sizeof(passes[0]);

		for (unsigned k = 0; k < n; k++)
			crash_at((enum kva__crash_point)p, passes[k]);
		fprintf(stderr, "  %-14s killed there and recovered\n", point_name[p]);
	}
}

/* ------------------------------------------------------------ prefixes */

#define PBT 16u        /* tu_geometry's block_tokens */
#define PFAM 40u       /* prompt families: more than the arena caches */

/* a request of family @f, @nb full blocks and a partial one; each new block
 * stamped with its key before the append that publishes it, each matched
 * one checked. Returns the bad stamps seen. */
static unsigned prefix_request(struct kva_worker *w, uint32_t f, uint32_t nb)
{
	static const struct kva_seq_opts o = { .kind = KVA_OWNER_INFERENCE, .model = "cp" };
	uint32_t n = nb * PBT + 3;
	int32_t tok[16 * PBT + 3];
	uint64_t keys[16][2], salt[2];
	const uint32_t *ids;
	size_t m = 0, nbk, nt;
	struct kva_seq *s;
	unsigned bad = 0;

	for (uint32_t i = 0; i < n; i++)
		tok[i] = (int32_t)(f * 100003u + i * 7u);
	kva_prefix_salt("cp", NULL, 0, salt);
	for (uint32_t j = 0; j < nb; j++)
		kva_prefix_hash(j ? keys[j - 1] : NULL, salt, tok + j * PBT, PBT, keys[j]);
	if (kva_seq_open(w, &o, &s))
		return 0;
	if (kva_seq_match(s, tok, n, &m) == 0) {
		kva_seq_block_table(s, &ids, &nbk, &nt);
		for (size_t j = 0; j < m / PBT; j++)
			bad += memcmp(kva_block_data(w, ids[j]), keys[j], 16) != 0;
		if (kva_seq_reserve(s, n - m) == 0) {
			kva_seq_block_table(s, &ids, &nbk, &nt);
			for (size_t j = m / PBT; j < nb; j++)
				memcpy(kva_block_data(w, ids[j]), keys[j], 16);
			kva_seq_append(s, tok + m, n - m);
		}
	}
	kva_seq_close(s);
	return bad;
}

static void prefix_crash_at(enum kva__crash_point p, uint32_t nth)
{
	struct kva_arena *a = tu_arena(128, 4, 8);
	struct kva_worker *h;
	struct kva_check_report cr;
	uint64_t rng = 5 + nth;
	unsigned bad = 0;
	int status, slot;
	pid_t pid;

	assert_non_null(a);
	assert_int_equal(kva_worker_join(a, "survivor", &h), 0);
	for (uint32_t f = 0; f < PFAM; f++)
		bad += prefix_request(h, f, 1 + f % 8);
	pid = tu_fork();
	if (pid == 0) {
		struct kva_worker *w;

		kva__crash_arm(p, nth);
		if (kva_worker_join(a, "crasher", &w))
			_exit(1);
		for (int k = 0; k < 5000; k++)
			prefix_request(w, (uint32_t)(tu_rand(&rng) % PFAM),
				       1 + (uint32_t)(tu_rand(&rng) % 8));
		_exit(NOT_REACHED);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
		fail_msg("%s #%u: the crasher was not killed there (status %#x)", point_name[p], nth,
			 status);
	slot = tu_slot_of(a, pid);
	assert_true(slot >= 0);
	assert_int_equal(kva_arena_reclaim(a, (uint32_t)slot, NULL), 0);
	if (kva_arena_check(a, &cr))
		fail_msg("%s #%u: %s", point_name[p], nth, kva_errmsg());
	/* the survivor goes on: matches verify, eviction and publication work */
	for (int k = 0; k < 400; k++)
		bad += prefix_request(h, (uint32_t)(tu_rand(&rng) % PFAM),
				      1 + (uint32_t)(tu_rand(&rng) % 8));
	assert_int_equal(bad, 0);
	if (kva_arena_check(a, &cr))
		fail_msg("%s #%u after: %s", point_name[p], nth, kva_errmsg());
	kva_worker_leave(h);
	kva_arena_close(a);
}

static void test_sigkill_inside_prefix_changes(void **state)
{
	static const uint32_t passes[] = { 1, 3, 17, 101 };

	(void)state;
	for (int p = KVA__CP_INDEX_BUSY; p < KVA__CP_RECLAIM_LEASED; p++) {
		for (unsigned k = 0; k < sizeof(passes) / sizeof(passes[0]); k++)
			prefix_crash_at((enum kva__crash_point)p, passes[k]);
		fprintf(stderr, "  %-15s killed there and recovered\n", point_name[p]);
	}
}

/* ------------------------------------------ races held at one instruction */

/* a crash-point hook: the process stops itself (SIGSTOP) the first time */
static void stop_once(enum kva__crash_point p, void *arg)
{
	static bool stopped;

	(void)p;
	(void)arg;
	if (!stopped) {
		stopped = true;
		raise(SIGSTOP);
	}
}

static void wait_stopped(pid_t pid)
{
	int status;

	assert_int_equal(waitpid(pid, &status, WUNTRACED), pid);
	if (!WIFSTOPPED(status))
		fail_msg("child %d did not stop at its crash point (status %#x)", (int)pid, status);
}

static int wait_exit(pid_t pid)
{
	int status;

	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (!WIFEXITED(status))
		fail_msg("child %d ended by signal %d", (int)pid,
			 WIFSIGNALED(status) ? WTERMSIG(status) : -1);
	return WEXITSTATUS(status);
}

/* A worker that joins and allocates, stopped by the hook right after its
 * slot claim (JOINING, before it wrote anything else into the slot). */
static pid_t stopped_joiner(struct kva_arena *a, bool expect_stale)
{
	pid_t pid = tu_fork();

	if (pid == 0) {
		struct kva_worker *w;
		uint32_t ids[8];
		int ret;

		kva__crash_hook(KVA__CP_JOIN_CLAIMED, stop_once, NULL);
		ret = kva_worker_join(a, "joiner", &w);
		if (expect_stale) {
			if (ret != -ESTALE)
				_exit(10);
			if (!strstr(kva_errmsg(), "taken back")) {
				fprintf(stderr, "join failed -ESTALE, message: \"%s\"\n", kva_errmsg());
				_exit(11);
			}
			_exit(0);
		}
		if (ret) {
			fprintf(stderr, "join: %s\n", kva_errmsg());
			_exit(2);
		}
		if (kva_alloc(w, 8, ids) || kva_free(w, ids, 8))
			_exit(3);
		kva_worker_leave(w);
		_exit(0);
	}
	wait_stopped(pid);
	return pid;
}

/*
 * A joiner whose slot still holds the start time of the slot's previous
 * process (it claimed the slot and has not yet written its own) is alive:
 * reclaim refuses it, the periodic check does not count it dead, and its
 * join completes.
 */
static void test_joiner_not_judged_dead_by_the_slots_last_start_time(void **state)
{
	struct kva_arena *a = tu_arena(64, KVA_CACHE_NONE, 4);
	struct kva_check_report cr;
	struct kva_stats st;
	pid_t pid;
	int slot;

	(void)state;
	assert_non_null(a);
	/* a first process takes slot 0 and leaves: the slot keeps its traces */
	pid = tu_fork();
	if (pid == 0) {
		struct kva_worker *w;

		if (kva_worker_join(a, "first", &w))
			_exit(1);
		kva_worker_leave(w);
		_exit(0);
	}
	assert_int_equal(wait_exit(pid), 0);
	/* start times count clock ticks (10 ms): the next process's differs */
	usleep(50000);

	pid = stopped_joiner(a, false);
	slot = tu_slot_of(a, pid);
	assert_int_equal(slot, 0);
	assert_int_equal(kva_arena_reclaim(a, (uint32_t)slot, NULL), -EBUSY);
	kva_arena_check(a, &cr);
	assert_int_equal(cr.dead_slots, 0);
	kill(pid, SIGCONT);
	assert_int_equal(wait_exit(pid), 0);
	assert_int_equal(kva_arena_check(a, &cr), 0);
	assert_int_equal(kva_arena_stats(a, &st), 0);
	assert_int_equal(st.free_blocks, 64);
	assert_int_equal(st.workers, 0);
	kva_arena_close(a);
}

/*
 * kva_worker_join fails -ESTALE when its reservation is taken back between
 * its claim and its publication; the message then names that cause, not
 * what the cleanup after it ran into.
 */
static void test_join_error_names_the_first_cause(void **state)
{
	struct kva_arena *a = tu_arena(64, KVA_CACHE_NONE, 4);
	enum kva_slot_state ss;
	uint32_t gen;
	pid_t pid;
	int slot;

	(void)state;
	assert_non_null(a);
	pid = stopped_joiner(a, true);
	slot = tu_slot_of(a, pid);
	assert_true(slot >= 0);
	assert_int_equal(kva_arena_slot(a, (uint32_t)slot, &ss, &gen, NULL), 0);
	assert_int_equal(ss, KVA_SLOT_JOINING);
	assert_int_equal(kva_arena_release_slot(a, (uint32_t)slot, gen), 0);
	kill(pid, SIGCONT);
	assert_int_equal(wait_exit(pid), 0);
	assert_int_equal(kva_arena_check(a, NULL), 0);
	kva_arena_close(a);
}

/* two reclaimers of one slot in one process: the first held mid-sweep */
struct two_reclaimers {
	struct kva_arena *a;
	uint32_t slot;
	int ret;
	sem_t paused, go;
};

static _Thread_local bool hold_this_thread;

static void hold_here(enum kva__crash_point p, void *arg)
{
	struct two_reclaimers *t = arg;

	(void)p;
	if (hold_this_thread) {
		sem_post(&t->paused);
		while (sem_wait(&t->go) < 0 && errno == EINTR)
			;
	}
}

static void *first_reclaimer(void *arg)
{
	struct two_reclaimers *t = arg;

	hold_this_thread = true;
	t->ret = kva_arena_reclaim(t->a, t->slot, NULL);
	return NULL;
}

/*
 * Two threads of one process reclaim the same dead slot. The first is held
 * half-way through its sweep; the second must not take over (its pid is the
 * same, and the first is alive), so the slot cannot be freed and reused by a
 * new worker whose blocks the first would then free. Whatever the order,
 * every block ends exactly where its holder believes it is.
 */
static void test_two_reclaimers_of_one_slot_in_one_process(void **state)
{
	struct kva_arena *a = tu_arena(BLOCKS, KVA_CACHE_NONE, 8);
	struct two_reclaimers t = { .a = a };
	struct tu_view *view = malloc(tu_view_bytes(BLOCKS));
	struct kva_worker *c;
	struct tu_mismatch mm;
	struct kva_stats st;
	uint32_t ids[BLOCKS], n = 0;
	pthread_t th;
	pid_t pid;
	int slot, ret;

	(void)state;
	assert_non_null(a);
	/* a worker that dies holding most of the arena */
	pid = tu_fork();
	if (pid == 0) {
		struct kva_worker *w;
		uint32_t got[200];

		if (kva_worker_join(a, "victim", &w) || kva_alloc(w, 200, got))
			_exit(1);
		_exit(0);
	}
	assert_int_equal(wait_exit(pid), 0);
	slot = tu_slot_of(a, pid);
	assert_int_equal(slot, 0);
	t.slot = (uint32_t)slot;

	sem_init(&t.paused, 0, 0);
	sem_init(&t.go, 0, 0);
	kva__crash_hook(KVA__CP_RECLAIM_SWEEP, hold_here, &t);
	assert_int_equal(pthread_create(&th, NULL, first_reclaimer, &t), 0);
	while (sem_wait(&t.paused) < 0 && errno == EINTR)
		;
	/* the first reclaimer is half-way: a second one of this process */
	ret = kva_arena_reclaim(a, t.slot, NULL);
	/* a new worker joins and takes every block it can */
	assert_int_equal(kva_worker_join(a, "newcomer", &c), 0);
	while (n < BLOCKS && kva_alloc(c, 1, &ids[n]) == 0)
		n++;
	sem_post(&t.go);
	pthread_join(th, NULL);
	kva__crash_hook(KVA__CP_NONE, NULL, NULL);

	tu_view_capture(c, view);
	if (!tu_views_match(a, &view, 1, &mm))
		fail_msg("after two reclaimers: %u leaked, %u double owned, %u refcounts, %u lost "
			 "(second reclaim: %d)", mm.leaked, mm.double_owned, mm.refcount, mm.lost, ret);
	assert_int_equal(t.ret, 0);
	assert_int_equal(ret, -EBUSY);
	assert_int_equal(kva_arena_check(a, NULL), 0);
	assert_int_equal(kva_free(c, ids, n), 0);
	kva_worker_leave(c);
	assert_int_equal(kva_arena_stats(a, &st), 0);
	assert_int_equal(st.free_blocks, BLOCKS);
	free(view);
	sem_destroy(&t.paused);
	sem_destroy(&t.go);
	kva_arena_close(a);
}

/* publish one full block of @tokens with the key stamped in its data */
static int try_publish(struct kva_worker *w, const int32_t *tokens, uint32_t *id)
{
	static const struct kva_seq_opts o = { .kind = KVA_OWNER_INFERENCE, .model = "wrap" };
	uint64_t salt[2], key[2];
	const uint32_t *ids;
	size_t nb, nt;
	struct kva_seq *s;
	int ret;

	kva_prefix_salt("wrap", NULL, 0, salt);
	kva_prefix_hash(NULL, salt, tokens, PBT, key);
	if ((ret = kva_seq_open(w, &o, &s)) < 0)
		return ret;
	if ((ret = kva_seq_reserve(s, PBT)) == 0) {
		kva_seq_block_table(s, &ids, &nb, &nt);
		memcpy(kva_block_data(w, ids[0]), key, sizeof(key));
		ret = kva_seq_append(s, tokens, PBT);
		*id = ids[0];
	}
	kva_seq_close(s);
	return ret;
}

static void publish_block(struct kva_worker *w, const int32_t *tokens, uint32_t *id)
{
	int ret = try_publish(w, tokens, id);

	if (ret)
		fail_msg("publish: %s", kva_errmsg());
}

/*
 * A match that found block b's index entry for key K, then was held there
 * while b was evicted, reused 4096 times (its 12-bit epoch came round) and
 * published again under another key K2 at the very same index entry, must
 * not attach b: its bytes are K2's. Serving another prefix's KV is the worst
 * thing a cache can do; it must be impossible, however unlikely. With
 * @same_tag, K2 also has K's 14-bit tag, so its entry's ctrl word is the very
 * word the matcher read: the matcher must not take K2's entry for its stale
 * one and delete it (K2 stays findable).
 */
static void match_after_epoch_wrap(bool same_tag)
{
	struct kva_arena *a = tu_arena(8, KVA_CACHE_NONE, 4);
	struct kva_worker *p;
	int32_t t1[PBT], t2[PBT], junk[PBT];
	uint64_t salt[2], k1[2], k2[2], epoch, pos;
	uint32_t b, x, others[7];
	pid_t pid;

	assert_non_null(a);
	assert_int_equal(kva_worker_join(a, "owner", &p), 0);
	for (uint32_t i = 0; i < PBT; i++)
		t1[i] = (int32_t)(1000 + i);
	kva_prefix_salt("wrap", NULL, 0, salt);
	kva_prefix_hash(NULL, salt, t1, PBT, k1);
	publish_block(p, t1, &b);
	epoch = kva__d_epoch(atomic_load(&a->desc[b]));
	pos = atomic_load(&a->bmeta[b].entry) - 1;

	/* a matcher of t1, stopped between its index lookup and its join */
	pid = tu_fork();
	if (pid == 0) {
		static const struct kva_seq_opts o = { .kind = KVA_OWNER_INFERENCE, .model = "wrap" };
		struct kva_worker *w;
		struct kva_seq *s;
		const uint32_t *ids;
		size_t m = 0, nb, nt;

		kva__crash_hook(KVA__CP_MATCH_LOOKED_UP, stop_once, NULL);
		if (kva_worker_join(a, "matcher", &w) || kva_seq_open(w, &o, &s) ||
		    kva_seq_match(s, t1, PBT, &m))
			_exit(1);
		kva_seq_block_table(s, &ids, &nb, &nt);
		if (m && memcmp(kva_block_data(w, ids[0]), k1, sizeof(k1))) {
			fprintf(stderr, "matched block %u holds another key's KV\n", ids[0]);
			_exit(3);
		}
		kva_seq_close(s);
		kva_worker_leave(w);
		_exit(0);
	}
	wait_stopped(pid);

	/* everything else held: b is the only block that moves */
	assert_int_equal(kva_alloc(p, 7, others), 0);
	assert_int_equal(kva_alloc(p, 1, &x), 0); /* evicts b: t1's entry is a ghost */
	assert_int_equal(x, b);
	assert_int_equal(kva_free(p, &x, 1), 0);
	/* more evictions than the ghost lives (2 x 8 blocks): its entry is free */
	for (uint32_t j = 0; j < 17; j++) {
		for (uint32_t i = 0; i < PBT; i++)
			junk[i] = (int32_t)(50000 + j * 100 + i);
		publish_block(p, junk, &x);
		assert_int_equal(x, b);
		assert_int_equal(kva_alloc(p, 1, &x), 0);
		assert_int_equal(x, b);
		assert_int_equal(kva_free(p, &x, 1), 0);
	}
	/* b's lives until its epoch comes round to the one t1 was published in */
	while (kva__d_epoch(atomic_load(&a->desc[b])) != epoch) {
		assert_int_equal(kva_alloc(p, 1, &x), 0);
		assert_int_equal(kva_free(p, &x, 1), 0);
	}
	/* another key whose chain starts at t1's entry (and, if asked, with
	 * t1's tag: about 2^20 tries) */
	for (int32_t v = 0;; v++) {
		for (uint32_t i = 0; i < PBT; i++)
			t2[i] = (int32_t)(7000000 + v * 64 + (int32_t)i);
		kva_prefix_hash(NULL, salt, t2, PBT, k2);
		if ((k2[0] & a->idx_mask) == pos && (!same_tag || k2[1] >> 50 == k1[1] >> 50))
			break;
	}
	publish_block(p, t2, &x);
	assert_int_equal(x, b);
	/* the adversarial case is built: same block, same epoch, same entry */
	assert_int_equal(kva__d_epoch(atomic_load(&a->desc[b])), epoch);
	assert_int_equal(atomic_load(&a->bmeta[b].entry), pos + 1);

	kill(pid, SIGCONT);
	assert_int_equal(wait_exit(pid), 0);
	assert_int_equal(kva_free(p, others, 7), 0);
	if (kva_arena_check(a, NULL))
		fail_msg("%s", kva_errmsg());
	/* t2's publication is still found, with its own bytes */
	{
		static const struct kva_seq_opts o = { .kind = KVA_OWNER_INFERENCE, .model = "wrap" };
		struct kva_seq *s;
		const uint32_t *ids;
		size_t m = 0, nb, nt;

		assert_int_equal(kva_seq_open(p, &o, &s), 0);
		assert_int_equal(kva_seq_match(s, t2, PBT, &m), 0);
		assert_int_equal(m, PBT);
		kva_seq_block_table(s, &ids, &nb, &nt);
		assert_memory_equal(kva_block_data(p, ids[0]), k2, sizeof(k2));
		kva_seq_close(s);
	}
	kva_worker_leave(p);
	kva_arena_close(a);
}

static void test_match_never_joins_another_keys_block(void **state)
{
	(void)state;
	match_after_epoch_wrap(false);
	match_after_epoch_wrap(true);
}

/* one full block of a fresh key */
static int publish_unique(struct kva_worker *w, uint32_t n)
{
	int32_t t[PBT];
	uint32_t id;

	for (uint32_t i = 0; i < PBT; i++)
		t[i] = (int32_t)(n * 1000 + i);
	return try_publish(w, t, &id);
}

static void check_published_count(struct kva_arena *a, const char *when)
{
	struct kva_prefix_stats ps;
	struct kva_check_report cr;

	assert_int_equal(kva_arena_prefix_stats(a, &ps), 0);
	if (ps.published_now != ps.cached_blocks + ps.published_blocks)
		fail_msg("%s: the cache limit counts %llu published blocks, there are %llu", when,
			 (unsigned long long)ps.published_now,
			 (unsigned long long)(ps.cached_blocks + ps.published_blocks));
	if (kva_arena_check(a, &cr))
		fail_msg("%s: %s", when, kva_errmsg());
}

/*
 * Workers killed between counting a publication (against the cache limit)
 * and publishing, or between taking a cached block and counting it gone:
 * after reclaim the count is exact, so a cache limit of N survives any
 * number of such deaths.
 */
static void test_published_count_survives_deaths(void **state)
{
	static const struct { enum kva__crash_point p; uint32_t nth; } kills[] = {
		{ KVA__CP_PUBLISH_COUNTED, 1 }, { KVA__CP_PUBLISH_COUNTED, 2 },
		{ KVA__CP_INDEX_BUSY, 1 },      { KVA__CP_PUBLISH_INDEXED, 1 },
		{ KVA__CP_EVICT_TAKEN, 1 },     { KVA__CP_EVICT_TAKEN, 3 },
	};
	struct kva_arena *a = tu_arena(64, KVA_CACHE_NONE, 8);
	struct kva_prefix_stats ps;
	struct kva_worker *h;
	uint64_t published;
	uint32_t uniq = 1;

	(void)state;
	assert_non_null(a);
	assert_int_equal(kva_arena_set_cache_limit(a, 2), 0);
	for (unsigned k = 0; k < sizeof(kills) / sizeof(kills[0]); k++) {
		pid_t pid = tu_fork();
		int status, slot;

		if (pid == 0) {
			struct kva_worker *w;

			kva__crash_arm(kills[k].p, kills[k].nth);
			if (kva_worker_join(a, "crasher", &w))
				_exit(1);
			for (uint32_t j = 0; j < 50; j++)
				if (publish_unique(w, 100000 + k * 100 + j))
					_exit(2);
			_exit(NOT_REACHED);
		}
		assert_int_equal(waitpid(pid, &status, 0), pid);
		if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
			fail_msg("%s #%u: not killed there", point_name[kills[k].p], kills[k].nth);
		slot = tu_slot_of(a, pid);
		assert_true(slot >= 0);
		assert_int_equal(kva_arena_reclaim(a, (uint32_t)slot, NULL), 0);
		check_published_count(a, point_name[kills[k].p]);
	}
	/* the limit still lets blocks in: each publication lands (evicting) */
	assert_int_equal(kva_worker_join(a, "survivor", &h), 0);
	assert_int_equal(kva_arena_prefix_stats(a, &ps), 0);
	published = ps.published;
	for (uint32_t j = 0; j < 6; j++)
		assert_int_equal(publish_unique(h, uniq++), 0);
	assert_int_equal(kva_arena_prefix_stats(a, &ps), 0);
	assert_int_equal(ps.published - published, 6);
	assert_true(ps.cached_blocks + ps.published_blocks <= 2);
	check_published_count(a, "after");
	kva_worker_leave(h);
	kva_arena_close(a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sigkill_inside_every_multi_step_change),
		cmocka_unit_test(test_sigkill_inside_prefix_changes),
		cmocka_unit_test(test_joiner_not_judged_dead_by_the_slots_last_start_time),
		cmocka_unit_test(test_join_error_names_the_first_cause),
		cmocka_unit_test(test_two_reclaimers_of_one_slot_in_one_process),
		cmocka_unit_test(test_match_never_joins_another_keys_block),
		cmocka_unit_test(test_published_count_survives_deaths),
	};

	return cmocka_run_group_tests_name("arena_crashpoints", tests, NULL, NULL);
}
