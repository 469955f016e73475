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
	for (int p = KVA__CP_INDEX_BUSY; p < KVA__CP_COUNT; p++) {
		for (unsigned k = 0; k < sizeof(passes) / sizeof(passes[0]); k++)
			prefix_crash_at((enum kva__crash_point)p, passes[k]);
		fprintf(stderr, "  %-15s killed there and recovered\n", point_name[p]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sigkill_inside_every_multi_step_change),
		cmocka_unit_test(test_sigkill_inside_prefix_changes),
	};

	return cmocka_run_group_tests_name("arena_crashpoints", tests, NULL, NULL);
}
