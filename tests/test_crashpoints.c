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
	for (int p = KVA__CP_NONE + 1; p < KVA__CP_COUNT; p++) {
		/* joining and one reclaim pass each point once; leaving passes it
		 * once per block held (at least 10) */
		unsigned n = p == KVA__CP_JOIN_CLAIMED || p == KVA__CP_RECLAIM_SWEEP ? 1
			     : p == KVA__CP_LEAVE_RELEASE ? 3 : sizeof(passes) / sizeof(passes[0]);

		for (unsigned k = 0; k < n; k++)
			crash_at((enum kva__crash_point)p, passes[k]);
		fprintf(stderr, "  %-14s killed there and recovered\n", point_name[p]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sigkill_inside_every_multi_step_change),
	};

	return cmocka_run_group_tests_name("arena_crashpoints", tests, NULL, NULL);
}
